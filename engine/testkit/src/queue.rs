//! [`ImpairedQueue`]: one impaired link direction together with the copies it holds.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Instant;

use super::impair::{ImpairedLink, LinkCounters, Verdict};

/// An item due at `at`; `seq` (assigned in push order) breaks ties, so equal times pop in the
/// order they were pushed. Orders in reverse, so `BinaryHeap` pops the earliest first.
#[derive(Debug)]
pub(crate) struct Timed<T> {
    pub(crate) at: Instant,
    pub(crate) seq: u64,
    pub(crate) item: T,
}

impl<T> PartialEq for Timed<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<T> Eq for Timed<T> {}
impl<T> PartialOrd for Timed<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Timed<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// One direction of a route as a relay needs it: the [`ImpairedLink`] decisions plus the held
/// copies in delivery order, with queue accounting done on pop.
///
/// On a real clock (`bench relay`, the benchmark's impairment relay): `push(Instant::now(),
/// len, payload)` when a datagram arrives, sleep until [`next_due`](Self::next_due), then send
/// everything [`pop_due`](Self::pop_due) returns. Memory is bounded by the impairment's queue caps.
#[derive(Debug)]
pub struct ImpairedQueue<T> {
    link: ImpairedLink,
    heap: BinaryHeap<Timed<(usize, T)>>,
    seq: u64,
}

impl<T: Clone> ImpairedQueue<T> {
    /// A queue deciding with `link`.
    pub fn new(link: ImpairedLink) -> Self {
        Self {
            link,
            heap: BinaryHeap::new(),
            seq: 0,
        }
    }

    /// Offers `item` (`len` bytes on the wire) at `now`; holds it (and a clone if duplicated)
    /// unless the verdict drops it.
    pub fn push(&mut self, now: Instant, len: usize, item: T) -> Verdict {
        let verdict = self.link.admit(now, len);
        if let Verdict::Deliver { at, duplicate } = verdict {
            // The original is held first: at equal times it pops first.
            let copy = duplicate.map(|dup_at| (dup_at, item.clone()));
            self.hold(at, len, item);
            if let Some((dup_at, copy)) = copy {
                self.hold(dup_at, len, copy);
            }
        }
        verdict
    }

    fn hold(&mut self, at: Instant, len: usize, item: T) {
        let seq = self.seq;
        self.seq += 1;
        self.heap.push(Timed {
            at,
            seq,
            item: (len, item),
        });
    }

    /// When the earliest held copy is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.heap.peek().map(|t| t.at)
    }

    /// Removes the earliest copy due at or before `now`, with its due time, and frees its
    /// queue space.
    pub fn pop_due(&mut self, now: Instant) -> Option<(Instant, T)> {
        if self.heap.peek()?.at > now {
            return None;
        }
        let t = self.heap.pop()?;
        let (len, item) = t.item;
        self.link.on_departed(len);
        Some((t.at, item))
    }

    /// Copies held.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no copy is held.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// The link (its impairment can be changed through it).
    pub fn link_mut(&mut self) -> &mut ImpairedLink {
        &mut self.link
    }

    /// The link's counters.
    pub fn counters(&self) -> &LinkCounters {
        self.link.counters()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Direction, Impairment, Profile};
    use std::time::Duration;

    #[test]
    fn holds_in_due_order_and_frees_queue_space_on_pop() {
        let link =
            ImpairedLink::new(Profile::Random.impairment(), 42, 1, Direction::Forward).unwrap();
        let mut q = ImpairedQueue::new(link);
        let t0 = Instant::now();
        let mut pushed = 0u64;
        for i in 0..2000u32 {
            let now = t0 + Duration::from_micros(100) * i;
            pushed += q.push(now, 64, i).delivery_times().count() as u64;
        }
        assert_eq!(q.len() as u64, pushed);
        assert_eq!(q.counters().queue_datagrams, pushed);
        let mut last = t0;
        let mut popped = 0;
        let end = t0 + Duration::from_secs(1);
        while let Some((at, _)) = q.pop_due(end) {
            assert!(at >= last);
            last = at;
            popped += 1;
        }
        assert_eq!(popped, pushed);
        assert!(q.is_empty() && q.next_due().is_none());
        let c = *q.counters();
        assert_eq!(
            (c.queue_datagrams, c.queue_bytes, c.departed),
            (0, 0, pushed)
        );
        assert!(c.delayed > 0 && c.duplicated > 0 && c.dropped_random > 0);
    }

    #[test]
    fn nothing_pops_before_it_is_due() {
        let imp = Impairment::none().with_delay(Duration::from_millis(10));
        let mut q = ImpairedQueue::new(ImpairedLink::new(imp, 1, 1, Direction::Backward).unwrap());
        let t0 = Instant::now();
        q.push(t0, 1, "a");
        q.push(t0, 1, "b");
        assert_eq!(q.next_due(), Some(t0 + Duration::from_millis(10)));
        assert_eq!(q.pop_due(t0 + Duration::from_millis(9)), None);
        let due = t0 + Duration::from_millis(10);
        assert_eq!(q.pop_due(due), Some((due, "a")));
        assert_eq!(q.pop_due(due), Some((due, "b")));
    }
}
