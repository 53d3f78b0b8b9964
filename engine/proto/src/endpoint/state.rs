//! The endpoint's state: the [`Endpoint`] struct, the handles it gives out, and the parts its
//! rooms share (the connection slots, token admission). The rooms import this file and
//! implement the behaviour over it; `mod.rs` (the orchestrator and public API) imports the
//! rooms.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Instant;

use rand_chacha::ChaCha8Rng;

use super::config::{EndpointConfig, EndpointStats};
use crate::admission::{ResetKey, TokenLedger};
use crate::keys::IdKey;
use crate::recv::SharedBudgets;
use crate::routing::Router;
use crate::timers::TimerQueue;
use crate::token::TokenKey;
use crate::wire;
use crate::wire::CloseReason;
use crate::{Connection, ConnectionId, Event, PrefetchStage};

/// Identifies a connection of an endpoint: its local connection id. The low 20 bits are its
/// slot (XORed with a random mask the endpoint draws when it is made), bits 32..=40 are the
/// [`Router`]'s, and the other 35 are a permutation, under a key the endpoint draws when it is
/// made, of the count of the slot's uses. A handle kept after its connection ended names
/// nothing: a newer connection in the same slot has another use count, so another id, for
/// 2^32 uses of that slot. The ids of another endpoint, or of this server after a restart, are
/// those of another mask and key: they repeat none of these but by chance (see
/// `docs/security.md` for the odds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectionHandle(pub u64);

/// Largest stateless reply: a tagged refusal with the longest message.
pub(super) const STATELESS_MAX: usize =
    wire::REFUSE_LEN + wire::MAX_REFUSE_MESSAGE + wire::HANDSHAKE_TAG_LEN;

/// The longest the endpoint's queues grew in one trim window (see `Endpoint::shrink_queues`).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct QueuePeaks {
    pub(super) dirty: usize,
    pub(super) events: usize,
    pub(super) stateless: usize,
}

/// A sans-IO endpoint (client, server or both).
#[derive(Debug)]
pub struct Endpoint {
    pub(super) cfg: EndpointConfig,
    pub(super) base: Instant,
    /// When the endpoint was made: `poll_timeout` reports it for "due now" (no `now` an
    /// embedder passes is earlier).
    pub(super) born: Instant,
    pub(super) rng: ChaCha8Rng,
    pub(super) slots: Vec<Slot>,
    /// Freed slots, reused oldest first: a slot's reuse count then wraps as late as it can.
    pub(super) free: VecDeque<u32>,
    pub(super) by_client: HashMap<(SocketAddr, ConnectionId), ConnectionHandle>,
    /// Set by [`Self::stop_accepting`] (`Shutdown`) or [`Self::start_draining`] (`Draining`):
    /// the reason every new client is refused with.
    pub(super) stopped_accepting: Option<CloseReason>,
    /// Handshake counters per hashed source address (allocated by the first hello: a client
    /// endpoint never needs them).
    pub(super) rate: Box<[(u64, u32)]>,
    pub(super) rate_salt: u64,
    /// Cookie keys are derived per rotation period from this secret, so the endpoints of one
    /// server's workers can share it and verify each other's cookies.
    pub(super) cookie_secret: [u8; 32],
    /// The last two derived period keys (current and previous): a hello or an echo then
    /// costs one keyed hash (the cookie), not two.
    pub(super) epoch_keys: [Option<(u64, [u8; 32])>; 2],
    pub(super) stateless: VecDeque<(SocketAddr, [u8; STATELESS_MAX], usize)>,
    pub(super) dirty: VecDeque<u32>,
    /// The connection that sent the last datagram, and how many it sent in a row.
    pub(super) burst: (u32, usize),
    pub(super) timers: TimerQueue,
    pub(super) events: VecDeque<(ConnectionHandle, Event)>,
    /// The longest the queues above grew in the current trim window (`[0]`) and the one
    /// before (`[1]`), and when the current window ends: see `Endpoint::shrink_queues`.
    pub(super) peaks: [QueuePeaks; 2],
    pub(super) peaks_until: Instant,
    /// Where small received messages are cut from (`recv::message_bytes`): lent to the
    /// connection a datagram is for.
    pub(super) recv_arena: bytes::BytesMut,
    /// RTT samples (µs) for [`Endpoint::drain_rtt_samples`].
    pub(super) rtt_samples: Vec<u32>,
    /// The reassembly and FEC retention budgets all connections share (lent to each
    /// connection for the length of a call, see `with_conn`).
    pub(super) shared: SharedBudgets,
    pub(super) stats: EndpointStats,
    /// What goes into the ids and cookies this endpoint issues (see [`Router`]).
    pub(super) router: Box<dyn Router>,
    /// Seals a slot's use count into the ids this endpoint issues (see [`ConnectionHandle`]).
    pub(super) id_key: IdKey,
    /// XORed into the slot field of every id this endpoint issues: with `id_key`, what makes
    /// its ids another boot's than those of this server before a restart.
    pub(super) slot_mask: u64,
    /// Token admission (server in token mode).
    pub(super) tokens: Option<TokenState>,
    /// The tokens accepted so far (see [`TokenLedger`]).
    pub(super) ledger: Box<dyn TokenLedger>,
    /// Unix time (ms) at an instant: the embedder's wall clock, read by the embedder.
    pub(super) unix_anchor: Option<(Instant, u64)>,
    /// Stateless resets sent in the current second: (second, count).
    pub(super) reset_budget: (u64, u32),
    /// Client side: connections by their server's connection id (for stateless resets).
    pub(super) by_remote: HashMap<ConnectionId, u32>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // The secret every cookie key derives from, and the cookie keys derived last. The
        // generator the secret may have been drawn from is not cleared: `rand_chacha` offers
        // no way to, and its type is not this crate's to overwrite.
        zeroize::Zeroize::zeroize(&mut self.cookie_secret);
        for (_, key) in self.epoch_keys.iter_mut().flatten() {
            zeroize::Zeroize::zeroize(key);
        }
        // The sessions still open end with the endpoint: its router hears so, as it does when
        // one closes, so that counts it shares (a multi-worker server's limits and placement)
        // do not keep an endpoint's sessions after it is gone (its worker's handler panicked).
        for slot in &self.slots {
            if let Bound::Accepted(from, _) = slot.bound {
                self.router.session_closed();
                self.router.release_session(from.ip());
            }
        }
    }
}

#[derive(Debug)]
pub(super) struct Slot {
    pub(super) conn: Option<Connection>,
    pub(super) dirty: bool,
    /// The connection changed since its deadline in `timers` was computed (see
    /// `Endpoint::refresh_timer`); only ever set while `dirty`.
    pub(super) timer_stale: bool,
    /// What the endpoint's maps know the connection by besides its own id (one field for
    /// both sides: a connection is either).
    pub(super) bound: Bound,
    /// How many times the slot was reused (sealed into its connection's id; wraps after 2^32).
    pub(super) reuses: u32,
}

/// A slot connection's key in the endpoint's maps other than its own id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bound {
    /// Neither yet: a client that has not learned its server's id, or an empty slot.
    None,
    /// Server side: the (client address, client cid) this connection was accepted for
    /// (`Endpoint::by_client`).
    Accepted(SocketAddr, ConnectionId),
    /// Client side: the server's connection id, once known (stateless resets name it;
    /// `Endpoint::by_remote`).
    Remote(ConnectionId),
}

impl Slot {
    pub(super) fn prefetch(&self, stage: PrefetchStage) {
        match stage {
            PrefetchStage::Connection => crate::prefetch::prefetch(self),
            PrefetchStage::Parts => {
                if let Some(conn) = &self.conn {
                    conn.prefetch_parts();
                }
            }
        }
    }
}

/// What a token-admitting endpoint keeps from its [`crate::TokenAdmission`].
#[derive(Debug)]
pub(super) struct TokenState {
    pub(super) key: TokenKey,
    /// The key before the last rotation, still accepted until the instant given.
    pub(super) previous: Option<(TokenKey, Instant)>,
    pub(super) protocol_id: u64,
    pub(super) public_addresses: Vec<SocketAddr>,
    pub(super) reset: Option<ResetKey>,
    pub(super) max_resets_per_second: u32,
}
