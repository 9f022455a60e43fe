//! C2SP checkpoints (`c2sp.org/tlog-checkpoint`): the signed head of a log.
//!
//! A checkpoint is the text of a signed note ([`crate::note`]):
//!
//! ```text
//! <origin>
//! <tree size, decimal, no leading zeros>
//! <root hash, base64 (RFC 4648 §4, padded) of the RFC 6962 MTH>
//! [<extension line>…]
//! ```
//!
//! each line ending in a newline.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use crate::Hash;
use crate::note::{self, NoteError, Signer, Verifier};

/// A log's checkpoint: its origin, tree size and root (C2SP
/// tlog-checkpoint, "Note text").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// The log's identity, a non-empty line (the spec recommends a
    /// schema-less URL with no spaces and no `+`, such as
    /// `example.com/log42`, and that the key name match it).
    pub origin: String,
    /// The number of leaves in the tree.
    pub size: u64,
    /// The RFC 6962 Merkle Tree Hash of those leaves
    /// ([`crate::merkle::root`]).
    pub root: Hash,
    /// Opaque extension lines, each non-empty, without their newline (the
    /// spec does not recommend them: monitors cannot audit them).
    pub extensions: Vec<String>,
}

impl Checkpoint {
    /// The note text: the origin line, the decimal size line, the base64
    /// (standard, padded) root line, then each extension line, every line
    /// ending in `"\n"`. Does not check the fields; [`sign_checkpoint`]
    /// does.
    pub fn to_text(&self) -> String {
        let mut text = format!(
            "{}\n{}\n{}\n",
            self.origin,
            self.size,
            STANDARD.encode(self.root)
        );
        for extension in &self.extensions {
            text.push_str(extension);
            text.push('\n');
        }
        text
    }

    /// Reads a checkpoint's note text strictly (C2SP tlog-checkpoint, "Note
    /// text"): at least three lines, every line ending in a newline; a
    /// non-empty origin; the size in ASCII decimal without leading zeros
    /// (`0` for the empty tree) that fits a `u64`; the root as canonical
    /// standard base64 of exactly 32 bytes; non-empty extension lines; no
    /// control characters other than newlines (as in any note).
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Text`] naming the line and what is wrong.
    pub fn parse(text: &str) -> Result<Checkpoint, CheckpointError> {
        let error = |line: usize, reason: String| CheckpointError::Text { line, reason };
        let body = text
            .strip_suffix('\n')
            .ok_or_else(|| error(0, "the text does not end in a newline".into()))?;
        if let Some(offset) = text.bytes().position(|b| b < 0x20 && b != b'\n') {
            return Err(error(
                0,
                format!("control character at byte {offset} (only newlines are allowed)"),
            ));
        }
        let lines: Vec<&str> = body.split('\n').collect();
        if lines.len() < 3 {
            return Err(error(
                0,
                format!(
                    "{} lines, but a checkpoint has at least 3 (origin, size, root)",
                    lines.len()
                ),
            ));
        }
        let origin = lines[0];
        if origin.is_empty() {
            return Err(error(1, "the origin is empty".into()));
        }
        let size = parse_size(lines[1]).map_err(|reason| error(2, reason))?;
        let root = parse_root(lines[2]).map_err(|reason| error(3, reason))?;
        let mut extensions = Vec::with_capacity(lines.len() - 3);
        for (number, line) in lines.iter().enumerate().skip(3) {
            if line.is_empty() {
                return Err(error(number + 1, "an extension line is empty".into()));
            }
            extensions.push((*line).to_owned());
        }
        Ok(Checkpoint {
            origin: origin.to_owned(),
            size,
            root,
            extensions,
        })
    }
}

/// The tree size line: ASCII decimal, no sign, no leading zeros.
fn parse_size(line: &str) -> Result<u64, String> {
    if line.is_empty() {
        return Err("the tree size is empty".into());
    }
    if !line.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("the tree size {line:?} is not a decimal number"));
    }
    if line.len() > 1 && line.starts_with('0') {
        return Err(format!("the tree size {line:?} has a leading zero"));
    }
    line.parse::<u64>()
        .map_err(|_| format!("the tree size {line:?} does not fit in 64 bits"))
}

/// The root hash line: canonical standard base64 of 32 bytes.
fn parse_root(line: &str) -> Result<Hash, String> {
    let bytes = STANDARD
        .decode(line)
        .map_err(|error| format!("the root hash is not base64: {error}"))?;
    let root: Hash = bytes
        .as_slice()
        .try_into()
        .map_err(|_| format!("the root hash is {} bytes long, not 32", bytes.len()))?;
    if STANDARD.encode(root) != line {
        return Err("the root hash is not canonical base64".into());
    }
    Ok(root)
}

/// Why a checkpoint could not be read or opened.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The note text is not a checkpoint.
    #[error("not a checkpoint: {}{reason}", line_prefix(*.line))]
    Text {
        /// The line (1-based) at fault, or 0 for the text as a whole.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The signed note did not open ([`note::open`]).
    #[error(transparent)]
    Note(#[from] NoteError),
}

/// `line N: ` for a line number, nothing for 0.
fn line_prefix(line: usize) -> String {
    if line == 0 {
        String::new()
    } else {
        format!("line {line}: ")
    }
}

/// Signs `checkpoint` with `signer`: the whole signed note of
/// [`Checkpoint::to_text`] ([`Signer::sign`]).
///
/// # Errors
///
/// [`NoteError::InvalidText`] when the checkpoint would not read back as
/// itself ([`Checkpoint::parse`]): an empty origin, a newline or control
/// character in the origin or an extension, an empty extension.
pub fn sign_checkpoint(signer: &Signer, checkpoint: &Checkpoint) -> Result<String, NoteError> {
    let text = checkpoint.to_text();
    match Checkpoint::parse(&text) {
        Ok(parsed) if parsed == *checkpoint => {}
        Ok(_) => {
            return Err(NoteError::InvalidText(
                "the checkpoint's origin or extensions contain a newline".into(),
            ));
        }
        Err(error) => return Err(NoteError::InvalidText(error.to_string())),
    }
    signer.sign(&text)
}

/// Opens the signed note `note` with `verifier` ([`note::open`]) and reads
/// its text as a checkpoint ([`Checkpoint::parse`]). Does not compare the
/// origin with the key name (the spec only recommends they match): callers
/// that know the log's origin compare it.
///
/// # Errors
///
/// [`CheckpointError::Note`] when the note is malformed, not signed by the
/// verifier's key or its signature is bad; [`CheckpointError::Text`] when
/// the signed text is no checkpoint.
pub fn open_checkpoint(note: &str, verifier: &Verifier) -> Result<Checkpoint, CheckpointError> {
    let text = note::open(note, verifier)?;
    Checkpoint::parse(&text)
}
