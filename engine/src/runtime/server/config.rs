//! [`ServerConfig`]: what a [`Server`](super::Server) binds, whom it admits and how it runs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ricochet_platform::BackendKind;
use ricochet_proto::token::TokenKey;
use ricochet_proto::{
    Admission, ChannelKind, Config, EndpointConfig, ListenConfig, TokenAdmission,
};

use crate::profile::{with_channels, Profile};
use crate::runtime::conditioner::LinkConditioner;
use crate::runtime::config::{CorePinning, IdleStrategy, IoModel, UdpServerConfig};
#[cfg(doc)]
use ricochet_proto::{CloseReason, EndpointStats};

/// Configuration of a [`Server`](crate::Server): start from [`ServerConfig::new`] and change what you need with
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
    /// Protocol settings (connection config, session limits, handshake limits, budgets; the
    /// listening side's are its `server`, a [`ListenConfig`]). Its `server.admission` is
    /// replaced by [`ServerConfig::admission`] when the server starts.
    pub endpoint: EndpointConfig,
    /// How clients are admitted: by connect token ([`ServerConfig::tokens`]) or insecurely
    /// ([`ServerConfig::insecure`]). No default: [`Server::start`](crate::Server::start) refuses a config that does
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
    /// Where to serve `/metrics` (OpenMetrics), `/healthz`, `/readyz` and `/sessions`;
    /// `None` (the default): no endpoint, and the workers publish nothing for it.
    pub metrics: Option<SocketAddr>,
    /// How long one loop turn of a worker may work before [`Server::health`](crate::Server::health) (and
    /// `/healthz`) calls the worker stalled (default 1 s).
    pub stall_limit: Duration,
    /// How long [`Server::serve_until_signal`](crate::Server::serve_until_signal) drains on SIGTERM or SIGINT before it closes
    /// the sessions still open ([`ServerConfig::drain_grace`]); zero (the default): no
    /// drain, the sessions are closed at once.
    pub drain_grace: Duration,
    /// A `.session(..)` change was made (a later `.profile(..)` would discard it).
    tuned: bool,
    /// A contradiction the builder was given: [`Server::start`](crate::Server::start) refuses it.
    pub(crate) conflict: Option<&'static str>,
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
            metrics: None,
            stall_limit: Duration::from_secs(1),
            drain_grace: Duration::ZERO,
            tuned: false,
            conflict: None,
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
    /// session setting except the channels: call it before `.session(..)`. Called after a
    /// `.session(..)` change it would discard that change, so the builder refuses the order
    /// instead: [`Server::start`](crate::Server::start) then fails with
    /// [`RuntimeError::Conflict`](crate::RuntimeError::Conflict) (`.channels(..)` may come in
    /// either order).
    pub fn profile(mut self, profile: Profile) -> Self {
        if self.tuned {
            self.conflict = Some(
                "ServerConfig::profile after ServerConfig::session would discard the session \
                 changes: call .profile(..) first",
            );
        }
        self.tune(|c| *c = with_channels(profile.config(), c))
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
        self.tune(|c| c.channels = kinds)
    }

    /// Change any protocol setting of every session (see [`Config`]), on top of the profile
    /// ([`ServerConfig::profile`] comes first).
    pub fn session(mut self, tune: impl FnOnce(&mut Config)) -> Self {
        self.tuned = true;
        self.tune(tune)
    }

    fn tune(mut self, tune: impl FnOnce(&mut Config)) -> Self {
        tune(Arc::make_mut(&mut self.endpoint.connection));
        self
    }

    /// Impair every session's traffic with a link conditioner (off by default); change it
    /// while running with [`Server::set_conditioner`](super::Server::set_conditioner).
    pub fn conditioner(mut self, conditioner: LinkConditioner) -> Self {
        self.udp.conditioner = Some(conditioner);
        self
    }

    /// Worker threads; 0 (the default) means one per available core. Players are split
    /// across the workers, and each worker's [`Handler`](crate::Handler) sees only its own players, so a game
    /// that keeps one world per process sets 1 (see [`Handler`](crate::Handler)).
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
    /// [`Server::start`](crate::Server::start) fail.
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

    /// Call [`Handler::on_tick`](crate::Handler::on_tick) every `tick` on every worker.
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
    /// [`Server::start`](crate::Server::start) refuses it for an insecure server, and refuses 0.
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

    /// Serve metrics and health over HTTP on `addr` (off by default): `/metrics` in the
    /// OpenMetrics text format for Prometheus, `/healthz` (503 naming each stalled or ended
    /// worker), `/readyz` (503 while draining or stopping, or once a worker has ended) and
    /// `/sessions` (JSON, the sessions with the highest RTT and loss, for `ricochet-top`).
    /// Port 0 picks a free port ([`Server::metrics_addr`](crate::Server::metrics_addr) tells which). Keep it off public
    /// networks: it has no authentication.
    pub fn metrics(mut self, addr: SocketAddr) -> Self {
        self.metrics = Some(addr);
        self
    }

    /// How long one loop turn may work before the worker counts as stalled in
    /// [`Server::health`](crate::Server::health) and `/healthz` (default 1 s): a handler that blocks its worker
    /// longer holds every session of that worker.
    pub fn stall_limit(mut self, limit: Duration) -> Self {
        self.stall_limit = limit;
        self
    }

    /// Drain for up to `grace` when [`Server::serve_until_signal`](crate::Server::serve_until_signal) gets SIGTERM or SIGINT
    /// (a second signal cuts the drain short): admit no one new and let the sessions end on
    /// their own, then close the rest ([`Server::drain`](crate::Server::drain)). Zero (the default) closes every
    /// session at once. Under Kubernetes, keep it a few seconds below the pod's
    /// `terminationGracePeriodSeconds`.
    pub fn drain_grace(mut self, grace: Duration) -> Self {
        self.drain_grace = grace;
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
