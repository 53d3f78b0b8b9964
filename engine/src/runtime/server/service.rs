//! The service pump: what a worker does with its endpoint every loop turn (datagrams in,
//! commands from other workers, timers, events to the handler, datagrams out) and its part of
//! the stop sequence.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use ricochet_platform as platform;
use ricochet_proto::{
    CloseReason, ConnectionHandle, DropCause, Endpoint, Event, Peer, PrefetchStage,
};

use super::handler::{forward_cost, Command, Directory, FORWARD_QUEUE_BYTES};
use super::{Handler, ServerContext};
use crate::runtime::ops::{
    self, PublishWalk, ServiceCell, ServiceSnapshot, SessionRow, SessionTotals,
};
use crate::runtime::placement::worker_of_datagram;
use crate::runtime::rtt::WorkerRtt;
use crate::runtime::session::SessionId;
use crate::runtime::worker::{Service, UdpContext};

/// Time since the Unix epoch, for token expiry (zero if the clock is before 1970).
pub(super) fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
}

/// How often a worker re-reads the wall clock for its endpoint.
const UNIX_REFRESH: Duration = Duration::from_secs(10);

/// An endpoint and the connected sessions it holds (for broadcasts and the stop sequence).
pub(super) struct Core {
    pub(super) endpoint: Endpoint,
    pub(super) sessions: HashSet<ConnectionHandle>,
    /// With metrics: counters of the sessions that ended. Kept here, not per thread, so that
    /// with the shared endpoint a session's counters stay in the totals whichever thread saw
    /// it close (the totals never go down).
    pub(super) retired: SessionTotals,
    /// With metrics: the walk over the sessions for the next snapshot (kept with the
    /// endpoint, like `retired`, so that a close on any thread reaches it).
    pub(super) walk: PublishWalk,
}

/// The endpoint a worker drives: its own (per-core) or the one every thread shares.
pub(super) enum EndpointSlot {
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
pub(super) const RTT_SAMPLE_BUFFER: usize = 8192;

pub(super) struct RudpService<H> {
    pub(super) worker: u32,
    pub(super) workers: u32,
    pub(super) endpoint: EndpointSlot,
    /// When the endpoint was last told the wall-clock time.
    pub(super) unix_at: Instant,
    pub(super) handler: H,
    pub(super) inbox: Receiver<Command>,
    pub(super) directory: Directory,
    pub(super) stopping: bool,
    /// Datagrams this server's workers handed to another worker (all workers share it).
    pub(super) forwarded: Arc<AtomicU64>,
    /// Datagrams for another worker dropped because its queue was full (shared too).
    pub(super) forward_drops: Arc<AtomicU64>,
    /// Messages other workers' handlers sent to this worker's sessions that it could not
    /// queue (shared too).
    pub(super) remote_send_drops: Arc<AtomicU64>,
    /// Bytes of forwarded datagrams in this worker's own queue (its mailbox's count).
    pub(super) inbox_bytes: Arc<AtomicUsize>,
    /// How long a shutdown may wait for the sessions' closes: a close first lingers for its
    /// reliable data to be acknowledged (`Config::close_linger`).
    pub(super) stop_limit: Duration,
    /// This worker's RTT histogram (fed from the endpoint's samples every turn).
    pub(super) rtt: WorkerRtt,
    /// What the metrics endpoint reads (`None`: metrics off, nothing published).
    pub(super) ops: Option<Arc<ServiceCell>>,
    /// With metrics: when the next snapshot is due.
    pub(super) next_publish: Instant,
    /// With metrics: this thread's walk over the sessions for a snapshot is under way (the
    /// loop turns again at once to go on with it).
    pub(super) walking: bool,
    /// With metrics: this thread publishes the endpoint's figures (always with an endpoint of
    /// its own; with the shared one, only the first thread, so they are counted once).
    pub(super) publishes_endpoint: bool,
    /// UDP payload bytes written for sending.
    pub(super) bytes_out: u64,
}

impl<H: Handler> RudpService<H> {
    /// Apply queued commands, run due timers, deliver events, then write every datagram the
    /// endpoint wants to send into the worker's batch.
    fn pump(&mut self, ctx: &mut UdpContext<'_>) {
        self.deliver(ctx.now());
        self.transmit(ctx);
        if self.ops.is_some() && (self.walking || ctx.now() >= self.next_publish) {
            self.publish(ctx.now());
        }
    }

    /// Publish this worker's endpoint snapshot for the metrics endpoint: its counters, the
    /// totals of its sessions, and the sessions with the highest RTT and loss. The walk over
    /// the sessions takes a few dozen per turn ([`ops::WALK_PER_TURN`]); the snapshot is
    /// published when it is done.
    fn publish(&mut self, now: Instant) {
        let Some(cell) = self.ops.clone() else {
            return;
        };
        if !self.publishes_endpoint {
            self.next_publish = now + ops::PUBLISH_EVERY;
            cell.publish(ServiceSnapshot {
                bytes_out: self.bytes_out,
                ..ServiceSnapshot::default()
            });
            return;
        }
        let worker = self.worker;
        let mut guard = self.endpoint.lock();
        let core = &mut *guard;
        if !core.walk.is_active() {
            self.next_publish = now + ops::PUBLISH_EVERY;
            core.walk.start(core.sessions.iter().copied());
        }
        let (ep, sessions) = (&core.endpoint, &core.sessions);
        let done = core.walk.step(ops::WALK_PER_TURN, |handle| {
            // Ended since the walk began (its counters are with the ended sessions').
            if !sessions.contains(&handle) {
                return None;
            }
            let c = ep.connection(handle)?;
            let s = c.stats();
            let row = SessionRow {
                id: SessionId { worker, handle },
                addr: c
                    .peer()
                    .map_or(SocketAddr::from(([0, 0, 0, 0], 0)), |p| p.address),
                rtt_us: u64::try_from(s.srtt.as_micros()).unwrap_or(u64::MAX),
                packets_sent: s.packets_sent,
                packets_lost: s.packets_lost,
                bytes_sent: s.bytes_sent,
                bytes_received: s.bytes_received,
            };
            Some((s, row))
        });
        self.walking = !done;
        if !done {
            return;
        }
        let (totals, top) = core.walk.finish(core.retired);
        let snapshot = ServiceSnapshot {
            sessions: core.sessions.len(),
            endpoint: core.endpoint.stats().clone(),
            totals,
            bytes_out: self.bytes_out,
            top,
        };
        drop(guard);
        cell.publish(snapshot);
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
        let mut drain = false;
        while let Ok(cmd) = self.inbox.try_recv() {
            match cmd {
                Command::Send {
                    handle,
                    channel,
                    data,
                    options,
                } => {
                    // The sender was told the message was queued; a refusal here (session gone,
                    // queue full) is what a local send would have returned: counted.
                    if ep.send_with(handle, channel, data, options).is_err() {
                        self.remote_send_drops.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Command::Close { handle, reason } => ep.close(now, handle, reason),
                Command::SetTokenKeys { key, previous } => ep.set_token_keys(key, previous),
                Command::SetPublicAddresses(addrs) => ep.set_public_addresses(addrs),
                Command::SetConditioner {
                    handle,
                    conditioner,
                    control,
                } => {
                    // Keyed by the session's address now (a session gone by now: nothing).
                    if let Some(c) = ep.connection(handle) {
                        control.set_peer(c.remote_addr(), conditioner.map(|c| *c));
                    }
                }
                Command::Drain => {
                    // Refused with `Draining`, which sends a token client on to the next
                    // server its token lists.
                    ep.start_draining();
                    drain = true;
                }
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
        let hist = self.ops.as_deref().map(|o| &o.rtt);
        self.rtt.record(ep.drain_rtt_samples().inspect(|d| {
            if let Some(h) = hist {
                h.record(*d);
            }
        }));
        if drain {
            let mut sctx = ServerContext {
                worker: self.worker,
                now,
                endpoint: ep,
                directory: &self.directory,
                sessions: &core.sessions,
                tick: None,
                tick_late: Duration::ZERO,
            };
            self.handler.on_drain(&mut sctx);
        }
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
                    if core.sessions.remove(&handle) && self.ops.is_some() {
                        if let Some(c) = ep.connection(handle) {
                            let s = c.stats();
                            core.retired.add(&s);
                            core.walk.on_ended(handle, &s);
                        }
                    }
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
                tick_late: Duration::ZERO,
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
                Ok(Some(n)) => self.bytes_out += n as u64,
                Ok(None) => break,
                // Oversize: the context counted it; ARQ retransmits what it carried.
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
    /// A datagram another worker owns (steering could not route it: no BPF program on this
    /// system) goes to that worker's mailbox, within its forward queue's budget.
    #[cold]
    #[inline(never)]
    fn forward(&self, owner: u32, from: SocketAddr, data: &[u8]) {
        let Some(mailbox) = self.directory.get().and_then(|d| d.get(owner as usize)) else {
            return;
        };
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

    fn owner_of(&self, datagram: &[u8]) -> Option<u32> {
        if self.workers <= 1 {
            return None;
        }
        let owner = u32::from(worker_of_datagram(datagram)?);
        (owner != self.worker && owner < self.workers).then_some(owner)
    }
}

impl<H: Handler> Service for RudpService<H> {
    // Small, and always inlined: into the receive pump as without the conditioner, whose
    // cold paths are further callers (a compiled-in conditioner must not change the hot loop).
    #[inline(always)]
    fn on_datagram(&mut self, ctx: &mut UdpContext<'_>, from: SocketAddr, data: &[u8]) {
        let now = ctx.now();
        if let Some(owner) = self.owner_of(data) {
            self.forward(owner, from, data);
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
            tick_late: ctx.tick_lateness().unwrap_or_default(),
        };
        self.handler.on_tick(&mut sctx);
    }

    fn on_turn_end(&mut self, ctx: &mut UdpContext<'_>) {
        self.pump(ctx);
    }

    fn next_deadline(&mut self) -> Option<Instant> {
        let endpoint = self.endpoint.lock().endpoint.poll_timeout();
        // With metrics on, an idle worker still wakes to publish its snapshot, and turns
        // again at once while its walk over the sessions is under way.
        if self.walking {
            // The walk began a publish period before the next is due: in the past.
            let began = self.next_publish.checked_sub(ops::PUBLISH_EVERY);
            return Some(began.unwrap_or(self.next_publish));
        }
        match (endpoint, self.ops.is_some()) {
            (Some(t), true) => Some(t.min(self.next_publish)),
            (None, true) => Some(self.next_publish),
            (t, false) => t,
        }
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
