//! Retransmission timeouts in a row are persistent congestion, whatever the RTT said before.
//!
//! A loss-tolerant connection keeps its window through an RTO while its RTT shows no queueing
//! (a lost probe under random loss is not congestion). But when the timer expires again and
//! again, the peer is not answering at all: an overloaded server whose socket overflows, or a
//! path that went dark. Each RTO declares the whole flight lost and queues it again; with the
//! window kept, every expiry resends a full window, and a thousand clients doing so bury the
//! server they are waiting for (seen in `bench game` at 1,000 players on a loaded host: clients
//! with 7 RTOs, a 38 KB window and 11 retransmissions of each input). The second RTO in a row,
//! or any RTO before the first RTT sample (nothing says the loss is random), collapses the
//! window to its minimum.

mod proto_util;

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proto_util::{addr, Net};
use ricochet_proto::{Config, Event};

const TICK: Duration = Duration::from_micros(16_667);

/// A client sends a 32-byte reliable input every tick; after `warmup` its datagrams are all
/// lost for 4 s. Returns the client's stats at the end of the blackout, the bytes it sent
/// during it, and the number of inputs the server received once it is over (out of `sent`).
fn blackout(cfg: Config, warmup: Duration) -> (ricochet_proto::ConnectionStats, u64, u64, u64) {
    let cfg = Arc::new(cfg);
    let min_window = cfg.min_window_packets * cfg.max_datagram_size;
    let mut net = Net::delayed(Duration::from_millis(1), 3);
    let (s, c) = net.add_pair(cfg);
    let now = net.now;
    let h = net.ep(c).connect(now, addr(1));
    let received = Rc::new(Cell::new(0u64));
    let r = received.clone();
    let mut on_event = move |ep: usize, _: &mut Net, _, e: Event| {
        if ep == s && matches!(e, Event::Message { .. }) {
            r.set(r.get() + 1);
        }
    };
    let connected = net.now + Duration::from_millis(200);
    net.run_until(connected, &mut on_event);
    let dark = Rc::new(Cell::new(false));
    let d = dark.clone();
    let client = addr(2);
    net.drop_if = Some(Box::new(move |from, _, _| from == client && d.get()));
    let mut sent = 0u64;
    let mut send_for =
        |net: &mut Net, span: Duration, on_event: &mut dyn FnMut(_, &mut Net, _, Event)| {
            let end = net.now + span;
            while net.now < end {
                net.ep(c)
                    .send(h, 0, Bytes::from(vec![0x11; 32]))
                    .expect("input queued");
                sent += 1;
                let until = net.now + TICK;
                net.run_until(until, on_event);
            }
        };
    send_for(&mut net, warmup, &mut on_event);
    dark.set(true);
    let bytes_before = net.ep(c).connection(h).expect("client").stats().bytes_sent;
    send_for(&mut net, Duration::from_secs(4), &mut on_event);
    let st = net.ep(c).connection(h).expect("client").stats();
    let dark_bytes = st.bytes_sent - bytes_before;
    dark.set(false);
    let end = net.now + Duration::from_secs(6);
    while net.now < end && received.get() < sent {
        let until = net.now + TICK;
        net.run_until(until, &mut on_event);
    }
    assert!(
        st.rto_count >= 2,
        "the blackout caused {} RTOs",
        st.rto_count
    );
    assert_eq!(
        st.cwnd, min_window,
        "after {} RTOs in a row the window is {} (minimum {min_window})",
        st.rto_count, st.cwnd
    );
    (st, dark_bytes, sent, received.get())
}

#[test]
fn repeated_timeouts_collapse_a_loss_tolerant_window() {
    // With RTT samples (a steady 2 ms path: no queueing) and without any.
    for warmup in [Duration::from_secs(1), Duration::ZERO] {
        let (st, dark_bytes, sent, received) = blackout(Config::game(), warmup);
        assert_eq!(received, sent, "every input arrives once the path is back");
        // 240 inputs of 32 bytes were queued in the dark; a window kept at its initial 38 KB
        // resends them all on every expiry.
        assert!(
            dark_bytes < 40_000,
            "warm-up {warmup:?}: {dark_bytes} bytes sent into 4 s of silence ({} RTOs)",
            st.rto_count
        );
    }
}

/// A path whose round trip is 2.5 s from the start (a server so overloaded that it answers
/// seconds late), far above the initial 50 ms estimate and the game profile's 2 s RTO ceiling,
/// with 60 Hz snapshots down (so the client's ACK-only packets, which give no RTT sample, are
/// most of what the server acknowledges last): every data packet is declared lost long before
/// its ACK comes back. That ACK must still settle the packet's fragments and teach the RTT
/// estimate; were lost packets forgotten after two (underestimated) loss delays, fragments
/// would only be settled by the rare ACK of a packet still in flight, and once the send window
/// (128 fragments) is full no new input leaves.
#[test]
fn acks_slower_than_every_timeout_still_settle_and_teach_the_rtt() {
    let cfg = Arc::new(Config::game());
    let mut net = Net::delayed(Duration::from_millis(1), 5);
    let (s, c) = net.add_pair(cfg);
    let now = net.now;
    let h = net.ep(c).connect(now, addr(1));
    let received = Rc::new(Cell::new(0u64));
    let server_handle = Rc::new(Cell::new(None));
    let (r, sh) = (received.clone(), server_handle.clone());
    let mut on_event = move |ep: usize, _: &mut Net, h2, e: Event| match e {
        Event::Connected if ep == s => sh.set(Some(h2)),
        Event::Message { channel: 0, .. } if ep == s => r.set(r.get() + 1),
        _ => {}
    };
    let connected = net.now + Duration::from_millis(200);
    net.run_until(connected, &mut on_event);
    let sh = server_handle.get().expect("connected");
    net.imp.delay = Duration::from_millis(1_250);
    let mut sent = 0u64;
    let inputs_end = net.now + Duration::from_secs(4);
    let end = inputs_end + Duration::from_secs(30);
    while net.now < end && (net.now < inputs_end || received.get() < sent) {
        let _ = net.ep(s).send(sh, 3, Bytes::from(vec![0x33; 200]));
        if net.now < inputs_end {
            net.ep(c)
                .send(h, 0, Bytes::from(vec![0x22; 32]))
                .expect("input queued");
            sent += 1;
        }
        let until = net.now + TICK;
        net.run_until(until, &mut on_event);
    }
    let st = net.ep(c).connection(h).expect("client").stats();
    assert_eq!(
        received.get(),
        sent,
        "{} of {sent} inputs delivered over a 2.5 s round trip; client: {} RTT samples, srtt \
         {:?}, {} RTOs, {} unacked fragments",
        received.get(),
        st.rtt.samples,
        st.srtt,
        st.rto_count,
        net.ep(c).connection(h).expect("client").unacked_segments()
    );
}
