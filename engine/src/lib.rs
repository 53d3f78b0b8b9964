//! Ricochet: a thread-per-core UDP and reliable-UDP transport for game servers.
//!
//! Layers, bottom up (see `ARCHITECTURE.md` in the repository's shared notes):
//!
//! - [`wire`]: byte layout of every packet; decoding never panics.
//! - [`fec`]: Reed-Solomon forward error correction below ARQ.
//! - [`proto`]: the sans-IO RUDP connection and endpoint (handshake, ARQ, congestion control,
//!   channels, fragmentation). No sockets, no clock reads: time is an argument.
//! - [`sim`]: a deterministic network (virtual clock, seeded impairments) for tests and the
//!   benchmark relay's impairment model.
//! - [`runtime`]: the thread-per-core engine: workers, timer wheel, IO models, handlers, the
//!   raw-UDP and RUDP servers.
//! - [`client`]: the game client, driven from a game loop; [`ClientSet`] drives many clients
//!   (a load tester, a bot farm) from one thread with one wait.
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

pub mod client;
pub mod fec;
pub mod proto;
pub mod runtime;
pub mod sim;
pub mod wire;

pub use ricochet_platform as platform;

pub use client::{
    Client, ClientConfig, ClientError, ClientEvent, ClientSet, ClientSetError, ConnectLimit,
};
pub use proto::{ChannelKind, CloseReason, Config};
pub use runtime::{
    Handler, IoModel, RudpServer, RudpServerConfig, ServerContext, SessionId, UdpServerConfig,
};
