//! The generic harness: [`SimNode`] endpoints driven by a [`Simulation`] on the virtual clock.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::clock::SimClock;
use super::impair::{Impairment, ImpairmentError};
use super::network::SimNetwork;

/// An endpoint the simulator can drive, knowing nothing of its protocol.
///
/// The shape follows a sans-IO protocol core: the simulation hands in datagrams and timeouts, then
/// drains the node's outgoing datagrams. A node never reads a clock; `now` is always the
/// simulation's virtual time.
///
/// To plug in a protocol endpoint, implement this for a small wrapper that owns the endpoint and
/// the test's application logic: `handle` feeds `handle_datagram(now, from, bytes)` and then
/// drains the endpoint's events (e.g. echoing each message), `handle_timeout` does the same after
/// the endpoint's own `handle_timeout(now)`, and `poll_transmit` / `poll_timeout` forward to the
/// endpoint. Use an enum (or `Box<dyn SimNode>`) when clients and server differ in type.
pub trait SimNode {
    /// A datagram from `from` arrived at `now`.
    fn handle(&mut self, now: Instant, from: SocketAddr, bytes: &[u8]);

    /// Writes the next outgoing datagram into `buf` (empty on entry) and returns its destination,
    /// or returns `None` when there is nothing to send. Called until it returns `None` after every
    /// `handle` and `handle_timeout`, and at the start of each `run_*` call.
    fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<SocketAddr>;

    /// When the node next wants [`handle_timeout`](Self::handle_timeout), if ever.
    fn poll_timeout(&self) -> Option<Instant>;

    /// Called once the virtual clock reached the instant from `poll_timeout`.
    fn handle_timeout(&mut self, now: Instant);
}

impl<T: SimNode + ?Sized> SimNode for Box<T> {
    fn handle(&mut self, now: Instant, from: SocketAddr, bytes: &[u8]) {
        (**self).handle(now, from, bytes)
    }
    fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<SocketAddr> {
        (**self).poll_transmit(now, buf)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        (**self).poll_timeout()
    }
    fn handle_timeout(&mut self, now: Instant) {
        (**self).handle_timeout(now)
    }
}

/// Why a `run_*` call returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The next event lies after the deadline; the clock stands at the deadline.
    Deadline,
    /// Nothing is in flight and no node has a timer; the clock stands at the deadline.
    Idle,
    /// The caller's condition returned false; the clock stands at the last processed instant.
    Condition,
}

/// A simulation failure.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    /// Two nodes with one address.
    #[error("address {0} already has a node")]
    AddressInUse(SocketAddr),
    /// No node at this address.
    #[error("no node at {0}")]
    NoSuchNode(SocketAddr),
    /// More events at one instant than the limit: time stopped advancing (e.g. zero-delay
    /// ping-pong, or a timer that stays in the past after `handle_timeout`).
    #[error("simulated time stalled at {at:?} after {events} events at one instant")]
    Stalled {
        /// Simulated time of the stall.
        at: Duration,
        /// Events processed at that instant.
        events: u64,
    },
    /// An invalid impairment.
    #[error(transparent)]
    Impairment(#[from] ImpairmentError),
}

/// What a simulation has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Datagrams handed to a node.
    pub delivered: u64,
    /// Datagrams that arrived at an address without a node (dropped, counted).
    pub undeliverable: u64,
    /// Datagrams nodes transmitted.
    pub transmitted: u64,
    /// `handle_timeout` calls.
    pub timeouts: u64,
    /// Distinct instants at which something happened.
    pub instants: u64,
}

/// Nodes on a [`SimNetwork`], driven on a [`SimClock`].
///
/// At each instant the simulation first delivers every datagram due (in delivery order, each
/// followed by draining the receiver's transmits), then fires every due timer (in the order nodes
/// were added), and repeats while zero-delay datagrams keep arriving at the same instant; then it
/// jumps the clock to the earliest of the next delivery and the nodes' timers. Everything is
/// ordered deterministically, so a seed fixes the whole run.
#[derive(Debug)]
pub struct Simulation<N> {
    clock: SimClock,
    net: SimNetwork,
    nodes: Vec<(SocketAddr, N)>,
    by_addr: HashMap<SocketAddr, usize>,
    stats: SimStats,
    max_events_per_instant: u64,
}

impl<N: SimNode> Simulation<N> {
    /// A simulation with a fresh clock and a network whose links default to `impairment`.
    pub fn new(seed: u64, impairment: Impairment) -> Result<Self, SimError> {
        let clock = SimClock::new();
        let net = SimNetwork::new(clock.base(), seed, impairment)?;
        Ok(Self::from_parts(clock, net))
    }

    /// A simulation on an existing clock and network.
    pub fn from_parts(clock: SimClock, net: SimNetwork) -> Self {
        Self {
            clock,
            net,
            nodes: Vec::new(),
            by_addr: HashMap::new(),
            stats: SimStats::default(),
            max_events_per_instant: 10_000_000,
        }
    }

    /// Sets how many events (deliveries, timeouts, transmits) one instant may hold before the run
    /// fails with [`SimError::Stalled`] (default 10^7).
    pub fn set_max_events_per_instant(&mut self, limit: u64) {
        self.max_events_per_instant = limit;
    }

    /// Adds `node` at `addr`.
    pub fn add_node(&mut self, addr: SocketAddr, node: N) -> Result<(), SimError> {
        if self.by_addr.contains_key(&addr) {
            return Err(SimError::AddressInUse(addr));
        }
        self.by_addr.insert(addr, self.nodes.len());
        self.nodes.push((addr, node));
        Ok(())
    }

    /// Moves the node at `old` to `new` (e.g. a client whose NAT mapping changed); datagrams in
    /// flight to `old` become undeliverable.
    pub fn rebind(&mut self, old: SocketAddr, new: SocketAddr) -> Result<(), SimError> {
        if self.by_addr.contains_key(&new) {
            return Err(SimError::AddressInUse(new));
        }
        let i = self.by_addr.remove(&old).ok_or(SimError::NoSuchNode(old))?;
        self.nodes[i].0 = new;
        self.by_addr.insert(new, i);
        Ok(())
    }

    /// The node at `addr`.
    pub fn node(&self, addr: SocketAddr) -> Option<&N> {
        self.by_addr.get(&addr).map(|&i| &self.nodes[i].1)
    }

    /// The node at `addr`, mutably (e.g. to queue application sends between runs).
    pub fn node_mut(&mut self, addr: SocketAddr) -> Option<&mut N> {
        self.by_addr.get(&addr).map(|&i| &mut self.nodes[i].1)
    }

    /// Every node with its address, in the order added.
    pub fn nodes(&self) -> impl Iterator<Item = (SocketAddr, &N)> + '_ {
        self.nodes.iter().map(|(a, n)| (*a, n))
    }

    /// Ends the simulation and hands back every node with its address, in the order added.
    pub fn into_nodes(self) -> Vec<(SocketAddr, N)> {
        self.nodes
    }

    /// The virtual clock.
    pub fn clock(&self) -> &SimClock {
        &self.clock
    }

    /// The current simulated instant.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// The network (counters, trace hash, in-flight datagrams).
    pub fn network(&self) -> &SimNetwork {
        &self.net
    }

    /// The network, mutably (per-route impairments, tracing, injected datagrams).
    pub fn network_mut(&mut self) -> &mut SimNetwork {
        &mut self.net
    }

    /// What the simulation has done so far.
    pub fn stats(&self) -> SimStats {
        self.stats
    }

    /// Runs for `d` of simulated time.
    pub fn run_for(&mut self, d: Duration) -> Result<StopReason, SimError> {
        let deadline = self.clock.now() + d;
        self.run_until(deadline)
    }

    /// Runs until simulated time reaches `deadline` (or nothing is left to do).
    pub fn run_until(&mut self, deadline: Instant) -> Result<StopReason, SimError> {
        self.run_while(deadline, |_| true)
    }

    /// Runs until `deadline` while `keep_going` (checked after each instant) returns true.
    pub fn run_while(
        &mut self,
        deadline: Instant,
        mut keep_going: impl FnMut(&Self) -> bool,
    ) -> Result<StopReason, SimError> {
        let mut events = 0u64;
        for i in 0..self.nodes.len() {
            self.flush(i, &mut events)?;
        }
        let mut last = None;
        loop {
            let now = self.clock.now();
            if now > deadline {
                return Ok(StopReason::Deadline);
            }
            // A timer still at or before `now` after `handle_timeout` keeps us on this instant;
            // the event count keeps growing then, and the limit turns a livelock into an error.
            if last != Some(now) {
                last = Some(now);
                self.stats.instants += 1;
                events = 0;
            }
            loop {
                while let Some(d) = self.net.pop_due(now) {
                    self.count(&mut events)?;
                    match self.by_addr.get(&d.to) {
                        Some(&i) => {
                            self.stats.delivered += 1;
                            self.nodes[i].1.handle(now, d.from, &d.bytes);
                            self.net.recycle(d.bytes);
                            self.flush(i, &mut events)?;
                        }
                        None => {
                            self.stats.undeliverable += 1;
                            self.net.recycle(d.bytes);
                        }
                    }
                }
                for i in 0..self.nodes.len() {
                    if self.nodes[i].1.poll_timeout().is_some_and(|t| t <= now) {
                        self.count(&mut events)?;
                        self.stats.timeouts += 1;
                        self.nodes[i].1.handle_timeout(now);
                        self.flush(i, &mut events)?;
                    }
                }
                // Zero-delay datagrams sent by the timers are due at this same instant.
                if self.net.next_delivery_time().is_none_or(|t| t > now) {
                    break;
                }
            }
            if !keep_going(self) {
                return Ok(StopReason::Condition);
            }
            let timer = self
                .nodes
                .iter()
                .filter_map(|(_, n)| n.poll_timeout())
                .min();
            let busy = timer.is_some() || self.net.next_delivery_time().is_some();
            if !self.net.advance_clock(&mut self.clock, timer, deadline) {
                return Ok(if busy {
                    StopReason::Deadline
                } else {
                    StopReason::Idle
                });
            }
        }
    }

    fn count(&self, events: &mut u64) -> Result<(), SimError> {
        *events += 1;
        if *events > self.max_events_per_instant {
            return Err(SimError::Stalled {
                at: self.clock.elapsed(),
                events: *events,
            });
        }
        Ok(())
    }

    /// Sends everything node `i` has to send.
    fn flush(&mut self, i: usize, events: &mut u64) -> Result<(), SimError> {
        let now = self.clock.now();
        loop {
            let mut buf = self.net.take_buf();
            let (from, node) = &mut self.nodes[i];
            match node.poll_transmit(now, &mut buf) {
                Some(to) => {
                    self.stats.transmitted += 1;
                    let from = *from;
                    self.net.send_buf(now, from, to, buf);
                    self.count(events)?;
                }
                None => {
                    self.net.recycle(buf);
                    return Ok(());
                }
            }
        }
    }
}
