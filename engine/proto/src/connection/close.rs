//! The close room: a graceful close (linger while reliable data drains, then close frames and
//! the drain period), the peer's close, the idle timeout, and the end of the connection.

use std::time::Instant;

use crate::CloseReason;

/// Close frames sent when closing locally.
pub(super) const CLOSE_SENDS: u32 = 3;

/// Closing state.
#[derive(Debug, Default)]
pub(super) struct Closing {
    /// Why, and whether the peer closed.
    pub(super) reason: Option<(CloseReason, bool)>,
    /// A local close gives queued reliable data until then.
    pub(super) linger_deadline: Option<Instant>,
    /// Close frames still to send.
    pub(super) sends_left: u32,
    /// When the next close frame goes out (draining).
    pub(super) next_send: Option<Instant>,
    /// When draining ends.
    pub(super) drain_deadline: Option<Instant>,
}
