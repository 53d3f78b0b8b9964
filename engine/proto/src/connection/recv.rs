//! Receive side of the channels: duplicate suppression, ordering, reassembly, memory accounting.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::{ChannelKind, DropCause, Event};

/// A reliable message id further than this beyond the next expected one is a protocol violation
/// (a compliant sender's window keeps ids far closer), which bounds the per-channel state.
const ID_SPAN: u64 = 1 << 14;
/// Accounting cost of one fragment slot besides its bytes.
const SLOT_COST: usize = std::mem::size_of::<Option<Bytes>>();
/// Most incomplete messages an unreliable channel holds at once. A new one past it drops the
/// channel's oldest (counted in `unreliable_dropped`): an unreliable message that waits behind
/// 64 newer ones on its channel is stale anyway. Without a count the byte budget alone bounds
/// them, and a cheap fragment (a two-slot message costs about 64 bytes) would let one peer
/// park tens of thousands of them, each walked by expiry.
pub(crate) const MAX_UNRELIABLE_PARTIALS: usize = 64;

/// A message being reassembled (or complete and waiting for its turn).
#[derive(Debug)]
struct Partial {
    count: u32,
    received: u32,
    frags: Vec<Option<Bytes>>,
    /// Bytes charged to the budgets for this message.
    cost: usize,
}

impl Partial {
    fn complete(&self) -> bool {
        self.received == self.count
    }

    fn assemble(&mut self) -> Bytes {
        if self.frags.len() == 1 {
            return self.frags[0].take().unwrap_or_default();
        }
        let len = self.frags.iter().flatten().map(Bytes::len).sum();
        let mut out = BytesMut::with_capacity(len);
        for f in self.frags.iter_mut().flatten() {
            out.extend_from_slice(f);
        }
        out.freeze()
    }
}

#[derive(Debug)]
enum State {
    Ordered {
        next: u64,
    },
    Unordered {
        /// Every id below is delivered.
        floor: u64,
        /// Delivered ids at or above `floor`.
        done: BTreeSet<u64>,
    },
    Unreliable {
        arrivals: Arrivals,
    },
    Sequenced {
        /// Ids below are stale.
        next_min: u64,
        arrivals: Arrivals,
    },
}

/// An unreliable channel's partial messages, `(first_seen, id)` in arrival order (`first_seen`
/// never decreases along it), so expiry takes the stale ones off the front and the next
/// expiry is the front's. Always the ids of the channel's `pending` map, so at most
/// [`MAX_UNRELIABLE_PARTIALS`] long. A `Vec` (its front removals move at most 64 entries)
/// that lives in the channel's `State`: it fits beside `next_min` in the room the
/// `Unordered` variant already takes, so a session's channel table is no larger for it.
type Arrivals = Vec<(Instant, u64)>;

impl State {
    fn arrivals(&self) -> Option<&Arrivals> {
        match self {
            State::Unreliable { arrivals } | State::Sequenced { arrivals, .. } => Some(arrivals),
            State::Ordered { .. } | State::Unordered { .. } => None,
        }
    }

    fn arrivals_mut(&mut self) -> Option<&mut Arrivals> {
        match self {
            State::Unreliable { arrivals } | State::Sequenced { arrivals, .. } => Some(arrivals),
            State::Ordered { .. } | State::Unordered { .. } => None,
        }
    }
}

#[derive(Debug)]
struct Channel {
    kind: ChannelKind,
    state: State,
    pending: BTreeMap<u64, Partial>,
}

/// A reassembly budget: bytes in use and the limit. A connection draws on its own (unlimited)
/// one; an endpoint lends every connection its shared one for the length of each call (see
/// `Connection::swap_budgets`), so the limit holds over all of them without shared counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Budget {
    pub(crate) used: usize,
    pub(crate) limit: usize,
}

impl Budget {
    pub(crate) fn unlimited() -> Self {
        Self::new(usize::MAX)
    }

    pub(crate) fn new(limit: usize) -> Self {
        Self { used: 0, limit }
    }
}

/// Reassembly bytes each connection holds without drawing on the endpoint's shared budget:
/// sessions that fill that budget (a few misbehaving peers can) still leave every other one
/// room for ordinary messages and a few lost packets' worth of out-of-order data.
pub(crate) const OWN_REASSEMBLY: usize = 16 << 10;

/// The part of a connection's `held` reassembly bytes charged to the shared budget.
pub(crate) fn shared_part(held: usize) -> usize {
    held.saturating_sub(OWN_REASSEMBLY)
}

/// The budgets all of an endpoint's connections share: reassembly bytes and FEC retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SharedBudgets {
    pub(crate) reassembly: Budget,
    pub(crate) fec: crate::fec::RetentionBudget,
}

/// Size of the endpoint's receive arena's chunks ([`message_bytes`]).
pub(crate) const ARENA_CHUNK: usize = 4096;
/// Largest message cut from the arena; larger ones get an allocation of their own.
const ARENA_MAX_MESSAGE: usize = 512;

/// The `Bytes` of a whole received message. With an `arena` (the endpoint's), a small message
/// is copied into it and cut off: messages received one after another share a chunk, and a
/// chunk whose messages were all dropped is reused (`BytesMut::reserve` reclaims it), so a
/// server whose handler drops its messages allocates none in steady state. A message the
/// application keeps keeps its chunk (at most [`ARENA_CHUNK`] bytes) alive.
fn message_bytes(data: &[u8], arena: Option<&mut BytesMut>) -> Bytes {
    match arena {
        Some(a) if data.len() <= ARENA_MAX_MESSAGE => {
            if a.capacity() - a.len() < data.len() {
                a.reserve(ARENA_CHUNK);
            }
            a.extend_from_slice(data);
            a.split().freeze()
        }
        _ => Bytes::copy_from_slice(data),
    }
}

/// All receive channels of a connection.
#[derive(Debug)]
pub(crate) struct Receiver {
    channels: Vec<Channel>,
    /// Bytes charged for held fragments.
    pub(crate) bytes: usize,
    pub(crate) peak: usize,
    /// Reliable messages held, complete or not (advertised window = recv_window − this). A
    /// message counts once however many fragments it has: counting fragments would let one
    /// message larger than the window fill it and never complete. Bytes stay bounded by the
    /// per-connection and per-endpoint reassembly budgets.
    pub(crate) segments: usize,
    limit: usize,
    pub(crate) budget: Budget,
    max_fragments: u64,
    max_message: usize,
    pub(crate) unreliable_dropped: u64,
}

/// Outcome of checking whether a reliable fragment needs new buffer space.
pub(crate) struct Need {
    pub(crate) segments: usize,
    pub(crate) bytes: usize,
}

impl Receiver {
    pub(crate) fn new(cfg: &crate::Config, budget: Budget) -> Self {
        let channels = cfg
            .channels
            .iter()
            .map(|&kind| Channel {
                kind,
                state: match kind {
                    ChannelKind::ReliableOrdered => State::Ordered { next: 0 },
                    ChannelKind::ReliableUnordered => State::Unordered {
                        floor: 0,
                        done: BTreeSet::new(),
                    },
                    ChannelKind::Unreliable => State::Unreliable {
                        arrivals: Vec::new(),
                    },
                    ChannelKind::UnreliableSequenced => State::Sequenced {
                        next_min: 0,
                        arrivals: Vec::new(),
                    },
                },
                pending: BTreeMap::new(),
            })
            .collect();
        Self {
            channels,
            bytes: 0,
            peak: 0,
            segments: 0,
            limit: cfg.reassembly_limit,
            budget,
            max_fragments: cfg.max_fragments(),
            max_message: cfg.max_message_size,
            unreliable_dropped: 0,
        }
    }

    /// Hints the CPU to load the channel table (see `prefetch`).
    pub(crate) fn prefetch(&self) {
        crate::prefetch::front(&self.channels, 256);
    }

    /// Structural checks that do not depend on state: known channel, sane fragment count, no
    /// empty fragment of a message cut in several (a sender cuts `ceil(len / payload)`
    /// fragments, each at least one byte; only a whole message, count 1, may be empty).
    pub(crate) fn validate(&self, channel: u8, count: u64, len: usize) -> Result<(), DropCause> {
        if usize::from(channel) >= self.channels.len()
            || count > self.max_fragments
            || len > self.max_message
            || (count > 1 && len == 0)
        {
            return Err(DropCause::ProtocolViolation);
        }
        Ok(())
    }

    /// Buffer space a reliable fragment would newly take if accepted: `bytes` for anything that
    /// will be held, `segments` only for fragments that do not make progress. Fragments that
    /// make progress (of the next in-order message, of a message already partly held) take no
    /// window segment, so a full window never blocks the fragment that would drain it.
    /// Unreliable fragments need nothing here: they are dropped alone when space runs out.
    ///
    /// The caller accepts a packet only if everything it needs fits, so a reliable fragment of
    /// an acknowledged packet is never dropped. Buffered bytes cannot exceed what the peer has
    /// unacknowledged, so a `reassembly_limit` above `send_window x max_datagram_size` (plus
    /// fragment slots) never stalls; a smaller one may stall a connection (retransmissions
    /// repeat), never lose data.
    pub(crate) fn need(
        &self,
        channel: u8,
        message_id: u64,
        index: u64,
        count: u64,
        len: usize,
    ) -> Need {
        let none = Need {
            segments: 0,
            bytes: 0,
        };
        let Some(ch) = self.channels.get(usize::from(channel)) else {
            return none;
        };
        if !ch.kind.is_reliable() {
            return none;
        }
        if let Some(p) = ch.pending.get(&message_id) {
            let have = p.frags.get(index as usize).is_none_or(Option::is_some);
            return Need {
                segments: 0,
                bytes: if have { 0 } else { len },
            };
        }
        let progress = Need {
            segments: 0,
            bytes: len + SLOT_COST * count as usize,
        };
        let fresh = Need {
            segments: 1,
            bytes: len + SLOT_COST * count as usize,
        };
        match &ch.state {
            State::Ordered { next } if message_id < *next => none,
            State::Ordered { next } if message_id == *next && count == 1 => none,
            State::Ordered { next } if message_id == *next => progress,
            State::Unordered { floor, done }
                if message_id < *floor || done.contains(&message_id) =>
            {
                none
            }
            State::Unordered { .. } if count == 1 => none,
            _ => fresh,
        }
    }

    /// Whether `need` fits the connection and endpoint budgets.
    pub(crate) fn fits(&self, need: &Need, extra_bytes: usize) -> bool {
        let n = need.bytes + extra_bytes;
        self.bytes + n <= self.limit
            && self.budget.used.saturating_add(self.shared_growth(n)) <= self.budget.limit
    }

    /// What holding `n` more bytes adds to the shared budget (beyond `OWN_REASSEMBLY`).
    fn shared_growth(&self, n: usize) -> usize {
        shared_part(self.bytes + n) - shared_part(self.bytes)
    }

    fn charge(&mut self, n: usize) -> bool {
        if self.bytes + n > self.limit {
            return false;
        }
        let shared = self.shared_growth(n);
        if self.budget.used.saturating_add(shared) > self.budget.limit {
            return false;
        }
        self.budget.used += shared;
        self.bytes += n;
        self.peak = self.peak.max(self.bytes);
        true
    }

    fn release(&mut self, n: usize) {
        let shared = shared_part(self.bytes) - shared_part(self.bytes - n);
        self.bytes -= n;
        self.budget.used = self.budget.used.saturating_sub(shared);
    }

    /// [`Self::on_fragment_in`] without an arena (every message its own allocation).
    #[cfg(test)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_fragment(
        &mut self,
        now: Instant,
        channel: u8,
        message_id: u64,
        index: u64,
        count: u64,
        data: &[u8],
        events: &mut VecDeque<Event>,
        delivered: &mut u64,
    ) -> Result<(), DropCause> {
        self.on_fragment_in(
            now, channel, message_id, index, count, data, events, delivered, None,
        )
    }

    /// Accept one fragment (count 1 = whole message). Complete messages become events; a
    /// whole small message is cut from `arena` when there is one ([`message_bytes`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_fragment_in(
        &mut self,
        now: Instant,
        channel: u8,
        message_id: u64,
        index: u64,
        count: u64,
        data: &[u8],
        events: &mut VecDeque<Event>,
        delivered: &mut u64,
        arena: Option<&mut BytesMut>,
    ) -> Result<(), DropCause> {
        self.validate(channel, count, data.len())?;
        let ci = usize::from(channel);
        let kind = self.channels[ci].kind;
        if let Some(done) =
            self.fast_path(channel, message_id, count, data, events, delivered, arena)
        {
            return done;
        }
        // Slow path: buffer the fragment.
        let count32 = u32::try_from(count).map_err(|_| DropCause::ProtocolViolation)?;
        let idx = index as usize;
        if !self.channels[ci].pending.contains_key(&message_id) {
            self.start_partial(now, ci, kind, message_id, count, count32)?;
        }
        let (have, p_count, held) = match self.channels[ci].pending.get(&message_id) {
            Some(p) => (
                p.frags.get(idx).is_some_and(Option::is_some),
                p.count,
                // Its payload bytes so far: the cost less the slots' (summing the held
                // fragments instead made assembling a message quadratic in its count).
                p.cost - SLOT_COST * p.count as usize,
            ),
            None => return Err(DropCause::ProtocolViolation),
        };
        if p_count != count32 {
            return Err(DropCause::ProtocolViolation);
        }
        if have {
            return Ok(()); // duplicate fragment
        }
        if held + data.len() > self.max_message {
            return Err(DropCause::ProtocolViolation);
        }
        if !self.charge(data.len()) {
            if !kind.is_reliable() {
                self.unreliable_dropped += 1;
            }
            return Err(DropCause::FlowControl);
        }
        let Some(p) = self.channels[ci].pending.get_mut(&message_id) else {
            return Err(DropCause::ProtocolViolation);
        };
        p.frags[idx] = Some(Bytes::copy_from_slice(data));
        p.cost += data.len();
        p.received += 1;
        if !p.complete() {
            return Ok(());
        }
        self.complete(ci, message_id, events, delivered);
        Ok(())
    }

    /// Duplicate, stale and single-fragment messages, per channel state: `Some` when the
    /// fragment is dealt with, `None` when it is to be buffered.
    #[allow(clippy::too_many_arguments)]
    fn fast_path(
        &mut self,
        channel: u8,
        message_id: u64,
        count: u64,
        data: &[u8],
        events: &mut VecDeque<Event>,
        delivered: &mut u64,
        arena: Option<&mut BytesMut>,
    ) -> Option<Result<(), DropCause>> {
        let ci = usize::from(channel);
        match &mut self.channels[ci].state {
            State::Ordered { next } => {
                if message_id < *next {
                    return Some(Ok(())); // duplicate of a delivered message
                }
                if message_id >= *next + ID_SPAN {
                    return Some(Err(DropCause::ProtocolViolation));
                }
                if message_id == *next && count == 1 {
                    *next += 1;
                    events.push_back(Event::Message {
                        channel,
                        data: message_bytes(data, arena),
                    });
                    *delivered += 1;
                    self.drain_ordered(ci, events, delivered);
                    return Some(Ok(()));
                }
            }
            State::Unordered { floor, done } => {
                if message_id < *floor || done.contains(&message_id) {
                    return Some(Ok(()));
                }
                if message_id >= *floor + ID_SPAN {
                    return Some(Err(DropCause::ProtocolViolation));
                }
                if count == 1 {
                    Self::mark_done(floor, done, message_id);
                    events.push_back(Event::Message {
                        channel,
                        data: message_bytes(data, arena),
                    });
                    *delivered += 1;
                    return Some(Ok(()));
                }
            }
            State::Sequenced { next_min, .. } => {
                if message_id < *next_min {
                    self.unreliable_dropped += 1;
                    return Some(Ok(()));
                }
                if count == 1 {
                    *next_min = message_id + 1;
                    events.push_back(Event::Message {
                        channel,
                        data: message_bytes(data, arena),
                    });
                    *delivered += 1;
                    self.drop_stale_sequenced(ci);
                    return Some(Ok(()));
                }
            }
            State::Unreliable { .. } => {
                if count == 1 {
                    events.push_back(Event::Message {
                        channel,
                        data: message_bytes(data, arena),
                    });
                    *delivered += 1;
                    return Some(Ok(()));
                }
            }
        }
        None
    }

    /// The first fragment of a message to buffer: make room for it (an unreliable channel's
    /// oldest partial message gives way when full) and charge its slots.
    fn start_partial(
        &mut self,
        now: Instant,
        ci: usize,
        kind: ChannelKind,
        message_id: u64,
        count: u64,
        count32: u32,
    ) -> Result<(), DropCause> {
        if !kind.is_reliable() && self.channels[ci].pending.len() >= MAX_UNRELIABLE_PARTIALS {
            // Full: the oldest partial message gives way to the new one.
            let oldest = self.channels[ci]
                .state
                .arrivals()
                .and_then(|a| a.first())
                .map(|&(_, id)| id);
            if let Some(oldest) = oldest {
                if let Some(p) = self.remove_partial(ci, oldest) {
                    self.forget(ci, &p);
                    self.unreliable_dropped += 1;
                }
            }
        }
        let cost = SLOT_COST * count as usize;
        if !self.charge(cost) {
            if !kind.is_reliable() {
                self.unreliable_dropped += 1;
            }
            return Err(DropCause::FlowControl);
        }
        if kind.is_reliable() {
            self.segments += 1;
        } else if let Some(arrivals) = self.channels[ci].state.arrivals_mut() {
            // Kept in arrival order; a clock that steps back must not unsort it.
            let first_seen = arrivals.last().map_or(now, |&(t, _)| t.max(now));
            arrivals.push((first_seen, message_id));
        }
        self.channels[ci].pending.insert(
            message_id,
            Partial {
                count: count32,
                received: 0,
                frags: vec![None; count as usize],
                cost,
            },
        );
        Ok(())
    }

    /// A buffered message is complete: deliver what the channel's order allows.
    fn complete(
        &mut self,
        ci: usize,
        message_id: u64,
        events: &mut VecDeque<Event>,
        delivered: &mut u64,
    ) {
        match &mut self.channels[ci].state {
            State::Ordered { .. } => self.drain_ordered(ci, events, delivered),
            State::Unordered { floor, done } => {
                Self::mark_done(floor, done, message_id);
                self.deliver_pending(ci, message_id, events, delivered);
            }
            State::Unreliable { .. } => self.deliver_pending(ci, message_id, events, delivered),
            State::Sequenced { next_min, .. } => {
                *next_min = message_id + 1;
                self.deliver_pending(ci, message_id, events, delivered);
                self.drop_stale_sequenced(ci);
            }
        }
    }

    fn mark_done(floor: &mut u64, done: &mut BTreeSet<u64>, id: u64) {
        if id == *floor {
            *floor += 1;
            while done.remove(floor) {
                *floor += 1;
            }
        } else {
            done.insert(id);
        }
    }

    fn deliver_pending(
        &mut self,
        ci: usize,
        id: u64,
        events: &mut VecDeque<Event>,
        delivered: &mut u64,
    ) {
        if let Some(mut p) = self.remove_partial(ci, id) {
            let data = p.assemble();
            self.forget(ci, &p);
            events.push_back(Event::Message {
                channel: ci as u8,
                data,
            });
            *delivered += 1;
        }
    }

    /// Takes message `id` out of channel `ci`'s pending map (and its arrival list).
    fn remove_partial(&mut self, ci: usize, id: u64) -> Option<Partial> {
        let ch = &mut self.channels[ci];
        let p = ch.pending.remove(&id)?;
        if let Some(arrivals) = ch.state.arrivals_mut() {
            // At most `MAX_UNRELIABLE_PARTIALS` entries; usually the front.
            if let Some(i) = arrivals.iter().position(|&(_, a)| a == id) {
                arrivals.remove(i);
            }
        }
        Some(p)
    }

    fn forget(&mut self, ci: usize, p: &Partial) {
        self.release(p.cost);
        if self.channels[ci].kind.is_reliable() {
            self.segments -= 1;
        }
    }

    fn drain_ordered(&mut self, ci: usize, events: &mut VecDeque<Event>, delivered: &mut u64) {
        loop {
            let State::Ordered { next } = self.channels[ci].state else {
                return;
            };
            let ready = self.channels[ci]
                .pending
                .get(&next)
                .is_some_and(Partial::complete);
            if !ready {
                return;
            }
            self.deliver_pending(ci, next, events, delivered);
            if let State::Ordered { next } = &mut self.channels[ci].state {
                *next += 1;
            }
        }
    }

    fn drop_stale_sequenced(&mut self, ci: usize) {
        let State::Sequenced { next_min, .. } = self.channels[ci].state else {
            return;
        };
        while let Some((&id, _)) = self.channels[ci].pending.first_key_value() {
            if id >= next_min {
                break;
            }
            if let Some(p) = self.remove_partial(ci, id) {
                self.forget(ci, &p);
                self.unreliable_dropped += 1;
            }
        }
    }

    /// Drop unreliable partial messages older than `timeout`. Costs one step per channel and
    /// per message dropped: each channel's stale messages are the front of its arrival list.
    pub(crate) fn expire(&mut self, now: Instant, timeout: Duration) {
        for ci in 0..self.channels.len() {
            let Some(arrivals) = self.channels[ci].state.arrivals_mut() else {
                continue;
            };
            // A deadline past the clock's range never comes.
            let stale = arrivals
                .iter()
                .take_while(|&&(first_seen, _)| {
                    first_seen.checked_add(timeout).is_some_and(|t| t <= now)
                })
                .count();
            if stale == 0 {
                continue;
            }
            let mut arrivals = std::mem::take(arrivals);
            for (_, id) in arrivals.drain(..stale) {
                if let Some(p) = self.channels[ci].pending.remove(&id) {
                    self.forget(ci, &p);
                    self.unreliable_dropped += 1;
                }
            }
            if let Some(a) = self.channels[ci].state.arrivals_mut() {
                *a = arrivals;
            }
        }
    }

    /// When the oldest unreliable partial message expires (each channel's is the front of its
    /// arrival list).
    pub(crate) fn next_expiry(&self, timeout: Duration) -> Option<Instant> {
        self.channels
            .iter()
            .filter_map(|c| c.state.arrivals()?.first())
            .filter_map(|&(first_seen, _)| first_seen.checked_add(timeout))
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn rx(limit: usize) -> Receiver {
        let cfg = Config {
            reassembly_limit: limit,
            ..Config::default()
        };
        Receiver::new(&cfg, Budget::unlimited())
    }

    #[test]
    fn ordered_reassembly_waits_for_the_gap_and_releases_memory() {
        let mut r = rx(1 << 20);
        let (mut ev, mut n) = (VecDeque::new(), 0);
        let t = ricochet_testkit::SimClock::new().now();
        // Message 1 (two fragments) before message 0.
        r.on_fragment(t, 0, 1, 1, 2, b"d", &mut ev, &mut n).unwrap();
        r.on_fragment(t, 0, 1, 0, 2, b"c", &mut ev, &mut n).unwrap();
        assert!(ev.is_empty());
        // One held message (of two fragments): the window counts messages.
        assert_eq!(r.segments, 1);
        r.on_fragment(t, 0, 0, 0, 1, b"ab", &mut ev, &mut n)
            .unwrap();
        let got: Vec<_> = ev.drain(..).collect();
        assert_eq!(
            got,
            vec![
                Event::Message {
                    channel: 0,
                    data: Bytes::from_static(b"ab")
                },
                Event::Message {
                    channel: 0,
                    data: Bytes::from_static(b"cd")
                },
            ]
        );
        assert_eq!((r.bytes, r.segments), (0, 0));
        // Duplicates of delivered messages are ignored.
        r.on_fragment(t, 0, 0, 0, 1, b"ab", &mut ev, &mut n)
            .unwrap();
        assert!(ev.is_empty());
        // Inconsistent fragment count is a violation.
        r.on_fragment(t, 0, 5, 0, 3, b"x", &mut ev, &mut n).unwrap();
        assert_eq!(
            r.on_fragment(t, 0, 5, 1, 4, b"y", &mut ev, &mut n),
            Err(DropCause::ProtocolViolation)
        );
    }

    #[test]
    fn unreliable_partials_expire_and_sequenced_drops_stale() {
        let mut r = rx(1 << 20);
        let (mut ev, mut n) = (VecDeque::new(), 0);
        let t = ricochet_testkit::SimClock::new().now();
        r.on_fragment(t, 2, 0, 0, 2, b"half", &mut ev, &mut n)
            .unwrap();
        assert!(r.bytes > 0);
        let d = Duration::from_millis(500);
        assert_eq!(r.next_expiry(d), Some(t + d));
        r.expire(t + d, d);
        assert_eq!(r.bytes, 0);
        assert_eq!(r.unreliable_dropped, 1);
        // Sequenced: 3 delivered, then 2 is stale; a partial 1 is dropped when 3 completes.
        r.on_fragment(t, 3, 1, 0, 2, b"p", &mut ev, &mut n).unwrap();
        r.on_fragment(t, 3, 3, 0, 1, b"new", &mut ev, &mut n)
            .unwrap();
        r.on_fragment(t, 3, 2, 0, 1, b"old", &mut ev, &mut n)
            .unwrap();
        let got: Vec<_> = ev.drain(..).collect();
        assert_eq!(
            got,
            vec![Event::Message {
                channel: 3,
                data: Bytes::from_static(b"new")
            }]
        );
        assert_eq!(r.bytes, 0);
    }

    /// Sessions that fill the endpoint's shared budget leave every other one its own
    /// `OWN_REASSEMBLY` bytes (before, one session's held fragments could take it all).
    #[test]
    fn a_full_shared_budget_leaves_each_session_its_own_bytes() {
        let cfg = Config::default();
        let t = ricochet_testkit::SimClock::new().now();
        let (mut ev, mut n) = (VecDeque::new(), 0);
        let shared_limit = 64 << 10;
        let mut hog = Receiver::new(&cfg, Budget::new(shared_limit));
        // Reliable messages 1.. held behind the missing message 0, 1 KiB each.
        let mut id = 1;
        while hog
            .on_fragment(t, 0, id, 0, 1, &[0u8; 1024], &mut ev, &mut n)
            .is_ok()
        {
            id += 1;
        }
        assert!(hog.budget.used > shared_limit - 2048, "{}", hog.budget.used);
        assert_eq!(hog.bytes, OWN_REASSEMBLY + hog.budget.used);
        // Another session, handed the shared budget as the endpoint does.
        let mut other = Receiver::new(&cfg, Budget::unlimited());
        std::mem::swap(&mut other.budget, &mut hog.budget);
        for id in 1..=8 {
            other
                .on_fragment(t, 0, id, 0, 1, &[0u8; 1024], &mut ev, &mut n)
                .expect("room of its own");
        }
        assert_eq!(
            other.on_fragment(t, 0, 40, 0, 1, &[0u8; OWN_REASSEMBLY], &mut ev, &mut n),
            Err(DropCause::FlowControl),
            "beyond its own bytes, the shared budget decides"
        );
        // Delivering releases what was held; the refused message keeps only its entry.
        other
            .on_fragment(t, 0, 0, 0, 1, b"m", &mut ev, &mut n)
            .unwrap();
        assert_eq!(other.bytes, SLOT_COST);
    }

    /// The held ids of channel `ci`, oldest arrival first; checks the arrival list matches the
    /// pending map.
    fn held(r: &Receiver, ci: usize) -> Vec<u64> {
        let ch = &r.channels[ci];
        let ids: Vec<u64> = ch
            .state
            .arrivals()
            .map_or(Vec::new(), |a| a.iter().map(|&(_, id)| id).collect());
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, ch.pending.keys().copied().collect::<Vec<_>>());
        ids
    }

    /// A peer sending first fragments with descending ids (each a fresh partial message) on
    /// the unreliable channels holds at most `MAX_UNRELIABLE_PARTIALS` per channel, whatever
    /// its byte budget: expiry and the next-expiry query stay proportional to what expires.
    #[test]
    fn unreliable_partials_are_capped_per_channel_and_expire_from_the_front() {
        let mut r = rx(64 << 20);
        let (mut ev, mut n) = (VecDeque::new(), 0);
        let t = ricochet_testkit::SimClock::new().now();
        let d = Duration::from_millis(500);
        const SENT: u64 = 10_000;
        for ci in [2u8, 3] {
            for k in 0..SENT {
                let at = t + Duration::from_micros(k);
                r.on_fragment(at, ci, SENT - k, 0, 2, b"x", &mut ev, &mut n)
                    .unwrap();
                assert!(r.channels[usize::from(ci)].pending.len() <= MAX_UNRELIABLE_PARTIALS);
            }
            // The newest arrivals stayed (the lowest ids), the older ones were dropped.
            let expect: Vec<u64> = (1..=MAX_UNRELIABLE_PARTIALS as u64).rev().collect();
            assert_eq!(held(&r, usize::from(ci)), expect);
        }
        assert!(ev.is_empty());
        let per = SLOT_COST * 2 + 1;
        assert_eq!(r.bytes, 2 * MAX_UNRELIABLE_PARTIALS * per);
        assert_eq!(
            r.unreliable_dropped,
            2 * (SENT - MAX_UNRELIABLE_PARTIALS as u64)
        );
        // The next expiry is the oldest held message's (both channels saw it at once).
        let oldest = t + Duration::from_micros(SENT - MAX_UNRELIABLE_PARTIALS as u64);
        assert_eq!(r.next_expiry(d), Some(oldest + d));
        // Expiring then drops exactly that one per channel.
        r.expire(oldest + d, d);
        for ci in [2, 3] {
            assert_eq!(held(&r, ci).len(), MAX_UNRELIABLE_PARTIALS - 1);
            assert_eq!(held(&r, ci)[0], MAX_UNRELIABLE_PARTIALS as u64 - 1);
        }
        assert_eq!(
            r.next_expiry(d),
            Some(oldest + Duration::from_micros(1) + d)
        );
        r.expire(t + Duration::from_secs(10), d);
        assert_eq!((held(&r, 2).len(), held(&r, 3).len()), (0, 0));
        assert_eq!((r.bytes, r.next_expiry(d)), (0, None));
        assert_eq!(r.unreliable_dropped, 2 * SENT);
    }

    /// When an unreliable channel is full, the message seen first gives way (not the lowest
    /// id), and one that completes or goes stale leaves the arrival list too.
    #[test]
    fn a_full_unreliable_channel_drops_its_oldest_partial() {
        let mut r = rx(1 << 20);
        let (mut ev, mut n) = (VecDeque::new(), 0);
        let t = ricochet_testkit::SimClock::new().now();
        let d = Duration::from_millis(500);
        // Arrival order 500, 1, 2, ...: the highest id is the oldest.
        r.on_fragment(t, 2, 500, 0, 2, b"a", &mut ev, &mut n)
            .unwrap();
        for id in 1..MAX_UNRELIABLE_PARTIALS as u64 {
            let at = t + Duration::from_millis(id);
            r.on_fragment(at, 2, id, 0, 2, b"b", &mut ev, &mut n)
                .unwrap();
        }
        assert_eq!(held(&r, 2).len(), MAX_UNRELIABLE_PARTIALS);
        // Message 1 completes: delivered, and out of the list.
        r.on_fragment(t, 2, 1, 1, 2, b"c", &mut ev, &mut n).unwrap();
        assert_eq!(
            ev.drain(..).collect::<Vec<_>>(),
            vec![Event::Message {
                channel: 2,
                data: Bytes::from_static(b"bc")
            }]
        );
        assert!(!held(&r, 2).contains(&1));
        // Two newcomers: the first takes the free place, the second evicts 500.
        let later = t + Duration::from_secs(1);
        r.on_fragment(later, 2, 1000, 0, 2, b"d", &mut ev, &mut n)
            .unwrap();
        assert!(held(&r, 2).contains(&500));
        assert_eq!(r.unreliable_dropped, 0);
        r.on_fragment(later, 2, 1001, 0, 2, b"e", &mut ev, &mut n)
            .unwrap();
        let ids = held(&r, 2);
        assert_eq!(ids.len(), MAX_UNRELIABLE_PARTIALS);
        assert!(!ids.contains(&500) && ids.contains(&2) && ids.ends_with(&[1000, 1001]));
        assert_eq!(r.unreliable_dropped, 1);
        // A clock that steps back keeps the list sorted: the newcomer expires with the newest.
        r.on_fragment(t, 2, 3000, 0, 2, b"f", &mut ev, &mut n)
            .unwrap();
        assert_eq!(held(&r, 2).last(), Some(&3000));
        // Sequenced: a partial below the delivered id goes stale and leaves the list.
        r.on_fragment(t, 3, 4, 0, 2, b"g", &mut ev, &mut n).unwrap();
        r.on_fragment(t, 3, 9, 0, 1, b"h", &mut ev, &mut n).unwrap();
        assert!(held(&r, 3).is_empty());
        r.expire(later + d, d);
        assert!(held(&r, 2).is_empty());
        assert_eq!(r.bytes, 0);
    }

    /// A fragment of a message cut in several is never empty (the sender cuts
    /// `ceil(len / payload)` fragments); an empty whole message is fine.
    #[test]
    fn an_empty_fragment_of_a_cut_message_is_a_violation() {
        let mut r = rx(1 << 20);
        let (mut ev, mut n) = (VecDeque::new(), 0);
        let t = ricochet_testkit::SimClock::new().now();
        for ci in 0..4 {
            assert_eq!(
                r.on_fragment(t, ci, 0, 0, 2, b"", &mut ev, &mut n),
                Err(DropCause::ProtocolViolation)
            );
            assert_eq!(r.validate(ci, 2, 0), Err(DropCause::ProtocolViolation));
        }
        assert_eq!(r.bytes, 0);
        r.on_fragment(t, 2, 0, 0, 1, b"", &mut ev, &mut n).unwrap();
        assert_eq!(
            ev.pop_front(),
            Some(Event::Message {
                channel: 2,
                data: Bytes::new()
            })
        );
    }

    /// A message whose fragments add up to more than `max_message_size` is refused at the
    /// fragment that passes it (the bytes held are kept in the partial's cost, not summed).
    #[test]
    fn fragments_past_the_message_size_are_a_violation() {
        let cfg = Config {
            max_message_size: 2500,
            ..Config::default()
        };
        let mut r = Receiver::new(&cfg, Budget::unlimited());
        let (mut ev, mut n) = (VecDeque::new(), 0);
        let t = ricochet_testkit::SimClock::new().now();
        for index in 0..2 {
            r.on_fragment(t, 0, 0, index, 3, &[1u8; 1000], &mut ev, &mut n)
                .unwrap();
        }
        assert_eq!(
            r.on_fragment(t, 0, 0, 2, 3, &[1u8; 1000], &mut ev, &mut n),
            Err(DropCause::ProtocolViolation)
        );
        r.on_fragment(t, 0, 0, 2, 3, &[1u8; 500], &mut ev, &mut n)
            .unwrap();
        assert_eq!(
            ev.pop_front(),
            Some(Event::Message {
                channel: 0,
                data: Bytes::from([[1u8; 1000].as_slice(), &[1u8; 1000], &[1u8; 500]].concat())
            })
        );
    }

    #[test]
    fn caps_refuse_without_losing_accounting() {
        let mut r = rx(100);
        let (mut ev, mut n) = (VecDeque::new(), 0);
        let t = ricochet_testkit::SimClock::new().now();
        assert_eq!(
            r.on_fragment(t, 2, 0, 0, 2, &[0u8; 200], &mut ev, &mut n),
            Err(DropCause::FlowControl)
        );
        assert!(r.bytes <= 100);
        assert!(!r.fits(&r.need(0, 7, 0, 2, 200), 0));
    }

    /// Small messages are cut from the arena one after another; once every message of a
    /// chunk was dropped the chunk is reused, not reallocated; a kept message keeps its chunk
    /// and its bytes; large messages and calls without an arena get their own allocation.
    #[test]
    fn small_messages_share_the_arena_and_a_dropped_chunk_is_reused() {
        let mut arena = BytesMut::new();
        let a = message_bytes(&[0; 32], Some(&mut arena));
        let b = message_bytes(&[1; 32], Some(&mut arena));
        let chunk = a.as_ptr();
        assert_eq!(b.as_ptr(), chunk.wrapping_add(32));
        drop((a, b));
        for i in 2..ARENA_CHUNK / 32 {
            drop(message_bytes(&[i as u8; 32], Some(&mut arena)));
        }
        // The chunk is full and every message from it dropped: the next one reuses it.
        let kept = message_bytes(b"kept", Some(&mut arena));
        assert_eq!(kept.as_ptr(), chunk);
        for i in 0..ARENA_CHUNK / 32 {
            drop(message_bytes(&[i as u8; 32], Some(&mut arena)));
        }
        // `kept` holds the first chunk: the arena moved on to another, `kept` is intact.
        let next = message_bytes(&[5; 32], Some(&mut arena));
        assert_ne!(next.as_ptr(), chunk);
        assert_eq!(&kept[..], b"kept");
        assert_eq!(&next[..], &[5; 32][..]);
        let big = message_bytes(&[1; ARENA_MAX_MESSAGE + 1], Some(&mut arena));
        assert_eq!(big.len(), ARENA_MAX_MESSAGE + 1);
        assert_eq!(&message_bytes(b"x", None)[..], b"x");
    }
}
