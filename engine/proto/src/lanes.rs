//! Lanes and fresh data: how a session shares its send rate between kinds of traffic.
//!
//! A *lane* groups channels ([`Config::lanes`]). Lanes are served by priority (a lower number
//! first); lanes of equal priority share what is left by weight, in bytes (start-time fair
//! queueing: each lane is charged its bytes divided by its weight, and the lane charged least
//! goes next). Within a lane, channels take turns fragment by fragment. A reliable fragment
//! that is sent again keeps its lane. Lanes are a sending decision only: nothing of them is on
//! the wire, and the peer may configure its own differently.
//!
//! On a narrow link (one where a full datagram takes over 2 ms to leave at the send rate, that
//! is below about 4.8 Mbit/s for 1,200 B) a packet that carries a lane's data is not topped up
//! with a lower-priority lane's: the high-priority message then waits at the bottleneck for
//! its own bytes, not for a full datagram's (9.6 ms at 1 Mbit/s), at the cost of one more,
//! small, datagram.
//!
//! What waits in a lane can be bounded three ways, each drop counted by cause in
//! [`UnsentDrops`]: a per-lane byte cap ([`Lane::queue_limit`]), a deadline per unreliable
//! message ([`SendOptions::deadline`]), and newest-only channels ([`Config::newest_only`]),
//! where a newer message replaces the queued one not yet begun.
//!
//! ```
//! use ricochet_proto::{ChannelKind, Config, Lane};
//!
//! // Channel 0 (reliable events) before everything; channel 1 (snapshots, newest only) and
//! // channel 2 (chat) share the rest 3:1.
//! let config = Config::game().with(|c| {
//!     c.channels = vec![
//!         ChannelKind::ReliableOrdered,
//!         ChannelKind::UnreliableSequenced,
//!         ChannelKind::ReliableUnordered,
//!     ];
//!     c.lanes = vec![
//!         Lane::new([0]).priority(0),
//!         Lane::new([1]).priority(1).weight(3).queue_limit(16 << 10),
//!         Lane::new([2]).priority(1).weight(1),
//!     ];
//!     c.newest_only = vec![1];
//! });
//! assert_eq!(config.validate(), Ok(()));
//! ```
//!
//! [`Config::lanes`]: crate::Config::lanes
//! [`Config::newest_only`]: crate::Config::newest_only

use std::time::{Duration, Instant};

/// One lane: channels that share a place in the send order ([`crate::Config::lanes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lane {
    /// The channel ids of this lane (each channel is in exactly one lane).
    pub channels: Vec<u8>,
    /// Lower goes first: a lane is served only when no lane of a lower number has anything
    /// it may send.
    pub priority: u8,
    /// Share of the rate among lanes of the same priority, in proportion (at least 1).
    pub weight: u16,
    /// Bytes this lane holds queued and not yet sent; `None`: no cap of its own (the session's
    /// [`crate::Config::send_queue_limit`] still holds). Past it, a send drops the lane's
    /// oldest unreliable messages (counted in [`UnsentDrops::lane_limit`]); a reliable
    /// message that would still not fit is refused with [`crate::SendError::QueueFull`].
    pub queue_limit: Option<usize>,
}

impl Lane {
    /// A lane of `channels`, priority 0, weight 1, no cap of its own.
    pub fn new(channels: impl IntoIterator<Item = u8>) -> Self {
        Lane {
            channels: channels.into_iter().collect(),
            priority: 0,
            weight: 1,
            queue_limit: None,
        }
    }

    /// With priority `priority` (lower goes first).
    pub fn priority(mut self, priority: u8) -> Self {
        self.priority = priority;
        self
    }

    /// With weight `weight` among lanes of its priority.
    pub fn weight(mut self, weight: u16) -> Self {
        self.weight = weight;
        self
    }

    /// With a cap of `bytes` queued.
    pub fn queue_limit(mut self, bytes: usize) -> Self {
        self.queue_limit = Some(bytes);
        self
    }
}

/// How one message is sent (`Connection::send_with`); the default is a plain `send`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SendOptions {
    /// Unreliable channels only: if the message has not been sent by then, it is dropped
    /// unsent (counted in [`UnsentDrops::deadline`]). A message cut into fragments loses the
    /// fragments not yet sent. Time is the caller's clock, as every `now` given to the
    /// connection.
    pub deadline: Option<Instant>,
}

impl SendOptions {
    /// Options with a deadline at `at`.
    pub fn deadline(at: Instant) -> Self {
        SendOptions { deadline: Some(at) }
    }
}

/// Unreliable messages dropped before they were sent, by cause. Their sum is
/// [`crate::ConnectionStats::unreliable_unsent`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnsentDrops {
    /// The channel's queue passed [`crate::Config::unreliable_queue_limit`].
    pub queue_limit: u64,
    /// The lane's queue passed its [`Lane::queue_limit`].
    pub lane_limit: u64,
    /// The message's [`SendOptions::deadline`] passed.
    pub deadline: u64,
    /// A newer message on a newest-only channel replaced it ([`crate::Config::newest_only`]).
    pub replaced: u64,
}

/// One lane as of now (`Connection::lane_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LaneStats {
    /// The lane's priority.
    pub priority: u8,
    /// The lane's weight.
    pub weight: u16,
    /// Bytes queued on the lane's channels and not yet sent for the first time.
    pub queued_bytes: usize,
    /// How long the lane's last queued byte is expected to wait at the current send rate:
    /// the bytes queued in lanes of a lower priority number, plus this lane's bytes scaled by
    /// its share among the lanes of its priority that have bytes queued, over the send rate
    /// (`Connection::send_rate`). Zero when nothing is queued; `Duration::MAX` when no rate is
    /// known.
    pub queue_time: Duration,
}
