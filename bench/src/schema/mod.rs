//! The JSON result schema: one file per bench invocation, versioned, strict.
//!
//! Field names and units are documented in `bench/README.md`; bump [`SCHEMA_VERSION`] on any
//! change that renames, removes or re-types a field. Every float is finite (see [`finite`]):
//! an undefined value is `null` through an `Option`, never NaN.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::host::{BuildInfo, HostInfo};

pub mod scale;

pub use crate::stats::{finite, Latency};
pub use scale::{
    ClientTotals, GameConfig, GameRun, GameServerCounts, LoadStats, ServerStats, SessionsConfig,
    SessionsRun,
};

/// Version of the result schema written by this build. Version 2 added `rudp_cases` (absent
/// from version 1 files, which still read: see [`MIN_SCHEMA_VERSION`]); version 3 added the
/// RUDP config's `client_threads` and `server_idle`, and the RUDP server's
/// `sessions_per_worker` and `forwarded`; version 4 added the RUDP config's
/// `client_placement`; version 5 added the RUDP config's `clients_process`, the round's
/// `client_process` and `host_cpu`, the wire counters' `tail_loss_probes` and the RUDP config's
/// `security`; version 6 added `sessions_runs` (`bench sessions`) and `game_runs`
/// (`bench game`).
pub const SCHEMA_VERSION: u32 = 6;

/// Oldest schema version this build reads (every later change so far only added fields).
pub const MIN_SCHEMA_VERSION: u32 = 1;

/// One result file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultFile {
    /// [`SCHEMA_VERSION`] of the writer.
    pub schema_version: u32,
    /// What produced it: `tour`, `udp` or `udp-limits`.
    pub kind: String,
    /// Creation time, seconds since the Unix epoch.
    pub created_unix_s: u64,
    /// Creation time, UTC, ISO 8601 (`2026-11-30T11:44:01Z`).
    pub created_utc: String,
    /// The exact command line, shell-quoted.
    pub command_line: String,
    /// The host the run was made on.
    pub host: HostInfo,
    /// The build that made it.
    pub build: BuildInfo,
    /// True when every run in the file is ok.
    pub ok: bool,
    /// UDP echo runs, in the order they ran.
    pub udp_runs: Vec<UdpRun>,
    /// RUDP echo cases (schema 2), in the order they ran; absent when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rudp_cases: Vec<RudpCase>,
    /// `bench sessions` runs (schema 6), in the order they ran; absent when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sessions_runs: Vec<SessionsRun>,
    /// `bench game` runs (schema 6), in the order they ran; absent when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub game_runs: Vec<GameRun>,
}

impl ResultFile {
    /// Serialize to pretty JSON, refusing non-finite numbers.
    pub fn to_json(&self) -> Result<String> {
        let text = serde_json::to_string_pretty(self).context("serializing results")?;
        // serde_json writes NaN/inf as `null`, which would not read back into an f64: catch it.
        let back: ResultFile = serde_json::from_str(&text)
            .context("result JSON does not round-trip (non-finite number?)")?;
        if back.schema_version != self.schema_version {
            bail!("result JSON does not round-trip");
        }
        Ok(text)
    }

    /// Parse a result file, checking the schema version.
    pub fn from_json(text: &str) -> Result<ResultFile> {
        let v: serde_json::Value = serde_json::from_str(text).context("not JSON")?;
        let version = v.get("schema_version").and_then(|x| x.as_u64());
        let readable = u64::from(MIN_SCHEMA_VERSION)..=u64::from(SCHEMA_VERSION);
        if !version.is_some_and(|v| readable.contains(&v)) {
            bail!(
                "schema_version {version:?}, this build reads {MIN_SCHEMA_VERSION} to {SCHEMA_VERSION}"
            );
        }
        serde_json::from_value(v).context("result file does not match the schema")
    }

    /// Write to `path`, creating its directory.
    pub fn write(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
        }
        let mut text = self.to_json()?;
        text.push('\n');
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    }
}

/// What a UDP echo run was asked to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UdpConfig {
    /// Datagram payload size in bytes (header included).
    pub payload: usize,
    /// Client threads, one socket each.
    pub clients: usize,
    /// Messages each client keeps in flight.
    pub window: usize,
    /// `ricochet` or `tokio`.
    pub server: String,
    /// `per-core` or `shared` (the tokio server is always one shared socket).
    pub io_model: String,
    /// Server threads requested (0: one per core).
    pub io_threads: usize,
    /// Backend requested: `auto`, `uring` or `mmsg` (ricochet; `tokio` for tokio).
    pub backend: String,
    /// Idle strategy: `spin`, `park` or `balanced` (ricochet; `n/a` for tokio).
    pub idle: String,
    /// Ricochet `per-core` workers pinned to cores (`CorePinning::Always`; `false`:
    /// `CorePinning::Never`).
    pub pin_cores: bool,
    /// Busy work per message in the server's handler, ns.
    pub work_ns: u64,
    /// Warm-up duration, s.
    pub warmup_s: f64,
    /// Measured duration, s.
    pub seconds: f64,
    /// Longest wait for in-flight messages after a phase, s.
    pub drain_s: f64,
    /// Messages per client per phase, when bounded by count instead of time only.
    pub messages: Option<u64>,
    /// `ipv4` or `ipv6`.
    pub address_family: String,
    /// Receive buffer requested for every socket (server and clients), bytes.
    pub recv_buffer: Option<usize>,
    /// Send buffer requested for every socket, bytes.
    pub send_buffer: Option<usize>,
    /// Client datagram I/O: `mmsg` (`sendmmsg`/`recvmmsg` batches) or `std` (one call each).
    pub client_io: String,
}

/// Counts for one phase, summed over clients.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseCounts {
    /// Messages sent.
    pub sent: u64,
    /// Intact first echoes.
    pub received: u64,
    /// Messages with no echo by the end of the drain.
    pub lost: u64,
    /// Extra copies of an echo already received.
    pub duplicated: u64,
    /// Intact echoes that arrived after an echo of a later message from the same client.
    pub out_of_order: u64,
    /// Echoes with any wrong byte (header, length or pattern), or datagrams naming no message.
    pub content_errors: u64,
    /// Echoes of messages already counted lost (arrived after the drain time).
    pub late: u64,
    /// Sends the OS refused.
    pub send_errors: u64,
    /// Receive errors other than timeouts.
    pub recv_errors: u64,
}

impl PhaseCounts {
    /// Add another client's counts.
    pub fn add(&mut self, o: &PhaseCounts) {
        self.sent += o.sent;
        self.received += o.received;
        self.lost += o.lost;
        self.duplicated += o.duplicated;
        self.out_of_order += o.out_of_order;
        self.content_errors += o.content_errors;
        self.late += o.late;
        self.send_errors += o.send_errors;
        self.recv_errors += o.recv_errors;
    }

    /// Anything that makes a run not ok (out-of-order alone does not: UDP may reorder).
    pub fn errors(&self) -> u64 {
        self.lost
            + self.duplicated
            + self.content_errors
            + self.late
            + self.send_errors
            + self.recv_errors
    }
}

/// Counts per phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Phases {
    /// Warm-up messages.
    pub warmup: PhaseCounts,
    /// Measured-phase messages.
    pub measured: PhaseCounts,
    /// Messages sent after the measured deadline to keep the load steady while draining.
    pub drain: PhaseCounts,
}

/// Process CPU time over the measured phase (clients and server share the process).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuUsage {
    /// User time, s.
    pub user_s: f64,
    /// System time, s.
    pub sys_s: f64,
    /// (user + sys) / wall time × 100: 100 = one core busy.
    pub percent: f64,
}

/// One socket's buffers and drops.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SocketBuffers {
    /// Local address.
    pub local_addr: String,
    /// Receive buffer requested, bytes (`null`: OS default).
    pub recv_requested: Option<usize>,
    /// Receive buffer the OS reports, bytes (Linux reports twice the usable size).
    pub recv_granted: usize,
    /// Send buffer requested, bytes.
    pub send_requested: Option<usize>,
    /// Send buffer the OS reports, bytes.
    pub send_granted: usize,
    /// Datagrams the kernel dropped on this socket for lack of buffer space, where counted.
    pub drops: Option<u64>,
}

/// System-wide kernel UDP/IP counters (Linux `/proc/net/snmp`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelSnapshot {
    /// `Udp: InDatagrams` (IPv4 plus IPv6 here and in every `udp_*` field).
    pub udp_in_datagrams: u64,
    /// `Udp: NoPorts`.
    pub udp_no_ports: u64,
    /// `Udp: InErrors`.
    pub udp_in_errors: u64,
    /// `Udp: OutDatagrams`.
    pub udp_out_datagrams: u64,
    /// `Udp: RcvbufErrors` (receive-buffer overflow).
    pub udp_rcvbuf_errors: u64,
    /// `Udp: SndbufErrors`.
    pub udp_sndbuf_errors: u64,
    /// `Ip: ReasmReqds`.
    pub ip_reasm_reqds: u64,
    /// `Ip: ReasmOKs`.
    pub ip_reasm_oks: u64,
    /// `Ip: ReasmFails`.
    pub ip_reasm_fails: u64,
    /// `Ip: FragOKs`.
    pub ip_frag_oks: u64,
    /// `Ip: FragFails`.
    pub ip_frag_fails: u64,
    /// `Ip: FragCreates`.
    pub ip_frag_creates: u64,
}

/// Kernel counters around a run (warm-up start to drain end; system-wide).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelCounters {
    /// Before the warm-up.
    pub before: KernelSnapshot,
    /// After the last drain.
    pub after: KernelSnapshot,
    /// after − before.
    pub delta: KernelSnapshot,
}

/// One server worker's counters (ricochet runtime).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerStats {
    /// Worker index.
    pub worker: usize,
    /// Core it was pinned to, if pinned.
    pub core: Option<usize>,
    /// Loop turns.
    pub loop_turns: u64,
    /// Datagrams received.
    pub datagrams_in: u64,
    /// Datagrams sent.
    pub datagrams_out: u64,
    /// Non-empty receive batches.
    pub batches_in: u64,
    /// Non-empty send batches.
    pub batches_out: u64,
    /// System calls.
    pub syscalls: u64,
    /// Longest loop turn, ns.
    pub max_turn_ns: u64,
    /// Sends refused or failed.
    pub send_errors: u64,
    /// Datagrams received truncated.
    pub truncated: u64,
    /// Kernel drops on this worker's socket (`SO_RXQ_OVFL`), where counted.
    pub socket_drops: u64,
}

/// The server side of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerInfo {
    /// `ricochet` or `tokio`.
    pub kind: String,
    /// IO model that ran.
    pub io_model: String,
    /// Server threads that ran.
    pub threads: usize,
    /// Backend that ran (`uring`, `mmsg`, `tokio`).
    pub backend: String,
    /// Why that backend was chosen.
    pub selection_reason: String,
    /// Server sockets.
    pub sockets: Vec<SocketBuffers>,
    /// Per-worker runtime counters (empty for tokio).
    pub workers: Vec<WorkerStats>,
    /// RUDP per-core with several workers: sessions each worker held when every client had
    /// finished, before they closed (placement); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions_per_worker: Option<Vec<u32>>,
    /// RUDP: datagrams a worker received for another worker's session and forwarded (0 where
    /// the sockets steer by connection id); absent for raw UDP servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarded: Option<u64>,
}

/// One UDP echo run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UdpRun {
    /// Short name for tables (`ricochet per-core x2`).
    pub label: String,
    /// Round (0-based) when the same configurations were run several times, interleaved.
    pub round: usize,
    /// What was asked.
    pub config: UdpConfig,
    /// No loss, duplicate, content error, late echo, I/O error or failure in any phase.
    pub ok: bool,
    /// Why not ok, one line each.
    pub errors: Vec<String>,
    /// The server that ran; `null` if it failed to start.
    pub server: Option<ServerInfo>,
    /// Client socket buffers (client 0; all clients are configured alike).
    pub client_socket: Option<SocketBuffers>,
    /// Counts per phase.
    pub phases: Phases,
    /// Measured wall time, s.
    pub measured_s: f64,
    /// Intact echoes of measured-phase messages received before the measured deadline.
    pub round_trips: u64,
    /// `round_trips / measured_s`.
    pub round_trips_per_s: f64,
    /// `round_trips × payload / measured_s`, MiB/s (2^20 bytes), one direction.
    pub payload_mib_per_s: f64,
    /// RTT of measured-phase echoes (including those back during the drain).
    pub rtt_us: Option<Latency>,
    /// Process CPU over the measured phase.
    pub cpu: CpuUsage,
    /// Peak resident set size of the process after the run (`VmHWM`), KiB.
    pub peak_rss_kib: Option<u64>,
    /// Kernel counters around the run, where available.
    pub kernel: Option<KernelCounters>,
}

/// What an RUDP echo round was asked to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RudpConfig {
    /// Message size in bytes (a complete message; fragmented to the protocol MTU).
    pub payload: usize,
    /// Clients, each with its own `Client` (socket and connection); see `client_threads`.
    pub clients: usize,
    /// Messages each client keeps in flight.
    pub window: usize,
    /// `per-core` or `shared`.
    pub io_model: String,
    /// Server workers.
    pub io_threads: usize,
    /// Backend requested for the server and the clients: `auto`, `uring` or `mmsg`.
    pub backend: String,
    /// FEC policy: `off`, `fixed` or `adaptive`.
    pub fec: String,
    /// Protocol profile (`game`: 30 ms min RTO, 1 ms max ACK delay; `competitive` in older files).
    pub protocol: String,
    /// Network condition name: `none`, `random`, `burst` or `sustained` (flags may override it).
    pub profile: String,
    /// Random loss per datagram and direction, percent.
    pub loss_percent: f64,
    /// Burst loss: datagrams dropped in a row per window, and the window (datagrams).
    pub burst: Option<(u32, u32)>,
    /// One-way delay, ms.
    pub delay_ms: f64,
    /// Duplicated datagrams, percent.
    pub duplicate_percent: f64,
    /// Datagrams given the extra reordering delay, percent.
    pub reorder_percent: f64,
    /// The reordering delay, ms.
    pub reorder_delay_ms: f64,
    /// True: clients talk to the server directly (no relay, no impairment).
    pub direct: bool,
    /// Warm-up, s.
    pub warmup_s: f64,
    /// Measured phase, s (the drain follows it).
    pub seconds: f64,
    /// Longest wait for in-flight messages after the measured phase, s.
    pub drain_s: f64,
    /// Seed of this round (relay streams, connection ids).
    pub seed: u64,
    /// Client threads: the clients are spread round-robin over this many threads, each
    /// driving its clients with one wait for all of them (`ricochet::ClientSet`); equal to
    /// `clients`, every client steps alone on its own thread. Absent (one thread per client)
    /// in files before schema version 3.
    #[serde(default)]
    pub client_threads: Option<usize>,
    /// The server workers' idle strategy: `balanced` (spin briefly after work, then block),
    /// `park` (block at once) or `spin`. Absent (`balanced`) in files before schema version 3.
    #[serde(default)]
    pub server_idle: Option<String>,
    /// Where the client threads run: `with-worker` (each client thread pinned to the core of
    /// the server worker serving its first client, where the server pins its workers and
    /// names them in its connection ids: per-core) or `os` (wherever the scheduler puts
    /// them). Absent (`os`) in files before schema version 4.
    #[serde(default)]
    pub client_placement: Option<String>,
    /// Where the clients run: `in-process` (threads of the bench process, beside the server
    /// and the relay) or `separate` (a child process of the same binary, as an outside load
    /// generator: its own address space, scheduled by the OS, never pinned). Absent
    /// (`in-process`) in files before schema version 5.
    #[serde(default)]
    pub clients_process: Option<String>,
    /// Security: `secure` (clients admitted by connect token, every session's packets sealed
    /// with its token's keys; in files from before tokens, the keys came from the protocol's
    /// test path) or `insecure`. Absent (`insecure`: there was no protection) in files before
    /// schema version 5.
    #[serde(default)]
    pub security: Option<String>,
    /// The scheduler time slice the server workers asked for, µs (`ricochet`'s
    /// `UdpServerConfig::worker_slice`); 0: none asked, the scheduler's default. Absent in
    /// files from before the request existed (none was made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_slice_us: Option<u64>,
    /// The server workers' core pinning (`auto`, `always`, `never`; `ricochet`'s
    /// `CorePinning`). Absent in files from before the choice existed (always pinned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_pinning: Option<String>,
    /// The congestion controller the sessions use, when the round chose one over the
    /// protocol profile's own: `newreno` or `delay` (`bench rudp --cc`). Absent: the profile's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub congestion_controller: Option<String>,
}

impl RudpConfig {
    /// Whether this round protects its sessions' packets.
    pub fn is_secure(&self) -> bool {
        self.security.as_deref() == Some("secure")
    }

    /// The client threads this round runs: `client_threads`, or one per client when absent,
    /// at most one per client.
    pub fn resolved_client_threads(&self) -> usize {
        self.client_threads
            .unwrap_or(self.clients)
            .clamp(1, self.clients.max(1))
    }

    /// True when the clients run in a separate process (`clients_process` = `separate`).
    pub fn separate_clients(&self) -> bool {
        self.clients_process.as_deref() == Some("separate")
    }
}

/// Message checks of one phase, summed over clients.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RudpCounts {
    /// Messages queued with `send`.
    pub sent: u64,
    /// Intact echoes, in order.
    pub echoed: u64,
    /// Messages whose echo never came back by the end of the drain.
    pub lost: u64,
    /// Echoes with any wrong byte (header, length or pattern).
    pub content_errors: u64,
    /// Echoes that were not the next one expected (reliable ordered channel).
    pub order_errors: u64,
    /// `send` calls the connection refused.
    pub send_errors: u64,
}

impl RudpCounts {
    /// Add another client's counts.
    pub fn add(&mut self, o: &RudpCounts) {
        self.sent += o.sent;
        self.echoed += o.echoed;
        self.lost += o.lost;
        self.content_errors += o.content_errors;
        self.order_errors += o.order_errors;
        self.send_errors += o.send_errors;
    }

    /// Anything that makes a round not ok.
    pub fn errors(&self) -> u64 {
        self.lost + self.content_errors + self.order_errors + self.send_errors
    }
}

/// Protocol counters of one side (all clients, or all server sessions), whole round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RudpWire {
    /// UDP payload bytes sent (`ConnectionStats::bytes_sent`).
    pub bytes_sent: u64,
    /// Datagrams sent.
    pub packets_sent: u64,
    /// Reliable fragments sent for the first time.
    pub segments_sent: u64,
    /// Reliable fragments sent again (retransmissions and tail-loss probes).
    pub segments_retransmitted: u64,
    /// Packets declared lost.
    pub packets_lost: u64,
    /// Retransmission timeouts.
    pub rto_count: u64,
    /// Application bytes handed to `send` (the echo payloads this side sent).
    pub app_bytes_sent: u64,
    /// Data shards FEC restored (`FecStats::data_recovered`).
    #[serde(default)]
    pub fec_recovered: u64,
    /// Parity shards sent.
    #[serde(default)]
    pub fec_parity_sent: u64,
    /// Largest parity per group this side used.
    #[serde(default)]
    pub fec_max_parity: u64,
    /// Sum of the connections' peak FEC retention, bytes.
    #[serde(default)]
    pub fec_peak_retained_bytes: u64,
    /// Tail-loss probes sent (`ConnectionStats::tail_loss_probes`; absent before schema 5).
    #[serde(default)]
    pub tail_loss_probes: u64,
}

impl RudpWire {
    /// Add another connection's counters.
    pub fn add(&mut self, o: &RudpWire) {
        self.bytes_sent += o.bytes_sent;
        self.packets_sent += o.packets_sent;
        self.segments_sent += o.segments_sent;
        self.segments_retransmitted += o.segments_retransmitted;
        self.packets_lost += o.packets_lost;
        self.rto_count += o.rto_count;
        self.app_bytes_sent += o.app_bytes_sent;
        self.fec_recovered += o.fec_recovered;
        self.fec_parity_sent += o.fec_parity_sent;
        self.fec_max_parity = self.fec_max_parity.max(o.fec_max_parity);
        self.fec_peak_retained_bytes += o.fec_peak_retained_bytes;
        self.tail_loss_probes += o.tail_loss_probes;
    }
}

/// One relay direction, summed over routes, whole round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RudpRelayDirection {
    /// Datagrams the relay received.
    pub offered: u64,
    /// Copies scheduled (duplicates included).
    pub forwarded: u64,
    /// Dropped by random loss.
    pub dropped_random: u64,
    /// Dropped by burst loss.
    pub dropped_burst: u64,
    /// Dropped because a route queue was full.
    pub dropped_overflow: u64,
    /// Duplicates scheduled.
    pub duplicated: u64,
    /// Copies given the reordering delay.
    pub delayed: u64,
}

/// The relay's counters for a round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RudpRelay {
    /// Routes (one per client address).
    pub routes: usize,
    /// Client to server.
    pub up: RudpRelayDirection,
    /// Server to client.
    pub down: RudpRelayDirection,
    /// Sum of every route direction's queue peak, bytes (peaks may be at different times).
    pub route_peaks_bytes: u64,
    /// Sum of every route direction's queue peak, datagrams.
    pub route_peaks_datagrams: u64,
    /// Dropped / offered, both directions.
    pub realized_loss: f64,
    /// Relay socket errors, route-limit and bind errors (any makes the round not ok).
    pub errors: u64,
    /// p99 of how late copies left the relay, µs.
    pub lateness_p99_us: f64,
    /// Relay thread CPU / its lifetime, percent of one core.
    pub thread_cpu_percent: f64,
}

/// FEC metrics of a round (`null` in the JSON while the FEC policy is `off`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RudpFec {
    /// Data shards FEC restored, per 1,000 round trips.
    pub recovered_per_1000: f64,
    /// Sum over every connection (both sides) of its peak FEC retention
    /// (`FecStats::peak_retained_bytes`, exact per connection, peaks may be at different times), KiB.
    pub retention_peak_kib: f64,
    /// Largest parity count observed on a group.
    pub max_parity: u64,
}

/// One RUDP echo round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RudpRun {
    /// What was asked.
    pub config: RudpConfig,
    /// Every check passed (content, order, send completion, drain, relay errors).
    pub ok: bool,
    /// Why not ok, one line each.
    pub errors: Vec<String>,
    /// Load average (1/5/15 min) when the round started; `null` if unknown.
    pub load_average: Option<[f64; 3]>,
    /// The server that ran; `null` if it failed to start.
    pub server: Option<ServerInfo>,
    /// Warm-up message checks.
    pub warmup: RudpCounts,
    /// Measured-phase message checks (their echoes may arrive during the drain).
    pub measured: RudpCounts,
    /// From the start of the measured phase to the last measured echo (drain included), s.
    pub measured_s: f64,
    /// Measured-phase round trips completed (intact, in order).
    pub round_trips: u64,
    /// `round_trips / measured_s`.
    pub round_trips_per_s: f64,
    /// RTT of measured-phase messages, send call to complete echo.
    pub rtt_us: Option<Latency>,
    /// Process CPU from the measured start to the end of the drain (clients, server, relay;
    /// with a separate client process, both processes' CPU over the bench's wall time).
    pub cpu: CpuUsage,
    /// Process CPU per measured round trip, µs.
    pub cpu_us_per_round_trip: Option<f64>,
    /// Peak RSS of the process (`VmHWM`, since the process started) after the round, KiB.
    pub peak_rss_kib: Option<u64>,
    /// Client-side protocol counters (all clients, whole round).
    pub client_wire: RudpWire,
    /// Server-side protocol counters (all sessions, sampled on the worker tick after the drain).
    pub server_wire: RudpWire,
    /// (UDP payload bytes sent by both endpoints / bidirectional application bytes − 1) × 100.
    pub wire_overhead_percent: Option<f64>,
    /// Reliable fragments retransmitted by both endpoints per 1,000 round trips (whole round).
    pub retransmitted_per_1000: Option<f64>,
    /// FEC metrics; `null` with FEC off.
    pub fec: Option<RudpFec>,
    /// Relay counters; `null` when direct.
    pub relay: Option<RudpRelay>,
    /// Resident set size over the round (added within schema 2: absent from older files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss: Option<RssOverTime>,
    /// The separate client process's own figures (`clients_process` = `separate`; absent
    /// otherwise and before schema 5). Its CPU is also in `cpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_process: Option<ClientProcess>,
    /// The whole machine's CPU over the same window as `cpu` (absent before schema 5 and
    /// where `/proc/stat` is unavailable): whether the figures were taken on a quiet machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_cpu: Option<HostCpu>,
}

/// The machine's CPU over a round's measured window, percent of one core (100 = one core).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostCpu {
    /// Every process's CPU (user and system time).
    pub busy_percent: f64,
    /// What other processes used: `busy_percent` less the round's own (`cpu.percent`), at
    /// least 0. Above a few percent, other work competed with the round for the CPUs. Kernel
    /// threads count here too, `ksoftirqd` among them when packet delivery is deferred to it.
    pub other_percent: f64,
    /// Interrupt and softirq time (mostly the round's own packet delivery), charged to no
    /// process and so in neither of the above.
    pub irq_percent: f64,
    /// Time the hypervisor gave the virtual CPUs' turn to something else.
    pub steal_percent: f64,
}

/// What the separate client process reports about itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientProcess {
    /// The client process's CPU from its measured start to its last client's end; `percent`
    /// is over its own wall time.
    pub cpu: CpuUsage,
    /// Its peak resident set size (`VmHWM`) at that point, KiB.
    pub peak_rss_kib: Option<u64>,
}

/// Growth bound of [`RssOverTime`]: RSS at the end of the measured phase may exceed RSS at the
/// end of the warm-up by at most this fraction of it ...
pub const RSS_GROWTH_FRACTION: f64 = 0.10;

/// ... plus this many KiB (4 MiB: allocator and thread-stack noise on a short round).
pub const RSS_GROWTH_SLACK_KIB: u64 = 4 * 1024;

/// Process RSS (`VmRSS`) sampled about once a second from the start of the warm-up to the end
/// of the drain, to tell steady memory from growth (a leak) after the warm-up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RssOverTime {
    /// Nominal interval between samples, ms.
    pub interval_ms: u64,
    /// Every sample as (seconds since the warm-up started, KiB), in time order.
    pub samples: Vec<(f64, u64)>,
    /// RSS at the end of the warm-up, KiB.
    pub after_warmup_kib: Option<u64>,
    /// RSS at the end of the measured phase (before the drain), KiB.
    pub end_kib: Option<u64>,
    /// Largest sample, KiB.
    pub peak_kib: Option<u64>,
    /// `end_kib − after_warmup_kib`, KiB (negative: shrank).
    pub growth_kib: Option<i64>,
    /// The largest growth that passes: [`RSS_GROWTH_FRACTION`] × `after_warmup_kib` +
    /// [`RSS_GROWTH_SLACK_KIB`], KiB.
    pub growth_bound_kib: Option<u64>,
}

impl RssOverTime {
    /// Fills in growth and bound from the two marks; `Some(message)` when growth exceeds it.
    pub fn check(&mut self) -> Option<String> {
        let (Some(w), Some(e)) = (self.after_warmup_kib, self.end_kib) else {
            return None;
        };
        let bound = rss_growth_bound_kib(w);
        let growth = e as i64 - w as i64;
        self.growth_kib = Some(growth);
        self.growth_bound_kib = Some(bound);
        (growth > bound as i64).then(|| {
            format!(
                "RSS grew {growth} KiB after the warm-up ({w} → {e} KiB), over the bound of {bound} KiB ({:.0}% + {} KiB)",
                RSS_GROWTH_FRACTION * 100.0,
                RSS_GROWTH_SLACK_KIB
            )
        })
    }
}

/// The growth bound for RSS `after_warmup_kib` at the end of the warm-up, KiB.
pub fn rss_growth_bound_kib(after_warmup_kib: u64) -> u64 {
    (after_warmup_kib as f64 * RSS_GROWTH_FRACTION).round() as u64 + RSS_GROWTH_SLACK_KIB
}

/// Median and range of one metric over a case's rounds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spread {
    /// Median (mean of the two middle values for an even count).
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (non-finite ones ignored); `None` when there are none.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Spread> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Spread {
            median,
            min: v[0],
            max: v[n - 1],
        })
    }
}

/// The summary of a case over its rounds (`null` fields: no round measured that metric).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RudpSummary {
    /// Round trips/s.
    pub round_trips_per_s: Option<Spread>,
    /// RTT p50, µs.
    pub p50_us: Option<Spread>,
    /// RTT p99, µs.
    pub p99_us: Option<Spread>,
    /// RTT p99.9, µs.
    pub p999_us: Option<Spread>,
    /// RTT max, µs.
    pub max_us: Option<Spread>,
    /// Process CPU, percent of one core.
    pub cpu_percent: Option<Spread>,
    /// CPU per round trip, µs.
    pub cpu_us_per_round_trip: Option<Spread>,
    /// Wire overhead, percent.
    pub wire_overhead_percent: Option<Spread>,
    /// Retransmitted segments per 1,000 round trips.
    pub retransmitted_per_1000: Option<Spread>,
    /// Recovered shards per 1,000 round trips.
    pub recovered_per_1000: Option<Spread>,
    /// Realized loss, percent.
    pub realized_loss_percent: Option<Spread>,
    /// Summed relay route peaks, KiB.
    pub relay_peaks_kib: Option<Spread>,
    /// Peak RSS, KiB.
    pub peak_rss_kib: Option<Spread>,
}

/// One RUDP case: a configuration run for one or more rounds (seeds seed, seed+1, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RudpCase {
    /// Short name for tables.
    pub label: String,
    /// Matrix set (`main`, `dims`, `sustained`), or `null` outside a matrix.
    pub set: Option<String>,
    /// Every round ok.
    pub ok: bool,
    /// The rounds, in order.
    pub rounds: Vec<RudpRun>,
    /// Median and min–max over the rounds.
    pub summary: RudpSummary,
}

/// The server pinning a run's `server_pinning` field names; absent in files from before the
/// choice existed, when per-core workers were always pinned.
pub fn server_pinning(recorded: Option<&str>) -> &str {
    recorded.unwrap_or("always")
}

/// The worker time slice a run's `server_slice_us` asks the runtime for: 0 asks for none.
pub fn worker_slice(slice_us: u64) -> Option<std::time::Duration> {
    (slice_us > 0).then(|| std::time::Duration::from_micros(slice_us))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rss(after_warmup: Option<u64>, end: Option<u64>) -> RssOverTime {
        RssOverTime {
            interval_ms: 1000,
            samples: Vec::new(),
            after_warmup_kib: after_warmup,
            end_kib: end,
            peak_kib: end,
            growth_kib: None,
            growth_bound_kib: None,
        }
    }

    #[test]
    fn rss_growth_within_bound_passes_beyond_fails() {
        // 100 MiB after warm-up: bound 10 MiB + 4 MiB = 14,336 KiB.
        let w = 100 * 1024;
        assert_eq!(rss_growth_bound_kib(w), 14_336);
        let mut ok = rss(Some(w), Some(w + 14_336));
        assert_eq!(ok.check(), None);
        assert_eq!(ok.growth_kib, Some(14_336));
        let mut bad = rss(Some(w), Some(w + 14_337));
        let msg = bad.check().expect("growth over the bound is flagged");
        assert!(msg.contains("14337") && msg.contains("14336"), "{msg}");
        // Shrinking is fine; a missing mark checks nothing.
        assert_eq!(rss(Some(w), Some(w / 2)).check(), None);
        assert_eq!(rss(Some(w), None).check(), None);
    }
}
