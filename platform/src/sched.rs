//! Scheduling hints for the calling thread.
//!
//! A network worker sleeps and wakes thousands of times a second and runs for microseconds
//! each time. Under Linux's EEVDF scheduler (6.6 and later) such a thread still competes with
//! batch work (a compiler, a game's asset baker) on the same core with the default time slice,
//! a few milliseconds: when it is preempted after a busy stretch it may wait until every
//! other runnable thread on that core had its slice, which on a loaded core is tens to
//! hundreds of milliseconds. A worker pinned to its core cannot escape to an idle one, so
//! every session it serves stalls that long. Requesting a short slice (Linux 6.12 and later,
//! no privilege needed) gives the thread an early virtual deadline: it preempts batch work
//! when it wakes and never builds up enough of a debt to be left waiting behind it. It does
//! not raise the thread's share of the CPU.

use std::io;
use std::time::Duration;

/// Ask the scheduler to run the calling thread in slices of `slice` (Linux's `sched_setattr`
/// with `sched_runtime` on a normal-policy thread; the kernel clamps it to 0.1..100 ms).
///
/// Returns `Ok(true)` when the kernel reports the slice back, `Ok(false)` when it accepted the
/// call but ignores the request (kernels before 6.12, or a policy other than the normal one,
/// which this leaves as it is), and an error where the call is refused or the OS has no such
/// request (everything but Linux: [`io::ErrorKind::Unsupported`]).
pub fn request_time_slice(slice: Duration) -> io::Result<bool> {
    imp::request_time_slice(slice)
}

#[cfg(target_os = "linux")]
mod imp {
    use std::io;
    use std::time::Duration;

    /// `struct sched_attr` of `<linux/sched/types.h>` (the size of its first published
    /// version plus the utilization clamps; the kernel accepts any size it knows).
    #[repr(C)]
    #[derive(Default)]
    struct SchedAttr {
        size: u32,
        sched_policy: u32,
        sched_flags: u64,
        sched_nice: i32,
        sched_priority: u32,
        sched_runtime: u64,
        sched_deadline: u64,
        sched_period: u64,
        sched_util_min: u32,
        sched_util_max: u32,
    }

    fn get() -> io::Result<SchedAttr> {
        let mut attr = SchedAttr::default();
        let size = std::mem::size_of::<SchedAttr>() as libc::c_uint;
        // SAFETY: `attr` is a live, writable `sched_attr` of `size` bytes; pid 0 names the
        // calling thread; flags must be 0.
        let r = unsafe {
            libc::syscall(
                libc::SYS_sched_getattr,
                0 as libc::pid_t,
                &mut attr as *mut SchedAttr,
                size,
                0 as libc::c_uint,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(attr)
    }

    pub(super) fn request_time_slice(slice: Duration) -> io::Result<bool> {
        let mut attr = get()?;
        if attr.sched_policy != libc::SCHED_OTHER as u32 {
            // Real-time or idle policy chosen by the operator: not ours to change.
            return Ok(false);
        }
        let ns = u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX);
        attr.size = std::mem::size_of::<SchedAttr>() as u32;
        attr.sched_runtime = ns;
        // Keep the nice value and leave the utilization clamps alone (flags 0).
        attr.sched_flags = 0;
        // SAFETY: `attr` is a fully initialized `sched_attr` whose `size` field says how many
        // bytes the kernel may read; pid 0 names the calling thread; flags must be 0.
        let r = unsafe {
            libc::syscall(
                libc::SYS_sched_setattr,
                0 as libc::pid_t,
                &attr as *const SchedAttr,
                0 as libc::c_uint,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(get()?.sched_runtime != 0)
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::io;
    use std::time::Duration;

    pub(super) fn request_time_slice(_slice: Duration) -> io::Result<bool> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "time-slice requests are Linux-only",
        ))
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_requested_slice_is_reported_back_or_ignored_by_an_old_kernel() {
        // On a thread of its own: the request stays with the thread that made it.
        std::thread::spawn(|| {
            let honored = request_time_slice(Duration::from_micros(100)).expect("sched_setattr");
            let attr = imp_get();
            if honored {
                assert_eq!(attr, 100_000);
            } else {
                assert_eq!(attr, 0, "an ignored request reads back as no slice");
            }
        })
        .join()
        .expect("thread");
    }

    fn imp_get() -> u64 {
        // The same read the implementation does, kept separate so the test checks the kernel's
        // answer rather than the function's own.
        let mut buf = [0u64; 8];
        // SAFETY: `buf` is 64 writable bytes, enough for the 56-byte sched_attr asked for;
        // pid 0 is the calling thread.
        let r = unsafe {
            libc::syscall(
                libc::SYS_sched_getattr,
                0 as libc::pid_t,
                buf.as_mut_ptr(),
                56 as libc::c_uint,
                0 as libc::c_uint,
            )
        };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
        // sched_runtime is the fourth u64: after size+policy (8), flags (8), nice+priority (8).
        buf[3]
    }
}
