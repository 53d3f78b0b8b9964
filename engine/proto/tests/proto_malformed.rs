//! Malformed, replayed and misaddressed datagrams: each is dropped and counted by cause, and the
//! connection carries on. Also: version mismatch and server-full refusals, and the handshake
//! flood (10^5 spoofed hellos leave no server state, no reply larger than its request).

mod proto_util;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proto_util::{addr, Impair, Net};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ricochet_proto::wire::{self, frame_type, ConnectionId, Frame, Packet, Writer, VERSION};
use ricochet_proto::{
    CloseReason, Config, ConnectionHandle, DropCause, Endpoint, EndpointConfig, Event, ListenConfig,
};

fn server(now: std::time::Instant, sc: ListenConfig) -> Endpoint {
    Endpoint::new(
        EndpointConfig::default().with(|c| {
            c.connection = Arc::new(Config::default());
            c.server = Some(sc);
        }),
        now,
        1,
    )
}

/// Connected client/server over a clean 5 ms path; the server echoes.
fn setup() -> (Net, usize, usize, ConnectionHandle) {
    let mut net = Net::new(
        Impair {
            delay: Duration::from_millis(5),
            ..Impair::default()
        },
        3,
    );
    let s = net.add(addr(1), server(net.now, ListenConfig::insecure()));
    let c = net.add(
        addr(2),
        Endpoint::new(EndpointConfig::default(), net.now, 2),
    );
    let now = net.now;
    let h = net.ep(c).connect(now, addr(1));
    let limit = net.now + Duration::from_millis(500);
    net.run_until(limit, &mut |_, _, _, _| {});
    assert_eq!(net.ep(s).connection_count(), 1);
    (net, s, c, h)
}

/// Send one message and check it comes back (the connection still works).
fn echo_works(net: &mut Net, s: usize, c: usize, h: ConnectionHandle, tag: &str) {
    let msg = Bytes::from(format!("still alive after {tag}"));
    net.ep(c).send(h, 0, msg.clone()).unwrap();
    let mut got = false;
    let limit = net.now + Duration::from_secs(2);
    net.run_until(limit, &mut |ep, net, hh, e| {
        if let Event::Message { channel, data } = e {
            if ep == s {
                net.ep(s).send(hh, channel, data).unwrap();
            } else if data == msg {
                got = true;
            }
        }
    });
    assert!(got, "echo failed after {tag}");
}

fn data_packet(cid: ConnectionId, pn: u64, frames: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 2048];
    let n = wire::encode_packet(
        &Packet::Data {
            dst_cid: cid,
            packet_number: pn,
            payload: frames,
        },
        &mut b,
    )
    .unwrap();
    b.truncate(n);
    b
}

/// Prefetch hints take any bytes: a datagram too short for a connection id, an id beyond the
/// slot table, a stale one; none panics, and the connection works after them.
#[test]
fn prefetch_hints_take_any_bytes() {
    use ricochet_proto::PrefetchStage::{Connection, Parts};
    let (mut net, s, c, h) = setup();
    let server_cid = net.ep(c).connection(h).unwrap().remote_cid();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut shapes: Vec<Vec<u8>> = (0..64)
        .map(|n| (0..n).map(|_| rng.random()).collect())
        .collect();
    // The live connection's id, the same slot under another id, and ids beyond the table.
    for idx in [
        server_cid.0,
        server_cid.0 ^ (1 << 40),
        1,
        0xffff_ffff,
        u64::MAX,
    ] {
        let mut d = vec![wire::PacketType::Data as u8; 32];
        d[wire::CID_OFFSET..wire::CID_OFFSET + 8].copy_from_slice(&idx.to_be_bytes());
        shapes.push(d);
    }
    for d in &shapes {
        for stage in [Connection, Parts] {
            net.ep(s).prefetch_for(d, stage);
            net.ep(c).prefetch_for(d, stage);
            net.ep(s).prefetch(stage);
            net.ep(c).prefetch(stage);
        }
    }
    assert_eq!(net.ep(s).connection_count(), 1);
    echo_works(&mut net, s, c, h, "prefetch hints");
}

#[test]
fn malformed_table_dropped_counted_connection_survives() {
    let (mut net, s, c, h) = setup();
    let server_cid = net.ep(c).connection(h).unwrap().remote_cid();
    let from = addr(2);
    // Capture a real datagram from the client for the replay / duplicate rows.
    net.ep(c)
        .send(h, 0, Bytes::from_static(b"capture me"))
        .unwrap();
    let now = net.now;
    let mut buf = vec![0u8; 2048];
    let t = net.ep(c).poll_transmit(now, &mut buf).unwrap();
    let captured = buf[..t.size].to_vec();
    assert_eq!(net.ep(s).handle_datagram(now, from, &captured), Ok(()));

    let mut frag_big = Vec::new();
    {
        let mut b = [0u8; 64];
        let mut w = Writer::new(&mut b);
        wire::encode_frame(
            &Frame::Fragment {
                channel: 0,
                message_id: 1,
                index: 5,
                count: 1_000_000_000,
                data: b"x",
            },
            &mut w,
        )
        .unwrap();
        let n = w.len();
        frag_big.extend_from_slice(&b[..n]);
    }
    let unknown_channel = {
        let mut b = [0u8; 64];
        let mut w = Writer::new(&mut b);
        wire::encode_frame(
            &Frame::Datagram {
                channel: 200,
                message_id: 0,
                data: b"x",
            },
            &mut w,
        )
        .unwrap();
        let n = w.len();
        b[..n].to_vec()
    };
    let pn = 1_000_000; // fresh packet number: only the content is wrong
    let rows: Vec<(&str, Vec<u8>, DropCause)> = vec![
        ("empty datagram", vec![], DropCause::Malformed),
        ("one byte", vec![0x10], DropCause::Malformed),
        (
            "truncated data header",
            data_packet(server_cid, pn, &[])[..12].to_vec(),
            DropCause::Malformed,
        ),
        (
            "unknown packet type",
            vec![0x7e, VERSION, 0, 0, 0, 0, 0, 0, 0, 0],
            DropCause::Malformed,
        ),
        (
            "wrong version",
            {
                let mut p = data_packet(server_cid, pn, &[frame_type::PING]);
                p[1] = 99;
                p
            },
            DropCause::VersionMismatch,
        ),
        (
            "bad length",
            data_packet(server_cid, pn, &[frame_type::DATAGRAM, 0, 0, 60, 1, 2, 3]),
            DropCause::Malformed,
        ),
        (
            "fragment index >= count",
            data_packet(server_cid, pn, &[frame_type::FRAGMENT, 0, 1, 4, 4, 1, 9]),
            DropCause::Malformed,
        ),
        (
            "fragment count zero",
            data_packet(server_cid, pn, &[frame_type::FRAGMENT, 0, 1, 0, 0, 1, 9]),
            DropCause::Malformed,
        ),
        (
            "absurd fragment count",
            data_packet(server_cid, pn, &frag_big),
            DropCause::ProtocolViolation,
        ),
        (
            "unknown frame type",
            data_packet(server_cid, pn, &[0x3f]),
            DropCause::Malformed,
        ),
        (
            "unknown channel",
            data_packet(server_cid, pn, &unknown_channel),
            DropCause::ProtocolViolation,
        ),
        (
            "ack of a packet never sent",
            data_packet(
                server_cid,
                pn,
                &[frame_type::ACK, 0x80, 0, 0x10, 0, 0, 0, 0, 0, 0],
            ),
            DropCause::ProtocolViolation,
        ),
        (
            "wrong connection id",
            data_packet(
                ConnectionId(server_cid.0 ^ 0xdead_0000_0000),
                pn,
                &[frame_type::PING],
            ),
            DropCause::UnknownConnection,
        ),
        (
            "unknown slot",
            data_packet(ConnectionId(0x1234_0000_0777), pn, &[frame_type::PING]),
            DropCause::UnknownConnection,
        ),
        ("replayed packet", captured.clone(), DropCause::Duplicate),
        ("duplicated packet", captured.clone(), DropCause::Duplicate),
        (
            "replay of packet number 0",
            data_packet(server_cid, 0, &[frame_type::PING]),
            DropCause::Duplicate,
        ),
        (
            "unpadded hello",
            {
                let mut b = vec![0u8; 64];
                wire::encode_packet(
                    &Packet::ServerAccept {
                        client_cid: ConnectionId(1),
                        server_cid: ConnectionId(2),
                    },
                    &mut b,
                )
                .unwrap();
                b[0] = 0x01;
                b
            },
            DropCause::Malformed,
        ),
        (
            "forged cookie",
            {
                let mut b = vec![0u8; 512];
                let n = wire::encode_packet(
                    &Packet::ClientCookieEcho {
                        client_cid: ConnectionId(9),
                        nonce: 1,
                        timestamp: 0,
                        cookie: [7; 16],
                        token: None,
                    },
                    &mut b,
                )
                .unwrap();
                b.truncate(n);
                b
            },
            DropCause::BadCookie,
        ),
        (
            "server packet sent to a server",
            {
                let mut b = vec![0u8; 64];
                let n = wire::encode_packet(
                    &Packet::ServerAccept {
                        client_cid: server_cid,
                        server_cid: ConnectionId(5),
                    },
                    &mut b,
                )
                .unwrap();
                b.truncate(n);
                b
            },
            DropCause::UnexpectedHandshake,
        ),
        (
            // Connections accept FEC from their peer whatever their own policy; a truncated
            // parity body is malformed.
            "truncated fec parity body",
            {
                let mut b = vec![0u8; 64];
                let n = wire::encode_packet(
                    &Packet::FecParity {
                        dst_cid: server_cid,
                        number: 0,
                        body: &[1, 2, 3],
                    },
                    &mut b,
                )
                .unwrap();
                b.truncate(n);
                b
            },
            DropCause::Malformed,
        ),
        (
            // Found by the `connection` fuzz target: `pn + 1` overflowed while recording it.
            "packet number u64::MAX",
            data_packet(server_cid, u64::MAX, &[0x01]),
            DropCause::ProtocolViolation,
        ),
    ];
    for (name, bytes, cause) in rows {
        let before = net.ep(s).stats().drops.get(cause);
        let now = net.now;
        let r = net.ep(s).handle_datagram(now, from, &bytes);
        assert_eq!(r, Err(cause), "row {name:?}");
        assert_eq!(
            net.ep(s).stats().drops.get(cause),
            before + 1,
            "row {name:?} not counted"
        );
        echo_works(&mut net, s, c, h, name);
    }
    assert_eq!(net.ep(s).connection_count(), 1);
}

#[test]
fn version_mismatch_and_server_full_are_refused_with_reason() {
    let mut net = Net::new(
        Impair {
            delay: Duration::from_millis(5),
            ..Impair::default()
        },
        4,
    );
    let s = net.add(
        addr(1),
        server(
            net.now,
            ListenConfig::insecure().with(|c| c.max_sessions = 1),
        ),
    );
    let c1 = net.add(
        addr(2),
        Endpoint::new(EndpointConfig::default(), net.now, 5),
    );
    let c2 = net.add(
        addr(3),
        Endpoint::new(EndpointConfig::default(), net.now, 6),
    );
    let now = net.now;
    net.ep(c1).connect(now, addr(1));
    let limit = net.now + Duration::from_millis(500);
    net.run_until(limit, &mut |_, _, _, _| {});
    let now = net.now;
    let h2 = net.ep(c2).connect(now, addr(1));
    let mut closed = None;
    let limit = net.now + Duration::from_secs(1);
    net.run_until(limit, &mut |ep, _, h, e| {
        if ep == c2 && h == h2 {
            if let Event::Closed {
                reason, by_peer, ..
            } = e
            {
                closed = Some((reason, by_peer));
            }
        }
    });
    assert_eq!(closed, Some((CloseReason::ServerFull, true)));
    assert_eq!(net.ep(s).connection_count(), 1);

    // A hello from another version gets a refusal naming the reason, no larger than the hello.
    let mut hello = vec![0u8; 512];
    let n = wire::encode_packet(
        &Packet::ClientHello {
            client_cid: ConnectionId(77),
            nonce: 1,
            token: None,
        },
        &mut hello,
    )
    .unwrap();
    hello.truncate(n);
    hello[1] = VERSION + 1;
    let now = net.now;
    assert_eq!(
        net.ep(s).handle_datagram(now, addr(9), &hello),
        Err(DropCause::VersionMismatch)
    );
    let mut buf = vec![0u8; 2048];
    let t = net.ep(s).poll_transmit(now, &mut buf).unwrap();
    assert!(t.size <= hello.len());
    assert_eq!(
        wire::decode_packet(&buf[..t.size]),
        Ok(Packet::Refuse {
            client_cid: ConnectionId(77),
            reason: CloseReason::VersionMismatch,
            message: &[],
            tag: None,
        })
    );
}

#[test]
fn idle_timeout_closes_both_sides_when_peer_vanishes() {
    let (mut net, s, c, _h) = setup();
    // Cut the path: everything is lost from now on.
    net.imp.loss = 1.0;
    let mut reasons = Vec::new();
    let limit = net.now + Duration::from_secs(15);
    net.run_until(limit, &mut |ep, _, _, e| {
        if let Event::Closed { reason, .. } = e {
            reasons.push((ep, reason));
        }
    });
    assert!(
        reasons.contains(&(s, CloseReason::IdleTimeout)),
        "{reasons:?}"
    );
    assert!(
        reasons.contains(&(c, CloseReason::IdleTimeout)),
        "{reasons:?}"
    );
}

#[test]
fn keepalive_keeps_an_idle_connection_open() {
    let (mut net, s, c, h) = setup();
    let mut closed = false;
    let limit = net.now + Duration::from_secs(30);
    net.run_until(limit, &mut |_, _, _, e| {
        closed |= matches!(e, Event::Closed { .. })
    });
    assert!(!closed);
    echo_works(&mut net, s, c, h, "30 s idle");
}

#[test]
fn handshake_flood_leaves_no_state_and_never_amplifies() {
    let start = std::time::Instant::now();
    let mut ep = server(start, ListenConfig::insecure());
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    let mut buf = vec![0u8; 2048];
    let mut hello = vec![0u8; 2048];
    let mut replies = 0u64;
    for i in 0..100_000u64 {
        let now = start + Duration::from_micros(i * 10);
        let from = SocketAddr::from((rng.random::<[u8; 4]>(), rng.random::<u16>()));
        // Mix valid hellos, cookie echoes with forged cookies, and junk.
        let n = match i % 3 {
            0 => wire::encode_packet(
                &Packet::ClientHello {
                    client_cid: ConnectionId(rng.random()),
                    nonce: rng.random(),
                    token: None,
                },
                &mut hello,
            )
            .unwrap(),
            1 => wire::encode_packet(
                &Packet::ClientCookieEcho {
                    client_cid: ConnectionId(rng.random()),
                    nonce: rng.random(),
                    timestamp: i / 100,
                    cookie: rng.random(),
                    token: None,
                },
                &mut hello,
            )
            .unwrap(),
            _ => {
                rng.fill(&mut hello[..300]);
                hello[0] = 0x01;
                300
            }
        };
        let _ = ep.handle_datagram(now, from, &hello[..n]);
        while let Some(t) = ep.poll_transmit(now, &mut buf) {
            replies += 1;
            assert!(t.size <= n, "reply of {} B to a {n} B request", t.size);
            assert_eq!(t.destination, from);
        }
    }
    assert_eq!(ep.connection_count(), 0);
    assert_eq!(ep.stats().accepted, 0);
    assert_eq!(ep.pending_stateless(), 0);
    assert!(replies > 30_000, "valid hellos are answered: {replies}");
    assert!(ep.stats().drops.get(DropCause::BadCookie) > 30_000);
}
