//! The audit log (docs/audit-log.md): every audit event and operator action
//! sealed, in one total order, as a leaf of an RFC 6962 Merkle tree, whose
//! roots the planner signs as C2SP tlog-checkpoints.
//!
//! # Who does what
//! - A writer (a report, the lease sweep, an operator action) only inserts
//!   its rows: migration 0035's statement triggers queue each one in
//!   `audit_log_pending`, in the writer's transaction, with an HMAC-SHA256
//!   (RFC 2104) of the row under the planner's audit key, which the
//!   planner's connections carry as `redrive.audit_mac`. Nothing is hashed
//!   into the tree on the reporting path.
//! - The sequencer ([`run`]), one task per planner, seals in rounds: a round
//!   locks the log's one state row (`FOR UPDATE SKIP LOCKED`: one round at
//!   a time across every replica), takes up to [`BATCH`] queued rows, checks
//!   each one's MAC against the row as stored now, appends the leaves and
//!   the interior nodes they complete, refuses the rest
//!   (`audit_log_refused`), and signs a checkpoint when due, all in one
//!   transaction. A planner killed at any line of a round leaves the log as
//!   it was before the round: no gap, no fork, nothing sealed twice (the
//!   leaf index and `(kind, ref_id, plan_id)` are unique).
//! - After a round, a new checkpoint is pushed to the witness (a directory,
//!   a URL) outside the database.

use std::{
    collections::HashSet,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use redrive_proto::{time::timestamp, v1};
use redrive_tlog::{
    Hash,
    checkpoint::open_checkpoint,
    checkpoint::{Checkpoint, sign_checkpoint},
    export::{self, LogRow},
    merkle::{self, Frontier, Subtree},
    note::{Signer, Verifier},
};
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tracing::{debug, error, info, warn};

use crate::{
    error::Error,
    ids::PlanId,
    store::{
        Store, StoreError,
        audit_log::{AuditSubject, CheckpointRow, KeyTaking, NewLeaf, Record},
    },
};

/// How long after the log took a key a planner waits before it moves the
/// log on from it (a second rotation; not a rollback to the key before):
/// the planners on the key before it stop within a sealing round
/// ([`SEAL_INTERVAL`]) and their open calls within `--shutdown-grace-seconds`
/// (10 s by default; a grace over 50 s needs a longer pause, by hand), and
/// meanwhile the planners holding it as `--audit-previous-key` seal the rows
/// they wrote. Moved on sooner, those rows would be refused as forged by
/// planners that hold neither key.
pub const ROTATION_SETTLE: Duration = Duration::from_secs(60);

/// Most queued rows one sealing round takes.
pub const BATCH: i64 = 10_000;

/// How often the sequencer looks for queued rows when the last round took
/// fewer than [`BATCH`].
pub const SEAL_INTERVAL: Duration = Duration::from_millis(250);

/// Why a planner without `--audit-signing-key` stops (and a sealing round
/// fails) once the log in its database is signed: it could not check the
/// MACs of the rows it would seal, and the rows it writes carry none, so a
/// keyed planner refuses to seal them for good.
pub const KEYLESS_ON_SIGNED_LOG: &str = "the audit log in this database is signed (a planner \
     with --audit-signing-key signed a checkpoint), and this planner has no \
     --audit-signing-key: it cannot check the rows' MACs, and the rows it writes would carry \
     none, so the log would refuse to seal them. Give every planner of this database the same \
     --audit-signing-key (docs/audit-log.md)";

/// How the reason a keyed planner stops (and a sealing round fails) begins
/// when the log's latest checkpoint is signed by a key it holds neither as
/// `--audit-signing-key` nor as `--audit-previous-key`: it would refuse the
/// rows written under that key as forged, and sign a fork of the signers.
/// Judged only while the log names no key ([`OTHER_KEY_TAKES_THE_LOG`]
/// decides once it does).
pub const FOREIGN_KEY_ON_SIGNED_LOG: &str =
    "the audit log in this database is signed by a key this planner does not hold";

/// The rest of a [`FOREIGN_KEY_ON_SIGNED_LOG`] reason: what goes wrong, and
/// how keys are rotated.
const NOT_HELD: &str = "neither as --audit-signing-key nor as --audit-previous-key: it would \
     refuse the rows written under that key as forged. Give every planner of this database the \
     same key; to rotate keys, restart each planner with --audit-signing-key NEW \
     --audit-previous-key OLD (a planner still on OLD stops once the first one on NEW has \
     started; docs/audit-log.md)";

/// How the reason a planner stops (and a sealing round fails) begins when a
/// planner with another key, or with one where it has none, started on the
/// database last and the log takes that key (migration 0039).
pub const OTHER_KEY_TAKES_THE_LOG: &str = "the audit log in this database takes the key";

/// Whether a sealing round's `FailedPrecondition` text stops the planner
/// ([`KEYLESS_ON_SIGNED_LOG`], [`FOREIGN_KEY_ON_SIGNED_LOG`],
/// [`OTHER_KEY_TAKES_THE_LOG`]).
pub fn stops_the_planner(why: &str) -> bool {
    why == KEYLESS_ON_SIGNED_LOG
        || why.starts_with(FOREIGN_KEY_ON_SIGNED_LOG)
        || why.starts_with(OTHER_KEY_TAKES_THE_LOG)
}

/// Levels of the tree whose complete subtrees are stored (multiples of 4):
/// any subtree's hash is then read from at most 8 stored hashes.
const STORED_LEVELS: u8 = 4;

/// Leaves one page of a log export reads.
const EXPORT_PAGE: i64 = 5000;

/// Most leaves one inclusion request proves.
pub const MAX_PROOFS: usize = 1000;

/// What the parsed flags give the log ([`crate::config::AuditLogSettings`]).
pub struct LogOptions {
    /// `--audit-origin`.
    pub origin: Option<String>,
    /// `--audit-signing-key`, read: the signer and the file's text.
    pub signing: Option<(Signer, String)>,
    /// `--audit-previous-key`'s text.
    pub previous_key_text: Option<String>,
    /// `--audit-checkpoint-every`.
    pub checkpoint_every: u64,
    /// `--audit-checkpoint-interval`.
    pub checkpoint_interval: Duration,
    /// `--audit-witness-dir`.
    pub witness_dir: Option<PathBuf>,
    /// `--audit-witness-url`, checked.
    pub witness_url: Option<hyper::Uri>,
    /// `--audit-log` is not `off`.
    pub enabled: bool,
}

/// The planner's audit log: its keys, its cadence and its witness. Cheap to
/// clone.
#[derive(Clone)]
pub struct AuditLog {
    inner: Arc<Inner>,
}

struct Inner {
    signer: Option<Signer>,
    origin: String,
    current_pads: Option<[u8; 128]>,
    previous_pads: Option<[u8; 128]>,
    /// The verifiers of `--audit-signing-key` and `--audit-previous-key`:
    /// the keys whose checkpoints this planner may extend.
    known_signers: Vec<Verifier>,
    /// [`key_id`] of `--audit-signing-key` and of `--audit-previous-key`.
    current_key_id: Option<String>,
    previous_key_id: Option<String>,
    checkpoint_every: u64,
    checkpoint_interval: Duration,
    witness_dir: Option<PathBuf>,
    witness_url: Option<hyper::Uri>,
    enabled: bool,
    /// One round at a time in this process (the state row's lock orders
    /// rounds across processes).
    sealing: Mutex<()>,
    /// The largest checkpoint pushed to every witness.
    pushed: AtomicU64,
    /// The size of the latest checkpoint found needing no cosignature
    /// ([`AuditLog::cosign_latest`]), `u64::MAX` before one was.
    cosign_checked: AtomicU64,
    /// After a failed push: how many failed in a row, and when to try
    /// again (2 s, doubling to a minute).
    push_retry: std::sync::Mutex<Option<(u32, std::time::Instant)>>,
}

impl Default for AuditLog {
    /// A log sealed without a key: nothing signed, no MAC checked.
    fn default() -> Self {
        Self::new(LogOptions {
            origin: None,
            signing: None,
            previous_key_text: None,
            checkpoint_every: 1000,
            checkpoint_interval: Duration::from_secs(10),
            witness_dir: None,
            witness_url: None,
            enabled: true,
        })
    }
}

/// The HMAC-SHA256 key's two padded blocks, `(K xor ipad) || (K xor opad)`
/// (RFC 2104, B = 64), for the MAC key derived from an audit key file's
/// text: K = SHA-256("redrive audit mac v1\n" || text). Migration 0035's
/// `redrive_hmac` takes them.
pub fn mac_pads(key_text: &str) -> [u8; 128] {
    let key = Sha256::new()
        .chain_update(b"redrive audit mac v1\n")
        .chain_update(key_text.trim().as_bytes())
        .finalize();
    let mut pads = [0u8; 128];
    for (index, pad) in pads.iter_mut().enumerate() {
        let byte = key.get(index % 64).copied().unwrap_or(0);
        *pad = byte ^ if index < 64 { 0x36 } else { 0x5c };
    }
    pads
}

/// What one sealing round did.
#[derive(Debug, Default)]
pub struct Round {
    /// Queued rows taken.
    pub taken: usize,
    /// Leaves appended.
    pub sealed: usize,
    /// Rows refused.
    pub refused: usize,
    /// The checkpoint signed, if one was due.
    pub checkpoint: Option<CheckpointRow>,
}

/// How the log names a key (migration 0039's `signing_key`): the C2SP
/// signed-note key name and key id, `name+hash` with the id as 8 hex digits
/// (<https://c2sp.org/signed-note>).
pub fn key_id(signer: &Signer) -> String {
    format!("{}+{:08x}", signer.name(), signer.key_id())
}

/// Why a planner whose `--audit-signing-key` is `mine` ([`key_id`], `None`
/// without one) does not seal a log that takes `key`: a planner with that
/// key started on the database last, and rows written under a key this
/// planner does not check would be refused as forged (or, without a key,
/// its own rows carry no MAC).
fn other_key(key: &str, mine: Option<&str>) -> String {
    let this = match mine {
        Some(mine) => format!("this planner's --audit-signing-key is {mine}"),
        None => "this planner has no --audit-signing-key".to_owned(),
    };
    format!(
        "{OTHER_KEY_TAKES_THE_LOG} {key} (a planner with it as --audit-signing-key started on the \
         database last), and {this}: only planners with the log's key seal it, and the rows a \
         planner writes under another key, or none, would be refused as forged. Give every \
         planner of this database the same key; to rotate keys, restart each planner with \
         --audit-signing-key NEW --audit-previous-key OLD (a planner still on OLD stops once the \
         first one on NEW has started; docs/audit-log.md)"
    )
}

impl AuditLog {
    /// The log as the flags set it.
    pub fn new(options: LogOptions) -> Self {
        let origin = options
            .origin
            .or_else(|| {
                options
                    .signing
                    .as_ref()
                    .map(|(signer, _)| signer.name().to_owned())
            })
            .unwrap_or_else(|| "redrive-audit".to_owned());
        let current_pads = options.signing.as_ref().map(|(_, text)| mac_pads(text));
        let previous_signer = options
            .previous_key_text
            .as_deref()
            .and_then(|text| Signer::from_key_text(text).ok());
        let known_signers = options
            .signing
            .iter()
            .map(|(signer, _)| signer.verifier())
            .chain(previous_signer.as_ref().map(Signer::verifier))
            .collect();
        let current_key_id = options.signing.as_ref().map(|(signer, _)| key_id(signer));
        let previous_key_id = previous_signer.as_ref().map(key_id);
        Self {
            inner: Arc::new(Inner {
                signer: options.signing.map(|(signer, _)| signer),
                origin,
                current_pads,
                previous_pads: options.previous_key_text.as_deref().map(mac_pads),
                known_signers,
                current_key_id,
                previous_key_id,
                checkpoint_every: options.checkpoint_every,
                checkpoint_interval: options.checkpoint_interval,
                witness_dir: options.witness_dir,
                witness_url: options.witness_url,
                enabled: options.enabled,
                sealing: Mutex::new(()),
                pushed: AtomicU64::new(0),
                cosign_checked: AtomicU64::new(u64::MAX),
                push_retry: std::sync::Mutex::new(None),
            }),
        }
    }

    /// The run-time parameters every planner connection sets at startup
    /// for migration 0035's triggers: the MAC key's pads (hex) when there is
    /// a signing key, `redrive.audit_log = off` when sealing is off.
    pub fn session_options(&self) -> Vec<(&'static str, String)> {
        let mut options = Vec::new();
        if let Some(pads) = &self.inner.current_pads {
            options.push(("redrive.audit_mac", hex::encode(pads)));
        }
        if !self.inner.enabled {
            options.push(("redrive.audit_log", "off".to_owned()));
        }
        options
    }

    /// Why this keyed planner must not seal a log whose latest checkpoint
    /// is `note`: it opens with none of its keys ([`FOREIGN_KEY_ON_SIGNED_LOG`],
    /// naming the note's signers); `None` when one opens it, or for a
    /// keyless planner ([`KEYLESS_ON_SIGNED_LOG`] is its own check).
    pub fn foreign_signer(&self, note: &str) -> Option<String> {
        if self.inner.signer.is_none()
            || self
                .inner
                .known_signers
                .iter()
                .any(|verifier| open_checkpoint(note, verifier).is_ok())
        {
            return None;
        }
        let signers: Vec<&str> = note
            .lines()
            .filter_map(|line| line.strip_prefix("\u{2014} "))
            .filter_map(|line| line.split(' ').next())
            .collect();
        Some(format!(
            "{FOREIGN_KEY_ON_SIGNED_LOG} (its latest checkpoint is signed by {}), {NOT_HELD}",
            if signers.is_empty() {
                "an unknown key".to_owned()
            } else {
                signers.join(", ")
            }
        ))
    }

    /// Why this planner must not seal a log whose current key (migration
    /// 0039) is `key`: it has none or another one
    /// ([`OTHER_KEY_TAKES_THE_LOG`]). `None` when `key` is its own or the
    /// log takes none yet.
    fn refusal_of(&self, key: Option<&str>) -> Option<String> {
        let key = key?;
        let mine = self.inner.current_key_id.as_deref();
        (mine != Some(key)).then(|| other_key(key, mine))
    }

    /// Whether `key` (the log's, migration 0039) is this planner's
    /// `--audit-signing-key` or `--audit-previous-key`.
    fn holds(&self, key: &str) -> bool {
        [&self.inner.current_key_id, &self.inner.previous_key_id]
            .into_iter()
            .any(|held| held.as_deref() == Some(key))
    }

    /// Takes the log for this planner's key before it serves (migration
    /// 0039, under the state row's lock): the log takes this key from now
    /// on when it took none, this one or `--audit-previous-key` (so a
    /// planner still running on the previous key seals nothing more and
    /// stops at its next round, before it could refuse a row written under
    /// this key). Nothing is taken with `--audit-log off`.
    ///
    /// # Errors
    /// `FailedPrecondition` when the log takes another key, or this
    /// planner has none and the log takes one; store errors.
    pub async fn take_key(&self, store: &Store) -> Result<(), Error> {
        if !self.inner.enabled {
            // Allowed (a deployment may turn its log off), but beside
            // planners that seal it, every row this one writes is a hole.
            if let Some(key) = store.audit_signing_key().await? {
                warn!(
                    log_key = %key,
                    "audit log: this planner runs with --audit-log off on a database whose log \
                     is sealed under a key: the rows it writes (its plans' events and actions, \
                     and the gates' promotions it runs for any plan) are never queued for \
                     sealing, and `redrivectl audit verify` will list them as not in the log; \
                     run every planner of the database with the same --audit-log"
                );
            }
            return Ok(());
        }
        // The latest checkpoint's signer decides only while the log names
        // no key of this planner: once it does, that is newer (a rotation
        // taken before the new key signed anything).
        let named = store.audit_signing_key().await?;
        if !named.as_deref().is_some_and(|key| self.holds(key))
            && let Some(latest) = store.audit_checkpoint(None).await?
            && let Some(why) = self.foreign_signer(&latest.note)
        {
            return Err(Error::FailedPrecondition(why));
        }
        loop {
            let taking = store
                .take_audit_signing_key(
                    self.inner.current_key_id.as_deref(),
                    self.inner.previous_key_id.as_deref(),
                    ROTATION_SETTLE,
                )
                .await?;
            let other = match taking {
                KeyTaking::Taken => return Ok(()),
                KeyTaking::Other(key) => key,
                KeyTaking::Settling(left) => {
                    info!(
                        seconds_left = left.as_secs(),
                        "audit log: the log took this planner's --audit-previous-key less than \
                         a minute ago; waiting until the planners on the key before it have \
                         stopped and their rows are sealed, then taking it for \
                         --audit-signing-key (docs/audit-log.md, \"Rotating the key\")"
                    );
                    tokio::time::sleep(left.min(Duration::from_secs(5))).await;
                    continue;
                }
            };
            return match self.refusal_of(Some(&other)) {
                Some(why) => Err(Error::FailedPrecondition(why)),
                None => Ok(()),
            };
        }
    }

    /// Whether rounds run (`--audit-log` is not `off`).
    pub fn enabled(&self) -> bool {
        self.inner.enabled
    }

    /// The checkpoints' origin line.
    pub fn origin(&self) -> &str {
        &self.inner.origin
    }

    /// One sealing round (see the module's documentation). A round that
    /// finds another planner's round holding the log does nothing.
    ///
    /// # Errors
    /// Store errors (the round is rolled back whole).
    pub async fn seal_round(&self, store: &Store) -> Result<Round, Error> {
        let _one = self.inner.sealing.lock().await;
        let Some(mut sealing) = store.begin_sealing().await? else {
            // Another planner's round holds the log: the key it takes is
            // read all the same, so that a planner left on an old key
            // stops even while others seal a long backlog.
            if let Some(why) = self.refusal_of(store.audit_signing_key().await?.as_deref()) {
                return Err(Error::FailedPrecondition(why));
            }
            return Ok(Round::default());
        };
        // Once a keyed planner has signed the log, rows are sealed only
        // by a planner that can check their MACs: a planner started
        // without the key (a replica left behind, or one started against
        // the database to launder rows written with psql) seals nothing.
        if self.inner.current_pads.is_none() && sealing.latest_checkpoint().await?.is_some() {
            sealing.rollback().await?;
            return Err(Error::FailedPrecondition(KEYLESS_ON_SIGNED_LOG.to_owned()));
        }
        // Another planner started with another key (a rotation this one
        // is not part of): its rows would be refused here as forged.
        if let Some(why) = self.refusal_of(sealing.state.signing_key.as_deref()) {
            sealing.rollback().await?;
            return Err(Error::FailedPrecondition(why));
        }
        // A log that names no key yet (a database from before migration
        // 0039) is judged by its latest checkpoint's signer.
        if sealing.state.signing_key.is_none()
            && let Some(note) = sealing.latest_checkpoint_note().await?
            && let Some(why) = self.foreign_signer(&note)
        {
            sealing.rollback().await?;
            return Err(Error::FailedPrecondition(why));
        }
        let pending = sealing
            .take_pending(
                BATCH,
                self.inner.current_pads.as_ref().map(<[u8; 128]>::as_slice),
                self.inner.previous_pads.as_ref().map(<[u8; 128]>::as_slice),
            )
            .await?;
        let mut frontier =
            Frontier::from_parts(sealing.state.tree_size, sealing.state.frontier.clone())
                .map_err(|error| Error::Defect(format!("the log's stored frontier: {error}")))?;
        let keyed = self.inner.current_pads.is_some();
        let mut seen = HashSet::new();
        let mut leaves = Vec::new();
        let mut nodes = Vec::new();
        let mut refused = Vec::new();
        for row in &pending {
            let record = &row.record;
            let key = (record.kind.clone(), record.ref_id, record.plan_id);
            if row.sealed || !seen.insert(key) {
                continue;
            }
            let entry = record.entry();
            let refusal = match &entry {
                None => Some("the row was gone before it was sealed"),
                Some(_) if row.history || !keyed => None,
                Some(_) if !row.has_mac => {
                    Some("no MAC: it was not written by a planner holding the audit key")
                }
                Some(_) if row.mac_ok != Some(true) => Some(
                    "its MAC does not match: the row was changed before it was sealed, or written under another key",
                ),
                Some(_) => None,
            };
            if let Some(reason) = refusal {
                warn!(kind = %record.kind, plan_id = %record.plan_id, id = record.ref_id, reason,
                      "audit log: refused to seal a row");
                refused.push((
                    record.kind.clone(),
                    record.plan_id,
                    record.ref_id,
                    reason.to_owned(),
                ));
                continue;
            }
            let Some(entry) = entry else {
                continue;
            };
            let leaf_hash = entry.leaf_hash();
            let leaf_index = frontier.size();
            for (subtree, hash) in frontier.append(leaf_hash) {
                if subtree.level % STORED_LEVELS == 0 {
                    nodes.push((subtree.level, subtree.index, hash));
                }
            }
            leaves.push(NewLeaf {
                leaf_index,
                kind: record.kind.clone(),
                plan_id: record.plan_id,
                ref_id: record.ref_id,
                leaf_hash,
            });
        }
        let root = frontier.root();
        if !pending.is_empty() {
            sealing
                .append(&leaves, &nodes, &refused, frontier.hashes(), &root)
                .await?;
        }
        let checkpoint = match &self.inner.signer {
            Some(signer) => self.checkpoint_if_due(&mut sealing, signer, &root).await?,
            None => None,
        };
        sealing.commit().await?;
        // A cosigned checkpoint (of the size last pushed) is pushed again,
        // with both signatures, once committed.
        if let Some(row) = &checkpoint {
            let size = u64::try_from(row.tree_size).unwrap_or_default();
            if size <= self.inner.pushed.load(Ordering::Relaxed) {
                self.inner
                    .pushed
                    .store(size.saturating_sub(1), Ordering::Relaxed);
            }
        }
        Ok(Round {
            taken: pending.len(),
            sealed: leaves.len(),
            refused: refused.len(),
            checkpoint,
        })
    }

    /// Signs and stores a checkpoint of the tree the round holds when
    /// [`LogOptions::checkpoint_every`] leaves were sealed since the last
    /// one, or the log grew and [`LogOptions::checkpoint_interval`] passed.
    async fn checkpoint_if_due(
        &self,
        sealing: &mut crate::store::audit_log::Sealing,
        signer: &Signer,
        root: &Hash,
    ) -> Result<Option<CheckpointRow>, Error> {
        let size = sealing.state.tree_size;
        let now = sealing.now().await?;
        let latest = sealing.latest_checkpoint().await?;
        let due = match latest {
            None => size > 0,
            Some((last, at)) => {
                size > last
                    && (size - last >= self.inner.checkpoint_every
                        || (now - at).to_std().unwrap_or_default()
                            >= self.inner.checkpoint_interval)
            }
        };
        if !due {
            return match latest {
                Some((last, _)) if last == size => self.cosign_latest(sealing, signer, root).await,
                _ => Ok(None),
            };
        }
        let checkpoint = Checkpoint {
            origin: self.inner.origin.clone(),
            size,
            root: *root,
            extensions: vec![format!(
                "time {}",
                now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            )],
        };
        let note = sign_checkpoint(signer, &checkpoint)
            .map_err(|error| Error::Defect(format!("signing a checkpoint: {error}")))?;
        let row = sealing.record_checkpoint(root, &note, now).await?;
        debug!(tree_size = size, "audit log: checkpoint signed");
        Ok(Some(row))
    }

    /// After a rotation, on a log that has not grown since the previous
    /// key's latest checkpoint: adds this planner's signature to that
    /// checkpoint (a second signature line, C2SP signed-note), so that the
    /// new verifier key opens the log's latest checkpoint at once, and a
    /// witness is sent it again. Only a checkpoint signed by
    /// `--audit-previous-key` whose root is the tree the round holds is
    /// cosigned: this key never vouches for a root it did not find.
    async fn cosign_latest(
        &self,
        sealing: &mut crate::store::audit_log::Sealing,
        signer: &Signer,
        root: &Hash,
    ) -> Result<Option<CheckpointRow>, Error> {
        let size = sealing.state.tree_size;
        let Some(previous) = self.inner.known_signers.get(1) else {
            return Ok(None);
        };
        if self.inner.cosign_checked.load(Ordering::Relaxed) == size {
            return Ok(None);
        }
        let checked = || self.inner.cosign_checked.store(size, Ordering::Relaxed);
        let Some(note) = sealing.latest_checkpoint_note().await? else {
            return Ok(None);
        };
        let Ok(checkpoint) = open_checkpoint(&note, previous) else {
            // Signed by this key, or by one this planner does not hold.
            checked();
            return Ok(None);
        };
        if open_checkpoint(&note, &signer.verifier()).is_ok() {
            checked();
            return Ok(None);
        }
        if checkpoint.size != size || checkpoint.root != *root {
            warn!(
                tree_size = size,
                checkpoint_size = checkpoint.size,
                "audit log: the latest checkpoint's root is not the log's: not cosigned"
            );
            checked();
            return Ok(None);
        }
        let cosigned = signer
            .cosign(&note, previous)
            .map_err(|error| Error::Defect(format!("cosigning a checkpoint: {error}")))?;
        let row = sealing.cosign_checkpoint(size, &note, &cosigned).await?;
        if row.is_some() {
            info!(
                tree_size = size,
                "audit log: the previous key's latest checkpoint cosigned by the new key"
            );
        }
        Ok(row)
    }

    /// Pushes the latest checkpoint to the witness directory and URL when
    /// it is newer than the last one pushed.
    async fn push_latest(&self, store: &Store, client: &crate::webhooks::http::Client) {
        if self.inner.witness_dir.is_none() && self.inner.witness_url.is_none() {
            return;
        }
        let latest = match store.audit_checkpoint(None).await {
            Ok(Some(latest)) => latest,
            Ok(None) => return,
            Err(error) => {
                debug!(%error, "audit log: reading the latest checkpoint to push");
                return;
            }
        };
        let size = u64::try_from(latest.tree_size).unwrap_or_default();
        if size <= self.inner.pushed.load(Ordering::Relaxed) {
            return;
        }
        let waiting = self
            .inner
            .push_retry
            .lock()
            .ok()
            .and_then(|retry| *retry)
            .is_some_and(|(_, next)| std::time::Instant::now() < next);
        if waiting {
            return;
        }
        let mut pushed = true;
        if let Some(dir) = &self.inner.witness_dir {
            match write_witness(dir, &latest.note, size) {
                Ok(()) => {}
                Err(problem) => {
                    error!(dir = %dir.display(), tree_size = size, "audit log: witness directory: {problem}");
                    pushed = false;
                }
            }
        }
        if let Some(url) = &self.inner.witness_url {
            let answer = tokio::time::timeout(
                Duration::from_secs(10),
                client.post(url, "text/plain; charset=utf-8", &[], latest.note.clone()),
            )
            .await;
            match answer {
                Ok(Ok(status)) if status.is_success() => {}
                Ok(Ok(status)) => {
                    warn!(%url, %status, "audit log: the witness URL refused the checkpoint");
                    pushed = false;
                }
                Ok(Err(problem)) => {
                    warn!(%url, problem, "audit log: pushing the checkpoint");
                    pushed = false;
                }
                Err(_) => {
                    warn!(%url, "audit log: pushing the checkpoint took over 10 s");
                    pushed = false;
                }
            }
        }
        if let Ok(mut retry) = self.inner.push_retry.lock() {
            *retry = if pushed {
                None
            } else {
                let failures = retry.map_or(0, |(failures, _)| failures).saturating_add(1);
                let delay =
                    Duration::from_secs(1u64 << failures.min(6)).min(Duration::from_secs(60));
                Some((failures, std::time::Instant::now() + delay))
            };
        }
        if pushed {
            self.inner.pushed.store(size, Ordering::Relaxed);
        }
    }
}

/// Writes `note` as `dir/checkpoint` (through a temporary file and a
/// rename), unless the checkpoint there is of a larger tree: a witness never
/// goes back.
fn write_witness(dir: &std::path::Path, note: &str, size: u64) -> Result<(), String> {
    let path = dir.join("checkpoint");
    if let Ok(held) = std::fs::read_to_string(&path) {
        let held_size = held
            .lines()
            .nth(1)
            .and_then(|line| line.parse::<u64>().ok())
            .unwrap_or_default();
        if held_size > size {
            return Err(format!(
                "it holds a checkpoint of {held_size} leaves and the database's latest has {size}: \
                 the log in the database was cut short, or another log writes there"
            ));
        }
    }
    std::fs::create_dir_all(dir).map_err(|error| error.to_string())?;
    let temporary = dir.join(".checkpoint.tmp");
    std::fs::write(&temporary, note).map_err(|error| error.to_string())?;
    std::fs::rename(&temporary, &path).map_err(|error| error.to_string())
}

/// The sequencer: a sealing round every [`SEAL_INTERVAL`] (at once again
/// after a full one), a push of each new checkpoint, and a last round at
/// shutdown.
///
/// A planner without the key on a log that became signed while it ran
/// ([`KEYLESS_ON_SIGNED_LOG`]) stops: `fatal` gets why, and `shutdown` is
/// cancelled, so that the planner exits non-zero and its writes stop
/// within one round (a restart is refused at start for the same reason).
pub(crate) async fn run(
    store: Store,
    log: AuditLog,
    shutdown: CancellationToken,
    fatal: Arc<std::sync::OnceLock<String>>,
) {
    if !log.enabled() {
        info!("audit log: sealing is off (--audit-log off)");
        return;
    }
    if log.inner.signer.is_none() {
        warn!(
            "audit log: no --audit-signing-key: the log is sealed but no checkpoint is signed, \
             and rows written outside the planner are sealed as if it wrote them"
        );
    }
    let client = crate::webhooks::http::Client::new();
    loop {
        let full = match log.seal_round(&store).await {
            Ok(round) => {
                if round.sealed > 0 || round.refused > 0 {
                    debug!(
                        sealed = round.sealed,
                        refused = round.refused,
                        "audit log: round"
                    );
                }
                usize::try_from(BATCH).is_ok_and(|batch| round.taken >= batch)
            }
            Err(Error::FailedPrecondition(why)) if stops_the_planner(&why) => {
                error!("audit log: {why}; the planner stops");
                let _ = fatal.set(why);
                shutdown.cancel();
                return;
            }
            Err(error) => {
                debug!(%error, "audit log: a sealing round failed; the next one retries");
                false
            }
        };
        log.push_latest(&store, &client).await;
        if full {
            continue;
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(SEAL_INTERVAL) => {}
        }
    }
    // What was written before shutdown is sealed now, not at the next start.
    if let Err(error) = log.seal_round(&store).await {
        debug!(%error, "audit log: the last round at shutdown failed");
    }
    log.push_latest(&store, &client).await;
}

/// The hash of a perfect subtree, from at most 8 stored hashes of the
/// nearest stored level at or below it.
async fn subtree_hash(store: &Store, subtree: Subtree) -> Result<Hash, Error> {
    let stored = subtree.level - subtree.level % STORED_LEVELS;
    let shift = subtree.level - stored;
    let start = subtree.index << shift;
    let span = 1u64 << shift;
    let hashes = store.audit_log_hashes(stored, start, start + span).await?;
    if hashes.len() as u64 != span {
        return Err(Error::Defect(format!(
            "the log's stored hashes at level {stored} from {start} are incomplete ({} of {span})",
            hashes.len()
        )));
    }
    Ok(merkle::root(&hashes))
}

/// The hash of the tree node covering `range` (RFC 6962 MTH(D[range])).
async fn range_hash(store: &Store, range: std::ops::Range<u64>) -> Result<Hash, Error> {
    let mut hashes = Vec::new();
    for subtree in merkle::perfect_subtrees(range) {
        hashes.push(subtree_hash(store, subtree).await?);
    }
    Ok(merkle::fold_subtrees(&hashes))
}

/// A checkpoint as the API shows it.
fn checkpoint_message(row: &CheckpointRow) -> v1::AuditCheckpoint {
    v1::AuditCheckpoint {
        note: row.note.clone(),
        tree_size: u64::try_from(row.tree_size).unwrap_or_default(),
        root_hash: row.root_hash.clone(),
        signed_at: Some(timestamp(row.signed_at)),
    }
}

/// The signed checkpoint of `tree_size` (0: the latest).
///
/// # Errors
/// `NotFound` when there is none; store errors.
pub async fn checkpoint(store: &Store, tree_size: u64) -> Result<v1::AuditCheckpoint, Error> {
    let row = store
        .audit_checkpoint((tree_size > 0).then_some(tree_size))
        .await?;
    match row {
        Some(row) => Ok(checkpoint_message(&row)),
        None if tree_size == 0 => Err(Error::NotFound(
            "no audit checkpoint is signed yet: the planner signs them with --audit-signing-key, \
             every --audit-checkpoint-every leaves or --audit-checkpoint-interval"
                .into(),
        )),
        None => Err(Error::NotFound(format!(
            "no audit checkpoint of tree size {tree_size}: checkpoints are signed at the sizes \
             `redrivectl audit checkpoint` shows"
        ))),
    }
}

async fn checkpoint_row(store: &Store, tree_size: u64) -> Result<CheckpointRow, Error> {
    let message = checkpoint(store, tree_size).await?;
    let size = message.tree_size;
    store
        .audit_checkpoint(Some(size))
        .await?
        .ok_or_else(|| Error::NotFound(format!("no audit checkpoint of tree size {size}")))
}

/// The entry of a leaf, as canonical JSON text, and the proof of it.
async fn inclusion_of(
    store: &Store,
    leaf_index: u64,
    record: &Record,
    tree_size: u64,
) -> Result<v1::AuditInclusionProof, Error> {
    let mut hashes = Vec::new();
    for range in merkle::inclusion_path(leaf_index, tree_size) {
        hashes.push(range_hash(store, range).await?.to_vec());
    }
    let leaf = record
        .entry()
        .map(|entry| String::from_utf8_lossy(&entry.canonical_bytes()).into_owned())
        .unwrap_or_default();
    Ok(v1::AuditInclusionProof {
        leaf_index,
        tree_size,
        leaf,
        hashes,
        kind: record.kind.clone(),
        plan_id: record.plan_id.to_string(),
        id: record.ref_id,
    })
}

/// Why a proof of plan `plan_id` (and its events of `dead_letter_id`)
/// has nothing to prove in the checkpoint of `size` leaves, in words; `None`
/// when only the plan's own actions are not sealed yet (said by the
/// caller). An auditor who asks what a plan did to a dead letter must never
/// read the plan's other leaves as the answer.
fn nothing_to_prove(
    plan_id: PlanId,
    dead_letter_id: Option<i64>,
    subject: &AuditSubject,
    size: u64,
) -> Option<String> {
    let Some(plan_state) = &subject.plan_state else {
        return Some(format!("no plan {plan_id}"));
    };
    let ended = ["completed", "cancelled", "aborted"].contains(&plan_state.as_str());
    let dead_letter = dead_letter_id?;
    if !subject.dead_letter_exists && subject.events == 0 {
        return Some(format!(
            "no dead letter {dead_letter}: nothing of it to prove in plan {plan_id}"
        ));
    }
    Some(match (&subject.item_state, subject.events) {
        (None, 0) => format!(
            "dead letter {dead_letter} is not an item of plan {plan_id}: the plan never touched \
             it, so the log holds no event of it to prove"
        ),
        (Some(state), 0) if state == "pending" && ended => format!(
            "plan {plan_id} ended ({plan_state}) before dead letter {dead_letter} was attempted: \
             it was never published by this plan, so the log holds no event of it to prove"
        ),
        (Some(state), 0) if state == "pending" => format!(
            "plan {plan_id} has no event of dead letter {dead_letter} yet: it is an item of the \
             plan, still pending (no executor has reported it)"
        ),
        (Some(state), 0) => format!(
            "plan {plan_id} holds dead letter {dead_letter} as {state}, yet no event of it is \
             stored: its record may be gone (`redrivectl audit export` then `audit verify` \
             name every sealed record that is missing)"
        ),
        // Rows the log refused are never sealed: never "wait for a newer
        // checkpoint" (a new user's pass: a row written with psql).
        (_, events) if subject.refused_events > 0 => format!(
            "plan {plan_id}'s {events} event(s) of dead letter {dead_letter}: {} refused by the \
             log, never to be sealed ({}): they are not the planner's record \
             (`redrivectl audit export` then `audit verify` name them)",
            subject.refused_events,
            subject.refusal.as_deref().unwrap_or("refused"),
        ),
        // Had any been sealed below `size`, the leaves read would hold them.
        (_, events) if subject.coming_events > 0 => format!(
            "plan {plan_id}'s {events} event(s) of dead letter {dead_letter} are not sealed into \
             the checkpoint of {size} leaves yet: a newer checkpoint will hold them \
             (`redrivectl audit checkpoint` shows the latest)"
        ),
        // Neither sealed, queued nor refused: written by a planner whose
        // sealing was off, or by a session that disabled the triggers
        // (`session_replication_role = replica`).
        (_, events) => format!(
            "plan {plan_id}'s {events} event(s) of dead letter {dead_letter} were never queued \
             for sealing (written by a planner with --audit-log off, or with the log's triggers \
             disabled): the log holds no leaf of them, and no checkpoint ever will"
        ),
    })
}

/// Inclusion proofs against a signed checkpoint (`tree_size`, 0: the
/// latest): of leaf `leaf_index` when given, else of plan `plan_id`'s
/// operator actions and of its events for dead letter `dead_letter_id`.
///
/// # Errors
/// `InvalidArgument` for neither a leaf nor a plan, or a leaf beyond the
/// checkpoint; `NotFound` for no checkpoint or nothing sealed to prove;
/// `ResourceExhausted`-free: at most [`MAX_PROOFS`] leaves are proven.
pub async fn prove_inclusion(
    store: &Store,
    request: &v1::ProveAuditInclusionRequest,
) -> Result<v1::ProveAuditInclusionResponse, Error> {
    let checkpoint = checkpoint_row(store, request.tree_size).await?;
    let size = u64::try_from(checkpoint.tree_size).unwrap_or_default();
    let mut unproven = Vec::new();
    let leaves =
        if let Some(leaf_index) = request.leaf_index {
            if leaf_index >= size {
                return Err(Error::invalid(
                    "leaf_index",
                    format!("{leaf_index} is not below the checkpoint's tree size {size}"),
                ));
            }
            store
                .audit_log_leaf(leaf_index)
                .await?
                .into_iter()
                .collect()
        } else if !request.plan_id.is_empty() {
            let plan_id = PlanId::parse("plan_id", &request.plan_id)?;
            let dead_letter_id =
                if request.dead_letter_id.is_empty() {
                    None
                } else {
                    Some(request.dead_letter_id.parse::<i64>().map_err(|_| {
                        Error::invalid("dead_letter_id", "a dead letter id (digits)")
                    })?)
                };
            let leaves = store
                .audit_log_leaves_of(plan_id, dead_letter_id, size)
                .await?;
            let events_found = leaves
                .iter()
                .filter(|(_, _, record)| record.kind == "event")
                .count() as u64;
            if leaves.is_empty() || (dead_letter_id.is_some() && events_found == 0) {
                let subject = store.audit_subject(plan_id, dead_letter_id, size).await?;
                if let Some(why) = nothing_to_prove(plan_id, dead_letter_id, &subject, size) {
                    return Err(Error::NotFound(why));
                }
            } else if let Some(dead_letter) = dead_letter_id {
                let subject = store
                    .audit_subject(plan_id, Some(dead_letter), size)
                    .await?;
                unproven = unproven_events(dead_letter, &subject, events_found, size);
            }
            // The plan's operator actions with no proof here (a row
            // written with psql, refused): never covered by the others.
            let actions_found = leaves
                .iter()
                .filter(|(_, _, record)| record.kind == "action")
                .count() as u64;
            let (actions, coming, refused, refusal) = store.audit_actions_of(plan_id, size).await?;
            if refused > 0 {
                unproven.push(format!(
                    "{refused} operator action(s) of plan {plan_id} refused by the log, never to \
                     be sealed ({}): they are not the planner's record (`redrivectl audit \
                     export` then `audit verify` name them)",
                    refusal.as_deref().unwrap_or("refused")
                ));
            }
            if coming > 0 {
                unproven.push(format!(
                    "{coming} operator action(s) of plan {plan_id} not sealed into the checkpoint \
                     of {size} leaves yet: a newer checkpoint will hold them"
                ));
            }
            let never = actions.saturating_sub(actions_found + refused + coming);
            if never > 0 {
                unproven.push(format!(
                    "{never} operator action(s) of plan {plan_id} never queued for sealing: no \
                     checkpoint will hold them"
                ));
            }
            leaves
        } else {
            return Err(Error::invalid(
                "plan_id",
                "a plan id, or a leaf_index, to prove",
            ));
        };
    if leaves.is_empty() {
        return Err(Error::NotFound(format!(
            "nothing to prove in the checkpoint of {size} leaves: the events asked for are not \
             sealed into it (a newer checkpoint may hold them)"
        )));
    }
    let mut proofs = Vec::new();
    for (leaf_index, _, record) in leaves.iter().take(MAX_PROOFS) {
        proofs.push(inclusion_of(store, *leaf_index, record, size).await?);
    }
    Ok(v1::ProveAuditInclusionResponse {
        checkpoint: Some(checkpoint_message(&checkpoint)),
        proofs,
        unproven,
    })
}

/// The plan's events of `dead_letter` that `proven` leaves of the
/// checkpoint of `size` leaves do not cover, one line per kind
/// ([`v1::ProveAuditInclusionResponse::unproven`]): refused by the log,
/// to be sealed into a newer checkpoint, or never queued. Empty when
/// every event is proven.
fn unproven_events(
    dead_letter: i64,
    subject: &AuditSubject,
    proven: u64,
    size: u64,
) -> Vec<String> {
    let mut lines = Vec::new();
    if subject.refused_events > 0 {
        lines.push(format!(
            "{} event(s) of dead letter {dead_letter} refused by the log, never to be sealed \
             ({}): they are not the planner's record (`redrivectl audit export` then `audit \
             verify` name them)",
            subject.refused_events,
            subject.refusal.as_deref().unwrap_or("refused"),
        ));
    }
    if subject.coming_events > 0 {
        lines.push(format!(
            "{} event(s) of dead letter {dead_letter} not sealed into the checkpoint of {size} \
             leaves yet: a newer checkpoint will hold them",
            subject.coming_events
        ));
    }
    let never = subject
        .events
        .saturating_sub(proven + subject.refused_events + subject.coming_events);
    if never > 0 {
        lines.push(format!(
            "{never} event(s) of dead letter {dead_letter} never queued for sealing (written by \
             a planner with --audit-log off, or with the log's triggers disabled): no \
             checkpoint will hold them"
        ));
    }
    lines
}

/// A consistency proof from the tree of `old_size` leaves to the signed
/// checkpoint of `new_size` (0: the latest), with both checkpoints when
/// stored.
///
/// # Errors
/// `InvalidArgument` for an old size above the new; `NotFound` for no such
/// checkpoint; store errors.
pub async fn prove_consistency(
    store: &Store,
    request: &v1::ProveAuditConsistencyRequest,
) -> Result<v1::AuditConsistencyProof, Error> {
    let new = checkpoint_row(store, request.new_size).await?;
    let new_size = u64::try_from(new.tree_size).unwrap_or_default();
    if request.old_size > new_size {
        return Err(Error::invalid(
            "old_size",
            format!(
                "{} is above the new checkpoint's tree size {new_size}",
                request.old_size
            ),
        ));
    }
    let mut hashes = Vec::new();
    for range in merkle::consistency_path(request.old_size, new_size) {
        hashes.push(range_hash(store, range).await?.to_vec());
    }
    let old = store.audit_checkpoint(Some(request.old_size)).await?;
    Ok(v1::AuditConsistencyProof {
        old: old.as_ref().map(checkpoint_message),
        new: Some(checkpoint_message(&new)),
        old_size: request.old_size,
        new_size,
        hashes,
    })
}

/// A log export row for a leaf and its record as stored now.
fn sealed_row(leaf_index: u64, leaf_hash: Hash, record: &Record) -> LogRow {
    LogRow {
        leaf_index: Some(leaf_index),
        kind: record.kind.clone(),
        plan_id: record.plan_id.to_string(),
        id: record.ref_id,
        entry: record.entry(),
        leaf_hash: Some(leaf_hash),
        note: String::new(),
    }
}

/// The whole log up to a signed checkpoint (`tree_size`, 0: the latest),
/// leaf by leaf with each record as stored now, then every event and
/// action in the database the log does not hold: JSON Lines (the signed
/// checkpoint first) or CSV (the checkpoint in the first chunk's
/// `checkpoint`), streamed.
///
/// # Errors
/// `InvalidArgument` for an unspecified format; `NotFound` for no
/// checkpoint.
pub async fn export(
    store: &Store,
    log: &AuditLog,
    format: v1::ExportFormat,
    tree_size: u64,
) -> Result<BoxStream<'static, Result<v1::ExportAuditChunk, Status>>, Error> {
    if format == v1::ExportFormat::Unspecified {
        return Err(Error::invalid(
            "format",
            "EXPORT_FORMAT_JSONL or EXPORT_FORMAT_CSV",
        ));
    }
    // What is queued is sealed first, so that the export does not list the
    // newest events as not in the log.
    if tree_size == 0 && log.enabled() {
        match log.seal_round(store).await {
            // A keyless planner on a signed log seals nothing (and stops):
            // the export is of the latest signed checkpoint.
            Err(Error::FailedPrecondition(why)) if stops_the_planner(&why) => {}
            other => {
                other?;
            }
        }
    }
    let checkpoint = checkpoint_row(store, tree_size).await?;
    let size = u64::try_from(checkpoint.tree_size).unwrap_or_default();
    let store = store.clone();
    let stream = crate::task_stream::spawn_stream(
        4,
        move |sender| async move {
            let csv = format == v1::ExportFormat::Csv;
            let mut first = Some(checkpoint.note.clone());
            let send = async |data: Vec<u8>, first: &mut Option<String>| {
                for piece in data.chunks(super::CHUNK_BYTES) {
                    let chunk = v1::ExportAuditChunk {
                        data: piece.to_vec(),
                        checkpoint: first.take().unwrap_or_default(),
                    };
                    if sender.send(Ok(chunk)).await.is_err() {
                        return false;
                    }
                }
                true
            };
            let head = if csv {
                export::csv_header()
            } else {
                export::jsonl_checkpoint_line(&checkpoint.note)
            };
            if !send(head, &mut first).await {
                return;
            }
            let write = |rows: &[LogRow]| {
                if csv {
                    export::csv_rows(rows)
                } else {
                    export::jsonl_rows(rows)
                }
            };
            let mut after = 0;
            while after < size {
                let Some(page) = crate::task_stream::or_send_error(
                    store.audit_log_page(after, size, EXPORT_PAGE).await,
                    &sender,
                )
                .await
                else {
                    return;
                };
                let Some((last, ..)) = page.last() else {
                    break;
                };
                after = last + 1;
                let rows: Vec<LogRow> = page
                    .iter()
                    .map(|(index, hash, record)| sealed_row(*index, *hash, record))
                    .collect();
                if !send(write(&rows), &mut first).await {
                    return;
                }
            }
            let Some(unsealed) =
                crate::task_stream::or_send_error(store.audit_log_unsealed().await, &sender).await
            else {
                return;
            };
            let rows: Vec<LogRow> = unsealed
                .iter()
                .map(|(record, refused)| LogRow {
                    leaf_index: None,
                    kind: record.kind.clone(),
                    plan_id: record.plan_id.to_string(),
                    id: record.ref_id,
                    entry: record.entry(),
                    leaf_hash: None,
                    note: refused
                        .as_ref()
                        .map(|reason| format!("the planner refused to seal it: {reason}"))
                        .unwrap_or_else(|| "not in the log".to_owned()),
                })
                .collect();
            if !rows.is_empty() {
                let _ = send(write(&rows), &mut first).await;
            }
        },
        super::export_interrupted,
    );
    Ok(stream)
}

/// When the latest checkpoint was signed, if one was (for status views).
///
/// # Errors
/// Store errors.
pub async fn latest_signed_at(store: &Store) -> Result<Option<DateTime<Utc>>, StoreError> {
    Ok(store.audit_checkpoint(None).await?.map(|row| row.signed_at))
}

impl std::fmt::Debug for AuditLog {
    /// The settings, never a key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("origin", &self.inner.origin)
            .field("signed", &self.inner.signer.is_some())
            .field("enabled", &self.inner.enabled)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hmac::{Hmac, Mac};

    #[test]
    fn the_pads_make_rfc_2104_hmac_sha256() {
        let text = "PRIVATE+KEY+example+00000000+AQ";
        let pads = mac_pads(text);
        let message = b"[\"event\",\"0190\",17]";
        let inner = Sha256::new()
            .chain_update(&pads[..64])
            .chain_update(message)
            .finalize();
        let ours = Sha256::new()
            .chain_update(&pads[64..])
            .chain_update(inner)
            .finalize();
        let key = Sha256::new()
            .chain_update(b"redrive audit mac v1\n")
            .chain_update(text.as_bytes())
            .finalize();
        let mut reference = Hmac::<Sha256>::new_from_slice(&key).unwrap();
        reference.update(message);
        assert_eq!(ours[..], reference.finalize().into_bytes()[..]);
    }

    #[test]
    fn a_proof_with_nothing_to_prove_says_why() {
        let plan = PlanId::parse("plan_id", "0190d2a4-8f1e-7c3a-9b5d-2e4f6a8c0b1d").unwrap();
        let subject =
            |plan_exists: bool, dead_letter_exists, state: Option<&str>, events, coming| {
                AuditSubject {
                    plan_state: plan_exists.then(|| "main".to_owned()),
                    dead_letter_exists,
                    item_state: state.map(str::to_owned),
                    events,
                    coming_events: coming,
                    refused_events: 0,
                    refusal: None,
                }
            };
        let why = |dead_letter, subject: AuditSubject| {
            nothing_to_prove(plan, dead_letter, &subject, 40).unwrap_or_default()
        };
        assert_eq!(
            why(Some(7), subject(false, true, None, 0, 0)),
            format!("no plan {plan}")
        );
        assert_eq!(
            why(None, subject(false, false, None, 0, 0)),
            format!("no plan {plan}")
        );
        // Only the plan's actions, not sealed yet: the caller says so.
        assert_eq!(
            nothing_to_prove(plan, None, &subject(true, false, None, 0, 0), 40),
            None
        );
        assert!(why(Some(7), subject(true, false, None, 0, 0)).starts_with("no dead letter 7:"));
        assert!(
            why(Some(7), subject(true, true, None, 0, 0))
                .contains("dead letter 7 is not an item of plan"),
        );
        assert!(why(Some(7), subject(true, true, Some("pending"), 0, 0)).contains("still pending"));
        let gone = why(Some(7), subject(true, true, Some("sent"), 0, 0));
        assert!(
            gone.contains("as sent, yet no event of it is stored"),
            "{gone}"
        );
        let ended = AuditSubject {
            plan_state: Some("cancelled".to_owned()),
            ..subject(true, true, Some("pending"), 0, 0)
        };
        assert!(
            why(Some(7), ended).contains("ended (cancelled) before dead letter 7 was attempted"),
        );
        let off = why(Some(7), subject(true, true, Some("sent"), 2, 0));
        assert!(off.contains("never queued for sealing"), "{off}");
        let unsealed = why(Some(7), subject(true, true, Some("sent"), 2, 2));
        assert!(
            unsealed
                .contains("2 event(s) of dead letter 7 are not sealed into the checkpoint of 40"),
            "{unsealed}"
        );
        let forged = AuditSubject {
            refused_events: 1,
            refusal: Some("no MAC: it was not written by a planner holding the audit key".into()),
            ..subject(true, true, None, 1, 0)
        };
        let refused = why(Some(7), forged);
        assert!(
            refused.contains("1 refused by the log, never to be sealed (no MAC"),
            "{refused}"
        );
        assert!(!refused.contains("newer checkpoint"), "{refused}");
        // A dead letter deleted since: its events still name it.
        assert!(why(Some(7), subject(true, false, Some("sent"), 1, 1)).contains("not sealed"));
    }

    #[test]
    fn a_witness_directory_never_goes_back() {
        let dir = tempfile::tempdir().unwrap();
        write_witness(dir.path(), "origin\n10\nroot\n\nsig\n", 10).unwrap();
        let problem = write_witness(dir.path(), "origin\n4\nroot\n\nsig\n", 4).unwrap_err();
        assert!(problem.contains("10 leaves"), "{problem}");
        write_witness(dir.path(), "origin\n12\nroot\n\nsig\n", 12).unwrap();
        let held = std::fs::read_to_string(dir.path().join("checkpoint")).unwrap();
        assert!(held.starts_with("origin\n12\n"), "{held}");
    }
}
