//! Connect tokens on the real runtime, over loopback: refused tokens and application refusals
//! reach the client as clear errors, `on_connect` sees who connected, a spoofed hello flood
//! from the player's own IP does not stop the player, and a restarted server resets its old
//! sessions within a round trip of the client's next packet.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use ricochet::proto::token::{ConnectToken, TokenKey, TokenParams};
use ricochet::proto::{Endpoint, EndpointConfig};
use ricochet::runtime::{Handler, Server, ServerConfig, ServerContext, SessionId};
use ricochet::{Client, ClientConfig, ClientError, ClientEvent, CloseReason, Peer, Refusal};

const PROTOCOL_ID: u64 = 0x746f_6b65_6e73;

fn key() -> TokenKey {
    TokenKey::from_bytes([0x24; 32])
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn token_with(client_id: u64, servers: &[SocketAddr], expires_unix: u64) -> ConnectToken {
    let params = TokenParams {
        protocol_id: PROTOCOL_ID,
        client_id,
        server_addresses: servers,
        expires_unix,
        user_data: b"role=medic",
    };
    ConnectToken::seal(&key(), &params, &mut rand::rng()).unwrap()
}

fn token(client_id: u64, server: SocketAddr) -> ConnectToken {
    token_with(client_id, &[server], unix_now() + 60)
}

/// Echoes, refuses client 13 with a message, and records every peer it connected.
#[derive(Clone, Default)]
struct Gate {
    connected: Arc<Mutex<Vec<(SessionId, Peer)>>>,
}

impl Handler for Gate {
    fn on_accept(&mut self, _: &mut ServerContext<'_>, peer: &Peer) -> Result<(), Refusal> {
        if peer.client_id == Some(13) {
            return Err(Refusal::new(7, "down for maintenance"));
        }
        Ok(())
    }

    fn on_connect(&mut self, _: &mut ServerContext<'_>, s: SessionId, peer: &Peer) {
        self.connected.lock().unwrap().push((s, peer.clone()));
    }

    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
        let _ = ctx.send(s, channel, data);
    }
}

fn secure_cfg(bind: &str) -> ServerConfig {
    ServerConfig::new(bind.parse().unwrap())
        .tokens(key(), PROTOCOL_ID)
        .workers(2)
}

fn client_cfg() -> ClientConfig {
    let mut cfg = ClientConfig::default();
    cfg.endpoint.connection = Arc::new(
        ricochet::Config::default().with(|c| c.handshake_timeout = Duration::from_secs(3)),
    );
    cfg
}

fn connect(token: &ConnectToken) -> Result<Client, ClientError> {
    Client::connect_blocking(token, client_cfg().connect_timeout(Duration::from_secs(5)))
}

/// Send `msg` and wait for its echo.
fn echo(c: &mut Client, msg: &'static [u8]) {
    c.send(0, msg).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        assert!(Instant::now() < deadline, "no echo");
        c.wait(Duration::from_millis(5)).unwrap();
        if let Some(ClientEvent::Message { data, .. }) = c.poll_event() {
            assert_eq!(&data[..], msg);
            return;
        }
    }
}

#[test]
fn the_used_token_capacity_reaches_the_workers_shared_table() {
    // Room for one used token, over both workers: the second player's token pushes the first
    // one's out, so the first token gets in again (with the default room it would be refused),
    // and is then the one held.
    let srv = Server::start(secure_cfg("127.0.0.1:0").used_token_capacity(1), |_| {
        Gate::default()
    })
    .unwrap();
    let addr = srv.local_addr();
    let first = token_with(21, &[addr], unix_now() + 30);
    let second = token_with(22, &[addr], unix_now() + 60);
    let _a = connect(&first).expect("first player");
    let _b = connect(&second).expect("second player");
    let _again = connect(&first).expect("the forgotten token gets in again");
    match connect(&first) {
        Err(ClientError::Refused(reason)) => assert_eq!(reason, CloseReason::TokenReused),
        other => panic!("expected TokenReused, got {other:?}"),
    }
    srv.shutdown().unwrap();
}

#[test]
fn refused_tokens_and_refused_players_get_clear_errors() {
    let gate = Gate::default();
    let g = gate.clone();
    let srv = Server::start(secure_cfg("127.0.0.1:0"), move |_| g.clone()).unwrap();
    let addr = srv.local_addr();

    // A good token gets in, and on_connect sees who it names.
    let mut ok = connect(&token(1, addr)).expect("connects");
    echo(&mut ok, b"hello");
    {
        let seen = gate.connected.lock().unwrap();
        assert_eq!(seen.len(), 1);
        let peer = &seen[0].1;
        assert_eq!(peer.client_id, Some(1));
        assert_eq!(&peer.user_data[..], b"role=medic");
        assert_eq!(peer.address.port(), ok.local_addr().port());
    }

    let refused = |t: &ConnectToken| match connect(t) {
        Err(ClientError::Refused(reason)) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    };
    // Expired.
    let expired = token_with(2, &[addr], unix_now() - 1);
    assert_eq!(refused(&expired), CloseReason::TokenExpired);
    // Reused: the same token a second time, from another client.
    let once = token(3, addr);
    let _first = connect(&once).expect("first use connects");
    assert_eq!(refused(&once), CloseReason::TokenReused);
    // Sealed with another key.
    let params = TokenParams {
        protocol_id: PROTOCOL_ID,
        client_id: 4,
        server_addresses: &[addr],
        expires_unix: unix_now() + 60,
        user_data: b"",
    };
    let foreign =
        ConnectToken::seal(&TokenKey::from_bytes([1; 32]), &params, &mut rand::rng()).unwrap();
    assert_eq!(refused(&foreign), CloseReason::TokenInvalid);
    // The application says no, with a reason the player reads.
    match connect(&token(13, addr)) {
        Err(ClientError::Rejected { code, message }) => {
            assert_eq!(code, 7);
            assert_eq!(&message[..], b"down for maintenance");
            let text = ClientError::Rejected { code, message }.to_string();
            assert!(text.contains("maintenance"), "{text}");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    let err = refused(&expired);
    assert!(
        ClientError::Refused(err).to_string().contains("expired"),
        "the error says why"
    );
    srv.shutdown().unwrap();

    // A server that believes clients reach it elsewhere refuses tokens for this address.
    let cfg = secure_cfg("127.0.0.1:0").public_address("127.0.0.2:7777".parse().unwrap());
    let srv = Server::start(cfg, |_| Gate::default()).unwrap();
    assert_eq!(
        refused(&token(5, srv.local_addr())),
        CloseReason::TokenWrongServer
    );
    srv.shutdown().unwrap();

    // A server bound to every address must be told its public one.
    let err = Server::start(secure_cfg("0.0.0.0:0"), |_| Gate::default()).unwrap_err();
    assert!(err.to_string().contains("public_address"), "{err}");

    // A used-token table of no room is a configuration error that names the setting, and so
    // is a used-token table for a server that takes no tokens.
    let cfg = secure_cfg("127.0.0.1:0").used_token_capacity(0);
    let err = Server::start(cfg, |_| Gate::default()).unwrap_err();
    assert!(err.to_string().contains("used_token_capacity"), "{err}");
    let cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap())
        .insecure()
        .used_token_capacity(10);
    let err = Server::start(cfg, |_| Gate::default()).unwrap_err();
    assert!(err.to_string().contains("used_token_capacity"), "{err}");
}

/// Datagrams a flooder sends, from its own socket on the player's IP (127.0.0.1): replays of a
/// real hello it captured, and hellos whose token does not open.
fn flood(target: SocketAddr, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>) -> JoinHandle<()> {
    let now = Instant::now();
    let mut ep = Endpoint::new(EndpointConfig::default(), now, 5);
    ep.connect_with_token(now, &token(66, target));
    let mut buf = vec![0u8; 2048];
    let t = ep.poll_transmit(now, &mut buf).expect("a hello");
    let replay = buf[..t.size].to_vec();
    let mut garbage = replay.clone();
    garbage[300] ^= 0x55;
    std::thread::spawn(move || {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        // About 5,000 hellos a second, in bursts every millisecond.
        while !stop.load(Ordering::Relaxed) {
            for _ in 0..5 {
                let _ = sock.send_to(&replay, target);
                let _ = sock.send_to(&garbage, target);
            }
            sent.fetch_add(10, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(2));
        }
    })
}

#[test]
fn a_spoofed_hello_flood_from_the_players_ip_does_not_stop_the_player() {
    let srv = Server::start(secure_cfg("127.0.0.1:0"), |_| Gate::default()).unwrap();
    let addr = srv.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let flooder = flood(addr, stop.clone(), sent.clone());
    // Let the flood run past the old per-IP budget (64 handshakes per second) first: 600
    // hellos (counted, not timed, so a slow host does not shorten the flood).
    let deadline = Instant::now() + Duration::from_secs(10);
    while sent.load(Ordering::Relaxed) < 600 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = sent.load(Ordering::Relaxed);
    for id in [100, 101] {
        let t0 = Instant::now();
        let mut c = connect(&token(id, addr)).unwrap_or_else(|e| panic!("player {id}: {e}"));
        echo(&mut c, b"still here");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    }
    // The flood goes on past the connects (it ran throughout: a fast connect may fit between
    // two of its bursts, so the count during it can be zero).
    let deadline = Instant::now() + Duration::from_secs(10);
    while sent.load(Ordering::Relaxed) < before + 20 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    let during = sent.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    flooder.join().unwrap();
    assert!(
        sent.load(Ordering::Relaxed) >= 600,
        "the flood ran: {} hellos",
        sent.load(Ordering::Relaxed)
    );
    assert!(
        during >= 20,
        "the flood went on while the players connected"
    );
    srv.shutdown().unwrap();
}

/// A loopback relay standing for the server's public address, so a server can "crash" (its
/// goodbyes never reach the client) and another take its place at the same address.
struct Front {
    addr: SocketAddr,
    server: Arc<Mutex<SocketAddr>>,
    to_client: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Front {
    fn start() -> Front {
        let outside = UdpSocket::bind("127.0.0.1:0").unwrap();
        let inside = UdpSocket::bind("127.0.0.1:0").unwrap();
        for s in [&outside, &inside] {
            s.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
        }
        let addr = outside.local_addr().unwrap();
        let server = Arc::new(Mutex::new(addr));
        let client: Arc<Mutex<Option<SocketAddr>>> = Arc::new(Mutex::new(None));
        let to_client = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        let (o2, i2) = (outside.try_clone().unwrap(), inside.try_clone().unwrap());
        let (srv, cl, st) = (server.clone(), client.clone(), stop.clone());
        let up = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            while !st.load(Ordering::Relaxed) {
                if let Ok((n, from)) = outside.recv_from(&mut buf) {
                    *cl.lock().unwrap() = Some(from);
                    let to = *srv.lock().unwrap();
                    let _ = inside.send_to(&buf[..n], to);
                }
            }
        });
        let (cl, pass, st) = (client, to_client.clone(), stop.clone());
        let down = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            while !st.load(Ordering::Relaxed) {
                if let Ok((n, _)) = i2.recv_from(&mut buf) {
                    let to = *cl.lock().unwrap();
                    if let (true, Some(to)) = (pass.load(Ordering::Relaxed), to) {
                        let _ = o2.send_to(&buf[..n], to);
                    }
                }
            }
        });
        Front {
            addr,
            server,
            to_client,
            stop,
            threads: vec![up, down],
        }
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[test]
fn after_a_server_restart_the_client_sees_reset_within_100_ms_of_its_next_packet() {
    let front = Front::start();
    let server_at = |front: &Front| {
        let cfg = secure_cfg("127.0.0.1:0").public_address(front.addr);
        let srv = Server::start(cfg, |_| Gate::default()).unwrap();
        *front.server.lock().unwrap() = srv.local_addr();
        srv
    };
    let first = server_at(&front);
    let mut c = connect(&token(1, front.addr)).expect("connects through the front");
    echo(&mut c, b"before");
    // The server dies: whatever it says on the way out never reaches the client.
    front.to_client.store(false, Ordering::Relaxed);
    first.shutdown().unwrap();
    // A new server process takes the address: same key, no sessions.
    let _second = server_at(&front);
    front.to_client.store(true, Ordering::Relaxed);
    assert!(c.is_connected(), "the client has not noticed yet");
    // The client's next packet draws a reset.
    let t0 = Instant::now();
    c.send(0, &b"anyone?"[..]).unwrap();
    c.update().unwrap();
    let reason = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "no reset (the idle timeout would take 10 s)"
        );
        c.wait(Duration::from_millis(1)).unwrap();
        if let Some(ClientEvent::Disconnected { reason, by_peer }) = c.poll_event() {
            assert!(by_peer);
            break reason;
        }
    };
    let took = t0.elapsed();
    assert_eq!(reason, CloseReason::Reset);
    assert!(took < Duration::from_millis(100), "reset after {took:?}");
}
