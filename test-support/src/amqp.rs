//! AMQP 0-9-1 content headers with any bytes, which lapin cannot write: for
//! tests that need a message lapin cannot publish (a short string that is
//! not UTF-8, a header over `frame_max`). The planner's fallback reader
//! (`redrive_planner::capture::raw`) publishes and decodes them.

/// Builds a content header payload from raw parts, for tests that
/// need a message lapin cannot publish (any bytes in a short string).
/// `properties` are `(flag bit, encoded value)` pairs in descending bit order
/// (15 = `content_type` … 2 = `cluster_id`, AMQP 0-9-1 §1.8), each value
/// already encoded (a short string is its length byte then its bytes).
pub fn content_header(body_size: u64, properties: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&60u16.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    out.extend_from_slice(&body_size.to_be_bytes());
    let flags = properties
        .iter()
        .fold(0u16, |acc, (bit, _)| acc | (1 << bit));
    out.extend_from_slice(&flags.to_be_bytes());
    let mut sorted: Vec<&(u16, Vec<u8>)> = properties.iter().collect();
    sorted.sort_by_key(|(bit, _)| std::cmp::Reverse(*bit));
    for (_, value) in sorted {
        out.extend_from_slice(value);
    }
    out
}

/// Encoders for the parts of a content header, with any bytes (which lapin
/// cannot write): for tests that need a message lapin cannot
/// publish. Field types per RabbitMQ's table (AMQP 0-9-1 errata).
pub mod encode {
    /// A short string: its length byte, then its bytes (at most 255).
    ///
    /// # Panics
    /// When `bytes` is over 255 bytes.
    pub fn short_string(bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![u8::try_from(bytes.len()).expect("a short string is at most 255 bytes")];
        out.extend_from_slice(bytes);
        out
    }

    /// A field table from names and already encoded values (type tag
    /// included): its 4-byte length, then the fields.
    pub fn table(fields: &[(&[u8], Vec<u8>)]) -> Vec<u8> {
        let mut inner = Vec::new();
        for (key, value) in fields {
            inner.extend(short_string(key));
            inner.extend_from_slice(value);
        }
        let mut out = u32::try_from(inner.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes()
            .to_vec();
        out.extend(inner);
        out
    }

    /// A long-string field value (`S`).
    pub fn long_string(bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![b'S'];
        out.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(bytes);
        out
    }
}
