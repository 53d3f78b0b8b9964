//! ACK frames stop reporting the gaps lost packets leave once the peer has acknowledged an
//! ACK frame that reported them (RFC 9000 §13.2.4). Without that, every gap stays in the
//! range list, and under steady loss each later datagram carries the wire's limit of
//! ranges ([`MAX_ACK_RANGES`]) for the rest of the connection.

mod proto_util;

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proto_util::{addr, Impair, Net};
use ricochet_proto::wire::{self, Frame, Packet, MAX_ACK_RANGES};
use ricochet_proto::{Config, Event};

/// The number of ranges of the ACK frame a plain data packet carries, if it carries one.
fn ack_ranges(datagram: &[u8]) -> Option<usize> {
    let Ok(Packet::Data { payload, .. }) = wire::decode_packet(datagram) else {
        return None;
    };
    wire::frames(payload).find_map(|f| match f {
        Ok(Frame::Ack(a)) => Some(a.range_count),
        _ => None,
    })
}

/// A server and a client (`Net::add_pair`, default config) 10 ms apart with 5 % loss each way
/// (seed `seed`), and the range count of every ACK frame sent from `counted`, in order.
fn lossy_pair(seed: u64, counted: SocketAddr) -> (Net, usize, usize, Rc<RefCell<Vec<usize>>>) {
    let mut net = Net::new(
        Impair {
            loss: 0.05,
            delay: Duration::from_millis(10),
            ..Impair::default()
        },
        seed,
    );
    let (s, c) = net.add_pair(Arc::new(Config::default()));
    let counts: Rc<RefCell<Vec<usize>>> = Rc::default();
    let seen = counts.clone();
    net.drop_if = Some(Box::new(move |from, _, bytes| {
        if from == counted {
            if let Some(n) = ack_ranges(bytes) {
                seen.borrow_mut().push(n);
            }
        }
        false
    }));
    (net, s, c, counts)
}

/// The mean of `counts` (NaN when empty, which fails every comparison).
fn mean(counts: &[usize]) -> f64 {
    counts.iter().sum::<usize>() as f64 / counts.len() as f64
}

#[test]
fn under_steady_loss_ack_frames_stay_a_few_ranges_long() {
    // The server's lost datagrams leave gaps in what the client has received, one every 20
    // packets or so; `counts` gets the client's ACK frames.
    let (mut net, s, c, counts) = lossy_pair(7, addr(2));
    let now = net.now;
    let ch = net.ep(c).connect(now, addr(1));
    // Echo on the reliable-ordered channel: the client keeps 16 messages of 1 KiB in flight.
    let message = Bytes::from(vec![7u8; 1024]);
    let mut echoed = 0u32;
    let m = message.clone();
    let mut on_event = |ep: usize, net: &mut Net, h, e: Event| match e {
        Event::Connected if ep == c => {
            for _ in 0..16 {
                net.ep(c).send(h, 0, m.clone()).expect("client send");
            }
        }
        Event::Message { channel, data } if ep == s => {
            net.ep(s).send(h, channel, data).expect("echo");
        }
        Event::Message { channel, .. } if ep == c => {
            echoed += 1;
            net.ep(c).send(h, channel, m.clone()).expect("client send");
        }
        _ => {}
    };
    let limit = net.now + Duration::from_secs(10);
    net.run_until(limit, &mut on_event);
    let stats = net.ep(c).connection(ch).expect("client").stats();
    let counts = counts.borrow();
    // The run lost enough packets to fill the range list many times over.
    assert!(echoed > 2_000, "{echoed} echoes");
    assert!(
        stats.packets_received > 4_000,
        "{} packets received",
        stats.packets_received
    );
    let later = &counts[counts.len() / 2..];
    let mean = mean(later);
    let most = later.iter().copied().max().unwrap_or(0);
    // About one loss per round trip's worth of packets: a frame reports the few gaps of
    // the last round trip, far from the limit that untrimmed gaps reach.
    assert!(
        mean < 4.0,
        "mean ranges per ACK frame {mean:.1} in the run's second half"
    );
    assert!(
        most < MAX_ACK_RANGES / 2,
        "an ACK frame of {most} ranges in the run's second half"
    );
}

/// A side that only receives (its ACK frames ride in ACK-only packets) trims them too. On the
/// code before the trim this run's frames carry 32 ranges.
#[test]
fn a_side_that_only_receives_trims_its_ack_frames_too() {
    let (mut net, s, c, counts) = lossy_pair(11, addr(1));
    let now = net.now;
    let ch = net.ep(c).connect(now, addr(1));
    // One way: the client streams 1 KiB messages, 16 queued at a time; the server sends
    // nothing but acknowledgements.
    let message = Bytes::from(vec![7u8; 1024]);
    let mut delivered = 0u32;
    let m = message.clone();
    let mut on_event = |ep: usize, net: &mut Net, h, e: Event| match e {
        Event::Connected if ep == c => {
            for _ in 0..16 {
                net.ep(c).send(h, 0, m.clone()).expect("client send");
            }
        }
        Event::Message { .. } if ep == s => {
            delivered += 1;
            net.ep(c).send(ch, 0, m.clone()).expect("client send");
        }
        _ => {}
    };
    let limit = net.now + Duration::from_secs(10);
    net.run_until(limit, &mut on_event);
    let counts = counts.borrow();
    assert!(delivered > 2_000, "{delivered} messages delivered");
    let later = &counts[counts.len() / 2..];
    let mean = mean(later);
    assert!(
        mean < 4.0,
        "mean ranges per ACK frame {mean:.1} in the run's second half"
    );
}

/// A datagram held back: its packet number and bytes.
type Held = (u64, Vec<u8>);

/// A packet that arrives after the floor passed it (reordered far, or rebuilt by FEC late)
/// is acknowledged all the same.
#[test]
fn a_packet_arriving_below_the_floor_is_still_acknowledged() {
    let mut net = Net::delayed(Duration::from_millis(10), 5);
    let (s, c) = net.add_pair(Arc::new(Config::default()));
    // The server's 300th data packet is held back (its number and bytes) and delivered
    // late; `listed` says whether a client ACK frame sent after that listed it.
    let held: Rc<RefCell<Option<Held>>> = Rc::default();
    let delivered = Rc::new(RefCell::new(false));
    let listed = Rc::new(RefCell::new(false));
    let (hold, late, seen) = (held.clone(), delivered.clone(), listed.clone());
    let (server, client) = (addr(1), addr(2));
    let mut data_packets = 0;
    net.drop_if = Some(Box::new(move |from, _, bytes| {
        let Ok(Packet::Data {
            packet_number,
            payload,
            ..
        }) = wire::decode_packet(bytes)
        else {
            return false;
        };
        if from == server {
            data_packets += 1;
            if data_packets == 300 {
                *hold.borrow_mut() = Some((packet_number, bytes.to_vec()));
                return true;
            }
        } else if from == client && *late.borrow() {
            let pn = hold.borrow().as_ref().map(|h| h.0);
            for f in wire::frames(payload) {
                if let (Ok(Frame::Ack(a)), Some(pn)) = (f, pn) {
                    if a.ranges().any(|(lo, hi)| lo <= pn && pn <= hi) {
                        *seen.borrow_mut() = true;
                    }
                }
            }
        }
        false
    }));
    let now = net.now;
    let h = net.ep(c).connect(now, addr(1));
    for _ in 0..16 {
        net.ep(c)
            .send(h, 0, Bytes::from(vec![1u8; 1000]))
            .expect("send");
    }
    let mut echo = |ep: usize, net: &mut Net, h2, e: Event| {
        if let Event::Message { channel, data } = e {
            let _ = net.ep(if ep == s { s } else { c }).send(h2, channel, data);
        }
    };
    let mut until = net.now;
    while held.borrow().is_none() {
        until += Duration::from_millis(10);
        assert!(
            until - net.base < Duration::from_secs(5),
            "300 data packets"
        );
        net.run_until(until, &mut echo);
    }
    // Five round trips later the floor is far above the held packet.
    let limit = net.now + Duration::from_millis(100);
    net.run_until(limit, &mut echo);
    let bytes = held.borrow().as_ref().map(|h| h.1.clone()).expect("held");
    *delivered.borrow_mut() = true;
    net.inject(server, c, bytes);
    let limit = net.now + Duration::from_millis(100);
    net.run_until(limit, &mut echo);
    assert!(
        *listed.borrow(),
        "no ACK frame listed the packet that came late"
    );
}
