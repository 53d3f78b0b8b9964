//! CPU cache hints.
//!
//! A runtime that walks many cold states in turn (a `ClientSet`'s members, each touched once
//! per round trip, long after anything else kept it in cache) waits on memory at every first
//! read of a line. A hint for the next state, issued while it works on the current one, lets
//! those loads run meanwhile. (The protocol core hints its own parts through
//! `ricochet_proto::Endpoint::prefetch`.)

/// Bytes per cache line on the targets hinted here.
const LINE: usize = 64;

/// Hints the CPU to load the memory of `value` itself (not what it points to) into its cache.
/// A hint only: it never faults and changes no result, and it compiles to nothing on targets
/// other than x86-64. It costs one instruction per 64-byte line of `value`: meant for a
/// struct, not for a large buffer, whose lines would evict what the hint was for.
#[inline]
pub fn prefetch<T: ?Sized>(value: &T) {
    let start = (value as *const T).cast::<u8>();
    for offset in line_offsets(start as usize, std::mem::size_of_val(value)) {
        line(start.wrapping_add(offset));
    }
}

/// Offsets from `start` that fall on each line of `start..start + len`, once per line.
#[inline]
fn line_offsets(start: usize, len: usize) -> impl Iterator<Item = usize> {
    let first = start - start % LINE;
    // `start + len` cannot overflow: `len` is the size of a value that lives at `start`.
    let lines = if len == 0 {
        0
    } else {
        (start + len - 1 - first) / LINE + 1
    };
    // `first` may precede `start`: the offset wraps, and `wrapping_add` brings it back.
    (0..lines).map(move |k| (first + k * LINE).wrapping_sub(start))
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn line(p: *const u8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // SAFETY: SSE is part of the x86-64 baseline, so the instruction exists on every
    // x86-64 CPU; a prefetch is a hint, not a load, and cannot fault whatever the address.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) };
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn line(_: *const u8) {}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(start: usize, len: usize) -> Vec<usize> {
        line_offsets(start, len)
            .map(|o| start.wrapping_add(o))
            .collect()
    }

    #[test]
    fn every_line_of_the_extent_once() {
        assert_eq!(lines(128, 0), Vec::<usize>::new());
        assert_eq!(lines(128, 1), [128]);
        assert_eq!(lines(128, 65), [128, 192]);
        assert_eq!(lines(190, 3), [128, 192]);
        assert_eq!(lines(100, 1400), (64..1500).step_by(64).collect::<Vec<_>>());
    }
}
