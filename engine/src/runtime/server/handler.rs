//! The handler API: [`Handler`] (the game's callbacks) and [`ServerContext`] (what they may
//! do), and the per-worker queues through which a handler reaches another worker's sessions.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ricochet_platform::Waker;
use ricochet_proto::token::TokenKey;
use ricochet_proto::{
    CloseReason, ConnectionHandle, ConnectionStats, Endpoint, EndpointStats, LaneStats, Peer,
    Refusal, SendError, SendOptions,
};

use crate::runtime::conditioner::ConditionerControl;
use crate::runtime::session::SessionId;
#[cfg(doc)]
use crate::runtime::{RuntimeError, UdpServerConfig};
use crate::stats::SessionStats;

/// Game-server code: one instance per worker, called on that worker's thread.
///
/// With several workers (the default is one per core), players are split across them: each
/// new session goes to the worker holding the fewest. An instance sees only its worker's
/// players. [`ServerContext::sessions`] lists that worker's sessions, so a broadcast over it
/// reaches only them, and [`Handler::on_tick`] runs once per worker. A game with one world per
/// process sets `.workers(1)` ([`ServerConfig::workers`](crate::ServerConfig::workers)). Otherwise, state the workers
/// share goes in an `Arc` (with a lock) that the factory given to [`Server::start`](crate::Server::start) clones
/// into each instance.
///
/// A handler that panics ends its worker, and nothing restarts it. The other workers carry on.
/// The dead worker's sessions get no more answers, so their clients close with
/// [`CloseReason::IdleTimeout`]; they no longer count against [`ServerConfig::max_sessions`](crate::ServerConfig::max_sessions).
/// [`Server::is_running`](crate::Server::is_running) turns false, [`Server::serve_until_signal`](crate::Server::serve_until_signal) notices and shuts the
/// server down, and [`Server::shutdown`](crate::Server::shutdown) returns the panic ([`RuntimeError::WorkerPanicked`]).
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

    /// A complete message arrived on `channel`. A small `data` (up to 512 B) shares a 4 KiB
    /// receive buffer with the messages that arrived around it, reused once they are all
    /// dropped: read it and let it go, or copy it out (`Bytes::copy_from_slice(&data)`) to keep
    /// many small messages for long.
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

    /// The server started draining ([`Server::drain`](crate::Server::drain)): it admits no new client from now on
    /// (they are refused and a token client moves on to the next server its token lists),
    /// and stops once every session has closed or the grace period ends. Called once on each
    /// worker. A game ends its matches here (or lets them run out) and closes the sessions
    /// it is done with ([`ServerContext::close`]).
    fn on_drain(&mut self, ctx: &mut ServerContext<'_>) {
        let _ = ctx;
    }

    /// Called on each worker every [`UdpServerConfig::tick`], on a fixed grid: a late tick
    /// does not delay the next, and a tick whose time passed while the worker was busy is
    /// skipped rather than run late. [`ServerContext::tick_index`] tells which tick this is
    /// (its indices jump over skipped ones).
    fn on_tick(&mut self, ctx: &mut ServerContext<'_>) {
        let _ = ctx;
    }
}

/// A request for another worker, carried by its queue.
pub(super) enum Command {
    Send {
        handle: ConnectionHandle,
        channel: u8,
        data: Bytes,
        options: SendOptions,
    },
    Close {
        handle: ConnectionHandle,
        reason: CloseReason,
    },
    /// A datagram that arrived on another worker's socket for one of this worker's sessions.
    Datagram { from: SocketAddr, bytes: Vec<u8> },
    /// The server drains: admit no one new, tell the handler.
    Drain,
    /// Token admission: a new key, and the old one with the end of its overlap.
    SetTokenKeys {
        key: TokenKey,
        previous: Option<(TokenKey, Instant)>,
    },
    /// Token admission: the addresses tokens must list.
    SetPublicAddresses(Vec<SocketAddr>),
    /// Condition one session on its own (`None`: back to the endpoint-wide settings); the
    /// owning worker resolves the session's address and sets it in `control`.
    SetConditioner {
        handle: ConnectionHandle,
        conditioner: Option<Box<crate::runtime::LinkConditioner>>,
        control: Arc<ConditionerControl>,
    },
}

/// One worker's queue, as seen by the others.
#[derive(Clone)]
pub(super) struct Mailbox {
    pub(super) tx: Sender<Command>,
    pub(super) waker: Waker,
    /// Bytes of forwarded datagrams in the queue, which [`FORWARD_QUEUE_BYTES`] bounds.
    pub(super) forward_bytes: Arc<AtomicUsize>,
}

/// Most bytes of forwarded datagrams one worker's queue holds. What is forwarded is chosen
/// by bytes of a datagram nobody has authenticated yet, so a flood that names a busy worker
/// must not grow its queue without bound: past this, such datagrams are dropped and counted
/// ([`Server::forward_drops`](crate::Server::forward_drops)), as a full socket buffer would drop them.
pub(super) const FORWARD_QUEUE_BYTES: usize = 4 << 20;

/// What one queued forwarded datagram counts against [`FORWARD_QUEUE_BYTES`]: its bytes and
/// the queue entry's own.
pub(super) fn forward_cost(len: usize) -> usize {
    len + std::mem::size_of::<Command>()
}

/// Where the workers' mailboxes are published once every worker is up.
pub(super) type Directory = Arc<std::sync::OnceLock<Vec<Mailbox>>>;

/// What handlers may do: send to and close sessions (on any worker), read session stats.
pub struct ServerContext<'a> {
    pub(super) worker: u32,
    pub(super) now: Instant,
    pub(super) endpoint: &'a mut Endpoint,
    pub(super) directory: &'a Directory,
    pub(super) sessions: &'a HashSet<ConnectionHandle>,
    /// The index of the tick being run ([`Handler::on_tick`] only).
    pub(super) tick: Option<u64>,
    /// How late that tick started (zero outside [`Handler::on_tick`]).
    pub(super) tick_late: Duration,
}

impl ServerContext<'_> {
    /// Queue a message to `session` on `channel`. A session on another worker is reached
    /// through that worker's queue, and the result then only says the request was queued. If
    /// the session has gone or its send queue is full when that worker takes the request, the
    /// message is dropped, and [`Server::remote_send_drops`](crate::Server::remote_send_drops) counts it.
    /// [`SendError::UnknownConnection`] comes back only if that worker has stopped or does not
    /// exist.
    pub fn send(
        &mut self,
        session: SessionId,
        channel: u8,
        data: impl Into<Bytes>,
    ) -> Result<(), SendError> {
        self.send_with(session, channel, data, SendOptions::default())
    }

    /// [`ServerContext::send`] with `options`: an unreliable message with a deadline is
    /// dropped unsent once it passes (counted in [`SessionStats::unsent`]).
    ///
    /// ```no_run
    /// # use ricochet::{SendOptions, ServerContext, SessionId};
    /// # use std::time::Duration;
    /// # fn on_tick(ctx: &mut ServerContext<'_>, session: SessionId, snapshot: Vec<u8>) {
    /// // A snapshot is worth nothing after the next tick.
    /// let by = ctx.now() + Duration::from_millis(16);
    /// let _ = ctx.send_with(session, 3, snapshot, SendOptions::deadline(by));
    /// # }
    /// ```
    pub fn send_with(
        &mut self,
        session: SessionId,
        channel: u8,
        data: impl Into<Bytes>,
        options: SendOptions,
    ) -> Result<(), SendError> {
        let data = data.into();
        if session.worker == self.worker {
            return self
                .endpoint
                .send_with(session.handle, channel, data, options);
        }
        self.post(
            session.worker,
            Command::Send {
                handle: session.handle,
                channel,
                data,
                options,
            },
        )
    }

    /// Lane `lane` of a session on this worker ([`ServerConfig::lanes`]): bytes queued and
    /// the expected queue time; `None` for an unknown lane, or a session that is unknown or
    /// owned by another worker.
    ///
    /// [`ServerConfig::lanes`]: crate::ServerConfig::lanes
    pub fn lane_stats(&self, session: SessionId, lane: usize) -> Option<LaneStats> {
        if session.worker != self.worker {
            return None;
        }
        self.endpoint
            .connection(session.handle)
            .and_then(|c| c.lane_stats(lane))
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
        self.connection_stats(session)
            .map(|d| SessionStats::from(&d))
    }

    /// Every counter the protocol core keeps for a session on this worker (for benchmarks
    /// and diagnostics; its shape follows the protocol core, not this crate's API promise).
    #[cfg(feature = "test-util")]
    pub fn session_detail(&self, session: SessionId) -> Option<ConnectionStats> {
        self.connection_stats(session)
    }

    fn connection_stats(&self, session: SessionId) -> Option<ConnectionStats> {
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

    /// The rate, bytes per second, that congestion control estimates `session`'s path carries
    /// (if it is local): the budget to fit its snapshots to. See
    /// [`SessionStats::rate_estimate`] for how a game uses it.
    pub fn rate_estimate(&self, session: SessionId) -> Option<u64> {
        if session.worker != self.worker {
            return None;
        }
        self.endpoint
            .connection(session.handle)
            .map(|c| c.rate_estimate())
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
    /// worker's start plus `k` × [`ServerConfig::tick`](crate::ServerConfig::tick), the first is 1. A tick that came too
    /// late to run before the next was due is skipped, not run late back to back (counted in
    /// [`WorkerCounters::ticks_skipped`](super::WorkerCounters::ticks_skipped)), so the
    /// indices then jump: a fixed-step simulation advances by the difference from the last
    /// index it saw. `None` outside `on_tick`.
    pub fn tick_index(&self) -> Option<u64> {
        self.tick
    }

    /// In [`Handler::on_tick`], how late the tick being run started: [`ServerContext::now`]
    /// minus the due time of tick [`ServerContext::tick_index`] (a busy worker or a late
    /// wake-up). The next tick is still due on the grid, so a handler that runs a fixed-step
    /// simulation can use it to see how far behind real time its step is. `None` outside
    /// `on_tick`.
    pub fn tick_lateness(&self) -> Option<Duration> {
        self.tick.map(|_| self.tick_late)
    }
}

/// Queue `cmd` on `worker`'s mailbox and wake it; `UnknownConnection` when that worker does
/// not exist or has stopped.
pub(super) fn post(directory: &Directory, worker: u32, cmd: Command) -> Result<(), SendError> {
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
