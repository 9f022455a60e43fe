//! A cursor over bytes; every read checks the length.

use super::RawError;

/// A cursor over bytes; every read checks the length.
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Bytes not read yet.
    pub(super) fn remaining(&self) -> usize {
        self.bytes.len()
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], RawError> {
        if self.bytes.len() < n {
            return Err(RawError::Protocol(format!(
                "{n} bytes wanted, {} left",
                self.bytes.len()
            )));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    pub(super) fn u8(&mut self) -> Result<u8, RawError> {
        Ok(self.take(1)?[0])
    }

    pub(super) fn u16(&mut self) -> Result<u16, RawError> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    pub(super) fn u32(&mut self) -> Result<u32, RawError> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    pub(super) fn u64(&mut self) -> Result<u64, RawError> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    pub(super) fn short_bytes(&mut self) -> Result<&'a [u8], RawError> {
        let length = self.u8()? as usize;
        self.take(length)
    }
}
