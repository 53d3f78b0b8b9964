//! The impairment model realizes the configured rates and patterns.
//!
//! Rates are checked over 10^5 datagrams against the binomial distribution: the count of events
//! with probability p among n trials has mean np and standard deviation sqrt(np(1-p)); the bounds
//! are 6 standard deviations, so a correct model fails with probability ~2e-9 per check (and the
//! seeds are fixed, so the test never flakes), while a rate off by a tenth (5.5% for 5%) is ~7
//! standard deviations away and fails.

use std::time::{Duration, Instant};

use ricochet_testkit::{
    BurstLoss, Direction, DropCause, ImpairedLink, Impairment, LinkCounters, Profile, Verdict,
};

const N: u64 = 100_000;

/// One base instant for every run, so verdicts of different runs compare equal.
fn base() -> Instant {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// Asserts `count` is within 6 sigma of Binomial(`trials`, `p`).
fn assert_binomial(what: &str, count: u64, trials: u64, p: f64) {
    let mean = trials as f64 * p;
    let sigma = (trials as f64 * p * (1.0 - p)).sqrt();
    let dev = (count as f64 - mean).abs();
    assert!(
        dev <= 6.0 * sigma,
        "{what}: {count} of {trials}, expected {mean:.0} ± {:.0} (6σ)",
        6.0 * sigma
    );
}

/// Offers `n` datagrams of 100 B at one instant, departing each copy at once; returns the
/// verdicts and the counters.
fn run(
    imp: Impairment,
    seed: u64,
    route: u64,
    dir: Direction,
    n: u64,
) -> (Vec<Verdict>, LinkCounters) {
    let mut link = ImpairedLink::new(imp, seed, route, dir).unwrap();
    let t = base();
    let verdicts: Vec<Verdict> = (0..n)
        .map(|_| {
            let v = link.admit(t, 100);
            for _ in v.delivery_times() {
                link.on_departed(100);
            }
            v
        })
        .collect();
    (verdicts, *link.counters())
}

#[test]
fn random_loss_rate_matches_the_configured_probability() {
    for (p, seed) in [(0.05, 1), (0.05, 2), (0.05, 3), (0.01, 4), (0.3, 5)] {
        for dir in [Direction::Forward, Direction::Backward] {
            let (_, c) = run(Impairment::none().with_loss(p), seed, 9, dir, N);
            assert_eq!(c.offered, N);
            assert_eq!(c.dropped_burst + c.dropped_overflow, 0);
            assert_binomial("random loss", c.dropped_random, N, p);
            assert_eq!(c.forwarded, N - c.dropped_random);
        }
    }
}

#[test]
fn random_profile_realizes_loss_duplicates_and_reordering() {
    let imp = Profile::Random.impairment();
    for seed in [42, 43, 44] {
        let (verdicts, c) = run(imp.clone(), seed, 1, Direction::Forward, N);
        assert_binomial("loss", c.dropped_random, N, 0.05);
        let delivered = N - c.dropped();
        assert_binomial("duplicates", c.duplicated, delivered, 0.01);
        assert_eq!(c.forwarded, delivered + c.duplicated);
        assert_binomial("reordered copies", c.delayed, c.forwarded, 0.05);

        // Every copy arrives after exactly 10 ms, or 25 ms for the delayed share.
        let t = verdicts_base(&verdicts);
        let mut late = 0;
        for at in verdicts.iter().flat_map(|v| v.delivery_times()) {
            let d = at - t;
            assert!(d == Duration::from_millis(10) || d == Duration::from_millis(25));
            late += u64::from(d == Duration::from_millis(25));
        }
        assert_eq!(late, c.delayed);
    }
}

/// The send instant of a run: every copy is at least 10 ms after it.
fn verdicts_base(verdicts: &[Verdict]) -> Instant {
    let first = verdicts
        .iter()
        .flat_map(|v| v.delivery_times())
        .min()
        .unwrap();
    first - Duration::from_millis(10)
}

/// The indices of burst drops, checked to be exactly one run of `len` per window of `period`.
fn burst_offsets(verdicts: &[Verdict], b: BurstLoss) -> Vec<u64> {
    let period = b.period as usize;
    verdicts
        .chunks(period)
        .map(|w| {
            let dropped: Vec<usize> = w
                .iter()
                .enumerate()
                .filter(|(_, v)| **v == Verdict::Drop(DropCause::Burst))
                .map(|(i, _)| i)
                .collect();
            assert_eq!(dropped.len(), b.len as usize, "window {dropped:?}");
            assert!(
                dropped.windows(2).all(|p| p[1] == p[0] + 1),
                "not consecutive: {dropped:?}"
            );
            dropped[0] as u64
        })
        .collect()
}

#[test]
fn burst_drops_exactly_n_consecutive_per_p_in_each_direction() {
    let b = BurstLoss {
        len: 3,
        period: 100,
    };
    for profile in [Profile::Burst, Profile::Sustained] {
        let (fwd, cf) = run(profile.impairment(), 42, 7, Direction::Forward, N);
        let (back, cb) = run(profile.impairment(), 42, 7, Direction::Backward, N);
        assert_eq!(cf.dropped_burst, 3 * N / 100);
        assert_eq!(cb.dropped_burst, 3 * N / 100);
        let of = burst_offsets(&fwd, b);
        let ob = burst_offsets(&back, b);
        // Offsets are seeded per direction: spread over 0..=97 and different between directions.
        assert_ne!(of, ob);
        for offsets in [&of, &ob] {
            assert!(offsets.iter().all(|&o| o <= 97));
            let mut seen = [false; 98];
            offsets.iter().for_each(|&o| seen[o as usize] = true);
            assert_eq!(
                seen.iter().filter(|s| **s).count(),
                98,
                "offsets cover 0..=97"
            );
        }
        if profile == Profile::Sustained {
            // 2% of the datagrams the bursts spared.
            assert_binomial(
                "sustained random",
                cf.dropped_random,
                N - cf.dropped_burst,
                0.02,
            );
        } else {
            assert_eq!(cf.dropped_random, 0);
        }
    }
    // Other shapes: 5 per 7, and a burst that is the whole window.
    let (v, c) = run(
        Impairment::none().with_burst(5, 7),
        1,
        2,
        Direction::Forward,
        700,
    );
    assert_eq!(c.dropped_burst, 500);
    burst_offsets(&v, BurstLoss { len: 5, period: 7 });
    let (_, all) = run(
        Impairment::none().with_burst(4, 4),
        1,
        2,
        Direction::Forward,
        40,
    );
    assert_eq!(all.dropped_burst, 40);
}

#[test]
fn streams_differ_by_seed_route_and_direction_and_repeat_exactly() {
    let imp = Profile::Sustained.impairment();
    let first = run(imp.clone(), 42, 1, Direction::Forward, 10_000).0;
    assert!(first == run(imp.clone(), 42, 1, Direction::Forward, 10_000).0);
    for (seed, route, dir) in [
        (43, 1, Direction::Forward),
        (42, 2, Direction::Forward),
        (42, 1, Direction::Backward),
    ] {
        assert!(first != run(imp.clone(), seed, route, dir, 10_000).0);
    }
}

#[test]
fn rate_limit_spaces_copies_exactly() {
    let t0 = Instant::now();
    let delay = Duration::from_millis(10);
    // 1,000 B at 1 MB/s: exactly 1 ms per datagram.
    let mut link = ImpairedLink::new(
        Impairment::none().with_rate(1_000_000).with_delay(delay),
        1,
        1,
        Direction::Forward,
    )
    .unwrap();
    for k in 1..=100u32 {
        let Verdict::Deliver {
            at,
            duplicate: None,
        } = link.admit(t0, 1000)
        else {
            panic!("dropped")
        };
        assert_eq!(at - t0, delay + Duration::from_millis(1) * k);
    }
    // 1,000 B at 3 MB/s: 333,333.3 ns each; the remainder is carried, so the k-th copy is done
    // at exactly floor(k * 10^12 / 3e6) ns, without drift.
    let mut link = ImpairedLink::new(
        Impairment::none().with_rate(3_000_000),
        1,
        1,
        Direction::Forward,
    )
    .unwrap();
    for k in 1..=3000u64 {
        let Verdict::Deliver { at, .. } = link.admit(t0, 1000) else {
            panic!("dropped")
        };
        assert_eq!(
            at - t0,
            Duration::from_nanos(k * 1_000_000_000_000 / 3_000_000)
        );
    }
    // After the link drains, serialization starts at the offer time again.
    let later = t0 + Duration::from_secs(5);
    let Verdict::Deliver { at, .. } = link.admit(later, 3) else {
        panic!("dropped")
    };
    assert_eq!(at - later, Duration::from_nanos(1000));
}

#[test]
fn queue_caps_drop_and_count_overflow() {
    let t0 = Instant::now();
    let imp = Impairment::none()
        .with_delay(Duration::from_millis(10))
        .with_queue(1_000_000, 100);
    let mut link = ImpairedLink::new(imp, 1, 1, Direction::Forward).unwrap();
    let verdicts: Vec<Verdict> = (0..150).map(|_| link.admit(t0, 1000)).collect();
    assert!(verdicts[..100]
        .iter()
        .all(|v| matches!(v, Verdict::Deliver { .. })));
    assert!(verdicts[100..]
        .iter()
        .all(|v| *v == Verdict::Drop(DropCause::Overflow)));
    let c = *link.counters();
    assert_eq!((c.dropped_overflow, c.overflows), (50, 50));
    assert_eq!((c.queue_peak_datagrams, c.queue_peak_bytes), (100, 100_000));
    for _ in 0..100 {
        link.on_departed(1000);
    }
    assert_eq!(
        (link.counters().queue_datagrams, link.counters().queue_bytes),
        (0, 0)
    );
    assert!(matches!(link.admit(t0, 1000), Verdict::Deliver { .. }));

    // The byte cap: 8 MiB of 1,200 B datagrams holds 6,990 of them (default caps).
    let mut link = ImpairedLink::new(Impairment::none(), 1, 1, Direction::Forward).unwrap();
    let held = (0..8192)
        .filter(|_| matches!(link.admit(t0, 1200), Verdict::Deliver { .. }))
        .count();
    assert_eq!(held, 8 * 1024 * 1024 / 1200);
    assert_eq!(link.counters().dropped_overflow, 8192 - held as u64);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    fn impairment() -> impl Strategy<Value = Impairment> {
        (
            (0.0..0.3f64, 0.0..0.1f64, 0.0..0.2f64, 0u64..50, 0u64..100),
            prop::option::of((0u32..6, 0u32..200)),
            (1usize..64, 1usize..65_536),
            prop::option::of(1_000u64..10_000_000),
        )
            .prop_map(
                |((loss, dup, reorder, extra, delay), burst, (qd, qb), rate)| {
                    let mut imp = Impairment::none()
                        .with_loss(loss)
                        .with_duplicate(dup)
                        .with_reorder(reorder, Duration::from_millis(extra))
                        .with_delay(Duration::from_millis(delay))
                        .with_queue(qb, qd)
                        .with_rate(rate.unwrap_or(0));
                    if let Some((len, extra_period)) = burst {
                        imp = imp.with_burst(len, (len + extra_period).max(1));
                    }
                    imp
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever the settings and traffic: counters add up, the queue never exceeds its caps
        /// and matches what is held, bursts are exact, and no copy arrives before `delay`.
        #[test]
        fn accounting_and_caps_hold(
            imp in impairment(),
            seed in any::<u64>(),
            ops in prop::collection::vec((0u64..2_000, 0usize..1_500, 0usize..4), 1..600),
        ) {
            let mut link = ImpairedLink::new(imp.clone(), seed, 3, Direction::Forward).unwrap();
            let mut now = base();
            let mut held: Vec<(Instant, usize)> = Vec::new();
            let mut delivered_originals = 0u64;
            let mut burst_flags = Vec::new();
            for (advance_us, len, departures) in ops {
                now += Duration::from_micros(advance_us);
                let v = link.admit(now, len);
                burst_flags.push(v == Verdict::Drop(DropCause::Burst));
                if let Verdict::Deliver { at, duplicate } = v {
                    delivered_originals += 1;
                    for t in std::iter::once(at).chain(duplicate) {
                        prop_assert!(t >= now + imp.delay);
                        if imp.rate.is_none() {
                            let d = t - now;
                            prop_assert!(d == imp.delay || d == imp.delay + imp.reorder_delay);
                        }
                        held.push((t, len));
                    }
                }
                // Let the earliest copies depart.
                held.sort();
                for (_, l) in held.drain(..departures.min(held.len())) {
                    link.on_departed(l);
                }
                let c = *link.counters();
                prop_assert_eq!(c.queue_datagrams, held.len() as u64);
                prop_assert_eq!(c.queue_bytes, held.iter().map(|h| h.1 as u64).sum::<u64>());
                prop_assert!(c.queue_peak_datagrams <= imp.queue_datagrams as u64);
                prop_assert!(c.queue_peak_bytes <= imp.queue_bytes as u64);
            }
            let c = *link.counters();
            prop_assert_eq!(c.offered, burst_flags.len() as u64);
            prop_assert_eq!(c.offered, c.dropped() + delivered_originals);
            prop_assert_eq!(c.forwarded, delivered_originals + c.duplicated);
            prop_assert!(c.overflows >= c.dropped_overflow);
            prop_assert!(c.delayed <= c.forwarded);
            if let Some(b) = imp.burst {
                for w in burst_flags.chunks_exact(b.period as usize) {
                    prop_assert_eq!(w.iter().filter(|f| **f).count(), b.len as usize);
                }
            } else {
                prop_assert_eq!(c.dropped_burst, 0);
            }
        }
    }
}
