//! `bench handshake`: how many sessions per second a server admits by connect token, beside
//! the same server in insecure mode, in one run.
//!
//! A sample is one session's whole life as a client sees it: connect (`Client::connect_blocking`
//! returns once the handshake completed: socket and backend setup included), one 64-byte
//! message echoed on the reliable channel, a graceful close (the close frame leaves). Sessions
//! run one after another from one client thread, against two servers started together (same
//! workers and backend): one admitting by token, one insecure. Tokens are minted before a batch
//! starts, as a game's backend would hand them out. The modes alternate within every round,
//! and swap order from one round to the next, so drift on a noisy host hits both. Reported per
//! mode: sessions per second (median and range over rounds) and the process's CPU (client and
//! server together) per session. Every client comes from 127.0.0.1, so both servers lift the
//! per-address limit on handshakes (64 a second by default).

use bench::commands::Global;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bench::host::{command_line, BuildInfo, CpuTimes, HostInfo, UtcTime};
use bench::rudp::protocol::{mint_token, BENCH_PROTOCOL_ID};
use bytes::Bytes;
use ricochet::{
    BackendKind, Client, ClientConfig, ClientEvent, Handler, Server, ServerConfig, ServerContext,
    SessionId, TokenKey,
};
use serde::Serialize;

/// Options of `bench handshake`.
#[derive(clap::Args, Debug, Clone)]
pub struct HandshakeArgs {
    /// Sessions per mode and round.
    #[arg(long, default_value_t = 300)]
    pub sessions: usize,
    /// Rounds; each runs both modes.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Server workers (per server).
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Datagram backend of the servers and the clients: auto, uring or mmsg.
    #[arg(long, default_value = "auto")]
    pub backend: String,
}

struct Echo;

impl Handler for Echo {
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
        let _ = ctx.send(s, channel, data);
    }
}

/// One mode's batch in one round.
#[derive(Serialize, Debug, Clone, Copy)]
struct Batch {
    round: usize,
    sessions_per_s: f64,
    cpu_us_per_session: f64,
}

#[derive(Serialize, Debug, Clone)]
struct Mode {
    admission: &'static str,
    batches: Vec<Batch>,
    median_sessions_per_s: f64,
    median_cpu_us_per_session: f64,
}

#[derive(Serialize)]
struct Report<'a> {
    kind: &'static str,
    created_unix_s: u64,
    created_utc: String,
    command: String,
    host: HostInfo,
    build: BuildInfo,
    sessions: usize,
    rounds: usize,
    workers: usize,
    backend: String,
    modes: &'a [Mode],
    /// Insecure sessions per second over token sessions per second (medians).
    insecure_over_tokens: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// One session: connect, one echo, close.
fn session(
    token: Option<&ricochet::ConnectToken>,
    server: SocketAddr,
    cfg: ClientConfig,
) -> Result<()> {
    let limit = Duration::from_secs(5);
    let cfg = cfg.connect_timeout(limit);
    let mut c = match token {
        Some(t) => Client::connect_blocking(t, cfg),
        None => Client::connect_insecure_blocking(server, cfg),
    }
    .context("connect")?;
    c.send(0, Bytes::from_static(&[7; 64]))?;
    let deadline = Instant::now() + limit;
    loop {
        if Instant::now() >= deadline {
            bail!("no echo within {limit:?}");
        }
        c.wait(Duration::from_millis(50))?;
        match c.poll_event() {
            Some(ClientEvent::Message { .. }) => break,
            Some(ClientEvent::Disconnected { reason, .. }) => bail!("disconnected: {reason}"),
            _ => {}
        }
    }
    c.close();
    c.update()?;
    Ok(())
}

fn batch(
    round: usize,
    n: usize,
    server: SocketAddr,
    key: Option<&TokenKey>,
    backend: BackendKind,
) -> Result<Batch> {
    let tokens = match key {
        Some(k) => (0..n)
            .map(|i| mint_token(k, (round * n + i) as u64, &[server]).map(Some))
            .collect::<Result<Vec<_>>>()?,
        None => vec![None; n],
    };
    let cfg = ClientConfig::new().backend(backend);
    let cpu0 = CpuTimes::now();
    let t0 = Instant::now();
    for t in &tokens {
        session(t.as_ref(), server, cfg.clone())?;
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu1 = CpuTimes::now();
    let cpu = cpu1.seconds_since(&cpu0);
    Ok(Batch {
        round,
        sessions_per_s: n as f64 / wall,
        cpu_us_per_session: cpu * 1e6 / n as f64,
    })
}

/// Run `bench handshake` and write its JSON (`--json`, `--archive`, `--results-dir`).
pub fn run(args: &HandshakeArgs, out: &Global) -> Result<()> {
    let host = HostInfo::collect();
    let at = UtcTime::now();
    let backend: BackendKind = args.backend.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    let key = TokenKey::generate(&mut rand::rng());
    let start = |cfg: ServerConfig| {
        let mut cfg = cfg.workers(args.workers).backend(backend);
        if let Some(listen) = cfg.endpoint.server.as_mut() {
            listen.max_handshakes_per_address = u32::MAX;
        }
        Server::start(cfg, |_| Echo).map_err(|e| anyhow::anyhow!("server: {e}"))
    };
    let bind: SocketAddr = "127.0.0.1:0".parse()?;
    let secure = start(ServerConfig::new(bind).tokens(key.clone(), BENCH_PROTOCOL_ID))?;
    let insecure = start(ServerConfig::new(bind).insecure())?;
    println!(
        "{} sessions per mode and round, {} rounds, {} server worker(s) each, backend {}",
        args.sessions,
        args.rounds,
        args.workers,
        secure.backend_kind()
    );
    let mut tokens_mode = Vec::new();
    let mut insecure_mode = Vec::new();
    for round in 0..args.rounds.max(1) {
        let run_tokens = |r| batch(r, args.sessions, secure.local_addr(), Some(&key), backend);
        let run_insecure = |r| batch(r, args.sessions, insecure.local_addr(), None, backend);
        if round % 2 == 0 {
            tokens_mode.push(run_tokens(round)?);
            insecure_mode.push(run_insecure(round)?);
        } else {
            insecure_mode.push(run_insecure(round)?);
            tokens_mode.push(run_tokens(round)?);
        }
        println!(
            "round {round}: tokens {:.0}/s ({:.0} µs CPU each), insecure {:.0}/s ({:.0} µs CPU each)",
            tokens_mode[round].sessions_per_s,
            tokens_mode[round].cpu_us_per_session,
            insecure_mode[round].sessions_per_s,
            insecure_mode[round].cpu_us_per_session
        );
    }
    secure.shutdown().map_err(|e| anyhow::anyhow!("{e}"))?;
    insecure.shutdown().map_err(|e| anyhow::anyhow!("{e}"))?;
    let mode = |admission, batches: Vec<Batch>| Mode {
        admission,
        median_sessions_per_s: median(batches.iter().map(|b| b.sessions_per_s).collect()),
        median_cpu_us_per_session: median(batches.iter().map(|b| b.cpu_us_per_session).collect()),
        batches,
    };
    let modes = [mode("tokens", tokens_mode), mode("insecure", insecure_mode)];
    let ratio =
        modes[1].median_sessions_per_s / modes[0].median_sessions_per_s.max(f64::MIN_POSITIVE);
    println!();
    println!("| admission | sessions/s (median) | range | CPU µs per session (median) |");
    println!("| --- | ---: | ---: | ---: |");
    for m in &modes {
        let rates: Vec<f64> = m.batches.iter().map(|b| b.sessions_per_s).collect();
        let lo = rates.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = rates.iter().copied().fold(0.0, f64::max);
        println!(
            "| {} | {:.0} | {lo:.0}–{hi:.0} | {:.0} |",
            m.admission, m.median_sessions_per_s, m.median_cpu_us_per_session
        );
    }
    println!("insecure / tokens: {ratio:.2}× the session rate");
    {
        let path = &out.path_for("handshake", &at);
        let report = Report {
            kind: "handshake",
            created_unix_s: at.unix_s,
            created_utc: at.iso(),
            command: command_line(),
            host,
            build: BuildInfo::collect(),
            sessions: args.sessions,
            rounds: args.rounds,
            workers: args.workers,
            backend: args.backend.clone(),
            modes: &modes,
            insecure_over_tokens: ratio,
        };
        bench::output::write_json(&report, path)?;
        println!("results: {}", path.display());
    }
    Ok(())
}
