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

use std::{collections::HashMap, marker::PhantomData, sync::LazyLock};

use prost::{Message, Name, bytes::Buf};
use prost_reflect::{DescriptorPool, Kind, MessageDescriptor};
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

/// The wire check's rules, compiled once from the descriptors ([`Schema::compile`]):
/// the walk looks fields up by index, never by name, so a request of
/// thousands of header values is checked without a descriptor lookup, a
/// reference count or a string comparison per field.
struct Schema {
    /// Every message type of the pool.
    messages: Vec<MessageRules>,
    /// Index into `messages` by full name (`redrive.v1.Rate`).
    by_name: HashMap<String, usize>,
}

/// What the wire check knows of one message type.
struct MessageRules {
    /// Which header rules opening it counts under.
    role: HeaderRole,
    /// Its fields, sorted by number.
    fields: Vec<FieldRules>,
}

/// The header message types: a header table starts the header rules, and
/// values, tables and arrays inside one are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeaderRole {
    Table,
    Array,
    Value,
    Other,
}

/// What the wire check knows of one field.
struct FieldRules {
    number: u32,
    /// Its name, for an error's path.
    name: String,
    kind: FieldKind,
    /// Its element limit ([`limits::repeated_limit`]) when it is repeated
    /// or a map.
    repeated: Option<usize>,
}

/// The kinds of field the wire check limits.
#[derive(Debug, Clone, Copy)]
enum FieldKind {
    /// A message: its index in [`Schema::messages`].
    Message(usize),
    /// Text of at most this many bytes ([`limits::text_limit`]).
    Text(usize),
    /// Anything else (bytes, scalars): no limit of its own.
    Other,
}

static SCHEMA: LazyLock<Option<Schema>> = LazyLock::new(|| POOL.as_ref().map(Schema::compile));

impl Schema {
    /// The rules of every message in `pool`, with the limits of
    /// [`crate::limits`] looked up once per field.
    fn compile(pool: &DescriptorPool) -> Self {
        let descriptors: Vec<MessageDescriptor> = pool.all_messages().collect();
        let by_name: HashMap<String, usize> = descriptors
            .iter()
            .enumerate()
            .map(|(index, descriptor)| (descriptor.full_name().to_owned(), index))
            .collect();
        let messages = descriptors
            .iter()
            .map(|descriptor| {
                let message = descriptor.full_name();
                let mut fields: Vec<FieldRules> = descriptor
                    .fields()
                    .map(|field| FieldRules {
                        number: field.number(),
                        name: field.name().to_owned(),
                        kind: match field.kind() {
                            // Every message a field names is in the pool
                            // (it would not decode otherwise).
                            Kind::Message(child) => by_name
                                .get(child.full_name())
                                .map_or(FieldKind::Other, |&index| FieldKind::Message(index)),
                            Kind::String => {
                                FieldKind::Text(limits::text_limit(message, field.name()))
                            }
                            _ => FieldKind::Other,
                        },
                        repeated: (field.is_list() || field.is_map())
                            .then(|| limits::repeated_limit(message, field.name())),
                    })
                    .collect();
                fields.sort_by_key(|field| field.number);
                MessageRules {
                    role: match message {
                        HEADER_TABLE => HeaderRole::Table,
                        HEADER_ARRAY => HeaderRole::Array,
                        HEADER_VALUE => HeaderRole::Value,
                        _ => HeaderRole::Other,
                    },
                    fields,
                }
            })
            .collect();
        Self { messages, by_name }
    }

    /// Field `number` of message `message`: its position in the message's
    /// fields, if the message declares it.
    fn field(&self, message: usize, number: u32) -> Option<usize> {
        self.messages[message]
            .fields
            .binary_search_by_key(&number, |field| field.number)
            .ok()
    }
}

/// One message being walked.
struct Frame {
    /// Its index in [`Schema::messages`].
    message: usize,
    /// Where its bytes end in the request.
    end: usize,
    /// The field of the enclosing message that holds it (its position in
    /// that message's fields), and its element index when that field is
    /// repeated; `None` for the request. Paths (`rate.rationale`,
    /// `selector.ids[3]`) are spelled from these only for an error
    /// ([`Walk::path`]): a request of thousands of fields is checked without
    /// an allocation per field.
    entered_by: Option<Step>,
}

/// A field taken from a message to the next: its position in the message's
/// fields, and the element's index when it is repeated.
type Step = (usize, Option<usize>);

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
    let Some(schema) = SCHEMA.as_ref() else {
        return Ok(());
    };
    let Some(&root) = schema.by_name.get(name) else {
        return Ok(());
    };
    let mut stack = Vec::with_capacity(16);
    stack.push(Frame {
        message: root,
        end: bytes.len(),
        entered_by: None,
    });
    let mut walk = Walk {
        schema,
        bytes,
        stack,
        counts: Vec::new(),
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
    schema: &'b Schema,
    bytes: &'b [u8],
    /// Never empty while walking.
    stack: Vec<Frame>,
    /// Elements seen per repeated field of the messages on the stack:
    /// (stack depth, field number, count), deeper frames last (a frame's
    /// entries go when it is left).
    counts: Vec<(usize, u32, usize)>,
    /// The header table being walked, if any.
    headers: Option<Headers>,
    position: usize,
    /// [`Scope::Nesting`]: only message nesting is limited.
    stored_data: bool,
}

/// A length-delimited field of a known number, read by [`Walk::next_field`].
struct FieldAt {
    /// Its position in the innermost message's fields.
    field: usize,
    /// Where its content starts in the request.
    start: usize,
    /// Its content's length in bytes.
    length: usize,
}

impl Walk<'_> {
    /// The innermost message being walked.
    fn frame(&self) -> Result<&Frame, String> {
        self.stack
            .last()
            .ok_or_else(|| "undecodable message: walked past the request".to_owned())
    }

    /// The rules of field `field` (a position) of message `message`.
    fn field_rules(&self, message: usize, field: usize) -> &FieldRules {
        &self.schema.messages[message].fields[field]
    }

    /// The field path from the request to the innermost message, then to
    /// `last` (a field of the innermost message) if given
    /// (`messages[3].headers`); empty for the request itself.
    fn path(&self, last: Option<Step>) -> String {
        let mut path = String::new();
        let enclosing = self.stack.iter().map(|frame| frame.message);
        let taken = self
            .stack
            .iter()
            .skip(1)
            .map(|frame| frame.entered_by)
            .chain(std::iter::once(last));
        for (message, step) in enclosing.zip(taken) {
            let Some((field, element)) = step else {
                continue;
            };
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(&self.field_rules(message, field).name);
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
        while self.counts.last().is_some_and(|(at, _, _)| *at >= depth) {
            self.counts.pop();
        }
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
        let frame = self.frame()?;
        let (frame_end, message) = (frame.end, frame.message);
        self.position = start
            .checked_add(length)
            .filter(|end| *end <= frame_end)
            .ok_or("undecodable message: a field runs past its message")?;
        if wire_type != 2 {
            return Ok(None);
        }
        Ok(self.schema.field(message, number).map(|field| FieldAt {
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
        let message = self.frame()?.message;
        let schema = self.schema;
        let rules = &schema.messages[message].fields[field];
        let mut element = None;
        if let Some(limit) = rules.repeated {
            let count = self.count_element(rules.number);
            // Inside headers, MAX_HEADER_VALUES counts the values instead.
            if count > limit && !stored_data && !headers_open {
                return Err(format!(
                    "{}: more than {limit} elements",
                    short(&self.path(Some((field, None))))
                ));
            }
            element = Some(count - 1);
        }
        match rules.kind {
            FieldKind::Message(child) => self.enter_message(child, (field, element), start, length),
            FieldKind::Text(limit) if !stored_data => {
                if length > limit {
                    return Err(format!(
                        "{}: {length} bytes, at most {limit}",
                        short(&self.path(Some((field, element))))
                    ));
                }
                if !headers_open && self.bytes[start..self.position].contains(&0) {
                    return Err(format!(
                        "{}: contains a NUL character, which text cannot hold",
                        short(&self.path(Some((field, element))))
                    ));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Step 3a: opens message `child` (its index in [`Schema::messages`]),
    /// reached by `step`, its content `length` bytes from `start`, after
    /// the nesting and header limits, so the walk goes on inside it.
    ///
    /// # Errors
    /// Messages nested too deep, or header limits broken.
    fn enter_message(
        &mut self,
        child: usize,
        step: Step,
        start: usize,
        length: usize,
    ) -> Result<(), String> {
        let at = |walk: &Self| short(&walk.path(Some(step)));
        if self.stack.len() >= MAX_MESSAGE_NESTING {
            return Err(format!(
                "{}: nested deeper than {MAX_MESSAGE_NESTING} messages",
                at(self)
            ));
        }
        let role = self.schema.messages[child].role;
        if role == HeaderRole::Table && self.headers.is_none() {
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
            && let Err(problem) = self.check_header_limits(role)
        {
            return Err(format!("{}: {problem}", at(self)));
        }
        self.stack.push(Frame {
            message: child,
            end: self.position,
            entered_by: Some(step),
        });
        self.position = start;
        Ok(())
    }

    /// Step 3b: inside a header table, counts a header value (`role`: that
    /// of the message being opened) and the nesting of tables and arrays.
    ///
    /// # Errors
    /// More than [`MAX_HEADER_VALUES`] values, or tables and arrays nested
    /// deeper than [`MAX_HEADER_NESTING`]: the problem, without its path.
    fn check_header_limits(&mut self, role: HeaderRole) -> Result<(), String> {
        let Some(header) = self.headers.as_mut() else {
            return Ok(());
        };
        match role {
            HeaderRole::Value => {
                header.values += 1;
                if header.values > MAX_HEADER_VALUES {
                    return Err(format!("more than {MAX_HEADER_VALUES} header values"));
                }
            }
            HeaderRole::Table | HeaderRole::Array => {
                let messages = &self.schema.messages;
                let nesting = self.stack[header.frame_depth - 1..]
                    .iter()
                    .filter(|frame| {
                        matches!(
                            messages[frame.message].role,
                            HeaderRole::Table | HeaderRole::Array
                        )
                    })
                    .count()
                    + 1;
                if nesting > MAX_HEADER_NESTING {
                    return Err(format!(
                        "header tables and arrays nested deeper than {MAX_HEADER_NESTING} levels"
                    ));
                }
            }
            HeaderRole::Other => {}
        }
        Ok(())
    }

    /// Counts one more element of repeated field `number` of the innermost
    /// message; its count.
    fn count_element(&mut self, number: u32) -> usize {
        let depth = self.stack.len() - 1;
        let found = self
            .counts
            .iter_mut()
            .rev()
            .take_while(|(at, _, _)| *at == depth)
            .find(|(_, n, _)| *n == number);
        match found {
            Some((_, _, count)) => {
                *count += 1;
                *count
            }
            None => {
                self.counts.push((depth, number, 1));
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

    /// Every message field of every message resolves to that message's
    /// rules in the compiled schema: no nesting escapes the walk.
    #[test]
    fn the_schema_resolves_every_message_field() {
        let pool = POOL.as_ref().expect("descriptor pool decodes");
        let schema = SCHEMA.as_ref().expect("schema compiles");
        let mut message_fields = 0;
        for descriptor in pool.all_messages() {
            let index = schema.by_name[descriptor.full_name()];
            for field in descriptor.fields() {
                let at = schema
                    .field(index, field.number())
                    .unwrap_or_else(|| panic!("{}", field.full_name()));
                let rules = &schema.messages[index].fields[at];
                assert_eq!(rules.name, field.name());
                assert_eq!(rules.repeated.is_some(), field.is_list() || field.is_map());
                if let Kind::Message(child) = field.kind() {
                    message_fields += 1;
                    assert!(
                        matches!(rules.kind, FieldKind::Message(found)
                            if found == schema.by_name[child.full_name()]),
                        "{}",
                        field.full_name()
                    );
                }
            }
        }
        assert!(message_fields > 20, "{message_fields}");
        assert_eq!(
            schema.messages[schema.by_name[HEADER_TABLE]].role,
            HeaderRole::Table
        );
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
