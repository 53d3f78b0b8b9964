//! The listening side's handshake: the stateless cookie (a hello is answered with a challenge
//! whose cookie proves the client's address when it comes back in the cookie echo), token
//! admission, the session limits and the per-address handshake budget, the accept (and the
//! application's accept hook) and the refusals. Nothing is kept for a client until its echo
//! opens a session.

use std::hash::{Hash, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::Rng;

use super::config::ListenConfig;
use super::state::{Bound, ConnectionHandle, Endpoint};
use crate::admission::{
    tags_equal, HandshakeKeys, LedgerRefusal, Peer, Recorded, Refusal, TokenLedger,
};
use crate::connection::ServerAdmit;
use crate::token::{PrivateToken, SealedToken, TokenKey, NONCE_LEN, TAG_LEN};
use crate::wire::{self, Packet, TokenSection, COOKIE_LEN, HANDSHAKE_TAG_LEN};
use crate::{CloseReason, Connection, ConnectionId, DropCause, SessionKeys};

/// A token that passed every stateless check, with what the session needs from it.
struct Admitted {
    private: PrivateToken,
    tag: [u8; TAG_LEN],
    expires_unix: u64,
    hk: HandshakeKeys,
}

/// The fields of a cookie echo.
struct Echo<'a> {
    client_cid: ConnectionId,
    nonce: u64,
    timestamp: u64,
    cookie: [u8; COOKIE_LEN],
    token: Option<TokenSection<'a>>,
}

/// Why a hello or echo was not taken further.
enum Verdict {
    /// Dropped silently, counted under this cause.
    Drop(DropCause),
    /// Answered with a refusal; tagged when the token opened.
    Refuse(CloseReason, Option<HandshakeKeys>),
}

const RATE_SLOTS: usize = 4096;

/// Bits of the cookie "timestamp" (the opaque u64 a challenge carries and the client echoes)
/// that hold the milliseconds; the 16 above them carry the router's route.
const COOKIE_MS_BITS: u32 = 48;

impl Endpoint {
    /// Tell the endpoint the wall-clock time: `unix` since the Unix epoch at `now`. A server
    /// that admits clients by token needs it to check token expiry (until it is set, token
    /// handshakes are dropped, counted as [`DropCause::NoClock`]); later times are `unix`
    /// plus the `Instant`s passed since. Call it again now and then (say, once a minute) to
    /// follow adjustments of the wall clock.
    pub fn set_unix_time(&mut self, now: Instant, unix: Duration) {
        self.unix_anchor = Some((now, unix.as_millis() as u64));
    }

    /// Share `ledger` as this endpoint's table of used tokens (the endpoints of one server's
    /// workers share one, so a token is accepted once whichever worker it reaches). Call it
    /// before the first handshake.
    pub fn set_token_ledger(&mut self, ledger: Box<dyn TokenLedger>) {
        self.ledger = ledger;
    }

    fn unix_now(&self, now: Instant) -> Option<u64> {
        let (at, ms) = self.unix_anchor?;
        let since = now.saturating_duration_since(at).as_millis() as u64;
        Some((ms + since) / 1000)
    }

    /// Verify and issue cookies with `secret`, counting milliseconds from `base`.
    ///
    /// The endpoints of one server's workers share both, so a cookie echo that reaches another
    /// worker than the one that issued the challenge is still accepted. Keys rotate as before:
    /// each [`ListenConfig::key_rotation`] period derives its own key from the secret, and the
    /// previous period's key stays valid for one more period.
    pub fn set_cookie_secret(&mut self, base: Instant, secret: [u8; 32]) {
        self.base = base;
        self.cookie_secret = secret;
        self.epoch_keys = [None; 2];
    }

    /// Accept a client the endpoint reported with [`Event::Incoming`](crate::Event::Incoming) (with
    /// [`ListenConfig::accept_hook`]): it learns it is in, and
    /// [`Event::Connected`](crate::Event::Connected) follows.
    pub fn accept(&mut self, h: ConnectionHandle) {
        if let Some(idx) = self.index_of(h) {
            if let Some(c) = self.slots[idx as usize].conn.as_mut() {
                c.accept_by_application();
            }
            self.touch(idx);
        }
    }

    /// Refuse a client the endpoint reported with [`Event::Incoming`](crate::Event::Incoming): the
    /// client receives [`CloseReason::Rejected`] with the refusal's code and message, and the
    /// handle is released at once (no further events). Its token stays used.
    pub fn refuse(&mut self, h: ConnectionHandle, refusal: &Refusal) {
        let Some(idx) = self.index_of(h) else {
            return;
        };
        let Some(c) = self.slots[idx as usize].conn.as_mut() else {
            return;
        };
        if !c.awaiting_application() {
            return;
        }
        let (to, client_cid, nonce) = (c.remote_addr(), c.remote_cid(), c.nonce());
        let hk = c.handshake_keys().cloned();
        c.discard();
        self.refuse_with(
            to,
            client_cid,
            nonce,
            refusal.reason(),
            refusal.wire_message(),
            hk.as_ref(),
        );
        self.stats.rejected += 1;
        self.touch(idx);
    }

    /// Token admission: seal-check new tokens with `key` from now on; with `previous`, tokens
    /// sealed with that key are still accepted until its instant (the overlap of a key
    /// rotation), then refused as [`CloseReason::TokenInvalid`]. Sessions already open keep
    /// their keys. Does nothing on an endpoint without token admission.
    pub fn set_token_keys(&mut self, key: TokenKey, previous: Option<(TokenKey, Instant)>) {
        if let Some(ts) = self.tokens.as_mut() {
            ts.key = key;
            ts.previous = previous;
        }
    }

    /// Token admission: the addresses clients reach this server at (a token must list one).
    /// Does nothing on an endpoint without token admission.
    pub fn set_public_addresses(&mut self, addresses: Vec<SocketAddr>) {
        if let Some(ts) = self.tokens.as_mut() {
            ts.public_addresses = addresses;
        }
    }

    /// From now on, refuse every client that completes a handshake with
    /// [`CloseReason::Shutdown`], for a server that is shutting down: such a client learns why
    /// at once, instead of getting a session that the shutdown would never close. Sessions
    /// already open are not touched (close them with [`Self::close`]).
    pub fn stop_accepting(&mut self) {
        self.stopped_accepting = Some(CloseReason::Shutdown);
    }

    /// From now on, refuse every client that completes a handshake with
    /// [`CloseReason::Draining`], for a server that keeps its sessions until they end but
    /// admits no one new (a rolling update, a scale-down): a token client moves on to the next
    /// server its token lists. A later [`Self::stop_accepting`] turns the reason to `Shutdown`.
    pub fn start_draining(&mut self) {
        if self.stopped_accepting.is_none() {
            self.stopped_accepting = Some(CloseReason::Draining);
        }
    }

    /// A client hello or cookie echo: decoded, then answered by [`Self::on_hello`] or
    /// [`Self::on_echo`].
    pub(super) fn handle_hello(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
    ) -> Result<(), DropCause> {
        if self.cfg.server.is_none() {
            return Err(DropCause::NotListening);
        }
        if datagram.len() < wire::MIN_CLIENT_HELLO_LEN {
            return Err(DropCause::Malformed);
        }
        let packet = match wire::decode_packet(datagram) {
            Ok(p) => p,
            Err(wire::WireError::VersionMismatch(_)) => {
                // The client cid sits at the same offset in every version: tell it why.
                if let Some(cid) = wire::peek_cid(datagram) {
                    self.refuse_with(from, cid, 0, CloseReason::VersionMismatch, &[], None);
                }
                return Err(DropCause::VersionMismatch);
            }
            Err(_) => return Err(DropCause::Malformed),
        };
        match packet {
            Packet::ClientHello {
                client_cid,
                nonce,
                token,
            } => self.on_hello(now, from, client_cid, nonce, token),
            Packet::ClientCookieEcho {
                client_cid,
                nonce,
                timestamp,
                cookie,
                token,
            } => {
                let echo = Echo {
                    client_cid,
                    nonce,
                    timestamp,
                    cookie,
                    token,
                };
                self.on_echo(now, from, datagram, echo)
            }
            _ => Err(DropCause::Malformed),
        }
    }

    /// The listening side's settings; `handle_hello` has checked there are some.
    fn listening(&self) -> Result<&ListenConfig, DropCause> {
        self.cfg.server.as_ref().ok_or(DropCause::NotListening)
    }

    /// A hello: its token's stateless checks, then a challenge whose cookie proves the
    /// client's address when it comes back, and names the route the router chose.
    fn on_hello(
        &mut self,
        now: Instant,
        from: SocketAddr,
        client_cid: ConnectionId,
        nonce: u64,
        token: Option<TokenSection<'_>>,
    ) -> Result<(), DropCause> {
        let period = Self::key_period(self.listening()?);
        let now_ms = self.now_ms(now);
        let ty = wire::PacketType::ClientHello;
        let admitted = match self.admit(now, ty, client_cid, nonce, 0, &[0; COOKIE_LEN], token) {
            Ok(a) => a,
            Err(v) => return self.verdict(from, client_cid, nonce, v),
        };
        self.challenge(
            now_ms,
            period,
            from,
            client_cid,
            nonce,
            token,
            admitted.as_ref(),
        );
        Ok(())
    }

    /// Queues a challenge to `from`: a cookie stamped `now_ms` (and the route the router
    /// chose) for the client to echo, tagged with the token's keys when it has one.
    #[allow(clippy::too_many_arguments)]
    fn challenge(
        &mut self,
        now_ms: u64,
        period: u64,
        from: SocketAddr,
        client_cid: ConnectionId,
        nonce: u64,
        token: Option<TokenSection<'_>>,
        admitted: Option<&Admitted>,
    ) -> bool {
        let mut timestamp = now_ms & ((1 << COOKIE_MS_BITS) - 1);
        timestamp |= u64::from(self.router.route_new_session()) << COOKIE_MS_BITS;
        let key = self.epoch_key(now_ms / period);
        let tag = token.map_or([0; TAG_LEN], |t| token_tag(&t));
        let cookie = self.cookie(key, from, timestamp, nonce, client_cid, &tag);
        let reply = Packet::ServerChallenge {
            client_cid,
            nonce,
            timestamp,
            cookie,
            tag: admitted.map(|a| a.hk.challenge_tag(client_cid, nonce, timestamp, &cookie)),
        };
        let queued = self.queue_stateless(from, &reply);
        if queued {
            self.stats.challenges_sent += 1;
        }
        queued
    }

    /// A cookie echo: the cookie, a retransmitted echo of an open session, the token's
    /// stateless checks and the per-address budget, then [`Self::open_if_allowed`].
    fn on_echo(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
        echo: Echo<'_>,
    ) -> Result<(), DropCause> {
        let server = self.listening()?;
        let period = Self::key_period(server);
        let cookie_lifetime = server.cookie_lifetime.as_millis() as u64;
        let max_handshakes = server.max_handshakes_per_address;
        let Echo {
            client_cid,
            nonce,
            timestamp,
            cookie,
            token,
        } = echo;
        let now_ms = self.now_ms(now);
        // The cookie first: one keyed hash, and it proves the address before anything else
        // is spent on the echo. Its key lives two rotation periods, longer than the cookie.
        let issued_ms = timestamp & ((1 << COOKIE_MS_BITS) - 1);
        let expired = issued_ms <= now_ms && now_ms - issued_ms > cookie_lifetime;
        let tag = token.map_or([0; TAG_LEN], |t| token_tag(&t));
        let signed = issued_ms <= now_ms
            && self.key_for(issued_ms, now_ms, period).is_some_and(|k| {
                let expect = self.cookie(k, from, timestamp, nonce, client_cid, &tag);
                constant_time_eq(&expect, &cookie)
            });
        if signed {
            if let Some(&h) = self.by_client.get(&(from, client_cid)) {
                // A retransmitted echo: the existing connection re-sends its accept, also
                // when the cookie expired meanwhile (an accept lost, or read late by a busy
                // client, is sent again for as long as the client asks).
                if let Some(idx) = self.index_of(h) {
                    let r = self
                        .with_conn(idx, |c| c.handle_datagram(now, from, datagram))
                        .unwrap_or(Ok(()));
                    self.touch(idx);
                    return r;
                }
            }
        }
        let ty = wire::PacketType::ClientCookieEcho;
        if !signed {
            return Err(DropCause::BadCookie);
        }
        let admitted = match self.admit(now, ty, client_cid, nonce, timestamp, &cookie, token) {
            Ok(a) => a,
            Err(v) => return self.verdict(from, client_cid, nonce, v),
        };
        if expired {
            // The echo came too late (the client or the server was slow, or its first
            // echoes were lost): a fresh challenge, as its hello would get, instead of a
            // silent drop that leaves the client echoing the stale cookie until its
            // handshake times out. Stateless, after the same token checks as a hello, and
            // smaller than the echo. Only for a cookie this server signed (its key is held
            // two rotation periods, far longer than a handshake lasts): a forged one stays
            // `BadCookie`, so the count an operator watches for forgeries keeps them.
            let admitted = admitted.as_ref();
            if self.challenge(now_ms, period, from, client_cid, nonce, token, admitted) {
                self.stats.cookies_renewed += 1;
            }
            return Ok(());
        }
        // The per-address budget, now that the echo proved the address and (with a token)
        // the token's keys. It counts the sessions this echo's address opened, charged when
        // one opens: an echo that opens none (a refusal, a token already used, a copy of an
        // echo that opened one) spends nothing, so replays of one captured hello or echo
        // cannot spend a player's budget.
        if *self.handshakes_this_second(now, from.ip()) >= max_handshakes {
            return Err(DropCause::RateLimited);
        }
        self.open_if_allowed(now, from, client_cid, nonce, admitted)
    }

    /// An echo that passed every stateless check: refused when the server stops accepting,
    /// has no slot, or is at a session limit, or when its token was used; otherwise charged
    /// to its address's budget and opened.
    fn open_if_allowed(
        &mut self,
        now: Instant,
        from: SocketAddr,
        client_cid: ConnectionId,
        nonce: u64,
        admitted: Option<Admitted>,
    ) -> Result<(), DropCause> {
        let server = self.listening()?;
        let accept_hook = server.accept_hook;
        let hk = admitted.as_ref().map(|a| &a.hk);
        // Every slot of this endpoint taken is far beyond any default limit.
        let refused = if let Some(reason) = self.stopped_accepting {
            Some(reason)
        } else {
            (!self.slot_available()).then_some(CloseReason::ServerFull)
        };
        if let Some(reason) = refused {
            self.refuse_with(from, client_cid, nonce, reason, &[], hk);
            return Ok(());
        }
        let ip = from.ip();
        // The session limits: the router counts every session of the server (see
        // `Router::admit_session`).
        let verdict = match self.cfg.server.as_ref() {
            Some(limits) => self.router.admit_session(ip, limits),
            None => Err(CloseReason::ServerFull),
        };
        if let Err(reason) = verdict {
            self.refuse_with(from, client_cid, nonce, reason, &[], hk);
            return Ok(());
        }
        if let Some(a) = admitted.as_ref() {
            if let ControlFlow::Break(r) = self.record_token(now, from, client_cid, nonce, a) {
                return r;
            }
        }
        let opened = self.handshakes_this_second(now, from.ip());
        *opened = opened.saturating_add(1);
        self.open_session(now, from, client_cid, nonce, admitted, accept_hook);
        Ok(())
    }

    /// Records the token of an echo that would open a session in the used-token ledger:
    /// `Break` with the echo's outcome when the token was used (refused) or this client's
    /// own echo was admitted elsewhere (dropped); the router, which counted the session, then
    /// hears it will not open.
    fn record_token(
        &mut self,
        now: Instant,
        from: SocketAddr,
        client_cid: ConnectionId,
        nonce: u64,
        a: &Admitted,
    ) -> ControlFlow<Result<(), DropCause>> {
        let ip = from.ip();
        let now_unix = self.unix_now(now).unwrap_or(0);
        let claimant = claimant(from, client_cid);
        let recorded = self
            .ledger
            .record(&a.tag, a.expires_unix, now_unix, claimant);
        if recorded == Err(LedgerRefusal::Duplicate) {
            // This client's own echo, admitted by another endpoint of the server, which
            // answers it: no refusal that would end its handshake.
            self.router.release_session(ip);
            return ControlFlow::Break(Err(DropCause::Duplicate));
        }
        if recorded == Ok(Recorded::Evicted) {
            self.stats.tokens_evicted += 1;
        }
        let reason = match recorded {
            Ok(_) | Err(LedgerRefusal::Duplicate) => None,
            Err(LedgerRefusal::Used) => Some(CloseReason::TokenReused),
            Err(LedgerRefusal::Full) => Some(CloseReason::ServerFull),
        };
        if let Some(reason) = reason {
            if reason == CloseReason::TokenReused {
                self.stats.token_refusals += 1;
            }
            // The router counted the session it will not get.
            self.router.release_session(ip);
            self.refuse_with(from, client_cid, nonce, reason, &[], Some(&a.hk));
            return ControlFlow::Break(Ok(()));
        }
        ControlFlow::Continue(())
    }

    /// Every stateless check of a hello's or echo's token: `Ok(None)` in insecure mode (and
    /// no token), `Ok(Some)` with the opened token in token mode.
    #[allow(clippy::too_many_arguments)]
    fn admit(
        &mut self,
        now: Instant,
        ty: wire::PacketType,
        client_cid: ConnectionId,
        nonce: u64,
        timestamp: u64,
        cookie: &[u8; COOKIE_LEN],
        token: Option<TokenSection<'_>>,
    ) -> Result<Option<Admitted>, Verdict> {
        let Some(ts) = self.tokens.as_ref() else {
            return match token {
                Some(_) => Err(Verdict::Refuse(CloseReason::InsecureServer, None)),
                None => Ok(None),
            };
        };
        let Some(t) = token else {
            return Err(Verdict::Refuse(CloseReason::TokenRequired, None));
        };
        if t.protocol_id != ts.protocol_id {
            return Err(Verdict::Refuse(CloseReason::TokenInvalid, None));
        }
        let Some(now_unix) = self.unix_now(now) else {
            return Err(Verdict::Drop(DropCause::NoClock));
        };
        let sealed = SealedToken {
            nonce: *t.nonce,
            bytes: *t.sealed,
        };
        let unseal = |key| PrivateToken::unseal(key, t.protocol_id, t.expires_unix, &sealed);
        let opened = unseal(&ts.key).or_else(|e| match &ts.previous {
            Some((old, until)) if now < *until => unseal(old),
            _ => Err(e),
        });
        let Ok(private) = opened else {
            return Err(Verdict::Refuse(CloseReason::TokenInvalid, None));
        };
        let tag = sealed.tag();
        let hk = HandshakeKeys::new(&private.keys);
        let proof = hk.proof(ty, client_cid, nonce, timestamp, cookie, &tag);
        if !tags_equal(&proof, &t.proof) {
            return Err(Verdict::Drop(DropCause::Unauthenticated));
        }
        if now_unix >= t.expires_unix {
            return Err(Verdict::Refuse(CloseReason::TokenExpired, Some(hk)));
        }
        if !ts.public_addresses.iter().any(|&a| private.lists(a)) {
            return Err(Verdict::Refuse(CloseReason::TokenWrongServer, Some(hk)));
        }
        // Whether the token was used is asked of the used-token table (shared by the
        // workers, behind a lock) only when an echo is about to open a session (`record`):
        // a hello, which anyone who saw one can replay from any address, costs no lock, and
        // a client whose token was used learns it from its echo, one round trip later.
        Ok(Some(Admitted {
            private,
            tag,
            expires_unix: t.expires_unix,
            hk,
        }))
    }

    fn verdict(
        &mut self,
        from: SocketAddr,
        client_cid: ConnectionId,
        nonce: u64,
        v: Verdict,
    ) -> Result<(), DropCause> {
        match v {
            Verdict::Drop(cause) => Err(cause),
            Verdict::Refuse(reason, hk) => {
                self.stats.token_refusals += 1;
                self.refuse_with(from, client_cid, nonce, reason, &[], hk.as_ref());
                Ok(())
            }
        }
    }

    /// Create the server connection of a client that passed every check.
    fn open_session(
        &mut self,
        now: Instant,
        from: SocketAddr,
        client_cid: ConnectionId,
        nonce: u64,
        admitted: Option<Admitted>,
        accept_hook: bool,
    ) {
        let Some((idx, cid)) = self.alloc() else {
            // The admission checks found a slot free; nothing else takes one in between.
            debug_assert!(false, "no slot for an admitted session");
            return;
        };
        let mut accept = [0u8; wire::SEALED_ACCEPT_LEN];
        let (accept_len, peer, secure) = match admitted {
            Some(a) => {
                let reset = self
                    .tokens
                    .as_ref()
                    .and_then(|t| t.reset.as_ref())
                    .map_or([0; HANDSHAKE_TAG_LEN], |r| r.token(cid));
                // The server random of this session: it seals the accept, and the session's
                // packet keys are bound to it and to both connection ids.
                let seal_nonce: [u8; NONCE_LEN] = self.rng.random();
                let sealed = a.hk.seal_accept(&seal_nonce, client_cid, cid, &reset);
                let p = Packet::SealedAccept {
                    client_cid,
                    nonce: &seal_nonce,
                    sealed: &sealed,
                };
                let n = wire::encode_packet(&p, &mut accept).unwrap_or(0);
                let peer = Peer {
                    address: from,
                    client_id: Some(a.private.client_id),
                    user_data: a.private.user_data,
                };
                let keys = a.private.keys.for_session(client_cid, cid, &seal_nonce);
                (n, peer, Some((a.private.keys, a.hk, keys)))
            }
            None => {
                let p = Packet::ServerAccept {
                    client_cid,
                    server_cid: cid,
                };
                let n = wire::encode_packet(&p, &mut accept).unwrap_or(0);
                let peer = Peer {
                    address: from,
                    client_id: None,
                    user_data: Bytes::new(),
                };
                (n, peer, None)
            }
        };
        let mut conn = Connection::server_admitted(
            self.cfg.connection.clone(),
            cid,
            client_cid,
            from,
            now,
            ServerAdmit {
                nonce,
                accept,
                accept_len,
                peer,
                keys: match &secure {
                    Some((_, _, packet)) => Some(packet.clone()),
                    None => self
                        .cfg
                        .test_session_secret
                        .map(|s| SessionKeys::test_path(&s, client_cid, nonce)),
                },
                secure: secure.map(|(keys, hk, _)| (keys, hk)),
                hook: accept_hook,
            },
        );
        conn.set_budget_limits(self.cfg.reassembly_budget, self.cfg.fec_retention_budget);
        let slot = &mut self.slots[idx as usize];
        slot.conn = Some(conn);
        slot.bound = Bound::Accepted(from, client_cid);
        self.by_client
            .insert((from, client_cid), ConnectionHandle(cid.0));
        self.router.session_opened();
        self.stats.connections += 1;
        self.stats.accepted += 1;
        self.touch(idx);
    }

    fn refuse_with(
        &mut self,
        to: SocketAddr,
        client_cid: ConnectionId,
        nonce: u64,
        reason: CloseReason,
        message: &[u8],
        hk: Option<&HandshakeKeys>,
    ) {
        let p = Packet::Refuse {
            client_cid,
            reason,
            message,
            tag: hk.map(|k| k.refuse_tag(client_cid, nonce, reason, message)),
        };
        if self.queue_stateless(to, &p) {
            self.stats.refusals_sent += 1;
        }
    }

    /// The key that signs cookies stamped `issued_ms`, if its period is the current one (at
    /// `now_ms`) or the one before.
    fn key_for(&mut self, issued_ms: u64, now_ms: u64, period: u64) -> Option<[u8; 32]> {
        let (e, current) = (issued_ms / period, now_ms / period);
        (e == current || e + 1 == current).then(|| self.epoch_key(e))
    }

    fn key_period(server: &ListenConfig) -> u64 {
        server.key_rotation.as_millis().max(1) as u64
    }

    /// The cookie key of rotation period `e`, derived from the secret once per period.
    fn epoch_key(&mut self, e: u64) -> [u8; 32] {
        if let Some((_, k)) = self.epoch_keys.iter().flatten().find(|(pe, _)| *pe == e) {
            return *k;
        }
        let mut ctx = [0u8; 24];
        ctx[..16].copy_from_slice(b"ricochet cookie ");
        ctx[16..].copy_from_slice(&e.to_be_bytes());
        let key = *blake3::keyed_hash(&self.cookie_secret, &ctx).as_bytes();
        // Replace the empty or older slot; the newer of the two stays for the previous period.
        let slot = match self.epoch_keys {
            [None, _] => 0,
            [_, None] => 1,
            [Some((a, _)), Some((b, _))] => usize::from(b < a),
        };
        self.epoch_keys[slot] = Some((e, key));
        key
    }

    /// The cookie: proves the client receives at `addr`, and binds the hello's fields and its
    /// token (by tag; zero without one), so the echo cannot swap in another token.
    fn cookie(
        &self,
        key: [u8; 32],
        addr: SocketAddr,
        ts: u64,
        nonce: u64,
        cid: ConnectionId,
        token_tag: &[u8; TAG_LEN],
    ) -> [u8; COOKIE_LEN] {
        let mut msg = [0u8; 16 + 2 + 8 + 8 + 8 + TAG_LEN];
        let ip = match addr.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        };
        msg[..16].copy_from_slice(&ip);
        msg[16..18].copy_from_slice(&addr.port().to_be_bytes());
        msg[18..26].copy_from_slice(&ts.to_be_bytes());
        msg[26..34].copy_from_slice(&nonce.to_be_bytes());
        msg[34..42].copy_from_slice(&cid.0.to_be_bytes());
        msg[42..].copy_from_slice(token_tag);
        let h = blake3::keyed_hash(&key, &msg);
        let mut out = [0u8; COOKIE_LEN];
        out.copy_from_slice(&h.as_bytes()[..COOKIE_LEN]);
        out
    }

    /// Sessions opened for `ip` in the current second (its counter in the fixed-size table).
    fn handshakes_this_second(&mut self, now: Instant, ip: IpAddr) -> &mut u32 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.rate_salt.hash(&mut h);
        ip.hash(&mut h);
        let i = (h.finish() as usize) % RATE_SLOTS;
        let second = self.now_ms(now) / 1000;
        if self.rate.is_empty() {
            self.rate = vec![(0, 0); RATE_SLOTS].into_boxed_slice();
        }
        let e = &mut self.rate[i];
        if e.0 != second {
            *e = (second, 0);
        }
        &mut e.1
    }
}

/// The tag of the sealed token in a token section (the token's identity).
fn token_tag(t: &TokenSection<'_>) -> [u8; TAG_LEN] {
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(&t.sealed[crate::token::PRIVATE_LEN..]);
    tag
}

fn constant_time_eq(a: &[u8; COOKIE_LEN], b: &[u8; COOKIE_LEN]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Who uses a token, for the ledger: a fingerprint of the client's address and connection id,
/// the same for every copy of one handshake.
fn claimant(from: SocketAddr, client_cid: ConnectionId) -> u64 {
    use std::hash::{Hash, Hasher};
    // Fixed keys: the same on every endpoint of the server, run after run.
    let mut h = std::hash::DefaultHasher::new();
    from.hash(&mut h);
    client_cid.0.hash(&mut h);
    h.finish()
}
