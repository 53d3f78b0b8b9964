//! The RUDP echo server: Ricochet's `Server`, echoing every complete message on the channel
//! it came on, and publishing its sessions' protocol counters from the worker tick.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Result};
use bytes::Bytes;
use ricochet::runtime::{
    CorePinning, Handler, IdleStrategy, IoModel, Server, ServerConfig, ServerContext, SessionId,
};
use ricochet_platform::BackendKind;
use ricochet_proto::token::TokenKey;
use ricochet_proto::EndpointConfig;

use crate::schema::{RudpWire, ServerInfo};
use crate::udp::ricochet_server::socket_buffers;

/// How often each worker publishes its sessions' counters.
pub const STATS_TICK: Duration = Duration::from_millis(10);

/// What the server's handlers share with the bench.
#[derive(Debug, Default)]
pub struct ServerShared {
    /// Latest counters of every session seen, by session.
    pub sessions: Mutex<BTreeMap<SessionId, RudpWire>>,
    /// Echo sends the connection refused.
    pub send_errors: AtomicU64,
    /// Sessions that ended before the bench closed them.
    pub early_disconnects: AtomicU64,
    /// Worker ticks so far (to wait for a fresh sample).
    pub ticks: AtomicU64,
    /// Application bytes echoed, by every handler. One total, not per session: in the shared
    /// IO model several handlers (one per thread) serve the same sessions.
    pub app_bytes_sent: AtomicU64,
}

impl ServerShared {
    /// The sum over every session's latest sample.
    pub fn wire(&self) -> RudpWire {
        let map = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let mut total = RudpWire::default();
        for w in map.values() {
            total.add(w);
        }
        total.app_bytes_sent = self.app_bytes_sent.load(Ordering::Relaxed);
        total
    }
}

struct Echo {
    shared: Arc<ServerShared>,
}

impl Handler for Echo {
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
        let len = data.len() as u64;
        match ctx.send(s, channel, data) {
            Ok(()) => {
                self.shared.app_bytes_sent.fetch_add(len, Ordering::Relaxed);
            }
            Err(_) => {
                self.shared.send_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn on_disconnect(
        &mut self,
        _: &mut ServerContext<'_>,
        _: SessionId,
        _: ricochet::CloseReason,
        _: bool,
    ) {
        self.shared
            .early_disconnects
            .fetch_add(1, Ordering::Relaxed);
    }

    fn on_tick(&mut self, ctx: &mut ServerContext<'_>) {
        let samples: Vec<(SessionId, RudpWire)> = ctx
            .sessions()
            .filter_map(|s| {
                let st = ctx.session_detail(s)?;
                Some((
                    s,
                    // Application bytes are summed once for all handlers in `ServerShared::wire`.
                    super::wire_of(&st, 0),
                ))
            })
            .collect();
        if !samples.is_empty() {
            let mut map = self
                .shared
                .sessions
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            map.extend(samples);
        }
        self.shared.ticks.fetch_add(1, Ordering::Release);
    }
}

/// A running echo server and what its handlers publish.
pub struct EchoServer {
    server: Server,
    io_model: IoModel,
    /// Counters the handlers publish.
    pub shared: Arc<ServerShared>,
    /// Sessions per worker at the last [`EchoServer::fresh_sample`], while sessions were open.
    sessions_per_worker: Option<Vec<u32>>,
}

impl EchoServer {
    /// Start on `addr` with `io_model` × `threads` workers on `backend` idling as `idle`
    /// (`balanced`, `park` or `spin`) and asking the scheduler for `slice_us` µs slices (0:
    /// none asked), pinned as `pinning` says (`auto`, `always`, `never`), protocol
    /// `endpoint`, admitting clients by token sealed with `key`
    /// ([`super::protocol::BENCH_PROTOCOL_ID`]), or insecurely without one.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        addr: SocketAddr,
        io_model: &str,
        threads: usize,
        backend: &str,
        idle: &str,
        slice_us: u64,
        pinning: &str,
        endpoint: EndpointConfig,
        key: Option<TokenKey>,
        seed: u64,
    ) -> Result<EchoServer> {
        let mut cfg = ServerConfig::new(addr);
        cfg = match key {
            Some(k) => cfg.tokens(k, super::protocol::BENCH_PROTOCOL_ID),
            None => cfg.insecure(),
        };
        cfg.udp.io_model = IoModel::from_str(io_model).map_err(|e| anyhow!("{e}"))?;
        cfg.udp.io_threads = threads;
        cfg.udp.backend.kind = BackendKind::from_str(backend).map_err(|e| anyhow!("{e}"))?;
        cfg.udp.idle = IdleStrategy::from_str(idle).map_err(|e| anyhow!("{e}"))?;
        cfg.udp.worker_slice = crate::schema::worker_slice(slice_us);
        cfg.udp.pinning = CorePinning::from_str(pinning).map_err(|e| anyhow!("{e}"))?;
        cfg.udp.tick = Some(STATS_TICK);
        cfg.endpoint = endpoint.with(|c| c.server = cfg.endpoint.server.take());
        cfg.seed = Some(seed);
        let shared = Arc::new(ServerShared::default());
        let s = shared.clone();
        let server = Server::start(cfg.clone(), move |_| Echo { shared: s.clone() })
            .map_err(|e| anyhow!("ricochet RUDP server: {e}"))?;
        Ok(EchoServer {
            server,
            io_model: cfg.udp.io_model,
            shared,
            sessions_per_worker: None,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// The core each worker is pinned to (`None`: not pinned), by worker index.
    pub fn worker_cores(&self) -> Vec<Option<usize>> {
        self.server.counters().iter().map(|c| c.core).collect()
    }

    /// Wait (bounded) until every worker ticked at least twice more, so the published counters
    /// include everything up to now, and note the sessions each worker holds.
    pub fn fresh_sample(&mut self) {
        let want = self.shared.ticks.load(Ordering::Acquire) + 2 * self.server.workers() as u64;
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        while self.shared.ticks.load(Ordering::Acquire) < want
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(2));
        }
        self.sessions_per_worker = self.server.sessions_per_worker();
    }

    /// Close every session, stop the workers, describe what ran.
    pub fn shutdown(self) -> Result<ServerInfo> {
        let backend = self.server.backend_kind().to_string();
        let reason = self.server.selection_reason().to_string();
        let sockets = self
            .server
            .socket_info()
            .iter()
            .map(|s| socket_buffers(s, None))
            .collect();
        let forwarded = self.server.forwarded();
        let counters = self
            .server
            .shutdown()
            .map_err(|e| anyhow!("ricochet RUDP shutdown: {e}"))?;
        Ok(ServerInfo {
            kind: "ricochet-rudp".into(),
            io_model: self.io_model.to_string(),
            threads: counters.len(),
            backend,
            selection_reason: reason,
            sockets,
            workers: counters
                .iter()
                .map(crate::udp::ricochet_server::worker_stats)
                .collect(),
            sessions_per_worker: self.sessions_per_worker,
            forwarded: Some(forwarded),
        })
    }
}
