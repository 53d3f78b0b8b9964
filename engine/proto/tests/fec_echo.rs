//! FEC acceptance: the echo scenario (`ricochet_testkit::echo`: 4 clients x 16 in flight x
//! 1,024 B), ARQ-only against fixed and adaptive FEC in the same test.
//!
//! Prints simulated round trips/s, p99 RTT, wire overhead, recovered and retransmitted per
//! 1,000 round trips per case. The 60-second acceptance run:
//! `cargo test -p ricochet --release --test fec_echo -- --nocapture`
//! (debug builds run 15 simulated seconds per case, see [`SECS`]).

use std::time::Duration;

use ricochet_proto::fec::FecPolicy;
use ricochet_proto::Config;
use ricochet_testkit::echo::{EchoReport, EchoScenario};
use ricochet_testkit::Profile;

/// Simulated seconds per case: 60 (the acceptance length) in optimized builds; debug builds run
/// 15 with the same assertions, to stay within the test suite's time on a 2-core machine.
const SECS: u64 = if cfg!(debug_assertions) { 15 } else { 60 };

const FIXED: FecPolicy = FecPolicy::Fixed { parity: 2 };
const ADAPTIVE: FecPolicy = FecPolicy::Adaptive { max_parity: 4 };

fn config(policy: FecPolicy) -> Config {
    let mut c = Config::game();
    c.fec.policy = policy;
    c
}

fn run(scenario: EchoScenario) -> EchoReport {
    let r = scenario.run().expect("the scenario runs");
    assert!(r.is_ok(), "{}: {:?}", r.profile, r.problems());
    r
}

fn case(profile: Profile, policy: FecPolicy) -> EchoScenario {
    EchoScenario {
        seconds: Duration::from_secs(SECS),
        config: config(policy),
        ..EchoScenario::new(profile, 42)
    }
}

fn p99_ms(r: &EchoReport) -> f64 {
    r.rtt_p99_us as f64 / 1000.0
}

fn report(name: &str, r: &EchoReport) {
    println!(
        "{name:>18}: {:>6.0} rt/s  p50 {:>5.1} ms  p99 {:>6.1} ms  overhead {:>5.1}%  \
         recovered/1000 {:>6.1}  retransmitted/1000 {:>6.1}  unrecoverable {:?}  \
         parity sent {:?}  final parity {:?}  peak retained {:?} B  parity/data ‰ {:?}",
        r.round_trips_per_s,
        r.rtt_p50_us as f64 / 1000.0,
        p99_ms(r),
        r.wire_overhead_percent,
        r.fec_recovered_per_1000.unwrap_or(0.0),
        r.retransmitted_per_1000,
        r.fec_unrecoverable,
        r.fec_parity_shards,
        r.fec_final_parity,
        r.fec_peak_retained_bytes,
        r.fec_parity_permille,
    );
}

/// The budget and cap assertions every FEC case must hold.
fn assert_budgets(name: &str, r: &EchoReport, cap_percent: u64) {
    assert!(r.round_trips > 0, "{name}: no round trips");
    let (peak, limit) = (
        r.fec_peak_retained_bytes.expect("FEC on"),
        r.fec_retention_limit.expect("FEC on"),
    );
    assert!(peak <= limit, "{name}: retained {peak} > budget {limit}");
    let (window, total) = r.fec_parity_permille.expect("FEC on");
    assert!(
        window <= cap_percent * 10,
        "{name}: parity {window}‰ of data over the cap window"
    );
    assert!(
        total <= cap_percent * 10,
        "{name}: parity {total}‰ of data overall"
    );
    assert_eq!(
        r.fec_malformed,
        Some(0),
        "{name}: our own FEC packets were malformed"
    );
}

/// Lossy profile: fixed and adaptive FEC recover shards and beat ARQ-only on p99.
fn lossy_case(p: Profile, min_recovered_per_1000: f64) {
    let arq = run(case(p, FecPolicy::Off));
    report(&format!("{}/arq", p.name()), &arq);
    assert_eq!(arq.fec_parity_shards, None, "ARQ only sends no parity");
    for (name, policy) in [("fixed", FIXED), ("adaptive", ADAPTIVE)] {
        let name = format!("{}/{name}", p.name());
        let scenario = case(p, policy);
        let cap = u64::from(scenario.config.fec.parity_cap_percent);
        let r = run(scenario);
        report(&name, &r);
        assert_budgets(&name, &r, cap);
        let recovered = r.fec_recovered_per_1000.unwrap_or(0.0);
        assert!(r.fec_recovered > Some(0), "{name}: nothing recovered");
        assert!(
            recovered > min_recovered_per_1000,
            "{name}: {recovered:.1} recovered per 1,000 round trips"
        );
        // Fixed parity 2 cannot rebuild a 3-packet burst in one group: under `burst` its tail
        // is ARQ's repair of those groups, as fast as ARQ-only's (whose repairs are redundant
        // in the game profile). It must not be slower; adaptive parity must be faster.
        let beats = if policy == FIXED {
            p99_ms(&r) <= p99_ms(&arq)
        } else {
            p99_ms(&r) < p99_ms(&arq)
        };
        assert!(
            beats,
            "{name}: p99 {:.1} ms vs ARQ-only {:.1} ms",
            p99_ms(&r),
            p99_ms(&arq)
        );
    }
}

#[test]
fn fec_echo_random_60s() {
    lossy_case(Profile::Random, 100.0);
}

#[test]
fn fec_echo_burst_60s() {
    lossy_case(Profile::Burst, 0.0);
}

/// The clean path, with the lossy profiles' 10 ms one way (`none` has zero delay in the profile
/// table): adaptive FEC settles at zero parity and costs next to nothing over ARQ-only.
#[test]
fn fec_echo_none_60s() {
    let clean = |policy| EchoScenario {
        none_delay: Duration::from_millis(10),
        ..case(Profile::None, policy)
    };
    let arq = run(clean(FecPolicy::Off));
    report("none/arq", &arq);
    let scenario = clean(ADAPTIVE);
    let cap = u64::from(scenario.config.fec.parity_cap_percent);
    let r = run(scenario);
    report("none/adaptive", &r);
    assert_budgets("none/adaptive", &r, cap);
    let final_parity = r.fec_final_parity.clone().unwrap_or_default();
    assert!(
        !final_parity.is_empty() && final_parity.iter().all(|&p| p == 0),
        "adaptive FEC did not settle at zero parity: {final_parity:?}"
    );
    assert_eq!(r.fec_parity_shards, Some(0), "parity on a clean path");
    assert!(
        r.wire_overhead_percent - arq.wire_overhead_percent <= 2.0,
        "overhead {:.2}% vs ARQ-only {:.2}%",
        r.wire_overhead_percent,
        arq.wire_overhead_percent
    );
}
