//! The load generator of `bench game`: the players split into contiguous shards, one per
//! thread (`--load-threads`), each thread with its own client set (or, for the kernel floor,
//! its own sockets and readiness set), all on one shared input grid. The calling thread keeps
//! the phases (connect, warm-up, measured, drain) and talks to the server process; the shard
//! threads only drive players.
//!
//! The load generator watches itself: each thread's CPU over the measured phase and how late
//! the inputs left against their grid. A thread busy over 90 % of the wall time, or more than
//! 1 % of the inputs over half a period late, marks the run saturated: its figures then
//! measure the client as much as the server ([`LoadStats`]).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Barrier, Mutex, OnceLock};
use std::thread::ScopedJoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use super::server::ServerProcess;
use crate::host::CpuTimes;
use crate::schema::{finite, LoadStats, ServerStats};

/// The calling thread's CPU time (user and system), s.
pub(super) fn thread_cpu_s() -> f64 {
    // SAFETY: `clock_gettime` writes one timespec into the zeroed value we own; the clock id
    // is a constant every supported OS has.
    let ts = unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
        ts
    };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// `n` players in `threads` contiguous shards, as even as they go (none empty).
pub(super) fn shards(n: usize, threads: usize) -> Vec<Range<usize>> {
    let t = threads.clamp(1, n.max(1));
    (0..t).map(|k| k * n / t..(k + 1) * n / t).collect()
}

/// About how long one turn of a shard that waits for the others to connect lasts.
pub(super) const SERVE_TURN: Duration = Duration::from_millis(20);

/// Where a run is; the shard threads read it every turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub(super) enum Phase {
    /// Inputs on the grid, nothing counted yet.
    WarmUp = 0,
    /// Inputs on the grid, counted.
    Measured = 1,
    /// No more inputs; players keep their connections serviced.
    Drain = 2,
    /// Finish up and return.
    Done = 3,
}

/// What the calling thread and the shard threads share; `S` is what a shard saw in the
/// measured phase.
pub(super) struct Control<S> {
    phase: AtomicU8,
    start: OnceLock<Instant>,
    /// Shards that have reported their connect outcome so far.
    arrived: AtomicUsize,
    /// Shards in the run.
    shards: usize,
    /// Every shard connected (or failed), then the go.
    connected: Barrier,
    go: Barrier,
    abort: AtomicBool,
    /// A shard's connect failure, or its connect time.
    connect: Mutex<(Vec<String>, Duration, usize)>,
    /// Asked of each shard at the end: why reliable inputs are still missing.
    pub(super) want_verdict: AtomicBool,
    seen: Mutex<mpsc::Sender<S>>,
}

impl<S> Control<S> {
    /// The run's phase now.
    pub(super) fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::WarmUp,
            1 => Phase::Measured,
            2 => Phase::Drain,
            _ => Phase::Done,
        }
    }

    fn set(&self, p: Phase) {
        self.phase.store(p as u8, Ordering::Release);
    }

    /// A shard thread: its players connected (`Ok(connected, took)`) or not; waits for every
    /// other shard and the go. Returns the grid's start, or `None` when the run is off.
    // The kernel floors (Linux only) call it; Ricochet's shards serve while they wait.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(super) fn connected(&self, outcome: Result<(usize, Duration)>) -> Option<Instant> {
        self.connected_serving(outcome, || {
            std::thread::sleep(SERVE_TURN);
            Ok(())
        })
    }

    /// [`Self::connected`], calling `serve` (one turn of about [`SERVE_TURN`] that services
    /// the shard's players: their keepalives and ACKs) until every other shard has connected
    /// too. With thousands of players on a busy host one shard may finish seconds before the
    /// other; players left unserviced that long would time out (idle) before the game starts.
    /// A `serve` error stops the serving and fails the run's connect.
    pub(super) fn connected_serving(
        &self,
        outcome: Result<(usize, Duration)>,
        mut serve: impl FnMut() -> Result<()>,
    ) -> Option<Instant> {
        let ok = outcome.is_ok();
        self.record(outcome);
        self.arrived.fetch_add(1, Ordering::AcqRel);
        while ok && self.arrived.load(Ordering::Acquire) < self.shards {
            if let Err(e) = serve() {
                self.record(Err(e));
                break;
            }
        }
        self.connected.wait();
        self.go.wait();
        if self.abort.load(Ordering::Acquire) {
            return None;
        }
        self.start.get().copied()
    }

    /// A shard's connect `outcome`, for the calling thread to read once every shard is in.
    fn record(&self, outcome: Result<(usize, Duration)>) {
        if let Ok(mut c) = self.connect.lock() {
            match outcome {
                Ok((n, took)) => {
                    c.1 = c.1.max(took);
                    c.2 += n;
                }
                Err(e) => c.0.push(crate::error_chain(e.as_ref())),
            }
        }
    }

    /// A shard thread: its measured phase is over (called once, at [`Phase::Drain`]).
    pub(super) fn report(&self, seen: S) {
        if let Ok(tx) = self.seen.lock() {
            let _ = tx.send(seen);
        }
    }
}

/// The shape of a driven run.
pub(super) struct Plan {
    /// Players (clients) over every shard.
    pub(super) players: usize,
    /// Load-generator threads (shards).
    pub(super) threads: usize,
    /// Warm-up and measured time, s.
    pub(super) warmup_s: f64,
    /// Measured time, s.
    pub(super) seconds: f64,
    /// Longest wait after the measured phase for what is still in flight.
    pub(super) drain: Duration,
}

/// What [`drive`] hands back.
pub(super) struct Driven<S, E> {
    /// Players connected, over every shard.
    pub(super) connected: usize,
    /// The slowest shard's connect time.
    pub(super) connect: Duration,
    /// The server's report after the connect (before any traffic).
    pub(super) loaded: ServerStats,
    /// What each shard saw in the measured phase.
    pub(super) seen: Vec<S>,
    /// The measured phase's wall time, s, and the load generator process's CPU over it, s.
    pub(super) wall_s: f64,
    pub(super) cpu_s: f64,
    /// The server's report for the measured phase.
    pub(super) measured: ServerStats,
    /// The server's report after the drain.
    pub(super) drained: ServerStats,
    /// Each shard's own end result.
    pub(super) ends: Vec<E>,
}

/// Runs `plan.players` players against `server` on `plan.threads` threads, each running
/// `shard(range, control)` over its share: the shard connects its players, reports it with
/// [`Control::connected`], drives them until [`Phase::Drain`] ([`Control::report`]), keeps
/// them serviced until [`Phase::Done`] and returns its end result. Meanwhile this thread
/// resets the server at the start of the measured phase, reads it at its end, and waits up to
/// `plan.drain` while `pending(shards' reports, server report)` holds (asking the shards for a
/// verdict if it still does). `Err(message)` inside: the players did not all connect.
pub(super) fn drive<S: Send, E: Send>(
    plan: &Plan,
    server: &mut ServerProcess,
    pending: impl Fn(&[S], &ServerStats) -> bool,
    shard: impl Fn(Range<usize>, &Control<S>) -> Result<E> + Sync,
) -> Result<Result<Driven<S, E>, String>> {
    let ranges = shards(plan.players, plan.threads);
    let t = ranges.len();
    let (tx, rx) = mpsc::channel();
    let ctl = Control {
        phase: AtomicU8::new(Phase::WarmUp as u8),
        start: OnceLock::new(),
        arrived: AtomicUsize::new(0),
        shards: t,
        connected: Barrier::new(t + 1),
        go: Barrier::new(t + 1),
        abort: AtomicBool::new(false),
        connect: Mutex::new((Vec::new(), Duration::ZERO, 0)),
        want_verdict: AtomicBool::new(false),
        seen: Mutex::new(tx),
    };
    let (ctl, shard) = (&ctl, &shard);
    std::thread::scope(|scope| {
        let mut threads = Vec::with_capacity(t);
        for (k, range) in ranges.into_iter().enumerate() {
            let h = std::thread::Builder::new()
                .name(format!("load-{k}"))
                .spawn_scoped(scope, move || shard(range, ctl))
                .context("starting a load-generator thread")?;
            threads.push(h);
        }
        ctl.connected.wait();
        let (errors, connect, connected) = ctl
            .connect
            .lock()
            .map_err(|_| anyhow!("a load thread panicked"))?
            .clone();
        if !errors.is_empty() {
            ctl.abort.store(true, Ordering::Release);
            ctl.go.wait();
            join(threads)?;
            return Ok(Err(errors.join("; ")));
        }
        // Every player in: the game starts (snapshots), the grid with it.
        let loaded = server.play()?;
        let start = Instant::now();
        let _ = ctl.start.set(start);
        ctl.go.wait();
        let measure_at = start + Duration::from_secs_f64(plan.warmup_s);
        sleep_until(measure_at);
        server.reset()?;
        let (cpu0, t0) = (CpuTimes::now(), Instant::now());
        ctl.set(Phase::Measured);
        sleep_until(measure_at + Duration::from_secs_f64(plan.seconds));
        let measured = server.stats()?;
        ctl.set(Phase::Drain);
        let (cpu1, wall_s) = (CpuTimes::now(), t0.elapsed().as_secs_f64());
        let mut seen = Vec::with_capacity(t);
        // A shard reports at its next turn, unless it ended with an error (then its thread is
        // finished, and its error is the run's).
        let give_up = Instant::now() + Duration::from_secs(30);
        while seen.len() < t && Instant::now() < give_up {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(s) => seen.push(s),
                Err(_) if seen.len() + threads.iter().filter(|h| h.is_finished()).count() >= t => {
                    break
                }
                Err(_) => {}
            }
        }
        if seen.len() < t {
            ctl.set(Phase::Done);
            join(threads)?;
            bail!("a load-generator thread did not report its measured phase");
        }
        // Drain: no more new traffic; give what is in flight time to arrive.
        let drain_end = Instant::now() + plan.drain;
        let mut drained = server.stats()?;
        while pending(&seen, &drained) && Instant::now() < drain_end {
            std::thread::sleep(Duration::from_millis(100));
            drained = server.stats()?;
        }
        ctl.want_verdict
            .store(pending(&seen, &drained), Ordering::Release);
        ctl.set(Phase::Done);
        let ends = join(threads)?;
        Ok(Ok(Driven {
            connected,
            connect,
            loaded,
            seen,
            wall_s,
            cpu_s: cpu1.seconds_since(&cpu0),
            measured,
            drained,
            ends,
        }))
    })
}

/// Joins every shard thread; the first error (or panic) is the result.
fn join<E>(threads: Vec<ScopedJoinHandle<'_, Result<E>>>) -> Result<Vec<E>> {
    let mut ends = Vec::with_capacity(threads.len());
    let mut first_err = None;
    for h in threads {
        match h.join() {
            Ok(Ok(e)) => ends.push(e),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(anyhow!("a load-generator thread panicked"));
            }
        }
    }
    match first_err {
        Some(e) => Err(e.context("the load generator")),
        None => Ok(ends),
    }
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// The load generator's share of a run's CPU, for tables: `threads` and the process's CPU.
pub fn describe(l: &LoadStats) -> String {
    format!(
        "{} thread{}, {:.0} % CPU, busiest {:.0} %{}",
        l.threads,
        if l.threads == 1 { "" } else { "s" },
        finite(l.cpu_percent),
        finite(l.busy_max_percent),
        if l.saturated { ", SATURATED" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_every_player_once_and_none_is_empty() {
        for (n, t) in [(10, 3), (1, 4), (1000, 2), (0, 2), (7, 7)] {
            let s = shards(n, t);
            assert_eq!(s.iter().map(|r| r.len()).sum::<usize>(), n, "{n} {t}");
            assert!(s.windows(2).all(|w| w[0].end == w[1].start));
            assert!(n == 0 || s.iter().all(|r| !r.is_empty()), "{s:?}");
        }
    }

    #[test]
    fn a_busy_thread_or_late_inputs_mark_saturation() {
        let ok = LoadStats::new(2, 1.0, 0.8, &[0.4, 0.5], (1000, 5, 900.0));
        assert!(!ok.saturated, "{ok:?}");
        assert!((ok.cpu_percent - 80.0).abs() < 1e-9);
        assert!(LoadStats::new(2, 1.0, 1.0, &[0.95, 0.1], (1000, 0, 0.0)).saturated);
        assert!(LoadStats::new(1, 1.0, 0.5, &[0.5], (1000, 11, 9000.0)).saturated);
    }
}
