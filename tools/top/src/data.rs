//! Reading a server's metrics endpoint: `/metrics` (the classic text format) and `/sessions`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

/// One session as `/sessions` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    pub id: String,
    pub addr: String,
    pub rtt_us: u64,
    pub packets_sent: u64,
    pub packets_lost: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

impl Session {
    /// Share of packets lost over the session's life.
    pub fn loss(&self) -> f64 {
        self.packets_lost as f64 / self.packets_sent.max(1) as f64
    }
}

/// One worker's counters at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerSample {
    pub sessions: f64,
    pub busy_seconds: f64,
    pub datagrams_in: f64,
    pub datagrams_out: f64,
    pub drops: f64,
    pub tick_lateness_sum: f64,
    pub tick_lateness_count: f64,
}

/// Everything read in one refresh.
#[derive(Debug, Clone)]
pub struct Sample {
    pub at: Instant,
    pub total_sessions: u64,
    pub workers: BTreeMap<u32, WorkerSample>,
    pub sessions: Vec<Session>,
}

/// A worker's rates between two samples.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerRates {
    pub worker: u32,
    pub sessions: u64,
    /// Busy fraction, 0..=1.
    pub busy: f64,
    pub datagrams_in_per_sec: f64,
    pub datagrams_out_per_sec: f64,
    pub drops_per_sec: f64,
    /// Mean lateness of the ticks run in between, milliseconds.
    pub tick_lateness_ms: f64,
}

/// GET `path`: the body of a 200 answer.
fn get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))
        .with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, body) = out
        .split_once("\r\n\r\n")
        .context("malformed HTTP answer")?;
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        bail!("{path}: HTTP {status}");
    }
    Ok(body.to_string())
}

/// Parse one exposition line `name{labels} value` into (name, worker label, other labels, value).
fn parse_line(line: &str) -> Option<(&str, Option<u32>, &str, f64)> {
    if line.starts_with('#') || line.is_empty() {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        Some((n, l)) => (n, l.trim_end_matches('}')),
        None => (series, ""),
    };
    let worker = labels
        .split(',')
        .find_map(|kv| kv.strip_prefix("worker=\""))
        .and_then(|v| v.trim_end_matches('"').parse().ok());
    Some((name, worker, labels, value))
}

/// Read the workers' counters from an exposition.
pub fn parse_metrics(text: &str) -> (u64, BTreeMap<u32, WorkerSample>) {
    let mut total = 0;
    let mut workers: BTreeMap<u32, WorkerSample> = BTreeMap::new();
    for (name, worker, _, v) in text.lines().filter_map(parse_line) {
        if name == "ricochet_sessions" {
            total = v as u64;
            continue;
        }
        let Some(w) = worker else { continue };
        let s = workers.entry(w).or_default();
        match name {
            "ricochet_worker_sessions" => s.sessions = v,
            "ricochet_worker_busy_seconds_total" => s.busy_seconds = v,
            "ricochet_datagrams_received_total" => s.datagrams_in = v,
            "ricochet_datagrams_sent_total" => s.datagrams_out = v,
            "ricochet_dropped_datagrams_total" => s.drops += v,
            "ricochet_tick_lateness_seconds_sum" => s.tick_lateness_sum = v,
            "ricochet_tick_lateness_seconds_count" => s.tick_lateness_count = v,
            _ => {}
        }
    }
    (total, workers)
}

/// Read `/sessions`.
pub fn parse_sessions(json: &str) -> anyhow::Result<Vec<Session>> {
    let v: serde_json::Value = serde_json::from_str(json)?;
    let list = v
        .get("sessions")
        .and_then(|s| s.as_array())
        .context("no sessions list")?;
    let num = |s: &serde_json::Value, k: &str| s.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
    let text = |s: &serde_json::Value, k: &str| {
        s.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string()
    };
    Ok(list
        .iter()
        .map(|s| Session {
            id: text(s, "id"),
            addr: text(s, "addr"),
            rtt_us: num(s, "rtt_us"),
            packets_sent: num(s, "packets_sent"),
            packets_lost: num(s, "packets_lost"),
            bytes_sent: num(s, "bytes_sent"),
            bytes_received: num(s, "bytes_received"),
        })
        .collect())
}

/// One refresh: the metrics and the session list.
pub fn fetch(addr: SocketAddr) -> anyhow::Result<Sample> {
    let (total_sessions, workers) = parse_metrics(&get(addr, "/metrics")?);
    let sessions = parse_sessions(&get(addr, "/sessions")?)?;
    Ok(Sample {
        at: Instant::now(),
        total_sessions,
        workers,
        sessions,
    })
}

/// Each worker's rates from `prev` to `now` (zero rates when they are the same sample).
pub fn rates(prev: &Sample, now: &Sample) -> Vec<WorkerRates> {
    let dt = now.at.duration_since(prev.at).as_secs_f64();
    let per_sec = |a: f64, b: f64| if dt > 0.0 { (b - a).max(0.0) / dt } else { 0.0 };
    now.workers
        .iter()
        .map(|(&w, n)| {
            let p = prev.workers.get(&w).cloned().unwrap_or_default();
            let ticks = n.tick_lateness_count - p.tick_lateness_count;
            WorkerRates {
                worker: w,
                sessions: n.sessions as u64,
                busy: per_sec(p.busy_seconds, n.busy_seconds).min(1.0),
                datagrams_in_per_sec: per_sec(p.datagrams_in, n.datagrams_in),
                datagrams_out_per_sec: per_sec(p.datagrams_out, n.datagrams_out),
                drops_per_sec: per_sec(p.drops, n.drops),
                tick_lateness_ms: if ticks > 0.0 {
                    (n.tick_lateness_sum - p.tick_lateness_sum) / ticks * 1000.0
                } else {
                    0.0
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_worker_counters_and_sessions() {
        let text = "# TYPE ricochet_sessions gauge\nricochet_sessions 3\n\
            ricochet_worker_sessions{worker=\"1\"} 2\n\
            ricochet_dropped_datagrams_total{worker=\"1\",cause=\"malformed\"} 4\n\
            ricochet_dropped_datagrams_total{worker=\"1\",cause=\"duplicate\"} 1\n\
            ricochet_tick_lateness_seconds_count{worker=\"0\"} 10\n";
        let (total, w) = parse_metrics(text);
        assert_eq!(total, 3);
        assert_eq!(w[&1].sessions, 2.0);
        assert_eq!(w[&1].drops, 5.0);
        assert_eq!(w[&0].tick_lateness_count, 10.0);
        let s = parse_sessions(
            r#"{"sessions":[{"id":"0/1","worker":0,"addr":"127.0.0.1:5","rtt_us":1500,"packets_sent":100,"packets_lost":5,"bytes_sent":1,"bytes_received":2}]}"#,
        )
        .unwrap();
        assert_eq!(s[0].rtt_us, 1500);
        assert!((s[0].loss() - 0.05).abs() < 1e-9);
    }
}
