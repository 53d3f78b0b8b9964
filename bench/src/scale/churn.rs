//! The churn of `bench sessions` (`--mode churn`), the same for both stacks: the clients split
//! into `--load-threads` contiguous shards, each thread running batches of its shard's clients
//! (fresh sockets, and for Ricochet fresh tokens) one after another until its batches have
//! taken `--seconds`. Shards do not wait for each other: while one thread opens its sockets or
//! closes them, another's sessions are on the wire, as players of a fleet that restarts do not
//! wait for each other either. Each batch is timed from its first socket opened to its last
//! closed (a Ricochet batch's token minting, a backend's work, is not counted).
//!
//! A thread's rate is its completed sessions over its batches' time; the run's rate is the
//! sum over the threads (one thread: exactly the single-threaded figure). Each thread's CPU
//! over the churn's wall time marks a saturated load generator, as the echo's does.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;

use super::echo_meter::PhaseCpu;
use super::load::{shards, thread_cpu_s};
use crate::schema::{finite, LoadStats, ServerStats, SessionsConfig, SessionsRun};

/// What one batch of a churn shard did.
#[derive(Debug, Default)]
pub(super) struct Batch {
    /// Sessions that completed (connected, echoed, closed).
    pub(super) completed: usize,
    /// The batch's time: first socket opened to last closed.
    pub(super) took: Duration,
    /// What went wrong; any error ends the run after this batch (every shard stops).
    pub(super) errors: Vec<String>,
}

/// One shard's batches, summed.
#[derive(Debug, Default)]
struct ShardTotals {
    completed: usize,
    busy: Duration,
    cpu_s: f64,
    errors: Vec<String>,
}

/// What the shards did together, with the CPU and wall time around them.
pub(super) struct Churned {
    /// Sessions completed over every shard.
    pub(super) completed: usize,
    /// Sum over the shards of completed sessions over batch time, per second.
    pub(super) rate: f64,
    /// The longest shard's batch time, s.
    pub(super) busy_s: f64,
    /// Every shard's errors.
    pub(super) errors: Vec<String>,
    load: LoadStats,
    cpu: (PhaseCpu, PhaseCpu),
    wall_s: f64,
}

/// Runs `cfg`'s churn: `batch(range, number)` connects, echoes and closes clients `range` (the
/// shard's, absolute indices) as its shard's batch `number` (0, 1, ... per shard: each
/// batch's addresses from `number * groups(cfg)` on are fresh, and shards' ranges differ).
pub(super) fn drive_churn(
    cfg: &SessionsConfig,
    batch: impl Fn(Range<usize>, usize) -> Result<Batch> + Sync,
) -> Churned {
    let ranges = shards(cfg.clients, cfg.load_threads);
    let stop = AtomicBool::new(false);
    let (cpu0, wall0) = (PhaseCpu::now(), Instant::now());
    // The first shard runs on the calling thread, the others on threads of their own: one
    // thread churns exactly as before there were shards. (A single shard on a spawned thread
    // measured slower, 2,741-3,228 against 3,894-4,012 Ricochet sessions/s over three
    // alternated pairs; why was not established.)
    let totals: Vec<ShardTotals> = std::thread::scope(|s| {
        let handles: Vec<_> = ranges[1..]
            .iter()
            .map(|range| {
                let (batch, stop) = (&batch, &stop);
                s.spawn(move || shard(cfg, range.clone(), batch, stop))
            })
            .collect();
        let first = shard(cfg, ranges[0].clone(), &batch, &stop);
        std::iter::once(first)
            .chain(handles.into_iter().map(|h| {
                h.join().unwrap_or_else(|_| ShardTotals {
                    errors: vec!["a churn thread panicked".into()],
                    ..ShardTotals::default()
                })
            }))
            .collect()
    });
    let wall_s = wall0.elapsed().as_secs_f64();
    let cpu = (cpu0, PhaseCpu::now());
    let busy: Vec<f64> = totals.iter().map(|t| t.cpu_s).collect();
    let load = LoadStats::new(
        ranges.len(),
        wall_s,
        cpu.1.process_seconds_since(&cpu.0),
        &busy,
        (0, 0, 0.0),
    );
    Churned {
        completed: totals.iter().map(|t| t.completed).sum(),
        rate: totals
            .iter()
            .map(|t| t.completed as f64 / t.busy.as_secs_f64().max(1e-9))
            .sum(),
        busy_s: totals
            .iter()
            .map(|t| t.busy.as_secs_f64())
            .fold(0.0, f64::max),
        errors: totals.into_iter().flat_map(|t| t.errors).collect(),
        load,
        cpu,
        wall_s,
    }
}

/// One shard's thread: batches until they took `cfg.seconds`, or any shard failed.
fn shard(
    cfg: &SessionsConfig,
    range: Range<usize>,
    batch: impl Fn(Range<usize>, usize) -> Result<Batch>,
    stop: &AtomicBool,
) -> ShardTotals {
    let cpu0 = thread_cpu_s();
    let mut t = ShardTotals::default();
    let mut number = 0;
    while t.busy.as_secs_f64() < cfg.seconds && !stop.load(Ordering::Acquire) {
        let b = batch(range.clone(), number).unwrap_or_else(|e| Batch {
            errors: vec![crate::error_chain(e.as_ref())],
            ..Batch::default()
        });
        number += 1;
        t.completed += b.completed;
        t.busy += b.took;
        if !b.errors.is_empty() {
            t.errors.extend(b.errors);
            stop.store(true, Ordering::Release);
        }
    }
    t.cpu_s = thread_cpu_s() - cpu0;
    t
}

impl SessionsRun {
    /// Fills the churn's figures from `c` and the server's report `stats` at its end.
    pub(super) fn set_churn(&mut self, c: &Churned, stats: &ServerStats) {
        self.connected = c.completed;
        self.connect_s = finite(c.busy_s);
        self.handshakes_per_s = finite(c.rate);
        self.set_cpu((&c.cpu.0, &c.cpu.1), c.wall_s, stats);
        self.load = Some(c.load.clone());
        self.server_rss_end_kib = stats.rss_kib;
        self.server = stats.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(clients: usize, threads: usize) -> SessionsConfig {
        SessionsConfig {
            clients,
            mode: "churn".into(),
            clients_per_ip: 1000,
            io_threads: 1,
            server_idle: "balanced".into(),
            server_pinning: None,
            server_slice_us: None,
            backend: "auto".into(),
            profile: "default".into(),
            security: "secure".into(),
            payload: 64,
            window: 1,
            settle_s: 0.0,
            warmup_s: 0.0,
            seconds: 1.0,
            stack: None,
            load_threads: threads,
        }
    }

    #[test]
    fn each_shard_churns_its_own_clients_until_its_batches_took_the_time() {
        let seen = std::sync::Mutex::new(Vec::new());
        let c = drive_churn(&config(10, 2), |range, number| {
            seen.lock().unwrap().push((range.clone(), number));
            Ok(Batch {
                completed: range.len(),
                took: Duration::from_millis(400),
                errors: Vec::new(),
            })
        });
        let mut seen = seen.into_inner().unwrap();
        seen.sort_by_key(|(r, n)| (r.start, *n));
        // 0.4 s a batch: three batches reach 1 s, per shard, numbered from 0 in each.
        let want: Vec<_> = [0..5, 5..10]
            .into_iter()
            .flat_map(|r| (0..3).map(move |n| (r.clone(), n)))
            .collect();
        assert_eq!(seen, want);
        assert_eq!(c.completed, 30);
        // Each shard: 15 sessions in 1.2 s of batches.
        assert!((c.rate - 25.0).abs() < 1e-9, "{}", c.rate);
        assert!((c.busy_s - 1.2).abs() < 1e-9, "{}", c.busy_s);
        assert_eq!(c.load.threads, 2);
        assert!(c.errors.is_empty());
    }

    #[test]
    fn an_error_in_one_shard_stops_every_shard() {
        let c = drive_churn(&config(4, 2), |range, _| {
            if range.start > 0 {
                anyhow::bail!("no socket");
            }
            // The other shard goes on only until it sees the stop.
            std::thread::sleep(Duration::from_millis(5));
            Ok(Batch {
                completed: 1,
                took: Duration::from_millis(1),
                errors: Vec::new(),
            })
        });
        assert_eq!(c.errors, vec!["no socket".to_string()]);
        assert!(c.completed < 1000, "{}", c.completed);
    }
}
