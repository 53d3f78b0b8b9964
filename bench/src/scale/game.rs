//! `bench game`: N players on one game server (in its own process). The server ticks at a
//! fixed rate and sends every player a snapshot per tick on an unreliable-sequenced channel;
//! every player sends a small input per tick on a reliable-ordered channel. All players run in
//! one `ClientSet` on one thread of the bench, directly or through the impairment relay (one
//! route per player).
//!
//! Reported: snapshot latency from the server's send (its tick) to the player's receive, on
//! the host's monotonic clock that both processes read; snapshots lost (tick numbers a player
//! never saw) and stale (older than one already seen, or dropped as such by the protocol);
//! reliable inputs lost (sent but never received by the server after a drain: must be 0); the
//! server's tick rate, late and skipped ticks, CPU per tick and resident memory per session.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use ricochet::ClientEvent;

use super::game_meter::{server_faults, PlayerMeter};
use super::server::{
    monotonic_ns, ServerKind, ServerProcess, ServerSpec, INPUT_CHANNEL, SNAPSHOT_CHANNEL,
};
use super::setup::{
    connect_all, idle_for, member_config, protocol_profile, token_key, unmeasured_stack,
};
use crate::relay::{Relay, RelayConfig};
use crate::schema::{finite, GameConfig, GameRun};

/// Longest the players keep their connections serviced after the last input, so the reliable
/// inputs still in flight arrive before they are counted as lost.
const DRAIN: Duration = Duration::from_secs(10);

/// Runs one measurement.
pub fn run(cfg: &GameConfig) -> Result<GameRun> {
    match cfg.stack.as_deref() {
        None | Some("ricochet") => {}
        #[cfg(target_os = "linux")]
        Some("kernel") => return super::game_floor::run(cfg),
        Some(other) => return Err(unmeasured_stack(other)),
    }
    let period = Duration::from_secs_f64(1.0 / cfg.tick_hz.max(1.0));
    let relayed = cfg.relay_profile.is_some();
    let key = token_key(&cfg.security)?;
    let spec = ServerSpec {
        kind: ServerKind::Game {
            tick_us: period.as_micros() as u64,
            snapshot_bytes: cfg.snapshot_bytes,
            acks_on_tick: cfg.acks_on_tick,
        },
        bind: "127.0.0.1:0".into(),
        io_threads: cfg.io_threads,
        idle: cfg.server_idle.clone(),
        pinning: crate::schema::server_pinning(cfg.server_pinning.as_deref()).into(),
        slice_us: cfg.server_slice_us,
        backend: cfg.backend.clone(),
        profile: cfg.profile.clone(),
        max_sessions: None,
        // Through the relay every player comes from the relay's address, as from one NAT.
        max_sessions_per_address: relayed.then_some(cfg.players.max(1)),
        token_key: key,
    };
    let mut server = ServerProcess::start(&spec)?;
    let kernel_before = crate::kernel::snapshot();
    let before = server.stats()?;
    let relay = match &cfg.relay_profile {
        Some(p) => {
            let profile: ricochet_testkit::Profile =
                p.parse().with_context(|| format!("relay profile {p:?}"))?;
            let mut rc = RelayConfig::new(server.addr, profile.impairment()).with_seed(cfg.seed);
            rc.max_routes = cfg.players + 16;
            Some(Relay::start(rc)?)
        }
        None => None,
    };
    let target = relay.as_ref().map_or(server.addr, |r| r.addr());
    let limit = Duration::from_secs(30) + Duration::from_millis(3 * cfg.players as u64);
    let (mut set, took) = match connect_all(
        target,
        server.addr,
        key,
        cfg.players,
        cfg.players_per_ip,
        0,
        |ip, seed| member_config(&cfg.profile, &cfg.backend, ip, seed),
        limit,
    ) {
        Ok(x) => x,
        Err(e) => {
            // A case whose players cannot all connect is a result (not ok), not the end of
            // the run: the other cases still get measured.
            if let Some(r) = relay {
                let _ = r.shutdown();
            }
            let last = server.quit().unwrap_or_default();
            return Ok(GameRun::failed(
                cfg,
                last,
                format!("connecting: {}", crate::error_chain(e.as_ref())),
            ));
        }
    };
    let connected = set.connected();
    idle_for(&mut set, Duration::from_millis(500))?;
    let loaded = server.stats()?;
    let n = set.len();
    let mut meter = PlayerMeter::new(cfg, period, n);
    let mut errors = Vec::new();
    let server_stats = loop {
        if let Some(stats) = meter.advance(&mut server)? {
            break stats;
        }
        meter.send_due(Instant::now(), |i, body| {
            set.mark_changed(i);
            if let Some(c) = set.get_mut(i) {
                c.send(INPUT_CHANNEL, Bytes::copy_from_slice(body))
                    .with_context(|| format!("player {i} input"))?;
            }
            Ok(())
        })?;
        set.step(meter.wait())?;
        let recv_ns = monotonic_ns();
        while let Some((i, e)) = set.poll_event() {
            match e {
                ClientEvent::Message { channel, data } if channel == SNAPSHOT_CHANNEL => {
                    if let Err(e) = meter.snapshot(i, &data, recv_ns) {
                        errors.push(e);
                    }
                }
                ClientEvent::Message { channel, .. } => {
                    errors.push(format!("player {i}: a message on channel {channel}"));
                }
                ClientEvent::Disconnected { reason, .. } => {
                    errors.push(format!("player {i} disconnected: {reason}"));
                }
                _ => {}
            }
        }
        if errors.len() > 20 {
            break server.stats()?;
        }
    };
    let seen = meter.finish();
    // Drain: no more inputs; give the reliable channel time to deliver what is in flight.
    let inputs_total = seen.inputs_total;
    let drain_end = Instant::now() + DRAIN;
    let mut drained = server.stats()?;
    while Instant::now() < drain_end {
        idle_for(&mut set, Duration::from_millis(100))?;
        drained = server.stats()?;
        if drained.game.inputs_received >= inputs_total {
            break;
        }
    }
    // Inputs are counted from the start on both sides (a reset does not clear them).
    let inputs_lost = inputs_total.saturating_sub(drained.game.inputs_received);
    let verdict = if inputs_lost > 0 {
        // Two RTO ceilings and a half second: a sender backing off sends again within it even
        // when the one client thread runs its timers late.
        let max_rto = protocol_profile(&cfg.profile)?.config().max_rto;
        let watch = max_rto * 2 + Duration::from_millis(500);
        Some(drain_verdict(&mut set, kernel_before, watch)?)
    } else {
        None
    };
    let stale_protocol: u64 = (0..n)
        .filter_map(|i| set.get(i).and_then(|c| c.detail()))
        .map(|d| d.unreliable_dropped)
        .sum();
    drop(set);
    let relay_loss = match relay {
        Some(r) => {
            let c = r.shutdown()?;
            Some(finite(c.total().realized_loss()))
        }
        None => None,
    };
    if let Err(e) = server.quit() {
        errors.push(format!("server: {e:#}"));
    }
    let per_session = match (before.rss_kib, loaded.rss_kib) {
        (Some(a), Some(b)) if connected > 0 => {
            Some(finite((b as f64 - a as f64) * 1024.0 / connected as f64))
        }
        _ => None,
    };
    if let Some(v) = verdict {
        errors.push(format!(
            "{inputs_lost} reliable inputs not delivered {} s after the last was sent; {v}",
            DRAIN.as_secs()
        ));
    }
    server_faults(
        &drained,
        &server_stats,
        "the server's sessions",
        &mut errors,
    );
    let mut run = GameRun::measured(cfg, period, &seen, &server_stats);
    run.connected = connected;
    run.connect_s = finite(took.as_secs_f64());
    run.snapshots_stale += stale_protocol;
    run.inputs_lost = inputs_lost;
    run.input_order_errors = drained.game.input_order_errors;
    run.server_rss_per_session_bytes = per_session;
    run.relay_loss = relay_loss;
    run.ok = errors.is_empty() && connected == cfg.players;
    run.errors = errors;
    Ok(run)
}

/// Why inputs were still missing after the drain: the players that still hold reliable data
/// (queued, or sent and not acknowledged), split into those that sent no reliable fragment while watched for
/// `watch` (stalled: a protocol fault, when `watch` well exceeds the largest retransmission
/// timeout, so that a sender that is only backing off sends again within it) and those still retransmitting (delivery slowed by
/// overload: their RTT and RTO counts, and the host's UDP receive-buffer drops, say how much).
fn drain_verdict(
    set: &mut ricochet::ClientSet,
    kernel_before: Option<ricochet_platform::KernelCounters>,
    watch: Duration,
) -> Result<String> {
    let fragments =
        |d: &ricochet::proto::ConnectionStats| d.segments_sent + d.segments_retransmitted;
    let pending = |set: &ricochet::ClientSet, i: usize| {
        set.get(i).and_then(|c| {
            let d = c.detail()?;
            (c.queued_bytes() > 0 || c.unacked_fragments() > 0).then(|| fragments(&d))
        })
    };
    let first: Vec<(usize, u64)> = (0..set.len())
        .filter_map(|i| pending(set, i).map(|f| (i, f)))
        .collect();
    idle_for(set, watch)?;
    let (mut stalled, mut moving) = (0usize, 0usize);
    let (mut srtt_ms, mut rtos, mut no_sample) = (Vec::new(), 0u64, 0usize);
    for &(i, before) in &first {
        let Some(now) = pending(set, i) else {
            continue; // delivered meanwhile
        };
        if now == before {
            stalled += 1;
        } else {
            moving += 1;
        }
        if let Some(d) = set.get(i).and_then(|c| c.detail()) {
            srtt_ms.push(d.srtt.as_secs_f64() * 1e3);
            rtos = rtos.max(d.rto_count);
            no_sample += usize::from(d.rtt.samples == 0);
        }
    }
    srtt_ms.sort_by(f64::total_cmp);
    let median = srtt_ms.get(srtt_ms.len() / 2).copied().unwrap_or(0.0);
    let drops = crate::kernel::around(kernel_before, crate::kernel::snapshot())
        .map_or("unknown".to_string(), |k| {
            k.delta.udp_rcvbuf_errors.to_string()
        });
    let kind = if stalled > 0 {
        "STALLED (no reliable fragment sent while data was pending: a protocol fault)"
    } else {
        "slow under overload, not stuck (every such sender was still retransmitting)"
    };
    Ok(format!(
        "{kind}: {} players still held reliable data, {stalled} sent no reliable fragment in \
         the next {:.1} s, {moving} kept retransmitting (their median smoothed RTT {median:.0} \
         ms, up to {rtos} RTOs, {no_sample} without any RTT sample); UDP receive-buffer drops \
         on this host since the server started: {drops}",
        first.len(),
        watch.as_secs_f64()
    ))
}
