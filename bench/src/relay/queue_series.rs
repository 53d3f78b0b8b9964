//! A bottleneck's queue delay over time: for each bin of [`QUEUE_BIN`] from the schedule's
//! start, the datagrams that departed in it, their summed and their largest sojourn. Bins of
//! several bottlenecks merge (counts and sums add, the larger maximum is kept), so the
//! per-route bottlenecks of one direction make one series.

use std::time::Duration;

/// Width of one bin.
pub const QUEUE_BIN: Duration = Duration::from_millis(100);

/// Bins kept: ten minutes; later departures are left out, so a long-running relay holds at
/// most this many.
const MAX_BINS: usize = 6_000;

/// The departures of one bin.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueBin {
    /// Datagrams that departed in the bin.
    pub departed: u64,
    /// Their sojourns summed, µs.
    pub sojourn_sum_us: u64,
    /// The largest of them, µs.
    pub sojourn_max_us: u64,
}

impl QueueBin {
    /// The mean sojourn, µs (`None` when nothing departed).
    pub fn mean_us(&self) -> Option<u64> {
        (self.departed > 0).then(|| self.sojourn_sum_us / self.departed)
    }
}

/// Queue delay by departure time, in bins of [`QUEUE_BIN`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueSeries {
    bins: Vec<QueueBin>,
}

impl QueueSeries {
    /// Records a datagram that departed `offset` after the schedule's start, after waiting
    /// `sojourn_us`.
    pub fn record(&mut self, offset: Duration, sojourn_us: u64) {
        let i = (offset.as_nanos() / QUEUE_BIN.as_nanos()) as usize;
        if i >= MAX_BINS {
            return;
        }
        if self.bins.len() <= i {
            self.bins.resize(i + 1, QueueBin::default());
        }
        let b = &mut self.bins[i];
        b.departed += 1;
        b.sojourn_sum_us = b.sojourn_sum_us.saturating_add(sojourn_us);
        b.sojourn_max_us = b.sojourn_max_us.max(sojourn_us);
    }

    /// Adds `other`'s bins into these.
    pub fn merge(&mut self, other: &QueueSeries) {
        if self.bins.len() < other.bins.len() {
            self.bins.resize(other.bins.len(), QueueBin::default());
        }
        for (a, b) in self.bins.iter_mut().zip(&other.bins) {
            a.departed += b.departed;
            a.sojourn_sum_us = a.sojourn_sum_us.saturating_add(b.sojourn_sum_us);
            a.sojourn_max_us = a.sojourn_max_us.max(b.sojourn_max_us);
        }
    }

    /// The bins from the start up to the last departure; bin `i` covers
    /// `[i × QUEUE_BIN, (i + 1) × QUEUE_BIN)`.
    pub fn bins(&self) -> &[QueueBin] {
        &self.bins
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn departures_land_in_their_bin_and_bins_merge() {
        let mut a = QueueSeries::default();
        a.record(5 * MS, 1_000);
        a.record(99 * MS, 3_000);
        a.record(250 * MS, 7_000);
        assert_eq!(a.bins().len(), 3);
        assert_eq!(a.bins()[0].mean_us(), Some(2_000));
        assert_eq!(a.bins()[0].sojourn_max_us, 3_000);
        assert_eq!(a.bins()[1].mean_us(), None);
        assert_eq!(a.bins()[2].departed, 1);
        let mut b = QueueSeries::default();
        b.record(401 * MS, 9_000);
        b.record(50 * MS, 5_000);
        a.merge(&b);
        assert_eq!(a.bins().len(), 5);
        assert_eq!(a.bins()[0].departed, 3);
        assert_eq!(a.bins()[0].mean_us(), Some(3_000));
        assert_eq!(a.bins()[0].sojourn_max_us, 5_000);
        assert_eq!(a.bins()[4].sojourn_max_us, 9_000);
        // A departure beyond the kept range is left out, not a growth without bound.
        a.record(QUEUE_BIN * MAX_BINS as u32, 1);
        assert_eq!(a.bins().len(), 5);
    }
}
