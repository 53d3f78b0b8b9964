//! The timer queue over connections: every connection's next deadline, refreshed once it has
//! sent what it has, and the timers run when due.

use std::time::Instant;

use super::state::{Endpoint, QueuePeaks};
use crate::Connection;

impl Endpoint {
    /// Earliest timer of any connection (may lie in the past: then a transmission or timer is
    /// due now; call `handle_timeout` and `poll_transmit`). After anything that may give a
    /// connection something to send (`handle_datagram`, `send`, `close`, `accept`,
    /// `handle_timeout`, ...) it is the instant the endpoint was made, i.e. due now, until
    /// `poll_transmit` has returned `None`: a connection's deadline is recomputed once it has
    /// sent what it has, not at every packet.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.dirty.is_empty() {
            self.timers.peek()
        } else {
            Some(self.born)
        }
    }

    /// Run every connection timer that is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        // Deadlines of connections changed since their last `poll_transmit` visit first: any of
        // them may be due (an embedder need not drain `poll_transmit` before calling this).
        for i in 0..self.dirty.len() {
            let idx = self.dirty[i];
            self.hint_ahead(self.dirty.get(i + 1), self.dirty.get(i + 2));
            self.refresh_timer(idx);
        }
        // Run the due entries in deadline order, one at a time. A connection run here is
        // marked stale and queued for `poll_transmit`: its deadline goes back in the queue only
        // at its refresh, so it does not run again in this call, and running it leaves the
        // queue's order as it was (no list of the due entries is needed: one would grow with
        // the sessions whose timers fall due together).
        while let Some((_, idx)) = self.timers.pop_due(now) {
            let (next, after) = self.timers.due_ahead(now);
            self.hint_ahead(next.as_ref(), after.as_ref());
            self.with_conn(idx, |c| c.handle_timeout(now));
            self.touch(idx);
        }
        self.shrink_queues(now);
    }

    /// Gives back queue capacity a burst grew once the queues stay mostly empty (a server that
    /// served a wave of traffic keeps its sessions, not the wave's buffers). A queue is judged
    /// by the longest it grew over the last one to two trim windows, not by its length now: a
    /// server on a tick fills its queues and drains them every tick, and shrinking them to
    /// what is left after a drain would free and regrow them every tick.
    fn shrink_queues(&mut self, now: Instant) {
        /// The shortest time a queue's peak is remembered.
        const TRIM_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);
        fn sparse(peak: usize, cap: usize) -> bool {
            cap > 64 && peak < cap / 4
        }
        if now >= self.peaks_until {
            self.peaks = [QueuePeaks::default(), self.peaks[0]];
            self.peaks_until = now + TRIM_WINDOW;
        }
        let [a, b] = self.peaks;
        self.timers.shrink();
        let peak = self.dirty.len().max(a.dirty).max(b.dirty);
        if sparse(peak, self.dirty.capacity()) {
            self.dirty.shrink_to(peak * 2);
        }
        let peak = self.events.len().max(a.events).max(b.events);
        if sparse(peak, self.events.capacity()) {
            self.events.shrink_to(peak * 2);
        }
        let peak = self.stateless.len().max(a.stateless).max(b.stateless);
        if sparse(peak, self.stateless.capacity()) {
            self.stateless.shrink_to(peak * 2);
        }
    }

    /// Puts a connection's current deadline in the timer queue if it is stale.
    pub(super) fn refresh_timer(&mut self, idx: u32) {
        let Some(slot) = self.slots.get_mut(idx as usize) else {
            return;
        };
        if !slot.timer_stale {
            return;
        }
        slot.timer_stale = false;
        let t = slot.conn.as_ref().and_then(Connection::poll_timeout);
        // (An unchanged deadline leaves the queue as it is.)
        self.timers.set(idx, t);
    }
}
