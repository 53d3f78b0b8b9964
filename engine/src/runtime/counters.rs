//! Per-worker counters: written by one worker, readable from any thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use super::ops::hist::{Hist, TICK_BOUNDS};

/// A snapshot of one worker's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerCounters {
    /// Worker index.
    pub worker: usize,
    /// The core it is pinned to, if pinned.
    pub core: Option<usize>,
    /// Loop turns (backend polls).
    pub loop_turns: u64,
    /// Datagrams handed to the handler.
    pub datagrams_in: u64,
    /// UDP payload bytes of those datagrams.
    pub bytes_in: u64,
    /// Datagrams the kernel accepted for sending.
    pub datagrams_out: u64,
    /// Non-empty receive batches.
    pub batches_in: u64,
    /// Non-empty send submissions.
    pub batches_out: u64,
    /// System calls the backend made.
    pub syscalls: u64,
    /// Longest loop turn spent working (after the wait), in nanoseconds.
    pub max_turn_ns: u64,
    /// Sends refused by the send batch or failed in the kernel.
    pub send_errors: u64,
    /// Datagrams that arrived truncated (larger than the receive buffer).
    pub truncated: u64,
    /// Kernel drops on this worker's socket (`SO_RXQ_OVFL`), where counted.
    pub socket_drops: u64,
    /// Ticks run ([`UdpServerConfig::tick`](super::UdpServerConfig::tick)). Tick `k` is due
    /// at start + k × tick: a late tick does not move the ones after it.
    pub ticks: u64,
    /// Ticks that ran more than half a period after their due time.
    pub ticks_late: u64,
    /// Due times that passed without a tick because an earlier tick (or the loop) ran past
    /// them: missed ticks are skipped and counted, never run back to back.
    pub ticks_skipped: u64,
    /// Longest a tick ran after its due time, in nanoseconds.
    pub tick_lateness_max_ns: u64,
    /// Time spent working (loop turns, after each wait), in nanoseconds: its rate is the
    /// worker's busy fraction.
    pub busy_ns: u64,
    /// Datagrams the link conditioner lost on purpose (at random or in bursts), both ways.
    pub conditioner_lost: u64,
    /// Datagrams the link conditioner dropped because its queue was full, both ways.
    pub conditioner_queue_drops: u64,
}

/// Live counters of one worker, padded to its own cache lines.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct CounterCell {
    loop_turns: AtomicU64,
    datagrams_in: AtomicU64,
    bytes_in: AtomicU64,
    busy_ns: AtomicU64,
    datagrams_out: AtomicU64,
    batches_in: AtomicU64,
    batches_out: AtomicU64,
    syscalls: AtomicU64,
    max_turn_ns: AtomicU64,
    send_errors: AtomicU64,
    truncated: AtomicU64,
    socket_drops: AtomicU64,
    ticks: AtomicU64,
    ticks_late: AtomicU64,
    ticks_skipped: AtomicU64,
    tick_lateness_max_ns: AtomicU64,
    conditioner_lost: AtomicU64,
    conditioner_queue_drops: AtomicU64,
    /// How long each tick's handler ran.
    pub(crate) tick_duration: Hist<{ TICK_BOUNDS.len() }>,
    /// How late each tick ran after its due time.
    pub(crate) tick_lateness: Hist<{ TICK_BOUNDS.len() }>,
    /// When the loop turn in progress started (ns after `epoch`, plus one); 0 while the
    /// worker waits for work. A turn that stays in progress is a stuck worker.
    busy_since: AtomicU64,
    /// Set when the worker's thread has ended, however (a panic included).
    ended: AtomicBool,
    epoch: Instant,
}

impl Default for CounterCell {
    fn default() -> Self {
        CounterCell {
            loop_turns: AtomicU64::new(0),
            datagrams_in: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            datagrams_out: AtomicU64::new(0),
            batches_in: AtomicU64::new(0),
            batches_out: AtomicU64::new(0),
            syscalls: AtomicU64::new(0),
            max_turn_ns: AtomicU64::new(0),
            send_errors: AtomicU64::new(0),
            truncated: AtomicU64::new(0),
            socket_drops: AtomicU64::new(0),
            ticks: AtomicU64::new(0),
            ticks_late: AtomicU64::new(0),
            ticks_skipped: AtomicU64::new(0),
            tick_lateness_max_ns: AtomicU64::new(0),
            conditioner_lost: AtomicU64::new(0),
            conditioner_queue_drops: AtomicU64::new(0),
            tick_duration: Hist::new(&TICK_BOUNDS),
            tick_lateness: Hist::new(&TICK_BOUNDS),
            busy_since: AtomicU64::new(0),
            ended: AtomicBool::new(false),
            epoch: Instant::now(),
        }
    }
}

impl CounterCell {
    /// A loop turn starts working (`Some(now)`) or the worker goes back to waiting (`None`).
    pub(crate) fn set_busy(&self, since: Option<Instant>) {
        let v = since.map_or(0, |t| {
            u64::try_from(t.saturating_duration_since(self.epoch).as_nanos())
                .unwrap_or(u64::MAX - 1)
                + 1
        });
        self.busy_since.store(v, Relaxed);
    }

    /// How long the turn in progress has been running, if the worker is in one.
    pub(crate) fn busy_for(&self, now: Instant) -> Option<Duration> {
        let v = self.busy_since.load(Relaxed);
        let since_epoch = now.saturating_duration_since(self.epoch);
        (v != 0).then(|| since_epoch.saturating_sub(Duration::from_nanos(v - 1)))
    }

    /// The worker's thread ended.
    pub(crate) fn set_ended(&self) {
        self.ended.store(true, Relaxed);
    }

    /// True once the worker's thread has ended.
    pub(crate) fn has_ended(&self) -> bool {
        self.ended.load(Relaxed)
    }

    /// Publish a snapshot (single writer: plain relaxed stores, no read-modify-write).
    pub(crate) fn publish(&self, c: &WorkerCounters) {
        self.loop_turns.store(c.loop_turns, Relaxed);
        self.datagrams_in.store(c.datagrams_in, Relaxed);
        self.bytes_in.store(c.bytes_in, Relaxed);
        self.busy_ns.store(c.busy_ns, Relaxed);
        self.datagrams_out.store(c.datagrams_out, Relaxed);
        self.batches_in.store(c.batches_in, Relaxed);
        self.batches_out.store(c.batches_out, Relaxed);
        self.syscalls.store(c.syscalls, Relaxed);
        self.max_turn_ns.store(c.max_turn_ns, Relaxed);
        self.send_errors.store(c.send_errors, Relaxed);
        self.truncated.store(c.truncated, Relaxed);
        self.socket_drops.store(c.socket_drops, Relaxed);
        self.ticks.store(c.ticks, Relaxed);
        self.ticks_late.store(c.ticks_late, Relaxed);
        self.ticks_skipped.store(c.ticks_skipped, Relaxed);
        self.tick_lateness_max_ns
            .store(c.tick_lateness_max_ns, Relaxed);
        self.conditioner_lost.store(c.conditioner_lost, Relaxed);
        self.conditioner_queue_drops
            .store(c.conditioner_queue_drops, Relaxed);
    }

    /// Read the last published snapshot.
    pub(crate) fn read(&self, worker: usize, core: Option<usize>) -> WorkerCounters {
        WorkerCounters {
            worker,
            core,
            loop_turns: self.loop_turns.load(Relaxed),
            datagrams_in: self.datagrams_in.load(Relaxed),
            bytes_in: self.bytes_in.load(Relaxed),
            busy_ns: self.busy_ns.load(Relaxed),
            datagrams_out: self.datagrams_out.load(Relaxed),
            batches_in: self.batches_in.load(Relaxed),
            batches_out: self.batches_out.load(Relaxed),
            syscalls: self.syscalls.load(Relaxed),
            max_turn_ns: self.max_turn_ns.load(Relaxed),
            send_errors: self.send_errors.load(Relaxed),
            truncated: self.truncated.load(Relaxed),
            socket_drops: self.socket_drops.load(Relaxed),
            ticks: self.ticks.load(Relaxed),
            ticks_late: self.ticks_late.load(Relaxed),
            ticks_skipped: self.ticks_skipped.load(Relaxed),
            tick_lateness_max_ns: self.tick_lateness_max_ns.load(Relaxed),
            conditioner_lost: self.conditioner_lost.load(Relaxed),
            conditioner_queue_drops: self.conditioner_queue_drops.load(Relaxed),
        }
    }
}
