//! RTT estimation (RFC 6298 smoothing, RFC 9002 ack-delay handling).

use std::time::Duration;

/// Smoothed RTT, variance, minimum and latest sample.
#[derive(Debug, Clone)]
pub(crate) struct RttEstimator {
    pub(crate) latest: Duration,
    pub(crate) smoothed: Duration,
    pub(crate) var: Duration,
    pub(crate) min: Duration,
    pub(crate) has_sample: bool,
}

impl RttEstimator {
    pub(crate) fn new(initial: Duration) -> Self {
        Self {
            latest: initial,
            smoothed: initial,
            var: initial / 2,
            min: initial,
            has_sample: false,
        }
    }

    /// Feed one sample; `ack_delay` is the peer's reported delay (already capped by the caller).
    pub(crate) fn update(&mut self, sample: Duration, ack_delay: Duration) {
        self.latest = sample;
        if !self.has_sample {
            self.has_sample = true;
            self.min = sample;
            self.smoothed = sample;
            self.var = sample / 2;
            return;
        }
        self.min = self.min.min(sample);
        // Subtract the peer's delay only when that cannot go below the minimum (RFC 9002 §5.3).
        let adjusted = if sample >= self.min + ack_delay {
            sample - ack_delay
        } else {
            sample
        };
        let diff = self.smoothed.abs_diff(adjusted);
        self.var = (self.var * 3 + diff) / 4;
        self.smoothed = (self.smoothed * 7 + adjusted) / 8;
    }

    /// Retransmission timeout before backoff.
    pub(crate) fn rto(&self, min: Duration, max_ack_delay: Duration) -> Duration {
        (self.smoothed + (self.var * 4).max(Duration::from_millis(1)) + max_ack_delay).max(min)
    }

    /// When a tail-loss probe is due after the last ack-eliciting packet, before the floor and
    /// the RTO cap: two smoothed RTTs (RFC 8985), or the smoothed RTT plus four deviations when
    /// that is longer, plus the peer's ACK delay. The deviation term matters where the RTT
    /// swings (a busy server, one client thread driving thousands of sessions): there 2 × SRTT
    /// is exceeded by ordinary round trips, and each spurious probe adds load that stretches
    /// the next ones.
    pub(crate) fn probe_delay(&self, max_ack_delay: Duration) -> Duration {
        (self.smoothed * 2).max(self.smoothed + self.var * 4) + max_ack_delay
    }

    /// Time-threshold loss delay: 9/8 of the larger of smoothed and latest RTT, at least 1 ms.
    pub(crate) fn loss_delay(&self) -> Duration {
        (self.smoothed.max(self.latest) * 9 / 8).max(Duration::from_millis(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converges_and_ignores_ack_delay_below_min() {
        let mut r = RttEstimator::new(Duration::from_millis(100));
        for _ in 0..50 {
            r.update(Duration::from_millis(20), Duration::ZERO);
        }
        assert!(r.smoothed.abs_diff(Duration::from_millis(20)) < Duration::from_micros(100));
        assert_eq!(r.min, Duration::from_millis(20));
        // A sample of 25 ms with 5 ms of ack delay is a 20 ms path.
        r.update(Duration::from_millis(25), Duration::from_millis(5));
        assert!(r.smoothed.abs_diff(Duration::from_millis(20)) < Duration::from_micros(200));
        // Ack delay that would go below min RTT is not subtracted.
        r.update(Duration::from_millis(21), Duration::from_millis(10));
        assert!(r.smoothed > Duration::from_millis(20));
        assert!(r.rto(Duration::from_millis(30), Duration::ZERO) >= Duration::from_millis(30));
    }

    #[test]
    fn probe_delay_covers_the_rtt_deviation() {
        let mut r = RttEstimator::new(Duration::from_millis(100));
        // A steady path: two smoothed RTTs.
        for _ in 0..100 {
            r.update(Duration::from_millis(20), Duration::ZERO);
        }
        let steady = r.probe_delay(Duration::from_millis(5));
        assert!(steady.abs_diff(Duration::from_millis(45)) < Duration::from_millis(1));
        // A path whose RTT swings between 10 and 90 ms: beyond 2 x SRTT.
        for i in 0..100 {
            let ms = if i % 2 == 0 { 10 } else { 90 };
            r.update(Duration::from_millis(ms), Duration::ZERO);
        }
        let swinging = r.probe_delay(Duration::ZERO);
        assert!(
            swinging > r.smoothed * 2,
            "{swinging:?} vs srtt {:?}",
            r.smoothed
        );
        assert_eq!(swinging, r.smoothed + r.var * 4);
    }
}
