//! Linux backends: `uring` (io_uring) and `mmsg` (epoll + `recvmmsg`/`sendmmsg`), and what they
//! share: the eventfd waker, control-message encoding and parsing, GSO/GRO socket options. With
//! the `test-util` feature also `SlotBatch`, batched `sendmmsg` / `recvmmsg` on a connected
//! socket without a backend (the benchmark's raw UDP client).

pub mod mmsg;
#[cfg(feature = "test-util")]
pub mod slots;
pub mod uring;

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::backend::Wake;
use crate::sys::CmsgBuf;

pub use mmsg::MmsgBackend;
#[cfg(feature = "test-util")]
pub use slots::SlotBatch;
pub use uring::UringBackend;

/// An eventfd that a [`Waker`](crate::Waker) writes to and a backend's poll watches.
#[derive(Debug)]
pub(crate) struct EventFd {
    fd: OwnedFd,
    /// Set by a wake after it writes: a poll that does not wait on the descriptor (a
    /// zero-timeout poll) learns of a wake-up here without a system call.
    pending: AtomicBool,
}

impl EventFd {
    /// A non-blocking, close-on-exec eventfd.
    pub(crate) fn new() -> io::Result<Arc<EventFd>> {
        // SAFETY: plain syscall; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Arc::new(EventFd {
            fd,
            pending: AtomicBool::new(false),
        }))
    }

    /// The descriptor.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Reset the counter; true if a wake-up was pending.
    pub(crate) fn drain(&self) -> bool {
        // Cleared first: a wake that lands after this read leaves its flag (and count) set.
        self.pending.store(false, Ordering::Relaxed);
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into `v`, which is 8 bytes long.
        let n = unsafe { libc::read(self.fd(), (&mut v as *mut u64).cast(), 8) };
        n == 8
    }

    /// True, once, when a wake came since the last drain; drains the counter then, so the
    /// descriptor (and any epoll set holding it) stops being readable.
    pub(crate) fn take_pending(&self) -> bool {
        if !self.pending.load(Ordering::Acquire) {
            return false;
        }
        self.drain();
        true
    }
}

impl Wake for EventFd {
    fn wake(&self) -> io::Result<()> {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one`.
        let n = unsafe { libc::write(self.fd(), (&one as *const u64).cast(), 8) };
        // Flagged after the write, so that a count a drain could miss is always flagged again
        // (a drain clears the flag before it reads).
        self.pending.store(true, Ordering::Release);
        if n == 8 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        // EAGAIN: the counter is saturated, so a wake-up is pending anyway.
        if crate::sys::would_block(&err) {
            Ok(())
        } else {
            Err(err)
        }
    }
}

/// What the control messages of one received datagram said.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RecvCmsgs {
    /// `SO_RXQ_OVFL`: the socket's cumulative drop count (sent only once non-zero).
    pub drops: Option<u32>,
    /// `UDP_GRO`: the segment size of a coalesced run.
    pub gro_segment: Option<u16>,
}

const CMSG_ALIGN_TO: usize = mem::size_of::<usize>();

const fn cmsg_align(len: usize) -> usize {
    (len + CMSG_ALIGN_TO - 1) & !(CMSG_ALIGN_TO - 1)
}

const CMSG_HDR_LEN: usize = cmsg_align(mem::size_of::<libc::cmsghdr>());

/// Bytes a control message with `data` bytes of payload occupies (`CMSG_SPACE`).
pub(crate) const fn cmsg_space(data: usize) -> usize {
    CMSG_HDR_LEN + cmsg_align(data)
}

/// Parse received control messages from a byte slice (as filled by `recvmsg`, or as found in an
/// io_uring `recvmsg_out` buffer). Malformed input ends parsing; it never panics.
pub(crate) fn parse_cmsgs(ctrl: &[u8]) -> RecvCmsgs {
    let mut out = RecvCmsgs::default();
    let mut off = 0usize;
    while off + CMSG_HDR_LEN <= ctrl.len() {
        // SAFETY: `off + CMSG_HDR_LEN <= ctrl.len()`, so a whole cmsghdr lies in the slice;
        // read_unaligned needs no alignment.
        let hdr: libc::cmsghdr = unsafe { std::ptr::read_unaligned(ctrl.as_ptr().add(off).cast()) };
        let len = hdr.cmsg_len as usize;
        if len < CMSG_HDR_LEN || off + len > ctrl.len() {
            break;
        }
        let data = &ctrl[off + CMSG_HDR_LEN..off + len];
        match (hdr.cmsg_level, hdr.cmsg_type) {
            (libc::SOL_SOCKET, libc::SO_RXQ_OVFL) if data.len() >= 4 => {
                out.drops = Some(u32::from_ne_bytes([data[0], data[1], data[2], data[3]]));
            }
            (libc::SOL_UDP, libc::UDP_GRO) if data.len() >= 4 => {
                let v = i32::from_ne_bytes([data[0], data[1], data[2], data[3]]);
                out.gro_segment = u16::try_from(v).ok().filter(|&s| s > 0);
            }
            (libc::SOL_UDP, libc::UDP_GRO) if data.len() >= 2 => {
                out.gro_segment = Some(u16::from_ne_bytes([data[0], data[1]])).filter(|&s| s > 0);
            }
            _ => {}
        }
        off += cmsg_align(len);
    }
    out
}

/// Write a `UDP_SEGMENT` (GSO) control message into `buf`; returns the control length.
pub(crate) fn write_gso_cmsg(buf: &mut CmsgBuf, segment: u16) -> usize {
    let space = cmsg_space(mem::size_of::<u16>());
    // SAFETY: all-zero is a valid cmsghdr.
    let mut hdr: libc::cmsghdr = unsafe { mem::zeroed() };
    hdr.cmsg_len = (CMSG_HDR_LEN + mem::size_of::<u16>()) as _;
    hdr.cmsg_level = libc::SOL_UDP;
    hdr.cmsg_type = libc::UDP_SEGMENT;
    buf.0[..space].fill(0);
    // SAFETY: the buffer holds at least CMSG_HDR_LEN bytes (it is CMSG_BUF_LEN long).
    unsafe { std::ptr::write_unaligned(buf.0.as_mut_ptr().cast::<libc::cmsghdr>(), hdr) };
    buf.0[CMSG_HDR_LEN..CMSG_HDR_LEN + 2].copy_from_slice(&segment.to_ne_bytes());
    space
}

/// Turn on UDP GRO for `fd`.
pub(crate) fn enable_gro(fd: RawFd) -> io::Result<()> {
    crate::sys::set_int(fd, libc::SOL_UDP, libc::UDP_GRO, 1)
}

/// Convert a poll timeout into a `timespec`.
pub(crate) fn timespec(d: std::time::Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    }
}

/// A GSO send failed in a way that sending the same datagrams one by one avoids: `EIO` (the
/// device cannot checksum-offload the segments; quinn-udp documents this), `EINVAL` or
/// `EMSGSIZE` (a segment larger than the route's MTU, or more segments than the kernel takes).
pub(crate) fn is_gso_refusal(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EIO) | Some(libc::EINVAL) | Some(libc::EMSGSIZE)
    )
}

/// Log a send error: the first, and then every 1,024th, at warn level so a flood stays readable.
pub(crate) fn log_send_error(
    backend: &'static str,
    count: u64,
    err: &io::Error,
    dst: &std::net::SocketAddr,
) {
    if count == 1 || count % 1024 == 0 {
        tracing::warn!(backend, %dst, error = %err, dropped_so_far = count, "UDP send failed; datagram dropped");
    } else {
        tracing::debug!(backend, %dst, error = %err, "UDP send failed; datagram dropped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmsg_round_trip_and_garbage() {
        let mut buf = CmsgBuf::new();
        let len = write_gso_cmsg(&mut buf, 1200);
        assert_eq!(len, cmsg_space(2));
        // A UDP_SEGMENT cmsg is not something the receive parser reports.
        assert_eq!(parse_cmsgs(&buf.0[..len]), RecvCmsgs::default());
        // Garbage never panics.
        assert_eq!(parse_cmsgs(&[0xff; 7]), RecvCmsgs::default());
        assert_eq!(parse_cmsgs(&[0xff; 64]), RecvCmsgs::default());
        assert_eq!(parse_cmsgs(&[]), RecvCmsgs::default());
    }

    #[test]
    fn a_pending_wake_is_taken_once() {
        let e = EventFd::new().unwrap();
        assert!(!e.take_pending());
        e.wake().unwrap();
        assert!(e.take_pending());
        assert!(!e.take_pending());
        // Taking it drained the counter too: the descriptor is no longer readable.
        assert!(!e.drain());
    }

    #[test]
    fn eventfd_wakes_and_drains() {
        let e = EventFd::new().unwrap();
        assert!(!e.drain());
        e.wake().unwrap();
        e.wake().unwrap();
        assert!(e.drain());
        assert!(!e.drain());
    }
}
