//! Ricochet: a thread-per-core UDP and reliable-UDP transport for game servers.
//!
//! Layers, bottom up:
//!
//! - [`proto`] (the `ricochet-proto` crate): the sans-IO core: packet layout, the RUDP
//!   connection and endpoint (handshake, ARQ, congestion control, channels, fragmentation) and
//!   FEC. No sockets, no threads, no clock reads: time is an argument.
//! - [`runtime`]: the thread-per-core engine: workers, timer wheel, IO models, handlers, the
//!   raw-UDP and RUDP servers.
//! - [`client`]: the game client, driven from a game loop; [`ClientSet`] drives many clients
//!   (a load tester, a bot farm) from one thread with one wait.
//! - [`tokens`]: what the game's backend does to let a player in: a [`TokenIssuer`] issues a
//!   [`ConnectToken`] sealed with the [`TokenKey`] it shares with its servers.
//!
//! Names: the runtime API says *session* for one client's stay on a server ([`SessionId`],
//! [`SessionStats`]); `ricochet_proto::Connection` (with its `ConnectionHandle` and
//! `ConnectionStats`) is the protocol object that carries one session.
//!
//! Cargo features: `fec` (default) compiles in forward error correction; without it
//! (`default-features = false`) sessions send no FEC whatever their [`Profile`], and still
//! take the data out of a peer's FEC packets (see `ricochet-proto`'s features).
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

#[deprecated(note = "renamed `ricochet::tokens`; use `ricochet::TokenIssuer`")]
pub mod backend;
pub mod client;
mod profile;
pub mod runtime;
mod stats;
pub mod tokens;

pub use ricochet_platform as platform;

/// The byte buffer every message travels in (from the `bytes` crate, re-exported so that a
/// handler's signature needs no dependency of its own, and no version to keep in step).
pub use bytes::Bytes;
pub use ricochet_proto as proto;

pub use client::{
    Client, ClientConfig, ClientError, ClientEvent, ClientSet, ClientSetError, ConnectLimit,
};
pub use profile::Profile;
pub use ricochet_platform::BackendKind;
pub use ricochet_proto::token::{ConnectToken, TokenKey};
pub use ricochet_proto::{
    ChannelKind, CloseReason, Config, CongestionController, Lane, LaneStats, Peer, Refusal,
    SendError, SendOptions, UnsentDrops,
};
pub use runtime::{
    CorePinning, GilbertElliott, Handler, IdleStrategy, Impairment, IoModel, LinkConditioner,
    RateLimit, RuntimeError, Server, ServerConfig, ServerContext, SessionId,
};
pub use stats::{RecoveryStats, SessionStats};
pub use tokens::TokenIssuer;
