//! A timer queue with at most one deadline per slot, earliest first: the endpoint keeps its
//! connections' deadlines in one, and a driver of many endpoints (such as `ricochet`'s
//! `ClientSet`) can keep theirs in another.
//!
//! An indexed binary heap: each slot's entry knows where it sits, so moving a deadline sifts
//! that entry in place. A connection re-arms its deadline several times per packet (ACK delay,
//! loss detection, keepalive); a plain heap with lazy deletion would keep one stale entry per
//! change and pop each of them later, so its size and cost would follow the packet rate, not
//! the number of connections.

use std::time::Instant;

/// Marks a slot without an entry in `pos`.
const ABSENT: u32 = u32::MAX;

/// Deadlines keyed by slot (a small dense index, such as a connection's or a member's), at
/// most one per slot, ordered by `(deadline, slot)`: ties come out in slot order, so a
/// simulation is deterministic. Setting, moving or clearing a deadline costs `O(log n)` in the
/// number of slots with a deadline. Memory is one entry per such slot plus four bytes per slot
/// index up to the highest ever set (until [`TimerQueue::shrink`] finds most of them unused).
///
/// The endpoint keeps its connections' deadlines in one. A driver of many endpoints on one
/// thread keeps their [`Endpoint::poll_timeout`](crate::Endpoint::poll_timeout)s in another,
/// keyed by its own index of each endpoint (`ricochet`'s `ClientSet` does, for its members),
/// so that a turn runs only the endpoints whose deadline is due.
#[derive(Debug, Default)]
pub struct TimerQueue {
    heap: Vec<(Instant, u32)>,
    /// Heap position of each slot's entry, or [`ABSENT`].
    pos: Vec<u32>,
}

impl TimerQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// The earliest deadline.
    pub fn peek(&self) -> Option<Instant> {
        self.heap.first().map(|&(t, _)| t)
    }

    /// The deadline of `slot`, if it has one.
    pub fn deadline(&self, slot: u32) -> Option<Instant> {
        let p = *self.pos.get(slot as usize)?;
        self.heap.get(p as usize).map(|&(t, _)| t)
    }

    /// Sets (or with `None` clears) the deadline of `slot`.
    ///
    /// # Panics
    /// If `slot` is `u32::MAX` (the queue's marker for "no entry").
    pub fn set(&mut self, slot: u32, at: Option<Instant>) {
        assert!(slot != ABSENT, "TimerQueue slot u32::MAX is reserved");
        let s = slot as usize;
        if self.pos.len() <= s {
            if at.is_none() {
                return;
            }
            self.pos.resize(s + 1, ABSENT);
        }
        let p = self.pos[s];
        match (p, at) {
            (ABSENT, None) => {}
            (ABSENT, Some(t)) => {
                let i = self.heap.len();
                self.heap.push((t, slot));
                self.pos[s] = i as u32;
                self.sift_up(i);
            }
            (p, Some(t)) => {
                let i = p as usize;
                let old = self.heap[i].0;
                if t == old {
                    return;
                }
                self.heap[i].0 = t;
                if t < old {
                    self.sift_up(i);
                } else {
                    self.sift_down(i);
                }
            }
            (p, None) => self.remove_at(p as usize),
        }
    }

    /// The slots of the earliest entry and the next earliest, those due at `now` (what the
    /// next two `pop_due` calls return if nothing changes between them).
    pub fn due_ahead(&self, now: Instant) -> (Option<u32>, Option<u32>) {
        let due = |e: Option<&(Instant, u32)>| e.filter(|e| e.0 <= now).map(|e| e.1);
        let second = match (self.heap.get(1), self.heap.get(2)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, _) => a,
        };
        (due(self.heap.first()), due(second))
    }

    /// Removes and returns the earliest entry if it is due at `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<(Instant, u32)> {
        let &(t, slot) = self.heap.first()?;
        if t > now {
            return None;
        }
        self.remove_at(0);
        Some((t, slot))
    }

    /// How many slots have a deadline.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no slot has a deadline.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Gives back capacity once the queue holds far fewer entries than it once did (call it
    /// now and then, for instance after running the due timers).
    pub fn shrink(&mut self) {
        if self.heap.capacity() > 64 && self.heap.len() < self.heap.capacity() / 4 {
            self.heap.shrink_to(self.heap.len() * 2);
        }
        // Slots above the highest one with a deadline need no position. The scan walks back
        // over those trailing unused positions only, and drops them, so a later call does not
        // walk them again.
        let keep = self
            .pos
            .iter()
            .rposition(|&p| p != ABSENT)
            .map_or(0, |i| i + 1);
        self.pos.truncate(keep);
        if self.pos.capacity() > 64 && keep < self.pos.capacity() / 4 {
            self.pos.shrink_to(keep * 2);
        }
    }

    fn remove_at(&mut self, i: usize) {
        let (_, slot) = self.heap.swap_remove(i);
        self.pos[slot as usize] = ABSENT;
        if i < self.heap.len() {
            let moved = self.heap[i].1;
            self.pos[moved as usize] = i as u32;
            // The entry moved up from the bottom may belong above or below `i`.
            self.sift_up(i);
            if self.pos[moved as usize] as usize == i {
                self.sift_down(i);
            }
        }
    }

    /// Moves the entry at `i` up to its place. The entry is held aside and the parents it
    /// passes move down one level each (one write per level, not a swap).
    fn sift_up(&mut self, mut i: usize) {
        let entry = self.heap[i];
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.heap[parent] <= entry {
                break;
            }
            self.put(i, self.heap[parent]);
            i = parent;
        }
        self.put(i, entry);
    }

    /// Moves the entry at `i` down to its place. An entry sifted down mostly belongs near the
    /// bottom (a deadline moved later, often past every other; the last entry moved to the
    /// top by a pop), so it goes the whole way down the path of smaller children first, each
    /// moving up one level (one comparison per level, where stopping at its place takes two),
    /// and then back up that path to its place, usually at once. (Floyd's variant: the same
    /// place as the usual sift, the keys being distinct.)
    fn sift_down(&mut self, start: usize) {
        let n = self.heap.len();
        let entry = self.heap[start];
        let mut i = start;
        loop {
            let left = 2 * i + 1;
            if left >= n {
                break;
            }
            let right = left + 1;
            let child = if right < n && self.heap[right] < self.heap[left] {
                right
            } else {
                left
            };
            self.put(i, self.heap[child]);
            i = child;
        }
        while i > start {
            let parent = (i - 1) / 2;
            if self.heap[parent] < entry {
                break;
            }
            self.put(i, self.heap[parent]);
            i = parent;
        }
        self.put(i, entry);
    }

    /// Writes `entry` at heap position `i` and records the position.
    fn put(&mut self, i: usize, entry: (Instant, u32)) {
        self.heap[i] = entry;
        self.pos[entry.1 as usize] = i as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeSet;
    use std::time::Duration;

    /// Random sets, clears and pops against an ordered set of `(deadline, slot)`.
    #[test]
    fn matches_an_ordered_set_under_random_operations() {
        let base = Instant::now();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut q = TimerQueue::default();
        let mut model: BTreeSet<(Instant, u32)> = BTreeSet::new();
        let mut of_slot: Vec<Option<Instant>> = vec![None; 200];
        for step in 0..50_000u32 {
            let slot = rng.random_range(0..200u32);
            match rng.random_range(0..10) {
                0..=5 => {
                    let t = base + Duration::from_micros(rng.random_range(0..1_000));
                    if let Some(old) = of_slot[slot as usize].replace(t) {
                        model.remove(&(old, slot));
                    }
                    model.insert((t, slot));
                    q.set(slot, Some(t));
                }
                6..=7 => {
                    if let Some(old) = of_slot[slot as usize].take() {
                        model.remove(&(old, slot));
                    }
                    q.set(slot, None);
                }
                _ => {
                    let now = base + Duration::from_micros(rng.random_range(0..1_000));
                    let want = model.first().copied().filter(|&(t, _)| t <= now);
                    let got = q.pop_due(now);
                    assert_eq!(got, want, "step {step}");
                    if let Some((t, s)) = want {
                        model.remove(&(t, s));
                        of_slot[s as usize] = None;
                    }
                }
            }
            assert_eq!(q.peek(), model.first().map(|&(t, _)| t), "step {step}");
            assert_eq!(q.len(), model.len(), "step {step}");
            assert_eq!(q.deadline(slot), of_slot[slot as usize], "step {step}");
            if step % 1000 == 0 {
                q.shrink();
                for (s, t) in of_slot.iter().enumerate() {
                    assert_eq!(q.deadline(s as u32), *t, "step {step}, slot {s}");
                }
            }
        }
    }

    /// Moving one slot's deadline many times keeps one entry, not one per move.
    #[test]
    fn rearming_a_slot_keeps_a_single_entry() {
        let base = Instant::now();
        let mut q = TimerQueue::default();
        for i in 0..10_000u64 {
            q.set(3, Some(base + Duration::from_micros(10_000 - i)));
            q.set(5, Some(base + Duration::from_micros(i)));
        }
        assert_eq!(q.len(), 2);
        assert_eq!(
            q.pop_due(base + Duration::from_secs(1)),
            Some((base + Duration::from_micros(1), 3))
        );
        assert_eq!(q.deadline(5), Some(base + Duration::from_micros(9_999)));
        q.set(5, None);
        assert_eq!(q.peek(), None);
    }

    /// After most high slots are cleared, `shrink` gives their positions back; the low slots
    /// keep their deadlines, and high slots can be set again.
    #[test]
    fn shrink_gives_back_positions_of_unused_high_slots() {
        let base = Instant::now();
        let mut q = TimerQueue::new();
        for s in 0..1000u32 {
            q.set(s, Some(base + Duration::from_micros(u64::from(1000 - s))));
        }
        for s in 3..1000u32 {
            q.set(s, None);
        }
        let before = q.pos.capacity();
        q.shrink();
        assert!(
            q.pos.capacity() < before / 4,
            "{} of {before}",
            q.pos.capacity()
        );
        assert!(q.heap.capacity() < 1000);
        q.set(900, Some(base));
        let order: Vec<u32> = std::iter::from_fn(|| q.pop_due(base + Duration::from_secs(1)))
            .map(|(_, s)| s)
            .collect();
        assert_eq!(order, vec![900, 2, 1, 0]);
        assert!(q.is_empty());
    }

    /// Unused positions above the highest slot in use are dropped even when the capacity
    /// stays (so the next shrink does not walk them again), and that slot keeps its deadline.
    #[test]
    fn shrink_drops_trailing_unused_positions() {
        let base = Instant::now();
        let mut q = TimerQueue::new();
        for s in 0..100u32 {
            q.set(s, Some(base + Duration::from_micros(u64::from(s))));
        }
        for s in 60..100u32 {
            q.set(s, None);
        }
        q.shrink();
        assert_eq!(q.pos.len(), 60);
        assert_eq!(q.deadline(59), Some(base + Duration::from_micros(59)));
        assert_eq!(q.deadline(99), None);
        q.set(99, Some(base));
        assert_eq!(q.pop_due(base), Some((base, 0)));
        assert_eq!(q.pop_due(base), Some((base, 99)));
    }
}
