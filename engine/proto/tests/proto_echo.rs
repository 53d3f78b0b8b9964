//! The echo scenario (`ricochet_testkit::echo`: 4 clients x 16 in flight x 1,024 B) under each
//! named profile and connection config, plus the determinism check (same seed, same trace).
//!
//! Prints simulated round trips/s and RTT percentiles per case:
//! `cargo test -p ricochet --release --test proto_echo -- --nocapture`

use std::time::Duration;

use ricochet_proto::fec::FecPolicy;
use ricochet_proto::Config;
use ricochet_testkit::echo::{EchoReport, EchoScenario};
use ricochet_testkit::Profile;

/// The echo under `profile` for `secs` measured seconds (after a 1 s warm-up).
fn run(profile: Profile, config: Config, seed: u64, secs: u64) -> EchoReport {
    let r = EchoScenario {
        seconds: Duration::from_secs(secs),
        config,
        ..EchoScenario::new(profile, seed)
    }
    .run()
    .expect("the scenario runs");
    // Every echo intact, in order, on its channel; every client connected, none closed.
    assert!(r.is_ok(), "{profile}: {:?}", r.problems());
    r
}

fn report(name: &str, r: &EchoReport) {
    println!(
        "{name:>21}: {:>7.0} round trips/s  p50 {:>6.1} ms  p99 {:>6.1} ms  max {:>6.1} ms  \
         retransmitted/1000 rt {:>6.1}  lost pkts {}",
        r.round_trips_per_s,
        r.rtt_p50_us as f64 / 1000.0,
        r.rtt_p99_us as f64 / 1000.0,
        r.rtt_max_us as f64 / 1000.0,
        r.retransmitted_per_1000,
        r.packets_lost,
    );
}

/// The game profile with FEC off: ARQ alone.
fn game_arq() -> Config {
    let mut c = Config::game();
    c.fec.policy = FecPolicy::Off;
    c
}

/// The acceptance run: 60 simulated seconds per profile, default and game configs.
#[test]
fn echo_under_each_profile_60s() {
    for (cname, cfg) in [
        ("default", Config::default()),
        ("game-arq", game_arq()),
        ("game+fec", Config::game()),
    ] {
        for p in Profile::ALL {
            let r = run(p, cfg.clone(), 42, 60);
            assert!(r.round_trips > 0);
            report(&format!("{cname}/{}", p.name()), &r);
        }
    }
}

/// A few simulated seconds under every lossy profile.
#[test]
fn echo_smoke_each_lossy_profile() {
    for p in [Profile::Random, Profile::Burst, Profile::Sustained] {
        let r = run(p, Config::default(), 42, 3);
        assert!(r.round_trips > 100, "{}: {}", p.name(), r.round_trips);
        report(p.name(), &r);
    }
}

#[test]
fn same_seed_same_trace() {
    let a = run(Profile::Random, Config::default(), 7, 5);
    let b = run(Profile::Random, Config::default(), 7, 5);
    assert!(a.round_trips > 0);
    assert!(!a.trace_hash.is_empty());
    assert_eq!(a, b, "same seed, same report and trace");
    let c = run(Profile::Random, Config::default(), 8, 5);
    assert_ne!(
        a.trace_hash, c.trace_hash,
        "a different seed should change the run"
    );
}

/// Pacing, congestion control off, textbook NewReno and the game profile keep the echo
/// correct.
#[test]
fn echo_smoke_config_variants() {
    let variants = [
        ("pacing", Config::default().with(|c| c.pacing = true)),
        (
            "cc-off",
            Config::default().with(|c| c.congestion_control = false),
        ),
        (
            "textbook-newreno",
            Config::default().with(|c| c.loss_tolerant = false),
        ),
        ("game-arq", game_arq()),
        ("game+fec", Config::game()),
    ];
    for (name, cfg) in variants {
        let r = run(Profile::Random, cfg, 5, 3);
        assert!(r.round_trips > 100, "{name}: {}", r.round_trips);
        report(name, &r);
    }
}
