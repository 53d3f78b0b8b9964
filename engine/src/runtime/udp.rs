//! A raw-UDP server on the thread-per-core runtime: one handler per worker, replies batched.
//!
//! ```no_run
//! use ricochet::runtime::{DatagramHandler, UdpContext, UdpServer, UdpServerConfig};
//! use std::net::SocketAddr;
//!
//! struct Echo;
//! impl DatagramHandler for Echo {
//!     fn on_datagram(&mut self, ctx: &mut UdpContext<'_>, from: SocketAddr, data: &[u8]) {
//!         // Queued in the worker's send batch; submitted once per loop turn.
//!         let _ = ctx.send(from, data);
//!     }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let server = UdpServer::start(UdpServerConfig::new("127.0.0.1:7777".parse()?), |_| Echo)?;
//! println!("echoing on {} with {}", server.local_addr(), server.backend_kind());
//! server.shutdown()?;
//! # Ok(())
//! # }
//! ```

use std::net::SocketAddr;

use ricochet_platform::{BackendKind, SocketInfo};

use super::config::{IoModel, UdpServerConfig};
use super::counters::WorkerCounters;
use super::error::RuntimeError;
pub use super::worker::UdpContext;
use super::worker::{Service, WorkerSet};

/// Application code for a raw-UDP server. Each worker owns one instance, so it needs no locks
/// and need not be `Sync`.
pub trait DatagramHandler: Send + 'static {
    /// A datagram (one GRO segment at a time) arrived from `from`.
    fn on_datagram(&mut self, ctx: &mut UdpContext<'_>, from: SocketAddr, data: &[u8]);

    /// Called every [`UdpServerConfig::tick`], on the worker's thread.
    fn on_tick(&mut self, ctx: &mut UdpContext<'_>) {
        let _ = ctx;
    }
}

/// Runs a [`DatagramHandler`] as a worker's service.
struct HandlerService<H>(H);

impl<H: DatagramHandler> Service for HandlerService<H> {
    fn on_datagram(&mut self, ctx: &mut UdpContext<'_>, from: SocketAddr, data: &[u8]) {
        self.0.on_datagram(ctx, from, data);
    }

    fn on_tick(&mut self, ctx: &mut UdpContext<'_>) {
        self.0.on_tick(ctx);
    }

    fn on_turn_end(&mut self, _ctx: &mut UdpContext<'_>) {}

    fn next_deadline(&mut self) -> Option<std::time::Instant> {
        None
    }

    fn on_stop(&mut self, _ctx: &mut UdpContext<'_>) -> bool {
        true
    }
}

/// A running raw-UDP server. Dropping it stops and joins the workers; [`UdpServer::shutdown`]
/// does the same and reports how each worker ended.
pub struct UdpServer {
    workers: WorkerSet,
}

impl std::fmt::Debug for UdpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpServer")
            .field("local_addr", &self.workers.local_addr)
            .field("io_model", &self.workers.io_model)
            .field("backend", &self.workers.backend_kind)
            .field("workers", &self.workers.len())
            .finish()
    }
}

impl UdpServer {
    /// Bind, start the workers and return once every worker's backend is up.
    ///
    /// `make_handler(i)` builds worker `i`'s handler on the calling thread.
    pub fn start<H, F>(config: UdpServerConfig, mut make_handler: F) -> Result<Self, RuntimeError>
    where
        H: DatagramHandler,
        F: FnMut(usize) -> H,
    {
        let workers = WorkerSet::start(&config, &[], |i, _| HandlerService(make_handler(i)))?;
        tracing::info!(
            addr = %workers.local_addr,
            io_model = %workers.io_model,
            workers = workers.len(),
            backend = %workers.backend_kind,
            "ricochet UDP server started"
        );
        Ok(UdpServer { workers })
    }

    /// The bound address (all per-core sockets share it).
    pub fn local_addr(&self) -> SocketAddr {
        self.workers.local_addr
    }

    /// The IO model in use.
    pub fn io_model(&self) -> IoModel {
        self.workers.io_model
    }

    /// The backend the workers use.
    pub fn backend_kind(&self) -> BackendKind {
        self.workers.backend_kind
    }

    /// Why that backend was chosen (including any fallback reason).
    pub fn selection_reason(&self) -> &str {
        &self.workers.selection_reason
    }

    /// Each socket's buffer sizes, requested and granted (one entry per worker socket).
    pub fn socket_info(&self) -> &[SocketInfo] {
        &self.workers.socket_info
    }

    /// Turn the link conditioner on with new settings, or off with `None`, on every worker
    /// (see [`UdpServerConfig::conditioner`]). Fails on invalid settings.
    pub fn set_conditioner(
        &self,
        conditioner: Option<super::conditioner::LinkConditioner>,
    ) -> Result<(), RuntimeError> {
        self.workers.set_conditioner(conditioner)
    }

    /// True while every worker runs. False once one has ended on its own: its handler
    /// panicked or its socket failed. The datagrams its socket receives are no longer
    /// handled, while the other workers carry on; [`Self::shutdown`] then returns why. A
    /// process that supervises its server polls this and restarts or exits.
    pub fn is_running(&self) -> bool {
        !self.workers.any_ended()
    }

    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Live counters of every worker (published every few loop turns).
    pub fn counters(&self) -> Vec<WorkerCounters> {
        self.workers.counters()
    }

    /// Stop every worker after it has handled what it already received and submitted its
    /// replies; join them and return their final counters.
    pub fn shutdown(mut self) -> Result<Vec<WorkerCounters>, RuntimeError> {
        self.workers.stop_and_join()
    }
}
