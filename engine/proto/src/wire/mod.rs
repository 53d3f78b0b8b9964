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

mod varint;

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
    /// Too many sessions from this source address (`ServerConfig::max_sessions_per_address`).
    /// Cookie echoes over the per-address handshake rate get no refusal: they are dropped
    /// silently (`DropCause::RateLimited`) and the client retries.
    TooManyFromAddress,
    /// The handshake did not complete in time.
    HandshakeTimeout,
    /// The peer violated the protocol.
    ProtocolViolation,
    /// The endpoint is shutting down.
    Shutdown,
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
                f.write_str("the server is full (its session limit, ServerConfig::max_sessions)")
            }
            Self::TooManyFromAddress => f.write_str(
                "too many sessions from this address (the server's \
                 ServerConfig::max_sessions_per_address)",
            ),
            Self::HandshakeTimeout => {
                f.write_str("the handshake did not complete in time (Config::handshake_timeout)")
            }
            Self::ProtocolViolation => f.write_str("the peer violated the protocol"),
            Self::Shutdown => f.write_str("the endpoint is shutting down"),
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

/// The token section of a hello or cookie echo (see the module docs), borrowing from the
/// datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenSection<'a> {
    /// Public copy of the token's protocol id.
    pub protocol_id: u64,
    /// Public copy of the token's expiry (Unix seconds).
    pub expires_unix: u64,
    /// Nonce of the sealed part.
    pub nonce: &'a [u8; NONCE_LEN],
    /// The sealed private part.
    pub sealed: &'a [u8; SEALED_LEN],
    /// Proof that the sender holds the token's keys.
    pub proof: [u8; HANDSHAKE_TAG_LEN],
}

/// A decoded packet, borrowing from the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packet<'a> {
    /// Client hello.
    ClientHello {
        /// The client's connection id (servers reply to it).
        client_cid: ConnectionId,
        /// Client's random nonce.
        nonce: u64,
        /// The connect token, when the client has one.
        token: Option<TokenSection<'a>>,
    },
    /// Server challenge: echo the cookie to prove the address.
    ServerChallenge {
        /// The client's connection id.
        client_cid: ConnectionId,
        /// The nonce from the hello.
        nonce: u64,
        /// The server's token covered by the cookie: ms on its cookie clock in bits 0–47, and
        /// optionally the owner worker (see the module docs). The client echoes it unchanged.
        timestamp: u64,
        /// The cookie.
        cookie: [u8; COOKIE_LEN],
        /// With a token: a MAC under a key derived from the server-to-client key.
        tag: Option<[u8; HANDSHAKE_TAG_LEN]>,
    },
    /// Client hello echoing a cookie.
    ClientCookieEcho {
        /// The client's connection id.
        client_cid: ConnectionId,
        /// The nonce from the hello.
        nonce: u64,
        /// Timestamp from the challenge.
        timestamp: u64,
        /// Cookie from the challenge.
        cookie: [u8; COOKIE_LEN],
        /// The connect token again, when the client has one.
        token: Option<TokenSection<'a>>,
    },
    /// Server accept of a handshake without a token.
    ServerAccept {
        /// The client's connection id.
        client_cid: ConnectionId,
        /// The server's connection id (the client writes it in every later packet).
        server_cid: ConnectionId,
    },
    /// Server accept with a token: the server cid and the session's stateless reset token,
    /// sealed with a key derived from the server-to-client key.
    SealedAccept {
        /// The client's connection id.
        client_cid: ConnectionId,
        /// The seal's random nonce, fresh for each session: also the server random the
        /// session's packet keys are bound to (the tag authenticates it).
        nonce: &'a [u8; NONCE_LEN],
        /// Ciphertext and tag.
        sealed: &'a [u8; SEALED_ACCEPT_BODY_LEN],
    },
    /// Server refuses the handshake.
    Refuse {
        /// The client's connection id.
        client_cid: ConnectionId,
        /// Why.
        reason: CloseReason,
        /// The application's message ([`CloseReason::Rejected`]), at most
        /// [`MAX_REFUSE_MESSAGE`] bytes; empty otherwise.
        message: &'a [u8],
        /// With a token the server opened: a MAC under a key derived from the
        /// server-to-client key.
        tag: Option<[u8; HANDSHAKE_TAG_LEN]>,
    },
    /// A server without state for `cid` answers a packet sent to it.
    StatelessReset {
        /// The connection id the triggering packet was sent to (the server's id of the
        /// session).
        cid: ConnectionId,
        /// The session's reset token: only the server that issued the id can compute it.
        token: [u8; HANDSHAKE_TAG_LEN],
    },
    /// Data packet.
    Data {
        /// The receiver's connection id.
        dst_cid: ConnectionId,
        /// Packet number (never reused within a connection).
        packet_number: u64,
        /// The frames, decode with [`frames`].
        payload: &'a [u8],
    },
    /// FEC data shard, opaque to this layer.
    FecData {
        /// The receiver's connection id.
        dst_cid: ConnectionId,
        /// Body (layout owned by `fec`).
        body: &'a [u8],
    },
    /// FEC parity shard, opaque to this layer.
    FecParity {
        /// The receiver's connection id.
        dst_cid: ConnectionId,
        /// The sender's parity counter (the packet-protection nonce of this packet).
        number: u64,
        /// Body (layout owned by `fec`).
        body: &'a [u8],
    },
}

/// Bounds-checked big-endian reader.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
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
    buf: &'a mut [u8],
    pos: usize,
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

/// Read the destination connection id of a connection packet (`Data`, `FecData`, `FecParity`)
/// or the client cid of a server handshake reply, without decoding the rest.
pub fn peek_cid(datagram: &[u8]) -> Option<ConnectionId> {
    let b = datagram.get(CID_OFFSET..CID_OFFSET + 8)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    Some(ConnectionId(u64::from_be_bytes(a)))
}

/// Decode one datagram's packet header (frames are decoded separately with [`frames`]).
///
/// A version other than [`VERSION`] yields [`WireError::VersionMismatch`].
pub fn decode_packet(datagram: &[u8]) -> Result<Packet<'_>, WireError> {
    let mut r = Reader::new(datagram);
    let ty = PacketType::from_u8(r.u8()?)?;
    let version = r.u8()?;
    if version != VERSION {
        return Err(WireError::VersionMismatch(version));
    }
    let cid = ConnectionId(r.u64()?);
    let cookie = |r: &mut Reader<'_>| -> Result<[u8; COOKIE_LEN], WireError> {
        let mut c = [0u8; COOKIE_LEN];
        c.copy_from_slice(r.bytes(COOKIE_LEN)?);
        Ok(c)
    };
    Ok(match ty {
        PacketType::ClientHello => {
            let nonce = r.u64()?;
            let token = token_section(&mut r, datagram.len())?;
            Packet::ClientHello {
                client_cid: cid,
                nonce,
                token,
            }
        }
        PacketType::ServerChallenge => Packet::ServerChallenge {
            client_cid: cid,
            nonce: r.u64()?,
            timestamp: r.u64()?,
            cookie: cookie(&mut r)?,
            tag: optional_tag(&mut r)?,
        },
        PacketType::ClientCookieEcho => {
            let nonce = r.u64()?;
            let timestamp = r.u64()?;
            let cookie = cookie(&mut r)?;
            let token = token_section(&mut r, datagram.len())?;
            Packet::ClientCookieEcho {
                client_cid: cid,
                nonce,
                timestamp,
                cookie,
                token,
            }
        }
        PacketType::ServerAccept => Packet::ServerAccept {
            client_cid: cid,
            server_cid: ConnectionId(r.u64()?),
        },
        PacketType::SealedAccept => Packet::SealedAccept {
            client_cid: cid,
            nonce: array(r.bytes(NONCE_LEN)?)?,
            sealed: array(r.bytes(SEALED_ACCEPT_BODY_LEN)?)?,
        },
        PacketType::Refuse => {
            let reason = CloseReason::from_u8(r.u8()?);
            let flags = r.u8()?;
            if flags > 1 {
                return Err(WireError::BadLength);
            }
            let len = usize::from(r.u8()?);
            if len > MAX_REFUSE_MESSAGE {
                return Err(WireError::BadLength);
            }
            let message = r.bytes(len)?;
            let tag = if flags & 1 == 1 {
                Some(tag_of(&mut r)?)
            } else {
                None
            };
            Packet::Refuse {
                client_cid: cid,
                reason,
                message,
                tag,
            }
        }
        PacketType::StatelessReset => Packet::StatelessReset {
            cid,
            token: tag_of(&mut r)?,
        },
        PacketType::Data => Packet::Data {
            dst_cid: cid,
            packet_number: r.u64()?,
            payload: r.rest(),
        },
        PacketType::FecData => Packet::FecData {
            dst_cid: cid,
            body: r.rest(),
        },
        PacketType::FecParity => Packet::FecParity {
            dst_cid: cid,
            number: r.u64()?,
            body: r.rest(),
        },
    })
}

fn array<const N: usize>(b: &[u8]) -> Result<&[u8; N], WireError> {
    b.try_into().map_err(|_| WireError::Truncated)
}

fn tag_of(r: &mut Reader<'_>) -> Result<[u8; HANDSHAKE_TAG_LEN], WireError> {
    Ok(*array(r.bytes(HANDSHAKE_TAG_LEN)?)?)
}

/// A tag when the packet has one more tag's worth of bytes (trailing bytes beyond are ignored,
/// as after every fixed-size packet).
fn optional_tag(r: &mut Reader<'_>) -> Result<Option<[u8; HANDSHAKE_TAG_LEN]>, WireError> {
    if r.remaining() >= HANDSHAKE_TAG_LEN {
        Ok(Some(tag_of(r)?))
    } else {
        Ok(None)
    }
}

/// The mode byte of a hello or echo and what follows it: a token section, or padding (the
/// datagram must then be at least [`MIN_CLIENT_HELLO_LEN`] long).
fn token_section<'a>(
    r: &mut Reader<'a>,
    total: usize,
) -> Result<Option<TokenSection<'a>>, WireError> {
    if total < MIN_CLIENT_HELLO_LEN {
        return Err(WireError::Unpadded);
    }
    match r.u8()? {
        MODE_INSECURE => Ok(None),
        MODE_TOKEN => Ok(Some(TokenSection {
            protocol_id: r.u64()?,
            expires_unix: r.u64()?,
            nonce: array(r.bytes(NONCE_LEN)?)?,
            sealed: array(r.bytes(SEALED_LEN)?)?,
            proof: tag_of(r)?,
        })),
        m => Err(WireError::UnknownMode(m)),
    }
}

/// The clear header of a connection packet (`Data`, `FecData`, `FecParity`): what packet
/// protection authenticates without encrypting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClearHeader {
    /// `Data`, `FecData` or `FecParity`.
    pub ty: PacketType,
    /// The receiver's connection id.
    pub dst_cid: ConnectionId,
    /// The packet number (`Data`, `FecData`) or parity number (`FecParity`): the nonce.
    pub number: u64,
    /// Bytes of clear header: 18 (`Data`, `FecParity`) or [`FEC_DATA_CLEAR_LEN`] (`FecData`).
    pub len: usize,
}

/// Reads the clear header of a connection packet without touching the rest (which may be
/// sealed). Handshake packets are [`WireError::UnknownPacketType`] here.
pub fn clear_header(datagram: &[u8]) -> Result<ClearHeader, WireError> {
    let mut r = Reader::new(datagram);
    let b = r.u8()?;
    let ty = PacketType::from_u8(b)?;
    let version = r.u8()?;
    if version != VERSION {
        return Err(WireError::VersionMismatch(version));
    }
    let dst_cid = ConnectionId(r.u64()?);
    let len = match ty {
        PacketType::Data | PacketType::FecParity => DATA_HEADER_LEN,
        PacketType::FecData => {
            r.bytes(crate::fec::DATA_HEADER_LEN)?;
            FEC_DATA_CLEAR_LEN
        }
        _ => return Err(WireError::UnknownPacketType(b)),
    };
    Ok(ClearHeader {
        ty,
        dst_cid,
        number: r.u64()?,
        len,
    })
}

/// Read the version byte of a datagram whose type is a client hello, if present: used to answer
/// a hello from another version with a refuse.
pub fn hello_version(datagram: &[u8]) -> Option<u8> {
    match datagram.first() {
        Some(&t)
            if t == PacketType::ClientHello as u8 || t == PacketType::ClientCookieEcho as u8 =>
        {
            datagram.get(1).copied()
        }
        _ => None,
    }
}

fn header(w: &mut Writer<'_>, ty: PacketType, cid: ConnectionId) -> Result<(), WireError> {
    w.u8(ty as u8)?;
    w.u8(VERSION)?;
    w.u64(cid.0)
}

/// Encode a handshake or FEC packet completely (for `Data`, use [`encode_data_header`] and then
/// frames). Returns the bytes written.
pub fn encode_packet(p: &Packet<'_>, out: &mut [u8]) -> Result<usize, WireError> {
    let mut w = Writer::new(out);
    match *p {
        Packet::ClientHello {
            client_cid,
            nonce,
            token,
        } => {
            header(&mut w, PacketType::ClientHello, client_cid)?;
            w.u64(nonce)?;
            put_token_section(&mut w, token)?;
        }
        Packet::ServerChallenge {
            client_cid,
            nonce,
            timestamp,
            cookie,
            tag,
        } => {
            header(&mut w, PacketType::ServerChallenge, client_cid)?;
            w.u64(nonce)?;
            w.u64(timestamp)?;
            w.bytes(&cookie)?;
            if let Some(t) = tag {
                w.bytes(&t)?;
            }
        }
        Packet::ClientCookieEcho {
            client_cid,
            nonce,
            timestamp,
            cookie,
            token,
        } => {
            header(&mut w, PacketType::ClientCookieEcho, client_cid)?;
            w.u64(nonce)?;
            w.u64(timestamp)?;
            w.bytes(&cookie)?;
            put_token_section(&mut w, token)?;
        }
        Packet::ServerAccept {
            client_cid,
            server_cid,
        } => {
            header(&mut w, PacketType::ServerAccept, client_cid)?;
            w.u64(server_cid.0)?;
        }
        Packet::SealedAccept {
            client_cid,
            nonce,
            sealed,
        } => {
            header(&mut w, PacketType::SealedAccept, client_cid)?;
            w.bytes(nonce)?;
            w.bytes(sealed)?;
        }
        Packet::Refuse {
            client_cid,
            reason,
            message,
            tag,
        } => {
            if message.len() > MAX_REFUSE_MESSAGE {
                return Err(WireError::ValueOutOfRange);
            }
            header(&mut w, PacketType::Refuse, client_cid)?;
            w.u8(reason.to_u8())?;
            w.u8(u8::from(tag.is_some()))?;
            w.u8(message.len() as u8)?;
            w.bytes(message)?;
            if let Some(t) = tag {
                w.bytes(&t)?;
            }
        }
        Packet::StatelessReset { cid, token } => {
            header(&mut w, PacketType::StatelessReset, cid)?;
            w.bytes(&token)?;
        }
        Packet::Data {
            dst_cid,
            packet_number,
            payload,
        } => {
            header(&mut w, PacketType::Data, dst_cid)?;
            w.u64(packet_number)?;
            w.bytes(payload)?;
        }
        Packet::FecData { dst_cid, body } => {
            header(&mut w, PacketType::FecData, dst_cid)?;
            w.bytes(body)?;
        }
        Packet::FecParity {
            dst_cid,
            number,
            body,
        } => {
            header(&mut w, PacketType::FecParity, dst_cid)?;
            w.u64(number)?;
            w.bytes(body)?;
        }
    }
    Ok(w.len())
}

/// The mode byte and a token section, or the mode byte and zero padding up to
/// [`MIN_CLIENT_HELLO_LEN`].
fn put_token_section(w: &mut Writer<'_>, token: Option<TokenSection<'_>>) -> Result<(), WireError> {
    match token {
        Some(t) => {
            w.u8(MODE_TOKEN)?;
            w.u64(t.protocol_id)?;
            w.u64(t.expires_unix)?;
            w.bytes(t.nonce)?;
            w.bytes(t.sealed)?;
            w.bytes(&t.proof)
        }
        None => {
            w.u8(MODE_INSECURE)?;
            w.zeros(MIN_CLIENT_HELLO_LEN.saturating_sub(w.len()))
        }
    }
}

/// Write a `Data` packet header; frames follow at offset [`DATA_HEADER_LEN`].
pub fn encode_data_header(
    dst_cid: ConnectionId,
    packet_number: u64,
    out: &mut [u8],
) -> Result<usize, WireError> {
    let mut w = Writer::new(out);
    header(&mut w, PacketType::Data, dst_cid)?;
    w.u64(packet_number)?;
    Ok(w.len())
}

/// Frame type bytes.
pub mod frame_type {
    /// Padding.
    pub const PADDING: u8 = 0x00;
    /// Ping.
    pub const PING: u8 = 0x01;
    /// Ack.
    pub const ACK: u8 = 0x02;
    /// Message fragment.
    pub const FRAGMENT: u8 = 0x03;
    /// Whole message.
    pub const DATAGRAM: u8 = 0x04;
    /// Close.
    pub const CLOSE: u8 = 0x05;
    /// Loss report.
    pub const LOSS_REPORT: u8 = 0x06;
}

/// A decoded ACK frame. Ranges were validated at decode time; [`AckFrame::ranges`] re-reads them
/// from the packet without allocating. Equality is semantic (same fields and ranges), so a
/// non-canonical varint encoding equals its canonical re-encoding.
#[derive(Debug, Clone, Copy)]
pub struct AckFrame<'a> {
    /// Largest packet number acknowledged.
    pub largest: u64,
    /// Microseconds between receiving `largest` and sending this ACK.
    pub ack_delay_us: u64,
    /// Receive window the sender of the ACK grants, in segments.
    pub window: u64,
    /// Number of ranges (first range included).
    pub range_count: usize,
    raw: &'a [u8],
}

impl PartialEq for AckFrame<'_> {
    fn eq(&self, o: &Self) -> bool {
        self.largest == o.largest
            && self.ack_delay_us == o.ack_delay_us
            && self.window == o.window
            && self.range_count == o.range_count
            && self.ranges().eq(o.ranges())
    }
}

impl Eq for AckFrame<'_> {}

impl<'a> AckFrame<'a> {
    /// Acknowledged packet-number ranges, highest first, as inclusive `(low, high)`.
    pub fn ranges(&self) -> AckRanges<'a> {
        AckRanges {
            r: Reader::new(self.raw),
            left: self.range_count,
            prev_low: None,
            largest: self.largest,
        }
    }
}

/// Iterator over an [`AckFrame`]'s ranges.
#[derive(Debug, Clone)]
pub struct AckRanges<'a> {
    r: Reader<'a>,
    left: usize,
    prev_low: Option<u64>,
    largest: u64,
}

impl Iterator for AckRanges<'_> {
    type Item = (u64, u64);
    fn next(&mut self) -> Option<(u64, u64)> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // Validated at decode time, so arithmetic cannot underflow here; still use checked
        // arithmetic so a logic error ends the iteration instead of panicking.
        let high = match self.prev_low {
            None => self.largest,
            Some(low) => {
                let gap = self.r.varint().ok()?;
                low.checked_sub(gap)?.checked_sub(2)?
            }
        };
        let len = self.r.varint().ok()?;
        let low = high.checked_sub(len)?;
        self.prev_low = Some(low);
        Some((low, high))
    }
}

/// A decoded frame, borrowing from the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    /// Padding (one byte).
    Padding,
    /// Ping.
    Ping,
    /// Acknowledgement.
    Ack(AckFrame<'a>),
    /// One fragment of a message.
    Fragment {
        /// Channel index.
        channel: u8,
        /// Per-channel message id.
        message_id: u64,
        /// Fragment index (< count).
        index: u64,
        /// Number of fragments of the message (≥ 1).
        count: u64,
        /// The fragment's bytes.
        data: &'a [u8],
    },
    /// A whole message in one frame.
    Datagram {
        /// Channel index.
        channel: u8,
        /// Per-channel message id.
        message_id: u64,
        /// Message bytes.
        data: &'a [u8],
    },
    /// Connection close with a reason.
    Close(CloseReason),
    /// Loss the sender of this frame observed on packets it received.
    LossReport {
        /// Packets received in the report interval.
        received: u64,
        /// Packets lost in the report interval.
        lost: u64,
        /// Longest run of consecutive lost packets in the interval (0: not measured). Lets
        /// the FEC policy size parity for burst loss.
        max_burst: u64,
    },
}

/// Iterate the frames of a `Data` payload. Yields an error (once) and then stops.
pub fn frames(payload: &[u8]) -> Frames<'_> {
    Frames {
        r: Reader::new(payload),
        failed: false,
    }
}

/// Iterator returned by [`frames`].
#[derive(Debug, Clone)]
pub struct Frames<'a> {
    r: Reader<'a>,
    failed: bool,
}

impl<'a> Iterator for Frames<'a> {
    type Item = Result<Frame<'a>, WireError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.r.remaining() == 0 {
            return None;
        }
        let res = decode_frame(&mut self.r);
        if res.is_err() {
            self.failed = true;
        }
        Some(res)
    }
}

fn len_bytes<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], WireError> {
    let len = r.varint()?;
    if len > r.remaining() as u64 {
        return Err(WireError::BadLength);
    }
    r.bytes(len as usize)
}

fn decode_frame<'a>(r: &mut Reader<'a>) -> Result<Frame<'a>, WireError> {
    let ty = r.u8()?;
    Ok(match ty {
        frame_type::PADDING => Frame::Padding,
        frame_type::PING => Frame::Ping,
        frame_type::ACK => {
            let largest = r.varint()?;
            let ack_delay_us = r.varint()?;
            let window = r.varint()?;
            let extra = r.varint()?;
            if extra >= MAX_ACK_RANGES as u64 {
                return Err(WireError::BadAck);
            }
            let start = r.pos;
            // Validate every range now so the lazy iterator can trust the bytes.
            let first = r.varint()?;
            let mut low = largest.checked_sub(first).ok_or(WireError::BadAck)?;
            for _ in 0..extra {
                let gap = r.varint()?;
                let len = r.varint()?;
                let high = low
                    .checked_sub(gap)
                    .and_then(|v| v.checked_sub(2))
                    .ok_or(WireError::BadAck)?;
                low = high.checked_sub(len).ok_or(WireError::BadAck)?;
            }
            Frame::Ack(AckFrame {
                largest,
                ack_delay_us,
                window,
                range_count: extra as usize + 1,
                raw: &r.buf[start..r.pos],
            })
        }
        frame_type::FRAGMENT => {
            let channel = r.u8()?;
            let message_id = r.varint()?;
            let index = r.varint()?;
            let count = r.varint()?;
            if count == 0 || index >= count {
                return Err(WireError::BadFragment { index, count });
            }
            Frame::Fragment {
                channel,
                message_id,
                index,
                count,
                data: len_bytes(r)?,
            }
        }
        frame_type::DATAGRAM => Frame::Datagram {
            channel: r.u8()?,
            message_id: r.varint()?,
            data: len_bytes(r)?,
        },
        frame_type::CLOSE => Frame::Close(CloseReason::from_u8(r.u8()?)),
        frame_type::LOSS_REPORT => Frame::LossReport {
            received: r.varint()?,
            lost: r.varint()?,
            max_burst: r.varint()?,
        },
        other => return Err(WireError::UnknownFrameType(other)),
    })
}

/// Bytes an encoded fragment frame header takes (excluding its data).
pub fn fragment_overhead(message_id: u64, index: u64, count: u64, len: usize) -> usize {
    1 + 1 + varint_len(message_id) + varint_len(index) + varint_len(count) + varint_len(len as u64)
}

/// Bytes an encoded datagram frame header takes (excluding its data).
pub fn datagram_overhead(message_id: u64, len: usize) -> usize {
    1 + 1 + varint_len(message_id) + varint_len(len as u64)
}

/// Encode one frame (ACK frames are usually written with [`encode_ack`]). All or nothing: on error
/// nothing is left in `w`, so a caller can try a frame and move on when it does not fit.
pub fn encode_frame(f: &Frame<'_>, w: &mut Writer<'_>) -> Result<(), WireError> {
    let start = w.pos;
    let res = encode_frame_inner(f, w);
    if res.is_err() {
        w.pos = start;
    }
    res
}

fn encode_frame_inner(f: &Frame<'_>, w: &mut Writer<'_>) -> Result<(), WireError> {
    match *f {
        Frame::Padding => w.u8(frame_type::PADDING),
        Frame::Ping => w.u8(frame_type::PING),
        Frame::Ack(a) => {
            let ranges: [(u64, u64); MAX_ACK_RANGES] = {
                let mut arr = [(0, 0); MAX_ACK_RANGES];
                for (i, r) in a.ranges().take(MAX_ACK_RANGES).enumerate() {
                    arr[i] = r;
                }
                arr
            };
            encode_ack(
                a.ack_delay_us,
                a.window,
                &ranges[..a.range_count.min(MAX_ACK_RANGES)],
                w,
            )
        }
        Frame::Fragment {
            channel,
            message_id,
            index,
            count,
            data,
        } => {
            if count == 0 || index >= count {
                return Err(WireError::BadFragment { index, count });
            }
            w.u8(frame_type::FRAGMENT)?;
            w.u8(channel)?;
            w.varint(message_id)?;
            w.varint(index)?;
            w.varint(count)?;
            w.varint(data.len() as u64)?;
            w.bytes(data)
        }
        Frame::Datagram {
            channel,
            message_id,
            data,
        } => {
            w.u8(frame_type::DATAGRAM)?;
            w.u8(channel)?;
            w.varint(message_id)?;
            w.varint(data.len() as u64)?;
            w.bytes(data)
        }
        Frame::Close(reason) => {
            w.u8(frame_type::CLOSE)?;
            w.u8(reason.to_u8())
        }
        Frame::LossReport {
            received,
            lost,
            max_burst,
        } => {
            w.u8(frame_type::LOSS_REPORT)?;
            w.varint(received)?;
            w.varint(lost)?;
            w.varint(max_burst)
        }
    }
}

/// Encode an ACK frame from inclusive ranges sorted highest first and disjoint with gaps ≥ 1
/// (at most [`MAX_ACK_RANGES`]; extra ranges are left out). All or nothing like [`encode_frame`];
/// [`ack_len`] gives the size.
pub fn encode_ack(
    ack_delay_us: u64,
    window: u64,
    ranges: &[(u64, u64)],
    w: &mut Writer<'_>,
) -> Result<(), WireError> {
    let start = w.pos;
    let res = encode_ack_inner(ack_delay_us, window, ranges, w);
    if res.is_err() {
        w.pos = start;
    }
    res
}

fn encode_ack_inner(
    ack_delay_us: u64,
    window: u64,
    ranges: &[(u64, u64)],
    w: &mut Writer<'_>,
) -> Result<(), WireError> {
    let ranges = &ranges[..ranges.len().min(MAX_ACK_RANGES)];
    let Some(&(first_low, largest)) = ranges.first() else {
        return Err(WireError::BadAck);
    };
    w.u8(frame_type::ACK)?;
    w.varint(largest)?;
    w.varint(ack_delay_us.min(MAX_VARINT))?;
    w.varint(window.min(MAX_VARINT))?;
    w.varint(ranges.len() as u64 - 1)?;
    w.varint(largest.checked_sub(first_low).ok_or(WireError::BadAck)?)?;
    let mut prev_low = first_low;
    for &(low, high) in &ranges[1..] {
        let gap = prev_low
            .checked_sub(high)
            .and_then(|v| v.checked_sub(2))
            .ok_or(WireError::BadAck)?;
        w.varint(gap)?;
        w.varint(high.checked_sub(low).ok_or(WireError::BadAck)?)?;
        prev_low = low;
    }
    Ok(())
}

/// Encoded size of an ACK frame for these ranges (same contract as [`encode_ack`]).
pub fn ack_len(ack_delay_us: u64, window: u64, ranges: &[(u64, u64)]) -> usize {
    let ranges = &ranges[..ranges.len().min(MAX_ACK_RANGES)];
    let Some(&(first_low, largest)) = ranges.first() else {
        return 0;
    };
    let mut n = 1
        + varint_len(largest)
        + varint_len(ack_delay_us.min(MAX_VARINT))
        + varint_len(window.min(MAX_VARINT))
        + varint_len(ranges.len() as u64 - 1)
        + varint_len(largest.saturating_sub(first_low));
    let mut prev_low = first_low;
    for &(low, high) in &ranges[1..] {
        n += varint_len(prev_low.saturating_sub(high).saturating_sub(2));
        n += varint_len(high.saturating_sub(low));
        prev_low = low;
    }
    n
}

#[cfg(test)]
mod tests;
