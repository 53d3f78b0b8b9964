//! The recovery room: packet numbers, the sent-packet list, ACK processing, loss detection
//! (packet and time thresholds), the tail-loss probe and the retransmission timeout (RTO,
//! with backoff), and the RTT samples they yield. The RTT estimator is `rtt.rs`, congestion
//! control `cc.rs`.

use std::collections::VecDeque;
use std::time::Instant;

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
