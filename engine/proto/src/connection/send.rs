//! The send room: the application's messages queued per channel, cut into fragments; the
//! reliable segments sent and not yet acknowledged, and the retransmission queue; the peer's
//! receive window and the pacing gate. What goes into a data packet, and in what order, is
//! decided here ([`Connection::fill_new_data`], [`Connection::write_retransmissions`]).
//! A new channel kind starts at [`crate::ChannelKind`] and its sending rules here.
//!
//! This room's state (`Sending`, `Segment`, `SendChannel`) is defined in `state.rs`, beside the
//! `Connection` that holds it.

use super::lanes::LaneSched;
use super::state::{
    push_seg, queued_bit, Connection, ConnectionState, OutFrag, Segment, Segs, Sending,
};
use crate::wire::{self, Frame, Writer};
use crate::{LaneStats, SendError, SendOptions, UnsentDrops};
use std::time::{Duration, Instant};

use bytes::Bytes;

/// A link on which a full datagram takes longer than this to serialize (below 4.8 Mbit/s for
/// 1,200 B) is narrow: there a higher-priority lane's data does not share a packet with a
/// lower lane's, so that it waits for its own bytes only.
const NARROW_LINK_SERIALIZATION: Duration = Duration::from_millis(2);

/// Bytes a packet takes beyond its frames' data, for [`Connection::urgent_size`]: the header,
/// an ACK frame and the frames' own headers, generously.
const URGENT_OVERHEAD: usize = 64;

impl Sending {
    /// The next packet starts with the next channel (without lanes).
    pub(super) fn next_turn(&mut self) {
        self.rr = ((self.rr as usize + 1) % self.channels.len().max(1)) as u16;
    }

    /// `queued_kinds` as the channels' queues say.
    fn count_queued_kinds(&self) -> u8 {
        self.channels
            .iter()
            .filter(|c| !c.queue.is_empty())
            .fold(0, |k, c| k | queued_bit(c.kind.is_reliable()))
    }

    /// `bytes` of fragments left channel `ci`'s queue (sent, dropped, shed, replaced or cut by
    /// a smaller path MTU): the channel's and the session's queued counts fall, and if the
    /// queue is now empty the kinds with something queued are recounted. The one place
    /// those three stay in step.
    pub(super) fn dequeued(&mut self, ci: usize, bytes: usize) {
        let ch = &mut self.channels[ci];
        ch.queued = ch
            .queued
            .saturating_sub(u32::try_from(bytes).unwrap_or(u32::MAX));
        let empty = ch.queue.is_empty();
        self.queued_bytes -= bytes;
        if empty {
            self.queued_kinds = self.count_queued_kinds();
        }
    }

    /// Bytes queued on the channels of `lane`.
    fn lane_queued(&self, lanes: &LaneSched, lane: usize) -> usize {
        lanes
            .channels(lane)
            .iter()
            .map(|&c| self.channels[usize::from(c)].queued as usize)
            .sum()
    }

    /// Removes what is queued of message `id` on channel `ci`; true if anything was.
    fn drop_message(&mut self, ci: usize, id: u64) -> bool {
        let ch = &mut self.channels[ci];
        let from = ch.queue.partition_point(|f| f.message_id < id);
        let to = ch.queue.partition_point(|f| f.message_id <= id);
        if from == to {
            return false;
        }
        let bytes: usize = ch.queue.drain(from..to).map(|f| f.data.len()).sum();
        self.dequeued(ci, bytes);
        true
    }
}

impl Connection {
    /// Queue a message on `channel`. Fragments are cut now (zero-copy slices of `data`; a
    /// message that fits one fragment is queued as it is).
    pub fn send(&mut self, channel: u8, data: Bytes) -> Result<(), SendError> {
        self.send_with(channel, data, SendOptions::default())
    }

    /// Queue a message on `channel` with `options` (a deadline for an unreliable message).
    pub fn send_with(
        &mut self,
        channel: u8,
        data: Bytes,
        options: SendOptions,
    ) -> Result<(), SendError> {
        match self.state {
            ConnectionState::Handshaking | ConnectionState::Established => {}
            _ => return Err(SendError::Closed),
        }
        let Some(ch) = self.send.channels.get_mut(usize::from(channel)) else {
            return Err(SendError::UnknownChannel(channel));
        };
        if data.len() > self.cfg.max_message_size {
            return Err(SendError::TooLarge(data.len()));
        }
        if self.send.queued_bytes + data.len() > self.cfg.send_queue_limit {
            return Err(SendError::QueueFull);
        }
        let reliable = ch.kind.is_reliable();
        if reliable && options.deadline.is_some() {
            return Err(SendError::DeadlineOnReliable(channel));
        }
        if self.send.lanes.is_some() {
            self.make_room(usize::from(channel), data.len())?;
        } else if options.deadline.is_some() {
            self.send.lanes = Some(LaneSched::single(self.send.channels.len()));
        }
        // Reliable fragments are cut to the base size, so their retransmissions fit whatever
        // the path shrinks to; unreliable ones (never resent) to the size path MTU discovery
        // found.
        let size = self.datagram_size();
        let Some(ch) = self.send.channels.get_mut(usize::from(channel)) else {
            return Err(SendError::UnknownChannel(channel));
        };
        let frag = if reliable || size <= self.cfg.max_datagram_size {
            self.cfg.fragment_payload()
        } else {
            self.cfg.fragment_payload_for(size)
        };
        let count = data.len().div_ceil(frag).max(1);
        let id = ch.next_id;
        ch.next_id += 1;
        self.send.queued_bytes += data.len();
        self.send.queued_kinds |= queued_bit(reliable);
        ch.queued = ch
            .queued
            .saturating_add(u32::try_from(data.len()).unwrap_or(u32::MAX));
        if count == 1 {
            // The whole message is the fragment: no slice (a slice of a fresh `Bytes` makes it
            // shared, a heap allocation per message).
            ch.queue.push_back(OutFrag {
                message_id: id,
                index: 0,
                count: 1,
                data,
            });
        } else {
            for i in 0..count {
                let start = i * frag;
                let end = (start + frag).min(data.len());
                ch.queue.push_back(OutFrag {
                    message_id: id,
                    index: i as u32,
                    count: count as u32,
                    data: data.slice(start..end),
                });
            }
        }
        if let (Some(at), Some(lanes)) = (options.deadline, self.send.lanes.as_deref_mut()) {
            lanes.add_deadline(usize::from(channel), id, at);
        }
        if !reliable && ch.queued as usize > self.cfg.unreliable_queue_limit {
            self.shed_unreliable(usize::from(channel), id);
        }
        if !reliable {
            self.shed_lane(usize::from(channel), id, 0);
        }
        Ok(())
    }

    /// Before `len` bytes are queued on channel `ci`: a newest-only channel drops its queued
    /// messages not yet begun, and a reliable message makes room in a capped lane by
    /// dropping the lane's oldest unreliable ones (refused if that is not enough).
    fn make_room(&mut self, ci: usize, len: usize) -> Result<(), SendError> {
        let Some(lanes) = self.send.lanes.as_deref() else {
            return Ok(());
        };
        if lanes.newest_only(ci) {
            let ch = &mut self.send.channels[ci];
            // A message whose first fragment left is finished; every later one is replaced.
            let keep = match ch.queue.front() {
                Some(f) if f.index > 0 => {
                    let id = f.message_id;
                    ch.queue.iter().take_while(|g| g.message_id == id).count()
                }
                _ => 0,
            };
            let (mut replaced, mut bytes, mut last) = (0u64, 0usize, None);
            for f in ch.queue.iter().skip(keep) {
                if last != Some(f.message_id) {
                    replaced += 1;
                    last = Some(f.message_id);
                }
                bytes += f.data.len();
            }
            ch.queue.truncate(keep);
            self.send.dequeued(ci, bytes);
            self.counters.unreliable_unsent += replaced;
            if let Some(l) = self.send.lanes.as_deref_mut() {
                l.drops.replaced += replaced;
            }
        }
        if self.send.channels[ci].kind.is_reliable() {
            let Some(lanes) = self.send.lanes.as_deref() else {
                return Ok(());
            };
            let lane = lanes.lane_of(ci);
            if let Some(cap) = lanes.queue_limit(lane) {
                let reliable: usize = lanes
                    .channels(lane)
                    .iter()
                    .map(|&c| &self.send.channels[usize::from(c)])
                    .filter(|c| c.kind.is_reliable())
                    .map(|c| c.queued as usize)
                    .sum();
                // Refused before anything is dropped for it.
                if reliable + len > cap {
                    return Err(SendError::QueueFull);
                }
                self.shed_lane(ci, u64::MAX, len);
            }
        }
        Ok(())
    }

    /// While the lane of channel `ci` holds more than its cap less `room`, drops its oldest
    /// unreliable messages: `ci`'s own first, then the other channels' in the lane's order;
    /// never message `keep` of `ci` (the one just queued).
    fn shed_lane(&mut self, ci: usize, keep: u64, room: usize) {
        let Some(lanes) = self.send.lanes.as_deref() else {
            return;
        };
        let lane = lanes.lane_of(ci);
        let Some(cap) = lanes.queue_limit(lane) else {
            return;
        };
        let order: Vec<usize> = std::iter::once(ci)
            .chain(lanes.channels(lane).iter().map(|&c| usize::from(c)))
            .filter(|&c| !self.send.channels[c].kind.is_reliable())
            .collect();
        let mut dropped = 0u64;
        for c in order {
            loop {
                let Some(lanes) = self.send.lanes.as_deref() else {
                    return;
                };
                if self.send.lane_queued(lanes, lane) + room <= cap {
                    break;
                }
                let Some(id) = self.send.channels[c].queue.front().map(|f| f.message_id) else {
                    break;
                };
                if c == ci && id == keep {
                    break;
                }
                self.send.drop_message(c, id);
                dropped += 1;
            }
        }
        self.counters.unreliable_unsent += dropped;
        if let Some(l) = self.send.lanes.as_deref_mut() {
            l.drops.lane_limit += dropped;
        }
    }

    /// Unreliable messages dropped unsent, by cause.
    pub(super) fn unsent_drops(&self) -> UnsentDrops {
        let mut d = self
            .send
            .lanes
            .as_deref()
            .map(|l| l.drops)
            .unwrap_or_default();
        d.queue_limit = self
            .counters
            .unreliable_unsent
            .saturating_sub(d.lane_limit + d.deadline + d.replaced);
        d
    }

    /// The rate queued bytes are expected to leave at, bytes per second: the congestion
    /// controller's rate estimate (NewReno: its window over the smoothed RTT). The one place
    /// that says what the send rate is, for the lanes' queue times.
    fn send_rate(&self) -> Option<f64> {
        let rate = self.rate_estimate();
        (rate > 0 && !self.rtt.smoothed.is_zero()).then_some(rate as f64)
    }

    /// Lanes of this session ([`crate::Config::lanes`]; one without).
    pub fn lane_count(&self) -> usize {
        self.send.lanes.as_deref().map_or(1, LaneSched::len)
    }

    /// Lane `lane` as of now: what it holds and how long that is expected to wait; `None`
    /// for a lane that does not exist.
    pub fn lane_stats(&self, lane: usize) -> Option<LaneStats> {
        let Some(lanes) = self.send.lanes.as_deref() else {
            return (lane == 0).then(|| LaneStats {
                priority: 0,
                weight: 1,
                queued_bytes: self.send.queued_bytes,
                queue_time: self.queue_time(self.send.queued_bytes as f64),
            });
        };
        if lane >= lanes.len() {
            return None;
        }
        let (priority, weight) = lanes.rank(lane);
        let own = self.send.lane_queued(lanes, lane);
        let (mut ahead, mut peers) = (0usize, 0u64);
        for l in 0..lanes.len() {
            let (p, w) = lanes.rank(l);
            let q = self.send.lane_queued(lanes, l);
            if p < priority {
                ahead += q;
            } else if p == priority && (q > 0 || l == lane) {
                peers += u64::from(w);
            }
        }
        // Lanes of the same priority drain together: this lane's bytes leave at its share.
        let share = f64::from(weight) / peers.max(1) as f64;
        Some(LaneStats {
            priority,
            weight,
            queued_bytes: own,
            queue_time: if own == 0 {
                Duration::ZERO
            } else {
                self.queue_time(ahead as f64 + own as f64 / share)
            },
        })
    }

    fn queue_time(&self, bytes: f64) -> Duration {
        if bytes <= 0.0 {
            return Duration::ZERO;
        }
        match self.send_rate() {
            Some(rate) => Duration::try_from_secs_f64(bytes / rate).unwrap_or(Duration::MAX),
            None => Duration::MAX,
        }
    }

    /// Drops whole messages from the front of unreliable channel `ci` until its queue is back
    /// under [`Config::unreliable_queue_limit`], never message `keep` (the one just queued).
    /// They are the stalest: an unreliable message that waits behind a closed congestion
    /// window is worth less the longer it waits, and without a bound a peer that stops
    /// acknowledging would make this queue grow to the session's whole send-queue limit.
    pub(super) fn shed_unreliable(&mut self, ci: usize, keep: u64) {
        while self.send.channels[ci].queued as usize > self.cfg.unreliable_queue_limit {
            let ch = &mut self.send.channels[ci];
            let Some(id) = ch.queue.front().map(|f| f.message_id) else {
                break;
            };
            if id == keep {
                break;
            }
            let mut bytes = 0;
            while ch.queue.front().is_some_and(|f| f.message_id == id) {
                bytes += ch.queue.pop_front().map_or(0, |f| f.data.len());
            }
            self.send.dequeued(ci, bytes);
            self.counters.unreliable_unsent += 1;
        }
    }

    /// Bytes queued by `send` and not yet sent for the first time.
    pub fn queued_bytes(&self) -> usize {
        self.send.queued_bytes
    }

    /// Reliable fragments sent and not yet acknowledged.
    pub fn unacked_segments(&self) -> usize {
        self.send.unacked_segments
    }

    pub(super) fn channel_is_reliable(&self, channel: u8) -> bool {
        self.send
            .channels
            .get(usize::from(channel))
            .is_some_and(|c| c.kind.is_reliable())
    }

    pub(super) fn has_queued_reliable(&self) -> bool {
        debug_assert_eq!(self.send.queued_kinds, self.send.count_queued_kinds());
        self.send.queued_kinds & queued_bit(true) != 0
    }

    /// Whether data could go out now if window and pacing allowed.
    pub(super) fn has_sendable_data(&self) -> bool {
        // The congestion window gates retransmissions too: reporting "sendable" while the
        // window is full would make `poll_timeout` point at the past forever.
        if !self.cc.can_send(self.cfg.max_datagram_size) {
            return false;
        }
        if !self.send.retx.is_empty() {
            return true;
        }
        // The reliable window is looked at only when a reliable channel has something queued
        // (an idle session has nothing queued anywhere).
        debug_assert_eq!(self.send.queued_kinds, self.send.count_queued_kinds());
        let kinds = self.send.queued_kinds;
        kinds & queued_bit(false) != 0
            || (kinds & queued_bit(true) != 0 && self.reliable_window_open())
    }

    pub(super) fn reliable_window_open(&self) -> bool {
        let window = self
            .cfg
            .send_window
            .min(usize::try_from(self.send.peer_window).unwrap_or(usize::MAX));
        self.send.unacked_segments < window && self.send.segments.len() < 4 * self.cfg.send_window
    }

    /// Writes queued fragments, channels in turn (with lanes: lanes by priority and weight,
    /// retransmissions in their lane); true when it wrote any. `rest`: set when the packet
    /// carries a fragment of an unreliable message of several fragments, to how many of the
    /// last such message's fragments follow and how many it has (FEC spends its repairs on
    /// the message).
    pub(super) fn fill_new_data(
        &mut self,
        now: Instant,
        w: &mut Writer<'_>,
        pn: u64,
        segs: &mut Segs,
        ack_eliciting: &mut bool,
        rest: &mut Option<(u32, u32)>,
    ) -> bool {
        if self.send.lanes.is_some() {
            return self.fill_lanes(now, w, pn, segs, ack_eliciting, rest);
        }
        let n = self.send.channels.len();
        let mut wrote = false;
        loop {
            let mut progress = false;
            for k in 0..n {
                let ci = (self.send.rr as usize + k) % n;
                // An empty channel first (the common case): no window to look at.
                if self.send.channels[ci].queue.is_empty() {
                    continue;
                }
                let reliable = self.send.channels[ci].kind.is_reliable();
                if reliable && !self.reliable_window_open() {
                    continue;
                }
                let Some(f) = self.send.channels[ci].queue.front() else {
                    continue;
                };
                let frame = frame_for(ci as u8, f.message_id, f.index, f.count, &f.data);
                if wire::encode_frame(&frame, w).is_err() {
                    continue;
                }
                let Some(f) = self.send.channels[ci].queue.pop_front() else {
                    continue;
                };
                self.fragment_sent(ci, f, reliable, pn, segs, rest);
                *ack_eliciting = true;
                if self.send.queued_kinds == 0 {
                    // Every queue is empty: the rest of the pass would find nothing.
                    return true;
                }
                progress = true;
                wrote = true;
            }
            if !progress {
                return wrote;
            }
        }
    }

    /// `fill_new_data` with lanes: expired deadlines dropped first, then, fragment by
    /// fragment, the lane the scheduler picks sends its oldest retransmission or its next
    /// channel's fragment, until nothing more fits.
    fn fill_lanes(
        &mut self,
        now: Instant,
        w: &mut Writer<'_>,
        pn: u64,
        segs: &mut Segs,
        ack_eliciting: &mut bool,
        rest: &mut Option<(u32, u32)>,
    ) -> bool {
        self.drop_expired(now);
        let base = self.send.seg_base;
        let segments = &self.send.segments;
        self.send.retx.retain(|&sid| {
            sid >= base
                && segments
                    .get((sid - base) as usize)
                    .is_some_and(|s| !s.acked)
        });
        // Channels and lanes whose next fragment did not fit this packet.
        let mut full = [0u64; 4];
        let mut retx_full = 0u64;
        let mut wrote = false;
        // The priority of the first lane written into this packet, and whether the link is
        // narrow enough that a lower lane's data should wait for the next packet.
        let mut top: Option<u8> = None;
        let mut narrow: Option<bool> = None;
        loop {
            let Some(lanes) = self.send.lanes.as_deref() else {
                return wrote;
            };
            let reliable_ok = self.reliable_window_open();
            let channel_ready = |c: u8| {
                let ch = &self.send.channels[usize::from(c)];
                full[usize::from(c) / 64] & (1 << (c % 64)) == 0
                    && !ch.queue.is_empty()
                    && (reliable_ok || !ch.kind.is_reliable())
            };
            let lane_ready = |l: usize| {
                (retx_full & (1 << l) == 0 && self.lane_retx(lanes, l, segs).is_some())
                    || lanes.channels(l).iter().any(|&c| channel_ready(c))
            };
            let Some(lane) = lanes.pick(lane_ready) else {
                return wrote;
            };
            let priority = lanes.rank(lane).0;
            if top.is_some_and(|t| priority > t)
                && *narrow.get_or_insert_with(|| self.narrow_link())
            {
                // On a narrow link a high-priority message should not wait for a full
                // datagram's serialization: lower lanes go in the next packet.
                return wrote;
            }
            if retx_full & (1 << lane) == 0 {
                if let Some(pos) = self.lane_retx(lanes, lane, segs) {
                    let sid = self.send.retx[pos];
                    let idx = (sid - self.send.seg_base) as usize;
                    let seg = &self.send.segments[idx];
                    let (channel, len) = (seg.channel, seg.data.len());
                    if !write_segment(w, seg) {
                        retx_full |= 1 << lane;
                        continue;
                    }
                    self.send.retx.remove(pos);
                    let s = &mut self.send.segments[idx];
                    s.queued = false;
                    s.last_pn = pn;
                    push_seg(segs, sid);
                    *ack_eliciting = true;
                    self.counters.segments_retransmitted += 1;
                    if let Some(l) = self.send.lanes.as_deref_mut() {
                        l.charge(lane, channel, len);
                    }
                    top.get_or_insert(priority);
                    continue;
                }
            }
            let Some(c) = lanes.turns(lane).find(|&c| channel_ready(c)) else {
                // Only retransmissions that do not fit: `pick` will not offer this lane again.
                retx_full |= 1 << lane;
                continue;
            };
            let ci = usize::from(c);
            let reliable = self.send.channels[ci].kind.is_reliable();
            let Some(f) = self.send.channels[ci].queue.front() else {
                continue;
            };
            let frame = frame_for(c, f.message_id, f.index, f.count, &f.data);
            if wire::encode_frame(&frame, w).is_err() {
                full[ci / 64] |= 1 << (ci % 64);
                continue;
            }
            let Some(f) = self.send.channels[ci].queue.pop_front() else {
                continue;
            };
            let len = f.data.len();
            self.fragment_sent(ci, f, reliable, pn, segs, rest);
            wrote = true;
            *ack_eliciting = true;
            if let Some(l) = self.send.lanes.as_deref_mut() {
                l.charge(lane, c, len);
            }
            top.get_or_insert(priority);
        }
    }

    /// Whether a full datagram takes longer than [`NARROW_LINK_SERIALIZATION`] to leave at the
    /// send rate: then a packet that carries a higher-priority lane's data is closed before a
    /// lower lane's (one small datagram more for the high lane, which then waits only for its
    /// own bytes at the bottleneck instead of a full datagram's).
    fn narrow_link(&self) -> bool {
        self.send_rate().is_some_and(|rate| {
            self.datagram_size() as f64 > rate * NARROW_LINK_SERIALIZATION.as_secs_f64()
        })
    }

    /// On a narrow link, the bytes a packet needs for what the highest-priority lane holds
    /// (queued and to retransmit) while a lower lane waits too, if that is less than `max`:
    /// the pacer then lets that packet go once its own bytes are paced instead of a full
    /// datagram's (at 1 Mbit/s a 64 B event would otherwise wait up to 9.6 ms behind the
    /// snapshot datagram just sent). The packet carries nothing of the lower lanes (see
    /// `fill_lanes`), and the bytes it takes are charged to the pacer as any others.
    pub(super) fn urgent_size(&self, max: usize) -> Option<usize> {
        let lanes = self.send.lanes.as_deref()?;
        if !self.narrow_link() {
            return None;
        }
        let mut top: Option<(u8, usize)> = None;
        let mut lower = false;
        for lane in 0..lanes.len() {
            let bytes = self.send.lane_queued(lanes, lane) + self.lane_retx_bytes(lanes, lane);
            if bytes == 0 {
                continue;
            }
            let priority = lanes.rank(lane).0;
            top = match top {
                Some((p, b)) if p == priority => Some((p, b + bytes)),
                Some((p, _)) if p < priority => {
                    lower = true;
                    top
                }
                Some(_) => {
                    lower = true;
                    Some((priority, bytes))
                }
                None => Some((priority, bytes)),
            };
        }
        let need = top?.1 + URGENT_OVERHEAD;
        (lower && need < max).then_some(need)
    }

    /// Bytes of `lane`'s segments waiting to be sent again.
    fn lane_retx_bytes(&self, lanes: &LaneSched, lane: usize) -> usize {
        let base = self.send.seg_base;
        self.send
            .retx
            .iter()
            .filter_map(|&sid| self.send.segments.get(sid.checked_sub(base)? as usize))
            .filter(|s| !s.acked && lanes.lane_of(usize::from(s.channel)) == lane)
            .map(|s| s.data.len())
            .sum()
    }

    /// A first transmission of fragment `f` of channel `ci` went into packet `pn`: it leaves
    /// the channel's queue counts, and a reliable one becomes a segment awaiting its ACK; an
    /// unreliable one of several sets `rest` to the fragments of its message still to come and
    /// their count.
    fn fragment_sent(
        &mut self,
        ci: usize,
        f: OutFrag,
        reliable: bool,
        pn: u64,
        segs: &mut Segs,
        rest: &mut Option<(u32, u32)>,
    ) {
        if !reliable && f.count > 1 {
            *rest = Some((f.count - 1 - f.index.min(f.count - 1), f.count));
        }
        let len = f.data.len();
        self.send.dequeued(ci, len);
        if reliable {
            let sid = self.send.seg_base + self.send.segments.len() as u64;
            self.send.segments.push_back(Segment {
                channel: ci as u8,
                message_id: f.message_id,
                index: f.index,
                count: f.count,
                data: f.data,
                last_pn: pn,
                acked: false,
                queued: false,
            });
            self.send.unacked_segments += 1;
            self.counters.segments_sent += 1;
            push_seg(segs, sid);
        }
    }

    /// Position in the retransmission queue of `lane`'s oldest segment not already in this
    /// packet (its redundant copy goes in the next one).
    fn lane_retx(&self, lanes: &LaneSched, lane: usize, segs: &Segs) -> Option<usize> {
        self.send.retx.iter().position(|&sid| {
            let idx = (sid - self.send.seg_base) as usize;
            !segs.contains(&sid)
                && self
                    .send
                    .segments
                    .get(idx)
                    .is_some_and(|s| lanes.lane_of(usize::from(s.channel)) == lane)
        })
    }

    /// Drops the queued messages whose deadline passed by `now`.
    fn drop_expired(&mut self, now: Instant) {
        if !self
            .send
            .lanes
            .as_deref()
            .is_some_and(LaneSched::has_deadlines)
        {
            return;
        }
        let mut dropped = 0u64;
        for ci in 0..self.send.channels.len() {
            loop {
                let front = self.send.channels[ci].queue.front().map(|f| f.message_id);
                let Some(lanes) = self.send.lanes.as_deref_mut() else {
                    return;
                };
                let Some(id) = lanes.pop_expired(ci, now, front) else {
                    break;
                };
                if self.send.drop_message(ci, id) {
                    dropped += 1;
                }
            }
        }
        self.counters.unreliable_unsent += dropped;
        if let Some(l) = self.send.lanes.as_deref_mut() {
            l.drops.deadline += dropped;
        }
    }

    pub(super) fn ack_segment(&mut self, sid: u64) {
        if sid < self.send.seg_base {
            return;
        }
        if let Some(s) = self
            .send
            .segments
            .get_mut((sid - self.send.seg_base) as usize)
        {
            if !s.acked {
                s.acked = true;
                s.data = Bytes::new();
                self.send.unacked_segments -= 1;
            }
        }
        while self.send.segments.front().is_some_and(|s| s.acked) {
            self.send.segments.pop_front();
            self.send.seg_base += 1;
        }
    }
}

pub(super) fn frame_for<'a>(
    channel: u8,
    message_id: u64,
    index: u32,
    count: u32,
    data: &'a [u8],
) -> Frame<'a> {
    if count == 1 {
        Frame::Datagram {
            channel,
            message_id,
            data,
        }
    } else {
        Frame::Fragment {
            channel,
            message_id,
            index: u64::from(index),
            count: u64::from(count),
            data,
        }
    }
}

pub(super) fn write_segment(w: &mut Writer<'_>, s: &Segment) -> bool {
    let f = frame_for(s.channel, s.message_id, s.index, s.count, &s.data);
    wire::encode_frame(&f, w).is_ok()
}

impl Connection {
    /// The pacing gate: true when data must wait (until `pacing_until`). Only with
    /// [`Config::pacing`] or a controller that always paces.
    pub(super) fn paced(&mut self, now: Instant, max: usize) -> bool {
        if !self.cc.paces() {
            return false;
        }
        match self.cc.pacing_delay(now, self.rtt.smoothed, max) {
            Some(d) => {
                self.send.pacing_until = Some(now + d);
                true
            }
            None => {
                self.send.pacing_until = None;
                false
            }
        }
    }

    /// Writes the retransmission queue's segments that fit (first in a packet: a probe may
    /// send them past the congestion window).
    pub(super) fn write_retransmissions(
        &mut self,
        w: &mut Writer<'_>,
        pn: u64,
        segs: &mut Segs,
        ack_eliciting: &mut bool,
    ) {
        let mut deferred = Vec::new();
        while let Some(&sid) = self.send.retx.front() {
            if sid < self.send.seg_base {
                self.send.retx.pop_front();
                continue;
            }
            let idx = (sid - self.send.seg_base) as usize;
            let Some(s) = self.send.segments.get(idx) else {
                self.send.retx.pop_front();
                continue;
            };
            if s.acked {
                self.send.retx.pop_front();
                continue;
            }
            if segs.contains(&sid) {
                // The redundant copy goes in the next packet, not next to the first one.
                self.send.retx.pop_front();
                deferred.push(sid);
                continue;
            }
            if !write_segment(w, s) {
                break;
            }
            self.send.retx.pop_front();
            let s = &mut self.send.segments[idx];
            s.queued = false;
            s.last_pn = pn;
            push_seg(segs, sid);
            *ack_eliciting = true;
            self.counters.segments_retransmitted += 1;
        }
        for sid in deferred.into_iter().rev() {
            self.send.retx.push_front(sid);
        }
    }

    /// Tail-loss probe / RTO with nothing else ack-eliciting in the packet: resend the oldest
    /// unacknowledged fragment (else the caller sends new data, else a ping).
    pub(super) fn write_probe_data(
        &mut self,
        w: &mut Writer<'_>,
        pn: u64,
        segs: &mut Segs,
        ack_eliciting: &mut bool,
    ) {
        // Tail-loss probe / RTO: resend the oldest unacknowledged fragment, else new data,
        // else a ping.
        let oldest = self.send.segments.iter().position(|s| !s.acked);
        if let Some(idx) = oldest {
            if write_segment(w, &self.send.segments[idx]) {
                let sid = self.send.seg_base + idx as u64;
                self.send.segments[idx].last_pn = pn;
                push_seg(segs, sid);
                *ack_eliciting = true;
                self.counters.segments_retransmitted += 1;
            }
        }
    }
}
