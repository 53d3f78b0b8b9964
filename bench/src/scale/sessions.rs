//! `bench sessions`: N clients connected at once to one server (in its own process), all
//! driven by one [`ClientSet`] on one thread.
//!
//! - **idle**: connect all of them (handshakes per second), let them sit (keepalives only), and
//!   weigh the server: resident memory per session.
//! - **echo**: then each keeps `window` messages in flight (1 by default): round trips per
//!   second, RTT percentiles, CPU of the server process (also per round trip) and of the load
//!   generator, whose clients run in `--load-threads` shards (a `ClientSet` per thread).
//! - **churn**: batches of fresh clients, one after another for the measured time, the N
//!   clients in `--load-threads` shards that churn side by side (the `churn` module): each
//!   connects with a new token, sends one message, gets its echo and closes (a fleet that
//!   restarts). Whole sessions per second, reported as the handshake rate; a batch's time runs
//!   from its first socket opened to its last closed (token minting, a backend's work, is
//!   not counted). Each batch comes
//!   from addresses no earlier batch used: from one address, the server's per-address
//!   handshake limit (`max_handshakes_per_address`) would drop cookie echoes past it, and the
//!   run would measure that limit and the clients' retry timer instead of the handshake path.

use std::net::SocketAddr;
use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use ricochet::{ClientEvent, ClientSet};

use super::churn::{drive_churn, Batch};
use super::echo_meter::{drive_echo, failed, server_spec, EchoMeter, EchoSeen};
use super::load::{Control, Phase, SERVE_TURN};
use super::server::{ServerKind, ServerProcess};
use super::setup::{
    connect_all, connect_range, groups, idle_for, member_config, token_key, unmeasured_stack,
};
use crate::output::thousands;
use crate::schema::{finite, ClientTotals, ServerStats, SessionsConfig, SessionsRun};

impl ClientTotals {
    /// Sums the counters of every member of `set`.
    pub fn of(set: &ClientSet) -> Self {
        let mut t = Self::default();
        for d in (0..set.len()).filter_map(|i| set.get(i).and_then(|c| c.detail())) {
            t.packets_sent += d.packets_sent;
            t.packets_received += d.packets_received;
            t.segments_retransmitted += d.segments_retransmitted;
            t.tail_loss_probes += d.tail_loss_probes;
            t.rto_count += d.rto_count;
            t.packets_spurious_lost += d.packets_spurious_lost;
        }
        t
    }
}

/// Table columns of one case (its rounds), from `rounds` to `ok`: what `bench sessions` prints
/// and `bench report` renders, medians over the rounds.
pub const SUMMARY_COLUMNS: [&str; 16] = [
    "rounds",
    "connect s",
    "handshakes/s",
    "RSS B/session",
    "loaded RSS B/session",
    "rt/s",
    "p50 ms",
    "p99 ms",
    "p99.9 ms",
    "max ms",
    "server CPU %",
    "server µs/op",
    "client CPU %",
    "load sat.",
    "steal %",
    "ok",
];

/// The [`SUMMARY_COLUMNS`] cells of one case's rounds `rs`.
pub fn summary_cells(rs: &[&SessionsRun]) -> Vec<String> {
    let m = |f: &dyn Fn(&SessionsRun) -> Option<f64>| {
        crate::stats::median(&rs.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
    };
    let int = |x: Option<f64>| x.map_or("-".into(), |v| thousands(v.max(0.0).round() as u64));
    let ms = |x: Option<f64>| x.map_or("-".into(), |v| format!("{:.2}", v / 1000.0));
    let pct = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.0}"));
    let echo = rs.iter().all(|r| r.config.mode == "echo");
    vec![
        rs.len().to_string(),
        m(&|r| Some(r.connect_s)).map_or("-".into(), |v| format!("{v:.2}")),
        int(m(&|r| Some(r.handshakes_per_s))),
        int(m(&|r| r.server_rss_per_session_bytes)),
        int(m(&|r| r.loaded_rss_per_session_bytes())),
        if echo {
            int(m(&|r| Some(r.round_trips_per_s)))
        } else {
            "-".into()
        },
        ms(m(&|r| r.rtt_us.map(|l| l.p50))),
        ms(m(&|r| r.rtt_us.map(|l| l.p99))),
        ms(m(&|r| r.rtt_us.map(|l| l.p999))),
        ms(m(&|r| r.rtt_us.map(|l| l.max))),
        pct(m(&|r| r.server_cpu_percent)),
        // Per round trip (echo) or per session (churn).
        m(&|r| {
            r.server_cpu_us_per_round_trip
                .or(r.server_cpu_us_per_session)
        })
        .map_or("-".into(), |v| format!("{v:.2}")),
        pct(m(&|r| r.client_cpu_percent)),
        {
            let known: Vec<bool> = rs
                .iter()
                .filter_map(|r| r.load.as_ref().map(|l| l.saturated))
                .collect();
            match known.iter().filter(|&&s| s).count() {
                _ if known.is_empty() => "-".into(),
                0 => "no".into(),
                s if s == known.len() => "SAT".into(),
                s => format!("{s}/{}", known.len()),
            }
        },
        pct(m(&|r| r.steal_percent)),
        if rs.iter().all(|r| r.ok) { "yes" } else { "NO" }.into(),
    ]
}

fn message(member: usize, seq: u64, payload: usize) -> Bytes {
    let mut m = vec![0u8; payload.max(16)];
    m[..8].copy_from_slice(&(member as u64).to_le_bytes());
    m[8..16].copy_from_slice(&seq.to_le_bytes());
    Bytes::from(m)
}

/// The most echo messages a client keeps in flight.
pub const MAX_WINDOW: usize = 64;

/// Runs one measurement.
pub fn run(cfg: &SessionsConfig) -> Result<SessionsRun> {
    if !(1..=MAX_WINDOW).contains(&cfg.window) {
        anyhow::bail!("an echo window of {} (1 to {MAX_WINDOW})", cfg.window);
    }
    match cfg.stack.as_deref() {
        None | Some("ricochet") => {}
        #[cfg(target_os = "linux")]
        Some("kernel") => return super::floor::run(cfg),
        Some(other) => return Err(unmeasured_stack(other)),
    }
    let key = token_key(&cfg.security)?;
    let mut server = ServerProcess::start(&server_spec(cfg, ServerKind::Echo, key))?;
    let before = server.stats()?;
    if cfg.mode == "churn" {
        return churn(cfg, key, server, before);
    }
    if cfg.mode == "echo" {
        return echo(cfg, key, server, before);
    }
    let mut errors = Vec::new();
    let (mut set, took) = match connect_clients(cfg, key, server.addr) {
        Ok(x) => x,
        Err(e) => {
            let last = server.quit().unwrap_or_default();
            return Ok(failed(
                cfg,
                last,
                format!("connecting: {}", crate::error_chain(e.as_ref())),
            ));
        }
    };
    let connected = set.connected();
    idle_for(&mut set, Duration::from_secs_f64(cfg.settle_s))?;
    let idle = server.stats()?;
    if idle.sessions != cfg.clients {
        errors.push(format!(
            "the server holds {} sessions, not {}",
            idle.sessions, cfg.clients
        ));
    }
    let per_session = match (before.rss_kib, idle.rss_kib) {
        (Some(a), Some(b)) if connected > 0 => {
            Some(finite((b as f64 - a as f64) * 1024.0 / connected as f64))
        }
        _ => None,
    };
    let mut run = SessionsRun {
        config: cfg.clone(),
        connected,
        connect_s: finite(took.as_secs_f64()),
        handshakes_per_s: finite(connected as f64 / took.as_secs_f64().max(1e-9)),
        server_rss_before_kib: before.rss_kib,
        server_rss_idle_kib: idle.rss_kib,
        server_rss_per_session_bytes: per_session,
        server_rss_end_kib: idle.rss_kib,
        server_rss_loaded_kib: None,
        round_trips: 0,
        round_trips_per_s: 0.0,
        rtt_us: None,
        min_client_round_trips: 0,
        server_cpu_percent: None,
        client_cpu_percent: None,
        steal_percent: None,
        clients_total: ClientTotals::default(),
        server_cpu_us_per_round_trip: None,
        server_cpu_us_per_session: None,
        load: None,
        server: idle.clone(),
        errors: Vec::new(),
        ok: false,
    };
    drop(set);
    run.quit_server(server, &mut errors);
    run.ok = errors.is_empty() && run.connected == cfg.clients;
    run.errors = errors;
    Ok(run)
}

/// `cfg.clients` fresh clients of `cfg`'s profile connected to `server` in one set, within
/// [`connect_limit`].
fn connect_clients(
    cfg: &SessionsConfig,
    key: Option<[u8; 32]>,
    server: SocketAddr,
) -> Result<(ClientSet, Duration)> {
    connect_all(
        server,
        server,
        key,
        cfg.clients,
        cfg.clients_per_ip,
        0,
        |ip, seed| member_config(&cfg.profile, &cfg.backend, ip, seed),
        connect_limit(cfg),
    )
}

/// How long connecting `cfg.clients` may take: 30 s plus 3 ms per client.
fn connect_limit(cfg: &SessionsConfig) -> Duration {
    Duration::from_secs(30) + Duration::from_millis(3 * cfg.clients as u64)
}

/// Churn: batches of fresh clients in `cfg.load_threads` shards ([`drive_churn`]) until
/// `cfg.seconds` have passed, each connecting, sending one message, awaiting its echo and
/// closing. The time counted is the batches' (token minting, like a backend's, is not).
fn churn(
    cfg: &SessionsConfig,
    key: Option<[u8; 32]>,
    mut server: ServerProcess,
    before: ServerStats,
) -> Result<SessionsRun> {
    server.reset()?;
    let addr = server.addr;
    let churned = drive_churn(cfg, |range, number| {
        churn_batch(cfg, key, addr, range, number)
    });
    let stats = server.stats()?;
    let mut run = failed(cfg, stats.clone(), String::new());
    run.errors.clear();
    run.set_churn(&churned, &stats);
    run.server_rss_before_kib = before.rss_kib;
    let mut errors = churned.errors;
    run.quit_server(server, &mut errors);
    run.ok = errors.is_empty() && churned.completed > 0;
    run.errors = errors;
    Ok(run)
}

/// One churn batch of clients `range` (batch `number` of its shard): connect them, send one
/// message each, close each once echoed.
fn churn_batch(
    cfg: &SessionsConfig,
    key: Option<[u8; 32]>,
    server: SocketAddr,
    range: Range<usize>,
    number: usize,
) -> Result<Batch> {
    let (mut set, took) = connect_range(
        (server, server),
        key,
        range,
        cfg.clients_per_ip,
        number * groups(cfg),
        false,
        |ip, seed| member_config(&cfg.profile, &cfg.backend, ip, seed),
        connect_limit(cfg),
    )
    .map_err(|e| e.context("connecting"))?;
    let t0 = Instant::now();
    let n = set.len();
    for i in 0..n {
        set.mark_changed(i);
        if let Some(c) = set.get_mut(i) {
            c.send(0, message(i, 0, cfg.payload))?;
        }
    }
    let mut echoed = vec![false; n];
    let mut left = n;
    let mut errors = Vec::new();
    let deadline = t0 + connect_limit(cfg);
    while left > 0 && Instant::now() < deadline {
        set.step(Duration::from_millis(5))?;
        while let Some((i, e)) = set.poll_event() {
            match e {
                ClientEvent::Message { .. } if !echoed[i] => {
                    echoed[i] = true;
                    left -= 1;
                    // Its session is done: close it now (the close leaves with the next
                    // turn's submission).
                    set.mark_changed(i);
                    if let Some(c) = set.get_mut(i) {
                        c.close();
                    }
                }
                // Its own close, once echoed; anything else ends it early.
                ClientEvent::Disconnected { reason, .. } if !echoed[i] => {
                    errors.push(format!("client {i} disconnected: {reason}"));
                }
                _ => {}
            }
        }
    }
    // One more turn sends the last closes; dropping the set closes the sockets, which is
    // part of a session's cost (the floor's closes are timed too).
    set.step(Duration::ZERO)?;
    drop(set);
    if left > 0 {
        errors.push(format!("{left} of {n} clients got no echo"));
    }
    Ok(Batch {
        completed: n - left,
        took: took + t0.elapsed(),
        errors,
    })
}

/// Echo with `cfg.window` messages in flight on every member, the members in
/// `cfg.load_threads` shards (a set each): connect, settle (the server weighed), warm-up, then
/// the measured phase.
fn echo(
    cfg: &SessionsConfig,
    key: Option<[u8; 32]>,
    mut server: ServerProcess,
    before: ServerStats,
) -> Result<SessionsRun> {
    let addr = server.addr;
    let shard = |range: Range<usize>, ctl: &Control<EchoSeen>| -> Result<ClientTotals> {
        let setup = connect_range(
            (addr, addr),
            key,
            range,
            cfg.clients_per_ip,
            0,
            false,
            |ip, seed| member_config(&cfg.profile, &cfg.backend, ip, seed),
            connect_limit(cfg),
        )
        .and_then(|(mut set, took)| {
            idle_for(&mut set, Duration::from_secs_f64(cfg.settle_s))?;
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
        let started = ctl.connected_serving(outcome, || match set.as_mut() {
            Some(s) => idle_for(s, SERVE_TURN),
            None => Ok(()),
        });
        let (Some(_), Some(mut set)) = (started, set) else {
            return Ok(ClientTotals::default());
        };
        let n = set.len();
        let mut meter = EchoMeter::start(cfg, n);
        let mut errors = Vec::new();
        for i in 0..n {
            set.mark_changed(i);
            if let Some(c) = set.get_mut(i) {
                for seq in 0..meter.window() {
                    c.send(0, message(i, seq, cfg.payload))?;
                }
            }
        }
        while ctl.phase() < Phase::Drain {
            if ctl.phase() == Phase::Measured {
                meter.begin_measuring();
            }
            set.step(Duration::from_millis(5))?;
            let now = Instant::now();
            while let Some((i, e)) = set.poll_event() {
                match e {
                    ClientEvent::Message { data, .. } => {
                        let got = data
                            .get(8..16)
                            .and_then(|b| <[u8; 8]>::try_from(b).ok())
                            .map(u64::from_le_bytes);
                        let next = meter.echoed(i, got, now);
                        set.mark_changed(i);
                        if let Some(c) = set.get_mut(i) {
                            c.send(0, message(i, next, cfg.payload))?;
                        }
                    }
                    ClientEvent::Disconnected { reason, .. } if errors.len() < 20 => {
                        errors.push(format!("client disconnected: {reason}"));
                    }
                    _ => {}
                }
            }
        }
        ctl.report(meter.finish(0, errors));
        while ctl.phase() < Phase::Done {
            idle_for(&mut set, Duration::from_millis(20))?;
        }
        Ok(ClientTotals::of(&set))
    };
    let mut run = failed(cfg, before.clone(), String::new());
    run.errors.clear();
    run.server_rss_before_kib = before.rss_kib;
    let mut errors = Vec::new();
    let (seen, totals) = match drive_echo(cfg, &mut server, &mut run, shard) {
        Ok(Ok(x)) => x,
        outcome => {
            let last = server.quit().unwrap_or_default();
            let why = match outcome {
                Ok(Err(e)) => format!("connecting: {e}"),
                Err(e) => crate::error_chain(e.as_ref()),
                Ok(Ok(_)) => String::new(),
            };
            return Ok(failed(cfg, last, why));
        }
    };
    if run.connected != cfg.clients {
        errors.push(format!(
            "{} of {} clients connected",
            run.connected, cfg.clients
        ));
    }
    run.server_rss_per_session_bytes = match (before.rss_kib, run.server_rss_idle_kib) {
        (Some(a), Some(b)) if run.connected > 0 => Some(finite(
            (b as f64 - a as f64) * 1024.0 / run.connected as f64,
        )),
        _ => None,
    };
    errors.extend(seen.errors);
    if seen.bad > 0 {
        errors.push(format!("{} echoes out of order or altered", seen.bad));
    }
    let mut all = ClientTotals::default();
    for t in totals {
        all.packets_sent += t.packets_sent;
        all.packets_received += t.packets_received;
        all.segments_retransmitted += t.segments_retransmitted;
        all.tail_loss_probes += t.tail_loss_probes;
        all.rto_count += t.rto_count;
        all.packets_spurious_lost += t.packets_spurious_lost;
    }
    run.clients_total = all;
    run.quit_server(server, &mut errors);
    run.ok = errors.is_empty() && run.connected == cfg.clients && run.min_client_round_trips > 0;
    run.errors = errors;
    Ok(run)
}
