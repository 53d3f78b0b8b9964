//! Changes to a running server: capacity readable at any time, token key rotation with an
//! overlap (sessions running throughout), public addresses (loopback).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ricochet::proto::token::{ConnectToken, TokenKey, TokenParams};
use ricochet::runtime::{Handler, Server, ServerConfig, ServerContext, SessionId};
use ricochet::{Client, ClientConfig, ClientError, ClientEvent, CloseReason};

const PROTOCOL_ID: u64 = 0x726f_7461;

fn token(key: &TokenKey, servers: &[SocketAddr], client_id: u64) -> ConnectToken {
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
    ConnectToken::seal(key, &params, &mut rand::rng()).unwrap()
}

struct Echo;
impl Handler for Echo {
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
        ctx.send(s, channel, data).expect("echo queued");
    }
}

fn connect(key: &TokenKey, server: SocketAddr, id: u64) -> Result<Client, ClientError> {
    let cfg = ClientConfig::new().connect_timeout(Duration::from_secs(5));
    Client::connect_blocking(&token(key, &[server], id), cfg)
}

/// One reliable echo for every client; panics if a session closed.
fn exchange(clients: &mut [Client]) {
    for c in clients.iter_mut() {
        c.send(0, &b"ping"[..]).unwrap();
    }
    let mut got = vec![false; clients.len()];
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.iter().any(|g| !g) {
        assert!(Instant::now() < deadline, "echo missing");
        for (i, c) in clients.iter_mut().enumerate() {
            for ev in c.update().unwrap() {
                match ev {
                    ClientEvent::Message { .. } => got[i] = true,
                    ClientEvent::Disconnected { reason, .. } => {
                        panic!("session {i} dropped: {reason:?}")
                    }
                    _ => {}
                }
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_rotated_key_overlaps_then_refuses_the_old_tokens_and_no_session_drops() {
    let old = TokenKey::from_bytes([1; 32]);
    let new = TokenKey::from_bytes([2; 32]);
    let cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap())
        .tokens(old.clone(), PROTOCOL_ID)
        .workers(2)
        .max_sessions(500);
    let srv = Server::start(cfg, |_| Echo).unwrap();
    let addr = srv.local_addr();
    let mut clients: Vec<Client> = (0..10).map(|i| connect(&old, addr, i).unwrap()).collect();
    exchange(&mut clients);
    let cap = srv.capacity();
    assert_eq!((cap.sessions, cap.limit), (10, 500));
    assert_eq!(cap.per_worker.iter().sum::<usize>(), 10);
    assert_eq!(cap.per_worker.len(), 2);

    let overlap = Duration::from_millis(1_500);
    let rotated_at = Instant::now();
    srv.rotate_token_key(new.clone(), overlap).unwrap();
    exchange(&mut clients);
    // During the overlap both keys open sessions.
    clients.push(connect(&old, addr, 100).expect("old key accepted during the overlap"));
    clients.push(connect(&new, addr, 101).expect("new key accepted"));
    assert!(
        rotated_at.elapsed() < overlap,
        "the test ran past the overlap"
    );
    // The sessions keep running while the overlap ends.
    while rotated_at.elapsed() < overlap + Duration::from_millis(100) {
        exchange(&mut clients);
    }
    match connect(&old, addr, 102) {
        Err(ClientError::Refused(CloseReason::TokenInvalid)) => {}
        other => panic!(
            "an old-key token after the overlap: {:?}",
            other.map(|_| ())
        ),
    }
    clients.push(connect(&new, addr, 103).expect("new key still accepted"));
    exchange(&mut clients);
    assert_eq!(srv.capacity().sessions, 13, "no session dropped");

    // Public addresses: a token for an address the server no longer claims is refused.
    let other: SocketAddr = "127.0.0.2:9".parse().unwrap();
    srv.set_public_addresses(vec![other]).unwrap();
    exchange(&mut clients);
    match connect(&new, addr, 104) {
        Err(ClientError::Refused(CloseReason::TokenWrongServer)) => {}
        other => panic!("a token for the old address: {:?}", other.map(|_| ())),
    }
    srv.set_public_addresses(vec![addr]).unwrap();
    exchange(&mut clients);
    clients.push(connect(&new, addr, 105).expect("address restored"));
    assert_eq!(srv.capacity().sessions, 14);
    drop(clients);
    srv.shutdown().unwrap();
}

#[test]
fn an_insecure_server_has_no_key_to_rotate() {
    let cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap())
        .insecure()
        .workers(1);
    let srv = Server::start(cfg, |_| Echo).unwrap();
    assert!(srv
        .rotate_token_key(TokenKey::from_bytes([3; 32]), Duration::from_secs(1))
        .is_err());
    assert!(srv.set_public_addresses(vec![srv.local_addr()]).is_err());
    assert_eq!(srv.capacity().per_worker, vec![0]);
    srv.shutdown().unwrap();
}
