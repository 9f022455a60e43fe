//! Redrive's audit log as a verifiable, append-only transparency log.
//!
//! Every replayed message (an audit *event*) and every operator *action*
//! becomes one leaf of an RFC 6962 Merkle tree; the planner periodically
//! signs the tree's head as a C2SP checkpoint, and anyone holding the log's
//! public key can check an export of the log offline.
//!
//! The modules, bottom up:
//!
//! - [`merkle`]: RFC 6962 §2.1 hashing (leaf and node hashes, the Merkle
//!   Tree Hash), the coordinates and contents of inclusion and consistency
//!   proofs, their verification per RFC 9162 §2.1.3.2 and §2.1.4.2, and the
//!   [`merkle::Frontier`] a sequencer appends leaves to.
//! - [`note`]: C2SP signed notes (`c2sp.org/signed-note`) with Ed25519 keys,
//!   in the key text formats of Go's `golang.org/x/mod/sumdb/note`.
//! - [`checkpoint`]: C2SP checkpoints (`c2sp.org/tlog-checkpoint`), the
//!   signed note text naming a tree's origin, size and root.
//! - [`leaf`]: the canonical bytes (RFC 8785 JSON) of a log entry.
//! - [`export`]: the CSV and JSON Lines rows of a log export.
//! - [`verify`]: offline verification of an export against a signed
//!   checkpoint and any witnessed ones.

pub mod checkpoint;
pub mod export;
pub mod leaf;
pub mod merkle;
pub mod note;
mod parallel;
pub mod verify;

/// A SHA-256 digest, 32 bytes: a leaf hash, an interior node hash or a tree
/// root (RFC 6962 §2.1 uses SHA-256 as its hash algorithm).
pub type Hash = [u8; 32];
