//! `bench lanes`: players behind a bottleneck (issue 38). The server (in the bench) ticks at
//! 60 Hz and sends each player a snapshot on an unreliable channel every tick and a small
//! reliable event at 10 Hz, after that tick's snapshot; the players run in a separate process
//! ([`players`]) behind the relay's bottleneck. Measured per scenario and arm: event latency,
//! snapshot age at delivery (server send to player receive, on the host's monotonic clock),
//! the relay's queue delay at the bottleneck, reliable events lost, snapshots delivered, and
//! and the server session's rate estimate, sampled every tick, against the bottleneck's rate
//! (or the fair share of a shared one). Each arm's run also carries its [`series`] over time
//! (bins of 100 ms): what the report's chart of latency over time per lane draws.
//!
//! An *arm* is how the server and players configure their sessions: the baseline (one channel
//! list as before issue 38: one queue, the game profile with NewReno), `cc` (one queue, the
//! game profile with the delay-aware controller) and `lanes` (the same with the event channel in a lane of its own ahead of the snapshot lane, whose channel keeps
//! only the newest snapshot). The arms of a run alternate, so they share the host's conditions.

pub mod players;
pub mod series;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use ricochet::runtime::{Handler, Server, ServerConfig, ServerContext, SessionId};
use ricochet::{CongestionController, Lane};
use serde::Serialize;

use crate::commands::Global;
use crate::host::{command_line, BuildInfo, HostInfo, UtcTime};
use crate::relay::{BottleneckConfig, BottleneckCounters, RateSchedule, Relay, RelayConfig};
use crate::scale::server::monotonic_ns;
use players::{Arrival, PlayersProcess, PlayersSpec, HEADER};
use ricochet_testkit::Impairment;
use series::{Observed, Series};

/// Channel of the events (reliable-ordered in every profile's channel list).
const EVENT_CHANNEL: u8 = 0;
/// Channel of the snapshots (unreliable-sequenced in every profile's channel list).
const SNAPSHOT_CHANNEL: u8 = 3;
/// How long the players keep receiving after the server stops sending, so that reliable
/// events in flight (or queued behind snapshots) arrive before they are counted lost.
const DRAIN: Duration = Duration::from_secs(3);

/// `bench lanes` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct LanesArgs {
    /// Scenarios to run (default: all three).
    #[arg(long, value_delimiter = ',')]
    pub scenario: Vec<String>,
    /// Arms to run, alternated per repetition (`baseline`, `cc`, `lanes`).
    #[arg(long, value_delimiter = ',', default_value = "lanes,baseline")]
    pub arms: Vec<String>,
    /// Runs per scenario and arm (medians reported).
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Snapshot size, bytes.
    #[arg(long, default_value_t = 2400)]
    pub snapshot_bytes: usize,
    /// Event size, bytes.
    #[arg(long, default_value_t = 64)]
    pub event_bytes: usize,
    /// Datagram backend of server and players.
    #[arg(long, default_value = "auto")]
    pub backend: String,
}

/// How the sessions of one arm are configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arm {
    /// Today's sending: one queue for all channels, the game profile with NewReno (its
    /// congestion control before issue 38).
    Baseline,
    /// One queue for all channels, the game profile with the delay-aware controller.
    Cc,
    /// The game profile (delay-aware controller) with two lanes: the event channel first
    /// (priority 0), every other channel after it (priority 1), the snapshot channel
    /// newest-only.
    Lanes,
}

impl Arm {
    fn parse(s: &str) -> Result<Arm> {
        match s {
            "baseline" => Ok(Arm::Baseline),
            "cc" => Ok(Arm::Cc),
            "lanes" => Ok(Arm::Lanes),
            other => bail!("unknown arm {other:?} (baseline, cc, lanes)"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Arm::Baseline => "baseline",
            Arm::Cc => "cc",
            Arm::Lanes => "lanes",
        }
    }

    /// The protocol profile of both sides.
    fn profile(self) -> &'static str {
        match self {
            Arm::Baseline | Arm::Cc | Arm::Lanes => "game",
        }
    }

    /// The server's session settings of this arm on top of the profile.
    fn configure(self, cfg: ServerConfig) -> ServerConfig {
        match self {
            Arm::Baseline | Arm::Cc => cfg,
            Arm::Lanes => cfg
                .lanes([
                    Lane::new([EVENT_CHANNEL]),
                    Lane::new((0..4u8).filter(|&c| c != EVENT_CHANNEL)).priority(1),
                ])
                .newest_only([SNAPSHOT_CHANNEL]),
        }
    }

    /// The server sessions' congestion controller.
    fn controller(self) -> CongestionController {
        match self {
            Arm::Baseline => CongestionController::NewReno,
            Arm::Cc | Arm::Lanes => CongestionController::Delay,
        }
    }
}

/// One network scenario of issue 38.
#[derive(Debug, Clone)]
struct Scenario {
    name: &'static str,
    players: usize,
    /// The server-to-player bottleneck's rate over time.
    rate: &'static str,
    /// All players share the bottleneck (the server's uplink) instead of one each.
    shared: bool,
    /// Measured time from the relay's start (the rate schedule's clock).
    seconds: f64,
    /// A rate step worth a window of its own: (offset, window).
    step: Option<(Duration, Duration)>,
}

const SCENARIOS: [Scenario; 3] = [
    Scenario {
        name: "downlink-1mbit",
        players: 1,
        rate: "1mbit",
        shared: false,
        seconds: 8.0,
        step: None,
    },
    Scenario {
        name: "step-4-to-1",
        players: 1,
        rate: "4mbit@0s,1mbit@5s",
        shared: false,
        seconds: 10.0,
        step: Some((Duration::from_secs(5), Duration::from_secs(1))),
    },
    Scenario {
        name: "uplink-shared",
        players: 16,
        rate: "10mbit",
        shared: true,
        seconds: 8.0,
        step: None,
    },
];

/// The bottleneck's buffer and the one-way delay of every scenario.
const BUFFER: Duration = Duration::from_millis(100);
const ONE_WAY: Duration = Duration::from_millis(20);
const TICK_HZ: u32 = 60;
const EVENTS_EVERY: u64 = 6;

/// What one arm measured in one run.
#[derive(Debug, Clone, Serialize)]
pub struct ArmRun {
    /// The arm.
    pub arm: Arm,
    /// Event latency (server send to player receive), p50, µs.
    pub event_p50_us: Option<f64>,
    /// Event latency p99, µs.
    pub event_p99_us: Option<f64>,
    /// Event latency p99 over the window after a rate step, µs (step scenarios only).
    pub event_p99_after_step_us: Option<f64>,
    /// Snapshot age at delivery (server send to player receive), p50, µs.
    pub snapshot_age_p50_us: Option<f64>,
    /// Snapshot age at delivery, p99, µs.
    pub snapshot_age_p99_us: Option<f64>,
    /// The relay's queue delay at the bottleneck, p50, µs.
    pub relay_queue_p50_us: u64,
    /// The relay's queue delay, p99, µs.
    pub relay_queue_p99_us: u64,
    /// Datagrams the bottleneck dropped (buffer full).
    pub relay_dropped: u64,
    /// Snapshots the server sent.
    pub snapshots_sent: u64,
    /// Snapshots the players received.
    pub snapshots_delivered: u64,
    /// Snapshots received per player (fair share across players).
    pub snapshots_per_player: Vec<u64>,
    /// Smallest over largest per-player snapshot count (1: equal shares).
    pub fair_share_min_over_max: Option<f64>,
    /// Events the server sent.
    pub events_sent: u64,
    /// Events sent but not received after the drain.
    pub reliable_lost: u64,
    /// Snapshot or event sends the server's session refused (queue full).
    pub send_refused: u64,
    /// Snapshots the server's sessions dropped unsent because a newer one replaced them
    /// (newest-only channel, lanes arm).
    pub snapshots_replaced: u64,
    /// Snapshots the server's sessions dropped unsent at a queue limit (the channel's
    /// `unreliable_queue_limit` or a lane's cap).
    pub snapshots_shed: u64,
    /// The server sessions' estimate of the available rate, bits per second: the median of
    /// every session's samples over the judged window (see `rate_estimate_error_pct`).
    pub rate_estimate_bps: Option<f64>,
    /// Its largest error over the judged window against the bottleneck's rate (a shared
    /// bottleneck: the fair share, rate / players), percent of that rate: the estimate of
    /// every session, sampled every tick, from 2 s after the start (a rate step: from 1 s
    /// after the step) to the end.
    pub rate_estimate_error_pct: Option<f64>,
    /// The median error over the same samples, percent.
    pub rate_estimate_error_p50_pct: Option<f64>,
    /// The bottleneck's full counters.
    pub bottleneck: BottleneckCounters,
    /// The run over time (bins of 100 ms from the relay's start, through the drain): the
    /// chart of latency over time per lane.
    pub series: Series,
}

/// One scenario's result: the keys scripts read, then every run of every arm.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    /// `downlink-1mbit`, `step-4-to-1` or `uplink-shared`.
    pub scenario: String,
    /// The arm the headline keys below describe: `lanes` when the run has it, else
    /// `baseline`.
    pub measured_arm: String,
    /// Event latency p99 of the measured arm, µs (median over runs).
    pub event_p99_us: Option<f64>,
    /// Event latency p99 of the baseline arm in the same run, µs (median over runs).
    pub baseline_event_p99_us: Option<f64>,
    /// Snapshot age at delivery p99 of the measured arm, µs (median over runs).
    pub snapshot_age_p99_us: Option<f64>,
    /// The relay's queue delay p50 under the measured arm, µs (median over runs).
    pub relay_queue_p50_us: Option<f64>,
    /// The rate estimate's largest error over the judged window, percent (median over runs).
    pub rate_estimate_error_pct: Option<f64>,
    /// Reliable events lost by the measured arm (sum over runs).
    pub reliable_lost: u64,
    /// Snapshots delivered to the measured arm's players (median over runs).
    pub snapshots_delivered: Option<f64>,
    /// Players.
    pub players: usize,
    /// The bottleneck's rate schedule.
    pub rate: String,
    /// The bottleneck is shared by all players (the server's uplink).
    pub shared_bottleneck: bool,
    /// Bottleneck buffer, ms.
    pub buffer_ms: u64,
    /// One-way delay each way, ms.
    pub one_way_delay_ms: u64,
    /// Measured seconds (from the relay's start).
    pub seconds: f64,
    /// Every run, arms alternated.
    pub runs: Vec<ArmRun>,
}

/// The JSON file.
#[derive(Debug, Serialize)]
struct LanesFile {
    kind: &'static str,
    at: String,
    command: String,
    host: HostInfo,
    build: BuildInfo,
    snapshot_bytes: usize,
    event_bytes: usize,
    tick_hz: u32,
    events_hz: u64,
    scenarios: Vec<ScenarioResult>,
}

/// Counters the server handler shares with the bench.
#[derive(Debug, Default)]
struct Counts {
    sending: AtomicBool,
    snapshots: AtomicU64,
    events: AtomicU64,
    refused: AtomicU64,
    /// The server sessions' unsent snapshots so far, summed: replaced by a newer one, and
    /// dropped by a queue limit (the channel's or the lane's).
    replaced: AtomicU64,
    shed: AtomicU64,
    /// (monotonic ns, session's rate estimate in bytes/s), every tick per session.
    estimates: Mutex<Vec<(u64, u64)>>,
}

struct TickHandler {
    counts: Arc<Counts>,
    tick: u64,
    snapshot: Vec<u8>,
    event: Vec<u8>,
}

impl TickHandler {
    fn stamp(buf: &mut [u8], seq: u64) {
        buf[..8].copy_from_slice(&seq.to_le_bytes());
        buf[8..16].copy_from_slice(&monotonic_ns().to_le_bytes());
    }
}

impl Handler for TickHandler {
    fn on_message(&mut self, _: &mut ServerContext<'_>, _: SessionId, _: u8, _: Bytes) {}

    fn on_tick(&mut self, ctx: &mut ServerContext<'_>) {
        if !self.counts.sending.load(Ordering::Relaxed) {
            return;
        }
        let tick = self.tick;
        self.tick += 1;
        let sessions: Vec<SessionId> = ctx.sessions().collect();
        let (mut replaced, mut shed) = (0, 0);
        for &s in &sessions {
            if let Some(st) = ctx.session_stats(s) {
                replaced += st.unsent.replaced;
                shed += st.unsent.queue_limit + st.unsent.lane_limit;
            }
        }
        self.counts.replaced.store(replaced, Ordering::Relaxed);
        self.counts.shed.store(shed, Ordering::Relaxed);
        let at = monotonic_ns();
        if let Ok(mut e) = self.counts.estimates.lock() {
            e.extend(
                sessions
                    .iter()
                    .filter_map(|&s| ctx.rate_estimate(s).map(|r| (at, r))),
            );
        }
        // The snapshot first, then (every sixth tick) the event: the event that waits behind
        // the tick's snapshot is what issue 38 measures.
        Self::stamp(&mut self.snapshot, tick);
        let snapshot = Bytes::copy_from_slice(&self.snapshot);
        for &s in &sessions {
            match ctx.send(s, SNAPSHOT_CHANNEL, snapshot.clone()) {
                Ok(()) => self.counts.snapshots.fetch_add(1, Ordering::Relaxed),
                Err(_) => self.counts.refused.fetch_add(1, Ordering::Relaxed),
            };
        }
        if tick % EVENTS_EVERY == 0 {
            Self::stamp(&mut self.event, tick / EVENTS_EVERY);
            let event = Bytes::copy_from_slice(&self.event);
            for &s in &sessions {
                match ctx.send(s, EVENT_CHANNEL, event.clone()) {
                    Ok(()) => self.counts.events.fetch_add(1, Ordering::Relaxed),
                    Err(_) => self.counts.refused.fetch_add(1, Ordering::Relaxed),
                };
            }
        }
    }
}

fn percentile(mut v: Vec<f64>, q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    Some(v[i])
}

fn latencies_us(a: &[Arrival], keep: impl Fn(&Arrival) -> bool) -> Vec<f64> {
    a.iter()
        .filter(|x| keep(x))
        .map(|x| x.recv_ns.saturating_sub(x.sent_ns) as f64 / 1e3)
        .collect()
}

fn median(v: Vec<f64>) -> Option<f64> {
    percentile(v, 0.5)
}

/// Runs one scenario with one arm.
fn run_once(sc: &Scenario, arm: Arm, args: &LanesArgs) -> Result<ArmRun> {
    let period = Duration::from_secs(1) / TICK_HZ;
    let counts = Arc::new(Counts::default());
    let profile = crate::scale::setup::protocol_profile(arm.profile())?;
    let cfg = ServerConfig::new("127.0.0.1:0".parse::<SocketAddr>()?)
        .insecure()
        .profile(profile);
    let cfg = arm
        .configure(cfg)
        .workers(1)
        .backend(args.backend.parse().map_err(|e| anyhow!("{e}"))?)
        .tick(period)
        .session(|c| c.congestion_controller = arm.controller())
        // Every player reaches the server from the relay's address, as from one NAT.
        .max_sessions_per_address(sc.players.max(1) + 4);
    let snapshot_bytes = args.snapshot_bytes.max(HEADER);
    let event_bytes = args.event_bytes.max(HEADER);
    let c = counts.clone();
    let server = Server::start(cfg, move |_| TickHandler {
        counts: c.clone(),
        tick: 0,
        snapshot: vec![0xab; snapshot_bytes],
        event: vec![0xcd; event_bytes],
    })
    .map_err(|e| anyhow!("starting the server: {e}"))?;
    let server_addr = server.local_addr();

    let schedule: RateSchedule = sc.rate.parse()?;
    let neck = BottleneckConfig::new(schedule.clone(), BUFFER);
    let delay = Impairment::none().with_delay(ONE_WAY);
    let mut rc = RelayConfig::new(server_addr, delay)
        .with_bottlenecks(None, Some(neck), sc.shared)
        .with_clients(sc.players);
    rc.max_routes = sc.players + 4;
    // The schedule's clock starts here; the players connect within its first moments.
    let relay = Relay::start(rc)?;
    let relay_start_ns = monotonic_ns();
    let spec = PlayersSpec {
        target: relay.addr().to_string(),
        server: server_addr.to_string(),
        players: sc.players,
        profile: arm.profile().into(),
        backend: args.backend.clone(),
        snapshot_channel: SNAPSHOT_CHANNEL,
        event_channel: EVENT_CHANNEL,
    };
    let players = PlayersProcess::start(&spec)?;
    counts.sending.store(true, Ordering::Relaxed);
    let end = Instant::now() + Duration::from_secs_f64(sc.seconds)
        - Duration::from_nanos(monotonic_ns().saturating_sub(relay_start_ns));
    std::thread::sleep(end.saturating_duration_since(Instant::now()));
    counts.sending.store(false, Ordering::Relaxed);
    std::thread::sleep(DRAIN);
    let report = players.finish()?;
    let relay_counters = relay.shutdown()?;
    server.shutdown().map_err(|e| anyhow!("server: {e}"))?;

    let bottleneck = match relay_counters.shared_down {
        Some(b) => b,
        None => {
            let mut b = BottleneckCounters::default();
            for r in &relay_counters.routes {
                if let Some(o) = &r.down.bottleneck {
                    b.merge(o);
                }
            }
            b
        }
    };
    let events = latencies_us(&report.events, |_| true);
    let after_step = sc.step.map(|(at, window)| {
        let from = relay_start_ns + at.as_nanos() as u64;
        let to = from + window.as_nanos() as u64;
        latencies_us(&report.events, |a| (from..to).contains(&a.sent_ns))
    });
    let snaps = latencies_us(&report.snapshots, |_| true);
    let mut per_player = vec![0u64; sc.players];
    for a in &report.snapshots {
        if let Some(n) = per_player.get_mut(a.player as usize) {
            *n += 1;
        }
    }
    let (lo, hi) = (
        per_player.iter().copied().min().unwrap_or(0),
        per_player.iter().copied().max().unwrap_or(0),
    );
    let mut distinct: Vec<(u32, u64)> = report.events.iter().map(|a| (a.player, a.seq)).collect();
    distinct.sort_unstable();
    distinct.dedup();
    let events_sent = counts.events.load(Ordering::Relaxed);
    let estimates = counts
        .estimates
        .lock()
        .map(|e| e.clone())
        .unwrap_or_default();
    let (estimate, error_max, error_p50) =
        judge_estimates(sc, &schedule, relay_start_ns, &estimates);
    let series = Series::build(&Observed {
        start_ns: relay_start_ns,
        sending: Duration::from_secs_f64(sc.seconds),
        drain: DRAIN,
        events: &report.events,
        snapshots: &report.snapshots,
        queue: relay_counters.down_queue_series.as_ref(),
        estimates: &estimates,
    });
    if report.malformed > 0 || report.disconnected > 0 {
        bail!(
            "{}: {} malformed messages, {} players disconnected",
            sc.name,
            report.malformed,
            report.disconnected
        );
    }
    Ok(ArmRun {
        arm,
        event_p50_us: percentile(events.clone(), 0.5),
        event_p99_us: percentile(events, 0.99),
        event_p99_after_step_us: after_step.and_then(|v| percentile(v, 0.99)),
        snapshot_age_p50_us: percentile(snaps.clone(), 0.5),
        snapshot_age_p99_us: percentile(snaps, 0.99),
        relay_queue_p50_us: bottleneck.sojourn_p50_us,
        relay_queue_p99_us: bottleneck.sojourn_p99_us,
        relay_dropped: bottleneck.dropped,
        snapshots_sent: counts.snapshots.load(Ordering::Relaxed),
        snapshots_delivered: report.snapshots.len() as u64,
        fair_share_min_over_max: (hi > 0).then(|| lo as f64 / hi as f64),
        snapshots_per_player: per_player,
        events_sent,
        reliable_lost: events_sent.saturating_sub(distinct.len() as u64),
        send_refused: counts.refused.load(Ordering::Relaxed),
        snapshots_replaced: counts.replaced.load(Ordering::Relaxed),
        snapshots_shed: counts.shed.load(Ordering::Relaxed),
        rate_estimate_bps: estimate.map(|b| b * 8.0),
        rate_estimate_error_pct: error_max,
        rate_estimate_error_p50_pct: error_p50,
        bottleneck,
        series,
    })
}

/// Runs `bench lanes`.
pub fn run(args: &LanesArgs, global: &Global) -> Result<bool> {
    let at = UtcTime::now();
    let arms = args
        .arms
        .iter()
        .map(|a| Arm::parse(a))
        .collect::<Result<Vec<_>>>()?;
    if arms.is_empty() {
        bail!("--arms needs at least one arm");
    }
    let scenarios: Vec<&Scenario> = if args.scenario.is_empty() {
        SCENARIOS.iter().collect()
    } else {
        args.scenario
            .iter()
            .map(|n| {
                SCENARIOS.iter().find(|s| s.name == n).ok_or_else(|| {
                    anyhow!("unknown scenario {n:?} (downlink-1mbit, step-4-to-1, uplink-shared)")
                })
            })
            .collect::<Result<_>>()?
    };
    let mut results = Vec::new();
    for sc in scenarios {
        let mut runs = Vec::new();
        for rep in 0..args.runs.max(1) {
            // Arms alternate, and the first arm of each repetition alternates too.
            let mut order = arms.clone();
            if rep % 2 == 1 {
                order.reverse();
            }
            for &arm in &order {
                let r = run_once(sc, arm, args)
                    .with_context(|| format!("scenario {} arm {}", sc.name, arm.name()))?;
                println!(
                    "{:<15} {:<8} event p99 {:>9} µs | snapshot age p99 {:>9} µs | relay queue p50 {:>6} µs, drops {:>4} | snapshots {}/{} | events lost {} of {}",
                    sc.name,
                    arm.name(),
                    fmt(r.event_p99_us),
                    fmt(r.snapshot_age_p99_us),
                    r.relay_queue_p50_us,
                    r.relay_dropped,
                    r.snapshots_delivered,
                    r.snapshots_sent,
                    r.reliable_lost,
                    r.events_sent
                );
                if let (Some(e), Some(err)) = (r.rate_estimate_bps, r.rate_estimate_error_pct) {
                    println!(
                        "{:<15} {:<8} rate estimate {:.3} Mbit/s (median), error max {err:.1} %, median {:.1} %",
                        "",
                        "",
                        e / 1e6,
                        r.rate_estimate_error_p50_pct.unwrap_or(f64::NAN)
                    );
                }
                if let Some(p) = r.event_p99_after_step_us {
                    println!(
                        "{:<15} {:<8} event p99 in the second after the step {p:.0} µs",
                        "", ""
                    );
                }
                runs.push(r);
            }
        }
        results.push(summarize(sc, runs));
    }
    let file = LanesFile {
        kind: "lanes",
        at: at.iso(),
        command: command_line(),
        host: HostInfo::collect(),
        build: BuildInfo::collect(),
        snapshot_bytes: args.snapshot_bytes,
        event_bytes: args.event_bytes,
        tick_hz: TICK_HZ,
        events_hz: u64::from(TICK_HZ) / EVENTS_EVERY,
        scenarios: results,
    };
    let path = global.path_for("lanes", &at);
    crate::output::write_json(&file, &path)?;
    println!("results: {}", path.display());
    Ok(true)
}

fn fmt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0}"))
}

/// The estimate samples of the judged window (module docs of `rate_estimate_error_pct`):
/// their median (bytes/s), the largest and the median error against the expected rate, percent.
fn judge_estimates(
    sc: &Scenario,
    schedule: &RateSchedule,
    relay_start_ns: u64,
    samples: &[(u64, u64)],
) -> (Option<f64>, Option<f64>, Option<f64>) {
    let from = match sc.step {
        Some((at, _)) => at + Duration::from_secs(1),
        None => Duration::from_secs(2),
    };
    let shares = if sc.shared { sc.players.max(1) } else { 1 } as f64;
    let mut values = Vec::new();
    let mut errors = Vec::new();
    for &(at, est) in samples {
        let t = Duration::from_nanos(at.saturating_sub(relay_start_ns));
        if t < from || t.as_secs_f64() > sc.seconds {
            continue;
        }
        let expected = schedule.rate_at(t) as f64 / shares;
        values.push(est as f64);
        errors.push((est as f64 - expected).abs() / expected * 100.0);
    }
    (
        median(values),
        percentile(errors.clone(), 1.0),
        median(errors),
    )
}

fn summarize(sc: &Scenario, runs: Vec<ArmRun>) -> ScenarioResult {
    // The arm under test: lanes when the run has it, else the first that is not the
    // baseline, else the baseline.
    let measured = if runs.iter().any(|r| r.arm == Arm::Lanes) {
        Arm::Lanes
    } else {
        runs.iter()
            .map(|r| r.arm)
            .find(|&a| a != Arm::Baseline)
            .unwrap_or(Arm::Baseline)
    };
    let of = |arm: Arm, f: &dyn Fn(&ArmRun) -> Option<f64>| {
        median(runs.iter().filter(|r| r.arm == arm).filter_map(f).collect())
    };
    ScenarioResult {
        scenario: sc.name.into(),
        measured_arm: measured.name().into(),
        event_p99_us: of(measured, &|r| r.event_p99_us),
        baseline_event_p99_us: of(Arm::Baseline, &|r| r.event_p99_us),
        snapshot_age_p99_us: of(measured, &|r| r.snapshot_age_p99_us),
        relay_queue_p50_us: of(measured, &|r| Some(r.relay_queue_p50_us as f64)),
        rate_estimate_error_pct: of(measured, &|r| r.rate_estimate_error_pct),
        reliable_lost: runs
            .iter()
            .filter(|r| r.arm == measured)
            .map(|r| r.reliable_lost)
            .sum(),
        snapshots_delivered: of(measured, &|r| Some(r.snapshots_delivered as f64)),
        players: sc.players,
        rate: sc.rate.into(),
        shared_bottleneck: sc.shared,
        buffer_ms: BUFFER.as_millis() as u64,
        one_way_delay_ms: ONE_WAY.as_millis() as u64,
        seconds: sc.seconds,
        runs,
    }
}
