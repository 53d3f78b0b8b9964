//! Waiting on several backends from one thread: block until any of their
//! [`Backend::ready_fd`](crate::Backend::ready_fd) descriptors is readable.

use std::os::fd::RawFd;
use std::time::Duration;

use crate::error::{Error, Result};

/// A reusable set of descriptors to wait on together (a `poll(2)` array kept between waits, so
/// waiting allocates nothing once the set has reached its size).
#[derive(Debug, Default)]
pub struct ReadySet {
    fds: Vec<libc::pollfd>,
}

impl ReadySet {
    /// An empty set.
    pub fn new() -> Self {
        ReadySet::default()
    }

    /// Forget every descriptor (keeps the storage).
    pub fn clear(&mut self) {
        self.fds.clear();
    }

    /// Add `fd`; its index is the number of descriptors added before it.
    pub fn push(&mut self, fd: RawFd) {
        self.fds.push(libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
    }

    /// Number of descriptors.
    pub fn len(&self) -> usize {
        self.fds.len()
    }

    /// True when the set holds no descriptor.
    pub fn is_empty(&self) -> bool {
        self.fds.is_empty()
    }

    /// Block until at least one descriptor is readable (or has an error condition), or
    /// `timeout` passes (`None`: no limit; `Some(ZERO)`: just look). Returns how many are
    /// ready; [`ReadySet::is_ready`] tells which. A signal or task-work interruption returns
    /// early with whatever is ready (possibly nothing): callers loop on their own deadline.
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<usize> {
        for p in &mut self.fds {
            p.revents = 0;
        }
        let n = self.fds.len() as libc::nfds_t;
        #[cfg(target_os = "linux")]
        let r = {
            // The kernel may write the time left back into the timespec: give it a mutable one.
            let mut ts = timeout.map(|t| libc::timespec {
                tv_sec: t.as_secs().min(i32::MAX as u64) as libc::time_t,
                tv_nsec: t.subsec_nanos() as libc::c_long,
            });
            let tsp = ts
                .as_mut()
                .map_or(std::ptr::null_mut(), |t| t as *mut libc::timespec);
            // SAFETY: `fds` is a live array of `n` pollfd structs; `tsp` is null or points to a
            // timespec that outlives the call; a null signal mask leaves the mask unchanged.
            unsafe { libc::ppoll(self.fds.as_mut_ptr(), n, tsp, std::ptr::null()) }
        };
        #[cfg(not(target_os = "linux"))]
        let r = {
            // poll(2) counts milliseconds: round up so a short timeout does not become a spin.
            let ms = timeout.map_or(-1, |t| {
                t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int
            });
            // SAFETY: `fds` is a live array of `n` pollfd structs.
            unsafe { libc::poll(self.fds.as_mut_ptr(), n, ms) }
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(Error::io("poll", e));
        }
        Ok(r as usize)
    }

    /// Whether descriptor `index` was ready after the last [`ReadySet::wait`].
    pub fn is_ready(&self, index: usize) -> bool {
        self.fds.get(index).is_some_and(|p| p.revents != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;
    use std::time::Instant;

    #[test]
    fn wait_reports_which_socket_is_readable() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut set = ReadySet::new();
        set.push(a.as_raw_fd());
        set.push(b.as_raw_fd());
        // Nothing yet: a short wait times out with nothing ready.
        let t0 = Instant::now();
        assert_eq!(set.wait(Some(Duration::from_millis(20))).unwrap(), 0);
        assert!(t0.elapsed() >= Duration::from_millis(15));
        assert!(!set.is_ready(0) && !set.is_ready(1));
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.send_to(b"x", b.local_addr().unwrap()).unwrap();
        assert_eq!(set.wait(Some(Duration::from_secs(5))).unwrap(), 1);
        assert!(!set.is_ready(0));
        assert!(set.is_ready(1));
        assert!(!set.is_ready(2), "out of range is never ready");
    }
}
