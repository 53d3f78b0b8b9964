//! Byte layout of the FEC bodies the proto layer carries in its `FecData` and `FecParity`
//! packets. Parsing returns typed errors and never panics.
//!
//! Data body (3 bytes of header, then the datagram unchanged):
//!
//! | offset | size | field |
//! | -----: | ---: | ----- |
//! | 0 | 2 | `seq`: u16 little-endian, per-sender data-shard sequence number (wraps) |
//! | 2 | 1 | bits 0–5: `index` of the shard in its group (0–63); bit 6: reserved, 0; bit 7: `protected` (parity is planned for the group) |
//! | 3 | n | payload |
//!
//! The group is identified by the seq of its shard 0, `seq - index`: groups are consecutive,
//! so a gap in `seq` is a lost data shard whether or not the group carries parity.
//!
//! Parity body (6 bytes of header, then one coded shard of `L` bytes):
//!
//! | offset | size | field |
//! | -----: | ---: | ----- |
//! | 0 | 2 | `first_seq`: u16 little-endian, seq of the group's data shard 0 |
//! | 2 | 1 | `data`: data shards in the group, 1–64 |
//! | 3 | 1 | `parity`: parity shards in the group, 1–32 |
//! | 4 | 1 | `index` of this parity shard, 0..`parity` |
//! | 5 | 1 | `codec`: 0 = GF(2^8) Cauchy, 1 = reed-solomon-simd |
//! | 6 | L | coded shard |
//!
//! Coded region of data shard `i` (what the codec sees; never sent as such): a u16
//! little-endian payload length, the payload, then zeros up to `L`, the group's longest
//! payload + 2 (rounded up to even for reed-solomon-simd). The receiver rebuilds it from the
//! data body, so the length prefix costs no wire bytes on data datagrams.

use super::codec::{CodecId, MAX_DATA_SHARDS, MAX_PARITY_SHARDS};
use super::FecError;

/// Bytes of FEC header in front of every data payload.
pub const DATA_HEADER_LEN: usize = 3;
/// Bytes of FEC header in front of every parity shard.
pub const PARITY_HEADER_LEN: usize = 6;
/// Bytes of length prefix inside every coded shard.
pub const LEN_PREFIX: usize = 2;

/// The largest payload FEC can protect when every datagram must fit in `mtu` bytes and the
/// packet that carries an FEC body spends `packet_header` bytes (`wire::FEC_HEADER_LEN`):
/// a parity body is the group's longest payload + [`PARITY_HEADER_LEN`] + [`LEN_PREFIX`].
/// (With `reed-solomon-simd`, one more byte for even rounding.) For a 1,200-byte MTU and the
/// 10-byte FEC packet header this is 1,182 B, where the reference kept 1,174 B; each data
/// datagram costs 10 + 3 = 13 B of FEC framing instead of its 26 B.
pub const fn max_protected_payload(mtu: usize, packet_header: usize) -> usize {
    mtu.saturating_sub(packet_header + PARITY_HEADER_LEN + LEN_PREFIX)
}

const INDEX_MASK: u8 = 0x3f;
const RESERVED_BIT: u8 = 0x40;
const PROTECTED_BIT: u8 = 0x80;

/// The header of a data body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataHeader {
    /// Data-shard sequence number.
    pub seq: u16,
    /// Index of the shard in its group.
    pub index: u8,
    /// Whether the sender planned parity for the group (the receiver retains its shards).
    pub protected: bool,
}

impl DataHeader {
    /// Writes the header into `out[..DATA_HEADER_LEN]`; `out` must be long enough.
    pub(crate) fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.seq.to_le_bytes());
        out[2] = (self.index & INDEX_MASK) | if self.protected { PROTECTED_BIT } else { 0 };
    }

    /// Splits a data body into header and payload.
    pub fn parse(body: &[u8]) -> Result<(DataHeader, &[u8]), FecError> {
        let [s0, s1, b, payload @ ..] = body else {
            return Err(FecError::Truncated);
        };
        if b & RESERVED_BIT != 0 {
            return Err(FecError::ReservedBits);
        }
        Ok((
            DataHeader {
                seq: u16::from_le_bytes([*s0, *s1]),
                index: b & INDEX_MASK,
                protected: b & PROTECTED_BIT != 0,
            },
            payload,
        ))
    }
}

/// The header of a parity body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParityHeader {
    /// Seq of the group's data shard 0.
    pub first_seq: u16,
    /// Data shards in the group.
    pub data: u8,
    /// Parity shards in the group.
    pub parity: u8,
    /// Index of this parity shard.
    pub index: u8,
    /// Codec that produced the parity.
    pub codec: CodecId,
}

impl ParityHeader {
    /// Writes the header into `out[..PARITY_HEADER_LEN]`; `out` must be long enough.
    pub(crate) fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.first_seq.to_le_bytes());
        out[2] = self.data;
        out[3] = self.parity;
        out[4] = self.index;
        out[5] = self.codec.to_u8();
    }

    /// Splits a parity body into header and coded shard, checking the group shape.
    pub fn parse(body: &[u8]) -> Result<(ParityHeader, &[u8]), FecError> {
        let [f0, f1, data, parity, index, codec, shard @ ..] = body else {
            return Err(FecError::Truncated);
        };
        let (data, parity, index) = (*data, *parity, *index);
        if data == 0
            || data as usize > MAX_DATA_SHARDS
            || parity == 0
            || parity as usize > MAX_PARITY_SHARDS
        {
            return Err(FecError::BadShape);
        }
        if index >= parity {
            return Err(FecError::IndexOutOfRange);
        }
        let codec = CodecId::from_u8(*codec).ok_or(FecError::UnknownCodec)?;
        if shard.len() < LEN_PREFIX || shard.len() % codec.shard_len_multiple() != 0 {
            return Err(FecError::Truncated);
        }
        Ok((
            ParityHeader {
                first_seq: u16::from_le_bytes([*f0, *f1]),
                data,
                parity,
                index,
                codec,
            },
            shard,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protected_payload_fits_parity_in_the_mtu() {
        assert_eq!(max_protected_payload(1200, 10), 1182);
        assert_eq!(max_protected_payload(10, 10), 0);
    }

    #[test]
    fn headers_round_trip() {
        let h = DataHeader {
            seq: 0xBEEF,
            index: 63,
            protected: true,
        };
        let mut b = [0u8; 5];
        h.write(&mut b);
        b[3] = 7;
        b[4] = 9;
        assert_eq!(DataHeader::parse(&b), Ok((h, &[7u8, 9][..])));
        let p = ParityHeader {
            first_seq: 65535,
            data: 8,
            parity: 4,
            index: 3,
            codec: CodecId::RsSimd,
        };
        let mut b = [0u8; 10];
        p.write(&mut b);
        assert_eq!(ParityHeader::parse(&b), Ok((p, &[0u8; 4][..])));
    }
}
