//! The ack room: the packet numbers received (ascending disjoint ranges, for ACK frames and
//! duplicate detection), when an ACK is due (count, delay, a gap), writing the ACK frame, and
//! the loss report this side sends its peer.

use super::fec_link::FecLink;
use crate::wire::{self, Frame, Writer, MAX_ACK_RANGES};
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

    pub(super) fn record_received(
        &mut self,
        cfg: &Config,
        now: Instant,
        pn: u64,
        ack_eliciting: bool,
        reliable: bool,
    ) {
        // A packet that comes after the ACK floor passed it (reordered, or rebuilt by FEC
        // once its group's parity came) is acknowledged all the same: the next ACK frames
        // list ranges from it up again, until the peer has seen one of them.
        self.ack_floor = self.ack_floor.min(pn);
        let largest = self.ranges.back().map(|&(_, h)| h);
        // Insert pn into the ascending, disjoint range list (search from the top: most
        // packets arrive in order).
        let mut i = self.ranges.len();
        while i > 0 && self.ranges[i - 1].0 > pn {
            i -= 1;
        }
        // Now ranges[..i] start at or below pn.
        let merge_prev = i > 0 && self.ranges[i - 1].1 + 1 == pn;
        let merge_next = i < self.ranges.len() && self.ranges[i].0 == pn + 1;
        match (merge_prev, merge_next) {
            (true, true) => {
                let hi = self.ranges[i].1;
                self.ranges[i - 1].1 = hi;
                self.ranges.remove(i);
            }
            (true, false) => self.ranges[i - 1].1 = pn,
            (false, true) => self.ranges[i].0 = pn,
            (false, false) => self.ranges.insert(i, (pn, pn)),
        }
        while self.ranges.len() > MAX_TRACKED_RANGES {
            if let Some((_, hi)) = self.ranges.pop_front() {
                self.floor = hi + 1;
            }
        }
        self.pending = true;
        if ack_eliciting {
            self.eliciting_unacked = self.eliciting_unacked.saturating_add(1);
            let delay = match cfg.unreliable_ack_delay {
                Some(d) if !reliable => d,
                _ => {
                    self.reliable_unacked = self.reliable_unacked.saturating_add(1);
                    cfg.max_ack_delay
                }
            };
            if largest.is_some_and(|l| pn != l + 1) {
                self.immediate = true; // gap or reordering: tell the sender at once
            }
            let d = now + delay;
            self.deadline = Some(self.deadline.map_or(d, |x| x.min(d)));
        }
    }

    /// Writes an ACK frame of the newest received ranges (above [`Self::ack_floor`]) if it
    /// fits; returns the largest packet number it acknowledged.
    pub(super) fn write_ack(
        &mut self,
        cfg: &Config,
        receiving: usize,
        now: Instant,
        w: &mut Writer<'_>,
    ) -> Option<u64> {
        // Not zero-filled first: a session usually lists one or two of the 32.
        let mut ranges = smallvec::SmallVec::<[(u64, u64); MAX_ACK_RANGES]>::new();
        for &(lo, hi) in self.ranges.iter().rev().take(MAX_ACK_RANGES) {
            if hi < self.ack_floor {
                // Every older range is below the floor too. The newest is always listed (in
                // full: nothing has arrived since the frame the peer acknowledged).
                if ranges.is_empty() {
                    ranges.push((lo, hi));
                }
                break;
            }
            ranges.push((lo.max(self.ack_floor), hi));
        }
        let mut n = ranges.len();
        if n == 0 {
            return None;
        }
        let delay = self.largest.map_or(0, |(_, t)| {
            now.saturating_duration_since(t).as_micros() as u64
        });
        let window = cfg.recv_window.saturating_sub(receiving) as u64;
        // Shrink the range list until it fits the space left.
        while n > 0 && wire::ack_len(delay, window, &ranges[..n]) > w.remaining() {
            n -= 1;
        }
        if n > 0 && wire::encode_ack(delay, window, &ranges[..n], w).is_ok() {
            self.pending = false;
            self.eliciting_unacked = 0;
            self.reliable_unacked = 0;
            self.deadline = None;
            self.immediate = false;
            return Some(ranges[0].1);
        }
        None
    }

    /// Whether the ACK count alone calls for an ACK now. Only ack-eliciting packets count,
    /// and at least one must have come since the last ACK: an `ack_frequency` of 0 (which
    /// `Config::validate` refuses) would otherwise answer every ACK-only packet with another,
    /// and two peers would trade them forever.
    pub(super) fn ack_count_reached(&self, cfg: &Config) -> bool {
        let frequency = cfg.ack_frequency.max(1);
        match cfg.unreliable_ack_delay {
            None => u32::from(self.eliciting_unacked) >= frequency,
            Some(_) => {
                u32::from(self.reliable_unacked) >= frequency
                    || u32::from(self.eliciting_unacked)
                        >= crate::UNRELIABLE_ACK_TOLERANCE.max(frequency)
            }
        }
    }
}

impl Acks {
    /// When an ACK is due: at once after a gap or enough packets, else at the delayed-ACK
    /// deadline; `None` with nothing ack-eliciting to acknowledge.
    pub(super) fn ack_deadline(&self, cfg: &Config, last_recv: Instant) -> Option<Instant> {
        if !(self.pending && self.eliciting_unacked > 0) {
            return None;
        }
        if self.immediate || self.ack_count_reached(cfg) {
            Some(last_recv)
        } else {
            self.deadline
        }
    }

    /// Writes the loss report if due and it fits: when the peer sends FEC, its data-shard
    /// loss before recovery (what its parity policy needs); otherwise packet-number gaps.
    pub(super) fn write_loss_report(
        &mut self,
        cfg: &Config,
        fec: &mut FecLink,
        now: Instant,
        w: &mut Writer<'_>,
    ) {
        if now >= self.report.due
            && (self.report.received > 0 || fec.receiving())
            && w.remaining() >= LOSS_REPORT_MAX
        {
            let (received, lost, max_burst) = match fec.take_loss_report() {
                Some(r) => r,
                None => {
                    let largest = self.largest.map_or(0, |(l, _)| l);
                    let expected = largest.saturating_sub(self.report.base.unwrap_or(largest)) + 1;
                    // Packet-number gaps do not tell bursts apart (reordering fills them).
                    (
                        self.report.received,
                        expected.saturating_sub(self.report.received),
                        0,
                    )
                }
            };
            let f = Frame::LossReport {
                received,
                lost,
                max_burst,
            };
            if received + lost == 0 || wire::encode_frame(&f, w).is_ok() {
                self.report.received = 0;
                self.report.base = None;
                self.report.due = now + cfg.loss_report_interval;
            }
        }
    }
}
