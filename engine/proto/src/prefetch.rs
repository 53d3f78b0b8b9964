//! Cache prefetch hints.
//!
//! A server or a `ClientSet` with a thousand sessions touches each session's state once per
//! tick or round trip, long after anything else kept it in cache, and every first read of a
//! line then waits on memory. Handling a datagram reads a dozen such lines one after another
//! (the connection, its sent-packet queue, its channels, its keys). A hint issued before the
//! embedder's receive system call lets those loads run during the call, and in parallel with
//! each other, instead of in series inside the handler.
//!
//! Hints never fault and never change what the program computes; on targets without a hint
//! instruction here they compile to nothing.

/// Bytes per cache line on the targets hinted here.
const LINE: usize = 64;

/// How far a prefetch hint on an endpoint reaches ([`super::Endpoint::prefetch`]). Each
/// stage reads memory the one before hinted, so an embedder issues them a little apart:
/// `Connection` for the state it will handle after next, `Parts` for the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PrefetchStage {
    /// The connection state itself. It reads only where that state lives (the endpoint's
    /// slot table), not the state.
    Connection,
    /// What the connection points to: its packet queues, channels and keys (reads the
    /// connection, which should be in cache by then).
    Parts,
}

/// Hints the CPU to load the memory of `value` itself (not what it points to) into its cache.
/// A hint only: it never faults and changes no result, and it compiles to nothing on targets
/// other than x86-64. It costs one instruction per 64-byte line of `value`: meant for a
/// struct, not for a large buffer, whose lines would evict what the hint was for.
#[inline]
pub(crate) fn prefetch<T: ?Sized>(value: &T) {
    bytes(
        (value as *const T).cast::<u8>(),
        std::mem::size_of_val(value),
    );
}

/// The first `len` bytes of a slice's elements (at most the slice).
#[inline]
pub(crate) fn front<T>(slice: &[T], len: usize) {
    bytes(
        slice.as_ptr().cast::<u8>(),
        std::mem::size_of_val(slice).min(len),
    );
}

/// The lines covering `len` bytes from `start`.
#[inline]
fn bytes(start: *const u8, len: usize) {
    for offset in line_offsets(start as usize, len) {
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
        assert_eq!(lines(128, 64), [128]);
        assert_eq!(lines(128, 65), [128, 192]);
        assert_eq!(lines(190, 3), [128, 192]);
        assert_eq!(lines(191, 1), [128]);
        assert_eq!(lines(100, 1400), (64..1500).step_by(64).collect::<Vec<_>>());
    }
}
