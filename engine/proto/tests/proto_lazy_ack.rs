//! A game tick's traffic with the game profile: the server sends an unreliable snapshot every
//! tick, the client a reliable input every tick. The ACK of a snapshot waits for the client's
//! next input (`Config::unreliable_ack_delay`) instead of costing a datagram of its own, the
//! server neither probes for its snapshots nor lets the held ACK inflate its RTT, and the
//! inputs are still acknowledged at once.

mod proto_util;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proto_util::{addr, Net};
use ricochet_proto::{
    Config, ConnectionHandle, ConnectionStats, Endpoint, EndpointConfig, Event, ListenConfig,
};

const ONE_WAY: Duration = Duration::from_millis(10);
const TICK: Duration = Duration::from_micros(16_667);
const TICKS: u32 = 180;
const SNAPSHOT: u8 = 3; // unreliable-sequenced in the default channel list
const INPUT: u8 = 0; // reliable-ordered

struct Run {
    client: ConnectionStats,
    server: ConnectionStats,
    client_datagrams: u64,
    server_datagrams: u64,
    snapshots: u32,
    inputs: u32,
}

/// Three seconds of 60 Hz ticks 10 ms apart (one way): a 200-byte snapshot down at each tick,
/// a 32-byte input up 5 ms after it. Both sides with `cfg`.
fn game_ticks(cfg: Config) -> Run {
    game_ticks_with(cfg.clone(), cfg)
}

/// [`game_ticks`] with the server's sessions on `server` and the client on `client`.
fn game_ticks_with(server: Config, client: Config) -> Run {
    let mut net = Net::delayed(ONE_WAY, 3);
    let server = EndpointConfig::default().with(|c| {
        c.connection = Arc::new(server);
        c.server = Some(ListenConfig::insecure());
    });
    let client = EndpointConfig::default().with(|c| c.connection = Arc::new(client));
    let now = net.now;
    let s = net.add(addr(1), Endpoint::new(server, now, 1));
    let c = net.add(addr(2), Endpoint::new(client, now, 2));
    let now = net.now;
    let ch = net.ep(c).connect(now, addr(1));
    let server_handle: Rc<RefCell<Option<ConnectionHandle>>> = Rc::new(RefCell::new(None));
    let counts = Rc::new(RefCell::new((0u32, 0u32)));
    let (sh, n) = (server_handle.clone(), counts.clone());
    let mut on_event = move |ep: usize, _: &mut Net, h: ConnectionHandle, e: Event| match e {
        Event::Connected if ep == s => *sh.borrow_mut() = Some(h),
        Event::Message { channel, .. } if ep == c && channel == SNAPSHOT => n.borrow_mut().0 += 1,
        Event::Message { channel, .. } if ep == s && channel == INPUT => n.borrow_mut().1 += 1,
        _ => {}
    };
    let limit = net.now + Duration::from_secs(1);
    net.run_until(limit, &mut on_event);
    let sh = server_handle
        .borrow()
        .expect("the server saw the client connect");
    let start = net.now;
    let sent_before = net
        .ep(c)
        .connection(ch)
        .expect("client")
        .stats()
        .packets_sent;
    let server_before = net
        .ep(s)
        .connection(sh)
        .expect("server")
        .stats()
        .packets_sent;
    for k in 0..TICKS {
        let tick = start + TICK * k;
        net.run_until(tick, &mut on_event);
        net.ep(s)
            .send(sh, SNAPSHOT, Bytes::from(vec![0xab; 200]))
            .expect("snapshot queued");
        net.run_until(tick + Duration::from_millis(5), &mut on_event);
        net.ep(c)
            .send(ch, INPUT, Bytes::from(vec![0x11; 32]))
            .expect("input queued");
    }
    let limit = net.now + Duration::from_millis(500);
    net.run_until(limit, &mut on_event);
    let client = net.ep(c).connection(ch).expect("client").stats();
    let server = net.ep(s).connection(sh).expect("server").stats();
    let (snapshots, inputs) = *counts.borrow();
    Run {
        client_datagrams: client.packets_sent - sent_before,
        server_datagrams: server.packets_sent - server_before,
        client,
        server,
        snapshots,
        inputs,
    }
}

/// `side` sent about one datagram per tick with the ACK held (`held`) and two without
/// (`eager`: its message and a stand-alone ACK), give or take a few at the ends.
fn one_then_two_per_tick(side: &str, held: u64, eager: u64) {
    let ticks = u64::from(TICKS);
    assert!(
        held <= ticks + 5,
        "{side}: {held} datagrams for {ticks} ticks, held"
    );
    assert!(
        eager >= 2 * ticks - 5,
        "{side}: {eager} datagrams for {ticks} ticks, eager"
    );
}

#[test]
fn snapshot_acks_ride_the_next_input() {
    let lazy = game_ticks(Config::game());
    let eager = game_ticks(Config::game().with(|c| c.unreliable_ack_delay = None));
    for (name, r) in [("lazy", &lazy), ("eager", &eager)] {
        println!(
            "{name}: client sent {} datagrams for {TICKS} inputs; server srtt {:?}, probes {}, rtos {}; client srtt {:?}",
            r.client_datagrams, r.server.srtt, r.server.tail_loss_probes, r.server.rto_count, r.client.srtt
        );
        assert_eq!(r.snapshots, TICKS, "{name}: snapshots delivered");
        assert_eq!(r.inputs, TICKS, "{name}: inputs delivered");
    }
    // Eager: an ACK datagram per snapshot besides the input. Lazy: the input carries it (a
    // few stand-alone ACKs at the end, when no input follows).
    one_then_two_per_tick("client", lazy.client_datagrams, eager.client_datagrams);
    // The server does not probe for snapshots whose ACK is only held, and subtracts the
    // hold: its RTT stays the path's 20 ms rather than 20 ms plus up to a tick.
    assert_eq!(lazy.server.tail_loss_probes, 0, "server probes");
    assert_eq!(lazy.server.rto_count, 0, "server RTOs");
    let near = |d: Duration| d >= Duration::from_millis(19) && d <= Duration::from_millis(23);
    assert!(near(lazy.server.srtt), "server srtt {:?}", lazy.server.srtt);
    // Inputs are reliable: still acknowledged at once, so the client's RTT is the path's too.
    assert!(near(lazy.client.srtt), "client srtt {:?}", lazy.client.srtt);
    assert_eq!(lazy.client.tail_loss_probes, 0, "client probes");
}

/// A snapshot stream with no input to ride on: the ACK goes out alone once the delay has
/// passed, so the sender still learns the RTT and sees no probe.
#[test]
fn a_held_ack_goes_out_alone_after_the_delay() {
    let cfg = Arc::new(Config::game());
    let held = cfg
        .unreliable_ack_delay
        .expect("the game profile holds unreliable ACKs");
    let mut net = Net::delayed(ONE_WAY, 4);
    let (s, c) = net.add_pair(cfg);
    let now = net.now;
    let ch = net.ep(c).connect(now, addr(1));
    let server_handle: Rc<RefCell<Option<ConnectionHandle>>> = Rc::new(RefCell::new(None));
    let sh2 = server_handle.clone();
    let mut on_event = move |ep: usize, _: &mut Net, h: ConnectionHandle, e: Event| {
        if ep == s && matches!(e, Event::Connected) {
            *sh2.borrow_mut() = Some(h);
        }
    };
    // Connected well before the first keepalive (1 s) could be due.
    let limit = net.now + Duration::from_millis(200);
    net.run_until(limit, &mut on_event);
    let sh = server_handle.borrow().expect("connected");
    let before = net
        .ep(c)
        .connection(ch)
        .expect("client")
        .stats()
        .packets_sent;
    let sent_at = net.now;
    net.ep(s)
        .send(sh, SNAPSHOT, Bytes::from_static(b"snapshot"))
        .expect("queued");
    // Arrives after 10 ms; no ACK may leave before the hold has passed.
    net.run_until(
        sent_at + ONE_WAY + held - Duration::from_millis(1),
        &mut on_event,
    );
    let mid = net
        .ep(c)
        .connection(ch)
        .expect("client")
        .stats()
        .packets_sent;
    assert_eq!(mid, before, "the client acknowledged the snapshot at once");
    net.run_until(sent_at + ONE_WAY * 3 + held, &mut on_event);
    let after = net
        .ep(c)
        .connection(ch)
        .expect("client")
        .stats()
        .packets_sent;
    assert_eq!(after, before + 1, "one stand-alone ACK after the hold");
    let server = net.ep(s).connection(sh).expect("server").stats();
    assert_eq!(server.tail_loss_probes, 0, "the server probed");
    assert!(
        server.srtt < Duration::from_millis(23),
        "server srtt {:?}",
        server.srtt
    );
}

/// A tick-driven server whose sessions hold the ACK of an input until the next tick
/// (`max_ack_delay` a tick, `ack_frequency` above one tick's inputs): the ACK rides the
/// snapshot, one datagram each way per tick. The player's RTT estimate includes the hold (it
/// caps what it subtracts at its own ACK delay), so its probes soon wait for it, and every
/// input arrives.
#[test]
fn input_acks_can_ride_the_next_tick() {
    let held = Config::game().with(|c| {
        c.max_ack_delay = TICK + Duration::from_millis(1);
        c.ack_frequency = 8;
    });
    let r = game_ticks_with(held, Config::game());
    let eager = game_ticks(Config::game());
    println!(
        "held: server sent {} datagrams, client {}; client srtt {:?}, probes {}, rtos {}, retransmitted {}",
        r.server_datagrams,
        r.client_datagrams,
        r.client.srtt,
        r.client.tail_loss_probes,
        r.client.rto_count,
        r.client.segments_retransmitted
    );
    println!("eager: server sent {} datagrams", eager.server_datagrams);
    assert_eq!(r.snapshots, TICKS, "snapshots delivered");
    assert_eq!(r.inputs, TICKS, "inputs delivered");
    one_then_two_per_tick("server", r.server_datagrams, eager.server_datagrams);
    assert!(
        r.client_datagrams <= u64::from(TICKS) + 5,
        "client datagrams"
    );
    // Until its estimate includes the hold, one probe may fire (once here, of 180 inputs).
    assert!(r.client.tail_loss_probes <= 1, "client probes");
    assert!(
        r.client.segments_retransmitted <= 1,
        "client retransmissions"
    );
    assert_eq!(r.client.rto_count, 0, "client RTOs");
}
