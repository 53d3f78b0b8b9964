//! A hierarchical timer wheel, advanced incrementally by the worker loop.
//!
//! Three levels of 64 slots each over a configurable tick (1 ms by default): level 0 covers 64
//! ticks, level 1 4,096 ticks, level 2 262,144 ticks (about 4.4 minutes at 1 ms); later deadlines
//! wait in an overflow list and are cascaded down as time approaches them. Inserting, cancelling
//! and firing are O(1) amortised; finding the next deadline uses per-level occupancy bitmaps.
//!
//! Internal to the runtime (the worker's tick runs on it); `is_empty`, `tick` and `cancel` are
//! compiled for its tests only until a timer of the worker needs them.
//!
//! Time is an argument: the wheel never reads the clock, so a simulated clock drives it exactly.
//! Timers fire in deadline order (ties in insertion order), never before their deadline, and at
//! most one tick late relative to the `now` passed to [`TimerWheel::advance`].

use std::time::{Duration, Instant};

const SLOTS: usize = 64;
const LEVELS: usize = 3;
const SLOT_BITS: u32 = 6;

/// Identifies a scheduled timer so it can be cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerId {
    index: u32,
    generation: u32,
}

#[derive(Debug)]
struct Entry<T> {
    deadline: Instant,
    tick: u64,
    seq: u64,
    generation: u32,
    value: Option<T>,
}

/// A hierarchical timer wheel holding values of type `T`.
#[derive(Debug)]
pub struct TimerWheel<T> {
    origin: Instant,
    tick: Duration,
    /// The tick up to which (exclusive) every slot has been processed.
    current: u64,
    slots: [[Vec<u32>; SLOTS]; LEVELS],
    occupied: [u64; LEVELS],
    overflow: Vec<u32>,
    entries: Vec<Entry<T>>,
    free: Vec<u32>,
    seq: u64,
    len: usize,
    due: Vec<u32>,
}

impl<T> TimerWheel<T> {
    /// A wheel whose tick 0 starts at `origin`, with the given tick length (at least 1 µs).
    pub fn new(origin: Instant, tick: Duration) -> Self {
        TimerWheel {
            origin,
            tick: tick.max(Duration::from_micros(1)),
            current: 0,
            slots: std::array::from_fn(|_| std::array::from_fn(|_| Vec::new())),
            occupied: [0; LEVELS],
            overflow: Vec::new(),
            entries: Vec::new(),
            free: Vec::new(),
            seq: 0,
            len: 0,
            due: Vec::new(),
        }
    }

    #[cfg(test)]
    /// True when no timer is scheduled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[cfg(test)]
    /// The tick length.
    pub fn tick(&self) -> Duration {
        self.tick
    }

    fn tick_of(&self, t: Instant) -> u64 {
        let since = t.saturating_duration_since(self.origin);
        (since.as_nanos() / self.tick.as_nanos()) as u64
    }

    fn tick_start(&self, tick: u64) -> Instant {
        let nanos = (tick as u128).saturating_mul(self.tick.as_nanos());
        self.origin + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Schedule `value` to fire at `deadline` (a deadline in the past fires on the next advance).
    pub fn insert(&mut self, deadline: Instant, value: T) -> TimerId {
        // A deadline fires once the tick containing it has fully passed, so never early.
        let tick = self.tick_of(deadline).max(self.current);
        let seq = self.seq;
        self.seq += 1;
        let index = match self.free.pop() {
            Some(i) => {
                let e = &mut self.entries[i as usize];
                e.deadline = deadline;
                e.tick = tick;
                e.seq = seq;
                e.value = Some(value);
                i
            }
            None => {
                self.entries.push(Entry {
                    deadline,
                    tick,
                    seq,
                    generation: 0,
                    value: Some(value),
                });
                (self.entries.len() - 1) as u32
            }
        };
        self.len += 1;
        self.place(index);
        TimerId {
            index,
            generation: self.entries[index as usize].generation,
        }
    }

    /// Put entry `index` in the slot its tick belongs to, relative to `current`.
    fn place(&mut self, index: u32) {
        let tick = self.entries[index as usize].tick;
        let delta = tick.saturating_sub(self.current);
        for level in 0..LEVELS {
            let span = 1u64 << (SLOT_BITS * (level as u32 + 1));
            if delta < span {
                let slot = ((tick >> (SLOT_BITS * level as u32)) as usize) & (SLOTS - 1);
                self.slots[level][slot].push(index);
                self.occupied[level] |= 1 << slot;
                return;
            }
        }
        self.overflow.push(index);
    }

    #[cfg(test)]
    /// Cancel a timer; returns its value if it had not fired or been cancelled yet.
    pub fn cancel(&mut self, id: TimerId) -> Option<T> {
        let e = self.entries.get_mut(id.index as usize)?;
        if e.generation != id.generation {
            return None;
        }
        let value = e.value.take()?;
        // The slot keeps a stale index; it is skipped and recycled when its slot is processed.
        self.len -= 1;
        Some(value)
    }

    /// The earliest instant at which [`advance`](Self::advance) may fire something: exact for
    /// level 0, the start of the earliest occupied slot otherwise (a safe lower bound).
    pub fn next_deadline(&self) -> Option<Instant> {
        if self.len == 0 {
            return None;
        }
        for level in 0..LEVELS {
            if self.occupied[level] == 0 {
                continue;
            }
            let shift = SLOT_BITS * level as u32;
            let cur_slot = ((self.current >> shift) as usize) & (SLOTS - 1);
            // Level 0 holds ticks current..current+63, starting at the current slot; a higher
            // level holds blocks 1..=64 ahead of the current block, starting one slot on.
            let first = if level == 0 { 0 } else { 1 };
            let rotated =
                self.occupied[level].rotate_right(((cur_slot + first) & (SLOTS - 1)) as u32);
            let offset = rotated.trailing_zeros() as u64 + first as u64;
            let base = (self.current >> shift) << shift;
            let tick = base + (offset << shift);
            let tick = tick.max(self.current);
            if level == 0 {
                // Exact: the earliest live deadline in that slot.
                let slot = (cur_slot + offset as usize) & (SLOTS - 1);
                debug_assert_eq!(first, 0);
                let earliest = self.slots[0][slot]
                    .iter()
                    .filter_map(|&i| {
                        let e = &self.entries[i as usize];
                        e.value.as_ref().map(|_| e.deadline)
                    })
                    .min();
                if let Some(d) = earliest {
                    return Some(d.max(self.tick_start(tick)));
                }
            }
            return Some(self.tick_start(tick));
        }
        // Only overflow entries remain: the earliest of them.
        self.overflow
            .iter()
            .filter_map(|&i| {
                let e = &self.entries[i as usize];
                e.value.as_ref().map(|_| e.deadline)
            })
            .min()
    }

    /// Advance to `now`, calling `fire` for every timer whose deadline is at or before `now`,
    /// in deadline order (ties in insertion order).
    pub fn advance(&mut self, now: Instant, mut fire: impl FnMut(T)) {
        let target = self.tick_of(now);
        while self.current <= target && self.len > 0 {
            // Skip empty stretches of level 0 quickly.
            if self.occupied[0] == 0 && self.current & (SLOTS as u64 - 1) != 0 {
                let next_boundary = (self.current | (SLOTS as u64 - 1)) + 1;
                if next_boundary > target {
                    self.current = target;
                } else {
                    self.current = next_boundary;
                    continue;
                }
            }
            if self.current & (SLOTS as u64 - 1) == 0 {
                self.cascade();
            }
            let slot = (self.current as usize) & (SLOTS - 1);
            if self.occupied[0] & (1 << slot) != 0 {
                self.occupied[0] &= !(1 << slot);
                let mut bucket = std::mem::take(&mut self.slots[0][slot]);
                bucket.retain(|&i| {
                    self.entries[i as usize].value.is_some() || {
                        self.recycle(i);
                        false
                    }
                });
                let mut later = Vec::new();
                for &i in &bucket {
                    let e = &self.entries[i as usize];
                    if e.deadline <= now {
                        self.due.push(i);
                    } else {
                        later.push(i);
                    }
                }
                bucket.clear();
                if !later.is_empty() {
                    // Deadlines inside this tick but after `now`: keep them in this slot.
                    bucket.extend_from_slice(&later);
                    self.occupied[0] |= 1 << slot;
                }
                self.slots[0][slot] = bucket;
                if !self.due.is_empty() {
                    let entries = &self.entries;
                    self.due.sort_by_key(|&i| {
                        let e = &entries[i as usize];
                        (e.deadline, e.seq)
                    });
                    let due = std::mem::take(&mut self.due);
                    for &i in &due {
                        if let Some(v) = self.entries[i as usize].value.take() {
                            self.len -= 1;
                            self.recycle(i);
                            fire(v);
                        }
                    }
                    self.due = due;
                    self.due.clear();
                }
                if !later.is_empty() {
                    // The rest of this tick lies in the future: stop here.
                    return;
                }
            }
            if self.current == target {
                // The current tick may still receive deadlines <= a later `now`; stay on it.
                return;
            }
            self.current += 1;
        }
        if self.len == 0 {
            self.current = self.current.max(target);
        }
    }

    fn recycle(&mut self, index: u32) {
        let e = &mut self.entries[index as usize];
        e.generation = e.generation.wrapping_add(1);
        self.free.push(index);
    }

    /// At a level-0 boundary, move the due slot of each higher level (and the overflow list)
    /// down to where it now belongs.
    fn cascade(&mut self) {
        for level in 1..LEVELS {
            let shift = SLOT_BITS * level as u32;
            let slot = ((self.current >> shift) as usize) & (SLOTS - 1);
            if self.occupied[level] & (1 << slot) != 0 {
                self.occupied[level] &= !(1 << slot);
                let bucket = std::mem::take(&mut self.slots[level][slot]);
                for &i in &bucket {
                    if self.entries[i as usize].value.is_some() {
                        self.place(i);
                    } else {
                        self.recycle(i);
                    }
                }
                let mut bucket = bucket;
                bucket.clear();
                if self.slots[level][slot].is_empty() {
                    self.slots[level][slot] = bucket;
                }
            }
            // Only cascade a higher level when this level wrapped around.
            if slot != 0 {
                return;
            }
        }
        if !self.overflow.is_empty() {
            let pending = std::mem::take(&mut self.overflow);
            for &i in &pending {
                if self.entries[i as usize].value.is_some() {
                    self.place(i);
                } else {
                    self.recycle(i);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn fires_in_deadline_order_never_early() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0, ms(1));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut expected = Vec::new();
        for i in 0..5_000u64 {
            // Spread over all levels and the overflow list (up to ~10 minutes).
            let d = match i % 4 {
                0 => Duration::from_micros(rng.random_range(0..64_000)),
                1 => ms(rng.random_range(0..4_096)),
                2 => ms(rng.random_range(0..262_144)),
                _ => ms(rng.random_range(0..600_000)),
            };
            w.insert(t0 + d, (t0 + d, i));
            expected.push((t0 + d, i));
        }
        expected.sort();
        let mut fired = Vec::new();
        let mut now = t0;
        // Advance in uneven simulated steps.
        while fired.len() < expected.len() {
            now += Duration::from_micros(rng.random_range(1..5_000_000));
            w.advance(now, |v: (Instant, u64)| {
                assert!(v.0 <= now, "fired early");
                fired.push(v);
            });
            // Nothing due may remain.
            if let Some(next) = w.next_deadline() {
                assert!(next > now - w.tick(), "next deadline {next:?} behind now");
            }
        }
        assert_eq!(fired, expected);
        assert!(w.is_empty());
    }

    #[test]
    fn cancel_and_reuse() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0, ms(1));
        let a = w.insert(t0 + ms(5), "a");
        let b = w.insert(t0 + ms(5), "b");
        assert_eq!(w.cancel(a), Some("a"));
        assert_eq!(w.cancel(a), None);
        let c = w.insert(t0 + ms(3), "c");
        let mut out = Vec::new();
        w.advance(t0 + ms(10), |v| out.push(v));
        assert_eq!(out, vec!["c", "b"]);
        assert_eq!(w.cancel(b), None);
        assert_eq!(w.cancel(c), None);
        assert!(w.is_empty());
        assert_eq!(w.next_deadline(), None);
    }

    #[test]
    fn sub_tick_deadlines_wait_for_now() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0, ms(1));
        w.insert(t0 + Duration::from_micros(700), 1);
        w.insert(t0 + Duration::from_micros(300), 0);
        let mut out = Vec::new();
        w.advance(t0 + Duration::from_micros(500), |v| out.push(v));
        assert_eq!(out, vec![0]);
        assert_eq!(w.next_deadline(), Some(t0 + Duration::from_micros(700)));
        w.advance(t0 + Duration::from_micros(800), |v| out.push(v));
        assert_eq!(out, vec![0, 1]);
    }

    #[test]
    fn next_deadline_is_a_lower_bound() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0, ms(1));
        w.insert(t0 + ms(5_000), ());
        let next = w.next_deadline().unwrap();
        assert!(next <= t0 + ms(5_000));
        let mut fired = 0;
        // Following next_deadline() step by step reaches the timer without skipping it.
        let mut now = t0;
        while fired == 0 {
            now = w.next_deadline().unwrap().max(now);
            w.advance(now, |_| fired += 1);
            if fired == 0 {
                now += Duration::from_micros(1);
            }
        }
        assert!(now >= t0 + ms(5_000));
    }
}
