//! The kernel floor of `bench sessions` (`--stack kernel`): the same traffic as a Ricochet
//! run, over plain UDP sockets and a plain echo server, with no protocol, no encryption, no
//! timers and no per-session state on the server.
//!
//! - **Clients**: N connected, non-blocking sockets (one per simulated player, bound to the
//!   same loopback addresses and with the same buffers as the Ricochet run's members), on
//!   `--load-threads` threads (echo and churn) with a level-triggered epoll set each: per ready socket one `recvmmsg` of what
//!   came (up to the window), then one `sendmmsg` of the next messages (each echo rewritten
//!   in place): the calls a `ClientSet` member makes, and no user-space work but a
//!   sequence check.
//! - **Server**: in the same child process as Ricochet's server, `io_threads` threads, each
//!   with its own `SO_REUSEPORT` socket on the one port, echoing each `recvmmsg` batch back
//!   with one `sendmmsg`.
//! - **Churn**: each session opens its socket (buffers, bind, connect, epoll), makes
//!   [`CHURN_EXCHANGES`]` - 1` round trips one after another, sends one more datagram and
//!   closes its socket at once. A Ricochet session moves four datagrams each way (hello and
//!   challenge, cookie echo and accept, message and echo, the close and the server's last
//!   datagram) and its client
//!   waits for three answers, as here.
//!
//! Sockets are made as Ricochet's are ([`ricochet_platform::bind`], which forces the buffer
//! sizes past the system's cap where it may). There is no resend: a datagram lost on
//! loopback stalls its client, and the run reports it as an error rather than a lower rate.
//!
//! At window 1 what it reaches is what this machine's kernel allows for that traffic with the
//! protocol's cost taken away and with a client that makes two plain system calls per round
//! trip: a Ricochet figure over the floor's, measured side by side, is the share the protocol
//! keeps. A client that batches its system calls across sockets (one io_uring for all of
//! them) could go past it; no such client exists here. With a larger window it is a
//! plain-sockets baseline, not a bound: Ricochet's GSO sends (one buffer for a window of
//! datagrams) and workers that spin briefly before they sleep can pass it, where the floor's
//! server threads sleep in `recvmmsg` after every batch.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ricochet_platform::SocketConfig;
use socket2::Socket;

use super::churn::{drive_churn, Batch};
use super::echo_meter::{drive_echo, failed, server_spec, EchoMeter, EchoSeen};
use super::load::{Control, Phase};
use super::server::{
    announce, answer_commands, send as tell, FromServer, ServerKind, ServerProcess, ServerSpec,
};
use super::setup::{group_ip, groups};
use crate::host::CpuTimes;
use crate::schema::scale::WorkerStats;
use crate::schema::{finite, ServerStats, SessionsConfig, SessionsRun};

/// Datagrams a churn session of the kernel floor (`--stack kernel`) sends, the last (its close)
/// unanswered: a Ricochet session (handshake, first message and its echo, close) moves four
/// each way, and its client waits for three answers.
pub const FLOOR_CHURN_EXCHANGES: u32 = 4;
use FLOOR_CHURN_EXCHANGES as CHURN_EXCHANGES;

/// Datagrams one server thread takes per `recvmmsg`.
const BATCH: usize = 32;
/// Largest datagram the server echoes, and the clients' receive buffer.
pub(super) const MAX_DATAGRAM: usize = 2048;
/// How long a blocked server thread waits before it looks at its stop flag again.
pub(super) const STOP_POLL: Duration = Duration::from_millis(50);
/// A client without an answer for this long lost a datagram (loopback answers within
/// milliseconds; the floor does not resend).
const STALL: Duration = Duration::from_secs(2);
/// The server sockets' kernel buffers, as the runtime's workers ask.
pub(super) const SERVER_SOCKET_BUFFER: usize = 4 << 20;
/// The clients' kernel buffers: those of the Ricochet run's set members.
const CLIENT_SOCKET_BUFFER: usize = 256 << 10;

// ---------------------------------------------------------------------------------------------
// Server (in the server process).

/// Server threads with a `SO_REUSEPORT` socket each on one port, their stop flag and what
/// each counts (`C`): the floor's echo server and its game server.
pub(super) struct ServerThreads<C> {
    /// The port they share.
    pub(super) addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Per thread, its counters.
    pub(super) counts: Vec<Arc<C>>,
    threads: Vec<JoinHandle<io::Result<()>>>,
    what: &'static str,
}

impl<C: Default + Send + Sync + 'static> ServerThreads<C> {
    /// `n` threads, named `{name}-w{t}`: each binds its socket to `bind` (the others join the
    /// port the first one got), has it set up by `prepare`, then runs `serve` on it until the
    /// stop flag is set. `what` names the server in errors.
    pub(super) fn start<F>(
        bind: SocketAddr,
        n: usize,
        (name, what): (&str, &'static str),
        prepare: impl Fn(&Socket) -> Result<()>,
        serve: F,
    ) -> Result<Self>
    where
        F: Fn(&Socket, &AtomicBool, &C) -> io::Result<()> + Clone + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let (mut addr, mut counts, mut threads) = (bind, Vec::new(), Vec::new());
        for t in 0..n {
            let mut sc = SocketConfig::new(addr);
            sc.reuse_port = true;
            sc.recv_buffer = Some(SERVER_SOCKET_BUFFER);
            sc.send_buffer = Some(SERVER_SOCKET_BUFFER);
            let (sock, info) = ricochet_platform::bind(&sc)
                .with_context(|| format!("binding the {what} to {addr}"))?
                .into_parts();
            prepare(&sock)?;
            addr = info.local_addr;
            let c = Arc::new(C::default());
            counts.push(c.clone());
            let (stop, serve) = (stop.clone(), serve.clone());
            let h = std::thread::Builder::new()
                .name(format!("{name}-w{t}"))
                .spawn(move || serve(&sock, &stop, &c))
                .with_context(|| format!("starting a {what} thread"))?;
            threads.push(h);
        }
        Ok(ServerThreads {
            addr,
            stop,
            counts,
            threads,
            what,
        })
    }

    /// Stop and join every thread (their counts stay readable).
    pub(super) fn shutdown(&mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.threads.drain(..) {
            match h.join() {
                Ok(r) => r.with_context(|| format!("a {} thread", self.what))?,
                Err(_) => bail!("a {} thread panicked", self.what),
            }
        }
        Ok(())
    }
}

/// The floor's echo server: per thread, `recvmmsg` batches handled and datagrams echoed.
type EchoServer = ServerThreads<[AtomicU64; 2]>;

/// Start the echo server's `n` threads on `bind`.
fn start_echo(bind: SocketAddr, n: usize) -> Result<EchoServer> {
    ServerThreads::start(
        bind,
        n,
        ("floor", "floor server"),
        |sock| {
            // Blocking, with a timeout to look at the stop flag: the thread sleeps in
            // `recvmmsg` while nothing comes, as the runtime's workers sleep in their backend
            // (the platform makes its sockets non-blocking).
            sock.set_nonblocking(false).context("blocking mode")?;
            sock.set_read_timeout(Some(STOP_POLL))
                .context("SO_RCVTIMEO")
        },
        serve_socket,
    )
}

/// Datagram buffers with the `mmsghdr`s that point into them, for `recvmmsg` and for sending
/// what came back (each to its sender) with `sendmmsg`.
pub(super) struct MmsgBatch {
    bufs: Vec<u8>,
    names: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    /// Datagrams the last `recv` got: the headers `send_back` sends, set up by that `recv`.
    received: usize,
}

impl MmsgBatch {
    /// Room for `len` datagrams of up to [`MAX_DATAGRAM`] bytes.
    pub(super) fn new(len: usize) -> MmsgBatch {
        // SAFETY: all-zero bytes are a valid `sockaddr_storage`, `iovec` and `mmsghdr` (null
        // pointers, zero lengths); `recv` sets every pointer before a call reads it.
        let (name, iov, hdr) = unsafe {
            (
                std::mem::zeroed::<libc::sockaddr_storage>(),
                std::mem::zeroed::<libc::iovec>(),
                std::mem::zeroed::<libc::mmsghdr>(),
            )
        };
        MmsgBatch {
            bufs: vec![0; len * MAX_DATAGRAM],
            names: vec![name; len],
            iovs: vec![iov; len],
            hdrs: vec![hdr; len],
            received: 0,
        }
    }

    /// One `recvmmsg` of up to `max` datagrams (at most the batch's length) with `flags`:
    /// how many came.
    pub(super) fn recv(&mut self, fd: RawFd, max: usize, flags: i32) -> io::Result<usize> {
        self.received = 0;
        let max = max.min(self.hdrs.len());
        let (buf0, name0, iov0) = (
            self.bufs.as_mut_ptr(),
            self.names.as_mut_ptr(),
            self.iovs.as_mut_ptr(),
        );
        for (i, h) in self.hdrs[..max].iter_mut().enumerate() {
            // SAFETY: `i` is below the batch's length, the length of `names` and `iovs`, and
            // `i * MAX_DATAGRAM` is inside `bufs` (that many datagrams of MAX_DATAGRAM bytes).
            unsafe {
                let iov = iov0.add(i);
                (*iov).iov_base = buf0.add(i * MAX_DATAGRAM).cast();
                (*iov).iov_len = MAX_DATAGRAM;
                h.msg_hdr.msg_name = name0.add(i).cast();
                h.msg_hdr.msg_iov = iov;
            }
            h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            h.msg_hdr.msg_iovlen = 1;
            h.msg_len = 0;
        }
        // SAFETY: the first `max` headers' name and iovec pointers point into `names`, `iovs`
        // and `bufs`, which are not touched during the call; the kernel writes at most the
        // lengths given.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                self.hdrs.as_mut_ptr(),
                max as u32,
                flags,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        self.received = n as usize;
        Ok(self.received)
    }

    /// The IPv4 sender of datagram `i` of the last `recv` (`None` for another family).
    pub(super) fn sender_v4(&self, i: usize) -> Option<std::net::SocketAddrV4> {
        assert!(i < self.received, "datagram {i} of {}", self.received);
        let name = &self.names[i];
        if i32::from(name.ss_family) != libc::AF_INET {
            return None;
        }
        // SAFETY: the family says the kernel wrote a `sockaddr_in` at the start of the
        // storage, which is larger and at least as aligned.
        let a = unsafe { &*(name as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
        Some(std::net::SocketAddrV4::new(
            u32::from_be(a.sin_addr.s_addr).into(),
            u16::from_be(a.sin_port),
        ))
    }

    /// Datagram `i` of the last `recv`, to read or rewrite in place (`i` below what came).
    pub(super) fn datagram(&mut self, i: usize) -> &mut [u8] {
        assert!(i < self.received, "datagram {i} of {}", self.received);
        let len = self.hdrs[i].msg_len as usize;
        &mut self.bufs[i * MAX_DATAGRAM..][..len]
    }

    /// Sends every datagram of the last `recv` (as it is now) back to its sender, waiting
    /// out a full socket buffer.
    fn send_back(&mut self, fd: RawFd) -> io::Result<()> {
        let n = self.received;
        for h in &self.hdrs[..n] {
            // SAFETY: `msg_iov` points at this header's own entry of `iovs`: the last `recv` set
            // it, as it set every header below `received`.
            unsafe { (*h.msg_hdr.msg_iov).iov_len = h.msg_len as usize };
        }
        let mut done = 0;
        while done < n {
            // SAFETY: as for `recvmmsg`, for the `n - done` headers from `done` on.
            let sent = unsafe {
                libc::sendmmsg(fd, self.hdrs[done..n].as_mut_ptr(), (n - done) as u32, 0)
            };
            if sent < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    // These only say "try again" (a blocking socket waits for room).
                    io::ErrorKind::Interrupted
                    | io::ErrorKind::WouldBlock
                    | io::ErrorKind::TimedOut => continue,
                    _ => return Err(e),
                }
            }
            done += sent as usize;
        }
        Ok(())
    }
}

/// Echo every datagram back to its sender, a `recvmmsg` batch per `sendmmsg`, until `stop`;
/// then echo what is still queued, so the counts cover everything sent before the stop.
fn serve_socket(sock: &Socket, stop: &AtomicBool, counts: &[AtomicU64; 2]) -> io::Result<()> {
    let fd = sock.as_raw_fd();
    let mut batch = MmsgBatch::new(BATCH);
    let mut draining = false;
    loop {
        if !draining && stop.load(Ordering::Relaxed) {
            draining = true;
        }
        // While draining, only what is queued already.
        let flags = if draining {
            libc::MSG_DONTWAIT
        } else {
            libc::MSG_WAITFORONE
        };
        let n = match batch.recv(fd, BATCH, flags) {
            Ok(n) => n,
            Err(e) => match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut if draining => return Ok(()),
                io::ErrorKind::WouldBlock
                | io::ErrorKind::TimedOut
                | io::ErrorKind::Interrupted => continue,
                _ => return Err(e),
            },
        };
        // Echo in place: each header already names its sender.
        batch.send_back(fd)?;
        counts[0].fetch_add(1, Ordering::Relaxed);
        counts[1].fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Server threads for `--io-threads n`: as the runtime's workers, 0 is one per core.
pub(super) fn workers(n: usize) -> usize {
    if n > 0 {
        n
    } else {
        std::thread::available_parallelism().map_or(1, |p| p.get())
    }
}

/// The server process's main for [`ServerKind::KernelEcho`]: start, answer `stats`, `reset`
/// and `quit` as [`super::server::serve_process`] does.
pub(super) fn serve_process(
    spec: &ServerSpec,
    lines: impl Iterator<Item = io::Result<String>>,
    mut output: impl Write,
) -> Result<()> {
    let bind: SocketAddr = spec.bind.parse().context("server bind address")?;
    let mut server = announce(
        &mut output,
        start_echo(bind, workers(spec.io_threads)),
        |s| s.addr,
    )?;
    let mut since = (CpuTimes::now(), Instant::now());
    let stats = |server: &EchoServer, since: &(CpuTimes, Instant)| ServerStats {
        // No sessions: the floor server keeps nothing per client.
        sessions: 0,
        rss_kib: crate::host::rss_kib(),
        cpu_s: finite(CpuTimes::now().seconds_since(&since.0)),
        wall_s: finite(since.1.elapsed().as_secs_f64()),
        workers: server
            .counts
            .iter()
            .map(|c| {
                let echoed = c[1].load(Ordering::Relaxed);
                WorkerStats {
                    loop_turns: c[0].load(Ordering::Relaxed),
                    datagrams_in: echoed,
                    datagrams_out: echoed,
                    ..WorkerStats::default()
                }
            })
            .collect(),
        ..ServerStats::default()
    };
    // The echo floor has no game to start.
    answer_commands(
        lines,
        &mut output,
        || {},
        |reset| {
            if reset {
                since = (CpuTimes::now(), Instant::now());
            }
            stats(&server, &since)
        },
    )?;
    // Joined first, so the last report counts every echo sent.
    server.shutdown()?;
    let last = stats(&server, &since);
    tell(&mut output, &FromServer::Stats(Box::new(last)))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Clients (in the bench process, one thread).

/// One level-triggered epoll set over the clients' sockets (token: the client's index).
struct Epoll {
    fd: OwnedFd,
    events: Vec<libc::epoll_event>,
}

impl Epoll {
    fn new() -> Result<Epoll> {
        // SAFETY: `epoll_create1` takes no pointer; a non-negative result is a new descriptor
        // that nothing else owns.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error()).context("epoll_create1");
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Epoll {
            fd,
            events: vec![libc::epoll_event { events: 0, u64: 0 }; 1024],
        })
    }

    fn add(&self, fd: RawFd, token: u64) -> Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: both descriptors are open and `ev` lives for the call.
        if unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error()).context("epoll_ctl add");
        }
        Ok(())
    }

    /// Wait up to `timeout` (whole milliseconds); the ready tokens are `self.ready(n)`.
    fn wait(&mut self, timeout: Duration) -> Result<usize> {
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: `events` has room for its length, which is what the kernel is told.
        let n = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                self.events.as_mut_ptr(),
                self.events.len() as i32,
                ms,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(e).context("epoll_wait");
        }
        Ok(n as usize)
    }

    fn token(&self, k: usize) -> usize {
        self.events[k].u64 as usize
    }
}

/// One client's socket, set up as a Ricochet set member's is: buffers, bind to its group's
/// loopback address (non-blocking, as the platform makes every socket), connect to the server.
pub(super) fn client_socket(ip: std::net::IpAddr, server: SocketAddr) -> Result<Socket> {
    let mut sc = SocketConfig::new(SocketAddr::new(ip, 0));
    sc.recv_buffer = Some(CLIENT_SOCKET_BUFFER);
    sc.send_buffer = Some(CLIENT_SOCKET_BUFFER);
    let s = ricochet_platform::bind(&sc)
        .with_context(|| format!("binding a client to {ip}"))?
        .into_socket();
    s.connect(&server.into()).context("connecting a client")?;
    Ok(s)
}

/// Send `msg` on a connected socket; a full buffer is an error (a window of echo messages
/// never fills one: `bench sessions` caps window × payload below the buffer).
pub(super) fn send(fd: RawFd, msg: &[u8]) -> Result<()> {
    // SAFETY: `msg` is valid for its length for the call.
    let n = unsafe { libc::send(fd, msg.as_ptr().cast(), msg.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error()).context("send");
    }
    Ok(())
}

/// One non-blocking `recv`: the datagram's length, or `None` when nothing waits.
pub(super) fn recv(fd: RawFd, buf: &mut [u8]) -> Result<Option<usize>> {
    // SAFETY: `buf` is valid for writes of its length for the call.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e).context("recv"),
        };
    }
    Ok(Some(n as usize))
}

/// The sequence number a message carries (little-endian, first 8 bytes).
fn seq_of(datagram: &[u8]) -> Option<u64> {
    datagram
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes)
}

/// `bench sessions --stack kernel`: start the floor server, then the mode's client side.
pub(super) fn run(cfg: &SessionsConfig) -> Result<SessionsRun> {
    if cfg.mode == "idle" {
        bail!("--stack kernel measures echo and churn; idle has no sessions to weigh");
    }
    if cfg.payload > MAX_DATAGRAM {
        bail!(
            "the floor echoes datagrams of up to {MAX_DATAGRAM} B, not {}",
            cfg.payload
        );
    }
    // A datagram takes about twice its size of socket buffer: keep a client's window well
    // inside its buffers, since the floor does not resend what they would drop.
    if cfg.window * cfg.payload > CLIENT_SOCKET_BUFFER / 4 {
        bail!(
            "a window of {} × {} B is more than the floor's client sockets hold safely ({} KiB)",
            cfg.window,
            cfg.payload,
            CLIENT_SOCKET_BUFFER / 4 / 1024
        );
    }
    let mut server = ServerProcess::start(&server_spec(cfg, ServerKind::KernelEcho, None))?;
    let before = server.stats()?;
    let mut run = failed(cfg, before.clone(), String::new());
    run.errors.clear();
    run.server_rss_before_kib = before.rss_kib;
    let mut errors = Vec::new();
    let outcome = if cfg.mode == "churn" {
        churn(cfg, &mut server, &mut run)
    } else {
        echo(cfg, &mut server, &mut run)
    };
    if let Err(e) = outcome {
        errors.push(crate::error_chain(e.as_ref()));
    }
    run.quit_server(server, &mut errors);
    run.ok = errors.is_empty()
        && run.connected > 0
        && (cfg.mode != "echo" || run.min_client_round_trips > 0);
    run.errors = errors;
    Ok(run)
}

/// Open `n` client sockets (groups of `cfg.clients_per_ip` per address) in `epoll`.
/// Opens `n` client sockets, their addresses from [`group_ip`]`(first_group)` on, as a
/// Ricochet run's members.
fn open_clients(
    cfg: &SessionsConfig,
    server: SocketAddr,
    range: Range<usize>,
    first_group: usize,
    epoll: &Epoll,
) -> Result<Vec<Socket>> {
    let per_ip = cfg.clients_per_ip.max(1);
    let mut socks = Vec::with_capacity(range.len());
    for (k, i) in range.enumerate() {
        let s = client_socket(group_ip(first_group + i / per_ip), server)
            .with_context(|| format!("client {i}"))?;
        epoll.add(s.as_raw_fd(), k as u64)?;
        socks.push(s);
    }
    Ok(socks)
}

/// Echo with `cfg.window` messages in flight on each of `cfg.clients` sockets, in
/// `cfg.load_threads` shards (an epoll set each): warm-up, then the measured phase.
fn echo(cfg: &SessionsConfig, server: &mut ServerProcess, run: &mut SessionsRun) -> Result<()> {
    let n = cfg.clients;
    let per_ip = cfg.clients_per_ip.max(1);
    let addr = server.addr;
    let shard = |range: Range<usize>, ctl: &Control<EchoSeen>| -> Result<()> {
        let t0 = Instant::now();
        let setup = (|| -> Result<(Epoll, Vec<Socket>)> {
            let epoll = Epoll::new()?;
            let mut socks = Vec::with_capacity(range.len());
            for (k, i) in range.clone().enumerate() {
                let s = client_socket(group_ip(i / per_ip), addr)
                    .with_context(|| format!("client {i}"))?;
                epoll.add(s.as_raw_fd(), k as u64)?;
                socks.push(s);
            }
            Ok((epoll, socks))
        })();
        let (setup, outcome) = match setup {
            Ok(x) => {
                let k = x.1.len();
                (Some(x), Ok((k, t0.elapsed())))
            }
            Err(e) => (None, Err(e)),
        };
        let (Some(_), Some((mut epoll, socks))) = (ctl.connected(outcome), setup) else {
            return Ok(());
        };
        let fds: Vec<RawFd> = socks.iter().map(|s| s.as_raw_fd()).collect();
        let mut msg = vec![0u8; cfg.payload.max(8)];
        let mut meter = EchoMeter::start(cfg, fds.len());
        let window = meter.window();
        for &fd in &fds {
            for seq in 0..window {
                msg[..8].copy_from_slice(&seq.to_le_bytes());
                send(fd, &msg)?;
            }
        }
        // One batch for every socket: at most `window` echoes can be waiting on one.
        let mut batch = MmsgBatch::new(window as usize);
        while ctl.phase() < Phase::Drain {
            if ctl.phase() == Phase::Measured {
                meter.begin_measuring();
            }
            let ready = epoll.wait(Duration::from_millis(5))?;
            let now = Instant::now();
            for k in 0..ready {
                let i = epoll.token(k);
                let got = match batch.recv(fds[i], window as usize, libc::MSG_DONTWAIT) {
                    Ok(got) => got,
                    Err(e) => match e.kind() {
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => continue,
                        _ => return Err(e).context("recvmmsg"),
                    },
                };
                // Each echo becomes the client's next message, in place.
                for d in 0..got {
                    let echo = batch.datagram(d);
                    let seq = if echo.len() == msg.len() {
                        seq_of(echo)
                    } else {
                        None
                    };
                    let next = meter.echoed(i, seq, now);
                    if let Some(head) = echo.get_mut(..8) {
                        head.copy_from_slice(&next.to_le_bytes());
                    }
                }
                batch.send_back(fds[i]).context("sendmmsg")?;
            }
        }
        let stalled = meter.waiting_since(STALL);
        ctl.report(meter.finish(stalled, Vec::new()));
        Ok(())
    };
    let (seen, _) = match drive_echo(cfg, server, run, shard)? {
        Ok(x) => x,
        Err(e) => bail!("opening the clients' sockets: {e}"),
    };
    if seen.bad > 0 {
        bail!("{} echoes out of order or altered", seen.bad);
    }
    if seen.stalled > 0 {
        bail!(
            "{} of {n} clients got no echo for {STALL:?}: a datagram was lost (the floor does \
             not resend)",
            seen.stalled
        );
    }
    Ok(())
}

/// Churn: batches of fresh sockets in `cfg.load_threads` shards ([`drive_churn`]) until
/// `cfg.seconds` of batches have passed; each socket waits for `CHURN_EXCHANGES - 1` answers
/// in turn, sends once more and closes. A batch that makes no progress for [`STALL`] ends the
/// run with an error (and what completed).
fn churn(cfg: &SessionsConfig, server: &mut ServerProcess, run: &mut SessionsRun) -> Result<()> {
    server.reset()?;
    let addr = server.addr;
    let churned = drive_churn(cfg, |range, number| churn_batch(cfg, addr, range, number));
    let stats = server.stats()?;
    run.set_churn(&churned, &stats);
    if let Some(e) = churned.errors.first() {
        bail!("{e}");
    }
    Ok(())
}

/// One churn batch of sockets `range` (batch `number` of its shard, on addresses no earlier
/// batch used, as Ricochet's).
fn churn_batch(
    cfg: &SessionsConfig,
    server: SocketAddr,
    range: Range<usize>,
    number: usize,
) -> Result<Batch> {
    let n = range.len();
    let msg = vec![0u8; cfg.payload.max(8)];
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let t0 = Instant::now();
    let mut epoll = Epoll::new()?;
    let mut socks: Vec<Option<Socket>> =
        open_clients(cfg, server, range, number * groups(cfg), &epoll)?
            .into_iter()
            .map(Some)
            .collect();
    let mut answers_left = vec![CHURN_EXCHANGES - 1; n];
    for s in socks.iter().flatten() {
        send(s.as_raw_fd(), &msg)?;
    }
    let mut left = n;
    let mut progress = Instant::now();
    while left > 0 && progress.elapsed() < STALL {
        let ready = epoll.wait(Duration::from_millis(5))?;
        for k in 0..ready {
            let i = epoll.token(k);
            let Some(fd) = socks[i].as_ref().map(|s| s.as_raw_fd()) else {
                continue;
            };
            if recv(fd, &mut buf)?.is_none() {
                continue;
            }
            progress = Instant::now();
            answers_left[i] -= 1;
            send(fd, &msg)?;
            if answers_left[i] == 0 {
                // The last datagram (a close) is out: closing the socket also takes it
                // out of the epoll set, and the server's answer finds no one.
                socks[i] = None;
                left -= 1;
            }
        }
    }
    // The batch's epoll set is closed in the batch's time too, as Ricochet's set is.
    drop(epoll);
    drop(socks);
    let mut errors = Vec::new();
    if left > 0 {
        errors.push(format!(
            "{left} of {n} churn clients got no answer for {STALL:?}: a datagram was lost (the \
             floor does not resend)"
        ));
    }
    Ok(Batch {
        completed: n - left,
        took: t0.elapsed(),
        errors,
    })
}
