//! The measuring side of `bench sessions`, shared by Ricochet's run and the kernel floor's: the
//! server's settings, the CPU clocks of a phase, the echo's bookkeeping, a failed run.

use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;

use super::server::{ServerKind, ServerProcess, ServerSpec};
use crate::host::{CpuTimes, SystemCpu};
use crate::schema::{finite, ClientTotals, Latency, ServerStats, SessionsConfig, SessionsRun};
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
        server,
        errors: vec![error],
        ok: false,
    }
}

/// The bookkeeping of an echo over `n` clients, shared by both stacks: the warm-up and
/// measured phases, each client's sequence numbers and send times, and the RTT histogram.
pub(super) struct EchoMeter {
    measure_at: Instant,
    end: Instant,
    measuring: bool,
    cpu0: PhaseCpu,
    t0: Instant,
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

impl EchoMeter {
    /// Starts the warm-up now; every client's first `window` messages (sequences 0 to
    /// `window - 1`) leave now.
    pub(super) fn start(cfg: &SessionsConfig, n: usize) -> EchoMeter {
        let start = Instant::now();
        let measure_at = start + Duration::from_secs_f64(cfg.warmup_s);
        let window = cfg.window.max(1);
        EchoMeter {
            measure_at,
            end: measure_at + Duration::from_secs_f64(cfg.seconds),
            measuring: false,
            cpu0: PhaseCpu::now(),
            t0: start,
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

    /// Before each turn: starts the measured phase when its time has come (resetting the
    /// server's counters); false once the run is over.
    pub(super) fn running(&mut self, server: &mut ServerProcess) -> Result<bool> {
        let now = Instant::now();
        if !self.measuring && now >= self.measure_at {
            self.measuring = true;
            server.reset()?;
            self.cpu0 = PhaseCpu::now();
            self.t0 = Instant::now();
        }
        Ok(now < self.end)
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

    /// Ends the measured phase: fills `run`'s rate, RTT, CPU and server figures. Returns the
    /// number of altered or out-of-order echoes.
    pub(super) fn finish(self, server: &mut ServerProcess, run: &mut SessionsRun) -> Result<u64> {
        let wall = self.t0.elapsed().as_secs_f64();
        let cpu = PhaseCpu::now();
        let stats = server.stats()?;
        run.round_trips = self.hist.len();
        run.round_trips_per_s = finite(self.hist.len() as f64 / wall.max(1e-9));
        run.rtt_us = Latency::from_ns(&self.hist);
        run.min_client_round_trips = self.counted.iter().copied().min().unwrap_or(0);
        run.set_cpu((&self.cpu0, &cpu), wall, &stats);
        run.server_rss_end_kib = stats.rss_kib;
        run.server_rss_loaded_kib = stats.rss_kib;
        run.server = stats;
        Ok(self.bad)
    }
}
