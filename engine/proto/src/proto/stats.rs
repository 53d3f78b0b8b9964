//! Per-connection statistics and drop counters.

use std::time::Duration;

use hdrhistogram::Histogram;

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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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

/// Statistics of one connection.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConnectionStats {
    /// RTT samples in microseconds.
    pub rtt_us: Histogram<u64>,
    /// Datagrams sent.
    pub packets_sent: u64,
    /// UDP payload bytes sent.
    pub bytes_sent: u64,
    /// Datagrams received and accepted.
    pub packets_received: u64,
    /// UDP payload bytes received (accepted datagrams).
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
    /// Drops by cause.
    pub drops: DropCounters,
    /// Current congestion window, bytes.
    pub cwnd: usize,
    /// Bytes in flight.
    pub bytes_in_flight: usize,
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
}

impl Default for ConnectionStats {
    fn default() -> Self {
        Self {
            // 1 µs .. 100 s, 3 significant digits: bounds are constants, creation cannot fail.
            rtt_us: Histogram::new_with_bounds(1, 100_000_000, 3)
                .expect("constant histogram bounds are valid"),
            packets_sent: 0,
            bytes_sent: 0,
            packets_received: 0,
            bytes_received: 0,
            packets_lost: 0,
            packets_spurious_lost: 0,
            segments_retransmitted: 0,
            segments_sent: 0,
            tail_loss_probes: 0,
            rto_count: 0,
            messages_delivered: 0,
            unreliable_dropped: 0,
            drops: DropCounters::default(),
            cwnd: 0,
            bytes_in_flight: 0,
            rto: Duration::ZERO,
            srtt: Duration::ZERO,
            min_rtt: Duration::ZERO,
            reassembly_bytes: 0,
            reassembly_peak: 0,
            peer_loss_report: (0, 0),
            fec: super::FecStats::default(),
        }
    }
}
