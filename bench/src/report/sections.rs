//! The sections of `PERFORMANCE.md`, each rendered only from the inputs that carry its data.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Result;
use serde_json::Value;

use super::charts::{bars, heat_table};
use super::ctx::Ctx;
use super::{md_table, reference, Input, Inputs, Rendered};
use crate::output::thousands;
use crate::schema::{ResultFile, UdpRun};

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64).filter(|x| x.is_finite())
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn int(x: f64) -> String {
    if x >= 0.0 {
        thousands(x.round() as u64)
    } else {
        format!("-{}", thousands((-x).round() as u64))
    }
}

fn us(x: f64) -> String {
    if x >= 10_000.0 {
        format!("{:.1} ms", x / 1000.0)
    } else {
        format!("{x:.0} µs")
    }
}

fn command_line(cmd: &str) -> String {
    format!("Command: `{}`\n", cmd.replace('`', "'"))
}

/// Renders every section in document order.
pub fn render_all(inputs: &Inputs, chart_dir: &str) -> Result<Rendered> {
    let mut cx = Ctx::new(inputs, chart_dir);
    for (path, input) in &inputs.files {
        if let Input::Bench(f) = input {
            let known = ["tour", "udp", "udp-limits"].contains(&f.kind.as_str())
                || super::rudp::KINDS.contains(&f.kind.as_str())
                || super::scale::KINDS.contains(&f.kind.as_str());
            if !known {
                cx.refused.push((
                    path.clone(),
                    format!(
                        "kind {:?}: this version of `bench report` has no renderer for it",
                        f.kind
                    ),
                ));
            }
        }
    }
    super::headline::render(&mut cx)?;
    // The archive page sits beside the charts.
    cx.set_chart_dir(".");
    environment(&mut cx);
    sim_echo(&mut cx)?;
    udp_echo(&mut cx)?;
    udp_limits(&mut cx)?;
    platform_blast(&mut cx)?;
    fec_codecs(&mut cx);
    super::rudp::render(&mut cx)?;
    super::scale::render(&mut cx)?;
    let mut body = String::new();
    if cx.refused.is_empty() {
        body.push_str("Every measurement under `results/` was complete and is shown above.\n");
    } else {
        body.push_str(
            "Left out of every table and chart above (failed or incomplete, or of a kind this report cannot render):\n\n",
        );
        let rows: Vec<Vec<String>> = cx
            .refused
            .iter()
            .map(|(p, why)| vec![format!("`{p}`"), why.clone()])
            .collect();
        body.push_str(&md_table(&["source", "why"], 9, &rows));
    }
    cx.section("refused", body);
    Ok(cx.finish())
}

fn environment(cx: &mut Ctx) {
    let mut rows = Vec::new();
    for (path, input) in &cx.inputs.files {
        let row = match input {
            Input::Bench(f) => vec![
                format!("`{path}`"),
                f.created_utc.clone(),
                f.host.hostname.clone(),
                format!("{} {} ({})", f.host.os, f.host.kernel, f.host.arch),
                format!("{} × {}", f.host.cores, f.host.cpu_model),
                f.host
                    .load_average
                    .map_or("-".into(), |l| format!("{:.2}", l[0])),
                format!(
                    "{} {}, {}",
                    f.build.profile,
                    f.build.rustc,
                    short(&f.build.git_commit)
                ),
            ],
            Input::Blast(v) => vec![
                format!("`{path}`"),
                "-".into(),
                text(v, "host").into(),
                format!("linux {}", text(v, "kernel")),
                num(v, "cpus").map_or("-".into(), |c| format!("{c:.0} CPUs")),
                num(v, "loadavg_1m_before").map_or("-".into(), |l| format!("{l:.2}")),
                "-".into(),
            ],
            Input::Fec(v) => {
                // Older files carry flat `host`/`cpu`/`date_utc`; newer ones the bench envelope.
                let host = v.get("host");
                let h = |k: &str| host.map_or("", |h| text(h, k)).to_string();
                let created = match text(v, "created_utc") {
                    "" => text(v, "date_utc"),
                    c => c,
                };
                vec![
                    format!("`{path}`"),
                    created.to_string(),
                    if host.is_some_and(Value::is_object) {
                        h("hostname")
                    } else {
                        text(v, "host").into()
                    },
                    if host.is_some_and(Value::is_object) {
                        format!("{} {} ({})", h("os"), h("kernel"), h("arch"))
                    } else {
                        "-".into()
                    },
                    if host.is_some_and(Value::is_object) {
                        format!(
                            "{} × {}",
                            host.and_then(|h| h.get("cores"))
                                .and_then(Value::as_u64)
                                .unwrap_or(0),
                            h("cpu_model")
                        )
                    } else {
                        text(v, "cpu").into()
                    },
                    host.and_then(|h| h.get("load_average"))
                        .and_then(|l| l.get(0))
                        .and_then(Value::as_f64)
                        .map_or("-".into(), |l| format!("{l:.2}")),
                    v.get("build").map_or("-".into(), |b| {
                        format!(
                            "{} {}, {}",
                            text(b, "profile"),
                            text(b, "rustc"),
                            short(text(b, "git_commit"))
                        )
                    }),
                ]
            }
            Input::Crypto(v)
            | Input::Ffi(v)
            | Input::Ops(v)
            | Input::Lanes(v)
            | Input::LargeMessages(v) => vec![
                format!("`{path}`"),
                // `bench lanes` names the time `at`.
                match text(v, "created_utc") {
                    "" => text(v, "at").into(),
                    t => t.into(),
                },
                v.get("host")
                    .map_or("-".into(), |h| text(h, "hostname").to_string()),
                v.get("host").map_or("-".into(), |h| {
                    format!(
                        "{} {} ({})",
                        text(h, "os"),
                        text(h, "kernel"),
                        text(h, "arch")
                    )
                }),
                v.get("host").map_or("-".into(), |h| {
                    format!(
                        "{} × {}",
                        h.get("cores").and_then(Value::as_u64).unwrap_or(0),
                        text(h, "cpu_model")
                    )
                }),
                v.get("host")
                    .and_then(|h| h.get("load_average"))
                    .and_then(|l| l.get(0))
                    .and_then(Value::as_f64)
                    .map_or("-".into(), |l| format!("{l:.2}")),
                v.get("build").map_or("-".into(), |b| {
                    format!(
                        "{} {}, {}",
                        text(b, "profile"),
                        text(b, "rustc"),
                        short(text(b, "git_commit"))
                    )
                }),
            ],
            Input::Gate(b) => vec![
                format!("`{path}`"),
                "-".into(),
                "(simulated: any host)".into(),
                b.os.clone(),
                "-".into(),
                "-".into(),
                short(&b.git_commit),
            ],
        };
        rows.push(row);
    }
    let body = if rows.is_empty() {
        "No result files under `results/` yet.\n".to_string()
    } else {
        let mut s = String::from(
            "Where each result file was measured (load average at the start: other work on a shared machine lowers wall-clock figures).\n\n",
        );
        s.push_str(&md_table(
            &[
                "file",
                "measured (UTC)",
                "host",
                "OS",
                "CPU",
                "load 1 min",
                "build",
            ],
            9,
            &rows,
        ));
        s
    };
    cx.section("environment", body);
}

fn short(commit: &str) -> String {
    if commit.is_empty() {
        "-".into()
    } else {
        format!("`{}`", &commit[..commit.len().min(10)])
    }
}

fn sim_echo(cx: &mut Ctx) -> Result<()> {
    let gates: Vec<(&str, &crate::gate::Baseline)> = cx
        .inputs
        .files
        .iter()
        .filter_map(|(p, i)| match i {
            Input::Gate(b) => Some((p.as_str(), b)),
            _ => None,
        })
        .collect();
    let mut body = String::new();
    if gates.is_empty() {
        body.push_str("No simulated-echo data yet (`bench gate --update-baseline` writes it to `results/baseline/`).\n");
    }
    for (path, b) in gates {
        let s = &b.sim_suite;
        let _ = writeln!(
            body,
            "Simulated echo (`ricochet_testkit::echo`): {} clients × {} in flight × {} B on a reliable-ordered channel, seed {}, {} s warm-up + {} s measured (simulated time; `none` gets {} ms one way). Exact for a seed: these are the gate's baseline values, from `{path}`.\n",
            s.clients, s.window, thousands(s.payload as u64), s.seed, s.warmup_s, s.seconds, s.none_delay_ms
        );
        body.push_str(&command_line(&b.command_line));
        body.push('\n');
        let mut rows = Vec::new();
        // The sessions and game-server rows hold heap and allocation counts, not an echo.
        for r in b.sim.iter().filter(|r| {
            r.profile != crate::gate::sim::SESSIONS_PROFILE
                && r.profile != crate::gate::sim::GAME_PROFILE
        }) {
            let m = |k: &str| r.metrics.get(k).copied();
            rows.push(vec![
                r.profile.clone(),
                m("round_trips_per_s").map_or("-".into(), |x| format!("{x:.1}")),
                m("rtt_p50_us").map_or("-".into(), us),
                m("rtt_p99_us").map_or("-".into(), us),
                m("rtt_max_us").map_or("-".into(), us),
                m("wire_overhead_percent").map_or("-".into(), |x| format!("{x:.1}")),
                m("bytes_per_round_trip").map_or("-".into(), |x| format!("{x:.0}")),
                m("retransmitted_per_1000").map_or("-".into(), |x| format!("{x:.1}")),
                m("fec_recovered_per_1000").map_or("n/a".into(), |x| format!("{x:.1}")),
            ]);
        }
        body.push_str(&md_table(
            &[
                "profile",
                "rt/s",
                "p50",
                "p99",
                "max",
                "wire overhead %",
                "wire B / rt",
                "retransmitted / 1,000",
                "FEC recovered / 1,000",
            ],
            1,
            &rows,
        ));
        body.push_str("\nFEC columns read `n/a` on ARQ-only rows: no FEC stage runs there.\n");
    }
    cx.section("sim-echo", body);
    Ok(())
}

fn run_row(r: &UdpRun) -> Vec<String> {
    let l = r.rtt_us;
    vec![
        r.label.clone(),
        thousands(r.config.payload as u64),
        format!("{}×{}", r.config.clients, r.config.window),
        r.server
            .as_ref()
            .map_or("-".into(), |s| format!("{} ×{}", s.backend, s.threads)),
        int(r.round_trips_per_s),
        l.map_or("-".into(), |l| us(l.p50)),
        l.map_or("-".into(), |l| us(l.p99)),
        l.map_or("-".into(), |l| us(l.p999)),
        format!("{:.0}", r.cpu.percent),
    ]
}

fn udp_echo(cx: &mut Ctx) -> Result<()> {
    let files: Vec<(String, ResultFile)> = cx
        .bench_files(&["tour", "udp"])
        .into_iter()
        .map(|(p, f)| (p.to_string(), f.clone()))
        .collect();
    let mut body = String::new();
    let mut labels = Vec::new();
    let mut rts = Vec::new();
    let mut p99s = Vec::new();
    for (path, f) in &files {
        let ok: Vec<&UdpRun> = f.udp_runs.iter().filter(|r| r.ok).collect();
        for r in f.udp_runs.iter().filter(|r| !r.ok) {
            cx.refused.push((
                path.clone(),
                format!("run `{}` not ok: {}", r.label, r.errors.join("; ")),
            ));
        }
        if ok.is_empty() {
            continue;
        }
        let _ = writeln!(body, "From `{path}` ({}):\n", f.created_utc);
        body.push_str(&command_line(&f.command_line));
        body.push('\n');
        let rows: Vec<Vec<String>> = ok.iter().map(|r| run_row(r)).collect();
        body.push_str(&md_table(
            &[
                "run",
                "payload B",
                "clients×window",
                "backend ×threads",
                "rt/s",
                "p50",
                "p99",
                "p99.9",
                "CPU %",
            ],
            1,
            &rows,
        ));
        body.push('\n');
        for r in ok {
            labels.push(format!("{} w{}", r.label, r.config.window));
            rts.push(r.round_trips_per_s);
            p99s.push(r.rtt_us.map_or(0.0, |l| l.p99));
        }
    }
    if labels.is_empty() {
        body.push_str("No complete UDP echo measurement yet (`bench udp`, or the tour `bench --io-model per-core`).\n");
    } else {
        body.push_str("CPU % is the whole process (clients and server share the machine; 100 = one core).\n\n");
        let c = bars(
            "udp-echo-throughput.svg",
            "UDP echo: round trips/s",
            "round trips/s",
            &labels,
            &rts,
        )?;
        body.push_str(&cx.chart(c, "UDP echo round trips/s"));
        let c = bars(
            "udp-echo-p99.svg",
            "UDP echo: p99 RTT",
            "µs",
            &labels,
            &p99s,
        )?;
        body.push_str(&cx.chart(c, "UDP echo p99 RTT"));
    }
    cx.section("udp-echo", body);
    Ok(())
}

/// Window → lost echoes per repetition (`None`: that repetition did not run).
type LossByWindow = BTreeMap<usize, Vec<Option<u64>>>;

fn udp_limits(cx: &mut Ctx) -> Result<()> {
    let files: Vec<(String, ResultFile)> = cx
        .bench_files(&["udp-limits"])
        .into_iter()
        .map(|(p, f)| (p.to_string(), f.clone()))
        .collect();
    let mut body = String::new();
    if files.is_empty() {
        body.push_str("No `bench udp-limits` result yet.\n");
    }
    for (n, (path, f)) in files.iter().enumerate() {
        let mut windows: Vec<usize> = f.udp_runs.iter().map(|r| r.config.window).collect();
        windows.sort_unstable();
        windows.dedup();
        // (family, payload) → window → lost per repetition (None: the run did not happen).
        let mut cells: BTreeMap<(String, usize), LossByWindow> = BTreeMap::new();
        for r in &f.udp_runs {
            let ran = r.server.is_some() && r.phases.measured.sent > 0;
            if !ran {
                cx.refused.push((
                    path.clone(),
                    format!(
                        "`{}` {} B window {}: did not run: {}",
                        r.config.address_family,
                        r.config.payload,
                        r.config.window,
                        r.errors.join("; ")
                    ),
                ));
            }
            cells
                .entry((r.config.address_family.clone(), r.config.payload))
                .or_default()
                .entry(r.config.window)
                .or_default()
                .push(ran.then_some(r.phases.measured.lost));
        }
        let _ = writeln!(
            body,
            "Measured-phase lost echoes per repetition, by payload and window ({}; `{path}`), with the {} figure in brackets where it measured the same cell:\n",
            f.created_utc,
            reference::LABEL
        );
        body.push_str(&command_line(&f.command_line));
        body.push('\n');
        let mut header: Vec<String> = vec!["payload B".into()];
        header.extend(windows.iter().map(|w| format!("window {w}")));
        let mut rows = Vec::new();
        let mut heat_rows = Vec::new();
        let mut heat = Vec::new();
        for ((fam, payload), by_w) in &cells {
            let mut row = vec![format!("{} {fam}", thousands(*payload as u64))];
            let mut hrow = Vec::new();
            for w in &windows {
                let reps = by_w.get(w).cloned().unwrap_or_default();
                let mut cell = if reps.is_empty() {
                    "-".to_string()
                } else {
                    reps.iter()
                        .map(|x| x.map_or("FAIL".into(), thousands))
                        .collect::<Vec<_>>()
                        .join(" / ")
                };
                if fam == "ipv4" {
                    if let Some(r) = reference::udp_limits_loss(*payload, *w) {
                        let _ = write!(cell, " ({})", thousands(r));
                    }
                }
                row.push(cell);
                let mut ok: Vec<u64> = reps.iter().flatten().copied().collect();
                ok.sort_unstable();
                hrow.push(ok.get(ok.len() / 2).map(|&v| v as f64));
            }
            rows.push(row);
            heat_rows.push(format!("{} {fam}", thousands(*payload as u64)));
            heat.push(hrow);
        }
        let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
        body.push_str(&md_table(&header_refs, 1, &rows));
        body.push('\n');
        let file = if n == 0 {
            "udp-limits-loss.svg".to_string()
        } else {
            format!("udp-limits-loss-{}.svg", n + 1)
        };
        let cols: Vec<String> = windows.iter().map(|w| format!("window {w}")).collect();
        let c = heat_table(
            &file,
            "UDP limits: median lost echoes per run",
            &heat_rows,
            &cols,
            &heat,
        )?;
        body.push_str(&cx.chart(c, "UDP limits loss heat table"));
    }
    cx.section("udp-limits", body);
    Ok(())
}

fn platform_blast(cx: &mut Ctx) -> Result<()> {
    let files: Vec<(String, Value)> = cx
        .inputs
        .files
        .iter()
        .filter_map(|(p, i)| match i {
            Input::Blast(v) => Some((p.clone(), v.clone())),
            _ => None,
        })
        .collect();
    let mut body = String::new();
    if files.is_empty() {
        body.push_str("No platform blast result yet.\n");
    }
    for (n, (path, v)) in files.iter().enumerate() {
        let _ = writeln!(
            body,
            "One-way datagram blast over loopback, {} B datagrams, {} s × {} repetitions (median row), `{path}`:\n",
            num(v, "datagram_bytes").map_or("?".into(), int),
            num(v, "seconds").map_or("?".into(), |s| format!("{s}")),
            num(v, "repeat").map_or("1".into(), |s| format!("{s}")),
        );
        body.push_str("Command: not recorded in this file; it is written by `cargo run --release -p ricochet-platform --example blast` (see `platform/README.md`).\n\n");
        let mut rows = Vec::new();
        let mut labels = Vec::new();
        let mut values = Vec::new();
        for r in v
            .get("rows")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let name = text(r, "name").to_string();
            let received = num(r, "received").unwrap_or(0.0);
            let wrong = num(r, "wrong_size").unwrap_or(0.0);
            if received <= 0.0 || wrong > 0.0 {
                cx.refused.push((
                    path.clone(),
                    format!("blast row `{name}`: {received} received, {wrong} of the wrong size"),
                ));
                continue;
            }
            let per_s = num(r, "received_per_sec").unwrap_or(0.0);
            let opt = |k: &str| num(r, k).map_or("-".into(), int);
            rows.push(vec![
                name.clone(),
                text(r, "backend").into(),
                int(per_s),
                opt("lost"),
                opt("socket_drops"),
                opt("sender_syscalls"),
                opt("receiver_syscalls"),
            ]);
            labels.push(name);
            values.push(per_s);
        }
        body.push_str(&md_table(
            &[
                "path",
                "backend",
                "received/s",
                "lost",
                "socket drops",
                "sender syscalls",
                "receiver syscalls",
            ],
            2,
            &rows,
        ));
        body.push('\n');
        if !labels.is_empty() {
            let file = if n == 0 {
                "platform-blast.svg".to_string()
            } else {
                format!("platform-blast-{}.svg", n + 1)
            };
            let c = bars(
                &file,
                "Platform blast: datagrams received/s",
                "datagrams/s",
                &labels,
                &values,
            )?;
            body.push_str(&cx.chart(c, "platform blast"));
        }
    }
    cx.section("platform-blast", body);
    Ok(())
}

fn fec_codecs(cx: &mut Ctx) {
    let files: Vec<(String, Value)> = cx
        .inputs
        .files
        .iter()
        .filter_map(|(p, i)| match i {
            Input::Fec(v) => Some((p.clone(), v.clone())),
            _ => None,
        })
        .collect();
    let mut body = String::new();
    if files.is_empty() {
        body.push_str("No `bench fec` result yet.\n");
    }
    for (path, v) in &files {
        let _ = writeln!(
            body,
            "Encode and single-shard recovery time per group, median of {} iterations, `{path}`:\n",
            num(v, "iters").map_or("?".into(), int)
        );
        body.push_str(&command_line(text(v, "command")));
        body.push('\n');
        let mut rows = Vec::new();
        for r in v
            .get("results")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let enc = num(r, "encode_ns");
            let rec = num(r, "recover_1_ns");
            if enc.is_none_or(|x| x <= 0.0) || rec.is_none_or(|x| x <= 0.0) {
                cx.refused.push((
                    path.clone(),
                    format!(
                        "fec row {} {}: missing or zero timings",
                        text(r, "codec"),
                        text(r, "simd")
                    ),
                ));
                continue;
            }
            let ns = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.0}"));
            rows.push(vec![
                text(r, "codec").into(),
                text(r, "simd").into(),
                format!(
                    "{}+{}",
                    num(r, "data_shards").map_or("?".into(), int),
                    num(r, "parity_shards").map_or("?".into(), int)
                ),
                num(r, "shard_bytes").map_or("?".into(), int),
                ns(enc),
                ns(rec),
                ns(num(r, "recover_max_ns")),
            ]);
        }
        body.push_str(&md_table(
            &[
                "codec",
                "SIMD",
                "group",
                "shard B",
                "encode ns",
                "recover 1 ns",
                "recover max ns",
            ],
            2,
            &rows,
        ));
    }
    cx.section("fec-codecs", body);
}
