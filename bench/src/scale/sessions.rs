//! `bench sessions`: N clients connected at once to one server (in its own process), all
//! driven by one [`ClientSet`] on one thread.
//!
//! - **idle**: connect all of them (handshakes per second), let them sit (keepalives only), and
//!   weigh the server: resident memory per session.
//! - **echo**: then each keeps `window` messages in flight (1 by default): round trips per
//!   second, RTT percentiles, CPU of the server process and of the client thread's process.
//! - **churn**: batches of N fresh clients, one after another for the measured time: each
//!   connects with a new token, sends one message, gets its echo and closes (a fleet that
//!   restarts). Whole sessions per second, reported as the handshake rate; a batch's time runs
//!   from its first socket opened to its last closed (token minting, a backend's work, is
//!   not counted). Each batch comes
//!   from addresses no earlier batch used: from one address, the server's per-address
//!   handshake limit (`max_handshakes_per_address`) would drop cookie echoes past it, and the
//!   run would measure that limit and the clients' retry timer instead of the handshake path.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use hdrhistogram::Histogram;
use ricochet::{ClientConfig, ClientEvent, ClientSet};
use serde::{Deserialize, Serialize};

use super::server::{ServerKind, ServerProcess, ServerSpec, ServerStats};
use crate::host::{CpuTimes, SystemCpu};
use crate::output::thousands;
use crate::schema::{finite, Latency};
use crate::udp::tracker::new_rtt_histogram;

/// Datagrams a churn session of the kernel floor (`--stack kernel`) sends, the last (its close)
/// unanswered: a Ricochet session (handshake, first message and its echo, close) moves four
/// each way, and its client waits for three answers.
pub const FLOOR_CHURN_EXCHANGES: u32 = 4;

/// One `bench sessions` measurement's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionsConfig {
    /// Clients (sessions).
    pub clients: usize,
    /// `idle`, `echo` or `churn`.
    pub mode: String,
    /// Clients that share one loopback address (127.0.0.x, one x per group).
    pub clients_per_ip: usize,
    /// Server workers.
    pub io_threads: usize,
    /// Server idle strategy.
    pub server_idle: String,
    /// Server core pinning (`auto`, `always`, `never`); absent in runs before the choice
    /// existed (workers were always pinned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_pinning: Option<String>,
    /// Scheduler time slice the server workers ask for, µs (0: none asked); absent: the
    /// runtime's default (100 µs since it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_slice_us: Option<u64>,
    /// Backend of server and clients.
    pub backend: String,
    /// Protocol profile of both sides.
    pub profile: String,
    /// `secure` (connect tokens, every packet protected) or `insecure`.
    pub security: String,
    /// Echo message size, bytes (at least 16).
    pub payload: usize,
    /// Echo messages in flight per client; absent in runs before the choice existed (1).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub window: usize,
    /// Idle time after connecting before the server is weighed, s.
    pub settle_s: f64,
    /// Echo warm-up, s.
    pub warmup_s: f64,
    /// Echo measured time, s.
    pub seconds: f64,
    /// `kernel`: the kernel floor (plain UDP sockets and echo server, no protocol); absent:
    /// Ricochet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<String>,
}

fn one() -> usize {
    1
}

fn is_one(v: &usize) -> bool {
    *v == 1
}

impl SessionsConfig {
    /// The mode as tables name it: the echo's window and message size when it keeps more
    /// than one message in flight.
    pub fn mode_label(&self) -> String {
        if self.mode == "echo" && self.window > 1 {
            format!("echo w{} × {} B", self.window, self.payload)
        } else {
            self.mode.clone()
        }
    }

    /// Whether this run is the kernel floor rather than Ricochet.
    pub fn is_floor(&self) -> bool {
        self.stack.as_deref() == Some("kernel")
    }
}

/// One `bench sessions` measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionsRun {
    /// Settings.
    pub config: SessionsConfig,
    /// Clients connected.
    pub connected: usize,
    /// Wall time from the first connect to the last handshake, s.
    pub connect_s: f64,
    /// `connected / connect_s`.
    pub handshakes_per_s: f64,
    /// Server RSS before the first client, KiB.
    pub server_rss_before_kib: Option<u64>,
    /// Server RSS with every client connected and idle, KiB.
    pub server_rss_idle_kib: Option<u64>,
    /// (idle − before) / connected, bytes.
    pub server_rss_per_session_bytes: Option<f64>,
    /// Server RSS at the end of the run, KiB (the server's last report, when it quits: the
    /// clients have closed by then).
    pub server_rss_end_kib: Option<u64>,
    /// Echo: server RSS at the end of the measured phase, every window still in flight, KiB
    /// (absent in runs before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_rss_loaded_kib: Option<u64>,
    /// Echo: round trips in the measured phase.
    pub round_trips: u64,
    /// Echo: round trips per second.
    pub round_trips_per_s: f64,
    /// Echo: RTT as the clients measured it (send to complete echo).
    pub rtt_us: Option<Latency>,
    /// Echo: fewest round trips of any client in the measured phase (0: one starved).
    pub min_client_round_trips: u64,
    /// Echo: server process CPU over the measured phase, % of one core.
    pub server_cpu_percent: Option<f64>,
    /// Echo: this (client) process's CPU over the measured phase, % of one core.
    pub client_cpu_percent: Option<f64>,
    /// Echo: the clients' protocol counters summed over every member, from connect to the
    /// end of the run (warm-up included).
    #[serde(default)]
    pub clients_total: ClientTotals,
    /// The hypervisor's steal over the measured phase, percent of one core (Linux; absent in
    /// runs before it was recorded): time the virtual CPUs wanted to run and did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steal_percent: Option<f64>,
    /// The server's last report.
    pub server: ServerStats,
    /// What went wrong (empty when ok).
    pub errors: Vec<String>,
    /// No error, every client connected, and (echo) every client echoed.
    pub ok: bool,
}

/// Protocol counters summed over the members of a client set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTotals {
    /// Datagrams sent.
    pub packets_sent: u64,
    /// Datagrams received.
    pub packets_received: u64,
    /// Reliable segments sent again (loss, tail-loss probe or timeout).
    pub segments_retransmitted: u64,
    /// Tail-loss probes sent.
    pub tail_loss_probes: u64,
    /// Retransmission timeouts.
    pub rto_count: u64,
    /// Packets declared lost that arrived after all.
    pub packets_spurious_lost: u64,
}

impl ClientTotals {
    /// Sums the counters of every member of `set`.
    pub fn of(set: &ClientSet) -> Self {
        let mut t = Self::default();
        for d in (0..set.len()).filter_map(|i| set.get(i).and_then(|c| c.detail())) {
            t.packets_sent += d.packets_sent;
            t.packets_received += d.packets_received;
            t.segments_retransmitted += d.segments_retransmitted;
            t.tail_loss_probes += d.tail_loss_probes;
            t.rto_count += d.rto_count;
            t.packets_spurious_lost += d.packets_spurious_lost;
        }
        t
    }
}

/// Table columns of one case (its rounds), from `rounds` to `ok`: what `bench sessions` prints
/// and `bench report` renders, medians over the rounds.
pub const SUMMARY_COLUMNS: [&str; 14] = [
    "rounds",
    "connect s",
    "handshakes/s",
    "RSS B/session",
    "loaded RSS B/session",
    "rt/s",
    "p50 ms",
    "p99 ms",
    "p99.9 ms",
    "max ms",
    "server CPU %",
    "client CPU %",
    "steal %",
    "ok",
];

/// The [`SUMMARY_COLUMNS`] cells of one case's rounds `rs`.
pub fn summary_cells(rs: &[&SessionsRun]) -> Vec<String> {
    let m = |f: &dyn Fn(&SessionsRun) -> Option<f64>| {
        crate::gate::ratio::median(&rs.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
    };
    let int = |x: Option<f64>| x.map_or("-".into(), |v| thousands(v.max(0.0).round() as u64));
    let ms = |x: Option<f64>| x.map_or("-".into(), |v| format!("{:.2}", v / 1000.0));
    let pct = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.0}"));
    let echo = rs.iter().all(|r| r.config.mode == "echo");
    vec![
        rs.len().to_string(),
        m(&|r| Some(r.connect_s)).map_or("-".into(), |v| format!("{v:.2}")),
        int(m(&|r| Some(r.handshakes_per_s))),
        int(m(&|r| r.server_rss_per_session_bytes)),
        int(m(&|r| r.loaded_rss_per_session_bytes())),
        if echo {
            int(m(&|r| Some(r.round_trips_per_s)))
        } else {
            "-".into()
        },
        ms(m(&|r| r.rtt_us.map(|l| l.p50))),
        ms(m(&|r| r.rtt_us.map(|l| l.p99))),
        ms(m(&|r| r.rtt_us.map(|l| l.p999))),
        ms(m(&|r| r.rtt_us.map(|l| l.max))),
        pct(m(&|r| r.server_cpu_percent)),
        pct(m(&|r| r.client_cpu_percent)),
        pct(m(&|r| r.steal_percent)),
        if rs.iter().all(|r| r.ok) { "yes" } else { "NO" }.into(),
    ]
}

/// Address groups one batch of `cfg.clients` spans.
pub(super) fn groups(cfg: &SessionsConfig) -> usize {
    cfg.clients.div_ceil(cfg.clients_per_ip.max(1))
}

/// Loopback address of client group `g` (127.0.0.1, 127.0.0.2, ...). macOS answers only on
/// 127.0.0.1 by default: everything goes there.
pub(super) fn group_ip(g: usize) -> IpAddr {
    if cfg!(target_os = "linux") {
        let n = g as u32 + 1;
        IpAddr::V4(Ipv4Addr::new(127, (n >> 16) as u8, (n >> 8) as u8, n as u8))
    } else {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    }
}

/// A fresh backend key for a measurement's tokens (`None` for the insecure mode).
pub(crate) fn token_key(security: &str) -> Result<Option<[u8; 32]>> {
    match security {
        "secure" => Ok(Some(rand::random())),
        "insecure" => Ok(None),
        other => anyhow::bail!("unknown security mode {other:?} (secure or insecure)"),
    }
}

/// Connect `n` clients to `target` in groups of `per_ip` per address, the groups on the
/// addresses from [`group_ip`]`(first_group)` on; with `key`, each with a token the backend
/// would mint (listing `target`, then `server` when they differ). Returns the set and how long
/// the handshakes took (token minting excluded).
#[allow(clippy::too_many_arguments)]
pub(crate) fn connect_all(
    target: SocketAddr,
    server: SocketAddr,
    key: Option<[u8; 32]>,
    n: usize,
    per_ip: usize,
    first_group: usize,
    make: impl Fn(IpAddr, u64) -> Result<ClientConfig>,
    timeout: Duration,
) -> Result<(ClientSet, Duration)> {
    let mut addresses = vec![target];
    if server != target {
        addresses.push(server);
    }
    let tokens = match key {
        Some(k) => {
            let key = ricochet_proto::token::TokenKey::from_bytes(k);
            (0..n)
                .map(|i| crate::rudp::run::mint_token(&key, i as u64, &addresses))
                .collect::<Result<Vec<_>>>()?
        }
        None => Vec::new(),
    };
    let mut set = ClientSet::new();
    let t0 = Instant::now();
    let per_ip = per_ip.max(1);
    for g in 0..n.div_ceil(per_ip) {
        let first = g * per_ip;
        let k = per_ip.min(n - first);
        let cfg = make(group_ip(first_group + g), 0x5e55_0000 + first as u64)?;
        if key.is_some() {
            set.start_connecting(&tokens[first..first + k], &cfg)?;
        } else {
            set.start_connecting_insecure(target, &cfg, k)?;
        }
    }
    set.wait_connected(timeout)?;
    let took = t0.elapsed();
    // The Connected events are the outcome just returned.
    while set.poll_event().is_some() {}
    Ok((set, took))
}

/// Step `set` for `d`, answering nothing (idle sessions: keepalives and acknowledgements).
pub(crate) fn idle_for(set: &mut ClientSet, d: Duration) -> Result<()> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        set.step(Duration::from_millis(20))?;
        while set.poll_event().is_some() {}
    }
    Ok(())
}

fn message(member: usize, seq: u64, payload: usize) -> Bytes {
    let mut m = vec![0u8; payload.max(16)];
    m[..8].copy_from_slice(&(member as u64).to_le_bytes());
    m[8..16].copy_from_slice(&seq.to_le_bytes());
    Bytes::from(m)
}

/// The most echo messages a client keeps in flight.
pub const MAX_WINDOW: usize = 64;

/// Runs one measurement.
pub fn run(cfg: &SessionsConfig) -> Result<SessionsRun> {
    if !(1..=MAX_WINDOW).contains(&cfg.window) {
        anyhow::bail!("an echo window of {} (1 to {MAX_WINDOW})", cfg.window);
    }
    match cfg.stack.as_deref() {
        None | Some("ricochet") => {}
        #[cfg(target_os = "linux")]
        Some("kernel") => return super::floor::run(cfg),
        Some(other) => return Err(super::unmeasured_stack(other)),
    }
    let key = token_key(&cfg.security)?;
    let mut server = ServerProcess::start(&server_spec(cfg, ServerKind::Echo, key))?;
    let before = server.stats()?;
    if cfg.mode == "churn" {
        return churn(cfg, key, server, before);
    }
    let mut errors = Vec::new();
    let (mut set, took) = match connect_clients(cfg, key, server.addr, 0) {
        Ok(x) => x,
        Err(e) => {
            let last = server.quit().unwrap_or_default();
            return Ok(failed(
                cfg,
                last,
                format!("connecting: {}", crate::error_chain(e.as_ref())),
            ));
        }
    };
    let connected = set.connected();
    idle_for(&mut set, Duration::from_secs_f64(cfg.settle_s))?;
    let idle = server.stats()?;
    if idle.sessions != cfg.clients {
        errors.push(format!(
            "the server holds {} sessions, not {}",
            idle.sessions, cfg.clients
        ));
    }
    let per_session = match (before.rss_kib, idle.rss_kib) {
        (Some(a), Some(b)) if connected > 0 => {
            Some(finite((b as f64 - a as f64) * 1024.0 / connected as f64))
        }
        _ => None,
    };
    let mut run = SessionsRun {
        config: cfg.clone(),
        connected,
        connect_s: finite(took.as_secs_f64()),
        handshakes_per_s: finite(connected as f64 / took.as_secs_f64().max(1e-9)),
        server_rss_before_kib: before.rss_kib,
        server_rss_idle_kib: idle.rss_kib,
        server_rss_per_session_bytes: per_session,
        server_rss_end_kib: idle.rss_kib,
        server_rss_loaded_kib: None,
        round_trips: 0,
        round_trips_per_s: 0.0,
        rtt_us: None,
        min_client_round_trips: 0,
        server_cpu_percent: None,
        client_cpu_percent: None,
        steal_percent: None,
        clients_total: ClientTotals::default(),
        server: idle.clone(),
        errors: Vec::new(),
        ok: false,
    };
    if cfg.mode == "echo" {
        echo(cfg, &mut set, &mut server, &mut run, &mut errors)?;
    }
    drop(set);
    run.quit_server(server, &mut errors);
    run.ok = errors.is_empty()
        && run.connected == cfg.clients
        && (cfg.mode != "echo" || run.min_client_round_trips > 0);
    run.errors = errors;
    Ok(run)
}

/// The server process's settings for a run of `cfg`: a `kind` server on loopback, admitting
/// by tokens sealed with `token_key` (`None`: insecure, or the floor's plain sockets).
pub(super) fn server_spec(
    cfg: &SessionsConfig,
    kind: ServerKind,
    token_key: Option<[u8; 32]>,
) -> ServerSpec {
    ServerSpec {
        kind,
        bind: "127.0.0.1:0".into(),
        io_threads: cfg.io_threads,
        idle: cfg.server_idle.clone(),
        pinning: crate::schema::server_pinning(cfg.server_pinning.as_deref()).into(),
        slice_us: cfg.server_slice_us,
        backend: cfg.backend.clone(),
        profile: cfg.profile.clone(),
        max_sessions: None,
        max_sessions_per_address: None,
        token_key,
    }
}

/// `cfg.clients` fresh clients of `cfg`'s profile connected to `server` in one set, within
/// [`connect_limit`]; `batch` (churn's batch number, else 0) gives each batch addresses no
/// earlier one used.
fn connect_clients(
    cfg: &SessionsConfig,
    key: Option<[u8; 32]>,
    server: SocketAddr,
    batch: usize,
) -> Result<(ClientSet, Duration)> {
    connect_all(
        server,
        server,
        key,
        cfg.clients,
        cfg.clients_per_ip,
        batch * groups(cfg),
        |ip, seed| super::member_config(&cfg.profile, &cfg.backend, ip, seed),
        connect_limit(cfg),
    )
}

/// How long connecting `cfg.clients` may take: 30 s plus 3 ms per client.
fn connect_limit(cfg: &SessionsConfig) -> Duration {
    Duration::from_secs(30) + Duration::from_millis(3 * cfg.clients as u64)
}

/// Churn: batches of `cfg.clients` fresh clients until `cfg.seconds` have passed, each
/// connecting, sending one message, awaiting its echo and closing. The time counted is the
/// batches' (token minting, like a backend's, is not).
fn churn(
    cfg: &SessionsConfig,
    key: Option<[u8; 32]>,
    mut server: ServerProcess,
    before: ServerStats,
) -> Result<SessionsRun> {
    let mut errors = Vec::new();
    let (mut completed, mut busy) = (0usize, Duration::ZERO);
    let (cpu0, wall0) = (PhaseCpu::now(), Instant::now());
    server.reset()?;
    let mut batch = 0;
    while busy.as_secs_f64() < cfg.seconds && errors.is_empty() {
        let (mut set, took) = match connect_clients(cfg, key, server.addr, batch) {
            Ok(x) => x,
            Err(e) => {
                errors.push(format!("connecting: {}", crate::error_chain(e.as_ref())));
                break;
            }
        };
        let t0 = Instant::now();
        let n = set.len();
        for i in 0..n {
            set.mark_changed(i);
            if let Some(c) = set.get_mut(i) {
                c.send(0, message(i, 0, cfg.payload))?;
            }
        }
        let mut echoed = vec![false; n];
        let mut left = n;
        let deadline = t0 + connect_limit(cfg);
        while left > 0 && Instant::now() < deadline {
            set.step(Duration::from_millis(5))?;
            while let Some((i, e)) = set.poll_event() {
                match e {
                    ClientEvent::Message { .. } if !echoed[i] => {
                        echoed[i] = true;
                        left -= 1;
                        // Its session is done: close it now (the close leaves with the next
                        // turn's submission).
                        set.mark_changed(i);
                        if let Some(c) = set.get_mut(i) {
                            c.close();
                        }
                    }
                    // Its own close, once echoed; anything else ends it early.
                    ClientEvent::Disconnected { reason, .. } if !echoed[i] => {
                        errors.push(format!("client {i} disconnected: {reason}"));
                    }
                    _ => {}
                }
            }
        }
        // One more turn sends the last closes; dropping the set closes the sockets, which is
        // part of a session's cost (the floor's closes are timed too).
        set.step(Duration::ZERO)?;
        drop(set);
        batch += 1;
        busy += took + t0.elapsed();
        completed += n - left;
        if left > 0 {
            errors.push(format!("{left} of {n} clients got no echo"));
        }
    }
    let wall = wall0.elapsed().as_secs_f64();
    let cpu = PhaseCpu::now();
    let stats = server.stats()?;
    let rate = completed as f64 / busy.as_secs_f64().max(1e-9);
    let mut run = failed(cfg, stats.clone(), String::new());
    run.errors.clear();
    run.connected = completed;
    run.connect_s = finite(busy.as_secs_f64());
    run.handshakes_per_s = finite(rate);
    run.server_rss_before_kib = before.rss_kib;
    run.server_rss_end_kib = stats.rss_kib;
    run.set_cpu((&cpu0, &cpu), wall, &stats);
    run.quit_server(server, &mut errors);
    run.ok = errors.is_empty() && completed > 0;
    run.errors = errors;
    Ok(run)
}

/// CPU clocks at one point of a measured phase: this process's (the clients) and the
/// machine's (for the hypervisor's steal).
pub(super) struct PhaseCpu {
    process: CpuTimes,
    machine: Option<SystemCpu>,
}

impl PhaseCpu {
    pub(super) fn now() -> PhaseCpu {
        PhaseCpu {
            process: CpuTimes::now(),
            machine: SystemCpu::now(),
        }
    }
}

impl SessionsRun {
    /// Echo: server RSS growth per session from before the first client to the end of the
    /// measured echo (every message of a window still in flight), bytes. It includes what the
    /// workers' buffers grew under the load, which a larger set spreads thinner. `None` for
    /// the kernel floor, which holds no sessions, and for runs that did not record it.
    pub fn loaded_rss_per_session_bytes(&self) -> Option<f64> {
        if self.config.mode != "echo" || self.config.is_floor() || self.connected == 0 {
            return None;
        }
        let (a, b) = (self.server_rss_before_kib?, self.server_rss_loaded_kib?);
        Some(finite(
            (b as f64 - a as f64) * 1024.0 / self.connected as f64,
        ))
    }

    /// Stops the server process and keeps its last report (or the error in `errors`).
    pub(super) fn quit_server(&mut self, server: ServerProcess, errors: &mut Vec<String>) {
        match server.quit() {
            Ok(last) => {
                self.server_rss_end_kib = last.rss_kib.or(self.server_rss_end_kib);
                self.server = last;
            }
            Err(e) => errors.push(format!("server: {e:#}")),
        }
    }

    /// The CPU shares of a phase from `cpu0` to `cpu1` that lasted `wall` seconds: the
    /// clients', the machine's steal, and the server's over its `stats`.
    pub(super) fn set_cpu(
        &mut self,
        (cpu0, cpu1): (&PhaseCpu, &PhaseCpu),
        wall: f64,
        stats: &ServerStats,
    ) {
        let wall = wall.max(1e-9);
        let clients = cpu1.process.seconds_since(&cpu0.process);
        self.client_cpu_percent = Some(finite(clients / wall * 100.0));
        self.server_cpu_percent = Some(finite(stats.cpu_s / stats.wall_s.max(1e-9) * 100.0));
        self.steal_percent = match (&cpu0.machine, &cpu1.machine) {
            (Some(a), Some(b)) => Some(finite((b.steal_s - a.steal_s) / wall * 100.0)),
            _ => None,
        };
    }
}

pub(super) fn failed(cfg: &SessionsConfig, server: ServerStats, error: String) -> SessionsRun {
    SessionsRun {
        config: cfg.clone(),
        connected: 0,
        connect_s: 0.0,
        handshakes_per_s: 0.0,
        server_rss_before_kib: None,
        server_rss_idle_kib: None,
        server_rss_per_session_bytes: None,
        server_rss_end_kib: None,
        server_rss_loaded_kib: None,
        round_trips: 0,
        round_trips_per_s: 0.0,
        rtt_us: None,
        min_client_round_trips: 0,
        server_cpu_percent: None,
        client_cpu_percent: None,
        steal_percent: None,
        clients_total: ClientTotals::default(),
        server,
        errors: vec![error],
        ok: false,
    }
}

/// The bookkeeping of an echo over `n` clients, shared by both stacks: the warm-up and
/// measured phases, each client's sequence numbers and send times, and the RTT histogram.
pub(super) struct EchoMeter {
    measure_at: Instant,
    end: Instant,
    measuring: bool,
    cpu0: PhaseCpu,
    t0: Instant,
    /// Messages in flight per client.
    window: usize,
    /// Per client: the sequence number of its oldest message in flight (the echo it expects
    /// next) and the round trips counted in the measured phase.
    seq: Vec<u64>,
    counted: Vec<u64>,
    /// When each message in flight left: client `i`'s message `s` at `i * window + s % window`.
    sent_at: Vec<Instant>,
    hist: Histogram<u64>,
    /// Echoes that did not carry their client's sequence number.
    bad: u64,
}

impl EchoMeter {
    /// Starts the warm-up now; every client's first `window` messages (sequences 0 to
    /// `window - 1`) leave now.
    pub(super) fn start(cfg: &SessionsConfig, n: usize) -> EchoMeter {
        let start = Instant::now();
        let measure_at = start + Duration::from_secs_f64(cfg.warmup_s);
        let window = cfg.window.max(1);
        EchoMeter {
            measure_at,
            end: measure_at + Duration::from_secs_f64(cfg.seconds),
            measuring: false,
            cpu0: PhaseCpu::now(),
            t0: start,
            window,
            seq: vec![0; n],
            counted: vec![0; n],
            sent_at: vec![start; n * window],
            hist: new_rtt_histogram(),
            bad: 0,
        }
    }

    /// Messages each client keeps in flight.
    pub(super) fn window(&self) -> u64 {
        self.window as u64
    }

    /// Before each turn: starts the measured phase when its time has come (resetting the
    /// server's counters); false once the run is over.
    pub(super) fn running(&mut self, server: &mut ServerProcess) -> Result<bool> {
        let now = Instant::now();
        if !self.measuring && now >= self.measure_at {
            self.measuring = true;
            server.reset()?;
            self.cpu0 = PhaseCpu::now();
            self.t0 = Instant::now();
        }
        Ok(now < self.end)
    }

    /// Client `i`'s echo carrying `got` arrived at `now`: counts it and returns the sequence
    /// number of the client's next message, which leaves at `now` (the window stays full).
    pub(super) fn echoed(&mut self, i: usize, got: Option<u64>, now: Instant) -> u64 {
        let seq = self.seq[i];
        if got != Some(seq) {
            self.bad += 1;
        }
        let slot = self.slot(i, seq);
        if self.measuring {
            let ns = now.saturating_duration_since(self.sent_at[slot]).as_nanos();
            self.hist
                .saturating_record(u64::try_from(ns).unwrap_or(u64::MAX).max(1));
            self.counted[i] += 1;
        }
        // The next message takes the slot of the one just echoed: `seq + window` is `seq`
        // modulo the window.
        self.sent_at[slot] = now;
        self.seq[i] = seq + 1;
        seq + self.window as u64
    }

    /// Clients whose oldest message has waited `limit` or longer for its echo (the floor's
    /// check for a lost datagram, Linux only).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(super) fn waiting_since(&self, limit: Duration) -> usize {
        let now = Instant::now();
        (0..self.seq.len())
            .filter(|&i| {
                now.saturating_duration_since(self.sent_at[self.slot(i, self.seq[i])]) >= limit
            })
            .count()
    }

    /// Where client `i`'s message `seq` keeps its send time.
    fn slot(&self, i: usize, seq: u64) -> usize {
        i * self.window + (seq % self.window as u64) as usize
    }

    /// Ends the measured phase: fills `run`'s rate, RTT, CPU and server figures. Returns the
    /// number of altered or out-of-order echoes.
    pub(super) fn finish(self, server: &mut ServerProcess, run: &mut SessionsRun) -> Result<u64> {
        let wall = self.t0.elapsed().as_secs_f64();
        let cpu = PhaseCpu::now();
        let stats = server.stats()?;
        run.round_trips = self.hist.len();
        run.round_trips_per_s = finite(self.hist.len() as f64 / wall.max(1e-9));
        run.rtt_us = Latency::from_ns(&self.hist);
        run.min_client_round_trips = self.counted.iter().copied().min().unwrap_or(0);
        run.set_cpu((&self.cpu0, &cpu), wall, &stats);
        run.server_rss_end_kib = stats.rss_kib;
        run.server_rss_loaded_kib = stats.rss_kib;
        run.server = stats;
        Ok(self.bad)
    }
}

/// Echo with `cfg.window` messages in flight on every member: warm-up, then the measured
/// phase.
fn echo(
    cfg: &SessionsConfig,
    set: &mut ClientSet,
    server: &mut ServerProcess,
    run: &mut SessionsRun,
    errors: &mut Vec<String>,
) -> Result<()> {
    let n = set.len();
    let mut meter = EchoMeter::start(cfg, n);
    for i in 0..n {
        set.mark_changed(i);
        if let Some(c) = set.get_mut(i) {
            for seq in 0..meter.window() {
                c.send(0, message(i, seq, cfg.payload))?;
            }
        }
    }
    while meter.running(server)? {
        set.step(Duration::from_millis(5))?;
        let now = Instant::now();
        while let Some((i, e)) = set.poll_event() {
            match e {
                ClientEvent::Message { data, .. } => {
                    let got = data
                        .get(8..16)
                        .and_then(|b| <[u8; 8]>::try_from(b).ok())
                        .map(u64::from_le_bytes);
                    let next = meter.echoed(i, got, now);
                    set.mark_changed(i);
                    if let Some(c) = set.get_mut(i) {
                        c.send(0, message(i, next, cfg.payload))?;
                    }
                }
                ClientEvent::Disconnected { reason, .. } => {
                    errors.push(format!("client {i} disconnected: {reason}"));
                }
                ClientEvent::Connected => {}
                _ => {}
            }
        }
    }
    let bad = meter.finish(server, run)?;
    if bad > 0 {
        errors.push(format!("{bad} echoes out of order or altered"));
    }
    run.clients_total = ClientTotals::of(set);
    Ok(())
}
