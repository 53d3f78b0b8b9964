//! Batched datagram I/O for the clients on a connected socket: `sendmmsg` / `recvmmsg`
//! (Linux), so a client sends its refills and reads its queued echoes in one system call each
//! instead of one per datagram. This keeps client overhead below the server's.

use std::io;
use std::os::fd::AsRawFd;

/// Fixed-size slots for a batch of datagrams, plus the `mmsghdr`/`iovec` arrays that point
/// into them.
pub struct Batch {
    slot: usize,
    arena: Vec<u8>,
    lens: Vec<usize>,
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
}

impl Batch {
    /// `slots` datagrams of up to `slot` bytes each.
    pub fn new(slots: usize, slot: usize) -> Batch {
        let slots = slots.max(1);
        Batch {
            slot,
            arena: vec![0u8; slots * slot],
            lens: vec![0; slots],
            // SAFETY: mmsghdr and iovec are plain C structs for which all-zero is a valid value
            // (null pointers, zero lengths).
            hdrs: (0..slots).map(|_| unsafe { std::mem::zeroed() }).collect(),
            // SAFETY: as above.
            iovs: (0..slots).map(|_| unsafe { std::mem::zeroed() }).collect(),
        }
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.lens.len()
    }

    /// Slot `i`'s whole buffer, for writing a datagram of `len` bytes into it.
    pub fn slot_mut(&mut self, i: usize, len: usize) -> &mut [u8] {
        let len = len.min(self.slot);
        self.lens[i] = len;
        &mut self.arena[i * self.slot..i * self.slot + len]
    }

    /// Datagram `i` of the last receive.
    pub fn datagram(&self, i: usize) -> &[u8] {
        &self.arena[i * self.slot..i * self.slot + self.lens[i].min(self.slot)]
    }

    /// Point headers 0..n at their slots with the given lengths (sending: `lens`; receiving:
    /// the whole slot).
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

    /// Send slots 0..n on the connected socket `fd`; returns how many the kernel took.
    pub fn send(&mut self, fd: &impl AsRawFd, n: usize) -> io::Result<usize> {
        let n = n.min(self.slots());
        if n == 0 {
            return Ok(0);
        }
        self.prepare(n, false);
        // SAFETY: hdrs[0..n] point at iovecs that point into `arena`, all alive and unaliased
        // for the duration of the call; the socket is connected, so no address is needed.
        let r =
            unsafe { libc::sendmmsg(fd.as_raw_fd(), self.hdrs.as_mut_ptr(), n as libc::c_uint, 0) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }

    /// Wait (up to the socket's receive timeout) for at least one datagram, then take whatever
    /// else is queued, up to the number of slots. Returns how many; read them with
    /// [`Batch::datagram`]. A datagram larger than a slot is cut to the slot size (and the
    /// length check downstream flags it).
    pub fn recv(&mut self, fd: &impl AsRawFd) -> io::Result<usize> {
        let n = self.slots();
        self.prepare(n, true);
        // SAFETY: hdrs[0..n] point at iovecs covering distinct slots of `arena`, alive and
        // exclusively borrowed for the call; a null timeout means the socket's own timeout.
        let r = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
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

// SAFETY: the raw pointers in `hdrs`/`iovs` only ever point into this struct's own `arena`
// and are rebuilt before every system call, so moving the batch to another thread is sound.
unsafe impl Send for Batch {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::time::Duration;

    #[test]
    fn batch_round_trip_over_loopback() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
        b.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut tx = Batch::new(4, 100);
        for i in 0..3 {
            let s = tx.slot_mut(i, 10 + i);
            s.fill(i as u8 + 1);
        }
        assert_eq!(tx.send(&a, 3).unwrap(), 3);
        let mut rx = Batch::new(4, 100);
        let mut got = Vec::new();
        while got.len() < 3 {
            let n = rx.recv(&b).unwrap();
            for i in 0..n {
                got.push(rx.datagram(i).to_vec());
            }
        }
        assert_eq!(got, vec![vec![1u8; 10], vec![2u8; 11], vec![3u8; 12]]);
    }
}
