//! One UDP echo run: start a server, drive the clients through warm-up, measured phase and
//! drain, then collect every metric into a [`UdpRun`].

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::client::{run_client, ClientIo, ClientOutcome, ClientPlan, Sync};
use super::message::HEADER_LEN;
use super::server::{loopback, EchoServer, TokioServer};
use super::tracker::new_rtt_histogram;
use crate::host::{peak_rss_kib, CpuTimes};
use crate::schema::{finite, CpuUsage, Latency, PhaseCounts, Phases, UdpConfig, UdpRun};

/// Largest UDP payload for a family: 65,507 (IPv4) or 65,527 (IPv6).
pub fn max_payload(ipv6: bool) -> usize {
    if ipv6 {
        65_527
    } else {
        65_507
    }
}

/// Check a configuration before running it.
pub fn validate(cfg: &UdpConfig) -> Result<()> {
    let ipv6 = is_ipv6(cfg)?;
    if cfg.payload < HEADER_LEN {
        bail!(
            "payload {} is smaller than the {HEADER_LEN}-byte message header",
            cfg.payload
        );
    }
    if cfg.payload > max_payload(ipv6) {
        bail!(
            "payload {} exceeds the UDP maximum of {} bytes over {}",
            cfg.payload,
            max_payload(ipv6),
            cfg.address_family
        );
    }
    if cfg.clients == 0 || cfg.clients > 4096 {
        bail!("clients must be 1..=4096, got {}", cfg.clients);
    }
    if cfg.window == 0 {
        bail!("window must be at least 1");
    }
    for (name, v) in [
        ("warmup", cfg.warmup_s),
        ("seconds", cfg.seconds),
        ("drain", cfg.drain_s),
    ] {
        if !v.is_finite() || !(0.0..=86_400.0).contains(&v) {
            bail!("{name} must be between 0 and 86400 s, got {v}");
        }
    }
    if ClientIo::parse(&cfg.client_io).is_none() {
        bail!(
            "client I/O {:?}: expected auto, gso or mmsg (Linux), or std",
            cfg.client_io
        );
    }
    if cfg.seconds <= 0.0 {
        bail!("seconds must be positive");
    }
    Ok(())
}

fn is_ipv6(cfg: &UdpConfig) -> Result<bool> {
    match cfg.address_family.as_str() {
        "ipv4" => Ok(false),
        "ipv6" => Ok(true),
        other => bail!("address family {other:?}: expected ipv4 or ipv6"),
    }
}

/// Start the server `cfg.server` names, on loopback.
pub fn start_server(cfg: &UdpConfig) -> Result<Box<dyn EchoServer>> {
    let addr = loopback(is_ipv6(cfg)?);
    match cfg.server.as_str() {
        "tokio" => Ok(Box::new(TokioServer::start(
            addr,
            cfg.io_threads,
            cfg.work_ns,
            cfg.recv_buffer,
            cfg.send_buffer,
        )?)),
        "ricochet" => super::ricochet_server::start(cfg, addr),
        other => bail!("server {other:?}: expected ricochet or tokio"),
    }
}

fn empty_run(cfg: &UdpConfig, label: &str, error: String) -> UdpRun {
    UdpRun {
        label: label.to_string(),
        round: 0,
        config: cfg.clone(),
        ok: false,
        errors: vec![error],
        server: None,
        client_socket: None,
        phases: Phases::default(),
        measured_s: 0.0,
        round_trips: 0,
        round_trips_per_s: 0.0,
        payload_mib_per_s: 0.0,
        rtt_us: None,
        cpu: CpuUsage::default(),
        peak_rss_kib: peak_rss_kib(),
        kernel: None,
    }
}

/// Run `cfg` against the server it names. Never fails: a run that could not happen is returned
/// with `ok = false` and the reason, so matrices report it instead of dropping it.
pub fn run_udp(cfg: &UdpConfig, label: &str) -> UdpRun {
    if let Err(e) = validate(cfg) {
        return empty_run(cfg, label, format!("invalid configuration: {e:#}"));
    }
    match start_server(cfg) {
        Ok(server) => run_udp_against(cfg, label, server),
        Err(e) => empty_run(cfg, label, format!("server failed to start: {e:#}")),
    }
}

fn phase_errors(name: &str, c: &PhaseCounts) -> Option<String> {
    (c.errors() > 0).then(|| {
        format!(
            "{name}: {} lost, {} duplicated, {} content errors, {} late, {} send errors, {} receive errors (of {} sent)",
            c.lost, c.duplicated, c.content_errors, c.late, c.send_errors, c.recv_errors, c.sent
        )
    })
}

/// Run the clients of `cfg` against an already started `server`, then shut it down.
pub fn run_udp_against(cfg: &UdpConfig, label: &str, server: Box<dyn EchoServer>) -> UdpRun {
    let target: SocketAddr = server.local_addr();
    let sync = Sync::new(cfg.clients);
    let epoch = Instant::now();
    let Some(io) = ClientIo::parse(&cfg.client_io) else {
        let _ = server.shutdown();
        return empty_run(
            cfg,
            label,
            format!(
                "client I/O {:?}: expected auto, gso or mmsg (Linux), or std",
                cfg.client_io
            ),
        );
    };
    // The JSON config records the mode that ran; a fallback says why on stderr.
    let (io, fallback) = io.resolve(cfg.window);
    if let Some(why) = fallback {
        eprintln!("{label}: {why}");
    }
    let mut cfg = cfg.clone();
    cfg.client_io = io.as_str().to_string();
    let cfg = &cfg;
    let kernel_before = crate::kernel::snapshot();
    let mut handles = Vec::with_capacity(cfg.clients);
    let mut errors = Vec::new();
    for i in 0..cfg.clients {
        let plan = ClientPlan {
            client: i as u32,
            server: target,
            payload: cfg.payload,
            window: cfg.window,
            warmup: Duration::from_secs_f64(cfg.warmup_s),
            measured: Duration::from_secs_f64(cfg.seconds),
            drain: Duration::from_secs_f64(cfg.drain_s),
            messages: cfg.messages,
            recv_buffer: cfg.recv_buffer,
            send_buffer: cfg.send_buffer,
            epoch,
            io,
        };
        let s = sync.clone();
        match std::thread::Builder::new()
            .name(format!("client-{i}"))
            .spawn(move || run_client(plan, s))
        {
            Ok(h) => handles.push(h),
            Err(e) => {
                // Without this client the barriers would never fill: give up on the run.
                errors.push(format!("spawning client {i}: {e}"));
                break;
            }
        }
    }
    if handles.len() != cfg.clients {
        // The spawned clients are blocked on the first barrier; this run cannot proceed.
        // Fill the barriers for the missing threads from helper threads so they finish.
        let missing = cfg.clients - handles.len();
        for _ in 0..missing {
            let s = sync.clone();
            let _ = std::thread::Builder::new().spawn(move || {
                for b in [&s.start_warmup, &s.start_measured, &s.end_measured, &s.done] {
                    b.wait();
                }
            });
        }
    }
    sync.start_warmup.wait();
    sync.start_measured.wait();
    let t0 = Instant::now();
    let cpu0 = CpuTimes::now();
    sync.end_measured.wait();
    let wall = t0.elapsed().as_secs_f64();
    let cpu1 = CpuTimes::now();
    sync.done.wait();
    let kernel_after = crate::kernel::snapshot();

    let outcomes: Vec<ClientOutcome> = handles
        .into_iter()
        .enumerate()
        .filter_map(|(i, h)| match h.join() {
            Ok(o) => Some(o),
            Err(_) => {
                errors.push(format!("client {i} panicked"));
                None
            }
        })
        .collect();
    let server_info = match server.shutdown() {
        Ok(info) => Some(info),
        Err(e) => {
            errors.push(format!("server shutdown: {e:#}"));
            None
        }
    };

    let mut phases = Phases::default();
    let mut hist = new_rtt_histogram();
    let mut round_trips = 0;
    let mut client_socket = None;
    for o in &outcomes {
        phases.warmup.add(&o.phases.warmup);
        phases.measured.add(&o.phases.measured);
        phases.drain.add(&o.phases.drain);
        if hist.add(&o.rtt_ns).is_err() {
            errors.push("merging RTT histograms failed".into());
        }
        round_trips += o.round_trips;
        if client_socket.is_none() {
            client_socket = o.socket.clone();
        }
        if let Some(e) = &o.error {
            errors.push(e.clone());
        }
    }
    for (name, c) in [
        ("warm-up", &phases.warmup),
        ("measured", &phases.measured),
        ("drain", &phases.drain),
    ] {
        errors.extend(phase_errors(name, c));
    }
    if phases.measured.sent == 0 {
        errors.push("no measured-phase message was sent".into());
    }
    // The rate's denominator: the measured duration, or less when a message count ended it early.
    let measured_s = finite(wall.min(cfg.seconds));
    let per_s = |x: f64| {
        if measured_s > 0.0 {
            finite(x / measured_s)
        } else {
            0.0
        }
    };
    let cpu = CpuUsage {
        user_s: finite(cpu1.user_s - cpu0.user_s),
        sys_s: finite(cpu1.sys_s - cpu0.sys_s),
        percent: if wall > 0.0 {
            finite((cpu1.user_s - cpu0.user_s + cpu1.sys_s - cpu0.sys_s) / wall * 100.0)
        } else {
            0.0
        },
    };
    UdpRun {
        label: label.to_string(),
        round: 0,
        config: cfg.clone(),
        ok: errors.is_empty(),
        errors,
        server: server_info,
        client_socket,
        phases,
        measured_s,
        round_trips,
        round_trips_per_s: per_s(round_trips as f64),
        payload_mib_per_s: per_s(round_trips as f64 * cfg.payload as f64 / (1024.0 * 1024.0)),
        rtt_us: Latency::from_ns(&hist),
        cpu,
        peak_rss_kib: peak_rss_kib(),
        kernel: crate::kernel::around(kernel_before, kernel_after),
    }
}
