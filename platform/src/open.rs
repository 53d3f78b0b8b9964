//! Opening a backend at run time: the full capability probe (it sets up an io_uring to see what
//! works), `RICOCHET_BACKEND`, and the fallback from `uring` to `mmsg` with one clear log line.
//! The facts the backends themselves read live below, in [`crate::select`].
//!
//! Environment variables:
//! - `RICOCHET_BACKEND=auto|uring|mmsg|kqueue` forces a backend (see [`BACKEND_ENV`]).
//! - `RICOCHET_URING_FAIL=enomem|eperm|enosys` makes io_uring setup fail in [`open`] as if the
//!   kernel had returned that error, to exercise (and demonstrate) the fallback path.

#[cfg(target_os = "linux")]
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::backend::{Backend, BackendConfig, BackendKind, BACKEND_ENV};
use crate::error::{Error, Result};
#[cfg(target_os = "linux")]
use crate::select::uring_fix_hint;
use crate::select::Capability;
use crate::socket::BoundSocket;

/// Environment variable that makes io_uring setup fail on purpose (`enomem`, `eperm`, `enosys`).
pub const URING_FAIL_ENV: &str = "RICOCHET_URING_FAIL";

/// What the host's kernel supports, probed once per process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// An io_uring instance of the default size can be set up.
    pub io_uring: Capability,
    /// Multishot `recvmsg` (`IORING_RECV_MULTISHOT` on `IORING_OP_RECVMSG`, Linux ≥ 6.0).
    pub multishot_recvmsg: Capability,
    /// Provided-buffer rings (`IORING_REGISTER_PBUF_RING`, Linux ≥ 5.19).
    pub buffer_rings: Capability,
    /// UDP generic segmentation offload on send (`UDP_SEGMENT`).
    pub gso: Capability,
    /// UDP generic receive offload (`UDP_GRO`).
    pub gro: Capability,
}

impl Capabilities {
    /// The `uring` backend can run: io_uring, multishot `recvmsg` and buffer rings all work.
    pub fn uring_usable(&self) -> bool {
        self.io_uring.available && self.multishot_recvmsg.available && self.buffer_rings.available
    }

    /// The backends usable here, best first (`auto` picks the first).
    pub fn backends(&self) -> Vec<BackendKind> {
        let mut v = Vec::new();
        if cfg!(target_os = "linux") {
            if self.uring_usable() {
                v.push(BackendKind::Uring);
            }
            v.push(BackendKind::Mmsg);
        }
        if cfg!(target_vendor = "apple") {
            v.push(BackendKind::Kqueue);
        }
        v
    }
}

/// Probe the kernel's capabilities (once per process; later calls return the cached result).
pub fn probe() -> &'static Capabilities {
    probe_cached()
}

/// The cached probe result.
pub(crate) fn probe_cached() -> &'static Capabilities {
    static CAPS: OnceLock<Capabilities> = OnceLock::new();
    CAPS.get_or_init(probe_now)
}

#[cfg(target_os = "linux")]
fn probe_now() -> Capabilities {
    let (io_uring, multishot_recvmsg, buffer_rings) = crate::linux::uring::probe();
    let (gso, gro) = crate::select::offloads_cached().clone();
    Capabilities {
        io_uring,
        multishot_recvmsg,
        buffer_rings,
        gso,
        gro,
    }
}

#[cfg(not(target_os = "linux"))]
fn probe_now() -> Capabilities {
    let na = || Capability::no("Linux only");
    Capabilities {
        io_uring: na(),
        multishot_recvmsg: na(),
        buffer_rings: na(),
        gso: na(),
        gro: na(),
    }
}

/// The errno that `RICOCHET_URING_FAIL` asks io_uring setup to fail with, if set.
#[cfg(target_os = "linux")]
pub(crate) fn forced_uring_failure() -> Result<Option<i32>> {
    let Ok(v) = std::env::var(URING_FAIL_ENV) else {
        return Ok(None);
    };
    match v.trim().to_ascii_lowercase().as_str() {
        "" | "0" | "no" => Ok(None),
        "enomem" => Ok(Some(libc::ENOMEM)),
        "eperm" => Ok(Some(libc::EPERM)),
        "enosys" => Ok(Some(libc::ENOSYS)),
        other => Err(Error::InvalidConfig(format!(
            "{URING_FAIL_ENV}={other:?}: expected enomem, eperm or enosys"
        ))),
    }
}

/// The backend kind to use: `RICOCHET_BACKEND` if set, else `cfg.kind`.
fn requested_kind(cfg: &BackendConfig) -> Result<(BackendKind, bool)> {
    match std::env::var(BACKEND_ENV) {
        Ok(v) if !v.trim().is_empty() => Ok((v.parse()?, true)),
        _ => Ok((cfg.kind, false)),
    }
}

/// Log the fallback line once per process (every worker opens a backend; one line suffices).
#[cfg(target_os = "linux")]
fn warn_fallback(reason: &str) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!("{reason}");
    } else {
        tracing::debug!("{reason}");
    }
}

/// Open the backend `cfg` asks for (or `RICOCHET_BACKEND` forces) on `socket`.
///
/// `auto` picks `uring` when the probe says it works and its setup succeeds, else `mmsg`
/// (logging one warning line with the reason and the fix); on macOS it picks `kqueue`. Asking
/// explicitly for a backend that cannot run is an error, not a silent fallback.
pub fn open(socket: BoundSocket, cfg: &BackendConfig) -> Result<Box<dyn Backend>> {
    let (kind, forced) = requested_kind(cfg)?;
    let how = if forced {
        format!("{BACKEND_ENV}={}", kind.as_str())
    } else {
        format!("configured {}", kind.as_str())
    };
    imp::open(socket, cfg, kind, &how)
}

#[cfg(target_os = "linux")]
mod imp {
    use super::*;
    use crate::linux::{MmsgBackend, UringBackend};

    pub(super) fn open(
        socket: BoundSocket,
        cfg: &BackendConfig,
        kind: BackendKind,
        how: &str,
    ) -> Result<Box<dyn Backend>> {
        // A malformed RICOCHET_URING_FAIL is an error whatever the backend, not a fallback.
        forced_uring_failure()?;
        match kind {
            BackendKind::Mmsg => Ok(Box::new(MmsgBackend::new(
                socket,
                cfg,
                format!("{how}: epoll+mmsg"),
            )?)),
            BackendKind::Uring => match try_uring(socket, cfg, how) {
                Ok(b) => Ok(Box::new(b)),
                Err(failed) => Err(failed.0),
            },
            BackendKind::Auto => match try_uring(socket, cfg, how) {
                Ok(b) => Ok(Box::new(b)),
                Err(failed) => {
                    let (e, socket) = *failed;
                    let errno = match &e {
                        Error::Io { source, .. } => source.raw_os_error(),
                        _ => None,
                    };
                    // The probe's reason already names the fix; an errno from setup gets its hint.
                    let reason = match errno {
                        Some(_) => format!(
                            "{how}: io_uring unavailable ({e}); falling back to epoll+mmsg. To use io_uring: {}",
                            uring_fix_hint(errno)
                        ),
                        None => format!("{how}: io_uring unavailable ({e}); falling back to epoll+mmsg"),
                    };
                    warn_fallback(&reason);
                    Ok(Box::new(MmsgBackend::new(socket, cfg, reason)?))
                }
            },
            BackendKind::Kqueue => Err(Error::BackendUnavailable {
                backend: "kqueue",
                reason: "kqueue exists on macOS/BSD only; use uring or mmsg on Linux".into(),
            }),
        }
    }

    /// Set up the uring backend; on failure hand the socket back for the fallback.
    fn try_uring(
        socket: BoundSocket,
        cfg: &BackendConfig,
        how: &str,
    ) -> std::result::Result<UringBackend, Box<(Error, BoundSocket)>> {
        match forced_uring_failure() {
            Err(e) => return Err(Box::new((e, socket))),
            Ok(Some(errno)) => {
                let e = Error::io(
                    "io_uring_setup (forced by RICOCHET_URING_FAIL)",
                    std::io::Error::from_raw_os_error(errno),
                );
                return Err(Box::new((e, socket)));
            }
            Ok(None) => {}
        }
        let caps = probe_cached();
        if !caps.uring_usable() {
            let why = [&caps.io_uring, &caps.multishot_recvmsg, &caps.buffer_rings]
                .into_iter()
                .find(|c| !c.available)
                .map(|c| c.detail.clone())
                .unwrap_or_default();
            return Err(Box::new((
                Error::BackendUnavailable {
                    backend: "uring",
                    reason: why,
                },
                socket,
            )));
        }
        UringBackend::new(
            socket,
            cfg,
            format!("{how}: io_uring (multishot recvmsg, provided-buffer ring)"),
        )
    }
}

#[cfg(target_vendor = "apple")]
mod imp {
    use super::*;
    use crate::apple::KqueueBackend;

    pub(super) fn open(
        socket: BoundSocket,
        cfg: &BackendConfig,
        kind: BackendKind,
        how: &str,
    ) -> Result<Box<dyn Backend>> {
        match kind {
            BackendKind::Auto | BackendKind::Kqueue => Ok(Box::new(KqueueBackend::new(
                socket,
                cfg,
                format!("{how}: kqueue"),
            )?)),
            BackendKind::Uring | BackendKind::Mmsg => Err(Error::BackendUnavailable {
                backend: kind.as_str(),
                reason: "Linux only; use kqueue (or auto) on macOS".into(),
            }),
        }
    }
}

#[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
mod imp {
    use super::*;

    pub(super) fn open(
        _: BoundSocket,
        _: &BackendConfig,
        kind: BackendKind,
        _: &str,
    ) -> Result<Box<dyn Backend>> {
        Err(Error::BackendUnavailable {
            backend: kind.as_str(),
            reason: "no datagram backend for this operating system".into(),
        })
    }
}
