//! The handle table: every object C holds is an id here, never a pointer.
//!
//! An id is the slot's index + 1 in its low 32 bits and the slot's generation in the high 32;
//! 0 is the null handle. Freeing a slot bumps its generation, so an id kept after its object
//! was destroyed (or one made up) finds nothing instead of freed memory or a newer object.
//! Lookups clone an `Arc` under the table's lock and run the call outside it.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::client::ClientCell;
use crate::server::ServerCell;
use crate::token::IssuerCell;

/// What a slot holds.
#[derive(Clone)]
pub(crate) enum Object {
    Client(Arc<ClientCell>),
    Server(Arc<ServerCell>),
    Issuer(Arc<IssuerCell>),
}

struct Slot {
    generation: u32,
    object: Option<Object>,
}

struct Table {
    slots: Vec<Slot>,
    free: Vec<u32>,
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    slots: Vec::new(),
    free: Vec::new(),
});

fn table() -> MutexGuard<'static, Table> {
    // The table's own updates never panic half-way; a poisoned lock still holds a sound table.
    TABLE.lock().unwrap_or_else(|p| p.into_inner())
}

fn split(id: u64) -> Option<(usize, u32)> {
    let index = (id & 0xffff_ffff) as usize;
    let generation = (id >> 32) as u32;
    (index != 0).then(|| (index - 1, generation))
}

/// Put `object` in the table; its id (never 0).
pub(crate) fn insert(object: Object) -> u64 {
    let mut t = table();
    let index = match t.free.pop() {
        Some(i) => i,
        None => {
            t.slots.push(Slot {
                generation: 1,
                object: None,
            });
            (t.slots.len() - 1) as u32
        }
    };
    let slot = &mut t.slots[index as usize];
    slot.object = Some(object);
    (u64::from(slot.generation) << 32) | u64::from(index + 1)
}

/// The object `id` names, if it is live.
pub(crate) fn get(id: u64) -> Option<Object> {
    let (index, generation) = split(id)?;
    let t = table();
    let slot = t.slots.get(index)?;
    (slot.generation == generation)
        .then(|| slot.object.clone())
        .flatten()
}

/// Take the object `id` names out of the table (the id is dead from now on), if it is live
/// and `accept` says it is of the right kind.
pub(crate) fn remove(id: u64, accept: impl Fn(&Object) -> bool) -> Option<Object> {
    let (index, generation) = split(id)?;
    let mut t = table();
    let slot = t.slots.get_mut(index)?;
    if slot.generation != generation || !slot.object.as_ref().is_some_and(&accept) {
        return None;
    }
    let object = slot.object.take();
    // A slot whose generation would wrap is retired rather than reused: an id never repeats.
    slot.generation = slot.generation.wrapping_add(1);
    if slot.generation != 0 {
        t.free.push(index as u32);
    }
    object
}
