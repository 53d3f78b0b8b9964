//! The endpoint's timer queue: an endpoint's deadline is always its earliest connection's, and
//! a connection something happened to counts as due until `poll_transmit` has visited it (its
//! deadline is recomputed then, not at every packet).

mod proto_util;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use proto_util::{addr, Impair, Net};
use ricochet_proto::{Config, ConnectionHandle, Endpoint, EndpointConfig, Event, ListenConfig};

const CLIENTS: u16 = 40;

/// The earliest deadline among the connections behind `handles`.
fn earliest(ep: &Endpoint, handles: &[ConnectionHandle]) -> Option<Instant> {
    handles
        .iter()
        .filter_map(|&h| ep.connection(h))
        .filter_map(|c| c.poll_timeout())
        .min()
}

/// Forty clients on one server, each sending a reliable message every 20 ms that the server
/// echoes, over a lossy, reordering path. After every flush, each endpoint's `poll_timeout` is
/// exactly the minimum of its connections' own deadlines.
#[test]
fn endpoint_deadline_is_the_earliest_connection_deadline() {
    let imp = Impair {
        loss: 0.05,
        dup: 0.01,
        reorder: 0.05,
        reorder_extra: Duration::from_millis(7),
        delay: Duration::from_millis(5),
    };
    let mut net = Net::new(imp, 11);
    let cfg = Arc::new(Config::default());
    let server = EndpointConfig::default().with(|c| {
        c.connection = cfg.clone();
        c.server = Some(ListenConfig::insecure());
    });
    let now = net.now;
    let s = net.add(addr(1), Endpoint::new(server, now, 1));
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let ep = Endpoint::new(
            EndpointConfig::default().with(|c| c.connection = cfg.clone()),
            now,
            u64::from(i) + 2,
        );
        let idx = net.add(addr(i + 2), ep);
        let h = net.ep(idx).connect(now, addr(1));
        clients.push((idx, h));
    }
    // Handles per endpoint index: the clients' from `connect`, the server's from its events.
    let mut known = vec![Vec::new(); usize::from(CLIENTS) + 1];
    for &(idx, h) in &clients {
        known[idx].push(h);
    }
    let handles = Rc::new(RefCell::new(known));
    let echoed = Rc::new(RefCell::new(0u64));
    let (hs, n) = (handles.clone(), echoed.clone());
    let mut on_event = move |ep: usize, net: &mut Net, h: ConnectionHandle, e: Event| {
        if !hs.borrow()[ep].contains(&h) {
            hs.borrow_mut()[ep].push(h);
        }
        match e {
            Event::Message { channel, data } if ep == s => {
                let _ = net.ep(s).send(h, channel, data);
            }
            Event::Message { .. } => *n.borrow_mut() += 1,
            _ => {}
        }
    };
    let end = net.now + Duration::from_secs(3);
    let mut next_send = net.now + Duration::from_millis(200);
    let mut checks = 0u64;
    while net.now < end {
        if net.now >= next_send {
            next_send += Duration::from_millis(20);
            for &(idx, h) in &clients {
                let _ = net.ep(idx).send(h, 0, Bytes::from_static(&[7u8; 48]));
            }
        }
        net.flush();
        for i in 0..net.eps.len() {
            let hs = handles.borrow();
            let ep = &net.eps[i].1;
            assert_eq!(
                ep.poll_timeout(),
                earliest(ep, &hs[i]),
                "endpoint {i} at {:?}",
                net.elapsed()
            );
            checks += 1;
        }
        let limit = next_send.min(end);
        if !net.step(limit, &mut on_event) && net.now < limit {
            net.now = limit;
        }
    }
    let hs = handles.borrow();
    let connected = hs[s]
        .iter()
        .filter(|&&h| net.ep(s).connection(h).is_some())
        .count();
    assert_eq!(connected, usize::from(CLIENTS), "all connected");
    assert!(*echoed.borrow() > 1000, "echoes: {}", echoed.borrow());
    assert!(checks > 1000, "checks: {checks}");
}

/// A datagram that only calls for a delayed ACK: the server counts as due at once, and after
/// `poll_transmit` has found nothing to send, its deadline is the ACK's.
#[test]
fn a_touched_connection_is_due_until_poll_transmit_visits_it() {
    let mut net = Net::new(Impair::default(), 3);
    let (s, c) = net.add_pair(Arc::new(Config::default()));
    let now = net.now;
    let ch = net.ep(c).connect(now, addr(1));
    let server_handle = Rc::new(RefCell::new(None));
    let sh = server_handle.clone();
    let mut on_event = move |ep: usize, _: &mut Net, h: ConnectionHandle, e: Event| {
        if ep == s && matches!(e, Event::Connected) {
            *sh.borrow_mut() = Some(h);
        }
    };
    let limit = net.now + Duration::from_millis(100);
    net.run_until(limit, &mut on_event);
    let sh = server_handle.borrow().expect("connected");
    net.flush();
    let idle = net
        .ep(s)
        .poll_timeout()
        .expect("a connected server has a deadline");
    assert!(idle > net.now);

    // Hand the server one reliable message by hand: no reply, so only its ACK is owed.
    net.ep(c)
        .send(ch, 0, Bytes::from_static(b"input"))
        .expect("send");
    let now = net.now;
    let mut buf = vec![0u8; 2048];
    let t = net.ep(c).poll_transmit(now, &mut buf).expect("the message");
    let datagram = buf[..t.size].to_vec();
    while net.ep(c).poll_transmit(now, &mut buf).is_some() {}
    net.ep(s)
        .handle_datagram(now, addr(2), &datagram)
        .expect("accepted");
    assert!(
        net.ep(s).poll_timeout().is_some_and(|t| t <= now),
        "due until visited"
    );
    while let Some(ev) = net.ep(s).poll_event() {
        let _ = ev;
    }
    assert!(
        net.ep(s).poll_transmit(now, &mut buf).is_none(),
        "the ACK waits"
    );
    let after = net.ep(s).poll_timeout().expect("deadline");
    let conn = net
        .ep(s)
        .connection(sh)
        .expect("server connection")
        .poll_timeout();
    assert_eq!(Some(after), conn);
    assert!(
        after > now && after < idle,
        "the ACK deadline: {:?}",
        after - now
    );
}
