//! A peer that keeps sending but never acknowledges is closed after the idle timeout.
//!
//! The idle timeout alone counts time since anything arrived, so a client that sends its
//! inputs but withholds (or loses) every acknowledgement of the server's packets kept its
//! session open for as long as it liked, while the server's queues for it (snapshots held back
//! by a congestion window that never opens) grew to the send-queue limit.

mod proto_util;

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use proto_util::{addr, Net};
use ricochet_proto::{CloseReason, Config, Endpoint, EndpointConfig, Event, ListenConfig};

const TICK: Duration = Duration::from_micros(16_667);

/// Server (idle timeout 2 s) and client (idle timeout `client_idle`) exchange a message each
/// way every tick; after 1 s every datagram the server sends is lost, so nothing it sends is
/// acknowledged while the client's inputs still arrive. Returns when (after the blackout began)
/// and why the server closed, if it did within `span`.
fn withheld(client_idle: Duration, span: Duration) -> Option<(Duration, CloseReason)> {
    let server_cfg = Arc::new(Config::default().with(|c| c.idle_timeout = Duration::from_secs(2)));
    let client_cfg = Arc::new(Config::default().with(|c| c.idle_timeout = client_idle));
    let mut net = Net::delayed(Duration::from_millis(1), 5);
    let server = EndpointConfig::default().with(|c| {
        c.connection = server_cfg;
        c.server = Some(ListenConfig::insecure());
    });
    let client = EndpointConfig::default().with(|c| c.connection = client_cfg);
    let now = net.now;
    let s = net.add(addr(1), Endpoint::new(server, now, 1));
    let c = net.add(addr(2), Endpoint::new(client, now, 2));
    let hc = net.ep(c).connect(now, addr(1));
    let hs = Rc::new(Cell::new(None));
    let closed: Rc<Cell<Option<(Instant, CloseReason)>>> = Rc::new(Cell::new(None));
    let (h2, c2) = (hs.clone(), closed.clone());
    let mut on_event = move |ep: usize, net: &mut Net, h, e: Event| {
        if ep != s {
            return;
        }
        match e {
            Event::Connected => h2.set(Some(h)),
            Event::Closed { reason, .. } => c2.set(Some((net.now, reason))),
            _ => {}
        }
    };
    let start = net.now;
    let mut dark_from = None;
    while net.now < start + Duration::from_secs(1) + span && closed.get().is_none() {
        if dark_from.is_none() && net.now >= start + Duration::from_secs(1) {
            dark_from = Some(net.now);
            let server_addr = addr(1);
            net.drop_if = Some(Box::new(move |from, _, _| from == server_addr));
        }
        let _ = net.ep(c).send(hc, 0, Bytes::from(vec![0x11; 32]));
        if let Some(h) = hs.get() {
            let _ = net.ep(s).send(h, 3, Bytes::from(vec![0x22; 200]));
        }
        let until = net.now + TICK;
        net.run_until(until, &mut on_event);
    }
    assert!(hs.get().is_some(), "the session never connected");
    closed.get().map(|(t, r)| {
        (
            t.saturating_duration_since(dark_from.expect("went dark")),
            r,
        )
    })
}

#[test]
fn a_peer_that_never_acknowledges_is_closed_after_the_idle_timeout() {
    // The client's own idle timeout is far away, and its inputs keep arriving: only the
    // server's unacknowledged sends can end the session.
    let (after, reason) =
        withheld(Duration::from_secs(60), Duration::from_secs(8)).expect("the server closed");
    assert_eq!(reason, CloseReason::IdleTimeout);
    assert!(
        after >= Duration::from_millis(1_900) && after <= Duration::from_millis(2_500),
        "closed {after:?} after the acknowledgements stopped"
    );
}

/// Behind a congestion window that never opens, an unreliable channel's queue stays within
/// `unreliable_queue_limit`: the oldest messages are dropped unsent and counted.
#[test]
fn unsent_unreliable_messages_are_bounded_per_channel() {
    let limit = 16 << 10;
    let cfg = Arc::new(Config::default().with(|c| c.unreliable_queue_limit = limit));
    let mut net = Net::delayed(Duration::from_millis(1), 6);
    let (s, c) = net.add_pair(cfg);
    let now = net.now;
    let hc = net.ep(c).connect(now, addr(1));
    let until = net.now + Duration::from_millis(100);
    net.run_until(until, &mut |_, _, _, _| {});
    // From here nothing the client sends arrives, so nothing it sends is acknowledged.
    let client_addr = addr(2);
    net.drop_if = Some(Box::new(move |from, _, _| from == client_addr));
    for _ in 0..400 {
        // Unreliable-sequenced (channel 3), 1 KB each: 400 KB offered in 2 s.
        net.ep(c)
            .send(hc, 3, Bytes::from(vec![0x33; 1_000]))
            .expect("queued");
        let until = net.now + Duration::from_millis(5);
        net.run_until(until, &mut |_, _, _, _| {});
        let conn = net.ep(c).connection(hc).expect("client");
        assert!(
            conn.queued_bytes() <= limit + 1_000,
            "{}",
            conn.queued_bytes()
        );
    }
    let st = net.ep(c).connection(hc).expect("client").stats();
    assert!(st.unreliable_unsent > 300, "{st:?}");
    let _ = s;
}
