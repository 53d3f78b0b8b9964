//! The JSON result schema round-trips, is versioned, and the binary writes it.

use std::process::Command;

use bench::host::{HostInfo, UtcTime};
use bench::output::result_file;
use bench::schema::{ResultFile, UdpConfig, SCHEMA_VERSION};
use bench::udp::run::run_udp;

fn short_run() -> bench::schema::UdpRun {
    let cfg = UdpConfig {
        payload: 100,
        clients: 2,
        window: 4,
        server: "tokio".into(),
        io_model: "shared".into(),
        io_threads: 1,
        backend: "tokio".into(),
        idle: "balanced".into(),
        pin_cores: true,
        work_ns: 1_000,
        warmup_s: 0.0,
        seconds: 20.0,
        drain_s: 2.0,
        messages: Some(50),
        address_family: "ipv4".into(),
        recv_buffer: None,
        send_buffer: None,
        client_io: "mmsg".into(),
    };
    run_udp(&cfg, "schema")
}

#[test]
fn round_trip_and_version_check() {
    let file = result_file(
        "udp",
        &UtcTime::now(),
        HostInfo::collect(),
        vec![short_run()],
    );
    assert!(file.ok);
    let text = file.to_json().unwrap();
    let back = ResultFile::from_json(&text).unwrap();
    assert_eq!(back, file);
    assert_eq!(back.schema_version, SCHEMA_VERSION);
    assert!(!back.host.hostname.is_empty());
    assert!(!back.build.rustc.is_empty());

    // Another version is refused, as is a field the schema does not know.
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["schema_version"] = serde_json::json!(SCHEMA_VERSION + 1);
    assert!(ResultFile::from_json(&v.to_string()).is_err());
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["surprise"] = serde_json::json!(1);
    assert!(ResultFile::from_json(&v.to_string()).is_err());
}

#[test]
fn non_finite_numbers_are_refused() {
    let mut file = result_file(
        "udp",
        &UtcTime::now(),
        HostInfo::collect(),
        vec![short_run()],
    );
    file.udp_runs[0].round_trips_per_s = f64::NAN;
    assert!(file.to_json().is_err());
}

#[test]
fn binary_writes_a_valid_result_file() {
    let dir = std::env::temp_dir().join(format!("bench-schema-test-{}", std::process::id()));
    let path = dir.join("out.json");
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args([
            "udp",
            "--server",
            "tokio",
            "--io-threads",
            "1",
            "--clients",
            "2",
            "--window",
            "2",
            "--payload",
            "64",
            "--messages",
            "20",
            "--warmup",
            "0",
            "--seconds",
            "20",
            "--json",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("tokio ×1"), "{stdout}");
    let file = ResultFile::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(file.kind, "udp");
    assert!(
        file.command_line.contains("--messages 20"),
        "{}",
        file.command_line
    );
    assert_eq!(file.udp_runs.len(), 1);
    assert_eq!(file.udp_runs[0].phases.measured.received, 40);
    std::fs::remove_dir_all(&dir).unwrap();
}
