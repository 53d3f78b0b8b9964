//! The RUDP server: the sans-IO [`Endpoint`] on the thread-per-core runtime.
//!
//! Per-core: each worker owns an endpoint (its sessions, their timers and buffers) and a handler.
//! A new session goes to the worker holding the fewest ([`Placement`]): the challenge's cookie
//! names it, the client's cookie echo carries the name back, and the session's connection ids
//! carry it from then on. On Linux the sockets' reuseport BPF program reads those bytes, so
//! every datagram of a session reaches its worker directly, even after the client's address
//! changes; elsewhere a datagram that lands on the wrong worker is forwarded to the owner
//! ([`Server::forwarded`]). A handler reaches a session on another worker through that
//! worker's command queue.
//!
//! Shared: one endpoint behind a lock, served by every thread (the baseline).
//!
//! Clients are admitted by connect token (see [`ricochet_proto::token`]): the game's backend
//! seals tokens with a [`TokenKey`] it shares with its servers, and the server checks them
//! without contacting anyone. [`Handler::on_accept`] sees who connects (client id, the token's
//! user data, address) before the session exists and may refuse them.
//! [`ServerConfig::insecure`] admits anyone who proves their address: LAN play and local tests
//! only. A server must choose one of the two.
//!
//! ```no_run
//! use bytes::Bytes;
//! use ricochet::runtime::{Handler, Server, ServerConfig, ServerContext, SessionId};
//! use ricochet::TokenKey;
//!
//! struct Echo;
//! impl Handler for Echo {
//!     fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
//!         let _ = ctx.send(s, channel, data);
//!     }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let key = TokenKey::from_bytes([7; 32]); // the backend's key, from your secret store
//! let config = ServerConfig::new("0.0.0.0:7777".parse()?)
//!     .tokens(key, 0x1234) // the key and the game's protocol id
//!     .public_address("203.0.113.5:7777".parse()?); // where clients reach it
//! let server = Server::start(config, |_| Echo)?;
//! println!("serving on {}", server.local_addr());
//! # server.shutdown()?;
//! # Ok(())
//! # }
//! ```

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ricochet_platform::{self as platform, BackendKind, SocketInfo, Waker};

use ricochet_proto::token::{TokenKey, TAG_LEN};
use ricochet_proto::{
    Admission, ChannelKind, CloseReason, Config, ConnectionHandle, ConnectionStats, DropCause,
    Endpoint, EndpointConfig, EndpointStats, Event, LedgerRefusal, Peer, PrefetchStage, Recorded,
    Refusal, SendError, ServerConfig as ListenConfig, TokenAdmission, TokenLedger, UsedTokens,
};

use super::config::{CorePinning, IdleStrategy, IoModel, UdpServerConfig};
use super::counters::WorkerCounters;
use super::error::RuntimeError;
use super::placement::{
    steer_rules, worker_of_datagram, CountingRouter, Placement, SessionLimits, WorkerRouter,
};
use super::rtt::{self, RttPercentiles, WorkerRtt};
use super::worker::{Service, UdpContext, WorkerSet};
use crate::profile::{with_channels, Profile};
use crate::stats::SessionStats;

/// A session: the worker (endpoint) that owns it and its connection handle there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId {
    /// The owning worker (always 0 in the shared IO model: one endpoint).
    pub worker: u32,
    /// The connection on that worker's endpoint.
    pub handle: ConnectionHandle,
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{:016x}", self.worker, self.handle.0)
    }
}

/// Configuration of a [`Server`]: start from [`ServerConfig::new`] and change what you need with
/// the builder methods; the fields stay open for tuning beyond them.
///
/// ```
/// use std::time::Duration;
/// use ricochet::{ChannelKind, Profile, ServerConfig};
///
/// let config = ServerConfig::new("0.0.0.0:7777".parse().unwrap())
///     .tokens(ricochet::TokenKey::from_bytes([7; 32]), 0x1234)
///     .public_address("203.0.113.5:7777".parse().unwrap())
///     .profile(Profile::Game)
///     .channels([ChannelKind::ReliableOrdered, ChannelKind::UnreliableSequenced])
///     .max_sessions(2_000)
///     .tick(Duration::from_millis(16));
/// # let _ = config;
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Sockets, IO model, workers, backend, idle strategy, tick.
    pub udp: UdpServerConfig,
    /// Protocol settings (connection config, session limits, handshake limits, budgets).
    /// Its `server.admission` is replaced by [`ServerConfig::admission`] when the server
    /// starts.
    pub endpoint: EndpointConfig,
    /// How clients are admitted: by connect token ([`ServerConfig::tokens`]) or insecurely
    /// ([`ServerConfig::insecure`]). No default: [`Server::start`] refuses a config that does
    /// not say.
    pub admission: Option<Admission>,
    /// With token admission: the addresses clients reach this server at, as the backend lists
    /// them in tokens. Empty: the bound address (port 0 resolved), which needs a bind address
    /// that names an IP; behind NAT or a load balancer, set the outside address.
    pub public_addresses: Vec<SocketAddr>,
    /// With token admission: the used tokens the server remembers
    /// ([`ServerConfig::used_token_capacity`]); `None` keeps the admission's own
    /// ([`TokenAdmission::used_token_capacity`], 65,536 by default).
    pub used_token_capacity: Option<usize>,
    /// Seed for connection ids, cookie keys and the server random of every session's packet
    /// keys; `None` (the default, and the only setting for production) draws 32 bytes from the
    /// OS per worker. A fixed seed makes a run reproducible, and with it the server randoms:
    /// a server restarted with the same seed (or two servers given the same one) would bind
    /// sessions from one connect token to the same values again. Tests only.
    pub seed: Option<u64>,
}

impl ServerConfig {
    /// Defaults for a server on `bind`: per-core, one worker per core, [`Profile::Default`].
    /// Say how clients are admitted before starting it: [`Self::tokens`] or [`Self::insecure`].
    ///
    /// An IPv6 `bind` (`[::]:7777`) serves IPv6 only (its sockets are IPv6-only, so IPv4
    /// players do not arrive as mapped addresses). To serve both families, start a server per
    /// family on the same port and list both addresses in the tokens: a client tries them in
    /// the token's order and changes its socket's family as it goes. Each of the two servers
    /// keeps its own table of used tokens, so one token can open a session at each.
    pub fn new(bind: SocketAddr) -> Self {
        ServerConfig {
            udp: UdpServerConfig::new(bind),
            endpoint: EndpointConfig::default()
                .with(|c| c.server = Some(ListenConfig::new(Admission::Insecure))),
            admission: None,
            public_addresses: Vec::new(),
            used_token_capacity: None,
            seed: None,
        }
    }

    /// Admit clients by connect token sealed with the backend's `key` for the game's
    /// `protocol_id` (the production mode). Tokens must list one of the server's
    /// [public addresses](Self::public_address).
    pub fn tokens(mut self, key: TokenKey, protocol_id: u64) -> Self {
        self.admission = Some(Admission::Tokens(TokenAdmission::new(
            key,
            protocol_id,
            Vec::new(),
        )));
        self
    }

    /// Admit anyone who proves their address, without tokens, and protect no packet. For LAN
    /// play and local tests only: whoever sees the traffic can close, hijack or inject into
    /// any session.
    pub fn insecure(mut self) -> Self {
        self.admission = Some(Admission::Insecure);
        self
    }

    /// An address clients reach this server at, as the backend lists it in tokens (add one
    /// per address; by default the bound address, which must then name an IP).
    pub fn public_address(mut self, addr: SocketAddr) -> Self {
        self.public_addresses.push(addr);
        self
    }

    /// Tune every session for `profile` (clients should use the same one). Replaces every
    /// session setting except the channels, so call it before `.session(..)`, whose changes
    /// it would otherwise undo.
    pub fn profile(self, profile: Profile) -> Self {
        self.session(|c| *c = with_channels(profile.config(), c))
    }

    /// The channels every session has, by id (clients must list the same kinds in the same
    /// order). Default: reliable-ordered, reliable-unordered, unreliable, unreliable-sequenced.
    ///
    /// Nothing checks this at connect time. A side that receives a message on a channel id it
    /// does not have drops the whole packet as a protocol violation, counted in its
    /// [`EndpointStats`] drops, and does not acknowledge it. Other messages in that packet are
    /// dropped with it, and the sender keeps retransmitting the reliable ones. If none of the
    /// sender's packets is acknowledged for the idle timeout, the session closes with
    /// [`CloseReason::IdleTimeout`]. Channels of different kinds under the same id are not
    /// detected at all. With token admission, put the channel layout's version into the
    /// `protocol_id` ([`Self::tokens`]): the backend then issues each client build a token
    /// for its own layout, and a server refuses a token for another layout at connect, as
    /// [`CloseReason::TokenInvalid`].
    pub fn channels(self, kinds: impl IntoIterator<Item = ChannelKind>) -> Self {
        let kinds: Vec<ChannelKind> = kinds.into_iter().collect();
        self.session(|c| c.channels = kinds)
    }

    /// Change any protocol setting of every session (see [`Config`]).
    pub fn session(mut self, tune: impl FnOnce(&mut Config)) -> Self {
        tune(Arc::make_mut(&mut self.endpoint.connection));
        self
    }

    /// Worker threads; 0 (the default) means one per available core. Players are split
    /// across the workers, and each worker's [`Handler`] sees only its own players, so a game
    /// that keeps one world per process sets 1 (see [`Handler`]).
    pub fn workers(mut self, workers: usize) -> Self {
        self.udp.io_threads = workers;
        self
    }

    /// The IO model ([`IoModel::PerCore`] by default).
    pub fn io_model(mut self, io_model: IoModel) -> Self {
        self.udp.io_model = io_model;
        self
    }

    /// The datagram I/O backend (automatic by default: io_uring where it can be set up, else
    /// epoll with `recvmmsg`/`sendmmsg`, kqueue on macOS). A non-empty `RICOCHET_BACKEND`
    /// environment variable overrides it, and a value that names no backend makes
    /// [`Server::start`] fail.
    pub fn backend(mut self, backend: BackendKind) -> Self {
        self.udp.backend.kind = backend;
        self
    }

    /// What idle workers do ([`IdleStrategy::Balanced`] by default).
    pub fn idle(mut self, idle: IdleStrategy) -> Self {
        self.udp.idle = idle;
        self
    }

    /// Whether workers are pinned to cores ([`CorePinning::Auto`] by default: only when the
    /// machine has more cores than workers, so the application's own threads keep a core).
    /// Running several server processes on one host? Each pins from the first core of its
    /// CPU mask, so give each its own CPUs or choose [`CorePinning::Never`].
    pub fn pinning(mut self, pinning: CorePinning) -> Self {
        self.udp.pinning = pinning;
        self
    }

    /// Call [`Handler::on_tick`] every `tick` on every worker.
    ///
    /// A tick-driven game server usually wants `.idle(IdleStrategy::Tick)` with it (see its
    /// costs there, and measure with `bench game`): each worker sleeps
    /// until its tick and reads every datagram that came meanwhile in one go, so it wakes once
    /// per tick instead of once per input, and the ACKs of the players' reliable inputs ride
    /// that tick's snapshots (one datagram each way per player per tick, about half the
    /// server's sends otherwise). An input waits up to a tick before the server reads it,
    /// which the game would have waited anyway for its next tick; the players' RTT estimates
    /// include that wait.
    ///
    /// With another idle strategy the ACKs can still ride the snapshots by being held up to a
    /// tick: `.session(|c| { c.max_ack_delay = tick + Duration::from_millis(1); c.ack_frequency
    /// = 8 })`. The ACK reports the hold and the players' RTT estimates grow by it, so a lost
    /// input is resent up to a tick later.
    pub fn tick(mut self, tick: Duration) -> Self {
        self.udp.tick = Some(tick);
        self
    }

    /// With token admission: how many used tokens the server remembers, to accept each token
    /// once (default 65,536, about 90 bytes each). Size it for the peak handshakes per second
    /// times the token lifetime the backend issues; when it is full, the token that expires
    /// soonest is forgotten first ([`EndpointStats::tokens_evicted`] counts them).
    /// [`Server::start`] refuses it for an insecure server, and refuses 0.
    pub fn used_token_capacity(mut self, tokens: usize) -> Self {
        self.used_token_capacity = Some(tokens);
        self
    }

    /// Sessions this server holds at most, counted over all its workers (default 16,384);
    /// clients beyond are refused with [`CloseReason::ServerFull`].
    pub fn max_sessions(mut self, sessions: usize) -> Self {
        self.listen().max_sessions = sessions;
        self
    }

    /// Sessions from one IP address at most, counted over all workers (default 2,048: players
    /// behind one NAT share an address); more are refused with
    /// [`CloseReason::TooManyFromAddress`].
    pub fn max_sessions_per_address(mut self, sessions: usize) -> Self {
        self.listen().max_sessions_per_address = sessions;
        self
    }

    /// Cookie echoes (the handshake packet that proves the sender's address; one per connect
    /// plus retries) accepted per source IP per second, per worker (default 4,096): what a crowd
    /// behind one address connecting at once needs. Hellos are not counted, so a spoofer of a
    /// player's address cannot use up the player's budget.
    pub fn max_handshakes_per_address(mut self, packets: u32) -> Self {
        self.listen().max_handshakes_per_address = packets;
        self
    }

    /// Seed connection ids, cookie keys and session randoms from `seed` (reproducible tests
    /// only: see the `seed` field); by default each worker draws 32 bytes from the OS.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    fn listen(&mut self) -> &mut ListenConfig {
        // The admission written here is a placeholder: `start` puts `self.admission` in.
        self.endpoint
            .server
            .get_or_insert_with(|| ListenConfig::new(Admission::Insecure))
    }
}

/// Game-server code: one instance per worker, called on that worker's thread.
///
/// With several workers (the default is one per core), players are split across them: each
/// new session goes to the worker holding the fewest. An instance sees only its worker's
/// players. [`ServerContext::sessions`] lists that worker's sessions, so a broadcast over it
/// reaches only them, and [`Handler::on_tick`] runs once per worker. A game with one world per
/// process sets `.workers(1)` ([`ServerConfig::workers`]). Otherwise, state the workers
/// share goes in an `Arc` (with a lock) that the factory given to [`Server::start`] clones
/// into each instance.
///
/// A handler that panics ends its worker, and nothing restarts it. The other workers carry on.
/// The dead worker's sessions get no more answers, so their clients close with
/// [`CloseReason::IdleTimeout`]; they no longer count against [`ServerConfig::max_sessions`].
/// [`Server::is_running`] turns false, [`Server::serve_until_signal`] notices and shuts the
/// server down, and [`Server::shutdown`] returns the panic ([`RuntimeError::WorkerPanicked`]).
pub trait Handler: Send + 'static {
    /// A client passed every check of the handshake (its token, its address); the session
    /// does not exist yet. Return `Err` to refuse it: the client receives the refusal's code
    /// and message ([`CloseReason::Rejected`]). Accepts everyone by default.
    fn on_accept(&mut self, ctx: &mut ServerContext<'_>, peer: &Peer) -> Result<(), Refusal> {
        let _ = (ctx, peer);
        Ok(())
    }

    /// A client completed the handshake: `session` is who [`Handler::on_accept`] accepted.
    fn on_connect(&mut self, ctx: &mut ServerContext<'_>, session: SessionId, peer: &Peer) {
        let _ = (ctx, session, peer);
    }

    /// A complete message arrived on `channel`.
    fn on_message(
        &mut self,
        ctx: &mut ServerContext<'_>,
        session: SessionId,
        channel: u8,
        data: Bytes,
    );

    /// A session ended; `by_peer` is true when the client decided it.
    fn on_disconnect(
        &mut self,
        ctx: &mut ServerContext<'_>,
        session: SessionId,
        reason: CloseReason,
        by_peer: bool,
    ) {
        let _ = (ctx, session, reason, by_peer);
    }

    /// Called on each worker every [`UdpServerConfig::tick`], on a fixed grid: a late tick
    /// does not delay the next, and a tick whose time passed while the worker was busy is
    /// skipped rather than run late. [`ServerContext::tick_index`] tells which tick this is
    /// (its indices jump over skipped ones).
    fn on_tick(&mut self, ctx: &mut ServerContext<'_>) {
        let _ = ctx;
    }
}

/// The used-token table the endpoints of a per-core server share: a token is accepted once
/// whichever worker its handshake reaches. Locked once per cookie echo that passes every
/// other check, to record the token; never for a hello or a session packet.
#[derive(Debug, Clone)]
struct SharedLedger(Arc<Mutex<UsedTokens>>);

impl SharedLedger {
    fn table(&self) -> MutexGuard<'_, UsedTokens> {
        // Nothing panics while holding it (the table's methods do not); carry on if it did.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl TokenLedger for SharedLedger {
    fn record(
        &mut self,
        tag: &[u8; TAG_LEN],
        expires_unix: u64,
        now_unix: u64,
        claimant: u64,
    ) -> Result<Recorded, LedgerRefusal> {
        self.table().record(tag, expires_unix, now_unix, claimant)
    }
}

/// Time since the Unix epoch, for token expiry (zero if the clock is before 1970).
fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
}

/// How often a worker re-reads the wall clock for its endpoint.
const UNIX_REFRESH: Duration = Duration::from_secs(10);

/// A request for another worker, carried by its queue.
enum Command {
    Send {
        handle: ConnectionHandle,
        channel: u8,
        data: Bytes,
    },
    Close {
        handle: ConnectionHandle,
        reason: CloseReason,
    },
    /// A datagram that arrived on another worker's socket for one of this worker's sessions.
    Datagram { from: SocketAddr, bytes: Vec<u8> },
}

/// One worker's queue, as seen by the others.
#[derive(Clone)]
struct Mailbox {
    tx: Sender<Command>,
    waker: Waker,
    /// Bytes of forwarded datagrams in the queue, which [`FORWARD_QUEUE_BYTES`] bounds.
    forward_bytes: Arc<AtomicUsize>,
}

/// Most bytes of forwarded datagrams one worker's queue holds. What is forwarded is chosen
/// by bytes of a datagram nobody has authenticated yet, so a flood that names a busy worker
/// must not grow its queue without bound: past this, such datagrams are dropped and counted
/// ([`Server::forward_drops`]), as a full socket buffer would drop them.
const FORWARD_QUEUE_BYTES: usize = 4 << 20;

/// What one queued forwarded datagram counts against [`FORWARD_QUEUE_BYTES`]: its bytes and
/// the queue entry's own.
fn forward_cost(len: usize) -> usize {
    len + std::mem::size_of::<Command>()
}

/// Where the workers' mailboxes are published once every worker is up.
type Directory = Arc<std::sync::OnceLock<Vec<Mailbox>>>;

/// What handlers may do: send to and close sessions (on any worker), read session stats.
pub struct ServerContext<'a> {
    worker: u32,
    now: Instant,
    endpoint: &'a mut Endpoint,
    directory: &'a Directory,
    sessions: &'a HashSet<ConnectionHandle>,
    /// The index of the tick being run ([`Handler::on_tick`] only).
    tick: Option<u64>,
}

impl ServerContext<'_> {
    /// Queue a message to `session` on `channel`. A session on another worker is reached
    /// through that worker's queue, and the result then only says the request was queued. If
    /// the session has gone or its send queue is full when that worker takes the request, the
    /// message is dropped, and [`Server::remote_send_drops`] counts it.
    /// [`SendError::UnknownConnection`] comes back only if that worker has stopped or does not
    /// exist.
    pub fn send(
        &mut self,
        session: SessionId,
        channel: u8,
        data: impl Into<Bytes>,
    ) -> Result<(), SendError> {
        let data = data.into();
        if session.worker == self.worker {
            return self.endpoint.send(session.handle, channel, data);
        }
        self.post(
            session.worker,
            Command::Send {
                handle: session.handle,
                channel,
                data,
            },
        )
    }

    /// Close `session` gracefully; both sides learn `CloseReason::Application`.
    pub fn close(&mut self, session: SessionId) {
        if session.worker == self.worker {
            self.endpoint
                .close(self.now, session.handle, CloseReason::Application);
        } else {
            let _ = self.post(
                session.worker,
                Command::Close {
                    handle: session.handle,
                    reason: CloseReason::Application,
                },
            );
        }
    }

    fn post(&self, worker: u32, cmd: Command) -> Result<(), SendError> {
        post(self.directory, worker, cmd)
    }

    /// Counters and path estimates of a session on this worker (RTT, loss, retransmissions,
    /// congestion window); `None` for an unknown session or one owned by another worker.
    pub fn session_stats(&self, session: SessionId) -> Option<SessionStats> {
        self.session_detail(session).map(|d| SessionStats::from(&d))
    }

    /// Every counter the protocol core keeps for a session on this worker (for benchmarks
    /// and diagnostics; its shape follows the protocol core, not this crate's API promise).
    #[doc(hidden)]
    pub fn session_detail(&self, session: SessionId) -> Option<ConnectionStats> {
        if session.worker != self.worker {
            return None;
        }
        self.endpoint.connection(session.handle).map(|c| c.stats())
    }

    /// Bytes queued but not yet sent to `session` (its send-queue depth), if it is local.
    pub fn queued_bytes(&self, session: SessionId) -> Option<usize> {
        if session.worker != self.worker {
            return None;
        }
        self.endpoint
            .connection(session.handle)
            .map(|c| c.queued_bytes())
    }

    /// The connected sessions this worker owns (for broadcasts). Other workers' sessions are
    /// not listed: with several workers, a broadcast over this reaches only this worker's
    /// players.
    pub fn sessions(&self) -> impl Iterator<Item = SessionId> + '_ {
        let worker = self.worker;
        self.sessions
            .iter()
            .map(move |&handle| SessionId { worker, handle })
    }

    /// This worker's endpoint counters (drops by cause, handshakes, connections).
    pub fn endpoint_stats(&self) -> &EndpointStats {
        self.endpoint.stats()
    }

    /// The worker this handler runs on.
    pub fn worker(&self) -> u32 {
        self.worker
    }

    /// The time the current loop turn started.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// In [`Handler::on_tick`], the index of the tick being run: tick `k` was due at the
    /// worker's start plus `k` × [`ServerConfig::tick`], the first is 1. A tick that came too
    /// late to run before the next was due is skipped, not run late back to back (counted in
    /// [`WorkerCounters::ticks_skipped`](super::WorkerCounters::ticks_skipped)), so the
    /// indices then jump: a fixed-step simulation advances by the difference from the last
    /// index it saw. `None` outside `on_tick`.
    pub fn tick_index(&self) -> Option<u64> {
        self.tick
    }
}

/// Queue `cmd` on `worker`'s mailbox and wake it; `UnknownConnection` when that worker does
/// not exist or has stopped.
fn post(directory: &Directory, worker: u32, cmd: Command) -> Result<(), SendError> {
    let mailbox = directory
        .get()
        .and_then(|d| d.get(worker as usize))
        .ok_or(SendError::UnknownConnection)?;
    mailbox
        .tx
        .send(cmd)
        .map_err(|_| SendError::UnknownConnection)?;
    let _ = mailbox.waker.wake();
    Ok(())
}

/// An endpoint and the connected sessions it holds (for broadcasts and the stop sequence).
struct Core {
    endpoint: Endpoint,
    sessions: HashSet<ConnectionHandle>,
}

/// The endpoint a worker drives: its own (per-core) or the one every thread shares.
enum EndpointSlot {
    Owned(Box<Core>),
    Shared(Arc<Mutex<Core>>),
}

enum EndpointGuard<'a> {
    Owned(&'a mut Core),
    Shared(MutexGuard<'a, Core>),
}

impl std::ops::Deref for EndpointGuard<'_> {
    type Target = Core;
    fn deref(&self) -> &Core {
        match self {
            EndpointGuard::Owned(e) => e,
            EndpointGuard::Shared(g) => g,
        }
    }
}

impl std::ops::DerefMut for EndpointGuard<'_> {
    fn deref_mut(&mut self) -> &mut Core {
        match self {
            EndpointGuard::Owned(e) => e,
            EndpointGuard::Shared(g) => g,
        }
    }
}

impl EndpointSlot {
    fn lock(&mut self) -> EndpointGuard<'_> {
        match self {
            EndpointSlot::Owned(e) => EndpointGuard::Owned(e),
            // A handler that panicked while holding the lock poisons it; the endpoint's own
            // state is still consistent (no partial updates span a callback), so carry on.
            EndpointSlot::Shared(m) => {
                EndpointGuard::Shared(m.lock().unwrap_or_else(|p| p.into_inner()))
            }
        }
    }
}

/// Room for one outgoing datagram (any UDP payload), reserved in the send batch as it is written.
const TRANSMIT_BUF: usize = 65_536;
/// RTT samples an endpoint keeps between two turns of its worker (which drains them).
const RTT_SAMPLE_BUFFER: usize = 8192;

struct RudpService<H> {
    worker: u32,
    workers: u32,
    endpoint: EndpointSlot,
    /// When the endpoint was last told the wall-clock time.
    unix_at: Instant,
    handler: H,
    inbox: Receiver<Command>,
    directory: Directory,
    stopping: bool,
    /// Datagrams this server's workers handed to another worker (all workers share it).
    forwarded: Arc<AtomicU64>,
    /// Datagrams for another worker dropped because its queue was full (shared too).
    forward_drops: Arc<AtomicU64>,
    /// Messages other workers' handlers sent to this worker's sessions that it could not
    /// queue (shared too).
    remote_send_drops: Arc<AtomicU64>,
    /// Bytes of forwarded datagrams in this worker's own queue (its mailbox's count).
    inbox_bytes: Arc<AtomicUsize>,
    /// How long a shutdown may wait for the sessions' closes: a close first lingers for its
    /// reliable data to be acknowledged (`Config::close_linger`).
    stop_limit: Duration,
    /// This worker's RTT histogram (fed from the endpoint's samples every turn).
    rtt: WorkerRtt,
}

impl<H: Handler> RudpService<H> {
    /// Apply queued commands, run due timers, deliver events, then write every datagram the
    /// endpoint wants to send into the worker's batch.
    fn pump(&mut self, ctx: &mut UdpContext<'_>) {
        self.deliver(ctx.now());
        self.transmit(ctx);
    }

    /// Run the inbox and due timers, and hand every pending event to the handler.
    fn deliver(&mut self, now: Instant) {
        let mut guard = self.endpoint.lock();
        let core = &mut *guard;
        let ep = &mut core.endpoint;
        if now.saturating_duration_since(self.unix_at) >= UNIX_REFRESH {
            self.unix_at = now;
            ep.set_unix_time(now, unix_now());
        }
        while let Ok(cmd) = self.inbox.try_recv() {
            match cmd {
                Command::Send {
                    handle,
                    channel,
                    data,
                } => {
                    // The sender was told the message was queued; a refusal here (session gone,
                    // queue full) is what a local send would have returned: counted.
                    if ep.send(handle, channel, data).is_err() {
                        self.remote_send_drops.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Command::Close { handle, reason } => ep.close(now, handle, reason),
                Command::Datagram { from, bytes } => {
                    self.inbox_bytes
                        .fetch_sub(forward_cost(bytes.len()), Ordering::Relaxed);
                    let _ = ep.handle_datagram(now, from, &bytes);
                }
            }
        }
        if ep.poll_timeout().is_some_and(|t| t <= now) {
            ep.handle_timeout(now);
        }
        self.rtt.record(ep.drain_rtt_samples());
        // Handlers send from their callbacks; new events only come from I/O and timers, so one
        // pass over the events then one over the transmits is enough.
        while let Some((handle, event)) = ep.poll_event() {
            let session = SessionId {
                worker: self.worker,
                handle,
            };
            let mut peer = None;
            match &event {
                Event::Connected => {
                    core.sessions.insert(handle);
                    peer = ep.connection(handle).and_then(|c| c.peer()).cloned();
                }
                Event::Closed { .. } => {
                    core.sessions.remove(&handle);
                }
                Event::Message { .. } | Event::Incoming(_) => {}
            }
            let mut sctx = ServerContext {
                worker: self.worker,
                now,
                endpoint: ep,
                directory: &self.directory,
                sessions: &core.sessions,
                tick: None,
            };
            match event {
                Event::Incoming(peer) => {
                    // Accepting queues `Connected`, which this loop delivers next.
                    match self.handler.on_accept(&mut sctx, &peer) {
                        Ok(()) => ep.accept(handle),
                        Err(refusal) => ep.refuse(handle, &refusal),
                    }
                }
                Event::Connected => {
                    // Every server connection knows its peer; the fallback is unreachable.
                    let peer = peer.unwrap_or_else(|| Peer {
                        address: SocketAddr::from(([0, 0, 0, 0], 0)),
                        client_id: None,
                        user_data: Bytes::new(),
                    });
                    self.handler.on_connect(&mut sctx, session, &peer)
                }
                Event::Message { channel, data } => {
                    self.handler.on_message(&mut sctx, session, channel, data)
                }
                Event::Closed {
                    reason, by_peer, ..
                } => self
                    .handler
                    .on_disconnect(&mut sctx, session, reason, by_peer),
            }
        }
    }

    /// Write every datagram the endpoint has due straight into the worker's send batch.
    fn transmit(&mut self, ctx: &mut UdpContext<'_>) {
        let now = ctx.now();
        let mut guard = self.endpoint.lock();
        let ep = &mut guard.endpoint;
        loop {
            let sent = ctx.send_in_place(TRANSMIT_BUF, |buf| {
                ep.poll_transmit(now, buf).map(|t| (t.destination, t.size))
            });
            match sent {
                Ok(Some(_)) => {}
                Ok(None) => break,
                // Oversize: the context counted it; ARQ repairs what it carried.
                Err(platform::Error::PayloadTooLarge { .. }) => {}
                // No room (the batch is full and a flush freed nothing): the datagram was not
                // written and stays queued in the endpoint, whose timer is then due at once,
                // so the next turn sends it.
                Err(_) => break,
            }
        }
    }

    /// The worker that should handle `datagram` (the owner its connection id names, or the
    /// worker a placed cookie echo names), if it is another one. Steering normally delivers
    /// these to their worker already; this catches what it could not (no BPF program).
    fn owner_of(&self, datagram: &[u8]) -> Option<u32> {
        if self.workers <= 1 {
            return None;
        }
        let owner = u32::from(worker_of_datagram(datagram)?);
        (owner != self.worker && owner < self.workers).then_some(owner)
    }
}

impl<H: Handler> Service for RudpService<H> {
    fn on_datagram(&mut self, ctx: &mut UdpContext<'_>, from: SocketAddr, data: &[u8]) {
        let now = ctx.now();
        if let Some(owner) = self.owner_of(data) {
            // Not ours: steering could not route it (no BPF program on this system).
            if let Some(mailbox) = self.directory.get().and_then(|d| d.get(owner as usize)) {
                let cost = forward_cost(data.len());
                let queued = mailbox.forward_bytes.fetch_add(cost, Ordering::Relaxed);
                if queued + cost > FORWARD_QUEUE_BYTES {
                    mailbox.forward_bytes.fetch_sub(cost, Ordering::Relaxed);
                    self.forward_drops.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                let bytes = data.to_vec();
                if mailbox.tx.send(Command::Datagram { from, bytes }).is_ok() {
                    let _ = mailbox.waker.wake();
                    self.forwarded.fetch_add(1, Ordering::Relaxed);
                } else {
                    // The owner has stopped: nothing will take the bytes back out.
                    mailbox.forward_bytes.fetch_sub(cost, Ordering::Relaxed);
                }
            }
            return;
        }
        let result = self
            .endpoint
            .lock()
            .endpoint
            .handle_datagram(now, from, data);
        if let Err(DropCause::UnknownConnection) = result {
            tracing::trace!(%from, "datagram for an unknown connection dropped");
        }
    }

    fn prefetch(&self, data: &[u8], stage: PrefetchStage) {
        // Only an endpoint of its own (taking the shared one's lock costs more than a hint
        // saves), and only for a datagram this worker keeps.
        if let EndpointSlot::Owned(core) = &self.endpoint {
            if self.owner_of(data).is_none() {
                core.endpoint.prefetch_for(data, stage);
            }
        }
    }

    fn on_tick(&mut self, ctx: &mut UdpContext<'_>) {
        let now = ctx.now();
        // Messages read in this turn reach the handler before its tick (with the tick idle
        // strategy every input is read in the tick's turn); their ACKs leave with the tick's
        // sends at the turn's end.
        self.deliver(now);
        let mut guard = self.endpoint.lock();
        let core = &mut *guard;
        let mut sctx = ServerContext {
            worker: self.worker,
            now,
            endpoint: &mut core.endpoint,
            directory: &self.directory,
            sessions: &core.sessions,
            tick: ctx.tick_index(),
        };
        self.handler.on_tick(&mut sctx);
    }

    fn on_turn_end(&mut self, ctx: &mut UdpContext<'_>) {
        self.pump(ctx);
    }

    fn next_deadline(&mut self) -> Option<Instant> {
        self.endpoint.lock().endpoint.poll_timeout()
    }

    fn on_stop(&mut self, ctx: &mut UdpContext<'_>) -> bool {
        if !self.stopping {
            self.stopping = true;
            let now = ctx.now();
            let mut guard = self.endpoint.lock();
            let core = &mut *guard;
            // A client that completes its handshake from now on is refused (`Shutdown`): a
            // session opened now would be left out of the closes below.
            core.endpoint.stop_accepting();
            for &handle in &core.sessions {
                core.endpoint.close(now, handle, CloseReason::Shutdown);
            }
            drop(guard);
            self.pump(ctx);
        }
        // Done once every session's close went out and its state was released.
        self.endpoint.lock().endpoint.connection_count() == 0
    }

    fn stop_limit(&self) -> Option<Duration> {
        Some(self.stop_limit)
    }
}

/// A running RUDP server. [`Server::shutdown`] closes every session with
/// [`CloseReason::Shutdown`] (clients learn why), waits for the closes to go out, then joins
/// the workers. Dropping the server does the same and blocks just as long, but throws away
/// the workers' counters and any worker's error.
///
/// A worker whose handler panics (or whose socket fails) ends on its own while the others
/// carry on, and nothing restarts it. Its clients stop hearing from the server and time out.
/// [`Server::serve_until_signal`] notices and shuts the server down, and [`Server::shutdown`]
/// returns the worker's error (see [`Handler`]).
pub struct Server {
    workers: WorkerSet,
    placement: Option<Placement>,
    forwarded: Arc<AtomicU64>,
    forward_drops: Arc<AtomicU64>,
    remote_send_drops: Arc<AtomicU64>,
    rtt: Vec<WorkerRtt>,
    limits: SessionLimits,
    directory: Directory,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("local_addr", &self.workers.local_addr)
            .field("io_model", &self.workers.io_model)
            .field("backend", &self.workers.backend_kind)
            .field("workers", &self.workers.len())
            .finish()
    }
}

impl Server {
    /// Bind, start the workers (each with its endpoint and `make_handler(i)`), return once
    /// every worker is up.
    pub fn start<H, F>(config: ServerConfig, mut make_handler: F) -> Result<Self, RuntimeError>
    where
        H: Handler,
        F: FnMut(usize) -> H,
    {
        let mut endpoint_cfg = config.endpoint.clone();
        let Some(mut admission) = config.admission.clone() else {
            return Err(RuntimeError::Config(
                "say how clients are admitted: ServerConfig::tokens(key, protocol_id) (connect \
                 tokens) or ServerConfig::insecure() (LAN play and local tests)"
                    .into(),
            ));
        };
        match (&mut admission, config.used_token_capacity) {
            (Admission::Tokens(t), Some(n)) => t.used_token_capacity = n,
            (Admission::Insecure, Some(_)) => {
                return Err(RuntimeError::Config(
                    "ServerConfig::used_token_capacity is for token admission; an insecure \
                     server accepts no tokens"
                        .into(),
                ));
            }
            (_, None) => {}
        }
        if let Admission::Tokens(t) = &mut admission {
            if t.used_token_capacity == 0 {
                return Err(RuntimeError::Config(
                    "TokenAdmission::used_token_capacity is 0: the server must remember at least \
                     one used token (size it for the peak handshakes per second times the token \
                     lifetime)"
                        .into(),
                ));
            }
            if t.public_addresses.is_empty() {
                t.public_addresses = config.public_addresses.clone();
            }
            if t.public_addresses.is_empty() && config.udp.bind.ip().is_unspecified() {
                return Err(RuntimeError::Config(format!(
                    "bound to {}: set the public address clients reach \
                     (ServerConfig::public_address, as the backend lists it in connect tokens)",
                    config.udp.bind
                )));
            }
        }
        endpoint_cfg
            .connection
            .validate()
            .map_err(|e| RuntimeError::Config(format!("{e} (ServerConfig::session)")))?;
        if endpoint_cfg.rtt_sample_buffer == 0 {
            // Drained every turn into the worker's histogram.
            endpoint_cfg.rtt_sample_buffer = RTT_SAMPLE_BUFFER;
        }
        let server = endpoint_cfg
            .server
            .get_or_insert_with(|| ListenConfig::new(Admission::Insecure));
        server.admission = admission;
        // The runtime asks the handler about every client (`Handler::on_accept`).
        server.accept_hook = true;
        let used_tokens = match &server.admission {
            Admission::Tokens(t) => Some(t.used_token_capacity),
            Admission::Insecure => None,
        };
        let n = config.udp.resolved_threads();
        if config.udp.io_model == IoModel::PerCore && n > 256 {
            let why = if config.udp.io_threads == 0 {
                " (one per CPU when workers are not set)"
            } else {
                ""
            };
            return Err(RuntimeError::Config(format!(
                "an RUDP server runs at most 256 per-core workers, not {n}{why}: set \
                 ServerConfig::workers"
            )));
        }
        let now = Instant::now();
        let unix = unix_now();
        let is_shared = config.udp.io_model == IoModel::Shared;
        let mut shared: Option<Arc<Mutex<Core>>> = None;
        let per_core_workers = if is_shared { 1 } else { n as u32 };
        // The session limits hold per server: every endpoint's router counts in this one table.
        let limits = SessionLimits::default();
        // Per-core: every worker's endpoint verifies the others' cookies (one secret, one
        // clock base), accepts each token once across all of them (one ledger), and places
        // sessions on the least-loaded worker; the sockets steer by the worker the packets
        // name.
        let per_core = !is_shared && n > 1;
        let placement = per_core.then(|| Placement::new(n));
        let cookie_secret: [u8; 32] = match config.seed {
            Some(s) => ChaCha8Rng::seed_from_u64(s ^ 0x636f_6f6b_6965_7321).random(),
            None => rand::rng().random(),
        };
        let ledger = used_tokens
            .filter(|_| per_core)
            .map(|cap| SharedLedger(Arc::new(Mutex::new(UsedTokens::new(cap)))));
        let steering = if per_core { steer_rules() } else { Vec::new() };
        let forwarded = Arc::new(AtomicU64::new(0));
        let forward_drops = Arc::new(AtomicU64::new(0));
        let remote_send_drops = Arc::new(AtomicU64::new(0));
        // A close lingers for its reliable data, then goes out; half a second more for that.
        let stop_limit = endpoint_cfg.connection.close_linger + Duration::from_millis(500);
        let mut inbox_bytes = Vec::with_capacity(n);
        let directory: Directory = Arc::new(std::sync::OnceLock::new());
        let mut senders = Vec::with_capacity(n);
        let mut rtts = Vec::with_capacity(n);
        let workers = WorkerSet::start(&config.udp, &steering, |i, local_addr| {
            let rtt = WorkerRtt::new();
            rtts.push(rtt.clone());
            let (tx, rx) = mpsc::channel();
            senders.push(tx);
            let queued = Arc::new(AtomicUsize::new(0));
            inbox_bytes.push(queued.clone());
            // With a port-0 bind, the public address gets the port the sockets were given.
            let mut endpoint_cfg = endpoint_cfg.clone();
            if let Some(Admission::Tokens(t)) =
                endpoint_cfg.server.as_mut().map(|s| &mut s.admission)
            {
                if t.public_addresses.is_empty() {
                    t.public_addresses = vec![local_addr];
                }
            }
            let endpoint = if is_shared {
                let core = shared.get_or_insert_with(|| {
                    let mut endpoint = super::new_endpoint(endpoint_cfg.clone(), now, config.seed);
                    endpoint.set_router(Box::new(CountingRouter::new(limits.clone())));
                    endpoint.set_unix_time(now, unix);
                    Arc::new(Mutex::new(Core {
                        endpoint,
                        sessions: HashSet::new(),
                    }))
                });
                EndpointSlot::Shared(core.clone())
            } else {
                let seed = config.seed.map(|s| s.wrapping_add(i as u64));
                let mut endpoint = super::new_endpoint(endpoint_cfg, now, seed);
                // Validated below 256 workers in `start`.
                endpoint.set_router(Box::new(WorkerRouter::new(
                    i as u8,
                    placement.clone(),
                    limits.clone(),
                )));
                endpoint.set_cookie_secret(now, cookie_secret);
                endpoint.set_unix_time(now, unix);
                if let Some(l) = &ledger {
                    endpoint.set_token_ledger(Box::new(l.clone()));
                }
                EndpointSlot::Owned(Box::new(Core {
                    endpoint,
                    sessions: HashSet::new(),
                }))
            };
            RudpService {
                // In the shared model every thread serves the one endpoint: sessions are "worker 0".
                worker: if is_shared { 0 } else { i as u32 },
                workers: per_core_workers,
                endpoint,
                unix_at: now,
                handler: make_handler(i),
                inbox: rx,
                directory: directory.clone(),
                stopping: false,
                forwarded: forwarded.clone(),
                forward_drops: forward_drops.clone(),
                remote_send_drops: remote_send_drops.clone(),
                inbox_bytes: queued,
                stop_limit,
                rtt,
            }
        })?;
        let mailboxes = senders
            .into_iter()
            .zip(workers.wakers())
            .zip(inbox_bytes)
            .map(|((tx, waker), forward_bytes)| Mailbox {
                tx,
                waker,
                forward_bytes,
            })
            .collect();
        // Only fails if already set, which cannot happen: this is the one place that sets it.
        let _ = directory.set(mailboxes);
        tracing::info!(
            addr = %workers.local_addr,
            io_model = %workers.io_model,
            workers = workers.len(),
            backend = %workers.backend_kind,
            "ricochet RUDP server started"
        );
        Ok(Server {
            workers,
            placement,
            forwarded,
            forward_drops,
            remote_send_drops,
            rtt: rtts,
            limits,
            directory,
        })
    }

    /// Queue a message to `session` on `channel` from outside the handlers: from a thread of
    /// the application's own (a host that drains events from its handlers' queues, as the C
    /// ABI does). The owning worker is woken and takes the message on its next turn, so the
    /// result only says it was queued, as for a [`ServerContext::send`] to another worker: a
    /// session that has ended by then, or whose send queue is full, drops it, and
    /// [`Server::remote_send_drops`] counts it. [`SendError::UnknownConnection`] comes back
    /// only if the owning worker has stopped or does not exist.
    pub fn send(
        &self,
        session: SessionId,
        channel: u8,
        data: impl Into<Bytes>,
    ) -> Result<(), SendError> {
        let cmd = Command::Send {
            handle: session.handle,
            channel,
            data: data.into(),
        };
        post(&self.directory, session.worker, cmd)
    }

    /// Close `session` gracefully from outside the handlers (see [`Server::send`]); both sides
    /// learn `CloseReason::Application`. Nothing happens if it has already ended.
    pub fn close(&self, session: SessionId) {
        let cmd = Command::Close {
            handle: session.handle,
            reason: CloseReason::Application,
        };
        let _ = post(&self.directory, session.worker, cmd);
    }

    /// Sessions each worker holds now (per-core with several workers; `None` otherwise, where
    /// one endpoint holds every session).
    pub fn sessions_per_worker(&self) -> Option<Vec<u32>> {
        let p = self.placement.as_ref()?;
        Some((0..p.workers()).map(|w| p.sessions(w)).collect())
    }

    /// Datagrams a worker received for another worker's session and forwarded to it. Near 0
    /// where the sockets' steering program routes by connection id (Linux); elsewhere it
    /// counts what the kernel's hash sent astray.
    pub fn forwarded(&self) -> u64 {
        self.forwarded.load(Ordering::Relaxed)
    }

    /// Datagrams a worker received for another worker's session and dropped instead of
    /// forwarding, because that worker's queue already held 4 MiB of them (it is stalled, or
    /// a flood names it). 0 in normal running.
    pub fn forward_drops(&self) -> u64 {
        self.forward_drops.load(Ordering::Relaxed)
    }

    /// Messages a handler sent to a session of another worker ([`ServerContext::send`]
    /// returned `Ok`: the message was queued for that worker) that the other worker then
    /// could not queue on the session: it had ended meanwhile, or its send queue was full.
    /// A local send would have returned that error; these are only counted.
    pub fn remote_send_drops(&self) -> u64 {
        self.remote_send_drops.load(Ordering::Relaxed)
    }

    /// Sessions the server holds now, over all its workers (what
    /// [`ServerConfig::max_sessions`] limits).
    pub fn session_count(&self) -> usize {
        self.limits.sessions()
    }

    /// RTT percentiles over every session of every worker since the server started (or since
    /// the last [`Server::take_rtt`]): each worker keeps one histogram of its sessions' RTT
    /// samples, merged here.
    pub fn rtt(&self) -> RttPercentiles {
        rtt::merge(&self.rtt, false)
    }

    /// Like [`Server::rtt`], and empties the histograms: the next call covers what came
    /// after this one (a measurement phase).
    pub fn take_rtt(&self) -> RttPercentiles {
        rtt::merge(&self.rtt, true)
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.workers.local_addr
    }

    /// The IO model in use.
    pub fn io_model(&self) -> IoModel {
        self.workers.io_model
    }

    /// The backend the workers use.
    pub fn backend_kind(&self) -> BackendKind {
        self.workers.backend_kind
    }

    /// Why that backend was chosen.
    pub fn selection_reason(&self) -> &str {
        &self.workers.selection_reason
    }

    /// Each socket's buffer sizes, requested and granted.
    pub fn socket_info(&self) -> &[SocketInfo] {
        &self.workers.socket_info
    }

    /// True while every worker runs. False once one has ended on its own: its handler
    /// panicked or its socket failed. Its sessions are gone with it (their clients see the
    /// server go silent) and the other workers carry on; [`Self::shutdown`] then returns
    /// why. A process that supervises its server polls this, as
    /// [`Self::serve_until_signal`] does, and restarts or exits.
    pub fn is_running(&self) -> bool {
        !self.workers.any_ended()
    }

    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Live runtime counters of every worker.
    pub fn counters(&self) -> Vec<WorkerCounters> {
        self.workers.counters()
    }

    /// Close every session with [`CloseReason::Shutdown`], wait for the closes to go out, then
    /// join the workers and return their counters. A close first lets the session's queued
    /// reliable data be acknowledged, for up to `close_linger` (2 s by default), so the wait is
    /// bounded by `close_linger` plus half a second: clients that stopped answering cost that
    /// much, not more.
    pub fn shutdown(mut self) -> Result<Vec<WorkerCounters>, RuntimeError> {
        self.workers.stop_and_join()
    }

    /// Serve until the process receives SIGINT (Ctrl-C) or SIGTERM (`kill`, `docker stop`, a
    /// Kubernetes pod ending), then [shut down](Server::shutdown): every client learns that
    /// the server left ([`CloseReason::Shutdown`]) instead of timing out. Blocks the calling
    /// thread; the workers serve on their own threads meanwhile. Returns early, with the
    /// worker's error, when a worker ends on its own (an I/O error, a panicking handler), so a
    /// supervisor sees the process fail and restarts it.
    ///
    /// The signal handlers stay installed when this returns: a second SIGINT or SIGTERM (during
    /// the shutdown, or after it) ends the process at once, with status 128 + the signal's
    /// number (130, 143), as a shell would report it.
    ///
    /// ```no_run
    /// # use ricochet::{Server, ServerConfig, ServerContext, SessionId, Handler, Bytes};
    /// # struct Echo;
    /// # impl Handler for Echo {
    /// #     fn on_message(&mut self, _: &mut ServerContext, _: SessionId, _: u8, _: Bytes) {}
    /// # }
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = ServerConfig::new("0.0.0.0:7777".parse()?).insecure();
    /// let server = Server::start(config, |_worker| Echo)?;
    /// let counters = server.serve_until_signal()?; // the process's main loop
    /// println!("served {} workers, shut down cleanly", counters.len());
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(unix)]
    pub fn serve_until_signal(self) -> Result<Vec<WorkerCounters>, RuntimeError> {
        self.serve_until_signal_then(|| {})
    }

    /// [`Server::serve_until_signal`], calling `listening` once the signal handlers are in
    /// place: a test that raises the signal itself must not raise it before (the default
    /// action would end the process).
    #[cfg(unix)]
    #[doc(hidden)]
    pub fn serve_until_signal_then(
        mut self,
        listening: impl FnOnce(),
    ) -> Result<Vec<WorkerCounters>, RuntimeError> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        use signal_hook::{flag, iterator::Signals};
        use std::sync::atomic::AtomicBool;

        // How often the wait looks at the workers; a signal is seen at the same pace.
        const POLL: Duration = Duration::from_millis(50);
        let stopping = Arc::new(AtomicBool::new(false));
        for signal in [SIGINT, SIGTERM] {
            // Exits only once `stopping` is set: the first signal starts a graceful shutdown,
            // a second one cuts it short.
            flag::register_conditional_shutdown(signal, 128 + signal, Arc::clone(&stopping))
                .map_err(RuntimeError::Signal)?;
        }
        let mut signals = Signals::new([SIGINT, SIGTERM]).map_err(RuntimeError::Signal)?;
        listening();
        let signal = loop {
            if let Some(signal) = signals.pending().next() {
                break Some(signal);
            }
            if self.workers.any_ended() {
                break None;
            }
            std::thread::sleep(POLL);
        };
        stopping.store(true, Ordering::SeqCst);
        match signal {
            Some(signal) => tracing::info!(signal, "shutting down on a signal"),
            None => tracing::warn!("a worker stopped; shutting the server down"),
        }
        self.workers.stop_and_join()
    }
}
