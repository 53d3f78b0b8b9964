//! Malformed FEC packets through the endpoint and connection: each is dropped and counted (by
//! the endpoint as `Malformed`, by kind in the connection's FEC stats), and the connection
//! carries on. Also: FEC on one side only, and parity actually rebuilding lost datagrams
//! between two endpoints.

mod proto_util;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proto_util::{addr, Impair, Net};
use ricochet_proto::fec::{FecPolicy, FecScheme};
use ricochet_proto::wire::{self, ConnectionId, Packet};
use ricochet_proto::{
    Config, ConnectionHandle, DropCause, Endpoint, EndpointConfig, Event, ListenConfig,
};

fn config(policy: FecPolicy) -> Arc<Config> {
    let mut c = Config::game();
    c.fec.policy = policy;
    // The malformed bodies below are block-code parity bodies (the sliding code's repair
    // bodies have their own table in tests/fec_sliding.rs).
    c.fec.scheme = FecScheme::Block;
    Arc::new(c)
}

/// Connected client/server over a 5 ms path with `imp` loss; the server echoes.
fn setup(
    client: FecPolicy,
    server: FecPolicy,
    imp: Impair,
) -> (Net, usize, usize, ConnectionHandle) {
    let mut net = Net::new(imp, 3);
    let s = net.add(
        addr(1),
        Endpoint::new(
            EndpointConfig::default().with(|c| {
                c.connection = config(server);
                c.server = Some(ListenConfig::insecure());
            }),
            net.now,
            1,
        ),
    );
    let c = net.add(
        addr(2),
        Endpoint::new(
            EndpointConfig::default().with(|c| c.connection = config(client)),
            net.now,
            2,
        ),
    );
    let now = net.now;
    let h = net.ep(c).connect(now, addr(1));
    let limit = net.now + Duration::from_millis(500);
    net.run_until(limit, &mut |_, _, _, _| {});
    assert_eq!(net.ep(s).connection_count(), 1);
    (net, s, c, h)
}

/// Echo `n` messages of `len` bytes; returns how many came back intact and in order.
fn echo(net: &mut Net, s: usize, c: usize, h: ConnectionHandle, n: u64, len: usize) -> u64 {
    let msg = |i: u64| {
        let mut v = vec![(i % 251) as u8; len];
        v[..8].copy_from_slice(&i.to_le_bytes());
        Bytes::from(v)
    };
    for i in 0..n {
        net.ep(c).send(h, 0, msg(i)).unwrap();
    }
    let mut next = 0;
    let limit = net.now + Duration::from_secs(10);
    net.run_until(limit, &mut |ep, net, hh, e| {
        if let Event::Message { channel, data } = e {
            if ep == s {
                net.ep(s).send(hh, channel, data).unwrap();
            } else {
                assert_eq!(data, msg(next), "echo {next} corrupted or out of order");
                next += 1;
            }
        }
    });
    next
}

fn fec_packet(parity: bool, cid: ConnectionId, body: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    let p = if parity {
        Packet::FecParity {
            dst_cid: cid,
            number: 0,
            body,
        }
    } else {
        Packet::FecData { dst_cid: cid, body }
    };
    let n = wire::encode_packet(&p, &mut b).unwrap();
    b.truncate(n);
    b
}

/// Parity body: first_seq, data, parity, index, codec, shard.
fn parity_body(first: u16, k: u8, m: u8, index: u8, codec: u8, shard_len: usize) -> Vec<u8> {
    let mut b = first.to_le_bytes().to_vec();
    b.extend_from_slice(&[k, m, index, codec]);
    b.resize(6 + shard_len, 0x5a);
    b
}

#[test]
fn malformed_fec_dropped_counted_connection_survives() {
    let fixed = FecPolicy::Fixed { parity: 1 };
    let (mut net, s, c, h) = setup(
        fixed,
        fixed,
        Impair {
            delay: Duration::from_millis(5),
            ..Impair::default()
        },
    );
    assert_eq!(echo(&mut net, s, c, h, 20, 300), 20);
    let server_cid = net.ep(c).connection(h).unwrap().remote_cid();
    let sh = ConnectionHandle(server_cid.0);
    // The next data-shard seq the server's receiver expects from the client.
    let next_seq = net
        .ep(c)
        .connection(h)
        .unwrap()
        .stats()
        .fec
        .sender
        .data_shards as u16;
    let ahead = next_seq.wrapping_add(100);

    // A data body too short for the FEC data header and the packet number after it is
    // refused by the packet layer (its clear header is incomplete): malformed, and the FEC
    // receiver never sees it.
    let now = net.now;
    let before = net
        .ep(s)
        .connection(sh)
        .unwrap()
        .stats()
        .fec
        .malformed
        .total();
    let truncated = fec_packet(false, server_cid, &[0x01]);
    assert_eq!(
        net.ep(s).handle_datagram(now, addr(2), &truncated),
        Err(DropCause::Malformed)
    );
    let after = net
        .ep(s)
        .connection(sh)
        .unwrap()
        .stats()
        .fec
        .malformed
        .total();
    assert_eq!(after, before, "never reached the FEC receiver");
    let mut expected_drops = 0;

    let cases: Vec<(&str, bool, Vec<u8>)> = vec![
        // FEC data header, then the wrapped packet number and frames.
        (
            "reserved bit",
            false,
            vec![0, 0, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3],
        ),
        ("huge data length", false, {
            let mut b = next_seq.wrapping_add(2).to_le_bytes().to_vec();
            b.push(0);
            b.resize(3 + 3000, 0);
            b
        }),
        (
            "parity index out of range",
            true,
            parity_body(ahead, 4, 2, 2, 0, 10),
        ),
        (
            "parity zero data shards",
            true,
            parity_body(ahead, 0, 2, 0, 0, 10),
        ),
        (
            "parity too many data shards",
            true,
            parity_body(ahead, 200, 2, 0, 0, 10),
        ),
        (
            "parity unknown codec",
            true,
            parity_body(ahead, 4, 2, 0, 9, 10),
        ),
        (
            "parity huge shard",
            true,
            parity_body(ahead, 4, 2, 0, 0, 3000),
        ),
        ("parity truncated", true, vec![1, 2, 3]),
        ("parity for an unknown group", true, {
            parity_body(next_seq.wrapping_add(30_000), 4, 2, 0, 0, 10)
        }),
    ];
    for (name, parity, body) in &cases {
        let d = fec_packet(*parity, server_cid, body);
        let before = net
            .ep(s)
            .connection(sh)
            .unwrap()
            .stats()
            .fec
            .malformed
            .total();
        let now = net.now;
        let r = net.ep(s).handle_datagram(now, addr(2), &d);
        assert_eq!(r, Err(DropCause::Malformed), "{name}");
        let after = net
            .ep(s)
            .connection(sh)
            .unwrap()
            .stats()
            .fec
            .malformed
            .total();
        assert_eq!(after, before + 1, "{name} not counted");
        expected_drops += 1;
    }
    // Inconsistent group sizes: a valid-looking parity shard, then one for the same group
    // claiming a different shape.
    let now = net.now;
    let good = fec_packet(true, server_cid, &parity_body(ahead, 4, 2, 0, 0, 10));
    assert_eq!(net.ep(s).handle_datagram(now, addr(2), &good), Ok(()));
    // A data shard claiming index 5 of that 4-shard group.
    let mut body = ahead.wrapping_add(5).to_le_bytes().to_vec();
    body.push(0x80 | 5);
    body.extend_from_slice(&[0; 8]);
    let d = fec_packet(false, server_cid, &body);
    assert_eq!(
        net.ep(s).handle_datagram(now, addr(2), &d),
        Err(DropCause::Malformed)
    );
    expected_drops += 1;
    let bad = fec_packet(true, server_cid, &parity_body(ahead, 5, 2, 1, 0, 10));
    assert_eq!(
        net.ep(s).handle_datagram(now, addr(2), &bad),
        Err(DropCause::Malformed)
    );
    expected_drops += 1;
    let stats = net.ep(s).connection(sh).unwrap().stats().fec;
    assert!(stats.malformed.inconsistent >= 1);
    assert!(
        stats.malformed.index_out_of_range >= 2,
        "{:?}",
        stats.malformed
    );
    assert!(stats.malformed.too_long >= 2);
    assert!(stats.malformed.bad_shape >= 2);
    assert!(stats.malformed.unknown_codec >= 1);
    assert!(stats.malformed.unknown_group >= 1);
    assert!(stats.malformed.truncated >= 1);
    assert!(stats.malformed.reserved_bits >= 1);
    assert_eq!(stats.malformed.total(), expected_drops);
    // Every FEC-level drop, and the one the packet layer refused.
    assert!(net.ep(s).stats().drops.get(DropCause::Malformed) > expected_drops);
    // The connection carries on.
    assert_eq!(echo(&mut net, s, c, h, 20, 300), 20);
}

#[test]
fn fec_sender_to_plain_receiver_and_back() {
    // Only the client protects; the server accepts FEC packets anyway and answers plainly.
    let (mut net, s, c, h) = setup(
        FecPolicy::Fixed { parity: 2 },
        FecPolicy::Off,
        Impair {
            delay: Duration::from_millis(5),
            ..Impair::default()
        },
    );
    assert_eq!(echo(&mut net, s, c, h, 50, 1024), 50);
    let cs = net.ep(c).connection(h).unwrap().stats();
    assert!(cs.fec.sender.data_shards > 0);
    assert!(cs.fec.parity_sent > 0);
    let sh = ConnectionHandle(net.ep(c).connection(h).unwrap().remote_cid().0);
    let ss = net.ep(s).connection(sh).unwrap().stats();
    assert_eq!(ss.fec.parity_sent, 0);
    assert!(ss.fec.receiver.data_delivered > 0);
    assert_eq!(ss.drops.get(DropCause::FecUnsupported), 0);
    // Datagrams stay within the UDP payload limit.
    assert!(net.max_datagram <= Config::default().max_datagram_size);
}

#[test]
fn parity_rebuilds_lost_datagrams_between_endpoints() {
    let fixed = FecPolicy::Fixed { parity: 2 };
    let (mut net, s, c, h) = setup(
        fixed,
        fixed,
        Impair {
            loss: 0.05,
            delay: Duration::from_millis(5),
            ..Impair::default()
        },
    );
    assert_eq!(echo(&mut net, s, c, h, 400, 1024), 400);
    let sh = ConnectionHandle(net.ep(c).connection(h).unwrap().remote_cid().0);
    let recovered = net.ep(c).connection(h).unwrap().stats().fec.data_recovered
        + net.ep(s).connection(sh).unwrap().stats().fec.data_recovered;
    assert!(recovered > 0, "no datagram rebuilt at 5% loss");
    for ep in [s, c] {
        let b = net.ep(ep).fec_budget();
        assert!(b.peak() > 0 && b.peak() <= b.limit());
    }
    assert!(net.max_datagram <= Config::default().max_datagram_size);
}
