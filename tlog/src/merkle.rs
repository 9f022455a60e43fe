//! RFC 6962 Merkle trees: hashing, proof coordinates, proofs and their
//! verification.
//!
//! The tree over `n` leaves is the Merkle Tree Hash of RFC 6962 §2.1 (the
//! same definition as RFC 9162 §2.1.1), with SHA-256, a `0x00` prefix for
//! leaves and `0x01` for interior nodes:
//!
//! ```text
//! MTH({})      = SHA-256()
//! MTH({d(0)})  = SHA-256(0x00 || d(0))
//! MTH(D[n])    = SHA-256(0x01 || MTH(D[0:k]) || MTH(D[k:n]))
//!                where k is the largest power of two smaller than n
//! ```
//!
//! Sizes and indices are leaf counts and zero-based leaf positions (`u64`);
//! ranges are half-open, `start..end`, in leaves. Every node an RFC 6962
//! proof names covers such a range `D[k:n]` whose start is a multiple of
//! the smallest power of two not below its length; [`perfect_subtrees`]
//! splits it into stored perfect subtrees and [`fold_subtrees`] hashes them
//! back into the node's hash, so a sequencer that keeps only perfect
//! subtrees (what [`Frontier::append`] reports) can serve any proof.

use std::ops::Range;

use sha2::{Digest, Sha256};

use crate::Hash;

/// The RFC 6962 §2.1 hash of a leaf: SHA-256(0x00 || `data`), 32 bytes.
pub fn leaf_hash(data: &[u8]) -> Hash {
    let mut hasher = Sha256::new();
    hasher.update([0x00]);
    hasher.update(data);
    hasher.finalize().into()
}

/// The RFC 6962 §2.1 hash of an interior node: SHA-256(0x01 || `left` ||
/// `right`), 32 bytes.
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut hasher = Sha256::new();
    hasher.update([0x01]);
    hasher.update(left);
    hasher.update(right);
    hasher.finalize().into()
}

/// The root of the empty tree, MTH({}) = SHA-256 of no bytes
/// (`e3b0c442…b855`, RFC 6962 §2.1).
pub fn empty_root() -> Hash {
    Sha256::digest([]).into()
}

/// The Merkle Tree Hash (RFC 6962 §2.1) of the tree whose leaf hashes (see
/// [`leaf_hash`]) are `leaves`, in order; [`empty_root`] for no leaves.
///
/// Runs in O(n) hashes and O(log n) extra memory: the leaves are appended
/// to a [`Frontier`] (a stack of at most 64 perfect subtrees) whose hashes
/// are then folded ([`fold_subtrees`]).
pub fn root(leaves: &[Hash]) -> Hash {
    let mut frontier = Frontier::new();
    for leaf in leaves {
        frontier.push(*leaf, |_, _| {});
    }
    frontier.root()
}

/// A perfect (complete, balanced) subtree of the tree: the `2^level`
/// leaves `[index << level, (index + 1) << level)`.
///
/// Level 0 is a single leaf (its hash is the leaf hash); the subtree at
/// `level` and `index` is the interior node over its children `(level - 1,
/// 2 * index)` and `(level - 1, 2 * index + 1)`. This is the node naming of
/// RFC 9162 §2.1 trees used by tiled logs (C2SP `tlog-tiles`) and compact
/// ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Subtree {
    /// The height above the leaves: the subtree covers `2^level` leaves
    /// (0 ..= 63).
    pub level: u8,
    /// The position among the subtrees of this level, counted from the
    /// left starting at 0.
    pub index: u64,
}

impl Subtree {
    /// The index of the first leaf the subtree covers: `index << level`.
    ///
    /// # Panics
    ///
    /// If the value does not fit in a `u64` (`level` ≥ 64 or `index` too
    /// large for the level), which no subtree of a real tree does.
    pub fn start(&self) -> u64 {
        shifted(self.index, self.level)
    }

    /// The index one past the last leaf the subtree covers: `(index + 1)
    /// << level`.
    ///
    /// # Panics
    ///
    /// If the value does not fit in a `u64` (see [`Subtree::start`]).
    pub fn end(&self) -> u64 {
        let next = self
            .index
            .checked_add(1)
            .expect("subtree index overflows u64");
        shifted(next, self.level)
    }

    /// The leaves the subtree covers, [`Subtree::start`]`..`[`Subtree::end`].
    ///
    /// # Panics
    ///
    /// As [`Subtree::end`].
    pub fn range(&self) -> Range<u64> {
        self.start()..self.end()
    }
}

/// `value << level`, checking that no bit is lost.
fn shifted(value: u64, level: u8) -> u64 {
    assert!(
        level < 64 && value <= u64::MAX >> level,
        "subtree (level {level}, index {value}) lies outside the u64 leaf range"
    );
    value << level
}

/// The decomposition of the leaf range `range` into maximal perfect
/// subtrees, left to right.
///
/// For the ranges RFC 6962 proofs name (every node `MTH(D[k:n])` of §2.1.1
/// and §2.1.2, whose start is a multiple of the smallest power of two not
/// below its length, such as `0..size`), these are the subtrees of the
/// sizes of the bits set in the length, largest first, and
/// [`fold_subtrees`] of their hashes is the range's Merkle Tree Hash:
/// `fold_subtrees(hashes of perfect_subtrees(r)) == MTH(D[r])`.
///
/// For any other range it is still the smallest set of aligned perfect
/// subtrees covering it (a "compact range", first growing then shrinking),
/// but such a range is no node of the tree and the fold is no MTH of it.
/// An empty range gives no subtrees.
pub fn perfect_subtrees(range: Range<u64>) -> Vec<Subtree> {
    let mut subtrees = Vec::new();
    let mut position = range.start;
    while position < range.end {
        let remaining = range.end - position;
        let fits = 63 - remaining.leading_zeros();
        let aligned = position.trailing_zeros();
        let level = fits.min(aligned);
        subtrees.push(Subtree {
            level: level as u8,
            index: position >> level,
        });
        position += 1 << level;
    }
    subtrees
}

/// The Merkle Tree Hash of a range from the hashes of the perfect subtrees
/// it decomposes into ([`perfect_subtrees`], left to right), folded from
/// the right: `node(h0, node(h1, … node(h_{k-2}, h_{k-1})))`.
///
/// A single hash is returned as is; no hashes give [`empty_root`] (the MTH
/// of no leaves, RFC 6962 §2.1). For a range that is a node of the tree,
/// `fold_subtrees(hashes of perfect_subtrees(r)) == MTH(D[r])`, because
/// §2.1 splits a range at the largest power of two below its length,
/// which is the first (largest) subtree.
pub fn fold_subtrees(hashes: &[Hash]) -> Hash {
    match hashes.split_last() {
        None => empty_root(),
        Some((last, rest)) => rest
            .iter()
            .rev()
            .fold(*last, |right, left| node_hash(left, &right)),
    }
}

/// The largest power of two strictly below `n`, for `n` ≥ 2 (the split
/// point `k` of RFC 6962 §2.1).
fn split_point(n: u64) -> u64 {
    debug_assert!(n >= 2);
    1 << (63 - (n - 1).leading_zeros())
}

/// The leaf ranges of the nodes whose hashes form the audit path of leaf
/// `index` in a tree of `size` leaves: `PATH(index, D[size])` of RFC 6962
/// §2.1.1, in the proof's order (the leaf's sibling first, the root's
/// child last).
///
/// Each range is a node of the tree; its hash is the MTH of its leaves
/// (from stored subtrees: [`perfect_subtrees`] and [`fold_subtrees`]).
/// Returns no ranges when `size` ≤ 1, and none when `index` ≥ `size` (no
/// such leaf; [`verify_inclusion`] rejects that index whatever the proof).
pub fn inclusion_path(index: u64, size: u64) -> Vec<Range<u64>> {
    let mut path = Vec::new();
    if index >= size {
        return path;
    }
    // PATH(m, D[start:start+n]), from the root down; the proof lists the
    // same nodes from the leaf up.
    let (mut start, mut n, mut m) = (0u64, size, index);
    while n > 1 {
        let k = split_point(n);
        if m < k {
            path.push(start + k..start + n);
            n = k;
        } else {
            path.push(start..start + k);
            start += k;
            m -= k;
            n -= k;
        }
    }
    path.reverse();
    path
}

/// The leaf ranges of the nodes whose hashes form the consistency proof
/// between the trees of `old_size` and `new_size` leaves: `PROOF(old_size,
/// D[new_size])` of RFC 6962 §2.1.2 (through `SUBPROOF`), in the proof's
/// order.
///
/// Returns no ranges when `old_size` is 0 or equal to `new_size` (their
/// proofs are empty), and none when `old_size` > `new_size` (no proof
/// exists; [`verify_consistency`] rejects those sizes).
pub fn consistency_path(old_size: u64, new_size: u64) -> Vec<Range<u64>> {
    let mut path = Vec::new();
    if old_size == 0 || old_size >= new_size {
        return path;
    }
    // SUBPROOF(m, D[start:start+n], whole): each step appends one node
    // after the recursive part, so the nodes are collected outside in and
    // reversed at the end.
    let (mut start, mut m, mut n, mut whole) = (0u64, old_size, new_size, true);
    loop {
        if m == n {
            if !whole {
                path.push(start..start + n);
            }
            break;
        }
        let k = split_point(n);
        if m <= k {
            path.push(start + k..start + n);
            n = k;
        } else {
            path.push(start..start + k);
            start += k;
            m -= k;
            n -= k;
            whole = false;
        }
    }
    path.reverse();
    path
}

/// The MTH of `leaves[range]` through its perfect subtrees, as a sequencer
/// that stores only perfect subtrees computes it.
fn range_hash(leaves: &[Hash], range: Range<u64>) -> Hash {
    let hashes: Vec<Hash> = perfect_subtrees(range)
        .iter()
        .map(|subtree| root(&leaves[subtree.start() as usize..subtree.end() as usize]))
        .collect();
    fold_subtrees(&hashes)
}

/// The RFC 6962 §2.1.1 inclusion proof (audit path) of leaf `index` in the
/// tree whose leaf hashes are `leaves`: the hashes of [`inclusion_path`]
/// (`index`, `leaves.len()`), in order.
///
/// Returns an empty proof when `index` ≥ `leaves.len()` (no such leaf).
pub fn inclusion_proof(leaves: &[Hash], index: u64) -> Vec<Hash> {
    inclusion_path(index, leaves.len() as u64)
        .into_iter()
        .map(|range| range_hash(leaves, range))
        .collect()
}

/// The RFC 6962 §2.1.2 consistency proof from the tree of the first
/// `old_size` leaf hashes of `leaves` to the tree of all of them: the
/// hashes of [`consistency_path`](`old_size`, `leaves.len()`), in order.
///
/// Returns an empty proof when `old_size` is 0, equal to or larger than
/// `leaves.len()`.
pub fn consistency_proof(leaves: &[Hash], old_size: u64) -> Vec<Hash> {
    consistency_path(old_size, leaves.len() as u64)
        .into_iter()
        .map(|range| range_hash(leaves, range))
        .collect()
}

/// Why a proof, or a frontier's parts, were refused.
#[derive(Debug, thiserror::Error)]
pub enum ProofError {
    /// An inclusion proof for a leaf index that is not below the tree size.
    #[error(
        "leaf index {index} is outside a tree of {size} leaves (it must be below the tree size)"
    )]
    IndexOutOfRange {
        /// The leaf index asked about.
        index: u64,
        /// The tree size.
        size: u64,
    },
    /// A consistency proof from a larger tree to a smaller one.
    #[error("the old tree size {old_size} is larger than the new tree size {new_size}")]
    SizeOrder {
        /// The old (first) tree size.
        old_size: u64,
        /// The new (second) tree size.
        new_size: u64,
    },
    /// The proof has more or fewer hashes than RFC 6962 prescribes for
    /// these sizes (and index): [`inclusion_path`] or [`consistency_path`].
    #[error("the proof has {got} hashes, but a proof for these tree sizes has {expected}")]
    WrongProofLength {
        /// The number of hashes the proof must have.
        expected: usize,
        /// The number it has.
        got: usize,
    },
    /// The proof leads to another (new) root than the one expected.
    #[error(
        "the proof leads to root {}, not to the expected root {}",
        hex::encode(.computed),
        hex::encode(.expected)
    )]
    RootMismatch {
        /// The root the proof computes.
        computed: Hash,
        /// The root it had to compute.
        expected: Hash,
    },
    /// A consistency proof that does not lead back to the old root (for an
    /// old size of 0, an old root that is not [`empty_root`]).
    #[error(
        "the consistency proof leads to old root {}, not to the expected old root {}",
        hex::encode(.computed),
        hex::encode(.expected)
    )]
    OldRootMismatch {
        /// The old root the proof computes.
        computed: Hash,
        /// The old root it had to compute.
        expected: Hash,
    },
    /// Two trees of the same size with different roots: no proof can make
    /// them consistent.
    #[error(
        "two trees of {size} leaves have different roots ({} and {})",
        hex::encode(.old_root),
        hex::encode(.new_root)
    )]
    DifferentRoots {
        /// The size of both trees.
        size: u64,
        /// The old tree's root.
        old_root: Hash,
        /// The new tree's root.
        new_root: Hash,
    },
    /// [`Frontier::from_parts`] with a number of hashes other than the
    /// number of bits set in the size.
    #[error(
        "a frontier of {size} leaves has {expected} subtree hashes (one per bit set in the size), not {got}"
    )]
    FrontierLength {
        /// The tree size given.
        size: u64,
        /// `size.count_ones()`.
        expected: u32,
        /// The number of hashes given.
        got: usize,
    },
}

/// Verifies that `leaf` (a leaf hash) is leaf `index` of the tree of `size`
/// leaves whose root is `root`, by the inclusion `proof` (its audit path,
/// RFC 6962 §2.1.1), with the algorithm of RFC 9162 §2.1.3.2.
///
/// # Errors
///
/// [`ProofError::IndexOutOfRange`] when `index` ≥ `size`,
/// [`ProofError::WrongProofLength`] when the proof has more or fewer hashes
/// than [`inclusion_path`] names, [`ProofError::RootMismatch`] when the
/// proof leads to another root.
pub fn verify_inclusion(
    leaf: &Hash,
    index: u64,
    size: u64,
    proof: &[Hash],
    root: &Hash,
) -> Result<(), ProofError> {
    if index >= size {
        return Err(ProofError::IndexOutOfRange { index, size });
    }
    let expected = inclusion_path(index, size).len();
    let wrong_length = ProofError::WrongProofLength {
        expected,
        got: proof.len(),
    };
    if proof.len() != expected {
        return Err(wrong_length);
    }
    // RFC 9162 §2.1.3.2, steps 2 to 5.
    let (mut f_n, mut s_n) = (index, size - 1);
    let mut r = *leaf;
    for p in proof {
        if s_n == 0 {
            return Err(wrong_length);
        }
        if f_n & 1 == 1 || f_n == s_n {
            r = node_hash(p, &r);
            while f_n & 1 == 0 && f_n != 0 {
                f_n >>= 1;
                s_n >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        f_n >>= 1;
        s_n >>= 1;
    }
    if s_n != 0 {
        return Err(wrong_length);
    }
    if r != *root {
        return Err(ProofError::RootMismatch {
            computed: r,
            expected: *root,
        });
    }
    Ok(())
}

/// Verifies that the tree of `new_size` leaves with root `new_root` extends
/// the tree of `old_size` leaves with root `old_root` (append-only), by the
/// consistency `proof` (RFC 6962 §2.1.2), with the algorithm of RFC 9162
/// §2.1.4.2.
///
/// Equal sizes need an empty proof and equal roots. An old size of 0 needs
/// an empty proof (every tree extends the empty one) and an old root that
/// is [`empty_root`], MTH({}) of RFC 6962 §2.1.
///
/// # Errors
///
/// [`ProofError::SizeOrder`] when `old_size` > `new_size`,
/// [`ProofError::DifferentRoots`] for equal sizes with different roots,
/// [`ProofError::WrongProofLength`] when the proof has more or fewer hashes
/// than [`consistency_path`] names, [`ProofError::OldRootMismatch`] and
/// [`ProofError::RootMismatch`] when the proof leads to another old or new
/// root.
pub fn verify_consistency(
    old_size: u64,
    new_size: u64,
    old_root: &Hash,
    new_root: &Hash,
    proof: &[Hash],
) -> Result<(), ProofError> {
    if old_size > new_size {
        return Err(ProofError::SizeOrder { old_size, new_size });
    }
    if old_size == new_size {
        if !proof.is_empty() {
            return Err(ProofError::WrongProofLength {
                expected: 0,
                got: proof.len(),
            });
        }
        if old_root != new_root {
            return Err(ProofError::DifferentRoots {
                size: old_size,
                old_root: *old_root,
                new_root: *new_root,
            });
        }
        return Ok(());
    }
    if old_size == 0 {
        if !proof.is_empty() {
            return Err(ProofError::WrongProofLength {
                expected: 0,
                got: proof.len(),
            });
        }
        if *old_root != empty_root() {
            return Err(ProofError::OldRootMismatch {
                computed: empty_root(),
                expected: *old_root,
            });
        }
        return Ok(());
    }
    let expected = consistency_path(old_size, new_size).len();
    let wrong_length = ProofError::WrongProofLength {
        expected,
        got: proof.len(),
    };
    if proof.len() != expected || proof.is_empty() {
        return Err(wrong_length);
    }
    // RFC 9162 §2.1.4.2, steps 2 to 7: a power-of-two old tree is itself a
    // node of the new one, and its root starts the path.
    let (first, rest) = if old_size.is_power_of_two() {
        (*old_root, proof)
    } else {
        (proof[0], &proof[1..])
    };
    let (mut f_n, mut s_n) = (old_size - 1, new_size - 1);
    while f_n & 1 == 1 {
        f_n >>= 1;
        s_n >>= 1;
    }
    let (mut f_r, mut s_r) = (first, first);
    for c in rest {
        if s_n == 0 {
            return Err(wrong_length);
        }
        if f_n & 1 == 1 || f_n == s_n {
            f_r = node_hash(c, &f_r);
            s_r = node_hash(c, &s_r);
            while f_n & 1 == 0 && f_n != 0 {
                f_n >>= 1;
                s_n >>= 1;
            }
        } else {
            s_r = node_hash(&s_r, c);
        }
        f_n >>= 1;
        s_n >>= 1;
    }
    if s_n != 0 {
        return Err(wrong_length);
    }
    if f_r != *old_root {
        return Err(ProofError::OldRootMismatch {
            computed: f_r,
            expected: *old_root,
        });
    }
    if s_r != *new_root {
        return Err(ProofError::RootMismatch {
            computed: s_r,
            expected: *new_root,
        });
    }
    Ok(())
}

/// The right edge of a tree (a "compact range" over `0..size`): the hashes
/// of the perfect subtrees a tree of `size` leaves decomposes into
/// ([`perfect_subtrees`]`(0..size)`), largest first, one per bit set in
/// `size`.
///
/// This is all a sequencer must keep to append leaves and know the root:
/// at most 64 hashes. [`Frontier::append`] reports the interior nodes each
/// append completes so they can be stored for proofs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frontier {
    size: u64,
    hashes: Vec<Hash>,
}

impl Frontier {
    /// The frontier of the empty tree (size 0, no hashes).
    pub fn new() -> Frontier {
        Frontier::default()
    }

    /// A frontier from stored parts: the tree size and the hashes of the
    /// perfect subtrees of [`perfect_subtrees`]`(0..size)`, largest first.
    ///
    /// # Errors
    ///
    /// [`ProofError::FrontierLength`] when `hashes.len()` is not
    /// `size.count_ones()`. (The hashes themselves cannot be checked
    /// without the leaves; compare [`Frontier::root`] with a signed root.)
    pub fn from_parts(size: u64, hashes: Vec<Hash>) -> Result<Frontier, ProofError> {
        if hashes.len() != size.count_ones() as usize {
            return Err(ProofError::FrontierLength {
                size,
                expected: size.count_ones(),
                got: hashes.len(),
            });
        }
        Ok(Frontier { size, hashes })
    }

    /// The number of leaves in the tree.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The hashes of the perfect subtrees the tree decomposes into, largest
    /// (leftmost) first: `size().count_ones()` of them.
    pub fn hashes(&self) -> &[Hash] {
        &self.hashes
    }

    /// The subtrees [`Frontier::hashes`] are the hashes of, in the same
    /// order: [`perfect_subtrees`]`(0..size)`.
    pub fn subtrees(&self) -> Vec<Subtree> {
        perfect_subtrees(0..self.size)
    }

    /// The tree's root, the RFC 6962 §2.1 MTH: [`fold_subtrees`] of the
    /// hashes, [`empty_root`] for the empty tree.
    pub fn root(&self) -> Hash {
        fold_subtrees(&self.hashes)
    }

    /// Appends the leaf whose leaf hash ([`leaf_hash`]) is `leaf` and
    /// returns every perfect subtree of level ≥ 1 this append completed,
    /// with its hash, in increasing level (the new leaf itself, level 0, is
    /// not listed).
    ///
    /// # Panics
    ///
    /// If the tree already has `u64::MAX` leaves.
    pub fn append(&mut self, leaf: Hash) -> Vec<(Subtree, Hash)> {
        let mut completed = Vec::new();
        self.push(leaf, |subtree, hash| completed.push((subtree, hash)));
        completed
    }

    /// [`Frontier::append`], reporting completed subtrees to `completed`.
    fn push(&mut self, leaf: Hash, mut completed: impl FnMut(Subtree, Hash)) {
        let new_size = self.size.checked_add(1).expect("the tree is full");
        let mut hash = leaf;
        let mut level = 0u8;
        while (self.size >> level) & 1 == 1 {
            let left = self.hashes.pop().expect("one hash per bit set in the size");
            hash = node_hash(&left, &hash);
            level += 1;
            completed(
                Subtree {
                    level,
                    index: (new_size >> level) - 1,
                },
                hash,
            );
        }
        self.hashes.push(hash);
        self.size = new_size;
    }

    /// The roots of the trees of the sizes in `sizes` (ascending, each at
    /// most `leaves.len()` plus this frontier's size), appending the leaf
    /// hashes `leaves` in one pass; returns them in the order of `sizes`.
    pub(crate) fn roots_at(&mut self, leaves: &[Hash], sizes: &[u64]) -> Vec<Hash> {
        let mut roots = Vec::with_capacity(sizes.len());
        let mut wanted = sizes.iter().peekable();
        while let Some(&&size) = wanted.peek() {
            if size != self.size {
                break;
            }
            roots.push(self.root());
            wanted.next();
        }
        for leaf in leaves {
            self.push(*leaf, |_, _| {});
            while let Some(&&size) = wanted.peek() {
                if size != self.size {
                    break;
                }
                roots.push(self.root());
                wanted.next();
            }
        }
        roots
    }
}
