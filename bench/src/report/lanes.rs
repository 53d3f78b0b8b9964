//! The front page's part on players behind a narrow link (`bench lanes`, issue 38): per
//! scenario, issue 38's acceptance keys for the measured arm and the baseline arm of the same
//! run, each against its goal, and a chart of latency over time per lane for the scenarios the
//! issue asks it of.

use std::fmt::Write as _;

use anyhow::Result;
use plotters::style::RGBColor;
use serde_json::Value;

use super::charts::{time_lines, Line};
use super::ctx::Ctx;
use super::{md_table, Input};
use crate::output::thousands;
use crate::relay::RateSchedule;

/// The scenarios whose latency over time is charted.
const CHARTED: [&str; 2] = ["downlink-1mbit", "step-4-to-1"];

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64).filter(|x| x.is_finite())
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// `n` and the noun, plural unless `n` is 1.
fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    // The lower middle, as `bench lanes` takes its medians.
    Some(v[v.len().div_ceil(2) - 1])
}

/// What a goal asks of a value.
#[derive(Debug, Clone, Copy)]
enum Goal {
    AtMost(f64),
    AtLeast(f64),
    /// Shown for context; no goal.
    Info,
}

/// How a key is computed over an arm's runs.
#[derive(Debug, Clone, Copy)]
enum Over {
    /// The median of a run field.
    Median(&'static str),
    /// The sum of a run field.
    Sum(&'static str),
}

/// One row of a scenario's table: label, how to compute it, its unit and its goal.
struct Row {
    label: String,
    over: Over,
    unit: Unit,
    goal: Goal,
}

#[derive(Debug, Clone, Copy)]
enum Unit {
    /// µs in the JSON, shown in ms.
    Ms,
    Pct,
    Count,
    Ratio,
}

impl Unit {
    fn show(self, v: f64) -> String {
        match self {
            Unit::Ms if v >= 100_000.0 => format!("{} ms", thousands((v / 1000.0).round() as u64)),
            Unit::Ms => format!("{:.1} ms", v / 1000.0),
            Unit::Pct => format!("{v:.1} %"),
            Unit::Count => thousands(v.max(0.0).round() as u64),
            Unit::Ratio => format!("{v:.2}"),
        }
    }

    /// A goal's bound in the JSON's unit, shown.
    fn goal(self, g: Goal) -> String {
        match g {
            Goal::AtMost(b) if matches!(self, Unit::Count) && b == 0.0 => "0".into(),
            Goal::AtMost(b) => format!("≤ {}", self.show(b)),
            Goal::AtLeast(b) => format!("≥ {}", self.show(b)),
            Goal::Info => "-".into(),
        }
    }
}

fn met(v: Option<f64>, g: Goal) -> &'static str {
    match (v, g) {
        (Some(v), Goal::AtMost(b)) if v <= b => "yes",
        (Some(v), Goal::AtLeast(b)) if v >= b => "yes",
        (Some(_), Goal::AtMost(_) | Goal::AtLeast(_)) => "**no**",
        _ => "-",
    }
}

/// The rows of `scenario` with issue 38's goals (`one_way_us`: the one-way delay; `tick_us`:
/// one tick).
fn rows(scenario: &str, one_way_us: f64, tick_us: f64) -> Vec<Row> {
    let row = |label: &str, over, unit, goal| Row {
        label: label.to_string(),
        over,
        unit,
        goal,
    };
    let event = Goal::AtMost(one_way_us + 15_000.0);
    let lost = row(
        "reliable events lost (sum)",
        Over::Sum("reliable_lost"),
        Unit::Count,
        Goal::AtMost(0.0),
    );
    let delivered = row(
        "snapshots delivered",
        Over::Median("snapshots_delivered"),
        Unit::Count,
        Goal::Info,
    );
    let queue = |goal| {
        row(
            "relay queue delay p50",
            Over::Median("relay_queue_p50_us"),
            Unit::Ms,
            goal,
        )
    };
    let age = |goal| {
        row(
            "snapshot age at delivery p99",
            Over::Median("snapshot_age_p99_us"),
            Unit::Ms,
            goal,
        )
    };
    match scenario {
        "downlink-1mbit" => vec![
            row(
                "event latency p99",
                Over::Median("event_p99_us"),
                Unit::Ms,
                event,
            ),
            age(Goal::AtMost(one_way_us + 3.0 * tick_us)),
            queue(Goal::AtMost(10_000.0)),
            row(
                "rate estimate's largest error from 2 s",
                Over::Median("rate_estimate_error_pct"),
                Unit::Pct,
                Goal::AtMost(20.0),
            ),
            lost,
            delivered,
        ],
        "step-4-to-1" => vec![
            row(
                "rate estimate's largest error from 1 s after the step",
                Over::Median("rate_estimate_error_pct"),
                Unit::Pct,
                Goal::AtMost(20.0),
            ),
            row(
                "event latency p99 in the second after the step",
                Over::Median("event_p99_after_step_us"),
                Unit::Ms,
                Goal::AtMost(100_000.0),
            ),
            row(
                "event latency p99",
                Over::Median("event_p99_us"),
                Unit::Ms,
                Goal::Info,
            ),
            age(Goal::Info),
            queue(Goal::Info),
            lost,
            delivered,
        ],
        "uplink-shared" => vec![
            row(
                "fewest / most snapshots of a player",
                Over::Median("fair_share_min_over_max"),
                Unit::Ratio,
                Goal::AtLeast(0.75),
            ),
            row(
                "event latency p99",
                Over::Median("event_p99_us"),
                Unit::Ms,
                event,
            ),
            age(Goal::Info),
            queue(Goal::Info),
            lost,
            delivered,
        ],
        _ => vec![
            row(
                "event latency p99",
                Over::Median("event_p99_us"),
                Unit::Ms,
                Goal::Info,
            ),
            age(Goal::Info),
            queue(Goal::Info),
            lost,
            delivered,
        ],
    }
}

fn value(runs: &[&Value], over: Over) -> Option<f64> {
    match over {
        Over::Median(k) => median(runs.iter().filter_map(|r| num(r, k)).collect()),
        Over::Sum(k) => {
            let v: Vec<f64> = runs.iter().filter_map(|r| num(r, k)).collect();
            (!v.is_empty()).then(|| v.iter().sum())
        }
    }
}

fn arm_runs<'a>(sc: &'a Value, arm: &str) -> Vec<&'a Value> {
    sc.get("runs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|r| text(r, "arm") == arm)
        .collect()
}

/// What an arm is, for the reader.
fn arm_what(arm: &str) -> &'static str {
    match arm {
        "baseline" => "one queue for every channel, NewReno",
        "cc" => "one queue, the delay-aware controller",
        "lanes" => {
            "the event channel in a lane of its own ahead of the snapshot lane, whose \
             channel keeps only the newest snapshot; the delay-aware controller"
        }
        _ => "an arm this report does not know",
    }
}

/// Renders the newest `bench lanes` result into `body`.
pub(super) fn render(cx: &mut Ctx, body: &mut String) -> Result<()> {
    body.push_str("## Players behind a narrow link: lanes, the rate estimate, fresh snapshots\n\n");
    let newest = cx.newest(|i| match i {
        Input::Lanes(v) => Some(v),
        _ => None,
    });
    let Some((path, v)) = newest else {
        body.push_str("No `bench lanes` result yet.\n\n");
        return Ok(());
    };
    let scenarios: Vec<&Value> = v
        .get("scenarios")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .collect();
    intro(&v, &scenarios, body);
    let _ = write!(
        body,
        "From `{path}`: `{}`\n\n",
        text(&v, "command").replace('`', "'").trim()
    );
    let tick_hz = num(&v, "tick_hz").unwrap_or(60.0);
    for sc in &scenarios {
        scenario_table(sc, tick_hz, body);
    }
    let charted: Vec<&Value> = scenarios
        .iter()
        .copied()
        .filter(|sc| CHARTED.contains(&text(sc, "scenario")))
        .collect();
    charts(cx, &charted, body)
}

/// The setup and the arms of the file `v`, one paragraph.
fn intro(v: &Value, scenarios: &[&Value], body: &mut String) {
    let first = scenarios.first().copied().unwrap_or(&Value::Null);
    let _ = write!(
        body,
        "The players run in a process of their own behind the bench relay's bottleneck (a rate \
         limit with a drop-tail buffer of {} ms, {} ms one way each way). The server ticks at \
         {} Hz and sends each player a {} B unreliable snapshot every tick and a {} B reliable \
         event at {} Hz, after that tick's snapshot. The arms, alternated in one run:",
        num(first, "buffer_ms").map_or("-".into(), |b| format!("{b:.0}")),
        num(first, "one_way_delay_ms").map_or("-".into(), |b| format!("{b:.0}")),
        num(v, "tick_hz").map_or("-".into(), |b| format!("{b:.0}")),
        num(v, "snapshot_bytes").map_or("-".into(), |b| format!("{b:.0}")),
        num(v, "event_bytes").map_or("-".into(), |b| format!("{b:.0}")),
        num(v, "events_hz").map_or("-".into(), |b| format!("{b:.0}")),
    );
    let mut arms: Vec<&str> = scenarios
        .iter()
        .flat_map(|sc| {
            sc.get("runs")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
        .map(|r| text(r, "arm"))
        .collect();
    arms.sort_unstable();
    arms.dedup();
    for a in &arms {
        let _ = write!(body, " `{a}` ({});", arm_what(a));
    }
    body.pop();
    body.push_str(
        ". Each key is the median over the arm's runs (reliable events lost: their sum); the \
         goals are issue 38's.\n\n",
    );
}

/// One scenario's heading and table: each key of the measured arm and of the baseline arm
/// against its goal.
fn scenario_table(sc: &Value, tick_hz: f64, body: &mut String) {
    let name = text(sc, "scenario");
    let measured = text(sc, "measured_arm");
    let runs = arm_runs(sc, measured);
    let base = arm_runs(sc, "baseline");
    let _ = writeln!(
        body,
        "**`{name}`**: {}, {} the rate `{}`, {} s measured.\n",
        count(num(sc, "players").unwrap_or(0.0) as usize, "player"),
        if sc.get("shared_bottleneck").and_then(Value::as_bool) == Some(true) {
            "sharing one bottleneck (the server's uplink) at"
        } else {
            "each behind a bottleneck (a downlink) at"
        },
        text(sc, "rate"),
        num(sc, "seconds").map_or("-".into(), |s| format!("{s}")),
    );
    let one_way_us = num(sc, "one_way_delay_ms").unwrap_or(0.0) * 1000.0;
    let mut table = Vec::new();
    for row in rows(name, one_way_us, 1e6 / tick_hz) {
        let m = value(&runs, row.over);
        let b = (measured != "baseline")
            .then(|| value(&base, row.over))
            .flatten();
        table.push(vec![
            row.label.clone(),
            row.unit.goal(row.goal),
            m.map_or("-".into(), |x| row.unit.show(x)),
            b.map_or("-".into(), |x| row.unit.show(x)),
            met(m, row.goal).to_string(),
        ]);
    }
    let head_m = format!("`{measured}` ({})", count(runs.len(), "run"));
    let head_b = if measured == "baseline" {
        "`baseline`: the measured arm".to_string()
    } else {
        format!("`baseline` ({})", count(base.len(), "run"))
    };
    body.push_str(&md_table(
        &["key", "goal", &head_m, &head_b, "goal met"],
        2,
        &table,
    ));
    body.push('\n');
}

/// The charts of latency over time of `scenarios`, or one line when the file has no series.
fn charts(cx: &mut Ctx, scenarios: &[&Value], body: &mut String) -> Result<()> {
    let drawable = scenarios
        .iter()
        .filter(|sc| chart_run(sc, text(sc, "measured_arm")).is_some())
        .count();
    if drawable == 0 {
        if !scenarios.is_empty() {
            body.push_str(
                "This file holds no latency-over-time series (written before `bench lanes` \
                 recorded them): the charts are left out.\n\n",
            );
        }
        return Ok(());
    }
    body.push_str(
        "Latency over time per lane: the event lane's latency (the largest of each 100 ms, by \
         delivery), the snapshot lane's age at delivery (the median of each 100 ms) and the \
         relay's queue delay (the mean of each 100 ms, dashed), for each arm's run with the \
         median event p99. From the grey line \"sending stops\" on, the server sends nothing \
         and the players receive what is still on its way.\n\n",
    );
    for sc in scenarios {
        let name = text(sc, "scenario");
        match chart(sc, name, text(sc, "measured_arm"))? {
            Some(c) => {
                let link = cx.chart(c, &format!("{name}: latency over time per lane"));
                body.push_str(&link);
                body.push('\n');
            }
            None => {
                let _ = writeln!(
                    body,
                    "`{name}`: no latency-over-time series in this file; its chart is left out.\n"
                );
            }
        }
    }
    Ok(())
}

/// The series of the arm's run with the median event p99 (the lower middle), if any run of
/// the arm has one.
fn chart_run<'a>(sc: &'a Value, arm: &str) -> Option<&'a Value> {
    let mut runs: Vec<&Value> = arm_runs(sc, arm)
        .into_iter()
        .filter(|r| {
            r.get("series")
                .and_then(|s| s.get("event_max_us"))
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty())
        })
        .collect();
    if runs.is_empty() {
        return None;
    }
    runs.sort_by(|a, b| {
        num(a, "event_p99_us")
            .unwrap_or(f64::INFINITY)
            .total_cmp(&num(b, "event_p99_us").unwrap_or(f64::INFINITY))
    });
    runs[runs.len().div_ceil(2) - 1].get("series")
}

/// A series of µs as (seconds, ms) points.
fn points(series: &Value, key: &str) -> Vec<(f64, Option<f64>)> {
    let bin_s = num(series, "bin_ms").unwrap_or(100.0) / 1000.0;
    series
        .get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, y)| ((i as f64 + 0.5) * bin_s, y.as_f64().map(|us| us / 1000.0)))
        .collect()
}

fn chart(sc: &Value, name: &str, measured: &str) -> Result<Option<super::Chart>> {
    let mut arms = vec![(measured, [0x1f, 0x5f, 0xb4], [0x6f, 0xa8, 0xdc])];
    if measured != "baseline" {
        arms.push(("baseline", [0xc0, 0x39, 0x2b], [0xe6, 0x7e, 0x22]));
    }
    let mut lines = Vec::new();
    let mut x_max: f64 = 0.0;
    let mut sending_until = None;
    for (arm, strong, light) in arms {
        let Some(s) = chart_run(sc, arm) else {
            continue;
        };
        let strong = RGBColor(strong[0], strong[1], strong[2]);
        let light = RGBColor(light[0], light[1], light[2]);
        let bins = s
            .get("event_max_us")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        x_max = x_max.max(bins as f64 * num(s, "bin_ms").unwrap_or(100.0) / 1000.0);
        sending_until = sending_until.or(num(s, "sending_until_ms").map(|m| m / 1000.0));
        for (what, key, color, width, dashed) in [
            ("events (max)", "event_max_us", strong, 2, false),
            ("snapshot age (p50)", "snapshot_age_p50_us", light, 2, false),
            ("relay queue (mean)", "relay_queue_mean_us", strong, 1, true),
        ] {
            lines.push(Line {
                label: format!("{arm}: {what}"),
                color,
                width,
                dashed,
                points: points(s, key),
            });
        }
    }
    if lines.is_empty() {
        return Ok(None);
    }
    let mut marks = Vec::new();
    if let Ok(schedule) = text(sc, "rate").parse::<RateSchedule>() {
        for &(at, rate) in schedule.steps().iter().skip(1) {
            marks.push((
                at.as_secs_f64(),
                format!("rate → {} Mbit/s", rate as f64 * 8.0 / 1e6),
            ));
        }
    }
    if let Some(end) = sending_until {
        marks.push((end, "sending stops".to_string()));
    }
    let title = format!(
        "{name} ({}): latency over time per lane",
        text(sc, "rate").replace(',', ", ")
    );
    time_lines(
        &format!("lanes-{name}.svg"),
        &title,
        "ms (log)",
        x_max,
        1.0,
        // An event every 100 ms may miss a bin of 100 ms by jitter: bridge two.
        2,
        &lines,
        &marks,
    )
    .map(Some)
}

#[cfg(test)]
mod tests {
    use super::super::{render, Inputs};
    use super::*;

    /// A `bench lanes` file: one scenario per name, a `lanes` and a `baseline` run each, with
    /// a series of `bins` points when `bins > 0`.
    fn file(names: &[&str], bins: usize) -> Value {
        let run = |arm: &str, p99: f64| {
            let mut r = serde_json::json!({
                "arm": arm, "event_p99_us": p99, "snapshot_age_p99_us": p99 * 2.0,
                "relay_queue_p50_us": 5_000, "rate_estimate_error_pct": 12.5,
                "reliable_lost": 0, "snapshots_delivered": 400,
                "event_p99_after_step_us": 90_000.0, "fair_share_min_over_max": 0.9,
            });
            if bins > 0 {
                let ys: Vec<Option<u64>> = (0..bins)
                    .map(|i| (i % 5 != 0).then_some(30_000 + i as u64))
                    .collect();
                r["series"] = serde_json::json!({
                    "bin_ms": 100, "sending_until_ms": 8000, "event_max_us": ys,
                    "snapshot_age_p50_us": ys, "relay_queue_mean_us": ys,
                });
            }
            r
        };
        let scenarios: Vec<Value> = names
            .iter()
            .map(|n| {
                serde_json::json!({
                    "scenario": n, "measured_arm": "lanes", "players": 1,
                    "rate": "4mbit@0s,1mbit@5s", "shared_bottleneck": false, "buffer_ms": 100,
                    "one_way_delay_ms": 20, "seconds": 10.0,
                    "runs": [run("lanes", 30_000.0), run("baseline", 120_000.0)],
                })
            })
            .collect();
        serde_json::json!({
            "kind": "lanes", "at": "2026-12-07T00:00:00Z", "command": "bench lanes --runs 1",
            "snapshot_bytes": 2400, "event_bytes": 64, "tick_hz": 60, "events_hz": 10,
            "scenarios": scenarios,
        })
    }

    fn front(v: Value) -> (String, Vec<String>) {
        let inputs = Inputs {
            files: vec![("results/h/lanes-1.json".into(), Input::Lanes(v))],
            refused: Vec::new(),
        };
        let r = render(&inputs, "docs/perf").unwrap();
        let lanes_charts = r
            .charts
            .keys()
            .filter(|k| k.starts_with("lanes-"))
            .cloned()
            .collect();
        (r.sections["headline"].clone(), lanes_charts)
    }

    #[test]
    fn each_key_is_judged_against_its_goal_beside_the_baseline() {
        let (body, _) = front(file(&["downlink-1mbit", "step-4-to-1", "uplink-shared"], 0));
        assert!(body.contains("From `results/h/lanes-1.json`: `bench lanes --runs 1`"));
        assert!(
            body.contains("| event latency p99 | ≤ 35.0 ms | 30.0 ms | 120 ms | yes |"),
            "{body}"
        );
        // 20 ms + 3 ticks of 60 Hz; 60 ms against 70 ms.
        assert!(
            body.contains("| snapshot age at delivery p99 | ≤ 70.0 ms | 60.0 ms | 240 ms | yes |")
        );
        assert!(body.contains(
            "| event latency p99 in the second after the step | ≤ 100 ms | 90.0 ms | 90.0 ms | yes |"
        ));
        assert!(
            body.contains("| fewest / most snapshots of a player | ≥ 0.75 | 0.90 | 0.90 | yes |")
        );
        assert!(body.contains("| reliable events lost (sum) | 0 | 0 | 0 | yes |"));
        // A file without series: the tables, and one line instead of the charts.
        assert_eq!(
            body.matches("no latency-over-time series").count(),
            1,
            "{body}"
        );
        assert!(!body.contains("![downlink-1mbit"));
    }

    #[test]
    fn series_are_charted_for_the_downlink_and_the_step_only() {
        let (body, charts) = front(file(
            &["downlink-1mbit", "step-4-to-1", "uplink-shared"],
            130,
        ));
        assert_eq!(
            charts,
            ["lanes-downlink-1mbit.svg", "lanes-step-4-to-1.svg"]
        );
        assert!(body.contains(
            "![step-4-to-1: latency over time per lane](docs/perf/lanes-step-4-to-1.svg)"
        ));
        assert!(!body.contains("no latency-over-time series"));
        // A goal missed is marked.
        let mut v = file(&["downlink-1mbit"], 0);
        v["scenarios"][0]["runs"][0]["reliable_lost"] = 2.into();
        let (body, _) = front(v);
        assert!(
            body.contains("| reliable events lost (sum) | 0 | 2 | 0 | **no** |"),
            "{body}"
        );
    }
}
