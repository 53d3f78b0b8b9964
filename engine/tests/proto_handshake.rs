//! Handshake, close, refusals and the stateless-cookie flood over an in-test network.

mod proto_util;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proto_util::{addr, Impair, Net};
use ricochet_proto::{CloseReason, Config, Endpoint, EndpointConfig, Event, ServerConfig};

fn server_cfg() -> EndpointConfig {
    EndpointConfig {
        connection: Arc::new(Config::default()),
        server: Some(ServerConfig::default()),
        ..EndpointConfig::default()
    }
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
                by_peer: false
            }
        )),
        "{log:?}"
    );
    assert!(
        log.contains(&(
            s,
            Event::Closed {
                reason: CloseReason::Application,
                by_peer: true
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

#[test]
fn placed_cookie_names_the_least_loaded_worker_and_any_worker_verifies_it() {
    use ricochet_proto::{worker_of_datagram, DropCause, Placement};
    let now = std::time::Instant::now();
    let placement = Placement::new(2);
    let secret = [7u8; 32];
    let mut workers: Vec<Endpoint> = (0..2u8)
        .map(|w| {
            let mut e = Endpoint::new(server_cfg(), now, 100 + u64::from(w));
            e.set_worker_tag(w);
            e.set_cookie_secret(now, secret);
            e.set_placement(placement.clone());
            e
        })
        .collect();
    let caddr = addr(50);
    // Every hello reaches worker 0 (as when all clients hash there); the sessions still split.
    let mut named = Vec::new();
    for k in 0..6u64 {
        let mut client = Endpoint::new(client_cfg(), now, 200 + k);
        let echo = echo_after_challenge(&mut client, &mut workers[0], now);
        let w = worker_of_datagram(&echo).expect("a placed echo names its worker");
        named.push(w);
        // Worker 1 accepts cookies worker 0 issued: one secret, one clock.
        workers[usize::from(w)]
            .handle_datagram(now, caddr, &echo)
            .expect("the named worker accepts the echo");
        // A forged name fails the cookie, whichever worker it reaches.
        let mut forged = echo.clone();
        forged[ricochet_proto::wire::ECHO_WORKER_OFFSET] ^= 1;
        assert_eq!(
            workers[usize::from(1 - w)].handle_datagram(now, caddr, &forged),
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
fn endpoints_without_a_shared_secret_refuse_each_others_cookies() {
    let now = std::time::Instant::now();
    let mut a = Endpoint::new(server_cfg(), now, 1);
    let mut b = Endpoint::new(server_cfg(), now, 2);
    let mut client = Endpoint::new(client_cfg(), now, 3);
    let echo = echo_after_challenge(&mut client, &mut a, now);
    assert_eq!(ricochet_proto::worker_of_datagram(&echo), None);
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
        let cfg = EndpointConfig {
            transmit_burst: burst,
            ..server_cfg()
        };
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
