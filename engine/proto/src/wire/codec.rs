//! Byte codecs every layout is built with: a bounds-checked big-endian [`Reader`] and
//! [`Writer`] (variable-length integers are `varint.rs`).

use super::varint;
use super::WireError;

/// Bounds-checked big-endian reader.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Reader<'a> {
    /// Read from the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }
    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    /// Take `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.remaining() < n {
            return Err(WireError::Truncated);
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    /// Read one byte.
    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.bytes(1)?[0])
    }
    /// Read a big-endian u64.
    pub fn u64(&mut self) -> Result<u64, WireError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.bytes(8)?);
        Ok(u64::from_be_bytes(a))
    }
    /// Read a varint.
    pub fn varint(&mut self) -> Result<u64, WireError> {
        let (v, n) = varint::decode(&self.buf[self.pos..])?;
        self.pos += n;
        Ok(v)
    }
    /// The rest of the input.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }
}

/// Bounds-checked big-endian writer into a caller buffer.
#[derive(Debug)]
pub struct Writer<'a> {
    pub(super) buf: &'a mut [u8],
    pub(super) pos: usize,
}

impl<'a> Writer<'a> {
    /// Write from the start of `buf`.
    pub fn new(buf: &'a mut [u8]) -> Self {
        Self { buf, pos: 0 }
    }
    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.pos
    }
    /// True when nothing was written.
    pub fn is_empty(&self) -> bool {
        self.pos == 0
    }
    /// Space left.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    /// Append bytes.
    pub fn bytes(&mut self, b: &[u8]) -> Result<(), WireError> {
        if self.remaining() < b.len() {
            return Err(WireError::BufferTooSmall);
        }
        self.buf[self.pos..self.pos + b.len()].copy_from_slice(b);
        self.pos += b.len();
        Ok(())
    }
    /// Append one byte.
    pub fn u8(&mut self, v: u8) -> Result<(), WireError> {
        self.bytes(&[v])
    }
    /// Append a big-endian u64.
    pub fn u64(&mut self, v: u64) -> Result<(), WireError> {
        self.bytes(&v.to_be_bytes())
    }
    /// Append a varint.
    pub fn varint(&mut self, v: u64) -> Result<(), WireError> {
        let n = varint::encode(v, &mut self.buf[self.pos..])?;
        self.pos += n;
        Ok(())
    }
    /// Append `n` zero bytes.
    pub fn zeros(&mut self, n: usize) -> Result<(), WireError> {
        if self.remaining() < n {
            return Err(WireError::BufferTooSmall);
        }
        self.buf[self.pos..self.pos + n].fill(0);
        self.pos += n;
        Ok(())
    }
}
