//! The virtual clock: a fixed base [`Instant`] plus a simulated offset.

use std::time::{Duration, Instant};

/// A virtual clock that hands out [`Instant`]s without ever sleeping.
///
/// The clock reads the real clock at most once, when [`SimClock::new`] captures its base; after
/// that, time moves only when the simulation advances it. The protocol API takes
/// `std::time::Instant`, so the simulator works in `Instant`s, while traces and reports use the
/// [`elapsed`](SimClock::elapsed) offset, which is identical from run to run.
#[derive(Debug, Clone)]
pub struct SimClock {
    base: Instant,
    offset: Duration,
}

impl SimClock {
    /// A clock at offset zero whose base is the real `Instant::now()`, read once here.
    pub fn new() -> Self {
        Self::with_base(Instant::now())
    }

    /// A clock at offset zero on a caller-chosen base (e.g. to share one epoch between clocks).
    pub fn with_base(base: Instant) -> Self {
        Self {
            base,
            offset: Duration::ZERO,
        }
    }

    /// The fixed base instant (simulated time zero).
    pub fn base(&self) -> Instant {
        self.base
    }

    /// The current simulated instant.
    pub fn now(&self) -> Instant {
        self.base + self.offset
    }

    /// Simulated time since the base.
    pub fn elapsed(&self) -> Duration {
        self.offset
    }

    /// The instant `offset` after the base.
    pub fn at(&self, offset: Duration) -> Instant {
        self.base + offset
    }

    /// The offset of `t` from the base, saturating at zero for instants before the base.
    pub fn offset_of(&self, t: Instant) -> Duration {
        t.saturating_duration_since(self.base)
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&mut self, d: Duration) {
        self.offset += d;
    }

    /// Moves the clock to `t` if `t` is later than now; time never runs backwards.
    pub fn advance_to(&mut self, t: Instant) {
        let offset = self.offset_of(t);
        if offset > self.offset {
            self.offset = offset;
        }
    }
}

impl Default for SimClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advances_and_never_goes_back() {
        let mut c = SimClock::new();
        let t0 = c.now();
        c.advance(Duration::from_millis(5));
        assert_eq!(c.now() - t0, Duration::from_millis(5));
        c.advance_to(t0 + Duration::from_millis(3));
        assert_eq!(c.elapsed(), Duration::from_millis(5));
        c.advance_to(c.at(Duration::from_secs(3600)));
        assert_eq!(c.elapsed(), Duration::from_secs(3600));
        assert_eq!(c.offset_of(t0), Duration::ZERO);
    }
}
