//! `Simulation` drives `SimNode`s on virtual time: a toy stop-and-wait ARQ over every profile,
//! hours of sparse traffic, determinism, livelock detection, rebinding.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ricochet_testkit::{Impairment, Profile, SimError, SimNode, Simulation, StopReason};

const DATA: u8 = 0;
const ACK: u8 = 1;
const RTO: Duration = Duration::from_millis(60);

/// A stop-and-wait sender: message `seq` is `seq` repeated to a length of `seq % 1,200` bytes.
struct Sender {
    peer: SocketAddr,
    seq: u32,
    limit: u32,
    /// Retransmission deadline of the outstanding message.
    rto_at: Option<Instant>,
    send_now: bool,
    sent: u64,
    retransmits: u64,
    rtts: Vec<Duration>,
    first_sent_at: Option<Instant>,
}

fn message(seq: u32) -> Vec<u8> {
    let len = seq as usize % 1200;
    seq.to_le_bytes()
        .iter()
        .copied()
        .cycle()
        .take(len)
        .collect()
}

/// Delivers messages in order, exactly once, and acknowledges every data packet.
struct Receiver {
    expected: u32,
    delivered: Vec<u32>,
    acks: VecDeque<(SocketAddr, u32)>,
    corrupt: u32,
}

enum Node {
    Sender(Sender),
    Receiver(Receiver),
}

impl SimNode for Node {
    fn handle(&mut self, now: Instant, from: SocketAddr, bytes: &[u8]) {
        match self {
            Node::Sender(s) => {
                if bytes.len() == 5 && bytes[0] == ACK {
                    let seq = u32::from_le_bytes(bytes[1..5].try_into().unwrap());
                    if seq == s.seq && s.seq < s.limit {
                        if let Some(t) = s.first_sent_at {
                            s.rtts.push(now - t);
                        }
                        s.seq += 1;
                        s.rto_at = None;
                        s.send_now = s.seq < s.limit;
                    }
                }
            }
            Node::Receiver(r) => {
                if bytes.len() >= 5 && bytes[0] == DATA {
                    let seq = u32::from_le_bytes(bytes[1..5].try_into().unwrap());
                    if bytes[5..] != message(seq)[..] {
                        r.corrupt += 1;
                        return;
                    }
                    if seq == r.expected {
                        r.delivered.push(seq);
                        r.expected += 1;
                    }
                    if seq < r.expected {
                        r.acks.push_back((from, seq));
                    }
                }
            }
        }
    }

    fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<SocketAddr> {
        match self {
            Node::Sender(s) => {
                if !s.send_now {
                    return None;
                }
                s.send_now = false;
                if s.rto_at.is_some() {
                    s.retransmits += 1;
                } else {
                    s.first_sent_at = Some(now);
                }
                s.sent += 1;
                s.rto_at = Some(now + RTO);
                buf.push(DATA);
                buf.extend_from_slice(&s.seq.to_le_bytes());
                buf.extend_from_slice(&message(s.seq));
                Some(s.peer)
            }
            Node::Receiver(r) => {
                let (to, seq) = r.acks.pop_front()?;
                buf.push(ACK);
                buf.extend_from_slice(&seq.to_le_bytes());
                Some(to)
            }
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Node::Sender(s) => s.rto_at,
            Node::Receiver(_) => None,
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        if let Node::Sender(s) = self {
            if s.rto_at.is_some_and(|t| t <= now) {
                s.send_now = true;
            }
        }
    }
}

fn client() -> SocketAddr {
    "192.0.2.10:40000".parse().unwrap()
}
fn server() -> SocketAddr {
    "198.51.100.1:7777".parse().unwrap()
}

fn arq(seed: u64, imp: Impairment, limit: u32) -> Simulation<Node> {
    let mut sim = Simulation::new(seed, imp).unwrap();
    sim.network_mut().enable_trace();
    sim.add_node(
        client(),
        Node::Sender(Sender {
            peer: server(),
            seq: 0,
            limit,
            rto_at: None,
            send_now: true,
            sent: 0,
            retransmits: 0,
            rtts: Vec::new(),
            first_sent_at: None,
        }),
    )
    .unwrap();
    sim.add_node(
        server(),
        Node::Receiver(Receiver {
            expected: 0,
            delivered: Vec::new(),
            acks: VecDeque::new(),
            corrupt: 0,
        }),
    )
    .unwrap();
    sim
}

fn sender(sim: &Simulation<Node>) -> &Sender {
    match sim.node(client()) {
        Some(Node::Sender(s)) => s,
        _ => panic!("no sender"),
    }
}
fn receiver(sim: &Simulation<Node>) -> &Receiver {
    match sim.node(server()) {
        Some(Node::Receiver(r)) => r,
        _ => panic!("no receiver"),
    }
}

#[test]
fn stop_and_wait_arq_delivers_everything_in_order_under_every_profile() {
    for profile in Profile::ALL {
        let mut imp = profile.impairment();
        // A zero-delay path would let the toy protocol run unboundedly fast; give it 5 ms.
        if imp.delay.is_zero() {
            imp.delay = Duration::from_millis(5);
        }
        let mut sim = arq(42, imp, u32::MAX);
        let stop = sim.run_for(Duration::from_secs(60)).unwrap();
        assert_eq!(stop, StopReason::Deadline);
        assert_eq!(sim.clock().elapsed(), Duration::from_secs(60));
        let (s, r) = (sender(&sim), receiver(&sim));
        assert_eq!(r.corrupt, 0);
        assert!(r
            .delivered
            .iter()
            .enumerate()
            .all(|(i, &seq)| i as u32 == seq));
        // The outstanding message may or may not have arrived yet.
        assert!(r.expected == s.seq || r.expected == s.seq + 1);
        let up = *sim.network().link_counters(client(), server()).unwrap();
        let down = *sim.network().link_counters(server(), client()).unwrap();
        assert_eq!(up.offered, s.sent);
        assert_eq!(sim.stats().delivered, up.departed + down.departed);
        let rt_per_s = f64::from(s.seq) / 60.0;
        let mut rtts = s.rtts.clone();
        rtts.sort();
        let p99 = rtts[rtts.len() * 99 / 100];
        println!(
            "{profile}: {} messages in 60 s simulated ({rt_per_s:.0}/s), p99 RTT {p99:?}, \
             {} retransmits, realized loss up {:.3} down {:.3}",
            s.seq,
            s.retransmits,
            up.realized_loss(),
            down.realized_loss()
        );
        match profile {
            Profile::None => {
                assert_eq!((s.retransmits, up.dropped() + down.dropped()), (0, 0));
                // Exactly one 10 ms round trip per message.
                assert_eq!(s.seq, 6_000);
                assert_eq!(p99, Duration::from_millis(10));
            }
            _ => {
                assert!(s.retransmits > 0);
                // A round trip takes at least 2 × 10 ms.
                assert!(rtts[0] >= Duration::from_millis(20));
            }
        }
    }
}

#[test]
fn simulation_is_deterministic_per_seed() {
    let run = |seed| {
        let mut sim = arq(seed, Profile::Sustained.impairment(), u32::MAX);
        sim.run_for(Duration::from_secs(20)).unwrap();
        let s = sender(&sim);
        (
            sim.network().trace_hash().unwrap(),
            s.seq,
            s.retransmits,
            s.rtts.clone(),
            sim.stats(),
        )
    };
    let a = run(7);
    assert!(a == run(7));
    let b = run(8);
    assert_ne!(a.0, b.0);
    assert!(a.3 != b.3);
}

#[test]
fn finished_run_goes_idle_and_condition_stops_early() {
    let mut sim = arq(1, Profile::Random.impairment(), 50);
    let deadline = sim.now() + Duration::from_secs(3600);
    assert_eq!(
        sim.run_while(deadline, |sim| receiver(sim).delivered.len() < 10)
            .unwrap(),
        StopReason::Condition
    );
    assert_eq!(receiver(&sim).delivered.len(), 10);
    assert!(sim.clock().elapsed() < Duration::from_secs(5));
    assert_eq!(sim.run_until(deadline).unwrap(), StopReason::Idle);
    assert_eq!(sim.now(), deadline);
    assert_eq!(receiver(&sim).delivered.len(), 50);
}

/// Sends a heartbeat every `every`; counts echoes.
struct Heartbeat {
    peer: SocketAddr,
    every: Duration,
    next: Instant,
    due: bool,
    echoes: u64,
}
/// Echoes every datagram back.
#[derive(Default)]
struct Echo {
    out: VecDeque<(SocketAddr, Vec<u8>)>,
}
enum Beat {
    Heartbeat(Heartbeat),
    Echo(Echo),
}
impl SimNode for Beat {
    fn handle(&mut self, _now: Instant, from: SocketAddr, bytes: &[u8]) {
        match self {
            Beat::Heartbeat(h) => h.echoes += 1,
            Beat::Echo(e) => e.out.push_back((from, bytes.to_vec())),
        }
    }
    fn poll_transmit(&mut self, _now: Instant, buf: &mut Vec<u8>) -> Option<SocketAddr> {
        match self {
            Beat::Heartbeat(h) if h.due => {
                h.due = false;
                buf.extend_from_slice(b"beat");
                Some(h.peer)
            }
            Beat::Heartbeat(_) => None,
            Beat::Echo(e) => e.out.pop_front().map(|(to, b)| {
                buf.extend_from_slice(&b);
                to
            }),
        }
    }
    fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Beat::Heartbeat(h) => Some(h.next),
            Beat::Echo(_) => None,
        }
    }
    fn handle_timeout(&mut self, now: Instant) {
        if let Beat::Heartbeat(h) = self {
            h.due = true;
            h.next = now + h.every;
        }
    }
}

#[test]
fn six_simulated_hours_of_heartbeats_jump_from_event_to_event() {
    let mut sim = Simulation::new(3, Profile::Random.impairment()).unwrap();
    let start = sim.now();
    sim.add_node(
        client(),
        Beat::Heartbeat(Heartbeat {
            peer: server(),
            every: Duration::from_secs(1),
            next: start,
            due: false,
            echoes: 0,
        }),
    )
    .unwrap();
    sim.add_node(server(), Beat::Echo(Echo::default())).unwrap();
    let hours = Duration::from_secs(6 * 3600);
    assert_eq!(sim.run_for(hours).unwrap(), StopReason::Deadline);
    assert_eq!(sim.now() - start, hours);
    let st = sim.stats();
    // One beat per second, the last one at exactly 6 h.
    assert_eq!(st.timeouts, 6 * 3600 + 1);
    let Some(Beat::Heartbeat(h)) = sim.node(client()) else {
        panic!()
    };
    let down = *sim.network().link_counters(server(), client()).unwrap();
    assert_eq!(h.echoes, down.departed);
    // Each instant is a beat or an arrival: the clock skipped all the empty time between them.
    assert!(st.instants <= st.timeouts + st.delivered);
}

#[test]
fn zero_delay_ping_pong_is_reported_as_a_stall() {
    let mut sim = Simulation::new(1, Impairment::none()).unwrap();
    sim.set_max_events_per_instant(1000);
    sim.add_node(client(), Beat::Echo(Echo::default())).unwrap();
    sim.add_node(server(), Beat::Echo(Echo::default())).unwrap();
    let now = sim.now();
    sim.network_mut().send(now, client(), server(), b"ball");
    match sim.run_for(Duration::from_secs(1)) {
        Err(SimError::Stalled { at, events }) => {
            assert_eq!(at, Duration::ZERO);
            assert!(events > 1000);
        }
        other => panic!("{other:?}"),
    }
    // With a delay the same game advances time instead.
    let mut sim =
        Simulation::new(1, Impairment::none().with_delay(Duration::from_millis(5))).unwrap();
    sim.add_node(client(), Beat::Echo(Echo::default())).unwrap();
    sim.add_node(server(), Beat::Echo(Echo::default())).unwrap();
    let now = sim.now();
    sim.network_mut().send(now, client(), server(), b"ball");
    assert_eq!(
        sim.run_for(Duration::from_secs(1)).unwrap(),
        StopReason::Deadline
    );
    assert_eq!(sim.stats().delivered, 200);
}

/// A node whose timer never moves past `now`: a bug the simulation must surface, not hang on.
struct StuckTimer(Instant);
impl SimNode for StuckTimer {
    fn handle(&mut self, _: Instant, _: SocketAddr, _: &[u8]) {}
    fn poll_transmit(&mut self, _: Instant, _: &mut Vec<u8>) -> Option<SocketAddr> {
        None
    }
    fn poll_timeout(&self) -> Option<Instant> {
        Some(self.0)
    }
    fn handle_timeout(&mut self, _: Instant) {}
}

#[test]
fn a_timer_that_stays_in_the_past_is_reported_as_a_stall() {
    let mut sim = Simulation::new(1, Impairment::none()).unwrap();
    sim.set_max_events_per_instant(100);
    let at = sim.now() + Duration::from_millis(3);
    sim.add_node(client(), StuckTimer(at)).unwrap();
    let err = sim.run_for(Duration::from_secs(1)).unwrap_err();
    assert!(matches!(err, SimError::Stalled { at, .. } if at == Duration::from_millis(3)));
}

#[test]
fn rebinding_moves_a_node_and_strands_datagrams_to_the_old_address() {
    let mut sim =
        Simulation::new(1, Impairment::none().with_delay(Duration::from_millis(10))).unwrap();
    sim.add_node(client(), Beat::Echo(Echo::default())).unwrap();
    sim.add_node(server(), Beat::Echo(Echo::default())).unwrap();
    assert_eq!(
        sim.add_node(server(), Beat::Echo(Echo::default())),
        Err(SimError::AddressInUse(server()))
    );
    let now = sim.now();
    sim.network_mut()
        .send(now, server(), client(), b"to the old address");
    let moved: SocketAddr = "192.0.2.10:40001".parse().unwrap();
    sim.rebind(client(), moved).unwrap();
    assert!(sim.node(client()).is_none());
    assert_eq!(
        sim.rebind(server(), moved),
        Err(SimError::AddressInUse(moved))
    );
    let elsewhere: SocketAddr = "192.0.2.10:40002".parse().unwrap();
    assert_eq!(
        sim.rebind(client(), elsewhere),
        Err(SimError::NoSuchNode(client()))
    );
    let now = sim.now();
    sim.network_mut()
        .send(now, server(), moved, b"to the new address");
    // The echo bounces between the moved node and the server every 10 ms; the other is lost.
    assert_eq!(
        sim.run_for(Duration::from_millis(55)).unwrap(),
        StopReason::Deadline
    );
    assert_eq!(sim.stats().undeliverable, 1);
    assert_eq!(sim.stats().delivered, 5);
    assert_eq!(
        sim.network()
            .link_counters(moved, server())
            .unwrap()
            .forwarded,
        3
    );
}
