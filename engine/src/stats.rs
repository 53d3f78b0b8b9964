//! What a session's counters say, as a small value.

use std::time::Duration;

use ricochet_proto::{ConnectionStats, UnsentDrops};

/// A session's counters and path estimates at one moment: a small `Copy` value, cheap to read
/// every frame ([`Client::stats`](crate::Client::stats),
/// [`ServerContext::session_stats`](crate::ServerContext::session_stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionStats {
    /// Smoothed round-trip time.
    pub rtt: Duration,
    /// Smallest round-trip time seen.
    pub min_rtt: Duration,
    /// Current retransmission timeout (backoff included).
    pub rto: Duration,
    /// Datagrams sent.
    pub packets_sent: u64,
    /// Datagrams received and accepted.
    pub packets_received: u64,
    /// Wire bytes sent: the UDP payload of every datagram sent (handshake, sealed data with
    /// its authentication tag, FEC parity), IP and UDP headers excluded.
    pub bytes_sent: u64,
    /// Wire bytes received: the UDP payload of every datagram the session accepted, counted
    /// as [`SessionStats::bytes_sent`] counts on the other side (tag and FEC framing
    /// included); dropped datagrams are in [`SessionStats::datagrams_dropped`].
    pub bytes_received: u64,
    /// Packets declared lost.
    pub packets_lost: u64,
    /// Reliable fragments sent again (retransmissions and tail-loss probes).
    pub retransmitted: u64,
    /// Messages delivered to the application.
    pub messages_delivered: u64,
    /// Unreliable messages dropped incomplete or stale.
    pub unreliable_dropped: u64,
    /// Unreliable messages dropped unsent: their channel's queue passed
    /// `Config::unreliable_queue_limit` (a slow path, or a peer that stopped acknowledging),
    /// their lane's cap, their deadline, or a newer message replaced them
    /// ([`SessionStats::unsent`] has them by cause).
    pub unreliable_unsent: u64,
    /// [`SessionStats::unreliable_unsent`] by cause.
    pub unsent: UnsentDrops,
    /// Datagrams dropped (malformed, duplicate, unauthenticated, ...).
    pub datagrams_dropped: u64,
    /// Datagrams forward error correction rebuilt before ARQ had to.
    pub fec_recovered: u64,
    /// Congestion window, bytes.
    pub congestion_window: usize,
    /// Bytes in flight.
    pub bytes_in_flight: usize,
    /// The rate, bytes per second, that congestion control estimates the path carries for
    /// this session: what the game can send without building a queue. With the (opt-in)
    /// delay-aware controller ([`CongestionController::Delay`](crate::CongestionController))
    /// it is measured from what the path delivered and drops within a second when the path
    /// gets slower; while the game sends less than the path carries it is the most the path
    /// was seen to deliver (it cannot know more, and rises as the game sends more). With
    /// NewReno it is the window over the RTT.
    ///
    /// How a game uses it: divide by the tick rate for the bytes a tick may send to this
    /// player (`rate_estimate / 60` at 60 Hz, less what reliable traffic needs), and shrink
    /// or slow its snapshots to fit (fewer entities, coarser quantization, every other tick)
    /// rather than let them queue: what does not fit waits in the session's queue (see
    /// [`ServerContext::queued_bytes`](crate::ServerContext::queued_bytes)) and arrives late.
    pub rate_estimate: u64,
    /// How loss was detected and recovered: what a benchmark or a game tuning its settings
    /// reads beside [`SessionStats::retransmitted`] and [`SessionStats::fec_recovered`].
    pub recovery: RecoveryStats,
    /// The largest datagram (UDP payload bytes) the session sends now: the base
    /// `Config::max_datagram_size`, or the size path MTU discovery found
    /// (`Config::path_mtu`).
    pub path_mtu: usize,
}

/// A session's loss-recovery counters ([`SessionStats::recovery`]): how much reliable data
/// went out for the first time, and by which means losses were found and recovered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoveryStats {
    /// Reliable fragments sent for the first time ([`SessionStats::retransmitted`] counts
    /// the ones sent again).
    pub fragments_first_sent: u64,
    /// Packets declared lost and then acknowledged after all (spurious loss declarations;
    /// their retransmissions were not needed).
    pub spurious_losses: u64,
    /// Tail-loss probes sent (a retransmission that asks for an acknowledgement when the last
    /// packets of a burst went unanswered).
    pub tail_loss_probes: u64,
    /// Retransmission timeouts that fired (each backs the timeout off).
    pub retransmission_timeouts: u64,
    /// Forward error correction groups this side could not rebuild (ARQ retransmitted their
    /// lost packets); [`SessionStats::fec_recovered`] counts the rebuilt packets.
    pub fec_groups_unrecoverable: u64,
}

impl From<&ConnectionStats> for SessionStats {
    fn from(s: &ConnectionStats) -> Self {
        SessionStats {
            rtt: s.srtt,
            min_rtt: s.min_rtt,
            rto: s.rto,
            packets_sent: s.packets_sent,
            packets_received: s.packets_received,
            bytes_sent: s.bytes_sent,
            bytes_received: s.bytes_received,
            packets_lost: s.packets_lost,
            retransmitted: s.segments_retransmitted,
            messages_delivered: s.messages_delivered,
            unreliable_dropped: s.unreliable_dropped,
            unreliable_unsent: s.unreliable_unsent,
            unsent: s.unsent,
            datagrams_dropped: s.drops.total(),
            fec_recovered: s.fec.data_recovered,
            congestion_window: s.cwnd,
            bytes_in_flight: s.bytes_in_flight,
            rate_estimate: s.rate_estimate,
            recovery: RecoveryStats {
                fragments_first_sent: s.segments_sent,
                spurious_losses: s.packets_spurious_lost,
                tail_loss_probes: s.tail_loss_probes,
                retransmission_timeouts: s.rto_count,
                fec_groups_unrecoverable: s.fec.groups_unrecoverable,
            },
            path_mtu: s.path_mtu,
        }
    }
}
