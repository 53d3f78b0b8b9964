//! The two passes over a received packet's frames: the first checks them all and changes
//! nothing (a packet dropped then is not acknowledged, so the peer retransmits its data); the
//! second, once the packet is accepted, applies them.

use std::time::Instant;

use bytes::BytesMut;

use super::recv::Need;
use super::state::{Connection, ConnectionState};
use crate::wire::{self, Frame};
use crate::DropCause;

/// What the first pass over a received packet's frames found.
pub(super) struct Seen {
    pub(super) ack_eliciting: bool,
    /// Reliable data or a ping: its ACK is never held for [`crate::Config::unreliable_ack_delay`].
    pub(super) reliable: bool,
    pub(super) carries_data: bool,
    /// Frames in the packet (all in [`Decoded`] when it has room for them).
    pub(super) frames: usize,
}

/// The first pass's frames, kept for the second when they fit (most packets: an ACK and a
/// message or two), which then does not decode them again. Never spills to the heap.
pub(super) type Decoded<'p> = smallvec::SmallVec<[Frame<'p>; 4]>;

impl Connection {
    /// First pass over a packet's frames: all valid, within the peer's window and our
    /// buffers? Changes nothing; keeps the frames in `decoded` while it has room.
    pub(super) fn check_frames<'p>(
        &self,
        payload: &'p [u8],
        decoded: &mut Decoded<'p>,
    ) -> Result<Seen, DropCause> {
        let mut ack_eliciting = false;
        let mut reliable = false;
        let mut carries_data = false;
        let mut need = Need {
            segments: 0,
            bytes: 0,
        };
        let mut frames = 0;
        for f in wire::frames(payload) {
            let f = f.map_err(|_| DropCause::Malformed)?;
            frames += 1;
            if decoded.len() < decoded.inline_size() {
                decoded.push(f);
            }
            match f {
                Frame::Ack(a) => {
                    if a.largest >= self.recovery.next_pn {
                        return Err(DropCause::ProtocolViolation);
                    }
                }
                Frame::Fragment {
                    channel,
                    message_id,
                    index,
                    count,
                    data,
                } => {
                    ack_eliciting = true;
                    carries_data = true;
                    reliable |= self.channel_is_reliable(channel);
                    self.receiver.validate(channel, count, data.len())?;
                    let n = self
                        .receiver
                        .need(channel, message_id, index, count, data.len());
                    need.segments += n.segments;
                    need.bytes += n.bytes;
                }
                Frame::Datagram {
                    channel,
                    message_id,
                    data,
                } => {
                    ack_eliciting = true;
                    carries_data = true;
                    reliable |= self.channel_is_reliable(channel);
                    self.receiver.validate(channel, 1, data.len())?;
                    let n = self.receiver.need(channel, message_id, 0, 1, data.len());
                    need.segments += n.segments;
                    need.bytes += n.bytes;
                }
                Frame::Ping => {
                    ack_eliciting = true;
                    reliable = true;
                }
                Frame::Padding | Frame::Close(_) | Frame::LossReport { .. } => {}
            }
        }
        if (need.segments > 0 && self.receiver.segments + need.segments > self.cfg.recv_window)
            || (need.bytes > 0 && !self.receiver.fits(&need, 0))
        {
            return Err(DropCause::FlowControl);
        }
        Ok(Seen {
            ack_eliciting,
            reliable,
            carries_data,
            frames,
        })
    }

    /// Second pass: apply an accepted packet's frames (all of them, as the first pass
    /// decoded them); true when an ACK in it acknowledged something new.
    pub(super) fn apply_frames<'p>(
        &mut self,
        now: Instant,
        frames: impl Iterator<Item = Frame<'p>>,
        mut arena: Option<&mut BytesMut>,
    ) -> bool {
        let mut acked_something = false;
        let mut delivered = 0;
        for f in frames {
            match f {
                Frame::Ack(a) => {
                    acked_something |= self.on_ack(now, &a);
                }
                Frame::Fragment {
                    channel,
                    message_id,
                    index,
                    count,
                    data,
                } => {
                    if self.state == ConnectionState::Established
                        || self.state == ConnectionState::Closing
                    {
                        if let Err(c) = self.receiver.on_fragment_in(
                            now,
                            channel,
                            message_id,
                            index,
                            count,
                            data,
                            &mut self.events,
                            &mut delivered,
                            arena.as_deref_mut(),
                        ) {
                            self.counters.drops.add(c);
                        }
                    }
                }
                Frame::Datagram {
                    channel,
                    message_id,
                    data,
                } => {
                    if self.state == ConnectionState::Established
                        || self.state == ConnectionState::Closing
                    {
                        if let Err(c) = self.receiver.on_fragment_in(
                            now,
                            channel,
                            message_id,
                            0,
                            1,
                            data,
                            &mut self.events,
                            &mut delivered,
                            arena.as_deref_mut(),
                        ) {
                            self.counters.drops.add(c);
                        }
                    }
                }
                Frame::Close(reason) => self.on_close_frame(reason),
                Frame::LossReport {
                    received,
                    lost,
                    max_burst,
                } => {
                    self.counters.peer_loss_report = (received, lost);
                    self.fec.on_loss_report(received, lost, max_burst);
                }
                Frame::Ping | Frame::Padding => {}
            }
        }
        self.counters.messages_delivered += delivered;
        acked_something
    }
}
