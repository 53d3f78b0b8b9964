//! The gate's wall-clock suite: ratios of UDP echo servers measured side by side, interleaved.

use std::collections::BTreeMap;
use std::str::FromStr;

use anyhow::{anyhow, bail, Result};
use ricochet_testkit::Profile;
use serde::{Deserialize, Serialize};

use crate::rudp::protocol::FecPolicy;
use crate::rudp::run::{config_for, run_round, validate as validate_rudp};
use crate::schema::{RudpConfig, UdpConfig};
use crate::stats::median;
use crate::udp::client::ClientIo;
use crate::udp::run::run_udp;

/// Name of the RUDP ratio in verdicts and baselines.
pub const FEC_RATIO_NAME: &str = "adaptive-fec/arq-only (random, relay)";

/// The RUDP part of the ratio suite: adaptive FEC against ARQ only over real sockets through
/// the impairment relay, rounds interleaved (ARQ, FEC, ARQ, FEC, …), both policies of a round
/// on the same relay seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FecRatioSuite {
    /// Rounds; each runs ARQ only, then adaptive FEC.
    pub rounds: usize,
    /// Network condition (`random`: the one where the reference's FEC pays off).
    pub profile: String,
    /// Warm-up per run, s.
    pub warmup_s: f64,
    /// Measured time per run, s (the drain follows, and counts: see `bench rudp`).
    pub seconds: f64,
    /// Clients.
    pub clients: usize,
    /// Messages in flight per client.
    pub window: usize,
    /// Message size, bytes.
    pub payload: usize,
    /// `per-core` or `shared`.
    pub io_model: String,
    /// Server workers.
    pub io_threads: usize,
    /// Seed of round 1 (round n uses seed + n − 1 for both policies).
    pub seed: u64,
    /// The ratio fails below this fraction of its baseline.
    pub min_fraction_of_baseline: f64,
}

impl Default for FecRatioSuite {
    fn default() -> Self {
        Self {
            rounds: 5,
            profile: "random".into(),
            warmup_s: 0.5,
            seconds: 1.5,
            clients: 4,
            window: 16,
            payload: 1024,
            io_model: "per-core".into(),
            io_threads: 2,
            seed: 42,
            min_fraction_of_baseline: 0.6,
        }
    }
}

impl FecRatioSuite {
    /// Checks the ranges and that both configurations would run.
    pub fn validate(&self) -> Result<()> {
        if self.rounds == 0 || self.rounds > 99 {
            bail!("ratios.fec_vs_arq.rounds must be 1..=99");
        }
        if !(0.0..1.0).contains(&self.min_fraction_of_baseline) {
            bail!("ratios.fec_vs_arq.min_fraction_of_baseline must be within 0..1");
        }
        for (_, cfg) in self.configs(0)? {
            validate_rudp(&cfg).map_err(|e| anyhow!("ratios.fec_vs_arq: {e:#}"))?;
        }
        Ok(())
    }

    /// The two configurations of round `round` (0-based): (label, config) for ARQ only, then
    /// adaptive FEC.
    pub fn configs(&self, round: usize) -> Result<[(String, RudpConfig); 2]> {
        let profile = Profile::from_str(&self.profile)
            .map_err(|e| anyhow!("ratios.fec_vs_arq.profile: {e}"))?;
        let cfg = |fec: FecPolicy| {
            config_for(
                profile,
                self.payload,
                self.clients,
                self.window,
                &self.io_model,
                self.io_threads,
                "auto",
                fec,
                false,
                self.warmup_s,
                self.seconds,
                self.seed.wrapping_add(round as u64),
            )
        };
        Ok([
            ("rudp ARQ only".into(), cfg(FecPolicy::Off)),
            ("rudp adaptive FEC".into(), cfg(FecPolicy::Adaptive)),
        ])
    }

    /// Runs the rounds; the ratio is adaptive FEC rt/s ÷ ARQ-only rt/s per round, median taken.
    /// A round where either run is not ok (lost, corrupt or misordered echoes, relay errors) is
    /// discarded and named in `errors`.
    pub fn run(&self, mut progress: impl FnMut(&str, &crate::schema::RudpRun)) -> RatioResult {
        let mut per_round = Vec::new();
        let mut samples = Vec::new();
        let mut errors = Vec::new();
        let mut names = ["rudp ARQ only".to_string(), "rudp adaptive FEC".to_string()];
        for round in 0..self.rounds {
            let configs = match self.configs(round) {
                Ok(c) => c,
                Err(e) => {
                    errors.push(format!("{e:#}"));
                    break;
                }
            };
            let mut rts = [None; 2];
            for (i, (label, cfg)) in configs.iter().enumerate() {
                names[i] = label.clone();
                let run = run_round(cfg);
                progress(label, &run);
                if run.ok && run.round_trips > 0 {
                    rts[i] = Some(run.round_trips_per_s);
                } else {
                    errors.push(format!(
                        "round {}: {label}: {}",
                        round + 1,
                        if run.errors.is_empty() {
                            "no round trip".to_string()
                        } else {
                            run.errors.join(", ")
                        }
                    ));
                }
            }
            if let [Some(arq), Some(fec)] = rts {
                per_round.push(fec / arq);
                samples.push([fec, arq]);
            }
        }
        let [arq, fec] = names;
        RatioResult {
            name: FEC_RATIO_NAME.into(),
            numerator: fec,
            denominator: arq,
            median: median(&per_round),
            per_round,
            errors,
            unavailable: None,
            samples,
            min_fraction_of_baseline: Some(self.min_fraction_of_baseline),
        }
    }
}

/// What the ratio part of the gate runs (from `ci/gate.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RatioSuite {
    /// Rounds; each round runs every server once, in the same order (A B C A B C …).
    pub rounds: usize,
    /// Warm-up per run, s.
    pub warmup_s: f64,
    /// Measured time per run, s.
    pub seconds: f64,
    /// Client threads.
    pub clients: usize,
    /// Messages in flight per client.
    pub window: usize,
    /// Datagram payload, bytes.
    pub payload: usize,
    /// Server threads (both Ricochet models and tokio).
    pub io_threads: usize,
    /// A ratio fails below this fraction of its baseline: low enough that the run-to-run swings
    /// of a shared VM pass, high enough that a 2× regression fails.
    pub min_fraction_of_baseline: f64,
    /// Per-ratio tolerances that replace `min_fraction_of_baseline` (keys: `per-core/tokio`,
    /// `per-core/shared`). Pick each from how far a 2× server-side cost moves that ratio: the
    /// clients share the cores with the server, so such a cost moves `per-core/tokio` by much
    /// less than 2×, while `per-core/shared` (the same worker on both sides) cannot see it at all.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub min_fraction_by_ratio: BTreeMap<String, f64>,
    /// Adaptive FEC vs ARQ only over RUDP (absent: not run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fec_vs_arq: Option<FecRatioSuite>,
    /// The clean-path tail check (absent: not run); see [`super::tail`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clean_tail: Option<super::tail::TailSuite>,
}

impl Default for RatioSuite {
    fn default() -> Self {
        Self {
            rounds: 5,
            warmup_s: 0.3,
            seconds: 1.0,
            clients: 16,
            window: 16,
            payload: 1024,
            io_threads: 2,
            min_fraction_of_baseline: 0.6,
            min_fraction_by_ratio: BTreeMap::new(),
            fec_vs_arq: Some(FecRatioSuite::default()),
            clean_tail: Some(super::tail::TailSuite::default()),
        }
    }
}

/// The same-run UDP echo ratios: name, numerator and denominator index into
/// [`RatioSuite::servers`] (per-core, tokio, shared).
const UDP_RATIOS: [(&str, usize, usize); 2] = [("per-core/tokio", 0, 1), ("per-core/shared", 0, 2)];

/// One ratio: the median over rounds of numerator rt/s ÷ denominator rt/s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RatioResult {
    /// `per-core/tokio`, `per-core/shared`, …
    pub name: String,
    /// Label of the numerator server.
    pub numerator: String,
    /// Label of the denominator server.
    pub denominator: String,
    /// The ratio of each valid round.
    pub per_round: Vec<f64>,
    /// Median of `per_round`; `None` when no round was valid.
    pub median: Option<f64>,
    /// Why rounds were discarded.
    pub errors: Vec<String>,
    /// `Some(reason)` when the pieces to measure this ratio do not exist (yet).
    pub unavailable: Option<String>,
    /// Round trips/s of (numerator, denominator) per round.
    pub samples: Vec<[f64; 2]>,
    /// This ratio's own tolerance, when it is not the suite's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_fraction_of_baseline: Option<f64>,
}

impl RatioSuite {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<()> {
        if self.rounds == 0 || self.rounds > 99 {
            bail!("ratios.rounds must be 1..=99");
        }
        if !(0.0..1.0).contains(&self.min_fraction_of_baseline) {
            bail!("ratios.min_fraction_of_baseline must be within 0..1");
        }
        for (name, f) in &self.min_fraction_by_ratio {
            if !UDP_RATIOS.iter().any(|(n, _, _)| n == name) {
                bail!("ratios.min_fraction_by_ratio: unknown ratio {name:?}");
            }
            if !(0.0..1.0).contains(f) {
                bail!("ratios.min_fraction_by_ratio[{name:?}] must be within 0..1");
            }
        }
        if !(self.seconds > 0.0 && self.seconds <= 600.0) {
            bail!("ratios.seconds must be within (0, 600]");
        }
        if let Some(f) = &self.fec_vs_arq {
            f.validate()?;
        }
        if let Some(t) = &self.clean_tail {
            t.validate()?;
        }
        Ok(())
    }

    fn base(&self) -> UdpConfig {
        UdpConfig {
            payload: self.payload,
            clients: self.clients,
            window: self.window,
            server: "ricochet".into(),
            io_model: "per-core".into(),
            io_threads: self.io_threads,
            backend: "auto".into(),
            idle: "balanced".into(),
            pin_cores: true,
            work_ns: 0,
            warmup_s: self.warmup_s,
            seconds: self.seconds,
            drain_s: 0.5,
            messages: None,
            address_family: "ipv4".into(),
            recv_buffer: Some(4 << 20),
            send_buffer: None,
            client_io: ClientIo::default_name().into(),
        }
    }

    /// The three servers of a round: Ricochet per-core, tokio, Ricochet shared. `slowdown_ns`
    /// is added to the Ricochet handlers' per-datagram work (see [`super::SLOWDOWN_ENV`]).
    pub fn servers(&self, slowdown_ns: u64) -> [(String, UdpConfig); 3] {
        let base = self.base();
        let per_core = UdpConfig {
            work_ns: slowdown_ns,
            ..base.clone()
        };
        let shared = UdpConfig {
            io_model: "shared".into(),
            work_ns: slowdown_ns,
            ..base.clone()
        };
        let tokio = UdpConfig {
            server: "tokio".into(),
            io_model: "shared".into(),
            backend: "tokio".into(),
            idle: "n/a".into(),
            ..base
        };
        let n = self.io_threads;
        [
            (format!("ricochet per-core ×{n}"), per_core),
            (format!("tokio ×{n}"), tokio),
            (format!("ricochet shared ×{n}"), shared),
        ]
    }

    /// Runs the rounds and computes the ratios. `progress` gets a line per run as it ends.
    pub fn run(&self, slowdown_ns: u64, mut progress: impl FnMut(String)) -> Vec<RatioResult> {
        let servers = self.servers(slowdown_ns);
        let mut rounds: Vec<[Option<f64>; 3]> = Vec::new();
        let mut errors: Vec<String> = Vec::new();
        for round in 0..self.rounds {
            let mut row = [None; 3];
            for (i, (label, cfg)) in servers.iter().enumerate() {
                let run = run_udp(cfg, label);
                progress(format!(
                    "udp {:<22} {:>9.0} rt/s{}",
                    run.label,
                    run.round_trips_per_s,
                    if run.ok { "" } else { "  (not ok)" }
                ));
                if run.round_trips > 0 && run.server.is_some() {
                    row[i] = Some(run.round_trips_per_s);
                } else {
                    errors.push(format!(
                        "round {}: {label}: {}",
                        round + 1,
                        run.errors.join(", ")
                    ));
                }
            }
            rounds.push(row);
        }
        let ratio = |name: &str, a: usize, b: usize| {
            let mut per_round = Vec::new();
            let mut samples = Vec::new();
            for row in &rounds {
                if let (Some(x), Some(y)) = (row[a], row[b]) {
                    per_round.push(x / y);
                    samples.push([x, y]);
                }
            }
            RatioResult {
                name: name.into(),
                numerator: servers[a].0.clone(),
                denominator: servers[b].0.clone(),
                median: median(&per_round),
                per_round,
                errors: errors.clone(),
                unavailable: None,
                samples,
                min_fraction_of_baseline: self.min_fraction_by_ratio.get(name).copied(),
            }
        };
        let mut out: Vec<RatioResult> = UDP_RATIOS
            .iter()
            .map(|&(name, a, b)| ratio(name, a, b))
            .collect();
        if let Some(f) = &self.fec_vs_arq {
            out.push(f.run(|label, run| {
                progress(format!(
                    "{label:<26} {:>9.0} rt/s{}",
                    run.round_trips_per_s,
                    if run.ok {
                        String::new()
                    } else {
                        format!("  (not ok: {})", run.errors.join(", "))
                    }
                ))
            }));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn per_ratio_tolerances_name_known_ratios_in_range() {
        let mut s = RatioSuite::default();
        s.min_fraction_by_ratio.insert("per-core/tokio".into(), 0.8);
        assert!(s.validate().is_ok());
        s.min_fraction_by_ratio.insert("per-core/typo".into(), 0.8);
        assert!(s.validate().is_err());
        s.min_fraction_by_ratio.remove("per-core/typo");
        s.min_fraction_by_ratio
            .insert("per-core/shared".into(), 1.5);
        assert!(s.validate().is_err());
        // The shipped config parses and names only known ratios.
        let cfg: serde_json::Value =
            serde_json::from_str(include_str!("../../../ci/gate.json")).unwrap();
        let r: RatioSuite = serde_json::from_value(cfg["ratios"].clone()).unwrap();
        assert!(r.min_fraction_by_ratio.values().all(|f| *f >= 0.5));
        assert!(r.validate().is_ok());
    }

    #[test]
    fn slowdown_reaches_only_ricochet() {
        let s = RatioSuite::default().servers(500);
        assert_eq!(s[0].1.work_ns, 500);
        assert_eq!(s[1].1.server, "tokio");
        assert_eq!(s[1].1.work_ns, 0);
        assert_eq!(s[2].1.io_model, "shared");
        assert_eq!(s[2].1.work_ns, 500);
    }
}
