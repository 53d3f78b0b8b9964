//! Draining a server with clients connected (loopback): no one new is admitted (a token
//! client moves on to the next server its token lists), the sessions keep exchanging with
//! nothing reliable lost, and the server stops when the last session closes or at the grace.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ricochet::proto::token::{ConnectToken, TokenKey, TokenParams};
use ricochet::runtime::{Handler, Server, ServerConfig, ServerContext, SessionId};
use ricochet::{Client, ClientConfig, ClientError, ClientEvent, CloseReason, Peer};

const PROTOCOL_ID: u64 = 0x6472_6169;

fn key() -> TokenKey {
    TokenKey::from_bytes([0x24; 32])
}

fn token(servers: &[SocketAddr], client_id: u64) -> ConnectToken {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let params = TokenParams {
        protocol_id: PROTOCOL_ID,
        client_id,
        server_addresses: servers,
        expires_unix: now + 120,
        user_data: b"",
    };
    ConnectToken::seal(&key(), &params, &mut rand::rng()).unwrap()
}

#[derive(Clone, Default)]
struct Seen {
    connects: Arc<AtomicUsize>,
    drained: Arc<AtomicBool>,
}

struct Echo(Seen);
impl Handler for Echo {
    fn on_connect(&mut self, _: &mut ServerContext<'_>, _: SessionId, _: &Peer) {
        self.0.connects.fetch_add(1, Ordering::SeqCst);
    }
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
        ctx.send(s, channel, data).expect("echo queued");
    }
    fn on_drain(&mut self, _: &mut ServerContext<'_>) {
        self.0.drained.store(true, Ordering::SeqCst);
    }
}

fn server(seen: &Seen) -> Server {
    let cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap())
        .tokens(key(), PROTOCOL_ID)
        .workers(1)
        .max_sessions(1_000);
    let seen = seen.clone();
    Server::start(cfg, move |_| Echo(seen.clone())).unwrap()
}

fn connect(servers: &[SocketAddr], id: u64) -> Client {
    let cfg = ClientConfig::new().connect_timeout(Duration::from_secs(10));
    Client::connect_blocking(&token(servers, id), cfg).expect("connects")
}

/// Per client: messages sent, echoes received (checked in order on the reliable channel).
struct Tally {
    sent: Vec<u32>,
    received: Vec<u32>,
    closed: Vec<Option<CloseReason>>,
}

impl Tally {
    fn new(n: usize) -> Self {
        Tally {
            sent: vec![0; n],
            received: vec![0; n],
            closed: vec![None; n],
        }
    }

    fn poll(&mut self, clients: &mut [Client]) {
        for (i, c) in clients.iter_mut().enumerate() {
            if self.closed[i].is_some() {
                continue;
            }
            for ev in c.update().expect("update") {
                match ev {
                    ClientEvent::Message { data, .. } => {
                        let seq = u32::from_le_bytes(data[..4].try_into().unwrap());
                        assert_eq!(seq, self.received[i], "client {i}: in order, none lost");
                        self.received[i] += 1;
                    }
                    ClientEvent::Disconnected { reason, .. } => self.closed[i] = Some(reason),
                    _ => {}
                }
            }
        }
    }

    /// Every client sends one reliable message per round and gets its echo back.
    fn rounds(&mut self, clients: &mut [Client], rounds: usize) {
        for _ in 0..rounds {
            for (i, c) in clients.iter_mut().enumerate() {
                let mut msg = self.sent[i].to_le_bytes().to_vec();
                msg.resize(64, 0);
                c.send(0, msg).expect("send");
                self.sent[i] += 1;
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.sent != self.received {
                assert!(Instant::now() < deadline, "echoes missing");
                self.poll(clients);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

#[test]
fn draining_admits_no_one_keeps_sessions_and_stops_at_the_last_close() {
    let (seen_a, seen_b) = (Seen::default(), Seen::default());
    let a = server(&seen_a);
    let b = server(&seen_b);
    let (addr_a, addr_b) = (a.local_addr(), b.local_addr());
    let mut clients: Vec<Client> = (0..100).map(|i| connect(&[addr_a, addr_b], i)).collect();
    assert!(clients.iter().all(|c| c.server_addr() == addr_a));
    assert_eq!(a.session_count(), 100);
    let mut tally = Tally::new(clients.len());
    tally.rounds(&mut clients, 3);

    assert!(a.health().ready);
    let grace = Duration::from_secs(30);
    a.start_drain();
    assert!(!a.health().ready, "not ready once draining");
    let drain = std::thread::spawn(move || {
        let started = Instant::now();
        let counters = a.drain(grace);
        (started.elapsed(), counters)
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while !seen_a.drained.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "on_drain not called");
        tally.poll(&mut clients);
        std::thread::sleep(Duration::from_millis(1));
    }

    // A newcomer whose token lists both servers is refused by A and lands on B.
    let newcomer = connect(&[addr_a, addr_b], 1_000);
    assert_eq!(newcomer.server_addr(), addr_b);
    assert_eq!(
        seen_a.connects.load(Ordering::SeqCst),
        100,
        "A admitted no one new"
    );
    assert_eq!(seen_b.connects.load(Ordering::SeqCst), 1);
    // One whose token lists A alone learns why: `Draining`, not `Shutdown`.
    let cfg = ClientConfig::new().connect_timeout(Duration::from_secs(10));
    match Client::connect_blocking(&token(&[addr_a], 1_001), cfg) {
        Err(ClientError::Refused(reason)) => assert_eq!(reason, CloseReason::Draining),
        other => panic!("expected a Draining refusal, got {:?}", other.map(|_| ())),
    }

    // Every session keeps exchanging while the server drains.
    tally.rounds(&mut clients, 5);
    assert!(tally.closed.iter().all(Option::is_none));
    assert!(
        !drain.is_finished(),
        "sessions still open: the drain goes on"
    );

    // The matches end one by one; the server stops after the last.
    for c in &mut clients {
        c.close();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !drain.is_finished() {
        assert!(
            Instant::now() < deadline,
            "drain did not end after the last close"
        );
        tally.poll(&mut clients);
        std::thread::sleep(Duration::from_millis(2));
    }
    let (took, counters) = drain.join().unwrap();
    counters.expect("clean stop");
    assert!(
        took < grace,
        "stopped at the last close ({took:?}), not at the grace"
    );
    assert_eq!(tally.sent, tally.received, "0 reliable messages lost");
    println!(
        "drain: 100 clients, {} messages each echoed in order; stopped {took:?} after the drain began",
        tally.sent[0]
    );
    drop(newcomer);
    b.shutdown().unwrap();
}

#[test]
fn a_drain_closes_the_last_sessions_at_the_grace_and_tells_their_clients() {
    let seen = Seen::default();
    let a = server(&seen);
    let addr = a.local_addr();
    let mut clients: Vec<Client> = (0..10).map(|i| connect(&[addr], i)).collect();
    let mut tally = Tally::new(clients.len());
    tally.rounds(&mut clients, 2);
    let grace = Duration::from_millis(1_500);
    let drain = std::thread::spawn(move || {
        let started = Instant::now();
        let counters = a.drain(grace);
        (started.elapsed(), counters)
    });
    let deadline = Instant::now() + Duration::from_secs(15);
    while !drain.is_finished() || tally.closed.iter().any(Option::is_none) {
        assert!(
            Instant::now() < deadline,
            "clients not told: {:?}",
            tally.closed
        );
        tally.poll(&mut clients);
        std::thread::sleep(Duration::from_millis(2));
    }
    let (took, counters) = drain.join().unwrap();
    counters.expect("clean stop");
    assert!(took >= grace, "stopped at the grace ({took:?})");
    assert!(
        tally
            .closed
            .iter()
            .all(|r| *r == Some(CloseReason::Shutdown)),
        "{:?}",
        tally.closed
    );
    assert_eq!(tally.sent, tally.received);
}
