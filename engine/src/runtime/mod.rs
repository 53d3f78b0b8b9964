//! The thread-per-core runtime: workers, timer wheel, IO models and handler APIs.
//!
//! A worker owns a backend (one socket), a send batch, a timer wheel and its handler. Each loop
//! turn it makes one backend poll that submits the queued sends and waits for datagrams (or the
//! next timer, or a wake-up), hands every received datagram to the handler, and fires due timers.
//! Replies queue in the send batch and go out with the next poll: one submission per turn.
//!
//! Two [`IoModel`]s run the same worker loop:
//! - `per-core`: one worker per core, each with its own `SO_REUSEPORT` socket (pinned as
//!   [`CorePinning`] says);
//! - `shared`: one socket served by N unpinned threads (the baseline it is measured against).

mod config;
mod counters;
mod error;
pub(crate) mod placement;
mod rtt;
mod rudp;
pub mod timer;
mod udp;
mod worker;

pub use config::{CorePinning, IdleStrategy, IoModel, UdpServerConfig};
pub use counters::WorkerCounters;
pub use error::RuntimeError;
pub use rtt::RttPercentiles;
pub use rudp::{Handler, Server, ServerConfig, ServerContext, SessionId};
pub use timer::{TimerId, TimerWheel};
pub use udp::{DatagramHandler, UdpContext, UdpServer};
