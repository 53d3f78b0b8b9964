//! Numbers of the reference reports (`reference/` of the shared docs), shown next to ours.
//!
//! Transcribed from the reports, which measured the reference C++ library (Standalone Asio build)
//! on a Mac mini M4 Pro (14 logical CPUs), macOS, loopback. They are not our measurements and
//! are always labelled "reference, M4 Pro".

/// Label used wherever a reference number appears.
pub const LABEL: &str = "reference, M4 Pro";

/// UDP limits ("UDP Datagram Size and Burst Loss", 2026-10-12): measured-phase lost echoes per
/// run (all three repetitions identical) by (payload, window); IPv4, 16 clients, 1 thread.
pub fn udp_limits_loss(payload: usize, window: usize) -> Option<u64> {
    let known_payload = [1_472, 8_192, 16_356, 16_357, 16_384, 65_507].contains(&payload);
    if !known_payload || ![1, 16, 64].contains(&window) {
        return None;
    }
    Some(match (payload, window) {
        (8_192, 64) => 512,
        (16_356 | 16_357 | 16_384, 64) => 767,
        (65_507, 16) => 191,
        (65_507, 64) => 959,
        _ => 0,
    })
}

/// RUDP main matrix, best per condition with one endpoint thread ("RUDP Performance",
/// 2026-10-13): (condition, highest round trips/s, lowest p99 RTT).
pub const RUDP_BEST: [(&str, &str, &str); 3] = [
    ("none", "ARQ only 62,827 rt/s", "ARQ only 1.1 ms"),
    ("random", "fixed FEC 844 rt/s", "adaptive FEC 142.5 ms"),
    ("burst", "adaptive FEC 914 rt/s", "adaptive FEC 139.5 ms"),
];

/// RUDP under random loss, 1,024 B, window 16, one endpoint thread, Standalone Asio build:
/// (policy, restored / 1,000, retransmitted / 1,000, FEC retained KiB, relay route peaks sum
/// KiB, process RSS MiB, max observed parity).
pub const RUDP_RANDOM_RESOURCES: [[&str; 7]; 3] = [
    ["ARQ only", "0.0", "331.7", "0.0", "50.5", "6.8", "0"],
    ["fixed FEC", "182.8", "185.9", "37.7", "84.3", "7.1", "2"],
    ["adaptive FEC", "176.7", "181.8", "30.8", "83.4", "7.2", "3"],
];

/// RUDP payload × window under random loss: (payload, window, ARQ only, fixed, adaptive) as
/// "round trips/s / p99 ms".
pub const RUDP_PAYLOAD_WINDOW: [(&str, &str, &str, &str, &str); 6] = [
    ("64", "1", "139 / 80.8", "116 / 91.4", "140 / 79.6"),
    ("64", "64", "450 / 876.3", "421 / 941.3", "419 / 920.6"),
    ("4,096", "1", "74 / 139.4", "114 / 93.5", "113 / 88.5"),
    (
        "4,096",
        "64",
        "146 / 2,096.2",
        "223 / 1,432.5",
        "234 / 1,285.4",
    ),
    ("16,384", "1", "20 / 344.9", "29 / 240.2", "31 / 228.5"),
    (
        "16,384",
        "64",
        "42 / 6,239.0",
        "64 / 4,019.4",
        "67 / 4,034.0",
    ),
];

/// RUDP 120 s sustained runs (burst + 2% random, 4,096 B, window 16, 4 endpoint threads),
/// Standalone Asio build: (policy, message round trips, round trips/s, p99 ms, CPU %, wire
/// overhead %, FEC sampled peak KiB).
pub const RUDP_SUSTAINED: [[&str; 7]; 3] = [
    ["ARQ only", "20,734", "172", "599.6", "48.6", "24.2", "0.0"],
    [
        "fixed FEC",
        "27,622",
        "229",
        "448.3",
        "82.1",
        "66.2",
        "232.6",
    ],
    [
        "adaptive FEC",
        "29,058",
        "241",
        "453.6",
        "84.9",
        "70.3",
        "166.8",
    ],
];

/// The reference's payload × window cell for (payload, window) and a policy label (`ARQ only`,
/// `fixed FEC`, `adaptive FEC`), as "round trips/s / p99 ms".
pub fn rudp_payload_window(payload: usize, window: usize, policy: &str) -> Option<&'static str> {
    let p = crate::output::thousands(payload as u64);
    let w = window.to_string();
    let row = RUDP_PAYLOAD_WINDOW
        .iter()
        .find(|r| r.0 == p.as_str() && r.1 == w.as_str())?;
    match policy {
        "ARQ only" => Some(row.2),
        "fixed FEC" => Some(row.3),
        "adaptive FEC" => Some(row.4),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_total_matches_the_report() {
        // The report: 11,889 lost echoes over three repetitions.
        let mut total = 0;
        for p in [1_472, 8_192, 16_356, 16_357, 16_384, 65_507] {
            for w in [1, 16, 64] {
                total += udp_limits_loss(p, w).unwrap();
            }
        }
        assert_eq!(total * 3, 11_889);
        assert_eq!(udp_limits_loss(65_527, 1), None);
    }

    #[test]
    fn payload_window_lookup_quotes_the_table() {
        assert_eq!(
            rudp_payload_window(4_096, 64, "adaptive FEC"),
            Some("234 / 1,285.4")
        );
        assert_eq!(rudp_payload_window(64, 1, "ARQ only"), Some("139 / 80.8"));
        assert_eq!(rudp_payload_window(1_024, 16, "ARQ only"), None);
        assert_eq!(rudp_payload_window(64, 1, "other"), None);
    }
}
