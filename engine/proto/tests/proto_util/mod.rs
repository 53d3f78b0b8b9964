//! A tiny deterministic lossy network for protocol tests: virtual time, seeded impairments
//! (loss, duplication, extra delay for a share of datagrams, one-way delay), endpoints by address.
#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ricochet_proto::{Config, ConnectionHandle, Endpoint, EndpointConfig, Event, ListenConfig};

/// Impairments applied to every datagram (both directions).
#[derive(Debug, Clone, Copy, Default)]
pub struct Impair {
    pub loss: f64,
    pub dup: f64,
    pub reorder: f64,
    pub reorder_extra: Duration,
    pub delay: Duration,
}

type InFlight = (Instant, u64, usize, SocketAddr, Vec<u8>);

/// A test's choice of datagrams to lose: `(from, to, bytes)` → drop.
pub type DropFilter = Box<dyn FnMut(SocketAddr, SocketAddr, &[u8]) -> bool>;

pub struct Net {
    pub base: Instant,
    pub now: Instant,
    pub eps: Vec<(SocketAddr, Endpoint)>,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    pub imp: Impair,
    rng: ChaCha8Rng,
    buf: Vec<u8>,
    pub datagrams_sent: u64,
    pub bytes_sent: u64,
    pub max_datagram: usize,
    stuck: u64,
    /// Drops a datagram (before the random impairments) when it returns true:
    /// `(from, to, bytes)`. Lets a test lose one chosen packet.
    pub drop_if: Option<DropFilter>,
    /// Datagrams to this address arrive no earlier than this instant, in the order they were
    /// sent: a receiver whose thread is not scheduled for a while (nothing is lost).
    pub hold: Option<(SocketAddr, Instant)>,
}

pub fn addr(i: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 4000 + i))
}

impl Net {
    pub fn new(imp: Impair, seed: u64) -> Self {
        let base = Instant::now();
        Self {
            base,
            now: base,
            eps: Vec::new(),
            queue: BinaryHeap::new(),
            seq: 0,
            imp,
            rng: ChaCha8Rng::seed_from_u64(seed),
            buf: vec![0u8; 65536],
            datagrams_sent: 0,
            bytes_sent: 0,
            max_datagram: 0,
            stuck: 0,
            drop_if: None,
            hold: None,
        }
    }

    /// A network whose only impairment is `one_way` delay in each direction.
    pub fn delayed(one_way: Duration, seed: u64) -> Self {
        Self::new(
            Impair {
                delay: one_way,
                ..Impair::default()
            },
            seed,
        )
    }

    pub fn add(&mut self, a: SocketAddr, ep: Endpoint) -> usize {
        self.eps.push((a, ep));
        self.eps.len() - 1
    }

    /// A listening server at `addr(1)` (seed 1) and a client at `addr(2)` (seed 2), both with
    /// `cfg`; returns their indices (server, client).
    pub fn add_pair(&mut self, cfg: Arc<Config>) -> (usize, usize) {
        let server = EndpointConfig::default().with(|c| {
            c.connection = cfg.clone();
            c.server = Some(ListenConfig::insecure());
        });
        let client = EndpointConfig::default().with(|c| c.connection = cfg);
        let s = self.add(addr(1), Endpoint::new(server, self.now, 1));
        let c = self.add(addr(2), Endpoint::new(client, self.now, 2));
        (s, c)
    }

    pub fn ep(&mut self, i: usize) -> &mut Endpoint {
        &mut self.eps[i].1
    }

    /// Inject a raw datagram (arrives now).
    pub fn inject(&mut self, from: SocketAddr, to: usize, bytes: Vec<u8>) {
        self.seq += 1;
        self.queue
            .push(Reverse((self.now, self.seq, to, from, bytes)));
    }

    fn route(&mut self, from: SocketAddr, to: SocketAddr, bytes: &[u8]) {
        let Some(dst) = self.eps.iter().position(|(a, _)| *a == to) else {
            return;
        };
        if self.drop_if.as_mut().is_some_and(|f| f(from, to, bytes)) {
            return;
        }
        if self.rng.random::<f64>() < self.imp.loss {
            return;
        }
        let copies = if self.rng.random::<f64>() < self.imp.dup {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut at = self.now + self.imp.delay;
            if self.rng.random::<f64>() < self.imp.reorder {
                at += self.imp.reorder_extra;
            }
            if let Some((held, until)) = self.hold {
                if held == to {
                    at = at.max(until);
                }
            }
            self.seq += 1;
            self.queue
                .push(Reverse((at, self.seq, dst, from, bytes.to_vec())));
        }
    }

    /// Flush every endpoint's transmissions into the network.
    pub fn flush(&mut self) {
        for i in 0..self.eps.len() {
            loop {
                let now = self.now;
                let mut buf = std::mem::take(&mut self.buf);
                let t = self.eps[i].1.poll_transmit(now, &mut buf);
                let Some(t) = t else {
                    self.buf = buf;
                    break;
                };
                self.datagrams_sent += 1;
                self.bytes_sent += t.size as u64;
                self.max_datagram = self.max_datagram.max(t.size);
                let from = self.eps[i].0;
                self.route(from, t.destination, &buf[..t.size]);
                self.buf = buf;
            }
        }
    }

    /// Advance to the next datagram arrival or timer (at most until `limit`), process it, and
    /// hand every resulting event to `on_event(endpoint index, net, handle, event)`.
    /// Returns false when nothing is left to do before `limit`.
    pub fn step(
        &mut self,
        limit: Instant,
        on_event: &mut dyn FnMut(usize, &mut Net, ConnectionHandle, Event),
    ) -> bool {
        self.flush();
        let mut next = self.queue.peek().map(|Reverse((t, ..))| *t);
        for (_, ep) in &mut self.eps {
            if let Some(t) = ep.poll_timeout() {
                next = Some(next.map_or(t, |n: Instant| n.min(t)));
            }
        }
        let Some(next) = next else { return false };
        if next > limit {
            self.now = limit;
            return false;
        }
        if next <= self.now {
            self.stuck += 1;
            assert!(
                self.stuck < 100_000,
                "no progress at {:?}: a timer stays in the past",
                self.elapsed()
            );
        } else {
            self.stuck = 0;
        }
        self.now = self.now.max(next);
        while let Some(Reverse((t, ..))) = self.queue.peek() {
            if *t > self.now {
                break;
            }
            let Some(Reverse((_, _, dst, from, bytes))) = self.queue.pop() else {
                break;
            };
            let now = self.now;
            let _ = self.eps[dst].1.handle_datagram(now, from, &bytes);
        }
        for i in 0..self.eps.len() {
            let now = self.now;
            self.eps[i].1.handle_timeout(now);
        }
        for i in 0..self.eps.len() {
            while let Some((h, e)) = self.eps[i].1.poll_event() {
                on_event(i, self, h, e);
            }
        }
        true
    }

    pub fn run_until(
        &mut self,
        limit: Instant,
        on_event: &mut dyn FnMut(usize, &mut Net, ConnectionHandle, Event),
    ) {
        while self.step(limit, on_event) {}
    }

    pub fn elapsed(&self) -> Duration {
        self.now - self.base
    }
}

/// Application logic plugged into an endpoint node.
pub trait App {
    /// An event from the endpoint.
    fn on_event(&mut self, now: Instant, ep: &mut Endpoint, h: ConnectionHandle, e: Event);
    /// Called after timers fire and after every datagram (to start work).
    fn on_tick(&mut self, _now: Instant, _ep: &mut Endpoint) {}
    /// When the app wants `on_tick` next.
    fn next_tick(&self) -> Option<Instant> {
        None
    }
}

/// An endpoint plus its application, as a simulator node.
pub struct EpNode<A: App> {
    pub ep: Endpoint,
    pub app: A,
}

impl<A: App> EpNode<A> {
    fn drain(&mut self, now: Instant) {
        self.app.on_tick(now, &mut self.ep);
        while let Some((h, e)) = self.ep.poll_event() {
            self.app.on_event(now, &mut self.ep, h, e);
        }
    }
}

impl<A: App> ricochet_testkit::SimNode for EpNode<A> {
    fn handle(&mut self, now: Instant, from: SocketAddr, bytes: &[u8]) {
        let _ = self.ep.handle_datagram(now, from, bytes);
        self.drain(now);
    }
    fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<SocketAddr> {
        buf.resize(2048, 0);
        match self.ep.poll_transmit(now, buf) {
            Some(t) => {
                buf.truncate(t.size);
                Some(t.destination)
            }
            None => {
                buf.clear();
                None
            }
        }
    }
    fn poll_timeout(&self) -> Option<Instant> {
        match (self.ep.poll_timeout(), self.app.next_tick()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
    fn handle_timeout(&mut self, now: Instant) {
        self.ep.handle_timeout(now);
        self.drain(now);
    }
}
