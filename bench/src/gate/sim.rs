//! The gate's simulator suite: [`ricochet_testkit::echo`] under a few profiles, exact metrics.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ricochet_proto::fec::FecPolicy;
use ricochet_testkit::echo::{EchoReport, EchoScenario};
use ricochet_testkit::Profile;
use serde::{Deserialize, Serialize};

/// What the simulator part of the gate runs (from `ci/gate.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimSuite {
    /// Seed of every run.
    pub seed: u64,
    /// Clients.
    pub clients: usize,
    /// Messages in flight per client.
    pub window: usize,
    /// Message size, bytes.
    pub payload: usize,
    /// Simulated warm-up, s.
    pub warmup_s: f64,
    /// Simulated measured time, s.
    pub seconds: f64,
    /// One-way delay of the `none` profile, ms (a zero-delay echo stalls the simulator).
    pub none_delay_ms: f64,
    /// Profiles, by name.
    pub profiles: Vec<String>,
    /// Profiles also run with adaptive FEC (reported as `<profile>+fec`).
    #[serde(default)]
    pub fec_profiles: Vec<String>,
    /// Allowed relative difference from the baseline (0: exact).
    pub relative_tolerance: f64,
}

impl Default for SimSuite {
    fn default() -> Self {
        Self {
            seed: 1,
            clients: 4,
            window: 16,
            payload: 1024,
            warmup_s: 1.0,
            seconds: 10.0,
            none_delay_ms: 1.0,
            profiles: vec!["none".into(), "random".into(), "burst".into()],
            fec_profiles: vec!["none".into(), "random".into(), "burst".into()],
            relative_tolerance: 0.0,
        }
    }
}

impl SimSuite {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<()> {
        for p in self.profiles.iter().chain(&self.fec_profiles) {
            Profile::from_str(p)?;
        }
        for (name, v) in [
            ("warmup_s", self.warmup_s),
            ("seconds", self.seconds),
            ("none_delay_ms", self.none_delay_ms),
        ] {
            if !v.is_finite() || !(0.0..=3600.0).contains(&v) {
                bail!("sim.{name} must be within 0..=3600, got {v}");
            }
        }
        if !(0.0..1.0).contains(&self.relative_tolerance) {
            bail!("sim.relative_tolerance must be within 0..1");
        }
        Ok(())
    }

    /// The scenario for `profile`.
    pub fn scenario(&self, profile: Profile) -> EchoScenario {
        EchoScenario {
            clients: self.clients,
            window: self.window,
            payload: self.payload,
            warmup: Duration::from_secs_f64(self.warmup_s),
            seconds: Duration::from_secs_f64(self.seconds),
            none_delay: Duration::from_secs_f64(self.none_delay_ms / 1000.0),
            ..EchoScenario::new(profile, self.seed)
        }
    }

    /// Runs every profile, in order: ARQ only, then the FEC profiles with adaptive FEC.
    pub fn run(&self, mut progress: impl FnMut(&SimResult)) -> Result<Vec<SimResult>> {
        let mut out = Vec::new();
        let cases = self
            .profiles
            .iter()
            .map(|p| (p, false))
            .chain(self.fec_profiles.iter().map(|p| (p, true)));
        for (name, fec) in cases {
            let profile = Profile::from_str(name)?;
            let mut scenario = self.scenario(profile);
            if fec {
                scenario.config.fec.policy = FecPolicy::Adaptive { max_parity: 4 };
            }
            let t0 = Instant::now();
            let report = scenario
                .run()
                .with_context(|| format!("sim echo under {name} (fec: {fec})"))?;
            let mut r = SimResult::from_report(&report, t0.elapsed().as_secs_f64());
            if fec {
                r.profile.push_str("+fec");
            }
            progress(&r);
            out.push(r);
        }
        Ok(out)
    }
}

/// One simulator run as the gate sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimResult {
    /// Profile name.
    pub profile: String,
    /// Gated metrics, by name.
    pub metrics: BTreeMap<String, f64>,
    /// Hex BLAKE3 of the event trace.
    pub trace_hash: String,
    /// Failed correctness checks (empty when fine).
    pub problems: Vec<String>,
    /// Wall-clock seconds the simulation took (not gated).
    pub wall_s: f64,
}

impl SimResult {
    /// The gated metrics of `r`: rates, latency, overhead, recovery (FEC fields once they exist).
    pub fn from_report(r: &EchoReport, wall_s: f64) -> SimResult {
        let mut m = BTreeMap::new();
        m.insert("round_trips".into(), r.round_trips as f64);
        m.insert("round_trips_per_s".into(), r.round_trips_per_s);
        m.insert("rtt_p50_us".into(), r.rtt_p50_us as f64);
        m.insert("rtt_p99_us".into(), r.rtt_p99_us as f64);
        m.insert("rtt_max_us".into(), r.rtt_max_us as f64);
        m.insert("wire_overhead_percent".into(), r.wire_overhead_percent);
        m.insert("bytes_per_round_trip".into(), r.bytes_per_round_trip);
        m.insert("retransmitted_per_1000".into(), r.retransmitted_per_1000);
        if let Some(x) = r.fec_recovered_per_1000 {
            m.insert("fec_recovered_per_1000".into(), x);
        }
        if let Some(x) = r.fec_peak_retained_bytes {
            m.insert("fec_peak_retained_bytes".into(), x as f64);
        }
        SimResult {
            profile: r.profile.name().to_string(),
            metrics: m,
            trace_hash: r.trace_hash.clone(),
            problems: r.problems(),
            wall_s,
        }
    }
}

/// The name of the gate's heap-per-session check (a [`SimResult`] profile).
pub const SESSIONS_PROFILE: &str = "sessions";

/// Heap bytes per session of a simulated server endpoint ([`ricochet_testkit::sessions`]):
/// 1,000 clients connected and idle for 3 simulated s, then each with 16 × 1 KiB echoes in
/// flight, then idle again for 3 s, and the same with protected sessions (keys from a test
/// secret) and with connect tokens (the production path). Exact for the code:
/// the counting allocator of the bench binary weighs what dropping the server endpoint frees.
/// `Ok(None)` when this process does not count allocations (a test binary).
pub fn sessions_heap() -> Result<Option<SimResult>> {
    use ricochet_testkit::sessions::SessionsScenario;
    if !crate::alloc::installed() {
        return Ok(None);
    }
    let t0 = Instant::now();
    let weigh = |s: &SessionsScenario| -> Result<(usize, usize)> {
        crate::alloc::counting(|live| {
            let out = s.run().context("sessions scenario")?;
            let before = live();
            let connected = out.connected;
            drop(out.server);
            Ok((connected, (before - live()).max(0) as usize))
        })
    };
    let empty = SessionsScenario {
        clients: 0,
        ..SessionsScenario::new(1)
    };
    let idle = SessionsScenario {
        clients: 1000,
        ..SessionsScenario::new(1)
    };
    let loaded = SessionsScenario {
        load: Some((16, 1024)),
        ..idle.clone()
    };
    let after = SessionsScenario {
        settle_after_load: Duration::from_secs(3),
        ..loaded.clone()
    };
    let protected = SessionsScenario {
        test_session_secret: Some([9; 32]),
        ..after.clone()
    };
    let tokens = SessionsScenario {
        tokens: true,
        ..after.clone()
    };
    let (_, base) = weigh(&empty)?;
    let (_, base_tokens) = weigh(&SessionsScenario {
        tokens: true,
        ..empty.clone()
    })?;
    let mut metrics = BTreeMap::new();
    let mut problems = Vec::new();
    for (name, s, empty_server) in [
        ("server_heap_bytes_per_idle_session", &idle, base),
        (
            "server_heap_bytes_per_session_16x1k_in_flight",
            &loaded,
            base,
        ),
        (
            "server_heap_bytes_per_session_idle_after_load",
            &after,
            base,
        ),
        ("server_heap_bytes_per_protected_session", &protected, base),
        ("server_heap_bytes_per_token_session", &tokens, base_tokens),
    ] {
        let (connected, held) = weigh(s)?;
        if connected != s.clients {
            problems.push(format!("{name}: {connected} of {} connected", s.clients));
        }
        let per = held.saturating_sub(empty_server) as f64 / s.clients as f64;
        metrics.insert(name.to_string(), (per * 10.0).round() / 10.0);
    }
    Ok(Some(SimResult {
        profile: SESSIONS_PROFILE.into(),
        metrics,
        trace_hash: String::new(),
        problems,
        wall_s: t0.elapsed().as_secs_f64(),
    }))
}

/// The name of the gate's allocations-per-player-tick check (a [`SimResult`] profile).
pub const GAME_PROFILE: &str = "game-server";

/// Heap allocation calls (and bytes asked for) per player-tick of a simulated game server in
/// steady state ([`ricochet_testkit::game`]): 100 players with connect tokens and the game
/// profile, a 60 Hz tick with a 200 B unreliable snapshot down and a 32 B reliable input up per
/// player, 5 simulated s of warm-up, then 2 s counted. Only the server endpoint's protocol code
/// is counted (not the players, the network, or the game's snapshot). Exact for the code.
/// `Ok(None)` when this process does not count allocations (a test binary).
pub fn game_allocs() -> Result<Option<SimResult>> {
    use ricochet_testkit::game::GameScenario;
    if !crate::alloc::installed() {
        return Ok(None);
    }
    let t0 = Instant::now();
    let scenario = GameScenario {
        server_scope: Some(crate::alloc::set_on),
        ..GameScenario::new(1)
    };
    crate::alloc::trace::start();
    let before = crate::alloc::Calls::now();
    let out = scenario.run().context("game scenario")?;
    crate::alloc::set_on(false);
    let counted = crate::alloc::Calls::now().since(before);
    for (stack, calls) in crate::alloc::trace::finish() {
        eprintln!("gate: alloc trace: ~{calls} calls at\n  {stack}");
    }
    let mut problems = Vec::new();
    if out.connected != scenario.players {
        problems.push(format!(
            "{} of {} players connected",
            out.connected, scenario.players
        ));
    }
    if out.inputs_lost > 0 || out.input_order_errors > 0 {
        problems.push(format!(
            "{} reliable inputs lost, {} out of order",
            out.inputs_lost, out.input_order_errors
        ));
    }
    if out.player_ticks == 0
        || out.snapshots_received + (scenario.players as u64) < out.player_ticks
    {
        problems.push(format!(
            "{} snapshots received of {} sent",
            out.snapshots_received, out.player_ticks
        ));
    }
    let per = |x: u64| {
        let v = x as f64 / out.player_ticks.max(1) as f64;
        (v * 1000.0).round() / 1000.0
    };
    let mut metrics = BTreeMap::new();
    metrics.insert("player_ticks".into(), out.player_ticks as f64);
    metrics.insert("server_allocs_per_player_tick".into(), per(counted.calls));
    metrics.insert(
        "server_alloc_bytes_per_player_tick".into(),
        per(counted.bytes),
    );
    Ok(Some(SimResult {
        profile: GAME_PROFILE.into(),
        metrics,
        trace_hash: String::new(),
        problems,
        wall_s: t0.elapsed().as_secs_f64(),
    }))
}
