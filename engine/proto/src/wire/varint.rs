//! QUIC variable-length integers (RFC 9000 §16): 1, 2, 4 or 8 bytes, length in the top 2 bits.

use super::WireError;

/// Largest encodable value, 2^62 − 1.
pub const MAX_VARINT: u64 = (1 << 62) - 1;

/// Encoded length of `v` (values above [`MAX_VARINT`] report 8; encoding them fails).
pub fn varint_len(v: u64) -> usize {
    if v < 1 << 6 {
        1
    } else if v < 1 << 14 {
        2
    } else if v < 1 << 30 {
        4
    } else {
        8
    }
}

/// Encode `v` at the start of `out`, returning the bytes written.
pub(crate) fn encode(v: u64, out: &mut [u8]) -> Result<usize, WireError> {
    if v > MAX_VARINT {
        return Err(WireError::ValueOutOfRange);
    }
    let n = varint_len(v);
    if out.len() < n {
        return Err(WireError::BufferTooSmall);
    }
    match n {
        1 => out[0] = v as u8,
        2 => out[..2].copy_from_slice(&((v as u16) | 0x4000).to_be_bytes()),
        4 => out[..4].copy_from_slice(&((v as u32) | 0x8000_0000).to_be_bytes()),
        _ => out[..8].copy_from_slice(&(v | 0xc000_0000_0000_0000).to_be_bytes()),
    }
    Ok(n)
}

/// Decode a varint from the start of `buf`: `(value, bytes read)`.
pub(crate) fn decode(buf: &[u8]) -> Result<(u64, usize), WireError> {
    let first = *buf.first().ok_or(WireError::Truncated)?;
    let n = 1usize << (first >> 6);
    let bytes = buf.get(..n).ok_or(WireError::Truncated)?;
    let mut v = u64::from(first & 0x3f);
    for &b in &bytes[1..] {
        v = (v << 8) | u64::from(b);
    }
    Ok((v, n))
}
