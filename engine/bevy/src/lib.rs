//! Bevy plugins for Ricochet: a game client or a game server in a Bevy `App`.
//!
//! - [`RicochetClientPlugin`] drives a [`RicochetClient`] resource (one [`ricochet::Client`])
//!   from the app's schedules: what arrived is read in [`PreUpdate`](bevy_app::PreUpdate) and
//!   written as the messages [`ClientReceived`], [`ClientConnection`] and
//!   [`ClientTransportError`]; what the game's systems sent during the frame leaves in
//!   [`PostUpdate`](bevy_app::PostUpdate).
//! - [`RicochetServerPlugin`] bridges a [`RicochetServer`] resource to a [`ricochet::Server`]
//!   whose workers run on their own threads: their events come over a bounded queue and are
//!   written in `PreUpdate` as [`ServerReceived`], [`ServerConnection`] and
//!   [`ServerTransportError`]; [`RicochetServer::send`] hands a message to the owning worker.
//!
//! Nothing here panics on network input or transport failure: failures become messages.
//! Like every Bevy message, these are kept for two frames: a system that reads them must run
//! at least every other frame (not behind a run condition that pauses it), or what it misses
//! is gone, reliable channel or not.
//! Both plugins only act while their resource exists, so a game connects (or starts its
//! server) whenever it likes by inserting the resource, and disconnects by removing it.
//!
//! ```no_run
//! use bevy_app::prelude::*;
//! use bevy_ecs::prelude::*;
//! use ricochet::{TokenIssuer, ClientConfig, TokenKey};
//! use ricochet_bevy::{ClientReceived, RicochetClient, RicochetClientPlugin};
//!
//! fn echo(mut received: MessageReader<ClientReceived>, mut client: ResMut<RicochetClient>) {
//!     for m in received.read() {
//!         let _ = client.send(m.channel, m.data.clone());
//!     }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // In production the game's backend issues the token.
//! let issuer = TokenIssuer::new(TokenKey::from_bytes([7; 32]), 0x5249_4343);
//! let token = issuer.issue(1, &["127.0.0.1:7777".parse()?])?;
//! App::new()
//!     .add_plugins(RicochetClientPlugin)
//!     .insert_resource(RicochetClient::connect(&token, ClientConfig::new())?)
//!     .add_systems(Update, echo)
//!     .run();
//! # Ok(())
//! # }
//! ```
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod client;
mod server;

use bevy_ecs::schedule::SystemSet;

pub use client::{
    ClientConnection, ClientReceived, ClientTransportError, RicochetClient, RicochetClientPlugin,
};
pub use server::{
    RicochetServer, RicochetServerPlugin, ServerConnection, ServerQueues, ServerReceived,
    ServerTransportError, DEFAULT_TICK,
};

/// The plugins' systems, for ordering a game's own systems against them.
///
/// Both plugins put their receiving systems in [`RicochetSystems::Receive`] (in
/// [`PreUpdate`](bevy_app::PreUpdate)); the client plugin puts its sending system in
/// [`RicochetSystems::Send`] (in [`PostUpdate`](bevy_app::PostUpdate)). A system that sends
/// from `PostUpdate` should run `.before(RicochetSystems::Send)`, or its messages wait a frame.
#[derive(SystemSet, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RicochetSystems {
    /// Take what arrived and write it as messages.
    Receive,
    /// Send what the frame queued.
    Send,
}
