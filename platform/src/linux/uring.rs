//! The `uring` backend: io_uring with a multishot `recvmsg` into a provided-buffer ring.
//!
//! Each [`Backend::poll`] is one `io_uring_enter` that submits the send SQEs (and any re-arm)
//! and waits, with a timeout, for the sends to complete plus one more completion (a datagram
//! or a wake-up). Receive buffers used by one poll go back to the ring at the start of the
//! next, so the datagrams stay readable in between. When the ring runs dry the kernel ends the
//! multishot receive (`ENOBUFS`); the next poll returns the buffers and re-arms it.
//!
//! Sends carry `MSG_DONTWAIT`, so a full socket buffer completes them with `EAGAIN` during the
//! submission instead of parking them in the kernel; those entries stay in the batch, and a
//! one-shot `POLLOUT` poll on the socket ends the wait when the buffer drains, so they go out
//! then rather than at the caller's next timer.
//!
//! Unlinked sends are issued one after another during the submission, but each on its own:
//! when the buffer refuses one, a later one may still find room that the link freed in
//! between, and would leave first. So a round holds only as many sends as the buffer is known
//! to take whole, but for the last: the socket's charge (`SIOCOUTQ`, read when the running
//! estimate gets near the limit) plus an upper bound of what each send adds stays below the
//! buffer's size. A refusal can then only hit a round's last send, which goes first in the
//! next round, and datagrams leave in the order given. With the large buffers servers use
//! that costs nothing; a small or full buffer makes rounds short, when the link, not the
//! submissions, sets the pace. (Linking the sends with `IO_LINK` would also keep the order,
//! but each linked send waits for a task-work pass after its predecessor completes.)

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::backend::{Backend, BackendConfig, BackendKind, BackendStats, PollOutcome, Waker};
use crate::batch::{RecvBatch, RecvMeta, SendBatch};
use crate::error::{Error, Result};
use crate::linux::{self, EventFd};
use crate::select::Capability;
use crate::socket::{BoundSocket, SocketInfo};
use crate::sys::{self, CmsgBuf};

const TOKEN_RECV: u64 = 1 << 62;
const TOKEN_WAKE: u64 = 1 << 61;
const TOKEN_CANCEL: u64 = 1 << 60;
/// Send completions carry this bit plus the message slot.
const TOKEN_SEND: u64 = 1 << 59;
/// The one-shot `POLLOUT` poll armed when the socket buffer was full.
const TOKEN_WRITABLE: u64 = 1 << 58;
/// A send's `user_data`: `TOKEN_SEND`, the round's generation in these bits, and the slot in
/// the low 24 (a submission holds at most 32,768 sends).
const SEND_GEN_SHIFT: u32 = 24;
const SEND_SLOT_MASK: u64 = (1 << SEND_GEN_SHIFT) - 1;
const BUF_GROUP: u16 = 0;
/// Control bytes reserved per received datagram (drop counter + GRO segment size).
const RECV_CONTROL: usize = 64;
/// `struct io_uring_recvmsg_out`: four `u32`s (namelen, controllen, payloadlen, flags).
const RECVMSG_OUT: usize = 16;
const NAME_LEN: usize = std::mem::size_of::<libc::sockaddr_storage>();
/// An upper bound of what one socket buffer (`sk_buff`) of a send adds to the socket's send
/// charge beyond twice its payload: the kernel charges the buffer's true size, its payload
/// plus headers (at most 256 B here) and shared info (at most 768 B), rounded up by the
/// allocator to at most twice that, plus the `sk_buff` itself (256 B).
const SKB_CHARGE_BOUND: usize = 2 * (256 + 768) + 256;
/// Fewest payload bytes one IP fragment carries, for counting the buffers of a datagram
/// larger than the route's MTU (an MTU of 576 B, IPv4's smallest in practice, carries 548).
const FRAGMENT_MIN: usize = 512;

/// An upper bound of what a send of `len` payload bytes carrying `datagrams` datagrams (GSO
/// segments) adds to the socket's send charge: one `sk_buff` per datagram or IP fragment.
fn charge_bound(len: usize, datagrams: usize) -> usize {
    let skbs = datagrams.max(len.div_ceil(FRAGMENT_MIN)).max(1);
    len.saturating_mul(2)
        .saturating_add(skbs.saturating_mul(SKB_CHARGE_BOUND))
}

/// Anonymous, page-aligned memory (the buffer ring must be page-aligned; the pool just needs
/// a fixed address).
struct Mmap {
    ptr: *mut u8,
    len: usize,
}

impl Mmap {
    fn new(len: usize) -> io::Result<Mmap> {
        // SAFETY: an anonymous private mapping with no address hint; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mmap {
            ptr: ptr.cast(),
            len,
        })
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; nothing uses the mapping after this.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The provided-buffer ring and the buffers it hands out.
struct BufRing {
    ring: Mmap,
    pool: Mmap,
    entries: u16,
    buf_size: usize,
    /// Our copy of the ring tail (the kernel reads the shared one).
    tail: u16,
}

impl BufRing {
    fn new(entries: u16, buf_size: usize) -> io::Result<BufRing> {
        let ring_bytes = usize::from(entries) * std::mem::size_of::<types::BufRingEntry>();
        let page = 4096;
        let ring = Mmap::new(ring_bytes.div_ceil(page) * page)?;
        let pool = Mmap::new(usize::from(entries) * buf_size)?;
        Ok(BufRing {
            ring,
            pool,
            entries,
            buf_size,
            tail: 0,
        })
    }

    /// Queue buffer `bid` for the kernel; visible once [`publish`](Self::publish) runs.
    fn push(&mut self, bid: u16) {
        let mask = self.entries - 1;
        let slot = usize::from(self.tail & mask);
        // SAFETY: slot < entries, so the entry lies inside the ring mapping; the kernel only
        // reads entries between its head and the published tail, and this one is past the tail.
        let entry = unsafe { &mut *self.ring.ptr.cast::<types::BufRingEntry>().add(slot) };
        // SAFETY: bid < entries, so the buffer lies inside the pool mapping.
        let addr = unsafe { self.pool.ptr.add(usize::from(bid) * self.buf_size) };
        entry.set_addr(addr as u64);
        entry.set_len(self.buf_size as u32);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Make pushed buffers visible to the kernel.
    fn publish(&self) {
        // SAFETY: the ring base is valid; `tail` points at the u16 tail field inside the first
        // entry, which the kernel reads; the release store orders the entry writes before it.
        unsafe {
            let tail =
                types::BufRingEntry::tail(self.ring.ptr.cast::<types::BufRingEntry>()).cast_mut();
            (*tail.cast::<std::sync::atomic::AtomicU16>())
                .store(self.tail, std::sync::atomic::Ordering::Release);
        }
    }
}

/// Where a send slot's message came from.
#[derive(Clone, Copy)]
struct SendSlot {
    /// Index among the batch's pending entries.
    entry: usize,
    /// Datagrams this message carries.
    datagrams: usize,
    /// This message is a split segment (its entry may be partly sent).
    segment: bool,
}

/// What happened to one pending entry during a poll.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum EntryFate {
    #[default]
    Untouched,
    /// Sent whole, or dropped after a hard error.
    Done,
    /// The socket was full; it stays.
    Retry,
}

/// io_uring on one socket.
pub struct UringBackend {
    // Field order matters for Drop: the ring goes before the memory it may write to.
    ring: IoUring,
    bufs: BufRing,
    /// The msghdr template the multishot receive reads: only the name/control lengths count.
    recv_msg: Box<libc::msghdr>,
    sock: BoundSocket,
    fd: RawFd,
    waker: Arc<EventFd>,
    reason: String,
    max_datagram: usize,
    gso: bool,
    gro: bool,
    /// The kernel runs this ring's completion work only in this thread's GETEVENTS enters
    /// (`DEFER_TASKRUN`; asked for by [`BackendConfig::single_thread`]).
    deferred: bool,
    recv_armed: bool,
    wake_armed: bool,
    ever_armed: bool,
    /// A `POLLOUT` poll on the socket is pending (armed when a send found the buffer full).
    writable_armed: bool,
    /// That poll completed since a poll last looked: the buffer has room again.
    writable: bool,
    /// The last send round found the buffer full.
    send_pressure: bool,
    /// The socket's send buffer size (`SO_SNDBUF`): a send is refused once the socket's
    /// charge reaches it.
    send_buffer: usize,
    /// An upper bound of the socket's send charge: the last one read (`SIOCOUTQ`) plus the
    /// bounds of every send queued since (the kernel frees charge, never adds it, meanwhile).
    charge_bound: usize,
    /// A GSO send has gone out on this socket: a refusal (which a later send of the same
    /// round would overtake) is not expected any more, so a GSO send may be followed by others
    /// in its round.
    gso_proven: bool,
    /// Buffers held by the datagrams of the last poll; returned at the start of the next.
    held: Vec<u16>,
    metas: Vec<RecvMeta>,
    tx_names: Vec<libc::sockaddr_storage>,
    tx_iov: Vec<libc::iovec>,
    tx_ctrl: Vec<CmsgBuf>,
    tx_msgs: Vec<libc::msghdr>,
    tx_slots: Vec<SendSlot>,
    /// Per slot: bytes sent (>= 0) or negative errno; `None` until its completion arrives.
    tx_results: Vec<Option<i32>>,
    /// The round's sends may fill the buffer (its last may be refused).
    tx_may_fill: bool,
    /// The round holds every pending entry whole.
    tx_all: bool,
    fates: Vec<EntryFate>,
    /// Segments sent per pending entry (split GSO entries only).
    seg_done: Vec<usize>,
    /// The send round's generation, in every send's `user_data`: a completion of a round a
    /// failed poll abandoned is recognised as such and ignored.
    send_gen: u32,
    /// Receive and wake completions not handled yet: reaped by [`Backend::flush`] (so the
    /// datagrams the caller is reading stay as they are) or beyond `batch_size` in one poll.
    /// Handled first by the next poll.
    stash: Vec<(u64, i32, u32)>,
    /// Spare storage swapped with `stash` while draining it, so draining never allocates.
    stash_spare: Vec<(u64, i32, u32)>,
    /// Most datagram entries one poll returns.
    batch_size: usize,
    drops: Option<u64>,
    stats: BackendStats,
}

// SAFETY: the raw pointers (msghdrs, iovecs, mappings) point only into memory owned by this
// struct, and the io_uring instance is used by whichever single thread owns the backend (a
// deferred ring only by the thread that made it: the kernel refuses other submitters).
unsafe impl Send for UringBackend {}

impl std::fmt::Debug for UringBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringBackend")
            .field("local_addr", &self.sock.local_addr())
            .field("gso", &self.gso)
            .field("gro", &self.gro)
            .field("deferred", &self.deferred)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// The ring, and whether its completion work is deferred to the owning thread's enters.
///
/// Without deferral (`COOP_TASKRUN`) the kernel runs a completion's work at the thread's next
/// kernel exit, and wakes it from any interruptible sleep to do so: a worker parked until its
/// tick would be woken by every arriving datagram. With `DEFER_TASKRUN` the work waits for an
/// enter with GETEVENTS; `TASKRUN_FLAG` marks the SQ ring while some is pending, and
/// `Submitter::submit_and_wait` then adds GETEVENTS even to a zero-wait enter.
fn build_ring(cfg: &BackendConfig, cq_entries: u32) -> Result<(IoUring, bool)> {
    if cfg.single_thread {
        match IoUring::builder()
            .setup_cqsize(cq_entries)
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_taskrun_flag()
            .build(cfg.ring_entries)
        {
            Ok(ring) => return Ok((ring, true)),
            // Kernels before 6.1 refuse the flags: use the ring every kernel takes.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => tracing::debug!(
                "io_uring refuses SINGLE_ISSUER | DEFER_TASKRUN; arrivals will interrupt \
                 the thread between polls"
            ),
            Err(e) => return Err(Error::io("io_uring_setup", e)),
        }
    }
    let ring = IoUring::builder()
        .setup_cqsize(cq_entries)
        .setup_coop_taskrun()
        .build(cfg.ring_entries)
        .map_err(|e| Error::io("io_uring_setup", e))?;
    Ok((ring, false))
}

impl UringBackend {
    /// Set up io_uring on `sock`. On failure the socket is handed back (for the fallback).
    pub fn new(
        sock: BoundSocket,
        cfg: &BackendConfig,
        reason: String,
    ) -> std::result::Result<Self, Box<(Error, BoundSocket)>> {
        // The offload probe alone: the full one sets up an io_uring of its own.
        let (gso, gro) = crate::select::offloads_cached();
        Self::with_offloads(sock, cfg, reason, gso.available, cfg.gro && gro.available)
    }

    fn with_offloads(
        sock: BoundSocket,
        cfg: &BackendConfig,
        reason: String,
        gso: bool,
        gro: bool,
    ) -> std::result::Result<Self, Box<(Error, BoundSocket)>> {
        match Self::setup(&sock, cfg, gso, gro) {
            Ok(parts) => Ok(Self::assemble(parts, sock, cfg, reason, gso, gro)),
            Err(e) => Err(Box::new((e, sock))),
        }
    }

    fn setup(
        sock: &BoundSocket,
        cfg: &BackendConfig,
        gso: bool,
        gro: bool,
    ) -> Result<(IoUring, bool, BufRing, Arc<EventFd>)> {
        linux::mmsg::validate(cfg)?;
        let entries = cfg.recv_buffers;
        if entries == 0 || !entries.is_power_of_two() || entries > 32_768 {
            return Err(Error::InvalidConfig(format!(
                "recv_buffers {entries} must be a power of two in 1..=32768"
            )));
        }
        if cfg.ring_entries < 8 || cfg.ring_entries > 32_768 {
            return Err(Error::InvalidConfig(format!(
                "ring_entries {} is not in 8..=32768",
                cfg.ring_entries
            )));
        }
        // GSO needs no setup: each send says its segment size in a control message.
        let _ = gso;
        if gro {
            if cfg.max_datagram < linux::mmsg::GRO_MIN_BUFFER {
                return Err(Error::InvalidConfig(format!(
                    "GRO needs max_datagram >= {} (coalesced runs reach 64 KiB), got {}",
                    linux::mmsg::GRO_MIN_BUFFER,
                    cfg.max_datagram
                )));
            }
            linux::enable_gro(sock.as_raw_fd()).map_err(|e| Error::io("setsockopt UDP_GRO", e))?;
        }
        let (ring, deferred) = build_ring(cfg, cfg.ring_entries * 2 + u32::from(entries))?;
        let mut probe = io_uring::Probe::new();
        ring.submitter()
            .register_probe(&mut probe)
            .map_err(|e| Error::io("io_uring probe", e))?;
        for (code, name) in [
            (opcode::RecvMsg::CODE, "IORING_OP_RECVMSG"),
            (opcode::SendMsg::CODE, "IORING_OP_SENDMSG"),
            (opcode::PollAdd::CODE, "IORING_OP_POLL_ADD"),
        ] {
            if !probe.is_supported(code) {
                return Err(Error::io(name, io::Error::from_raw_os_error(libc::EINVAL)));
            }
        }
        // Each provided buffer holds the recvmsg_out header, the name, the control data and
        // the payload, in that order.
        let buf_size =
            (RECVMSG_OUT + NAME_LEN + RECV_CONTROL + cfg.max_datagram).next_multiple_of(64);
        let mut bufs =
            BufRing::new(entries, buf_size).map_err(|e| Error::io("mmap buffer ring", e))?;
        // SAFETY: the ring mapping holds `entries` entries, is page-aligned, and lives as long
        // as the io_uring (field order drops the ring first; Drop also unregisters it).
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(bufs.ring.ptr as u64, entries, BUF_GROUP, 0)
                .map_err(|e| Error::io("IORING_REGISTER_PBUF_RING", e))?;
        }
        for bid in 0..entries {
            bufs.push(bid);
        }
        bufs.publish();
        let waker = EventFd::new().map_err(|e| Error::io("eventfd", e))?;
        Ok((ring, deferred, bufs, waker))
    }

    fn assemble(
        (ring, deferred, bufs, waker): (IoUring, bool, BufRing, Arc<EventFd>),
        sock: BoundSocket,
        cfg: &BackendConfig,
        reason: String,
        gso: bool,
        gro: bool,
    ) -> Self {
        // SAFETY: all-zero is a valid msghdr.
        let mut recv_msg: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        recv_msg.msg_namelen = NAME_LEN as libc::socklen_t;
        recv_msg.msg_controllen = RECV_CONTROL as _;
        // Room for the whole send batch in one submission, split segments included.
        let tx_n = (cfg.ring_entries as usize).saturating_sub(4).max(8);
        let drops = sock.drop_counting().then_some(0);
        UringBackend {
            ring,
            bufs,
            recv_msg,
            fd: sock.as_raw_fd(),
            send_buffer: sock.info().send_buffer_granted,
            charge_bound: 0,
            gso_proven: false,
            sock,
            waker,
            reason,
            max_datagram: cfg.max_datagram,
            gso,
            gro,
            deferred,
            recv_armed: false,
            wake_armed: false,
            writable_armed: false,
            writable: false,
            send_pressure: false,
            ever_armed: false,
            held: Vec::with_capacity(usize::from(cfg.recv_buffers)),
            metas: Vec::with_capacity(usize::from(cfg.recv_buffers)),
            tx_names: vec![sys::zeroed_storage(); tx_n],
            tx_iov: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                tx_n
            ],
            tx_ctrl: vec![CmsgBuf::new(); tx_n],
            // SAFETY: all-zero is a valid msghdr.
            tx_msgs: vec![unsafe { std::mem::zeroed() }; tx_n],
            tx_slots: Vec::with_capacity(tx_n),
            tx_results: Vec::with_capacity(tx_n),
            tx_may_fill: false,
            tx_all: true,
            fates: Vec::with_capacity(tx_n),
            seg_done: Vec::with_capacity(tx_n),
            send_gen: 0,
            stash: Vec::with_capacity(usize::from(cfg.recv_buffers) + 16),
            stash_spare: Vec::with_capacity(usize::from(cfg.recv_buffers) + 16),
            batch_size: cfg.batch_size,
            drops,
            stats: BackendStats::default(),
        }
    }

    /// GSO sends go out as one message (the kernel segments); false: split by this backend.
    pub fn gso_enabled(&self) -> bool {
        self.gso
    }

    /// GRO is on for the socket.
    pub fn gro_enabled(&self) -> bool {
        self.gro
    }

    /// [`Backend::poll`]; on an error, the caller unhooks the sends (`abandon_sends`).
    fn poll_inner(
        &mut self,
        send: &mut SendBatch,
        timeout: Option<Duration>,
    ) -> Result<PollOutcome> {
        let mut out = PollOutcome::default();
        let deadline = match timeout {
            Some(t) if !t.is_zero() => Instant::now().checked_add(t),
            _ => None,
        };
        self.prepare()?;
        // Once the socket buffer is full, stop sending for this poll and just wait.
        let mut may_send = true;
        // A poll that must not wait may still re-arm an ended receive once (below).
        let mut rearmed = false;
        loop {
            let sends = if may_send && !send.is_empty() {
                self.queue_sends(send)?
            } else {
                0
            };
            // The round did not carry every pending entry: send again before waiting.
            let more_to_send = sends > 0 && !self.tx_all;
            let remaining = match (timeout, deadline) {
                (Some(t), _) if t.is_zero() => Some(Duration::ZERO),
                (Some(_), Some(d)) => Some(d.saturating_duration_since(Instant::now())),
                _ => None,
            };
            let have_cqes = !self.stash.is_empty() || !self.ring.completion().is_empty();
            // Sends that may fill the socket buffer are submitted before the wait, not in the
            // same enter: one the full buffer refuses must end the wait (through the `POLLOUT`
            // poll armed then), and a wait begun with the submission would not end for it.
            let may_fill = sends > 0 && (self.send_pressure || self.tx_may_fill);
            if !more_to_send && !may_fill && !have_cqes && remaining != Some(Duration::ZERO) {
                // Wait for every send to complete plus one more event: a datagram, a wake-up.
                self.enter(sends + 1, remaining)?;
            } else {
                self.enter(sends, None)?;
            }
            out.woken |= self.reap(false);
            // Sends normally complete during the submission; if one did not, wait for it so
            // the batch's bytes are no longer in use when this poll returns.
            while self.tx_results.iter().any(Option::is_none) {
                self.enter(1, Some(Duration::from_millis(100)))?;
                out.woken |= self.reap(false);
            }
            if sends > 0 {
                let (removed, would_block, _) = self.finish_round(send)?;
                out.sent += removed;
                may_send &= !would_block;
            }
            if !self.metas.is_empty() || out.woken {
                break;
            }
            let drained = std::mem::take(&mut self.writable) && !send.is_empty();
            may_send |= drained;
            if more_to_send && may_send {
                continue;
            }
            let expired = match (timeout, deadline) {
                (None, _) => false,
                (Some(t), _) if t.is_zero() => true,
                (Some(_), Some(d)) => Instant::now() >= d,
                (Some(_), None) => false,
            };
            if drained && !expired {
                continue;
            }
            if expired {
                // The multishot receive ended in this poll (its provided buffers ran out,
                // typically, when a batch filled them) and brought nothing: re-arm it and look
                // once more, or a poll that does not wait would report an empty socket while
                // datagrams are queued in it, until the next poll.
                if timeout == Some(Duration::ZERO) && !self.recv_armed && !rearmed {
                    rearmed = true;
                    self.prepare()?;
                    continue;
                }
                break;
            }
            // The multishot receive or the wake poll may have ended (e.g. the ring ran dry):
            // re-arm and wait again for what is left of the timeout.
            self.prepare()?;
        }
        out.received = self.metas.len();
        if out.received > 0 {
            self.stats.batches_in += 1;
        }
        Ok(out)
    }

    /// [`Backend::flush`]; on an error, the caller unhooks the sends (`abandon_sends`).
    fn flush_inner(&mut self, send: &mut SendBatch) -> Result<usize> {
        let mut removed = 0;
        while !send.is_empty() {
            // Wake-ups are stashed with the receive completions, so the next poll reports them.
            let (n, would_block, settled) = self.send_round(send)?;
            removed += n;
            if would_block || settled == 0 {
                break;
            }
        }
        Ok(removed)
    }

    /// After a poll or flush failed with sends prepared: make every prepared send read nothing
    /// of the caller's batch (no iovec, no address: the kernel fails it without touching the
    /// batch, should an SQE still in the submission queue be submitted later) and move to a new
    /// generation, so that late completions of this round are ignored. The batch keeps all its
    /// entries, to be sent again (a datagram that went out before the failure may go twice).
    fn abandon_sends(&mut self) {
        if self.tx_slots.is_empty() {
            return;
        }
        for msg in &mut self.tx_msgs[..self.tx_slots.len()] {
            msg.msg_name = std::ptr::null_mut();
            msg.msg_namelen = 0;
            msg.msg_iov = std::ptr::null_mut();
            msg.msg_iovlen = 0;
            msg.msg_control = std::ptr::null_mut();
            msg.msg_controllen = 0;
        }
        self.send_gen = self.send_gen.wrapping_add(1);
        self.tx_slots.clear();
        self.tx_results.clear();
        self.fates.clear();
        self.seg_done.clear();
    }

    /// Push an SQE, submitting first if the queue is full.
    fn push_sqe(&mut self, sqe: &squeue::Entry) -> Result<()> {
        loop {
            // SAFETY: every SQE built here points at memory owned by self (msghdrs, iovecs,
            // buffers) or at the caller's send batch, which stays untouched until its
            // completions are reaped in this same poll; a poll that fails before then first
            // unhooks its sends from the batch (`abandon_sends`).
            let pushed = unsafe { self.ring.submission().push(sqe) };
            if pushed.is_ok() {
                return Ok(());
            }
            self.enter(0, None)?;
        }
    }

    /// One `io_uring_enter`: submit and wait for `want` completions, up to `timeout`.
    fn enter(&mut self, want: usize, timeout: Option<Duration>) -> Result<()> {
        self.stats.syscalls += 1;
        let r = match timeout {
            Some(t) if want > 0 => {
                let ts = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(want, &args)
            }
            _ => self.ring.submitter().submit_and_wait(want),
        };
        match r {
            Ok(_) => Ok(()),
            Err(e) => match e.raw_os_error() {
                // Timed out, interrupted, or completions pending that must be reaped first.
                Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN) => {
                    Ok(())
                }
                _ => Err(Error::io("io_uring_enter", e)),
            },
        }
    }

    /// Prepare send SQEs for as much of `batch` as one round carries in order (see the module
    /// docs); returns how many messages.
    fn queue_sends(&mut self, batch: &SendBatch) -> Result<usize> {
        self.send_gen = self.send_gen.wrapping_add(1);
        self.tx_slots.clear();
        self.tx_results.clear();
        self.fates.clear();
        self.seg_done.clear();
        self.tx_all = true;
        let cap = self.tx_msgs.len();
        // The bounds of the messages taken so far, and whether the charge was read this round.
        let mut charge = 0usize;
        let mut read = false;
        let mut m = 0;
        'entries: for (idx, entry) in batch.pending().iter().enumerate() {
            let split = match entry.segment_size {
                Some(s) if !self.gso && (s as usize) < entry.len => Some(s as usize),
                _ => None,
            };
            let needed = split.map_or(1, |s| entry.len.div_ceil(s));
            // A split run longer than a whole submission (a small ring) goes in parts when it
            // comes first, rather than never; otherwise entries are taken whole or not at all.
            if m + needed > cap && m > 0 {
                self.tx_all = false;
                break;
            }
            let payload = batch.payload(entry);
            let mut take = 0;
            while take < needed.min(cap) {
                let (len, datagrams) = match split {
                    Some(seg) => ((entry.len - take * seg).min(seg), 1),
                    None => (entry.len, entry.datagrams()),
                };
                // This message may follow the ones taken only if those cannot be refused.
                if m + take > 0 && !self.room_for(charge, &mut read) {
                    break;
                }
                charge = charge.saturating_add(charge_bound(len, datagrams));
                take += 1;
                if split.is_none() && datagrams > 1 && !self.gso_proven {
                    // A first GSO send may be refused as such (then resent split): nothing of
                    // this round may follow it.
                    break;
                }
            }
            if take == 0 {
                self.tx_all = false;
                break;
            }
            // An entry sent in part is `Retry` from the start, so its sent segments are skipped
            // (`seg_done`) and it is removed only once none is left.
            self.fates.push(if take < needed {
                EntryFate::Retry
            } else {
                EntryFate::Untouched
            });
            self.seg_done.push(0);
            match split {
                Some(seg) => {
                    for s in 0..take {
                        let part = &payload[s * seg..((s + 1) * seg).min(entry.len)];
                        self.prepare_send(m, idx, &entry.dst, part, None, 1, true);
                        m += 1;
                    }
                }
                None => {
                    let gso = entry.segment_size.filter(|&s| (s as usize) < entry.len);
                    self.prepare_send(m, idx, &entry.dst, payload, gso, entry.datagrams(), false);
                    m += 1;
                }
            }
            let gso_first = split.is_none() && entry.datagrams() > 1 && !self.gso_proven;
            if take < needed || gso_first {
                self.tx_all = idx + 1 == batch.len() && take == needed;
                break 'entries;
            }
        }
        // Whether the last message may be refused: then the poll must not wait in the same
        // enter (the `POLLOUT` poll that ends such a wait is armed after a refusal).
        self.tx_may_fill = !self.room_for(charge, &mut read);
        self.charge_bound = self.charge_bound.saturating_add(charge);
        for i in 0..m {
            let sqe = opcode::SendMsg::new(types::Fd(self.fd), &self.tx_msgs[i])
                .flags(libc::MSG_DONTWAIT as u32)
                .build()
                .user_data(TOKEN_SEND | u64::from(self.send_gen) << SEND_GEN_SHIFT | i as u64);
            self.push_sqe(&sqe)?;
        }
        Ok(m)
    }

    /// Whether messages bounded by `charge` in all fit below the send buffer on top of the
    /// socket's charge, so that none can be refused. Reads the charge (once per round, `read`)
    /// when the running bound says no.
    fn room_for(&mut self, charge: usize, read: &mut bool) -> bool {
        let fits = |bound: usize| bound.saturating_add(charge) < self.send_buffer;
        if fits(self.charge_bound) {
            return true;
        }
        if !*read {
            *read = true;
            self.stats.syscalls += 1;
            match socket_send_charge(self.fd) {
                Ok(c) => self.charge_bound = c,
                // Unknown: only one message per round, which is always in order.
                Err(_) => self.charge_bound = usize::MAX,
            }
        }
        fits(self.charge_bound)
    }

    #[allow(clippy::too_many_arguments)]
    fn prepare_send(
        &mut self,
        m: usize,
        entry: usize,
        dst: &std::net::SocketAddr,
        payload: &[u8],
        gso: Option<u16>,
        datagrams: usize,
        segment: bool,
    ) {
        let namelen = sys::encode_addr(dst, &mut self.tx_names[m]);
        self.tx_iov[m] = libc::iovec {
            iov_base: payload.as_ptr() as *mut libc::c_void,
            iov_len: payload.len(),
        };
        let msg = &mut self.tx_msgs[m];
        msg.msg_name = (&mut self.tx_names[m] as *mut libc::sockaddr_storage).cast();
        msg.msg_namelen = namelen;
        msg.msg_iov = &mut self.tx_iov[m];
        msg.msg_iovlen = 1;
        match gso {
            Some(seg) => {
                let len = linux::write_gso_cmsg(&mut self.tx_ctrl[m], seg);
                let msg = &mut self.tx_msgs[m];
                msg.msg_control = self.tx_ctrl[m].0.as_mut_ptr().cast();
                msg.msg_controllen = len as _;
            }
            None => {
                msg.msg_control = std::ptr::null_mut();
                msg.msg_controllen = 0;
            }
        }
        self.tx_slots.push(SendSlot {
            entry,
            datagrams,
            segment,
        });
        self.tx_results.push(None);
    }

    /// Reap every completion queued; returns whether a wake-up came. With `stash`, only send
    /// completions are handled and the rest are kept for the next non-stashing reap.
    fn reap(&mut self, stash: bool) -> bool {
        let mut woken = false;
        if !stash && !self.stash.is_empty() {
            std::mem::swap(&mut self.stash, &mut self.stash_spare);
            let mut spare = std::mem::take(&mut self.stash_spare);
            for (token, res, flags) in spare.drain(..) {
                woken |= self.dispatch(token, res, flags, false);
            }
            self.stash_spare = spare;
        }
        // Collect first: handling a completion needs &mut self while the queue borrows the ring.
        let mut batch: [(u64, i32, u32); 64] = [(0, 0, 0); 64];
        loop {
            let mut n = 0;
            {
                let mut cq = self.ring.completion();
                for cqe in cq.by_ref().take(batch.len()) {
                    batch[n] = (cqe.user_data(), cqe.result(), cqe.flags());
                    n += 1;
                }
            }
            if n == 0 {
                break;
            }
            for &(token, res, flags) in &batch[..n] {
                woken |= self.dispatch(token, res, flags, stash);
            }
        }
        if woken {
            self.stats.syscalls += 1;
            self.waker.drain();
        }
        woken
    }

    /// Handle a completion now, or stash it: everything but sends when `stash`, and datagrams
    /// beyond `batch_size` always. Returns whether it was a wake-up handled now.
    fn dispatch(&mut self, token: u64, res: i32, flags: u32, stash: bool) -> bool {
        let is_send = token & TOKEN_SEND != 0;
        let full = token == TOKEN_RECV && self.metas.len() >= self.batch_size;
        if (stash && !is_send) || full {
            self.stash.push((token, res, flags));
            return false;
        }
        self.handle_cqe(token, res, flags)
    }

    /// Handle one completion; returns whether it was a wake-up.
    fn handle_cqe(&mut self, token: u64, res: i32, flags: u32) -> bool {
        if token == TOKEN_RECV {
            self.on_recv(res, flags);
        } else if token == TOKEN_WAKE {
            if !cqueue::more(flags) {
                self.wake_armed = false;
            }
            return res >= 0;
        } else if token == TOKEN_WRITABLE {
            self.writable_armed = false;
            self.writable = true;
        } else if token & TOKEN_SEND != 0 {
            let generation = (token & !TOKEN_SEND) >> SEND_GEN_SHIFT;
            let slot = (token & SEND_SLOT_MASK) as usize;
            if generation == u64::from(self.send_gen) {
                if let Some(r) = self.tx_results.get_mut(slot) {
                    *r = Some(res);
                }
            }
        }
        // TOKEN_CANCEL completions need no handling.
        false
    }

    /// Submit what `batch` holds (as far as one round carries) and settle the completions,
    /// keeping receive/wake completions for later. Returns what [`finish_round`] does.
    ///
    /// [`finish_round`]: Self::finish_round
    fn send_round(&mut self, batch: &mut SendBatch) -> Result<(usize, bool, usize)> {
        let sends = self.queue_sends(batch)?;
        self.enter(sends, None)?;
        self.reap(true);
        while self.tx_results.iter().any(Option::is_none) {
            self.enter(1, Some(Duration::from_millis(100)))?;
            self.reap(true);
        }
        self.finish_round(batch)
    }

    /// End a send round whose completions have all come: settle them into `batch`, free the
    /// round's slots, and when the socket was full, arm the `POLLOUT` poll that ends the next
    /// wait once it drains (after a flush, its completion is stashed and handled by the next
    /// poll). Returns (entries removed, socket was full, messages settled for good).
    fn finish_round(&mut self, batch: &mut SendBatch) -> Result<(usize, bool, usize)> {
        let (removed, would_block, settled) = self.settle_sends(batch);
        self.tx_slots.clear();
        self.tx_results.clear();
        self.send_pressure = would_block;
        if would_block {
            self.arm_writable()?;
        }
        Ok((removed, would_block, settled))
    }

    fn on_recv(&mut self, res: i32, flags: u32) {
        if !cqueue::more(flags) {
            self.recv_armed = false;
        }
        if res < 0 {
            if res == -libc::ENOBUFS {
                self.stats.buffer_exhaustions += 1;
            } else if res != -libc::ECANCELED {
                tracing::warn!(error = %io::Error::from_raw_os_error(-res), "io_uring multishot recvmsg failed; re-arming");
            }
            return;
        }
        let Some(bid) = cqueue::buffer_select(flags) else {
            return;
        };
        if bid >= self.bufs.entries {
            return;
        }
        self.held.push(bid);
        let base = usize::from(bid) * self.bufs.buf_size;
        // SAFETY: this buffer was handed to us by the completion and is not in the ring until
        // we return it, so the kernel does not write it while we read.
        let buf =
            unsafe { std::slice::from_raw_parts(self.bufs.pool.ptr.add(base), self.bufs.buf_size) };
        let Ok(out) = types::RecvMsgOut::parse(buf, &self.recv_msg) else {
            return;
        };
        let mut storage = sys::zeroed_storage();
        let name = out.name_data();
        let n = name.len().min(NAME_LEN);
        // SAFETY: copies at most NAME_LEN bytes into a sockaddr_storage, which is NAME_LEN long.
        unsafe {
            std::ptr::copy_nonoverlapping(
                name.as_ptr(),
                (&mut storage as *mut libc::sockaddr_storage).cast::<u8>(),
                n,
            )
        };
        let Some(src) = sys::decode_addr(&storage, n as libc::socklen_t) else {
            return;
        };
        let cm = linux::parse_cmsgs(out.control_data());
        if let Some(d) = cm.drops {
            self.drops = Some(u64::from(d));
        }
        let payload = out.payload_data();
        let len = payload.len().min(self.max_datagram);
        let offset = base + RECVMSG_OUT + NAME_LEN + RECV_CONTROL;
        let truncated = out.is_payload_truncated();
        let segment_size = cm.gro_segment.filter(|&s| (s as usize) < len);
        self.stats.datagrams_in += match segment_size {
            Some(s) => len.div_ceil(s as usize) as u64,
            None => 1,
        };
        self.stats.truncated += u64::from(truncated);
        self.metas.push(RecvMeta {
            src,
            offset,
            len,
            truncated,
            segment_size,
        });
    }

    /// Whether a send that failed with `res` goes again: the buffer was full, or (a message
    /// of several datagrams that is not a split segment, so a GSO send) the route refused GSO.
    fn is_refusal(slot: &SendSlot, res: i32) -> bool {
        res == -libc::EAGAIN
            || res == -libc::ENOBUFS
            || res == -libc::ECANCELED
            || (!slot.segment
                && slot.datagrams > 1
                && linux::is_gso_refusal(&io::Error::from_raw_os_error(-res)))
    }

    /// Apply the send completions to `batch`; returns (entries removed, socket was full,
    /// messages settled for good).
    ///
    /// What goes again is the round from its first refused send on, so what is settled stays a
    /// prefix and the order holds. A round is sized so that only its last send can be refused
    /// (module docs); should an earlier one be refused all the same and a later one leave (a
    /// buffer shared with another thread's sends, a GSO refusal on a route not seen before),
    /// the refused one is dropped and counted as a send error rather than sent out of order.
    fn settle_sends(&mut self, batch: &mut SendBatch) -> (usize, bool, usize) {
        let n = self.tx_slots.len();
        if n == 0 {
            return (0, false, 0);
        }
        let res = |i: usize| self.tx_results[i].unwrap_or(-libc::EAGAIN);
        let after_last_sent = (0..n).rev().find(|&i| res(i) >= 0).map_or(0, |i| i + 1);
        let cut = (after_last_sent..n)
            .find(|&i| Self::is_refusal(&self.tx_slots[i], res(i)))
            .unwrap_or(n);
        for i in 0..cut {
            let (slot, r) = (self.tx_slots[i], res(i));
            if slot.segment {
                self.seg_done[slot.entry] += 1;
            }
            if self.fates[slot.entry] == EntryFate::Untouched {
                self.fates[slot.entry] = EntryFate::Done;
            }
            if r >= 0 {
                self.stats.datagrams_out += slot.datagrams as u64;
                if !slot.segment && slot.datagrams > 1 {
                    self.gso_proven = true;
                }
                continue;
            }
            let err = io::Error::from_raw_os_error(-r);
            self.stats.send_errors += 1;
            let dst = batch.pending().get(slot.entry).map(|e| e.dst);
            if Self::is_refusal(&slot, r) {
                tracing::warn!(error = %err, ?dst, "uring: a send was refused after a later one of its round had left; dropped to keep the order");
            } else if let Some(dst) = dst {
                linux::log_send_error("uring", self.stats.send_errors, &err, &dst);
            }
        }
        let mut would_block = false;
        if cut < n {
            let r = res(cut);
            if r == -libc::EAGAIN || r == -libc::ENOBUFS || r == -libc::ECANCELED {
                would_block = true;
                self.stats.send_would_block += 1;
            } else if self.gso {
                // The device or route cannot take this GSO send (checksum offload off, a
                // segment over the MTU): split from now on, resending these datagrams.
                let err = io::Error::from_raw_os_error(-r);
                tracing::warn!(error = %err, "UDP GSO send failed; sending segments one by one from now on");
                self.gso = false;
            }
            for i in cut..n {
                self.fates[self.tx_slots[i].entry] = EntryFate::Retry;
            }
        }
        if (0..cut).any(|i| res(i) >= 0) {
            self.stats.batches_out += 1;
        }
        for (i, &done) in self.seg_done.iter().enumerate() {
            if done > 0 && self.fates[i] == EntryFate::Retry && batch.skip_segments(i, done) {
                self.fates[i] = EntryFate::Done;
            }
        }
        let fates = &self.fates;
        (
            batch.remove_pending(|i| fates.get(i) == Some(&EntryFate::Done)),
            would_block,
            cut,
        )
    }

    /// Arm the one-shot `POLLOUT` poll on the socket, unless it is pending already.
    fn arm_writable(&mut self) -> Result<()> {
        if !self.writable_armed {
            let sqe = opcode::PollAdd::new(types::Fd(self.fd), libc::POLLOUT as u32)
                .build()
                .user_data(TOKEN_WRITABLE);
            self.push_sqe(&sqe)?;
            self.writable_armed = true;
        }
        Ok(())
    }

    /// Return last poll's buffers, and (re-)arm the receive and the wake poll if needed.
    fn prepare(&mut self) -> Result<()> {
        if !self.held.is_empty() {
            let held = std::mem::take(&mut self.held);
            for &bid in &held {
                self.bufs.push(bid);
            }
            self.held = held;
            self.held.clear();
            self.bufs.publish();
        }
        self.metas.clear();
        if !self.recv_armed {
            let sqe = opcode::RecvMsgMulti::new(types::Fd(self.fd), &*self.recv_msg, BUF_GROUP)
                .build()
                .user_data(TOKEN_RECV);
            self.push_sqe(&sqe)?;
            self.recv_armed = true;
            if self.ever_armed {
                self.stats.rearms += 1;
            }
            self.ever_armed = true;
        }
        if !self.wake_armed {
            let sqe = opcode::PollAdd::new(types::Fd(self.waker.fd()), libc::POLLIN as u32)
                .multi(true)
                .build()
                .user_data(TOKEN_WAKE);
            self.push_sqe(&sqe)?;
            self.wake_armed = true;
        }
        Ok(())
    }
}

impl Backend for UringBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Uring
    }

    fn selection_reason(&self) -> &str {
        &self.reason
    }

    fn socket_info(&self) -> &SocketInfo {
        self.sock.info()
    }

    fn waker(&self) -> Waker {
        Waker::new(self.waker.clone())
    }

    fn poll(&mut self, send: &mut SendBatch, timeout: Option<Duration>) -> Result<PollOutcome> {
        let r = self.poll_inner(send, timeout);
        if r.is_err() {
            self.abandon_sends();
        }
        r
    }

    fn flush(&mut self, send: &mut SendBatch) -> Result<usize> {
        let r = self.flush_inner(send);
        if r.is_err() {
            self.abandon_sends();
        }
        r
    }

    fn received(&self) -> RecvBatch<'_> {
        // SAFETY: the pool mapping lives as long as self. Every meta points at payload bytes of
        // a buffer we hold (taken from the ring by its completion and not yet returned), so the
        // kernel does not write them until the next poll, which needs `&mut self`; the batch
        // never references the rest of the pool, which the kernel may be writing.
        unsafe { RecvBatch::from_raw_parts(&self.metas, self.bufs.pool.ptr, self.bufs.pool.len) }
    }

    fn socket_drops(&self) -> Option<u64> {
        self.drops
    }

    fn stats(&self) -> BackendStats {
        self.stats
    }

    fn ready_fd(&self) -> RawFd {
        // The ring's descriptor polls readable once completions are posted; an arrival's
        // receive completion is posted by task work, which wakes a thread blocked in poll(2).
        // Not with a deferred ring, whose work waits for this thread's enter: those are only
        // made for the runtime's workers, which never wait on this descriptor.
        self.ring.as_raw_fd()
    }

    fn needs_poll(&mut self) -> bool {
        !self.recv_armed
            || !self.wake_armed
            || !self.stash.is_empty()
            || !self.ring.completion().is_empty()
            || (self.deferred && self.ring.submission().taskrun())
    }
}

impl Drop for UringBackend {
    fn drop(&mut self) {
        // Cancel the multishot receive and wait (bounded) until the kernel confirms, so it never
        // writes into the buffer pool after the mapping is gone.
        if self.recv_armed {
            let sqe = opcode::AsyncCancel::new(TOKEN_RECV)
                .build()
                .user_data(TOKEN_CANCEL);
            if self.push_sqe(&sqe).is_ok() {
                let deadline = Instant::now() + Duration::from_secs(1);
                while self.recv_armed && Instant::now() < deadline {
                    if self.enter(1, Some(Duration::from_millis(50))).is_err() {
                        break;
                    }
                    self.reap(false);
                }
            }
        }
        let _ = self.ring.submitter().unregister_buf_ring(BUF_GROUP);
    }
}

/// The socket's send charge (`SIOCOUTQ`): what its datagrams not yet freed by the kernel
/// hold of its send buffer, as the kernel compares it with the buffer's size.
fn socket_send_charge(fd: RawFd) -> io::Result<usize> {
    let mut charge: libc::c_int = 0;
    // SAFETY: SIOCOUTQ on a socket writes one c_int through the pointer, which points at one.
    if unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut charge as *mut libc::c_int) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(charge).unwrap_or(0))
}

/// Probe io_uring, provided-buffer rings and multishot `recvmsg` by running the backend on a
/// loopback socket and receiving one datagram.
pub(crate) fn probe() -> (Capability, Capability, Capability) {
    let na = |why: &str| (Capability::no(why), Capability::no(why));
    let sock = match crate::socket::bind(&crate::socket::SocketConfig::new(
        ([127, 0, 0, 1], 0).into(),
    )) {
        Ok(s) => s,
        Err(e) => {
            let d = format!("could not open a probe socket: {e}");
            let (a, b) = na(&d);
            return (Capability::no(d), a, b);
        }
    };
    let dst = sock.local_addr();
    let cfg = BackendConfig {
        batch_size: 4,
        max_datagram: 64,
        ring_entries: 8,
        recv_buffers: 4,
        ..BackendConfig::default()
    };
    let mut backend = match UringBackend::with_offloads(sock, &cfg, "probe".into(), false, false) {
        Ok(b) => b,
        Err(failed) => {
            let (e, _) = *failed;
            let errno = match &e {
                Error::Io { source, .. } => source.raw_os_error(),
                _ => None,
            };
            let hint = crate::select::uring_fix_hint(errno);
            let detail = format!("{e}; {hint}");
            return match &e {
                Error::Io {
                    op: "IORING_REGISTER_PBUF_RING",
                    ..
                } => (
                    Capability::yes("io_uring_setup works"),
                    Capability::no(
                        "not tried: provided-buffer rings are missing (needs Linux >= 6.0)",
                    ),
                    Capability::no(detail),
                ),
                _ => {
                    let (a, b) = na("not tried: io_uring cannot be set up");
                    (Capability::no(detail), a, b)
                }
            };
        }
    };
    let pbuf = Capability::yes("IORING_REGISTER_PBUF_RING works");
    let ring = Capability::yes("io_uring_setup works");
    let tx = match std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|t| t.send_to(b"probe", dst).map(|_| t))
    {
        Ok(t) => t,
        Err(e) => {
            return (
                ring,
                Capability::no(format!("probe send failed: {e}")),
                pbuf,
            )
        }
    };
    let mut empty = SendBatch::new(1);
    let deadline = Instant::now() + Duration::from_secs(2);
    let multishot = loop {
        match backend.poll(&mut empty, Some(Duration::from_millis(200))) {
            Ok(o) if o.received > 0 => {
                let ok = backend
                    .received()
                    .iter()
                    .any(|d| d.data == b"probe" && Some(d.src) == tx.local_addr().ok());
                break if ok {
                    Capability::yes("multishot recvmsg received a loopback datagram")
                } else {
                    Capability::no("multishot recvmsg returned a wrong datagram")
                };
            }
            Ok(_) if Instant::now() < deadline => continue,
            Ok(_) => break Capability::no("multishot recvmsg received nothing within 2 s"),
            Err(e) => {
                break Capability::no(format!(
                    "multishot recvmsg failed: {e} (needs Linux >= 6.0)"
                ))
            }
        }
    };
    (ring, multishot, pbuf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::test_support::{
        self, receive_segments, segmented_payload, woken_from_another_thread,
    };
    use crate::socket::{bind, SocketConfig};

    /// These tests need a working io_uring; where the host has none (old kernel, io_uring
    /// disabled, memlock 0) they say so and pass, and the conformance suite covers `mmsg`.
    fn uring_works() -> bool {
        let caps = crate::probe();
        if !caps.uring_usable() {
            eprintln!("skipping: io_uring unusable here: {caps:#?}");
        }
        caps.uring_usable()
    }

    #[test]
    fn probe_and_round_trip() {
        if !uring_works() {
            return;
        }
        // Sends (GSO, split and linked), receives and the waker, on both kinds of ring.
        for cfg in both_rings() {
            let (mut rx, mut tx) = (backend(&cfg), backend(&cfg));
            let dst = rx.socket_info().local_addr;
            let mut batch = SendBatch::new(8);
            batch.push(dst, b"hello").unwrap();
            let payload = segmented_payload();
            batch.push_segments(dst, 1000, &payload).unwrap();
            tx.gso = false;
            batch.push_segments(dst, 1000, &payload).unwrap();
            let out = tx.poll(&mut batch, Some(Duration::ZERO)).unwrap();
            assert_eq!(out.sent, 3, "{:?}", tx.stats());
            assert!(batch.is_empty());
            assert_eq!(tx.stats().datagrams_out, 7);
            let got = receive_segments(&mut rx, 7, tx.socket_info().local_addr);
            let lens: Vec<usize> = got.iter().map(Vec::len).collect();
            assert_eq!(lens, [5, 1000, 1000, 500, 1000, 1000, 500]);
            assert_eq!(got[0], b"hello");
            assert!(got[1..4].concat() == payload && got[4..].concat() == payload);
            woken_from_another_thread(&mut rx);
        }
    }

    /// A split run of more segments than one submission holds (a small ring without GSO) goes
    /// out over several polls instead of stalling the batch.
    #[test]
    fn a_split_run_longer_than_a_submission_is_sent_in_parts() {
        if !uring_works() {
            return;
        }
        let cfg = BackendConfig {
            ring_entries: 16,
            ..BackendConfig::default()
        };
        let (mut rx, mut tx) = (backend(&cfg), backend(&cfg));
        tx.gso = false;
        let dst = rx.socket_info().local_addr;
        let payload: Vec<u8> = (0..40u32).flat_map(|i| [i as u8; 100]).collect();
        let mut batch = SendBatch::new(4);
        batch.push_segments(dst, 100, &payload).unwrap();
        batch.push(dst, b"after").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !batch.is_empty() {
            assert!(Instant::now() < deadline, "stalled: {:?}", tx.stats());
            tx.poll(&mut batch, Some(Duration::ZERO)).unwrap();
        }
        assert_eq!(tx.stats().datagrams_out, 41);
        let got = receive_segments(&mut rx, 41, tx.socket_info().local_addr);
        assert_eq!(got[..40].concat(), payload);
        assert_eq!(got[40], b"after");
    }

    /// Without its `POLLOUT` poll, the datagrams a full buffer refused waited for the end of
    /// the wait (the caller's next timer), however soon the buffer drained.
    #[test]
    fn sends_resume_when_the_buffer_drains() {
        if !uring_works() {
            return;
        }
        for cfg in both_rings() {
            test_support::sends_resume_when_the_buffer_drains(move |s| {
                Box::new(
                    UringBackend::new(s, &cfg, "t".into())
                        .map_err(|e| e.0)
                        .unwrap(),
                )
            });
        }
    }

    /// Before, a round's send that a full buffer refused was sent again after later ones of
    /// the same round that found room (the link freed some between them) had left.
    #[test]
    fn sends_keep_their_order_when_the_buffer_fills() {
        keeps_order_when_the_buffer_fills(&both_rings()[0]);
    }

    /// The same on a single-thread (deferred) ring.
    #[test]
    fn sends_keep_their_order_when_the_buffer_fills_single_thread() {
        keeps_order_when_the_buffer_fills(&both_rings()[1]);
    }

    fn keeps_order_when_the_buffer_fills(cfg: &BackendConfig) {
        if !uring_works() {
            return;
        }
        let cfg = cfg.clone();
        test_support::sends_keep_their_order_when_the_buffer_fills(move |s| {
            Box::new(
                UringBackend::new(s, &cfg, "t".into())
                    .map_err(|e| e.0)
                    .unwrap(),
            )
        });
    }

    /// A send buffer of 16 KiB takes seven 100 B sends per round (their charge bound is
    /// 2,504 B each), so 100 datagrams go out in 15 rounds, in order. Plain loopback frees each
    /// datagram's charge as it is sent, so the charge read between rounds is 0.
    #[test]
    fn a_small_send_buffer_makes_short_rounds() {
        if !uring_works() {
            return;
        }
        assert_eq!(charge_bound(100, 1), 2_504);
        let mut sc = SocketConfig::new("127.0.0.1:0".parse().unwrap());
        sc.send_buffer = Some(8192);
        let cfg = BackendConfig::default();
        let mut tx = UringBackend::new(bind(&sc).unwrap(), &cfg, "t".into())
            .map_err(|e| e.0)
            .unwrap();
        assert_eq!(tx.send_buffer, 16_384, "the kernel doubles SO_SNDBUF");
        let (mut rx, dst, _) = receiver(&cfg);
        let mut batch = SendBatch::new(100);
        for i in 0..100u8 {
            batch.push(dst, &[i; 100]).unwrap();
        }
        let out = tx.poll(&mut batch, Some(Duration::ZERO)).unwrap();
        assert_eq!((out.sent, batch.len()), (100, 0), "{:?}", tx.stats());
        assert_eq!(tx.stats().batches_out, 15, "{:?}", tx.stats());
        let got = receive_segments(&mut rx, 100, tx.socket_info().local_addr);
        let firsts: Vec<u8> = got.iter().map(|d| d[0]).collect();
        assert_eq!(firsts, (0..100u8).collect::<Vec<_>>());
    }

    /// Should a send be refused before a later one of its round leaves (a round is sized so
    /// that it cannot), the refused one is dropped and counted rather than sent again after
    /// the later one; what follows the round's last sent datagram goes again, in order.
    #[test]
    fn a_send_refused_before_a_later_one_left_is_dropped_not_reordered() {
        if !uring_works() {
            return;
        }
        let mut tx = backend(&BackendConfig::default());
        let dst: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut batch = SendBatch::new(4);
        for i in 0..4u8 {
            batch.push(dst, &[i; 10]).unwrap();
        }
        // One round's completions: sent, refused, sent, refused.
        tx.fates = vec![EntryFate::Untouched; 4];
        tx.seg_done = vec![0; 4];
        tx.tx_slots = (0..4)
            .map(|entry| SendSlot {
                entry,
                datagrams: 1,
                segment: false,
            })
            .collect();
        tx.tx_results = vec![Some(10), Some(-libc::EAGAIN), Some(10), Some(-libc::EAGAIN)];
        assert_eq!(tx.settle_sends(&mut batch), (3, true, 3));
        assert_eq!(batch.len(), 1);
        assert_eq!(batch.payload(&batch.pending()[0]), &[3u8; 10]);
        let st = tx.stats();
        assert_eq!(
            (st.datagrams_out, st.send_errors, st.send_would_block),
            (2, 1, 1)
        );
    }

    /// The default configuration for each kind of ring: shared, and single-thread (deferred).
    fn both_rings() -> [BackendConfig; 2] {
        [false, true].map(|single_thread| BackendConfig {
            single_thread,
            ..BackendConfig::default()
        })
    }

    /// A backend on a loopback socket of its own.
    fn backend(cfg: &BackendConfig) -> UringBackend {
        let s = bind(&SocketConfig::new("127.0.0.1:0".parse().unwrap())).unwrap();
        UringBackend::new(s, cfg, "t".into())
            .map_err(|e| e.0)
            .unwrap()
    }

    /// A receiving backend on loopback, its address, and a plain socket to send to it from.
    fn receiver(cfg: &BackendConfig) -> (UringBackend, std::net::SocketAddr, std::net::UdpSocket) {
        let rx = backend(cfg);
        let dst = rx.socket_info().local_addr;
        (rx, dst, std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
    }

    #[test]
    fn buffer_ring_exhaustion_is_survived_and_counted() {
        if !uring_works() {
            return;
        }
        let cfg = BackendConfig {
            recv_buffers: 4,
            max_datagram: 2048,
            ..BackendConfig::default()
        };
        let (mut rx, dst, tx) = receiver(&cfg);
        // More datagrams wait than the ring has buffers when the receive is first armed.
        for i in 0..20u8 {
            tx.send_to(&[i; 100], dst).unwrap();
        }
        let mut empty = SendBatch::new(1);
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() < 20 && Instant::now() < deadline {
            rx.poll(&mut empty, Some(Duration::from_millis(200)))
                .unwrap();
            assert!(rx.received().len() <= 4);
            got.extend(rx.received().iter().map(|d| d.data[0]));
        }
        assert_eq!(got, (0..20u8).collect::<Vec<_>>());
        let st = rx.stats();
        assert!(st.buffer_exhaustions >= 1, "{st:?}");
        assert!(st.rearms >= 1, "{st:?}");
    }

    #[test]
    fn a_poll_returns_at_most_batch_size_datagrams() {
        if !uring_works() {
            return;
        }
        let cfg = BackendConfig {
            batch_size: 3,
            recv_buffers: 16,
            max_datagram: 2048,
            ..BackendConfig::default()
        };
        let (mut rx, dst, tx) = receiver(&cfg);
        let mut empty = SendBatch::new(1);
        // Arm the receive first so the datagrams land in the ring together.
        rx.poll(&mut empty, Some(Duration::ZERO)).unwrap();
        for i in 0..10u8 {
            tx.send_to(&[i; 10], dst).unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() < 10 && Instant::now() < deadline {
            rx.poll(&mut empty, Some(Duration::from_millis(200)))
                .unwrap();
            assert!(rx.received().len() <= 3, "{}", rx.received().len());
            got.extend(rx.received().iter().map(|d| d.data[0]));
        }
        assert_eq!(got, (0..10u8).collect::<Vec<_>>());
    }

    #[test]
    fn zero_time_polls_see_datagrams_that_came_while_the_thread_slept() {
        if !uring_works() {
            return;
        }
        // A deferred ring runs its receive's completion work only in this thread's enters.
        for single_thread in [true, false] {
            let cfg = BackendConfig {
                single_thread,
                recv_buffers: 16,
                max_datagram: 2048,
                ..BackendConfig::default()
            };
            let (mut rx, dst, tx) = receiver(&cfg);
            let mut empty = SendBatch::new(1);
            if single_thread {
                // Where the kernel has the flags (6.1+), the ring must be deferred.
                let deferrable = IoUring::<squeue::Entry>::builder()
                    .setup_single_issuer()
                    .setup_defer_taskrun()
                    .build(8)
                    .is_ok();
                assert_eq!(rx.deferred, deferrable);
            }
            rx.poll(&mut empty, Some(Duration::ZERO)).unwrap();
            for i in 0..10u8 {
                tx.send_to(&[i; 10], dst).unwrap();
            }
            std::thread::sleep(Duration::from_millis(50));
            if rx.deferred {
                // Nothing ran on this thread's behalf while it slept: the receive's work waits.
                assert!(rx.ring.completion().is_empty());
                assert!(rx.ring.submission().taskrun());
            }
            let mut got = Vec::new();
            for _ in 0..20 {
                let out = rx.poll(&mut empty, Some(Duration::ZERO)).unwrap();
                assert_eq!(out.received, rx.received().len());
                got.extend(rx.received().iter().map(|d| d.data[0]));
            }
            assert_eq!(
                got,
                (0..10u8).collect::<Vec<_>>(),
                "single_thread {single_thread}"
            );
        }
    }
}
