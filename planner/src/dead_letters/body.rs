//! Body helpers: compression sniffing by magic bytes and a readable preview.
//!
//! Bodies are always kept byte-exact for replay; decompression ([`decode`])
//! happens only to read them (message keys, JSON checks, event times,
//! previews), capped at a byte limit, never on the stored bytes.

use std::io::Read;

use redrive_proto::v1::BodyCompression;

/// At most this many bytes of preview text.
pub const PREVIEW_LIMIT_BYTES: usize = 64 * 1024;

/// Gzip magic bytes (RFC 1952 §2.3.1).
const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
/// Zstandard frame magic number 0xFD2FB528, little-endian (RFC 8878 §3.1.1).
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];

/// Bzip2 stream header: `BZh` and the block size `1`..`9` (the format of
/// bzip2 1.0, sourceware.org/bzip2).
fn has_bzip2_magic(body: &[u8]) -> bool {
    matches!(body, [b'B', b'Z', b'h', b'1'..=b'9', ..])
}

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

/// A compression codec Redrive can read a body through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// Gzip (RFC 1952), magic `1f 8b`.
    Gzip,
    /// Zlib-wrapped deflate (RFC 1950): a 2-byte header whose big-endian value
    /// is a multiple of 31 with compression method 8. HTTP's and most AMQP
    /// clients' `deflate` means this.
    Zlib,
    /// Raw deflate (RFC 1951): no header, so only when declared `deflate` and
    /// the body has no zlib header.
    Deflate,
    /// Zstandard (RFC 8878), magic `28 b5 2f fd`.
    Zstd,
    /// Bzip2, magic `BZh1`..`BZh9`.
    Bzip2,
}

impl Codec {
    /// The codec's name, as notes print it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Gzip => "gzip",
            Self::Zlib => "zlib",
            Self::Deflate => "deflate",
            Self::Zstd => "zstd",
            Self::Bzip2 => "bzip2",
        }
    }
}

/// Headers that frameworks declare a body's compression in, besides the
/// `content_encoding` property: Celery/kombu's `compression` (kombu's
/// `compression.py` names: `application/x-gzip` for zlib, aliases `gzip`,
/// `zlib`; `application/x-bz2`, aliases `bzip2`, `bzip`; `application/zstd`,
/// aliases `zstd`, `zstandard`; `application/x-lzma` and
/// `application/x-brotli` are not read, see docs/known-limits.md) and a
/// `Content-Encoding` header copied from HTTP.
pub const ENCODING_HEADERS: &[&str] = &["compression", "content-encoding", "Content-Encoding"];

/// Why a body could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Decompressing would exceed the cap (a decompression bomb, or just big).
    #[error("{codec} body decompresses to more than {limit} bytes (the planner's body limit)")]
    TooLarge {
        /// The codec.
        codec: &'static str,
        /// The cap in bytes.
        limit: usize,
    },
    /// The bytes are not a valid stream of the codec.
    #[error("body looks like {codec} but does not decompress: {error}")]
    Corrupt {
        /// The codec.
        codec: &'static str,
        /// The decoder's message.
        error: String,
    },
}

fn has_zlib_header(body: &[u8]) -> bool {
    match body {
        [cmf, flg, ..] => {
            cmf & 0x0f == 8 && cmf >> 4 <= 7 && (u16::from(*cmf) << 8 | u16::from(*flg)) % 31 == 0
        }
        _ => false,
    }
}

/// The codec `body` is in: by magic bytes first (they cannot lie about the
/// bytes), then by `declared` (a `content_encoding` value or a framework
/// header's value, case-insensitive). `None`: read the body as it is.
pub fn codec_of(body: &[u8], declared: Option<&str>) -> Option<Codec> {
    let declared = declared.map(str::to_ascii_lowercase).unwrap_or_default();
    let says = |word: &str| declared.contains(word);
    if body.starts_with(GZIP_MAGIC) {
        Some(Codec::Gzip)
    } else if body.starts_with(ZSTD_MAGIC) {
        Some(Codec::Zstd)
    } else if has_bzip2_magic(body) || says("bz2") || says("bzip") {
        // Undeclared: only a body that really decompresses counts ([`decode`]).
        Some(Codec::Bzip2)
    } else if has_zlib_header(body) && (says("zlib") || says("deflate") || says("gzip")) {
        // kombu registers zlib under `application/x-gzip`.
        Some(Codec::Zlib)
    } else if has_zlib_header(body) && declared.is_empty() {
        // Undeclared: only a body that really inflates counts ([`decode`]).
        Some(Codec::Zlib)
    } else if says("deflate") {
        Some(Codec::Deflate)
    } else {
        None
    }
}

/// A zlib or bzip2 guess from the first bytes alone, with nothing
/// declared: such a body that does not decompress is read as it is (plain
/// text may start like them), where gzip and zstd magic cannot mislead.
fn sniffed_only(codec: Codec, declared: Option<&str>) -> bool {
    matches!(codec, Codec::Zlib | Codec::Bzip2) && declared.is_none_or(str::is_empty)
}

/// Up to `limit` bytes of `body` decompressed with `codec`, and whether there
/// was more.
fn inflate(codec: Codec, body: &[u8], limit: usize) -> Result<(Vec<u8>, bool), String> {
    let cap = limit as u64 + 1;
    let mut out = Vec::new();
    let read = match codec {
        Codec::Gzip => flate2::read::MultiGzDecoder::new(body)
            .take(cap)
            .read_to_end(&mut out)
            .map_err(|error| error.to_string()),
        Codec::Zlib => flate2::read::ZlibDecoder::new(body)
            .take(cap)
            .read_to_end(&mut out)
            .map_err(|error| error.to_string()),
        Codec::Deflate => flate2::read::DeflateDecoder::new(body)
            .take(cap)
            .read_to_end(&mut out)
            .map_err(|error| error.to_string()),
        Codec::Bzip2 => bzip2::read::MultiBzDecoder::new(body)
            .take(cap)
            .read_to_end(&mut out)
            .map_err(|error| error.to_string()),
        Codec::Zstd => ruzstd::decoding::StreamingDecoder::new(body)
            .map_err(|error| error.to_string())
            .and_then(|decoder| {
                decoder
                    .take(cap)
                    .read_to_end(&mut out)
                    .map_err(|error| error.to_string())
            }),
    };
    read?;
    let more = out.len() > limit;
    out.truncate(limit);
    Ok((out, more))
}

/// `body` as the application wrote it: decompressed when [`codec_of`] names a
/// codec, at most `limit` bytes of output (never more is held in memory, so a
/// decompression bomb costs at most `limit` bytes), else borrowed as it is.
/// Returns the codec used, if any. An undeclared zlib-looking body that does
/// not inflate is read as it is.
///
/// Used for message keys, JSON checks, event-time pointers and previews; the
/// stored and replayed bytes are always the captured ones.
///
/// # Errors
/// [`DecodeError::TooLarge`] above `limit`; [`DecodeError::Corrupt`] when the
/// body has a codec's magic (or declares one) but does not decompress.
pub fn decode<'a>(
    body: &'a [u8],
    declared: Option<&str>,
    limit: usize,
) -> Result<(std::borrow::Cow<'a, [u8]>, Option<Codec>), DecodeError> {
    let Some(codec) = codec_of(body, declared) else {
        return Ok((std::borrow::Cow::Borrowed(body), None));
    };
    match inflate(codec, body, limit) {
        Ok((_, true)) => Err(DecodeError::TooLarge {
            codec: codec.name(),
            limit,
        }),
        Ok((bytes, false)) => Ok((std::borrow::Cow::Owned(bytes), Some(codec))),
        Err(_) if sniffed_only(codec, declared) => Ok((std::borrow::Cow::Borrowed(body), None)),
        Err(error) => Err(DecodeError::Corrupt {
            codec: codec.name(),
            error,
        }),
    }
}

/// Whether a declared encoding names a codec [`codec_of`] reads.
fn names_a_codec(declared: &str) -> bool {
    let declared = declared.to_ascii_lowercase();
    [
        "gzip",
        "zlib",
        "deflate",
        "zstd",
        "zstandard",
        "bz2",
        "bzip",
    ]
    .iter()
    .any(|word| declared.contains(word))
}

/// The compression a message declares: the first of its `content_encoding`
/// property and [`ENCODING_HEADERS`] that names a codec, else the first
/// present. kombu writes its charset (`utf-8`) into `content_encoding` and
/// the compression into its `compression` header, so a property that names
/// no codec must not hide the header.
pub fn declared_encoding(
    properties: &redrive_proto::v1::MessageProperties,
    headers: &redrive_proto::v1::HeaderTable,
) -> Option<String> {
    let declared: Vec<String> = properties
        .content_encoding
        .iter()
        .cloned()
        .chain(
            ENCODING_HEADERS
                .iter()
                .filter_map(|name| crate::dead_letters::death::text_of(headers, name)),
        )
        .filter(|encoding| !encoding.is_empty())
        .collect();
    declared
        .iter()
        .find(|encoding| names_a_codec(encoding))
        .or_else(|| declared.first())
        .cloned()
}

/// Only the `content_encoding` of a stored `redrive.v1.MessageProperties`
/// (prost skips the other fields unread).
#[derive(Clone, PartialEq, prost::Message)]
struct StoredContentEncoding {
    #[prost(string, optional, tag = "2")]
    content_encoding: Option<String>,
}

/// A stored `redrive.v1.HeaderTable` with its values left encoded: a map
/// entry's message value and `bytes` are the same on the wire, so only the
/// values [`declared_encoding_of_stored`] reads are decoded.
#[derive(Clone, PartialEq, prost::Message)]
struct StoredHeaderFields {
    #[prost(btree_map = "string, bytes", tag = "1")]
    fields: std::collections::BTreeMap<String, Vec<u8>>,
}

/// [`declared_encoding`] of stored properties and headers (their protobuf
/// encodings, as capture stores them), decoding only the content encoding
/// property and the [`ENCODING_HEADERS`] values, not the rest of the header
/// table (`x-death` and its tables): the precheck reads it per candidate.
/// Bytes that do not decode declare nothing.
pub fn declared_encoding_of_stored(properties: &[u8], headers: &[u8]) -> Option<String> {
    use prost::Message as _;
    let properties = redrive_proto::v1::MessageProperties {
        content_encoding: StoredContentEncoding::decode(properties)
            .unwrap_or_default()
            .content_encoding,
        ..Default::default()
    };
    let stored = StoredHeaderFields::decode(headers).unwrap_or_default();
    let headers = redrive_proto::v1::HeaderTable {
        fields: ENCODING_HEADERS
            .iter()
            .filter_map(|name| {
                let value =
                    redrive_proto::v1::HeaderValue::decode(stored.fields.get(*name)?.as_slice())
                        .ok()?;
                Some(((*name).to_owned(), value))
            })
            .collect(),
    };
    declared_encoding(&properties, &headers)
}

/// A readable rendition of `body` (`declared`: its declared encoding, see
/// [`declared_encoding`]): decompressed when gzip, zlib, deflate, zstd or bzip2 (at
/// most [`PREVIEW_LIMIT_BYTES`] of output), pretty-printed when JSON, with
/// invalid UTF-8 replaced; cut at [`PREVIEW_LIMIT_BYTES`] with a note. A body
/// that claims to be compressed but does not decompress is shown as it is,
/// with a note.
pub fn preview(body: &[u8], declared: Option<&str>) -> String {
    let mut notes = Vec::new();
    let decompressed = match codec_of(body, declared) {
        None => None,
        Some(codec) => match inflate(codec, body, PREVIEW_LIMIT_BYTES) {
            Ok((out, more)) => {
                notes.push(format!("[{}, decompressed for preview]", codec.name()));
                if more {
                    notes.push(format!("[cut at {PREVIEW_LIMIT_BYTES} bytes]"));
                }
                Some(out)
            }
            Err(_) if sniffed_only(codec, declared) => None,
            Err(error) => {
                notes.push(format!(
                    "[looks like {} but does not decompress: {error}]",
                    codec.name()
                ));
                None
            }
        },
    };
    let bytes = decompressed.as_deref().unwrap_or(body);
    // Valid JSON is re-indented from its own tokens, so its keys keep their
    // order (a map would sort them) and numbers their spelling.
    let json = std::str::from_utf8(bytes)
        .ok()
        .filter(|text| serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok());
    let mut text = match json {
        Some(json) => redrive_proto::json::pretty(json),
        None => {
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
        if !notes.iter().any(|note| note.starts_with("[cut at")) {
            notes.push(format!("[cut at {PREVIEW_LIMIT_BYTES} bytes]"));
        }
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

    use prost::Message as _;

    use super::*;

    #[test]
    fn a_json_preview_keeps_the_body_key_order() {
        let text = preview(br#"{"zeta":1,"alpha":2.50}"#, None);
        assert_eq!(text, "{\n  \"zeta\": 1,\n  \"alpha\": 2.50\n}");
    }

    #[test]
    fn gzip_bodies_are_sniffed_and_previewed_decompressed() {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(br#"{"order_id":"o-1"}"#).unwrap();
        let body = encoder.finish().unwrap();
        assert_eq!(sniff(&body), BodyCompression::Gzip);
        let text = preview(&body, None);
        assert!(text.contains("gzip"), "{text}");
        assert!(text.contains("\"order_id\": \"o-1\""), "{text}");
    }

    #[test]
    fn zstd_is_sniffed_and_a_broken_frame_is_shown_as_is() {
        let body = [0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x01];
        assert_eq!(sniff(&body), BodyCompression::Zstd);
        assert!(preview(&body, None).contains("does not decompress"));
    }

    #[test]
    fn binary_and_long_bodies_are_marked() {
        assert!(preview(&[0xff, 0xfe, 0x00], None).contains("not UTF-8"));
        let long = vec![b'a'; PREVIEW_LIMIT_BYTES + 10];
        let text = preview(&long, None);
        assert!(text.contains("cut at"));
        assert!(text.len() < PREVIEW_LIMIT_BYTES + 100);
    }

    fn compressed(codec: Codec, data: &[u8]) -> Vec<u8> {
        match codec {
            Codec::Gzip => {
                let mut e =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            Codec::Zlib => {
                let mut e =
                    flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            Codec::Deflate => {
                let mut e =
                    flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            Codec::Zstd => {
                ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
            }
            Codec::Bzip2 => {
                let mut e = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
        }
    }

    #[test]
    fn every_codec_is_read_sniffed_declared_or_by_a_framework_header() {
        use redrive_proto::v1::{HeaderTable, HeaderValue, MessageProperties, header_value::Value};
        let json = br#"{"order_id":"o-7"}"#;
        // (codec, content_encoding, kombu `compression` header)
        for (codec, encoding, kombu) in [
            (Codec::Gzip, "gzip", "gzip"),
            (Codec::Zlib, "deflate", "application/x-gzip"),
            (Codec::Zlib, "zlib", "zlib"),
            (Codec::Deflate, "deflate", "deflate"),
            (Codec::Zstd, "zstd", "application/zstd"),
            (Codec::Bzip2, "bzip2", "application/x-bz2"),
        ] {
            let body = compressed(codec, json);
            // Sniffed (raw deflate has no magic: only declared).
            if codec != Codec::Deflate {
                let (decoded, used) = decode(&body, None, 1024).unwrap();
                assert_eq!(
                    (&*decoded, used),
                    (&json[..], Some(codec)),
                    "sniffed {codec:?}"
                );
            }
            // Declared by content_encoding, then by kombu's header.
            let by_property = MessageProperties {
                content_encoding: Some(encoding.into()),
                ..Default::default()
            };
            let mut headers = HeaderTable::default();
            headers.fields.insert(
                "compression".into(),
                HeaderValue {
                    value: Some(Value::LongString(kombu.as_bytes().to_vec())),
                },
            );
            for declared in [
                declared_encoding(&by_property, &HeaderTable::default()),
                declared_encoding(&MessageProperties::default(), &headers),
            ] {
                let (decoded, used) = decode(&body, declared.as_deref(), 1024).unwrap();
                assert_eq!(
                    (&*decoded, used),
                    (&json[..], Some(codec)),
                    "{codec:?} {declared:?}"
                );
                assert!(preview(&body, declared.as_deref()).contains("\"order_id\": \"o-7\""));
            }
        }
        // kombu: its charset in content_encoding, the codec in its header.
        let kombu = MessageProperties {
            content_encoding: Some("utf-8".into()),
            ..Default::default()
        };
        let mut headers = HeaderTable::default();
        headers.fields.insert(
            "compression".into(),
            HeaderValue {
                value: Some(Value::LongString(b"application/x-gzip".to_vec())),
            },
        );
        let declared = declared_encoding(&kombu, &headers);
        assert_eq!(declared.as_deref(), Some("application/x-gzip"));
        let zlib = compressed(Codec::Zlib, json);
        let (decoded, used) = decode(&zlib, declared.as_deref(), 1024).unwrap();
        assert_eq!((&*decoded, used), (&json[..], Some(Codec::Zlib)));
        assert_eq!(
            declared_encoding(&kombu, &HeaderTable::default()).as_deref(),
            Some("utf-8")
        );
        // Read from the stored encodings, among other headers: the same.
        headers.fields.insert(
            "x-death".into(),
            HeaderValue {
                value: Some(Value::Array(redrive_proto::v1::HeaderArray {
                    values: vec![HeaderValue {
                        value: Some(Value::LongString(b"gzip".to_vec())),
                    }],
                })),
            },
        );
        let plain = MessageProperties::default();
        let bare = HeaderTable::default();
        for (properties, headers) in [
            (&kombu, &headers),
            (&kombu, &bare),
            (&plain, &headers),
            (&plain, &bare),
        ] {
            assert_eq!(
                declared_encoding_of_stored(&properties.encode_to_vec(), &headers.encode_to_vec()),
                declared_encoding(properties, headers),
            );
        }
        assert_eq!(declared_encoding_of_stored(b"\xff\xff", b"\xff"), None);
        // Plain text that starts like bzip2 is read as it is when undeclared.
        let (plain, used) = decode(b"BZh9 is a line of text", None, 1024).unwrap();
        assert_eq!((&*plain, used), (&b"BZh9 is a line of text"[..], None));
        // Declared but broken: refused with a note, never read as something else.
        let error = decode(b"not bzip2", Some("application/x-bz2"), 1024).unwrap_err();
        assert!(
            matches!(error, DecodeError::Corrupt { codec: "bzip2", .. }),
            "{error}"
        );
    }

    #[test]
    fn a_bomb_of_every_codec_stops_at_the_cap() {
        let zeros = vec![0_u8; 4 * 1024 * 1024];
        for (codec, declared) in [
            (Codec::Gzip, None),
            (Codec::Zlib, None),
            (Codec::Deflate, Some("deflate")),
            (Codec::Zstd, None),
            (Codec::Bzip2, None),
        ] {
            let bomb = compressed(codec, &zeros);
            let error = decode(&bomb, declared, 64 * 1024).unwrap_err();
            assert!(
                matches!(error, DecodeError::TooLarge { limit: 65_536, .. }),
                "{codec:?}: {error}"
            );
        }
    }

    #[test]
    fn every_codec_decodes_by_magic_or_declaration() {
        let json = br#"{"order_id":"o-1"}"#;
        for (codec, declared) in [
            (Codec::Gzip, None),
            (Codec::Zlib, None),
            (Codec::Zlib, Some("deflate")),
            (Codec::Zlib, Some("application/x-gzip")),
            (Codec::Deflate, Some("deflate")),
            (Codec::Zstd, None),
        ] {
            let body = compressed(codec, json);
            let (decoded, used) = decode(&body, declared, 1024).unwrap();
            assert_eq!(&*decoded, json, "{codec:?} {declared:?}");
            assert_eq!(used, Some(codec));
        }
        let (plain, used) = decode(json, Some("identity"), 1024).unwrap();
        assert_eq!((&*plain, used), (&json[..], None));
        assert!(preview(&compressed(Codec::Zlib, json), None).contains("zlib"));
    }

    #[test]
    fn a_decompression_bomb_stops_at_the_cap() {
        let bomb = compressed(Codec::Gzip, &vec![0_u8; 10 * 1024 * 1024]);
        assert!(bomb.len() < 64 * 1024);
        let error = decode(&bomb, None, 1024 * 1024).unwrap_err();
        assert!(
            matches!(
                error,
                DecodeError::TooLarge {
                    limit: 1_048_576,
                    ..
                }
            ),
            "{error}"
        );
        let error = decode(&[0x1f, 0x8b, 0, 1], Some("gzip"), 1024).unwrap_err();
        assert!(matches!(error, DecodeError::Corrupt { .. }), "{error}");
    }
}
