//! The few OS calls std lacks: waiting on several sockets with a fine timeout, the thread's
//! timer slack, and the thread's CPU clock.

use std::io;
use std::time::Duration;

pub(super) use libc::pollfd as PollFd;
pub(super) use libc::{POLLIN, POLLOUT};

/// A poll entry for `fd` waiting for `events`.
pub(super) fn poll_fd(fd: std::os::fd::RawFd, events: libc::c_short) -> PollFd {
    PollFd {
        fd,
        events,
        revents: 0,
    }
}

/// Waits until one of `fds` is ready or `timeout` passes (`None`: no limit). Returns the number
/// of ready entries; an interrupted wait returns 0.
///
/// Linux uses `ppoll` (nanosecond timeout, so with a small timer slack the relay wakes within
/// tens of microseconds of a due time); elsewhere `poll` rounds the timeout down to whole
/// milliseconds and the caller's loop covers the rest by polling with a zero timeout.
pub(super) fn wait(fds: &mut [PollFd], timeout: Option<Duration>) -> io::Result<usize> {
    let n = fds.len() as libc::nfds_t;
    #[cfg(target_os = "linux")]
    let rc = {
        let ts = timeout.map(|t| libc::timespec {
            tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
            // subsec_nanos < 10^9 fits every platform's c_long.
            tv_nsec: t.subsec_nanos() as libc::c_long,
        });
        let ts_ptr = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: `fds` is a valid, exclusively borrowed array of `n` pollfd structs for the
        // call's duration; `ts_ptr` is null or points to a timespec living on this stack frame;
        // a null signal mask leaves the mask unchanged.
        unsafe { libc::ppoll(fds.as_mut_ptr(), n, ts_ptr, std::ptr::null()) }
    };
    #[cfg(not(target_os = "linux"))]
    let rc = {
        let ms = timeout.map_or(-1, |t| {
            libc::c_int::try_from(t.as_millis()).unwrap_or(i32::MAX)
        });
        // SAFETY: `fds` is a valid, exclusively borrowed array of `n` pollfd structs for the
        // call's duration.
        unsafe { libc::poll(fds.as_mut_ptr(), n, ms) }
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(rc as usize)
}

/// Asks for the smallest timer slack on the calling thread so timed waits end close to their
/// deadline (Linux: `PR_SET_TIMERSLACK`, default 50 µs); a no-op elsewhere. Best effort.
pub(super) fn minimize_timer_slack() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_SET_TIMERSLACK takes one unsigned long by value and touches no memory of
        // ours; it only changes the calling thread's timer slack.
        let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    }
}

/// Sets the calling thread's nice value (negative values need `CAP_SYS_NICE`). Linux only:
/// elsewhere `setpriority` would change the whole process, so this reports `Unsupported`.
pub(super) fn set_thread_nice(nice: i32) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid takes no arguments and cannot fail.
        let tid = unsafe { libc::gettid() };
        let who = libc::id_t::try_from(tid).map_err(|_| io::Error::other("negative tid"))?;
        // SAFETY: setpriority takes plain integers; on Linux PRIO_PROCESS with a thread id
        // changes only that thread.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, who, nice) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = nice;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "per-thread nice values are Linux-only",
        ))
    }
}

/// Datagrams the kernel dropped on socket `fd` since it was created, mostly because its receive
/// buffer was full (`SO_MEMINFO`, `SK_MEMINFO_DROPS`). `None` where the OS or architecture is
/// not covered.
pub(super) fn socket_drops(fd: std::os::fd::RawFd) -> Option<u64> {
    #[cfg(all(
        target_os = "linux",
        any(
            target_arch = "x86_64",
            target_arch = "aarch64",
            target_arch = "riscv64"
        )
    ))]
    {
        // `SO_MEMINFO` from asm-generic/socket.h (these architectures use the generic
        // values); the libc crate does not export it. The kernel fills `SK_MEMINFO_VARS` u32s.
        const SO_MEMINFO: libc::c_int = 55;
        const SK_MEMINFO_VARS: usize = 9;
        let mut info = [0u32; SK_MEMINFO_VARS];
        let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
        // SAFETY: `info` is a writable buffer of `len` bytes that outlives the call, and `len`
        // is a valid in/out length; the kernel writes at most `len` bytes.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                SO_MEMINFO,
                info.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let drops = libc::SK_MEMINFO_DROPS as usize;
        if rc != 0 || (len as usize) < (drops + 1) * std::mem::size_of::<u32>() {
            return None;
        }
        Some(u64::from(info[drops]))
    }
    #[cfg(not(all(
        target_os = "linux",
        any(
            target_arch = "x86_64",
            target_arch = "aarch64",
            target_arch = "riscv64"
        )
    )))]
    {
        let _ = fd;
        None
    }
}

/// CPU time the calling thread has used, in nanoseconds (0 if the clock is unavailable).
pub(super) fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec on this stack frame.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    #[test]
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    fn socket_drops_counts_a_full_receive_buffer() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(socket_drops(rx.as_raw_fd()), Some(0));
        // Far more than the default receive buffer holds, never read.
        let payload = [0u8; 1000];
        for _ in 0..2000 {
            tx.send_to(&payload, rx.local_addr().unwrap()).unwrap();
        }
        assert!(socket_drops(rx.as_raw_fd()).unwrap() > 0);
    }

    #[test]
    fn waits_time_out_and_see_readable_sockets() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut fds = [poll_fd(rx.as_raw_fd(), POLLIN)];
        let t = std::time::Instant::now();
        assert_eq!(wait(&mut fds, Some(Duration::from_millis(2))).unwrap(), 0);
        assert!(t.elapsed() >= Duration::from_millis(2));
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.send_to(b"x", rx.local_addr().unwrap()).unwrap();
        assert_eq!(wait(&mut fds, Some(Duration::from_secs(5))).unwrap(), 1);
        assert_ne!(fds[0].revents & POLLIN, 0);
        assert!(thread_cpu_ns() > 0);
    }
}
