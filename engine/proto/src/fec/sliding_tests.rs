//! Unit tests of `sliding` (kept beside it, in their own file).

use super::*;
use crate::fec::{FecPolicy, LossReport};

fn cfg() -> FecConfig {
    FecConfig {
        policy: FecPolicy::Fixed { parity: 4 },
        max_payload: 200,
        // Tiny test payloads: let the cap not get in the way.
        parity_cap_percent: 1000,
        ..FecConfig::default()
    }
}

#[test]
fn a_lost_source_is_rebuilt_from_the_next_repair() {
    let (mut tx, mut rx) = (SlidingSender::new(cfg()), SlidingReceiver::new(cfg()));
    let now = ricochet_testkit::SimClock::new().now();
    let mut buf = vec![0u8; cfg().max_parity_body()];
    let mut got = Vec::new();
    // Fixed 4 per span 16: one repair per 4 sources.
    for i in 0..4u8 {
        let n = tx.protect(now, &[i; 50], &mut buf).unwrap();
        if i != 2 {
            rx.on_data(now, &buf[..n], |p| got.push(p.to_vec()))
                .unwrap();
        }
    }
    let n = tx.poll_parity(now, &mut buf).unwrap();
    rx.on_parity(now, &buf[..n], |p| got.push(p.to_vec()))
        .unwrap();
    assert_eq!(got.len(), 4);
    assert_eq!(got[3], vec![2u8; 50]);
    assert_eq!(rx.stats().data_recovered, 1);
    assert_eq!(rx.pending_repairs(), 0);
}

/// A sender that heard the peer report `lost` of `received + lost` shards (no bursts).
fn sender_at_loss(received: u64, lost: u64) -> (SlidingSender, Vec<u8>) {
    let c = FecConfig {
        policy: FecPolicy::Adaptive { max_parity: 4 },
        ..cfg()
    };
    let mut tx = SlidingSender::new(c);
    tx.on_loss_report_detail(LossReport {
        received,
        lost,
        max_burst: 1,
    });
    (tx, vec![0u8; c.max_parity_body()])
}

/// Repairs one tail queues after `sources` sources, at the peer's reported loss.
fn tail_after(sources: u8, received: u64, lost: u64) -> u64 {
    let (mut tx, mut buf) = sender_at_loss(received, lost);
    let now = ricochet_testkit::SimClock::new().now();
    for i in 0..sources {
        tx.protect(now, &[i; 10], &mut buf).unwrap();
    }
    let t = tx.poll_timeout().unwrap();
    let mut n = 0;
    while tx.poll_parity(t, &mut buf).is_some() {
        n += 1;
    }
    assert_eq!(tx.stats().tail_repairs, n);
    n
}

#[test]
fn the_tail_carries_as_many_repairs_as_the_loss_estimate_asks() {
    // 5 % loss: two sources and one repair lose two with 0.7 % odds, one repair will do.
    assert_eq!(tail_after(2, 950, 50), 1);
    // 30 % loss: one repair leaves 22 % odds, two 8 % (above the 5 % residual); the
    // bound is 2.
    assert_eq!(tail_after(2, 700, 300), 2);
}

#[test]
fn a_tail_after_a_likely_received_source_waits_for_the_next_one() {
    let (mut tx, mut buf) = sender_at_loss(950, 50);
    let now = ricochet_testkit::SimClock::new().now();
    tx.protect(now, &[1; 10], &mut buf).unwrap();
    // One source lost with 5 % odds (at most 6 %): the tail is skipped, no timer remains.
    let t = tx.poll_timeout().unwrap();
    assert!(tx.poll_parity(t, &mut buf).is_none());
    assert_eq!(tx.stats().tails_skipped, 1);
    assert_eq!(tx.poll_timeout(), None);
    // The next source's tail covers both (9.75 % odds that one is lost).
    tx.protect(t, &[2; 10], &mut buf).unwrap();
    let t2 = tx.poll_timeout().unwrap();
    let n = tx.poll_parity(t2, &mut buf).unwrap();
    let (h, _) = RepairHeader::parse(&buf[..n]).unwrap();
    assert_eq!(h.count, 2);
    assert_eq!(tx.stats().tail_repairs, 1);
    // At 30 % loss a single source is not left waiting.
    assert_eq!(tail_after(1, 700, 300), 2);
}

/// A sender that heard the peer report 10 % loss in bursts of 3 (4 repairs per 12
/// sources: one every 3).
fn sender_after_bursts() -> (SlidingSender, Vec<u8>) {
    let c = FecConfig {
        policy: FecPolicy::Adaptive { max_parity: 4 },
        ..cfg()
    };
    let mut tx = SlidingSender::new(c);
    tx.on_loss_report_detail(LossReport {
        received: 90,
        lost: 10,
        max_burst: 3,
    });
    assert_eq!(tx.repair_interval(), Some(3));
    (tx, vec![0u8; c.max_parity_body()])
}

/// Repairs queued now, drained.
fn drain(tx: &mut SlidingSender, now: Instant, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while tx.poll_parity(now, buf).is_some() {
        n += 1;
    }
    n
}

#[test]
fn a_burst_gets_a_tail_even_after_a_ratio_repair() {
    let (mut tx, mut buf) = sender_after_bursts();
    let now = ricochet_testkit::SimClock::new().now();
    for i in 0..3 {
        tx.protect(now, &[i; 10], &mut buf).unwrap();
    }
    // The third source brought the ratio repair: nothing is uncovered, but a burst of 3
    // over the last sources (or two of them and that repair) would leave two unknowns
    // for at most one equation.
    assert_eq!(drain(&mut tx, now, &mut buf), 1);
    let t = tx.poll_timeout().expect("a tail for the burst");
    assert_eq!(drain(&mut tx, t, &mut buf), 2);
    assert_eq!(tx.stats().tail_repairs, 2);
    // Once run, the tail waits for the next source.
    assert_eq!(tx.poll_timeout(), None);
}

#[test]
fn a_tail_adds_only_what_a_burst_could_leave_unrepaired() {
    let (mut tx, mut buf) = sender_after_bursts();
    let now = ricochet_testkit::SimClock::new().now();
    for i in 0..3 {
        tx.protect(now, &[i; 10], &mut buf).unwrap();
    }
    let t = tx.poll_timeout().unwrap();
    assert_eq!(drain(&mut tx, t, &mut buf), 3);
    // One more source after three repairs: a burst can erase only it (a burst of 3
    // reaching back to the earlier sources also takes repairs sent after them), so one
    // repair covers it, not one per burst datagram.
    tx.protect(t, &[9; 10], &mut buf).unwrap();
    let t2 = tx.poll_timeout().unwrap();
    assert_eq!(drain(&mut tx, t2, &mut buf), 1);
}

#[test]
fn after_bursts_a_tail_is_skipped_when_no_burst_likely_touched_its_sources() {
    let c = FecConfig {
        policy: FecPolicy::Adaptive { max_parity: 4 },
        ..cfg()
    };
    let mut tx = SlidingSender::new(c);
    let mut buf = vec![0u8; c.max_parity_body()];
    // 3 % loss in bursts of 3: a burst starts at 1 % per datagram.
    tx.on_loss_report_detail(LossReport {
        received: 970,
        lost: 30,
        max_burst: 3,
    });
    assert_eq!(tx.repair_interval(), Some(6));
    let now = ricochet_testkit::SimClock::new().now();
    // One source: a burst touches it with 3 % odds (at most 6 %), and a burst there
    // erases one source only: the tail waits for the next source.
    tx.protect(now, &[1; 10], &mut buf).unwrap();
    let t = tx.poll_timeout().unwrap();
    assert_eq!(drain(&mut tx, t, &mut buf), 0);
    assert_eq!(tx.stats().tails_skipped, 1);
    assert_eq!(tx.poll_timeout(), None);
    // Five sources: 7 % odds, the tail goes out.
    for i in 2..6 {
        tx.protect(t, &[i; 10], &mut buf).unwrap();
    }
    let t2 = tx.poll_timeout().unwrap();
    assert_eq!(drain(&mut tx, t2, &mut buf), 1);
    assert_eq!(tx.stats().tails_skipped, 1);
}

#[test]
fn the_tail_timer_repairs_a_quiet_sender() {
    let mut tx = SlidingSender::new(cfg());
    let now = ricochet_testkit::SimClock::new().now();
    let mut buf = vec![0u8; cfg().max_parity_body()];
    tx.protect(now, &[1; 10], &mut buf).unwrap();
    assert!(tx.poll_parity(now, &mut buf).is_none());
    let t = tx.poll_timeout().unwrap();
    assert_eq!(t, now + cfg().sliding.tail_wait);
    assert!(tx.poll_parity(t, &mut buf).is_some());
    assert_eq!(tx.poll_timeout(), None);
}
