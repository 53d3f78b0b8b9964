//! The front page of `PERFORMANCE.md`: how fast, against what. One table per question, each
//! from the newest result file that answers it (side by side, in one run), naming that file and
//! its command. Everything else goes to the archive page.

use std::fmt::Write as _;

use anyhow::Result;
use serde_json::Value;

use super::charts::bars;
use super::ctx::Ctx;
use super::{md_table, Input, FRONT_SECTION};
use crate::output::thousands;
use crate::schema::{GameRun, ResultFile, RudpCase, SessionsRun, UdpRun};
use crate::stats::median;

fn int(x: f64) -> String {
    thousands(x.max(0.0).round() as u64)
}

fn ms(us: f64) -> String {
    format!("{:.2} ms", us / 1000.0)
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}×", a / b)
    } else {
        "-".into()
    }
}

/// Where a table's figures come from: the file and the command that wrote it.
fn source(path: &str, command: &str) -> String {
    format!("From `{path}`: `{}`\n\n", command.replace('`', "'").trim())
}

/// The median of `f` over `runs`.
fn med<T>(runs: &[&T], f: impl Fn(&T) -> Option<f64>) -> Option<f64> {
    median(&runs.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
}

/// The newest bench file (the inputs are in path order, so the last) that `pick` accepts.
fn newest<'a, T>(cx: &'a Ctx, pick: impl Fn(&'a ResultFile) -> Option<T>) -> Option<(&'a str, T)> {
    cx.inputs.files.iter().rev().find_map(|(p, i)| match i {
        Input::Bench(f) => pick(f).map(|t| (p.as_str(), t)),
        _ => None,
    })
}

/// Renders the front page.
pub(super) fn render(cx: &mut Ctx) -> Result<()> {
    let mut body = String::from(
        "Each table below comes from the newest result under `results/` that measured both sides \
         in one run (the VM's speed changes from boot to boot, so only figures of one run \
         compare). Medians over the rounds. The full archive, the environment of every file and \
         the notes on each measurement are in [docs/perf/archive.md](docs/perf/archive.md).\n\n",
    );
    sessions_against_floor(cx, &mut body)?;
    udp_against_tokio(cx, &mut body);
    loss_with_fec(cx, &mut body)?;
    many_sessions(cx, &mut body);
    game_tick(cx, &mut body)?;
    security_cost(cx, &mut body);
    other_languages(cx, &mut body);
    super::ops::render(cx, &mut body);
    super::lanes::render(cx, &mut body)?;
    super::large_messages::render(cx, &mut body);
    cx.section(FRONT_SECTION, body);
    Ok(())
}

/// The ok echo runs of `f`, when it holds both Ricochet's and the kernel floor's.
fn echo_runs(f: &ResultFile) -> Option<Vec<&SessionsRun>> {
    let runs: Vec<&SessionsRun> = f
        .sessions_runs
        .iter()
        .filter(|r| r.ok && r.config.mode == "echo" && r.config.window == 1)
        .collect();
    let both =
        runs.iter().any(|r| r.config.is_floor()) && runs.iter().any(|r| !r.config.is_floor());
    both.then_some(runs)
}

fn client_counts<T>(runs: &[&T], n: impl Fn(&T) -> usize) -> Vec<usize> {
    let mut v: Vec<usize> = runs.iter().map(|r| n(r)).collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn sessions_against_floor(cx: &mut Ctx, body: &mut String) -> Result<()> {
    body.push_str("## Echo against the kernel floor\n\n");
    let Some((path, (f, runs))) = newest(cx, |f| echo_runs(f).map(|r| (f, r))) else {
        body.push_str("No `bench sessions --stack ricochet,kernel` echo yet.\n\n");
        return Ok(());
    };
    let _ = write!(
        body,
        "Every client keeps one message in flight (window 1, {} B), all clients on one thread, the \
         server in its own process. The kernel floor is the same traffic over plain UDP sockets \
         and a plain echo server: no protocol, no encryption, no sessions.\n\n{}",
        runs[0].config.payload,
        source(path, &f.command_line)
    );
    let (mut rows, mut labels, mut values) = (Vec::new(), Vec::new(), Vec::new());
    for n in client_counts(&runs, |r| r.config.clients) {
        let of = |floor: bool| -> Vec<&SessionsRun> {
            runs.iter()
                .copied()
                .filter(|r| r.config.clients == n && r.config.is_floor() == floor)
                .collect()
        };
        let (ours, floor) = (of(false), of(true));
        let rt = |rs: &[&SessionsRun]| med(rs, |r| Some(r.round_trips_per_s));
        let p99 = |rs: &[&SessionsRun]| med(rs, |r| r.rtt_us.map(|l| l.p99));
        let (Some(a), Some(b)) = (rt(&ours), rt(&floor)) else {
            continue;
        };
        rows.push(vec![
            thousands(n as u64),
            int(a),
            int(b),
            ratio(a, b),
            p99(&ours).map_or("-".into(), ms),
            p99(&floor).map_or("-".into(), ms),
        ]);
        for (who, v) in [("Ricochet", a), ("kernel floor", b)] {
            labels.push(format!("{who}, {} sessions", thousands(n as u64)));
            values.push(v);
        }
    }
    body.push_str(&md_table(
        &[
            "sessions",
            "Ricochet rt/s",
            "kernel floor rt/s",
            "Ricochet / floor",
            "Ricochet p99",
            "floor p99",
        ],
        1,
        &rows,
    ));
    body.push('\n');
    let c = bars(
        "headline-echo.svg",
        "Echo, window 1: round trips/s",
        "round trips/s",
        &labels,
        &values,
    )?;
    body.push_str(&cx.chart(c, "echo against the kernel floor"));
    body.push('\n');
    Ok(())
}

/// The ok runs of a `bench udp` file that measured Ricochet's per-core server beside tokio's.
fn tokio_runs(f: &ResultFile) -> Option<Vec<&UdpRun>> {
    if f.kind != "udp" {
        return None;
    }
    let runs: Vec<&UdpRun> = f
        .udp_runs
        .iter()
        .filter(|r| {
            r.ok && (r.label.starts_with("ricochet per-core") || r.label.starts_with("tokio"))
        })
        .collect();
    let both = runs.iter().any(|r| r.label.starts_with("tokio"))
        && runs.iter().any(|r| r.label.starts_with("ricochet"));
    both.then_some(runs)
}

fn udp_against_tokio(cx: &mut Ctx, body: &mut String) {
    body.push_str("## Plain UDP echo against tokio\n\n");
    let Some((path, (f, runs))) = newest(cx, |f| tokio_runs(f).map(|r| (f, r))) else {
        body.push_str("No `bench udp --server ricochet,tokio` result yet.\n\n");
        return;
    };
    let _ = write!(
        body,
        "The UDP echo server alone (no RUDP): Ricochet's per-core workers against a tokio \
         server with the same threads, the same clients.\n\n{}",
        source(path, &f.command_line)
    );
    let mut rows = Vec::new();
    for w in client_counts(&runs, |r| r.config.window) {
        let of = |tokio: bool| {
            runs.iter()
                .find(|r| r.config.window == w && r.label.starts_with("tokio") == tokio)
        };
        let (Some(a), Some(b)) = (of(false), of(true)) else {
            continue;
        };
        let p99 = |r: &UdpRun| r.rtt_us.map_or("-".into(), |l| ms(l.p99));
        rows.push(vec![
            format!("{} × window {w}, {} B", a.config.clients, a.config.payload),
            int(a.round_trips_per_s),
            int(b.round_trips_per_s),
            ratio(a.round_trips_per_s, b.round_trips_per_s),
            p99(a),
            p99(b),
        ]);
    }
    body.push_str(&md_table(
        &[
            "clients",
            "Ricochet rt/s",
            "tokio rt/s",
            "Ricochet / tokio",
            "Ricochet p99",
            "tokio p99",
        ],
        1,
        &rows,
    ));
    body.push('\n');
}

/// Network conditions of the RUDP matrix, in table order.
const CONDITIONS: [&str; 3] = ["none", "random", "burst"];

/// The ok cases of an RUDP file with ARQ only and adaptive FEC under loss, on one setup (the
/// first case's IO model and backend).
fn fec_cases(f: &ResultFile) -> Option<(String, Vec<&RudpCase>)> {
    let first = f.rudp_cases.first()?;
    let setup = first.label.rsplit(" · ").next()?.to_string();
    let cases: Vec<&RudpCase> = f
        .rudp_cases
        .iter()
        .filter(|c| c.ok && c.label.ends_with(&setup))
        .collect();
    let has = |p: &str| {
        cases
            .iter()
            .any(|c| c.label.starts_with(p) && c.label.contains("random"))
    };
    (has("ARQ only") && has("adaptive FEC")).then_some((setup, cases))
}

fn loss_with_fec(cx: &mut Ctx, body: &mut String) -> Result<()> {
    body.push_str("## Loss, with and without FEC\n\n");
    let Some((path, (f, (setup, cases)))) = newest(cx, |f| fec_cases(f).map(|c| (f, c))) else {
        body.push_str("No RUDP result with ARQ only and adaptive FEC under loss yet.\n\n");
        return Ok(());
    };
    let cfg = &cases[0].rounds[0].config;
    let _ = write!(
        body,
        "The RUDP echo through the impairment relay ({} clients × window {}, {} B, {setup}): \
         `random` and `burst` are the reference report's loss conditions. ARQ only resends what \
         was lost; adaptive FEC sends repairs at a ratio set by the loss the peer reports.\n\n{}",
        cfg.clients,
        cfg.window,
        thousands(cfg.payload as u64),
        source(path, &f.command_line)
    );
    let (mut rows, mut labels, mut values) = (Vec::new(), Vec::new(), Vec::new());
    for cond in CONDITIONS {
        let case = |policy: &str| {
            cases
                .iter()
                .find(|c| c.label.starts_with(policy) && c.label.contains(&format!(" · {cond} · ")))
        };
        let (Some(arq), Some(fec)) = (case("ARQ only"), case("adaptive FEC")) else {
            continue;
        };
        let m =
            |c: &RudpCase, f: fn(&crate::schema::RudpSummary) -> Option<crate::schema::Spread>| {
                f(&c.summary).map(|s| s.median)
            };
        let p99 = |c: &RudpCase| m(c, |s| s.p99_us);
        let rt = |c: &RudpCase| m(c, |s| s.round_trips_per_s);
        rows.push(vec![
            cond.to_string(),
            p99(arq).map_or("-".into(), ms),
            p99(fec).map_or("-".into(), ms),
            rt(arq).map_or("-".into(), int),
            rt(fec).map_or("-".into(), int),
            m(arq, |s| s.retransmitted_per_1000).map_or("-".into(), |x| format!("{x:.1}")),
            m(fec, |s| s.recovered_per_1000).map_or("-".into(), |x| format!("{x:.1}")),
        ]);
        for (who, c) in [("ARQ only", arq), ("adaptive FEC", fec)] {
            labels.push(format!("{who}, {cond}"));
            values.push(p99(c).unwrap_or(0.0));
        }
    }
    body.push_str(&md_table(
        &[
            "loss",
            "ARQ p99",
            "FEC p99",
            "ARQ rt/s",
            "FEC rt/s",
            "ARQ retransmitted / 1,000",
            "FEC recovered / 1,000",
        ],
        1,
        &rows,
    ));
    body.push('\n');
    let c = bars(
        "headline-fec-p99.svg",
        "RUDP echo under loss: p99 RTT",
        "µs",
        &labels,
        &values,
    )?;
    body.push_str(&cx.chart(c, "RUDP p99 under loss, ARQ only and adaptive FEC"));
    body.push('\n');
    Ok(())
}

fn many_sessions(cx: &mut Ctx, body: &mut String) {
    body.push_str("## Many sessions on one server\n\n");
    let Some((path, (f, runs))) = newest(cx, |f| echo_runs(f).map(|r| (f, r))) else {
        body.push_str("No `bench sessions` echo yet.\n\n");
        return;
    };
    body.push_str(
        "Ricochet's server holding every session at once (connect tokens, every packet sealed): \
         how fast they connect, what each costs in server memory, and the echo rate over all \
         of them.\n\n",
    );
    body.push_str(&source(path, &f.command_line));
    let ours: Vec<&SessionsRun> = runs
        .iter()
        .copied()
        .filter(|r| !r.config.is_floor())
        .collect();
    let mut rows = Vec::new();
    for n in client_counts(&ours, |r| r.config.clients) {
        let rs: Vec<&SessionsRun> = ours
            .iter()
            .copied()
            .filter(|r| r.config.clients == n)
            .collect();
        rows.push(vec![
            thousands(n as u64),
            med(&rs, |r| Some(r.handshakes_per_s)).map_or("-".into(), int),
            med(&rs, |r| r.server_rss_per_session_bytes).map_or("-".into(), int),
            med(&rs, |r| Some(r.round_trips_per_s)).map_or("-".into(), int),
            med(&rs, |r| r.rtt_us.map(|l| l.p99)).map_or("-".into(), ms),
        ]);
    }
    body.push_str(&md_table(
        &[
            "sessions",
            "handshakes/s",
            "server RSS B / session",
            "echo rt/s",
            "p99",
        ],
        1,
        &rows,
    ));
    body.push('\n');
}

/// The ok runs of a `bench game` file with both Ricochet and the kernel floor.
fn game_runs(f: &ResultFile) -> Option<Vec<&GameRun>> {
    let runs: Vec<&GameRun> = f
        .game_runs
        .iter()
        .filter(|r| r.ok && r.config.relay_profile.is_none())
        .collect();
    let both =
        runs.iter().any(|r| r.config.is_floor()) && runs.iter().any(|r| !r.config.is_floor());
    both.then_some(runs)
}

fn game_tick(cx: &mut Ctx, body: &mut String) -> Result<()> {
    body.push_str("## Game tick\n\n");
    let Some((path, (f, runs))) = newest(cx, |f| game_runs(f).map(|r| (f, r))) else {
        body.push_str("No `bench game --stack ricochet,kernel` result yet.\n\n");
        return Ok(());
    };
    let cfg = &runs[0].config;
    let _ = write!(
        body,
        "A server ticking at {} Hz sends every player a {} B snapshot per tick (unreliable, \
         newest wins); every player sends a reliable input per tick. Snapshot latency runs from \
         the server's send to the player's receive. The kernel floor sends the same datagrams \
         over plain sockets.\n\n{}",
        cfg.tick_hz,
        cfg.snapshot_bytes,
        source(path, &f.command_line)
    );
    let (mut rows, mut labels, mut values) = (Vec::new(), Vec::new(), Vec::new());
    for n in client_counts(&runs, |r| r.config.players) {
        for floor in [false, true] {
            let rs: Vec<&GameRun> = runs
                .iter()
                .copied()
                .filter(|r| r.config.players == n && r.config.is_floor() == floor)
                .collect();
            if rs.is_empty() {
                continue;
            }
            let who = if floor { "kernel floor" } else { "Ricochet" };
            let p99 = med(&rs, |r| r.snapshot_latency_us.map(|l| l.p99));
            rows.push(vec![
                thousands(n as u64),
                who.into(),
                med(&rs, |r| r.snapshot_latency_us.map(|l| l.p50)).map_or("-".into(), ms),
                p99.map_or("-".into(), ms),
                med(&rs, |r| Some(r.server_cpu_us_per_tick)).map_or("-".into(), int),
                med(&rs, |r| Some(r.snapshots_lost as f64)).map_or("-".into(), int),
                med(&rs, |r| Some(r.inputs_lost as f64)).map_or("-".into(), int),
            ]);
            labels.push(format!("{who}, {} players", thousands(n as u64)));
            values.push(p99.unwrap_or(0.0));
        }
    }
    body.push_str(&md_table(
        &[
            "players",
            "stack",
            "snapshot p50",
            "snapshot p99",
            "server CPU µs / tick",
            "snapshots lost",
            "inputs lost",
        ],
        2,
        &rows,
    ));
    body.push('\n');
    let c = bars(
        "headline-game-p99.svg",
        "Game tick: snapshot latency p99",
        "µs",
        &labels,
        &values,
    )?;
    body.push_str(&cx.chart(c, "game tick snapshot p99"));
    body.push('\n');
    Ok(())
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64).filter(|x| x.is_finite())
}

fn security_cost(cx: &mut Ctx, body: &mut String) {
    body.push_str("## Security cost per message size\n\n");
    let newest = cx.newest(|i| match i {
        Input::Crypto(v) => Some(v),
        _ => None,
    });
    let Some((path, v)) = newest else {
        body.push_str("No `bench crypto` result yet.\n\n");
        return;
    };
    body.push_str(
        "What sealing and opening one packet costs (AES-128-GCM, the header as associated \
         data): a round trip seals and opens two packets.\n\n",
    );
    body.push_str(&source(
        &path,
        v.get("command").and_then(Value::as_str).unwrap_or(""),
    ));
    let mut rows = Vec::new();
    for r in v
        .get("results")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|r| r.get("crate").and_then(Value::as_str) == Some("ricochet-proto"))
    {
        let (Some(bytes), Some(seal), Some(open)) =
            (num(r, "body_bytes"), num(r, "seal_ns"), num(r, "open_ns"))
        else {
            continue;
        };
        rows.push(vec![
            int(bytes),
            format!("{seal:.0}"),
            format!("{open:.0}"),
            format!("{:.2}", 2.0 * (seal + open) / 1000.0),
        ]);
    }
    body.push_str(&md_table(
        &["packet body B", "seal ns", "open ns", "per round trip µs"],
        1,
        &rows,
    ));
    body.push('\n');
}

/// The C and C# clients (through the C ABI) against the Rust client, one server, one run.
fn other_languages(cx: &mut Ctx, body: &mut String) {
    body.push_str("## Clients in C and C# (the C ABI)\n\n");
    let newest = cx.inputs.files.iter().rev().find_map(|(p, i)| match i {
        Input::Ffi(v) => Some((p.clone(), v.clone())),
        _ => None,
    });
    let Some((path, v)) = newest else {
        body.push_str("No `bench ffi` result yet.\n\n");
        return;
    };
    let _ = write!(
        body,
        "{} clients × {} in flight × {} B echoed by one Rust server, direct; each client kind \
         in a process of its own, the kinds alternated, median of the rounds.\n\n",
        num(&v, "clients").map_or("-".into(), int),
        num(&v, "window").map_or("-".into(), int),
        num(&v, "payload").map_or("-".into(), int),
    );
    body.push_str(&source(
        &path,
        v.get("command").and_then(Value::as_str).unwrap_or(""),
    ));
    let rows: Vec<Vec<String>> = v
        .get("kinds")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|k| {
            vec![
                k.get("kind")
                    .and_then(Value::as_str)
                    .unwrap_or("-")
                    .to_string(),
                num(k, "median_round_trips_per_s").map_or("-".into(), int),
                num(k, "ratio_to_rust").map_or("-".into(), |r| format!("{r:.2}×")),
            ]
        })
        .collect();
    body.push_str(&md_table(&["client", "round trips/s", "× Rust"], 1, &rows));
    body.push('\n');
}
