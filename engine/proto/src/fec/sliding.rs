//! The sliding-window code (the idea of RFC 8681 / Tetrys): every data datagram is a source
//! with its own seq; a repair is a random linear combination over GF(2^8) of the most recent
//! sources (bounded in count and age), emitted at a ratio of the sources and shortly after the
//! sender goes quiet. The receiver keeps recent sources and pending repair equations,
//! substitutes what it knows, solves single unknowns at once and small systems by Gaussian
//! elimination. Byte layout in [`super::header`].

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::gf;
use super::header::{
    repair_coefficient, DataHeader, RepairHeader, DATA_HEADER_LEN, LEN_PREFIX, MAX_REPAIR_SOURCES,
    PARITY_HEADER_LEN,
};
use super::kernel::Kernel;
use super::policy::ParityController;
use super::sender::MAX_QUEUED_PARITY;
use super::track::{SeqTracker, WINDOW};
use super::{FecConfig, FecError, LossReport, ReceiverStats, RetentionBudget, SenderStats};

#[path = "sliding_chunk.rs"]
mod chunk;
use chunk::Chunk;
#[path = "sliding_tail.rs"]
mod tail;

/// Repair equations one receiver keeps pending at most; the oldest go first.
pub const MAX_PENDING_REPAIRS: usize = 32;
/// A repair whose range starts further than this past the newest data is dropped.
const MAX_AHEAD: u64 = 256;
/// One source in the sender's window.
struct Source {
    seq: u16,
    sent: Instant,
    /// Length prefix + payload.
    coded: Vec<u8>,
}

/// Sending half of the sliding-window code. Sans-IO: every call takes `now`.
pub struct SlidingSender {
    cfg: FecConfig,
    next_seq: u16,
    /// Protected sources, oldest first, at most `cfg.sliding.window`.
    window: VecDeque<Source>,
    spare: Vec<Vec<u8>>,
    /// Sources sent since the last repair.
    uncovered: usize,
    last_source: Option<Instant>,
    /// The tail timer ran (repairs sent, or skipped: see `SlidingConfig::tail_skip_residual`)
    /// for the sources up to this send time; it waits for the next source.
    tail_done_at: Option<Instant>,
    /// What this sender emitted since the oldest source in the window, oldest first: `true`
    /// for a source, `false` for a repair (see [`Self::burst_tail`]).
    sent: VecDeque<bool>,
    next_repair_id: u16,
    ready: VecDeque<Vec<u8>>,
    total_repair: u64,
    controller: ParityController,
    kernel: Kernel,
    stats: SenderStats,
    /// The message chunk being sent, if any.
    chunk: Option<Chunk>,
    /// The last closed chunk's datagrams (sources and repairs) and how long after its first
    /// source its repairs were queued, until the ratio repairs again (see
    /// [`Self::chunk_reorder`]).
    chunk_span: Option<(usize, Duration)>,
}

impl SlidingSender {
    /// A sender with `config` (out-of-range fields are clamped).
    pub fn new(config: FecConfig) -> SlidingSender {
        let cfg = config.sanitized();
        SlidingSender {
            controller: ParityController::sliding(cfg.policy, cfg.adaptive, cfg.sliding.span),
            cfg,
            next_seq: 0,
            window: VecDeque::new(),
            spare: Vec::new(),
            uncovered: 0,
            last_source: None,
            tail_done_at: None,
            sent: VecDeque::new(),
            next_repair_id: 0,
            ready: VecDeque::new(),
            total_repair: 0,
            kernel: Kernel::detect(),
            stats: SenderStats::default(),
            chunk: None,
            chunk_span: None,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &FecConfig {
        &self.cfg
    }

    /// Counters so far (`groups` counts repair emissions, `current_parity` the level and
    /// `max_parity` the highest level in force at a repair,
    /// `peak_window_parity_permille` the peak repair/data byte ratio over the whole history:
    /// the sliding code caps `parity_cap_percent` over the whole history only).
    pub fn stats(&self) -> SenderStats {
        SenderStats {
            policy_changes: self.controller.changes(),
            current_parity: self.controller.level(),
            ..self.stats
        }
    }

    /// Repairs per `sliding.span` sources the policy asks for now.
    pub fn parity_level(&self) -> usize {
        self.controller.level()
    }

    /// The adaptive policy's current loss estimate, once enough reports arrived.
    pub fn loss_estimate(&self) -> Option<f64> {
        self.controller.estimate()
    }

    /// Sources between two ratio-driven repairs (`None`: no repairs planned).
    pub fn repair_interval(&self) -> Option<usize> {
        match self.controller.level() {
            0 => None,
            p => Some(self.cfg.sliding.span.div_ceil(p).max(1)),
        }
    }

    /// Writes the data body for `payload` into `out` and adds it to the window. Returns the
    /// body length.
    pub fn protect(
        &mut self,
        now: Instant,
        payload: &[u8],
        out: &mut [u8],
    ) -> Result<usize, FecError> {
        self.protect_fragment(now, payload, out, None)
    }

    /// [`Self::protect`] for a datagram that carries a fragment of an unreliable message of
    /// several fragments: `remaining` is (how many of them follow it, 0 when the message ends
    /// here; how many it has); `None` for any other datagram.
    ///
    /// One lost fragment loses such a message whole, and ARQ never repairs it, so its
    /// repairs are spent on the message: its fragments (and whatever datagrams go between
    /// them) are cut into chunks of at most `sliding.window` sources, and each chunk's
    /// repairs follow its last source, all covering the whole chunk (no ratio repairs inside
    /// it). The message is useful only once its last fragment arrives, so repairs at the end
    /// cost it no latency, and a repair over every source of a chunk rebuilds any of them
    /// (near-MDS over GF(2^8)), where a ratio repair rebuilds only sources sent before it.
    ///
    /// The adaptive policy sizes a chunk of `k` sources with the binomial tail: the fewest
    /// repairs `r` for which `k + r` datagrams lose more than `r` with a chance of at most
    /// `adaptive.target_residual` · k / (the message's fragments), at the peer's reported loss, at
    /// most `k · max_parity / span`. A 64 KiB message (64 fragments in 1,200 B datagrams) at
    /// 5 % loss is two chunks of 32 with 6 repairs each (38 datagrams lose more than 6 with
    /// odds of 0.25 %: the message arrives whole with odds of 99.5 %, where without FEC
    /// 0.95^64 = 3.8 %); the ratio at that loss (3 per 12 sources) sent 16 plus tails. The
    /// fixed policy sends its ratio, all at the chunk's end.
    /// A chunk also closes when the sender goes quiet for `max_group_age` / 2 in it (the
    /// receiver holds sources that long at least) and, for the adaptive policy, carries no
    /// repairs once the peer reports a clean path.
    pub(crate) fn protect_fragment(
        &mut self,
        now: Instant,
        payload: &[u8],
        out: &mut [u8],
        remaining: Option<(u32, u32)>,
    ) -> Result<usize, FecError> {
        let need = DATA_HEADER_LEN + payload.len();
        if payload.len() <= self.cfg.max_payload && out.len() >= need {
            out[DATA_HEADER_LEN..need].copy_from_slice(payload);
        }
        self.protect_placed(now, out, payload.len(), remaining)
    }

    /// [`Self::protect_fragment`] in place: the payload, `len` bytes, is already at
    /// `out[DATA_HEADER_LEN..]`; its data header is written in front of it.
    #[inline]
    pub(crate) fn protect_placed(
        &mut self,
        now: Instant,
        out: &mut [u8],
        len: usize,
        remaining: Option<(u32, u32)>,
    ) -> Result<usize, FecError> {
        if self.chunk.is_none() && remaining.is_none() && self.controller.level() == 0 {
            self.place_unprotected(out, len)
        } else {
            self.place(now, out, len, remaining)
        }
    }

    /// [`Self::protect_placed`] of a datagram that opens no chunk while none is open and no
    /// repairs are planned (every datagram on a clean path): what [`Self::place`] does for
    /// it. The window is empty once cleared, so trimming it would change nothing.
    fn place_unprotected(&mut self, out: &mut [u8], len: usize) -> Result<usize, FecError> {
        let need = self.room(out, len)?;
        DataHeader {
            seq: self.next_seq,
            index: 0,
            protected: false,
        }
        .write(out);
        self.clear_window();
        self.next_seq = self.next_seq.wrapping_add(1);
        self.stats.data_shards += 1;
        self.stats.data_bytes += need as u64;
        Ok(need)
    }

    /// The body length for a payload of `len` bytes, if it is allowed and `out` holds it.
    fn room(&self, out: &[u8], len: usize) -> Result<usize, FecError> {
        if len > self.cfg.max_payload {
            return Err(FecError::LengthTooLarge);
        }
        let need = DATA_HEADER_LEN + len;
        if out.len() < need {
            return Err(FecError::BufferTooSmall { need });
        }
        Ok(need)
    }

    /// [`Self::protect_placed`] in general.
    fn place(
        &mut self,
        now: Instant,
        out: &mut [u8],
        len: usize,
        remaining: Option<(u32, u32)>,
    ) -> Result<usize, FecError> {
        let need = self.room(out, len)?;
        if self
            .chunk
            .is_some_and(|c| now.saturating_duration_since(c.started) >= self.chunk_max_age())
        {
            // Its repairs must reach the receiver while it still holds the chunk's sources.
            self.close_chunk(now);
        }
        if let (None, Some((rest, count))) = (self.chunk, remaining) {
            self.open_chunk(now, rest, count);
        }
        let chunked = self.chunk.is_some();
        let protected = chunked || self.repair_interval().is_some();
        DataHeader {
            seq: self.next_seq,
            index: 0,
            protected,
        }
        .write(out);
        let payload = &out[DATA_HEADER_LEN..need];
        if protected {
            let mut coded = self.spare.pop().unwrap_or_default();
            coded.clear();
            coded.extend_from_slice(&(payload.len() as u16).to_le_bytes());
            coded.extend_from_slice(payload);
            self.window.push_back(Source {
                seq: self.next_seq,
                sent: now,
                coded,
            });
            self.uncovered += 1;
            self.last_source = Some(now);
            self.sent.push_back(true);
        } else {
            // Unprotected sources break the window: the receiver does not retain them.
            self.clear_window();
        }
        self.next_seq = self.next_seq.wrapping_add(1);
        self.stats.data_shards += 1;
        self.stats.data_bytes += need as u64;
        if let Some(c) = self.chunk {
            if remaining.is_some_and(|(rest, _)| rest == 0) || self.window.len() >= c.planned {
                self.close_chunk(now);
            }
            return Ok(need);
        }
        self.trim(now);
        if let Some(k) = self.repair_interval() {
            if self.uncovered >= k {
                self.emit(1);
                self.chunk_span = None;
            }
        }
        Ok(need)
    }

    /// When the tail timer fires: the sender is quiet, the tail did not run yet for its
    /// latest source, and sources are not covered by a repair or a recent loss burst could
    /// leave some without enough repairs after them (sized by the burst model).
    #[inline]
    pub fn poll_timeout(&self) -> Option<Instant> {
        if let Some(c) = self.chunk {
            // The rest of the message is on its way (or was dropped unsent): the chunk
            // closes when it is as old as the receiver is sure to hold its sources.
            return Some(c.started + self.chunk_max_age());
        }
        let last = self.last_source?;
        if self.tail_done_at == Some(last) {
            return None;
        }
        self.tail_deadline(last)
    }

    /// Length of the repair body `poll_parity` would hand out next, if one is queued.
    pub fn next_parity_len(&self) -> Option<usize> {
        self.ready.front().map(Vec::len)
    }

    /// Runs the tail timer: queues the tail repairs if it fired.
    #[inline]
    pub fn handle_timeout(&mut self, now: Instant) {
        // Most calls find nothing due (on a clean path nothing is ever protected).
        if self.poll_timeout().is_none_or(|t| now < t) {
            return;
        }
        if self.chunk.is_some() {
            self.close_chunk(now);
        } else {
            self.run_tail(now);
        }
    }

    /// The next repair body, if one is queued. With a buffer smaller than it, `None` and the
    /// repair stays queued.
    #[inline]
    pub fn poll_parity(&mut self, now: Instant, out: &mut [u8]) -> Option<usize> {
        self.handle_timeout(now);
        if self.ready.is_empty() {
            return None;
        }
        self.pop_parity(out)
    }

    /// [`Self::poll_parity`] with a repair queued.
    fn pop_parity(&mut self, out: &mut [u8]) -> Option<usize> {
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

    /// Gives back pooled buffers and sources past their age (the connection is idle). Changes
    /// no decision: aged sources would leave at the next `protect` anyway, and the pool only
    /// saves allocations.
    pub fn release_idle(&mut self, now: Instant) {
        if self.chunk.is_none() {
            self.trim(now);
        }
        self.spare = Vec::new();
        self.window.shrink_to_fit();
        self.ready.shrink_to_fit();
    }

    /// Takes a peer's [`LossReport`].
    pub fn on_loss_report_detail(&mut self, report: LossReport) {
        self.stats.reported_received = self.stats.reported_received.saturating_add(report.received);
        self.stats.reported_lost = self.stats.reported_lost.saturating_add(report.lost);
        self.controller
            .on_loss_report(report.received, report.lost, report.max_burst);
        // A chunk being sent keeps its sources: its repairs are sized when it closes.
        if self.controller.level() == 0 && self.chunk.is_none() {
            self.clear_window();
        }
    }

    /// Drops the window's oldest source (and what was sent up to it, from the burst
    /// bookkeeping).
    fn pop_front_source(&mut self) {
        if let Some(s) = self.window.pop_front() {
            self.spare.push(s.coded);
        }
        while let Some(src) = self.sent.pop_front() {
            if src {
                break;
            }
        }
    }

    #[inline]
    fn clear_window(&mut self) {
        self.uncovered = 0;
        // On a clean path (every source unprotected) there is nothing to drain.
        if !(self.window.is_empty() && self.sent.is_empty()) {
            self.drain_window();
        }
    }

    /// [`Self::clear_window`] of a window that holds something.
    fn drain_window(&mut self) {
        self.sent.clear();
        for s in self.window.drain(..) {
            self.spare.push(s.coded);
        }
    }

    /// Drops sources beyond the count or age bound.
    fn trim(&mut self, now: Instant) {
        while let Some(s) = self.window.front() {
            let old = now.saturating_duration_since(s.sent) > self.cfg.sliding.max_age;
            if self.window.len() > self.cfg.sliding.window || old {
                // What was sent up to that source leaves the burst bookkeeping with it.
                self.pop_front_source();
            } else {
                break;
            }
        }
        self.uncovered = self.uncovered.min(self.window.len());
    }

    /// Queues `n` repairs over the current window, within the parity-byte cap. Returns how
    /// many it queued.
    fn emit(&mut self, n: usize) -> usize {
        self.uncovered = 0;
        let Some(first) = self.window.front().map(|s| s.seq) else {
            return 0;
        };
        let count = self.window.len();
        let sym_len = self
            .window
            .iter()
            .map(|s| s.coded.len())
            .max()
            .unwrap_or(0)
            .max(LEN_PREFIX);
        let body_len = (PARITY_HEADER_LEN + sym_len) as u64;
        self.stats.groups += 1;
        for queued in 0..n {
            let cap = self.stats.data_bytes * u64::from(self.cfg.parity_cap_percent) / 100;
            if self.total_repair + body_len > cap {
                self.stats.groups_capped += 1;
                return queued;
            }
            let id = self.next_repair_id;
            self.next_repair_id = id.wrapping_add(1);
            let mut b = self.spare.pop().unwrap_or_default();
            b.clear();
            b.resize(PARITY_HEADER_LEN + sym_len, 0);
            RepairHeader {
                first_seq: first,
                count: count as u8,
                repair_id: id,
            }
            .write(&mut b);
            let sym = &mut b[PARITY_HEADER_LEN..];
            for (i, s) in self.window.iter().enumerate() {
                self.kernel
                    .mul_acc(repair_coefficient(id, i as u8), &s.coded, sym);
            }
            self.total_repair += body_len;
            // The sliding code caps repair bytes over the whole history only.
            let permille = self.total_repair * 1000 / self.stats.data_bytes.max(1);
            self.stats.peak_window_parity_permille =
                self.stats.peak_window_parity_permille.max(permille);
            self.stats.max_parity = self.stats.max_parity.max(self.controller.level());
            self.ready.push_back(b);
            self.sent.push_back(false);
            while self.ready.len() > MAX_QUEUED_PARITY {
                if let Some(b) = self.ready.pop_front() {
                    self.stats.parity_dropped += 1;
                    self.spare.push(b);
                }
            }
        }
        n
    }
}

/// A source the receiver holds.
struct Held {
    at: Instant,
    coded: Vec<u8>,
}

/// A pending repair equation: `Σ c · S_seq` over its unknown sources equals `sym`.
struct Equation {
    at: Instant,
    vars: Vec<(u64, u8)>,
    sym: Vec<u8>,
}

/// Receiving half of the sliding-window code. Sans-IO.
pub struct SlidingReceiver {
    cfg: FecConfig,
    budget: RetentionBudget,
    track: SeqTracker,
    held: BTreeMap<u64, Held>,
    eqs: Vec<Equation>,
    pool: Vec<Vec<u8>>,
    /// Bytes one equation reserves (the longest symbol), so elimination never grows past it.
    eq_reserve: usize,
    kernel: Kernel,
    stats: ReceiverStats,
}

impl SlidingReceiver {
    /// A receiver with its own budget.
    pub fn new(config: FecConfig) -> SlidingReceiver {
        Self::with_budget(config, RetentionBudget::default())
    }

    /// A receiver that retains within `budget` (see [`RetentionBudget`] for sharing one).
    pub fn with_budget(config: FecConfig, budget: RetentionBudget) -> SlidingReceiver {
        let cfg = config.sanitized();
        SlidingReceiver {
            eq_reserve: LEN_PREFIX + cfg.max_payload + 1,
            cfg,
            budget,
            track: SeqTracker::default(),
            held: BTreeMap::new(),
            eqs: Vec::new(),
            pool: Vec::new(),
            kernel: Kernel::detect(),
            stats: ReceiverStats::default(),
        }
    }

    /// Counters (`groups_recovered`: solves that rebuilt sources; `groups_unrecoverable`:
    /// repair equations dropped with sources still missing).
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

    /// Repair equations pending now.
    pub fn pending_repairs(&self) -> usize {
        self.eqs.len()
    }

    /// Sources held now.
    pub fn held_sources(&self) -> usize {
        self.held.len()
    }

    /// Data shards (received, lost, longest burst) since the last call.
    pub fn loss_report_detail(&mut self) -> LossReport {
        self.track.take_report()
    }

    /// When the oldest held source or pending equation reaches its age limit.
    #[inline]
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.is_empty() {
            // The common case on a clean path (the peer protects nothing): no walk.
            return None;
        }
        let src = self.held.values().map(|h| h.at).min();
        let eq = self.eqs.iter().map(|e| e.at).min();
        let t = match (src, eq) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        t.map(|t| t + self.cfg.max_group_age)
    }

    /// Drops state that reached its age limit.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.expire(now);
    }

    /// Holds no source and no equation: nothing can age, be trimmed or be solved (what a
    /// receiver is while its peer sends no parity and so protects no source).
    #[inline]
    fn is_empty(&self) -> bool {
        self.held.is_empty() && self.eqs.is_empty()
    }

    /// Handles a data body: delivers its payload at once (unless a duplicate), holds it if
    /// protected, and delivers any sources it lets the receiver solve. A malformed body is
    /// dropped, counted and returned as an error.
    pub fn on_data(
        &mut self,
        now: Instant,
        body: &[u8],
        mut deliver: impl FnMut(&[u8]),
    ) -> Result<(), FecError> {
        let r = self.data_inner(now, body, &mut deliver);
        self.stats.malformed.tally(r)
    }

    /// Handles a repair body: substitutes held sources, keeps it as an equation and delivers
    /// any sources it lets the receiver solve. A malformed body is dropped, counted and
    /// returned as an error.
    pub fn on_parity(
        &mut self,
        now: Instant,
        body: &[u8],
        mut deliver: impl FnMut(&[u8]),
    ) -> Result<(), FecError> {
        let r = self.repair_inner(now, body, &mut deliver);
        self.stats.malformed.tally(r)
    }

    fn data_inner(
        &mut self,
        now: Instant,
        body: &[u8],
        deliver: &mut dyn FnMut(&[u8]),
    ) -> Result<(), FecError> {
        if !self.is_empty() {
            self.expire(now);
        }
        let (h, payload) = DataHeader::parse(body)?;
        if payload.len() > self.cfg.max_payload {
            return Err(FecError::LengthTooLarge);
        }
        let seq = self.track.extend(h.seq);
        if !self
            .track
            .deliver_arrival(seq, payload, &mut self.stats, deliver)
        {
            return Ok(());
        }
        if h.protected {
            let mut coded = self.take_buf();
            coded.extend_from_slice(&(payload.len() as u16).to_le_bytes());
            coded.extend_from_slice(payload);
            self.hold(now, seq, coded);
        }
        if !self.held.is_empty() {
            self.trim_window();
        }
        if !self.eqs.is_empty() {
            self.solve(now, deliver);
        }
        Ok(())
    }

    fn repair_inner(
        &mut self,
        now: Instant,
        body: &[u8],
        deliver: &mut dyn FnMut(&[u8]),
    ) -> Result<(), FecError> {
        self.expire(now);
        let (h, symbol) = RepairHeader::parse(body)?;
        if symbol.len() > self.eq_reserve {
            return Err(FecError::LengthTooLarge);
        }
        let first = self.track.extend(h.first_seq);
        let count = u64::from(h.count);
        if let Some(hi) = self.track.hi {
            if first > hi + MAX_AHEAD {
                return Err(FecError::UnknownGroup);
            }
            if first + count + WINDOW <= hi + 1 {
                self.stats.parity_ignored += 1;
                return Ok(());
            }
        }
        // Validate against held sources before keeping anything.
        let mut useful = false;
        for i in 0..count {
            match self.held.get(&(first + i)) {
                Some(s) if s.coded.len() > symbol.len() => {
                    return Err(FecError::InconsistentGroup);
                }
                Some(_) => {}
                None => useful |= !self.track.is_delivered(first + i),
            }
        }
        if !useful {
            self.stats.parity_ignored += 1;
            return Ok(());
        }
        self.stats.parity_received += 1;
        // Reserving may evict held sources, so the equation is built after it.
        if !self.reserve(self.eq_reserve, now) {
            return Ok(());
        }
        let mut sym = self.take_buf();
        sym.extend_from_slice(symbol);
        let mut vars = Vec::new();
        for i in 0..h.count {
            let seq = first + u64::from(i);
            let c = repair_coefficient(h.repair_id, i);
            match self.held.get(&seq) {
                Some(s) => self.kernel.mul_acc(c, &s.coded, &mut sym),
                None => vars.push((seq, c)),
            }
        }
        if self.eqs.len() >= MAX_PENDING_REPAIRS {
            self.drop_eq(0);
        }
        self.eqs.push(Equation { at: now, vars, sym });
        self.solve(now, deliver);
        Ok(())
    }

    /// Holds a source (if the budget allows) and substitutes it into pending equations.
    fn hold(&mut self, now: Instant, seq: u64, coded: Vec<u8>) {
        for e in &mut self.eqs {
            if let Some(p) = e.vars.iter().position(|v| v.0 == seq) {
                let (_, c) = e.vars.swap_remove(p);
                if e.sym.len() < coded.len() {
                    // A source longer than the repair's symbol cannot be in it: the equation
                    // is inconsistent and is dropped below (its vars emptied).
                    e.vars.clear();
                    continue;
                }
                self.kernel.mul_acc(c, &coded, &mut e.sym);
            }
        }
        if self.held.contains_key(&seq) || !self.reserve(coded.len(), now) {
            self.recycle(coded);
            return;
        }
        self.held.insert(seq, Held { at: now, coded });
    }

    /// Solves what the pending equations allow, delivering rebuilt sources.
    fn solve(&mut self, now: Instant, deliver: &mut dyn FnMut(&[u8])) {
        let mut eliminated = false;
        loop {
            self.drop_useless();
            if let Some(i) = self.eqs.iter().position(|e| e.vars.len() == 1) {
                self.recover(now, i, deliver);
                eliminated = false;
                continue;
            }
            if eliminated || self.eqs.len() < 2 {
                return;
            }
            self.eliminate();
            eliminated = true;
        }
    }

    /// Gauss-Jordan elimination over the unknowns of all pending equations, in place: the
    /// rows stay valid equations, and rows left with one unknown are solved by the caller.
    fn eliminate(&mut self) {
        let mut cols: Vec<u64> = self
            .eqs
            .iter()
            .flat_map(|e| e.vars.iter().map(|v| v.0))
            .collect();
        cols.sort_unstable();
        cols.dedup();
        let n = cols.len();
        let rows = self.eqs.len();
        let mut m = vec![0u8; rows * n];
        for (r, e) in self.eqs.iter().enumerate() {
            for &(seq, c) in &e.vars {
                if let Ok(j) = cols.binary_search(&seq) {
                    m[r * n + j] ^= c;
                }
            }
        }
        let longest = self.eqs.iter().map(|e| e.sym.len()).max().unwrap_or(0);
        for e in &mut self.eqs {
            e.sym.resize(longest, 0);
        }
        let mut scratch = self.take_buf();
        let mut rank = 0;
        for col in 0..n {
            let Some(p) = (rank..rows).find(|&r| m[r * n + col] != 0) else {
                continue;
            };
            if p != rank {
                for j in 0..n {
                    m.swap(p * n + j, rank * n + j);
                }
                self.eqs.swap(p, rank);
            }
            let s = gf::inv(m[rank * n + col]);
            for j in 0..n {
                m[rank * n + j] = gf::mul(m[rank * n + j], s);
            }
            scratch.clear();
            scratch.resize(longest, 0);
            self.kernel.mul(s, &self.eqs[rank].sym, &mut scratch);
            std::mem::swap(&mut scratch, &mut self.eqs[rank].sym);
            let pivot = std::mem::take(&mut self.eqs[rank].sym);
            for r in (0..rows).filter(|&r| r != rank) {
                let f = m[r * n + col];
                if f == 0 {
                    continue;
                }
                for j in 0..n {
                    m[r * n + j] ^= gf::mul(f, m[rank * n + j]);
                }
                self.kernel.mul_acc(f, &pivot, &mut self.eqs[r].sym);
            }
            self.eqs[rank].sym = pivot;
            rank += 1;
        }
        self.recycle(scratch);
        for (r, e) in self.eqs.iter_mut().enumerate() {
            e.vars.clear();
            e.vars.extend(
                (0..n)
                    .filter(|&j| m[r * n + j] != 0)
                    .map(|j| (cols[j], m[r * n + j])),
            );
        }
    }

    /// Solves equation `i` (one unknown), delivers the source and substitutes it.
    fn recover(&mut self, now: Instant, i: usize, deliver: &mut dyn FnMut(&[u8])) {
        let e = self.eqs.swap_remove(i);
        self.release(self.eq_reserve);
        let (seq, c) = e.vars[0];
        let mut coded = self.take_buf();
        coded.resize(e.sym.len(), 0);
        self.kernel.mul(gf::inv(c), &e.sym, &mut coded);
        self.recycle(e.sym);
        let n = u16::from_le_bytes([coded[0], coded[1]]) as usize;
        let end = LEN_PREFIX + n;
        if end > coded.len() || n > self.cfg.max_payload || coded[end..].iter().any(|&b| b != 0) {
            // Equations that do not match any real source (corrupt or inconsistent repairs):
            // never deliver a wrong byte, leave the source to ARQ.
            self.stats.recovery_failures += 1;
            self.recycle(coded);
            return;
        }
        coded.truncate(end);
        self.stats.groups_recovered += 1;
        if !self.track.is_delivered(seq) {
            self.track.mark_delivered(seq);
            self.stats.data_recovered += 1;
            deliver(&coded[LEN_PREFIX..]);
        }
        self.hold(now, seq, coded);
    }

    /// Drops equations without unknowns, or whose unknowns were all delivered already.
    fn drop_useless(&mut self) {
        let mut i = 0;
        while i < self.eqs.len() {
            let e = &self.eqs[i];
            if e.vars.is_empty() || e.vars.iter().all(|v| self.track.is_delivered(v.0)) {
                let e = self.eqs.swap_remove(i);
                self.release(self.eq_reserve);
                self.recycle(e.sym);
            } else {
                i += 1;
            }
        }
    }

    /// Drops equation `i`, counting it unrecoverable.
    fn drop_eq(&mut self, i: usize) {
        let e = self.eqs.remove(i);
        self.release(self.eq_reserve);
        self.stats.groups_unrecoverable += 1;
        self.recycle(e.sym);
    }

    /// Forgets sources too far behind the newest to appear in a repair any more.
    fn trim_window(&mut self) {
        let Some(hi) = self.track.hi else {
            return;
        };
        let keep = (MAX_REPAIR_SOURCES.min(self.cfg.sliding.window) as u64) + 16;
        while let Some((&seq, _)) = self.held.first_key_value() {
            if seq + keep > hi {
                break;
            }
            if let Some(h) = self.held.remove(&seq) {
                self.release(h.coded.len());
                self.recycle(h.coded);
            }
        }
    }

    fn expire(&mut self, now: Instant) {
        let age = self.cfg.max_group_age;
        let old = |t: Instant| now.saturating_duration_since(t) >= age;
        let stale: Vec<u64> = self
            .held
            .iter()
            .filter(|(_, h)| old(h.at))
            .map(|(&s, _)| s)
            .collect();
        for seq in stale {
            if let Some(h) = self.held.remove(&seq) {
                self.release(h.coded.len());
                self.recycle(h.coded);
            }
        }
        let mut i = 0;
        while i < self.eqs.len() {
            if old(self.eqs[i].at) {
                self.stats.groups_expired += 1;
                self.drop_eq(i);
            } else {
                i += 1;
            }
        }
    }

    /// Reserves `n` bytes, evicting this receiver's oldest sources, then oldest equations.
    fn reserve(&mut self, n: usize, _now: Instant) -> bool {
        loop {
            if self.budget_try(n) {
                return true;
            }
            if let Some((&seq, _)) = self.held.first_key_value() {
                if let Some(h) = self.held.remove(&seq) {
                    self.release(h.coded.len());
                    self.recycle(h.coded);
                    self.stats.groups_evicted += 1;
                }
            } else if !self.eqs.is_empty() {
                self.stats.groups_evicted += 1;
                self.drop_eq(0);
            } else {
                self.stats.retention_refused += 1;
                return false;
            }
        }
    }

    fn budget_try(&mut self, n: usize) -> bool {
        if self.budget.try_reserve(n) {
            self.stats.retained_bytes += n;
            self.stats.peak_retained_bytes = self
                .stats
                .peak_retained_bytes
                .max(self.stats.retained_bytes);
            true
        } else {
            false
        }
    }

    fn release(&mut self, n: usize) {
        self.budget.release(n);
        self.stats.retained_bytes -= n;
    }

    fn take_buf(&mut self) -> Vec<u8> {
        let mut b = self.pool.pop().unwrap_or_default();
        b.clear();
        b
    }

    /// Gives back pooled buffers (the connection is idle); held sources and pending equations
    /// stay until they age out as usual.
    pub fn release_idle(&mut self) {
        self.pool = Vec::new();
        self.eqs.shrink_to_fit();
    }

    fn recycle(&mut self, b: Vec<u8>) {
        if self.pool.len() < 32 {
            self.pool.push(b);
        }
    }
}

#[cfg(test)]
#[path = "sliding_tests.rs"]
mod tests;
