//! A link conditioner: impairs a live endpoint's traffic (loss, bursts of loss, delay, jitter,
//! reordering, duplication, a rate limit) so that a game can be played and tested under a bad
//! link without a relay.
//!
//! The settings ([`LinkConditioner`]) are plain data; each worker (and each client) turns them
//! into a [`Conditioner`] that holds the datagrams it delays in one time-ordered queue per
//! direction. Off (the default) there is no conditioner at all, and the hot loops run their
//! [`Off`] instantiation: the same code as a build without the `conditioner` feature, checked
//! between turns, allocating nothing.
//!
//! Files: the settings here; the conditioner itself in `queues`; the loops' [`Mode`] in `mode`;
//! what a conditioner is built from and the server's shared settings in `control`.

use std::time::Duration;

use super::error::RuntimeError;

mod control;
mod mode;
mod queues;

pub(crate) use control::{ConditionerControl, Plan};
pub(crate) use mode::{is_on, Mode, Off, On};
pub(crate) use queues::Conditioner;

/// Bursts of loss after the Gilbert-Elliott two-state model: the link is either good (the
/// direction's random [`Impairment::loss`] applies) or bad (`loss_in_burst` applies); each
/// datagram first moves the link from good to bad with probability `enter`, or from bad to good
/// with probability `exit`. The mean burst lasts `1 / exit` datagrams; the link is bad for a
/// share `enter / (enter + exit)` of them.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct GilbertElliott {
    /// Probability per datagram of a good link turning bad (0.0 to 1.0).
    pub enter: f64,
    /// Probability per datagram of a bad link turning good (0.0 to 1.0; above 0).
    pub exit: f64,
    /// Loss probability while the link is bad (0.0 to 1.0).
    pub loss_in_burst: f64,
}

impl GilbertElliott {
    /// Bursts entered with probability `enter` per datagram, left with probability `exit`,
    /// losing every datagram while they last.
    pub fn new(enter: f64, exit: f64) -> Self {
        GilbertElliott {
            enter,
            exit,
            loss_in_burst: 1.0,
        }
    }

    /// The loss probability while in a burst (1.0 unless set).
    pub fn loss_in_burst(mut self, p: f64) -> Self {
        self.loss_in_burst = p;
        self
    }
}

/// A token-bucket rate limit: datagrams leave at `bytes_per_second` once a burst of
/// `burst_bytes` is spent; those that must wait are held, up to the conditioner's queue limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimit {
    /// Sustained rate in bytes per second (above 0).
    pub bytes_per_second: u64,
    /// Bytes that may pass at once after an idle time (the bucket's size).
    pub burst_bytes: u64,
}

impl RateLimit {
    /// `bytes_per_second` with a bucket of 16 KiB.
    pub fn new(bytes_per_second: u64) -> Self {
        RateLimit {
            bytes_per_second,
            burst_bytes: 16 * 1024,
        }
    }

    /// The bucket's size in bytes.
    pub fn burst_bytes(mut self, bytes: u64) -> Self {
        self.burst_bytes = bytes;
        self
    }
}

/// The impairments of one direction. The default impairs nothing.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct Impairment {
    /// Probability that a datagram is lost at random (0.0 to 1.0).
    pub loss: f64,
    /// Bursts of loss (two-state model), on top of the random loss.
    pub bursts: Option<GilbertElliott>,
    /// Delay added to every datagram.
    pub delay: Duration,
    /// Extra delay drawn uniformly from zero to this, per datagram (which reorders datagrams
    /// closer together than the jitter).
    pub jitter: Duration,
    /// Probability that a datagram is held `reorder_delay` longer than the others.
    pub reorder: f64,
    /// The extra delay of a reordered datagram.
    pub reorder_delay: Duration,
    /// Probability that a datagram is delivered twice (each copy delayed on its own).
    pub duplicate: f64,
    /// A rate limit, applied before the delay (a bottleneck, then the path).
    pub rate: Option<RateLimit>,
}

impl Impairment {
    /// Nothing impaired.
    pub fn new() -> Self {
        Impairment::default()
    }
    /// Random loss probability (0.0 to 1.0).
    pub fn loss(mut self, p: f64) -> Self {
        self.loss = p;
        self
    }
    /// Bursts of loss.
    pub fn bursts(mut self, bursts: GilbertElliott) -> Self {
        self.bursts = Some(bursts);
        self
    }
    /// Added delay.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
    /// Jitter: extra delay from zero to `jitter`.
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }
    /// A share `p` of the datagrams held `extra` longer.
    pub fn reorder(mut self, p: f64, extra: Duration) -> Self {
        self.reorder = p;
        self.reorder_delay = extra;
        self
    }
    /// Duplication probability.
    pub fn duplicate(mut self, p: f64) -> Self {
        self.duplicate = p;
        self
    }
    /// A rate limit.
    pub fn rate(mut self, rate: RateLimit) -> Self {
        self.rate = Some(rate);
        self
    }

    /// True when this direction changes nothing.
    pub fn is_none(&self) -> bool {
        *self == Impairment::default()
    }

    fn validate(&self, direction: &str) -> Result<(), RuntimeError> {
        let mut probs = vec![
            ("loss", self.loss),
            ("reorder", self.reorder),
            ("duplicate", self.duplicate),
        ];
        if let Some(b) = self.bursts {
            probs.extend([
                ("bursts.enter", b.enter),
                ("bursts.exit", b.exit),
                ("bursts.loss_in_burst", b.loss_in_burst),
            ]);
            if b.exit <= 0.0 {
                return Err(invalid(format!(
                    "{direction}: bursts.exit must be above 0 (a burst must end)"
                )));
            }
        }
        for (name, p) in probs {
            if !(0.0..=1.0).contains(&p) {
                return Err(invalid(format!(
                    "{direction}: {name} is a probability from 0.0 to 1.0, got {p}"
                )));
            }
        }
        if let Some(r) = self.rate {
            if r.bytes_per_second == 0 {
                return Err(invalid(format!(
                    "{direction}: rate.bytes_per_second must be above 0"
                )));
            }
        }
        Ok(())
    }
}

fn invalid(message: String) -> RuntimeError {
    RuntimeError::Config(format!("link conditioner: {message}"))
}

/// Link conditioner settings: the impairments of what an endpoint receives (`inbound`) and of
/// what it sends (`outbound`), a seed for their random draws, and the most datagrams held per
/// direction (beyond it a datagram is dropped and counted).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct LinkConditioner {
    /// What the endpoint receives.
    pub inbound: Impairment,
    /// What the endpoint sends.
    pub outbound: Impairment,
    /// Seed of the random draws (each worker adds its index).
    pub seed: u64,
    /// Most datagrams held per direction; more are dropped (counted as queue drops).
    pub queue_limit: usize,
}

impl Default for LinkConditioner {
    fn default() -> Self {
        LinkConditioner {
            inbound: Impairment::default(),
            outbound: Impairment::default(),
            seed: 0x5eed,
            queue_limit: 16_384,
        }
    }
}

impl LinkConditioner {
    /// The same impairment both ways (so an added delay counts twice in a round trip).
    pub fn symmetric(each_way: Impairment) -> Self {
        LinkConditioner {
            inbound: each_way,
            outbound: each_way,
            ..LinkConditioner::default()
        }
    }

    /// Different impairments for what is received and what is sent.
    pub fn new(inbound: Impairment, outbound: Impairment) -> Self {
        LinkConditioner {
            inbound,
            outbound,
            ..LinkConditioner::default()
        }
    }

    /// The seed of the random draws.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The most datagrams held per direction.
    pub fn queue_limit(mut self, datagrams: usize) -> Self {
        self.queue_limit = datagrams;
        self
    }

    /// True when neither direction changes anything.
    pub fn is_none(&self) -> bool {
        self.inbound.is_none() && self.outbound.is_none()
    }

    /// Check the settings: probabilities within 0.0 to 1.0, a burst that ends, a rate above 0.
    pub fn validate(&self) -> Result<(), RuntimeError> {
        if cfg!(not(feature = "conditioner")) {
            return Err(invalid(
                "ricochet was built without its `conditioner` feature (on by default)".into(),
            ));
        }
        self.inbound.validate("inbound")?;
        self.outbound.validate("outbound")?;
        if self.queue_limit == 0 {
            return Err(invalid("queue_limit must be above 0".into()));
        }
        Ok(())
    }
}
