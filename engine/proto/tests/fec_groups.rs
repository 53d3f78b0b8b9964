//! End-to-end: sender → seeded lossy channel → receiver, checking that every delivered payload
//! is intact, FEC recovers shards, retention stays within budget, parity stays under the cap,
//! and the adaptive policy follows the loss.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ricochet_proto::fec::{
    DataHeader, FecConfig, FecPolicy, FecReceiver, FecSender, ParityHeader, RetentionBudget,
};

/// Deterministic payload for message `id`: the id, then bytes derived from it. `fixed` gives
/// its length, else it is random in 8..1,174.
fn payload(id: u64, rng: &mut ChaCha8Rng, fixed: Option<usize>) -> Vec<u8> {
    let len = fixed.unwrap_or_else(|| 8 + rng.random_range(0..1166usize));
    let mut p = id.to_le_bytes().to_vec();
    p.extend(
        (0..len - 8).map(|i| (id as u8).wrapping_mul(7) ^ (i as u8).wrapping_mul(13) ^ (len as u8)),
    );
    p
}

/// Checks a delivered payload is exactly what `payload` made for its id; returns the id.
fn verify(p: &[u8]) -> u64 {
    assert!(p.len() >= 8, "short payload");
    let id = u64::from_le_bytes(p[..8].try_into().unwrap());
    let len = p.len();
    for (i, b) in p[8..].iter().enumerate() {
        assert_eq!(
            *b,
            (id as u8).wrapping_mul(7) ^ (i as u8).wrapping_mul(13) ^ (len as u8),
            "payload {id} corrupted"
        );
    }
    id
}

#[derive(Clone, Copy, Debug)]
enum Loss {
    None,
    /// Independent loss with this probability.
    Random(f64),
    /// `n` consecutive datagrams lost out of every 100.
    Burst(u32),
}

/// A seeded lossy link. Under loss it also duplicates 1% of datagrams and holds 5% back by
/// 40 steps (past the receiver's reorder distance), like the reference's impaired profiles.
struct Channel {
    rng: ChaCha8Rng,
    loss: Loss,
    count: u64,
    burst_at: u64,
}

/// Probability a datagram is duplicated, and that it is held back, on a lossy link.
const DUPLICATE: f64 = 0.01;
const HOLD_BACK: f64 = 0.05;

impl Channel {
    fn new(seed: u64, loss: Loss) -> Self {
        Channel {
            rng: ChaCha8Rng::seed_from_u64(seed),
            loss,
            count: 0,
            burst_at: 0,
        }
    }

    /// Delays (in steps) of the copies of one datagram that get through: none if lost.
    fn transmit(&mut self) -> Vec<u64> {
        if self.drops() {
            return vec![];
        }
        let impaired = !matches!(self.loss, Loss::None);
        let mut d = self.rng.random_range(0..3);
        if impaired && self.rng.random_bool(HOLD_BACK) {
            d += 40;
        }
        let mut v = vec![d];
        if impaired && self.rng.random_bool(DUPLICATE) {
            v.push(d + self.rng.random_range(0..10));
        }
        v
    }

    fn drops(&mut self) -> bool {
        let i = self.count;
        self.count += 1;
        match self.loss {
            Loss::None => false,
            Loss::Random(p) => self.rng.random_bool(p),
            Loss::Burst(n) => {
                if i % 100 == 0 {
                    self.burst_at = i + self.rng.random_range(0..100 - u64::from(n));
                }
                i >= self.burst_at && i < self.burst_at + u64::from(n)
            }
        }
    }
}

#[derive(Default)]
struct Outcome {
    sent: u64,
    through: HashSet<u64>,
    delivered: HashSet<u64>,
    /// Per group (first seq): (data body bytes, parity body bytes), in send order.
    groups: BTreeMap<u64, (u64, u64)>,
    data_bytes: u64,
    parity_bytes: u64,
}

/// Runs `n` messages through sender → channel → receiver (0–2 steps of jitter plus the
/// channel's impairments), the receiver's loss reports fed back every 50 messages.
fn run(
    cfg: FecConfig,
    loss: Loss,
    fixed_len: Option<usize>,
    seed: u64,
    n: u64,
    tx: &mut FecSender,
    rx: &mut FecReceiver,
) -> Outcome {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut chan = Channel::new(seed ^ 0x5eed, loss);
    let mut now = Instant::now();
    let mut out = Outcome::default();
    let mut body = vec![0u8; cfg.max_parity_body()];
    // (deliver at step, is parity, body)
    let mut in_flight: Vec<(u64, bool, Vec<u8>)> = Vec::new();
    let mut seq_ext = 0u64;
    for step in 0..n + 100 {
        if step < n {
            let p = payload(step, &mut rng, fixed_len);
            let len = tx.protect(now, &p, &mut body).unwrap();
            out.sent += 1;
            out.data_bytes += len as u64;
            let (h, _) = DataHeader::parse(&body[..len]).unwrap();
            // Unwrap the 16-bit seq (the test sends far fewer than 65,536 per wrap check).
            seq_ext = (seq_ext & !0xFFFF) | u64::from(h.seq);
            out.groups
                .entry(seq_ext - u64::from(h.index))
                .or_default()
                .0 += len as u64;
            let copies = chan.transmit();
            if !copies.is_empty() {
                out.through.insert(step);
            }
            for d in copies {
                in_flight.push((step + d, false, body[..len].to_vec()));
            }
        }
        while let Some(len) = tx.poll_parity(now, &mut body) {
            out.parity_bytes += len as u64;
            let (h, _) = ParityHeader::parse(&body[..len]).unwrap();
            let first = (seq_ext & !0xFFFF) | u64::from(h.first_seq);
            let first = if first > seq_ext {
                first - 0x10000
            } else {
                first
            };
            out.groups.entry(first).or_default().1 += len as u64;
            for d in chan.transmit() {
                in_flight.push((step + d, true, body[..len].to_vec()));
            }
        }
        in_flight.sort_by_key(|e| e.0);
        while in_flight.first().is_some_and(|e| e.0 <= step) {
            let (_, parity, b) = in_flight.remove(0);
            let delivered = &mut out.delivered;
            let mut deliver = |p: &[u8]| {
                let id = verify(p);
                assert!(delivered.insert(id), "payload {id} delivered twice");
            };
            if parity {
                rx.on_parity(now, &b, &mut deliver).unwrap();
            } else {
                rx.on_data(now, &b, &mut deliver).unwrap();
            }
        }
        if step % 50 == 49 {
            tx.on_loss_report_detail(rx.loss_report_detail());
        }
        // Mostly back-to-back sends, sometimes a pause longer than the group wait.
        now += if rng.random_bool(0.05) {
            Duration::from_millis(5)
        } else {
            Duration::from_micros(100)
        };
        rx.handle_timeout(now);
    }
    out
}

/// Parity stays within `percent` of data over every prefix of the run and over every run of
/// `w` consecutive groups ending with a group that carries parity.
fn assert_cap(out: &Outcome, w: usize, percent: u64) {
    let groups: Vec<(u64, u64)> = out.groups.values().copied().collect();
    let (mut total_d, mut total_p) = (0, 0);
    for end in 0..groups.len() {
        total_d += groups[end].0;
        total_p += groups[end].1;
        assert!(total_p * 100 <= total_d * percent, "history to group {end}");
        if groups[end].1 == 0 {
            continue;
        }
        let win = &groups[end.saturating_sub(w - 1)..=end];
        let (d, p): (u64, u64) = win.iter().fold((0, 0), |a, g| (a.0 + g.0, a.1 + g.1));
        assert!(
            p * 100 <= d * percent,
            "window ending at group {end}: parity {p} > {percent}% of {d}"
        );
    }
    assert!(out.parity_bytes * 100 <= out.data_bytes * percent);
}

fn check_common(out: &Outcome, tx: &FecSender, rx: &FecReceiver) {
    let budget = rx.budget();
    // Everything the channel let through arrives; FEC only ever adds.
    for id in &out.through {
        assert!(
            out.delivered.contains(id),
            "received payload {id} not delivered"
        );
    }
    assert!(budget.peak() <= budget.limit());
    assert!(rx.stats().peak_retained_bytes <= budget.limit());
    assert_eq!(rx.stats().malformed.total(), 0);
    let cfg = tx.config();
    assert!(tx.stats().peak_window_parity_permille <= u64::from(cfg.parity_cap_percent) * 10);
    assert_cap(
        out,
        cfg.cap_window_groups,
        u64::from(cfg.parity_cap_percent),
    );
}

#[test]
fn fixed_parity_recovers_random_loss() {
    let cfg = FecConfig::default().with(|c| c.policy = FecPolicy::Fixed { parity: 2 });
    let mut tx = FecSender::new(cfg);
    let mut rx = FecReceiver::with_budget(cfg, RetentionBudget::default());
    let out = run(cfg, Loss::Random(0.05), None, 1, 10_000, &mut tx, &mut rx);
    check_common(&out, &tx, &rx);
    let s = rx.stats();
    let lost = out.sent - out.through.len() as u64;
    // Shards rebuilt before their (reordered) datagram arrived count as recovered too, and
    // the late datagram is then dropped as a duplicate, like the link's own duplicates.
    let rebuilt_lost = (out.delivered.len() - out.through.len()) as u64;
    eprintln!(
        "fixed 2, random 5%: rebuilt {rebuilt_lost} of {lost} lost, parity/data {:.1}%",
        out.parity_bytes as f64 * 100.0 / out.data_bytes as f64
    );
    assert!(rebuilt_lost > lost / 2, "rebuilt {rebuilt_lost} of {lost}");
    assert!(s.data_recovered >= rebuilt_lost);
    assert!(s.duplicates >= s.data_recovered - rebuilt_lost);
    assert!(s.duplicates > 0 && s.parity_ignored > 0);
    assert!(s.groups_unrecoverable > 0 || rebuilt_lost == lost);
    assert_eq!(tx.stats().max_parity, 2);
    assert!(
        (s.realized_loss() - 0.05).abs() < 0.01,
        "{}",
        s.realized_loss()
    );
}

#[test]
fn burst_loss_is_recovered() {
    let cfg = FecConfig::default().with(|c| c.policy = FecPolicy::Fixed { parity: 3 });
    let mut tx = FecSender::new(cfg);
    let mut rx = FecReceiver::with_budget(cfg, RetentionBudget::default());
    let out = run(cfg, Loss::Burst(3), None, 2, 10_000, &mut tx, &mut rx);
    check_common(&out, &tx, &rx);
    assert!(rx.stats().data_recovered > 100, "{:?}", rx.stats());
}

#[test]
fn adaptive_is_zero_on_clean_path_and_rises_under_loss() {
    let cfg = FecConfig::default();
    assert_eq!(cfg.policy, FecPolicy::Adaptive { max_parity: 4 });
    let mut tx = FecSender::new(cfg);
    let mut rx = FecReceiver::with_budget(cfg, RetentionBudget::default());
    let clean = run(cfg, Loss::None, None, 3, 5_000, &mut tx, &mut rx);
    check_common(&clean, &tx, &rx);
    assert_eq!(tx.stats().max_parity, 0);
    assert_eq!(clean.parity_bytes, 0);
    assert_eq!(
        rx.stats().peak_retained_bytes,
        0,
        "unprotected groups are not retained"
    );

    let lossy = run(cfg, Loss::Random(0.08), None, 4, 10_000, &mut tx, &mut rx);
    check_common(&lossy, &tx, &rx);
    assert!(tx.parity_level() >= 2, "level {}", tx.parity_level());
    assert!(rx.stats().data_recovered > 0);
    let changes = tx.stats().policy_changes;
    assert!(changes >= 1);

    let _ = run(cfg, Loss::None, None, 5, 10_000, &mut tx, &mut rx);
    assert_eq!(tx.parity_level(), 0, "settles back to zero");
    assert!(tx.stats().policy_changes > changes);
}

#[test]
fn adaptive_covers_bursts() {
    let cfg = FecConfig::default();
    let mut tx = FecSender::new(cfg);
    let mut rx = FecReceiver::with_budget(cfg, RetentionBudget::default());
    let out = run(cfg, Loss::Burst(3), Some(1024), 6, 10_000, &mut tx, &mut rx);
    check_common(&out, &tx, &rx);
    // 3% loss alone would call for 2 parity shards; bursts of 3 call for 3.
    assert!(tx.parity_level() >= 3, "level {}", tx.parity_level());
    let s = rx.stats();
    let lost = out.sent - out.through.len() as u64;
    let rebuilt = (out.delivered.len() - out.through.len()) as u64;
    eprintln!(
        "adaptive burst: rebuilt {rebuilt} of {lost} lost, level {}, parity/data {:.1}%",
        tx.parity_level(),
        out.parity_bytes as f64 * 100.0 / out.data_bytes as f64
    );
    assert!(rebuilt * 2 > lost, "rebuilt {rebuilt} of {lost}: {s:?}");
}

#[test]
fn shared_budget_is_never_exceeded() {
    let cfg = FecConfig::default().with(|c| {
        c.policy = FecPolicy::Fixed { parity: 4 };
        c.max_group_age = Duration::from_secs(10);
    });
    // Two receivers draw on one budget, lent to each for its turn as an endpoint does.
    let mut budget = RetentionBudget::new(16 * 1024);
    let mut tx = [FecSender::new(cfg), FecSender::new(cfg)];
    let mut rx = [FecReceiver::new(cfg), FecReceiver::new(cfg)];
    for (i, (t, r)) in tx.iter_mut().zip(rx.iter_mut()).enumerate() {
        std::mem::swap(r.budget_mut(), &mut budget);
        let out = run(cfg, Loss::Random(0.3), None, 10 + i as u64, 3_000, t, r);
        std::mem::swap(r.budget_mut(), &mut budget);
        for id in &out.through {
            assert!(out.delivered.contains(id));
        }
    }
    assert!(budget.peak() <= budget.limit());
    assert!(budget.used() <= budget.limit());
    let s = rx[0].stats();
    assert!(s.groups_evicted + s.retention_refused > 0, "{s:?}");
    assert!(s.data_recovered > 0);
    assert_eq!(
        budget.used(),
        rx[0].stats().retained_bytes + rx[1].stats().retained_bytes
    );
}

#[test]
fn group_closes_on_wait_and_parity_follows() {
    let cfg = FecConfig::default().with(|c| c.policy = FecPolicy::Fixed { parity: 2 });
    let mut tx = FecSender::new(cfg);
    let mut rx = FecReceiver::new(cfg);
    let t0 = Instant::now();
    let mut body = vec![0u8; cfg.max_parity_body()];
    let mut data = Vec::new();
    for i in 0..4u8 {
        let n = tx
            .protect(
                t0 + Duration::from_micros(100 * u64::from(i)),
                &[i; 100],
                &mut body,
            )
            .unwrap();
        assert_eq!(n, 103, "3-byte data header");
        data.push(body[..n].to_vec());
    }
    assert_eq!(tx.poll_timeout(), Some(t0 + cfg.group_wait));
    assert_eq!(
        tx.poll_parity(t0 + Duration::from_millis(1), &mut body),
        None
    );
    let deadline = t0 + cfg.group_wait;
    let mut parity = Vec::new();
    while let Some(n) = tx.poll_parity(deadline, &mut body) {
        assert_eq!(n, 6 + 2 + 100);
        parity.push(body[..n].to_vec());
    }
    // 2 parity bodies of 108 B against 4 data bodies of 103 B would exceed the 50% cap.
    assert_eq!(parity.len(), 1);
    assert_eq!(tx.stats().groups_capped, 1);
    assert_eq!(tx.poll_timeout(), None);
    let mut got = Vec::new();
    for (i, d) in data.iter().enumerate() {
        if i != 2 {
            rx.on_data(deadline, d, |p| got.push(p.to_vec())).unwrap();
        }
    }
    rx.on_parity(deadline, &parity[0], |p| got.push(p.to_vec()))
        .unwrap();
    assert_eq!(got.len(), 4);
    assert_eq!(got[3], vec![2u8; 100], "rebuilt with its true length");
    assert_eq!(rx.stats().data_recovered, 1);
    assert_eq!(rx.stats().retained_bytes, 0, "finished group released");
    // A caller that never polls parity leaves at most MAX_QUEUED_PARITY queued.
    let mut idle =
        FecSender::new(FecConfig::default().with(|c| c.policy = FecPolicy::Fixed { parity: 4 }));
    for i in 0..8 * 40 {
        idle.protect(t0, &[i as u8; 100], &mut body).unwrap();
    }
    let mut queued = 0;
    while idle.poll_parity(t0, &mut body).is_some() {
        queued += 1;
    }
    assert_eq!(queued, ricochet_proto::fec::MAX_QUEUED_PARITY);
    let st = idle.stats();
    assert!(st.parity_dropped > 0);
    assert!(st.parity_dropped + queued as u64 <= st.groups * 4);
    // A full group closes at once, without waiting.
    let t1 = t0 + Duration::from_secs(1);
    for i in 0..8u8 {
        tx.protect(t1, &[i; 10], &mut body).unwrap();
    }
    assert!(tx.poll_parity(t1, &mut body).is_some());
}

#[test]
fn receiver_ages_out_incomplete_groups() {
    let cfg = FecConfig::default().with(|c| c.policy = FecPolicy::Fixed { parity: 1 });
    let mut tx = FecSender::new(cfg);
    let mut rx = FecReceiver::new(cfg);
    let t0 = Instant::now();
    let mut body = vec![0u8; cfg.max_parity_body()];
    for i in 0..8u8 {
        let n = tx.protect(t0, &[i; 50], &mut body).unwrap();
        if i > 1 {
            rx.on_data(t0, &body[..n], |_| {}).unwrap();
        }
    }
    let n = tx.poll_parity(t0, &mut body).unwrap();
    rx.on_parity(t0, &body[..n], |_| {
        panic!("two lost, one parity: nothing to rebuild")
    })
    .unwrap();
    assert!(rx.stats().retained_bytes > 0);
    assert_eq!(rx.poll_timeout(), Some(t0 + cfg.max_group_age));
    rx.handle_timeout(t0 + cfg.max_group_age);
    let s = rx.stats();
    assert_eq!(
        (s.retained_bytes, s.groups_expired, s.groups_unrecoverable),
        (0, 1, 1)
    );
    assert_eq!(rx.poll_timeout(), None);
}

#[test]
fn sequence_numbers_wrap() {
    // 70,000 datagrams: the 16-bit data-shard sequence wraps once.
    let cfg = FecConfig::default().with(|c| c.policy = FecPolicy::Fixed { parity: 2 });
    let mut tx = FecSender::new(cfg);
    let mut rx = FecReceiver::new(cfg);
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let mut now = Instant::now();
    let mut body = vec![0u8; cfg.max_parity_body()];
    let mut delivered = HashSet::new();
    let mut through = 0u64;
    for id in 0..70_000u64 {
        let msg = [id.to_le_bytes(), (!id).to_le_bytes()].concat();
        let n = tx.protect(now, &msg, &mut body).unwrap();
        let mut deliver = |p: &[u8]| {
            assert_eq!(p.len(), 16);
            let got = u64::from_le_bytes(p[..8].try_into().unwrap());
            assert_eq!(u64::from_le_bytes(p[8..].try_into().unwrap()), !got);
            assert!(delivered.insert(got), "{got} delivered twice");
        };
        if !rng.random_bool(0.02) {
            through += 1;
            rx.on_data(now, &body[..n], &mut deliver).unwrap();
        }
        while let Some(n) = tx.poll_parity(now, &mut body) {
            if !rng.random_bool(0.02) {
                rx.on_parity(now, &body[..n], &mut deliver).unwrap();
            }
        }
        now += Duration::from_micros(50);
    }
    let s = rx.stats();
    assert_eq!(delivered.len() as u64, through + s.data_recovered);
    assert!(s.data_recovered > 1000, "{s:?}");
    assert_eq!(s.malformed.total(), 0);
    assert!(
        (s.realized_loss() - 0.02).abs() < 0.005,
        "{}",
        s.realized_loss()
    );
}
