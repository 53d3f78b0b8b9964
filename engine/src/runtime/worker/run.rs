//! The worker loop: poll (submit sends and wait), hand each received datagram to the service
//! (the receive pump), fire the tick, let the service produce its output, repeat; and the stop
//! sequence.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ricochet_platform as platform;
use ricochet_proto::PrefetchStage;

use super::conditioning::ConditionerLink;
use super::context::{Service, UdpContext};
use super::pace::{IdleGap, TickGrid, TimerEvent, WorkerSettings};
use super::port::Port;
use crate::runtime::conditioner::{Mode, Off, On};
use crate::runtime::config::IdleStrategy;
use crate::runtime::counters::WorkerCounters;
use crate::runtime::timer::TimerWheel;

/// With [`IdleStrategy::Tick`]: receive batches a worker reads back to back after its sleep
/// before it runs the tick and the turn's output anyway (a flood must not hold timers back).
const MAX_DRAIN_BATCHES: u32 = 64;

/// Longest an idle worker leaves its live counters unpublished.
const SYNC_IDLE: Duration = Duration::from_millis(100);

/// With [`IdleStrategy::Tick`]: longest sleep while sends wait for room in the socket.
const SEND_RETRY: Duration = Duration::from_millis(1);

/// One worker: its socket side, its service, its timers and how it paces itself.
pub(super) struct Worker<S> {
    pub(super) port: Port,
    pub(super) service: S,
    pub(super) cond: ConditionerLink,
    /// An idle turn publishes the counters from then on.
    pub(super) next_sync: Instant,
    pub(super) tick: Option<TickGrid>,
    pub(super) idle_gap: IdleGap,
    pub(super) timers: TimerWheel<TimerEvent>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) settings: WorkerSettings,
}

/// The loop's state that outlives one turn (and a switch between the loop's instantiations).
#[derive(Clone, Copy)]
struct LoopState {
    last_work: Instant,
    now: Instant,
    stop_deadline: Option<Instant>,
    /// The last poll found nothing to read: with the tick strategy the worker may sleep.
    drained: bool,
    /// Receive batches read back to back since the last tick-and-output step.
    drain_batches: u32,
}

impl<S: Service> Worker<S> {
    pub(super) fn run(mut self) -> Result<WorkerCounters, platform::Error> {
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
        let mut st = LoopState {
            last_work: start,
            now: start,
            stop_deadline: None,
            drained: true,
            drain_batches: 0,
        };
        // The conditioner off runs `Off`'s turns, the code a build without the feature runs;
        // a change of settings that turns it on or off ends one loop and starts the other.
        loop {
            let done = if self.cond.is_on() {
                self.turns::<On>(&mut st)?
            } else {
                self.turns::<Off>(&mut st)?
            };
            if done {
                // `finish` put the conditioner's drops into the counters already.
                self.port.sync_counters(None);
                return Ok(self.port.counters);
            }
        }
    }

    /// Loop turns under mode `M` until the worker stops (`true`) or the conditioner's
    /// settings call for the other mode (`false`, between turns: nothing received pending).
    #[inline(never)]
    fn turns<M: Mode>(&mut self, st: &mut LoopState) -> Result<bool, platform::Error> {
        // Locals while the loop runs (kept in registers), written back at a switch.
        let LoopState {
            mut last_work,
            mut now,
            mut stop_deadline,
            mut drained,
            mut drain_batches,
        } = *st;
        loop {
            // Settings the server changed since the last turn.
            if self
                .cond
                .reload_if_changed::<M, S>(&mut self.port, &mut self.service)
            {
                *st = LoopState {
                    last_work,
                    now,
                    stop_deadline,
                    drained,
                    drain_batches,
                };
                return Ok(false);
            }
            // Waiting from here until the poll returns: not a stuck turn.
            self.port.cell.set_busy(None);
            let stopping = self.stop.load(Ordering::Acquire);
            // Before the timeout: what the conditioner takes from the batch sets its next due.
            self.cond.condition_sends::<M>(now, &mut self.port.send);
            let mut timeout = if stopping {
                Some(Duration::ZERO)
            } else {
                self.timeout::<M>(now, last_work)
            };
            if self.settings.idle == IdleStrategy::Tick && timeout != Some(Duration::ZERO) {
                if drained {
                    // Sleep past arriving datagrams (a backend wait would return for each);
                    // the worker's waker unparks the thread for a stop or a mailbox message.
                    self.port.backend.flush(&mut self.port.send)?;
                    // Live counters stay current although a tick makes only a few turns.
                    self.port.sync_counters(self.cond.drops::<M>());
                    // Sends the socket would not take yet are retried soon, not at the tick.
                    let retry = (!self.port.send.is_empty()).then_some(SEND_RETRY);
                    match timeout.into_iter().chain(retry).min() {
                        Some(wait) => std::thread::park_timeout(wait),
                        None => std::thread::park(),
                    }
                }
                // Then read what came meanwhile, batch after batch, without waiting.
                timeout = Some(Duration::ZERO);
            }
            let outcome = self.port.backend.poll(&mut self.port.send, timeout)?;
            drained = outcome.received == 0;
            now = Instant::now();
            self.port.cell.set_busy(Some(now));
            self.port.counters.loop_turns += 1;
            if outcome.received > 0 {
                self.idle_gap
                    .record(now.saturating_duration_since(last_work));
                self.dispatch::<M>(now)?;
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
            self.cond
                .deliver_held::<M, S>(now, &mut self.port, &mut self.service);
            self.fire_timers::<M>(now);
            let service_done = {
                let mut ctx = self.port.ctx(now, self.cond.current::<M>());
                self.service.on_turn_end(&mut ctx);
                stopping && service_on_stop(&mut self.service, &mut ctx)
            };
            let worked = now.elapsed();
            let c = &mut self.port.counters;
            c.max_turn_ns = c.max_turn_ns.max(worked.as_nanos() as u64);
            c.busy_ns += worked.as_nanos() as u64;
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
                    self.cond.finish(&mut self.port);
                    self.port.finish_sends(limit)?;
                    return Ok(true);
                }
                if outcome.received == 0 && outcome.sent == 0 {
                    // Waiting for the service (e.g. close acknowledgements): don't spin hot.
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            // Every few turns, and on an idle turn at least every 100 ms (a reader of the live
            // counters must not see a quiet worker's last burst unpublished).
            if self.port.counters.loop_turns % 32 == 0
                || (outcome.received == 0 && now >= self.next_sync)
            {
                self.next_sync = now + SYNC_IDLE;
                self.port.sync_counters(self.cond.drops::<M>());
            }
        }
    }

    fn timeout<M: Mode>(&mut self, now: Instant, last_work: Instant) -> Option<Duration> {
        if self.settings.idle == IdleStrategy::Spin
            || (self.settings.idle == IdleStrategy::Balanced
                && now.saturating_duration_since(last_work) < self.settings.spin_for
                && self.idle_gap.spin_pays(self.settings.spin_for))
        {
            return Some(Duration::ZERO);
        }
        let mut deadline = match (
            self.timers.next_deadline(),
            service_next_deadline(&mut self.service),
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(due) = self.cond.next_due::<M>() {
            deadline = Some(deadline.map_or(due, |d| d.min(due)));
        }
        deadline.map(|d| d.saturating_duration_since(now))
    }

    /// The receive pump: every datagram of the batch the poll returned, in order, to the
    /// service (or into the conditioner's inbound queue).
    fn dispatch<M: Mode>(&mut self, now: Instant) -> Result<(), platform::Error> {
        let port = &mut self.port;
        // Submit early when the batch fills past this mark, so replies never run out of room.
        let high_water = port.send.capacity() / 2;
        // The length is re-read each time: a flush may append datagrams it reaped on the way.
        let mut i = 0;
        while i < port.backend.received().len() {
            i += 1;
            {
                let received = port.backend.received();
                let Some(d) = received.get(i - 1) else {
                    continue;
                };
                if d.truncated {
                    port.counters.truncated += 1;
                }
                let mut ctx = UdpContext {
                    worker: port.index,
                    now,
                    send: &mut port.send,
                    backend: None,
                    send_errors: &mut port.counters.send_errors,
                    tick: None,
                    tick_late: Duration::ZERO,
                    cond: self.cond.current::<M>(),
                };
                // Hints for the next two, so their connections' state is in cache by their turn.
                for (ahead, stage) in [(1, PrefetchStage::Parts), (2, PrefetchStage::Connection)] {
                    if let Some(next) = received.get(i - 1 + ahead) {
                        self.service.prefetch(next.data, stage);
                    }
                }
                if let Some(cond) = ctx.cond.as_deref_mut() {
                    // Held, and handed to the service when due (`deliver_held`).
                    cond.hold_received(now, d);
                } else {
                    for segment in d.segments() {
                        self.service.on_datagram(&mut ctx, d.src, segment);
                        port.counters.datagrams_in += 1;
                        port.counters.bytes_in += segment.len() as u64;
                    }
                }
            }
            if port.send.len() >= high_water {
                self.cond.condition_sends::<M>(now, &mut port.send);
                port.backend.flush(&mut port.send)?;
            }
        }
        Ok(())
    }

    fn fire_timers<M: Mode>(&mut self, now: Instant) {
        let mut due = false;
        self.timers.advance(now, |TimerEvent::Tick| due = true);
        if !due {
            return;
        }
        let mut ctx = self.port.ctx(now, self.cond.current::<M>());
        ctx.tick = self.tick.as_ref().map(|g| g.next);
        ctx.tick_late = self.tick.as_ref().map_or(Duration::ZERO, |g| {
            now.saturating_duration_since(g.due(g.next))
        });
        service_on_tick(&mut self.service, &mut ctx);
        let cell = &self.port.cell;
        cell.tick_duration.record(now.elapsed());
        if let Some(grid) = self.tick.as_mut() {
            // On the grid: a late wake-up does not push the later ticks back; ticks whose due
            // time already passed are skipped and counted, not run back to back.
            let (late, skipped, next) = grid.advance(now);
            let c = &mut self.port.counters;
            c.ticks += 1;
            c.ticks_skipped += skipped;
            if late > grid.period / 2 {
                c.ticks_late += 1;
            }
            self.port.cell.tick_lateness.record(late);
            let late_ns = u64::try_from(late.as_nanos()).unwrap_or(u64::MAX);
            c.tick_lateness_max_ns = c.tick_lateness_max_ns.max(late_ns);
            self.timers.insert(next, TimerEvent::Tick);
        }
    }
}

// The service's per-turn calls that both of the loop's instantiations make, kept out of line:
// with one instantiation (a build without the conditioner) the compiler would inline them and
// with two it would not, and the loop that runs with the conditioner off must be the same code
// in both builds. Once per turn, not per datagram.

#[inline(never)]
fn service_next_deadline<S: Service>(service: &mut S) -> Option<Instant> {
    service.next_deadline()
}

#[inline(never)]
fn service_on_tick<S: Service>(service: &mut S, ctx: &mut UdpContext<'_>) {
    service.on_tick(ctx);
}

#[inline(never)]
fn service_on_stop<S: Service>(service: &mut S, ctx: &mut UdpContext<'_>) -> bool {
    service.on_stop(ctx)
}
