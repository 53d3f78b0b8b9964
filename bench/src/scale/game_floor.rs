//! The kernel floor of `bench game` (`--stack kernel`, Linux): the game's traffic over plain
//! UDP sockets, with no protocol, no encryption, no sessions and no resend.
//!
//! - **Server**: in the same child process as Ricochet's server, `io_threads` threads, each
//!   with its own `SO_REUSEPORT` socket on the one port. A thread sleeps until its next tick
//!   (a fixed grid, as the runtime's tick), reads every input that came meanwhile with
//!   `recvmmsg` (learning a player's address from its first input), then sends the tick's
//!   snapshot to each of its players with `sendmmsg`, 32 to a call: what Ricochet's workers
//!   do on the `tick` idle strategy, without the protocol.
//! - **Players**: N connected, non-blocking sockets on `--load-threads` threads (a shard of
//!   them each, as a Ricochet run's players), bound as a Ricochet run's members are, each
//!   thread waiting on its own [`Poller`] (the readiness set a `ClientSet` uses, with the same
//!   nanosecond timeouts). Inputs leave on the same grid as in a Ricochet run
//!   (player i's k-th at start + (k + i/N) periods), one `send` each; a ready socket gets one
//!   `recv`.
//!
//! The floor's server threads are never pinned (Ricochet's workers are pinned only when the
//! machine has more cores than workers, under the default `auto`), and a run's `--server-idle`,
//! `--backend`, `--profile`, `--security` and `--acks-on-tick` do not apply to it.
//!
//! At 60 Hz and N players that is 60 × N datagrams each way a second: the server's CPU is
//! what this machine's kernel costs for that traffic (the bound under any protocol on top),
//! and the players' latency what one plain thread of this shape sees. A lost datagram is not
//! resent: an input lost on loopback is reported as an error, not hidden.

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{SocketAddr, SocketAddrV4};
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use socket2::{SockAddr, Socket};

use ricochet_platform::Poller;

use super::floor::{
    client_socket, recv, send, workers, MmsgBatch, ServerThreads, MAX_DATAGRAM, STOP_POLL,
};
use super::game_meter::{drive_game, server_faults, PlayerMeter, PlayersSeen};
use super::load::{Control, Driven, Phase};
use super::server::{
    announce, answer_commands, monotonic_ns, send as tell, FromServer, ServerKind, ServerProcess,
    ServerSpec, INPUT_HEADER, SNAPSHOT_HEADER,
};
use super::setup::group_ip;
use crate::host::CpuTimes;
use crate::schema::scale::WorkerStats;
use crate::schema::{finite, GameConfig, GameRun, GameServerCounts, ServerStats};

/// Snapshots per `sendmmsg`.
const SEND_BATCH: usize = 32;
/// Inputs per `recvmmsg`.
const RECV_BATCH: usize = 64;
/// How long the players keep reading after their last input, so inputs in flight arrive.
const DRAIN: Duration = Duration::from_millis(500);

// ---------------------------------------------------------------------------------------------
// Server (in the server process).

/// One server thread's counters (read by the stats answers while it runs).
#[derive(Debug, Default)]
struct ThreadCounts {
    ticks: AtomicU64,
    ticks_late: AtomicU64,
    ticks_skipped: AtomicU64,
    lateness_max_ns: AtomicU64,
    snapshots_sent: AtomicU64,
    snapshot_send_errors: AtomicU64,
    inputs: AtomicU64,
    input_order_errors: AtomicU64,
}

/// The floor's game server: per thread, its tick and traffic counters.
type GameServer = ServerThreads<ThreadCounts>;

/// Start the game server's `n` threads on `bind`, ticking every `tick` with snapshots of
/// `snapshot` bytes.
fn start_game(bind: SocketAddr, n: usize, tick: Duration, snapshot: usize) -> Result<GameServer> {
    ServerThreads::start(
        bind,
        n,
        ("floor-game", "floor game server"),
        |_| Ok(()),
        move |sock, stop, counts| Ticker::new(tick, snapshot).run(sock, stop, counts),
    )
}

/// One server thread's state: its players and the tick grid.
struct Ticker {
    tick: Duration,
    snapshot: Vec<u8>,
    /// Player index by address, and per player its address and next expected input.
    index: HashMap<SocketAddrV4, usize>,
    names: Vec<SockAddr>,
    next_input: Vec<u64>,
    inputs: MmsgBatch,
    tick_no: u64,
}

impl Ticker {
    fn new(tick: Duration, snapshot: usize) -> Ticker {
        Ticker {
            tick,
            snapshot: vec![0xab; snapshot.max(SNAPSHOT_HEADER)],
            index: HashMap::new(),
            names: Vec::new(),
            next_input: Vec::new(),
            inputs: MmsgBatch::new(RECV_BATCH),
            tick_no: 0,
        }
    }

    /// Tick on the grid `start + k × tick` until `stop`, then read what is still queued.
    fn run(mut self, sock: &Socket, stop: &AtomicBool, c: &ThreadCounts) -> io::Result<()> {
        let fd = sock.as_raw_fd();
        let start = Instant::now();
        let mut k = 1u32;
        while !stop.load(Ordering::Relaxed) {
            let due = start + self.tick * k;
            let now = Instant::now();
            if due > now {
                // Sleep in short steps, so a stop is seen within STOP_POLL.
                std::thread::sleep((due - now).min(STOP_POLL));
                if Instant::now() < due {
                    continue;
                }
            }
            let now = Instant::now();
            let late = now.saturating_duration_since(due);
            if late > self.tick / 2 {
                c.ticks_late.fetch_add(1, Ordering::Relaxed);
            }
            c.lateness_max_ns
                .fetch_max(late.as_nanos() as u64, Ordering::Relaxed);
            // Due times that passed while this one was late are skipped, not run in a burst.
            while start + self.tick * (k + 1) <= now {
                k += 1;
                c.ticks_skipped.fetch_add(1, Ordering::Relaxed);
            }
            k += 1;
            self.read_inputs(fd, c)?;
            self.send_snapshots(fd, c)?;
        }
        self.read_inputs(fd, c)
    }

    /// Every input queued on the socket: count it, check its order, learn its sender.
    fn read_inputs(&mut self, fd: RawFd, c: &ThreadCounts) -> io::Result<()> {
        loop {
            let n = match self.inputs.recv(fd, RECV_BATCH, libc::MSG_DONTWAIT) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            for i in 0..n {
                let from = self.inputs.sender_v4(i);
                let seq = self
                    .inputs
                    .datagram(i)
                    .get(..INPUT_HEADER)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_le_bytes);
                let Some(from) = from else {
                    c.input_order_errors.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                let p = *self.index.entry(from).or_insert_with(|| {
                    self.names.push(SockAddr::from(from));
                    self.next_input.push(0);
                    self.names.len() - 1
                });
                if seq != Some(self.next_input[p]) {
                    c.input_order_errors.fetch_add(1, Ordering::Relaxed);
                }
                self.next_input[p] = seq.map_or(self.next_input[p], |q| q + 1);
                c.inputs.fetch_add(1, Ordering::Relaxed);
            }
            if n < RECV_BATCH {
                return Ok(());
            }
        }
    }

    /// This tick's snapshot (tick number, send time) to every player, [`SEND_BATCH`] a call.
    fn send_snapshots(&mut self, fd: RawFd, c: &ThreadCounts) -> io::Result<()> {
        self.tick_no += 1;
        c.ticks.fetch_add(1, Ordering::Relaxed);
        self.snapshot[..8].copy_from_slice(&self.tick_no.to_le_bytes());
        self.snapshot[8..16].copy_from_slice(&monotonic_ns().to_le_bytes());
        let mut iov = libc::iovec {
            iov_base: self.snapshot.as_mut_ptr().cast(),
            iov_len: self.snapshot.len(),
        };
        // One pointer for every header (a fresh `&mut` per header would invalidate the others).
        let iov_ptr = std::ptr::addr_of_mut!(iov);
        // SAFETY: all-zero is a valid mmsghdr (null pointers, zero lengths).
        let mut hdrs: [libc::mmsghdr; SEND_BATCH] = unsafe { std::mem::zeroed() };
        for chunk in self.names.chunks(SEND_BATCH) {
            for (h, name) in hdrs.iter_mut().zip(chunk) {
                // The kernel only reads a send's address.
                h.msg_hdr.msg_name = name.as_ptr().cast_mut().cast();
                h.msg_hdr.msg_namelen = name.len();
                h.msg_hdr.msg_iov = iov_ptr;
                h.msg_hdr.msg_iovlen = 1;
            }
            let mut done = 0;
            while done < chunk.len() {
                // SAFETY: headers `done..chunk.len()` point at `chunk`'s names and at `iov`,
                // which points into `self.snapshot`; none of them moves during the call.
                let sent = unsafe {
                    libc::sendmmsg(
                        fd,
                        hdrs[done..].as_mut_ptr(),
                        (chunk.len() - done) as u32,
                        0,
                    )
                };
                if sent < 0 {
                    let e = io::Error::last_os_error();
                    match e.kind() {
                        io::ErrorKind::Interrupted => continue,
                        // A full socket: the rest of this chunk is refused, as a session
                        // with a full queue refuses a snapshot.
                        io::ErrorKind::WouldBlock => {
                            c.snapshot_send_errors
                                .fetch_add((chunk.len() - done) as u64, Ordering::Relaxed);
                            break;
                        }
                        _ => return Err(e),
                    }
                }
                done += sent as usize;
                c.snapshots_sent.fetch_add(sent as u64, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

/// The server process's main for [`ServerKind::KernelGame`]: start, answer `stats`, `reset`
/// and `quit` as [`super::server::serve_process`] does.
pub(super) fn serve_process(
    spec: &ServerSpec,
    lines: impl Iterator<Item = io::Result<String>>,
    mut output: impl Write,
) -> Result<()> {
    let ServerKind::KernelGame {
        tick_us,
        snapshot_bytes,
    } = spec.kind
    else {
        bail!("not a kernel game spec");
    };
    let bind: SocketAddr = spec.bind.parse().context("server bind address")?;
    let tick = Duration::from_micros(tick_us.max(1));
    let mut server = announce(
        &mut output,
        start_game(bind, workers(spec.io_threads), tick, snapshot_bytes),
        |s| s.addr,
    )?;
    // Counters at the last reset (the threads' counters run from the start).
    let mut base = GameServerCounts::default();
    let mut since = (CpuTimes::now(), Instant::now());
    let totals = |server: &GameServer| {
        let sum = |f: &dyn Fn(&ThreadCounts) -> &AtomicU64| {
            server
                .counts
                .iter()
                .map(|c| f(c).load(Ordering::Relaxed))
                .sum::<u64>()
        };
        GameServerCounts {
            snapshots_sent: sum(&|c| &c.snapshots_sent),
            snapshot_send_errors: sum(&|c| &c.snapshot_send_errors),
            inputs_received: sum(&|c| &c.inputs),
            input_order_errors: sum(&|c| &c.input_order_errors),
            ticks: sum(&|c| &c.ticks),
        }
    };
    let stats = |server: &GameServer, base: &GameServerCounts, since: &(CpuTimes, Instant)| {
        let t = totals(server);
        ServerStats {
            sessions: 0,
            rss_kib: crate::host::rss_kib(),
            cpu_s: finite(CpuTimes::now().seconds_since(&since.0)),
            wall_s: finite(since.1.elapsed().as_secs_f64()),
            game: GameServerCounts {
                snapshots_sent: t.snapshots_sent - base.snapshots_sent,
                snapshot_send_errors: t.snapshot_send_errors - base.snapshot_send_errors,
                ticks: t.ticks - base.ticks,
                // From the start, as Ricochet's server counts them.
                inputs_received: t.inputs_received,
                input_order_errors: t.input_order_errors,
            },
            workers: server
                .counts
                .iter()
                .map(|c| {
                    let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
                    WorkerStats {
                        loop_turns: r(&c.ticks),
                        datagrams_in: r(&c.inputs),
                        datagrams_out: r(&c.snapshots_sent),
                        ticks: r(&c.ticks),
                        ticks_late: r(&c.ticks_late),
                        ticks_skipped: r(&c.ticks_skipped),
                        tick_lateness_max_ns: r(&c.lateness_max_ns),
                    }
                })
                .collect(),
            ..ServerStats::default()
        }
    };
    // Snapshots go to the players whose inputs came (they start at the go).
    answer_commands(
        lines,
        &mut output,
        || {},
        |reset| {
            if reset {
                base = totals(&server);
                since = (CpuTimes::now(), Instant::now());
            }
            stats(&server, &base, &since)
        },
    )?;
    server.shutdown()?;
    let last = stats(&server, &base, &since);
    tell(&mut output, &FromServer::Stats(Box::new(last)))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Players (in the bench process, `--load-threads` threads).

/// `bench game --stack kernel`: the floor server and `cfg.players` plain players.
pub(super) fn run(cfg: &GameConfig) -> Result<GameRun> {
    if cfg.relay_profile.is_some() {
        bail!("the kernel floor of `bench game` runs on the direct path only");
    }
    if cfg.snapshot_bytes > MAX_DATAGRAM || cfg.input_bytes > MAX_DATAGRAM {
        bail!(
            "the floor reads datagrams of up to {MAX_DATAGRAM} B: snapshots of {} B and inputs \
             of {} B do not fit",
            cfg.snapshot_bytes,
            cfg.input_bytes
        );
    }
    let period = Duration::from_secs_f64(1.0 / cfg.tick_hz.max(1.0));
    let spec = ServerSpec {
        kind: ServerKind::KernelGame {
            tick_us: period.as_micros() as u64,
            snapshot_bytes: cfg.snapshot_bytes,
        },
        bind: "127.0.0.1:0".into(),
        io_threads: cfg.io_threads,
        // The floor's threads always sleep until their tick; the rest has no meaning for it.
        idle: "tick".into(),
        pinning: "never".into(),
        slice_us: None,
        backend: cfg.backend.clone(),
        profile: cfg.profile.clone(),
        max_sessions: None,
        max_sessions_per_address: None,
        token_key: None,
    };
    let mut server = ServerProcess::start(&spec)?;
    let mut errors = Vec::new();
    let outcome = play(cfg, period, &mut server, &mut errors);
    let quit = server.quit();
    let last = match quit {
        Ok(last) => Some(last),
        Err(e) => {
            errors.push(format!("server: {e:#}"));
            None
        }
    };
    let mut run = match outcome {
        Ok(r) => r,
        Err(e) => {
            errors.insert(0, crate::error_chain(e.as_ref()));
            let mut run = GameRun::failed(cfg, last.unwrap_or_default(), String::new());
            run.errors = errors;
            return Ok(run);
        }
    };
    run.ok = errors.is_empty() && run.connected == cfg.players;
    run.errors = errors;
    Ok(run)
}

/// The players' side, from opening their sockets to the drain, on `cfg.load_threads`
/// threads (each its own sockets and readiness set).
fn play(
    cfg: &GameConfig,
    period: Duration,
    server: &mut ServerProcess,
    errors: &mut Vec<String>,
) -> Result<GameRun> {
    let per_ip = cfg.players_per_ip.max(1);
    let addr = server.addr;
    let shard = |range: Range<usize>, ctl: &Control<PlayersSeen>| -> Result<()> {
        let first = range.start;
        let t_connect = Instant::now();
        let setup = (|| -> Result<(Poller, Vec<Socket>)> {
            let mut poller = Poller::new().context("the players' readiness set")?;
            let mut socks = Vec::with_capacity(range.len());
            for i in range.clone() {
                let s = client_socket(group_ip(i / per_ip), addr)
                    .with_context(|| format!("player {i}"))?;
                poller
                    .add(s.as_raw_fd(), (i - first) as u64)
                    .with_context(|| {
                        format!("player {i}: adding its socket to the readiness set")
                    })?;
                socks.push(s);
            }
            Ok((poller, socks))
        })();
        let (setup, outcome) = match setup {
            Ok(x) => {
                let n = x.1.len();
                (Some(x), Ok((n, t_connect.elapsed())))
            }
            Err(e) => (None, Err(e)),
        };
        let (Some(start), Some((mut poller, socks))) = (ctl.connected(outcome), setup) else {
            return Ok(());
        };
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let mut meter = PlayerMeter::new(cfg, period, range, start);
        let mut ready: Vec<u64> = Vec::new();
        // Per snapshot of a pass: the player, and the snapshot's header (as much as came).
        let mut got: Vec<(usize, usize, [u8; SNAPSHOT_HEADER])> = Vec::new();
        while ctl.phase() < Phase::Drain {
            if ctl.phase() == Phase::Measured {
                meter.begin_measuring();
            }
            meter.send_due(Instant::now(), |i, body| {
                send(socks[i].as_raw_fd(), body)
                    .with_context(|| format!("player {} input", first + i))
            })?;
            ready.clear();
            poller
                .wait(Some(meter.wait()), &mut ready)
                .context("waiting for the players' sockets")?;
            // One receive per ready socket; the headers are kept until the pass is over.
            got.clear();
            for &token in &ready {
                let i = token as usize;
                if let Some(len) = recv(socks[i].as_raw_fd(), &mut buf)? {
                    let len = len.min(SNAPSHOT_HEADER);
                    let mut header = [0u8; SNAPSHOT_HEADER];
                    header[..len].copy_from_slice(&buf[..len]);
                    got.push((i, len, header));
                }
            }
            // Stamped after the pass, as a Ricochet run stamps after its set's turn.
            let recv_ns = monotonic_ns();
            for (i, len, header) in &got {
                meter.snapshot(*i, &header[..*len], recv_ns);
            }
        }
        ctl.report(meter.finish());
        // Drain: read snapshots (and let inputs in flight land) until the run is done.
        while ctl.phase() < Phase::Done {
            ready.clear();
            poller
                .wait(Some(Duration::from_millis(5)), &mut ready)
                .context("waiting for the players' sockets")?;
            for &token in &ready {
                recv(socks[token as usize].as_raw_fd(), &mut buf)?;
            }
        }
        Ok(())
    };
    let Driven {
        connect,
        mut seen,
        measured: server_stats,
        drained,
        ..
    } = match drive_game(cfg, server, DRAIN, shard)? {
        Ok(d) => d,
        Err(e) => bail!("opening the players' sockets: {e}"),
    };
    let seen = seen.pop().context("the players' figures")?;
    errors.extend(seen.errors.iter().cloned());
    let inputs_lost = seen
        .inputs_total
        .saturating_sub(drained.game.inputs_received);
    if inputs_lost > 0 {
        errors.push(format!(
            "{inputs_lost} inputs lost (the floor does not resend; loopback lost them)"
        ));
    }
    server_faults(&drained, &server_stats, "a full server socket", errors);
    if seen.received == 0 {
        errors.push("the players received no snapshot in the measured phase".into());
    }
    let mut run = GameRun::measured(cfg, period, &seen, &server_stats);
    run.connected = cfg.players;
    run.connect_s = finite(connect.as_secs_f64());
    run.inputs_lost = inputs_lost;
    run.input_order_errors = drained.game.input_order_errors;
    // The floor keeps a player's address and next input number: no session to weigh.
    run.server_rss_per_session_bytes = None;
    Ok(run)
}
