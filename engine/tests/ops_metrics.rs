//! The metrics endpoint, health and readiness over real loopback sockets; a real Prometheus
//! scrape (ignored by default: `ci/ops.sh` installs Prometheus and runs it).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ricochet::runtime::{Handler, Server, ServerConfig, ServerContext, SessionId};
use ricochet::{Client, ClientConfig, ClientEvent, Impairment, IoModel, LinkConditioner};

struct Echo;
impl Handler for Echo {
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
        if &data[..] == b"die" {
            panic!("a handler bug (test)");
        }
        if &data[..] == b"block" {
            // A handler that holds its worker (a deadlock, a slow call) for 2 s.
            std::thread::sleep(Duration::from_secs(2));
        }
        let _ = ctx.send(s, channel, data);
    }
}

fn server(workers: usize) -> Server {
    let cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap())
        .insecure()
        .workers(workers)
        .metrics("127.0.0.1:0".parse().unwrap())
        .stall_limit(Duration::from_millis(500));
    Server::start(cfg, |_| Echo).unwrap()
}

fn client(addr: SocketAddr) -> Client {
    let cfg = ClientConfig::new().connect_timeout(Duration::from_secs(10));
    Client::connect_insecure_blocking(addr, cfg).expect("connects")
}

/// GET `path` from `addr`: (status, body).
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    get_accepting(addr, path, "*/*")
}

/// GET `path` from `addr` with this `Accept` header.
fn get_accepting(addr: SocketAddr, path: &str, accept: &str) -> (u16, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("response");
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|x| x.1)
        .unwrap_or("")
        .to_string();
    (status, body)
}

/// Exchange `n` echoes so that RTT samples exist.
fn exchange(c: &mut Client, n: usize) {
    for i in 0..n {
        c.send(0, format!("m{i}").into_bytes()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        'wait: loop {
            assert!(Instant::now() < deadline, "no echo");
            for ev in c.wait(Duration::from_millis(20)).unwrap() {
                if matches!(ev, ClientEvent::Message { .. }) {
                    break 'wait;
                }
            }
        }
    }
}

/// The value of the first sample line of `name` with these label pairs in the exposition.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            let (n, rest) = l.split_once(['{', ' ']).unwrap_or((l, ""));
            n == name && labels.iter().all(|p| rest.contains(p))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn the_endpoint_exposes_sessions_rtt_and_health() {
    let srv = server(2);
    let addr = srv.metrics_addr().expect("metrics on");
    let mut clients: Vec<Client> = (0..3).map(|_| client(srv.local_addr())).collect();
    for c in &mut clients {
        exchange(c, 20);
    }
    // Workers publish their snapshot once a second.
    std::thread::sleep(Duration::from_millis(1_300));
    let (status, text) = get(addr, "/metrics");
    assert_eq!(status, 200);
    assert_eq!(sample(&text, "ricochet_sessions", &[]), Some(3.0), "{text}");
    let per_worker: f64 = (0..2)
        .filter_map(|w| {
            sample(
                &text,
                "ricochet_worker_sessions",
                &[&format!("worker=\"{w}\"")],
            )
        })
        .sum();
    assert_eq!(per_worker, 3.0);
    let rtt_count: f64 = (0..2)
        .filter_map(|w| {
            sample(
                &text,
                "ricochet_rtt_seconds_count",
                &[&format!("worker=\"{w}\"")],
            )
        })
        .sum();
    assert!(rtt_count >= 30.0, "RTT samples: {rtt_count}");
    let received: f64 = (0..2)
        .filter_map(|w| {
            sample(
                &text,
                "ricochet_datagrams_received_total",
                &[&format!("worker=\"{w}\"")],
            )
        })
        .sum();
    assert!(received >= 60.0, "{text}");
    assert!(text.contains("cause=\"socket_overflow\""));
    // Each client's handshake was challenged (a resent hello on a loaded host is challenged
    // again); nothing renewed or dropped on loopback.
    let challenges: f64 = per_worker_values(&text, "ricochet_challenges_sent_total")
        .iter()
        .sum();
    assert!(challenges >= 3.0, "{text}");
    for name in [
        "ricochet_cookies_renewed_total",
        "ricochet_stateless_replies_dropped_total",
    ] {
        assert!(text.contains(&format!("# TYPE {name} counter")), "{text}");
        assert_eq!(per_worker_values(&text, name), [0.0, 0.0], "{name}");
    }
    assert!(text.contains("# TYPE ricochet_datagrams_received_total counter"));
    assert!(!text.contains("# EOF"), "classic text format by default");
    let (_, open_metrics) = get_accepting(addr, "/metrics", "application/openmetrics-text");
    assert!(open_metrics.trim_end().ends_with("# EOF"));
    assert!(open_metrics.contains("# TYPE ricochet_datagrams_received counter"));
    let (status, sessions) = get(addr, "/sessions");
    assert_eq!(status, 200);
    assert_eq!(sessions.matches("\"rtt_us\"").count(), 3, "{sessions}");
    assert_eq!(get(addr, "/healthz"), (200, "ok\n".into()));
    assert_eq!(get(addr, "/readyz").0, 200);
    assert_eq!(get(addr, "/nothing").0, 404);
    let h = srv.health();
    assert!(h.is_healthy() && h.ready);
    drop(clients);
    srv.shutdown().unwrap();
}

/// The sum of `name` over workers 0 and 1, and each worker's value.
fn per_worker_values(text: &str, name: &str) -> [f64; 2] {
    [0, 1].map(|w| sample(text, name, &[&format!("worker=\"{w}\"")]).unwrap_or(0.0))
}

/// With the shared IO model every thread serves the one endpoint: each session counts once in
/// the per-worker series and in `/sessions`, and a session counter never goes down while
/// sessions close (whichever thread sees the close).
#[test]
fn the_shared_io_model_counts_each_session_once_and_counters_never_go_down() {
    // 10 % loss on the server's sends (seeded), so that its sessions declare losses.
    let lossy = LinkConditioner::new(Impairment::new(), Impairment::new().loss(0.1)).seed(5);
    let cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap())
        .insecure()
        .workers(2)
        .io_model(IoModel::Shared)
        .conditioner(lossy)
        .metrics("127.0.0.1:0".parse().unwrap());
    let srv = Server::start(cfg, |_| Echo).unwrap();
    let addr = srv.metrics_addr().expect("metrics on");
    let mut clients: Vec<Client> = (0..6).map(|_| client(srv.local_addr())).collect();
    for c in &mut clients {
        exchange(c, 30);
    }
    std::thread::sleep(Duration::from_millis(1_300));
    let (_, text) = get(addr, "/metrics");
    assert_eq!(sample(&text, "ricochet_sessions", &[]), Some(6.0), "{text}");
    let sessions = per_worker_values(&text, "ricochet_worker_sessions");
    assert_eq!(sessions.iter().sum::<f64>(), 6.0, "{sessions:?}");
    let (_, listing) = get(addr, "/sessions");
    assert_eq!(listing.matches("\"rtt_us\"").count(), 6, "{listing}");
    let mut lost = per_worker_values(&text, "ricochet_packets_lost_total");
    assert!(lost.iter().sum::<f64>() > 0.0, "no loss declared: {text}");

    // Close five of the six, scraping while the closes go through and once more after the
    // next snapshot: no worker's series may go down (Prometheus would read a reset).
    for c in &mut clients[1..] {
        c.close();
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut closed_at = None;
    loop {
        for c in &mut clients {
            let _ = c.update();
        }
        let (_, text) = get(addr, "/metrics");
        let now = per_worker_values(&text, "ricochet_packets_lost_total");
        for w in 0..2 {
            assert!(
                now[w] >= lost[w],
                "worker {w}: packets lost went from {} to {}",
                lost[w],
                now[w]
            );
        }
        lost = now;
        let sessions = per_worker_values(&text, "ricochet_worker_sessions");
        if closed_at.is_none() && sessions.iter().sum::<f64>() == 1.0 {
            closed_at = Some(Instant::now());
        }
        // One more snapshot after the closes were seen.
        if closed_at.is_some_and(|t| t.elapsed() > Duration::from_millis(1_200)) {
            assert_eq!(sessions.iter().sum::<f64>(), 1.0, "{sessions:?}");
            break;
        }
        assert!(Instant::now() < deadline, "sessions left: {sessions:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(sample(&text_of(addr), "ricochet_sessions", &[]), Some(1.0));
    let (_, listing) = get(addr, "/sessions");
    assert_eq!(listing.matches("\"rtt_us\"").count(), 1, "{listing}");
    drop(clients);
    srv.shutdown().unwrap();
}

/// The exposition `/metrics` serves.
fn text_of(addr: SocketAddr) -> String {
    get(addr, "/metrics").1
}

#[test]
fn a_blocked_worker_fails_healthz_within_a_second_and_recovers() {
    let srv = server(1);
    let addr = srv.metrics_addr().unwrap();
    let mut c = client(srv.local_addr());
    exchange(&mut c, 3);
    assert_eq!(get(addr, "/healthz").0, 200);
    let blocked_at = Instant::now();
    c.send(0, &b"block"[..]).unwrap();
    // Until the client's datagram is out, nothing is blocked: keep it moving.
    let mut failed_at = None;
    let mut failure = String::new();
    let deadline = blocked_at + Duration::from_secs(6);
    while Instant::now() < deadline {
        let _ = c.update();
        let (status, body) = get(addr, "/healthz");
        if status == 503 && failed_at.is_none() {
            failed_at = Some(blocked_at.elapsed());
            failure = body;
        }
        if status == 200 && failed_at.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let failed_after = failed_at.expect("/healthz never failed");
    assert!(
        failed_after <= Duration::from_secs(1),
        "failed after {failed_after:?}"
    );
    assert!(failure.contains("worker 0: stalled"), "{failure}");
    assert_eq!(
        get(addr, "/healthz").0,
        200,
        "passes again once the handler returns"
    );
    assert!(blocked_at.elapsed() >= Duration::from_secs(2));
    assert!(srv.health().is_healthy());
    srv.shutdown().unwrap();
}

/// Ends the child when dropped (only the process this test started, by its handle).
struct Reaped(Child);
impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A query through Prometheus's HTTP API: the JSON body.
fn query(prom: SocketAddr, q: &str) -> String {
    let enc: String = q
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    get(prom, &format!("/api/v1/query?query={enc}")).1
}

#[test]
#[ignore = "needs the prometheus and promtool binaries (ci/ops.sh installs them)"]
fn a_real_prometheus_scrapes_sessions_and_the_rtt_histogram() {
    let srv = server(2);
    let metrics = srv.metrics_addr().unwrap();
    let mut clients: Vec<Client> = (0..2).map(|_| client(srv.local_addr())).collect();
    for c in &mut clients {
        exchange(c, 50);
    }
    std::thread::sleep(Duration::from_millis(1_200));

    // promtool accepts the exposition.
    let (_, text) = get(metrics, "/metrics");
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    check
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let dir = std::env::temp_dir().join(format!("ricochet-prom-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: ricochet\n    static_configs:\n      - targets: ['{metrics}']\n"
        ),
    )
    .unwrap();
    let prom: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let _prometheus = Reaped(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={prom}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus"),
    );
    // Bounded: Prometheus starts, scrapes every second; give it 60 s at most.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut sessions = String::new();
    let mut rtt = String::new();
    while Instant::now() < deadline {
        for c in &mut clients {
            exchange(c, 2);
        }
        if TcpStream::connect_timeout(&prom, Duration::from_millis(200)).is_ok() {
            sessions = query(prom, "ricochet_sessions");
            rtt = query(
                prom,
                "histogram_quantile(0.5, sum by (le) (ricochet_rtt_seconds_bucket))",
            );
            if sessions.contains("\"2\"]") && rtt.contains("\"result\":[{") {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        sessions.contains("\"2\"]"),
        "ricochet_sessions via Prometheus: {sessions}"
    );
    assert!(
        rtt.contains("\"result\":[{"),
        "RTT median via Prometheus: {rtt}"
    );
    // The median loopback RTT is a positive number of seconds below a second.
    let median: f64 = rtt
        .rsplit('"')
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("a value");
    assert!(median > 0.0 && median < 1.0, "{rtt}");
    println!("prometheus: sessions {sessions}\nprometheus: rtt p50 {rtt}");
    drop(clients);
    srv.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client that trickles its request a byte at a time holds the one-at-a-time endpoint for
/// its request deadline at most, not for as long as it keeps sending: probes still answer.
#[test]
fn a_trickling_client_does_not_hold_the_probes() {
    let srv = server(1);
    let addr = srv.metrics_addr().expect("metrics on");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let trickle = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        // 20 s of one byte every 250 ms, never finishing the head (well under 8 KiB).
        for _ in 0..80 {
            if flag.load(std::sync::atomic::Ordering::Relaxed) || s.write_all(b"X").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    });
    std::thread::sleep(Duration::from_millis(300)); // the trickler is being served now
    let started = Instant::now();
    let (status, _) = get(addr, "/healthz");
    let waited = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    trickle.join().unwrap();
    assert_eq!(status, 200);
    // The request deadline is 2 s; without it the probe waited the whole 20 s.
    assert!(
        waited < Duration::from_secs(8),
        "the probe waited {waited:?}"
    );
}

/// A server one of whose workers has ended (a panicking handler) serves part of its players no
/// more: `/readyz` turns 503 so a load balancer or matchmaker stops sending players to it.
#[test]
fn readyz_fails_once_a_worker_has_ended() {
    let srv = server(2);
    let addr = srv.metrics_addr().expect("metrics on");
    assert_eq!(get(addr, "/readyz").0, 200);
    let mut c = client(srv.local_addr());
    c.send(0, &b"die"[..]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let _ = c.update();
        if get(addr, "/readyz").0 == 503 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz still passes with an ended worker"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!srv.health().ready);
}
