//! RFC 6962 known-answer tests: the eight test leaves of
//! certificate-transparency and their known node hashes, roots, inclusion
//! and consistency proofs.
//!
//! Every expected value below is transcribed, not computed. Sources (in
//! github.com/transparency-dev/merkle, commit
//! 417fb0c314750d94e53942e9f92e79b6d35915db, the successor of
//! certificate-transparency-go's `merkletree` test data):
//!
//! - `testonly/constants.go`: `LeafInputs`, `NodeHashes`, `RootHashes`,
//!   `CompactTrees`, `EmptyRootHash`;
//! - `cmd/proofgen/main.go`: `inclusionProofs`, `consistencyProofs` (its
//!   `leafIdx` is 1-based there; below it is the 0-based index), and the
//!   kinds of corrupted proofs it writes into `testdata/` (which the
//!   negative cases below reproduce).

use redrive_tlog::Hash;
use redrive_tlog::merkle::{
    self, Frontier, ProofError, Subtree, consistency_proof, empty_root, inclusion_proof,
    verify_consistency, verify_inclusion,
};

fn h(hex_text: &str) -> Hash {
    hex::decode(hex_text).unwrap().try_into().unwrap()
}

/// `LeafInputs()`.
fn leaf_inputs() -> Vec<Vec<u8>> {
    [
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    ]
    .iter()
    .map(|text| hex::decode(text).unwrap())
    .collect()
}

/// `NodeHashes()`: by level, then index within the level.
fn node_hashes() -> Vec<Vec<Hash>> {
    vec![
        vec![
            h("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"),
            h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"),
            h("0298d122906dcfc10892cb53a73992fc5b9f493ea4c9badb27b791b4127a7fe7"),
            h("07506a85fd9dd2f120eb694f86011e5bb4662e5c415a62917033d4a9624487e7"),
            h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
            h("4271a26be0d8a84f0bd54c8c302e7cb3a3b5d1fa6780a40bcce2873477dab658"),
            h("b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f"),
            h("46f6ffadd3d06a09ff3c5860d2755c8b9819db7df44251788c7d8e3180de8eb1"),
        ],
        vec![
            h("fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"),
            h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            h("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a"),
            h("ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"),
        ],
        vec![
            h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
            h("6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"),
        ],
        vec![h(
            "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
        )],
    ]
}

/// `RootHashes()`: by tree size, 0 to 8.
fn root_hashes() -> Vec<Hash> {
    vec![
        h("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
        h("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"),
        h("fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"),
        h("aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77"),
        h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        h("4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4"),
        h("76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef"),
        h("ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c"),
        h("5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"),
    ]
}

/// `CompactTrees()`: the frontier of each tree size, 0 to 8, as
/// (level, index) of `NodeHashes()`.
fn compact_trees() -> Vec<Vec<(usize, usize)>> {
    vec![
        vec![],
        vec![(0, 0)],
        vec![(1, 0)],
        vec![(1, 0), (0, 2)],
        vec![(2, 0)],
        vec![(2, 0), (0, 4)],
        vec![(2, 0), (1, 2)],
        vec![(2, 0), (1, 2), (0, 6)],
        vec![(3, 0)],
    ]
}

/// `inclusionProofs`: (0-based leaf index, tree size, proof).
fn inclusion_vectors() -> Vec<(u64, u64, Vec<Hash>)> {
    vec![
        (0, 1, vec![]),
        (
            0,
            8,
            vec![
                h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"),
                h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
                h("6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"),
            ],
        ),
        (
            5,
            8,
            vec![
                h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
                h("ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"),
                h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
            ],
        ),
        (
            2,
            3,
            vec![h(
                "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
            )],
        ),
        (
            1,
            5,
            vec![
                h("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"),
                h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
                h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
            ],
        ),
    ]
}

/// `consistencyProofs`: (old size, new size, proof).
fn consistency_vectors() -> Vec<(u64, u64, Vec<Hash>)> {
    vec![
        (1, 1, vec![]),
        (
            1,
            8,
            vec![
                h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"),
                h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
                h("6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"),
            ],
        ),
        (
            6,
            8,
            vec![
                h("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a"),
                h("ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"),
                h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
            ],
        ),
        (
            2,
            5,
            vec![
                h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
                h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
            ],
        ),
        (
            6,
            7,
            vec![
                h("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a"),
                h("b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f"),
                h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
            ],
        ),
    ]
}

/// `sha256SomeHash` of proofgen.
fn some_hash() -> Hash {
    h("abacaba000000000000000000000000000000000000000000060061e00123456")
}

fn leaf_hashes() -> Vec<Hash> {
    leaf_inputs()
        .iter()
        .map(|data| merkle::leaf_hash(data))
        .collect()
}

#[test]
fn empty_root_is_sha256_of_nothing() {
    assert_eq!(empty_root(), root_hashes()[0]);
    assert_eq!(merkle::root(&[]), root_hashes()[0]);
    assert_eq!(Frontier::new().root(), root_hashes()[0]);
}

#[test]
fn leaf_hashes_are_known() {
    assert_eq!(leaf_hashes(), node_hashes()[0]);
}

#[test]
fn node_hashes_are_known() {
    let nodes = node_hashes();
    for level in 1..nodes.len() {
        for (index, expected) in nodes[level].iter().enumerate() {
            let left = &nodes[level - 1][2 * index];
            let right = &nodes[level - 1][2 * index + 1];
            assert_eq!(
                merkle::node_hash(left, right),
                *expected,
                "level {level} index {index}"
            );
        }
    }
}

#[test]
fn roots_of_every_size_are_known() {
    let leaves = leaf_hashes();
    for (size, expected) in root_hashes().iter().enumerate() {
        assert_eq!(merkle::root(&leaves[..size]), *expected, "size {size}");
    }
}

#[test]
fn frontier_matches_compact_trees_and_roots() {
    let leaves = leaf_hashes();
    let nodes = node_hashes();
    let roots = root_hashes();
    let compact = compact_trees();
    let mut frontier = Frontier::new();
    for (size, leaf) in leaves.iter().enumerate() {
        let completed = frontier.append(*leaf);
        let new_size = size as u64 + 1;
        // Every subtree the append completed, with its known hash.
        assert_eq!(completed.len(), new_size.trailing_zeros() as usize);
        for (subtree, hash) in &completed {
            assert_eq!(
                *hash, nodes[subtree.level as usize][subtree.index as usize],
                "{subtree:?}"
            );
            assert_eq!(subtree.end(), new_size);
        }
        let expected: Vec<Hash> = compact[size + 1]
            .iter()
            .map(|&(level, index)| nodes[level][index])
            .collect();
        assert_eq!(frontier.hashes(), expected.as_slice(), "size {new_size}");
        let subtrees: Vec<Subtree> = compact[size + 1]
            .iter()
            .map(|&(level, index)| Subtree {
                level: level as u8,
                index: index as u64,
            })
            .collect();
        assert_eq!(frontier.subtrees(), subtrees);
        assert_eq!(frontier.root(), roots[size + 1]);
        assert_eq!(
            Frontier::from_parts(new_size, expected).unwrap().root(),
            roots[size + 1]
        );
    }
}

#[test]
fn fold_of_known_subtrees_is_known_root() {
    let nodes = node_hashes();
    let roots = root_hashes();
    for (size, parts) in compact_trees().iter().enumerate() {
        let hashes: Vec<Hash> = parts.iter().map(|&(l, i)| nodes[l][i]).collect();
        assert_eq!(merkle::fold_subtrees(&hashes), roots[size], "size {size}");
    }
}

#[test]
fn inclusion_proofs_are_known_and_verify() {
    let leaves = leaf_hashes();
    let roots = root_hashes();
    for (index, size, proof) in inclusion_vectors() {
        let tree = &leaves[..size as usize];
        assert_eq!(
            inclusion_proof(tree, index),
            proof,
            "index {index} size {size}"
        );
        verify_inclusion(
            &leaves[index as usize],
            index,
            size,
            &proof,
            &roots[size as usize],
        )
        .unwrap_or_else(|error| panic!("index {index} size {size}: {error}"));
    }
}

#[test]
fn consistency_proofs_are_known_and_verify() {
    let leaves = leaf_hashes();
    let roots = root_hashes();
    for (old, new, proof) in consistency_vectors() {
        assert_eq!(
            consistency_proof(&leaves[..new as usize], old),
            proof,
            "{old} -> {new}"
        );
        verify_consistency(old, new, &roots[old as usize], &roots[new as usize], &proof)
            .unwrap_or_else(|error| panic!("{old} -> {new}: {error}"));
    }
}

/// The corrupted inclusion probes of proofgen's `invalidInclusionProof`.
#[test]
fn corrupted_inclusion_proofs_fail() {
    let leaves = leaf_hashes();
    let roots = root_hashes();
    for (index, size, proof) in inclusion_vectors() {
        let root = roots[size as usize];
        let leaf = leaves[index as usize];
        let fails = |leaf: Hash, index: u64, size: u64, proof: &[Hash], root: Hash, what: &str| {
            assert!(
                verify_inclusion(&leaf, index, size, proof, &root).is_err(),
                "{what} (index {index}, size {size}) verified"
            );
        };
        if index > 0 {
            fails(leaf, index - 1, size, &proof, root, "leaf index - 1");
        }
        fails(leaf, index + 1, size, &proof, root, "leaf index + 1");
        fails(leaf, index ^ 2, size, &proof, root, "leaf index ^ 2");
        fails(leaf, index, size * 2, &proof, root, "tree size * 2");
        fails(leaf, index, size / 2, &proof, root, "tree size / 2");
        fails(
            merkle::leaf_hash(b"WrongLeaf"),
            index,
            size,
            &proof,
            root,
            "wrong leaf",
        );
        fails(leaf, index, size, &proof, empty_root(), "empty root");
        fails(leaf, index, size, &proof, some_hash(), "random root");
        let mut longer = proof.clone();
        longer.push(root);
        fails(leaf, index, size, &longer, root, "trailing root");
        let mut longer = vec![root];
        longer.extend_from_slice(&proof);
        fails(leaf, index, size, &longer, root, "preceding root");
        for i in 0..proof.len() {
            let mut wrong = proof.clone();
            wrong[i][0] ^= 8;
            fails(leaf, index, size, &wrong, root, "modified proof bit");
        }
        if !proof.is_empty() {
            fails(
                leaf,
                index,
                size,
                &proof[..proof.len() - 1],
                root,
                "removed component",
            );
        }
        if proof.len() > 1 {
            let mut wrong = vec![proof[0], some_hash()];
            wrong.extend_from_slice(&proof[1..]);
            fails(leaf, index, size, &wrong, root, "inserted component");
        }
    }
}

/// The corrupted consistency probes proofgen writes.
#[test]
fn corrupted_consistency_proofs_fail() {
    let roots = root_hashes();
    for (old, new, proof) in consistency_vectors() {
        let (root1, root2) = (roots[old as usize], roots[new as usize]);
        let fails = |old: u64, new: u64, root1: Hash, root2: Hash, proof: &[Hash], what: &str| {
            assert!(
                verify_consistency(old, new, &root1, &root2, proof).is_err(),
                "{what} ({old} -> {new}) verified"
            );
        };
        if old != new {
            fails(old, new, root1, root2, &[], "empty proof");
            fails(old - 1, new, root1, root2, &proof, "size1 - 1");
            fails(old + 1, new, root1, root2, &proof, "size1 + 1");
            fails(old ^ 2, new, root1, root2, &proof, "size1 ^ 2");
            fails(old, new * 2, root1, root2, &proof, "size2 * 2");
            fails(old, new / 2, root1, root2, &proof, "size2 / 2");
            fails(old, new, some_hash(), root2, &proof, "wrong root1");
            fails(old, new, root1, some_hash(), &proof, "wrong root2");
            fails(old, new, root2, root1, &proof, "swapped roots");
        } else {
            fails(
                old,
                new,
                root1,
                some_hash(),
                &proof,
                "different roots, same size",
            );
        }
        let mut longer = proof.clone();
        longer.push(root1);
        fails(old, new, root1, root2, &longer, "trailing root1");
        let mut longer = vec![root2];
        longer.extend_from_slice(&proof);
        fails(old, new, root1, root2, &longer, "preceding root2");
        for i in 0..proof.len() {
            let mut wrong = proof.clone();
            wrong[i][0] ^= 4;
            fails(old, new, root1, root2, &wrong, "modified proof bit");
        }
        if !proof.is_empty() {
            fails(
                old,
                new,
                root1,
                root2,
                &proof[..proof.len() - 1],
                "truncated proof",
            );
        }
    }
}

/// The `testdata/consistency/additional` and `testdata/inclusion/additional`
/// and `single-entry` cases of proofgen, as far as this crate's documented
/// rules agree (an old size of 0 with an empty proof and the empty root is
/// accepted here; Go's verifier refuses every proof from size 0).
#[test]
fn edge_cases() {
    let roots = root_hashes();
    let e = empty_root();
    let x = some_hash();
    // Sizes out of order.
    assert!(matches!(
        verify_consistency(1, 0, &x, &x, &[]),
        Err(ProofError::SizeOrder {
            old_size: 1,
            new_size: 0
        })
    ));
    assert!(verify_consistency(2, 1, &x, &e, &[]).is_err());
    // Equal sizes: an empty proof and equal roots.
    assert!(verify_consistency(1, 1, &x, &x, &[]).is_ok());
    assert!(verify_consistency(0, 0, &e, &e, &[]).is_ok());
    assert!(matches!(
        verify_consistency(1, 1, &e, &x, &[]),
        Err(ProofError::DifferentRoots { size: 1, .. })
    ));
    assert!(matches!(
        verify_consistency(1, 1, &e, &e, &[e]),
        Err(ProofError::WrongProofLength {
            expected: 0,
            got: 1
        })
    ));
    assert!(verify_consistency(0, 0, &e, &e, &[e]).is_err());
    // From the empty tree: an empty proof, and the empty tree's root.
    assert!(verify_consistency(0, 1, &e, &roots[1], &[]).is_ok());
    assert!(verify_consistency(0, 1, &e, &e, &[e]).is_err());
    assert!(matches!(
        verify_consistency(0, 1, &x, &roots[1], &[]),
        Err(ProofError::OldRootMismatch { .. })
    ));
    // A larger tree and an empty proof.
    assert!(matches!(
        verify_consistency(1, 2, &roots[1], &roots[2], &[]),
        Err(ProofError::WrongProofLength {
            expected: 1,
            got: 0
        })
    ));
    // Inclusion in trees too small for the index.
    for (index, size) in [(0, 0), (1, 0), (2, 1), (1, 1)] {
        assert!(matches!(
            verify_inclusion(&x, index, size, &[], &e),
            Err(ProofError::IndexOutOfRange { .. })
        ));
    }
    // A single leaf is its tree's root, with an empty proof.
    let leaf = merkle::leaf_hash(b"data");
    assert!(verify_inclusion(&leaf, 0, 1, &[], &leaf).is_ok());
    assert!(matches!(
        verify_inclusion(&leaf, 0, 1, &[], &e),
        Err(ProofError::RootMismatch { .. })
    ));
}

#[test]
fn errors_are_readable() {
    let error = verify_inclusion(&some_hash(), 9, 8, &[], &empty_root()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "leaf index 9 is outside a tree of 8 leaves (it must be below the tree size)"
    );
    let error = verify_inclusion(&some_hash(), 0, 8, &[], &empty_root()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "the proof has 0 hashes, but a proof for these tree sizes has 3"
    );
    let error = verify_consistency(3, 2, &empty_root(), &empty_root(), &[]).unwrap_err();
    assert_eq!(
        error.to_string(),
        "the old tree size 3 is larger than the new tree size 2"
    );
    let error = Frontier::from_parts(7, vec![empty_root()]).unwrap_err();
    assert_eq!(
        error.to_string(),
        "a frontier of 7 leaves has 3 subtree hashes (one per bit set in the size), not 1"
    );
}
