//! A small HTTP/1.1 server on its own thread: `/metrics` (OpenMetrics), `/healthz`,
//! `/readyz` and `/sessions` (JSON, for `ricochet-top`). One request per connection, served
//! one at a time: its clients are a scraper, probes and a live view.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;

use super::metrics::ServerCollector;
use super::{Ops, SessionRow};

/// How long the accept loop rests after a failed accept (out of descriptors: don't spin).
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
/// Longest a client may take to send its whole request head (and, again, to read the answer).
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest request head read; longer ones are answered 431.
const MAX_HEAD: usize = 8192;

/// The running endpoint; dropping it stops its thread.
#[derive(Debug)]
pub(crate) struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Bind `addr` and serve on a thread of its own.
    pub(crate) fn start(addr: SocketAddr, ops: Arc<Ops>) -> std::io::Result<Self> {
        // A blocking accept: a scrape or probe is answered at once (polling a non-blocking
        // listener every 50 ms made each wait 25 ms on average). Drop wakes it.
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ServerCollector(ops.clone())));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ricochet-metrics".into())
            .spawn(move || {
                loop {
                    let accepted = listener.accept();
                    // The wake-up connection of `Drop`, or any that came with it.
                    if flag.load(Ordering::Acquire) {
                        break;
                    }
                    match accepted {
                        Ok((stream, _)) => {
                            if let Err(e) = serve(stream, &registry, &ops) {
                                tracing::debug!(error = %e, "metrics request failed");
                            }
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "metrics accept failed");
                            std::thread::sleep(ACCEPT_RETRY)
                        }
                    }
                }
            })?;
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address (its port is known also when 0 was asked for).
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the blocking accept with a connection of our own (to loopback when bound to
        // every address).
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let woke = TcpStream::connect_timeout(&wake, IO_TIMEOUT).is_ok();
        if let Some(t) = self.thread.take() {
            // Unwoken, the thread would block the join for good: leave it (it holds only the
            // listener and the shared counters).
            if woke {
                let _ = t.join();
            }
        }
    }
}

/// Read one request head; `None` when it is too long or the client went away. The whole head
/// must arrive by `deadline` (not each read: a client trickling a byte a second would otherwise
/// hold this one-at-a-time thread, and with it every probe and scrape, for hours).
fn read_head(stream: &mut TcpStream, deadline: Instant) -> std::io::Result<Option<String>> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left))?;
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(Some(String::from_utf8_lossy(&buf).into_owned()));
        }
        if buf.len() > MAX_HEAD {
            return Ok(None);
        }
    }
}

fn serve(mut stream: TcpStream, registry: &Registry, ops: &Ops) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    let deadline = Instant::now() + IO_TIMEOUT;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let Some(head) = read_head(&mut stream, deadline)? else {
        return respond(&mut stream, 431, "text/plain", "request head too large\n");
    };
    let mut parts = head.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" {
        return respond(&mut stream, 405, "text/plain", "GET only\n");
    }
    let path = target.split('?').next().unwrap_or("");
    match path {
        "/metrics" => {
            let mut body = String::new();
            match prometheus_client::encoding::text::encode(&mut body, registry) {
                // Prometheus asks for OpenMetrics; other readers (promtool, curl, older
                // scrapers) get the classic text format.
                Ok(()) if head.contains("application/openmetrics-text") => respond(
                    &mut stream,
                    200,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    &body,
                ),
                Ok(()) => respond(
                    &mut stream,
                    200,
                    "text/plain; version=0.0.4; charset=utf-8",
                    &classic_text(&body),
                ),
                Err(_) => respond(&mut stream, 500, "text/plain", "encoding failed\n"),
            }
        }
        "/healthz" => {
            let h = ops.health();
            if h.is_healthy() {
                respond(&mut stream, 200, "text/plain", "ok\n")
            } else {
                let body = h.problems().join("\n") + "\n";
                respond(&mut stream, 503, "text/plain", &body)
            }
        }
        "/readyz" => {
            if ops.health().ready {
                respond(&mut stream, 200, "text/plain", "ready\n")
            } else {
                respond(
                    &mut stream,
                    503,
                    "text/plain",
                    "not admitting (draining or stopping)\n",
                )
            }
        }
        "/sessions" => respond(&mut stream, 200, "application/json", &sessions_json(ops)),
        _ => respond(
            &mut stream,
            404,
            "text/plain",
            "not found: /metrics /healthz /readyz /sessions\n",
        ),
    }
}

/// The classic Prometheus text format (0.0.4) of an OpenMetrics exposition: a counter's
/// family is named with its `_total` suffix there, and `# UNIT` and `# EOF` do not exist.
fn classic_text(open_metrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = open_metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open_metrics.len());
    for line in open_metrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((p, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let suffix = if counters.contains(name) {
                    "_total"
                } else {
                    ""
                };
                let _ = writeln!(out, "{p}{name}{suffix} {tail}");
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

fn respond(stream: &mut TcpStream, status: u16, ty: &str, body: &str) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {ty}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}

/// The sessions the workers listed (each its highest by RTT and by loss), as JSON.
pub(crate) fn sessions_json(ops: &Ops) -> String {
    let mut rows: Vec<SessionRow> = ops.services.iter().flat_map(|s| s.read().top).collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.rtt_us));
    let mut out = String::from("{\"sessions\":[");
    for (i, r) in rows.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        // Ids and addresses are formatted by this crate: no characters JSON must escape.
        let _ = write!(
            out,
            "{{\"id\":\"{}\",\"worker\":{},\"addr\":\"{}\",\"rtt_us\":{},\"packets_sent\":{},\"packets_lost\":{},\"bytes_sent\":{},\"bytes_received\":{}}}",
            r.id, r.id.worker, r.addr, r.rtt_us, r.packets_sent, r.packets_lost, r.bytes_sent, r.bytes_received
        );
    }
    out.push_str("]}");
    out
}
