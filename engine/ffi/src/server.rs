//! The server from C, poll-style: a Rust [`Handler`] on each worker pushes its events into a
//! bounded queue of that worker's, which the host drains with [`ricochet_server_poll`] from a
//! thread of its own; sends and closes go to the owning worker through
//! [`ricochet::Server::send`] and [`ricochet::Server::close`].

use std::collections::{HashSet, VecDeque};
use std::ffi::c_char;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use ricochet::proto::ConnectionHandle;
use ricochet::{
    Bytes, CloseReason, Handler, Peer, Server, ServerConfig, ServerContext, SessionId, TokenKey,
};

use crate::client::profile;
use crate::handles::{self, Object};
use crate::lanes::{read_lanes, ricochet_lane};
use crate::status::{guard, write_bytes, write_str, Error};
use crate::token::{read_addr, read_bytes, read_key};
use crate::{ricochet_event_kind, ricochet_status};

/// Admission is not set: starting fails (say how clients are admitted).
pub const RICOCHET_ADMISSION_UNSET: u32 = 0;
/// Admit clients by connect token sealed with `token_key` for `protocol_id` (production).
pub const RICOCHET_ADMISSION_TOKENS: u32 = 1;
/// Admit anyone who proves their address, protect no packet (LAN play, local tests only).
pub const RICOCHET_ADMISSION_INSECURE: u32 = 2;
/// For [`ricochet_server_poll`]: take the next event of any worker.
pub const RICOCHET_ANY_WORKER: u32 = 0xFFFF_FFFF;

/// Events a worker's queue holds by default before its worker waits for the host to drain it.
const DEFAULT_QUEUE: usize = 65_536;
/// Message bytes a worker's queue holds by default before its worker waits for the host.
const DEFAULT_QUEUE_BYTES: u64 = 64 << 20;

/// A running server. Opaque; 0 is the null handle.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ricochet_server {
    /// The handle's id (opaque).
    pub id: u64,
}

/// A session on a server: the worker that owns it and its id there. Plain data: copy it,
/// compare both fields.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ricochet_session {
    /// The owning worker.
    pub worker: u32,
    /// The session's id on that worker.
    pub id: u64,
}

/// Server settings. Fill it with [`ricochet_server_config_default`], then set at least
/// `bind` and `admission`. Strings are read during [`ricochet_server_start`] only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ricochet_server_config {
    /// Address to bind, "ip:port" (port 0: any free port; see
    /// [`ricochet_server_local_address`]). Required.
    pub bind: *const c_char,
    /// With token admission, the address clients reach the server at, as tokens list it;
    /// null: the bound address (which must then name an IP, not 0.0.0.0).
    pub public_address: *const c_char,
    /// `RICOCHET_ADMISSION_TOKENS` or `RICOCHET_ADMISSION_INSECURE`. Required.
    pub admission: u32,
    /// With token admission: the backend's key.
    pub token_key: [u8; 32],
    /// With token admission: the game's protocol id.
    pub protocol_id: u64,
    /// `RICOCHET_PROFILE_*` (clients should use the same).
    pub profile: u32,
    /// Worker threads; 0: one per core.
    pub workers: u32,
    /// Sessions at most, over all workers; 0: the default (16,384).
    pub max_sessions: u32,
    /// Sessions from one IP address at most; 0: the default (2,048).
    pub max_sessions_per_address: u32,
    /// Events each worker's queue holds before that worker waits for the host to drain it;
    /// 0: the default (65,536).
    pub event_queue_capacity: u32,
    /// Message bytes each worker's queue holds before that worker waits for the host to drain
    /// it (a message larger than this still goes into an empty queue); 0: the default
    /// (64 MiB).
    pub event_queue_bytes: u64,
    /// The sessions' lanes (`lane_count` of them, read during [`ricochet_server_start`]
    /// only); null and 0: one lane of every channel. Clients should use the same.
    pub lanes: *const ricochet_lane,
    /// How many lanes `lanes` holds.
    pub lane_count: usize,
}

/// One server event. `len` is the message's size (also when the buffer was too small).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ricochet_server_event {
    /// What happened (`RICOCHET_EVENT_NONE` when nothing was waiting).
    pub kind: ricochet_event_kind,
    /// The session it happened on.
    pub session: ricochet_session,
    /// Message: the channel it arrived on.
    pub channel: u8,
    /// Disconnected: 1 when the client decided it, 0 otherwise.
    pub by_peer: u8,
    /// Disconnected: why (see `ricochet_close_reason_text`).
    pub reason: u8,
    /// Connected: 1 when `client_id` is set (the client came with a token).
    pub has_client_id: u8,
    /// Connected: the client id its connect token named.
    pub client_id: u64,
    /// Message: its length in bytes.
    pub len: usize,
}

enum Item {
    Connected(SessionId, Option<u64>),
    Message(SessionId, u8, Bytes),
    Disconnected(SessionId, CloseReason, bool),
}

impl Item {
    /// What the item counts against its queue's byte cap.
    fn bytes(&self) -> usize {
        match self {
            Item::Message(_, _, data) => data.len(),
            _ => 0,
        }
    }
}

/// A worker's queued events and the message bytes they hold.
#[derive(Default)]
struct Items {
    list: VecDeque<Item>,
    bytes: usize,
}

/// One worker's event queue.
struct Queue {
    items: Mutex<Items>,
    /// Signalled when the host takes an item (a worker waiting for room).
    room: Condvar,
}

/// What the handlers and the host share.
struct Shared {
    queues: Vec<Queue>,
    capacity: usize,
    /// Message bytes a queue holds at most (but one message always fits an empty queue).
    byte_capacity: usize,
    /// Channels the sessions have: a send on another is refused in the call.
    channels: usize,
    /// Largest message a send accepts: a larger one is refused in the call.
    max_message_size: usize,
    /// Set when the host stops the server: waiting workers stop waiting and drop events.
    stopping: AtomicBool,
    /// Sessions connected and not yet ended or closed by the host: a send to any other is
    /// refused at once.
    live: Mutex<HashSet<SessionId>>,
    /// Where a poll of any worker starts looking.
    cursor: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; a poisoned one still holds sound data.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn push(&self, worker: usize, item: Item) {
        let Some(q) = self.queues.get(worker) else {
            return;
        };
        let mut items = lock(&q.items);
        let size = item.bytes();
        // A full queue (by count or by bytes) holds its worker back (as a full socket would)
        // rather than lose a message: the host drains it, or stops the server.
        while items.list.len() >= self.capacity
            || (items.bytes > 0 && items.bytes + size > self.byte_capacity)
        {
            if self.stopping.load(Ordering::Relaxed) {
                return;
            }
            items = q
                .room
                .wait_timeout(items, Duration::from_millis(10))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        items.bytes += size;
        items.list.push_back(item);
    }
}

struct FfiHandler {
    worker: usize,
    shared: Arc<Shared>,
}

impl Handler for FfiHandler {
    fn on_connect(&mut self, _ctx: &mut ServerContext<'_>, session: SessionId, peer: &Peer) {
        lock(&self.shared.live).insert(session);
        self.shared
            .push(self.worker, Item::Connected(session, peer.client_id));
    }

    fn on_message(
        &mut self,
        _ctx: &mut ServerContext<'_>,
        session: SessionId,
        channel: u8,
        data: Bytes,
    ) {
        self.shared
            .push(self.worker, Item::Message(session, channel, data));
    }

    fn on_disconnect(
        &mut self,
        _ctx: &mut ServerContext<'_>,
        session: SessionId,
        reason: CloseReason,
        by_peer: bool,
    ) {
        lock(&self.shared.live).remove(&session);
        self.shared
            .push(self.worker, Item::Disconnected(session, reason, by_peer));
    }
}

pub(crate) struct ServerCell {
    server: RwLock<Option<Server>>,
    shared: Arc<Shared>,
}

fn cell(h: ricochet_server) -> Result<Arc<ServerCell>, Error> {
    match handles::get(h.id) {
        Some(Object::Server(s)) => Ok(s),
        _ => Err(Error::invalid_handle("server")),
    }
}

fn invalid_config(detail: impl Into<String>) -> Error {
    Error::new(ricochet_status::RICOCHET_ERROR_INVALID_CONFIG, detail)
}

fn session_id(s: ricochet_session) -> SessionId {
    SessionId {
        worker: s.worker,
        handle: ConnectionHandle(s.id),
    }
}

fn c_session(s: SessionId) -> ricochet_session {
    ricochet_session {
        worker: s.worker,
        id: s.handle.0,
    }
}

/// Fill `*out` with the default server settings (no bind address, admission unset, default
/// profile, one worker per core, default limits).
///
/// # Safety
///
/// `out` null or one writable config.
#[no_mangle]
pub unsafe extern "C" fn ricochet_server_config_default(
    out: *mut ricochet_server_config,
) -> ricochet_status {
    guard(|| {
        if out.is_null() {
            return Err(Error::null("out"));
        }
        let c = ricochet_server_config {
            bind: std::ptr::null(),
            public_address: std::ptr::null(),
            admission: RICOCHET_ADMISSION_UNSET,
            token_key: [0; 32],
            protocol_id: 0,
            profile: crate::client::RICOCHET_PROFILE_DEFAULT,
            workers: 0,
            max_sessions: 0,
            max_sessions_per_address: 0,
            event_queue_capacity: 0,
            event_queue_bytes: 0,
            lanes: std::ptr::null(),
            lane_count: 0,
        };
        // SAFETY: non-null, writable (caller's contract).
        unsafe { out.write(c) };
        Ok(())
    })
}

/// Bind and start a server from `*config` (read during the call only, strings included) and
/// return once every worker is up; writes the handle to `*out`. An invalid or incomplete
/// config returns `RICOCHET_ERROR_INVALID_CONFIG` (`ricochet_last_error` names the field).
/// Stop it with [`ricochet_server_stop`].
///
/// # Safety
///
/// `config` null or one readable config whose strings are null or NUL-terminated and whose
/// `lanes` is null or `lane_count` readable lanes (each `channels` null or `channel_count`
/// readable bytes); `out` null or one writable handle.
#[no_mangle]
pub unsafe extern "C" fn ricochet_server_start(
    config: *const ricochet_server_config,
    out: *mut ricochet_server,
) -> ricochet_status {
    guard(|| {
        if config.is_null() {
            return Err(Error::null("config"));
        }
        if out.is_null() {
            return Err(Error::null("out"));
        }
        // SAFETY: readable (caller's contract).
        let c = unsafe { config.read() };
        if c.bind.is_null() {
            return Err(invalid_config("config.bind is not set"));
        }
        // SAFETY: a NUL-terminated string (caller's contract).
        let bind = unsafe { read_addr(c.bind, "config.bind") }?;
        let mut sc = ServerConfig::new(bind).profile(profile(c.profile)?);
        match c.admission {
            RICOCHET_ADMISSION_TOKENS => {
                // SAFETY: the array field is 32 readable bytes.
                let key = unsafe { read_key(c.token_key.as_ptr(), "config.token_key") }?;
                sc = sc.tokens(TokenKey::from_bytes(key), c.protocol_id);
                if !c.public_address.is_null() {
                    // SAFETY: a NUL-terminated string (caller's contract).
                    sc = sc.public_address(unsafe {
                        read_addr(c.public_address, "config.public_address")
                    }?);
                }
            }
            RICOCHET_ADMISSION_INSECURE => sc = sc.insecure(),
            RICOCHET_ADMISSION_UNSET => {
                return Err(invalid_config(
                    "config.admission is not set: RICOCHET_ADMISSION_TOKENS or \
                     RICOCHET_ADMISSION_INSECURE",
                ))
            }
            other => {
                return Err(invalid_config(format!(
                    "config.admission {other} is not a RICOCHET_ADMISSION_* value"
                )))
            }
        }
        // SAFETY: null or `lane_count` readable lanes (caller's contract).
        if let Some(lanes) = unsafe { read_lanes(c.lanes, c.lane_count) }? {
            sc = sc.lanes(lanes);
        }
        if c.workers != 0 {
            sc = sc.workers(c.workers as usize);
        }
        if c.max_sessions != 0 {
            sc = sc.max_sessions(c.max_sessions as usize);
        }
        if c.max_sessions_per_address != 0 {
            sc = sc.max_sessions_per_address(c.max_sessions_per_address as usize);
        }
        let capacity = match c.event_queue_capacity {
            0 => DEFAULT_QUEUE,
            n => n as usize,
        };
        let byte_capacity = match c.event_queue_bytes {
            0 => DEFAULT_QUEUE_BYTES,
            n => n,
        };
        let byte_capacity = usize::try_from(byte_capacity).unwrap_or(usize::MAX);
        let workers = sc.udp.resolved_threads();
        let shared = Arc::new(Shared {
            queues: (0..workers.max(1))
                .map(|_| Queue {
                    items: Mutex::new(Items::default()),
                    room: Condvar::new(),
                })
                .collect(),
            capacity,
            byte_capacity,
            channels: sc.endpoint.connection.channels.len(),
            max_message_size: sc.endpoint.connection.max_message_size,
            stopping: AtomicBool::new(false),
            live: Mutex::new(HashSet::new()),
            cursor: AtomicUsize::new(0),
        });
        let handler_shared = shared.clone();
        let server = Server::start(sc, move |worker| FfiHandler {
            worker,
            shared: handler_shared.clone(),
        })
        .map_err(|e| {
            let status = match e {
                ricochet::RuntimeError::Config(_) => ricochet_status::RICOCHET_ERROR_INVALID_CONFIG,
                _ => ricochet_status::RICOCHET_ERROR_IO,
            };
            Error::new(status, e.to_string())
        })?;
        let id = handles::insert(Object::Server(Arc::new(ServerCell {
            server: RwLock::new(Some(server)),
            shared,
        })));
        // SAFETY: non-null, writable (caller's contract).
        unsafe { out.write(ricochet_server { id }) };
        Ok(())
    })
}

/// Write the bound address ("ip:port", NUL-terminated) into `buf` (`cap` bytes,
/// caller-owned, written during the call only) and its length without the NUL into `*len`
/// (if not null); too small: `RICOCHET_ERROR_BUFFER_TOO_SMALL`, `*len` the room needed.
///
/// # Safety
///
/// `buf` null or `cap` writable bytes; `len` null or one writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn ricochet_server_local_address(
    server: ricochet_server,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> ricochet_status {
    guard(|| {
        let cell = cell(server)?;
        let guard = cell.server.read().unwrap_or_else(|p| p.into_inner());
        let s = guard
            .as_ref()
            .ok_or_else(|| Error::invalid_handle("server"))?;
        let addr = s.local_addr().to_string();
        // SAFETY: the caller's contract.
        match unsafe { write_str(&addr, buf.cast(), cap, len) } {
            ricochet_status::RICOCHET_OK => Ok(()),
            // Through `guard`, so that `ricochet_last_error` says what failed.
            ricochet_status::RICOCHET_ERROR_NULL_POINTER => Err(Error::null("buf")),
            _ => Err(Error::too_small(addr.len() + 1)),
        }
    })
}

/// Write the number of workers (event queues) into `*workers`.
///
/// # Safety
///
/// `workers` null or one writable `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn ricochet_server_workers(
    server: ricochet_server,
    workers: *mut u32,
) -> ricochet_status {
    guard(|| {
        if workers.is_null() {
            return Err(Error::null("workers"));
        }
        let cell = cell(server)?;
        // SAFETY: non-null, writable (caller's contract).
        unsafe { workers.write(cell.shared.queues.len() as u32) };
        Ok(())
    })
}

/// Take the oldest event of worker `worker`'s queue (or, with `RICOCHET_ANY_WORKER`, of the
/// next worker's that has one, round robin) into `*event`. A message's bytes go into `buf`
/// (`cap` bytes, caller-owned, written during the call only; null allowed when `cap` is 0),
/// its size into `event->len`; if it does not fit, `RICOCHET_ERROR_BUFFER_TOO_SMALL` is
/// returned with `event->len` set and the event stays queued. `event->kind` is
/// `RICOCHET_EVENT_NONE` when nothing is waiting. Never blocks. `RICOCHET_ERROR_INVALID_ARGUMENT`
/// for a worker index out of range.
///
/// # Safety
///
/// `event` null or one writable event; `buf` null or `cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ricochet_server_poll(
    server: ricochet_server,
    worker: u32,
    event: *mut ricochet_server_event,
    buf: *mut u8,
    cap: usize,
) -> ricochet_status {
    guard(|| {
        if event.is_null() {
            return Err(Error::null("event"));
        }
        let cell = cell(server)?;
        let shared = &cell.shared;
        let n = shared.queues.len();
        let order: Vec<usize> = if worker == RICOCHET_ANY_WORKER {
            let start = shared.cursor.fetch_add(1, Ordering::Relaxed);
            (0..n).map(|i| (start + i) % n).collect()
        } else if (worker as usize) < n {
            vec![worker as usize]
        } else {
            return Err(Error::new(
                ricochet_status::RICOCHET_ERROR_INVALID_ARGUMENT,
                format!("worker {worker} out of range (the server has {n})"),
            ));
        };
        let mut out = ricochet_server_event {
            kind: ricochet_event_kind::RICOCHET_EVENT_NONE,
            session: ricochet_session { worker: 0, id: 0 },
            channel: 0,
            by_peer: 0,
            reason: 0,
            has_client_id: 0,
            client_id: 0,
            len: 0,
        };
        let mut result = Ok(());
        for w in order {
            let q = &shared.queues[w];
            let mut items = lock(&q.items);
            let Some(front) = items.list.front() else {
                continue;
            };
            match front {
                Item::Connected(s, client_id) => {
                    out.kind = ricochet_event_kind::RICOCHET_EVENT_CONNECTED;
                    out.session = c_session(*s);
                    out.has_client_id = u8::from(client_id.is_some());
                    out.client_id = client_id.unwrap_or(0);
                }
                Item::Message(s, channel, data) => {
                    out.kind = ricochet_event_kind::RICOCHET_EVENT_MESSAGE;
                    out.session = c_session(*s);
                    out.channel = *channel;
                    out.len = data.len();
                    // SAFETY: the caller's contract on `buf`.
                    result = unsafe { write_bytes(data, buf, cap, std::ptr::null_mut()) };
                }
                Item::Disconnected(s, reason, by_peer) => {
                    out.kind = ricochet_event_kind::RICOCHET_EVENT_DISCONNECTED;
                    out.session = c_session(*s);
                    out.reason = reason.to_u8();
                    out.by_peer = u8::from(*by_peer);
                }
            }
            if result.is_ok() {
                if let Some(taken) = items.list.pop_front() {
                    items.bytes -= taken.bytes();
                }
                drop(items);
                q.room.notify_one();
            }
            break;
        }
        // SAFETY: non-null, writable (caller's contract).
        unsafe { event.write(out) };
        result
    })
}

/// Queue the `len` bytes at `data` (copied during the call; null allowed when `len` is 0) as
/// one message to `session` on `channel`. The owning worker sends it on its next turn.
/// `RICOCHET_ERROR_CLOSED` when the session has ended (its disconnected event may still be
/// queued) or was closed with [`ricochet_server_close_session`];
/// `RICOCHET_ERROR_UNKNOWN_CHANNEL` for a channel the sessions do not have;
/// `RICOCHET_ERROR_MESSAGE_TOO_LARGE` over the profile's maximum message size. A message to a
/// session that ends before its worker takes it, or whose send queue is full then, is dropped
/// and counted (see [`ricochet_server_send_drops`]).
///
/// # Safety
///
/// `data` null or `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn ricochet_server_send(
    server: ricochet_server,
    session: ricochet_session,
    channel: u8,
    data: *const u8,
    len: usize,
) -> ricochet_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let bytes = unsafe { read_bytes(data, len, "data") }?;
        let cell = cell(server)?;
        let id = session_id(session);
        if usize::from(channel) >= cell.shared.channels {
            return Err(ricochet::SendError::UnknownChannel(channel).into());
        }
        if bytes.len() > cell.shared.max_message_size {
            return Err(ricochet::SendError::TooLarge(bytes.len()).into());
        }
        if !lock(&cell.shared.live).contains(&id) {
            return Err(Error::new(
                ricochet_status::RICOCHET_ERROR_CLOSED,
                format!("session {id} is not connected (ended, closed, or never existed)"),
            ));
        }
        let guard = cell.server.read().unwrap_or_else(|p| p.into_inner());
        let s = guard
            .as_ref()
            .ok_or_else(|| Error::invalid_handle("server"))?;
        s.send(id, channel, Bytes::copy_from_slice(bytes))
            .map_err(Error::from)
    })
}

/// Write into `*drops` the messages [`ricochet_server_send`] accepted that their worker then
/// dropped (the session had ended, or its send queue was full), since the server started.
///
/// # Safety
///
/// `drops` null or one writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn ricochet_server_send_drops(
    server: ricochet_server,
    drops: *mut u64,
) -> ricochet_status {
    guard(|| {
        if drops.is_null() {
            return Err(Error::null("drops"));
        }
        let cell = cell(server)?;
        let guard = cell.server.read().unwrap_or_else(|p| p.into_inner());
        let s = guard
            .as_ref()
            .ok_or_else(|| Error::invalid_handle("server"))?;
        // SAFETY: non-null, writable (caller's contract).
        unsafe { drops.write(s.remote_send_drops()) };
        Ok(())
    })
}

/// Close `session` gracefully (its queued reliable data first); the client learns
/// `Application`, and a `RICOCHET_EVENT_DISCONNECTED` event follows. Sends to it return
/// `RICOCHET_ERROR_CLOSED` from now on. `RICOCHET_ERROR_CLOSED` if it had already ended.
#[no_mangle]
pub extern "C" fn ricochet_server_close_session(
    server: ricochet_server,
    session: ricochet_session,
) -> ricochet_status {
    guard(|| {
        let cell = cell(server)?;
        let id = session_id(session);
        if !lock(&cell.shared.live).remove(&id) {
            return Err(Error::new(
                ricochet_status::RICOCHET_ERROR_CLOSED,
                format!("session {id} is not connected"),
            ));
        }
        let guard = cell.server.read().unwrap_or_else(|p| p.into_inner());
        let s = guard
            .as_ref()
            .ok_or_else(|| Error::invalid_handle("server"))?;
        s.close(id);
        Ok(())
    })
}

/// Stop the server: every session is closed (clients learn `Shutdown`), the workers finish
/// (bounded by the close linger, about 2.5 s), and the handle is invalid from now on; events
/// not yet polled are discarded. Blocks until the workers have stopped. Returns
/// `RICOCHET_ERROR_IO` (after stopping) if a worker had failed.
#[no_mangle]
pub extern "C" fn ricochet_server_stop(server: ricochet_server) -> ricochet_status {
    guard(|| {
        let Some(Object::Server(cell)) =
            handles::remove(server.id, |o| matches!(o, Object::Server(_)))
        else {
            return Err(Error::invalid_handle("server"));
        };
        cell.shared.stopping.store(true, Ordering::Relaxed);
        for q in &cell.shared.queues {
            q.room.notify_all();
        }
        let taken = cell
            .server
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match taken {
            Some(s) => s
                .shutdown()
                .map(drop)
                .map_err(|e| Error::new(ricochet_status::RICOCHET_ERROR_IO, e.to_string())),
            None => Err(Error::invalid_handle("server")),
        }
    })
}
