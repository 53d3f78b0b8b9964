//! The connection slot table and the connection ids it issues: a slot per connection, reused
//! oldest first, and an id that names the slot and, sealed, how often it was used (see
//! [`ConnectionHandle`]).

use bytes::Bytes;
use rand::Rng;

use super::state::{Bound, ConnectionHandle, Endpoint, Slot};
use crate::keys::SEALED_ID_BITS;
use crate::{CloseReason, Connection, ConnectionId, Event};

/// Bits of a connection id that hold its slot index.
const SLOT_BITS: u32 = 20;

/// Most connections an endpoint holds at once (slots).
pub(super) const MAX_SLOTS: usize = 1 << SLOT_BITS;

/// The bits of the upper half of a connection id that the [`Router`] writes (32..=40 of the id).
pub(super) const ROUTER_BITS: u32 = 0x1ff;

/// A connection id from its parts: the slot field (slot XOR mask), the router's bits and the
/// 35 sealed bits (12 of them between the slot field and the router's bits, 23 above).
fn compose_cid(slot_field: u64, router: u32, sealed: u64) -> ConnectionId {
    let low = sealed & ((1 << (32 - SLOT_BITS)) - 1);
    let high = sealed >> (32 - SLOT_BITS);
    debug_assert!(high < 1 << (SEALED_ID_BITS - (32 - SLOT_BITS)));
    ConnectionId(
        (high << 41) | (u64::from(router & ROUTER_BITS) << 32) | (low << SLOT_BITS) | slot_field,
    )
}

impl Endpoint {
    /// The slot a connection id or handle names.
    pub(super) fn slot_of(&self, cid: u64) -> usize {
        ((cid ^ self.slot_mask) & (MAX_SLOTS as u64 - 1)) as usize
    }

    /// A connection, for its state and statistics.
    pub fn connection(&self, h: ConnectionHandle) -> Option<&Connection> {
        let idx = self.slot_of(h.0);
        self.slots
            .get(idx)?
            .conn
            .as_ref()
            .filter(|c| c.local_cid().0 == h.0)
    }

    pub(super) fn index_of(&self, h: ConnectionHandle) -> Option<u32> {
        self.connection(h).map(|_| self.slot_of(h.0) as u32)
    }

    /// Whether [`Self::alloc`] has a slot to give.
    pub(super) fn slot_available(&self) -> bool {
        !self.free.is_empty() || self.slots.len() < MAX_SLOTS
    }

    /// A slot for a new connection and that connection's id; `None` when every slot is taken.
    pub(super) fn alloc(&mut self) -> Option<(u32, ConnectionId)> {
        let idx = match self.free.pop_front() {
            Some(i) => {
                let slot = &mut self.slots[i as usize];
                slot.reuses = slot.reuses.wrapping_add(1);
                i
            }
            None if self.slots.len() < MAX_SLOTS => {
                self.slots.push(Slot {
                    conn: None,
                    dirty: false,
                    timer_stale: false,
                    bound: Bound::None,
                    reuses: 0,
                });
                (self.slots.len() - 1) as u32
            }
            None => return None,
        };
        let sealed = self.id_key.seal(idx, self.slots[idx as usize].reuses);
        let router = self.router.connection_id_bits(self.rng.random::<u32>() | 1);
        let cid = compose_cid(u64::from(idx) ^ self.slot_mask, router, sealed);
        Some((idx, cid))
    }

    /// A client connection that found no free slot: it ends at once, before it began.
    pub(super) fn no_slot(&mut self) -> ConnectionHandle {
        // No handle of a connection is 0 (the router's bits are never 0: its random input is
        // odd, and a runtime worker's set its tag bit), so this one names none.
        let h = ConnectionHandle(0);
        let message = Bytes::from_static(b"this endpoint holds as many connections as it can");
        self.events.push_back((
            h,
            Event::Closed {
                reason: CloseReason::ServerFull,
                by_peer: false,
                message,
            },
        ));
        h
    }
}
