//! Connect-token admission, sans-IO: a token admits its player with its keys and identity;
//! expired, reused, foreign and wrong-server tokens are refused with their reason; the accept
//! hook sees who connects and its refusal reaches the client; forged handshake replies are
//! dropped; a stolen token cannot be used from another address; a spoofed hello flood from the
//! player's address does not stop the player; a restarted server resets its old sessions.

mod proto_util;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use proto_util::{addr, Impair, Net};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use ricochet_proto::token::{ConnectToken, TokenKey, TokenParams};
use ricochet_proto::wire::{self, ConnectionId, Packet};
use ricochet_proto::{
    CloseReason, Config, ConnectionHandle, ConnectionState, DropCause, Endpoint, EndpointConfig,
    Event, ListenConfig, Refusal, TokenAdmission,
};

const PROTOCOL_ID: u64 = 0x7465_7374;
/// The simulated wall clock when every test starts (Unix seconds).
const UNIX: u64 = 1_900_000_000;

fn key() -> TokenKey {
    TokenKey::from_bytes([9; 32])
}

fn admission() -> TokenAdmission {
    TokenAdmission::new(key(), PROTOCOL_ID, vec![addr(1)])
}

/// A token server endpoint with `server` settings, told the wall clock.
fn token_server(net: &Net, server: ListenConfig, seed: u64) -> Endpoint {
    let mut ep = Endpoint::new(
        EndpointConfig::default().with(|c| c.server = Some(server)),
        net.now,
        seed,
    );
    ep.set_unix_time(net.now, Duration::from_secs(UNIX));
    ep
}

fn client(net: &Net, seed: u64) -> Endpoint {
    Endpoint::new(EndpointConfig::default(), net.now, seed)
}

/// A token sealed with `key` for `servers`, expiring at `expires` (Unix seconds).
fn mint(key: &TokenKey, client_id: u64, servers: &[SocketAddr], expires: u64) -> ConnectToken {
    let mut rng = ChaCha20Rng::seed_from_u64(client_id ^ expires);
    let params = TokenParams {
        protocol_id: PROTOCOL_ID,
        client_id,
        server_addresses: servers,
        expires_unix: expires,
        user_data: b"team=blue",
    };
    ConnectToken::seal(key, &params, &mut rng).unwrap()
}

fn good_token(client_id: u64) -> ConnectToken {
    mint(&key(), client_id, &[addr(1)], UNIX + 60)
}

fn new_net() -> Net {
    Net::new(
        Impair {
            delay: Duration::from_millis(5),
            ..Impair::default()
        },
        3,
    )
}

/// What became of client connection `h` of endpoint `c` within `within`: connected, or closed
/// with (reason, by peer, message). Events of other endpoints go to `others`.
fn outcome(
    net: &mut Net,
    c: usize,
    h: ConnectionHandle,
    within: Duration,
    others: &mut dyn FnMut(usize, &mut Net, ConnectionHandle, Event),
) -> Option<Result<(), (CloseReason, bool, Bytes)>> {
    let mut out = None;
    let limit = net.now + within;
    while out.is_none()
        && net.step(limit, &mut |ep, n, eh, e| {
            if ep == c && eh == h {
                match e {
                    Event::Connected => out = Some(Ok(())),
                    Event::Closed {
                        reason,
                        by_peer,
                        message,
                    } => out = Some(Err((reason, by_peer, message))),
                    _ => {}
                }
            } else {
                others(ep, n, eh, e)
            }
        })
    {}
    out
}

fn refused(reason: CloseReason) -> Option<Result<(), (CloseReason, bool, Bytes)>> {
    Some(Err((reason, true, Bytes::new())))
}

#[test]
fn a_token_admits_its_player_with_its_keys_and_identity() {
    let mut net = new_net();
    let s = net.add(
        addr(1),
        token_server(&net, ListenConfig::tokens(admission()), 1),
    );
    let c = net.add(addr(2), client(&net, 2));
    let token = good_token(42);
    let now = net.now;
    let h = net.ep(c).connect_with_token(now, &token);
    let mut server_side = None;
    let r = outcome(
        &mut net,
        c,
        h,
        Duration::from_secs(2),
        &mut |ep, _, sh, e| {
            if ep == s && e == Event::Connected {
                server_side = Some(sh);
            }
        },
    );
    assert_eq!(r, Some(Ok(())));
    // One more turn so the server's Connected is seen too, if it came in the same step.
    let limit = net.now + Duration::from_millis(50);
    net.run_until(limit, &mut |ep, _, sh, e| {
        if ep == s && e == Event::Connected {
            server_side = Some(sh);
        }
    });
    let sh = server_side.expect("the server saw the session");
    let conn = net.ep(s).connection(sh).expect("server connection");
    let peer = conn.peer().expect("peer").clone();
    assert_eq!(peer.client_id, Some(42));
    assert_eq!(&peer.user_data[..], b"team=blue");
    assert_eq!(peer.address, addr(2));
    assert_eq!(conn.session_keys(), Some(&token.keys));
    assert_eq!(
        net.ep(c).connection(h).and_then(|c| c.session_keys()),
        Some(&token.keys)
    );
    // Data flows.
    net.ep(c).send(h, 0, Bytes::from_static(b"hi")).unwrap();
    let mut got = None;
    let limit = net.now + Duration::from_secs(1);
    net.run_until(limit, &mut |ep, _, _, e| {
        if let (true, Event::Message { data, .. }) = (ep == s, e) {
            got = Some(data);
        }
    });
    assert_eq!(got.as_deref(), Some(&b"hi"[..]));
    // Every server reply stayed smaller than the client datagram that caused it.
    assert!(net.ep(s).stats().max_stateless_reply < wire::TOKEN_HELLO_LEN);
}

/// At the smallest `max_datagram_size` `Config::validate` accepts, on both sides, a token
/// client's handshake (its cookie echo is the largest handshake packet) completes and a
/// message cut in many fragments arrives whole, with and without FEC.
#[test]
fn a_token_session_works_at_the_smallest_valid_datagram_size() {
    for base in [Config::default(), Config::game()] {
        let min = base.min_datagram_size();
        let config = Arc::new(base.with(|c| c.max_datagram_size = min));
        assert_eq!(config.validate(), Ok(()));
        let mut net = new_net();
        let server_cfg = EndpointConfig::default().with(|c| {
            c.server = Some(ListenConfig::tokens(admission()));
            c.connection = config.clone();
        });
        let mut server = Endpoint::new(server_cfg, net.now, 1);
        server.set_unix_time(net.now, Duration::from_secs(UNIX));
        let s = net.add(addr(1), server);
        let client_cfg = EndpointConfig::default().with(|c| c.connection = config.clone());
        let c = net.add(addr(2), Endpoint::new(client_cfg, net.now, 2));
        let now = net.now;
        let h = net.ep(c).connect_with_token(now, &good_token(7));
        let r = outcome(&mut net, c, h, Duration::from_secs(2), &mut |_, _, _, _| {});
        assert_eq!(r, Some(Ok(())), "at {min} bytes");
        let message = Bytes::from((0..10_000u32).map(|i| i as u8).collect::<Vec<_>>());
        net.ep(c).send(h, 0, message.clone()).unwrap();
        let mut got = None;
        let limit = net.now + Duration::from_secs(2);
        net.run_until(limit, &mut |ep, _, _, e| {
            if let (true, Event::Message { data, .. }) = (ep == s, e) {
                got = Some(data);
            }
        });
        assert_eq!(got, Some(message), "at {min} bytes");
        assert!(net.max_datagram <= min);
    }
}

#[test]
fn expired_reused_foreign_and_wrong_server_tokens_are_refused_with_their_reason() {
    let other_key = TokenKey::from_bytes([8; 32]);
    let cases: Vec<(&str, ConnectToken, Option<Vec<SocketAddr>>, CloseReason)> = vec![
        (
            "expired",
            mint(&key(), 1, &[addr(1)], UNIX - 1),
            None,
            CloseReason::TokenExpired,
        ),
        (
            "sealed with another key",
            mint(&other_key, 2, &[addr(1)], UNIX + 60),
            None,
            CloseReason::TokenInvalid,
        ),
        (
            // The server at addr(1) believes it is reached at addr(9): the token is not for it.
            "for another server",
            good_token(3),
            Some(vec![addr(9)]),
            CloseReason::TokenWrongServer,
        ),
    ];
    for (name, token, public, reason) in cases {
        let mut net = new_net();
        let mut adm = admission();
        if let Some(p) = public {
            adm.public_addresses = p;
        }
        let s = net.add(addr(1), token_server(&net, ListenConfig::tokens(adm), 1));
        let c = net.add(addr(2), client(&net, 2));
        let now = net.now;
        let h = net.ep(c).connect_with_token(now, &token);
        let r = outcome(&mut net, c, h, Duration::from_secs(2), &mut |_, _, _, _| {});
        assert_eq!(r, refused(reason), "{name}");
        assert_eq!(net.ep(s).connection_count(), 0, "{name}: no state");
        assert!(net.ep(s).stats().token_refusals >= 1, "{name}");
    }

    // Another protocol id.
    let mut net = new_net();
    let mut adm = admission();
    adm.protocol_id = PROTOCOL_ID + 1;
    net.add(addr(1), token_server(&net, ListenConfig::tokens(adm), 1));
    let c = net.add(addr(2), client(&net, 2));
    let now = net.now;
    let h = net.ep(c).connect_with_token(now, &good_token(4));
    let r = outcome(&mut net, c, h, Duration::from_secs(2), &mut |_, _, _, _| {});
    assert_eq!(r, refused(CloseReason::TokenInvalid), "other protocol id");

    // Reused: the second player with the same token, from another address, is refused; so is
    // the first player reconnecting with it after closing.
    let mut net = new_net();
    let s = net.add(
        addr(1),
        token_server(&net, ListenConfig::tokens(admission()), 1),
    );
    let a = net.add(addr(2), client(&net, 2));
    let b = net.add(addr(3), client(&net, 3));
    let token = good_token(5);
    let now = net.now;
    let ha = net.ep(a).connect_with_token(now, &token);
    let r = outcome(
        &mut net,
        a,
        ha,
        Duration::from_secs(2),
        &mut |_, _, _, _| {},
    );
    assert_eq!(r, Some(Ok(())), "first use");
    let now = net.now;
    let hb = net.ep(b).connect_with_token(now, &token);
    let r = outcome(
        &mut net,
        b,
        hb,
        Duration::from_secs(2),
        &mut |_, _, _, _| {},
    );
    assert_eq!(r, refused(CloseReason::TokenReused), "second player");
    let now = net.now;
    net.ep(a).close(now, ha, CloseReason::Application);
    let limit = net.now + Duration::from_secs(1);
    net.run_until(limit, &mut |_, _, _, _| {});
    let now = net.now;
    let again = net.ep(a).connect_with_token(now, &token);
    let r = outcome(
        &mut net,
        a,
        again,
        Duration::from_secs(2),
        &mut |_, _, _, _| {},
    );
    assert_eq!(r, refused(CloseReason::TokenReused), "reconnect");
    assert_eq!(net.ep(s).connection_count(), 0);
}

#[test]
fn a_full_used_token_table_admits_new_players_and_forgets_the_soonest_to_expire() {
    // Room for two used tokens. Three players with their own tokens all get in: the third
    // token takes the place of the one that expires soonest (player 1's, not the first
    // recorded), which is counted and no longer refused a second time; the others still are.
    let mut net = new_net();
    let mut adm = admission();
    adm.used_token_capacity = 2;
    let s = net.add(addr(1), token_server(&net, ListenConfig::tokens(adm), 1));
    let tokens = [
        mint(&key(), 0, &[addr(1)], UNIX + 90),
        mint(&key(), 1, &[addr(1)], UNIX + 30),
        mint(&key(), 2, &[addr(1)], UNIX + 60),
    ];
    for (i, token) in tokens.iter().enumerate() {
        let c = net.add(addr(2 + i as u16), client(&net, 10 + i as u64));
        let now = net.now;
        let h = net.ep(c).connect_with_token(now, token);
        let r = outcome(&mut net, c, h, Duration::from_secs(2), &mut |_, _, _, _| {});
        assert_eq!(r, Some(Ok(())), "player {i}");
    }
    assert_eq!(net.ep(s).stats().tokens_evicted, 1);
    let again = |net: &mut Net, token: &ConnectToken, seed: u64, at: u16| {
        let c = net.add(addr(at), client(net, seed));
        let now = net.now;
        let h = net.ep(c).connect_with_token(now, token);
        outcome(net, c, h, Duration::from_secs(2), &mut |_, _, _, _| {})
    };
    let r = again(&mut net, &tokens[0], 20, 8);
    assert_eq!(
        r,
        refused(CloseReason::TokenReused),
        "player 0's token, held"
    );
    let r = again(&mut net, &tokens[2], 21, 9);
    assert_eq!(
        r,
        refused(CloseReason::TokenReused),
        "player 2's token, held"
    );
    assert_eq!(
        net.ep(s).stats().tokens_evicted,
        1,
        "refusals record nothing"
    );
    let r = again(&mut net, &tokens[1], 22, 10);
    assert_eq!(r, Some(Ok(())), "player 1's token, forgotten");
    // Recording it again evicted player 2's token (+60), which now expires soonest.
    assert_eq!(net.ep(s).stats().tokens_evicted, 2);
    let r = again(&mut net, &tokens[2], 23, 11);
    assert_eq!(r, Some(Ok(())), "player 2's token, forgotten in turn");
    let r = again(&mut net, &tokens[0], 24, 12);
    assert_eq!(
        r,
        refused(CloseReason::TokenReused),
        "player 0's token, still held"
    );
    assert_eq!(net.ep(s).stats().token_refusals, 3);
}

#[test]
fn a_mode_mismatch_is_refused_with_its_reason() {
    // No token for a token server.
    let mut net = new_net();
    net.add(
        addr(1),
        token_server(&net, ListenConfig::tokens(admission()), 1),
    );
    let c = net.add(addr(2), client(&net, 2));
    let now = net.now;
    let h = net.ep(c).connect(now, addr(1));
    let r = outcome(&mut net, c, h, Duration::from_secs(2), &mut |_, _, _, _| {});
    assert_eq!(r, refused(CloseReason::TokenRequired));
    // A token for an insecure server.
    let mut net = new_net();
    net.add(addr(1), token_server(&net, ListenConfig::insecure(), 1));
    let c = net.add(addr(2), client(&net, 2));
    let now = net.now;
    let h = net.ep(c).connect_with_token(now, &good_token(1));
    let r = outcome(&mut net, c, h, Duration::from_secs(2), &mut |_, _, _, _| {});
    assert_eq!(r, refused(CloseReason::InsecureServer));
}

#[test]
fn the_accept_hook_sees_who_connects_and_its_refusal_reaches_the_client() {
    let mut net = new_net();
    let server = ListenConfig::tokens(admission()).with(|c| c.accept_hook = true);
    let s = net.add(addr(1), token_server(&net, server, 1));
    let a = net.add(addr(2), client(&net, 2));
    let b = net.add(addr(3), client(&net, 3));
    let now = net.now;
    let ha = net.ep(a).connect_with_token(now, &good_token(10));
    let hb = net.ep(b).connect_with_token(now, &good_token(11));
    // The application admits client 10 and refuses client 11, with a message.
    let mut asked = Vec::new();
    let mut results = std::collections::HashMap::new();
    let limit = net.now + Duration::from_secs(2);
    net.run_until(limit, &mut |ep, n, h, e| match e {
        Event::Incoming(peer) if ep == s => {
            asked.push((peer.client_id, peer.address));
            assert_eq!(&peer.user_data[..], b"team=blue");
            assert_eq!(
                n.ep(s).connection(h).map(|c| c.state()),
                Some(ricochet_proto::ConnectionState::Handshaking),
                "no session before the application answers"
            );
            if peer.client_id == Some(10) {
                n.ep(s).accept(h);
            } else {
                n.ep(s).refuse(h, &Refusal::new(3, "banned until Friday"));
            }
        }
        Event::Connected if ep != s => {
            results.insert((ep, h), Ok(()));
        }
        Event::Closed {
            reason,
            by_peer,
            message,
        } if ep != s => {
            results.insert((ep, h), Err((reason, by_peer, message)));
        }
        _ => {}
    });
    assert_eq!(results.get(&(a, ha)), Some(&Ok(())));
    assert_eq!(
        results.get(&(b, hb)),
        Some(&Err((
            CloseReason::Rejected(3),
            true,
            Bytes::from_static(b"banned until Friday")
        )))
    );
    asked.sort_by_key(|(id, _)| *id);
    assert_eq!(asked, vec![(Some(10), addr(2)), (Some(11), addr(3))]);
    assert_eq!(
        net.ep(s).connection_count(),
        1,
        "the refused client left nothing"
    );
    assert_eq!(net.ep(s).stats().rejected, 1);
}

/// Drive one handshake by hand: `(hello, challenge, echo, accept)` as the network carried them.
fn handshake_by_hand(
    server: &mut Endpoint,
    client: &mut Endpoint,
    token: &ConnectToken,
    now: Instant,
    from: SocketAddr,
) -> (ConnectionHandle, [Vec<u8>; 4]) {
    handshake_with(server, addr(1), client, token, now, from)
}

/// [`handshake_by_hand`] with the server at `server_at`.
fn handshake_with(
    server: &mut Endpoint,
    server_at: SocketAddr,
    client: &mut Endpoint,
    token: &ConnectToken,
    now: Instant,
    from: SocketAddr,
) -> (ConnectionHandle, [Vec<u8>; 4]) {
    let mut buf = vec![0u8; 2048];
    let h = client.connect_with_token(now, token);
    let t = client.poll_transmit(now, &mut buf).expect("hello");
    let hello = buf[..t.size].to_vec();
    server
        .handle_datagram(now, from, &hello)
        .expect("hello taken");
    let t = server.poll_transmit(now, &mut buf).expect("challenge");
    let challenge = buf[..t.size].to_vec();
    client
        .handle_datagram(now, server_at, &challenge)
        .expect("challenge taken");
    let t = client.poll_transmit(now, &mut buf).expect("echo");
    let echo = buf[..t.size].to_vec();
    server
        .handle_datagram(now, from, &echo)
        .expect("echo taken");
    let t = server.poll_transmit(now, &mut buf).expect("accept");
    let accept = buf[..t.size].to_vec();
    (h, [hello, challenge, echo, accept])
}

#[test]
fn forged_or_altered_handshake_replies_are_dropped_and_counted() {
    let net = new_net();
    let now = net.now;
    let mut server = token_server(&net, ListenConfig::tokens(admission()), 1);
    let mut reference = client(&net, 2);
    let (_, [_, challenge, _, accept]) =
        handshake_by_hand(&mut server, &mut reference, &good_token(1), now, addr(2));
    // A second client (same seed: same cid and nonce) gets every reply altered in one bit.
    for (name, packet, at) in [("challenge", &challenge, 30), ("accept", &accept, 40)] {
        let mut c = client(&net, 2);
        let mut s = token_server(&net, ListenConfig::tokens(admission()), 1);
        let mut buf = vec![0u8; 2048];
        let h = c.connect_with_token(now, &good_token(1));
        let t = c.poll_transmit(now, &mut buf).unwrap();
        s.handle_datagram(now, addr(2), &buf[..t.size]).unwrap();
        if name == "accept" {
            let t = s.poll_transmit(now, &mut buf).unwrap();
            c.handle_datagram(now, addr(1), &buf[..t.size]).unwrap();
        }
        let mut forged = packet.clone();
        forged[at] ^= 1;
        assert_eq!(
            c.handle_datagram(now, addr(1), &forged),
            Err(DropCause::Unauthenticated),
            "{name}"
        );
        assert_eq!(c.stats().drops.get(DropCause::Unauthenticated), 1);
        assert_eq!(
            c.connection(h).map(|x| x.state()),
            Some(ricochet_proto::ConnectionState::Handshaking),
            "{name}: the handshake goes on"
        );
    }
    // A forged refusal (untagged, for a reason only a server that opened the token gives) and
    // a plain accept are not believed by a client with a token.
    let mut c = client(&net, 2);
    let h = c.connect_with_token(now, &good_token(1));
    let cid = c.connection(h).unwrap().local_cid();
    let mut buf = vec![0u8; 128];
    for p in [
        Packet::Refuse {
            client_cid: cid,
            reason: CloseReason::TokenReused,
            message: &[],
            tag: None,
        },
        Packet::Refuse {
            client_cid: cid,
            reason: CloseReason::ServerFull,
            message: &[],
            tag: Some([0; 16]),
        },
    ] {
        let n = wire::encode_packet(&p, &mut buf).unwrap();
        assert_eq!(
            c.handle_datagram(now, addr(1), &buf[..n]),
            Err(DropCause::Unauthenticated)
        );
    }
    assert!(c.poll_event().is_none(), "no close: the handshake goes on");
}

#[test]
fn a_captured_token_cannot_be_used_from_another_address() {
    let net = new_net();
    let now = net.now;
    let mut server = token_server(&net, ListenConfig::tokens(admission()), 1);
    let token = good_token(7);
    // The attacker saw the player's hello and echo (token and proof) and replays them from
    // its own address.
    let mut player = client(&net, 2);
    let mut buf = vec![0u8; 2048];
    let _h = player.connect_with_token(now, &token);
    let t = player.poll_transmit(now, &mut buf).unwrap();
    let hello = buf[..t.size].to_vec();
    let attacker = addr(66);
    // The captured hello gets the attacker a challenge (its own address, its own cookie)...
    server.handle_datagram(now, attacker, &hello).unwrap();
    let t = server.poll_transmit(now, &mut buf).unwrap();
    let Ok(Packet::ServerChallenge {
        client_cid,
        nonce,
        timestamp,
        cookie,
        ..
    }) = wire::decode_packet(&buf[..t.size])
    else {
        panic!("a challenge")
    };
    // ...but an echo needs a proof made with the token's keys, which the attacker lacks: it
    // reuses the hello's proof.
    let Ok(Packet::ClientHello {
        token: Some(section),
        ..
    }) = wire::decode_packet(&hello)
    else {
        panic!("a token hello")
    };
    let echo = Packet::ClientCookieEcho {
        client_cid,
        nonce,
        timestamp,
        cookie,
        token: Some(section),
    };
    let n = wire::encode_packet(&echo, &mut buf).unwrap();
    assert_eq!(
        server.handle_datagram(now, attacker, &buf[..n]),
        Err(DropCause::Unauthenticated)
    );
    assert_eq!(server.connection_count(), 0);
    // The token is still unused: the player gets in.
    let mut net = net;
    let s = net.add(addr(1), server);
    let c = net.add(addr(2), client(&net, 3));
    let now = net.now;
    let h = net.ep(c).connect_with_token(now, &token);
    let r = outcome(&mut net, c, h, Duration::from_secs(2), &mut |_, _, _, _| {});
    assert_eq!(r, Some(Ok(())));
    assert_eq!(net.ep(s).connection_count(), 1);
}

#[test]
fn a_spoofed_hello_flood_from_the_players_address_does_not_stop_the_player() {
    let mut net = new_net();
    let s = net.add(
        addr(1),
        token_server(&net, ListenConfig::tokens(admission()), 1),
    );
    let c = net.add(addr(2), client(&net, 2));
    // Hellos with the player's own address as source, 100 per millisecond (far above the
    // per-address handshake limit of 64 per second): garbage tokens, and replays of a real
    // hello the attacker captured.
    let mut captured = client(&net, 9);
    let mut buf = vec![0u8; 2048];
    let now = net.now;
    captured.connect_with_token(now, &good_token(99));
    let t = captured.poll_transmit(now, &mut buf).unwrap();
    let replay = buf[..t.size].to_vec();
    let mut garbage = replay.clone();
    garbage[200] ^= 0xff; // the sealed part: it no longer opens
    let h = net.ep(c).connect_with_token(now, &good_token(1));
    let mut result = None;
    let deadline = net.now + Duration::from_secs(3);
    while result.is_none() && net.now < deadline {
        for _ in 0..50 {
            net.inject(addr(2), s, replay.clone());
            net.inject(addr(2), s, garbage.clone());
        }
        let limit = net.now + Duration::from_millis(1);
        net.run_until(limit, &mut |ep, _, eh, e| {
            if ep == c && eh == h {
                match e {
                    Event::Connected => result = Some(Ok(())),
                    Event::Closed { reason, .. } => result = Some(Err(reason)),
                    _ => {}
                }
            }
        });
    }
    assert_eq!(
        result,
        Some(Ok(())),
        "the player connects through the flood"
    );
    assert!(
        net.now - net.base < Duration::from_millis(100),
        "without a retry: {:?}",
        net.now - net.base
    );
    assert_eq!(net.ep(s).stats().drops.get(DropCause::RateLimited), 0);
}

#[test]
fn a_restarted_server_resets_its_old_sessions_and_only_it_can() {
    let mut net = new_net();
    let s = net.add(
        addr(1),
        token_server(&net, ListenConfig::tokens(admission()), 1),
    );
    let c = net.add(addr(2), client(&net, 2));
    let now = net.now;
    let h = net.ep(c).connect_with_token(now, &good_token(1));
    assert_eq!(
        outcome(&mut net, c, h, Duration::from_secs(2), &mut |_, _, _, _| {}),
        Some(Ok(()))
    );
    // A forged reset (right connection id, wrong token) is dropped.
    let server_cid = net.ep(c).connection(h).unwrap().remote_cid();
    let mut buf = vec![0u8; 64];
    let n = wire::encode_packet(
        &Packet::StatelessReset {
            cid: server_cid,
            token: [1; 16],
        },
        &mut buf,
    )
    .unwrap();
    let now = net.now;
    assert_eq!(
        net.ep(c).handle_datagram(now, addr(1), &buf[..n]),
        Err(DropCause::Unauthenticated)
    );
    // The server restarts: same key, same address, no state. The client's next packet draws
    // a reset, and the client closes with `Reset` one path round trip later.
    net.eps[s].1 = token_server(&net, ListenConfig::tokens(admission()), 77);
    let now = net.now;
    net.ep(c)
        .send(h, 0, Bytes::from_static(b"anyone?"))
        .unwrap();
    let sent_at = now;
    let r = outcome(&mut net, c, h, Duration::from_secs(2), &mut |_, _, _, _| {});
    assert_eq!(r, Some(Err((CloseReason::Reset, true, Bytes::new()))));
    assert!(
        net.now - sent_at <= Duration::from_millis(11),
        "reset after {:?} (path RTT 10 ms)",
        net.now - sent_at
    );
    assert_eq!(net.ep(s).stats().resets_sent, 1);
    // The reset was smaller than the packet that drew it.
    assert!(net.ep(s).stats().max_stateless_reply <= wire::RESET_LEN);
    // Another server of the same backend (another address, so another reset key) answers
    // with a reset the client does not take (its token is another); an insecure server sends
    // none. This one answers its own ids, rate-limited.
    let mut other = TokenAdmission::new(key(), PROTOCOL_ID, vec![addr(5)]);
    other.max_resets_per_second = 10;
    let mut elsewhere = token_server(&net, ListenConfig::tokens(other), 5);
    let mut insecure = token_server(&net, ListenConfig::insecure(), 6);
    let mut adm = admission();
    adm.max_resets_per_second = 10;
    let mut restarted = token_server(&net, ListenConfig::tokens(adm), 78);
    // A ping padded to 48 bytes (a reset only answers packets larger than itself).
    let ping_to = |cid: ConnectionId| {
        let mut data = vec![0u8; 48];
        let hdr = wire::encode_data_header(cid, 1, &mut data).unwrap();
        data[hdr] = wire::frame_type::PING;
        data
    };
    let data = ping_to(server_cid);
    let now = net.now;
    for _ in 0..20 {
        let _ = elsewhere.handle_datagram(now, addr(2), &data);
        let _ = insecure.handle_datagram(now, addr(2), &data);
        let _ = restarted.handle_datagram(now, addr(2), &data);
    }
    assert_eq!(elsewhere.stats().resets_sent, 10);
    let mut buf = vec![0u8; 64];
    let t = elsewhere.poll_transmit(now, &mut buf).expect("a reset");
    assert_ne!(
        wire::decode_packet(&buf[..t.size]).ok(),
        wire::decode_packet(&reset_of(&mut restarted, now)).ok(),
        "another key, another token"
    );
    assert_eq!(insecure.stats().resets_sent, 0);
    assert_eq!(
        restarted.stats().resets_sent,
        10,
        "its own id, rate-limited to 10 per second"
    );
    assert_eq!(restarted.stats().resets_limited, 10);
    let reset = reset_of(&mut restarted, now);
    assert!(reset.len() < data.len(), "smaller than its trigger");
    match wire::decode_packet(&reset) {
        Ok(Packet::StatelessReset { cid, .. }) => assert_eq!(cid, server_cid),
        other => panic!("not a reset: {other:?}"),
    }
}

/// The next datagram `server` sends, which must be a stateless reset.
fn reset_of(server: &mut Endpoint, now: Instant) -> Vec<u8> {
    let mut buf = vec![0u8; 64];
    let t = server.poll_transmit(now, &mut buf).expect("a reset");
    assert!(matches!(
        wire::decode_packet(&buf[..t.size]),
        Ok(Packet::StatelessReset { .. })
    ));
    buf[..t.size].to_vec()
}

/// A client takes a reset only as a server sends one: exactly its size, from the address the
/// session talks to. A genuine reset with a byte added, or relayed from another address, ends
/// nothing (before, both ended the session).
#[test]
fn a_client_takes_a_reset_only_of_its_size_from_its_servers_address() {
    let net = new_net();
    let now = net.now;
    let mut server = token_server(&net, ListenConfig::tokens(admission()), 1);
    let mut client = client(&net, 2);
    let (h, [.., accept]) =
        handshake_by_hand(&mut server, &mut client, &good_token(7), now, addr(2));
    client.handle_datagram(now, addr(1), &accept).unwrap();
    assert!(matches!(client.poll_event(), Some((_, Event::Connected))));
    // The server restarts; the client's next packet draws a genuine reset.
    let mut restarted = token_server(&net, ListenConfig::tokens(admission()), 77);
    client.send(h, 0, Bytes::from_static(b"anyone?")).unwrap();
    let mut buf = vec![0u8; 2048];
    let t = client.poll_transmit(now, &mut buf).expect("a data packet");
    let _ = restarted.handle_datagram(now, addr(2), &buf[..t.size]);
    let reset = reset_of(&mut restarted, now);
    let mut longer = reset.clone();
    longer.push(0);
    assert_eq!(
        client.handle_datagram(now, addr(1), &longer),
        Err(DropCause::Malformed)
    );
    assert_eq!(
        client.handle_datagram(now, addr(3), &reset),
        Err(DropCause::Unauthenticated)
    );
    assert!(client
        .connection(h)
        .is_some_and(|c| c.state() == ConnectionState::Established));
    assert!(client.poll_event().is_none(), "nothing ended");
    // The reset itself, from the server's address, ends the session.
    client.handle_datagram(now, addr(1), &reset).unwrap();
    assert!(matches!(
        client.poll_event(),
        Some((
            _,
            Event::Closed {
                reason: CloseReason::Reset,
                ..
            }
        ))
    ));
}

/// A host behind the player's address (a NAT) replays the player's captured hello at will and
/// echoes the challenges it draws: its echoes fail their proof and spend nothing of the
/// address's handshake budget, so the player, and as many other players as the budget allows,
/// still get in. Before, each such echo was counted before its proof was checked.
#[test]
fn replayed_hellos_from_the_players_address_do_not_spend_its_handshake_budget() {
    let net = new_net();
    let now = net.now;
    let limits = ListenConfig::tokens(admission()).with(|s| s.max_handshakes_per_address = 2);
    let mut server = token_server(&net, limits, 1);
    let player_at = addr(2);
    let neighbour = SocketAddr::new(player_at.ip(), 9999);
    let mut captured = client(&net, 9);
    let mut buf = vec![0u8; 2048];
    captured.connect_with_token(now, &good_token(99));
    let t = captured.poll_transmit(now, &mut buf).unwrap();
    let hello = buf[..t.size].to_vec();
    let Ok(Packet::ClientHello {
        token: Some(section),
        ..
    }) = wire::decode_packet(&hello)
    else {
        panic!("a token hello")
    };
    for _ in 0..100 {
        server.handle_datagram(now, neighbour, &hello).unwrap();
        let t = server.poll_transmit(now, &mut buf).expect("a challenge");
        let Ok(Packet::ServerChallenge {
            client_cid,
            nonce,
            timestamp,
            cookie,
            ..
        }) = wire::decode_packet(&buf[..t.size])
        else {
            panic!("a challenge")
        };
        let echo = Packet::ClientCookieEcho {
            client_cid,
            nonce,
            timestamp,
            cookie,
            token: Some(section),
        };
        let mut e = vec![0u8; 2048];
        let n = wire::encode_packet(&echo, &mut e).unwrap();
        assert_eq!(
            server.handle_datagram(now, neighbour, &e[..n]),
            Err(DropCause::Unauthenticated)
        );
    }
    assert_eq!(server.stats().drops.get(DropCause::RateLimited), 0);
    // Two players from that address get in within the same second (the budget: 2)...
    for (k, port) in [(1u64, player_at.port()), (2, 4100)] {
        let from = SocketAddr::new(player_at.ip(), port);
        let mut player = client(&net, 10 + k);
        let (h, [.., accept]) =
            handshake_by_hand(&mut server, &mut player, &good_token(k), now, from);
        player.handle_datagram(now, addr(1), &accept).unwrap();
        assert!(player
            .connection(h)
            .is_some_and(|c| c.state() == ConnectionState::Established));
    }
    // ...and a third, with a token of its own, finds it spent: the budget still counts tokens.
    let mut third = client(&net, 13);
    third.connect_with_token(now, &good_token(3));
    let t = third.poll_transmit(now, &mut buf).unwrap();
    let from = SocketAddr::new(player_at.ip(), 4101);
    server.handle_datagram(now, from, &buf[..t.size]).unwrap();
    let t = server.poll_transmit(now, &mut buf).unwrap();
    third.handle_datagram(now, addr(1), &buf[..t.size]).unwrap();
    let t = third.poll_transmit(now, &mut buf).unwrap();
    assert_eq!(
        server.handle_datagram(now, from, &buf[..t.size]),
        Err(DropCause::RateLimited)
    );
}

#[test]
fn a_client_tries_the_tokens_next_server_when_the_first_does_not_answer() {
    let mut net = new_net();
    // addr(7) has nobody; the server at addr(1) is the token's second address.
    let mut adm = admission();
    adm.public_addresses = vec![addr(1)];
    let s = net.add(addr(1), token_server(&net, ListenConfig::tokens(adm), 1));
    let c = net.add(addr(2), client(&net, 2));
    let token = mint(&key(), 1, &[addr(7), addr(1)], UNIX + 60);
    let now = net.now;
    let h = net.ep(c).connect_with_token(now, &token);
    let r = outcome(
        &mut net,
        c,
        h,
        Duration::from_secs(12),
        &mut |_, _, _, _| {},
    );
    assert_eq!(r, Some(Ok(())));
    assert_eq!(net.ep(c).connection(h).unwrap().remote_addr(), addr(1));
    assert_eq!(net.ep(s).connection_count(), 1);
}

#[test]
fn without_the_wall_clock_a_token_server_drops_token_handshakes() {
    let mut net = new_net();
    let ep = Endpoint::new(
        EndpointConfig::default().with(|c| c.server = Some(ListenConfig::tokens(admission()))),
        net.now,
        1,
    );
    let s = net.add(addr(1), ep);
    let c = net.add(addr(2), client(&net, 2));
    let now = net.now;
    net.ep(c).connect_with_token(now, &good_token(1));
    let limit = net.now + Duration::from_millis(100);
    net.run_until(limit, &mut |_, _, _, _| {});
    assert!(net.ep(s).stats().drops.get(DropCause::NoClock) >= 1);
    assert_eq!(net.ep(s).stats().challenges_sent, 0);
}

/// A copy of a client's hello that reaches the server after its cookie echo was admitted (a
/// duplicate on the path, or a worker slower than the one the echo was steered to) is
/// answered as any hello is, with a stateless challenge, never with a `TokenReused` refusal
/// that would end the handshake: the server looks the token up in its used-token table only
/// for an echo. The accept still connects the client, which ignores the late challenge.
/// Another client (another id) using the same token is refused at its echo.
#[test]
fn a_late_copy_of_the_clients_own_hello_does_not_refuse_it() {
    let net = new_net();
    let now = net.now;
    let mut server = token_server(&net, ListenConfig::tokens(admission()), 1);
    let mut c = client(&net, 2);
    let token = good_token(1);
    let h = c.connect_with_token(now, &token);
    let mut buf = vec![0u8; 2048];
    let mut next = |ep: &mut Endpoint, what: &str| -> Vec<u8> {
        let t = ep
            .poll_transmit(now, &mut buf)
            .unwrap_or_else(|| panic!("no {what}"));
        buf[..t.size].to_vec()
    };
    let hello = next(&mut c, "hello");
    server.handle_datagram(now, addr(2), &hello).unwrap();
    let challenge = next(&mut server, "challenge");
    c.handle_datagram(now, addr(1), &challenge).unwrap();
    let echo = next(&mut c, "echo");
    server.handle_datagram(now, addr(2), &echo).unwrap();
    let accept = next(&mut server, "accept");
    // The late copy of the hello: a challenge, no refusal.
    server.handle_datagram(now, addr(2), &hello).unwrap();
    let late = next(&mut server, "challenge to the late hello");
    assert_eq!(late[0], wire::PacketType::ServerChallenge as u8);
    c.handle_datagram(now, addr(1), &accept).unwrap();
    match c.poll_event() {
        Some((hh, Event::Connected)) if hh == h => {}
        other => panic!("the client did not connect: {other:?}"),
    }
    assert_eq!(
        c.handle_datagram(now, addr(1), &late),
        Err(DropCause::UnexpectedHandshake)
    );
    assert!(
        c.poll_event().is_none(),
        "the late challenge changes nothing"
    );
    // The same token from another client endpoint (another address) is a reuse: refused at
    // its echo.
    let mut thief = client(&net, 3);
    let th = thief.connect_with_token(now, &token);
    let mut to_server = |thief: &mut Endpoint, server: &mut Endpoint| {
        let d = thief
            .poll_transmit(now, &mut buf)
            .map(|t| buf[..t.size].to_vec())
            .unwrap();
        server.handle_datagram(now, addr(3), &d).unwrap();
        let reply = server
            .poll_transmit(now, &mut buf)
            .map(|t| buf[..t.size].to_vec())
            .unwrap();
        thief.handle_datagram(now, addr(1), &reply).unwrap();
    };
    to_server(&mut thief, &mut server); // hello, challenge
    to_server(&mut thief, &mut server); // echo, refusal
    match thief.poll_event() {
        Some((hh, Event::Closed { reason, .. })) if hh == th => {
            assert_eq!(reason, CloseReason::TokenReused)
        }
        other => panic!("the thief was not refused: {other:?}"),
    }
}

/// One token, several sessions: at each of the two servers it lists, and at the first one
/// again after a restart (its used-token table is gone), all from a client endpoint with the
/// same seed (the same connection id and hello nonce each time). Each session has keys of its
/// own: the servers' first data packets, the same message under the same packet number, are
/// sealed differently (under one key and nonce they would be the same bytes: AES-GCM nonce
/// reuse), so are the clients', and what one session's server sealed does not open in another
/// session.
#[test]
fn two_sessions_from_one_token_never_share_packet_keys() {
    let token = mint(&key(), 1, &[addr(1), addr(5)], UNIX + 60);
    let net = new_net();
    let now = net.now;
    let mut buf = vec![0u8; 2048];
    let mut sessions = Vec::new();
    for (at, seed) in [(addr(1), 1), (addr(5), 5), (addr(1), 77)] {
        let adm = TokenAdmission::new(key(), PROTOCOL_ID, vec![at]);
        let mut server = token_server(&net, ListenConfig::tokens(adm), seed);
        let mut c = client(&net, 2);
        let (h, [.., accept]) = handshake_with(&mut server, at, &mut c, &token, now, addr(2));
        c.handle_datagram(now, at, &accept).expect("accept taken");
        assert!(matches!(c.poll_event(), Some((hh, Event::Connected)) if hh == h));
        let Some((sh, Event::Connected)) = server.poll_event() else {
            panic!("the server has the session");
        };
        server
            .send(sh, 0, Bytes::from_static(b"same words"))
            .unwrap();
        let t = server.poll_transmit(now, &mut buf).expect("server data");
        let from_server = buf[..t.size].to_vec();
        c.send(h, 0, Bytes::from_static(b"same words")).unwrap();
        let t = c.poll_transmit(now, &mut buf).expect("client data");
        let from_client = buf[..t.size].to_vec();
        sessions.push((c, h, from_server, from_client));
    }
    let body = |p: &[u8]| p[wire::clear_header(p).unwrap().len..].to_vec();
    for i in 0..sessions.len() {
        for j in 0..sessions.len() {
            if i == j {
                continue;
            }
            let (theirs, ours) = (&sessions[i].2, &sessions[j].2);
            assert_eq!(
                wire::clear_header(theirs).unwrap().number,
                wire::clear_header(ours).unwrap().number
            );
            assert_ne!(theirs, ours, "server packets of sessions {i} and {j}");
            assert_ne!(
                body(&sessions[i].3),
                body(&sessions[j].3),
                "client packets of sessions {i} and {j}"
            );
            // Session i's server packet, delivered to session j's client.
            let packet = theirs.clone();
            let h = sessions[j].1;
            let c = &mut sessions[j].0;
            assert_eq!(
                c.handle_datagram(now, addr(1), &packet),
                Err(DropCause::Unauthenticated),
                "session {i}'s packet in session {j}"
            );
            assert!(c.poll_event().is_none(), "nothing delivered");
            assert_eq!(c.connection(h).unwrap().stats().packets_received, 0);
        }
    }
    // Each opens where it belongs.
    for (i, (c, h, from_server, _)) in sessions.iter_mut().enumerate() {
        let packet = from_server.clone();
        assert_eq!(c.handle_datagram(now, addr(1), &packet), Ok(()), "{i}");
        match c.poll_event() {
            Some((hh, Event::Message { data, .. })) if hh == *h => {
                assert_eq!(&data[..], b"same words")
            }
            other => panic!("session {i}: {other:?}"),
        }
    }
}

/// A client whose accept from the token's first server was lost falls back to the second
/// (`try_next_server`), keeping its connection (and its connection id). The first server still
/// has the session and sends on it; none of it reaches the client's session with the second
/// server: it does not open under that session's keys.
#[test]
fn after_falling_back_to_the_next_server_nothing_from_the_first_is_accepted() {
    let (mut net, a, b, c, token) = two_servers(ListenConfig::tokens(admission()));
    // Every accept server A sends is lost.
    net.drop_if = Some(Box::new(|from, _, bytes| {
        from == addr(1) && bytes.first() == Some(&(wire::PacketType::SealedAccept as u8))
    }));
    let now = net.now;
    let h = net.ep(c).connect_with_token(now, &token);
    let (mut at_a, mut at_b) = (None, None);
    let r = outcome(
        &mut net,
        c,
        h,
        Duration::from_secs(8),
        &mut |ep, n, sh, e| {
            if ep == a && e == Event::Connected {
                // A has the session (the client proved its address and token) and talks.
                at_a = Some(sh);
                n.ep(a).send(sh, 0, Bytes::from_static(b"from A")).unwrap();
            }
            if ep == b && e == Event::Connected {
                at_b = Some(sh);
            }
        },
    );
    assert_eq!(r, Some(Ok(())));
    assert_eq!(net.ep(c).connection(h).unwrap().remote_addr(), addr(5));
    let at_a = at_a.expect("server A admitted the client");
    assert!(net.ep(a).connection(at_a).is_some(), "A's session lives on");
    net.drop_if = None;
    let at_b = at_b.expect("server B has the session");
    // A packet A seals now, handed straight to the client: it does not open.
    let mut buf = vec![0u8; 2048];
    let now = net.now;
    net.ep(a)
        .send(at_a, 0, Bytes::from_static(b"A again"))
        .unwrap();
    let mut from_a = Vec::new();
    while let Some(t) = net.ep(a).poll_transmit(now, &mut buf) {
        assert_eq!(t.destination, addr(2));
        from_a.push(buf[..t.size].to_vec());
    }
    assert!(!from_a.is_empty(), "A sent on its session");
    let received = net.ep(c).connection(h).unwrap().stats().packets_received;
    for p in &from_a {
        assert_eq!(
            net.ep(c).handle_datagram(now, addr(1), p),
            Err(DropCause::Unauthenticated)
        );
    }
    assert_eq!(
        net.ep(c).connection(h).unwrap().stats().packets_received,
        received
    );
    // Both servers go on sending; the client hears B, all of it, and nothing of A.
    let unauthenticated = net.ep(c).stats().drops.get(DropCause::Unauthenticated);
    for k in 0..5u8 {
        net.ep(a).send(at_a, 0, Bytes::from(vec![b'A', k])).unwrap();
        net.ep(b).send(at_b, 0, Bytes::from(vec![b'B', k])).unwrap();
    }
    let mut got = Vec::new();
    let limit = net.now + Duration::from_secs(1);
    net.run_until(limit, &mut |ep, _, eh, e| {
        if let (true, Event::Message { data, .. }) = (ep == c && eh == h, e) {
            got.push(data);
        }
    });
    let expect: Vec<Bytes> = (0..5u8).map(|k| Bytes::from(vec![b'B', k])).collect();
    assert_eq!(got, expect);
    assert!(
        net.ep(c).stats().drops.get(DropCause::Unauthenticated) > unauthenticated,
        "A's packets fail authentication"
    );
}

/// A full first server answers each of the client's cookie echoes with a refusal. The first
/// refusal moves the client to the token's next server; a second one arriving late (the echo
/// was retransmitted before the first refusal came back) is ignored. Before, it moved the
/// client past the next server too, and the connect failed `ServerFull` though that server had
/// room.
#[test]
fn a_late_refusal_from_a_server_left_behind_is_ignored() {
    use std::cell::RefCell;
    use std::rc::Rc;
    let full = ListenConfig::tokens(admission()).with(|s| s.max_sessions = 0);
    let (mut net, _, b, c, token) = two_servers(full);
    // Hold server A's refusals back until the client has sent two echoes.
    let held: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
    let keep = held.clone();
    net.drop_if = Some(Box::new(move |from, _, bytes| {
        let refusal = from == addr(1) && bytes.first() == Some(&(wire::PacketType::Refuse as u8));
        if refusal {
            keep.borrow_mut().push(bytes.to_vec());
        }
        refusal
    }));
    let now = net.now;
    let h = net.ep(c).connect_with_token(now, &token);
    let limit = net.now + Duration::from_secs(2);
    while held.borrow().len() < 2 {
        assert!(net.now < limit, "A refused {} echoes", held.borrow().len());
        let step = net.now + Duration::from_millis(10);
        net.run_until(step, &mut |_, _, _, _| {});
    }
    net.drop_if = None;
    let refusals = held.borrow().clone();
    let now = net.now;
    net.ep(c)
        .handle_datagram(now, addr(1), &refusals[0])
        .unwrap();
    assert_eq!(net.ep(c).connection(h).unwrap().remote_addr(), addr(5));
    assert_eq!(
        net.ep(c).handle_datagram(now, addr(1), &refusals[1]),
        Err(DropCause::UnexpectedHandshake)
    );
    let r = outcome(&mut net, c, h, Duration::from_secs(5), &mut |_, _, _, _| {});
    assert_eq!(r, Some(Ok(())), "the client reaches server B");
    assert_eq!(net.ep(b).connection_count(), 1);
}

/// A server shutting down (it stopped accepting) refuses with `Shutdown`, and the client goes
/// on to the next server its token lists instead of giving up.
#[test]
fn a_server_shutting_down_sends_the_client_to_the_next_one() {
    let (mut net, a, b, c, token) = two_servers(ListenConfig::tokens(admission()));
    net.ep(a).stop_accepting();
    let now = net.now;
    let h = net.ep(c).connect_with_token(now, &token);
    let r = outcome(&mut net, c, h, Duration::from_secs(5), &mut |_, _, _, _| {});
    assert_eq!(r, Some(Ok(())));
    assert_eq!(net.ep(c).connection(h).unwrap().remote_addr(), addr(5));
    assert_eq!(net.ep(a).connection_count(), 0);
    assert_eq!(net.ep(b).connection_count(), 1);
}

/// A draining server refuses with `Draining` (tagged, so a token client believes it), and the
/// client goes on to the next server its token lists; a client whose token lists only the
/// draining server learns `Draining`.
#[test]
fn a_draining_server_sends_the_client_to_the_next_one() {
    let (mut net, a, b, c, token) = two_servers(ListenConfig::tokens(admission()));
    net.ep(a).start_draining();
    let now = net.now;
    let h = net.ep(c).connect_with_token(now, &token);
    let r = outcome(&mut net, c, h, Duration::from_secs(5), &mut |_, _, _, _| {});
    assert_eq!(r, Some(Ok(())));
    assert_eq!(net.ep(c).connection(h).unwrap().remote_addr(), addr(5));
    assert_eq!(net.ep(a).connection_count(), 0);
    assert_eq!(net.ep(b).connection_count(), 1);
    let only_a = mint(&key(), 2, &[addr(1)], UNIX + 60);
    let now = net.now;
    let h = net.ep(c).connect_with_token(now, &only_a);
    let r = outcome(&mut net, c, h, Duration::from_secs(5), &mut |_, _, _, _| {});
    assert_eq!(r, refused(CloseReason::Draining));
    // Stopping after draining refuses with `Shutdown`.
    net.ep(a).stop_accepting();
    let only_a = mint(&key(), 3, &[addr(1)], UNIX + 60);
    let now = net.now;
    let h = net.ep(c).connect_with_token(now, &only_a);
    let r = outcome(&mut net, c, h, Duration::from_secs(5), &mut |_, _, _, _| {});
    assert_eq!(r, refused(CloseReason::Shutdown));
}

/// Server A at `addr(1)` with settings `a`, server B at `addr(5)` (defaults), a client at
/// `addr(2)`, and a token listing A then B: (net, a, b, client, token).
fn two_servers(a: ListenConfig) -> (Net, usize, usize, usize, ConnectToken) {
    let mut net = new_net();
    let a = net.add(addr(1), token_server(&net, a, 1));
    let adm_b = TokenAdmission::new(key(), PROTOCOL_ID, vec![addr(5)]);
    let b = net.add(addr(5), token_server(&net, ListenConfig::tokens(adm_b), 5));
    let c = net.add(addr(2), client(&net, 2));
    let token = mint(&key(), 1, &[addr(1), addr(5)], UNIX + 60);
    (net, a, b, c, token)
}
