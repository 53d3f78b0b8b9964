//! The echo message: a fixed header and a payload pattern derived from (client, sequence).
//!
//! Layout (little-endian), [`HEADER_LEN`] = 32 bytes, then the pattern up to the payload size:
//!
//! | offset | size | field |
//! | ---: | ---: | --- |
//! | 0 | 4 | magic `0x5249_4342` |
//! | 4 | 4 | client id |
//! | 8 | 8 | sequence number (per client, never reused within a run) |
//! | 16 | 8 | send time, ns since the run's epoch |
//! | 24 | 1 | phase tag ([`Phase`]) |
//! | 25 | 3 | zero |
//! | 28 | 4 | total datagram length |
//!
//! The pattern is a keyed pseudo-random byte stream, so a byte echoed into the wrong message or
//! position is caught, not just a flipped bit.

/// Bytes of header at the start of every echo message; the smallest payload the bench sends.
pub const HEADER_LEN: usize = 32;

/// Identifies a bench echo message.
pub const MAGIC: u32 = 0x5249_4342;

/// The phase in which a message was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Warm-up: counted separately, not in throughput or RTT.
    Warmup = 1,
    /// The measured phase: throughput, RTT and the loss verdict.
    Measured = 2,
    /// Sent after the measured deadline to keep the load steady while measured messages drain.
    Drain = 3,
}

impl Phase {
    /// All phases, in run order.
    pub const ALL: [Phase; 3] = [Phase::Warmup, Phase::Measured, Phase::Drain];

    /// Index into per-phase arrays.
    pub fn index(self) -> usize {
        self as usize - 1
    }

    /// Decode a tag byte.
    pub fn from_tag(tag: u8) -> Option<Phase> {
        match tag {
            1 => Some(Phase::Warmup),
            2 => Some(Phase::Measured),
            3 => Some(Phase::Drain),
            _ => None,
        }
    }
}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Client id.
    pub client: u32,
    /// Sequence number.
    pub seq: u64,
    /// Send time in ns since the run epoch.
    pub send_ns: u64,
    /// Phase tag.
    pub phase: Phase,
    /// Total datagram length the sender wrote.
    pub len: u32,
}

impl Header {
    /// Decode the header at the start of `data`; `None` if it is short, has the wrong magic, an
    /// unknown phase or non-zero reserved bytes. Never panics.
    pub fn decode(data: &[u8]) -> Option<Header> {
        let h = data.get(..HEADER_LEN)?;
        let u32_at = |o: usize| -> Option<u32> {
            Some(u32::from_le_bytes(h.get(o..o + 4)?.try_into().ok()?))
        };
        let u64_at = |o: usize| -> Option<u64> {
            Some(u64::from_le_bytes(h.get(o..o + 8)?.try_into().ok()?))
        };
        if u32_at(0)? != MAGIC || h[25..28] != [0, 0, 0] {
            return None;
        }
        Some(Header {
            client: u32_at(4)?,
            seq: u64_at(8)?,
            send_ns: u64_at(16)?,
            phase: Phase::from_tag(h[24])?,
            len: u32_at(28)?,
        })
    }

    /// Write this header into the first [`HEADER_LEN`] bytes of `buf` (which must be that long).
    pub fn encode(&self, buf: &mut [u8]) {
        buf[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        buf[4..8].copy_from_slice(&self.client.to_le_bytes());
        buf[8..16].copy_from_slice(&self.seq.to_le_bytes());
        buf[16..24].copy_from_slice(&self.send_ns.to_le_bytes());
        buf[24] = self.phase as u8;
        buf[25..28].fill(0);
        buf[28..32].copy_from_slice(&self.len.to_le_bytes());
    }
}

fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn pattern_seed(client: u32, seq: u64) -> u64 {
    let mut s = (u64::from(client) << 40) ^ seq.rotate_left(17) ^ 0xA076_1D64_78BD_642F;
    splitmix64(&mut s)
}

/// Fill `buf` with the pattern for (client, seq).
pub fn fill_pattern(client: u32, seq: u64, buf: &mut [u8]) {
    let mut state = pattern_seed(client, seq);
    for chunk in buf.chunks_mut(8) {
        let word = splitmix64(&mut state).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// Index of the first byte of `data` that differs from the pattern for (client, seq), if any.
pub fn check_pattern(client: u32, seq: u64, data: &[u8]) -> Option<usize> {
    let mut state = pattern_seed(client, seq);
    for (i, chunk) in data.chunks(8).enumerate() {
        let word = splitmix64(&mut state).to_le_bytes();
        if chunk != &word[..chunk.len()] {
            let j = chunk
                .iter()
                .zip(word.iter())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Some(i * 8 + j);
        }
    }
    None
}

/// Write a complete message of `buf.len()` bytes (at least [`HEADER_LEN`]).
pub fn write_message(buf: &mut [u8], client: u32, seq: u64, send_ns: u64, phase: Phase) {
    let header = Header {
        client,
        seq,
        send_ns,
        phase,
        len: u32::try_from(buf.len()).unwrap_or(u32::MAX),
    };
    header.encode(buf);
    fill_pattern(client, seq, &mut buf[HEADER_LEN..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_rejects() {
        let mut buf = vec![0u8; 100];
        write_message(&mut buf, 7, 1234, 99, Phase::Measured);
        let h = Header::decode(&buf).unwrap();
        assert_eq!(
            h,
            Header {
                client: 7,
                seq: 1234,
                send_ns: 99,
                phase: Phase::Measured,
                len: 100
            }
        );
        assert_eq!(check_pattern(7, 1234, &buf[HEADER_LEN..]), None);
        assert!(Header::decode(&buf[..31]).is_none());
        let mut bad = buf.clone();
        bad[24] = 9;
        assert!(Header::decode(&bad).is_none());
        let mut bad = buf.clone();
        bad[0] ^= 1;
        assert!(Header::decode(&bad).is_none());
    }

    #[test]
    fn pattern_catches_any_byte_and_swaps() {
        let mut buf = vec![0u8; 77];
        fill_pattern(3, 5, &mut buf);
        for i in 0..buf.len() {
            let mut b = buf.clone();
            b[i] ^= 0x40;
            assert_eq!(check_pattern(3, 5, &b), Some(i));
        }
        // Another message's pattern differs.
        assert!(check_pattern(3, 6, &buf).is_some());
        assert!(check_pattern(4, 5, &buf).is_some());
    }
}
