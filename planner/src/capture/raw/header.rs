//! The lenient reader of a content header: [`decode_content_header`] keeps
//! every value it can and names each one it cannot read faithfully.

use redrive_proto::v1::{
    DecimalValue, HeaderArray, HeaderTable, HeaderValue, MessageProperties, Void,
    header_value::Value,
};

use super::{MAX_NESTING, MAX_PROBLEMS, RawError, reader::Reader};

/// A field path in a problem keeps at most this many characters per name
/// and this many in all.
const PATH_NAME_CHARS: usize = 32;
const PATH_CHARS: usize = 200;

/// A content header read leniently: every value that could be read, and what
/// could not be read faithfully.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DecodedHeader {
    /// The basic properties; a string that is not UTF-8 holds its lossy form.
    pub properties: MessageProperties,
    /// The `headers` table; a name or string that is not UTF-8 is held in its
    /// lossy form; a table cut short keeps the fields before the problem.
    pub headers: HeaderTable,
    /// Declared body size.
    pub body_size: u64,
    /// What could not be read faithfully, one readable line each (for
    /// example `property type is not UTF-8: 62 65 73 …`). Empty means the
    /// decoded form is exactly what lapin would have produced.
    pub problems: Vec<String>,
}

/// Reads a content header frame payload (AMQP 0-9-1 §4.2.6.1, basic class
/// properties in §1.8) without failing on a value: strings that are not UTF-8
/// are kept lossily, an unknown field type or nesting deeper than
/// [`MAX_NESTING`] ends that table, and each is named in `problems`. Field
/// types follow RabbitMQ's table (rabbitmq.com/amqp-0-9-1-errata, "Field
/// types"), as lapin does.
///
/// # Errors
/// Only when the payload is cut short before the property flags.
pub fn decode_content_header(payload: &[u8]) -> Result<DecodedHeader, RawError> {
    let mut reader = Reader::new(payload);
    let _class = reader.u16()?;
    let _weight = reader.u16()?;
    let body_size = reader.u64()?;
    let mut flags = Vec::new();
    loop {
        let word = reader.u16()?;
        flags.push(word);
        if word & 1 == 0 || flags.len() > 4 {
            break;
        }
    }
    let flag = |bit: u16| flags[0] & (1 << bit) != 0;
    let mut decoded = DecodedHeader {
        body_size,
        ..DecodedHeader::default()
    };
    if flags.len() > 1 || flags[0] & 0b11 != 0 {
        note(
            &mut decoded.problems,
            "property flags name properties AMQP 0-9-1 does not define".to_owned(),
        );
    }
    let outcome = decode_properties(&mut reader, &flag, &mut decoded);
    if let Err(problem) = outcome {
        note(&mut decoded.problems, problem);
    } else if !reader.is_empty() {
        note(
            &mut decoded.problems,
            format!("{} bytes after the last property", reader.remaining()),
        );
    }
    Ok(decoded)
}

fn decode_properties(
    reader: &mut Reader<'_>,
    flag: &dyn Fn(u16) -> bool,
    decoded: &mut DecodedHeader,
) -> Result<(), String> {
    let cut = |error: RawError| format!("content header cut short: {error}");
    let text = |reader: &mut Reader<'_>, name: &str, problems: &mut Vec<String>| {
        reader
            .short_bytes()
            .map(|bytes| lossy(bytes, &format!("property {name}"), problems))
            .map_err(cut)
    };
    let p = &mut decoded.properties;
    let problems = &mut decoded.problems;
    if flag(15) {
        p.content_type = Some(text(reader, "content_type", problems)?);
    }
    if flag(14) {
        p.content_encoding = Some(text(reader, "content_encoding", problems)?);
    }
    if flag(13) {
        let length = reader.u32().map_err(cut)? as usize;
        let table = reader.take(length).map_err(cut)?;
        decoded.headers = decode_table(table, 1, "headers", problems);
    }
    if flag(12) {
        p.delivery_mode = Some(u32::from(reader.u8().map_err(cut)?));
    }
    if flag(11) {
        p.priority = Some(u32::from(reader.u8().map_err(cut)?));
    }
    if flag(10) {
        p.correlation_id = Some(text(reader, "correlation_id", problems)?);
    }
    if flag(9) {
        p.reply_to = Some(text(reader, "reply_to", problems)?);
    }
    if flag(8) {
        p.expiration = Some(text(reader, "expiration", problems)?);
    }
    if flag(7) {
        p.message_id = Some(text(reader, "message_id", problems)?);
    }
    if flag(6) {
        p.timestamp = Some(reader.u64().map_err(cut)?);
    }
    if flag(5) {
        p.r#type = Some(text(reader, "type", problems)?);
    }
    if flag(4) {
        p.user_id = Some(text(reader, "user_id", problems)?);
    }
    if flag(3) {
        p.app_id = Some(text(reader, "app_id", problems)?);
    }
    if flag(2) {
        p.cluster_id = Some(text(reader, "cluster_id", problems)?);
    }
    Ok(())
}

fn lossy(bytes: &[u8], what: &str, problems: &mut Vec<String>) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => {
            note(
                problems,
                format!("{what} is not UTF-8: {}", hex_preview(bytes)),
            );
            String::from_utf8_lossy(bytes).into_owned()
        }
    }
}

/// Records a problem, at most [`MAX_PROBLEMS`] of them and then one line
/// saying more were found.
fn note(problems: &mut Vec<String>, problem: String) {
    match problems.len() {
        n if n < MAX_PROBLEMS => problems.push(problem),
        n if n == MAX_PROBLEMS => problems.push("more problems not listed".to_owned()),
        _ => {}
    }
}

/// `path.name`, each name and the whole cut short for problem lines.
fn child_path(path: &str, name: &str) -> String {
    let mut child = String::with_capacity(path.len() + PATH_NAME_CHARS + 1);
    child.push_str(path);
    if child.chars().count() >= PATH_CHARS {
        return child;
    }
    child.push('.');
    child.extend(name.chars().take(PATH_NAME_CHARS));
    if name.chars().count() > PATH_NAME_CHARS {
        child.push('…');
    }
    child
}

fn hex_preview(bytes: &[u8]) -> String {
    let shown: Vec<String> = bytes.iter().take(32).map(|b| format!("{b:02x}")).collect();
    let more = if bytes.len() > 32 { " …" } else { "" };
    format!("{}{more}", shown.join(" "))
}

fn decode_table(bytes: &[u8], depth: usize, path: &str, problems: &mut Vec<String>) -> HeaderTable {
    let mut table = HeaderTable::default();
    if depth > MAX_NESTING {
        note(
            problems,
            format!("{path} nests deeper than {MAX_NESTING} levels; not read"),
        );
        return table;
    }
    let mut reader = Reader::new(bytes);
    while !reader.is_empty() {
        let key = match reader.short_bytes() {
            Ok(key) => key,
            Err(_) => {
                note(problems, format!("{path}: a field name is cut short"));
                break;
            }
        };
        let key = lossy(key, &format!("{path} field name"), problems);
        let field = child_path(path, &key);
        match decode_value(&mut reader, depth, &field, problems) {
            Some(value) => {
                if table.fields.insert(key, value).is_some() {
                    note(
                        problems,
                        format!("{field}: the name appears twice (or two names read the same)"),
                    );
                }
            }
            None => break,
        }
    }
    table
}

/// One field value; `None` when the rest of the enclosing table or array
/// cannot be read (unknown type, cut short), with the problem recorded.
fn decode_value(
    reader: &mut Reader<'_>,
    depth: usize,
    path: &str,
    problems: &mut Vec<String>,
) -> Option<HeaderValue> {
    let cut = |problems: &mut Vec<String>| {
        note(problems, format!("{path}: value cut short"));
        None
    };
    let Ok(tag) = reader.u8() else {
        return cut(problems);
    };
    macro_rules! read {
        ($e:expr) => {
            match $e {
                Ok(v) => v,
                Err(_) => return cut(problems),
            }
        };
    }
    let value = match tag {
        b't' => Value::Boolean(read!(reader.u8()) != 0),
        b'b' => Value::ShortShortInt(i32::from(read!(reader.u8()) as i8)),
        b'B' => Value::ShortShortUint(u32::from(read!(reader.u8()))),
        b's' | b'U' => Value::ShortInt(i32::from(read!(reader.u16()) as i16)),
        b'u' => Value::ShortUint(u32::from(read!(reader.u16()))),
        b'I' => Value::LongInt(read!(reader.u32()) as i32),
        b'i' => Value::LongUint(read!(reader.u32())),
        b'l' | b'L' => Value::LongLongInt(read!(reader.u64()) as i64),
        b'f' => Value::Float(f32::from_bits(read!(reader.u32()))),
        b'd' => Value::Double(f64::from_bits(read!(reader.u64()))),
        b'D' => {
            let scale = read!(reader.u8());
            let value = read!(reader.u32());
            Value::Decimal(DecimalValue {
                scale: u32::from(scale),
                value,
            })
        }
        b'S' => {
            let length = read!(reader.u32()) as usize;
            Value::LongString(read!(reader.take(length)).to_vec())
        }
        b'x' => {
            let length = read!(reader.u32()) as usize;
            Value::ByteArray(read!(reader.take(length)).to_vec())
        }
        b'T' => Value::Timestamp(read!(reader.u64())),
        b'V' => Value::Void(Void {}),
        b'F' => {
            let length = read!(reader.u32()) as usize;
            let inner = read!(reader.take(length));
            Value::Table(decode_table(inner, depth + 1, path, problems))
        }
        b'A' => {
            let length = read!(reader.u32()) as usize;
            let inner = read!(reader.take(length));
            let mut values = Vec::new();
            if depth + 1 > MAX_NESTING {
                note(
                    problems,
                    format!("{path} nests deeper than {MAX_NESTING} levels; not read"),
                );
            } else {
                let mut items = Reader::new(inner);
                while !items.is_empty() {
                    match decode_value(&mut items, depth + 1, path, problems) {
                        Some(value) => values.push(value),
                        None => break,
                    }
                }
            }
            Value::Array(HeaderArray { values })
        }
        other => {
            note(
                problems,
                format!(
                    "{path}: unknown field type {:?} (0x{other:02x}); the rest of its table is not read",
                    char::from(other)
                ),
            );
            return None;
        }
    };
    Some(HeaderValue { value: Some(value) })
}

#[cfg(test)]
mod tests {
    use amq_protocol::frame::{AMQPFrame, WriteContext, gen_frame};
    use redrive_test_support::amqp::{content_header, encode};

    use super::*;

    /// A header value nesting `depth` tables (or arrays) around a boolean.
    fn nested_value(depth: usize, arrays: bool) -> Vec<u8> {
        let mut value = vec![b't', 1];
        for _ in 0..depth {
            value = if arrays {
                let mut array = vec![b'A'];
                array.extend_from_slice(&u32::try_from(value.len()).unwrap().to_be_bytes());
                array.extend(value);
                array
            } else {
                [vec![b'F'], encode::table(&[(b"n", value)])].concat()
            };
        }
        value
    }

    proptest::proptest! {
        /// Issue 13's capture side: any bytes as the header table of a
        /// well-formed content header decode or are named, never a panic.
        #[test]
        fn any_header_table_decodes_or_is_named(
            table in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
        ) {
            let _ = decode_content_header(&content_header(0, &[(13, table)]));
        }

        /// Tables and arrays nested up to thousands deep: read to the
        /// limit, the rest named as a problem, without deep recursion.
        #[test]
        fn nesting_is_cut_at_the_limit(depth in 1usize..3000, arrays in proptest::prelude::any::<bool>()) {
            let header = content_header(0, &[(13, encode::table(&[(b"h", nested_value(depth, arrays))]))]);
            let decoded = decode_content_header(&header).unwrap();
            if depth < MAX_NESTING - 2 {
                proptest::prop_assert!(decoded.problems.is_empty(), "{:?}", decoded.problems);
            }
            if depth > MAX_NESTING + 2 {
                proptest::prop_assert!(
                    decoded.problems.iter().any(|problem| problem.contains("deeper than")),
                    "{:?}",
                    decoded.problems
                );
            }
        }
    }

    #[test]
    fn a_readable_header_decodes_as_lapin_does() {
        use lapin::{
            BasicProperties,
            types::{AMQPValue, FieldArray, FieldTable as LapinTable},
        };
        let mut inner = LapinTable::default();
        inner.insert("count".into(), AMQPValue::LongLongInt(3));
        inner.insert("queue".into(), AMQPValue::LongString("work".into()));
        let mut headers = LapinTable::default();
        headers.insert(
            "x-death".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(inner)])),
        );
        headers.insert("flag".into(), AMQPValue::Boolean(true));
        headers.insert("n".into(), AMQPValue::ShortInt(-2));
        let properties = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_message_id("m-1".into())
            .with_timestamp(1_700_000_000)
            .with_type("order.created".into())
            .with_delivery_mode(2)
            .with_headers(headers);
        let frame = AMQPFrame::Header(
            1,
            amq_protocol::frame::AMQPContentHeader {
                class_id: 60,
                body_size: 12,
                properties: properties.clone(),
            },
        );
        let bytes = gen_frame(&frame)(WriteContext::from(Vec::new()))
            .unwrap()
            .write;
        let decoded = decode_content_header(&bytes[7..bytes.len() - 1]).unwrap();
        assert!(decoded.problems.is_empty(), "{:?}", decoded.problems);
        assert_eq!(decoded.body_size, 12);
        assert_eq!(
            decoded.properties,
            redrive_proto::amqp::properties_from_amqp(&properties)
        );
        assert_eq!(
            decoded.headers,
            redrive_proto::amqp::table_from_amqp(properties.headers().as_ref().unwrap())
        );
    }

    #[test]
    fn every_non_utf8_string_is_named_and_kept_lossily() {
        let header = content_header(
            0,
            &[
                (15, encode::short_string(b"text/plain")),
                (
                    13,
                    encode::table(&[
                        (b"ge\xe4ndert", encode::long_string(b"x")),
                        (b"ok", encode::long_string(b"\xff")),
                    ]),
                ),
                (7, encode::short_string(b"id-\xfc")),
                (5, encode::short_string(b"bestellung.ge\xe4ndert")),
                (3, encode::short_string(b"app")),
            ],
        );
        let decoded = decode_content_header(&header).unwrap();
        assert_eq!(
            decoded.properties.content_type.as_deref(),
            Some("text/plain")
        );
        assert_eq!(
            decoded.properties.r#type.as_deref(),
            Some("bestellung.ge\u{fffd}ndert")
        );
        assert_eq!(decoded.properties.app_id.as_deref(), Some("app"));
        let problems = decoded.problems.join("\n");
        assert!(
            problems.contains("property type is not UTF-8: 62 65"),
            "{problems}"
        );
        assert!(
            problems.contains("property message_id is not UTF-8"),
            "{problems}"
        );
        assert!(
            problems.contains("headers field name is not UTF-8"),
            "{problems}"
        );
        // A long string is bytes in AMQP: not a problem.
        assert_eq!(decoded.problems.len(), 3, "{problems}");
        assert_eq!(decoded.headers.fields.len(), 2);
    }

    #[test]
    fn an_unknown_field_type_ends_its_table_with_a_problem() {
        let header = content_header(
            0,
            &[(
                13,
                encode::table(&[(b"a", encode::long_string(b"1")), (b"b", vec![b'Q', 1, 2])]),
            )],
        );
        let decoded = decode_content_header(&header).unwrap();
        assert_eq!(decoded.headers.fields.len(), 1);
        assert!(decoded.problems[0].contains("headers.b: unknown field type 'Q'"));
    }

    #[test]
    fn deep_nesting_is_a_problem_not_a_crash() {
        let mut value = encode::long_string(b"leaf");
        for _ in 0..200 {
            value = [vec![b'F'], encode::table(&[(b"k", value)])].concat();
        }
        let header = content_header(0, &[(13, encode::table(&[(b"deep", value)]))]);
        let decoded = decode_content_header(&header).unwrap();
        assert!(
            decoded
                .problems
                .iter()
                .any(|p| p.contains("nests deeper than 64")),
            "{:?}",
            decoded.problems
        );
    }

    #[test]
    fn a_cut_header_is_named() {
        let mut header = content_header(0, &[(5, encode::short_string(b"order.created"))]);
        header.truncate(header.len() - 3);
        let decoded = decode_content_header(&header).unwrap();
        assert!(
            decoded.problems[0].contains("cut short"),
            "{:?}",
            decoded.problems
        );
        assert!(decode_content_header(&header[..10]).is_err());
    }

    #[test]
    fn thousands_of_bad_names_cost_a_bounded_problem_list() {
        // One-byte invalid names, ~30,000 of them, under a 255-byte name.
        let mut inner = Vec::new();
        for _ in 0..30_000 {
            inner.extend(encode::short_string(b"\xff"));
            inner.push(b'V');
        }
        let mut nested = u32::try_from(inner.len()).unwrap().to_be_bytes().to_vec();
        nested.extend(inner);
        let long_name = vec![b'n'; 255];
        let header = content_header(
            0,
            &[(
                13,
                encode::table(&[(&long_name, [vec![b'F'], nested].concat())]),
            )],
        );
        let decoded = decode_content_header(&header).unwrap();
        assert_eq!(decoded.problems.len(), MAX_PROBLEMS + 1);
        assert!(
            decoded.problems.iter().all(|p| p.len() < 400),
            "{:?}",
            decoded.problems[0]
        );
        assert_eq!(decoded.problems[MAX_PROBLEMS], "more problems not listed");
    }

    #[test]
    fn unknown_flags_and_trailing_bytes_are_problems() {
        let mut header = content_header(0, &[(5, encode::short_string(b"t"))]);
        header.extend_from_slice(b"xyz");
        let decoded = decode_content_header(&header).unwrap();
        assert!(decoded.problems[0].contains("3 bytes after the last property"));
        let mut header = content_header(0, &[(5, encode::short_string(b"t"))]);
        header[13] |= 0b10;
        let decoded = decode_content_header(&header).unwrap();
        assert!(
            decoded.problems[0].contains("does not define"),
            "{:?}",
            decoded.problems
        );
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_decode_without_panic_and_with_a_bounded_list(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4096)
        ) {
            if let Ok(decoded) = decode_content_header(&bytes) {
                proptest::prop_assert!(decoded.problems.len() <= MAX_PROBLEMS + 1);
            }
        }
    }
}
