//! Handshake, close, refusals and the stateless-cookie flood over an in-test network.

mod proto_util;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proto_util::{addr, Impair, Net};
use ricochet_proto::{CloseReason, Config, Endpoint, EndpointConfig, Event, ListenConfig};

fn server_cfg() -> EndpointConfig {
    EndpointConfig::default().with(|c| {
        c.connection = Arc::new(Config::default());
        c.server = Some(ListenConfig::insecure());
    })
}

fn client_cfg() -> EndpointConfig {
    EndpointConfig::default()
}

#[test]
fn connect_echo_and_graceful_close() {
    let mut net = Net::new(
        Impair {
            delay: Duration::from_millis(10),
            ..Impair::default()
        },
        1,
    );
    let s = net.add(addr(1), Endpoint::new(server_cfg(), net.now, 11));
    let c = net.add(addr(2), Endpoint::new(client_cfg(), net.now, 12));
    let now = net.now;
    let h = net.ep(c).connect(now, addr(1));
    net.ep(c).send(h, 0, Bytes::from_static(b"hello")).unwrap();
    let mut log = Vec::new();
    let limit = net.now + Duration::from_secs(2);
    net.run_until(limit, &mut |ep, net, h, e| {
        if ep == s {
            if let Event::Message { channel, data } = &e {
                net.ep(s).send(h, *channel, data.clone()).unwrap();
            }
        }
        log.push((ep, e));
    });
    assert!(log.contains(&(s, Event::Connected)));
    assert!(log.contains(&(c, Event::Connected)));
    assert!(log.contains(&(
        c,
        Event::Message {
            channel: 0,
            data: Bytes::from_static(b"hello")
        }
    )));
    // Graceful close: both sides learn the reason.
    let now = net.now;
    net.ep(c).close(now, h, CloseReason::Application);
    let limit = net.now + Duration::from_secs(5);
    log.clear();
    net.run_until(limit, &mut |ep, _, _, e| log.push((ep, e)));
    assert!(
        log.contains(&(
            c,
            Event::Closed {
                reason: CloseReason::Application,
                by_peer: false,
                message: Default::default(),
            }
        )),
        "{log:?}"
    );
    assert!(
        log.contains(&(
            s,
            Event::Closed {
                reason: CloseReason::Application,
                by_peer: true,
                message: Default::default(),
            }
        )),
        "{log:?}"
    );
    assert_eq!(net.ep(s).connection_count(), 0);
    assert_eq!(net.ep(c).connection_count(), 0);
    // No server reply before the cookie echo was larger than its request.
    assert!(net.ep(s).stats().max_stateless_reply < ricochet_proto::wire::MIN_CLIENT_HELLO_LEN);
}

/// The cookie echo a fresh client sends after `server` (whichever worker the kernel gave the
/// hello to) challenges it.
fn echo_after_challenge(
    client: &mut Endpoint,
    server: &mut Endpoint,
    now: std::time::Instant,
) -> Vec<u8> {
    let (caddr, saddr) = (addr(50), addr(1));
    let _ = client.connect(now, saddr);
    let mut buf = vec![0u8; 2048];
    let t = client.poll_transmit(now, &mut buf).expect("hello");
    server.handle_datagram(now, caddr, &buf[..t.size]).unwrap();
    let t = server.poll_transmit(now, &mut buf).expect("challenge");
    client.handle_datagram(now, saddr, &buf[..t.size]).unwrap();
    let t = client.poll_transmit(now, &mut buf).expect("cookie echo");
    buf[..t.size].to_vec()
}

/// A router that marks its ids, routes every session to 0x0102 and counts sessions.
#[derive(Debug, Default)]
struct TestRouter {
    opened: Arc<std::sync::atomic::AtomicU32>,
    closed: Arc<std::sync::atomic::AtomicU32>,
}

impl ricochet_proto::Router for TestRouter {
    fn connection_id_bits(&mut self, random: u32) -> u32 {
        (random & !0xffff) | 0xabcd
    }
    fn route_new_session(&mut self) -> u16 {
        0x0102
    }
    fn session_opened(&mut self) {
        self.opened
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn session_closed(&mut self) {
        self.closed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[test]
fn the_router_writes_ids_and_routes_and_sees_sessions_open_and_close() {
    use ricochet_proto::{wire, DropCause};
    use std::sync::atomic::Ordering;
    let now = std::time::Instant::now();
    let router = TestRouter::default();
    let (opened, closed) = (router.opened.clone(), router.closed.clone());
    let secret = [7u8; 32];
    let mut a = Endpoint::new(server_cfg(), now, 100);
    a.set_router(Box::new(router));
    a.set_cookie_secret(now, secret);
    // A second endpoint with the same secret verifies the first one's cookies.
    let mut b = Endpoint::new(server_cfg(), now, 101);
    b.set_cookie_secret(now, secret);
    let mut client = Endpoint::new(client_cfg(), now, 200);
    let echo = echo_after_challenge(&mut client, &mut a, now);
    let route = &echo[wire::ECHO_ROUTE_OFFSET..wire::ECHO_ROUTE_OFFSET + 2];
    assert_eq!(
        route,
        [0x01, 0x02],
        "the echo returns the route the cookie carries"
    );
    // The route is MAC-covered: a client cannot pick another one.
    let mut forged = echo.clone();
    forged[wire::ECHO_ROUTE_OFFSET + 1] ^= 1;
    assert_eq!(
        b.handle_datagram(now, addr(50), &forged),
        Err(DropCause::BadCookie)
    );
    a.handle_datagram(now, addr(50), &echo).unwrap();
    assert_eq!(opened.load(Ordering::Relaxed), 1);
    // The accept carries the server's id, whose bits 32..=40 the router wrote (the endpoint
    // keeps those 9 of its bits).
    let mut buf = vec![0u8; 2048];
    let t = a.poll_transmit(now, &mut buf).expect("accept");
    let Ok(wire::Packet::ServerAccept { server_cid, .. }) = wire::decode_packet(&buf[..t.size])
    else {
        panic!("expected an accept");
    };
    assert_eq!((server_cid.0 >> 32) & 0x1ff, 0xabcd & 0x1ff);
    // Closing the session tells the router.
    let (h, _) = a.poll_event().expect("connected");
    a.close(now, h, CloseReason::Application);
    let later = now + Duration::from_secs(10);
    a.handle_timeout(later);
    while a.poll_transmit(later, &mut buf).is_some() {}
    a.handle_timeout(later + Duration::from_secs(10));
    assert_eq!(a.connection_count(), 0);
    assert_eq!(closed.load(Ordering::Relaxed), 1);
}

#[test]
fn endpoints_without_a_shared_secret_refuse_each_others_cookies() {
    let now = std::time::Instant::now();
    let mut a = Endpoint::new(server_cfg(), now, 1);
    let mut b = Endpoint::new(server_cfg(), now, 2);
    let mut client = Endpoint::new(client_cfg(), now, 3);
    let echo = echo_after_challenge(&mut client, &mut a, now);
    let route = ricochet_proto::wire::ECHO_ROUTE_OFFSET;
    assert_eq!(echo[route..route + 2], [0, 0], "no router: no route");
    assert_eq!(
        b.handle_datagram(now, addr(50), &echo),
        Err(ricochet_proto::DropCause::BadCookie)
    );
    a.handle_datagram(now, addr(50), &echo).unwrap();
    assert_eq!(a.connection_count(), 1);
}

/// The destinations of everything `server` has to send now, in order.
fn drain_destinations(net: &mut Net, server: usize) -> Vec<std::net::SocketAddr> {
    let now = net.now;
    let mut buf = vec![0u8; 65_536];
    let mut out = Vec::new();
    while let Some(t) = net.ep(server).poll_transmit(now, &mut buf) {
        out.push(t.destination);
    }
    out
}

#[test]
fn transmit_burst_takes_runs_from_one_connection_then_moves_on() {
    for burst in [1usize, 3, 16] {
        let mut net = Net::new(Impair::default(), 3);
        let cfg = server_cfg().with(|c| c.transmit_burst = burst);
        let s = net.add(addr(1), Endpoint::new(cfg, net.now, 21));
        let mut sessions = Vec::new();
        for (i, seed) in [(2u16, 22u64), (3, 23)] {
            let c = net.add(addr(i), Endpoint::new(client_cfg(), net.now, seed));
            let now = net.now;
            net.ep(c).connect(now, addr(1));
        }
        let limit = net.now + Duration::from_secs(1);
        net.run_until(limit, &mut |ep, _, h, e| {
            if ep == s && e == Event::Connected {
                sessions.push(h);
            }
        });
        assert_eq!(sessions.len(), 2, "burst {burst}: both connected");
        // Six datagrams' worth for each session, queued in one go.
        for &h in &sessions {
            for _ in 0..6 {
                net.ep(s).send(h, 0, Bytes::from(vec![7u8; 1000])).unwrap();
            }
        }
        let order = drain_destinations(&mut net, s);
        assert_eq!(order.len(), 12, "burst {burst}: {order:?}");
        let mut runs: Vec<usize> = Vec::new();
        for (i, d) in order.iter().enumerate() {
            if i > 0 && order[i - 1] == *d {
                *runs.last_mut().unwrap() += 1;
            } else {
                runs.push(1);
            }
        }
        // Runs of `burst` (the last of a connection may be shorter), alternating while both
        // have data.
        let expected: Vec<usize> = match burst {
            1 => vec![1; 12],
            3 => vec![3; 4],
            _ => vec![6, 6],
        };
        assert_eq!(runs, expected, "burst {burst}: {order:?}");
    }
}

/// A server that stopped accepting (shutting down) refuses a client that completes its
/// handshake with `Shutdown`, and opens no session for it; sessions already open stay.
#[test]
fn a_server_that_stopped_accepting_refuses_with_shutdown() {
    let mut net = Net::delayed(Duration::from_millis(5), 3);
    let s = net.add(addr(1), Endpoint::new(server_cfg(), net.now, 31));
    let a = net.add(addr(2), Endpoint::new(client_cfg(), net.now, 32));
    let b = net.add(addr(3), Endpoint::new(client_cfg(), net.now, 33));
    let now = net.now;
    net.ep(a).connect(now, addr(1));
    let mut log = Vec::new();
    let limit = net.now + Duration::from_secs(1);
    net.run_until(limit, &mut |ep, _, _, e| log.push((ep, e)));
    assert!(log.contains(&(a, Event::Connected)), "{log:?}");
    net.ep(s).stop_accepting();
    let now = net.now;
    net.ep(b).connect(now, addr(1));
    log.clear();
    let limit = net.now + Duration::from_secs(1);
    net.run_until(limit, &mut |ep, _, _, e| log.push((ep, e)));
    assert_eq!(
        log,
        [(
            b,
            Event::Closed {
                reason: CloseReason::Shutdown,
                by_peer: true,
                message: Bytes::new(),
            }
        )]
    );
    assert_eq!(net.ep(s).connection_count(), 1, "the first session stays");
}

/// A protected session's close packet is sealed or not sent at all, whatever buffer the
/// embedder hands `poll_transmit`: with room for the packet but not for its tag, nothing goes
/// out (before, the close frame left in clear); with room, it is sealed and the peer opens it.
#[test]
fn a_close_that_cannot_be_sealed_is_not_sent_in_clear() {
    use ricochet_proto::wire::{DATA_HEADER_LEN, TAG_LEN};
    // Header and a close frame (type, reason): the packet in clear.
    let clear = DATA_HEADER_LEN + 2;
    for config in [Config::default(), Config::competitive()] {
        let fec = config.fec.policy != ricochet_proto::fec::FecPolicy::Off;
        for buf_len in [clear, 1500] {
            let (mut net, s, c, h) = secure_pair(config.clone());
            // Nothing unacknowledged: the close goes straight to draining, its packet due now.
            let now = net.now;
            net.ep(c).close(now, h, CloseReason::Application);
            let mut buf = vec![0u8; buf_len];
            let t = net.ep(c).poll_transmit(now, &mut buf);
            if buf_len == clear {
                assert_eq!(t, None, "fec {fec}: no room for the tag, nothing sent");
                continue;
            }
            let t = t.expect("a close packet");
            assert!(t.size >= clear + TAG_LEN, "fec {fec}: {} B", t.size);
            // The server opens it: the session ends, closed by its peer.
            net.ep(s)
                .handle_datagram(now, addr(2), &buf[..t.size])
                .unwrap();
            let mut closed = None;
            while let Some((_, e)) = net.ep(s).poll_event() {
                if let Event::Closed {
                    reason, by_peer, ..
                } = e
                {
                    closed = Some((reason, by_peer));
                }
            }
            assert_eq!(closed, Some((CloseReason::Application, true)), "fec {fec}");
        }
    }
}

/// A server at `addr(1)` and a client at `addr(2)` whose sessions are protected (a shared test
/// secret), connected and settled: (net, server, client, client's handle).
fn secure_pair(config: Config) -> (Net, usize, usize, ricochet_proto::ConnectionHandle) {
    let config = Arc::new(config);
    let secret = Some([3; 32]);
    let mut net = Net::new(Impair::default(), 5);
    let server = server_cfg().with(|c| {
        c.connection = config.clone();
        c.test_session_secret = secret;
    });
    let s = net.add(addr(1), Endpoint::new(server, net.now, 1));
    let client = EndpointConfig::default().with(|c| {
        c.connection = config;
        c.test_session_secret = secret;
    });
    let c = net.add(addr(2), Endpoint::new(client, net.now, 2));
    let now = net.now;
    let h = net.ep(c).connect(now, addr(1));
    let mut connected = false;
    let limit = net.now + Duration::from_secs(2);
    while !connected
        && net.step(limit, &mut |i, _, _, e| {
            connected |= i == c && e == Event::Connected;
        })
    {}
    assert!(connected);
    let limit = net.now + Duration::from_millis(100);
    net.run_until(limit, &mut |_, _, _, _| {});
    assert!(net.ep(c).connection(h).unwrap().is_secure());
    (net, s, c, h)
}

/// A client whose handshake outlives the default 5 s (a loaded host).
fn patient_client_cfg() -> EndpointConfig {
    EndpointConfig::default().with(|c| {
        c.connection = Arc::new(Config::default().with(|k| {
            k.handshake_timeout = Duration::from_secs(30);
        }))
    })
}

/// Runs `client`'s timers up to `until` in 100 ms steps, discarding what it sends (lost on
/// the way); returns the last datagram it sent.
fn client_sends_lost(
    client: &mut Endpoint,
    from: std::time::Instant,
    until: std::time::Instant,
) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 2048];
    let (mut now, mut last) = (from, None);
    while now < until {
        now += Duration::from_millis(100);
        client.handle_timeout(now);
        while let Some(t) = client.poll_transmit(now, &mut buf) {
            last = Some(buf[..t.size].to_vec());
        }
    }
    last
}

/// Delivers every datagram between `client` (at addr(50)) and `server` (at addr(1)) at
/// `now` until neither has anything to send.
fn exchange(client: &mut Endpoint, server: &mut Endpoint, now: std::time::Instant) {
    let mut buf = vec![0u8; 2048];
    for _ in 0..16 {
        let mut moved = false;
        while let Some(t) = client.poll_transmit(now, &mut buf) {
            let _ = server.handle_datagram(now, addr(50), &buf[..t.size]);
            moved = true;
        }
        while let Some(t) = server.poll_transmit(now, &mut buf) {
            let _ = client.handle_datagram(now, addr(1), &buf[..t.size]);
            moved = true;
        }
        if !moved {
            return;
        }
    }
}

/// A cookie echo that reaches the server only after the cookie expired (its first echoes
/// lost, or the client too busy to send them) gets a fresh challenge instead of a silent
/// drop, and the client connects with it: before, the client echoed the stale cookie until
/// its handshake timed out (the 10,000-session connect wall of `bench game` on a loaded
/// host).
#[test]
fn an_echo_of_an_expired_cookie_is_answered_with_a_fresh_challenge() {
    let t0 = std::time::Instant::now();
    let mut server = Endpoint::new(server_cfg(), t0, 1);
    let mut client = Endpoint::new(patient_client_cfg(), t0, 2);
    let first = echo_after_challenge(&mut client, &mut server, t0);
    let lifetime = server_cfg().server.expect("listening").cookie_lifetime;
    let late = t0 + lifetime + Duration::from_secs(1);
    let echo = client_sends_lost(&mut client, t0, late).expect("the client echoes again");
    assert_eq!(echo.len(), first.len(), "still echoing its cookie");
    server.handle_datagram(late, addr(50), &echo).unwrap();
    assert_eq!(server.stats().cookies_renewed, 1);
    assert_eq!(
        server.connection_count(),
        0,
        "nothing kept for a stale echo"
    );
    exchange(&mut client, &mut server, late);
    assert_eq!(server.connection_count(), 1);
    assert!(
        std::iter::from_fn(|| client.poll_event()).any(|(_, e)| e == Event::Connected),
        "the client connected with the renewed cookie"
    );
    // No reply was larger than the request that caused it.
    assert!(server.stats().max_stateless_reply < ricochet_proto::wire::MIN_CLIENT_HELLO_LEN);
}

/// An echo of a session the server opened, arriving after its cookie expired (the accept
/// lost, or read late by a busy client), brings the accept again.
#[test]
fn a_late_echo_of_an_open_session_brings_its_accept_again() {
    let t0 = std::time::Instant::now();
    let mut server = Endpoint::new(server_cfg(), t0, 1);
    let mut client = Endpoint::new(patient_client_cfg(), t0, 2);
    let echo = echo_after_challenge(&mut client, &mut server, t0);
    server.handle_datagram(t0, addr(50), &echo).unwrap();
    assert_eq!(server.connection_count(), 1);
    let mut buf = vec![0u8; 2048];
    assert!(
        server.poll_transmit(t0, &mut buf).is_some(),
        "the accept (lost)"
    );
    let lifetime = server_cfg().server.expect("listening").cookie_lifetime;
    let late = t0 + lifetime + Duration::from_secs(1);
    let again = client_sends_lost(&mut client, t0, late).expect("the client echoes again");
    server.handle_datagram(late, addr(50), &again).unwrap();
    assert_eq!(
        server.stats().cookies_renewed,
        0,
        "the session's own cookie"
    );
    exchange(&mut client, &mut server, late);
    assert_eq!(server.connection_count(), 1, "the same session");
    assert!(
        std::iter::from_fn(|| client.poll_event()).any(|(_, e)| e == Event::Connected),
        "the client connected"
    );
}
