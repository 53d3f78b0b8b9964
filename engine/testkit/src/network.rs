//! [`SimNetwork`]: opaque datagrams between socket addresses over impaired links.

use std::collections::{BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::time::Instant;

use super::clock::SimClock;
use super::impair::{
    Direction, DropCause, ImpairedLink, Impairment, ImpairmentError, LinkCounters, Verdict,
};
use super::queue::Timed;

/// Byte buffers kept for reuse; beyond this, returned buffers are freed.
const POOL_MAX: usize = 4096;

/// A datagram handed out by [`SimNetwork::pop_due`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// Delivery time.
    pub at: Instant,
    /// Source address.
    pub from: SocketAddr,
    /// Destination address.
    pub to: SocketAddr,
    /// Payload; give it back with [`SimNetwork::recycle`] to reuse the allocation.
    pub bytes: Vec<u8>,
}

#[derive(Debug)]
struct LinkEntry {
    from: SocketAddr,
    to: SocketAddr,
    link: ImpairedLink,
}

/// A deterministic network of endpoints identified by [`SocketAddr`].
///
/// Every ordered address pair (`from`, `to`) gets its own [`ImpairedLink`], created on first use
/// with the network's default impairment unless [`set_route`](Self::set_route) or
/// [`set_link`](Self::set_link) configured it. The two directions between two addresses form a
/// route: its id is a hash of the address pair and the direction says which way (the lower
/// address to the higher is [`Direction::Forward`]), so each link's RNG stream depends only on
/// (seed, addresses, direction), never on the order in which links were created.
///
/// Datagrams come out of [`pop_due`](Self::pop_due) / [`deliver_until`](Self::deliver_until)
/// ordered by delivery time, ties broken by the order in which they were sent. The network never
/// reads a clock: the caller passes `now` (see [`SimClock`] and [`advance_clock`](Self::advance_clock)).
/// Memory is bounded by the links' queue caps.
#[derive(Debug)]
pub struct SimNetwork {
    epoch: Instant,
    seed: u64,
    default: Impairment,
    links: Vec<LinkEntry>,
    by_pair: HashMap<(SocketAddr, SocketAddr), usize>,
    /// Copies in flight: (link index, payload), earliest first, ties in send order.
    heap: BinaryHeap<Timed<(usize, Vec<u8>)>>,
    seq: u64,
    pool: Vec<Vec<u8>>,
    trace: Option<blake3::Hasher>,
}

impl SimNetwork {
    /// A network whose links use `default` and RNG streams derived from `seed`. `epoch` is
    /// simulated time zero (usually [`SimClock::base`]): trace records use offsets from it.
    pub fn new(epoch: Instant, seed: u64, default: Impairment) -> Result<Self, ImpairmentError> {
        default.validate()?;
        Ok(Self {
            epoch,
            seed,
            default,
            links: Vec::new(),
            by_pair: HashMap::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            pool: Vec::new(),
            trace: None,
        })
    }

    /// The seed of the links' RNG streams.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The route id of the address pair `{a, b}` (the same for both directions) and the direction
    /// of `a → b` on it.
    pub fn route_of(a: SocketAddr, b: SocketAddr) -> (u64, Direction) {
        let (lo, hi, dir) = if a <= b {
            (a, b, Direction::Forward)
        } else {
            (b, a, Direction::Backward)
        };
        let mut h = blake3::Hasher::new_derive_key("ricochet sim route id v1");
        hash_addr(&mut h, lo);
        hash_addr(&mut h, hi);
        let mut id = [0u8; 8];
        id.copy_from_slice(&h.finalize().as_bytes()[..8]);
        (u64::from_le_bytes(id), dir)
    }

    fn link_index(&mut self, from: SocketAddr, to: SocketAddr) -> usize {
        if let Some(&i) = self.by_pair.get(&(from, to)) {
            return i;
        }
        let (route, dir) = Self::route_of(from, to);
        // The default was validated in `new`/`set_default`.
        let link = ImpairedLink::from_valid(self.default.clone(), self.seed, route, dir);
        let i = self.links.len();
        self.links.push(LinkEntry { from, to, link });
        self.by_pair.insert((from, to), i);
        i
    }

    /// Sets the impairment of links created from now on.
    pub fn set_default(&mut self, impairment: Impairment) -> Result<(), ImpairmentError> {
        impairment.validate()?;
        self.default = impairment;
        Ok(())
    }

    /// Sets the impairment of the one direction `from → to` (creating the link if needed).
    pub fn set_link(
        &mut self,
        from: SocketAddr,
        to: SocketAddr,
        impairment: Impairment,
    ) -> Result<(), ImpairmentError> {
        impairment.validate()?;
        let i = self.link_index(from, to);
        self.links[i].link.set_impairment(impairment)
    }

    /// Sets the impairment of both directions between `a` and `b`.
    pub fn set_route(
        &mut self,
        a: SocketAddr,
        b: SocketAddr,
        impairment: Impairment,
    ) -> Result<(), ImpairmentError> {
        self.set_link(a, b, impairment.clone())?;
        self.set_link(b, a, impairment)
    }

    /// Starts hashing every send verdict and delivery into a trace (see
    /// [`trace_hash`](Self::trace_hash)).
    pub fn enable_trace(&mut self) {
        self.trace.get_or_insert_with(blake3::Hasher::new);
    }

    /// The BLAKE3 hash of the trace so far, if enabled. Each record holds the simulated time
    /// offset in nanoseconds, the addresses, the length and the outcome (drop cause, or the
    /// delivery with its payload), so two runs are bit-identical exactly when their hashes match.
    pub fn trace_hash(&self) -> Option<[u8; 32]> {
        self.trace.as_ref().map(|h| *h.finalize().as_bytes())
    }

    fn trace_record(&mut self, t: Instant, tag: u8, from: SocketAddr, to: SocketAddr, b: &[u8]) {
        let epoch = self.epoch;
        if let Some(h) = self.trace.as_mut() {
            let nanos = t.saturating_duration_since(epoch).as_nanos();
            h.update(&[tag]);
            h.update(&nanos.to_le_bytes());
            hash_addr(h, from);
            hash_addr(h, to);
            h.update(&(b.len() as u64).to_le_bytes());
            if tag == TRACE_DELIVER {
                h.update(b);
            }
        }
    }

    /// An empty buffer, reused from the pool when possible.
    pub fn take_buf(&mut self) -> Vec<u8> {
        self.pool.pop().unwrap_or_default()
    }

    /// Returns a buffer to the pool.
    pub fn recycle(&mut self, mut buf: Vec<u8>) {
        if self.pool.len() < POOL_MAX {
            buf.clear();
            self.pool.push(buf);
        }
    }

    /// Sends a copy of `bytes` from `from` to `to` at `now`; returns the link's verdict.
    pub fn send(
        &mut self,
        now: Instant,
        from: SocketAddr,
        to: SocketAddr,
        bytes: &[u8],
    ) -> Verdict {
        let mut buf = self.take_buf();
        buf.extend_from_slice(bytes);
        self.send_buf(now, from, to, buf)
    }

    /// Sends `buf` (taking ownership, no copy) from `from` to `to` at `now`.
    pub fn send_buf(
        &mut self,
        now: Instant,
        from: SocketAddr,
        to: SocketAddr,
        buf: Vec<u8>,
    ) -> Verdict {
        let i = self.link_index(from, to);
        let verdict = self.links[i].link.admit(now, buf.len());
        match verdict {
            Verdict::Drop(cause) => {
                let tag = match cause {
                    DropCause::Random => TRACE_DROP_RANDOM,
                    DropCause::Burst => TRACE_DROP_BURST,
                    DropCause::Overflow => TRACE_DROP_OVERFLOW,
                };
                self.trace_record(now, tag, from, to, &buf);
                self.recycle(buf);
            }
            Verdict::Deliver { at, duplicate } => {
                // The original gets the lower sequence number: at equal times it comes first.
                let copy = duplicate.map(|dup_at| {
                    let mut copy = self.take_buf();
                    copy.extend_from_slice(&buf);
                    (dup_at, copy)
                });
                self.push(at, i, buf);
                if let Some((dup_at, copy)) = copy {
                    self.push(dup_at, i, copy);
                }
            }
        }
        verdict
    }

    fn push(&mut self, at: Instant, link: usize, bytes: Vec<u8>) {
        let seq = self.seq;
        self.seq += 1;
        self.heap.push(Timed {
            at,
            seq,
            item: (link, bytes),
        });
    }

    /// When the earliest datagram in flight arrives.
    pub fn next_delivery_time(&self) -> Option<Instant> {
        self.heap.peek().map(|p| p.at)
    }

    /// Copies in flight on all links.
    pub fn in_flight(&self) -> usize {
        self.heap.len()
    }

    /// Removes and returns the earliest datagram due at or before `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<Datagram> {
        if self.heap.peek()?.at > now {
            return None;
        }
        let Timed {
            at,
            item: (link, bytes),
            ..
        } = self.heap.pop()?;
        let entry = &mut self.links[link];
        entry.link.on_departed(bytes.len());
        let (from, to) = (entry.from, entry.to);
        self.trace_record(at, TRACE_DELIVER, from, to, &bytes);
        Some(Datagram {
            at,
            from,
            to,
            bytes,
        })
    }

    /// Every datagram due at or before `now`, in delivery order.
    pub fn deliver_until(&mut self, now: Instant) -> Vec<Datagram> {
        std::iter::from_fn(|| self.pop_due(now)).collect()
    }

    /// Driver helper: advances `clock` to the earlier of the next delivery and `timer` (the
    /// caller's next timer) if that is at or before `deadline`, and returns true; otherwise
    /// advances it to `deadline` and returns false. Time never moves backwards.
    pub fn advance_clock(
        &self,
        clock: &mut SimClock,
        timer: Option<Instant>,
        deadline: Instant,
    ) -> bool {
        let next = match (self.next_delivery_time(), timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match next {
            Some(t) if t <= deadline => {
                clock.advance_to(t);
                true
            }
            _ => {
                clock.advance_to(deadline);
                false
            }
        }
    }

    /// Counters of the direction `from → to`, if it has carried or been configured.
    pub fn link_counters(&self, from: SocketAddr, to: SocketAddr) -> Option<&LinkCounters> {
        self.by_pair
            .get(&(from, to))
            .map(|&i| self.links[i].link.counters())
    }

    /// Every link as (from, to, counters), in creation order.
    pub fn links(&self) -> impl Iterator<Item = (SocketAddr, SocketAddr, &LinkCounters)> + '_ {
        self.links.iter().map(|e| (e.from, e.to, e.link.counters()))
    }

    /// The sum over all links (peaks are summed, see [`LinkCounters::merge`]).
    pub fn total_counters(&self) -> LinkCounters {
        let mut total = LinkCounters::default();
        for e in &self.links {
            total.merge(e.link.counters());
        }
        total
    }
}

const TRACE_DELIVER: u8 = 0;
const TRACE_DROP_RANDOM: u8 = 1;
const TRACE_DROP_BURST: u8 = 2;
const TRACE_DROP_OVERFLOW: u8 = 3;

fn hash_addr(h: &mut blake3::Hasher, a: SocketAddr) {
    match a {
        SocketAddr::V4(v4) => {
            h.update(&[4]);
            h.update(&v4.ip().octets());
        }
        SocketAddr::V6(v6) => {
            h.update(&[6]);
            h.update(&v6.ip().octets());
        }
    }
    h.update(&a.port().to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn route_ids_are_symmetric_and_directions_opposite() {
        let (r1, d1) = SimNetwork::route_of(addr(1), addr(2));
        let (r2, d2) = SimNetwork::route_of(addr(2), addr(1));
        assert_eq!(r1, r2);
        assert_ne!(d1, d2);
        assert_ne!(SimNetwork::route_of(addr(1), addr(3)).0, r1);
    }

    #[test]
    fn delivers_in_time_order_with_ties_in_send_order() {
        let clock = SimClock::new();
        let t0 = clock.now();
        let mut net = SimNetwork::new(clock.base(), 1, Impairment::none()).unwrap();
        net.set_link(
            addr(1),
            addr(2),
            Impairment::none().with_delay(Duration::from_millis(5)),
        )
        .unwrap();
        net.send(t0, addr(1), addr(2), b"slow");
        net.send(t0, addr(3), addr(2), b"a");
        net.send(t0, addr(4), addr(2), b"b");
        assert_eq!(net.next_delivery_time(), Some(t0));
        let now = net.deliver_until(t0);
        assert_eq!(
            now.iter().map(|d| d.bytes.as_slice()).collect::<Vec<_>>(),
            [b"a".as_slice(), b"b"]
        );
        assert_eq!(
            net.next_delivery_time(),
            Some(t0 + Duration::from_millis(5))
        );
        let later = net.deliver_until(t0 + Duration::from_millis(5));
        assert_eq!(later.len(), 1);
        assert_eq!((later[0].from, later[0].to), (addr(1), addr(2)));
        assert_eq!(net.in_flight(), 0);
        let c = net.link_counters(addr(1), addr(2)).unwrap();
        assert_eq!((c.forwarded, c.departed, c.queue_datagrams), (1, 1, 0));
    }

    #[test]
    fn advance_clock_stops_at_the_earliest_event_or_the_deadline() {
        let mut clock = SimClock::new();
        let t0 = clock.now();
        let ms = Duration::from_millis(1);
        let mut net =
            SimNetwork::new(clock.base(), 1, Impairment::none().with_delay(ms * 10)).unwrap();
        net.send(t0, addr(1), addr(2), b"x");
        assert!(net.advance_clock(&mut clock, Some(t0 + ms * 4), t0 + ms * 100));
        assert_eq!(clock.elapsed(), ms * 4);
        assert!(net.advance_clock(&mut clock, None, t0 + ms * 100));
        assert_eq!(clock.elapsed(), ms * 10);
        net.deliver_until(clock.now());
        assert!(!net.advance_clock(&mut clock, Some(t0 + ms * 200), t0 + ms * 100));
        assert_eq!(clock.elapsed(), ms * 100);
    }
}
