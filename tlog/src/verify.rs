//! Offline verification of a log export against the log's signed
//! checkpoint and any witnessed checkpoints.
//!
//! What it establishes, for a checkpoint of `N` leaves signed by the log's
//! key:
//!
//! 1. the export holds exactly the leaves `0..N` (rows of later leaves are
//!    newer than the checkpoint and only counted);
//! 2. each record the log sealed is still in the database, unchanged: its
//!    content re-hashes ([`crate::leaf::Entry::leaf_hash`]) to the sealed leaf hash;
//! 3. the sealed leaf hashes are the tree the log signed: their RFC 6962
//!    root ([`crate::merkle::root`]) is the checkpoint's root;
//! 4. every record in the database was sealed;
//! 5. the log never forked or shrank behind a witness's back: every
//!    witnessed checkpoint (kept outside the database) of `M` ≤ `N` leaves
//!    has the root of the first `M` sealed leaf hashes, and none has more
//!    leaves than `N`.
//!
//! Everything runs in O(n) time for n rows, one pass for all prefix roots.

use std::collections::BTreeMap;
use std::fmt;

use crate::Hash;
use crate::checkpoint::{self, Checkpoint, CheckpointError};
use crate::export::LogExport;
use crate::merkle::Frontier;
use crate::note::{NoteError, Verifier};

/// Something wrong with the log or the database, found by [`verify`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// No row for this leaf below the checkpoint's size.
    Missing {
        /// The leaf's index.
        leaf_index: u64,
    },
    /// More than one row for this leaf (the first is checked; this is a
    /// later one).
    Duplicate {
        /// The leaf's index.
        leaf_index: u64,
        /// The later row's kind.
        kind: String,
        /// The later row's plan.
        plan_id: String,
        /// The later row's record id.
        id: i64,
    },
    /// A sealed row without its sealed leaf hash (only possible for rows
    /// built in memory: the export files have both or neither).
    NoLeafHash {
        /// The leaf's index.
        leaf_index: u64,
    },
    /// The log sealed this record, and the database no longer has it.
    Deleted {
        /// The leaf's index.
        leaf_index: u64,
        /// The record's kind.
        kind: String,
        /// The record's plan.
        plan_id: String,
        /// The record's id.
        id: i64,
    },
    /// The record changed after it was sealed: its content does not hash
    /// to the sealed leaf hash (or the row's kind, plan or id are not the
    /// entry's).
    Changed {
        /// The leaf's index.
        leaf_index: u64,
        /// The row's kind.
        kind: String,
        /// The row's plan.
        plan_id: String,
        /// The row's record id.
        id: i64,
    },
    /// The sealed leaf hashes do not have the checkpoint's root: the log
    /// itself was rewritten.
    RootMismatch {
        /// The root the checkpoint signs.
        signed: Hash,
        /// The root of the sealed leaf hashes of the export.
        computed: Hash,
    },
    /// A record in the database that the log never sealed.
    Added {
        /// The record's kind.
        kind: String,
        /// The record's plan.
        plan_id: String,
        /// The record's id.
        id: i64,
        /// Why it was not sealed, if the export says.
        note: String,
    },
    /// A witnessed checkpoint with more leaves than the export's
    /// checkpoint: the log was cut short.
    Truncated {
        /// The witnessed checkpoint's size.
        witnessed_size: u64,
        /// The export's checkpoint's size.
        export_size: u64,
    },
    /// A witnessed checkpoint whose root is not the root of the export's
    /// first `witnessed_size` sealed leaf hashes: the log's history was
    /// rewritten (a fork).
    Forked {
        /// The witnessed checkpoint's size.
        witnessed_size: u64,
    },
}

/// `event 17 of plan 0190…`.
struct Record<'a>(&'a str, i64, &'a str);

impl fmt::Display for Record<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} of plan {}", self.0, self.1, self.2)
    }
}

impl fmt::Display for Problem {
    /// One sentence naming the leaf or record and what happened to it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Missing { leaf_index } => {
                write!(f, "leaf {leaf_index} is not in the export")
            }
            Problem::Duplicate {
                leaf_index,
                kind,
                plan_id,
                id,
            } => write!(
                f,
                "leaf {leaf_index} is in the export more than once (again as {})",
                Record(kind, *id, plan_id)
            ),
            Problem::NoLeafHash { leaf_index } => {
                write!(f, "leaf {leaf_index} has no sealed leaf hash in the export")
            }
            Problem::Deleted {
                leaf_index,
                kind,
                plan_id,
                id,
            } => write!(
                f,
                "leaf {leaf_index}: {} was sealed into the log but is gone from the database",
                Record(kind, *id, plan_id)
            ),
            Problem::Changed {
                leaf_index,
                kind,
                plan_id,
                id,
            } => write!(
                f,
                "leaf {leaf_index}: {} changed after it was sealed",
                Record(kind, *id, plan_id)
            ),
            Problem::RootMismatch { signed, computed } => write!(
                f,
                "the sealed leaf hashes do not match the signed root: the log itself was rewritten \
                 (signed root {}, root of the export's leaf hashes {})",
                hex::encode(signed),
                hex::encode(computed)
            ),
            Problem::Added {
                kind,
                plan_id,
                id,
                note,
            } => {
                write!(
                    f,
                    "{} is in the database but was never sealed into the log",
                    Record(kind, *id, plan_id)
                )?;
                if !note.is_empty() {
                    write!(f, " ({note})")?;
                }
                Ok(())
            }
            Problem::Truncated {
                witnessed_size,
                export_size,
            } => write!(
                f,
                "a witnessed checkpoint has {witnessed_size} leaves but the export's checkpoint \
                 only {export_size}: the log was cut short"
            ),
            Problem::Forked { witnessed_size } => write!(
                f,
                "the first {witnessed_size} leaves of the export do not have the root of the \
                 witnessed checkpoint of that size: the log's history was rewritten (a fork)"
            ),
        }
    }
}

/// What [`verify`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The size of the export's checkpoint, `N`.
    pub tree_size: u64,
    /// The checkpoint's origin (the log's identity).
    pub origin: String,
    /// Leaves below `N` whose record is in the export and was re-hashed
    /// and compared with the sealed leaf hash (whether it matched or not).
    pub leaves_checked: u64,
    /// Rows of leaves at or after `N`: sealed after the checkpoint, not
    /// checked.
    pub newer_rows: u64,
    /// What is wrong: leaf problems in leaf order, then the root, the
    /// unsealed records in export order, then the witnessed checkpoints'
    /// problems in the order given.
    pub problems: Vec<Problem>,
}

impl Report {
    /// Whether nothing is wrong.
    pub fn is_valid(&self) -> bool {
        self.problems.is_empty()
    }
}

impl fmt::Display for Report {
    /// A summary line, then one line per problem.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "log {} at {} leaves: {} leaves checked, {} newer rows, ",
            self.origin, self.tree_size, self.leaves_checked, self.newer_rows
        )?;
        if self.problems.is_empty() {
            return write!(f, "no problems");
        }
        write!(f, "{} problems", self.problems.len())?;
        for problem in &self.problems {
            write!(f, "\n- {problem}")?;
        }
        Ok(())
    }
}

/// Why [`verify`] could not verify at all.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The checkpoint note is not signed by the log's key (e.g. re-signed
    /// with another key), is malformed, or its signature is bad.
    #[error("the checkpoint is not the log's: {0}")]
    Signature(NoteError),
    /// The checkpoint note is signed by the log's key but its text is no
    /// checkpoint.
    #[error("the checkpoint is signed but unreadable: {0}")]
    Checkpoint(CheckpointError),
    /// A witnessed checkpoint that is not the log's (as
    /// [`VerifyError::Signature`]) or unreadable.
    #[error("witnessed checkpoint {number}: {source}")]
    Witnessed {
        /// Its position in the `witnessed` list, from 1.
        number: usize,
        /// What is wrong with it.
        source: CheckpointError,
    },
    /// A checkpoint too large for this machine to hold its leaf hashes
    /// (32 bytes per leaf).
    #[error(
        "the checkpoint's tree of {size} leaves is too large to verify here (32 bytes per leaf)"
    )]
    TooLarge {
        /// The checkpoint's size.
        size: u64,
    },
    /// A witnessed checkpoint of another log (another origin).
    #[error("witnessed checkpoint {number} is of the log {origin:?}, not {expected:?}")]
    OtherOrigin {
        /// Its position in the `witnessed` list, from 1.
        number: usize,
        /// Its origin.
        origin: String,
        /// The export's checkpoint's origin.
        expected: String,
    },
}

/// Whether a leaf below the checkpoint's size has a row.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// No row yet.
    Empty,
    /// A row without a leaf hash.
    Unhashed,
    /// A row with its sealed leaf hash.
    Hashed,
}

/// What re-hashing a sealed row's record gave.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rehash {
    /// No record (gone), or no leaf of this checkpoint.
    NotChecked,
    /// The record is the one sealed.
    Same,
    /// The record hashes to another leaf hash, or is another record.
    Changed,
}

/// Opens a checkpoint note with the log's key.
fn open(note: &str, key: &Verifier) -> Result<Checkpoint, CheckpointError> {
    checkpoint::open_checkpoint(note, key)
}

/// Verifies a log export: the checkpoint note `checkpoint_note` (the log's
/// signed checkpoint, e.g. the export's own [`LogExport::checkpoint`]) must
/// be signed by `key`, and every note in `witnessed` (checkpoints of the
/// same log kept outside its database, e.g. by a witness) too; then the
/// rows are checked against them as the module documentation lists, every
/// finding a [`Problem`] in the [`Report`].
///
/// Problems found: [`Problem::Missing`] (no row for a leaf below `N`),
/// [`Problem::Duplicate`], [`Problem::Deleted`], [`Problem::Changed`],
/// [`Problem::RootMismatch`] (checked only when no leaf is missing),
/// [`Problem::Added`] (a row without `leaf_index`), [`Problem::Truncated`]
/// and [`Problem::Forked`] (the fork check needs the first `M` leaves all
/// present).
///
/// O(n) time for n rows, O(N) memory (32 bytes per leaf).
///
/// # Errors
///
/// [`VerifyError::Signature`] when `checkpoint_note` is not signed by
/// `key` (the message names the keys that did sign it), is malformed or its
/// signature is bad; [`VerifyError::Checkpoint`] when its text is no
/// checkpoint; [`VerifyError::Witnessed`] and [`VerifyError::OtherOrigin`]
/// for a witnessed note that does not open with `key` or is of another
/// origin.
pub fn verify(
    export: &LogExport,
    checkpoint_note: &str,
    key: &Verifier,
    witnessed: &[String],
) -> Result<Report, VerifyError> {
    let checkpoint = open(checkpoint_note, key).map_err(|error| match error {
        CheckpointError::Note(error) => VerifyError::Signature(error),
        other => VerifyError::Checkpoint(other),
    })?;
    let mut witnesses = Vec::with_capacity(witnessed.len());
    for (index, note) in witnessed.iter().enumerate() {
        let number = index + 1;
        let witness =
            open(note, key).map_err(|source| VerifyError::Witnessed { number, source })?;
        if witness.origin != checkpoint.origin {
            return Err(VerifyError::OtherOrigin {
                number,
                origin: witness.origin,
                expected: checkpoint.origin.clone(),
            });
        }
        witnesses.push(witness);
    }

    let size = checkpoint.size;
    let mut report = Report {
        tree_size: size,
        origin: checkpoint.origin.clone(),
        leaves_checked: 0,
        newer_rows: 0,
        problems: Vec::new(),
    };
    // The sealed leaf hash of each leaf below the size, and whether a row
    // gave it.
    let too_large = || VerifyError::TooLarge { size };
    let slots = usize::try_from(size).map_err(|_| too_large())?;
    let mut hashes: Vec<Hash> = Vec::new();
    hashes.try_reserve_exact(slots).map_err(|_| too_large())?;
    hashes.resize(slots, [0u8; 32]);
    let mut state = vec![Slot::Empty; slots];
    let mut leaf_problems: Vec<(u64, Problem)> = Vec::new();
    let mut added = Vec::new();

    // Re-hash every sealed record below the size (the bulk of the work,
    // independent per row: on several threads for large exports).
    let rehashed = crate::parallel::map(&export.rows, |row| match (row.leaf_index, &row.entry) {
        (Some(index), Some(entry)) if index < size => {
            let same_record =
                entry.kind() == row.kind && entry.plan_id() == row.plan_id && entry.id() == row.id;
            if same_record && Some(entry.leaf_hash()) == row.leaf_hash {
                Rehash::Same
            } else {
                Rehash::Changed
            }
        }
        _ => Rehash::NotChecked,
    });

    for (row, rehash) in export.rows.iter().zip(rehashed) {
        let Some(index) = row.leaf_index else {
            added.push(Problem::Added {
                kind: row.kind.clone(),
                plan_id: row.plan_id.clone(),
                id: row.id,
                note: row.note.clone(),
            });
            continue;
        };
        if index >= size {
            report.newer_rows += 1;
            continue;
        }
        let slot = index as usize;
        if state[slot] != Slot::Empty {
            leaf_problems.push((
                index,
                Problem::Duplicate {
                    leaf_index: index,
                    kind: row.kind.clone(),
                    plan_id: row.plan_id.clone(),
                    id: row.id,
                },
            ));
            continue;
        }
        let Some(sealed) = row.leaf_hash else {
            state[slot] = Slot::Unhashed;
            leaf_problems.push((index, Problem::NoLeafHash { leaf_index: index }));
            continue;
        };
        state[slot] = Slot::Hashed;
        hashes[slot] = sealed;
        let problem = match rehash {
            Rehash::NotChecked => Some(Problem::Deleted {
                leaf_index: index,
                kind: row.kind.clone(),
                plan_id: row.plan_id.clone(),
                id: row.id,
            }),
            Rehash::Same => None,
            Rehash::Changed => Some(Problem::Changed {
                leaf_index: index,
                kind: row.kind.clone(),
                plan_id: row.plan_id.clone(),
                id: row.id,
            }),
        };
        if rehash != Rehash::NotChecked {
            report.leaves_checked += 1;
        }
        if let Some(problem) = problem {
            leaf_problems.push((index, problem));
        }
    }

    // Leaves below the size without a row.
    let mut first_gap = None;
    for (slot, slot_state) in state.iter().enumerate() {
        if *slot_state != Slot::Hashed {
            first_gap.get_or_insert(slot as u64);
        }
        if *slot_state == Slot::Empty {
            let leaf_index = slot as u64;
            leaf_problems.push((leaf_index, Problem::Missing { leaf_index }));
        }
    }
    leaf_problems.sort_by_key(|(index, _)| *index);
    report
        .problems
        .extend(leaf_problems.into_iter().map(|(_, problem)| problem));

    // The roots: the checkpoint's and every witnessed size's, in one pass
    // over the leaves present before the first missing one.
    let complete = first_gap.unwrap_or(size);
    let mut wanted: Vec<u64> = witnesses
        .iter()
        .map(|witness| witness.size)
        .filter(|&witnessed| witnessed <= complete)
        .collect();
    if complete == size {
        wanted.push(size);
    }
    wanted.sort_unstable();
    wanted.dedup();
    let last = wanted.last().copied().unwrap_or(0) as usize;
    let roots: BTreeMap<u64, Hash> = wanted
        .iter()
        .copied()
        .zip(Frontier::new().roots_at(&hashes[..last], &wanted))
        .collect();

    if let Some(computed) = roots.get(&size).filter(|_| complete == size)
        && *computed != checkpoint.root
    {
        report.problems.push(Problem::RootMismatch {
            signed: checkpoint.root,
            computed: *computed,
        });
    }
    report.problems.extend(added);
    for witness in &witnesses {
        if witness.size > size {
            report.problems.push(Problem::Truncated {
                witnessed_size: witness.size,
                export_size: size,
            });
        } else if let Some(root) = roots.get(&witness.size)
            && *root != witness.root
        {
            report.problems.push(Problem::Forked {
                witnessed_size: witness.size,
            });
        }
    }
    Ok(report)
}
