//! `bench ops`: what running in production costs (issue 34), measured side by side.
//!
//! Three arms, each judged by a ratio or a figure measured in the same run:
//! - **metrics**: the direct echo (N clients, a window of messages in flight each, on the
//!   reliable channel, insecure) against a server with the metrics endpoint on and scraped once
//!   a second, and against the same server without it. Each round runs both, the order swapped
//!   from round to round; reported: round trips per second per arm, medians over the rounds and
//!   their ratio (on / off).
//! - **scrape**: a server holding `--sessions` sessions (idle clients of one `ClientSet` in this
//!   process, answering keep-alives) beside the echo clients. Phases come in triples of three
//!   kinds: scraping `/metrics` once a second, and two kinds of quiet phase (A and B) that
//!   differ in nothing but their name: S A B, S B A, S A B, ..., so that quiet A and quiet B
//!   follow and precede scraping equally often and take the same places. The A/A comparison (quiet A against quiet B) shows in the same run how far two identical
//!   conditions come apart; scraping "does not raise the echo's p99" when its ratio to quiet
//!   lies within that band (the rule is [`p99_verdict`]). Reported: each scrape's time
//!   (request to last byte) and the exposition's size, the echo's round-trip percentiles per
//!   kind, each phase's p99, and the ratios pooled and per triple.
//! - **conditioner**: the echo from this binary (built with the link conditioner, off) beside
//!   a second `bench` binary built without it (`cargo build --release -p bench
//!   --no-default-features`, given as `--without-conditioner PATH`), each round one child
//!   process of each, alternated; reported: round trips per second per build, medians and ratio.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bench::commands::Global;
use bench::host::{command_line, BuildInfo, HostInfo, UtcTime};
use bench::stats::median;
use bytes::Bytes;
use hdrhistogram::Histogram;
use ricochet::{
    Client, ClientConfig, ClientEvent, ClientSet, Handler, Server, ServerConfig, ServerContext,
    SessionId,
};
use serde::Serialize;

/// The echo's shape, shared by every arm (and passed to the child processes).
#[derive(clap::Args, Debug, Clone, Serialize)]
pub struct EchoShape {
    /// Echo clients, each on its own thread with its own socket.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Messages in flight per client.
    #[arg(long, default_value_t = 16)]
    pub window: usize,
    /// Message size in bytes (at least 16).
    #[arg(long, default_value_t = 1024)]
    pub payload: usize,
    /// Server workers.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Measured seconds per echo run.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Warm-up seconds per echo run.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
}

/// Options of `bench ops`.
#[derive(clap::Args, Debug, Clone)]
pub struct OpsArgs {
    #[command(flatten)]
    pub shape: EchoShape,
    /// Rounds of the metrics and conditioner arms (each runs both sides). One pair's ratio
    /// varies by ±20 % on a shared VM, so the medians need this many rounds to judge a goal
    /// a few percent from 1.
    #[arg(long, default_value_t = 15)]
    pub rounds: usize,
    /// Sessions the scrape arm's server holds.
    #[arg(long, default_value_t = 10_000)]
    pub sessions: usize,
    /// Phases of the scrape arm, a multiple of 3: triples of scraping, quiet A and quiet B,
    /// the quiet ones swapped from triple to triple (a multiple of 6 balances them).
    #[arg(long, default_value_t = 12)]
    pub phases: usize,
    /// Seconds per phase of the scrape arm.
    #[arg(long, default_value_t = 5.0)]
    pub phase_seconds: f64,
    /// A `bench` binary built without the link conditioner (`--no-default-features`): the
    /// conditioner arm runs only with it.
    #[arg(long)]
    pub without_conditioner: Option<PathBuf>,
    /// Arms to run, comma-separated: metrics, scrape, conditioner.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "metrics,scrape,conditioner"
    )]
    pub only: Vec<String>,
}

/// Options of the hidden `ops-echo` child: one echo run, one JSON line on standard output.
#[derive(clap::Args, Debug, Clone)]
pub struct EchoChildArgs {
    #[command(flatten)]
    pub shape: EchoShape,
}

struct Echo;

impl Handler for Echo {
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
        let _ = ctx.send(s, channel, data);
    }
}

/// What the echo clients counted in one phase.
struct PhaseTally {
    round_trips: u64,
    rtt_ns: Histogram<u64>,
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1_000, 60_000_000_000, 3).expect("histogram bounds are valid")
}

/// Echo clients on their own threads, recording each round trip under the phase in force when
/// its echo arrived, until `stop`.
struct EchoClients {
    phase: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Result<Vec<PhaseTally>>>>,
}

impl EchoClients {
    fn start(server: SocketAddr, shape: &EchoShape, phases: usize) -> Result<EchoClients> {
        let phase = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let ready = Arc::new(AtomicUsize::new(0));
        let mut threads = Vec::new();
        for i in 0..shape.clients {
            let (phase, stop, ready) = (phase.clone(), stop.clone(), ready.clone());
            let (window, payload) = (shape.window as u64, shape.payload.max(16));
            threads.push(
                std::thread::Builder::new()
                    .name(format!("echo-client-{i}"))
                    .spawn(move || {
                        client_loop(server, window, payload, phases, &phase, &stop, &ready)
                    })?,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while ready.load(Ordering::Acquire) < shape.clients {
            if Instant::now() > deadline || threads.iter().any(|t| t.is_finished()) {
                stop.store(true, Ordering::Release);
                for t in threads {
                    if let Ok(Err(e)) = t.join() {
                        return Err(e.context("an echo client failed to connect"));
                    }
                }
                bail!("the echo clients did not connect within 30 s");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(EchoClients {
            phase,
            stop,
            threads,
        })
    }

    fn set_phase(&self, p: usize) {
        self.phase.store(p, Ordering::Release);
    }

    /// Stop and merge the clients' tallies, phase by phase.
    fn finish(self) -> Result<Vec<PhaseTally>> {
        self.stop.store(true, Ordering::Release);
        let mut merged: Vec<PhaseTally> = Vec::new();
        for t in self.threads {
            let tallies = t
                .join()
                .map_err(|_| anyhow::anyhow!("an echo client panicked"))??;
            for (i, t) in tallies.into_iter().enumerate() {
                match merged.get_mut(i) {
                    Some(m) => {
                        m.round_trips += t.round_trips;
                        m.rtt_ns.add(&t.rtt_ns)?;
                    }
                    None => merged.push(t),
                }
            }
        }
        Ok(merged)
    }
}

fn client_loop(
    server: SocketAddr,
    window: u64,
    payload: usize,
    phases: usize,
    phase: &AtomicUsize,
    stop: &AtomicBool,
    ready: &AtomicUsize,
) -> Result<Vec<PhaseTally>> {
    let cfg = ClientConfig::new().connect_timeout(Duration::from_secs(20));
    let mut client = Client::connect_insecure_blocking(server, cfg).context("echo client")?;
    ready.fetch_add(1, Ordering::AcqRel);
    let mut tallies: Vec<PhaseTally> = (0..phases)
        .map(|_| PhaseTally {
            round_trips: 0,
            rtt_ns: hist(),
        })
        .collect();
    let t0 = Instant::now();
    let mut out = vec![0u8; payload];
    let (mut sent, mut received) = (0u64, 0u64);
    while !stop.load(Ordering::Acquire) {
        while sent - received < window {
            // The send time rides in the message: the echo's RTT needs no table.
            out[..8].copy_from_slice(&(t0.elapsed().as_nanos() as u64).to_le_bytes());
            match client.send(0, Bytes::copy_from_slice(&out)) {
                Ok(()) => sent += 1,
                Err(ricochet::ClientError::Send(ricochet::SendError::QueueFull)) => break,
                Err(e) => return Err(e.into()),
            }
        }
        for event in client.wait(Duration::from_millis(1))? {
            match event {
                ClientEvent::Message { data, .. } => {
                    received += 1;
                    let Some(stamp) = data.get(..8) else {
                        bail!("echo shorter than its stamp");
                    };
                    let at = u64::from_le_bytes(stamp.try_into()?);
                    let rtt = (t0.elapsed().as_nanos() as u64).saturating_sub(at);
                    let p = phase.load(Ordering::Acquire).min(phases - 1);
                    tallies[p].round_trips += 1;
                    let _ = tallies[p].rtt_ns.record(rtt.max(1_000));
                }
                ClientEvent::Disconnected { reason, .. } => bail!("echo client closed: {reason}"),
                _ => {}
            }
        }
    }
    client.close();
    let until = Instant::now() + Duration::from_secs(2);
    while client.is_connected() && Instant::now() < until {
        let _ = client.wait(Duration::from_millis(5))?.count();
    }
    Ok(tallies)
}

/// One scrape of `/metrics`: time from connecting to the last byte, and the body's size.
fn scrape(addr: SocketAddr) -> Result<(Duration, usize)> {
    let t = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    // What Prometheus asks for: OpenMetrics first.
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: bench\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let took = t.elapsed();
    let head_end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no HTTP head in the scrape's answer")?;
    if !out.starts_with(b"HTTP/1.1 200") && !out.starts_with(b"HTTP/1.0 200") {
        bail!(
            "scrape answered {:?}",
            String::from_utf8_lossy(&out[..head_end.min(40)])
        );
    }
    Ok((took, out.len() - head_end - 4))
}

/// Scrapes once a second on its own thread while `on`, until `stop`.
struct Scraper {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Result<Vec<(Duration, usize)>>>,
}

impl Scraper {
    fn start(addr: SocketAddr, on: Arc<AtomicBool>) -> Scraper {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut next = Instant::now();
            while !flag.load(Ordering::Acquire) {
                let now = Instant::now();
                if now >= next {
                    next = now + Duration::from_secs(1);
                    if on.load(Ordering::Acquire) {
                        got.push(scrape(addr)?);
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(got)
        });
        Scraper { stop, thread }
    }

    fn finish(self) -> Result<Vec<(Duration, usize)>> {
        self.stop.store(true, Ordering::Release);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the scraper panicked"))?
    }
}

fn server(shape: &EchoShape, metrics: bool, sessions: usize) -> Result<Server> {
    let bind: SocketAddr = "127.0.0.1:0".parse()?;
    let mut cfg = ServerConfig::new(bind)
        .insecure()
        .workers(shape.workers)
        .max_sessions(sessions + 1_000)
        .max_sessions_per_address(sessions + 1_000)
        .max_handshakes_per_address(u32::MAX);
    if metrics {
        cfg = cfg.metrics(bind);
    }
    Server::start(cfg, |_| Echo).map_err(|e| anyhow::anyhow!("server: {e}"))
}

/// One echo run: warm-up, then `seconds` measured; round trips per second.
fn echo_run(shape: &EchoShape, metrics: bool) -> Result<EchoRound> {
    let srv = server(shape, metrics, 0)?;
    let clients = EchoClients::start(srv.local_addr(), shape, 2)?;
    let scraper = srv
        .metrics_addr()
        .map(|a| Scraper::start(a, Arc::new(AtomicBool::new(true))));
    std::thread::sleep(Duration::from_secs_f64(shape.warmup));
    clients.set_phase(1);
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(shape.seconds));
    let measured = t.elapsed().as_secs_f64();
    let tallies = clients.finish()?;
    let scrapes = match scraper {
        Some(s) => s.finish()?,
        None => Vec::new(),
    };
    srv.shutdown().map_err(|e| anyhow::anyhow!("{e}"))?;
    let m = &tallies[1];
    Ok(EchoRound {
        round_trips_per_s: m.round_trips as f64 / measured,
        p99_us: m.rtt_ns.value_at_quantile(0.99) as f64 / 1e3,
        scrapes: scrapes.len(),
        conditioner_built_in: cfg!(feature = "conditioner"),
    })
}

/// One echo run's result (also the `ops-echo` child's output line).
#[derive(Serialize, serde::Deserialize, Debug, Clone, Copy)]
struct EchoRound {
    round_trips_per_s: f64,
    p99_us: f64,
    /// Scrapes of `/metrics` made during the run (metrics arm).
    scrapes: usize,
    /// Whether the binary that ran it has the link conditioner compiled in.
    conditioner_built_in: bool,
}

#[derive(Serialize, Debug, Clone)]
struct SideBySide {
    /// Name of side A and side B.
    sides: [&'static str; 2],
    rounds: Vec<[EchoRound; 2]>,
    median_round_trips_per_s: [f64; 2],
    /// Median of A over median of B.
    ratio: f64,
    goal: f64,
}

impl SideBySide {
    fn new(sides: [&'static str; 2], rounds: Vec<[EchoRound; 2]>, goal: f64) -> Self {
        let med = |i: usize| {
            median(
                &rounds
                    .iter()
                    .map(|r| r[i].round_trips_per_s)
                    .collect::<Vec<_>>(),
            )
            .unwrap_or(0.0)
        };
        let m = [med(0), med(1)];
        SideBySide {
            sides,
            ratio: m[0] / m[1].max(f64::MIN_POSITIVE),
            median_round_trips_per_s: m,
            rounds,
            goal,
        }
    }

    fn print(&self, title: &str) {
        println!("\n{title}");
        println!(
            "| round | {} rt/s | {} rt/s | ratio |",
            self.sides[0], self.sides[1]
        );
        println!("| ---: | ---: | ---: | ---: |");
        for (i, r) in self.rounds.iter().enumerate() {
            println!(
                "| {i} | {:.0} | {:.0} | {:.3} |",
                r[0].round_trips_per_s,
                r[1].round_trips_per_s,
                r[0].round_trips_per_s / r[1].round_trips_per_s.max(f64::MIN_POSITIVE)
            );
        }
        println!(
            "| median | {:.0} | {:.0} | **{:.3}×** (goal ≥ {:.2}×) |",
            self.median_round_trips_per_s[0],
            self.median_round_trips_per_s[1],
            self.ratio,
            self.goal
        );
    }
}

/// Alternate `a` and `b` for `rounds` rounds, swapping the order each round.
fn alternate(
    rounds: usize,
    mut a: impl FnMut() -> Result<EchoRound>,
    mut b: impl FnMut() -> Result<EchoRound>,
) -> Result<Vec<[EchoRound; 2]>> {
    let mut out = Vec::new();
    for round in 0..rounds.max(1) {
        let pair = if round % 2 == 0 {
            let x = a()?;
            [x, b()?]
        } else {
            let y = b()?;
            [a()?, y]
        };
        eprintln!(
            "round {round}: {:.0} vs {:.0} rt/s",
            pair[0].round_trips_per_s, pair[1].round_trips_per_s
        );
        out.push(pair);
    }
    Ok(out)
}

#[derive(Serialize, Debug, Clone)]
struct ScrapeArm {
    sessions: usize,
    connect_seconds: f64,
    phases: usize,
    phase_seconds: f64,
    scrapes: usize,
    scrape_ms_median: f64,
    scrape_ms_p90: f64,
    scrape_ms_max: f64,
    exposition_bytes: usize,
    /// Echo round trips (p50, p99, p99.9 in µs) while scraping and while quiet (quiet A and B
    /// pooled).
    scraping: Percentiles,
    quiet: Percentiles,
    /// Scraping p99 over quiet p99 (pooled over the phases of each kind).
    p99_ratio: f64,
    scrape_goal_ms: f64,
    /// The kind of each measured phase, in order.
    phase_kinds: Vec<PhaseKind>,
    /// The echo's p99 in each measured phase, in order (µs).
    phase_p99_us: Vec<f64>,
    /// The two kinds of quiet phase, each pooled.
    quiet_a: Percentiles,
    quiet_b: Percentiles,
    /// The A/A comparison: quiet A p99 over quiet B p99 (pooled).
    aa_p99_ratio: f64,
    /// The band the A/A comparison shows: `[1/x, x]` with `x` = `aa_p99_ratio` or its inverse,
    /// whichever is larger.
    aa_band: [f64; 2],
    /// Per triple: its scraping phase's p99 over its two quiet phases' (pooled), and quiet A
    /// over quiet B.
    pairs: Vec<PairRatios>,
    median_pair_p99_ratio: f64,
    median_pair_aa_p99_ratio: f64,
    /// The per-triple A/A band: `[1/y, y]`, `y` the median over triples of quiet A / quiet B
    /// or its inverse, whichever is larger (how far apart one triple's two quiet phases
    /// typically come).
    pair_aa_band: [f64; 2],
    /// `p99_ratio` above `aa_band`.
    p99_raised: bool,
    /// `median_pair_p99_ratio` above `pair_aa_band`.
    pair_p99_raised: bool,
    /// "not raised", "raised" or "unclear" (see `verdict_rule`).
    verdict: &'static str,
    verdict_rule: &'static str,
}

/// One triple's ratios.
#[derive(Serialize, Debug, Clone, Copy)]
struct PairRatios {
    scraping_p99_us: f64,
    quiet_a_p99_us: f64,
    quiet_b_p99_us: f64,
    /// Scraping p99 over quiet A and B pooled.
    p99_ratio: f64,
    /// Quiet A p99 over quiet B p99.
    aa_p99_ratio: f64,
}

/// What one phase of the scrape arm does.
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum PhaseKind {
    Scraping,
    QuietA,
    QuietB,
}

/// The kind of measured phase `i` (0-based): triples of scraping then quiet A and quiet B,
/// the two quiet ones swapped every other triple (S A B S B A ...). Over two triples each
/// kind comes right after each other kind once, so whatever a phase leaves to the next falls
/// on quiet A and quiet B alike, and they hold the same places.
fn phase_kind(i: usize) -> PhaseKind {
    match (i % 3, (i / 3) % 2) {
        (0, _) => PhaseKind::Scraping,
        (1, 0) | (2, 1) => PhaseKind::QuietA,
        _ => PhaseKind::QuietB,
    }
}

/// How the verdict on "does not raise the echo's p99" is reached (also written to the JSON).
const VERDICT_RULE: &str = "A/A band: quiet A and quiet B differ in nothing, so their p99 ratio x shows how far two identical conditions come apart in this run; the band is [1/x, x] (x >= 1 after folding). Scraping raises the p99 if scraping/quiet lies above that band. Pooled: p99_ratio against aa_band; per triple: the median of the triples' scraping/quiet ratios against pair_aa_band (the median over triples of the folded quiet A / quiet B ratio), which one bad phase cannot move. Verdict: \"raised\" when both lie above their band, \"not raised\" when neither does, \"unclear\" when they disagree.";

/// `x` or `1/x`, whichever is at least 1.
fn fold(x: f64) -> f64 {
    if x >= 1.0 {
        x
    } else {
        1.0 / x.max(f64::MIN_POSITIVE)
    }
}

/// The verdict of [`VERDICT_RULE`] from whether the pooled and the per-triple ratio lie above
/// their A/A bands.
fn p99_verdict(p99_raised: bool, pair_p99_raised: bool) -> &'static str {
    match (p99_raised, pair_p99_raised) {
        (true, true) => "raised",
        (false, false) => "not raised",
        _ => "unclear",
    }
}

#[derive(Serialize, Debug, Clone, Copy)]
struct Percentiles {
    round_trips: u64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
}

impl Percentiles {
    fn of(t: &PhaseTally) -> Self {
        let q = |x| t.rtt_ns.value_at_quantile(x) as f64 / 1e3;
        Percentiles {
            round_trips: t.round_trips,
            p50_us: q(0.5),
            p99_us: q(0.99),
            p999_us: q(0.999),
        }
    }
}

/// The idle sessions: a `ClientSet` driven on its own thread (keep-alives answered).
fn idle_sessions(
    server: SocketAddr,
    n: usize,
    stop: Arc<AtomicBool>,
) -> (
    std::sync::mpsc::Receiver<Result<f64>>,
    std::thread::JoinHandle<Result<()>>,
) {
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || -> Result<()> {
        let t = Instant::now();
        let mut set = ClientSet::new();
        // A loaded host answers slowly: a longer handshake limit than a player's, and
        // batches small enough that one batch's handshakes are not queued behind each other.
        let cfg = ClientConfig::new().session(|c| c.handshake_timeout = Duration::from_secs(30));
        let mut made = 0;
        while made < n {
            let k = (n - made).min(200);
            let connected = set
                .start_connecting_insecure(server, &cfg, k)
                .map_err(|e| anyhow::anyhow!("idle sessions: {e}"))
                .and_then(|_| {
                    set.wait_connected(Duration::from_secs(60))
                        .map_err(|e| anyhow::anyhow!("idle sessions: {e}"))
                });
            if let Err(e) = connected {
                let _ = tx.send(Err(anyhow::anyhow!("{e:#}")));
                return Err(e);
            }
            while set.poll_event().is_some() {}
            made += k;
        }
        let _ = tx.send(Ok(t.elapsed().as_secs_f64()));
        while !stop.load(Ordering::Acquire) {
            set.step(Duration::from_millis(20))
                .map_err(|e| anyhow::anyhow!("idle sessions: {e}"))?;
            while set.poll_event().is_some() {}
        }
        for i in 0..set.len() {
            set.close(i);
        }
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until && set.connected() > 0 {
            let _ = set.step(Duration::from_millis(20));
            while set.poll_event().is_some() {}
        }
        Ok(())
    });
    (rx, thread)
}

fn scrape_arm(args: &OpsArgs) -> Result<ScrapeArm> {
    let shape = &args.shape;
    if args.phases == 0 || args.phases % 3 != 0 {
        bail!(
            "--phases must be a positive multiple of 3 (triples of scraping, quiet A and quiet B), not {}",
            args.phases
        );
    }
    let srv = server(shape, true, args.sessions)?;
    let metrics = srv.metrics_addr().context("metrics endpoint")?;
    let stop = Arc::new(AtomicBool::new(false));
    let (connected, idle) = idle_sessions(srv.local_addr(), args.sessions, stop.clone());
    let connect_seconds = connected
        .recv()
        .map_err(|_| anyhow::anyhow!("idle sessions thread ended"))??;
    eprintln!(
        "{} idle sessions connected in {connect_seconds:.1} s; server holds {}",
        args.sessions,
        srv.session_count()
    );
    // Phases: 0 = warm-up, then phase p measures the kind `phase_kind(p - 1)`.
    let kinds: Vec<PhaseKind> = (0..args.phases).map(phase_kind).collect();
    let clients = EchoClients::start(srv.local_addr(), shape, args.phases + 1)?;
    let scraping = Arc::new(AtomicBool::new(false));
    let scraper = Scraper::start(metrics, scraping.clone());
    std::thread::sleep(Duration::from_secs_f64(shape.warmup));
    for (i, kind) in kinds.iter().enumerate() {
        scraping.store(*kind == PhaseKind::Scraping, Ordering::Release);
        clients.set_phase(i + 1);
        std::thread::sleep(Duration::from_secs_f64(args.phase_seconds));
    }
    scraping.store(false, Ordering::Release);
    let tallies = clients.finish()?;
    let scrapes = scraper.finish()?;
    let held = srv.session_count();
    stop.store(true, Ordering::Release);
    idle.join()
        .map_err(|_| anyhow::anyhow!("idle sessions panicked"))??;
    srv.shutdown().map_err(|e| anyhow::anyhow!("{e}"))?;
    if held < args.sessions {
        bail!(
            "the server held {held} sessions at the end, not {}",
            args.sessions
        );
    }
    let measured = tallies.get(1..).unwrap_or_default();
    if measured.len() != kinds.len() {
        bail!(
            "the echo clients counted {} phases, not {}",
            measured.len(),
            kinds.len()
        );
    }
    let pool = |phases: &mut dyn Iterator<Item = &PhaseTally>| -> Result<Percentiles> {
        let mut into = PhaseTally {
            round_trips: 0,
            rtt_ns: hist(),
        };
        for t in phases {
            into.round_trips += t.round_trips;
            into.rtt_ns.add(&t.rtt_ns)?;
        }
        Ok(Percentiles::of(&into))
    };
    let of_kind = |k: PhaseKind| -> Result<Percentiles> {
        pool(
            &mut measured
                .iter()
                .zip(&kinds)
                .filter(move |(_, kk)| **kk == k)
                .map(|(t, _)| t),
        )
    };
    let ratio = |a: f64, b: f64| a / b.max(f64::MIN_POSITIVE);
    let scraping = of_kind(PhaseKind::Scraping)?;
    let (quiet_a, quiet_b) = (of_kind(PhaseKind::QuietA)?, of_kind(PhaseKind::QuietB)?);
    let quiet = pool(
        &mut measured
            .iter()
            .zip(&kinds)
            .filter(|(_, k)| **k != PhaseKind::Scraping)
            .map(|(t, _)| t),
    )?;
    let mut pairs = Vec::new();
    for (triple, k) in measured.chunks(3).zip(kinds.chunks(3)) {
        let find = |want: PhaseKind| {
            triple
                .iter()
                .zip(k)
                .find(|(_, kk)| **kk == want)
                .map(|(t, _)| t)
                .context("a triple without each kind of phase")
        };
        let (s, a, b) = (
            find(PhaseKind::Scraping)?,
            find(PhaseKind::QuietA)?,
            find(PhaseKind::QuietB)?,
        );
        let q = pool(&mut [a, b].into_iter())?;
        let (s, a, b) = (Percentiles::of(s), Percentiles::of(a), Percentiles::of(b));
        pairs.push(PairRatios {
            scraping_p99_us: s.p99_us,
            quiet_a_p99_us: a.p99_us,
            quiet_b_p99_us: b.p99_us,
            p99_ratio: ratio(s.p99_us, q.p99_us),
            aa_p99_ratio: ratio(a.p99_us, b.p99_us),
        });
    }
    let med = |xs: Vec<f64>| median(&xs).unwrap_or(f64::NAN);
    let median_pair_p99_ratio = med(pairs.iter().map(|p| p.p99_ratio).collect());
    let median_pair_aa_p99_ratio = med(pairs.iter().map(|p| p.aa_p99_ratio).collect());
    let pair_band = med(pairs.iter().map(|p| fold(p.aa_p99_ratio)).collect());
    let p99_ratio = ratio(scraping.p99_us, quiet.p99_us);
    let aa_p99_ratio = ratio(quiet_a.p99_us, quiet_b.p99_us);
    let band = fold(aa_p99_ratio);
    let p99_raised = p99_ratio > band;
    let pair_p99_raised = median_pair_p99_ratio > pair_band;
    let mut ms: Vec<f64> = scrapes.iter().map(|s| s.0.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let pct = |q: f64| {
        ms.get(((ms.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    Ok(ScrapeArm {
        sessions: args.sessions,
        connect_seconds,
        phases: args.phases,
        phase_seconds: args.phase_seconds,
        scrapes: scrapes.len(),
        scrape_ms_median: pct(0.5),
        scrape_ms_p90: pct(0.9),
        scrape_ms_max: pct(1.0),
        exposition_bytes: scrapes.iter().map(|s| s.1).max().unwrap_or(0),
        p99_ratio,
        scraping,
        quiet,
        scrape_goal_ms: 50.0,
        phase_p99_us: measured.iter().map(|t| Percentiles::of(t).p99_us).collect(),
        phase_kinds: kinds,
        quiet_a,
        quiet_b,
        aa_p99_ratio,
        aa_band: [1.0 / band, band],
        pairs,
        median_pair_p99_ratio,
        median_pair_aa_p99_ratio,
        pair_aa_band: [1.0 / pair_band, pair_band],
        p99_raised,
        pair_p99_raised,
        verdict: p99_verdict(p99_raised, pair_p99_raised),
        verdict_rule: VERDICT_RULE,
    })
}

/// One echo run in a child process of `binary` (`bench ops-echo`).
fn echo_child(binary: &std::path::Path, shape: &EchoShape) -> Result<EchoRound> {
    let out = std::process::Command::new(binary)
        .arg("ops-echo")
        .args(["--clients", &shape.clients.to_string()])
        .args(["--window", &shape.window.to_string()])
        .args(["--payload", &shape.payload.to_string()])
        .args(["--workers", &shape.workers.to_string()])
        .args(["--seconds", &shape.seconds.to_string()])
        .args(["--warmup", &shape.warmup.to_string()])
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", binary.display()))?;
    if !out.status.success() {
        bail!("{} ops-echo failed: {}", binary.display(), out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .context("ops-echo printed no result line")?;
    Ok(serde_json::from_str(line)?)
}

/// The hidden `ops-echo` child: one echo run without metrics, one JSON line.
pub fn echo_child_main(a: &EchoChildArgs) -> Result<bool> {
    let r = echo_run(&a.shape, false)?;
    println!("{}", serde_json::to_string(&r)?);
    Ok(true)
}

#[derive(Serialize)]
struct Report<'a> {
    kind: &'static str,
    created_unix_s: u64,
    created_utc: String,
    command: String,
    host: HostInfo,
    build: BuildInfo,
    shape: &'a EchoShape,
    rounds: usize,
    metrics: Option<SideBySide>,
    scrape: Option<ScrapeArm>,
    conditioner: Option<SideBySide>,
    /// The binary without the conditioner the conditioner arm ran, as given.
    without_conditioner: Option<String>,
}

/// Run `bench ops` and write its JSON.
pub fn run(args: &OpsArgs, out: &Global) -> Result<bool> {
    let host = HostInfo::collect();
    let at = UtcTime::now();
    let wants = |arm: &str| args.only.iter().any(|a| a == arm);
    let shape = &args.shape;
    if shape.payload < 16 {
        bail!("--payload must be at least 16 bytes (the echo's time stamp)");
    }
    if wants("scrape") && (args.phases == 0 || args.phases % 3 != 0) {
        bail!(
            "--phases must be a positive multiple of 3 (triples of scraping, quiet A and quiet B), not {}",
            args.phases
        );
    }
    println!(
        "echo: {} clients × {} in flight × {} B, {} server worker(s), {} s measured after {} s",
        shape.clients, shape.window, shape.payload, shape.workers, shape.seconds, shape.warmup
    );
    let mut ok = true;
    let metrics = if wants("metrics") {
        let rounds = alternate(
            args.rounds,
            || echo_run(shape, true),
            || echo_run(shape, false),
        )?;
        let m = SideBySide::new(
            ["metrics on, scraped each second", "metrics off"],
            rounds,
            0.97,
        );
        m.print("metrics on and scraped every second vs off:");
        ok &= m.rounds.iter().all(|r| r[0].scrapes > 0);
        Some(m)
    } else {
        None
    };
    let scrape = if wants("scrape") {
        let s = scrape_arm(args)?;
        println!(
            "\n{} sessions: {} scrapes, {:.1} ms median, {:.1} ms p90, {:.1} ms max (goal ≤ {:.0} ms), exposition {} B",
            s.sessions, s.scrapes, s.scrape_ms_median, s.scrape_ms_p90, s.scrape_ms_max, s.scrape_goal_ms, s.exposition_bytes
        );
        println!("| triple | scraping p99 µs | quiet A p99 µs | quiet B p99 µs | scraping / quiet | A / B |");
        println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
        for (i, p) in s.pairs.iter().enumerate() {
            println!(
                "| {i} | {:.0} | {:.0} | {:.0} | {:.3} | {:.3} |",
                p.scraping_p99_us, p.quiet_a_p99_us, p.quiet_b_p99_us, p.p99_ratio, p.aa_p99_ratio
            );
        }
        println!(
            "| median | | | | {:.3} (A/A band {:.3}..{:.3}) | {:.3} |",
            s.median_pair_p99_ratio,
            s.pair_aa_band[0],
            s.pair_aa_band[1],
            s.median_pair_aa_p99_ratio
        );
        println!(
            "echo p99 while scraping {:.0} µs ({} round trips), quiet {:.0} µs ({}): {:.3}×; A/A: quiet A {:.0} µs / quiet B {:.0} µs = {:.3}× (band {:.3}..{:.3}): {}",
            s.scraping.p99_us,
            s.scraping.round_trips,
            s.quiet.p99_us,
            s.quiet.round_trips,
            s.p99_ratio,
            s.quiet_a.p99_us,
            s.quiet_b.p99_us,
            s.aa_p99_ratio,
            s.aa_band[0],
            s.aa_band[1],
            s.verdict
        );
        ok &= s.scrapes > 0;
        Some(s)
    } else {
        None
    };
    let conditioner = match (&args.without_conditioner, wants("conditioner")) {
        (Some(other), true) => {
            let me = std::env::current_exe()?;
            let rounds = alternate(
                args.rounds,
                || echo_child(&me, shape),
                || echo_child(other, shape),
            )?;
            if rounds
                .iter()
                .any(|r| !r[0].conditioner_built_in || r[1].conditioner_built_in)
            {
                bail!(
                    "the conditioner arm needs this binary with the conditioner and {} without (cargo build --release -p bench --no-default-features)",
                    other.display()
                );
            }
            let c = SideBySide::new(["conditioner built in, off", "compiled out"], rounds, 0.98);
            c.print("link conditioner off vs compiled out (one child process each, alternated):");
            Some(c)
        }
        (None, true) => {
            println!("\nconditioner arm skipped: give --without-conditioner PATH");
            None
        }
        _ => None,
    };
    let path = &out.path_for("ops", &at);
    let report = Report {
        kind: "ops",
        created_unix_s: at.unix_s,
        created_utc: at.iso(),
        command: command_line(),
        host,
        build: BuildInfo::collect(),
        shape,
        rounds: args.rounds,
        metrics,
        scrape,
        conditioner,
        without_conditioner: args
            .without_conditioner
            .as_ref()
            .map(|p| p.display().to_string()),
    };
    bench::output::write_json(&report, path)?;
    println!("results: {}", path.display());
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every triple holds each kind once; over two triples (and the next one's start) each
    /// kind comes right after each other kind exactly once, and quiet A and B hold the same
    /// places: the A/A comparison is interleaved the way scraping and quiet are.
    #[test]
    fn phases_come_in_balanced_triples() {
        let kinds: Vec<PhaseKind> = (0..12).map(phase_kind).collect();
        let all = [PhaseKind::Scraping, PhaseKind::QuietA, PhaseKind::QuietB];
        for triple in kinds.chunks(3) {
            for k in all {
                assert_eq!(triple.iter().filter(|x| **x == k).count(), 1);
            }
        }
        for a in all {
            for b in all.into_iter().filter(|b| *b != a) {
                let n = kinds[..7].windows(2).filter(|w| w == &[a, b]).count();
                assert_eq!(n, 1, "{b:?} right after {a:?}");
            }
        }
        let places = |k: PhaseKind| -> usize { (0..12).filter(|i| kinds[*i] == k).sum() };
        assert_eq!(places(PhaseKind::QuietA), places(PhaseKind::QuietB));
        assert_eq!(kinds[0], PhaseKind::Scraping);
    }

    #[test]
    fn band_folds_and_verdict_needs_both_views() {
        assert_eq!(fold(1.25), 1.25);
        assert_eq!(fold(0.8), 1.25);
        assert_eq!(fold(1.0), 1.0);
        assert_eq!(p99_verdict(true, true), "raised");
        assert_eq!(p99_verdict(false, false), "not raised");
        assert_eq!(p99_verdict(true, false), "unclear");
        assert_eq!(p99_verdict(false, true), "unclear");
    }
}
