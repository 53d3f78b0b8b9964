//! Running `bench report` on the committed `results/` changes nothing: `PERFORMANCE.md` and every
//! chart under `docs/perf/` are byte-for-byte what the report generates.

use std::path::Path;

use bench::commands::report::plan;

#[test]
fn committed_report_is_up_to_date() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let files = plan(&root, None).expect("report renders from the committed results");
    assert!(!files.is_empty());
    let mut stale = Vec::new();
    for (path, content) in &files {
        let on_disk = std::fs::read_to_string(path).unwrap_or_default();
        if on_disk != *content {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "out of date (run `cargo run --release -p bench -- report` and commit): {stale:?}"
    );
}

#[test]
fn report_is_deterministic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let a = plan(&root, None).unwrap();
    let b = plan(&root, None).unwrap();
    assert_eq!(a, b);
}

#[test]
fn prose_outside_markers_survives_and_sections_are_refreshed() {
    let dir = std::env::temp_dir().join(format!("ricochet-report-test-{}", std::process::id()));
    let results = dir.join("results").join("host-20260101");
    std::fs::create_dir_all(&results).unwrap();
    std::fs::create_dir_all(dir.join("docs/perf")).unwrap();
    std::fs::write(dir.join("PERFORMANCE.md"), "# Perf\n\nFront page.\n").unwrap();
    std::fs::write(
        dir.join("docs/perf/archive.md"),
        "# Perf\n\nHand-written intro.\n\n<!-- BEGIN generated:udp-echo -->\nstale\n<!-- END generated:udp-echo -->\n\nHand-written outro.\n",
    )
    .unwrap();
    // A file of a kind the report cannot render is refused, with its name.
    std::fs::write(results.join("mystery.json"), "{\"kind\": \"mystery\"}").unwrap();
    let files = plan(&dir, None).unwrap();
    // The front page gets the headline section only; the archive gets the rest.
    let front = &files[0].1;
    assert!(front.starts_with("# Perf\n\nFront page.\n\n<!-- BEGIN generated:headline -->\n"));
    assert!(front.contains("No `bench sessions --stack ricochet,kernel` echo yet."));
    assert!(!front.contains("generated:udp-echo"));
    assert!(files[1].0.ends_with("docs/perf/archive.md"));
    let doc = &files[1].1;
    assert!(doc.starts_with("# Perf\n\nHand-written intro.\n\n<!-- BEGIN generated:udp-echo -->\n"));
    assert!(doc.contains("\n<!-- END generated:udp-echo -->\n\nHand-written outro.\n"));
    assert!(!doc.contains("stale"));
    assert!(doc.contains("No complete UDP echo measurement yet"));
    assert!(doc.contains("<!-- BEGIN generated:refused -->"));
    assert!(doc.contains("results/host-20260101/mystery.json"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn runs_under_results_local_are_not_reported() {
    let dir = std::env::temp_dir().join(format!("ricochet-report-local-{}", std::process::id()));
    let local = dir.join("results").join("local").join("host-20260101");
    let archived = dir.join("results").join("host-20260101");
    std::fs::create_dir_all(&local).unwrap();
    std::fs::create_dir_all(&archived).unwrap();
    std::fs::write(dir.join("PERFORMANCE.md"), "# Perf\n").unwrap();
    // Files the report refuses name themselves in the output, which shows what it read.
    std::fs::write(local.join("local-run.json"), "{\"kind\": \"mystery\"}").unwrap();
    std::fs::write(
        archived.join("archived-run.json"),
        "{\"kind\": \"mystery\"}",
    )
    .unwrap();
    let files = plan(&dir, None).unwrap();
    let doc = &files[1].1;
    assert!(doc.contains("results/host-20260101/archived-run.json"));
    assert!(!doc.contains("local-run.json"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A `bench ops` run with the scrape arm's A/A control renders its per-triple ratios, both
/// bands and the verdict; the committed runs from before it render as they did (the test
/// above).
#[test]
fn ops_scrape_arm_renders_its_aa_band_and_verdict() {
    let dir = std::env::temp_dir().join(format!("ricochet-report-ops-{}", std::process::id()));
    let results = dir.join("results").join("host-20260101");
    std::fs::create_dir_all(&results).unwrap();
    std::fs::write(dir.join("PERFORMANCE.md"), "# Perf\n").unwrap();
    let pct = |p99: f64| serde_json::json!({"round_trips": 1000, "p50_us": 100.0, "p99_us": p99, "p999_us": 3000.0});
    let pair = |s: f64, a: f64, b: f64, r: f64| {
        serde_json::json!({"scraping_p99_us": s, "quiet_a_p99_us": a, "quiet_b_p99_us": b,
            "p99_ratio": r, "aa_p99_ratio": a / b})
    };
    let run = serde_json::json!({
        "kind": "ops",
        "command": "bench ops --only scrape",
        "shape": {"clients": 4, "window": 16, "payload": 1024, "workers": 2, "seconds": 3.0, "warmup": 1.0},
        "scrape": {
            "sessions": 10000, "connect_seconds": 1.0, "phases": 6, "phase_seconds": 5.0,
            "scrapes": 10, "scrape_ms_median": 0.5, "scrape_ms_p90": 1.0, "scrape_ms_max": 2.0,
            "exposition_bytes": 14000, "scraping": pct(1100.0), "quiet": pct(1000.0),
            "p99_ratio": 1.1, "scrape_goal_ms": 50.0,
            "phase_kinds": ["scraping", "quiet_a", "quiet_b", "scraping", "quiet_b", "quiet_a"],
            "phase_p99_us": [1100.0, 1200.0, 900.0, 1100.0, 1000.0, 1000.0],
            "quiet_a": pct(1150.0), "quiet_b": pct(920.0), "aa_p99_ratio": 1.25,
            "aa_band": [0.8, 1.25],
            "pairs": [pair(1100.0, 1200.0, 900.0, 1.05), pair(1100.0, 1000.0, 1000.0, 1.1)],
            "median_pair_p99_ratio": 1.075, "median_pair_aa_p99_ratio": 1.1667,
            "pair_aa_band": [0.857, 1.1667],
            "p99_raised": false, "pair_p99_raised": false, "verdict": "not raised",
            "verdict_rule": "..."
        }
    });
    std::fs::write(results.join("ops-000000.json"), run.to_string()).unwrap();
    let files = plan(&dir, None).unwrap();
    let front = &files[0].1;
    assert!(
        front.contains("| quiet A | 1000 | 100 | 1150 | 3000 |"),
        "{front}"
    );
    assert!(
        front.contains("| 1 | 1100 | 1000 | 1000 | 1.100× | 1.000× |"),
        "{front}"
    );
    assert!(
        front.contains("| median |  |  |  | 1.075× | 1.167× |"),
        "{front}"
    );
    assert!(
        front.contains("1.100× pooled (A/A band 0.800–1.250×), 1.075× the median per triple (A/A band 0.857–1.167×"),
        "{front}"
    );
    assert!(front.contains("verdict: **not raised**"), "{front}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An arm-only `bench ops` run replaces that arm's figures and keeps the other arms from the
/// older full run; both files are named.
#[test]
fn ops_arms_come_from_the_newest_run_of_each() {
    let dir = std::env::temp_dir().join(format!("ricochet-report-ops-arms-{}", std::process::id()));
    let results = dir.join("results").join("host-20260101");
    std::fs::create_dir_all(&results).unwrap();
    std::fs::write(dir.join("PERFORMANCE.md"), "# Perf\n").unwrap();
    let shape = serde_json::json!({"clients": 4, "window": 16, "payload": 1024, "workers": 2, "seconds": 3.0, "warmup": 1.0});
    let side = |a: f64, b: f64| {
        serde_json::json!({"sides": ["a", "b"], "rounds": [[], []], "median_round_trips_per_s": [a, b],
            "ratio": a / b, "goal": 0.98})
    };
    let full = serde_json::json!({
        "kind": "ops", "command": "bench ops", "shape": shape,
        "metrics": side(1000.0, 1000.0), "conditioner": side(900.0, 1000.0), "scrape": null
    });
    let only = serde_json::json!({
        "kind": "ops", "command": "bench ops --only conditioner", "shape": shape,
        "metrics": null, "conditioner": side(1010.0, 1000.0), "scrape": null
    });
    std::fs::write(results.join("ops-000000.json"), full.to_string()).unwrap();
    std::fs::write(results.join("ops-000100.json"), only.to_string()).unwrap();
    let files = plan(&dir, None).unwrap();
    let front = &files[0].1;
    assert!(
        front.contains(
            "The metrics arm(s) from `results/host-20260101/ops-000000.json`: `bench ops`"
        ),
        "{front}"
    );
    assert!(
        front.contains("The conditioner arm(s) from `results/host-20260101/ops-000100.json`: `bench ops --only conditioner`"),
        "{front}"
    );
    assert!(front.contains("| 1010 | 1000 | 1.010× |"), "{front}");
    assert!(!front.contains("0.900×"), "{front}");
    assert!(front.contains("| 1000 | 1000 | 1.000× |"), "{front}");
    std::fs::remove_dir_all(&dir).unwrap();
}
