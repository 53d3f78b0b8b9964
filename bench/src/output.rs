//! Where results go and how they print: result paths, the result-file envelope, text tables.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::host::{command_line, short_hostname, BuildInfo, HostInfo, UtcTime};
use crate::schema::{ResultFile, UdpRun, SCHEMA_VERSION};

/// The default results directory: `results/` at the workspace root when running from the
/// source tree, else `./results`. It holds the team's archive (tracked, read by `bench report`)
/// and, under [`LOCAL_DIR`], everyone's own runs.
pub fn default_results_root() -> PathBuf {
    match Path::new(env!("CARGO_MANIFEST_DIR")).parent() {
        Some(root) if root.join("results").is_dir() => root.join("results"),
        _ => PathBuf::from("results"),
    }
}

/// The subdirectory of the results root where runs go unless archived: git-ignored and skipped
/// by `bench report`, so running a benchmark never leaves the checkout dirty or the committed
/// report out of date.
pub const LOCAL_DIR: &str = "local";

/// Where a result file of `stem` started at `at` goes: `<dir>/<host>-<yyyymmdd>/<stem>-<hhmmss>.json`
/// where `<dir>` is `root` when given, else `results/` when `archive` is set, else `results/local/`.
pub fn result_path(root: Option<&Path>, archive: bool, stem: &str, at: &UtcTime) -> PathBuf {
    let dir = match root {
        Some(root) => root.to_path_buf(),
        None if archive => default_results_root(),
        None => default_results_root().join(LOCAL_DIR),
    };
    dir.join(format!("{}-{}", short_hostname(), at.date_compact()))
        .join(format!("{stem}-{}.json", at.time_compact()))
}

/// A result file for `runs` started at `at` on `host` (described before the runs, so the load
/// average is the machine's, not the benchmark's), with this build and command line.
pub fn result_file(kind: &str, at: &UtcTime, host: HostInfo, runs: Vec<UdpRun>) -> ResultFile {
    ResultFile {
        schema_version: SCHEMA_VERSION,
        kind: kind.to_string(),
        created_unix_s: at.unix_s,
        created_utc: at.iso(),
        command_line: command_line(),
        host,
        build: BuildInfo::collect(),
        ok: runs.iter().all(|r| r.ok),
        udp_runs: runs,
        rudp_cases: Vec::new(),
        sessions_runs: Vec::new(),
        game_runs: Vec::new(),
    }
}

/// One line about the host: name, cores, CPU, load average at the start.
pub fn host_line(h: &HostInfo) -> String {
    let load = h.load_average.map_or("unknown".into(), |l| {
        format!("{:.1} / {:.1} / {:.1}", l[0], l[1], l[2])
    });
    format!(
        "host {}: {} cores ({}), kernel {}, load average at start {load} (1/5/15 min)",
        h.hostname, h.cores, h.cpu_model, h.kernel
    )
}

/// Write `file` to `path` and say where.
pub fn write_result(file: &ResultFile, path: &Path) -> Result<()> {
    file.write(path)?;
    println!("results: {}", path.display());
    Ok(())
}

/// Write `value` as pretty JSON (and a newline) to `path`, creating its directory: the
/// micro-benchmarks' reports, which are not result files.
pub fn write_json(value: &impl serde::Serialize, path: &Path) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, serde_json::to_string_pretty(value)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

fn fmt_us(x: Option<f64>) -> String {
    match x {
        Some(v) if v >= 10_000.0 => format!("{:.1}ms", v / 1_000.0),
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.1}"),
        None => "-".into(),
    }
}

/// Thousands separators: 290,000.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// Render rows as an aligned text table (first column left-aligned, the rest right-aligned).
pub fn render_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let cols = header.len();
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(cols) {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: Vec<&str>| {
        for (i, c) in cells.iter().enumerate() {
            let pad = width[i].saturating_sub(c.chars().count());
            if i == 0 {
                let _ = write!(out, "{c}{}", " ".repeat(pad));
            } else {
                let _ = write!(out, "  {}{c}", " ".repeat(pad));
            }
        }
        out.push('\n');
    };
    line(&mut out, header.to_vec());
    let rule: Vec<String> = width.iter().map(|w| "-".repeat(*w)).collect();
    line(&mut out, rule.iter().map(String::as_str).collect());
    for r in rows {
        line(&mut out, r.iter().map(String::as_str).collect());
    }
    out
}

/// The echo table: one row per run.
pub fn udp_table(runs: &[UdpRun]) -> String {
    let header = [
        "run",
        "payload",
        "clients×window",
        "client io",
        "rt/s",
        "MiB/s",
        "p50 µs",
        "p90 µs",
        "p99 µs",
        "p99.9 µs",
        "max µs",
        "CPU %",
        "lost",
        "dup",
        "reord",
        "bad",
        "ok",
    ];
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            let m = &r.phases.measured;
            let l = r.rtt_us;
            vec![
                r.label.clone(),
                r.config.payload.to_string(),
                format!("{}×{}", r.config.clients, r.config.window),
                r.config.client_io.clone(),
                thousands(r.round_trips_per_s.round() as u64),
                format!("{:.1}", r.payload_mib_per_s),
                fmt_us(l.map(|l| l.p50)),
                fmt_us(l.map(|l| l.p90)),
                fmt_us(l.map(|l| l.p99)),
                fmt_us(l.map(|l| l.p999)),
                fmt_us(l.map(|l| l.max)),
                format!("{:.0}", r.cpu.percent),
                m.lost.to_string(),
                m.duplicated.to_string(),
                m.out_of_order.to_string(),
                m.content_errors.to_string(),
                if r.ok { "yes".into() } else { "NO".into() },
            ]
        })
        .collect();
    let mut out = render_table(&header, &rows);
    for r in runs.iter().filter(|r| !r.ok) {
        for e in &r.errors {
            let _ = writeln!(out, "  {}: {e}", r.label);
        }
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Per label, over its rounds: median (min–max) round trips/s and median p99.
pub fn median_table(runs: &[UdpRun]) -> String {
    let mut labels: Vec<&str> = Vec::new();
    for r in runs {
        if !labels.contains(&r.label.as_str()) {
            labels.push(&r.label);
        }
    }
    let rows: Vec<Vec<String>> = labels
        .iter()
        .map(|l| {
            let of: Vec<&UdpRun> = runs.iter().filter(|r| r.label == *l).collect();
            let rates: Vec<f64> = of.iter().map(|r| r.round_trips_per_s).collect();
            let lo = rates.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = rates.iter().copied().fold(0.0, f64::max);
            let p99: Vec<f64> = of.iter().filter_map(|r| r.rtt_us.map(|x| x.p99)).collect();
            vec![
                l.to_string(),
                of.len().to_string(),
                thousands(median(rates).round() as u64),
                format!(
                    "{}–{}",
                    thousands(finite_or_zero(lo).round() as u64),
                    thousands(hi.round() as u64)
                ),
                fmt_us((!p99.is_empty()).then(|| median(p99))),
                of.iter().filter(|r| r.ok).count().to_string(),
            ]
        })
        .collect();
    render_table(
        &[
            "run",
            "rounds",
            "median rt/s",
            "min–max rt/s",
            "median p99 µs",
            "ok",
        ],
        &rows,
    )
}

fn finite_or_zero(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

/// Server details of each run: backend, why, sockets, drops, worker counters.
pub fn server_notes(runs: &[UdpRun]) -> String {
    let mut out = String::new();
    for r in runs {
        let Some(s) = &r.server else { continue };
        let bufs: Vec<String> = s
            .sockets
            .iter()
            .map(|b| {
                format!(
                    "rcvbuf {}→{} sndbuf {}→{}{}",
                    b.recv_requested.map_or("default".into(), |v| v.to_string()),
                    b.recv_granted,
                    b.send_requested.map_or("default".into(), |v| v.to_string()),
                    b.send_granted,
                    b.drops.map_or(String::new(), |d| format!(" drops {d}")),
                )
            })
            .collect();
        let turns: u64 = s.workers.iter().map(|w| w.loop_turns).sum();
        let dgrams: u64 = s.workers.iter().map(|w| w.datagrams_in).sum();
        let syscalls: u64 = s.workers.iter().map(|w| w.syscalls).sum();
        let _ = write!(
            out,
            "  {}: {} {} ×{} via {} ({})",
            r.label, s.kind, s.io_model, s.threads, s.backend, s.selection_reason
        );
        if turns > 0 {
            let _ = write!(
                out,
                "; {:.1} datagrams/turn, {:.2} syscalls/datagram",
                dgrams as f64 / turns as f64,
                syscalls as f64 / dgrams.max(1) as f64
            );
        }
        if s.workers.len() > 1 {
            let per: Vec<String> = s
                .workers
                .iter()
                .map(|w| thousands(w.datagrams_in))
                .collect();
            let _ = write!(out, "; datagrams in per worker: {}", per.join(" / "));
        }
        let _ = writeln!(out);
        if let Some(first) = bufs.first() {
            let same = bufs.iter().all(|b| b == first);
            if same {
                let _ = writeln!(out, "      {} socket(s): {first}", bufs.len());
            } else {
                for b in &bufs {
                    let _ = writeln!(out, "      socket: {b}");
                }
            }
        }
        if let Some(k) = &r.kernel {
            let _ = writeln!(
                out,
                "      kernel (system-wide, whole run): UDP rcvbuf errors +{}, sndbuf errors +{}, in errors +{}, IPv4 reassembly +{}",
                k.delta.udp_rcvbuf_errors, k.delta.udp_sndbuf_errors, k.delta.udp_in_errors, k.delta.ip_reasm_reqds
            );
        }
    }
    out
}

/// The loss table of a limits matrix: rows payload (and family), columns windows, cells the
/// measured-phase lost echoes of each repetition (`FAIL` where the run could not happen).
pub fn loss_table(runs: &[UdpRun]) -> String {
    let mut windows: Vec<usize> = runs.iter().map(|r| r.config.window).collect();
    windows.sort_unstable();
    windows.dedup();
    let mut cells: BTreeMap<(String, usize), BTreeMap<usize, Vec<String>>> = BTreeMap::new();
    for r in runs {
        let key = (r.config.address_family.clone(), r.config.payload);
        let cell = if r.server.is_none() || r.phases.measured.sent == 0 {
            "FAIL".to_string()
        } else {
            r.phases.measured.lost.to_string()
        };
        cells
            .entry(key)
            .or_default()
            .entry(r.config.window)
            .or_default()
            .push(cell);
    }
    let mut header: Vec<String> = vec!["payload".into()];
    header.extend(windows.iter().map(|w| format!("window {w}")));
    let rows: Vec<Vec<String>> = cells
        .iter()
        .map(|((fam, payload), by_w)| {
            let mut row = vec![format!("{} {}", thousands(*payload as u64), fam)];
            for w in &windows {
                row.push(by_w.get(w).map_or("-".into(), |v| v.join(" / ")));
            }
            row
        })
        .collect();
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    render_table(&header_refs, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(290_123), "290,123");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn table_aligns() {
        let t = render_table(&["a", "bb"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(t, "a    bb\n---  --\nxyz   1\n");
    }
}
