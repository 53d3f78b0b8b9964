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
    /// An operating-system error, with what was being done (and, when a descriptor limit
    /// refused it, which limit to raise).
    #[error("{op}: {source}{}", limit_hint(source))]
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

/// Names the limit behind a refusal for want of descriptors: every socket, ring, poller and
/// eventfd takes one, and many systems start processes at a soft limit of 1,024, below a
/// thousand clients plus the rest of the process.
fn limit_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EMFILE) => {
            " (the process holds as many descriptors as its limit allows: RLIMIT_NOFILE, which \
             `ulimit -n` raises up to the hard limit)"
        }
        Some(libc::ENFILE) => " (the system's table of open files is full)",
        _ => "",
    }
}

/// Result alias for the platform layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::Error;
    use std::io;

    #[test]
    fn an_error_refused_by_a_descriptor_limit_names_the_limit() {
        let e = Error::io("socket", io::Error::from_raw_os_error(libc::EMFILE));
        assert!(e.to_string().contains("RLIMIT_NOFILE"), "{e}");
        let e = Error::io("eventfd", io::Error::from_raw_os_error(libc::ENFILE));
        assert!(e.to_string().contains("system"), "{e}");
        let e = Error::io("socket", io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!(
            e.to_string(),
            format!("socket: {}", io::Error::from_raw_os_error(libc::EACCES))
        );
    }
}
