//! The configured scheme's sender and receiver behind one type each, so the connection glue
//! (and the fuzz bodies) drive either code without matching on the scheme themselves.

use std::time::Instant;

use super::{
    FecConfig, FecError, FecReceiver, FecScheme, FecSender, LossReport, ReceiverStats,
    RetentionBudget, SenderStats, SlidingReceiver, SlidingSender,
};

/// The sending half of the configured scheme.
// `FecLink` boxes the whole value, so the variants' size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Tx {
    Block(FecSender),
    Sliding(SlidingSender),
}

impl Tx {
    pub(crate) fn new(cfg: FecConfig) -> Tx {
        match cfg.scheme {
            FecScheme::Block => Tx::Block(FecSender::new(cfg)),
            FecScheme::Sliding => Tx::Sliding(SlidingSender::new(cfg)),
        }
    }

    /// The adaptive policy's loss estimate (`None`: no estimate yet, or another policy).
    pub(crate) fn loss_estimate(&self) -> Option<f64> {
        match self {
            Tx::Block(t) => t.loss_estimate(),
            Tx::Sliding(t) => t.loss_estimate(),
        }
    }

    #[cfg(test)]
    pub(crate) fn parity_level(&self) -> usize {
        match self {
            Tx::Block(t) => t.parity_level(),
            Tx::Sliding(t) => t.parity_level(),
        }
    }

    /// Protects one datagram; `remaining`: it carries a fragment of an unreliable message of
    /// several fragments, (how many follow, how many it has) (see
    /// [`SlidingSender::protect_fragment`]; the block code protects it like any datagram).
    pub(crate) fn protect(
        &mut self,
        now: Instant,
        payload: &[u8],
        out: &mut [u8],
        remaining: Option<(u32, u32)>,
    ) -> Result<usize, FecError> {
        match self {
            Tx::Block(t) => t.protect(now, payload, out),
            Tx::Sliding(t) => t.protect_fragment(now, payload, out, remaining),
        }
    }

    /// [`Self::protect`] in place: the payload, `len` bytes, is already at
    /// `out[DATA_HEADER_LEN..]` (see the schemes' `protect_placed`).
    pub(crate) fn protect_placed(
        &mut self,
        now: Instant,
        out: &mut [u8],
        len: usize,
        remaining: Option<(u32, u32)>,
    ) -> Result<usize, FecError> {
        match self {
            Tx::Block(t) => t.protect_placed(now, out, len),
            Tx::Sliding(t) => t.protect_placed(now, out, len, remaining),
        }
    }

    pub(crate) fn poll_parity(&mut self, now: Instant, out: &mut [u8]) -> Option<usize> {
        match self {
            Tx::Block(t) => t.poll_parity(now, out),
            Tx::Sliding(t) => t.poll_parity(now, out),
        }
    }

    /// What `poll_parity` with an empty buffer does: closes an expired group or chunk, runs
    /// the tail timer, and takes no parity (a body never fits in no bytes).
    #[inline]
    pub(crate) fn close_expired(&mut self, now: Instant) {
        match self {
            Tx::Block(t) => {
                let _ = t.poll_parity(now, &mut []);
            }
            Tx::Sliding(t) => t.handle_timeout(now),
        }
    }

    pub(crate) fn next_parity_len(&self) -> Option<usize> {
        match self {
            Tx::Block(t) => t.next_parity_len(),
            Tx::Sliding(t) => t.next_parity_len(),
        }
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Tx::Block(t) => t.poll_timeout(),
            Tx::Sliding(t) => t.poll_timeout(),
        }
    }

    /// Whether `poll_parity` at `now` would close a group or chunk or run the tail timer
    /// (a state change even when no parity comes of it). The sliding code acts exactly
    /// when its `poll_timeout` has passed; the block code closes an expired group even
    /// when it plans no parity (and has no timer for it).
    pub(crate) fn expiry_due(&self, now: Instant) -> bool {
        match self {
            Tx::Block(t) => t.expiry_due(now),
            Tx::Sliding(t) => t.poll_timeout().is_some_and(|t| now >= t),
        }
    }

    pub(crate) fn on_loss_report(&mut self, r: LossReport) {
        match self {
            Tx::Block(t) => t.on_loss_report_detail(r),
            Tx::Sliding(t) => t.on_loss_report_detail(r),
        }
    }

    pub(crate) fn stats(&self) -> SenderStats {
        match self {
            Tx::Block(t) => t.stats(),
            Tx::Sliding(t) => t.stats(),
        }
    }

    /// Gives back what an idle sender need not hold (see the schemes' `release_idle`).
    pub(crate) fn release_idle(&mut self, now: Instant) {
        match self {
            Tx::Block(t) => t.release_idle(),
            Tx::Sliding(t) => t.release_idle(now),
        }
    }
}

/// The receiving half of the configured scheme.
// `FecLink` boxes the whole value, so the variants' size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Rx {
    Block(FecReceiver),
    Sliding(SlidingReceiver),
}

impl Rx {
    /// A receiver of `cfg.scheme` that retains within `budget`.
    pub(crate) fn new(cfg: FecConfig, budget: RetentionBudget) -> Rx {
        match cfg.scheme {
            FecScheme::Block => Rx::Block(FecReceiver::with_budget(cfg, budget)),
            FecScheme::Sliding => Rx::Sliding(SlidingReceiver::with_budget(cfg, budget)),
        }
    }

    /// The retention budget the receiver draws on (the endpoint lends its shared one here).
    pub(crate) fn budget_mut(&mut self) -> &mut RetentionBudget {
        match self {
            Rx::Block(r) => r.budget_mut(),
            Rx::Sliding(r) => r.budget_mut(),
        }
    }

    /// Bytes this receiver retains now (what its connection gives back when it ends).
    pub(crate) fn retained_bytes(&self) -> usize {
        self.stats().retained_bytes
    }

    /// Feeds a data (`parity` false) or repair body; delivers what it yields.
    pub(crate) fn receive(
        &mut self,
        now: Instant,
        body: &[u8],
        parity: bool,
        deliver: impl FnMut(&[u8]),
    ) -> Result<(), FecError> {
        match (self, parity) {
            (Rx::Block(r), true) => r.on_parity(now, body, deliver),
            (Rx::Block(r), false) => r.on_data(now, body, deliver),
            (Rx::Sliding(r), true) => r.on_parity(now, body, deliver),
            (Rx::Sliding(r), false) => r.on_data(now, body, deliver),
        }
    }

    /// Repair equations waiting for more sources (always 0 for the block code).
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn pending_repairs(&self) -> usize {
        match self {
            Rx::Block(_) => 0,
            Rx::Sliding(r) => r.pending_repairs(),
        }
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Rx::Block(r) => r.poll_timeout(),
            Rx::Sliding(r) => r.poll_timeout(),
        }
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        match self {
            Rx::Block(r) => r.handle_timeout(now),
            Rx::Sliding(r) => r.handle_timeout(now),
        }
    }

    pub(crate) fn loss_report(&mut self) -> LossReport {
        match self {
            Rx::Block(r) => r.loss_report_detail(),
            Rx::Sliding(r) => r.loss_report_detail(),
        }
    }

    pub(crate) fn stats(&self) -> ReceiverStats {
        match self {
            Rx::Block(r) => r.stats(),
            Rx::Sliding(r) => r.stats(),
        }
    }

    /// Gives back what an idle receiver need not hold (see the schemes' `release_idle`).
    pub(crate) fn release_idle(&mut self) {
        match self {
            Rx::Block(r) => r.release_idle(),
            Rx::Sliding(r) => r.release_idle(),
        }
    }
}
