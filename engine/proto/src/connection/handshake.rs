//! The handshake room: the client's hello and cookie echo (with their retransmission), the
//! server connection's accept and the application's accept hook, and what a connect token
//! gives a connection (its keys, the reset token, the next server to try). The cookie itself is
//! minted and checked by the endpoint (`endpoint.rs`, `admission.rs`): a server connection only
//! exists once the client proved its address.

use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::admission::{HandshakeKeys, Peer};
use crate::token::ConnectToken;
use crate::wire::{self, HANDSHAKE_TAG_LEN, SEALED_ACCEPT_LEN};
use crate::{Config, SessionKeys};

/// Handshake state of one connection (both sides; each side uses its part).
#[derive(Debug)]
pub(super) struct Handshake {
    // Client handshake.
    pub(super) nonce: u64,
    pub(super) cookie: Option<(u64, [u8; wire::COOKIE_LEN])>,
    /// When the hello or cookie echo goes out again.
    pub(super) resend_at: Instant,
    /// The wait before the next resend (doubles, up to 2 s).
    pub(super) interval: Duration,
    /// When the attempt (with this server) gives up.
    pub(super) deadline: Instant,
    // Server handshake (its two flags are `Connection::accept`, an [`Accept`]).
    /// The accept to (re)send, pre-encoded by the endpoint (`None`: encode a plain one).
    pub(super) accept_packet: Option<Box<([u8; SEALED_ACCEPT_LEN], usize)>>,
    /// Server: who the client is.
    pub(super) peer: Option<Peer>,
    /// Token mode: keys and reset token.
    pub(super) secure: Option<Box<Secure>>,
    /// Client: the message of an application refusal (moves into `Event::Closed`).
    pub(super) refusal_message: Bytes,
}

impl Handshake {
    pub(super) fn new(cfg: &Config, now: Instant) -> Self {
        Self {
            nonce: 0,
            cookie: None,
            resend_at: now,
            interval: cfg.handshake_retry,
            deadline: now + cfg.handshake_timeout,
            accept_packet: None,
            peer: None,
            secure: None,
            refusal_message: Bytes::new(),
        }
    }
}

/// A server connection's accept: whether it is due, or waits for the application. Held by
/// the connection beside its other one-byte fields (they pack into one word; in [`Handshake`]
/// they would each take one more).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Accept {
    /// Send the accept (again) with the next `poll_transmit`.
    pub(super) pending: bool,
    /// Waiting for the application to accept or refuse.
    pub(super) awaiting_app: bool,
}

/// What a token handshake gives a connection.
#[derive(Debug)]
pub(super) struct Secure {
    /// The connect token's session keys. The packet keys derive from them and from what makes
    /// the session unique ([`SessionKeys::for_session`]): the server's when it opens the
    /// session, the client's when it opens the sealed accept.
    pub(super) keys: SessionKeys,
    /// The handshake's keys (derived from `keys`).
    pub(super) hk: HandshakeKeys,
    /// Client: the reset token the server's sealed accept carried.
    pub(super) reset_token: Option<[u8; HANDSHAKE_TAG_LEN]>,
    /// Client: the token it presents, and the next of its server addresses to try. Boxed:
    /// a server's sessions (the many) never hold one, and inline it would be most of this
    /// struct.
    pub(super) token: Option<Box<(ConnectToken, usize)>>,
}

/// What the endpoint decided for a server connection (see `Connection::server_admitted`).
#[derive(Debug)]
pub(crate) struct ServerAdmit {
    /// The client's hello nonce.
    pub(crate) nonce: u64,
    /// The accept packet, encoded once (sealed with a token), re-sent as is.
    pub(crate) accept: [u8; SEALED_ACCEPT_LEN],
    /// Its length.
    pub(crate) accept_len: usize,
    /// Who the client is.
    pub(crate) peer: Peer,
    /// With a token: its keys and the handshake keys.
    pub(crate) secure: Option<(SessionKeys, HandshakeKeys)>,
    /// The session's packet keys: with a token, its keys bound to this session
    /// ([`SessionKeys::for_session`]); without, the test path's, if any
    /// ([`crate::EndpointConfig::test_session_secret`]).
    pub(crate) keys: Option<SessionKeys>,
    /// Wait for the application's accept or refusal.
    pub(crate) hook: bool,
}
