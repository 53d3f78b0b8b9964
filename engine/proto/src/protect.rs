//! Packet protection: AEAD on every connection packet after the handshake, and the replay
//! window.
//!
//! # What is protected
//!
//! Every `Data`, `FecData` and `FecParity` packet of a session with keys is sealed with
//! AES-128-GCM (`aws-lc-rs` with the crate's `aws-lc-rs` feature, RustCrypto's `aes-gcm`
//! otherwise; the same algorithm and bytes): the clear header is the associated data, everything after it is
//! encrypted, and a 16-byte tag follows (layouts in [`crate::wire`]). Each direction has its
//! own key and IV, derived with BLAKE3's key derivation from that direction's packet secret
//! (the [`SessionKeys`] a [`Protection`] is made with), so the keys a connect token carries are
//! never used directly and could serve other purposes under other labels. With a token, the
//! packet secrets are the token's keys bound to the session, its connection ids and the
//! server random of its sealed accept ([`SessionKeys::for_session`]): a token makes several
//! sessions (one per listed server, again after a restart or a client's fallback), each
//! numbering its packets from 0, and each has keys and IVs of its own. The 96-bit nonce is the
//! packet's number, big-endian in the low 8 bytes, XORed with the IV (as QUIC does, RFC 9001
//! §5.3): the number is in clear in the header, so no nonce bytes are sent.
//!
//! Numbers never repeat under one key: `Data` and `FecData` packets carry the ARQ packet
//! number (each ARQ datagram leaves once, as one or the other, and packet numbers are never
//! reused), `FecParity` packets their own counter with the top bit of the nonce number set
//! ([`NumberSpace::Parity`]), so the two spaces cannot collide; and no two sessions share a
//! key (above).
//!
//! # Why AES-128-GCM from aws-lc-rs
//!
//! Chosen by measurement (`bench crypto --features aead-candidates` runs the candidates side
//! by side): `aws-lc-rs`, `ring` and RustCrypto's `aes-gcm` and `chacha20poly1305`, each with
//! AES-128-GCM, AES-256-GCM and ChaCha20-Poly1305 where it has them. Both machines the project
//! measures on have AES hardware (AES-NI and VAES on x86-64, the ARMv8 crypto extensions on
//! Apple silicon), where AES-GCM from the assembly-backed crates costs a fraction of
//! ChaCha20-Poly1305 and of the portable RustCrypto code (whose `aes` 0.8 uses the ARMv8
//! instructions only when built with a cfg flag). Of the two assembly-backed crates,
//! aws-lc-rs is the faster at datagram sizes, and it can open a borrowed datagram into another
//! buffer, which saves the copy every in-place AEAD needs on receive. It builds from source
//! with the platform's C compiler on Linux and macOS, and keeps the `libc` crate out of this
//! crate's dependency tree. AES-128 rather than AES-256: the larger key buys nothing against
//! the attacks in scope and costs time per packet.
//!
//! # Key generations
//!
//! AES-GCM's confidentiality degrades with the number of packets one key seals (RFC 9001
//! §6.6 limits it to 2^23 per key). Every [`KEY_GENERATION_PACKETS`] packet numbers of a space
//! use a new key, derived from the direction's session key, the space and the generation
//! `number >> 22`. The generation follows from the number in clear, so no key-phase bit and
//! no handshake are needed, and a reordered packet from the previous generation still opens.
//! A receiver derives at most the generations next to the largest it authenticated (one
//! below, one above): a forged packet with a far number fails without costing a derivation.
//!
//! # Held and transient keys
//!
//! An expanded AES-GCM key (round keys and GHASH powers) takes about 600 bytes, more than
//! anything else an idle session holds, and a server holds thousands of sessions that send a
//! keepalive a second. So a key is derived for the packet at hand and dropped after it,
//! until the session is busy ([`HOLD_AFTER`] packets sealed and opened within [`HOLD_WINDOW`]);
//! from then on the keys are held, until the connection trims its idle state
//! ([`Protection::release_keys`]). A quiet session pays a derivation per packet, a few a
//! second; a busy one pays one per key generation. Every packet counts, forged ones too,
//! before it is opened: forgeries aimed at a quiet session cost it fewer than
//! [`HOLD_AFTER`] derivations a second before its keys are held.
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

use self::aes128gcm::{Aes128Gcm, NONCE_LEN};

use super::keys::KeyContext;
use super::{DropCause, SessionKeys};
use std::time::{Duration, Instant};

/// Bytes of authentication tag after every protected packet.
pub const TAG_LEN: usize = 16;

/// Packets the replay window remembers below the largest authenticated number.
///
/// Internal: re-exported at the crate root with the `test-util` feature only (benchmarks and
/// attack tests seal and open packets with it directly).
pub const REPLAY_WINDOW: u64 = 1024;

/// Packets one key seals at most: numbers `g << 22 .. (g + 1) << 22` of a space use key
/// generation `g` (see the module docs). Half of RFC 9001 §6.6's confidentiality limit for
/// AES-GCM (2^23 packets per key).
pub const KEY_GENERATION_PACKETS: u64 = 1 << 22;

/// Packets a session seals and opens within [`HOLD_WINDOW`] that make it hold its keys
/// instead of deriving one per packet. Keepalives (one a second) and a handshake stay below.
pub const HOLD_AFTER: u8 = 8;

/// The span [`HOLD_AFTER`] counts in.
pub const HOLD_WINDOW: Duration = Duration::from_secs(1);

/// The two packet-number spaces of a direction (one replay window each).
///
/// Internal: re-exported at the crate root with the `test-util` feature only (benchmarks and
/// attack tests seal and open packets with it directly).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumberSpace {
    /// `Data` and `FecData` packets: the ARQ packet number.
    Data,
    /// `FecParity` packets: the sender's parity counter.
    Parity,
}

impl NumberSpace {
    /// The space of a connection packet's number: `FecParity` packets count parity, every
    /// other packet carries an ARQ packet number.
    pub fn of(ty: crate::wire::PacketType) -> Self {
        if ty == crate::wire::PacketType::FecParity {
            NumberSpace::Parity
        } else {
            NumberSpace::Data
        }
    }

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
///
/// Internal: re-exported at the crate root with the `test-util` feature only (benchmarks and
/// attack tests seal and open packets with it directly).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("packet failed authentication")]
pub struct Unauthenticated;

/// One direction's packet key: seals what one side sends and opens it at the other.
///
/// Internal: re-exported at the crate root with the `test-util` feature only (benchmarks and
/// attack tests seal and open packets with it directly).
pub struct PacketKey {
    key: Aes128Gcm,
    iv: [u8; NONCE_LEN],
}

impl std::fmt::Debug for PacketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PacketKey { .. }")
    }
}

impl PacketKey {
    /// The AEAD, as `bench crypto` names it.
    #[cfg(any(test, feature = "test-util"))]
    pub const ALGORITHM: &'static str = "AES-128-GCM";

    /// The key of one direction's data space, generation 0, from that direction's packet
    /// secret (what `bench crypto` measures).
    #[cfg(any(test, feature = "test-util"))]
    pub fn new(secret: &[u8; 32]) -> Self {
        Self::derive(secret, NumberSpace::Data, 0)
    }

    /// The key of one direction's `space` and key `generation`, from that direction's packet
    /// secret (a session's own: see the module docs).
    pub fn derive(secret: &[u8; 32], space: NumberSpace, generation: u64) -> Self {
        let mut material = [0u8; 32 + 1 + 8];
        material[..32].copy_from_slice(secret);
        material[32] = match space {
            NumberSpace::Data => 0,
            NumberSpace::Parity => 1,
        };
        material[33..].copy_from_slice(&generation.to_be_bytes());
        static CONTEXT: KeyContext =
            KeyContext::new("ricochet 2026 packet protection AES-128-GCM key+iv");
        let mut okm = CONTEXT.derive(&material);
        zeroize::Zeroize::zeroize(&mut material);
        let mut iv = [0u8; NONCE_LEN];
        iv.copy_from_slice(&okm[16..16 + NONCE_LEN]);
        let mut key = [0u8; 16];
        key.copy_from_slice(&okm[..16]);
        zeroize::Zeroize::zeroize(&mut okm);
        let packet_key = PacketKey {
            key: Aes128Gcm::new(&key),
            iv,
        };
        zeroize::Zeroize::zeroize(&mut key);
        packet_key
    }

    fn nonce(&self, number: u64) -> [u8; NONCE_LEN] {
        let mut n = self.iv;
        for (b, x) in n[4..].iter_mut().zip(number.to_be_bytes()) {
            *b ^= x;
        }
        n
    }

    /// Encrypts `body` in place and returns the tag. `number` must never repeat under this
    /// key (the connection's packet numbers and parity counter guarantee it).
    pub fn seal(&self, number: u64, aad: &[u8], body: &mut [u8]) -> [u8; TAG_LEN] {
        self.key.seal(&self.nonce(number), aad, body)
    }

    /// Verifies `tag` over `aad` and `body` and decrypts `body` in place. On failure `body` is
    /// unspecified and must be discarded.
    #[cfg(any(test, feature = "test-util"))]
    pub fn open(
        &self,
        number: u64,
        aad: &[u8],
        body: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), Unauthenticated> {
        self.key
            .open(&self.nonce(number), aad, body, tag)
            .then_some(())
            .ok_or(Unauthenticated)
    }

    /// Verifies `tag` over `aad` and `ciphertext` and decrypts `ciphertext` into `out` (of
    /// the same length), leaving the input untouched: a received datagram is opened without
    /// copying it first. On failure `out` is unspecified and must be discarded.
    pub fn open_to(
        &self,
        number: u64,
        aad: &[u8],
        ciphertext: &[u8],
        tag: &[u8; TAG_LEN],
        out: &mut [u8],
    ) -> Result<(), Unauthenticated> {
        if out.len() != ciphertext.len() {
            return Err(Unauthenticated);
        }
        self.key
            .open_to(&self.nonce(number), aad, ciphertext, tag, out)
            .then_some(())
            .ok_or(Unauthenticated)
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

    /// Opens the sealed packet `packet` (clear header `packet[..header]`, tag at the end) into
    /// `out`: the header, then the plaintext; returns the plaintext packet's length (header
    /// included, tag removed), the bytes of `out` to read. `out` grows as needed and is meant
    /// to be reused.
    pub fn open_packet(
        &self,
        space: NumberSpace,
        number: u64,
        packet: &[u8],
        header: usize,
        out: &mut Vec<u8>,
    ) -> Result<usize, Unauthenticated> {
        let len = packet.len();
        if len < header + TAG_LEN {
            return Err(Unauthenticated);
        }
        let n = len - TAG_LEN;
        if out.len() < n {
            out.resize(n, 0);
        }
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&packet[n..]);
        out[..header].copy_from_slice(&packet[..header]);
        self.open_to(
            space.nonce_number(number),
            &packet[..header],
            &packet[header..n],
            &tag,
            &mut out[header..n],
        )?;
        Ok(n)
    }
}

/// Which numbers of one space arrived: the largest authenticated one and a bitmap of the
/// [`REPLAY_WINDOW`] numbers up to it. A number above the largest is new; one in the window is
/// new unless its bit is set; one below the window is refused as too old (ARQ retransmits
/// what it carried in a new packet).
#[derive(Debug, Clone)]
pub(crate) struct ReplayWindow {
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

/// The key generations in use in one space (at most three: a receiver may see the previous,
/// the current and the next one, and holding all three means that, once the keys are held,
/// a forged packet can make it derive each at most once).
type KeySlots = [Option<(u64, PacketKey)>; 3];

/// One direction's keys: the session key they derive from, and the generations in use per
/// space while the session is busy (see "Held and transient keys" above). The parity
/// space's slots exist once a busy session seals or opens a parity packet: most sessions
/// never send FEC, and a server holds thousands of them.
struct DirectionKeys {
    secret: [u8; 32],
    data: KeySlots,
    parity: Option<Box<KeySlots>>,
}

impl Drop for DirectionKeys {
    fn drop(&mut self) {
        // The expanded keys in `data` and `parity` are the AEAD crate's to clear; the secret
        // every generation derives from is this struct's own.
        zeroize::Zeroize::zeroize(&mut self.secret);
    }
}

impl std::fmt::Debug for DirectionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DirectionKeys { .. }")
    }
}

impl DirectionKeys {
    fn new(secret: &[u8; 32]) -> Self {
        DirectionKeys {
            secret: *secret,
            data: [None, None, None],
            parity: None,
        }
    }

    /// True while any key is held.
    #[cfg(test)]
    fn holds(&self) -> bool {
        self.data.iter().any(Option::is_some)
            || self
                .parity
                .as_deref()
                .is_some_and(|p| p.iter().any(Option::is_some))
    }

    /// Runs `f` with the key of `space` for packet `number`: a held one, one derived now and
    /// held (in place of the oldest generation) when `hold`, or else one derived for this
    /// packet only.
    fn with_key<R>(
        &mut self,
        hold: bool,
        space: NumberSpace,
        number: u64,
        f: impl FnOnce(&PacketKey) -> R,
    ) -> R {
        let generation = number / KEY_GENERATION_PACKETS;
        if !hold {
            return f(&PacketKey::derive(&self.secret, space, generation));
        }
        let slots = match space {
            NumberSpace::Data => &mut self.data,
            NumberSpace::Parity => self
                .parity
                .get_or_insert_with(|| Box::new([None, None, None])),
        };
        let held = slots
            .iter()
            .position(|s| s.as_ref().is_some_and(|(g, _)| *g == generation));
        let i = match held {
            Some(i) => i,
            None => {
                let i = slots
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, s)| s.as_ref().map(|(g, _)| *g))
                    .map_or(0, |(i, _)| i);
                slots[i] = Some((
                    generation,
                    PacketKey::derive(&self.secret, space, generation),
                ));
                i
            }
        };
        match &slots[i] {
            Some((_, k)) => f(k),
            None => unreachable!("the slot holds or was just given a key"),
        }
    }

    /// Drops every held key.
    fn release(&mut self) {
        self.data = [None, None, None];
        self.parity = None;
    }
}

/// A session's protection state on one side: the keys it seals with, the keys it opens with,
/// and a replay window per number space (the parity space's from its first authenticated
/// parity packet on: until then every parity number is new).
#[derive(Debug)]
pub(crate) struct Protection {
    tx: DirectionKeys,
    rx: DirectionKeys,
    data: ReplayWindow,
    parity: Option<Box<ReplayWindow>>,
    /// Start of the current [`HOLD_WINDOW`] and the packets sealed or opened in it
    /// ([`HOLD_AFTER`] or more: the keys are held).
    activity: Option<(Instant, u8)>,
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
            tx: DirectionKeys::new(tx),
            rx: DirectionKeys::new(rx),
            data: ReplayWindow::new(),
            parity: None,
            activity: None,
        }
    }

    /// Counts one packet at `now`; true once the session is busy enough to hold its keys
    /// (and from then on, until [`Self::release_keys`]).
    fn busy(&mut self, now: Instant) -> bool {
        let uses = match self.activity {
            Some((_, uses)) if uses >= HOLD_AFTER => return true,
            Some((start, uses)) if now.saturating_duration_since(start) < HOLD_WINDOW => uses + 1,
            _ => 1,
        };
        if uses == 1 {
            self.activity = Some((now, 1));
        } else if let Some(a) = &mut self.activity {
            a.1 = uses;
        }
        uses >= HOLD_AFTER
    }

    /// The replay window of `space`, if it has one yet.
    fn window(&self, space: NumberSpace) -> Option<&ReplayWindow> {
        match space {
            NumberSpace::Data => Some(&self.data),
            NumberSpace::Parity => self.parity.as_deref(),
        }
    }

    fn window_mut(&mut self, space: NumberSpace) -> &mut ReplayWindow {
        match space {
            NumberSpace::Data => &mut self.data,
            NumberSpace::Parity => self.parity.get_or_insert_with(Default::default),
        }
    }

    /// Seals the packet `buf[..len]` (clear header `buf[..header]`, number `number` in
    /// `space`) in place; `None` if `buf` has no room for the tag.
    pub(crate) fn seal(
        &mut self,
        now: Instant,
        space: NumberSpace,
        number: u64,
        buf: &mut [u8],
        header: usize,
        len: usize,
    ) -> Option<usize> {
        let hold = self.busy(now);
        self.tx.with_key(hold, space, number, |k| {
            k.seal_packet(space, number, buf, header, len)
        })
    }

    /// Checks `packet` (number `number` in `space`, clear header `packet[..header]`) against
    /// the replay window and opens it into `out`; only then does the number enter the window.
    /// Returns the plaintext length, or why the packet is dropped: nothing changed then.
    pub(crate) fn open(
        &mut self,
        now: Instant,
        space: NumberSpace,
        number: u64,
        packet: &[u8],
        header: usize,
        out: &mut Vec<u8>,
    ) -> Result<usize, DropCause> {
        let window = self.window(space);
        if let Some(w) = window {
            w.check(number)?;
        }
        // Only the generations next to the largest authenticated one are derived.
        let current = window.and_then(ReplayWindow::largest).unwrap_or(0) / KEY_GENERATION_PACKETS;
        let generation = number / KEY_GENERATION_PACKETS;
        if generation + 1 < current || generation > current + 1 {
            return Err(DropCause::Unauthenticated);
        }
        let hold = self.busy(now);
        let n = self
            .rx
            .with_key(hold, space, number, |k| {
                k.open_packet(space, number, packet, header, out)
            })
            .map_err(|_| DropCause::Unauthenticated)?;
        self.window_mut(space).mark(number);
        Ok(n)
    }

    /// Drops the held keys of both directions (an idle connection's trim): a quiet session
    /// holds its session keys, not their expanded schedules.
    pub(crate) fn release_keys(&mut self) {
        self.tx.release();
        self.rx.release();
        self.activity = None;
    }

    /// True while either direction holds a derived key.
    #[cfg(test)]
    pub(crate) fn holds_keys(&self) -> bool {
        self.tx.holds() || self.rx.holds()
    }
}

/// AES-128-GCM from a vetted crate: `aws-lc-rs` (assembly, several times faster at datagram
/// sizes) with the `aws-lc-rs` feature, which the `ricochet` runtime turns on; RustCrypto's
/// `aes-gcm` (pure Rust, no C build and no system library) otherwise. Both compute the same
/// standard algorithm, so the two interoperate byte for byte.
mod aes128gcm {
    use super::TAG_LEN;

    /// Nonce bytes (96 bits).
    pub(super) const NONCE_LEN: usize = 12;

    #[cfg(feature = "aws-lc-rs")]
    pub(super) struct Aes128Gcm(aws_lc_rs::aead::LessSafeKey);

    #[cfg(feature = "aws-lc-rs")]
    impl Aes128Gcm {
        pub(super) fn new(key: &[u8; 16]) -> Self {
            use aws_lc_rs::aead::{LessSafeKey, UnboundKey, AES_128_GCM};
            match UnboundKey::new(&AES_128_GCM, key) {
                Ok(k) => Aes128Gcm(LessSafeKey::new(k)),
                // AES-128 takes 16 bytes and gets 16: only a wrong length is refused.
                Err(_) => unreachable!("AES-128-GCM key length is 16"),
            }
        }

        fn nonce(n: &[u8; NONCE_LEN]) -> aws_lc_rs::aead::Nonce {
            aws_lc_rs::aead::Nonce::assume_unique_for_key(*n)
        }

        pub(super) fn seal(
            &self,
            nonce: &[u8; NONCE_LEN],
            aad: &[u8],
            body: &mut [u8],
        ) -> [u8; TAG_LEN] {
            let aad = aws_lc_rs::aead::Aad::from(aad);
            let mut out = [0u8; TAG_LEN];
            match self
                .0
                .seal_in_place_separate_tag(Self::nonce(nonce), aad, body)
            {
                Ok(tag) => out.copy_from_slice(tag.as_ref()),
                // Only inputs beyond GCM's 64 GiB limit are refused; packets are datagrams.
                Err(_) => unreachable!("a datagram is far below the AES-GCM input limit"),
            }
            out
        }

        #[cfg(any(test, feature = "test-util"))]
        pub(super) fn open(
            &self,
            nonce: &[u8; NONCE_LEN],
            aad: &[u8],
            body: &mut [u8],
            tag: &[u8; TAG_LEN],
        ) -> bool {
            let aad = aws_lc_rs::aead::Aad::from(aad);
            self.0
                .open_in_place_separate_tag(Self::nonce(nonce), aad, tag, body)
                .is_ok()
        }

        pub(super) fn open_to(
            &self,
            nonce: &[u8; NONCE_LEN],
            aad: &[u8],
            ciphertext: &[u8],
            tag: &[u8; TAG_LEN],
            out: &mut [u8],
        ) -> bool {
            let aad = aws_lc_rs::aead::Aad::from(aad);
            self.0
                .open_separate_gather(Self::nonce(nonce), aad, ciphertext, tag, out)
                .is_ok()
        }
    }

    #[cfg(not(feature = "aws-lc-rs"))]
    pub(super) struct Aes128Gcm(aes_gcm::Aes128Gcm);

    #[cfg(not(feature = "aws-lc-rs"))]
    impl Aes128Gcm {
        pub(super) fn new(key: &[u8; 16]) -> Self {
            use aes_gcm::KeyInit;
            Aes128Gcm(aes_gcm::Aes128Gcm::new(key.into()))
        }

        pub(super) fn seal(
            &self,
            nonce: &[u8; NONCE_LEN],
            aad: &[u8],
            body: &mut [u8],
        ) -> [u8; TAG_LEN] {
            use aes_gcm::aead::AeadInPlace;
            match self.0.encrypt_in_place_detached(nonce.into(), aad, body) {
                Ok(tag) => tag.into(),
                // Only inputs beyond GCM's 64 GiB limit are refused; packets are datagrams.
                Err(_) => unreachable!("a datagram is far below the AES-GCM input limit"),
            }
        }

        pub(super) fn open(
            &self,
            nonce: &[u8; NONCE_LEN],
            aad: &[u8],
            body: &mut [u8],
            tag: &[u8; TAG_LEN],
        ) -> bool {
            use aes_gcm::aead::AeadInPlace;
            self.0
                .decrypt_in_place_detached(nonce.into(), aad, body, tag.into())
                .is_ok()
        }

        pub(super) fn open_to(
            &self,
            nonce: &[u8; NONCE_LEN],
            aad: &[u8],
            ciphertext: &[u8],
            tag: &[u8; TAG_LEN],
            out: &mut [u8],
        ) -> bool {
            out.copy_from_slice(ciphertext);
            self.open(nonce, aad, out, tag)
        }
    }
}

#[cfg(test)]
#[path = "protect_tests.rs"]
mod tests;
