//! Path MTU discovery (RFC 8899) over the simulated network: a path that drops every datagram
//! larger than its limit (as a link with the don't-fragment bit set does). A session settles
//! at the largest size the path carries, falls back when the path narrows mid-session (no
//! reliable message lost), and with discovery off never sends a datagram above the base.

mod proto_util;

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proto_util::{addr, Impair, Net};
use ricochet_proto::{Config, ConnectionHandle, Event, PathMtuConfig};

const ONE_WAY: Duration = Duration::from_millis(10);

/// A client and server 10 ms apart whose path carries datagrams up to `limit` bytes (changed
/// through the returned cell), connected; returns the net, the server's index and its handle
/// of the session, the client's index and handle, and the path's limit.
type Pair = (
    Net,
    (usize, ConnectionHandle),
    usize,
    ConnectionHandle,
    Rc<Cell<usize>>,
);

fn pair(cfg: Config, limit: usize) -> Pair {
    let mut net = Net::new(
        Impair {
            delay: ONE_WAY,
            ..Impair::default()
        },
        11,
    );
    let (s, c) = net.add_pair(Arc::new(cfg));
    let path = Rc::new(Cell::new(limit));
    let p = path.clone();
    net.drop_if = Some(Box::new(move |_, _, bytes| bytes.len() > p.get()));
    let now = net.now;
    let h = net.ep(c).connect(now, addr(1));
    let limit = net.now + Duration::from_millis(200);
    let mut sh = None;
    net.run_until(limit, &mut |ep, _, h, e| {
        if ep == s && matches!(e, Event::Connected) {
            sh = Some(h);
        }
    });
    let sh = sh.expect("the server accepted the session");
    (net, (s, sh), c, h, path)
}

fn pmtu_cfg() -> Config {
    Config::default().with(|c| c.path_mtu = PathMtuConfig::on())
}

#[test]
fn a_session_settles_at_the_largest_size_the_path_carries() {
    for (limit, want) in [
        (1500, 1452),
        (1452, 1452),
        (1280, 1280),
        (1252, 1252),
        (1201, 1201),
    ] {
        let (mut net, (s, sh), c, h, _) = pair(pmtu_cfg(), limit);
        let until = net.now + Duration::from_secs(2);
        net.run_until(until, &mut |_, _, _, _| {});
        let cs = net.ep(c).connection(h).unwrap().stats();
        let ss = net.ep(s).connection(sh).unwrap().stats();
        assert_eq!(cs.path_mtu, want, "client, path {limit}");
        assert_eq!(ss.path_mtu, want, "server, path {limit}");
        assert!(
            cs.path_mtu_probes <= 1 + 3 + 8 * 3,
            "{} probes",
            cs.path_mtu_probes
        );
        // Probes are no congestion: nothing counted lost.
        assert_eq!(cs.packets_lost, 0, "path {limit}");
        assert_eq!(ss.packets_lost, 0, "path {limit}");
    }
}

#[test]
fn discovery_off_sends_nothing_above_the_base() {
    let (mut net, _s, c, h, _) = pair(Config::default(), 1500);
    net.ep(c).send(h, 2, Bytes::from(vec![7u8; 5000])).unwrap();
    let until = net.now + Duration::from_secs(2);
    net.run_until(until, &mut |_, _, _, _| {});
    let cs = net.ep(c).connection(h).unwrap().stats();
    assert_eq!(cs.path_mtu, 1200);
    assert_eq!(cs.path_mtu_probes, 0);
    assert!(net.max_datagram <= 1200, "{}", net.max_datagram);
}

/// Unreliable messages are cut to the size found: a 2,400 B snapshot takes two datagrams at
/// 1,452 B where it took three at 1,200 B.
#[test]
fn unreliable_fragments_use_the_size_found() {
    for (cfg, want) in [(Config::default(), 3u64), (pmtu_cfg(), 2)] {
        let (mut net, _s, c, h, _) = pair(cfg, 1500);
        let until = net.now + Duration::from_secs(1);
        net.run_until(until, &mut |_, _, _, _| {});
        let before = net.ep(c).connection(h).unwrap().stats().packets_sent;
        net.ep(c).send(h, 2, Bytes::from(vec![7u8; 2400])).unwrap();
        net.flush();
        let after = net.ep(c).connection(h).unwrap().stats().packets_sent;
        assert_eq!(after - before, want);
    }
}

/// The server counts the reliable messages (checking their order) and echoes the snapshots,
/// so large packets go both ways.
fn on_message(
    s: usize,
    ep: usize,
    net: &mut Net,
    h: ConnectionHandle,
    e: Event,
    received: &Cell<u32>,
    in_order: &Cell<bool>,
) {
    let Event::Message { channel, data } = e else {
        return;
    };
    if ep != s {
        return;
    }
    if channel == 0 {
        let n = u32::from_le_bytes(data[..4].try_into().unwrap());
        in_order.set(in_order.get() && n == received.get());
        received.set(received.get() + 1);
    } else {
        net.ep(s).send(h, channel, data).unwrap();
    }
}

/// The path narrows from 1,500 to 1,280 bytes while the client streams reliable 3,000 B
/// messages and unreliable 2,400 B snapshots: the session falls back within 3 s (black-hole
/// detection), settles at 1,280 again, and every reliable message arrives, in order. The
/// server, which sends snapshots back, shrinks too.
#[test]
fn a_path_that_narrows_mid_session_shrinks_and_loses_no_reliable_message() {
    narrowing_path(pmtu_cfg());
}

/// The same in the game profile: FEC groups (sized to the path's ceiling), held
/// unreliable ACKs, redundant retransmissions.
#[test]
fn a_path_that_narrows_mid_session_shrinks_with_fec_on() {
    narrowing_path(Config::game().with(|c| c.path_mtu = PathMtuConfig::on()));
}

fn narrowing_path(cfg: Config) {
    let (mut net, (s, sh), c, h, path) = pair(cfg, 1500);
    let until = net.now + Duration::from_secs(1);
    net.run_until(until, &mut |_, _, _, _| {});
    assert_eq!(net.ep(c).connection(h).unwrap().stats().path_mtu, 1452);

    let received = Rc::new(Cell::new(0u32));
    let in_order = Rc::new(Cell::new(true));
    let mut sent = 0u32;
    let start = net.now;
    let narrow_at = start + Duration::from_secs(1);
    let mut shrunk_at = None;
    let mut t = start;
    let end = start + Duration::from_secs(5);
    while t < end {
        // A 60 Hz tick: one reliable message, one snapshot.
        let mut msg = vec![0u8; 3000];
        msg[..4].copy_from_slice(&sent.to_le_bytes());
        net.ep(c).send(h, 0, Bytes::from(msg)).unwrap();
        sent += 1;
        net.ep(c).send(h, 2, Bytes::from(vec![9u8; 2400])).unwrap();
        t += Duration::from_micros(16_667);
        if t >= narrow_at {
            path.set(1280);
        }
        let (r, o) = (received.clone(), in_order.clone());
        net.run_until(t, &mut |ep, net, h2, e| {
            on_message(s, ep, net, h2, e, &r, &o)
        });
        if shrunk_at.is_none() && net.ep(c).connection(h).unwrap().stats().path_mtu <= 1280 {
            shrunk_at = Some(net.now);
        }
    }
    let until = net.now + Duration::from_secs(2);
    let (r, o) = (received.clone(), in_order.clone());
    net.run_until(until, &mut |ep, net, h2, e| {
        on_message(s, ep, net, h2, e, &r, &o)
    });
    let shrunk_at = shrunk_at.expect("the client never shrank");
    assert!(
        shrunk_at - narrow_at <= Duration::from_secs(3),
        "shrank {:?} after the path narrowed",
        shrunk_at - narrow_at
    );
    let cs = net.ep(c).connection(h).unwrap().stats();
    assert_eq!(
        cs.path_mtu, 1280,
        "settles at what the narrower path carries"
    );
    assert!(cs.path_mtu_black_holes >= 1);
    assert_eq!(received.get(), sent, "reliable messages lost");
    assert!(in_order.get(), "reliable messages out of order");
    let ss = net.ep(s).connection(sh).unwrap().stats();
    assert!(ss.path_mtu <= 1280, "server at {}", ss.path_mtu);
}
