//! One RUDP echo round (server, optional relay, clients, checks, metrics) and a case of rounds.

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use ricochet::runtime::IdleStrategy;
use ricochet_platform::BackendKind;
use ricochet_testkit::{BurstLoss, Impairment, Profile};

use super::fleet::{Collected, Fleet};
use super::message::HEADER_LEN;
use super::protocol::{mint_token, protocol, FecPolicy};
use super::server::EchoServer;
use crate::host::{peak_rss_kib, rss_kib, CpuTimes, SystemCpu};
use crate::relay::{Relay, RelayConfig, RelayCounters};
use crate::schema::{
    finite, CpuUsage, HostCpu, Latency, RssOverTime, RudpCase, RudpConfig, RudpCounts, RudpFec,
    RudpRelay, RudpRelayDirection, RudpRun, RudpSummary, RudpWire, Spread,
};
use crate::udp::tracker::new_rtt_histogram;
use ricochet_proto::token::TokenKey;

/// The configuration of a round for a named profile, with the profile's parameters filled in.
#[allow(clippy::too_many_arguments)]
pub fn config_for(
    profile: Profile,
    payload: usize,
    clients: usize,
    window: usize,
    io_model: &str,
    io_threads: usize,
    backend: &str,
    fec: FecPolicy,
    direct: bool,
    warmup_s: f64,
    seconds: f64,
    seed: u64,
) -> RudpConfig {
    let mut cfg = RudpConfig {
        payload,
        clients,
        window,
        io_model: io_model.into(),
        io_threads,
        backend: backend.into(),
        fec: fec.name().into(),
        protocol: "game".into(),
        profile: profile.name().into(),
        loss_percent: 0.0,
        burst: None,
        delay_ms: 0.0,
        duplicate_percent: 0.0,
        reorder_percent: 0.0,
        reorder_delay_ms: 0.0,
        direct,
        warmup_s,
        seconds,
        drain_s: default_drain(seconds),
        seed,
        client_threads: Some(default_client_threads(clients)),
        server_idle: Some(DEFAULT_SERVER_IDLE.into()),
        server_slice_us: Some(DEFAULT_SERVER_SLICE_US),
        server_pinning: Some("auto".into()),
        client_placement: Some(default_client_placement(direct, false).into()),
        clients_process: Some(DEFAULT_CLIENTS_PROCESS.into()),
        security: Some("secure".into()),
        congestion_controller: None,
    };
    set_impairment(&mut cfg, &profile.impairment());
    cfg
}

/// Security modes a round may ask for: packets sealed, or the insecure mode.
pub const SECURITY_MODES: [&str; 2] = ["secure", "insecure"];

/// The server workers' idle strategy when none is asked for.
pub const DEFAULT_SERVER_IDLE: &str = "balanced";
/// The server workers' requested scheduler slice, µs: the engine's default
/// (`UdpServerConfig::worker_slice`).
pub const DEFAULT_SERVER_SLICE_US: u64 = 100;

/// Client placements: the client threads pinned to their server worker's core, or left to
/// the scheduler.
pub const CLIENT_PLACEMENTS: [&str; 2] = ["with-worker", "os"];

/// Where the clients run: threads of the bench process, or a separate process.
pub const CLIENTS_PROCESSES: [&str; 2] = ["in-process", "separate"];

/// Where the clients run when not asked: in the bench process, as every result before schema
/// 5 ran them (the gate's baseline ratios and the matrices compare with those).
pub const DEFAULT_CLIENTS_PROCESS: &str = "in-process";

/// The client placement when none is asked for: `with-worker` for direct rounds with the
/// clients in process, `os` through the relay or from a separate client process. Direct, a
/// client thread on its worker's core hands its datagrams over on that core (loopback
/// delivers in the sender's context); left to the scheduler, a thread that lands on the other
/// core wakes its worker across cores for every datagram (see the bench README for figures).
/// Through the relay, every datagram crosses the relay's unpinned thread; a separate process
/// stands for an outside load generator, which knows nothing of the server's workers.
pub fn default_client_placement(direct: bool, separate: bool) -> &'static str {
    if direct && !separate {
        "with-worker"
    } else {
        "os"
    }
}

/// Client threads for `clients` clients when none are asked for: one per client (each client
/// steps alone on its thread).
pub fn default_client_threads(clients: usize) -> usize {
    clients.max(1)
}

/// The drain limit for a measured phase of `seconds`: long enough for RTO backoffs under loss.
pub fn default_drain(seconds: f64) -> f64 {
    (seconds * 2.0).clamp(5.0, 30.0)
}

/// Copy an impairment's parameters into `cfg`.
pub fn set_impairment(cfg: &mut RudpConfig, imp: &Impairment) {
    cfg.loss_percent = imp.loss * 100.0;
    cfg.burst = imp.burst.map(|b| (b.len, b.period));
    cfg.delay_ms = imp.delay.as_secs_f64() * 1000.0;
    cfg.duplicate_percent = imp.duplicate * 100.0;
    cfg.reorder_percent = imp.reorder * 100.0;
    cfg.reorder_delay_ms = imp.reorder_delay.as_secs_f64() * 1000.0;
}

/// The impairment `cfg` describes (profile defaults for queues, then its parameters).
pub fn impairment(cfg: &RudpConfig) -> Result<Impairment> {
    let profile = Profile::from_str(&cfg.profile).map_err(|e| anyhow!("{e}"))?;
    let ms = |v: f64, name: &str| {
        Duration::try_from_secs_f64(v / 1000.0)
            .map_err(|_| anyhow!("{name} must be a non-negative number of milliseconds"))
    };
    let mut imp = profile.impairment();
    imp.loss = cfg.loss_percent / 100.0;
    imp.burst = cfg.burst.map(|(len, period)| BurstLoss { len, period });
    imp.delay = ms(cfg.delay_ms, "delay")?;
    imp.duplicate = cfg.duplicate_percent / 100.0;
    imp.reorder = cfg.reorder_percent / 100.0;
    imp.reorder_delay = ms(cfg.reorder_delay_ms, "reorder delay")?;
    imp.validate()
        .map_err(|e| anyhow!("network condition: {e}"))?;
    Ok(imp)
}

/// Check a configuration before running it.
pub fn validate(cfg: &RudpConfig) -> Result<()> {
    FecPolicy::from_str(&cfg.fec)?.available()?;
    if let Some(s) = cfg.security.as_deref() {
        if !SECURITY_MODES.contains(&s) {
            bail!("security {s:?}: expected secure or insecure");
        }
    }
    if cfg.payload < HEADER_LEN || cfg.payload > 1 << 20 {
        bail!(
            "payload must be {HEADER_LEN} B (the message header) to 1 MiB, got {}",
            cfg.payload
        );
    }
    if cfg.clients == 0 || cfg.clients > 1024 {
        bail!("clients must be 1..=1024, got {}", cfg.clients);
    }
    if cfg.window == 0 || cfg.window > 4096 {
        bail!("window must be 1..=4096, got {}", cfg.window);
    }
    if let Some(t) = cfg.client_threads {
        if t == 0 || t > cfg.clients {
            bail!(
                "client threads must be 1..={} (the clients), got {t}",
                cfg.clients
            );
        }
    }
    if let Some(idle) = &cfg.server_idle {
        IdleStrategy::from_str(idle).map_err(|e| anyhow!("server idle: {e}"))?;
    }
    if let Some(p) = &cfg.client_placement {
        if !CLIENT_PLACEMENTS.contains(&p.as_str()) {
            bail!("client placement {p:?}: expected with-worker or os");
        }
    }
    if let Some(p) = &cfg.clients_process {
        if !CLIENTS_PROCESSES.contains(&p.as_str()) {
            bail!("clients process {p:?}: expected in-process or separate");
        }
    }
    if cfg.separate_clients() && cfg.client_placement.as_deref() == Some("with-worker") {
        bail!(
            "a separate client process runs as an outside load generator, without placement: \
             client placement with-worker needs the clients in process"
        );
    }
    if !["per-core", "shared"].contains(&cfg.io_model.as_str()) {
        bail!("IO model {:?}: expected per-core or shared", cfg.io_model);
    }
    BackendKind::from_str(&cfg.backend).map_err(|e| anyhow!("{e}"))?;
    for (name, v) in [
        ("warmup", cfg.warmup_s),
        ("seconds", cfg.seconds),
        ("drain", cfg.drain_s),
    ] {
        if !v.is_finite() || !(0.0..=86_400.0).contains(&v) {
            bail!("{name} must be between 0 and 86400 s, got {v}");
        }
    }
    if cfg.seconds <= 0.0 {
        bail!("seconds must be positive");
    }
    protocol(cfg)?;
    if !cfg.direct {
        impairment(cfg)?;
    } else if cfg.profile != "none" {
        bail!(
            "--direct runs without the relay, so without impairment: profile {:?} needs the relay",
            cfg.profile
        );
    }
    Ok(())
}

/// The 1/5/15-minute load average (Linux `/proc/loadavg`).
pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|x| x.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

fn failed_run(cfg: &RudpConfig, error: String) -> RudpRun {
    RudpRun {
        config: cfg.clone(),
        ok: false,
        errors: vec![error],
        load_average: load_average(),
        server: None,
        warmup: RudpCounts::default(),
        measured: RudpCounts::default(),
        measured_s: 0.0,
        round_trips: 0,
        round_trips_per_s: 0.0,
        rtt_us: None,
        cpu: CpuUsage::default(),
        cpu_us_per_round_trip: None,
        peak_rss_kib: peak_rss_kib(),
        client_wire: RudpWire::default(),
        server_wire: RudpWire::default(),
        wire_overhead_percent: None,
        retransmitted_per_1000: None,
        fec: None,
        relay: None,
        rss: None,
        client_process: None,
        host_cpu: None,
    }
}

/// Interval of the RSS samples, ms.
const RSS_INTERVAL_MS: u64 = 1000;

/// A thread sampling RSS once a second, and exactly at the end of the warm-up and of the
/// measured phase, until told to stop.
struct RssSampler {
    stop: mpsc::Sender<()>,
    handle: std::thread::JoinHandle<RssOverTime>,
}

impl RssSampler {
    /// Starts sampling; `None` when the thread cannot be spawned (the round goes on without).
    fn start(epoch: Instant, warmup_end: Instant, measured_end: Instant) -> Option<RssSampler> {
        let (stop, stop_rx) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name("rudp-rss".into())
            .spawn(move || {
                let interval = Duration::from_millis(RSS_INTERVAL_MS);
                let mut out = RssOverTime {
                    interval_ms: RSS_INTERVAL_MS,
                    samples: Vec::new(),
                    after_warmup_kib: None,
                    end_kib: None,
                    peak_kib: None,
                    growth_kib: None,
                    growth_bound_kib: None,
                };
                let sample = |out: &mut RssOverTime| {
                    let kib = rss_kib();
                    if let Some(k) = kib {
                        let t = epoch.elapsed().as_secs_f64();
                        out.samples.push(((t * 1000.0).round() / 1000.0, k));
                        out.peak_kib = Some(out.peak_kib.map_or(k, |p| p.max(k)));
                    }
                    kib
                };
                sample(&mut out);
                let mut next_tick = epoch + interval;
                // Marks still to take: (when, is the end of the measured phase).
                let mut marks = vec![(warmup_end, false), (measured_end, true)];
                loop {
                    let next_mark = marks.first().map(|m| m.0);
                    let next = next_mark.map_or(next_tick, |m| m.min(next_tick));
                    match stop_rx.recv_timeout(next.saturating_duration_since(Instant::now())) {
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        // Stopped (or the round is gone): one last sample.
                        _ => {
                            sample(&mut out);
                            break;
                        }
                    }
                    let kib = sample(&mut out);
                    if next_mark == Some(next) {
                        let (_, is_end) = marks.remove(0);
                        if is_end {
                            out.end_kib = kib;
                        } else {
                            out.after_warmup_kib = kib;
                        }
                    }
                    while next_tick <= Instant::now() {
                        next_tick += interval;
                    }
                }
                out
            })
            .ok()?;
        Some(RssSampler { stop, handle })
    }

    /// Stops and returns the samples.
    fn finish(self) -> Option<RssOverTime> {
        let _ = self.stop.send(());
        self.handle.join().ok()
    }
}

fn relay_summary(c: &RelayCounters) -> RudpRelay {
    let dir = |d: &crate::relay::DirectionCounters| RudpRelayDirection {
        offered: d.offered,
        forwarded: d.forwarded,
        dropped_random: d.dropped_random,
        dropped_burst: d.dropped_burst,
        dropped_overflow: d.dropped_overflow,
        duplicated: d.duplicated,
        delayed: d.delayed,
    };
    let e = &c.errors;
    RudpRelay {
        routes: c.routes.len(),
        up: dir(&c.up),
        down: dir(&c.down),
        route_peaks_bytes: c.route_peaks.bytes,
        route_peaks_datagrams: c.route_peaks.datagrams,
        realized_loss: finite(c.realized_loss),
        errors: e.recv_errors + e.send_errors + e.route_limit + e.bind_errors,
        lateness_p99_us: c.lateness.p99_ns as f64 / 1000.0,
        thread_cpu_percent: finite(c.thread_utilization() * 100.0),
    }
}

/// Run one round. Never fails: a round that could not happen comes back with `ok = false` and
/// the reason, so matrices report it instead of dropping it.
pub fn run_round(cfg: &RudpConfig) -> RudpRun {
    if let Err(e) = validate(cfg) {
        return failed_run(cfg, format!("invalid configuration: {e:#}"));
    }
    match run_round_inner(cfg) {
        Ok(r) => r,
        Err(e) => failed_run(cfg, format!("{e:#}")),
    }
}

fn run_round_inner(cfg: &RudpConfig) -> Result<RudpRun> {
    let load = load_average();
    let endpoint = protocol(cfg)?;
    // The backend's key, drawn per round; the clients' tokens are minted in place below.
    let key = cfg
        .is_secure()
        .then(|| TokenKey::generate(&mut rand::rng()));
    let mut server = EchoServer::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        &cfg.io_model,
        cfg.io_threads,
        &cfg.backend,
        cfg.server_idle.as_deref().unwrap_or(DEFAULT_SERVER_IDLE),
        cfg.server_slice_us.unwrap_or(DEFAULT_SERVER_SLICE_US),
        crate::schema::server_pinning(cfg.server_pinning.as_deref()),
        endpoint.clone(),
        key.clone(),
        cfg.seed,
    )?;
    let relay = if cfg.direct {
        None
    } else {
        let imp = impairment(cfg)?;
        let rc = RelayConfig::new(server.local_addr(), imp)
            .with_seed(cfg.seed)
            .with_clients(cfg.clients);
        Some(Relay::start(rc)?)
    };
    let target = relay.as_ref().map_or(server.local_addr(), |r| r.addr());

    let worker_cores = (cfg.client_placement.as_deref() == Some("with-worker"))
        .then(|| Arc::new(server.worker_cores()));
    // What the game's backend would hand each client. Through the relay a token lists its
    // front door (where the client goes) and the server (the address the server checks).
    let mut addresses = vec![target];
    if target != server.local_addr() {
        addresses.push(server.local_addr());
    }
    let tokens = match &key {
        Some(key) => Some(
            (0..cfg.clients)
                .map(|i| mint_token(key, i as u64, &addresses))
                .collect::<Result<Vec<_>>>()?,
        ),
        None => None,
    };
    let (mut fleet, mut errors) = Fleet::launch(cfg, target, worker_cores, tokens)?;
    let go = errors.is_empty();
    let epoch = fleet.start(go);
    let mut collected = Collected::default();
    let mut cpu = CpuUsage::default();
    let mut host_cpu = None;
    let mut measured_start = epoch;
    let mut rss_sampler = None;
    if go {
        measured_start = epoch + Duration::from_secs_f64(cfg.warmup_s);
        rss_sampler = RssSampler::start(
            epoch,
            measured_start,
            measured_start + Duration::from_secs_f64(cfg.seconds),
        );
        std::thread::sleep(measured_start.saturating_duration_since(Instant::now()));
        let cpu0 = CpuTimes::now();
        let sys0 = SystemCpu::now();
        let t0 = Instant::now();
        let limit = Duration::from_secs_f64(cfg.seconds + cfg.drain_s) + Duration::from_secs(10);
        collected = fleet.collect(limit);
        let cpu1 = CpuTimes::now();
        let sys1 = SystemCpu::now();
        let wall = t0.elapsed().as_secs_f64();
        // A separate client process's CPU counts too: the round's cost is both processes'.
        let child = collected.process.map(|p| p.cpu).unwrap_or_default();
        let user = cpu1.user_s - cpu0.user_s + child.user_s;
        let sys = cpu1.sys_s - cpu0.sys_s + child.sys_s;
        cpu = CpuUsage {
            user_s: finite(user),
            sys_s: finite(sys),
            percent: if wall > 0.0 {
                finite((user + sys) / wall * 100.0)
            } else {
                0.0
            },
        };
        if let (Some(a), Some(b)) = (sys0, sys1) {
            if wall > 0.0 {
                let busy = finite((b.busy_s - a.busy_s) / wall * 100.0);
                host_cpu = Some(HostCpu {
                    busy_percent: busy,
                    other_percent: (busy - cpu.percent).max(0.0),
                    irq_percent: finite((b.irq_s - a.irq_s) / wall * 100.0),
                    steal_percent: finite((b.steal_s - a.steal_s) / wall * 100.0),
                });
            }
        }
    }
    errors.append(&mut collected.errors);
    let outcomes = collected.outcomes;
    let mut rss = rss_sampler.and_then(RssSampler::finish);
    if let Some(msg) = rss.as_mut().and_then(RssOverTime::check) {
        errors.push(msg);
    }
    // Every client is done (or gone): read the server's counters while sessions are open.
    server.fresh_sample();
    let server_wire = server.shared.wire();
    let early = server.shared.early_disconnects.load(Ordering::Relaxed);
    let server_send_errors = server.shared.send_errors.load(Ordering::Relaxed);
    errors.extend(fleet.close());
    let relay_counters = match relay.map(|r| r.shutdown()) {
        None => None,
        Some(Ok(c)) => Some(c),
        Some(Err(e)) => {
            errors.push(format!("relay: {e:#}"));
            None
        }
    };
    let server_info = match server.shutdown() {
        Ok(i) => Some(i),
        Err(e) => {
            errors.push(format!("{e:#}"));
            None
        }
    };

    let mut warmup = RudpCounts::default();
    let mut measured = RudpCounts::default();
    let mut client_wire = RudpWire::default();
    let mut hist = new_rtt_histogram();
    let mut last_echo = Duration::ZERO;
    for o in &outcomes {
        warmup.add(&o.warmup);
        measured.add(&o.measured);
        client_wire.add(&o.wire);
        if hist.add(&o.rtt_ns).is_err() {
            errors.push("merging RTT histograms failed".into());
        }
        if let Some(t) = o.last_measured_echo {
            last_echo = last_echo.max(t);
        }
        if let Some(e) = &o.error {
            errors.push(e.clone());
        }
    }
    for (name, c) in [("warm-up", &warmup), ("measured", &measured)] {
        if c.errors() > 0 {
            errors.push(format!(
                "{name}: {} lost, {} content errors, {} order errors, {} send errors (of {} sent)",
                c.lost, c.content_errors, c.order_errors, c.send_errors, c.sent
            ));
        }
    }
    if go && measured.echoed == 0 {
        errors.push("no measured round trip completed".into());
    }
    if early > 0 {
        errors.push(format!(
            "the server saw {early} session(s) end before the bench closed them"
        ));
    }
    if server_send_errors > 0 {
        errors.push(format!(
            "the server's echo send was refused {server_send_errors} time(s)"
        ));
    }
    let relay_sum = relay_counters.as_ref().map(relay_summary);
    if let Some(r) = &relay_sum {
        if r.errors > 0 {
            errors.push(format!("relay errors: {}", r.errors));
        }
        let overflow = r.up.dropped_overflow + r.down.dropped_overflow;
        if overflow > 0 {
            errors.push(format!("relay queue overflows: {overflow} datagrams"));
        }
    }
    // Throughput includes the drain: from the measured start to the last measured echo.
    let epoch_to_measured = measured_start.saturating_duration_since(epoch);
    let measured_s = finite(last_echo.saturating_sub(epoch_to_measured).as_secs_f64());
    let round_trips = measured.echoed;
    let rt_per_s = if measured_s > 0.0 {
        finite(round_trips as f64 / measured_s)
    } else {
        0.0
    };
    let all_round_trips = warmup.echoed + measured.echoed;
    let app_bytes = client_wire.app_bytes_sent + server_wire.app_bytes_sent;
    let wire_bytes = client_wire.bytes_sent + server_wire.bytes_sent;
    let wire_overhead_percent =
        (app_bytes > 0).then(|| finite((wire_bytes as f64 / app_bytes as f64 - 1.0) * 100.0));
    let retransmitted_per_1000 = (all_round_trips > 0).then(|| {
        finite(
            (client_wire.segments_retransmitted + server_wire.segments_retransmitted) as f64
                * 1000.0
                / all_round_trips as f64,
        )
    });
    let used_s = cpu.user_s + cpu.sys_s;
    let fec = (cfg.fec != "off").then(|| RudpFec {
        recovered_per_1000: if all_round_trips > 0 {
            finite(
                (client_wire.fec_recovered + server_wire.fec_recovered) as f64 * 1000.0
                    / all_round_trips as f64,
            )
        } else {
            0.0
        },
        retention_peak_kib: (client_wire.fec_peak_retained_bytes
            + server_wire.fec_peak_retained_bytes) as f64
            / 1024.0,
        max_parity: client_wire.fec_max_parity.max(server_wire.fec_max_parity),
    });
    Ok(RudpRun {
        config: cfg.clone(),
        ok: errors.is_empty(),
        errors,
        load_average: load,
        server: server_info,
        warmup,
        measured,
        measured_s,
        round_trips,
        round_trips_per_s: rt_per_s,
        rtt_us: Latency::from_ns(&hist),
        cpu,
        cpu_us_per_round_trip: (round_trips > 0).then(|| finite(used_s * 1e6 / round_trips as f64)),
        peak_rss_kib: peak_rss_kib(),
        client_wire,
        server_wire,
        wire_overhead_percent,
        retransmitted_per_1000,
        fec,
        relay: relay_sum,
        rss,
        client_process: collected.process,
        host_cpu,
    })
}

/// Summarize a case's rounds: median and min–max of each metric over the rounds that ran.
pub fn summarize(rounds: &[RudpRun]) -> RudpSummary {
    let ran: Vec<&RudpRun> = rounds.iter().filter(|r| r.round_trips > 0).collect();
    let lat =
        |f: fn(&Latency) -> f64| Spread::of(ran.iter().filter_map(|r| r.rtt_us.map(|l| f(&l))));
    RudpSummary {
        round_trips_per_s: Spread::of(ran.iter().map(|r| r.round_trips_per_s)),
        p50_us: lat(|l| l.p50),
        p99_us: lat(|l| l.p99),
        p999_us: lat(|l| l.p999),
        max_us: lat(|l| l.max),
        cpu_percent: Spread::of(ran.iter().map(|r| r.cpu.percent)),
        cpu_us_per_round_trip: Spread::of(ran.iter().filter_map(|r| r.cpu_us_per_round_trip)),
        wire_overhead_percent: Spread::of(ran.iter().filter_map(|r| r.wire_overhead_percent)),
        retransmitted_per_1000: Spread::of(ran.iter().filter_map(|r| r.retransmitted_per_1000)),
        recovered_per_1000: Spread::of(
            ran.iter()
                .filter_map(|r| r.fec.map(|f| f.recovered_per_1000)),
        ),
        realized_loss_percent: Spread::of(
            ran.iter()
                .filter_map(|r| r.relay.map(|x| x.realized_loss * 100.0)),
        ),
        relay_peaks_kib: Spread::of(
            ran.iter()
                .filter_map(|r| r.relay.map(|x| x.route_peaks_bytes as f64 / 1024.0)),
        ),
        peak_rss_kib: Spread::of(ran.iter().filter_map(|r| r.peak_rss_kib.map(|k| k as f64))),
    }
}

/// Run `rounds` rounds of `base` with seeds `base.seed`, `base.seed + 1`, ...; `on_round` is
/// called after each (for progress).
pub fn run_case(
    label: &str,
    set: Option<&str>,
    base: &RudpConfig,
    rounds: usize,
    mut on_round: impl FnMut(&RudpRun),
) -> RudpCase {
    let mut runs = Vec::with_capacity(rounds);
    for i in 0..rounds.max(1) {
        let cfg = RudpConfig {
            seed: base.seed.wrapping_add(i as u64),
            ..base.clone()
        };
        let r = run_round(&cfg);
        on_round(&r);
        let invalid = r
            .errors
            .iter()
            .any(|e| e.starts_with("invalid configuration"));
        runs.push(r);
        if invalid {
            // Every further round would fail the same way.
            break;
        }
    }
    RudpCase {
        label: label.to_string(),
        set: set.map(str::to_string),
        ok: runs.iter().all(|r| r.ok),
        summary: summarize(&runs),
        rounds: runs,
    }
}

/// A short label: `ARQ only · random · per-core×2 uring` (or `direct`).
pub fn label(cfg: &RudpConfig) -> String {
    let fec = FecPolicy::from_str(&cfg.fec).map_or(cfg.fec.clone(), |p| p.label().to_string());
    let net = if cfg.direct {
        "direct".to_string()
    } else {
        cfg.profile.clone()
    };
    let insecure = if cfg.is_secure() { "" } else { " · insecure" };
    let cc = cfg
        .congestion_controller
        .as_deref()
        .map_or(String::new(), |c| format!(" · {c}"));
    format!(
        "{fec} · {net} · {}×{} {}{insecure}{cc}",
        cfg.io_model, cfg.io_threads, cfg.backend
    )
}
