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
//! - `shared`: one socket served by N unpinned threads: the baseline `per-core` is measured
//!   against, not a production choice.

pub(crate) mod conditioner;
mod config;
mod counters;
mod error;
mod ops;
pub(crate) mod placement;
mod rtt;
mod server;
mod session;
mod timer;
mod udp;
mod worker;

pub use conditioner::{GilbertElliott, Impairment, LinkConditioner, RateLimit};
pub use config::{CorePinning, IdleStrategy, IoModel, UdpServerConfig};
pub use counters::WorkerCounters;
pub use error::RuntimeError;
pub use ops::{Health, WorkerHealth};
pub use rtt::RttPercentiles;
pub use server::{Capacity, Handler, Server, ServerConfig, ServerContext};
pub use session::SessionId;
pub use udp::{DatagramHandler, UdpContext, UdpServer};

/// A protocol endpoint seeded with `seed` when one is configured (reproducible tests), else
/// with 32 bytes from the operating system's random source: the connection ids, nonces, cookie
/// keys and the server random each session's packet keys are bound to are then unpredictable,
/// and unique across servers and restarts ([`ricochet_proto::Endpoint::from_seed`]).
pub(crate) fn new_endpoint(
    cfg: ricochet_proto::EndpointConfig,
    now: std::time::Instant,
    seed: Option<u64>,
) -> ricochet_proto::Endpoint {
    match seed {
        Some(s) => ricochet_proto::Endpoint::new(cfg, now, s),
        None => ricochet_proto::Endpoint::from_seed(cfg, now, os_seed()),
    }
}

/// 32 bytes from the operating system's random source.
fn os_seed() -> [u8; 32] {
    use rand::TryRngCore;
    let mut seed = [0u8; 32];
    if rand::rngs::OsRng.try_fill_bytes(&mut seed).is_err() {
        // The thread RNG is seeded from the same source (and panics if it cannot be read).
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut seed);
    }
    seed
}
