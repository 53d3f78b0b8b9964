//! The send room: the application's messages queued per channel, cut into fragments; the
//! reliable segments sent and not yet acknowledged, and the retransmission queue; the peer's
//! receive window and the pacing gate. What goes into a data packet, and in what order, is
//! decided here ([`Connection::fill_new_data`], [`Connection::write_retransmissions`]).
//! A new channel kind starts at [`crate::ChannelKind`] and its sending rules here.

use super::recovery::{push_seg, Segs};
use super::{Connection, ConnectionState};
use crate::wire::{self, Frame, Writer};
use crate::SendError;
use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;

use crate::{ChannelKind, Config};

/// Send-side state: channels, segments, retransmissions.
#[derive(Debug)]
pub(super) struct Sending {
    pub(super) channels: Vec<SendChannel>,
    /// Bytes queued by `send` and not yet sent for the first time.
    pub(super) queued_bytes: usize,
    /// The channel `fill_new_data` starts with (round robin, one step per packet).
    pub(super) rr: usize,
    /// Reliable segments from `seg_base` up, acknowledged ones only popped at the front.
    pub(super) segments: VecDeque<Segment>,
    pub(super) seg_base: u64,
    pub(super) unacked_segments: usize,
    /// Segment ids to send again (declared lost), oldest first.
    pub(super) retx: VecDeque<u64>,
    /// The peer's receive window (segments), from its last ACK.
    pub(super) peer_window: usize,
    /// Data waits for the pacer until then.
    pub(super) pacing_until: Option<Instant>,
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
            rr: 0,
            segments: VecDeque::new(),
            seg_base: 0,
            unacked_segments: 0,
            retx: VecDeque::new(),
            peer_window: cfg.recv_window,
            pacing_until: None,
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

impl Connection {
    /// Queue a message on `channel`. Fragments are cut now (zero-copy slices of `data`; a
    /// message that fits one fragment is queued as it is).
    pub fn send(&mut self, channel: u8, data: Bytes) -> Result<(), SendError> {
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
        let frag = self.cfg.fragment_payload();
        let count = data.len().div_ceil(frag).max(1);
        let id = ch.next_id;
        ch.next_id += 1;
        self.send.queued_bytes += data.len();
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
        if !ch.kind.is_reliable() && ch.queued as usize > self.cfg.unreliable_queue_limit {
            self.shed_unreliable(usize::from(channel), id);
        }
        Ok(())
    }

    /// Drops whole messages from the front of unreliable channel `ci` until its queue is back
    /// under [`Config::unreliable_queue_limit`], never message `keep` (the one just queued).
    /// They are the stalest: an unreliable message that waits behind a closed congestion
    /// window is worth less the longer it waits, and without a bound a peer that stops
    /// acknowledging would make this queue grow to the session's whole send-queue limit.
    pub(super) fn shed_unreliable(&mut self, ci: usize, keep: u64) {
        let ch = &mut self.send.channels[ci];
        while ch.queued as usize > self.cfg.unreliable_queue_limit {
            let Some(id) = ch.queue.front().map(|f| f.message_id) else {
                break;
            };
            if id == keep {
                break;
            }
            while let Some(f) = ch.queue.front() {
                if f.message_id != id {
                    break;
                }
                let len = f.data.len();
                ch.queue.pop_front();
                ch.queued = ch
                    .queued
                    .saturating_sub(u32::try_from(len).unwrap_or(u32::MAX));
                self.send.queued_bytes -= len;
            }
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
        self.send
            .channels
            .iter()
            .any(|c| c.kind.is_reliable() && !c.queue.is_empty())
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
        let reliable_ok = self.reliable_window_open();
        self.send
            .channels
            .iter()
            .any(|c| !c.queue.is_empty() && (!c.kind.is_reliable() || reliable_ok))
    }

    pub(super) fn reliable_window_open(&self) -> bool {
        let window = self.cfg.send_window.min(self.send.peer_window);
        self.send.unacked_segments < window && self.send.segments.len() < 4 * self.cfg.send_window
    }

    /// Writes queued fragments, channels in turn; true when it wrote any.
    pub(super) fn fill_new_data(
        &mut self,
        w: &mut Writer<'_>,
        pn: u64,
        segs: &mut Segs,
        ack_eliciting: &mut bool,
    ) -> bool {
        let n = self.send.channels.len();
        let mut wrote = false;
        loop {
            let mut progress = false;
            for k in 0..n {
                let ci = (self.send.rr + k) % n;
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
                self.send.queued_bytes -= f.data.len();
                let ch = &mut self.send.channels[ci];
                ch.queued = ch
                    .queued
                    .saturating_sub(u32::try_from(f.data.len()).unwrap_or(u32::MAX));
                progress = true;
                wrote = true;
                *ack_eliciting = true;
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
            if !progress {
                return wrote;
            }
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
