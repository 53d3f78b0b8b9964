//! The measuring side of `bench sessions`, shared by Ricochet's run and the kernel floor's: the
//! server's settings, the CPU clocks of a phase, the echo's bookkeeping, a failed run.

use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;

use super::load::{drive, thread_cpu_s, Control, Plan};
use super::server::{ServerKind, ServerProcess, ServerSpec};
use crate::host::{CpuTimes, SystemCpu};
use crate::schema::{
    finite, ClientTotals, Latency, LoadStats, ServerStats, SessionsConfig, SessionsRun,
};
use crate::udp::tracker::new_rtt_histogram;

/// The server process's settings for a run of `cfg`: a `kind` server on loopback, admitting
/// by tokens sealed with `token_key` (`None`: insecure, or the floor's plain sockets).
pub(super) fn server_spec(
    cfg: &SessionsConfig,
    kind: ServerKind,
    token_key: Option<[u8; 32]>,
) -> ServerSpec {
    ServerSpec {
        kind,
        bind: "127.0.0.1:0".into(),
        io_threads: cfg.io_threads,
        idle: cfg.server_idle.clone(),
        pinning: crate::schema::server_pinning(cfg.server_pinning.as_deref()).into(),
        slice_us: cfg.server_slice_us,
        backend: cfg.backend.clone(),
        profile: cfg.profile.clone(),
        max_sessions: None,
        max_sessions_per_address: None,
        token_key,
    }
}

/// CPU clocks at one point of a measured phase: this process's (the clients) and the
/// machine's (for the hypervisor's steal).
pub(super) struct PhaseCpu {
    process: CpuTimes,
    machine: Option<SystemCpu>,
}

impl PhaseCpu {
    pub(super) fn now() -> PhaseCpu {
        PhaseCpu {
            process: CpuTimes::now(),
            machine: SystemCpu::now(),
        }
    }

    /// The process's CPU seconds since `earlier`.
    pub(super) fn process_seconds_since(&self, earlier: &PhaseCpu) -> f64 {
        self.process.seconds_since(&earlier.process)
    }
}

impl SessionsRun {
    /// Stops the server process and keeps its last report (or the error in `errors`).
    pub(super) fn quit_server(&mut self, server: ServerProcess, errors: &mut Vec<String>) {
        match server.quit() {
            Ok(last) => {
                self.server_rss_end_kib = last.rss_kib.or(self.server_rss_end_kib);
                self.server = last;
            }
            Err(e) => errors.push(format!("server: {e:#}")),
        }
    }

    /// The CPU shares of a phase from `cpu0` to `cpu1` that lasted `wall` seconds: the
    /// clients', the machine's steal, and the server's over its `stats`.
    pub(super) fn set_cpu(
        &mut self,
        (cpu0, cpu1): (&PhaseCpu, &PhaseCpu),
        wall: f64,
        stats: &ServerStats,
    ) {
        let wall = wall.max(1e-9);
        let clients = cpu1.process.seconds_since(&cpu0.process);
        self.client_cpu_percent = Some(finite(clients / wall * 100.0));
        self.server_cpu_percent = Some(finite(stats.cpu_s / stats.wall_s.max(1e-9) * 100.0));
        // Churn: every completed session's share of the server's CPU.
        self.server_cpu_us_per_session =
            (self.connected > 0).then(|| finite(stats.cpu_s * 1e6 / self.connected as f64));
        self.steal_percent = match (&cpu0.machine, &cpu1.machine) {
            (Some(a), Some(b)) => Some(finite((b.steal_s - a.steal_s) / wall * 100.0)),
            _ => None,
        };
    }
}

pub(super) fn failed(cfg: &SessionsConfig, server: ServerStats, error: String) -> SessionsRun {
    SessionsRun {
        config: cfg.clone(),
        connected: 0,
        connect_s: 0.0,
        handshakes_per_s: 0.0,
        server_rss_before_kib: None,
        server_rss_idle_kib: None,
        server_rss_per_session_bytes: None,
        server_rss_end_kib: None,
        server_rss_loaded_kib: None,
        round_trips: 0,
        round_trips_per_s: 0.0,
        rtt_us: None,
        min_client_round_trips: 0,
        server_cpu_percent: None,
        client_cpu_percent: None,
        steal_percent: None,
        clients_total: ClientTotals::default(),
        server_cpu_us_per_round_trip: None,
        server_cpu_us_per_session: None,
        load: None,
        server,
        errors: vec![error],
        ok: false,
    }
}

/// The bookkeeping of an echo over `n` clients (one load-generator thread's shard), shared
/// by both stacks: the measured phase, each client's sequence numbers and send times, and the
/// RTT histogram.
pub(super) struct EchoMeter {
    measuring: bool,
    cpu0: f64,
    /// Messages in flight per client.
    window: usize,
    /// Per client: the sequence number of its oldest message in flight (the echo it expects
    /// next) and the round trips counted in the measured phase.
    seq: Vec<u64>,
    counted: Vec<u64>,
    /// When each message in flight left: client `i`'s message `s` at `i * window + s % window`.
    sent_at: Vec<Instant>,
    hist: Histogram<u64>,
    /// Echoes that did not carry their client's sequence number.
    bad: u64,
}

/// What one shard's clients (or all of them, merged) saw in the measured phase.
pub(super) struct EchoSeen {
    pub(super) hist: Histogram<u64>,
    /// Fewest round trips of any client.
    pub(super) min_client_round_trips: u64,
    /// Echoes out of order or altered.
    pub(super) bad: u64,
    /// Per shard, its thread's CPU over the measured phase, s.
    pub(super) busy_s: Vec<f64>,
    /// Clients whose oldest message waited too long at the end (the floor's lost datagram).
    pub(super) stalled: usize,
    /// What went wrong on the clients' side.
    pub(super) errors: Vec<String>,
}

impl EchoSeen {
    /// Every shard's figures added up.
    pub(super) fn merge(shards: Vec<EchoSeen>) -> EchoSeen {
        let mut all = EchoSeen {
            hist: new_rtt_histogram(),
            min_client_round_trips: u64::MAX,
            bad: 0,
            busy_s: Vec::new(),
            stalled: 0,
            errors: Vec::new(),
        };
        for s in shards {
            // Same bounds on both sides; a value past them was saturated already.
            let _ = all.hist.add(&s.hist);
            all.min_client_round_trips = all.min_client_round_trips.min(s.min_client_round_trips);
            all.bad += s.bad;
            all.busy_s.extend(s.busy_s);
            all.stalled += s.stalled;
            all.errors.extend(s.errors);
        }
        if all.min_client_round_trips == u64::MAX {
            all.min_client_round_trips = 0;
        }
        all
    }
}

/// [`drive`] for the echo of `bench sessions`: `shard` drives its clients (an [`EchoMeter`]
/// each) and reports an [`EchoSeen`]; returns the merged figures into `run` (rate, RTT, CPU of
/// server, load generator and steal, the server's last report) and the shards' end results.
pub(super) fn drive_echo<E: Send>(
    cfg: &SessionsConfig,
    server: &mut ServerProcess,
    run: &mut SessionsRun,
    shard: impl Fn(Range<usize>, &Control<EchoSeen>) -> Result<E> + Sync,
) -> Result<Result<(EchoSeen, Vec<E>), String>> {
    let plan = Plan {
        players: cfg.clients,
        threads: cfg.load_threads,
        warmup_s: cfg.warmup_s,
        seconds: cfg.seconds,
        drain: Duration::ZERO,
    };
    let machine0 = SystemCpu::now();
    let d = match drive(&plan, server, |_, _| false, shard)? {
        Ok(d) => d,
        Err(e) => return Ok(Err(e)),
    };
    let machine1 = SystemCpu::now();
    let seen = EchoSeen::merge(d.seen);
    let wall = d.wall_s.max(1e-9);
    let stats = d.measured;
    run.connected = d.connected;
    run.connect_s = finite(d.connect.as_secs_f64());
    run.handshakes_per_s = finite(d.connected as f64 / d.connect.as_secs_f64().max(1e-9));
    run.server_rss_idle_kib = d.loaded.rss_kib;
    run.round_trips = seen.hist.len();
    run.round_trips_per_s = finite(seen.hist.len() as f64 / wall);
    run.rtt_us = Latency::from_ns(&seen.hist);
    run.min_client_round_trips = seen.min_client_round_trips;
    run.client_cpu_percent = Some(finite(d.cpu_s / wall * 100.0));
    run.server_cpu_percent = Some(finite(stats.cpu_s / stats.wall_s.max(1e-9) * 100.0));
    run.server_cpu_us_per_round_trip = (run.round_trips > 0).then(|| {
        finite(stats.cpu_s / stats.wall_s.max(1e-9) * 1e6 / run.round_trips_per_s.max(1e-9))
    });
    // The machine's steal spans the drive's measured phase and its drain (none here).
    run.steal_percent = match (machine0, machine1) {
        (Some(a), Some(b)) => Some(finite((b.steal_s - a.steal_s) / wall * 100.0)),
        _ => None,
    };
    run.load = Some(LoadStats::new(
        plan.threads.clamp(1, cfg.clients.max(1)),
        wall,
        d.cpu_s,
        &seen.busy_s,
        (0, 0, 0.0),
    ));
    run.server_rss_end_kib = stats.rss_kib;
    run.server_rss_loaded_kib = stats.rss_kib;
    run.server = stats;
    Ok(Ok((seen, d.ends)))
}

impl EchoMeter {
    /// `n` clients, whose first `window` messages (sequences 0 to `window - 1`) leave now.
    pub(super) fn start(cfg: &SessionsConfig, n: usize) -> EchoMeter {
        let start = Instant::now();
        let window = cfg.window.max(1);
        EchoMeter {
            measuring: false,
            cpu0: thread_cpu_s(),
            window,
            seq: vec![0; n],
            counted: vec![0; n],
            sent_at: vec![start; n * window],
            hist: new_rtt_histogram(),
            bad: 0,
        }
    }

    /// Messages each client keeps in flight.
    pub(super) fn window(&self) -> u64 {
        self.window as u64
    }

    /// The measured phase begins now (call on the shard's thread: its CPU clock starts).
    pub(super) fn begin_measuring(&mut self) {
        if !self.measuring {
            self.measuring = true;
            self.cpu0 = thread_cpu_s();
        }
    }

    /// Client `i`'s echo carrying `got` arrived at `now`: counts it and returns the sequence
    /// number of the client's next message, which leaves at `now` (the window stays full).
    pub(super) fn echoed(&mut self, i: usize, got: Option<u64>, now: Instant) -> u64 {
        let seq = self.seq[i];
        if got != Some(seq) {
            self.bad += 1;
        }
        let slot = self.slot(i, seq);
        if self.measuring {
            let ns = now.saturating_duration_since(self.sent_at[slot]).as_nanos();
            self.hist
                .saturating_record(u64::try_from(ns).unwrap_or(u64::MAX).max(1));
            self.counted[i] += 1;
        }
        // The next message takes the slot of the one just echoed: `seq + window` is `seq`
        // modulo the window.
        self.sent_at[slot] = now;
        self.seq[i] = seq + 1;
        seq + self.window as u64
    }

    /// Clients whose oldest message has waited `limit` or longer for its echo (the floor's
    /// check for a lost datagram, Linux only).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(super) fn waiting_since(&self, limit: Duration) -> usize {
        let now = Instant::now();
        (0..self.seq.len())
            .filter(|&i| {
                now.saturating_duration_since(self.sent_at[self.slot(i, self.seq[i])]) >= limit
            })
            .count()
    }

    /// Where client `i`'s message `seq` keeps its send time.
    fn slot(&self, i: usize, seq: u64) -> usize {
        i * self.window + (seq % self.window as u64) as usize
    }

    /// Ends the measured phase (on the shard's thread): its figures, with `stalled` clients
    /// and `errors`.
    pub(super) fn finish(&mut self, stalled: usize, errors: Vec<String>) -> EchoSeen {
        let busy = if self.measuring {
            thread_cpu_s() - self.cpu0
        } else {
            0.0
        };
        EchoSeen {
            hist: self.hist.clone(),
            min_client_round_trips: self.counted.iter().copied().min().unwrap_or(u64::MAX),
            bad: self.bad,
            busy_s: vec![finite(busy)],
            stalled,
            errors,
        }
    }
}
