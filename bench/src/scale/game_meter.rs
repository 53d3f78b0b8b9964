//! The players' side of a `bench game` run that Ricochet's run and the kernel floor share: the
//! inputs' grid, the measured phase, what each player saw of the snapshots, and the figures
//! the server's counters give.
//!
//! The players are split into contiguous shards, one per load-generator thread
//! ([`super::load`]); a [`PlayerMeter`] keeps one shard's books, and [`PlayersSeen::merge`]
//! adds the shards up.

use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;

use super::load::{drive, thread_cpu_s, Control, Driven, Plan};
use super::server::{ServerProcess, INPUT_HEADER, SNAPSHOT_HEADER};
use crate::schema::{finite, Latency, LoadStats};
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

/// One shard's bookkeeping over a run: players `first..first + len` of `total`.
pub(super) struct PlayerMeter {
    period: Duration,
    start: Instant,
    measuring: bool,
    total: u64,
    first: u64,
    players: Vec<Player>,
    /// The next input's place on the grid of all players: player `q % total`'s input number
    /// `q / total`, due at start + q / total periods (always one of this shard's players).
    next_q: u64,
    inputs_measured: u64,
    inputs_late: u64,
    lateness_max: Duration,
    body: Vec<u8>,
    hist: Histogram<u64>,
    stale: u64,
    cpu0: f64,
    t0: Instant,
    errors: Vec<String>,
}

/// What the players (one shard, or all of them merged) saw, at the end of a measured phase.
pub(super) struct PlayersSeen {
    pub(super) hist: Histogram<u64>,
    pub(super) received: u64,
    pub(super) lost: u64,
    pub(super) stale: u64,
    pub(super) inputs_measured: u64,
    pub(super) inputs_total: u64,
    pub(super) inputs_late: u64,
    pub(super) lateness_max: Duration,
    /// Per shard: its thread's CPU over the measured phase, s.
    pub(super) busy_s: Vec<f64>,
    /// What went wrong on the players' side (a few at most per shard).
    pub(super) errors: Vec<String>,
    /// The load generator's figures (filled in by the driver once every shard is in).
    pub(super) load: Option<LoadStats>,
}

/// Errors a shard keeps (more only repeat the story).
const MAX_ERRORS: usize = 20;

impl PlayerMeter {
    /// The players `range` of `cfg.players`, ticking every `period` from `start`.
    pub(super) fn new(
        cfg: &GameConfig,
        period: Duration,
        range: Range<usize>,
        start: Instant,
    ) -> PlayerMeter {
        PlayerMeter {
            period,
            start,
            measuring: false,
            total: cfg.players.max(1) as u64,
            first: range.start as u64,
            players: vec![Player::default(); range.len()],
            next_q: range.start as u64,
            inputs_measured: 0,
            inputs_late: 0,
            lateness_max: Duration::ZERO,
            body: vec![0u8; cfg.input_bytes.max(INPUT_HEADER)],
            hist: new_rtt_histogram(),
            stale: 0,
            cpu0: thread_cpu_s(),
            t0: start,
            errors: Vec::new(),
        }
    }

    /// The measured phase begins now (call on the shard's thread: its CPU clock starts).
    pub(super) fn begin_measuring(&mut self) {
        if !self.measuring {
            self.measuring = true;
            self.cpu0 = thread_cpu_s();
            self.t0 = Instant::now();
        }
    }

    /// When grid place `q` is due.
    fn due(&self, q: u64) -> Instant {
        self.start + self.period.mul_f64(q as f64 / self.total as f64)
    }

    /// Sends every input of this shard due by `now` with `send(local player, body)`, in grid
    /// order; a body starts with the player's input number.
    pub(super) fn send_due(
        &mut self,
        now: Instant,
        mut send: impl FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let n = self.players.len() as u64;
        if n == 0 {
            return Ok(());
        }
        let half = self.period / 2;
        // At most one round of the shard's inputs per turn: a thread that fell behind still
        // receives and sees the run's phase between bursts (its lateness says it fell behind).
        // Due by the same clock as [`Self::wait`]: a place that `wait` calls due is sent now,
        // so a turn never finds nothing to wait for and nothing to send (a spin).
        let mut burst = n;
        while self.due(self.next_q) <= now && burst > 0 {
            burst -= 1;
            let q = self.next_q;
            let i = (q % self.total - self.first) as usize;
            // The next place that is this shard's: the next player, or its first next round.
            self.next_q = if (q % self.total) + 1 < self.first + n {
                q + 1
            } else {
                q - q % self.total + self.total + self.first
            };
            let p = &mut self.players[i];
            self.body[..INPUT_HEADER].copy_from_slice(&p.input_seq.to_le_bytes());
            p.input_seq += 1;
            send(i, &self.body)?;
            if self.measuring {
                self.inputs_measured += 1;
                let late = now.saturating_duration_since(self.due(q));
                self.inputs_late += u64::from(late > half);
                self.lateness_max = self.lateness_max.max(late);
            }
        }
        Ok(())
    }

    /// How long a turn may wait now: until this shard's next input is due, at most 5 ms.
    pub(super) fn wait(&self) -> Duration {
        self.due(self.next_q)
            .saturating_duration_since(Instant::now())
            .min(MAX_WAIT)
    }

    /// Local player `i` received `snapshot` at `recv_ns` (the host's monotonic clock). A
    /// datagram too short to be a snapshot is an error of the run.
    pub(super) fn snapshot(&mut self, i: usize, snapshot: &[u8], recv_ns: u64) {
        let le = |at: usize| {
            snapshot
                .get(at..at + 8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_le_bytes)
        };
        let (Some(tick), Some(sent)) = (le(0), le(8)) else {
            let g = self.first + i as u64;
            self.error(format!("player {g}: a short snapshot"));
            return;
        };
        let p = &mut self.players[i];
        if p.last_tick.is_some_and(|l| tick <= l) {
            self.stale += 1;
            return;
        }
        p.last_tick = Some(tick);
        if self.measuring {
            self.hist
                .saturating_record(recv_ns.saturating_sub(sent).max(1));
            p.first_measured.get_or_insert(tick);
            p.last_measured = tick;
            p.measured += 1;
        }
    }

    /// Notes something that went wrong (the first [`MAX_ERRORS`] are kept).
    pub(super) fn error(&mut self, e: String) {
        if self.errors.len() < MAX_ERRORS {
            self.errors.push(e);
        }
    }

    /// The measured phase's figures; call on the shard's thread when it is over.
    pub(super) fn finish(&mut self) -> PlayersSeen {
        let (mut lost, mut received) = (0u64, 0u64);
        for p in &self.players {
            if let Some(first) = p.first_measured {
                lost += (p.last_measured - first + 1).saturating_sub(p.measured);
                received += p.measured;
            }
        }
        let busy = if self.measuring {
            thread_cpu_s() - self.cpu0
        } else {
            0.0
        };
        PlayersSeen {
            hist: self.hist.clone(),
            received,
            lost,
            stale: self.stale,
            inputs_measured: self.inputs_measured,
            inputs_total: self.players.iter().map(|p| p.input_seq).sum(),
            inputs_late: self.inputs_late,
            lateness_max: self.lateness_max,
            busy_s: vec![finite(busy)],
            errors: std::mem::take(&mut self.errors),
            load: None,
        }
    }
}

/// [`drive`] for `bench game`: the shards' figures merged, with the load generator's.
pub(super) fn drive_game<E: Send>(
    cfg: &GameConfig,
    server: &mut ServerProcess,
    drain: Duration,
    shard: impl Fn(Range<usize>, &Control<PlayersSeen>) -> Result<E> + Sync,
) -> Result<Result<Driven<PlayersSeen, E>, String>> {
    let plan = Plan {
        players: cfg.players,
        threads: cfg.load_threads,
        warmup_s: cfg.warmup_s,
        seconds: cfg.seconds,
        drain,
    };
    let inputs_pending = |seen: &[PlayersSeen], s: &ServerStats| {
        s.game.inputs_received < seen.iter().map(|p| p.inputs_total).sum::<u64>()
    };
    let mut d = match drive(&plan, server, inputs_pending, shard)? {
        Ok(d) => d,
        Err(e) => return Ok(Err(e)),
    };
    let mut seen = PlayersSeen::merge(std::mem::take(&mut d.seen));
    seen.load = Some(LoadStats::new(
        plan.threads.clamp(1, cfg.players.max(1)),
        d.wall_s,
        d.cpu_s,
        &seen.busy_s,
        (
            seen.inputs_measured,
            seen.inputs_late,
            seen.lateness_max.as_secs_f64() * 1e6,
        ),
    ));
    d.seen = vec![seen];
    Ok(Ok(d))
}

impl PlayersSeen {
    /// Every shard's figures added up.
    pub(super) fn merge(shards: Vec<PlayersSeen>) -> PlayersSeen {
        let mut all = PlayersSeen {
            hist: new_rtt_histogram(),
            received: 0,
            lost: 0,
            stale: 0,
            inputs_measured: 0,
            inputs_total: 0,
            inputs_late: 0,
            lateness_max: Duration::ZERO,
            busy_s: Vec::new(),
            errors: Vec::new(),
            load: None,
        };
        for s in shards {
            // Both histograms have the same bounds; a value past them was saturated already.
            let _ = all.hist.add(&s.hist);
            all.received += s.received;
            all.lost += s.lost;
            all.stale += s.stale;
            all.inputs_measured += s.inputs_measured;
            all.inputs_total += s.inputs_total;
            all.inputs_late += s.inputs_late;
            all.lateness_max = all.lateness_max.max(s.lateness_max);
            all.busy_s.extend(s.busy_s);
            all.errors.extend(s.errors);
        }
        all
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
            server_cpu_us_per_player_tick: None,
            server_allocs_per_player_tick: None,
            load: None,
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
        run.snapshot_latency_us = Latency::from_ns(&seen.hist);
        run.snapshots_received = seen.received;
        run.snapshots_lost = seen.lost;
        run.snapshots_stale = seen.stale;
        run.inputs_sent = seen.inputs_measured;
        run.inputs_sent_total = seen.inputs_total;
        run.client_cpu_percent = seen.load.as_ref().map_or(0.0, |l| l.cpu_percent);
        run.load = seen.load.clone();
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
        // Player-ticks served: a snapshot is one player's share of one tick.
        run.server_cpu_us_per_player_tick = (stats.game.snapshots_sent > 0)
            .then(|| finite(stats.cpu_s * 1e6 / stats.game.snapshots_sent as f64));
        run.server_allocs_per_player_tick = stats
            .allocs
            .filter(|_| stats.game.snapshots_sent > 0)
            .map(|a| finite(a.calls as f64 / stats.game.snapshots_sent as f64));
        run
    }
}

#[cfg(test)]
mod tests {
    use super::PlayerMeter;
    use crate::schema::GameConfig;
    use std::time::{Duration, Instant};

    fn config(players: usize) -> GameConfig {
        GameConfig {
            players,
            tick_hz: 60.0,
            snapshot_bytes: 200,
            input_bytes: 32,
            relay_profile: None,
            seed: 1,
            players_per_ip: 1000,
            io_threads: 1,
            server_idle: "tick".into(),
            server_pinning: None,
            server_slice_us: None,
            acks_on_tick: false,
            backend: "auto".into(),
            profile: "game".into(),
            security: "secure".into(),
            warmup_s: 0.0,
            seconds: 1.0,
            stack: None,
            load_threads: 2,
        }
    }

    #[test]
    fn a_turn_told_not_to_wait_has_an_input_to_send() {
        let period = Duration::from_millis(10);
        let start = Instant::now();
        // Players 0..4 of 8: grid places 1.25 ms apart, this shard's the first four of a round.
        let mut m = PlayerMeter::new(&config(8), period, 0..4, start);
        let mut sent = Vec::new();
        // Every 100 µs over three periods: whenever the meter says not to wait, the turn at
        // that moment sends (a turn with no wait and nothing to send is a spin).
        for k in 0..300u32 {
            let now = start + Duration::from_micros(100) * k;
            let before = sent.len();
            let wait = m.due(m.next_q).saturating_duration_since(now);
            m.send_due(now, |i, body| {
                sent.push((i, body[0]));
                Ok(())
            })
            .expect("recording a send cannot fail");
            assert!(
                !wait.is_zero() || sent.len() > before,
                "at {:?} the turn may not wait but sends nothing",
                now - start
            );
        }
        // Each player's inputs in order, one per period: 3 periods of 4 players.
        assert_eq!(sent.len(), 12);
        for i in 0..4 {
            let seqs: Vec<u8> = sent.iter().filter(|s| s.0 == i).map(|s| s.1).collect();
            assert_eq!(seqs, [0, 1, 2], "player {i}");
        }
    }
}
