//! The timer queue over connections: every connection's next deadline, refreshed once it has
//! sent what it has, and the timers run when due.

use std::time::Instant;

use super::state::Endpoint;
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
        // Take the due entries first: a connection run here is marked stale and queued for
        // `poll_transmit`, and must not run again in this call.
        let mut due = std::mem::take(&mut self.due);
        while let Some(entry) = self.timers.pop_due(now) {
            due.push(entry);
        }
        for (i, &(_, idx)) in due.iter().enumerate() {
            self.hint_ahead(due.get(i + 1).map(|e| &e.1), due.get(i + 2).map(|e| &e.1));
            self.with_conn(idx, |c| c.handle_timeout(now));
            self.touch(idx);
        }
        due.clear();
        self.due = due;
        self.shrink_queues();
    }

    /// Gives back queue capacity a burst grew once the queues are mostly empty again (a server
    /// that served a wave of traffic keeps its sessions, not the wave's buffers). Halving at a
    /// quarter full keeps the cost amortized and never thrashes.
    fn shrink_queues(&mut self) {
        fn sparse(len: usize, cap: usize) -> bool {
            cap > 64 && len < cap / 4
        }
        self.timers.shrink();
        if sparse(self.dirty.len(), self.dirty.capacity()) {
            self.dirty.shrink_to(self.dirty.len() * 2);
        }
        if sparse(self.events.len(), self.events.capacity()) {
            self.events.shrink_to(self.events.len() * 2);
        }
        if sparse(self.stateless.len(), self.stateless.capacity()) {
            self.stateless.shrink_to(self.stateless.len() * 2);
        }
        if sparse(0, self.due.capacity()) {
            self.due = Vec::new();
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
        if t != self.timers.deadline(idx) {
            self.timers.set(idx, t);
        }
    }
}
