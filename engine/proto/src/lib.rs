//! The sans-IO core of Ricochet: the byte layout of every packet ([`wire`]), the reliable-UDP
//! connection and endpoint (handshake, ARQ, congestion control, channels, fragmentation), and
//! forward error correction below ARQ ([`fec`]).
//!
//! Nothing here opens a socket, starts a thread, reads a clock or an environment variable: every
//! entry point takes `now: Instant`, inputs arrive through `handle_datagram`, outputs leave through
//! `poll_transmit` (one datagram written into the caller's buffer), timers through `poll_timeout` /
//! `handle_timeout`, and what the application must know through `poll_event`. How a multi-worker
//! server spreads its sessions is the embedder's business, behind the [`Router`] trait. The same
//! code runs over io_uring, kqueue, the simulator and the benchmark's relay.
//!
//! # Loss recovery
//!
//! Packet numbers are never reused: lost *data* (a fragment) is put into a new packet. ACK frames
//! carry up to 32 ranges and the ack delay, so every ACK of a new largest packet is an unambiguous
//! RTT sample (smoothed RTT, variance and minimum as in RFC 6298 / RFC 9002). A packet is lost
//! when three later packets were acknowledged (fast retransmit), or when a later packet was
//! acknowledged and 9/8 of an RTT has passed (time threshold, tolerates reordering). While FEC
//! groups carry parity both thresholds wait a group longer (its packets and its wait), since
//! the peer rebuilds a lost packet once the group's parity arrives. A packet declared lost is
//! kept until two loss delays after it was sent, or at least three RTOs while the RTT estimate
//! is in doubt (no sample yet, or timeouts firing with nothing acknowledged since): a late ACK
//! then counts as a spurious loss ([`ConnectionStats::packets_spurious_lost`]) and still
//! settles its fragments. When ACKs stop, a tail-loss probe fires after the last
//! ack-eliciting packet. It waits the longer of two smoothed RTTs (RFC 8985) and the smoothed
//! RTT plus four deviations (so a path whose RTT swings draws no spurious probe), plus
//! [`Config::max_ack_delay`]. It waits at least [`Config::min_probe_timeout`] (20 ms), so that
//! a short path's scheduling hiccups draw no probe either. It never waits longer than the RTO,
//! and is not raised to the RTO's floor. With only unreliable packets in flight, no reliable
//! data queued and [`Config::unreliable_ack_delay`] set, the probe waits that delay longer,
//! because their ACK may be held that long. The probe
//! sends a copy of the oldest unacknowledged fragment, so a lost last packet, or a lost repair
//! blocking an ordered channel, is repaired without waiting for the RTO. If that also goes
//! unanswered the RTO declares everything in flight lost and backs off (doubling, capped). The
//! minimum RTO is configurable: 30 ms in [`Config::competitive`]. With
//! [`Config::redundant_retransmit`] (competitive) each repaired fragment goes out in two
//! consecutive packets, so only a double loss costs another detection.
//!
//! # Congestion control
//!
//! NewReno on bytes in flight (slow start, additive increase, one multiplicative decrease of
//! factor 0.7 per round trip of losses, collapse to the minimum window after an RTO), on by
//! default, off with [`Config::congestion_control`] = `false`; optional pacing spreads a window
//! over the smoothed RTT. Unreliable datagrams count against the window like reliable ones.
//!
//! **Random (non-congestion) loss.** Plain NewReno treats every loss as congestion: at 5 %
//! random loss with a few dozen packets per RTT it cuts the window almost every round trip and
//! settles near `1.2/sqrt(p)` packets, far below what the path carries. With
//! [`Config::loss_tolerant`] (the default) a fast-retransmit loss only reduces the window when
//! the path also shows queueing: the smoothed RTT exceeds the minimum RTT by more than
//! `max(min_rtt / 8, 2 ms)`. Congestion loss from a filling queue always comes with that delay,
//! random loss on an idle path does not, so the window stays open under random loss and still
//! shrinks when a bottleneck queue builds. The same rule applies to an RTO: with queueing it
//! collapses the window (persistent loss is treated as congestion); without, it is a lost probe
//! or ACK after a small flight (a window-1 multi-fragment message under random loss), and
//! collapsing to the minimum window would make the next message slow-start again. The RTO
//! timer itself still backs off. Set `loss_tolerant = false` for textbook NewReno.
//!
//! **The delay-aware controller** ([`CongestionController::Delay`], the game profile's,
//! [`Config::competitive`]) keeps a bottleneck's queue short instead of filling it. It paces
//! every send at a rate built from what the path delivered: each round trip's acknowledged
//! bytes over the time they took to be sent and acknowledged, the largest of the last ten
//! rounds (a round the application did not fill counts only when it shows more). The pace
//! cycles over eight rounds: one 15 % above the estimate (a faster path shows a larger
//! sample), one below it (draining what that queued), six at 95 % (a datagram mostly finds the
//! bottleneck idle). When a cruise round's smallest RTT stands more than
//! `max(10 ms, min_rtt / 4)` above the minimum RTT of the last 10 s, a queue stands (the path
//! got slower, or other flows share it): the estimate is cut to 85 % of the rate the ACKs
//! arrive at. Loss is not a signal by itself (with [`Config::loss_tolerant`]): 5 % random
//! loss leaves the rate where the path puts it. While cuts recur (flows share a bottleneck)
//! the probe also adds a few datagrams per RTT, the same for every flow, so that shares
//! converge. [`Config::min_send_rate`] and [`Config::max_send_rate`] bound the rate. The
//! estimate is [`ConnectionStats::rate_estimate`]: what a game sizes its snapshots to. Its
//! window only guards against a peer that stops acknowledging.
//!
//! What random loss still costs is latency, not window: a fragment lost on an ordered channel
//! holds back every later message until its repair arrives, and the repair cannot arrive
//! sooner than one round trip after the original (the loss is seen through the ACKs of later
//! packets). With many messages in flight on a lossy path (the `random` profile of `bench gate`:
//! 5 % loss and 5 % of packets 15 ms late per direction), a large share of the round trips wait
//! behind such a loss or delay in one direction or the other and take at least two path RTTs,
//! whatever the window; shortening them takes redundancy sent ahead of the loss, i.e. FEC
//! ([`Config::fec`]). Packets that are only late are declared lost too; repeating them costs
//! bytes, not latency.
//!
//! # Channels
//!
//! Each channel has its own message ids, queues and reassembly, so a lost fragment on one
//! channel never delays another (no head-of-line blocking across channels). Kinds:
//! [`ChannelKind::ReliableOrdered`], [`ChannelKind::ReliableUnordered`],
//! [`ChannelKind::Unreliable`], [`ChannelKind::UnreliableSequenced`] (older messages dropped once
//! a newer one was delivered). Messages larger than a datagram are fragmented; reassembly is
//! bounded per connection ([`Config::reassembly_limit`]) and per endpoint
//! ([`EndpointConfig::reassembly_budget`]); an unreliable message whose fragments do not all
//! arrive within [`Config::unreliable_timeout`] is dropped.
//!
//! # FEC seam
//!
//! Every outgoing ARQ datagram passes through one function (`Connection::seal_outgoing`) and
//! every incoming ARQ datagram through one function (`Connection::receive_arq`); `FecData` /
//! `FecParity` packets are routed to `Connection::receive_fec`. That is where the `fec` module
//! wraps and unwraps. With FEC on ([`Config::fec`]), every ARQ datagram leaves as a `FecData`
//! packet, parity follows as `FecParity` packets right after its group closes (counted against
//! the congestion window), and every delivered or rebuilt ARQ datagram enters `receive_arq` as
//! if received; the ARQ datagram budget is [`Config::arq_datagram_size`]. Layout, overhead and
//! the congestion accounting of parity: see [`FecStats`] and the `fec` submodule. A connection
//! accepts FEC packets from its peer whatever its own policy, so only the sender decides.
//!
//! # Admission
//!
//! A server admits clients by connect token ([`token`]; netcode.io's model: the game's backend
//! seals tokens with a key it shares with its servers) or, explicitly, insecurely
//! ([`Admission`]). The handshake carries the token twice (hello and cookie echo) with a proof
//! of its keys, the server checks it without state (expiry, its own address, not used before:
//! [`TokenLedger`]), the application may refuse the client ([`Event::Incoming`],
//! [`Endpoint::refuse`]), and the sealed accept gives the client the session's stateless reset
//! token, so a restarted server ends the client's session at its next packet
//! ([`CloseReason::Reset`]), and the server random that, with both connection ids, binds the
//! session's packet keys to this session alone (a token can make several). Layouts: [`wire`];
//! the threat model: `docs/security.md` in the repository.
//!
//! # Features
//!
//! - `fec` (default): the FEC codecs, senders and receivers ([`fec`]; the `reed-solomon-simd`
//!   dependency). Without it a connection sends no FEC whatever [`Config::fec`] says, and takes
//!   the data out of its peer's `FecData` packets without recovering lost ones (ARQ does) and
//!   drops its repair packets ([`fec::ReceiverStats::parity_ignored`]), so it still talks to a
//!   peer that sends FEC. The configuration and statistics types exist either way.
//! - `aws-lc-rs`: packet protection with aws-lc-rs instead of RustCrypto's `aes-gcm` (same
//!   algorithm and bytes; the `ricochet` runtime turns it on).
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

pub mod fec;
pub mod token;
pub mod wire;
mod xchacha;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;

mod admission;
mod connection;
mod endpoint;
mod keys;
mod prefetch;
mod protect;
mod routing;
mod stats;
mod timers;
mod validate;

// The endpoint draws on the connection's receive budgets by this path.
use connection::recv;

pub use crate::wire::{CloseReason, ConnectionId};
pub use admission::{
    Admission, LedgerRefusal, Peer, Recorded, Refusal, TokenAdmission, TokenLedger, UsedTokens,
};
pub use connection::fec_link::{FecStats, FEC_ARQ_OVERHEAD};
pub use connection::{Connection, ConnectionState};
pub use endpoint::{
    ConnectionHandle, Endpoint, EndpointConfig, EndpointStats, ListenConfig, DEFAULT_TRANSMIT_BURST,
};

/// The listening side's settings, under their old name.
#[deprecated(
    note = "renamed `ListenConfig`: `ServerConfig` is the `ricochet` runtime's server configuration"
)]
pub type ServerConfig = ListenConfig;
pub use keys::SessionKeys;
pub use prefetch::{prefetch, PrefetchStage};
pub use protect::{NumberSpace, PacketKey, ReplayWindow, Unauthenticated, REPLAY_WINDOW};
pub use routing::{NoRouting, Router, SessionCounts};
pub use stats::{ConnectionStats, DropCause, DropCounters, RttSummary, RTT_BUCKETS};
pub use timers::TimerQueue;
pub use validate::{ConfigError, MAX_CONFIG_DURATION};

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
/// `#[non_exhaustive]`: start from a profile ([`Config::default`], [`Config::competitive`],
/// [`Config::bulk`]) and change fields, or use [`Config::with`], so a new setting is not a
/// breaking change.
///
/// ```
/// use ricochet_proto::Config;
/// use std::time::Duration;
///
/// let config = Config::competitive().with(|c| c.idle_timeout = Duration::from_secs(30));
/// assert_eq!(config.min_rto, Config::competitive().min_rto);
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
    /// ([`CongestionController::Delay`], the game profile's). See the module docs.
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
    /// Send every retransmitted fragment twice, in two consecutive packets. A lost repair
    /// costs another loss detection (about a round trip), and on an ordered channel every
    /// later message waits for it; the second copy makes that a double loss. Costs the
    /// retransmitted bytes once more. Skipped while FEC groups carry parity (the parity
    /// protects the repair). On in [`Config::competitive`].
    pub redundant_retransmit: bool,
    /// Initial congestion window in packets.
    pub initial_window_packets: usize,
    /// Minimum congestion window in packets.
    pub min_window_packets: usize,
    /// Channel kinds, indexed by channel id.
    pub channels: Vec<ChannelKind>,
    /// Largest message `send` accepts and the receiver reassembles.
    pub max_message_size: usize,
    /// Bytes this connection may hold in incomplete or out-of-order received messages.
    /// A packet whose reliable fragments would not fit is dropped unacknowledged (the peer
    /// retransmits), so reliable data is never lost to the cap; keep it above
    /// `send_window x max_datagram_size` or a full buffer can stall the connection.
    pub reassembly_limit: usize,
    /// Bytes of not-yet-sent messages `send` accepts before returning [`SendError::QueueFull`].
    pub send_queue_limit: usize,
    /// Bytes of not-yet-sent messages an unreliable channel holds (256 KiB by default). Past
    /// it, `send` drops that channel's oldest queued messages (counted in
    /// [`ConnectionStats::unreliable_unsent`]) instead of letting them wait: behind a closed
    /// congestion window a snapshot only grows staler, and a peer that stops acknowledging
    /// would otherwise make the queue grow to `send_queue_limit`. Reliable channels are
    /// bounded by `send_queue_limit` alone.
    pub unreliable_queue_limit: usize,
    /// An incomplete unreliable message is dropped after this long, or earlier when 64 newer
    /// incomplete messages wait on its channel (an unreliable channel holds at most 64; the
    /// one that arrived first gives way, counted in [`ConnectionStats::unreliable_dropped`]).
    pub unreliable_timeout: Duration,
    /// Close when nothing arrives for this long, or when packets arrive but nothing this side
    /// sent has been acknowledged for this long (a peer that withholds its ACKs would
    /// otherwise keep its session, and this side's queues, alive). Either way the close
    /// reason is [`CloseReason::IdleTimeout`].
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
    /// [`Config::competitive`]). With `Off` this side sends plain `Data` packets (no FEC
    /// header); either way it accepts FEC packets from its peer. `max_payload` is derived from
    /// `max_datagram_size`.
    pub fec: crate::fec::FecConfig,
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
            fec: crate::fec::FecConfig {
                policy: crate::fec::FecPolicy::Off,
                ..crate::fec::FecConfig::default()
            },
        }
    }
}

impl Config {
    /// The game profile: 30 ms minimum RTO, 1 ms maximum ACK delay, immediate ACKs of reliable
    /// data, ACKs of unreliable-only packets held up to 25 ms to ride the next packet out,
    /// redundant retransmissions, adaptive FEC with the sliding-window code (0..4 repairs per 12
    /// sources plus tail repairs, following the loss the peer reports; see
    /// [`crate::fec::FecScheme`]), and the delay-aware congestion controller
    /// ([`CongestionController::Delay`]).
    pub fn competitive() -> Self {
        Self {
            initial_rtt: Duration::from_millis(50),
            min_rto: Duration::from_millis(30),
            max_rto: Duration::from_secs(2),
            max_ack_delay: Duration::from_millis(1),
            ack_frequency: 1,
            unreliable_ack_delay: Some(Duration::from_millis(25)),
            redundant_retransmit: true,
            congestion_controller: CongestionController::Delay,
            fec: crate::fec::FecConfig::default(),
            ..Self::default()
        }
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
            .saturating_sub(crate::wire::DATA_HEADER_LEN + FRAGMENT_HEADER_MAX + ACK_RESERVE)
            .max(1)
    }

    /// Largest ARQ datagram: [`Config::max_datagram_size`] less the authentication tag
    /// ([`crate::wire::TAG_LEN`]), and less [`FEC_ARQ_OVERHEAD`] when this side sends FEC.
    /// The tag's room is left in the insecure mode too, so both modes cut messages into the
    /// same fragments.
    pub fn arq_datagram_size(&self) -> usize {
        self.max_datagram_size
            .saturating_sub(crate::wire::TAG_LEN + self.fec_arq_overhead())
    }

    /// What FEC takes off the ARQ datagram budget: [`FEC_ARQ_OVERHEAD`] when this side sends
    /// FEC, else 0.
    fn fec_arq_overhead(&self) -> usize {
        // Without the `fec` feature this side never sends FEC, whatever its policy.
        if self.fec.policy == crate::fec::FecPolicy::Off || !cfg!(feature = "fec") {
            0
        } else {
            FEC_ARQ_OVERHEAD
        }
    }

    /// The smallest [`Config::max_datagram_size`] [`Config::validate`] accepts: room for a
    /// client's largest handshake packet ([`crate::wire::MAX_CLIENT_HANDSHAKE_LEN`], a cookie
    /// echo carrying a connect token), and for a data packet of one payload byte besides
    /// what [`Config::fragment_payload`] keeps aside (packet header, tag, FEC wrapping when
    /// this side sends FEC, the largest fragment header and the ACK room). The handshake is
    /// the larger of the two.
    pub fn min_datagram_size(&self) -> usize {
        crate::wire::MAX_CLIENT_HANDSHAKE_LEN.max(self.min_data_datagram_size())
    }

    /// The data-packet part of [`Config::min_datagram_size`].
    pub(crate) fn min_data_datagram_size(&self) -> usize {
        crate::wire::TAG_LEN
            + self.fec_arq_overhead()
            + crate::wire::DATA_HEADER_LEN
            + FRAGMENT_HEADER_MAX
            + ACK_RESERVE
            + 1
    }

    /// Most fragments a message may have.
    pub fn max_fragments(&self) -> u64 {
        self.max_message_size
            .div_ceil(self.fragment_payload())
            .max(1) as u64
    }
}

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
    /// [`ConnectionStats::rate_estimate`]. Bounded by [`Config::min_send_rate`] and
    /// [`Config::max_send_rate`].
    Delay,
}

/// With [`Config::unreliable_ack_delay`]: packets of unreliable messages after which the ACK
/// goes out without waiting for the delay (a fast unreliable stream keeps its congestion
/// window moving).
pub const UNRELIABLE_ACK_TOLERANCE: u32 = 8;

/// Worst-case fragment frame header: type, channel, id (8), index (4), count (4), length (4).
pub(crate) const FRAGMENT_HEADER_MAX: usize = 1 + 1 + 8 + 4 + 4 + 4;
/// Room kept in every data packet for an ACK frame.
pub(crate) const ACK_RESERVE: usize = 96;

/// What the application learns from a connection. Deliberately exhaustive: an embedder must
/// handle every event, and a new one is a breaking change it should see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Server with [`ListenConfig::accept_hook`]: a client passed every check and waits for
    /// the application's [`Endpoint::accept`] or [`Endpoint::refuse`].
    Incoming(Peer),
    /// The handshake completed.
    Connected,
    /// A complete message arrived.
    Message {
        /// Channel id.
        channel: u8,
        /// The message.
        data: Bytes,
    },
    /// The connection ended; no more events follow.
    Closed {
        /// Why.
        reason: CloseReason,
        /// True when the peer (or the server, for a refused handshake) decided it.
        by_peer: bool,
        /// The server application's message with a refusal ([`CloseReason::Rejected`]);
        /// empty otherwise.
        message: Bytes,
    },
}

/// One datagram written by `poll_transmit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Where to send it.
    pub destination: SocketAddr,
    /// Bytes written at the start of the caller's buffer.
    pub size: usize,
}

/// Why `send` refused a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// No such channel.
    #[error("unknown channel {0}")]
    UnknownChannel(u8),
    /// Message larger than [`Config::max_message_size`].
    #[error("message of {0} bytes exceeds the maximum message size")]
    TooLarge(usize),
    /// The send queue is full ([`Config::send_queue_limit`]).
    #[error("send queue full")]
    QueueFull,
    /// The connection is closing or closed.
    #[error("connection closed")]
    Closed,
    /// No connection with this handle.
    #[error("unknown connection")]
    UnknownConnection,
}
