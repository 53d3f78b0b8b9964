//! One arm's run over time, for issue 38's chart of latency over time per lane: in bins of
//! [`BIN`] from the relay's start (the rate schedule's clock), the event latency and the
//! snapshot age of the messages *delivered* in the bin (p50 and largest), the snapshots
//! delivered, the relay's queue delay of the datagrams that left the bottleneck in the bin
//! (mean and largest) and the server sessions' rate estimate (median of the bin's samples).
//!
//! The bins cover the measured time and the drain after it, so a run holds
//! (seconds + drain) / [`BIN`] points per series. Each series is written on one line of the
//! JSON (an array, `null` for a bin without data).

use std::time::Duration;

use serde::{Serialize, Serializer};

use super::players::Arrival;
use crate::relay::{QueueSeries, QUEUE_BIN};

/// Width of a bin (the relay's queue bins, so that they line up).
pub const BIN: Duration = QUEUE_BIN;

/// One arm's run over time.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Series {
    /// Width of a bin, ms: bin `i` covers `[i × bin_ms, (i + 1) × bin_ms)` from the relay's
    /// start.
    pub bin_ms: u64,
    /// When the server stopped sending, ms from the relay's start (later bins: the drain).
    pub sending_until_ms: u64,
    /// Event latency (server send to player receive) of the events delivered in the bin,
    /// p50, µs.
    #[serde(serialize_with = "one_line")]
    pub event_p50_us: Vec<Option<u64>>,
    /// Event latency, largest in the bin, µs.
    #[serde(serialize_with = "one_line")]
    pub event_max_us: Vec<Option<u64>>,
    /// Snapshot age at delivery of the snapshots delivered in the bin, p50, µs.
    #[serde(serialize_with = "one_line")]
    pub snapshot_age_p50_us: Vec<Option<u64>>,
    /// Snapshot age at delivery, largest in the bin, µs.
    #[serde(serialize_with = "one_line")]
    pub snapshot_age_max_us: Vec<Option<u64>>,
    /// Snapshots delivered in the bin (every player).
    #[serde(serialize_with = "one_line")]
    pub snapshots_delivered: Vec<u64>,
    /// The relay's queue delay at the server-to-player bottleneck(s) of the datagrams that
    /// left it in the bin, mean, µs.
    #[serde(serialize_with = "one_line")]
    pub relay_queue_mean_us: Vec<Option<u64>>,
    /// The relay's queue delay, largest in the bin, µs.
    #[serde(serialize_with = "one_line")]
    pub relay_queue_max_us: Vec<Option<u64>>,
    /// The server sessions' rate estimate, median of the bin's samples (every session, every
    /// tick), bits per second; `null` where the controller gives none.
    #[serde(serialize_with = "one_line")]
    pub rate_estimate_bps: Vec<Option<u64>>,
}

/// Writes a series as compact JSON, so that a pretty-printed file keeps it on one line.
fn one_line<T: Serialize, S: Serializer>(v: &[T], s: S) -> Result<S::Ok, S::Error> {
    serde_json::value::to_raw_value(v)
        .map_err(serde::ser::Error::custom)?
        .serialize(s)
}

/// What one arm's run saw, with the clock it is binned on.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// The relay's start, host monotonic ns (offset zero of the bins).
    pub start_ns: u64,
    /// How long the server sent.
    pub sending: Duration,
    /// How long the players listened after that.
    pub drain: Duration,
    /// Every event delivered.
    pub events: &'a [Arrival],
    /// Every snapshot delivered.
    pub snapshots: &'a [Arrival],
    /// The relay's server-to-player queue delay, binned by departure (same bins).
    pub queue: Option<&'a QueueSeries>,
    /// (host monotonic ns, a session's rate estimate in bytes/s).
    pub estimates: &'a [(u64, u64)],
}

/// The p50 (rank ⌈n/2⌉, as the run's own percentiles) and the largest of `v`.
fn p50_max(v: &mut [u64]) -> (Option<u64>, Option<u64>) {
    if v.is_empty() {
        return (None, None);
    }
    v.sort_unstable();
    (Some(v[v.len().div_ceil(2) - 1]), v.last().copied())
}

impl Series {
    /// Bins what `o` saw.
    pub fn build(o: &Observed<'_>) -> Series {
        let bin_ns = BIN.as_nanos() as u64;
        let span = (o.sending + o.drain).as_nanos() as u64;
        let n = span.div_ceil(bin_ns) as usize;
        let bin_of = |at_ns: u64| {
            let i = (at_ns.checked_sub(o.start_ns)? / bin_ns) as usize;
            (i < n).then_some(i)
        };
        let latencies = |arrivals: &[Arrival]| {
            let mut bins = vec![Vec::new(); n];
            for a in arrivals {
                if let Some(i) = bin_of(a.recv_ns) {
                    bins[i].push(a.recv_ns.saturating_sub(a.sent_ns) / 1_000);
                }
            }
            bins
        };
        let mut s = Series {
            bin_ms: BIN.as_millis() as u64,
            sending_until_ms: o.sending.as_millis() as u64,
            ..Series::default()
        };
        for mut v in latencies(o.events) {
            let (p50, max) = p50_max(&mut v);
            s.event_p50_us.push(p50);
            s.event_max_us.push(max);
        }
        for mut v in latencies(o.snapshots) {
            s.snapshots_delivered.push(v.len() as u64);
            let (p50, max) = p50_max(&mut v);
            s.snapshot_age_p50_us.push(p50);
            s.snapshot_age_max_us.push(max);
        }
        let queue = o.queue.map(QueueSeries::bins).unwrap_or_default();
        for i in 0..n {
            let b = queue.get(i).filter(|b| b.departed > 0);
            s.relay_queue_mean_us.push(b.and_then(|b| b.mean_us()));
            s.relay_queue_max_us.push(b.map(|b| b.sojourn_max_us));
        }
        let mut estimates = vec![Vec::new(); n];
        for &(at, bytes_per_s) in o.estimates {
            if let Some(i) = bin_of(at) {
                estimates[i].push(bytes_per_s.saturating_mul(8));
            }
        }
        s.rate_estimate_bps = estimates
            .iter_mut()
            .map(|v| p50_max(v).0)
            .collect::<Vec<_>>();
        s
    }

    /// Bins in each series.
    pub fn len(&self) -> usize {
        self.event_p50_us.len()
    }

    /// Whether the series hold no bin.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::QueueSeries;

    const MS: u64 = 1_000_000;

    fn arrival(sent_ms: u64, recv_ms: u64) -> Arrival {
        Arrival {
            player: 0,
            seq: 0,
            sent_ns: 1_000 * MS + sent_ms * MS,
            recv_ns: 1_000 * MS + recv_ms * MS,
        }
    }

    #[test]
    fn deliveries_are_binned_by_arrival_and_serialized_one_series_a_line() {
        let events = [arrival(0, 30), arrival(50, 90), arrival(120, 150)];
        let snapshots = [
            arrival(10, 40),
            arrival(20, 60),
            arrival(30, 95),
            // Sent before the end, delivered in the drain's last bin; one after it is left out.
            arrival(290, 390),
            arrival(300, 450),
        ];
        let mut queue = QueueSeries::default();
        queue.record(Duration::from_millis(10), 4_000);
        queue.record(Duration::from_millis(20), 8_000);
        let estimates = [
            (1_000 * MS + 5 * MS, 125_000),
            (1_000 * MS + 205 * MS, 100_000),
        ];
        let s = Series::build(&Observed {
            start_ns: 1_000 * MS,
            sending: Duration::from_millis(300),
            drain: Duration::from_millis(100),
            events: &events,
            snapshots: &snapshots,
            queue: Some(&queue),
            estimates: &estimates,
        });
        assert_eq!(s.len(), 4);
        assert_eq!(s.event_p50_us, [Some(30_000), Some(30_000), None, None]);
        assert_eq!(s.event_max_us, [Some(40_000), Some(30_000), None, None]);
        assert_eq!(
            s.snapshot_age_p50_us,
            [Some(40_000), None, None, Some(100_000)]
        );
        assert_eq!(s.snapshot_age_max_us[0], Some(65_000));
        assert_eq!(s.snapshots_delivered, [3, 0, 0, 1]);
        assert_eq!(s.relay_queue_mean_us, [Some(6_000), None, None, None]);
        assert_eq!(s.relay_queue_max_us, [Some(8_000), None, None, None]);
        assert_eq!(
            s.rate_estimate_bps,
            [Some(1_000_000), None, Some(800_000), None]
        );
        let json = serde_json::to_string_pretty(&s).unwrap();
        assert!(
            json.contains("\"event_p50_us\": [30000,30000,null,null],\n"),
            "{json}"
        );
        assert!(json.contains("\"sending_until_ms\": 300,\n"), "{json}");
    }
}
