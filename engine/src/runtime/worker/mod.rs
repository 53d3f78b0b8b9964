//! The worker loop shared by every server kind, and the machinery that starts and stops
//! workers.
//!
//! A worker drives one [`Service`] (raw UDP handler, RUDP endpoint, ...) over one backend: poll
//! (submit sends + wait), hand each received datagram to the service, fire the tick, let the
//! service produce more output, repeat. The service never sees the backend, only a
//! [`UdpContext`] to queue datagrams in the worker's send batch.
//!
//! Rooms, each using only those listed before it:
//! - `context`: [`UdpContext`] and the [`Service`] trait (what a service sees);
//! - `pace`: the worker's settings, the tick's fixed grid, the balanced strategy's idle gap;
//! - `port`: the backend and send batch (the send pump) and the counters health reads;
//! - `conditioning`: the link conditioner's hooks in the loop;
//! - `run`: the loop itself, the receive pump, the tick, the stop sequence;
//! - `set`: binding the sockets, spawning, stopping and joining the workers ([`WorkerSet`]).

mod conditioning;
mod context;
mod pace;
mod port;
mod run;
mod set;

pub(crate) use context::Service;
pub use context::UdpContext;
pub(crate) use set::WorkerSet;
