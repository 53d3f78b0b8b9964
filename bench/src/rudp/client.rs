//! RUDP echo clients on a client thread: connect, keep `window` complete messages in flight
//! per client on the reliable ordered channel, check every echo (content and order), drain,
//! report. A thread drives one client (`Client::step`) or several at once (`ClientSet::step`:
//! one wait for all of them).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use ricochet::{Client, ClientConfig, ClientEvent, ClientSet};
use ricochet_platform::BackendKind;
use ricochet_proto::token::ConnectToken;
use ricochet_proto::EndpointConfig;

use super::message::{check, encode, Header, Phase};
use crate::schema::{RudpCounts, RudpWire};
use crate::udp::tracker::new_rtt_histogram;

/// The channel the echo runs on (channel 0 of the default channel list: reliable ordered).
pub const ECHO_CHANNEL: u8 = 0;

/// What one client does.
#[derive(Debug, Clone)]
pub struct ClientPlan {
    /// Client id (in every message header).
    pub id: u32,
    /// Where to connect (the relay's front door or the server).
    pub server: SocketAddr,
    /// The connect token (its first address is `server`); `None` connects insecurely.
    pub token: Option<ConnectToken>,
    /// Message size.
    pub payload: usize,
    /// Messages in flight.
    pub window: usize,
    /// Warm-up length.
    pub warmup: Duration,
    /// Measured length.
    pub measured: Duration,
    /// Longest drain.
    pub drain: Duration,
    /// Protocol settings.
    pub endpoint: EndpointConfig,
    /// Datagram backend.
    pub backend: BackendKind,
    /// Connection seed.
    pub seed: u64,
    /// Client placement `with-worker`: the core each server worker is pinned to, by worker.
    /// The client thread then runs on the core of the worker serving its first client.
    /// `None`: the scheduler places the thread.
    pub worker_cores: Option<Arc<Vec<Option<usize>>>>,
}

/// What one client reports.
#[derive(Debug)]
pub struct ClientOutcome {
    /// Warm-up checks.
    pub warmup: RudpCounts,
    /// Measured checks.
    pub measured: RudpCounts,
    /// RTT of measured messages, ns.
    pub rtt_ns: Histogram<u64>,
    /// When the last measured echo arrived, since the epoch.
    pub last_measured_echo: Option<Duration>,
    /// Protocol counters at the end of the drain.
    pub wire: RudpWire,
    /// A failure that stopped the client (connect, I/O, disconnect), if any.
    pub error: Option<String>,
}

struct InFlight {
    seq: u64,
    phase: Phase,
    sent: Instant,
}

/// The phase boundaries of a round, from its epoch.
#[derive(Debug, Clone, Copy)]
struct Clock {
    epoch: Instant,
    measured_at: Instant,
    end_at: Instant,
    drain_until: Instant,
}

/// One client's echo state: what it has in flight and what it counted.
struct Echoer {
    plan: ClientPlan,
    in_flight: VecDeque<InFlight>,
    next_seq: u64,
    app_sent: u64,
    out: ClientOutcome,
    /// The outcome was reported; the client only acknowledges from now on.
    reported: bool,
}

/// What [`Echoer::fill`] decided.
enum Fill {
    /// Still running: wait at most until this boundary.
    Running(Instant),
    /// Done (drained, or out of drain time): report.
    Finished,
}

impl ClientOutcome {
    /// Nothing counted yet.
    fn empty() -> Self {
        ClientOutcome {
            warmup: RudpCounts::default(),
            measured: RudpCounts::default(),
            rtt_ns: new_rtt_histogram(),
            last_measured_echo: None,
            wire: RudpWire::default(),
            error: None,
        }
    }
}

impl Echoer {
    fn new(plan: ClientPlan) -> Echoer {
        Echoer {
            in_flight: VecDeque::with_capacity(plan.window),
            plan,
            next_seq: 0,
            app_sent: 0,
            out: ClientOutcome::empty(),
            reported: false,
        }
    }

    /// Top the window up (before the end of the measured phase), or decide the drain is over.
    fn fill(&mut self, client: &mut Client, clock: &Clock, now: Instant) -> Result<Fill, String> {
        let phase = if now < clock.measured_at {
            Some(Phase::Warmup)
        } else if now < clock.end_at {
            Some(Phase::Measured)
        } else {
            None
        };
        if let Some(phase) = phase {
            while self.in_flight.len() < self.plan.window {
                let h = Header {
                    client: self.plan.id,
                    seq: self.next_seq,
                    phase,
                    sent_ns: now.duration_since(clock.epoch).as_nanos() as u64,
                };
                let counts = match phase {
                    Phase::Warmup => &mut self.out.warmup,
                    Phase::Measured => &mut self.out.measured,
                };
                let sent = Instant::now();
                match client.send(ECHO_CHANNEL, encode(&h, self.plan.payload)) {
                    Ok(()) => {
                        counts.sent += 1;
                        self.app_sent += self.plan.payload as u64;
                        self.in_flight.push_back(InFlight {
                            seq: self.next_seq,
                            phase,
                            sent,
                        });
                        self.next_seq += 1;
                    }
                    Err(e) => {
                        counts.send_errors += 1;
                        return Err(format!("client {} send: {e}", self.plan.id));
                    }
                }
            }
        } else if self.in_flight.is_empty() {
            return Ok(Fill::Finished);
        } else if now >= clock.drain_until {
            for m in &self.in_flight {
                match m.phase {
                    Phase::Warmup => self.out.warmup.lost += 1,
                    Phase::Measured => self.out.measured.lost += 1,
                }
            }
            return Ok(Fill::Finished);
        }
        let boundary = [clock.measured_at, clock.end_at, clock.drain_until]
            .into_iter()
            .find(|t| *t > now)
            .unwrap_or(now);
        Ok(Fill::Running(boundary))
    }

    /// Handle one event of a running client.
    fn on_event(&mut self, ev: ClientEvent, clock: &Clock) -> Result<(), String> {
        match ev {
            ClientEvent::Message { data, .. } => {
                let at = Instant::now();
                on_echo(
                    &self.plan,
                    &data,
                    at,
                    clock.epoch,
                    &mut self.in_flight,
                    &mut self.out,
                );
                Ok(())
            }
            ClientEvent::Disconnected { reason, by_peer } => Err(format!(
                "client {} disconnected: {reason:?} (by peer: {by_peer})",
                self.plan.id
            )),
            // Connected, and whatever later versions report: nothing the echo needs.
            _ => Ok(()),
        }
    }

    /// Finish (with `error` if the echo stopped on one), read the protocol counters, report.
    fn report(&mut self, client: &Client, error: Option<String>, done: &Sender<ClientOutcome>) {
        if self.reported {
            return;
        }
        self.reported = true;
        self.out.wire.app_bytes_sent = self.app_sent;
        self.out.error = error.or_else(|| {
            (client.queued_bytes() != 0).then(|| {
                format!(
                    "client {}: {} bytes still queued after the drain (send not complete)",
                    self.plan.id,
                    client.queued_bytes()
                )
            })
        });
        if let Some(st) = client.detail() {
            self.out.wire = super::wire_of(&st, self.app_sent);
        }
        let out = std::mem::replace(&mut self.out, ClientOutcome::empty());
        let _ = done.send(out);
    }
}

/// The clients of one thread: a lone client steps itself (one system call per turn); several
/// share one wait through a [`ClientSet`].
enum Clients {
    One(Box<Client>),
    Set(Box<ClientSet>),
}

impl Clients {
    fn get_mut(&mut self, i: usize) -> Option<&mut Client> {
        match self {
            Clients::One(c) => (i == 0).then_some(&mut **c),
            Clients::Set(s) => {
                // What the caller queues leaves with the next turn.
                s.mark_changed(i);
                s.get_mut(i)
            }
        }
    }

    /// One turn; a failure names the client it came from (`None`: the shared wait).
    fn step(&mut self, wait: Duration) -> Result<(), (Option<usize>, String)> {
        match self {
            Clients::One(c) => c.step(wait).map_err(|e| (Some(0), e.to_string())),
            Clients::Set(s) => s.step(wait).map_err(|e| (e.index, e.source.to_string())),
        }
    }

    fn poll_event(&mut self) -> Option<(usize, ClientEvent)> {
        match self {
            Clients::One(c) => c.poll_event().map(|e| (0, e)),
            Clients::Set(s) => s.poll_event(),
        }
    }

    fn into_vec(self) -> Vec<Client> {
        match self {
            Clients::One(c) => vec![*c],
            Clients::Set(s) => (*s).into_clients(),
        }
    }
}

/// Connect every client of `plans` (on this thread, which then drives them), report each
/// one's readiness on `ready`, wait for the epoch on `start`, run the phases, send each
/// client's outcome on `done` as it finishes, then keep every connection serviced
/// (acknowledging) until `close` is set, and close them.
pub fn run_clients(
    plans: Vec<ClientPlan>,
    ready: Sender<Result<(), String>>,
    start: Receiver<Option<Instant>>,
    done: Sender<ClientOutcome>,
    close: Arc<AtomicBool>,
) {
    let mut connected = Vec::with_capacity(plans.len());
    let mut failed = false;
    for plan in &plans {
        let mut config = ClientConfig::new().seed(plan.seed).backend(plan.backend);
        config.endpoint = plan.endpoint.clone();
        config.socket_buffer = Some(4 << 20);
        let config = config.connect_timeout(Duration::from_secs(10));
        let connected_client = match &plan.token {
            Some(t) => Client::connect_blocking(t, config),
            None => Client::connect_insecure_blocking(plan.server, config),
        };
        match connected_client {
            Ok(c) => {
                let _ = ready.send(Ok(()));
                connected.push(c);
            }
            Err(e) => {
                let _ = ready.send(Err(format!("client {} connect: {e}", plan.id)));
                failed = true;
            }
        }
    }
    if let Some(cores) = plans.first().and_then(|p| p.worker_cores.as_deref()) {
        pin_with_worker(&connected, cores);
    }
    let go = start.recv();
    let epoch = match go {
        Ok(Some(epoch)) if !failed => epoch,
        _ => {
            for c in &mut connected {
                c.close();
            }
            return;
        }
    };
    let mut clients = if connected.len() == 1 {
        Clients::One(Box::new(connected.remove(0)))
    } else {
        let mut set = ClientSet::new();
        for c in connected {
            set.push(c);
        }
        Clients::Set(Box::new(set))
    };
    let warmup = plans.first().map_or(Duration::ZERO, |p| p.warmup);
    let measured = plans.first().map_or(Duration::ZERO, |p| p.measured);
    let drain = plans.first().map_or(Duration::ZERO, |p| p.drain);
    let measured_at = epoch + warmup;
    let clock = Clock {
        epoch,
        measured_at,
        end_at: measured_at + measured,
        drain_until: measured_at + measured + drain,
    };
    let mut echoers: Vec<Echoer> = plans.into_iter().map(Echoer::new).collect();
    echo_loop(&mut clients, &mut echoers, &clock, &done);

    // Keep the connections serviced until the bench has read the server's counters.
    let limit = Instant::now() + Duration::from_secs(30);
    while !close.load(Ordering::Acquire) && Instant::now() < limit {
        if clients.step(Duration::from_millis(5)).is_err() {
            break;
        }
        while clients.poll_event().is_some() {}
    }
    let mut clients = clients.into_vec();
    for c in &mut clients {
        c.close();
    }
    let limit = Instant::now() + Duration::from_millis(500);
    while Instant::now() < limit {
        let mut open = false;
        for c in &mut clients {
            if c.is_connected() && c.update().is_ok() {
                while c.poll_event().is_some() {}
                open |= c.is_connected();
            }
        }
        if !open {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Pin this thread to the core of the worker serving its first client (loopback hands each
/// datagram over in the sender's context: on that core, the worker is woken there). Left to
/// the scheduler when the server does not name the worker or did not pin it.
fn pin_with_worker(clients: &[Client], worker_cores: &[Option<usize>]) {
    let core = clients
        .first()
        .and_then(Client::server_worker)
        .and_then(|w| worker_cores.get(usize::from(w)).copied().flatten());
    if let Some(id) = core {
        core_affinity::set_for_current(core_affinity::CoreId { id });
    }
}

/// Run every echoer of the thread until all have reported.
fn echo_loop(
    clients: &mut Clients,
    echoers: &mut [Echoer],
    clock: &Clock,
    done: &Sender<ClientOutcome>,
) {
    loop {
        let now = Instant::now();
        let mut boundary: Option<Instant> = None;
        for (i, e) in echoers.iter_mut().enumerate() {
            if e.reported {
                continue;
            }
            let Some(client) = clients.get_mut(i) else {
                e.out.error = Some(format!("client {} is missing", e.plan.id));
                e.reported = true;
                continue;
            };
            match e.fill(client, clock, now) {
                Ok(Fill::Running(b)) => boundary = Some(boundary.map_or(b, |x| x.min(b))),
                Ok(Fill::Finished) => e.report(client, None, done),
                Err(err) => e.report(client, Some(err), done),
            }
        }
        let Some(boundary) = boundary else {
            return;
        };
        // Sleep until something arrives, a protocol timer, or the next phase boundary. One
        // submission per client per turn: the messages queued above and the acknowledgements
        // the last turn's arrivals called for leave together.
        let wait = boundary
            .saturating_duration_since(now)
            .min(Duration::from_millis(5));
        if let Err((index, err)) = clients.step(wait) {
            for (i, e) in echoers.iter_mut().enumerate() {
                if !e.reported && index.is_none_or(|x| x == i) {
                    let msg = format!("client {} I/O: {err}", e.plan.id);
                    if let Some(c) = clients.get_mut(i) {
                        e.report(c, Some(msg), done);
                    }
                }
            }
            if index.is_none() {
                return;
            }
            continue;
        }
        while let Some((i, ev)) = clients.poll_event() {
            let Some(e) = echoers.get_mut(i).filter(|e| !e.reported) else {
                continue;
            };
            if let Err(err) = e.on_event(ev, clock) {
                if let Some(c) = clients.get_mut(i) {
                    e.report(c, Some(err), done);
                }
            }
        }
    }
}

fn on_echo(
    plan: &ClientPlan,
    data: &[u8],
    at: Instant,
    epoch: Instant,
    in_flight: &mut VecDeque<InFlight>,
    out: &mut ClientOutcome,
) {
    let Some(h) = check(data).filter(|h| h.client == plan.id && data.len() == plan.payload) else {
        // Whose message it was is unknown: charge the oldest outstanding one's phase.
        match in_flight.front().map(|m| m.phase) {
            Some(Phase::Warmup) => out.warmup.content_errors += 1,
            _ => out.measured.content_errors += 1,
        }
        return;
    };
    // Reliable ordered: the echo must be the oldest message in flight.
    let pos = in_flight.iter().position(|m| m.seq == h.seq);
    let Some(pos) = pos else {
        // An echo of nothing outstanding: a duplicate delivery or a forged sequence.
        match h.phase {
            Phase::Warmup => out.warmup.order_errors += 1,
            Phase::Measured => out.measured.order_errors += 1,
        }
        return;
    };
    let m = in_flight.remove(pos).unwrap_or(InFlight {
        seq: h.seq,
        phase: h.phase,
        sent: at,
    });
    let c = match m.phase {
        Phase::Warmup => &mut out.warmup,
        Phase::Measured => &mut out.measured,
    };
    if pos != 0 || m.phase != h.phase {
        c.order_errors += 1;
        return;
    }
    c.echoed += 1;
    if m.phase == Phase::Measured {
        let rtt = at.duration_since(m.sent).as_nanos() as u64;
        out.rtt_ns.saturating_record(rtt.max(1));
        out.last_measured_echo = Some(at.duration_since(epoch));
    }
}
