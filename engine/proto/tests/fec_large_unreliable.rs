//! Large unreliable messages under random loss (issue 38): 64 KiB messages on an unreliable
//! channel, cut into 64 fragments, across a path that loses 5 % of datagrams at random in both
//! directions, 20 ms each way. Without FEC a message arrives only when all of its fragments do
//! (0.95^64, about 4 %); with adaptive FEC the repairs of each message's chunks (see
//! `SlidingSender::protect_fragment`) bring nearly all of them back whole. A message is
//! delivered whole or not at all, and half-received ones are bounded in memory and time.
//!
//! Prints delivered-whole and wire/payload per policy:
//! `cargo test -p ricochet-proto --test fec_large_unreliable -- --nocapture`

mod proto_util;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proto_util::{addr, Impair, Net};
use ricochet_proto::fec::FecPolicy;
use ricochet_proto::{ChannelKind, Config, ConnectionHandle, Event};

const MESSAGE: usize = 64 << 10;
const CHANNEL: u8 = 2;
const ADAPTIVE: FecPolicy = FecPolicy::Adaptive { max_parity: 4 };

/// Message `id`: its id in the first 4 bytes, then bytes derived from it.
fn message(id: u32) -> Vec<u8> {
    let mut m = id.to_le_bytes().to_vec();
    m.extend((4..MESSAGE).map(|j| (id as usize * 131 + j * 7 + (j >> 8)) as u8));
    m
}

#[derive(Debug, Default)]
struct Outcome {
    sent: u32,
    /// Messages received whole and byte for byte as sent.
    whole: u32,
    /// Messages delivered with a wrong length or content (must stay 0).
    wrong: u32,
    /// Messages delivered more than once (must stay 0).
    repeated: u32,
    wire_bytes: u64,
    payload_bytes: u64,
    /// Peak bytes the receiver held in reassembly.
    reassembly_peak: usize,
    /// Reassembly bytes the receiver still holds at the end.
    reassembly_end: usize,
    repairs: u64,
}

impl Outcome {
    fn whole_percent(&self) -> f64 {
        100.0 * f64::from(self.whole) / f64::from(self.sent)
    }

    fn wire_ratio(&self) -> f64 {
        self.wire_bytes as f64 / self.payload_bytes as f64
    }
}

fn config(policy: FecPolicy) -> Config {
    Config::game().with(|c| {
        c.fec.policy = policy;
        c.channels = vec![
            ChannelKind::ReliableOrdered,
            ChannelKind::ReliableUnordered,
            ChannelKind::Unreliable,
        ];
    })
}

/// Sends `count` 64 KiB unreliable messages from the client, one every `interval`, through
/// `loss` random loss (from the handshake on) and 20 ms each way; counts those the server
/// received whole.
fn run(policy: FecPolicy, loss: f64, count: u32, interval: Duration, seed: u64) -> Outcome {
    let mut net = Net::new(
        Impair {
            delay: Duration::from_millis(20),
            loss,
            ..Impair::default()
        },
        seed,
    );
    let (s, c) = net.add_pair(Arc::new(config(policy)));
    let now = net.now;
    let h = net.ep(c).connect(now, addr(1));
    let settle = net.now + Duration::from_millis(300);
    net.run_until(settle, &mut |_, _, _, _| {});
    let out = Rc::new(RefCell::new((Outcome::default(), Vec::<bool>::new())));
    let server: Rc<RefCell<Option<ConnectionHandle>>> = Rc::default();
    let wire_before = net.bytes_sent;
    let mut on_event = {
        let (out, server) = (out.clone(), server.clone());
        move |ep: usize, _: &mut Net, sh: ConnectionHandle, e: Event| {
            if ep != s {
                return;
            }
            *server.borrow_mut() = Some(sh);
            let Event::Message { channel, data } = e else {
                return;
            };
            if channel != CHANNEL {
                return;
            }
            let mut o = out.borrow_mut();
            let id = data
                .get(..4)
                .map_or(u32::MAX, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            if data.len() != MESSAGE || data[..] != message(id)[..] {
                o.0.wrong += 1;
                return;
            }
            let seen = &mut o.1;
            if seen.len() <= id as usize {
                seen.resize(id as usize + 1, false);
            }
            if std::mem::replace(&mut seen[id as usize], true) {
                o.0.repeated += 1;
            } else {
                o.0.whole += 1;
            }
        }
    };
    for i in 0..count {
        net.ep(c)
            .send(h, CHANNEL, Bytes::from(message(i)))
            .expect("queued");
        let limit = net.now + interval;
        net.run_until(limit, &mut on_event);
    }
    let limit = net.now + Duration::from_secs(1);
    net.run_until(limit, &mut on_event);
    let mut o = std::mem::take(&mut out.borrow_mut().0);
    o.sent = count;
    o.wire_bytes = net.bytes_sent - wire_before;
    o.payload_bytes = u64::from(count) * MESSAGE as u64;
    o.repairs = net
        .ep(c)
        .connection(h)
        .expect("client")
        .stats()
        .fec
        .parity_sent;
    let sh = server.borrow().expect("the server saw the session");
    let st = net.ep(s).connection(sh).expect("server side").stats();
    o.reassembly_peak = st.reassembly_peak;
    o.reassembly_end = st.reassembly_bytes;
    o
}

fn report(name: &str, o: &Outcome) {
    println!(
        "{name:>9}: {} of {} delivered whole ({:.1} %), wire/payload {:.3}, repairs {}, \
         reassembly peak {} B",
        o.whole,
        o.sent,
        o.whole_percent(),
        o.wire_ratio(),
        o.repairs,
        o.reassembly_peak,
    );
}

/// The acceptance figure: 64 KiB messages at 5 % loss, 10 a second, adaptive FEC: at least
/// 90 % delivered whole (without FEC, a few %), none partial or corrupted.
#[test]
fn large_unreliable_messages_survive_five_percent_loss() {
    let off = run(FecPolicy::Off, 0.05, 100, Duration::from_millis(100), 7);
    report("off", &off);
    let fixed = run(
        FecPolicy::Fixed { parity: 2 },
        0.05,
        100,
        Duration::from_millis(100),
        7,
    );
    report("fixed 2", &fixed);
    let adaptive = run(ADAPTIVE, 0.05, 100, Duration::from_millis(100), 7);
    report("adaptive", &adaptive);
    for (name, o) in [("off", &off), ("fixed", &fixed), ("adaptive", &adaptive)] {
        assert_eq!((o.wrong, o.repeated), (0, 0), "{name}: {o:?}");
    }
    assert!(off.whole_percent() < 20.0, "off: {off:?}");
    assert!(
        adaptive.whole_percent() >= 90.0,
        "adaptive: {:.1} % whole",
        adaptive.whole_percent()
    );
    // Repairs cost bytes: the adaptive policy's stays within the parity cap (50 %).
    assert!(adaptive.wire_ratio() < 1.5, "{adaptive:?}");
}

/// At other loss rates the repairs follow the loss the peer reports: none on a clean path,
/// more at 10 % than at 5 %; and a message
/// is never delivered partial or corrupted.
#[test]
fn message_repairs_follow_the_reported_loss() {
    let clean = run(ADAPTIVE, 0.0, 40, Duration::from_millis(100), 3);
    report("clean", &clean);
    assert_eq!(clean.whole, 40);
    let five = run(ADAPTIVE, 0.05, 40, Duration::from_millis(100), 3);
    report("5 %", &five);
    let ten = run(ADAPTIVE, 0.10, 40, Duration::from_millis(100), 3);
    report("10 %", &ten);
    for o in [&clean, &five, &ten] {
        assert_eq!((o.wrong, o.repeated), (0, 0), "{o:?}");
    }
    // A clean path's first report reads it clean: its messages carry next to no repairs.
    assert!(clean.repairs * 4 < five.repairs, "{clean:?} vs {five:?}");
    assert!(five.repairs < ten.repairs, "{five:?} vs {ten:?}");
    assert!(ten.whole_percent() >= 80.0, "{ten:?}");
}

/// Half-received messages are bounded: at 30 % loss most messages never complete, and the
/// receiver holds at most what [`Config::unreliable_timeout`] lets pile up, then drops them
/// whole (nothing partial is ever delivered), ending with nothing held.
#[test]
fn half_received_messages_are_bounded_and_dropped_whole() {
    let o = run(FecPolicy::Off, 0.30, 30, Duration::from_millis(50), 5);
    report("30 % off", &o);
    assert_eq!((o.wrong, o.repeated), (0, 0), "{o:?}");
    // 500 ms of messages at 20 a second, 64 KiB each, plus fragment slots, at most.
    let bound = 11 * (MESSAGE + 64 * 64);
    assert!(o.reassembly_peak > 0, "{o:?}");
    assert!(o.reassembly_peak <= bound, "{o:?}");
    assert_eq!(o.reassembly_end, 0, "{o:?}");
}
