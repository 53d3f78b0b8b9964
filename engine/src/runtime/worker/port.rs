//! A worker's side of the socket: its backend and send batch (the send pump), and the counters
//! it keeps and publishes for health and the metrics endpoint.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ricochet_platform::{self as platform, Backend, SendBatch};

use super::context::UdpContext;
use crate::runtime::conditioner::Conditioner;
use crate::runtime::counters::{CounterCell, WorkerCounters};

/// The worker's backend, its send batch and its counters.
pub(super) struct Port {
    pub(super) index: usize,
    pub(super) backend: Box<dyn Backend>,
    pub(super) send: SendBatch,
    /// What the worker counted; published to `cell` every few turns.
    pub(super) counters: WorkerCounters,
    /// The live counters health and `/metrics` read.
    pub(super) cell: Arc<CounterCell>,
}

impl Port {
    /// A context outside datagram dispatch (a full batch is then submitted on the spot, or
    /// moved into `cond`'s queue when the conditioner is on).
    #[inline]
    pub(super) fn ctx<'a>(
        &'a mut self,
        now: Instant,
        cond: Option<&'a mut Conditioner>,
    ) -> UdpContext<'a> {
        UdpContext {
            worker: self.index,
            now,
            send: &mut self.send,
            backend: Some(self.backend.as_mut()),
            send_errors: &mut self.counters.send_errors,
            tick: None,
            tick_late: Duration::ZERO,
            cond,
        }
    }

    /// Submit what is left in the batch, waiting for room until `deadline`; what the socket
    /// still would not take then is counted as send errors and dropped.
    pub(super) fn finish_sends(&mut self, deadline: Instant) -> Result<(), platform::Error> {
        while !self.send.is_empty() {
            let sent = self.backend.flush(&mut self.send)?;
            if sent == 0 {
                if Instant::now() >= deadline {
                    self.counters.send_errors += self.send.len() as u64;
                    tracing::warn!(
                        worker = self.index,
                        dropped = self.send.len(),
                        "shutdown: socket would not take the last datagrams"
                    );
                    self.send.clear();
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        Ok(())
    }

    /// Take the backend's counts and publish the counters. `conditioner`: the link
    /// conditioner's drop totals (lost, over the queue limit) while one is on.
    pub(super) fn sync_counters(&mut self, conditioner: Option<(u64, u64)>) {
        let s = self.backend.stats();
        self.counters.datagrams_out = s.datagrams_out;
        self.counters.batches_in = s.batches_in;
        self.counters.batches_out = s.batches_out;
        self.counters.syscalls = s.syscalls;
        self.counters.send_errors = self.counters.send_errors.max(s.send_errors);
        if let Some(d) = self.backend.socket_drops() {
            self.counters.socket_drops = d;
        }
        if let Some((lost, queue)) = conditioner {
            self.counters.conditioner_lost = lost;
            self.counters.conditioner_queue_drops = queue;
        }
        self.cell.publish(&self.counters);
    }
}
