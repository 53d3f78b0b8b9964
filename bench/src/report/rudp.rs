//! The RUDP sections: result files of `bench rudp` (kind `rudp`) and `bench matrix rudp`
//! (kind `rudp-matrix`, cases tagged with their set `main`, `dims` or `sustained`).
//!
//! A case is shown when every round passed its checks. A failed case (`ok` false) keeps its row,
//! marked `FAILED` with no numbers, and is listed with the reason in the `refused` section; a
//! case that passed but measured nothing (no rounds, no round trip) is shown and listed as
//! incomplete. Nothing is dropped silently.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Result;

use super::charts::bars;
use super::ctx::Ctx;
use super::{md_table, reference, Input};
use crate::output::thousands;
use crate::schema::{ResultFile, RudpCase, RudpConfig, Spread};

/// Result kinds this module renders.
pub const KINDS: [&str; 2] = ["rudp", "rudp-matrix"];

/// One case with where it came from and whether its numbers may be shown.
struct Case<'a> {
    path: &'a str,
    file: &'a ResultFile,
    case: &'a RudpCase,
    /// `Err(why)`: failed or incomplete; its numbers are not shown.
    usable: Result<(), String>,
}

impl Case<'_> {
    fn cfg(&self) -> Option<&RudpConfig> {
        self.case.rounds.first().map(|r| &r.config)
    }

    fn policy(&self) -> &'static str {
        policy_label(self.cfg().map_or("", |c| c.fec.as_str()))
    }

    fn condition(&self) -> String {
        match self.cfg() {
            Some(c) if c.direct => "direct".into(),
            Some(c) => c.profile.clone(),
            None => "?".into(),
        }
    }

    fn io(&self) -> String {
        self.cfg()
            .map_or("?".into(), |c| format!("{}×{}", c.io_model, c.io_threads))
    }

    /// The backend that ran (the server's), else the one requested.
    fn backend(&self) -> String {
        self.case
            .rounds
            .iter()
            .find_map(|r| r.server.as_ref().map(|s| s.backend.clone()))
            .or_else(|| self.cfg().map(|c| c.backend.clone()))
            .unwrap_or_else(|| "?".into())
    }

    fn ok(&self) -> bool {
        self.usable.is_ok()
    }

    fn sort_key(&self) -> (usize, String, String, usize) {
        (
            condition_rank(&self.condition()),
            self.io(),
            self.backend(),
            policy_rank(self.policy()),
        )
    }

    /// Median of a per-round value over the rounds that completed round trips.
    fn round_median(&self, f: impl Fn(&crate::schema::RudpRun) -> Option<f64>) -> Option<Spread> {
        Spread::of(
            self.case
                .rounds
                .iter()
                .filter(|r| r.round_trips > 0)
                .filter_map(f),
        )
    }

    fn max_parity(&self) -> Option<u64> {
        self.case
            .rounds
            .iter()
            .filter_map(|r| r.fec.map(|f| f.max_parity))
            .max()
    }
}

fn policy_label(fec: &str) -> &'static str {
    match fec {
        "off" => "ARQ only",
        "fixed" => "fixed FEC",
        "adaptive" => "adaptive FEC",
        _ => "unknown policy",
    }
}

fn policy_rank(label: &str) -> usize {
    ["ARQ only", "fixed FEC", "adaptive FEC"]
        .iter()
        .position(|p| *p == label)
        .unwrap_or(9)
}

fn condition_rank(c: &str) -> usize {
    ["direct", "none", "random", "burst", "sustained"]
        .iter()
        .position(|p| *p == c)
        .unwrap_or(9)
}

/// Why a case's numbers cannot be shown, if they cannot.
fn usable(case: &RudpCase) -> Result<(), String> {
    if case.rounds.is_empty() {
        return Err("incomplete: no rounds".into());
    }
    if !case.ok || case.rounds.iter().any(|r| !r.ok) {
        let why = case
            .rounds
            .iter()
            .find(|r| !r.ok)
            .map(|r| {
                format!(
                    "round with seed {}: {}",
                    r.config.seed,
                    if r.errors.is_empty() {
                        "not ok".to_string()
                    } else {
                        r.errors.join("; ")
                    }
                )
            })
            .unwrap_or_else(|| "the case is marked not ok".into());
        return Err(format!("failed: {why}"));
    }
    if case.summary.round_trips_per_s.is_none() || case.rounds.iter().any(|r| r.round_trips == 0) {
        return Err("incomplete: a round completed no measured round trip".into());
    }
    Ok(())
}

fn f1(x: f64) -> String {
    format!("{x:.1}")
}

/// `median (min–max)`, or the median alone when the range is one value.
fn spread(s: Option<Spread>, f: impl Fn(f64) -> String) -> String {
    match s {
        None => "-".into(),
        Some(s) if s.min == s.max => f(s.median),
        Some(s) => format!("{} ({}–{})", f(s.median), f(s.min), f(s.max)),
    }
}

fn median(s: Option<Spread>, f: impl Fn(f64) -> String) -> String {
    s.map_or("-".into(), |s| f(s.median))
}

fn rate(x: f64) -> String {
    thousands(x.round().max(0.0) as u64)
}

/// Microseconds as milliseconds with one decimal and thousands separators (`2,096.2`).
fn ms(us: f64) -> String {
    let tenths = (us / 100.0).round().max(0.0) as u64;
    format!("{}.{}", thousands(tenths / 10), tenths % 10)
}

fn mib(kib: f64) -> String {
    format!("{:.1}", kib / 1024.0)
}

/// Header of the per-case tables.
const CASE_HEADER: [&str; 18] = [
    "policy",
    "condition",
    "IO model",
    "backend",
    "B × window",
    "rounds",
    "rt/s median (min–max)",
    "p50 ms",
    "p99 ms median (min–max)",
    "p99.9 ms",
    "max ms median (min–max)",
    "CPU µs / rt",
    "wire overhead %",
    "retx / 1,000",
    "recovered / 1,000",
    "max parity",
    "realized loss %",
    "ok",
];

fn case_row(c: &Case) -> Vec<String> {
    let s = &c.case.summary;
    // `--security both` files hold a secure and an insecure case of one condition: say which.
    let insecure = c
        .cfg()
        .is_some_and(|cfg| cfg.security.as_deref() == Some("insecure"));
    let mut row = vec![
        c.policy().to_string(),
        if insecure {
            format!("{}, insecure", c.condition())
        } else {
            c.condition()
        },
        c.io(),
        c.backend(),
        c.cfg().map_or("?".into(), |cfg| {
            format!("{} × {}", thousands(cfg.payload as u64), cfg.window)
        }),
        c.case.rounds.len().to_string(),
    ];
    match &c.usable {
        Ok(()) => {
            let fec = c.cfg().is_some_and(|cfg| cfg.fec != "off");
            row.extend([
                spread(s.round_trips_per_s, rate),
                median(s.p50_us, ms),
                spread(s.p99_us, ms),
                median(s.p999_us, ms),
                spread(s.max_us, ms),
                median(s.cpu_us_per_round_trip, f1),
                median(s.wire_overhead_percent, f1),
                median(s.retransmitted_per_1000, f1),
                if fec {
                    median(s.recovered_per_1000, f1)
                } else {
                    "-".into()
                },
                if fec {
                    c.max_parity().map_or("-".into(), |p| p.to_string())
                } else {
                    "-".into()
                },
                median(s.realized_loss_percent, |x| format!("{x:.2}")),
                "yes".into(),
            ]);
        }
        Err(why) => {
            row.extend((0..11).map(|_| "-".to_string()));
            let kind = if why.starts_with("incomplete") {
                "INCOMPLETE"
            } else {
                "FAILED"
            };
            row.push(format!("{kind} (see below)"));
        }
    }
    row
}

/// One table per source file, each naming its command line.
fn case_tables(body: &mut String, cases: &[&Case]) {
    let mut by_file: BTreeMap<&str, Vec<&Case>> = BTreeMap::new();
    for c in cases {
        by_file.entry(c.path).or_default().push(c);
    }
    for (path, mut list) in by_file {
        list.sort_by_key(|c| c.sort_key());
        let f = list[0].file;
        let _ = writeln!(body, "From `{path}` ({}):\n", f.created_utc);
        body.push_str(&command(&f.command_line));
        body.push('\n');
        let rows: Vec<Vec<String>> = list.iter().map(|c| case_row(c)).collect();
        body.push_str(&md_table(&CASE_HEADER, 5, &rows));
        body.push('\n');
    }
}

fn command(cmd: &str) -> String {
    format!("Command: `{}`\n", cmd.replace('`', "'"))
}

/// Renders the RUDP sections (`rudp-main`, `rudp-payload-window`, `rudp-sustained`,
/// `rudp-direct`, `rudp-single`) and their charts.
pub(super) fn render(cx: &mut Ctx) -> Result<()> {
    let mut cases: Vec<Case> = Vec::new();
    for (path, input) in &cx.inputs.files {
        let Input::Bench(f) = input else { continue };
        if !KINDS.contains(&f.kind.as_str()) {
            continue;
        }
        if f.rudp_cases.is_empty() {
            cx.refused
                .push((path.clone(), format!("kind {:?} with no RUDP case", f.kind)));
        }
        for case in &f.rudp_cases {
            cases.push(Case {
                path,
                file: f,
                case,
                usable: usable(case),
            });
        }
    }
    for c in &cases {
        if let Err(why) = &c.usable {
            cx.refused.push((
                c.path.to_string(),
                format!("case `{}`: {why}", c.case.label),
            ));
        }
    }
    let direct = |c: &&Case| c.cfg().is_some_and(|cfg| cfg.direct);
    let set = |c: &Case, s: &str| c.case.set.as_deref() == Some(s);
    let main: Vec<&Case> = cases
        .iter()
        .filter(|c| set(c, "main") && !direct(c))
        .collect();
    let dims: Vec<&Case> = cases
        .iter()
        .filter(|c| set(c, "dims") && !direct(c))
        .collect();
    let sustained: Vec<&Case> = cases
        .iter()
        .filter(|c| set(c, "sustained") && !direct(c))
        .collect();
    let direct_cases: Vec<&Case> = cases.iter().filter(direct).collect();
    let single: Vec<&Case> = cases
        .iter()
        .filter(|c| !direct(c) && !["main", "dims", "sustained"].iter().any(|s| set(c, s)))
        .collect();

    let body = main_section(cx, &main)?;
    cx.section("rudp-main", body);
    cx.section("rudp-payload-window", payload_window_section(&dims));
    cx.section("rudp-sustained", sustained_section(&sustained));
    let mut body = String::new();
    if direct_cases.is_empty() {
        body.push_str("No direct (no relay) RUDP run yet (`bench rudp --direct`; `bench matrix rudp --set main` includes one per IO model and backend).\n");
    } else {
        body.push_str("Clients talk to the server directly: no relay thread, no impairment, so these rows show the protocol's own cost.\n\n");
        case_tables(&mut body, &direct_cases);
    }
    cx.section("rudp-direct", body);
    let mut body = String::new();
    if single.is_empty() {
        body.push_str("No single `bench rudp` run under `results/` (outside the matrix sets).\n");
    } else {
        body.push_str("Single `bench rudp` runs (not part of a matrix set):\n\n");
        case_tables(&mut body, &single);
    }
    cx.section("rudp-single", body);
    Ok(())
}

/// One chart of the main matrix: file, title, unit and the value of a case.
type ChartSpec<'f> = (
    &'static str,
    &'static str,
    &'static str,
    &'f dyn Fn(&Case) -> Option<f64>,
);

fn main_section(cx: &mut Ctx, main: &[&Case]) -> Result<String> {
    let mut body = String::new();
    if main.is_empty() {
        body.push_str("No `bench matrix rudp --set main` result under `results/` yet.\n\n");
    } else {
        body.push_str("RUDP complete-message echo through the impairment relay: policy × condition × IO model × backend. Throughput counts completed round trips over the measured phase **including the drain**; medians over the rounds with (min–max). CPU is the whole process (clients, server, relay) per round trip; wire overhead = (UDP payload bytes sent by both endpoints / application bytes − 1) × 100; retransmitted and recovered are per 1,000 round trips.\n\n");
        case_tables(&mut body, main);
    }
    let ok: Vec<&&Case> = main.iter().filter(|c| c.ok()).collect();

    // Best per condition, ours next to the reference's.
    let _ = writeln!(
        body,
        "Best per condition: ours (from the table above) next to the reference report's ({}; 4 clients × 16 × 1,024 B, one endpoint thread, through its relay):\n",
        reference::LABEL
    );
    let mut rows = Vec::new();
    for (cond, ref_rt, ref_p99) in reference::RUDP_BEST {
        let here: Vec<&&&Case> = ok.iter().filter(|c| c.condition() == cond).collect();
        let name = |c: &Case| format!("{} {} {}", c.policy(), c.io(), c.backend());
        let best_rt = here
            .iter()
            .filter_map(|c| c.case.summary.round_trips_per_s.map(|s| (c, s.median)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map_or("-".into(), |(c, v)| format!("{} {} rt/s", name(c), rate(v)));
        let best_p99 = here
            .iter()
            .filter_map(|c| c.case.summary.p99_us.map(|s| (c, s.median)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map_or("-".into(), |(c, v)| format!("{} {} ms", name(c), ms(v)));
        rows.push(vec![
            cond.to_string(),
            best_rt,
            ref_rt.to_string(),
            best_p99,
            ref_p99.to_string(),
        ]);
    }
    body.push_str(&md_table(
        &[
            "condition",
            "highest rt/s (ours)",
            "highest rt/s (reference)",
            "lowest p99 (ours)",
            "lowest p99 (reference)",
        ],
        9,
        &rows,
    ));

    // Resources under random loss.
    let _ = writeln!(
        body,
        "\nResources under `random`: ours (medians over the rounds; RSS is the process high-water mark, `VmHWM`, so it includes earlier cases of the same matrix) and the reference's ({}, one endpoint thread):\n",
        reference::LABEL
    );
    let mut rows = Vec::new();
    let mut random: Vec<&&&Case> = ok.iter().filter(|c| c.condition() == "random").collect();
    random.sort_by_key(|c| c.sort_key());
    for c in random {
        let s = &c.case.summary;
        let fec = c.cfg().is_some_and(|cfg| cfg.fec != "off");
        rows.push(vec![
            format!("{} · {} {}", c.policy(), c.io(), c.backend()),
            if fec {
                median(s.recovered_per_1000, f1)
            } else {
                "0.0".into()
            },
            median(s.retransmitted_per_1000, f1),
            median(c.round_median(|r| r.fec.map(|f| f.retention_peak_kib)), f1),
            median(s.relay_peaks_kib, f1),
            median(s.peak_rss_kib, mib),
            c.max_parity().map_or("0".into(), |p| p.to_string()),
        ]);
    }
    for r in reference::RUDP_RANDOM_RESOURCES {
        let mut row: Vec<String> = r.iter().map(|x| x.to_string()).collect();
        row[0] = format!("{} ({})", r[0], reference::LABEL);
        rows.push(row);
    }
    body.push_str(&md_table(
        &[
            "policy · IO model",
            "recovered / 1,000",
            "retransmitted / 1,000",
            "FEC retained KiB",
            "relay route peaks KiB",
            "process RSS MiB",
            "max parity",
        ],
        1,
        &rows,
    ));

    // Charts of the complete cases.
    let mut sorted: Vec<&&Case> = ok.clone();
    sorted.sort_by_key(|c| c.sort_key());
    if !sorted.is_empty() {
        body.push('\n');
        let label = |c: &Case| {
            format!(
                "{} · {} · {} {}",
                c.policy(),
                c.condition(),
                c.io(),
                c.backend()
            )
        };
        let series = |f: &dyn Fn(&Case) -> Option<f64>| -> (Vec<String>, Vec<f64>) {
            sorted
                .iter()
                .filter_map(|c| f(c).map(|v| (label(c), v)))
                .unzip()
        };
        let charts: [ChartSpec; 6] = [
            (
                "rudp-throughput.svg",
                "RUDP: round trips/s (median of rounds)",
                "round trips/s",
                &|c| c.case.summary.round_trips_per_s.map(|s| s.median),
            ),
            (
                "rudp-p99.svg",
                "RUDP: p99 RTT (median of rounds)",
                "ms",
                &|c| c.case.summary.p99_us.map(|s| s.median / 1000.0),
            ),
            (
                "rudp-recovered.svg",
                "RUDP: FEC-recovered shards per 1,000 round trips",
                "per 1,000 round trips",
                &|c| {
                    c.cfg()
                        .filter(|cfg| cfg.fec != "off")
                        .and(c.case.summary.recovered_per_1000.map(|s| s.median))
                },
            ),
            (
                "rudp-retransmitted.svg",
                "RUDP: retransmitted segments per 1,000 round trips",
                "per 1,000 round trips",
                &|c| c.case.summary.retransmitted_per_1000.map(|s| s.median),
            ),
            ("rudp-wire-overhead.svg", "RUDP: wire overhead", "%", &|c| {
                c.case.summary.wire_overhead_percent.map(|s| s.median)
            }),
            (
                "rudp-cpu.svg",
                "RUDP: process CPU per round trip",
                "µs",
                &|c| c.case.summary.cpu_us_per_round_trip.map(|s| s.median),
            ),
        ];
        for (file, title, unit, f) in charts {
            let (labels, values) = series(f);
            if labels.is_empty() {
                continue;
            }
            let c = bars(file, title, unit, &labels, &values)?;
            body.push_str(&cx.chart(c, title));
        }
    }
    Ok(body)
}

fn payload_window_section(dims: &[&Case]) -> String {
    let mut body = String::new();
    if dims.is_empty() {
        body.push_str("No `bench matrix rudp --set dims` result under `results/` yet.\n\n");
    }
    let mut by_file: BTreeMap<&str, Vec<&Case>> = BTreeMap::new();
    for c in dims {
        by_file.entry(c.path).or_default().push(c);
    }
    let policies = ["ARQ only", "fixed FEC", "adaptive FEC"];
    for (path, list) in by_file {
        let f = list[0].file;
        let _ = writeln!(
            body,
            "Payload × window under `random`, round trips/s / p99 ms (medians over the rounds), from `{path}` ({}), with the reference's ({}) on the right:\n",
            f.created_utc,
            reference::LABEL
        );
        body.push_str(&command(&f.command_line));
        body.push('\n');
        // (payload, window, IO, backend) → policy → cell.
        let mut cells: BTreeMap<(usize, usize, String, String), BTreeMap<&str, String>> =
            BTreeMap::new();
        for c in &list {
            let Some(cfg) = c.cfg() else { continue };
            let cell = match &c.usable {
                Ok(()) => format!(
                    "{} / {}",
                    median(c.case.summary.round_trips_per_s, rate),
                    median(c.case.summary.p99_us, ms)
                ),
                Err(why) if why.starts_with("incomplete") => "INCOMPLETE".into(),
                Err(_) => "FAILED".into(),
            };
            cells
                .entry((cfg.payload, cfg.window, c.io(), c.backend()))
                .or_default()
                .insert(c.policy(), cell);
        }
        let mut rows = Vec::new();
        for ((payload, window, io, backend), by_policy) in &cells {
            let mut row = vec![
                thousands(*payload as u64),
                window.to_string(),
                format!("{io} {backend}"),
            ];
            for p in policies {
                row.push(by_policy.get(p).cloned().unwrap_or_else(|| "-".into()));
            }
            for p in policies {
                row.push(
                    reference::rudp_payload_window(*payload, *window, p)
                        .unwrap_or("-")
                        .to_string(),
                );
            }
            rows.push(row);
        }
        body.push_str(&md_table(
            &[
                "message B",
                "window",
                "IO model",
                "ARQ only",
                "fixed FEC",
                "adaptive FEC",
                "ARQ only (reference)",
                "fixed FEC (reference)",
                "adaptive FEC (reference)",
            ],
            0,
            &rows,
        ));
        body.push_str(
            "\n`FAILED` / `INCOMPLETE` cells: the case did not pass its checks; the reason is listed under the refused measurements.\n\n",
        );
    }
    if body.ends_with("\n\n") {
        body.pop();
    }
    if dims.is_empty() {
        let _ = writeln!(
            body,
            "Reference ({}), `random`, one endpoint thread, round trips/s / p99 ms:\n",
            reference::LABEL
        );
        let rows: Vec<Vec<String>> = reference::RUDP_PAYLOAD_WINDOW
            .iter()
            .map(|(a, b, c, d, e)| [a, b, c, d, e].iter().map(|x| x.to_string()).collect())
            .collect();
        body.push_str(&md_table(
            &[
                "message B",
                "window",
                "ARQ only",
                "fixed FEC",
                "adaptive FEC",
            ],
            0,
            &rows,
        ));
    }
    body
}

fn sustained_section(sustained: &[&Case]) -> String {
    let mut body = String::new();
    if sustained.is_empty() {
        body.push_str("No `bench matrix rudp --set sustained` result under `results/` yet.\n\n");
    }
    let mut by_file: BTreeMap<&str, Vec<&Case>> = BTreeMap::new();
    for c in sustained {
        by_file.entry(c.path).or_default().push(c);
    }
    for (path, mut list) in by_file {
        list.sort_by_key(|c| c.sort_key());
        let f = list[0].file;
        let _ = writeln!(
            body,
            "Sustained runs from `{path}` ({}). RSS is `VmRSS` at the end of the warm-up and at the end of the measured phase, and the largest sample (about one a second); growth beyond 10% + 4 MiB after the warm-up fails the round. `-`: the file predates RSS sampling.\n",
            f.created_utc
        );
        body.push_str(&command(&f.command_line));
        body.push('\n');
        let mut rows = Vec::new();
        for c in &list {
            let cfg = c.cfg();
            let mut row = vec![
                c.policy().to_string(),
                c.condition(),
                format!("{} {}", c.io(), c.backend()),
                cfg.map_or("?".into(), |cfg| {
                    format!("{} × {}", thousands(cfg.payload as u64), cfg.window)
                }),
                cfg.map_or("?".into(), |cfg| format!("{:.0}", cfg.seconds)),
            ];
            match &c.usable {
                Ok(()) => {
                    let s = &c.case.summary;
                    let rss = |f: fn(&crate::schema::RssOverTime) -> Option<u64>| {
                        median(
                            c.round_median(|r| r.rss.as_ref().and_then(f).map(|k| k as f64)),
                            mib,
                        )
                    };
                    row.extend([
                        thousands(c.case.rounds.iter().map(|r| r.round_trips).sum::<u64>()),
                        median(s.round_trips_per_s, rate),
                        median(s.p99_us, ms),
                        median(s.cpu_percent, f1),
                        median(s.wire_overhead_percent, f1),
                        median(c.round_median(|r| r.fec.map(|f| f.retention_peak_kib)), f1),
                        rss(|r| r.after_warmup_kib),
                        rss(|r| r.end_kib),
                        rss(|r| r.peak_kib),
                        "yes".into(),
                    ]);
                }
                Err(why) => {
                    row.extend((0..9).map(|_| "-".to_string()));
                    row.push(if why.starts_with("incomplete") {
                        "INCOMPLETE (see below)".into()
                    } else {
                        "FAILED (see below)".into()
                    });
                }
            }
            rows.push(row);
        }
        body.push_str(&md_table(
            &[
                "policy",
                "condition",
                "IO model",
                "B × window",
                "measured s",
                "round trips",
                "rt/s",
                "p99 ms",
                "CPU %",
                "wire overhead %",
                "FEC peak KiB",
                "RSS after warm-up MiB",
                "RSS at end MiB",
                "RSS peak MiB",
                "ok",
            ],
            3,
            &rows,
        ));
        body.push('\n');
    }
    let _ = writeln!(
        body,
        "Reference ({}), 120 s, burst + 2% random, 4,096 B, window 16, four endpoint threads:\n",
        reference::LABEL
    );
    let rows: Vec<Vec<String>> = reference::RUDP_SUSTAINED
        .iter()
        .map(|r| r.iter().map(|x| x.to_string()).collect())
        .collect();
    body.push_str(&md_table(
        &[
            "policy",
            "round trips",
            "rt/s",
            "p99 ms",
            "CPU %",
            "wire overhead %",
            "FEC sampled peak KiB",
        ],
        1,
        &rows,
    ));
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{render, Inputs};
    use crate::rudp::protocol::FecPolicy;
    use crate::rudp::run::{config_for, summarize};
    use crate::schema::{CpuUsage, Latency, RudpCounts, RudpFec, RudpRun, RudpWire};
    use ricochet_testkit::Profile;

    fn round(fec: FecPolicy, payload: usize, window: usize, rt_s: f64, ok: bool) -> RudpRun {
        let cfg = config_for(
            Profile::Random,
            payload,
            4,
            window,
            "per-core",
            1,
            "mmsg",
            fec,
            false,
            1.0,
            3.0,
            42,
        );
        let n = (rt_s * 3.0) as u64;
        RudpRun {
            config: cfg,
            ok,
            errors: if ok {
                Vec::new()
            } else {
                vec!["measured: 3 lost, 0 content errors".into()]
            },
            load_average: None,
            server: None,
            warmup: RudpCounts::default(),
            measured: RudpCounts {
                sent: n,
                echoed: n,
                ..RudpCounts::default()
            },
            measured_s: 3.0,
            round_trips: n,
            round_trips_per_s: rt_s,
            rtt_us: Some(Latency {
                count: n,
                mean: 40_000.0,
                p50: 30_000.0,
                p90: 60_000.0,
                p99: 90_000.0,
                p999: 120_000.0,
                max: 150_000.0,
            }),
            cpu: CpuUsage {
                user_s: 1.0,
                sys_s: 1.0,
                percent: 66.0,
            },
            cpu_us_per_round_trip: (n > 0).then(|| 2e6 / n as f64),
            peak_rss_kib: Some(20_480),
            client_wire: RudpWire::default(),
            server_wire: RudpWire::default(),
            wire_overhead_percent: Some(30.0),
            retransmitted_per_1000: Some(300.0),
            fec: (fec != FecPolicy::Off).then_some(RudpFec {
                recovered_per_1000: 180.0,
                retention_peak_kib: 40.0,
                max_parity: 3,
            }),
            relay: None,
            rss: None,
            client_process: None,
            host_cpu: None,
        }
    }

    fn case(set: &str, rounds: Vec<RudpRun>) -> RudpCase {
        RudpCase {
            label: crate::rudp::label(&rounds[0].config),
            set: Some(set.into()),
            ok: rounds.iter().all(|r| r.ok),
            summary: summarize(&rounds),
            rounds,
        }
    }

    fn file(kind: &str, cmd: &str, cases: Vec<RudpCase>) -> ResultFile {
        let host = serde_json::json!({"hostname": "t", "os": "linux", "arch": "x86_64",
            "kernel": "6", "cpu_model": "cpu", "cores": 2, "load_average": null});
        let build = serde_json::json!({"version": "0", "rustc": "r", "profile": "release",
            "target": "x", "git_commit": "abc", "git_dirty": false});
        ResultFile {
            schema_version: crate::schema::SCHEMA_VERSION,
            kind: kind.into(),
            created_unix_s: 0,
            created_utc: "2026-01-01T00:00:00Z".into(),
            command_line: cmd.into(),
            host: serde_json::from_value(host).unwrap(),
            build: serde_json::from_value(build).unwrap(),
            ok: cases.iter().all(|c| c.ok),
            udp_runs: Vec::new(),
            rudp_cases: cases,
            sessions_runs: Vec::new(),
            game_runs: Vec::new(),
        }
    }

    fn inputs(files: Vec<ResultFile>) -> Inputs {
        // Through the JSON text, as `bench report` reads them.
        let mut i = Inputs::default();
        for (n, f) in files.into_iter().enumerate() {
            let text = f.to_json().unwrap();
            let input = crate::report::classify(&text).expect("an RUDP file is accepted");
            i.files.push((format!("results/t/rudp-{n}.json"), input));
        }
        i
    }

    #[test]
    fn main_matrix_renders_numbers_reference_and_charts() {
        let f = file(
            "rudp-matrix",
            "./target/release/bench matrix rudp --set main",
            vec![
                case(
                    "main",
                    vec![
                        round(FecPolicy::Off, 1024, 16, 1_500.0, true),
                        round(FecPolicy::Off, 1024, 16, 1_400.0, true),
                        round(FecPolicy::Off, 1024, 16, 1_600.0, true),
                    ],
                ),
                case(
                    "main",
                    vec![round(FecPolicy::Adaptive, 1024, 16, 2_600.0, true)],
                ),
            ],
        );
        let out = render(&inputs(vec![f]), "docs/perf").unwrap();
        let main = &out.sections["rudp-main"];
        assert!(main.contains("Command: `./target/release/bench matrix rudp --set main`"));
        // rt/s median with the range of the three rounds; p99 in ms.
        assert!(main.contains("| 1,500 (1,400–1,600) |"), "{main}");
        assert!(main.contains("| 90.0 |"));
        // The reference's figures are quoted next to ours.
        assert!(main.contains("fixed FEC 844 rt/s"));
        assert!(main
            .contains("adaptive FEC (reference, M4 Pro) | 176.7 | 181.8 | 30.8 | 83.4 | 7.2 | 3"));
        assert!(
            main.contains(
                "| random | adaptive FEC per-core×1 mmsg 2,600 rt/s | fixed FEC 844 rt/s |"
            ),
            "{main}"
        );
        for chart in [
            "rudp-throughput.svg",
            "rudp-p99.svg",
            "rudp-recovered.svg",
            "rudp-retransmitted.svg",
            "rudp-wire-overhead.svg",
            "rudp-cpu.svg",
        ] {
            assert!(out.charts.contains_key(chart), "{chart}");
            assert!(main.contains(chart));
        }
        assert!(!out.sections["refused"].contains("no renderer"));
    }

    #[test]
    fn failed_and_incomplete_cases_are_shown_and_refused_with_the_reason() {
        let mut empty = case("dims", vec![round(FecPolicy::Fixed, 4096, 64, 0.0, true)]);
        empty.rounds[0].round_trips = 0;
        empty.summary = summarize(&empty.rounds);
        let f = file(
            "rudp-matrix",
            "bench matrix rudp --set dims",
            vec![
                case("dims", vec![round(FecPolicy::Off, 4096, 64, 150.0, true)]),
                case(
                    "dims",
                    vec![round(FecPolicy::Adaptive, 4096, 64, 230.0, false)],
                ),
                empty,
            ],
        );
        let out = render(&inputs(vec![f]), "docs/perf").unwrap();
        let pw = &out.sections["rudp-payload-window"];
        // ARQ only passed; adaptive failed; fixed measured nothing. Reference cells alongside.
        assert!(pw.contains("| 4,096 | 64 | per-core×1 mmsg | 150 / 90.0 | INCOMPLETE | FAILED | 146 / 2,096.2 | 223 / 1,432.5 | 234 / 1,285.4 |"), "{pw}");
        let refused = &out.sections["refused"];
        assert!(refused.contains("results/t/rudp-0.json"));
        assert!(refused.contains("adaptive FEC · random") && refused.contains("3 lost"));
        assert!(refused.contains("incomplete: a round completed no measured round trip"));
    }

    #[test]
    fn sustained_shows_rss_and_single_runs_get_their_own_table() {
        let mut r = round(FecPolicy::Off, 4096, 16, 170.0, true);
        r.rss = Some(crate::schema::RssOverTime {
            interval_ms: 1000,
            samples: vec![(0.0, 10_240), (2.0, 12_288), (122.0, 13_312)],
            after_warmup_kib: Some(12_288),
            end_kib: Some(13_312),
            peak_kib: Some(13_312),
            growth_kib: Some(1_024),
            growth_bound_kib: Some(5_325),
        });
        let sustained = file(
            "rudp-matrix",
            "bench matrix rudp --set sustained",
            vec![case("sustained", vec![r])],
        );
        let mut single = case("x", vec![round(FecPolicy::Fixed, 1024, 16, 900.0, true)]);
        single.set = None;
        let single = file(
            "rudp",
            "bench rudp --fec fixed --profile random",
            vec![single],
        );
        let out = render(&inputs(vec![sustained, single]), "docs/perf").unwrap();
        let s = &out.sections["rudp-sustained"];
        assert!(s.contains("| 12.0 | 13.0 | 13.0 | yes |"), "{s}");
        assert!(s.contains("| adaptive FEC | 29,058 | 241 |"));
        let single = &out.sections["rudp-single"];
        assert!(single.contains("Command: `bench rudp --fec fixed --profile random`"));
        assert!(single.contains("| fixed FEC | random |"));
        assert!(out.sections["rudp-main"].contains("No `bench matrix rudp --set main` result"));
    }
}
