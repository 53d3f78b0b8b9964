//! What a conditioner is built from ([`Plan`]) and the settings a server shares with its
//! workers ([`ConditionerControl`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::LinkConditioner;

/// What a [`super::Conditioner`] is built from: endpoint-wide settings, and per-session ones by the
/// peer's address.
pub(crate) trait Plan {
    /// (endpoint-wide settings, per-session settings by peer address).
    #[cfg_attr(not(feature = "conditioner"), allow(dead_code))]
    fn parts(&self) -> (Option<&LinkConditioner>, &[(SocketAddr, LinkConditioner)]);
}

impl Plan for LinkConditioner {
    fn parts(&self) -> (Option<&LinkConditioner>, &[(SocketAddr, LinkConditioner)]) {
        (Some(self), &[])
    }
}

/// A server's conditioning: endpoint-wide settings and the sessions conditioned on their own.
#[derive(Debug, Clone, Default)]
pub(crate) struct ServerPlan {
    all: Option<LinkConditioner>,
    peers: Vec<(SocketAddr, LinkConditioner)>,
}

impl Plan for ServerPlan {
    fn parts(&self) -> (Option<&LinkConditioner>, &[(SocketAddr, LinkConditioner)]) {
        (self.all.as_ref(), &self.peers)
    }
}

/// Settings shared between a server and its workers: a change bumps the generation, which
/// each worker compares once per loop turn.
#[derive(Debug, Default)]
pub(crate) struct ConditionerControl {
    generation: AtomicU64,
    settings: Mutex<ServerPlan>,
}

impl ConditionerControl {
    pub fn new(initial: Option<LinkConditioner>) -> Arc<Self> {
        Arc::new(ConditionerControl {
            generation: AtomicU64::new(0),
            settings: Mutex::new(ServerPlan {
                all: initial,
                peers: Vec::new(),
            }),
        })
    }

    fn update(&self, change: impl FnOnce(&mut ServerPlan)) {
        change(&mut self.settings.lock().unwrap_or_else(|p| p.into_inner()));
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The endpoint-wide settings (every session not conditioned on its own).
    pub fn set(&self, settings: Option<LinkConditioner>) {
        self.update(|p| p.all = settings);
    }

    /// One session's settings, by its peer's address (`None`: back to the endpoint-wide ones).
    /// The workers take the change at their next turn.
    pub fn set_peer(&self, addr: SocketAddr, settings: Option<LinkConditioner>) {
        self.update(|p| {
            p.peers.retain(|(a, _)| *a != addr);
            if let Some(s) = settings {
                p.peers.push((addr, s));
            }
        });
    }

    /// Bumped by every change. Read once per worker turn in both builds (compiled out, nothing
    /// can be set, but the turn that runs with the conditioner off must be the same code).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The plan in force, `None` when nothing is conditioned.
    pub fn get(&self) -> Option<ServerPlan> {
        let p = self.settings.lock().unwrap_or_else(|p| p.into_inner());
        (p.all.is_some_and(|c| !c.is_none()) || !p.peers.is_empty()).then(|| p.clone())
    }
}
