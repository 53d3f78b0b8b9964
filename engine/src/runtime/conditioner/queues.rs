//! The conditioner proper: each direction's random draws (loss, bursts, duplication, delay,
//! jitter, reordering), its rate limit, and the datagrams it holds in one time-ordered queue.
//! Built without the `conditioner` feature, only uninhabited stand-ins remain.

#[cfg(feature = "conditioner")]
use std::cmp::Reverse;
#[cfg(feature = "conditioner")]
use std::collections::BinaryHeap;
use std::net::SocketAddr;
#[cfg(feature = "conditioner")]
use std::time::Duration;
use std::time::Instant;

use ricochet_platform::{RecvDatagram, SendBatch};

use super::Plan;
#[cfg(feature = "conditioner")]
use super::{Impairment, LinkConditioner};

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
    /// Sessions conditioned on their own ([`super::ConditionerControl::set_peer`]): a datagram to or
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

#[cfg(all(test, feature = "conditioner"))]
mod tests;
