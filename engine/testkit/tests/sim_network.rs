//! `SimNetwork`: deterministic delivery traces, per-direction impairments, accounting.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ricochet_testkit::{Impairment, Profile, SimClock, SimNetwork, Verdict};

fn addrs() -> Vec<SocketAddr> {
    vec![
        "10.0.0.1:4000".parse().unwrap(),
        "10.0.0.2:4000".parse().unwrap(),
        "10.0.0.3:5000".parse().unwrap(),
        "[fd00::1]:6000".parse().unwrap(),
        "[fd00::2]:6000".parse().unwrap(),
    ]
}

/// Deliveries as (time offset, from, to, payload).
type Log = Vec<(Duration, SocketAddr, SocketAddr, Vec<u8>)>;

/// 4 simulated seconds of random traffic (sizes 0..1,400 B, random pairs, ~2 sends per ms)
/// under `profile`; the workload comes from its own fixed RNG, the impairments from `seed`.
/// Returns the network's trace hash and the deliveries.
fn traffic(seed: u64, profile: Profile) -> ([u8; 32], Log) {
    let nodes = addrs();
    let mut clock = SimClock::new();
    let mut net = SimNetwork::new(clock.base(), seed, profile.impairment()).unwrap();
    net.enable_trace();
    let mut work = ChaCha8Rng::seed_from_u64(7);
    let end = clock.at(Duration::from_secs(4));
    let mut next_send = clock.now();
    let mut log = Vec::new();
    let mut n = 0u32;
    loop {
        let now = clock.now();
        for d in net.deliver_until(now) {
            assert_eq!(d.at, now);
            log.push((clock.offset_of(d.at), d.from, d.to, d.bytes.clone()));
            net.recycle(d.bytes);
        }
        while next_send <= now && now < end {
            let from = nodes[work.random_range(0..nodes.len())];
            let to = nodes[work.random_range(0..nodes.len())];
            let mut bytes = vec![0u8; work.random_range(0..1400)];
            work.fill(&mut bytes[..]);
            bytes.extend_from_slice(&n.to_le_bytes());
            n += 1;
            net.send(now, from, to, &bytes);
            next_send += Duration::from_micros(work.random_range(0..1000));
        }
        let timer = (next_send < end).then_some(next_send);
        if !net.advance_clock(&mut clock, timer, end + Duration::from_secs(1)) {
            break;
        }
    }
    assert_eq!(net.in_flight(), 0);
    (net.trace_hash().unwrap(), log)
}

#[test]
fn same_seed_gives_a_bit_identical_trace_and_another_seed_does_not() {
    for profile in [Profile::Random, Profile::Sustained] {
        let (h1, log1) = traffic(42, profile);
        let (h2, log2) = traffic(42, profile);
        assert_eq!(h1, h2);
        assert!(log1 == log2);
        let (h3, log3) = traffic(43, profile);
        assert_ne!(h1, h3);
        assert!(log1 != log3);
        // Deliveries come out in time order.
        assert!(log1.windows(2).all(|w| w[0].0 <= w[1].0));
    }
    // Without impairments the seed does not matter at all.
    assert_eq!(traffic(1, Profile::None).0, traffic(2, Profile::None).0);
}

#[test]
fn every_datagram_is_accounted_for_and_reordering_and_duplicates_are_observed() {
    let (a, b) = (addrs()[0], addrs()[1]);
    let mut clock = SimClock::new();
    let mut net = SimNetwork::new(clock.base(), 5, Profile::Random.impairment()).unwrap();
    // The other direction is clean: per-direction configuration.
    net.set_link(b, a, Impairment::none()).unwrap();
    let mut received: HashMap<u32, u32> = HashMap::new();
    let mut order = Vec::new();
    let n = 20_000u32;
    let mut dropped_seen = 0;
    for i in 0..n {
        let now = clock.now();
        if let Verdict::Drop(_) = net.send(now, a, b, &i.to_le_bytes()) {
            dropped_seen += 1;
        }
        net.send(now, b, a, b"ack");
        clock.advance(Duration::from_millis(1));
        for d in net.deliver_until(clock.now()) {
            if d.to == b {
                let seq = u32::from_le_bytes(d.bytes[..4].try_into().unwrap());
                *received.entry(seq).or_default() += 1;
                order.push(seq);
            }
        }
    }
    clock.advance(Duration::from_secs(1));
    for d in net.deliver_until(clock.now()) {
        if d.to == b {
            let seq = u32::from_le_bytes(d.bytes[..4].try_into().unwrap());
            *received.entry(seq).or_default() += 1;
            order.push(seq);
        }
    }
    let ab = *net.link_counters(a, b).unwrap();
    let ba = *net.link_counters(b, a).unwrap();
    assert_eq!(ab.offered, u64::from(n));
    assert_eq!(ab.dropped(), dropped_seen);
    assert_eq!(n - received.len() as u32, dropped_seen as u32);
    let dups: u32 = received.values().map(|c| c - 1).sum();
    assert_eq!(u64::from(dups), ab.duplicated);
    assert!(ab.duplicated > 0 && ab.delayed > 0);
    assert_eq!(order.len() as u64, ab.forwarded);
    // The 15 ms extra delay puts 15 later datagrams ahead of each delayed one.
    let inversions = order.windows(2).filter(|w| w[1] < w[0]).count();
    assert!(inversions > 0);
    assert_eq!(ab.departed, ab.forwarded);
    assert_eq!((ab.queue_datagrams, ab.queue_bytes), (0, 0));
    // 1 ms between sends, 10 or 25 ms in flight: at most 26 datagrams (+ duplicates) held.
    assert!(
        ab.queue_peak_datagrams <= 2 * 26,
        "{}",
        ab.queue_peak_datagrams
    );
    assert_eq!((ba.dropped(), ba.duplicated, ba.delayed), (0, 0, 0));
    assert_eq!(ba.forwarded, u64::from(n));
    let total = net.total_counters();
    assert_eq!(total.offered, ab.offered + ba.offered);
    assert_eq!(
        total.queue_peak_datagrams,
        ab.queue_peak_datagrams + ba.queue_peak_datagrams
    );
}

#[test]
fn rate_limited_route_queues_then_overflows_and_recovers() {
    let (a, b) = (addrs()[0], addrs()[3]);
    let mut clock = SimClock::new();
    let mut net = SimNetwork::new(clock.base(), 1, Impairment::none()).unwrap();
    // 100 kB/s, room for 50 datagrams: a burst of 80 × 1,000 B keeps 50, each 10 ms apart.
    let route = Impairment::none()
        .with_rate(100_000)
        .with_queue(1 << 20, 50);
    net.set_route(a, b, route).unwrap();
    let t0 = clock.now();
    for i in 0..80u8 {
        net.send(t0, a, b, &[i; 1000]);
    }
    let c = *net.link_counters(a, b).unwrap();
    assert_eq!((c.forwarded, c.dropped_overflow, c.overflows), (50, 30, 30));
    let mut seen = 0u8;
    while net.advance_clock(&mut clock, None, t0 + Duration::from_secs(10)) {
        for d in net.deliver_until(clock.now()) {
            seen += 1;
            assert_eq!(d.bytes[0], seen - 1);
            assert_eq!(d.at - t0, Duration::from_millis(10) * u32::from(seen));
        }
    }
    assert_eq!(seen, 50);
    // The reverse direction has the same route settings but its own queue.
    assert_eq!(net.link_counters(b, a).unwrap().offered, 0);
    assert!(matches!(
        net.send(clock.now(), a, b, &[0; 1000]),
        Verdict::Deliver { .. }
    ));
}

#[test]
fn invalid_impairments_are_rejected() {
    let clock = SimClock::new();
    assert!(SimNetwork::new(clock.base(), 1, Impairment::none().with_loss(-1.0)).is_err());
    let mut net = SimNetwork::new(clock.base(), 1, Impairment::none()).unwrap();
    let (a, b) = (addrs()[0], addrs()[1]);
    assert!(net
        .set_route(a, b, Impairment::none().with_burst(5, 2))
        .is_err());
    assert!(net
        .set_default(Impairment::none().with_queue(10, 0))
        .is_err());
}
