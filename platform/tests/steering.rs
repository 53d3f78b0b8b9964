//! Reuseport steering: datagrams go to the socket their payload names, or by source port.
#![cfg(target_os = "linux")]

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use ricochet_platform::{bind, steer_reuseport, BoundSocket, SocketConfig, SteerRule};

/// Two `SO_REUSEPORT` sockets on one loopback port, in join order.
fn group(addr: &str) -> Vec<BoundSocket> {
    let mut cfg = SocketConfig::new(addr.parse().unwrap());
    cfg.reuse_port = true;
    let first = bind(&cfg).unwrap();
    cfg.addr = first.local_addr();
    let second = bind(&cfg).unwrap();
    vec![first, second]
}

/// Which socket of `group` received `payload`, sent from `from`.
fn lands_on(group: &[BoundSocket], from: &UdpSocket, to: SocketAddr, payload: &[u8]) -> usize {
    from.send_to(payload, to).unwrap();
    let sockets: Vec<UdpSocket> = group
        .iter()
        .map(|s| s.socket().try_clone().unwrap().into())
        .collect();
    for _ in 0..20 {
        for (i, s) in sockets.iter().enumerate() {
            s.set_nonblocking(true).unwrap();
            let mut buf = [0u8; 64];
            if let Ok(n) = s.recv(&mut buf) {
                assert_eq!(
                    &buf[..n],
                    payload,
                    "a datagram other than the one just sent"
                );
                return i;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{payload:?} arrived on neither socket");
}

fn check(addr: &str, client: &str) {
    let g = group(addr);
    let to = g[0].local_addr();
    let rule = SteerRule {
        kind_offset: 0,
        kinds: 0x10..=0x21,
        flag_offset: 1,
        flag_mask: 0x01,
        flag_value: 0x01,
        index_offset: 2,
    };
    steer_reuseport(&g[0], 2, &[rule]).unwrap();
    let from = UdpSocket::bind(client).unwrap();
    // Every datagram comes from one source port: without the program the kernel's hash (or the
    // source-port fallback) puts them all on one socket.
    for round in 0..3 {
        assert_eq!(lands_on(&g, &from, to, &[0x10, 1, 0, round]), 0);
        assert_eq!(lands_on(&g, &from, to, &[0x10, 1, 1, round]), 1);
        assert_eq!(lands_on(&g, &from, to, &[0x21, 0x81, 0, round]), 0);
        assert_eq!(lands_on(&g, &from, to, &[0x20, 0x03, 1, round]), 1);
    }
    // No rule matches: flag clear, kind outside the range, index beyond the group, too short.
    // These go by source port.
    let port = from.local_addr().unwrap().port() as usize % 2;
    for p in [
        &[0x10, 0, 1 - port as u8][..],
        &[0x05, 1, 1 - port as u8],
        &[0x10, 1, 7],
        &[0x10, 1],
    ] {
        assert_eq!(lands_on(&g, &from, to, p), port, "{p:?}");
    }
}

#[test]
fn payload_names_the_socket_ipv4() {
    check("127.0.0.1:0", "127.0.0.1:0");
}

#[test]
fn payload_names_the_socket_ipv6() {
    if UdpSocket::bind("[::1]:0").is_err() {
        eprintln!("no IPv6 loopback: skipped");
        return;
    }
    check("[::1]:0", "[::1]:0");
}

#[test]
fn too_many_rules_is_a_clear_error() {
    let g = group("127.0.0.1:0");
    let rule = SteerRule {
        kind_offset: 0,
        kinds: 0..=255,
        flag_offset: 0,
        flag_mask: 0,
        flag_value: 0,
        index_offset: 0,
    };
    let err = steer_reuseport(&g[0], 2, &vec![rule; 17]).unwrap_err();
    assert!(err.to_string().contains("at most 16"), "{err}");
}
