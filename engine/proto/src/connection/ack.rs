//! The ack room: the packet numbers received (ascending disjoint ranges, for ACK frames and
//! duplicate detection), when an ACK is due (count, delay, a gap), writing the ACK frame, and
//! the loss report this side sends its peer.

use std::collections::VecDeque;
use std::time::Instant;

use crate::Config;

/// Received packet-number ranges kept for ACKs and duplicate detection; older ones move the floor.
pub(super) const MAX_TRACKED_RANGES: usize = 64;
/// Largest loss-report frame: type and three 8-byte varints.
pub(super) const LOSS_REPORT_MAX: usize = 1 + 8 + 8 + 8;

/// Receive-side acknowledgement state.
#[derive(Debug)]
pub(super) struct Acks {
    /// Received packet numbers, ascending disjoint inclusive ranges.
    pub(super) ranges: VecDeque<(u64, u64)>,
    /// Packets below this are too old to tell from duplicates: dropped.
    pub(super) floor: u64,
    /// ACK frames list received packets from here up (besides the newest range, which they
    /// always carry): the largest packet an ACK frame listed, once the peer has acknowledged
    /// the packet that carried it (RFC 9000 §13.2.4). The peer has then seen the ranges that
    /// frame listed (at most [`crate::wire::MAX_ACK_RANGES`], the newest); older gaps from
    /// lost packets stop costing bytes in every datagram. A packet arriving below the floor
    /// lowers it.
    pub(super) ack_floor: u64,
    /// The largest packet number received, and when.
    pub(super) largest: Option<(u64, Instant)>,
    /// Something was received since the last ACK frame.
    pub(super) pending: bool,
    pub(super) eliciting_unacked: u16,
    /// Of those, packets that carried reliable data or a ping (never held for
    /// [`Config::unreliable_ack_delay`]).
    pub(super) reliable_unacked: u16,
    /// When the delayed ACK is due.
    pub(super) deadline: Option<Instant>,
    /// A gap or reordering: ACK at once.
    pub(super) immediate: bool,
    /// The loss report this side owes its peer.
    pub(super) report: LossReport,
}

/// Packets counted for the next loss report.
#[derive(Debug)]
pub(super) struct LossReport {
    pub(super) received: u64,
    /// The first packet number counted.
    pub(super) base: Option<u64>,
    /// When the next report goes out.
    pub(super) due: Instant,
}

impl Acks {
    pub(super) fn new(cfg: &Config, now: Instant) -> Self {
        Self {
            ranges: VecDeque::new(),
            floor: 0,
            ack_floor: 0,
            largest: None,
            pending: false,
            eliciting_unacked: 0,
            reliable_unacked: 0,
            deadline: None,
            immediate: false,
            report: LossReport {
                received: 0,
                base: None,
                due: now + cfg.loss_report_interval,
            },
        }
    }
}
