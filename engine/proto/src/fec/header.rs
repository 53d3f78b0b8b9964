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
//! Repair body of the sliding-window code ([`super::FecScheme::Sliding`]; carried in a
//! `FecParity` packet like parity, 6 bytes of header, then one coded symbol of `L` bytes):
//!
//! | offset | size | field |
//! | -----: | ---: | ----- |
//! | 0 | 2 | `first_seq`: u16 little-endian, seq of the first source the repair covers |
//! | 2 | 1 | `count`: sources covered, 1–64: seqs `first_seq .. first_seq + count` (wrapping) |
//! | 3 | 2 | `repair_id`: u16 little-endian, per-sender repair counter; seeds the coefficients |
//! | 5 | 1 | `codec`: 2 = sliding-window random linear code over GF(2^8) |
//! | 6 | L | coded symbol `Σ c_i · S_i` |
//!
//! Source `S_i` (seq `first_seq + i`) is the coded region below (length prefix + payload),
//! zero-padded to `L`, the longest covered source + 2. Coefficient
//! `c_i = repair_coefficient(repair_id, i)`: with `x = (repair_id << 8 | i) as u32`,
//! `x = x * 0x9E3779B1` (wrapping); `x ^= x >> 15`; `x = x * 0x85EBCA77` (wrapping);
//! `x ^= x >> 13`; `c = x >> 24`, and 1 if that is 0. The block code's codec ids are 0 and 1,
//! so a block receiver rejects a repair as `UnknownCodec` and a sliding receiver rejects
//! block parity the same way.
//!
//! Coded region of data shard `i` (what the codec sees; never sent as such): a u16
//! little-endian payload length, the payload, then zeros up to `L`, the group's longest
//! payload + 2 (rounded up to even for reed-solomon-simd). The receiver rebuilds it from the
//! data body, so the length prefix costs no wire bytes on data datagrams.

use super::error::FecError;

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

/// Codec id of a sliding-window repair body.
pub const SLIDING_CODEC_ID: u8 = 2;
/// Most sources one repair covers.
pub const MAX_REPAIR_SOURCES: usize = 64;

/// Most data shards one group may hold (presence masks are `u64`).
pub const MAX_DATA_SHARDS: usize = 64;
/// Most parity shards one group may carry.
pub const MAX_PARITY_SHARDS: usize = 32;

/// Which codec produced a group's parity; carried in the parity header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CodecId {
    /// The Cauchy codec (`CauchyCodec`).
    Cauchy = 0,
    /// The `reed-solomon-simd` codec (`RsSimdCodec`).
    RsSimd = 1,
}

impl CodecId {
    /// The wire value.
    pub fn to_u8(self) -> u8 {
        self as u8
    }

    /// Parses the wire value.
    pub fn from_u8(v: u8) -> Option<CodecId> {
        match v {
            0 => Some(CodecId::Cauchy),
            1 => Some(CodecId::RsSimd),
            _ => None,
        }
    }

    /// The codec the sender uses for a group of `data` + `parity` shards.
    ///
    /// Chosen from `bench fec` (`cargo run --release -p bench -- fec`; the measured table is in
    /// `PERFORMANCE.md`): `reed-solomon-simd` encodes large groups about as fast, but every
    /// recovery costs it a fixed GF(2^16) transform, orders of magnitude more than the Cauchy
    /// codec, whose cost grows with the shards actually lost. Every group shape we allow (up to
    /// 64 + 32) therefore uses the Cauchy codec; `reed-solomon-simd` stays decodable for a peer
    /// that picks it.
    pub fn for_group(data: usize, parity: usize) -> CodecId {
        if data <= MAX_DATA_SHARDS && parity <= MAX_PARITY_SHARDS {
            CodecId::Cauchy
        } else {
            CodecId::RsSimd
        }
    }

    /// Shard lengths this codec accepts must be a multiple of this.
    pub fn shard_len_multiple(self) -> usize {
        match self {
            CodecId::Cauchy => 1,
            CodecId::RsSimd => 2,
        }
    }

    /// Lower-case name for tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            CodecId::Cauchy => "cauchy-gf256",
            CodecId::RsSimd => "reed-solomon-simd",
        }
    }
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
    #[cfg(feature = "fec")]
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
    #[cfg(feature = "fec")]
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

/// The header of a sliding-window repair body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RepairHeader {
    /// Seq of the first source covered.
    pub first_seq: u16,
    /// Sources covered (1..=[`MAX_REPAIR_SOURCES`]).
    pub count: u8,
    /// Per-sender repair counter, the seed of the coefficients.
    pub repair_id: u16,
}

impl RepairHeader {
    /// Writes the header into `out[..PARITY_HEADER_LEN]`; `out` must be long enough.
    #[cfg(feature = "fec")]
    pub(crate) fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.first_seq.to_le_bytes());
        out[2] = self.count;
        out[3..5].copy_from_slice(&self.repair_id.to_le_bytes());
        out[5] = SLIDING_CODEC_ID;
    }

    /// Splits a repair body into header and coded symbol.
    pub fn parse(body: &[u8]) -> Result<(RepairHeader, &[u8]), FecError> {
        let [f0, f1, count, r0, r1, codec, symbol @ ..] = body else {
            return Err(FecError::Truncated);
        };
        if *codec != SLIDING_CODEC_ID {
            return Err(FecError::UnknownCodec);
        }
        if *count == 0 || *count as usize > MAX_REPAIR_SOURCES {
            return Err(FecError::BadShape);
        }
        if symbol.len() < LEN_PREFIX {
            return Err(FecError::Truncated);
        }
        Ok((
            RepairHeader {
                first_seq: u16::from_le_bytes([*f0, *f1]),
                count: *count,
                repair_id: u16::from_le_bytes([*r0, *r1]),
            },
            symbol,
        ))
    }
}

/// Coefficient of source `i` (0-based within the repair's range) in repair `repair_id`:
/// a fixed integer hash, never zero (see the module docs for the formula).
pub fn repair_coefficient(repair_id: u16, i: u8) -> u8 {
    let mut x = (u32::from(repair_id) << 8) | u32::from(i);
    x = x.wrapping_mul(0x9E37_79B1);
    x ^= x >> 15;
    x = x.wrapping_mul(0x85EB_CA77);
    x ^= x >> 13;
    match (x >> 24) as u8 {
        0 => 1,
        c => c,
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
        let r = RepairHeader {
            first_seq: 65535,
            count: 64,
            repair_id: 0x1234,
        };
        let mut b = [9u8; 8];
        r.write(&mut b);
        assert_eq!(RepairHeader::parse(&b), Ok((r, &[9u8; 2][..])));
        // A block parity header is not a repair, and vice versa.
        assert!(ParityHeader::parse(&b).is_err());
        b[5] = 0;
        assert_eq!(RepairHeader::parse(&b), Err(FecError::UnknownCodec));
    }

    #[test]
    fn repair_coefficients_are_nonzero_and_vary() {
        let mut seen = [false; 256];
        for id in 0..64u16 {
            for i in 0..64u8 {
                let c = repair_coefficient(id, i);
                assert_ne!(c, 0);
                seen[c as usize] = true;
            }
        }
        assert!(seen.iter().filter(|&&s| s).count() > 200);
        assert_ne!(repair_coefficient(1, 0), repair_coefficient(2, 0));
    }
}
