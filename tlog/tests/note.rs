//! C2SP signed notes and checkpoints: known vectors, round trips, refusals.
//!
//! Known vectors:
//! - golang.org/x/mod `sumdb/note/note_test.go` (github.com/golang/mod,
//!   commit fe2ec04): the PeterNeumann signer and verifier keys of
//!   `TestNewSigner`/`TestNewVerifier`, the signed note of `TestSign`, the
//!   EnochRoot key and both signatures of `TestOpen`;
//! - C2SP `signed-note.md` (github.com/C2SP/C2SP, commit 5ba5ee8), section
//!   "Verifier keys", "Example": the `example.com/foo` key and note;
//! - C2SP `tlog-checkpoint.md`, the example checkpoint text.

use redrive_tlog::Hash;
use redrive_tlog::checkpoint::{Checkpoint, CheckpointError, open_checkpoint, sign_checkpoint};
use redrive_tlog::note::{KeyError, NoteError, Signer, Verifier, ed25519_key_id, open};

const PETER_SIGNER: &str =
    "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz";
const PETER_VERIFIER: &str = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW";
const ENOCH_VERIFIER: &str = "EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop";
const GO_TEXT: &str = "If you think cryptography is the answer to your problem,\n\
                       then you don't know what your problem is.\n";
const PETER_SIG: &str = "\u{2014} PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n";
const ENOCH_SIG: &str = "\u{2014} EnochRoot rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOTGwnWLox33WWd1RvMc+QQ=\n";

fn test_signer(name: &str, byte: u8) -> Signer {
    Signer::from_seed(name, &[byte; 32]).unwrap()
}

#[test]
fn go_signer_signs_the_known_note() {
    let signer = Signer::from_key_text(PETER_SIGNER).unwrap();
    assert_eq!(signer.name(), "PeterNeumann");
    assert_eq!(signer.key_id(), 0xc74f20a3);
    assert_eq!(signer.key_text(), PETER_SIGNER);
    assert_eq!(signer.verifier().key_text(), PETER_VERIFIER);
    let note = signer.sign(GO_TEXT).unwrap();
    assert_eq!(note, format!("{GO_TEXT}\n{PETER_SIG}"));
}

#[test]
fn go_verifiers_open_the_known_note() {
    let peter = Verifier::from_key_text(PETER_VERIFIER).unwrap();
    let enoch = Verifier::from_key_text(ENOCH_VERIFIER).unwrap();
    assert_eq!(peter.key_text(), PETER_VERIFIER);
    assert_eq!(enoch.key_text(), ENOCH_VERIFIER);
    assert_eq!(enoch.key_id(), 0xaf0cfe78);
    let both = format!("{GO_TEXT}\n{PETER_SIG}{ENOCH_SIG}");
    assert_eq!(open(&both, &peter).unwrap(), GO_TEXT);
    assert_eq!(open(&both, &enoch).unwrap(), GO_TEXT);
    // Enoch's signature alone is no signature by Peter.
    let error = open(&format!("{GO_TEXT}\n{ENOCH_SIG}"), &peter).unwrap_err();
    assert_eq!(
        error.to_string(),
        "not signed by PeterNeumann+c74f20a3 (signed by: EnochRoot+af0cfe78)"
    );
}

#[test]
fn c2sp_example_note_opens() {
    let verifier = Verifier::from_key_text(
        "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k",
    )
    .unwrap();
    let note = "This is an example message.\n\n\u{2014} example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n";
    assert_eq!(
        open(note, &verifier).unwrap(),
        "This is an example message.\n"
    );
    let changed = note.replace("example message", "exemplary message");
    assert!(matches!(
        open(&changed, &verifier),
        Err(NoteError::BadSignature { .. })
    ));
}

#[test]
fn key_id_is_sha256_of_name_newline_type_and_key() {
    let verifier = Verifier::from_key_text(PETER_VERIFIER).unwrap();
    assert_eq!(
        ed25519_key_id("PeterNeumann", &verifier.public_key()),
        0xc74f20a3
    );
}

#[test]
fn sign_then_open_round_trip() {
    let signer = Signer::generate("log.example/audit").unwrap();
    let verifier = Verifier::from_key_text(&signer.verifier().key_text()).unwrap();
    assert_eq!(verifier, signer.verifier());
    let text = "first line\n\nafter an empty line\n";
    let note = signer.sign(text).unwrap();
    assert!(note.starts_with(text));
    assert!(note.ends_with('\n'));
    assert_eq!(open(&note, &verifier).unwrap(), text);
    // The private key text reads back as the same key.
    let again = Signer::from_key_text(&format!("  {}\n", signer.key_text())).unwrap();
    assert_eq!(again.key_text(), signer.key_text());
    assert_eq!(again.sign(text).unwrap(), note);
    // Debug never shows the key.
    let debug = format!("{signer:?}");
    assert!(!debug.contains(&signer.key_text()[30..]), "{debug}");
}

#[test]
fn open_with_another_key_names_the_signer() {
    let signer = test_signer("log.example/audit", 1);
    let other = test_signer("other.example/key", 2);
    let note = other.sign("hello\n").unwrap();
    let error = open(&note, &signer.verifier()).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "not signed by log.example/audit+{:08x} (signed by: other.example/key+{:08x})",
            signer.key_id(),
            other.key_id()
        )
    );
    // Same name, another key: a different key id, so an unknown signature.
    let impostor = test_signer("log.example/audit", 3);
    let note = impostor.sign("hello\n").unwrap();
    assert!(matches!(
        open(&note, &signer.verifier()),
        Err(NoteError::NotSignedBy { .. })
    ));
    // Other signatures next to the right one are ignored.
    let cosigned = format!("{}{}", signer.sign("hello\n").unwrap(), &note[7..]);
    assert_eq!(open(&cosigned, &signer.verifier()).unwrap(), "hello\n");
}

#[test]
fn modified_text_fails() {
    let signer = test_signer("log.example/audit", 1);
    let note = signer.sign("size 5\n").unwrap();
    let changed = note.replacen("size 5", "size 6", 1);
    let error = open(&changed, &signer.verifier()).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("bad signature by log.example/audit"),
        "{error}"
    );
    // A flipped signature byte fails too.
    let verifier = signer.verifier();
    let mut bytes = note.clone().into_bytes();
    let last = bytes.len() - 10;
    bytes[last] = if bytes[last] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(bytes).unwrap();
    assert!(open(&flipped, &verifier).is_err());
}

#[test]
fn malformed_notes_fail() {
    let signer = test_signer("log.example/audit", 1);
    let verifier = signer.verifier();
    let note = signer.sign("text\n").unwrap();
    for bad in [
        String::new(),
        "text\n".to_owned(),
        "text\n\n".to_owned(),
        note.trim_end().to_owned(),
        note.replace('\u{2014}', "-"),
        note.replace("text\n", "te\tx\n"),
        format!("{note}extra line\n"),
        note.replace("log.example/audit ", "log.example/audit  "),
    ] {
        assert!(
            matches!(open(&bad, &verifier), Err(NoteError::Malformed(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn sign_refuses_bad_text() {
    let signer = test_signer("log.example/audit", 1);
    for bad in ["", "no newline", "a\rb\n", "nul\0\n"] {
        assert!(
            matches!(signer.sign(bad), Err(NoteError::InvalidText(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn key_names_follow_the_spec() {
    for bad in [
        "",
        "a+b",
        "a b",
        "a\tb",
        "a\u{a0}b",
        "a\u{2003}b",
        "a\u{1}b",
    ] {
        assert!(
            matches!(Signer::generate(bad), Err(KeyError::BadName { .. })),
            "{bad:?}"
        );
    }
    assert!(Signer::generate("example.com/log42").is_ok());
    assert!(Signer::generate("ünïcødé").is_ok());
}

#[test]
fn key_text_errors_say_what_is_wrong() {
    let error = |text: &str| Signer::from_key_text(text).unwrap_err().to_string();
    assert!(error(PETER_VERIFIER).contains("PRIVATE+KEY+"));
    assert!(error("PRIVATE+KEY+PeterNeumann+c74f20a3+!!!!").contains("base64"));
    // Algorithm byte 0x02 instead of 0x01.
    assert!(
        error("PRIVATE+KEY+PeterNeumann+c74f20a3+AoEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz")
            .contains("algorithm byte is 0x02")
    );
    assert!(
        error("PRIVATE+KEY+PeterNeumann+c74f20a4+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz")
            .contains("key id c74f20a4 does not match")
    );
    assert!(
        error("PRIVATE+KEY+PeterNeumann+c74f20+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz")
            .contains("not 8 hexadecimal digits")
    );
    // No message quotes the key material.
    let secret = "AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz";
    for text in [
        "PRIVATE+KEY+PeterNeumann+c74f20a4+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz",
        "PRIVATE+KEY+Peter Neumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz",
    ] {
        assert!(!error(text).contains(secret));
    }
    // A wrong key length with its id adjusted, and an unknown algorithm with
    // its id adjusted (Go's TestNewVerifier).
    // (Go's decoder accepts the non-zero trailing bits of "Y==" and then
    // refuses the length; RFC 4648 §3.5 canonical decoding refuses them.)
    assert!(matches!(
        Verifier::from_key_text(
            "PeterNeumann+cc469956+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TWBADKEY=="
        ),
        Err(KeyError::BadBase64(_))
    ));
    let short_seed =
        "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKA==";
    assert!(matches!(
        Signer::from_key_text(short_seed),
        Err(KeyError::WrongKeyLength { len: 30 })
    ));
    assert!(matches!(
        Verifier::from_key_text(
            "PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
        ),
        Err(KeyError::WrongAlgorithm { .. })
    ));
}

/// Go's TestNewVerifier and TestNewSigner: every proper substring and every
/// one-byte increment of a key text is refused.
#[test]
fn mangled_keys_are_refused() {
    for (key, parse) in [
        (
            PETER_VERIFIER,
            (|text: &str| Verifier::from_key_text(text).is_ok()) as fn(&str) -> bool,
        ),
        (PETER_SIGNER, |text: &str| {
            Signer::from_key_text(text).is_ok()
        }),
    ] {
        assert!(parse(key));
        let bytes = key.as_bytes();
        for i in 0..=bytes.len() {
            for j in i + 1..=bytes.len() {
                if i == 0 && j == bytes.len() {
                    continue;
                }
                let part = std::str::from_utf8(&bytes[i..j]).unwrap();
                assert!(!parse(part), "{part:?} accepted");
            }
        }
        for i in 0..bytes.len() {
            let mut changed = bytes.to_vec();
            changed[i] += 1;
            let changed = String::from_utf8(changed).unwrap();
            assert!(!parse(&changed), "{changed:?} accepted");
        }
    }
}

fn root(byte: u8) -> Hash {
    [byte; 32]
}

#[test]
fn checkpoint_text_round_trip() {
    let checkpoint = Checkpoint {
        origin: "log.example/audit".into(),
        size: 20852163,
        root: root(7),
        extensions: vec!["ext one".into()],
    };
    let text = checkpoint.to_text();
    assert_eq!(
        text,
        "log.example/audit\n20852163\nBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=\next one\n"
    );
    assert_eq!(Checkpoint::parse(&text).unwrap(), checkpoint);
}

#[test]
fn c2sp_example_checkpoint_parses() {
    let checkpoint = Checkpoint::parse(
        "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",
    )
    .unwrap();
    assert_eq!(checkpoint.origin, "example.com/behind-the-sofa");
    assert_eq!(checkpoint.size, 20852163);
    assert_eq!(
        hex::encode(checkpoint.root),
        "0ac5186a91863e8e1d90c808014aa89bf5da8e3ee1d9f07630f0378f68f1ab62"
    );
    assert!(checkpoint.extensions.is_empty());
}

#[test]
fn checkpoint_parse_is_strict() {
    let good_root = "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=";
    let cases = [
        (format!("o\n5\n{good_root}"), "does not end in a newline"),
        ("o\n5\n".to_owned(), "at least 3"),
        (format!("\n5\n{good_root}\n"), "origin is empty"),
        (format!("o\n05\n{good_root}\n"), "leading zero"),
        (format!("o\n+5\n{good_root}\n"), "not a decimal number"),
        (format!("o\n-5\n{good_root}\n"), "not a decimal number"),
        (format!("o\n\n{good_root}\n"), "tree size is empty"),
        (format!("o\n 5\n{good_root}\n"), "not a decimal number"),
        (format!("o\n18446744073709551616\n{good_root}\n"), "64 bits"),
        ("o\n5\nAAAA\n".to_owned(), "3 bytes long, not 32"),
        ("o\n5\nnot base64!\n".to_owned(), "not base64"),
        (
            "o\n5\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2J=\n".to_owned(),
            "base64",
        ),
        (format!("o\n5\n{good_root}\n\n"), "extension line is empty"),
        (
            format!("o\n5\n{good_root}\next\n\n"),
            "extension line is empty",
        ),
    ];
    for (text, expected) in cases {
        let error = Checkpoint::parse(&text).unwrap_err().to_string();
        assert!(error.contains(expected), "{text:?}: {error}");
    }
    assert_eq!(
        Checkpoint::parse(&format!("o\n0\n{good_root}\n"))
            .unwrap()
            .size,
        0
    );
}

#[test]
fn signed_checkpoint_round_trip() {
    let signer = test_signer("log.example/audit", 1);
    let checkpoint = Checkpoint {
        origin: "log.example/audit".into(),
        size: 3,
        root: root(9),
        extensions: vec![],
    };
    let note = sign_checkpoint(&signer, &checkpoint).unwrap();
    assert!(note.starts_with(&checkpoint.to_text()));
    assert_eq!(
        open_checkpoint(&note, &signer.verifier()).unwrap(),
        checkpoint
    );
    let other = test_signer("other.example/key", 2);
    let error = open_checkpoint(&note, &other.verifier()).unwrap_err();
    assert!(matches!(
        error,
        CheckpointError::Note(NoteError::NotSignedBy { .. })
    ));
    assert!(
        error.to_string().contains("signed by: log.example/audit+"),
        "{error}"
    );
    // A checkpoint that would not read back as itself is not signed.
    for bad in [
        Checkpoint {
            origin: "two\nlines".into(),
            ..checkpoint.clone()
        },
        Checkpoint {
            origin: String::new(),
            ..checkpoint.clone()
        },
        Checkpoint {
            extensions: vec![String::new()],
            ..checkpoint.clone()
        },
    ] {
        assert!(matches!(
            sign_checkpoint(&signer, &bad),
            Err(NoteError::InvalidText(_))
        ));
    }
}

#[test]
fn cosigning_adds_a_known_signature_line_over_the_same_text() {
    // Go's TestOpen note is signed by EnochRoot and PeterNeumann; Peter
    // cosigning Enoch's note gives Peter's known signature line after
    // Enoch's (Ed25519 is deterministic).
    let peter = Signer::from_key_text(PETER_SIGNER).unwrap();
    let enoch = Verifier::from_key_text(ENOCH_VERIFIER).unwrap();
    let enochs = format!("{GO_TEXT}\n{ENOCH_SIG}");
    let both = peter.cosign(&enochs, &enoch).unwrap();
    assert_eq!(both, format!("{GO_TEXT}\n{ENOCH_SIG}{PETER_SIG}"));
    assert_eq!(open(&both, &enoch).unwrap(), GO_TEXT);
    assert_eq!(open(&both, &peter.verifier()).unwrap(), GO_TEXT);
    // Once is enough: a note the key signed comes back as it was.
    assert_eq!(peter.cosign(&both, &enoch).unwrap(), both);
}

#[test]
fn cosigning_never_signs_a_text_the_trusted_key_did_not_sign() {
    let old = test_signer("redrive.test/old", 1);
    let new = test_signer("redrive.test/new", 2);
    let stranger = test_signer("redrive.test/stranger", 3);
    let note = old.sign("a text\n").unwrap();
    // Signed by another key than the one trusted: refused.
    assert!(matches!(
        new.cosign(&stranger.sign("a text\n").unwrap(), &old.verifier()),
        Err(NoteError::NotSignedBy { .. })
    ));
    // The text changed after the trusted key signed it: refused.
    let changed = note.replacen("a text", "b text", 1);
    assert!(matches!(
        new.cosign(&changed, &old.verifier()),
        Err(NoteError::BadSignature { .. })
    ));
    // Not a note: refused.
    assert!(matches!(
        new.cosign("a text\n", &old.verifier()),
        Err(NoteError::Malformed(_))
    ));
    let both = new.cosign(&note, &old.verifier()).unwrap();
    assert!(both.starts_with(&note));
    assert_eq!(open(&both, &new.verifier()).unwrap(), "a text\n");
}
