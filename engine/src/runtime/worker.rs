//! The worker loop shared by every server kind, and the machinery that starts and stops
//! workers.
//!
//! A worker drives one [`Service`] (raw UDP handler, RUDP endpoint, ...) over one backend: poll
//! (submit sends + wait), hand each received datagram to the service, fire the tick, let the
//! service produce more output, repeat. The service never sees the backend, only a
//! [`UdpContext`] to queue datagrams in the worker's send batch.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ricochet_platform::{
    self as platform, Backend, BackendConfig, BackendKind, BoundSocket, SendBatch, SocketConfig,
    SocketInfo, Waker,
};

use ricochet_proto::PrefetchStage;

use super::conditioner::{Conditioner, ConditionerControl};
use super::config::{IdleStrategy, IoModel, UdpServerConfig};
use super::counters::{CounterCell, WorkerCounters};
use super::error::RuntimeError;
use super::timer::TimerWheel;

/// With [`IdleStrategy::Tick`]: receive batches a worker reads back to back after its sleep
/// before it runs the tick and the turn's output anyway (a flood must not hold timers back).
const MAX_DRAIN_BATCHES: u32 = 64;

/// Longest an idle worker leaves its live counters unpublished.
const SYNC_IDLE: Duration = Duration::from_millis(100);

/// With [`IdleStrategy::Tick`]: longest sleep while sends wait for room in the socket.
const SEND_RETRY: Duration = Duration::from_millis(1);

/// What a handler may do: send datagrams (batched), and learn where and when it runs.
pub struct UdpContext<'a> {
    pub(crate) worker: usize,
    pub(crate) now: Instant,
    pub(crate) send: &'a mut SendBatch,
    /// Present outside datagram dispatch: a full batch is then submitted on the spot.
    pub(crate) backend: Option<&'a mut dyn Backend>,
    pub(crate) send_errors: &'a mut u64,
    /// The index of the tick being run (`Service::on_tick` only).
    pub(crate) tick: Option<u64>,
    /// How long after its due time the tick being run started (zero outside `on_tick`).
    pub(crate) tick_late: Duration,
    /// The link conditioner, when on: a full batch is moved into its queue, not submitted.
    pub(crate) cond: Option<&'a mut Conditioner>,
}

impl UdpContext<'_> {
    /// Queue a datagram to `to`; the worker submits its batch once per loop turn.
    ///
    /// Fails with [`platform::Error::PayloadTooLarge`] for a payload over the protocol limit, and
    /// with [`platform::Error::BatchFull`] when a handler queues more than
    /// [`UdpServerConfig::send_batch`] datagrams while handling a single datagram.
    pub fn send(&mut self, to: SocketAddr, data: &[u8]) -> Result<(), platform::Error> {
        self.make_room()?;
        self.send
            .push(to, data)
            .inspect_err(|_| *self.send_errors += 1)
    }

    /// Queue a datagram written in place: `write` fills up to `max_len` bytes and returns how
    /// many it used.
    pub fn send_with(
        &mut self,
        to: SocketAddr,
        max_len: usize,
        write: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<usize, platform::Error> {
        self.make_room()?;
        self.send
            .push_with(to, max_len, write)
            .inspect_err(|_| *self.send_errors += 1)
    }

    /// Queue a datagram written in place whose destination `write` decides as it writes (see
    /// [`SendBatch::push_in_place`]): `write` gets `max_len` bytes of room (not zeroed) and
    /// returns the destination and length, or `None` to send nothing. Returns the length queued.
    ///
    /// Fails with [`platform::Error::BatchFull`] without calling `write` when no entry is free
    /// (mid-dispatch), and with [`platform::Error::PayloadTooLarge`] for a datagram over its
    /// destination's limit (counted as a send error, like [`UdpContext::send`]'s).
    pub fn send_in_place(
        &mut self,
        max_len: usize,
        write: impl FnOnce(&mut [u8]) -> Option<(SocketAddr, usize)>,
    ) -> Result<Option<usize>, platform::Error> {
        self.make_room()?;
        self.send.push_in_place(max_len, write).inspect_err(|e| {
            // A full batch leaves the datagram unwritten: the caller still has it to send.
            if !matches!(e, platform::Error::BatchFull { .. }) {
                *self.send_errors += 1;
            }
        })
    }

    /// True when the next send may have to wait for room (mid-dispatch, batch full).
    pub fn is_send_batch_full(&self) -> bool {
        self.send.is_full() && self.backend.is_none()
    }

    fn make_room(&mut self) -> Result<(), platform::Error> {
        if self.send.is_full() {
            if let Some(cond) = self.cond.as_deref_mut() {
                cond.capture(self.now, self.send);
            } else if let Some(backend) = self.backend.as_deref_mut() {
                backend.flush(self.send)?;
            }
        }
        Ok(())
    }

    /// The worker this handler runs on.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// In [`DatagramHandler::on_tick`](super::DatagramHandler::on_tick), the index of the
    /// tick being run: tick `k` was due at the worker's start plus `k` ticks, the first is 1.
    /// A tick that came too late to run before the next was due is skipped (and counted in
    /// [`WorkerCounters::ticks_skipped`]), so the indices then jump: a fixed-step simulation
    /// advances by the difference from the last index it saw. `None` outside `on_tick`.
    pub fn tick_index(&self) -> Option<u64> {
        self.tick
    }

    /// In `on_tick`, how long after its due time the tick being run started (this turn's
    /// [`UdpContext::now`] minus the due time of tick [`UdpContext::tick_index`]); `None`
    /// outside `on_tick`.
    pub fn tick_lateness(&self) -> Option<Duration> {
        self.tick.map(|_| self.tick_late)
    }

    /// The time the current loop turn started (one clock read per turn).
    pub fn now(&self) -> Instant {
        self.now
    }
}

/// What a worker drives. One instance per worker, owned by its thread.
pub(crate) trait Service: Send + 'static {
    /// One received datagram (or GRO segment).
    fn on_datagram(&mut self, ctx: &mut UdpContext<'_>, from: SocketAddr, data: &[u8]);

    /// A hint that `data` will be handled soon: the dispatch loop issues
    /// [`PrefetchStage::Connection`] two datagrams ahead and [`PrefetchStage::Parts`] one
    /// ahead (see `Endpoint::prefetch_for`). The default does nothing.
    fn prefetch(&self, _data: &[u8], _stage: PrefetchStage) {}

    /// The configured tick came.
    fn on_tick(&mut self, ctx: &mut UdpContext<'_>);

    /// End of a loop turn, after datagrams and ticks: produce whatever output is due.
    fn on_turn_end(&mut self, ctx: &mut UdpContext<'_>);

    /// The earliest time the service needs `on_turn_end` to run even without I/O.
    fn next_deadline(&mut self) -> Option<Instant>;

    /// The server is stopping. Called every turn from then on; return `true` once the service
    /// needs the socket no more (e.g. every session's close has been sent).
    fn on_stop(&mut self, ctx: &mut UdpContext<'_>) -> bool;

    /// How long the stop may take before the worker gives up on what `on_stop` still waits
    /// for; `None`: the worker's own limit.
    fn stop_limit(&self) -> Option<Duration> {
        None
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimerEvent {
    Tick,
}

/// How a worker runs, besides its service.
#[derive(Debug, Clone)]
pub(crate) struct WorkerSettings {
    pub idle: IdleStrategy,
    pub spin_for: Duration,
    pub tick: Option<Duration>,
    pub send_batch: usize,
    /// Longest the stop sequence may take before the worker gives up on unsent output.
    pub stop_limit: Duration,
    /// Coalesce sends into GSO runs (configured on and supported by the kernel).
    pub coalesce: bool,
    /// Scheduler time slice to ask for ([`UdpServerConfig::worker_slice`]).
    pub slice: Option<Duration>,
}

impl WorkerSettings {
    pub(crate) fn from_config(cfg: &UdpServerConfig) -> Self {
        WorkerSettings {
            idle: cfg.idle,
            spin_for: cfg.spin_for,
            tick: cfg.tick,
            send_batch: cfg.send_batch,
            stop_limit: Duration::from_millis(500),
            coalesce: cfg.gso && platform::select::gso_supported(),
            slice: cfg.worker_slice,
        }
    }
}

/// A moving average of how long a worker waited for its next datagram after work: the
/// balanced idle strategy spins only while that is short, since a spin that usually ends in a
/// park anyway costs a stream of empty system calls and a core others could use.
#[derive(Debug, Default)]
struct IdleGap {
    /// Exponentially weighted mean gap (weight 1/8 per sample), ns.
    mean_ns: u64,
}

impl IdleGap {
    fn record(&mut self, gap: Duration) {
        let g = u64::try_from(gap.as_nanos()).unwrap_or(u64::MAX);
        self.mean_ns = self.mean_ns - self.mean_ns / 8 + g / 8;
    }

    /// Spinning for up to `spin_for` pays when work usually returns within half of it.
    fn spin_pays(&self, spin_for: Duration) -> bool {
        u128::from(self.mean_ns) < spin_for.as_nanos() / 2
    }
}

/// The tick's fixed grid: tick `k` is due at `start + k × period`.
#[derive(Debug, Clone, Copy)]
struct TickGrid {
    start: Instant,
    period: Duration,
    /// Index of the tick scheduled next.
    next: u64,
}

impl TickGrid {
    fn due(&self, k: u64) -> Instant {
        // `period` is at least 1 ns and `k` counts periods since start: no overflow in practice,
        // and a saturated product only delays the tick.
        let nanos = self.period.as_nanos().saturating_mul(u128::from(k));
        self.start + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// The tick due now ran at `now`: its lateness, and the due time of the next tick, skipping
    /// (and returning the count of) due times already past.
    fn advance(&mut self, now: Instant) -> (Duration, u64, Instant) {
        let late = now.saturating_duration_since(self.due(self.next));
        let mut k = self.next + 1;
        let mut skipped = 0;
        if self.due(k) <= now {
            let behind = now.saturating_duration_since(self.start).as_nanos()
                / self.period.as_nanos().max(1);
            let behind = u64::try_from(behind).unwrap_or(u64::MAX);
            // Tick `behind` was due at or before now and is skipped too: the next runs on time.
            skipped = behind + 1 - k;
            k = behind + 1;
        }
        self.next = k;
        (late, skipped, self.due(k))
    }
}

struct Worker<S> {
    index: usize,
    /// An idle turn publishes the counters from then on.
    next_sync: Instant,
    tick: Option<TickGrid>,
    idle_gap: IdleGap,
    backend: Box<dyn Backend>,
    service: S,
    send: SendBatch,
    timers: TimerWheel<TimerEvent>,
    stop: Arc<AtomicBool>,
    cell: Arc<CounterCell>,
    counters: WorkerCounters,
    settings: WorkerSettings,
    /// The link conditioner: `None` when off (the hot path then pays one branch).
    cond: Option<Box<Conditioner>>,
    cond_ctl: Arc<ConditionerControl>,
    cond_generation: u64,
    /// Drops counted by earlier conditioners (lost, over the queue limit).
    cond_base: (u64, u64),
}

impl<S: Service> Worker<S> {
    fn run(mut self) -> Result<WorkerCounters, platform::Error> {
        let start = Instant::now();
        if let Some(t) = self.settings.tick {
            let grid = TickGrid {
                start,
                period: t,
                next: 1,
            };
            self.timers.insert(grid.due(1), TimerEvent::Tick);
            self.tick = Some(grid);
        }
        let mut last_work = start;
        let mut now = start;
        let mut stop_deadline: Option<Instant> = None;
        // The last poll found nothing to read: with the tick strategy the worker may sleep.
        let mut drained = true;
        // Receive batches read back to back since the last tick-and-output step.
        let mut drain_batches = 0u32;
        loop {
            // Waiting from here until the poll returns: not a stuck turn.
            self.cell.set_busy(None);
            let stopping = self.stop.load(Ordering::Acquire);
            // Before the timeout: what the conditioner takes from the batch sets its next due.
            self.condition_sends(now);
            let mut timeout = if stopping {
                Some(Duration::ZERO)
            } else {
                self.timeout(now, last_work)
            };
            if self.settings.idle == IdleStrategy::Tick && timeout != Some(Duration::ZERO) {
                if drained {
                    // Sleep past arriving datagrams (a backend wait would return for each);
                    // the worker's waker unparks the thread for a stop or a mailbox message.
                    self.backend.flush(&mut self.send)?;
                    // Live counters stay current although a tick makes only a few turns.
                    self.sync_counters();
                    // Sends the socket would not take yet are retried soon, not at the tick.
                    let retry = (!self.send.is_empty()).then_some(SEND_RETRY);
                    match timeout.into_iter().chain(retry).min() {
                        Some(wait) => std::thread::park_timeout(wait),
                        None => std::thread::park(),
                    }
                }
                // Then read what came meanwhile, batch after batch, without waiting.
                timeout = Some(Duration::ZERO);
            }
            let outcome = self.backend.poll(&mut self.send, timeout)?;
            drained = outcome.received == 0;
            now = Instant::now();
            if self.cond_ctl.generation() != self.cond_generation {
                self.reload_conditioner();
            }
            self.cell.set_busy(Some(now));
            self.counters.loop_turns += 1;
            if outcome.received > 0 {
                self.idle_gap
                    .record(now.saturating_duration_since(last_work));
                self.dispatch(now)?;
                last_work = now;
                if self.settings.idle == IdleStrategy::Tick
                    && !stopping
                    && drain_batches < MAX_DRAIN_BATCHES
                {
                    // Read the whole backlog before the tick and the turn's output, so the
                    // tick sees every input and the ACKs of all of them ride its sends.
                    drain_batches += 1;
                    continue;
                }
            } else if outcome.sent > 0 {
                last_work = now;
            } else if timeout == Some(Duration::ZERO)
                && !stopping
                && self.settings.idle == IdleStrategy::Balanced
            {
                // An empty spin turn: let a runnable thread of this core (a client, the game's
                // own threads) have it before looking again. Returns at once when none waits.
                std::thread::yield_now();
            }
            drain_batches = 0;
            if self.cond.is_some() {
                self.deliver_held(now);
            }
            self.fire_timers(now);
            let service_done = {
                let mut ctx = UdpContext {
                    worker: self.index,
                    now,
                    send: &mut self.send,
                    backend: Some(self.backend.as_mut()),
                    send_errors: &mut self.counters.send_errors,
                    tick: None,
                    tick_late: Duration::ZERO,
                    cond: self.cond.as_deref_mut(),
                };
                self.service.on_turn_end(&mut ctx);
                stopping && self.service.on_stop(&mut ctx)
            };
            let worked = now.elapsed();
            self.counters.max_turn_ns = self.counters.max_turn_ns.max(worked.as_nanos() as u64);
            self.counters.busy_ns += worked.as_nanos() as u64;
            if stopping {
                let limit = *stop_deadline.get_or_insert_with(|| {
                    now + self
                        .service
                        .stop_limit()
                        .unwrap_or(self.settings.stop_limit)
                });
                // Leave once the socket queue is drained, every received datagram was handled
                // and the service is done, or when the stop takes too long.
                if (outcome.received == 0 && service_done) || now >= limit {
                    if let Some(mut cond) = self.cond.take() {
                        self.send_all_held(&mut cond);
                        let (lost, queue) = cond.drops();
                        self.cond_base = (self.cond_base.0 + lost, self.cond_base.1 + queue);
                        (
                            self.counters.conditioner_lost,
                            self.counters.conditioner_queue_drops,
                        ) = self.cond_base;
                    }
                    self.finish_sends(limit)?;
                    self.sync_counters();
                    return Ok(self.counters);
                }
                if outcome.received == 0 && outcome.sent == 0 {
                    // Waiting for the service (e.g. close acknowledgements): don't spin hot.
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            // Every few turns, and on an idle turn at least every 100 ms (a reader of the live
            // counters must not see a quiet worker's last burst unpublished).
            if self.counters.loop_turns % 32 == 0
                || (outcome.received == 0 && now >= self.next_sync)
            {
                self.next_sync = now + SYNC_IDLE;
                self.sync_counters();
            }
        }
    }

    fn timeout(&mut self, now: Instant, last_work: Instant) -> Option<Duration> {
        if self.settings.idle == IdleStrategy::Spin
            || (self.settings.idle == IdleStrategy::Balanced
                && now.saturating_duration_since(last_work) < self.settings.spin_for
                && self.idle_gap.spin_pays(self.settings.spin_for))
        {
            return Some(Duration::ZERO);
        }
        let mut deadline = match (self.timers.next_deadline(), self.service.next_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(due) = self.cond.as_ref().and_then(|c| c.next_due()) {
            deadline = Some(deadline.map_or(due, |d| d.min(due)));
        }
        deadline.map(|d| d.saturating_duration_since(now))
    }

    fn dispatch(&mut self, now: Instant) -> Result<(), platform::Error> {
        // Submit early when the batch fills past this mark, so replies never run out of room.
        let high_water = self.send.capacity() / 2;
        // The length is re-read each time: a flush may append datagrams it reaped on the way.
        let mut i = 0;
        while i < self.backend.received().len() {
            i += 1;
            {
                let received = self.backend.received();
                let Some(d) = received.get(i - 1) else {
                    continue;
                };
                if d.truncated {
                    self.counters.truncated += 1;
                }
                let mut ctx = UdpContext {
                    worker: self.index,
                    now,
                    send: &mut self.send,
                    backend: None,
                    send_errors: &mut self.counters.send_errors,
                    tick: None,
                    tick_late: Duration::ZERO,
                    cond: self.cond.as_deref_mut(),
                };
                // Hints for the next two, so their connections' state is in cache by their turn.
                for (ahead, stage) in [(1, PrefetchStage::Parts), (2, PrefetchStage::Connection)] {
                    if let Some(next) = received.get(i - 1 + ahead) {
                        self.service.prefetch(next.data, stage);
                    }
                }
                for segment in d.segments() {
                    if let Some(cond) = ctx.cond.as_deref_mut() {
                        // Held, and handed to the service when due (`deliver_held`).
                        cond.inbound.offer(now, d.src, segment);
                        continue;
                    }
                    self.service.on_datagram(&mut ctx, d.src, segment);
                    self.counters.datagrams_in += 1;
                    self.counters.bytes_in += segment.len() as u64;
                }
            }
            if self.send.len() >= high_water {
                self.condition_sends(now);
                self.backend.flush(&mut self.send)?;
            }
        }
        Ok(())
    }

    /// With the conditioner on: move what the turn queued into its outbound queue and put
    /// what is due back into the batch. Off: one branch.
    fn condition_sends(&mut self, now: Instant) {
        if let Some(cond) = self.cond.as_deref_mut() {
            cond.capture(now, &mut self.send);
            cond.release(now, &mut self.send);
        }
    }

    /// Hand the held received datagrams that are due to the service.
    fn deliver_held(&mut self, now: Instant) {
        let Some(mut cond) = self.cond.take() else {
            return;
        };
        while let Some(held) = cond.inbound.pop_due(now) {
            let mut ctx = UdpContext {
                worker: self.index,
                now,
                send: &mut self.send,
                backend: Some(self.backend.as_mut()),
                send_errors: &mut self.counters.send_errors,
                tick: None,
                tick_late: Duration::ZERO,
                cond: Some(&mut cond),
            };
            self.service.on_datagram(&mut ctx, held.addr, &held.data);
            self.counters.datagrams_in += 1;
            self.counters.bytes_in += held.data.len() as u64;
            cond.inbound.recycle(held);
        }
        self.cond = Some(cond);
    }

    /// Take the settings the server set since the last turn. Held datagrams of the previous
    /// settings are delivered or sent at once (a change must not strand them).
    fn reload_conditioner(&mut self) {
        self.cond_generation = self.cond_ctl.generation();
        let next = self
            .cond_ctl
            .get()
            .and_then(|s| Conditioner::new(&s, self.index as u64));
        if let Some(mut old) = self.cond.take() {
            let far = Instant::now() + Duration::from_secs(3600);
            let (lost, queue) = old.drops();
            self.cond_base = (self.cond_base.0 + lost, self.cond_base.1 + queue);
            while let Some(h) = old.inbound.pop_due(far) {
                let mut ctx = UdpContext {
                    worker: self.index,
                    now: Instant::now(),
                    send: &mut self.send,
                    backend: Some(self.backend.as_mut()),
                    send_errors: &mut self.counters.send_errors,
                    tick: None,
                    tick_late: Duration::ZERO,
                    cond: None,
                };
                self.service.on_datagram(&mut ctx, h.addr, &h.data);
            }
            self.send_all_held(&mut old);
        }
        self.cond = next;
        (
            self.counters.conditioner_lost,
            self.counters.conditioner_queue_drops,
        ) = self.cond_base;
    }

    /// Put every outbound datagram `cond` holds into the batch now, due or not (a change of
    /// settings, or the worker's last turn: the closes it sends must not be left behind).
    fn send_all_held(&mut self, cond: &mut Conditioner) {
        let far = Instant::now() + Duration::from_secs(3600);
        cond.capture(Instant::now(), &mut self.send);
        while let Some(h) = cond.outbound.pop_due(far) {
            if self.send.is_full() {
                let _ = self.backend.flush(&mut self.send);
            }
            let _ = self.send.push(h.addr, &h.data);
        }
    }

    fn fire_timers(&mut self, now: Instant) {
        let mut due = false;
        self.timers.advance(now, |TimerEvent::Tick| due = true);
        if !due {
            return;
        }
        let mut ctx = UdpContext {
            worker: self.index,
            now,
            send: &mut self.send,
            backend: Some(self.backend.as_mut()),
            send_errors: &mut self.counters.send_errors,
            tick: self.tick.as_ref().map(|g| g.next),
            tick_late: self.tick.as_ref().map_or(Duration::ZERO, |g| {
                now.saturating_duration_since(g.due(g.next))
            }),
            cond: self.cond.as_deref_mut(),
        };
        self.service.on_tick(&mut ctx);
        self.cell.tick_duration.record(now.elapsed());
        if let Some(grid) = self.tick.as_mut() {
            // On the grid: a late wake-up does not push the later ticks back; ticks whose due
            // time already passed are skipped and counted, not run back to back.
            let (late, skipped, next) = grid.advance(now);
            let c = &mut self.counters;
            c.ticks += 1;
            c.ticks_skipped += skipped;
            if late > grid.period / 2 {
                c.ticks_late += 1;
            }
            self.cell.tick_lateness.record(late);
            let late_ns = u64::try_from(late.as_nanos()).unwrap_or(u64::MAX);
            c.tick_lateness_max_ns = c.tick_lateness_max_ns.max(late_ns);
            self.timers.insert(next, TimerEvent::Tick);
        }
    }

    fn finish_sends(&mut self, deadline: Instant) -> Result<(), platform::Error> {
        while !self.send.is_empty() {
            let sent = self.backend.flush(&mut self.send)?;
            if sent == 0 {
                if Instant::now() >= deadline {
                    self.counters.send_errors += self.send.len() as u64;
                    tracing::warn!(
                        worker = self.index,
                        dropped = self.send.len(),
                        "shutdown: socket would not take the last datagrams"
                    );
                    self.send.clear();
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        Ok(())
    }

    fn sync_counters(&mut self) {
        let s = self.backend.stats();
        self.counters.datagrams_out = s.datagrams_out;
        self.counters.batches_in = s.batches_in;
        self.counters.batches_out = s.batches_out;
        self.counters.syscalls = s.syscalls;
        self.counters.send_errors = self.counters.send_errors.max(s.send_errors);
        if let Some(d) = self.backend.socket_drops() {
            self.counters.socket_drops = d;
        }
        if let Some(c) = &self.cond {
            let (lost, queue) = c.drops();
            self.counters.conditioner_lost = self.cond_base.0 + lost;
            self.counters.conditioner_queue_drops = self.cond_base.1 + queue;
        }
        self.cell.publish(&self.counters);
    }
}

struct WorkerHandle {
    thread: Option<JoinHandle<Result<WorkerCounters, platform::Error>>>,
    waker: Waker,
    cell: Arc<CounterCell>,
    core: Option<usize>,
}

/// A set of running workers: what every server kind holds. Dropping it stops and joins them.
pub(crate) struct WorkerSet {
    pub local_addr: SocketAddr,
    pub io_model: IoModel,
    pub backend_kind: BackendKind,
    pub selection_reason: String,
    pub socket_info: Vec<SocketInfo>,
    stop: Arc<AtomicBool>,
    workers: Vec<WorkerHandle>,
    /// The link conditioner's settings, read by every worker.
    pub conditioner: Arc<ConditionerControl>,
}

/// Bind the sockets a configuration asks for: one per worker (`SO_REUSEPORT`, same port) for
/// per-core, one shared by duplicate descriptors for shared. Per-core sockets are steered by
/// `rules` (the service's own bytes naming the worker), then by source port.
fn bind_sockets(
    cfg: &UdpServerConfig,
    n: usize,
    rules: &[platform::SteerRule],
) -> Result<Vec<BoundSocket>, RuntimeError> {
    let mut sc = SocketConfig::new(cfg.bind);
    sc.recv_buffer = cfg.recv_buffer;
    sc.send_buffer = cfg.send_buffer;
    sc.reuse_port = cfg.io_model == IoModel::PerCore;
    if cfg.dont_fragment {
        sc.pmtu = platform::PmtuDiscovery::Do;
    }
    let first = platform::bind(&sc)?;
    let mut sockets = Vec::with_capacity(n);
    // Later per-core sockets join the port the first one got (port 0 resolves to a real port).
    sc.addr = first.local_addr();
    for _ in 1..n {
        let s = match cfg.io_model {
            IoModel::PerCore => platform::bind(&sc)?,
            IoModel::Shared => first.try_clone()?,
        };
        sockets.push(s);
    }
    sockets.insert(0, first);
    if cfg.io_model == IoModel::PerCore && n > 1 && cfg.steer_by_source_port {
        if let Err(e) = platform::steer_reuseport(&sockets[0], n, rules) {
            tracing::warn!(error = %e, "per-core sockets keep the kernel's 4-tuple hash");
        }
    }
    Ok(sockets)
}

impl WorkerSet {
    /// Bind the sockets, start one worker per socket driving `make_service(i)`, and return once
    /// every worker's backend is up. `make_service` runs on the calling thread. `steering`:
    /// rules by which per-core sockets route datagrams that name their worker (see
    /// [`platform::steer_reuseport`]).
    pub(crate) fn start<S, F>(
        config: &UdpServerConfig,
        steering: &[platform::SteerRule],
        mut make_service: F,
    ) -> Result<WorkerSet, RuntimeError>
    where
        S: Service,
        F: FnMut(usize, SocketAddr) -> S,
    {
        config.validate()?;
        let n = config.resolved_threads();
        let sockets = bind_sockets(config, n, steering)?;
        let cores = if config.io_model == IoModel::PerCore {
            let cores = core_affinity::get_core_ids().unwrap_or_default();
            if config.pinning.pins(n, cores.len()) {
                cores
            } else {
                Vec::new()
            }
        } else {
            Vec::new()
        };
        let stop = Arc::new(AtomicBool::new(false));
        let mut set = WorkerSet {
            local_addr: sockets[0].local_addr(),
            io_model: config.io_model,
            backend_kind: BackendKind::Auto,
            selection_reason: String::new(),
            socket_info: sockets.iter().map(|s| s.info().clone()).collect(),
            stop: stop.clone(),
            workers: Vec::with_capacity(n),
            conditioner: ConditionerControl::new(config.conditioner),
        };
        let settings = WorkerSettings::from_config(config);
        for (index, socket) in sockets.into_iter().enumerate() {
            let service = make_service(index, set.local_addr);
            let core = (!cores.is_empty()).then(|| cores[index % cores.len()]);
            let cell = Arc::new(CounterCell::default());
            let (ready_tx, ready_rx) = mpsc::sync_channel(1);
            let spawn = SpawnArgs {
                index,
                core,
                socket,
                backend: config.backend.clone(),
                stop: stop.clone(),
                cell: cell.clone(),
                settings: settings.clone(),
                cond_ctl: set.conditioner.clone(),
            };
            let thread = std::thread::Builder::new()
                .name(format!("ricochet-w{index}"))
                .spawn(move || {
                    // Marks the worker ended however its thread leaves (a panic included).
                    let _ended = EndedGuard(spawn.cell.clone());
                    spawn.run(service, ready_tx)
                })
                .map_err(|source| RuntimeError::Spawn {
                    worker: index,
                    source,
                })?;
            let ready = ready_rx.recv().map_err(|_| RuntimeError::WorkerPanicked {
                worker: index,
                message: "worker exited before its backend was ready".into(),
            })?;
            match ready {
                Ok((kind, reason, waker)) => {
                    set.backend_kind = kind;
                    if set.selection_reason.is_empty() {
                        set.selection_reason = reason;
                    }
                    set.workers.push(WorkerHandle {
                        thread: Some(thread),
                        waker,
                        cell,
                        core: core.map(|c| c.id),
                    });
                }
                Err(e) => {
                    let _ = thread.join();
                    // Dropping `set` stops the workers already started.
                    return Err(RuntimeError::Worker {
                        worker: index,
                        source: e,
                    });
                }
            }
        }
        Ok(set)
    }

    /// New link conditioner settings (or none) for every worker, from their next turn.
    pub(crate) fn set_conditioner(
        &self,
        conditioner: Option<super::conditioner::LinkConditioner>,
    ) -> Result<(), RuntimeError> {
        if let Some(c) = &conditioner {
            c.validate()?;
        }
        self.conditioner.set(conditioner);
        for w in &self.workers {
            // A worker asleep until its next deadline takes the change now.
            let _ = w.waker.wake();
        }
        Ok(())
    }

    /// Number of workers.
    pub(crate) fn len(&self) -> usize {
        self.workers.len()
    }

    /// Every worker's live counter cell, by index (the metrics endpoint and health read them).
    pub(crate) fn cells(&self) -> Vec<Arc<CounterCell>> {
        self.workers.iter().map(|w| w.cell.clone()).collect()
    }

    /// The core each worker is pinned to, by index.
    pub(crate) fn cores(&self) -> Vec<Option<usize>> {
        self.workers.iter().map(|w| w.core).collect()
    }

    /// Wakers of every worker, by index.
    pub(crate) fn wakers(&self) -> Vec<Waker> {
        self.workers.iter().map(|w| w.waker.clone()).collect()
    }

    /// Live counters of every worker (published every few loop turns).
    pub(crate) fn counters(&self) -> Vec<WorkerCounters> {
        self.workers
            .iter()
            .enumerate()
            .map(|(i, w)| w.cell.read(i, w.core))
            .collect()
    }

    /// True once a worker thread has ended on its own (an I/O error or a panic in its
    /// handler): [`WorkerSet::stop_and_join`] reports why.
    pub(crate) fn any_ended(&self) -> bool {
        self.workers
            .iter()
            .any(|w| w.thread.as_ref().is_some_and(|t| t.is_finished()))
    }

    /// Stop every worker (each finishes what it received and what its service must still
    /// send), join them and return their final counters.
    pub(crate) fn stop_and_join(&mut self) -> Result<Vec<WorkerCounters>, RuntimeError> {
        self.stop.store(true, Ordering::Release);
        for w in &self.workers {
            // A failed wake only delays the stop until the worker's next timeout.
            let _ = w.waker.wake();
        }
        let mut out = Vec::with_capacity(self.workers.len());
        let mut first_error = None;
        for (i, w) in self.workers.iter_mut().enumerate() {
            let Some(thread) = w.thread.take() else {
                continue;
            };
            match thread.join() {
                Ok(Ok(c)) => out.push(c),
                Ok(Err(source)) => {
                    first_error.get_or_insert(RuntimeError::Worker { worker: i, source });
                }
                Err(panic) => {
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    first_error.get_or_insert(RuntimeError::WorkerPanicked { worker: i, message });
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

impl Drop for WorkerSet {
    fn drop(&mut self) {
        if self.workers.iter().any(|w| w.thread.is_some()) {
            let _ = self.stop_and_join();
        }
    }
}

/// Marks a worker's counter cell ended when dropped (health reads it).
struct EndedGuard(Arc<CounterCell>);

impl Drop for EndedGuard {
    fn drop(&mut self) {
        self.0.set_busy(None);
        self.0.set_ended();
    }
}

type Ready = Result<(BackendKind, String, Waker), platform::Error>;

/// Everything a worker thread needs besides its service.
struct SpawnArgs {
    index: usize,
    core: Option<core_affinity::CoreId>,
    socket: BoundSocket,
    backend: BackendConfig,
    stop: Arc<AtomicBool>,
    cell: Arc<CounterCell>,
    settings: WorkerSettings,
    cond_ctl: Arc<ConditionerControl>,
}

/// Wakes a worker of the tick strategy, which sleeps parked until its tick.
struct UnparkingWaker(std::thread::Thread);

impl platform::Wake for UnparkingWaker {
    fn wake(&self) -> std::io::Result<()> {
        self.0.unpark();
        Ok(())
    }
}

impl SpawnArgs {
    fn run<S: Service>(
        self,
        service: S,
        ready: mpsc::SyncSender<Ready>,
    ) -> Result<WorkerCounters, platform::Error> {
        if let Some(core) = self.core {
            core_affinity::set_for_current(core);
        }
        if let Some(slice) = self.settings.slice {
            // A hint: without it the worker still works, only with the default slice.
            match platform::sched::request_time_slice(slice) {
                Ok(true) => {}
                Ok(false) => tracing::debug!(
                    worker = self.index,
                    "the kernel ignores time-slice requests; the worker keeps the default slice"
                ),
                Err(e) => tracing::debug!(
                    worker = self.index,
                    error = %e,
                    "time-slice request refused; the worker keeps the default slice"
                ),
            }
        }
        // The backend is built, polled and dropped on this thread only: an io_uring ring may
        // then defer its completion work to this thread's own polls (`single_thread`).
        let backend_config = platform::BackendConfig {
            single_thread: true,
            ..self.backend
        };
        let backend = match platform::open(self.socket, &backend_config) {
            Ok(b) => b,
            Err(e) => {
                let _ = ready.send(Err(e));
                return Ok(WorkerCounters::default());
            }
        };
        let waker = if self.settings.idle == IdleStrategy::Tick {
            // A worker sleeping until its tick is parked, never blocked in the backend (every
            // poll of it is a zero-time one).
            Waker::new(Arc::new(UnparkingWaker(std::thread::current())))
        } else {
            backend.waker()
        };
        let _ = ready.send(Ok((
            backend.kind(),
            backend.selection_reason().to_owned(),
            waker,
        )));
        let now = Instant::now();
        let mut send = SendBatch::new(self.settings.send_batch);
        send.set_coalescing(self.settings.coalesce);
        Worker {
            index: self.index,
            next_sync: now,
            tick: None,
            idle_gap: IdleGap::default(),
            backend,
            service,
            send,
            timers: TimerWheel::new(now, Duration::from_millis(1)),
            stop: self.stop,
            cell: self.cell,
            counters: WorkerCounters {
                worker: self.index,
                core: self.core.map(|c| c.id),
                ..WorkerCounters::default()
            },
            settings: self.settings,
            cond: self
                .cond_ctl
                .get()
                .and_then(|c| Conditioner::new(&c, self.index as u64)),
            cond_generation: self.cond_ctl.generation(),
            cond_ctl: self.cond_ctl,
            cond_base: (0, 0),
        }
        .run()
    }
}

#[cfg(test)]
mod tests {
    use super::{IdleGap, TickGrid};
    use std::time::{Duration, Instant};

    #[test]
    fn ticks_stay_on_the_grid_and_skip_what_a_stall_missed() {
        let start = Instant::now();
        let ms = Duration::from_millis;
        let mut g = TickGrid {
            start,
            period: ms(10),
            next: 1,
        };
        // Tick 1 runs 3 ms late: tick 2 is still due at 20 ms, not 23.
        assert_eq!(g.advance(start + ms(13)), (ms(3), 0, start + ms(20)));
        // On time.
        assert_eq!(g.advance(start + ms(20)), (ms(0), 0, start + ms(30)));
        // Tick 3 runs at 57 ms: 40 and 50 passed without a tick; the next is due at 60.
        assert_eq!(g.advance(start + ms(57)), (ms(27), 2, start + ms(60)));
        // Exactly at a due time that already passed: skipped too, the next is a period on.
        assert_eq!(g.advance(start + ms(70)), (ms(10), 1, start + ms(80)));
    }

    #[test]
    fn balanced_spins_only_while_work_returns_quickly() {
        let spin_for = Duration::from_micros(50);
        let mut g = IdleGap::default();
        // A fresh worker has seen no gap: it spins (the configured behaviour).
        assert!(g.spin_pays(spin_for));
        for _ in 0..8 {
            g.record(Duration::from_micros(5));
        }
        assert!(g.spin_pays(spin_for), "5 µs gaps: spin");
        // Work now takes 200 µs to come back: the average crosses 25 µs within a few gaps.
        let mut turns = 0;
        while g.spin_pays(spin_for) {
            g.record(Duration::from_micros(200));
            turns += 1;
            assert!(turns < 10, "still spinning after {turns} long gaps");
        }
        // And back once gaps are short again.
        while !g.spin_pays(spin_for) {
            g.record(Duration::ZERO);
            turns += 1;
            assert!(turns < 60);
        }
        // A parked worker's idle hours do not overflow the average.
        g.record(Duration::from_secs(3600 * 24 * 365));
        assert!(!g.spin_pays(spin_for));
    }
}
