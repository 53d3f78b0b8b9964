//! Per-connection statistics and drop counters.

use std::time::Duration;

/// Why an incoming datagram (or part of it) was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DropCause {
    /// Did not decode (truncated, bad length, bad fragment, unknown frame or packet type).
    Malformed,
    /// Another protocol version.
    VersionMismatch,
    /// No connection with that id.
    UnknownConnection,
    /// An ARQ packet number already received (a duplicate, or a datagram FEC already
    /// rebuilt).
    Duplicate,
    /// A packet number older than the replay window (protected sessions) or than the
    /// received ranges ARQ tracks.
    TooOld,
    /// Cookie invalid or expired.
    BadCookie,
    /// Handshake rate limit for the source address.
    RateLimited,
    /// A handshake packet that does not fit the connection's state.
    UnexpectedHandshake,
    /// Reassembly limits or the receive window were exhausted.
    FlowControl,
    /// Frame semantically invalid (unknown channel, inconsistent fragment count, oversize message).
    ProtocolViolation,
    /// A client hello reached an endpoint that is not listening.
    NotListening,
    /// FEC packet while no FEC receiver is attached. Not produced since FEC is wired in
    /// (every connection accepts its peer's FEC); kept so counter indices stay stable.
    FecUnsupported,
    /// The connection is closed.
    Closed,
    /// A protected session's packet whose tag did not verify: forged, damaged, truncated, or
    /// sealed with another key; or a handshake packet (challenge, accept, refusal, a token's
    /// proof) or stateless reset whose tag, proof or seal does not verify. Dropped before it
    /// changed anything.
    Unauthenticated,
    /// A protected session's packet number already authenticated once (a replay), in the
    /// replay window. Dropped before it was opened.
    Replay,
    /// A token handshake reached a server that was not told the wall-clock time
    /// ([`Endpoint::set_unix_time`](crate::Endpoint::set_unix_time)), so it cannot check
    /// expiry.
    NoClock,
}

impl DropCause {
    /// All causes, in counter order.
    pub const ALL: [DropCause; 16] = [
        Self::Malformed,
        Self::VersionMismatch,
        Self::UnknownConnection,
        Self::Duplicate,
        Self::TooOld,
        Self::BadCookie,
        Self::RateLimited,
        Self::UnexpectedHandshake,
        Self::FlowControl,
        Self::ProtocolViolation,
        Self::NotListening,
        Self::FecUnsupported,
        Self::Closed,
        Self::Unauthenticated,
        Self::Replay,
        Self::NoClock,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// Counters of dropped datagrams by cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DropCounters {
    counts: [u64; DropCause::ALL.len()],
}

impl DropCounters {
    /// Count one drop.
    pub fn add(&mut self, cause: DropCause) {
        self.counts[cause.index()] += 1;
    }
    /// Drops with this cause.
    pub fn get(&self, cause: DropCause) -> u64 {
        self.counts[cause.index()]
    }
    /// All drops.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// Buckets of [`RttSummary::buckets`]: bucket `i` counts samples of `2^i` to `2^(i+1)` - 1 µs
/// (bucket 0 also takes 0 µs); the last one takes everything from `2^27` µs (about 134 s) up.
pub const RTT_BUCKETS: usize = 28;

/// The RTT samples of one connection in a fixed-size summary: count, sum, extremes and a
/// log2-bucket histogram, 144 bytes that are never allocated. Percentiles from it are bucket
/// bounds (within a factor of 2); exact percentiles across many sessions come from the
/// runtime's per-worker histogram, fed by [`crate::Endpoint::drain_rtt_samples`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RttSummary {
    /// Samples recorded.
    pub samples: u64,
    /// Sum of every sample, µs (for the mean).
    pub sum_us: u64,
    /// Smallest sample, µs (`u64::MAX` before the first).
    pub min_us: u64,
    /// Largest sample, µs.
    pub max_us: u64,
    /// Sample counts per power-of-two range of microseconds (see [`RTT_BUCKETS`]).
    pub buckets: [u32; RTT_BUCKETS],
}

impl Default for RttSummary {
    fn default() -> Self {
        Self {
            samples: 0,
            sum_us: 0,
            min_us: u64::MAX,
            max_us: 0,
            buckets: [0; RTT_BUCKETS],
        }
    }
}

impl RttSummary {
    /// The bucket of a sample of `us` microseconds.
    pub fn bucket_of(us: u64) -> usize {
        (63 - us.max(1).leading_zeros() as usize).min(RTT_BUCKETS - 1)
    }

    /// Record one sample.
    pub fn record(&mut self, sample: Duration) {
        let us = u64::try_from(sample.as_micros()).unwrap_or(u64::MAX);
        self.samples += 1;
        self.sum_us = self.sum_us.saturating_add(us);
        self.min_us = self.min_us.min(us);
        self.max_us = self.max_us.max(us);
        let b = &mut self.buckets[Self::bucket_of(us)];
        *b = b.saturating_add(1);
    }

    /// Mean sample, if any.
    pub fn mean(&self) -> Option<Duration> {
        (self.samples > 0).then(|| Duration::from_micros(self.sum_us / self.samples))
    }

    /// Smallest sample, if any.
    pub fn min(&self) -> Option<Duration> {
        (self.samples > 0).then(|| Duration::from_micros(self.min_us))
    }

    /// Largest sample, if any.
    pub fn max(&self) -> Option<Duration> {
        (self.samples > 0).then(|| Duration::from_micros(self.max_us))
    }

    /// An upper bound of the `q` quantile (`0.0..=1.0`): the top of the bucket that holds it,
    /// never above the largest sample nor below the smallest. `None` before the first sample.
    pub fn quantile_bound(&self, q: f64) -> Option<Duration> {
        if self.samples == 0 {
            return None;
        }
        let total: u64 = self.buckets.iter().map(|&c| u64::from(c)).sum();
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (i, &c) in self.buckets.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                let top = if i + 1 == RTT_BUCKETS {
                    u64::MAX
                } else {
                    (2u64 << i) - 1
                };
                return Some(Duration::from_micros(top.min(self.max_us).max(self.min_us)));
            }
        }
        self.max()
    }
}

/// Statistics of one connection: a small `Copy` value computed when asked for
/// ([`crate::Connection::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct ConnectionStats {
    /// RTT samples (every acknowledgement of a new largest packet is one).
    pub rtt: RttSummary,
    /// Datagrams sent.
    pub packets_sent: u64,
    /// UDP payload bytes sent: every datagram as it went onto the wire (handshake, sealed
    /// data with its tag, FEC parity).
    pub bytes_sent: u64,
    /// Datagrams received and accepted.
    pub packets_received: u64,
    /// UDP payload bytes received: every datagram the connection accepted, as it came off
    /// the wire (handshake, sealed data with its tag, FEC framing and parity), the
    /// counterpart of `bytes_sent`. Dropped datagrams are not counted.
    pub bytes_received: u64,
    /// Packets declared lost.
    pub packets_lost: u64,
    /// Lost packets later acknowledged (spurious loss declarations).
    pub packets_spurious_lost: u64,
    /// Reliable fragments sent again (retransmissions and tail-loss probes).
    pub segments_retransmitted: u64,
    /// Reliable fragments sent for the first time.
    pub segments_sent: u64,
    /// Tail-loss probes sent.
    pub tail_loss_probes: u64,
    /// Retransmission timeouts.
    pub rto_count: u64,
    /// Messages delivered to the application.
    pub messages_delivered: u64,
    /// Unreliable messages dropped incomplete or stale.
    pub unreliable_dropped: u64,
    /// Unreliable messages this side dropped before sending them: their channel's queue
    /// passed [`crate::Config::unreliable_queue_limit`] (the congestion window held them
    /// back: a slow path, or a peer that stopped acknowledging), their lane's cap, their
    /// deadline, or a newer message on a newest-only channel replaced them
    /// ([`ConnectionStats::unsent`] by cause).
    pub unreliable_unsent: u64,
    /// [`ConnectionStats::unreliable_unsent`] by cause: the channel's queue limit, a lane's
    /// cap, a deadline, a newer message on a newest-only channel.
    pub unsent: crate::UnsentDrops,
    /// Drops by cause.
    pub drops: DropCounters,
    /// Current congestion window, bytes.
    pub cwnd: usize,
    /// Bytes in flight.
    pub bytes_in_flight: usize,
    /// The send rate congestion control estimates the path carries for this connection, bytes
    /// per second. With [`crate::CongestionController::Delay`]: the delivery rate measured
    /// while the sender used its rate (within [`crate::Config::min_send_rate`] and
    /// [`crate::Config::max_send_rate`]); while the application sends less than the path
    /// carries, the most it has been seen to deliver, not more. With NewReno: the window over
    /// the smoothed RTT.
    pub rate_estimate: u64,
    /// Current retransmission timeout (backoff included).
    pub rto: Duration,
    /// Smoothed RTT.
    pub srtt: Duration,
    /// Minimum RTT.
    pub min_rtt: Duration,
    /// Bytes held in reassembly now.
    pub reassembly_bytes: usize,
    /// Peak of `reassembly_bytes`.
    pub reassembly_peak: usize,
    /// Loss the peer last reported: (received, lost).
    pub peer_loss_report: (u64, u64),
    /// Forward error correction counters.
    pub fec: super::FecStats,
    /// The largest datagram (UDP payload bytes) new packets are built to: the base
    /// [`crate::Config::max_datagram_size`], or what path MTU discovery found
    /// ([`crate::PathMtuConfig`]).
    pub path_mtu: usize,
    /// Path MTU probes sent.
    pub path_mtu_probes: u64,
    /// Times the path stopped carrying the discovered size and the connection fell back to
    /// the base (black holes).
    pub path_mtu_black_holes: u32,
}

/// A connection's drop counters, allocated at its first drop: most sessions never drop a
/// datagram, and the counters would take 128 bytes of every one.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnectionDrops(Option<Box<DropCounters>>);

impl ConnectionDrops {
    /// Count one drop.
    pub(crate) fn add(&mut self, cause: DropCause) {
        self.0.get_or_insert_with(Default::default).add(cause);
    }

    /// The counts so far.
    pub(crate) fn get(&self) -> DropCounters {
        self.0.as_deref().copied().unwrap_or_default()
    }
}

/// The counters a connection keeps itself (the rest of [`ConnectionStats`] is derived from its
/// state when asked for).
#[derive(Debug, Clone, Default)]
pub(crate) struct Counters {
    pub(crate) rtt: RttSummary,
    pub(crate) packets_sent: u64,
    pub(crate) bytes_sent: u64,
    pub(crate) packets_received: u64,
    pub(crate) bytes_received: u64,
    pub(crate) packets_lost: u64,
    pub(crate) packets_spurious_lost: u64,
    pub(crate) segments_retransmitted: u64,
    pub(crate) segments_sent: u64,
    pub(crate) tail_loss_probes: u64,
    pub(crate) rto_count: u64,
    pub(crate) messages_delivered: u64,
    pub(crate) unreliable_unsent: u64,
    pub(crate) drops: ConnectionDrops,
    pub(crate) peer_loss_report: (u64, u64),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rtt_summary_buckets_and_bounds() {
        let mut s = RttSummary::default();
        assert_eq!(s.quantile_bound(0.5), None);
        assert_eq!(RttSummary::bucket_of(0), 0);
        assert_eq!(RttSummary::bucket_of(1), 0);
        assert_eq!(RttSummary::bucket_of(2), 1);
        assert_eq!(RttSummary::bucket_of(1023), 9);
        assert_eq!(RttSummary::bucket_of(1024), 10);
        assert_eq!(RttSummary::bucket_of(u64::MAX), RTT_BUCKETS - 1);
        for us in [300u64, 310, 320, 330, 340, 350, 360, 370, 380, 9_000] {
            s.record(Duration::from_micros(us));
        }
        assert_eq!(s.samples, 10);
        assert_eq!(s.min(), Some(Duration::from_micros(300)));
        assert_eq!(s.max(), Some(Duration::from_micros(9_000)));
        assert_eq!(s.mean(), Some(Duration::from_micros(1_206)));
        // Nine samples in 256..511 µs: the median's bound is that bucket's top.
        assert_eq!(s.quantile_bound(0.5), Some(Duration::from_micros(511)));
        // The tail is the largest sample, not its bucket's top (16,383 µs).
        assert_eq!(s.quantile_bound(0.99), Some(Duration::from_micros(9_000)));
        assert_eq!(s.quantile_bound(0.0), Some(Duration::from_micros(511)));
        assert!(std::mem::size_of::<RttSummary>() <= 1024);
    }
}
