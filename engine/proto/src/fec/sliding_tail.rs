//! The tail repairs of the sliding-window sender: when it goes quiet, repairs over the
//! sources no repair covers yet, sized by the loss estimate and the longest recent burst (see
//! [`SlidingSender::poll_timeout`]).

use std::time::Instant;

use super::super::policy::least_parity;
use super::SlidingSender;

/// Most repairs [`SlidingSender::burst_tail`] asks of one tail.
const MAX_TAIL_DEFICIT: usize = 8;

impl SlidingSender {
    /// [`Self::poll_timeout`] once the tail has not run for the latest source, sent at
    /// `last`: due `tail_wait` after it if sources are not covered by a repair or a recent
    /// loss burst could leave some without enough repairs after them.
    pub(super) fn tail_deadline(&self, last: Instant) -> Option<Instant> {
        if self.uncovered == 0 && self.burst_tail() == 0 {
            return None;
        }
        Some(last + self.cfg.sliding.tail_wait)
    }

    /// The tail timer fired: queues the tail repairs, or skips them.
    pub(super) fn run_tail(&mut self, now: Instant) {
        self.trim(now);
        self.tail_done_at = self.last_source;
        if self.tail_may_skip() {
            // The sources stay uncovered: the next repair (ratio or tail) covers them.
            self.stats.tails_skipped += 1;
            return;
        }
        let n = self.tail_count();
        if n > 0 {
            self.stats.tail_repairs += self.emit(n) as u64;
        }
    }

    /// Whether the tail due now may be skipped: the policy has a loss estimate, sources are
    /// not yet covered, and those are all received with probability at least
    /// 1 - `sliding.tail_skip_residual` at that estimate. Under independent loss that is
    /// `(1 - loss)^u` for `u` sources. After a recent loss burst of `l >= 3` the loss comes
    /// in bursts starting at loss / `l` per datagram, and one touches the `u` sources with
    /// odds `(u + l - 1) · loss / l`; the tail is skipped only if, besides, no burst among
    /// the recent datagrams could leave sources unrepaired ([`Self::burst_tail`]).
    fn tail_may_skip(&self) -> bool {
        let Some(loss) = self.controller.estimate() else {
            return false;
        };
        if self.uncovered == 0 {
            return false;
        }
        let loss = loss.clamp(0.0, 1.0);
        let l = self.controller.recent_burst();
        if l >= 3 {
            let touched = (self.uncovered + l - 1) as f64 * loss / l as f64;
            return touched <= self.cfg.sliding.tail_skip_residual && self.burst_tail() == 0;
        }
        let any_lost = 1.0 - (1.0 - loss).powi(self.uncovered as i32);
        any_lost <= self.cfg.sliding.tail_skip_residual
    }

    /// Repairs the tail due now carries, at most `sliding.tail_repairs`: with sources not yet
    /// covered by a repair, at least one, and enough that those sources (with the tail
    /// itself) lose more than it repairs with probability at most `sliding.tail_residual` at
    /// the policy's loss estimate; after a recent loss burst of 3 or more, also what
    /// [`Self::burst_tail`] asks (a stalled receiver often makes the sender go quiet right
    /// after a loss, so the tail may be the last repair for a while). Without an estimate
    /// (fixed policy) the longest recent burst, at least one.
    fn tail_count(&self) -> usize {
        let max = self.cfg.sliding.tail_repairs.max(1);
        let Some(loss) = self.controller.estimate() else {
            return self.controller.recent_burst().clamp(1, max);
        };
        let by_loss = match self.uncovered {
            0 => 0,
            u => least_parity(loss, u, self.cfg.sliding.tail_residual, 1, max),
        };
        by_loss.max(self.burst_tail()).min(max)
    }

    /// Repairs a tail needs for the longest recent loss burst `l` (0 below 3, or without a
    /// loss estimate): the largest `j` (at most `sliding.tail_repairs`) such that one burst
    /// of `l` datagrams, landing anywhere among those sent since the oldest source in the
    /// window, erases at least `j` more sources than the repairs sent after it, with a
    /// chance above `sliding.tail_residual`. Bursts start at a rate of loss / `l` per
    /// datagram, each position alike. Ratio repairs and earlier tails already sent after a
    /// position count, so a tail adds only what the burst could still leave unrepaired, and
    /// a sender that ends on a ratio repair still gets a tail when a burst before it would
    /// need more.
    pub(super) fn burst_tail(&self) -> usize {
        let l = self.controller.recent_burst();
        let Some(loss) = self.controller.estimate() else {
            return 0;
        };
        if l < 3 || self.sent.is_empty() {
            return 0;
        }
        let start_rate = loss.clamp(0.0, 1.0) / l as f64;
        let max = self.cfg.sliding.tail_repairs.clamp(1, MAX_TAIL_DEFICIT);
        // at_least[j]: burst positions whose deficit is at least j + 1.
        let mut at_least = [0usize; MAX_TAIL_DEFICIT];
        let mut after = 0;
        for end in (0..self.sent.len()).rev() {
            let from = (end + 1).saturating_sub(l);
            let erased = self.sent.range(from..=end).filter(|&&src| src).count();
            let deficit = erased.saturating_sub(after).min(max);
            for c in &mut at_least[..deficit] {
                *c += 1;
            }
            if !self.sent[end] {
                after += 1;
                if after >= l {
                    // No burst further back erases more sources than it has repairs after it.
                    break;
                }
            }
        }
        at_least[..max]
            .iter()
            .take_while(|&&n| n as f64 * start_rate > self.cfg.sliding.tail_residual)
            .count()
    }
}
