//! Unit tests of `sliding` (kept beside it, in their own file).

use super::*;
use crate::fec::policy::least_parity;
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

/// An adaptive sender (`max_parity` 4) that heard `received + lost` datagrams reported.
fn message_sender(received: u64, lost: u64) -> (SlidingSender, Vec<u8>) {
    let c = FecConfig {
        policy: FecPolicy::Adaptive { max_parity: 4 },
        ..cfg()
    };
    let mut tx = SlidingSender::new(c);
    if received + lost > 0 {
        tx.on_loss_report_detail(LossReport {
            received,
            lost,
            max_burst: 1,
        });
    }
    (tx, vec![0u8; c.max_parity_body()])
}

/// Sends the `count` fragments of one message (payloads `[i; 40]`), returning the data bodies
/// and, after each, the repairs then queued.
fn send_message(
    tx: &mut SlidingSender,
    now: Instant,
    count: u32,
    buf: &mut [u8],
) -> (Vec<Vec<u8>>, Vec<Vec<Vec<u8>>>) {
    let (mut data, mut repairs) = (Vec::new(), Vec::new());
    for i in 0..count {
        let n = tx
            .protect_fragment(now, &[i as u8; 40], buf, Some((count - 1 - i, count)))
            .unwrap();
        data.push(buf[..n].to_vec());
        let mut r = Vec::new();
        while let Some(n) = tx.poll_parity(now, buf) {
            r.push(buf[..n].to_vec());
        }
        repairs.push(r);
    }
    (data, repairs)
}

#[test]
fn a_message_of_64_fragments_is_two_chunks_each_repaired_at_its_end() {
    // At 5 % reported loss: 32 sources and 6 repairs lose more than 6 with 0.25 % odds
    // (each chunk may leave 0.5 %).
    let (mut tx, mut buf) = message_sender(95, 5);
    let now = ricochet_testkit::SimClock::new().now();
    let (data, repairs) = send_message(&mut tx, now, 64, &mut buf);
    for (i, r) in repairs.iter().enumerate() {
        let expect = if i == 31 || i == 63 { 6 } else { 0 };
        assert_eq!(r.len(), expect, "repairs after fragment {i}");
    }
    for (chunk, at) in [(0u16, 31), (32, 63)] {
        for r in &repairs[at] {
            let (h, _) = RepairHeader::parse(r).unwrap();
            assert_eq!((h.first_seq, h.count), (chunk, 32));
        }
    }
    assert_eq!(tx.stats().message_chunks, 2);
    assert_eq!(tx.stats().message_repairs, 12);
    assert_eq!(tx.poll_timeout(), None, "no chunk left open");
    // Every source is held by the receiver; any 6 lost of a chunk are rebuilt.
    let mut rx = SlidingReceiver::new(tx.config().with(|_| {}));
    let mut got = BTreeMap::new();
    let lost = [0usize, 5, 17, 18, 19, 31, 40, 63];
    for (i, d) in data.iter().enumerate() {
        let (h, _) = crate::fec::header::DataHeader::parse(d).unwrap();
        assert!(h.protected, "fragment {i} is a source");
        if !lost.contains(&i) {
            rx.on_data(now, d, |p| {
                got.insert(p[0], p.to_vec());
            })
            .unwrap();
        }
        for r in &repairs[i] {
            rx.on_parity(now, r, |p| {
                got.insert(p[0], p.to_vec());
            })
            .unwrap();
        }
    }
    assert_eq!(
        got.len(),
        64,
        "missing {:?}",
        (0..64u8)
            .filter(|i| !got.contains_key(i))
            .collect::<Vec<_>>()
    );
    for (i, p) in &got {
        assert_eq!(p, &vec![*i; 40]);
    }
    assert_eq!(rx.stats().data_recovered, lost.len() as u64);
}

#[test]
fn message_repairs_follow_the_trusted_estimate() {
    let now = ricochet_testkit::SimClock::new().now();
    // A clean path, reported over 1,000 datagrams: no chunk, no repair, no source held.
    let (mut tx, mut buf) = message_sender(1000, 0);
    let (data, repairs) = send_message(&mut tx, now, 20, &mut buf);
    assert!(repairs.iter().all(Vec::is_empty));
    assert_eq!(tx.stats().message_chunks, 0);
    assert!(
        !crate::fec::header::DataHeader::parse(&data[0])
            .unwrap()
            .0
            .protected
    );
    // 10 % loss: 20 sources get 7 repairs (the most 4 per 12 sources allows).
    let (mut tx, mut buf) = message_sender(900, 100);
    let (_, repairs) = send_message(&mut tx, now, 20, &mut buf);
    assert_eq!(repairs[19].len(), 7);
    // 2 % loss: 22 datagrams lose more than 2 with 0.9 % odds.
    let (mut tx, mut buf) = message_sender(980, 20);
    let (_, repairs) = send_message(&mut tx, now, 20, &mut buf);
    assert_eq!(repairs[19].len(), 2);
    // A first report of a clean path (reports count only decided shards, so the first one
    // is trusted): no repairs.
    let (mut tx, mut buf) = message_sender(32, 0);
    let (_, repairs) = send_message(&mut tx, now, 20, &mut buf);
    assert!(repairs.iter().all(Vec::is_empty));
    // Before the first report a message likely lost whole at 5 % (14 fragments or more) is
    // sized for that loss; a smaller one is not protected.
    let (mut tx, mut buf) = message_sender(0, 0);
    let (_, repairs) = send_message(&mut tx, now, 20, &mut buf);
    assert_eq!(repairs[19].len(), least_parity(0.05, 20, 0.01, 0, 7));
    let (mut tx, mut buf) = message_sender(0, 0);
    let (_, repairs) = send_message(&mut tx, now, 10, &mut buf);
    assert!(repairs.iter().all(Vec::is_empty));
    // The estimate is capped by the recent samples: after 10 % loss, three clean reports
    // end the chunks while the moving average still reads loss.
    let (mut tx, mut buf) = message_sender(900, 100);
    for _ in 0..3 {
        tx.on_loss_report_detail(LossReport {
            received: 100,
            lost: 0,
            max_burst: 0,
        });
    }
    assert!(tx.loss_estimate().is_some_and(|e| e > 0.02));
    send_message(&mut tx, now, 20, &mut buf);
    assert_eq!(tx.stats().message_chunks, 0);
}

/// Runs a stream of 3-fragment messages at 60 Hz through a path that loses one datagram in
/// `lose_every` at random (data and repairs alike; 0: none), the receiver reporting every
/// 100 ms as a connection does. Returns (the first loss estimate, repairs sent once the
/// sender had one, messages sent then, of those the ones delivered whole).
fn fragment_stream(lose_every: usize) -> (f64, u64, u32, u32) {
    let c = FecConfig {
        policy: FecPolicy::Adaptive { max_parity: 4 },
        ..cfg()
    };
    let (mut tx, mut rx) = (SlidingSender::new(c), SlidingReceiver::new(c));
    let mut buf = vec![0u8; c.max_parity_body()];
    let start = ricochet_testkit::SimClock::new().now();
    // A seeded xorshift: loss at 1 / `lose_every` per datagram, independent of position
    // (a period would line up with the messages and hit only their repairs).
    let mut wire = 0x9E37_79B9_7F4A_7C15u64;
    let pass = |x: &mut u64| {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        lose_every == 0 || *x % lose_every as u64 != 0
    };
    let (mut first, mut repairs_from, mut after, mut whole) = (None, 0, 0, 0);
    for m in 0..300u32 {
        let now = start + Duration::from_micros(16_667 * u64::from(m));
        if m % 6 == 0 && m > 0 {
            tx.on_loss_report_detail(rx.loss_report_detail());
            if first.is_none() {
                first = tx.controller.estimate();
                repairs_from = tx.stats().message_repairs;
            }
        }
        let mut got = std::collections::HashSet::new();
        for f in 0..3u32 {
            let n = tx
                .protect_fragment(now, &[m as u8, f as u8, 7], &mut buf, Some((2 - f, 3)))
                .unwrap();
            let body = buf[..n].to_vec();
            if pass(&mut wire) {
                rx.on_data(now, &body, |p| {
                    got.insert((p[0], p[1]));
                })
                .unwrap();
            }
            while let Some(n) = tx.poll_parity(now, &mut buf) {
                if pass(&mut wire) {
                    rx.on_parity(now, &buf[..n], |p| {
                        got.insert((p[0], p[1]));
                    })
                    .unwrap();
                }
            }
        }
        if first.is_some() {
            after += 1;
            whole += u32::from((0..3u8).all(|f| got.contains(&(m as u8, f))));
        }
    }
    let repairs = tx.stats().message_repairs - repairs_from;
    (first.expect("an estimate"), repairs, after, whole)
}

#[test]
fn small_fragmented_messages_are_repaired_only_on_a_lossy_path() {
    // A clean path: the first report reads it clean, and 3-fragment messages get no repairs
    // from then on (a prior of 5 % until 512 datagrams were reported once sent them two
    // each for about 3 s at 60 Hz).
    let (est, repairs, after, whole) = fragment_stream(0);
    assert!(est <= 0.002, "first estimate {est}");
    assert_eq!(repairs, 0);
    assert_eq!(whole, after);
    // 5 % loss: the first report already reads it, and the messages get repairs.
    let (est, repairs, after, whole) = fragment_stream(20);
    assert!((0.03..=0.07).contains(&est), "first estimate {est}");
    // 3 sources at most 4 per 12: one repair a message at most.
    assert!(
        repairs * 10 >= u64::from(after) * 9,
        "{repairs} repairs for {after} messages"
    );
    assert!(
        f64::from(whole) >= 0.97 * f64::from(after),
        "{whole} of {after} whole (0.86 without repairs)"
    );
}

#[test]
fn a_chunk_whose_message_stops_closes_on_its_timer() {
    let (mut tx, mut buf) = message_sender(95, 5);
    let now = ricochet_testkit::SimClock::new().now();
    for i in 0..10u32 {
        tx.protect_fragment(now, &[i as u8; 40], &mut buf, Some((63 - i, 64)))
            .unwrap();
    }
    assert!(
        tx.poll_parity(now, &mut buf).is_none(),
        "no repair inside a chunk"
    );
    // The rest of the message never comes (dropped unsent): the chunk closes when it is as
    // old as half the receiver's hold, with repairs for its 10 sources.
    let t = tx.poll_timeout().unwrap();
    assert_eq!(t, now + tx.config().max_group_age / 2);
    assert_eq!(
        drain(&mut tx, t, &mut buf),
        least_parity(0.05, 10, 0.005, 0, 4)
    );
    assert_eq!(tx.poll_timeout(), None);
    // ARQ was told to wait for them meanwhile, and is after, until the ratio resumes.
    assert!(tx.chunk_reorder().is_some());
}
