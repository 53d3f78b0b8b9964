//! The delay controller against a deterministic model of a bottleneck: senders that use the
//! controller exactly as a connection does (window, pacing, ACKs, losses), a FIFO link of a
//! given rate (that may change) with a drop-tail buffer, a fixed one-way delay, optional random
//! loss, and a receiver that holds its ACKs like the game profile's (25 ms or 8 packets).
//! Virtual time in 50 µs steps; no clock, no randomness beyond a seeded generator.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::{Congestion, Delay, DelayParams, NewReno};

const MSS: usize = 1200;
const STEP: Duration = Duration::from_micros(50);
const ONE_WAY: Duration = Duration::from_millis(20);
const HOLD: Duration = Duration::from_millis(25);

fn params() -> DelayParams {
    DelayParams {
        mss: MSS,
        init_window: 32 * MSS,
        min_window: 4 * MSS,
        loss_tolerant: true,
        floor: 0,
        ceiling: None,
        initial_rtt: Duration::from_millis(50),
    }
}

/// One sender and its receiver.
struct Flow {
    cc: Delay,
    /// Bytes the application offers per second (`None`: always more to send).
    app_rate: Option<f64>,
    backlog: f64,
    next_pn: u64,
    /// In flight: pn → (sent, size).
    sent: BTreeMap<u64, (Instant, usize)>,
    largest_acked: Option<u64>,
    srtt: Option<Duration>,
    min_rtt: Duration,
    /// Receiver: packets received since the last ACK (pn, arrival), and when the first came.
    unacked: Vec<(u64, Instant)>,
    delivered_bytes: u64,
    /// A small urgent datagram ([`EVENT`] bytes) sent this often besides the backlog (a
    /// game's 10 Hz events), and when the next is due (time since start).
    event_every: Option<Duration>,
    next_event: Duration,
}

/// Size of a game event's datagram: on a slow link it serializes in a fraction of a full
/// datagram's time, so the minimum RTT it measures sits below every full datagram's sample.
const EVENT: usize = 64;

impl Flow {
    fn new(p: DelayParams, app_rate: Option<f64>) -> Self {
        Self {
            cc: Delay::new(p),
            app_rate,
            backlog: 0.0,
            next_pn: 0,
            sent: BTreeMap::new(),
            largest_acked: None,
            srtt: None,
            min_rtt: Duration::MAX,
            unacked: Vec::new(),
            delivered_bytes: 0,
            event_every: None,
            next_event: Duration::ZERO,
        }
    }

    /// The flow also sends a small event datagram every `every`.
    fn with_events(mut self, every: Duration) -> Self {
        self.event_every = Some(every);
        self
    }
}

/// Queue sojourns and rate estimates a run produced.
struct Run {
    /// (time since start, sojourn) per datagram that went through the link.
    sojourns: Vec<(Duration, Duration)>,
    /// (time since start, estimate per flow), every 100 ms.
    estimates: Vec<(Duration, Vec<f64>)>,
    /// Bytes each flow had delivered (received by its peer) after `from`.
    delivered_after: Vec<u64>,
    /// Link drops (buffer full) after `from`.
    dropped: u64,
}

/// Runs `flows` through a link of `rate(t)` bytes per second with a `buffer` of queue time,
/// for `seconds`; `loss(t)` is the share of datagrams lost at random before the link; bytes
/// delivered are counted after `from`.
fn run(
    flows: Vec<Flow>,
    rate: &dyn Fn(Duration) -> f64,
    buffer: Duration,
    loss: &dyn Fn(Duration) -> f64,
    seconds: f64,
    from: Duration,
) -> Run {
    run_jittered(flows, rate, buffer, loss, seconds, from, Duration::ZERO)
}

/// [`run`] with each ACK delayed by up to `jitter` more on its way back (uniform, in order): a
/// real path's ACKs come back unevenly (the peer's timers, batched receives, a busy host),
/// and a round's delivery-rate sample with them.
fn run_jittered(
    mut flows: Vec<Flow>,
    rate: &dyn Fn(Duration) -> f64,
    buffer: Duration,
    loss: &dyn Fn(Duration) -> f64,
    seconds: f64,
    from: Duration,
    jitter: Duration,
) -> Run {
    let t0 = ricochet_testkit::SimClock::new().now();
    let mut now = t0;
    let end = t0 + Duration::from_secs_f64(seconds);
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut uniform = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f64 / (1u64 << 53) as f64
    };
    // The link: FIFO of (flow, pn, size, arrival), the time the head finishes, queued bytes.
    let mut link: VecDeque<(usize, u64, usize, Instant)> = VecDeque::new();
    let mut head_done: Option<Instant> = None;
    let mut queued_bytes = 0usize;
    // Datagrams and ACKs on the wire: arrival → (flow, what).
    let mut to_receiver: VecDeque<(Instant, usize, u64, usize)> = VecDeque::new();
    let mut to_sender: VecDeque<(Instant, usize, Vec<u64>, Duration)> = VecDeque::new();
    let mut out = Run {
        sojourns: Vec::new(),
        estimates: Vec::new(),
        delivered_after: vec![0; flows.len()],
        dropped: 0,
    };
    let mut next_sample = t0;
    while now < end {
        let t = now - t0;
        // The application fills each backlog.
        for f in &mut flows {
            if let Some(r) = f.app_rate {
                f.backlog = (f.backlog + r * STEP.as_secs_f64()).min(1e6);
            } else {
                f.backlog = 1e9;
            }
        }
        // The link serves its head.
        let r = rate(t);
        loop {
            let Some(&(fi, pn, size, arrived)) = link.front() else {
                head_done = None;
                break;
            };
            let done = *head_done
                .get_or_insert_with(|| arrived.max(now) + Duration::from_secs_f64(size as f64 / r));
            if done > now {
                break;
            }
            link.pop_front();
            queued_bytes -= size;
            out.sojourns.push((t, done - arrived));
            to_receiver.push_back((done + ONE_WAY, fi, pn, size));
            head_done = link
                .front()
                .map(|&(_, _, s, _)| done + Duration::from_secs_f64(s as f64 / r));
        }
        // Receivers: datagrams arrive; an ACK leaves after 8 packets or the hold.
        while to_receiver.front().is_some_and(|&(at, ..)| at <= now) {
            let Some((_, fi, pn, size)) = to_receiver.pop_front() else {
                break;
            };
            let f = &mut flows[fi];
            f.unacked.push((pn, now));
            f.delivered_bytes += size as u64;
            if t >= from {
                out.delivered_after[fi] += size as u64;
            }
        }
        for (fi, f) in flows.iter_mut().enumerate() {
            let due = f
                .unacked
                .first()
                .is_some_and(|&(_, first)| f.unacked.len() >= 8 || now >= first + HOLD);
            if due {
                let pns: Vec<u64> = f.unacked.iter().map(|&(pn, _)| pn).collect();
                let largest_at = f.unacked.iter().max_by_key(|&&(pn, _)| pn).map(|x| x.1);
                let held = largest_at.map_or(Duration::ZERO, |a| now - a);
                f.unacked.clear();
                // No draw without jitter: the other tests' random streams stay as they were.
                let extra = if jitter.is_zero() {
                    Duration::ZERO
                } else {
                    jitter.mul_f64(uniform())
                };
                let at = now + ONE_WAY + extra;
                let at = to_sender.back().map_or(at, |b| at.max(b.0));
                to_sender.push_back((at, fi, pns, held));
            }
        }
        // Senders: ACKs arrive.
        while to_sender.front().is_some_and(|&(at, ..)| at <= now) {
            let Some((_, fi, pns, held)) = to_sender.pop_front() else {
                break;
            };
            let f = &mut flows[fi];
            let mut largest: Option<(u64, Instant)> = None;
            for pn in pns {
                if let Some((sent, size)) = f.sent.remove(&pn) {
                    f.cc.on_acked(size, sent);
                    if largest.is_none_or(|(l, _)| pn > l) {
                        largest = Some((pn, sent));
                    }
                }
            }
            let sample = largest.map(|(_, sent)| (now - sent).saturating_sub(held));
            if let Some((pn, _)) = largest {
                f.largest_acked = Some(f.largest_acked.map_or(pn, |l| l.max(pn)));
            }
            if let Some(s) = sample {
                f.min_rtt = f.min_rtt.min(s);
                f.srtt = Some(f.srtt.map_or(s, |x| (x * 7 + s) / 8));
            }
            // Packet-threshold loss detection.
            if let Some(la) = f.largest_acked {
                let lost: Vec<u64> = f
                    .sent
                    .range(..la.saturating_sub(2))
                    .map(|(&p, _)| p)
                    .collect();
                if !lost.is_empty() {
                    for p in lost {
                        if let Some((_, size)) = f.sent.remove(&p) {
                            f.cc.on_removed(size);
                        }
                    }
                    f.cc.on_loss();
                }
            }
            let srtt = f.srtt.unwrap_or(Duration::from_millis(50));
            f.cc.on_ack_end(now, sample, srtt);
        }
        // Retransmission timeout: nothing acknowledged for three RTTs (100 ms before a sample)
        // after the oldest packet in flight: everything in flight is lost.
        for f in &mut flows {
            let rto = f.srtt.map_or(Duration::from_millis(100), |s| {
                (s * 3).max(Duration::from_millis(30))
            });
            let oldest = f.sent.values().map(|&(sent, _)| sent).min();
            if oldest.is_some_and(|o| now >= o + rto) {
                let srtt = f.srtt.unwrap_or_default();
                let queueing = f.srtt.is_none()
                    || srtt > f.min_rtt + (f.min_rtt / 8).max(Duration::from_millis(2));
                for (_, (_, size)) in std::mem::take(&mut f.sent) {
                    f.cc.on_removed(size);
                }
                f.cc.on_rto(queueing);
            }
        }
        // Senders send what the window, the pacer and the backlog allow, starting from a
        // different one each step (their datagrams interleave at the link).
        let first = (uniform() * flows.len() as f64) as usize;
        for k in 0..flows.len() {
            let fi = (first + k) % flows.len();
            let f = &mut flows[fi];
            loop {
                // A due event goes first (a high-priority lane), then the backlog.
                let event = f.event_every.is_some() && t >= f.next_event;
                let size = if event { EVENT } else { MSS };
                if !(event || f.backlog >= MSS as f64)
                    || !f.cc.can_send(size)
                    || f.cc.pacing_delay(now, size).is_some()
                {
                    break;
                }
                if let (true, Some(every)) = (event, f.event_every) {
                    f.next_event += every;
                } else {
                    f.backlog -= MSS as f64;
                }
                f.cc.on_sent(size);
                let pn = f.next_pn;
                f.next_pn += 1;
                f.sent.insert(pn, (now, size));
                if uniform() < loss(t) {
                    continue;
                }
                if (queued_bytes + size) as f64 > r * buffer.as_secs_f64() {
                    out.dropped += u64::from(t >= from);
                    continue;
                }
                queued_bytes += size;
                link.push_back((fi, pn, size, now));
            }
        }
        if now >= next_sample {
            out.estimates
                .push((t, flows.iter().map(|f| f.cc.rate_estimate()).collect()));
            next_sample += Duration::from_millis(100);
        }
        now += STEP;
    }
    out
}

fn percentile(mut v: Vec<Duration>, q: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)]
}

const MBIT: f64 = 125_000.0;

/// One backlogged flow on a 1 Mbit/s link with a 100 ms buffer: the queue stays short (most
/// datagrams find the link idle: their sojourn is their own 9.6 ms of serialization; once
/// settled the probe's queue is all there is), the estimate settles within 20 % of the rate
/// after 2 s, and the flow gets most of the link.
#[test]
fn keeps_the_queue_short_and_estimates_the_rate() {
    let flows = vec![Flow::new(params(), None)];
    let r = run(
        flows,
        &|_| MBIT,
        Duration::from_millis(100),
        &|_| 0.0,
        10.0,
        Duration::from_secs(2),
    );
    let late: Vec<Duration> = r
        .sojourns
        .iter()
        .filter(|(t, _)| *t >= Duration::from_secs(2))
        .map(|x| x.1)
        .collect();
    let p50 = percentile(late, 0.5);
    // Once settled, the probe's queue is all there is: a few ms above one datagram's.
    let settled: Vec<Duration> = r
        .sojourns
        .iter()
        .filter(|(t, _)| *t >= Duration::from_secs(4))
        .map(|x| x.1)
        .collect();
    let p99 = percentile(settled, 0.99);
    let serialization = Duration::from_secs_f64(MSS as f64 / MBIT);
    assert!(
        p50 <= serialization + Duration::from_millis(1),
        "queue p50 {p50:?} (p99 {p99:?})"
    );
    assert!(
        p99 <= Duration::from_millis(25),
        "settled queue p99 {p99:?}"
    );
    for (t, e) in r
        .estimates
        .iter()
        .filter(|(t, _)| *t >= Duration::from_secs(2))
    {
        let err = (e[0] - MBIT).abs() / MBIT;
        assert!(err <= 0.2, "estimate {:.0} B/s at {t:?}", e[0]);
    }
    let throughput = r.delivered_after[0] as f64 / 8.0;
    assert!(throughput >= 0.85 * MBIT, "{throughput:.0} B/s");
    assert_eq!(r.dropped, 0);
}

/// A game sending 1.25 Mbit/s through a link that falls from 4 to 1 Mbit/s at 5 s: within a
/// second the estimate is within 20 % of the new rate, and stays there.
#[test]
fn follows_a_rate_step_down_within_a_second() {
    let flows = vec![Flow::new(params(), Some(1.25 * MBIT))];
    let rate = |t: Duration| {
        if t < Duration::from_secs(5) {
            4.0 * MBIT
        } else {
            MBIT
        }
    };
    let r = run(
        flows,
        &rate,
        Duration::from_millis(100),
        &|_| 0.0,
        10.0,
        Duration::ZERO,
    );
    for (t, e) in r
        .estimates
        .iter()
        .filter(|(t, _)| *t >= Duration::from_secs(6))
    {
        let err = (e[0] - MBIT).abs() / MBIT;
        assert!(err <= 0.2, "estimate {:.0} B/s at {t:?}", e[0]);
    }
    // Before the step the game sent less than the path carries: the estimate is at least
    // what it sent (it cannot know more).
    let before = r
        .estimates
        .iter()
        .find(|(t, _)| *t >= Duration::from_millis(4900))
        .map(|(_, e)| e[0])
        .unwrap_or_default();
    assert!(
        before >= 1.2 * MBIT,
        "estimate before the step {before:.0} B/s"
    );
}

/// 5 % random loss on a 10 Mbit/s link without a queue is not congestion: the estimate and the
/// throughput stay near the link rate.
#[test]
fn random_loss_does_not_collapse_the_rate() {
    let flows = vec![Flow::new(params(), None)];
    let c = 10.0 * MBIT;
    let r = run(
        flows,
        &|_| c,
        Duration::from_millis(100),
        &|_| 0.05,
        8.0,
        Duration::from_secs(2),
    );
    let last = r.estimates.last().map(|(_, e)| e[0]).unwrap_or_default();
    assert!(last >= 0.8 * c, "estimate {last:.0} B/s");
    let throughput = r.delivered_after[0] as f64 / 6.0;
    assert!(throughput >= 0.75 * c, "{throughput:.0} B/s");
}

/// Three seconds in which every datagram is lost (a server socket that overflows, a Wi-Fi
/// that drops out), then the path comes back: the sender must pick up again at once. Before,
/// each congestion RTO of the outage halved the estimate (and a round spanning it cut it to
/// what it delivered over the three seconds), the pacer fell to a few bytes per second, too
/// slow for a round to end and a new sample to raise it again: the sender stalled for good
/// (`tests/fec_parity_flight.rs` with this controller: 184 of 360 reliable inputs).
#[test]
fn an_outage_does_not_stall_the_sender() {
    let app = 0.5 * MBIT;
    for loss_tolerant in [false, true] {
        let flows = vec![Flow::new(
            DelayParams {
                loss_tolerant,
                ..params()
            },
            Some(app),
        )];
        let outage = |t: Duration| {
            if t >= Duration::from_secs(2) && t < Duration::from_secs(5) {
                1.0
            } else {
                0.0
            }
        };
        let r = run(
            flows,
            &|_| MBIT,
            Duration::from_millis(100),
            &outage,
            10.0,
            Duration::from_secs(6),
        );
        // From a second after the outage the game's offer (and the backlog it left) goes
        // through: at least what it offers in those 4 s.
        let throughput = r.delivered_after[0] as f64 / 4.0;
        assert!(
            throughput >= 0.95 * app,
            "loss tolerant {loss_tolerant}: {throughput:.0} B/s after the outage, estimates {:?}",
            r.estimates
                .iter()
                .filter(|(t, _)| *t >= Duration::from_secs(5))
                .map(|(_, e)| e[0] as u64)
                .step_by(5)
                .collect::<Vec<_>>()
        );
        let last = r.estimates.last().map(|(_, e)| e[0]).unwrap_or_default();
        assert!(
            last >= 0.9 * app,
            "loss tolerant {loss_tolerant}: estimate {last:.0} B/s"
        );
    }
}

/// Sixteen games each offering 1.25 Mbit/s through a shared 10 Mbit/s link (the server's
/// uplink of `bench lanes uplink-shared`) share it: each gets within 35 % of the mean after the
/// first 2 s (the model's seeds give 20-31 % for the largest share; without the probe's
/// additive term, shares drifted 3x apart), and the link stays busy.
#[test]
fn sixteen_flows_share_the_link_fairly() {
    let flows = (0..16)
        .map(|_| Flow::new(params(), Some(1.25 * MBIT)))
        .collect();
    let c = 10.0 * MBIT;
    let r = run(
        flows,
        &|_| c,
        Duration::from_millis(100),
        &|_| 0.0,
        10.0,
        Duration::from_secs(2),
    );
    let total: u64 = r.delivered_after.iter().sum();
    let mean = total as f64 / 16.0;
    for &d in &r.delivered_after {
        assert!(
            (d as f64 - mean).abs() <= 0.35 * mean,
            "shares {:?}",
            r.delivered_after
        );
    }
    assert!(total as f64 / 8.0 >= 0.8 * c, "{total} bytes in 8 s");
}

/// The ceiling bounds the rate on a faster path; the floor holds on a slower one.
#[test]
fn floor_and_ceiling_bound_the_rate() {
    let ceiling = 50_000u64;
    let flows = vec![Flow::new(
        DelayParams {
            ceiling: Some(ceiling),
            ..params()
        },
        None,
    )];
    let r = run(
        flows,
        &|_| MBIT,
        Duration::from_millis(100),
        &|_| 0.0,
        6.0,
        Duration::from_secs(2),
    );
    let throughput = r.delivered_after[0] as f64 / 4.0;
    assert!(throughput <= 1.02 * ceiling as f64, "{throughput:.0} B/s");
    assert!(throughput >= 0.95 * ceiling as f64, "{throughput:.0} B/s");
    assert!(r.estimates.iter().all(|(_, e)| e[0] <= ceiling as f64));

    let floor = 100_000u64;
    let flows = vec![Flow::new(DelayParams { floor, ..params() }, None)];
    let r = run(
        flows,
        &|_| 0.5 * MBIT,
        Duration::from_millis(100),
        &|_| 0.0,
        6.0,
        Duration::from_secs(2),
    );
    assert!(r.estimates.iter().all(|(_, e)| e[0] >= floor as f64));
}

/// A connection with the default controller is no larger than before the delay controller
/// existed (it is boxed): the gate weighs a session's memory exactly.
#[test]
fn the_default_controller_costs_no_memory() {
    assert_eq!(
        std::mem::size_of::<Congestion>(),
        std::mem::size_of::<NewReno>()
    );
}

/// A game offering more than the path (1.2 Mbit/s into 1 Mbit/s, 100 ms buffer): startup
/// fills the buffer for a few rounds before it sees the queue, and that queue must be drained
/// at once, not at cruise's 5 % a round (a game's urgent messages wait behind it).
#[test]
fn startup_overshoot_drains_within_a_second() {
    let flows = vec![Flow::new(params(), Some(1.2 * MBIT))];
    let r = run(
        flows,
        &|_| MBIT,
        Duration::from_millis(100),
        &|_| 0.0,
        4.0,
        Duration::from_secs(1),
    );
    let after: Vec<Duration> = r
        .sojourns
        .iter()
        .filter(|(t, _)| *t >= Duration::from_secs(1))
        .map(|x| x.1)
        .collect();
    let peak = r.sojourns.iter().map(|x| x.1).max().unwrap_or_default();
    let p99 = percentile(after, 0.99);
    assert!(
        p99 <= Duration::from_millis(25),
        "queue p99 after 1 s {p99:?} (peak {peak:?})"
    );
    assert_eq!(r.dropped, 0);
}

/// A game offering more than the path (1.2 Mbit/s into 1 Mbit/s, 100 ms buffer): the queue
/// startup builds before it sees the path's limit stays short (a game's first urgent messages
/// wait behind it). Before, startup ended only at the end of the round whose every sample
/// showed the queue, a round or two after the samples did: a peak of 76.9 ms in this model
/// (57.7 ms since; 46.5 ms since the drain spends no tokens startup saved; the rest is the
/// RTT the queue takes to show at all, at 20 % over the path).
#[test]
fn startup_ends_on_the_first_queue() {
    let flows = vec![Flow::new(params(), Some(1.2 * MBIT))];
    let r = run(
        flows,
        &|_| MBIT,
        Duration::from_millis(100),
        &|_| 0.0,
        3.0,
        Duration::ZERO,
    );
    let peak = r.sojourns.iter().map(|x| x.1).max().unwrap_or_default();
    let serialization = Duration::from_secs_f64(MSS as f64 / MBIT);
    assert!(
        peak <= serialization + Duration::from_millis(40),
        "queue peak {peak:?}"
    );
    assert_eq!(r.dropped, 0);
}

/// A game offering more than a 4 Mbit/s path whose ACKs come back with up to 8 ms of jitter:
/// the rounds' delivery samples scatter, and the estimate stays within 20 % of the path after
/// 2 s (0.86-1.10 of it). A guard on the cap by a busy round's ACK rate: a version that
/// also capped on rounds whose ACKs came at the rate sent (a slower datagram, not a queue)
/// ratcheted the estimate down to 0.78 of the path here.
#[test]
fn jittery_acks_keep_the_estimate_near_the_path() {
    let c = 4.0 * MBIT;
    let flows = vec![Flow::new(params(), Some(1.2 * c))];
    let r = run_jittered(
        flows,
        &|_| c,
        Duration::from_millis(100),
        &|_| 0.0,
        10.0,
        Duration::from_secs(2),
        Duration::from_millis(8),
    );
    for (t, e) in r
        .estimates
        .iter()
        .filter(|(t, _)| *t >= Duration::from_secs(2))
    {
        let err = (e[0] - c).abs() / c;
        assert!(err <= 0.2, "estimate {:.0} B/s at {t:?}", e[0]);
    }
    assert_eq!(r.dropped, 0);
}

/// A game offering 1.2 Mbit/s to a lone 1 Mbit/s path (100 ms buffer, 20 ms each way; `bench
/// lanes downlink-1mbit`) with a 64 B event every 100 ms and ACKs jittered by up to 4 ms:
/// once startup is over the queue stays short throughout, the probe cycle's included (most
/// datagrams find the link idle: a sojourn of their own 9.6 ms of serialization), and the
/// estimate stays within 20 % of the path. Before, the events' minimum RTT (9 ms of
/// serialization below a full datagram's) and the jitter made cruise rounds look queued, the
/// cuts turned on a fairness term meant for shared paths (4 datagrams per RTT in the probe),
/// and its queue peaked at 64.7 ms every probe cycle (the bench's 55-65 ms event spikes).
#[test]
#[ignore = "issue 38: fails (max 24.1 ms; 64.7 ms with 4 datagrams per RTT as the fairness \
            term's probe); comparing full datagrams' samples with their own \
            floor (commits 989cc17, 8d0d52a) passes it (19.3 ms) but put a 74 ms queue at \
            1.7 s into bench lanes downlink-1mbit (event p99 83 ms in 7 of 9 runs, main 69 \
            in 9 of 9): reverted"]
fn a_lone_flow_keeps_the_queue_short_through_its_probes() {
    let flows = vec![Flow::new(params(), Some(1.2 * MBIT)).with_events(Duration::from_millis(100))];
    let r = run_jittered(
        flows,
        &|_| MBIT,
        Duration::from_millis(100),
        &|_| 0.0,
        10.0,
        Duration::from_secs(2),
        Duration::from_millis(4),
    );
    let late: Vec<Duration> = r
        .sojourns
        .iter()
        .filter(|(t, _)| *t >= Duration::from_secs(2))
        .map(|x| x.1)
        .collect();
    let max = late.iter().copied().max().unwrap_or_default();
    let p50 = percentile(late, 0.5);
    assert!(
        p50 <= Duration::from_millis(10),
        "queue p50 {p50:?} (max {max:?})"
    );
    // Two datagrams' serialization and the ACKs' jitter: a probe's one datagram of queue.
    let serialization = Duration::from_secs_f64(MSS as f64 / MBIT);
    assert!(
        max <= 2 * serialization + Duration::from_millis(2),
        "queue max after 2 s {max:?}"
    );
    for (t, e) in r
        .estimates
        .iter()
        .filter(|(t, _)| *t >= Duration::from_secs(2))
    {
        let err = (e[0] - MBIT).abs() / MBIT;
        assert!(err <= 0.2, "estimate {:.0} B/s at {t:?}", e[0]);
    }
    assert_eq!(r.dropped, 0);
}

/// Sixteen games each offering 1.25 Mbit/s through a shared 10 Mbit/s link with a 100 ms
/// buffer (`bench lanes uplink-shared`), 10 s: the shared queue's p50 after the first 2 s,
/// the fewest bytes delivered after 2 s over the most, and all bytes delivered after 2 s.
fn sixteen_flows_on_a_shared_link() -> (Duration, f64, u64) {
    let flows = (0..16)
        .map(|_| Flow::new(params(), Some(1.25 * MBIT)))
        .collect();
    let r = run(
        flows,
        &|_| 10.0 * MBIT,
        Duration::from_millis(100),
        &|_| 0.0,
        10.0,
        Duration::from_secs(2),
    );
    let late: Vec<Duration> = r
        .sojourns
        .iter()
        .filter(|(t, _)| *t >= Duration::from_secs(2))
        .map(|x| x.1)
        .collect();
    let fewest = r.delivered_after.iter().copied().min().unwrap_or_default();
    let most = r.delivered_after.iter().copied().max().unwrap_or(1);
    let total = r.delivered_after.iter().sum();
    (percentile(late, 0.5), fewest as f64 / most as f64, total)
}

/// Sixteen flows sharing a bottleneck do not keep its buffer full: the shared queue's p50
/// stays under 15 ms (under a datagram of each flow's), the link busy, and the shares no
/// further apart than 0.6 (fewest/most). Before, a round over the standing queue could raise
/// the estimate: a flow's ACKs then come at its share of the busy FIFO, in proportion to what
/// it sent, so every probe (1.15 times the estimate plus the fairness term's 4 datagrams per
/// RTT) seemed to find more, each estimate ratcheted past its share and the buffer stayed
/// full (queue p50 97.4 ms, fewest/most 0.54; with only the ratchet removed, 8.2 ms and
/// 0.53; with the fairness term cut to one datagram per RTT as well, 4.3 ms and 0.68).
#[test]
fn sixteen_flows_keep_the_shared_queue_short() {
    let (p50, fairness, total) = sixteen_flows_on_a_shared_link();
    assert!(p50 <= Duration::from_millis(15), "queue p50 {p50:?}");
    assert!(fairness >= 0.6, "fewest/most {fairness:.2}");
    assert!(
        total as f64 / 8.0 >= 0.8 * 10.0 * MBIT,
        "{total} bytes in 8 s"
    );
}

/// Issue 38's goal for `bench lanes uplink-shared`: the sixteen flows share the link fairly
/// (the fewest bytes delivered at least 0.75 of the most after the first 2 s) while keeping
/// the shared queue short (p50 ≤ 15 ms).
#[test]
#[ignore = "issue 38: fewest/most 0.68 (queue p50 4.3 ms): a delay-based cut is proportional \
            to each flow's rate and the probe's fairness term (one datagram per RTT) is slow \
            to close the gaps startup's exit leaves (0.45-0.9 of the fair share); \
            Vegas/FAST-style own-queue rules reached only 0.41-0.78 and cost the step-down \
            or jittered-ACK tests"]
fn sixteen_flows_share_fairly_with_a_short_queue() {
    let (p50, fairness, _) = sixteen_flows_on_a_shared_link();
    assert!(
        fairness >= 0.75,
        "fewest/most {fairness:.2}, queue p50 {p50:?}"
    );
    assert!(p50 <= Duration::from_millis(15), "queue p50 {p50:?}");
}
