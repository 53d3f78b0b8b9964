//! `bench gate`: a short fixed suite for CI, compared with a committed baseline.
//!
//! Two kinds of checks, because two kinds of numbers:
//!
//! - **Simulator metrics** ([`ricochet_testkit::echo`]) are exact functions of the code and the
//!   seed: the same commit gives the same numbers on any machine. They must equal the baseline
//!   (within [`SimSuite::relative_tolerance`], 0 by default). A change that moves them is a
//!   behaviour change: accept it with `bench gate --update-baseline` in the same commit and say
//!   why in the commit message.
//! - **Wall-clock metrics** are noisy, so they are gated only as ratios of two servers measured
//!   in the same run, interleaved (A B C A B C …) with the median of the per-round ratios taken,
//!   which cancels slow drift of the machine. A ratio fails when it drops below
//!   [`RatioSuite::min_fraction_of_baseline`] × its baseline.
//!   One absolute wall-clock check stands beside them ([`tail`]): on a clean path the median
//!   over rounds of each round's largest round trip must stay under a bound set far above what
//!   a quiet machine shows and below the size of a retransmission-timeout stall.
//!
//! The suite and thresholds live in `ci/gate.json` ([`GateConfig`]); the baseline in
//! `results/baseline/gate-<os>.json` ([`Baseline`]).

pub mod ratio;
pub mod sim;
pub mod tail;
mod verdict;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::host::{BuildInfo, HostInfo};
use crate::output::render_table;

pub use ratio::{FecRatioSuite, RatioResult, RatioSuite, FEC_RATIO_NAME};
pub use sim::{SimResult, SimSuite};
pub use tail::{compare_tails, TailResult, TailSuite};
pub use verdict::{Status, Verdict};

/// Version of the gate's baseline and result files.
pub const GATE_SCHEMA_VERSION: u32 = 1;

/// Environment variable that adds busy work (ns per datagram) to the Ricochet echo handler in the
/// ratio runs: a deliberate slowdown to prove the ratio gate catches one. Read by the bench
/// only, never by the engine.
pub const SLOWDOWN_ENV: &str = "RICOCHET_TEST_SLOWDOWN_NS";

/// `ci/gate.json`: what the gate runs and how strict it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateConfig {
    /// The simulator suite.
    pub sim: SimSuite,
    /// The wall-clock ratio suite.
    pub ratios: RatioSuite,
}

impl GateConfig {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<GateConfig> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let cfg: GateConfig = serde_json::from_str(&text)
            .with_context(|| format!("{} does not match the gate config", path.display()))?;
        cfg.sim.validate()?;
        cfg.ratios.validate()?;
        Ok(cfg)
    }
}

/// One gated number of the baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaselineSim {
    /// Profile name.
    pub profile: String,
    /// Metric name → value.
    pub metrics: std::collections::BTreeMap<String, f64>,
    /// Hex BLAKE3 of the simulation's event trace (informational: tells whether anything at all
    /// changed on the wire).
    pub trace_hash: String,
}

/// `results/baseline/gate-<os>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Baseline {
    /// [`GATE_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Always `gate-baseline`.
    pub kind: String,
    /// Operating system the baseline is for.
    pub os: String,
    /// The command that wrote it.
    pub command_line: String,
    /// Git commit of the build that wrote it.
    pub git_commit: String,
    /// The simulator suite it was measured with; a different suite needs a new baseline.
    pub sim_suite: SimSuite,
    /// Simulator metrics per profile.
    pub sim: Vec<BaselineSim>,
    /// Ratio name → median ratio.
    pub ratios: std::collections::BTreeMap<String, f64>,
}

impl Baseline {
    /// Reads `path`.
    pub fn load(path: &Path) -> Result<Baseline> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let b: Baseline = serde_json::from_str(&text)
            .with_context(|| format!("{} does not match the baseline schema", path.display()))?;
        if b.schema_version != GATE_SCHEMA_VERSION || b.kind != "gate-baseline" {
            bail!(
                "{}: schema {} kind {:?}, expected {GATE_SCHEMA_VERSION} gate-baseline",
                path.display(),
                b.schema_version,
                b.kind
            );
        }
        Ok(b)
    }

    /// Writes pretty JSON (sorted metric names, so diffs are small).
    pub fn write(&self, path: &Path) -> Result<()> {
        write_json(self, path)
    }
}

/// The gate's JSON output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateResult {
    /// [`GATE_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Always `gate`.
    pub kind: String,
    /// UTC, ISO 8601.
    pub created_utc: String,
    /// The exact command line.
    pub command_line: String,
    /// Host.
    pub host: HostInfo,
    /// Build.
    pub build: BuildInfo,
    /// The baseline compared with.
    pub baseline_path: String,
    /// True when no check failed.
    pub passed: bool,
    /// Every check.
    pub verdicts: Vec<Verdict>,
    /// The simulator runs.
    pub sim: Vec<SimResult>,
    /// The ratio measurements, every round.
    pub ratios: Vec<RatioResult>,
    /// The clean-path tail rounds (absent when not run).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tails: Vec<TailResult>,
}

/// The operating system name used in baseline file names.
pub fn os_name() -> &'static str {
    std::env::consts::OS
}

/// `results/baseline/gate-<os>.json` under `results_root`.
pub fn baseline_path(results_root: &Path) -> PathBuf {
    results_root
        .join("baseline")
        .join(format!("gate-{}.json", os_name()))
}

/// Pretty JSON to `path`, creating its directory.
pub fn write_json<T: Serialize>(value: &T, path: &Path) -> Result<()> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
    }
    let mut text = serde_json::to_string_pretty(value).context("serializing")?;
    text.push('\n');
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Compares sim results with the baseline's, exactly or within `relative_tolerance`.
pub fn compare_sim(
    results: &[SimResult],
    baseline: Option<&Baseline>,
    suite: &SimSuite,
) -> Vec<Verdict> {
    let mut out = Vec::new();
    let same_suite = baseline.is_some_and(|b| b.sim_suite == *suite);
    let tol = suite.relative_tolerance;
    let rule = if tol == 0.0 {
        "exact".to_string()
    } else {
        format!("within ±{}%", tol * 100.0)
    };
    for r in results {
        let group = format!("sim/{}", r.profile);
        if !r.problems.is_empty() {
            out.push(Verdict {
                group: group.clone(),
                metric: "checks".into(),
                baseline: None,
                measured: None,
                rule: "every echo intact and in order".into(),
                status: Status::Fail,
                note: r.problems.join("; "),
            });
        }
        let base = baseline
            .filter(|_| same_suite)
            .and_then(|b| b.sim.iter().find(|s| s.profile == r.profile));
        for (metric, &measured) in &r.metrics {
            let b = base.and_then(|s| s.metrics.get(metric).copied());
            let (status, note) = match b {
                None if baseline.is_some() && !same_suite => (
                    Status::Fail,
                    "the baseline was made with another sim suite: run --update-baseline".into(),
                ),
                None => (Status::New, "no baseline value".into()),
                Some(b) => {
                    let ok = if tol == 0.0 {
                        measured == b
                    } else {
                        (measured - b).abs() <= tol * b.abs()
                    };
                    if ok {
                        (Status::Pass, String::new())
                    } else {
                        (
                            Status::Fail,
                            format!(
                                "simulated behaviour changed ({}); if intended, run `bench gate --update-baseline` and give the reason in the commit",
                                change(b, measured)
                            ),
                        )
                    }
                }
            };
            out.push(Verdict {
                group: group.clone(),
                metric: metric.clone(),
                baseline: b,
                measured: Some(measured),
                rule: rule.clone(),
                status,
                note,
            });
        }
        // Baseline metrics the run no longer produces (e.g. FEC stats removed) are a change too.
        if let Some(base) = base {
            for (metric, &b) in &base.metrics {
                if !r.metrics.contains_key(metric) {
                    out.push(Verdict {
                        group: group.clone(),
                        metric: metric.clone(),
                        baseline: Some(b),
                        measured: None,
                        rule: rule.clone(),
                        status: Status::Fail,
                        note: "metric missing from this run".into(),
                    });
                }
            }
        }
    }
    out
}

fn change(base: f64, measured: f64) -> String {
    if base == 0.0 {
        format!("{:+}", measured - base)
    } else {
        format!("{:+.3}%", (measured / base - 1.0) * 100.0)
    }
}

/// Compares ratio medians with the baseline's.
pub fn compare_ratios(
    results: &[RatioResult],
    baseline: Option<&Baseline>,
    suite: &RatioSuite,
) -> Vec<Verdict> {
    let mut out = Vec::new();
    for r in results {
        let frac = r
            .min_fraction_of_baseline
            .unwrap_or(suite.min_fraction_of_baseline);
        let rule = format!("≥ {frac} × baseline");
        let v = match (r.median, r.unavailable.as_ref()) {
            (_, Some(why)) => Verdict {
                group: "ratio".into(),
                metric: r.name.clone(),
                baseline: None,
                measured: None,
                rule,
                status: Status::Skipped,
                note: why.clone(),
            },
            (None, None) => Verdict {
                group: "ratio".into(),
                metric: r.name.clone(),
                baseline: None,
                measured: None,
                rule,
                status: Status::Fail,
                note: format!("no valid round: {}", r.errors.join("; ")),
            },
            (Some(m), None) => {
                let b = baseline.and_then(|b| b.ratios.get(&r.name).copied());
                let (status, note) = match b {
                    // A ratio added after the baseline was recorded is reported, not gated,
                    // until the baseline is regenerated: main stays green between the merges.
                    None => (
                        Status::New,
                        "new, not gated: the baseline has no value for it (`bench gate --update-baseline` records one)"
                            .to_string(),
                    ),
                    Some(b) if m >= frac * b => (Status::Pass, String::new()),
                    Some(b) => (
                        Status::Fail,
                        format!("regression: {m:.3} < {frac} × {b:.3} = {:.3}", frac * b),
                    ),
                };
                let mut note = note;
                if !r.errors.is_empty() {
                    let _ = write!(note, " (ignored rounds: {})", r.errors.join("; "));
                }
                Verdict {
                    group: "ratio".into(),
                    metric: r.name.clone(),
                    baseline: b,
                    measured: Some(m),
                    rule,
                    status,
                    note: note.trim().to_string(),
                }
            }
        };
        out.push(v);
    }
    out
}

fn fmt_value(x: Option<f64>) -> String {
    match x {
        None => "-".into(),
        Some(v) if v.fract() == 0.0 && v.abs() < 1e15 => format!("{v:.0}"),
        Some(v) => format!("{v:.4}"),
    }
}

/// The verdict table for stdout.
pub fn verdict_table(verdicts: &[Verdict]) -> String {
    let rows: Vec<Vec<String>> = verdicts
        .iter()
        .map(|v| {
            vec![
                v.group.clone(),
                v.metric.clone(),
                fmt_value(v.baseline),
                fmt_value(v.measured),
                v.rule.clone(),
                v.status.as_str().to_string(),
                v.note.clone(),
            ]
        })
        .collect();
    render_table(
        &[
            "check", "metric", "baseline", "measured", "rule", "verdict", "note",
        ],
        &rows,
    )
}

/// One line per failed check: metric, baseline, measured.
pub fn failure_lines(verdicts: &[Verdict]) -> Vec<String> {
    verdicts
        .iter()
        .filter(|v| v.status == Status::Fail)
        .map(|v| {
            format!(
                "REGRESSION {} {}: baseline {}, measured {} (rule: {}){}",
                v.group,
                v.metric,
                fmt_value(v.baseline),
                fmt_value(v.measured),
                v.rule,
                if v.note.is_empty() {
                    String::new()
                } else {
                    format!(" — {}", v.note)
                }
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn suite() -> SimSuite {
        SimSuite::default()
    }

    fn sim_result(p99: f64) -> SimResult {
        SimResult {
            profile: "random".into(),
            metrics: BTreeMap::from([("rtt_p99_us".to_string(), p99)]),
            trace_hash: "ab".into(),
            problems: Vec::new(),
            wall_s: 0.0,
        }
    }

    fn baseline(p99: f64, ratio: f64) -> Baseline {
        Baseline {
            schema_version: GATE_SCHEMA_VERSION,
            kind: "gate-baseline".into(),
            os: "linux".into(),
            command_line: String::new(),
            git_commit: String::new(),
            sim_suite: suite(),
            sim: vec![BaselineSim {
                profile: "random".into(),
                metrics: BTreeMap::from([("rtt_p99_us".to_string(), p99)]),
                trace_hash: "ab".into(),
            }],
            ratios: BTreeMap::from([("per-core/tokio".to_string(), ratio)]),
        }
    }

    #[test]
    fn sim_metrics_must_match_exactly() {
        let b = baseline(40_000.0, 2.0);
        let v = compare_sim(&[sim_result(40_000.0)], Some(&b), &suite());
        assert_eq!(v[0].status, Status::Pass);
        let v = compare_sim(&[sim_result(40_001.0)], Some(&b), &suite());
        assert_eq!(v[0].status, Status::Fail);
        let lines = failure_lines(&v);
        assert!(lines[0].contains("rtt_p99_us") && lines[0].contains("40000"));
        assert!(lines[0].contains("40001"));
    }

    #[test]
    fn a_different_suite_fails_until_the_baseline_is_updated() {
        let b = baseline(40_000.0, 2.0);
        let mut other = suite();
        other.seed += 1;
        let v = compare_sim(&[sim_result(40_000.0)], Some(&b), &other);
        assert_eq!(v[0].status, Status::Fail);
        let v = compare_sim(&[sim_result(40_000.0)], None, &other);
        assert_eq!(v[0].status, Status::New);
    }

    #[test]
    fn a_failed_check_fails_the_gate() {
        let mut r = sim_result(1.0);
        r.problems.push("3 echoes out of order".into());
        let v = compare_sim(&[r], None, &suite());
        assert!(v
            .iter()
            .any(|v| v.status == Status::Fail && v.metric == "checks"));
    }

    #[test]
    fn ratio_halved_fails_small_noise_passes() {
        let b = baseline(1.0, 2.0);
        let s = RatioSuite::default();
        let r = |m: f64| RatioResult {
            name: "per-core/tokio".into(),
            numerator: "a".into(),
            denominator: "b".into(),
            per_round: vec![m],
            median: Some(m),
            errors: Vec::new(),
            unavailable: None,
            samples: Vec::new(),
            min_fraction_of_baseline: None,
        };
        assert_eq!(
            compare_ratios(&[r(1.8)], Some(&b), &s)[0].status,
            Status::Pass
        );
        let v = compare_ratios(&[r(1.0)], Some(&b), &s);
        assert_eq!(v[0].status, Status::Fail);
        assert!(failure_lines(&v)[0].contains("per-core/tokio"));
    }

    #[test]
    fn a_ratio_missing_from_the_baseline_is_new_not_failed_and_own_tolerance_applies() {
        let b = baseline(1.0, 2.0);
        let s = RatioSuite::default();
        let fec = |m: f64, frac: Option<f64>| RatioResult {
            name: ratio::FEC_RATIO_NAME.into(),
            numerator: "rudp adaptive FEC".into(),
            denominator: "rudp ARQ only".into(),
            per_round: vec![m],
            median: Some(m),
            errors: Vec::new(),
            unavailable: None,
            samples: Vec::new(),
            min_fraction_of_baseline: frac,
        };
        // The committed baseline predates the FEC ratio: reported, not gated.
        let v = compare_ratios(&[fec(0.1, None)], Some(&b), &s);
        assert_eq!(v[0].status, Status::New);
        assert!(v[0].note.contains("not gated"));
        assert!(failure_lines(&v).is_empty());
        // With a baseline value, the ratio's own fraction is the rule.
        let mut b2 = b.clone();
        b2.ratios.insert(ratio::FEC_RATIO_NAME.into(), 1.7);
        let v = compare_ratios(&[fec(1.2, Some(0.8))], Some(&b2), &s);
        assert_eq!(v[0].status, Status::Fail, "{v:?}");
        assert!(v[0].rule.contains("0.8"));
        let line = &failure_lines(&v)[0];
        assert!(
            line.contains(ratio::FEC_RATIO_NAME) && line.contains("1.7") && line.contains("1.2")
        );
        let v = compare_ratios(&[fec(1.2, Some(0.6))], Some(&b2), &s);
        assert_eq!(v[0].status, Status::Pass);
    }
}
