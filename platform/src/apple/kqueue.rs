//! The `kqueue` backend: kqueue readiness, then `recvmsg` / `sendto` in a loop.
//!
//! Deliberately thin. Darwin's batched `recvmsg_x`/`sendmsg_x` are private API and are not
//! used (no runtime probe yet); macOS has no UDP GSO/GRO, so GSO entries are sent segment by
//! segment, and no per-socket drop counter (`socket_drops()` is `None`). The wake-up is an
//! `EVFILT_USER` event triggered from the other thread.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{Backend, BackendConfig, BackendKind, BackendStats, PollOutcome, Wake, Waker};
use crate::batch::{RecvBatch, RecvMeta, SendBatch};
use crate::error::{Error, Result};
use crate::socket::{BoundSocket, SocketInfo};
use crate::sys;

const WAKE_IDENT: usize = 1;

/// The kqueue descriptor, shared with the waker.
#[derive(Debug)]
struct Kq(OwnedFd);

impl Kq {
    fn change(&self, ident: usize, filter: i16, flags: u16, fflags: u32) -> io::Result<()> {
        // SAFETY: all-zero is a valid kevent.
        let mut ev: libc::kevent = unsafe { std::mem::zeroed() };
        ev.ident = ident;
        ev.filter = filter;
        ev.flags = flags;
        ev.fflags = fflags;
        // SAFETY: one change from `ev`, no event list; a null timeout is allowed.
        let rc = unsafe {
            libc::kevent(
                self.0.as_raw_fd(),
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
}

impl Wake for Kq {
    fn wake(&self) -> io::Result<()> {
        self.change(WAKE_IDENT, libc::EVFILT_USER, 0, libc::NOTE_TRIGGER)
    }
}

/// kqueue + `recvmsg`/`sendto` on one socket.
pub struct KqueueBackend {
    sock: BoundSocket,
    fd: RawFd,
    kq: Arc<Kq>,
    reason: String,
    batch: usize,
    max_datagram: usize,
    want_write: bool,
    region: Vec<u8>,
    metas: Vec<RecvMeta>,
    stats: BackendStats,
    /// Someone asked for [`Backend::ready_fd`] (a readiness set waits on the kqueue), so a
    /// poll that did not wait must scan the queue's events to keep the descriptor honest.
    watched: AtomicBool,
}

impl std::fmt::Debug for KqueueBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KqueueBackend")
            .field("local_addr", &self.sock.local_addr())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl KqueueBackend {
    /// Set up the backend on `sock`. `reason` is what [`Backend::selection_reason`] reports.
    pub fn new(sock: BoundSocket, cfg: &BackendConfig, reason: String) -> Result<Self> {
        if cfg.batch_size == 0 || cfg.batch_size > 4096 {
            return Err(Error::InvalidConfig(format!(
                "batch_size {} is not in 1..=4096",
                cfg.batch_size
            )));
        }
        if cfg.max_datagram == 0 || cfg.max_datagram > 1 << 20 {
            return Err(Error::InvalidConfig(format!(
                "max_datagram {} is not in 1..=1048576",
                cfg.max_datagram
            )));
        }
        // SAFETY: plain syscall; the result is checked.
        let kfd = unsafe { libc::kqueue() };
        if kfd < 0 {
            return Err(Error::io("kqueue", io::Error::last_os_error()));
        }
        // SAFETY: `kfd` is a fresh descriptor nothing else owns.
        let kq = Arc::new(Kq(unsafe { OwnedFd::from_raw_fd(kfd) }));
        let fd = sock.as_raw_fd();
        kq.change(fd as usize, libc::EVFILT_READ, libc::EV_ADD, 0)
            .map_err(|e| Error::io("kevent add read", e))?;
        kq.change(
            WAKE_IDENT,
            libc::EVFILT_USER,
            libc::EV_ADD | libc::EV_CLEAR,
            0,
        )
        .map_err(|e| Error::io("kevent add user", e))?;
        Ok(KqueueBackend {
            sock,
            fd,
            kq,
            reason,
            batch: cfg.batch_size,
            max_datagram: cfg.max_datagram,
            want_write: false,
            region: vec![0u8; cfg.batch_size * cfg.max_datagram],
            metas: Vec::with_capacity(cfg.batch_size),
            stats: BackendStats::default(),
            watched: AtomicBool::new(false),
        })
    }

    /// One `sendto`; Ok(false) when the socket is full.
    fn send_one(&mut self, dst: &std::net::SocketAddr, payload: &[u8]) -> Result<bool> {
        loop {
            let sent = sys::send_to(self.fd, dst, payload);
            self.stats.syscalls += 1;
            let Err(err) = sent else {
                self.stats.datagrams_out += 1;
                return Ok(true);
            };
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if sys::would_block(&err) || err.raw_os_error() == Some(libc::ENOBUFS) {
                self.stats.send_would_block += 1;
                return Ok(false);
            }
            self.stats.send_errors += 1;
            if self.stats.send_errors == 1 || self.stats.send_errors % 1024 == 0 {
                tracing::warn!(backend = "kqueue", %dst, error = %err, "UDP send failed; datagram dropped");
            }
            return Ok(true);
        }
    }

    /// Send from the front of `batch` until it is empty or the socket is full.
    fn send(&mut self, batch: &mut SendBatch) -> Result<usize> {
        let mut sent = 0;
        let mut any = false;
        while let Some(&entry) = batch.pending().first() {
            match entry.segment_size {
                Some(seg) if (seg as usize) < entry.len => {
                    // No GSO on macOS: one datagram per segment, consumed as it goes.
                    let part_len = (seg as usize).min(entry.len);
                    let ok = self.send_one(&entry.dst, &batch.payload(&entry)[..part_len])?;
                    if !ok {
                        break;
                    }
                    any = true;
                    let before = batch.len();
                    batch.consume_segments(1);
                    if batch.len() < before {
                        sent += 1;
                    }
                }
                _ => {
                    if !self.send_one(&entry.dst, batch.payload(&entry))? {
                        break;
                    }
                    any = true;
                    batch.consume(1);
                    sent += 1;
                }
            }
        }
        if any {
            self.stats.batches_out += 1;
        }
        Ok(sent)
    }

    /// `recvmsg` until the socket is empty or the batch is full.
    fn recv(&mut self) -> Result<usize> {
        self.metas.clear();
        while self.metas.len() < self.batch {
            let slot = self.metas.len();
            let offset = slot * self.max_datagram;
            let mut name = sys::zeroed_storage();
            let mut iov = libc::iovec {
                iov_base: self.region[offset..].as_mut_ptr().cast(),
                iov_len: self.max_datagram,
            };
            // SAFETY: all-zero is a valid msghdr.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
            msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            // SAFETY: `msg` points at `name` and at `max_datagram` bytes of the region.
            let rc = unsafe { libc::recvmsg(self.fd, &mut msg, 0) };
            self.stats.syscalls += 1;
            if rc < 0 {
                let err = io::Error::last_os_error();
                match err.kind() {
                    io::ErrorKind::Interrupted => continue,
                    _ if sys::would_block(&err) => break,
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset => continue,
                    _ => return Err(Error::io("recvmsg", err)),
                }
            }
            let Some(src) = sys::decode_addr(&name, msg.msg_namelen) else {
                continue;
            };
            let truncated = msg.msg_flags & libc::MSG_TRUNC != 0;
            self.stats.datagrams_in += 1;
            self.stats.truncated += u64::from(truncated);
            self.metas.push(RecvMeta {
                src,
                offset,
                len: (rc as usize).min(self.max_datagram),
                truncated,
                segment_size: None,
            });
        }
        if !self.metas.is_empty() {
            self.stats.batches_in += 1;
        }
        Ok(self.metas.len())
    }

    /// Wait for events; returns (readable, writable, woken).
    fn wait(&mut self, timeout: Option<Duration>) -> Result<(bool, bool, bool)> {
        // SAFETY: all-zero kevents are valid.
        let mut events: [libc::kevent; 3] = unsafe { std::mem::zeroed() };
        let ts = timeout.map(|d| libc::timespec {
            tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        });
        let tsp = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        let n = loop {
            // SAFETY: no changes; `events` has room for 3 entries; `tsp` is null or valid.
            let rc = unsafe {
                libc::kevent(
                    self.kq.0.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    events.as_mut_ptr(),
                    3,
                    tsp,
                )
            };
            self.stats.syscalls += 1;
            if rc >= 0 {
                break rc as usize;
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(Error::io("kevent wait", err));
            }
        };
        let (mut r, mut w, mut woken) = (false, false, false);
        for ev in &events[..n] {
            match ev.filter {
                libc::EVFILT_USER => woken = true,
                libc::EVFILT_READ => r = true,
                libc::EVFILT_WRITE => w = true,
                _ => {}
            }
        }
        Ok((r, w, woken))
    }

    fn set_want_write(&mut self, want: bool) -> Result<()> {
        if want != self.want_write {
            let flags = if want { libc::EV_ADD } else { libc::EV_DELETE };
            self.kq
                .change(self.fd as usize, libc::EVFILT_WRITE, flags, 0)
                .map_err(|e| Error::io("kevent write interest", e))?;
            self.want_write = want;
        }
        Ok(())
    }
}

impl Backend for KqueueBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Kqueue
    }

    fn selection_reason(&self) -> &str {
        &self.reason
    }

    fn socket_info(&self) -> &SocketInfo {
        self.sock.info()
    }

    fn waker(&self) -> Waker {
        Waker::new(self.kq.clone())
    }

    fn poll(&mut self, send: &mut SendBatch, timeout: Option<Duration>) -> Result<PollOutcome> {
        let mut out = PollOutcome {
            sent: self.send(send)?,
            ..PollOutcome::default()
        };
        let deadline = match timeout {
            Some(t) if !t.is_zero() => Instant::now().checked_add(t),
            _ => None,
        };
        let mut waited = false;
        loop {
            out.received = self.recv()?;
            if out.received > 0 || out.woken || timeout == Some(Duration::ZERO) {
                break;
            }
            let remaining = match deadline {
                Some(d) => {
                    let r = d.saturating_duration_since(Instant::now());
                    if r.is_zero() {
                        break;
                    }
                    Some(r)
                }
                None => None,
            };
            self.set_want_write(!send.is_empty())?;
            let (readable, writable, woken) = self.wait(remaining)?;
            waited = true;
            out.woken |= woken;
            if writable && !send.is_empty() {
                out.sent += self.send(send)?;
            }
            if woken && !readable {
                break;
            }
        }
        if !waited && self.watched.load(Ordering::Relaxed) {
            // The socket's read event and a wake-up stay queued, and the kqueue descriptor
            // readable, until a `kevent` call scans them, even once the socket is drained: a
            // set waiting on `ready_fd` would return at once, turn after turn. Scan now.
            let (_, _, woken) = self.wait(Some(Duration::ZERO))?;
            out.woken |= woken;
        }
        Ok(out)
    }

    fn flush(&mut self, send: &mut SendBatch) -> Result<usize> {
        // Sending never touches the receive region, so the last poll's datagrams stay valid.
        self.send(send)
    }

    fn received(&self) -> RecvBatch<'_> {
        RecvBatch::new(&self.metas, &self.region)
    }

    fn socket_drops(&self) -> Option<u64> {
        None
    }

    fn stats(&self) -> BackendStats {
        self.stats
    }

    fn ready_fd(&self) -> RawFd {
        // A kqueue descriptor is readable while it has pending events (the socket's
        // level-triggered read filter, or the wake-up).
        self.watched.store(true, Ordering::Relaxed);
        self.kq.0.as_raw_fd()
    }

    fn needs_poll(&mut self) -> bool {
        false
    }
}
