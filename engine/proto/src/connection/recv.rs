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
    /// arrival list). With nothing held there is none (a partial message holds its cost
    /// until it leaves its arrival list), and the channels are not looked at: the connection's
    /// timer asks at every refresh.
    pub(crate) fn next_expiry(&self, timeout: Duration) -> Option<Instant> {
        if self.bytes == 0 {
            debug_assert!(self
                .channels
                .iter()
                .all(|c| c.state.arrivals().is_none_or(Vec::is_empty)));
            return None;
        }
        self.channels
            .iter()
            .filter_map(|c| c.state.arrivals()?.first())
            .filter_map(|&(first_seen, _)| first_seen.checked_add(timeout))
            .min()
    }
}

#[cfg(test)]
mod tests;
