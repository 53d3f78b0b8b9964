//! The connection's seam to path MTU discovery (the search itself is `pmtu`): probes sent as
//! padded pings outside congestion control and FEC, their ACKs, the losses black-hole
//! detection counts, and what a shrink does to queued unreliable fragments.

use std::time::{Duration, Instant};

use super::pmtu::Change;
use super::state::{Connection, ConnectionState, Segs, Side};
use crate::protect::NumberSpace;
use crate::wire::{self, Frame, Writer};
use crate::Transmit;

impl Connection {
    /// Whether a path MTU probe may go out now: established, and (on a server) the client
    /// has the accept (a client still handshaking drops data packets, which would refuse the
    /// size for nothing).
    pub(super) fn probing_path(&self) -> bool {
        self.state == ConnectionState::Established
            && !(self.side == Side::Server && self.accept.pending)
    }

    /// When the path-MTU search needs the connection: a probe to send (at `last_sent`, "now"),
    /// the probe in flight's loss, the raise timer.
    pub(super) fn path_mtu_deadline(&self) -> Option<Instant> {
        if !self.probing_path() {
            return None;
        }
        self.path
            .mtu
            .as_ref()?
            .poll_timeout(self.activity.last_sent)
    }

    /// The largest datagram new packets may take: the size the search found, or the base
    /// while discovery is off.
    pub(super) fn datagram_size(&self) -> usize {
        self.path
            .mtu
            .as_ref()
            .map_or(self.cfg.max_datagram_size, |m| m.current())
    }

    /// What UDP payload bytes a sent packet of ARQ length `len` took on the wire (its tag, and
    /// its FEC wrapping when FEC is on).
    pub(super) fn wire_size(&self, len: usize) -> usize {
        let base = self.cfg.max_datagram_size;
        len + (base - self.fec.arq_budget(base).min(base))
    }

    /// Sends the probe the search asks for, if any: a `Data` packet of a ping padded to the
    /// size under test. It bypasses FEC (its loss must not cost a FEC group its recovery) and is
    /// tracked as not ack-eliciting, so congestion control and loss recovery never see it
    /// and nothing in it is retransmitted; the search watches its ACK itself.
    pub(super) fn transmit_path_probe(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let pmtu = self.path.mtu.as_deref_mut()?;
        if pmtu.ceiling() > buf.len() {
            pmtu.cap(buf.len());
        }
        let mut size = pmtu.poll_probe(now)?;
        if !self.rtt.has_sample {
            // No RTT sample yet (a session with no traffic since its handshake): a probe's
            // loss would be timed by the initial guess, three times per size. A first probe
            // at the base size, which fits, brings a sample in one round trip.
            size = size.min(self.cfg.max_datagram_size);
        }
        let tag = if self.protection.is_some() {
            wire::TAG_LEN
        } else {
            0
        };
        let end = size.checked_sub(tag)?;
        let pn = self.recovery.next_pn;
        let hdr = wire::encode_data_header(self.path.remote_cid, pn, &mut buf[..end]).ok()?;
        let mut w = Writer::new(&mut buf[hdr..end]);
        wire::encode_frame(&Frame::Ping, &mut w).ok()?;
        let ping = w.len();
        // The rest is PADDING frames (one zero byte each).
        buf[hdr + ping..end].fill(wire::frame_type::PADDING);
        self.recovery.next_pn += 1;
        self.record_sent(now, pn, end, false, 0, Segs::new());
        let timeout = self
            .rtt
            .probe_delay(self.cfg.max_ack_delay)
            .max(self.cfg.min_probe_timeout);
        if let Some(m) = self.path.mtu.as_deref_mut() {
            m.on_probe_sent(pn, size, now, timeout);
        }
        let size = self.protect_as(now, NumberSpace::Data, pn, buf, hdr, end)?;
        Some(Transmit {
            destination: self.path.remote,
            size,
        })
    }

    /// An ACK arrived: the probe in flight is acknowledged if it names its packet number.
    pub(super) fn path_mtu_on_ack(&mut self, now: Instant, ack: &wire::AckFrame<'_>) {
        let Some((pn, sent)) = self.path.mtu.as_ref().and_then(|m| m.probe_in_flight()) else {
            return;
        };
        if ack.ranges().any(|(lo, hi)| lo <= pn && pn <= hi) {
            if let Some(m) = self.path.mtu.as_deref_mut() {
                m.on_probe_acked(now);
            }
            // An RTT sample (packet numbers are never reused, and a ping is acknowledged at
            // once): a session with no other traffic yet times its probes by the path, not by
            // the initial guess. The reported delay is the largest packet's.
            let sample = now.saturating_duration_since(sent);
            let reported = if pn == ack.largest {
                Duration::from_micros(ack.ack_delay_us).min(self.cfg.max_ack_delay)
            } else {
                Duration::ZERO
            };
            self.rtt.update(sample, reported);
            self.note_rtt_sample(sample);
        }
    }

    /// A packet of ARQ length `len` sent at `sent` was declared lost: a run of such losses
    /// above the base is a black hole, and the connection falls back to the base.
    pub(super) fn path_mtu_on_lost(&mut self, len: usize, sent: Instant) {
        let size = self.wire_size(len);
        let shrank = self
            .path
            .mtu
            .as_deref_mut()
            .is_some_and(|m| m.on_packet_lost(size, sent) == Change::Shrank);
        if shrank {
            let limit = self.cfg.fragment_payload();
            self.drop_oversize_unreliable(limit);
        }
    }

    /// After a shrink: whole unreliable messages still queued with a fragment longer than
    /// `limit` bytes (cut for the larger size) are dropped unsent, counted in
    /// [`crate::ConnectionStats::unreliable_unsent`]; they no longer fit a packet. Reliable
    /// fragments are always cut to the base and stay.
    fn drop_oversize_unreliable(&mut self, limit: usize) {
        for ci in 0..self.send.channels.len() {
            let ch = &mut self.send.channels[ci];
            if ch.kind.is_reliable() || ch.queue.iter().all(|f| f.data.len() <= limit) {
                continue;
            }
            // A message's fragments are cut to one size (its last may be shorter).
            let mut ids: Vec<u64> = ch
                .queue
                .iter()
                .filter(|f| f.data.len() > limit)
                .map(|f| f.message_id)
                .collect();
            ids.dedup();
            let mut dropped_bytes = 0usize;
            ch.queue.retain(|f| {
                let drop = ids.contains(&f.message_id);
                if drop {
                    dropped_bytes += f.data.len();
                }
                !drop
            });
            self.send.dequeued(ci, dropped_bytes);
            self.counters.unreliable_unsent += ids.len() as u64;
        }
    }
}
