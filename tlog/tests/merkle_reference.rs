//! Property tests of `redrive_tlog::merkle` against an independent, literal
//! transcription of RFC 6962 §2.1 (MTH), §2.1.1 (PATH) and §2.1.2
//! (PROOF, SUBPROOF), written here over byte-string leaves with SHA-256
//! from `sha2` directly.

use proptest::prelude::*;
use redrive_tlog::Hash;
use redrive_tlog::merkle::{
    self, Frontier, consistency_path, consistency_proof, fold_subtrees, inclusion_path,
    inclusion_proof, perfect_subtrees, verify_consistency, verify_inclusion,
};
use sha2::{Digest, Sha256};

/// The reference: RFC 6962 §2.1, word for word.
mod rfc6962 {
    use super::*;

    fn sha256(parts: &[&[u8]]) -> Hash {
        let mut hasher = Sha256::new();
        for part in parts {
            hasher.update(part);
        }
        hasher.finalize().into()
    }

    /// "the largest power of two smaller than n (i.e., k < n <= 2k)".
    fn k_of(n: usize) -> usize {
        let mut k = 1;
        while k * 2 < n {
            k *= 2;
        }
        k
    }

    /// MTH(D[n]).
    pub fn mth(d: &[Vec<u8>]) -> Hash {
        match d.len() {
            0 => sha256(&[]),
            1 => sha256(&[&[0x00], &d[0]]),
            n => {
                let k = k_of(n);
                sha256(&[&[0x01], &mth(&d[0..k]), &mth(&d[k..n])])
            }
        }
    }

    /// PATH(m, D[n]).
    pub fn path(m: usize, d: &[Vec<u8>]) -> Vec<Hash> {
        let n = d.len();
        if n == 1 {
            return vec![];
        }
        let k = k_of(n);
        if m < k {
            let mut p = path(m, &d[0..k]);
            p.push(mth(&d[k..n]));
            p
        } else {
            let mut p = path(m - k, &d[k..n]);
            p.push(mth(&d[0..k]));
            p
        }
    }

    /// PROOF(m, D[n]) = SUBPROOF(m, D[n], true).
    pub fn proof(m: usize, d: &[Vec<u8>]) -> Vec<Hash> {
        subproof(m, d, true)
    }

    /// SUBPROOF(m, D[n], b).
    fn subproof(m: usize, d: &[Vec<u8>], b: bool) -> Vec<Hash> {
        let n = d.len();
        if m == n {
            return if b { vec![] } else { vec![mth(d)] };
        }
        let k = k_of(n);
        if m <= k {
            let mut p = subproof(m, &d[0..k], b);
            p.push(mth(&d[k..n]));
            p
        } else {
            let mut p = subproof(m - k, &d[k..n], false);
            p.push(mth(&d[0..k]));
            p
        }
    }
}

/// 1 to 300 distinct leaves (each starts with its index), an index and an
/// old size.
fn tree() -> impl Strategy<Value = (Vec<Vec<u8>>, usize, usize)> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 0..24), 1..=300).prop_flat_map(
        |data| {
            let n = data.len();
            let leaves: Vec<Vec<u8>> = data
                .into_iter()
                .enumerate()
                .map(|(i, mut bytes)| {
                    let mut leaf = (i as u32).to_be_bytes().to_vec();
                    leaf.append(&mut bytes);
                    leaf
                })
                .collect();
            (Just(leaves), 0..n, 1..=n)
        },
    )
}

fn hashes(leaves: &[Vec<u8>]) -> Vec<Hash> {
    leaves.iter().map(|leaf| merkle::leaf_hash(leaf)).collect()
}

proptest! {
    #[test]
    fn root_is_mth((leaves, _, old) in tree()) {
        let hashed = hashes(&leaves);
        prop_assert_eq!(merkle::root(&hashed), rfc6962::mth(&leaves));
        prop_assert_eq!(merkle::root(&hashed[..old]), rfc6962::mth(&leaves[..old]));
    }

    #[test]
    fn inclusion_is_path((leaves, index, _) in tree(), flip in any::<(usize, usize, u8)>()) {
        let n = leaves.len();
        let hashed = hashes(&leaves);
        let root = rfc6962::mth(&leaves);
        let proof = inclusion_proof(&hashed, index as u64);
        prop_assert_eq!(&proof, &rfc6962::path(index, &leaves));
        let leaf = hashed[index];
        prop_assert!(verify_inclusion(&leaf, index as u64, n as u64, &proof, &root).is_ok());

        // Each range of the path is a node: its subtrees fold to its MTH.
        for range in inclusion_path(index as u64, n as u64) {
            let parts: Vec<Hash> = perfect_subtrees(range.clone())
                .iter()
                .map(|s| rfc6962::mth(&leaves[s.start() as usize..s.end() as usize]))
                .collect();
            prop_assert_eq!(
                fold_subtrees(&parts),
                rfc6962::mth(&leaves[range.start as usize..range.end as usize])
            );
        }

        // A flipped byte anywhere (proof, leaf or root) is refused.
        let bit = 1u8 << (flip.2 % 8);
        if !proof.is_empty() {
            let mut wrong = proof.clone();
            wrong[flip.0 % proof.len()][flip.1 % 32] ^= bit;
            prop_assert!(verify_inclusion(&leaf, index as u64, n as u64, &wrong, &root).is_err());
        }
        let mut wrong_leaf = leaf;
        wrong_leaf[flip.1 % 32] ^= bit;
        prop_assert!(verify_inclusion(&wrong_leaf, index as u64, n as u64, &proof, &root).is_err());
        let mut wrong_root = root;
        wrong_root[flip.1 % 32] ^= bit;
        prop_assert!(verify_inclusion(&leaf, index as u64, n as u64, &proof, &wrong_root).is_err());

        // A wrong index, or a doubled size, is refused (see
        // `wrong_sizes_in_small_trees` for why not every wrong size).
        if n > 1 {
            let other = (index + 1 + flip.0 % (n - 1)) % n;
            prop_assert!(verify_inclusion(&leaf, other as u64, n as u64, &proof, &root).is_err());
        }
        prop_assert!(verify_inclusion(&leaf, index as u64, 2 * n as u64, &proof, &root).is_err());
        prop_assert!(verify_inclusion(&leaf, index as u64, index as u64, &proof, &root).is_err());
        // The other leaves' hashes are not this one's.
        if n > 1 {
            let other = (index + 1) % n;
            prop_assert!(verify_inclusion(&hashed[other], index as u64, n as u64, &proof, &root).is_err());
        }
    }

    #[test]
    fn consistency_is_proof((leaves, _, old) in tree(), flip in any::<(usize, usize, u8)>()) {
        let n = leaves.len();
        let hashed = hashes(&leaves);
        let new_root = rfc6962::mth(&leaves);
        let old_root = rfc6962::mth(&leaves[..old]);
        let proof = consistency_proof(&hashed, old as u64);
        prop_assert_eq!(&proof, &rfc6962::proof(old, &leaves));
        prop_assert!(
            verify_consistency(old as u64, n as u64, &old_root, &new_root, &proof).is_ok()
        );
        for range in consistency_path(old as u64, n as u64) {
            let parts: Vec<Hash> = perfect_subtrees(range.clone())
                .iter()
                .map(|s| rfc6962::mth(&leaves[s.start() as usize..s.end() as usize]))
                .collect();
            prop_assert_eq!(
                fold_subtrees(&parts),
                rfc6962::mth(&leaves[range.start as usize..range.end as usize])
            );
        }

        let bit = 1u8 << (flip.2 % 8);
        if !proof.is_empty() {
            let mut wrong = proof.clone();
            wrong[flip.0 % proof.len()][flip.1 % 32] ^= bit;
            prop_assert!(
                verify_consistency(old as u64, n as u64, &old_root, &new_root, &wrong).is_err()
            );
        }
        let mut wrong_root = old_root;
        wrong_root[flip.1 % 32] ^= bit;
        prop_assert!(
            verify_consistency(old as u64, n as u64, &wrong_root, &new_root, &proof).is_err()
        );
        let mut wrong_root = new_root;
        wrong_root[flip.1 % 32] ^= bit;
        prop_assert!(
            verify_consistency(old as u64, n as u64, &old_root, &wrong_root, &proof).is_err()
        );
        // A wrong old size is refused, and so is a doubled new size (see
        // `wrong_sizes_in_small_trees` for why not every wrong new size).
        if n > 1 {
            let other = 1 + (old + flip.0 % (n - 1)) % n;
            if other != old {
                prop_assert!(
                    verify_consistency(other as u64, n as u64, &old_root, &new_root, &proof)
                        .is_err()
                );
            }
        }
        prop_assert!(
            verify_consistency(old as u64, 2 * n as u64, &old_root, &new_root, &proof).is_err()
        );
    }

    #[test]
    fn frontier_is_mth((leaves, _, _) in tree()) {
        let mut frontier = Frontier::new();
        for (i, leaf) in leaves.iter().enumerate() {
            let completed = frontier.append(merkle::leaf_hash(leaf));
            let size = i as u64 + 1;
            // The subtrees completed: levels 1 ..= trailing zeros of the
            // new size, each ending at the new size, with the MTH of its
            // leaves.
            let levels: Vec<u8> = completed.iter().map(|(s, _)| s.level).collect();
            let expected: Vec<u8> = (1..=size.trailing_zeros() as u8).collect();
            prop_assert_eq!(levels, expected);
            for (subtree, hash) in completed {
                prop_assert_eq!(subtree.end(), size);
                prop_assert_eq!(
                    hash,
                    rfc6962::mth(&leaves[subtree.start() as usize..subtree.end() as usize])
                );
            }
        }
        prop_assert_eq!(frontier.size(), leaves.len() as u64);
        prop_assert_eq!(frontier.root(), rfc6962::mth(&leaves));
        // Its hashes are the MTHs of the perfect subtrees of 0..n.
        let parts: Vec<Hash> = perfect_subtrees(0..leaves.len() as u64)
            .iter()
            .map(|s| rfc6962::mth(&leaves[s.start() as usize..s.end() as usize]))
            .collect();
        prop_assert_eq!(frontier.hashes(), parts.as_slice());
        let copy = Frontier::from_parts(frontier.size(), frontier.hashes().to_vec()).unwrap();
        prop_assert_eq!(copy, frontier);
    }

    #[test]
    fn perfect_subtrees_cover_any_range(start in 0u64..5000, len in 0u64..5000) {
        let range = start..start + len;
        let subtrees = perfect_subtrees(range.clone());
        let mut position = range.start;
        for subtree in &subtrees {
            prop_assert_eq!(subtree.start(), position);
            prop_assert_eq!(subtree.start() % (1u64 << subtree.level), 0);
            position = subtree.end();
        }
        prop_assert_eq!(position, range.end);
    }
}

/// Every pair of sizes up to 64: the proofs are the reference's and
/// verify.
#[test]
fn all_small_consistency_proofs() {
    let leaves: Vec<Vec<u8>> = (0u32..64).map(|i| i.to_be_bytes().to_vec()).collect();
    let hashed = hashes(&leaves);
    for n in 1..=64 {
        let new_root = rfc6962::mth(&leaves[..n]);
        for m in 1..=n {
            let proof = consistency_proof(&hashed[..n], m as u64);
            assert_eq!(proof, rfc6962::proof(m, &leaves[..n]), "{m} -> {n}");
            let old_root = rfc6962::mth(&leaves[..m]);
            verify_consistency(m as u64, n as u64, &old_root, &new_root, &proof)
                .unwrap_or_else(|error| panic!("{m} -> {n}: {error}"));
        }
        for m in 0..n {
            let proof = inclusion_proof(&hashed[..n], m as u64);
            assert_eq!(proof, rfc6962::path(m, &leaves[..n]), "leaf {m} of {n}");
        }
    }
}

/// In every tree up to 64 leaves: an inclusion proof verifies for no other
/// leaf index, and a consistency proof for no other old size.
///
/// A wrong *tree size* is another matter: RFC 6962 proofs do not
/// authenticate the size (the signed checkpoint binds size and root), and
/// when two sizes give the proof the same shape the RFC 9162 algorithms
/// accept both. The proof of leaf 0 in 3 leaves verifies with size 4, and
/// the consistency proof 1 -> 66 with new size 65; both cases are pinned
/// here so the behaviour is known.
#[test]
fn wrong_sizes_in_small_trees() {
    let leaves: Vec<Vec<u8>> = (0u32..70).map(|i| i.to_be_bytes().to_vec()).collect();
    let hashed = hashes(&leaves);
    let roots: Vec<Hash> = (0..=70).map(|n| merkle::root(&hashed[..n])).collect();
    for n in 1..=64usize {
        for m in 0..n {
            let proof = inclusion_proof(&hashed[..n], m as u64);
            for other in (0..n).filter(|&other| other != m) {
                assert!(
                    verify_inclusion(&hashed[m], other as u64, n as u64, &proof, &roots[n])
                        .is_err(),
                    "leaf {m} of {n} verified as leaf {other}"
                );
            }
        }
        for m in 1..=n {
            let proof = consistency_proof(&hashed[..n], m as u64);
            for other in (1..=n).filter(|&other| other != m) {
                assert!(
                    verify_consistency(other as u64, n as u64, &roots[m], &roots[n], &proof)
                        .is_err(),
                    "{m} -> {n} verified as {other} -> {n}"
                );
            }
        }
    }
    let proof = inclusion_proof(&hashed[..3], 0);
    assert!(verify_inclusion(&hashed[0], 0, 4, &proof, &roots[3]).is_ok());
    let proof = consistency_proof(&hashed[..66], 1);
    assert!(verify_consistency(1, 65, &roots[1], &roots[66], &proof).is_ok());
}

/// The perfect subtrees of a node range are its power-of-two parts,
/// largest first.
#[test]
fn node_ranges_split_largest_first() {
    assert_eq!(
        perfect_subtrees(0..13)
            .iter()
            .map(|s| (s.level, s.index))
            .collect::<Vec<_>>(),
        vec![(3, 0), (2, 2), (0, 12)]
    );
    assert_eq!(
        perfect_subtrees(8..14)
            .iter()
            .map(|s| (s.level, s.index))
            .collect::<Vec<_>>(),
        vec![(2, 2), (1, 6)]
    );
    assert!(perfect_subtrees(5..5).is_empty());
    assert_eq!(fold_subtrees(&[]), merkle::empty_root());
}
