//! The timer room: every deadline the connection keeps, as one [`Timer`] enum and one
//! [`TimerTable`] of their deadlines. `poll_timeout` is the table's minimum and
//! `handle_timeout` dispatches by timer. (The endpoint's `TimerQueue` orders connections by
//! their `poll_timeout`; this is the per-connection side.)

use std::time::Instant;

/// The moments the connection's timers count from.
#[derive(Debug)]
pub(super) struct Activity {
    /// Last datagram sent (keepalive, close resends, and every "send now" wakeup).
    pub(super) last_sent: Instant,
    /// Last packet accepted from the peer (idle timeout, immediate ACKs).
    pub(super) last_recv: Instant,
    /// Last time data (a message fragment) was sent or received (the idle trim counts from
    /// it, if `Connection::trim_pending`).
    pub(super) last_data: Instant,
}
