//! FEC settings: the policy, the scheme and their tuning ([`FecConfig`]).

use std::time::Duration;

use super::header::{LEN_PREFIX, PARITY_HEADER_LEN};
#[cfg(feature = "fec")]
use super::header::{MAX_DATA_SHARDS, MAX_PARITY_SHARDS, MAX_REPAIR_SOURCES};

/// How much parity (block) or how many repairs (sliding) the sender adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FecPolicy {
    /// No parity. Data bodies still carry the 3-byte header, so the peer can report loss.
    Off,
    /// `parity` parity shards per group (subject to the parity-byte cap).
    Fixed {
        /// Parity shards per group.
        parity: u8,
    },
    /// 0..=`max_parity` parity shards per group, following the loss the peer reports.
    Adaptive {
        /// Upper bound on parity shards per group.
        max_parity: u8,
    },
}

/// Which code protects the datagrams. Both ends must use the same scheme: data bodies are the same
/// in both, so data always flows, but each scheme's receiver rejects the other's parity/repair
/// bodies as [`FecError::UnknownCodec`](super::FecError::UnknownCodec) (counted as malformed),
/// leaving every loss to ARQ. (A block receiver also retains a sliding sender's protected data
/// shards as one-shard groups until their age limit; the budget bounds that.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FecScheme {
    /// Block code: groups of consecutive datagrams, Reed-Solomon parity after each group.
    Block,
    /// Sliding-window random linear code: repairs over the most recent sources at a ratio of
    /// the sources and shortly after the sender goes quiet ([`SlidingConfig`]).
    #[default]
    Sliding,
}

/// Tuning of the sliding-window code.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlidingConfig {
    /// Most sources one repair covers (1..=64; 32 by default).
    pub window: usize,
    /// Sources sent longer ago than this leave the window (20 ms, about one path RTT: a
    /// loss older than that is ARQ's anyway).
    pub max_age: Duration,
    /// Sources per adaptive "group": the policy's parity level `p` for this many sources
    /// sets one repair per `span / p` sources (12 by default: on the simulator's `random`
    /// echo it repairs as fast as 16 with fewer tail repairs, see `tail_skip_residual`).
    pub span: usize,
    /// Repairs go out this long after the last source not yet covered by one when no further
    /// source follows (1 ms), so a lost tail is repaired before ARQ would notice it.
    pub tail_wait: Duration,
    /// Most repairs one tail carries (2); how many it carries below that is set by
    /// `tail_residual` and, after a loss burst of 3 or more, by what one such burst among
    /// the datagrams sent since the oldest source in the window could erase beyond the
    /// repairs sent after it (the burst's odds of doing so above `tail_residual`).
    pub tail_repairs: usize,
    /// Chance the tail may leave its sources unrepaired: the tail carries the fewest repairs
    /// (at least one) for which the sources sent since the last repair, plus the tail, lose
    /// more than it repairs with at most this probability, at the adaptive policy's loss
    /// estimate (0.05 by default). A longest recent loss burst of 3 or more may raise it
    /// (see `tail_repairs`).
    pub tail_residual: f64,
    /// The tail is skipped (the next repair covers its sources) when the sources sent since
    /// the last repair are all received with probability at least 1 - this, at the adaptive
    /// policy's loss estimate (0.06 by default: at 5 % loss a tail after a single source; 0
    /// never skips). After a loss burst of 3 or more was reported recently, the odds are
    /// those of one burst touching those sources, and no burst among the recent datagrams
    /// may leave sources unrepaired (see `tail_repairs`). A skipped source may wait for the
    /// next pause; a tail after a few sources is far more often useful.
    pub tail_skip_residual: f64,
}

impl Default for SlidingConfig {
    fn default() -> Self {
        SlidingConfig {
            window: 32,
            max_age: Duration::from_millis(20),
            span: 12,
            tail_wait: Duration::from_millis(1),
            tail_repairs: 2,
            tail_residual: 0.05,
            tail_skip_residual: 0.06,
        }
    }
}

/// Tuning of the adaptive policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaptiveConfig {
    /// Loss-report samples (received + lost) gathered before the loss estimate moves.
    pub min_samples: u64,
    /// Weight of a new sample in the loss estimate (exponential moving average).
    pub alpha: f64,
    /// Parity is chosen so the chance a group loses more shards than it has parity for stays
    /// below this, under independent loss at the estimated rate.
    pub target_residual: f64,
    /// Estimates below this count as a clean path (zero parity).
    pub clean_loss: f64,
    /// Consecutive estimates calling for less parity before parity drops by one (hysteresis;
    /// parity rises at once).
    pub decrease_after: u32,
    /// Loss bursts (runs of consecutive lost shards) are remembered over this many estimates:
    /// the block code's parity covers the longest recent burst of at least 2, since
    /// independent-loss odds understate bursts; the sliding code sizes its tail repairs for
    /// it (see [`SlidingConfig::tail_repairs`]).
    pub burst_memory: usize,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        AdaptiveConfig {
            min_samples: 32,
            alpha: 0.3,
            target_residual: 0.01,
            clean_loss: 0.002,
            decrease_after: 3,
            burst_memory: 8,
        }
    }
}

/// FEC settings for one connection (sender and receiver sides). `#[non_exhaustive]`: start
/// from [`FecConfig::default`] (adaptive) or [`FecConfig::with_policy`] and change fields, or
/// use [`FecConfig::with`].
///
/// ```
/// use ricochet_proto::fec::{FecConfig, FecPolicy};
///
/// let fixed = FecConfig::with_policy(FecPolicy::Fixed { parity: 2 }).with(|f| f.max_data_shards = 4);
/// assert_eq!(fixed.max_data_shards, 4);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct FecConfig {
    /// Parity policy of the sender.
    pub policy: FecPolicy,
    /// Block or sliding-window code (both ends alike; sliding by default).
    pub scheme: FecScheme,
    /// Sliding-window tuning (used when `scheme` is [`FecScheme::Sliding`]).
    pub sliding: SlidingConfig,
    /// Data shards after which a group closes (1..=64; 8 by default).
    pub max_data_shards: usize,
    /// Time after a group's first shard at which it closes even if not full (2 ms).
    pub group_wait: Duration,
    /// Largest payload `protect` accepts and the receiver believes (1,200 B by default).
    pub max_payload: usize,
    /// Parity body bytes never exceed this percentage of data body bytes (50 by default):
    /// over the whole history at every moment, and (block code) over every run of
    /// `cap_window_groups` consecutive groups that ends with a group carrying parity. (A
    /// window ending with a parity-free group can read higher only because older data left
    /// it.) The sliding code caps repair bytes over the whole history.
    pub parity_cap_percent: u32,
    /// Length of the parity-cap window in groups (16).
    pub cap_window_groups: usize,
    /// The receiver drops an incomplete group this long after its first shard arrived (200 ms).
    /// The sliding receiver drops held sources and pending repair equations at the same age
    /// (and sources sooner once they fall `sliding.window` + 16 seqs behind the newest).
    pub max_group_age: Duration,
    /// Incomplete groups one receiver tracks at most (64).
    pub max_groups: usize,
    /// Adaptive-policy tuning.
    pub adaptive: AdaptiveConfig,
}

impl Default for FecConfig {
    fn default() -> Self {
        FecConfig {
            policy: FecPolicy::Adaptive { max_parity: 4 },
            scheme: FecScheme::default(),
            sliding: SlidingConfig::default(),
            max_data_shards: 8,
            group_wait: Duration::from_millis(2),
            max_payload: 1200,
            parity_cap_percent: 50,
            cap_window_groups: 16,
            max_group_age: Duration::from_millis(200),
            max_groups: 64,
            adaptive: AdaptiveConfig::default(),
        }
    }
}

impl FecConfig {
    /// The defaults with the sender's parity `policy`.
    pub fn with_policy(policy: FecPolicy) -> Self {
        Self::default().with(|f| f.policy = policy)
    }

    /// This configuration with `tune` applied.
    pub fn with(mut self, tune: impl FnOnce(&mut Self)) -> Self {
        tune(&mut self);
        self
    }

    /// The largest parity body this configuration produces: size send buffers with it.
    /// A parity body is [`PARITY_HEADER_LEN`] + 2 (+ 1 for even rounding) bytes longer than
    /// the largest payload, so the proto layer leaves that much room below its MTU.
    pub fn max_parity_body(&self) -> usize {
        PARITY_HEADER_LEN + LEN_PREFIX + self.max_payload + 1
    }

    /// Clamps fields to the ranges the implementation supports.
    #[cfg(feature = "fec")]
    pub(super) fn sanitized(mut self) -> FecConfig {
        self.max_data_shards = self.max_data_shards.clamp(1, MAX_DATA_SHARDS);
        self.max_payload = self.max_payload.min(u16::MAX as usize - 3);
        self.cap_window_groups = self.cap_window_groups.max(1);
        self.max_groups = self.max_groups.max(1);
        self.sliding.window = self.sliding.window.clamp(1, MAX_REPAIR_SOURCES);
        self.sliding.span = self.sliding.span.max(1);
        let cap = |p: u8| p.min(MAX_PARITY_SHARDS as u8);
        self.policy = match self.policy {
            FecPolicy::Off => FecPolicy::Off,
            FecPolicy::Fixed { parity } => FecPolicy::Fixed {
                parity: cap(parity),
            },
            FecPolicy::Adaptive { max_parity } => FecPolicy::Adaptive {
                max_parity: cap(max_parity),
            },
        };
        self
    }
}
