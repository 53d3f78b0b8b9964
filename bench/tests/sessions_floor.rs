//! `bench sessions --stack kernel`, the kernel floor: short runs through the real server
//! process, checked against what the server counted.
#![cfg(target_os = "linux")]

use bench::scale::server::set_server_executable;
use bench::scale::sessions::{run, SessionsConfig};

fn config(mode: &str, clients: usize) -> SessionsConfig {
    set_server_executable(env!("CARGO_BIN_EXE_bench"));
    SessionsConfig {
        clients,
        mode: mode.into(),
        clients_per_ip: 8,
        io_threads: 2,
        server_idle: "balanced".into(),
        server_pinning: Some("never".into()),
        server_slice_us: None,
        backend: "auto".into(),
        profile: "default".into(),
        security: "secure".into(),
        payload: 64,
        settle_s: 0.0,
        warmup_s: 0.1,
        seconds: 0.3,
        stack: Some("kernel".into()),
    }
}

/// Datagrams the floor server echoed, over its threads.
fn echoed(r: &bench::scale::sessions::SessionsRun) -> u64 {
    r.server.workers.iter().map(|w| w.datagrams_out).sum()
}

#[test]
fn the_floor_echo_keeps_every_client_going_and_the_server_echoes_each_round_trip() {
    let r = run(&config("echo", 20)).expect("floor echo");
    assert!(r.ok, "{:?}", r.errors);
    assert_eq!(r.connected, 20);
    assert!(r.min_client_round_trips > 0, "{r:#?}");
    assert_eq!(r.rtt_us.expect("RTT").count, r.round_trips);
    // Two threads on one port: each has its own socket and counts.
    assert_eq!(r.server.workers.len(), 2);
    // The server echoed every counted round trip, and those of the warm-up and the last
    // messages in flight (at most one per client) besides.
    assert!(echoed(&r) >= r.round_trips, "{r:#?}");
    assert_eq!(r.server.sessions, 0, "the floor keeps no sessions");
}

#[test]
fn a_floor_churn_session_makes_four_round_trips_and_closes() {
    let r = run(&config("churn", 16)).expect("floor churn");
    assert!(r.ok, "{:?}", r.errors);
    assert!(r.connected >= 16 && r.connected % 16 == 0, "{r:#?}");
    assert!(r.handshakes_per_s > 0.0);
    assert_eq!(
        echoed(&r),
        r.connected as u64 * u64::from(bench::scale::sessions::FLOOR_CHURN_EXCHANGES),
        "every session's exchanges, and nothing else, reached the server"
    );
}

#[test]
fn the_floor_refuses_idle_with_a_reason() {
    let e = run(&config("idle", 4)).expect_err("idle has nothing to weigh");
    assert!(e.to_string().contains("idle"), "{e}");
}
