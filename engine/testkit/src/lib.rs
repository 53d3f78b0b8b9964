//! A deterministic network simulator: virtual clock, links with seeded impairments.
//!
//! Protocol tests run hours of simulated traffic in seconds and get bit-identical results for a
//! seed: nothing here sleeps or reads the wall clock (except [`SimClock::new`] capturing its base
//! once), and every random decision comes from a ChaCha8 stream keyed by (seed, route, direction).
//! The simulator moves opaque byte datagrams between [`SocketAddr`](std::net::SocketAddr)s; it
//! knows nothing of the protocol.
//!
//! # Pieces
//!
//! - [`SimClock`]: virtual time as `std::time::Instant`s (what the sans-IO protocol takes).
//! - [`Impairment`] and [`Profile`]: what a link direction does to datagrams.
//! - [`ImpairedLink`]: the decision logic of one direction, on any clock: `admit(now, len)`
//!   returns a [`Verdict`] (dropped with a [`DropCause`], or delivered at `t1`, plus a duplicate
//!   at `t2`), and `on_departed(len)` frees queue space.
//! - [`ImpairedQueue`]: an `ImpairedLink` plus the copies it holds, popped when due: one
//!   direction of a bench relay route on a real clock.
//! - [`SimNetwork`]: links per address pair, datagrams in flight, delivery in time order, an
//!   optional trace hash, and [`SimNetwork::advance_clock`] for hand-written driver loops.
//! - [`SimNode`] and [`Simulation`]: plug protocol endpoints in and run them to a deadline.
//!
//! # Profiles
//!
//! The named conditions of the reference library's RUDP report (whose figures `PERFORMANCE.md`
//! shows next to ours); each applies to every
//! link direction independently ([`Profile::from_str`](std::str::FromStr::from_str) accepts the
//! lower-case names):
//!
//! | profile | loss | one-way delay | duplicates / reordering |
//! | --- | --- | --- | --- |
//! | `none` | 0 | 0 ms | 0 |
//! | `random` | 5% per datagram | 10 ms | 1% duplicated; 5% delayed by another 15 ms |
//! | `burst` | 3 consecutive per 100, per direction | 10 ms | same as `random` |
//! | `sustained` | `burst` plus 2% random loss of the remaining datagrams | 10 ms | same as `random` |
//!
//! Burst loss is exact, not a probability: in every window of P = 100 consecutive datagrams a
//! link direction carries (datagrams `0..100`, `100..200`, ...), one run of N = 3 consecutive
//! datagrams is dropped, starting at a seeded uniform offset in `0..=P-N` (see [`BurstLoss`]).
//! Runs of neighbouring windows can touch, so at most 2N are lost in a row.
//!
//! With zero delay (`none`) a ping-pong of nodes never lets time advance; [`Simulation`] stops
//! such a livelock with [`SimError::Stalled`]. Give throughput tests a small delay or a rate
//! ([`Impairment::with_rate`]) to model the path's capacity.
//!
//! # Reading the counters
//!
//! [`LinkCounters`] are kept per link direction ([`SimNetwork::link_counters`]) and summed by
//! [`SimNetwork::total_counters`]:
//!
//! - `offered` datagrams entered the link; each was either dropped, counted once in
//!   `dropped_random`, `dropped_burst` or `dropped_overflow`, or delivered.
//! - `forwarded` counts delivered *copies*: delivered originals plus `duplicated`.
//! - `delayed` counts copies that got the extra reordering delay.
//! - `overflows` counts every copy a full queue refused (`dropped_overflow` plus refused
//!   duplicates).
//! - The queue holds a copy from admission to departure (delivery here, the send in the relay):
//!   `queue_bytes`/`queue_datagrams` now, `queue_peak_*` the high-water marks. Summed peaks bound
//!   the total but may come from different moments, like the reference's "route peaks sum".
//! - [`LinkCounters::realized_loss`] = dropped / offered.
//!
//! # Example
//!
//! ```
//! use std::net::SocketAddr;
//! use std::time::{Duration, Instant};
//! use ricochet_testkit::{Profile, SimNode, Simulation, StopReason};
//!
//! /// Sends a numbered ping every 10 ms and counts the echoes.
//! struct Pinger { peer: SocketAddr, next: Instant, sent: u32, echoes: u32 }
//! /// Echoes everything back.
//! struct Echo { out: Vec<(SocketAddr, Vec<u8>)> }
//!
//! enum Node { Pinger(Pinger), Echo(Echo) }
//!
//! impl SimNode for Node {
//!     fn handle(&mut self, _now: Instant, from: SocketAddr, bytes: &[u8]) {
//!         match self {
//!             Node::Pinger(p) => p.echoes += 1,
//!             Node::Echo(e) => e.out.push((from, bytes.to_vec())),
//!         }
//!     }
//!     fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<SocketAddr> {
//!         match self {
//!             Node::Pinger(p) if now >= p.next && p.sent < 1000 => {
//!                 buf.extend_from_slice(&p.sent.to_le_bytes());
//!                 p.sent += 1;
//!                 p.next = now + Duration::from_millis(10);
//!                 Some(p.peer)
//!             }
//!             Node::Echo(e) => e.out.pop().map(|(to, bytes)| {
//!                 buf.extend_from_slice(&bytes);
//!                 to
//!             }),
//!             _ => None,
//!         }
//!     }
//!     fn poll_timeout(&self) -> Option<Instant> {
//!         match self {
//!             Node::Pinger(p) if p.sent < 1000 => Some(p.next),
//!             _ => None,
//!         }
//!     }
//!     fn handle_timeout(&mut self, _now: Instant) {}
//! }
//!
//! let (client, server): (SocketAddr, SocketAddr) =
//!     ("10.0.0.1:5000".parse().unwrap(), "10.0.0.2:7000".parse().unwrap());
//! let mut sim = Simulation::new(42, Profile::Random.impairment()).unwrap();
//! let start = sim.now();
//! sim.add_node(client, Node::Pinger(Pinger { peer: server, next: start, sent: 0, echoes: 0 }))
//!     .unwrap();
//! sim.add_node(server, Node::Echo(Echo { out: Vec::new() })).unwrap();
//! sim.network_mut().enable_trace();
//!
//! // 1,000 pings over 10 simulated seconds, in well under a second of real time.
//! let stop = sim.run_for(Duration::from_secs(20)).unwrap();
//! assert_eq!(stop, StopReason::Idle);
//! let up = *sim.network().link_counters(client, server).unwrap();
//! let down = *sim.network().link_counters(server, client).unwrap();
//! let Some(Node::Pinger(p)) = sim.node(client) else { unreachable!() };
//! // Every echo is an offered ping that survived both directions, or a duplicate of one.
//! assert_eq!(up.offered, 1000);
//! assert_eq!(down.offered, up.forwarded);
//! assert_eq!(u64::from(p.echoes), down.forwarded);
//! println!("realized loss up {:.3} down {:.3}", up.realized_loss(), down.realized_loss());
//! ```

mod clock;
mod harness;
mod impair;
mod network;
mod queue;

pub mod echo;
pub mod game;
pub mod sessions;

pub use clock::SimClock;
pub use harness::{SimError, SimNode, SimStats, Simulation, StopReason};
pub use impair::{
    link_rng_key, BurstLoss, Direction, DropCause, ImpairedLink, Impairment, ImpairmentError,
    LinkCounters, ParseProfileError, Profile, Verdict, DEFAULT_QUEUE_BYTES,
    DEFAULT_QUEUE_DATAGRAMS,
};
pub use network::{Datagram, SimNetwork};
pub use queue::ImpairedQueue;
