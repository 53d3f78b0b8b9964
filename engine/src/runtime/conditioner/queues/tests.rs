use super::*;
use crate::runtime::conditioner::{ConditionerControl, GilbertElliott, RateLimit};

fn addr() -> SocketAddr {
    "127.0.0.1:9".parse().unwrap()
}

/// Offer `n` datagrams one per millisecond of virtual time, then drain; returns the delays
/// of the released ones in release order (as the sequence numbers carried in the payload).
fn run(imp: Impairment, n: u32) -> (Direction, Vec<(u32, Duration)>) {
    let mut d = Direction::new(imp, 42, 1 << 20);
    let t0 = Instant::now();
    let mut out = Vec::new();
    let mut sent_at = Vec::new();
    for i in 0..n {
        let now = t0 + Duration::from_millis(i as u64);
        sent_at.push(now);
        d.offer(now, addr(), &i.to_le_bytes());
        while let Some(h) = d.pop_due(now) {
            let k = u32::from_le_bytes(h.data[..4].try_into().unwrap());
            out.push((k, now - sent_at[k as usize]));
            d.recycle(h);
        }
    }
    let mut now = t0 + Duration::from_millis(n as u64);
    while let Some(due) = d.next_due() {
        now = now.max(due);
        while let Some(h) = d.pop_due(now) {
            let k = u32::from_le_bytes(h.data[..4].try_into().unwrap());
            out.push((k, h.due - sent_at[k as usize]));
            d.recycle(h);
        }
    }
    (d, out)
}

#[test]
fn off_settings_build_no_conditioner() {
    assert!(LinkConditioner::default().is_none());
    assert!(Conditioner::new(&LinkConditioner::default(), 0).is_none());
    assert!(Conditioner::new(&LinkConditioner::default().seed(7), 3).is_none());
}

#[test]
fn random_loss_matches_its_probability() {
    let (d, out) = run(Impairment::new().loss(0.05), 20_000);
    let lost = d.stats.lost as f64 / 20_000.0;
    assert!((0.045..0.055).contains(&lost), "lost {lost}");
    assert_eq!(out.len() as u64 + d.stats.lost, 20_000);
}

#[test]
fn delay_and_jitter_bound_every_datagram() {
    let imp = Impairment::new()
        .delay(Duration::from_millis(50))
        .jitter(Duration::from_millis(10));
    let (_, out) = run(imp, 2_000);
    assert_eq!(out.len(), 2_000);
    for &(_, delay) in &out {
        assert!(delay >= Duration::from_millis(50) && delay <= Duration::from_millis(60));
    }
    // 10 ms of jitter at one datagram per ms reorders some.
    assert!(out.windows(2).any(|w| w[1].0 < w[0].0));
}

#[test]
fn without_jitter_order_is_kept_and_reorder_moves_a_share_back() {
    let (_, out) = run(Impairment::new().delay(Duration::from_millis(5)), 1_000);
    assert!(out.windows(2).all(|w| w[0].0 < w[1].0));
    let imp = Impairment::new()
        .delay(Duration::from_millis(5))
        .reorder(0.1, Duration::from_millis(20));
    let (_, out) = run(imp, 10_000);
    let late = out
        .iter()
        .filter(|(_, d)| *d == Duration::from_millis(25))
        .count();
    assert!((900..1_100).contains(&late), "late {late}");
}

#[test]
fn duplication_makes_copies() {
    let (d, out) = run(Impairment::new().duplicate(0.1), 10_000);
    assert_eq!(out.len() as u64, 10_000 + d.stats.duplicated);
    assert!((900..1_100).contains(&d.stats.duplicated));
}

#[test]
fn bursts_follow_the_two_state_model() {
    // Mean burst 1/0.25 = 4 datagrams; bad for 0.01/(0.01+0.25) ≈ 3.8 % of them.
    let (d, out) = run(
        Impairment::new().bursts(GilbertElliott::new(0.01, 0.25)),
        50_000,
    );
    let lost = d.stats.lost as f64 / 50_000.0;
    assert!((0.03..0.047).contains(&lost), "lost {lost}");
    // Losses come in runs: the mean run of consecutive losses is well above one.
    let got: Vec<u32> = out.iter().map(|o| o.0).collect();
    let mut runs = 0;
    let mut prev = 0u32;
    for &k in &got {
        if k > prev + 1 {
            runs += 1;
        }
        prev = k;
    }
    let mean_run = d.stats.lost as f64 / runs as f64;
    assert!(mean_run > 3.0, "mean run {mean_run}");
}

#[test]
fn rate_limit_spaces_datagrams_after_the_burst_and_bounds_the_queue() {
    // 100-byte datagrams at 10 kB/s: one per 10 ms once the 1000-byte bucket is spent.
    let mut d = Direction::new(
        Impairment::new().rate(RateLimit::new(10_000).burst_bytes(1_000)),
        1,
        50,
    );
    let t0 = Instant::now();
    for _ in 0..100 {
        d.offer(t0, addr(), &[0u8; 100]);
    }
    assert_eq!(d.held(), 50);
    assert_eq!(d.stats.queue_drops, 50);
    let mut dues = Vec::new();
    while let Some(due) = d.next_due() {
        let h = d.pop_due(due).unwrap();
        dues.push(h.due - t0);
    }
    assert!(dues[..11].iter().all(|d| d.is_zero()));
    assert_eq!(dues[11], Duration::from_millis(10));
    assert_eq!(dues[49], Duration::from_millis(390));
}

#[test]
fn capture_and_release_keep_the_bytes_and_destination() {
    let c = LinkConditioner::new(
        Impairment::new(),
        Impairment::new().delay(Duration::from_millis(1)),
    );
    let mut cond = Conditioner::new(&c, 0).unwrap();
    let mut batch = SendBatch::new(8);
    batch.push(addr(), b"hello").unwrap();
    let t0 = Instant::now();
    cond.capture(t0, &mut batch);
    assert!(batch.is_empty());
    cond.release(t0, &mut batch);
    assert!(batch.is_empty());
    assert_eq!(cond.next_due(), Some(t0 + Duration::from_millis(1)));
    cond.release(t0 + Duration::from_millis(1), &mut batch);
    let e = batch.pending()[0];
    assert_eq!((e.dst, batch.payload(&e)), (addr(), &b"hello"[..]));
}

#[test]
fn a_session_conditioned_on_its_own_meets_only_its_impairment() {
    let ms = Duration::from_millis;
    let other: SocketAddr = "127.0.0.1:10".parse().unwrap();
    let ctl = ConditionerControl::new(None);
    assert!(ctl.get().is_none(), "nothing set: no conditioner");
    let slow = LinkConditioner::symmetric(Impairment::new().delay(ms(40)));
    ctl.set_peer(addr(), Some(slow));
    let mut cond = Conditioner::new(&ctl.get().unwrap(), 0).unwrap();
    let t0 = Instant::now();
    cond.inbound.offer(t0, addr(), b"slow");
    cond.inbound.offer(t0, other, b"fast");
    let h = cond.inbound.pop_due(t0).unwrap();
    assert_eq!((h.addr, &h.data[..]), (other, &b"fast"[..]));
    assert!(cond.inbound.pop_due(t0).is_none());
    assert_eq!(cond.next_due(), Some(t0 + ms(40)));
    let h = cond.inbound.pop_due(t0 + ms(40)).unwrap();
    assert_eq!(h.addr, addr());
    // The endpoint-wide settings apply to the others, the session keeps its own.
    ctl.set(Some(LinkConditioner::symmetric(
        Impairment::new().delay(ms(5)),
    )));
    let mut cond = Conditioner::new(&ctl.get().unwrap(), 0).unwrap();
    cond.outbound.offer(t0, addr(), b"slow");
    cond.outbound.offer(t0, other, b"fast");
    assert_eq!(cond.outbound.pop_due(t0 + ms(5)).unwrap().addr, other);
    assert!(cond.outbound.pop_due(t0 + ms(39)).is_none());
    ctl.set(None);
    ctl.set_peer(addr(), None);
    assert!(ctl.get().is_none(), "all cleared: no conditioner");
}

#[test]
fn a_change_of_one_session_leaves_the_others_and_the_held_datagrams_alone() {
    let ms = Duration::from_millis;
    let (a, b, c): (SocketAddr, SocketAddr, SocketAddr) = (
        "127.0.0.1:10".parse().unwrap(),
        "127.0.0.1:11".parse().unwrap(),
        "127.0.0.1:12".parse().unwrap(),
    );
    let lossy = LinkConditioner::symmetric(Impairment::new().loss(0.5).delay(ms(30)));
    let ctl = ConditionerControl::new(Some(LinkConditioner::symmetric(
        Impairment::new().delay(ms(10)),
    )));
    ctl.set_peer(a, Some(lossy));
    let mut cond = Conditioner::new(&ctl.get().unwrap(), 3).unwrap();
    // A twin that sees no change: `a`'s draws must go on the same in both.
    let mut twin = Conditioner::new(&ctl.get().unwrap(), 3).unwrap();
    let t0 = Instant::now();
    for i in 0..20u8 {
        cond.outbound.offer(t0, a, &[i]);
        twin.outbound.offer(t0, a, &[i]);
    }
    cond.outbound.offer(t0, b, b"held");
    // Session `c` gets its own settings: applied in place.
    ctl.set_peer(
        c,
        Some(LinkConditioner::symmetric(Impairment::new().delay(ms(50)))),
    );
    assert!(cond.retune(&ctl.get().unwrap()));
    // The datagram held for `b` keeps its due time (10 ms), not released at once.
    assert!(cond.outbound.pop_due(t0 + ms(9)).is_none());
    assert_eq!(cond.outbound.pop_due(t0 + ms(10)).unwrap().addr, b);
    // `a` draws on where it was: the same losses as the unchanged twin.
    for i in 20..60u8 {
        cond.outbound.offer(t0, a, &[i]);
        twin.outbound.offer(t0, a, &[i]);
    }
    assert_eq!(cond.outbound.stats.lost, twin.outbound.stats.lost);
    let kept = |d: &mut Direction| {
        let mut v = Vec::new();
        while let Some(h) = d.pop_due(t0 + ms(30)) {
            v.push(h.data[0]);
        }
        v
    };
    assert_eq!(kept(&mut cond.outbound), kept(&mut twin.outbound));
    // `c` meets its own delay.
    cond.inbound.offer(t0, c, b"c");
    assert!(cond.inbound.pop_due(t0 + ms(49)).is_none());
    assert!(cond.inbound.pop_due(t0 + ms(50)).is_some());
    // A change of the endpoint-wide settings is not applied in place (rebuilt, flushed).
    ctl.set(Some(LinkConditioner::symmetric(
        Impairment::new().delay(ms(5)),
    )));
    assert!(!cond.retune(&ctl.get().unwrap()));
}

#[test]
fn bad_settings_are_refused() {
    assert!(LinkConditioner::symmetric(Impairment::new().loss(1.5))
        .validate()
        .is_err());
    assert!(
        LinkConditioner::symmetric(Impairment::new().bursts(GilbertElliott::new(0.1, 0.0)))
            .validate()
            .is_err()
    );
    assert!(LinkConditioner::default()
        .queue_limit(0)
        .validate()
        .is_err());
    assert!(LinkConditioner::symmetric(Impairment::new().loss(0.05))
        .validate()
        .is_ok());
}
