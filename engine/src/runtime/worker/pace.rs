//! How a worker paces itself: its settings, the tick's fixed grid, and the idle gap the
//! balanced strategy judges a spin by.

use std::time::{Duration, Instant};

use ricochet_platform as platform;

use crate::runtime::config::{IdleStrategy, UdpServerConfig};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TimerEvent {
    Tick,
}

/// How a worker runs, besides its service.
#[derive(Debug, Clone)]
pub(super) struct WorkerSettings {
    pub idle: IdleStrategy,
    pub spin_for: Duration,
    pub tick: Option<Duration>,
    pub send_batch: usize,
    /// Longest the stop sequence may take before the worker gives up on unsent output.
    pub stop_limit: Duration,
    /// Coalesce sends into GSO runs (configured on and supported by the kernel).
    pub coalesce: bool,
    /// Scheduler time slice to ask for ([`UdpServerConfig::worker_slice`]).
    pub slice: Option<Duration>,
}

impl WorkerSettings {
    pub(super) fn from_config(cfg: &UdpServerConfig) -> Self {
        WorkerSettings {
            idle: cfg.idle,
            spin_for: cfg.spin_for,
            tick: cfg.tick,
            send_batch: cfg.send_batch,
            stop_limit: Duration::from_millis(500),
            coalesce: cfg.gso && platform::select::gso_supported(),
            slice: cfg.worker_slice,
        }
    }
}

/// A moving average of how long a worker waited for its next datagram after work: the
/// balanced idle strategy spins only while that is short, since a spin that usually ends in a
/// park anyway costs a stream of empty system calls and a core others could use.
#[derive(Debug, Default)]
pub(super) struct IdleGap {
    /// Exponentially weighted mean gap (weight 1/8 per sample), ns.
    mean_ns: u64,
}

impl IdleGap {
    pub(super) fn record(&mut self, gap: Duration) {
        let g = u64::try_from(gap.as_nanos()).unwrap_or(u64::MAX);
        self.mean_ns = self.mean_ns - self.mean_ns / 8 + g / 8;
    }

    /// Spinning for up to `spin_for` pays when work usually returns within half of it.
    pub(super) fn spin_pays(&self, spin_for: Duration) -> bool {
        u128::from(self.mean_ns) < spin_for.as_nanos() / 2
    }
}

/// The tick's fixed grid: tick `k` is due at `start + k × period`.
#[derive(Debug, Clone, Copy)]
pub(super) struct TickGrid {
    pub(super) start: Instant,
    pub(super) period: Duration,
    /// Index of the tick scheduled next.
    pub(super) next: u64,
}

impl TickGrid {
    pub(super) fn due(&self, k: u64) -> Instant {
        // `period` is at least 1 ns and `k` counts periods since start: no overflow in practice,
        // and a saturated product only delays the tick.
        let nanos = self.period.as_nanos().saturating_mul(u128::from(k));
        self.start + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// The tick due now ran at `now`: its lateness, and the due time of the next tick, skipping
    /// (and returning the count of) due times already past.
    pub(super) fn advance(&mut self, now: Instant) -> (Duration, u64, Instant) {
        let late = now.saturating_duration_since(self.due(self.next));
        let mut k = self.next + 1;
        let mut skipped = 0;
        if self.due(k) <= now {
            let behind = now.saturating_duration_since(self.start).as_nanos()
                / self.period.as_nanos().max(1);
            let behind = u64::try_from(behind).unwrap_or(u64::MAX);
            // Tick `behind` was due at or before now and is skipped too: the next runs on time.
            skipped = behind + 1 - k;
            k = behind + 1;
        }
        self.next = k;
        (late, skipped, self.due(k))
    }
}

#[cfg(test)]
mod tests {
    use super::{IdleGap, TickGrid};
    use std::time::{Duration, Instant};

    #[test]
    fn ticks_stay_on_the_grid_and_skip_what_a_stall_missed() {
        let start = Instant::now();
        let ms = Duration::from_millis;
        let mut g = TickGrid {
            start,
            period: ms(10),
            next: 1,
        };
        // Tick 1 runs 3 ms late: tick 2 is still due at 20 ms, not 23.
        assert_eq!(g.advance(start + ms(13)), (ms(3), 0, start + ms(20)));
        // On time.
        assert_eq!(g.advance(start + ms(20)), (ms(0), 0, start + ms(30)));
        // Tick 3 runs at 57 ms: 40 and 50 passed without a tick; the next is due at 60.
        assert_eq!(g.advance(start + ms(57)), (ms(27), 2, start + ms(60)));
        // Exactly at a due time that already passed: skipped too, the next is a period on.
        assert_eq!(g.advance(start + ms(70)), (ms(10), 1, start + ms(80)));
    }

    #[test]
    fn balanced_spins_only_while_work_returns_quickly() {
        let spin_for = Duration::from_micros(50);
        let mut g = IdleGap::default();
        // A fresh worker has seen no gap: it spins (the configured behaviour).
        assert!(g.spin_pays(spin_for));
        for _ in 0..8 {
            g.record(Duration::from_micros(5));
        }
        assert!(g.spin_pays(spin_for), "5 µs gaps: spin");
        // Work now takes 200 µs to come back: the average crosses 25 µs within a few gaps.
        let mut turns = 0;
        while g.spin_pays(spin_for) {
            g.record(Duration::from_micros(200));
            turns += 1;
            assert!(turns < 10, "still spinning after {turns} long gaps");
        }
        // And back once gaps are short again.
        while !g.spin_pays(spin_for) {
            g.record(Duration::ZERO);
            turns += 1;
            assert!(turns < 60);
        }
        // A parked worker's idle hours do not overflow the average.
        g.record(Duration::from_secs(3600 * 24 * 365));
        assert!(!g.spin_pays(spin_for));
    }
}
