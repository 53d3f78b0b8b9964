//! `bench gate`: the CI regression gate (see [`crate::gate`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use clap::Args;

use super::Global;
use crate::gate::{
    baseline_path, compare_ratios, compare_sim, compare_tails, failure_lines, os_name,
    verdict_table, write_json, Baseline, BaselineSim, GateConfig, GateResult, Status, Verdict,
    GATE_SCHEMA_VERSION, SLOWDOWN_ENV,
};
use crate::host::{command_line, BuildInfo, HostInfo, UtcTime};
use crate::output::default_results_root;

/// Flags of `bench gate`.
#[derive(Debug, Clone, Args)]
pub struct GateArgs {
    /// Suite and thresholds (default: `ci/gate.json` of the source tree).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Baseline to compare with (default: `results/baseline/gate-<os>.json`).
    #[arg(long, value_name = "PATH")]
    pub baseline: Option<PathBuf>,
    /// Accept this run as the new baseline (say why in the commit message).
    #[arg(long)]
    pub update_baseline: bool,
    /// Which parts to run.
    #[arg(long, default_value = "all", value_parser = ["all", "sim", "ratios"])]
    pub only: String,
}

fn source_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Whether `perf` can count user-space instructions here; `Err(reason)` otherwise.
fn perf_instructions() -> Result<(), String> {
    let out = Command::new("perf")
        .args(["stat", "-x,", "-e", "instructions:u", "true"])
        .output()
        .map_err(|e| format!("perf not runnable: {e}"))?;
    let text = String::from_utf8_lossy(&out.stderr);
    let first = text
        .lines()
        .find(|l| l.contains("instructions"))
        .unwrap_or("");
    match first.split(',').next() {
        Some(n) if n.trim().parse::<u64>().is_ok() => Ok(()),
        Some(n) if !n.is_empty() => Err(format!("perf: instructions {}", n.trim())),
        _ => Err("perf printed no instruction count".into()),
    }
}

/// `bench gate`.
pub fn run(args: &GateArgs, global: &Global) -> Result<bool> {
    let started = UtcTime::now();
    let config_path = args
        .config
        .clone()
        .unwrap_or_else(|| source_root().join("ci").join("gate.json"));
    let cfg = GateConfig::load(&config_path)?;
    let results_root = global
        .results_dir
        .clone()
        .unwrap_or_else(default_results_root);
    let base_path = args
        .baseline
        .clone()
        .unwrap_or_else(|| baseline_path(&results_root));
    let baseline = if base_path.exists() {
        Some(Baseline::load(&base_path)?)
    } else {
        None
    };
    let slowdown_ns: u64 = match std::env::var(SLOWDOWN_ENV) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{SLOWDOWN_ENV}={v:?} is not a number of ns"))?,
        Err(_) => 0,
    };
    if slowdown_ns > 0 {
        eprintln!(
            "gate: {SLOWDOWN_ENV}={slowdown_ns}: the Ricochet echo handler spins {slowdown_ns} ns per datagram (deliberate slowdown)"
        );
    }
    println!(
        "Ricochet gate ({}): config {}, baseline {}",
        os_name(),
        config_path.display(),
        if baseline.is_some() {
            base_path.display().to_string()
        } else {
            format!("{} (missing)", base_path.display())
        }
    );

    let mut verdicts: Vec<Verdict> = Vec::new();
    let mut sim = Vec::new();
    if args.only != "ratios" {
        let s = &cfg.sim;
        eprintln!(
            "gate: sim echo {} clients × {} × {} B, seed {}, {} + {} simulated s per profile",
            s.clients, s.window, s.payload, s.seed, s.warmup_s, s.seconds
        );
        sim = cfg.sim.run(|r| {
            eprintln!(
                "gate: sim {:<7} {:>9.1} rt/s  p99 {:>7} µs  ({:.1} s wall)",
                r.profile,
                r.metrics.get("round_trips_per_s").copied().unwrap_or(0.0),
                r.metrics.get("rtt_p99_us").copied().unwrap_or(0.0),
                r.wall_s
            )
        })?;
        match crate::gate::sim::sessions_heap()? {
            Some(r) => {
                eprintln!(
                    "gate: sim sessions: heap per idle session {} B ({:.1} s wall)",
                    r.metrics
                        .get("server_heap_bytes_per_idle_session")
                        .copied()
                        .unwrap_or(0.0),
                    r.wall_s
                );
                sim.push(r);
            }
            None => verdicts.push(Verdict {
                group: format!("sim/{}", crate::gate::sim::SESSIONS_PROFILE),
                metric: "server heap per session".into(),
                baseline: None,
                measured: None,
                rule: "exact".into(),
                status: Status::Skipped,
                note: "this process does not count allocations (not the bench binary)".into(),
            }),
        }
        match crate::gate::sim::game_allocs()? {
            Some(r) => {
                eprintln!(
                    "gate: sim game server: {} allocations per player-tick ({:.1} s wall)",
                    r.metrics
                        .get("server_allocs_per_player_tick")
                        .copied()
                        .unwrap_or(0.0),
                    r.wall_s
                );
                sim.push(r);
            }
            None => verdicts.push(Verdict {
                group: format!("sim/{}", crate::gate::sim::GAME_PROFILE),
                metric: "server allocations per player-tick".into(),
                baseline: None,
                measured: None,
                rule: "exact".into(),
                status: Status::Skipped,
                note: "this process does not count allocations (not the bench binary)".into(),
            }),
        }
        verdicts.extend(compare_sim(&sim, baseline.as_ref(), &cfg.sim));
    }
    let mut ratios = Vec::new();
    let mut tails = Vec::new();
    if args.only != "sim" {
        let r = &cfg.ratios;
        eprintln!(
            "gate: ratio runs, {} rounds × 3 servers, {} clients × {} × {} B, {} + {} s each",
            r.rounds, r.clients, r.window, r.payload, r.warmup_s, r.seconds
        );
        if let Some(f) = &r.fec_vs_arq {
            eprintln!(
                "gate: then {} rounds × (ARQ only, adaptive FEC) over RUDP through the relay ({}), {} clients × {} × {} B, {} + {} s each",
                f.rounds, f.profile, f.clients, f.window, f.payload, f.warmup_s, f.seconds
            );
        }
        ratios = cfg
            .ratios
            .run(slowdown_ns, |line| eprintln!("gate: {line}"));
        verdicts.extend(compare_ratios(&ratios, baseline.as_ref(), &cfg.ratios));
        if let Some(t) = &cfg.ratios.clean_tail {
            eprintln!(
                "gate: clean-path tail, {} rounds × {:?}, {} clients × {} × {} B from a separate process ({} thread), {} + {} s each",
                t.rounds, t.io_models, t.clients, t.window, t.payload, t.client_threads, t.warmup_s, t.seconds
            );
            tails = t.run(|model, run| {
                eprintln!(
                    "gate: tail {model:<8} {:>9.0} rt/s  max {}{}",
                    run.round_trips_per_s,
                    run.rtt_us
                        .map_or("-".into(), |l| format!("{:.1} ms", l.max / 1000.0)),
                    if run.ok {
                        String::new()
                    } else {
                        format!("  (not ok: {})", run.errors.join(", "))
                    }
                )
            });
            verdicts.extend(compare_tails(&tails, t));
        }
        verdicts.push(Verdict {
            group: "cpu".into(),
            metric: "instructions per round trip".into(),
            baseline: None,
            measured: None,
            rule: "optional".into(),
            status: Status::Skipped,
            note: match perf_instructions() {
                Err(why) => format!("not measured: {why}"),
                Ok(()) => {
                    "perf can count instructions here, but the gate does not measure them yet"
                        .into()
                }
            },
        });
    }

    println!();
    print!("{}", verdict_table(&verdicts));
    let failures = failure_lines(&verdicts);
    let passed = failures.is_empty();

    let result = GateResult {
        schema_version: GATE_SCHEMA_VERSION,
        kind: "gate".into(),
        created_utc: started.iso(),
        command_line: command_line(),
        host: HostInfo::collect(),
        build: BuildInfo::collect(),
        baseline_path: base_path.display().to_string(),
        passed,
        verdicts,
        sim: sim.clone(),
        ratios: ratios.clone(),
        tails,
    };
    let json_path = global.json.clone().unwrap_or_else(|| {
        source_root()
            .join("target")
            .join("gate")
            .join(format!("gate-{}.json", os_name()))
    });
    write_json(&result, &json_path)?;
    println!("gate JSON: {}", json_path.display());

    if args.update_baseline {
        let mut b = baseline.unwrap_or(Baseline {
            schema_version: GATE_SCHEMA_VERSION,
            kind: "gate-baseline".into(),
            os: os_name().into(),
            command_line: String::new(),
            git_commit: String::new(),
            sim_suite: cfg.sim.clone(),
            sim: Vec::new(),
            ratios: Default::default(),
        });
        b.command_line = command_line();
        b.git_commit = result.build.git_commit.clone();
        if !sim.is_empty() {
            b.sim_suite = cfg.sim.clone();
            b.sim = sim
                .iter()
                .map(|r| BaselineSim {
                    profile: r.profile.clone(),
                    metrics: r.metrics.clone(),
                    trace_hash: r.trace_hash.clone(),
                })
                .collect();
        }
        for r in &ratios {
            if let Some(m) = r.median {
                b.ratios.insert(r.name.clone(), m);
            }
        }
        b.write(&base_path)?;
        println!(
            "baseline updated: {} (commit it with the reason for the change)",
            base_path.display()
        );
        return Ok(sim.iter().all(|r| r.problems.is_empty()));
    }

    if passed {
        println!("gate: PASS");
    } else {
        for l in &failures {
            println!("{l}");
        }
        println!("gate: FAIL ({} regressions)", failures.len());
    }
    Ok(passed)
}
