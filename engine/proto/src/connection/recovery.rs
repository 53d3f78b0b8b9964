//! The recovery room: packet numbers, the sent-packet list, ACK processing, loss detection
//! (packet and time thresholds), the tail-loss probe and the retransmission timeout (RTO,
//! with backoff), and the RTT samples they yield. The RTT estimator is `rtt.rs`, congestion
//! control `cc.rs`.
//!
//! This room's state (`Recovery`, `SentPacket`) is defined in `state.rs`, beside the `Connection`
//! that holds it.

use std::time::Duration;
use std::time::Instant;

use super::state::{Connection, PacketState, Segs, SentPacket, UNREAD_RTT};
use crate::wire;

impl Connection {
    /// Hands the RTT samples taken since the last call to `f` (µs, oldest first). A connection
    /// keeps the last few; its endpoint collects them after every input.
    pub(crate) fn take_rtt_samples(&mut self, mut f: impl FnMut(u32)) {
        let (buf, n) = (
            &mut self.recovery.unread_rtt,
            &mut self.recovery.unread_rtt_len,
        );
        for &us in &buf[..usize::from(*n)] {
            f(us);
        }
        *n = 0;
    }

    pub(super) fn note_rtt_sample(&mut self, sample: Duration) {
        self.counters.rtt.record(sample);
        let us = u32::try_from(sample.as_micros()).unwrap_or(u32::MAX);
        let (buf, n) = (
            &mut self.recovery.unread_rtt,
            &mut self.recovery.unread_rtt_len,
        );
        if usize::from(*n) < UNREAD_RTT {
            buf[usize::from(*n)] = us;
            *n += 1;
        } else {
            buf[UNREAD_RTT - 1] = us;
        }
    }

    pub(super) fn pto_base(&self) -> Duration {
        self.rtt.rto(self.cfg.min_rto, self.cfg.max_ack_delay)
    }

    /// The retransmission timeout after `pto_count` expiries: the first one is the tail-loss
    /// probe's (see [`Self::probe_timeout`]), so the RTO proper starts at the base and doubles
    /// from the second.
    pub(super) fn current_rto(&self) -> Duration {
        let doublings = self.recovery.pto_count.saturating_sub(1).min(16);
        (self.pto_base() * 2u32.saturating_pow(doublings)).min(self.cfg.max_rto)
    }

    /// How long after the last ack-eliciting packet the next probe timer fires. The first
    /// expiry is a tail-loss probe after two smoothed RTTs (or the smoothed RTT and four
    /// deviations, if longer) plus the peer's ACK delay (RFC 8985, [`RttEstimator::probe_delay`]),
    /// at least [`Config::min_probe_timeout`] and never later than the RTO: it resends a lost
    /// last packet (or a lost retransmission that blocks an ordered channel) well before a
    /// conservative minimum RTO would, without firing at every scheduling hiccup of a short
    /// path.
    pub(super) fn probe_timeout(&self) -> Duration {
        if self.recovery.pto_count == 0 {
            let tlp = self
                .rtt
                .probe_delay(self.cfg.max_ack_delay)
                .max(self.cfg.min_probe_timeout)
                .max(Duration::from_millis(1));
            // Only unreliable packets in flight: their ACK may be held (nothing would be
            // resent by probing for it sooner).
            if let Some(held) = self.cfg.unreliable_ack_delay {
                if self.recovery.reliable_in_flight == 0 && !self.has_queued_reliable() {
                    return tlp + held;
                }
            }
            tlp.min(self.current_rto())
        } else {
            self.current_rto()
        }
    }

    /// Process an ACK frame; true when something new was acknowledged.
    pub(super) fn on_ack(&mut self, now: Instant, ack: &wire::AckFrame<'_>) -> bool {
        self.send.peer_window = u32::try_from(ack.window).unwrap_or(u32::MAX);
        self.path_mtu_on_ack(now, ack);
        let Some(front) = self.recovery.sent.front().map(|p| p.pn) else {
            return false;
        };
        let mut newly = false;
        let mut largest_newly: Option<(Instant, bool)> = None;
        // The newest packet this ACK covers, whatever the sender's bookkeeping of it (ACK-only,
        // declared lost, in flight): parity sent before it has left the path.
        let mut newest_covered: Option<Instant> = None;
        for (lo, hi) in ack.ranges() {
            let lo = lo.max(front);
            let hi = hi.min(self.recovery.next_pn.saturating_sub(1));
            if lo > hi {
                continue;
            }
            for pn in lo..=hi {
                let idx = (pn - front) as usize;
                let Some(p) = self.recovery.sent.get_mut(idx) else {
                    break;
                };
                if p.state != PacketState::Acked {
                    newest_covered = Some(newest_covered.map_or(p.time, |t| t.max(p.time)));
                    // The peer has the ACK frame this packet carried.
                    self.ack.ack_floor = self.ack.ack_floor.max(p.acks_below);
                }
                match p.state {
                    PacketState::InFlight => {
                        p.state = PacketState::Acked;
                        self.recovery.in_flight_packets -= 1;
                        if !p.segs.is_empty() {
                            self.recovery.reliable_in_flight -= 1;
                        }
                        newly = true;
                        self.cc.on_acked(p.size as usize, p.time);
                        let size = p.size as usize;
                        let wire = self.wire_size(size);
                        if let Some(m) = self.path.mtu.as_deref_mut() {
                            m.on_packet_acked(wire);
                        }
                        let Some(p) = self.recovery.sent.get_mut(idx) else {
                            break;
                        };
                        if pn == ack.largest {
                            largest_newly = Some((p.time, !p.segs.is_empty()));
                        }
                        let segs = std::mem::take(&mut p.segs);
                        for &sid in &segs {
                            self.ack_segment(sid);
                        }
                    }
                    PacketState::Lost => {
                        p.state = PacketState::Acked;
                        self.counters.packets_spurious_lost += 1;
                        // Packet numbers are never reused, so this is an unambiguous sample
                        // too; without it a path whose RTT outgrew the estimate (a peer that
                        // overloaded stalls for seconds) would never teach it otherwise, as
                        // every packet is declared lost before its ACK can come back.
                        if pn == ack.largest {
                            largest_newly = Some((p.time, !p.segs.is_empty()));
                        }
                        let segs = std::mem::take(&mut p.segs);
                        for &sid in &segs {
                            self.ack_segment(sid);
                        }
                    }
                    PacketState::Acked | PacketState::Untracked => {}
                }
            }
        }
        if let Some(t) = newest_covered {
            self.fec.on_acked(t, true, &mut self.cc);
        }
        let mut path_sample = None;
        if let Some((sent_time, reliable)) = largest_newly {
            let sample = now.saturating_duration_since(sent_time);
            let reported = Duration::from_micros(ack.ack_delay_us);
            path_sample = Some(match self.cfg.unreliable_ack_delay {
                // The peer held the ACK of an unreliable-only packet on purpose, up to its
                // hold: that time is not the path's. Taken off before the estimator sees the
                // sample, since with every sample held its minimum would include the hold and
                // never let the delay be subtracted (RFC 9002 §5.3's guard).
                Some(hold) if !reliable => {
                    let held = reported.min(hold.max(self.cfg.max_ack_delay));
                    let path = sample.saturating_sub(held).max(Duration::from_micros(1));
                    self.rtt.update(path, Duration::ZERO);
                    self.note_rtt_sample(path);
                    path
                }
                _ => {
                    let delay = reported.min(self.cfg.max_ack_delay);
                    self.rtt.update(sample, delay);
                    self.note_rtt_sample(sample);
                    sample.saturating_sub(delay).max(Duration::from_micros(1))
                }
            });
        }
        self.cc.on_ack_end(now, path_sample, self.rtt.smoothed);
        if self.recovery.largest_acked.is_none_or(|l| ack.largest > l) {
            self.recovery.largest_acked = Some(ack.largest);
        }
        if newly {
            self.recovery.pto_count = 0;
            self.recovery.ack_wait_since = (self.recovery.in_flight_packets > 0).then_some(now);
        }
        self.detect_lost(now);
        self.pop_sent(now);
        newly
    }

    /// Drops settled packets from the front of the sent list. A packet declared lost stays
    /// for a while (two loss delays after it was sent, or three RTOs while the RTT estimate
    /// is in doubt): if its ACK still arrives, the loss was
    /// spurious (reordering or delay) and is counted as such, and its fragments are settled.
    pub(super) fn pop_sent(&mut self, now: Instant) {
        // While the estimate may be far below the real RTT (no sample yet, or timeouts firing
        // with nothing acknowledged since), at least three retransmission timeouts (backoff
        // included; RFC 9002 §6 suggests 3 x PTO): the ACK of a packet declared lost comes
        // back that late, and a forgotten packet's ACK settles nothing. Otherwise two loss
        // delays, which keeps the list (scanned by loss detection) short.
        // Worked out at the first packet declared lost at the front, not per call: on a clean
        // path no packet is ever lost, and the front is settled or in flight.
        let mut keep_lost = None;
        while let Some(p) = self.recovery.sent.front() {
            let settled = match p.state {
                PacketState::InFlight => false,
                PacketState::Lost => {
                    let keep = *keep_lost.get_or_insert_with(|| self.keep_lost());
                    p.time + keep <= now
                }
                PacketState::Acked | PacketState::Untracked => true,
            };
            if !settled {
                break;
            }
            self.recovery.sent.pop_front();
        }
    }

    /// How long a packet declared lost stays in the sent list (see [`Self::pop_sent`]).
    fn keep_lost(&self) -> Duration {
        let keep = self.rtt.loss_delay() * 2;
        if !self.rtt.has_sample || self.recovery.pto_count > 0 {
            keep.max(self.current_rto() * 3)
        } else {
            keep
        }
    }

    pub(super) fn queueing(&self) -> bool {
        let r = &self.rtt;
        r.has_sample && r.smoothed > r.min + (r.min / 8).max(Duration::from_millis(2))
    }

    pub(super) fn detect_lost(&mut self, now: Instant) {
        self.recovery.loss_time = None;
        let Some(la) = self.recovery.largest_acked else {
            return;
        };
        // While groups carry parity, the peer may rebuild a lost packet once its group's
        // parity arrives: later packets acknowledged meanwhile, or the usual time threshold
        // passing, are no proof of loss until the group had time to close.
        let delay = self.rtt.loss_delay() + self.fec.reorder_delay();
        let threshold = self.cfg.packet_threshold + self.fec.reorder_allowance();
        let mut largest_lost_time: Option<Instant> = None;
        let mut declared = 0u64;
        for i in 0..self.recovery.sent.len() {
            let (pn, time, state) = {
                let p = &self.recovery.sent[i];
                (p.pn, p.time, p.state)
            };
            if pn >= la {
                break;
            }
            if state != PacketState::InFlight {
                continue;
            }
            if la - pn >= threshold || time + delay <= now {
                self.declare_lost(i);
                declared += 1;
                largest_lost_time = Some(time);
            } else {
                let t = time + delay;
                self.recovery.loss_time = Some(self.recovery.loss_time.map_or(t, |x| x.min(t)));
            }
        }
        if let Some(t) = largest_lost_time {
            let q = self.queueing();
            self.cc.on_loss(now, t, q);
            if q {
                // Lost to the queue this sender built: not the path's random loss, which
                // FEC's repairs are for (they would only add to the queue).
                self.fec.on_congestion_loss(declared);
            }
            // Parity sent before a packet declared lost is no longer expected either.
            self.fec.on_acked(t, false, &mut self.cc);
        }
    }

    pub(super) fn declare_lost(&mut self, i: usize) {
        let p = &mut self.recovery.sent[i];
        if p.state == PacketState::InFlight {
            self.recovery.in_flight_packets -= 1;
            if !p.segs.is_empty() {
                self.recovery.reliable_in_flight -= 1;
            }
        }
        p.state = PacketState::Lost;
        let pn = p.pn;
        let size = p.size as usize;
        let sent = p.time;
        let segs = std::mem::take(&mut p.segs);
        self.cc.on_removed(size);
        self.path_mtu_on_lost(size, sent);
        self.counters.packets_lost += 1;
        for &sid in &segs {
            if sid < self.send.seg_base {
                continue;
            }
            if let Some(s) = self
                .send
                .segments
                .get_mut((sid - self.send.seg_base) as usize)
            {
                if !s.acked && !s.queued && s.last_pn == pn {
                    s.queued = true;
                    self.send.retx.push_back(sid);
                    if self.cfg.redundant_retransmit && self.fec.reorder_allowance() == 0 {
                        // Second copy, sent in the packet after the first (see the config).
                        // Not while FEC groups carry parity: that protects the retransmission too.
                        self.send.retx.push_back(sid);
                    }
                }
            }
        }
        // Keep the ids: a late ACK of this packet still acknowledges its segments.
        self.recovery.sent[i].segs = segs;
    }

    pub(super) fn pto_deadline(&self) -> Option<Instant> {
        let base = self.recovery.last_ack_eliciting_sent?;
        debug_assert_eq!(
            self.recovery.in_flight_packets as usize,
            self.recovery
                .sent
                .iter()
                .filter(|p| p.state == PacketState::InFlight)
                .count()
        );
        // Evaluated lazily, most common first: with data in flight (every active session) the
        // boxed FEC state is not read.
        let in_flight = self.recovery.in_flight_packets > 0;
        let armed = in_flight
            || (self.send.peer_window == 0 && self.has_queued_reliable())
            // Parity alone fills the window and no data packet is in flight whose ACK or loss
            // would take it out: the probe (which may exceed the window) and then the RTO end
            // the wait.
            // (The window is asked last: it is a call, the rest are fields.)
            || (self.fec.parity_in_flight()
                && (!self.send.retx.is_empty() || self.send.queued_bytes > 0)
                && !self.cc.can_send(self.cfg.max_datagram_size));
        if !armed {
            return None;
        }
        Some(base + self.probe_timeout())
    }
}

impl Connection {
    /// A data packet left: track it (in flight if ack-eliciting) for ACKs and loss detection.
    pub(super) fn record_sent(
        &mut self,
        now: Instant,
        pn: u64,
        len: usize,
        ack_eliciting: bool,
        acks_below: u64,
        segs: Segs,
    ) {
        let state = if ack_eliciting {
            self.cc.on_sent(len);
            self.recovery.last_ack_eliciting_sent = Some(now);
            self.recovery.in_flight_packets += 1;
            self.recovery.ack_wait_since.get_or_insert(now);
            if !segs.is_empty() {
                self.recovery.reliable_in_flight += 1;
            }
            PacketState::InFlight
        } else {
            PacketState::Untracked
        };
        if self.recovery.sent.len() == self.recovery.sent.capacity() {
            // Grow by a quarter (at least 4), not double: at 64 bytes a packet, the list of
            // a session whose flight just passed a power of two would otherwise hold nearly
            // twice the room it uses (and the idle trim gives it back only later).
            self.recovery
                .sent
                .reserve_exact((self.recovery.sent.len() / 4).max(4));
        }
        self.recovery.sent.push_back(SentPacket {
            pn,
            time: now,
            // A datagram is under 64 KiB.
            size: u32::try_from(len).unwrap_or(u32::MAX),
            state,
            acks_below,
            segs,
        });
    }
}

impl Connection {
    /// The probe timer fired: the first time a tail-loss probe, from the second on an RTO
    /// (everything in flight declared lost, the window cut), each backing off the next.
    pub(super) fn on_probe_timeout(&mut self, now: Instant) {
        self.recovery.pto_count += 1;
        if self.recovery.pto_count == 1 {
            // Tail-loss probe: elicit an ACK (and resend a lost tail) before the RTO.
            self.counters.tail_loss_probes += 1;
        } else {
            self.counters.rto_count += 1;
            for i in 0..self.recovery.sent.len() {
                if self.recovery.sent[i].state == PacketState::InFlight {
                    self.declare_lost(i);
                }
            }
            self.pop_sent(now);
            self.fec.on_rto(&mut self.cc);
            // Congestion, not random loss, when the RTT shows a queue, when there is no
            // RTT sample to say otherwise, or when this is the second RTO in a row: a peer
            // that answers nothing for two backed-off timeouts is overloaded or gone, and
            // resending a full window at every expiry only buries it deeper.
            let persistent = self.recovery.pto_count > 2 || !self.rtt.has_sample;
            let congested = persistent || self.queueing();
            self.cc.on_rto(now, congested);
        }
        self.recovery.probe_pending = true;
        // Re-arm from now so the next stage waits a full (backed-off) period.
        self.recovery.last_ack_eliciting_sent = Some(now);
    }
}
