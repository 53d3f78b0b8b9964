//! The endpoint: demultiplexes datagrams by connection id, runs the stateless-cookie handshake
//! (admitting clients by connect token, or insecurely), answers packets for connections it has
//! no state for with stateless resets, owns the connections and schedules their timers and
//! transmissions. Sans-IO.

//!
//! The orchestrator: the `Endpoint` and what every room shares (the slots, the dirty queue,
//! the stateless reply queue), the datagram dispatch, `poll_transmit` and the bookkeeping after
//! each call into a connection. The rooms:
//!
//! - `config`: `EndpointConfig`, `ListenConfig` (the listening side's limits), `EndpointStats`.
//! - `handshake`: the stateless cookie (hello, challenge, cookie echo), token admission, the
//!   session limits and the per-address handshake budget, the accept and refusals, the
//!   application's accept hook.
//! - `slots`: the connection slot table and the connection ids it issues.
//! - `reset`: stateless resets, sent (server) and checked (client).
//! - `timer`: the timer queue over connections (`poll_timeout`, `handle_timeout`).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::admission::{Admission, ResetKey, UsedTokens};
use crate::keys::IdKey;
use crate::recv::{Budget, SharedBudgets};
use crate::routing::{NoRouting, Router};
use crate::timers::TimerQueue;
use crate::token::ConnectToken;
use crate::wire::{self, Packet};
use crate::{
    CloseReason, ConfigError, Connection, DropCause, Event, PrefetchStage, SendError, SendOptions,
    SessionKeys, Transmit,
};

mod config;
mod handshake;
mod reset;
mod slots;
mod state;
#[cfg(test)]
mod tests;
mod timer;

pub use config::{EndpointConfig, EndpointStats, ListenConfig, DEFAULT_TRANSMIT_BURST};
use slots::MAX_SLOTS;
use state::{Bound, TokenState, STATELESS_MAX};
pub use state::{ConnectionHandle, Endpoint};

impl Endpoint {
    /// A new endpoint. `now` is the base of its cookie clock; `seed` drives connection ids, nonces,
    /// cookie keys and the server random every session's packet keys are bound to. 64 bits are for
    /// tests and simulations (a constant makes a run reproducible); a production endpoint is made
    /// with [`Self::from_seed`] and 32 bytes of OS randomness.
    ///
    /// # Panics
    ///
    /// When `cfg.connection` fails [`Config::validate`](crate::Config::validate) (a duration that
    /// would overflow a deadline, a zero window, a datagram size nothing fits in...): such a
    /// session would panic or spin later, when a connection reaches the bad value.
    /// [`Endpoint::try_new`] returns the error instead.
    pub fn new(cfg: EndpointConfig, now: Instant, seed: u64) -> Self {
        Self::try_new(cfg, now, seed).unwrap_or_else(|e| panic!("Endpoint::new: {e}"))
    }

    /// [`Endpoint::new`], or the [`ConfigError`] naming the field of `cfg.connection` that
    /// [`Config::validate`](crate::Config::validate) refuses.
    pub fn try_new(cfg: EndpointConfig, now: Instant, seed: u64) -> Result<Self, ConfigError> {
        Self::with_rng(cfg, now, ChaCha8Rng::seed_from_u64(seed))
    }

    /// A new endpoint seeded with `seed`: 32 bytes from the operating system's random source
    /// in production (the embedder reads them: this crate reads no OS source; the `ricochet`
    /// runtime does). The connection ids, nonces, cookie keys and, above all, the server
    /// random of each session (see [`SessionKeys`]) are then unpredictable, and unique to
    /// this endpoint among every server that shares its token key and across its restarts,
    /// which a 64-bit seed ([`Self::new`]) cannot promise. Otherwise as [`Self::new`].
    ///
    /// # Panics
    ///
    /// As [`Self::new`], when `cfg.connection` fails [`Config::validate`](crate::Config::validate);
    /// [`Endpoint::try_from_seed`] returns the error instead.
    pub fn from_seed(cfg: EndpointConfig, now: Instant, seed: [u8; 32]) -> Self {
        Self::try_from_seed(cfg, now, seed).unwrap_or_else(|e| panic!("Endpoint::from_seed: {e}"))
    }

    /// [`Endpoint::from_seed`], or the [`ConfigError`] naming the field of `cfg.connection`
    /// that [`Config::validate`](crate::Config::validate) refuses.
    pub fn try_from_seed(
        cfg: EndpointConfig,
        now: Instant,
        seed: [u8; 32],
    ) -> Result<Self, ConfigError> {
        Self::with_rng(cfg, now, ChaCha8Rng::from_seed(seed))
    }

    /// The constructor proper: `cfg.connection` must pass
    /// [`Config::validate`](crate::Config::validate).
    fn with_rng(
        cfg: EndpointConfig,
        now: Instant,
        mut rng: ChaCha8Rng,
    ) -> Result<Self, ConfigError> {
        cfg.connection.validate()?;
        let cookie_secret = rng.random();
        let rate_salt = rng.random();
        let id_key = IdKey::new(rng.random());
        let slot_mask = rng.random::<u64>() & (MAX_SLOTS as u64 - 1);
        let shared = SharedBudgets {
            reassembly: Budget::new(cfg.reassembly_budget),
            fec: crate::fec::RetentionBudget::new(cfg.fec_retention_budget),
        };
        let (tokens, used_capacity) = match cfg.server.as_ref().map(|s| &s.admission) {
            Some(Admission::Tokens(t)) => (
                Some(TokenState {
                    key: t.key.clone(),
                    previous: None,
                    protocol_id: t.protocol_id,
                    public_addresses: t.public_addresses.clone(),
                    reset: t
                        .public_addresses
                        .first()
                        .map(|&a| ResetKey::new(&t.key, a)),
                    max_resets_per_second: t.max_resets_per_second,
                }),
                t.used_token_capacity,
            ),
            _ => (None, 0),
        };
        Ok(Self {
            shared,
            cfg,
            base: now,
            born: now,
            rng,
            slots: Vec::new(),
            free: VecDeque::new(),
            by_client: HashMap::new(),
            stopped_accepting: None,
            rate: Box::default(),
            rate_salt,
            cookie_secret,
            epoch_keys: [None; 2],
            stateless: VecDeque::new(),
            dirty: VecDeque::new(),
            burst: (0, 0),
            timers: TimerQueue::default(),
            events: VecDeque::new(),
            peaks: Default::default(),
            peaks_until: now,
            recv_arena: bytes::BytesMut::new(),
            rtt_samples: Vec::new(),
            stats: EndpointStats::default(),
            router: Box::new(NoRouting::default()),
            id_key,
            slot_mask,
            tokens,
            ledger: Box::new(UsedTokens::new(used_capacity)),
            unix_anchor: None,
            reset_budget: (0, 0),
            by_remote: HashMap::new(),
        })
    }

    /// Route this endpoint's connection ids and cookies with `router` (see [`Router`]). Call
    /// it before the first connection is opened: ids already issued keep their bits.
    pub fn set_router(&mut self, router: Box<dyn Router>) {
        self.router = router;
    }

    /// Counters.
    pub fn stats(&self) -> &EndpointStats {
        &self.stats
    }

    /// The FEC retention budget all connections share (current and peak bytes retained).
    pub fn fec_budget(&self) -> &crate::fec::RetentionBudget {
        &self.shared.fec
    }

    /// Bytes all connections hold in reassembly now.
    pub fn reassembly_bytes(&self) -> usize {
        self.shared.reassembly.used
    }

    /// Number of live connections (any state).
    pub fn connection_count(&self) -> usize {
        self.stats.connections
    }

    /// The RTT samples the connections took since the last call, oldest first (empty unless
    /// [`EndpointConfig::rtt_sample_buffer`] is set). Each is the time from sending a packet to
    /// the acknowledgement of it as the newest the peer had.
    pub fn drain_rtt_samples(&mut self) -> impl Iterator<Item = Duration> + '_ {
        self.rtt_samples
            .drain(..)
            .map(|us| Duration::from_micros(u64::from(us)))
    }

    /// Stateless replies waiting to be sent.
    pub fn pending_stateless(&self) -> usize {
        self.stateless.len()
    }

    /// Start a client connection to `server` in insecure mode (no token; the server must be in
    /// insecure mode too). The handshake runs through `poll_transmit`; [`Event::Connected`] or
    /// [`Event::Closed`] reports its outcome. Messages may be queued with [`Self::send`] right
    /// away.
    pub fn connect(&mut self, now: Instant, server: SocketAddr) -> ConnectionHandle {
        let Some((idx, cid)) = self.alloc() else {
            return self.no_slot();
        };
        let nonce = self.rng.random();
        let keys = self
            .cfg
            .test_session_secret
            .map(|s| SessionKeys::test_path(&s, cid, nonce));
        let conn = Connection::client(self.cfg.connection.clone(), cid, server, nonce, now, keys);
        self.start_client(idx, conn)
    }

    /// Start a client connection with a connect token: to the token's first server address,
    /// then the next ones in turn when a server times out or has no room. Otherwise as
    /// [`Self::connect`]; the session's packets are protected with the token's keys.
    pub fn connect_with_token(&mut self, now: Instant, token: &ConnectToken) -> ConnectionHandle {
        let Some((idx, cid)) = self.alloc() else {
            return self.no_slot();
        };
        let nonce = self.rng.random();
        let conn =
            Connection::client_with_token(self.cfg.connection.clone(), cid, token, nonce, now);
        self.start_client(idx, conn)
    }

    fn start_client(&mut self, idx: u32, mut conn: Connection) -> ConnectionHandle {
        conn.set_budget_limits(self.cfg.reassembly_budget, self.cfg.fec_retention_budget);
        let cid = conn.local_cid();
        self.slots[idx as usize].conn = Some(conn);
        self.stats.connections += 1;
        self.touch(idx);
        ConnectionHandle(cid.0)
    }

    /// Queue a message.
    pub fn send(&mut self, h: ConnectionHandle, channel: u8, data: Bytes) -> Result<(), SendError> {
        self.send_with(h, channel, data, SendOptions::default())
    }

    /// Queue a message with `options` ([`Connection::send_with`]).
    pub fn send_with(
        &mut self,
        h: ConnectionHandle,
        channel: u8,
        data: Bytes,
        options: SendOptions,
    ) -> Result<(), SendError> {
        let idx = self.index_of(h).ok_or(SendError::UnknownConnection)?;
        let slot = &mut self.slots[idx as usize];
        let Some(c) = slot.conn.as_mut() else {
            return Err(SendError::UnknownConnection);
        };
        let r = c.send_with(channel, data, options);
        // Queuing a message raises no event, takes no RTT sample and closes nothing: of what
        // `touch` does after an interaction, only the queueing for `poll_transmit` and the
        // stale deadline apply (the endpoint sends a message after every packet it answers).
        debug_assert!(c.nothing_to_collect());
        slot.timer_stale = true;
        self.queue_dirty(idx);
        r
    }

    /// Close a connection gracefully with `reason`.
    pub fn close(&mut self, now: Instant, h: ConnectionHandle, reason: CloseReason) {
        if let Some(idx) = self.index_of(h) {
            self.with_conn(idx, |c| c.close(now, reason));
            self.touch(idx);
        }
    }

    /// Next event, with the connection it concerns.
    pub fn poll_event(&mut self) -> Option<(ConnectionHandle, Event)> {
        self.events.pop_front()
    }

    /// Handle one received datagram.
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
    ) -> Result<(), DropCause> {
        let r = self.dispatch(now, from, datagram);
        if let Err(c) = r {
            self.stats.drops.add(c);
        }
        r
    }

    fn dispatch(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
    ) -> Result<(), DropCause> {
        let Some(&ty) = datagram.first() else {
            return Err(DropCause::Malformed);
        };
        let hello = ty == wire::PacketType::ClientHello as u8
            || ty == wire::PacketType::ClientCookieEcho as u8;
        if hello {
            return self.handle_hello(now, from, datagram);
        }
        if ty == wire::PacketType::StatelessReset as u8 {
            return self.handle_reset(now, from, datagram);
        }
        if datagram.len() < 2 {
            return Err(DropCause::Malformed);
        }
        let Some(cid) = wire::peek_cid(datagram) else {
            return Err(DropCause::Malformed);
        };
        let idx = self.slot_of(cid.0) as u32;
        let ok = self
            .slots
            .get(idx as usize)
            .and_then(|s| s.conn.as_ref())
            .is_some_and(|c| c.local_cid() == cid);
        if !ok {
            // Undecodable garbage is malformed; a well-formed packet for nobody is unknown,
            // and a connection packet for nobody may deserve a stateless reset.
            return match wire::decode_packet(datagram) {
                Ok(p) => {
                    if matches!(
                        p,
                        Packet::Data { .. } | Packet::FecData { .. } | Packet::FecParity { .. }
                    ) {
                        self.send_reset(now, from, cid, datagram.len());
                    }
                    Err(DropCause::UnknownConnection)
                }
                Err(wire::WireError::VersionMismatch(_)) => Err(DropCause::VersionMismatch),
                Err(_) => Err(DropCause::Malformed),
            };
        }
        let mut arena = std::mem::take(&mut self.recv_arena);
        let r = self
            .with_conn(idx, |c| {
                c.handle_datagram_in(now, from, datagram, Some(&mut arena))
            })
            .unwrap_or(Err(DropCause::UnknownConnection));
        self.recv_arena = arena;
        self.touch(idx);
        r
    }

    fn queue_stateless(&mut self, to: SocketAddr, p: &Packet<'_>) -> bool {
        if self.stateless.len() >= self.cfg.max_stateless_queue {
            self.stats.stateless_queue_full += 1;
            return false;
        }
        let mut b = [0u8; STATELESS_MAX];
        match wire::encode_packet(p, &mut b) {
            Ok(n) => {
                self.stateless.push_back((to, b, n));
                self.peaks[0].stateless = self.peaks[0].stateless.max(self.stateless.len());
                true
            }
            Err(_) => false,
        }
    }

    fn now_ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.base).as_millis() as u64
    }

    /// Room a client endpoint's [`Endpoint::poll_transmit`] can need for one datagram: its
    /// connection's largest datagram
    /// ([`Config::max_path_datagram_size`](crate::Config::max_path_datagram_size)), or the
    /// largest handshake packet if that is longer. A client's send buffer of this size never
    /// truncates a datagram (a server's stateless replies are not covered).
    pub fn client_transmit_len(&self) -> usize {
        self.cfg
            .connection
            .max_path_datagram_size()
            .max(wire::MAX_CLIENT_HANDSHAKE_LEN)
    }

    /// Write the next datagram (stateless replies first, then connections round-robin, up to
    /// [`EndpointConfig::transmit_burst`] datagrams from each in a row).
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if let Some((to, b, n)) = self.stateless.pop_front() {
            if buf.len() >= n {
                buf[..n].copy_from_slice(&b[..n]);
                self.stats.max_stateless_reply = self.stats.max_stateless_reply.max(n);
                return Some(Transmit {
                    destination: to,
                    size: n,
                });
            }
        }
        while let Some(idx) = self.dirty.pop_front() {
            if self.burst.0 != idx {
                // A new connection's turn: the next ones' state is loaded meanwhile.
                self.hint_ahead(self.dirty.front(), self.dirty.get(1));
            }
            let t = self
                .with_conn(idx, |c| {
                    let t = c.poll_transmit(now, buf)?;
                    Some((t, c.nothing_to_send(now)))
                })
                .flatten();
            if let Some(slot) = self.slots.get_mut(idx as usize) {
                slot.dirty = false;
            }
            match t {
                Some((t, done)) => {
                    // Up to `transmit_burst` datagrams in a row, then the back of the queue
                    // (fairness).
                    let run = if self.burst.0 == idx {
                        self.burst.1 + 1
                    } else {
                        1
                    };
                    self.burst = (idx, run);
                    if done {
                        // Nothing more at `now`: what the poll that would return `None`
                        // leads to happens now (the end of its run, its deadline), without
                        // the poll. Something due later comes back through its timer.
                        self.burst.1 = 0;
                        self.after(idx, false);
                        self.refresh_timer(idx);
                        return Some(t);
                    }
                    if let Some(slot) = self.slots.get_mut(idx as usize) {
                        slot.dirty = true;
                        if run < self.cfg.transmit_burst {
                            self.dirty.push_front(idx);
                        } else {
                            self.burst.1 = 0;
                            self.dirty.push_back(idx);
                        }
                    }
                    // Still queued: its deadline is computed when it has sent all it has.
                    self.after(idx, false);
                    return Some(t);
                }
                None => {
                    self.burst.1 = 0;
                    self.after(idx, true);
                }
            }
        }
        None
    }

    /// Hints the CPU to start loading the connection state that handling a datagram for
    /// this endpoint will read, so that those loads overlap the embedder's other work (its
    /// receive system call, the peer before) instead of stalling the handler one after
    /// another. For an endpoint with one connection (a client) that has not run for a while;
    /// a server uses [`Self::prefetch_for`]. A hint only: it changes no behaviour.
    pub fn prefetch(&self, stage: PrefetchStage) {
        // A client holds one connection (two while a reconnect overlaps); more is a server,
        // whose datagrams name their connection, and hinting all of it would only evict.
        for slot in &self.slots[..self.slots.len().min(2)] {
            slot.prefetch(stage);
        }
    }

    /// In a pass over many connections: hints the parts of the `next` one and the state of
    /// the one `after` it (see [`PrefetchStage`]), so their loads overlap this one's work.
    fn hint_ahead(&self, next: Option<&u32>, after: Option<&u32>) {
        if let Some(slot) = next.and_then(|&i| self.slots.get(i as usize)) {
            slot.prefetch(PrefetchStage::Parts);
        }
        if let Some(slot) = after.and_then(|&i| self.slots.get(i as usize)) {
            slot.prefetch(PrefetchStage::Connection);
        }
    }

    /// [`Self::prefetch`] for the one connection `datagram` names: a server issues it for the
    /// datagrams of a receive batch, [`PrefetchStage::Connection`] two ahead of the one it
    /// handles and [`PrefetchStage::Parts`] one ahead.
    pub fn prefetch_for(&self, datagram: &[u8], stage: PrefetchStage) {
        let Some(cid) = wire::peek_cid(datagram) else {
            return;
        };
        let Some(slot) = self.slots.get(self.slot_of(cid.0)) else {
            return;
        };
        // Follow the pointers only for the connection the id names (the datagram is not
        // authenticated yet: a stale or forged id would only evict useful lines).
        let named = slot.conn.as_ref().is_some_and(|c| c.local_cid() == cid);
        if stage == PrefetchStage::Connection || named {
            slot.prefetch(stage);
        }
    }

    /// Runs `f` on connection `idx` with the shared budgets lent to it (see
    /// `Connection::swap_budgets`); `None` if the slot is empty.
    fn with_conn<R>(&mut self, idx: u32, f: impl FnOnce(&mut Connection) -> R) -> Option<R> {
        let conn = self.slots.get_mut(idx as usize)?.conn.as_mut()?;
        conn.swap_budgets(&mut self.shared);
        let r = f(conn);
        conn.swap_budgets(&mut self.shared);
        Some(r)
    }

    /// After any interaction: queue the connection for `poll_transmit`, then `after`.
    fn touch(&mut self, idx: u32) {
        self.queue_dirty(idx);
        self.after(idx, false);
    }

    /// Queues a live connection for `poll_transmit`, once.
    fn queue_dirty(&mut self, idx: u32) {
        if let Some(slot) = self.slots.get_mut(idx as usize) {
            if slot.conn.is_some() && !slot.dirty {
                slot.dirty = true;
                self.dirty.push_back(idx);
                self.peaks[0].dirty = self.peaks[0].dirty.max(self.dirty.len());
            }
        }
    }

    /// After any interaction: hand on the connection's events and RTT samples, and free its
    /// slot once it has drained. Its deadline is recomputed with `refresh`, and otherwise marked
    /// stale: a connection is touched several times per packet (arrival, the application's
    /// reply, each datagram it sends), and its deadline only matters once it has sent what it
    /// has (`poll_transmit`) or before timers run (`handle_timeout` refreshes stale ones).
    fn after(&mut self, idx: u32, refresh: bool) {
        let Some(slot) = self.slots.get_mut(idx as usize) else {
            return;
        };
        let Some(conn) = slot.conn.as_mut() else {
            return;
        };
        let h = ConnectionHandle(conn.local_cid().0);
        while let Some(e) = conn.poll_event() {
            self.events.push_back((h, e));
        }
        self.peaks[0].events = self.peaks[0].events.max(self.events.len());
        let cap = self.cfg.rtt_sample_buffer;
        let (samples, stats) = (&mut self.rtt_samples, &mut self.stats);
        conn.take_rtt_samples(|us| {
            if samples.len() < cap {
                samples.push(us);
            } else if cap > 0 {
                stats.rtt_samples_dropped += 1;
            }
        });
        if slot.bound == Bound::None && conn.reset_token().is_some() {
            // A client connection that learned its server's id and reset token.
            slot.bound = Bound::Remote(conn.remote_cid());
            self.by_remote.insert(conn.remote_cid(), idx);
        }
        if conn.is_drained() {
            // What it still holds goes back to the shared budgets.
            let (reassembly, fec) = conn.held_bytes();
            self.shared.reassembly.used = self
                .shared
                .reassembly
                .used
                .saturating_sub(crate::recv::shared_part(reassembly));
            self.shared.fec.release(fec);
            slot.conn = None;
            slot.dirty = false;
            slot.timer_stale = false;
            self.timers.set(idx, None);
            match std::mem::replace(&mut slot.bound, Bound::None) {
                Bound::None => {}
                Bound::Remote(remote) => {
                    self.by_remote.remove(&remote);
                }
                Bound::Accepted(from, client_cid) => {
                    self.by_client.remove(&(from, client_cid));
                    self.router.session_closed();
                    self.router.release_session(from.ip());
                }
            }
            self.stats.connections -= 1;
            self.free.push_back(idx);
            return;
        }
        if refresh {
            self.refresh_timer(idx);
        } else {
            slot.timer_stale = true;
        }
    }
}
