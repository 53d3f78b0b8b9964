//! Large unreliable messages through real sockets (issue 38): a client sends 64 KiB messages
//! on an unreliable channel to a server whose link conditioner loses 5 % of datagrams each way
//! (10 ms each way, seeded). With the game profile's adaptive FEC at least 90 % arrive whole;
//! without FEC few do; none is ever delivered partial or corrupted.
#![cfg(all(feature = "conditioner", feature = "fec"))]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ricochet::proto::fec::FecPolicy;
use ricochet::runtime::{Handler, Server, ServerConfig, ServerContext, SessionId};
use ricochet::{Client, ClientConfig, ClientEvent, Impairment, LinkConditioner, Profile};

const MESSAGE: usize = 64 << 10;
const CHANNEL: u8 = 2;

fn message(id: u32) -> Vec<u8> {
    let mut m = id.to_le_bytes().to_vec();
    m.extend((4..MESSAGE).map(|j| (id as usize * 131 + j * 7 + (j >> 8)) as u8));
    m
}

/// (whole, wrong or repeated) messages the server received.
#[derive(Default)]
struct Tally {
    seen: Vec<bool>,
    whole: u32,
    wrong: u32,
}

struct Count(Arc<Mutex<Tally>>);

impl Handler for Count {
    fn on_message(&mut self, _: &mut ServerContext<'_>, _: SessionId, channel: u8, data: Bytes) {
        if channel != CHANNEL {
            return;
        }
        let mut t = self.0.lock().unwrap();
        let id = data
            .get(..4)
            .map_or(u32::MAX, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        if data.len() != MESSAGE || data[..] != message(id)[..] {
            t.wrong += 1;
            return;
        }
        let i = id as usize;
        if t.seen.len() <= i {
            t.seen.resize(i + 1, false);
        }
        if std::mem::replace(&mut t.seen[i], true) {
            t.wrong += 1;
        } else {
            t.whole += 1;
        }
    }
}

/// Sends `count` messages, one every 100 ms, with `policy` on both sides; (whole, wrong).
fn run(policy: FecPolicy, count: u32) -> (u32, u32) {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let t = tally.clone();
    let cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap())
        .insecure()
        .profile(Profile::Game)
        .workers(1)
        .session(|c| c.fec.policy = policy);
    let srv = Server::start(cfg, move |_| Count(t.clone())).unwrap();
    let each_way = Impairment::new()
        .loss(0.05)
        .delay(Duration::from_millis(10));
    srv.set_conditioner(Some(LinkConditioner::symmetric(each_way).seed(11)))
        .unwrap();
    let ccfg = ClientConfig::new()
        .profile(Profile::Game)
        .session(|c| c.fec.policy = policy)
        .connect_timeout(Duration::from_secs(10));
    let mut c = Client::connect_insecure_blocking(srv.local_addr(), ccfg).unwrap();
    let mut next = Instant::now();
    let pump = |c: &mut Client, until: Instant| loop {
        let now = Instant::now();
        if now >= until {
            return;
        }
        for ev in c.wait(until - now).unwrap() {
            if let ClientEvent::Disconnected { reason, .. } = ev {
                panic!("session closed: {reason:?}");
            }
        }
    };
    for i in 0..count {
        c.send(CHANNEL, message(i)).unwrap();
        next += Duration::from_millis(100);
        pump(&mut c, next);
    }
    pump(&mut c, Instant::now() + Duration::from_secs(1));
    let t = tally.lock().unwrap();
    (t.whole, t.wrong)
}

#[test]
fn large_unreliable_messages_survive_five_percent_loss_through_sockets() {
    let (off, off_wrong) = run(FecPolicy::Off, 30);
    let (adaptive, adaptive_wrong) = run(FecPolicy::Adaptive { max_parity: 4 }, 40);
    eprintln!("whole: off {off} of 30, adaptive {adaptive} of 40");
    assert_eq!((off_wrong, adaptive_wrong), (0, 0));
    // 0.95^64 = 3.8 % each; half of 30 would be far beyond chance.
    assert!(off < 15, "off: {off} of 30 whole");
    assert!(adaptive >= 36, "adaptive: {adaptive} of 40 whole");
}
