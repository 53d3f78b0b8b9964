//! The relay's counters as serializable snapshots (what `RelayHandle::counters` returns and the
//! bench JSON embeds).

use std::net::SocketAddr;

use ricochet_testkit::LinkCounters;

use super::bottleneck::BottleneckCounters;
use super::queue_series::QueueSeries;
use serde::Serialize;

/// Counters of one direction of one route (or, summed, of several).
///
/// The impairment fields come from the simulator's [`LinkCounters`] and keep its meaning:
/// `offered` = dropped (random + burst + overflow) + datagrams delivered at least once;
/// `forwarded` counts scheduled copies, duplicates included; `overflows` counts every copy a full
/// queue refused. The relay adds what happened at the socket: a forwarded copy is either `sent`,
/// counted in `send_errors`, or still held (`queue_datagrams`, plus at most one copy waiting for
/// the socket to become writable).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DirectionCounters {
    /// Datagrams the relay received for this direction.
    pub offered: u64,
    /// Bytes of the offered datagrams (UDP payload).
    pub offered_bytes: u64,
    /// Copies scheduled for delivery (originals and duplicates).
    pub forwarded: u64,
    /// Bytes of the scheduled copies.
    pub forwarded_bytes: u64,
    /// Copies the kernel accepted on the outgoing socket.
    pub sent: u64,
    /// Bytes of the sent copies.
    pub sent_bytes: u64,
    /// Copies whose send failed with an error other than "would block" (dropped).
    pub send_errors: u64,
    /// Datagrams dropped by random loss.
    pub dropped_random: u64,
    /// Datagrams dropped by burst loss.
    pub dropped_burst: u64,
    /// Datagrams dropped because the route's queue was full.
    pub dropped_overflow: u64,
    /// Duplicates scheduled.
    pub duplicated: u64,
    /// Copies given the extra reordering delay.
    pub delayed: u64,
    /// Copies (originals or duplicates) refused by a full queue.
    pub overflows: u64,
    /// Bytes held in the queue at the snapshot.
    pub queue_bytes: u64,
    /// Datagrams held in the queue at the snapshot.
    pub queue_datagrams: u64,
    /// Highest `queue_bytes` seen.
    pub queue_peak_bytes: u64,
    /// Highest `queue_datagrams` seen.
    pub queue_peak_datagrams: u64,
    /// This route direction's own bottleneck (rate limit and drop-tail queue), if it has one;
    /// a bottleneck all routes share is in [`RelayCounters::shared_up`] / `shared_down`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bottleneck: Option<BottleneckCounters>,
}

impl DirectionCounters {
    /// The impairment counters of `link` plus the relay's send outcome.
    pub(crate) fn new(link: &LinkCounters, sent: u64, sent_bytes: u64, send_errors: u64) -> Self {
        Self {
            offered: link.offered,
            offered_bytes: link.offered_bytes,
            forwarded: link.forwarded,
            forwarded_bytes: link.forwarded_bytes,
            sent,
            sent_bytes,
            send_errors,
            dropped_random: link.dropped_random,
            dropped_burst: link.dropped_burst,
            dropped_overflow: link.dropped_overflow,
            duplicated: link.duplicated,
            delayed: link.delayed,
            overflows: link.overflows,
            queue_bytes: link.queue_bytes,
            queue_datagrams: link.queue_datagrams,
            queue_peak_bytes: link.queue_peak_bytes,
            queue_peak_datagrams: link.queue_peak_datagrams,
            bottleneck: None,
        }
    }

    /// Datagrams dropped for any cause (random, burst, overflow).
    pub fn dropped(&self) -> u64 {
        self.dropped_random + self.dropped_burst + self.dropped_overflow
    }

    /// Share of offered datagrams that were dropped (0 when nothing was offered).
    pub fn realized_loss(&self) -> f64 {
        ratio(self.dropped(), self.offered)
    }

    /// Adds `other` into `self`; peaks are summed (they may come from different moments).
    pub fn merge(&mut self, other: &DirectionCounters) {
        self.offered += other.offered;
        self.offered_bytes += other.offered_bytes;
        self.forwarded += other.forwarded;
        self.forwarded_bytes += other.forwarded_bytes;
        self.sent += other.sent;
        self.sent_bytes += other.sent_bytes;
        self.send_errors += other.send_errors;
        self.dropped_random += other.dropped_random;
        self.dropped_burst += other.dropped_burst;
        self.dropped_overflow += other.dropped_overflow;
        self.duplicated += other.duplicated;
        self.delayed += other.delayed;
        self.overflows += other.overflows;
        self.queue_bytes += other.queue_bytes;
        self.queue_datagrams += other.queue_datagrams;
        self.queue_peak_bytes += other.queue_peak_bytes;
        self.queue_peak_datagrams += other.queue_peak_datagrams;
        if let Some(o) = &other.bottleneck {
            self.bottleneck
                .get_or_insert_with(Default::default)
                .merge(o);
        }
    }
}

fn ratio(num: u64, den: u64) -> f64 {
    if den == 0 {
        0.0
    } else {
        num as f64 / den as f64
    }
}

/// One route: one client address, the relay socket the server sees it as, both directions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RouteCounters {
    /// Route id: routes are numbered from 0 in the order their client's first datagram arrived.
    /// Together with the seed and the direction it keys the route's impairment RNG streams.
    pub route: u64,
    /// The client's address (where the relay sends the server's replies).
    pub client: SocketAddr,
    /// The route's upstream socket address: the source address the server sees for this client.
    pub upstream: SocketAddr,
    /// Client to server.
    pub up: DirectionCounters,
    /// Server to client.
    pub down: DirectionCounters,
}

impl RouteCounters {
    /// This route's queue peaks: the sum of its two directions' peaks.
    pub fn peaks(&self) -> RoutePeaks {
        RoutePeaks {
            bytes: self.up.queue_peak_bytes + self.down.queue_peak_bytes,
            datagrams: self.up.queue_peak_datagrams + self.down.queue_peak_datagrams,
        }
    }
}

/// Queue high-water marks, summed over routes and directions like the reference's "relay route
/// peaks sum": the individual peaks may have occurred at different moments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RoutePeaks {
    /// Sum of the peak bytes held.
    pub bytes: u64,
    /// Sum of the peak datagrams held.
    pub datagrams: u64,
}

/// Failures of the relay itself (not impairments).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RelayErrors {
    /// Receive calls that failed with an error other than "would block" (e.g. `ECONNREFUSED`
    /// reported on an upstream socket after the server's port was closed).
    pub recv_errors: u64,
    /// Sends that failed with an error other than "would block"; the copy was dropped.
    pub send_errors: u64,
    /// Times a send found the socket buffer full; the copy waited for the socket to drain.
    pub send_would_block: u64,
    /// Datagrams from new clients refused because the route limit was reached.
    pub route_limit: u64,
    /// Upstream sockets that could not be bound for a new client (its datagram was dropped).
    pub bind_errors: u64,
    /// Datagrams the kernel dropped at the front socket (client to server) because the relay
    /// did not read them in time: loss outside the impairment model, invisible in `offered`.
    pub front_socket_drops: u64,
    /// Datagrams the kernel dropped at the upstream sockets (server to client), likewise.
    pub upstream_socket_drops: u64,
    /// The socket drop counts above were read (Linux); elsewhere they stay 0.
    pub socket_drops_available: bool,
}

impl RelayErrors {
    /// Whether anything went wrong (would-block stalls are not errors: nothing was lost).
    pub fn any(&self) -> bool {
        self.recv_errors
            + self.send_errors
            + self.route_limit
            + self.bind_errors
            + self.front_socket_drops
            + self.upstream_socket_drops
            > 0
    }
}

/// How late the relay sent copies relative to their due time, in nanoseconds.
///
/// Measured by the relay thread right after each successful send; a copy is never sent before
/// it is due, so every sample is `>= 0`. It excludes the loopback hops on either side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Lateness {
    /// Copies measured.
    pub count: u64,
    /// Median lateness.
    pub p50_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Largest lateness.
    pub max_ns: u64,
}

/// A snapshot of every relay counter.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RelayCounters {
    /// Per route, in route-id order.
    pub routes: Vec<RouteCounters>,
    /// All routes' client-to-server directions summed.
    pub up: DirectionCounters,
    /// All routes' server-to-client directions summed.
    pub down: DirectionCounters,
    /// Summed route queue peaks (both directions).
    pub route_peaks: RoutePeaks,
    /// Dropped / offered over both directions of every route.
    pub realized_loss: f64,
    /// Relay failures.
    pub errors: RelayErrors,
    /// Send lateness relative to due times.
    pub lateness: Lateness,
    /// CPU time the relay thread used so far, in nanoseconds (0 where the OS has no per-thread
    /// clock).
    pub thread_cpu_ns: u64,
    /// Wall time since the relay started, in nanoseconds.
    pub elapsed_ns: u64,
    /// The bottleneck every route's client-to-server direction shares, if configured so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_up: Option<BottleneckCounters>,
    /// The bottleneck every route's server-to-client direction shares (a server's uplink), if
    /// configured so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_down: Option<BottleneckCounters>,
    /// The server-to-client bottlenecks' queue delay over time (the shared one, or every
    /// route's own merged), if there are any. Not in the JSON of the runs that embed these
    /// counters; `bench lanes` writes its own series.
    #[serde(skip)]
    pub down_queue_series: Option<QueueSeries>,
}

impl RelayCounters {
    /// Builds the totals (`up`, `down`, `route_peaks`, `realized_loss`) from `routes`.
    pub(crate) fn with_routes(routes: Vec<RouteCounters>) -> Self {
        let mut up = DirectionCounters::default();
        let mut down = DirectionCounters::default();
        let mut route_peaks = RoutePeaks::default();
        for r in &routes {
            up.merge(&r.up);
            down.merge(&r.down);
            let p = r.peaks();
            route_peaks.bytes += p.bytes;
            route_peaks.datagrams += p.datagrams;
        }
        let realized_loss = ratio(up.dropped() + down.dropped(), up.offered + down.offered);
        Self {
            routes,
            up,
            down,
            route_peaks,
            realized_loss,
            ..Self::default()
        }
    }

    /// Both directions of every route summed.
    pub fn total(&self) -> DirectionCounters {
        let mut t = self.up;
        t.merge(&self.down);
        t
    }

    /// Whether every forwarded copy has left the relay (sent or failed): nothing is queued.
    pub fn drained(&self) -> bool {
        let t = self.total();
        t.sent + t.send_errors == t.forwarded
    }

    /// Share of the relay thread's time spent on the CPU since it started (1.0 = one core busy).
    pub fn thread_utilization(&self) -> f64 {
        if self.elapsed_ns == 0 {
            0.0
        } else {
            self.thread_cpu_ns as f64 / self.elapsed_ns as f64
        }
    }
}
