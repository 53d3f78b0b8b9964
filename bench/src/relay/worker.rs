//! The relay thread: sockets, routes, the timed loop.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use ricochet_platform::SocketConfig;
use ricochet_testkit::{Direction, ImpairedLink, ImpairedQueue, Impairment};

use super::bottleneck::{Bottleneck, BottleneckConfig};
use super::config::RelayConfig;
use super::counters::{DirectionCounters, Lateness, RelayCounters, RelayErrors, RouteCounters};
use super::queue_series::QueueSeries;
use super::shared::Shared;
use super::sys::{self, PollFd, POLLIN, POLLOUT};

/// Longest sleep without a due copy, so a lost wake-up delays a stop or snapshot at most this.
const IDLE_WAIT: Duration = Duration::from_millis(50);
/// Datagrams read from one socket per turn before due copies are released again: bounds how
/// long a flood on one socket can hold up timed sends.
const RECV_BURST: usize = 32;
/// Receive buffer: the largest UDP payload fits, so nothing is truncated.
const MAX_DATAGRAM: usize = 65_536;
/// Lateness histogram range: 1 ns to 60 s, 2 significant digits.
const LATENESS_MAX_NS: u64 = 60_000_000_000;

/// Binds a non-blocking UDP socket at `addr` with `buffer`-byte receive and send buffers.
pub(super) fn bind_udp(addr: SocketAddr, buffer: usize) -> anyhow::Result<UdpSocket> {
    let mut cfg = SocketConfig::new(addr);
    cfg.recv_buffer = Some(buffer);
    cfg.send_buffer = Some(buffer);
    cfg.count_drops = false;
    let bound = ricochet_platform::bind(&cfg).with_context(|| format!("bind {addr}"))?;
    let (socket, _info) = bound.into_parts();
    Ok(socket.into())
}

/// One direction of one route.
#[derive(Debug)]
struct Dir {
    /// This direction's own bottleneck, before the impairment.
    neck: Option<Bottleneck<Vec<u8>>>,
    queue: ImpairedQueue<Vec<u8>>,
    /// A due copy the socket had no room for (with its due time); it goes out before anything
    /// else in this direction, so order is kept.
    blocked: Option<(Instant, Vec<u8>)>,
    sent: u64,
    sent_bytes: u64,
    send_errors: u64,
}

impl Dir {
    fn new(
        imp: &Impairment,
        neck: Option<(&BottleneckConfig, Instant)>,
        seed: u64,
        route: u64,
        dir: Direction,
    ) -> anyhow::Result<Self> {
        let link = ImpairedLink::new(imp.clone(), seed, route, dir)?;
        Ok(Self {
            neck: neck
                .map(|(cfg, start)| Bottleneck::new(cfg.clone(), start))
                .transpose()?,
            queue: ImpairedQueue::new(link),
            blocked: None,
            sent: 0,
            sent_bytes: 0,
            send_errors: 0,
        })
    }

    /// When this direction next needs the clock (a blocked copy waits for `POLLOUT` instead).
    fn next_due(&self) -> Option<Instant> {
        let neck = self.neck.as_ref().and_then(Bottleneck::next_departure);
        let queue = if self.blocked.is_some() {
            None
        } else {
            self.queue.next_due()
        };
        neck.into_iter().chain(queue).min()
    }

    /// A datagram received at `now`: into the bottleneck if there is one, else the impairment.
    fn offer(&mut self, now: Instant, data: Vec<u8>) {
        match &mut self.neck {
            Some(neck) => {
                neck.offer(now, data.len(), data);
            }
            None => {
                self.queue.push(now, data.len(), data);
            }
        }
    }

    /// Moves what left the bottleneck by `now` into the impairment, at its departure time.
    fn drain_neck(&mut self, now: Instant) {
        if let Some(neck) = &mut self.neck {
            while let Some((at, data)) = neck.pop_departed(now) {
                self.queue.push(at, data.len(), data);
            }
        }
    }

    fn counters(&self, now: Instant) -> DirectionCounters {
        let mut c = DirectionCounters::new(
            self.queue.counters(),
            self.sent,
            self.sent_bytes,
            self.send_errors,
        );
        c.bottleneck = self.neck.as_ref().map(|n| n.counters(now));
        c
    }

    /// Sends the blocked copy and then every copy due at `now`, until the socket is full.
    fn release(
        &mut self,
        now: Instant,
        errors: &mut RelayErrors,
        lateness: &mut Histogram<u64>,
        mut send: impl FnMut(&[u8]) -> io::Result<usize>,
    ) {
        let mut next = self.blocked.take();
        loop {
            let Some((due, data)) = next.or_else(|| self.queue.pop_due(now)) else {
                return;
            };
            match send(&data) {
                Ok(_) => {
                    let late = Instant::now().saturating_duration_since(due);
                    lateness.saturating_record(u64::try_from(late.as_nanos()).unwrap_or(u64::MAX));
                    self.sent += 1;
                    self.sent_bytes += data.len() as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    errors.send_would_block += 1;
                    self.blocked = Some((due, data));
                    return;
                }
                Err(e) => {
                    tracing::debug!("relay send failed: {e}");
                    errors.send_errors += 1;
                    self.send_errors += 1;
                }
            }
            next = None;
        }
    }
}

/// One client: its address, its upstream socket, both directions.
#[derive(Debug)]
struct Route {
    id: u64,
    client: SocketAddr,
    upstream: UdpSocket,
    upstream_addr: SocketAddr,
    up: Dir,
    down: Dir,
}

/// The relay thread's state.
#[derive(Debug)]
pub(super) struct Worker {
    cfg: RelayConfig,
    front: UdpSocket,
    control: UdpSocket,
    shared: Arc<Shared>,
    upstream_ip: IpAddr,
    /// Upstream sockets bound at start, not yet given to a route.
    spare: VecDeque<(UdpSocket, SocketAddr)>,
    routes: Vec<Route>,
    by_client: HashMap<SocketAddr, usize>,
    /// The bottlenecks all routes share (client to server, server to client), holding each
    /// datagram with its route's index.
    shared_up: Option<Bottleneck<(usize, Vec<u8>)>>,
    shared_down: Option<Bottleneck<(usize, Vec<u8>)>>,
    errors: RelayErrors,
    lateness: Histogram<u64>,
    started: Instant,
    /// The last snapshot request answered.
    answered: u64,
    /// Turns of [`Self::receive_upstreams`], which route it reads first.
    rotation: usize,
}

impl Worker {
    pub(super) fn new(
        cfg: RelayConfig,
        front: UdpSocket,
        control: UdpSocket,
        shared: Arc<Shared>,
    ) -> anyhow::Result<Self> {
        let listen = cfg.listen.ip();
        let server = cfg.server.ip();
        // Keep the front door's IP for upstream sockets when it can reach the server.
        let upstream_ip = if listen.is_ipv4() == server.is_ipv4()
            && listen.is_loopback() == server.is_loopback()
        {
            listen
        } else if server.is_ipv4() {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        } else {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        };
        let started = Instant::now();
        let shared_neck = |c: &Option<BottleneckConfig>| {
            c.as_ref()
                .filter(|_| cfg.shared_bottleneck)
                .map(|c| Bottleneck::new(c.clone(), started))
                .transpose()
        };
        let shared_up = shared_neck(&cfg.up_bottleneck)?;
        let shared_down = shared_neck(&cfg.down_bottleneck)?;
        let mut w = Self {
            shared_up,
            shared_down,
            spare: VecDeque::with_capacity(cfg.clients),
            routes: Vec::with_capacity(cfg.clients),
            by_client: HashMap::with_capacity(cfg.clients),
            cfg,
            front,
            control,
            shared,
            upstream_ip,
            errors: RelayErrors::default(),
            lateness: Histogram::new_with_bounds(1, LATENESS_MAX_NS, 2)
                .context("lateness histogram")?,
            started,
            answered: 0,
            rotation: 0,
        };
        for _ in 0..w.cfg.clients {
            let s = w.bind_upstream()?;
            w.spare.push_back(s);
        }
        Ok(w)
    }

    fn bind_upstream(&self) -> anyhow::Result<(UdpSocket, SocketAddr)> {
        let s = bind_udp(SocketAddr::new(self.upstream_ip, 0), self.cfg.socket_buffer)
            .context("relay upstream socket")?;
        // Connected: the kernel delivers only the server's datagrams, and sends need no address.
        s.connect(self.cfg.server)
            .with_context(|| format!("connect upstream socket to {}", self.cfg.server))?;
        let addr = s.local_addr()?;
        Ok((s, addr))
    }

    /// Runs until stopped, then publishes the final counters (and the error, if one ended it).
    pub(super) fn run(mut self) {
        sys::minimize_timer_slack();
        if let Some(nice) = self.cfg.nice {
            if let Err(e) = sys::set_thread_nice(nice) {
                tracing::warn!("relay: could not set the thread's nice value to {nice}: {e}");
            }
        }
        let result = self.serve();
        let counters = self.snapshot();
        if let Err(e) = &result {
            tracing::error!("relay stopped: {e:#}");
            self.shared.lock().error = Some(format!("{e:#}"));
        }
        let generation = self.shared.requested.load(Ordering::SeqCst);
        self.shared.publish(generation, counters, true);
    }

    fn serve(&mut self) -> anyhow::Result<()> {
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let mut fds: Vec<PollFd> = Vec::new();
        let mut ready: Vec<usize> = Vec::new();
        loop {
            if self.shared.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            self.answer_snapshot_request();
            self.release_due(Instant::now());

            let shared = [&self.shared_up, &self.shared_down]
                .into_iter()
                .flat_map(|n| n.as_ref().and_then(Bottleneck::next_departure));
            let next_due = self
                .routes
                .iter()
                .flat_map(|r| [r.up.next_due(), r.down.next_due()])
                .flatten()
                .chain(shared)
                .min();
            let timeout = next_due.map_or(IDLE_WAIT, |due| {
                due.saturating_duration_since(Instant::now())
                    .saturating_sub(self.cfg.spin)
                    .min(IDLE_WAIT)
            });

            fds.clear();
            fds.push(sys::poll_fd(self.control.as_raw_fd(), POLLIN));
            let front_blocked = self.routes.iter().any(|r| r.down.blocked.is_some());
            fds.push(sys::poll_fd(
                self.front.as_raw_fd(),
                POLLIN | if front_blocked { POLLOUT } else { 0 },
            ));
            for r in &self.routes {
                let out = if r.up.blocked.is_some() { POLLOUT } else { 0 };
                fds.push(sys::poll_fd(r.upstream.as_raw_fd(), POLLIN | out));
            }
            if sys::wait(&mut fds, Some(timeout)).context("relay poll")? == 0 {
                continue;
            }
            // Readable, or an error to collect (POLLERR): the receive reports and clears it.
            let readable = |fd: &PollFd| fd.revents & !POLLOUT != 0;
            if readable(&fds[0]) {
                self.drain_control(&mut buf);
            }
            if readable(&fds[1]) {
                self.receive_front(&mut buf)?;
            }
            ready.clear();
            ready.extend(
                fds[2..]
                    .iter()
                    .enumerate()
                    .filter(|(_, fd)| readable(fd))
                    .map(|(i, _)| i),
            );
            self.receive_upstreams(&mut ready, &mut buf);
        }
    }

    fn drain_control(&mut self, buf: &mut [u8]) {
        for _ in 0..RECV_BURST {
            if self.control.recv(buf).is_err() {
                break;
            }
        }
    }

    fn answer_snapshot_request(&mut self) {
        let requested = self.shared.requested.load(Ordering::SeqCst);
        if requested > self.answered {
            self.answered = requested;
            let counters = self.snapshot();
            self.shared.publish(requested, counters, false);
        }
    }

    fn release_due(&mut self, now: Instant) {
        if let Some(neck) = &mut self.shared_up {
            while let Some((at, (i, data))) = neck.pop_departed(now) {
                if let Some(r) = self.routes.get_mut(i) {
                    r.up.queue.push(at, data.len(), data);
                }
            }
        }
        if let Some(neck) = &mut self.shared_down {
            while let Some((at, (i, data))) = neck.pop_departed(now) {
                if let Some(r) = self.routes.get_mut(i) {
                    r.down.queue.push(at, data.len(), data);
                }
            }
        }
        let front = &self.front;
        for r in &mut self.routes {
            r.up.drain_neck(now);
            r.down.drain_neck(now);
            let upstream = &r.upstream;
            r.up.release(now, &mut self.errors, &mut self.lateness, |d| {
                upstream.send(d)
            });
            let client = r.client;
            r.down
                .release(now, &mut self.errors, &mut self.lateness, |d| {
                    front.send_to(d, client)
                });
        }
    }

    fn receive_front(&mut self, buf: &mut [u8]) -> anyhow::Result<()> {
        for _ in 0..RECV_BURST {
            match self.front.recv_from(buf) {
                Ok((n, from)) => {
                    let now = Instant::now();
                    if let Some(i) = self.route_for(from)? {
                        let data = buf[..n].to_vec();
                        match &mut self.shared_up {
                            Some(neck) => {
                                neck.offer(now, n, (i, data));
                            }
                            None => self.routes[i].up.offer(now, data),
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::debug!("relay front receive failed: {e}");
                    self.errors.recv_errors += 1;
                    break;
                }
            }
        }
        Ok(())
    }

    /// Reads the ready upstream sockets (route indices `ready`) one datagram each in turn,
    /// starting one route further every call, until each would block or gave `RECV_BURST`.
    /// Interleaving keeps a shared bottleneck's arrival order close to the server's send
    /// order: reading each socket to the end in index order would put the first routes'
    /// datagrams ahead of the others' every turn and give them the room of a full queue.
    fn receive_upstreams(&mut self, ready: &mut Vec<usize>, buf: &mut [u8]) {
        if ready.is_empty() {
            return;
        }
        self.rotation = self.rotation.wrapping_add(1);
        let k = self.rotation % ready.len();
        ready.rotate_left(k);
        for _ in 0..RECV_BURST {
            ready.retain(|&i| self.receive_upstream(i, buf));
            if ready.is_empty() {
                break;
            }
        }
    }

    /// Reads one datagram from route `i`'s upstream socket; false when there was none (or the
    /// receive failed).
    fn receive_upstream(&mut self, i: usize, buf: &mut [u8]) -> bool {
        let Some(r) = self.routes.get_mut(i) else {
            return false;
        };
        match r.upstream.recv(buf) {
            Ok(n) => {
                let now = Instant::now();
                let data = buf[..n].to_vec();
                match &mut self.shared_down {
                    Some(neck) => {
                        neck.offer(now, n, (i, data));
                    }
                    None => r.down.offer(now, data),
                }
                true
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
            Err(e) => {
                // E.g. ECONNREFUSED after an ICMP port unreachable from a stopped server.
                tracing::debug!("relay upstream receive failed (route {}): {e}", r.id);
                self.errors.recv_errors += 1;
                false
            }
        }
    }

    /// The route of client `from`, created on its first datagram; `None` (counted) when the
    /// route limit is reached or no upstream socket could be bound.
    fn route_for(&mut self, from: SocketAddr) -> anyhow::Result<Option<usize>> {
        if let Some(&i) = self.by_client.get(&from) {
            return Ok(Some(i));
        }
        if self.routes.len() >= self.cfg.max_routes {
            self.errors.route_limit += 1;
            return Ok(None);
        }
        let (upstream, upstream_addr) = match self.spare.pop_front() {
            Some(s) => s,
            None => match self.bind_upstream() {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("relay: no upstream socket for client {from}: {e:#}");
                    self.errors.bind_errors += 1;
                    return Ok(None);
                }
            },
        };
        let id = self.routes.len() as u64;
        let seed = self.cfg.seed;
        // A route's own bottleneck, unless all routes share one; its schedule runs from the
        // relay's start, like a shared one's.
        let (shared, started) = (self.cfg.shared_bottleneck, self.started);
        fn own(
            c: &Option<BottleneckConfig>,
            shared: bool,
            started: Instant,
        ) -> Option<(&BottleneckConfig, Instant)> {
            c.as_ref().filter(|_| !shared).map(|c| (c, started))
        }
        let route = Route {
            id,
            client: from,
            upstream,
            upstream_addr,
            up: Dir::new(
                &self.cfg.up,
                own(&self.cfg.up_bottleneck, shared, started),
                seed,
                id,
                Direction::Forward,
            )?,
            down: Dir::new(
                &self.cfg.down,
                own(&self.cfg.down_bottleneck, shared, started),
                seed,
                id,
                Direction::Backward,
            )?,
        };
        tracing::debug!("relay route {id}: client {from} via {upstream_addr}");
        self.routes.push(route);
        self.by_client.insert(from, self.routes.len() - 1);
        Ok(Some(self.routes.len() - 1))
    }

    fn snapshot(&self) -> RelayCounters {
        let now = Instant::now();
        let routes = self
            .routes
            .iter()
            .map(|r| RouteCounters {
                route: r.id,
                client: r.client,
                upstream: r.upstream_addr,
                up: r.up.counters(now),
                down: r.down.counters(now),
            })
            .collect();
        let h = &self.lateness;
        let mut c = RelayCounters::with_routes(routes);
        c.errors = self.errors;
        let front = sys::socket_drops(self.front.as_raw_fd());
        c.errors.socket_drops_available = front.is_some();
        c.errors.front_socket_drops = front.unwrap_or(0);
        c.errors.upstream_socket_drops = self
            .routes
            .iter()
            .filter_map(|r| sys::socket_drops(r.upstream.as_raw_fd()))
            .sum();
        c.lateness = Lateness {
            count: h.len(),
            p50_ns: h.value_at_quantile(0.5),
            p99_ns: h.value_at_quantile(0.99),
            p999_ns: h.value_at_quantile(0.999),
            max_ns: h.max(),
        };
        c.shared_up = self.shared_up.as_ref().map(|n| n.counters(now));
        c.shared_down = self.shared_down.as_ref().map(|n| n.counters(now));
        c.down_queue_series = match &self.shared_down {
            Some(n) => Some(n.queue_series().clone()),
            None => self
                .routes
                .iter()
                .filter_map(|r| r.down.neck.as_ref())
                .fold(None, |acc: Option<QueueSeries>, n| {
                    let mut s = acc.unwrap_or_default();
                    s.merge(n.queue_series());
                    Some(s)
                }),
        };
        c.thread_cpu_ns = sys::thread_cpu_ns();
        c.elapsed_ns = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        c
    }
}
