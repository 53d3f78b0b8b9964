//! The `mmsg` backend: epoll readiness with `recvmmsg` / `sendmmsg`.
//!
//! One `recvmmsg` takes up to `batch_size` datagrams into one region of
//! `batch_size × max_datagram` bytes; one `sendmmsg` sends up to `batch_size` messages (at
//! least 8), so a larger send batch takes several. GSO
//! entries go out as one message with a `UDP_SEGMENT` control message when the kernel supports
//! it, else segment by segment. The receive arrays are allocated once, at construction; the
//! send arrays when a turn first sends more than one datagram (a turn's single datagram goes
//! out with `sendto`, which needs none, so a light client makes them late or never).
//!
//! The epoll set and the wake-up eventfd are made on first need (the first blocking poll or
//! [`Backend::waker`] call): a backend only ever polled without waiting, as the members of a
//! client set are (the set waits on their sockets with one epoll of its own), holds one
//! descriptor, its socket.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::backend::{Backend, BackendConfig, BackendKind, BackendStats, PollOutcome, Waker};
use crate::batch::{RecvBatch, RecvMeta, SendBatch};
use crate::error::{Error, Result};
use crate::linux::{self, EventFd};
use crate::socket::{BoundSocket, SocketInfo};
use crate::sys::{self, CmsgBuf};

/// Fewest messages one `sendmmsg` may carry, whatever the configured batch size (a client's
/// send batch holds 8 entries at least); more headers would be memory a light sender
/// initialises for nothing.
const MIN_SEND_BATCH: usize = 8;
const TOKEN_SOCKET: u64 = 0;
const TOKEN_WAKER: u64 = 1;

/// The epoll set (socket and eventfd) a blocking poll waits on, and the eventfd that wakes it.
struct Wakeup {
    epoll: OwnedFd,
    waker: Arc<EventFd>,
}

impl Wakeup {
    fn new(socket: RawFd) -> Result<Wakeup> {
        // SAFETY: plain syscall; the result is checked.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return Err(Error::io("epoll_create1", io::Error::last_os_error()));
        }
        // SAFETY: `epfd` is a fresh descriptor nothing else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(epfd) };
        let waker = EventFd::new().map_err(|e| Error::io("eventfd", e))?;
        epoll_ctl(
            epfd,
            libc::EPOLL_CTL_ADD,
            socket,
            libc::EPOLLIN as u32,
            TOKEN_SOCKET,
        )
        .map_err(|e| Error::io("epoll_ctl add socket", e))?;
        epoll_ctl(
            epfd,
            libc::EPOLL_CTL_ADD,
            waker.fd(),
            libc::EPOLLIN as u32,
            TOKEN_WAKER,
        )
        .map_err(|e| Error::io("epoll_ctl add eventfd", e))?;
        Ok(Wakeup { epoll, waker })
    }
}

/// A waker whose eventfd could not be made: every wake reports why.
struct BrokenWaker(String);

impl crate::backend::Wake for BrokenWaker {
    fn wake(&self) -> io::Result<()> {
        Err(io::Error::other(self.0.clone()))
    }
}

/// `len` bytes of receive slots, not initialised. A `Vec` rather than a box: moving the
/// backend then leaves the pointers the receive headers hold into it valid.
fn uninit_region(len: usize) -> Vec<MaybeUninit<u8>> {
    let mut v = Vec::with_capacity(len);
    // SAFETY: the capacity is `len`, and `MaybeUninit<u8>` needs no initialisation.
    unsafe { v.set_len(len) };
    v
}

/// What the kernel needs beside one datagram's bytes: its address, the iovec pointing at the
/// bytes, and a control-message buffer. One array of these per direction, so a backend holds
/// one allocation for them rather than three.
#[derive(Clone, Copy)]
struct Slot {
    name: libc::sockaddr_storage,
    iov: libc::iovec,
    ctrl: CmsgBuf,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            name: sys::zeroed_storage(),
            iov: libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            },
            ctrl: CmsgBuf::new(),
        }
    }
}

/// `n` message headers, each pointing at its slot's address, iovec and (for receiving)
/// control buffer. The slots' heap storage never moves, so the pointers stay valid when the
/// backend does.
fn headers(slots: &mut [Slot], with_ctrl: bool) -> Vec<libc::mmsghdr> {
    slots
        .iter_mut()
        .map(|slot| {
            // SAFETY: all-zero is a valid mmsghdr (null pointers, zero lengths).
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_name = (&mut slot.name as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_iov = &mut slot.iov;
            h.msg_hdr.msg_iovlen = 1;
            if with_ctrl {
                h.msg_hdr.msg_control = slot.ctrl.0.as_mut_ptr().cast();
            }
            h
        })
        .collect()
}

/// Gives a receive header its full buffer sizes again (the kernel shrinks them to what it
/// wrote).
fn reset_rx_header(h: &mut libc::mmsghdr) {
    h.msg_len = 0;
    h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    h.msg_hdr.msg_controllen = std::mem::size_of::<CmsgBuf>() as _;
    h.msg_hdr.msg_flags = 0;
}

/// epoll + `recvmmsg`/`sendmmsg` on one socket.
pub struct MmsgBackend {
    sock: BoundSocket,
    fd: RawFd,
    /// Made on first need (see the module docs).
    wakeup: OnceLock<Wakeup>,
    reason: String,
    max_datagram: usize,
    gso: bool,
    gro: bool,
    /// EPOLLOUT is registered (a send is waiting for room).
    want_out: bool,
    /// The last `recvmmsg` filled every slot, so more may be waiting.
    last_full: bool,
    /// `epoll_pwait2` is missing (ENOSYS): use `epoll_wait` with milliseconds.
    no_pwait2: bool,
    /// Receive slots, left uninitialised: only the bytes `recvmmsg` wrote are ever read, and
    /// zeroing the region would cost every new socket (a client fleet opens thousands) a
    /// pass over it.
    region: Vec<MaybeUninit<u8>>,
    rx_slots: Vec<Slot>,
    rx_hdrs: Vec<libc::mmsghdr>,
    /// Receive headers the last `recvmmsg` may have changed: only those need their sizes back
    /// before the next (see `recv`).
    rx_used: usize,
    metas: Vec<RecvMeta>,
    /// Messages one `sendmmsg` carries at most; the send arrays are made with that many
    /// entries on first need.
    tx_cap: usize,
    tx_slots: Vec<Slot>,
    tx_hdrs: Vec<libc::mmsghdr>,
    /// Per message built: (pending-entry index, segments it carries, ends its entry).
    tx_map: Vec<(usize, usize, bool)>,
    drops: Option<u64>,
    stats: BackendStats,
}

// SAFETY: the raw pointers inside the mmsghdr/iovec arrays point into heap buffers owned by this
// same struct (never shared), or, after a send, into the caller's send batch, which they are
// rewritten from before the next use; so moving the whole struct to another thread is sound.
unsafe impl Send for MmsgBackend {}

impl std::fmt::Debug for MmsgBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmsgBackend")
            .field("local_addr", &self.sock.local_addr())
            .field("gso", &self.gso)
            .field("gro", &self.gro)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Check the sizes every backend relies on.
pub(crate) fn validate(cfg: &BackendConfig) -> Result<()> {
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
    Ok(())
}

/// GRO coalesces up to 64 KiB; a smaller receive buffer would truncate runs.
pub(crate) const GRO_MIN_BUFFER: usize = 65_535;

impl MmsgBackend {
    /// Set up the backend on `sock`. `reason` is what [`Backend::selection_reason`] reports.
    pub fn new(sock: BoundSocket, cfg: &BackendConfig, reason: String) -> Result<Self> {
        validate(cfg)?;
        let fd = sock.as_raw_fd();
        // The offloads only: forcing this backend must not set up io_uring to probe it.
        let (gso_cap, gro_cap) = crate::select::offloads_cached();
        let gso = gso_cap.available;
        let gro = if cfg.gro && gro_cap.available {
            if cfg.max_datagram < GRO_MIN_BUFFER {
                return Err(Error::InvalidConfig(format!(
                    "GRO needs max_datagram >= {GRO_MIN_BUFFER} (coalesced runs reach 64 KiB), got {}",
                    cfg.max_datagram
                )));
            }
            linux::enable_gro(fd).map_err(|e| Error::io("setsockopt UDP_GRO", e))?;
            true
        } else {
            false
        };

        let n = cfg.batch_size;
        let mut b = MmsgBackend {
            fd,
            sock,
            wakeup: OnceLock::new(),
            reason,
            max_datagram: cfg.max_datagram,
            gso,
            gro,
            want_out: false,
            last_full: false,
            no_pwait2: false,
            region: uninit_region(n * cfg.max_datagram),
            rx_slots: vec![Slot::new(); n],
            rx_hdrs: Vec::new(),
            rx_used: n,
            metas: Vec::with_capacity(n),
            tx_cap: n.max(MIN_SEND_BATCH),
            tx_slots: Vec::new(),
            tx_hdrs: Vec::new(),
            tx_map: Vec::new(),
            drops: None,
            stats: BackendStats::default(),
        };
        if b.sock.drop_counting() {
            b.drops = Some(0);
        }
        // Point every receive slot at its part of the region once; the heap buffers never move.
        let base = b.region.as_mut_ptr();
        for (i, slot) in b.rx_slots.iter_mut().enumerate() {
            // SAFETY: i * max_datagram < region.len(), so the pointer stays inside the region.
            slot.iov.iov_base = unsafe { base.add(i * cfg.max_datagram) }.cast();
            slot.iov.iov_len = cfg.max_datagram;
        }
        b.rx_hdrs = headers(&mut b.rx_slots, true);
        Ok(b)
    }

    /// GSO sends go out as one message (the kernel segments); false: split by this backend.
    pub fn gso_enabled(&self) -> bool {
        self.gso
    }

    /// GRO is on for the socket.
    pub fn gro_enabled(&self) -> bool {
        self.gro
    }

    /// Send what `batch` holds until it is empty or the socket is full. Returns entries sent.
    fn send(&mut self, batch: &mut SendBatch) -> usize {
        let mut sent_entries = 0;
        while !batch.is_empty() {
            // One plain datagram (a light client's usual turn): `sendto` needs neither a
            // message header nor an iovec array, in user space or copied into the kernel.
            let single = matches!(batch.pending(), [only] if only.datagrams() == 1);
            let sent = if single {
                let only = &batch.pending()[0];
                sys::send_to(self.fd, &only.dst, batch.payload(only)).map(|_| 1)
            } else {
                let built = self.build_send(batch);
                if built == 0 {
                    break;
                }
                // SAFETY: the first `built` headers point at live names, iovecs (into
                // `batch`'s buffer, which is not touched until the call returns) and control
                // buffers.
                let rc =
                    unsafe { libc::sendmmsg(self.fd, self.tx_hdrs.as_mut_ptr(), built as u32, 0) };
                usize::try_from(rc).map_err(|_| io::Error::last_os_error())
            };
            self.stats.syscalls += 1;
            let rc = match sent {
                Ok(n) => n,
                Err(err) => {
                    if err.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    // ENOBUFS: a device queue is full; like a full socket buffer, try again later.
                    if sys::would_block(&err) || err.raw_os_error() == Some(libc::ENOBUFS) {
                        self.stats.send_would_block += 1;
                        break;
                    }
                    let ends = single || self.tx_map[0].2;
                    let first = batch.pending()[0];
                    if self.gso && first.datagrams() > 1 && linux::is_gso_refusal(&err) {
                        // The device or route cannot take this GSO send (checksum offload off, a
                        // segment over the MTU): split from now on, resending these datagrams.
                        tracing::warn!(error = %err, "UDP GSO send failed; sending segments one by one from now on");
                        self.gso = false;
                        continue;
                    }
                    self.stats.send_errors += 1;
                    linux::log_send_error("mmsg", self.stats.send_errors, &err, &first.dst);
                    if ends {
                        batch.consume(1);
                    } else {
                        batch.consume_segments(1);
                    }
                    continue;
                }
            };
            self.stats.batches_out += 1;
            let (entries, segments) = if single {
                self.stats.datagrams_out += 1;
                (1, 0)
            } else {
                self.account_sent(rc)
            };
            batch.consume(entries);
            if segments > 0 {
                batch.consume_segments(segments);
            }
            sent_entries += entries;
        }
        sent_entries
    }

    /// Fill the send headers from the front of `batch`; returns how many messages.
    fn build_send(&mut self, batch: &SendBatch) -> usize {
        if self.tx_hdrs.is_empty() {
            // The first send of several datagrams: make the arrays (see the module docs).
            self.tx_slots = vec![Slot::new(); self.tx_cap];
            self.tx_hdrs = headers(&mut self.tx_slots, false);
            self.tx_map = Vec::with_capacity(self.tx_cap);
        }
        self.tx_map.clear();
        let cap = self.tx_hdrs.len();
        let mut m = 0;
        for (idx, entry) in batch.pending().iter().enumerate() {
            if m == cap {
                break;
            }
            let payload = batch.payload(entry);
            match entry.segment_size {
                Some(seg) if !self.gso && (seg as usize) < entry.len => {
                    let seg = seg as usize;
                    let count = entry.len.div_ceil(seg);
                    for s in 0..count {
                        if m == cap {
                            break;
                        }
                        let part = &payload[s * seg..((s + 1) * seg).min(entry.len)];
                        self.fill_tx(m, &entry.dst, part, None);
                        self.tx_map.push((idx, 1, s + 1 == count));
                        m += 1;
                    }
                }
                seg => {
                    let gso = seg.filter(|&s| (s as usize) < entry.len);
                    self.fill_tx(m, &entry.dst, payload, gso);
                    self.tx_map.push((idx, entry.datagrams(), true));
                    m += 1;
                }
            }
        }
        m
    }

    fn fill_tx(&mut self, m: usize, dst: &std::net::SocketAddr, payload: &[u8], gso: Option<u16>) {
        let slot = &mut self.tx_slots[m];
        let namelen = sys::encode_addr(dst, &mut slot.name);
        slot.iov.iov_base = payload.as_ptr() as *mut libc::c_void;
        slot.iov.iov_len = payload.len();
        let h = &mut self.tx_hdrs[m].msg_hdr;
        h.msg_namelen = namelen;
        match gso {
            Some(seg) => {
                let len = linux::write_gso_cmsg(&mut slot.ctrl, seg);
                h.msg_control = slot.ctrl.0.as_mut_ptr().cast();
                h.msg_controllen = len as _;
            }
            None => {
                h.msg_control = std::ptr::null_mut();
                h.msg_controllen = 0;
            }
        }
    }

    /// Map `k` sent messages back to (whole entries, segments of the next entry).
    fn account_sent(&mut self, k: usize) -> (usize, usize) {
        let mut entries = 0;
        let mut segments = 0;
        for &(_, datagrams, ends) in &self.tx_map[..k] {
            self.stats.datagrams_out += datagrams as u64;
            if ends {
                entries += 1;
                segments = 0;
            } else {
                segments += 1;
            }
        }
        (entries, segments)
    }

    /// One non-blocking `recvmmsg`; fills `metas`. Returns entries received.
    fn recv(&mut self) -> Result<usize> {
        self.metas.clear();
        let n = self.rx_hdrs.len();
        for h in &mut self.rx_hdrs[..self.rx_used] {
            reset_rx_header(h);
        }
        // The kernel writes a header's sizes back only for a datagram it received, so a call
        // that fails (returns -1) changes none.
        self.rx_used = 0;
        let rc = loop {
            // SAFETY: every header points at live buffers of the advertised sizes, owned by self.
            let rc = unsafe {
                libc::recvmmsg(
                    self.fd,
                    self.rx_hdrs.as_mut_ptr(),
                    n as u32,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            self.stats.syscalls += 1;
            if rc >= 0 {
                // The filled headers; and the one after them, which the kernel tried and left
                // as it was, since restoring it costs nothing and this then holds whatever
                // ends the call.
                self.rx_used = (rc as usize + 1).min(n);
                break rc as usize;
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                _ if sys::would_block(&err) => return Ok(0),
                // ICMP errors queued on the socket (e.g. port unreachable) surface here on some
                // kernels; they say nothing about the datagrams waiting, so read again.
                io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset => continue,
                _ => {
                    // Whatever failed, the next receive restores every header.
                    self.rx_used = n;
                    return Err(Error::io("recvmmsg", err));
                }
            }
        };
        for i in 0..rc {
            let h = &self.rx_hdrs[i];
            let slot = &self.rx_slots[i];
            let Some(src) = sys::decode_addr(&slot.name, h.msg_hdr.msg_namelen) else {
                continue;
            };
            // The field's type differs between libc flavours (usize on glibc, u32 on musl).
            #[allow(clippy::unnecessary_cast)]
            let ctrl_len = (h.msg_hdr.msg_controllen as usize).min(std::mem::size_of::<CmsgBuf>());
            let cm = linux::parse_cmsgs(&slot.ctrl.0[..ctrl_len]);
            if let Some(d) = cm.drops {
                self.drops = Some(u64::from(d));
            }
            let len = (h.msg_len as usize).min(self.max_datagram);
            let truncated = h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            let segment_size = cm.gro_segment.filter(|&s| (s as usize) < len);
            self.stats.datagrams_in += match segment_size {
                Some(s) => len.div_ceil(s as usize) as u64,
                None => 1,
            };
            self.stats.truncated += u64::from(truncated);
            self.metas.push(RecvMeta {
                src,
                offset: i * self.max_datagram,
                len,
                truncated,
                segment_size,
            });
        }
        if !self.metas.is_empty() {
            self.stats.batches_in += 1;
        }
        Ok(self.metas.len())
    }

    /// The epoll set and eventfd, made now if they were not yet.
    fn wakeup(&self) -> Result<&Wakeup> {
        if let Some(w) = self.wakeup.get() {
            return Ok(w);
        }
        let w = Wakeup::new(self.fd)?;
        // Only this backend's owner (or its waker call) gets here; a lost race keeps the first.
        Ok(self.wakeup.get_or_init(|| w))
    }

    fn set_want_out(&mut self, want: bool) -> Result<()> {
        if want != self.want_out {
            let events = libc::EPOLLIN as u32 | if want { libc::EPOLLOUT as u32 } else { 0 };
            epoll_ctl(
                self.wakeup()?.epoll.as_raw_fd(),
                libc::EPOLL_CTL_MOD,
                self.fd,
                events,
                TOKEN_SOCKET,
            )
            .map_err(|e| Error::io("epoll_ctl mod", e))?;
            self.stats.syscalls += 1;
            self.want_out = want;
        }
        Ok(())
    }

    /// Wait for readiness; returns (socket readable, socket writable, woken).
    fn wait(&mut self, timeout: Option<Duration>) -> Result<(bool, bool, bool)> {
        // SAFETY: all-zero epoll_event values are valid.
        let mut events: [libc::epoll_event; 2] = unsafe { std::mem::zeroed() };
        let epfd = self.wakeup()?.epoll.as_raw_fd();
        let rc = loop {
            let rc = if self.no_pwait2 {
                let ms = match timeout {
                    None => -1,
                    // Round up so a sub-millisecond timeout does not become a busy loop.
                    Some(d) => d.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32,
                };
                // SAFETY: `events` has room for 2 entries, as passed.
                unsafe { libc::epoll_wait(epfd, events.as_mut_ptr(), 2, ms) }
            } else {
                let ts = timeout.map(linux::timespec);
                let tsp = ts
                    .as_ref()
                    .map_or(std::ptr::null(), |t| t as *const libc::timespec);
                // SAFETY: `events` has room for 2 entries; `tsp` is null or points at `ts`.
                unsafe { libc::epoll_pwait2(epfd, events.as_mut_ptr(), 2, tsp, std::ptr::null()) }
            };
            self.stats.syscalls += 1;
            if rc >= 0 {
                break rc as usize;
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ENOSYS) if !self.no_pwait2 => self.no_pwait2 = true,
                _ => return Err(Error::io("epoll_wait", err)),
            }
        };
        let (mut readable, mut writable, mut woken) = (false, false, false);
        for ev in &events[..rc] {
            let (token, flags) = (ev.u64, ev.events);
            if token == TOKEN_WAKER {
                woken |= self.wakeup.get().is_some_and(|w| w.waker.drain());
            } else {
                readable |= flags & (libc::EPOLLIN | libc::EPOLLERR) as u32 != 0;
                writable |= flags & libc::EPOLLOUT as u32 != 0;
            }
        }
        Ok((readable, writable, woken))
    }
}

fn epoll_ctl(epfd: RawFd, op: libc::c_int, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: token };
    // SAFETY: `ev` lives across the call.
    let rc = unsafe { libc::epoll_ctl(epfd, op, fd, &mut ev) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Backend for MmsgBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Mmsg
    }

    fn selection_reason(&self) -> &str {
        &self.reason
    }

    fn socket_info(&self) -> &SocketInfo {
        self.sock.info()
    }

    fn waker(&self) -> Waker {
        match self.wakeup() {
            Ok(w) => Waker::new(w.waker.clone()),
            Err(e) => {
                tracing::error!(error = %e, "mmsg backend: cannot make its wake-up eventfd");
                Waker::new(Arc::new(BrokenWaker(e.to_string())))
            }
        }
    }

    fn poll(&mut self, send: &mut SendBatch, timeout: Option<Duration>) -> Result<PollOutcome> {
        let mut out = PollOutcome {
            sent: self.send(send),
            ..PollOutcome::default()
        };
        let deadline = match timeout {
            Some(t) if !t.is_zero() => Instant::now().checked_add(t),
            _ => None,
        };
        // If the last receive left the socket drained (a short batch), wait first: level-
        // triggered epoll returns at once if data came meanwhile, and an idle wake-up then
        // costs epoll_wait + recvmmsg instead of recvmmsg + epoll_wait + recvmmsg.
        let mut try_recv = self.last_full || timeout == Some(Duration::ZERO);
        self.metas.clear();
        loop {
            if try_recv {
                out.received = self.recv()?;
                self.last_full = out.received == self.rx_hdrs.len();
                if out.received > 0 || out.woken || timeout == Some(Duration::ZERO) {
                    break;
                }
            }
            let remaining = match (timeout, deadline) {
                (None, _) => None,
                (Some(_), Some(d)) => {
                    let r = d.saturating_duration_since(Instant::now());
                    if r.is_zero() {
                        if !try_recv {
                            // Out of time before the first look: look once anyway.
                            out.received = self.recv()?;
                        }
                        break;
                    }
                    Some(r)
                }
                // A timeout too large for Instant: treat as no limit.
                (Some(_), None) => None,
            };
            try_recv = true;
            self.set_want_out(!send.is_empty())?;
            let (readable, writable, woken) = self.wait(remaining)?;
            out.woken |= woken;
            if writable && !send.is_empty() {
                out.sent += self.send(send);
            }
            if woken && !readable {
                break;
            }
        }
        // A wake-up that came while nobody waited (a zero-timeout poll reads the socket only)
        // would leave the eventfd, and with it `ready_fd`, readable for good: take it here.
        if !out.woken {
            out.woken = self.wakeup.get().is_some_and(|w| w.waker.take_pending());
        }
        Ok(out)
    }

    fn flush(&mut self, send: &mut SendBatch) -> Result<usize> {
        // Sending never touches the receive region, so the last poll's datagrams stay valid.
        Ok(self.send(send))
    }

    fn received(&self) -> RecvBatch<'_> {
        // SAFETY: each meta's range lies inside its slot and covers only the bytes the last
        // `recvmmsg` wrote there (its length is the kernel's, capped at the slot size); the
        // region is not written again until the next poll, which needs `&mut self`.
        unsafe {
            RecvBatch::from_raw_parts(&self.metas, self.region.as_ptr().cast(), self.region.len())
        }
    }

    fn socket_drops(&self) -> Option<u64> {
        self.drops
    }

    fn stats(&self) -> BackendStats {
        self.stats
    }

    fn ready_fd(&self) -> RawFd {
        // Level-triggered: readable while the socket holds a datagram or the waker fired;
        // before either exists, the socket alone (nothing else can make a poll return).
        self.wakeup.get().map_or(self.fd, |w| w.epoll.as_raw_fd())
    }

    fn needs_poll(&mut self) -> bool {
        self.last_full
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::test_support::{
        self, receive_segments, segmented_payload, woken_from_another_thread,
    };
    use crate::socket::{bind, SocketConfig};

    fn backend(addr: &str, cfg: &BackendConfig) -> MmsgBackend {
        let s = bind(&SocketConfig::new(addr.parse().unwrap())).unwrap();
        MmsgBackend::new(s, cfg, "test".into()).unwrap()
    }

    #[test]
    fn sends_resume_when_the_buffer_drains() {
        let cfg = BackendConfig::default();
        test_support::sends_resume_when_the_buffer_drains(move |s| {
            Box::new(MmsgBackend::new(s, &cfg, "test".into()).unwrap())
        });
    }

    #[test]
    fn sends_keep_their_order_when_the_buffer_fills() {
        let cfg = BackendConfig::default();
        test_support::sends_keep_their_order_when_the_buffer_fills(move |s| {
            Box::new(MmsgBackend::new(s, &cfg, "test".into()).unwrap())
        });
    }

    /// A wake-up taken by a zero-timeout poll (which only reads the socket) is reported and
    /// leaves `ready_fd` quiet; before, the eventfd stayed readable and a set waiting on
    /// `ready_fd` returned at once, turn after turn.
    #[test]
    fn a_zero_timeout_poll_takes_a_wake_up() {
        let cfg = BackendConfig::default();
        let mut b = backend("127.0.0.1:0", &cfg);
        let waker = b.waker();
        let readable = |fd: RawFd| {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, as passed.
            unsafe { libc::poll(&mut p, 1, 0) == 1 }
        };
        assert!(!readable(b.ready_fd()));
        waker.wake().unwrap();
        assert!(readable(b.ready_fd()));
        let mut empty = SendBatch::new(1);
        let out = b.poll(&mut empty, Some(Duration::ZERO)).unwrap();
        assert!(out.woken);
        assert!(!readable(b.ready_fd()), "the wake-up is still pending");
        let out = b.poll(&mut empty, Some(Duration::ZERO)).unwrap();
        assert!(!out.woken);
    }

    #[test]
    fn round_trip_gso_split_and_wake() {
        let cfg = BackendConfig::default();
        let mut rx = backend("127.0.0.1:0", &cfg);
        let mut tx = backend("127.0.0.1:0", &cfg);
        let dst = rx.socket_info().local_addr;
        let mut batch = SendBatch::new(8);
        batch.push(dst, b"hello").unwrap();
        let payload = segmented_payload();
        batch.push_segments(dst, 1000, &payload).unwrap();
        // Exercise the split path too, whatever the kernel supports.
        tx.gso = false;
        let out = tx.poll(&mut batch, Some(Duration::ZERO)).unwrap();
        assert_eq!(out.sent, 2);
        assert!(batch.is_empty());
        assert_eq!(tx.stats().datagrams_out, 4);

        let got = receive_segments(&mut rx, 4, tx.socket_info().local_addr);
        assert_eq!(got[0], b"hello");
        assert_eq!(got[1..].concat(), payload);
        woken_from_another_thread(&mut rx);
    }

    /// Every receive header the next `recvmmsg` will not restore first has its full sizes.
    fn assert_restored_beyond_used(b: &MmsgBackend) {
        for (i, h) in b.rx_hdrs.iter().enumerate().skip(b.rx_used) {
            let full_name = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            assert_eq!(h.msg_hdr.msg_namelen, full_name, "header {i}'s name length");
            #[allow(clippy::unnecessary_cast)]
            let ctrl = h.msg_hdr.msg_controllen as usize;
            assert_eq!(
                ctrl,
                std::mem::size_of::<CmsgBuf>(),
                "header {i}'s control length"
            );
        }
    }

    /// A one-datagram send the kernel refuses (an IPv6 destination from an IPv4 socket) is
    /// counted and dropped, and the next one goes out: `sendto`'s accounting matches
    /// `sendmmsg`'s.
    #[test]
    fn a_refused_single_send_is_counted_and_the_next_goes_out() {
        let cfg = BackendConfig::default();
        let mut rx = backend("127.0.0.1:0", &cfg);
        let mut tx = backend("127.0.0.1:0", &cfg);
        let mut batch = SendBatch::new(8);
        batch.push("[::1]:9".parse().unwrap(), b"nowhere").unwrap();
        let out = tx.poll(&mut batch, Some(Duration::ZERO)).unwrap();
        assert_eq!(out.sent, 0);
        assert!(
            batch.is_empty(),
            "the refused datagram is dropped, not retried"
        );
        let stats = tx.stats();
        assert_eq!(
            (stats.send_errors, stats.datagrams_out, stats.batches_out),
            (1, 0, 0)
        );
        batch.push(rx.socket_info().local_addr, b"hello").unwrap();
        assert_eq!(tx.poll(&mut batch, Some(Duration::ZERO)).unwrap().sent, 1);
        let stats = tx.stats();
        assert_eq!(
            (stats.send_errors, stats.datagrams_out, stats.batches_out),
            (1, 1, 1)
        );
        assert!(
            tx.tx_hdrs.is_empty(),
            "single datagrams need no send arrays"
        );
        let got = receive_segments(&mut rx, 1, tx.socket_info().local_addr);
        assert_eq!(got, vec![b"hello".to_vec()]);
    }

    /// Receives of different sizes one after another, from two senders: each datagram comes
    /// whole and with its own source (a receive restores only the headers the last one used),
    /// and one-datagram sends (`sendto`, no send arrays) mix with batched ones.
    #[test]
    fn receives_of_every_size_keep_lengths_and_sources() {
        // A client's receive settings (GRO on), with a small batch.
        let cfg = BackendConfig {
            batch_size: 4,
            max_datagram: 65_536,
            gro: true,
            ..BackendConfig::default()
        };
        let mut rx = backend("127.0.0.1:0", &cfg);
        let (mut a, mut b) = (backend("127.0.0.1:0", &cfg), backend("127.0.0.1:0", &cfg));
        let dst = rx.socket_info().local_addr;
        let mut empty = SendBatch::new(1);
        // Bursts of 3, 1, 6 (more than the receive batch) and 1 datagrams, each one of a size
        // no other has (no GRO run forms), from `a` and `b` in turn.
        let mut size = 100;
        for (round, burst) in [3usize, 1, 6, 1].into_iter().enumerate() {
            let (tx, other) = if round % 2 == 0 {
                (&mut a, &b)
            } else {
                (&mut b, &a)
            };
            let from = tx.socket_info().local_addr;
            assert_ne!(from, other.socket_info().local_addr);
            let mut batch = SendBatch::new(8);
            let sizes: Vec<usize> = (0..burst).map(|k| size + 7 * k).collect();
            size += 100;
            for (k, &len) in sizes.iter().enumerate() {
                batch.push(dst, &vec![k as u8; len]).unwrap();
            }
            assert_eq!(
                tx.poll(&mut batch, Some(Duration::ZERO)).unwrap().sent,
                burst
            );
            let mut got = Vec::new();
            while got.len() < burst {
                let out = rx.poll(&mut empty, Some(Duration::from_secs(5))).unwrap();
                assert!(out.received > 0, "timed out");
                assert_restored_beyond_used(&rx);
                for d in rx.received().iter() {
                    assert_eq!(d.src, from);
                    let segments: Vec<&[u8]> = d.segments().collect();
                    assert_eq!(segments.len(), 1);
                    got.push(segments[0].to_vec());
                }
            }
            for (k, (datagram, &len)) in got.iter().zip(&sizes).enumerate() {
                assert_eq!(datagram, &vec![k as u8; len]);
            }
        }
        // A GSO run after all that: where the kernel coalesces it (GRO), the segment size
        // comes in a control message, which needs the header's full control buffer back.
        let payload = segmented_payload();
        let mut batch = SendBatch::new(8);
        batch.push_segments(dst, 1000, &payload).unwrap();
        assert_eq!(a.poll(&mut batch, Some(Duration::ZERO)).unwrap().sent, 1);
        let got = receive_segments(&mut rx, 3, a.socket_info().local_addr);
        assert!(
            got.iter().all(|s| s.len() <= 1000),
            "a coalesced run came as one datagram"
        );
        assert_eq!(got.concat(), payload);
        // Only the sender that sent several datagrams at once made send arrays.
        assert!(!a.tx_hdrs.is_empty());
        assert!(b.tx_hdrs.is_empty());
    }
}
