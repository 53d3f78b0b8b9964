//! `bench game`: N players on a ticking game server (see [`crate::scale::game`]).

use std::fmt::Write as _;

use anyhow::{bail, Result};
use clap::Args;

use super::Global;
use crate::host::{HostInfo, UtcTime};
use crate::output::{host_line, render_table, result_file, thousands, write_result};
use crate::scale::load_process::run_game as run_one;
use crate::schema::{GameConfig, GameRun, LoadStats};
use crate::stats::median;

/// Flags of `bench game`.
#[derive(Debug, Clone, Args)]
pub struct GameArgs {
    /// Player counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "100,1000,5000")]
    pub players: Vec<usize>,
    /// Paths: direct, or through the impairment relay under a named profile (e.g. random);
    /// comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "direct,random")]
    pub paths: Vec<String>,
    /// Server tick (and input) rate, Hz.
    #[arg(long, default_value_t = 60.0)]
    pub tick_hz: f64,
    /// Snapshot size, bytes (16 to 1,000 in the workload).
    #[arg(long, default_value_t = 200)]
    pub snapshot_bytes: usize,
    /// Input size, bytes.
    #[arg(long, default_value_t = 32)]
    pub input_bytes: usize,
    /// Players per loopback address (127.0.0.1, 127.0.0.2, ... on Linux).
    #[arg(long, default_value_t = 1000)]
    pub players_per_ip: usize,
    /// Server workers.
    #[arg(long, default_value_t = 2)]
    pub io_threads: usize,
    /// Server workers' idle strategy: tick (sleep until the tick, then read every input that
    /// came meanwhile in one batch: what a game server on its tick does), or balanced, park or
    /// spin (which read each datagram as it arrives).
    #[arg(long, default_value = "tick", value_parser = ["tick", "balanced", "park", "spin"])]
    pub server_idle: String,
    /// Server workers' core pinning: auto (pinned only when the machine has more cores than
    /// workers), always or never.
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    pub server_pinning: String,
    /// Scheduler time slice the server workers ask for, in µs (Linux 6.12+); 0 asks for none
    /// (the scheduler's default slice). Default: the runtime's.
    #[arg(long)]
    pub server_slice_us: Option<u64>,
    /// Server sessions hold the ACK of a player's input until the next tick, where it rides
    /// the snapshot (`max_ack_delay` = one tick + 1 ms, `ack_frequency` 8) instead of leaving
    /// in a datagram of its own: one datagram each way per player per tick.
    #[arg(long)]
    pub acks_on_tick: bool,
    /// Datagram backend of server and clients.
    #[arg(long, default_value = "auto", value_parser = ["auto", "uring", "mmsg"])]
    pub backend: String,
    /// Protocol profile of both sides.
    #[arg(long, default_value = "game", value_parser = ["default", "game", "bulk"])]
    pub profile: String,
    /// secure: connect tokens and every packet protected (the production path); insecure: no
    /// token, no protection (LAN play).
    #[arg(long, default_value = "secure", value_parser = ["secure", "insecure"])]
    pub security: String,
    /// Warm-up seconds.
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
    /// Measured seconds.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Runs per case (a fresh server each); the table shows the median.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Seed of the relay's impairment streams.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// What carries the traffic, comma-separated; with both, each round runs one after the
    /// other. ricochet: the library. kernel (Linux, direct path only): the kernel floor, the
    /// same players, sockets and tick with no protocol (a plain server thread per worker
    /// that sleeps until its tick, reads the inputs with recvmmsg and sends each player's
    /// snapshot with sendmmsg; players on one thread with a send per input and a recv per
    /// snapshot): the server CPU this machine's kernel costs for the game's datagrams. The
    /// floor ignores --server-idle, --server-pinning (never pinned), --backend, --profile,
    /// --security and --acks-on-tick.
    #[arg(long, value_delimiter = ',', default_value = "ricochet", value_parser = ["ricochet", "kernel"])]
    pub stack: Vec<String>,
    /// Threads of the load generator: the players are split into this many contiguous shards,
    /// a client set (or, for the kernel floor, a readiness set) per thread. A run whose busiest
    /// load thread was busy over 90 % of the time, or whose inputs left late, is marked
    /// saturated: it measured the client too.
    #[arg(long, default_value_t = 1)]
    pub load_threads: usize,
}

/// The table's name for what carried a run's traffic.
fn stack_name(c: &GameConfig) -> &'static str {
    if c.is_floor() {
        "kernel"
    } else {
        "ricochet"
    }
}

/// The table: one row per (players, path), medians over its rounds.
pub fn game_table(runs: &[GameRun]) -> String {
    let header = [
        "players",
        "path",
        "stack",
        "rounds",
        "ticks/s",
        "late",
        "skipped",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms",
        "lost snap",
        "stale",
        "reliable lost",
        "server CPU %",
        "µs/tick",
        "µs/player-tick",
        "load CPU %",
        "load sat.",
        "RSS B/session",
        "ok",
    ];
    let mut keys: Vec<(usize, Option<String>, &str)> = Vec::new();
    for r in runs {
        let k = (
            r.config.players,
            r.config.relay_profile.clone(),
            stack_name(&r.config),
        );
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let rows: Vec<Vec<String>> = keys
        .iter()
        .map(|(n, path, stack)| {
            let rs: Vec<&GameRun> = runs
                .iter()
                .filter(|r| {
                    r.config.players == *n
                        && &r.config.relay_profile == path
                        && stack_name(&r.config) == *stack
                })
                .collect();
            let m = |f: &dyn Fn(&GameRun) -> Option<f64>| {
                median(&rs.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
            };
            let ms = |x: Option<f64>| x.map_or("-".into(), |v| format!("{:.2}", v / 1000.0));
            let int =
                |x: Option<f64>| x.map_or("-".into(), |v| thousands(v.max(0.0).round() as u64));
            vec![
                thousands(*n as u64),
                path.clone()
                    .map_or("direct".into(), |p| format!("relay {p}")),
                stack.to_string(),
                rs.len().to_string(),
                m(&|r| Some(r.ticks_per_s)).map_or("-".into(), |v| format!("{v:.1}")),
                int(m(&|r| Some(r.ticks_late as f64))),
                int(m(&|r| Some(r.ticks_skipped as f64))),
                ms(m(&|r| r.snapshot_latency_us.map(|l| l.p50))),
                ms(m(&|r| r.snapshot_latency_us.map(|l| l.p99))),
                ms(m(&|r| r.snapshot_latency_us.map(|l| l.p999))),
                ms(m(&|r| r.snapshot_latency_us.map(|l| l.max))),
                int(m(&|r| Some(r.snapshots_lost as f64))),
                int(m(&|r| Some(r.snapshots_stale as f64))),
                int(m(&|r| Some(r.inputs_lost as f64))),
                m(&|r| Some(r.server_cpu_percent)).map_or("-".into(), |v| format!("{v:.1}")),
                m(&|r| Some(r.server_cpu_us_per_tick)).map_or("-".into(), |v| format!("{v:.0}")),
                m(&|r| r.server_cpu_us_per_player_tick).map_or("-".into(), |v| format!("{v:.2}")),
                m(&|r| r.load.as_ref().map(|l| l.cpu_percent))
                    .map_or("-".into(), |v| format!("{v:.0}")),
                saturated(&rs),
                int(m(&|r| r.server_rss_per_session_bytes)),
                if rs.iter().all(|r| r.ok) {
                    "yes".into()
                } else {
                    "NO".into()
                },
            ]
        })
        .collect();
    let mut out = render_table(&header, &rows);
    for r in runs {
        if let Some(l) = r.load.as_ref().filter(|l| l.saturated) {
            let _ = writeln!(
                out,
                "  {} players {}: load generator saturated (busiest thread {:.0} % of wall, {} \
                 inputs over half a period late, up to {:.1} ms): the figures measure the client \
                 too{}",
                r.config.players,
                stack_name(&r.config),
                l.busy_max_percent,
                l.inputs_late,
                l.input_lateness_max_us / 1000.0,
                if l.busy_max_percent <= LoadStats::BUSY_LIMIT_PERCENT {
                    " (its threads were not busy: late because the host did not run them)"
                } else {
                    ""
                }
            );
        }
    }
    for r in runs.iter().filter(|r| !r.ok) {
        for e in &r.errors {
            let _ = writeln!(out, "  {} players: {e}", r.config.players);
        }
    }
    out
}

/// The table's cell for whether a row's load generator kept up: `no`, `SAT` (every round
/// saturated), `k/n` (k of n rounds), `-` (not recorded).
fn saturated(rs: &[&GameRun]) -> String {
    let known: Vec<bool> = rs
        .iter()
        .filter_map(|r| r.load.as_ref().map(|l| l.saturated))
        .collect();
    let sat = known.iter().filter(|&&s| s).count();
    match (known.len(), sat) {
        (0, _) => "-".into(),
        (_, 0) => "no".into(),
        (n, s) if s == n => "SAT".into(),
        (n, s) => format!("{s}/{n}"),
    }
}

/// `bench game`.
pub fn run(args: &GameArgs, global: &Global) -> Result<bool> {
    if args.players.is_empty() || args.paths.is_empty() || args.rounds == 0 || args.stack.is_empty()
    {
        bail!("--players, --paths, --rounds and --stack need at least one");
    }
    if args.stack.iter().any(|s| s == "kernel") {
        if !cfg!(target_os = "linux") {
            bail!("--stack kernel is Linux only (recvmmsg, sendmmsg, epoll)");
        }
        if args.paths.iter().any(|p| p != "direct") {
            bail!("--stack kernel runs on the direct path only (--paths direct)");
        }
    }
    let started = UtcTime::now();
    let host = HostInfo::collect();
    eprintln!("{}", host_line(&host));
    let mut runs = Vec::new();
    for path in &args.paths {
        let relay_profile = (path != "direct").then(|| path.clone());
        for &n in &args.players {
            for (round, stack) in
                (0..args.rounds).flat_map(|round| args.stack.iter().map(move |s| (round, s)))
            {
                let cfg = GameConfig {
                    players: n,
                    tick_hz: args.tick_hz,
                    snapshot_bytes: args.snapshot_bytes,
                    input_bytes: args.input_bytes,
                    relay_profile: relay_profile.clone(),
                    seed: args.seed + round as u64,
                    players_per_ip: args.players_per_ip,
                    io_threads: args.io_threads,
                    server_idle: args.server_idle.clone(),
                    server_pinning: Some(args.server_pinning.clone()),
                    server_slice_us: args.server_slice_us,
                    acks_on_tick: args.acks_on_tick,
                    backend: args.backend.clone(),
                    profile: args.profile.clone(),
                    security: args.security.clone(),
                    warmup_s: args.warmup,
                    seconds: args.seconds,
                    stack: (stack != "ricochet").then(|| stack.clone()),
                    load_threads: args.load_threads.max(1),
                };
                let r = run_one(&cfg)?;
                eprintln!(
                    "  {n} players {path} {stack}, round {}: {:.1} ticks/s, p99 {:.2} ms, lost {} stale {} reliable lost {}, server CPU {:.1}% ({:.2} µs/player-tick, {} allocations/player-tick), load {}{}",
                    round + 1,
                    r.ticks_per_s,
                    r.snapshot_latency_us.map_or(0.0, |l| l.p99 / 1000.0),
                    r.snapshots_lost,
                    r.snapshots_stale,
                    r.inputs_lost,
                    r.server_cpu_percent,
                    r.server_cpu_us_per_player_tick.unwrap_or(0.0),
                    r.server_allocs_per_player_tick
                        .map_or("-".into(), |a| format!("{a:.3}")),
                    r.load.as_ref().map_or("-".into(), crate::scale::describe_load),
                    if r.ok { "" } else { " (NOT ok)" }
                );
                runs.push(r);
            }
        }
    }
    print!("{}", game_table(&runs));
    let mut file = result_file("game", &started, host, Vec::new());
    file.ok = runs.iter().all(|r| r.ok);
    file.game_runs = runs;
    let ok = file.ok;
    write_result(&file, &global.path_for("game", &started))?;
    Ok(ok)
}
