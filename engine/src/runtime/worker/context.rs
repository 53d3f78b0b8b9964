//! What a worker's service sees: [`UdpContext`] (queue datagrams in the worker's send batch,
//! learn where and when it runs) and the [`Service`] trait a worker drives.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ricochet_platform::{self as platform, Backend, SendBatch};
use ricochet_proto::PrefetchStage;

use crate::runtime::conditioner::Conditioner;
#[cfg(doc)]
use crate::runtime::{UdpServerConfig, WorkerCounters};

/// What a handler may do: send datagrams (batched), and learn where and when it runs.
pub struct UdpContext<'a> {
    pub(crate) worker: usize,
    pub(crate) now: Instant,
    pub(crate) send: &'a mut SendBatch,
    /// Present outside datagram dispatch: a full batch is then submitted on the spot.
    pub(crate) backend: Option<&'a mut dyn Backend>,
    pub(crate) send_errors: &'a mut u64,
    /// The index of the tick being run (`Service::on_tick` only).
    pub(crate) tick: Option<u64>,
    /// How long after its due time the tick being run started (zero outside `on_tick`).
    pub(crate) tick_late: Duration,
    /// The link conditioner, when on: a full batch is moved into its queue, not submitted.
    pub(crate) cond: Option<&'a mut Conditioner>,
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

    /// Queue a datagram written in place whose destination `write` decides as it writes (see
    /// [`SendBatch::push_in_place`]): `write` gets `max_len` bytes of room (not zeroed) and
    /// returns the destination and length, or `None` to send nothing. Returns the length queued.
    ///
    /// Fails with [`platform::Error::BatchFull`] without calling `write` when no entry is free
    /// (mid-dispatch), and with [`platform::Error::PayloadTooLarge`] for a datagram over its
    /// destination's limit (counted as a send error, like [`UdpContext::send`]'s).
    pub fn send_in_place(
        &mut self,
        max_len: usize,
        write: impl FnOnce(&mut [u8]) -> Option<(SocketAddr, usize)>,
    ) -> Result<Option<usize>, platform::Error> {
        self.make_room()?;
        self.send.push_in_place(max_len, write).inspect_err(|e| {
            // A full batch leaves the datagram unwritten: the caller still has it to send.
            if !matches!(e, platform::Error::BatchFull { .. }) {
                *self.send_errors += 1;
            }
        })
    }

    /// True when the next send may have to wait for room (mid-dispatch, batch full).
    pub fn is_send_batch_full(&self) -> bool {
        self.send.is_full() && self.backend.is_none()
    }

    #[inline]
    fn make_room(&mut self) -> Result<(), platform::Error> {
        if self.send.is_full() {
            self.make_room_now()?;
        }
        Ok(())
    }

    /// The batch is full: move it into the conditioner's queue when one is on, else submit it
    /// (outside dispatch). Out of line, so the send path is the same code with the
    /// conditioner built in or not.
    #[cold]
    #[inline(never)]
    fn make_room_now(&mut self) -> Result<(), platform::Error> {
        if let Some(cond) = self.cond.as_deref_mut() {
            cond.capture(self.now, self.send);
        } else if let Some(backend) = self.backend.as_deref_mut() {
            backend.flush(self.send)?;
        }
        Ok(())
    }

    /// The worker this handler runs on.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// In [`DatagramHandler::on_tick`](crate::runtime::DatagramHandler::on_tick), the index of the
    /// tick being run: tick `k` was due at the worker's start plus `k` ticks, the first is 1.
    /// A tick that came too late to run before the next was due is skipped (and counted in
    /// [`WorkerCounters::ticks_skipped`]), so the indices then jump: a fixed-step simulation
    /// advances by the difference from the last index it saw. `None` outside `on_tick`.
    pub fn tick_index(&self) -> Option<u64> {
        self.tick
    }

    /// In `on_tick`, how long after its due time the tick being run started (this turn's
    /// [`UdpContext::now`] minus the due time of tick [`UdpContext::tick_index`]); `None`
    /// outside `on_tick`.
    pub fn tick_lateness(&self) -> Option<Duration> {
        self.tick.map(|_| self.tick_late)
    }

    /// The time the current loop turn started (one clock read per turn).
    pub fn now(&self) -> Instant {
        self.now
    }
}

/// What a worker drives. One instance per worker, owned by its thread.
pub(crate) trait Service: Send + 'static {
    /// One received datagram (or GRO segment).
    fn on_datagram(&mut self, ctx: &mut UdpContext<'_>, from: SocketAddr, data: &[u8]);

    /// A hint that `data` will be handled soon: the dispatch loop issues
    /// [`PrefetchStage::Connection`] two datagrams ahead and [`PrefetchStage::Parts`] one
    /// ahead (see `Endpoint::prefetch_for`). The default does nothing.
    fn prefetch(&self, _data: &[u8], _stage: PrefetchStage) {}

    /// The configured tick came.
    fn on_tick(&mut self, ctx: &mut UdpContext<'_>);

    /// End of a loop turn, after datagrams and ticks: produce whatever output is due.
    fn on_turn_end(&mut self, ctx: &mut UdpContext<'_>);

    /// The earliest time the service needs `on_turn_end` to run even without I/O.
    fn next_deadline(&mut self) -> Option<Instant>;

    /// The server is stopping. Called every turn from then on; return `true` once the service
    /// needs the socket no more (e.g. every session's close has been sent).
    fn on_stop(&mut self, ctx: &mut UdpContext<'_>) -> bool;

    /// How long the stop may take before the worker gives up on what `on_stop` still waits
    /// for; `None`: the worker's own limit.
    fn stop_limit(&self) -> Option<Duration> {
        None
    }
}
