//! Per-worker counters: written by one worker, readable from any thread.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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
}

/// Live counters of one worker, padded to its own cache lines.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct CounterCell {
    loop_turns: AtomicU64,
    datagrams_in: AtomicU64,
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
}

impl CounterCell {
    /// Publish a snapshot (single writer: plain relaxed stores, no read-modify-write).
    pub(crate) fn publish(&self, c: &WorkerCounters) {
        self.loop_turns.store(c.loop_turns, Relaxed);
        self.datagrams_in.store(c.datagrams_in, Relaxed);
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
    }

    /// Read the last published snapshot.
    pub(crate) fn read(&self, worker: usize, core: Option<usize>) -> WorkerCounters {
        WorkerCounters {
            worker,
            core,
            loop_turns: self.loop_turns.load(Relaxed),
            datagrams_in: self.datagrams_in.load(Relaxed),
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
        }
    }
}
