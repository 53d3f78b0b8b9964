//! Connection configuration: [`Config`] and its profiles, [`ChannelKind`], and the sizes a
//! datagram's budget is cut into. A leaf: every room reads it, it reads no room.

use std::time::Duration;

use crate::fec::{self, FecConfig, FecPolicy};
use crate::lanes::Lane;
#[cfg(doc)]
use crate::lanes::UnsentDrops;
use crate::wire::{
    DATA_HEADER_LEN, FEC_HEADER_LEN, FEC_PARITY_HEADER_LEN, MAX_CLIENT_HANDSHAKE_LEN, TAG_LEN,
};

/// Delivery guarantees of a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ChannelKind {
    /// Every message exactly once, in send order.
    ReliableOrdered,
    /// Every message exactly once, in arrival order.
    ReliableUnordered,
    /// Best effort, any order.
    Unreliable,
    /// Best effort; a message older than one already delivered is dropped.
    UnreliableSequenced,
}

impl ChannelKind {
    /// True for the two reliable kinds.
    pub fn is_reliable(self) -> bool {
        matches!(self, Self::ReliableOrdered | Self::ReliableUnordered)
    }
}

/// Connection configuration. Both peers must use the same channel list.
///
/// `#[non_exhaustive]`: start from a profile ([`Config::default`], [`Config::game`],
/// [`Config::bulk`]) and change fields, or use [`Config::with`], so a new setting is not a
/// breaking change.
///
/// ```
/// use ricochet_proto::Config;
/// use std::time::Duration;
///
/// let config = Config::game().with(|c| c.idle_timeout = Duration::from_secs(30));
/// assert_eq!(config.min_rto, Config::game().min_rto);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Largest UDP payload this connection writes. ARQ datagrams leave room for the
    /// authentication tag, and with FEC on they are [`FEC_ARQ_OVERHEAD`] bytes smaller still
    /// ([`Config::arq_datagram_size`]) so data and parity packets both fit.
    pub max_datagram_size: usize,
    /// Maximum unacknowledged reliable fragments in flight (segments).
    pub send_window: usize,
    /// Reliable fragments this side buffers for reassembly / reordering (advertised to the peer).
    pub recv_window: usize,
    /// RTT assumed before the first sample.
    pub initial_rtt: Duration,
    /// Lower bound of the retransmission timeout.
    pub min_rto: Duration,
    /// Upper bound of the (backed-off) retransmission timeout.
    pub max_rto: Duration,
    /// Longest this side delays an ACK.
    pub max_ack_delay: Duration,
    /// Shortest wait for a tail-loss probe (the first probe timeout; the RTO proper keeps
    /// `min_rto`). On a short path two smoothed RTTs plus the ACK delay come to a millisecond or
    /// two, less than a host's scheduling hiccups (a few ticks for a runnable thread on a busy
    /// host, 4 ms each at HZ 250): the peer's answer is then late, not lost, and a probe there
    /// is a spurious retransmission. A lost tail on such a path waits this long instead of two
    /// RTTs (still under the RTO); on paths whose two RTTs exceed it, it changes nothing.
    /// 20 ms by default: a peer that answers within a hitch a game tolerates (about one frame
    /// at 60 Hz) is not probed.
    pub min_probe_timeout: Duration,
    /// ACK immediately after this many ack-eliciting packets.
    pub ack_frequency: u32,
    /// How long this side may hold the ACK of packets that carried only unreliable messages;
    /// `None` (the default) acknowledges them like reliable ones ([`Config::ack_frequency`],
    /// [`Config::max_ack_delay`]). Nothing is retransmitted for unreliable data, so its ACK
    /// only feeds congestion control and the RTT estimate and can wait to ride the next packet
    /// this side sends anyway (a game client's next input carries the ACK of the snapshot
    /// before it) instead of costing a datagram of its own each way. A gap in the packet
    /// numbers is still acknowledged at once, and so is every
    /// [`UNRELIABLE_ACK_TOLERANCE`]-th packet of a fast stream. The ACK reports how long it was
    /// held; a sender with the same setting subtracts up to this much from its RTT sample and
    /// waits this much longer before it probes a flight of unreliable packets, so both sides
    /// should use the same setting (the same profile).
    pub unreliable_ack_delay: Option<Duration>,
    /// Fast retransmit after this many later packets were acknowledged.
    pub packet_threshold: u64,
    /// Congestion control on or off (the controller is [`Config::congestion_controller`]).
    pub congestion_control: bool,
    /// Which congestion controller: NewReno (the default) or the delay-aware rate controller
    /// ([`CongestionController::Delay`], opt-in). See the crate docs.
    pub congestion_controller: CongestionController,
    /// With [`CongestionController::Delay`]: the send rate never goes below this many bytes
    /// per second, whatever the path shows (a game that must send its minimum regardless).
    /// 0 by default.
    pub min_send_rate: u64,
    /// With [`CongestionController::Delay`]: the send rate never goes above this many bytes
    /// per second (`None`, the default: no ceiling).
    pub max_send_rate: Option<u64>,
    /// Only shrink the window on fast-retransmit loss when the RTT shows queueing (see module docs).
    pub loss_tolerant: bool,
    /// Spread each window over the smoothed RTT.
    pub pacing: bool,
    /// Send every retransmitted fragment twice, in two consecutive packets. A lost
    /// retransmission costs another loss detection (about a round trip), and on an ordered channel every
    /// later message waits for it; the second copy makes that a double loss. Costs the
    /// retransmitted bytes once more. Skipped while FEC groups carry parity (the parity
    /// protects the retransmission). On in [`Config::game`].
    pub redundant_retransmit: bool,
    /// Initial congestion window in packets.
    pub initial_window_packets: usize,
    /// Minimum congestion window in packets.
    pub min_window_packets: usize,
    /// Channel kinds, indexed by channel id.
    pub channels: Vec<ChannelKind>,
    /// How the channels share the send rate: lanes by priority, then by weight ([`Lane`]).
    /// Empty (the default): one lane of every channel, served in turn. Otherwise every
    /// channel is in exactly one lane. A sending decision only: the peer need not agree.
    pub lanes: Vec<Lane>,
    /// Unreliable channels that keep only the newest queued message: a send replaces the
    /// channel's queued messages not yet begun (counted in [`UnsentDrops::replaced`]); a
    /// message already partly sent is finished. For snapshots, where a stale one is worth
    /// nothing once a newer one exists.
    pub newest_only: Vec<u8>,
    /// Largest message `send` accepts and the receiver reassembles.
    pub max_message_size: usize,
    /// Bytes this connection may hold in incomplete or out-of-order received messages.
    /// A packet whose reliable fragments would not fit is dropped unacknowledged (the peer
    /// retransmits), so reliable data is never lost to the cap; keep it above
    /// `send_window x max_datagram_size` or a full buffer can stall the connection.
    pub reassembly_limit: usize,
    /// Bytes of not-yet-sent messages `send` accepts before returning
    /// [`SendError::QueueFull`](crate::SendError::QueueFull).
    pub send_queue_limit: usize,
    /// Bytes of not-yet-sent messages an unreliable channel holds (256 KiB by default). Past it,
    /// `send` drops that channel's oldest queued messages (counted in
    /// [`ConnectionStats::unreliable_unsent`](crate::ConnectionStats::unreliable_unsent)) instead
    /// of letting them wait: behind a closed congestion window a snapshot only grows staler, and a
    /// peer that stops acknowledging would otherwise make the queue grow to `send_queue_limit`.
    /// Reliable channels are bounded by `send_queue_limit` alone.
    pub unreliable_queue_limit: usize,
    /// An incomplete unreliable message is dropped after this long, or earlier when 64 newer
    /// incomplete messages wait on its channel (an unreliable channel holds at most 64; the one
    /// that arrived first gives way, counted in
    /// [`ConnectionStats::unreliable_dropped`](crate::ConnectionStats::unreliable_dropped)).
    pub unreliable_timeout: Duration,
    /// Close when nothing arrives for this long, or when packets arrive but nothing this side
    /// sent has been acknowledged for this long (a peer that withholds its ACKs would
    /// otherwise keep its session, and this side's queues, alive). Either way the close
    /// reason is [`CloseReason::IdleTimeout`](crate::CloseReason::IdleTimeout).
    pub idle_timeout: Duration,
    /// Send a ping when nothing was sent for this long (keeps the peer's idle timer quiet).
    pub keepalive_interval: Option<Duration>,
    /// First handshake retransmission interval (doubles per attempt).
    pub handshake_retry: Duration,
    /// Give up a handshake after this long.
    pub handshake_timeout: Duration,
    /// How long a session goes without data (messages sent or received) before it gives back
    /// the buffer capacity its traffic grew (send and receive queues, acknowledgement ranges,
    /// FEC pools) and its expanded packet keys. Long enough that a session sending every game tick keeps its buffers; short
    /// beside the idle timeout. `None`: never.
    pub idle_trim: Option<Duration>,
    /// How long a graceful close waits for queued reliable data to be acknowledged.
    pub close_linger: Duration,
    /// How often a [`crate::wire::Frame::LossReport`] is sent while packets arrive.
    pub loss_report_interval: Duration,
    /// Forward error correction of outgoing datagrams (policy `Off` by default; adaptive in
    /// [`Config::game`]). With `Off` this side sends plain `Data` packets (no FEC
    /// header); either way it accepts FEC packets from its peer. `max_payload` is derived from
    /// `max_datagram_size`.
    pub fec: FecConfig,
    /// Path MTU discovery (RFC 8899): off by default, so every datagram is at most
    /// [`Config::max_datagram_size`].
    pub path_mtu: PathMtuConfig,
}

/// Path MTU discovery (DPLPMTUD, RFC 8899): a connection starts at
/// [`Config::max_datagram_size`] (the base, safe on any path) and probes upward with padded
/// packets, up to [`PathMtuConfig::max_datagram_size`]. New packets, unreliable fragments and
/// FEC groups use the size found; reliable fragments stay cut to the base, so their
/// retransmissions fit whatever the path shrinks to. When packets larger than the base keep
/// being lost, the connection falls back to the base and searches again. Probes are not
/// retransmitted and their loss is not congestion. The size in use is
/// [`crate::ConnectionStats::path_mtu`].
///
/// Both peers should use the same setting: a receiver takes FEC-wrapped datagrams up to its
/// own `max_datagram_size` here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PathMtuConfig {
    /// Search above the base at all.
    pub enabled: bool,
    /// The largest UDP payload to probe for (1,452 by default: a 1,500 B Ethernet MTU less
    /// the IPv6 and UDP headers). The `ricochet` runtime lowers it to what the local route's
    /// MTU allows where the platform can tell.
    pub max_datagram_size: usize,
    /// After a search settles, search again this long later in case the path grew (RFC
    /// 8899's `PMTU_RAISE_TIMER`, 600 s).
    pub raise_interval: Duration,
}

impl Default for PathMtuConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            max_datagram_size: 1452,
            raise_interval: Duration::from_secs(600),
        }
    }
}

impl PathMtuConfig {
    /// Discovery on, with the default ceiling and raise interval.
    pub fn on() -> Self {
        Self {
            enabled: true,
            ..Self::default()
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_datagram_size: 1200,
            send_window: 128,
            recv_window: 512,
            initial_rtt: Duration::from_millis(100),
            min_rto: Duration::from_millis(100),
            max_rto: Duration::from_secs(5),
            max_ack_delay: Duration::from_millis(5),
            min_probe_timeout: Duration::from_millis(20),
            ack_frequency: 2,
            unreliable_ack_delay: None,
            packet_threshold: 3,
            congestion_control: true,
            congestion_controller: CongestionController::NewReno,
            min_send_rate: 0,
            max_send_rate: None,
            loss_tolerant: true,
            pacing: false,
            redundant_retransmit: false,
            initial_window_packets: 32,
            min_window_packets: 4,
            channels: vec![
                ChannelKind::ReliableOrdered,
                ChannelKind::ReliableUnordered,
                ChannelKind::Unreliable,
                ChannelKind::UnreliableSequenced,
            ],
            lanes: Vec::new(),
            newest_only: Vec::new(),
            max_message_size: 1 << 20,
            reassembly_limit: 4 << 20,
            send_queue_limit: 16 << 20,
            unreliable_queue_limit: 256 << 10,
            unreliable_timeout: Duration::from_millis(500),
            idle_timeout: Duration::from_secs(10),
            keepalive_interval: Some(Duration::from_secs(1)),
            handshake_retry: Duration::from_millis(250),
            handshake_timeout: Duration::from_secs(5),
            idle_trim: Some(Duration::from_secs(1)),
            close_linger: Duration::from_secs(2),
            loss_report_interval: Duration::from_millis(100),
            fec: FecConfig {
                policy: FecPolicy::Off,
                ..FecConfig::default()
            },
            path_mtu: PathMtuConfig::default(),
        }
    }
}

impl Config {
    /// The game profile: 30 ms minimum RTO, 1 ms maximum ACK delay, immediate ACKs of reliable
    /// data, ACKs of unreliable-only packets held up to 25 ms to ride the next packet out,
    /// redundant retransmissions, adaptive FEC with the sliding-window code (0..4 repair
    /// symbols per 12 sources plus tail repairs, following the loss the peer reports; see
    /// [`crate::fec::FecScheme`]). Its congestion controller is NewReno for now: the
    /// delay-aware one ([`CongestionController::Delay`]) is opt-in until it holds the game
    /// profile's goals (through the bench relay under `random` loss it lost about a quarter of
    /// the echo rate, and paced a loopback echo below NewReno's).
    /// The `ricochet` runtime's `Profile::Game` ("game") is this configuration.
    pub fn game() -> Self {
        Self {
            initial_rtt: Duration::from_millis(50),
            min_rto: Duration::from_millis(30),
            max_rto: Duration::from_secs(2),
            max_ack_delay: Duration::from_millis(1),
            ack_frequency: 1,
            unreliable_ack_delay: Some(Duration::from_millis(25)),
            redundant_retransmit: true,
            fec: FecConfig::default(),
            ..Self::default()
        }
    }

    /// The game profile under its old name.
    #[deprecated(note = "renamed `Config::game`, after the profile it is (`Profile::Game`)")]
    pub fn competitive() -> Self {
        Self::game()
    }

    /// This configuration with `tune` applied.
    pub fn with(mut self, tune: impl FnOnce(&mut Self)) -> Self {
        tune(&mut self);
        self
    }

    /// Throughput profile: longer ACK delay, larger windows.
    pub fn bulk() -> Self {
        Self {
            send_window: 512,
            recv_window: 2048,
            max_ack_delay: Duration::from_millis(10),
            reassembly_limit: 16 << 20,
            pacing: true,
            ..Self::default()
        }
    }

    /// Payload bytes of one fragment: what fits a datagram after the packet header, the largest
    /// fragment frame header and room reserved for an ACK frame.
    pub fn fragment_payload(&self) -> usize {
        self.arq_datagram_size()
            .saturating_sub(DATA_HEADER_LEN + FRAGMENT_HEADER_MAX + ACK_RESERVE)
            .max(1)
    }

    /// The largest datagram this side may write: [`PathMtuConfig::max_datagram_size`] with
    /// path MTU discovery on (never below the base), else [`Config::max_datagram_size`].
    pub fn max_path_datagram_size(&self) -> usize {
        if self.path_mtu.enabled {
            self.path_mtu.max_datagram_size.max(self.max_datagram_size)
        } else {
            self.max_datagram_size
        }
    }

    /// Payload bytes of one fragment in a datagram of `datagram_size` bytes (as
    /// [`Config::fragment_payload`] for the base size).
    pub(crate) fn fragment_payload_for(&self, datagram_size: usize) -> usize {
        datagram_size
            .saturating_sub(crate::wire::TAG_LEN + self.fec_arq_overhead())
            .saturating_sub(crate::wire::DATA_HEADER_LEN + FRAGMENT_HEADER_MAX + ACK_RESERVE)
            .max(1)
    }

    /// Largest ARQ datagram: [`Config::max_datagram_size`] less the authentication tag
    /// ([`TAG_LEN`]), and less [`FEC_ARQ_OVERHEAD`] when this side sends FEC.
    /// The tag's room is left in the insecure mode too, so both modes cut messages into the
    /// same fragments.
    pub fn arq_datagram_size(&self) -> usize {
        self.max_datagram_size
            .saturating_sub(TAG_LEN + self.fec_arq_overhead())
    }

    /// What FEC takes off the ARQ datagram budget: [`FEC_ARQ_OVERHEAD`] when this side sends
    /// FEC, else 0.
    fn fec_arq_overhead(&self) -> usize {
        // Without the `fec` feature this side never sends FEC, whatever its policy.
        if self.fec.policy == FecPolicy::Off || !cfg!(feature = "fec") {
            0
        } else {
            FEC_ARQ_OVERHEAD
        }
    }

    /// The smallest [`Config::max_datagram_size`] [`Config::validate`] accepts: room for a
    /// client's largest handshake packet ([`MAX_CLIENT_HANDSHAKE_LEN`], a cookie
    /// echo carrying a connect token), and for a data packet of one payload byte besides
    /// what [`Config::fragment_payload`] keeps aside (packet header, tag, FEC wrapping when
    /// this side sends FEC, the largest fragment header and the ACK room). The handshake is
    /// the larger of the two.
    pub fn min_datagram_size(&self) -> usize {
        MAX_CLIENT_HANDSHAKE_LEN.max(self.min_data_datagram_size())
    }

    /// The data-packet part of [`Config::min_datagram_size`].
    pub(crate) fn min_data_datagram_size(&self) -> usize {
        TAG_LEN + self.fec_arq_overhead() + DATA_HEADER_LEN + FRAGMENT_HEADER_MAX + ACK_RESERVE + 1
    }

    /// Most fragments a message may have.
    pub fn max_fragments(&self) -> u64 {
        self.max_message_size
            .div_ceil(self.fragment_payload())
            .max(1) as u64
    }
}

/// Bytes the ARQ datagram budget gives up when FEC is on (see `connection/fec_link.rs`): the parity
/// number, the parity header and the coded shard's length prefix.
pub const FEC_ARQ_OVERHEAD: usize =
    (FEC_PARITY_HEADER_LEN - FEC_HEADER_LEN) + fec::PARITY_HEADER_LEN + fec::header::LEN_PREFIX;

/// With [`Config::unreliable_ack_delay`]: packets of unreliable messages after which the ACK
/// goes out without waiting for the delay (a fast unreliable stream keeps its congestion
/// window moving).
pub const UNRELIABLE_ACK_TOLERANCE: u32 = 8;

/// Worst-case fragment frame header: type, channel, id (8), index (4), count (4), length (4).
pub(crate) const FRAGMENT_HEADER_MAX: usize = 1 + 1 + 8 + 4 + 4 + 4;
/// Room kept in every data packet for an ACK frame.
pub(crate) const ACK_RESERVE: usize = 96;

/// The congestion controller of a connection ([`Config::congestion_controller`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CongestionController {
    /// Loss-based NewReno on bytes in flight (window growth, a multiplicative decrease on
    /// loss with queueing); paces only with [`Config::pacing`].
    #[default]
    NewReno,
    /// Delay-aware rate control: paces at an estimate of the rate the path delivers, probes
    /// above it one round in eight, and cuts it when the RTT shows a standing queue, so that
    /// the bottleneck's queue stays short; loss alone does not lower it. Its estimate is
    /// [`crate::ConnectionStats::rate_estimate`]. Bounded by [`Config::min_send_rate`] and
    /// [`Config::max_send_rate`].
    Delay,
}
