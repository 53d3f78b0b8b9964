//! One closed-loop echo client: its own thread and socket, a window of messages in flight.
//!
//! Each phase starts with a burst of `window` messages (as the reference does, so receive-buffer
//! overflow under bursts shows up as loss); every settled echo releases one new message. A lost
//! message is not replaced: it shrinks that client's window until the phase ends, and counts as
//! lost once the drain time runs out.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use socket2::{Domain, Protocol, Socket, Type};

use super::message::{write_message, Phase};
use super::tracker::{Echo, Tracker};
use crate::schema::{PhaseCounts, Phases, SocketBuffers};

/// How long one blocking receive waits before the loop checks its deadlines again.
const RECV_SLICE: Duration = Duration::from_millis(5);

/// What one client does.
#[derive(Debug, Clone)]
pub struct ClientPlan {
    /// Client id (carried in every message).
    pub client: u32,
    /// Server address.
    pub server: SocketAddr,
    /// Datagram size, bytes.
    pub payload: usize,
    /// Messages in flight.
    pub window: usize,
    /// Warm-up duration (zero: no warm-up phase).
    pub warmup: Duration,
    /// Measured duration (an upper bound when `messages` is set).
    pub measured: Duration,
    /// Longest wait for in-flight messages after a phase.
    pub drain: Duration,
    /// Messages per phase, when bounded by count; the drain then sends no load-keeping messages,
    /// so the counts are exact.
    pub messages: Option<u64>,
    /// Receive buffer to request, bytes.
    pub recv_buffer: Option<usize>,
    /// Send buffer to request, bytes.
    pub send_buffer: Option<usize>,
    /// Instant that `send_ns` in the header counts from.
    pub epoch: Instant,
    /// How datagrams are sent and received.
    pub io: ClientIo,
}

/// What one client measured.
#[derive(Debug)]
pub struct ClientOutcome {
    /// Counts per phase.
    pub phases: Phases,
    /// Measured-phase RTTs, ns.
    pub rtt_ns: Histogram<u64>,
    /// Intact measured-phase echoes received before the measured deadline.
    pub round_trips: u64,
    /// This client's socket.
    pub socket: Option<SocketBuffers>,
    /// Setup failure, if the client could not run.
    pub error: Option<String>,
}

/// Synchronization points shared by the clients and the coordinator.
#[derive(Debug, Clone)]
pub struct Sync {
    /// Everyone ready: warm-up starts.
    pub start_warmup: Arc<Barrier>,
    /// Warm-up drained everywhere: the measured phase starts.
    pub start_measured: Arc<Barrier>,
    /// Measured deadline passed (or count reached) everywhere: drains start.
    pub end_measured: Arc<Barrier>,
    /// Everything drained.
    pub done: Arc<Barrier>,
}

impl Sync {
    /// Barriers for `clients` client threads plus one coordinator.
    pub fn new(clients: usize) -> Sync {
        let b = || Arc::new(Barrier::new(clients + 1));
        Sync {
            start_warmup: b(),
            start_measured: b(),
            end_measured: b(),
            done: b(),
        }
    }
}

/// Open a client socket: bound to the loopback (or wildcard) of the server's family,
/// connected to the server, buffers as requested. Returns the socket and its buffers.
pub fn open_client_socket(
    server: SocketAddr,
    recv_buffer: Option<usize>,
    send_buffer: Option<usize>,
) -> Result<(UdpSocket, SocketBuffers)> {
    let domain = Domain::for_address(server);
    let socket = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP)).context("client socket")?;
    if let Some(n) = recv_buffer {
        socket.set_recv_buffer_size(n).context("client SO_RCVBUF")?;
    }
    if let Some(n) = send_buffer {
        socket.set_send_buffer_size(n).context("client SO_SNDBUF")?;
    }
    let local: SocketAddr = match server {
        SocketAddr::V4(a) if a.ip().is_loopback() => "127.0.0.1:0".parse()?,
        SocketAddr::V4(_) => "0.0.0.0:0".parse()?,
        SocketAddr::V6(a) if a.ip().is_loopback() => "[::1]:0".parse()?,
        SocketAddr::V6(_) => "[::]:0".parse()?,
    };
    socket.bind(&local.into()).context("client bind")?;
    socket.connect(&server.into()).context("client connect")?;
    let info = SocketBuffers {
        local_addr: socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map(|a| a.to_string())
            .unwrap_or_default(),
        recv_requested: recv_buffer,
        recv_granted: socket.recv_buffer_size().unwrap_or(0),
        send_requested: send_buffer,
        send_granted: socket.send_buffer_size().unwrap_or(0),
        drops: None,
    };
    let socket: UdpSocket = socket.into();
    socket
        .set_read_timeout(Some(RECV_SLICE))
        .context("client read timeout")?;
    Ok((socket, info))
}

/// Open a `gso`-mode client: a platform backend (GRO on) on a socket bound like
/// [`open_client_socket`]'s (not connected: the backend addresses every send).
pub fn open_client_backend(
    server: SocketAddr,
    recv_buffer: Option<usize>,
    send_buffer: Option<usize>,
) -> Result<(Box<dyn ricochet_platform::Backend>, SocketBuffers)> {
    let local: SocketAddr = match server {
        SocketAddr::V4(a) if a.ip().is_loopback() => "127.0.0.1:0".parse()?,
        SocketAddr::V4(_) => "0.0.0.0:0".parse()?,
        SocketAddr::V6(a) if a.ip().is_loopback() => "[::1]:0".parse()?,
        SocketAddr::V6(_) => "[::]:0".parse()?,
    };
    let mut sc = ricochet_platform::SocketConfig::new(local);
    sc.recv_buffer = recv_buffer;
    sc.send_buffer = send_buffer;
    let bound = ricochet_platform::bind(&sc).context("client bind")?;
    let cfg = ricochet_platform::BackendConfig {
        // io_uring where it works: sending the refill and waiting for echoes is then one
        // submission (mmsg needs sendmmsg, recvmmsg and epoll_wait for the same turn).
        kind: ricochet_platform::BackendKind::Auto,
        // Each receive slot or provided buffer takes a whole GRO run (up to 64 KiB).
        batch_size: 32,
        recv_buffers: 32,
        gro: true,
        ..ricochet_platform::BackendConfig::default()
    };
    let backend = ricochet_platform::open(bound, &cfg).context("client backend")?;
    let si = backend.socket_info();
    let info = SocketBuffers {
        local_addr: si.local_addr.to_string(),
        recv_requested: recv_buffer,
        recv_granted: si.recv_buffer_granted,
        send_requested: send_buffer,
        send_granted: si.send_buffer_granted,
        drops: None,
    };
    Ok((backend, info))
}

/// How a client moves its datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientIo {
    /// `send` / `recv`, one system call per datagram.
    Std,
    /// `sendmmsg` / `recvmmsg` on the connected socket (the platform's
    /// [`SlotBatch`](ricochet_platform::linux::SlotBatch)): refills and queued echoes in one
    /// call each, the receive blocking until one echo is there (Linux).
    Mmsg,
    /// The platform's backend (`auto`: io_uring where it works) with GSO coalescing and GRO: a refill leaves as UDP GSO
    /// runs (one kernel send per up to 64 datagrams) and echoes arrive as GRO runs (Linux with
    /// `UDP_SEGMENT` and `UDP_GRO`).
    Gso,
    /// The most efficient mode for the run: `gso` when more than one message is in flight
    /// (a window of one leaves nothing to coalesce, and `mmsg`'s blocking `recvmmsg` then
    /// costs fewer system calls per turn) and the kernel has GSO and GRO, else `mmsg` on
    /// Linux, else `std`. Runs record the mode chosen.
    Auto,
}

impl ClientIo {
    /// Parse `auto`, `std`, `mmsg` or `gso`.
    pub fn parse(s: &str) -> Option<ClientIo> {
        match s {
            "auto" => Some(ClientIo::Auto),
            "std" => Some(ClientIo::Std),
            "mmsg" if cfg!(target_os = "linux") => Some(ClientIo::Mmsg),
            "gso" if cfg!(target_os = "linux") => Some(ClientIo::Gso),
            _ => None,
        }
    }

    /// The flag spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientIo::Std => "std",
            ClientIo::Mmsg => "mmsg",
            ClientIo::Gso => "gso",
            ClientIo::Auto => "auto",
        }
    }

    /// The default flag value: `auto` (see [`ClientIo::Auto`]).
    pub fn default_name() -> &'static str {
        "auto"
    }

    /// Why `gso` cannot run here, if it cannot.
    pub fn gso_unavailable() -> Option<String> {
        if !cfg!(target_os = "linux") {
            return Some("gso client I/O needs Linux".into());
        }
        let caps = ricochet_platform::probe();
        [&caps.gso, &caps.gro]
            .into_iter()
            .find(|c| !c.available)
            .map(|c| c.detail.clone())
    }

    /// The mode that runs for a request of `self` with `window` messages in flight per client:
    /// `auto` picks one, and `gso` falls back to `mmsg` where the kernel lacks GSO or GRO
    /// (the reason is returned).
    pub fn resolve(self, window: usize) -> (ClientIo, Option<String>) {
        match self {
            ClientIo::Gso => match Self::gso_unavailable() {
                Some(why) => (
                    ClientIo::Mmsg,
                    Some(format!("gso client I/O unavailable ({why}); using mmsg")),
                ),
                None => (ClientIo::Gso, None),
            },
            ClientIo::Auto if !cfg!(target_os = "linux") => (ClientIo::Std, None),
            ClientIo::Auto if window > 1 && Self::gso_unavailable().is_none() => {
                (ClientIo::Gso, None)
            }
            ClientIo::Auto => (ClientIo::Mmsg, None),
            other => (other, None),
        }
    }
}

enum Io {
    Std {
        out: Vec<u8>,
        inbuf: Vec<u8>,
    },
    #[cfg(target_os = "linux")]
    Mmsg {
        tx: ricochet_platform::linux::SlotBatch,
        rx: ricochet_platform::linux::SlotBatch,
        seqs: Vec<u64>,
    },
    /// Sends are queued in a coalescing batch and leave with the next receive poll (one
    /// submission: send the refill, then wait for echoes).
    Gso {
        backend: Box<dyn ricochet_platform::Backend>,
        batch: ricochet_platform::SendBatch,
        server: SocketAddr,
    },
}

/// Most bytes of batch slots per direction per client (keeps 16 clients × 64 KiB payloads sane).
#[cfg(target_os = "linux")]
const BATCH_BYTES: usize = 2 << 20;

/// A client's socket: a plain connected one, or a platform backend (gso mode).
enum ClientSocket {
    Std(UdpSocket),
    Backend(Box<dyn ricochet_platform::Backend>),
}

struct Client {
    plan: ClientPlan,
    /// The connected socket (`std` and `mmsg` modes; `gso` owns its socket in the backend).
    socket: Option<UdpSocket>,
    tracker: Tracker,
    io: Io,
    round_trips: u64,
    /// Measured-phase echoes count as round trips until this instant.
    measured_deadline: Option<Instant>,
}

/// Classify one datagram; returns true when it settled an outstanding message (a slot is free).
fn settle(
    tracker: &mut Tracker,
    round_trips: &mut u64,
    measured_deadline: Option<Instant>,
    epoch: Instant,
    data: &[u8],
    current: Phase,
) -> bool {
    let now = u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
    match tracker.on_echo(data, now, current) {
        Echo::Fresh { phase, .. } => {
            if phase == Phase::Measured && measured_deadline.is_some_and(|d| Instant::now() < d) {
                *round_trips += 1;
            }
            true
        }
        Echo::ContentError { settled } => settled,
        Echo::Duplicate | Echo::Late => false,
    }
}

fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

impl Client {
    fn new(plan: ClientPlan, socket: ClientSocket) -> Client {
        let socket = match socket {
            ClientSocket::Std(s) => s,
            ClientSocket::Backend(backend) => {
                let mut batch = ricochet_platform::SendBatch::new(plan.window.clamp(1, 1024));
                batch.set_coalescing(true);
                let io = Io::Gso {
                    backend,
                    batch,
                    server: plan.server,
                };
                return Client {
                    tracker: Tracker::new(plan.client, plan.payload),
                    socket: None,
                    io,
                    round_trips: 0,
                    measured_deadline: None,
                    plan,
                };
            }
        };
        let io = match plan.io {
            #[cfg(target_os = "linux")]
            ClientIo::Mmsg => {
                // One more byte than the payload, so an over-long echo shows as a length error.
                let slot = plan.payload + 1;
                let slots = (BATCH_BYTES / slot).clamp(1, plan.window.clamp(1, 64));
                Io::Mmsg {
                    tx: ricochet_platform::linux::SlotBatch::new(slots, slot),
                    rx: ricochet_platform::linux::SlotBatch::new(slots, slot),
                    seqs: Vec::with_capacity(slots),
                }
            }
            _ => Io::Std {
                out: vec![0u8; plan.payload],
                inbuf: vec![0u8; 65_536],
            },
        };
        Client {
            tracker: Tracker::new(plan.client, plan.payload),
            socket: Some(socket),
            io,
            round_trips: 0,
            measured_deadline: None,
            plan,
        }
    }

    /// Send `n` new messages tagged `phase`.
    fn send_n(&mut self, phase: Phase, n: u64) {
        let client = self.plan.client;
        let payload = self.plan.payload;
        let epoch = self.plan.epoch;
        let now_ns = move || u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        match &mut self.io {
            Io::Std { out, .. } => {
                let Some(socket) = &self.socket else {
                    return;
                };
                for _ in 0..n {
                    let now = now_ns();
                    let seq = self.tracker.on_send(phase, now);
                    write_message(out, client, seq, now, phase);
                    match socket.send(out) {
                        Ok(k) if k == out.len() => {}
                        _ => self.tracker.on_send_failed(seq),
                    }
                }
            }
            #[cfg(target_os = "linux")]
            Io::Mmsg { tx, seqs, .. } => {
                let Some(socket) = &self.socket else {
                    return;
                };
                let mut left = n;
                while left > 0 {
                    let k = left.min(tx.slots() as u64) as usize;
                    seqs.clear();
                    for i in 0..k {
                        let now = now_ns();
                        let seq = self.tracker.on_send(phase, now);
                        write_message(tx.slot_mut(i, payload), client, seq, now, phase);
                        seqs.push(seq);
                    }
                    let sent = tx.send(socket, k).unwrap_or(0);
                    for &seq in &seqs[sent.min(k)..] {
                        self.tracker.on_send_failed(seq);
                    }
                    left -= k as u64;
                }
            }
            Io::Gso {
                backend,
                batch,
                server,
            } => {
                for _ in 0..n {
                    if batch.is_full() && backend.flush(batch).is_err() {
                        break;
                    }
                    let now = now_ns();
                    let seq = self.tracker.on_send(phase, now);
                    let pushed = batch.push_with(*server, payload, |buf| {
                        write_message(&mut buf[..payload], client, seq, now, phase);
                        payload
                    });
                    if pushed.is_err() {
                        self.tracker.on_send_failed(seq);
                    }
                }
                // The refill leaves with the next receive poll, in the same submission.
            }
        }
    }

    /// Receive what has arrived (waiting up to one receive slice); returns how many
    /// outstanding messages were settled.
    fn recv_some(&mut self, current: Phase) -> u64 {
        let (epoch, deadline) = (self.plan.epoch, self.measured_deadline);
        let result = match &mut self.io {
            Io::Std { inbuf, .. } => match &self.socket {
                Some(socket) => socket.recv(inbuf),
                None => Err(io::Error::from(io::ErrorKind::NotConnected)),
            }
            .map(|n| {
                u64::from(settle(
                    &mut self.tracker,
                    &mut self.round_trips,
                    deadline,
                    epoch,
                    &inbuf[..n],
                    current,
                ))
            }),
            #[cfg(target_os = "linux")]
            Io::Mmsg { rx, .. } => match &self.socket {
                Some(socket) => rx.recv(socket),
                None => Err(io::Error::from(io::ErrorKind::NotConnected)),
            }
            .map(|n| {
                (0..n)
                    .filter(|&i| {
                        settle(
                            &mut self.tracker,
                            &mut self.round_trips,
                            deadline,
                            epoch,
                            rx.datagram(i),
                            current,
                        )
                    })
                    .count() as u64
            }),
            Io::Gso { backend, batch, .. } => match backend.poll(batch, Some(RECV_SLICE)) {
                Ok(_) => {
                    let mut released = 0;
                    for d in backend.received().iter() {
                        for segment in d.segments() {
                            released += u64::from(settle(
                                &mut self.tracker,
                                &mut self.round_trips,
                                deadline,
                                epoch,
                                segment,
                                current,
                            ));
                        }
                    }
                    Ok(released)
                }
                Err(e) => Err(io::Error::other(e)),
            },
        };
        match result {
            Ok(released) => released,
            Err(e) if transient(&e) => 0,
            Err(_) => {
                self.tracker.on_recv_error(current);
                // An ICMP error (e.g. port unreachable) is reported once; don't spin on it.
                std::thread::sleep(Duration::from_millis(1));
                0
            }
        }
    }

    /// Run one phase until its deadline or its message count.
    fn run_phase(&mut self, phase: Phase, length: Duration) {
        let deadline = Instant::now() + length;
        if phase == Phase::Measured {
            self.measured_deadline = Some(deadline);
        }
        let budget = self.plan.messages.unwrap_or(u64::MAX);
        let first = budget.min(self.plan.window as u64);
        self.send_n(phase, first);
        let mut sent = first;
        while sent < budget && Instant::now() < deadline {
            let released = self.recv_some(phase);
            if released > 0 && Instant::now() < deadline {
                let k = released.min(budget - sent);
                self.send_n(phase, k);
                sent += k;
            }
        }
    }

    /// Wait for outstanding messages until `until` (or none are left). With `refill`, every
    /// settled echo is replaced by a drain-phase message while measured messages are still out,
    /// so the last measured messages see the same load as the others.
    fn drain(&mut self, until: Instant, refill: bool) {
        while self.tracker.outstanding() > 0 && Instant::now() < until {
            if refill && self.tracker.outstanding_in(Phase::Measured) == 0 {
                return;
            }
            let released = self.recv_some(Phase::Drain);
            if refill && released > 0 && self.tracker.outstanding_in(Phase::Measured) > 0 {
                self.send_n(Phase::Drain, released);
            }
        }
    }
}

/// Run one client through every phase, meeting the coordinator at each barrier. Never returns
/// early: a client that failed to set up still waits at every barrier so no one deadlocks.
pub fn run_client(plan: ClientPlan, sync: Sync) -> ClientOutcome {
    let opened = match plan.io {
        ClientIo::Gso => open_client_backend(plan.server, plan.recv_buffer, plan.send_buffer)
            .map(|(b, info)| (ClientSocket::Backend(b), info)),
        _ => open_client_socket(plan.server, plan.recv_buffer, plan.send_buffer)
            .map(|(s, info)| (ClientSocket::Std(s), info)),
    };
    let (socket, info) = match opened {
        Ok(x) => x,
        Err(e) => {
            for b in [
                &sync.start_warmup,
                &sync.start_measured,
                &sync.end_measured,
                &sync.done,
            ] {
                b.wait();
            }
            return ClientOutcome {
                phases: Phases::default(),
                rtt_ns: super::tracker::new_rtt_histogram(),
                round_trips: 0,
                socket: None,
                error: Some(format!("client {}: {e:#}", plan.client)),
            };
        }
    };
    let mut c = Client::new(plan, socket);
    let drain = c.plan.drain;
    sync.start_warmup.wait();
    if !c.plan.warmup.is_zero() {
        c.run_phase(Phase::Warmup, c.plan.warmup);
        c.drain(Instant::now() + drain, false);
        c.tracker.expire_outstanding();
    }
    sync.start_measured.wait();
    c.run_phase(Phase::Measured, c.plan.measured);
    sync.end_measured.wait();
    let refill = c.plan.messages.is_none();
    if refill {
        c.drain(Instant::now() + drain, true);
    }
    c.drain(Instant::now() + drain, false);
    c.tracker.expire_outstanding();
    sync.done.wait();
    let counts = |p: Phase| -> PhaseCounts { *c.tracker.counts(p) };
    ClientOutcome {
        phases: Phases {
            warmup: counts(Phase::Warmup),
            measured: counts(Phase::Measured),
            drain: counts(Phase::Drain),
        },
        round_trips: c.round_trips,
        socket: Some(info),
        error: None,
        rtt_ns: c.tracker.rtt_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::ClientIo;

    #[test]
    fn auto_client_io_picks_by_window_and_kernel() {
        assert_eq!(
            ClientIo::parse(ClientIo::default_name()),
            Some(ClientIo::Auto)
        );
        let (one, why) = ClientIo::Auto.resolve(1);
        assert!(why.is_none());
        let (many, _) = ClientIo::Auto.resolve(16);
        if cfg!(target_os = "linux") {
            assert_eq!(
                one,
                ClientIo::Mmsg,
                "nothing to coalesce with one in flight"
            );
            let expected = match ClientIo::gso_unavailable() {
                None => ClientIo::Gso,
                Some(_) => ClientIo::Mmsg,
            };
            assert_eq!(many, expected);
            // An explicit gso request falls back only with a reason.
            let (gso, why) = ClientIo::Gso.resolve(16);
            assert_eq!(gso == ClientIo::Mmsg, why.is_some());
        } else {
            assert_eq!((one, many), (ClientIo::Std, ClientIo::Std));
        }
        for m in [ClientIo::Std, ClientIo::Mmsg, ClientIo::Gso, ClientIo::Auto] {
            if cfg!(target_os = "linux") || m == ClientIo::Std || m == ClientIo::Auto {
                assert_eq!(ClientIo::parse(m.as_str()), Some(m));
            }
        }
    }
}
