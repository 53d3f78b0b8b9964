//! The impairment relay: a UDP relay on its own thread between clients and a server that applies
//! the simulator's impairment model ([`ricochet_testkit`]) on a real clock.
//!
//! ```text
//!  client A ──┐                 ┌─ upstream socket A ──┐
//!  client B ──┼─► front socket ─┼─ upstream socket B ──┼─► server
//!  client C ──┘   (relay addr)  └─ upstream socket C ──┘
//! ```
//!
//! # Routes
//!
//! Clients send to one front-door address ([`RelayHandle::addr`]). The first datagram from a new
//! client address creates a *route*: the relay binds an upstream socket for it (or takes one of
//! [`RelayConfig::clients`] pre-bound at start), connected to the server. The server therefore
//! sees one distinct source address per client, and its replies to that address come back
//! through the same route to the client. One front socket (rather than one front-door address
//! per client) keeps the clients' configuration the same as without a relay (one server
//! address), creates routes lazily for any number of clients up to [`RelayConfig::max_routes`],
//! and keeps client address changes visible to the server: a client that rebinds gets a new
//! route, so the server sees a new source address, as it would after a NAT rebinding.
//!
//! # Impairment
//!
//! Each route direction (up = client to server, down = server to client) is an
//! [`ImpairedQueue`](ricochet_testkit::ImpairedQueue) whose decisions come from a ChaCha stream
//! keyed by (seed, route id, direction) ([`ricochet_testkit::link_rng_key`]), exactly as in the
//! simulator. A datagram is offered when it is received (`Instant::now()` after the receive) and
//! each copy is sent when due. The decision stream depends only on the order of the datagrams a
//! route direction receives, not on timing: two runs with the same seed and the same datagram
//! order drop, duplicate and delay the same datagrams. Route ids follow the order of the clients'
//! first datagrams.
//!
//! Queue capacity ([`Impairment::queue_bytes`](ricochet_testkit::Impairment::queue_bytes) / [`Impairment::queue_datagrams`](ricochet_testkit::Impairment::queue_datagrams), 8 MiB / 8,192
//! datagrams by default, as the reference relay) applies to each route direction.
//!
//! # Bottleneck
//!
//! A direction may have a [`Bottleneck`] in front of its impairment: a rate limit that a
//! [`RateSchedule`] changes during the run (offsets from the relay's start), with a drop-tail
//! queue as long as the rate drains in [`BottleneckConfig::buffer`]. Each route direction has
//! its own ([`RelayConfig::down_bottleneck`]: a player's downlink), or all routes share one per
//! direction ([`RelayConfig::shared_bottleneck`]: a server's uplink). A datagram leaving the
//! bottleneck is offered to the impairment at its departure time, so the one-way delay adds to
//! its queue delay. The relay reports each bottleneck's drops and queue delay (sojourn p50 /
//! p99 / max).
//!
//! # Timing
//!
//! The thread sleeps in `ppoll` (Linux; `poll` elsewhere) until the next due time or a socket
//! becomes ready, with the thread's timer slack set to the minimum, and wakes
//! [`RelayConfig::spin`] early to poll without blocking until the due time. Copies are never sent
//! early; how late they are is measured ([`Lateness`]).
//!
//! # Counters
//!
//! [`RelayHandle::counters`] asks the relay thread for a consistent [`RelayCounters`] snapshot
//! (serializable for the bench JSON): per route and direction the simulator's link counters
//! (offered, forwarded, dropped by cause, duplicated, delayed, overflows, queue peaks) plus
//! sends, relay errors, send lateness and the relay thread's CPU time. Datagrams the kernel
//! dropped at the relay's own sockets (the thread did not read them in time: loss outside the
//! model) are read with `SO_MEMINFO` on Linux and reported as relay errors
//! ([`RelayErrors::front_socket_drops`], [`RelayErrors::upstream_socket_drops`]).
//!
//! # Load
//!
//! The thread costs about one `recv` and one `send` system call per datagram; the loopback send
//! (which delivers into the receiver's socket and wakes it) dominates its CPU time. On a machine
//! whose cores are all busy the thread may wait for a core, which shows as lateness and, at high
//! rates, as socket drops; [`RelayConfig::nice`] lets it win that wait.

mod bottleneck;
mod cli;
mod config;
mod counters;
mod queue_series;
mod shared;
mod sys;
mod worker;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{anyhow, Context};
use shared::Shared;

pub use bottleneck::{Bottleneck, BottleneckConfig, BottleneckCounters, RateSchedule};
pub use cli::{run, BottleneckArgs, ImpairmentArgs, RelayArgs};
pub use config::{RelayConfig, DEFAULT_SOCKET_BUFFER};
pub use counters::{
    DirectionCounters, Lateness, RelayCounters, RelayErrors, RouteCounters, RoutePeaks,
};
pub use queue_series::{QueueBin, QueueSeries, QUEUE_BIN};

/// The relay; see the [module docs](self).
#[derive(Debug)]
pub struct Relay;

impl Relay {
    /// Binds the front socket and the pre-created upstream sockets, then starts the relay
    /// thread.
    pub fn start(cfg: RelayConfig) -> anyhow::Result<RelayHandle> {
        cfg.up.validate().context("up impairment")?;
        cfg.down.validate().context("down impairment")?;
        for b in [&cfg.up_bottleneck, &cfg.down_bottleneck]
            .into_iter()
            .flatten()
        {
            if b.buffer.is_zero() {
                return Err(anyhow!(
                    "a relay bottleneck's buffer must be longer than zero"
                ));
            }
        }
        if cfg.max_routes == 0 || cfg.clients > cfg.max_routes {
            return Err(anyhow!(
                "relay needs 0 < max_routes ({}) and clients ({}) <= max_routes",
                cfg.max_routes,
                cfg.clients
            ));
        }
        let front =
            worker::bind_udp(cfg.listen, cfg.socket_buffer).context("relay front socket")?;
        let addr = front.local_addr()?;
        // The wake-up pair: the handle's socket pokes the thread's control socket; each is
        // connected to the other so nothing else can reach the control socket.
        let loopback = SocketAddr::new(
            match addr.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            },
            0,
        );
        let control = UdpSocket::bind(loopback).context("relay control socket")?;
        let wake = UdpSocket::bind(loopback).context("relay wake socket")?;
        control.connect(wake.local_addr()?)?;
        wake.connect(control.local_addr()?)?;
        control.set_nonblocking(true)?;
        wake.set_nonblocking(true)?;

        let shared = Arc::new(Shared::default());
        let w = worker::Worker::new(cfg, front, control, Arc::clone(&shared))?;
        let thread = std::thread::Builder::new()
            .name("relay".into())
            .spawn(move || w.run())
            .context("spawn relay thread")?;
        Ok(RelayHandle {
            addr,
            shared,
            wake,
            thread: Some(thread),
        })
    }
}

/// How long [`RelayHandle::counters`] waits for the thread before returning the last snapshot.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(2);

/// A running relay. Dropping it stops the thread (use [`shutdown`](Self::shutdown) to get the
/// final counters and any error).
#[derive(Debug)]
pub struct RelayHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    wake: UdpSocket,
    thread: Option<JoinHandle<()>>,
}

impl RelayHandle {
    /// The front-door address clients send to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn poke(&self) {
        // Best effort: the thread also checks the flags at least every IDLE_WAIT.
        let _ = self.wake.send(&[0]);
    }

    /// A consistent snapshot of every counter, taken by the relay thread now (or the final one
    /// if the thread has stopped).
    pub fn counters(&self) -> RelayCounters {
        let want = self.shared.requested.fetch_add(1, Ordering::SeqCst) + 1;
        self.poke();
        let guard = self.shared.lock();
        let (guard, _) = self
            .shared
            .cond
            .wait_timeout_while(guard, SNAPSHOT_WAIT, |p| p.generation < want && !p.finished)
            .unwrap_or_else(|e| e.into_inner());
        guard.counters.clone()
    }

    /// The summed route queue peaks (bytes and datagrams, both directions of every route).
    pub fn route_peaks(&self) -> RoutePeaks {
        self.counters().route_peaks
    }

    /// Dropped / offered over both directions of every route so far.
    pub fn realized_loss(&self) -> f64 {
        self.counters().realized_loss
    }

    /// Stops the thread, joins it and returns the final counters (copies still queued are
    /// discarded and show as `queue_datagrams`), or the error that stopped the thread early.
    pub fn shutdown(mut self) -> anyhow::Result<RelayCounters> {
        self.stop_and_join()?;
        let p = self.shared.lock();
        match &p.error {
            Some(e) => Err(anyhow!("relay thread failed: {e}")),
            None => Ok(p.counters.clone()),
        }
    }

    fn stop_and_join(&mut self) -> anyhow::Result<()> {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.poke();
        if let Some(t) = self.thread.take() {
            t.join().map_err(|_| anyhow!("relay thread panicked"))?;
        }
        Ok(())
    }
}

impl Drop for RelayHandle {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}
