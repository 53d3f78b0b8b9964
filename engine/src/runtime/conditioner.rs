//! A link conditioner: impairs a live endpoint's traffic (loss, bursts of loss, delay, jitter,
//! reordering, duplication, a rate limit) so that a game can be played and tested under a bad
//! link without a relay.
//!
//! The settings ([`LinkConditioner`]) are plain data; each worker (and each client) turns them
//! into a [`Conditioner`] that holds the datagrams it delays in one time-ordered queue per
//! direction. Off (the default) there is no conditioner at all: the hot path pays one branch on
//! an `Option` and allocates nothing.

#[cfg(feature = "conditioner")]
use std::cmp::Reverse;
#[cfg(feature = "conditioner")]
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ricochet_platform::{RecvDatagram, SendBatch};

use super::error::RuntimeError;

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

/// What a conditioner did to one direction's datagrams.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg(feature = "conditioner")]
pub(crate) struct ConditionerStats {
    /// Datagrams that came in.
    pub(crate) offered: u64,
    /// Lost at random or in a burst.
    pub(crate) lost: u64,
    /// Dropped because the queue was full.
    pub(crate) queue_drops: u64,
    /// Extra copies made.
    pub(crate) duplicated: u64,
    /// Released (delivered or handed to the send batch).
    pub(crate) released: u64,
}

/// SplitMix64: small, seedable, and good enough for impairment draws (not for secrets).
#[derive(Debug, Clone)]
#[cfg(feature = "conditioner")]
struct Rng(u64);

#[cfg(feature = "conditioner")]
impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }
    fn upto(&mut self, d: Duration) -> Duration {
        if d.is_zero() {
            Duration::ZERO
        } else {
            d.mul_f64(self.unit())
        }
    }
}

/// One datagram held until `due`.
#[derive(Debug)]
#[cfg(feature = "conditioner")]
pub(crate) struct Held {
    pub due: Instant,
    seq: u64,
    pub addr: SocketAddr,
    pub data: Vec<u8>,
}

#[cfg(feature = "conditioner")]
impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}
#[cfg(feature = "conditioner")]
impl Eq for Held {}
#[cfg(feature = "conditioner")]
impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
#[cfg(feature = "conditioner")]
impl Ord for Held {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.due, self.seq).cmp(&(other.due, other.seq))
    }
}

/// The random state of one impairment: its settings, draws, burst state and rate bucket.
#[derive(Debug)]
#[cfg(feature = "conditioner")]
struct Lane {
    imp: Impairment,
    rng: Rng,
    in_burst: bool,
    /// The rate limit's theoretical arrival time (GCRA form of the token bucket).
    tat: Option<Instant>,
}

#[cfg(feature = "conditioner")]
impl Lane {
    fn new(imp: Impairment, seed: u64) -> Self {
        Lane {
            imp,
            rng: Rng(seed),
            in_burst: false,
            tat: None,
        }
    }
}

/// One direction's state: the endpoint-wide impairment, the per-session ones (by the peer's
/// address), and the one queue of held datagrams they share.
#[derive(Debug)]
#[cfg(feature = "conditioner")]
pub(crate) struct Direction {
    lane: Lane,
    /// Sessions conditioned on their own ([`ConditionerControl::set_peer`]): a datagram to or
    /// from one of these addresses meets that impairment instead of `lane`'s.
    peers: Vec<(SocketAddr, Lane)>,
    queue: BinaryHeap<Reverse<Held>>,
    limit: usize,
    seq: u64,
    /// Buffers of released datagrams, reused for the next held ones.
    spare: Vec<Vec<u8>>,
    pub stats: ConditionerStats,
}

#[cfg(feature = "conditioner")]
impl Direction {
    fn new(imp: Impairment, seed: u64, limit: usize) -> Self {
        Direction {
            lane: Lane::new(imp, seed),
            peers: Vec::new(),
            queue: BinaryHeap::new(),
            limit,
            seq: 0,
            spare: Vec::new(),
            stats: ConditionerStats::default(),
        }
    }

    /// Take one datagram at `now` (from or to `addr`): drop it, or hold it (and maybe a copy)
    /// until it is due.
    pub fn offer(&mut self, now: Instant, addr: SocketAddr, data: &[u8]) {
        self.stats.offered += 1;
        // A handful of conditioned sessions at most: a scan beats a hash.
        let lane = match self.peers.iter_mut().find(|(a, _)| *a == addr) {
            Some((_, lane)) => lane,
            None => &mut self.lane,
        };
        let imp = lane.imp;
        let mut p_loss = imp.loss;
        if let Some(b) = imp.bursts {
            let flip = if lane.in_burst { b.exit } else { b.enter };
            if lane.rng.chance(flip) {
                lane.in_burst = !lane.in_burst;
            }
            if lane.in_burst {
                // Both causes act independently: lost if either loses it.
                p_loss = 1.0 - (1.0 - p_loss) * (1.0 - b.loss_in_burst);
            }
        }
        if lane.rng.chance(p_loss) {
            self.stats.lost += 1;
            return;
        }
        let copies = if lane.rng.chance(imp.duplicate) { 2 } else { 1 };
        for copy in 0..copies {
            if self.queue.len() >= self.limit {
                self.stats.queue_drops += 1;
                return;
            }
            let mut leave = now;
            if let Some(r) = imp.rate {
                let per_byte_ns = 1e9 / r.bytes_per_second as f64;
                let cost = Duration::from_nanos((data.len() as f64 * per_byte_ns) as u64);
                let tau = Duration::from_nanos((r.burst_bytes as f64 * per_byte_ns) as u64);
                let tat = lane.tat.unwrap_or(now).max(now);
                leave = now.max(tat.checked_sub(tau).unwrap_or(now));
                lane.tat = Some(tat + cost);
            }
            let mut due = leave + imp.delay + lane.rng.upto(imp.jitter);
            if lane.rng.chance(imp.reorder) {
                due += imp.reorder_delay;
            }
            if copy == 1 {
                self.stats.duplicated += 1;
            }
            let mut buf = self.spare.pop().unwrap_or_default();
            buf.clear();
            buf.extend_from_slice(data);
            self.seq += 1;
            self.queue.push(Reverse(Held {
                due,
                seq: self.seq,
                addr,
                data: buf,
            }));
        }
    }

    /// The next datagram due at or before `now`, oldest due first.
    pub fn pop_due(&mut self, now: Instant) -> Option<Held> {
        if self.queue.peek()?.0.due > now {
            return None;
        }
        self.stats.released += 1;
        self.queue.pop().map(|r| r.0)
    }

    /// Give a released datagram's buffer back for reuse.
    pub fn recycle(&mut self, held: Held) {
        if self.spare.len() < 256 {
            self.spare.push(held.data);
        }
    }

    /// When the next held datagram is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.queue.peek().map(|r| r.0.due)
    }

    /// Datagrams held.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.queue.len()
    }
}

/// A live conditioner: both directions' state, for one worker or one client.
#[derive(Debug)]
#[cfg(feature = "conditioner")]
pub(crate) struct Conditioner {
    pub inbound: Direction,
    pub outbound: Direction,
    /// The endpoint-wide settings it follows (`None`: only sessions of their own).
    all: Option<LinkConditioner>,
    /// The sessions conditioned on their own, in the order of the directions' `peers`.
    peers: Vec<(SocketAddr, LinkConditioner)>,
    /// Mixed into every seed (a worker's index).
    salt: u64,
}

#[cfg(feature = "conditioner")]
impl Conditioner {
    /// The conditioner for `settings` (one endpoint's, or a worker's plan with its conditioned
    /// sessions), with `salt` mixed into the seed (a worker's index); `None` when the settings
    /// impair nothing.
    pub fn new(settings: &impl Plan, salt: u64) -> Option<Box<Conditioner>> {
        let (all, peers) = settings.parts();
        let all = all.filter(|c| !c.is_none());
        if all.is_none() && peers.is_empty() {
            return None;
        }
        let base = all.copied().unwrap_or_default();
        let seed = mix(base.seed, salt);
        let limit = queue_limit(all, peers);
        let mut cond = Box::new(Conditioner {
            inbound: Direction::new(base.inbound, seed, limit),
            outbound: Direction::new(base.outbound, seed ^ 0x0F0F_0F0F_0F0F_0F0F, limit),
            all: all.copied(),
            peers: Vec::with_capacity(peers.len()),
            salt,
        });
        for (i, (addr, c)) in peers.iter().enumerate() {
            cond.add_peer(i, *addr, c);
        }
        Some(cond)
    }

    /// A session conditioned on its own, `i`-th in its plan: its own stream of draws,
    /// repeatable for a seed.
    fn add_peer(&mut self, i: usize, addr: SocketAddr, c: &LinkConditioner) {
        let seed = mix(c.seed, self.salt) ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.inbound.peers.push((addr, Lane::new(c.inbound, seed)));
        self.outbound
            .peers
            .push((addr, Lane::new(c.outbound, seed ^ 0x0F0F_0F0F_0F0F_0F0F)));
        self.peers.push((addr, *c));
    }

    /// Follow `settings` in place when only sessions of their own changed: a session whose
    /// settings are unchanged keeps its draws, a changed or new one starts its own, and held
    /// datagrams keep their due times (the other sessions are not touched). Returns `false`,
    /// changing nothing, when the endpoint-wide settings changed or nothing is conditioned any
    /// more (the caller then builds anew).
    pub fn retune(&mut self, settings: &impl Plan) -> bool {
        let (all, peers) = settings.parts();
        let all = all.filter(|c| !c.is_none());
        if all.copied() != self.all || (all.is_none() && peers.is_empty()) {
            return false;
        }
        let old = std::mem::take(&mut self.peers);
        let mut old_in: Vec<Option<Lane>> = std::mem::take(&mut self.inbound.peers)
            .into_iter()
            .map(|(_, l)| Some(l))
            .collect();
        let mut old_out: Vec<Option<Lane>> = std::mem::take(&mut self.outbound.peers)
            .into_iter()
            .map(|(_, l)| Some(l))
            .collect();
        for (i, (addr, c)) in peers.iter().enumerate() {
            let kept = old
                .iter()
                .position(|(a, o)| a == addr && o == c)
                .and_then(|j| Some((old_in.get_mut(j)?.take()?, old_out.get_mut(j)?.take()?)));
            match kept {
                Some((lane_in, lane_out)) => {
                    self.inbound.peers.push((*addr, lane_in));
                    self.outbound.peers.push((*addr, lane_out));
                    self.peers.push((*addr, *c));
                }
                None => self.add_peer(i, *addr, c),
            }
        }
        let limit = queue_limit(all, peers);
        self.inbound.limit = limit;
        self.outbound.limit = limit;
        true
    }

    /// Hold every segment of a received datagram in the inbound queue, to be handed to the
    /// service when due. Out of line and cold, like every conditioner-on path the hot loops
    /// call: the loops must compile as they do without the feature (see `Conditioner`).
    #[cold]
    #[inline(never)]
    pub fn hold_received(&mut self, now: Instant, d: RecvDatagram<'_>) {
        for segment in d.segments() {
            self.inbound.offer(now, d.src, segment);
        }
    }

    /// What a turn queued goes into the outbound queue, and what is due comes back into
    /// `batch` (out of line and cold, as above).
    #[cold]
    #[inline(never)]
    pub fn capture_release(&mut self, now: Instant, batch: &mut SendBatch) {
        self.capture(now, batch);
        self.release(now, batch);
    }

    /// Move every datagram queued in `batch` into the outbound queue (GSO runs datagram by
    /// datagram), leaving `batch` empty.
    #[cold]
    #[inline(never)]
    pub fn capture(&mut self, now: Instant, batch: &mut SendBatch) {
        for i in 0..batch.pending().len() {
            let e = batch.pending()[i];
            let payload = batch.payload(&e);
            match e.segment_size {
                Some(s) if s > 0 => {
                    for seg in payload.chunks(s as usize) {
                        self.outbound.offer(now, e.dst, seg);
                    }
                }
                _ => self.outbound.offer(now, e.dst, payload),
            }
        }
        batch.clear();
    }

    /// Put the outbound datagrams due by `now` into `batch`, as many as it takes.
    pub fn release(&mut self, now: Instant, batch: &mut SendBatch) {
        while !batch.is_full() {
            let Some(h) = self.outbound.pop_due(now) else {
                break;
            };
            // A datagram the batch refuses (too large for its destination) is dropped, as the
            // socket would have refused it.
            let _ = batch.push(h.addr, &h.data);
            self.outbound.recycle(h);
        }
    }

    /// The earliest time a held datagram (either way) is due.
    pub fn next_due(&self) -> Option<Instant> {
        match (self.inbound.next_due(), self.outbound.next_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Datagrams dropped so far: lost (at random or in bursts) and over the queue limit.
    pub fn drops(&self) -> (u64, u64) {
        (
            self.inbound.stats.lost + self.outbound.stats.lost,
            self.inbound.stats.queue_drops + self.outbound.stats.queue_drops,
        )
    }
}

/// `seed` with `salt` (a worker's index) mixed in.
#[cfg(feature = "conditioner")]
fn mix(seed: u64, salt: u64) -> u64 {
    seed ^ salt.wrapping_mul(0xA24B_AED4_963E_E407)
}

/// The most datagrams held per direction: the largest limit of the settings in force.
#[cfg(feature = "conditioner")]
fn queue_limit(all: Option<&LinkConditioner>, peers: &[(SocketAddr, LinkConditioner)]) -> usize {
    peers
        .iter()
        .map(|(_, c)| c.queue_limit)
        .chain(all.map(|c| c.queue_limit))
        .max()
        .unwrap_or(LinkConditioner::default().queue_limit)
}

/// Built without the `conditioner` feature: no conditioner can exist (the types are
/// uninhabited), so every branch the hot paths take on one folds away at compile time.
#[cfg(not(feature = "conditioner"))]
mod compiled_out {
    use super::*;

    /// A held datagram (never made: the fields are what the worker and client read).
    #[allow(dead_code)]
    pub(crate) struct Held {
        pub addr: SocketAddr,
        pub data: Vec<u8>,
    }

    /// No direction can exist.
    pub(crate) enum Direction {}

    impl Direction {
        pub fn pop_due(&mut self, _: Instant) -> Option<Held> {
            match *self {}
        }
        pub fn recycle(&mut self, _: Held) {
            match *self {}
        }
    }

    /// No conditioner can exist: [`Conditioner::new`] always returns `None`.
    pub(crate) struct Conditioner {
        pub inbound: Direction,
        #[allow(dead_code)]
        pub outbound: Direction,
    }

    impl Conditioner {
        pub fn new(_: &impl Plan, _: u64) -> Option<Box<Conditioner>> {
            None
        }
        pub fn retune(&mut self, _: &impl Plan) -> bool {
            match self.inbound {}
        }
        pub fn hold_received(&mut self, _: Instant, _: RecvDatagram<'_>) {
            match self.inbound {}
        }
        pub fn capture_release(&mut self, _: Instant, _: &mut SendBatch) {
            match self.inbound {}
        }
        pub fn capture(&mut self, _: Instant, _: &mut SendBatch) {
            match self.inbound {}
        }
        pub fn next_due(&self) -> Option<Instant> {
            match self.inbound {}
        }
        pub fn drops(&self) -> (u64, u64) {
            match self.inbound {}
        }
    }
}

#[cfg(not(feature = "conditioner"))]
pub(crate) use compiled_out::Conditioner;

/// Which instantiation of a hot loop runs (the worker's turns, a client's drive): the loops
/// are generic over it and pick one per turn. [`Off`] makes every conditioner hook a constant
/// no-op, so the loop that runs while the conditioner is off is the very code a build without
/// the feature runs (where [`On`] is never instantiated); [`On`] hands traffic to the
/// conditioner. Switching happens between turns, where nothing received is pending.
pub(crate) trait Mode {
    /// Whether this instantiation conditions traffic.
    const ON: bool;

    /// The conditioner in `slot` under this mode: always `None` for [`Off`].
    #[inline(always)]
    fn select(slot: &mut Option<Box<Conditioner>>) -> Option<&mut Conditioner> {
        if Self::ON {
            slot.as_deref_mut()
        } else {
            None
        }
    }

    /// [`Mode::select`] for reading.
    #[inline(always)]
    fn select_ref(slot: &Option<Box<Conditioner>>) -> Option<&Conditioner> {
        if Self::ON {
            slot.as_deref()
        } else {
            None
        }
    }
}

/// The loops' instantiation with the conditioner off (the only one without the feature).
pub(crate) struct Off;

impl Mode for Off {
    const ON: bool = false;
}

/// The loops' instantiation with a conditioner present.
pub(crate) struct On;

impl Mode for On {
    const ON: bool = true;
}

/// Whether `slot` holds a conditioner that the [`On`] instantiation must run (never without
/// the feature, so that build instantiates [`Off`] only).
#[inline(always)]
pub(crate) fn is_on(slot: &Option<Box<Conditioner>>) -> bool {
    cfg!(feature = "conditioner") && slot.is_some()
}

/// What a [`Conditioner`] is built from: endpoint-wide settings, and per-session ones by the
/// peer's address.
pub(crate) trait Plan {
    /// (endpoint-wide settings, per-session settings by peer address).
    #[cfg_attr(not(feature = "conditioner"), allow(dead_code))]
    fn parts(&self) -> (Option<&LinkConditioner>, &[(SocketAddr, LinkConditioner)]);
}

impl Plan for LinkConditioner {
    fn parts(&self) -> (Option<&LinkConditioner>, &[(SocketAddr, LinkConditioner)]) {
        (Some(self), &[])
    }
}

/// A server's conditioning: endpoint-wide settings and the sessions conditioned on their own.
#[derive(Debug, Clone, Default)]
pub(crate) struct ServerPlan {
    all: Option<LinkConditioner>,
    peers: Vec<(SocketAddr, LinkConditioner)>,
}

impl Plan for ServerPlan {
    fn parts(&self) -> (Option<&LinkConditioner>, &[(SocketAddr, LinkConditioner)]) {
        (self.all.as_ref(), &self.peers)
    }
}

/// Settings shared between a server and its workers: a change bumps the generation, which
/// each worker compares once per loop turn.
#[derive(Debug, Default)]
pub(crate) struct ConditionerControl {
    generation: AtomicU64,
    settings: Mutex<ServerPlan>,
}

impl ConditionerControl {
    pub fn new(initial: Option<LinkConditioner>) -> Arc<Self> {
        Arc::new(ConditionerControl {
            generation: AtomicU64::new(0),
            settings: Mutex::new(ServerPlan {
                all: initial,
                peers: Vec::new(),
            }),
        })
    }

    fn update(&self, change: impl FnOnce(&mut ServerPlan)) {
        change(&mut self.settings.lock().unwrap_or_else(|p| p.into_inner()));
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The endpoint-wide settings (every session not conditioned on its own).
    pub fn set(&self, settings: Option<LinkConditioner>) {
        self.update(|p| p.all = settings);
    }

    /// One session's settings, by its peer's address (`None`: back to the endpoint-wide ones).
    /// The workers take the change at their next turn.
    pub fn set_peer(&self, addr: SocketAddr, settings: Option<LinkConditioner>) {
        self.update(|p| {
            p.peers.retain(|(a, _)| *a != addr);
            if let Some(s) = settings {
                p.peers.push((addr, s));
            }
        });
    }

    /// Bumped by every change. Read once per worker turn in both builds (compiled out, nothing
    /// can be set, but the turn that runs with the conditioner off must be the same code).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The plan in force, `None` when nothing is conditioned.
    pub fn get(&self) -> Option<ServerPlan> {
        let p = self.settings.lock().unwrap_or_else(|p| p.into_inner());
        (p.all.is_some_and(|c| !c.is_none()) || !p.peers.is_empty()).then(|| p.clone())
    }
}

#[cfg(all(test, feature = "conditioner"))]
mod tests {
    use super::*;

    fn addr() -> SocketAddr {
        "127.0.0.1:9".parse().unwrap()
    }

    /// Offer `n` datagrams one per millisecond of virtual time, then drain; returns the delays
    /// of the released ones in release order (as the sequence numbers carried in the payload).
    fn run(imp: Impairment, n: u32) -> (Direction, Vec<(u32, Duration)>) {
        let mut d = Direction::new(imp, 42, 1 << 20);
        let t0 = Instant::now();
        let mut out = Vec::new();
        let mut sent_at = Vec::new();
        for i in 0..n {
            let now = t0 + Duration::from_millis(i as u64);
            sent_at.push(now);
            d.offer(now, addr(), &i.to_le_bytes());
            while let Some(h) = d.pop_due(now) {
                let k = u32::from_le_bytes(h.data[..4].try_into().unwrap());
                out.push((k, now - sent_at[k as usize]));
                d.recycle(h);
            }
        }
        let mut now = t0 + Duration::from_millis(n as u64);
        while let Some(due) = d.next_due() {
            now = now.max(due);
            while let Some(h) = d.pop_due(now) {
                let k = u32::from_le_bytes(h.data[..4].try_into().unwrap());
                out.push((k, h.due - sent_at[k as usize]));
                d.recycle(h);
            }
        }
        (d, out)
    }

    #[test]
    fn off_settings_build_no_conditioner() {
        assert!(LinkConditioner::default().is_none());
        assert!(Conditioner::new(&LinkConditioner::default(), 0).is_none());
        assert!(Conditioner::new(&LinkConditioner::default().seed(7), 3).is_none());
    }

    #[test]
    fn random_loss_matches_its_probability() {
        let (d, out) = run(Impairment::new().loss(0.05), 20_000);
        let lost = d.stats.lost as f64 / 20_000.0;
        assert!((0.045..0.055).contains(&lost), "lost {lost}");
        assert_eq!(out.len() as u64 + d.stats.lost, 20_000);
    }

    #[test]
    fn delay_and_jitter_bound_every_datagram() {
        let imp = Impairment::new()
            .delay(Duration::from_millis(50))
            .jitter(Duration::from_millis(10));
        let (_, out) = run(imp, 2_000);
        assert_eq!(out.len(), 2_000);
        for &(_, delay) in &out {
            assert!(delay >= Duration::from_millis(50) && delay <= Duration::from_millis(60));
        }
        // 10 ms of jitter at one datagram per ms reorders some.
        assert!(out.windows(2).any(|w| w[1].0 < w[0].0));
    }

    #[test]
    fn without_jitter_order_is_kept_and_reorder_moves_a_share_back() {
        let (_, out) = run(Impairment::new().delay(Duration::from_millis(5)), 1_000);
        assert!(out.windows(2).all(|w| w[0].0 < w[1].0));
        let imp = Impairment::new()
            .delay(Duration::from_millis(5))
            .reorder(0.1, Duration::from_millis(20));
        let (_, out) = run(imp, 10_000);
        let late = out
            .iter()
            .filter(|(_, d)| *d == Duration::from_millis(25))
            .count();
        assert!((900..1_100).contains(&late), "late {late}");
    }

    #[test]
    fn duplication_makes_copies() {
        let (d, out) = run(Impairment::new().duplicate(0.1), 10_000);
        assert_eq!(out.len() as u64, 10_000 + d.stats.duplicated);
        assert!((900..1_100).contains(&d.stats.duplicated));
    }

    #[test]
    fn bursts_follow_the_two_state_model() {
        // Mean burst 1/0.25 = 4 datagrams; bad for 0.01/(0.01+0.25) ≈ 3.8 % of them.
        let (d, out) = run(
            Impairment::new().bursts(GilbertElliott::new(0.01, 0.25)),
            50_000,
        );
        let lost = d.stats.lost as f64 / 50_000.0;
        assert!((0.03..0.047).contains(&lost), "lost {lost}");
        // Losses come in runs: the mean run of consecutive losses is well above one.
        let got: Vec<u32> = out.iter().map(|o| o.0).collect();
        let mut runs = 0;
        let mut prev = 0u32;
        for &k in &got {
            if k > prev + 1 {
                runs += 1;
            }
            prev = k;
        }
        let mean_run = d.stats.lost as f64 / runs as f64;
        assert!(mean_run > 3.0, "mean run {mean_run}");
    }

    #[test]
    fn rate_limit_spaces_datagrams_after_the_burst_and_bounds_the_queue() {
        // 100-byte datagrams at 10 kB/s: one per 10 ms once the 1000-byte bucket is spent.
        let mut d = Direction::new(
            Impairment::new().rate(RateLimit::new(10_000).burst_bytes(1_000)),
            1,
            50,
        );
        let t0 = Instant::now();
        for _ in 0..100 {
            d.offer(t0, addr(), &[0u8; 100]);
        }
        assert_eq!(d.held(), 50);
        assert_eq!(d.stats.queue_drops, 50);
        let mut dues = Vec::new();
        while let Some(due) = d.next_due() {
            let h = d.pop_due(due).unwrap();
            dues.push(h.due - t0);
        }
        assert!(dues[..11].iter().all(|d| d.is_zero()));
        assert_eq!(dues[11], Duration::from_millis(10));
        assert_eq!(dues[49], Duration::from_millis(390));
    }

    #[test]
    fn capture_and_release_keep_the_bytes_and_destination() {
        let c = LinkConditioner::new(
            Impairment::new(),
            Impairment::new().delay(Duration::from_millis(1)),
        );
        let mut cond = Conditioner::new(&c, 0).unwrap();
        let mut batch = SendBatch::new(8);
        batch.push(addr(), b"hello").unwrap();
        let t0 = Instant::now();
        cond.capture(t0, &mut batch);
        assert!(batch.is_empty());
        cond.release(t0, &mut batch);
        assert!(batch.is_empty());
        assert_eq!(cond.next_due(), Some(t0 + Duration::from_millis(1)));
        cond.release(t0 + Duration::from_millis(1), &mut batch);
        let e = batch.pending()[0];
        assert_eq!((e.dst, batch.payload(&e)), (addr(), &b"hello"[..]));
    }

    #[test]
    fn a_session_conditioned_on_its_own_meets_only_its_impairment() {
        let ms = Duration::from_millis;
        let other: SocketAddr = "127.0.0.1:10".parse().unwrap();
        let ctl = ConditionerControl::new(None);
        assert!(ctl.get().is_none(), "nothing set: no conditioner");
        let slow = LinkConditioner::symmetric(Impairment::new().delay(ms(40)));
        ctl.set_peer(addr(), Some(slow));
        let mut cond = Conditioner::new(&ctl.get().unwrap(), 0).unwrap();
        let t0 = Instant::now();
        cond.inbound.offer(t0, addr(), b"slow");
        cond.inbound.offer(t0, other, b"fast");
        let h = cond.inbound.pop_due(t0).unwrap();
        assert_eq!((h.addr, &h.data[..]), (other, &b"fast"[..]));
        assert!(cond.inbound.pop_due(t0).is_none());
        assert_eq!(cond.next_due(), Some(t0 + ms(40)));
        let h = cond.inbound.pop_due(t0 + ms(40)).unwrap();
        assert_eq!(h.addr, addr());
        // The endpoint-wide settings apply to the others, the session keeps its own.
        ctl.set(Some(LinkConditioner::symmetric(
            Impairment::new().delay(ms(5)),
        )));
        let mut cond = Conditioner::new(&ctl.get().unwrap(), 0).unwrap();
        cond.outbound.offer(t0, addr(), b"slow");
        cond.outbound.offer(t0, other, b"fast");
        assert_eq!(cond.outbound.pop_due(t0 + ms(5)).unwrap().addr, other);
        assert!(cond.outbound.pop_due(t0 + ms(39)).is_none());
        ctl.set(None);
        ctl.set_peer(addr(), None);
        assert!(ctl.get().is_none(), "all cleared: no conditioner");
    }

    #[test]
    fn a_change_of_one_session_leaves_the_others_and_the_held_datagrams_alone() {
        let ms = Duration::from_millis;
        let (a, b, c): (SocketAddr, SocketAddr, SocketAddr) = (
            "127.0.0.1:10".parse().unwrap(),
            "127.0.0.1:11".parse().unwrap(),
            "127.0.0.1:12".parse().unwrap(),
        );
        let lossy = LinkConditioner::symmetric(Impairment::new().loss(0.5).delay(ms(30)));
        let ctl = ConditionerControl::new(Some(LinkConditioner::symmetric(
            Impairment::new().delay(ms(10)),
        )));
        ctl.set_peer(a, Some(lossy));
        let mut cond = Conditioner::new(&ctl.get().unwrap(), 3).unwrap();
        // A twin that sees no change: `a`'s draws must go on the same in both.
        let mut twin = Conditioner::new(&ctl.get().unwrap(), 3).unwrap();
        let t0 = Instant::now();
        for i in 0..20u8 {
            cond.outbound.offer(t0, a, &[i]);
            twin.outbound.offer(t0, a, &[i]);
        }
        cond.outbound.offer(t0, b, b"held");
        // Session `c` gets its own settings: applied in place.
        ctl.set_peer(
            c,
            Some(LinkConditioner::symmetric(Impairment::new().delay(ms(50)))),
        );
        assert!(cond.retune(&ctl.get().unwrap()));
        // The datagram held for `b` keeps its due time (10 ms), not released at once.
        assert!(cond.outbound.pop_due(t0 + ms(9)).is_none());
        assert_eq!(cond.outbound.pop_due(t0 + ms(10)).unwrap().addr, b);
        // `a` draws on where it was: the same losses as the unchanged twin.
        for i in 20..60u8 {
            cond.outbound.offer(t0, a, &[i]);
            twin.outbound.offer(t0, a, &[i]);
        }
        assert_eq!(cond.outbound.stats.lost, twin.outbound.stats.lost);
        let kept = |d: &mut Direction| {
            let mut v = Vec::new();
            while let Some(h) = d.pop_due(t0 + ms(30)) {
                v.push(h.data[0]);
            }
            v
        };
        assert_eq!(kept(&mut cond.outbound), kept(&mut twin.outbound));
        // `c` meets its own delay.
        cond.inbound.offer(t0, c, b"c");
        assert!(cond.inbound.pop_due(t0 + ms(49)).is_none());
        assert!(cond.inbound.pop_due(t0 + ms(50)).is_some());
        // A change of the endpoint-wide settings is not applied in place (rebuilt, flushed).
        ctl.set(Some(LinkConditioner::symmetric(
            Impairment::new().delay(ms(5)),
        )));
        assert!(!cond.retune(&ctl.get().unwrap()));
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(LinkConditioner::symmetric(Impairment::new().loss(1.5))
            .validate()
            .is_err());
        assert!(LinkConditioner::symmetric(
            Impairment::new().bursts(GilbertElliott::new(0.1, 0.0))
        )
        .validate()
        .is_err());
        assert!(LinkConditioner::default()
            .queue_limit(0)
            .validate()
            .is_err());
        assert!(LinkConditioner::symmetric(Impairment::new().loss(0.05))
            .validate()
            .is_ok());
    }
}
