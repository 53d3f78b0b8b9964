//! How the embedder routes a server's sessions when several endpoints serve one address.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;

use crate::wire::CloseReason;

/// Decides what an endpoint writes into the connection ids it allocates and the cookies it
/// issues, so that the embedder can steer datagrams to the endpoint that owns their session.
///
/// A server that runs one [`Endpoint`](crate::Endpoint) per worker thread implements this (the
/// `ricochet` runtime tags each id with its worker and places new sessions on the least-loaded
/// worker); a lone endpoint uses [`NoRouting`]. The protocol never interprets what a router
/// writes: a connection id is opaque to everyone but the endpoint that allocated it, and the
/// route a cookie carries is covered by the cookie's MAC, so a client cannot choose it.
///
/// Install one with [`Endpoint::set_router`](crate::Endpoint::set_router) before the first
/// connection is opened.
pub trait Router: Send + fmt::Debug {
    /// The router's bits of a new local connection id: the endpoint passes 32 fresh random
    /// bits with bit 0 set, and keeps the low 9 bits of what this returns as bits 32..=40 of the
    /// id (the embedder's routing: a worker index and a flag, say); the rest of the id is the
    /// endpoint's (its slot, and 35 bits that make the id unique and unpredictable: see
    /// [`ConnectionHandle`](crate::ConnectionHandle)). Every datagram to this connection carries
    /// the id at [`wire::CID_OFFSET`](crate::wire::CID_OFFSET) (big-endian), where a socket
    /// filter can read those bits. Return a non-zero value in those 9 bits (keep bit 0 of the
    /// random input, or set a flag): no connection's id is 0.
    fn connection_id_bits(&mut self, random: u32) -> u32;

    /// A route for the session that a client hello may open, chosen when the server answers the
    /// hello: 16 bits that the challenge's cookie carries and the client's cookie echo returns at
    /// [`wire::ECHO_ROUTE_OFFSET`](crate::wire::ECHO_ROUTE_OFFSET) (big-endian), so the echo can
    /// be steered to the endpoint that should own the session. 0 means no route.
    fn route_new_session(&mut self) -> u16 {
        0
    }

    /// This endpoint accepted a session (server side).
    fn session_opened(&mut self) {}

    /// A session this endpoint accepted has ended.
    fn session_closed(&mut self) {}

    /// Server side: a client at `ip` proved its address and would open a session. `Ok(())`
    /// admits the session and counts it, `Err(reason)` refuses it with `reason` (which the
    /// client receives). The one place the session limits
    /// ([`ListenConfig::max_sessions`](crate::ListenConfig::max_sessions),
    /// [`ListenConfig::max_sessions_per_address`](crate::ListenConfig::max_sessions_per_address))
    /// are enforced: the router sees every session of the server, whether the endpoint is
    /// alone ([`NoRouting`] counts its sessions) or one of several (an embedder counts across
    /// all of them, with a [`SessionCounts`] they share). The default admits every session:
    /// a router that does not override it enforces no session limit.
    fn admit_session(
        &mut self,
        ip: IpAddr,
        limits: &crate::ListenConfig,
    ) -> Result<(), CloseReason> {
        let _ = (ip, limits);
        Ok(())
    }

    /// A session that [`Router::admit_session`] admitted has ended.
    fn release_session(&mut self, ip: IpAddr) {
        let _ = ip;
    }
}

/// The sessions a server holds, in total and per client IP, and the session limits checked
/// against them: what a [`Router`] counts in [`Router::admit_session`] and
/// [`Router::release_session`].
#[derive(Debug, Default, Clone)]
pub struct SessionCounts {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
}

impl SessionCounts {
    /// Counts a session from `ip` if `limits` allow it; refuses it with
    /// [`CloseReason::ServerFull`] or [`CloseReason::TooManyFromAddress`] otherwise.
    pub fn admit(&mut self, ip: IpAddr, limits: &crate::ListenConfig) -> Result<(), CloseReason> {
        if self.total >= limits.max_sessions {
            return Err(CloseReason::ServerFull);
        }
        let from_ip = self.per_ip.get(&ip).copied().unwrap_or(0);
        if from_ip >= limits.max_sessions_per_address {
            return Err(CloseReason::TooManyFromAddress);
        }
        self.total += 1;
        *self.per_ip.entry(ip).or_insert(0) += 1;
        Ok(())
    }

    /// A session from `ip` that [`SessionCounts::admit`] counted has ended.
    pub fn release(&mut self, ip: IpAddr) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.per_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_ip.remove(&ip);
            }
        }
    }

    /// Sessions counted now.
    pub fn sessions(&self) -> usize {
        self.total
    }
}

/// The router of a lone endpoint: random connection ids, no routes, and the endpoint's
/// sessions counted against its limits.
#[derive(Debug, Default, Clone)]
pub struct NoRouting {
    counts: SessionCounts,
}

impl Router for NoRouting {
    fn connection_id_bits(&mut self, random: u32) -> u32 {
        // Bit 8 is what the ricochet runtime sets on ids that carry a worker index; a lone
        // endpoint's ids leave it clear so they never read as routed (bits 0..=7 stay random).
        random & !0x100
    }

    fn admit_session(
        &mut self,
        ip: IpAddr,
        limits: &crate::ListenConfig,
    ) -> Result<(), CloseReason> {
        self.counts.admit(ip, limits)
    }

    fn release_session(&mut self, ip: IpAddr) {
        self.counts.release(ip);
    }
}
