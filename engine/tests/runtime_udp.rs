//! The raw-UDP runtime over real loopback sockets: both IO models, 1 and 2 workers, every
//! backend this host has; shutdown drains what was received.

use std::collections::HashSet;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ricochet::platform::{BackendKind, Capabilities};
use ricochet::runtime::{
    DatagramHandler, IdleStrategy, IoModel, UdpContext, UdpServer, UdpServerConfig,
};

struct Echo;
impl DatagramHandler for Echo {
    fn on_datagram(&mut self, ctx: &mut UdpContext<'_>, from: SocketAddr, data: &[u8]) {
        ctx.send(from, data).expect("echo reply queued");
    }
}

/// Backends that work on this host (uring and mmsg on Linux, kqueue on macOS).
fn local_backends() -> Vec<BackendKind> {
    let caps: &Capabilities = ricochet::platform::probe();
    caps.backends()
}

fn config(model: IoModel, workers: usize, backend: BackendKind) -> UdpServerConfig {
    let mut cfg = UdpServerConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.io_model = model;
    cfg.io_threads = workers;
    cfg.backend.kind = backend;
    cfg.idle = IdleStrategy::Balanced;
    cfg
}

/// Several clients (distinct source ports, so per-core hashing spreads them) each send
/// `per_client` numbered datagrams and expect every echo back, intact and exactly once.
fn echo_round(server: &UdpServer, clients: usize, per_client: u32) {
    let addr = server.local_addr();
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            std::thread::spawn(move || {
                let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
                sock.set_read_timeout(Some(Duration::from_millis(200)))
                    .unwrap();
                let mut seen = HashSet::new();
                let mut buf = [0u8; 2048];
                let deadline = Instant::now() + Duration::from_secs(20);
                // Window of 8 in flight, resend what is missing after a timeout: loopback can
                // drop under load, and this test checks correctness, not loss.
                let mut next = 0u32;
                while (seen.len() as u32) < per_client {
                    assert!(Instant::now() < deadline, "client {c} timed out");
                    while next < per_client && next - (seen.len() as u32) < 8 {
                        let msg = payload(c as u32, next);
                        sock.send_to(&msg, addr).unwrap();
                        next += 1;
                    }
                    match sock.recv_from(&mut buf) {
                        Ok((n, from)) => {
                            assert_eq!(from, addr, "reply from the server's address");
                            let seq = u32::from_le_bytes(buf[4..8].try_into().unwrap());
                            assert_eq!(&buf[..n], &payload(c as u32, seq)[..], "echo intact");
                            seen.insert(seq);
                        }
                        Err(_) => {
                            // Timed out: resend everything not yet echoed.
                            for s in 0..next {
                                if !seen.contains(&s) {
                                    sock.send_to(&payload(c as u32, s), addr).unwrap();
                                }
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("client thread");
    }
}

fn payload(client: u32, seq: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(100);
    v.extend_from_slice(&client.to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend((0..92u32).map(|i| (i.wrapping_mul(31) ^ seq ^ client) as u8));
    v
}

#[test]
fn both_io_models_echo_with_one_and_two_workers_on_every_backend() {
    for backend in local_backends() {
        for model in [IoModel::PerCore, IoModel::Shared] {
            for workers in [1, 2] {
                let server = UdpServer::start(config(model, workers, backend), |_| Echo)
                    .unwrap_or_else(|e| panic!("{backend} {model} x{workers}: {e}"));
                assert_eq!(server.workers(), workers);
                assert_eq!(server.backend_kind(), backend);
                echo_round(&server, 4, 200);
                let counters = server.shutdown().unwrap();
                assert_eq!(counters.len(), workers);
                let total_in: u64 = counters.iter().map(|c| c.datagrams_in).sum();
                assert!(
                    total_in >= 800,
                    "{backend} {model} x{workers}: {total_in} in"
                );
            }
        }
    }
}

#[test]
fn ipv6_echo() {
    let mut cfg = config(IoModel::PerCore, 1, BackendKind::Auto);
    cfg.bind = "[::1]:0".parse().unwrap();
    let server = UdpServer::start(cfg, |_| Echo).unwrap();
    let sock = UdpSocket::bind("[::1]:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    sock.send_to(b"hello6", server.local_addr()).unwrap();
    let mut buf = [0u8; 64];
    let (n, from) = sock.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"hello6");
    assert_eq!(from, server.local_addr());
    server.shutdown().unwrap();
}

/// A handler that counts what it got and replies; the test stops the server right after the
/// server has *received* everything and checks that every reply still comes out.
struct CountingEcho(Arc<AtomicU64>);
impl DatagramHandler for CountingEcho {
    fn on_datagram(&mut self, ctx: &mut UdpContext<'_>, from: SocketAddr, data: &[u8]) {
        ctx.send(from, data).unwrap();
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn shutdown_joins_every_worker_and_flushes_replies_to_what_was_received() {
    for backend in local_backends() {
        for model in [IoModel::PerCore, IoModel::Shared] {
            let got = Arc::new(AtomicU64::new(0));
            let g = got.clone();
            let server =
                UdpServer::start(config(model, 2, backend), move |_| CountingEcho(g.clone()))
                    .unwrap();
            let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            const N: u64 = 64;
            for i in 0..N {
                sock.send_to(&i.to_le_bytes(), server.local_addr()).unwrap();
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while got.load(Ordering::SeqCst) < N {
                assert!(
                    Instant::now() < deadline,
                    "server did not receive all datagrams"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            let counters = server.shutdown().unwrap();
            assert_eq!(counters.len(), 2, "both workers joined");
            let mut replies = HashSet::new();
            let mut buf = [0u8; 16];
            while replies.len() < N as usize {
                let (n, _) = sock
                    .recv_from(&mut buf)
                    .unwrap_or_else(|e| panic!("{backend} {model}: reply missing: {e}"));
                replies.insert(u64::from_le_bytes(buf[..n].try_into().unwrap()));
            }
            assert_eq!(replies.len(), N as usize);
        }
    }
}

struct Ticker(Arc<AtomicU64>);
impl DatagramHandler for Ticker {
    fn on_datagram(&mut self, _: &mut UdpContext<'_>, _: SocketAddr, _: &[u8]) {}
    fn on_tick(&mut self, _ctx: &mut UdpContext<'_>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn tick_hook_runs_while_parked() {
    let ticks = Arc::new(AtomicU64::new(0));
    let t = ticks.clone();
    let mut cfg = config(IoModel::PerCore, 1, BackendKind::Auto);
    cfg.idle = IdleStrategy::Park;
    cfg.tick = Some(Duration::from_millis(5));
    let server = UdpServer::start(cfg, move |_| Ticker(t.clone())).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while ticks.load(Ordering::SeqCst) < 3 {
        assert!(Instant::now() < deadline, "ticks did not fire");
        std::thread::sleep(Duration::from_millis(5));
    }
    server.shutdown().unwrap();
}

/// Echoes, and counts ticks, so a test can tell a datagram's reply from the tick it waited for.
struct TickEcho(Arc<AtomicU64>);
impl DatagramHandler for TickEcho {
    fn on_datagram(&mut self, ctx: &mut UdpContext<'_>, from: SocketAddr, data: &[u8]) {
        let mut reply = data.to_vec();
        reply.extend_from_slice(&self.0.load(Ordering::SeqCst).to_le_bytes());
        ctx.send(from, &reply).expect("echo reply queued");
    }
    fn on_tick(&mut self, _ctx: &mut UdpContext<'_>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn tick_strategy_reads_datagrams_once_per_tick_on_every_backend() {
    for backend in local_backends() {
        let ticks = Arc::new(AtomicU64::new(0));
        let t = ticks.clone();
        let mut cfg = config(IoModel::PerCore, 1, backend);
        cfg.idle = IdleStrategy::Tick;
        cfg.tick = Some(Duration::from_millis(40));
        let server = UdpServer::start(cfg, move |_| TickEcho(t.clone())).unwrap();
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // 30 datagrams over about 90 ms: a worker that woke for each would turn 30 times.
        const N: u32 = 30;
        let sending = Instant::now();
        for i in 0..N {
            sock.send_to(&i.to_le_bytes(), server.local_addr()).unwrap();
            std::thread::sleep(Duration::from_millis(3));
        }
        let spread = sending.elapsed();
        let mut buf = [0u8; 64];
        let mut seen = HashSet::new();
        let mut tick_of = Vec::new();
        while seen.len() < N as usize {
            let (n, _) = sock.recv_from(&mut buf).expect("every echo comes back");
            assert_eq!(n, 12, "{backend}: echo plus the tick count");
            seen.insert(u32::from_le_bytes(buf[..4].try_into().unwrap()));
            tick_of.push(u64::from_le_bytes(buf[4..12].try_into().unwrap()));
        }
        let counters = server.shutdown().unwrap();
        let turns: u64 = counters.iter().map(|c| c.loop_turns).sum();
        let ticks_run: u64 = counters.iter().map(|c| c.ticks).sum();
        // Each tick wakes the worker once and drains in a turn or two; stray timers and the
        // stop add a few. Waking per datagram would be at least N turns.
        assert!(
            turns < u64::from(N) && turns <= 3 * ticks_run + 6,
            "{backend}: {turns} loop turns for {ticks_run} ticks and {N} datagrams"
        );
        // Datagrams were read in batches right after ticks: one group per tick they spanned.
        tick_of.dedup();
        let spanned = (spread.as_millis() / 40) as usize + 2;
        assert!(
            tick_of.len() <= spanned,
            "{backend}: replies came in {} groups over {spread:?}: {tick_of:?}",
            tick_of.len()
        );
    }
}

/// Records the tick count at which each datagram was read.
struct TickRecorder {
    ticks: u64,
    read_at: Arc<std::sync::Mutex<Vec<u64>>>,
}
impl DatagramHandler for TickRecorder {
    fn on_datagram(&mut self, _: &mut UdpContext<'_>, _: SocketAddr, _: &[u8]) {
        if let Ok(mut v) = self.read_at.lock() {
            v.push(self.ticks);
        }
    }
    fn on_tick(&mut self, _ctx: &mut UdpContext<'_>) {
        self.ticks += 1;
    }
}

#[test]
fn tick_strategy_drains_more_than_a_receive_batch_per_tick_on_every_backend() {
    for backend in local_backends() {
        let read_at = Arc::new(std::sync::Mutex::new(Vec::new()));
        let r = read_at.clone();
        let mut cfg = config(IoModel::PerCore, 1, backend);
        cfg.idle = IdleStrategy::Tick;
        cfg.tick = Some(Duration::from_millis(100));
        let server = UdpServer::start(cfg, move |_| TickRecorder {
            ticks: 0,
            read_at: r.clone(),
        })
        .unwrap();
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        // Many times the backend's receive batch between two ticks, well within the socket
        // buffer: every one is read at the next tick, none waits for later ticks.
        const N: usize = 1_000;
        for i in 0..N as u32 {
            sock.send_to(&i.to_le_bytes(), server.local_addr()).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while read_at.lock().unwrap().len() < N {
            assert!(
                Instant::now() < deadline,
                "{backend}: {} of {N} datagrams read",
                read_at.lock().unwrap().len()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        server.shutdown().unwrap();
        let mut ticks = read_at.lock().unwrap().clone();
        ticks.dedup();
        // Two groups at most: the sends may straddle one tick.
        assert!(
            ticks.len() <= 2,
            "{backend}: {N} datagrams sent at once were read over ticks {ticks:?}"
        );
    }
}

#[test]
fn tick_strategy_stops_promptly_with_a_long_tick() {
    let ticks = Arc::new(AtomicU64::new(0));
    let t = ticks.clone();
    let mut cfg = config(IoModel::PerCore, 2, BackendKind::Auto);
    cfg.idle = IdleStrategy::Tick;
    cfg.tick = Some(Duration::from_secs(30));
    let server = UdpServer::start(cfg, move |_| TickEcho(t.clone())).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let began = Instant::now();
    server.shutdown().unwrap();
    // The stop unparks the sleeping workers; without that it would wait out the 30 s tick.
    assert!(
        began.elapsed() < Duration::from_secs(10),
        "stop took {:?}",
        began.elapsed()
    );
}

#[test]
fn bad_configuration_is_a_clear_error() {
    let mut cfg = config(IoModel::PerCore, 1, BackendKind::Auto);
    cfg.send_batch = 0;
    let err = UdpServer::start(cfg, |_| Echo).unwrap_err();
    assert!(err.to_string().contains("send_batch"), "{err}");
    assert!("sideways".parse::<IoModel>().is_err());
    assert_eq!("per-core".parse::<IoModel>().unwrap(), IoModel::PerCore);
    assert_eq!("spin".parse::<IdleStrategy>().unwrap(), IdleStrategy::Spin);
    assert_eq!("tick".parse::<IdleStrategy>().unwrap(), IdleStrategy::Tick);
    let mut cfg = config(IoModel::PerCore, 1, BackendKind::Auto);
    cfg.idle = IdleStrategy::Tick;
    let err = UdpServer::start(cfg, |_| Echo).unwrap_err();
    assert!(err.to_string().contains("UdpServerConfig::tick"), "{err}");
}

#[test]
fn oversize_reply_is_refused_and_the_next_one_works() {
    struct Big;
    impl DatagramHandler for Big {
        fn on_datagram(&mut self, ctx: &mut UdpContext<'_>, from: SocketAddr, data: &[u8]) {
            let too_big = vec![0u8; 65_508];
            let err = ctx.send(from, &too_big).unwrap_err();
            assert!(err.to_string().contains("65507"), "{err}");
            ctx.send(from, data).unwrap();
        }
    }
    let server = UdpServer::start(config(IoModel::PerCore, 1, BackendKind::Auto), |_| Big).unwrap();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    sock.send_to(b"x", server.local_addr()).unwrap();
    let mut buf = [0u8; 8];
    let (n, _) = sock.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"x");
    let counters = server.shutdown().unwrap();
    assert_eq!(counters[0].send_errors, 1);
}

#[cfg(target_os = "linux")]
#[test]
fn per_core_spreads_clients_by_source_port() {
    // Eight clients on consecutive ports: with source-port steering each of the two workers
    // serves exactly four of them, so both see the same number of datagrams.
    let mut cfg = config(IoModel::PerCore, 2, BackendKind::Auto);
    cfg.steer_by_source_port = true; // without it the kernel's hash split these 60:20 or 50:30
    let server = UdpServer::start(cfg, |_| Echo).unwrap();
    let mut socks = Vec::new();
    while socks.len() < 8 {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = s.local_addr().unwrap().port();
        // Keep an even split: take ports alternating in parity.
        if usize::from(port % 2) == socks.len() % 2 {
            socks.push(s);
        }
    }
    for s in &socks {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        for i in 0..10u8 {
            s.send_to(&[i], server.local_addr()).unwrap();
            let mut b = [0u8; 4];
            s.recv_from(&mut b).unwrap();
        }
    }
    let counters = server.shutdown().unwrap();
    let ins: Vec<u64> = counters.iter().map(|c| c.datagrams_in).collect();
    assert_eq!(ins, vec![40, 40], "datagrams per worker");
}

/// GSO coalescing of the replies and GRO receive are on by default; with them on or off every
/// datagram is echoed intact, and the counters count datagrams (a coalesced run is not one).
#[test]
fn echo_with_gso_and_gro_on_and_off() {
    for backend in local_backends() {
        for offload in [true, false] {
            let mut cfg = config(IoModel::PerCore, 1, backend);
            assert!(cfg.gso && cfg.backend.gro, "on by default");
            cfg.gso = offload;
            cfg.backend.gro = offload;
            let server = UdpServer::start(cfg, |_| Echo)
                .unwrap_or_else(|e| panic!("{backend} offload={offload}: {e}"));
            echo_round(&server, 3, 300);
            let counters = server.shutdown().unwrap();
            let total_in: u64 = counters.iter().map(|c| c.datagrams_in).sum();
            let total_out: u64 = counters.iter().map(|c| c.datagrams_out).sum();
            assert!(
                total_in >= 900,
                "{backend} offload={offload}: {total_in} in"
            );
            assert_eq!(
                total_out, total_in,
                "{backend} offload={offload}: one reply per datagram"
            );
        }
    }
}

/// A handler that panics ends its worker: the server says so (`is_running`), and `shutdown`
/// returns the panic's message.
#[test]
fn a_panicking_handler_is_reported() {
    struct Fragile;
    impl DatagramHandler for Fragile {
        fn on_datagram(&mut self, ctx: &mut UdpContext<'_>, from: SocketAddr, data: &[u8]) {
            assert!(data != b"boom", "handler gave up on boom");
            ctx.send(from, data).expect("echo reply queued");
        }
    }
    let backend = local_backends()[0];
    let server = UdpServer::start(config(IoModel::PerCore, 1, backend), |_| Fragile).unwrap();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    sock.send_to(b"fine", server.local_addr()).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(sock.recv(&mut buf).unwrap(), 4);
    assert!(server.is_running());
    sock.send_to(b"boom", server.local_addr()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.is_running() {
        assert!(Instant::now() < deadline, "the worker did not end");
        std::thread::sleep(Duration::from_millis(10));
    }
    match server.shutdown() {
        Err(ricochet::runtime::RuntimeError::WorkerPanicked { worker, message }) => {
            assert_eq!(worker, 0);
            assert!(message.contains("handler gave up on boom"), "{message}");
        }
        other => panic!("expected the worker's panic, got {other:?}"),
    }
}
