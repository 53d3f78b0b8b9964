//! The players' side of a `bench game` run that Ricochet's run and the kernel floor share: the
//! inputs' grid, the measured phase, what each player saw of the snapshots, and the figures
//! the server's counters give.

use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;

use super::server::{ServerProcess, INPUT_HEADER, SNAPSHOT_HEADER};
use crate::host::CpuTimes;
use crate::schema::{finite, Latency};
use crate::schema::{GameConfig, GameRun, ServerStats};
use crate::udp::tracker::new_rtt_histogram;

// A snapshot starts with its tick number and its send time, 8 bytes each.
const _: () = assert!(SNAPSHOT_HEADER >= 16);

/// Longest a turn waits for the next input's due time.
const MAX_WAIT: Duration = Duration::from_millis(5);

/// One player's inputs and snapshots.
#[derive(Debug, Clone, Copy, Default)]
struct Player {
    input_seq: u64,
    last_tick: Option<u64>,
    first_measured: Option<u64>,
    last_measured: u64,
    measured: u64,
}

/// The players' bookkeeping over a run.
pub(super) struct PlayerMeter {
    period: Duration,
    start: Instant,
    measure_at: Instant,
    end: Instant,
    measuring: bool,
    players: Vec<Player>,
    /// Inputs due so far: player i's k-th input is due at start + (k + i/n) periods.
    inputs_due: u64,
    next_player: usize,
    inputs_measured: u64,
    body: Vec<u8>,
    hist: Histogram<u64>,
    stale: u64,
    cpu0: CpuTimes,
    t0: Instant,
}

/// What the players saw, at the end of a run.
pub(super) struct PlayersSeen {
    pub(super) latency: Option<Latency>,
    pub(super) received: u64,
    pub(super) lost: u64,
    pub(super) stale: u64,
    pub(super) inputs_measured: u64,
    pub(super) inputs_total: u64,
    /// The players' CPU over the measured phase, % of one core.
    pub(super) client_cpu_percent: f64,
}

impl PlayerMeter {
    /// `n` players of `cfg`, ticking every `period`, starting now.
    pub(super) fn new(cfg: &GameConfig, period: Duration, n: usize) -> PlayerMeter {
        let start = Instant::now();
        let measure_at = start + Duration::from_secs_f64(cfg.warmup_s);
        PlayerMeter {
            period,
            start,
            measure_at,
            end: measure_at + Duration::from_secs_f64(cfg.seconds),
            measuring: false,
            players: vec![Player::default(); n],
            inputs_due: 0,
            next_player: 0,
            inputs_measured: 0,
            body: vec![0u8; cfg.input_bytes.max(INPUT_HEADER)],
            hist: new_rtt_histogram(),
            stale: 0,
            cpu0: CpuTimes::now(),
            t0: start,
        }
    }

    /// Moves the run on in time: when the measured phase begins, resets `server`'s counters
    /// and starts the players' CPU clock (by then every player has sent inputs, so a floor
    /// server knows them all); once it is over, returns the server's figures for it.
    pub(super) fn advance(&mut self, server: &mut ServerProcess) -> Result<Option<ServerStats>> {
        let now = Instant::now();
        if now >= self.end {
            return server.stats().map(Some);
        }
        if !self.measuring && now >= self.measure_at {
            self.measuring = true;
            server.reset()?;
            self.cpu0 = CpuTimes::now();
            self.t0 = Instant::now();
        }
        Ok(None)
    }

    /// Sends every input due by `now` with `send(player, body)`, in grid order; a body starts
    /// with the player's input number.
    pub(super) fn send_due(
        &mut self,
        now: Instant,
        mut send: impl FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let n = self.players.len();
        let elapsed = now.saturating_duration_since(self.start).as_secs_f64();
        let target = (elapsed / self.period.as_secs_f64() * n as f64) as u64;
        while self.inputs_due < target {
            let i = self.next_player;
            self.next_player = (self.next_player + 1) % n.max(1);
            self.inputs_due += 1;
            let p = &mut self.players[i];
            self.body[..INPUT_HEADER].copy_from_slice(&p.input_seq.to_le_bytes());
            send(i, &self.body)?;
            p.input_seq += 1;
            if self.measuring {
                self.inputs_measured += 1;
            }
        }
        Ok(())
    }

    /// How long a turn may wait now: until the next input is due, at most 5 ms.
    pub(super) fn wait(&self) -> Duration {
        let n = self.players.len().max(1) as f64;
        let next = self.start
            + Duration::from_secs_f64((self.inputs_due + 1) as f64 / n * self.period.as_secs_f64());
        next.saturating_duration_since(Instant::now()).min(MAX_WAIT)
    }

    /// Player `i` received `snapshot` at `recv_ns` (the host's monotonic clock). Fails for a
    /// datagram too short to be a snapshot.
    pub(super) fn snapshot(
        &mut self,
        i: usize,
        snapshot: &[u8],
        recv_ns: u64,
    ) -> Result<(), String> {
        let le = |at: usize| {
            snapshot
                .get(at..at + 8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_le_bytes)
        };
        let (Some(tick), Some(sent)) = (le(0), le(8)) else {
            return Err(format!("player {i}: a short snapshot"));
        };
        let p = &mut self.players[i];
        if p.last_tick.is_some_and(|l| tick <= l) {
            self.stale += 1;
            return Ok(());
        }
        p.last_tick = Some(tick);
        if self.measuring {
            self.hist
                .saturating_record(recv_ns.saturating_sub(sent).max(1));
            p.first_measured.get_or_insert(tick);
            p.last_measured = tick;
            p.measured += 1;
        }
        Ok(())
    }

    /// Inputs sent so far, over every player.
    pub(super) fn inputs_total(&self) -> u64 {
        self.players.iter().map(|p| p.input_seq).sum()
    }

    /// The measured phase's figures; call when it is over.
    pub(super) fn finish(&self) -> PlayersSeen {
        let wall = self.t0.elapsed().as_secs_f64();
        let (mut lost, mut received) = (0u64, 0u64);
        for p in &self.players {
            if let Some(first) = p.first_measured {
                lost += (p.last_measured - first + 1).saturating_sub(p.measured);
                received += p.measured;
            }
        }
        PlayersSeen {
            latency: Latency::from_ns(&self.hist),
            received,
            lost,
            stale: self.stale,
            inputs_measured: self.inputs_measured,
            inputs_total: self.inputs_total(),
            client_cpu_percent: finite(
                CpuTimes::now().seconds_since(&self.cpu0) / wall.max(1e-9) * 100.0,
            ),
        }
    }
}

/// What the server's counters say went wrong, into `errors`: inputs out of order (`drained`,
/// counted from the start) and snapshots refused in the measured phase (`measured`), by
/// `refused_by`.
pub(super) fn server_faults(
    drained: &ServerStats,
    measured: &ServerStats,
    refused_by: &str,
    errors: &mut Vec<String>,
) {
    if drained.game.input_order_errors > 0 {
        errors.push(format!(
            "{} inputs out of order",
            drained.game.input_order_errors
        ));
    }
    if measured.game.snapshot_send_errors > 0 {
        errors.push(format!(
            "{} snapshots refused by {refused_by}",
            measured.game.snapshot_send_errors
        ));
    }
}

impl GameRun {
    /// A case that ended before its measurement, with `error`.
    pub(super) fn failed(cfg: &GameConfig, server: ServerStats, error: String) -> GameRun {
        GameRun {
            config: cfg.clone(),
            connected: 0,
            connect_s: 0.0,
            snapshot_latency_us: None,
            snapshots_received: 0,
            snapshots_lost: 0,
            snapshots_stale: 0,
            inputs_sent: 0,
            inputs_sent_total: 0,
            inputs_lost: 0,
            input_order_errors: 0,
            ticks_per_s: 0.0,
            ticks_late: 0,
            ticks_skipped: 0,
            tick_lateness_max_us: 0.0,
            snapshots_sent: 0,
            snapshot_send_errors: 0,
            server_cpu_percent: 0.0,
            server_cpu_us_per_tick: 0.0,
            client_cpu_percent: 0.0,
            server_rss_per_session_bytes: None,
            server,
            relay_loss: None,
            errors: vec![error],
            ok: false,
        }
    }

    /// A measured run of `cfg`: what the players saw and the server's figures for ticks every
    /// `period`; the caller fills in the rest.
    pub(super) fn measured(
        cfg: &GameConfig,
        period: Duration,
        seen: &PlayersSeen,
        stats: &ServerStats,
    ) -> GameRun {
        let mut run = GameRun::failed(cfg, stats.clone(), String::new());
        run.errors.clear();
        // What the players saw.
        run.snapshot_latency_us = seen.latency;
        run.snapshots_received = seen.received;
        run.snapshots_lost = seen.lost;
        run.snapshots_stale = seen.stale;
        run.inputs_sent = seen.inputs_measured;
        run.inputs_sent_total = seen.inputs_total;
        run.client_cpu_percent = seen.client_cpu_percent;
        // The server's figures of the measured phase (its counters were reset at its start),
        // per worker the server reported.
        let workers = stats.workers.len().max(1) as f64;
        let w = &stats.workers;
        let tick_periods = stats.wall_s / period.as_secs_f64();
        run.ticks_per_s = finite(stats.game.ticks as f64 / workers / stats.wall_s.max(1e-9));
        run.ticks_late = w.iter().map(|w| w.ticks_late).sum();
        run.ticks_skipped = w.iter().map(|w| w.ticks_skipped).sum();
        run.tick_lateness_max_us =
            finite(w.iter().map(|w| w.tick_lateness_max_ns).max().unwrap_or(0) as f64 / 1000.0);
        run.snapshots_sent = stats.game.snapshots_sent;
        run.snapshot_send_errors = stats.game.snapshot_send_errors;
        run.server_cpu_percent = finite(stats.cpu_s / stats.wall_s.max(1e-9) * 100.0);
        run.server_cpu_us_per_tick = finite(stats.cpu_s * 1e6 / tick_periods.max(1e-9));
        run
    }
}
