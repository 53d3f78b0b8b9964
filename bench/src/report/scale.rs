//! The many-sessions sections: `bench sessions` and `bench game` results, and the simulated
//! heap per session from the gate baseline.

use std::fmt::Write as _;

use anyhow::Result;

use super::charts::bars;
use super::ctx::Ctx;
use super::md_table;
use super::Input;
use crate::output::thousands;
use crate::scale::sessions::{summary_cells, SUMMARY_COLUMNS};
use crate::schema::{GameRun, SessionsRun};
use crate::stats::median;

/// Result kinds rendered here.
pub const KINDS: [&str; 2] = ["sessions", "game"];

fn ms(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{:.2}", v / 1000.0))
}

fn int(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| thousands(v.max(0.0).round() as u64))
}

/// The newest file of `kind` (paths sort by host, date and time), with its runs.
fn newest<'a>(
    inputs: &'a super::Inputs,
    kind: &str,
) -> Option<(&'a str, &'a crate::schema::ResultFile)> {
    newest_where(inputs, kind, |_| true)
}

/// The newest file of `kind` that `keep` accepts.
fn newest_where<'a>(
    inputs: &'a super::Inputs,
    kind: &str,
    keep: impl Fn(&crate::schema::ResultFile) -> bool,
) -> Option<(&'a str, &'a crate::schema::ResultFile)> {
    inputs
        .files
        .iter()
        .filter_map(|(p, i)| match i {
            Input::Bench(f) if f.kind == kind && keep(f) => Some((p.as_str(), f)),
            _ => None,
        })
        .max_by(|a, b| (a.1.created_unix_s, a.0).cmp(&(b.1.created_unix_s, b.0)))
}

/// Renders the `sessions`, `game` and `session-memory` sections.
pub(super) fn render(cx: &mut Ctx) -> Result<()> {
    sessions(cx)?;
    game(cx)?;
    memory(cx);
    Ok(())
}

fn sessions(cx: &mut Ctx) -> Result<()> {
    // The newest file with a window-1 echo (the charts plot those); else the newest of any
    // mode. Runs with a larger window (the shape of another benchmark) are listed below.
    let with_echo = newest_where(cx.inputs, "sessions", |f| {
        f.sessions_runs
            .iter()
            .any(|r| r.config.mode == "echo" && r.config.window == 1)
    });
    let Some((path, file)) = with_echo.or_else(|| newest(cx.inputs, "sessions")) else {
        cx.section(
            "sessions",
            "No `bench sessions` result under `results/` yet.\n".into(),
        );
        return Ok(());
    };
    let path = path.to_string();
    let runs: Vec<SessionsRun> = file.sessions_runs.clone();
    let cases = groups(&runs, |r| {
        let c = &r.config;
        (
            c.clients,
            c.mode_label(),
            c.server_idle.clone(),
            c.security.clone(),
            c.is_floor(),
        )
    });
    let mut rows = Vec::new();
    let (mut labels, mut p99, mut rss) = (Vec::new(), Vec::new(), Vec::new());
    for ((n, mode, idle, security, floor), rs) in &cases {
        let m = |f: &dyn Fn(&SessionsRun) -> Option<f64>| {
            median(&rs.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
        };
        let echo = mode == "echo";
        let p = m(&|r| r.rtt_us.map(|l| l.p99));
        let b = m(&|r| r.server_rss_per_session_bytes);
        let what = if *floor {
            format!("{mode}, kernel floor")
        } else {
            format!("{mode}, {idle}, {security}")
        };
        let mut row = vec![thousands(*n as u64), what];
        row.extend(summary_cells(rs));
        rows.push(row);
        // The charts show Ricochet; the floor has no sessions to weigh.
        if echo && !floor {
            labels.push(format!(
                "{} clients ({idle}, {security})",
                thousands(*n as u64)
            ));
            p99.push(p.unwrap_or(0.0) / 1000.0);
            rss.push(b.unwrap_or(0.0));
        }
    }
    let mut body = format!(
        "From `{path}` ({}, load average at start {}): N clients connected at once to one server \
         process (2 workers unless the JSON says otherwise), all driven by one `ClientSet` on one \
         thread of the bench; then a window-1 echo of 64 B on every client. Medians over the \
         rounds. RSS per session is the server process's resident memory growth from before \
         the first client to every client connected and idle, divided by N. A *kernel floor* row \
         (`--stack kernel`) carries the same traffic over plain UDP sockets and a plain \
         `recvmmsg`/`sendmmsg` echo server, with no protocol, run in turn with Ricochet's rounds: \
         at window 1, what the machine's kernel allows, and so the most any protocol could \
         reach here (its connect time is opening the sockets). With a window of messages it is \
         a plain-sockets baseline: Ricochet's batched sends can pass it.\n\n",
        file.created_utc,
        file.host
            .load_average
            .map_or("unknown".into(), |l| format!("{:.1}", l[0]))
    );
    let mut header = vec!["clients", "mode, server idle, security"];
    header.extend(SUMMARY_COLUMNS);
    body.push_str(&md_table(&header, 2, &rows));
    if !labels.is_empty() {
        body.push('\n');
        let c = bars(
            "sessions-p99.svg",
            "Echo p99 RTT by sessions",
            "ms",
            &labels,
            &p99,
        )?;
        body.push_str(&cx.chart(c, "echo p99 RTT against the session count"));
        let c = bars(
            "sessions-rss.svg",
            "Server RSS per session",
            "bytes",
            &labels,
            &rss,
        )?;
        body.push_str(&cx.chart(c, "server RSS per session against the session count"));
    }
    let _ = writeln!(body, "\nCommand: `{}`", file.command_line.replace('`', "'"));
    body.push_str(&same_day_sessions(cx.inputs, &path));
    cx.section("sessions", body);
    Ok(())
}

/// `runs` grouped by `key`, groups in the order their first run appears.
fn groups<R, K: PartialEq>(runs: &[R], key: impl Fn(&R) -> K) -> Vec<(K, Vec<&R>)> {
    let mut out: Vec<(K, Vec<&R>)> = Vec::new();
    for r in runs {
        let k = key(r);
        match out.iter_mut().find(|(g, _)| *g == k) {
            Some((_, rs)) => rs.push(r),
            None => out.push((k, vec![r])),
        }
    }
    out
}

/// Every other `kind` result file of the newest one's directory (one host name, one day) that
/// ran on the same CPU model and kernel (a cloud machine of one name may come back on other
/// hardware after a restart), oldest first, by file name.
fn same_day_files<'a>(
    inputs: &'a super::Inputs,
    newest: &str,
    kind: &str,
) -> Vec<(&'a str, &'a crate::schema::ResultFile)> {
    let dir = |p: &str| {
        p.rsplit_once('/')
            .map_or(String::new(), |(d, _)| d.to_string())
    };
    let machine = |f: &crate::schema::ResultFile| (f.host.cpu_model.clone(), f.host.kernel.clone());
    let newest_machine = inputs.files.iter().find_map(|(p, i)| match i {
        Input::Bench(f) if p == newest => Some(machine(f)),
        _ => None,
    });
    let mut files: Vec<(&str, &crate::schema::ResultFile)> = inputs
        .files
        .iter()
        .filter_map(|(p, i)| match i {
            Input::Bench(f)
                if f.kind == kind
                    && p != newest
                    && dir(p) == dir(newest)
                    && newest_machine.as_ref() == Some(&machine(f)) =>
            {
                Some((p.as_str(), f))
            }
            _ => None,
        })
        .collect();
    files.sort_by_key(|(p, f)| (f.created_unix_s, *p));
    files
        .into_iter()
        .map(|(p, f)| (p.rsplit('/').next().unwrap_or(p), f))
        .collect()
}

/// A bullet per file: its name and the command that wrote it.
fn command_list(files: &[(&str, &crate::schema::ResultFile)]) -> String {
    let mut commands = String::new();
    for (name, f) in files {
        let _ = writeln!(
            commands,
            "- `{name}`: `{}`",
            f.command_line.replace('`', "'")
        );
    }
    commands
}

/// Every other `bench sessions` file of the newest one's directory (one host, one day, so one
/// boot of the machine most likely): a row per case, with its workers, pinning and command.
fn same_day_sessions(inputs: &super::Inputs, newest: &str) -> String {
    let files = same_day_files(inputs, newest, "sessions");
    if files.is_empty() {
        return String::new();
    }
    let commands = command_list(&files);
    let mut rows = Vec::new();
    for (name, f) in &files {
        let cases = groups(&f.sessions_runs, |r| {
            let c = &r.config;
            (
                c.clients,
                c.mode_label(),
                c.io_threads,
                crate::schema::server_pinning(c.server_pinning.as_deref()).to_string(),
                c.security.clone(),
                c.is_floor(),
            )
        });
        for (k, rs) in &cases {
            let what = if k.5 {
                format!("{}, kernel floor, {} threads", k.1, k.2)
            } else {
                format!("{}, {} × {}, {}", k.1, k.2, k.3, k.4)
            };
            let mut row = vec![format!("`{name}`"), thousands(k.0 as u64), what];
            row.extend(summary_cells(rs));
            rows.push(row);
        }
    }
    let mut header = vec!["file", "clients", "mode, workers × pinning, security"];
    header.extend(SUMMARY_COLUMNS);
    format!(
        "\nThe other `bench sessions` runs of that day, same host (medians over each file's \
         rounds):\n\n{}\n{commands}",
        md_table(&header, 3, &rows)
    )
}

fn game(cx: &mut Ctx) -> Result<()> {
    let Some((path, file)) = newest(cx.inputs, "game") else {
        cx.section(
            "game",
            "No `bench game` result under `results/` yet.\n".into(),
        );
        return Ok(());
    };
    let path = path.to_string();
    let runs: Vec<GameRun> = file.game_runs.clone();
    let cases = groups(&runs, |r| {
        (
            r.config.players,
            r.config.relay_profile.clone(),
            game_stack(&r.config),
        )
    });
    let mut rows = Vec::new();
    let (mut labels, mut p99, mut rss) = (Vec::new(), Vec::new(), Vec::new());
    for ((n, relay, stack), rs) in &cases {
        let m = |f: &dyn Fn(&GameRun) -> Option<f64>| {
            median(&rs.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
        };
        let path_name = relay
            .clone()
            .map_or("direct".into(), |p| format!("relay {p}"));
        let p = m(&|r| r.snapshot_latency_us.map(|l| l.p99));
        let b = m(&|r| r.server_rss_per_session_bytes);
        rows.push(vec![
            thousands(*n as u64),
            format!("{path_name}, {stack}"),
            rs.len().to_string(),
            m(&|r| Some(r.ticks_per_s)).map_or("-".into(), |v| format!("{v:.1}")),
            int(m(&|r| Some((r.ticks_late + r.ticks_skipped) as f64))),
            ms(m(&|r| r.snapshot_latency_us.map(|l| l.p50))),
            ms(p),
            ms(m(&|r| r.snapshot_latency_us.map(|l| l.p999))),
            ms(m(&|r| r.snapshot_latency_us.map(|l| l.max))),
            int(m(&|r| Some(r.snapshots_lost as f64))),
            int(m(&|r| Some(r.snapshots_stale as f64))),
            int(m(&|r| Some(r.inputs_lost as f64))),
            m(&|r| Some(r.server_cpu_percent)).map_or("-".into(), |v| format!("{v:.1}")),
            int(m(&|r| Some(r.server_cpu_us_per_tick))),
            int(b),
            if rs.iter().all(|r| r.ok) {
                "yes".into()
            } else {
                "NO".into()
            },
        ]);
        labels.push(format!(
            "{} players, {path_name}{}",
            thousands(*n as u64),
            if rs.iter().any(|r| r.config.is_floor()) {
                ", floor"
            } else {
                ""
            }
        ));
        p99.push(p.unwrap_or(0.0) / 1000.0);
        rss.push(b.unwrap_or(0.0));
    }
    let mut body = format!(
        "From `{path}` ({}, load average at start {}): N players on one game server process \
         ticking at the configured rate (60 Hz unless the JSON says otherwise): every tick a \
         snapshot to every player on the unreliable-sequenced channel, every player a 32 B input \
         per tick on the reliable-ordered channel; all players in one `ClientSet` on one thread. \
         Latency is from the server's tick to the player's receive, on the host's monotonic \
         clock. Late/skipped: ticks more than half a period late, and due times that passed \
         without a tick, over both workers. µs/tick: server process CPU per tick period.{}{}{}\n\n",
        file.created_utc,
        file.host
            .load_average
            .map_or("unknown".into(), |l| format!("{:.1}", l[0])),
        game_idle_note(&runs),
        if runs.iter().any(|r| r.config.acks_on_tick) {
            " The server's sessions held input ACKs until the next tick (`--acks-on-tick`): \
             they ride the snapshots."
        } else {
            ""
        },
        if runs.iter().any(|r| r.config.is_floor()) {
            " Kernel floor rows (`--stack kernel`): the same players, sockets and tick with no \
             protocol: a plain thread per worker sleeps until its tick, reads the inputs with \
             `recvmmsg` and sends every player's snapshot with `sendmmsg`; the players are plain \
             sockets on one thread waiting on the readiness set a `ClientSet` uses. Its server \
             CPU is what this machine's kernel costs \
             for the game's datagrams, and its latency what one plain client thread sees."
        } else {
            ""
        }
    );
    body.push_str(&md_table(
        &[
            "players",
            "path, stack",
            "rounds",
            "ticks/s",
            "late+skipped",
            "p50 ms",
            "p99 ms",
            "p99.9 ms",
            "max ms",
            "lost snapshots",
            "stale",
            "reliable lost",
            "server CPU %",
            "µs/tick",
            "RSS B/session",
            "ok",
        ],
        2,
        &rows,
    ));
    if !labels.is_empty() {
        body.push('\n');
        let c = bars("game-p99.svg", "Snapshot p99 latency", "ms", &labels, &p99)?;
        body.push_str(&cx.chart(c, "snapshot p99 latency against the player count"));
        let c = bars(
            "game-rss.svg",
            "Server RSS per player",
            "bytes",
            &labels,
            &rss,
        )?;
        body.push_str(&cx.chart(c, "server RSS per player against the player count"));
    }
    let _ = writeln!(body, "\nCommand: `{}`", file.command_line.replace('`', "'"));
    body.push_str(&same_day_games(cx.inputs, &path));
    cx.section("game", body);
    Ok(())
}

/// The gate baseline's exact heap per simulated session.
fn memory(cx: &mut Ctx) {
    let base = cx.inputs.files.iter().find_map(|(p, i)| match i {
        Input::Gate(b) => b
            .sim
            .iter()
            .find(|s| s.profile == crate::gate::sim::SESSIONS_PROFILE)
            .map(|s| (p.clone(), s.metrics.clone())),
        _ => None,
    });
    let body = match base {
        None => "The gate baseline has no simulated heap-per-session row yet (`bench gate \
                 --update-baseline` records it).\n"
            .to_string(),
        Some((path, m)) => {
            let rows: Vec<Vec<String>> = m
                .iter()
                .map(|(k, v)| vec![format!("`{k}`"), thousands(v.round() as u64)])
                .collect();
            format!(
                "From `{path}`: heap bytes a simulated server endpoint holds per session, 1,000 \
                 clients (`ricochet_testkit::sessions`, counted by the bench binary's allocator; \
                 exact for the code, gated exactly by `bench gate`).\n\n{}",
                md_table(&["measure", "bytes per session"], 1, &rows)
            )
        }
    };
    cx.section("session-memory", body);
}

/// Every other `bench game` file of the newest one's directory (one host, one day): a row per
/// case with the server's idle strategy, so runs made side by side can be compared.
fn same_day_games(inputs: &super::Inputs, newest: &str) -> String {
    let files = same_day_files(inputs, newest, "game");
    if files.is_empty() {
        return String::new();
    }
    let commands = command_list(&files);
    let mut rows = Vec::new();
    for (name, f) in &files {
        let cases = groups(&f.game_runs, |r| {
            let c = &r.config;
            (
                c.players,
                c.relay_profile.clone().unwrap_or_else(|| "direct".into()),
                if c.is_floor() {
                    "kernel floor".to_string()
                } else {
                    c.server_idle.clone()
                },
                c.acks_on_tick,
            )
        });
        for (k, rs) in &cases {
            let m = |f: &dyn Fn(&GameRun) -> Option<f64>| {
                median(&rs.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
            };
            rows.push(vec![
                format!("`{name}`"),
                thousands(k.0 as u64),
                format!(
                    "{}, {}{}",
                    k.1,
                    k.2,
                    if k.3 { ", acks on tick" } else { "" }
                ),
                rs.len().to_string(),
                m(&|r| Some(r.ticks_per_s)).map_or("-".into(), |v| format!("{v:.1}")),
                ms(m(&|r| r.snapshot_latency_us.map(|l| l.p99))),
                int(m(&|r| Some(r.inputs_lost as f64))),
                m(&|r| Some(r.server_cpu_percent)).map_or("-".into(), |v| format!("{v:.1}")),
            ]);
        }
    }
    format!(
        "\nThe other `bench game` runs of that day, same host (medians over each file's \
         rounds):\n\n{}\n{commands}",
        md_table(
            &[
                "file",
                "players",
                "path, server idle",
                "rounds",
                "ticks/s",
                "p99 ms",
                "reliable lost",
                "server CPU %",
            ],
            3,
            &rows
        )
    )
}

/// What carried a game run: Ricochet with its security mode, or the kernel floor.
fn game_stack(c: &crate::schema::GameConfig) -> String {
    if c.is_floor() {
        "kernel floor".into()
    } else {
        format!("ricochet {}", c.security)
    }
}

/// How the game runs' server workers idled (`--server-idle`), in a sentence.
fn game_idle_note(runs: &[GameRun]) -> String {
    let mut idles: Vec<&str> = runs.iter().map(|r| r.config.server_idle.as_str()).collect();
    idles.sort_unstable();
    idles.dedup();
    match idles.as_slice() {
        ["tick"] => " Server workers idle with `tick`: they sleep until the tick and read every \
                     input that came meanwhile in one batch, so a received input waits up to a \
                     tick (as it would for the game's next tick anyway)."
            .into(),
        [one] => {
            format!(" Server workers idle with `{one}` (they read each datagram as it arrives).")
        }
        many => format!(" Server idle strategies: {}.", many.join(", ")),
    }
}
