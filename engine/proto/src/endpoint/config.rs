//! The endpoint's settings ([`EndpointConfig`], and [`ListenConfig`] for the listening side)
//! and its counters ([`EndpointStats`]).

use std::sync::Arc;
use std::time::Duration;

use crate::admission::Admission;
use crate::{Config, DropCounters};

/// Listening-side settings of one [`Endpoint`](crate::Endpoint) (in [`EndpointConfig::server`]):
/// admission, session limits, the handshake budget and the cookie keys. The `ricochet` runtime's
/// `ServerConfig` (sockets, workers and all) holds one, and writes its builder's limits into it.
/// There is no default: a server admits clients by connect token ([`ListenConfig::tokens`]) or, for
/// LAN play and local tests, insecurely ([`ListenConfig::insecure`]), and says which. The default
/// limits admit a thousand players behind one address (a NAT, a LAN event, a load test) connecting
/// at once, twice over.
///
/// `#[non_exhaustive]`: start from [`ListenConfig::tokens`], [`ListenConfig::insecure`] or
/// [`ListenConfig::new`] and change fields (or use [`ListenConfig::with`]), so a new setting is not
/// a breaking change.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ListenConfig {
    /// How clients are admitted.
    pub admission: Admission,
    /// When true, a client that passed every check waits for the application: the endpoint reports
    /// [`Event::Incoming`](crate::Event::Incoming) with who it is, and the application answers with
    /// [`Endpoint::accept`](crate::Endpoint::accept) or
    /// [`Endpoint::refuse`](crate::Endpoint::refuse) (unanswered within
    /// [`Config::handshake_timeout`], the attempt is dropped and the client times out). When false,
    /// it is accepted at once and [`Event::Connected`](crate::Event::Connected) follows.
    pub accept_hook: bool,
    /// Sessions at most (default 16,384); more are refused with
    /// [`CloseReason::ServerFull`](crate::CloseReason::ServerFull). Enforced by the endpoint's
    /// [`Router`](crate::Router) ([`Router::admit_session`](crate::Router::admit_session)), which
    /// sees every session of the server: a lone endpoint's [`NoRouting`](crate::NoRouting) counts
    /// its own; the `ricochet` runtime's routers count across all its workers, so the limit is the
    /// server's whatever its worker count.
    pub max_sessions: usize,
    /// Sessions per source IP (default 2,048: players behind one NAT share an address); more are
    /// refused with [`CloseReason::TooManyFromAddress`](crate::CloseReason::TooManyFromAddress).
    /// Counted like `max_sessions`.
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

impl ListenConfig {
    /// A server that admits clients as `admission` says, with the default limits: 16,384
    /// sessions, 2,048 per source IP, 4,096 proven handshakes per IP per second, 10 s cookies,
    /// 30 s cookie key rotation, no accept hook.
    pub fn new(admission: Admission) -> Self {
        ListenConfig {
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
    pub fn tokens(admission: crate::TokenAdmission) -> Self {
        Self::new(Admission::Tokens(admission))
    }

    /// A server in insecure mode: no tokens, no packet protection. LAN play and local tests.
    pub fn insecure() -> Self {
        Self::new(Admission::Insecure)
    }

    /// This configuration with `tune` applied:
    /// `ListenConfig::insecure().with(|s| s.accept_hook = true)`.
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
/// use ricochet_proto::{Config, EndpointConfig, ListenConfig};
/// use std::sync::Arc;
///
/// let server = EndpointConfig::server(ListenConfig::insecure())
///     .with(|e| e.connection = Arc::new(Config::competitive()));
/// assert!(server.server.is_some());
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EndpointConfig {
    /// Settings of every connection.
    pub connection: Arc<Config>,
    /// `Some` to accept incoming handshakes.
    pub server: Option<ListenConfig>,
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
    /// Datagrams [`Endpoint::poll_transmit`](crate::Endpoint::poll_transmit) takes from one
    /// connection in a row before moving on to the next one with something to send (round-robin; 1
    /// = one datagram each in turn). Default [`DEFAULT_TRANSMIT_BURST`]: a run of datagrams to one
    /// peer leaves in one GSO send where the runtime coalesces them, which one-each-in-turn breaks
    /// up.
    pub transmit_burst: usize,
    /// RTT samples the endpoint keeps for
    /// [`Endpoint::drain_rtt_samples`](crate::Endpoint::drain_rtt_samples) between two calls (0,
    /// the default: none are kept). An embedder that aggregates RTT over its sessions (the
    /// runtime's per-worker histogram) sets it and drains every turn; samples beyond it are counted
    /// in [`EndpointStats::rtt_samples_dropped`].
    pub rtt_sample_buffer: usize,
    /// **Test and benchmark path, not for production.** `Some`: every session's packets are
    /// protected with keys derived from this secret and the session's client connection id and
    /// nonce (`SessionKeys::derive_for_test`); client and
    /// server endpoints must hold the same secret. Both of those inputs cross the network in clear,
    /// so whoever holds the secret can read and forge every session of every endpoint that shares
    /// it; connect tokens, which hand each session its own random keys, are the production path.
    /// `None` (the default): the insecure mode, no packet protection.
    ///
    /// Public with the `test-util` feature only.
    #[cfg(feature = "test-util")]
    pub test_session_secret: Option<[u8; 32]>,
    /// The test path's secret: set only through the `test-util` feature's public field.
    #[cfg(not(feature = "test-util"))]
    pub(crate) test_session_secret: Option<[u8; 32]>,
}

impl EndpointConfig {
    /// The defaults, accepting handshakes as `server` says.
    pub fn server(server: ListenConfig) -> Self {
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
    /// Cookie echoes that came after their cookie expired, answered with a fresh challenge
    /// (counted among `challenges_sent` too): a count that grows says handshakes take
    /// longer than [`ListenConfig::cookie_lifetime`] on this server (a loaded host or client).
    pub cookies_renewed: u64,
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
    /// Handshakes the application refused ([`Endpoint::refuse`](crate::Endpoint::refuse)).
    pub rejected: u64,
    /// Stateless resets sent.
    pub resets_sent: u64,
    /// Stateless resets not sent because of the rate limit.
    pub resets_limited: u64,
    /// Used tokens forgotten before their expiry to make room for a new one: the table of
    /// used tokens ([`crate::TokenAdmission::used_token_capacity`]) is smaller than the
    /// handshakes per second times the token lifetime, and those tokens could be used again.
    pub tokens_evicted: u64,
}
