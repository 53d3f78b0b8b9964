//! `bench`: Ricochet's benchmark, as a library the binary and the tests share.
//!
//! - [`udp`]: the closed-loop UDP echo (message format, accounting, clients, servers, runs).
//! - [`relay`]: the impairment relay (the simulator's impairment model on real sockets).
//! - [`rudp`]: the RUDP complete-message echo over the relay (or direct).
//! - [`scale`]: many sessions on one server (`bench sessions`) and the game tick (`bench game`),
//!   the server in a child process.
//! - [`schema`]: the versioned JSON result schema; [`host`]: host/build metadata and process
//!   usage; [`kernel`]: kernel counters; [`output`]: result paths and text tables.
//! - [`alloc`]: the counting allocator the binary installs (heap per session, exact);
//! - [`gate`]: the CI regression gate; [`report`]: `PERFORMANCE.md` from `results/`.
//! - [`commands`]: one module per subcommand.

pub mod alloc;
pub mod commands;
pub mod gate;
pub mod host;
pub mod kernel;
pub mod output;
pub mod relay;
pub mod report;
pub mod rudp;
pub mod scale;
pub mod schema;
pub mod udp;
