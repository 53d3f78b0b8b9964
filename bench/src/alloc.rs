//! A counting global allocator for the bench binary: it lets `bench gate` weigh exactly the
//! heap a simulated server endpoint holds per session. The libraries never count allocations;
//! the binary installs this (`#[global_allocator]` in `main.rs`), and counting is off except
//! inside [`counting`], so the other benchmarks pay one relaxed load per allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering::Relaxed};

/// The system allocator, counting the bytes requested while counting is on.
#[derive(Debug)]
pub struct CountingAlloc;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static ON: AtomicBool = AtomicBool::new(false);

fn count(delta: isize) {
    if ON.load(Relaxed) {
        LIVE.fetch_add(delta, Relaxed);
    }
}

// SAFETY: every call forwards to the system allocator with the caller's arguments unchanged;
// the counter is bookkeeping only and never affects what is returned.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's (valid, non-zero-size) layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        // SAFETY: `ptr` came from this allocator (the system's) with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`; the new size is the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        p
    }
}

/// True when the counting allocator is the process's global allocator.
pub fn installed() -> bool {
    ON.store(true, Relaxed);
    let before = LIVE.load(Relaxed);
    let probe = std::hint::black_box(vec![0u8; 64]);
    let counted = LIVE.load(Relaxed) != before;
    drop(probe);
    ON.store(false, Relaxed);
    counted
}

/// Runs `f` with counting on; `f` gets a function that reads the live byte count.
pub fn counting<R>(f: impl FnOnce(&dyn Fn() -> isize) -> R) -> R {
    ON.store(true, Relaxed);
    let r = f(&|| LIVE.load(Relaxed));
    ON.store(false, Relaxed);
    r
}
