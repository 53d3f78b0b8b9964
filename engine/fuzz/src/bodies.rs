//! Bodies of the fuzz targets. Each must never panic on any input; the invariants they check
//! (memory under caps, no state from unproven peers) panic on violation so the fuzzer reports them.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::SeedableRng;
use ricochet_proto::wire::{self, Frame, Packet};
use ricochet_proto::{Config, ConnectionHandle, Endpoint, EndpointConfig, Event, ListenConfig};

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
    connected_with(base, cfg, None)
}

/// As [`connected`], the session protected with keys from `secret` when given.
fn connected_with(
    base: Instant,
    cfg: Arc<Config>,
    secret: Option<[u8; 32]>,
) -> (Endpoint, Endpoint, ConnectionHandle, Instant) {
    let mut server = Endpoint::new(
        EndpointConfig::default().with(|c| {
            c.connection = cfg.clone();
            c.server = Some(ListenConfig::insecure());
            c.reassembly_budget = 1 << 20;
            c.test_session_secret = secret;
        }),
        base,
        1,
    );
    let mut client = Endpoint::new(
        EndpointConfig::default().with(|c| {
            c.connection = cfg;
            c.test_session_secret = secret;
        }),
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
    let cfg = Arc::new(Config::default().with(|c| c.reassembly_limit = 256 << 10));
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
        EndpointConfig::default().with(|c| c.server = Some(ListenConfig::insecure())),
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

/// The token decoders on arbitrary bytes: a serialized connect token and a private part's
/// plaintext decode strictly (what decodes re-encodes to the same bytes), and whatever the
/// bytes, opening them as a sealed part with the wrong key fails cleanly.
pub fn token_decode(data: &[u8]) {
    use ricochet_proto::token::{
        ConnectToken, PrivateToken, SealedToken, TokenKey, CONNECT_TOKEN_LEN, NONCE_LEN,
        PRIVATE_LEN, SEALED_LEN,
    };
    // Arbitrary lengths, and the exact lengths (padded or cut) so the field checks are reached.
    let exact = |n: usize| {
        let mut v = data.to_vec();
        v.resize(n, 0);
        v
    };
    for bytes in [data.to_vec(), exact(CONNECT_TOKEN_LEN)] {
        if let Ok(t) = ConnectToken::from_bytes(&bytes) {
            assert_eq!(
                t.to_bytes(),
                bytes,
                "a decoded token re-encodes to its bytes"
            );
        }
    }
    let key = TokenKey::from_bytes([7; 32]);
    for plain in [data.to_vec(), exact(PRIVATE_LEN)] {
        if let Ok(p) = PrivateToken::decode(&plain) {
            assert!(p.user_data.len() <= ricochet_proto::token::MAX_USER_DATA);
            // Seal and open again: the same token comes back.
            let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(1);
            let sealed = p.seal(&key, 1, 2, &mut rng).expect("a decoded token seals");
            assert_eq!(PrivateToken::unseal(&key, 1, 2, &sealed), Ok(p));
        }
    }
    let raw = exact(NONCE_LEN + SEALED_LEN);
    let mut sealed = SealedToken {
        nonce: [0; NONCE_LEN],
        bytes: [0; SEALED_LEN],
    };
    sealed.nonce.copy_from_slice(&raw[..NONCE_LEN]);
    sealed.bytes.copy_from_slice(&raw[NONCE_LEN..]);
    assert!(PrivateToken::open(&key, 0, u64::MAX, &sealed, 0).is_err());
}

/// A token-admitting server fed a mix of real handshakes (four clients: two valid tokens, an
/// expired one and one for another server), mutated copies of them, and raw bytes, from a few
/// addresses, with time moving. It never replies with more bytes than a hello, never accepts a
/// token that is not valid, never accepts one twice, and never panics. Returns how many
/// sessions it accepted.
pub fn token_handshake(data: &[u8]) -> u64 {
    use ricochet_proto::token::{ConnectToken, TokenKey, TokenParams};
    use ricochet_proto::TokenAdmission;
    const UNIX: u64 = 1_900_000_000;
    let base = Instant::now();
    let key = TokenKey::from_bytes([5; 32]);
    let server_addr = addr(1, SERVER);
    let mut server = Endpoint::new(
        EndpointConfig::default().with(|c| {
            c.server = Some(ListenConfig::tokens(TokenAdmission::new(
                key.clone(),
                9,
                vec![server_addr],
            )))
        }),
        base,
        3,
    );
    server.set_unix_time(base, Duration::from_secs(UNIX));
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(4);
    let mut mint = |id: u64, to: SocketAddr, expires: u64| {
        let params = TokenParams {
            protocol_id: 9,
            client_id: id,
            server_addresses: &[to],
            expires_unix: expires,
            user_data: b"u",
        };
        ConnectToken::seal(&key, &params, &mut rng).expect("a token")
    };
    let tokens = [
        mint(1, server_addr, UNIX + 60),
        mint(2, server_addr, UNIX + 60),
        mint(3, server_addr, UNIX - 1),
        mint(4, addr(9, SERVER), UNIX + 60),
    ];
    let mut clients: Vec<Endpoint> = (0..4)
        .map(|i| Endpoint::new(EndpointConfig::default(), base, 10 + i))
        .collect();
    for (c, t) in clients.iter_mut().zip(&tokens) {
        c.connect_with_token(base, t);
    }
    let mut buf = vec![0u8; 2048];
    let mut now = base;
    let mut rest = data;
    while let Some((&op, tail)) = rest.split_first() {
        rest = tail;
        let arg = rest.first().copied().unwrap_or(0);
        rest = rest.get(1..).unwrap_or(&[]);
        let who = usize::from(op >> 2) & 3;
        let from = addr(2 + who as u8, 5000);
        match op & 3 {
            // Client `who` sends what it has (hello, echo); `arg` says whether and where to
            // corrupt it and whether to send it from another address.
            0 => {
                while let Some(t) = clients[who].poll_transmit(now, &mut buf) {
                    let mut d = buf[..t.size].to_vec();
                    if arg & 1 == 1 && !d.is_empty() {
                        let at = (usize::from(arg >> 1) * d.len() / 128).min(d.len() - 1);
                        d[at] ^= 1 << (arg & 7);
                    }
                    let src = if arg & 0x80 != 0 { addr(99, 7) } else { from };
                    let _ = server.handle_datagram(now, src, &d);
                }
            }
            // Raw bytes, `arg` × 4 long (so hello-sized inputs come up).
            1 => {
                let n = (usize::from(arg) * 4).min(rest.len());
                let _ = server.handle_datagram(now, from, &rest[..n]);
                rest = &rest[n..];
            }
            // The server's replies reach the clients.
            2 => {
                while let Some(t) = server.poll_transmit(now, &mut buf) {
                    for (i, c) in clients.iter_mut().enumerate() {
                        if t.destination == addr(2 + i as u8, 5000) {
                            let _ = c.handle_datagram(now, server_addr, &buf[..t.size]);
                        }
                    }
                }
            }
            // Time passes.
            _ => {
                now += Duration::from_millis(u64::from(arg) * 20);
                server.handle_timeout(now);
                for c in &mut clients {
                    c.handle_timeout(now);
                }
            }
        }
        while server.poll_event().is_some() {}
        for c in &mut clients {
            while c.poll_event().is_some() {}
        }
        let stats = server.stats();
        assert!(
            stats.max_stateless_reply < wire::MIN_CLIENT_HELLO_LEN,
            "amplification: a {} B stateless reply",
            stats.max_stateless_reply
        );
        assert!(
            stats.accepted <= 2,
            "only the two valid tokens admit, once each: {} accepted",
            stats.accepted
        );
    }
    server.stats().accepted
}

/// The sealed-packet decoder, alone and in a live protected session.
///
/// Alone: the clear header and the opening of arbitrary bytes under a fixed key never panic,
/// and nothing the input holds opens (a forgery would need the key).
///
/// Live: a protected session, and genuine packets from its client captured before delivery.
/// The input is a sequence of operations (a leading byte each): arbitrary bytes aimed at the
/// session (its connection id patched in, optionally a connection packet's type and version),
/// a genuine packet with one bit flipped, truncated or extended, a replay of a delivered
/// genuine packet, or the delivery of the next genuine one. Everything but a first genuine
/// delivery must be refused, counted, and change nothing: the server's connection accepts no
/// packet and delivers no message for it. Every genuine packet, delivered once in order of
/// the fuzzer's choosing, is accepted.
pub fn sealed_packet(data: &[u8]) {
    use ricochet_proto::{NumberSpace, PacketKey};

    let key = PacketKey::new(&[1; 32]);
    if let Ok(h) = wire::clear_header(data) {
        let space = NumberSpace::of(h.ty);
        let mut out = Vec::new();
        assert!(
            key.open_packet(space, h.number, data, h.len, &mut out)
                .is_err(),
            "arbitrary bytes opened"
        );
    }

    let base = Instant::now();
    let mut cfg = Config::default();
    if data.first().is_some_and(|b| b & 0x80 != 0) {
        // FecData and FecParity packets in the mix.
        cfg.fec.policy = ricochet_proto::fec::FecPolicy::Fixed { parity: 1 };
    }
    let secret = Some([9u8; 32]);
    let (mut server, mut client, h, mut now) = connected_with(base, Arc::new(cfg), secret);
    let Some(server_cid) = client.connection(h).map(|c| c.remote_cid()) else {
        return;
    };
    let sh = ConnectionHandle(server_cid.0);
    let mut buf = vec![0u8; 2048];
    // Genuine packets, captured and not yet delivered.
    for k in 0..6u8 {
        let _ = client.send(h, k % 2, Bytes::from(vec![k; 100 + 300 * usize::from(k)]));
    }
    now += Duration::from_millis(3);
    client.handle_timeout(now);
    let mut genuine = Vec::new();
    while let Some(t) = client.poll_transmit(now, &mut buf) {
        genuine.push(buf[..t.size].to_vec());
    }
    let mut delivered = 0usize;
    let received = |s: &Endpoint| s.connection(sh).map_or(0, |c| c.stats().packets_received);
    let mut rest = data;
    while rest.len() >= 3 && !genuine.is_empty() {
        let op = rest[0];
        let arg = usize::from(u16::from_be_bytes([rest[1], rest[2]]));
        rest = &rest[3..];
        let before = received(&server);
        let d: Vec<u8> = match op % 4 {
            0 => {
                let len = usize::from(op >> 2).min(rest.len());
                let mut d = rest[..len].to_vec();
                rest = &rest[len..];
                if d.len() >= 10 {
                    d[2..10].copy_from_slice(&server_cid.0.to_be_bytes());
                    if op & 0x40 != 0 {
                        d[0] = [0x10, 0x20, 0x21][arg % 3];
                        d[1] = wire::VERSION;
                    }
                }
                d
            }
            1 => {
                let g = &genuine[arg % genuine.len()];
                let mut d = g.clone();
                match op >> 6 {
                    0 | 1 => {
                        let bit = (arg >> 3) % (d.len() * 8);
                        d[bit / 8] ^= 1 << (bit % 8);
                    }
                    2 => d.truncate((arg >> 3) % d.len()),
                    _ => d.extend_from_slice(&rest[..rest.len().min(16)]),
                }
                d
            }
            2 => {
                if delivered == 0 {
                    continue;
                }
                genuine[arg % delivered].clone()
            }
            _ => {
                if delivered < genuine.len() {
                    let g = genuine[delivered].clone();
                    delivered += 1;
                    now += Duration::from_micros(100);
                    let r = server.handle_datagram(now, addr(2, 5000), &g);
                    assert_eq!(r, Ok(()), "a genuine packet was refused");
                    assert_eq!(received(&server), before + 1);
                    while server.poll_event().is_some() {}
                }
                continue;
            }
        };
        let fresh_copy = genuine[delivered..].contains(&d);
        if fresh_copy {
            // An unchanged copy of a genuine packet not yet delivered is that packet.
            continue;
        }
        now += Duration::from_micros(100);
        let r = server.handle_datagram(now, addr(2, 5000), &d);
        assert!(
            r.is_err(),
            "a forged, damaged or replayed packet was accepted"
        );
        assert_eq!(
            received(&server),
            before,
            "a refused packet changed the session"
        );
        while let Some((_, e)) = server.poll_event() {
            assert!(
                !matches!(e, Event::Message { .. }),
                "a refused packet delivered a message"
            );
        }
        // The server's answers (ACKs of genuine packets) keep flowing to the client.
        server.handle_timeout(now);
        while let Some(t) = server.poll_transmit(now, &mut buf) {
            let _ = client.handle_datagram(now, addr(1, SERVER), &buf[..t.size]);
        }
    }
}
