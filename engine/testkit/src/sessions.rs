//! Many sessions on one server endpoint, in the simulator: how many connect, how fast, and the
//! server endpoint they leave behind (so a caller can weigh what it holds per session).
//!
//! One server [`Endpoint`] and N client `Endpoint`s (one connection each) run as [`SimNode`]s
//! on links with a fixed one-way delay and no loss. Every client starts its handshake at once
//! (or spread over [`SessionsScenario::connect_spread`]); the run waits until all of them are
//! connected or refused, then lets the sessions sit idle for [`SessionsScenario::settle`]
//! (keepalives flow, and the connections give back the buffers the handshake and the last
//! traffic grew). With a [`SessionsScenario::load`], every client then sends its messages at
//! once on the reliable-ordered channel, the server echoes each, and the run stops
//! [`SessionsScenario::load_for`] later (the server then holds the echoes in flight), or
//! [`SessionsScenario::settle_after_load`] after that.
//!
//! Everything is a function of the scenario (seed included), allocations too: a caller with a
//! counting global allocator can drop [`SessionsOutcome::server`] and read exactly how many
//! heap bytes the server endpoint held (the library itself never counts allocations).
//!
//! ```
//! use std::time::Duration;
//! use ricochet_testkit::sessions::SessionsScenario;
//!
//! let out = SessionsScenario { clients: 50, ..SessionsScenario::new(3) }.run().unwrap();
//! assert_eq!(out.connected, 50);
//! assert_eq!(out.server.connection_count(), 50);
//! assert!(out.all_connected_after.unwrap() < Duration::from_millis(100));
//! ```

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::harness::{SimError, SimNode, Simulation};
use super::impair::Impairment;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use ricochet_proto::token::{ConnectToken, TokenKey, TokenParams};
use ricochet_proto::{Admission, TokenAdmission};
use ricochet_proto::{CloseReason, Config, ConnectionHandle, Endpoint, EndpointConfig, Event};
use ricochet_proto::{ListenConfig, Transmit};

/// The protocol id of the scenario's tokens.
const PROTOCOL_ID: u64 = 0x7365_7373_696f_6e73;

/// Many clients connecting to one server (see the module docs).
#[derive(Debug, Clone)]
pub struct SessionsScenario {
    /// Client endpoints, one connection each.
    pub clients: usize,
    /// Clients that share one IP address (distinct ports), as players behind one NAT do; the
    /// server's per-address limits see them as one address.
    pub clients_per_ip: usize,
    /// Seeds every endpoint's randomness (the links have no impairment but their delay).
    pub seed: u64,
    /// One-way delay of every link.
    pub one_way_delay: Duration,
    /// Client `i` starts connecting at `i × connect_spread / clients` (zero: all at once).
    pub connect_spread: Duration,
    /// Longest the run waits for every client to connect or be refused.
    pub connect_deadline: Duration,
    /// Idle time after the last client connected (or the deadline passed).
    pub settle: Duration,
    /// Messages × bytes every client sends at once after settling (the server echoes them),
    /// on channel 0 (which must be reliable).
    pub load: Option<(usize, usize)>,
    /// How long the load runs before the outcome is taken.
    pub load_for: Duration,
    /// Idle time after the load (zero: the outcome is taken with the load in flight).
    pub settle_after_load: Duration,
    /// Connection settings of both sides.
    pub config: Config,
    /// The server's limits.
    pub server: ListenConfig,
    /// Protect every session's packets with keys derived from this secret
    /// ([`EndpointConfig::test_session_secret`]); `None`: the insecure mode.
    pub test_session_secret: Option<[u8; 32]>,
    /// Admit clients by connect token (the production path: a token per client, minted with
    /// a key drawn from the seed; every packet protected). Overrides `server`'s admission.
    pub tokens: bool,
}

impl SessionsScenario {
    /// The standard shape: 1,000 clients behind one address each, connecting at once over
    /// 1 ms links, 5 s to connect, 3 s idle, default settings, insecure admission (no tokens).
    pub fn new(seed: u64) -> Self {
        Self {
            clients: 1000,
            clients_per_ip: 1,
            seed,
            one_way_delay: Duration::from_millis(1),
            connect_spread: Duration::ZERO,
            connect_deadline: Duration::from_secs(5),
            settle: Duration::from_secs(3),
            load: None,
            load_for: Duration::from_micros(1500),
            settle_after_load: Duration::ZERO,
            config: Config::default(),
            server: ListenConfig::insecure(),
            test_session_secret: None,
            tokens: false,
        }
    }

    /// Runs the scenario; the clients and the network are dropped before it returns, the
    /// server endpoint is handed back.
    pub fn run(&self) -> Result<SessionsOutcome, SimError> {
        let mut sim: Simulation<Node> =
            Simulation::new(self.seed, Impairment::none().with_delay(self.one_way_delay))?;
        let base = sim.now();
        let cfg = Arc::new(self.config.clone());
        let server_addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 7000);
        // A fixed wall clock: token expiry is checked against it, and the run stays a function
        // of the scenario.
        let unix = Duration::from_secs(1_800_000_000);
        let mut rng = ChaCha8Rng::seed_from_u64(mix(self.seed, u64::MAX));
        let key = TokenKey::generate(&mut rng);
        let mut listen = self.server.clone();
        if self.tokens {
            listen.admission = Admission::Tokens(TokenAdmission::new(
                key.clone(),
                PROTOCOL_ID,
                vec![server_addr],
            ));
        }
        let mut server = Endpoint::new(
            EndpointConfig::default().with(|c| {
                c.connection = cfg.clone();
                c.server = Some(listen);
                c.test_session_secret = self.test_session_secret;
            }),
            base,
            mix(self.seed, 0),
        );
        server.set_unix_time(base, unix);
        sim.add_node(server_addr, Node::server(server))?;
        let per_ip = self.clients_per_ip.max(1);
        let n = self.clients;
        for i in 0..n {
            let ep = Endpoint::new(
                EndpointConfig::default().with(|c| {
                    c.connection = cfg.clone();
                    c.test_session_secret = self.test_session_secret;
                }),
                base,
                mix(self.seed, i as u64 + 1),
            );
            let start = base + self.connect_spread.mul_f64(i as f64 / n.max(1) as f64);
            let token = if self.tokens {
                Some(player_token(
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
            sim.add_node(
                client_addr(i / per_ip, i % per_ip),
                Node::client(ep, server_addr, start, token),
            )?;
        }
        let deadline = base + self.connect_deadline;
        sim.run_while(deadline, |s| {
            s.nodes()
                .any(|(_, node)| matches!(node.role, Role::Client(ref c) if c.outcome.is_none()))
        })?;
        let all_connected_after = sim
            .nodes()
            .filter_map(|(_, node)| match &node.role {
                Role::Client(c) => Some(c.connected_at),
                Role::Server(_) => None,
            })
            .try_fold(Duration::ZERO, |acc, t| {
                t.map(|t| acc.max(t.saturating_duration_since(base)))
            });
        sim.run_for(self.settle)?;
        if let Some((messages, bytes)) = self.load {
            let now = sim.now();
            let addrs: Vec<SocketAddr> = sim.nodes().map(|(a, _)| a).collect();
            for a in addrs {
                if let Some(node) = sim.node_mut(a) {
                    node.send_load(now, messages, bytes);
                }
            }
            sim.run_for(self.load_for)?;
            if !self.settle_after_load.is_zero() {
                sim.run_for(self.settle_after_load)?;
            }
        }
        let mut connected = 0;
        let mut refused = Vec::new();
        let mut timed_out = 0;
        let mut server = None;
        for (_, node) in sim.into_nodes() {
            match node.role {
                Role::Server(s) => {
                    server = Some((node.ep, s.echoed));
                }
                Role::Client(c) => match c.outcome {
                    Some(Ok(())) => connected += 1,
                    Some(Err(CloseReason::HandshakeTimeout)) | None => timed_out += 1,
                    Some(Err(r)) => refused.push(r),
                },
            }
        }
        // The server was added first: it is always there.
        let (server, echoed) = server.ok_or(SimError::NoSuchNode(server_addr))?;
        Ok(SessionsOutcome {
            server,
            connected,
            refused,
            timed_out,
            all_connected_after,
            echoed,
        })
    }
}

/// What a [`SessionsScenario`] run left.
#[derive(Debug)]
pub struct SessionsOutcome {
    /// The server endpoint, with its sessions.
    pub server: Endpoint,
    /// Clients whose handshake completed (and that were not closed by then).
    pub connected: usize,
    /// Why each refused client was refused.
    pub refused: Vec<CloseReason>,
    /// Clients that neither connected nor were refused.
    pub timed_out: usize,
    /// Simulated time from the start until the last client connected (`None` if one did not).
    pub all_connected_after: Option<Duration>,
    /// Messages the server echoed.
    pub echoed: u64,
}

/// Largest datagram a node writes (above every config's `max_datagram_size` used here).
const DATAGRAM_ROOM: usize = 2048;

/// `(seed, i)` → a well-mixed 64-bit value (SplitMix64 finalizer).
fn mix(seed: u64, i: u64) -> u64 {
    let mut z = seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Client `ip`'s address `port` (10.2.0.0/16, ports from 1024).
fn client_addr(ip: usize, port: usize) -> SocketAddr {
    let ip = ip as u32 + 1;
    let addr = Ipv4Addr::new(10, 2 + (ip >> 16) as u8, (ip >> 8) as u8, ip as u8);
    SocketAddr::new(IpAddr::V4(addr), 1024 + (port % 64_000) as u16)
}

struct ClientState {
    handle: Option<ConnectionHandle>,
    token: Option<Box<ConnectToken>>,
    server: SocketAddr,
    start: Instant,
    outcome: Option<Result<(), CloseReason>>,
    connected_at: Option<Instant>,
}

#[derive(Default)]
struct ServerState {
    echoed: u64,
}

enum Role {
    Server(ServerState),
    Client(ClientState),
}

struct Node {
    ep: Endpoint,
    role: Role,
}

impl Node {
    fn server(ep: Endpoint) -> Self {
        Node {
            ep,
            role: Role::Server(ServerState::default()),
        }
    }

    fn client(
        ep: Endpoint,
        server: SocketAddr,
        start: Instant,
        token: Option<Box<ConnectToken>>,
    ) -> Self {
        Node {
            ep,
            role: Role::Client(ClientState {
                handle: None,
                token,
                server,
                start,
                outcome: None,
                connected_at: None,
            }),
        }
    }

    fn send_load(&mut self, _now: Instant, messages: usize, bytes: usize) {
        if let Role::Client(c) = &self.role {
            if let (Some(h), Some(Ok(()))) = (c.handle, c.outcome) {
                for m in 0..messages {
                    let mut body = vec![0u8; bytes];
                    body.iter_mut()
                        .enumerate()
                        .for_each(|(i, b)| *b = (i + m) as u8);
                    // A refusal (queue full) leaves fewer messages in flight: the caller sized it.
                    let _ = self.ep.send(h, 0, Bytes::from(body));
                }
            }
        }
    }

    fn drain_events(&mut self, now: Instant) {
        while let Some((h, event)) = self.ep.poll_event() {
            match (&mut self.role, event) {
                (Role::Server(s), Event::Message { channel, data }) => {
                    if self.ep.send(h, channel, data).is_ok() {
                        s.echoed += 1;
                    }
                }
                (Role::Server(_), Event::Incoming(_)) => self.ep.accept(h),
                (Role::Server(_), _) => {}
                (Role::Client(c), Event::Connected) => {
                    c.outcome = Some(Ok(()));
                    c.connected_at = Some(now);
                }
                (Role::Client(c), Event::Closed { reason, .. }) => {
                    if c.outcome.is_none() {
                        c.outcome = Some(Err(reason));
                    }
                }
                (Role::Client(_), Event::Message { .. } | Event::Incoming(_)) => {}
            }
        }
    }

    fn start_if_due(&mut self, now: Instant) {
        if let Role::Client(c) = &mut self.role {
            if c.handle.is_none() && now >= c.start {
                c.handle = Some(match c.token.take() {
                    Some(t) => self.ep.connect_with_token(now, &t),
                    None => self.ep.connect(now, c.server),
                });
            }
        }
    }
}

impl SimNode for Node {
    fn handle(&mut self, now: Instant, from: SocketAddr, bytes: &[u8]) {
        // Drops are the endpoint's to count.
        let _ = self.ep.handle_datagram(now, from, bytes);
        self.drain_events(now);
    }

    fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<SocketAddr> {
        self.start_if_due(now);
        // Room for one datagram of the default size (the simulator reuses its buffers).
        buf.resize(DATAGRAM_ROOM, 0);
        match self.ep.poll_transmit(now, buf) {
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
        let own = self.ep.poll_timeout();
        match &self.role {
            Role::Client(c) if c.handle.is_none() => Some(own.map_or(c.start, |t| t.min(c.start))),
            _ => own,
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.start_if_due(now);
        self.ep.handle_timeout(now);
        self.drain_events(now);
    }
}

/// Player `i`'s connect token for `server_addr` under `protocol_id`, valid an hour from
/// `unix`, sealed under the scenario's `key` (the same draws from `rng` in every scenario).
pub(crate) fn player_token(
    protocol_id: u64,
    key: &TokenKey,
    i: usize,
    server_addr: SocketAddr,
    unix: Duration,
    rng: &mut ChaCha8Rng,
) -> Result<Box<ConnectToken>, SimError> {
    let params = TokenParams {
        protocol_id,
        client_id: i as u64,
        server_addresses: &[server_addr],
        expires_unix: unix.as_secs() + 3600,
        user_data: b"",
    };
    // A constant key and valid parameters: sealing cannot fail.
    ConnectToken::seal(key, &params, rng)
        .map(Box::new)
        .map_err(|_| SimError::NoSuchNode(server_addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_behind_one_address_are_limited_per_address() {
        let s = SessionsScenario {
            clients: 40,
            clients_per_ip: 40,
            server: {
                let mut s = ListenConfig::insecure();
                s.max_sessions_per_address = 30;
                s
            },
            settle: Duration::from_millis(100),
            ..SessionsScenario::new(5)
        };
        let out = s.run().unwrap();
        assert_eq!(out.connected, 30);
        assert_eq!(out.refused, vec![CloseReason::TooManyFromAddress; 10]);
        assert_eq!(out.server.connection_count(), 30);
        assert_eq!(out.all_connected_after, None);
    }

    #[test]
    fn load_is_echoed_and_in_flight_at_the_end() {
        let s = SessionsScenario {
            clients: 3,
            settle: Duration::from_millis(100),
            load: Some((4, 100)),
            ..SessionsScenario::new(6)
        };
        let out = s.run().unwrap();
        assert_eq!(out.connected, 3);
        assert_eq!(out.echoed, 12);
        assert_eq!(out.server.stats().accepted, 3);
    }

    /// Sessions whose buffers were trimmed after an idle second (and those just before or after
    /// the trim) still echo everything, with tokens and an accept hook as well as without.
    #[test]
    fn sessions_echo_across_the_idle_trim() {
        for tokens in [false, true] {
            for settle_ms in [900u64, 1000, 1001, 1050, 2000] {
                let mut s = SessionsScenario {
                    clients: 20,
                    tokens,
                    settle: Duration::from_millis(settle_ms),
                    load: Some((4, 64)),
                    load_for: Duration::from_millis(500),
                    ..SessionsScenario::new(settle_ms)
                };
                s.server.accept_hook = true;
                let out = s.run().unwrap();
                assert_eq!(out.connected, 20, "tokens {tokens} settle {settle_ms} ms");
                assert_eq!(out.echoed, 80, "tokens {tokens} settle {settle_ms} ms");
            }
        }
    }
}
