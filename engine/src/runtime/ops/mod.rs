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

use ricochet_proto::{ConnectionHandle, EndpointStats};

use self::hist::{Hist, RTT_BOUNDS};
use super::counters::CounterCell;
use super::session::SessionId;

pub(crate) use self::http::MetricsServer;

/// How often a worker publishes its endpoint snapshot while metrics are on.
pub(crate) const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// Sessions per worker the `/sessions` listing keeps: the highest by RTT and by loss.
pub(crate) const TOP_SESSIONS: usize = 64;

/// Sessions a publishing walk visits per loop turn. A walk of every session at once held the
/// worker for milliseconds with thousands of sessions (each visit reads a connection's
/// counters from memory that is rarely in cache); a few dozen per turn cost tens of µs.
pub(crate) const WALK_PER_TURN: usize = 64;

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

    /// `self + plus - minus`, field by field (never below zero).
    fn plus_minus(self, plus: &SessionTotals, minus: &SessionTotals) -> SessionTotals {
        let f = |a: u64, p: u64, m: u64| (a + p).saturating_sub(m);
        SessionTotals {
            packets_sent: f(self.packets_sent, plus.packets_sent, minus.packets_sent),
            packets_lost: f(self.packets_lost, plus.packets_lost, minus.packets_lost),
            retransmitted: f(self.retransmitted, plus.retransmitted, minus.retransmitted),
            fec_parity_sent: f(
                self.fec_parity_sent,
                plus.fec_parity_sent,
                minus.fec_parity_sent,
            ),
            fec_recovered: f(self.fec_recovered, plus.fec_recovered, minus.fec_recovered),
        }
    }
}

/// A walk over an endpoint's sessions for its snapshot (totals and top rows), spread over
/// loop turns, [`WALK_PER_TURN`] sessions each, so that no turn holds the worker long.
///
/// Totals count each session once and never go down although sessions open and end
/// mid-walk: the walk visits the sessions connected at its start (sorted, so that "visited"
/// is a prefix); its totals are the ended sessions' (as they stand at the walk's end) plus
/// what each visited session had when visited, less the final counters of visited sessions
/// that ended during the walk (those are in the ended sessions' already). So a session counts
/// as it stood at its visit, or at its end if that came first; one that opens mid-walk counts
/// from its end or the next walk on. Each walk starts from the ended sessions' totals, which
/// hold every ended session's final counters, so the next walk never counts less.
#[derive(Debug, Default)]
pub(crate) struct PublishWalk {
    /// The sessions at the walk's start, sorted; `handles[..cursor]` are visited.
    handles: Vec<ConnectionHandle>,
    cursor: usize,
    active: bool,
    visited: SessionTotals,
    /// Final counters of visited sessions that ended during the walk.
    ended_visited: SessionTotals,
    top: Vec<SessionRow>,
}

impl PublishWalk {
    /// Starts a walk over `sessions` (reusing the last walk's room).
    pub(crate) fn start(&mut self, sessions: impl Iterator<Item = ConnectionHandle>) {
        self.handles.clear();
        self.handles.extend(sessions);
        self.handles.sort_unstable();
        self.cursor = 0;
        self.active = true;
        self.visited = SessionTotals::default();
        self.ended_visited = SessionTotals::default();
        self.top.clear();
    }

    /// A walk is under way (started and not finished).
    pub(crate) fn is_active(&self) -> bool {
        self.active
    }

    /// Visits up to `n` more sessions; `look` gives a session's counters and row, or `None`
    /// when it has ended. True when every session has been visited.
    pub(crate) fn step(
        &mut self,
        n: usize,
        mut look: impl FnMut(ConnectionHandle) -> Option<(ricochet_proto::ConnectionStats, SessionRow)>,
    ) -> bool {
        let end = (self.cursor + n).min(self.handles.len());
        while self.cursor < end {
            let h = self.handles[self.cursor];
            self.cursor += 1;
            if let Some((stats, row)) = look(h) {
                self.visited.add(&stats);
                self.top.push(row);
                if self.top.len() >= 4 * TOP_SESSIONS {
                    keep_top(&mut self.top);
                }
            }
        }
        self.cursor == self.handles.len()
    }

    /// A session ended with these final counters (call for every session that ends, after
    /// adding them to the ended sessions' totals).
    pub(crate) fn on_ended(&mut self, h: ConnectionHandle, s: &ricochet_proto::ConnectionStats) {
        if self.active && self.handles[..self.cursor].binary_search(&h).is_ok() {
            self.ended_visited.add(s);
        }
    }

    /// Ends the walk: the totals, given the ended sessions' totals as they stand now, and the
    /// top rows (the walk keeps its room for the next one).
    pub(crate) fn finish(&mut self, ended: SessionTotals) -> (SessionTotals, Vec<SessionRow>) {
        self.active = false;
        keep_top(&mut self.top);
        let totals = ended.plus_minus(&self.visited, &self.ended_visited);
        (totals, self.top.drain(..).collect())
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

    fn stats(sent: u64, lost: u64) -> ricochet_proto::ConnectionStats {
        let mut s = ricochet_proto::ConnectionStats::default();
        s.packets_sent = sent;
        s.packets_lost = lost;
        s
    }

    fn row(h: u64, lost: u64) -> SessionRow {
        SessionRow {
            id: SessionId {
                worker: 0,
                handle: ConnectionHandle(h),
            },
            addr: SocketAddr::from(([127, 0, 0, 1], 1)),
            rtt_us: h,
            packets_sent: 100,
            packets_lost: lost,
            bytes_sent: 0,
            bytes_received: 0,
        }
    }

    /// A walk spread over turns while sessions end and open: it counts each session once, as
    /// it stood when visited (or when it ended, if before its visit), lists each once, and
    /// the next walk's totals take up what grew since.
    #[test]
    fn a_walk_over_turns_counts_each_session_once() {
        // Sessions 0..10, each having sent 100 packets; 50 sent by sessions ended earlier.
        let mut alive: std::collections::BTreeMap<u64, u64> = (0..10).map(|h| (h, 100)).collect();
        let mut ended = SessionTotals {
            packets_sent: 50,
            ..SessionTotals::default()
        };
        let mut walk = PublishWalk::default();
        walk.start(alive.keys().map(|h| ConnectionHandle(*h)));
        let look = |alive: &std::collections::BTreeMap<u64, u64>, h: ConnectionHandle| {
            alive.get(&h.0).map(|sent| (stats(*sent, 1), row(h.0, 1)))
        };
        assert!(!walk.step(4, |h| look(&alive, h)));
        // Session 2 (visited) sends 30 more and ends; session 7 (not visited yet) sends 5
        // more and ends; session 20 opens and ends within the walk; session 3 (visited)
        // sends 8 more and stays.
        for (h, more) in [(2u64, 30u64), (7, 5)] {
            let fin = stats(alive[&h] + more, 1);
            alive.remove(&h);
            ended.add(&fin);
            walk.on_ended(ConnectionHandle(h), &fin);
        }
        let fin = stats(9, 0);
        ended.add(&fin);
        walk.on_ended(ConnectionHandle(20), &fin);
        *alive.get_mut(&3).unwrap() += 8;
        assert!(walk.is_active());
        assert!(!walk.step(4, |h| look(&alive, h)));
        assert!(walk.step(4, |h| look(&alive, h)));
        let (totals, top) = walk.finish(ended);
        assert!(!walk.is_active());
        // Ended before the walk 50, session 7 at its end 105, session 20 at its end 9; the
        // nine visited as visited, 100 each (session 2's 30 and session 3's 8 came after).
        assert_eq!(totals.packets_sent, 50 + 105 + 9 + 900);
        let mut listed: Vec<u64> = top.iter().map(|r| r.id.handle.0).collect();
        listed.sort_unstable();
        assert_eq!(listed, vec![0, 1, 2, 3, 4, 5, 6, 8, 9]);
        // The next walk sees session 3's growth; the totals only grow.
        walk.start(alive.keys().map(|h| ConnectionHandle(*h)));
        while !walk.step(3, |h| look(&alive, h)) {}
        let (next, _) = walk.finish(ended);
        assert_eq!(next.packets_sent, totals.packets_sent + 30 + 8);
    }

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
