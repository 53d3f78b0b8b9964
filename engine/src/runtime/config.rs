//! Runtime configuration: IO model, worker count, idle strategy.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use ricochet_platform::BackendConfig;

use super::error::RuntimeError;

/// How sockets and threads are arranged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum IoModel {
    /// One worker per core, each with its own `SO_REUSEPORT` socket, backend, timers and
    /// state: nothing shared on the hot path (pinned to its core as [`CorePinning`] says).
    /// The production model.
    #[default]
    PerCore,
    /// One socket served by N unpinned threads (each with a backend on a duplicate of the same
    /// descriptor): the classic "one io context, N threads" baseline.
    ///
    /// The measured baseline, not a production choice: it is here so that `bench` can measure
    /// [`IoModel::PerCore`] against the design most servers start from, on the same protocol
    /// core. Serve players with `PerCore`.
    ///
    /// For an RUDP server the threads share one endpoint, but each still has its own handler:
    /// a session's callbacks reach whichever thread handled its datagram, every thread runs
    /// `on_tick` (each reporting worker 0), and each thread's `ServerContext::sessions` lists
    /// every session, so a broadcast from `on_tick` goes out once per thread. Game state then
    /// belongs behind a lock the handlers share, with one of them chosen (by the factory's
    /// thread index) to broadcast. `PerCore` has none of this: a session lives on one worker,
    /// with one handler.
    Shared,
}

impl IoModel {
    /// The flag spelling: `per-core` or `shared`.
    pub fn as_str(self) -> &'static str {
        match self {
            IoModel::PerCore => "per-core",
            IoModel::Shared => "shared",
        }
    }
}

impl fmt::Display for IoModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for IoModel {
    type Err = RuntimeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "per-core" | "percore" | "per_core" => Ok(IoModel::PerCore),
            "shared" => Ok(IoModel::Shared),
            other => Err(RuntimeError::Config(format!(
                "unknown IO model {other:?}; expected per-core or shared"
            ))),
        }
    }
}

/// Whether per-core workers are pinned to cores (shared-model threads never are).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum CorePinning {
    /// Pin while cores are left over for the application's other threads: fewer workers
    /// than cores. With a worker on every core, a pinned worker shares its core with
    /// whatever else runs (game logic, a load generator) and the scheduler may move neither,
    /// so both wait for each other; unpinned, it spreads them over the cores.
    ///
    /// Workers pin to the first cores of the process's CPU mask (worker `i` to its `i`-th
    /// core). Several server processes on one host (a process per match) would therefore
    /// all pin to the same cores: give each process its own CPUs (`taskset`, a cpuset), or
    /// choose [`CorePinning::Never`]. The same holds in a container whose CPU quota is
    /// smaller than the cores it can see.
    #[default]
    Auto,
    /// Always pin worker `i` to core `i` (modulo the core count).
    Always,
    /// Never pin.
    Never,
}

impl CorePinning {
    /// The flag spelling: `auto`, `always` or `never`.
    pub fn as_str(self) -> &'static str {
        match self {
            CorePinning::Auto => "auto",
            CorePinning::Always => "always",
            CorePinning::Never => "never",
        }
    }

    /// Whether `workers` per-core workers on a machine of `cores` cores are pinned.
    pub fn pins(self, workers: usize, cores: usize) -> bool {
        match self {
            CorePinning::Auto => workers < cores,
            CorePinning::Always => true,
            CorePinning::Never => false,
        }
    }
}

impl fmt::Display for CorePinning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CorePinning {
    type Err = RuntimeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(CorePinning::Auto),
            "always" | "true" => Ok(CorePinning::Always),
            "never" | "false" => Ok(CorePinning::Never),
            other => Err(RuntimeError::Config(format!(
                "unknown core pinning {other:?}; expected auto, always or never"
            ))),
        }
    }
}

/// What a worker does when a loop turn found no work. More strategies may come: a `match`
/// on it needs a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum IdleStrategy {
    /// Never block: poll without waiting, always. Lowest latency, one core busy per worker.
    Spin,
    /// Block in the backend until I/O, a wake-up or the next timer. Cheapest on CPU; each
    /// wake-up adds the scheduler's latency (large on a VM) to the datagram that caused it.
    Park,
    /// Spin for up to [`UdpServerConfig::spin_for`] after the last work, then park — but only
    /// while work has recently come back soon after a worker went idle (a moving average of
    /// the idle gaps under half of `spin_for`). When the next datagram usually takes longer,
    /// spinning would only burn a core the senders may need (on a host with more busy threads
    /// than cores it delays them), so the worker parks at once. Every empty spin turn yields
    /// the core (`sched_yield`) to any other runnable thread first: a pinned worker never
    /// holds its core from the game's or a load generator's threads while it only waits.
    #[default]
    Balanced,
    /// Sleep until the next tick or session timer without waking for datagrams, then read
    /// everything that arrived meanwhile in one batch: one wake-up per tick instead of one per
    /// datagram. For a server whose handler acts on its tick (a game server that applies
    /// inputs and sends snapshots in `on_tick`), where reading an input the moment it arrives
    /// gains nothing because the game would have applied it at the next tick anyway.
    ///
    /// What waits: every received datagram, up to one tick (handshakes, and the ACKs of the
    /// reliable data they carry, which then ride the tick's own sends). RTT samples on both
    /// sides include that hold, up to one tick. The tick itself runs after the backlog is
    /// read, so it is late by the time reading takes. The socket's receive buffer must hold a
    /// tick of datagrams: the 4 MiB asked for by default ([`UdpServerConfig::recv_buffer`])
    /// is capped by the system (`net.core.rmem_max` on Linux, often 208 KiB; the granted size
    /// is in the server's socket info, and overflow in the workers' `socket_drops`), so raise
    /// that limit for hundreds of players per worker. Timers (retransmissions, keepalives,
    /// handshake retries), messages from the application's other threads and a stop wake the
    /// worker as usual. Needs [`UdpServerConfig::tick`]; a server without one refuses to
    /// start.
    Tick,
}

impl IdleStrategy {
    /// The flag spelling: `spin`, `park`, `balanced` or `tick`.
    pub fn as_str(self) -> &'static str {
        match self {
            IdleStrategy::Spin => "spin",
            IdleStrategy::Park => "park",
            IdleStrategy::Balanced => "balanced",
            IdleStrategy::Tick => "tick",
        }
    }
}

impl fmt::Display for IdleStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for IdleStrategy {
    type Err = RuntimeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "spin" => Ok(IdleStrategy::Spin),
            "park" => Ok(IdleStrategy::Park),
            "balanced" => Ok(IdleStrategy::Balanced),
            "tick" => Ok(IdleStrategy::Tick),
            other => Err(RuntimeError::Config(format!(
                "unknown idle strategy {other:?}; expected spin, park, balanced or tick"
            ))),
        }
    }
}

/// Configuration of a raw-UDP server ([`UdpServer`](super::UdpServer)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct UdpServerConfig {
    /// Address to bind; port 0 picks a free port (shared by all per-core sockets).
    pub bind: SocketAddr,
    /// Per-core (production) or shared (the measured baseline, not for production).
    pub io_model: IoModel,
    /// Worker threads; 0 means one per available core.
    pub io_threads: usize,
    /// Backend choice and sizes. GRO receive (`backend.gro`) is on by default: a run of
    /// datagrams from one client arrives as one entry and the worker hands each segment to the
    /// service; set it to `false` to receive datagram by datagram.
    pub backend: BackendConfig,
    /// Requested `SO_RCVBUF` per socket (the granted value is reported by `socket_info`).
    pub recv_buffer: Option<usize>,
    /// Requested `SO_SNDBUF` per socket.
    pub send_buffer: Option<usize>,
    /// What a worker does when idle.
    pub idle: IdleStrategy,
    /// With [`IdleStrategy::Balanced`]: how long to keep polling after the last work (when
    /// recent idle gaps were short enough for spinning to pay).
    pub spin_for: Duration,
    /// Whether per-core workers are pinned to cores ([`CorePinning::Auto`] by default: only
    /// when there are more cores than workers).
    pub pinning: CorePinning,
    /// The scheduler time slice each worker thread asks for
    /// ([`ricochet_platform::sched::request_time_slice`]; Linux 6.12 and later, elsewhere
    /// nothing happens). A worker that wakes for every datagram and runs for microseconds is
    /// otherwise scheduled like batch work: on a core shared with a compiler or another busy
    /// process it can wait tens to hundreds of milliseconds for its turn, and every session
    /// it serves stalls that long (a pinned worker cannot move to an idle core). A short
    /// slice lets it preempt such work when it wakes; it does not raise its share of the CPU.
    /// `None` keeps the scheduler's default.
    pub worker_slice: Option<Duration>,
    /// Period of the handler's `on_tick`; `None` for no ticks. A server that acts on its tick
    /// pairs it with [`IdleStrategy::Tick`].
    pub tick: Option<Duration>,
    /// Most sends a worker queues before it submits them.
    pub send_batch: usize,
    /// Per-core on Linux: route datagrams to the workers' sockets with a reuseport BPF program
    /// rather than the kernel's 4-tuple hash, which often loads a few flows unevenly. An RUDP
    /// server routes by the worker its connection ids and cookie echoes name (sessions are
    /// placed on the least-loaded worker); everything else, and every datagram of a raw UDP
    /// server, goes by UDP source port. Falls back to the hash, with a warning, where the
    /// program is refused.
    pub steer_by_source_port: bool,
    /// Coalesce consecutive datagrams to the same destination with the same size into UDP GSO
    /// sends (one kernel send for up to 64 datagrams) where the capability probe reports GSO.
    /// On by default; `false` sends datagram by datagram. What the peer receives is the same.
    pub gso: bool,
    /// A link conditioner impairing every worker's traffic (off, `None`, by default); changed
    /// at run time with `set_conditioner` on the server.
    pub conditioner: Option<super::conditioner::LinkConditioner>,
}

impl UdpServerConfig {
    /// Defaults for a server on `bind`: per-core, one worker per core (pinned only when cores
    /// are left over: [`CorePinning::Auto`]), automatic backend, 4 MiB socket buffers
    /// requested, balanced idling (50 µs spin), no tick, GSO coalescing and GRO receive on
    /// where the kernel supports them.
    pub fn new(bind: SocketAddr) -> Self {
        UdpServerConfig {
            bind,
            io_model: IoModel::PerCore,
            io_threads: 0,
            backend: BackendConfig {
                gro: true,
                ..BackendConfig::default()
            },
            recv_buffer: Some(4 << 20),
            send_buffer: Some(4 << 20),
            idle: IdleStrategy::Balanced,
            spin_for: Duration::from_micros(50),
            pinning: CorePinning::Auto,
            worker_slice: Some(Duration::from_micros(100)),
            tick: None,
            send_batch: 1024,
            steer_by_source_port: true,
            gso: true,
            conditioner: None,
        }
    }

    /// The worker count this configuration resolves to.
    pub fn resolved_threads(&self) -> usize {
        if self.io_threads == 0 {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        } else {
            self.io_threads
        }
    }

    pub(crate) fn validate(&self) -> Result<(), RuntimeError> {
        if let Some(c) = &self.conditioner {
            c.validate()?;
        }
        if self.send_batch == 0 {
            return Err(RuntimeError::Config("send_batch must be at least 1".into()));
        }
        if self.backend.batch_size == 0 {
            return Err(RuntimeError::Config(
                "backend.batch_size must be at least 1".into(),
            ));
        }
        if self.tick == Some(Duration::ZERO) {
            return Err(RuntimeError::Config("tick must be longer than zero".into()));
        }
        if self.idle == IdleStrategy::Tick && self.tick.is_none() {
            return Err(RuntimeError::Config(
                "idle strategy `tick` needs a tick: set UdpServerConfig::tick \
                 (ServerConfig::tick), or choose another idle strategy"
                    .into(),
            ));
        }
        if self.io_threads > 1024 {
            return Err(RuntimeError::Config(format!(
                "io_threads = {} is more than 1,024 (UdpServerConfig::io_threads; \
                 ServerConfig::workers for an RUDP server)",
                self.io_threads
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_pins_only_with_cores_to_spare() {
        assert!(!CorePinning::Auto.pins(2, 2), "a worker on every core");
        assert!(!CorePinning::Auto.pins(4, 2), "more workers than cores");
        assert!(CorePinning::Auto.pins(1, 2));
        assert!(CorePinning::Always.pins(2, 2));
        assert!(!CorePinning::Never.pins(1, 8));
        for p in [CorePinning::Auto, CorePinning::Always, CorePinning::Never] {
            assert_eq!(p.as_str().parse::<CorePinning>().ok(), Some(p));
        }
        assert!("sometimes".parse::<CorePinning>().is_err());
        assert_eq!(
            UdpServerConfig::new("127.0.0.1:0".parse().unwrap()).pinning,
            CorePinning::Auto
        );
    }
}
