//! Waiting on several backends from one thread: block until any of their
//! [`Backend::ready_fd`](crate::Backend::ready_fd) descriptors is readable.
//!
//! [`ReadySet`] passes every descriptor to `poll(2)` on every wait: fine for a few. [`Poller`]
//! registers each descriptor once with the kernel (epoll on Linux, kqueue on macOS), so a wait
//! costs in proportion to the descriptors that are ready, not to how many are registered: a
//! load generator's thousand sockets, three of them readable, cost three.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::error::{Error, Result};

/// Descriptors registered once and waited on together, level-triggered: a descriptor is
/// reported by every wait while it is readable (or has an error condition). Each carries a
/// caller-chosen token, which [`Poller::wait`] returns.
#[derive(Debug)]
pub struct Poller {
    fd: OwnedFd,
    #[cfg(target_os = "linux")]
    events: Vec<libc::epoll_event>,
    #[cfg(not(target_os = "linux"))]
    events: Vec<libc::kevent>,
    /// `epoll_pwait2` is missing (ENOSYS): wait with `epoll_wait` in milliseconds.
    #[cfg(target_os = "linux")]
    no_pwait2: bool,
}

// SAFETY: the event buffers hold plain data (tokens; kevent's `udata` is a token stored as a
// pointer-sized integer, never dereferenced), so moving the poller between threads is sound.
unsafe impl Send for Poller {}

/// Events one wait reports at most (more stay pending for the next wait: level-triggered).
const MAX_EVENTS: usize = 256;

impl Poller {
    /// A new, empty poller.
    pub fn new() -> Result<Poller> {
        #[cfg(target_os = "linux")]
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        #[cfg(not(target_os = "linux"))]
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::kqueue() };
        if fd < 0 {
            return Err(Error::io("poller create", io::Error::last_os_error()));
        }
        Ok(Poller {
            // SAFETY: `fd` is a fresh descriptor nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            // SAFETY: all-zero epoll_event / kevent values are valid.
            events: vec![unsafe { std::mem::zeroed() }; MAX_EVENTS],
            #[cfg(target_os = "linux")]
            no_pwait2: false,
        })
    }

    /// Start reporting `fd` (readable) with `token`. The descriptor must stay open until
    /// [`Poller::remove`] (or the poller is dropped).
    pub fn add(&mut self, fd: RawFd, token: u64) -> Result<()> {
        self.change(fd, token, true)
            .map_err(|e| Error::io("poller add", e))
    }

    /// Stop reporting `fd`.
    pub fn remove(&mut self, fd: RawFd) -> Result<()> {
        self.change(fd, 0, false)
            .map_err(|e| Error::io("poller remove", e))
    }

    #[cfg(target_os = "linux")]
    fn change(&mut self, fd: RawFd, token: u64, add: bool) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        let op = if add {
            libc::EPOLL_CTL_ADD
        } else {
            libc::EPOLL_CTL_DEL
        };
        // SAFETY: `ev` lives across the call.
        let rc = unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn change(&mut self, fd: RawFd, token: u64, add: bool) -> io::Result<()> {
        // SAFETY: all-zero is a valid kevent.
        let mut ev: libc::kevent = unsafe { std::mem::zeroed() };
        ev.ident = fd as usize;
        ev.filter = libc::EVFILT_READ;
        ev.flags = if add { libc::EV_ADD } else { libc::EV_DELETE };
        ev.udata = token as usize as *mut libc::c_void;
        // SAFETY: one change from `ev`, no event list; a null timeout is allowed.
        let rc = unsafe {
            libc::kevent(
                self.fd.as_raw_fd(),
                &ev,
                1,
                std::ptr::null_mut(),
                0,
                std::ptr::null(),
            )
        };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Block until a registered descriptor is readable or `timeout` passes (`None`: no limit;
    /// `Some(ZERO)`: just look), then append the tokens of the ready ones to `ready` (at most
    /// a few hundred per call; the rest are reported by the next). Returns how many it
    /// appended. A signal returns early with nothing: callers loop on their own deadline.
    pub fn wait(&mut self, timeout: Option<Duration>, ready: &mut Vec<u64>) -> Result<usize> {
        let n = self.wait_raw(timeout)?;
        #[cfg(target_os = "linux")]
        ready.extend(self.events[..n].iter().map(|e| e.u64));
        #[cfg(not(target_os = "linux"))]
        ready.extend(self.events[..n].iter().map(|e| e.udata as usize as u64));
        Ok(n)
    }

    #[cfg(target_os = "linux")]
    fn wait_raw(&mut self, timeout: Option<Duration>) -> Result<usize> {
        let (fd, len) = (self.fd.as_raw_fd(), self.events.len() as libc::c_int);
        if !self.no_pwait2 {
            let ts = timeout.map(crate::linux::timespec);
            let tsp = ts
                .as_ref()
                .map_or(std::ptr::null(), |t| t as *const libc::timespec);
            // SAFETY: `events` has room for `len` entries; `tsp` is null or points at `ts`; a
            // null signal mask leaves the mask unchanged.
            let rc = unsafe {
                libc::epoll_pwait2(fd, self.events.as_mut_ptr(), len, tsp, std::ptr::null())
            };
            if rc >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS) {
                return Self::result(rc);
            }
            self.no_pwait2 = true;
        }
        // epoll_wait counts milliseconds: round up so a short timeout does not become a spin.
        let ms = timeout.map_or(-1, |t| {
            t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int
        });
        // SAFETY: `events` has room for `len` entries.
        let rc = unsafe { libc::epoll_wait(fd, self.events.as_mut_ptr(), len, ms) };
        Self::result(rc)
    }

    #[cfg(not(target_os = "linux"))]
    fn wait_raw(&mut self, timeout: Option<Duration>) -> Result<usize> {
        let ts = timeout.map(|d| libc::timespec {
            tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        });
        let tsp = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: no changes; `events` has room for `len` entries; `tsp` is null or valid.
        let rc = unsafe {
            libc::kevent(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                self.events.as_mut_ptr(),
                self.events.len() as libc::c_int,
                tsp,
            )
        };
        Self::result(rc)
    }

    fn result(rc: libc::c_int) -> Result<usize> {
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(Error::io("poller wait", e));
        }
        Ok(rc as usize)
    }
}

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
    fn poller_reports_ready_tokens_level_triggered() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut p = Poller::new().unwrap();
        p.add(a.as_raw_fd(), 10).unwrap();
        p.add(b.as_raw_fd(), 11).unwrap();
        let mut ready = Vec::new();
        let t0 = Instant::now();
        assert_eq!(
            p.wait(Some(Duration::from_millis(20)), &mut ready).unwrap(),
            0
        );
        assert!(t0.elapsed() >= Duration::from_millis(15));
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.send_to(b"x", b.local_addr().unwrap()).unwrap();
        assert_eq!(p.wait(Some(Duration::from_secs(5)), &mut ready).unwrap(), 1);
        assert_eq!(ready, [11]);
        // Level-triggered: still readable, still reported.
        ready.clear();
        assert_eq!(p.wait(Some(Duration::ZERO), &mut ready).unwrap(), 1);
        assert_eq!(ready, [11]);
        // Removed: no longer reported.
        p.remove(b.as_raw_fd()).unwrap();
        ready.clear();
        assert_eq!(p.wait(Some(Duration::ZERO), &mut ready).unwrap(), 0);
        tx.send_to(b"y", a.local_addr().unwrap()).unwrap();
        assert_eq!(p.wait(Some(Duration::from_secs(5)), &mut ready).unwrap(), 1);
        assert_eq!(ready, [10]);
    }

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
