//! Kernel UDP/IP counters around a run, from the platform's [`KernelCounters`](Platform).

use ricochet_platform::KernelCounters as Platform;

use crate::schema::{KernelCounters, KernelSnapshot};

fn convert(k: &Platform) -> KernelSnapshot {
    KernelSnapshot {
        udp_in_datagrams: k.udp_in_datagrams + k.udp6_in_datagrams,
        udp_no_ports: k.udp_no_ports + k.udp6_no_ports,
        udp_in_errors: k.udp_in_errors + k.udp6_in_errors,
        udp_out_datagrams: k.udp_out_datagrams + k.udp6_out_datagrams,
        udp_rcvbuf_errors: k.udp_rcvbuf_errors + k.udp6_rcvbuf_errors,
        udp_sndbuf_errors: k.udp_sndbuf_errors + k.udp6_sndbuf_errors,
        ip_reasm_reqds: k.ip_reasm_reqds,
        ip_reasm_oks: k.ip_reasm_oks,
        ip_reasm_fails: k.ip_reasm_fails,
        ip_frag_oks: k.ip_frag_oks,
        ip_frag_fails: k.ip_frag_fails,
        ip_frag_creates: k.ip_frag_creates,
    }
}

/// Read the system's counters now; `None` where the OS does not provide them.
pub fn snapshot() -> Option<Platform> {
    Platform::snapshot()
        .ok()
        .filter(|k| k.udp_available || k.udp6_available)
}

/// Before, after and delta, when both snapshots exist.
pub fn around(before: Option<Platform>, after: Option<Platform>) -> Option<KernelCounters> {
    let (b, a) = (before?, after?);
    Some(KernelCounters {
        before: convert(&b),
        after: convert(&a),
        delta: convert(&a.delta(&b)),
    })
}
