//! The kernel facts the backends read, each probed once per process: [`Capability`] (works, or
//! why not), the GSO/GRO offload probe, and the fix for an io_uring setup error.
//!
//! A leaf: it builds no backend. The full probe ([`probe`](fn@crate::probe), which sets up an
//! io_uring to see what works) and [`open`](fn@crate::open) build on it, so a backend can read
//! these facts without depending on the code that builds backends.

use std::sync::OnceLock;

/// Whether one kernel feature works here, and why not (or what was found).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    /// The feature works.
    pub available: bool,
    /// What was checked, and for a missing feature why it is missing and how to fix it.
    pub detail: String,
}

impl Capability {
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn yes(detail: impl Into<String>) -> Self {
        Capability {
            available: true,
            detail: detail.into(),
        }
    }

    pub(crate) fn no(detail: impl Into<String>) -> Self {
        Capability {
            available: false,
            detail: detail.into(),
        }
    }
}

/// Whether UDP GSO (one send of several same-size datagrams) can be used here: Linux ≥ 4.18.
/// Unlike [`probe`](fn@crate::probe), it sets up no io_uring, so a process that forces the epoll backend (a
/// way around an io_uring problem) never touches io_uring for it.
pub fn gso_supported() -> bool {
    offloads_cached().0.available
}

/// The cached GSO and GRO probe (a socket and two socket options, nothing more).
pub(crate) fn offloads_cached() -> &'static (Capability, Capability) {
    static OFFLOADS: OnceLock<(Capability, Capability)> = OnceLock::new();
    OFFLOADS.get_or_init(probe_offloads)
}

/// GSO and GRO: the socket options exist and are accepted on a UDP socket.
#[cfg(not(target_os = "linux"))]
fn probe_offloads() -> (Capability, Capability) {
    (Capability::no("Linux only"), Capability::no("Linux only"))
}

/// GSO and GRO: the socket options exist and are accepted on a UDP socket.
#[cfg(target_os = "linux")]
fn probe_offloads() -> (Capability, Capability) {
    use std::os::fd::AsRawFd;
    let sock = match std::net::UdpSocket::bind("127.0.0.1:0") {
        Ok(s) => s,
        Err(e) => {
            let d = format!("could not open a probe socket: {e}");
            return (Capability::no(d.clone()), Capability::no(d));
        }
    };
    let fd = sock.as_raw_fd();
    let gso = match crate::sys::set_int(fd, libc::SOL_UDP, libc::UDP_SEGMENT, 1200) {
        Ok(()) => Capability::yes("UDP_SEGMENT accepted"),
        Err(e) => Capability::no(format!("UDP_SEGMENT refused ({e}); needs Linux >= 4.18")),
    };
    let gro = match crate::sys::set_int(fd, libc::SOL_UDP, libc::UDP_GRO, 1) {
        Ok(()) => Capability::yes("UDP_GRO accepted"),
        Err(e) => Capability::no(format!("UDP_GRO refused ({e}); needs Linux >= 5.0")),
    };
    (gso, gro)
}

/// How to fix an io_uring setup failure, by errno.
#[cfg(target_os = "linux")]
pub(crate) fn uring_fix_hint(errno: Option<i32>) -> &'static str {
    match errno {
        Some(libc::ENOMEM) => {
            "the locked-memory limit is too small: raise it (`ulimit -l`, systemd LimitMEMLOCK=, \
             /etc/security/limits.conf) or lower BackendConfig::ring_entries / recv_buffers"
        }
        Some(libc::EPERM) | Some(libc::EACCES) => {
            "io_uring is disabled or forbidden: set sysctl kernel.io_uring_disabled=0 (or add the \
             user to kernel.io_uring_group), or allow io_uring in the container's seccomp profile"
        }
        Some(libc::ENOSYS) => {
            "the kernel has no io_uring (needs Linux >= 6.0 for multishot recvmsg)"
        }
        Some(libc::EINVAL) => {
            "the kernel is too old for a feature the uring backend needs (Linux >= 6.0)"
        }
        _ => "see the error above",
    }
}
