//! The simulated game server ([`GameScenario`]) with only the server endpoint's protocol code
//! counted under callgrind: an exact instruction count per player-tick on a host without
//! hardware counters (issue 35).
//!
//! ```text
//! cargo build --release -p ricochet-testkit --example game_cost
//! valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no \
//!     --callgrind-out-file=game.cg target/release/examples/game_cost 100
//! callgrind_annotate --inclusive=yes game.cg | head -60
//! ```
//!
//! Arguments: players (default 100), then any of `insecure` (admit without connect tokens:
//! no packet protection), `acks-on-tick` (input ACKs ride the next snapshot), `warmup=S` and
//! `measured=S` (simulated seconds; the scenario's 5 and 2 by default). Instrumentation starts when the measured phase first enters the
//! server, and collection is on only inside the server's scope, so the totals are the server
//! endpoint's instructions over the measured phase: divide by the printed player-ticks.
//! Outside valgrind the requests are no-ops and the run just prints its outcome.
//!
//! Built as above, packets are protected by RustCrypto's pure-Rust AES-GCM (the sans-IO crate's
//! default); `--features aws-lc-rs` counts the aws-lc-rs AES-GCM the `ricochet` runtime ships.
//! The protocol's own instructions are the same in both.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ricochet_testkit::game::GameScenario;

/// `VG_USERREQ_TOOL_BASE('C', 'T')` of `valgrind/callgrind.h`.
const CALLGRIND_BASE: usize = (b'C' as usize) << 24 | (b'T' as usize) << 16;
const TOGGLE_COLLECT: usize = CALLGRIND_BASE + 2;
const START_INSTRUMENTATION: usize = CALLGRIND_BASE + 4;

static INSTRUMENTED: AtomicBool = AtomicBool::new(false);
static COLLECTING: AtomicBool = AtomicBool::new(false);

/// A valgrind client request with no arguments (the amd64 magic sequence of
/// `valgrind/valgrind.h`); a no-op on a real CPU.
#[cfg(target_arch = "x86_64")]
fn client_request(request: usize) {
    let args: [usize; 6] = [request, 0, 0, 0, 0, 0];
    // SAFETY: the four rotations of rdi sum to 128 bits (rdi ends as it started, and is declared
    // clobbered anyway) and `xchg rbx, rbx` changes nothing: on a CPU the sequence has no
    // effect. Under valgrind it reads the six words at rax, which point to `args`, live for
    // the block, and writes the request's result to rdx, declared clobbered.
    unsafe {
        std::arch::asm!(
            "rol rdi, 3",
            "rol rdi, 13",
            "rol rdi, 61",
            "rol rdi, 51",
            "xchg rbx, rbx",
            in("rax") args.as_ptr(),
            inout("rdx") 0usize => _,
            inout("rdi") 0usize => _,
            options(nostack, preserves_flags),
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn client_request(_request: usize) {}

/// The scenario's server scope: collection on inside the server's protocol code.
fn scope(on: bool) {
    if !INSTRUMENTED.swap(true, Ordering::Relaxed) {
        client_request(START_INSTRUMENTATION);
    }
    if COLLECTING.swap(on, Ordering::Relaxed) != on {
        client_request(TOGGLE_COLLECT);
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let players = args
        .next()
        .map_or(Ok(100), |a| a.parse::<usize>())
        .unwrap_or_else(|e| {
            eprintln!("game_cost: players: {e}");
            std::process::exit(2)
        });
    let flags: Vec<String> = args.collect();
    let tokens = !flags.iter().any(|f| f == "insecure");
    let acks_on_tick = flags.iter().any(|f| f == "acks-on-tick");
    let base = GameScenario::new(1);
    let seconds = |name: &str, default: Duration| {
        flags
            .iter()
            .find_map(|f| f.strip_prefix(name)?.parse::<f64>().ok())
            .map_or(default, Duration::from_secs_f64)
    };
    let scenario = GameScenario {
        players,
        tokens,
        acks_on_tick,
        warmup: seconds("warmup=", base.warmup),
        measured: seconds("measured=", base.measured),
        server_scope: Some(scope),
        ..base
    };
    match scenario.run() {
        Ok(out) => println!(
            "players {players} tokens {tokens} acks_on_tick {acks_on_tick} ticks {} player_ticks {} snapshots_received {} \
             inputs_lost {}",
            out.ticks, out.player_ticks, out.snapshots_received, out.inputs_lost
        ),
        Err(e) => {
            eprintln!("game_cost: {e}");
            std::process::exit(1)
        }
    }
}
