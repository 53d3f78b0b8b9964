//! The echo served by Ricochet's thread-per-core runtime.

use std::net::SocketAddr;
use std::str::FromStr;

use anyhow::{anyhow, Result};
use ricochet::runtime::{
    CorePinning, DatagramHandler, IdleStrategy, IoModel, UdpContext, UdpServer, UdpServerConfig,
    WorkerCounters,
};
use ricochet_platform::{BackendKind, SocketInfo};

use super::server::{busy_work, EchoServer};
use crate::schema::{ServerInfo, SocketBuffers, UdpConfig, WorkerStats};

/// The handler: spin `work_ns`, then queue the datagram back to its sender.
struct Echo {
    work_ns: u64,
}

impl DatagramHandler for Echo {
    fn on_datagram(&mut self, ctx: &mut UdpContext<'_>, from: SocketAddr, data: &[u8]) {
        busy_work(self.work_ns);
        // A refused send is counted by the runtime (`send_errors`) and shows up as client loss.
        let _ = ctx.send(from, data);
    }
}

/// A running Ricochet echo server.
pub struct RicochetServer {
    server: UdpServer,
    io_model: IoModel,
}

/// Start Ricochet's echo for `cfg` on `addr`.
pub fn start(cfg: &UdpConfig, addr: SocketAddr) -> Result<Box<dyn EchoServer>> {
    let mut sc = UdpServerConfig::new(addr);
    sc.io_model = IoModel::from_str(&cfg.io_model).map_err(|e| anyhow!("{e}"))?;
    sc.io_threads = cfg.io_threads;
    sc.idle = IdleStrategy::from_str(&cfg.idle).map_err(|e| anyhow!("{e}"))?;
    sc.backend.kind = BackendKind::from_str(&cfg.backend).map_err(|e| anyhow!("{e}"))?;
    sc.pinning = if cfg.pin_cores {
        CorePinning::Always
    } else {
        CorePinning::Never
    };
    sc.recv_buffer = cfg.recv_buffer;
    sc.send_buffer = cfg.send_buffer;
    let work_ns = cfg.work_ns;
    let server = UdpServer::start(sc.clone(), |_| Echo { work_ns })
        .map_err(|e| anyhow!("ricochet server: {e}"))?;
    Ok(Box::new(RicochetServer {
        server,
        io_model: sc.io_model,
    }))
}

/// Convert the platform's socket description.
pub fn socket_buffers(s: &SocketInfo, drops: Option<u64>) -> SocketBuffers {
    SocketBuffers {
        local_addr: s.local_addr.to_string(),
        recv_requested: s.recv_buffer_requested,
        recv_granted: s.recv_buffer_granted,
        send_requested: s.send_buffer_requested,
        send_granted: s.send_buffer_granted,
        drops,
    }
}

/// A worker's runtime counters as the result schema records them (raw UDP and RUDP servers).
pub(crate) fn worker_stats(c: &WorkerCounters) -> WorkerStats {
    WorkerStats {
        worker: c.worker,
        core: c.core,
        loop_turns: c.loop_turns,
        datagrams_in: c.datagrams_in,
        datagrams_out: c.datagrams_out,
        batches_in: c.batches_in,
        batches_out: c.batches_out,
        syscalls: c.syscalls,
        max_turn_ns: c.max_turn_ns,
        send_errors: c.send_errors,
        truncated: c.truncated,
        socket_drops: c.socket_drops,
    }
}

impl EchoServer for RicochetServer {
    fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    fn shutdown(self: Box<Self>) -> Result<ServerInfo> {
        let kind = self.server.backend_kind().to_string();
        let reason = self.server.selection_reason().to_string();
        let infos: Vec<SocketInfo> = self.server.socket_info().to_vec();
        let counters = self
            .server
            .shutdown()
            .map_err(|e| anyhow!("ricochet shutdown: {e}"))?;
        // Per-core: socket i belongs to worker i. Shared: one socket, drops counted by every
        // worker reading it; report the largest figure any worker saw.
        let sockets = match self.io_model {
            IoModel::PerCore => infos
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let drops = counters
                        .get(i)
                        .filter(|_| s.drop_counting)
                        .map(|c| c.socket_drops);
                    socket_buffers(s, drops)
                })
                .collect(),
            // Shared (and any model with one socket for all threads).
            _ => infos
                .iter()
                .take(1)
                .map(|s| {
                    let drops = s
                        .drop_counting
                        .then(|| counters.iter().map(|c| c.socket_drops).max().unwrap_or(0));
                    socket_buffers(s, drops)
                })
                .collect(),
        };
        Ok(ServerInfo {
            kind: "ricochet".into(),
            io_model: self.io_model.to_string(),
            threads: counters.len(),
            backend: kind,
            selection_reason: reason,
            sockets,
            workers: counters.iter().map(worker_stats).collect(),
            sessions_per_worker: None,
            forwarded: None,
        })
    }
}
