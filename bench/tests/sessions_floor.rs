//! `bench sessions --stack kernel`, the kernel floor: short runs through the real server
//! process, checked against what the server counted.
#![cfg(target_os = "linux")]

use bench::scale::server::set_server_executable;
use bench::scale::sessions::run;
use bench::schema::SessionsConfig;

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
        window: 1,
        settle_s: 0.0,
        warmup_s: 0.1,
        seconds: 0.3,
        stack: Some("kernel".into()),
        load_threads: 2,
    }
}

/// Datagrams the floor server echoed, over its threads.
fn echoed(r: &bench::schema::SessionsRun) -> u64 {
    r.server.workers.iter().map(|w| w.datagrams_out).sum()
}

#[test]
fn the_floor_echo_keeps_every_client_going_and_the_server_echoes_each_round_trip() {
    let r = run(&config("echo", 20)).expect("floor echo");
    assert!(r.ok, "{:?}", r.errors);
    assert!(r.min_client_round_trips > 0, "{r:#?}");
    // Two threads on one port: each has its own socket and counts.
    assert_eq!(r.server.workers.len(), 2);
    // The server echoed every counted round trip, plus the warm-up's and the last message
    // of each client (answered or in flight when the run ended).
    assert!(echoed(&r) >= r.round_trips + 20, "{r:#?}");
    assert!(r.round_trips_per_s > 0.0);
    // The machine's steal over the measured phase is recorded (Linux has /proc/stat).
    assert!(r.steal_percent.is_some_and(|p| p >= 0.0), "{r:#?}");
}

#[test]
fn a_floor_churn_session_sends_four_datagrams_and_closes() {
    let r = run(&config("churn", 16)).expect("floor churn");
    assert!(r.ok, "{:?}", r.errors);
    assert!(r.connected >= 16, "{r:#?}");
    assert_eq!(
        echoed(&r),
        r.connected as u64 * u64::from(bench::scale::FLOOR_CHURN_EXCHANGES),
        "every session's four datagrams (three answered, then the close), and nothing else, \
         reached the server"
    );
}

#[test]
fn the_floor_refuses_idle_with_a_reason() {
    let e = run(&config("idle", 4)).expect_err("idle has nothing to weigh");
    assert!(e.to_string().contains("idle"), "{e}");
}

/// Both stacks keep a window of messages in flight per client. Each echo must carry the
/// sequence number the meter expects, so a client that sent fewer or other messages than
/// the window calls for fails the run with out-of-order echoes.
#[test]
fn an_echo_window_keeps_that_many_messages_in_flight_on_both_stacks() {
    for stack in [Some("kernel"), None] {
        let mut cfg = config("echo", 3);
        cfg.stack = stack.map(Into::into);
        cfg.window = 4;
        cfg.payload = 1024;
        let r = run(&cfg).expect("windowed echo");
        assert!(r.ok, "{stack:?}: {:?}", r.errors);
        assert!(r.min_client_round_trips > 0, "{stack:?}: {r:#?}");
        assert_eq!(r.config.window, 4);
    }
    let mut cfg = config("echo", 3);
    cfg.window = 0;
    let e = run(&cfg).expect_err("no window");
    assert!(e.to_string().contains("window"), "{e}");
}
