//! The deterministic simulated echo scenario: N clients × W messages in flight × B bytes,
//! complete-message echo on a reliable-ordered channel through a [`SimNetwork`](crate::SimNetwork) under a named
//! [`Profile`].
//!
//! One server [`Endpoint`] and N client `Endpoint`s run as [`SimNode`]s on the virtual clock.
//! Each client connects, then keeps W messages in flight: every echo it gets back is checked byte
//! for byte and for order, its round trip (send → complete echo, simulated time) goes into an HDR
//! histogram, and a new message replaces it. After a warm-up the counters are snapshotted and the
//! measured phase runs for S simulated seconds; [`EchoReport`] holds the measured-phase deltas.
//!
//! This is the scenario the protocol and FEC acceptance tests and `bench gate` use. Everything in
//! the report is a function of the [`EchoScenario`] (seed included): two runs of the same scenario
//! give equal reports, and [`EchoReport::trace_hash`] (the network's BLAKE3 event trace: every
//! datagram's time, route, verdict and bytes) proves the runs were bit-identical.
//!
//! The scenario runs the secure path by default: the server admits clients by connect token
//! (one minted in place for each client, with a key drawn from the seed) on a fixed simulated
//! wall clock, and the sessions' packets are protected with the tokens' keys;
//! [`EchoScenario::secure`] `= false` runs the same traffic in insecure mode.
//!
//! With [`Profile::None`] the links have no delay, and a zero-delay ping-pong never lets time
//! advance ([`SimError::Stalled`]); the scenario gives that profile
//! [`EchoScenario::none_delay`] (1 ms one way by default) instead. The other profiles run as
//! defined.
//!
//! ```
//! use std::time::Duration;
//! use ricochet_testkit::echo::EchoScenario;
//! use ricochet_testkit::Profile;
//!
//! let scenario = EchoScenario {
//!     clients: 2,
//!     window: 4,
//!     payload: 256,
//!     warmup: Duration::from_millis(200),
//!     seconds: Duration::from_secs(1),
//!     ..EchoScenario::new(Profile::Random, 7)
//! };
//! let report = scenario.run().unwrap();
//! assert!(report.is_ok(), "{:?}", report.problems());
//! assert!(report.round_trips > 0);
//! assert_eq!(report, scenario.run().unwrap()); // same seed, same report
//! ```

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;

use super::harness::{SimError, SimNode, Simulation};
use super::impair::{Impairment, LinkCounters, Profile};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use ricochet_proto::token::{ConnectToken, TokenKey, TokenParams};
use ricochet_proto::{
    ChannelKind, Config, ConnectionHandle, Endpoint, EndpointConfig, Event, ListenConfig,
    TokenAdmission,
};

/// Smallest payload: the client id (4 B) and sequence number (8 B) lead every message.
pub const MIN_PAYLOAD: usize = 12;

/// One run of the echo scenario.
#[derive(Debug, Clone)]
pub struct EchoScenario {
    /// Client endpoints, one connection each.
    pub clients: usize,
    /// Messages each client keeps in flight.
    pub window: usize,
    /// Message size in bytes (at least [`MIN_PAYLOAD`]).
    pub payload: usize,
    /// The network condition of every link direction.
    pub profile: Profile,
    /// Seeds the network's impairments and every endpoint's randomness.
    pub seed: u64,
    /// Simulated time before measuring (handshakes, slow start).
    pub warmup: Duration,
    /// Simulated time measured.
    pub seconds: Duration,
    /// One-way delay given to [`Profile::None`] links (see the module docs).
    pub none_delay: Duration,
    /// Connection settings of both sides (channel 0 must be reliable-ordered).
    pub config: Config,
    /// Connection settings of the server when they differ from `config` (e.g. another FEC
    /// scheme); `None`: the server uses `config` too.
    pub server_config: Option<Config>,
    /// The secure path (the default): the server admits clients by connect token (one minted
    /// in place per client, with a key drawn from `seed`) and every session's packets are
    /// protected with its token's keys. `false`: the insecure mode.
    pub secure: bool,
}

/// The simulated wall clock at the start of every scenario (seconds since the Unix epoch):
/// fixed, so runs stay bit-identical.
pub const SIM_UNIX_START: u64 = 1_800_000_000;
/// The protocol id of the scenario's tokens.
const SIM_PROTOCOL_ID: u64 = 0x7269_636f_6368_6574;

impl EchoScenario {
    /// The standard shape: 4 clients × 16 in flight × 1,024 B, 1 s warm-up, 10 s measured,
    /// default connection settings.
    pub fn new(profile: Profile, seed: u64) -> Self {
        Self {
            clients: 4,
            window: 16,
            payload: 1024,
            profile,
            seed,
            warmup: Duration::from_secs(1),
            seconds: Duration::from_secs(10),
            none_delay: Duration::from_millis(1),
            config: Config::default(),
            server_config: None,
            secure: true,
        }
    }

    /// The impairment every link direction gets.
    pub fn impairment(&self) -> Impairment {
        match self.profile {
            Profile::None => self.profile.impairment().with_delay(self.none_delay),
            p => p.impairment(),
        }
    }

    /// Runs the scenario to the end of the measured phase.
    pub fn run(&self) -> Result<EchoReport, EchoError> {
        self.validate()?;
        let mut sim: Simulation<Node> = Simulation::new(self.seed, self.impairment())?;
        sim.network_mut().enable_trace();
        let base = sim.now();
        let cfg = Arc::new(self.config.clone());
        let server_cfg = match &self.server_config {
            Some(c) => Arc::new(c.clone()),
            None => cfg.clone(),
        };
        let server_addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 7000);
        // The backend's key and tokens come from their own generator, so the endpoints'
        // streams stay what they are in insecure mode.
        let mut backend = ChaCha20Rng::seed_from_u64(seed_for(self.seed, u64::MAX));
        let key = TokenKey::generate(&mut backend);
        let server = if !self.secure {
            ListenConfig::insecure()
        } else {
            ListenConfig::tokens(TokenAdmission::new(
                key.clone(),
                SIM_PROTOCOL_ID,
                vec![server_addr],
            ))
        };
        let mut server_ep = Endpoint::new(
            EndpointConfig::default().with(|c| {
                c.connection = server_cfg;
                c.server = Some(server);
            }),
            base,
            seed_for(self.seed, 0),
        );
        server_ep.set_unix_time(base, Duration::from_secs(SIM_UNIX_START));
        sim.add_node(
            server_addr,
            Node::new(Role::Server(ServerApp::default()), server_ep),
        )?;
        let mut client_addrs = Vec::with_capacity(self.clients);
        for i in 0..self.clients {
            let addr = client_addr(i);
            let mut ep = Endpoint::new(
                EndpointConfig::default().with(|c| c.connection = cfg.clone()),
                base,
                seed_for(self.seed, i as u64 + 1),
            );
            let handle = if !self.secure {
                ep.connect(base, server_addr)
            } else {
                let params = TokenParams {
                    protocol_id: SIM_PROTOCOL_ID,
                    client_id: i as u64,
                    server_addresses: &[server_addr],
                    expires_unix: SIM_UNIX_START + 3600,
                    user_data: &[],
                };
                let token = ConnectToken::seal(&key, &params, &mut backend)
                    .map_err(|e| EchoError::Invalid(format!("connect token: {e}")))?;
                ep.connect_with_token(base, &token)
            };
            let app = ClientApp::new(i as u32, handle, self.window, self.payload);
            sim.add_node(addr, Node::new(Role::Client(app), ep))?;
            client_addrs.push(addr);
        }

        sim.run_for(self.warmup)?;
        let before = Snapshot::take(&sim);
        for addr in std::iter::once(server_addr).chain(client_addrs.iter().copied()) {
            if let Some(node) = sim.node_mut(addr) {
                node.start_measuring();
            }
        }
        sim.run_for(self.seconds)?;
        let after = Snapshot::take(&sim);

        let mut rtt = new_histogram();
        let mut checks = EchoChecks::default();
        let mut round_trips = 0;
        let mut client_received = 0;
        let mut server_received = 0;
        for (_, node) in sim.nodes() {
            match &node.role {
                Role::Client(c) => {
                    // Both histograms have the same bounds; adding cannot fail.
                    let _ = rtt.add(&c.rtt_us);
                    round_trips += c.measured_round_trips;
                    client_received += c.measured_round_trips;
                    checks.content_errors += c.content_errors;
                    checks.order_errors += c.order_errors;
                    checks.wrong_channel += c.wrong_channel;
                    checks.send_refused += c.send_refused + node.send_refused;
                    checks.clients_connected += u64::from(c.connected);
                    checks.unexpected_closes += u64::from(c.closed);
                }
                Role::Server(s) => {
                    server_received += s.measured_received;
                    checks.send_refused += node.send_refused;
                    checks.unexpected_closes += s.closes;
                }
            }
        }
        let wire = after.wire.delta(&before.wire);
        let secs = self.seconds.as_secs_f64();
        let app_bytes = (client_received + server_received) * self.payload as u64;
        let retransmitted = after.c.retransmitted - before.c.retransmitted;
        let recovered = after.c.recovered - before.c.recovered;
        let fec_on = std::iter::once(&self.config)
            .chain(self.server_config.as_ref())
            .any(|c| c.fec.policy != ricochet_proto::fec::FecPolicy::Off);
        let per_1000 = |x: u64| {
            if round_trips == 0 {
                0.0
            } else {
                x as f64 * 1000.0 / round_trips as f64
            }
        };
        Ok(EchoReport {
            profile: self.profile,
            seed: self.seed,
            clients: self.clients,
            window: self.window,
            payload: self.payload,
            warmup: self.warmup,
            seconds: self.seconds,
            round_trips,
            round_trips_per_s: if secs > 0.0 {
                round_trips as f64 / secs
            } else {
                0.0
            },
            rtt_p50_us: rtt.value_at_quantile(0.5),
            rtt_p99_us: rtt.value_at_quantile(0.99),
            rtt_max_us: rtt.max(),
            wire_datagrams: wire.datagrams,
            wire_bytes: wire.bytes,
            app_bytes,
            wire_overhead_percent: if app_bytes == 0 {
                0.0
            } else {
                (wire.bytes as f64 / app_bytes as f64 - 1.0) * 100.0
            },
            bytes_per_round_trip: if round_trips == 0 {
                0.0
            } else {
                wire.bytes as f64 / round_trips as f64
            },
            retransmitted_segments: retransmitted,
            retransmitted_per_1000: per_1000(retransmitted),
            packets_lost: after.c.lost - before.c.lost,
            packets_spurious_lost: after.c.spurious - before.c.spurious,
            tail_loss_probes: after.c.tlp - before.c.tlp,
            rto_count: after.c.rto - before.c.rto,
            realized_loss: wire.realized_loss,
            fec_recovered: fec_on.then_some(recovered),
            fec_recovered_per_1000: fec_on.then(|| per_1000(recovered)),
            fec_groups: fec_on.then_some(after.c.groups - before.c.groups),
            fec_data_shards: fec_on.then_some(after.c.data_shards - before.c.data_shards),
            fec_unrecoverable: fec_on.then_some(after.c.unrecoverable - before.c.unrecoverable),
            fec_parity_shards: fec_on.then_some(after.c.parity - before.c.parity),
            fec_parity_bytes: fec_on.then_some(after.c.parity_bytes - before.c.parity_bytes),
            fec_tail_repairs: fec_on.then_some(after.c.tail_repairs - before.c.tail_repairs),
            fec_tails_skipped: fec_on.then_some(after.c.tails_skipped - before.c.tails_skipped),
            fec_parity_ignored: fec_on.then_some(after.c.parity_ignored - before.c.parity_ignored),
            fec_data_bytes: fec_on.then_some(after.c.data_bytes - before.c.data_bytes),
            fec_peak_retained_bytes: fec_on.then_some(after.fec_peak_retained),
            fec_retention_limit: fec_on.then_some(after.fec_retention_limit),
            fec_final_parity: fec_on.then(|| after.fec.final_parity.clone()),
            fec_parity_permille: fec_on.then_some((
                after.fec.peak_window_permille,
                after.fec.peak_total_permille,
            )),
            fec_malformed: fec_on.then_some(after.fec.malformed),
            checks,
            trace_hash: sim.network().trace_hash().map(hex).unwrap_or_default(),
        })
    }

    fn validate(&self) -> Result<(), EchoError> {
        if self.clients == 0 || self.clients > 60_000 {
            return Err(EchoError::Invalid(format!(
                "clients must be 1..=60000, got {}",
                self.clients
            )));
        }
        if self.window == 0 {
            return Err(EchoError::Invalid("window must be at least 1".into()));
        }
        if self.payload < MIN_PAYLOAD || self.payload > self.config.max_message_size {
            return Err(EchoError::Invalid(format!(
                "payload must be {MIN_PAYLOAD}..={} bytes, got {}",
                self.config.max_message_size, self.payload
            )));
        }
        let server = self.server_config.as_ref().unwrap_or(&self.config);
        if self.config.channels.first() != Some(&ChannelKind::ReliableOrdered)
            || server.channels.first() != Some(&ChannelKind::ReliableOrdered)
        {
            return Err(EchoError::Invalid(
                "channel 0 of the connection config must be reliable-ordered".into(),
            ));
        }
        if self.profile == Profile::None && self.none_delay.is_zero() {
            return Err(EchoError::Invalid(
                "profile none needs a non-zero none_delay (a zero-delay echo stalls)".into(),
            ));
        }
        Ok(())
    }
}

/// Why the scenario could not run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EchoError {
    /// A scenario parameter is out of range.
    #[error("invalid echo scenario: {0}")]
    Invalid(String),
    /// The simulation failed (e.g. stalled).
    #[error(transparent)]
    Sim(#[from] SimError),
}

/// Correctness of the run: every count but `clients_connected` should be zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EchoChecks {
    /// Clients whose handshake completed.
    pub clients_connected: u64,
    /// Echoes whose bytes differ from what was sent.
    pub content_errors: u64,
    /// Echoes that arrived out of send order (or unasked for).
    pub order_errors: u64,
    /// Messages on a channel other than 0.
    pub wrong_channel: u64,
    /// `send` calls the endpoint refused.
    pub send_refused: u64,
    /// Connections that closed during the run.
    pub unexpected_closes: u64,
}

/// What one run measured (the measured phase only). Equal scenarios give equal reports.
#[derive(Debug, Clone, PartialEq)]
pub struct EchoReport {
    /// Network profile.
    pub profile: Profile,
    /// Seed.
    pub seed: u64,
    /// Clients.
    pub clients: usize,
    /// Messages in flight per client.
    pub window: usize,
    /// Message size, bytes.
    pub payload: usize,
    /// Simulated warm-up.
    pub warmup: Duration,
    /// Simulated measured time.
    pub seconds: Duration,
    /// Echoes completed in the measured phase.
    pub round_trips: u64,
    /// `round_trips` per simulated second.
    pub round_trips_per_s: f64,
    /// Median round trip (send → complete echo), simulated µs.
    pub rtt_p50_us: u64,
    /// 99th-percentile round trip, simulated µs.
    pub rtt_p99_us: u64,
    /// Longest round trip, simulated µs.
    pub rtt_max_us: u64,
    /// Datagrams both sides sent.
    pub wire_datagrams: u64,
    /// UDP payload bytes both sides sent (every datagram offered to the network).
    pub wire_bytes: u64,
    /// Application bytes delivered in both directions (complete messages × payload).
    pub app_bytes: u64,
    /// `(wire_bytes / app_bytes − 1) × 100`.
    pub wire_overhead_percent: f64,
    /// `wire_bytes / round_trips`.
    pub bytes_per_round_trip: f64,
    /// Reliable fragments sent again (both sides; retransmissions and tail-loss probes).
    pub retransmitted_segments: u64,
    /// `retransmitted_segments` per 1,000 round trips.
    pub retransmitted_per_1000: f64,
    /// Packets the senders declared lost.
    pub packets_lost: u64,
    /// Of `packets_lost`, those acknowledged later (spurious loss declarations).
    pub packets_spurious_lost: u64,
    /// Tail-loss probes both sides sent.
    pub tail_loss_probes: u64,
    /// Retransmission timeouts both sides took.
    pub rto_count: u64,
    /// Share of offered datagrams the network dropped.
    pub realized_loss: f64,
    /// Data shards FEC rebuilt; `None` while the protocol core has no FEC stage.
    pub fec_recovered: Option<u64>,
    /// `fec_recovered` per 1,000 round trips; `None` without FEC.
    pub fec_recovered_per_1000: Option<f64>,
    /// FEC groups both sides closed; `None` without FEC.
    pub fec_groups: Option<u64>,
    /// Data shards both sides' FEC senders protected; `None` without FEC.
    pub fec_data_shards: Option<u64>,
    /// Groups the FEC receivers could not rebuild (ARQ retransmitted them); `None` without FEC.
    pub fec_unrecoverable: Option<u64>,
    /// Parity shards both sides sent; `None` without FEC.
    pub fec_parity_shards: Option<u64>,
    /// `FecData` packet bytes both sides sent; `None` without FEC.
    pub fec_data_bytes: Option<u64>,
    /// Parity packet bytes both sides sent; `None` without FEC.
    pub fec_parity_bytes: Option<u64>,
    /// Sliding repairs both sides' tail timers queued (part of `fec_parity_shards` unless
    /// dropped unsent); `None` without FEC.
    pub fec_tail_repairs: Option<u64>,
    /// Tail timer firings that queued no repair (the uncovered sources were likely all
    /// received; a later repair covers them); `None` without FEC.
    pub fec_tails_skipped: Option<u64>,
    /// Parity/repairs that arrived when every source they cover was already known (no use);
    /// `None` without FEC.
    pub fec_parity_ignored: Option<u64>,
    /// Peak bytes FEC receivers retained for incomplete groups; `None` without FEC.
    pub fec_peak_retained_bytes: Option<u64>,
    /// The FEC retention budget of each endpoint (what `fec_peak_retained_bytes` must stay
    /// within); `None` without FEC.
    pub fec_retention_limit: Option<u64>,
    /// The parity level of the last group each FEC sender closed, one entry per connection that
    /// protected data (adaptive FEC settles at 0 on a clean path); `None` without FEC.
    pub fec_final_parity: Option<Vec<usize>>,
    /// The highest parity/data ratio (per mille) any FEC sender saw over its cap window, and
    /// over its whole run; `None` without FEC.
    pub fec_parity_permille: Option<(u64, u64)>,
    /// Malformed FEC bodies the receivers dropped (our own packets: must be 0); `None` without
    /// FEC.
    pub fec_malformed: Option<u64>,
    /// Correctness counters.
    pub checks: EchoChecks,
    /// Hex BLAKE3 hash of the network's event trace over the whole run.
    pub trace_hash: String,
}

impl EchoReport {
    /// What went wrong, if anything (empty when every check passed).
    pub fn problems(&self) -> Vec<String> {
        let c = &self.checks;
        let mut out = Vec::new();
        if c.clients_connected != self.clients as u64 {
            out.push(format!(
                "{} of {} clients connected",
                c.clients_connected, self.clients
            ));
        }
        for (n, what) in [
            (c.content_errors, "echoes with wrong content"),
            (c.order_errors, "echoes out of order"),
            (c.wrong_channel, "messages on the wrong channel"),
            (c.send_refused, "sends refused"),
            (c.unexpected_closes, "connections closed"),
        ] {
            if n > 0 {
                out.push(format!("{n} {what}"));
            }
        }
        if self.round_trips == 0 {
            out.push("no round trip completed in the measured phase".into());
        }
        out
    }

    /// True when every check passed and round trips completed.
    pub fn is_ok(&self) -> bool {
        self.problems().is_empty()
    }
}

/// Per-endpoint seed: a SplitMix64 step of the scenario seed, so endpoints differ.
fn seed_for(seed: u64, i: u64) -> u64 {
    let mut z = seed ^ i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn client_addr(i: usize) -> SocketAddr {
    let i = i as u32 + 1;
    let ip = Ipv4Addr::new(10, 1, (i >> 8) as u8, i as u8);
    SocketAddr::new(IpAddr::V4(ip), 5000)
}

fn new_histogram() -> Histogram<u64> {
    // 1 µs .. 1 h at 3 significant digits: constant bounds, creation cannot fail.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("constant histogram bounds are valid")
}

fn hex(bytes: [u8; 32]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Fills `out` with message `seq` of `client`: id, sequence, then a byte pattern of both.
fn fill_message(out: &mut [u8], client: u32, seq: u64) {
    out[..4].copy_from_slice(&client.to_le_bytes());
    out[4..12].copy_from_slice(&seq.to_le_bytes());
    let mut x = seed_for(seq, u64::from(client));
    for chunk in out[12..].chunks_mut(8) {
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        x = x.rotate_left(13).wrapping_add(0x9e37_79b9_7f4a_7c15);
    }
}

struct ClientApp {
    id: u32,
    handle: ConnectionHandle,
    window: usize,
    payload: usize,
    connected: bool,
    closed: bool,
    next_seq: u64,
    expect_seq: u64,
    sent_at: VecDeque<Instant>,
    measuring: bool,
    measured_round_trips: u64,
    rtt_us: Histogram<u64>,
    content_errors: u64,
    order_errors: u64,
    wrong_channel: u64,
    send_refused: u64,
    scratch: Vec<u8>,
}

impl ClientApp {
    fn new(id: u32, handle: ConnectionHandle, window: usize, payload: usize) -> Self {
        Self {
            id,
            handle,
            window,
            payload,
            connected: false,
            closed: false,
            next_seq: 0,
            expect_seq: 0,
            sent_at: VecDeque::with_capacity(window),
            measuring: false,
            measured_round_trips: 0,
            rtt_us: new_histogram(),
            content_errors: 0,
            order_errors: 0,
            wrong_channel: 0,
            send_refused: 0,
            scratch: vec![0; payload],
        }
    }

    fn send_next(&mut self, now: Instant, ep: &mut Endpoint) {
        let mut msg = vec![0; self.payload];
        fill_message(&mut msg, self.id, self.next_seq);
        match ep.send(self.handle, 0, Bytes::from(msg)) {
            Ok(()) => {
                self.next_seq += 1;
                self.sent_at.push_back(now);
            }
            Err(_) => self.send_refused += 1,
        }
    }

    fn on_event(&mut self, now: Instant, ep: &mut Endpoint, event: Event) {
        match event {
            Event::Connected => {
                self.connected = true;
                for _ in 0..self.window {
                    self.send_next(now, ep);
                }
            }
            Event::Message { channel, data } => {
                if channel != 0 {
                    self.wrong_channel += 1;
                    return;
                }
                let seq = data
                    .get(4..12)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_le_bytes);
                if seq != Some(self.expect_seq) {
                    self.order_errors += 1;
                }
                fill_message(&mut self.scratch, self.id, self.expect_seq);
                if data[..] != self.scratch[..] {
                    self.content_errors += 1;
                }
                self.expect_seq += 1;
                let Some(t0) = self.sent_at.pop_front() else {
                    // An echo nobody asked for: already counted as out of order.
                    return;
                };
                if self.measuring {
                    self.measured_round_trips += 1;
                    let us = now.duration_since(t0).as_micros().max(1);
                    let _ = self.rtt_us.record(us.min(u128::from(u64::MAX)) as u64);
                }
                self.send_next(now, ep);
            }
            Event::Closed { .. } => self.closed = true,
            // Only a server with an accept hook reports incoming clients.
            Event::Incoming(_) => {}
        }
    }
}

#[derive(Default)]
struct ServerApp {
    handles: Vec<ConnectionHandle>,
    measuring: bool,
    measured_received: u64,
    closes: u64,
}

enum Role {
    Server(ServerApp),
    Client(ClientApp),
}

struct Node {
    ep: Endpoint,
    role: Role,
    timeout: Option<Instant>,
    buf: Vec<u8>,
    send_refused: u64,
}

impl Node {
    fn new(role: Role, ep: Endpoint) -> Self {
        Self {
            ep,
            role,
            timeout: None,
            buf: vec![0; 65_536],
            send_refused: 0,
        }
    }

    fn start_measuring(&mut self) {
        match &mut self.role {
            Role::Server(s) => s.measuring = true,
            Role::Client(c) => c.measuring = true,
        }
    }

    fn drain_events(&mut self, now: Instant) {
        while let Some((h, event)) = self.ep.poll_event() {
            match &mut self.role {
                Role::Client(c) => c.on_event(now, &mut self.ep, event),
                Role::Server(s) => match event {
                    Event::Connected => s.handles.push(h),
                    Event::Message { channel, data } => {
                        if s.measuring {
                            s.measured_received += 1;
                        }
                        if self.ep.send(h, channel, data).is_err() {
                            self.send_refused += 1;
                        }
                    }
                    Event::Closed { .. } => s.closes += 1,
                    Event::Incoming(_) => {}
                },
            }
        }
    }

    /// This node's live connections.
    fn connections(&self) -> impl Iterator<Item = &ricochet_proto::Connection> {
        let handles: &[ConnectionHandle] = match &self.role {
            Role::Server(s) => &s.handles,
            Role::Client(c) => std::slice::from_ref(&c.handle),
        };
        handles.iter().filter_map(|&h| self.ep.connection(h))
    }

    /// Sums of the connections' loss-recovery counters.
    fn connection_counters(&self) -> Counters {
        self.connections().fold(Counters::default(), |acc, c| {
            let s = c.stats();
            acc.add(&Counters {
                retransmitted: s.segments_retransmitted,
                lost: s.packets_lost,
                spurious: s.packets_spurious_lost,
                tlp: s.tail_loss_probes,
                rto: s.rto_count,
                recovered: s.fec.data_recovered,
                groups: s.fec.sender.groups,
                data_shards: s.fec.sender.data_shards,
                parity: s.fec.parity_sent,
                unrecoverable: s.fec.groups_unrecoverable,
                tail_repairs: s.fec.sender.tail_repairs,
                tails_skipped: s.fec.sender.tails_skipped,
                parity_ignored: s.fec.receiver.parity_ignored,
                parity_bytes: s.fec.parity_bytes,
                data_bytes: s.fec.data_bytes,
            })
        })
    }
}

/// Loss-recovery counters summed over connections.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    retransmitted: u64,
    lost: u64,
    spurious: u64,
    tlp: u64,
    rto: u64,
    recovered: u64,
    groups: u64,
    data_shards: u64,
    parity: u64,
    unrecoverable: u64,
    tail_repairs: u64,
    tails_skipped: u64,
    parity_ignored: u64,
    parity_bytes: u64,
    data_bytes: u64,
}

impl Counters {
    fn add(self, o: &Counters) -> Counters {
        Counters {
            retransmitted: self.retransmitted + o.retransmitted,
            lost: self.lost + o.lost,
            spurious: self.spurious + o.spurious,
            tlp: self.tlp + o.tlp,
            rto: self.rto + o.rto,
            recovered: self.recovered + o.recovered,
            groups: self.groups + o.groups,
            data_shards: self.data_shards + o.data_shards,
            parity: self.parity + o.parity,
            unrecoverable: self.unrecoverable + o.unrecoverable,
            tail_repairs: self.tail_repairs + o.tail_repairs,
            tails_skipped: self.tails_skipped + o.tails_skipped,
            parity_ignored: self.parity_ignored + o.parity_ignored,
            parity_bytes: self.parity_bytes + o.parity_bytes,
            data_bytes: self.data_bytes + o.data_bytes,
        }
    }
}

impl SimNode for Node {
    fn handle(&mut self, now: Instant, from: SocketAddr, bytes: &[u8]) {
        // Drops are counted by the endpoint; the echo carries on.
        let _ = self.ep.handle_datagram(now, from, bytes);
        self.drain_events(now);
    }

    fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<SocketAddr> {
        match self.ep.poll_transmit(now, &mut self.buf) {
            Some(t) => {
                buf.extend_from_slice(&self.buf[..t.size]);
                Some(t.destination)
            }
            None => {
                // The harness asks for the timer right after draining: cache it (`poll_timeout`
                // of the endpoint needs `&mut`).
                self.timeout = self.ep.poll_timeout();
                None
            }
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.timeout
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.ep.handle_timeout(now);
        self.drain_events(now);
    }
}

/// Network and connection counters at one moment.
struct Snapshot {
    wire: Wire,
    c: Counters,
    /// The largest FEC retention peak of any endpoint, and the retention limit.
    fec_peak_retained: u64,
    fec_retention_limit: u64,
    fec: FecState,
}

/// FEC state that is not a counter (levels, peaks), over every connection.
#[derive(Debug, Clone, Default)]
struct FecState {
    final_parity: Vec<usize>,
    peak_window_permille: u64,
    peak_total_permille: u64,
    malformed: u64,
}

impl FecState {
    fn of(sim: &Simulation<Node>) -> Self {
        let mut st = FecState::default();
        for (_, n) in sim.nodes() {
            for c in n.connections() {
                let f = c.stats().fec;
                st.malformed += f.malformed.total();
                if f.sender.data_shards > 0 {
                    st.final_parity.push(f.current_parity);
                    st.peak_window_permille = st
                        .peak_window_permille
                        .max(f.sender.peak_window_parity_permille);
                    let total = f.sender.parity_bytes_sent * 1000 / f.sender.data_bytes.max(1);
                    st.peak_total_permille = st.peak_total_permille.max(total);
                }
            }
        }
        st
    }
}

#[derive(Clone, Copy)]
struct Wire {
    datagrams: u64,
    bytes: u64,
    dropped: u64,
    realized_loss: f64,
}

impl Wire {
    fn of(c: &LinkCounters) -> Self {
        Self {
            datagrams: c.offered,
            bytes: c.offered_bytes,
            dropped: c.dropped(),
            realized_loss: 0.0,
        }
    }

    fn delta(&self, before: &Wire) -> Wire {
        let datagrams = self.datagrams - before.datagrams;
        let dropped = self.dropped - before.dropped;
        Wire {
            datagrams,
            bytes: self.bytes - before.bytes,
            dropped,
            realized_loss: if datagrams == 0 {
                0.0
            } else {
                dropped as f64 / datagrams as f64
            },
        }
    }
}

impl Snapshot {
    fn take(sim: &Simulation<Node>) -> Self {
        let c = sim
            .nodes()
            .map(|(_, n)| n.connection_counters())
            .fold(Counters::default(), |a, b| a.add(&b));
        let fec_peak_retained = sim
            .nodes()
            .map(|(_, n)| n.ep.fec_budget().peak() as u64)
            .max()
            .unwrap_or(0);
        let fec_retention_limit = sim
            .nodes()
            .map(|(_, n)| n.ep.fec_budget().limit() as u64)
            .max()
            .unwrap_or(0);
        Snapshot {
            wire: Wire::of(&sim.network().total_counters()),
            c,
            fec_peak_retained,
            fec_retention_limit,
            fec: FecState::of(sim),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(profile: Profile, seed: u64) -> EchoScenario {
        EchoScenario {
            clients: 2,
            window: 8,
            payload: 1024,
            warmup: Duration::from_millis(500),
            seconds: Duration::from_secs(2),
            ..EchoScenario::new(profile, seed)
        }
    }

    #[test]
    fn every_profile_echoes_intact_and_in_order() {
        for p in [Profile::None, Profile::Random, Profile::Burst] {
            let r = small(p, 3).run().unwrap();
            assert!(r.is_ok(), "{p}: {:?}", r.problems());
            assert_eq!(r.checks.clients_connected, 2);
            assert!(r.wire_bytes > r.app_bytes, "{p}: headers cost bytes");
            assert_eq!(r.trace_hash.len(), 64);
            if p == Profile::None {
                assert_eq!(r.retransmitted_segments, 0, "nothing to retransmit");
                assert_eq!(r.realized_loss, 0.0);
            } else {
                assert!(r.retransmitted_segments > 0, "{p}: loss must cause resends");
                assert!(r.realized_loss > 0.0);
            }
        }
    }

    #[test]
    fn same_seed_same_report_other_seed_other_trace() {
        let a = small(Profile::Random, 11).run().unwrap();
        let b = small(Profile::Random, 11).run().unwrap();
        assert_eq!(a, b);
        let c = small(Profile::Random, 12).run().unwrap();
        assert_ne!(a.trace_hash, c.trace_hash);
    }

    #[test]
    fn none_profile_round_trip_is_the_path_delay() {
        // 1 ms each way and a window of 1: every round trip takes at least 2 ms.
        let r = EchoScenario {
            clients: 1,
            window: 1,
            payload: 64,
            warmup: Duration::from_millis(100),
            seconds: Duration::from_secs(1),
            ..EchoScenario::new(Profile::None, 1)
        }
        .run()
        .unwrap();
        assert!(r.is_ok(), "{:?}", r.problems());
        assert!(r.rtt_p50_us >= 2000, "p50 {} µs", r.rtt_p50_us);
        assert!(r.round_trips <= 500, "{} round trips in 1 s", r.round_trips);
    }

    #[test]
    fn bad_scenarios_are_refused() {
        let mut s = small(Profile::None, 1);
        s.none_delay = Duration::ZERO;
        assert!(matches!(s.run(), Err(EchoError::Invalid(_))));
        let mut s = small(Profile::None, 1);
        s.payload = MIN_PAYLOAD - 1;
        assert!(matches!(s.run(), Err(EchoError::Invalid(_))));
        let mut s = small(Profile::None, 1);
        s.window = 0;
        assert!(matches!(s.run(), Err(EchoError::Invalid(_))));
    }

    #[test]
    fn corrupted_echo_is_detected() {
        let mut app = ClientApp::new(0, ConnectionHandle(1), 1, 32);
        let mut msg = vec![0; 32];
        fill_message(&mut msg, 0, 0);
        msg[20] ^= 1;
        app.sent_at.push_back(Instant::now());
        let mut ep = Endpoint::new(EndpointConfig::default(), Instant::now(), 1);
        app.on_event(
            Instant::now(),
            &mut ep,
            Event::Message {
                channel: 0,
                data: Bytes::from(msg),
            },
        );
        assert_eq!(app.content_errors, 1);
        assert_eq!(app.order_errors, 0);
    }
}
