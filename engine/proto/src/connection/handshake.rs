//! The handshake room: the client's hello and cookie echo (with their retransmission), the
//! server connection's accept and the application's accept hook, and what a connect token
//! gives a connection (its keys, the reset token, the next server to try). The cookie itself is
//! minted and checked by the endpoint (`endpoint/handshake.rs`): a server connection only
//! exists once the client proved its address.
//!
//! This room's state (`Handshake`, `Accept`, `Secure`) is defined in `state.rs`, beside the
//! `Connection` that holds it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::state::{Connection, ConnectionState, Side};
use crate::token::NONCE_LEN;
use crate::wire::{Packet, TokenSection, COOKIE_LEN, SEALED_ACCEPT_BODY_LEN};
use crate::{CloseReason, ConnectionId, DropCause, Event, Transmit};

use bytes::Bytes;

use crate::admission::{tags_equal, HandshakeKeys, Peer};
use crate::protect::Protection;
use crate::wire::{self, HANDSHAKE_TAG_LEN, SEALED_ACCEPT_LEN};
use crate::SessionKeys;

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

impl Connection {
    /// The application accepted the client it was asked about.
    pub(crate) fn accept_by_application(&mut self) {
        if !self.accept.awaiting_app || self.state != ConnectionState::Handshaking {
            return;
        }
        self.accept.awaiting_app = false;
        self.state = ConnectionState::Established;
        self.accept.pending = true;
        self.events.push_back(Event::Connected);
    }

    /// True while a server connection waits for the application's accept or refusal.
    pub(crate) fn awaiting_application(&self) -> bool {
        self.accept.awaiting_app && self.state == ConnectionState::Handshaking
    }

    /// The handshake's keys, in token mode.
    pub(crate) fn handshake_keys(&self) -> Option<&HandshakeKeys> {
        self.hs.secure.as_ref().map(|s| &s.hk)
    }

    /// The stateless reset token the server gave this client connection (token mode, once
    /// established).
    pub(crate) fn reset_token(&self) -> Option<&[u8; HANDSHAKE_TAG_LEN]> {
        self.hs.secure.as_ref()?.reset_token.as_ref()
    }

    /// The connect token's session keys (`None` without a token). The session's packet keys
    /// are derived from them and bound to the session: its connection ids and the server's
    /// random value.
    pub fn session_keys(&self) -> Option<&SessionKeys> {
        self.hs.secure.as_ref().map(|s| &s.keys)
    }

    /// Server side: who the client is (address at the handshake, and in token mode its client
    /// id and user data).
    pub fn peer(&self) -> Option<&Peer> {
        self.hs.peer.as_ref()
    }

    /// The client nonce of this connection's handshake.
    pub fn nonce(&self) -> u64 {
        self.hs.nonce
    }

    /// The client's handshake completed: the server's id is `server_cid`, at `from`.
    pub(super) fn established(&mut self, now: Instant, from: SocketAddr, server_cid: ConnectionId) {
        self.path.remote_cid = server_cid;
        self.state = ConnectionState::Established;
        self.activity.last_recv = now;
        self.path.remote = from;
        self.events.push_back(Event::Connected);
    }

    /// Client with a token: start over with the token's next server address, if any.
    pub(super) fn try_next_server(&mut self, now: Instant) -> bool {
        let Some((token, next)) = self.hs.secure.as_mut().and_then(|s| s.token.as_deref_mut())
        else {
            return false;
        };
        let Some(&addr) = token.server_addresses.get(*next) else {
            return false;
        };
        *next += 1;
        self.path.remote = addr;
        self.hs.cookie = None;
        // Nothing of the attempt before carries over into the next: no packet keys or replay
        // state (there are none before an accept; the next server's accept brings its own).
        self.protection = None;
        self.hs.resend_at = now;
        self.hs.interval = self.cfg.handshake_retry;
        self.hs.deadline = now + self.cfg.handshake_timeout;
        true
    }

    /// Client with a token: whether `from` is one of the token's server addresses this
    /// handshake has moved on from (and not the one it talks to now).
    pub(super) fn left_server(&self, from: SocketAddr) -> bool {
        let Some((token, next)) = self.hs.secure.as_ref().and_then(|s| s.token.as_deref()) else {
            return false;
        };
        // `next` is the address after the current one.
        let left =
            &token.server_addresses[..next.saturating_sub(1).min(token.server_addresses.len())];
        from != self.path.remote && left.contains(&from)
    }

    pub(super) fn transmit_handshake(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if self.side != Side::Client || now < self.hs.resend_at {
            return None;
        }
        let (ty, timestamp, cookie) = match self.hs.cookie {
            None => (wire::PacketType::ClientHello, 0, [0u8; COOKIE_LEN]),
            Some((t, c)) => (wire::PacketType::ClientCookieEcho, t, c),
        };
        let token = self.hs.secure.as_ref().and_then(|s| {
            let (token, _) = s.token.as_deref()?;
            let tag = token.sealed.tag();
            Some(TokenSection {
                protocol_id: token.protocol_id,
                expires_unix: token.expires_unix,
                nonce: &token.sealed.nonce,
                sealed: &token.sealed.bytes,
                proof: s.hk.proof(
                    ty,
                    self.path.local_cid,
                    self.hs.nonce,
                    timestamp,
                    &cookie,
                    &tag,
                ),
            })
        });
        let p = match self.hs.cookie {
            None => Packet::ClientHello {
                client_cid: self.path.local_cid,
                nonce: self.hs.nonce,
                token,
            },
            Some(_) => Packet::ClientCookieEcho {
                client_cid: self.path.local_cid,
                nonce: self.hs.nonce,
                timestamp,
                cookie,
                token,
            },
        };
        let size = wire::encode_packet(&p, buf).ok()?;
        self.hs.resend_at = now + self.hs.interval;
        self.hs.interval = (self.hs.interval * 2).min(Duration::from_secs(2));
        Some(Transmit {
            destination: self.path.remote,
            size,
        })
    }
}

impl Connection {
    /// A handshake packet (anything but a connection packet) for this connection.
    pub(super) fn on_handshake_packet(
        &mut self,
        now: Instant,
        from: SocketAddr,
        packet: Packet<'_>,
    ) -> Result<(), DropCause> {
        match packet {
            // Connection packets went to `receive_protected` above.
            Packet::Data { .. } | Packet::FecData { .. } | Packet::FecParity { .. } => {
                Err(DropCause::Malformed)
            }
            Packet::ServerChallenge {
                client_cid,
                nonce,
                timestamp,
                cookie,
                tag,
            } => self.on_challenge(now, client_cid, nonce, timestamp, cookie, tag),
            Packet::ServerAccept {
                client_cid,
                server_cid,
            } => {
                if self.side != Side::Client
                    || self.state != ConnectionState::Handshaking
                    || client_cid != self.path.local_cid
                    || self.hs.cookie.is_none()
                {
                    return Err(DropCause::UnexpectedHandshake);
                }
                if self.hs.secure.is_some() {
                    // A client with a token only believes a sealed accept.
                    return Err(DropCause::Unauthenticated);
                }
                self.established(now, from, server_cid);
                Ok(())
            }
            Packet::SealedAccept {
                client_cid,
                nonce,
                sealed,
            } => self.on_sealed_accept(now, from, client_cid, nonce, sealed),
            Packet::Refuse {
                client_cid,
                reason,
                message,
                tag,
            } => self.on_refuse(now, client_cid, reason, message, tag),
            Packet::StatelessReset { cid, token } => {
                if self.side != Side::Client
                    || self.state == ConnectionState::Handshaking
                    || cid != self.path.remote_cid
                {
                    return Err(DropCause::UnknownConnection);
                }
                if !self.reset_token().is_some_and(|t| tags_equal(t, &token)) {
                    return Err(DropCause::Unauthenticated);
                }
                // The server has no state for us: nothing to tell it, no close to send.
                self.finish(CloseReason::Reset, true);
                self.close.sends_left = 0;
                Ok(())
            }
            Packet::ClientCookieEcho { client_cid, .. } => {
                // The client did not get our accept: send it again (one reply per echo).
                if self.side != Side::Server || client_cid != self.path.remote_cid {
                    return Err(DropCause::UnexpectedHandshake);
                }
                if !self.accept.awaiting_app {
                    self.accept.pending = true;
                }
                Ok(())
            }
            Packet::ClientHello { .. } => Err(DropCause::UnexpectedHandshake),
        }
    }

    /// Client: the server's challenge (its cookie to echo).
    fn on_challenge(
        &mut self,
        now: Instant,
        client_cid: ConnectionId,
        nonce: u64,
        timestamp: u64,
        cookie: [u8; COOKIE_LEN],
        tag: Option<[u8; HANDSHAKE_TAG_LEN]>,
    ) -> Result<(), DropCause> {
        if self.side != Side::Client
            || self.state != ConnectionState::Handshaking
            || client_cid != self.path.local_cid
            || nonce != self.hs.nonce
        {
            return Err(DropCause::UnexpectedHandshake);
        }
        if let Some(s) = &self.hs.secure {
            let expect = s.hk.challenge_tag(client_cid, nonce, timestamp, &cookie);
            if !tag.is_some_and(|t| tags_equal(&t, &expect)) {
                return Err(DropCause::Unauthenticated);
            }
        }
        // A challenge other than the one held replaces it: the server renews a cookie that
        // expired before its echo arrived (a loaded host), and an echo of the stale one
        // would never be taken. A late answer to an earlier hello replaces it too, at the
        // cost of one more echo (each hello is answered once).
        if self.hs.cookie != Some((timestamp, cookie)) {
            self.hs.cookie = Some((timestamp, cookie));
            self.hs.resend_at = now;
            self.hs.interval = self.cfg.handshake_retry;
        }
        Ok(())
    }

    /// Client with a token: the server's sealed accept (its id, the reset token, the server
    /// random its packet keys are bound to).
    fn on_sealed_accept(
        &mut self,
        now: Instant,
        from: SocketAddr,
        client_cid: ConnectionId,
        nonce: &[u8; NONCE_LEN],
        sealed: &[u8; SEALED_ACCEPT_BODY_LEN],
    ) -> Result<(), DropCause> {
        if self.side != Side::Client
            || self.state != ConnectionState::Handshaking
            || client_cid != self.path.local_cid
            || self.hs.cookie.is_none()
        {
            return Err(DropCause::UnexpectedHandshake);
        }
        let Some(s) = self.hs.secure.as_mut() else {
            return Err(DropCause::UnexpectedHandshake);
        };
        let Some((server_cid, reset)) = s.hk.open_accept(nonce, client_cid, sealed) else {
            return Err(DropCause::Unauthenticated);
        };
        s.reset_token = Some(reset);
        // This session's packet keys: the token's, bound to both ids and the server
        // random (the accept's nonce, authenticated by its tag), as the server bound
        // them when it opened the session.
        let keys = s.keys.for_session(client_cid, server_cid, nonce);
        self.protection = Some(Box::new(Protection::new(&keys, true)));
        self.established(now, from, server_cid);
        Ok(())
    }

    /// Client: the server refused (try the token's next server, or end).
    fn on_refuse(
        &mut self,
        now: Instant,
        client_cid: ConnectionId,
        reason: CloseReason,
        message: &[u8],
        tag: Option<[u8; HANDSHAKE_TAG_LEN]>,
    ) -> Result<(), DropCause> {
        if self.side != Side::Client
            || self.state != ConnectionState::Handshaking
            || client_cid != self.path.local_cid
        {
            return Err(DropCause::UnexpectedHandshake);
        }
        if let Some(s) = &self.hs.secure {
            // Believe a refusal the server tagged, or an untagged one only for what a
            // server says before it opened the token.
            let ok = match tag {
                Some(t) => tags_equal(
                    &t,
                    &s.hk.refuse_tag(client_cid, self.hs.nonce, reason, message),
                ),
                None => reason.refused_before_token(),
            };
            if !ok {
                return Err(DropCause::Unauthenticated);
            }
        }
        // A server shutting down or draining (`Endpoint::stop_accepting`, `start_draining`: a
        // rolling restart) says nothing of the others the token lists.
        let next_server = matches!(
            reason,
            CloseReason::ServerFull
                | CloseReason::TooManyFromAddress
                | CloseReason::TokenWrongServer
                | CloseReason::Shutdown
                | CloseReason::Draining
        );
        if next_server && self.try_next_server(now) {
            return Ok(());
        }
        self.hs.refusal_message = Bytes::copy_from_slice(message);
        self.finish(reason, true);
        Ok(())
    }
}

impl Connection {
    /// Server: the accept (again), pre-encoded by the endpoint or a plain one.
    pub(super) fn transmit_accept(&mut self, buf: &mut [u8]) -> Option<Transmit> {
        self.accept.pending = false;
        let size = match &self.hs.accept_packet {
            Some(a) => {
                let (bytes, n) = (&a.0, a.1);
                buf.get_mut(..n)?.copy_from_slice(&bytes[..n]);
                n
            }
            None => {
                let p = Packet::ServerAccept {
                    client_cid: self.path.remote_cid,
                    server_cid: self.path.local_cid,
                };
                wire::encode_packet(&p, buf).ok()?
            }
        };
        Some(Transmit {
            destination: self.path.remote,
            size,
        })
    }
}
