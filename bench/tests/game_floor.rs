//! `bench game --stack kernel`, the game tick's kernel floor: a short run through the real
//! server process, checked against what the server counted.
#![cfg(target_os = "linux")]

use bench::scale::game::run;
use bench::scale::server::set_server_executable;
use bench::schema::GameConfig;

fn config(players: usize) -> GameConfig {
    set_server_executable(env!("CARGO_BIN_EXE_bench"));
    GameConfig {
        players,
        tick_hz: 60.0,
        snapshot_bytes: 200,
        input_bytes: 32,
        relay_profile: None,
        seed: 1,
        players_per_ip: 8,
        io_threads: 2,
        server_idle: "tick".into(),
        server_pinning: Some("never".into()),
        server_slice_us: None,
        acks_on_tick: false,
        backend: "auto".into(),
        profile: "game".into(),
        security: "secure".into(),
        warmup_s: 0.3,
        seconds: 0.5,
        stack: Some("kernel".into()),
        load_threads: 2,
    }
}

#[test]
fn the_floor_ticks_sends_every_known_player_a_snapshot_and_counts_every_input() {
    let r = run(&config(20)).expect("floor game");
    assert!(r.ok, "{:?}", r.errors);
    assert_eq!(r.connected, 20);
    // Each of the two threads ticks on its own grid, at about 60 Hz over the measured half
    // second (the first ticks may pass before every player's first input arrived).
    assert_eq!(r.server.workers.len(), 2);
    assert!(r.ticks_per_s > 30.0 && r.ticks_per_s < 70.0, "{r:#?}");
    assert!(r.snapshots_received > 0, "{r:#?}");
    assert!(r.snapshot_latency_us.is_some(), "{r:#?}");
    // Every player was known by the measured phase: a snapshot per player per tick of the
    // thread its address hashes to (the two threads' tick counts differ by a tick or so).
    let even_split = 20.0 * r.server.game.ticks as f64 / 2.0;
    assert!(
        (r.snapshots_sent as f64 - even_split).abs() <= 2.0 * 20.0,
        "20 players over two threads, each sending to its own: {r:#?}"
    );
    assert_eq!(r.inputs_lost, 0, "{r:#?}");
    assert_eq!(r.input_order_errors, 0, "{r:#?}");
    assert!(r.inputs_sent_total >= r.inputs_sent && r.inputs_sent > 0);
}

#[test]
fn the_floor_refuses_the_relay_with_a_reason() {
    let mut cfg = config(4);
    cfg.relay_profile = Some("random".into());
    let e = run(&cfg).expect_err("the floor runs direct only");
    assert!(e.to_string().contains("direct"), "{e}");
}
