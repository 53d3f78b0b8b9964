//! Steady state allocates nothing: after a warm-up, rounds of "fill a send batch, poll it out,
//! poll the datagrams in" perform zero heap allocations on the polling thread, for every
//! backend, with and without GSO/GRO. A counting global allocator checks it (only for the
//! thread that turns counting on, so the test harness's own threads do not interfere).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ricochet_platform::{bind, open, probe, BackendConfig, SendBatch, SocketConfig};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: every call is forwarded to the system allocator unchanged; counting has no effect on
// the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn steady_state_send_and_receive_do_not_allocate() {
    let kinds = probe().backends();
    for kind in kinds {
        // (GRO + explicit GSO runs, coalescing of single pushes into GSO runs)
        for (gso, coalesce) in [(false, false), (true, false), (true, true), (false, true)] {
            let cfg = BackendConfig {
                kind,
                gro: gso,
                ..BackendConfig::default()
            };
            let mut sock = SocketConfig::new("127.0.0.1:0".parse().unwrap());
            sock.recv_buffer = Some(4 << 20);
            let mut rx = open(bind(&sock).unwrap(), &cfg).unwrap();
            let mut tx = open(bind(&sock).unwrap(), &cfg).unwrap();
            let dst = rx.socket_info().local_addr;
            let payload = vec![7u8; 1200];
            let run = vec![7u8; 1200 * 16];
            let mut batch = SendBatch::new(32);
            batch.set_coalescing(coalesce);
            let mut empty = SendBatch::new(1);
            let per_round = if gso || coalesce { 4 * 16 } else { 32 };
            let mut round = |counting: bool| {
                COUNTING.with(|c| c.set(counting));
                if coalesce {
                    for _ in 0..per_round {
                        batch.push(dst, &payload).unwrap();
                    }
                } else if gso {
                    for _ in 0..4 {
                        batch.push_segments(dst, 1200, &run).unwrap();
                    }
                } else {
                    for _ in 0..32 {
                        batch.push(dst, &payload).unwrap();
                    }
                }
                let mut spins = 0;
                while !batch.is_empty() {
                    tx.poll(&mut batch, Some(Duration::from_millis(1))).unwrap();
                    spins += 1;
                    assert!(spins < 10_000, "{kind}: send batch never drained");
                }
                let mut got = 0;
                while got < per_round {
                    let out = rx.poll(&mut empty, Some(Duration::from_secs(5))).unwrap();
                    assert!(out.received > 0 || out.woken, "{kind}: datagrams lost");
                    got += rx
                        .received()
                        .iter()
                        .map(|d| d.segments().count())
                        .sum::<usize>();
                }
                COUNTING.with(|c| c.set(false));
            };
            for _ in 0..20 {
                round(false);
            }
            // The counter works: a deliberate allocation while counting is seen.
            ALLOCS.store(0, Ordering::Relaxed);
            COUNTING.with(|c| c.set(true));
            drop(std::hint::black_box(Box::new(1u64)));
            COUNTING.with(|c| c.set(false));
            assert_eq!(ALLOCS.load(Ordering::Relaxed), 1);
            ALLOCS.store(0, Ordering::Relaxed);
            for _ in 0..200 {
                round(true);
            }
            let n = ALLOCS.load(Ordering::Relaxed);
            assert_eq!(
                n, 0,
                "{kind} gso={gso} coalesce={coalesce}: {n} allocations in 200 steady-state rounds"
            );
        }
    }
}
