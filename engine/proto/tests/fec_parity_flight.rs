//! FEC parity counts against the congestion window while it is in flight. Parity is never
//! acknowledged itself, so it must leave the flight once the fate of a packet sent after it is
//! known (acknowledged, ACK-only packets included, or declared lost), and a window that parity
//! alone fills must still run the probe timer: parity left in the flight for good fills the
//! window, and with no ARQ packet in flight no probe timer ran, so the reliable data waiting
//! behind it was stuck for good (seen in `bench game` at 1,000 players, where the server's sockets overflowed:
//! clients with `bytes_in_flight` equal to the window, all of it parity, and inputs queued).
//!
//! The scenario is a game session under the game profile (adaptive FEC): 60 Hz snapshots down
//! on an unreliable-sequenced channel, a 32-byte reliable input up every tick, and a stretch in
//! which most of the client's datagrams are lost (a server socket that overflows). Once the
//! loss stops, every input must reach the server within a few seconds.

mod proto_util;

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proto_util::{addr, Impair, Net};
use ricochet_proto::{Config, ConnectionHandle, Event};

const TICK: Duration = Duration::from_micros(16_667);
const INPUT_CHANNEL: u8 = 0;
const SNAPSHOT_CHANNEL: u8 = 3;

/// Runs the scenario: during the lossy stretch the client's datagrams are dropped but one in
/// `keep_one_in` (0: all but the ACK-only ones), and every `hold_every` ticks the server does
/// not receive for `hold`; returns (inputs sent, inputs received,
/// the client's connection stats).
fn run(
    seed: u64,
    keep_one_in: u32,
    hold_every: u64,
    hold: Duration,
) -> (u64, u64, ricochet_proto::ConnectionStats) {
    // A window that shrinks with every loss, as a loss-tolerant one does when the RTT shows a
    // queue (the bench's stuck clients had RTTs near 2 s and windows of 5 to 13 KB): then the
    // parity of a few lossy round trips fills it.
    let cfg = Arc::new(Config::game().with(|c| c.loss_tolerant = false));
    let mut net = Net::new(
        Impair {
            delay: Duration::from_millis(1),
            ..Impair::default()
        },
        seed,
    );
    let (s, c) = net.add_pair(cfg);
    let now = net.now;
    let h = net.ep(c).connect(now, addr(1));
    let server_handle: Rc<Cell<Option<ConnectionHandle>>> = Rc::new(Cell::new(None));
    let received = Rc::new(Cell::new(0u64));
    let mut on_event = {
        let sh = server_handle.clone();
        let received = received.clone();
        move |ep: usize, _: &mut Net, h2: ConnectionHandle, e: Event| match e {
            Event::Connected if ep == s => sh.set(Some(h2)),
            Event::Message { channel, .. } if ep == s && channel == INPUT_CHANNEL => {
                received.set(received.get() + 1)
            }
            _ => {}
        }
    };
    let limit = net.now + Duration::from_secs(1);
    net.run_until(limit, &mut on_event);
    let sh = server_handle.get().expect("the client did not connect");

    // Lossy stretch from 1 s to 4 s: the client's datagrams are dropped but one in
    // `keep_one_in`, chosen by a seeded hash so that ACK-only packets get through too.
    let lossy = Rc::new(Cell::new(true));
    let flag = lossy.clone();
    let client = addr(2);
    let mut n = 0u64;
    net.drop_if = Some(Box::new(move |from, _, b| {
        if from != client || !flag.get() {
            return false;
        }
        if keep_one_in == 0 {
            // Data and parity are lost, ACK-only datagrams get through.
            return b.len() > 40;
        }
        n += 1;
        let x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed;
        (x >> 29) % u64::from(keep_one_in) != 0
    }));
    let mut sent = 0u64;
    let mut tick = 0u64;
    let game_end = net.now + Duration::from_secs(6);
    let lossy_end = net.now + Duration::from_secs(3);
    while net.now < game_end {
        if net.now >= lossy_end {
            lossy.set(false);
        } else if tick % hold_every == 0 {
            // The server's thread is descheduled for a while: what it is sent waits.
            net.hold = Some((addr(1), net.now + hold));
        }
        tick += 1;
        let mut snapshot = vec![0xab; 200];
        snapshot[..8].copy_from_slice(&tick.to_le_bytes());
        let _ = net.ep(s).send(sh, SNAPSHOT_CHANNEL, Bytes::from(snapshot));
        let mut input = vec![0u8; 32];
        input[..8].copy_from_slice(&sent.to_le_bytes());
        net.ep(c)
            .send(h, INPUT_CHANNEL, Bytes::from(input))
            .expect("input queued");
        sent += 1;
        let until = net.now + TICK;
        net.run_until(until, &mut on_event);
    }
    // Inputs stop; snapshots go on (as in the bench's drain) for up to 5 s.
    let drain_end = net.now + Duration::from_secs(5);
    while net.now < drain_end && received.get() < sent {
        tick += 1;
        let mut snapshot = vec![0xab; 200];
        snapshot[..8].copy_from_slice(&tick.to_le_bytes());
        let _ = net.ep(s).send(sh, SNAPSHOT_CHANNEL, Bytes::from(snapshot));
        let until = net.now + TICK;
        net.run_until(until, &mut on_event);
    }
    let stats = net.ep(c).connection(h).expect("client connection").stats();
    (sent, received.get(), stats)
}

#[test]
fn parity_in_flight_never_stalls_reliable_data() {
    for seed in 1..=8u64 {
        for keep in [0u32, 2, 3, 5, 10] {
            let (sent, received, st) = run(seed, keep, 30, Duration::from_millis(400));
            assert_eq!(
                received,
                sent,
                "seed {seed}, 1 in {keep} kept: {received} of {sent} inputs delivered; client \
                 cwnd {} in flight {} (parity sent {}), lost {}, probes {}, rto {}",
                st.cwnd,
                st.bytes_in_flight,
                st.fec.parity_sent,
                st.packets_lost,
                st.tail_loss_probes,
                st.rto_count
            );
        }
    }
}
