//! Congestion control: the controller [`crate::Config`] selects, behind one interface the
//! connection's rooms call (window, pacing, acknowledgements, losses, timeouts, the rate
//! estimate). NewReno (`newreno.rs`, the default) is window-based and paces only with
//! [`crate::Config::pacing`]; the delay-aware rate controller (`delay.rs`) always paces.

mod delay;
mod newreno;

use std::time::{Duration, Instant};

pub(crate) use self::delay::{Delay, DelayParams};
pub(crate) use self::newreno::NewReno;

/// The connection's congestion controller. The delay controller is boxed so that a
/// connection with the default controller is no larger than before it existed.
#[derive(Debug, Clone)]
pub(crate) enum Congestion {
    /// Loss-based NewReno on bytes in flight.
    NewReno(NewReno),
    /// Delay-aware rate control with a delivery-rate estimate.
    Delay(Box<Delay>),
}

impl Congestion {
    pub(crate) fn new(cfg: &crate::Config) -> Self {
        match cfg.congestion_controller {
            crate::CongestionController::Delay if cfg.congestion_control => {
                let mss = cfg.max_datagram_size;
                Self::Delay(Box::new(Delay::new(DelayParams {
                    mss,
                    init_window: cfg.initial_window_packets.max(1) * mss,
                    min_window: cfg.min_window_packets.max(1) * mss,
                    loss_tolerant: cfg.loss_tolerant,
                    floor: cfg.min_send_rate,
                    ceiling: cfg.max_send_rate,
                    initial_rtt: cfg.initial_rtt,
                })))
            }
            _ => Self::NewReno(NewReno::new(cfg)),
        }
    }

    /// The congestion window, bytes.
    pub(crate) fn window(&self) -> usize {
        match self {
            Self::NewReno(c) => c.window,
            Self::Delay(c) => c.window(),
        }
    }

    /// Bytes in flight.
    pub(crate) fn in_flight(&self) -> usize {
        match self {
            Self::NewReno(c) => c.in_flight,
            Self::Delay(c) => c.in_flight,
        }
    }

    /// The send rate the controller estimates the path carries for this connection, bytes per
    /// second: the delay controller's bandwidth estimate (within the configured floor and
    /// ceiling); for NewReno the window over the smoothed RTT.
    pub(crate) fn rate_estimate(&self, srtt: Duration) -> u64 {
        match self {
            Self::NewReno(c) => (c.window as f64 / srtt.as_secs_f64().max(1e-4)) as u64,
            Self::Delay(c) => c.rate_estimate() as u64,
        }
    }

    /// Whether sends are paced (then [`Self::pacing_delay`] gates them).
    pub(crate) fn paces(&self) -> bool {
        match self {
            Self::NewReno(c) => c.paces(),
            Self::Delay(_) => true,
        }
    }

    /// May a packet of `size` bytes be sent now (window only; pacing is [`Self::pacing_delay`]).
    pub(crate) fn can_send(&self, size: usize) -> bool {
        match self {
            Self::NewReno(c) => c.can_send(size),
            Self::Delay(c) => c.can_send(size),
        }
    }

    pub(crate) fn on_sent(&mut self, size: usize) {
        match self {
            Self::NewReno(c) => c.on_sent(size),
            Self::Delay(c) => c.on_sent(size),
        }
    }

    /// A packet of `size` bytes sent at `sent` was acknowledged.
    pub(crate) fn on_acked(&mut self, size: usize, sent: Instant) {
        match self {
            Self::NewReno(c) => c.on_acked(size, sent),
            Self::Delay(c) => c.on_acked(size, sent),
        }
    }

    /// An ACK frame was processed (after its [`Self::on_acked`] calls): `rtt_sample` is the
    /// path RTT it measured, if any, `srtt` the smoothed RTT after it.
    pub(crate) fn on_ack_end(
        &mut self,
        now: Instant,
        rtt_sample: Option<Duration>,
        srtt: Duration,
    ) {
        if let Self::Delay(c) = self {
            c.on_ack_end(now, rtt_sample, srtt);
        }
    }

    /// Bytes left flight without an ACK (declared lost).
    pub(crate) fn on_removed(&mut self, size: usize) {
        match self {
            Self::NewReno(c) => c.on_removed(size),
            Self::Delay(c) => c.on_removed(size),
        }
    }

    /// Parity of `size` bytes sent at `sent` left the path without an ACK of its own (parity
    /// is never acknowledged): a packet sent after it was acknowledged or declared lost.
    /// `arrived` is the share of it taken as delivered: the chance it arrived (1 less the
    /// loss the peer reports) after an ACK, 0 after a loss. The delay controller counts that
    /// share in its round's delivery rate, as it charged the pacer for all of it: a rate
    /// measured on data alone, while repairs take their share of the pacing, falls by that
    /// share every round; counting lost parity as delivered would raise it past the path.
    /// NewReno's window does not grow on parity.
    #[cfg(feature = "fec")]
    pub(crate) fn on_parity_left(&mut self, size: usize, sent: Instant, arrived: f64) {
        match self {
            Self::Delay(c) => {
                let credit = ((size as f64 * arrived.clamp(0.0, 1.0)) as usize).min(size);
                if credit > 0 {
                    c.on_acked(credit, sent);
                }
                c.on_removed(size - credit);
            }
            Self::NewReno(c) => c.on_removed(size),
        }
    }

    /// A fast-retransmit loss of a packet sent at `sent`; `queueing` says whether the smoothed
    /// RTT shows a standing queue (NewReno's test; the delay controller uses its own).
    pub(crate) fn on_loss(&mut self, now: Instant, sent: Instant, queueing: bool) {
        match self {
            Self::NewReno(c) => c.on_loss(now, sent, queueing),
            Self::Delay(c) => c.on_loss(),
        }
    }

    /// Retransmission timeout; `congested` says whether it is taken for congestion.
    pub(crate) fn on_rto(&mut self, now: Instant, congested: bool) {
        match self {
            Self::NewReno(c) => c.on_rto(now, congested),
            Self::Delay(c) => c.on_rto(congested),
        }
    }

    /// How long until pacing allows `size` more bytes (None = now).
    pub(crate) fn pacing_delay(
        &mut self,
        now: Instant,
        srtt: Duration,
        size: usize,
    ) -> Option<Duration> {
        match self {
            Self::NewReno(c) => c.pacing_delay(now, srtt, size),
            Self::Delay(c) => c.pacing_delay(now, size),
        }
    }
}

#[cfg(test)]
mod tests;
