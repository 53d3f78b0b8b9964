//! Statistics every part of the bench shares: the median, finite floats for JSON, and the
//! latency summary of an HDR histogram. A leaf: it uses nothing else of the bench.

use serde::{Deserialize, Serialize};

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

/// Replace a non-finite float by 0 (JSON has no NaN or infinity).
pub fn finite(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

/// Round-trip time summary, microseconds, from an HDR histogram (3 significant digits).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Latency {
    /// Samples.
    pub count: u64,
    /// Mean, µs.
    pub mean: f64,
    /// Median, µs.
    pub p50: f64,
    /// 90th percentile, µs.
    pub p90: f64,
    /// 99th percentile, µs.
    pub p99: f64,
    /// 99.9th percentile, µs.
    pub p999: f64,
    /// Maximum, µs.
    pub max: f64,
}

impl Latency {
    /// Summarize a histogram of nanoseconds; `None` when it is empty.
    pub fn from_ns(h: &hdrhistogram::Histogram<u64>) -> Option<Latency> {
        if h.is_empty() {
            return None;
        }
        let us = |ns: u64| finite(ns as f64 / 1_000.0);
        Some(Latency {
            count: h.len(),
            mean: finite(h.mean() / 1_000.0),
            p50: us(h.value_at_quantile(0.50)),
            p90: us(h.value_at_quantile(0.90)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
        })
    }
}
