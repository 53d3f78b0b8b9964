//! Lanes and fresh data (issue 37/38), end to end between two endpoints on a simulated path:
//! a lane of a lower priority number goes first, lanes of one priority share bytes by weight,
//! a deadline drops a message unsent, a newest-only channel sends the newest snapshot, a lane's
//! cap drops its oldest unreliable messages, and each drop is counted by its cause; on a narrow
//! link a high-priority message leaves in its own datagram, paced on its own bytes.

mod proto_util;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proto_util::{addr, Net};
use ricochet_proto::{
    ChannelKind, Config, CongestionController, ConnectionHandle, Event, Lane, SendError,
    SendOptions, UnsentDrops,
};

const WAIT_MS: u64 = 45;
const ONE_WAY: Duration = Duration::from_millis(20);

/// A connected client and server (`cfg` on both) 20 ms apart, settled.
fn pair(cfg: Config) -> (Net, usize, usize, ConnectionHandle) {
    assert_eq!(cfg.validate(), Ok(()));
    let mut net = Net::delayed(ONE_WAY, 3);
    let (s, c) = net.add_pair(Arc::new(cfg));
    let now = net.now;
    let h = net.ep(c).connect(now, addr(1));
    let limit = net.now + Duration::from_millis(500);
    net.run_until(limit, &mut |_, _, _, _| {});
    (net, s, c, h)
}

/// Runs for `d`; the server's received messages in order, as (channel, first byte).
fn receive(net: &mut Net, s: usize, d: Duration) -> Vec<(u8, u8)> {
    let got = Rc::new(RefCell::new(Vec::new()));
    let g = got.clone();
    let limit = net.now + d;
    net.run_until(limit, &mut |ep, _, _, e| {
        if let Event::Message { channel, data } = e {
            if ep == s {
                g.borrow_mut().push((channel, data[0]));
            }
        }
    });
    let v = got.borrow().clone();
    v
}

fn channels() -> Vec<ChannelKind> {
    vec![
        ChannelKind::ReliableOrdered,
        ChannelKind::Unreliable,
        ChannelKind::ReliableOrdered,
    ]
}

fn msg(tag: u8, len: usize) -> Bytes {
    Bytes::from(vec![tag; len])
}

/// Queues 30 KiB on channel 2, then 30 KiB on channel 0; the order of delivery by channel.
fn bulk_on_two_channels(cfg: Config) -> Vec<u8> {
    let (mut net, s, c, h) = pair(cfg.with(|c| {
        c.channels = channels();
        c.initial_window_packets = 4;
    }));
    for i in 0..30 {
        net.ep(c).send(h, 2, msg(i, 1000)).unwrap();
    }
    for i in 0..30 {
        net.ep(c).send(h, 0, msg(i, 1000)).unwrap();
    }
    let got = receive(&mut net, s, Duration::from_secs(3));
    assert_eq!(got.len(), 60);
    got.iter().map(|g| g.0).collect()
}

#[test]
fn a_lower_priority_number_goes_first_even_queued_last() {
    let order = bulk_on_two_channels(
        Config::game().with(|c| c.lanes = vec![Lane::new([0]), Lane::new([1, 2]).priority(1)]),
    );
    // Channel 0's lane has priority: all of it arrives before any of channel 2.
    assert_eq!(&order[..30], &[0; 30], "{order:?}");
    // Without lanes the two channels take turns.
    let order = bulk_on_two_channels(Config::game());
    let first_half_on_2 = order[..30].iter().filter(|&&c| c == 2).count();
    assert!(first_half_on_2 >= 10, "{order:?}");
}

#[test]
fn lanes_of_one_priority_share_bytes_by_weight() {
    let cfg = Config::game().with(|c| {
        c.channels = channels();
        c.lanes = vec![Lane::new([0]).weight(3), Lane::new([2]), Lane::new([1])];
        c.initial_window_packets = 8;
        c.min_window_packets = 8;
    });
    let (mut net, s, c, h) = pair(cfg);
    for i in 0..200u32 {
        net.ep(c).send(h, 0, msg(i as u8, 1000)).unwrap();
        net.ep(c).send(h, 2, msg(i as u8, 1000)).unwrap();
    }
    // Stop while both lanes are still backlogged: the first 200 messages delivered.
    let got = receive(&mut net, s, Duration::from_millis(400));
    let first: Vec<u8> = got.iter().take(200).map(|&(ch, _)| ch).collect();
    assert_eq!(first.len(), 200, "only {} delivered", got.len());
    let on0 = first.iter().filter(|&&ch| ch == 0).count();
    // 3:1 is 150 of 200; a window's worth of slack.
    assert!((140..=160).contains(&on0), "channel 0 had {on0} of 200");
}

#[test]
fn a_deadline_drops_the_message_unsent_and_counts_it() {
    let cfg = Config::game().with(|c| {
        c.channels = channels();
        c.initial_window_packets = 4;
        c.min_window_packets = 4;
    });
    let (mut net, s, c, h) = pair(cfg);
    let now = net.now;
    for i in 0..20 {
        net.ep(c).send(h, 1, msg(i, 1000)).unwrap();
    }
    // Behind 20 KiB on its channel with a 4-packet window, 5 ms is not enough; 10 s is.
    let soon = SendOptions::deadline(now + Duration::from_millis(5));
    let later = SendOptions::deadline(now + Duration::from_secs(10));
    net.ep(c).send_with(h, 1, msg(101, 500), soon).unwrap();
    net.ep(c).send_with(h, 1, msg(102, 500), later).unwrap();
    assert_eq!(
        net.ep(c).send_with(h, 0, msg(103, 10), later),
        Err(SendError::DeadlineOnReliable(0))
    );
    let got = receive(&mut net, s, Duration::from_secs(2));
    assert!(!got.contains(&(1, 101)), "the expired message was sent");
    assert!(got.contains(&(1, 102)));
    assert_eq!(got.iter().filter(|&&(ch, _)| ch == 1).count(), 21);
    let st = net.ep(c).connection(h).unwrap().stats();
    assert_eq!(
        (st.unsent.deadline, st.unreliable_unsent),
        (1, 1),
        "{:?}",
        st.unsent
    );
}

#[test]
fn a_newest_only_channel_sends_the_newest_snapshot() {
    let cfg = Config::game().with(|c| {
        c.channels = channels();
        c.newest_only = vec![1];
    });
    let (mut net, s, c, h) = pair(cfg);
    // Ten snapshots of three fragments each before the connection can send: nine replaced.
    for i in 0..10 {
        net.ep(c).send(h, 1, msg(i, 2400)).unwrap();
    }
    assert_eq!(net.ep(c).connection(h).unwrap().queued_bytes(), 2400);
    let got = receive(&mut net, s, Duration::from_secs(1));
    assert_eq!(got, vec![(1, 9)]);
    let st = net.ep(c).connection(h).unwrap().stats();
    let none = UnsentDrops::default();
    assert_eq!(
        (st.unsent.replaced, st.unsent.deadline, st.unsent.lane_limit),
        (9, 0, 0)
    );
    assert_eq!(st.unsent.queue_limit, none.queue_limit);
    assert_eq!(st.unreliable_unsent, 9);
}

#[test]
fn a_lane_cap_drops_the_oldest_unreliable_and_refuses_reliable_past_it() {
    let cfg = Config::game().with(|c| {
        c.channels = channels();
        c.lanes = vec![Lane::new([0, 1]).queue_limit(5000), Lane::new([2])];
    });
    let (mut net, s, c, h) = pair(cfg);
    for i in 0..10 {
        net.ep(c).send(h, 1, msg(i, 1000)).unwrap();
    }
    let conn = net.ep(c).connection(h).unwrap();
    let lane = conn.lane_stats(0).unwrap();
    assert_eq!(lane.queued_bytes, 5000);
    assert!(lane.queue_time > Duration::ZERO && lane.queue_time < Duration::from_secs(1));
    assert_eq!(conn.lane_stats(1).unwrap().queued_bytes, 0);
    assert_eq!(conn.lane_stats(2), None);
    assert_eq!(conn.lane_count(), 2);
    // A reliable message makes room by dropping the oldest unreliable ones (5, 6, 7).
    net.ep(c).send(h, 0, msg(50, 2500)).unwrap();
    assert_eq!(
        net.ep(c)
            .connection(h)
            .unwrap()
            .lane_stats(0)
            .unwrap()
            .queued_bytes,
        4500
    );
    // One that would not fit even without them is refused, and drops nothing.
    assert_eq!(
        net.ep(c).send(h, 0, msg(51, 3000)),
        Err(SendError::QueueFull)
    );
    // The other lane has no cap.
    for i in 0..10 {
        net.ep(c).send(h, 2, msg(i, 1000)).unwrap();
    }
    let got = receive(&mut net, s, Duration::from_secs(2));
    let unreliable: Vec<u8> = got.iter().filter(|g| g.0 == 1).map(|g| g.1).collect();
    assert_eq!(unreliable, vec![8, 9]);
    assert_eq!(got.iter().filter(|g| g.0 == 0).count(), 1);
    assert_eq!(got.iter().filter(|g| g.0 == 2).count(), 10);
    let st = net.ep(c).connection(h).unwrap().stats();
    assert_eq!(st.unsent.lane_limit, 8, "{:?}", st.unsent);
    assert_eq!(st.unreliable_unsent, 8);
}

#[test]
fn retransmissions_keep_their_lane() {
    // Lane 1's reliable bulk loses packets; events sent on lane 0 while its repairs are
    // pending go first, as the window opens.
    let cfg = Config::game().with(|c| {
        c.channels = channels();
        c.lanes = vec![Lane::new([0]), Lane::new([1, 2]).priority(1)];
        c.redundant_retransmit = false;
    });
    let (mut net, s, c, h) = pair(cfg);
    let dropped = Rc::new(RefCell::new(0u32));
    let d = dropped.clone();
    let client = addr(2);
    net.drop_if = Some(Box::new(move |from, _, bytes| {
        // Every other large datagram of the client's first 40.
        if from != client || bytes.len() < 900 {
            return false;
        }
        *d.borrow_mut() += 1;
        let n = *d.borrow();
        n <= 100 && n % 3 != 0
    }));
    for i in 0..100 {
        net.ep(c).send(h, 2, msg(i, 1000)).unwrap();
    }
    // Losses detected (an RTT and a bit), repairs queued; then the events.
    let _ = receive(&mut net, s, Duration::from_millis(WAIT_MS));
    let lost = net.ep(c).connection(h).unwrap().stats().packets_lost;
    assert!(lost > 0, "no loss detected yet");
    for i in 0..3 {
        net.ep(c).send(h, 0, msg(200 + i, 64)).unwrap();
    }
    let sent_at = net.now;
    let got = Rc::new(RefCell::new(Vec::new()));
    let g = got.clone();
    let limit = net.now + Duration::from_secs(3);
    net.run_until(limit, &mut |ep, net, _, e| {
        if let Event::Message { channel, .. } = e {
            if ep == s {
                g.borrow_mut().push((channel, net.now - sent_at));
            }
        }
    });
    let got = got.borrow();
    let events: Vec<Duration> = got.iter().filter(|g| g.0 == 0).map(|g| g.1).collect();
    let bulk_done = got.iter().filter(|g| g.0 == 2).map(|g| g.1).max().unwrap();
    assert_eq!(events.len(), 3);
    let slowest = events.iter().max().copied().unwrap();
    // One way is 20 ms: the events go out with the first packet the window allows, ahead
    // of the repairs that were queued before them.
    assert!(
        slowest < Duration::from_millis(60) && slowest < bulk_done,
        "events took {events:?}, the bulk finished at {bulk_done:?}"
    );
}

/// Sends a 64 B event on channel 0 and a 3,000 B unreliable message on channel 1 at once; the
/// sizes of the client's next datagrams, and whether the event arrived.
fn event_beside_a_snapshot(cfg: Config) -> (Vec<usize>, bool) {
    let (mut net, s, c, h) = pair(cfg.with(|c| {
        c.channels = channels();
        c.congestion_controller = CongestionController::Delay;
        // 1 Mbit/s: a full datagram takes 9.6 ms to serialize.
        c.max_send_rate = Some(125_000);
    }));
    let client = net.eps[c].0;
    let sizes = Rc::new(RefCell::new(Vec::new()));
    let seen = sizes.clone();
    net.drop_if = Some(Box::new(move |from, _, bytes| {
        if from == client {
            seen.borrow_mut().push(bytes.len());
        }
        false
    }));
    net.ep(c).send(h, 1, msg(9, 3000)).unwrap();
    net.ep(c).send(h, 0, msg(7, 64)).unwrap();
    let got = receive(&mut net, s, Duration::from_millis(60));
    let v = sizes.borrow().clone();
    (v, got.contains(&(0, 7)))
}

#[test]
fn on_a_narrow_link_a_high_priority_message_leaves_in_its_own_datagram() {
    let two_levels = vec![Lane::new([0]), Lane::new([1, 2]).priority(1)];
    let (sizes, arrived) = event_beside_a_snapshot(Config::game().with(|c| c.lanes = two_levels));
    assert!(arrived);
    // The event's datagram is closed before the snapshot's fragments.
    assert!(sizes[0] < 200, "{sizes:?}");
    assert!(sizes[1] > 1000, "{sizes:?}");
    // Lanes of one priority share a packet: the event's datagram is topped up.
    let one_level = vec![Lane::new([0]), Lane::new([1, 2])];
    let (sizes, arrived) = event_beside_a_snapshot(Config::game().with(|c| c.lanes = one_level));
    assert!(arrived);
    assert!(sizes[0] > 1000, "{sizes:?}");
}

/// A client paced at 1 Mbit/s with snapshots backlogged on channel 1 sends a 64 B event on
/// channel 0 right after a full datagram left: how long the event took to arrive (the path
/// has no bottleneck, only the one-way delay).
fn event_after_a_full_datagram(lanes: Vec<Lane>) -> Duration {
    let (mut net, s, c, h) = pair(Config::game().with(|c| {
        c.channels = channels();
        c.lanes = lanes;
        c.congestion_controller = CongestionController::Delay;
        c.max_send_rate = Some(125_000);
    }));
    let client = net.eps[c].0;
    let full = Rc::new(RefCell::new(0u32));
    let seen = full.clone();
    net.drop_if = Some(Box::new(move |from, _, bytes| {
        if from == client && bytes.len() > 1000 {
            *seen.borrow_mut() += 1;
        }
        false
    }));
    for i in 0..8 {
        net.ep(c).send(h, 1, msg(i, 2400)).unwrap();
    }
    receive(&mut net, s, Duration::from_millis(60));
    // Stop right after a full datagram left: the pacer's tokens are spent.
    let limit = net.now + Duration::from_millis(100);
    loop {
        let before = *full.borrow();
        net.flush();
        if *full.borrow() > before || !net.step(limit, &mut |_, _, _, _| {}) {
            break;
        }
    }
    let sent = net.now;
    net.ep(c).send(h, 0, msg(7, 64)).unwrap();
    let arrived = Rc::new(RefCell::new(None));
    let a = arrived.clone();
    let limit = net.now + Duration::from_millis(100);
    net.run_until(limit, &mut |ep, net, _, e| {
        if let Event::Message { channel: 0, .. } = e {
            if ep == s && a.borrow().is_none() {
                *a.borrow_mut() = Some(net.now);
            }
        }
    });
    let at = arrived.borrow().expect("the event arrived");
    at - sent
}

#[test]
fn on_a_narrow_link_a_high_priority_message_is_paced_on_its_own_bytes() {
    // The event does not wait for a full datagram's tokens (9.6 ms at 1 Mbit/s).
    let two_levels = vec![Lane::new([0]), Lane::new([1, 2]).priority(1)];
    let took = event_after_a_full_datagram(two_levels);
    assert!(took < ONE_WAY + Duration::from_millis(2), "{took:?}");
    // Lanes of one priority share the packet, and the pacer's full datagram.
    let one_level = vec![Lane::new([0]), Lane::new([1, 2])];
    let took = event_after_a_full_datagram(one_level);
    assert!(took > ONE_WAY + Duration::from_millis(5), "{took:?}");
}
