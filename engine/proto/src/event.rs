//! What the core hands its driver: [`Event`]s for the application, [`Transmit`]s for the
//! socket, and why a send was refused ([`SendError`]).

use std::net::SocketAddr;

use bytes::Bytes;

use crate::admission::Peer;
use crate::wire::CloseReason;

/// What the application learns from a connection. Deliberately exhaustive: an embedder must
/// handle every event, and a new one is a breaking change it should see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Server with [`ListenConfig::accept_hook`](crate::ListenConfig::accept_hook): a client passed
    /// every check and waits for the application's [`Endpoint::accept`](crate::Endpoint::accept) or
    /// [`Endpoint::refuse`](crate::Endpoint::refuse).
    Incoming(Peer),
    /// The handshake completed.
    Connected,
    /// A complete message arrived.
    Message {
        /// Channel id.
        channel: u8,
        /// The message. Through an [`Endpoint`](crate::Endpoint), a small one (up to 512 B)
        /// shares a 4 KiB buffer with the messages received around it, which the endpoint
        /// reuses once they are all dropped: keeping it keeps that buffer (copy it out to
        /// keep many small messages for long).
        data: Bytes,
    },
    /// The connection ended; no more events follow.
    Closed {
        /// Why.
        reason: CloseReason,
        /// True when the peer (or the server, for a refused handshake) decided it.
        by_peer: bool,
        /// The server application's message with a refusal ([`CloseReason::Rejected`]);
        /// empty otherwise.
        message: Bytes,
    },
}

/// One datagram written by `poll_transmit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Where to send it.
    pub destination: SocketAddr,
    /// Bytes written at the start of the caller's buffer.
    pub size: usize,
}

/// Why `send` refused a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// No such channel.
    #[error("unknown channel {0}")]
    UnknownChannel(u8),
    /// Message larger than [`Config::max_message_size`](crate::Config::max_message_size).
    #[error("message of {0} bytes exceeds the maximum message size")]
    TooLarge(usize),
    /// The send queue is full ([`Config::send_queue_limit`](crate::Config::send_queue_limit)).
    #[error("send queue full")]
    QueueFull,
    /// The connection is closing or closed.
    #[error("connection closed")]
    Closed,
    /// No connection with this handle.
    #[error("unknown connection")]
    UnknownConnection,
    /// A deadline ([`crate::SendOptions::deadline`]) on a reliable channel: reliable messages
    /// are never dropped.
    #[error("channel {0} is reliable: a deadline is for unreliable messages")]
    DeadlineOnReliable(u8),
}
