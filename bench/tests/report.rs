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
