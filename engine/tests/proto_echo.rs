//! 4 clients x 16 in flight x 1,024 B echo through `ricochet_testkit` under each named profile, plus
//! the determinism check (same seed, same event-trace hash).
//!
//! Prints simulated round trips/s and RTT percentiles per profile:
//! `cargo test -p ricochet --release --test proto_echo -- --nocapture`

mod proto_util;

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use proto_util::{App, EpNode};
use ricochet_proto::fec::{FecConfig, FecPolicy};
use ricochet_proto::{Config, ConnectionHandle, Endpoint, EndpointConfig, Event, ServerConfig};
use ricochet_testkit::{Impairment, Profile, Simulation};

const CLIENTS: usize = 4;
const IN_FLIGHT: usize = 16;
const PAYLOAD: usize = 1024;

struct Server {
    trace: u64,
}

fn mix(trace: &mut u64, now: Instant, base: Instant, tag: u64, h: ConnectionHandle, extra: u64) {
    let mut s = std::collections::hash_map::DefaultHasher::new();
    (*trace, now.duration_since(base).as_nanos(), tag, h.0, extra).hash(&mut s);
    *trace = s.finish();
}

impl App for Server {
    fn on_event(&mut self, _now: Instant, ep: &mut Endpoint, h: ConnectionHandle, e: Event) {
        if let Event::Message { channel, data } = e {
            ep.send(h, channel, data).expect("echo send");
        }
    }
}

struct Client {
    server: SocketAddr,
    base: Instant,
    started: bool,
    handle: Option<ConnectionHandle>,
    next_seq: u64,
    expect_seq: u64,
    sent_at: VecDeque<Instant>,
    rtt: Histogram<u64>,
    round_trips: u64,
    connected: bool,
    closed: bool,
    trace: u64,
}

fn payload(seq: u64) -> Bytes {
    let mut v = vec![(seq % 251) as u8; PAYLOAD];
    v[..8].copy_from_slice(&seq.to_le_bytes());
    Bytes::from(v)
}

impl Client {
    fn new(server: SocketAddr, base: Instant) -> Self {
        Self {
            server,
            base,
            started: false,
            handle: None,
            next_seq: 0,
            expect_seq: 0,
            sent_at: VecDeque::new(),
            rtt: Histogram::new_with_bounds(1, 60_000_000, 3).unwrap(),
            round_trips: 0,
            connected: false,
            closed: false,
            trace: 0,
        }
    }

    fn send_one(&mut self, now: Instant, ep: &mut Endpoint) {
        let h = self.handle.unwrap();
        ep.send(h, 0, payload(self.next_seq)).unwrap();
        self.next_seq += 1;
        self.sent_at.push_back(now);
    }
}

impl App for Client {
    fn on_tick(&mut self, now: Instant, ep: &mut Endpoint) {
        if !self.started {
            self.started = true;
            self.handle = Some(ep.connect(now, self.server));
        }
    }
    fn on_event(&mut self, now: Instant, ep: &mut Endpoint, h: ConnectionHandle, e: Event) {
        match e {
            Event::Connected => {
                mix(&mut self.trace, now, self.base, 1, h, 0);
                self.connected = true;
                for _ in 0..IN_FLIGHT {
                    self.send_one(now, ep);
                }
            }
            Event::Message { channel, data } => {
                assert_eq!(channel, 0);
                // Intact and in order.
                assert_eq!(
                    data,
                    payload(self.expect_seq),
                    "echo {} corrupted or out of order",
                    self.expect_seq
                );
                mix(&mut self.trace, now, self.base, 2, h, self.expect_seq);
                self.expect_seq += 1;
                let t0 = self.sent_at.pop_front().unwrap();
                self.rtt
                    .record(now.duration_since(t0).as_micros().max(1) as u64)
                    .unwrap();
                self.round_trips += 1;
                self.send_one(now, ep);
            }
            Event::Closed { .. } => self.closed = true,
            Event::Incoming(_) => unreachable!("no accept hook"),
        }
    }
}

#[allow(clippy::large_enum_variant)]
enum Node {
    S(EpNode<Server>),
    C(EpNode<Client>),
}

impl ricochet_testkit::SimNode for Node {
    fn handle(&mut self, now: Instant, from: SocketAddr, bytes: &[u8]) {
        match self {
            Node::S(n) => n.handle(now, from, bytes),
            Node::C(n) => n.handle(now, from, bytes),
        }
    }
    fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<SocketAddr> {
        match self {
            Node::S(n) => n.poll_transmit(now, buf),
            Node::C(n) => n.poll_transmit(now, buf),
        }
    }
    fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Node::S(n) => n.poll_timeout(),
            Node::C(n) => n.poll_timeout(),
        }
    }
    fn handle_timeout(&mut self, now: Instant) {
        match self {
            Node::S(n) => n.handle_timeout(now),
            Node::C(n) => n.handle_timeout(now),
        }
    }
}

struct Outcome {
    round_trips: u64,
    rtt: Histogram<u64>,
    trace: u64,
    net_hash: Option<[u8; 32]>,
    retransmitted: u64,
    lost: u64,
    app_bytes: u64,
    wire_bytes: u64,
}

fn run(imp: Impairment, cfg: Config, seed: u64, secs: u64) -> Outcome {
    let mut sim: Simulation<Node> = Simulation::new(seed, imp).unwrap();
    sim.network_mut().enable_trace();
    let base = sim.now();
    let cfg = Arc::new(cfg);
    let server_addr: SocketAddr = "10.0.0.1:7000".parse().unwrap();
    let scfg = EndpointConfig {
        connection: cfg.clone(),
        server: Some(ServerConfig::insecure()),
        ..EndpointConfig::default()
    };
    sim.add_node(
        server_addr,
        Node::S(EpNode {
            ep: Endpoint::new(scfg, base, seed ^ 1),
            app: Server { trace: 0 },
        }),
    )
    .unwrap();
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let a: SocketAddr = format!("10.0.1.{}:{}", i + 1, 5000 + i).parse().unwrap();
        let ccfg = EndpointConfig {
            connection: cfg.clone(),
            ..EndpointConfig::default()
        };
        sim.add_node(
            a,
            Node::C(EpNode {
                ep: Endpoint::new(ccfg, base, seed ^ (100 + i as u64)),
                app: Client::new(server_addr, base),
            }),
        )
        .unwrap();
        clients.push(a);
    }
    // Kick the clients (they connect on their first tick).
    for &a in &clients {
        if let Some(Node::C(n)) = sim.node_mut(a) {
            n.app.on_tick(base, &mut n.ep);
        }
    }
    sim.run_for(Duration::from_secs(secs)).unwrap();
    let mut out = Outcome {
        round_trips: 0,
        rtt: Histogram::new_with_bounds(1, 60_000_000, 3).unwrap(),
        trace: 0,
        net_hash: sim.network().trace_hash(),
        retransmitted: 0,
        lost: 0,
        app_bytes: 0,
        wire_bytes: 0,
    };
    for &a in &clients {
        let Some(Node::C(n)) = sim.node(a) else {
            unreachable!()
        };
        assert!(n.app.connected, "client {a} never connected");
        assert!(!n.app.closed, "client {a} closed");
        out.round_trips += n.app.round_trips;
        out.rtt.add(&n.app.rtt).unwrap();
        out.trace ^= n.app.trace;
        let c = n.ep.connection(n.app.handle.unwrap()).unwrap();
        out.retransmitted += c.stats().segments_retransmitted;
        out.lost += c.stats().packets_lost;
        out.wire_bytes += c.stats().bytes_sent;
        out.app_bytes += 2 * n.app.round_trips * PAYLOAD as u64;
    }
    if let Some(Node::S(n)) = sim.node(server_addr) {
        let _ = n.app.trace;
        assert_eq!(n.ep.connection_count(), CLIENTS);
    }
    out
}

fn report(name: &str, secs: u64, o: &Outcome) {
    println!(
        "{name:>21}: {:>7.0} round trips/s  p50 {:>6.1} ms  p99 {:>6.1} ms  max {:>6.1} ms  retransmitted/1000 rt {:>6.1}  lost pkts {}",
        o.round_trips as f64 / secs as f64,
        o.rtt.value_at_quantile(0.5) as f64 / 1000.0,
        o.rtt.value_at_quantile(0.99) as f64 / 1000.0,
        o.rtt.max() as f64 / 1000.0,
        o.retransmitted as f64 * 1000.0 / o.round_trips.max(1) as f64,
        o.lost,
    );
}

/// The game profile with FEC off: ARQ alone.
fn competitive_arq() -> Config {
    Config {
        fec: FecConfig {
            policy: FecPolicy::Off,
            ..FecConfig::default()
        },
        ..Config::competitive()
    }
}

/// `none` has zero delay in the profile table; a zero-delay echo never lets simulated time move,
/// so this test gives the clean path 1 ms one way (and 60 s of it stays cheap to simulate).
fn profile_impairment(p: Profile) -> Impairment {
    match p {
        Profile::None => p.impairment().with_delay(Duration::from_millis(1)),
        _ => p.impairment(),
    }
}

/// The acceptance run: >= 60 simulated seconds per profile, default and competitive configs
/// (about 80 s in test builds, which optimize the engine; figures with
/// `cargo test -p ricochet --release --test proto_echo -- --nocapture`).
#[test]
fn echo_under_each_profile_60s() {
    let secs = 60;
    for (cname, cfg) in [
        ("default", Config::default()),
        ("competitive-arq", competitive_arq()),
        ("competitive+fec", Config::competitive()),
    ] {
        for p in Profile::ALL {
            let o = run(profile_impairment(p), cfg.clone(), 42, secs);
            assert!(o.round_trips > 0);
            report(&format!("{cname}/{}", p.name()), secs, &o);
        }
    }
}

/// The same echo for a few simulated seconds under every lossy profile (correctness: every echo
/// intact and in order, asserted inside the client).
#[test]
fn echo_smoke_each_lossy_profile() {
    for p in [Profile::Random, Profile::Burst, Profile::Sustained] {
        let o = run(profile_impairment(p), Config::default(), 42, 3);
        assert!(o.round_trips > 100, "{}: {}", p.name(), o.round_trips);
        report(p.name(), 3, &o);
    }
}

#[test]
fn same_seed_same_trace() {
    let a = run(Profile::Random.impairment(), Config::default(), 7, 5);
    let b = run(Profile::Random.impairment(), Config::default(), 7, 5);
    assert!(a.round_trips > 0);
    assert_eq!(a.trace, b.trace);
    assert_eq!(a.net_hash, b.net_hash);
    assert!(a.net_hash.is_some());
    let c = run(Profile::Random.impairment(), Config::default(), 8, 5);
    assert_ne!(
        a.net_hash, c.net_hash,
        "a different seed should change the run"
    );
}

/// Pacing, congestion control off, and the competitive profile keep the echo correct.
#[test]
fn echo_smoke_config_variants() {
    let variants = [
        (
            "pacing",
            Config {
                pacing: true,
                ..Config::default()
            },
        ),
        (
            "cc-off",
            Config {
                congestion_control: false,
                ..Config::default()
            },
        ),
        (
            "textbook-newreno",
            Config {
                loss_tolerant: false,
                ..Config::default()
            },
        ),
        ("competitive-arq", competitive_arq()),
        ("competitive+fec", Config::competitive()),
    ];
    for (name, cfg) in variants {
        let o = run(Profile::Random.impairment(), cfg, 5, 3);
        assert!(o.round_trips > 100, "{name}: {}", o.round_trips);
        report(name, 3, &o);
    }
}
