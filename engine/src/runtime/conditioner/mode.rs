//! How the hot loops meet the conditioner: the [`Mode`] they are instantiated for.

use super::Conditioner;

/// Which instantiation of a hot loop runs (the worker's turns, a client's drive): the loops
/// are generic over it and pick one per turn. [`Off`] makes every conditioner hook a constant
/// no-op, so the loop that runs while the conditioner is off is the very code a build without
/// the feature runs (where [`On`] is never instantiated); [`On`] hands traffic to the
/// conditioner. Switching happens between turns, where nothing received is pending.
pub(crate) trait Mode {
    /// Whether this instantiation conditions traffic.
    const ON: bool;

    /// The conditioner in `slot` under this mode: always `None` for [`Off`].
    #[inline(always)]
    fn select(slot: &mut Option<Box<Conditioner>>) -> Option<&mut Conditioner> {
        if Self::ON {
            slot.as_deref_mut()
        } else {
            None
        }
    }

    /// [`Mode::select`] for reading.
    #[inline(always)]
    fn select_ref(slot: &Option<Box<Conditioner>>) -> Option<&Conditioner> {
        if Self::ON {
            slot.as_deref()
        } else {
            None
        }
    }
}

/// The loops' instantiation with the conditioner off (the only one without the feature).
pub(crate) struct Off;

impl Mode for Off {
    const ON: bool = false;
}

/// The loops' instantiation with a conditioner present.
pub(crate) struct On;

impl Mode for On {
    const ON: bool = true;
}

/// Whether `slot` holds a conditioner that the [`On`] instantiation must run (never without
/// the feature, so that build instantiates [`Off`] only).
#[inline(always)]
pub(crate) fn is_on(slot: &Option<Box<Conditioner>>) -> bool {
    cfg!(feature = "conditioner") && slot.is_some()
}
