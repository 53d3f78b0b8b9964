//! The client plugin: one [`Client`] as a resource, stepped by the app's schedules.

use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};

use bevy_app::{App, Plugin, PostUpdate, PreUpdate};
use bevy_ecs::prelude::*;
use ricochet::{
    Bytes, Client, ClientConfig, ClientError, ClientEvent, CloseReason, ConnectToken, SessionStats,
};

use crate::RicochetSystems;

/// Steps a [`RicochetClient`] resource once per frame, while one exists.
///
/// In [`PreUpdate`] ([`RicochetSystems::Receive`]) it receives, runs the protocol's timers and
/// writes what happened as [`ClientReceived`], [`ClientConnection`] and
/// [`ClientTransportError`] messages, so the game's `Update` systems see this frame's arrivals.
/// In [`PostUpdate`] ([`RicochetSystems::Send`]) it sends what those systems queued with
/// [`RicochetClient::send`], all in one batch (one system call, not one per message), in the
/// frame that queued it rather than the next. That second step also sends the
/// acknowledgements for anything that arrived meanwhile; events it finds stay queued for the
/// next `PreUpdate`.
///
/// The client's socket never blocks the frame. A frame rate far below the protocol's timers
/// (a few frames per second) delays acknowledgements and retransmissions with it.
#[derive(Debug, Default, Clone, Copy)]
pub struct RicochetClientPlugin;

impl Plugin for RicochetClientPlugin {
    fn build(&self, app: &mut App) {
        app.add_message::<ClientReceived>()
            .add_message::<ClientConnection>()
            .add_message::<ClientTransportError>()
            .add_systems(
                PreUpdate,
                receive
                    .in_set(RicochetSystems::Receive)
                    .run_if(resource_exists::<RicochetClient>),
            )
            .add_systems(
                PostUpdate,
                send.in_set(RicochetSystems::Send)
                    .run_if(resource_exists::<RicochetClient>),
            );
    }
}

/// A connection to a Ricochet server, as a resource.
///
/// Insert one to connect (see [`RicochetClient::connect`]); [`RicochetClientPlugin`] then
/// drives it. Remove it to drop the connection: call [`RicochetClient::close`] first and wait
/// for [`ClientConnection::Disconnected`] so that the server learns it at once rather than
/// at its idle timeout.
#[derive(Resource)]
pub struct RicochetClient {
    // A `Client` may move between threads but not be shared by them; a resource must be both.
    // `&mut self` reaches it without locking (`Mutex::get_mut`); only `stats` locks.
    client: Mutex<Client>,
    connected: bool,
}

impl std::fmt::Debug for RicochetClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RicochetClient")
            .field("connected", &self.connected)
            .finish_non_exhaustive()
    }
}

impl From<Client> for RicochetClient {
    fn from(client: Client) -> Self {
        RicochetClient {
            connected: client.is_connected(),
            client: Mutex::new(client),
        }
    }
}

impl RicochetClient {
    /// Start connecting with the `token` the game's backend issued; returns at once, and a
    /// [`ClientConnection`] message tells how it went. Messages may be sent right away: they
    /// leave once the handshake completes. See [`Client::connect`].
    pub fn connect(token: &ConnectToken, config: ClientConfig) -> Result<Self, ClientError> {
        Client::connect(token, config).map(Self::from)
    }

    /// Start connecting to an insecure server (no token, no packet protection: LAN play and
    /// local tests). See [`Client::connect_insecure`].
    pub fn connect_insecure(server: SocketAddr, config: ClientConfig) -> Result<Self, ClientError> {
        Client::connect_insecure(server, config).map(Self::from)
    }

    /// Queue a message on `channel`; it leaves in this frame's [`PostUpdate`].
    pub fn send(&mut self, channel: u8, data: impl Into<Bytes>) -> Result<(), ClientError> {
        self.client_mut().send(channel, data)
    }

    /// Close the connection gracefully (see [`Client::close`]): keep the resource until
    /// [`ClientConnection::Disconnected`] arrives.
    pub fn close(&mut self) {
        self.client_mut().close();
    }

    /// True while connected, as of this frame's [`PreUpdate`].
    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// The session's counters and path estimates; `None` once the session is gone.
    pub fn stats(&self) -> Option<SessionStats> {
        // Uncontended: the only other way in is `&mut self`.
        self.client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .stats()
    }

    /// The client itself, for everything else it offers.
    pub fn client_mut(&mut self) -> &mut Client {
        self.client
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Take the client out of the resource.
    pub fn into_inner(self) -> Client {
        self.client
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A message from the server arrived.
#[derive(Message, Debug, Clone, PartialEq, Eq)]
pub struct ClientReceived {
    /// The channel it came on.
    pub channel: u8,
    /// The message.
    pub data: Bytes,
}

/// The connection's state changed.
#[derive(Message, Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientConnection {
    /// The handshake completed.
    Connected,
    /// The connection ended, or the attempt failed (refused, timed out): see `reason`.
    Disconnected {
        /// Why.
        reason: CloseReason,
        /// True when the server decided it.
        by_peer: bool,
        /// The server application's message with a refusal ([`CloseReason::Rejected`]);
        /// empty otherwise.
        message: Bytes,
    },
}

/// The client's socket failed in a frame (the failed step is retried the next frame).
#[derive(Message, Debug)]
pub struct ClientTransportError {
    /// What failed.
    pub error: ClientError,
}

/// `PreUpdate`: receive, run timers, answer; then tell the game what happened.
fn receive(
    mut client: ResMut<RicochetClient>,
    mut received: MessageWriter<ClientReceived>,
    mut connection: MessageWriter<ClientConnection>,
    mut errors: MessageWriter<ClientTransportError>,
) {
    let this = &mut *client;
    let c = this
        .client
        .get_mut()
        .unwrap_or_else(PoisonError::into_inner);
    if let Err(error) = c.update().map(drop) {
        errors.write(ClientTransportError { error });
    }
    // Also after a failed step: what was queued before it is still news.
    while let Some(event) = c.poll_event() {
        match event {
            ClientEvent::Message { channel, data } => {
                received.write(ClientReceived { channel, data });
            }
            ClientEvent::Connected => {
                connection.write(ClientConnection::Connected);
            }
            ClientEvent::Disconnected { reason, by_peer } => {
                connection.write(ClientConnection::Disconnected {
                    reason,
                    by_peer,
                    message: c.refusal_message(),
                });
            }
            // A kind of event this version does not know: nothing to tell.
            _ => {}
        }
    }
    this.connected = c.is_connected();
}

/// `PostUpdate`: send what the frame queued. Events found here stay queued for `PreUpdate`.
fn send(mut client: ResMut<RicochetClient>, mut errors: MessageWriter<ClientTransportError>) {
    if let Err(error) = client.client_mut().update().map(drop) {
        errors.write(ClientTransportError { error });
    }
}
