//! The server of `bench sessions` and `bench game`, in a child process of the bench, so that
//! its resident memory and CPU time are its own (the clients run in the parent).
//!
//! The parent talks to the child over its standard input and output, one JSON message a line:
//!
//! ```text
//! parent → child   spec                    stats | play | reset              quit
//! child → parent         ready {addr}            stats {..}                      stats {..} (final)
//! ```
//!
//! `reset` empties the RTT histograms and restarts the CPU and game counters (the start of a
//! measured phase); `stats` reports everything since. `play` starts a game server's snapshots
//! once every player connected (the go): until then its ticks send nothing, as the kernel
//! floor's server sends only to players whose inputs it has seen, so the connect phase of
//! thousands of players is not run under the snapshot load of those already in.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use ricochet::runtime::{
    CorePinning, Handler, IdleStrategy, Server, ServerConfig, ServerContext, SessionId,
    WorkerCounters,
};
use ricochet_platform::BackendKind;
use serde::{Deserialize, Serialize};

use crate::host::CpuTimes;
use crate::rudp::protocol::BENCH_PROTOCOL_ID;
use crate::schema::scale::{AllocCounts, WorkerStats};
use crate::schema::{finite, GameServerCounts, Latency, ServerStats};
use ricochet_proto::token::TokenKey;

/// The hidden sub-command the server process runs.
pub const SERVER_SUBCOMMAND: &str = "scale-server";

/// The channel game inputs use (reliable-ordered in every profile's channel list).
pub const INPUT_CHANNEL: u8 = 0;
/// The channel game snapshots use (unreliable-sequenced in every profile's channel list).
pub const SNAPSHOT_CHANNEL: u8 = 3;
/// Bytes of a snapshot's header: tick number and send time (monotonic ns), little-endian.
pub const SNAPSHOT_HEADER: usize = 16;
/// Bytes of an input's header: the player's input sequence number.
pub const INPUT_HEADER: usize = 8;

static SERVER_EXECUTABLE: OnceLock<PathBuf> = OnceLock::new();

/// Run the server process from `path` instead of this executable (tests point this at
/// `CARGO_BIN_EXE_bench`). Only the first call counts.
pub fn set_server_executable(path: impl Into<PathBuf>) {
    let _ = SERVER_EXECUTABLE.set(path.into());
}

/// The monotonic clock in nanoseconds, comparable across the processes of one host (the
/// snapshot latency spans the server and client processes).
pub fn monotonic_ns() -> u64 {
    // SAFETY: `clock_gettime` writes one timespec into the zeroed value we own; the clock id
    // is a constant every supported OS has.
    let ts = unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
        ts
    };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// What the server does with its sessions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum ServerKind {
    /// Echo every message on the channel it came on.
    Echo,
    /// A game tick: every `tick` a snapshot of `snapshot_bytes` to every session on
    /// [`SNAPSHOT_CHANNEL`]; inputs on [`INPUT_CHANNEL`] are counted and checked for order.
    Game {
        /// Tick period, µs.
        tick_us: u64,
        /// Snapshot size, bytes (at least [`SNAPSHOT_HEADER`]).
        snapshot_bytes: usize,
        /// Sessions hold input ACKs until the next tick (they ride the snapshots).
        #[serde(default)]
        acks_on_tick: bool,
    },
    /// The kernel floor of `bench sessions --stack kernel` (Linux): plain UDP sockets echo
    /// every datagram, with no protocol and no sessions.
    KernelEcho,
    /// The kernel floor of `bench game --stack kernel` (Linux): plain UDP sockets, a snapshot
    /// to every player's address each tick, inputs counted; no protocol, no sessions.
    KernelGame {
        /// Tick period, µs.
        tick_us: u64,
        /// Snapshot size, bytes (at least [`SNAPSHOT_HEADER`]).
        snapshot_bytes: usize,
    },
}

/// How the server process sets up its server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSpec {
    /// Echo or game.
    pub kind: ServerKind,
    /// Bind address (port 0: any).
    pub bind: String,
    /// Workers.
    pub io_threads: usize,
    /// Idle strategy name (`balanced`, `park`, `spin`).
    pub idle: String,
    /// Core pinning name (`auto`, `always`, `never`).
    pub pinning: String,
    /// Scheduler time slice the workers ask for, µs (`None`: the runtime's default; 0: none
    /// asked).
    pub slice_us: Option<u64>,
    /// Backend name (`auto`, `uring`, `mmsg`).
    pub backend: String,
    /// Protocol profile name (`default`, `game`, `bulk`).
    pub profile: String,
    /// Session limit override (`None`: the default).
    pub max_sessions: Option<usize>,
    /// Per-address session limit override (`None`: the default).
    pub max_sessions_per_address: Option<usize>,
    /// Admit clients by connect token sealed with this key (the bench's protocol id), with
    /// every packet protected; `None`: the insecure mode.
    pub token_key: Option<[u8; 32]>,
}

impl From<&WorkerCounters> for WorkerStats {
    fn from(c: &WorkerCounters) -> Self {
        WorkerStats {
            loop_turns: c.loop_turns,
            datagrams_in: c.datagrams_in,
            datagrams_out: c.datagrams_out,
            ticks: c.ticks,
            ticks_late: c.ticks_late,
            ticks_skipped: c.ticks_skipped,
            tick_lateness_max_ns: c.tick_lateness_max_ns,
        }
    }
}

#[derive(Debug, Default)]
struct GameShared {
    /// Per worker: its endpoint's drops by cause (`DropCause::ALL` order), and its used
    /// tokens evicted.
    endpoint_counts: std::sync::Mutex<HashMap<u32, (Vec<u64>, u64)>>,
    snapshots_sent: AtomicU64,
    snapshot_send_errors: AtomicU64,
    inputs_received: AtomicU64,
    input_order_errors: AtomicU64,
    ticks: AtomicU64,
    /// Every player connected: ticks send snapshots (`play`).
    playing: std::sync::atomic::AtomicBool,
}

impl GameShared {
    fn read(&self) -> GameServerCounts {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        GameServerCounts {
            snapshots_sent: r(&self.snapshots_sent),
            snapshot_send_errors: r(&self.snapshot_send_errors),
            inputs_received: r(&self.inputs_received),
            input_order_errors: r(&self.input_order_errors),
            ticks: r(&self.ticks),
        }
    }

    /// The workers' endpoint drops by cause (non-zero only) and used tokens evicted, summed,
    /// from one look at the table.
    fn endpoint_totals(&self) -> (std::collections::BTreeMap<String, u64>, u64) {
        let mut drops = std::collections::BTreeMap::new();
        let mut evicted = 0;
        if let Ok(m) = self.endpoint_counts.lock() {
            for (counts, e) in m.values() {
                evicted += e;
                for (c, n) in ricochet_proto::DropCause::ALL.iter().zip(counts) {
                    if *n > 0 {
                        *drops.entry(format!("{c:?}")).or_insert(0) += n;
                    }
                }
            }
        }
        (drops, evicted)
    }

    fn reset(&self) {
        // Inputs are not cleared: the bench compares them with everything its players sent.
        for a in [
            &self.snapshots_sent,
            &self.snapshot_send_errors,
            &self.ticks,
        ] {
            a.store(0, Ordering::Relaxed);
        }
    }
}

struct ScaleHandler {
    kind: ServerKind,
    shared: Arc<GameShared>,
    /// Next expected input sequence, per session.
    next_input: HashMap<SessionId, u64>,
    tick: u64,
    body: Vec<u8>,
    /// The sessions a tick sends to (kept between ticks: no allocation per tick).
    sessions: Vec<SessionId>,
}

impl Handler for ScaleHandler {
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
        match self.kind {
            ServerKind::Echo | ServerKind::KernelEcho | ServerKind::KernelGame { .. } => {
                // A refusal (queue full) shows as a missing echo on the client.
                let _ = ctx.send(s, channel, data);
            }
            ServerKind::Game { .. } => {
                let seq = data
                    .get(..INPUT_HEADER)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_le_bytes);
                let expect = self.next_input.entry(s).or_insert(0);
                if channel != INPUT_CHANNEL || seq != Some(*expect) {
                    self.shared
                        .input_order_errors
                        .fetch_add(1, Ordering::Relaxed);
                }
                *expect = seq.map_or(*expect, |q| q + 1);
                self.shared.inputs_received.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn on_disconnect(
        &mut self,
        _: &mut ServerContext<'_>,
        s: SessionId,
        _: ricochet::CloseReason,
        _: bool,
    ) {
        self.next_input.remove(&s);
    }

    fn on_tick(&mut self, ctx: &mut ServerContext<'_>) {
        let stats = ctx.endpoint_stats();
        if let Ok(mut m) = self.shared.endpoint_counts.lock() {
            // Updated in place: the tick allocates nothing of its own but the snapshot.
            let (counts, evicted) = m.entry(ctx.worker()).or_default();
            counts.clear();
            counts.extend(
                ricochet_proto::DropCause::ALL
                    .iter()
                    .map(|&c| stats.drops.get(c)),
            );
            *evicted = stats.tokens_evicted;
        }
        let ServerKind::Game { snapshot_bytes, .. } = self.kind else {
            return;
        };
        if !self.shared.playing.load(Ordering::Relaxed) {
            return;
        }
        self.tick += 1;
        self.shared.ticks.fetch_add(1, Ordering::Relaxed);
        // One body per tick, shared by every session's send (reference-counted, not copied).
        self.body.clear();
        self.body.extend_from_slice(&self.tick.to_le_bytes());
        self.body.extend_from_slice(&monotonic_ns().to_le_bytes());
        self.body.resize(snapshot_bytes.max(SNAPSHOT_HEADER), 0xab);
        let snapshot = Bytes::copy_from_slice(&self.body);
        self.sessions.clear();
        self.sessions.extend(ctx.sessions());
        let (mut sent, mut failed) = (0, 0);
        for &s in &self.sessions {
            match ctx.send(s, SNAPSHOT_CHANNEL, snapshot.clone()) {
                Ok(()) => sent += 1,
                Err(_) => failed += 1,
            }
        }
        self.shared
            .snapshots_sent
            .fetch_add(sent, Ordering::Relaxed);
        self.shared
            .snapshot_send_errors
            .fetch_add(failed, Ordering::Relaxed);
    }
}

fn start_server(spec: &ServerSpec, shared: &Arc<GameShared>) -> Result<Server> {
    let bind: SocketAddr = spec.bind.parse().context("server bind address")?;
    let profile = super::setup::protocol_profile(&spec.profile)?;
    let cfg = ServerConfig::new(bind);
    let cfg = match spec.token_key {
        Some(k) => cfg.tokens(TokenKey::from_bytes(k), BENCH_PROTOCOL_ID),
        None => cfg.insecure(),
    };
    let mut cfg = cfg
        .profile(profile)
        .workers(spec.io_threads)
        .idle(IdleStrategy::from_str(&spec.idle)?)
        .pinning(CorePinning::from_str(&spec.pinning)?)
        .backend(BackendKind::from_str(&spec.backend)?);
    if let Some(us) = spec.slice_us {
        cfg.udp.worker_slice = crate::schema::worker_slice(us);
    }
    if let Some(n) = spec.max_sessions {
        cfg = cfg.max_sessions(n);
    }
    if let Some(n) = spec.max_sessions_per_address {
        cfg = cfg.max_sessions_per_address(n);
    }
    cfg = match spec.kind {
        ServerKind::Game {
            tick_us,
            acks_on_tick,
            ..
        } => {
            let tick = Duration::from_micros(tick_us.max(1));
            let cfg = cfg.tick(tick);
            if acks_on_tick {
                // An input's ACK waits for the next tick's snapshot (the hold is reported in
                // the ACK, so the player's RTT estimate sees it and its probes wait for it).
                cfg.session(|c| {
                    c.max_ack_delay = tick + Duration::from_millis(1);
                    c.ack_frequency = 8;
                })
            } else {
                cfg
            }
        }
        // A slow tick publishes the endpoints' drop counters.
        ServerKind::Echo => cfg.tick(Duration::from_millis(100)),
        // `serve_process` runs the floor's own server instead.
        ServerKind::KernelEcho | ServerKind::KernelGame { .. } => {
            bail!("the kernel floor runs no Ricochet server")
        }
    };
    let kind = spec.kind.clone();
    let shared = shared.clone();
    Server::start(cfg, move |_| ScaleHandler {
        kind: kind.clone(),
        shared: shared.clone(),
        next_input: HashMap::new(),
        tick: 0,
        body: Vec::new(),
        sessions: Vec::new(),
    })
    .map_err(|e| anyhow!("starting the server: {e}"))
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
enum ToServer {
    Stats,
    Play,
    Reset,
    Quit,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) enum FromServer {
    Ready { addr: String },
    Failed { error: String },
    Stats(Box<ServerStats>),
}

/// Reads the server spec, the first line the parent sends.
pub(super) fn read_spec(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
) -> Result<ServerSpec> {
    match lines.next() {
        Some(line) => {
            Ok(serde_json::from_str(&line.context("reading the spec")?)
                .context("the server spec")?)
        }
        None => bail!("no server spec on standard input"),
    }
}

/// The Ricochet server of a `spec` of kind `Echo` or `Game`: start it, answer until `quit`.
pub(super) fn serve_ricochet(
    spec: &ServerSpec,
    lines: impl Iterator<Item = std::io::Result<String>>,
    mut output: impl Write,
) -> Result<()> {
    let spec = spec.clone();
    let shared = Arc::new(GameShared::default());
    let server = announce(&mut output, start_server(&spec, &shared), |s| {
        s.local_addr()
    })?;
    let mut since = (CpuTimes::now(), std::time::Instant::now());
    // The process counts its allocations from the first reset (the measured phase) on.
    let counts_allocs = crate::alloc::installed();
    let mut allocs_since: Option<crate::alloc::Calls> = None;
    let stats = |server: &Server,
                 since: &(CpuTimes, std::time::Instant),
                 allocs_since: Option<crate::alloc::Calls>| {
        let cpu = CpuTimes::now();
        let rtt = server.rtt();
        let (drops, tokens_evicted) = shared.endpoint_totals();
        ServerStats {
            sessions: server.session_count(),
            rss_kib: crate::host::rss_kib(),
            cpu_s: finite(cpu.seconds_since(&since.0)),
            wall_s: finite(since.1.elapsed().as_secs_f64()),
            rtt_us: (rtt.samples > 0).then(|| {
                let us = |d: Duration| finite(d.as_secs_f64() * 1e6);
                Latency {
                    count: rtt.samples,
                    mean: us(rtt.mean),
                    p50: us(rtt.p50),
                    p90: us(rtt.p90),
                    p99: us(rtt.p99),
                    p999: us(rtt.p999),
                    max: us(rtt.max),
                }
            }),
            game: shared.read(),
            workers: server.counters().iter().map(WorkerStats::from).collect(),
            drops,
            tokens_evicted,
            allocs: allocs_since.map(|a| {
                let d = crate::alloc::Calls::now().since(a);
                AllocCounts {
                    calls: d.calls,
                    bytes: d.bytes,
                }
            }),
        }
    };
    let play = || shared.playing.store(true, Ordering::Relaxed);
    answer_commands(lines, &mut output, play, |reset| {
        if reset {
            let _ = server.take_rtt();
            shared.reset();
            since = (CpuTimes::now(), std::time::Instant::now());
            if counts_allocs {
                crate::alloc::trace::start();
                crate::alloc::set_on(true);
                allocs_since = Some(crate::alloc::Calls::now());
            }
        }
        stats(&server, &since, allocs_since)
    })?;
    let last = stats(&server, &since, allocs_since);
    crate::alloc::set_on(false);
    for (stack, calls) in crate::alloc::trace::finish() {
        eprintln!("server: alloc trace: ~{calls} calls at\n  {stack}");
    }
    server
        .shutdown()
        .map_err(|e| anyhow!("server shutdown: {e}"))?;
    send(&mut output, &FromServer::Stats(Box::new(last)))?;
    Ok(())
}

/// Tells the parent that the server `started` and listens at `addr(server)`, or why it did not
/// start (then returns that error too).
pub(super) fn announce<S>(
    output: &mut impl Write,
    started: Result<S>,
    addr: impl FnOnce(&S) -> SocketAddr,
) -> Result<S> {
    match started {
        Ok(s) => {
            let addr = addr(&s).to_string();
            send(output, &FromServer::Ready { addr })?;
            Ok(s)
        }
        Err(e) => {
            let error = format!("{e:#}");
            send(output, &FromServer::Failed { error })?;
            Err(e)
        }
    }
}

/// Answers the parent's commands until `quit` (or the end of its input): `stats` with
/// `report(false)`, `reset` with `report(true)`, which restarts the phase's counters first,
/// `play` with `play()` then `report(false)`.
pub(super) fn answer_commands(
    lines: impl Iterator<Item = std::io::Result<String>>,
    output: &mut impl Write,
    mut play: impl FnMut(),
    mut report: impl FnMut(bool) -> ServerStats,
) -> Result<()> {
    for line in lines {
        let line = line.context("reading a command")?;
        let reset = match serde_json::from_str::<ToServer>(&line).context("a server command")? {
            ToServer::Stats => false,
            ToServer::Play => {
                play();
                false
            }
            ToServer::Reset => true,
            ToServer::Quit => break,
        };
        send(output, &FromServer::Stats(Box::new(report(reset))))?;
    }
    Ok(())
}

pub(super) fn send(out: &mut impl Write, msg: &FromServer) -> Result<()> {
    let line = serde_json::to_string(msg)?;
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// The parent's handle on a running server process.
pub struct ServerProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The server's address.
    pub addr: SocketAddr,
}

impl ServerProcess {
    /// Start the server process with `spec` and wait until it listens.
    pub fn start(spec: &ServerSpec) -> Result<ServerProcess> {
        let exe = match SERVER_EXECUTABLE.get() {
            Some(p) => p.clone(),
            None => std::env::current_exe().context("locating the bench executable")?,
        };
        let mut child = Command::new(exe)
            .arg(SERVER_SUBCOMMAND)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the server process")?;
        let mut stdin = child.stdin.take().context("server stdin")?;
        let mut stdout = BufReader::new(child.stdout.take().context("server stdout")?);
        writeln!(stdin, "{}", serde_json::to_string(spec)?)?;
        stdin.flush()?;
        let addr = match read(&mut stdout)? {
            FromServer::Ready { addr } => addr.parse().context("the server's address")?,
            FromServer::Failed { error } => bail!("the server process failed: {error}"),
            FromServer::Stats(_) => bail!("the server process answered out of turn"),
        };
        Ok(ServerProcess {
            child,
            stdin,
            stdout,
            addr,
        })
    }

    fn ask(&mut self, cmd: &ToServer) -> Result<ServerStats> {
        writeln!(self.stdin, "{}", serde_json::to_string(cmd)?)?;
        self.stdin.flush()?;
        match read(&mut self.stdout)? {
            FromServer::Stats(s) => Ok(*s),
            other => bail!("unexpected answer from the server process: {other:?}"),
        }
    }

    /// Everything since the start or the last [`ServerProcess::reset`].
    pub fn stats(&mut self) -> Result<ServerStats> {
        self.ask(&ToServer::Stats)
    }

    /// Every player connected: a game server's ticks start sending snapshots.
    pub fn play(&mut self) -> Result<ServerStats> {
        self.ask(&ToServer::Play)
    }

    /// Start a measured phase: RTT histograms, CPU and game counters restart.
    pub fn reset(&mut self) -> Result<ServerStats> {
        self.ask(&ToServer::Reset)
    }

    /// Stop the server; its last report.
    pub fn quit(mut self) -> Result<ServerStats> {
        writeln!(self.stdin, "{}", serde_json::to_string(&ToServer::Quit)?)?;
        self.stdin.flush()?;
        let last = read(&mut self.stdout);
        let status = self
            .child
            .wait()
            .context("waiting for the server process")?;
        match last? {
            FromServer::Stats(s) if status.success() => Ok(*s),
            FromServer::Stats(_) => bail!("the server process exited with {status}"),
            other => bail!("unexpected answer from the server process: {other:?}"),
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // After `quit` the child is gone and this fails harmlessly; otherwise it must not
        // outlive the bench.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read(r: &mut impl BufRead) -> Result<FromServer> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        bail!("the server process closed its output (see its errors above)");
    }
    serde_json::from_str(&line).with_context(|| format!("a server message: {line:?}"))
}
