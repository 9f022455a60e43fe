//! Human output never carries a producer's control characters to the
//! operator's terminal: message ids, event types, error texts and header
//! values come from whoever published the dead letter, and an escape
//! sequence among them could rewrite the screen or the clipboard (OSC 52).
//! [`Escaping`] writes every C0 control except newline and tab, DEL, and the
//! C1 controls (U+0080–U+009F) as visible escapes (`\x1b`, `\u{9b}`). JSON
//! output needs no such filter: serde_json escapes control characters in
//! strings, as JSON requires (RFC 8259 §7).

use std::io::{self, Write};

/// A writer that escapes control characters on their way to `inner`.
pub struct Escaping<W: Write> {
    inner: W,
    /// The previous write ended with 0xC2, the lead byte of U+0080–U+00BF.
    lead: bool,
}

impl<W: Write> Escaping<W> {
    /// Wraps `inner`.
    pub fn new(inner: W) -> Self {
        Self { inner, lead: false }
    }
}

impl<W: Write> Write for Escaping<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut out = Vec::with_capacity(buf.len());
        for &byte in buf {
            if self.lead {
                self.lead = false;
                if (0x80..=0x9f).contains(&byte) {
                    out.extend_from_slice(format!("\\u{{{byte:x}}}").as_bytes());
                    continue;
                }
                out.push(0xc2);
            }
            match byte {
                0xc2 => self.lead = true,
                b'\n' | b'\t' => out.push(byte),
                0x00..=0x1f | 0x7f => out.extend_from_slice(format!("\\x{byte:02x}").as_bytes()),
                _ => out.push(byte),
            }
        }
        self.inner.write_all(&out)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.lead {
            self.lead = false;
            self.inner.write_all(&[0xc2])?;
        }
        self.inner.flush()
    }
}

impl<W: Write> Drop for Escaping<W> {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

/// `text` with its control characters escaped as [`Escaping`] writes them,
/// for output that cannot go through it (the live progress bar).
pub fn visible(text: &str) -> String {
    let mut out = Vec::with_capacity(text.len());
    {
        let mut writer = Escaping::new(&mut out);
        let _ = writer.write_all(text.as_bytes());
    }
    String::from_utf8(out)
        .unwrap_or_else(|error| String::from_utf8_lossy(error.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(parts: &[&[u8]]) -> String {
        let mut out = Vec::new();
        {
            let mut writer = Escaping::new(&mut out);
            for part in parts {
                writer.write_all(part).unwrap();
            }
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn controls_become_visible_and_text_stays() {
        assert_eq!(
            escaped(&[b"order.\x1b]52;c;aGk=\x07 ok\n\tnext"]),
            "order.\\x1b]52;c;aGk=\\x07 ok\n\tnext"
        );
        assert_eq!(escaped(&["\r\u{1b}[2K".as_bytes()]), "\\x0d\\x1b[2K");
        assert_eq!(
            escaped(&["bestellung.ge\u{e4}ndert €".as_bytes()]),
            "bestellung.ge\u{e4}ndert €"
        );
    }

    #[test]
    fn c1_controls_are_escaped_even_split_across_writes() {
        let csi = "\u{9b}2K".as_bytes();
        assert_eq!(escaped(&[csi]), "\\u{9b}2K");
        assert_eq!(escaped(&[&csi[..1], &csi[1..]]), "\\u{9b}2K");
        // U+00A0 shares the lead byte and stays.
        assert_eq!(escaped(&["a\u{a0}b".as_bytes()]), "a\u{a0}b");
    }
}
