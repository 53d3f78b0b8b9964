//! A counting global allocator for the bench binary: it lets `bench gate` weigh exactly the
//! heap a simulated server endpoint holds per session, and count the allocation calls its
//! steady state makes. The libraries never count allocations; the binary installs this
//! (`#[global_allocator]` in `main.rs`), and counting is off except inside [`counting`] (or
//! between [`set_on`] calls), so the other benchmarks pay one relaxed load per allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, Ordering::Relaxed};

/// The system allocator, counting the bytes requested while counting is on.
#[derive(Debug)]
pub struct CountingAlloc;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static ON: AtomicBool = AtomicBool::new(false);
/// Allocation calls (`alloc`, `alloc_zeroed`, `realloc`) while counting was on.
static CALLS: AtomicU64 = AtomicU64::new(0);
/// Bytes those calls asked for (a `realloc`'s new size).
static BYTES: AtomicU64 = AtomicU64::new(0);

fn count(delta: isize) {
    if ON.load(Relaxed) {
        LIVE.fetch_add(delta, Relaxed);
    }
}

fn count_call(size: usize) {
    if ON.load(Relaxed) && !trace::busy() {
        let n = CALLS.fetch_add(1, Relaxed);
        BYTES.fetch_add(size as u64, Relaxed);
        trace::sample(n);
    }
}

/// Where counted allocations come from: with `BENCH_ALLOC_TRACE=N` (read by [`trace::start`])
/// every Nth counted call records its call stack (`bench gate` and the scale server print them
/// to stderr). A diagnostic for finding allocations, not a measurement: the recording itself
/// allocates (uncounted) and slows the process down a lot.
pub mod trace {
    use std::cell::Cell;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::Mutex;

    static EVERY: AtomicU64 = AtomicU64::new(0);
    static STACKS: Mutex<Option<HashMap<String, u64>>> = Mutex::new(None);

    thread_local! {
        static BUSY: Cell<bool> = const { Cell::new(false) };
    }

    /// True while this thread records a stack (its own allocations are not counted).
    pub(super) fn busy() -> bool {
        BUSY.with(Cell::get)
    }

    /// Starts sampling if `BENCH_ALLOC_TRACE` names a period.
    pub fn start() {
        let every = std::env::var("BENCH_ALLOC_TRACE")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        EVERY.store(every, Relaxed);
    }

    pub(super) fn sample(n: u64) {
        let every = EVERY.load(Relaxed);
        if every == 0 || n % every != 0 {
            return;
        }
        BUSY.with(|b| b.set(true));
        let bt = std::backtrace::Backtrace::force_capture().to_string();
        // The frames of this workspace's code, innermost first, without the allocator's own.
        // The frames of this workspace's code (innermost first), after the innermost frame of
        // the container that allocated.
        let frames: Vec<&str> = bt
            .lines()
            .map(str::trim)
            .filter(|l| !l.starts_with("at ") && !l.contains("bench::alloc"))
            .map(|l| l.split_once(": ").map_or(l, |(_, f)| f))
            .collect();
        let kind = frames.iter().find(|f| {
            [
                "vec_deque",
                "Vec<",
                "hashbrown",
                "Box<",
                "bytes::",
                "BinaryHeap",
                "to_vec",
            ]
            .iter()
            .any(|k| f.contains(k))
        });
        let key: Vec<&str> = kind
            .into_iter()
            .copied()
            .chain(
                frames
                    .iter()
                    .filter(|f| f.contains("ricochet") || f.contains("bench::"))
                    .take(6)
                    .copied(),
            )
            .collect();
        if let Ok(mut m) = STACKS.lock() {
            *m.get_or_insert_with(HashMap::new)
                .entry(key.join("\n  <- "))
                .or_insert(0) += every;
        }
        BUSY.with(|b| b.set(false));
    }

    /// Stops sampling and returns the recorded stacks with their estimated calls, most first.
    pub fn finish() -> Vec<(String, u64)> {
        EVERY.store(0, Relaxed);
        let mut v: Vec<(String, u64)> = STACKS
            .lock()
            .ok()
            .and_then(|mut m| m.take())
            .map(|m| m.into_iter().collect())
            .unwrap_or_default();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
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
            count_call(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
            count_call(layout.size());
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
            count_call(new_size);
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

/// Allocation calls and the bytes they asked for, while counting was on, since the process
/// started (a difference of two readings counts what happened between them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Calls {
    /// `alloc`, `alloc_zeroed` and `realloc` calls.
    pub calls: u64,
    /// Bytes asked for (a `realloc` counts its new size).
    pub bytes: u64,
}

impl Calls {
    /// The totals so far.
    pub fn now() -> Self {
        Calls {
            calls: CALLS.load(Relaxed),
            bytes: BYTES.load(Relaxed),
        }
    }

    /// What happened since `earlier`.
    pub fn since(self, earlier: Calls) -> Calls {
        Calls {
            calls: self.calls - earlier.calls,
            bytes: self.bytes - earlier.bytes,
        }
    }
}

/// Turns counting on or off (for a scope a simulation enters and leaves many times, such as
/// [`ricochet_testkit::game::GameScenario::server_scope`]). Counting is process-wide: only
/// single-threaded runs count exactly one party's allocations.
pub fn set_on(on: bool) {
    ON.store(on, Relaxed);
}
