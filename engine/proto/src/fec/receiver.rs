//! The receiving half: delivers data at once, retains incomplete groups within a budget and
//! an age limit, and rebuilds lost data shards from parity.

use std::time::Instant;

use super::codec::{CauchyCodec, Codec, CodecId, RsSimdCodec, MAX_DATA_SHARDS, MAX_PARITY_SHARDS};
use super::header::{DataHeader, ParityHeader, LEN_PREFIX};
use super::track::{SeqTracker, WINDOW};
use super::{FecConfig, FecError};
use super::{LossReport, ReceiverStats, RetentionBudget};

/// Parity for a group starting further than this past the newest data is dropped.
const MAX_AHEAD: u64 = 256;
/// Spare shard buffers kept per receiver.
const POOL_CAP: usize = 32;

/// One incomplete group.
#[derive(Default)]
struct Group {
    first: u64,
    created: Option<Instant>,
    /// Shape, once a parity shard said it.
    k: Option<usize>,
    m: usize,
    codec: Option<CodecId>,
    coded_len: usize,
    /// Upper bound on `k` from where the next group starts.
    k_hint: Option<usize>,
    /// Coded data shards (length prefix + payload, unpadded) by index.
    data: Vec<Option<Vec<u8>>>,
    /// Coded parity shards by index.
    parity: Vec<Option<Vec<u8>>>,
    n_data: usize,
    n_parity: usize,
    /// Highest data index seen + 1.
    data_span: usize,
    bytes: usize,
}

enum Outcome {
    Complete,
    Recovered,
    Expired,
    Evicted,
    Failed,
}

/// Receives FEC data and parity bodies and hands data payloads on. Sans-IO.
pub struct FecReceiver {
    cfg: FecConfig,
    budget: RetentionBudget,
    groups: Vec<Group>,
    spare_groups: Vec<Group>,
    pool: Vec<Vec<u8>>,
    scratch: Vec<Vec<u8>>,
    track: SeqTracker,
    cauchy: CauchyCodec,
    rs: Option<RsSimdCodec>,
    stats: ReceiverStats,
}

impl FecReceiver {
    /// A receiver with its own budget of [`DEFAULT_RETENTION_BUDGET`](super::DEFAULT_RETENTION_BUDGET).
    pub fn new(config: FecConfig) -> FecReceiver {
        Self::with_budget(config, RetentionBudget::default())
    }

    /// A receiver that retains within `budget` (see [`RetentionBudget`] for sharing one).
    pub fn with_budget(config: FecConfig, budget: RetentionBudget) -> FecReceiver {
        FecReceiver {
            cfg: config.sanitized(),
            budget,
            groups: Vec::new(),
            spare_groups: Vec::new(),
            pool: Vec::new(),
            scratch: Vec::new(),
            track: SeqTracker::default(),
            cauchy: CauchyCodec::new(),
            rs: None,
            stats: ReceiverStats::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> ReceiverStats {
        ReceiverStats {
            received: self.track.received,
            lost: self.track.lost,
            ..self.stats
        }
    }

    /// The budget this receiver draws on.
    pub fn budget(&self) -> &RetentionBudget {
        &self.budget
    }

    /// The budget this receiver draws on, to swap a shared one in (see [`RetentionBudget`]).
    pub fn budget_mut(&mut self) -> &mut RetentionBudget {
        &mut self.budget
    }

    /// Data shards (received, lost) since the last call, for the peer's adaptive policy. A
    /// shard counts as lost once 32 later ones arrived without it; a late arrival after that
    /// is netted out of the next window.
    pub fn loss_report(&mut self) -> (u64, u64) {
        let r = self.loss_report_detail();
        (r.received, r.lost)
    }

    /// Like [`FecReceiver::loss_report`], with the longest run of consecutive lost data
    /// shards in the window, which lets the peer size parity for burst loss.
    pub fn loss_report_detail(&mut self) -> LossReport {
        self.track.take_report()
    }

    /// When the oldest incomplete group reaches the age limit.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.groups
            .iter()
            .filter_map(|g| g.created)
            .min()
            .map(|t| t + self.cfg.max_group_age)
    }

    /// Drops groups that reached the age limit.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.expire(now);
    }

    /// Handles a data body: hands its payload to `deliver` at once (unless it is a
    /// duplicate), retains it if its group is protected, and delivers any data shards it lets
    /// the receiver rebuild. A malformed body is dropped, counted and returned as an error.
    pub fn on_data(
        &mut self,
        now: Instant,
        body: &[u8],
        mut deliver: impl FnMut(&[u8]),
    ) -> Result<(), FecError> {
        let r = self.data_inner(now, body, &mut deliver);
        self.stats.malformed.tally(r)
    }

    /// Handles a parity body: retains it and delivers any data shards it lets the receiver
    /// rebuild. A malformed body is dropped, counted and returned as an error.
    pub fn on_parity(
        &mut self,
        now: Instant,
        body: &[u8],
        mut deliver: impl FnMut(&[u8]),
    ) -> Result<(), FecError> {
        let r = self.parity_inner(now, body, &mut deliver);
        self.stats.malformed.tally(r)
    }

    fn data_inner(
        &mut self,
        now: Instant,
        body: &[u8],
        deliver: &mut dyn FnMut(&[u8]),
    ) -> Result<(), FecError> {
        self.expire(now);
        let (h, payload) = DataHeader::parse(body)?;
        if payload.len() > self.cfg.max_payload {
            return Err(FecError::LengthTooLarge);
        }
        let seq = self.track.extend(h.seq);
        let index = h.index as usize;
        let first = seq - index as u64;
        let coded = LEN_PREFIX + payload.len();
        // Validate against what we know before delivering anything.
        for g in &self.groups {
            if g.first == first {
                if !h.protected {
                    return Err(FecError::InconsistentGroup);
                }
                if let Some(k) = g.k {
                    if index >= k {
                        return Err(FecError::IndexOutOfRange);
                    }
                    if coded > g.coded_len {
                        return Err(FecError::InconsistentGroup);
                    }
                }
            } else if let Some(k) = g.k {
                if seq >= g.first && seq < g.first + k as u64 {
                    return Err(FecError::InconsistentGroup);
                }
            }
        }
        if !self
            .track
            .deliver_arrival(seq, payload, &mut self.stats, deliver)
        {
            return Ok(());
        }
        for g in &mut self.groups {
            if g.first < first {
                let bound = (first - g.first) as usize;
                g.k_hint = Some(g.k_hint.map_or(bound, |h| h.min(bound)));
            }
        }
        // After a resynchronisation the bitmap no longer knows a shard the group holds.
        let held = self
            .groups
            .iter()
            .any(|g| g.first == first && g.data.get(index).is_some_and(|d| d.is_some()));
        if h.protected && !held && self.reserve(coded, first) {
            let mut buf = self.take_buf();
            buf.extend_from_slice(&(payload.len() as u16).to_le_bytes());
            buf.extend_from_slice(payload);
            let gi = self.find_or_create(now, first);
            let g = &mut self.groups[gi];
            if g.data.len() <= index {
                g.data.resize_with(index + 1, || None);
            }
            g.data[index] = Some(buf);
            g.n_data += 1;
            g.data_span = g.data_span.max(index + 1);
            g.bytes += coded;
            self.try_recover(gi, deliver);
        }
        self.sweep_complete();
        Ok(())
    }

    fn parity_inner(
        &mut self,
        now: Instant,
        body: &[u8],
        deliver: &mut dyn FnMut(&[u8]),
    ) -> Result<(), FecError> {
        self.expire(now);
        let (h, shard) = ParityHeader::parse(body)?;
        if shard.len() > self.cfg.max_payload + LEN_PREFIX + 1 {
            return Err(FecError::LengthTooLarge);
        }
        let (k, m, idx) = (h.data as usize, h.parity as usize, h.index as usize);
        let first = self.track.extend(h.first_seq);
        if let Some(hi) = self.track.hi {
            if first > hi + MAX_AHEAD {
                return Err(FecError::UnknownGroup);
            }
            if first + k as u64 + WINDOW <= hi + 1 {
                // Its data is older than anything we track: finished long ago.
                self.stats.parity_ignored += 1;
                return Ok(());
            }
        }
        match self.groups.iter().position(|g| g.first == first) {
            Some(gi) => {
                let g = &self.groups[gi];
                if let Some(gk) = g.k {
                    if gk != k || g.m != m || g.codec != Some(h.codec) || g.coded_len != shard.len()
                    {
                        return Err(FecError::InconsistentGroup);
                    }
                }
                let longest = g.data.iter().flatten().map(|d| d.len()).max().unwrap_or(0);
                if g.data_span > k || longest > shard.len() || g.k_hint.is_some_and(|b| k > b) {
                    return Err(FecError::InconsistentGroup);
                }
                if g.parity.get(idx).is_some_and(|p| p.is_some()) {
                    self.stats.parity_ignored += 1;
                    return Ok(());
                }
            }
            None => {
                let end = first + k as u64;
                let overlaps = self.groups.iter().any(|g| {
                    let g_end = g.first + g.k.unwrap_or(g.data_span) as u64;
                    g.first < end && first < g_end
                });
                if overlaps {
                    return Err(FecError::InconsistentGroup);
                }
                if self.track.all_delivered(first, k) {
                    self.stats.parity_ignored += 1;
                    return Ok(());
                }
            }
        }
        self.stats.parity_received += 1;
        if !self.reserve(shard.len(), first) {
            return Ok(());
        }
        let mut buf = self.take_buf();
        buf.extend_from_slice(shard);
        let gi = self.find_or_create(now, first);
        let g = &mut self.groups[gi];
        g.k = Some(k);
        g.m = m;
        g.codec = Some(h.codec);
        g.coded_len = shard.len();
        if g.parity.len() < m {
            g.parity.resize_with(m, || None);
        }
        g.parity[idx] = Some(buf);
        g.n_parity += 1;
        g.bytes += shard.len();
        self.try_recover(gi, deliver);
        self.sweep_complete();
        Ok(())
    }

    /// Reserves `n` bytes of retention, evicting this receiver's oldest other groups if the
    /// budget is exhausted. False (and counted) if there is still no room.
    fn reserve(&mut self, n: usize, keep: u64) -> bool {
        loop {
            if self.budget.try_reserve(n) {
                self.stats.retained_bytes += n;
                self.stats.peak_retained_bytes = self
                    .stats
                    .peak_retained_bytes
                    .max(self.stats.retained_bytes);
                return true;
            }
            let oldest = self
                .groups
                .iter()
                .enumerate()
                .filter(|(_, g)| g.first != keep)
                .min_by_key(|(_, g)| g.first)
                .map(|(i, _)| i);
            match oldest {
                Some(i) => self.finish(i, Outcome::Evicted),
                None => {
                    self.stats.retention_refused += 1;
                    return false;
                }
            }
        }
    }

    fn find_or_create(&mut self, now: Instant, first: u64) -> usize {
        if let Some(i) = self.groups.iter().position(|g| g.first == first) {
            return i;
        }
        if self.groups.len() >= self.cfg.max_groups {
            if let Some(i) = (0..self.groups.len()).min_by_key(|&i| self.groups[i].first) {
                self.finish(i, Outcome::Evicted);
            }
        }
        let mut g = self.spare_groups.pop().unwrap_or_default();
        g.first = first;
        g.created = Some(now);
        // A group that starts after an existing one bounds that one's size, and vice versa.
        for o in &self.groups {
            if o.first > first {
                let bound = (o.first - first) as usize;
                g.k_hint = Some(g.k_hint.map_or(bound, |h| h.min(bound)));
            }
        }
        self.groups.push(g);
        self.groups.len() - 1
    }

    fn take_buf(&mut self) -> Vec<u8> {
        let mut b = self.pool.pop().unwrap_or_default();
        b.clear();
        b
    }

    /// Gives back pooled buffers and spare groups (the connection is idle); groups still open
    /// stay until they complete or age out as usual.
    pub fn release_idle(&mut self) {
        self.pool = Vec::new();
        self.spare_groups = Vec::new();
        self.scratch = Vec::new();
        self.groups.shrink_to_fit();
    }

    /// Rebuilds the group's missing data if enough shards are present.
    fn try_recover(&mut self, gi: usize, deliver: &mut dyn FnMut(&[u8])) {
        let g = &self.groups[gi];
        let (Some(k), Some(codec)) = (g.k, g.codec) else {
            return;
        };
        if g.n_data >= k || g.n_data + g.n_parity < k {
            return;
        }
        let (m, len, first) = (g.m, g.coded_len, g.first);
        if self.scratch.len() < k + m {
            self.scratch.resize_with(k + m, Vec::new);
        }
        let mut present = [false; MAX_DATA_SHARDS + MAX_PARITY_SHARDS];
        let shards = g.data.iter().chain(std::iter::repeat(&None)).take(k);
        let parity = g.parity.iter().chain(std::iter::repeat(&None)).take(m);
        for (i, src) in shards.chain(parity).enumerate() {
            let s = &mut self.scratch[i];
            s.clear();
            if let Some(src) = src {
                s.extend_from_slice(src);
                present[i] = true;
            }
            s.resize(len, 0);
        }
        let mut refs: [&mut [u8]; MAX_DATA_SHARDS + MAX_PARITY_SHARDS] =
            std::array::from_fn(|_| <&mut [u8]>::default());
        for (r, s) in refs.iter_mut().zip(&mut self.scratch[..k + m]) {
            *r = s.as_mut_slice();
        }
        let refs = &mut refs[..k + m];
        let result = match codec {
            CodecId::Cauchy => self.cauchy.reconstruct(k, refs, &present[..k + m]),
            CodecId::RsSimd => {
                self.rs
                    .get_or_insert_with(RsSimdCodec::new)
                    .reconstruct(k, refs, &present[..k + m])
            }
        };
        if result.is_err() {
            self.stats.recovery_failures += 1;
            self.finish(gi, Outcome::Failed);
            return;
        }
        for i in (0..k).filter(|&i| !present[i]) {
            let s = &self.scratch[i];
            let n = u16::from_le_bytes([s[0], s[1]]) as usize;
            if LEN_PREFIX + n > len {
                // Parity that does not match the data: leave this shard to ARQ.
                self.stats.recovery_failures += 1;
                continue;
            }
            let seq = first + i as u64;
            if !self.track.is_delivered(seq) {
                self.track.mark_delivered(seq);
                self.stats.data_recovered += 1;
                deliver(&self.scratch[i][LEN_PREFIX..LEN_PREFIX + n]);
            }
        }
        self.finish(gi, Outcome::Recovered);
    }

    /// Drops groups whose data has all been delivered.
    fn sweep_complete(&mut self) {
        let mut i = 0;
        while i < self.groups.len() {
            let g = &self.groups[i];
            if let Some(k) = g.k.or(g.k_hint) {
                if self.track.all_delivered(g.first, k) {
                    self.finish(i, Outcome::Complete);
                    continue;
                }
            }
            i += 1;
        }
    }

    fn expire(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.groups.len() {
            let old = self.groups[i]
                .created
                .is_none_or(|t| now.saturating_duration_since(t) >= self.cfg.max_group_age);
            if old {
                self.finish(i, Outcome::Expired);
            } else {
                i += 1;
            }
        }
    }

    /// Removes group `i`, returning its bytes to the budget and its buffers to the pool.
    fn finish(&mut self, i: usize, outcome: Outcome) {
        let mut g = self.groups.swap_remove(i);
        let missing = match g.k {
            Some(k) => !self.track.all_delivered(g.first, k),
            None => false,
        };
        match outcome {
            Outcome::Complete => self.stats.groups_complete += 1,
            Outcome::Recovered => self.stats.groups_recovered += 1,
            Outcome::Expired => self.stats.groups_expired += 1,
            Outcome::Evicted => self.stats.groups_evicted += 1,
            Outcome::Failed => {}
        }
        if missing && !matches!(outcome, Outcome::Recovered | Outcome::Complete) {
            self.stats.groups_unrecoverable += 1;
        }
        self.budget.release(g.bytes);
        self.stats.retained_bytes -= g.bytes;
        for b in g.data.drain(..).chain(g.parity.drain(..)).flatten() {
            if self.pool.len() < POOL_CAP {
                self.pool.push(b);
            }
        }
        if self.spare_groups.len() < 8 {
            self.spare_groups.push(Group {
                data: g.data,
                parity: g.parity,
                ..Group::default()
            });
        }
    }
}
