//! The records of `bench sessions` and `bench game` (settings, results, the server process's
//! report) as the result file holds them. Data only: the benchmarks that fill them live in
//! [`crate::scale`].

use serde::{Deserialize, Serialize};

use crate::stats::{finite, Latency};

/// One `bench sessions` measurement's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionsConfig {
    /// Clients (sessions).
    pub clients: usize,
    /// `idle`, `echo` or `churn`.
    pub mode: String,
    /// Clients that share one loopback address (127.0.0.x, one x per group).
    pub clients_per_ip: usize,
    /// Server workers.
    pub io_threads: usize,
    /// Server idle strategy.
    pub server_idle: String,
    /// Server core pinning (`auto`, `always`, `never`); absent in runs before the choice
    /// existed (workers were always pinned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_pinning: Option<String>,
    /// Scheduler time slice the server workers ask for, µs (0: none asked); absent: the
    /// runtime's default (100 µs since it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_slice_us: Option<u64>,
    /// Backend of server and clients.
    pub backend: String,
    /// Protocol profile of both sides.
    pub profile: String,
    /// `secure` (connect tokens, every packet protected) or `insecure`.
    pub security: String,
    /// Echo message size, bytes (at least 16).
    pub payload: usize,
    /// Echo messages in flight per client; absent in runs before the choice existed (1).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub window: usize,
    /// Idle time after connecting before the server is weighed, s.
    pub settle_s: f64,
    /// Echo warm-up, s.
    pub warmup_s: f64,
    /// Echo measured time, s.
    pub seconds: f64,
    /// `kernel`: the kernel floor (plain UDP sockets and echo server, no protocol); absent:
    /// Ricochet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<String>,
    /// Threads of the load generator in the echo and (since session 26) the churn, each a
    /// contiguous share of the clients; absent in runs before it existed (1).
    #[serde(default = "one")]
    pub load_threads: usize,
}

fn one() -> usize {
    1
}

fn is_one(v: &usize) -> bool {
    *v == 1
}

impl SessionsConfig {
    /// The mode as tables name it: the echo's window and message size when it keeps more
    /// than one message in flight.
    pub fn mode_label(&self) -> String {
        if self.mode == "echo" && self.window > 1 {
            format!("echo w{} × {} B", self.window, self.payload)
        } else {
            self.mode.clone()
        }
    }

    /// Whether this run is the kernel floor rather than Ricochet.
    pub fn is_floor(&self) -> bool {
        self.stack.as_deref() == Some("kernel")
    }
}

/// One `bench sessions` measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionsRun {
    /// Settings.
    pub config: SessionsConfig,
    /// Clients connected.
    pub connected: usize,
    /// Wall time from the first connect to the last handshake, s.
    pub connect_s: f64,
    /// `connected / connect_s`.
    pub handshakes_per_s: f64,
    /// Server RSS before the first client, KiB.
    pub server_rss_before_kib: Option<u64>,
    /// Server RSS with every client connected and idle, KiB.
    pub server_rss_idle_kib: Option<u64>,
    /// (idle − before) / connected, bytes.
    pub server_rss_per_session_bytes: Option<f64>,
    /// Server RSS at the end of the run, KiB (the server's last report, when it quits: the
    /// clients have closed by then).
    pub server_rss_end_kib: Option<u64>,
    /// Echo: server RSS at the end of the measured phase, every window still in flight, KiB
    /// (absent in runs before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_rss_loaded_kib: Option<u64>,
    /// Echo: round trips in the measured phase.
    pub round_trips: u64,
    /// Echo: round trips per second.
    pub round_trips_per_s: f64,
    /// Echo: RTT as the clients measured it (send to complete echo).
    pub rtt_us: Option<Latency>,
    /// Echo: fewest round trips of any client in the measured phase (0: one starved).
    pub min_client_round_trips: u64,
    /// Echo: server process CPU over the measured phase, % of one core.
    pub server_cpu_percent: Option<f64>,
    /// Echo: this (client) process's CPU over the measured phase, % of one core.
    pub client_cpu_percent: Option<f64>,
    /// Echo: the clients' protocol counters summed over every member, from connect to the
    /// end of the run (warm-up included).
    #[serde(default)]
    pub clients_total: ClientTotals,
    /// The hypervisor's steal over the measured phase, percent of one core (Linux; absent in
    /// runs before it was recorded): time the virtual CPUs wanted to run and did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steal_percent: Option<f64>,
    /// Echo: server process CPU per round trip (its CPU share over the round trips per
    /// second), µs; absent in runs before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_us_per_round_trip: Option<f64>,
    /// Churn: server process CPU per completed session, µs; absent in runs before it was
    /// recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_us_per_session: Option<f64>,
    /// Echo and churn: the load generator's own figures over the measured phase (churn: over
    /// all its batches); absent in runs before they were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<LoadStats>,
    /// The server's last report.
    pub server: ServerStats,
    /// What went wrong (empty when ok).
    pub errors: Vec<String>,
    /// No error, every client connected, and (echo) every client echoed.
    pub ok: bool,
}

impl SessionsRun {
    /// Echo: server RSS growth per session from before the first client to the end of the
    /// measured echo (every message of a window still in flight), bytes. It includes what the
    /// workers' buffers grew under the load, which a larger set spreads thinner. `None` for
    /// the kernel floor, which holds no sessions, and for runs that did not record it.
    pub fn loaded_rss_per_session_bytes(&self) -> Option<f64> {
        if self.config.mode != "echo" || self.config.is_floor() || self.connected == 0 {
            return None;
        }
        let (a, b) = (self.server_rss_before_kib?, self.server_rss_loaded_kib?);
        Some(finite(
            (b as f64 - a as f64) * 1024.0 / self.connected as f64,
        ))
    }
}

/// Protocol counters summed over the members of a client set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTotals {
    /// Datagrams sent.
    pub packets_sent: u64,
    /// Datagrams received.
    pub packets_received: u64,
    /// Reliable segments sent again (loss, tail-loss probe or timeout).
    pub segments_retransmitted: u64,
    /// Tail-loss probes sent.
    pub tail_loss_probes: u64,
    /// Retransmission timeouts.
    pub rto_count: u64,
    /// Packets declared lost that arrived after all.
    pub packets_spurious_lost: u64,
}

/// One `bench game` measurement's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GameConfig {
    /// Players.
    pub players: usize,
    /// Server tick rate (and input rate), Hz.
    pub tick_hz: f64,
    /// Snapshot size, bytes.
    pub snapshot_bytes: usize,
    /// Input size, bytes.
    pub input_bytes: usize,
    /// Network condition through the relay (`None`: direct).
    pub relay_profile: Option<String>,
    /// Relay seed.
    pub seed: u64,
    /// Players that share one loopback address.
    pub players_per_ip: usize,
    /// Server workers.
    pub io_threads: usize,
    /// Server idle strategy.
    pub server_idle: String,
    /// Server core pinning (`auto`, `always`, `never`); absent in runs before the choice
    /// existed (workers were always pinned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_pinning: Option<String>,
    /// Scheduler time slice the server workers ask for, µs (0: none asked); absent: the
    /// runtime's default (100 µs since it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_slice_us: Option<u64>,
    /// Server sessions hold input ACKs until the next tick (`bench game --acks-on-tick`);
    /// absent (false) in runs before it existed.
    #[serde(default)]
    pub acks_on_tick: bool,
    /// Backend of server and clients.
    pub backend: String,
    /// Protocol profile of both sides.
    pub profile: String,
    /// `secure` (connect tokens, every packet protected) or `insecure`.
    pub security: String,
    /// Warm-up, s.
    pub warmup_s: f64,
    /// Measured time, s.
    pub seconds: f64,
    /// `kernel`: the kernel floor (plain UDP sockets, a plain ticking server, no protocol);
    /// absent: Ricochet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<String>,
    /// Threads of the load generator (the players' process), each driving a contiguous share
    /// of the players; absent in runs before it existed (1).
    #[serde(default = "one")]
    pub load_threads: usize,
}

impl GameConfig {
    /// Whether this run is the kernel floor rather than Ricochet.
    pub fn is_floor(&self) -> bool {
        self.stack.as_deref() == Some("kernel")
    }
}

/// One `bench game` measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GameRun {
    /// Settings.
    pub config: GameConfig,
    /// Players connected.
    pub connected: usize,
    /// Time to connect them all, s.
    pub connect_s: f64,
    /// Snapshot latency, server send to player receive.
    pub snapshot_latency_us: Option<Latency>,
    /// Snapshots the players received in the measured phase.
    pub snapshots_received: u64,
    /// Tick numbers within a player's first and last received snapshot that it never saw.
    pub snapshots_lost: u64,
    /// Snapshots older than one already delivered (dropped by the protocol or seen late).
    pub snapshots_stale: u64,
    /// Inputs the players sent in the measured phase.
    pub inputs_sent: u64,
    /// Inputs the players sent in the whole run (warm-up included).
    pub inputs_sent_total: u64,
    /// Inputs sent but not received by the server after the drain (must be 0; a backlog that
    /// outlasts the drain counts too).
    pub inputs_lost: u64,
    /// Inputs the server saw out of order (must be 0).
    pub input_order_errors: u64,
    /// Server ticks per second per worker.
    pub ticks_per_s: f64,
    /// Ticks more than half a period late, over every worker.
    pub ticks_late: u64,
    /// Tick due times skipped, over every worker.
    pub ticks_skipped: u64,
    /// Longest tick lateness, µs.
    pub tick_lateness_max_us: f64,
    /// Snapshots the server queued.
    pub snapshots_sent: u64,
    /// Snapshot sends the server's sessions refused.
    pub snapshot_send_errors: u64,
    /// Server process CPU, % of one core.
    pub server_cpu_percent: f64,
    /// Server process CPU per tick period (all workers), µs.
    pub server_cpu_us_per_tick: f64,
    /// Client process CPU, % of one core.
    pub client_cpu_percent: f64,
    /// Server process CPU per player-tick served (CPU over the snapshots sent in the measured
    /// phase, one per player per tick), µs; absent in runs before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_us_per_player_tick: Option<f64>,
    /// Heap allocation calls of the server process per player-tick served (over the measured
    /// phase, every thread); absent in runs before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_allocs_per_player_tick: Option<f64>,
    /// The load generator's own figures over the measured phase; absent in runs before they
    /// were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<LoadStats>,
    /// Server RSS growth per session, bytes (RSS with the players connected, less before).
    pub server_rss_per_session_bytes: Option<f64>,
    /// The server's report at the end of the measured phase.
    pub server: ServerStats,
    /// Realized loss on the relay, both directions (`None`: direct).
    pub relay_loss: Option<f64>,
    /// What went wrong (empty when ok).
    pub errors: Vec<String>,
    /// Every player connected, no reliable input lost or reordered, no snapshot refused.
    pub ok: bool,
}

/// The load generator's figures over a measured phase: whether what was measured is the server
/// or the client that drove it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadStats {
    /// Threads that drove the players.
    pub threads: usize,
    /// The load generator process's CPU (every thread), % of one core.
    pub cpu_percent: f64,
    /// The busiest thread's CPU over the phase's wall time, %.
    pub busy_max_percent: f64,
    /// Game: inputs that left more than half a tick period after their due time.
    pub inputs_late: u64,
    /// Game: the latest an input left after its due time, µs.
    pub input_lateness_max_us: f64,
    /// A thread was busy more than 90 % of the wall time, or more than 1 % of the inputs left
    /// over half a period late: the figures then measure the client, not the server.
    pub saturated: bool,
}

impl LoadStats {
    /// Busiest-thread share past which a load generator counts as saturated, %.
    pub const BUSY_LIMIT_PERCENT: f64 = 90.0;

    /// The figures of `threads` threads over `wall` seconds: the process's CPU seconds
    /// `process_cpu_s`, each thread's `busy_s`, and (game) the inputs sent, how many left late
    /// and the latest lateness.
    pub fn new(
        threads: usize,
        wall: f64,
        process_cpu_s: f64,
        busy_s: &[f64],
        (inputs, late, lateness_max_us): (u64, u64, f64),
    ) -> LoadStats {
        let wall = wall.max(1e-9);
        let busy_max_percent = finite(busy_s.iter().copied().fold(0.0, f64::max) / wall * 100.0);
        LoadStats {
            threads,
            cpu_percent: finite(process_cpu_s / wall * 100.0),
            busy_max_percent,
            inputs_late: late,
            input_lateness_max_us: finite(lateness_max_us),
            saturated: busy_max_percent > Self::BUSY_LIMIT_PERCENT
                || (inputs > 0 && late * 100 > inputs),
        }
    }
}

/// Server-side counters of a game run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GameServerCounts {
    /// Snapshots queued (one per session per tick).
    pub snapshots_sent: u64,
    /// Snapshot sends the session refused (queue full, closed).
    pub snapshot_send_errors: u64,
    /// Inputs received since the server started (not cleared by a reset).
    pub inputs_received: u64,
    /// Inputs that did not follow their session's previous one, since the start.
    pub input_order_errors: u64,
    /// Ticks run, over every worker.
    pub ticks: u64,
}

/// One worker's loop counters, as the bench reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerStats {
    /// Loop turns.
    pub loop_turns: u64,
    /// Datagrams in.
    pub datagrams_in: u64,
    /// Datagrams out.
    pub datagrams_out: u64,
    /// Ticks run.
    pub ticks: u64,
    /// Ticks more than half a period late.
    pub ticks_late: u64,
    /// Tick due times skipped.
    pub ticks_skipped: u64,
    /// Longest tick lateness, ns.
    pub tick_lateness_max_ns: u64,
}

/// What the server process reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerStats {
    /// Sessions held now.
    pub sessions: usize,
    /// Resident set size now, KiB (Linux).
    pub rss_kib: Option<u64>,
    /// CPU time since start or the last reset, user + system, s.
    pub cpu_s: f64,
    /// Wall time since start or the last reset, s.
    pub wall_s: f64,
    /// RTT over every session since start or the last reset (the workers' histograms).
    pub rtt_us: Option<Latency>,
    /// Game counters since start or the last reset.
    pub game: GameServerCounts,
    /// Per worker, since start (not reset).
    pub workers: Vec<WorkerStats>,
    /// Datagrams the server's endpoints dropped, by cause (as of the last tick, from start).
    #[serde(default)]
    pub drops: std::collections::BTreeMap<String, u64>,
    /// Used tokens the endpoints forgot before their expiry to make room (as of the last
    /// tick, from start): the table is smaller than handshakes/s × token lifetime.
    #[serde(default)]
    pub tokens_evicted: u64,
    /// Heap allocation calls of the whole server process since the last reset (every thread:
    /// workers, the game's handler, the control thread), and the bytes they asked for; absent
    /// before the first reset, where the process does not count, and in older runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocs: Option<AllocCounts>,
}

/// Heap allocation calls and the bytes they asked for (the bench's counting allocator).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllocCounts {
    /// `alloc`, `alloc_zeroed` and `realloc` calls.
    pub calls: u64,
    /// Bytes asked for.
    pub bytes: u64,
}
