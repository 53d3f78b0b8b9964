//! The gate's wall-clock suite: ratios of UDP echo servers measured side by side, interleaved.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use crate::schema::{UdpConfig, UdpRun};
use crate::udp::client::ClientIo;
use crate::udp::run::run_udp;

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
    /// A ratio fails below this fraction of its baseline (0.6: a 2× regression fails, the
    /// ±25 % swings of a shared 2-core VM do not).
    pub min_fraction_of_baseline: f64,
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
        }
    }
}

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
}

/// Median of `v` (mean of the middle two for an even count); `None` when empty.
pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
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
        if !(self.seconds > 0.0 && self.seconds <= 600.0) {
            bail!("ratios.seconds must be within (0, 600]");
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

    /// Runs the rounds and computes the ratios. `progress` sees each run as it ends.
    pub fn run(&self, slowdown_ns: u64, mut progress: impl FnMut(&UdpRun)) -> Vec<RatioResult> {
        let servers = self.servers(slowdown_ns);
        let mut rounds: Vec<[Option<f64>; 3]> = Vec::new();
        let mut errors: Vec<String> = Vec::new();
        for round in 0..self.rounds {
            let mut row = [None; 3];
            for (i, (label, cfg)) in servers.iter().enumerate() {
                let run = run_udp(cfg, label);
                progress(&run);
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
            }
        };
        vec![
            ratio("per-core/tokio", 0, 1),
            ratio("per-core/shared", 0, 2),
            RatioResult {
                name: "adaptive-fec/arq-only (random, relay)".into(),
                numerator: "rudp adaptive FEC".into(),
                denominator: "rudp ARQ-only".into(),
                per_round: Vec::new(),
                median: None,
                errors: Vec::new(),
                unavailable: Some(
                    "not yet available: needs `bench rudp`, the relay and FEC in the protocol core on main"
                        .into(),
                ),
                samples: Vec::new(),
            },
        ]
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
    fn slowdown_reaches_only_ricochet() {
        let s = RatioSuite::default().servers(500);
        assert_eq!(s[0].1.work_ns, 500);
        assert_eq!(s[1].1.server, "tokio");
        assert_eq!(s[1].1.work_ns, 0);
        assert_eq!(s[2].1.io_model, "shared");
        assert_eq!(s[2].1.work_ns, 500);
    }
}
