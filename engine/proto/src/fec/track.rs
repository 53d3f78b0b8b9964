//! Arrival tracking of data-shard sequence numbers, shared by the block and the sliding-window
//! receivers: extends 16-bit seqs, detects duplicates, remembers which seqs were delivered
//! (received or rebuilt) and counts loss on the wire for the peer's adaptive policy.

use super::{LossReport, ReceiverStats};

/// Base of extended sequence numbers, so `seq - index` and window arithmetic never underflow.
pub(crate) const SEQ_BASE: u64 = 1 << 20;
/// Sequence numbers tracked for duplicates and loss (bitmap width).
pub(crate) const WINDOW: u64 = 128;
/// A missing data shard counts as lost once this many later shards arrived.
const REORDER_DISTANCE: u64 = 32;
/// A jump in sequence larger than this resynchronises instead of counting loss.
const MAX_JUMP: u64 = 1024;

/// What an arriving data shard is, relative to what came before.
pub(crate) enum Arrival {
    New,
    Duplicate,
    AlreadyDelivered,
    Late,
}

/// Sequence-number bookkeeping of one receiver.
#[derive(Debug, Default)]
pub(crate) struct SeqTracker {
    pub(crate) hi: Option<u64>,
    start: u64,
    arrived: u128,
    delivered: u128,
    /// Rebuilt shards newer than `hi`: bit j is seq `hi + 1 + j`.
    delivered_ahead: u64,
    /// Shards whose fate was decided since the last report (a shard is decided once
    /// [`REORDER_DISTANCE`] later ones arrived, or when it arrives after being counted
    /// lost): those that arrived, and those that did not. Both lag the newest arrival by the
    /// same distance, so a report's ratio is the path's loss from the first report on (were
    /// arrivals counted at once, the first report would read no loss whatever the path).
    window_received: u64,
    window_lost: u64,
    /// Length of the current run of lost shards, the seq of its last one, and the longest
    /// run in this report window.
    run: u64,
    last_lost: u64,
    window_max_burst: u64,
    /// Distinct data shards that arrived.
    pub(crate) received: u64,
    /// Data shards counted lost on the wire, net of late arrivals.
    pub(crate) lost: u64,
}

impl SeqTracker {
    /// Data shards decided (received, lost) and the longest burst since the last call.
    pub(crate) fn take_report(&mut self) -> LossReport {
        let r = LossReport {
            received: self.window_received,
            lost: self.window_lost,
            max_burst: self.window_max_burst,
        };
        self.window_received = 0;
        self.window_lost = 0;
        self.window_max_burst = 0;
        r
    }

    /// Extends a 16-bit sequence number to the one nearest the newest seen.
    pub(crate) fn extend(&self, s: u16) -> u64 {
        let Some(hi) = self.hi else {
            return SEQ_BASE + u64::from(s);
        };
        if s == (hi as u16).wrapping_add(1) {
            // The next in order (the common case): `hi + 1` is among the candidates below,
            // 1 from `hi` where the others are at least 65,535 away.
            return hi + 1;
        }
        let cand = (hi & !0xFFFF) | u64::from(s);
        [cand.wrapping_sub(1 << 16), cand, cand + (1 << 16)]
            .into_iter()
            .filter(|&c| c >= SEQ_BASE / 2)
            .min_by_key(|&c| c.abs_diff(hi))
            .unwrap_or(cand)
    }

    /// Loss and duplicate accounting for an arriving data shard.
    pub(crate) fn track_arrival(&mut self, seq: u64) -> Arrival {
        let Some(hi) = self.hi else {
            self.hi = Some(seq);
            self.start = seq;
            self.arrived = 1;
            self.delivered = 0;
            self.delivered_ahead = 0;
            self.count_received();
            return Arrival::New;
        };
        if seq == hi + 1 {
            return self.arrive_next(hi);
        }
        if seq > hi {
            let shift = seq - hi;
            let ahead = self.delivered_ahead;
            let was_delivered = shift - 1 < 64 && ahead & (1 << (shift - 1)) != 0;
            if shift > MAX_JUMP {
                // Far beyond anything plausible: start over rather than count phantom loss
                // (what arrived of the undecided span counts as received).
                let from = (hi + 1).saturating_sub(REORDER_DISTANCE).max(self.start);
                self.window_received +=
                    (from..=hi).filter(|&q| bit(self.arrived, hi - q)).count() as u64;
                self.start = seq;
                self.arrived = 0;
                self.delivered = 0;
                self.delivered_ahead = 0;
            } else {
                // Shards whose distance from the newest crosses REORDER_DISTANCE now count
                // as lost if they have not arrived.
                let from = (hi + 1).saturating_sub(REORDER_DISTANCE).max(self.start);
                let to = seq.saturating_sub(REORDER_DISTANCE);
                let mut lost = 0;
                for q in from..=to {
                    if q <= hi && bit(self.arrived, hi - q) {
                        self.window_received += 1;
                    } else {
                        lost += 1;
                        self.extend_run(q);
                    }
                }
                self.window_lost += lost;
                self.lost += lost;
                self.arrived = shl(self.arrived, shift);
                self.delivered = shl(self.delivered, shift);
                // Rebuilt shards at or below the new newest move into the main window.
                let mut a = ahead;
                while a != 0 {
                    let j = u64::from(a.trailing_zeros());
                    a &= a - 1;
                    if j < shift && shift - 1 - j < WINDOW {
                        self.delivered |= 1 << (shift - 1 - j);
                    }
                }
                self.delivered_ahead = if shift >= 64 { 0 } else { ahead >> shift };
            }
            self.hi = Some(seq);
            self.arrived |= 1;
            self.count_received();
            return if was_delivered {
                Arrival::AlreadyDelivered
            } else {
                Arrival::New
            };
        }
        let d = hi - seq;
        // Shards before `start` were never counted lost, so there is nothing to net out.
        let counted_lost = seq >= self.start && d >= REORDER_DISTANCE;
        if d >= WINDOW {
            self.count_received();
            if counted_lost {
                self.uncount_lost();
            }
            return Arrival::Late;
        }
        if bit(self.arrived, d) {
            return Arrival::Duplicate;
        }
        self.arrived |= 1 << d;
        self.count_received();
        if counted_lost {
            self.uncount_lost();
        }
        if bit(self.delivered, d) {
            Arrival::AlreadyDelivered
        } else {
            Arrival::New
        }
    }

    /// [`Self::track_arrival`] of `hi + 1`, the next in order: the general case with a shift
    /// of 1 (one shard, `hi + 1 - REORDER_DISTANCE`, is decided; no rebuilt shard ahead of
    /// `hi` but the next one moves into the window), without its variable-width shifts.
    #[inline]
    fn arrive_next(&mut self, hi: u64) -> Arrival {
        let seq = hi + 1;
        let ahead = self.delivered_ahead;
        let q = seq.saturating_sub(REORDER_DISTANCE);
        if q >= self.start {
            // `hi - q` is REORDER_DISTANCE - 1 (`q <= hi`: `seq` is above the distance).
            if bit(self.arrived, hi - q) {
                self.window_received += 1;
            } else {
                self.window_lost += 1;
                self.lost += 1;
                self.extend_run(q);
            }
        }
        self.arrived = (self.arrived << 1) | 1;
        self.delivered = (self.delivered << 1) | u128::from(ahead & 1 != 0);
        self.delivered_ahead = ahead >> 1;
        self.hi = Some(seq);
        self.count_received();
        if ahead & 1 != 0 {
            Arrival::AlreadyDelivered
        } else {
            Arrival::New
        }
    }

    /// Shard `q` is counted lost: it extends the current run of lost shards or starts one.
    fn extend_run(&mut self, q: u64) {
        self.run = if self.last_lost + 1 == q {
            self.run + 1
        } else {
            1
        };
        self.last_lost = q;
        self.window_max_burst = self.window_max_burst.max(self.run);
    }

    fn count_received(&mut self) {
        self.received += 1;
    }

    /// A shard counted lost arrived after all: a report not yet taken moves it to the
    /// received; one already taken keeps it lost (it came too late for the reorder window).
    fn uncount_lost(&mut self) {
        if self.window_lost > 0 {
            self.window_lost -= 1;
            self.window_received += 1;
        }
        self.lost = self.lost.saturating_sub(1);
    }

    /// The arrival of data shard `seq` carrying `payload`: counts a duplicate and drops it, or
    /// delivers it (a late shard: already given up on or rebuilt elsewhere, delivered without
    /// being kept). `true` when the shard is new, so the receiver keeps it for recovery.
    #[inline]
    pub(crate) fn deliver_arrival(
        &mut self,
        seq: u64,
        payload: &[u8],
        stats: &mut ReceiverStats,
        deliver: &mut dyn FnMut(&[u8]),
    ) -> bool {
        match self.track_arrival(seq) {
            Arrival::Duplicate | Arrival::AlreadyDelivered => {
                stats.duplicates += 1;
                return false;
            }
            Arrival::Late => {
                stats.late_data += 1;
                stats.data_delivered += 1;
                deliver(payload);
                return false;
            }
            Arrival::New => {}
        }
        self.mark_delivered(seq);
        stats.data_delivered += 1;
        deliver(payload);
        true
    }

    pub(crate) fn mark_delivered(&mut self, seq: u64) {
        let hi = match self.hi {
            Some(hi) => hi,
            None => {
                // Rebuilt before any data arrived: anchor the window just below it.
                self.hi = Some(seq - 1);
                self.start = seq;
                seq - 1
            }
        };
        if seq == hi {
            // The shard that just arrived (the common case): bit 0.
            self.delivered |= 1;
        } else if seq < hi {
            if hi - seq < WINDOW {
                self.delivered |= 1 << (hi - seq);
            }
        } else if seq - hi - 1 < 64 {
            self.delivered_ahead |= 1 << (seq - hi - 1);
        }
    }

    /// Whether data shard `seq` was delivered (false if it is outside the tracked window).
    pub(crate) fn is_delivered(&self, seq: u64) -> bool {
        match self.hi {
            None => false,
            Some(hi) if seq <= hi => bit(self.delivered, hi - seq),
            Some(hi) => seq - hi - 1 < 64 && self.delivered_ahead & (1 << (seq - hi - 1)) != 0,
        }
    }

    /// Whether data shards `first..first + k` are all known delivered.
    pub(crate) fn all_delivered(&self, first: u64, k: usize) -> bool {
        (first..first + k as u64).all(|q| self.is_delivered(q))
    }
}

fn bit(map: u128, d: u64) -> bool {
    d < 128 && map & (1 << d) != 0
}

fn shl(map: u128, n: u64) -> u128 {
    if n >= 128 {
        0
    } else {
        map << n
    }
}
