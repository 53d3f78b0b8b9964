//! Handshake, close, refusals and the stateless-cookie flood over an in-test network.

mod proto_util;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proto_util::{addr, Impair, Net};
use ricochet::proto::{CloseReason, Config, Endpoint, EndpointConfig, Event, ServerConfig};

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
    assert!(net.ep(s).stats().max_stateless_reply < ricochet::wire::MIN_CLIENT_HELLO_LEN);
}
