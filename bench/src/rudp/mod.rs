//! The RUDP complete-message echo (`bench rudp`, `bench matrix rudp`): the reference experiment
//! of `shared/reference/rudp-performance.md` on Ricochet.
//!
//! ```text
//!  client 0 ─┐                        ┌────────────────┐
//!  client 1 ─┼─► relay (impairment) ──► RudpServer echo │  (--direct: no relay)
//!  client N ─┘   one route per client └────────────────┘
//! ```
//!
//! Each client ([`client`]) owns a [`ricochet::Client`] (on its own thread, or sharing one
//! with others through a [`ricochet::ClientSet`]: `--client-threads`) and keeps `window`
//! messages in flight on the reliable ordered channel; every message carries client id,
//! sequence, phase and send time plus a pattern, and every echo is checked byte for byte and
//! for order. After the measured phase the clients stop sending and drain (bounded); a message
//! not back by then is lost. The server ([`server`]) echoes and publishes its sessions'
//! protocol counters from its worker tick; [`run`] puts a round together and computes the
//! metrics (see `bench/README.md`).

pub mod client;
pub mod message;
pub mod run;
pub mod server;

pub use run::{label, run_case, run_round, summarize, FecPolicy};
