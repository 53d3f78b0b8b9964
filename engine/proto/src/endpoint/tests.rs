//! Unit tests of the endpoint's slot table and connection ids.

use std::time::Instant;

use super::slots::ROUTER_BITS;
use super::*;

/// A router that leaves no random bit in its part of the ids (a runtime worker's router
/// writes only its index and tag flag there, as this one does).
#[derive(Debug)]
struct Fixed;
impl Router for Fixed {
    fn connection_id_bits(&mut self, _random: u32) -> u32 {
        0x0001_0100
    }
}

fn fixed_endpoint(seed: u64) -> Endpoint {
    let mut ep = Endpoint::new(EndpointConfig::default(), Instant::now(), seed);
    ep.set_router(Box::new(Fixed));
    ep
}

/// A slot reused again and again gives each of its connections a new id, so a handle of
/// an earlier one never names a later one, and a reset captured for an earlier one ends no
/// later one (before, the id of a slot came back after 4,096 reuses whenever its few random
/// bits did: once in 128 on a runtime worker).
#[test]
fn a_reused_slot_never_repeats_an_id() {
    let mut ep = fixed_endpoint(1);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..20_000 {
        let (idx, cid) = ep.alloc().expect("a slot");
        assert_eq!(idx, 0, "the one freed slot is reused");
        assert_eq!(ep.slot_of(cid.0), 0);
        assert_eq!(
            cid.0 >> 32 & u64::from(ROUTER_BITS),
            0x100,
            "the router's bits"
        );
        assert!(seen.insert(cid), "id {cid:?} repeated");
        ep.free.push_back(idx);
    }
}

/// A restarted server (another endpoint, seeded anew) issues none of the ids of its earlier
/// boots, whatever the router leaves random: the slot mask and the id key are drawn per
/// endpoint. Before, each (slot, reuse count) of a runtime worker had 128 possible ids, so a
/// restarted server soon gave its first sessions ids of earlier boots, and the resets an
/// attacker collected for those ended the new sessions.
#[test]
fn a_restarted_endpoint_repeats_no_id_of_an_earlier_boot() {
    let mut seen = std::collections::HashSet::new();
    for boot in 0..100u64 {
        let mut ep = fixed_endpoint(1000 + boot);
        for k in 0..200 {
            let (idx, cid) = ep.alloc().expect("a slot");
            assert_eq!(ep.slot_of(cid.0), idx as usize);
            assert!(
                seen.insert(cid),
                "boot {boot}, id {k}: {cid:?} was issued before"
            );
            if k % 2 == 0 {
                ep.free.push_back(idx);
            }
        }
    }
}

/// Freed slots are reused oldest first, spreading reuses over all of them.
#[test]
fn freed_slots_are_reused_oldest_first() {
    let mut ep = Endpoint::new(EndpointConfig::default(), Instant::now(), 1);
    let a = ep.alloc().expect("a slot").0;
    let b = ep.alloc().expect("a slot").0;
    ep.free.push_back(a);
    ep.free.push_back(b);
    assert_eq!(ep.alloc().map(|x| x.0), Some(a));
    ep.free.push_back(a);
    assert_eq!(ep.alloc().map(|x| x.0), Some(b));
}

/// A lone endpoint's router ([`NoRouting`]) enforces the per-address and total session limits:
/// with 2 per address and 3 in all, the third client from one address is refused with
/// `TooManyFromAddress`, a client from another address gets the last session, and the next is
/// refused with `ServerFull`.
#[test]
fn a_lone_endpoint_enforces_its_session_limits_through_its_router() {
    use std::net::SocketAddr;
    let now = Instant::now();
    let server_addr = SocketAddr::from(([10, 0, 0, 1], 1));
    let mut limits = ListenConfig::insecure();
    limits.max_sessions_per_address = 2;
    limits.max_sessions = 3;
    let mut server = Endpoint::new(EndpointConfig::server(limits), now, 7);
    let mut outcomes = Vec::new();
    for k in 0..5u16 {
        let ip = if k < 3 { [10, 0, 0, 2] } else { [10, 0, 0, 3] };
        let from = SocketAddr::from((ip, 1000 + k));
        let mut client = Endpoint::new(EndpointConfig::default(), now, 50 + u64::from(k));
        let _ = client.connect(now, server_addr);
        let mut buf = vec![0u8; 2048];
        // hello, challenge, echo, then the accept or refusal.
        for to_server in [true, false, true, false] {
            let (src, dst, at) = if to_server {
                (&mut client, &mut server, from)
            } else {
                (&mut server, &mut client, server_addr)
            };
            let t = src
                .poll_transmit(now, &mut buf)
                .expect("a handshake packet");
            let _ = dst.handle_datagram(now, at, &buf[..t.size]);
        }
        let mut outcome = None;
        while let Some((_, e)) = client.poll_event() {
            match e {
                Event::Connected => outcome = Some(Ok(())),
                Event::Closed { reason, .. } => outcome = Some(Err(reason)),
                _ => {}
            }
        }
        outcomes.push(outcome.expect("the handshake ended"));
    }
    assert_eq!(
        outcomes,
        [
            Ok(()),
            Ok(()),
            Err(CloseReason::TooManyFromAddress),
            Ok(()),
            Err(CloseReason::ServerFull),
        ]
    );
    assert_eq!(server.connection_count(), 3);
}

/// A server on a tick fills its send queue with every session and drains it every tick: the
/// queue keeps its capacity between ticks (before, each drain shrank it to nothing and the next
/// tick grew it again, allocating in every tick), and gives it back once the ticks stop.
#[test]
fn a_queue_filled_every_tick_is_kept_and_given_back_when_idle() {
    use std::net::SocketAddr;
    use std::time::Duration;
    let mut now = Instant::now();
    let server_addr = SocketAddr::from(([10, 0, 0, 1], 1));
    let mut server = Endpoint::new(EndpointConfig::server(ListenConfig::insecure()), now, 7);
    let mut handles = Vec::new();
    let mut buf = vec![0u8; 2048];
    for k in 0..100u16 {
        let from = SocketAddr::from(([10, 1, (k >> 8) as u8, k as u8], 1000));
        let mut client = Endpoint::new(EndpointConfig::default(), now, 50 + u64::from(k));
        let _ = client.connect(now, server_addr);
        // hello, challenge, echo, accept.
        for to_server in [true, false, true, false] {
            let (src, dst, at) = if to_server {
                (&mut client, &mut server, from)
            } else {
                (&mut server, &mut client, server_addr)
            };
            let t = src
                .poll_transmit(now, &mut buf)
                .expect("a handshake packet");
            let _ = dst.handle_datagram(now, at, &buf[..t.size]);
        }
        while let Some((h, e)) = server.poll_event() {
            if e == Event::Connected {
                handles.push(h);
            }
        }
    }
    assert_eq!(handles.len(), 100);
    let mut capacities = Vec::new();
    for _ in 0..120 {
        for &h in &handles {
            server
                .send(h, 3, bytes::Bytes::from_static(&[1; 40]))
                .unwrap();
        }
        assert_eq!(server.dirty.len(), 100);
        while server.poll_transmit(now, &mut buf).is_some() {}
        server.handle_timeout(now);
        capacities.push(server.dirty.capacity());
        now += Duration::from_micros(16_667);
    }
    assert!(capacities.iter().all(|&c| c >= 100 && c == capacities[0]));
    // The game ends: no session is left to fill the queue.
    for &h in &handles {
        server.close(now, h, CloseReason::Application);
    }
    for _ in 0..1000 {
        now += Duration::from_millis(10);
        server.handle_timeout(now);
        while server.poll_transmit(now, &mut buf).is_some() {}
    }
    assert_eq!(server.connection_count(), 0);
    assert!(server.dirty.capacity() < 64, "{}", server.dirty.capacity());
}
