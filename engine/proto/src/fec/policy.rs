//! Parity level selection: fixed, or adaptive from the loss the peer reports.

use super::{AdaptiveConfig, FecPolicy};

/// Decides how many parity shards the next group plans.
#[derive(Debug)]
pub(crate) struct ParityController {
    policy: FecPolicy,
    cfg: AdaptiveConfig,
    /// Data shards per full group (the `n` of the loss model).
    group: usize,
    level: usize,
    estimate: Option<f64>,
    pending_received: u64,
    pending_lost: u64,
    below: u32,
    changes: u64,
    pending_burst: u64,
    /// Longest burst of each of the last `burst_memory` estimates.
    bursts: std::collections::VecDeque<u64>,
    /// Whether the level rises to the longest recent burst (the block code, whose groups
    /// must each carry parity for a burst; the sliding code sizes its tail repairs for
    /// bursts instead, see [`ParityController::sliding`]).
    burst_level: bool,
    /// The last `decrease_after` loss samples (see [`ParityController::recent_loss`]).
    samples: std::collections::VecDeque<f64>,
}

impl ParityController {
    pub(crate) fn new(policy: FecPolicy, cfg: AdaptiveConfig, group: usize) -> Self {
        let level = match policy {
            FecPolicy::Off => 0,
            FecPolicy::Fixed { parity } => parity as usize,
            // Start clean: parity appears once the peer reports loss.
            FecPolicy::Adaptive { .. } => 0,
        };
        ParityController {
            policy,
            cfg,
            group,
            level,
            estimate: None,
            pending_received: 0,
            pending_lost: 0,
            below: 0,
            changes: 0,
            pending_burst: 0,
            bursts: std::collections::VecDeque::new(),
            burst_level: true,
            samples: std::collections::VecDeque::new(),
        }
    }

    /// A controller for the sliding-window code: the level (repairs per `span` sources)
    /// follows the loss estimate alone, and the longest recent burst only sizes the tail
    /// repairs (`SlidingSender::burst_tail`). A repair covers every source in the window, so
    /// the repairs sent after a burst rebuild it wherever they come from; raising the ratio
    /// to the burst length as well paid for each burst twice (on the relay's `burst`
    /// profile: parity at the 50 % cap, wire overhead 59 %).
    pub(crate) fn sliding(policy: FecPolicy, cfg: AdaptiveConfig, span: usize) -> Self {
        ParityController {
            burst_level: false,
            ..Self::new(policy, cfg, span)
        }
    }

    /// Parity shards the next group plans.
    pub(crate) fn level(&self) -> usize {
        self.level
    }

    /// Times the adaptive level changed.
    pub(crate) fn changes(&self) -> u64 {
        self.changes
    }

    /// The longest loss burst of the remembered report windows (0 if none).
    pub(crate) fn recent_burst(&self) -> usize {
        self.bursts.iter().copied().max().unwrap_or(0) as usize
    }

    /// The current loss estimate, if enough samples arrived.
    pub(crate) fn estimate(&self) -> Option<f64> {
        self.estimate
    }

    /// The loss estimate, at most the largest of the last `decrease_after` samples: what
    /// sizes repairs that must pay off at once (message chunks). The moving average keeps a
    /// burst of loss for many samples after it ended (from 20 % it takes a dozen clean ones
    /// to reach a clean path), which suits the ratio's hysteresis but, after a congestion
    /// episode (a controller's startup filling the buffer), would repair every small
    /// fragmented message for seconds on a path that no longer loses any.
    pub(crate) fn recent_loss(&self) -> Option<f64> {
        let recent = self.samples.iter().copied().fold(0.0, f64::max);
        self.estimate.map(|e| e.min(recent))
    }

    /// Takes a (received, lost, longest burst) window from the peer (burst 0: unknown).
    pub(crate) fn on_loss_report(&mut self, received: u64, lost: u64, max_burst: u64) {
        let FecPolicy::Adaptive { max_parity } = self.policy else {
            return;
        };
        self.pending_received = self.pending_received.saturating_add(received);
        self.pending_lost = self.pending_lost.saturating_add(lost);
        self.pending_burst = self.pending_burst.max(max_burst);
        let total = self.pending_received.saturating_add(self.pending_lost);
        if total < self.cfg.min_samples.max(1) {
            return;
        }
        let sample = self.pending_lost as f64 / total as f64;
        self.pending_received = 0;
        self.pending_lost = 0;
        self.samples.push_back(sample);
        while self.samples.len() > self.cfg.decrease_after.max(1) as usize {
            self.samples.pop_front();
        }
        let est = match self.estimate {
            None => sample,
            Some(e) => e + self.cfg.alpha * (sample - e),
        };
        self.estimate = Some(est);
        self.bursts
            .push_back(std::mem::take(&mut self.pending_burst));
        while self.bursts.len() > self.cfg.burst_memory.max(1) {
            self.bursts.pop_front();
        }
        let burst = self.bursts.iter().copied().max().unwrap_or(0);
        let burst_want = if self.burst_level && burst >= 2 {
            burst.min(max_parity as u64) as usize
        } else {
            0
        };
        let want = desired_parity(est, self.group, &self.cfg, max_parity as usize).max(burst_want);
        let old = self.level;
        if want > self.level {
            self.level = want;
            self.below = 0;
        } else if want < self.level {
            self.below += 1;
            if self.below >= self.cfg.decrease_after {
                self.level -= 1;
                self.below = 0;
            }
        } else {
            self.below = 0;
        }
        if self.level != old {
            self.changes += 1;
        }
    }
}

/// The least parity `p` for which a group of `k` data + `p` parity shards loses more than `p`
/// shards with probability at most `target_residual`, under independent loss at rate `loss`.
pub(crate) fn desired_parity(loss: f64, k: usize, cfg: &AdaptiveConfig, max: usize) -> usize {
    if loss.is_nan() || loss <= cfg.clean_loss {
        return 0;
    }
    least_parity(loss, k, cfg.target_residual, 0, max)
}

/// The least `p` in `min..=max` for which `k` data + `p` parity shards lose more than `p`
/// with probability at most `residual`, under independent loss at rate `loss` (`max` if none).
pub(crate) fn least_parity(loss: f64, k: usize, residual: f64, min: usize, max: usize) -> usize {
    if loss.is_nan() || loss <= 0.0 {
        return min.min(max);
    }
    let loss = loss.min(0.999);
    for p in min..=max {
        let n = k + p;
        // P(X <= p) for X ~ Binomial(n, loss), summing the pmf term by term.
        let mut term = (1.0 - loss).powi(n as i32);
        let mut cdf = term;
        for i in 0..p {
            term *= (n - i) as f64 / (i + 1) as f64 * loss / (1.0 - loss);
            cdf += term;
        }
        if 1.0 - cdf <= residual {
            return p;
        }
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn desired_parity_grows_with_loss() {
        let cfg = AdaptiveConfig::default();
        assert_eq!(desired_parity(0.0, 8, &cfg, 4), 0);
        assert_eq!(desired_parity(0.001, 8, &cfg, 4), 0);
        let at = |l| desired_parity(l, 8, &cfg, 4);
        assert!(at(0.01) >= 1);
        assert!(at(0.05) > at(0.01));
        assert_eq!(at(0.5), 4);
        assert_eq!(desired_parity(f64::NAN, 8, &cfg, 4), 0);
    }

    #[test]
    fn least_parity_meets_the_residual_within_bounds() {
        // 1 data shard at 5 % loss: 0 parity leaves 5 % odds, 1 parity 0.25 %.
        assert_eq!(least_parity(0.05, 1, 0.06, 0, 2), 0);
        assert_eq!(least_parity(0.05, 1, 0.01, 0, 2), 1);
        // The lower bound holds even on a clean path; the upper bound caps a lossy one.
        assert_eq!(least_parity(0.0, 8, 0.01, 1, 2), 1);
        assert_eq!(least_parity(0.5, 8, 0.01, 1, 2), 2);
    }

    #[test]
    fn adaptive_rises_at_once_and_falls_with_hysteresis() {
        let cfg = AdaptiveConfig::default();
        let mut c = ParityController::new(FecPolicy::Adaptive { max_parity: 4 }, cfg, 8);
        assert_eq!(c.level(), 0);
        c.on_loss_report(90, 10, 0);
        let high = c.level();
        assert!(high >= 3, "{high}");
        // One clean report does not drop it; a long clean run reaches zero.
        c.on_loss_report(100, 0, 0);
        assert_eq!(c.level(), high);
        for _ in 0..100 {
            c.on_loss_report(100, 0, 0);
        }
        assert_eq!(c.level(), 0);
        assert!(c.changes() >= 2);
    }

    #[test]
    fn bursts_raise_parity_beyond_the_independent_loss_model() {
        let cfg = AdaptiveConfig::default();
        let mut c = ParityController::new(FecPolicy::Adaptive { max_parity: 4 }, cfg, 8);
        // 3% loss alone asks for 2 parity; bursts of 3 ask for 3.
        c.on_loss_report(97, 3, 0);
        assert_eq!(c.level(), 2);
        c.on_loss_report(97, 3, 3);
        assert_eq!(c.level(), 3);
        // Burst-free windows within the memory keep it.
        for _ in 0..3 {
            c.on_loss_report(97, 3, 1);
        }
        assert_eq!(c.level(), 3);
        let mut big = ParityController::new(FecPolicy::Adaptive { max_parity: 4 }, cfg, 8);
        big.on_loss_report(90, 10, 9);
        assert_eq!(big.level(), 4, "bounded by max_parity");
    }

    #[test]
    fn the_sliding_level_follows_the_loss_estimate_not_the_bursts() {
        let cfg = AdaptiveConfig::default();
        let mut block = ParityController::new(FecPolicy::Adaptive { max_parity: 4 }, cfg, 12);
        let mut sliding = ParityController::sliding(FecPolicy::Adaptive { max_parity: 4 }, cfg, 12);
        for c in [&mut block, &mut sliding] {
            c.on_loss_report(97, 3, 3);
        }
        // 3 % loss over 12 sources asks for 2; the block code covers the burst of 3.
        assert_eq!(block.level(), 3);
        assert_eq!(sliding.level(), 2);
        // Both remember the burst (it sizes the sliding code's tail repairs).
        assert_eq!(sliding.recent_burst(), 3);
    }

    #[test]
    fn fixed_and_off_ignore_reports() {
        let cfg = AdaptiveConfig::default();
        let mut f = ParityController::new(FecPolicy::Fixed { parity: 2 }, cfg, 8);
        f.on_loss_report(0, 1000, 0);
        assert_eq!(f.level(), 2);
        let mut o = ParityController::new(FecPolicy::Off, cfg, 8);
        o.on_loss_report(0, 1000, 0);
        assert_eq!(o.level(), 0);
    }
}
