//! The gRPC codec of every `redrive.v1` service: prost's, with a wire check
//! in front of decoding requests, and undecodable input answered
//! `INVALID_ARGUMENT` (prost's codec says `INTERNAL`, which is the server's
//! fault by gRPC's table).
//!
//! The wire check ([`check_request`]) walks the encoded request with an
//! explicit stack, never recursing, and refuses, naming the field and the
//! limit ([`crate::limits`]):
//! - nesting deeper than [`MAX_MESSAGE_NESTING`] messages, header tables and
//!   arrays deeper than [`MAX_HEADER_NESTING`], more than
//!   [`MAX_HEADER_VALUES`] header values or [`MAX_HEADERS_BYTES`];
//! - text longer than [`limits::text_limit`], repeated fields longer than
//!   [`limits::repeated_limit`], text with a NUL character (outside header
//!   tables, which are stored as bytes).
//!
//! Only then does prost decode (it runs without a recursion limit: headers
//! nest deeper than its fixed 100 messages allow), so a request nested
//! thousands deep never reaches a recursive function.

use std::{marker::PhantomData, sync::LazyLock};

use prost::{Message, Name, bytes::Buf};
use prost_reflect::{DescriptorPool, FieldDescriptor, Kind, MessageDescriptor};
use tonic::{
    Status,
    codec::{Codec, DecodeBuf, Decoder},
};
use tonic_prost::{ProstCodec, ProstEncoder};

use crate::limits::{
    self, MAX_HEADER_NESTING, MAX_HEADER_VALUES, MAX_HEADERS_BYTES, MAX_MESSAGE_NESTING,
};

/// Full name of the header table message, where header rules start.
const HEADER_TABLE: &str = "redrive.v1.HeaderTable";
const HEADER_ARRAY: &str = "redrive.v1.HeaderArray";
const HEADER_VALUE: &str = "redrive.v1.HeaderValue";

static POOL: LazyLock<Option<DescriptorPool>> =
    LazyLock::new(|| DescriptorPool::decode(crate::FILE_DESCRIPTOR_SET).ok());

/// The descriptors of [`crate::FILE_DESCRIPTOR_SET`], decoded once; `None`
/// when the set does not decode (never for the built crate).
pub(crate) fn descriptor_pool() -> Option<&'static DescriptorPool> {
    POOL.as_ref()
}

/// prost's codec with the wire check in front of decoding requests.
#[derive(Debug, Clone)]
pub struct CheckedCodec<T, U> {
    _types: PhantomData<(T, U)>,
}

impl<T, U> Default for CheckedCodec<T, U> {
    fn default() -> Self {
        Self {
            _types: PhantomData,
        }
    }
}

impl<T, U> Codec for CheckedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Name + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = CheckedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        CheckedDecoder { _type: PhantomData }
    }
}

/// Decodes `U` after [`check_request`] when `U` is a request.
#[derive(Debug, Clone)]
pub struct CheckedDecoder<U> {
    _type: PhantomData<U>,
}

impl<U: Message + Default + Name> Decoder for CheckedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        let name = U::full_name();
        if name.ends_with("Request") {
            let scope = if limits::STORED_DATA_MESSAGES.contains(&name.as_str())
                || limits::PER_ITEM_MESSAGES.contains(&name.as_str())
            {
                Scope::Nesting
            } else {
                Scope::All
            };
            let length = buf.remaining();
            if buf.chunk().len() >= length {
                check_request(&name, &buf.chunk()[..length], scope)
                    .map_err(Status::invalid_argument)?;
            } else {
                let bytes = buf.copy_to_bytes(length);
                check_request(&name, &bytes, scope).map_err(Status::invalid_argument)?;
                return U::decode(bytes).map(Some).map_err(undecodable);
            }
        }
        U::decode(buf).map(Some).map_err(undecodable)
    }
}

fn undecodable(error: prost::DecodeError) -> Status {
    Status::invalid_argument(format!("undecodable message: {error}"))
}

/// One message being walked.
struct Frame {
    descriptor: MessageDescriptor,
    /// Where its bytes end in the request.
    end: usize,
    /// The field of the enclosing message that holds it, and its element
    /// index when that field is repeated; `None` for the request. Paths
    /// (`rate.rationale`, `selector.ids[3]`) are spelled from these only for
    /// an error ([`Walk::path`]): a request of thousands of fields is checked
    /// without an allocation per field.
    entered_by: Option<Step>,
    /// Elements seen per repeated field number.
    counts: Vec<(u32, usize)>,
}

/// A field taken from a message to the next: the field, and the element's
/// index when it is repeated.
type Step = (FieldDescriptor, Option<usize>);

/// Header rules of the header table being walked.
struct Headers {
    /// Stack depth of its table's frame: deeper frames are inside it.
    frame_depth: usize,
    values: usize,
}

/// Which limits [`check_request`] applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every limit.
    All,
    /// Message nesting only (stored data, and stream items whose other
    /// problems are answered per item).
    Nesting,
}

/// Checks encoded request `bytes` of message `name` (full name) against the
/// wire limits in `scope`, without recursion.
///
/// # Errors
/// The first problem, naming the field path and the limit.
pub fn check_request(name: &str, bytes: &[u8], scope: Scope) -> Result<(), String> {
    let Some(pool) = POOL.as_ref() else {
        return Ok(());
    };
    let Some(root) = pool.get_message_by_name(name) else {
        return Ok(());
    };
    let mut walk = Walk {
        bytes,
        stack: vec![Frame {
            descriptor: root,
            end: bytes.len(),
            entered_by: None,
            counts: Vec::new(),
        }],
        headers: None,
        position: 0,
        stored_data: scope == Scope::Nesting,
    };
    while !walk.stack.is_empty() {
        if walk.leave_finished_frame()? {
            continue;
        }
        if let Some(field) = walk.next_field()? {
            walk.check_field(field)?;
        }
    }
    Ok(())
}

/// The state of one [`check_request`]: the request, the stack of messages
/// being walked (the root first) and where the next field starts.
struct Walk<'b> {
    bytes: &'b [u8],
    /// Never empty while walking.
    stack: Vec<Frame>,
    /// The header table being walked, if any.
    headers: Option<Headers>,
    position: usize,
    /// [`Scope::Nesting`]: only message nesting is limited.
    stored_data: bool,
}

/// A length-delimited field of a known number, read by [`Walk::next_field`].
struct FieldAt {
    field: FieldDescriptor,
    /// Where its content starts in the request.
    start: usize,
    /// Its content's length in bytes.
    length: usize,
}

impl Walk<'_> {
    /// The innermost message being walked.
    fn frame(&mut self) -> Result<&mut Frame, String> {
        self.stack
            .last_mut()
            .ok_or_else(|| "undecodable message: walked past the request".to_owned())
    }

    /// The field path from the request to the innermost message, then to
    /// `last` if given (`messages[3].headers`); empty for the request itself.
    fn path(&self, last: Option<(&FieldDescriptor, Option<usize>)>) -> String {
        let mut path = String::new();
        let steps = self
            .stack
            .iter()
            .filter_map(|frame| frame.entered_by.as_ref())
            .map(|(field, element)| (field, *element))
            .chain(last);
        for (field, element) in steps {
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(field.name());
            if let Some(element) = element {
                path.push_str(&format!("[{element}]"));
            }
        }
        path
    }

    /// Step 1: leaves the innermost message when its bytes are all read
    /// (and its header table with it); `true` when it did.
    ///
    /// # Errors
    /// A message whose last field ran past its end.
    fn leave_finished_frame(&mut self) -> Result<bool, String> {
        let position = self.position;
        let end = self.frame()?.end;
        if position < end {
            return Ok(false);
        }
        if position > end {
            return Err(format!("{}: truncated message", display(&self.path(None))));
        }
        self.stack.pop();
        let depth = self.stack.len();
        if self
            .headers
            .as_ref()
            .is_some_and(|header| depth < header.frame_depth)
        {
            self.headers = None;
        }
        Ok(true)
    }

    /// Step 2: reads the next field's key and length, moving past it;
    /// `Some` for a length-delimited field the message declares (the only
    /// ones with limits), `None` for any other.
    ///
    /// # Errors
    /// Bytes that are not protobuf, or a field running past its message.
    fn next_field(&mut self) -> Result<Option<FieldAt>, String> {
        let bytes = self.bytes;
        let mut position = self.position;
        let key = varint(bytes, &mut position).ok_or("undecodable message: bad field key")?;
        let number =
            u32::try_from(key >> 3).map_err(|_| "undecodable message: bad field number")?;
        let wire_type = key & 7;
        let length = match wire_type {
            0 => {
                varint(bytes, &mut position).ok_or("undecodable message: bad varint")?;
                self.position = position;
                return Ok(None);
            }
            1 => 8,
            5 => 4,
            2 => usize::try_from(
                varint(bytes, &mut position).ok_or("undecodable message: bad length")?,
            )
            .map_err(|_| "undecodable message: bad length")?,
            other => return Err(format!("undecodable message: wire type {other}")),
        };
        let start = position;
        let frame_end = self.frame()?.end;
        self.position = start
            .checked_add(length)
            .filter(|end| *end <= frame_end)
            .ok_or("undecodable message: a field runs past its message")?;
        if wire_type != 2 {
            return Ok(None);
        }
        Ok(self
            .frame()?
            .descriptor
            .get_field(number)
            .map(|field| FieldAt {
                field,
                start,
                length,
            }))
    }

    /// Step 3: checks one length-delimited field: its element count when
    /// repeated, then a message it opens or the text it holds.
    ///
    /// # Errors
    /// The first limit it breaks, naming its path.
    fn check_field(&mut self, at: FieldAt) -> Result<(), String> {
        let FieldAt {
            field,
            start,
            length,
        } = at;
        let headers_open = self.headers.is_some();
        let stored_data = self.stored_data;
        let frame = self.frame()?;
        let mut element = None;
        if field.is_list() || field.is_map() {
            let count = frame.count_element(field.number());
            // Inside headers, MAX_HEADER_VALUES counts the values instead.
            let limit = limits::repeated_limit(frame.descriptor.full_name(), field.name());
            if count > limit && !stored_data && !headers_open {
                return Err(format!(
                    "{}: more than {limit} elements",
                    short(&self.path(Some((&field, None))))
                ));
            }
            element = Some(count - 1);
        }
        match field.kind() {
            Kind::Message(descriptor) => {
                self.enter_message(descriptor, (field, element), start, length)
            }
            Kind::String if !stored_data => {
                let limit = limits::text_limit(frame.descriptor.full_name(), field.name());
                if length > limit {
                    return Err(format!(
                        "{}: {length} bytes, at most {limit}",
                        short(&self.path(Some((&field, element))))
                    ));
                }
                if !headers_open && self.bytes[start..self.position].contains(&0) {
                    return Err(format!(
                        "{}: contains a NUL character, which text cannot hold",
                        short(&self.path(Some((&field, element))))
                    ));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Step 3a: opens the message field reached by `step` (its content
    /// `length` bytes from `start`) after the nesting and header limits, so
    /// the walk goes on inside it.
    ///
    /// # Errors
    /// Messages nested too deep, or header limits broken.
    fn enter_message(
        &mut self,
        descriptor: MessageDescriptor,
        step: Step,
        start: usize,
        length: usize,
    ) -> Result<(), String> {
        let at = |walk: &Self| short(&walk.path(Some((&step.0, step.1))));
        if self.stack.len() >= MAX_MESSAGE_NESTING {
            return Err(format!(
                "{}: nested deeper than {MAX_MESSAGE_NESTING} messages",
                at(self)
            ));
        }
        let child = descriptor.full_name();
        if child == HEADER_TABLE && self.headers.is_none() {
            if length > MAX_HEADERS_BYTES && !self.stored_data {
                return Err(format!(
                    "{}: {length} bytes of headers, at most {MAX_HEADERS_BYTES}",
                    at(self)
                ));
            }
            self.headers = Some(Headers {
                frame_depth: self.stack.len() + 1,
                values: 0,
            });
        }
        if !self.stored_data
            && let Err(problem) = self.check_header_limits(child)
        {
            return Err(format!("{}: {problem}", at(self)));
        }
        self.stack.push(Frame {
            descriptor,
            end: self.position,
            entered_by: Some(step),
            counts: Vec::new(),
        });
        self.position = start;
        Ok(())
    }

    /// Step 3b: inside a header table, counts a header value (`child`, the
    /// message being opened) and the nesting of tables and arrays.
    ///
    /// # Errors
    /// More than [`MAX_HEADER_VALUES`] values, or tables and arrays nested
    /// deeper than [`MAX_HEADER_NESTING`]: the problem, without its path.
    fn check_header_limits(&mut self, child: &str) -> Result<(), String> {
        let Some(header) = self.headers.as_mut() else {
            return Ok(());
        };
        if child == HEADER_VALUE {
            header.values += 1;
            if header.values > MAX_HEADER_VALUES {
                return Err(format!("more than {MAX_HEADER_VALUES} header values"));
            }
        }
        if child == HEADER_TABLE || child == HEADER_ARRAY {
            let nesting = self.stack[header.frame_depth - 1..]
                .iter()
                .filter(|frame| {
                    let name = frame.descriptor.full_name();
                    name == HEADER_TABLE || name == HEADER_ARRAY
                })
                .count()
                + 1;
            if nesting > MAX_HEADER_NESTING {
                return Err(format!(
                    "header tables and arrays nested deeper than {MAX_HEADER_NESTING} levels"
                ));
            }
        }
        Ok(())
    }
}

impl Frame {
    /// Counts one more element of repeated field `number`; its count.
    fn count_element(&mut self, number: u32) -> usize {
        match self.counts.iter_mut().find(|(n, _)| *n == number) {
            Some((_, count)) => {
                *count += 1;
                *count
            }
            None => {
                self.counts.push((number, 1));
                1
            }
        }
    }
}

/// `path` cut in the middle when long (a path nested 64 levels deep): its
/// start and end name the field.
fn short(path: &str) -> String {
    const HEAD: usize = 80;
    const TAIL: usize = 60;
    if path.len() <= HEAD + TAIL + 10 || !path.is_ascii() {
        return path.to_owned();
    }
    format!("{}…{}", &path[..HEAD], &path[path.len() - TAIL..])
}

fn display(path: &str) -> &str {
    if path.is_empty() { "request" } else { path }
}

/// Reads a base-128 varint at `position`, advancing it.
fn varint(bytes: &[u8], position: &mut usize) -> Option<u64> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*position)?;
        *position += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1;

    fn length_delimited(out: &mut Vec<u8>, field: u8, content: &[u8]) {
        let key = u32::from(field) << 3 | 2;
        if key >= 0x80 {
            out.extend_from_slice(&[(key as u8 & 0x7f) | 0x80, (key >> 7) as u8]);
        } else {
            out.push(key as u8);
        }
        let mut length = content.len();
        while length >= 0x80 {
            out.push((length as u8) | 0x80);
            length >>= 7;
        }
        out.push(length as u8);
        out.extend_from_slice(content);
    }

    /// An ingest request whose headers nest `depth` tables below the
    /// top-level one (`depth + 1` levels), encoded by hand inside out: prost
    /// would recurse as deep to encode it.
    fn deep_ingest(depth: usize) -> Vec<u8> {
        let mut table = Vec::new();
        for _ in 0..depth {
            let mut value = Vec::new();
            length_delimited(&mut value, 16, &table);
            let mut entry = Vec::new();
            length_delimited(&mut entry, 1, b"n");
            length_delimited(&mut entry, 2, &value);
            table.clear();
            length_delimited(&mut table, 1, &entry);
        }
        let mut request = Vec::new();
        length_delimited(&mut request, 5, &table);
        request
    }

    const INGEST: &str = "redrive.v1.IngestDeadLettersRequest";

    #[test]
    fn the_descriptor_pool_knows_every_request() {
        let pool = POOL.as_ref().expect("descriptor pool decodes");
        for name in [
            INGEST,
            "redrive.v1.CreatePlanRequest",
            "redrive.v1.StateCheckRequest",
        ] {
            assert!(pool.get_message_by_name(name).is_some(), "{name}");
        }
    }

    #[test]
    fn header_nesting_is_bounded_without_recursion() {
        assert_eq!(
            check_request(INGEST, &deep_ingest(MAX_HEADER_NESTING - 1), Scope::All),
            Ok(())
        );
        let error =
            check_request(INGEST, &deep_ingest(MAX_HEADER_NESTING), Scope::All).unwrap_err();
        assert!(error.contains("deeper than 64 levels"), "{error}");
        // Far deeper than any stack allows to recurse, encoded by hand (prost
        // recurses to encode): refused all the same.
        let error = check_request(INGEST, &deep_ingest(5000), Scope::Nesting).unwrap_err();
        assert!(error.contains("deeper than"), "{error}");
    }

    #[test]
    fn text_and_nul_are_named() {
        let long = v1::CreatePlanRequest {
            rate: Some(v1::Rate {
                rationale: "x".repeat(limits::MAX_REASON_BYTES + 1),
                ..Default::default()
            }),
            ..Default::default()
        };
        let error = check_request(
            "redrive.v1.CreatePlanRequest",
            &long.encode_to_vec(),
            Scope::All,
        )
        .unwrap_err();
        assert_eq!(error, "rate.rationale: 4097 bytes, at most 4096");
        let nul = v1::ListDeadLettersRequest {
            selector: Some(v1::Selector {
                sources: vec!["ok".into(), "a\0b".into()],
                ..Default::default()
            }),
            ..Default::default()
        };
        let error = check_request(
            "redrive.v1.ListDeadLettersRequest",
            &nul.encode_to_vec(),
            Scope::All,
        )
        .unwrap_err();
        assert!(
            error.starts_with("selector.sources[1]: contains a NUL"),
            "{error}"
        );
    }

    /// Paths are spelled only for an error, from the fields walked: an
    /// element of a repeated message, then a field inside it; a repeated
    /// field over its limit is named without an index.
    #[test]
    fn paths_name_elements_of_repeated_messages() {
        let matches = |count: usize, nul_at: usize| v1::ListDeadLettersRequest {
            selector: Some(v1::Selector {
                body_matches: (0..count)
                    .map(|index| v1::BodyMatch {
                        pointer: "/id".into(),
                        value: if index == nul_at {
                            "a\0b".into()
                        } else {
                            "ok".into()
                        },
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let list = "redrive.v1.ListDeadLettersRequest";
        assert_eq!(
            check_request(list, &matches(3, 9).encode_to_vec(), Scope::All),
            Ok(())
        );
        let error = check_request(list, &matches(3, 2).encode_to_vec(), Scope::All).unwrap_err();
        assert!(
            error.starts_with("selector.body_matches[2].value: contains a NUL"),
            "{error}"
        );
        let limit = limits::repeated_limit("redrive.v1.Selector", "body_matches");
        let error = check_request(
            list,
            &matches(limit + 1, usize::MAX).encode_to_vec(),
            Scope::All,
        )
        .unwrap_err();
        assert_eq!(
            error,
            format!("selector.body_matches: more than {limit} elements")
        );
    }
}
