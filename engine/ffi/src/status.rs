//! Status codes, the error every export maps to one, the panic guard, and the small shared
//! C types (event kinds, session statistics).

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use ricochet::{ClientError, CloseReason, SendError, SessionStats};

/// What a call did: `RICOCHET_OK` (0) or why it failed. [`crate::ricochet_error_text`]
/// describes each; [`crate::ricochet_last_error`] gives the details of the last failure.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ricochet_status {
    /// Success.
    RICOCHET_OK = 0,
    /// A required pointer argument was null.
    RICOCHET_ERROR_NULL_POINTER = 1,
    /// The handle is null, of another kind, or was destroyed or stopped.
    RICOCHET_ERROR_INVALID_HANDLE = 2,
    /// The output buffer is too small; the size needed was written where the function says.
    RICOCHET_ERROR_BUFFER_TOO_SMALL = 3,
    /// The connection or session is closed: nothing more can be sent on it.
    RICOCHET_ERROR_CLOSED = 4,
    /// A configuration field is out of range or missing (see `ricochet_last_error`).
    RICOCHET_ERROR_INVALID_CONFIG = 5,
    /// An argument is invalid: an address that does not parse, a string not UTF-8, a length
    /// out of range.
    RICOCHET_ERROR_INVALID_ARGUMENT = 6,
    /// No such channel.
    RICOCHET_ERROR_UNKNOWN_CHANNEL = 7,
    /// The message is larger than the session's maximum message size.
    RICOCHET_ERROR_MESSAGE_TOO_LARGE = 8,
    /// The session's send queue is full: let it drain (update / poll), then send again.
    RICOCHET_ERROR_QUEUE_FULL = 9,
    /// The connect token is malformed, or could not be made (too many addresses, too much
    /// user data).
    RICOCHET_ERROR_TOKEN = 10,
    /// Socket setup or I/O failed.
    RICOCHET_ERROR_IO = 11,
    /// A panic inside the library was caught; the object it happened in may be unusable.
    RICOCHET_ERROR_PANIC = 12,
}

/// What kind of event a poll returned.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ricochet_event_kind {
    /// Nothing was waiting: the other fields are unset.
    RICOCHET_EVENT_NONE = 0,
    /// The handshake completed (client), or a client connected (server).
    RICOCHET_EVENT_CONNECTED = 1,
    /// A complete message arrived: `channel`, `len` bytes in the caller's buffer.
    RICOCHET_EVENT_MESSAGE = 2,
    /// The connection ended: `reason` (see `ricochet_close_reason_text`), `by_peer`.
    RICOCHET_EVENT_DISCONNECTED = 3,
}

/// A session's counters and path estimates at one moment.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ricochet_stats {
    /// Smoothed round-trip time, microseconds.
    pub rtt_us: u64,
    /// Smallest round-trip time seen, microseconds.
    pub min_rtt_us: u64,
    /// Current retransmission timeout, microseconds.
    pub rto_us: u64,
    /// Datagrams sent.
    pub packets_sent: u64,
    /// Datagrams received and accepted.
    pub packets_received: u64,
    /// UDP payload bytes sent.
    pub bytes_sent: u64,
    /// UDP payload bytes received.
    pub bytes_received: u64,
    /// Packets declared lost.
    pub packets_lost: u64,
    /// Reliable fragments sent again.
    pub retransmitted: u64,
    /// Messages delivered to the application.
    pub messages_delivered: u64,
    /// Datagrams forward error correction rebuilt.
    pub fec_recovered: u64,
    /// Congestion window, bytes.
    pub congestion_window: u64,
    /// Bytes in flight.
    pub bytes_in_flight: u64,
}

impl From<SessionStats> for ricochet_stats {
    fn from(s: SessionStats) -> Self {
        let us = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        ricochet_stats {
            rtt_us: us(s.rtt),
            min_rtt_us: us(s.min_rtt),
            rto_us: us(s.rto),
            packets_sent: s.packets_sent,
            packets_received: s.packets_received,
            bytes_sent: s.bytes_sent,
            bytes_received: s.bytes_received,
            packets_lost: s.packets_lost,
            retransmitted: s.retransmitted,
            messages_delivered: s.messages_delivered,
            fec_recovered: s.fec_recovered,
            congestion_window: s.congestion_window as u64,
            bytes_in_flight: s.bytes_in_flight as u64,
        }
    }
}

/// A failure: its status code and, for `ricochet_last_error`, what exactly went wrong.
#[derive(Debug)]
pub(crate) struct Error {
    pub status: ricochet_status,
    pub detail: String,
}

impl Error {
    pub fn new(status: ricochet_status, detail: impl Into<String>) -> Self {
        Error {
            status,
            detail: detail.into(),
        }
    }

    pub fn null(what: &str) -> Self {
        Error::new(
            ricochet_status::RICOCHET_ERROR_NULL_POINTER,
            format!("{what} is null"),
        )
    }

    pub fn invalid_handle(kind: &str) -> Self {
        Error::new(
            ricochet_status::RICOCHET_ERROR_INVALID_HANDLE,
            format!("not a live {kind} handle (null, of another kind, destroyed or stopped)"),
        )
    }

    pub fn too_small(needed: usize) -> Self {
        Error::new(
            ricochet_status::RICOCHET_ERROR_BUFFER_TOO_SMALL,
            format!("the buffer is too small: {needed} bytes needed"),
        )
    }
}

impl From<SendError> for Error {
    fn from(e: SendError) -> Self {
        use ricochet_status::*;
        let status = match e {
            SendError::UnknownChannel(_) => RICOCHET_ERROR_UNKNOWN_CHANNEL,
            SendError::TooLarge(_) => RICOCHET_ERROR_MESSAGE_TOO_LARGE,
            SendError::QueueFull => RICOCHET_ERROR_QUEUE_FULL,
            _ => RICOCHET_ERROR_CLOSED,
        };
        Error::new(status, e.to_string())
    }
}

impl From<ClientError> for Error {
    fn from(e: ClientError) -> Self {
        use ricochet_status::*;
        match e {
            ClientError::Send(s) => s.into(),
            ClientError::Platform(_) => Error::new(RICOCHET_ERROR_IO, e.to_string()),
            ClientError::Config(_) => Error::new(RICOCHET_ERROR_INVALID_CONFIG, e.to_string()),
            _ => Error::new(RICOCHET_ERROR_CLOSED, e.to_string()),
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

pub(crate) fn last_error() -> String {
    LAST_ERROR.with(|l| l.borrow().clone())
}

fn set_last_error(message: String) {
    // A thread being torn down has no slot left; the message is then lost, nothing else.
    let _ = LAST_ERROR.try_with(|l| *l.borrow_mut() = message);
}

/// Run an export's body: its error becomes a status (and the thread's last error), and so
/// does a panic, which never unwinds into the caller.
pub(crate) fn guard(body: impl FnOnce() -> Result<(), Error>) -> ricochet_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => {
            set_last_error(String::new());
            ricochet_status::RICOCHET_OK
        }
        Ok(Err(e)) => {
            set_last_error(e.detail);
            e.status
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_string());
            set_last_error(format!("panic inside the library: {what}"));
            ricochet_status::RICOCHET_ERROR_PANIC
        }
    }
}

/// Copy `bytes` into the caller's `buf` of `cap` bytes and its length into `*len` (when not
/// null); too small: `BUFFER_TOO_SMALL` with the length needed in `*len`.
///
/// # Safety
///
/// `buf` null or `cap` writable bytes; `len` null or one writable `usize`.
pub(crate) unsafe fn write_bytes(
    bytes: &[u8],
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> Result<(), Error> {
    if !len.is_null() {
        // SAFETY: non-null, and writable by the caller's contract.
        unsafe { len.write(bytes.len()) };
    }
    if bytes.len() > cap {
        return Err(Error::too_small(bytes.len()));
    }
    if !bytes.is_empty() {
        if buf.is_null() {
            return Err(Error::null("buf"));
        }
        // SAFETY: `buf` holds `cap >= bytes.len()` writable bytes (caller's contract), and
        // cannot overlap the library's own `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf, bytes.len()) };
    }
    Ok(())
}

/// [`write_bytes`] for a string: NUL-terminated, `*len` without the NUL on success and the
/// room needed (with it) when too small.
///
/// # Safety
///
/// As [`write_bytes`].
pub(crate) unsafe fn write_str(
    s: &str,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> ricochet_status {
    let needed = s.len() + 1;
    let set_len = |n: usize| {
        if !len.is_null() {
            // SAFETY: non-null, and writable by the caller's contract.
            unsafe { len.write(n) };
        }
    };
    if cap < needed || buf.is_null() {
        set_len(needed);
        return if buf.is_null() && cap >= needed {
            ricochet_status::RICOCHET_ERROR_NULL_POINTER
        } else {
            ricochet_status::RICOCHET_ERROR_BUFFER_TOO_SMALL
        };
    }
    // SAFETY: `buf` holds `cap >= s.len() + 1` writable bytes (caller's contract).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf, s.len());
        buf.add(s.len()).write(0);
    }
    set_len(s.len());
    ricochet_status::RICOCHET_OK
}

/// The static text of a status code.
pub(crate) fn text(code: i32) -> &'static str {
    match code {
        0 => "success\0",
        1 => "a required pointer argument is null\0",
        2 => "invalid handle: null, of another kind, destroyed or stopped\0",
        3 => "the output buffer is too small\0",
        4 => "the connection or session is closed\0",
        5 => "invalid configuration\0",
        6 => "invalid argument\0",
        7 => "unknown channel\0",
        8 => "the message is larger than the maximum message size\0",
        9 => "the send queue is full\0",
        10 => "connect token malformed or not issuable\0",
        11 => "socket setup or I/O failed\0",
        12 => "a panic inside the library was caught\0",
        _ => "unknown status code\0",
    }
}

/// The static text of a close reason's wire code.
pub(crate) fn close_reason_text(code: u8) -> &'static str {
    match CloseReason::from_u8(code) {
        CloseReason::Application => "closed by the application\0",
        CloseReason::IdleTimeout => "idle timeout: nothing arrived or was acknowledged in time\0",
        CloseReason::VersionMismatch => "the peer speaks another protocol version\0",
        CloseReason::ServerFull => "the server is full\0",
        CloseReason::TooManyFromAddress => "too many sessions from this address\0",
        CloseReason::HandshakeTimeout => "the handshake did not complete in time\0",
        CloseReason::ProtocolViolation => "the peer violated the protocol\0",
        CloseReason::Shutdown => "the endpoint is shutting down\0",
        CloseReason::Draining => "the server is draining and admits no new sessions\0",
        CloseReason::Reset => "the server has no state for this session (reset)\0",
        CloseReason::TokenRequired => "the server requires a connect token\0",
        CloseReason::TokenInvalid => "the server could not open the connect token\0",
        CloseReason::TokenExpired => "the connect token expired\0",
        CloseReason::TokenWrongServer => "the connect token does not list this server\0",
        CloseReason::TokenReused => "the connect token was already used\0",
        CloseReason::InsecureServer => "the server is insecure and takes no token\0",
        CloseReason::Rejected(_) => "refused by the server application\0",
        _ => "unknown close reason\0",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every status has its own text, and every text is NUL-terminated.
    #[test]
    fn every_status_has_a_text() {
        for code in 0..=12 {
            let t = text(code);
            assert!(t.ends_with('\0') && t != text(-1), "{code}");
        }
        for code in 0..=255u8 {
            assert!(close_reason_text(code).ends_with('\0'));
        }
    }
}
