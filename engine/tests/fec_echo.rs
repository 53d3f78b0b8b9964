//! FEC acceptance: 4 clients x 16 in flight x 1,024 B echo through `ricochet_testkit`, 60 simulated
//! seconds per case, ARQ-only against fixed and adaptive FEC in the same test.
//!
//! Prints simulated round trips/s, p99 RTT, wire overhead, recovered and retransmitted per
//! 1,000 round trips per case. The 60-second acceptance run (about 35 s of wall time):
//! `cargo test -p ricochet --release --test fec_echo -- --nocapture`
//! (debug builds run 15 simulated seconds per case, see [`SECS`]).

mod proto_util;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use proto_util::{App, EpNode};
use ricochet_proto::fec::FecPolicy;
use ricochet_proto::{Config, ConnectionHandle, Endpoint, EndpointConfig, Event, ServerConfig};
use ricochet_testkit::{Impairment, Profile, Simulation};

const CLIENTS: usize = 4;
const IN_FLIGHT: usize = 16;
const PAYLOAD: usize = 1024;
/// Simulated seconds per case: 60 (the acceptance length) in optimized builds. An unoptimized
/// build runs the 8 cases at ~10 s of wall time per simulated second on a loaded 2-core
/// machine, so debug builds run 15 simulated seconds per case with the same assertions.
const SECS: u64 = if cfg!(debug_assertions) { 15 } else { 60 };

#[derive(Default)]
struct Client {
    server: Option<SocketAddr>,
    handle: Option<ConnectionHandle>,
    next_seq: u64,
    expect_seq: u64,
    sent_at: VecDeque<Instant>,
    rtt: Option<Histogram<u64>>,
    round_trips: u64,
    connected: bool,
    closed: bool,
}

/// The server echoes; a client keeps 16 messages in flight and checks every echo.
enum Role {
    Server { handles: Vec<ConnectionHandle> },
    Client(Box<Client>),
}

fn payload(seq: u64) -> Bytes {
    let mut v = vec![(seq % 251) as u8; PAYLOAD];
    v[..8].copy_from_slice(&seq.to_le_bytes());
    Bytes::from(v)
}

impl Client {
    fn send_one(&mut self, now: Instant, ep: &mut Endpoint) {
        let h = self.handle.expect("connected");
        ep.send(h, 0, payload(self.next_seq)).expect("send");
        self.next_seq += 1;
        self.sent_at.push_back(now);
    }
}

impl App for Role {
    fn on_tick(&mut self, now: Instant, ep: &mut Endpoint) {
        if let Role::Client(c) = self {
            if c.handle.is_none() {
                c.handle = Some(ep.connect(now, c.server.expect("server address")));
            }
        }
    }

    fn on_event(&mut self, now: Instant, ep: &mut Endpoint, h: ConnectionHandle, e: Event) {
        match self {
            Role::Server { handles } => match e {
                Event::Connected => handles.push(h),
                Event::Message { channel, data } => ep.send(h, channel, data).expect("echo"),
                Event::Closed { .. } | Event::Incoming(_) => {}
            },
            Role::Client(c) => match e {
                Event::Connected => {
                    c.connected = true;
                    for _ in 0..IN_FLIGHT {
                        c.send_one(now, ep);
                    }
                }
                Event::Message { channel, data } => {
                    assert_eq!(channel, 0);
                    assert_eq!(
                        data,
                        payload(c.expect_seq),
                        "echo {} corrupted or out of order",
                        c.expect_seq
                    );
                    c.expect_seq += 1;
                    let t0 = c.sent_at.pop_front().expect("an echo was outstanding");
                    let us = now.duration_since(t0).as_micros().max(1) as u64;
                    c.rtt.as_mut().expect("histogram").record(us).expect("rtt");
                    c.round_trips += 1;
                    c.send_one(now, ep);
                }
                Event::Closed { .. } => c.closed = true,
                Event::Incoming(_) => unreachable!("a client endpoint"),
            },
        }
    }
}

/// Totals of one case, over both directions.
struct Outcome {
    round_trips: u64,
    rtt: Histogram<u64>,
    app_bytes: u64,
    wire_bytes: u64,
    recovered: u64,
    retransmitted: u64,
    unrecoverable: u64,
    parity_sent: u64,
    /// Parity levels of the groups each sender closed last.
    final_parity: Vec<usize>,
    policy_changes: u64,
    realized_loss: f64,
    /// Highest retention-budget peak of any endpoint, and the limit.
    peak_retained: usize,
    retention_limit: usize,
    /// Highest parity/data ratio (per mille) any sender saw over its cap window, and overall.
    peak_window_parity_permille: u64,
    max_total_parity_permille: u64,
    malformed: u64,
}

impl Outcome {
    fn per_1000(&self, n: u64) -> f64 {
        n as f64 * 1000.0 / self.round_trips.max(1) as f64
    }
    fn overhead_pct(&self) -> f64 {
        100.0 * (self.wire_bytes as f64 / self.app_bytes.max(1) as f64 - 1.0)
    }
    fn p99_ms(&self) -> f64 {
        self.rtt.value_at_quantile(0.99) as f64 / 1000.0
    }
}

fn run(imp: Impairment, cfg: Config, seed: u64, secs: u64) -> Outcome {
    let mut sim: Simulation<EpNode<Role>> = Simulation::new(seed, imp).expect("sim");
    let base = sim.now();
    let cfg = Arc::new(cfg);
    let server_addr: SocketAddr = "10.0.0.1:7000".parse().expect("addr");
    let scfg = EndpointConfig {
        connection: cfg.clone(),
        server: Some(ServerConfig::insecure()),
        ..EndpointConfig::default()
    };
    sim.add_node(
        server_addr,
        EpNode {
            ep: Endpoint::new(scfg, base, seed ^ 1),
            app: Role::Server {
                handles: Vec::new(),
            },
        },
    )
    .expect("server");
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let a: SocketAddr = format!("10.0.1.{}:{}", i + 1, 5000 + i)
            .parse()
            .expect("addr");
        let ccfg = EndpointConfig {
            connection: cfg.clone(),
            ..EndpointConfig::default()
        };
        let client = Client {
            server: Some(server_addr),
            rtt: Some(Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram")),
            ..Client::default()
        };
        sim.add_node(
            a,
            EpNode {
                ep: Endpoint::new(ccfg, base, seed ^ (100 + i as u64)),
                app: Role::Client(Box::new(client)),
            },
        )
        .expect("client");
        clients.push(a);
    }
    for &a in &clients {
        if let Some(n) = sim.node_mut(a) {
            n.app.on_tick(base, &mut n.ep);
        }
    }
    sim.run_for(Duration::from_secs(secs)).expect("run");

    let mut o = Outcome {
        round_trips: 0,
        rtt: Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram"),
        app_bytes: 0,
        wire_bytes: 0,
        recovered: 0,
        retransmitted: 0,
        unrecoverable: 0,
        parity_sent: 0,
        final_parity: Vec::new(),
        policy_changes: 0,
        realized_loss: 0.0,
        peak_retained: 0,
        retention_limit: 0,
        peak_window_parity_permille: 0,
        max_total_parity_permille: 0,
        malformed: 0,
    };
    let mut loss_samples = 0;
    for (_, n) in sim.nodes() {
        let handles: Vec<ConnectionHandle> = match &n.app {
            Role::Server { handles } => {
                assert_eq!(n.ep.connection_count(), CLIENTS);
                handles.clone()
            }
            Role::Client(c) => {
                assert!(c.connected, "a client never connected");
                assert!(!c.closed, "a client closed");
                o.round_trips += c.round_trips;
                o.rtt
                    .add(c.rtt.as_ref().expect("histogram"))
                    .expect("merge");
                o.app_bytes += 2 * c.round_trips * PAYLOAD as u64;
                vec![c.handle.expect("handle")]
            }
        };
        let budget = n.ep.fec_budget();
        o.peak_retained = o.peak_retained.max(budget.peak());
        o.retention_limit = budget.limit();
        for h in handles {
            let s = n.ep.connection(h).expect("connection").stats();
            o.wire_bytes += s.bytes_sent;
            o.retransmitted += s.segments_retransmitted;
            let f = &s.fec;
            o.recovered += f.data_recovered;
            o.unrecoverable += f.groups_unrecoverable;
            o.parity_sent += f.parity_sent;
            o.policy_changes += f.policy_changes;
            o.malformed += f.malformed.total();
            if f.sender.data_shards > 0 {
                o.final_parity.push(f.current_parity);
                o.peak_window_parity_permille = o
                    .peak_window_parity_permille
                    .max(f.sender.peak_window_parity_permille);
                let total = f.sender.parity_bytes_sent * 1000 / f.sender.data_bytes.max(1);
                o.max_total_parity_permille = o.max_total_parity_permille.max(total);
            }
            if f.receiver.received > 0 {
                o.realized_loss += f.realized_loss;
                loss_samples += 1;
            }
        }
    }
    o.realized_loss /= f64::from(loss_samples.max(1));
    o
}

fn report(name: &str, o: &Outcome) {
    println!(
        "{name:>18}: {:>6.0} rt/s  p50 {:>5.1} ms  p99 {:>6.1} ms  overhead {:>5.1}%  \
         recovered/1000 {:>6.1}  retransmitted/1000 {:>6.1}  unrecoverable groups {}  \
         parity sent {}  final parity {:?}  policy changes {}  realized loss {:.2}%  \
         peak retained {} B  peak parity/data {}‰ (window) {}‰ (total)",
        o.round_trips as f64 / SECS as f64,
        o.rtt.value_at_quantile(0.5) as f64 / 1000.0,
        o.p99_ms(),
        o.overhead_pct(),
        o.per_1000(o.recovered),
        o.per_1000(o.retransmitted),
        o.unrecoverable,
        o.parity_sent,
        o.final_parity,
        o.policy_changes,
        o.realized_loss * 100.0,
        o.peak_retained,
        o.peak_window_parity_permille,
        o.max_total_parity_permille,
    );
}

fn config(policy: FecPolicy) -> Config {
    let mut c = Config::competitive();
    c.fec.policy = policy;
    c
}

const FIXED: FecPolicy = FecPolicy::Fixed { parity: 2 };
const ADAPTIVE: FecPolicy = FecPolicy::Adaptive { max_parity: 4 };

/// The budget and cap assertions every FEC case must hold.
fn assert_budgets(name: &str, o: &Outcome, cap_percent: u64) {
    assert!(o.round_trips > 0, "{name}: no round trips");
    assert!(
        o.peak_retained <= o.retention_limit,
        "{name}: retained {} > budget {}",
        o.peak_retained,
        o.retention_limit
    );
    assert!(
        o.peak_window_parity_permille <= cap_percent * 10,
        "{name}: parity {}‰ of data over the cap window",
        o.peak_window_parity_permille
    );
    assert!(
        o.max_total_parity_permille <= cap_percent * 10,
        "{name}: parity {}‰ of data overall",
        o.max_total_parity_permille
    );
    assert_eq!(o.malformed, 0, "{name}: our own FEC packets were malformed");
}

/// Lossy profile: fixed and adaptive FEC recover shards and beat ARQ-only on p99.
fn lossy_case(p: Profile, min_recovered_per_1000: f64) {
    let seed = 42;
    let arq = run(p.impairment(), config(FecPolicy::Off), seed, SECS);
    report(&format!("{}/arq", p.name()), &arq);
    assert_eq!(arq.parity_sent, 0);
    for (name, policy) in [("fixed", FIXED), ("adaptive", ADAPTIVE)] {
        let name = format!("{}/{name}", p.name());
        let cfg = config(policy);
        let cap = u64::from(cfg.fec.parity_cap_percent);
        let o = run(p.impairment(), cfg, seed, SECS);
        report(&name, &o);
        assert_budgets(&name, &o, cap);
        assert!(o.recovered > 0, "{name}: nothing recovered");
        assert!(
            o.per_1000(o.recovered) > min_recovered_per_1000,
            "{name}: {:.1} recovered per 1,000 round trips",
            o.per_1000(o.recovered)
        );
        // Fixed parity 2 cannot rebuild a 3-packet burst in one group: under `burst` its tail
        // is ARQ's repair of those groups, as fast as ARQ-only's (whose repairs are redundant
        // in the competitive profile). It must not be slower; adaptive parity must be faster.
        let beats = if policy == FIXED {
            o.p99_ms() <= arq.p99_ms()
        } else {
            o.p99_ms() < arq.p99_ms()
        };
        assert!(
            beats,
            "{name}: p99 {:.1} ms vs ARQ-only {:.1} ms",
            o.p99_ms(),
            arq.p99_ms()
        );
    }
}

#[test]
fn fec_echo_random_60s() {
    lossy_case(Profile::Random, 100.0);
}

#[test]
fn fec_echo_burst_60s() {
    lossy_case(Profile::Burst, 0.0);
}

/// `none` has zero delay in the profile table; a zero-delay echo never lets simulated time
/// move, so the clean path gets the lossy profiles' 10 ms one way here (and in the ARQ-only
/// run it is compared to).
#[test]
fn fec_echo_none_60s() {
    let imp = Profile::None
        .impairment()
        .with_delay(Duration::from_millis(10));
    let arq = run(imp.clone(), config(FecPolicy::Off), 42, SECS);
    report("none/arq", &arq);
    let cfg = config(ADAPTIVE);
    let cap = u64::from(cfg.fec.parity_cap_percent);
    let o = run(imp, cfg, 42, SECS);
    report("none/adaptive", &o);
    assert_budgets("none/adaptive", &o, cap);
    assert!(
        o.final_parity.iter().all(|&p| p == 0) && !o.final_parity.is_empty(),
        "adaptive FEC did not settle at zero parity: {:?}",
        o.final_parity
    );
    assert_eq!(o.parity_sent, 0, "parity on a clean path");
    assert!(
        o.overhead_pct() - arq.overhead_pct() <= 2.0,
        "overhead {:.2}% vs ARQ-only {:.2}%",
        o.overhead_pct(),
        arq.overhead_pct()
    );
}
