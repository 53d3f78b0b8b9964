//! The JSON result schema: one file per bench invocation, versioned, strict.
//!
//! Field names and units are documented in `bench/README.md`; bump [`SCHEMA_VERSION`] on any
//! change that renames, removes or re-types a field. Every float is finite (see [`finite`]):
//! an undefined value is `null` through an `Option`, never NaN.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::host::{BuildInfo, HostInfo};

/// Version of the result schema written by this build.
pub const SCHEMA_VERSION: u32 = 1;

/// Replace a non-finite float by 0 (JSON has no NaN or infinity).
pub fn finite(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

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
        if version != Some(u64::from(SCHEMA_VERSION)) {
            bail!("schema_version {version:?}, this build reads {SCHEMA_VERSION}");
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
    /// Ricochet `per-core` workers pinned to cores (the runtime's default).
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

/// Round-trip time summary, microseconds, from an HDR histogram (3 significant digits).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Latency {
    /// Samples.
    pub count: u64,
    /// Mean, µs.
    pub mean: f64,
    /// Median, µs.
    pub p50: f64,
    /// 90th percentile, µs.
    pub p90: f64,
    /// 99th percentile, µs.
    pub p99: f64,
    /// 99.9th percentile, µs.
    pub p999: f64,
    /// Maximum, µs.
    pub max: f64,
}

impl Latency {
    /// Summarize a histogram of nanoseconds; `None` when it is empty.
    pub fn from_ns(h: &hdrhistogram::Histogram<u64>) -> Option<Latency> {
        if h.is_empty() {
            return None;
        }
        let us = |ns: u64| finite(ns as f64 / 1_000.0);
        Some(Latency {
            count: h.len(),
            mean: finite(h.mean() / 1_000.0),
            p50: us(h.value_at_quantile(0.50)),
            p90: us(h.value_at_quantile(0.90)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
        })
    }
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
