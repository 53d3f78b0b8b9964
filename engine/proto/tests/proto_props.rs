//! Property tests over random impairments through `ricochet_testkit`: loss 0-30 %, duplication
//! 0-10 %, reordering 0-20 %, delay 0-100 ms, all four channel kinds mixed, message sizes
//! 0 B-64 KiB, both directions at once. Every reliable message arrives exactly once and intact,
//! ordered channels in order; unreliable messages are intact and never duplicated;
//! unreliable-sequenced never goes backwards; reassembly memory stays under its caps.

mod proto_util;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;
use proto_util::{App, EpNode};
use ricochet_proto::{Config, ConnectionHandle, Endpoint, EndpointConfig, Event, ListenConfig};
use ricochet_testkit::{Impairment, Simulation};

const CONN_LIMIT: usize = 512 << 10;
const ENDPOINT_BUDGET: usize = 768 << 10;

fn content(side: u8, idx: usize, len: usize) -> Bytes {
    let mut v: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(idx as u8 ^ side))
        .collect();
    if len >= 9 {
        v[0] = side;
        v[1..9].copy_from_slice(&(idx as u64).to_le_bytes());
    }
    Bytes::from(v)
}

struct Peer {
    server: Option<SocketAddr>,
    plan: Vec<(u8, Bytes)>,
    handle: Option<ConnectionHandle>,
    started: bool,
    received: Vec<(u8, Bytes)>,
    closed: bool,
}

impl App for Peer {
    fn on_tick(&mut self, now: Instant, ep: &mut Endpoint) {
        if !self.started {
            self.started = true;
            if let Some(s) = self.server {
                self.handle = Some(ep.connect(now, s));
            }
        }
    }
    fn on_event(&mut self, _now: Instant, ep: &mut Endpoint, h: ConnectionHandle, e: Event) {
        match e {
            Event::Connected => {
                self.handle = Some(h);
                for (ch, data) in &self.plan {
                    ep.send(h, *ch, data.clone()).unwrap();
                }
            }
            Event::Message { channel, data } => self.received.push((channel, data)),
            Event::Closed { .. } => self.closed = true,
            Event::Incoming(_) => unreachable!("no accept hook"),
        }
    }
}

/// Check what `got` received against what the other side sent (`sent`).
fn check(sent: &[(u8, Bytes)], got: &[(u8, Bytes)]) -> Result<bool, String> {
    let mut complete = true;
    for ch in 0..4u8 {
        let s: Vec<&Bytes> = sent
            .iter()
            .filter(|(c, _)| *c == ch)
            .map(|(_, b)| b)
            .collect();
        let g: Vec<&Bytes> = got
            .iter()
            .filter(|(c, _)| *c == ch)
            .map(|(_, b)| b)
            .collect();
        match ch {
            0 => {
                // Reliable ordered: a prefix of the sent sequence, in order, intact.
                if g.len() > s.len() || g.iter().zip(&s).any(|(a, b)| a != b) {
                    return Err(format!("ordered channel: {} received, mismatch", g.len()));
                }
                complete &= g.len() == s.len();
            }
            1 => {
                // Reliable unordered: each sent message at most once (exactly once when complete).
                let mut used = vec![false; s.len()];
                for m in &g {
                    let Some(i) = (0..s.len()).find(|&i| !used[i] && s[i] == *m) else {
                        return Err("unordered channel: unknown or duplicated message".into());
                    };
                    used[i] = true;
                }
                complete &= g.len() == s.len();
            }
            2 => {
                let mut used = vec![false; s.len()];
                for m in &g {
                    let Some(i) = (0..s.len()).find(|&i| !used[i] && s[i] == *m) else {
                        return Err("unreliable channel: corrupted or duplicated message".into());
                    };
                    used[i] = true;
                }
            }
            _ => {
                // Sequenced: a subsequence of the sent order (never goes backwards).
                let mut pos = 0;
                for m in &g {
                    let Some(i) = (pos..s.len()).find(|&i| s[i] == *m) else {
                        return Err("sequenced channel went backwards or corrupted".into());
                    };
                    pos = i + 1;
                }
            }
        }
    }
    Ok(complete)
}

fn plan_strategy() -> impl Strategy<Value = Vec<(u8, usize)>> {
    let size = prop_oneof![
        4 => 0usize..64,
        3 => 64usize..2000,
        2 => 2000usize..20_000,
        1 => 20_000usize..=65_536,
    ];
    proptest::collection::vec((0u8..4, size), 1..24)
}

fn run_case(
    imp: Impairment,
    seed: u64,
    plan_c: &[(u8, usize)],
    plan_s: &[(u8, usize)],
) -> Result<(), TestCaseError> {
    let mut sim: Simulation<EpNode<Peer>> = Simulation::new(seed, imp).unwrap();
    let base = sim.now();
    let cfg = Arc::new(Config::default().with(|c| {
        c.reassembly_limit = CONN_LIMIT;
        c.handshake_timeout = Duration::from_secs(60);
        c.idle_timeout = Duration::from_secs(60);
    }));
    let sa: SocketAddr = "10.0.0.1:7000".parse().unwrap();
    let ca: SocketAddr = "10.0.0.2:5000".parse().unwrap();
    let mk = |side: u8, p: &[(u8, usize)]| -> Vec<(u8, Bytes)> {
        p.iter()
            .enumerate()
            .map(|(i, &(ch, len))| (ch, content(side, i, len)))
            .collect()
    };
    let (pc, ps) = (mk(1, plan_c), mk(2, plan_s));
    let ecfg = |server: bool| {
        EndpointConfig::default().with(|c| {
            c.connection = cfg.clone();
            c.server = server.then(ListenConfig::insecure);
            c.reassembly_budget = ENDPOINT_BUDGET;
        })
    };
    let peer = |server, plan| Peer {
        server,
        plan,
        handle: None,
        started: false,
        received: Vec::new(),
        closed: false,
    };
    sim.add_node(
        sa,
        EpNode {
            ep: Endpoint::new(ecfg(true), base, seed ^ 1),
            app: peer(None, ps.clone()),
        },
    )
    .unwrap();
    sim.add_node(
        ca,
        EpNode {
            ep: Endpoint::new(ecfg(false), base, seed ^ 2),
            app: peer(Some(sa), pc.clone()),
        },
    )
    .unwrap();
    if let Some(n) = sim.node_mut(ca) {
        n.app.on_tick(base, &mut n.ep);
    }
    let deadline = base + Duration::from_secs(600);
    let mut done = false;
    while sim.now() < deadline && !done {
        sim.run_for(Duration::from_millis(500)).unwrap();
        let c = sim.node(ca).unwrap();
        let s = sim.node(sa).unwrap();
        let c_ok =
            check(&ps, &c.app.received).map_err(|e| TestCaseError::fail(format!("client: {e}")))?;
        let s_ok =
            check(&pc, &s.app.received).map_err(|e| TestCaseError::fail(format!("server: {e}")))?;
        for n in [c, s] {
            prop_assert!(n.ep.reassembly_bytes() <= ENDPOINT_BUDGET);
            if let Some(h) = n.app.handle {
                if let Some(conn) = n.ep.connection(h) {
                    prop_assert!(conn.stats().reassembly_peak <= CONN_LIMIT);
                }
            }
            prop_assert!(!n.app.closed, "connection closed");
        }
        done = c_ok && s_ok;
    }
    let took = sim.now() - base;
    eprintln!(
        "case seed {seed:#x}: {} + {} messages, done={done} after {took:?} simulated",
        plan_c.len(),
        plan_s.len()
    );
    prop_assert!(
        done,
        "reliable messages not all delivered after 600 simulated seconds"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_reliable_message_once_intact_ordered(
        loss in 0.0..0.30f64,
        dup in 0.0..0.10f64,
        reorder in 0.0..0.20f64,
        delay_ms in 0u64..=100,
        extra_ms in 1u64..=50,
        seed in any::<u64>(),
        plan_c in plan_strategy(),
        plan_s in plan_strategy(),
    ) {
        let imp = Impairment::none()
            .with_loss(loss)
            .with_duplicate(dup)
            .with_reorder(reorder, Duration::from_millis(extra_ms))
            .with_delay(Duration::from_millis(delay_ms.max(1)));
        run_case(imp, seed, &plan_c, &plan_s)?;
    }
}
