//! The RUDP server and client over real loopback sockets: both IO models, every local backend.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ricochet::platform::BackendKind;
use ricochet::proto::token::{ConnectToken, TokenKey, TokenParams};
use ricochet::runtime::{Handler, IdleStrategy, Server, ServerConfig, ServerContext, SessionId};
use ricochet::{Client, ClientConfig, ClientEvent, ClientSet, CloseReason, IoModel};

const PROTOCOL_ID: u64 = 0x7465_7374;

fn key() -> TokenKey {
    TokenKey::from_bytes([0x42; 32])
}

/// A server config on a free loopback port that admits clients by token.
fn secure_cfg() -> ServerConfig {
    ServerConfig::new("127.0.0.1:0".parse().unwrap()).tokens(key(), PROTOCOL_ID)
}

/// A token for the server at `addr`, valid for a minute.
fn token(addr: SocketAddr) -> ConnectToken {
    token_for(&[addr], rand_seed(addr))
}

/// A token for `client_id` listing `server_addresses`, valid for a minute.
fn token_for(server_addresses: &[SocketAddr], client_id: u64) -> ConnectToken {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let params = TokenParams {
        protocol_id: PROTOCOL_ID,
        client_id,
        server_addresses,
        expires_unix: now + 60,
        user_data: b"",
    };
    ConnectToken::seal(&key(), &params, &mut rand::rng()).unwrap()
}

struct Echo;
impl Handler for Echo {
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
        ctx.send(s, channel, data).expect("echo queued");
    }
}

fn server(model: IoModel, workers: usize, backend: BackendKind) -> Server {
    let mut cfg = secure_cfg();
    cfg.udp.io_model = model;
    cfg.udp.io_threads = workers;
    cfg.udp.backend.kind = backend;
    cfg.seed = Some(7);
    Server::start(cfg, |_| Echo).unwrap()
}

fn client(addr: SocketAddr) -> Client {
    let cfg = ClientConfig::new()
        .seed(rand_seed(addr))
        .connect_timeout(Duration::from_secs(10));
    Client::connect_blocking(&token(addr), cfg).expect("connects")
}

fn rand_seed(addr: SocketAddr) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    N.fetch_add(1, Ordering::Relaxed) ^ u64::from(addr.port())
}

fn backends() -> Vec<BackendKind> {
    ricochet::platform::probe().backends()
}

/// Send `msgs` on `channel` and wait for every echo; reliable channels must echo all of them
/// intact (in order on channel 0).
fn echo_all(c: &mut Client, channel: u8, msgs: &[Vec<u8>]) {
    for m in msgs {
        c.send(channel, Bytes::from(m.clone())).unwrap();
    }
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < msgs.len() {
        assert!(
            Instant::now() < deadline,
            "echo timed out: {}/{}",
            got.len(),
            msgs.len()
        );
        c.wait(Duration::from_millis(5)).unwrap();
        while let Some(e) = c.poll_event() {
            match e {
                ClientEvent::Message { channel: ch, data } => {
                    assert_eq!(ch, channel);
                    got.push(data.to_vec());
                }
                other => panic!("unexpected event {other:?}"),
            }
        }
    }
    if channel == 0 {
        assert_eq!(got, msgs, "ordered channel echoes in order");
    } else {
        let mut a = got.clone();
        let mut b = msgs.to_vec();
        a.sort();
        b.sort();
        assert_eq!(a, b, "every message exactly once, intact");
    }
}

fn message(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 131 + j * 7) as u8).collect()
}

#[test]
fn echo_on_reliable_channels_both_models_every_backend() {
    for backend in backends() {
        for model in [IoModel::PerCore, IoModel::Shared] {
            let srv = server(model, 2, backend);
            let mut c = client(srv.local_addr());
            // Sizes from empty to multi-fragment (1 MiB is the default message limit).
            let sizes = [0, 1, 1_000, 1_200, 5_000, 64 * 1024, 1 << 20];
            let msgs: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| message(i, n))
                .collect();
            echo_all(&mut c, 0, &msgs);
            echo_all(&mut c, 1, &msgs[..6]);
            c.close();
            for _ in 0..10 {
                c.update().unwrap();
            }
            srv.shutdown().unwrap();
        }
    }
}

#[test]
fn server_reading_on_its_tick_connects_and_echoes_every_backend() {
    for backend in backends() {
        let mut cfg = secure_cfg()
            .tick(Duration::from_millis(20))
            .idle(IdleStrategy::Tick);
        cfg.udp.io_threads = 1;
        cfg.udp.backend.kind = backend;
        let srv = Server::start(cfg, |_| Echo).unwrap();
        let mut c = client(srv.local_addr());
        // A large message takes several windows, each acknowledged at a server tick.
        echo_all(&mut c, 0, &[message(0, 256 * 1024)]);
        // Then a game client's pattern: a small input every 2 ms. A worker that woke for each
        // datagram would turn at least once per input.
        const INPUTS: usize = 100;
        let before = srv.counters();
        let mut echoed = 0;
        for i in 0..INPUTS {
            c.send(0, Bytes::from(message(i, 32))).unwrap();
            c.wait(Duration::from_millis(2)).unwrap();
            while let Some(e) = c.poll_event() {
                if matches!(e, ClientEvent::Message { .. }) {
                    echoed += 1;
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while echoed < INPUTS {
            assert!(
                Instant::now() < deadline,
                "{backend}: {echoed}/{INPUTS} echoed"
            );
            c.wait(Duration::from_millis(5)).unwrap();
            while let Some(e) = c.poll_event() {
                if matches!(e, ClientEvent::Message { .. }) {
                    echoed += 1;
                }
            }
        }
        // The live counters are published whenever the worker goes to sleep.
        let after = srv.counters();
        let delta = |f: fn(&ricochet::runtime::WorkerCounters) -> u64| {
            after.iter().map(f).sum::<u64>() - before.iter().map(f).sum::<u64>()
        };
        let turns = delta(|w| w.loop_turns);
        let ticks = delta(|w| w.ticks);
        // A wake-up per tick, a turn or two to drain, and session timers now and then.
        assert!(
            turns < INPUTS as u64 && turns <= 3 * ticks + 10,
            "{backend}: {turns} loop turns over {ticks} ticks for {INPUTS} inputs"
        );
        srv.shutdown().unwrap();
    }
}

/// Counts the messages whose turn's tick saw them: `on_message` notes the turn's time, and
/// `on_tick` of the same turn (the same `now`) finds it.
struct TickOrder {
    read_at: Option<Instant>,
    unseen: u64,
    seen_by_tick: Arc<std::sync::atomic::AtomicU64>,
    total: Arc<std::sync::atomic::AtomicU64>,
}
impl Handler for TickOrder {
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, _: SessionId, _: u8, _: Bytes) {
        self.read_at = Some(ctx.now());
        self.unseen += 1;
        self.total.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn on_tick(&mut self, ctx: &mut ServerContext<'_>) {
        if self.read_at == Some(ctx.now()) {
            self.seen_by_tick
                .fetch_add(self.unseen, std::sync::atomic::Ordering::SeqCst);
        }
        self.unseen = 0;
    }
}

#[test]
fn a_tick_server_hands_inputs_to_the_handler_before_the_tick_that_read_them() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let seen = Arc::new(AtomicU64::new(0));
    let total = Arc::new(AtomicU64::new(0));
    let (s2, t2) = (seen.clone(), total.clone());
    let mut cfg = secure_cfg()
        .tick(Duration::from_millis(20))
        .idle(IdleStrategy::Tick);
    cfg.udp.io_threads = 1;
    let srv = Server::start(cfg, move |_| TickOrder {
        read_at: None,
        unseen: 0,
        seen_by_tick: s2.clone(),
        total: t2.clone(),
    })
    .unwrap();
    let mut c = client(srv.local_addr());
    const INPUTS: u64 = 20;
    for i in 0..INPUTS {
        c.send(0, Bytes::from(message(i as usize, 32))).unwrap();
        let until = Instant::now() + Duration::from_millis(7);
        while Instant::now() < until {
            let _ = c.wait(Duration::from_millis(2));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while total.load(Ordering::SeqCst) < INPUTS {
        assert!(Instant::now() < deadline, "inputs did not arrive");
        let _ = c.wait(Duration::from_millis(5));
    }
    // Let the last tick run.
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_millis(60) {
        let _ = c.wait(Duration::from_millis(5));
    }
    srv.shutdown().unwrap();
    // A session timer may wake the worker between ticks and read an input early; the tick
    // must see the rest in its own turn (handing them over after it, none would be).
    let seen = seen.load(Ordering::SeqCst);
    assert!(
        seen * 4 >= INPUTS * 3,
        "{seen} of {INPUTS} inputs reached the handler before the tick of their turn"
    );
}

#[test]
fn two_workers_serve_64_clients() {
    let srv = server(IoModel::PerCore, 2, BackendKind::Auto);
    let addr = srv.local_addr();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let mut clients: Vec<Client> = (0..16).map(|_| client(addr)).collect();
                for (i, c) in clients.iter_mut().enumerate() {
                    let msgs: Vec<Vec<u8>> =
                        (0..4).map(|k| message(t * 100 + i * 4 + k, 200)).collect();
                    echo_all(c, 0, &msgs);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
    let counters = srv.shutdown().unwrap();
    assert_eq!(counters.len(), 2);
    // With 64 distinct source ports both workers got sessions (SO_REUSEPORT spreads them).
    assert!(counters.iter().all(|c| c.datagrams_in > 0), "{counters:?}");
}

#[test]
fn client_keeps_its_session_when_its_address_changes() {
    let srv = server(IoModel::PerCore, 2, BackendKind::Auto);
    let mut c = client(srv.local_addr());
    echo_all(&mut c, 0, &[message(1, 100)]);
    let before = c.local_addr();
    // Several rebinds: with two workers some new ports hash to the other worker's socket, so the
    // datagram must be forwarded to the session's owner.
    for i in 0..6 {
        c.rebind().unwrap();
        assert_ne!(c.local_addr(), before);
        echo_all(&mut c, 0, &[message(10 + i, 3_000)]);
    }
    assert!(c.is_connected());
    srv.shutdown().unwrap();
}

#[test]
fn per_core_places_sessions_evenly_and_steers_by_connection_id() {
    for backend in backends() {
        let srv = server(IoModel::PerCore, 2, backend);
        // One after another: each session goes to the worker holding fewer. By source port
        // alone, 8 random ports split 4:4 only about a quarter of the time.
        let mut clients: Vec<Client> = (0..8).map(|_| client(srv.local_addr())).collect();
        assert_eq!(srv.sessions_per_worker(), Some(vec![4, 4]), "{backend:?}");
        for (i, c) in clients.iter_mut().enumerate() {
            echo_all(c, 0, &[message(i, 2_000)]);
        }
        // New addresses: steering follows the connection id, so nothing needs forwarding
        // where the BPF program runs (Linux).
        for (i, c) in clients.iter_mut().enumerate() {
            c.rebind().unwrap();
            echo_all(c, 0, &[message(100 + i, 2_000)]);
        }
        #[cfg(target_os = "linux")]
        assert_eq!(srv.forwarded(), 0, "{backend:?}");
        assert_eq!(srv.sessions_per_worker(), Some(vec![4, 4]), "{backend:?}");
        drop(clients);
        let counters = srv.shutdown().unwrap();
        assert!(counters.iter().all(|c| c.datagrams_in > 0), "{counters:?}");
    }
}

#[test]
fn per_core_spreads_clients_that_connect_at_once() {
    let srv = server(IoModel::PerCore, 2, BackendKind::Auto);
    let addr = srv.local_addr();
    let clients: Vec<Client> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8).map(|_| s.spawn(move || client(addr))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let per = srv.sessions_per_worker().expect("per-core placement");
    assert_eq!(per.iter().sum::<u32>(), 8);
    // Handshakes in progress count, so a burst of hellos does not pile onto one worker.
    assert!(per.iter().all(|&n| (3..=5).contains(&n)), "{per:?}");
    drop(clients);
    srv.shutdown().unwrap();
}

/// Answers every message with the index of the worker that handled it.
struct NameWorker;
impl Handler for NameWorker {
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, _: Bytes) {
        let worker = u8::try_from(ctx.worker()).expect("few workers");
        ctx.send(s, channel, vec![worker]).expect("reply queued");
    }
}

#[test]
fn client_learns_which_worker_serves_it() {
    for (model, named) in [(IoModel::PerCore, true), (IoModel::Shared, false)] {
        let mut cfg = secure_cfg();
        cfg.udp.io_model = model;
        cfg.udp.io_threads = 2;
        cfg.seed = Some(11);
        let srv = Server::start(cfg, |_| NameWorker).unwrap();
        let mut seen = Vec::new();
        for _ in 0..4 {
            let mut c = client(srv.local_addr());
            c.send(0, &b"who"[..]).unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            let reply = loop {
                assert!(Instant::now() < deadline, "no reply ({model:?})");
                c.wait(Duration::from_millis(5)).unwrap();
                if let Some(ClientEvent::Message { data, .. }) = c.poll_event() {
                    break data;
                }
            };
            if named {
                assert_eq!(c.server_worker(), Some(reply[0]), "{model:?}");
                seen.push(reply[0]);
            } else {
                // The shared model's one endpoint does not tag its connection ids.
                assert_eq!(c.server_worker(), None, "{model:?}");
            }
        }
        if named {
            seen.sort_unstable();
            assert_eq!(seen, vec![0, 0, 1, 1], "sessions placed on both workers");
        }
        srv.shutdown().unwrap();
    }
}

/// Records every disconnect it sees.
struct Recorder(Arc<Mutex<HashMap<SessionId, (CloseReason, bool)>>>);
impl Handler for Recorder {
    fn on_message(&mut self, _: &mut ServerContext<'_>, _: SessionId, _: u8, _: Bytes) {}
    fn on_disconnect(
        &mut self,
        _: &mut ServerContext<'_>,
        s: SessionId,
        r: CloseReason,
        by_peer: bool,
    ) {
        self.0.lock().unwrap().insert(s, (r, by_peer));
    }
}

#[test]
fn shutdown_closes_open_sessions_with_a_reason_on_both_sides() {
    for model in [IoModel::PerCore, IoModel::Shared] {
        let seen = Arc::new(Mutex::new(HashMap::new()));
        let s2 = seen.clone();
        let mut cfg = secure_cfg();
        cfg.udp.io_model = model;
        cfg.udp.io_threads = 2;
        let srv = Server::start(cfg, move |_| Recorder(s2.clone())).unwrap();
        let mut clients: Vec<Client> = (0..4).map(|_| client(srv.local_addr())).collect();
        // Keep the clients answering while the server shuts down on another thread.
        let stopper = std::thread::spawn(move || srv.shutdown());
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut closed = vec![None; clients.len()];
        while closed.iter().any(Option::is_none) {
            assert!(
                Instant::now() < deadline,
                "clients did not learn of the shutdown"
            );
            for (i, c) in clients.iter_mut().enumerate() {
                c.wait(Duration::from_millis(1)).unwrap();
                while let Some(e) = c.poll_event() {
                    if let ClientEvent::Disconnected { reason, by_peer } = e {
                        closed[i] = Some((reason, by_peer));
                    }
                }
            }
        }
        stopper.join().unwrap().unwrap();
        for c in &closed {
            assert_eq!(*c, Some((CloseReason::Shutdown, true)), "{model}");
        }
        let seen = seen.lock().unwrap();
        assert_eq!(
            seen.len(),
            4,
            "{model}: the server's handlers saw every close"
        );
        assert!(seen
            .values()
            .all(|&(r, by_peer)| r == CloseReason::Shutdown && !by_peer));
    }
}

/// `serve_until_signal` serves until SIGTERM, then shuts down: the client learns why. (The
/// process keeps the handlers it installed: a second signal would end it, which this test never
/// sends.)
#[cfg(unix)]
#[test]
fn serve_until_signal_shuts_down_on_sigterm() {
    let srv = Server::start(secure_cfg(), |_| Echo).unwrap();
    let mut c = client(srv.local_addr());
    let (ready, listening) = std::sync::mpsc::channel();
    let serving = std::thread::spawn(move || {
        srv.serve_until_signal_then(move || {
            let _ = ready.send(());
        })
    });
    // Raised before the handlers are in place, SIGTERM would end the test process.
    listening
        .recv_timeout(Duration::from_secs(10))
        .expect("the server installs its signal handlers");
    echo_all(&mut c, 0, &[b"before the signal".to_vec()]);
    assert!(!serving.is_finished(), "serves until a signal");
    signal_hook::low_level::raise(signal_hook::consts::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut closed = None;
    while closed.is_none() {
        assert!(Instant::now() < deadline, "the client did not learn of it");
        for e in c.wait(Duration::from_millis(5)).unwrap() {
            if let ClientEvent::Disconnected { reason, by_peer } = e {
                closed = Some((reason, by_peer));
            }
        }
    }
    assert_eq!(closed, Some((CloseReason::Shutdown, true)));
    let counters = serving.join().unwrap().expect("a clean shutdown");
    assert!(!counters.is_empty());
}

/// Connecting to a socket that never answers fails with the limit that really expired: the
/// handshake's own when it is the shorter or the caller set none, the caller's when that is.
#[test]
fn connecting_to_nothing_times_out_naming_the_limit_that_expired() {
    use ricochet::{ClientError, ConnectLimit};
    // A bound socket that never answers (and, being bound, draws no ICMP error either).
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let server = silent.local_addr().unwrap();
    let config = |handshake_timeout| {
        ClientConfig::default().session(|c| c.handshake_timeout = handshake_timeout)
    };
    let short = Duration::from_millis(300);
    let long = Duration::from_secs(10);
    let cases = [
        // (handshake timeout, caller's timeout, expected limit)
        (short, Some(long), (short, ConnectLimit::Handshake)),
        (short, None, (short, ConnectLimit::Handshake)),
        (long, Some(short), (short, ConnectLimit::Caller)),
    ];
    for (handshake, caller, expected) in cases {
        let started = Instant::now();
        let mut config = config(handshake);
        config.connect_timeout = caller;
        let err = Client::connect_blocking(&token(server), config).unwrap_err();
        let waited = started.elapsed();
        match &err {
            ClientError::TimedOut { limit, which } => {
                assert_eq!((*limit, *which), expected, "{err}")
            }
            other => panic!("expected TimedOut, got {other}"),
        }
        assert!(
            waited >= short && waited < long,
            "returned after {waited:?}"
        );
        let text = err.to_string();
        let name = match expected.1 {
            ConnectLimit::Handshake => "handshake_timeout",
            _ => "caller",
        };
        assert!(text.contains(name) && text.contains("300ms"), "{text}");
    }
}

/// A caller's limit of `Duration::MAX` means "no limit of mine" (it would overflow the clock as
/// a deadline): `Client::connect_blocking` and `ClientSet::connect` wait for the handshake's
/// own timeout (short here, so the calls return promptly) instead of panicking.
#[test]
fn a_never_ending_caller_limit_leaves_the_handshake_timeout_in_charge() {
    use ricochet::{ClientError, ConnectLimit};
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let server = silent.local_addr().unwrap();
    let handshake = Duration::from_millis(100);
    let mut config = ClientConfig::default().session(|c| c.handshake_timeout = handshake);
    config.connect_timeout = Some(Duration::MAX);
    let expected = |err: &ClientError| {
        matches!(
            err,
            ClientError::TimedOut { limit, which: ConnectLimit::Handshake } if *limit == handshake
        )
    };
    let err = Client::connect_blocking(&token(server), config.clone()).unwrap_err();
    assert!(expected(&err), "{err}");
    let err = ClientSet::connect(&[token(server)], &config, Duration::MAX).unwrap_err();
    assert_eq!(err.index, Some(0), "{err}");
    assert!(expected(&err.source), "{err}");
}

/// `Client::backend_kind` names the backend the client really runs on: the one asked for, and
/// for `auto` one of the host's concrete backends.
#[test]
fn client_reports_its_backend() {
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let available = backends();
    let forced = std::env::var(ricochet::platform::BACKEND_ENV).is_ok_and(|v| !v.trim().is_empty());
    for requested in std::iter::once(BackendKind::Auto).chain(available.iter().copied()) {
        let mut cfg = ClientConfig::default();
        cfg.backend.kind = requested;
        let c = Client::connect(&token(silent.local_addr().unwrap()), cfg).unwrap();
        let kind = c.backend_kind();
        assert!(available.contains(&kind), "{requested} -> {kind}");
        if requested != BackendKind::Auto && !forced {
            assert_eq!(kind, requested, "{}", c.selection_reason());
        }
        assert!(!c.selection_reason().is_empty());
    }
}

/// A client looping on `Client::step` (one submission per turn: acknowledgements leave with
/// the next turn) keeps a window of messages in flight and gets every echo in order, with GSO
/// and GRO on (the default) and off on both sides.
#[test]
fn step_loop_echoes_in_order_with_offloads_on_and_off() {
    for backend in backends() {
        for offload in [true, false] {
            let mut cfg = secure_cfg();
            cfg.udp.io_threads = 1;
            cfg.udp.backend.kind = backend;
            cfg.udp.gso = offload;
            cfg.udp.backend.gro = offload;
            cfg.seed = Some(11);
            let srv = Server::start(cfg, |_| Echo).unwrap();
            let mut ccfg = ClientConfig::new()
                .seed(rand_seed(srv.local_addr()))
                .connect_timeout(Duration::from_secs(10));
            ccfg.gso = offload;
            ccfg.backend.gro = offload;
            ccfg.backend.kind = backend;
            let mut c = Client::connect_blocking(&token(srv.local_addr()), ccfg).expect("connects");
            let total = 400;
            let window = 16;
            let (mut sent, mut got) = (0, 0);
            let deadline = Instant::now() + Duration::from_secs(30);
            while got < total {
                assert!(
                    Instant::now() < deadline,
                    "{backend} offload={offload}: {got}/{total} echoed"
                );
                while sent < total && sent - got < window {
                    c.send(0, Bytes::from(message(sent, 1_000))).unwrap();
                    sent += 1;
                }
                c.step(Duration::from_millis(5)).unwrap();
                while let Some(e) = c.poll_event() {
                    match e {
                        ClientEvent::Message { channel: 0, data } => {
                            assert_eq!(&data[..], &message(got, 1_000)[..], "in order, intact");
                            got += 1;
                        }
                        other => panic!("unexpected event {other:?}"),
                    }
                }
            }
            assert_eq!(c.queued_bytes(), 0);
            c.close();
            for _ in 0..10 {
                c.update().unwrap();
            }
            srv.shutdown().unwrap();
        }
    }
}

#[test]
fn client_set_drives_several_clients_from_one_thread() {
    for backend in backends() {
        let srv = server(IoModel::PerCore, 2, backend);
        let addr = srv.local_addr();
        let mut set = ClientSet::new();
        for _ in 0..5 {
            let mut cfg = ClientConfig::new()
                .seed(rand_seed(addr))
                .connect_timeout(Duration::from_secs(10));
            cfg.backend.kind = backend;
            let c = Client::connect_blocking(&token(addr), cfg).expect("connects");
            assert_eq!(set.push(c), set.len() - 1);
        }
        let n = set.len();
        let total = 300;
        let window = 8;
        let (mut sent, mut got) = (vec![0usize; n], vec![0usize; n]);
        // Long step timeouts: a member whose arrival did not wake the set's wait would stall
        // until a protocol timer, and the echo could not finish by the deadline.
        let deadline = Instant::now() + Duration::from_secs(30);
        while got.iter().any(|&g| g < total) {
            assert!(
                Instant::now() < deadline,
                "{backend}: echoed {got:?} of {total} each"
            );
            for i in 0..n {
                while sent[i] < total && sent[i] - got[i] < window {
                    set.send(i, 0, Bytes::from(message(i * 1000 + sent[i], 900)))
                        .unwrap();
                    sent[i] += 1;
                }
            }
            set.step(Duration::from_secs(20)).unwrap();
            while let Some((i, e)) = set.poll_event() {
                match e {
                    ClientEvent::Message { channel: 0, data } => {
                        assert_eq!(
                            &data[..],
                            &message(i * 1000 + got[i], 900)[..],
                            "member {i}: in order, intact"
                        );
                        got[i] += 1;
                    }
                    other => panic!("member {i}: unexpected event {other:?}"),
                }
            }
        }
        let mut clients = set.into_clients();
        assert_eq!(clients.len(), n);
        for c in &mut clients {
            assert_eq!(c.queued_bytes(), 0);
            c.close();
        }
        for _ in 0..10 {
            for c in &mut clients {
                c.update().unwrap();
            }
        }
        let counters = srv.shutdown().unwrap();
        // Five clients with distinct source ports: both per-core workers served some.
        assert!(counters.iter().all(|c| c.datagrams_in > 0), "{counters:?}");
    }
}

/// A set whose members have nothing to send still runs their protocol timers: with a 40 ms
/// keepalive and a 10 s step timeout, 600 ms of steps send keepalives from every member, and
/// each step returns at a member's timer, not at the timeout.
#[test]
fn client_set_runs_its_members_timers() {
    let srv = server(IoModel::PerCore, 2, BackendKind::Auto);
    let addr = srv.local_addr();
    let mut set = ClientSet::new();
    for _ in 0..4 {
        let cfg = ClientConfig::new()
            .seed(rand_seed(addr))
            .connect_timeout(Duration::from_secs(10))
            .session(|c| c.keepalive_interval = Some(Duration::from_millis(40)));
        set.push(Client::connect_blocking(&token(addr), cfg).expect("connects"));
    }
    // Whatever the connection still owed (its first ACKs) goes out first.
    for _ in 0..5 {
        set.step(Duration::from_millis(20)).unwrap();
    }
    let before: Vec<u64> = (0..set.len())
        .map(|i| {
            set.get(i)
                .and_then(Client::stats)
                .expect("stats")
                .packets_sent
        })
        .collect();
    let t0 = Instant::now();
    let mut steps = 0;
    while t0.elapsed() < Duration::from_millis(600) {
        set.step(Duration::from_secs(10)).unwrap();
        steps += 1;
        if let Some((i, e)) = set.poll_event() {
            panic!("member {i}: unexpected event {e:?}");
        }
    }
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "a step waited for its timeout"
    );
    for (i, b) in before.iter().enumerate() {
        let c = set.get(i).expect("member");
        let sent = c.stats().expect("stats").packets_sent - b;
        assert!(
            sent >= 5,
            "member {i}: {sent} keepalives in 600 ms ({steps} steps)"
        );
        assert!(c.is_connected(), "member {i}");
    }
    srv.shutdown().unwrap();
}

#[test]
fn idle_client_set_step_returns_after_its_timeout() {
    let srv = server(IoModel::PerCore, 1, BackendKind::Auto);
    let mut set = ClientSet::new();
    set.push(client(srv.local_addr()));
    set.push(client(srv.local_addr()));
    // Nothing in flight: the step waits (bounded by the timeout or an earlier protocol
    // timer), reports nothing, and fails nothing.
    let t0 = Instant::now();
    set.step(Duration::from_millis(30)).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(set.poll_event().is_none());
    let empty = ClientSet::new();
    assert!(empty.is_empty() && empty.get(0).is_none());
    srv.shutdown().unwrap();
}

/// The per-address limit holds per server, not per worker: 2 workers, 3 sessions per address,
/// 5 clients from 127.0.0.1. The refused clients' error names the setting to raise.
#[test]
fn per_address_limit_counts_across_workers_and_names_its_setting() {
    let mut cfg = secure_cfg().max_sessions_per_address(3);
    cfg.udp.io_threads = 2;
    cfg.seed = Some(9);
    let server = Server::start(cfg, |_| Echo).unwrap();
    let addr = server.local_addr();
    let mut connected = Vec::new();
    let mut refused = Vec::new();
    for _ in 0..5 {
        let cfg = ClientConfig::new()
            .seed(rand_seed(addr))
            .connect_timeout(Duration::from_secs(10));
        match Client::connect_blocking(&token(addr), cfg) {
            Ok(c) => connected.push(c),
            Err(e) => refused.push(e),
        }
    }
    assert_eq!(connected.len(), 3);
    assert_eq!(refused.len(), 2);
    for e in &refused {
        assert!(
            matches!(
                e,
                ricochet::ClientError::Refused(CloseReason::TooManyFromAddress)
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("max_sessions_per_address"), "{e}");
    }
    // Both workers hold some: the limit was not simply one worker's.
    let per_worker = server
        .sessions_per_worker()
        .expect("per-core with 2 workers");
    assert_eq!(per_worker.iter().sum::<u32>(), 3);
    assert_eq!(server.session_count(), 3);
    assert!(per_worker.iter().all(|&n| n > 0), "{per_worker:?}");
    drop(connected);
    server.shutdown().unwrap();
}

/// `ClientSet::connect` connects many clients at once from one thread; then every member
/// echoes one message through the set, and a set that cannot connect names the member.
#[test]
fn client_set_connects_many_at_once() {
    let srv = server(IoModel::PerCore, 2, BackendKind::Auto);
    let addr = srv.local_addr();
    let n = 300;
    let cfg = ClientConfig::new().seed(rand_seed(addr));
    let t0 = Instant::now();
    let tokens: Vec<ConnectToken> = (0..n).map(|_| token(addr)).collect();
    let mut set = ClientSet::connect(&tokens, &cfg, Duration::from_secs(20)).expect("all connect");
    let took = t0.elapsed();
    assert_eq!(set.len(), n);
    assert_eq!(set.connected(), n);
    assert_eq!(srv.session_count(), n);
    assert!(
        set.poll_event().is_none(),
        "Connected events are not queued"
    );
    for i in 0..n {
        set.send(i, 0, Bytes::from(message(i, 64))).unwrap();
    }
    let mut got = vec![false; n];
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.iter().any(|g| !g) {
        assert!(
            Instant::now() < deadline,
            "echoed {} of {n}",
            got.iter().filter(|g| **g).count()
        );
        set.step(Duration::from_millis(50)).unwrap();
        while let Some((i, e)) = set.poll_event() {
            match e {
                ClientEvent::Message { channel: 0, data } => {
                    assert_eq!(&data[..], &message(i, 64)[..]);
                    assert!(!got[i], "member {i} echoed twice");
                    got[i] = true;
                }
                other => panic!("member {i}: unexpected event {other:?}"),
            }
        }
    }
    eprintln!("{n} clients connected in {took:?}");
    drop(set);
    srv.shutdown().unwrap();

    // Insecure mode, two sessions per address: the third member is refused, and the error
    // says which.
    let cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap())
        .insecure()
        .max_sessions_per_address(2);
    let srv = Server::start(cfg, |_| Echo).unwrap();
    let err = ClientSet::connect_insecure(
        srv.local_addr(),
        &ClientConfig::new(),
        3,
        Duration::from_secs(10),
    )
    .expect_err("the third is refused");
    assert!(
        matches!(
            err.source,
            ricochet::ClientError::Refused(CloseReason::TooManyFromAddress)
        ),
        "{err}"
    );
    assert!(err.index.is_some(), "{err}");
    srv.shutdown().unwrap();
}

/// A flood of datagrams whose (unauthenticated) connection id names a stalled worker is
/// dropped past the forward queue's bound, not queued without limit.
#[test]
fn forwarding_to_a_stalled_worker_is_bounded() {
    use std::net::UdpSocket;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Worker 1 sleeps through its first tick until the flood is over.
    struct Stall {
        worker: usize,
        release: Arc<AtomicBool>,
    }
    impl Handler for Stall {
        fn on_message(&mut self, _: &mut ServerContext<'_>, _: SessionId, _: u8, _: Bytes) {}
        fn on_tick(&mut self, _ctx: &mut ServerContext<'_>) {
            let start = Instant::now();
            while self.worker == 1
                && !self.release.load(Ordering::Relaxed)
                && start.elapsed() < Duration::from_secs(20)
            {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    let release = Arc::new(AtomicBool::new(false));
    let mut cfg = secure_cfg().workers(2).tick(Duration::from_millis(10));
    cfg.udp.io_model = IoModel::PerCore;
    // By the kernel's hash, so that some of the flood lands on worker 0 and needs forwarding.
    cfg.udp.steer_by_source_port = false;
    let r = release.clone();
    let srv = Server::start(cfg, move |worker| Stall {
        worker,
        release: r.clone(),
    })
    .unwrap();
    // Let worker 1 enter its stalled tick.
    std::thread::sleep(Duration::from_millis(100));
    // A connection packet whose cid is tagged for worker 1 (flag and index bytes).
    let mut datagram = vec![0u8; 1_200];
    datagram[0] = 0x10;
    datagram[2 + 2] = 0x01;
    datagram[2 + 3] = 0x01;
    let socks: Vec<UdpSocket> = (0..16)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    // Rounds of 16 ports × 100 until worker 0 (the ports the kernel's hash gives it) has
    // queued past the 4 MiB bound: about 3,300 datagrams of this size.
    let deadline = Instant::now() + Duration::from_secs(10);
    while srv.forward_drops() == 0 && Instant::now() < deadline {
        for _ in 0..100 {
            for s in &socks {
                let _ = s.send_to(&datagram, srv.local_addr());
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let (forwarded, dropped) = (srv.forwarded(), srv.forward_drops());
    release.store(true, Ordering::Relaxed);
    assert!(dropped > 0, "nothing dropped; {forwarded} forwarded");
    // Never more queued than the bound: 4 MiB over at least 1,200 bytes each.
    assert!(forwarded <= (4 << 20) / 1_200, "{forwarded} forwarded");
    srv.shutdown().unwrap();
}

/// A session setting that would overflow a deadline ("never" spelled `Duration::MAX`) is refused
/// at start, naming the field, instead of panicking a worker when the first client arrives.
#[test]
fn out_of_range_session_settings_are_refused_at_start() {
    let cfg = secure_cfg().session(|c| c.idle_timeout = Duration::MAX);
    let err = Server::start(cfg, |_| Echo).unwrap_err().to_string();
    assert!(err.contains("idle_timeout"), "{err}");

    let srv = Server::start(secure_cfg(), |_| Echo).unwrap();
    let bad = ClientConfig::new().session(|c| c.close_linger = Duration::MAX);
    match Client::connect(&token(srv.local_addr()), bad) {
        Err(e @ ricochet::ClientError::Config(_)) => {
            assert!(e.to_string().contains("close_linger"), "{e}")
        }
        other => panic!("expected a config error, got {other:?}"),
    }
    srv.shutdown().unwrap();
}

/// `ServerContext::tick_index` numbers the ticks on the fixed grid from 1, rising, and is only
/// set in `on_tick`.
#[test]
fn tick_index_numbers_the_grid() {
    struct Ticks(Arc<Mutex<Vec<Option<u64>>>>);
    impl Handler for Ticks {
        fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, ch: u8, data: Bytes) {
            self.0
                .lock()
                .unwrap()
                .push(ctx.tick_index().map(|_| u64::MAX));
            ctx.send(s, ch, data).expect("echo queued");
        }
        fn on_tick(&mut self, ctx: &mut ServerContext<'_>) {
            self.0.lock().unwrap().push(ctx.tick_index());
        }
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let cfg = secure_cfg().workers(1).tick(Duration::from_millis(5));
    let s2 = seen.clone();
    let srv = Server::start(cfg, move |_| Ticks(s2.clone())).unwrap();
    let mut c = client(srv.local_addr());
    echo_all(&mut c, 0, &[message(1, 100)]);
    std::thread::sleep(Duration::from_millis(60));
    srv.shutdown().unwrap();
    let seen = seen.lock().unwrap().clone();
    // The message's callback saw no index.
    assert!(seen.contains(&None), "{seen:?}");
    let ticks: Vec<u64> = seen.into_iter().flatten().collect();
    assert!(ticks.len() >= 5, "{ticks:?}");
    assert_eq!(ticks[0], 1, "{ticks:?}");
    assert!(ticks.windows(2).all(|w| w[1] > w[0]), "{ticks:?}");
}

/// A shutdown waits for a session's close to linger on its unacknowledged reliable data (up to
/// `close_linger`), so a client that is slow to acknowledge still learns that the server left
/// instead of timing out.
#[test]
fn shutdown_waits_for_a_slow_client_to_be_told() {
    let srv = Server::start(secure_cfg().workers(1), |_| Echo).unwrap();
    let mut c = client(srv.local_addr());
    // The echo is reliable; the client reads nothing for 1 s, so it is not acknowledged when
    // the shutdown starts.
    c.send(0, Bytes::from_static(b"late")).unwrap();
    c.update().unwrap();
    let stopper = std::thread::spawn(move || srv.shutdown());
    std::thread::sleep(Duration::from_secs(1));
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut told = None;
    while told.is_none() && Instant::now() < deadline {
        c.wait(Duration::from_millis(5)).unwrap();
        while let Some(e) = c.poll_event() {
            if let ClientEvent::Disconnected { reason, .. } = e {
                told = Some(reason);
            }
        }
    }
    assert_eq!(told, Some(CloseReason::Shutdown));
    stopper.join().unwrap().unwrap();
}

/// A token whose first address is IPv6 and unreachable, and whose second is the server's IPv4
/// one: the client moves to an IPv4 socket when the handshake moves on, and connects.
#[test]
fn client_falls_back_across_address_families() {
    if std::net::UdpSocket::bind("[::1]:0").is_err() {
        eprintln!("no IPv6 loopback here: skipped");
        return;
    }
    let srv = Server::start(secure_cfg(), |_| Echo).unwrap();
    // An IPv6 port nobody listens on (bound, then released).
    let dead = std::net::UdpSocket::bind("[::1]:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let token = token_for(&[dead, srv.local_addr()], 77);
    let cfg = ClientConfig::new()
        .seed(77)
        .session(|c| c.handshake_timeout = Duration::from_millis(300))
        .connect_timeout(Duration::from_secs(10));
    let mut c = Client::connect_blocking(&token, cfg).expect("connects to the IPv4 address");
    assert_eq!(c.server_addr(), srv.local_addr());
    echo_all(&mut c, 0, &[message(1, 100)]);
    srv.shutdown().unwrap();
}

/// A member that failed to connect, replaced in place (`*set.get_mut(i) = client`, then
/// `set.mark_changed(i)`) by one
/// that connects: the set forgets the failure (before, `wait_connected` kept reporting the
/// replaced client's refusal), and a client added next, which may take the replaced client's
/// descriptor number, is served too.
#[test]
fn client_set_forgets_a_failed_member_replaced_in_place() {
    let srv = server(IoModel::PerCore, 1, BackendKind::Auto);
    let addr = srv.local_addr();
    let cfg = ClientConfig::new().seed(rand_seed(addr));
    let mut wrong_key = token(addr).clone();
    let params = TokenParams {
        protocol_id: PROTOCOL_ID,
        client_id: 9,
        server_addresses: &[addr],
        expires_unix: wrong_key.expires_unix,
        user_data: b"",
    };
    wrong_key =
        ConnectToken::seal(&TokenKey::from_bytes([9; 32]), &params, &mut rand::rng()).unwrap();
    let mut set = ClientSet::new();
    set.start_connecting(&[wrong_key], &cfg).unwrap();
    let refused = set.wait_connected(Duration::from_secs(10)).unwrap_err();
    assert_eq!(refused.index, Some(0), "{refused}");
    let fresh = Client::connect(&token(addr), cfg.clone().seed(rand_seed(addr) + 1)).unwrap();
    *set.get_mut(0).unwrap() = fresh;
    set.mark_changed(0);
    let c = Client::connect(&token(addr), cfg.clone().seed(rand_seed(addr) + 2)).unwrap();
    let b = set.push(c);
    set.wait_connected(Duration::from_secs(10))
        .expect("the replacement and the new member connect");
    assert_eq!(set.connected(), 2);
    echo_members(&mut set, [0, b], Instant::now() + Duration::from_secs(10));
    srv.shutdown().unwrap();
}

/// Members `ids` of `set` each send a message, and each gets its echo before `deadline`.
fn echo_members(set: &mut ClientSet, ids: [usize; 2], deadline: Instant) {
    for i in ids {
        set.send(i, 0, Bytes::from(message(i, 64))).unwrap();
    }
    let mut echoed = [false; 2];
    while !echoed.iter().all(|e| *e) {
        assert!(Instant::now() < deadline, "echoed {echoed:?}");
        set.step(Duration::from_millis(10)).unwrap();
        while let Some((i, e)) = set.poll_event() {
            if matches!(e, ClientEvent::Message { .. }) {
                echoed[usize::from(i == ids[1])] = true;
            }
        }
    }
}

/// A member that moves to a new socket closes its old descriptor, and a client added next may
/// get the same number (whether it does depends on the descriptors opened meanwhile): both
/// members keep being served.
#[test]
fn client_set_keeps_a_new_member_whose_descriptor_a_rebind_freed() {
    let srv = server(IoModel::PerCore, 1, BackendKind::Auto);
    let addr = srv.local_addr();
    let cfg = ClientConfig::new().seed(rand_seed(addr));
    let mut set = ClientSet::connect(&[token(addr)], &cfg, Duration::from_secs(10)).unwrap();
    set.get_mut(0).unwrap().rebind().unwrap();
    set.mark_changed(0);
    // Its old descriptor is free now: the next socket opened takes its number.
    let c = Client::connect(&token(addr), cfg.clone().seed(rand_seed(addr) + 1)).unwrap();
    let b = set.push(c);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !set.get(b).unwrap().is_connected() {
        assert!(Instant::now() < deadline, "the new member never connected");
        set.step(Duration::from_millis(10)).unwrap();
    }
    echo_members(&mut set, [0, b], deadline);
    srv.shutdown().unwrap();
}

/// A handler's send to a session of another worker that has ended meanwhile returns `Ok` (the
/// message was queued for that worker), and the other worker counts the drop.
#[test]
fn a_send_to_another_workers_ended_session_is_counted() {
    struct Relay(Arc<Mutex<Seen>>);
    impl Handler for Relay {
        fn on_connect(&mut self, _: &mut ServerContext, s: SessionId, _: &ricochet::Peer) {
            self.0.lock().unwrap().sessions.push(s);
        }
        fn on_message(&mut self, ctx: &mut ServerContext, from: SessionId, _: u8, data: Bytes) {
            // "relay": pass it to every other session the server saw, ended or not.
            let others: Vec<SessionId> = self.0.lock().unwrap().sessions.clone();
            for s in others.into_iter().filter(|&s| s != from) {
                // To another worker: `Ok` once queued for it, whatever becomes of it there.
                let _ = ctx.send(s, 0, data.clone());
            }
        }
        fn on_disconnect(&mut self, _: &mut ServerContext, s: SessionId, _: CloseReason, _: bool) {
            self.0.lock().unwrap().gone.push(s);
        }
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let handlers = seen.clone();
    let (srv, mut a, mut b, deadline) =
        two_clients_on_two_workers(&seen, move |_| Relay(handlers.clone()));
    b.close();
    while seen.lock().unwrap().gone.is_empty() {
        assert!(Instant::now() < deadline, "the server saw the close");
        b.step(Duration::from_millis(5)).unwrap();
        a.step(Duration::from_millis(5)).unwrap();
    }
    assert_eq!(srv.remote_send_drops(), 0);
    a.send(0, Bytes::from_static(b"relay")).unwrap();
    while srv.remote_send_drops() == 0 {
        assert!(Instant::now() < deadline, "the drop was not counted");
        a.step(Duration::from_millis(5)).unwrap();
    }
    assert_eq!(srv.remote_send_drops(), 1);
    srv.shutdown().unwrap();
}

/// A handler that panics ends its worker; the sessions that worker held stop counting against
/// the server's limits (`session_count`), while the other worker's stay.
#[test]
fn a_dead_workers_sessions_leave_the_server_count() {
    struct Fragile(Arc<Mutex<Seen>>);
    impl Handler for Fragile {
        fn on_connect(&mut self, _: &mut ServerContext, s: SessionId, _: &ricochet::Peer) {
            self.0.lock().unwrap().sessions.push(s);
        }
        fn on_message(&mut self, _: &mut ServerContext, _: SessionId, _: u8, data: Bytes) {
            assert!(data != "boom", "handler gave up on boom");
        }
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let handlers = seen.clone();
    let (srv, mut a, mut b, deadline) =
        two_clients_on_two_workers(&seen, move |_| Fragile(handlers.clone()));
    assert_eq!(srv.session_count(), 2);
    a.send(0, Bytes::from_static(b"boom")).unwrap();
    while srv.is_running() {
        assert!(Instant::now() < deadline, "the worker did not end");
        a.step(Duration::from_millis(5)).unwrap();
    }
    // B stays connected (its client keeps running) and keeps counting; A's session went with
    // its worker.
    while srv.session_count() != 1 {
        assert!(
            Instant::now() < deadline,
            "the dead worker's session still counts: {}",
            srv.session_count()
        );
        b.step(Duration::from_millis(5)).unwrap();
    }
    assert!(b.is_connected());
    assert!(srv.shutdown().is_err(), "shutdown reports the panic");
}

/// The sessions a test handler saw connect and end.
#[derive(Default)]
struct Seen {
    sessions: Vec<SessionId>,
    gone: Vec<SessionId>,
}

/// A two-worker token server running `make`'s handlers, which record the sessions that connect
/// in `seen`, and two clients connected to it, placed one on each worker: (server, client,
/// client, a deadline 10 s away for the rest of the test).
fn two_clients_on_two_workers<H: Handler>(
    seen: &Mutex<Seen>,
    make: impl FnMut(usize) -> H,
) -> (Server, Client, Client, Instant) {
    let mut cfg = secure_cfg();
    cfg.udp.io_threads = 2;
    cfg.seed = Some(7);
    let srv = Server::start(cfg, make).unwrap();
    let addr = srv.local_addr();
    let mut a = client(addr);
    let cfg_b = ClientConfig::new()
        .seed(rand_seed(addr) + 1)
        .connect_timeout(Duration::from_secs(10));
    let mut b = Client::connect_blocking(&token_for(&[addr], rand_seed(addr) + 1), cfg_b)
        .expect("connects");
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.lock().unwrap().sessions.len() < 2 {
        assert!(Instant::now() < deadline, "the server saw both sessions");
        a.step(Duration::from_millis(5)).unwrap();
        b.step(Duration::from_millis(5)).unwrap();
    }
    let workers: Vec<u32> = seen
        .lock()
        .unwrap()
        .sessions
        .iter()
        .map(|s| s.worker)
        .collect();
    assert_ne!(
        workers[0], workers[1],
        "placement spreads two sessions over two workers"
    );
    (srv, a, b, deadline)
}
