//! FEC counters and the retention budget: the parts of the FEC API that exist whether or not
//! the `fec` feature compiles the codecs in (a connection's [`crate::FecStats`] carries them,
//! and an endpoint shares one budget among its connections).

use super::error::FecError;

/// Default retention budget of one endpoint: 1 MiB.
pub const DEFAULT_RETENTION_BUDGET: usize = 1 << 20;

/// Bytes a receiver may retain for incomplete groups: a limit, the bytes retained now and the
/// most ever retained at once.
///
/// A receiver draws on the budget it holds ([`FecReceiver::budget_mut`](super::FecReceiver::budget_mut),
/// [`SlidingReceiver::budget_mut`](super::SlidingReceiver::budget_mut)). To share one budget
/// among the receivers of many connections, as an endpoint does, swap it into a receiver before
/// each call and back out after (`std::mem::swap`): everything runs on one thread, so nothing is
/// shared behind the caller's back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionBudget {
    limit: usize,
    used: usize,
    peak: usize,
}

impl Default for RetentionBudget {
    fn default() -> Self {
        RetentionBudget::new(DEFAULT_RETENTION_BUDGET)
    }
}

impl RetentionBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> RetentionBudget {
        RetentionBudget {
            limit,
            used: 0,
            peak: 0,
        }
    }

    /// The limit in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes retained right now, by every receiver that drew on this budget.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Most bytes ever retained at once. Never above [`RetentionBudget::limit`].
    pub fn peak(&self) -> usize {
        self.peak
    }

    #[cfg(feature = "fec")]
    pub(crate) fn try_reserve(&mut self, n: usize) -> bool {
        match self.used.checked_add(n).filter(|&v| v <= self.limit) {
            Some(v) => {
                self.used = v;
                self.peak = self.peak.max(v);
                true
            }
            None => false,
        }
    }

    /// Gives back `n` bytes: a group finished, or (`Endpoint`) a connection holding them ended.
    pub(crate) fn release(&mut self, n: usize) {
        self.used = self.used.saturating_sub(n);
    }
}

/// Malformed bodies dropped, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MalformedCounts {
    /// Shorter than the header, or a parity shard too short for its codec.
    pub truncated: u64,
    /// Reserved header bits set.
    pub reserved_bits: u64,
    /// Data or parity shard count zero or too large.
    pub bad_shape: u64,
    /// Shard index outside its group.
    pub index_out_of_range: u64,
    /// Unknown codec id.
    pub unknown_codec: u64,
    /// Payload or coded shard longer than allowed.
    pub too_long: u64,
    /// Contradicts what earlier shards said about the group.
    pub inconsistent: u64,
    /// Parity for a group the receiver cannot know about.
    pub unknown_group: u64,
}

impl MalformedCounts {
    /// All malformed bodies.
    pub fn total(&self) -> u64 {
        self.truncated
            + self.reserved_bits
            + self.bad_shape
            + self.index_out_of_range
            + self.unknown_codec
            + self.too_long
            + self.inconsistent
            + self.unknown_group
    }

    /// Counts `r` if it is an error, and passes it on.
    pub(crate) fn tally<T>(&mut self, r: Result<T, FecError>) -> Result<T, FecError> {
        if let Err(e) = &r {
            self.count(*e);
        }
        r
    }

    pub(crate) fn count(&mut self, e: FecError) {
        let c = match e {
            FecError::Truncated => &mut self.truncated,
            FecError::ReservedBits => &mut self.reserved_bits,
            FecError::BadShape => &mut self.bad_shape,
            FecError::IndexOutOfRange => &mut self.index_out_of_range,
            FecError::UnknownCodec => &mut self.unknown_codec,
            FecError::LengthTooLarge => &mut self.too_long,
            FecError::InconsistentGroup => &mut self.inconsistent,
            FecError::UnknownGroup | FecError::BufferTooSmall { .. } => &mut self.unknown_group,
        };
        *c += 1;
    }
}

/// What a receiver reports back to the peer's sender for one window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LossReport {
    /// Data shards that arrived, counted once their fate is decided (as many later ones
    /// arrived as a loss waits for), so that the ratio to `lost` is the path's loss from
    /// the first report on.
    pub received: u64,
    /// Data shards lost on the wire.
    pub lost: u64,
    /// Longest run of consecutive lost data shards.
    pub max_burst: u64,
}

/// Receiver-side counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReceiverStats {
    /// Data payloads delivered as received.
    pub data_delivered: u64,
    /// Data payloads rebuilt from parity and delivered.
    pub data_recovered: u64,
    /// Data bodies dropped as duplicates (or already rebuilt).
    pub duplicates: u64,
    /// Data bodies older than the tracking window (delivered; ARQ dedups).
    pub late_data: u64,
    /// Parity bodies accepted.
    pub parity_received: u64,
    /// Parity bodies for finished or long-gone groups, or duplicates, ignored.
    pub parity_ignored: u64,
    /// Groups whose data all arrived.
    pub groups_complete: u64,
    /// Groups rebuilt from parity.
    pub groups_recovered: u64,
    /// Groups with parity that were dropped with data still missing (ARQ's job now).
    pub groups_unrecoverable: u64,
    /// Groups dropped at the age limit.
    pub groups_expired: u64,
    /// Groups dropped early to make room (budget or group limit).
    pub groups_evicted: u64,
    /// Shards not retained because the budget was exhausted.
    pub retention_refused: u64,
    /// Decodes that failed or produced an impossible length (data left to ARQ).
    pub recovery_failures: u64,
    /// Bytes this receiver retains now.
    pub retained_bytes: usize,
    /// Most bytes this receiver retained at once.
    pub peak_retained_bytes: usize,
    /// Distinct data shards that arrived (loss accounting).
    pub received: u64,
    /// Data shards counted lost on the wire (before FEC), net of late arrivals.
    pub lost: u64,
    /// Malformed bodies dropped.
    pub malformed: MalformedCounts,
}

impl ReceiverStats {
    /// Loss on the wire as a fraction of data shards (before FEC).
    pub fn realized_loss(&self) -> f64 {
        let total = self.received + self.lost;
        if total == 0 {
            0.0
        } else {
            self.lost as f64 / total as f64
        }
    }
}

/// Sender-side counters.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct SenderStats {
    /// Data bodies produced by `protect`.
    pub data_shards: u64,
    /// Data body bytes (header + payload).
    pub data_bytes: u64,
    /// Groups closed.
    pub groups: u64,
    /// Parity bodies handed out by `poll_parity`.
    pub parity_shards_sent: u64,
    /// Parity body bytes handed out.
    pub parity_bytes_sent: u64,
    /// Parity shards the last closed group carried.
    pub current_parity: usize,
    /// Most parity shards any group carried.
    pub max_parity: usize,
    /// Times the adaptive policy changed its parity level.
    pub policy_changes: u64,
    /// Groups that got fewer parity shards than planned because of the parity-byte cap.
    pub groups_capped: u64,
    /// Parity bodies dropped unsent because more than [`MAX_QUEUED_PARITY`](super::MAX_QUEUED_PARITY) were waiting
    /// (late parity is worth little; ARQ covers those groups).
    pub parity_dropped: u64,
    /// Highest parity/data byte ratio (per mille) over the cap window (the last
    /// `cap_window_groups` groups) ending at any group that carried parity. Never above
    /// `parity_cap_percent * 10`; parity over the whole history never exceeds the cap either.
    pub peak_window_parity_permille: u64,
    /// Total `received` the peer reported.
    pub reported_received: u64,
    /// Total `lost` the peer reported.
    pub reported_lost: u64,
    /// Sliding code: repairs queued by the tail timer (the rest follow the ratio).
    pub tail_repairs: u64,
    /// Sliding code: tail timer firings that queued no repair because the uncovered sources
    /// were likely all received (`SlidingConfig::tail_skip_residual`).
    pub tails_skipped: u64,
    /// Sliding code: chunks of messages of several fragments protected as such (see
    /// `Connection` docs on large unreliable messages).
    pub message_chunks: u64,
    /// Sliding code: repairs queued at the end of those chunks.
    pub message_repairs: u64,
}

impl SenderStats {
    /// Loss the peer reported, as a fraction of datagrams (0 if nothing was reported).
    pub fn reported_loss(&self) -> f64 {
        let total = self.reported_received + self.reported_lost;
        if total == 0 {
            0.0
        } else {
            self.reported_lost as f64 / total as f64
        }
    }
}
