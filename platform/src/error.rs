//! The platform layer's error type.

use std::io;

/// Errors from socket setup and datagram I/O.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A payload larger than UDP allows for the destination's address family. Refused before
    /// any system call; the socket and the batch stay usable.
    #[error("UDP payload of {len} bytes exceeds the protocol maximum of {limit} bytes")]
    PayloadTooLarge {
        /// Bytes the caller tried to send.
        len: usize,
        /// The limit: 65,507 (IPv4) or 65,527 (IPv6).
        limit: usize,
    },
    /// A GSO send with more segments or bytes than one system call may carry.
    #[error(
        "GSO send of {segments} segments / {bytes} bytes exceeds {max_segments} segments / {max_bytes} bytes"
    )]
    TooManySegments {
        /// Segments requested.
        segments: usize,
        /// Bytes requested.
        bytes: usize,
        /// Most segments allowed.
        max_segments: usize,
        /// Most bytes allowed.
        max_bytes: usize,
    },
    /// The send batch holds as many entries as it may; submit it first.
    #[error("send batch is full ({capacity} entries); submit it before queueing more")]
    BatchFull {
        /// The batch's capacity in entries.
        capacity: usize,
    },
    /// The requested backend does not exist on this operating system or kernel.
    #[error("backend {backend} is unavailable: {reason}")]
    BackendUnavailable {
        /// Backend name.
        backend: &'static str,
        /// Why, and how to fix it where that is known.
        reason: String,
    },
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// An operating-system error, with what was being done.
    #[error("{op}: {source}")]
    Io {
        /// The operation that failed.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Wrap an OS error with the operation that produced it.
    pub fn io(op: &'static str, source: io::Error) -> Self {
        Error::Io { op, source }
    }
}

/// Result alias for the platform layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;
