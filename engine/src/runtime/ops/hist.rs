//! Fixed-bucket histograms a single thread writes and any thread reads: what the metrics
//! endpoint exposes as Prometheus histograms (cumulative, never reset).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the tick duration and lateness buckets, seconds.
pub(crate) const TICK_BOUNDS: [f64; 12] = [
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 1.0,
];
/// Upper bounds of the RTT buckets, seconds.
pub(crate) const RTT_BOUNDS: [f64; 13] = [
    1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 75e-3, 100e-3, 150e-3, 250e-3, 500e-3, 1.0, 2.5,
];

/// Counts per bucket (the last one is `+Inf`), their sum and count.
#[derive(Debug)]
pub(crate) struct Hist<const N: usize> {
    bounds: &'static [f64; N],
    /// Bucket `i` counts samples in (bounds[i-1], bounds[i]]; index N counts the rest.
    counts: [AtomicU64; 33],
    sum_ns: AtomicU64,
}

/// A histogram read at one moment: cumulative buckets as Prometheus encodes them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct HistSnapshot {
    /// (upper bound in seconds, samples at or below it), ascending; `+Inf` is `count`.
    pub buckets: Vec<(f64, u64)>,
    /// Samples counted.
    pub count: u64,
    /// Sum of the samples, seconds.
    pub sum: f64,
}

impl<const N: usize> Hist<N> {
    pub(crate) fn new(bounds: &'static [f64; N]) -> Self {
        assert!(N < 33, "at most 32 finite buckets");
        Hist {
            bounds,
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }

    /// Count one sample. One writer per histogram: a relaxed add is all it costs.
    pub(crate) fn record(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = self.bounds.iter().position(|&b| s <= b).unwrap_or(N);
        self.counts[i].fetch_add(1, Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    /// The cumulative buckets now.
    pub(crate) fn snapshot(&self) -> HistSnapshot {
        let mut acc = 0;
        let mut buckets = Vec::with_capacity(N);
        for (i, &b) in self.bounds.iter().enumerate() {
            acc += self.counts[i].load(Relaxed);
            buckets.push((b, acc));
        }
        let count = acc + self.counts[N].load(Relaxed);
        HistSnapshot {
            buckets,
            count,
            sum: self.sum_ns.load(Relaxed) as f64 / 1e9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_the_overflow_counts() {
        let h = Hist::new(&TICK_BOUNDS);
        h.record(Duration::from_micros(10));
        h.record(Duration::from_micros(50)); // on the bound: in it
        h.record(Duration::from_millis(3));
        h.record(Duration::from_secs(5)); // past every bound
        let s = h.snapshot();
        assert_eq!(s.count, 4);
        assert_eq!(s.buckets[0], (50e-6, 2));
        assert_eq!(s.buckets[5].1, 2, "2.5 ms");
        assert_eq!(s.buckets[6].1, 3, "5 ms");
        assert_eq!(s.buckets.last().map(|b| b.1), Some(3));
        assert!((s.sum - 5.00306).abs() < 1e-9);
    }
}
