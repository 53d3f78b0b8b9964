//! RTT percentiles of a server's sessions: one histogram per worker, fed with the RTT samples
//! its endpoint collects, merged when asked for. Sessions themselves keep only a fixed-size
//! summary ([`ricochet_proto::RttSummary`]), so memory per session does not grow with the
//! precision wanted here.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;

/// Highest RTT the histograms hold exactly (longer samples count as this), µs.
const MAX_US: u64 = 100_000_000;

/// RTT percentiles over many sessions (a merge of per-worker histograms, 3 significant digits).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RttPercentiles {
    /// Samples counted.
    pub samples: u64,
    /// Smallest sample.
    pub min: Duration,
    /// Median.
    pub p50: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// 99.9th percentile.
    pub p999: Duration,
    /// Largest sample.
    pub max: Duration,
    /// Mean.
    pub mean: Duration,
}

/// One worker's RTT histogram, shared with the server handle that merges them.
#[derive(Clone)]
pub(crate) struct WorkerRtt(Arc<Mutex<Histogram<u64>>>);

impl std::fmt::Debug for WorkerRtt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorkerRtt")
    }
}

impl WorkerRtt {
    pub(crate) fn new() -> Self {
        // Constant bounds: creation cannot fail.
        let h = Histogram::new_with_bounds(1, MAX_US, 3).expect("constant histogram bounds");
        WorkerRtt(Arc::new(Mutex::new(h)))
    }

    /// Record `samples` (one lock for the lot).
    pub(crate) fn record(&self, samples: impl Iterator<Item = Duration>) {
        let mut samples = samples.peekable();
        if samples.peek().is_none() {
            return;
        }
        let mut h = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for s in samples {
            let us = u64::try_from(s.as_micros()).unwrap_or(u64::MAX);
            h.saturating_record(us.clamp(1, MAX_US));
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Histogram<u64>) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Merges the workers' histograms into percentiles; with `reset`, empties them too (so the
/// next call covers only what came after this one).
pub(crate) fn merge(workers: &[WorkerRtt], reset: bool) -> RttPercentiles {
    let Some(first) = workers.first() else {
        return RttPercentiles::default();
    };
    let mut all = first.with(|h| Histogram::<u64>::new_from(h));
    for w in workers {
        w.with(|h| {
            // Same bounds everywhere: adding cannot fail.
            let _ = all.add(&*h);
            if reset {
                h.reset();
            }
        });
    }
    if all.is_empty() {
        return RttPercentiles::default();
    }
    let us = Duration::from_micros;
    RttPercentiles {
        samples: all.len(),
        min: us(all.min()),
        p50: us(all.value_at_quantile(0.50)),
        p90: us(all.value_at_quantile(0.90)),
        p99: us(all.value_at_quantile(0.99)),
        p999: us(all.value_at_quantile(0.999)),
        max: us(all.max()),
        mean: Duration::from_secs_f64(all.mean() / 1e6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_workers_and_resets() {
        let a = WorkerRtt::new();
        let b = WorkerRtt::new();
        a.record((1..=99).map(|_| Duration::from_micros(100)));
        b.record(std::iter::once(Duration::from_millis(50)));
        let p = merge(&[a.clone(), b.clone()], true);
        assert_eq!(p.samples, 100);
        assert_eq!(p.p50, Duration::from_micros(100));
        assert!(p.max >= Duration::from_millis(50) && p.max < Duration::from_millis(51));
        assert_eq!(merge(&[a, b], false).samples, 0, "reset empties them");
    }
}
