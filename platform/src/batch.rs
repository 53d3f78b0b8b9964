//! Batch types: many datagrams per system call.
//!
//! A [`SendBatch`] is filled by the caller (the runtime) and drained by a backend; a [`RecvBatch`]
//! is a borrowed view of what one backend poll received, valid until the next poll. Both keep
//! their storage between turns, so the steady state allocates nothing per datagram.

use std::marker::PhantomData;
use std::net::SocketAddr;

use crate::error::Error;

/// Largest UDP payload over IPv4: 65,535 − 20 (IPv4 header) − 8 (UDP header).
pub const MAX_UDP_PAYLOAD_V4: usize = 65_507;
/// Largest UDP payload over IPv6 (no jumbograms): 65,535 − 8 (UDP header).
pub const MAX_UDP_PAYLOAD_V6: usize = 65_527;

/// The largest UDP payload a datagram to `dst` may carry.
///
/// An IPv4-mapped IPv6 destination travels as IPv4, so it gets the IPv4 limit.
pub fn max_payload_for(dst: &SocketAddr) -> usize {
    match dst {
        SocketAddr::V4(_) => MAX_UDP_PAYLOAD_V4,
        SocketAddr::V6(v6) if v6.ip().to_ipv4_mapped().is_some() => MAX_UDP_PAYLOAD_V4,
        SocketAddr::V6(_) => MAX_UDP_PAYLOAD_V6,
    }
}

/// One queued send: `len` bytes at `offset` in the batch buffer, to `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendEntry {
    /// Destination address.
    pub dst: SocketAddr,
    /// Offset of the payload in the batch's byte buffer.
    pub offset: usize,
    /// Payload length in bytes (for GSO: all segments together).
    pub len: usize,
    /// `Some(s)`: the payload is several datagrams of `s` bytes each (the last may be shorter),
    /// to be sent with UDP GSO where the backend supports it, else one by one.
    pub segment_size: Option<u16>,
}

impl SendEntry {
    /// Number of datagrams this entry puts on the wire.
    pub fn datagrams(&self) -> usize {
        match self.segment_size {
            Some(s) if s > 0 => self.len.div_ceil(s as usize).max(1),
            _ => 1,
        }
    }
}

/// Datagrams waiting to be sent, in order. Backends send from the front and [`consume`]
/// what the kernel took, so a partial send resumes where it stopped.
///
/// [`consume`]: SendBatch::consume
#[derive(Debug)]
pub struct SendBatch {
    /// Payload storage. Only `buf[..used]` holds queued payloads; the rest is initialised room
    /// kept from earlier turns, so writing a datagram in place needs no zeroing.
    buf: Vec<u8>,
    /// Bytes of `buf` the queued entries occupy (the next payload starts here).
    used: usize,
    entries: Vec<SendEntry>,
    head: usize,
    max_entries: usize,
    /// Merge consecutive same-destination, same-size datagrams into GSO entries on push.
    coalesce: bool,
}

/// Largest datagram [`SendBatch`] coalesces into a GSO run, by destination family: what fits a
/// 1,500-byte Ethernet MTU (1,500 − 20 − 8 for IPv4, 1,500 − 40 − 8 for IPv6). The kernel refuses
/// a GSO send whose segments exceed the route's MTU (where single datagrams would be
/// fragmented instead), so larger datagrams always go out alone.
pub fn max_coalesced_segment(dst: &SocketAddr) -> usize {
    match max_payload_for(dst) {
        MAX_UDP_PAYLOAD_V4 => 1_472,
        _ => 1_452,
    }
}

/// Most segments one GSO send may carry (Linux `UDP_MAX_SEGMENTS` is 64 on older kernels).
pub const MAX_GSO_SEGMENTS: usize = 64;

impl SendBatch {
    /// A batch that holds up to `max_entries` sends; its byte buffer grows as needed and is kept.
    pub fn new(max_entries: usize) -> Self {
        let max_entries = max_entries.max(1);
        SendBatch {
            buf: Vec::with_capacity(max_entries * 1500),
            used: 0,
            entries: Vec::with_capacity(max_entries),
            head: 0,
            max_entries,
            coalesce: false,
        }
    }

    /// Turn automatic GSO coalescing on or off (off by default).
    ///
    /// When on, a datagram pushed with [`push`](Self::push) or [`push_with`](Self::push_with)
    /// right after one to the same destination joins it as one GSO entry when it is no larger
    /// than the run's segment size (a shorter one ends the run), up to [`MAX_GSO_SEGMENTS`]
    /// segments, the destination's payload limit, and segments of at most
    /// [`max_coalesced_segment`] bytes. Backends send such an entry with one `UDP_SEGMENT`
    /// send where the kernel supports GSO, else segment by segment, so turning this on never
    /// changes what the peer receives; turn it on where [`crate::probe`] reports GSO.
    pub fn set_coalescing(&mut self, on: bool) {
        self.coalesce = on;
    }

    /// Whether automatic GSO coalescing is on.
    pub fn coalescing(&self) -> bool {
        self.coalesce
    }

    /// Datagrams not yet sent (a GSO entry counts its segments).
    pub fn datagrams(&self) -> usize {
        self.pending().iter().map(SendEntry::datagrams).sum()
    }

    /// The segment size of the run a `len`-byte datagram to `dst`, stored from buffer offset
    /// `at`, may join: the last pending entry, when coalescing is on, the entry ends at `at`,
    /// and the rules of [`set_coalescing`](Self::set_coalescing) allow it.
    fn joinable_run(&self, dst: &SocketAddr, at: usize, len: usize) -> Option<usize> {
        if !self.coalesce || len == 0 || self.head == self.entries.len() {
            return None;
        }
        let last = self.entries.last()?;
        // The run must end at the end of the buffer for the new bytes to extend it.
        if last.dst != *dst || last.offset + last.len != at || last.len == 0 {
            return None;
        }
        let seg = match last.segment_size {
            Some(s) if s > 0 => s as usize,
            _ => last.len,
        };
        let full_run = last.len % seg == 0;
        let fits = len <= seg
            && seg <= max_coalesced_segment(dst)
            && last.datagrams() < MAX_GSO_SEGMENTS
            && last.len + len <= max_payload_for(dst);
        (full_run && fits).then_some(seg)
    }

    /// Grow the last entry by the `len` bytes just appended to the buffer, as a GSO run of
    /// `seg`-byte segments.
    fn extend_run(&mut self, seg: usize, len: usize) {
        if let Some(last) = self.entries.last_mut() {
            last.len += len;
            // `seg` <= max_coalesced_segment, so it fits a u16.
            last.segment_size = u16::try_from(seg).ok();
        }
    }

    /// Most entries this batch holds.
    pub fn capacity(&self) -> usize {
        self.max_entries
    }

    /// Entries not yet sent.
    pub fn len(&self) -> usize {
        self.entries.len() - self.head
    }

    /// True when nothing is waiting to be sent.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when no further entry fits.
    pub fn is_full(&self) -> bool {
        self.entries.len() - self.head >= self.max_entries
    }

    fn check_room(&mut self) -> Result<(), Error> {
        if self.head > 0 && self.head == self.entries.len() {
            self.clear();
        } else {
            self.compact();
        }
        if self.entries.len() - self.head >= self.max_entries {
            return Err(Error::BatchFull {
                capacity: self.max_entries,
            });
        }
        Ok(())
    }

    /// Moves the pending bytes to the front of the storage once the sent bytes before them are
    /// at least half of what is used. The storage is otherwise reused only when the batch
    /// empties, and a batch that a busy socket keeps from emptying would grow with every byte
    /// queued. Each byte moves at most once per doubling, so appending stays amortised O(1).
    fn compact(&mut self) {
        let Some(base) = self.entries.get(self.head).map(|e| e.offset) else {
            return;
        };
        if base == 0 || base < self.used / 2 {
            return;
        }
        self.buf.copy_within(base..self.used, 0);
        self.used -= base;
        self.entries.drain(..self.head);
        self.head = 0;
        // Pending entries lie in order from `base` (a skipped prefix only moves an offset up).
        for e in &mut self.entries {
            e.offset -= base;
        }
    }

    /// Queue one datagram to `dst`.
    ///
    /// Fails with [`Error::PayloadTooLarge`] (naming the limit) when `payload` exceeds the
    /// protocol maximum for `dst`'s address family, and with [`Error::BatchFull`] when the batch
    /// holds `capacity()` entries; nothing is queued then, and the batch stays usable.
    pub fn push(&mut self, dst: SocketAddr, payload: &[u8]) -> Result<(), Error> {
        let limit = max_payload_for(&dst);
        if payload.len() > limit {
            return Err(Error::PayloadTooLarge {
                len: payload.len(),
                limit,
            });
        }
        if let Some(seg) = self.joinable_run(&dst, self.used, payload.len()) {
            self.append(payload);
            self.extend_run(seg, payload.len());
            return Ok(());
        }
        self.check_room()?;
        let offset = self.append(payload);
        self.entries.push(SendEntry {
            dst,
            offset,
            len: payload.len(),
            segment_size: None,
        });
        Ok(())
    }

    /// Queue one datagram to `dst`, written in place by `write`, which gets a zeroed buffer of
    /// `max_len` bytes and returns how many it used (clamped to `max_len`).
    pub fn push_with(
        &mut self,
        dst: SocketAddr,
        max_len: usize,
        write: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<usize, Error> {
        let limit = max_payload_for(&dst);
        if max_len > limit {
            return Err(Error::PayloadTooLarge {
                len: max_len,
                limit,
            });
        }
        self.check_room()?;
        let offset = self.used;
        let room = self.room(max_len);
        room.fill(0);
        let used = write(room).min(max_len);
        self.used = offset + used;
        // The bytes already sit right after the last entry: joining its run costs nothing.
        if let Some(seg) = self.joinable_run(&dst, offset, used) {
            self.extend_run(seg, used);
            return Ok(used);
        }
        self.entries.push(SendEntry {
            dst,
            offset,
            len: used,
            segment_size: None,
        });
        Ok(used)
    }

    /// Queue one datagram written in place, whose destination is known only once it is written
    /// (a protocol that picks the connection to serve as it writes): `write` gets `max_len`
    /// bytes of room and returns the destination and the bytes it used (clamped to `max_len`),
    /// or `None` to queue nothing. Returns the bytes queued, `None` when `write` declined.
    ///
    /// The room is not zeroed (it may hold bytes of earlier datagrams): `write` must fill what
    /// it reports as used. Saves the copy from a scratch buffer that [`push`](Self::push) needs.
    ///
    /// Fails with [`Error::BatchFull`] when no entry is free — then `write` is not called — and
    /// with [`Error::PayloadTooLarge`] when the written datagram exceeds the limit of its
    /// destination's family; nothing is queued then, and the batch stays usable. Joins the last
    /// GSO run like [`push`](Self::push) when coalescing is on.
    pub fn push_in_place(
        &mut self,
        max_len: usize,
        write: impl FnOnce(&mut [u8]) -> Option<(SocketAddr, usize)>,
    ) -> Result<Option<usize>, Error> {
        self.check_room()?;
        let offset = self.used;
        let Some((dst, len)) = write(self.room(max_len)) else {
            return Ok(None);
        };
        let len = len.min(max_len);
        let limit = max_payload_for(&dst);
        if len > limit {
            return Err(Error::PayloadTooLarge { len, limit });
        }
        self.used = offset + len;
        if let Some(seg) = self.joinable_run(&dst, offset, len) {
            self.extend_run(seg, len);
        } else {
            self.entries.push(SendEntry {
                dst,
                offset,
                len,
                segment_size: None,
            });
        }
        Ok(Some(len))
    }

    /// The `len` bytes of storage from `used` on, grown (zero-filled) once where too short.
    fn room(&mut self, len: usize) -> &mut [u8] {
        let end = self.used + len;
        if self.buf.len() < end {
            self.buf.resize(end, 0);
        }
        &mut self.buf[self.used..end]
    }

    /// Copy `payload` to the end of the queued bytes; returns its offset.
    fn append(&mut self, payload: &[u8]) -> usize {
        let offset = self.used;
        self.room(payload.len()).copy_from_slice(payload);
        self.used += payload.len();
        offset
    }

    /// Queue several datagrams of `segment_size` bytes each (the last may be shorter), all to
    /// `dst`, as one GSO send where the backend supports it.
    pub fn push_segments(
        &mut self,
        dst: SocketAddr,
        segment_size: u16,
        payload: &[u8],
    ) -> Result<(), Error> {
        let limit = max_payload_for(&dst);
        if segment_size == 0 || segment_size as usize > limit {
            return Err(Error::PayloadTooLarge {
                len: segment_size as usize,
                limit,
            });
        }
        let segments = payload.len().div_ceil(segment_size as usize);
        if segments > MAX_GSO_SEGMENTS || payload.len() > limit {
            return Err(Error::TooManySegments {
                segments,
                bytes: payload.len(),
                max_segments: MAX_GSO_SEGMENTS,
                max_bytes: limit,
            });
        }
        self.check_room()?;
        let offset = self.append(payload);
        self.entries.push(SendEntry {
            dst,
            offset,
            len: payload.len(),
            segment_size: if segments > 1 {
                Some(segment_size)
            } else {
                None
            },
        });
        Ok(())
    }

    /// The entries not yet sent, oldest first.
    pub fn pending(&self) -> &[SendEntry] {
        &self.entries[self.head..]
    }

    /// The payload bytes of `entry` (an entry of this batch).
    pub fn payload(&self, entry: &SendEntry) -> &[u8] {
        &self.buf[entry.offset..entry.offset + entry.len]
    }

    /// Mark the first `n` pending entries as sent (or given up on).
    pub fn consume(&mut self, n: usize) {
        self.head = (self.head + n).min(self.entries.len());
        if self.head == self.entries.len() {
            self.clear();
        }
    }

    /// Mark the first `n` datagrams of the oldest pending entry as sent: for a GSO entry that a
    /// backend had to send segment by segment and that the kernel took only partly. The entry
    /// keeps its remaining segments; once none remain it is consumed.
    pub fn consume_segments(&mut self, n: usize) {
        if self.skip_segments(0, n) {
            self.consume(1);
        }
    }

    /// Drop the first `n` datagrams of the pending entry at `index` (0 = oldest), which a
    /// backend sent segment by segment. Returns true when nothing of the entry is left (the
    /// caller then removes it with [`consume`](Self::consume) or
    /// [`remove_pending`](Self::remove_pending)).
    pub fn skip_segments(&mut self, index: usize, n: usize) -> bool {
        let Some(e) = self.entries.get_mut(self.head + index) else {
            return false;
        };
        if n == 0 {
            return e.len == 0;
        }
        let step = match e.segment_size {
            Some(s) if s > 0 => s as usize,
            _ => e.len.max(1),
        };
        let taken = n.saturating_mul(step).min(e.len);
        e.offset += taken;
        e.len -= taken;
        e.len == 0 || e.segment_size.is_none()
    }

    /// Remove the pending entries for which `sent(index)` is true (index 0 = oldest pending),
    /// keeping the others in order: for backends whose sends complete out of order. Returns
    /// how many were removed. Allocation-free.
    pub fn remove_pending(&mut self, mut sent: impl FnMut(usize) -> bool) -> usize {
        if self.head > 0 {
            self.entries.drain(..self.head);
            self.head = 0;
        }
        let before = self.entries.len();
        let mut i = 0;
        self.entries.retain(|_| {
            let keep = !sent(i);
            i += 1;
            keep
        });
        let removed = before - self.entries.len();
        if self.entries.is_empty() {
            self.clear();
        }
        removed
    }

    /// Drop everything queued, keeping the storage.
    pub fn clear(&mut self) {
        self.used = 0;
        self.entries.clear();
        self.head = 0;
    }
}

/// Where one received datagram lies in a backend's receive memory, and what came with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvMeta {
    /// Source address.
    pub src: SocketAddr,
    /// Offset of the payload in the backend's receive region.
    pub offset: usize,
    /// Bytes of payload present (for a truncated datagram: what fit).
    pub len: usize,
    /// The datagram was larger than the receive buffer and was cut: `len` bytes are present.
    pub truncated: bool,
    /// `Some(s)`: GRO coalesced several datagrams of `s` bytes (the last may be shorter).
    pub segment_size: Option<u16>,
}

/// One received datagram (or a GRO-coalesced run of datagrams from one source).
#[derive(Debug, Clone, Copy)]
pub struct RecvDatagram<'a> {
    /// Source address.
    pub src: SocketAddr,
    /// The payload (for a coalesced run: every segment, back to back).
    pub data: &'a [u8],
    /// The datagram did not fit the receive buffer; `data` holds only its beginning.
    pub truncated: bool,
    /// `Some(s)`: GRO coalesced several datagrams of `s` bytes; see [`RecvDatagram::segments`].
    pub segment_size: Option<u16>,
}

impl<'a> RecvDatagram<'a> {
    /// The individual datagrams: one, or each GRO segment.
    pub fn segments(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let data = self.data;
        let step = match self.segment_size {
            Some(s) if s > 0 && (s as usize) < data.len() => s as usize,
            _ => data.len().max(1),
        };
        let count = if data.is_empty() {
            1
        } else {
            data.len().div_ceil(step)
        };
        (0..count).map(move |i| {
            let start = (i * step).min(data.len());
            let end = (start + step).min(data.len());
            &data[start..end]
        })
    }
}

/// What one poll received: a borrowed view, valid until the next poll.
///
/// It references only the bytes of the datagrams it lists: a backend whose receive memory the
/// kernel may still write elsewhere (io_uring's buffer ring) never hands out a slice covering
/// those other parts.
#[derive(Debug, Clone, Copy)]
pub struct RecvBatch<'a> {
    metas: &'a [RecvMeta],
    base: *const u8,
    region_len: usize,
    _region: PhantomData<&'a [u8]>,
}

impl<'a> RecvBatch<'a> {
    /// A batch over `metas`, whose offsets point into `region`. Backends build these.
    ///
    /// Entries whose range falls outside `region` are skipped rather than panicking, but a
    /// backend must never produce them.
    pub fn new(metas: &'a [RecvMeta], region: &'a [u8]) -> Self {
        RecvBatch {
            metas,
            base: region.as_ptr(),
            region_len: region.len(),
            _region: PhantomData,
        }
    }

    /// A batch over `metas`, whose offsets point into the `region_len` bytes at `base`.
    ///
    /// # Safety
    /// For `'a`, every byte range `offset..offset + len` of `metas` that lies inside
    /// `0..region_len` must be readable at `base` and not written by anyone (the kernel
    /// included). Bytes of the region outside those ranges may be written concurrently: they
    /// are never referenced.
    pub unsafe fn from_raw_parts(
        metas: &'a [RecvMeta],
        base: *const u8,
        region_len: usize,
    ) -> Self {
        RecvBatch {
            metas,
            base,
            region_len,
            _region: PhantomData,
        }
    }

    /// An empty batch.
    pub fn empty() -> Self {
        RecvBatch::new(&[], &[])
    }

    /// Number of entries (a GRO-coalesced run counts once).
    pub fn len(&self) -> usize {
        self.metas.len()
    }

    /// True when nothing was received.
    pub fn is_empty(&self) -> bool {
        self.metas.is_empty()
    }

    fn datagram(&self, m: &RecvMeta) -> Option<RecvDatagram<'a>> {
        let end = m.offset.checked_add(m.len)?;
        if end > self.region_len {
            return None;
        }
        let data = if m.len == 0 {
            &[][..]
        } else {
            // SAFETY: `offset..end` lies inside the region (checked above), which the
            // constructor's contract (or the borrowed slice in `new`) makes readable and
            // unwritten for 'a.
            unsafe { std::slice::from_raw_parts(self.base.add(m.offset), m.len) }
        };
        Some(RecvDatagram {
            src: m.src,
            data,
            truncated: m.truncated,
            segment_size: m.segment_size,
        })
    }

    /// The `i`-th received entry, if any.
    pub fn get(&self, i: usize) -> Option<RecvDatagram<'a>> {
        self.datagram(self.metas.get(i)?)
    }

    /// The received datagrams, in arrival order.
    pub fn iter(&self) -> impl Iterator<Item = RecvDatagram<'a>> + 'a {
        let this = *self;
        self.metas.iter().filter_map(move |m| this.datagram(m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4() -> SocketAddr {
        "127.0.0.1:9".parse().unwrap()
    }
    fn v6() -> SocketAddr {
        "[::1]:9".parse().unwrap()
    }

    #[test]
    fn oversize_is_refused_and_batch_stays_usable() {
        let mut b = SendBatch::new(4);
        let big = vec![0u8; MAX_UDP_PAYLOAD_V4 + 1];
        match b.push(v4(), &big) {
            Err(Error::PayloadTooLarge { len, limit }) => {
                assert_eq!(len, MAX_UDP_PAYLOAD_V4 + 1);
                assert_eq!(limit, MAX_UDP_PAYLOAD_V4);
            }
            other => panic!("expected PayloadTooLarge, got {other:?}"),
        }
        assert!(b.is_empty());
        // The IPv6 limit is larger.
        b.push(v6(), &big).unwrap();
        b.push(v4(), b"ok").unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(b.payload(&b.pending()[1]), b"ok");
    }

    #[test]
    fn full_batch_and_partial_consume() {
        let mut b = SendBatch::new(2);
        b.push(v4(), b"a").unwrap();
        b.push(v4(), b"bb").unwrap();
        assert!(matches!(
            b.push(v4(), b"c"),
            Err(Error::BatchFull { capacity: 2 })
        ));
        b.consume(1);
        assert_eq!(b.len(), 1);
        assert_eq!(b.payload(&b.pending()[0]), b"bb");
        b.consume(1);
        assert!(b.is_empty());
        b.push(v4(), b"c").unwrap();
        assert_eq!(b.payload(&b.pending()[0]), b"c");
    }

    #[test]
    fn push_with_writes_in_place() {
        let mut b = SendBatch::new(2);
        let n = b
            .push_with(v4(), 100, |buf| {
                buf[..3].copy_from_slice(b"xyz");
                3
            })
            .unwrap();
        assert_eq!(n, 3);
        assert_eq!(b.payload(&b.pending()[0]), b"xyz");
    }

    #[test]
    fn storage_stays_bounded_while_the_batch_never_empties() {
        let dst: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut b = SendBatch::new(64);
        b.push(dst, &[0; 1000]).unwrap();
        for i in 0..10_000u32 {
            // A socket that always takes one entry of two: never empty.
            b.push(dst, &i.to_le_bytes().repeat(250)).unwrap();
            let first = b.pending()[0];
            assert_eq!(b.payload(&first).len(), 1000);
            b.consume(1);
        }
        let last = b.pending()[0];
        assert_eq!(b.payload(&last), 9_999u32.to_le_bytes().repeat(250));
        assert!(
            b.buf.len() <= 4_000,
            "storage grew to {} bytes",
            b.buf.len()
        );
    }

    #[test]
    fn compaction_keeps_skipped_segments_and_runs() {
        let dst: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut b = SendBatch::new(8);
        b.push(dst, &[1; 3000]).unwrap();
        let run: Vec<u8> = (0..5u8).flat_map(|i| [i; 100]).collect();
        b.push_segments(dst, 100, &run).unwrap();
        b.consume(1);
        assert!(!b.skip_segments(0, 2));
        // The next push moves the rest of the run to the front of the storage.
        b.push(dst, &[9; 10]).unwrap();
        let p: Vec<Vec<u8>> = b.pending().iter().map(|e| b.payload(e).to_vec()).collect();
        assert_eq!(p, vec![run[200..].to_vec(), vec![9; 10]]);
        assert_eq!(b.pending()[0].datagrams(), 3);
    }

    #[test]
    fn push_in_place_queues_what_the_writer_reports() {
        let mut b = SendBatch::new(2);
        b.push(v4(), b"first").unwrap();
        // The writer names the destination and the length after writing.
        let n = b
            .push_in_place(1500, |buf| {
                buf[..4].copy_from_slice(b"abcd");
                Some((other_v4(), 4))
            })
            .unwrap();
        assert_eq!(n, Some(4));
        assert_eq!(b.pending()[1].dst, other_v4());
        assert_eq!(b.payload(&b.pending()[1]), b"abcd");
        assert_eq!(b.payload(&b.pending()[0]), b"first");
        // Full: the writer is not called.
        let mut called = false;
        let r = b.push_in_place(1500, |_| {
            called = true;
            Some((v4(), 1))
        });
        assert!(matches!(r, Err(Error::BatchFull { capacity: 2 })));
        assert!(!called);
        // Room reused after a clear holds stale bytes; only the reported length is queued.
        b.clear();
        assert_eq!(b.push_in_place(64, |_| None).unwrap(), None);
        assert!(b.is_empty());
        let n = b
            .push_in_place(64, |buf| {
                buf[0] = b'z';
                Some((v4(), 1))
            })
            .unwrap();
        assert_eq!(n, Some(1));
        assert_eq!(b.payload(&b.pending()[0]), b"z");
        // A length beyond the room is clamped to it.
        let n = b.push_in_place(3, |_| Some((v4(), 10))).unwrap();
        assert_eq!(n, Some(3));
        assert_eq!(b.pending()[1].len, 3);
    }

    #[test]
    fn push_in_place_refuses_oversize_and_joins_runs() {
        let mut b = SendBatch::new(4);
        let r = b.push_in_place(MAX_UDP_PAYLOAD_V6, |_| Some((v4(), MAX_UDP_PAYLOAD_V4 + 1)));
        assert!(matches!(
            r,
            Err(Error::PayloadTooLarge { len, limit: MAX_UDP_PAYLOAD_V4 }) if len == MAX_UDP_PAYLOAD_V4 + 1
        ));
        assert!(b.is_empty());
        b.set_coalescing(true);
        for i in 0..3u8 {
            b.push_in_place(1500, |buf| {
                buf[..100].fill(i);
                Some((v4(), 100))
            })
            .unwrap();
        }
        assert_eq!(b.len(), 1);
        assert_eq!(b.pending()[0].segment_size, Some(100));
        assert_eq!(b.datagrams(), 3);
        assert_eq!(&b.payload(&b.pending()[0])[200..], &[2u8; 100][..]);
        // A push after an in-place write starts where the write ended.
        b.push(other_v4(), b"tail").unwrap();
        assert_eq!(b.payload(&b.pending()[1]), b"tail");
    }

    #[test]
    fn segments_split_gro_runs() {
        let data = [1u8, 2, 3, 4, 5];
        let d = RecvDatagram {
            src: v4(),
            data: &data,
            truncated: false,
            segment_size: Some(2),
        };
        let segs: Vec<&[u8]> = d.segments().collect();
        assert_eq!(segs, vec![&[1, 2][..], &[3, 4][..], &[5][..]]);
        let empty = RecvDatagram {
            src: v4(),
            data: &[],
            truncated: false,
            segment_size: None,
        };
        assert_eq!(empty.segments().count(), 1);
    }

    #[test]
    fn gso_entry_counts_datagrams() {
        let mut b = SendBatch::new(2);
        b.push_segments(v4(), 1200, &vec![0u8; 3000]).unwrap();
        assert_eq!(b.pending()[0].datagrams(), 3);
        assert!(b.push_segments(v4(), 100, &vec![0u8; 100 * 65]).is_err());
    }

    #[test]
    fn consume_segments_resumes_inside_a_gso_entry() {
        let mut b = SendBatch::new(2);
        let payload: Vec<u8> = (0..250u8).collect();
        b.push_segments(v4(), 100, &payload).unwrap();
        b.push(v4(), b"next").unwrap();
        b.consume_segments(2);
        assert_eq!(b.len(), 2);
        assert_eq!(b.payload(&b.pending()[0]), &payload[200..]);
        assert_eq!(b.pending()[0].datagrams(), 1);
        b.consume_segments(1);
        assert_eq!(b.len(), 1);
        assert_eq!(b.payload(&b.pending()[0]), b"next");
        b.consume_segments(1);
        assert!(b.is_empty());
    }

    #[test]
    fn remove_pending_keeps_order_of_the_rest() {
        let mut b = SendBatch::new(8);
        for p in [&b"a"[..], b"b", b"c", b"d"] {
            b.push(v4(), p).unwrap();
        }
        b.consume(1);
        assert_eq!(b.remove_pending(|i| i == 1), 1);
        let left: Vec<&[u8]> = b.pending().iter().map(|e| b.payload(e)).collect();
        assert_eq!(left, vec![&b"b"[..], b"d"]);
        let payload: Vec<u8> = (0..30u8).collect();
        b.push_segments(v4(), 10, &payload).unwrap();
        assert!(!b.skip_segments(2, 2));
        assert_eq!(b.payload(&b.pending()[2]), &payload[20..]);
        assert_eq!(b.remove_pending(|_| true), 3);
        assert!(b.is_empty());
    }

    fn other_v4() -> SocketAddr {
        "127.0.0.1:10".parse().unwrap()
    }

    #[test]
    fn coalescing_merges_same_destination_same_size_runs() {
        let mut b = SendBatch::new(4);
        b.set_coalescing(true);
        for i in 0..5u8 {
            b.push(v4(), &[i; 100]).unwrap();
        }
        // A shorter datagram ends the run; the next one starts a new entry.
        b.push(v4(), &[9; 40]).unwrap();
        b.push(v4(), &[10; 40]).unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(b.datagrams(), 7);
        let run = b.pending()[0];
        assert_eq!(
            (run.segment_size, run.len, run.datagrams()),
            (Some(100), 540, 6)
        );
        let bytes = b.payload(&run);
        assert_eq!(&bytes[400..500], &[4; 100][..]);
        assert_eq!(&bytes[500..], &[9; 40][..]);
        assert_eq!(b.pending()[1].len, 40);
        assert_eq!(b.pending()[1].segment_size, None);
    }

    #[test]
    fn coalescing_respects_destination_size_and_limits() {
        let mut b = SendBatch::new(256);
        b.set_coalescing(true);
        // Interleaved destinations never merge.
        for i in 0..4u8 {
            b.push(if i % 2 == 0 { v4() } else { other_v4() }, &[i; 10])
                .unwrap();
        }
        assert_eq!(b.len(), 4);
        b.clear();
        // A larger datagram does not join a run of smaller segments.
        b.push(v4(), &[1; 10]).unwrap();
        b.push(v4(), &[2; 20]).unwrap();
        assert_eq!(b.len(), 2);
        b.clear();
        // Segment count limit.
        for _ in 0..MAX_GSO_SEGMENTS + 1 {
            b.push(v4(), &[3; 10]).unwrap();
        }
        assert_eq!(b.len(), 2);
        assert_eq!(b.pending()[0].datagrams(), MAX_GSO_SEGMENTS);
        b.clear();
        // Segments above the MTU-sized limit go alone; so do empty datagrams.
        let big = vec![4u8; max_coalesced_segment(&v4()) + 1];
        b.push(v4(), &big).unwrap();
        b.push(v4(), &big).unwrap();
        b.push(v4(), &[]).unwrap();
        b.push(v4(), &[]).unwrap();
        assert_eq!(b.len(), 4);
        b.clear();
        // The payload limit: 1,452-byte IPv6 segments stop before 65,527 bytes.
        let seg = vec![5u8; max_coalesced_segment(&v6())];
        for _ in 0..50 {
            b.push(v6(), &seg).unwrap();
        }
        assert!(b.pending()[0].len <= MAX_UDP_PAYLOAD_V6);
        assert_eq!(b.pending()[0].datagrams(), MAX_UDP_PAYLOAD_V6 / seg.len());
        assert_eq!(b.datagrams(), 50);
        // Off by default.
        let mut plain = SendBatch::new(4);
        plain.push(v4(), &[1; 10]).unwrap();
        plain.push(v4(), &[1; 10]).unwrap();
        assert_eq!(plain.len(), 2);
    }

    #[test]
    fn coalescing_push_with_and_full_batch() {
        let mut b = SendBatch::new(1);
        b.set_coalescing(true);
        for i in 0..3u8 {
            let n = b
                .push_with(v4(), 64, |buf| {
                    buf[..8].fill(i);
                    8
                })
                .unwrap_or(0);
            assert_eq!(
                n,
                if i == 0 { 8 } else { 0 },
                "push_with needs a free entry"
            );
        }
        // A full batch still takes a datagram that joins its last run.
        b.push(v4(), &[7; 8]).unwrap();
        assert!(matches!(
            b.push(other_v4(), &[7; 8]),
            Err(Error::BatchFull { .. })
        ));
        assert_eq!(b.datagrams(), 2);
        assert_eq!(
            b.payload(&b.pending()[0]),
            &[0, 0, 0, 0, 0, 0, 0, 0, 7, 7, 7, 7, 7, 7, 7, 7]
        );
        // A run partly sent keeps growing from where it ends.
        let mut b = SendBatch::new(4);
        b.set_coalescing(true);
        for _ in 0..3 {
            b.push(v4(), &[1; 10]).unwrap();
        }
        b.consume_segments(2);
        b.push(v4(), &[2; 10]).unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(
            b.payload(&b.pending()[0]),
            &[[1u8; 10], [2u8; 10]].concat()[..]
        );
        // push_with joins a run when there is room for a new entry.
        let n = b
            .push_with(v4(), 100, |buf| {
                buf[..10].fill(3);
                10
            })
            .unwrap();
        assert_eq!(n, 10);
        assert_eq!(b.len(), 1);
        assert_eq!(b.pending()[0].datagrams(), 3);
    }
}
