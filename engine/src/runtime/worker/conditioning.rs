//! The link conditioner's hooks in the worker loop: what a turn queued goes through its
//! outbound queue, received datagrams wait in its inbound queue until due, and new settings
//! from the server are taken between turns. Every hook is generic over the loop's [`Mode`]:
//! under [`crate::runtime::conditioner::Off`] it is a constant no-op (the code a build without
//! the feature runs), under [`crate::runtime::conditioner::On`] it does the work.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ricochet_platform::SendBatch;

use super::context::Service;
use super::port::Port;
use crate::runtime::conditioner::{self, Conditioner, ConditionerControl, Mode};

/// The worker's conditioner, the settings it follows and the drops of the ones it replaced.
pub(super) struct ConditionerLink {
    /// `None` when off.
    cond: Option<Box<Conditioner>>,
    ctl: Arc<ConditionerControl>,
    generation: u64,
    /// Drops counted by earlier conditioners (lost, over the queue limit).
    base: (u64, u64),
}

impl ConditionerLink {
    /// Worker `index`'s conditioner, on the settings `ctl` holds now.
    pub(super) fn new(ctl: Arc<ConditionerControl>, index: usize) -> Self {
        ConditionerLink {
            cond: ctl.get().and_then(|c| Conditioner::new(&c, index as u64)),
            generation: ctl.generation(),
            ctl,
            base: (0, 0),
        }
    }

    /// Whether the loop must run its [`conditioner::On`] instantiation.
    #[inline]
    pub(super) fn is_on(&self) -> bool {
        conditioner::is_on(&self.cond)
    }

    /// The conditioner under mode `M` (what a [`super::context::UdpContext`] holds).
    #[inline(always)]
    pub(super) fn current<M: Mode>(&mut self) -> Option<&mut Conditioner> {
        M::select(&mut self.cond)
    }

    /// When the conditioner next has something due, under mode `M`.
    #[inline(always)]
    pub(super) fn next_due<M: Mode>(&self) -> Option<Instant> {
        M::select_ref(&self.cond).and_then(|c| c.next_due())
    }

    /// Drop totals (lost, over the queue limit) of every conditioner so far, while one is on
    /// (under mode `M`).
    #[inline(always)]
    pub(super) fn drops<M: Mode>(&self) -> Option<(u64, u64)> {
        M::select_ref(&self.cond).map(|c| {
            let (lost, queue) = c.drops();
            (self.base.0 + lost, self.base.1 + queue)
        })
    }

    /// With the conditioner on: move what the turn queued into its outbound queue and put
    /// what is due back into the batch. Off: nothing.
    #[inline(always)]
    pub(super) fn condition_sends<M: Mode>(&mut self, now: Instant, send: &mut SendBatch) {
        if let Some(cond) = M::select(&mut self.cond) {
            cond.capture_release(now, send);
        }
    }

    /// Hand the held received datagrams that are due to the service.
    #[inline(always)]
    pub(super) fn deliver_held<M: Mode, S: Service>(
        &mut self,
        now: Instant,
        port: &mut Port,
        service: &mut S,
    ) {
        if M::ON && self.cond.is_some() {
            self.deliver_held_on(now, port, service);
        }
    }

    /// [`ConditionerLink::deliver_held`] with the conditioner on.
    #[inline(never)]
    fn deliver_held_on<S: Service>(&mut self, now: Instant, port: &mut Port, service: &mut S) {
        let Some(mut cond) = self.cond.take() else {
            return;
        };
        while let Some(held) = cond.inbound.pop_due(now) {
            let mut ctx = port.ctx(now, Some(&mut cond));
            service.on_datagram(&mut ctx, held.addr, &held.data);
            port.counters.datagrams_in += 1;
            port.counters.bytes_in += held.data.len() as u64;
            cond.inbound.recycle(held);
        }
        self.cond = Some(cond);
    }

    /// Take the settings the server set since the last turn, if it set any (one atomic load
    /// per turn, in both builds). A change of sessions conditioned on their own is applied in
    /// place; on any other change, held datagrams of the previous settings are delivered or
    /// sent at once (a change must not strand them). Returns true when the loop must switch
    /// to its other instantiation (the conditioner came or went).
    #[inline(always)]
    pub(super) fn reload_if_changed<M: Mode, S: Service>(
        &mut self,
        port: &mut Port,
        service: &mut S,
    ) -> bool {
        if self.ctl.generation() != self.generation {
            self.reload(port, service);
            // Opaque, so that a build without the feature (where `is_on` is a constant false)
            // keeps the switch path too and its loop stays the same code as `Off`'s here.
            return std::hint::black_box(self.is_on()) != M::ON;
        }
        false
    }

    #[cold]
    #[inline(never)]
    fn reload<S: Service>(&mut self, port: &mut Port, service: &mut S) {
        self.generation = self.ctl.generation();
        let plan = self.ctl.get();
        if let (Some(cond), Some(plan)) = (self.cond.as_deref_mut(), &plan) {
            // Only sessions of their own changed: the rest of the conditioner carries on.
            if cond.retune(plan) {
                return;
            }
        }
        let next = plan.and_then(|s| Conditioner::new(&s, port.index as u64));
        if let Some(mut old) = self.cond.take() {
            let far = Instant::now() + Duration::from_secs(3600);
            let (lost, queue) = old.drops();
            self.base = (self.base.0 + lost, self.base.1 + queue);
            while let Some(h) = old.inbound.pop_due(far) {
                let mut ctx = port.ctx(Instant::now(), None);
                service.on_datagram(&mut ctx, h.addr, &h.data);
            }
            send_all_held(&mut old, port);
        }
        self.cond = next;
        (
            port.counters.conditioner_lost,
            port.counters.conditioner_queue_drops,
        ) = self.base;
    }

    /// The worker's last turn: everything the conditioner holds goes into the batch now (the
    /// closes it sends must not be left behind), and its drops into the counters. Out of
    /// line in both builds (the loop's code must not depend on the feature).
    #[inline(never)]
    pub(super) fn finish(&mut self, port: &mut Port) {
        if let Some(mut cond) = self.cond.take() {
            send_all_held(&mut cond, port);
            let (lost, queue) = cond.drops();
            self.base = (self.base.0 + lost, self.base.1 + queue);
            (
                port.counters.conditioner_lost,
                port.counters.conditioner_queue_drops,
            ) = self.base;
        }
    }
}

/// Put every outbound datagram `cond` holds into the batch now, due or not (a change of
/// settings, or the worker's last turn).
fn send_all_held(cond: &mut Conditioner, port: &mut Port) {
    let far = Instant::now() + Duration::from_secs(3600);
    cond.capture(Instant::now(), &mut port.send);
    while let Some(h) = cond.outbound.pop_due(far) {
        if port.send.is_full() {
            let _ = port.backend.flush(&mut port.send);
        }
        let _ = port.send.push(h.addr, &h.data);
    }
}
