//! Which worker owns a session, in a multi-worker server: the [`Router`] each worker's endpoint
//! uses, the shared session counts that place new sessions, and reading the owner back from a
//! datagram (for the socket filter's rules and for forwarding what it could not steer).
//!
//! A worker's connection ids carry its index: bit 8 of the id's upper 32 bits set, the index in
//! their low byte (wire bytes [`CID_TAGGED_OFFSET`] and [`CID_WORKER_OFFSET`] of a connection
//! packet). A challenge's cookie names the least-loaded worker as its route: flag byte
//! [`ROUTE_PLACED`] then the worker index, at [`wire::ECHO_ROUTE_OFFSET`] of the echo.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use ricochet_platform as platform;
use ricochet_proto::wire::{self, PacketType};
use ricochet_proto::{CloseReason, ConnectionId, ListenConfig, Router, SessionCounts};

/// Offset in a connection packet of the byte whose bit 0 says the destination cid carries its
/// owner worker's index (bit 8 of the cid's upper half).
pub(crate) const CID_TAGGED_OFFSET: usize = wire::CID_OFFSET + 2;
/// Offset in a connection packet of the owner worker's index (the low byte of the cid's upper
/// half), when tagged.
pub(crate) const CID_WORKER_OFFSET: usize = wire::CID_OFFSET + 3;
/// The first byte of a placed route: the second names the worker.
const ROUTE_PLACED: u8 = 1;

/// Shared between the endpoints of one server's workers: how many sessions each holds, and
/// which should take the next one.
///
/// With a placement (see [`WorkerRouter`]) a server endpoint answers a client hello with
/// a challenge whose (MAC-protected) cookie names the least-loaded worker; the client's cookie
/// echo carries that name back (its route is [`ROUTE_PLACED`] then the worker), so the runtime can route the echo there, and
/// every later datagram by the owner's tag in the connection id. Sessions then spread evenly
/// whatever the clients' addresses and ports. Cheap to clone (reference-counted).
#[derive(Clone, Debug)]
pub(crate) struct Placement {
    sessions: Arc<[AtomicU32]>,
    /// Challenges that named the worker and whose echo has not opened a session yet.
    pending: Arc<[AtomicU32]>,
    next: Arc<AtomicU32>,
}

impl Placement {
    /// A placement over `workers` workers (1–256), none holding a session.
    pub(crate) fn new(workers: usize) -> Self {
        let workers = workers.clamp(1, 256);
        let counters = || (0..workers).map(|_| AtomicU32::new(0)).collect();
        Placement {
            sessions: counters(),
            pending: counters(),
            next: Arc::new(AtomicU32::new(0)),
        }
    }

    /// Number of workers.
    pub(crate) fn workers(&self) -> usize {
        self.sessions.len()
    }

    /// Sessions `worker` holds now (0 for a worker outside the placement).
    pub(crate) fn sessions(&self, worker: usize) -> u32 {
        self.sessions
            .get(worker)
            .map_or(0, |n| n.load(Ordering::Relaxed))
    }

    /// The worker that should take the next session: one of those with the fewest sessions
    /// plus handshakes in progress, taken in turn among equals, so clients that connect at
    /// once spread too. Counts the handshake as in progress on the worker picked.
    pub(crate) fn pick(&self) -> u8 {
        let n = self.sessions.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) as usize % n;
        let (mut best, mut least) = (start, u64::MAX);
        let mut fewest_pending = u32::MAX;
        for k in 0..n {
            let w = (start + k) % n;
            let pending = self.pending[w].load(Ordering::Relaxed);
            fewest_pending = fewest_pending.min(pending);
            let load = u64::from(self.sessions[w].load(Ordering::Relaxed)) + u64::from(pending);
            if load < least {
                least = load;
                best = w;
            }
        }
        // Handshakes that never finish (lost or spoofed hellos) leave their count behind; they
        // land evenly, so taking the common part off every worker keeps the counts bounded.
        if fewest_pending > 0 {
            for c in self.pending.iter() {
                let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                    Some(v.saturating_sub(fewest_pending))
                });
            }
        }
        self.pending[best].fetch_add(1, Ordering::Relaxed);
        // `new` caps the workers at 256.
        best as u8
    }

    fn opened(&self, worker: u8) {
        let w = usize::from(worker);
        if let (Some(n), Some(p)) = (self.sessions.get(w), self.pending.get(w)) {
            n.fetch_add(1, Ordering::Relaxed);
            let _ = p.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
        }
    }

    fn closed(&self, worker: u8) {
        if let Some(n) = self.sessions.get(usize::from(worker)) {
            let _ = n.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
        }
    }
}

/// The sessions a server holds, in total and per client IP, shared by its workers' routers so
/// that [`ListenConfig::max_sessions`] and [`ListenConfig::max_sessions_per_address`] hold per
/// server, not per worker. Touched once when a session opens and once when it ends, under a
/// lock (never on the datagram path).
#[derive(Clone, Debug, Default)]
pub(crate) struct SessionLimits(Arc<Mutex<SessionCounts>>);

impl SessionLimits {
    fn table(&self) -> std::sync::MutexGuard<'_, SessionCounts> {
        // Every update is a single step: a poisoned table is still consistent.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a session from `ip` if the limits allow it.
    pub(crate) fn admit(&self, ip: IpAddr, limits: &ListenConfig) -> Result<(), CloseReason> {
        self.table().admit(ip, limits)
    }

    /// A session from `ip` that [`SessionLimits::admit`] counted has ended.
    pub(crate) fn release(&self, ip: IpAddr) {
        self.table().release(ip);
    }

    /// Sessions counted now.
    pub(crate) fn sessions(&self) -> usize {
        self.table().sessions()
    }
}

/// The router of the one endpoint of a shared-model server: untagged connection ids (as
/// [`ricochet_proto::NoRouting`]) and the server's session count.
#[derive(Debug)]
pub(crate) struct CountingRouter {
    admission: SessionLimits,
}

impl CountingRouter {
    pub(crate) fn new(admission: SessionLimits) -> Self {
        CountingRouter { admission }
    }
}

impl Router for CountingRouter {
    fn connection_id_bits(&mut self, random: u32) -> u32 {
        ricochet_proto::NoRouting::default().connection_id_bits(random)
    }

    fn admit_session(&mut self, ip: IpAddr, limits: &ListenConfig) -> Result<(), CloseReason> {
        self.admission.admit(ip, limits)
    }

    fn release_session(&mut self, ip: IpAddr) {
        self.admission.release(ip);
    }
}

/// The router of worker `worker`'s endpoint: tags every connection id with the worker, counts
/// sessions against the server's limits with the other workers ([`SessionLimits`]) and, with a
/// placement, routes each new session to the least-loaded worker.
#[derive(Debug)]
pub(crate) struct WorkerRouter {
    worker: u8,
    placement: Option<Placement>,
    admission: SessionLimits,
}

impl WorkerRouter {
    /// The router of worker `worker`, counting sessions in `admission` (shared by the server's
    /// workers) and placing them with `placement` when there is one.
    pub(crate) fn new(worker: u8, placement: Option<Placement>, admission: SessionLimits) -> Self {
        WorkerRouter {
            worker,
            placement,
            admission,
        }
    }
}

impl Router for WorkerRouter {
    fn connection_id_bits(&mut self, random: u32) -> u32 {
        // The owner's index in the low byte (see `worker_of_cid`); bit 8 marks the id as tagged.
        (random & !0x1ff) | 0x100 | u32::from(self.worker)
    }

    fn route_new_session(&mut self) -> u16 {
        match &self.placement {
            Some(p) => u16::from_be_bytes([ROUTE_PLACED, p.pick()]),
            None => 0,
        }
    }

    fn session_opened(&mut self) {
        if let Some(p) = &self.placement {
            p.opened(self.worker);
        }
    }

    fn session_closed(&mut self) {
        if let Some(p) = &self.placement {
            p.closed(self.worker);
        }
    }

    fn admit_session(&mut self, ip: IpAddr, limits: &ListenConfig) -> Result<(), CloseReason> {
        self.admission.admit(ip, limits)
    }

    fn release_session(&mut self, ip: IpAddr) {
        self.admission.release(ip);
    }
}

/// The worker index a [`WorkerRouter`] stamped into `cid`; `None` for an untagged cid.
pub(crate) fn worker_of_cid(cid: ConnectionId) -> Option<u8> {
    let generation = cid.0 >> 32;
    (generation & 0x100 != 0).then_some((generation & 0xff) as u8)
}

/// The worker that should handle `datagram` in a multi-worker server, read from its bytes: the
/// owner tagged in a connection packet's destination cid, or the worker a placed cookie echo
/// names. `None` when the datagram names none (a hello, an untagged cid, something malformed):
/// any worker may take it.
pub(crate) fn worker_of_datagram(datagram: &[u8]) -> Option<u8> {
    let ty = *datagram.first()?;
    if ty == PacketType::ClientCookieEcho as u8 {
        let route = datagram.get(wire::ECHO_ROUTE_OFFSET..wire::ECHO_ROUTE_OFFSET + 2)?;
        return (route[0] == ROUTE_PLACED).then_some(route[1]);
    }
    if ty >= PacketType::Data as u8 {
        return worker_of_cid(wire::peek_cid(datagram)?);
    }
    None
}

/// The per-core steering rules: a connection packet goes to the worker tagged in its
/// destination cid, a placed cookie echo to the worker it names.
pub(crate) fn steer_rules() -> Vec<platform::SteerRule> {
    vec![
        platform::SteerRule {
            kind_offset: 0,
            kinds: PacketType::Data as u8..=u8::MAX,
            flag_offset: CID_TAGGED_OFFSET as u16,
            flag_mask: 0x01,
            flag_value: 0x01,
            index_offset: CID_WORKER_OFFSET as u16,
        },
        platform::SteerRule {
            kind_offset: 0,
            kinds: PacketType::ClientCookieEcho as u8..=PacketType::ClientCookieEcho as u8,
            flag_offset: wire::ECHO_ROUTE_OFFSET as u16,
            flag_mask: 0xff,
            flag_value: ROUTE_PLACED,
            index_offset: wire::ECHO_ROUTE_OFFSET as u16 + 1,
        },
    ]
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::time::Instant;

    use ricochet_proto::{Config, DropCause, Endpoint, EndpointConfig, ListenConfig};

    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    fn worker(w: u8, placement: &Placement, now: Instant) -> Endpoint {
        worker_with(
            w,
            placement,
            &SessionLimits::default(),
            ListenConfig::insecure(),
            now,
        )
    }

    fn worker_with(
        w: u8,
        placement: &Placement,
        admission: &SessionLimits,
        limits: ListenConfig,
        now: Instant,
    ) -> Endpoint {
        let cfg = EndpointConfig::default().with(|c| {
            c.connection = Arc::new(Config::default());
            c.server = Some(limits);
        });
        let mut e = Endpoint::new(cfg, now, 100 + u64::from(w));
        e.set_router(Box::new(WorkerRouter::new(
            w,
            Some(placement.clone()),
            admission.clone(),
        )));
        e.set_cookie_secret(now, [7u8; 32]);
        e
    }

    /// The cookie echo a fresh client sends after `server` challenged its hello.
    fn echo_after_challenge(client: &mut Endpoint, server: &mut Endpoint, now: Instant) -> Vec<u8> {
        let _ = client.connect(now, addr(1));
        let mut buf = vec![0u8; 2048];
        let t = client.poll_transmit(now, &mut buf).expect("hello");
        server
            .handle_datagram(now, addr(50), &buf[..t.size])
            .expect("hello accepted");
        let t = server.poll_transmit(now, &mut buf).expect("challenge");
        client
            .handle_datagram(now, addr(1), &buf[..t.size])
            .expect("challenge accepted");
        let t = client.poll_transmit(now, &mut buf).expect("cookie echo");
        buf[..t.size].to_vec()
    }

    #[test]
    fn placed_cookie_names_the_least_loaded_worker_and_any_worker_verifies_it() {
        let now = Instant::now();
        let placement = Placement::new(2);
        let mut workers: Vec<Endpoint> = (0..2u8).map(|w| worker(w, &placement, now)).collect();
        // Every hello reaches worker 0 (as when all clients hash there); the sessions still split.
        let mut named = Vec::new();
        for k in 0..6u64 {
            let mut client = Endpoint::new(EndpointConfig::default(), now, 200 + k);
            let echo = echo_after_challenge(&mut client, &mut workers[0], now);
            let w = worker_of_datagram(&echo).expect("a placed echo names its worker");
            named.push(w);
            // Worker 1 accepts cookies worker 0 issued: one secret, one clock.
            workers[usize::from(w)]
                .handle_datagram(now, addr(50), &echo)
                .expect("the named worker accepts the echo");
            // A forged name fails the cookie, whichever worker it reaches.
            let mut forged = echo.clone();
            forged[wire::ECHO_ROUTE_OFFSET + 1] ^= 1;
            assert_eq!(
                workers[usize::from(1 - w)].handle_datagram(now, addr(50), &forged),
                Err(DropCause::BadCookie)
            );
        }
        assert_eq!(
            named,
            [0, 1, 0, 1, 0, 1],
            "least loaded first, in turn among equals"
        );
        assert_eq!((placement.sessions(0), placement.sessions(1)), (3, 3));
        assert_eq!(workers[0].connection_count(), 3);
        assert_eq!(workers[1].connection_count(), 3);
    }

    #[test]
    fn session_limits_hold_per_server_across_workers() {
        let now = Instant::now();
        let placement = Placement::new(2);
        let admission = SessionLimits::default();
        let mut limits = ListenConfig::insecure();
        limits.max_sessions_per_address = 3;
        limits.max_sessions = 4;
        let mut workers: Vec<Endpoint> = (0..2u8)
            .map(|w| worker_with(w, &placement, &admission, limits.clone(), now))
            .collect();
        // Six clients from one IP, then two from another: each worker alone would admit all
        // but one of them (3 per address, 4 in all, on each).
        let mut refused = Vec::new();
        for k in 0..8u64 {
            let from = if k < 6 {
                addr(1000 + k as u16)
            } else {
                SocketAddr::from(([10, 0, 0, 2], 1000 + k as u16))
            };
            let mut client = Endpoint::new(EndpointConfig::default(), now, 300 + k);
            let _ = client.connect(now, addr(1));
            let mut buf = vec![0u8; 2048];
            let t = client.poll_transmit(now, &mut buf).expect("hello");
            workers[0]
                .handle_datagram(now, from, &buf[..t.size])
                .expect("hello accepted");
            let t = workers[0].poll_transmit(now, &mut buf).expect("challenge");
            client
                .handle_datagram(now, addr(1), &buf[..t.size])
                .expect("challenge accepted");
            let t = client.poll_transmit(now, &mut buf).expect("cookie echo");
            let echo = buf[..t.size].to_vec();
            let w = usize::from(worker_of_datagram(&echo).expect("placed"));
            workers[w]
                .handle_datagram(now, from, &echo)
                .expect("echo accepted");
            if let Some(t) = workers[w].poll_transmit(now, &mut buf) {
                if client.handle_datagram(now, addr(1), &buf[..t.size]).is_ok() {
                    while let Some((_, e)) = client.poll_event() {
                        if let ricochet_proto::Event::Closed { reason, .. } = e {
                            refused.push((k, reason));
                        }
                    }
                }
            }
        }
        assert_eq!(
            refused,
            [
                (3, CloseReason::TooManyFromAddress),
                (4, CloseReason::TooManyFromAddress),
                (5, CloseReason::TooManyFromAddress),
                (7, CloseReason::ServerFull),
            ]
        );
        assert_eq!(admission.sessions(), 4);
        let held: usize = workers.iter().map(|w| w.connection_count()).sum();
        assert_eq!(held, 4);
    }

    #[test]
    fn tagged_ids_name_their_worker_and_untagged_ones_none() {
        let mut r = WorkerRouter::new(5, None, SessionLimits::default());
        let bits = r.connection_id_bits(0xffff_ffff);
        assert_eq!(
            worker_of_cid(ConnectionId(u64::from(bits) << 32 | 7)),
            Some(5)
        );
        let plain = ricochet_proto::NoRouting::default().connection_id_bits(0xffff_ffff);
        assert_eq!(
            worker_of_cid(ConnectionId(u64::from(plain) << 32 | 7)),
            None
        );
        assert_eq!(r.route_new_session(), 0, "no placement: no route");
    }
}
