//! Typed AMQP header values as JSON, both ways.
//!
//! `dead-letters show --json` renders every header with its AMQP 0-9-1 field
//! type, so nothing is lost (a `long_string` stays distinct from a
//! `short_string`, an `i32` from an `i64`), and `import` reads the same shape
//! back. Each value is one object:
//!
//! | AMQP type | JSON |
//! | --- | --- |
//! | `t` | `{"type": "bool", "value": true}` |
//! | `b` `B` `s` `u` `I` `i` `l` | `{"type": "i8" \| "u8" \| "i16" \| "u16" \| "i32" \| "u32" \| "i64", "value": 42}` |
//! | `f` `d` | `{"type": "f32" \| "f64", "value": 1.5}` (NaN and infinities as the strings `"NaN"`, `"inf"`, `"-inf"`) |
//! | `D` | `{"type": "decimal", "value": {"scale": 2, "value": 1234}}` (value / 10^scale) |
//! | short string | `{"type": "short_string", "value": "text"}` |
//! | `S` | `{"type": "long_string", "value": "text"}`, or `{"type": "long_string", "base64": "..."}` when the bytes are not UTF-8 |
//! | `A` | `{"type": "array", "value": [typed values]}` |
//! | `T` | `{"type": "timestamp", "value": 1700000000}` (seconds since the Unix epoch) |
//! | `F` | `{"type": "table", "value": {"name": typed value, ...}}` |
//! | `x` | `{"type": "byte_array", "base64": "..."}` |
//! | `V` | `{"type": "void"}` |
//!
//! A header table is a JSON object of header name → typed value. Base64 is the
//! standard alphabet with padding (RFC 4648 §4).
//!
//! [`value_from_json`] reads either that typed shape or a plain JSON value:
//! string → `long_string`, integer → `i64`, other number → `f64`, bool →
//! `bool`, array → `array`, object → `table`, null → `void`. A number of
//! magnitude 2^63 or more is refused, written as an integer or not (JSON
//! reads an integer beyond `u64` as a rounded double, and every double that
//! large is whole): a string or a typed `f64` keeps it. An object is read
//! as a typed value when it has a string `type` naming one of the types above
//! and no keys other than `type`, `value` and `base64`; any other object is a
//! plain table.

use base64::{Engine, engine::general_purpose::STANDARD};
use redrive_proto::{
    limits::MAX_HEADER_NESTING,
    v1::{DecimalValue, HeaderArray, HeaderTable, HeaderValue, Void, header_value},
};
use serde_json::{Map, Number, Value, json};

/// Names of the typed shapes, in the order of the table in the module docs.
pub const TYPE_NAMES: &[&str] = &[
    "bool",
    "i8",
    "u8",
    "i16",
    "u16",
    "i32",
    "u32",
    "i64",
    "f32",
    "f64",
    "decimal",
    "short_string",
    "long_string",
    "array",
    "timestamp",
    "table",
    "byte_array",
    "void",
];

/// The typed JSON form of one header value (module docs). A value with no type
/// set, which the planner never sends, renders as `void`; tables and arrays
/// nested deeper than the planner's limit (stored before it existed) render
/// as `{"type": "table", "not_shown": "..."}`, so the recursion is bounded.
pub fn value_to_json(value: &HeaderValue) -> Value {
    value_to_json_at(value, 1)
}

/// `depth`: the nesting level `value` has if it is a table or an array.
fn value_to_json_at(value: &HeaderValue, depth: usize) -> Value {
    use header_value::Value as V;
    let Some(inner) = &value.value else {
        return json!({"type": "void"});
    };
    if depth > MAX_HEADER_NESTING && matches!(inner, V::Array(_) | V::Table(_)) {
        return json!({"type": type_name(value), "not_shown": TOO_DEEP});
    }
    match inner {
        V::Boolean(flag) => json!({"type": "bool", "value": flag}),
        V::ShortShortInt(number) => json!({"type": "i8", "value": number}),
        V::ShortShortUint(number) => json!({"type": "u8", "value": number}),
        V::ShortInt(number) => json!({"type": "i16", "value": number}),
        V::ShortUint(number) => json!({"type": "u16", "value": number}),
        V::LongInt(number) => json!({"type": "i32", "value": number}),
        V::LongUint(number) => json!({"type": "u32", "value": number}),
        V::LongLongInt(number) => json!({"type": "i64", "value": number}),
        V::Float(number) => json!({"type": "f32", "value": f32_to_json(*number)}),
        V::Double(number) => json!({"type": "f64", "value": f64_to_json(*number)}),
        V::Decimal(decimal) => json!({
            "type": "decimal",
            "value": {"scale": decimal.scale, "value": decimal.value},
        }),
        V::ShortString(text) => json!({"type": "short_string", "value": text}),
        V::LongString(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => json!({"type": "long_string", "value": text}),
            Err(_) => json!({"type": "long_string", "base64": STANDARD.encode(bytes)}),
        },
        V::Array(array) => json!({
            "type": "array",
            "value": array
                .values
                .iter()
                .map(|value| value_to_json_at(value, depth + 1))
                .collect::<Vec<_>>(),
        }),
        V::Timestamp(seconds) => json!({"type": "timestamp", "value": seconds}),
        V::Table(table) => json!({"type": "table", "value": table_to_json_at(table, depth)}),
        V::ByteArray(bytes) => json!({"type": "byte_array", "base64": STANDARD.encode(bytes)}),
        V::Void(_) => json!({"type": "void"}),
    }
}

/// The typed JSON form of a header table: an object of name → typed value.
pub fn table_to_json(table: &HeaderTable) -> Value {
    table_to_json_at(table, 1)
}

/// `depth`: the nesting level of `table` itself.
fn table_to_json_at(table: &HeaderTable, depth: usize) -> Value {
    Value::Object(
        table
            .fields
            .iter()
            .map(|(name, value)| (name.clone(), value_to_json_at(value, depth + 1)))
            .collect(),
    )
}

/// What stands for tables and arrays nested deeper than the limit.
const TOO_DEEP: &str = "nested deeper than the planner's header limit";

/// f32 through its shortest decimal form, so `0.1f32` renders as `0.1` and not
/// as the f64 widening `0.10000000149011612`.
fn f32_to_json(number: f32) -> Value {
    if !number.is_finite() {
        return non_finite(f64::from(number));
    }
    number
        .to_string()
        .parse::<f64>()
        .ok()
        .and_then(Number::from_f64)
        .map_or(Value::Null, Value::Number)
}

fn f64_to_json(number: f64) -> Value {
    Number::from_f64(number).map_or_else(|| non_finite(number), Value::Number)
}

fn non_finite(number: f64) -> Value {
    let text = if number.is_nan() {
        "NaN"
    } else if number > 0.0 {
        "inf"
    } else {
        "-inf"
    };
    Value::String(text.to_owned())
}

/// A header value as JSON could not be read; the message names the problem,
/// the caller adds the path.
pub type ReadError = String;

/// Reads a header table from a JSON object of name → typed or plain value.
///
/// # Errors
/// When `json` is not an object, or a value is wrong; the message names the
/// header (`headers.x-death[0].count: ...`) starting from `path`.
pub fn table_from_json(path: &str, json: &Value) -> Result<HeaderTable, ReadError> {
    let Value::Object(object) = json else {
        return Err(format!(
            "{path}: expected an object of header name to value, got {}",
            kind(json)
        ));
    };
    table_from_object(path, object)
}

fn table_from_object(path: &str, object: &Map<String, Value>) -> Result<HeaderTable, ReadError> {
    let mut table = HeaderTable::default();
    for (name, value) in object {
        if name.len() > 255 {
            return Err(format!(
                "{path}: header name {name:?} is longer than 255 bytes, the AMQP limit"
            ));
        }
        let value = value_from_json(&format!("{path}.{name}"), value)?;
        table.fields.insert(name.clone(), value);
    }
    Ok(table)
}

/// Reads one header value: the typed shape of [`value_to_json`], or a plain
/// JSON value (module docs).
///
/// # Errors
/// A typed value whose `value`/`base64` does not fit its type, an integer that
/// fits no AMQP integer type, or bad base64; the message starts with `path`.
pub fn value_from_json(path: &str, json: &Value) -> Result<HeaderValue, ReadError> {
    use header_value::Value as V;
    let value = match json {
        Value::Null => V::Void(Void {}),
        Value::Bool(flag) => V::Boolean(*flag),
        Value::Number(number) => {
            if let Some(integer) = number.as_i64() {
                V::LongLongInt(integer)
            } else if number.is_u64() {
                return Err(format!(
                    "{path}: {number} does not fit an i64; use a typed value or a string"
                ));
            } else {
                let double = number.as_f64().unwrap_or(f64::NAN);
                // An integer beyond u64 is read by JSON as a double, already
                // rounded (2^70 + 1 would be stored as 2^70): refused, as one
                // beyond i64 is, rather than replayed with another value. A
                // whole double that large is refused alike (JSON does not say
                // which was written): a typed double takes it.
                if double.fract() == 0.0 && double.abs() >= 2_f64.powi(63) {
                    return Err(format!(
                        "{path}: {number} does not fit an i64 and would be rounded as a double; \
                         use a string, or a typed value such as {{\"type\": \"f64\", \"value\": ...}}"
                    ));
                }
                V::Double(double)
            }
        }
        Value::String(text) => V::LongString(text.as_bytes().to_vec()),
        Value::Array(items) => V::Array(array_from_json(path, items)?),
        Value::Object(object) => match typed_name(object) {
            Some(type_name) => return typed_from_json(path, type_name, object),
            None => V::Table(table_from_object(path, object)?),
        },
    };
    Ok(HeaderValue { value: Some(value) })
}

fn array_from_json(path: &str, items: &[Value]) -> Result<HeaderArray, ReadError> {
    let values = items
        .iter()
        .enumerate()
        .map(|(index, item)| value_from_json(&format!("{path}[{index}]"), item))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(HeaderArray { values })
}

/// The type name when `object` is a typed value rather than a plain table.
fn typed_name(object: &Map<String, Value>) -> Option<&str> {
    let type_name = object.get("type")?.as_str()?;
    let only_typed_keys = object
        .keys()
        .all(|key| matches!(key.as_str(), "type" | "value" | "base64"));
    (only_typed_keys && TYPE_NAMES.contains(&type_name)).then_some(type_name)
}

fn typed_from_json(
    path: &str,
    type_name: &str,
    object: &Map<String, Value>,
) -> Result<HeaderValue, ReadError> {
    use header_value::Value as V;
    let payload = object.get("value");
    let base64 = object.get("base64");
    let need_value =
        || payload.ok_or_else(|| format!("{path}: a {type_name} value needs a \"value\" field"));
    if base64.is_some() && !matches!(type_name, "long_string" | "byte_array") {
        return Err(format!(
            "{path}: only long_string and byte_array take a \"base64\" field"
        ));
    }
    let int = |minimum: i64, maximum: i64| -> Result<i64, ReadError> {
        let value = need_value()?;
        value
            .as_i64()
            .filter(|number| (minimum..=maximum).contains(number))
            .ok_or_else(|| {
                format!(
                    "{path}: {type_name} needs an integer in {minimum}..={maximum}, got {value}"
                )
            })
    };
    let value = match type_name {
        "bool" => V::Boolean(
            need_value()?
                .as_bool()
                .ok_or_else(|| format!("{path}: bool needs true or false"))?,
        ),
        "i8" => V::ShortShortInt(narrow(int(i8::MIN.into(), i8::MAX.into())?)),
        "u8" => V::ShortShortUint(narrow(int(0, u8::MAX.into())?)),
        "i16" => V::ShortInt(narrow(int(i16::MIN.into(), i16::MAX.into())?)),
        "u16" => V::ShortUint(narrow(int(0, u16::MAX.into())?)),
        "i32" => V::LongInt(narrow(int(i32::MIN.into(), i32::MAX.into())?)),
        "u32" => V::LongUint(narrow(int(0, u32::MAX.into())?)),
        "i64" => V::LongLongInt(int(i64::MIN, i64::MAX)?),
        // The f64 → f32 narrowing is the point: the header is an AMQP float.
        #[allow(clippy::cast_possible_truncation)]
        "f32" => V::Float(float(path, type_name, need_value()?)? as f32),
        "f64" => V::Double(float(path, type_name, need_value()?)?),
        "decimal" => V::Decimal(decimal(path, need_value()?)?),
        "short_string" => {
            let text = need_value()?
                .as_str()
                .ok_or_else(|| format!("{path}: short_string needs a string value"))?;
            if text.len() > 255 {
                return Err(format!(
                    "{path}: short_string is longer than 255 bytes, the AMQP limit"
                ));
            }
            V::ShortString(text.to_owned())
        }
        "long_string" => V::LongString(text_or_base64(path, type_name, payload, base64)?),
        "byte_array" => {
            if payload.is_some() {
                return Err(format!(
                    "{path}: byte_array takes \"base64\", not \"value\""
                ));
            }
            V::ByteArray(text_or_base64(path, type_name, None, base64)?)
        }
        "array" => match need_value()? {
            Value::Array(items) => V::Array(array_from_json(path, items)?),
            other => {
                return Err(format!(
                    "{path}: array needs a JSON array value, got {}",
                    kind(other)
                ));
            }
        },
        "timestamp" => V::Timestamp(need_value()?.as_u64().ok_or_else(|| {
            format!("{path}: timestamp needs a non-negative integer (seconds since the epoch)")
        })?),
        "table" => match need_value()? {
            Value::Object(fields) => V::Table(table_from_object(path, fields)?),
            other => {
                return Err(format!(
                    "{path}: table needs a JSON object value, got {}",
                    kind(other)
                ));
            }
        },
        "void" => {
            if payload.is_some_and(|value| !value.is_null()) {
                return Err(format!("{path}: void takes no value"));
            }
            V::Void(Void {})
        }
        other => return Err(format!("{path}: unknown type {other:?}")),
    };
    Ok(HeaderValue { value: Some(value) })
}

/// Range-checked by the caller; the fallback is unreachable.
fn narrow<T: TryFrom<i64> + Default>(number: i64) -> T {
    T::try_from(number).unwrap_or_default()
}

fn float(path: &str, type_name: &str, value: &Value) -> Result<f64, ReadError> {
    match value {
        Value::Number(number) => number
            .as_f64()
            .ok_or_else(|| format!("{path}: {type_name} needs a number")),
        Value::String(text) => match text.as_str() {
            "NaN" => Ok(f64::NAN),
            "inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            _ => Err(format!(
                "{path}: {type_name} needs a number (or \"NaN\", \"inf\", \"-inf\")"
            )),
        },
        other => Err(format!(
            "{path}: {type_name} needs a number, got {}",
            kind(other)
        )),
    }
}

fn decimal(path: &str, value: &Value) -> Result<DecimalValue, ReadError> {
    let problem = || format!("{path}: decimal needs {{\"scale\": 0..=255, \"value\": u32}}");
    let Value::Object(fields) = value else {
        return Err(problem());
    };
    if fields.keys().any(|key| key != "scale" && key != "value") {
        return Err(problem());
    }
    let field = |name: &str, maximum: u64| {
        fields
            .get(name)
            .and_then(Value::as_u64)
            .filter(|number| *number <= maximum)
            .and_then(|number| u32::try_from(number).ok())
            .ok_or_else(problem)
    };
    Ok(DecimalValue {
        scale: field("scale", u8::MAX.into())?,
        value: field("value", u32::MAX.into())?,
    })
}

fn text_or_base64(
    path: &str,
    type_name: &str,
    text: Option<&Value>,
    base64: Option<&Value>,
) -> Result<Vec<u8>, ReadError> {
    match (text, base64) {
        (Some(Value::String(text)), None) => Ok(text.as_bytes().to_vec()),
        (None, Some(Value::String(encoded))) => STANDARD
            .decode(encoded)
            .map_err(|error| format!("{path}.base64: not valid base64: {error}")),
        (Some(_), Some(_)) => Err(format!(
            "{path}: {type_name} takes \"value\" or \"base64\", not both"
        )),
        (None, None) => Err(format!(
            "{path}: {type_name} needs a \"value\" or \"base64\" field"
        )),
        (Some(_), None) => Err(format!("{path}: {type_name} \"value\" must be a string")),
        (None, Some(_)) => Err(format!("{path}: \"base64\" must be a string")),
    }
}

/// What kind of JSON value this is, for error messages.
pub fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A one-line human rendering of a header value, for `dead-letters show`:
/// scalars as they are, strings quoted, arrays `[a, b]`, tables `{k: v}`,
/// binary as `<N bytes, base64 ...>`, timestamps as RFC 3339; deeper than the
/// planner's header limit, `<nested deeper than ...>`.
pub fn value_to_text(value: &HeaderValue) -> String {
    value_to_text_at(value, 1)
}

/// `depth`: the nesting level `value` has if it is a table or an array.
fn value_to_text_at(value: &HeaderValue, depth: usize) -> String {
    use header_value::Value as V;
    let Some(inner) = &value.value else {
        return "void".to_owned();
    };
    if depth > MAX_HEADER_NESTING && matches!(inner, V::Array(_) | V::Table(_)) {
        return format!("<{TOO_DEEP}>");
    }
    match inner {
        V::Boolean(flag) => flag.to_string(),
        V::ShortShortInt(number) | V::ShortInt(number) | V::LongInt(number) => number.to_string(),
        V::ShortShortUint(number) | V::ShortUint(number) | V::LongUint(number) => {
            number.to_string()
        }
        V::LongLongInt(number) => number.to_string(),
        V::Float(number) => number.to_string(),
        V::Double(number) => number.to_string(),
        V::Decimal(decimal) => decimal_text(decimal),
        V::ShortString(text) => format!("{text:?}"),
        V::LongString(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => format!("{text:?}"),
            Err(_) => binary_text(bytes),
        },
        V::Array(array) => format!(
            "[{}]",
            array
                .values
                .iter()
                .map(|value| value_to_text_at(value, depth + 1))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        // Seconds, as AMQP specifies, else the unit its range says (the
        // capture's one rule: producers write milliseconds here too).
        V::Timestamp(value) => match redrive_proto::time::from_epoch_by_range(i128::from(*value)) {
            Some((at, 0)) => crate::time::rfc3339(at),
            Some((at, unit)) => format!(
                "{} ({value} read as {})",
                crate::time::rfc3339(at),
                redrive_proto::time::EPOCH_UNITS
                    .get(unit)
                    .map_or("another unit", |(name, _)| *name)
            ),
            None => i64::try_from(*value)
                .ok()
                .and_then(|seconds| chrono::DateTime::from_timestamp(seconds, 0))
                .map_or_else(|| value.to_string(), crate::time::rfc3339),
        },
        V::Table(table) => format!(
            "{{{}}}",
            table
                .fields
                .iter()
                .map(|(name, value)| format!("{name}: {}", value_to_text_at(value, depth + 1)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        V::ByteArray(bytes) => binary_text(bytes),
        V::Void(_) => "void".to_owned(),
    }
}

/// The type name of a header value (`i64`, `long_string`, ...).
pub fn type_name(value: &HeaderValue) -> &'static str {
    use header_value::Value as V;
    match &value.value {
        None | Some(V::Void(_)) => "void",
        Some(V::Boolean(_)) => "bool",
        Some(V::ShortShortInt(_)) => "i8",
        Some(V::ShortShortUint(_)) => "u8",
        Some(V::ShortInt(_)) => "i16",
        Some(V::ShortUint(_)) => "u16",
        Some(V::LongInt(_)) => "i32",
        Some(V::LongUint(_)) => "u32",
        Some(V::LongLongInt(_)) => "i64",
        Some(V::Float(_)) => "f32",
        Some(V::Double(_)) => "f64",
        Some(V::Decimal(_)) => "decimal",
        Some(V::ShortString(_)) => "short_string",
        Some(V::LongString(_)) => "long_string",
        Some(V::Array(_)) => "array",
        Some(V::Timestamp(_)) => "timestamp",
        Some(V::Table(_)) => "table",
        Some(V::ByteArray(_)) => "byte_array",
    }
}

fn decimal_text(decimal: &DecimalValue) -> String {
    let digits = decimal.value.to_string();
    let scale = usize::try_from(decimal.scale).unwrap_or(usize::MAX);
    if scale == 0 {
        return digits;
    }
    if digits.len() > scale {
        let (whole, fraction) = digits.split_at(digits.len() - scale);
        format!("{whole}.{fraction}")
    } else {
        format!("0.{}{digits}", "0".repeat(scale - digits.len()))
    }
}

fn binary_text(bytes: &[u8]) -> String {
    const SHOWN: usize = 48;
    let encoded = STANDARD.encode(&bytes[..bytes.len().min(SHOWN)]);
    let more = if bytes.len() > SHOWN { "..." } else { "" };
    format!("<{} bytes, base64 {encoded}{more}>", bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use header_value::Value as V;

    fn value(inner: V) -> HeaderValue {
        HeaderValue { value: Some(inner) }
    }

    fn table(fields: Vec<(&str, V)>) -> HeaderTable {
        HeaderTable {
            fields: fields
                .into_iter()
                .map(|(name, inner)| (name.to_owned(), value(inner)))
                .collect(),
        }
    }

    /// An `x-death` header as RabbitMQ writes it: an array of tables.
    fn x_death() -> HeaderValue {
        value(V::Array(HeaderArray {
            values: vec![value(V::Table(table(vec![
                ("count", V::LongLongInt(3)),
                ("reason", V::LongString(b"rejected".to_vec())),
                ("queue", V::LongString(b"orders".to_vec())),
                ("time", V::Timestamp(1_700_000_000)),
                ("exchange", V::LongString(b"shop".to_vec())),
                (
                    "routing-keys",
                    V::Array(HeaderArray {
                        values: vec![value(V::LongString(b"order.created".to_vec()))],
                    }),
                ),
            ])))],
        }))
    }

    #[test]
    fn every_scalar_type_renders_with_its_name() {
        let cases = [
            (V::Boolean(true), json!({"type": "bool", "value": true})),
            (V::ShortShortInt(-5), json!({"type": "i8", "value": -5})),
            (V::ShortShortUint(250), json!({"type": "u8", "value": 250})),
            (V::ShortInt(-300), json!({"type": "i16", "value": -300})),
            (V::ShortUint(60_000), json!({"type": "u16", "value": 60000})),
            (V::LongInt(-70_000), json!({"type": "i32", "value": -70000})),
            (
                V::LongUint(4_000_000_000),
                json!({"type": "u32", "value": 4_000_000_000_u32}),
            ),
            (
                V::LongLongInt(-1 << 40),
                json!({"type": "i64", "value": -1_i64 << 40}),
            ),
            (V::Float(0.1), json!({"type": "f32", "value": 0.1})),
            (V::Double(2.5), json!({"type": "f64", "value": 2.5})),
            (V::Double(f64::NAN), json!({"type": "f64", "value": "NaN"})),
            (
                V::Float(f32::NEG_INFINITY),
                json!({"type": "f32", "value": "-inf"}),
            ),
            (
                V::Decimal(DecimalValue {
                    scale: 2,
                    value: 1234,
                }),
                json!({"type": "decimal", "value": {"scale": 2, "value": 1234}}),
            ),
            (
                V::ShortString("s".into()),
                json!({"type": "short_string", "value": "s"}),
            ),
            (
                V::LongString(b"text".to_vec()),
                json!({"type": "long_string", "value": "text"}),
            ),
            (
                V::LongString(vec![0xff, 0x00]),
                json!({"type": "long_string", "base64": "/wA="}),
            ),
            (
                V::Timestamp(1_700_000_000),
                json!({"type": "timestamp", "value": 1_700_000_000}),
            ),
            (
                V::ByteArray(vec![1, 2, 3]),
                json!({"type": "byte_array", "base64": "AQID"}),
            ),
            (V::Void(Void {}), json!({"type": "void"})),
        ];
        for (inner, expected) in cases {
            assert_eq!(value_to_json(&value(inner.clone())), expected, "{inner:?}");
        }
        assert_eq!(
            value_to_json(&HeaderValue { value: None }),
            json!({"type": "void"})
        );
    }

    #[test]
    fn nested_x_death_renders_as_array_of_tables() {
        let headers = HeaderTable {
            fields: [("x-death".to_owned(), x_death())].into_iter().collect(),
        };
        assert_eq!(
            table_to_json(&headers),
            json!({
                "x-death": {"type": "array", "value": [{"type": "table", "value": {
                    "count": {"type": "i64", "value": 3},
                    "exchange": {"type": "long_string", "value": "shop"},
                    "queue": {"type": "long_string", "value": "orders"},
                    "reason": {"type": "long_string", "value": "rejected"},
                    "routing-keys": {"type": "array", "value": [
                        {"type": "long_string", "value": "order.created"}
                    ]},
                    "time": {"type": "timestamp", "value": 1_700_000_000},
                }}]}
            })
        );
    }

    #[test]
    fn typed_json_reads_back_to_the_same_value() {
        let all = table(vec![
            ("bool", V::Boolean(false)),
            ("i8", V::ShortShortInt(-128)),
            ("u8", V::ShortShortUint(255)),
            ("i16", V::ShortInt(i16::MIN.into())),
            ("u16", V::ShortUint(u16::MAX.into())),
            ("i32", V::LongInt(i32::MIN)),
            ("u32", V::LongUint(u32::MAX)),
            ("i64", V::LongLongInt(i64::MAX)),
            ("f32", V::Float(0.1)),
            ("f64", V::Double(-1.25e300)),
            ("decimal", V::Decimal(DecimalValue { scale: 3, value: 7 })),
            ("short", V::ShortString("hi".into())),
            ("long", V::LongString("héllo".as_bytes().to_vec())),
            ("binary", V::LongString(vec![0x1f, 0x8b, 0xff])),
            ("bytes", V::ByteArray(vec![0, 1, 2, 255])),
            ("at", V::Timestamp(42)),
            ("void", V::Void(Void {})),
        ]);
        let mut headers = all.clone();
        headers.fields.insert("x-death".into(), x_death());
        headers.fields.insert("nested".into(), value(V::Table(all)));
        let json = table_to_json(&headers);
        assert_eq!(table_from_json("headers", &json).unwrap(), headers);
    }

    #[test]
    fn plain_json_maps_to_amqp_types() {
        let json = json!({
            "text": "abc",
            "count": 7,
            "ratio": 0.5,
            "flag": true,
            "list": [1, "two"],
            "nested": {"a": null},
            "not-typed": {"type": "order", "id": 1},
        });
        let headers = table_from_json("headers", &json).unwrap();
        let get = |name: &str| headers.fields[name].value.clone().unwrap();
        assert_eq!(get("text"), V::LongString(b"abc".to_vec()));
        assert_eq!(get("count"), V::LongLongInt(7));
        assert_eq!(get("ratio"), V::Double(0.5));
        assert_eq!(get("flag"), V::Boolean(true));
        assert_eq!(
            get("list"),
            V::Array(HeaderArray {
                values: vec![
                    value(V::LongLongInt(1)),
                    value(V::LongString(b"two".to_vec()))
                ],
            })
        );
        assert_eq!(
            get("nested"),
            V::Table(table(vec![("a", V::Void(Void {}))]))
        );
        // An object whose "type" is not a type name (or with other keys) is a table.
        assert_eq!(
            get("not-typed"),
            V::Table(table(vec![
                ("id", V::LongLongInt(1)),
                ("type", V::LongString(b"order".to_vec())),
            ]))
        );
    }

    #[test]
    fn wrong_typed_values_are_named() {
        let cases = [
            (
                json!({"type": "u8", "value": 256}),
                "headers.h: u8 needs an integer in 0..=255",
            ),
            (
                json!({"type": "i8", "value": "1"}),
                "headers.h: i8 needs an integer",
            ),
            (
                json!({"type": "bool"}),
                "headers.h: a bool value needs a \"value\" field",
            ),
            (
                json!({"type": "byte_array", "base64": "%%"}),
                "headers.h.base64: not valid base64",
            ),
            (
                json!({"type": "byte_array", "value": "x"}),
                "takes \"base64\", not \"value\"",
            ),
            (
                json!({"type": "i32", "base64": "AA=="}),
                "only long_string and byte_array",
            ),
            (
                json!({"type": "decimal", "value": {"scale": 1}}),
                "decimal needs",
            ),
            (
                json!({"type": "array", "value": [{"type": "u16", "value": -1}]}),
                "headers.h[0]: u16",
            ),
            (
                json!({"type": "table", "value": {"a": {"type": "void", "value": 1}}}),
                "headers.h.a: void takes no value",
            ),
            (json!(u64::MAX), "does not fit an i64"),
            (
                serde_json::from_str::<Value>("1180591620717411303424").unwrap(),
                "would be rounded as a double",
            ),
            (
                serde_json::from_str::<Value>("-1e20").unwrap(),
                "would be rounded as a double",
            ),
        ];
        for (json, expected) in cases {
            let error = value_from_json("headers.h", &json).unwrap_err();
            assert!(error.contains(expected), "{json}: {error}");
        }
        let error = table_from_json("headers", &json!([1])).unwrap_err();
        assert!(error.contains("expected an object"), "{error}");
    }

    /// Headers stored before the planner had a nesting limit render without
    /// unbounded recursion: the levels over it are named, not shown.
    #[test]
    fn rendering_stops_at_the_nesting_limit() {
        let mut deep = HeaderValue {
            value: Some(header_value::Value::Boolean(true)),
        };
        for _ in 0..MAX_HEADER_NESTING + 5 {
            deep = HeaderValue {
                value: Some(header_value::Value::Array(HeaderArray {
                    values: vec![deep],
                })),
            };
        }
        let json = value_to_json(&deep).to_string();
        assert!(json.contains(TOO_DEEP), "{json}");
        assert_eq!(
            json.matches(r#""type":"array""#).count(),
            MAX_HEADER_NESTING + 1
        );
        let text = value_to_text(&deep);
        assert!(text.contains(TOO_DEEP), "{text}");
        assert_eq!(text.matches('[').count(), MAX_HEADER_NESTING);
    }

    #[test]
    fn text_rendering_is_compact() {
        assert_eq!(
            value_to_text(&x_death()),
            "[{count: 3, exchange: \"shop\", queue: \"orders\", reason: \"rejected\", \
             routing-keys: [\"order.created\"], time: 2023-11-14T22:13:20.000Z}]"
        );
        assert_eq!(
            value_to_text(&value(V::Decimal(DecimalValue { scale: 3, value: 7 }))),
            "0.007"
        );
        assert_eq!(
            value_to_text(&value(V::Decimal(DecimalValue {
                scale: 1,
                value: 1234
            }))),
            "123.4"
        );
        assert_eq!(
            value_to_text(&value(V::ByteArray(vec![1, 2]))),
            "<2 bytes, base64 AQI=>"
        );
        // A timestamp header in milliseconds, as producers write them, is
        // read as the capture reads it, never as the year 58899.
        assert_eq!(
            value_to_text(&value(V::Timestamp(1_700_000_000))),
            "2023-11-14T22:13:20.000Z"
        );
        assert_eq!(
            value_to_text(&value(V::Timestamp(1_700_000_000_123))),
            "2023-11-14T22:13:20.123Z (1700000000123 read as milliseconds)"
        );
    }
}
