//! A bottleneck link: a rate limit (that a [`RateSchedule`] may change during a run) in front of
//! a drop-tail queue whose length is given in time.
//!
//! The model reads no clock: `now` is an argument, so the unit tests drive it on virtual time
//! and the relay on its real clock. A datagram offered at `now` is refused (dropped at the
//! tail) when the bytes already waiting (counting the one in service whole) plus its own would
//! exceed `rate(now) × buffer`; otherwise its departure time is fixed on arrival: it starts
//! when the one before it has left (or at once on an idle link) and takes `len / rate` to
//! serialize, integrated over the schedule, so a rate change in the middle of a datagram
//! applies to the rest of it. Its *sojourn* (departure − arrival) is the queue delay the
//! relay reports.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::queue_series::QueueSeries;

/// A send rate that changes at given times: `(offset from the start of the run, bytes per
/// second)`, sorted by offset, the first at offset zero, every rate above zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateSchedule {
    steps: Vec<(Duration, u64)>,
}

impl RateSchedule {
    /// A constant rate of `bytes_per_sec` (must be above zero).
    pub fn constant(bytes_per_sec: u64) -> anyhow::Result<Self> {
        Self::new(vec![(Duration::ZERO, bytes_per_sec)])
    }

    /// A schedule from its steps; fails unless the first is at zero, offsets increase and
    /// every rate is above zero.
    pub fn new(steps: Vec<(Duration, u64)>) -> anyhow::Result<Self> {
        match steps.first() {
            None => bail!("a rate schedule needs at least one rate"),
            Some((at, _)) if !at.is_zero() => {
                bail!("a rate schedule's first rate must start at 0s (it starts at {at:?})")
            }
            _ => {}
        }
        if steps.iter().any(|&(_, r)| r == 0) {
            bail!("every rate of a schedule must be above zero");
        }
        if steps.windows(2).any(|w| w[0].0 >= w[1].0) {
            bail!("a rate schedule's times must increase");
        }
        Ok(Self { steps })
    }

    /// The steps, `(offset, bytes per second)`.
    pub fn steps(&self) -> &[(Duration, u64)] {
        &self.steps
    }

    /// The rate in bytes per second at `offset` from the start.
    pub fn rate_at(&self, offset: Duration) -> u64 {
        let i = self.steps.partition_point(|&(at, _)| at <= offset);
        // The first step is at zero, so i >= 1.
        self.steps[i.saturating_sub(1)].1
    }

    /// The offset at which `bytes` have been sent when sending starts at `from` (rounded up to
    /// the next nanosecond).
    pub fn finish(&self, from: Duration, bytes: u64) -> Duration {
        // Work in byte-nanoseconds-per-second so that no segment loses a remainder.
        let mut left = u128::from(bytes) * 1_000_000_000;
        let mut t = from;
        let mut i = self.steps.partition_point(|&(at, _)| at <= from).max(1) - 1;
        loop {
            let rate = u128::from(self.steps[i].1);
            if let Some(&(next, _)) = self.steps.get(i + 1) {
                let span = (next - t).as_nanos();
                if span * rate < left {
                    left -= span * rate;
                    t = next;
                    i += 1;
                    continue;
                }
            }
            let nanos = left.div_ceil(rate);
            return t + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        }
    }
}

impl FromStr for RateSchedule {
    type Err = anyhow::Error;

    /// Parses `RATE[@TIME],...`, e.g. `4mbit@0s,1mbit@5s` or `1mbit`: rates in `bit`, `kbit`,
    /// `mbit` or `gbit` per second (decimal prefixes), times in `s` or `ms`; a rate without a
    /// time starts at zero.
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let mut steps = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            let (rate, at) = match part.split_once('@') {
                Some((r, t)) => (r, parse_time(t)?),
                None => (part, Duration::ZERO),
            };
            steps.push((at, parse_rate(rate)?));
        }
        Self::new(steps).with_context(|| format!("rate schedule {s:?}"))
    }
}

impl fmt::Display for RateSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, &(at, rate)) in self.steps.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}bit@{}ms", rate * 8, at.as_millis())?;
        }
        Ok(())
    }
}

/// `4mbit` → 500,000 bytes per second.
fn parse_rate(s: &str) -> anyhow::Result<u64> {
    let s = s.trim().to_ascii_lowercase();
    let (num, scale) = [("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)]
        .iter()
        .find_map(|&(unit, scale)| s.strip_suffix(unit).map(|n| (n, scale)))
        .ok_or_else(|| anyhow!("rate {s:?} needs a unit: bit, kbit, mbit or gbit"))?;
    let v: f64 = num.trim().parse().with_context(|| format!("rate {s:?}"))?;
    let bytes = v * scale / 8.0;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        bail!("rate {s:?} must be at least 8 bit/s");
    }
    Ok(bytes.round() as u64)
}

/// `5s`, `500ms` → a duration.
fn parse_time(s: &str) -> anyhow::Result<Duration> {
    let s = s.trim().to_ascii_lowercase();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else {
        bail!("time {s:?} needs a unit: s or ms");
    };
    let v: f64 = num.trim().parse().with_context(|| format!("time {s:?}"))?;
    Duration::try_from_secs_f64(v * scale).with_context(|| format!("time {s:?}"))
}

/// A bottleneck's settings: the rate over time and the drop-tail buffer's length in time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BottleneckConfig {
    /// The rate, changing at given offsets from the relay's start.
    pub schedule: RateSchedule,
    /// Buffer length: at most `rate(now) × buffer` bytes wait (including the one in service).
    pub buffer: Duration,
}

impl BottleneckConfig {
    /// A bottleneck with `schedule` and a `buffer` that drains in that long.
    pub fn new(schedule: RateSchedule, buffer: Duration) -> Self {
        Self { schedule, buffer }
    }

    /// The buffer's capacity in bytes at `offset`: rate × buffer length, at least one byte.
    pub fn capacity_at(&self, offset: Duration) -> u64 {
        let rate = u128::from(self.schedule.rate_at(offset));
        u64::try_from(rate * self.buffer.as_nanos() / 1_000_000_000)
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

/// Sojourn histogram range: 1 µs to 60 s.
const SOJOURN_MAX_US: u64 = 60_000_000;

/// What a bottleneck reports (serializable for the bench JSON).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BottleneckCounters {
    /// Datagrams offered.
    pub offered: u64,
    /// Datagrams dropped at the tail (buffer full).
    pub dropped: u64,
    /// Bytes dropped at the tail.
    pub dropped_bytes: u64,
    /// Datagrams that left the bottleneck.
    pub departed: u64,
    /// Bytes that left the bottleneck.
    pub departed_bytes: u64,
    /// Bytes waiting now (including the one in service).
    pub queued_bytes: u64,
    /// Most bytes seen waiting.
    pub peak_bytes: u64,
    /// Queue delay (sojourn: departure − arrival) of the departed datagrams, µs: median.
    pub sojourn_p50_us: u64,
    /// Sojourn, 99th percentile, µs.
    pub sojourn_p99_us: u64,
    /// Sojourn, maximum, µs.
    pub sojourn_max_us: u64,
}

impl BottleneckCounters {
    /// Adds `other`'s counts into `self`; percentiles are not additive: the larger is kept
    /// (a bound over several bottlenecks, not a merged percentile).
    pub fn merge(&mut self, other: &BottleneckCounters) {
        self.offered += other.offered;
        self.dropped += other.dropped;
        self.dropped_bytes += other.dropped_bytes;
        self.departed += other.departed;
        self.departed_bytes += other.departed_bytes;
        self.queued_bytes += other.queued_bytes;
        self.peak_bytes += other.peak_bytes;
        self.sojourn_p50_us = self.sojourn_p50_us.max(other.sojourn_p50_us);
        self.sojourn_p99_us = self.sojourn_p99_us.max(other.sojourn_p99_us);
        self.sojourn_max_us = self.sojourn_max_us.max(other.sojourn_max_us);
    }
}

/// One waiting datagram.
#[derive(Debug)]
struct Waiting<T> {
    arrival: Instant,
    departure: Instant,
    len: u64,
    item: T,
}

/// The bottleneck of one route and direction (or of all routes, shared): a rate limit in
/// front of a drop-tail queue measured in time.
#[derive(Debug)]
pub struct Bottleneck<T> {
    cfg: BottleneckConfig,
    /// Offset zero of the schedule.
    start: Instant,
    queue: VecDeque<Waiting<T>>,
    /// Bytes in `queue` (some may have departed already at a given `now`).
    held_bytes: u64,
    sojourn: Histogram<u64>,
    /// The sojourns again, binned by departure time.
    series: QueueSeries,
    counters: BottleneckCounters,
}

impl<T> Bottleneck<T> {
    /// A bottleneck whose schedule starts at `start`.
    pub fn new(cfg: BottleneckConfig, start: Instant) -> anyhow::Result<Self> {
        if cfg.buffer.is_zero() {
            bail!("a bottleneck's buffer must be longer than zero");
        }
        Ok(Self {
            cfg,
            start,
            queue: VecDeque::new(),
            held_bytes: 0,
            sojourn: Histogram::new_with_bounds(1, SOJOURN_MAX_US, 2)
                .context("sojourn histogram")?,
            series: QueueSeries::default(),
            counters: BottleneckCounters::default(),
        })
    }

    fn offset(&self, t: Instant) -> Duration {
        t.saturating_duration_since(self.start)
    }

    /// Bytes still waiting at `now` (departed ones may still sit in the queue until popped).
    pub fn queued_bytes(&self, now: Instant) -> u64 {
        let gone: u64 = self
            .queue
            .iter()
            .take_while(|w| w.departure <= now)
            .map(|w| w.len)
            .sum();
        self.held_bytes - gone
    }

    /// Offers a datagram of `len` bytes at `now`: its departure time, or `None` if the buffer
    /// is full (dropped at the tail, counted). `now` must not go back in time.
    pub fn offer(&mut self, now: Instant, len: usize, item: T) -> Option<Instant> {
        let len = len as u64;
        self.counters.offered += 1;
        let waiting = self.queued_bytes(now);
        if waiting + len > self.cfg.capacity_at(self.offset(now)) {
            self.counters.dropped += 1;
            self.counters.dropped_bytes += len;
            return None;
        }
        let begin = match self.queue.back() {
            Some(last) if last.departure > now => last.departure,
            _ => now,
        };
        let done = self.cfg.schedule.finish(self.offset(begin), len);
        let departure = self.start + done;
        self.queue.push_back(Waiting {
            arrival: now,
            departure,
            len,
            item,
        });
        self.held_bytes += len;
        self.counters.peak_bytes = self.counters.peak_bytes.max(waiting + len);
        Some(departure)
    }

    /// When the next datagram leaves.
    pub fn next_departure(&self) -> Option<Instant> {
        self.queue.front().map(|w| w.departure)
    }

    /// The next datagram that has left by `now`, with its departure time (its sojourn is
    /// recorded).
    pub fn pop_departed(&mut self, now: Instant) -> Option<(Instant, T)> {
        if self.queue.front()?.departure > now {
            return None;
        }
        let w = self.queue.pop_front()?;
        self.held_bytes -= w.len;
        self.counters.departed += 1;
        self.counters.departed_bytes += w.len;
        let us = w.departure.saturating_duration_since(w.arrival).as_micros();
        let us = u64::try_from(us).unwrap_or(u64::MAX);
        self.sojourn.saturating_record(us.max(1));
        self.series.record(self.offset(w.departure), us);
        Some((w.departure, w.item))
    }

    /// The sojourns of the datagrams departed so far, binned by departure time.
    pub fn queue_series(&self) -> &QueueSeries {
        &self.series
    }

    /// The counters, with the sojourn percentiles of the datagrams departed so far.
    pub fn counters(&self, now: Instant) -> BottleneckCounters {
        let mut c = self.counters;
        c.queued_bytes = self.queued_bytes(now);
        if !self.sojourn.is_empty() {
            c.sojourn_p50_us = self.sojourn.value_at_quantile(0.5);
            c.sojourn_p99_us = self.sojourn.value_at_quantile(0.99);
            c.sojourn_max_us = self.sojourn.max();
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn mbit(m: u64) -> u64 {
        m * 1_000_000 / 8
    }

    #[test]
    fn schedules_parse_and_reject_nonsense() {
        let s: RateSchedule = "4mbit@0s,1mbit@5s".parse().unwrap();
        assert_eq!(
            s.steps(),
            &[(Duration::ZERO, mbit(4)), (Duration::from_secs(5), mbit(1))]
        );
        assert_eq!(s.rate_at(Duration::from_millis(4999)), mbit(4));
        assert_eq!(s.rate_at(Duration::from_secs(5)), mbit(1));
        assert_eq!(
            "1mbit".parse::<RateSchedule>().unwrap().steps()[0].1,
            125_000
        );
        assert_eq!(
            "800kbit@0ms, 10Mbit@250ms"
                .parse::<RateSchedule>()
                .unwrap()
                .steps()[1],
            (Duration::from_millis(250), 1_250_000)
        );
        for bad in [
            "",
            "4mbit@1s",
            "1mbit@0s,2mbit@0s",
            "0mbit",
            "4mb",
            "x@0s",
            "1mbit@5",
        ] {
            assert!(bad.parse::<RateSchedule>().is_err(), "{bad:?}");
        }
        let round = s.to_string().parse::<RateSchedule>().unwrap();
        assert_eq!(round, s);
    }

    #[test]
    fn serialization_spans_a_rate_change() {
        // 1,000 B/s then 100 B/s from 1 s: 600 B from 0.5 s take 0.5 s for 500 B, then 1 s.
        let s =
            RateSchedule::new(vec![(Duration::ZERO, 1000), (Duration::from_secs(1), 100)]).unwrap();
        assert_eq!(
            s.finish(Duration::from_millis(500), 600),
            Duration::from_secs(2)
        );
        assert_eq!(
            s.finish(Duration::from_secs(3), 1),
            Duration::from_millis(3010)
        );
    }

    #[test]
    fn a_saturated_link_departs_at_the_rate_and_drops_at_the_tail() {
        // 1 Mbit/s, 100 ms buffer = 12,500 B: five 2,400 B datagrams fit, the sixth does not.
        let t0 = Instant::now();
        let cfg = BottleneckConfig::new(RateSchedule::constant(mbit(1)).unwrap(), 100 * MS);
        assert_eq!(cfg.capacity_at(Duration::ZERO), 12_500);
        let mut b = Bottleneck::new(cfg, t0).unwrap();
        let mut departures = Vec::new();
        for i in 0..6 {
            departures.push(b.offer(t0, 2400, i));
        }
        assert_eq!(departures[5], None);
        // 2,400 B at 125,000 B/s = 19.2 ms each, back to back.
        for (i, d) in departures[..5].iter().enumerate() {
            assert_eq!(
                *d,
                Some(t0 + Duration::from_micros(19_200 * (i as u64 + 1)))
            );
        }
        assert_eq!(b.pop_departed(t0 + 19 * MS), None);
        assert_eq!(b.queued_bytes(t0 + 20 * MS), 4 * 2400);
        // Room again after the first left: the sixth is accepted and waits behind the rest.
        assert_eq!(
            b.offer(t0 + 20 * MS, 2400, 5),
            Some(t0 + Duration::from_micros(19_200 * 6))
        );
        let mut got = Vec::new();
        while let Some((_, i)) = b.pop_departed(t0 + Duration::from_secs(1)) {
            got.push(i);
        }
        assert_eq!(got, vec![0, 1, 2, 3, 4, 5]);
        let c = b.counters(t0 + Duration::from_secs(1));
        assert_eq!((c.offered, c.dropped, c.departed), (7, 1, 6));
        assert_eq!((c.queued_bytes, c.peak_bytes), (0, 12_000));
        // Sojourns 19.2, 38.4, ... 96 ms and (115.2 − 20) ms: the median is the third.
        let p50 = c.sojourn_p50_us;
        assert!((57_000..=58_000).contains(&p50), "{p50}");
        assert!((95_000..=96_500).contains(&c.sojourn_max_us), "{c:?}");
        // Over time: five departures in the first 100 ms (19.2 … 96 ms), the sixth at 115.2 ms.
        let bins = b.queue_series().bins();
        assert_eq!(bins.len(), 2);
        assert_eq!((bins[0].departed, bins[1].departed), (5, 1));
        assert_eq!(bins[0].sojourn_max_us, 96_000);
        assert_eq!(bins[0].mean_us(), Some(57_600));
        assert_eq!(bins[1].sojourn_max_us, 95_200);
    }

    #[test]
    fn offered_load_above_the_rate_delivers_the_rate_with_a_full_buffer() {
        // 1.2 Mbit/s offered (2,400 B at 60 Hz... rounded to a 16.667 ms period) into 1 Mbit/s.
        let t0 = Instant::now();
        let cfg = BottleneckConfig::new(RateSchedule::constant(mbit(1)).unwrap(), 100 * MS);
        let mut b = Bottleneck::new(cfg, t0).unwrap();
        let period = Duration::from_nanos(16_666_667);
        let mut delivered = 0u64;
        for i in 0..600u32 {
            let now = t0 + period * i;
            while b.pop_departed(now).is_some() {
                delivered += 2400;
            }
            b.offer(now, 2400, ());
        }
        let end = t0 + period * 600;
        while b.pop_departed(end).is_some() {
            delivered += 2400;
        }
        let secs = (period * 600).as_secs_f64();
        let rate = delivered as f64 / secs;
        assert!((rate - 125_000.0).abs() < 125_000.0 * 0.01, "{rate}");
        let c = b.counters(end);
        assert!(c.dropped > 0);
        // The buffer stays nearly full: queue delay near 100 ms.
        assert!(
            c.sojourn_p50_us > 80_000 && c.sojourn_p99_us <= 100_500,
            "{c:?}"
        );
    }

    #[test]
    fn a_rate_step_shrinks_the_buffer_and_slows_departures() {
        let t0 = Instant::now();
        let cfg = BottleneckConfig::new("4mbit@0s,1mbit@5s".parse().unwrap(), 100 * MS);
        assert_eq!(cfg.capacity_at(Duration::ZERO), 50_000);
        assert_eq!(cfg.capacity_at(Duration::from_secs(5)), 12_500);
        let mut b = Bottleneck::new(cfg, t0).unwrap();
        // Before the step 1,000 B take 2 ms; after it, 8 ms.
        assert_eq!(b.offer(t0, 1000, ()), Some(t0 + 2 * MS));
        let after = t0 + Duration::from_secs(5);
        assert_eq!(b.offer(after, 1000, ()), Some(after + 8 * MS));
        // A datagram in service across the step: 1,000 B from 4.999 s: 1 ms at 4 Mbit/s
        // sends 500 B, the other 500 B take 4 ms.
        let mut c = Bottleneck::new(
            BottleneckConfig::new("4mbit@0s,1mbit@5s".parse().unwrap(), 100 * MS),
            t0,
        )
        .unwrap();
        let just_before = after - MS;
        assert_eq!(c.offer(just_before, 1000, ()), Some(after + 4 * MS));
        // Thirteen 1,000 B datagrams fill 12,500 B after the step: the thirteenth is refused.
        let mut d = Bottleneck::new(
            BottleneckConfig::new("4mbit@0s,1mbit@5s".parse().unwrap(), 100 * MS),
            t0,
        )
        .unwrap();
        let accepted = (0..13)
            .filter(|_| d.offer(after, 1000, ()).is_some())
            .count();
        assert_eq!(accepted, 12);
    }

    #[test]
    fn a_zero_buffer_is_refused() {
        let cfg = BottleneckConfig::new(RateSchedule::constant(1000).unwrap(), Duration::ZERO);
        assert!(Bottleneck::<()>::new(cfg, Instant::now()).is_err());
    }
}
