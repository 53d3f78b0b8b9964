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
//! # fn main() -> Result<(), ricochet::runtime::RuntimeError> {
//! let server = UdpServer::start(UdpServerConfig::new("127.0.0.1:7777".parse().unwrap()), |_| Echo)?;
//! println!("echoing on {} with {}", server.local_addr(), server.backend_kind());
//! server.shutdown()?;
//! # Ok(())
//! # }
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ricochet_platform::{
    self as platform, Backend, BackendKind, BoundSocket, SendBatch, SocketConfig, SocketInfo, Waker,
};

use super::config::{IdleStrategy, IoModel, UdpServerConfig};
use super::counters::{CounterCell, WorkerCounters};
use super::error::RuntimeError;
use super::timer::TimerWheel;

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

/// What a handler may do: send datagrams (batched), and learn where and when it runs.
pub struct UdpContext<'a> {
    worker: usize,
    now: Instant,
    send: &'a mut SendBatch,
    /// Present outside datagram dispatch: a full batch is then submitted on the spot.
    backend: Option<&'a mut dyn Backend>,
    send_errors: &'a mut u64,
}

impl UdpContext<'_> {
    /// Queue a datagram to `to`; the worker submits its batch once per loop turn.
    ///
    /// Fails with [`platform::Error::PayloadTooLarge`] for a payload over the protocol limit, and
    /// with [`platform::Error::BatchFull`] when a handler queues more than
    /// [`UdpServerConfig::send_batch`] datagrams while handling a single datagram.
    pub fn send(&mut self, to: SocketAddr, data: &[u8]) -> Result<(), platform::Error> {
        self.make_room()?;
        self.send
            .push(to, data)
            .inspect_err(|_| *self.send_errors += 1)
    }

    /// Queue a datagram written in place: `write` fills up to `max_len` bytes and returns how
    /// many it used.
    pub fn send_with(
        &mut self,
        to: SocketAddr,
        max_len: usize,
        write: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<usize, platform::Error> {
        self.make_room()?;
        self.send
            .push_with(to, max_len, write)
            .inspect_err(|_| *self.send_errors += 1)
    }

    fn make_room(&mut self) -> Result<(), platform::Error> {
        if self.send.is_full() {
            if let Some(backend) = self.backend.as_deref_mut() {
                backend.flush(self.send)?;
            }
        }
        Ok(())
    }

    /// The worker this handler runs on.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// The time the current loop turn started (one clock read per turn).
    pub fn now(&self) -> Instant {
        self.now
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimerEvent {
    Tick,
}

struct Worker<H> {
    index: usize,
    backend: Box<dyn Backend>,
    handler: H,
    send: SendBatch,
    timers: TimerWheel<TimerEvent>,
    stop: Arc<AtomicBool>,
    cell: Arc<CounterCell>,
    counters: WorkerCounters,
    idle: IdleStrategy,
    spin_for: Duration,
    tick: Option<Duration>,
}

/// While stopping, how long a worker keeps trying to submit replies the socket won't take.
const STOP_FLUSH_LIMIT: Duration = Duration::from_millis(500);

impl<H: DatagramHandler> Worker<H> {
    fn run(mut self) -> Result<WorkerCounters, platform::Error> {
        let start = Instant::now();
        if let Some(t) = self.tick {
            self.timers.insert(start + t, TimerEvent::Tick);
        }
        let mut last_work = start;
        let mut now = start;
        loop {
            let stopping = self.stop.load(Ordering::Acquire);
            let timeout = if stopping {
                Some(Duration::ZERO)
            } else {
                self.timeout(now, last_work)
            };
            let outcome = self.backend.poll(&mut self.send, timeout)?;
            now = Instant::now();
            self.counters.loop_turns += 1;
            if outcome.received > 0 {
                self.dispatch(now)?;
                last_work = now;
            } else if outcome.sent > 0 {
                last_work = now;
            }
            self.fire_timers(now);
            let worked = now.elapsed();
            self.counters.max_turn_ns = self.counters.max_turn_ns.max(worked.as_nanos() as u64);
            if stopping && outcome.received == 0 {
                // The socket queue is drained and every received datagram was handled: submit
                // the last replies, then leave.
                self.finish_sends()?;
                self.sync_counters();
                return Ok(self.counters);
            }
            if self.counters.loop_turns % 32 == 0 {
                self.sync_counters();
            }
        }
    }

    fn timeout(&self, now: Instant, last_work: Instant) -> Option<Duration> {
        let park = || {
            self.timers
                .next_deadline()
                .map(|d| d.saturating_duration_since(now))
        };
        match self.idle {
            IdleStrategy::Spin => Some(Duration::ZERO),
            IdleStrategy::Park => park(),
            IdleStrategy::Balanced => {
                if now.saturating_duration_since(last_work) < self.spin_for {
                    Some(Duration::ZERO)
                } else {
                    park()
                }
            }
        }
    }

    fn dispatch(&mut self, now: Instant) -> Result<(), platform::Error> {
        // Submit early when the batch fills past this mark, so replies never run out of room.
        let high_water = self.send.capacity() / 2;
        // The length is re-read each time: a flush may append datagrams it reaped on the way.
        let mut i = 0;
        while i < self.backend.received().len() {
            i += 1;
            {
                let Some(d) = self.backend.received().get(i - 1) else {
                    continue;
                };
                if d.truncated {
                    self.counters.truncated += 1;
                }
                let mut ctx = UdpContext {
                    worker: self.index,
                    now,
                    send: &mut self.send,
                    backend: None,
                    send_errors: &mut self.counters.send_errors,
                };
                for segment in d.segments() {
                    self.handler.on_datagram(&mut ctx, d.src, segment);
                    self.counters.datagrams_in += 1;
                }
            }
            if self.send.len() >= high_water {
                self.backend.flush(&mut self.send)?;
            }
        }
        Ok(())
    }

    fn fire_timers(&mut self, now: Instant) {
        let mut due = false;
        self.timers.advance(now, |TimerEvent::Tick| due = true);
        if !due {
            return;
        }
        let mut ctx = UdpContext {
            worker: self.index,
            now,
            send: &mut self.send,
            backend: Some(self.backend.as_mut()),
            send_errors: &mut self.counters.send_errors,
        };
        self.handler.on_tick(&mut ctx);
        if let Some(t) = self.tick {
            // Keep the cadence, but never queue up missed ticks after a stall.
            self.timers.insert(now + t, TimerEvent::Tick);
        }
    }

    fn finish_sends(&mut self) -> Result<(), platform::Error> {
        let deadline = Instant::now() + STOP_FLUSH_LIMIT;
        while !self.send.is_empty() {
            let sent = self.backend.flush(&mut self.send)?;
            if sent == 0 {
                if Instant::now() >= deadline {
                    self.counters.send_errors += self.send.len() as u64;
                    tracing::warn!(
                        worker = self.index,
                        dropped = self.send.len(),
                        "shutdown: socket would not take the last replies"
                    );
                    self.send.clear();
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        Ok(())
    }

    fn sync_counters(&mut self) {
        let s = self.backend.stats();
        self.counters.datagrams_out = s.datagrams_out;
        self.counters.batches_in = s.batches_in;
        self.counters.batches_out = s.batches_out;
        self.counters.syscalls = s.syscalls;
        self.counters.send_errors = self.counters.send_errors.max(s.send_errors);
        if let Some(d) = self.backend.socket_drops() {
            self.counters.socket_drops = d;
        }
        self.cell.publish(&self.counters);
    }
}

struct WorkerHandle {
    thread: Option<JoinHandle<Result<WorkerCounters, platform::Error>>>,
    waker: Waker,
    cell: Arc<CounterCell>,
    core: Option<usize>,
}

/// A running raw-UDP server. Dropping it stops and joins the workers; [`UdpServer::shutdown`]
/// does the same and reports how each worker ended.
pub struct UdpServer {
    local_addr: SocketAddr,
    backend_kind: BackendKind,
    selection_reason: String,
    socket_info: Vec<SocketInfo>,
    stop: Arc<AtomicBool>,
    workers: Vec<WorkerHandle>,
    io_model: IoModel,
}

impl std::fmt::Debug for UdpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpServer")
            .field("local_addr", &self.local_addr)
            .field("io_model", &self.io_model)
            .field("backend", &self.backend_kind)
            .field("workers", &self.workers.len())
            .finish()
    }
}

/// Bind the sockets a configuration asks for: one per worker (`SO_REUSEPORT`, same port) for
/// per-core, one shared by duplicate descriptors for shared.
fn bind_sockets(cfg: &UdpServerConfig, n: usize) -> Result<Vec<BoundSocket>, RuntimeError> {
    let mut sc = SocketConfig::new(cfg.bind);
    sc.recv_buffer = cfg.recv_buffer;
    sc.send_buffer = cfg.send_buffer;
    sc.reuse_port = cfg.io_model == IoModel::PerCore;
    let first = platform::bind(&sc)?;
    let mut sockets = Vec::with_capacity(n);
    // Later per-core sockets join the port the first one got (port 0 resolves to a real port).
    sc.addr = first.info().local_addr;
    for _ in 1..n {
        let s = match cfg.io_model {
            IoModel::PerCore => platform::bind(&sc)?,
            IoModel::Shared => first.try_clone()?,
        };
        sockets.push(s);
    }
    sockets.insert(0, first);
    Ok(sockets)
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
        config.validate()?;
        let n = config.resolved_threads();
        let sockets = bind_sockets(&config, n)?;
        let local_addr = sockets[0].info().local_addr;
        let socket_info: Vec<SocketInfo> = sockets.iter().map(|s| s.info().clone()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let cores = if config.pin_cores && config.io_model == IoModel::PerCore {
            core_affinity::get_core_ids().unwrap_or_default()
        } else {
            Vec::new()
        };
        let mut server = UdpServer {
            local_addr,
            backend_kind: BackendKind::Auto,
            selection_reason: String::new(),
            socket_info,
            stop: stop.clone(),
            workers: Vec::with_capacity(n),
            io_model: config.io_model,
        };
        for (index, socket) in sockets.into_iter().enumerate() {
            let handler = make_handler(index);
            let core = (!cores.is_empty()).then(|| cores[index % cores.len()]);
            let cell = Arc::new(CounterCell::default());
            let (ready_tx, ready_rx) = mpsc::sync_channel(1);
            let backend_config = config.backend.clone();
            let stop = stop.clone();
            let worker_cell = cell.clone();
            let (idle, spin_for, tick, send_batch) =
                (config.idle, config.spin_for, config.tick, config.send_batch);
            let thread = std::thread::Builder::new()
                .name(format!("ricochet-w{index}"))
                .spawn(move || {
                    if let Some(core) = core {
                        core_affinity::set_for_current(core);
                    }
                    // The backend is built on its own thread: io_uring rings may be tied to the
                    // thread that submits to them.
                    let backend = match platform::open(socket, &backend_config) {
                        Ok(b) => b,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return Ok(WorkerCounters::default());
                        }
                    };
                    let _ = ready_tx.send(Ok((
                        backend.kind(),
                        backend.selection_reason().to_owned(),
                        backend.waker(),
                    )));
                    let now = Instant::now();
                    Worker {
                        index,
                        backend,
                        handler,
                        send: SendBatch::new(send_batch),
                        timers: TimerWheel::new(now, Duration::from_millis(1)),
                        stop,
                        cell: worker_cell,
                        counters: WorkerCounters {
                            worker: index,
                            core: core.map(|c| c.id),
                            ..WorkerCounters::default()
                        },
                        idle,
                        spin_for,
                        tick,
                    }
                    .run()
                })
                .map_err(|source| RuntimeError::Spawn {
                    worker: index,
                    source,
                })?;
            let ready = ready_rx.recv().map_err(|_| RuntimeError::WorkerPanicked {
                worker: index,
                message: "worker exited before its backend was ready".into(),
            })?;
            match ready {
                Ok((kind, reason, waker)) => {
                    server.backend_kind = kind;
                    if server.selection_reason.is_empty() {
                        server.selection_reason = reason;
                    }
                    server.workers.push(WorkerHandle {
                        thread: Some(thread),
                        waker,
                        cell,
                        core: core.map(|c| c.id),
                    });
                }
                Err(e) => {
                    let _ = thread.join();
                    // Dropping `server` stops the workers already started.
                    return Err(RuntimeError::Worker {
                        worker: index,
                        source: e,
                    });
                }
            }
        }
        tracing::info!(
            addr = %server.local_addr,
            io_model = %server.io_model,
            workers = n,
            backend = %server.backend_kind,
            "ricochet UDP server started"
        );
        Ok(server)
    }

    /// The bound address (all per-core sockets share it).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The IO model in use.
    pub fn io_model(&self) -> IoModel {
        self.io_model
    }

    /// The backend the workers use.
    pub fn backend_kind(&self) -> BackendKind {
        self.backend_kind
    }

    /// Why that backend was chosen (including any fallback reason).
    pub fn selection_reason(&self) -> &str {
        &self.selection_reason
    }

    /// Each socket's buffer sizes, requested and granted (one entry per worker socket).
    pub fn socket_info(&self) -> &[SocketInfo] {
        &self.socket_info
    }

    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Live counters of every worker (published every few loop turns).
    pub fn counters(&self) -> Vec<WorkerCounters> {
        self.workers
            .iter()
            .enumerate()
            .map(|(i, w)| w.cell.read(i, w.core))
            .collect()
    }

    fn stop_and_join(&mut self) -> Result<Vec<WorkerCounters>, RuntimeError> {
        self.stop.store(true, Ordering::Release);
        for w in &self.workers {
            // A failed wake only delays the stop until the worker's next timeout.
            let _ = w.waker.wake();
        }
        let mut out = Vec::with_capacity(self.workers.len());
        let mut first_error = None;
        for (i, w) in self.workers.iter_mut().enumerate() {
            let Some(thread) = w.thread.take() else {
                continue;
            };
            match thread.join() {
                Ok(Ok(c)) => out.push(c),
                Ok(Err(source)) => {
                    first_error.get_or_insert(RuntimeError::Worker { worker: i, source });
                }
                Err(panic) => {
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    first_error.get_or_insert(RuntimeError::WorkerPanicked { worker: i, message });
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Stop every worker after it has handled what it already received and submitted its
    /// replies; join them and return their final counters.
    pub fn shutdown(mut self) -> Result<Vec<WorkerCounters>, RuntimeError> {
        self.stop_and_join()
    }
}

impl Drop for UdpServer {
    fn drop(&mut self) {
        if self.workers.iter().any(|w| w.thread.is_some()) {
            let _ = self.stop_and_join();
        }
    }
}
