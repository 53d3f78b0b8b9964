//! The close room: a graceful close (linger while reliable data drains, then close frames and
//! the drain period), the peer's close, the idle timeout, and the end of the connection.
//!
//! This room's state (`Closing`) is defined in `state.rs`, beside the `Connection` that holds it.

use super::state::{Connection, ConnectionState};
use crate::wire::{self, Frame, Writer};
use crate::{Event, Transmit};
use std::time::Instant;

use crate::CloseReason;

/// Close frames sent when closing locally.
pub(super) const CLOSE_SENDS: u32 = 3;

impl Connection {
    /// Close gracefully: queued reliable data is delivered first (up to [`crate::Config::close_linger`]),
    /// then the peer is told `reason`. [`Event::Closed`] follows.
    pub fn close(&mut self, now: Instant, reason: CloseReason) {
        match self.state {
            ConnectionState::Handshaking => {
                self.finish(reason, false);
            }
            ConnectionState::Established => {
                self.state = ConnectionState::Closing;
                self.close.reason = Some((reason, false));
                self.close.linger_deadline = Some(now + self.cfg.close_linger);
                self.maybe_start_draining(now);
            }
            _ => {}
        }
    }

    /// End at once, silently (no close frames, no event): the endpoint refused the client.
    pub(crate) fn discard(&mut self) {
        self.state = ConnectionState::Closed;
        self.close.sends_left = 0;
        self.events.clear();
    }

    /// True once closed and nothing is left to send: the owner may drop it.
    pub fn is_drained(&self) -> bool {
        self.state == ConnectionState::Closed && self.close.sends_left == 0
    }

    /// Ends the session for the idle timeout, telling the peer once.
    pub(super) fn time_out_idle(&mut self) {
        self.finish(CloseReason::IdleTimeout, false);
        self.close.reason = Some((CloseReason::IdleTimeout, false));
        self.close.sends_left = 1;
    }

    pub(super) fn maybe_start_draining(&mut self, now: Instant) {
        if self.state != ConnectionState::Closing {
            return;
        }
        let flushed = self.send.unacked_segments == 0
            && self
                .send
                .channels
                .iter()
                .all(|c| !c.kind.is_reliable() || c.queue.is_empty());
        if flushed || self.close.linger_deadline.is_some_and(|d| now >= d) {
            self.state = ConnectionState::Draining;
            self.close.sends_left = CLOSE_SENDS;
            self.close.next_send = Some(now);
            self.close.drain_deadline = Some(now + self.pto_base() * 3);
        }
    }

    pub(super) fn finish(&mut self, reason: CloseReason, by_peer: bool) {
        if self.state == ConnectionState::Closed {
            return;
        }
        self.state = ConnectionState::Closed;
        self.events.push_back(Event::Closed {
            reason,
            by_peer,
            message: std::mem::take(&mut self.hs.refusal_message),
        });
        // Free send-side memory at once; a closed connection never sends data again.
        for c in &mut self.send.channels {
            c.queue.clear();
            c.queued = 0;
        }
        self.send.segments.clear();
        self.send.retx.clear();
        self.send.queued_bytes = 0;
        self.send.queued_kinds = 0;
    }

    pub(super) fn on_close_frame(&mut self, reason: CloseReason) {
        match self.state {
            ConnectionState::Established | ConnectionState::Closing => {
                self.finish(reason, true);
                // Answer once so the closer learns we heard it.
                self.close.reason = Some((reason, true));
                self.close.sends_left = 1;
                self.close.next_send = None;
            }
            ConnectionState::Draining => {
                // The peer's answer to our close.
                let (r, _) = self.close.reason.unwrap_or((reason, false));
                self.close.sends_left = 0;
                self.finish(r, false);
            }
            _ => {}
        }
    }

    pub(super) fn transmit_close(
        &mut self,
        buf: &mut [u8],
        reason: CloseReason,
    ) -> Option<Transmit> {
        let pn = self.recovery.next_pn;
        let hdr = wire::encode_data_header(self.path.remote_cid, pn, buf).ok()?;
        // The ARQ budget, as for data packets: room for the FEC wrapping and the tag.
        let max = self.fec.arq_budget(buf.len());
        let mut w = Writer::new(buf.get_mut(hdr..max)?);
        wire::encode_frame(&Frame::Close(reason), &mut w).ok()?;
        let len = hdr + w.len();
        self.recovery.next_pn += 1;
        let size = self.seal_outgoing(self.activity.last_sent, buf, pn, len, None)?;
        Some(Transmit {
            destination: self.path.remote,
            size,
        })
    }
}

impl Connection {
    /// Closed or draining: the close frames still due.
    pub(super) fn transmit_closing(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        match self.state {
            ConnectionState::Closed => {
                if self.close.sends_left == 0 {
                    return None;
                }
                self.close.sends_left -= 1;
                let (reason, _) = self
                    .close
                    .reason
                    .unwrap_or((CloseReason::Application, false));
                self.transmit_close(buf, reason)
            }
            ConnectionState::Draining => {
                if self.close.sends_left == 0 || self.close.next_send.is_some_and(|t| now < t) {
                    return None;
                }
                self.close.sends_left -= 1;
                self.close.next_send = Some(now + self.pto_base());
                let (reason, _) = self
                    .close
                    .reason
                    .unwrap_or((CloseReason::Application, false));
                self.transmit_close(buf, reason)
            }
            _ => None,
        }
    }
}
