//! Body helpers: compression sniffing by magic bytes and a readable preview.
//!
//! Bodies are always kept byte-exact for replay; decompression happens only for
//! the preview, never silently on the stored bytes.

use std::io::Read;

use redrive_proto::v1::BodyCompression;

/// At most this many bytes of preview text.
pub const PREVIEW_LIMIT_BYTES: usize = 64 * 1024;

/// Gzip magic bytes (RFC 1952 §2.3.1).
const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
/// Zstandard frame magic number 0xFD2FB528, little-endian (RFC 8878 §3.1.1).
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];

/// The compression `body` is in, judged by its first bytes.
pub fn sniff(body: &[u8]) -> BodyCompression {
    if body.starts_with(GZIP_MAGIC) {
        BodyCompression::Gzip
    } else if body.starts_with(ZSTD_MAGIC) {
        BodyCompression::Zstd
    } else {
        BodyCompression::None
    }
}

/// A readable rendition of `body`: decompressed when gzip or zstd (at most
/// [`PREVIEW_LIMIT_BYTES`] of output), pretty-printed when JSON, with invalid
/// UTF-8 replaced; cut at [`PREVIEW_LIMIT_BYTES`] with a note. A body that claims
/// to be compressed but does not decompress is shown as it is, with a note.
pub fn preview(body: &[u8]) -> String {
    let mut notes = Vec::new();
    let decompressed = match sniff(body) {
        BodyCompression::Gzip => {
            let mut out = Vec::new();
            let reader = flate2::read::MultiGzDecoder::new(body);
            match reader
                .take(PREVIEW_LIMIT_BYTES as u64 + 1)
                .read_to_end(&mut out)
            {
                Ok(_) => {
                    notes.push("[gzip, decompressed for preview]".to_owned());
                    Some(out)
                }
                Err(error) => {
                    notes.push(format!(
                        "[looks like gzip but does not decompress: {error}]"
                    ));
                    None
                }
            }
        }
        BodyCompression::Zstd => {
            let mut out = Vec::new();
            let decoded = ruzstd::decoding::StreamingDecoder::new(body)
                .map_err(|error| error.to_string())
                .and_then(|decoder| {
                    decoder
                        .take(PREVIEW_LIMIT_BYTES as u64 + 1)
                        .read_to_end(&mut out)
                        .map_err(|error| error.to_string())
                });
            match decoded {
                Ok(_) => {
                    notes.push("[zstd, decompressed for preview]".to_owned());
                    Some(out)
                }
                Err(error) => {
                    notes.push(format!(
                        "[looks like zstd but does not decompress: {error}]"
                    ));
                    None
                }
            }
        }
        BodyCompression::None | BodyCompression::Unspecified => None,
    };
    let bytes = decompressed.as_deref().unwrap_or(body);
    let mut text = match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(json) => serde_json::to_string_pretty(&json).unwrap_or_default(),
        Err(_) => {
            if std::str::from_utf8(bytes).is_err() {
                notes.push("[not UTF-8: invalid bytes shown as \u{fffd}]".to_owned());
            }
            String::from_utf8_lossy(&bytes[..bytes.len().min(PREVIEW_LIMIT_BYTES + 1)]).into_owned()
        }
    };
    if text.len() > PREVIEW_LIMIT_BYTES {
        let mut cut = PREVIEW_LIMIT_BYTES;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        notes.push(format!("[cut at {PREVIEW_LIMIT_BYTES} bytes]"));
    }
    if notes.is_empty() {
        text
    } else {
        format!("{}\n{text}", notes.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn gzip_bodies_are_sniffed_and_previewed_decompressed() {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(br#"{"order_id":"o-1"}"#).unwrap();
        let body = encoder.finish().unwrap();
        assert_eq!(sniff(&body), BodyCompression::Gzip);
        let text = preview(&body);
        assert!(text.contains("gzip"), "{text}");
        assert!(text.contains("\"order_id\": \"o-1\""), "{text}");
    }

    #[test]
    fn zstd_is_sniffed_and_a_broken_frame_is_shown_as_is() {
        let body = [0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x01];
        assert_eq!(sniff(&body), BodyCompression::Zstd);
        assert!(preview(&body).contains("does not decompress"));
    }

    #[test]
    fn binary_and_long_bodies_are_marked() {
        assert!(preview(&[0xff, 0xfe, 0x00]).contains("not UTF-8"));
        let long = vec![b'a'; PREVIEW_LIMIT_BYTES + 10];
        let text = preview(&long);
        assert!(text.contains("cut at"));
        assert!(text.len() < PREVIEW_LIMIT_BYTES + 100);
    }
}
