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
//! # Words
//!
//! One word per concept, here and in the `ricochet` runtime:
//!
//! - *connection*: this crate's protocol state for one peer ([`Connection`], named on its
//!   endpoint by a [`ConnectionHandle`], counted in [`ConnectionStats`]). The runtime says
//!   *session* for the same thing seen by a game: one runtime session is one connection here,
//!   its `SessionId` is the worker plus the [`ConnectionHandle`], its `SessionStats` are read
//!   from the [`ConnectionStats`].
//! - *retransmission*: ARQ sending lost data again in a new packet
//!   ([`ConnectionStats::segments_retransmitted`], [`Config::redundant_retransmit`]).
//! - *parity*: forward error correction's redundant packets, of either code (`FecParity`
//!   packets, the `parity_*` counters of [`FecStats`]); for the block code, its Reed-Solomon
//!   parity shards.
//! - *repair* (symbol): the sliding-window code's parity packet, a combination of the sources
//!   in its window; only that code's settings and counters use the word
//!   ([`fec::SlidingConfig::tail_repairs`]).
//! - *recovered*: a data datagram forward error correction rebuilt from parity
//!   ([`FecStats::data_recovered`]).
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
//! sends a copy of the oldest unacknowledged fragment, so a lost last packet, or a lost
//! retransmission blocking an ordered channel, is sent again without waiting for the RTO. If that also goes
//! unanswered the RTO declares everything in flight lost and backs off (doubling, capped). The
//! minimum RTO is configurable: 30 ms in [`Config::game`]. With
//! [`Config::redundant_retransmit`] (the game profile) each retransmitted fragment goes out in two
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
//! **The delay-aware controller** ([`CongestionController::Delay`], opt-in: set
//! [`Config::congestion_controller`]) keeps a bottleneck's queue short instead of filling it. It paces
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
//! the probe also adds a datagram per RTT, the same for every flow, so that shares
//! converge, and a round over a standing queue never raises the estimate (a flow's share of
//! a busy FIFO follows what it sends: every probe would seem to find more). One cut leaves at least 85 % of half the estimate, and the pacer never goes below two
//! datagrams per smoothed RTT, so that an outage (seconds of loss) cannot leave the sender
//! stalled at a rate too slow to measure the path again. [`Config::min_send_rate`] and
//! [`Config::max_send_rate`] bound the rate. The
//! estimate is [`ConnectionStats::rate_estimate`]: what a game sizes its snapshots to. Its
//! window only guards against a peer that stops acknowledging.
//!
//! What random loss still costs is latency, not window: a fragment lost on an ordered channel
//! holds back every later message until its retransmission arrives, which cannot arrive
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
//! the congestion window), and every delivered or rebuilt ARQ datagram enters `receive_arq` from
//! its packet number on, as a received one does (the header before it is read once, on
//! arrival); the ARQ datagram budget is [`Config::arq_datagram_size`]. Layout, overhead and the
//! congestion accounting of parity: see [`FecStats`] and the `fec` submodule. A connection
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
//!   drops its parity packets ([`fec::ReceiverStats::parity_ignored`]), so it still talks to a
//!   peer that sends FEC. The configuration and statistics types exist either way.
//! - `aws-lc-rs`: packet protection with aws-lc-rs instead of RustCrypto's `aes-gcm` (same
//!   algorithm and bytes; the `ricochet` runtime turns it on).
//! - `test-util`: test, benchmark and fuzz hooks, not for production: the shared-secret key
//!   path (`EndpointConfig::test_session_secret`, `SessionKeys::derive_for_test`), `fec::fuzz`,
//!   and the packet protection internals (`PacketKey`, `NumberSpace`, `Unauthenticated`,
//!   `REPLAY_WINDOW`).
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

pub mod fec;
pub mod token;
pub mod wire;
mod xchacha;

mod admission;
mod config;
mod connection;
mod endpoint;
mod event;
mod keys;
mod lanes;
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
pub use config::{
    ChannelKind, Config, CongestionController, PathMtuConfig, FEC_ARQ_OVERHEAD,
    UNRELIABLE_ACK_TOLERANCE,
};
pub use connection::fec_link::FecStats;
pub use connection::{Connection, ConnectionState};
pub use endpoint::{
    ConnectionHandle, Endpoint, EndpointConfig, EndpointStats, ListenConfig, DEFAULT_TRANSMIT_BURST,
};
pub use event::{Event, SendError, Transmit};

/// The listening side's settings, under their old name.
#[deprecated(
    note = "renamed `ListenConfig`: `ServerConfig` is the `ricochet` runtime's server configuration"
)]
pub type ServerConfig = ListenConfig;
pub use keys::SessionKeys;
pub use lanes::{Lane, LaneStats, SendOptions, UnsentDrops};
pub use prefetch::PrefetchStage;

/// Hints the CPU to load the memory of `value` into its cache: the hint this crate exported
/// before it was internal, kept one release.
#[deprecated(
    note = "a CPU cache hint is not protocol: use `ricochet_platform::prefetch` (the protocol's own hints: `Endpoint::prefetch`)"
)]
#[inline]
pub fn prefetch<T: ?Sized>(value: &T) {
    prefetch::prefetch(value);
}
// Packet protection internals, public for benchmarks and attack tests only.
#[cfg(feature = "test-util")]
pub use protect::{NumberSpace, PacketKey, Unauthenticated, REPLAY_WINDOW};
pub use routing::{NoRouting, Router, SessionCounts};
pub use stats::{ConnectionStats, DropCause, DropCounters, RttSummary, RTT_BUCKETS};
pub use timers::TimerQueue;
pub use validate::{ConfigError, MAX_CONFIG_DURATION};
