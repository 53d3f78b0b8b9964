//! The game client from C: connect (with a token or insecure), send, update, poll events,
//! stats, close, destroy.

use std::ffi::c_char;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ricochet::proto::token::ConnectToken;
use ricochet::{Client, ClientConfig, ClientEvent, Profile};

use crate::handles::{self, Object};
use crate::lanes::{read_lanes, ricochet_lane};
use crate::status::{guard, write_bytes, Error};
use crate::token::{read_addr, read_bytes};
use crate::{ricochet_event_kind, ricochet_stats, ricochet_status};

/// The default protocol profile (balanced; see the Rust `Profile`).
pub const RICOCHET_PROFILE_DEFAULT: u32 = 0;
/// The game profile: latency first, adaptive FEC.
pub const RICOCHET_PROFILE_GAME: u32 = 1;
/// The bulk profile: throughput first.
pub const RICOCHET_PROFILE_BULK: u32 = 2;

/// A client: one connection to a server. Opaque; 0 is the null handle.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ricochet_client {
    /// The handle's id (opaque).
    pub id: u64,
}

/// Client settings. Fill it with [`ricochet_client_config_default`], then change fields.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ricochet_client_config {
    /// `RICOCHET_PROFILE_*`: use the server's.
    pub profile: u32,
    /// Seed for connection ids and nonces (reproducible tests); 0 draws from the OS.
    pub seed: u64,
    /// The session's lanes (`lane_count` of them, read during the connect call only); null
    /// and 0: one lane of every channel. Use the server's.
    pub lanes: *const ricochet_lane,
    /// How many lanes `lanes` holds.
    pub lane_count: usize,
}

/// One client event. `len` is the message's size (also when the buffer was too small).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ricochet_client_event {
    /// What happened (`RICOCHET_EVENT_NONE` when nothing was waiting).
    pub kind: ricochet_event_kind,
    /// Message: the channel it arrived on.
    pub channel: u8,
    /// Disconnected: 1 when the server decided it, 0 otherwise.
    pub by_peer: u8,
    /// Disconnected: why (see `ricochet_close_reason_text`).
    pub reason: u8,
    /// Message: its length in bytes.
    pub len: usize,
}

pub(crate) struct ClientCell(Mutex<ClientState>);

struct ClientState {
    client: Client,
    /// An event taken from the client that the caller has not received yet (its buffer was
    /// too small).
    pending: Option<ClientEvent>,
}

fn cell(h: ricochet_client) -> Result<Arc<ClientCell>, Error> {
    match handles::get(h.id) {
        Some(Object::Client(c)) => Ok(c),
        _ => Err(Error::invalid_handle("client")),
    }
}

fn with<T>(
    h: ricochet_client,
    f: impl FnOnce(&mut ClientState) -> Result<T, Error>,
) -> Result<T, Error> {
    let cell = cell(h)?;
    // A panic while driving the client is reported as such; the state stays usable for
    // destroy.
    let mut state = cell.0.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut state)
}

pub(crate) fn profile(p: u32) -> Result<Profile, Error> {
    match p {
        RICOCHET_PROFILE_DEFAULT => Ok(Profile::Default),
        RICOCHET_PROFILE_GAME => Ok(Profile::Game),
        RICOCHET_PROFILE_BULK => Ok(Profile::Bulk),
        other => Err(Error::new(
            ricochet_status::RICOCHET_ERROR_INVALID_CONFIG,
            format!("profile {other} is not a RICOCHET_PROFILE_* value"),
        )),
    }
}

/// # Safety
///
/// `config` null or one readable config, its `lanes` null or `lane_count` readable lanes
/// (each `channels` null or `channel_count` readable bytes).
unsafe fn client_config(config: *const ricochet_client_config) -> Result<ClientConfig, Error> {
    let c = if config.is_null() {
        default_config()
    } else {
        // SAFETY: readable (caller's contract).
        unsafe { config.read() }
    };
    let mut out = ClientConfig::new().profile(profile(c.profile)?);
    if c.seed != 0 {
        out = out.seed(c.seed);
    }
    // SAFETY: null or `lane_count` readable lanes (caller's contract).
    if let Some(lanes) = unsafe { read_lanes(c.lanes, c.lane_count) }? {
        out = out.lanes(lanes);
    }
    Ok(out)
}

fn default_config() -> ricochet_client_config {
    ricochet_client_config {
        profile: RICOCHET_PROFILE_DEFAULT,
        seed: 0,
        lanes: std::ptr::null(),
        lane_count: 0,
    }
}

fn publish(client: Client, out: *mut ricochet_client) {
    let id = handles::insert(Object::Client(Arc::new(ClientCell(Mutex::new(
        ClientState {
            client,
            pending: None,
        },
    )))));
    // SAFETY: checked non-null by the caller before connecting; writable by its contract.
    unsafe { out.write(ricochet_client { id }) };
}

/// Fill `*out` with the default client settings.
///
/// # Safety
///
/// `out` null or one writable config.
#[no_mangle]
pub unsafe extern "C" fn ricochet_client_config_default(
    out: *mut ricochet_client_config,
) -> ricochet_status {
    guard(|| {
        if out.is_null() {
            return Err(Error::null("out"));
        }
        // SAFETY: non-null, writable (caller's contract).
        unsafe { out.write(default_config()) };
        Ok(())
    })
}

/// Start connecting with the connect token in `token` (`token_len` bytes, as the backend
/// issued them; read during the call only) and return at once: a `RICOCHET_EVENT_CONNECTED`
/// or `RICOCHET_EVENT_DISCONNECTED` event reports the outcome as [`ricochet_client_update`]
/// runs. `config` may be null (the defaults); it is read during the call only. Writes the
/// handle to `*out`; destroy it with [`ricochet_client_destroy`].
///
/// # Safety
///
/// `token` null or `token_len` readable bytes; `config` null or one readable config (its
/// `lanes` null or `lane_count` readable lanes, each `channels` null or `channel_count`
/// readable bytes); `out` null or one writable handle.
#[no_mangle]
pub unsafe extern "C" fn ricochet_client_connect(
    token: *const u8,
    token_len: usize,
    config: *const ricochet_client_config,
    out: *mut ricochet_client,
) -> ricochet_status {
    guard(|| {
        if out.is_null() {
            return Err(Error::null("out"));
        }
        if token.is_null() {
            return Err(Error::null("token"));
        }
        // SAFETY: the caller's contract, for both.
        let bytes = unsafe { read_bytes(token, token_len, "token") }?;
        // SAFETY: the pointers are as this function's `# Safety` requires.
        let config = unsafe { client_config(config) }?;
        let token = ConnectToken::from_bytes(bytes)
            .map_err(|e| Error::new(ricochet_status::RICOCHET_ERROR_TOKEN, e.to_string()))?;
        publish(Client::connect(&token, config)?, out);
        Ok(())
    })
}

/// Start connecting to the server at `address` ("ip:port", NUL-terminated, read during the
/// call only) in insecure mode: no token, no packet protection, the server must be insecure
/// too (LAN play, local tests). Otherwise as [`ricochet_client_connect`].
///
/// # Safety
///
/// `address` null or a NUL-terminated string; `config` and `out` as
/// [`ricochet_client_connect`].
#[no_mangle]
pub unsafe extern "C" fn ricochet_client_connect_insecure(
    address: *const c_char,
    config: *const ricochet_client_config,
    out: *mut ricochet_client,
) -> ricochet_status {
    guard(|| {
        if out.is_null() {
            return Err(Error::null("out"));
        }
        // SAFETY: the caller's contract, for both.
        let server = unsafe { read_addr(address, "address") }?;
        // SAFETY: the pointers are as this function's `# Safety` requires.
        let config = unsafe { client_config(config) }?;
        publish(Client::connect_insecure(server, config)?, out);
        Ok(())
    })
}

/// Queue the `len` bytes at `data` (copied during the call; `data` may be null when `len` is
/// 0) as one message on `channel`. `RICOCHET_ERROR_CLOSED` once the connection has ended;
/// `RICOCHET_ERROR_QUEUE_FULL` when the send queue is full (update, then send again).
///
/// # Safety
///
/// `data` null or `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn ricochet_client_send(
    client: ricochet_client,
    channel: u8,
    data: *const u8,
    len: usize,
) -> ricochet_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let bytes = unsafe { read_bytes(data, len, "data") }?;
        with(client, |s| {
            s.client
                .send(channel, ricochet::Bytes::copy_from_slice(bytes))
                .map_err(Error::from)
        })
    })
}

/// Do the connection's work: send what is queued, wait up to `timeout_ms` milliseconds (0:
/// not at all) for a datagram or the next protocol timer, handle what arrived, send what that
/// calls for. Call it every frame (with 0), or in a loop with a timeout on a thread of its
/// own; then take the events with [`ricochet_client_poll`].
#[no_mangle]
pub extern "C" fn ricochet_client_update(
    client: ricochet_client,
    timeout_ms: u32,
) -> ricochet_status {
    guard(|| {
        with(client, |s| {
            s.client
                .wait(Duration::from_millis(u64::from(timeout_ms)))
                .map(drop)
                .map_err(Error::from)
        })
    })
}

/// Take the oldest event into `*event`. A message's bytes go into `buf` (`cap` bytes,
/// caller-owned, written during the call only; null allowed when `cap` is 0) and its size
/// into `event->len`; if it does not fit, `RICOCHET_ERROR_BUFFER_TOO_SMALL` is returned with
/// `event->len` set and the event stays queued for the next call. `event->kind` is
/// `RICOCHET_EVENT_NONE` when nothing is waiting. Polling does no I/O: call
/// [`ricochet_client_update`] for that.
///
/// # Safety
///
/// `event` null or one writable event; `buf` null or `cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ricochet_client_poll(
    client: ricochet_client,
    event: *mut ricochet_client_event,
    buf: *mut u8,
    cap: usize,
) -> ricochet_status {
    guard(|| {
        if event.is_null() {
            return Err(Error::null("event"));
        }
        with(client, |s| {
            let next = s.pending.take().or_else(|| s.client.poll_event());
            let mut out = ricochet_client_event {
                kind: ricochet_event_kind::RICOCHET_EVENT_NONE,
                channel: 0,
                by_peer: 0,
                reason: 0,
                len: 0,
            };
            let mut result = Ok(());
            match &next {
                None => {}
                Some(ClientEvent::Connected) => {
                    out.kind = ricochet_event_kind::RICOCHET_EVENT_CONNECTED
                }
                Some(ClientEvent::Message { channel, data }) => {
                    out.kind = ricochet_event_kind::RICOCHET_EVENT_MESSAGE;
                    out.channel = *channel;
                    out.len = data.len();
                    // SAFETY: the caller's contract on `buf`.
                    result = unsafe { write_bytes(data, buf, cap, std::ptr::null_mut()) };
                }
                Some(ClientEvent::Disconnected { reason, by_peer }) => {
                    out.kind = ricochet_event_kind::RICOCHET_EVENT_DISCONNECTED;
                    out.reason = reason.to_u8();
                    out.by_peer = u8::from(*by_peer);
                }
                // An event kind this version of the ABI does not know: skipped.
                Some(_) => {}
            }
            if result.is_err() {
                s.pending = next;
            }
            // SAFETY: non-null, writable (caller's contract).
            unsafe { event.write(out) };
            result
        })
    })
}

/// Copy the session's counters into `*stats`. `RICOCHET_ERROR_CLOSED` once the session is
/// gone.
///
/// # Safety
///
/// `stats` null or one writable `ricochet_stats`.
#[no_mangle]
pub unsafe extern "C" fn ricochet_client_stats(
    client: ricochet_client,
    stats: *mut ricochet_stats,
) -> ricochet_status {
    guard(|| {
        if stats.is_null() {
            return Err(Error::null("stats"));
        }
        with(client, |s| {
            let st = s.client.stats().ok_or_else(|| {
                Error::new(
                    ricochet_status::RICOCHET_ERROR_CLOSED,
                    "the session is gone",
                )
            })?;
            // SAFETY: non-null, writable (caller's contract).
            unsafe { stats.write(st.into()) };
            Ok(())
        })
    })
}

/// Close the connection gracefully: its queued reliable data goes out first (up to the
/// close linger, 2 s), then the close. Keep calling [`ricochet_client_update`] until the
/// `RICOCHET_EVENT_DISCONNECTED` event, then destroy the client. The handle stays valid.
#[no_mangle]
pub extern "C" fn ricochet_client_close(client: ricochet_client) -> ricochet_status {
    guard(|| {
        with(client, |s| {
            s.client.close();
            Ok(())
        })
    })
}

/// Destroy the client: its socket closes at once (without [`ricochet_client_close`] the
/// server learns nothing and times the session out). The handle is invalid from now on.
#[no_mangle]
pub extern "C" fn ricochet_client_destroy(client: ricochet_client) -> ricochet_status {
    guard(|| {
        handles::remove(client.id, |o| matches!(o, Object::Client(_)))
            .map(drop)
            .ok_or_else(|| Error::invalid_handle("client"))
    })
}
