//! The `mmsg` backend: epoll readiness with `recvmmsg` / `sendmmsg`.
//!
//! One `recvmmsg` takes up to `batch_size` datagrams into one region of
//! `batch_size × max_datagram` bytes; one `sendmmsg` sends up to `batch_size` messages (at
//! least 8), so a larger send batch takes several. GSO
//! entries go out as one message with a `UDP_SEGMENT` control message when the kernel supports
//! it, else segment by segment. All per-datagram arrays are allocated once, at construction.
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

/// Fewest messages one `sendmmsg` may carry, whatever the configured batch size. A client's
/// send batch holds 8 entries at least; more headers would be memory each new socket zeroes
/// for nothing.
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
    rx_names: Vec<libc::sockaddr_storage>,
    rx_iov: Vec<libc::iovec>,
    rx_ctrl: Vec<CmsgBuf>,
    rx_hdrs: Vec<libc::mmsghdr>,
    metas: Vec<RecvMeta>,
    tx_names: Vec<libc::sockaddr_storage>,
    tx_iov: Vec<libc::iovec>,
    tx_ctrl: Vec<CmsgBuf>,
    tx_hdrs: Vec<libc::mmsghdr>,
    /// Per message built: (pending-entry index, segments it carries, ends its entry).
    tx_map: Vec<(usize, usize, bool)>,
    drops: Option<u64>,
    stats: BackendStats,
}

// SAFETY: the raw pointers inside the mmsghdr/iovec arrays point only into heap buffers owned
// by this same struct (never shared), so moving the whole struct to another thread is sound.
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
        let caps = crate::select::probe_cached();
        let gso = caps.gso.available;
        let gro = if cfg.gro && caps.gro.available {
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
        let tx_n = n.max(MIN_SEND_BATCH);
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
            rx_names: vec![sys::zeroed_storage(); n],
            rx_iov: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                n
            ],
            rx_ctrl: vec![CmsgBuf::new(); n],
            // SAFETY: all-zero is a valid mmsghdr (null pointers, zero lengths).
            rx_hdrs: vec![unsafe { std::mem::zeroed() }; n],
            metas: Vec::with_capacity(n),
            tx_names: vec![sys::zeroed_storage(); tx_n],
            tx_iov: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                tx_n
            ],
            tx_ctrl: vec![CmsgBuf::new(); tx_n],
            // SAFETY: as above.
            tx_hdrs: vec![unsafe { std::mem::zeroed() }; tx_n],
            tx_map: Vec::with_capacity(tx_n),
            drops: None,
            stats: BackendStats::default(),
        };
        if b.sock.drop_counting() {
            b.drops = Some(0);
        }
        // Point every receive header at its slot once; the heap buffers never move.
        let base = b.region.as_mut_ptr();
        for i in 0..n {
            // SAFETY: i * max_datagram < region.len(), so the pointer stays inside the region.
            b.rx_iov[i].iov_base = unsafe { base.add(i * cfg.max_datagram) }.cast();
            b.rx_iov[i].iov_len = cfg.max_datagram;
            let h = &mut b.rx_hdrs[i].msg_hdr;
            h.msg_name = (&mut b.rx_names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_iov = &mut b.rx_iov[i];
            h.msg_iovlen = 1;
            h.msg_control = b.rx_ctrl[i].0.as_mut_ptr().cast();
        }
        for i in 0..tx_n {
            let h = &mut b.tx_hdrs[i].msg_hdr;
            h.msg_name = (&mut b.tx_names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_iov = &mut b.tx_iov[i];
            h.msg_iovlen = 1;
        }
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
            let built = self.build_send(batch);
            if built == 0 {
                break;
            }
            let h0 = &self.tx_hdrs[0].msg_hdr;
            let rc = if built == 1 && h0.msg_controllen == 0 && h0.msg_iovlen == 1 {
                // One plain datagram (a light client's usual turn): `sendto` skips copying a
                // message header and an iovec array in from user space.
                // SAFETY: the header has exactly one iovec (checked above); it and the name
                // point at live memory (`batch`'s buffer and `tx_names[0]`) of the lengths
                // given, untouched during the call.
                let n = unsafe {
                    let iov = &*h0.msg_iov;
                    libc::sendto(
                        self.fd,
                        iov.iov_base,
                        iov.iov_len,
                        0,
                        h0.msg_name.cast(),
                        h0.msg_namelen,
                    )
                };
                if n < 0 {
                    -1
                } else {
                    1
                }
            } else {
                // SAFETY: the first `built` headers point at live names, iovecs (into
                // `batch`'s buffer, which is not touched until the call returns) and control
                // buffers.
                unsafe { libc::sendmmsg(self.fd, self.tx_hdrs.as_mut_ptr(), built as u32, 0) }
            };
            self.stats.syscalls += 1;
            if rc < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // ENOBUFS: a device queue is full; like a full socket buffer, try again later.
                if sys::would_block(&err) || err.raw_os_error() == Some(libc::ENOBUFS) {
                    self.stats.send_would_block += 1;
                    break;
                }
                let (_, _, ends) = self.tx_map[0];
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
            let k = rc as usize;
            self.stats.batches_out += 1;
            let (entries, segments) = self.account_sent(k);
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
        let namelen = sys::encode_addr(dst, &mut self.tx_names[m]);
        self.tx_iov[m].iov_base = payload.as_ptr() as *mut libc::c_void;
        self.tx_iov[m].iov_len = payload.len();
        let h = &mut self.tx_hdrs[m].msg_hdr;
        h.msg_namelen = namelen;
        match gso {
            Some(seg) => {
                let len = linux::write_gso_cmsg(&mut self.tx_ctrl[m], seg);
                let h = &mut self.tx_hdrs[m].msg_hdr;
                h.msg_control = self.tx_ctrl[m].0.as_mut_ptr().cast();
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
        for i in 0..n {
            let h = &mut self.rx_hdrs[i];
            h.msg_len = 0;
            h.msg_hdr.msg_namelen =
                std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_controllen = std::mem::size_of::<CmsgBuf>() as _;
            h.msg_hdr.msg_flags = 0;
        }
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
                break rc as usize;
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                _ if sys::would_block(&err) => return Ok(0),
                // ICMP errors queued on the socket (e.g. port unreachable) surface here on some
                // kernels; they say nothing about the datagrams waiting, so read again.
                io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset => continue,
                _ => return Err(Error::io("recvmmsg", err)),
            }
        };
        for i in 0..rc {
            let h = &self.rx_hdrs[i];
            let Some(src) = sys::decode_addr(&self.rx_names[i], h.msg_hdr.msg_namelen) else {
                continue;
            };
            // The field's type differs between libc flavours (usize on glibc, u32 on musl).
            #[allow(clippy::unnecessary_cast)]
            let ctrl_len = (h.msg_hdr.msg_controllen as usize).min(std::mem::size_of::<CmsgBuf>());
            let cm = linux::parse_cmsgs(&self.rx_ctrl[i].0[..ctrl_len]);
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
        receive_segments, segmented_payload, woken_from_another_thread,
    };
    use crate::socket::{bind, SocketConfig};

    fn backend(addr: &str, cfg: &BackendConfig) -> MmsgBackend {
        let s = bind(&SocketConfig::new(addr.parse().unwrap())).unwrap();
        MmsgBackend::new(s, cfg, "test".into()).unwrap()
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
}
