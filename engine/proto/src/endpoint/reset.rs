//! Stateless resets: a token-admitting server answers a connection packet it has no state
//! for with the session's reset; a client checks a reset against the token its server gave.

use std::net::SocketAddr;
use std::time::Instant;

use super::state::Endpoint;
use crate::wire::{self, Packet};
use crate::{Connection, ConnectionId, DropCause};

impl Endpoint {
    /// Answer a connection packet for `cid`, which this server has no state for, with the
    /// session's stateless reset: only when admitting by token (the reset key comes from the
    /// backend's key), only to a packet larger than the reset (no amplification, and a reset
    /// never answers a reset), and at most [`crate::TokenAdmission::max_resets_per_second`].
    /// Any id draws one, issued or guessed: ids are never reused (see [`ConnectionHandle`]), so
    /// the reset of an id that is not live ends no session, now or later, unless the id is
    /// guessed before it is issued (1 in 2^35 per guess, at most this rate of guesses).
    pub(super) fn send_reset(
        &mut self,
        now: Instant,
        to: SocketAddr,
        cid: ConnectionId,
        trigger: usize,
    ) {
        let Some(t) = self.tokens.as_ref() else {
            return;
        };
        let Some(reset) = t.reset.as_ref() else {
            return;
        };
        if trigger <= wire::RESET_LEN {
            return;
        }
        let second = self.now_ms(now) / 1000;
        if self.reset_budget.0 != second {
            self.reset_budget = (second, 0);
        }
        if self.reset_budget.1 >= t.max_resets_per_second {
            self.stats.resets_limited += 1;
            return;
        }
        self.reset_budget.1 += 1;
        let token = reset.token(cid);
        if self.queue_stateless(to, &Packet::StatelessReset { cid, token }) {
            self.stats.resets_sent += 1;
        }
    }

    /// A stateless reset from a server: the client connection talking to that server id
    /// checks its token. A genuine reset is exactly [`wire::RESET_LEN`] bytes (a server sends
    /// nothing else) and comes from the address the connection talks to; anything else is
    /// dropped before the token is compared.
    pub(super) fn handle_reset(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
    ) -> Result<(), DropCause> {
        let cid = match wire::decode_packet(datagram) {
            Ok(Packet::StatelessReset { cid, .. }) => cid,
            Err(wire::WireError::VersionMismatch(_)) => return Err(DropCause::VersionMismatch),
            _ => return Err(DropCause::Malformed),
        };
        if datagram.len() != wire::RESET_LEN {
            return Err(DropCause::Malformed);
        }
        let Some(&idx) = self.by_remote.get(&cid) else {
            return Err(DropCause::UnknownConnection);
        };
        let talks_to = self.slots[idx as usize]
            .conn
            .as_ref()
            .map(Connection::remote_addr);
        if talks_to != Some(from) {
            return Err(DropCause::Unauthenticated);
        }
        // The connection decodes it again: it can be driven without an endpoint too.
        let unused = SocketAddr::from(([0, 0, 0, 0], 0));
        let r = self
            .with_conn(idx, |c| c.handle_datagram(now, unused, datagram))
            .unwrap_or(Err(DropCause::UnknownConnection));
        self.touch(idx);
        r
    }
}
