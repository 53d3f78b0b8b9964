//! Byte layout of every Ricochet packet. Decoders return typed errors and never panic.
//!
//! Everything here is pure: encoders write into a caller's `&mut [u8]` and report the bytes
//! written, decoders borrow from the input and allocate nothing (ACK ranges are validated up
//! front and re-read lazily, payloads are sub-slices of the datagram).
//!
//! # Common header (every packet)
//!
//! | offset | size | field | notes |
//! | ---: | ---: | --- | --- |
//! | 0 | 1 | packet type | see [`PacketType`] |
//! | 1 | 1 | protocol version | [`VERSION`]; the first two bytes and the client connection id of a hello are the same in every version, so a server can refuse a version it does not speak |
//!
//! # Handshake packets
//!
//! Integers are big-endian. `cid` = connection id (8 bytes), `nonce` = the client's random 8 bytes.
//!
//! | type | name | layout after the common header | total |
//! | --- | --- | --- | ---: |
//! | `0x01` | [`ClientHello`](Packet::ClientHello) | client cid, nonce, mode u8, then the [token section](#token-section) (mode 1) or zero padding (mode 0) | ≥ [`MIN_CLIENT_HELLO_LEN`]; [`TOKEN_HELLO_LEN`] with a token |
//! | `0x02` | [`ServerChallenge`](Packet::ServerChallenge) | client cid, nonce, timestamp u64 (see below), cookie (16), with a token: tag (16) | 42 / 58 |
//! | `0x03` | [`ClientCookieEcho`](Packet::ClientCookieEcho) | client cid, nonce, timestamp u64, cookie (16), mode u8, then the token section (mode 1) or zero padding (mode 0) | ≥ [`MIN_CLIENT_HELLO_LEN`]; [`TOKEN_ECHO_LEN`] with a token |
//! | `0x04` | [`ServerAccept`](Packet::ServerAccept) | client cid, server cid (a handshake without a token) | 18 |
//! | `0x05` | [`Refuse`](Packet::Refuse) | client cid, reason u8, flags u8 (bit 0: tagged), message length u8 (≤ [`MAX_REFUSE_MESSAGE`]), message, tag (16) when tagged | 13..=93 |
//! | `0x06` | [`SealedAccept`](Packet::SealedAccept) | client cid, nonce (24: the server random the session's packet keys are bound to), sealed { server cid, stateless reset token (16) } and its AEAD tag (16) | [`SEALED_ACCEPT_LEN`] |
//! | `0x07` | [`StatelessReset`](Packet::StatelessReset) | the connection id the triggering packet was sent to, reset token (16) | [`RESET_LEN`] |
//!
//! The challenge's timestamp is the server's own token, opaque to the client, which echoes it
//! unchanged: bits 0–47 are milliseconds on the server's cookie clock; the top 16 bits (offset
//! [`ECHO_ROUTE_OFFSET`] of the echo, big-endian) are a route the server's
//! [`Router`](crate::Router) chose, so an embedder that runs several endpoints can steer the echo
//! to the one that will own the session (0: no route); the cookie covers all 64 bits, and with a
//! token the token's tag too.
//!
//! Client hellos are padded so that every server reply sent before the client has proved its
//! address (challenge, refuse, accept) is smaller than the datagram that caused it: no amplification.
//!
//! ## Token section
//!
//! What a client with a [connect token](crate::token) puts in its hello and again in its
//! cookie echo (the server keeps no state between the two, so it reads the token twice):
//!
//! | size | field |
//! | ---: | --- |
//! | 8 | protocol id (public copy; sealing authenticates it) |
//! | 8 | expiry, Unix seconds (public copy; sealing authenticates it) |
//! | 24 | nonce of the sealed part |
//! | [`SEALED_LEN`] | the sealed private part |
//! | 16 | proof: a MAC with a key derived from the client-to-server key over the packet type, client cid, nonce, timestamp, cookie (zero in a hello) and the token's tag |
//!
//! The proof shows the sender holds the token's keys, which only the backend and the player
//! have: someone who captured the token on the path cannot use it from their own address.
//! With a token, the challenge's tag and a tagged refusal's tag are MACs with a key derived
//! from the server-to-client key, and the accept is sealed with a third key derived from it:
//! the client believes them only when they verify. A refusal the server could not tag (it
//! could not open the token, or speaks another version) is untagged; a client with a token
//! believes an untagged refusal only for those reasons.
//! # Connection packets
//!
//! | type | name | layout after the common header | clear header |
//! | --- | --- | --- | ---: |
//! | `0x10` | [`Data`](Packet::Data) | destination cid, packet number u64, frames to the end | 18 |
//! | `0x20` | [`FecData`](Packet::FecData) | destination cid, body: the 3-byte FEC data header, then the wrapped `Data` packet from its packet number on (layout owned by `fec`) | 21 |
//! | `0x21` | [`FecParity`](Packet::FecParity) | destination cid, parity number u64, body: block parity or sliding-window repair (layout owned by `fec`, told apart by its codec byte) | 18 |
//!
//! **Packet protection.** In a session with keys every connection packet is sealed
//! (`ricochet_proto::PacketKey`, AES-128-GCM): the *clear header* (the last column: through
//! the packet number, and for `FecData` the FEC data header before it) is associated data,
//! the rest is encrypted, and a [`TAG_LEN`]-byte tag follows. The nonce comes from the packet
//! number (`Data`, `FecData`: the ARQ packet number of the datagram, in clear at
//! [`clear_header`]'s offset) or the parity number (`FecParity`: a counter of its own).
//! Without keys (the insecure mode) the layouts are the same, without the tag. FEC runs
//! below the protection, on plaintext: see the `fec` seam in the crate docs for why.
//!
//! The destination cid is the *receiver's* connection id, so an endpoint demultiplexes by reading
//! bytes [`CID_OFFSET`]`..+8` without looking at the source address. A cid is opaque to everyone
//! but its issuer: the endpoint keeps its (masked) slot index in the low 20 bits and a keyed
//! permutation of the count of that slot's uses in bits 20..=31 and 41..=63, so that its ids
//! never repeat, across restarts either (see [`ConnectionHandle`](crate::ConnectionHandle));
//! the embedder's [`Router`](crate::Router) writes bits 32..=40 (a multi-worker server writes
//! the owning worker there, and its sockets steer on those bytes).
//!
//! # Frames (inside `Data`)
//!
//! `v` = variable-length integer (QUIC encoding, RFC 9000 §16: the top two bits of the first byte
//! give the length, 1/2/4/8 bytes, values up to 2^62 − 1).
//!
//! | type | name | fields |
//! | --- | --- | --- |
//! | `0x00` | padding | one byte; ignored |
//! | `0x01` | ping | none; makes the packet ack-eliciting |
//! | `0x02` | [`Ack`](Frame::Ack) | largest `v`, ack delay µs `v`, receive window segments `v`, extra range count `v`, first range length `v`, then per extra range: gap `v`, length `v` |
//! | `0x03` | [`Fragment`](Frame::Fragment) | channel u8, message id `v`, fragment index `v`, fragment count `v`, length `v`, bytes |
//! | `0x04` | [`Datagram`](Frame::Datagram) | channel u8, message id `v`, length `v`, bytes: a whole (unfragmented) message on any channel, the usual frame for unreliable messages |
//! | `0x05` | [`Close`](Frame::Close) | reason u8 |
//! | `0x06` | [`LossReport`](Frame::LossReport) | packets received `v`, packets lost `v`, longest loss burst `v` (the peer's realized loss, for the FEC policy; burst 0 = not measured; added in version 2) |
//!
//! ACK ranges follow QUIC: the first range covers `largest - first_len ..= largest`; each further
//! range starts `gap + 2` below the previous range's smallest packet number. At most
//! [`MAX_ACK_RANGES`] ranges are accepted.

use std::fmt;

use crate::token::{NONCE_LEN, SEALED_LEN};

mod codec;
mod frame;
mod packet;
mod varint;

pub use codec::{Reader, Writer};
pub use frame::{
    ack_len, datagram_overhead, encode_ack, encode_frame, fragment_overhead, frame_type, frames,
    AckFrame, AckRanges, Frame, Frames,
};
pub(crate) use packet::split_packet_number;
pub use packet::{
    clear_header, decode_packet, encode_data_header, encode_fec_data_header, encode_packet,
    hello_version, peek_cid, ClearHeader, Packet, TokenSection,
};
pub use varint::{varint_len, MAX_VARINT};

/// The protocol version this build speaks (3: packet protection, parity numbers; 4: connect
/// tokens in the handshake; 5: a token session's packet keys bound to its connection ids and
/// the server random its sealed accept carries, so a version-4 peer would complete the
/// handshake and then fail every packet: it is refused as a version mismatch instead; 6: a
/// server's connection ids no longer repeat across its restarts and carry no check bits, and a
/// client takes a stateless reset only of exactly [`RESET_LEN`] bytes from its server's
/// address).
pub const VERSION: u8 = 6;
/// Largest handshake packet a client sends (a hello or cookie echo with a token; the padded
/// insecure ones are smaller).
pub const MAX_CLIENT_HANDSHAKE_LEN: usize = max_len(
    max_len(TOKEN_HELLO_LEN, TOKEN_ECHO_LEN),
    MIN_CLIENT_HELLO_LEN,
);

const fn max_len(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}

/// Minimum size of a client hello / cookie echo (the padding that prevents amplification).
pub const MIN_CLIENT_HELLO_LEN: usize = 256;
/// Size of a handshake cookie (a truncated keyed BLAKE3 MAC).
pub const COOKIE_LEN: usize = 16;
/// Offset in a `ClientCookieEcho` of the 16-bit route (big-endian) the server's
/// [`Router`](crate::Router) put into the cookie (the timestamp's top two bytes).
pub const ECHO_ROUTE_OFFSET: usize = 18;
/// Offset in every connection packet (`Data`, `FecData`, `FecParity`) and in every handshake
/// packet of the 8-byte (big-endian) connection id: the receiver's in a connection packet, the
/// client's in a handshake packet.
pub const CID_OFFSET: usize = 2;
/// Size of the `Data` packet header (type, version, destination cid, packet number).
pub const DATA_HEADER_LEN: usize = 18;
/// Size of the part every FEC packet starts with (type, version, destination cid).
pub const FEC_HEADER_LEN: usize = 10;
/// Size of the `FecParity` packet header (type, version, destination cid, parity number).
pub const FEC_PARITY_HEADER_LEN: usize = FEC_HEADER_LEN + 8;
/// Size of the clear header of a `FecData` packet: type, version, destination cid, the FEC data
/// header, and the wrapped datagram's packet number.
pub const FEC_DATA_CLEAR_LEN: usize = FEC_HEADER_LEN + crate::fec::DATA_HEADER_LEN + 8;
/// Bytes of authentication tag after every protected connection packet.
pub const TAG_LEN: usize = 16;
/// Maximum number of ACK ranges in one ACK frame (first range included).
pub const MAX_ACK_RANGES: usize = 32;
/// Size of a server challenge without a tag (insecure mode).
pub const CHALLENGE_LEN: usize = 2 + 8 + 8 + 8 + COOKIE_LEN;
/// Size of the tag on handshake replies, the proof in a token section, and a reset token.
pub const HANDSHAKE_TAG_LEN: usize = 16;
/// Size of a server accept in insecure mode.
pub const ACCEPT_LEN: usize = 2 + 8 + 8;
/// Size of the smallest refuse packet (untagged, no message).
pub const REFUSE_LEN: usize = 2 + 8 + 3;
/// Longest message an application refusal carries.
pub const MAX_REFUSE_MESSAGE: usize = 64;
/// Size of the sealed part of a [`Packet::SealedAccept`]: server cid, reset token, AEAD tag.
pub const SEALED_ACCEPT_BODY_LEN: usize = 8 + HANDSHAKE_TAG_LEN + 16;
/// Size of a sealed accept.
pub const SEALED_ACCEPT_LEN: usize = 2 + 8 + NONCE_LEN + SEALED_ACCEPT_BODY_LEN;
/// Size of a stateless reset. A server only sends one in answer to a larger packet.
pub const RESET_LEN: usize = 2 + 8 + HANDSHAKE_TAG_LEN;
/// Size of the token section of a hello or cookie echo.
pub const TOKEN_SECTION_LEN: usize = 8 + 8 + NONCE_LEN + SEALED_LEN + HANDSHAKE_TAG_LEN;
/// Size of a client hello carrying a token.
pub const TOKEN_HELLO_LEN: usize = HELLO_BODY_LEN + 1 + TOKEN_SECTION_LEN;
/// Size of a cookie echo carrying a token.
pub const TOKEN_ECHO_LEN: usize = COOKIE_ECHO_BODY_LEN + 1 + TOKEN_SECTION_LEN;
/// Payload of a hello before its mode byte.
const HELLO_BODY_LEN: usize = 2 + 8 + 8;
/// Payload of a cookie echo before its mode byte.
const COOKIE_ECHO_BODY_LEN: usize = 2 + 8 + 8 + 8 + COOKIE_LEN;
/// Mode byte: no token (insecure), zero padding follows.
const MODE_INSECURE: u8 = 0;
/// Mode byte: a token section follows.
const MODE_TOKEN: u8 = 1;

/// Why decoding or encoding failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The input ended before the structure did.
    #[error("truncated input")]
    Truncated,
    /// The first byte is not a known packet type.
    #[error("unknown packet type {0:#04x}")]
    UnknownPacketType(u8),
    /// A frame type byte is not known.
    #[error("unknown frame type {0:#04x}")]
    UnknownFrameType(u8),
    /// The packet's version is not ours (carries the version seen).
    #[error("unsupported version {0}")]
    VersionMismatch(u8),
    /// A client hello shorter than the anti-amplification padding.
    #[error("client hello not padded")]
    Unpadded,
    /// A length field points past the end of the packet.
    #[error("length field exceeds packet")]
    BadLength,
    /// Fragment index not below the fragment count, or a zero count.
    #[error("fragment index {index} out of range for count {count}")]
    BadFragment {
        /// Index read.
        index: u64,
        /// Count read.
        count: u64,
    },
    /// More ACK ranges than [`MAX_ACK_RANGES`], or ranges reaching below packet number 0.
    #[error("invalid ack ranges")]
    BadAck,
    /// An encoder's output buffer is too small.
    #[error("output buffer too small")]
    BufferTooSmall,
    /// A value does not fit its encoding (varint > 2^62 − 1).
    #[error("value out of range")]
    ValueOutOfRange,
    /// A hello's mode byte is neither 0 (no token) nor 1 (token).
    #[error("unknown hello mode {0}")]
    UnknownMode(u8),
}

/// Packet type byte (offset 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PacketType {
    /// Client hello (first handshake message).
    ClientHello = 0x01,
    /// Server challenge carrying a cookie.
    ServerChallenge = 0x02,
    /// Client hello echoing the cookie.
    ClientCookieEcho = 0x03,
    /// Server accepts, naming its connection id.
    ServerAccept = 0x04,
    /// Server refuses a handshake (reason attached).
    Refuse = 0x05,
    /// Server accepts, its connection id and reset token sealed with the session's keys.
    SealedAccept = 0x06,
    /// A server that has no state for a connection id says so.
    StatelessReset = 0x07,
    /// Connection data packet carrying frames.
    Data = 0x10,
    /// FEC-protected data shard (body owned by `fec`).
    FecData = 0x20,
    /// FEC parity shard (body owned by `fec`).
    FecParity = 0x21,
}

impl PacketType {
    /// Parse a type byte.
    pub fn from_u8(b: u8) -> Result<Self, WireError> {
        Ok(match b {
            0x01 => Self::ClientHello,
            0x02 => Self::ServerChallenge,
            0x03 => Self::ClientCookieEcho,
            0x04 => Self::ServerAccept,
            0x05 => Self::Refuse,
            0x06 => Self::SealedAccept,
            0x07 => Self::StatelessReset,
            0x10 => Self::Data,
            0x20 => Self::FecData,
            0x21 => Self::FecParity,
            other => return Err(WireError::UnknownPacketType(other)),
        })
    }
}

/// A connection id: the receiver's handle for a connection, written in every packet sent to it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ConnectionId(pub u64);

impl fmt::Debug for ConnectionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cid:{:016x}", self.0)
    }
}

/// Why a connection or handshake ended, as carried on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CloseReason {
    /// The application closed the connection normally.
    Application,
    /// No packet arrived within the idle timeout, or packets arrived but nothing this side
    /// sent was acknowledged for that long (`Config::idle_timeout`).
    IdleTimeout,
    /// The peer speaks another protocol version.
    VersionMismatch,
    /// The server has no room for another session (or for another used token).
    ServerFull,
    /// Too many sessions from this source address (`ListenConfig::max_sessions_per_address`).
    /// Cookie echoes over the per-address handshake rate get no refusal: they are dropped
    /// silently (`DropCause::RateLimited`) and the client retries.
    TooManyFromAddress,
    /// The handshake did not complete in time.
    HandshakeTimeout,
    /// The peer violated the protocol.
    ProtocolViolation,
    /// The endpoint is shutting down.
    Shutdown,
    /// The server is draining (`Endpoint::start_draining`): it keeps its sessions but admits
    /// no one new. A token client moves on to the next server its token lists.
    Draining,
    /// The server has no state for this connection (it restarted, or dropped the session):
    /// it answered with a stateless reset only it can produce.
    Reset,
    /// The server admits clients by connect token and the client sent none.
    TokenRequired,
    /// The server could not open the token: sealed with another key, for another protocol
    /// id, or altered.
    TokenInvalid,
    /// The token's expiry has passed.
    TokenExpired,
    /// None of the server's public addresses is in the token.
    TokenWrongServer,
    /// The server already accepted this token once.
    TokenReused,
    /// The client sent a token to a server in insecure mode.
    InsecureServer,
    /// The server application refused the client, with its own code (0..=127); the refusal
    /// may carry a message too.
    Rejected(u8),
    /// A reason code this version does not know.
    Unknown(u8),
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Application => f.write_str("closed by the application"),
            Self::IdleTimeout => f.write_str(
                "nothing arrived, or nothing sent was acknowledged, within the idle timeout \
                 (Config::idle_timeout)",
            ),
            Self::VersionMismatch => f.write_str("the peer speaks another protocol version"),
            // The settings behind a refusal are named, so the error says what the server's
            // operator can raise.
            Self::ServerFull => {
                f.write_str("the server is full (its session limit, ListenConfig::max_sessions)")
            }
            Self::TooManyFromAddress => f.write_str(
                "too many sessions from this address (the server's \
                 ListenConfig::max_sessions_per_address)",
            ),
            Self::HandshakeTimeout => {
                f.write_str("the handshake did not complete in time (Config::handshake_timeout)")
            }
            Self::ProtocolViolation => f.write_str("the peer violated the protocol"),
            Self::Shutdown => f.write_str("the endpoint is shutting down"),
            Self::Draining => {
                f.write_str("the server is draining: it admits no new sessions (try another)")
            }
            Self::Reset => f.write_str("the server has no state for this session (reset)"),
            Self::TokenRequired => f.write_str("the server requires a connect token"),
            Self::TokenInvalid => {
                f.write_str("the server could not open the connect token (another key or game)")
            }
            Self::TokenExpired => f.write_str("the connect token expired"),
            Self::TokenWrongServer => f.write_str("the connect token is not for this server"),
            Self::TokenReused => f.write_str("the connect token was already used"),
            Self::InsecureServer => {
                f.write_str("the server is in insecure mode and takes no connect tokens")
            }
            Self::Rejected(code) => write!(f, "refused by the server application (code {code})"),
            Self::Unknown(c) => write!(f, "reason code {c}"),
        }
    }
}

/// Wire codes from this one up are application refusals ([`CloseReason::Rejected`]).
const REJECTED_BASE: u8 = 0x80;

impl CloseReason {
    /// Wire code.
    pub fn to_u8(self) -> u8 {
        match self {
            Self::Application => 0,
            Self::IdleTimeout => 1,
            Self::VersionMismatch => 2,
            Self::ServerFull => 3,
            Self::TooManyFromAddress => 4,
            Self::HandshakeTimeout => 5,
            Self::ProtocolViolation => 6,
            Self::Shutdown => 7,
            Self::Reset => 8,
            Self::TokenRequired => 9,
            Self::TokenInvalid => 10,
            Self::TokenExpired => 11,
            Self::TokenWrongServer => 12,
            Self::TokenReused => 13,
            Self::InsecureServer => 14,
            Self::Draining => 15,
            Self::Rejected(code) => REJECTED_BASE | (code & 0x7f),
            Self::Unknown(c) => c,
        }
    }

    /// Parse a wire code (unknown codes are kept, not rejected).
    pub fn from_u8(c: u8) -> Self {
        match c {
            0 => Self::Application,
            1 => Self::IdleTimeout,
            2 => Self::VersionMismatch,
            3 => Self::ServerFull,
            4 => Self::TooManyFromAddress,
            5 => Self::HandshakeTimeout,
            6 => Self::ProtocolViolation,
            7 => Self::Shutdown,
            8 => Self::Reset,
            9 => Self::TokenRequired,
            10 => Self::TokenInvalid,
            11 => Self::TokenExpired,
            12 => Self::TokenWrongServer,
            13 => Self::TokenReused,
            14 => Self::InsecureServer,
            15 => Self::Draining,
            c if c >= REJECTED_BASE => Self::Rejected(c & 0x7f),
            c => Self::Unknown(c),
        }
    }

    /// True for the refusals a server can send without having opened the client's token
    /// (so without a tag): a client with a token believes an untagged refusal only for these.
    pub fn refused_before_token(self) -> bool {
        matches!(
            self,
            Self::VersionMismatch | Self::TokenRequired | Self::TokenInvalid | Self::InsecureServer
        )
    }
}

#[cfg(test)]
mod tests;
