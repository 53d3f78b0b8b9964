//! The server plugin: a [`Server`] whose workers report to the app over bounded queues.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bevy_app::{App, Plugin, PreUpdate};
use bevy_ecs::prelude::*;
use ricochet::runtime::WorkerCounters;
use ricochet::{
    Bytes, CloseReason, Handler, Peer, RuntimeError, SendError, Server, ServerConfig,
    ServerContext, SessionId,
};

use crate::RicochetSystems;

/// The tick the server's workers get when its config sets none: how often an idle worker
/// looks for what the app asked it to send (a busy one also looks after every message).
pub const DEFAULT_TICK: Duration = Duration::from_millis(1);

/// Writes what a [`RicochetServer`]'s workers report as messages, once per frame, while the
/// resource exists.
///
/// The server's workers run the transport on their own threads, whatever the app's frame
/// rate: they receive, acknowledge, retransmit and send without waiting for a frame. In
/// [`PreUpdate`] ([`RicochetSystems::Receive`]) this plugin takes the events they queued
/// (at most [`ServerQueues::events`] per frame) and writes them as [`ServerReceived`],
/// [`ServerConnection`] and [`ServerTransportError`] messages, so the game's `Update` systems
/// see this frame's arrivals. A message sent with [`RicochetServer::send`] goes straight to
/// the queue of the worker that owns the session, which sends it after its current message or
/// at its next tick, so there is nothing to flush at the end of the frame.
#[derive(Debug, Default, Clone, Copy)]
pub struct RicochetServerPlugin;

impl Plugin for RicochetServerPlugin {
    fn build(&self, app: &mut App) {
        app.add_message::<ServerReceived>()
            .add_message::<ServerConnection>()
            .add_message::<ServerTransportError>()
            .add_systems(
                PreUpdate,
                receive
                    .in_set(RicochetSystems::Receive)
                    .run_if(resource_exists::<RicochetServer>),
            );
    }
}

/// The sizes of the queues between a [`RicochetServer`]'s workers and the app.
///
/// A worker whose events find the event queue full waits until the app takes some: no event
/// is lost, and while the app falls behind, that worker stops reading its socket (its
/// clients' reliable data waits in their send queues and is retransmitted). A
/// [`RicochetServer::send`] that finds its worker's queue full fails at once with
/// [`SendError::QueueFull`]: the app never waits for a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerQueues {
    /// Events all the workers queue for the app at most; also the most the app takes per
    /// frame. Default 16,384.
    pub events: usize,
    /// Messages the app queues for one worker at most. Default 4,096.
    pub sends: usize,
    /// Message bytes all the workers queue for the app at most (a larger message still goes
    /// into an empty queue): past it a worker waits as for a full event queue. Default 64 MiB.
    pub bytes: usize,
}

impl Default for ServerQueues {
    fn default() -> Self {
        ServerQueues {
            events: 16_384,
            sends: 4_096,
            bytes: 64 << 20,
        }
    }
}

impl ServerQueues {
    /// The default sizes.
    pub fn new() -> Self {
        Self::default()
    }

    /// Set [`ServerQueues::events`].
    pub fn events(mut self, events: usize) -> Self {
        self.events = events;
        self
    }

    /// Set [`ServerQueues::sends`].
    pub fn sends(mut self, sends: usize) -> Self {
        self.sends = sends;
        self
    }

    /// Set [`ServerQueues::bytes`].
    pub fn bytes(mut self, bytes: usize) -> Self {
        self.bytes = bytes;
        self
    }
}

/// A running Ricochet server, as a resource: what its workers report reaches the app through
/// [`RicochetServerPlugin`], and [`RicochetServer::send`] reaches its sessions.
///
/// Every worker's sessions come through the same messages, so one Bevy world sees every
/// player whatever the number of workers. Removing (dropping) the resource shuts the server
/// down, telling every client; [`RicochetServer::shutdown`] does the same and returns the
/// workers' counters.
#[derive(Resource)]
pub struct RicochetServer {
    // Declared before `server`, so dropped first: a worker waiting on a full queue then stops
    // waiting, and the server's shutdown (which joins the workers) cannot wait for it.
    events: Mutex<Receiver<Inbound>>,
    gate: GateOwner,
    server: Server,
    sends: Vec<SyncSender<Outbound>>,
    max_events: usize,
    channels: usize,
    max_message_size: usize,
    stopped_reported: bool,
}

impl std::fmt::Debug for RicochetServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RicochetServer")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl RicochetServer {
    /// Start a server with `config` and the default [`ServerQueues`]. Without a tick of its
    /// own the config gets [`DEFAULT_TICK`]. See [`Server::start`] for the errors.
    pub fn start(config: ServerConfig) -> Result<Self, RuntimeError> {
        Self::start_with(config, ServerQueues::default())
    }

    /// [`RicochetServer::start`] with queues of the given sizes (each at least 1).
    pub fn start_with(
        mut config: ServerConfig,
        queues: ServerQueues,
    ) -> Result<Self, RuntimeError> {
        if queues.events == 0 || queues.sends == 0 || queues.bytes == 0 {
            return Err(RuntimeError::Config(format!(
                "ServerQueues {queues:?}: each queue holds at least one entry"
            )));
        }
        // The workers look for the app's sends at their tick (and after each message).
        config.udp.tick.get_or_insert(DEFAULT_TICK);
        let channels = config.endpoint.connection.channels.len();
        let max_message_size = config.endpoint.connection.max_message_size;
        let (events_tx, events) = mpsc::sync_channel(queues.events);
        let gate = Arc::new(Gate {
            bytes: Mutex::new(0),
            room: Condvar::new(),
            cap: queues.bytes,
            closed: AtomicBool::new(false),
        });
        let mut sends = Vec::new();
        let server = Server::start(config, |worker| {
            let (tx, rx) = mpsc::sync_channel(queues.sends);
            sends.push((worker, tx));
            Bridge {
                gate: gate.clone(),
                events: events_tx.clone(),
                sends: rx,
            }
        })?;
        // Indexed by the worker a `SessionId` names.
        sends.sort_by_key(|&(worker, _)| worker);
        let sends = sends.into_iter().map(|(_, tx)| tx).collect();
        Ok(RicochetServer {
            events: Mutex::new(events),
            gate: GateOwner(gate),
            server,
            sends,
            max_events: queues.events,
            channels,
            max_message_size,
            stopped_reported: false,
        })
    }

    /// Queue `data` for `session` on `channel`; the worker that owns the session sends it.
    ///
    /// Fails at once with [`SendError::UnknownChannel`] or [`SendError::TooLarge`] for a
    /// message no session can take, [`SendError::QueueFull`] when that worker's queue
    /// ([`ServerQueues::sends`]) is full, and [`SendError::UnknownConnection`] when the worker
    /// has stopped. What fails later, in the worker (the session has gone, its own send queue
    /// is full), comes back as [`ServerTransportError::SendFailed`].
    pub fn send(
        &self,
        session: SessionId,
        channel: u8,
        data: impl Into<Bytes>,
    ) -> Result<(), SendError> {
        let data = data.into();
        if usize::from(channel) >= self.channels {
            return Err(SendError::UnknownChannel(channel));
        }
        if data.len() > self.max_message_size {
            return Err(SendError::TooLarge(data.len()));
        }
        self.post(
            session,
            Outbound::Send {
                session,
                channel,
                data,
            },
        )
    }

    /// Close `session` gracefully; its [`ServerConnection::Disconnected`] follows. Fails like
    /// [`RicochetServer::send`] when the worker's queue is full or the worker has stopped.
    pub fn close(&self, session: SessionId) -> Result<(), SendError> {
        self.post(session, Outbound::Close { session })
    }

    fn post(&self, session: SessionId, command: Outbound) -> Result<(), SendError> {
        let queue = self
            .sends
            .get(session.worker as usize)
            .ok_or(SendError::UnknownConnection)?;
        queue.try_send(command).map_err(|e| match e {
            TrySendError::Full(_) => SendError::QueueFull,
            TrySendError::Disconnected(_) => SendError::UnknownConnection,
        })
    }

    /// The address the server is bound to (the port resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// The server itself, for its counters and state (sessions, RTT, workers).
    pub fn server(&self) -> &Server {
        &self.server
    }

    /// Stop the server, telling every client, and return the workers' counters. Events the
    /// app has not taken are dropped.
    pub fn shutdown(self) -> Result<Vec<WorkerCounters>, RuntimeError> {
        let RicochetServer {
            events,
            gate,
            server,
            ..
        } = self;
        drop(events);
        drop(gate);
        server.shutdown()
    }
}

/// A message from a client arrived.
#[derive(Message, Debug, Clone, PartialEq, Eq)]
pub struct ServerReceived {
    /// Who sent it.
    pub session: SessionId,
    /// The channel it came on.
    pub channel: u8,
    /// The message.
    pub data: Bytes,
}

/// A session began or ended.
#[derive(Message, Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerConnection {
    /// A client completed the handshake.
    Connected {
        /// The new session.
        session: SessionId,
        /// Who it is: address, client id and the token's user data.
        peer: Peer,
    },
    /// A session ended.
    Disconnected {
        /// The session.
        session: SessionId,
        /// Why.
        reason: CloseReason,
        /// True when the client decided it.
        by_peer: bool,
    },
}

/// Something the app asked for failed in a worker, or a worker stopped.
#[derive(Message, Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerTransportError {
    /// A message queued with [`RicochetServer::send`] was refused by its session (gone,
    /// closing, or its send queue full).
    SendFailed {
        /// The session.
        session: SessionId,
        /// The channel.
        channel: u8,
        /// Why.
        error: SendError,
    },
    /// A worker has stopped: its sessions get no more answers (see [`Server::is_running`]).
    /// Reported once.
    Stopped,
}

/// What a worker tells the app.
enum Inbound {
    Connected(SessionId, Peer),
    Message(SessionId, u8, Bytes),
    Disconnected(SessionId, CloseReason, bool),
    SendFailed(SessionId, u8, SendError),
}

/// What the app asks a worker to do.
enum Outbound {
    Send {
        session: SessionId,
        channel: u8,
        data: Bytes,
    },
    Close {
        session: SessionId,
    },
}

/// The message bytes queued for the app, which the workers wait on past `cap`.
struct Gate {
    bytes: Mutex<usize>,
    /// Signalled when the app takes a message, or is gone.
    room: Condvar,
    cap: usize,
    /// Set when the app's end is dropped: nothing waits any more.
    closed: AtomicBool,
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, usize> {
        // Nothing panics while holding it; a poisoned one still holds a sound count.
        self.bytes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Count `size` bytes in, first waiting while they would overflow a non-empty queue.
    fn enter(&self, size: usize) {
        let mut bytes = self.lock();
        while *bytes > 0 && *bytes + size > self.cap && !self.closed.load(Ordering::Relaxed) {
            bytes = self
                .room
                .wait_timeout(bytes, Duration::from_millis(10))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        *bytes += size;
    }

    /// The app took `size` bytes.
    fn leave(&self, size: usize) {
        let mut bytes = self.lock();
        *bytes = bytes.saturating_sub(size);
        drop(bytes);
        self.room.notify_all();
    }
}

/// The app's hold on the [`Gate`]: dropping it releases every waiting worker.
struct GateOwner(Arc<Gate>);

impl Drop for GateOwner {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Relaxed);
        self.0.room.notify_all();
    }
}

/// The handler every worker runs: passes events to the app and the app's sends on.
struct Bridge {
    gate: Arc<Gate>,
    events: SyncSender<Inbound>,
    sends: Receiver<Outbound>,
}

impl Bridge {
    /// Queue `event` for the app, waiting while the queue is full. Once the app is gone
    /// (its end dropped) there is nobody to tell, and nothing waits.
    fn tell(&self, event: Inbound) {
        if let Inbound::Message(_, _, data) = &event {
            self.gate.enter(data.len());
        }
        let _ = self.events.send(event);
    }

    /// Carry out what the app queued for this worker.
    fn pump(&mut self, ctx: &mut ServerContext<'_>) {
        loop {
            match self.sends.try_recv() {
                Ok(Outbound::Send {
                    session,
                    channel,
                    data,
                }) => {
                    if let Err(error) = ctx.send(session, channel, data) {
                        self.tell(Inbound::SendFailed(session, channel, error));
                    }
                }
                Ok(Outbound::Close { session }) => ctx.close(session),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return,
            }
        }
    }
}

impl Handler for Bridge {
    fn on_connect(&mut self, ctx: &mut ServerContext<'_>, session: SessionId, peer: &Peer) {
        self.tell(Inbound::Connected(session, peer.clone()));
        self.pump(ctx);
    }

    fn on_message(
        &mut self,
        ctx: &mut ServerContext<'_>,
        session: SessionId,
        channel: u8,
        data: Bytes,
    ) {
        self.tell(Inbound::Message(session, channel, data));
        // Replies the app queued meanwhile leave with this turn's sends.
        self.pump(ctx);
    }

    fn on_disconnect(
        &mut self,
        ctx: &mut ServerContext<'_>,
        session: SessionId,
        reason: CloseReason,
        by_peer: bool,
    ) {
        self.tell(Inbound::Disconnected(session, reason, by_peer));
        self.pump(ctx);
    }

    fn on_tick(&mut self, ctx: &mut ServerContext<'_>) {
        self.pump(ctx);
    }
}

/// `PreUpdate`: write what the workers reported as messages.
fn receive(
    mut server: ResMut<RicochetServer>,
    mut received: MessageWriter<ServerReceived>,
    mut connection: MessageWriter<ServerConnection>,
    mut errors: MessageWriter<ServerTransportError>,
) {
    let this = &mut *server;
    let events = this
        .events
        .get_mut()
        .unwrap_or_else(PoisonError::into_inner);
    // At most a queue's worth per frame: workers refill it as it empties, and the frame must
    // end.
    for _ in 0..this.max_events {
        let Ok(event) = events.try_recv() else {
            break;
        };
        match event {
            Inbound::Message(session, channel, data) => {
                this.gate.0.leave(data.len());
                received.write(ServerReceived {
                    session,
                    channel,
                    data,
                });
            }
            Inbound::Connected(session, peer) => {
                connection.write(ServerConnection::Connected { session, peer });
            }
            Inbound::Disconnected(session, reason, by_peer) => {
                connection.write(ServerConnection::Disconnected {
                    session,
                    reason,
                    by_peer,
                });
            }
            Inbound::SendFailed(session, channel, error) => {
                errors.write(ServerTransportError::SendFailed {
                    session,
                    channel,
                    error,
                });
            }
        }
    }
    if !this.stopped_reported && !this.server.is_running() {
        this.stopped_reported = true;
        errors.write(ServerTransportError::Stopped);
    }
}
