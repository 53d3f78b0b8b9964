//! The front page's "Large unreliable messages" part: how many messages of many fragments
//! arrive whole through random loss, per FEC policy, and what the wire pays for it
//! (`bench large-messages`, issue 38).

use std::fmt::Write as _;

use serde_json::Value;

use super::ctx::Ctx;
use super::{md_table, Input};

/// The share of adaptive FEC's messages that must arrive whole (issue 38).
const GOAL_WHOLE_PCT: f64 = 90.0;

/// The policies in the order the table shows them.
const POLICIES: [&str; 3] = ["off", "fixed", "adaptive"];

fn median(mut xs: Vec<f64>) -> Option<f64> {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(xs[n / 2]),
        _ => Some((xs[n / 2 - 1] + xs[n / 2]) / 2.0),
    }
}

/// Renders the newest `bench large-messages` result (its policies ran alternated in one
/// sitting) into `body`.
pub(super) fn render(cx: &mut Ctx, body: &mut String) {
    body.push_str("## Large unreliable messages through loss\n\n");
    let newest = cx.newest(|i| match i {
        Input::LargeMessages(v) => Some(v),
        _ => None,
    });
    let Some((path, v)) = newest else {
        body.push_str("No `bench large-messages` result yet.\n\n");
        return;
    };
    let num = |k: &str| v.get(k).and_then(Value::as_f64);
    let shown = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x}"));
    let _ = write!(
        body,
        "{} messages of {} B on an unreliable channel, one every {} ms, through the bench \
         relay's random loss of {} % and {} ms each way; a message counts only if it arrives \
         whole and byte for byte. Wire / payload is every UDP payload byte the sender sent over \
         the messages' bytes; dropped unsent counts the messages the sender's queue limits \
         dropped before they went out whole. From `{path}`: `{}`\n\n",
        shown(num("messages")),
        shown(num("message_bytes")),
        shown(num("interval_ms")),
        shown(num("loss_percent")),
        shown(num("delay_ms")),
        v.get("command")
            .and_then(Value::as_str)
            .unwrap_or("")
            .replace('`', "'"),
    );
    let runs = v
        .get("runs")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut rows = Vec::new();
    for policy in POLICIES {
        let of: Vec<&Value> = runs
            .iter()
            .filter(|r| r.get("fec").and_then(Value::as_str) == Some(policy))
            .collect();
        if of.is_empty() {
            continue;
        }
        let col = |k: &str| -> Vec<f64> {
            of.iter()
                .filter_map(|r| r.get(k).and_then(Value::as_f64))
                .collect()
        };
        let whole = col("delivered_whole_pct");
        let per_run = whole
            .iter()
            .map(|w| format!("{w:.0}"))
            .collect::<Vec<_>>()
            .join(" / ");
        let wrong: f64 = col("delivered_wrong").iter().sum();
        // Files written before `unsent` was recorded have no such key: "-".
        let unsent = col("unsent");
        let unsent = if unsent.is_empty() {
            "-".to_string()
        } else {
            format!("{:.0}", unsent.iter().sum::<f64>())
        };
        let med = median(whole);
        let (goal, met) = if policy == "adaptive" {
            (
                format!("≥ {GOAL_WHOLE_PCT:.0} %"),
                match med {
                    Some(m) if m >= GOAL_WHOLE_PCT => "yes",
                    Some(_) => "**no**",
                    None => "-",
                },
            )
        } else {
            ("-".into(), "-")
        };
        rows.push(vec![
            format!("`{policy}`"),
            of.len().to_string(),
            per_run,
            med.map_or("-".into(), |m| format!("{m:.0} %")),
            median(col("wire_per_payload")).map_or("-".into(), |w| format!("{w:.3}")),
            median(col("relay_realized_loss"))
                .map_or("-".into(), |l| format!("{:.2} %", l * 100.0)),
            format!("{wrong:.0}"),
            unsent,
            goal,
            met.into(),
        ]);
    }
    if rows.is_empty() {
        body.push_str("The file holds no runs.\n\n");
        return;
    }
    body.push_str(&md_table(
        &[
            "FEC",
            "runs",
            "delivered whole, % per run",
            "median",
            "wire / payload",
            "relay's loss",
            "arrived wrong",
            "dropped unsent",
            "goal",
            "goal met",
        ],
        1,
        &rows,
    ));
    body.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Inputs;

    fn run(fec: &str, pct: f64, wire: f64) -> Value {
        serde_json::json!({
            "fec": fec, "delivered_whole_pct": pct, "delivered_wrong": 0,
            "wire_per_payload": wire, "relay_realized_loss": 0.05
        })
    }

    /// The section rendered from one file holding `runs`.
    fn rendered(runs: Vec<Value>) -> String {
        let v = serde_json::json!({
            "kind": "large-messages", "command": "bench large-messages", "messages": 100,
            "message_bytes": 65536, "interval_ms": 100, "loss_percent": 5.0, "delay_ms": 10.0,
            "runs": runs
        });
        let inputs = Inputs {
            files: vec![(
                "results/h/large-messages-1.json".into(),
                Input::LargeMessages(v),
            )],
            refused: Vec::new(),
        };
        let mut cx = Ctx::new(&inputs, "docs/perf");
        let mut body = String::new();
        render(&mut cx, &mut body);
        body
    }

    #[test]
    fn policies_are_tabled_with_their_medians_and_the_goal() {
        let body = rendered(vec![
            run("off", 7.0, 1.02),
            run("adaptive", 98.0, 1.21),
            run("adaptive", 80.0, 1.22),
            run("adaptive", 85.0, 1.23),
        ]);
        assert!(body.contains("| `off` | 1 | 7 | 7 % | 1.020 |"), "{body}");
        // The median of 98, 80 and 85 misses the goal.
        assert!(
            body.contains("| `adaptive` | 3 | 98 / 80 / 85 | 85 % | 1.220 |"),
            "{body}"
        );
        assert!(body.contains("≥ 90 % | **no** |"), "{body}");
        assert!(!body.contains("`fixed`"), "{body}");
        // A file from before `unsent` was recorded shows no count of it.
        assert!(body.contains("| 0 | - | ≥ 90 %"), "{body}");
    }

    #[test]
    fn messages_dropped_unsent_are_summed_over_the_runs() {
        let mut a = run("off", 3.0, 0.976);
        a["unsent"] = 5.into();
        let mut b = run("off", 7.0, 1.02);
        b["unsent"] = 0.into();
        let body = rendered(vec![a, b]);
        assert!(body.contains("| 0 | 5 | - | - |"), "{body}");
    }
}
