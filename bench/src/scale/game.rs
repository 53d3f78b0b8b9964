//! `bench game`: N players on one game server (in its own process). The server ticks at a
//! fixed rate and sends every player a snapshot per tick on an unreliable-sequenced channel;
//! every player sends a small input per tick on a reliable-ordered channel. The players run in
//! `--load-threads` shards, a `ClientSet` per thread, directly or through the impairment relay
//! (one route per player).
//!
//! Reported: snapshot latency from the server's send (its tick) to the player's receive, on
//! the host's monotonic clock that both processes read; snapshots lost (tick numbers a player
//! never saw) and stale (older than one already seen, or dropped as such by the protocol);
//! reliable inputs lost (sent but never received by the server after a drain: must be 0); the
//! server's tick rate, late and skipped ticks, CPU per tick and per player-tick, resident memory
//! per session; the load generator's own CPU and whether it kept up (`load`).

use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use ricochet::ClientEvent;

use super::game_meter::{drive_game, server_faults, PlayerMeter, PlayersSeen};
use super::load::{Control, Driven, Phase, SERVE_TURN};
use super::server::{
    monotonic_ns, ServerKind, ServerProcess, ServerSpec, INPUT_CHANNEL, SNAPSHOT_CHANNEL,
};
use super::setup::{
    connect_range, idle_for, member_config, protocol_profile, token_key, unmeasured_stack,
};
use crate::relay::{Relay, RelayConfig};
use crate::schema::{finite, GameConfig, GameRun};

/// Longest the players keep their connections serviced after the last input, so the reliable
/// inputs still in flight arrive before they are counted as lost.
const DRAIN: Duration = Duration::from_secs(10);

/// How long a player's handshake may take (the protocol's default is 5 s).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

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
    let server_addr = server.addr;
    let limit = Duration::from_secs(30) + Duration::from_millis(3 * cfg.players as u64);
    // Players connect one address group (`--players-per-ip`) at a time per load thread.
    // Two RTO ceilings and a half second: a sender backing off sends again within it even
    // when its load thread runs its timers late.
    let max_rto = protocol_profile(&cfg.profile)?.config().max_rto;
    let watch = max_rto * 2 + Duration::from_millis(500);
    let shard = |range: Range<usize>, ctl: &Control<PlayersSeen>| -> Result<ShardEnd> {
        let first = range.start;
        let setup = connect_range(
            (target, server_addr),
            key,
            range.clone(),
            cfg.players_per_ip,
            0,
            true,
            |ip, seed| {
                // A wave of handshakes on a loaded host can outlast the default 5 s; a player
                // that is still waiting is not a lost one.
                member_config(&cfg.profile, &cfg.backend, ip, seed).map(|mut c| {
                    std::sync::Arc::make_mut(&mut c.endpoint.connection).handshake_timeout =
                        HANDSHAKE_TIMEOUT;
                    c
                })
            },
            limit,
        )
        .and_then(|(mut set, took)| {
            idle_for(&mut set, Duration::from_millis(500))?;
            Ok((set, took))
        });
        let (set, outcome) = match setup {
            Ok((set, took)) => {
                let n = set.connected();
                (Some(set), Ok((n, took)))
            }
            Err(e) => (None, Err(e)),
        };
        let mut set = set;
        let start = ctl.connected_serving(outcome, || match set.as_mut() {
            Some(s) => idle_for(s, SERVE_TURN),
            None => Ok(()),
        });
        let (Some(start), Some(mut set)) = (start, set) else {
            return Ok(ShardEnd::default());
        };
        let mut meter = PlayerMeter::new(cfg, period, range, start);
        while ctl.phase() < Phase::Drain {
            if ctl.phase() == Phase::Measured {
                meter.begin_measuring();
            }
            meter.send_due(Instant::now(), |i, body| {
                set.mark_changed(i);
                if let Some(c) = set.get_mut(i) {
                    c.send(INPUT_CHANNEL, Bytes::copy_from_slice(body))
                        .with_context(|| format!("player {} input", first + i))?;
                }
                Ok(())
            })?;
            set.step(meter.wait())?;
            let recv_ns = monotonic_ns();
            while let Some((i, e)) = set.poll_event() {
                match e {
                    ClientEvent::Message { channel, data } if channel == SNAPSHOT_CHANNEL => {
                        meter.snapshot(i, &data, recv_ns);
                    }
                    ClientEvent::Message { channel, .. } => {
                        meter.error(format!(
                            "player {}: a message on channel {channel}",
                            first + i
                        ));
                    }
                    ClientEvent::Disconnected { reason, .. } => {
                        meter.error(format!("player {} disconnected: {reason}", first + i));
                    }
                    _ => {}
                }
            }
        }
        ctl.report(meter.finish());
        while ctl.phase() < Phase::Done {
            idle_for(&mut set, Duration::from_millis(20))?;
        }
        let verdict = if ctl.want_verdict.load(std::sync::atomic::Ordering::Acquire) {
            Some(drain_verdict(&mut set, watch)?)
        } else {
            None
        };
        let stale = (0..set.len())
            .filter_map(|i| set.get(i).and_then(|c| c.detail()))
            .map(|d| d.unreliable_dropped)
            .sum();
        Ok(ShardEnd { stale, verdict })
    };
    let driven = match drive_game(cfg, &mut server, DRAIN, shard) {
        Ok(Ok(d)) => d,
        outcome => {
            // A case whose players cannot all connect is a result (not ok), not the end of
            // the run: the other cases still get measured.
            if let Some(r) = relay {
                let _ = r.shutdown();
            }
            let last = server.quit().unwrap_or_default();
            let why = match outcome {
                Ok(Err(e)) => format!("connecting: {e}"),
                Err(e) => crate::error_chain(e.as_ref()),
                Ok(Ok(_)) => String::new(),
            };
            return Ok(GameRun::failed(cfg, last, why));
        }
    };
    let Driven {
        connected,
        connect: took,
        loaded,
        mut seen,
        measured: server_stats,
        drained,
        ends,
        ..
    } = driven;
    let seen = seen.pop().context("the players' figures")?;
    let mut errors = seen.errors.clone();
    // Inputs are counted from the start on both sides (a reset does not clear them).
    let inputs_lost = seen
        .inputs_total
        .saturating_sub(drained.game.inputs_received);
    let stale_protocol: u64 = ends.iter().map(|e| e.stale).sum();
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
    if inputs_lost > 0 {
        let v = Verdict::merge(ends.iter().filter_map(|e| e.verdict.as_ref()));
        errors.push(format!(
            "{inputs_lost} reliable inputs not delivered {} s after the last was sent; {}",
            DRAIN.as_secs(),
            v.describe(kernel_before, watch)
        ));
    }
    server_faults(
        &drained,
        &server_stats,
        "the server's sessions",
        &mut errors,
    );
    if seen.received == 0 {
        errors.push("the players received no snapshot in the measured phase".into());
    }
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

/// One shard's end: snapshots its players' protocol dropped as stale, and (when inputs were
/// missing after the drain) what its players' reliable senders did meanwhile.
#[derive(Default)]
struct ShardEnd {
    stale: u64,
    verdict: Option<Verdict>,
}

/// What the players that still held reliable data after the drain did while watched.
#[derive(Default)]
struct Verdict {
    pending: usize,
    stalled: usize,
    moving: usize,
    srtt_ms: Vec<f64>,
    rtos: u64,
    no_sample: usize,
}

impl Verdict {
    fn merge<'a>(parts: impl Iterator<Item = &'a Verdict>) -> Verdict {
        let mut all = Verdict::default();
        for p in parts {
            all.pending += p.pending;
            all.stalled += p.stalled;
            all.moving += p.moving;
            all.srtt_ms.extend(&p.srtt_ms);
            all.rtos = all.rtos.max(p.rtos);
            all.no_sample += p.no_sample;
        }
        all
    }

    /// Why inputs were missing: stalled senders (sent no reliable fragment while watched for
    /// `watch`, which well exceeds the largest retransmission timeout: a protocol fault) or
    /// senders still retransmitting (delivery slowed by overload: their RTT and RTO counts,
    /// and the host's UDP receive-buffer drops since `kernel_before`, say how much).
    fn describe(
        mut self,
        kernel_before: Option<ricochet_platform::KernelCounters>,
        watch: Duration,
    ) -> String {
        self.srtt_ms.sort_by(f64::total_cmp);
        let median = self
            .srtt_ms
            .get(self.srtt_ms.len() / 2)
            .copied()
            .unwrap_or(0.0);
        let drops = crate::kernel::around(kernel_before, crate::kernel::snapshot())
            .map_or("unknown".to_string(), |k| {
                k.delta.udp_rcvbuf_errors.to_string()
            });
        let kind = if self.stalled > 0 {
            "STALLED (no reliable fragment sent while data was pending: a protocol fault)"
        } else {
            "slow under overload, not stuck (every such sender was still retransmitting)"
        };
        format!(
            "{kind}: {} players still held reliable data, {} sent no reliable fragment in the \
             next {:.1} s, {} kept retransmitting (their median smoothed RTT {median:.0} ms, up \
             to {} RTOs, {} without any RTT sample); UDP receive-buffer drops on this host \
             since the server started: {drops}",
            self.pending,
            self.stalled,
            watch.as_secs_f64(),
            self.moving,
            self.rtos,
            self.no_sample,
        )
    }
}

/// The players of one shard that still hold reliable data (queued, or sent and not
/// acknowledged), watched for `watch`: those that sent no reliable fragment meanwhile, and
/// those still retransmitting.
fn drain_verdict(set: &mut ricochet::ClientSet, watch: Duration) -> Result<Verdict> {
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
    let mut v = Verdict {
        pending: first.len(),
        ..Verdict::default()
    };
    for &(i, before) in &first {
        let Some(now) = pending(set, i) else {
            continue; // delivered meanwhile
        };
        if now == before {
            v.stalled += 1;
        } else {
            v.moving += 1;
        }
        if let Some(d) = set.get(i).and_then(|c| c.detail()) {
            v.srtt_ms.push(d.srtt.as_secs_f64() * 1e3);
            v.rtos = v.rtos.max(d.rto_count);
            v.no_sample += usize::from(d.rtt.samples == 0);
        }
    }
    Ok(v)
}
