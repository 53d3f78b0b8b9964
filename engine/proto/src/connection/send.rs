//! The send room: the application's messages queued per channel, cut into fragments; the
//! reliable segments sent and not yet acknowledged, and the retransmission queue; the peer's
//! receive window and the pacing gate. What goes into a data packet, and in what order, is
//! decided here ([`Connection::fill_new_data`], [`Connection::write_retransmissions`]).
//! A new channel kind starts at [`crate::ChannelKind`] and its sending rules here.

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
