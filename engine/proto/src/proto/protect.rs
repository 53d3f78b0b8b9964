//! Packet protection: AEAD on every connection packet after the handshake, and the replay
//! window.
//!
//! # What is protected
//!
//! Every `Data`, `FecData` and `FecParity` packet of a session with keys is sealed with
//! AES-128-GCM (`ring`): the clear header is the associated data, everything after it is
//! encrypted, and a 16-byte tag follows (layouts in [`crate::wire`]). Each direction has its
//! own key and IV, derived from that direction's session key ([`SessionKeys`]) with BLAKE3's
//! key derivation, so the keys a connect token carries are never used directly and could serve
//! other purposes under other labels. The 96-bit nonce is the packet's number, big-endian in
//! the low 8 bytes, XORed with the IV (as QUIC does, RFC 9001 §5.3): the number is in clear in
//! the header, so no nonce bytes are sent.
//!
//! Numbers never repeat under one key: `Data` and `FecData` packets carry the ARQ packet
//! number (each ARQ datagram leaves once, as one or the other, and packet numbers are never
//! reused), `FecParity` packets their own counter with the top bit of the nonce number set
//! ([`NumberSpace::Parity`]), so the two spaces cannot collide.
//!
//! # Receiving
//!
//! A packet is checked against the replay window of its number space, then opened; only a
//! packet whose tag verifies reaches ARQ or FEC, and only then does its number enter the
//! window. A packet that fails either check is dropped and counted
//! ([`DropCause::Replay`], [`DropCause::TooOld`], [`DropCause::Unauthenticated`]) before any
//! connection state changes: no path update, no ACK processing, no packet-number advance.
//!
//! # Not protected
//!
//! The header (type, version, connection ids, packet number, the FEC data header) is
//! authenticated but readable: there is no header protection (RFC 9001 §5.4), so an observer
//! sees packet numbers and can link a session's packets by its connection id. Handshake
//! packets are outside this layer.

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};

use super::{DropCause, SessionKeys};

/// Bytes of authentication tag after every protected packet.
pub const TAG_LEN: usize = 16;

/// Packets the replay window remembers below the largest authenticated number.
pub const REPLAY_WINDOW: u64 = 1024;

/// The two packet-number spaces of a direction (one replay window each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumberSpace {
    /// `Data` and `FecData` packets: the ARQ packet number.
    Data,
    /// `FecParity` packets: the sender's parity counter.
    Parity,
}

impl NumberSpace {
    /// The number the nonce is made from: the parity space has the top bit set (packet
    /// numbers stay below 2^62, so the spaces never meet).
    fn nonce_number(self, number: u64) -> u64 {
        match self {
            NumberSpace::Data => number,
            NumberSpace::Parity => number | 1 << 63,
        }
    }
}

/// A packet's tag did not verify (wrong key, forged or damaged packet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("packet failed authentication")]
pub struct Unauthenticated;

/// One direction's packet key: seals what one side sends and opens it at the other.
pub struct PacketKey {
    key: LessSafeKey,
    iv: [u8; aead::NONCE_LEN],
}

impl std::fmt::Debug for PacketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PacketKey { .. }")
    }
}

impl PacketKey {
    /// The AEAD, as `bench crypto` names it.
    pub const ALGORITHM: &'static str = "AES-128-GCM";

    /// The key of one direction, from that direction's session key.
    pub fn new(secret: &[u8; 32]) -> Self {
        let okm = blake3::derive_key("ricochet 2026 packet protection AES-128-GCM key+iv", secret);
        let mut iv = [0u8; aead::NONCE_LEN];
        iv.copy_from_slice(&okm[16..16 + aead::NONCE_LEN]);
        let key = match UnboundKey::new(&aead::AES_128_GCM, &okm[..16]) {
            Ok(k) => k,
            // AES-128 takes 16 bytes and gets 16: ring refuses only a wrong length.
            Err(_) => unreachable!("AES-128-GCM key length is 16"),
        };
        PacketKey {
            key: LessSafeKey::new(key),
            iv,
        }
    }

    fn nonce(&self, number: u64) -> Nonce {
        let mut n = self.iv;
        for (b, x) in n[4..].iter_mut().zip(number.to_be_bytes()) {
            *b ^= x;
        }
        Nonce::assume_unique_for_key(n)
    }

    /// Encrypts `body` in place and returns the tag. `number` must never repeat under this
    /// key (the connection's packet numbers and parity counter guarantee it).
    pub fn seal(&self, number: u64, aad: &[u8], body: &mut [u8]) -> [u8; TAG_LEN] {
        let mut out = [0u8; TAG_LEN];
        match self
            .key
            .seal_in_place_separate_tag(self.nonce(number), Aad::from(aad), body)
        {
            Ok(tag) => out.copy_from_slice(tag.as_ref()),
            // ring refuses only inputs beyond GCM's 64 GiB limit; packets are datagrams.
            Err(_) => unreachable!("a datagram is far below the AES-GCM input limit"),
        }
        out
    }

    /// Verifies `tag` over `aad` and `body` and decrypts `body` in place. On failure `body` is
    /// unspecified (ring clears it) and must be discarded.
    pub fn open(
        &self,
        number: u64,
        aad: &[u8],
        body: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), Unauthenticated> {
        self.key
            .open_in_place_separate_tag(
                self.nonce(number),
                Aad::from(aad),
                aead::Tag::from(*tag),
                body,
                0..,
            )
            .map(|_| ())
            .map_err(|_| Unauthenticated)
    }

    /// Seals the packet `buf[..len]` whose clear header is `buf[..header]` in place, appending
    /// the tag; returns the new length, or `None` if `buf` has no room for the tag.
    pub fn seal_packet(
        &self,
        space: NumberSpace,
        number: u64,
        buf: &mut [u8],
        header: usize,
        len: usize,
    ) -> Option<usize> {
        if header > len || len + TAG_LEN > buf.len() {
            return None;
        }
        let (aad, rest) = buf.split_at_mut(header);
        let (body, tag_out) = rest.split_at_mut(len - header);
        let tag = self.seal(space.nonce_number(number), aad, body);
        tag_out[..TAG_LEN].copy_from_slice(&tag);
        Some(len + TAG_LEN)
    }

    /// Opens the sealed packet `buf` (clear header `buf[..header]`, tag at the end) in place;
    /// returns the plaintext length (header included, tag removed).
    pub fn open_packet(
        &self,
        space: NumberSpace,
        number: u64,
        buf: &mut [u8],
        header: usize,
    ) -> Result<usize, Unauthenticated> {
        let len = buf.len();
        if len < header + TAG_LEN {
            return Err(Unauthenticated);
        }
        let (aad, rest) = buf.split_at_mut(header);
        let (body, tag) = rest.split_at_mut(len - header - TAG_LEN);
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(tag);
        self.open(space.nonce_number(number), aad, body, &t)?;
        Ok(len - TAG_LEN)
    }
}

/// Which numbers of one space arrived: the largest authenticated one and a bitmap of the
/// [`REPLAY_WINDOW`] numbers up to it. A number above the largest is new; one in the window is
/// new unless its bit is set; one below the window is refused as too old (ARQ retransmits
/// what it carried in a new packet).
#[derive(Debug, Clone)]
pub struct ReplayWindow {
    largest: Option<u64>,
    bits: [u64; (REPLAY_WINDOW / 64) as usize],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        Self::new()
    }
}

impl ReplayWindow {
    /// An empty window: every number is new.
    pub fn new() -> Self {
        ReplayWindow {
            largest: None,
            bits: [0; (REPLAY_WINDOW / 64) as usize],
        }
    }

    fn bit(n: u64) -> (usize, u64) {
        let i = n % REPLAY_WINDOW;
        ((i / 64) as usize, 1 << (i % 64))
    }

    /// Whether `n` may be accepted (no state change): `Replay` if it was seen, `TooOld` if it
    /// is below the window.
    pub fn check(&self, n: u64) -> Result<(), DropCause> {
        let Some(largest) = self.largest else {
            return Ok(());
        };
        if n > largest {
            return Ok(());
        }
        if largest - n >= REPLAY_WINDOW {
            return Err(DropCause::TooOld);
        }
        let (w, m) = Self::bit(n);
        if self.bits[w] & m != 0 {
            Err(DropCause::Replay)
        } else {
            Ok(())
        }
    }

    /// Records `n` as received (call only after [`Self::check`] passed and the packet
    /// authenticated).
    pub fn mark(&mut self, n: u64) {
        match self.largest {
            Some(largest) if n <= largest => {}
            Some(largest) => {
                // Slide: the numbers between the old and the new largest become unseen.
                if n - largest >= REPLAY_WINDOW {
                    self.bits = [0; (REPLAY_WINDOW / 64) as usize];
                } else {
                    for k in largest + 1..n {
                        let (w, m) = Self::bit(k);
                        self.bits[w] &= !m;
                    }
                }
                self.largest = Some(n);
            }
            None => {
                self.bits = [0; (REPLAY_WINDOW / 64) as usize];
                self.largest = Some(n);
            }
        }
        let (w, m) = Self::bit(n);
        self.bits[w] |= m;
    }

    /// The largest number recorded.
    pub fn largest(&self) -> Option<u64> {
        self.largest
    }
}

/// A session's protection state on one side: the key it seals with, the key it opens with,
/// and a replay window per number space.
#[derive(Debug)]
pub(crate) struct Protection {
    pub(crate) tx: PacketKey,
    pub(crate) rx: PacketKey,
    data: ReplayWindow,
    parity: ReplayWindow,
}

impl Protection {
    /// Keys for the client (`client = true`) or the server side of a session.
    pub(crate) fn new(keys: &SessionKeys, client: bool) -> Self {
        let (tx, rx) = if client {
            (&keys.client_to_server, &keys.server_to_client)
        } else {
            (&keys.server_to_client, &keys.client_to_server)
        };
        Protection {
            tx: PacketKey::new(tx),
            rx: PacketKey::new(rx),
            data: ReplayWindow::new(),
            parity: ReplayWindow::new(),
        }
    }

    pub(crate) fn window(&mut self, space: NumberSpace) -> &mut ReplayWindow {
        match space {
            NumberSpace::Data => &mut self.data,
            NumberSpace::Parity => &mut self.parity,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_open_round_trip_and_every_forgery_fails() {
        let k = PacketKey::new(&[3; 32]);
        let mut buf = vec![0u8; 64 + TAG_LEN];
        for (i, b) in buf[..64].iter_mut().enumerate() {
            *b = i as u8;
        }
        let plain = buf[..64].to_vec();
        let n = k
            .seal_packet(NumberSpace::Data, 9, &mut buf, 18, 64)
            .unwrap();
        assert_eq!(n, 64 + TAG_LEN);
        assert_eq!(buf[..18], plain[..18], "the header stays in clear");
        assert_ne!(buf[18..64], plain[18..], "the body is encrypted");
        let sealed = buf.clone();
        let m = k
            .open_packet(NumberSpace::Data, 9, &mut buf, 18)
            .expect("opens");
        assert_eq!(buf[..m], plain[..]);
        // Any flipped bit, header or body or tag, fails.
        for bit in 0..sealed.len() * 8 {
            let mut f = sealed.clone();
            f[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(
                k.open_packet(NumberSpace::Data, 9, &mut f, 18),
                Err(Unauthenticated),
                "bit {bit}"
            );
        }
        // Another number, the other space, another key, a truncation: all fail.
        let mut f = sealed.clone();
        assert!(k.open_packet(NumberSpace::Data, 10, &mut f, 18).is_err());
        let mut f = sealed.clone();
        assert!(k.open_packet(NumberSpace::Parity, 9, &mut f, 18).is_err());
        let mut f = sealed.clone();
        assert!(PacketKey::new(&[4; 32])
            .open_packet(NumberSpace::Data, 9, &mut f, 18)
            .is_err());
        let mut f = sealed[..sealed.len() - 1].to_vec();
        assert!(k.open_packet(NumberSpace::Data, 9, &mut f, 18).is_err());
        let mut f = sealed[..10].to_vec();
        assert!(k.open_packet(NumberSpace::Data, 9, &mut f, 18).is_err());
        // No room for the tag: refused, not truncated.
        let mut small = plain.clone();
        assert_eq!(
            k.seal_packet(NumberSpace::Data, 1, &mut small, 18, 64),
            None
        );
    }

    #[test]
    fn directions_use_different_keys() {
        let keys = SessionKeys {
            client_to_server: [1; 32],
            server_to_client: [2; 32],
        };
        let (c, s) = (Protection::new(&keys, true), Protection::new(&keys, false));
        let mut buf = vec![5u8; 40 + TAG_LEN];
        let n =
            c.tx.seal_packet(NumberSpace::Data, 0, &mut buf, 18, 40)
                .unwrap();
        let mut reflected = buf[..n].to_vec();
        // A client packet reflected back at the client does not open with its receive key.
        assert!(c
            .rx
            .open_packet(NumberSpace::Data, 0, &mut reflected, 18)
            .is_err());
        assert!(s
            .rx
            .open_packet(NumberSpace::Data, 0, &mut buf[..n], 18)
            .is_ok());
    }

    #[test]
    fn replay_window_accepts_each_number_once() {
        let mut w = ReplayWindow::new();
        assert_eq!(w.check(5), Ok(()));
        w.mark(5);
        assert_eq!(w.check(5), Err(DropCause::Replay));
        assert_eq!(w.check(4), Ok(()), "older but unseen, within the window");
        w.mark(4);
        assert_eq!(w.check(4), Err(DropCause::Replay));
        w.mark(5 + REPLAY_WINDOW - 1);
        assert_eq!(w.check(5), Err(DropCause::Replay), "still in the window");
        assert_eq!(w.check(6), Ok(()));
        assert_eq!(w.check(4), Err(DropCause::TooOld));
        // Sliding clears the bits the window moved over.
        w.mark(5 + REPLAY_WINDOW + 10);
        assert_eq!(w.check(5 + REPLAY_WINDOW + 9), Ok(()));
        assert_eq!(w.check(5 + REPLAY_WINDOW - 1), Err(DropCause::Replay));
        // A far jump empties the window; numbers far out stay valid u64 arithmetic.
        w.mark(u64::MAX);
        assert_eq!(w.check(u64::MAX), Err(DropCause::Replay));
        assert_eq!(w.check(u64::MAX - 1), Ok(()));
        assert_eq!(w.check(0), Err(DropCause::TooOld));
        assert_eq!(w.largest(), Some(u64::MAX));
    }

    #[test]
    fn replay_window_matches_a_set_model() {
        // Against a plain set: random numbers near the largest, checked then marked.
        let mut w = ReplayWindow::new();
        let mut seen = std::collections::BTreeSet::new();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut top = 0u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = (top + 40).saturating_sub(x % 1500);
            let expect = if seen.last().is_some_and(|&l| l >= n + REPLAY_WINDOW) {
                Err(DropCause::TooOld)
            } else if seen.contains(&n) {
                Err(DropCause::Replay)
            } else {
                Ok(())
            };
            assert_eq!(w.check(n), expect, "n = {n}");
            if expect.is_ok() {
                w.mark(n);
                seen.insert(n);
                top = top.max(n);
            }
        }
    }
}
