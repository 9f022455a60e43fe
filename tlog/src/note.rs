//! C2SP signed notes (`c2sp.org/signed-note`) with Ed25519 keys.
//!
//! A signed note is a text ending in a newline, a blank line, and one or
//! more signature lines:
//!
//! ```text
//! <text, ending in "\n">
//! <blank line>
//! — <key name> <base64(4-byte key id || 64-byte Ed25519 signature)>
//! ```
//!
//! The signature line starts with an em dash (U+2014) and a space; the
//! Ed25519 signature (RFC 8032) is over the text, final newline included.
//! The key id is the first 4 bytes, big-endian, of SHA-256(key name ||
//! 0x0A || 0x01 || 32-byte public key) (signed-note, "Ed25519
//! signatures").
//!
//! Keys are text in the formats of Go's `golang.org/x/mod/sumdb/note`
//! (which the signed-note spec's "Verifier keys" section describes):
//!
//! ```text
//! verifier key: <name>+<8 hex key id>+<base64(0x01 || 32-byte public key)>
//! signer key:   PRIVATE+KEY+<name>+<8 hex key id>+<base64(0x01 || 32-byte seed)>
//! ```
//!
//! Errors never quote key material.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

/// The signature type byte of Ed25519 in signed notes (signed-note,
/// "Signature types").
const ALG_ED25519: u8 = 0x01;

/// The prefix of a signature line: an em dash (U+2014) and a space.
const SIGNATURE_PREFIX: &str = "\u{2014} ";

/// The most signature lines [`open`] reads (the spec asks verifiers to
/// accept at least 16; Go's `note.Open` stops at 100).
const MAX_SIGNATURES: usize = 100;

/// The prefix of a signer (private) key's text.
const PRIVATE_PREFIX: &str = "PRIVATE+KEY+";

/// The key id of an Ed25519 key named `name` with public key `public_key`:
/// the first 4 bytes, read as a big-endian `u32`, of SHA-256(`name` || 0x0A
/// || 0x01 || `public_key`) (C2SP signed-note, "Ed25519 signatures").
pub fn ed25519_key_id(name: &str, public_key: &[u8; 32]) -> u32 {
    let mut hasher = Sha256::new();
    hasher.update(name.as_bytes());
    hasher.update([b'\n', ALG_ED25519]);
    hasher.update(public_key);
    let digest = hasher.finalize();
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
}

/// Why a key name is not allowed (C2SP signed-note, "Format": key names
/// are non-empty and contain no Unicode spaces and no `+`; control
/// characters are refused too, as no note may contain them).
fn name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("it is empty")
    } else if name.contains('+') {
        Some("it contains a plus sign (+)")
    } else if name.chars().any(char::is_whitespace) {
        Some("it contains a space (Unicode white space)")
    } else if name.chars().any(char::is_control) {
        Some("it contains a control character")
    } else {
        None
    }
}

/// Checks a key name, for [`KeyError::BadName`].
fn check_name(name: &str) -> Result<(), KeyError> {
    match name_problem(name) {
        Some(reason) => Err(KeyError::BadName {
            name: name.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Why a key text, or a key name, was refused. The messages never quote
/// key material (names and key ids are public).
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// A key name the signed-note spec forbids.
    #[error("the key name {name:?} is not allowed: {reason}")]
    BadName {
        /// The name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A signer key text that does not start with `PRIVATE+KEY+`.
    #[error(
        "a signer key starts with PRIVATE+KEY+ (PRIVATE+KEY+<name>+<8 hex key id>+<base64 key>)"
    )]
    MissingPrivatePrefix,
    /// A key text without all of its `+`-separated parts.
    #[error("the key has no {what} (expected {format})")]
    MissingPart {
        /// The part missing: `key name`, `key id` or `key`.
        what: &'static str,
        /// The expected format.
        format: &'static str,
    },
    /// A key id that is not 8 hexadecimal digits.
    #[error("the key id {text:?} is not 8 hexadecimal digits")]
    BadKeyId {
        /// The key id's text.
        text: String,
    },
    /// Key material that is not standard base64 (RFC 4648 §4, padded).
    #[error("the key is not valid base64 (RFC 4648 standard alphabet, padded): {0}")]
    BadBase64(base64::DecodeError),
    /// Key material of an algorithm other than Ed25519 (0x01).
    #[error("the key's algorithm byte is {found}, not 0x01 (Ed25519)")]
    WrongAlgorithm {
        /// The algorithm byte found, as `0x..`, or `missing` for no bytes.
        found: String,
    },
    /// Ed25519 key material that is not 32 bytes.
    #[error("the Ed25519 key is {len} bytes long, not 32")]
    WrongKeyLength {
        /// Its length in bytes (after the algorithm byte).
        len: usize,
    },
    /// 32 bytes that are no Ed25519 public key (RFC 8032 §5.1.3).
    #[error("the public key is not a valid Ed25519 point")]
    InvalidPublicKey,
    /// A key id that is not the one the name and key give.
    #[error("the key id {stated:08x} does not match the key (its id is {computed:08x})")]
    KeyIdMismatch {
        /// The key id in the text.
        stated: u32,
        /// The key id computed by [`ed25519_key_id`].
        computed: u32,
    },
    /// The operating system's random number generator failed.
    #[error("cannot get random bytes for a new key: {0}")]
    Random(String),
}

/// The format of a verifier key's text, for messages.
const VERIFIER_FORMAT: &str = "<name>+<8 hex key id>+<base64 key>";
/// The format of a signer key's text, for messages.
const SIGNER_FORMAT: &str = "PRIVATE+KEY+<name>+<8 hex key id>+<base64 key>";

/// The name, key id and key bytes of `<name>+<id>+<base64>` (the key may
/// contain `+`, a base64 character: only the first two `+` split).
fn parse_key_parts(text: &str, format: &'static str) -> Result<(String, u32, Vec<u8>), KeyError> {
    let missing = |what| KeyError::MissingPart { what, format };
    let (name, rest) = text.split_once('+').ok_or(missing("key id"))?;
    if name.is_empty() {
        return Err(missing("key name"));
    }
    check_name(name)?;
    let (id_text, key_text) = rest.split_once('+').ok_or(missing("key"))?;
    if id_text.len() != 8 || !id_text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(KeyError::BadKeyId {
            text: id_text.to_owned(),
        });
    }
    let id = u32::from_str_radix(id_text, 16).map_err(|_| KeyError::BadKeyId {
        text: id_text.to_owned(),
    })?;
    if key_text.is_empty() {
        return Err(missing("key"));
    }
    let bytes = STANDARD.decode(key_text).map_err(KeyError::BadBase64)?;
    match bytes.first() {
        None => {
            return Err(KeyError::WrongAlgorithm {
                found: "missing".into(),
            });
        }
        Some(&ALG_ED25519) => {}
        Some(other) => {
            return Err(KeyError::WrongAlgorithm {
                found: format!("0x{other:02x}"),
            });
        }
    }
    Ok((name.to_owned(), id, bytes[1..].to_vec()))
}

/// 32 key bytes, or [`KeyError::WrongKeyLength`].
fn key_bytes(bytes: &[u8]) -> Result<[u8; 32], KeyError> {
    bytes
        .try_into()
        .map_err(|_| KeyError::WrongKeyLength { len: bytes.len() })
}

/// An Ed25519 signed-note signer: a key name, its key id and the private
/// key. Its `Debug` shows the name and key id only.
#[derive(Clone)]
pub struct Signer {
    name: String,
    key_id: u32,
    key: SigningKey,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("name", &self.name)
            .field("key_id", &format_args!("{:08x}", self.key_id))
            .finish_non_exhaustive()
    }
}

impl Signer {
    /// A new key named `name`, its 32-byte Ed25519 seed (RFC 8032 §5.1.5)
    /// from the operating system's random number generator (`getrandom`).
    ///
    /// # Errors
    ///
    /// [`KeyError::BadName`] for a name the signed-note spec forbids
    /// (empty, a `+`, a Unicode space, a control character);
    /// [`KeyError::Random`] when no random bytes can be had.
    pub fn generate(name: &str) -> Result<Signer, KeyError> {
        check_name(name)?;
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|error| KeyError::Random(error.to_string()))?;
        Signer::from_seed(name, &seed)
    }

    /// The signer named `name` with the 32-byte Ed25519 private key `seed`
    /// (RFC 8032 §5.1.5), e.g. for fixed test keys.
    ///
    /// # Errors
    ///
    /// [`KeyError::BadName`] for a name the signed-note spec forbids.
    pub fn from_seed(name: &str, seed: &[u8; 32]) -> Result<Signer, KeyError> {
        check_name(name)?;
        let key = SigningKey::from_bytes(seed);
        let key_id = ed25519_key_id(name, key.verifying_key().as_bytes());
        Ok(Signer {
            name: name.to_owned(),
            key_id,
            key,
        })
    }

    /// Reads a signer key's text, `PRIVATE+KEY+<name>+<8 hex key
    /// id>+<base64(0x01 || 32-byte seed)>` (Go's `note.NewSigner` format),
    /// ignoring white space (a newline) around it. The key id may be in
    /// upper or lower case hex; it must be the id of the public key the
    /// seed gives.
    ///
    /// # Errors
    ///
    /// [`KeyError::MissingPrivatePrefix`] without the `PRIVATE+KEY+`
    /// prefix, [`KeyError::MissingPart`], [`KeyError::BadName`],
    /// [`KeyError::BadKeyId`] (not 8 hex digits), [`KeyError::BadBase64`],
    /// [`KeyError::WrongAlgorithm`] (not 0x01), [`KeyError::WrongKeyLength`]
    /// (not 32 bytes), [`KeyError::KeyIdMismatch`].
    pub fn from_key_text(text: &str) -> Result<Signer, KeyError> {
        let rest = text
            .trim()
            .strip_prefix(PRIVATE_PREFIX)
            .ok_or(KeyError::MissingPrivatePrefix)?;
        let (name, stated, bytes) = parse_key_parts(rest, SIGNER_FORMAT)?;
        let seed = key_bytes(&bytes)?;
        let signer = Signer::from_seed(&name, &seed)?;
        if signer.key_id != stated {
            return Err(KeyError::KeyIdMismatch {
                stated,
                computed: signer.key_id,
            });
        }
        Ok(signer)
    }

    /// The signer key's text, `PRIVATE+KEY+<name>+<8 lowercase hex key
    /// id>+<base64(0x01 || 32-byte seed)>`, without a newline. Secret.
    pub fn key_text(&self) -> String {
        let mut bytes = Vec::with_capacity(33);
        bytes.push(ALG_ED25519);
        bytes.extend_from_slice(self.key.as_bytes());
        format!(
            "{PRIVATE_PREFIX}{}+{:08x}+{}",
            self.name,
            self.key_id,
            STANDARD.encode(&bytes)
        )
    }

    /// The verifier (public key) of this signer.
    pub fn verifier(&self) -> Verifier {
        Verifier {
            name: self.name.clone(),
            key_id: self.key_id,
            key: self.key.verifying_key(),
        }
    }

    /// The key name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key id ([`ed25519_key_id`] of the name and public key).
    pub fn key_id(&self) -> u32 {
        self.key_id
    }

    /// Signs `text` and returns the whole signed note: `text`, a blank
    /// line, and the signature line `— <name> <base64(key id ||
    /// signature)>\n` (C2SP signed-note, "Format"). Ed25519 signatures are
    /// deterministic: the same key and text give the same note.
    ///
    /// # Errors
    ///
    /// [`NoteError::InvalidText`] when `text` does not end in a newline,
    /// is not a valid note text (a control character other than newline),
    /// or is longer than [`MAX_NOTE_BYTES`].
    pub fn sign(&self, text: &str) -> Result<String, NoteError> {
        check_text(text)?;
        let signature = self.key.sign(text.as_bytes());
        let mut bytes = Vec::with_capacity(68);
        bytes.extend_from_slice(&self.key_id.to_be_bytes());
        bytes.extend_from_slice(&signature.to_bytes());
        Ok(format!(
            "{text}\n{SIGNATURE_PREFIX}{} {}\n",
            self.name,
            STANDARD.encode(&bytes)
        ))
    }

    /// Adds this key's signature to `note`, a signed note whose signature
    /// by `by` verifies ([`open`]): the note with one more signature line
    /// over the same text (C2SP signed-note allows several; a verifier
    /// ignores those of keys it does not know). Never signs a text no key
    /// the caller trusts has signed. A note this key signed already comes
    /// back unchanged.
    ///
    /// # Errors
    ///
    /// What [`open`] returns for `note` and `by` (malformed, not signed by
    /// `by`, a bad signature); [`NoteError::Malformed`] when the note
    /// already holds the most signatures a note may have (100).
    pub fn cosign(&self, note: &str, by: &Verifier) -> Result<String, NoteError> {
        let text = open(note, by)?;
        if open(note, &self.verifier()).is_ok() {
            return Ok(note.to_owned());
        }
        let signatures = note.len() - text.len() - 1;
        if note[note.len() - signatures..].matches('\n').count() >= MAX_SIGNATURES {
            return Err(NoteError::Malformed(
                "the note holds 100 signatures already".to_owned(),
            ));
        }
        let signed = self.sign(&text)?;
        Ok(format!("{note}{}", &signed[text.len() + 1..]))
    }
}

/// An Ed25519 signed-note verifier: a key name, its key id and the public
/// key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verifier {
    name: String,
    key_id: u32,
    key: VerifyingKey,
}

impl Verifier {
    /// Reads a verifier key's text, `<name>+<8 hex key id>+<base64(0x01 ||
    /// 32-byte public key)>` (C2SP signed-note, "Verifier keys"; Go's
    /// `note.NewVerifier`), ignoring white space around it.
    ///
    /// # Errors
    ///
    /// [`KeyError::MissingPart`], [`KeyError::BadName`],
    /// [`KeyError::BadKeyId`], [`KeyError::BadBase64`],
    /// [`KeyError::WrongAlgorithm`], [`KeyError::WrongKeyLength`],
    /// [`KeyError::InvalidPublicKey`], [`KeyError::KeyIdMismatch`].
    pub fn from_key_text(text: &str) -> Result<Verifier, KeyError> {
        let (name, stated, bytes) = parse_key_parts(text.trim(), VERIFIER_FORMAT)?;
        let verifier = Verifier::from_public_key(&name, &key_bytes(&bytes)?)?;
        if verifier.key_id != stated {
            return Err(KeyError::KeyIdMismatch {
                stated,
                computed: verifier.key_id,
            });
        }
        Ok(verifier)
    }

    /// The verifier named `name` for the 32-byte Ed25519 public key
    /// `public_key` (RFC 8032 §5.1.5 encoding).
    ///
    /// # Errors
    ///
    /// [`KeyError::BadName`], [`KeyError::InvalidPublicKey`].
    pub fn from_public_key(name: &str, public_key: &[u8; 32]) -> Result<Verifier, KeyError> {
        check_name(name)?;
        let key = VerifyingKey::from_bytes(public_key).map_err(|_| KeyError::InvalidPublicKey)?;
        Ok(Verifier {
            name: name.to_owned(),
            key_id: ed25519_key_id(name, public_key),
            key,
        })
    }

    /// The verifier key's text, `<name>+<8 lowercase hex key
    /// id>+<base64(0x01 || public key)>`, without a newline.
    pub fn key_text(&self) -> String {
        let mut bytes = Vec::with_capacity(33);
        bytes.push(ALG_ED25519);
        bytes.extend_from_slice(self.key.as_bytes());
        format!(
            "{}+{:08x}+{}",
            self.name,
            self.key_id,
            STANDARD.encode(&bytes)
        )
    }

    /// The key name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key id ([`ed25519_key_id`] of the name and public key).
    pub fn key_id(&self) -> u32 {
        self.key_id
    }

    /// The 32-byte Ed25519 public key.
    pub fn public_key(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    /// `<name>+<8 hex key id>`, how messages name this key.
    fn label(&self) -> String {
        format!("{}+{:08x}", self.name, self.key_id)
    }
}

/// The largest note [`Signer::sign`] and [`open`] accept, in bytes (1 MiB;
/// a checkpoint is about 100 bytes plus 100 per signature).
pub const MAX_NOTE_BYTES: usize = 1 << 20;

/// Checks a note text to sign: ends in a newline, no other control
/// characters, not too long.
fn check_text(text: &str) -> Result<(), NoteError> {
    if !text.ends_with('\n') {
        return Err(NoteError::InvalidText(
            "the text does not end in a newline".into(),
        ));
    }
    if let Some(offset) = control_character(text) {
        return Err(NoteError::InvalidText(format!(
            "the text has a control character at byte {offset} (only newlines are allowed)"
        )));
    }
    if text.len() > MAX_NOTE_BYTES {
        return Err(NoteError::InvalidText(format!(
            "the text is {} bytes long, more than {MAX_NOTE_BYTES}",
            text.len()
        )));
    }
    Ok(())
}

/// The byte offset of the first ASCII control character other than a
/// newline (C2SP signed-note, "Format": notes contain none).
fn control_character(text: &str) -> Option<usize> {
    text.bytes().position(|b| b < 0x20 && b != b'\n')
}

/// Why a note could not be signed or opened.
#[derive(Debug, thiserror::Error)]
pub enum NoteError {
    /// A text that cannot be a note's text (signing), or a checkpoint that
    /// cannot be written as one.
    #[error("cannot sign this text: {0}")]
    InvalidText(String),
    /// Not a signed note (C2SP signed-note, "Format"): the reason says what
    /// is wrong.
    #[error("malformed signed note: {0}")]
    Malformed(String),
    /// No signature by the verifier's key (same key name and key id).
    #[error("not signed by {key} (signed by: {})", signed_by(.found))]
    NotSignedBy {
        /// The expected key, `<name>+<8 hex key id>`.
        key: String,
        /// The keys that did sign, `<name>+<8 hex key id>` each.
        found: Vec<String>,
    },
    /// A signature by the verifier's key (same name and key id) that does
    /// not verify: the text was changed, or the signature forged.
    #[error(
        "bad signature by {name} (key {key_id:08x}): the text was changed after it was signed, or the signature is forged"
    )]
    BadSignature {
        /// The key name.
        name: String,
        /// The key id.
        key_id: u32,
    },
}

/// The list of signers for [`NoteError::NotSignedBy`].
fn signed_by(found: &[String]) -> String {
    if found.is_empty() {
        "no one".into()
    } else {
        found.join(", ")
    }
}

/// Opens the signed note `note` with `verifier`: returns its text (final
/// newline included, blank separator line excluded) when one of its
/// signatures is by the verifier's key (same key name and key id) and every
/// signature by that key verifies (Ed25519 `verify_strict`). Signatures by
/// other keys are ignored, as C2SP signed-note ("Signatures") requires.
///
/// # Errors
///
/// [`NoteError::Malformed`] when `note` is not a signed note (not valid
/// UTF-8 is impossible here; control characters, no blank line before the
/// signatures, a line not of the form `— <name> <base64>`, a signature
/// shorter than 5 bytes, more than 100 signatures, longer than
/// [`MAX_NOTE_BYTES`]); [`NoteError::NotSignedBy`] naming the keys that did
/// sign; [`NoteError::BadSignature`] when the verifier's signature does not
/// verify.
pub fn open(note: &str, verifier: &Verifier) -> Result<String, NoteError> {
    let malformed = |reason: &str| NoteError::Malformed(reason.to_owned());
    if note.len() > MAX_NOTE_BYTES {
        return Err(malformed("the note is longer than 1 MiB"));
    }
    if let Some(offset) = control_character(note) {
        return Err(NoteError::Malformed(format!(
            "the note has a control character at byte {offset} (only newlines are allowed)"
        )));
    }
    let split = note
        .rfind("\n\n")
        .ok_or(malformed("no blank line before the signatures"))?;
    let (text, signatures) = (&note[..split + 1], &note[split + 2..]);
    if signatures.is_empty() {
        return Err(malformed("no signature lines after the blank line"));
    }
    if !signatures.ends_with('\n') {
        return Err(malformed(
            "the last signature line does not end in a newline",
        ));
    }
    let mut found = Vec::new();
    let mut verified = false;
    for (number, line) in signatures[..signatures.len() - 1].split('\n').enumerate() {
        if number >= MAX_SIGNATURES {
            return Err(malformed("more than 100 signatures"));
        }
        let line_error =
            |what: &str| NoteError::Malformed(format!("signature line {}: {what}", number + 1));
        let rest = line
            .strip_prefix(SIGNATURE_PREFIX)
            .ok_or_else(|| line_error("does not start with an em dash (U+2014) and a space"))?;
        let (name, encoded) = rest
            .split_once(' ')
            .ok_or_else(|| line_error("has no space between key name and signature"))?;
        if let Some(reason) = name_problem(name) {
            return Err(line_error(&format!(
                "the key name is not allowed: {reason}"
            )));
        }
        let bytes = STANDARD
            .decode(encoded)
            .map_err(|error| line_error(&format!("the signature is not base64: {error}")))?;
        if bytes.len() < 5 {
            return Err(line_error("the signature is shorter than 5 bytes"));
        }
        let key_id = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if name != verifier.name || key_id != verifier.key_id {
            let label = format!("{name}+{key_id:08x}");
            if !found.contains(&label) {
                found.push(label);
            }
            continue;
        }
        let bad = || NoteError::BadSignature {
            name: name.to_owned(),
            key_id,
        };
        let signature = <[u8; 64]>::try_from(&bytes[4..]).map_err(|_| bad())?;
        verifier
            .key
            .verify_strict(text.as_bytes(), &Signature::from_bytes(&signature))
            .map_err(|_| bad())?;
        verified = true;
    }
    if !verified {
        return Err(NoteError::NotSignedBy {
            key: verifier.label(),
            found,
        });
    }
    Ok(text.to_owned())
}
