//! The game client: one RUDP connection driven from a game loop, no async runtime.
//!
//! A client connects with the [`ConnectToken`] the game's backend issued it (see
//! [`ricochet_proto::token`]); [`Client::connect_insecure`] connects to a server in insecure
//! mode (LAN play, local tests).
//!
//! ```no_run
//! use ricochet::client::{Client, ClientConfig, ClientEvent};
//! use ricochet::proto::token::ConnectToken;
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let token_bytes: Vec<u8> = Vec::new();
//! // The bytes the backend sent over HTTPS after the player logged in.
//! let token = ConnectToken::from_bytes(&token_bytes)?;
//! let mut client = Client::connect_blocking(&token, ClientConfig::new())?;
//! client.send(0, &b"hello"[..])?;
//! loop {
//!     // Once per frame: receive, run timers, send; then what happened.
//!     for event in client.update()? {
//!         if let ClientEvent::Message { channel, data } = event {
//!             println!("{channel}: {data:?}");
//!             return Ok(());
//!         }
//!     }
//!     std::thread::sleep(Duration::from_millis(16));
//! }
//! # }
//! ```

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ricochet_platform::{
    self as platform, Backend, BackendConfig, BackendKind, SendBatch, SocketConfig,
};

use ricochet_proto::token::ConnectToken;
use ricochet_proto::{
    ChannelKind, CloseReason, Config, ConfigError, ConnectionHandle, ConnectionStats, Endpoint,
    EndpointConfig, Event, Lane, LaneStats, SendError, SendOptions,
};

use crate::profile::{with_channels, Profile};
use crate::runtime::conditioner::{self, Conditioner, Mode, Off, On};
use crate::runtime::LinkConditioner;
use crate::stats::SessionStats;

mod set;

pub use set::{ClientSet, ClientSetError};

/// Client settings: start from [`ClientConfig::new`] and change what you need with the builder
/// methods; the fields stay open for tuning beyond them.
///
/// ```
/// use ricochet::{ClientConfig, Profile};
///
/// let config = ClientConfig::new().profile(Profile::Game);
/// # let _ = config;
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Protocol settings; must match the server's channel list.
    pub endpoint: EndpointConfig,
    /// Datagram I/O backend (`auto` by default; `RICOCHET_BACKEND` overrides).
    pub backend: BackendConfig,
    /// Local address to bind; `None` binds an ephemeral port on the server's address family.
    pub bind: Option<SocketAddr>,
    /// Requested socket buffers (bytes).
    pub socket_buffer: Option<usize>,
    /// Seed for connection ids and nonces; `None` (the default) draws 32 bytes from the OS.
    pub seed: Option<u64>,
    /// How long [`Client::connect_blocking`] waits at most, over every server address the
    /// token lists; `None` (the default) waits for the handshake's own limit
    /// ([`Config::handshake_timeout`] per address), which always ends the attempt.
    pub connect_timeout: Option<Duration>,
    /// Coalesce consecutive same-size datagrams into UDP GSO sends where the kernel supports
    /// GSO (on by default; `false` sends datagram by datagram). GRO receive is
    /// `backend.gro`, also on by default.
    pub gso: bool,
    /// A `.session(..)` change has been made through the builder (channels aside).
    tuned: bool,
    /// The builder was given a contradiction; connecting refuses it with this message.
    conflict: Option<&'static str>,
    /// A [`ClientSet`] turned `auto` into the readiness backend for this member.
    auto_in_set: bool,
    /// A link conditioner impairing this client's traffic (off, `None`, by default).
    pub conditioner: Option<LinkConditioner>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            endpoint: EndpointConfig::default(),
            backend: BackendConfig {
                // A client moves few datagrams per turn and wants small memory; GRO runs need
                // 64 KiB receive buffers (32 × 64 KiB = 2 MiB).
                batch_size: 32,
                max_datagram: 65_536,
                recv_buffers: 32,
                gro: true,
                ..BackendConfig::default()
            },
            bind: None,
            socket_buffer: Some(1 << 20),
            seed: None,
            connect_timeout: None,
            gso: true,
            tuned: false,
            conflict: None,
            auto_in_set: false,
            conditioner: None,
        }
    }
}

impl ClientConfig {
    /// The defaults: [`Profile::Default`], automatic backend, an ephemeral local port.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tune the session for `profile` (use the server's). Replaces every session setting
    /// except the channels (and their lanes): call it before `.session(..)`. Called after a `.session(..)`
    /// change it would discard that change, so the builder refuses the order instead:
    /// connecting then fails with [`ClientError::Conflict`] (`.channels(..)` may come in
    /// either order).
    pub fn profile(mut self, profile: Profile) -> Self {
        if self.tuned {
            self.conflict = Some(
                "ClientConfig::profile after ClientConfig::session would discard the session \
                 changes: call .profile(..) first",
            );
        }
        self.tune(|c| *c = with_channels(profile.config(), c))
    }

    /// The session's channels, by id: the same kinds in the same order as the server's.
    ///
    /// Nothing checks this at connect time. If a message arrives on a channel id the
    /// receiving side does not have, that side drops the whole packet as a protocol
    /// violation and does not acknowledge it. The message is retransmitted, and the session
    /// closes with [`CloseReason::IdleTimeout`] if none of the sender's packets is
    /// acknowledged for the idle timeout. Channels of different kinds under the same id are
    /// not detected at all. See [`crate::ServerConfig::channels`] for keeping the layouts
    /// in step through the token's protocol id.
    pub fn channels(self, kinds: impl IntoIterator<Item = ChannelKind>) -> Self {
        let kinds: Vec<ChannelKind> = kinds.into_iter().collect();
        self.tune(|c| c.channels = kinds)
    }

    /// How the session's channels share its send rate ([`Lane`]; see
    /// [`crate::ServerConfig::lanes`]). Only this side's sending: the server's lanes may
    /// differ.
    pub fn lanes(self, lanes: impl IntoIterator<Item = Lane>) -> Self {
        let lanes: Vec<Lane> = lanes.into_iter().collect();
        self.tune(|c| c.lanes = lanes)
    }

    /// Unreliable channels that keep only their newest queued message ([`Config::newest_only`]).
    pub fn newest_only(self, channels: impl IntoIterator<Item = u8>) -> Self {
        let channels: Vec<u8> = channels.into_iter().collect();
        self.tune(|c| c.newest_only = channels)
    }

    /// Change any protocol setting of the session (see [`Config`]), on top of the profile
    /// ([`ClientConfig::profile`] comes first).
    pub fn session(mut self, tune: impl FnOnce(&mut Config)) -> Self {
        self.tuned = true;
        self.tune(tune)
    }

    fn tune(mut self, tune: impl FnOnce(&mut Config)) -> Self {
        tune(Arc::make_mut(&mut self.endpoint.connection));
        self
    }

    /// The datagram I/O backend (automatic by default). A non-empty `RICOCHET_BACKEND`
    /// environment variable overrides it, and a value that names no backend makes connecting
    /// fail with [`ClientError::Platform`].
    ///
    /// `auto` picks for a lone [`Client`] the fastest backend the system offers (io_uring on
    /// Linux when available). For the members of a [`ClientSet`] it picks the readiness
    /// backend (`mmsg` on Linux, `kqueue` on macOS): the set waits on its members' sockets
    /// itself, and a ring per member would cost its memory for nothing. So the same config
    /// may run on another backend in a set; [`Client::backend_kind`] and
    /// [`Client::selection_reason`] say which and why. Name a backend to have the same one
    /// everywhere.
    pub fn backend(mut self, backend: BackendKind) -> Self {
        self.backend.kind = backend;
        self
    }

    /// Bind this local address instead of an ephemeral port.
    pub fn bind(mut self, local: SocketAddr) -> Self {
        self.bind = Some(local);
        self
    }

    /// Impair this client's traffic with a link conditioner (off by default); change it
    /// while running with [`Client::set_conditioner`].
    pub fn conditioner(mut self, conditioner: LinkConditioner) -> Self {
        self.conditioner = Some(conditioner);
        self
    }

    /// Seed connection ids and nonces from `seed` (reproducible tests); by default from the OS.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Make [`Client::connect_blocking`] give up after `timeout` (over every server address
    /// the token lists), whatever the handshake's own limit.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }
}

/// Which time limit ended a connection attempt (see [`ClientError::TimedOut`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectLimit {
    /// The caller's limit, [`ClientConfig::connect_timeout`].
    Caller,
    /// The protocol's own handshake limit, [`crate::Config::handshake_timeout`] (in
    /// [`ClientConfig::endpoint`]); the connection attempt is over whatever the caller waits.
    Handshake,
}

impl std::fmt::Display for ConnectLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConnectLimit::Caller => "the caller's connect timeout",
            ConnectLimit::Handshake => "the handshake timeout (Config::handshake_timeout)",
        })
    }
}

/// Why a client operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server refused the connection: server full, too many from this address, or its
    /// connect token was refused (required, invalid, expired, for another server, reused).
    #[error("the server refused the connection: {0}")]
    Refused(CloseReason),
    /// The server application refused the client ([`crate::runtime::Handler::on_accept`]).
    #[error(
        "the server application refused the connection (code {code}): {}",
        String::from_utf8_lossy(message)
    )]
    Rejected {
        /// The application's reason code (0..=127).
        code: u8,
        /// Its message (UTF-8 by convention), at most 64 bytes.
        message: Bytes,
    },
    /// The server speaks another protocol version.
    #[error("the server speaks another protocol version")]
    VersionMismatch,
    /// The handshake did not complete in time.
    #[error("connecting timed out: {which} of {limit:?} expired")]
    TimedOut {
        /// The limit that expired.
        limit: Duration,
        /// Whose limit it was: the caller's or the handshake's own.
        which: ConnectLimit,
    },
    /// The connection is closed; nothing more can be sent.
    #[error("the connection is closed ({reason:?}, by peer: {by_peer})")]
    Closed {
        /// Why.
        reason: CloseReason,
        /// True when the server decided it.
        by_peer: bool,
    },
    /// The message was refused (unknown channel, too large, send queue full).
    #[error("send refused: {0}")]
    Send(#[from] SendError),
    /// Socket setup or I/O failed.
    #[error(transparent)]
    Platform(#[from] platform::Error),
    /// A session setting is out of range ([`ClientConfig::session`]); it names the field.
    #[error("{0} (ClientConfig::session)")]
    Config(#[from] ConfigError),
    /// The [`ClientConfig`] builder was given a contradiction (such as
    /// [`ClientConfig::profile`] after [`ClientConfig::session`], which would discard the
    /// session changes); the message says which and what to do instead.
    #[error("{0}")]
    Conflict(&'static str),
    /// The link conditioner's settings are out of range; the message names the field.
    #[error(transparent)]
    Conditioner(crate::runtime::RuntimeError),
}

/// What happened on the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientEvent {
    /// The handshake completed.
    Connected,
    /// A complete message arrived.
    Message {
        /// Channel id.
        channel: u8,
        /// The message. A small one (up to 512 B) shares a 4 KiB receive buffer with the
        /// messages that arrived around it, reused once they are all dropped: copy it out
        /// (`Bytes::copy_from_slice(&data)`) to keep many small messages for long.
        data: Bytes,
    },
    /// The connection ended.
    Disconnected {
        /// Why.
        reason: CloseReason,
        /// True when the server decided it.
        by_peer: bool,
    },
}

/// The events a client has queued, as [`Client::update`] returns them: each
/// [`next`](Iterator::next) takes the oldest. Events not taken stay queued, for the next
/// `update` or [`Client::poll_event`]; dropping the iterator discards nothing. So a client
/// whose events are never taken keeps every message it receives: take them each turn.
#[derive(Debug)]
pub struct Events<'a>(&'a mut VecDeque<ClientEvent>);

impl Iterator for Events<'_> {
    type Item = ClientEvent;
    fn next(&mut self) -> Option<ClientEvent> {
        self.0.pop_front()
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.0.len(), Some(self.0.len()))
    }
}

impl ExactSizeIterator for Events<'_> {}

/// One RUDP connection to a server.
pub struct Client {
    backend: Box<dyn Backend>,
    endpoint: Endpoint,
    handle: ConnectionHandle,
    server: SocketAddr,
    config: ClientConfig,
    send_batch: SendBatch,
    events: VecDeque<ClientEvent>,
    connected: bool,
    /// The handshake completed at some point (a close after it is not a failed connect).
    ever_connected: bool,
    closed: Option<(CloseReason, bool)>,
    /// Unique in the process to this client and its current backend: a new one whenever
    /// `backend` is replaced, and a new client never has an earlier one's (a [`ClientSet`]
    /// then re-registers its descriptor and looks at the member afresh).
    backend_generation: u64,
    /// The server application's message with its refusal, once refused.
    refusal_message: Bytes,
    /// The link conditioner: `None` when off.
    cond: Option<Box<Conditioner>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("server", &self.server)
            .field("local", &self.local_addr())
            .field("connected", &self.connected)
            .field("closed", &self.closed)
            .finish()
    }
}

/// With path MTU discovery on, the search stops at what the route to `server` carries, where
/// the platform can tell (the local interface's MTU, or a smaller one the kernel learned),
/// if that is below the configured ceiling.
fn cap_path_mtu(endpoint: &mut EndpointConfig, server: SocketAddr) {
    let c = &endpoint.connection;
    if !c.path_mtu.enabled {
        return;
    }
    let Some(room) = platform::route_max_payload(server) else {
        return;
    };
    let cap = room.max(c.max_datagram_size);
    if cap < c.path_mtu.max_datagram_size {
        let mut c = (**c).clone();
        c.path_mtu.max_datagram_size = cap;
        endpoint.connection = Arc::new(c);
    }
}

fn open_backend(
    server: SocketAddr,
    config: &ClientConfig,
) -> Result<Box<dyn Backend>, platform::Error> {
    let bind = config.bind.unwrap_or(match server {
        SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
    });
    let mut sc = SocketConfig::new(bind);
    sc.recv_buffer = config.socket_buffer;
    sc.send_buffer = config.socket_buffer;
    if config.endpoint.connection.path_mtu.enabled {
        // Path MTU probes must be dropped when too large, not fragmented by the kernel.
        sc.pmtu = platform::PmtuDiscovery::Do;
    }
    // A client may move between threads, and a `ClientSet` waits on its ready descriptor.
    let backend = platform::BackendConfig {
        single_thread: false,
        ..config.backend.clone()
    };
    platform::open(platform::bind(&sc)?, &backend)
}

impl Client {
    /// Start connecting with `token` (to its first server address, then the next ones in turn
    /// when a server times out or has no room) and return at once; [`ClientEvent::Connected`]
    /// (or `Disconnected`) reports the outcome as [`Client::update`] runs. Messages may be
    /// queued right away.
    pub fn connect(token: &ConnectToken, config: ClientConfig) -> Result<Client, ClientError> {
        Client::open(token, config)?.send_first()
    }

    /// A client connecting with `token` whose first datagram is still queued: a
    /// [`ClientSet`] sends it with the set's next turn (a socket just opened has nothing to
    /// receive, so looking costs a system call for nothing).
    pub(crate) fn open(token: &ConnectToken, config: ClientConfig) -> Result<Client, ClientError> {
        let server = token
            .server_addresses
            .first()
            .copied()
            .ok_or(ClientError::Refused(CloseReason::TokenInvalid))?;
        Client::start(server, config, |endpoint, now| {
            endpoint.connect_with_token(now, token)
        })
    }

    /// Start connecting to `server` in insecure mode (no token, no packet protection: the
    /// server must be in insecure mode too; LAN play and local tests). Otherwise as
    /// [`Client::connect`].
    pub fn connect_insecure(
        server: SocketAddr,
        config: ClientConfig,
    ) -> Result<Client, ClientError> {
        Client::open_insecure(server, config)?.send_first()
    }

    /// Send the handshake's first datagram now (a client on its own; a set sends its members'
    /// with its next turn).
    fn send_first(mut self) -> Result<Client, ClientError> {
        self.drive(Some(Duration::ZERO), true)?;
        Ok(self)
    }

    /// [`Client::open`] in insecure mode.
    pub(crate) fn open_insecure(
        server: SocketAddr,
        config: ClientConfig,
    ) -> Result<Client, ClientError> {
        Client::start(server, config, |endpoint, now| {
            endpoint.connect(now, server)
        })
    }

    fn start(
        server: SocketAddr,
        config: ClientConfig,
        open: impl FnOnce(&mut Endpoint, Instant) -> ConnectionHandle,
    ) -> Result<Client, ClientError> {
        if let Some(conflict) = config.conflict {
            return Err(ClientError::Conflict(conflict));
        }
        config.endpoint.connection.validate()?;
        if let Some(c) = &config.conditioner {
            c.validate().map_err(ClientError::Conditioner)?;
        }
        let backend = open_backend(server, &config)?;
        let now = Instant::now();
        let mut endpoint_cfg = config.endpoint.clone();
        cap_path_mtu(&mut endpoint_cfg, server);
        let mut endpoint = crate::runtime::new_endpoint(endpoint_cfg, now, config.seed);
        let handle = open(&mut endpoint, now);
        let mut send_batch = SendBatch::new(config.backend.batch_size.max(8));
        send_batch.set_coalescing(config.gso && platform::select::gso_supported());
        Ok(Client {
            cond: config
                .conditioner
                .and_then(|c| Conditioner::new(&c, u64::MAX)),
            backend,
            endpoint,
            handle,
            server,
            send_batch,
            config,
            events: VecDeque::new(),
            connected: false,
            ever_connected: false,
            closed: None,
            backend_generation: next_unique(),
            refusal_message: Bytes::new(),
        })
    }

    /// Connect with `token` and wait until the handshake completes or fails. The
    /// [`ClientEvent::Connected`] event is not queued: returning `Ok` says it.
    ///
    /// The handshake gives up on its own after [`crate::Config::handshake_timeout`] (per
    /// server address the token lists); [`ClientConfig::connect_timeout`] sets a limit of the
    /// caller's. A [`ClientError::TimedOut`] says which of the two expired.
    pub fn connect_blocking(
        token: &ConnectToken,
        config: ClientConfig,
    ) -> Result<Client, ClientError> {
        Client::connect(token, config)?.wait_connected()
    }

    /// [`Client::connect_insecure`], waiting like [`Client::connect_blocking`].
    pub fn connect_insecure_blocking(
        server: SocketAddr,
        config: ClientConfig,
    ) -> Result<Client, ClientError> {
        Client::connect_insecure(server, config)?.wait_connected()
    }

    fn wait_connected(mut self) -> Result<Client, ClientError> {
        let timeout = self.config.connect_timeout;
        // A limit past the clock's range (`Duration::MAX` for "no limit") sets no deadline.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            if self.connected {
                // Returning is the news: don't report it twice.
                self.events.retain(|e| *e != ClientEvent::Connected);
                return Ok(self);
            }
            if let Some((reason, _)) = self.closed {
                return Err(match reason {
                    CloseReason::VersionMismatch => ClientError::VersionMismatch,
                    CloseReason::HandshakeTimeout => ClientError::TimedOut {
                        limit: self.config.endpoint.connection.handshake_timeout,
                        which: ConnectLimit::Handshake,
                    },
                    CloseReason::Rejected(code) => ClientError::Rejected {
                        code,
                        message: self.refusal_message(),
                    },
                    other => ClientError::Refused(other),
                });
            }
            // Without a limit of the caller's, the handshake's timer ends the wait.
            let wait = match (timeout, deadline) {
                (Some(limit), Some(deadline)) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(ClientError::TimedOut {
                            limit,
                            which: ConnectLimit::Caller,
                        });
                    }
                    deadline - now
                }
                _ => Duration::from_secs(1),
            };
            self.wait(wait)?;
        }
    }

    /// The message the server application gave with its refusal ([`CloseReason::Rejected`]);
    /// empty otherwise.
    pub fn refusal_message(&self) -> Bytes {
        self.refusal_message.clone()
    }

    /// Queue a message on `channel`.
    pub fn send(&mut self, channel: u8, data: impl Into<Bytes>) -> Result<(), ClientError> {
        self.send_with(channel, data, SendOptions::default())
    }

    /// [`Client::send`] with `options`: an unreliable message with a deadline (on the clock
    /// of [`std::time::Instant::now`]) is dropped unsent once it passes.
    pub fn send_with(
        &mut self,
        channel: u8,
        data: impl Into<Bytes>,
        options: SendOptions,
    ) -> Result<(), ClientError> {
        if let Some((reason, by_peer)) = self.closed {
            return Err(ClientError::Closed { reason, by_peer });
        }
        self.endpoint
            .send_with(self.handle, channel, data.into(), options)?;
        Ok(())
    }

    /// Lane `lane` of the session ([`ClientConfig::lanes`]): bytes queued and the expected
    /// queue time; `None` for a lane that does not exist or once the session is gone.
    pub fn lane_stats(&self, lane: usize) -> Option<LaneStats> {
        self.endpoint
            .connection(self.handle)
            .and_then(|c| c.lane_stats(lane))
    }

    /// Do all pending work without blocking: receive what arrived, run due timers, send what
    /// is queued. Call once per frame. Returns the events that are waiting (see [`Events`]):
    /// `for event in client.update()? { .. }`.
    pub fn update(&mut self) -> Result<Events<'_>, ClientError> {
        self.drive(Some(Duration::ZERO), true)?;
        Ok(Events(&mut self.events))
    }

    /// Like [`Client::update`], but first wait up to `timeout` for a datagram or the next
    /// protocol timer (for a client on its own thread).
    pub fn wait(&mut self, timeout: Duration) -> Result<Events<'_>, ClientError> {
        self.drive(Some(timeout), true)?;
        Ok(Events(&mut self.events))
    }

    /// One turn of a client that loops on its own thread, in one submission: send everything
    /// queued, wait up to `timeout` for a datagram or the next protocol timer, and handle what
    /// arrived. Unlike [`Client::wait`], what the arrivals call for (acknowledgements) is not
    /// sent at the end of this call: it leaves with the next `step`'s submission, together
    /// with (and where the protocol can, inside) the messages queued after reading events —
    /// one system call per turn instead of two. Call it again promptly (a loop), or call
    /// [`Client::update`] when the next turn may be late, so acknowledgements are not held.
    pub fn step(&mut self, timeout: Duration) -> Result<(), ClientError> {
        self.drive(Some(timeout), false)
    }

    /// Send what is queued, wait, handle arrivals; with `send_replies`, send what they call for
    /// before returning.
    fn drive(&mut self, timeout: Option<Duration>, send_replies: bool) -> Result<(), ClientError> {
        // The conditioner off runs `Off`'s drive, the code a build without the feature runs.
        if conditioner::is_on(&self.cond) {
            self.drive_as::<On>(timeout, send_replies)
        } else {
            self.drive_as::<Off>(timeout, send_replies)
        }
    }

    /// [`Client::drive`] under conditioner mode `M`.
    #[inline(never)]
    fn drive_as<M: Mode>(
        &mut self,
        timeout: Option<Duration>,
        send_replies: bool,
    ) -> Result<(), ClientError> {
        let now = Instant::now();
        self.transmit_as::<M>(now);
        let timeout = match (timeout, self.poll_deadline::<M>()) {
            (Some(t), Some(d)) => Some(t.min(d.saturating_duration_since(now))),
            (t, _) => t,
        };
        self.backend.poll(&mut self.send_batch, timeout)?;
        let now = Instant::now();
        self.absorb_as::<M>(now);
        if send_replies {
            self.transmit_as::<M>(now);
            if !self.send_batch.is_empty() {
                self.backend.flush(&mut self.send_batch)?;
            }
        }
        Ok(())
    }

    /// Hand what the last poll received to the protocol, run due timers, and queue the
    /// resulting events.
    fn absorb(&mut self, now: Instant) {
        if conditioner::is_on(&self.cond) {
            self.absorb_as::<On>(now)
        } else {
            self.absorb_as::<Off>(now)
        }
    }

    /// [`Client::absorb`] under conditioner mode `M`.
    #[inline]
    fn absorb_as<M: Mode>(&mut self, now: Instant) {
        let batch = self.backend.received();
        if let Some(cond) = M::select(&mut self.cond) {
            absorb_conditioned(cond, &mut self.endpoint, &batch, now);
        } else {
            for d in batch.iter() {
                for segment in d.segments() {
                    // Malformed or foreign datagrams are counted by the endpoint and dropped.
                    let _ = self.endpoint.handle_datagram(now, d.src, segment);
                }
            }
        }
        self.run_timers(now);
    }

    /// Run the protocol timers due at `now` and queue the resulting events.
    fn run_timers(&mut self, now: Instant) {
        if self.endpoint.poll_timeout().is_some_and(|t| t <= now) {
            self.endpoint.handle_timeout(now);
        }
        while let Some((_, event)) = self.endpoint.poll_event() {
            self.events.push_back(match event {
                Event::Connected => {
                    self.connected = true;
                    self.ever_connected = true;
                    ClientEvent::Connected
                }
                Event::Message { channel, data } => ClientEvent::Message { channel, data },
                Event::Closed {
                    reason,
                    by_peer,
                    message,
                } => {
                    self.connected = false;
                    self.closed = Some((reason, by_peer));
                    self.refusal_message = message;
                    ClientEvent::Disconnected { reason, by_peer }
                }
                // Only a server's endpoint reports incoming clients.
                Event::Incoming(_) => continue,
            });
        }
    }

    /// Write every datagram the endpoint has to send straight into the send batch (flushing
    /// it when full).
    fn transmit(&mut self, now: Instant) {
        if conditioner::is_on(&self.cond) {
            self.transmit_as::<On>(now)
        } else {
            self.transmit_as::<Off>(now)
        }
    }

    /// [`Client::transmit`] under conditioner mode `M`.
    #[inline]
    fn transmit_as<M: Mode>(&mut self, now: Instant) {
        self.follow_address_family();
        loop {
            if self.send_batch.is_full() {
                if let Some(cond) = M::select(&mut self.cond) {
                    cond.capture(now, &mut self.send_batch);
                } else if self.backend.flush(&mut self.send_batch).is_err() {
                    // No room and the socket refuses: leave the rest queued in the protocol.
                    return;
                }
            }
            let endpoint = &mut self.endpoint;
            // Room for the largest datagram this endpoint writes, not for any UDP payload: the
            // batch's storage is zero-filled as it grows, and a set of thousands of clients
            // would otherwise fill (and fault in) 64 KiB each on its first send.
            let room = endpoint.client_transmit_len();
            let sent = self.send_batch.push_in_place(room, |buf| {
                endpoint
                    .poll_transmit(now, buf)
                    .map(|t| (t.destination, t.size))
            });
            match sent {
                Ok(Some(_)) => {}
                Ok(None) => break,
                // Oversize: lost like a datagram the network dropped; ARQ retransmits it.
                Err(ricochet_platform::Error::PayloadTooLarge { .. }) => {}
                // Still full (a flush that sent nothing): as above.
                Err(_) => break,
            }
        }
        if let Some(cond) = M::select(&mut self.cond) {
            cond.capture_release(now, &mut self.send_batch);
        }
    }

    /// The protocol's next deadline, or the link conditioner's next due datagram if earlier
    /// (under conditioner mode `M`).
    #[inline]
    fn poll_deadline<M: Mode>(&self) -> Option<Instant> {
        let t = self.endpoint.poll_timeout();
        match M::select_ref(&self.cond).and_then(|c| c.next_due()) {
            Some(due) => Some(t.map_or(due, |t| t.min(due))),
            None => t,
        }
    }

    /// Turn this client's link conditioner on with new settings, or off with `None`.
    /// Datagrams held under the previous settings are dropped (as a link change would).
    pub fn set_conditioner(
        &mut self,
        conditioner: Option<LinkConditioner>,
    ) -> Result<(), ClientError> {
        if let Some(c) = &conditioner {
            c.validate().map_err(ClientError::Conditioner)?;
        }
        self.cond = conditioner.and_then(|c| Conditioner::new(&c, u64::MAX));
        Ok(())
    }

    /// When the handshake moved on to a server address of the other family (a token that
    /// lists an IPv6 and an IPv4 address), move to a socket of that family: the first one was
    /// bound for the first address, and an IPv6 socket cannot reach an IPv4 address here
    /// (sockets are IPv6-only). Not when the application chose the local address.
    #[inline]
    fn follow_address_family(&mut self) {
        // Only the handshake moves to another address.
        if !self.ever_connected {
            self.follow_address_family_now();
        }
    }

    /// [`Client::follow_address_family`] during the handshake, out of line (the same in
    /// both of `transmit`'s instantiations and in a build without the conditioner).
    #[inline(never)]
    fn follow_address_family_now(&mut self) {
        let Some(remote) = self
            .endpoint
            .connection(self.handle)
            .map(|c| c.remote_addr())
        else {
            return;
        };
        if remote.is_ipv4() == self.server.is_ipv4() || self.config.bind.is_some() {
            return;
        }
        let previous = self.server;
        self.server = remote;
        if let Err(e) = self.rebind() {
            // The sends to this address fail, and the handshake's timeout moves on to the
            // next address or ends the attempt with `HandshakeTimeout`.
            tracing::warn!(%previous, next = %remote, error = %e, "no socket for the next server address");
        }
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<ClientEvent> {
        self.events.pop_front()
    }

    /// True once the handshake completed and until the connection closes.
    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// The session's counters and path estimates (RTT, loss, retransmissions, congestion
    /// window); `None` once the session is gone.
    pub fn stats(&self) -> Option<SessionStats> {
        self.connection_stats().map(|d| SessionStats::from(&d))
    }

    /// Every counter the protocol core keeps for the session (for the `bench` binary; its
    /// shape follows the protocol core, not this crate's API promise). The counters an
    /// application reads are in [`Client::stats`], the loss-recovery ones in
    /// [`SessionStats::recovery`].
    #[cfg(feature = "test-util")]
    pub fn detail(&self) -> Option<ConnectionStats> {
        self.connection_stats()
    }

    fn connection_stats(&self) -> Option<ConnectionStats> {
        self.endpoint.connection(self.handle).map(|c| c.stats())
    }

    /// The server worker that owns this session, as the server's connection id names it: a
    /// per-core Ricochet server tags its connection ids with the worker (see
    /// `worker_of_cid`). `None` before the handshake completes or for a server
    /// that does not tag them (shared IO model). A load tester on the server's host can use
    /// it to run each client on the core of the worker serving it.
    pub fn server_worker(&self) -> Option<u8> {
        self.endpoint
            .connection(self.handle)
            .filter(|c| c.state() != ricochet_proto::ConnectionState::Handshaking)
            .and_then(|c| crate::runtime::placement::worker_of_cid(c.remote_cid()))
    }

    /// Bytes queued but not yet sent.
    pub fn queued_bytes(&self) -> usize {
        self.endpoint
            .connection(self.handle)
            .map_or(0, |c| c.queued_bytes())
    }

    /// Reliable fragments sent and not yet acknowledged (for benchmarks and diagnostics: with
    /// [`Client::queued_bytes`], whether reliable data is still on its way).
    #[cfg(feature = "test-util")]
    pub fn unacked_fragments(&self) -> usize {
        self.endpoint
            .connection(self.handle)
            .map_or(0, |c| c.unacked_segments())
    }

    /// The server's address (with a token: the one of its addresses being tried, or that
    /// accepted).
    pub fn server_addr(&self) -> SocketAddr {
        self.endpoint
            .connection(self.handle)
            .map_or(self.server, |c| c.remote_addr())
    }

    /// The local socket address.
    pub fn local_addr(&self) -> SocketAddr {
        self.backend.socket_info().local_addr
    }

    /// The datagram I/O backend this client runs on: never [`BackendKind::Auto`], but what
    /// `auto` (or `RICOCHET_BACKEND`) resolved to, after any fallback.
    pub fn backend_kind(&self) -> BackendKind {
        self.backend.kind()
    }

    /// Why that backend was chosen (including any fallback reason, and the [`ClientSet`]
    /// rule for `auto`; see [`ClientConfig::backend`]).
    pub fn selection_reason(&self) -> std::borrow::Cow<'_, str> {
        let reason = self.backend.selection_reason();
        if self.config.auto_in_set {
            format!(
                "{reason}; `auto` in a ClientSet: the set waits on its members' sockets \
                 itself, so members take the readiness backend (a lone Client may pick \
                 io_uring)"
            )
            .into()
        } else {
            reason.into()
        }
    }

    /// Move to a new local socket (as when a NAT rebinding or a network change gives the client
    /// a new address); the session continues, identified by its connection id.
    pub fn rebind(&mut self) -> Result<(), ClientError> {
        self.backend.flush(&mut self.send_batch)?;
        self.backend = open_backend(self.server, &self.config)?;
        self.backend_generation = next_unique();
        Ok(())
    }

    /// Close the connection gracefully; the server learns `CloseReason::Application`.
    ///
    /// The close first waits, up to [`Config::close_linger`] (2 s by default), for the
    /// server to acknowledge the reliable data still queued. Then it sends the close a few
    /// times, an RTO apart, until the server answers or three RTOs pass. Keep calling
    /// [`Client::update`] until [`ClientEvent::Disconnected`] `{ reason: Application, by_peer:
    /// false }` arrives (then [`Client::is_connected`] turns false). That takes at most about
    /// `close_linger` plus three RTOs.
    ///
    /// `Client` has no `Drop` that closes. A client dropped without `close` (or before the
    /// close has gone out) sends the server nothing, and the server holds the session until
    /// its idle timeout ([`Config::idle_timeout`]).
    pub fn close(&mut self) {
        self.endpoint
            .close(Instant::now(), self.handle, CloseReason::Application);
    }
}

/// [`Client::absorb`] with the link conditioner on: what came is held, what is due goes to the
/// protocol. Out of line and cold, so the client loop compiles as it does without the feature.
#[cold]
#[inline(never)]
fn absorb_conditioned(
    cond: &mut Conditioner,
    endpoint: &mut Endpoint,
    batch: &ricochet_platform::RecvBatch<'_>,
    now: Instant,
) {
    for d in batch.iter() {
        cond.hold_received(now, d);
    }
    while let Some(held) = cond.inbound.pop_due(now) {
        let _ = endpoint.handle_datagram(now, held.addr, &held.data);
        cond.inbound.recycle(held);
    }
}

/// A number no earlier call in this process returned (backend generations).
fn next_unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
