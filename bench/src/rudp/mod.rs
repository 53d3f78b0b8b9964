//! The RUDP complete-message echo (`bench rudp`, `bench matrix rudp`): the reference library's
//! RUDP experiment (its figures are in `PERFORMANCE.md`, labelled) run on Ricochet.
//!
//! ```text
//!  client 0 ─┐                        ┌────────────────┐
//!  client 1 ─┼─► relay (impairment) ──► Server echo │  (--direct: no relay)
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
pub mod fleet;
pub mod message;
pub mod protocol;
pub mod run;
pub mod server;

pub use protocol::FecPolicy;
pub use run::{label, run_case, run_round, summarize};

/// A connection's wire counters as a round records them, with `app_bytes_sent` application
/// bytes (the client counts its own; the server sums its sessions elsewhere).
pub(crate) fn wire_of(
    st: &ricochet_proto::ConnectionStats,
    app_bytes_sent: u64,
) -> crate::schema::RudpWire {
    crate::schema::RudpWire {
        bytes_sent: st.bytes_sent,
        packets_sent: st.packets_sent,
        segments_sent: st.segments_sent,
        segments_retransmitted: st.segments_retransmitted,
        packets_lost: st.packets_lost,
        rto_count: st.rto_count,
        app_bytes_sent,
        fec_recovered: st.fec.data_recovered,
        fec_parity_sent: st.fec.parity_sent,
        fec_max_parity: st.fec.max_parity as u64,
        fec_peak_retained_bytes: st.fec.peak_retained_bytes as u64,
        tail_loss_probes: st.tail_loss_probes,
    }
}
