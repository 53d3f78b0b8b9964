//! The endpoint: demultiplexes datagrams by connection id, runs the stateless-cookie handshake
//! (admitting clients by connect token, or insecurely), answers packets for connections it has
//! no state for with stateless resets, owns the connections and schedules their timers and
//! transmissions. Sans-IO.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::admission::{
    tags_equal, Admission, HandshakeKeys, LedgerRefusal, Peer, Recorded, Refusal, ResetKey,
    TokenLedger, UsedTokens,
};
use super::connection::ServerAdmit;
use super::keys::{IdKey, SEALED_ID_BITS};
use super::recv::{Budget, SharedBudgets};
use super::routing::{NoRouting, Router};
use super::timers::TimerQueue;
use super::{
    CloseReason, Config, ConfigError, Connection, ConnectionId, DropCause, DropCounters, Event,
    PrefetchStage, SendError, SessionKeys, Transmit,
};
use crate::token::{ConnectToken, PrivateToken, SealedToken, TokenKey, NONCE_LEN, TAG_LEN};
use crate::wire::{self, Packet, TokenSection, COOKIE_LEN, HANDSHAKE_TAG_LEN};

/// Identifies a connection of an endpoint: its local connection id. The low 20 bits are its
/// slot (XORed with a random mask the endpoint draws when it is made), bits 32..=40 are the
/// [`Router`]'s, and the other 35 are a permutation, under a key the endpoint draws when it is
/// made, of the count of the slot's uses. A handle kept after its connection ended names
/// nothing: a newer connection in the same slot has another use count, so another id, for
/// 2^32 uses of that slot. The ids of another endpoint, or of this server after a restart, are
/// those of another mask and key: they repeat none of these but by chance (see
/// `docs/security.md` for the odds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectionHandle(pub u64);

/// Listening-side settings. There is no default: a server admits clients by connect token
/// ([`ServerConfig::tokens`]) or, for LAN play and local tests, insecurely
/// ([`ServerConfig::insecure`]), and says which. The default limits admit a thousand players
/// behind one address (a NAT, a LAN event, a load test) connecting at once, twice over.
///
/// `#[non_exhaustive]`: start from [`ServerConfig::tokens`], [`ServerConfig::insecure`] or
/// [`ServerConfig::new`] and change fields (or use [`ServerConfig::with`]), so a new setting
/// is not a breaking change.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// How clients are admitted.
    pub admission: Admission,
    /// When true, a client that passed every check waits for the application: the endpoint
    /// reports [`Event::Incoming`] with who it is, and the application answers with
    /// [`Endpoint::accept`] or [`Endpoint::refuse`] (unanswered within
    /// [`Config::handshake_timeout`], the attempt is dropped and the client times out). When
    /// false, it is accepted at once and [`Event::Connected`] follows.
    pub accept_hook: bool,
    /// Sessions at most (default 16,384); more are refused with [`CloseReason::ServerFull`].
    /// Counted per endpoint, or across all the endpoints of a server where its [`Router`]
    /// counts them ([`Router::admit_session`]; the `ricochet` runtime does, so the limit is the
    /// server's whatever its worker count).
    pub max_sessions: usize,
    /// Sessions per source IP (default 2,048: players behind one NAT share an address); more
    /// are refused with [`CloseReason::TooManyFromAddress`]. Counted like `max_sessions`.
    pub max_sessions_per_address: usize,
    /// Sessions opened per source IP per second and per endpoint (default 4,096: a thousand
    /// players behind one address connecting at once, with retries), in a fixed-size table of
    /// counters with no per-peer state; once it is spent, cookie echoes from that IP are
    /// dropped silently and their clients retry. Only an echo that proved its address and, with
    /// tokens, its token's keys, and that opens a session, is counted (with tokens, that is
    /// one count per token): whoever spoofs a player's address, or replays a hello or echo
    /// captured from a player behind the same address, cannot use up the player's budget.
    pub max_handshakes_per_address: u32,
    /// How long a cookie stays valid.
    pub cookie_lifetime: Duration,
    /// Cookie key rotation period; the previous key stays valid for one more period.
    pub key_rotation: Duration,
}

impl ServerConfig {
    /// A server that admits clients as `admission` says, with the default limits: 16,384
    /// sessions, 2,048 per source IP, 4,096 proven handshakes per IP per second, 10 s cookies,
    /// 30 s cookie key rotation, no accept hook.
    pub fn new(admission: Admission) -> Self {
        ServerConfig {
            admission,
            accept_hook: false,
            max_sessions: 16_384,
            max_sessions_per_address: 2_048,
            max_handshakes_per_address: 4_096,
            cookie_lifetime: Duration::from_secs(10),
            key_rotation: Duration::from_secs(30),
        }
    }

    /// A server that admits clients by connect token.
    pub fn tokens(admission: super::TokenAdmission) -> Self {
        Self::new(Admission::Tokens(admission))
    }

    /// A server in insecure mode: no tokens, no packet protection. LAN play and local tests.
    pub fn insecure() -> Self {
        Self::new(Admission::Insecure)
    }

    /// This configuration with `tune` applied:
    /// `ServerConfig::insecure().with(|s| s.accept_hook = true)`.
    pub fn with(mut self, tune: impl FnOnce(&mut Self)) -> Self {
        tune(&mut self);
        self
    }
}

/// Endpoint settings. `#[non_exhaustive]`: start from [`EndpointConfig::default`] (a client;
/// [`EndpointConfig::server`] for a server) and change fields, or use
/// [`EndpointConfig::with`].
///
/// ```
/// use ricochet_proto::{Config, EndpointConfig, ServerConfig};
/// use std::sync::Arc;
///
/// let server = EndpointConfig::server(ServerConfig::insecure())
///     .with(|e| e.connection = Arc::new(Config::competitive()));
/// assert!(server.server.is_some());
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EndpointConfig {
    /// Settings of every connection.
    pub connection: Arc<Config>,
    /// `Some` to accept incoming handshakes.
    pub server: Option<ServerConfig>,
    /// Bytes all connections together may hold in reassembly, beyond the first 16 KiB each
    /// connection holds of its own: a few sessions that fill this budget (peers that send
    /// fragments and never the message they wait for) still leave every other session room
    /// for its ordinary messages. Each connection is also bounded by
    /// [`Config::reassembly_limit`].
    pub reassembly_budget: usize,
    /// Stateless replies (challenges, refusals) queued at most; more are dropped.
    pub max_stateless_queue: usize,
    /// Bytes all connections together may retain for incomplete FEC groups (1 MiB).
    pub fec_retention_budget: usize,
    /// Datagrams [`Endpoint::poll_transmit`] takes from one connection in a row before moving
    /// on to the next one with something to send (round-robin; 1 = one datagram each in
    /// turn). Default [`DEFAULT_TRANSMIT_BURST`]: a run of datagrams to one peer leaves in one
    /// GSO send where the runtime coalesces them, which one-each-in-turn breaks up.
    pub transmit_burst: usize,
    /// RTT samples the endpoint keeps for [`Endpoint::drain_rtt_samples`] between two calls
    /// (0, the default: none are kept). An embedder that aggregates RTT over its sessions (the
    /// runtime's per-worker histogram) sets it and drains every turn; samples beyond it are
    /// counted in [`EndpointStats::rtt_samples_dropped`].
    pub rtt_sample_buffer: usize,
    /// **Test and benchmark path, not for production.** `Some`: every session's packets are
    /// protected with keys derived from this secret and the session's client connection id and
    /// nonce ([`SessionKeys::derive_for_test`]); client and server endpoints must hold the same
    /// secret. Both of those inputs cross the network in clear, so whoever holds the secret can
    /// read and forge every session of every endpoint that shares it; connect tokens, which
    /// hand each session its own random keys, are the production path. `None` (the default):
    /// the insecure mode, no packet protection.
    pub test_session_secret: Option<[u8; 32]>,
}

impl EndpointConfig {
    /// The defaults, accepting handshakes as `server` says.
    pub fn server(server: ServerConfig) -> Self {
        Self::default().with(|e| e.server = Some(server))
    }

    /// This configuration with `tune` applied.
    pub fn with(mut self, tune: impl FnOnce(&mut Self)) -> Self {
        tune(&mut self);
        self
    }
}

/// Default [`EndpointConfig::transmit_burst`]: a full echo window (16 datagrams) to one peer
/// leaves as one GSO run. Measure with `bench rudp --direct` before changing it.
pub const DEFAULT_TRANSMIT_BURST: usize = 16;

impl Default for EndpointConfig {
    fn default() -> Self {
        Self {
            connection: Arc::new(Config::default()),
            server: None,
            reassembly_budget: 64 << 20,
            max_stateless_queue: 1024,
            fec_retention_budget: crate::fec::DEFAULT_RETENTION_BUDGET,
            transmit_burst: DEFAULT_TRANSMIT_BURST,
            rtt_sample_buffer: 0,
            test_session_secret: None,
        }
    }
}

/// Endpoint-level counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EndpointStats {
    /// Datagrams dropped, by cause (connection-level drops included).
    pub drops: DropCounters,
    /// Challenges sent.
    pub challenges_sent: u64,
    /// Refusals sent.
    pub refusals_sent: u64,
    /// Stateless replies dropped because the reply queue was full.
    pub stateless_queue_full: u64,
    /// Handshakes accepted (connections created by a valid cookie echo).
    pub accepted: u64,
    /// Connections currently alive.
    pub connections: usize,
    /// Largest stateless reply sent.
    pub max_stateless_reply: usize,
    /// RTT samples not kept because [`EndpointConfig::rtt_sample_buffer`] was full.
    pub rtt_samples_dropped: u64,
    /// Handshakes refused because of their token (required, invalid, expired, for another
    /// server, reused).
    pub token_refusals: u64,
    /// Handshakes the application refused ([`Endpoint::refuse`]).
    pub rejected: u64,
    /// Stateless resets sent.
    pub resets_sent: u64,
    /// Stateless resets not sent because of the rate limit.
    pub resets_limited: u64,
    /// Used tokens forgotten before their expiry to make room for a new one: the table of
    /// used tokens ([`super::TokenAdmission::used_token_capacity`]) is smaller than the
    /// handshakes per second times the token lifetime, and those tokens could be used again.
    pub tokens_evicted: u64,
}

/// Largest stateless reply: a tagged refusal with the longest message.
const STATELESS_MAX: usize = wire::REFUSE_LEN + wire::MAX_REFUSE_MESSAGE + wire::HANDSHAKE_TAG_LEN;

/// What a token-admitting endpoint keeps from its [`super::TokenAdmission`].
#[derive(Debug)]
struct TokenState {
    key: TokenKey,
    /// The key before the last rotation, still accepted until the instant given.
    previous: Option<(TokenKey, Instant)>,
    protocol_id: u64,
    public_addresses: Vec<SocketAddr>,
    reset: Option<ResetKey>,
    max_resets_per_second: u32,
}

/// A token that passed every stateless check, with what the session needs from it.
struct Admitted {
    private: PrivateToken,
    tag: [u8; TAG_LEN],
    expires_unix: u64,
    hk: HandshakeKeys,
}

/// Why a hello or echo was not taken further.
enum Verdict {
    /// Dropped silently, counted under this cause.
    Drop(DropCause),
    /// Answered with a refusal; tagged when the token opened.
    Refuse(CloseReason, Option<HandshakeKeys>),
}

const RATE_SLOTS: usize = 4096;

/// Bits of a connection id that hold its slot index.
const SLOT_BITS: u32 = 20;
/// Most connections an endpoint holds at once (slots).
const MAX_SLOTS: usize = 1 << SLOT_BITS;
/// The bits of the upper half of a connection id that the [`Router`] writes (32..=40 of the id).
const ROUTER_BITS: u32 = 0x1ff;

/// A connection id from its parts: the slot field (slot XOR mask), the router's bits and the
/// 35 sealed bits (12 of them between the slot field and the router's bits, 23 above).
fn compose_cid(slot_field: u64, router: u32, sealed: u64) -> ConnectionId {
    let low = sealed & ((1 << (32 - SLOT_BITS)) - 1);
    let high = sealed >> (32 - SLOT_BITS);
    debug_assert!(high < 1 << (SEALED_ID_BITS - (32 - SLOT_BITS)));
    ConnectionId(
        (high << 41) | (u64::from(router & ROUTER_BITS) << 32) | (low << SLOT_BITS) | slot_field,
    )
}

#[derive(Debug)]
struct Slot {
    conn: Option<Connection>,
    dirty: bool,
    /// The connection changed since its deadline in `timers` was computed (see
    /// `Endpoint::refresh_timer`); only ever set while `dirty`.
    timer_stale: bool,
    /// Server side: the (client address, client cid) this connection was accepted for.
    accepted_for: Option<(SocketAddr, ConnectionId)>,
    /// Client side: the server's connection id, once known (stateless resets name it).
    remote: Option<ConnectionId>,
    /// How many times the slot was reused (sealed into its connection's id; wraps after 2^32).
    reuses: u32,
}

impl Slot {
    fn prefetch(&self, stage: PrefetchStage) {
        match stage {
            PrefetchStage::Connection => super::prefetch(self),
            PrefetchStage::Parts => {
                if let Some(conn) = &self.conn {
                    conn.prefetch_parts();
                }
            }
        }
    }
}

/// A sans-IO endpoint (client, server or both).
#[derive(Debug)]
pub struct Endpoint {
    cfg: EndpointConfig,
    base: Instant,
    /// When the endpoint was made: `poll_timeout` reports it for "due now" (no `now` an
    /// embedder passes is earlier).
    born: Instant,
    rng: ChaCha8Rng,
    slots: Vec<Slot>,
    /// Freed slots, reused oldest first: a slot's reuse count then wraps as late as it can.
    free: VecDeque<u32>,
    by_client: HashMap<(SocketAddr, ConnectionId), ConnectionHandle>,
    per_ip: HashMap<IpAddr, usize>,
    sessions: usize,
    /// Set by [`Self::stop_accepting`]: new clients are refused with `Shutdown`.
    stopped_accepting: bool,
    /// Handshake counters per hashed source address (allocated by the first hello: a client
    /// endpoint never needs them).
    rate: Box<[(u64, u32)]>,
    rate_salt: u64,
    /// Cookie keys are derived per rotation period from this secret, so the endpoints of one
    /// server's workers can share it and verify each other's cookies.
    cookie_secret: [u8; 32],
    /// The last two derived period keys (current and previous): a hello or an echo then
    /// costs one keyed hash (the cookie), not two.
    epoch_keys: [Option<(u64, [u8; 32])>; 2],
    stateless: VecDeque<(SocketAddr, [u8; STATELESS_MAX], usize)>,
    dirty: VecDeque<u32>,
    /// The connection that sent the last datagram, and how many it sent in a row.
    burst: (u32, usize),
    timers: TimerQueue,
    due: Vec<(Instant, u32)>,
    events: VecDeque<(ConnectionHandle, Event)>,
    /// RTT samples (µs) for [`Endpoint::drain_rtt_samples`].
    rtt_samples: Vec<u32>,
    /// The reassembly and FEC retention budgets all connections share (lent to each
    /// connection for the length of a call, see `with_conn`).
    shared: SharedBudgets,
    stats: EndpointStats,
    /// What goes into the ids and cookies this endpoint issues (see [`Router`]).
    router: Box<dyn Router>,
    /// Seals a slot's use count into the ids this endpoint issues (see [`ConnectionHandle`]).
    id_key: IdKey,
    /// XORed into the slot field of every id this endpoint issues: with `id_key`, what makes
    /// its ids another boot's than those of this server before a restart.
    slot_mask: u64,
    /// Token admission (server in token mode).
    tokens: Option<TokenState>,
    /// The tokens accepted so far (see [`TokenLedger`]).
    ledger: Box<dyn TokenLedger>,
    /// Unix time (ms) at an instant: the embedder's wall clock, read by the embedder.
    unix_anchor: Option<(Instant, u64)>,
    /// Stateless resets sent in the current second: (second, count).
    reset_budget: (u64, u32),
    /// Client side: connections by their server's connection id (for stateless resets).
    by_remote: HashMap<ConnectionId, u32>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // The secret every cookie key derives from, and the cookie keys derived last. The
        // generator the secret may have been drawn from is not cleared: `rand_chacha` offers
        // no way to, and its type is not this crate's to overwrite.
        zeroize::Zeroize::zeroize(&mut self.cookie_secret);
        for (_, key) in self.epoch_keys.iter_mut().flatten() {
            zeroize::Zeroize::zeroize(key);
        }
        // The sessions still open end with the endpoint: its router hears so, as it does when
        // one closes, so that counts it shares (a multi-worker server's limits and placement)
        // do not keep an endpoint's sessions after it is gone (its worker's handler panicked).
        for _ in 0..self.sessions {
            self.router.session_closed();
        }
        for (&ip, &n) in &self.per_ip {
            for _ in 0..n {
                self.router.release_session(ip);
            }
        }
    }
}

/// Bits of the cookie "timestamp" (the opaque u64 a challenge carries and the client echoes)
/// that hold the milliseconds; the 16 above them carry the router's route.
const COOKIE_MS_BITS: u32 = 48;

impl Endpoint {
    /// A new endpoint. `now` is the base of its cookie clock; `seed` drives connection ids,
    /// nonces, cookie keys and the server random every session's packet keys are bound to.
    /// 64 bits are for tests and simulations (a constant makes a run reproducible); a
    /// production endpoint is made with [`Self::from_seed`] and 32 bytes of OS randomness.
    ///
    /// # Panics
    ///
    /// When `cfg.connection` fails [`Config::validate`] (a duration that would overflow a
    /// deadline, a zero window, a datagram size nothing fits in...): such a session would
    /// panic or spin later, when a connection reaches the bad value. [`Endpoint::try_new`]
    /// returns the error instead.
    pub fn new(cfg: EndpointConfig, now: Instant, seed: u64) -> Self {
        Self::try_new(cfg, now, seed).unwrap_or_else(|e| panic!("Endpoint::new: {e}"))
    }

    /// [`Endpoint::new`], or the [`ConfigError`] naming the field of `cfg.connection` that
    /// [`Config::validate`] refuses.
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
    /// As [`Self::new`], when `cfg.connection` fails [`Config::validate`];
    /// [`Endpoint::try_from_seed`] returns the error instead.
    pub fn from_seed(cfg: EndpointConfig, now: Instant, seed: [u8; 32]) -> Self {
        Self::try_from_seed(cfg, now, seed).unwrap_or_else(|e| panic!("Endpoint::from_seed: {e}"))
    }

    /// [`Endpoint::from_seed`], or the [`ConfigError`] naming the field of `cfg.connection`
    /// that [`Config::validate`] refuses.
    pub fn try_from_seed(
        cfg: EndpointConfig,
        now: Instant,
        seed: [u8; 32],
    ) -> Result<Self, ConfigError> {
        Self::with_rng(cfg, now, ChaCha8Rng::from_seed(seed))
    }

    /// The constructor proper: `cfg.connection` must pass [`Config::validate`].
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
            per_ip: HashMap::new(),
            sessions: 0,
            stopped_accepting: false,
            rate: Box::default(),
            rate_salt,
            cookie_secret,
            epoch_keys: [None; 2],
            stateless: VecDeque::new(),
            dirty: VecDeque::new(),
            burst: (0, 0),
            timers: TimerQueue::default(),
            due: Vec::new(),
            events: VecDeque::new(),
            rtt_samples: Vec::new(),
            stats: EndpointStats::default(),
            router: Box::new(NoRouting),
            id_key,
            slot_mask,
            tokens,
            ledger: Box::new(UsedTokens::new(used_capacity)),
            unix_anchor: None,
            reset_budget: (0, 0),
            by_remote: HashMap::new(),
        })
    }

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

    /// Route this endpoint's connection ids and cookies with `router` (see [`Router`]). Call
    /// it before the first connection is opened: ids already issued keep their bits.
    pub fn set_router(&mut self, router: Box<dyn Router>) {
        self.router = router;
    }

    /// Verify and issue cookies with `secret`, counting milliseconds from `base`.
    ///
    /// The endpoints of one server's workers share both, so a cookie echo that reaches another
    /// worker than the one that issued the challenge is still accepted. Keys rotate as before:
    /// each [`ServerConfig::key_rotation`] period derives its own key from the secret, and the
    /// previous period's key stays valid for one more period.
    pub fn set_cookie_secret(&mut self, base: Instant, secret: [u8; 32]) {
        self.base = base;
        self.cookie_secret = secret;
        self.epoch_keys = [None; 2];
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

    /// The slot a connection id or handle names.
    fn slot_of(&self, cid: u64) -> usize {
        ((cid ^ self.slot_mask) & (MAX_SLOTS as u64 - 1)) as usize
    }

    /// A connection, for its state and statistics.
    pub fn connection(&self, h: ConnectionHandle) -> Option<&Connection> {
        let idx = self.slot_of(h.0);
        self.slots
            .get(idx)?
            .conn
            .as_ref()
            .filter(|c| c.local_cid().0 == h.0)
    }

    fn index_of(&self, h: ConnectionHandle) -> Option<u32> {
        self.connection(h).map(|_| self.slot_of(h.0) as u32)
    }

    /// Whether [`Self::alloc`] has a slot to give.
    fn slot_available(&self) -> bool {
        !self.free.is_empty() || self.slots.len() < MAX_SLOTS
    }

    /// A slot for a new connection and that connection's id; `None` when every slot is taken.
    fn alloc(&mut self) -> Option<(u32, ConnectionId)> {
        let idx = match self.free.pop_front() {
            Some(i) => {
                let slot = &mut self.slots[i as usize];
                slot.reuses = slot.reuses.wrapping_add(1);
                i
            }
            None if self.slots.len() < MAX_SLOTS => {
                self.slots.push(Slot {
                    conn: None,
                    dirty: false,
                    timer_stale: false,
                    accepted_for: None,
                    remote: None,
                    reuses: 0,
                });
                (self.slots.len() - 1) as u32
            }
            None => return None,
        };
        let sealed = self.id_key.seal(idx, self.slots[idx as usize].reuses);
        let router = self.router.connection_id_bits(self.rng.random::<u32>() | 1);
        let cid = compose_cid(u64::from(idx) ^ self.slot_mask, router, sealed);
        Some((idx, cid))
    }

    /// A client connection that found no free slot: it ends at once, before it began.
    fn no_slot(&mut self) -> ConnectionHandle {
        // No handle of a connection is 0 (the router's bits are never 0: its random input is
        // odd, and a runtime worker's set its tag bit), so this one names none.
        let h = ConnectionHandle(0);
        let message = Bytes::from_static(b"this endpoint holds as many connections as it can");
        self.events.push_back((
            h,
            Event::Closed {
                reason: CloseReason::ServerFull,
                by_peer: false,
                message,
            },
        ));
        h
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
            .map(|s| SessionKeys::derive_for_test(&s, cid, nonce));
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

    /// Accept a client the endpoint reported with [`Event::Incoming`] (with
    /// [`ServerConfig::accept_hook`]): it learns it is in, and [`Event::Connected`] follows.
    pub fn accept(&mut self, h: ConnectionHandle) {
        if let Some(idx) = self.index_of(h) {
            if let Some(c) = self.slots[idx as usize].conn.as_mut() {
                c.accept_by_application();
            }
            self.touch(idx);
        }
    }

    /// Refuse a client the endpoint reported with [`Event::Incoming`]: the client receives
    /// [`CloseReason::Rejected`] with the refusal's code and message, and the handle is
    /// released at once (no further events). Its token stays used.
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

    /// Queue a message.
    pub fn send(&mut self, h: ConnectionHandle, channel: u8, data: Bytes) -> Result<(), SendError> {
        let idx = self.index_of(h).ok_or(SendError::UnknownConnection)?;
        let r = match self.slots[idx as usize].conn.as_mut() {
            Some(c) => c.send(channel, data),
            None => Err(SendError::UnknownConnection),
        };
        self.touch(idx);
        r
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
        self.stopped_accepting = true;
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
        let r = self
            .with_conn(idx, |c| c.handle_datagram(now, from, datagram))
            .unwrap_or(Err(DropCause::UnknownConnection));
        self.touch(idx);
        r
    }

    /// Answer a connection packet for `cid`, which this server has no state for, with the
    /// session's stateless reset: only when admitting by token (the reset key comes from the
    /// backend's key), only to a packet larger than the reset (no amplification, and a reset
    /// never answers a reset), and at most [`super::TokenAdmission::max_resets_per_second`].
    /// Any id draws one, issued or guessed: ids are never reused (see [`ConnectionHandle`]), so
    /// the reset of an id that is not live ends no session, now or later, unless the id is
    /// guessed before it is issued (1 in 2^35 per guess, at most this rate of guesses).
    fn send_reset(&mut self, now: Instant, to: SocketAddr, cid: ConnectionId, trigger: usize) {
        let Some(t) = self.tokens.as_ref() else {
            return;
        };
        let Some(reset) = t.reset.as_ref() else {
            return;
        };
        if trigger <= wire::RESET_LEN {
            return;
        }
        let second = self.now_ms(now) / 1000;
        if self.reset_budget.0 != second {
            self.reset_budget = (second, 0);
        }
        if self.reset_budget.1 >= t.max_resets_per_second {
            self.stats.resets_limited += 1;
            return;
        }
        self.reset_budget.1 += 1;
        let token = reset.token(cid);
        if self.queue_stateless(to, &Packet::StatelessReset { cid, token }) {
            self.stats.resets_sent += 1;
        }
    }

    /// A stateless reset from a server: the client connection talking to that server id
    /// checks its token. A genuine reset is exactly [`wire::RESET_LEN`] bytes (a server sends
    /// nothing else) and comes from the address the connection talks to; anything else is
    /// dropped before the token is compared.
    fn handle_reset(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
    ) -> Result<(), DropCause> {
        let cid = match wire::decode_packet(datagram) {
            Ok(Packet::StatelessReset { cid, .. }) => cid,
            Err(wire::WireError::VersionMismatch(_)) => return Err(DropCause::VersionMismatch),
            _ => return Err(DropCause::Malformed),
        };
        if datagram.len() != wire::RESET_LEN {
            return Err(DropCause::Malformed);
        }
        let Some(&idx) = self.by_remote.get(&cid) else {
            return Err(DropCause::UnknownConnection);
        };
        let talks_to = self.slots[idx as usize]
            .conn
            .as_ref()
            .map(Connection::remote_addr);
        if talks_to != Some(from) {
            return Err(DropCause::Unauthenticated);
        }
        // The connection decodes it again: it can be driven without an endpoint too.
        let unused = SocketAddr::from(([0, 0, 0, 0], 0));
        let r = self
            .with_conn(idx, |c| c.handle_datagram(now, unused, datagram))
            .unwrap_or(Err(DropCause::UnknownConnection));
        self.touch(idx);
        r
    }

    fn handle_hello(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
    ) -> Result<(), DropCause> {
        let Some(server) = self.cfg.server.as_ref() else {
            return Err(DropCause::NotListening);
        };
        let period = Self::key_period(server);
        let cookie_lifetime = server.cookie_lifetime.as_millis() as u64;
        let max_handshakes = server.max_handshakes_per_address;
        let max_sessions = server.max_sessions;
        let max_per_ip = server.max_sessions_per_address;
        let accept_hook = server.accept_hook;
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
        let now_ms = self.now_ms(now);
        match packet {
            Packet::ClientHello {
                client_cid,
                nonce,
                token,
            } => {
                let ty = wire::PacketType::ClientHello;
                let admitted =
                    match self.admit(now, ty, client_cid, nonce, 0, &[0; COOKIE_LEN], token) {
                        Ok(a) => a,
                        Err(v) => return self.verdict(from, client_cid, nonce, v),
                    };
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
                    tag: admitted
                        .map(|a| a.hk.challenge_tag(client_cid, nonce, timestamp, &cookie)),
                };
                if self.queue_stateless(from, &reply) {
                    self.stats.challenges_sent += 1;
                }
                Ok(())
            }
            Packet::ClientCookieEcho {
                client_cid,
                nonce,
                timestamp,
                cookie,
                token,
            } => {
                // The cookie first: one keyed hash, and it proves the address before anything
                // else is spent on the echo.
                let issued_ms = timestamp & ((1 << COOKIE_MS_BITS) - 1);
                let fresh = issued_ms <= now_ms && now_ms - issued_ms <= cookie_lifetime;
                let tag = token.map_or([0; TAG_LEN], |t| token_tag(&t));
                let valid = fresh
                    && self.key_for(issued_ms, now_ms, period).is_some_and(|k| {
                        let expect = self.cookie(k, from, timestamp, nonce, client_cid, &tag);
                        constant_time_eq(&expect, &cookie)
                    });
                if !valid {
                    return Err(DropCause::BadCookie);
                }
                if let Some(&h) = self.by_client.get(&(from, client_cid)) {
                    // A retransmitted echo: the existing connection re-sends its accept.
                    if let Some(idx) = self.index_of(h) {
                        let r = self
                            .with_conn(idx, |c| c.handle_datagram(now, from, datagram))
                            .unwrap_or(Ok(()));
                        self.touch(idx);
                        return r;
                    }
                }
                let ty = wire::PacketType::ClientCookieEcho;
                let admitted =
                    match self.admit(now, ty, client_cid, nonce, timestamp, &cookie, token) {
                        Ok(a) => a,
                        Err(v) => return self.verdict(from, client_cid, nonce, v),
                    };
                // The per-address budget, now that the echo proved the address and (with a
                // token) the token's keys. It counts the sessions this echo's address opened,
                // charged below when one opens: an echo that opens none (a refusal, a token
                // already used, a copy of an echo that opened one) spends nothing, so replays
                // of one captured hello or echo cannot spend a player's budget.
                if *self.handshakes_this_second(now, from.ip()) >= max_handshakes {
                    return Err(DropCause::RateLimited);
                }
                let hk = admitted.as_ref().map(|a| &a.hk);
                // Every slot of this endpoint taken is far beyond any default limit.
                let refused = if self.stopped_accepting {
                    Some(CloseReason::Shutdown)
                } else {
                    (!self.slot_available()).then_some(CloseReason::ServerFull)
                };
                if let Some(reason) = refused {
                    self.refuse_with(from, client_cid, nonce, reason, &[], hk);
                    return Ok(());
                }
                let ip = from.ip();
                let routed = self
                    .cfg
                    .server
                    .as_ref()
                    .and_then(|limits| self.router.admit_session(ip, limits));
                let verdict = match routed {
                    Some(v) => v,
                    None if self.sessions >= max_sessions => Err(CloseReason::ServerFull),
                    None if self.per_ip.get(&ip).copied().unwrap_or(0) >= max_per_ip => {
                        Err(CloseReason::TooManyFromAddress)
                    }
                    None => Ok(()),
                };
                if let Err(reason) = verdict {
                    self.refuse_with(from, client_cid, nonce, reason, &[], hk);
                    return Ok(());
                }
                if let Some(a) = admitted.as_ref() {
                    let now_unix = self.unix_now(now).unwrap_or(0);
                    let claimant = claimant(from, client_cid);
                    let recorded = self
                        .ledger
                        .record(&a.tag, a.expires_unix, now_unix, claimant);
                    if recorded == Err(LedgerRefusal::Duplicate) {
                        // This client's own echo, admitted by another endpoint of the server,
                        // which answers it: no refusal that would end its handshake.
                        if routed.is_some() {
                            self.router.release_session(ip);
                        }
                        return Err(DropCause::Duplicate);
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
                        if routed.is_some() {
                            // The router counted the session it will not get.
                            self.router.release_session(ip);
                        }
                        self.refuse_with(from, client_cid, nonce, reason, &[], Some(&a.hk));
                        return Ok(());
                    }
                }
                let opened = self.handshakes_this_second(now, from.ip());
                *opened = opened.saturating_add(1);
                self.open_session(now, from, client_cid, nonce, admitted, accept_hook);
                Ok(())
            }
            _ => Err(DropCause::Malformed),
        }
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
                        .map(|s| SessionKeys::derive_for_test(&s, client_cid, nonce)),
                },
                secure: secure.map(|(keys, hk, _)| (keys, hk)),
                hook: accept_hook,
            },
        );
        conn.set_budget_limits(self.cfg.reassembly_budget, self.cfg.fec_retention_budget);
        let slot = &mut self.slots[idx as usize];
        slot.conn = Some(conn);
        slot.accepted_for = Some((from, client_cid));
        self.by_client
            .insert((from, client_cid), ConnectionHandle(cid.0));
        *self.per_ip.entry(from.ip()).or_insert(0) += 1;
        self.sessions += 1;
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

    fn queue_stateless(&mut self, to: SocketAddr, p: &Packet<'_>) -> bool {
        if self.stateless.len() >= self.cfg.max_stateless_queue {
            self.stats.stateless_queue_full += 1;
            return false;
        }
        let mut b = [0u8; STATELESS_MAX];
        match wire::encode_packet(p, &mut b) {
            Ok(n) => {
                self.stateless.push_back((to, b, n));
                true
            }
            Err(_) => false,
        }
    }

    fn now_ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.base).as_millis() as u64
    }

    /// The key that signs cookies stamped `issued_ms`, if its period is the current one (at
    /// `now_ms`) or the one before.
    fn key_for(&mut self, issued_ms: u64, now_ms: u64, period: u64) -> Option<[u8; 32]> {
        let (e, current) = (issued_ms / period, now_ms / period);
        (e == current || e + 1 == current).then(|| self.epoch_key(e))
    }

    fn key_period(server: &ServerConfig) -> u64 {
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

    /// Room a client endpoint's [`Endpoint::poll_transmit`] can need for one datagram: its
    /// connection's [`Config::max_datagram_size`](crate::Config::max_datagram_size), or the
    /// largest handshake packet if that is longer. A client's send buffer of this size never
    /// truncates a datagram (a server's stateless replies are not covered).
    pub fn client_transmit_len(&self) -> usize {
        self.cfg
            .connection
            .max_datagram_size
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
            let t = self.with_conn(idx, |c| c.poll_transmit(now, buf)).flatten();
            if let Some(slot) = self.slots.get_mut(idx as usize) {
                slot.dirty = false;
            }
            match t {
                Some(t) => {
                    // Up to `transmit_burst` datagrams in a row, then the back of the queue
                    // (fairness).
                    let run = if self.burst.0 == idx {
                        self.burst.1 + 1
                    } else {
                        1
                    };
                    self.burst = (idx, run);
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

    /// Earliest timer of any connection (may lie in the past: then a transmission or timer is
    /// due now; call `handle_timeout` and `poll_transmit`). After anything that may give a
    /// connection something to send (`handle_datagram`, `send`, `close`, `accept`,
    /// `handle_timeout`, ...) it is the instant the endpoint was made, i.e. due now, until
    /// `poll_transmit` has returned `None`: a connection's deadline is recomputed once it has
    /// sent what it has, not at every packet.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.dirty.is_empty() {
            self.timers.peek()
        } else {
            Some(self.born)
        }
    }

    /// Run every connection timer that is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        // Deadlines of connections changed since their last `poll_transmit` visit first: any of
        // them may be due (an embedder need not drain `poll_transmit` before calling this).
        for i in 0..self.dirty.len() {
            let idx = self.dirty[i];
            self.hint_ahead(self.dirty.get(i + 1), self.dirty.get(i + 2));
            self.refresh_timer(idx);
        }
        // Take the due entries first: a connection run here is marked stale and queued for
        // `poll_transmit`, and must not run again in this call.
        let mut due = std::mem::take(&mut self.due);
        while let Some(entry) = self.timers.pop_due(now) {
            due.push(entry);
        }
        for (i, &(_, idx)) in due.iter().enumerate() {
            self.hint_ahead(due.get(i + 1).map(|e| &e.1), due.get(i + 2).map(|e| &e.1));
            self.with_conn(idx, |c| c.handle_timeout(now));
            self.touch(idx);
        }
        due.clear();
        self.due = due;
        self.shrink_queues();
    }

    /// Gives back queue capacity a burst grew once the queues are mostly empty again (a server
    /// that served a wave of traffic keeps its sessions, not the wave's buffers). Halving at a
    /// quarter full keeps the cost amortized and never thrashes.
    fn shrink_queues(&mut self) {
        fn sparse(len: usize, cap: usize) -> bool {
            cap > 64 && len < cap / 4
        }
        self.timers.shrink();
        if sparse(self.dirty.len(), self.dirty.capacity()) {
            self.dirty.shrink_to(self.dirty.len() * 2);
        }
        if sparse(self.events.len(), self.events.capacity()) {
            self.events.shrink_to(self.events.len() * 2);
        }
        if sparse(self.stateless.len(), self.stateless.capacity()) {
            self.stateless.shrink_to(self.stateless.len() * 2);
        }
        if sparse(0, self.due.capacity()) {
            self.due = Vec::new();
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
        if let Some(slot) = self.slots.get_mut(idx as usize) {
            if slot.conn.is_some() && !slot.dirty {
                slot.dirty = true;
                self.dirty.push_back(idx);
            }
        }
        self.after(idx, false);
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
        let cap = self.cfg.rtt_sample_buffer;
        let (samples, stats) = (&mut self.rtt_samples, &mut self.stats);
        conn.take_rtt_samples(|us| {
            if samples.len() < cap {
                samples.push(us);
            } else if cap > 0 {
                stats.rtt_samples_dropped += 1;
            }
        });
        if slot.remote.is_none() && slot.accepted_for.is_none() && conn.reset_token().is_some() {
            // A client connection that learned its server's id and reset token.
            slot.remote = Some(conn.remote_cid());
            self.by_remote.insert(conn.remote_cid(), idx);
        }
        if conn.is_drained() {
            // What it still holds goes back to the shared budgets.
            let (reassembly, fec) = conn.held_bytes();
            self.shared.reassembly.used = self
                .shared
                .reassembly
                .used
                .saturating_sub(super::recv::shared_part(reassembly));
            self.shared.fec.release(fec);
            slot.conn = None;
            slot.dirty = false;
            slot.timer_stale = false;
            self.timers.set(idx, None);
            if let Some(remote) = slot.remote.take() {
                self.by_remote.remove(&remote);
            }
            if let Some(key) = slot.accepted_for.take() {
                self.by_client.remove(&key);
                if let Some(n) = self.per_ip.get_mut(&key.0.ip()) {
                    *n -= 1;
                    if *n == 0 {
                        self.per_ip.remove(&key.0.ip());
                    }
                }
                self.sessions -= 1;
                self.router.session_closed();
                self.router.release_session(key.0.ip());
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

    /// Puts a connection's current deadline in the timer queue if it is stale.
    fn refresh_timer(&mut self, idx: u32) {
        let Some(slot) = self.slots.get_mut(idx as usize) else {
            return;
        };
        if !slot.timer_stale {
            return;
        }
        slot.timer_stale = false;
        let t = slot.conn.as_ref().and_then(Connection::poll_timeout);
        if t != self.timers.deadline(idx) {
            self.timers.set(idx, t);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A router that leaves no random bit in its part of the ids (a runtime worker's router
    /// writes only its index and tag flag there, as this one does).
    #[derive(Debug)]
    struct Fixed;
    impl Router for Fixed {
        fn connection_id_bits(&mut self, _random: u32) -> u32 {
            0x0001_0100
        }
    }

    fn fixed_endpoint(seed: u64) -> Endpoint {
        let mut ep = Endpoint::new(EndpointConfig::default(), Instant::now(), seed);
        ep.set_router(Box::new(Fixed));
        ep
    }

    /// A slot reused again and again gives each of its connections a new id, so a handle of
    /// an earlier one never names a later one, and a reset captured for an earlier one ends no
    /// later one (before, the id of a slot came back after 4,096 reuses whenever its few random
    /// bits did: once in 128 on a runtime worker).
    #[test]
    fn a_reused_slot_never_repeats_an_id() {
        let mut ep = fixed_endpoint(1);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..20_000 {
            let (idx, cid) = ep.alloc().expect("a slot");
            assert_eq!(idx, 0, "the one freed slot is reused");
            assert_eq!(ep.slot_of(cid.0), 0);
            assert_eq!(
                cid.0 >> 32 & u64::from(ROUTER_BITS),
                0x100,
                "the router's bits"
            );
            assert!(seen.insert(cid), "id {cid:?} repeated");
            ep.free.push_back(idx);
        }
    }

    /// A restarted server (another endpoint, seeded anew) issues none of the ids of its earlier
    /// boots, whatever the router leaves random: the slot mask and the id key are drawn per
    /// endpoint. Before, each (slot, reuse count) of a runtime worker had 128 possible ids, so a
    /// restarted server soon gave its first sessions ids of earlier boots, and the resets an
    /// attacker collected for those ended the new sessions.
    #[test]
    fn a_restarted_endpoint_repeats_no_id_of_an_earlier_boot() {
        let mut seen = std::collections::HashSet::new();
        for boot in 0..100u64 {
            let mut ep = fixed_endpoint(1000 + boot);
            for k in 0..200 {
                let (idx, cid) = ep.alloc().expect("a slot");
                assert_eq!(ep.slot_of(cid.0), idx as usize);
                assert!(
                    seen.insert(cid),
                    "boot {boot}, id {k}: {cid:?} was issued before"
                );
                if k % 2 == 0 {
                    ep.free.push_back(idx);
                }
            }
        }
    }

    /// Freed slots are reused oldest first, spreading reuses over all of them.
    #[test]
    fn freed_slots_are_reused_oldest_first() {
        let mut ep = Endpoint::new(EndpointConfig::default(), Instant::now(), 1);
        let a = ep.alloc().expect("a slot").0;
        let b = ep.alloc().expect("a slot").0;
        ep.free.push_back(a);
        ep.free.push_back(b);
        assert_eq!(ep.alloc().map(|x| x.0), Some(a));
        ep.free.push_back(a);
        assert_eq!(ep.alloc().map(|x| x.0), Some(b));
    }
}
