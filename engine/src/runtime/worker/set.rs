//! Starting and stopping workers: bind the sockets, spawn one pinned thread per worker with its
//! backend and service, and join them with their final counters.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ricochet_platform::{
    self as platform, BackendConfig, BackendKind, BoundSocket, SendBatch, SocketConfig, SocketInfo,
    Waker,
};

use super::conditioning::ConditionerLink;
use super::context::Service;
use super::pace::{IdleGap, WorkerSettings};
use super::port::Port;
use super::run::Worker;
use crate::runtime::conditioner::{ConditionerControl, LinkConditioner};
use crate::runtime::config::{IdleStrategy, IoModel, UdpServerConfig};
use crate::runtime::counters::{CounterCell, WorkerCounters};
use crate::runtime::error::RuntimeError;
use crate::runtime::timer::TimerWheel;

struct WorkerHandle {
    thread: Option<JoinHandle<Result<WorkerCounters, platform::Error>>>,
    waker: Waker,
    cell: Arc<CounterCell>,
    core: Option<usize>,
}

/// A set of running workers: what every server kind holds. Dropping it stops and joins them.
pub(crate) struct WorkerSet {
    pub local_addr: SocketAddr,
    pub io_model: IoModel,
    pub backend_kind: BackendKind,
    pub selection_reason: String,
    pub socket_info: Vec<SocketInfo>,
    stop: Arc<AtomicBool>,
    workers: Vec<WorkerHandle>,
    /// The link conditioner's settings, read by every worker.
    pub conditioner: Arc<ConditionerControl>,
}

/// Bind the sockets a configuration asks for: one per worker (`SO_REUSEPORT`, same port) for
/// per-core, one shared by duplicate descriptors for shared. Per-core sockets are steered by
/// `rules` (the service's own bytes naming the worker), then by source port.
fn bind_sockets(
    cfg: &UdpServerConfig,
    n: usize,
    rules: &[platform::SteerRule],
) -> Result<Vec<BoundSocket>, RuntimeError> {
    let mut sc = SocketConfig::new(cfg.bind);
    sc.recv_buffer = cfg.recv_buffer;
    sc.send_buffer = cfg.send_buffer;
    sc.reuse_port = cfg.io_model == IoModel::PerCore;
    let first = platform::bind(&sc)?;
    let mut sockets = Vec::with_capacity(n);
    // Later per-core sockets join the port the first one got (port 0 resolves to a real port).
    sc.addr = first.local_addr();
    for _ in 1..n {
        let s = match cfg.io_model {
            IoModel::PerCore => platform::bind(&sc)?,
            IoModel::Shared => first.try_clone()?,
        };
        sockets.push(s);
    }
    sockets.insert(0, first);
    if cfg.io_model == IoModel::PerCore && n > 1 && cfg.steer_by_source_port {
        if let Err(e) = platform::steer_reuseport(&sockets[0], n, rules) {
            tracing::warn!(error = %e, "per-core sockets keep the kernel's 4-tuple hash");
        }
    }
    Ok(sockets)
}

impl WorkerSet {
    /// Bind the sockets, start one worker per socket driving `make_service(i)`, and return once
    /// every worker's backend is up. `make_service` runs on the calling thread. `steering`:
    /// rules by which per-core sockets route datagrams that name their worker (see
    /// [`platform::steer_reuseport`]).
    pub(crate) fn start<S, F>(
        config: &UdpServerConfig,
        steering: &[platform::SteerRule],
        mut make_service: F,
    ) -> Result<WorkerSet, RuntimeError>
    where
        S: Service,
        F: FnMut(usize, SocketAddr) -> S,
    {
        config.validate()?;
        let n = config.resolved_threads();
        let sockets = bind_sockets(config, n, steering)?;
        let cores = if config.io_model == IoModel::PerCore {
            let cores = core_affinity::get_core_ids().unwrap_or_default();
            if config.pinning.pins(n, cores.len()) {
                cores
            } else {
                Vec::new()
            }
        } else {
            Vec::new()
        };
        let stop = Arc::new(AtomicBool::new(false));
        let mut set = WorkerSet {
            local_addr: sockets[0].local_addr(),
            io_model: config.io_model,
            backend_kind: BackendKind::Auto,
            selection_reason: String::new(),
            socket_info: sockets.iter().map(|s| s.info().clone()).collect(),
            stop: stop.clone(),
            workers: Vec::with_capacity(n),
            conditioner: ConditionerControl::new(config.conditioner),
        };
        let settings = WorkerSettings::from_config(config);
        for (index, socket) in sockets.into_iter().enumerate() {
            let service = make_service(index, set.local_addr);
            let core = (!cores.is_empty()).then(|| cores[index % cores.len()]);
            let cell = Arc::new(CounterCell::default());
            let (ready_tx, ready_rx) = mpsc::sync_channel(1);
            let spawn = SpawnArgs {
                index,
                core,
                socket,
                backend: config.backend.clone(),
                stop: stop.clone(),
                cell: cell.clone(),
                settings: settings.clone(),
                cond_ctl: set.conditioner.clone(),
            };
            let thread = std::thread::Builder::new()
                .name(format!("ricochet-w{index}"))
                .spawn(move || {
                    // Marks the worker ended however its thread leaves (a panic included).
                    let _ended = EndedGuard(spawn.cell.clone());
                    spawn.run(service, ready_tx)
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
                    set.backend_kind = kind;
                    if set.selection_reason.is_empty() {
                        set.selection_reason = reason;
                    }
                    set.workers.push(WorkerHandle {
                        thread: Some(thread),
                        waker,
                        cell,
                        core: core.map(|c| c.id),
                    });
                }
                Err(e) => {
                    let _ = thread.join();
                    // Dropping `set` stops the workers already started.
                    return Err(RuntimeError::Worker {
                        worker: index,
                        source: e,
                    });
                }
            }
        }
        Ok(set)
    }

    /// New link conditioner settings (or none) for every worker, from their next turn.
    pub(crate) fn set_conditioner(
        &self,
        conditioner: Option<LinkConditioner>,
    ) -> Result<(), RuntimeError> {
        if let Some(c) = &conditioner {
            c.validate()?;
        }
        self.conditioner.set(conditioner);
        for w in &self.workers {
            // A worker asleep until its next deadline takes the change now.
            let _ = w.waker.wake();
        }
        Ok(())
    }

    /// Number of workers.
    pub(crate) fn len(&self) -> usize {
        self.workers.len()
    }

    /// Every worker's live counter cell, by index (the metrics endpoint and health read them).
    pub(crate) fn cells(&self) -> Vec<Arc<CounterCell>> {
        self.workers.iter().map(|w| w.cell.clone()).collect()
    }

    /// The core each worker is pinned to, by index.
    pub(crate) fn cores(&self) -> Vec<Option<usize>> {
        self.workers.iter().map(|w| w.core).collect()
    }

    /// Wakers of every worker, by index.
    pub(crate) fn wakers(&self) -> Vec<Waker> {
        self.workers.iter().map(|w| w.waker.clone()).collect()
    }

    /// Live counters of every worker (published every few loop turns).
    pub(crate) fn counters(&self) -> Vec<WorkerCounters> {
        self.workers
            .iter()
            .enumerate()
            .map(|(i, w)| w.cell.read(i, w.core))
            .collect()
    }

    /// True once a worker thread has ended on its own (an I/O error or a panic in its
    /// handler): [`WorkerSet::stop_and_join`] reports why.
    pub(crate) fn any_ended(&self) -> bool {
        self.workers
            .iter()
            .any(|w| w.thread.as_ref().is_some_and(|t| t.is_finished()))
    }

    /// Stop every worker (each finishes what it received and what its service must still
    /// send), join them and return their final counters.
    pub(crate) fn stop_and_join(&mut self) -> Result<Vec<WorkerCounters>, RuntimeError> {
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
}

impl Drop for WorkerSet {
    fn drop(&mut self) {
        if self.workers.iter().any(|w| w.thread.is_some()) {
            let _ = self.stop_and_join();
        }
    }
}

/// Marks a worker's counter cell ended when dropped (health reads it).
struct EndedGuard(Arc<CounterCell>);

impl Drop for EndedGuard {
    fn drop(&mut self) {
        self.0.set_busy(None);
        self.0.set_ended();
    }
}

type Ready = Result<(BackendKind, String, Waker), platform::Error>;

/// Everything a worker thread needs besides its service.
struct SpawnArgs {
    index: usize,
    core: Option<core_affinity::CoreId>,
    socket: BoundSocket,
    backend: BackendConfig,
    stop: Arc<AtomicBool>,
    cell: Arc<CounterCell>,
    settings: WorkerSettings,
    cond_ctl: Arc<ConditionerControl>,
}

/// Wakes a worker of the tick strategy, which sleeps parked until its tick.
struct UnparkingWaker(std::thread::Thread);

impl platform::Wake for UnparkingWaker {
    fn wake(&self) -> std::io::Result<()> {
        self.0.unpark();
        Ok(())
    }
}

impl SpawnArgs {
    fn run<S: Service>(
        self,
        service: S,
        ready: mpsc::SyncSender<Ready>,
    ) -> Result<WorkerCounters, platform::Error> {
        if let Some(core) = self.core {
            core_affinity::set_for_current(core);
        }
        if let Some(slice) = self.settings.slice {
            // A hint: without it the worker still works, only with the default slice.
            match platform::sched::request_time_slice(slice) {
                Ok(true) => {}
                Ok(false) => tracing::debug!(
                    worker = self.index,
                    "the kernel ignores time-slice requests; the worker keeps the default slice"
                ),
                Err(e) => tracing::debug!(
                    worker = self.index,
                    error = %e,
                    "time-slice request refused; the worker keeps the default slice"
                ),
            }
        }
        // The backend is built, polled and dropped on this thread only: an io_uring ring may
        // then defer its completion work to this thread's own polls (`single_thread`).
        let backend_config = platform::BackendConfig {
            single_thread: true,
            ..self.backend
        };
        let backend = match platform::open(self.socket, &backend_config) {
            Ok(b) => b,
            Err(e) => {
                let _ = ready.send(Err(e));
                return Ok(WorkerCounters::default());
            }
        };
        let waker = if self.settings.idle == IdleStrategy::Tick {
            // A worker sleeping until its tick is parked, never blocked in the backend (every
            // poll of it is a zero-time one).
            Waker::new(Arc::new(UnparkingWaker(std::thread::current())))
        } else {
            backend.waker()
        };
        let _ = ready.send(Ok((
            backend.kind(),
            backend.selection_reason().to_owned(),
            waker,
        )));
        let now = Instant::now();
        let mut send = SendBatch::new(self.settings.send_batch);
        send.set_coalescing(self.settings.coalesce);
        Worker {
            port: Port {
                index: self.index,
                backend,
                send,
                counters: WorkerCounters {
                    worker: self.index,
                    core: self.core.map(|c| c.id),
                    ..WorkerCounters::default()
                },
                cell: self.cell,
            },
            service,
            cond: ConditionerLink::new(self.cond_ctl, self.index),
            next_sync: now,
            tick: None,
            idle_gap: IdleGap::default(),
            timers: TimerWheel::new(now, Duration::from_millis(1)),
            stop: self.stop,
            settings: self.settings,
        }
        .run()
    }
}
