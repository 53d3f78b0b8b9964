//! NewReno congestion control on bytes in flight, with optional pacing (the default controller).

use std::time::{Duration, Instant};

/// NewReno state.
#[derive(Debug, Clone)]
pub(crate) struct NewReno {
    pub(crate) enabled: bool,
    pub(crate) loss_tolerant: bool,
    mss: usize,
    pub(crate) window: usize,
    ssthresh: usize,
    min_window: usize,
    pub(crate) in_flight: usize,
    /// Packets sent before this instant belong to the recovery period already reacted to.
    recovery_start: Option<Instant>,
    pacing: bool,
    /// Pacing tokens in bytes and when they were last refilled.
    tokens: f64,
    refilled: Option<Instant>,
}

/// Multiplicative decrease factor (CUBIC's; gentler than Reno's 0.5 for small windows).
const BETA: f64 = 0.7;

impl NewReno {
    pub(crate) fn new(cfg: &crate::Config) -> Self {
        let mss = cfg.max_datagram_size;
        Self {
            enabled: cfg.congestion_control,
            loss_tolerant: cfg.loss_tolerant,
            mss,
            window: cfg.initial_window_packets.max(1) * mss,
            ssthresh: usize::MAX,
            min_window: cfg.min_window_packets.max(1) * mss,
            in_flight: 0,
            recovery_start: None,
            pacing: cfg.pacing,
            tokens: (10 * mss) as f64,
            refilled: None,
        }
    }

    /// Whether sends are paced ([`crate::Config::pacing`], with the window on).
    pub(crate) fn paces(&self) -> bool {
        self.pacing && self.enabled
    }

    /// May a packet of `size` bytes be sent now (window only; pacing is [`Self::pacing_delay`]).
    pub(crate) fn can_send(&self, size: usize) -> bool {
        !self.enabled || self.in_flight + size <= self.window
    }

    pub(crate) fn on_sent(&mut self, size: usize) {
        self.in_flight += size;
        if self.pacing {
            self.tokens -= size as f64;
        }
    }

    pub(crate) fn on_acked(&mut self, size: usize, sent: Instant) {
        // In flight before this acknowledgement: whether the sender was using its window.
        let before = self.in_flight;
        self.in_flight = self.in_flight.saturating_sub(size);
        if self.recovery_start.is_some_and(|r| sent <= r) {
            return;
        }
        if before.saturating_mul(2) < self.window {
            // Application-limited (RFC 9002, section 7.8): an acknowledgement of a flow that
            // fills less than half the window says nothing about a larger one. Growing anyway
            // let a game's steady trickle raise the window without bound, so that a later
            // burst went out unchecked.
            return;
        }
        if self.window < self.ssthresh {
            self.window += size;
        } else {
            self.window += (self.mss * size / self.window.max(1)).max(1);
        }
    }

    /// Bytes left flight without an ACK (declared lost).
    pub(crate) fn on_removed(&mut self, size: usize) {
        self.in_flight = self.in_flight.saturating_sub(size);
    }

    /// A fast-retransmit loss of a packet sent at `sent`. `queueing` says whether the RTT shows a
    /// standing queue (see the module docs on random loss).
    pub(crate) fn on_loss(&mut self, now: Instant, sent: Instant, queueing: bool) {
        if self.recovery_start.is_some_and(|r| sent <= r) {
            return;
        }
        if self.loss_tolerant && !queueing {
            return;
        }
        self.recovery_start = Some(now);
        self.window = ((self.window as f64 * BETA) as usize).max(self.min_window);
        self.ssthresh = self.window;
    }

    /// Retransmission timeout: collapse the window, unless the loss looks random (loss tolerant
    /// and not `congested`: the caller saw no queueing in the RTT, and this is a first RTO
    /// after RTT samples): then a lost probe or a lost ACK after a small flight (a window-1
    /// message under random loss) is not taken for persistent congestion. The timer backoff
    /// still doubles either way.
    pub(crate) fn on_rto(&mut self, now: Instant, congested: bool) {
        if self.loss_tolerant && !congested {
            return;
        }
        self.recovery_start = Some(now);
        self.ssthresh = ((self.window as f64 * BETA) as usize).max(self.min_window);
        self.window = self.min_window;
    }

    /// How long until pacing allows `size` more bytes (None = now).
    pub(crate) fn pacing_delay(
        &mut self,
        now: Instant,
        srtt: Duration,
        size: usize,
    ) -> Option<Duration> {
        if !self.pacing || !self.enabled {
            return None;
        }
        let rate = 1.25 * self.window as f64 / srtt.as_secs_f64().max(1e-4); // bytes/s
        let burst = (10 * self.mss) as f64;
        if let Some(last) = self.refilled {
            let dt = now.saturating_duration_since(last).as_secs_f64();
            self.tokens = (self.tokens + dt * rate).min(burst);
        }
        self.refilled = Some(now);
        if self.tokens + 1.0 >= size as f64 {
            None
        } else {
            // At least 1 µs: a wait that rounds to zero would leave the timer in the past.
            let wait = Duration::from_secs_f64((size as f64 - self.tokens) / rate);
            Some(wait.max(Duration::from_micros(1)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_start_loss_and_rto() {
        let cfg = crate::Config::default();
        let mut c = NewReno::new(&cfg);
        let t0 = ricochet_testkit::SimClock::new().now();
        let w0 = c.window;
        // A flow that uses its window grows it in slow start.
        for _ in 0..w0 / 1200 {
            c.on_sent(1200);
        }
        c.on_acked(1200, t0);
        assert_eq!(c.window, w0 + 1200);
        // Random loss on a path without queueing does not shrink the window...
        c.on_loss(t0, t0, false);
        assert_eq!(c.window, w0 + 1200);
        // ...but queueing loss does, once per recovery period.
        let t1 = t0 + Duration::from_millis(10);
        c.on_loss(t1, t0 + Duration::from_millis(1), true);
        let w1 = c.window;
        assert!(w1 < w0 + 1200);
        c.on_loss(t1, t0 + Duration::from_millis(2), true);
        assert_eq!(c.window, w1);
        // An RTO without queueing leaves a loss-tolerant window alone; with queueing it
        // collapses it.
        c.on_rto(t1, false);
        assert_eq!(c.window, w1);
        c.on_rto(t1, true);
        assert_eq!(c.window, cfg.min_window_packets * 1200);
        c.loss_tolerant = false;
        let t2 = t1 + Duration::from_millis(10);
        c.window = 100 * 1200;
        c.on_loss(t2, t2, false);
        assert_eq!(c.window, 70 * 1200);
    }

    /// A flow that keeps less than half its window in flight (a game's ticks) does not grow
    /// it, however much it sends over time; before, every acknowledgement grew it.
    #[test]
    fn an_application_limited_flow_keeps_its_window() {
        let cfg = crate::Config::default();
        let mut c = NewReno::new(&cfg);
        let t0 = ricochet_testkit::SimClock::new().now();
        let w0 = c.window;
        for _ in 0..10_000 {
            c.on_sent(1200);
            c.on_acked(1200, t0);
        }
        assert_eq!(c.window, w0);
        // Half the window in flight is using it: the window grows again.
        for _ in 0..w0 / 2400 {
            c.on_sent(1200);
        }
        c.on_acked(1200, t0);
        assert_eq!(c.window, w0 + 1200);
    }
}
