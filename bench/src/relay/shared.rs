//! The state the relay's handle and its thread share: the stop flag, snapshot requests, and the
//! counters the thread publishes.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Condvar, Mutex, MutexGuard};

use super::counters::RelayCounters;

/// State shared by the handle and the relay thread.
#[derive(Debug, Default)]
pub(super) struct Shared {
    /// Set by the handle: the thread exits at its next turn.
    pub(super) stop: AtomicBool,
    /// Snapshot requests so far; the thread publishes when it sees a new one.
    pub(super) requested: AtomicU64,
    pub(super) published: Mutex<Published>,
    pub(super) cond: Condvar,
}

#[derive(Debug, Default)]
pub(super) struct Published {
    /// The request number the snapshot answers.
    pub(super) generation: u64,
    pub(super) counters: RelayCounters,
    /// The thread has exited (the snapshot is final).
    pub(super) finished: bool,
    /// Why the thread stopped early, if it did.
    pub(super) error: Option<String>,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, Published> {
        // A panic while holding the lock cannot leave the counters inconsistent: they are
        // replaced whole.
        self.published.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn publish(&self, generation: u64, counters: RelayCounters, finished: bool) {
        let mut p = self.lock();
        p.generation = p.generation.max(generation);
        p.counters = counters;
        p.finished |= finished;
        drop(p);
        self.cond.notify_all();
    }
}
