//! The path-MTU room: datagram packetization layer path MTU discovery (DPLPMTUD, RFC 8899).
//!
//! A connection starts at the base size ([`crate::Config::max_datagram_size`], safe on any
//! path the game supports) and, with [`crate::PathMtuConfig::enabled`], searches upward for the
//! largest datagram the path carries, up to [`crate::PathMtuConfig::max_datagram_size`]. A
//! probe is a packet padded to the size under test; it is acknowledged like any packet, but
//! congestion control and loss recovery never see it (it carries no data, so nothing is
//! retransmitted, and its loss says "too big", not "congested"). One probe is in flight at a
//! time; a size is given up after [`MAX_PROBES`] unanswered probes in a row.
//!
//! The search probes the ceiling first (on most paths it fits, and one round trip settles the
//! search), then bisects between the largest size acknowledged and the smallest one refused,
//! down to a byte. When it is done, it searches again after the raise interval (RFC 8899's
//! `PMTU_RAISE_TIMER`), in case the path grew.
//!
//! Black-hole detection (RFC 8899 §4.3): when [`BLACK_HOLE_LOSSES`] packets larger than the
//! base are declared lost in a row, with none of them acknowledged in between, the path no
//! longer carries the current size: the connection falls back to the base at once and searches
//! again below the size that failed.
//!
//! This room holds the search alone (a leaf: it knows nothing of the connection); the
//! connection sends the probes it asks for and reports what happens to them and to its large
//! packets (`mtu_probe`).

use std::time::{Duration, Instant};

/// Unanswered probes in a row after which a size is taken as too big (RFC 8899's
/// `MAX_PROBES`).
pub(crate) const MAX_PROBES: u8 = 3;

/// Packets larger than the base lost in a row, none acknowledged in between, that make the
/// current size a black hole. Random loss of a few percent makes such a run rare (5 % loss:
/// about one in 160,000 runs of four); a congestion episode can make one, and costs only a
/// new search.
pub(crate) const BLACK_HOLE_LOSSES: u32 = 4;

/// Where the search is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Discovery is off: the base size, always.
    Disabled,
    /// Probing between `lo` (known good) and `hi` (the largest not yet refused).
    Searching,
    /// Done; searching again at `raise_at`.
    Complete { raise_at: Instant },
}

/// A probe in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Probe {
    pn: u64,
    size: usize,
    sent: Instant,
    /// Taken as lost from then on.
    lost_at: Instant,
}

/// The path-MTU search of one connection (see the module docs).
#[derive(Debug)]
pub(crate) struct PathMtu {
    base: usize,
    ceiling: usize,
    raise_interval: Duration,
    phase: Phase,
    /// The size new packets are built to: the largest acknowledged so far.
    current: usize,
    /// The largest size acknowledged in this search.
    lo: usize,
    /// The largest size not yet refused in this search.
    hi: usize,
    probe: Option<Probe>,
    /// Probes of size `hi` lost in a row (the size under test when `hi` is probed, or the
    /// midpoint otherwise: see [`PathMtu::next_size`]).
    lost_probes: u8,
    /// Packets larger than the base lost in a row.
    large_lost: u32,
    /// Black holes found (fallbacks to the base).
    black_holes: u32,
    /// Probes sent.
    probes_sent: u64,
}

/// What the search reports to the connection about its current size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Same size as before.
    None,
    /// Larger packets may be built from now on.
    Grew,
    /// The path stopped carrying the current size: packets are built at the base again.
    Shrank,
}

impl PathMtu {
    /// A search from `base` up to `ceiling` (taken as `base` when smaller), or none when
    /// `enabled` is false.
    pub(crate) fn new(
        enabled: bool,
        base: usize,
        ceiling: usize,
        raise_interval: Duration,
    ) -> Self {
        let ceiling = ceiling.max(base);
        let on = enabled && ceiling > base;
        Self {
            base,
            ceiling,
            raise_interval,
            phase: if on {
                Phase::Searching
            } else {
                Phase::Disabled
            },
            current: base,
            lo: base,
            hi: ceiling,
            probe: None,
            lost_probes: 0,
            large_lost: 0,
            black_holes: 0,
            probes_sent: 0,
        }
    }

    /// The search a connection keeps, boxed, only while discovery is on and has room to search
    /// (`None` otherwise): a session with discovery off pays one pointer for it, and behaves as
    /// a disabled search would (base size, no probe, no timer).
    pub(crate) fn boxed(
        enabled: bool,
        base: usize,
        ceiling: usize,
        raise_interval: Duration,
    ) -> Option<Box<Self>> {
        (enabled && ceiling > base)
            .then(|| Box::new(Self::new(enabled, base, ceiling, raise_interval)))
    }

    /// The largest datagram new packets may take (UDP payload bytes).
    pub(crate) fn current(&self) -> usize {
        self.current
    }

    /// The largest size the search may reach.
    pub(crate) fn ceiling(&self) -> usize {
        self.ceiling
    }

    /// Black holes found so far.
    pub(crate) fn black_holes(&self) -> u32 {
        self.black_holes
    }

    /// Probes sent so far.
    pub(crate) fn probes_sent(&self) -> u64 {
        self.probes_sent
    }

    /// The packet number of the probe in flight and when it was sent, if any.
    pub(crate) fn probe_in_flight(&self) -> Option<(u64, Instant)> {
        self.probe.map(|p| (p.pn, p.sent))
    }

    /// The size to probe next: the ceiling of this search first, then the midpoint.
    fn next_size(&self) -> usize {
        if self.hi == self.ceiling && self.lo < self.hi && self.lost_probes < MAX_PROBES {
            // Probing `hi` itself until it is refused.
            self.hi
        } else {
            self.lo + (self.hi - self.lo).div_ceil(2)
        }
    }

    /// The size of the probe to send now, if one is due: searching, and no probe in flight.
    /// The search moves on by itself (a raise interval that ran out starts a new one).
    pub(crate) fn poll_probe(&mut self, now: Instant) -> Option<usize> {
        self.raise(now);
        if self.phase != Phase::Searching || self.probe.is_some() {
            return None;
        }
        if self.lo >= self.hi {
            self.phase = Phase::Complete {
                raise_at: now + self.raise_interval,
            };
            return None;
        }
        Some(self.next_size())
    }

    /// A probe of `size` bytes left as packet `pn`; it counts as lost if its ACK has not come
    /// by `now + timeout`.
    pub(crate) fn on_probe_sent(&mut self, pn: u64, size: usize, now: Instant, timeout: Duration) {
        self.probes_sent += 1;
        self.probe = Some(Probe {
            pn,
            size,
            sent: now,
            lost_at: now + timeout,
        });
    }

    /// The probe in flight was acknowledged: its size is the new current size.
    pub(crate) fn on_probe_acked(&mut self, now: Instant) -> Change {
        let Some(p) = self.probe.take() else {
            return Change::None;
        };
        self.lost_probes = 0;
        if self.phase != Phase::Searching {
            return Change::None;
        }
        self.lo = self.lo.max(p.size);
        self.hi = self.hi.max(self.lo);
        if self.lo >= self.hi {
            self.phase = Phase::Complete {
                raise_at: now + self.raise_interval,
            };
        }
        if p.size > self.current {
            self.current = p.size;
            self.large_lost = 0;
            Change::Grew
        } else {
            Change::None
        }
    }

    /// When [`PathMtu::handle_timeout`] or a probe is due: the probe in flight's loss, the raise
    /// timer; `None` when neither is armed. A probe ready to go is due at `ready` (the caller's
    /// "send now").
    pub(crate) fn poll_timeout(&self, ready: Instant) -> Option<Instant> {
        match (self.phase, self.probe) {
            (_, Some(p)) => Some(p.lost_at),
            (Phase::Complete { raise_at }, None) => Some(raise_at),
            (Phase::Searching, None) => Some(ready),
            (Phase::Disabled, None) => None,
        }
    }

    /// A search that completed starts again once the raise interval has run out, from what
    /// the path carries now up to the ceiling.
    fn raise(&mut self, now: Instant) {
        if let Phase::Complete { raise_at } = self.phase {
            if now >= raise_at {
                self.phase = Phase::Searching;
                self.lo = self.current;
                self.hi = self.ceiling;
                self.lost_probes = 0;
            }
        }
    }

    /// The probe in flight is lost if its time is up (the size it tried is refused after
    /// [`MAX_PROBES`] in a row); the raise timer starts a new search.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        self.raise(now);
        let Some(p) = self.probe else {
            return;
        };
        if now < p.lost_at {
            return;
        }
        self.probe = None;
        if self.phase != Phase::Searching || p.size <= self.lo {
            // Not a size under test (a probe at a size known to fit only times the path).
            return;
        }
        self.lost_probes += 1;
        if self.lost_probes >= MAX_PROBES {
            self.lost_probes = 0;
            self.hi = p.size.saturating_sub(1).max(self.lo);
        }
    }

    /// An ack-eliciting packet of `size` bytes was acknowledged.
    pub(crate) fn on_packet_acked(&mut self, size: usize) {
        if size > self.base {
            self.large_lost = 0;
        }
    }

    /// A packet of `size` bytes was declared lost. [`Change::Shrank`] when that makes the
    /// current size a black hole.
    pub(crate) fn on_packet_lost(&mut self, size: usize, now: Instant) -> Change {
        if self.phase == Phase::Disabled || size <= self.base || self.current <= self.base {
            return Change::None;
        }
        self.large_lost += 1;
        if self.large_lost < BLACK_HOLE_LOSSES {
            return Change::None;
        }
        self.black_holes += 1;
        self.large_lost = 0;
        // The size that failed and everything above it is out until the next raise.
        self.hi = self.current.saturating_sub(1).max(self.base);
        self.current = self.base;
        self.lo = self.base;
        self.lost_probes = 0;
        self.probe = None;
        self.phase = if self.lo < self.hi {
            Phase::Searching
        } else {
            Phase::Complete {
                raise_at: now + self.raise_interval,
            }
        };
        Change::Shrank
    }
}

impl PathMtu {
    /// Lowers the ceiling to `n` bytes (never below the base): the caller's buffers hold no
    /// more.
    pub(crate) fn cap(&mut self, n: usize) {
        self.ceiling = self.ceiling.min(n).max(self.base);
        self.hi = self.hi.min(self.ceiling);
        self.lo = self.lo.min(self.hi);
        self.current = self.current.min(self.ceiling);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RTT: Duration = Duration::from_millis(10);
    const TIMEOUT: Duration = Duration::from_millis(30);
    const RAISE: Duration = Duration::from_secs(600);

    /// Drives `m` against a path that carries datagrams up to `path` bytes: every probe that
    /// fits is acknowledged one RTT later, every other one times out. Returns the time taken
    /// and the probes sent.
    fn settle(m: &mut PathMtu, path: usize, mut now: Instant) -> (Instant, u64) {
        let start = m.probes_sent();
        for pn in 1000..1200 {
            let Some(size) = m.poll_probe(now) else {
                break;
            };
            m.on_probe_sent(pn, size, now, TIMEOUT);
            if size <= path {
                now += RTT;
                m.on_probe_acked(now);
            } else {
                now += TIMEOUT;
                m.handle_timeout(now);
            }
        }
        (now, m.probes_sent() - start)
    }

    #[test]
    fn disabled_stays_at_the_base_and_sends_no_probe() {
        let now = Instant::now();
        let mut m = PathMtu::new(false, 1200, 1452, RAISE);
        assert_eq!(m.poll_probe(now), None);
        assert_eq!(m.poll_timeout(now), None);
        assert_eq!(m.current(), 1200);
        // A ceiling at the base is off too.
        let mut m = PathMtu::new(true, 1200, 1200, RAISE);
        assert_eq!(m.poll_probe(now), None);
        assert_eq!(m.on_packet_lost(1200, now), Change::None);
    }

    #[test]
    fn a_path_that_carries_the_ceiling_settles_with_one_probe() {
        let now = Instant::now();
        let mut m = PathMtu::new(true, 1200, 1452, RAISE);
        assert_eq!(m.poll_timeout(now), Some(now), "a search starts at once");
        let (_, probes) = settle(&mut m, 1500, now);
        assert_eq!(m.current(), 1452);
        assert_eq!(probes, 1);
        assert_eq!(m.poll_probe(now), None, "done until the raise timer");
    }

    #[test]
    fn a_narrower_path_settles_at_the_largest_size_it_carries() {
        for path in [1200, 1201, 1252, 1280, 1400, 1451] {
            let now = Instant::now();
            let mut m = PathMtu::new(true, 1200, 1452, RAISE);
            let (end, probes) = settle(&mut m, path, now);
            assert_eq!(m.current(), path, "path {path}");
            // The ceiling refused (3 probes), then a bisection of 252 bytes: at most 8 sizes,
            // each refused one taking 3 probes.
            assert!(probes <= 3 + 8 * 3, "path {path}: {probes} probes");
            assert!(
                end - now < Duration::from_secs(1),
                "path {path}: {:?}",
                end - now
            );
        }
    }

    #[test]
    fn one_lost_probe_does_not_refuse_a_size() {
        let now = Instant::now();
        let mut m = PathMtu::new(true, 1200, 1452, RAISE);
        let size = m.poll_probe(now).unwrap();
        m.on_probe_sent(1, size, now, TIMEOUT);
        assert_eq!(m.poll_probe(now), None, "one probe in flight at a time");
        assert_eq!(m.poll_timeout(now), Some(now + TIMEOUT));
        m.handle_timeout(now + TIMEOUT - Duration::from_millis(1));
        assert_eq!(
            m.probe_in_flight(),
            Some((1, now)),
            "not lost before its time"
        );
        m.handle_timeout(now + TIMEOUT);
        assert_eq!(m.probe_in_flight(), None);
        // Lost once (random loss): the same size is tried again and fits.
        let t = now + TIMEOUT;
        assert_eq!(m.poll_probe(t), Some(1452));
        m.on_probe_sent(2, 1452, t, TIMEOUT);
        assert_eq!(m.on_probe_acked(t + RTT), Change::Grew);
        assert_eq!(m.current(), 1452);
    }

    #[test]
    fn a_late_ack_of_a_lost_probe_is_ignored() {
        let now = Instant::now();
        let mut m = PathMtu::new(true, 1200, 1452, RAISE);
        let size = m.poll_probe(now).unwrap();
        m.on_probe_sent(1, size, now, TIMEOUT);
        m.handle_timeout(now + TIMEOUT);
        assert_eq!(m.on_probe_acked(now + TIMEOUT * 2), Change::None);
        assert_eq!(m.current(), 1200);
    }

    #[test]
    fn a_black_hole_falls_back_to_the_base_and_searches_below_it() {
        let now = Instant::now();
        let mut m = PathMtu::new(true, 1200, 1452, RAISE);
        let (t, _) = settle(&mut m, 1500, now);
        assert_eq!(m.current(), 1452);
        // Lost large packets with an acknowledged one in between: random loss.
        for _ in 0..10 {
            for _ in 0..BLACK_HOLE_LOSSES - 1 {
                assert_eq!(m.on_packet_lost(1452, t), Change::None);
            }
            m.on_packet_acked(1452);
        }
        // Small packets lost count for nothing.
        for _ in 0..10 {
            assert_eq!(m.on_packet_lost(1000, t), Change::None);
        }
        // The path narrows to 1280: every large packet is lost.
        for _ in 0..BLACK_HOLE_LOSSES - 1 {
            assert_eq!(m.on_packet_lost(1452, t), Change::None);
        }
        assert_eq!(m.on_packet_lost(1452, t), Change::Shrank);
        assert_eq!(m.current(), 1200);
        assert_eq!(m.black_holes(), 1);
        // Searching again, below the size that failed, at once.
        assert_eq!(m.poll_timeout(t), Some(t));
        let (_, _) = settle(&mut m, 1252, t);
        assert_eq!(m.current(), 1252);
    }

    #[test]
    fn the_raise_timer_searches_again_and_finds_a_wider_path() {
        let now = Instant::now();
        let mut m = PathMtu::new(true, 1200, 1452, RAISE);
        let (t, _) = settle(&mut m, 1300, now);
        assert_eq!(m.current(), 1300);
        assert_eq!(m.poll_timeout(t), Some(t + RAISE));
        assert_eq!(m.poll_probe(t + RAISE - RTT), None);
        let (_, probes) = settle(&mut m, 1500, t + RAISE);
        assert_eq!(m.current(), 1452);
        assert_eq!(probes, 1, "the ceiling first");
    }

    #[test]
    fn a_black_hole_at_the_base_plus_one_completes_at_the_base() {
        let now = Instant::now();
        let mut m = PathMtu::new(true, 1200, 1201, RAISE);
        settle(&mut m, 1300, now);
        assert_eq!(m.current(), 1201);
        for _ in 0..BLACK_HOLE_LOSSES {
            m.on_packet_lost(1201, now);
        }
        assert_eq!(m.current(), 1200);
        assert_eq!(m.poll_probe(now), None);
        assert_eq!(m.poll_timeout(now), Some(now + RAISE));
    }
}
