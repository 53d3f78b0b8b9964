//! The connection's state: the [`Connection`] struct and the typed parts its rooms drive
//! (the handshake's, the send queues', recovery's, the close's and the timers' moments). The
//! rooms import this file and implement the behaviour over these parts; `mod.rs` (the
//! orchestrator and public API) imports the rooms. Parts with behaviour of their own live in
//! their room: `ack::Acks`, `cc::Congestion`, `rtt::RttEstimator`, `recv::Receiver`,
//! `fec_link::FecLink`.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::ack::Acks;
use super::cc::Congestion;
use super::fec_link::FecLink;
use super::pmtu::PathMtu;
use super::recv::Receiver;
use super::rtt::RttEstimator;
use crate::admission::{HandshakeKeys, Peer};
use crate::protect::Protection;
use crate::stats::Counters;
use crate::token::ConnectToken;
use crate::wire::{self, HANDSHAKE_TAG_LEN, SEALED_ACCEPT_LEN};
use crate::{ChannelKind, CloseReason, Config, ConnectionId, Event, SessionKeys};

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionState {
    /// Client waiting for the server (hello / cookie echo sent).
    Handshaking,
    /// Data flows.
    Established,
    /// Local close requested: queued reliable data is still being delivered.
    Closing,
    /// Close frames sent, waiting for the peer's close or the drain timer.
    Draining,
    /// Finished; no more events.
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Client,
    Server,
}

/// Who the connection talks to: both connection ids and the peer's address.
#[derive(Debug)]
pub(super) struct Path {
    pub(super) local_cid: ConnectionId,
    pub(super) remote_cid: ConnectionId,
    /// The peer's current address (follows the peer when its address changes).
    pub(super) remote: SocketAddr,
    /// The path-MTU search (boxed, and only while discovery is on): the size new packets
    /// are built to.
    pub(super) mtu: Option<Box<PathMtu>>,
}

/// A sans-IO RUDP connection. Usually owned by an [`crate::Endpoint`]; can be driven alone.
///
/// Its state lives in typed parts, one per room of this folder (see the crate README).
#[derive(Debug)]
pub struct Connection {
    pub(super) cfg: Arc<Config>,
    pub(super) side: Side,
    pub(super) state: ConnectionState,
    /// Data moved since the last [`Connection::trim`]: buffers may hold capacity to give back.
    pub(super) trim_pending: bool,
    /// Server: the accept's flags.
    pub(super) accept: Accept,
    pub(super) path: Path,
    pub(super) hs: Handshake,
    pub(super) send: Sending,
    pub(super) recovery: Recovery,
    pub(super) ack: Acks,
    pub(super) close: Closing,
    pub(super) activity: Activity,
    pub(super) cc: Congestion,
    pub(super) rtt: RttEstimator,
    pub(super) receiver: Receiver,
    pub(super) fec: FecLink,
    /// Packet keys and replay windows; `None` in the insecure mode, and for a client with a
    /// token until its sealed accept opened (the keys are bound to what it carries).
    pub(super) protection: Option<Box<Protection>>,
    /// Where a received packet is opened (it arrives borrowed, and opens in place).
    pub(super) open_buf: Vec<u8>,
    pub(super) events: VecDeque<Event>,
    pub(super) counters: Counters,
}

// The handshake room's part.

/// Handshake state of one connection (both sides; each side uses its part).
#[derive(Debug)]
pub(super) struct Handshake {
    // Client handshake.
    pub(super) nonce: u64,
    pub(super) cookie: Option<(u64, [u8; wire::COOKIE_LEN])>,
    /// When the hello or cookie echo goes out again.
    pub(super) resend_at: Instant,
    /// The wait before the next resend (doubles, up to 2 s).
    pub(super) interval: Duration,
    /// When the attempt (with this server) gives up.
    pub(super) deadline: Instant,
    // Server handshake (its two flags are `Connection::accept`, an [`Accept`]).
    /// The accept to (re)send, pre-encoded by the endpoint (`None`: encode a plain one).
    pub(super) accept_packet: Option<Box<([u8; SEALED_ACCEPT_LEN], usize)>>,
    /// Server: who the client is.
    pub(super) peer: Option<Peer>,
    /// Token mode: keys and reset token.
    pub(super) secure: Option<Box<Secure>>,
    /// Client: the message of an application refusal (moves into `Event::Closed`).
    pub(super) refusal_message: Bytes,
}

impl Handshake {
    pub(super) fn new(cfg: &Config, now: Instant) -> Self {
        Self {
            nonce: 0,
            cookie: None,
            resend_at: now,
            interval: cfg.handshake_retry,
            deadline: now + cfg.handshake_timeout,
            accept_packet: None,
            peer: None,
            secure: None,
            refusal_message: Bytes::new(),
        }
    }
}

/// A server connection's accept: whether it is due, or waits for the application. Held by
/// the connection beside its other one-byte fields (they pack into one word; in [`Handshake`]
/// they would each take one more).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Accept {
    /// Send the accept (again) with the next `poll_transmit`.
    pub(super) pending: bool,
    /// Waiting for the application to accept or refuse.
    pub(super) awaiting_app: bool,
}

/// What a token handshake gives a connection.
#[derive(Debug)]
pub(super) struct Secure {
    /// The connect token's session keys. The packet keys derive from them and from what makes
    /// the session unique ([`SessionKeys::for_session`]): the server's when it opens the
    /// session, the client's when it opens the sealed accept.
    pub(super) keys: SessionKeys,
    /// The handshake's keys (derived from `keys`).
    pub(super) hk: HandshakeKeys,
    /// Client: the reset token the server's sealed accept carried.
    pub(super) reset_token: Option<[u8; HANDSHAKE_TAG_LEN]>,
    /// Client: the token it presents, and the next of its server addresses to try. Boxed:
    /// a server's sessions (the many) never hold one, and inline it would be most of this
    /// struct.
    pub(super) token: Option<Box<(ConnectToken, usize)>>,
}

// The send room's part: channels, segments, retransmissions.

/// The bit of `Sending::queued_kinds` for a reliable (or an unreliable) channel.
pub(super) fn queued_bit(reliable: bool) -> u8 {
    1 << u8::from(reliable)
}

/// Send-side state: channels, segments, retransmissions.
#[derive(Debug)]
pub(super) struct Sending {
    pub(super) channels: Vec<SendChannel>,
    /// Bytes queued by `send` and not yet sent for the first time.
    pub(super) queued_bytes: usize,
    /// The channel `fill_new_data` starts with (round robin, one step per packet; without
    /// lanes). `u16` (there are at most 256 channels) beside `queued_kinds`, and with them
    /// `peer_window`: together they take one word.
    pub(super) rr: u16,
    /// Which kinds of channel have fragments queued: bit 0 an unreliable one, bit 1 a
    /// reliable one ([`queued_bit`]). Whether any channel has data is asked at every visit
    /// of a connection (its deadline, whether it is done sending): the bits answer it
    /// without a pass over the channels. A queue that grows sets its bit; one that empties
    /// has the bits recounted.
    pub(super) queued_kinds: u8,
    /// Reliable segments from `seg_base` up, acknowledged ones only popped at the front.
    pub(super) segments: VecDeque<Segment>,
    pub(super) seg_base: u64,
    pub(super) unacked_segments: usize,
    /// Segment ids to send again (declared lost), oldest first.
    pub(super) retx: VecDeque<u64>,
    /// The peer's receive window (segments), from its last ACK.
    pub(super) peer_window: u32,
    /// Data waits for the pacer until then.
    pub(super) pacing_until: Option<Instant>,
    /// Lanes, deadlines and newest-only channels; `None` (one lane, no deadline sent yet,
    /// no newest-only channel) sends channels in turn, as always.
    pub(super) lanes: Option<Box<super::lanes::LaneSched>>,
}

impl Sending {
    pub(super) fn new(cfg: &Config) -> Self {
        let channels = cfg
            .channels
            .iter()
            .map(|&kind| SendChannel {
                kind,
                next_id: 0,
                queue: VecDeque::new(),
                queued: 0,
            })
            .collect();
        Self {
            channels,
            queued_bytes: 0,
            queued_kinds: 0,
            rr: 0,
            segments: VecDeque::new(),
            seg_base: 0,
            unacked_segments: 0,
            retx: VecDeque::new(),
            peer_window: u32::try_from(cfg.recv_window).unwrap_or(u32::MAX),
            pacing_until: None,
            lanes: super::lanes::LaneSched::from_config(cfg),
        }
    }
}

#[derive(Debug)]
pub(super) struct Segment {
    pub(super) channel: u8,
    pub(super) message_id: u64,
    pub(super) index: u32,
    pub(super) count: u32,
    pub(super) data: Bytes,
    /// Packet number of the newest copy: only its loss triggers a retransmission.
    pub(super) last_pn: u64,
    pub(super) acked: bool,
    pub(super) queued: bool,
}

#[derive(Debug)]
pub(super) struct OutFrag {
    pub(super) message_id: u64,
    pub(super) index: u32,
    pub(super) count: u32,
    pub(super) data: Bytes,
}

#[derive(Debug)]
pub(super) struct SendChannel {
    pub(super) kind: ChannelKind,
    pub(super) next_id: u64,
    pub(super) queue: VecDeque<OutFrag>,
    /// Bytes of `queue`'s fragments, saturating: a `u32` fits beside `kind` at no cost per
    /// channel, and only unreliable channels read it, whose queues are held to
    /// [`Config::unreliable_queue_limit`].
    pub(super) queued: u32,
}

// The recovery room's part: packet numbers and the sent-packet list.

/// RTT samples a connection holds for its endpoint to collect (see
/// [`crate::Endpoint::drain_rtt_samples`]); more between two collections overwrite the last.
pub(super) const UNREAD_RTT: usize = 4;

/// Loss-recovery state.
#[derive(Debug)]
pub(super) struct Recovery {
    pub(super) next_pn: u64,
    pub(super) sent: VecDeque<SentPacket>,
    /// Packets of `sent` in state `InFlight` (so timers need not scan `sent`).
    pub(super) in_flight_packets: u32,
    /// Of those, packets that carry reliable fragments.
    pub(super) reliable_in_flight: u32,
    pub(super) largest_acked: Option<u64>,
    /// When the next packet passes the time threshold of loss detection.
    pub(super) loss_time: Option<Instant>,
    /// Probe timeouts since the last ACK progress: 1 is the tail-loss probe, then RTOs.
    pub(super) pto_count: u32,
    /// The next packet must be ack-eliciting (a probe), past the congestion window if need be.
    pub(super) probe_pending: bool,
    /// The probe timer counts from here.
    pub(super) last_ack_eliciting_sent: Option<Instant>,
    /// Since when this side has waited for an ACK of anything it sent, with none newly
    /// acknowledged (`None`: nothing in flight since the last ACK progress). Losses leave it
    /// alone, so a peer that keeps sending but never acknowledges is closed after
    /// `idle_timeout` all the same.
    pub(super) ack_wait_since: Option<Instant>,
    /// RTT samples (µs) not yet collected by the endpoint ...
    pub(super) unread_rtt: [u32; UNREAD_RTT],
    /// ... and how many (apart, so that the count packs with the other small fields).
    pub(super) unread_rtt_len: u8,
}

impl Recovery {
    pub(super) fn new() -> Self {
        Self {
            next_pn: 0,
            sent: VecDeque::new(),
            in_flight_packets: 0,
            reliable_in_flight: 0,
            largest_acked: None,
            loss_time: None,
            pto_count: 0,
            probe_pending: false,
            last_ack_eliciting_sent: None,
            ack_wait_since: None,
            unread_rtt: [0; UNREAD_RTT],
            unread_rtt_len: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PacketState {
    InFlight,
    Acked,
    Lost,
    /// Not ack-eliciting (ACK-only, close): never tracked for loss.
    Untracked,
}

#[derive(Debug)]
pub(super) struct SentPacket {
    pub(super) pn: u64,
    pub(super) time: Instant,
    /// Datagram bytes (u32 makes room for `acks_below` within 64 bytes).
    pub(super) size: u32,
    pub(super) state: PacketState,
    /// One past the largest packet number the ACK frame it carried acknowledged (0: it
    /// carried none). Once the peer has it, ACKs need not report below that again.
    pub(super) acks_below: u64,
    /// Reliable segment ids carried (inline up to two: a packet's own memory, not a heap
    /// allocation per packet, in the usual case of one message fragment per datagram).
    pub(super) segs: Segs,
}

/// The reliable segment ids one packet carries.
pub(super) type Segs = smallvec::SmallVec<[u64; 2]>;

/// Appends `sid` to a packet's ids. A packet that outgrows the inline two (many small messages
/// in one datagram) makes room for 16 at once rather than growing to 4, 8, then 16.
pub(super) fn push_seg(segs: &mut Segs, sid: u64) {
    if segs.len() == segs.inline_size() {
        segs.reserve_exact(16 - segs.len());
    }
    segs.push(sid);
}

// The sent list is scanned by loss detection: 64 bytes per packet at most.
const _: () = assert!(std::mem::size_of::<SentPacket>() <= 64);

// The close room's part.

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

// The timer room's part: the moments its deadlines count from.

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
