//! Heap bytes a server endpoint holds per session, measured exactly in the simulator with a
//! counting allocator (this test binary's, not the library's): idle sessions, sessions with
//! 16 × 1 KiB echoes in flight, and the same sessions idle again afterwards (the buffers the
//! load grew are given back).
//!
//! It stays with the runtime although it names only `ricochet_testkit`: its bounds are those of
//! the runtime's build of `ricochet-proto` (the `aws-lc-rs` feature, whose AEAD contexts are
//! smaller on the heap than RustCrypto's, which `ricochet-proto` alone uses).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use ricochet_testkit::sessions::SessionsScenario;

/// Counts the bytes requested and not yet freed.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call forwards to the system allocator with the caller's arguments unchanged;
// the counter is bookkeeping only.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's (valid, non-zero-size) layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from this allocator (the system's) with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: `ptr` came from this allocator with `layout`; the new size is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Heap bytes per session the server endpoint of `s` holds at the end of its run, beyond what
/// an endpoint without sessions holds (`empty`).
fn per_session(s: &SessionsScenario, empty: usize) -> usize {
    let out = s.run().expect("simulation");
    assert_eq!(out.connected, s.clients, "every client connects");
    let before = LIVE.load(Ordering::Relaxed);
    drop(out.server);
    let held = (before - LIVE.load(Ordering::Relaxed)) as usize;
    (held - empty) / s.clients.max(1)
}

// One test function: the counter is process-wide, so measurements must not run in parallel.
#[test]
fn heap_bytes_per_session_idle_loaded_and_idle_again() {
    let empty = per_session(
        &SessionsScenario {
            clients: 0,
            ..SessionsScenario::new(1)
        },
        0,
    );
    let idle = SessionsScenario {
        clients: 1000,
        ..SessionsScenario::new(1)
    };
    let loaded = SessionsScenario {
        load: Some((16, 1024)),
        ..idle.clone()
    };
    let after = SessionsScenario {
        settle_after_load: Duration::from_secs(3),
        ..loaded.clone()
    };
    let idle_b = per_session(&idle, empty);
    let loaded_b = per_session(&loaded, empty);
    let after_b = per_session(&after, empty);
    eprintln!("heap per session: idle {idle_b} B, 16 x 1 KiB in flight {loaded_b} B, idle after {after_b} B");
    // The per-connection RTT histogram alone was about 150 KB.
    assert!(idle_b <= 3 * 1024, "idle: {idle_b} B per session");
    // 16 KiB of it is the echoed messages themselves.
    assert!(loaded_b <= 32 * 1024, "loaded: {loaded_b} B per session");
    assert!(
        loaded_b > 16 * 1024,
        "the load was not in flight: {loaded_b} B"
    );
    // Idle again: the send, receive and FEC buffers the load grew were given back.
    assert!(
        after_b <= idle_b + 256,
        "after the load: {after_b} B vs {idle_b} B idle"
    );
    // Allocation is deterministic: the same run holds the same bytes.
    assert_eq!(per_session(&idle, empty), idle_b);

    // Protected sessions (keys, replay windows) after the same load, idle again.
    let secure = SessionsScenario {
        test_session_secret: Some([9; 32]),
        ..after.clone()
    };
    let secure_b = per_session(&secure, empty);
    eprintln!("heap per protected session, idle after the load: {secure_b} B");
    assert!(secure_b <= 4 * 1024, "protected: {secure_b} B per session");

    // The production path: connect tokens (the server keeps what the token said of the
    // client, and a table of used tokens).
    let tokens = SessionsScenario {
        tokens: true,
        ..after.clone()
    };
    let empty_tokens = per_session(
        &SessionsScenario {
            clients: 0,
            tokens: true,
            ..SessionsScenario::new(1)
        },
        0,
    );
    let tokens_b = per_session(&tokens, empty_tokens);
    eprintln!(
        "heap per token session, idle after the load: {tokens_b} B (server without sessions: {empty_tokens} B)"
    );
    // Keys, replay windows and what the token said of the client come on top of the state
    // above.
    assert!(
        tokens_b <= 5 * 1024,
        "token sessions: {tokens_b} B per session"
    );
}
