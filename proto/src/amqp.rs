//! Lossless conversions between the API's [`HeaderTable`] / [`MessageProperties`]
//! and lapin's AMQP 0-9-1 types.
//!
//! Every field-table value keeps its wire type (AMQP 0-9-1 §4.2.5.5 and
//! RabbitMQ's field-table extensions, <https://www.rabbitmq.com/amqp-0-9-1-errata.html#section_3>),
//! so a dead letter captured from RabbitMQ is replayed with headers of the same
//! types: `AMQP → proto → AMQP` is the identity (property-tested below).

use lapin::{
    BasicProperties,
    types::{AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable, LongString, ShortString},
};

use crate::v1::{
    self, HeaderArray, HeaderTable, HeaderValue, MessageProperties, header_value::Value,
};

/// A proto value that AMQP cannot carry.
#[derive(Debug, thiserror::Error)]
pub enum AmqpConversionError {
    /// A table key or short string is longer than 255 bytes.
    #[error("{what} {value:?} is longer than 255 bytes, the AMQP short-string limit")]
    ShortStringTooLong {
        /// Which field.
        what: &'static str,
        /// Its value.
        value: String,
    },
    /// An integer does not fit the AMQP type it claims.
    #[error("header value {value} does not fit AMQP type {amqp_type}")]
    OutOfRange {
        /// The AMQP type name.
        amqp_type: &'static str,
        /// The value.
        value: i64,
    },
    /// A header value has no type set.
    #[error("a header value has no type set")]
    Empty,
    /// Tables and arrays nest deeper than
    /// [`crate::limits::MAX_HEADER_NESTING`] (the API refuses those; this
    /// guards the recursion for anything stored before the limit).
    #[error(
        "headers nest deeper than {} levels",
        crate::limits::MAX_HEADER_NESTING
    )]
    TooDeep,
}

fn short_string(what: &'static str, value: &str) -> Result<ShortString, AmqpConversionError> {
    ShortString::try_new(value).map_err(|_| AmqpConversionError::ShortStringTooLong {
        what,
        value: value.to_owned(),
    })
}

/// Marks a value left out for nesting deeper than the limit.
const TOO_DEEP: &[u8] = b"(nested deeper than the header limit: not converted)";

/// The proto form of one AMQP value. Tables and arrays nested deeper than
/// [`crate::limits::MAX_HEADER_NESTING`] (capture's guard never lets lapin
/// read those) are replaced by a long string saying so, so this recursion is
/// bounded.
pub fn value_from_amqp(value: &AMQPValue) -> HeaderValue {
    value_from_amqp_at(value, 1)
}

/// `depth`: the nesting level `value` has if it is a table or an array.
fn value_from_amqp_at(value: &AMQPValue, depth: usize) -> HeaderValue {
    let nests = matches!(value, AMQPValue::FieldArray(_) | AMQPValue::FieldTable(_));
    if nests && depth > crate::limits::MAX_HEADER_NESTING {
        return HeaderValue {
            value: Some(Value::LongString(TOO_DEEP.to_vec())),
        };
    }
    let value = match value {
        AMQPValue::Boolean(v) => Value::Boolean(*v),
        AMQPValue::ShortShortInt(v) => Value::ShortShortInt(i32::from(*v)),
        AMQPValue::ShortShortUInt(v) => Value::ShortShortUint(u32::from(*v)),
        AMQPValue::ShortInt(v) => Value::ShortInt(i32::from(*v)),
        AMQPValue::ShortUInt(v) => Value::ShortUint(u32::from(*v)),
        AMQPValue::LongInt(v) => Value::LongInt(*v),
        AMQPValue::LongUInt(v) => Value::LongUint(*v),
        AMQPValue::LongLongInt(v) => Value::LongLongInt(*v),
        AMQPValue::Float(v) => Value::Float(*v),
        AMQPValue::Double(v) => Value::Double(*v),
        AMQPValue::DecimalValue(v) => Value::Decimal(v1::DecimalValue {
            scale: u32::from(v.scale),
            value: v.value,
        }),
        AMQPValue::ShortString(v) => Value::ShortString(v.as_str().to_owned()),
        AMQPValue::LongString(v) => Value::LongString(v.as_bytes().to_vec()),
        AMQPValue::FieldArray(v) => Value::Array(HeaderArray {
            values: v
                .as_slice()
                .iter()
                .map(|value| value_from_amqp_at(value, depth + 1))
                .collect(),
        }),
        AMQPValue::Timestamp(v) => Value::Timestamp(*v),
        AMQPValue::FieldTable(v) => Value::Table(table_from_amqp_at(v, depth)),
        AMQPValue::ByteArray(v) => Value::ByteArray(v.as_slice().to_vec()),
        AMQPValue::Void => Value::Void(v1::Void {}),
    };
    HeaderValue { value: Some(value) }
}

/// The proto form of an AMQP field table (the top level of headers).
pub fn table_from_amqp(table: &FieldTable) -> HeaderTable {
    table_from_amqp_at(table, 1)
}

/// `depth`: the nesting level of `table` itself.
fn table_from_amqp_at(table: &FieldTable, depth: usize) -> HeaderTable {
    HeaderTable {
        fields: table
            .inner()
            .iter()
            .map(|(key, value)| {
                (
                    key.as_str().to_owned(),
                    value_from_amqp_at(value, depth + 1),
                )
            })
            .collect(),
    }
}

fn narrow<T: TryFrom<i64>>(amqp_type: &'static str, value: i64) -> Result<T, AmqpConversionError> {
    T::try_from(value).map_err(|_| AmqpConversionError::OutOfRange { amqp_type, value })
}

/// The AMQP form of one proto value.
///
/// # Errors
/// [`AmqpConversionError`] when an integer does not fit its AMQP type, a short
/// string is over 255 bytes, the value is empty, or tables and arrays nest
/// deeper than [`crate::limits::MAX_HEADER_NESTING`].
pub fn value_to_amqp(value: &HeaderValue) -> Result<AMQPValue, AmqpConversionError> {
    value_to_amqp_at(value, 1)
}

/// `depth`: the nesting level `value` has if it is a table or an array.
fn value_to_amqp_at(value: &HeaderValue, depth: usize) -> Result<AMQPValue, AmqpConversionError> {
    let Some(value) = &value.value else {
        return Err(AmqpConversionError::Empty);
    };
    if matches!(value, Value::Array(_) | Value::Table(_))
        && depth > crate::limits::MAX_HEADER_NESTING
    {
        return Err(AmqpConversionError::TooDeep);
    }
    Ok(match value {
        Value::Boolean(v) => AMQPValue::Boolean(*v),
        Value::ShortShortInt(v) => {
            AMQPValue::ShortShortInt(narrow("short-short-int", i64::from(*v))?)
        }
        Value::ShortShortUint(v) => {
            AMQPValue::ShortShortUInt(narrow("short-short-uint", i64::from(*v))?)
        }
        Value::ShortInt(v) => AMQPValue::ShortInt(narrow("short-int", i64::from(*v))?),
        Value::ShortUint(v) => AMQPValue::ShortUInt(narrow("short-uint", i64::from(*v))?),
        Value::LongInt(v) => AMQPValue::LongInt(*v),
        Value::LongUint(v) => AMQPValue::LongUInt(*v),
        Value::LongLongInt(v) => AMQPValue::LongLongInt(*v),
        Value::Float(v) => AMQPValue::Float(*v),
        Value::Double(v) => AMQPValue::Double(*v),
        Value::Decimal(v) => AMQPValue::DecimalValue(DecimalValue {
            scale: narrow("decimal scale", i64::from(v.scale))?,
            value: v.value,
        }),
        Value::ShortString(v) => AMQPValue::ShortString(short_string("short string", v)?),
        Value::LongString(v) => AMQPValue::LongString(LongString::from(v.clone())),
        Value::Array(v) => AMQPValue::FieldArray(FieldArray::from(
            v.values
                .iter()
                .map(|value| value_to_amqp_at(value, depth + 1))
                .collect::<Result<Vec<_>, _>>()?,
        )),
        Value::Timestamp(v) => AMQPValue::Timestamp(*v),
        Value::Table(v) => AMQPValue::FieldTable(table_to_amqp_at(v, depth)?),
        Value::ByteArray(v) => AMQPValue::ByteArray(ByteArray::from(v.clone())),
        Value::Void(_) => AMQPValue::Void,
    })
}

/// The AMQP form of a proto header table.
///
/// # Errors
/// As [`value_to_amqp`], and for a key over 255 bytes.
pub fn table_to_amqp(table: &HeaderTable) -> Result<FieldTable, AmqpConversionError> {
    table_to_amqp_at(table, 1)
}

/// `depth`: the nesting level of `table` itself.
fn table_to_amqp_at(table: &HeaderTable, depth: usize) -> Result<FieldTable, AmqpConversionError> {
    let mut amqp = FieldTable::default();
    for (key, value) in &table.fields {
        amqp.insert(
            short_string("header name", key)?,
            value_to_amqp_at(value, depth + 1)?,
        );
    }
    Ok(amqp)
}

/// The proto form of AMQP basic properties, without headers (see
/// [`table_from_amqp`] for those).
pub fn properties_from_amqp(properties: &BasicProperties) -> MessageProperties {
    let text = |value: &Option<ShortString>| value.as_ref().map(|v| v.as_str().to_owned());
    MessageProperties {
        content_type: text(properties.content_type()),
        content_encoding: text(properties.content_encoding()),
        delivery_mode: properties.delivery_mode().map(u32::from),
        priority: properties.priority().map(u32::from),
        correlation_id: text(properties.correlation_id()),
        reply_to: text(properties.reply_to()),
        expiration: text(properties.expiration()),
        message_id: text(properties.message_id()),
        timestamp: *properties.timestamp(),
        r#type: text(properties.kind()),
        user_id: text(properties.user_id()),
        app_id: text(properties.app_id()),
        cluster_id: text(properties.cluster_id()),
    }
}

/// AMQP basic properties from the proto form and a header table.
///
/// # Errors
/// [`AmqpConversionError`] for a property over 255 bytes or a delivery mode or
/// priority over 255.
pub fn properties_to_amqp(
    properties: &MessageProperties,
    headers: FieldTable,
) -> Result<BasicProperties, AmqpConversionError> {
    let mut amqp = BasicProperties::default().with_headers(headers);
    let text = |what, value: &Option<String>| -> Result<Option<ShortString>, AmqpConversionError> {
        value.as_deref().map(|v| short_string(what, v)).transpose()
    };
    if let Some(v) = text("content_type", &properties.content_type)? {
        amqp = amqp.with_content_type(v);
    }
    if let Some(v) = text("content_encoding", &properties.content_encoding)? {
        amqp = amqp.with_content_encoding(v);
    }
    if let Some(v) = properties.delivery_mode {
        amqp = amqp.with_delivery_mode(narrow("delivery_mode", i64::from(v))?);
    }
    if let Some(v) = properties.priority {
        amqp = amqp.with_priority(narrow("priority", i64::from(v))?);
    }
    if let Some(v) = text("correlation_id", &properties.correlation_id)? {
        amqp = amqp.with_correlation_id(v);
    }
    if let Some(v) = text("reply_to", &properties.reply_to)? {
        amqp = amqp.with_reply_to(v);
    }
    if let Some(v) = text("expiration", &properties.expiration)? {
        amqp = amqp.with_expiration(v);
    }
    if let Some(v) = text("message_id", &properties.message_id)? {
        amqp = amqp.with_message_id(v);
    }
    if let Some(v) = properties.timestamp {
        amqp = amqp.with_timestamp(v);
    }
    if let Some(v) = text("type", &properties.r#type)? {
        amqp = amqp.with_type(v);
    }
    if let Some(v) = text("user_id", &properties.user_id)? {
        amqp = amqp.with_user_id(v);
    }
    if let Some(v) = text("app_id", &properties.app_id)? {
        amqp = amqp.with_app_id(v);
    }
    if let Some(v) = text("cluster_id", &properties.cluster_id)? {
        amqp = amqp.with_cluster_id(v);
    }
    Ok(amqp)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A short string's worth of any text: at most 63 characters of up to
    /// 4 bytes each.
    fn short_text() -> impl Strategy<Value = Option<String>> {
        proptest::option::of("(?s).{0,63}")
    }

    fn message_properties() -> impl Strategy<Value = MessageProperties> {
        (
            (
                short_text(),
                short_text(),
                proptest::option::of(0_u32..=255),
            ),
            (
                proptest::option::of(0_u32..=255),
                short_text(),
                short_text(),
            ),
            (
                short_text(),
                short_text(),
                proptest::option::of(any::<u64>()),
            ),
            (short_text(), short_text(), short_text(), short_text()),
        )
            .prop_map(
                |(
                    (content_type, content_encoding, delivery_mode),
                    (priority, correlation_id, reply_to),
                    (expiration, message_id, timestamp),
                    (r#type, user_id, app_id, cluster_id),
                )| MessageProperties {
                    content_type,
                    content_encoding,
                    delivery_mode,
                    priority,
                    correlation_id,
                    reply_to,
                    expiration,
                    message_id,
                    timestamp,
                    r#type,
                    user_id,
                    app_id,
                    cluster_id,
                },
            )
    }

    fn amqp_value() -> impl Strategy<Value = AMQPValue> {
        let leaf = prop_oneof![
            any::<bool>().prop_map(AMQPValue::Boolean),
            any::<i8>().prop_map(AMQPValue::ShortShortInt),
            any::<u8>().prop_map(AMQPValue::ShortShortUInt),
            any::<i16>().prop_map(AMQPValue::ShortInt),
            any::<u16>().prop_map(AMQPValue::ShortUInt),
            any::<i32>().prop_map(AMQPValue::LongInt),
            any::<u32>().prop_map(AMQPValue::LongUInt),
            any::<i64>().prop_map(AMQPValue::LongLongInt),
            (-1e6f32..1e6).prop_map(AMQPValue::Float),
            (-1e12f64..1e12).prop_map(AMQPValue::Double),
            (any::<u8>(), any::<u32>())
                .prop_map(|(scale, value)| AMQPValue::DecimalValue(DecimalValue { scale, value })),
            "[a-z]{0,20}".prop_map(|s| AMQPValue::ShortString(s.into())),
            proptest::collection::vec(any::<u8>(), 0..40)
                .prop_map(|b| AMQPValue::LongString(b.into())),
            any::<u64>().prop_map(AMQPValue::Timestamp),
            proptest::collection::vec(any::<u8>(), 0..40)
                .prop_map(|b| AMQPValue::ByteArray(b.into())),
            Just(AMQPValue::Void),
        ];
        leaf.prop_recursive(3, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6)
                    .prop_map(|v| AMQPValue::FieldArray(v.into())),
                proptest::collection::btree_map("[a-z-]{1,12}", inner, 0..6).prop_map(|m| {
                    AMQPValue::FieldTable(
                        m.into_iter()
                            .map(|(k, v)| (ShortString::from(k), v))
                            .collect::<std::collections::BTreeMap<_, _>>()
                            .into(),
                    )
                }),
            ]
        })
    }

    proptest! {
        #[test]
        fn amqp_values_round_trip(value in amqp_value()) {
            let back = value_to_amqp(&value_from_amqp(&value)).unwrap();
            prop_assert_eq!(back, value);
        }

        /// Every basic property, with any Unicode text (control characters
        /// and newlines too) up to the 255-byte limit of a short string.
        #[test]
        fn properties_round_trip(properties in message_properties()) {
            let amqp = properties_to_amqp(&properties, FieldTable::default()).unwrap();
            prop_assert_eq!(properties_from_amqp(&amqp), properties);
        }

        /// A text property over 255 bytes is refused, naming the property.
        #[test]
        fn a_long_property_is_refused_by_name(
            field in 0_usize..10,
            text in "(?s).{64,80}",
        ) {
            let long = text.repeat(4); // ≥ 256 characters, so ≥ 256 bytes
            let mut properties = MessageProperties::default();
            let (name, slot) = match field {
                0 => ("content_type", &mut properties.content_type),
                1 => ("content_encoding", &mut properties.content_encoding),
                2 => ("correlation_id", &mut properties.correlation_id),
                3 => ("reply_to", &mut properties.reply_to),
                4 => ("expiration", &mut properties.expiration),
                5 => ("message_id", &mut properties.message_id),
                6 => ("type", &mut properties.r#type),
                7 => ("user_id", &mut properties.user_id),
                8 => ("app_id", &mut properties.app_id),
                _ => ("cluster_id", &mut properties.cluster_id),
            };
            *slot = Some(long);
            let error = properties_to_amqp(&properties, FieldTable::default()).unwrap_err();
            prop_assert!(error.to_string().contains(name), "{} names {}", error, name);
        }
    }

    /// Tables `depth` levels deep, the outer one included.
    fn nested_amqp(depth: usize) -> FieldTable {
        let mut table = FieldTable::default();
        for _ in 1..depth {
            let mut outer = FieldTable::default();
            outer.insert("n".into(), AMQPValue::FieldTable(table));
            table = outer;
        }
        table
    }

    #[test]
    fn nesting_is_bounded_both_ways() {
        let limit = crate::limits::MAX_HEADER_NESTING;
        let at_limit = table_from_amqp(&nested_amqp(limit));
        assert_eq!(table_to_amqp(&at_limit).unwrap(), nested_amqp(limit));
        let over = table_from_amqp(&nested_amqp(limit + 1));
        table_to_amqp(&over).expect("the marker converts");
        // The level over the limit became a string saying so.
        let mut value = over.fields.get("n").cloned();
        for _ in 2..limit {
            value = match value.and_then(|v| v.value) {
                Some(Value::Table(table)) => table.fields.get("n").cloned(),
                other => panic!("{other:?}"),
            };
        }
        assert!(matches!(
            value.and_then(|v| v.value),
            Some(Value::Table(table)) if matches!(
                table.fields.get("n").and_then(|v| v.value.clone()),
                Some(Value::LongString(text)) if text == TOO_DEEP
            )
        ));
        let mut deep = HeaderTable::default();
        for _ in 0..limit {
            deep = HeaderTable {
                fields: [(
                    "n".to_owned(),
                    HeaderValue {
                        value: Some(Value::Table(deep)),
                    },
                )]
                .into(),
            };
        }
        assert!(matches!(
            table_to_amqp(&deep),
            Err(AmqpConversionError::TooDeep)
        ));
    }

    #[test]
    fn out_of_range_integer_is_refused() {
        let value = HeaderValue {
            value: Some(Value::ShortShortInt(300)),
        };
        let error = value_to_amqp(&value).unwrap_err();
        assert!(error.to_string().contains("300"), "{error}");
    }
}
