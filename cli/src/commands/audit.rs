//! `redrivectl audit ...`: the audit log (docs/audit-log.md).
//!
//! - `audit keygen --name NAME --out FILE`: a new Ed25519 signing key for
//!   the planner's `--audit-signing-key` (C2SP signed-note private key text,
//!   file mode 0600) and its verifier key in `FILE.pub`; needs no planner.
//! - `audit checkpoint [--tree-size N] [--key KEY]`: the latest (or that)
//!   signed checkpoint (`GetAuditCheckpoint`), checked against `--key`.
//! - `audit prove --plan ID [--dead-letter ID] | --leaf N [--tree-size N]
//!   [--key KEY]`: inclusion proofs (`ProveAuditInclusion`), each checked
//!   here against the checkpoint's root: what the plan did to the dead
//!   letter and who approved it, proven.
//! - `audit consistency --from FILE [--from-key KEY] [--tree-size N] --key KEY`: the log now
//!   extends the checkpoint kept in FILE (`ProveAuditConsistency`).
//! - `audit export --format jsonl|csv --out FILE [--tree-size N]`: the whole
//!   log (`ExportAuditLog`); CSV's checkpoint goes to `FILE.checkpoint`.
//! - `audit verify --export FILE --key KEY [--checkpoint FILE]
//!   [--witness FILE]...`: checks an export offline, without the planner.
//!
//! `KEY` is a verifier key (`name+keyid+base64`, as `keygen` prints it) or
//! a file holding one. Exit codes: 0 verified; 65 a proof, signature or
//! export that does not verify (what is wrong is printed), or a request
//! the planner refused.

use std::{io::Write, path::PathBuf};

use clap::{ArgGroup, Args, Subcommand, ValueEnum};
use redrive_proto::v1::{
    AuditCheckpoint, ExportAuditLogRequest, ExportFormat, GetAuditCheckpointRequest,
    ProveAuditConsistencyRequest, ProveAuditInclusionRequest,
};
use redrive_tlog::{
    Hash,
    checkpoint::{Checkpoint, open_checkpoint},
    export::read_log_export,
    leaf::Entry,
    merkle,
    note::{Signer, Verifier},
    verify::verify,
};

use crate::{client::Planner, error::CliError};

/// The audit log's subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum AuditCommand {
    /// Make a new signing key for the planner's --audit-signing-key (and
    /// print its verifier key, also written to FILE.pub).
    Keygen(KeygenArgs),
    /// Show the latest (or one) signed checkpoint of the audit log.
    Checkpoint(CheckpointArgs),
    /// Prove what a plan did to a dead letter, and who approved the plan,
    /// from the audit log (inclusion proofs checked here).
    Prove(ProveArgs),
    /// Prove that the log now extends a checkpoint kept earlier (nothing
    /// rewritten, nothing cut).
    Consistency(ConsistencyArgs),
    /// Export the whole audit log up to a signed checkpoint.
    Export(ExportArgs),
    /// Verify an export offline against the signing key: names every event
    /// changed, missing or added, and a log cut short against a witness.
    Verify(VerifyArgs),
}

/// `audit keygen`.
#[derive(Debug, Clone, Args)]
pub struct KeygenArgs {
    /// The key's name (no `+` or spaces), e.g. `redrive.example.com/audit`:
    /// it names the signer of every checkpoint.
    #[arg(long)]
    pub name: String,
    /// Where to write the private key (refused if it exists).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

/// `audit checkpoint`.
#[derive(Debug, Clone, Args)]
pub struct CheckpointArgs {
    /// The tree size of the checkpoint [default: the latest].
    #[arg(long, value_name = "N", default_value_t = 0, hide_default_value = true)]
    pub tree_size: u64,
    /// Check the signature with this verifier key (or file holding one).
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,
}

/// `audit prove`: `--plan` (and `--dead-letter`) or `--leaf`, one of them.
#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("subject").required(true).args(["plan", "leaf"])))]
pub struct ProveArgs {
    /// The plan: its operator actions (who created and approved it) are
    /// proven, and its events of --dead-letter.
    #[arg(long, value_name = "ID")]
    pub plan: Option<String>,
    /// The dead letter whose events of --plan to prove.
    #[arg(long, value_name = "ID", requires = "plan")]
    pub dead_letter: Option<String>,
    /// One leaf of the log instead.
    #[arg(long, value_name = "N", conflicts_with_all = ["plan", "dead_letter"])]
    pub leaf: Option<u64>,
    /// The checkpoint to prove against [default: the latest].
    #[arg(long, value_name = "N", default_value_t = 0, hide_default_value = true)]
    pub tree_size: u64,
    /// Check the checkpoint's signature with this verifier key.
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,
}

/// `audit consistency`.
#[derive(Debug, Clone, Args)]
pub struct ConsistencyArgs {
    /// A checkpoint kept earlier (a witness's copy): the signed note's file.
    #[arg(long, value_name = "FILE")]
    pub from: PathBuf,
    /// The newer checkpoint's tree size [default: the latest].
    #[arg(long, value_name = "N", default_value_t = 0, hide_default_value = true)]
    pub tree_size: u64,
    /// The verifier key the newer checkpoint must be signed with (and the
    /// --from one, unless --from-key).
    #[arg(long, value_name = "KEY")]
    pub key: String,
    /// The verifier key of the --from checkpoint when it was signed before
    /// a key rotation.
    #[arg(long, value_name = "KEY")]
    pub from_key: Option<String>,
}

/// An export's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// JSON Lines, the signed checkpoint on the first line.
    Jsonl,
    /// CSV, the checkpoint in FILE.checkpoint.
    Csv,
}

/// `audit export`.
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// jsonl or csv.
    #[arg(long, value_enum, default_value_t = LogFormat::Jsonl)]
    pub format: LogFormat,
    /// Where to write it (a CSV's checkpoint goes to FILE.checkpoint);
    /// refused if it exists. Written whole or not at all.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// The checkpoint to export up to [default: the latest, after sealing
    /// what is queued].
    #[arg(long, value_name = "N", default_value_t = 0, hide_default_value = true)]
    pub tree_size: u64,
}

/// `audit verify`.
#[derive(Debug, Clone, Args)]
pub struct VerifyArgs {
    /// The export (JSON Lines or CSV, as `audit export` writes it).
    #[arg(long, value_name = "FILE")]
    pub export: PathBuf,
    /// The verifier key the checkpoints must be signed with.
    #[arg(long, value_name = "KEY")]
    pub key: String,
    /// The export's checkpoint [default: a JSONL export's first line, else
    /// EXPORT.checkpoint].
    #[arg(long, value_name = "FILE")]
    pub checkpoint: Option<PathBuf>,
    /// A checkpoint kept outside the database (a witness's): the export
    /// must extend it. Repeatable.
    #[arg(long, value_name = "FILE")]
    pub witness: Vec<PathBuf>,
}

impl AuditCommand {
    /// Whether the command works without a planner.
    pub fn offline(&self) -> bool {
        matches!(self, Self::Keygen(_) | Self::Verify(_))
    }
}

fn read_file(path: &std::path::Path) -> Result<String, CliError> {
    std::fs::read_to_string(path).map_err(|source| CliError::NoInput {
        path: path.display().to_string(),
        source,
    })
}

/// A verifier key given as its text or as a file holding it.
fn verifier(key: &str) -> Result<Verifier, CliError> {
    if let Ok(verifier) = Verifier::from_key_text(key) {
        return Ok(verifier);
    }
    if key.trim_start().starts_with("PRIVATE+KEY+") {
        return Err(CliError::Usage(
            "--key: that is a private signing key's text; give its verifier key (the `.pub` \
             file `redrivectl audit keygen` wrote beside it), and keep the private key secret"
                .to_owned(),
        ));
    }
    let text = std::fs::read_to_string(key).map_err(|source| CliError::NoInput {
        path: format!("--key {key} (neither a verifier key nor a file holding one)"),
        source,
    })?;
    Verifier::from_key_text(&text).map_err(|error| {
        // The signing key (`PRIVATE+KEY+...`) given where its public half
        // belongs: say so, and never echo its text.
        if text.trim_start().starts_with("PRIVATE+KEY+") {
            return CliError::Usage(format!(
                "--key {key}: this is the private signing key; give its verifier key (the \
                 `.pub` file `redrivectl audit keygen` wrote beside it), and keep this one secret"
            ));
        }
        CliError::Usage(format!(
            "--key {key}: not a verifier key ({error}); `redrivectl audit keygen` prints one"
        ))
    })
}

fn unverified(text: impl Into<String>) -> CliError {
    CliError::Unverified(text.into())
}

/// The checkpoint in `message`, its signature checked with `key` when
/// given, else only parsed.
fn checked(message: &AuditCheckpoint, key: Option<&Verifier>) -> Result<Checkpoint, CliError> {
    match key {
        Some(key) => open_checkpoint(&message.note, key)
            .map_err(|error| unverified(format!("the planner's checkpoint: {error}"))),
        None => {
            let text = message
                .note
                .split_once("\n\n")
                .map_or(message.note.as_str(), |(text, _)| text);
            Checkpoint::parse(&format!("{text}\n"))
                .map_err(|error| unverified(format!("the planner's checkpoint: {error}")))
        }
    }
}

fn to_hash(bytes: &[u8]) -> Result<Hash, CliError> {
    bytes
        .try_into()
        .map_err(|_| unverified(format!("a proof hash of {} bytes, not 32", bytes.len())))
}

/// Runs an audit command that needs no planner.
///
/// # Errors
/// [`CliError`]; [`CliError::Unverified`] when a verification fails.
pub fn run_offline(command: AuditCommand, json: bool, out: &mut dyn Write) -> Result<u8, CliError> {
    match command {
        AuditCommand::Keygen(args) => keygen(&args, out),
        AuditCommand::Verify(args) => verify_export(&args, json, out),
        _ => Err(CliError::Usage(
            "this audit command needs the planner".into(),
        )),
    }
}

fn keygen(args: &KeygenArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let signer = Signer::generate(&args.name)
        .map_err(|error| CliError::Usage(format!("--name {}: {error}", args.name)))?;
    let io = |context: String| move |source| CliError::Io { context, source };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&args.out).map_err(|source| {
        if source.kind() == std::io::ErrorKind::AlreadyExists {
            CliError::Usage(format!(
                "{} exists: a key is never overwritten (choose another --out)",
                args.out.display()
            ))
        } else {
            CliError::Io {
                context: format!("creating {}", args.out.display()),
                source,
            }
        }
    })?;
    writeln!(file, "{}", signer.key_text())
        .map_err(io(format!("writing {}", args.out.display())))?;
    let public = args.out.with_extension(match args.out.extension() {
        Some(extension) => format!("{}.pub", extension.to_string_lossy()),
        None => "pub".to_owned(),
    });
    let verifier = signer.verifier().key_text();
    std::fs::write(&public, format!("{verifier}\n"))
        .map_err(io(format!("writing {}", public.display())))?;
    writeln!(out, "{verifier}")?;
    writeln!(
        out,
        "private key: {} (give it to every planner as --audit-signing-key; keep it secret)\n\
         verifier key: {} (give it to auditors and witnesses)",
        args.out.display(),
        public.display()
    )?;
    Ok(crate::error::EX_OK)
}

/// SIGINT and SIGTERM, listened for from [`Interrupts::listen`] on (the
/// process no longer dies of them), until dropped.
struct Interrupts {
    #[cfg(unix)]
    signals: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Interrupts {
    /// Listens from now on; without the signals (they cannot be listened
    /// for) the process dies of them as before.
    fn listen() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Self {
                signals: signal(SignalKind::interrupt())
                    .and_then(|interrupt| Ok((interrupt, signal(SignalKind::terminate())?)))
                    .ok(),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Resolves at the next SIGINT or SIGTERM with the exit code a shell
    /// reports for it (130, 143); never when not listening.
    async fn next(&mut self) -> u8 {
        #[cfg(unix)]
        if let Some((interrupt, terminate)) = &mut self.signals {
            return tokio::select! {
                _ = interrupt.recv() => 130,
                _ = terminate.recv() => 143,
            };
        }
        std::future::pending().await
    }
}

/// Refuses `path` when anything is there (a file, a directory, a symbolic
/// link even if dangling, a device: an export goes to a new regular file).
fn refuse_existing(path: &std::path::Path) -> Result<(), CliError> {
    let Ok(metadata) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    let what = if metadata.is_dir() {
        "is a directory"
    } else if metadata.is_symlink() {
        "is a symbolic link"
    } else if metadata.is_file() {
        "exists"
    } else {
        "exists and is no regular file"
    };
    Err(CliError::Usage(format!(
        "{} {what}: an export goes to a new file, never over anything (choose another --out, or move it away first)",
        path.display()
    )))
}

/// A temporary file in the directory of `path` (so that renaming it there is
/// atomic), named after it, removed when dropped unpersisted.
fn partial_beside(path: &std::path::Path) -> std::io::Result<tempfile::NamedTempFile> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => std::path::Path::new("."),
    };
    let name = path
        .file_name()
        .map_or_else(|| "export".into(), |name| name.to_string_lossy());
    let prefix = format!(".{name}.");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".partial");
    // As `File::create` would: what the umask leaves of 0666.
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    builder.tempfile_in(dir)
}

/// Renames the complete `file` to `path`, refusing a file that appeared
/// there meanwhile (`renameat2` `RENAME_NOREPLACE` or a hard link: never an
/// overwrite).
fn persist_new(file: tempfile::NamedTempFile, path: &std::path::Path) -> Result<(), CliError> {
    file.persist_noclobber(path).map(drop).map_err(|error| {
        if error.error.kind() == std::io::ErrorKind::AlreadyExists {
            CliError::Usage(format!(
                "{} exists: an export goes to a new file, never over anything (choose another --out, or move it away first)",
                path.display()
            ))
        } else {
            CliError::Io {
                context: format!("writing {}", path.display()),
                source: error.error,
            }
        }
    })
}

fn verify_export(args: &VerifyArgs, json: bool, out: &mut dyn Write) -> Result<u8, CliError> {
    let key = verifier(&args.key)?;
    let data = std::fs::read(&args.export).map_err(|source| CliError::NoInput {
        path: args.export.display().to_string(),
        source,
    })?;
    let export = read_log_export(&data).map_err(|error| {
        unverified(format!(
            "{} is not a log export: {error}",
            args.export.display()
        ))
    })?;
    let note = match (&args.checkpoint, &export.checkpoint) {
        (Some(path), _) => read_file(path)?,
        (None, Some(note)) => note.clone(),
        (None, None) => {
            let mut sidecar = args.export.clone().into_os_string();
            sidecar.push(".checkpoint");
            read_file(std::path::Path::new(&sidecar)).map_err(|_| {
                CliError::Usage(format!(
                    "{} has no checkpoint line (a CSV export): give --checkpoint FILE",
                    args.export.display()
                ))
            })?
        }
    };
    let witnessed = args
        .witness
        .iter()
        .map(|path| read_file(path))
        .collect::<Result<Vec<_>, _>>()?;
    let report = verify(&export, &note, &key, &witnessed)
        .map_err(|error| unverified(format!("refused: {error}")))?;
    if json {
        let problems: Vec<String> = report.problems.iter().map(ToString::to_string).collect();
        writeln!(
            out,
            "{}",
            serde_json::json!({
                "valid": report.is_valid(),
                "origin": report.origin,
                "treeSize": report.tree_size,
                "leavesChecked": report.leaves_checked,
                "newerRows": report.newer_rows,
                "problems": problems,
            })
        )?;
    } else {
        for problem in &report.problems {
            writeln!(out, "{problem}")?;
        }
        writeln!(
            out,
            "{}: {} leaves of {} checked against the checkpoint signed by {}{}",
            if report.is_valid() {
                "VERIFIED"
            } else {
                "NOT VERIFIED"
            },
            report.leaves_checked,
            report.origin,
            key.name(),
            if witnessed.is_empty() {
                String::new()
            } else {
                format!(", extending {} witnessed checkpoint(s)", witnessed.len())
            }
        )?;
    }
    if report.is_valid() {
        Ok(crate::error::EX_OK)
    } else {
        Err(unverified(format!(
            "{} problem(s) in {}",
            report.problems.len(),
            args.export.display()
        )))
    }
}

/// Runs an audit command against the planner.
///
/// # Errors
/// [`CliError`]; [`CliError::Unverified`] when a proof does not verify.
pub async fn run(
    planner: &mut Planner,
    command: AuditCommand,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    match command {
        AuditCommand::Checkpoint(args) => {
            let key = args.key.as_deref().map(verifier).transpose()?;
            let message = planner
                .get_audit_checkpoint(GetAuditCheckpointRequest {
                    tree_size: args.tree_size,
                })
                .await?
                .into_inner();
            checked(&message, key.as_ref())?;
            if json {
                writeln!(out, "{}", crate::output::message_text(&message)?)?;
            } else {
                write!(out, "{}", message.note)?;
                // The note alone goes to stdout (a witness keeps it as a
                // file); that its signature went unchecked goes beside it.
                if key.is_none() {
                    eprintln!(
                        "redrivectl: the checkpoint's signature was not checked (give --key \
                         with the verifier key)"
                    );
                }
            }
            Ok(crate::error::EX_OK)
        }
        AuditCommand::Prove(args) => prove(planner, args, json, out).await,
        AuditCommand::Consistency(args) => consistency(planner, args, out).await,
        AuditCommand::Export(args) => export(planner, args, out).await,
        offline @ (AuditCommand::Keygen(_) | AuditCommand::Verify(_)) => {
            run_offline(offline, json, out)
        }
    }
}

/// One proven leaf as a sentence.
fn describe(entry: &Entry) -> String {
    match entry {
        Entry::Event(event) => format!(
            "dead letter {}: {} by plan {} in wave {} at {} (event {}{})",
            event.dead_letter_id,
            event.action,
            event.plan_id,
            event.wave,
            event.at,
            event.id,
            if event.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", event.reason)
            }
        ),
        Entry::Action(action) => format!(
            "plan {}: {} by {} at {}{}",
            action.plan_id,
            action.action,
            action.actor,
            action.at,
            if action.reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", action.reason)
            }
        ),
    }
}

async fn prove(
    planner: &mut Planner,
    args: ProveArgs,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let key = args.key.as_deref().map(verifier).transpose()?;
    let actions_only = args.plan.is_some() && args.dead_letter.is_none();
    let response = planner
        .prove_audit_inclusion(ProveAuditInclusionRequest {
            plan_id: args.plan.unwrap_or_default(),
            dead_letter_id: args.dead_letter.unwrap_or_default(),
            leaf_index: args.leaf,
            tree_size: args.tree_size,
        })
        .await?
        .into_inner();
    let message = response
        .checkpoint
        .ok_or_else(|| unverified("the planner sent no checkpoint"))?;
    let checkpoint = checked(&message, key.as_ref())?;
    let mut problems = Vec::new();
    let mut lines = Vec::new();
    for proof in &response.proofs {
        let entry = Entry::from_canonical(proof.leaf.as_bytes()).ok();
        let hashes = proof
            .hashes
            .iter()
            .map(|hash| to_hash(hash))
            .collect::<Result<Vec<_>, _>>()?;
        let proven = entry.as_ref().is_some_and(|entry| {
            merkle::verify_inclusion(
                &entry.leaf_hash(),
                proof.leaf_index,
                checkpoint.size,
                &hashes,
                &checkpoint.root,
            )
            .is_ok()
        });
        let what = entry.as_ref().map_or_else(
            || {
                format!(
                    "{} {} of plan {}: the record is gone",
                    proof.kind, proof.id, proof.plan_id
                )
            },
            describe,
        );
        if proven {
            lines.push(format!("leaf {}: {what}", proof.leaf_index));
        } else {
            problems.push(format!(
                "leaf {}: {what}: NOT PROVEN (the record as stored now is not what was sealed)",
                proof.leaf_index
            ));
        }
    }
    // Events of the dead letter with no proof here: a proof of some of
    // them never stands for all.
    let leaves_unproven = problems.len();
    problems.extend(
        response
            .unproven
            .iter()
            .map(|line| format!("NOT PROVEN: {line}")),
    );
    if json {
        writeln!(
            out,
            "{}",
            serde_json::json!({
                "treeSize": checkpoint.size,
                "origin": checkpoint.origin,
                "signatureChecked": key.is_some(),
                "proven": lines,
                "notProven": problems,
            })
        )?;
    } else {
        for line in lines.iter().chain(&problems) {
            writeln!(out, "{line}")?;
        }
        if actions_only {
            writeln!(
                out,
                "(the plan's operator actions only: give --dead-letter ID to prove what it did to \
                 a dead letter, or export and verify the whole log)"
            )?;
        }
        writeln!(
            out,
            "{} of {} leaves proven in the checkpoint of {} leaves of {}{}",
            lines.len(),
            response.proofs.len(),
            checkpoint.size,
            checkpoint.origin,
            if key.is_some() {
                ", its signature checked"
            } else {
                " (signature not checked: give --key)"
            }
        )?;
    }
    match (leaves_unproven, response.unproven.len()) {
        (0, 0) => Ok(crate::error::EX_OK),
        (0, _) => Err(unverified(
            "not every record asked for is proven (the NOT PROVEN lines say why)",
        )),
        (leaves, _) => Err(unverified(format!("{leaves} leaves not proven"))),
    }
}

async fn consistency(
    planner: &mut Planner,
    args: ConsistencyArgs,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let key = verifier(&args.key)?;
    let from_key = match &args.from_key {
        Some(from_key) => verifier(from_key)?,
        None => key.clone(),
    };
    let old = open_checkpoint(&read_file(&args.from)?, &from_key)
        .map_err(|error| unverified(format!("{}: {error}", args.from.display())))?;
    let proof = planner
        .prove_audit_consistency(ProveAuditConsistencyRequest {
            old_size: old.size,
            new_size: args.tree_size,
        })
        .await?
        .into_inner();
    let new_message = proof
        .new
        .ok_or_else(|| unverified("the planner sent no checkpoint"))?;
    let new = checked(&new_message, Some(&key))?;
    let hashes = proof
        .hashes
        .iter()
        .map(|hash| to_hash(hash))
        .collect::<Result<Vec<_>, _>>()?;
    merkle::verify_consistency(old.size, new.size, &old.root, &new.root, &hashes).map_err(
        |error| {
            unverified(format!(
                "the log of {} leaves does not extend the checkpoint of {} leaves in {}: {error} \
                 (rewritten or cut short)",
                new.size,
                old.size,
                args.from.display()
            ))
        },
    )?;
    writeln!(
        out,
        "CONSISTENT: the log of {} leaves signed by {} extends the checkpoint of {} leaves in {} \
         (its tree: no leaf rewritten or cut; whether the rows in the database are still what \
         was sealed, `redrivectl audit export` then `audit verify` tell)",
        new.size,
        key.name(),
        old.size,
        args.from.display()
    )?;
    Ok(crate::error::EX_OK)
}

async fn export(
    planner: &mut Planner,
    args: ExportArgs,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let format = match args.format {
        LogFormat::Jsonl => ExportFormat::Jsonl,
        LogFormat::Csv => ExportFormat::Csv,
    };
    let io = |context: String| move |source| CliError::Io { context, source };
    let mut sidecar = args.out.clone().into_os_string();
    sidecar.push(".checkpoint");
    let sidecar = PathBuf::from(sidecar);
    let csv = args.format == LogFormat::Csv;
    // Refused before the planner is asked for anything.
    for path in std::iter::once(&args.out).chain(csv.then_some(&sidecar)) {
        refuse_existing(path)?;
    }
    if let Some(dir) = args.out.parent()
        && !dir.as_os_str().is_empty()
        && !dir.is_dir()
    {
        return Err(CliError::Usage(format!(
            "{}: the directory {} does not exist",
            args.out.display(),
            dir.display()
        )));
    }
    let mut stream = planner
        .export_audit_log(ExportAuditLogRequest {
            format: format.into(),
            tree_size: args.tree_size,
        })
        .await?
        .into_inner();
    // Listening before the partial file exists, so that it never outlives
    // a Ctrl-C.
    let mut interrupts = Interrupts::listen();
    // Written beside it and renamed into place once complete: a stream cut
    // short leaves nothing that looks like an export.
    let mut file = std::io::BufWriter::new(
        partial_beside(&args.out)
            .map_err(io(format!("creating a file beside {}", args.out.display())))?,
    );
    let mut checkpoint = String::new();
    let mut bytes = 0usize;
    loop {
        let chunk = tokio::select! {
            chunk = stream.message() => chunk?,
            code = interrupts.next() => {
                // Returning drops the partial file, which removes it.
                return Err(CliError::Interrupted {
                    what: format!("interrupted: nothing was written to {}", args.out.display()),
                    code,
                });
            }
        };
        let Some(chunk) = chunk else {
            break;
        };
        if !chunk.checkpoint.is_empty() {
            checkpoint = chunk.checkpoint;
        }
        bytes += chunk.data.len();
        file.write_all(&chunk.data)
            .map_err(io(format!("writing {}", args.out.display())))?;
    }
    let file = file.into_inner().map_err(|error| CliError::Io {
        context: format!("writing {}", args.out.display()),
        source: error.into_error(),
    })?;
    file.as_file()
        .sync_all()
        .map_err(io(format!("writing {}", args.out.display())))?;
    if csv {
        let mut side = partial_beside(&sidecar)
            .map_err(io(format!("creating a file beside {}", sidecar.display())))?;
        side.write_all(checkpoint.as_bytes())
            .and_then(|()| side.as_file().sync_all())
            .map_err(io(format!("writing {}", sidecar.display())))?;
        persist_new(side, &sidecar)?;
        if let Err(error) = persist_new(file, &args.out) {
            // Never a checkpoint without its export.
            let _ = std::fs::remove_file(&sidecar);
            return Err(error);
        }
    } else {
        persist_new(file, &args.out)?;
    }
    let size = checkpoint.lines().nth(1).unwrap_or("0");
    writeln!(
        out,
        "{}: {bytes} bytes, the log up to the checkpoint of {size} leaves",
        args.out.display()
    )?;
    Ok(crate::error::EX_OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_export_is_written_whole_or_not_at_all_and_never_over_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("log.jsonl");
        let listing = || {
            let mut names: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };

        // Cut short: nothing is left behind.
        let mut partial = partial_beside(&out).unwrap();
        partial.write_all(b"half an export").unwrap();
        assert_eq!(listing().len(), 1, "the partial file sits beside it");
        drop(partial);
        assert!(listing().is_empty());

        // Complete: renamed into place.
        let mut whole = partial_beside(&out).unwrap();
        whole.write_all(b"the export\n").unwrap();
        persist_new(whole, &out).unwrap();
        assert_eq!(listing(), ["log.jsonl"]);

        // A file that appeared meanwhile is kept, and the new one dropped.
        let mut late = partial_beside(&out).unwrap();
        late.write_all(b"another export\n").unwrap();
        let error = persist_new(late, &out).unwrap_err();
        assert!(
            matches!(&error, CliError::Usage(text) if text.contains("log.jsonl exists")),
            "{error:?}"
        );
        assert_eq!(std::fs::read(&out).unwrap(), b"the export\n");
        assert_eq!(listing(), ["log.jsonl"]);
    }

    #[test]
    fn an_export_is_refused_over_anything_before_it_starts() {
        let dir = tempfile::tempdir().unwrap();
        let refusal = |path: &std::path::Path| match refuse_existing(path) {
            Err(CliError::Usage(text)) => text,
            other => panic!("{path:?}: {other:?}"),
        };
        assert!(refuse_existing(&dir.path().join("new.jsonl")).is_ok());
        std::fs::write(dir.path().join("old.jsonl"), "").unwrap();
        assert!(refusal(&dir.path().join("old.jsonl")).contains("old.jsonl exists"));
        assert!(refusal(dir.path()).contains("is a directory"));
        #[cfg(unix)]
        {
            let dangling = dir.path().join("dangling.jsonl");
            std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
            assert!(refusal(&dangling).contains("is a symbolic link"));
            assert!(refusal(std::path::Path::new("/dev/null")).contains("no regular file"));
        }
    }
}
