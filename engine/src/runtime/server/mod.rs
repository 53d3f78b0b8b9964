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

mod config;
mod handler;
mod service;

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ricochet_platform::{BackendKind, SocketInfo};
use ricochet_proto::token::{TokenKey, TAG_LEN};
use ricochet_proto::{
    Admission, EndpointConfig, LedgerRefusal, ListenConfig, Recorded, TokenLedger, UsedTokens,
};

pub use config::ServerConfig;
pub use handler::{Handler, ServerContext};

use self::handler::{Command, Directory, Mailbox};

/// How full a server is ([`Server::capacity`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capacity {
    /// Sessions the server holds, all workers.
    pub sessions: usize,
    /// Most sessions it admits ([`ServerConfig::max_sessions`]).
    pub limit: usize,
    /// Sessions per worker (one entry when one endpoint holds them all).
    pub per_worker: Vec<usize>,
}

/// How often a drain looks at the session count.
const DRAIN_POLL: Duration = Duration::from_millis(20);
use self::service::{unix_now, Core, EndpointSlot, RudpService, RTT_SAMPLE_BUFFER};
use super::conditioner::LinkConditioner;
use super::config::IoModel;
use super::counters::WorkerCounters;
use super::error::RuntimeError;
use super::ops::{Health, MetricsServer, Ops, ServiceCell, SessionTotals};
use super::placement::{steer_rules, CountingRouter, Placement, SessionLimits, WorkerRouter};
use super::rtt::{self, RttPercentiles, WorkerRtt};
use super::session::SessionId;
use super::worker::WorkerSet;
use bytes::Bytes;
use ricochet_proto::{CloseReason, SendError};

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
    /// What health, readiness and the metrics endpoint read.
    ops: Arc<Ops>,
    /// The metrics endpoint, when configured (stopped when the server is dropped).
    metrics: Option<MetricsServer>,
    workers: WorkerSet,
    /// The workers' queues (a drain is posted to each).
    directory: Directory,
    /// The token key in force (`None`: insecure admission).
    token_key: Mutex<Option<TokenKey>>,
    /// How long [`Server::serve_until_signal`] drains on the first signal.
    drain_grace: Duration,
    placement: Option<Placement>,
    forwarded: Arc<AtomicU64>,
    forward_drops: Arc<AtomicU64>,
    remote_send_drops: Arc<AtomicU64>,
    rtt: Vec<WorkerRtt>,
    limits: SessionLimits,
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
        let endpoint_cfg = endpoint_config(&config)?;
        let n = worker_count(&config)?;
        let build = Build::new(&config, &endpoint_cfg, n);
        let mut inbox_bytes = Vec::with_capacity(n);
        let mut senders = Vec::with_capacity(n);
        let mut rtts = Vec::with_capacity(n);
        let mut service_cells = Vec::with_capacity(n);
        let steering = if build.per_core() {
            steer_rules()
        } else {
            Vec::new()
        };
        // Path MTU probes must be dropped when too large, not fragmented by the kernel.
        let mut udp = config.udp.clone();
        udp.dont_fragment = endpoint_cfg.connection.path_mtu.enabled;
        let workers = WorkerSet::start(&udp, &steering, |i, local_addr| {
            let rtt = WorkerRtt::new();
            rtts.push(rtt.clone());
            let (tx, rx) = mpsc::channel();
            senders.push(tx);
            let queued = Arc::new(AtomicUsize::new(0));
            inbox_bytes.push(queued.clone());
            let ops = config.metrics.map(|_| {
                let cell = Arc::new(ServiceCell::default());
                service_cells.push(cell.clone());
                cell
            });
            RudpService {
                // In the shared model every thread serves the one endpoint: sessions are "worker 0".
                worker: if build.is_shared { 0 } else { i as u32 },
                workers: if build.is_shared { 1 } else { n as u32 },
                endpoint: build.endpoint(&endpoint_cfg, i, local_addr),
                unix_at: build.now,
                handler: make_handler(i),
                inbox: rx,
                directory: build.directory.clone(),
                stopping: false,
                forwarded: build.forwarded.clone(),
                forward_drops: build.forward_drops.clone(),
                remote_send_drops: build.remote_send_drops.clone(),
                inbox_bytes: queued,
                stop_limit: build.stop_limit,
                rtt,
                ops,
                next_publish: build.now,
                walking: false,
                publishes_endpoint: !build.is_shared || i == 0,
                bytes_out: 0,
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
        let _ = build.directory.set(mailboxes);
        tracing::info!(
            addr = %workers.local_addr,
            io_model = %workers.io_model,
            workers = workers.len(),
            backend = %workers.backend_kind,
            "ricochet RUDP server started"
        );
        let ops = Arc::new(Ops {
            cells: workers.cells(),
            cores: workers.cores(),
            services: service_cells,
            stall_limit: config.stall_limit,
            admitting: AtomicBool::new(true),
            max_sessions: endpoint_cfg.server.as_ref().map_or(0, |s| s.max_sessions),
            limits: build.limits.clone(),
        });
        let metrics =
            match config.metrics {
                Some(addr) => Some(MetricsServer::start(addr, ops.clone()).map_err(|e| {
                    RuntimeError::Config(format!("metrics endpoint on {addr}: {e}"))
                })?),
                None => None,
            };
        Ok(Server {
            ops,
            metrics,
            workers,
            directory: build.directory.clone(),
            drain_grace: config.drain_grace,
            token_key: Mutex::new(match &endpoint_cfg.server.as_ref().map(|s| &s.admission) {
                Some(Admission::Tokens(t)) => Some(t.key.clone()),
                _ => None,
            }),
            placement: build.placement,
            forwarded: build.forwarded,
            forward_drops: build.forward_drops,
            remote_send_drops: build.remote_send_drops,
            rtt: rtts,
            limits: build.limits,
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
            options: ricochet_proto::SendOptions::default(),
        };
        handler::post(&self.directory, session.worker, cmd)
    }

    /// Close `session` gracefully from outside the handlers (see [`Server::send`]); both sides
    /// learn `CloseReason::Application`. Nothing happens if it has already ended.
    pub fn close(&self, session: SessionId) {
        let cmd = Command::Close {
            handle: session.handle,
            reason: CloseReason::Application,
        };
        let _ = handler::post(&self.directory, session.worker, cmd);
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

    /// Each worker's health and whether the server admits new clients: what `/healthz` and
    /// `/readyz` answer. A worker is stalled when one loop turn has been working longer than
    /// [`ServerConfig::stall_limit`] (a handler blocks it), and ended when its thread has.
    pub fn health(&self) -> Health {
        self.ops.health()
    }

    /// Where the metrics endpoint listens ([`ServerConfig::metrics`]), if on.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|m| m.local_addr())
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
        self.ops.admitting.store(false, Ordering::Relaxed);
        self.workers.stop_and_join()
    }

    /// How full the server is: sessions, the limit, and each worker's sessions (for a
    /// matchmaker, an Agones counter, a load balancer). Cheap: read from shared counters.
    pub fn capacity(&self) -> Capacity {
        let sessions = self.session_count();
        Capacity {
            sessions,
            limit: self.ops.max_sessions,
            per_worker: match self.sessions_per_worker() {
                Some(v) => v.into_iter().map(|n| n as usize).collect(),
                None => vec![sessions],
            },
        }
    }

    /// Token admission: seal-check tokens with `key` from now on, and keep accepting tokens
    /// sealed with the current key for `overlap` (tokens the backend issued before it
    /// switched); after that they are refused with [`CloseReason::TokenInvalid`]. Sessions
    /// already open are not touched. Fails on an insecure server.
    pub fn rotate_token_key(&self, key: TokenKey, overlap: Duration) -> Result<(), RuntimeError> {
        let mut current = self.token_key.lock().unwrap_or_else(|p| p.into_inner());
        let Some(old) = current.as_ref().cloned() else {
            return Err(RuntimeError::Config(
                "rotate_token_key: this server admits clients insecurely, not by token".into(),
            ));
        };
        *current = Some(key.clone());
        let until = Instant::now() + overlap;
        self.post_all(|| Command::SetTokenKeys {
            key: key.clone(),
            previous: Some((old.clone(), until)),
        });
        Ok(())
    }

    /// Turn the link conditioner on with new settings, or off with `None`, on every worker
    /// (endpoint-wide: every session alike). Datagrams held under the previous settings are
    /// delivered or sent at once. Fails on invalid settings.
    pub fn set_conditioner(
        &self,
        conditioner: Option<LinkConditioner>,
    ) -> Result<(), RuntimeError> {
        self.workers.set_conditioner(conditioner)
    }

    /// Condition one session on its own, or `None` to put it back under the endpoint-wide
    /// settings ([`Server::set_conditioner`]); the other sessions are not touched. For
    /// playing one client under a bad link beside others on a good one. The session's worker
    /// takes the change at its next turn, keyed by the session's address at that time (a
    /// client that moves to another address leaves it behind; a later session from the same
    /// address meets it until it is set back to `None`). Datagrams already held keep their
    /// due times and the other sessions' random draws carry on: only this session's next
    /// datagrams meet the new settings. Fails on invalid settings; a session that has ended
    /// by then is ignored.
    pub fn set_session_conditioner(
        &self,
        session: SessionId,
        conditioner: Option<LinkConditioner>,
    ) -> Result<(), RuntimeError> {
        if let Some(c) = &conditioner {
            c.validate()?;
        }
        let cmd = Command::SetConditioner {
            handle: session.handle,
            conditioner: conditioner.map(Box::new),
            control: self.workers.conditioner.clone(),
        };
        handler::post(&self.directory, session.worker, cmd)
            .map_err(|_| RuntimeError::Config(format!("no worker {} running", session.worker)))
    }

    /// Token admission: the addresses clients reach this server at from now on (a token must
    /// list one of them), e.g. after a NAT or load balancer change. Fails on an insecure
    /// server or with no address.
    pub fn set_public_addresses(&self, addresses: Vec<SocketAddr>) -> Result<(), RuntimeError> {
        if addresses.is_empty()
            || self
                .token_key
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_none()
        {
            return Err(RuntimeError::Config(
                "set_public_addresses: needs token admission and at least one address".into(),
            ));
        }
        self.post_all(|| Command::SetPublicAddresses(addresses.clone()));
        Ok(())
    }

    /// Queue a command on every worker (one the shared model's threads all apply alike).
    fn post_all(&self, mut cmd: impl FnMut() -> Command) {
        for mailbox in self.directory.get().into_iter().flatten() {
            // A worker that has ended has nothing to apply it to.
            if mailbox.tx.send(cmd()).is_ok() {
                let _ = mailbox.waker.wake();
            }
        }
    }

    /// Start draining and return at once: admit no new client (refused with
    /// [`CloseReason::Draining`], so a token client moves on to the next server its token
    /// lists), keep every session running, and call [`Handler::on_drain`] on each worker.
    /// [`Server::health`] and `/readyz` say not ready from now on. [`Server::drain`] also
    /// waits for the sessions and stops the server.
    pub fn start_drain(&self) {
        self.ops.admitting.store(false, Ordering::Relaxed);
        self.post_all(|| Command::Drain);
    }

    /// Drain, then stop: [`Server::start_drain`], wait until the last session has closed
    /// (or a worker ended) or `grace` has passed, then [shut down](Server::shutdown): the
    /// sessions still open are closed with [`CloseReason::Shutdown`], which their clients
    /// see. For a rolling update or a scale-down: matches in progress may end on their own
    /// within a fleet manager's grace period (Kubernetes:
    /// `terminationGracePeriodSeconds`, 30 s by default; leave a few seconds for the closes).
    pub fn drain(self, grace: Duration) -> Result<Vec<WorkerCounters>, RuntimeError> {
        self.start_drain();
        let deadline = Instant::now() + grace;
        while self.session_count() > 0 && Instant::now() < deadline && !self.workers.any_ended() {
            std::thread::sleep(DRAIN_POLL);
        }
        self.shutdown()
    }

    /// Serve until the process receives SIGINT (Ctrl-C) or SIGTERM (`kill`, `docker stop`, a
    /// Kubernetes pod ending), then [shut down](Server::shutdown): every client learns that
    /// the server left ([`CloseReason::Shutdown`]) instead of timing out. Blocks the calling
    /// thread; the workers serve on their own threads meanwhile. Returns early, with the
    /// worker's error, when a worker ends on its own (an I/O error, a panicking handler), so a
    /// supervisor sees the process fail and restarts it.
    ///
    /// With a [drain grace](ServerConfig::drain_grace), the first signal [drains](Server::drain)
    /// instead: no one new is admitted and the sessions may end on their own until the grace
    /// has passed; a second signal cuts the drain short (the sessions still open are closed
    /// as above).
    ///
    /// The signal handlers stay installed when this returns: one more SIGINT or SIGTERM
    /// (during the shutdown, or after it) ends the process at once, with status 128 + the
    /// signal's number (130, 143), as a shell would report it.
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
        self.serve_until_signal_and(|| {})
    }

    /// [`Server::serve_until_signal`], calling `listening` once the signal handlers are in
    /// place: a test that raises the signal itself must not raise it before (the default
    /// action would end the process).
    #[cfg(all(unix, feature = "test-util"))]
    pub fn serve_until_signal_then(
        self,
        listening: impl FnOnce(),
    ) -> Result<Vec<WorkerCounters>, RuntimeError> {
        self.serve_until_signal_and(listening)
    }

    #[cfg(unix)]
    fn serve_until_signal_and(
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
        match signal {
            Some(signal) if !self.drain_grace.is_zero() => {
                tracing::info!(signal, grace = ?self.drain_grace, "draining on a signal");
                self.start_drain();
                let deadline = Instant::now() + self.drain_grace;
                // Until the last session closes, the grace ends, or a second signal comes.
                while self.session_count() > 0
                    && Instant::now() < deadline
                    && !self.workers.any_ended()
                {
                    if let Some(signal) = signals.pending().next() {
                        tracing::info!(signal, "second signal: stopping now");
                        break;
                    }
                    std::thread::sleep(POLL.min(DRAIN_POLL));
                }
            }
            Some(signal) => tracing::info!(signal, "shutting down on a signal"),
            None => tracing::warn!("a worker stopped; shutting the server down"),
        }
        // From here a further signal ends the process at once.
        stopping.store(true, Ordering::SeqCst);
        self.ops.admitting.store(false, Ordering::Relaxed);
        self.workers.stop_and_join()
    }
}

/// The endpoint configuration every worker starts from: the admission chosen and checked, the
/// session settings validated.
fn endpoint_config(config: &ServerConfig) -> Result<EndpointConfig, RuntimeError> {
    if let Some(conflict) = config.conflict {
        return Err(RuntimeError::Conflict(conflict));
    }
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
    Ok(endpoint_cfg)
}

/// How many workers the configuration asks for, checked against what a per-core server runs.
fn worker_count(config: &ServerConfig) -> Result<usize, RuntimeError> {
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
    Ok(n)
}

/// What the workers of one server share, built before they start.
struct Build {
    now: Instant,
    unix: Duration,
    seed: Option<u64>,
    is_shared: bool,
    /// The one endpoint of the shared model, made by the first worker.
    shared: Mutex<Option<Arc<Mutex<Core>>>>,
    placement: Option<Placement>,
    /// The session limits hold per server: every endpoint's router counts in this one table.
    limits: SessionLimits,
    cookie_secret: [u8; 32],
    ledger: Option<SharedLedger>,
    forwarded: Arc<AtomicU64>,
    forward_drops: Arc<AtomicU64>,
    remote_send_drops: Arc<AtomicU64>,
    stop_limit: Duration,
    directory: Directory,
}

impl Build {
    fn new(config: &ServerConfig, endpoint_cfg: &EndpointConfig, n: usize) -> Self {
        let is_shared = config.udp.io_model == IoModel::Shared;
        // Per-core: every worker's endpoint verifies the others' cookies (one secret, one
        // clock base), accepts each token once across all of them (one ledger), and places
        // sessions on the least-loaded worker; the sockets steer by the worker the packets
        // name.
        let per_core = !is_shared && n > 1;
        let cookie_secret: [u8; 32] = match config.seed {
            Some(s) => ChaCha8Rng::seed_from_u64(s ^ 0x636f_6f6b_6965_7321).random(),
            None => rand::rng().random(),
        };
        let used_tokens = match endpoint_cfg.server.as_ref().map(|s| &s.admission) {
            Some(Admission::Tokens(t)) => Some(t.used_token_capacity),
            _ => None,
        };
        Build {
            now: Instant::now(),
            unix: unix_now(),
            seed: config.seed,
            is_shared,
            shared: Mutex::new(None),
            placement: per_core.then(|| Placement::new(n)),
            limits: SessionLimits::default(),
            cookie_secret,
            ledger: used_tokens
                .filter(|_| per_core)
                .map(|cap| SharedLedger(Arc::new(Mutex::new(UsedTokens::new(cap))))),
            forwarded: Arc::new(AtomicU64::new(0)),
            forward_drops: Arc::new(AtomicU64::new(0)),
            remote_send_drops: Arc::new(AtomicU64::new(0)),
            // A close lingers for its reliable data, then goes out; half a second more for that.
            stop_limit: endpoint_cfg.connection.close_linger + Duration::from_millis(500),
            directory: Arc::new(std::sync::OnceLock::new()),
        }
    }

    fn per_core(&self) -> bool {
        self.placement.is_some()
    }

    /// Worker `i`'s endpoint: its own (per-core) or a handle on the shared one.
    fn endpoint(&self, cfg: &EndpointConfig, i: usize, local_addr: SocketAddr) -> EndpointSlot {
        // With a port-0 bind, the public address gets the port the sockets were given.
        let mut cfg = cfg.clone();
        if let Some(Admission::Tokens(t)) = cfg.server.as_mut().map(|s| &mut s.admission) {
            if t.public_addresses.is_empty() {
                t.public_addresses = vec![local_addr];
            }
        }
        if self.is_shared {
            let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            let core = shared.get_or_insert_with(|| {
                let mut endpoint = super::new_endpoint(cfg, self.now, self.seed);
                endpoint.set_router(Box::new(CountingRouter::new(self.limits.clone())));
                endpoint.set_unix_time(self.now, self.unix);
                Arc::new(Mutex::new(Core {
                    endpoint,
                    sessions: HashSet::new(),
                    retired: SessionTotals::default(),
                    walk: Default::default(),
                }))
            });
            return EndpointSlot::Shared(core.clone());
        }
        let seed = self.seed.map(|s| s.wrapping_add(i as u64));
        let mut endpoint = super::new_endpoint(cfg, self.now, seed);
        // Validated below 256 workers in `worker_count`.
        endpoint.set_router(Box::new(WorkerRouter::new(
            i as u8,
            self.placement.clone(),
            self.limits.clone(),
        )));
        endpoint.set_cookie_secret(self.now, self.cookie_secret);
        endpoint.set_unix_time(self.now, self.unix);
        if let Some(l) = &self.ledger {
            endpoint.set_token_ledger(Box::new(l.clone()));
        }
        EndpointSlot::Owned(Box::new(Core {
            endpoint,
            sessions: HashSet::new(),
            retired: SessionTotals::default(),
            walk: Default::default(),
        }))
    }
}
