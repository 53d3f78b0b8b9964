//! Operating a server: the metrics endpoint (OpenMetrics for Prometheus, `/sessions` for the
//! live view), health and readiness.
//!
//! Nothing here runs on a worker's hot path. Workers keep their counters as they always do
//! and publish them: the loop counters every few turns ([`CounterCell`]), the endpoint's a
//! snapshot once a second when metrics are on ([`ServiceCell`]). The endpoint's thread reads
//! what was published.

pub(crate) mod hist;
mod http;
mod metrics;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ricochet_proto::EndpointStats;

use self::hist::{Hist, RTT_BOUNDS};
use super::counters::CounterCell;
use super::session::SessionId;

pub(crate) use self::http::MetricsServer;

/// How often a worker publishes its endpoint snapshot while metrics are on.
pub(crate) const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// Sessions per worker the `/sessions` listing keeps: the highest by RTT and by loss.
pub(crate) const TOP_SESSIONS: usize = 64;

/// Counters summed over an endpoint's sessions: those that ended (kept with the endpoint, so
/// that with the shared IO model a close on any thread counts once), plus those alive at the
/// snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SessionTotals {
    pub packets_sent: u64,
    pub packets_lost: u64,
    pub retransmitted: u64,
    pub fec_parity_sent: u64,
    pub fec_recovered: u64,
}

impl SessionTotals {
    pub(crate) fn add(&mut self, s: &ricochet_proto::ConnectionStats) {
        self.packets_sent += s.packets_sent;
        self.packets_lost += s.packets_lost;
        self.retransmitted += s.segments_retransmitted;
        self.fec_parity_sent += s.fec.parity_sent;
        self.fec_recovered += s.fec.data_recovered;
    }
}

/// One session in the `/sessions` listing (the id is formatted by the endpoint's thread, not
/// the worker).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SessionRow {
    pub id: SessionId,
    pub addr: SocketAddr,
    pub rtt_us: u64,
    pub packets_sent: u64,
    pub packets_lost: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

impl SessionRow {
    fn loss(&self) -> f64 {
        self.packets_lost as f64 / self.packets_sent.max(1) as f64
    }
}

/// What a worker's service published last. With the shared IO model only the first thread
/// publishes the endpoint's figures (sessions, endpoint, totals, top); the others publish
/// only their own `bytes_out`, so that summing over workers counts each once.
#[derive(Debug, Clone, Default)]
pub(crate) struct ServiceSnapshot {
    /// Connected sessions.
    pub sessions: usize,
    pub endpoint: EndpointStats,
    pub totals: SessionTotals,
    pub bytes_out: u64,
    pub top: Vec<SessionRow>,
}

/// What one worker's service shares with the metrics endpoint.
#[derive(Debug)]
pub(crate) struct ServiceCell {
    pub snapshot: Mutex<ServiceSnapshot>,
    /// RTT samples of the worker's sessions.
    pub rtt: Hist<{ RTT_BOUNDS.len() }>,
}

impl Default for ServiceCell {
    fn default() -> Self {
        ServiceCell {
            snapshot: Mutex::new(ServiceSnapshot::default()),
            rtt: Hist::new(&RTT_BOUNDS),
        }
    }
}

impl ServiceCell {
    pub(crate) fn publish(&self, s: ServiceSnapshot) {
        *self.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }

    pub(crate) fn read(&self) -> ServiceSnapshot {
        self.snapshot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Keep the `TOP_SESSIONS` highest by RTT and the highest by loss of the rest (each worker's
/// list, in no order: the listing sorts). Two selections in place, not a sort.
pub(crate) fn keep_top(rows: &mut Vec<SessionRow>) {
    if rows.len() <= 2 * TOP_SESSIONS {
        return;
    }
    rows.select_nth_unstable_by_key(TOP_SESSIONS - 1, |r| std::cmp::Reverse(r.rtt_us));
    rows[TOP_SESSIONS..]
        .select_nth_unstable_by(TOP_SESSIONS - 1, |a, b| b.loss().total_cmp(&a.loss()));
    rows.truncate(2 * TOP_SESSIONS);
}

/// One worker's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkerHealth {
    /// Its loop turns (waits for work, or works less than the stall limit per turn).
    Ok,
    /// One loop turn has been working this long, past the stall limit: a handler (or the
    /// game's code it calls) holds the worker.
    Stalled(Duration),
    /// Its thread ended (a panicking handler, a socket error).
    Ended,
}

/// The server's health: each worker's, and whether the server admits new clients.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// Each worker's state, by index.
    pub workers: Vec<WorkerHealth>,
    /// Bound, admitting new clients and every worker running (false while draining or
    /// stopping, and once a worker has ended).
    pub ready: bool,
}

impl Health {
    /// True when every worker is [`WorkerHealth::Ok`].
    pub fn is_healthy(&self) -> bool {
        self.workers.iter().all(|w| *w == WorkerHealth::Ok)
    }

    /// One line per worker that is not well ("worker 1: stalled for 1.2s"), empty if all are.
    pub fn problems(&self) -> Vec<String> {
        self.workers
            .iter()
            .enumerate()
            .filter_map(|(i, w)| match w {
                WorkerHealth::Ok => None,
                WorkerHealth::Stalled(d) => Some(format!("worker {i}: stalled for {d:.1?}")),
                WorkerHealth::Ended => Some(format!("worker {i}: ended")),
            })
            .collect()
    }
}

/// What the server handle and the metrics endpoint share.
#[derive(Debug)]
pub(crate) struct Ops {
    pub cells: Vec<Arc<CounterCell>>,
    pub cores: Vec<Option<usize>>,
    /// Per worker, when metrics are on.
    pub services: Vec<Arc<ServiceCell>>,
    pub stall_limit: Duration,
    /// Admitting new clients (cleared by a drain or a stop).
    pub admitting: AtomicBool,
    pub max_sessions: usize,
    pub limits: super::placement::SessionLimits,
}

impl Ops {
    pub(crate) fn health(&self) -> Health {
        let now = Instant::now();
        let workers: Vec<WorkerHealth> = self
            .cells
            .iter()
            .map(|c| {
                if c.has_ended() {
                    WorkerHealth::Ended
                } else {
                    match c.busy_for(now) {
                        Some(d) if d > self.stall_limit => WorkerHealth::Stalled(d),
                        _ => WorkerHealth::Ok,
                    }
                }
            })
            .collect();
        // A server with a worker that ended serves part of its players no more: not ready.
        let ready = self.admitting.load(Ordering::Relaxed)
            && !workers.iter().any(|w| matches!(w, WorkerHealth::Ended));
        Health { workers, ready }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ricochet_proto::ConnectionHandle;

    /// The selection keeps what a full sort kept: the 64 highest RTTs, then the 64 highest
    /// loss shares of the rest.
    #[test]
    fn keep_top_keeps_the_highest_rtt_then_the_highest_loss() {
        // Distinct RTTs and losses in scrambled orders (multiplications modulo a prime).
        let rows: Vec<SessionRow> = (0..1000u64)
            .map(|i| SessionRow {
                id: SessionId {
                    worker: 0,
                    handle: ConnectionHandle(i),
                },
                addr: SocketAddr::from(([127, 0, 0, 1], 1)),
                rtt_us: (i * 389) % 1009,
                packets_sent: 10_000,
                packets_lost: (i * 577) % 1013,
                bytes_sent: 0,
                bytes_received: 0,
            })
            .collect();
        let mut sorted = rows.clone();
        sorted.sort_by_key(|r| std::cmp::Reverse(r.rtt_us));
        let mut rest = sorted.split_off(TOP_SESSIONS);
        rest.sort_by_key(|r| std::cmp::Reverse(r.packets_lost));
        rest.truncate(TOP_SESSIONS);
        sorted.extend(rest);
        let mut want: Vec<u64> = sorted.iter().map(|r| r.id.handle.0).collect();
        let mut kept = rows;
        keep_top(&mut kept);
        let mut got: Vec<u64> = kept.iter().map(|r| r.id.handle.0).collect();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got.len(), 2 * TOP_SESSIONS);
        assert_eq!(got, want);
    }
}
