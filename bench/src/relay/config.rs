//! A relay's settings.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use ricochet_testkit::Impairment;

use super::bottleneck::BottleneckConfig;

/// Socket buffer size the relay asks for (like the reference's endpoints: 4 MiB).
pub const DEFAULT_SOCKET_BUFFER: usize = 4 << 20;

/// How a relay is set up. [`RelayConfig::new`] gives the reference's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RelayConfig {
    /// Where the real server listens.
    pub server: SocketAddr,
    /// The relay's front-door address (port 0: any free port). Its IP is also the local IP of
    /// the upstream sockets when it is of the server's address family (else they bind the
    /// unspecified address of the server's family).
    pub listen: SocketAddr,
    /// Impairment of the client-to-server direction of every route.
    pub up: Impairment,
    /// Impairment of the server-to-client direction of every route.
    pub down: Impairment,
    /// Seed of the impairment RNG streams (one per route and direction).
    pub seed: u64,
    /// Upstream sockets to bind at start; routes beyond them bind theirs on the client's first
    /// datagram.
    pub clients: usize,
    /// Most routes (client addresses); datagrams from further new clients are dropped and
    /// counted ([`RelayErrors::route_limit`](super::RelayErrors::route_limit)).
    pub max_routes: usize,
    /// Receive and send buffer size to ask for on every relay socket.
    pub socket_buffer: usize,
    /// How long before a due time the thread stops sleeping and polls without blocking, to
    /// absorb wake-up latency (zero: sleep right up to the due time).
    pub spin: Duration,
    /// Nice value for the relay thread (Linux; negative values need `CAP_SYS_NICE`), so that on
    /// a busy machine the network model is not the thread that waits for a core. `None` leaves
    /// the thread's priority alone.
    pub nice: Option<i32>,
    /// A bottleneck (rate limit, drop-tail queue) on the client-to-server direction, before
    /// the impairment; `None`: no rate limit.
    pub up_bottleneck: Option<BottleneckConfig>,
    /// A bottleneck on the server-to-client direction, before the impairment.
    pub down_bottleneck: Option<BottleneckConfig>,
    /// Whether all routes share one bottleneck per direction (a server's uplink) rather than
    /// each route having its own (each player's downlink).
    pub shared_bottleneck: bool,
}

impl RelayConfig {
    /// A relay to `server` applying `impairment` in both directions: front door on the loopback
    /// address of the server's family, seed 42, routes created lazily (at most 1,024), 4 MiB
    /// socket buffers, 50 µs spin, default priority.
    pub fn new(server: SocketAddr, impairment: Impairment) -> Self {
        let loopback = match server {
            SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        };
        Self {
            server,
            listen: SocketAddr::new(loopback, 0),
            up: impairment.clone(),
            down: impairment,
            seed: 42,
            clients: 0,
            max_routes: 1024,
            socket_buffer: DEFAULT_SOCKET_BUFFER,
            spin: Duration::from_micros(50),
            nice: None,
            up_bottleneck: None,
            down_bottleneck: None,
            shared_bottleneck: false,
        }
    }

    /// Puts bottlenecks on the directions given (see [`RelayConfig::shared_bottleneck`]).
    pub fn with_bottlenecks(
        mut self,
        up: Option<BottleneckConfig>,
        down: Option<BottleneckConfig>,
        shared: bool,
    ) -> Self {
        self.up_bottleneck = up;
        self.down_bottleneck = down;
        self.shared_bottleneck = shared;
        self
    }

    /// Sets the seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Sets the number of routes whose upstream sockets are bound at start.
    pub fn with_clients(mut self, clients: usize) -> Self {
        self.clients = clients;
        self
    }

    /// Sets different impairments per direction (up: client to server, down: server to client).
    pub fn with_directions(mut self, up: Impairment, down: Impairment) -> Self {
        self.up = up;
        self.down = down;
        self
    }
}
