//! The sending half: groups outgoing datagrams and produces parity when a group closes.

use std::collections::VecDeque;
use std::time::Instant;

use super::codec::{CauchyCodec, Codec, CodecId, RsSimdCodec, MAX_DATA_SHARDS, MAX_PARITY_SHARDS};
use super::header::{DataHeader, ParityHeader, DATA_HEADER_LEN, LEN_PREFIX, PARITY_HEADER_LEN};
use super::policy::ParityController;
use super::{FecConfig, FecError, LossReport, SenderStats};

/// Parity bodies waiting for `poll_parity` at most; older ones are dropped first.
pub const MAX_QUEUED_PARITY: usize = 64;

/// The group being filled.
struct OpenGroup {
    first_seq: u16,
    count: usize,
    planned_parity: usize,
    deadline: Instant,
    /// Longest coded shard so far (payload + length prefix).
    coded_len: usize,
    /// Data body bytes of this group.
    data_bytes: u64,
}

/// Groups outgoing datagrams and yields parity. Sans-IO: every call takes `now`.
pub struct FecSender {
    cfg: FecConfig,
    next_seq: u16,
    group: Option<OpenGroup>,
    /// Coded copies of the open group's shards (only when parity is planned); reused.
    shards: Vec<Vec<u8>>,
    /// Parity bodies ready to send, oldest first.
    ready: VecDeque<Vec<u8>>,
    /// Spare buffers for parity bodies.
    spare: Vec<Vec<u8>>,
    /// (data bytes, parity bytes) of the last `cap_window_groups - 1` closed groups.
    window: VecDeque<(u64, u64)>,
    window_data: u64,
    window_parity: u64,
    /// Parity bytes of every closed group.
    total_parity: u64,
    controller: ParityController,
    cauchy: CauchyCodec,
    rs: Option<RsSimdCodec>,
    stats: SenderStats,
}

impl FecSender {
    /// A sender with `config` (out-of-range fields are clamped).
    pub fn new(config: FecConfig) -> FecSender {
        let cfg = config.sanitized();
        FecSender {
            controller: ParityController::new(cfg.policy, cfg.adaptive, cfg.max_data_shards),
            cfg,
            next_seq: 0,
            group: None,
            shards: Vec::new(),
            ready: VecDeque::new(),
            spare: Vec::new(),
            window: VecDeque::new(),
            window_data: 0,
            window_parity: 0,
            total_parity: 0,
            cauchy: CauchyCodec::new(),
            rs: None,
            stats: SenderStats::default(),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &FecConfig {
        &self.cfg
    }

    /// Gives back pooled buffers (the connection is idle); an open group keeps its shards.
    pub fn release_idle(&mut self) {
        self.spare = Vec::new();
        if self.group.is_none() {
            self.shards = Vec::new();
        }
        self.ready.shrink_to_fit();
    }

    /// Counters so far.
    pub fn stats(&self) -> SenderStats {
        SenderStats {
            policy_changes: self.controller.changes(),
            ..self.stats
        }
    }

    /// Parity shards the next group plans (before the byte cap).
    pub fn parity_level(&self) -> usize {
        self.controller.level()
    }

    /// The adaptive policy's current loss estimate, once enough reports arrived.
    pub fn loss_estimate(&self) -> Option<f64> {
        self.controller.estimate()
    }

    /// Writes the data body for `payload` (FEC header + payload) into `out` and adds the
    /// payload to the current group. Returns the body length.
    pub fn protect(
        &mut self,
        now: Instant,
        payload: &[u8],
        out: &mut [u8],
    ) -> Result<usize, FecError> {
        let need = DATA_HEADER_LEN + payload.len();
        if payload.len() <= self.cfg.max_payload && out.len() >= need {
            out[DATA_HEADER_LEN..need].copy_from_slice(payload);
        }
        self.protect_placed(now, out, payload.len())
    }

    /// [`Self::protect`] in place: the payload, `len` bytes, is already at
    /// `out[DATA_HEADER_LEN..]`; its data header is written in front of it.
    pub(crate) fn protect_placed(
        &mut self,
        now: Instant,
        out: &mut [u8],
        len: usize,
    ) -> Result<usize, FecError> {
        if len > self.cfg.max_payload {
            return Err(FecError::LengthTooLarge);
        }
        let need = DATA_HEADER_LEN + len;
        if out.len() < need {
            return Err(FecError::BufferTooSmall { need });
        }
        self.close_if_expired(now);
        let group = self.group.get_or_insert_with(|| OpenGroup {
            first_seq: self.next_seq,
            count: 0,
            planned_parity: self.controller.level(),
            deadline: now + self.cfg.group_wait,
            coded_len: 0,
            data_bytes: 0,
        });
        let index = group.count;
        DataHeader {
            seq: self.next_seq,
            index: index as u8,
            protected: group.planned_parity > 0,
        }
        .write(out);
        let payload = &out[DATA_HEADER_LEN..need];
        if group.planned_parity > 0 {
            if self.shards.len() <= index {
                self.shards.resize_with(index + 1, Vec::new);
            }
            let shard = &mut self.shards[index];
            shard.clear();
            shard.extend_from_slice(&(payload.len() as u16).to_le_bytes());
            shard.extend_from_slice(payload);
            group.coded_len = group.coded_len.max(shard.len());
        }
        group.count += 1;
        group.data_bytes += need as u64;
        self.next_seq = self.next_seq.wrapping_add(1);
        self.stats.data_shards += 1;
        self.stats.data_bytes += need as u64;
        if group.count >= self.cfg.max_data_shards {
            self.close_group();
        }
        Ok(need)
    }

    /// Length of the parity body `poll_parity` would hand out next, if one is queued (a group
    /// whose wait ran out is closed by the next `poll_parity`, not by this).
    pub fn next_parity_len(&self) -> Option<usize> {
        self.ready.front().map(Vec::len)
    }

    /// The next parity body, if a closed group has one pending. `out` must hold
    /// [`FecConfig::max_parity_body`] bytes; with a smaller buffer the shard stays queued and
    /// `None` is returned.
    pub fn poll_parity(&mut self, now: Instant, out: &mut [u8]) -> Option<usize> {
        self.close_if_expired(now);
        let len = self.ready.front()?.len();
        if out.len() < len {
            return None;
        }
        let body = self.ready.pop_front()?;
        out[..len].copy_from_slice(&body);
        self.stats.parity_shards_sent += 1;
        self.stats.parity_bytes_sent += len as u64;
        self.spare.push(body);
        Some(len)
    }

    /// When the open group's wait runs out, if it plans parity (groups without parity need
    /// no timer: the next `protect` starts a new group anyway).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.group
            .as_ref()
            .filter(|g| g.planned_parity > 0)
            .map(|g| g.deadline)
    }

    /// Takes the (received, lost) counts the peer's receiver reported for a window.
    pub fn on_loss_report(&mut self, received: u64, lost: u64) {
        self.on_loss_report_detail(LossReport {
            received,
            lost,
            max_burst: 0,
        });
    }

    /// Takes a peer's [`LossReport`], including its longest loss burst.
    pub fn on_loss_report_detail(&mut self, report: LossReport) {
        self.stats.reported_received = self.stats.reported_received.saturating_add(report.received);
        self.stats.reported_lost = self.stats.reported_lost.saturating_add(report.lost);
        self.controller
            .on_loss_report(report.received, report.lost, report.max_burst);
    }

    fn close_if_expired(&mut self, now: Instant) {
        if self.expiry_due(now) {
            self.close_group();
        }
    }

    /// Whether the open group's wait has run out at `now` (`poll_parity` then closes it),
    /// whether or not it plans parity.
    pub(crate) fn expiry_due(&self, now: Instant) -> bool {
        self.group.as_ref().is_some_and(|g| now >= g.deadline)
    }

    /// Closes the open group: decides how much parity the cap allows and encodes it.
    fn close_group(&mut self) {
        let Some(g) = self.group.take() else {
            return;
        };
        let k = g.count;
        let codec = CodecId::for_group(k, g.planned_parity);
        let mult = codec.shard_len_multiple();
        let coded_len = g.coded_len.max(LEN_PREFIX).div_ceil(mult) * mult;
        let body_len = (PARITY_HEADER_LEN + coded_len) as u64;
        // Largest m keeping parity within cap% of data both over the window of the last
        // `cap_window_groups` groups (this one included) and over the whole history.
        let cap = u64::from(self.cfg.parity_cap_percent);
        let data = self.window_data + g.data_bytes;
        let window_room = (data * cap / 100).saturating_sub(self.window_parity);
        let total_room = (self.stats.data_bytes * cap / 100).saturating_sub(self.total_parity);
        let room = window_room.min(total_room) / body_len;
        let m = g.planned_parity.min(room as usize);
        if m < g.planned_parity {
            self.stats.groups_capped += 1;
        }
        // Encoding our own valid shapes cannot fail; if it somehow did, sending no parity is
        // safe (ARQ still retransmits everything).
        let m = if m > 0 && self.encode(&g, k, m, coded_len, codec) {
            m
        } else {
            0
        };
        let parity = m as u64 * body_len;
        self.stats.groups += 1;
        self.stats.current_parity = m;
        self.stats.max_parity = self.stats.max_parity.max(m);
        self.total_parity += parity;
        if m > 0 {
            let permille = (self.window_parity + parity) * 1000 / data;
            self.stats.peak_window_parity_permille =
                self.stats.peak_window_parity_permille.max(permille);
        }
        self.window.push_back((g.data_bytes, parity));
        self.window_data += g.data_bytes;
        self.window_parity += parity;
        while self.window.len() >= self.cfg.cap_window_groups {
            if let Some((d, p)) = self.window.pop_front() {
                self.window_data -= d;
                self.window_parity -= p;
            }
        }
    }

    /// Encodes `m` parity bodies for the closed group `g` and queues them; false on failure.
    fn encode(
        &mut self,
        g: &OpenGroup,
        k: usize,
        m: usize,
        coded_len: usize,
        codec: CodecId,
    ) -> bool {
        for s in &mut self.shards[..k] {
            s.resize(coded_len, 0);
        }
        // Parity bodies go straight onto the ready queue (buffers from `spare`) and are
        // encoded in place; fixed arrays of slices keep the close free of allocation.
        let queued = self.ready.len();
        for i in 0..m {
            let mut b = self.spare.pop().unwrap_or_default();
            b.clear();
            b.resize(PARITY_HEADER_LEN + coded_len, 0);
            ParityHeader {
                first_seq: g.first_seq,
                data: k as u8,
                parity: m as u8,
                index: i as u8,
                codec,
            }
            .write(&mut b);
            self.ready.push_back(b);
        }
        let mut data: [&[u8]; MAX_DATA_SHARDS] = [&[]; MAX_DATA_SHARDS];
        for (d, s) in data.iter_mut().zip(&self.shards[..k]) {
            *d = s;
        }
        let mut outs: [&mut [u8]; MAX_PARITY_SHARDS] =
            std::array::from_fn(|_| <&mut [u8]>::default());
        for (o, b) in outs.iter_mut().zip(self.ready.range_mut(queued..)) {
            *o = &mut b[PARITY_HEADER_LEN..];
        }
        let (data, outs) = (&data[..k], &mut outs[..m]);
        let result = match codec {
            CodecId::Cauchy => self.cauchy.encode(data, outs),
            CodecId::RsSimd => self
                .rs
                .get_or_insert_with(RsSimdCodec::new)
                .encode(data, outs),
        };
        if result.is_ok() {
            // A caller that stops polling (e.g. congestion-blocked) must not grow the queue
            // without bound: drop the stalest parity.
            while self.ready.len() > MAX_QUEUED_PARITY {
                if let Some(b) = self.ready.pop_front() {
                    self.stats.parity_dropped += 1;
                    self.spare.push(b);
                }
            }
        } else {
            while self.ready.len() > queued {
                if let Some(b) = self.ready.pop_back() {
                    self.spare.push(b);
                }
            }
        }
        result.is_ok()
    }
}
