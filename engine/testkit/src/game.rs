//! A game server on a tick, in the simulator: N players connected to one server endpoint, the
//! server sends every player a snapshot per tick on an unreliable-sequenced channel, every
//! player sends a small input per tick on a reliable-ordered channel (the shape of `bench game`).
//!
//! It exists to weigh what the server's steady state costs in ways that are exact in the
//! simulator, such as heap allocations: the library never counts them, but a caller with a
//! counting global allocator passes [`GameScenario::server_scope`], which the run calls with
//! `true` when the server's protocol code is entered during the measured phase and with
//! `false` when it is left (the game's own work, building the tick's snapshot, is left out).
//!
//! ```
//! use ricochet_testkit::game::GameScenario;
//!
//! let out = GameScenario { players: 10, ..GameScenario::new(1) }.run().unwrap();
//! assert_eq!(out.connected, 10);
//! assert_eq!(out.inputs_lost, 0);
//! assert_eq!(out.player_ticks, 10 * out.ticks);
//! assert!(out.snapshots_received >= out.player_ticks - 10);
//! ```

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use ricochet_proto::token::{ConnectToken, TokenKey};
use ricochet_proto::{Admission, TokenAdmission};
use ricochet_proto::{Config, ConnectionHandle, Endpoint, EndpointConfig, Event};
use ricochet_proto::{ListenConfig, Transmit};

use super::harness::{SimError, SimNode, Simulation};
use super::impair::Impairment;

/// The channel of the players' inputs (reliable-ordered in every profile).
pub const INPUT_CHANNEL: u8 = 0;
/// The channel of the server's snapshots (unreliable-sequenced in every profile).
pub const SNAPSHOT_CHANNEL: u8 = 3;

/// The protocol id of the scenario's tokens.
const PROTOCOL_ID: u64 = 0x6761_6d65_7469_636b;

/// Largest datagram a node writes (above every config's `max_datagram_size` used here).
const DATAGRAM_ROOM: usize = 2048;

/// N players on a ticking game server (see the module docs).
#[derive(Debug, Clone)]
pub struct GameScenario {
    /// Players, one client endpoint each.
    pub players: usize,
    /// Seeds every endpoint's randomness and the token key.
    pub seed: u64,
    /// One-way delay of every link (no loss).
    pub one_way_delay: Duration,
    /// Server tick and player input rate.
    pub tick: Duration,
    /// Snapshot bytes per player per tick (at least 8: the tick number).
    pub snapshot_bytes: usize,
    /// Input bytes per player per tick (at least 8: the input's sequence number).
    pub input_bytes: usize,
    /// Simulated time after every player connected before the measured phase.
    pub warmup: Duration,
    /// Simulated time measured.
    pub measured: Duration,
    /// Connection settings of both sides (the game profile).
    pub config: Config,
    /// Server sessions hold an input's ACK until the next tick, where it rides the snapshot
    /// (`bench game --acks-on-tick`).
    pub acks_on_tick: bool,
    /// Admit players by connect token (every packet protected: the production path); `false`:
    /// insecure admission.
    pub tokens: bool,
    /// Called with `true` when the server's protocol code is entered during the measured phase
    /// and `false` when it is left (see the module docs).
    pub server_scope: Option<fn(bool)>,
}

impl GameScenario {
    /// 100 players on 5 ms links, 60 Hz, 200 B snapshots, 32 B inputs, game profile, connect
    /// tokens, 5 s warm-up (a new connection's adaptive-FEC history fills in its first 4 s),
    /// 2 s measured.
    pub fn new(seed: u64) -> Self {
        Self {
            players: 100,
            seed,
            one_way_delay: Duration::from_millis(5),
            tick: Duration::from_micros(16_667),
            snapshot_bytes: 200,
            input_bytes: 32,
            warmup: Duration::from_secs(5),
            measured: Duration::from_secs(2),
            config: Config::game(),
            acks_on_tick: false,
            tokens: true,
            server_scope: None,
        }
    }

    /// Runs the scenario.
    pub fn run(&self) -> Result<GameOutcome, SimError> {
        let mut sim: Simulation<Node> =
            Simulation::new(self.seed, Impairment::none().with_delay(self.one_way_delay))?;
        let base = sim.now();
        let client_cfg = Arc::new(self.config.clone());
        let mut server_cfg = self.config.clone();
        if self.acks_on_tick {
            server_cfg.max_ack_delay = self.tick + Duration::from_millis(1);
            server_cfg.ack_frequency = 8;
        }
        let server_cfg = Arc::new(server_cfg);
        let server_addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 7000);
        // A fixed wall clock for token expiry: the run stays a function of the scenario.
        let unix = Duration::from_secs(1_800_000_000);
        let mut rng = ChaCha8Rng::seed_from_u64(mix(self.seed, u64::MAX));
        let key = TokenKey::generate(&mut rng);
        let mut listen = ListenConfig::insecure();
        if self.tokens {
            listen.admission = Admission::Tokens(TokenAdmission::new(
                key.clone(),
                PROTOCOL_ID,
                vec![server_addr],
            ));
        }
        let mut server = Endpoint::new(
            EndpointConfig::default().with(|c| {
                c.connection = server_cfg.clone();
                c.server = Some(listen);
            }),
            base,
            mix(self.seed, 0),
        );
        server.set_unix_time(base, unix);
        let n = self.players;
        sim.add_node(
            server_addr,
            Node {
                ep: server,
                role: Role::Server(Server {
                    sessions: Vec::with_capacity(n),
                    next_tick: base + self.tick,
                    period: self.tick,
                    tick: 0,
                    body: vec![0; self.snapshot_bytes.max(8)],
                    measuring: false,
                    scope: self.server_scope,
                    ticks: 0,
                    snapshots_sent: 0,
                    inputs_received: 0,
                    input_errors: 0,
                    next_input: Vec::with_capacity(n),
                }),
            },
        )?;
        for i in 0..n {
            let ep = Endpoint::new(
                EndpointConfig::default().with(|c| c.connection = client_cfg.clone()),
                base,
                mix(self.seed, i as u64 + 1),
            );
            let token = if self.tokens {
                Some(super::sessions::player_token(
                    PROTOCOL_ID,
                    &key,
                    i,
                    server_addr,
                    unix,
                    &mut rng,
                )?)
            } else {
                None
            };
            // Players' ticks are spread over the server's tick, as real clocks are.
            let phase = self.tick.mul_f64(i as f64 / n.max(1) as f64);
            sim.add_node(
                player_addr(i),
                Node {
                    ep,
                    role: Role::Player(Player {
                        handle: None,
                        token,
                        server: server_addr,
                        connected: false,
                        next_input: base + phase,
                        tick: self.tick,
                        input: vec![0; self.input_bytes.max(8)],
                        sent: 0,
                        snapshots: 0,
                        newest: 0,
                        stale: 0,
                    }),
                },
            )?;
        }
        sim.run_while(base + Duration::from_secs(5), |s| {
            s.nodes()
                .any(|(_, n)| matches!(&n.role, Role::Player(p) if !p.connected))
        })?;
        sim.run_for(self.warmup)?;
        let before = Totals::of(&sim);
        set_measuring(&mut sim, server_addr, true);
        sim.run_for(self.measured)?;
        set_measuring(&mut sim, server_addr, false);
        let after = Totals::of(&sim);
        // Let the inputs still in flight arrive (players stop sending first).
        for i in 0..n {
            if let Some(Node {
                role: Role::Player(p),
                ..
            }) = sim.node_mut(player_addr(i))
            {
                p.tick = Duration::ZERO;
            }
        }
        sim.run_for(Duration::from_secs(1))?;
        let end = Totals::of(&sim);
        Ok(GameOutcome {
            connected: end.connected,
            ticks: after.ticks - before.ticks,
            player_ticks: after.snapshots_sent - before.snapshots_sent,
            snapshots_received: after.snapshots_received - before.snapshots_received,
            snapshots_stale: end.stale,
            inputs_sent: end.inputs_sent,
            inputs_lost: end.inputs_sent.saturating_sub(end.inputs_received),
            input_order_errors: end.input_errors,
        })
    }
}

/// What a [`GameScenario`] run measured (counts over the measured phase unless stated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GameOutcome {
    /// Players connected at the end.
    pub connected: usize,
    /// Server ticks.
    pub ticks: u64,
    /// Snapshots the server sent (one per connected player per tick).
    pub player_ticks: u64,
    /// Snapshots the players received.
    pub snapshots_received: u64,
    /// Snapshots that arrived after a newer one, whole run (0 on these lossless links).
    pub snapshots_stale: u64,
    /// Inputs the players sent, whole run.
    pub inputs_sent: u64,
    /// Inputs sent but never received by the server, whole run (reliable: must be 0).
    pub inputs_lost: u64,
    /// Inputs that arrived out of order or on the wrong channel, whole run.
    pub input_order_errors: u64,
}

#[derive(Default)]
struct Totals {
    connected: usize,
    ticks: u64,
    snapshots_sent: u64,
    snapshots_received: u64,
    stale: u64,
    inputs_sent: u64,
    inputs_received: u64,
    input_errors: u64,
}

impl Totals {
    fn of(sim: &Simulation<Node>) -> Self {
        let mut t = Totals::default();
        for (_, node) in sim.nodes() {
            match &node.role {
                Role::Server(s) => {
                    t.ticks = s.ticks;
                    t.snapshots_sent = s.snapshots_sent;
                    t.inputs_received = s.inputs_received;
                    t.input_errors = s.input_errors;
                }
                Role::Player(p) => {
                    t.connected += usize::from(p.connected);
                    t.snapshots_received += p.snapshots;
                    t.stale += p.stale;
                    t.inputs_sent += p.sent;
                }
            }
        }
        t
    }
}

fn set_measuring(sim: &mut Simulation<Node>, server: SocketAddr, on: bool) {
    if let Some(Node {
        role: Role::Server(s),
        ..
    }) = sim.node_mut(server)
    {
        s.measuring = on;
    }
}

/// `(seed, i)` → a well-mixed 64-bit value (SplitMix64 finalizer).
fn mix(seed: u64, i: u64) -> u64 {
    let mut z = seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Player `i`'s address (10.3.0.0/16, one address each).
fn player_addr(i: usize) -> SocketAddr {
    let ip = i as u32 + 1;
    let addr = Ipv4Addr::new(10, 3 + (ip >> 16) as u8, (ip >> 8) as u8, ip as u8);
    SocketAddr::new(IpAddr::V4(addr), 5000)
}

struct Server {
    sessions: Vec<ConnectionHandle>,
    next_tick: Instant,
    period: Duration,
    tick: u64,
    body: Vec<u8>,
    measuring: bool,
    scope: Option<fn(bool)>,
    ticks: u64,
    snapshots_sent: u64,
    inputs_received: u64,
    input_errors: u64,
    /// Next expected input per session, sorted by handle: the game's own bookkeeping runs
    /// inside the measured scope (between the endpoint's events), and a binary search keeps
    /// it small beside the protocol's work at any number of players (a scan of every session
    /// per input grew with them).
    next_input: Vec<(ConnectionHandle, u64)>,
}

struct Player {
    handle: Option<ConnectionHandle>,
    token: Option<Box<ConnectToken>>,
    server: SocketAddr,
    connected: bool,
    next_input: Instant,
    /// Input period; zero once the players stopped.
    tick: Duration,
    input: Vec<u8>,
    sent: u64,
    snapshots: u64,
    newest: u64,
    stale: u64,
}

enum Role {
    Server(Server),
    Player(Player),
}

struct Node {
    ep: Endpoint,
    role: Role,
}

impl Node {
    /// Enters (`true`) or leaves the server's measured scope.
    fn scope(&self, on: bool) {
        if let Role::Server(s) = &self.role {
            if let (true, Some(f)) = (s.measuring, s.scope) {
                f(on);
            }
        }
    }

    fn drain_events(&mut self, now: Instant) {
        while let Some((h, event)) = self.ep.poll_event() {
            match (&mut self.role, event) {
                (Role::Server(s), Event::Connected) => {
                    s.sessions.push(h);
                    if let Err(at) = s.next_input.binary_search_by_key(&h, |e| e.0) {
                        s.next_input.insert(at, (h, 0));
                    }
                }
                (Role::Server(s), Event::Message { channel, data }) => {
                    s.inputs_received += 1;
                    let seq = data
                        .get(..8)
                        .and_then(|b| <[u8; 8]>::try_from(b).ok())
                        .map(u64::from_le_bytes);
                    let next = match s.next_input.binary_search_by_key(&h, |e| e.0) {
                        Ok(i) => s.next_input.get_mut(i),
                        Err(_) => None,
                    };
                    match (next, seq) {
                        (Some(e), Some(q)) if channel == INPUT_CHANNEL && q == e.1 => e.1 += 1,
                        _ => s.input_errors += 1,
                    }
                }
                (Role::Server(s), Event::Closed { .. }) => s.sessions.retain(|&x| x != h),
                (Role::Server(_), Event::Incoming(_)) => self.ep.accept(h),
                (Role::Player(p), Event::Connected) => p.connected = true,
                (Role::Player(p), Event::Message { channel, data }) => {
                    let tick = data
                        .get(..8)
                        .and_then(|b| <[u8; 8]>::try_from(b).ok())
                        .map_or(0, u64::from_le_bytes);
                    if channel == SNAPSHOT_CHANNEL {
                        p.snapshots += 1;
                        if tick < p.newest {
                            p.stale += 1;
                        }
                        p.newest = p.newest.max(tick);
                    }
                }
                (Role::Player(p), Event::Closed { .. }) => p.connected = false,
                (Role::Player(_), Event::Incoming(_)) => {}
            }
        }
        self.on_time(now);
    }

    /// The server's tick and the players' inputs, when due.
    fn on_time(&mut self, now: Instant) {
        match &mut self.role {
            Role::Server(s) => {
                while now >= s.next_tick {
                    s.next_tick += s.period;
                    s.tick += 1;
                    s.ticks += 1;
                    // The game's own work (its snapshot) is outside the measured scope.
                    let measuring = s.measuring;
                    if let (true, Some(f)) = (measuring, s.scope) {
                        f(false);
                    }
                    s.body[..8].copy_from_slice(&s.tick.to_le_bytes());
                    let snapshot = Bytes::copy_from_slice(&s.body);
                    // The first clone shares the buffer (an allocation of its own); the sends'
                    // clones only count references.
                    let shared = snapshot.clone();
                    if let (true, Some(f)) = (measuring, s.scope) {
                        f(true);
                    }
                    for &h in &s.sessions {
                        if self.ep.send(h, SNAPSHOT_CHANNEL, shared.clone()).is_ok() {
                            s.snapshots_sent += 1;
                        }
                    }
                    if let (true, Some(f)) = (measuring, s.scope) {
                        f(false);
                    }
                    drop((snapshot, shared));
                    if let (true, Some(f)) = (measuring, s.scope) {
                        f(true);
                    }
                }
            }
            Role::Player(p) => {
                if p.handle.is_none() {
                    p.handle = Some(match p.token.take() {
                        Some(t) => self.ep.connect_with_token(now, &t),
                        None => self.ep.connect(now, p.server),
                    });
                }
                let Some(h) = p.handle else { return };
                while p.connected && !p.tick.is_zero() && now >= p.next_input {
                    p.next_input += p.tick;
                    p.input[..8].copy_from_slice(&p.sent.to_le_bytes());
                    if self
                        .ep
                        .send(h, INPUT_CHANNEL, Bytes::copy_from_slice(&p.input))
                        .is_ok()
                    {
                        p.sent += 1;
                    }
                }
                if !p.connected {
                    // Inputs start a tick after the handshake, on the player's phase.
                    while p.next_input <= now {
                        p.next_input += p.tick.max(Duration::from_millis(1));
                    }
                }
            }
        }
    }
}

impl SimNode for Node {
    fn handle(&mut self, now: Instant, from: SocketAddr, bytes: &[u8]) {
        self.scope(true);
        // Drops are the endpoint's to count.
        let _ = self.ep.handle_datagram(now, from, bytes);
        self.drain_events(now);
        self.scope(false);
    }

    fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<SocketAddr> {
        // The simulator's buffer is its own (it reuses them): sized outside the scope.
        buf.resize(DATAGRAM_ROOM, 0);
        self.scope(true);
        let out = self.ep.poll_transmit(now, buf);
        self.scope(false);
        match out {
            Some(Transmit { destination, size }) => {
                buf.truncate(size);
                Some(destination)
            }
            None => {
                buf.clear();
                None
            }
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.scope(true);
        let own = self.ep.poll_timeout();
        self.scope(false);
        let app = match &self.role {
            Role::Server(s) => Some(s.next_tick),
            Role::Player(p) if p.handle.is_none() => Some(p.next_input),
            Role::Player(p) if p.connected && !p.tick.is_zero() => Some(p.next_input),
            Role::Player(_) => None,
        };
        match (own, app) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.scope(true);
        self.ep.handle_timeout(now);
        self.drain_events(now);
        self.scope(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicI64, Ordering::SeqCst};

    static DEPTH: AtomicI64 = AtomicI64::new(0);
    static ENTERED: AtomicI64 = AtomicI64::new(0);
    static UNBALANCED: AtomicI64 = AtomicI64::new(0);

    fn scope(on: bool) {
        let d = DEPTH.fetch_add(if on { 1 } else { -1 }, SeqCst) + if on { 1 } else { -1 };
        ENTERED.fetch_add(i64::from(on), SeqCst);
        if !(0..=1).contains(&d) {
            UNBALANCED.fetch_add(1, SeqCst);
        }
    }

    /// Every variant delivers every input in order and a snapshot per player-tick, and the
    /// measured scope is entered and left in turn (never nested), ending outside.
    #[test]
    fn every_variant_delivers_and_the_scope_is_balanced() {
        for (tokens, acks_on_tick) in [(true, false), (false, false), (true, true)] {
            let s = GameScenario {
                players: 20,
                tokens,
                acks_on_tick,
                warmup: Duration::from_millis(300),
                measured: Duration::from_millis(500),
                server_scope: Some(scope),
                ..GameScenario::new(3)
            };
            let out = s.run().unwrap();
            let case = format!("tokens {tokens} acks_on_tick {acks_on_tick}: {out:?}");
            assert_eq!(out.connected, 20, "{case}");
            assert_eq!(out.inputs_lost, 0, "{case}");
            assert_eq!(out.input_order_errors, 0, "{case}");
            assert_eq!(out.snapshots_stale, 0, "{case}");
            assert!((29..=31).contains(&out.ticks), "{case}");
            assert_eq!(out.player_ticks, 20 * out.ticks, "{case}");
            assert!(out.snapshots_received + 20 >= out.player_ticks, "{case}");
            assert!(out.inputs_sent > 20 * 40, "{case}");
        }
        assert_eq!(DEPTH.load(SeqCst), 0);
        assert_eq!(UNBALANCED.load(SeqCst), 0);
        assert!(ENTERED.load(SeqCst) > 1000);
    }
}
