//! `bench rudp`: the RUDP complete-message echo, through the impairment relay or direct.

use std::fmt::Write as _;
use std::str::FromStr;

use anyhow::{bail, Result};
use clap::Args;

use super::Global;
use crate::host::UtcTime;
use crate::output::{render_table, result_file, thousands, write_result};
use crate::relay::ImpairmentArgs;
use crate::rudp::run::{
    default_client_placement, default_client_threads, default_drain, set_impairment, validate,
    CLIENTS_PROCESSES, DEFAULT_CLIENTS_PROCESS, DEFAULT_SERVER_IDLE, DEFAULT_SERVER_SLICE_US,
};
use crate::rudp::{label, run_case, run_round, summarize, FecPolicy};
use crate::schema::{RudpCase, RudpConfig, RudpRun, Spread};

/// Flags of `bench rudp` (the reference benchmark's flags).
#[derive(Debug, Clone, Args)]
pub struct RudpArgs {
    /// Message size in bytes (at least the 32-byte header; up to 1 MiB).
    #[arg(long, default_value_t = 1024)]
    pub payload: usize,
    /// Clients, each with its own connection (and socket).
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Threads the clients are spread over (round-robin); a thread with several clients waits
    /// on all of them at once. Default: one per client.
    #[arg(long)]
    pub client_threads: Option<usize>,
    /// Server workers' idle strategy: balanced (spin 50 µs after work, then block), park
    /// (block at once) or spin.
    #[arg(long, default_value = DEFAULT_SERVER_IDLE, value_parser = ["balanced", "park", "spin"])]
    pub server_idle: String,
    /// Scheduler time slice the server workers ask for, in µs (Linux 6.12+; the kernel clamps
    /// it to 100..100,000); 0 asks for none (the scheduler's default slice).
    #[arg(long, default_value_t = DEFAULT_SERVER_SLICE_US)]
    pub server_slice_us: u64,
    /// Server workers' core pinning: auto (pinned only when the machine has more cores than
    /// workers), always or never.
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    pub server_pinning: String,
    /// Where the client threads run: with-worker (each pinned to the core of the server
    /// worker serving its first client) or os (the scheduler decides). Default: with-worker
    /// for --direct with the clients in process, else os.
    #[arg(long, value_parser = ["with-worker", "os"])]
    pub client_placement: Option<String>,
    /// Where the clients run: in-process (threads of this process, beside the server) or
    /// separate (a child process of this binary, as an outside load generator; its threads
    /// are never pinned, so the placement is os).
    #[arg(long, default_value = DEFAULT_CLIENTS_PROCESS, value_parser = CLIENTS_PROCESSES)]
    pub clients_process: String,
    /// Messages in flight per client.
    #[arg(long, default_value_t = 16)]
    pub window: usize,
    /// Server IO model: per-core or shared.
    #[arg(long, default_value = "per-core", value_parser = ["per-core", "shared"])]
    pub io_model: String,
    /// Server workers.
    #[arg(long, default_value_t = 2)]
    pub io_threads: usize,
    /// Datagram backend of server and clients: auto, uring or mmsg.
    #[arg(long, default_value = "auto", value_parser = ["auto", "uring", "mmsg"])]
    pub backend: String,
    /// FEC policy: off (ARQ only), fixed or adaptive.
    #[arg(long, default_value = "off", value_parser = ["off", "fixed", "adaptive"])]
    pub fec: String,
    /// Protocol profile: game, default or bulk (`competitive`, the game profile's old name,
    /// is still accepted).
    #[arg(long, default_value = "game", value_parser = ["game", "default", "bulk", "competitive"])]
    pub protocol: String,
    /// Network condition (profile and overrides), applied to both directions of every route.
    #[command(flatten)]
    pub impairment: ImpairmentArgs,
    /// No relay: clients talk to the server directly (no impairment).
    #[arg(long)]
    pub direct: bool,
    /// Measured seconds per round (the drain follows).
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Warm-up seconds per round.
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
    /// Longest drain after the measured phase, seconds (default: 2 × seconds, 5..30).
    #[arg(long)]
    pub drain: Option<f64>,
    /// Rounds, with seeds seed, seed+1, ...; the table shows the median and min–max.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Seed of the first round (relay streams, connection ids).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Security: secure (clients admitted by connect token, minted in place as a game's backend
    /// would; every packet sealed with the token's keys), insecure (no tokens, no protection),
    /// or both: each round runs secure and then insecure, and the table ends with their ratios
    /// (the cost of security, measured side by side).
    #[arg(long, default_value = "secure", value_parser = ["secure", "insecure", "both"])]
    pub security: String,
    /// Shorthand for --security insecure.
    #[arg(long, conflicts_with = "security")]
    pub insecure: bool,
    /// Congestion controller: the protocol profile's own, `newreno`, `delay`, or `both`
    /// (NewReno and Delay rounds alternated, as two cases).
    #[arg(long, default_value = "profile", value_parser = ["profile", "newreno", "delay", "both"])]
    pub cc: String,
}

impl RudpArgs {
    /// The round configuration these flags describe (seed of the first round).
    pub fn config(&self) -> Result<RudpConfig> {
        let mut cfg = RudpConfig {
            payload: self.payload,
            clients: self.clients,
            window: self.window,
            io_model: self.io_model.clone(),
            io_threads: self.io_threads,
            backend: self.backend.clone(),
            fec: self.fec.clone(),
            protocol: self.protocol.clone(),
            profile: self.impairment.profile.name().into(),
            loss_percent: 0.0,
            burst: None,
            delay_ms: 0.0,
            duplicate_percent: 0.0,
            reorder_percent: 0.0,
            reorder_delay_ms: 0.0,
            direct: self.direct,
            warmup_s: self.warmup,
            seconds: self.seconds,
            drain_s: self.drain.unwrap_or_else(|| default_drain(self.seconds)),
            seed: self.seed,
            client_threads: Some(
                self.client_threads
                    .unwrap_or_else(|| default_client_threads(self.clients)),
            ),
            server_idle: Some(self.server_idle.clone()),
            server_slice_us: Some(self.server_slice_us),
            server_pinning: Some(self.server_pinning.clone()),
            client_placement: Some(self.client_placement.clone().unwrap_or_else(|| {
                let separate = self.clients_process == "separate";
                default_client_placement(self.direct, separate).into()
            })),
            clients_process: Some(self.clients_process.clone()),
            security: Some(
                if self.insecure || self.security == "insecure" {
                    "insecure"
                } else {
                    "secure"
                }
                .into(),
            ),
            congestion_controller: match self.cc.as_str() {
                "newreno" | "delay" => Some(self.cc.clone()),
                _ => None,
            },
        };
        set_impairment(&mut cfg, &self.impairment.impairment()?);
        Ok(cfg)
    }

    /// Whether to run both security modes side by side.
    pub fn both_security_modes(&self) -> bool {
        !self.insecure && self.security == "both"
    }

    /// Whether to run both congestion controllers side by side.
    pub fn both_controllers(&self) -> bool {
        self.cc == "both"
    }
}

fn cell(s: Option<Spread>, f: impl Fn(f64) -> String, range: bool) -> String {
    match s {
        None => "-".into(),
        Some(s) if range && s.min != s.max => {
            format!("{} [{}–{}]", f(s.median), f(s.min), f(s.max))
        }
        Some(s) => f(s.median),
    }
}

fn ms(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{:.1}", us / 1000.0)
    } else {
        format!("{:.2}", us / 1000.0)
    }
}

/// The RUDP table: one row per case, medians with [min–max] where rounds differ.
pub fn rudp_table(cases: &[RudpCase]) -> String {
    let header = [
        "case",
        "B × window",
        "rounds",
        "rt/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms",
        "CPU %",
        "CPU µs/rt",
        "wire %",
        "retx/1k",
        "rec/1k",
        "loss %",
        "relay KiB",
        "ok",
    ];
    let rows: Vec<Vec<String>> = cases
        .iter()
        .map(|c| {
            let s = &c.summary;
            let cfg = c.rounds.first().map(|r| &r.config);
            vec![
                c.label.clone(),
                cfg.map_or("-".into(), |c| {
                    format!("{} × {}", thousands(c.payload as u64), c.window)
                }),
                c.rounds.len().to_string(),
                cell(s.round_trips_per_s, |v| thousands(v.round() as u64), true),
                cell(s.p50_us, ms, false),
                cell(s.p99_us, ms, true),
                cell(s.p999_us, ms, false),
                cell(s.max_us, ms, false),
                cell(s.cpu_percent, |v| format!("{v:.0}"), false),
                cell(s.cpu_us_per_round_trip, |v| format!("{v:.1}"), false),
                cell(s.wire_overhead_percent, |v| format!("{v:.1}"), false),
                cell(s.retransmitted_per_1000, |v| format!("{v:.1}"), false),
                cell(s.recovered_per_1000, |v| format!("{v:.1}"), false),
                cell(s.realized_loss_percent, |v| format!("{v:.2}"), false),
                cell(s.relay_peaks_kib, |v| format!("{v:.1}"), false),
                if c.ok { "yes".into() } else { "NO".into() },
            ]
        })
        .collect();
    let mut out = render_table(&header, &rows);
    for c in cases.iter().filter(|c| !c.ok) {
        for (i, r) in c.rounds.iter().enumerate() {
            for e in &r.errors {
                let _ = writeln!(
                    out,
                    "  {} (round {}, seed {}): {e}",
                    c.label,
                    i + 1,
                    r.config.seed
                );
            }
        }
    }
    out
}

/// Two variants of `base` run in interleaved rounds (A, B, A, B, ...: the same seeds, and the
/// machine's drift spread over both), as two cases of set `set`. `vary` makes variant `k`
/// (0 or 1) of a round's config.
fn interleaved(
    base: &RudpConfig,
    rounds: usize,
    set: &str,
    vary: impl Fn(RudpConfig, usize) -> RudpConfig,
    mut report: impl FnMut(&RudpRun),
) -> Vec<RudpCase> {
    let mut runs: [Vec<RudpRun>; 2] = [Vec::new(), Vec::new()];
    for i in 0..rounds.max(1) {
        for (k, variant) in runs.iter_mut().enumerate() {
            let round = RudpConfig {
                seed: base.seed.wrapping_add(i as u64),
                ..base.clone()
            };
            let r = run_round(&vary(round, k));
            report(&r);
            variant.push(r);
        }
    }
    runs.into_iter()
        .map(|runs| {
            let label = runs
                .first()
                .map_or_else(|| label(base), |r| label(&r.config));
            RudpCase {
                label,
                set: Some(set.into()),
                ok: runs.iter().all(|r| r.ok),
                summary: summarize(&runs),
                rounds: runs,
            }
        })
        .collect()
}

/// Secure and insecure rounds interleaved, as two cases.
fn side_by_side(base: &RudpConfig, rounds: usize, report: impl FnMut(&RudpRun)) -> Vec<RudpCase> {
    let modes = ["secure", "insecure"];
    let vary = |cfg: RudpConfig, k: usize| RudpConfig {
        security: Some(modes[k].into()),
        ..cfg
    };
    interleaved(base, rounds, "security", vary, report)
}

/// NewReno and Delay rounds interleaved, as two cases.
fn controllers_side_by_side(
    base: &RudpConfig,
    rounds: usize,
    report: impl FnMut(&RudpRun),
) -> Vec<RudpCase> {
    let controllers = ["newreno", "delay"];
    let vary = |cfg: RudpConfig, k: usize| RudpConfig {
        congestion_controller: Some(controllers[k].into()),
        ..cfg
    };
    interleaved(base, rounds, "congestion", vary, report)
}

/// Delay over NewReno: round trips per second and p99 RTT (medians over the rounds).
pub fn controller_ratios(newreno: &RudpCase, delay: &RudpCase) -> String {
    let ratio = |a: Option<Spread>, b: Option<Spread>| match (a, b) {
        (Some(a), Some(b)) if b.median > 0.0 => format!("{:.3}", a.median / b.median),
        _ => "-".into(),
    };
    format!(
        "delay / newreno: round trips per second × {}, p99 RTT × {}\n",
        ratio(
            delay.summary.round_trips_per_s,
            newreno.summary.round_trips_per_s
        ),
        ratio(delay.summary.p99_us, newreno.summary.p99_us),
    )
}

/// The cost of packet protection: secure over insecure, CPU per round trip and round trips
/// per second (medians over the rounds).
pub fn security_ratios(secure: &RudpCase, insecure: &RudpCase) -> String {
    let ratio = |a: Option<Spread>, b: Option<Spread>| match (a, b) {
        (Some(a), Some(b)) if b.median > 0.0 => format!("{:.3}", a.median / b.median),
        _ => "-".into(),
    };
    format!(
        "secure / insecure: CPU µs per round trip × {}, round trips per second × {}\n",
        ratio(
            secure.summary.cpu_us_per_round_trip,
            insecure.summary.cpu_us_per_round_trip
        ),
        ratio(
            secure.summary.round_trips_per_s,
            insecure.summary.round_trips_per_s
        ),
    )
}

/// `bench rudp`.
pub fn run(args: &RudpArgs, global: &Global) -> Result<bool> {
    FecPolicy::from_str(&args.fec)?.available()?;
    let cfg = args.config()?;
    validate(&cfg)?;
    let started = UtcTime::now();
    let l = label(&cfg);
    eprintln!(
        "running {l}: {} B, {} clients × window {}, {} round(s) of {} s + {} s warm-up ...",
        cfg.payload, cfg.clients, cfg.window, args.rounds, cfg.seconds, cfg.warmup_s
    );
    let report = |r: &RudpRun| {
        let cc = r
            .config
            .congestion_controller
            .as_deref()
            .map_or(String::new(), |c| format!(" {c}"));
        eprintln!(
            "  seed {}{}{cc}: {} rt/s, max RTT {}{}{}",
            r.config.seed,
            if r.config.is_secure() {
                ""
            } else {
                " insecure"
            },
            thousands(r.round_trips_per_s.round() as u64),
            r.rtt_us.map_or("-".into(), |l| format!("{} ms", ms(l.max))),
            r.host_cpu.map_or(String::new(), |h| format!(
                " (other processes {:.0}% CPU, steal {:.1}%)",
                h.other_percent, h.steal_percent
            )),
            if r.ok { "" } else { " (NOT ok)" }
        )
    };
    if args.both_controllers() && args.both_security_modes() {
        bail!("--cc both and --security both: choose one side-by-side comparison");
    }
    let cases = if args.both_security_modes() {
        side_by_side(&cfg, args.rounds, report)
    } else if args.both_controllers() {
        controllers_side_by_side(&cfg, args.rounds, report)
    } else {
        vec![run_case(&l, None, &cfg, args.rounds, report)]
    };
    print!("{}", rudp_table(&cases));
    match &cases[..] {
        [secure, insecure] if args.both_security_modes() => {
            print!("{}", security_ratios(secure, insecure));
        }
        [newreno, delay] if args.both_controllers() => {
            print!("{}", controller_ratios(newreno, delay));
        }
        _ => {}
    }
    let mut file = result_file(
        "rudp",
        &started,
        crate::host::HostInfo::collect(),
        Vec::new(),
    );
    file.ok = cases.iter().all(|c| c.ok);
    file.rudp_cases = cases;
    let ok = file.ok;
    write_result(&file, &global.path_for("rudp", &started))?;
    Ok(ok)
}
