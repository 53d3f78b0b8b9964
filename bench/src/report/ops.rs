//! The front page's "Running in production" part: what metrics, a scrape and the link
//! conditioner cost (`bench ops`, issue 34).

use std::fmt::Write as _;

use serde_json::Value;

use super::ctx::Ctx;
use super::{md_table, Input};

fn num(v: &Value, path: &[&str]) -> Option<f64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_f64()
}

fn f(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

/// The arms of `bench ops`, each rendered from the newest result that ran it.
const ARMS: [&str; 3] = ["metrics", "conditioner", "scrape"];

/// Renders each arm of the newest `bench ops` result that ran it into `body`: an arm-only run
/// (`bench ops --only conditioner`) replaces that arm's figures and leaves the others'. Every
/// source file is named with its command and echo shape.
pub(super) fn render(cx: &mut Ctx, body: &mut String) {
    body.push_str("## Running in production: metrics, scrapes, the link conditioner\n\n");
    let picked: Vec<(&str, String, Value)> = ARMS
        .iter()
        .filter_map(|&arm| {
            let (path, v) = cx.newest(|i| match i {
                Input::Ops(v) if v.get(arm).is_some_and(|a| !a.is_null()) => Some(v),
                _ => None,
            })?;
            Some((arm, path, v))
        })
        .collect();
    if picked.is_empty() {
        body.push_str("No `bench ops` result yet.\n\n");
        return;
    }
    let mut sources: Vec<(&str, Vec<&str>, &Value)> = Vec::new();
    for (arm, path, v) in &picked {
        match sources.iter_mut().find(|(p, _, _)| p == path) {
            Some((_, arms, _)) => arms.push(arm),
            None => sources.push((path, vec![arm], v)),
        }
    }
    for (path, arms, v) in &sources {
        write_source(body, path, arms, v, sources.len() > 1);
    }
    let arm = |name: &str| {
        picked
            .iter()
            .find(|(a, _, _)| *a == name)
            .and_then(|(_, _, v)| v.get(name))
    };
    let mut rows = Vec::new();
    for (arm_name, what) in [
        ("metrics", "metrics on and scraped each second / off (same run, alternated)"),
        ("conditioner", "link conditioner built in and off / compiled out (a child process of each build, alternated)"),
    ] {
        let Some(a) = arm(arm_name) else {
            continue;
        };
        let n = a.get("rounds").and_then(Value::as_array).map_or(0, Vec::len);
        rows.push(vec![
            what.to_string(),
            n.to_string(),
            f(num(a, &["median_round_trips_per_s", "0"]).or_else(|| {
                a.get("median_round_trips_per_s")?.get(0)?.as_f64()
            }), 0),
            f(a.get("median_round_trips_per_s").and_then(|m| m.get(1)).and_then(Value::as_f64), 0),
            format!("{}×", f(num(a, &["ratio"]), 3)),
            format!("≥ {}×", f(num(a, &["goal"]), 2)),
        ]);
    }
    if !rows.is_empty() {
        body.push_str(&md_table(
            &[
                "comparison",
                "rounds",
                "A rt/s (median)",
                "B rt/s (median)",
                "A / B",
                "goal",
            ],
            1,
            &rows,
        ));
        body.push('\n');
    }
    if let Some(s) = arm("scrape") {
        // Runs before the A/A control had only the two kinds of phase.
        let aa = s.get("aa_p99_ratio").is_some();
        let _ = writeln!(
            body,
            "A server holding {} sessions, scraped once a second in {} phases of {} s ({} \
             phases): a scrape of `/metrics` (request to last byte) takes {} ms median, {} ms \
             p90, {} ms at most (goal ≤ {} ms; {} scrapes), the exposition is {} bytes. The \
             echo beside it:\n",
            f(num(s, &["sessions"]), 0),
            if aa { "one of three" } else { "alternate" },
            f(num(s, &["phase_seconds"]), 0),
            f(num(s, &["phases"]), 0),
            f(num(s, &["scrape_ms_median"]), 1),
            f(num(s, &["scrape_ms_p90"]), 1),
            f(num(s, &["scrape_ms_max"]), 1),
            f(num(s, &["scrape_goal_ms"]), 0),
            f(num(s, &["scrapes"]), 0),
            f(num(s, &["exposition_bytes"]), 0),
        );
        let row = |name: &str, k: &str| {
            vec![
                name.to_string(),
                f(num(s, &[k, "round_trips"]), 0),
                f(num(s, &[k, "p50_us"]), 0),
                f(num(s, &[k, "p99_us"]), 0),
                f(num(s, &[k, "p999_us"]), 0),
            ]
        };
        let mut rows = vec![row("scraping", "scraping"), row("quiet", "quiet")];
        if aa {
            rows[1][0] = "quiet (A and B)".into();
            rows.push(row("quiet A", "quiet_a"));
            rows.push(row("quiet B", "quiet_b"));
        }
        body.push_str(&md_table(
            &["phases", "round trips", "p50 µs", "p99 µs", "p99.9 µs"],
            1,
            &rows,
        ));
        if aa {
            render_aa(s, body);
        } else {
            let _ = writeln!(
                body,
                "\np99 scraping / quiet: {}× (goal: not raised)",
                f(num(s, &["p99_ratio"]), 2)
            );
        }
    }
    body.push('\n');
}

/// Names one source file of the section: its echo shape and command, and which arms it gives
/// when the section has more than one source.
fn write_source(body: &mut String, path: &str, arms: &[&str], v: &Value, several: bool) {
    let shape = |k| num(v, &["shape", k]).map_or("-".into(), |x| format!("{x}"));
    let which = if several {
        format!("The {} arm(s) from", arms.join(" and "))
    } else {
        "From".to_string()
    };
    let _ =
        write!(
        body,
        "The echo: {} clients × {} in flight × {} B on the reliable channel, insecure, {} server \
         worker(s), {} s measured after {} s, direct on loopback. {which} `{path}`: `{}`\n\n",
        shape("clients"),
        shape("window"),
        shape("payload"),
        shape("workers"),
        shape("seconds"),
        shape("warmup"),
        v.get("command").and_then(Value::as_str).unwrap_or("").replace('`', "'"),
    );
}

/// The A/A control of the scrape arm: the ratios per triple, the bands and the verdict.
fn render_aa(s: &Value, body: &mut String) {
    let band = |k: &str| {
        let b = s.get(k);
        let at = |i: usize| b.and_then(|b| b.get(i)).and_then(Value::as_f64);
        format!("{}–{}×", f(at(0), 3), f(at(1), 3))
    };
    let _ = writeln!(
        body,
        "\nThe phases come in triples of scraping, quiet A and quiet B, scraping first and the \
         quiet ones swapped from triple to triple (S A B, S B A, ...); quiet A and B differ in nothing, so their ratio shows how far two \
         identical conditions come apart in the same run (the A/A band). Per triple:\n"
    );
    let pairs = s
        .get("pairs")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut rows: Vec<Vec<String>> = pairs
        .iter()
        .enumerate()
        .map(|(i, p)| {
            vec![
                i.to_string(),
                f(num(p, &["scraping_p99_us"]), 0),
                f(num(p, &["quiet_a_p99_us"]), 0),
                f(num(p, &["quiet_b_p99_us"]), 0),
                format!("{}×", f(num(p, &["p99_ratio"]), 3)),
                format!("{}×", f(num(p, &["aa_p99_ratio"]), 3)),
            ]
        })
        .collect();
    rows.push(vec![
        "median".into(),
        String::new(),
        String::new(),
        String::new(),
        format!("{}×", f(num(s, &["median_pair_p99_ratio"]), 3)),
        format!("{}×", f(num(s, &["median_pair_aa_p99_ratio"]), 3)),
    ]);
    body.push_str(&md_table(
        &[
            "triple",
            "scraping p99 µs",
            "quiet A p99 µs",
            "quiet B p99 µs",
            "scraping / quiet",
            "A / B",
        ],
        1,
        &rows,
    ));
    let verdict = s.get("verdict").and_then(Value::as_str).unwrap_or("-");
    let _ = writeln!(
        body,
        "\np99 scraping / quiet: {}× pooled (A/A band {}), {}× the median per triple (A/A band \
         {}: the triples' A / B folded above 1, their median). Goal: not raised; verdict: **{verdict}** (raised \
         when both lie above their band, unclear when one does).",
        f(num(s, &["p99_ratio"]), 3),
        band("aa_band"),
        f(num(s, &["median_pair_p99_ratio"]), 3),
        band("pair_aa_band"),
    );
}
