//! The impairment model: configuration, named profiles and the per-direction decision logic.
//!
//! [`ImpairedLink`] decides, for each datagram offered to one direction of one route, whether it is
//! dropped (and why) or when it (and possibly a duplicate) is delivered. It reads no clock: `now` is
//! an argument, so the same code drives the simulator's virtual clock and the bench relay's real
//! one.

use std::fmt;
use std::num::NonZeroU64;
use std::str::FromStr;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Default queue capacity of one link direction in bytes (8 MiB, as the reference relay).
pub const DEFAULT_QUEUE_BYTES: usize = 8 * 1024 * 1024;
/// Default queue capacity of one link direction in datagrams (8,192, as the reference relay).
pub const DEFAULT_QUEUE_DATAGRAMS: usize = 8192;

/// Burst loss: in every window of `period` consecutive datagrams offered to a link direction, one
/// run of `len` consecutive datagrams is dropped.
///
/// Windows are aligned to the link's datagram count (datagrams `0..period`, `period..2*period`,
/// ...). The run's start offset inside each window is drawn uniformly from `0..=period - len` by
/// the link's seeded RNG when the window's first datagram arrives, so every complete window loses
/// exactly `len` datagrams, all consecutive. Runs of adjacent windows may touch (a run at the end
/// of one window followed by a run at the start of the next), giving at most `2 * len` in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BurstLoss {
    /// Datagrams dropped in a row (N).
    pub len: u32,
    /// Window length in datagrams (P); `len <= period`, `period > 0`.
    pub period: u32,
}

/// Impairments of one link direction. All probabilities are per datagram, in `0.0..=1.0`.
///
/// The order of decisions for one offered datagram: burst loss, then random loss of the datagrams
/// the burst spared, then queue admission (a full queue drops: overflow), then the delivery time
/// (rate-limit serialization, one-way `delay`, plus `reorder_delay` for a `reorder` share), then an
/// optional duplicate, which is admitted, serialized and possibly reordered like an independent
/// copy. Drops happen at the link's ingress: dropped datagrams use neither queue nor rate.
#[derive(Debug, Clone, PartialEq)]
pub struct Impairment {
    /// Probability that a datagram (not already dropped by a burst) is lost.
    pub loss: f64,
    /// Deterministic-count burst loss, per direction.
    pub burst: Option<BurstLoss>,
    /// One-way propagation delay added to every delivered copy.
    pub delay: Duration,
    /// Share of delivered copies that get `reorder_delay` on top of `delay` (reordering).
    pub reorder: f64,
    /// Extra delay of the reordered share.
    pub reorder_delay: Duration,
    /// Probability that a delivered datagram is also delivered a second time.
    pub duplicate: f64,
    /// Capacity in bytes of the copies held by the link (admitted, not yet departed).
    pub queue_bytes: usize,
    /// Capacity in datagrams of the copies held by the link.
    pub queue_datagrams: usize,
    /// Optional bottleneck rate in bytes per second: a copy occupies the link for
    /// `len / rate` (exact, with the sub-nanosecond remainder carried) before its delay starts.
    pub rate: Option<NonZeroU64>,
}

/// An invalid [`Impairment`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ImpairmentError {
    /// A probability outside `0.0..=1.0` (or NaN).
    #[error("{name} must be a probability in 0..=1, got {value}")]
    Probability {
        /// Which field.
        name: &'static str,
        /// The rejected value.
        value: f64,
    },
    /// A burst with `period == 0` or `len > period`.
    #[error("burst loss needs 0 < period and len <= period, got {len} per {period}")]
    Burst {
        /// Datagrams per run.
        len: u32,
        /// Window length.
        period: u32,
    },
    /// A zero queue capacity: the link could never carry a datagram.
    #[error("queue capacity must be at least one datagram and one byte")]
    ZeroQueue,
}

impl Impairment {
    /// No impairment: no loss, no delay, no duplicates; default queue caps, no rate limit.
    pub fn none() -> Self {
        Self {
            loss: 0.0,
            burst: None,
            delay: Duration::ZERO,
            reorder: 0.0,
            reorder_delay: Duration::ZERO,
            duplicate: 0.0,
            queue_bytes: DEFAULT_QUEUE_BYTES,
            queue_datagrams: DEFAULT_QUEUE_DATAGRAMS,
            rate: None,
        }
    }

    /// Sets the random loss probability.
    pub fn with_loss(mut self, p: f64) -> Self {
        self.loss = p;
        self
    }

    /// Sets burst loss to `len` consecutive datagrams per `period` (see [`BurstLoss`]).
    pub fn with_burst(mut self, len: u32, period: u32) -> Self {
        self.burst = Some(BurstLoss { len, period });
        self
    }

    /// Sets the one-way delay.
    pub fn with_delay(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }

    /// Delays a `share` of copies by `extra` on top of the one-way delay.
    pub fn with_reorder(mut self, share: f64, extra: Duration) -> Self {
        self.reorder = share;
        self.reorder_delay = extra;
        self
    }

    /// Sets the duplication probability.
    pub fn with_duplicate(mut self, p: f64) -> Self {
        self.duplicate = p;
        self
    }

    /// Sets the queue capacity in bytes and datagrams.
    pub fn with_queue(mut self, bytes: usize, datagrams: usize) -> Self {
        self.queue_bytes = bytes;
        self.queue_datagrams = datagrams;
        self
    }

    /// Limits the rate to `bytes_per_sec` (`0` removes the limit).
    pub fn with_rate(mut self, bytes_per_sec: u64) -> Self {
        self.rate = NonZeroU64::new(bytes_per_sec);
        self
    }

    /// Checks probabilities, burst shape and queue capacities.
    pub fn validate(&self) -> Result<(), ImpairmentError> {
        for (name, value) in [
            ("loss", self.loss),
            ("reorder", self.reorder),
            ("duplicate", self.duplicate),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(ImpairmentError::Probability { name, value });
            }
        }
        if let Some(b) = self.burst {
            if b.period == 0 || b.len > b.period {
                return Err(ImpairmentError::Burst {
                    len: b.len,
                    period: b.period,
                });
            }
        }
        if self.queue_bytes == 0 || self.queue_datagrams == 0 {
            return Err(ImpairmentError::ZeroQueue);
        }
        Ok(())
    }

    /// Whether per-datagram random draws are needed (any probability above zero).
    fn draws_per_datagram(&self) -> bool {
        self.loss > 0.0 || self.duplicate > 0.0 || self.reorder > 0.0
    }
}

impl Default for Impairment {
    fn default() -> Self {
        Self::none()
    }
}

/// The named network conditions of the reference library's RUDP report, whose figures
/// `PERFORMANCE.md` shows next to ours.
///
/// | profile | loss | one-way delay | duplicates / reordering |
/// | --- | --- | --- | --- |
/// | `none` | 0 | 0 ms | 0 |
/// | `random` | 5% per datagram | 10 ms | 1% duplicated; 5% delayed by another 15 ms |
/// | `burst` | 3 consecutive per 100, per direction ([`BurstLoss`]) | 10 ms | same as `random` |
/// | `sustained` | `burst` plus 2% random loss of the remaining datagrams | 10 ms | same as `random` |
///
/// Every profile keeps the default queue caps ([`DEFAULT_QUEUE_BYTES`],
/// [`DEFAULT_QUEUE_DATAGRAMS`]) and no rate limit. `burst` and `sustained` draw the same RNG values
/// for the same seed, so a `sustained` link drops exactly the bursts a `burst` link drops, plus
/// its random share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Profile {
    /// No impairment.
    None,
    /// 5% random loss, 10 ms, 1% duplicates, 5% delayed by another 15 ms.
    Random,
    /// 3 consecutive per 100 per direction, 10 ms, 1% duplicates, 5% delayed by another 15 ms.
    Burst,
    /// `Burst` plus 2% random loss.
    Sustained,
}

impl Profile {
    /// All profiles, in the order of the reference report.
    pub const ALL: [Profile; 4] = [
        Profile::None,
        Profile::Random,
        Profile::Burst,
        Profile::Sustained,
    ];

    /// The profile's name as accepted by [`FromStr`] (`none`, `random`, `burst`, `sustained`).
    pub fn name(self) -> &'static str {
        match self {
            Profile::None => "none",
            Profile::Random => "random",
            Profile::Burst => "burst",
            Profile::Sustained => "sustained",
        }
    }

    /// The impairment of one link direction under this profile.
    pub fn impairment(self) -> Impairment {
        let shaped = Impairment::none()
            .with_delay(Duration::from_millis(10))
            .with_duplicate(0.01)
            .with_reorder(0.05, Duration::from_millis(15));
        match self {
            Profile::None => Impairment::none(),
            Profile::Random => shaped.with_loss(0.05),
            Profile::Burst => shaped.with_burst(3, 100),
            Profile::Sustained => shaped.with_burst(3, 100).with_loss(0.02),
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown profile name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown network profile {0:?} (expected none, random, burst or sustained)")]
pub struct ParseProfileError(pub String);

impl FromStr for Profile {
    type Err = ParseProfileError;

    /// Parses `none`, `random`, `burst` or `sustained`, ignoring ASCII case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Profile::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| ParseProfileError(s.to_owned()))
    }
}

/// One direction of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// From the route's first endpoint to its second (client to server in the relay).
    Forward,
    /// From the route's second endpoint to its first (server to client in the relay).
    Backward,
}

/// The 32-byte ChaCha key of the RNG stream of (`seed`, `route`, `direction`).
///
/// A keyed derivation (BLAKE3) so that neighbouring seeds and routes give unrelated streams.
pub fn link_rng_key(seed: u64, route: u64, direction: Direction) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key("ricochet sim link rng v1");
    h.update(&seed.to_le_bytes());
    h.update(&route.to_le_bytes());
    h.update(&[direction as u8]);
    *h.finalize().as_bytes()
}

/// Why a datagram was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropCause {
    /// Random loss.
    Random,
    /// Part of a burst-loss run.
    Burst,
    /// The link's queue was full (bytes or datagrams).
    Overflow,
}

/// The decision for one offered datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The datagram is lost.
    Drop(DropCause),
    /// The datagram arrives at `at`, and a duplicate at `duplicate` if there is one. Each copy
    /// holds `len` bytes of queue until the caller reports it with
    /// [`ImpairedLink::on_departed`].
    Deliver {
        /// Delivery time of the datagram.
        at: Instant,
        /// Delivery time of the duplicate, if any.
        duplicate: Option<Instant>,
    },
}

impl Verdict {
    /// The delivery times of every copy (none, one or two).
    pub fn delivery_times(&self) -> impl Iterator<Item = Instant> {
        let (a, b) = match *self {
            Verdict::Drop(_) => (None, None),
            Verdict::Deliver { at, duplicate } => (Some(at), duplicate),
        };
        a.into_iter().chain(b)
    }
}

/// Counters of one link direction (or, after [`merge`](LinkCounters::merge), of several).
///
/// `offered` = `dropped_random + dropped_burst + dropped_overflow` + datagrams delivered at least
/// once. `forwarded` counts scheduled copies, so it includes `duplicated`; `overflows` counts every
/// copy the queue refused, so it is `dropped_overflow` plus refused duplicates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkCounters {
    /// Datagrams offered to the link.
    pub offered: u64,
    /// Bytes offered to the link.
    pub offered_bytes: u64,
    /// Copies scheduled for delivery (originals and duplicates).
    pub forwarded: u64,
    /// Bytes of the copies scheduled for delivery.
    pub forwarded_bytes: u64,
    /// Copies reported departed through [`ImpairedLink::on_departed`].
    pub departed: u64,
    /// Datagrams dropped by random loss.
    pub dropped_random: u64,
    /// Datagrams dropped by burst loss.
    pub dropped_burst: u64,
    /// Datagrams dropped because the queue was full.
    pub dropped_overflow: u64,
    /// Duplicates scheduled.
    pub duplicated: u64,
    /// Copies given the extra reordering delay.
    pub delayed: u64,
    /// Copies (originals or duplicates) refused by a full queue.
    pub overflows: u64,
    /// Bytes held now (admitted, not yet departed).
    pub queue_bytes: u64,
    /// Datagrams held now.
    pub queue_datagrams: u64,
    /// Highest `queue_bytes` seen.
    pub queue_peak_bytes: u64,
    /// Highest `queue_datagrams` seen.
    pub queue_peak_datagrams: u64,
}

impl LinkCounters {
    /// Datagrams dropped for any cause.
    pub fn dropped(&self) -> u64 {
        self.dropped_random + self.dropped_burst + self.dropped_overflow
    }

    /// Share of offered datagrams that were dropped (0 when nothing was offered).
    pub fn realized_loss(&self) -> f64 {
        if self.offered == 0 {
            0.0
        } else {
            self.dropped() as f64 / self.offered as f64
        }
    }

    /// Adds `other` into `self`. Peaks are summed, like the reference's "route peaks sum": the
    /// result bounds the simultaneous total, the individual peaks may occur at different times.
    pub fn merge(&mut self, other: &LinkCounters) {
        self.offered += other.offered;
        self.offered_bytes += other.offered_bytes;
        self.forwarded += other.forwarded;
        self.forwarded_bytes += other.forwarded_bytes;
        self.departed += other.departed;
        self.dropped_random += other.dropped_random;
        self.dropped_burst += other.dropped_burst;
        self.dropped_overflow += other.dropped_overflow;
        self.duplicated += other.duplicated;
        self.delayed += other.delayed;
        self.overflows += other.overflows;
        self.queue_bytes += other.queue_bytes;
        self.queue_datagrams += other.queue_datagrams;
        self.queue_peak_bytes += other.queue_peak_bytes;
        self.queue_peak_datagrams += other.queue_peak_datagrams;
    }
}

/// The impairment decisions of one direction of one route, with its queue accounting.
///
/// Deterministic: the verdicts depend only on the impairment, the RNG key, and the sequence of
/// `(now, len)` offered and departures reported. RNG use per offered datagram is fixed: one draw
/// for the burst offset at the start of each burst window (if bursts are on), then four uniform
/// draws (loss, duplicate, reorder of the original, reorder of the duplicate) if any probability
/// is above zero, whatever the outcome, so changing one probability does not shift the others'
/// decisions.
///
/// Use on a real clock (the bench relay): call [`admit`](Self::admit) with `Instant::now()` when a
/// datagram arrives, send each copy at its delivery time, and call
/// [`on_departed`](Self::on_departed) for each copy sent.
#[derive(Debug, Clone)]
pub struct ImpairedLink {
    imp: Impairment,
    key: [u8; 32],
    /// Created on first use, so a link that never draws (profile `none`) stays small.
    rng: Option<Box<ChaCha8Rng>>,
    /// Datagrams offered so far (the index of the next one).
    index: u64,
    /// The burst window whose run start was drawn, and that run's absolute start index.
    burst_window: Option<(u64, u64)>,
    /// With a rate limit: when the link finishes serializing what it holds.
    busy_until: Option<Instant>,
    /// Remainder (in 1/rate ns) of the last serialization time, so long runs do not drift.
    carry: u64,
    counters: LinkCounters,
}

impl ImpairedLink {
    /// A link direction with `impairment`, its RNG keyed by (`seed`, `route`, `direction`).
    pub fn new(
        impairment: Impairment,
        seed: u64,
        route: u64,
        direction: Direction,
    ) -> Result<Self, ImpairmentError> {
        Self::with_key(impairment, link_rng_key(seed, route, direction))
    }

    /// A link direction with an explicit 32-byte RNG key.
    pub fn with_key(impairment: Impairment, key: [u8; 32]) -> Result<Self, ImpairmentError> {
        impairment.validate()?;
        Ok(Self::from_valid_key(impairment, key))
    }

    /// [`new`](Self::new) for an impairment the caller already validated.
    pub(crate) fn from_valid(
        impairment: Impairment,
        seed: u64,
        route: u64,
        direction: Direction,
    ) -> Self {
        Self::from_valid_key(impairment, link_rng_key(seed, route, direction))
    }

    fn from_valid_key(impairment: Impairment, key: [u8; 32]) -> Self {
        Self {
            imp: impairment,
            key,
            rng: None,
            index: 0,
            burst_window: None,
            busy_until: None,
            carry: 0,
            counters: LinkCounters::default(),
        }
    }

    /// The current impairment.
    pub fn impairment(&self) -> &Impairment {
        &self.imp
    }

    /// Replaces the impairment; the RNG stream, queue contents and counters carry on.
    pub fn set_impairment(&mut self, impairment: Impairment) -> Result<(), ImpairmentError> {
        impairment.validate()?;
        if impairment.burst != self.imp.burst {
            self.burst_window = None;
        }
        self.imp = impairment;
        Ok(())
    }

    /// The counters so far.
    pub fn counters(&self) -> &LinkCounters {
        &self.counters
    }

    fn rng(&mut self) -> &mut ChaCha8Rng {
        let key = self.key;
        self.rng
            .get_or_insert_with(|| Box::new(ChaCha8Rng::from_seed(key)))
    }

    /// Decides the fate of one datagram of `len` bytes offered at `now`.
    pub fn admit(&mut self, now: Instant, len: usize) -> Verdict {
        let i = self.index;
        self.index += 1;
        self.counters.offered += 1;
        self.counters.offered_bytes += len as u64;

        let in_burst = match self.imp.burst {
            Some(b) if b.len > 0 => {
                let period = u64::from(b.period);
                let window = i / period;
                let start = match self.burst_window {
                    Some((w, start)) if w == window => start,
                    _ => {
                        let offset = self.rng().random_range(0..=period - u64::from(b.len));
                        let start = window * period + offset;
                        self.burst_window = Some((window, start));
                        start
                    }
                };
                (start..start + u64::from(b.len)).contains(&i)
            }
            _ => false,
        };

        // 1.0 never passes `u < p` for p <= 1, so no draws means no random events.
        let [u_loss, u_dup, u_reorder, u_reorder_dup] = if self.imp.draws_per_datagram() {
            let rng = self.rng();
            [
                rng.random::<f64>(),
                rng.random::<f64>(),
                rng.random::<f64>(),
                rng.random::<f64>(),
            ]
        } else {
            [1.0; 4]
        };

        if in_burst {
            self.counters.dropped_burst += 1;
            return Verdict::Drop(DropCause::Burst);
        }
        if u_loss < self.imp.loss {
            self.counters.dropped_random += 1;
            return Verdict::Drop(DropCause::Random);
        }
        let Some(at) = self.schedule(now, len, u_reorder) else {
            self.counters.dropped_overflow += 1;
            self.counters.overflows += 1;
            return Verdict::Drop(DropCause::Overflow);
        };
        let duplicate = if u_dup < self.imp.duplicate {
            let t = self.schedule(now, len, u_reorder_dup);
            match t {
                Some(_) => self.counters.duplicated += 1,
                None => self.counters.overflows += 1,
            }
            t
        } else {
            None
        };
        Verdict::Deliver { at, duplicate }
    }

    /// Admits one copy to the queue and computes its delivery time, or `None` on overflow.
    fn schedule(&mut self, now: Instant, len: usize, u_reorder: f64) -> Option<Instant> {
        let c = &mut self.counters;
        if c.queue_datagrams + 1 > self.imp.queue_datagrams as u64
            || c.queue_bytes + len as u64 > self.imp.queue_bytes as u64
        {
            return None;
        }
        c.queue_datagrams += 1;
        c.queue_bytes += len as u64;
        c.queue_peak_datagrams = c.queue_peak_datagrams.max(c.queue_datagrams);
        c.queue_peak_bytes = c.queue_peak_bytes.max(c.queue_bytes);
        c.forwarded += 1;
        c.forwarded_bytes += len as u64;

        let mut at = self.serialize(now, len) + self.imp.delay;
        if u_reorder < self.imp.reorder {
            at += self.imp.reorder_delay;
            self.counters.delayed += 1;
        }
        Some(at)
    }

    /// When a copy of `len` bytes offered at `now` has left the rate limiter.
    fn serialize(&mut self, now: Instant, len: usize) -> Instant {
        let Some(rate) = self.imp.rate else {
            return now;
        };
        let start = match self.busy_until {
            Some(busy) if busy >= now => busy,
            // Idle link: the remainder of an earlier busy period no longer matters.
            _ => {
                self.carry = 0;
                now
            }
        };
        let rate = u128::from(rate.get());
        let num = len as u128 * 1_000_000_000 + u128::from(self.carry);
        // carry < rate <= u64::MAX, so the cast is lossless.
        self.carry = (num % rate) as u64;
        let nanos = u64::try_from(num / rate).unwrap_or(u64::MAX);
        let done = start + Duration::from_nanos(nanos);
        self.busy_until = Some(done);
        done
    }

    /// Reports that one copy of `len` bytes left the link (was delivered or sent on), freeing its
    /// queue space.
    pub fn on_departed(&mut self, len: usize) {
        let c = &mut self.counters;
        c.departed += 1;
        c.queue_datagrams = c.queue_datagrams.saturating_sub(1);
        c.queue_bytes = c.queue_bytes.saturating_sub(len as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(imp: Impairment, seed: u64) -> ImpairedLink {
        ImpairedLink::new(imp, seed, 7, Direction::Forward).unwrap()
    }

    #[test]
    fn profiles_parse_and_match_the_reference() {
        for p in Profile::ALL {
            assert_eq!(p.name().parse::<Profile>().unwrap(), p);
            assert_eq!(p.to_string().to_uppercase().parse::<Profile>().unwrap(), p);
            p.impairment().validate().unwrap();
        }
        assert!("lossy".parse::<Profile>().is_err());
        let r = Profile::Random.impairment();
        assert_eq!((r.loss, r.duplicate, r.reorder), (0.05, 0.01, 0.05));
        assert_eq!(r.delay, Duration::from_millis(10));
        assert_eq!(r.reorder_delay, Duration::from_millis(15));
        assert_eq!(r.burst, None);
        let b = Profile::Burst.impairment();
        assert_eq!(
            b.burst,
            Some(BurstLoss {
                len: 3,
                period: 100
            })
        );
        assert_eq!(b.loss, 0.0);
        let s = Profile::Sustained.impairment();
        assert_eq!(s, b.clone().with_loss(0.02));
        assert_eq!(Profile::None.impairment(), Impairment::none());
        assert_eq!(Impairment::none().queue_bytes, 8 << 20);
        assert_eq!(Impairment::none().queue_datagrams, 8192);
    }

    #[test]
    fn validation_rejects_bad_settings() {
        assert!(Impairment::none().with_loss(1.5).validate().is_err());
        assert!(Impairment::none().with_duplicate(-0.1).validate().is_err());
        assert!(Impairment::none()
            .with_reorder(f64::NAN, Duration::ZERO)
            .validate()
            .is_err());
        assert!(Impairment::none().with_burst(4, 3).validate().is_err());
        assert!(Impairment::none().with_burst(0, 0).validate().is_err());
        assert!(Impairment::none().with_queue(0, 1).validate().is_err());
        assert!(Impairment::none().with_burst(3, 3).validate().is_ok());
        assert!(
            ImpairedLink::new(Impairment::none().with_loss(2.0), 1, 1, Direction::Forward).is_err()
        );
    }

    #[test]
    fn none_delivers_everything_at_once_without_an_rng() {
        let mut l = link(Impairment::none(), 1);
        let t = Instant::now();
        for _ in 0..1000 {
            assert_eq!(
                l.admit(t, 100),
                Verdict::Deliver {
                    at: t,
                    duplicate: None
                }
            );
        }
        assert!(l.rng.is_none());
        assert_eq!(l.counters().forwarded, 1000);
        assert_eq!(l.counters().queue_datagrams, 1000);
        for _ in 0..1000 {
            l.on_departed(100);
        }
        assert_eq!(l.counters().queue_bytes, 0);
        assert_eq!(l.counters().queue_peak_bytes, 100_000);
    }

    #[test]
    fn full_probabilities_always_fire() {
        let imp = Impairment::none()
            .with_duplicate(1.0)
            .with_reorder(1.0, Duration::from_millis(3))
            .with_delay(Duration::from_millis(2));
        let mut l = link(imp, 3);
        let t = Instant::now();
        let v = l.admit(t, 10);
        let five = t + Duration::from_millis(5);
        assert_eq!(
            v,
            Verdict::Deliver {
                at: five,
                duplicate: Some(five)
            }
        );
        assert_eq!(v.delivery_times().count(), 2);
        let mut lossy = link(Impairment::none().with_loss(1.0), 3);
        assert_eq!(lossy.admit(t, 10), Verdict::Drop(DropCause::Random));
        assert_eq!(lossy.counters().realized_loss(), 1.0);
    }

    #[test]
    fn duplicate_refused_by_full_queue_counts_an_overflow_only() {
        let imp = Impairment::none().with_duplicate(1.0).with_queue(1000, 1);
        let mut l = link(imp, 9);
        let t = Instant::now();
        assert_eq!(
            l.admit(t, 10),
            Verdict::Deliver {
                at: t,
                duplicate: None
            }
        );
        assert_eq!(l.admit(t, 10), Verdict::Drop(DropCause::Overflow));
        let c = *l.counters();
        assert_eq!((c.overflows, c.dropped_overflow, c.duplicated), (2, 1, 0));
        l.on_departed(10);
        assert!(matches!(l.admit(t, 10), Verdict::Deliver { .. }));
        // Bytes cap, too.
        let mut b = link(Impairment::none().with_queue(25, 100), 9);
        assert!(matches!(b.admit(t, 20), Verdict::Deliver { .. }));
        assert_eq!(b.admit(t, 6), Verdict::Drop(DropCause::Overflow));
        assert!(matches!(b.admit(t, 5), Verdict::Deliver { .. }));
    }

    #[test]
    fn sustained_drops_the_same_bursts_as_burst() {
        let t = Instant::now();
        let mut b = link(Profile::Burst.impairment(), 42);
        let mut s = link(Profile::Sustained.impairment(), 42);
        for _ in 0..10_000 {
            let vb = b.admit(t, 1);
            let vs = s.admit(t, 1);
            if vb == Verdict::Drop(DropCause::Burst) {
                assert_eq!(vs, vb);
            }
        }
        assert_eq!(b.counters().dropped_burst, 300);
        assert_eq!(s.counters().dropped_burst, 300);
        assert!(s.counters().dropped_random > 0);
    }
}
