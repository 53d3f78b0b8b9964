//! Bodies of the fuzz targets. Each must never panic on any input; the invariants they check
//! (memory under caps, no state from unproven peers) panic on violation so the fuzzer reports them.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ricochet_proto::wire::{self, Frame, Packet};
use ricochet_proto::{Config, ConnectionHandle, Endpoint, EndpointConfig, Event, ServerConfig};

/// Every decoder on arbitrary bytes: packet header, frames, ACK ranges; re-encode what decoded.
pub fn decode_packet(data: &[u8]) {
    let mut out = [0u8; 4096];
    if let Ok(p) = wire::decode_packet(data) {
        if let Packet::Data { payload, .. } = p {
            walk_frames(payload);
        } else if let Ok(n) = wire::encode_packet(&p, &mut out) {
            // Handshake / FEC packets re-encode to a decodable packet with the same fields.
            assert_eq!(wire::decode_packet(&out[..n]), Ok(p));
        }
    }
    walk_frames(data);
}

fn walk_frames(payload: &[u8]) {
    let mut out = [0u8; 4096];
    for f in wire::frames(payload) {
        let Ok(f) = f else { break };
        if let Frame::Ack(a) = f {
            let mut prev: Option<u64> = None;
            for (lo, hi) in a.ranges() {
                assert!(lo <= hi);
                if let Some(p) = prev {
                    assert!(hi + 2 <= p, "ranges must descend with a gap");
                }
                prev = Some(lo);
            }
        }
        let mut w = wire::Writer::new(&mut out);
        if wire::encode_frame(&f, &mut w).is_ok() {
            let n = w.len();
            let back = wire::frames(&out[..n]).next();
            assert_eq!(back, Some(Ok(f)));
        }
    }
}

const SERVER: u16 = 7000;

fn addr(last: u8, port: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, last], port))
}

/// Two endpoints connected over a perfect in-memory pipe, returned with the client's handle.
fn connected(base: Instant, cfg: Arc<Config>) -> (Endpoint, Endpoint, ConnectionHandle, Instant) {
    let mut server = Endpoint::new(
        EndpointConfig {
            connection: cfg.clone(),
            server: Some(ServerConfig::insecure()),
            reassembly_budget: 1 << 20,
            ..EndpointConfig::default()
        },
        base,
        1,
    );
    let mut client = Endpoint::new(
        EndpointConfig {
            connection: cfg,
            ..EndpointConfig::default()
        },
        base,
        2,
    );
    let mut now = base;
    let h = client.connect(now, addr(1, SERVER));
    let mut buf = vec![0u8; 2048];
    for _ in 0..8 {
        while let Some(t) = client.poll_transmit(now, &mut buf) {
            let _ = server.handle_datagram(now, addr(2, 5000), &buf[..t.size]);
        }
        while let Some(t) = server.poll_transmit(now, &mut buf) {
            let _ = client.handle_datagram(now, addr(1, SERVER), &buf[..t.size]);
        }
        now += Duration::from_millis(1);
    }
    (server, client, h, now)
}

/// An established connection fed an arbitrary datagram sequence. The input is split into
/// datagrams by a leading length byte; a byte of flags per datagram says whether to aim it at
/// the live connection (patch in its connection id), how far to advance time, and whether to
/// deliver the server's replies to the client.
pub fn connection(data: &[u8]) {
    let base = Instant::now();
    let cfg = Arc::new(Config {
        reassembly_limit: 256 << 10,
        ..Config::default()
    });
    let (mut server, mut client, h, mut now) = connected(base, cfg);
    let server_cid = client.connection(h).map(|c| c.remote_cid());
    let mut buf = vec![0u8; 2048];
    let mut rest = data;
    let mut sent = 0u64;
    while rest.len() >= 2 {
        let flags = rest[0];
        let len = usize::from(rest[1]).min(rest.len() - 2);
        let mut d = rest[2..2 + len].to_vec();
        rest = &rest[2 + len..];
        if flags & 1 != 0 && d.len() >= 10 {
            if let Some(cid) = server_cid {
                d[2..10].copy_from_slice(&cid.0.to_be_bytes());
            }
            if flags & 2 != 0 {
                d[0] = wire::PacketType::Data as u8;
                d[1] = wire::VERSION;
            }
        }
        now += Duration::from_millis(u64::from(flags >> 4));
        let _ = server.handle_datagram(now, addr(2, 5000), &d);
        server.handle_timeout(now);
        // Keep the client talking so ARQ state moves too.
        if flags & 4 != 0 {
            let _ = client.send(h, flags & 3, Bytes::from(d.clone()));
            sent += 1;
        }
        client.handle_timeout(now);
        while let Some(t) = client.poll_transmit(now, &mut buf) {
            let _ = server.handle_datagram(now, addr(2, 5000), &buf[..t.size]);
        }
        while let Some(t) = server.poll_transmit(now, &mut buf) {
            assert!(t.size <= 1200);
            if flags & 8 != 0 {
                let _ = client.handle_datagram(now, addr(1, SERVER), &buf[..t.size]);
            }
        }
        while server.poll_event().is_some() {}
        while let Some((_, e)) = client.poll_event() {
            if let Event::Message { .. } = e {}
        }
        assert!(server.reassembly_bytes() <= 1 << 20);
        assert!(server.connection_count() <= 1);
    }
    let _ = sent;
}

/// A listening endpoint fed arbitrary datagrams from a few source addresses: it never creates
/// a connection without a valid cookie, and never replies with more bytes than it received.
pub fn endpoint_handshake(data: &[u8]) {
    let base = Instant::now();
    let mut server = Endpoint::new(
        EndpointConfig {
            server: Some(ServerConfig::insecure()),
            ..EndpointConfig::default()
        },
        base,
        3,
    );
    let mut buf = vec![0u8; 2048];
    let mut rest = data;
    let mut now = base;
    while rest.len() >= 3 {
        let src = rest[0];
        let len = (usize::from(rest[1]) * 2).min(rest.len() - 2);
        let d = &rest[2..2 + len];
        rest = &rest[2 + len..];
        now += Duration::from_millis(u64::from(src & 0x0f));
        let _ = server.handle_datagram(now, addr(src, 4000), d);
        while let Some(t) = server.poll_transmit(now, &mut buf) {
            assert!(
                t.size <= d.len(),
                "amplification: {} B reply to {} B",
                t.size,
                d.len()
            );
        }
        server.handle_timeout(now);
        assert_eq!(
            server.connection_count(),
            0,
            "connection without a cookie round trip"
        );
    }
}
