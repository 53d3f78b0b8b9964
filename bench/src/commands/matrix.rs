//! `bench matrix rudp`: the reference report's three RUDP sets on Ricochet.
//!
//! - `main`: FEC policy (ARQ only / fixed / adaptive) × condition (none / random / burst,
//!   through the relay) × IO model × local backend, plus ARQ-only direct (no relay) rows;
//!   1,024 B, 4 clients × 16 in flight, 3 rounds (seeds 42/43/44), 2 s warm-up, 3 s measured.
//! - `dims`: 64 / 4,096 / 16,384 B × windows 1 / 64 × policy, random loss, 1 worker.
//! - `sustained`: 120 s per policy, 4,096 B, window 16, 4 workers, burst + 2% random.
//!
//! Cases a build cannot run (FEC before it lands) are run and reported as failed with the
//! reason, never dropped. `--quick` shrinks durations and keeps a subset, for CI.

use std::str::FromStr;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use ricochet_testkit::Profile;

use super::rudp::rudp_table;
use super::Global;
use crate::host::UtcTime;
use crate::output::{result_file, write_result};
use crate::rudp::run::config_for;
use crate::rudp::{label, run_case, FecPolicy};
use crate::schema::{RudpCase, RudpConfig};

/// `bench matrix <kind>`.
#[derive(Debug, Clone, Args)]
pub struct MatrixArgs {
    /// Which matrix.
    #[command(subcommand)]
    pub kind: MatrixKind,
}

/// The matrices.
#[derive(Debug, Clone, Subcommand)]
pub enum MatrixKind {
    /// The RUDP reference matrix (main, payload/window, sustained sets).
    Rudp(RudpMatrixArgs),
}

/// Flags of `bench matrix rudp`.
#[derive(Debug, Clone, Args)]
pub struct RudpMatrixArgs {
    /// Which set(s): main, dims (payload × window), sustained, or all.
    #[arg(long, default_value = "main", value_parser = ["main", "dims", "sustained", "all"])]
    pub set: String,
    /// CI variant: fewer cases and one short round each (main: one IO model and backend, `none`
    /// and `random`, every available FEC policy, 0.3 s + 0.7 s; dims: 64 and 4,096 B at window
    /// 1; sustained: 2 s).
    #[arg(long)]
    pub quick: bool,
    /// Backends (list; default: every local backend this machine can run).
    #[arg(long, value_delimiter = ',', value_parser = ["uring", "mmsg", "auto"])]
    pub backend: Vec<String>,
    /// IO models of the main set (list).
    #[arg(long, value_delimiter = ',', default_value = "per-core,shared", value_parser = ["per-core", "shared"])]
    pub io_model: Vec<String>,
    /// FEC policies (list; default all three, failing clearly where unavailable).
    #[arg(long, value_delimiter = ',', value_parser = ["off", "fixed", "adaptive"])]
    pub fec: Vec<String>,
    /// Override the rounds per case (main and dims: 3; sustained: 1).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Seed of every case's first round.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

/// One planned case.
#[derive(Debug, Clone)]
pub struct Planned {
    /// Set name.
    pub set: &'static str,
    /// Table label.
    pub label: String,
    /// Configuration of the first round.
    pub config: RudpConfig,
    /// Rounds.
    pub rounds: usize,
}

fn local_backends() -> Vec<String> {
    ricochet_platform::probe()
        .backends()
        .into_iter()
        .map(|b| b.to_string())
        .collect()
}

/// Every case the flags ask for, in run order.
pub fn plan(args: &RudpMatrixArgs) -> Result<Vec<Planned>> {
    let backends = if args.backend.is_empty() {
        local_backends()
    } else {
        args.backend.clone()
    };
    if backends.is_empty() {
        bail!("no datagram backend is available on this machine");
    }
    let policies: Vec<FecPolicy> = if args.fec.is_empty() {
        if args.quick {
            // CI runs what this build can run; the full matrix reports the rest as failures.
            FecPolicy::ALL
                .into_iter()
                .filter(|p| p.available().is_ok())
                .collect()
        } else {
            FecPolicy::ALL.to_vec()
        }
    } else {
        args.fec
            .iter()
            .map(|s| FecPolicy::from_str(s))
            .collect::<Result<_>>()?
    };
    let q = args.quick;
    let (warmup, seconds) = if q { (0.3, 0.7) } else { (2.0, 3.0) };
    let rounds = |d: usize| args.rounds.unwrap_or(if q { 1 } else { d });
    let sets: &[&str] = match args.set.as_str() {
        "all" => &["main", "dims", "sustained"],
        "main" => &["main"],
        "dims" => &["dims"],
        "sustained" => &["sustained"],
        other => bail!("set {other:?}: expected main, dims, sustained or all"),
    };
    let mut out = Vec::new();
    let mut push = |set: &'static str, config: RudpConfig, rounds: usize| {
        out.push(Planned {
            set,
            label: label(&config),
            config,
            rounds,
        });
    };
    for &set in sets {
        match set {
            "main" => {
                let profiles: &[Profile] = if q {
                    &[Profile::None, Profile::Random]
                } else {
                    &[Profile::None, Profile::Random, Profile::Burst]
                };
                let models: Vec<&String> = if q {
                    args.io_model.iter().take(1).collect()
                } else {
                    args.io_model.iter().collect()
                };
                let bks: Vec<&String> = if q {
                    backends.iter().take(1).collect()
                } else {
                    backends.iter().collect()
                };
                for m in &models {
                    for b in &bks {
                        let direct = config_for(
                            Profile::None,
                            1024,
                            4,
                            16,
                            m,
                            2,
                            b,
                            FecPolicy::Off,
                            true,
                            warmup,
                            seconds,
                            args.seed,
                        );
                        push("main", direct, rounds(3));
                        for &p in profiles {
                            for &f in &policies {
                                let c = config_for(
                                    p, 1024, 4, 16, m, 2, b, f, false, warmup, seconds, args.seed,
                                );
                                push("main", c, rounds(3));
                            }
                        }
                    }
                }
            }
            "dims" => {
                let payloads: &[usize] = if q { &[64, 4096] } else { &[64, 4096, 16_384] };
                let windows: &[usize] = if q { &[1] } else { &[1, 64] };
                for &payload in payloads {
                    for &w in windows {
                        for &f in &policies {
                            let c = config_for(
                                Profile::Random,
                                payload,
                                4,
                                w,
                                "per-core",
                                1,
                                &backends[0],
                                f,
                                false,
                                warmup,
                                seconds,
                                args.seed,
                            );
                            push("dims", c, rounds(3));
                        }
                    }
                }
            }
            _ => {
                let (w, s) = if q { (0.5, 2.0) } else { (2.0, 120.0) };
                for &f in &policies {
                    let c = config_for(
                        Profile::Sustained,
                        4096,
                        4,
                        16,
                        "per-core",
                        4,
                        &backends[0],
                        f,
                        false,
                        w,
                        s,
                        args.seed,
                    );
                    push("sustained", c, rounds(1));
                }
            }
        }
    }
    Ok(out)
}

/// Run planned cases with a progress bar over their rounds.
pub fn run_planned(planned: &[Planned]) -> Vec<RudpCase> {
    let total: u64 = planned.iter().map(|p| p.rounds as u64).sum();
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} rounds  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut cases = Vec::with_capacity(planned.len());
    for p in planned {
        bar.set_message(format!("{}: {}", p.set, p.label));
        let mut done = 0;
        let case = run_case(&p.label, Some(p.set), &p.config, p.rounds, |r| {
            done += 1;
            bar.inc(1);
            if !r.ok {
                bar.println(format!(
                    "  {} (seed {}): NOT ok: {}",
                    p.label,
                    r.config.seed,
                    r.errors.join("; ")
                ));
            }
        });
        // A case that stopped early (invalid configuration) still advances the bar fully.
        bar.inc((p.rounds as u64).saturating_sub(done));
        cases.push(case);
    }
    bar.finish_and_clear();
    cases
}

/// `bench matrix ...`.
pub fn run(args: &MatrixArgs, global: &Global) -> Result<bool> {
    match &args.kind {
        MatrixKind::Rudp(a) => run_rudp(a, global),
    }
}

fn run_rudp(args: &RudpMatrixArgs, global: &Global) -> Result<bool> {
    let planned = plan(args)?;
    let started = UtcTime::now();
    let rounds: usize = planned.iter().map(|p| p.rounds).sum();
    let secs: f64 = planned
        .iter()
        .filter(|p| p.config.fec == "off")
        .map(|p| (p.config.warmup_s + p.config.seconds + 0.5) * p.rounds as f64)
        .sum();
    println!(
        "RUDP matrix ({}{}): {} cases, {} rounds, about {:.0} s of runs (more when drains run long)",
        args.set,
        if args.quick { ", quick" } else { "" },
        planned.len(),
        rounds,
        secs
    );
    let cases = run_planned(&planned);
    for set in ["main", "dims", "sustained"] {
        let these: Vec<RudpCase> = cases
            .iter()
            .filter(|c| c.set.as_deref() == Some(set))
            .cloned()
            .collect();
        if !these.is_empty() {
            println!("\n{set}:");
            print!("{}", rudp_table(&these));
        }
    }
    let failed = cases.iter().filter(|c| !c.ok).count();
    if failed > 0 {
        println!(
            "\n{failed} of {} case(s) not ok (see above and the JSON)",
            cases.len()
        );
    }
    let mut file = result_file(
        "rudp-matrix",
        &started,
        crate::host::HostInfo::collect(),
        Vec::new(),
    );
    file.ok = failed == 0;
    file.rudp_cases = cases;
    let stem = format!(
        "rudp-matrix-{}{}",
        args.set,
        if args.quick { "-quick" } else { "" }
    );
    write_result(&file, &global.path_for(&stem, &started))?;
    Ok(failed == 0)
}
