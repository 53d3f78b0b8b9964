//! Frames inside a `Data` packet: the [`Frame`] enum, its iterator and encoders, and the
//! ACK frame's ranges (layouts in the module docs).

use super::codec::{Reader, Writer};
use super::*;

/// Frame type bytes.
pub mod frame_type {
    /// Padding.
    pub const PADDING: u8 = 0x00;
    /// Ping.
    pub const PING: u8 = 0x01;
    /// Ack.
    pub const ACK: u8 = 0x02;
    /// Message fragment.
    pub const FRAGMENT: u8 = 0x03;
    /// Whole message.
    pub const DATAGRAM: u8 = 0x04;
    /// Close.
    pub const CLOSE: u8 = 0x05;
    /// Loss report.
    pub const LOSS_REPORT: u8 = 0x06;
}

/// A decoded ACK frame. Ranges were validated at decode time; [`AckFrame::ranges`] re-reads them
/// from the packet without allocating. Equality is semantic (same fields and ranges), so a
/// non-canonical varint encoding equals its canonical re-encoding.
#[derive(Debug, Clone, Copy)]
pub struct AckFrame<'a> {
    /// Largest packet number acknowledged.
    pub largest: u64,
    /// Microseconds between receiving `largest` and sending this ACK.
    pub ack_delay_us: u64,
    /// Receive window the sender of the ACK grants, in segments.
    pub window: u64,
    /// Number of ranges (first range included).
    pub range_count: usize,
    raw: &'a [u8],
}

impl PartialEq for AckFrame<'_> {
    fn eq(&self, o: &Self) -> bool {
        self.largest == o.largest
            && self.ack_delay_us == o.ack_delay_us
            && self.window == o.window
            && self.range_count == o.range_count
            && self.ranges().eq(o.ranges())
    }
}

impl Eq for AckFrame<'_> {}

impl<'a> AckFrame<'a> {
    /// Acknowledged packet-number ranges, highest first, as inclusive `(low, high)`.
    pub fn ranges(&self) -> AckRanges<'a> {
        AckRanges {
            r: Reader::new(self.raw),
            left: self.range_count,
            prev_low: None,
            largest: self.largest,
        }
    }
}

/// Iterator over an [`AckFrame`]'s ranges.
#[derive(Debug, Clone)]
pub struct AckRanges<'a> {
    r: Reader<'a>,
    left: usize,
    prev_low: Option<u64>,
    largest: u64,
}

impl Iterator for AckRanges<'_> {
    type Item = (u64, u64);
    fn next(&mut self) -> Option<(u64, u64)> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // Validated at decode time, so arithmetic cannot underflow here; still use checked
        // arithmetic so a logic error ends the iteration instead of panicking.
        let high = match self.prev_low {
            None => self.largest,
            Some(low) => {
                let gap = self.r.varint().ok()?;
                low.checked_sub(gap)?.checked_sub(2)?
            }
        };
        let len = self.r.varint().ok()?;
        let low = high.checked_sub(len)?;
        self.prev_low = Some(low);
        Some((low, high))
    }
}

/// A decoded frame, borrowing from the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    /// Padding (one byte).
    Padding,
    /// Ping.
    Ping,
    /// Acknowledgement.
    Ack(AckFrame<'a>),
    /// One fragment of a message.
    Fragment {
        /// Channel index.
        channel: u8,
        /// Per-channel message id.
        message_id: u64,
        /// Fragment index (< count).
        index: u64,
        /// Number of fragments of the message (≥ 1).
        count: u64,
        /// The fragment's bytes.
        data: &'a [u8],
    },
    /// A whole message in one frame.
    Datagram {
        /// Channel index.
        channel: u8,
        /// Per-channel message id.
        message_id: u64,
        /// Message bytes.
        data: &'a [u8],
    },
    /// Connection close with a reason.
    Close(CloseReason),
    /// Loss the sender of this frame observed on packets it received.
    LossReport {
        /// Packets received in the report interval.
        received: u64,
        /// Packets lost in the report interval.
        lost: u64,
        /// Longest run of consecutive lost packets in the interval (0: not measured). Lets
        /// the FEC policy size parity for burst loss.
        max_burst: u64,
    },
}

/// Iterate the frames of a `Data` payload. Yields an error (once) and then stops.
pub fn frames(payload: &[u8]) -> Frames<'_> {
    Frames {
        r: Reader::new(payload),
        failed: false,
    }
}

/// Iterator returned by [`frames`].
#[derive(Debug, Clone)]
pub struct Frames<'a> {
    r: Reader<'a>,
    failed: bool,
}

impl<'a> Iterator for Frames<'a> {
    type Item = Result<Frame<'a>, WireError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.r.remaining() == 0 {
            return None;
        }
        let res = decode_frame(&mut self.r);
        if res.is_err() {
            self.failed = true;
        }
        Some(res)
    }
}

pub(super) fn len_bytes<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], WireError> {
    let len = r.varint()?;
    if len > r.remaining() as u64 {
        return Err(WireError::BadLength);
    }
    r.bytes(len as usize)
}

pub(super) fn decode_frame<'a>(r: &mut Reader<'a>) -> Result<Frame<'a>, WireError> {
    let ty = r.u8()?;
    Ok(match ty {
        frame_type::PADDING => Frame::Padding,
        frame_type::PING => Frame::Ping,
        frame_type::ACK => {
            let largest = r.varint()?;
            let ack_delay_us = r.varint()?;
            let window = r.varint()?;
            let extra = r.varint()?;
            if extra >= MAX_ACK_RANGES as u64 {
                return Err(WireError::BadAck);
            }
            let start = r.pos;
            // Validate every range now so the lazy iterator can trust the bytes.
            let first = r.varint()?;
            let mut low = largest.checked_sub(first).ok_or(WireError::BadAck)?;
            for _ in 0..extra {
                let gap = r.varint()?;
                let len = r.varint()?;
                let high = low
                    .checked_sub(gap)
                    .and_then(|v| v.checked_sub(2))
                    .ok_or(WireError::BadAck)?;
                low = high.checked_sub(len).ok_or(WireError::BadAck)?;
            }
            Frame::Ack(AckFrame {
                largest,
                ack_delay_us,
                window,
                range_count: extra as usize + 1,
                raw: &r.buf[start..r.pos],
            })
        }
        frame_type::FRAGMENT => {
            let channel = r.u8()?;
            let message_id = r.varint()?;
            let index = r.varint()?;
            let count = r.varint()?;
            if count == 0 || index >= count {
                return Err(WireError::BadFragment { index, count });
            }
            Frame::Fragment {
                channel,
                message_id,
                index,
                count,
                data: len_bytes(r)?,
            }
        }
        frame_type::DATAGRAM => Frame::Datagram {
            channel: r.u8()?,
            message_id: r.varint()?,
            data: len_bytes(r)?,
        },
        frame_type::CLOSE => Frame::Close(CloseReason::from_u8(r.u8()?)),
        frame_type::LOSS_REPORT => Frame::LossReport {
            received: r.varint()?,
            lost: r.varint()?,
            max_burst: r.varint()?,
        },
        other => return Err(WireError::UnknownFrameType(other)),
    })
}

/// Bytes an encoded fragment frame header takes (excluding its data).
pub fn fragment_overhead(message_id: u64, index: u64, count: u64, len: usize) -> usize {
    1 + 1 + varint_len(message_id) + varint_len(index) + varint_len(count) + varint_len(len as u64)
}

/// Bytes an encoded datagram frame header takes (excluding its data).
pub fn datagram_overhead(message_id: u64, len: usize) -> usize {
    1 + 1 + varint_len(message_id) + varint_len(len as u64)
}

/// Encode one frame (ACK frames are usually written with [`encode_ack`]). All or nothing: on error
/// nothing is left in `w`, so a caller can try a frame and move on when it does not fit.
pub fn encode_frame(f: &Frame<'_>, w: &mut Writer<'_>) -> Result<(), WireError> {
    let start = w.pos;
    let res = encode_frame_inner(f, w);
    if res.is_err() {
        w.pos = start;
    }
    res
}

pub(super) fn encode_frame_inner(f: &Frame<'_>, w: &mut Writer<'_>) -> Result<(), WireError> {
    match *f {
        Frame::Padding => w.u8(frame_type::PADDING),
        Frame::Ping => w.u8(frame_type::PING),
        Frame::Ack(a) => {
            let ranges: [(u64, u64); MAX_ACK_RANGES] = {
                let mut arr = [(0, 0); MAX_ACK_RANGES];
                for (i, r) in a.ranges().take(MAX_ACK_RANGES).enumerate() {
                    arr[i] = r;
                }
                arr
            };
            encode_ack(
                a.ack_delay_us,
                a.window,
                &ranges[..a.range_count.min(MAX_ACK_RANGES)],
                w,
            )
        }
        Frame::Fragment {
            channel,
            message_id,
            index,
            count,
            data,
        } => {
            if count == 0 || index >= count {
                return Err(WireError::BadFragment { index, count });
            }
            w.u8(frame_type::FRAGMENT)?;
            w.u8(channel)?;
            w.varint(message_id)?;
            w.varint(index)?;
            w.varint(count)?;
            w.varint(data.len() as u64)?;
            w.bytes(data)
        }
        Frame::Datagram {
            channel,
            message_id,
            data,
        } => {
            w.u8(frame_type::DATAGRAM)?;
            w.u8(channel)?;
            w.varint(message_id)?;
            w.varint(data.len() as u64)?;
            w.bytes(data)
        }
        Frame::Close(reason) => {
            w.u8(frame_type::CLOSE)?;
            w.u8(reason.to_u8())
        }
        Frame::LossReport {
            received,
            lost,
            max_burst,
        } => {
            w.u8(frame_type::LOSS_REPORT)?;
            w.varint(received)?;
            w.varint(lost)?;
            w.varint(max_burst)
        }
    }
}

/// Encode an ACK frame from inclusive ranges sorted highest first and disjoint with gaps ≥ 1
/// (at most [`MAX_ACK_RANGES`]; extra ranges are left out). All or nothing like [`encode_frame`];
/// [`ack_len`] gives the size.
pub fn encode_ack(
    ack_delay_us: u64,
    window: u64,
    ranges: &[(u64, u64)],
    w: &mut Writer<'_>,
) -> Result<(), WireError> {
    let start = w.pos;
    let res = encode_ack_inner(ack_delay_us, window, ranges, w);
    if res.is_err() {
        w.pos = start;
    }
    res
}

pub(super) fn encode_ack_inner(
    ack_delay_us: u64,
    window: u64,
    ranges: &[(u64, u64)],
    w: &mut Writer<'_>,
) -> Result<(), WireError> {
    let ranges = &ranges[..ranges.len().min(MAX_ACK_RANGES)];
    let Some(&(first_low, largest)) = ranges.first() else {
        return Err(WireError::BadAck);
    };
    w.u8(frame_type::ACK)?;
    w.varint(largest)?;
    w.varint(ack_delay_us.min(MAX_VARINT))?;
    w.varint(window.min(MAX_VARINT))?;
    w.varint(ranges.len() as u64 - 1)?;
    w.varint(largest.checked_sub(first_low).ok_or(WireError::BadAck)?)?;
    let mut prev_low = first_low;
    for &(low, high) in &ranges[1..] {
        let gap = prev_low
            .checked_sub(high)
            .and_then(|v| v.checked_sub(2))
            .ok_or(WireError::BadAck)?;
        w.varint(gap)?;
        w.varint(high.checked_sub(low).ok_or(WireError::BadAck)?)?;
        prev_low = low;
    }
    Ok(())
}

/// Encoded size of an ACK frame for these ranges (same contract as [`encode_ack`]).
pub fn ack_len(ack_delay_us: u64, window: u64, ranges: &[(u64, u64)]) -> usize {
    let ranges = &ranges[..ranges.len().min(MAX_ACK_RANGES)];
    let Some(&(first_low, largest)) = ranges.first() else {
        return 0;
    };
    let mut n = 1
        + varint_len(largest)
        + varint_len(ack_delay_us.min(MAX_VARINT))
        + varint_len(window.min(MAX_VARINT))
        + varint_len(ranges.len() as u64 - 1)
        + varint_len(largest.saturating_sub(first_low));
    let mut prev_low = first_low;
    for &(low, high) in &ranges[1..] {
        n += varint_len(prev_low.saturating_sub(high).saturating_sub(2));
        n += varint_len(high.saturating_sub(low));
        prev_low = low;
    }
    n
}
