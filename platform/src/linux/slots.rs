//! [`SlotBatch`]: batched `sendmmsg` / `recvmmsg` on a connected socket that the caller owns and
//! drives itself, without a backend.
//!
//! A [`Backend`](crate::Backend) addresses every datagram, watches a waker and never blocks in
//! a receive call. A client with one connected socket and nothing else to wait for can do with
//! less: `sendmmsg` for a burst, then one blocking `recvmmsg` (`MSG_WAITFORONE`, bounded by the
//! socket's `SO_RCVTIMEO`) that returns as soon as one datagram is there and takes whatever else
//! is queued — one system call per turn where a backend needs a readiness wait and a read. The
//! benchmark's `mmsg` client mode is built on it.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// Fixed-size slots for a batch of datagrams, plus the `mmsghdr` / `iovec` arrays that point
/// into them, for [`send`](SlotBatch::send) and [`recv`](SlotBatch::recv) on a connected
/// socket. Everything is allocated once, in [`new`](SlotBatch::new).
///
/// ```no_run
/// use ricochet_platform::linux::SlotBatch;
/// use std::net::UdpSocket;
///
/// let socket = UdpSocket::bind("127.0.0.1:0")?;
/// socket.connect("127.0.0.1:7777")?;
/// socket.set_read_timeout(Some(std::time::Duration::from_millis(5)))?;
/// let (mut tx, mut rx) = (SlotBatch::new(16, 1_024), SlotBatch::new(16, 1_024));
/// for i in 0..4 {
///     tx.slot_mut(i, 100).fill(i as u8);
/// }
/// let sent = tx.send(&socket, 4)?;
/// let got = rx.recv(&socket)?; // waits for one, takes what else is queued
/// for i in 0..got {
///     println!("{} bytes", rx.datagram(i).len());
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct SlotBatch {
    slot: usize,
    arena: Vec<u8>,
    lens: Vec<usize>,
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
}

// SAFETY: the raw pointers in `hdrs` / `iovs` only ever point into this struct's own `arena`
// and are rebuilt before every system call, so moving the batch to another thread is sound.
unsafe impl Send for SlotBatch {}

impl std::fmt::Debug for SlotBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotBatch")
            .field("slots", &self.slots())
            .field("slot_size", &self.slot)
            .finish()
    }
}

impl SlotBatch {
    /// `slots` datagrams (at least one) of up to `slot_size` bytes each.
    pub fn new(slots: usize, slot_size: usize) -> SlotBatch {
        let slots = slots.max(1);
        SlotBatch {
            slot: slot_size,
            arena: vec![0u8; slots * slot_size],
            lens: vec![0; slots],
            // SAFETY: mmsghdr and iovec are plain C structs for which all-zero is a valid
            // value (null pointers, zero lengths).
            hdrs: (0..slots).map(|_| unsafe { std::mem::zeroed() }).collect(),
            // SAFETY: as above.
            iovs: (0..slots).map(|_| unsafe { std::mem::zeroed() }).collect(),
        }
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.lens.len()
    }

    /// Bytes per slot.
    pub fn slot_size(&self) -> usize {
        self.slot
    }

    /// Slot `i`, for writing a datagram of `len` bytes (at most the slot size) to send.
    ///
    /// # Panics
    ///
    /// If `i` is not below [`slots`](SlotBatch::slots).
    pub fn slot_mut(&mut self, i: usize, len: usize) -> &mut [u8] {
        let len = len.min(self.slot);
        self.lens[i] = len;
        &mut self.arena[i * self.slot..i * self.slot + len]
    }

    /// Datagram `i` of the last [`recv`](SlotBatch::recv) (or what [`slot_mut`](SlotBatch::slot_mut)
    /// last set up in slot `i`). A received datagram larger than a slot is cut to the slot size:
    /// make slots one byte larger than the largest expected datagram to notice it.
    ///
    /// # Panics
    ///
    /// If `i` is not below [`slots`](SlotBatch::slots).
    pub fn datagram(&self, i: usize) -> &[u8] {
        &self.arena[i * self.slot..i * self.slot + self.lens[i].min(self.slot)]
    }

    /// Point headers `0..n` at their slots: for sending with each slot's length, for
    /// receiving with the whole slot.
    fn prepare(&mut self, n: usize, receive: bool) {
        let base = self.arena.as_mut_ptr();
        for i in 0..n {
            let len = if receive { self.slot } else { self.lens[i] };
            self.iovs[i] = libc::iovec {
                // SAFETY: i < slots, so i * slot is within the arena (slots * slot bytes).
                iov_base: unsafe { base.add(i * self.slot) }.cast(),
                iov_len: len,
            };
            // SAFETY: all-zero is a valid msghdr (no address, no control data).
            let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            self.hdrs[i] = libc::mmsghdr {
                msg_hdr: h,
                msg_len: 0,
            };
        }
    }

    /// Send slots `0..n` (at most [`slots`](SlotBatch::slots)) in one `sendmmsg` on the
    /// connected `socket`; returns how many the kernel took (the rest were not sent).
    pub fn send(&mut self, socket: &impl AsFd, n: usize) -> io::Result<usize> {
        let n = n.min(self.slots());
        if n == 0 {
            return Ok(0);
        }
        self.prepare(n, false);
        let fd = socket.as_fd().as_raw_fd();
        // SAFETY: hdrs[0..n] point at iovecs that point into `arena`, all alive and unaliased
        // for the duration of the call; the socket is connected, so no address is needed.
        let r = unsafe { libc::sendmmsg(fd, self.hdrs.as_mut_ptr(), n as libc::c_uint, 0) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }

    /// One `recvmmsg` with `MSG_WAITFORONE` on `socket`: wait for at least one datagram (as
    /// long as the socket lets a receive block: its read timeout, or not at all when it is
    /// non-blocking), then take whatever else is queued, up to the number of slots. Returns
    /// how many; read them with [`datagram`](SlotBatch::datagram).
    pub fn recv(&mut self, socket: &impl AsFd) -> io::Result<usize> {
        let n = self.slots();
        self.prepare(n, true);
        let fd = socket.as_fd().as_raw_fd();
        // SAFETY: hdrs[0..n] point at iovecs covering distinct slots of `arena`, alive and
        // exclusively borrowed for the call; a null timeout means the socket's own timeout.
        let r = unsafe {
            libc::recvmmsg(
                fd,
                self.hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let got = r as usize;
        for i in 0..got {
            self.lens[i] = self.hdrs[i].msg_len as usize;
        }
        Ok(got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::time::Duration;

    fn pair() -> (UdpSocket, UdpSocket) {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
        b.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        (a, b)
    }

    #[test]
    fn round_trip_over_loopback() {
        let (a, b) = pair();
        let mut tx = SlotBatch::new(4, 100);
        for i in 0..3 {
            tx.slot_mut(i, 10 + i).fill(i as u8 + 1);
        }
        assert_eq!(tx.send(&a, 3).unwrap(), 3);
        let mut rx = SlotBatch::new(4, 100);
        let mut got = Vec::new();
        while got.len() < 3 {
            let n = rx.recv(&b).unwrap();
            for i in 0..n {
                got.push(rx.datagram(i).to_vec());
            }
        }
        assert_eq!(got, vec![vec![1u8; 10], vec![2u8; 11], vec![3u8; 12]]);
    }

    #[test]
    fn oversize_datagrams_are_cut_and_counts_are_clamped() {
        let (a, b) = pair();
        a.send(&[7u8; 50]).unwrap();
        let mut rx = SlotBatch::new(2, 20);
        assert_eq!(rx.recv(&b).unwrap(), 1);
        assert_eq!(rx.datagram(0), &[7u8; 20][..]);
        // Asking to send more slots than there are sends what there is.
        let mut tx = SlotBatch::new(2, 8);
        tx.slot_mut(0, 8).fill(1);
        tx.slot_mut(1, 4).fill(2);
        assert_eq!(tx.send(&a, 5).unwrap(), 2);
        assert_eq!(tx.send(&a, 0).unwrap(), 0);
        let mut got = Vec::new();
        while got.len() < 2 {
            let n = rx.recv(&b).unwrap();
            got.extend((0..n).map(|i| rx.datagram(i).to_vec()));
        }
        assert_eq!(got, vec![vec![1u8; 8], vec![2u8; 4]]);
    }

    #[test]
    fn receive_times_out_with_the_sockets_timeout() {
        let (_a, b) = pair();
        b.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let err = SlotBatch::new(4, 64).recv(&b).unwrap_err();
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
            "{err}"
        );
    }
}
