//! The load generator of a round: the client threads, in the bench process or in a separate
//! one.
//!
//! In-process ([`LocalFleet`]), the client threads share the process with the server and the
//! relay, and may be pinned beside the server worker that serves them (`--client-placement`).
//! Separate ([`RemoteFleet`]), the bench starts its own binary again in the hidden
//! `rudp-clients` sub-command, as an outside load generator would run: its own address space,
//! its threads left to the scheduler. Both run the same client code ([`super::client`]).
//!
//! The parent talks to the child over its standard input and output, one JSON message a line:
//!
//! ```text
//! parent → child   job (config + address)       go | stop       close
//! child → parent            ready {errors}       done {outcomes, cpu}      closed {errors}
//! ```
//!
//! The child takes its own epoch when it reads `go`; every time it reports (the last measured
//! echo) is relative to that epoch, so no clock crosses the process boundary.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use ricochet_platform::BackendKind;
use ricochet_proto::token::ConnectToken;
use serde::{Deserialize, Serialize};

use super::client::{run_clients, ClientOutcome, ClientPlan};
use super::protocol::protocol;
use crate::host::{peak_rss_kib, CpuTimes};
use crate::schema::{finite, ClientProcess, CpuUsage, RudpConfig, RudpCounts, RudpWire};
use crate::udp::tracker::new_rtt_histogram;

/// The hidden sub-command the separate client process runs.
pub const CLIENTS_SUBCOMMAND: &str = "rudp-clients";

/// Longest wait for every client to connect (or fail).
const CONNECT_LIMIT: Duration = Duration::from_secs(15);

/// Extra time a separate process gets to start and to exit.
const PROCESS_SLACK: Duration = Duration::from_secs(10);

static CLIENT_EXECUTABLE: OnceLock<PathBuf> = OnceLock::new();

/// Run the separate client process from `path` instead of this executable (a test binary is
/// not the bench: tests point this at `CARGO_BIN_EXE_bench`). Only the first call counts.
pub fn set_client_executable(path: impl Into<PathBuf>) {
    let _ = CLIENT_EXECUTABLE.set(path.into());
}

fn client_executable() -> Result<PathBuf> {
    match CLIENT_EXECUTABLE.get() {
        Some(p) => Ok(p.clone()),
        None => std::env::current_exe().context("locating the bench executable"),
    }
}

/// What the clients brought back once every one of them finished (or the wait gave up).
#[derive(Debug, Default)]
pub struct Collected {
    /// One per client that reported.
    pub outcomes: Vec<ClientOutcome>,
    /// Why the round is not ok, one line each.
    pub errors: Vec<String>,
    /// The separate process's own CPU and memory (`None` in process).
    pub process: Option<ClientProcess>,
}

/// The clients of a round.
pub enum Fleet {
    /// Threads of this process.
    Local(LocalFleet),
    /// A child process of the bench binary.
    Remote(RemoteFleet),
}

impl Fleet {
    /// Start the clients of `cfg` against `target` and wait until each has connected or
    /// failed; the errors say which failed. `worker_cores`: the cores of the server workers,
    /// for in-process clients placed `with-worker`.
    ///
    /// `tokens`: each client's connect token, as the game's backend would hand them out (a
    /// separate process gets the tokens, never the key); `None` connects insecurely.
    pub fn launch(
        cfg: &RudpConfig,
        target: SocketAddr,
        worker_cores: Option<Arc<Vec<Option<usize>>>>,
        tokens: Option<Vec<ConnectToken>>,
    ) -> Result<(Fleet, Vec<String>)> {
        if cfg.separate_clients() {
            let (f, e) = RemoteFleet::launch(cfg, target, tokens)?;
            Ok((Fleet::Remote(f), e))
        } else {
            let (f, e) = LocalFleet::launch(cfg, target, worker_cores, tokens)?;
            Ok((Fleet::Local(f), e))
        }
    }

    /// Start the phases (`go`), or tell the clients to give up; returns the epoch.
    pub fn start(&mut self, go: bool) -> Instant {
        match self {
            Fleet::Local(f) => f.start(go),
            Fleet::Remote(f) => f.start(go),
        }
    }

    /// Wait up to `limit` for every client to finish its drain.
    pub fn collect(&mut self, limit: Duration) -> Collected {
        match self {
            Fleet::Local(f) => f.collect(limit),
            Fleet::Remote(f) => f.collect(limit),
        }
    }

    /// Close every connection and end the clients; returns what went wrong.
    pub fn close(self) -> Vec<String> {
        match self {
            Fleet::Local(f) => f.close(),
            Fleet::Remote(f) => f.close(),
        }
    }
}

/// Client threads in this process.
pub struct LocalFleet {
    starts: Vec<Sender<Option<Instant>>>,
    handles: Vec<JoinHandle<()>>,
    done: Receiver<ClientOutcome>,
    close: Arc<AtomicBool>,
    clients: usize,
}

impl LocalFleet {
    /// Spawn the client threads (clients round-robin over `cfg`'s client threads) and wait
    /// for every client to connect (with its token from `tokens`, or insecurely) or fail.
    pub fn launch(
        cfg: &RudpConfig,
        target: SocketAddr,
        worker_cores: Option<Arc<Vec<Option<usize>>>>,
        tokens: Option<Vec<ConnectToken>>,
    ) -> Result<(LocalFleet, Vec<String>)> {
        if tokens.as_ref().is_some_and(|t| t.len() < cfg.clients) {
            bail!("fewer connect tokens than clients");
        }
        let endpoint = protocol(cfg)?;
        let backend = BackendKind::from_str(&cfg.backend).map_err(|e| anyhow!("{e}"))?;
        let threads = cfg.resolved_client_threads();
        let mut groups: Vec<Vec<ClientPlan>> = (0..threads).map(|_| Vec::new()).collect();
        for i in 0..cfg.clients {
            let plan = ClientPlan {
                id: i as u32,
                server: target,
                token: tokens.as_ref().and_then(|t| t.get(i).cloned()),
                payload: cfg.payload,
                window: cfg.window,
                warmup: Duration::from_secs_f64(cfg.warmup_s),
                measured: Duration::from_secs_f64(cfg.seconds),
                drain: Duration::from_secs_f64(cfg.drain_s),
                endpoint: endpoint.clone(),
                backend,
                seed: cfg.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i as u64 + 1),
                worker_cores: worker_cores.clone(),
            };
            // Round-robin: client i on thread i mod threads.
            groups[i % threads].push(plan);
        }
        let close = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let mut fleet = LocalFleet {
            starts: Vec::new(),
            handles: Vec::new(),
            done: done_rx,
            close,
            clients: 0,
        };
        let mut errors = Vec::new();
        for (t, plans) in groups.into_iter().enumerate() {
            let n = plans.len();
            let (start_tx, start_rx) = mpsc::channel();
            let (ready, done, close) = (ready_tx.clone(), done_tx.clone(), fleet.close.clone());
            match std::thread::Builder::new()
                .name(format!("rudp-clients-{t}"))
                .spawn(move || run_clients(plans, ready, start_rx, done, close))
            {
                Ok(h) => {
                    fleet.handles.push(h);
                    fleet.starts.push(start_tx);
                    fleet.clients += n;
                }
                Err(e) => {
                    errors.push(format!("spawning client thread {t}: {e}"));
                    break;
                }
            }
        }
        drop((ready_tx, done_tx));
        for _ in 0..fleet.clients {
            match ready_rx.recv_timeout(CONNECT_LIMIT) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => errors.push(e),
                Err(_) => errors.push(format!(
                    "a client neither connected nor failed within {} s",
                    CONNECT_LIMIT.as_secs()
                )),
            }
        }
        Ok((fleet, errors))
    }

    fn start(&mut self, go: bool) -> Instant {
        let epoch = Instant::now();
        for s in &self.starts {
            let _ = s.send(go.then_some(epoch));
        }
        epoch
    }

    fn collect(&mut self, limit: Duration) -> Collected {
        let mut out = Collected::default();
        let t0 = Instant::now();
        for _ in 0..self.clients {
            match self.done.recv_timeout(limit.saturating_sub(t0.elapsed())) {
                Ok(o) => out.outcomes.push(o),
                Err(_) => {
                    out.errors
                        .push("a client did not finish its drain in time".into());
                    break;
                }
            }
        }
        out
    }

    fn close(self) -> Vec<String> {
        self.close.store(true, Ordering::Release);
        let mut errors = Vec::new();
        for (i, h) in self.handles.into_iter().enumerate() {
            if h.join().is_err() {
                errors.push(format!("client thread {i} panicked"));
            }
        }
        errors
    }
}

/// The first message to the child: what to run.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Job {
    config: RudpConfig,
    target: SocketAddr,
    /// Each client's serialized connect token (none: insecure).
    #[serde(default)]
    tokens: Option<Vec<Vec<u8>>>,
}

/// One client's outcome as the child reports it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientReport {
    warmup: RudpCounts,
    measured: RudpCounts,
    /// The RTT histogram as (value, count) of every recorded bucket, ns.
    rtt_ns: Vec<(u64, u64)>,
    last_measured_echo_ns: Option<u64>,
    wire: RudpWire,
    error: Option<String>,
}

impl ClientReport {
    fn of(o: &ClientOutcome) -> ClientReport {
        ClientReport {
            warmup: o.warmup,
            measured: o.measured,
            rtt_ns: histogram_buckets(&o.rtt_ns),
            last_measured_echo_ns: o
                .last_measured_echo
                .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            wire: o.wire,
            error: o.error.clone(),
        }
    }

    fn into_outcome(self) -> Result<ClientOutcome> {
        Ok(ClientOutcome {
            warmup: self.warmup,
            measured: self.measured,
            rtt_ns: histogram_from_buckets(&self.rtt_ns)?,
            last_measured_echo: self.last_measured_echo_ns.map(Duration::from_nanos),
            wire: self.wire,
            error: self.error,
        })
    }
}

/// Every non-empty bucket of `h` as (a value in it, count).
pub fn histogram_buckets(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    h.iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_at_value()))
        .collect()
}

/// A histogram with the RTT histogram's bounds holding `buckets`.
pub fn histogram_from_buckets(buckets: &[(u64, u64)]) -> Result<Histogram<u64>> {
    let mut h = new_rtt_histogram();
    for &(v, n) in buckets {
        h.record_n(v, n)
            .map_err(|e| anyhow!("RTT bucket {v} ns out of range: {e}"))?;
    }
    Ok(h)
}

/// A message from the child, one JSON line each.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum ChildMessage {
    /// Every client connected or failed.
    Ready { errors: Vec<String> },
    /// Every client finished its drain (or the wait gave up).
    Done {
        outcomes: Vec<ClientReport>,
        errors: Vec<String>,
        process: ClientProcess,
    },
    /// The connections are closed and the threads joined.
    Closed { errors: Vec<String> },
}

/// The clients in a child process of the bench binary.
pub struct RemoteFleet {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<std::io::Result<String>>,
    reader: Option<JoinHandle<()>>,
}

impl RemoteFleet {
    /// Start the child, hand it the job, and wait until its clients connected or failed.
    pub fn launch(
        cfg: &RudpConfig,
        target: SocketAddr,
        tokens: Option<Vec<ConnectToken>>,
    ) -> Result<(RemoteFleet, Vec<String>)> {
        let exe = client_executable()?;
        let mut child = Command::new(&exe)
            .arg(CLIENTS_SUBCOMMAND)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting the client process {}", exe.display()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the client process has no standard input or output");
        };
        let (tx, lines) = mpsc::channel();
        let reader = std::thread::Builder::new()
            .name("rudp-clients-pipe".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let end = line.is_err();
                    if tx.send(line).is_err() || end {
                        break;
                    }
                }
            });
        let reader = match reader {
            Ok(r) => r,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!("spawning the client pipe reader: {e}");
            }
        };
        let mut fleet = RemoteFleet {
            child,
            stdin: Some(stdin),
            lines,
            reader: Some(reader),
        };
        let job = Job {
            config: cfg.clone(),
            target,
            tokens: tokens.map(|t| t.iter().map(ConnectToken::to_bytes).collect()),
        };
        fleet.send(&serde_json::to_string(&job)?)?;
        match fleet.receive(CONNECT_LIMIT + PROCESS_SLACK)? {
            ChildMessage::Ready { errors } => Ok((fleet, errors)),
            other => bail!("the client process answered {other:?} instead of ready"),
        }
    }

    fn send(&mut self, line: &str) -> Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow!("the client process's input is closed"))?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .context("writing to the client process")
    }

    fn receive(&mut self, limit: Duration) -> Result<ChildMessage> {
        let line = match self.lines.recv_timeout(limit) {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => bail!("reading from the client process: {e}"),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                bail!("the client process said nothing for {} s", limit.as_secs())
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = self.child.try_wait().ok().flatten();
                bail!("the client process ended (status {status:?})")
            }
        };
        serde_json::from_str(&line)
            .with_context(|| format!("the client process wrote {line:?}, not a message"))
    }

    fn start(&mut self, go: bool) -> Instant {
        let epoch = Instant::now();
        // A failed write shows as a missing `done` in `collect`.
        let _ = self.send(if go { "go" } else { "stop" });
        epoch
    }

    fn collect(&mut self, limit: Duration) -> Collected {
        let mut out = Collected::default();
        match self.receive(limit + PROCESS_SLACK) {
            Ok(ChildMessage::Done {
                outcomes,
                errors,
                process,
            }) => {
                out.errors = errors;
                out.process = Some(process);
                for r in outcomes {
                    match r.into_outcome() {
                        Ok(o) => out.outcomes.push(o),
                        Err(e) => out.errors.push(format!("client process: {e:#}")),
                    }
                }
            }
            Ok(other) => out.errors.push(format!(
                "the client process answered {other:?} instead of done"
            )),
            Err(e) => out.errors.push(format!("{e:#}")),
        }
        out
    }

    fn close(mut self) -> Vec<String> {
        let mut errors = Vec::new();
        // Closing its input also tells the child to close (whatever it was waiting for).
        let _ = self.send("close");
        self.stdin = None;
        // The child keeps its connections serviced for at most 30 s before it closes them.
        match self.receive(Duration::from_secs(30) + PROCESS_SLACK) {
            Ok(ChildMessage::Closed { errors: e }) => errors.extend(e),
            Ok(other) => errors.push(format!(
                "the client process answered {other:?} instead of closed"
            )),
            Err(e) => errors.push(format!("{e:#}")),
        }
        let deadline = Instant::now() + PROCESS_SLACK;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) if status.success() => break,
                Ok(Some(status)) => {
                    errors.push(format!("the client process exited with {status}"));
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(None) => {
                    errors.push("the client process did not exit; killed".into());
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                Err(e) => {
                    errors.push(format!("waiting for the client process: {e}"));
                    break;
                }
            }
        }
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        errors
    }
}

impl Drop for RemoteFleet {
    fn drop(&mut self) {
        // `close` waited for it; anything else (an early error) must not leave it running.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The child's side: read the job from `input`, run the clients, report on `output`. Used
/// by the hidden `rudp-clients` sub-command with standard input and output.
pub fn serve_clients_process(input: impl BufRead, mut output: impl Write) -> Result<()> {
    let mut lines = input.lines();
    let mut next_line = move || -> Result<Option<String>> {
        lines.next().transpose().context("reading from the bench")
    };
    let mut say = |m: &ChildMessage| -> Result<()> {
        let text = serde_json::to_string(m)?;
        writeln!(output, "{text}")
            .and_then(|()| output.flush())
            .context("writing to the bench")
    };
    let job_line = next_line()?.ok_or_else(|| anyhow!("no job on standard input"))?;
    let job: Job = serde_json::from_str(&job_line).context("parsing the job")?;
    let cfg = job.config;
    // No placement tricks: an outside load generator's threads go where the OS puts them.
    let tokens = match job.tokens {
        Some(t) => Some(
            t.iter()
                .map(|b| ConnectToken::from_bytes(b))
                .collect::<Result<Vec<_>, _>>()
                .context("reading the connect tokens")?,
        ),
        None => None,
    };
    let (mut fleet, errors) = LocalFleet::launch(&cfg, job.target, None, tokens)?;
    say(&ChildMessage::Ready { errors })?;
    let go = next_line()?.as_deref() == Some("go");
    let epoch = fleet.start(go);
    if go {
        let measured_start = epoch + Duration::from_secs_f64(cfg.warmup_s);
        std::thread::sleep(measured_start.saturating_duration_since(Instant::now()));
        let cpu0 = CpuTimes::now();
        let t0 = Instant::now();
        let limit = Duration::from_secs_f64(cfg.seconds + cfg.drain_s) + Duration::from_secs(10);
        let collected = fleet.collect(limit);
        let cpu1 = CpuTimes::now();
        let wall = t0.elapsed().as_secs_f64();
        let (user, sys) = (cpu1.user_s - cpu0.user_s, cpu1.sys_s - cpu0.sys_s);
        let process = ClientProcess {
            cpu: CpuUsage {
                user_s: finite(user),
                sys_s: finite(sys),
                percent: if wall > 0.0 {
                    finite((user + sys) / wall * 100.0)
                } else {
                    0.0
                },
            },
            peak_rss_kib: peak_rss_kib(),
        };
        say(&ChildMessage::Done {
            outcomes: collected.outcomes.iter().map(ClientReport::of).collect(),
            errors: collected.errors,
            process,
        })?;
        // Keep acknowledging until the bench has read the server's counters.
        let _ = next_line();
    }
    let errors = fleet.close();
    say(&ChildMessage::Closed { errors })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rtt_buckets_round_trip() {
        let mut h = new_rtt_histogram();
        for v in [
            1u64,
            999,
            1_000,
            123_456,
            7_000_000,
            100_000_000,
            59_000_000_000,
        ] {
            h.record(v).unwrap();
        }
        h.record_n(250_000, 42).unwrap();
        let back = histogram_from_buckets(&histogram_buckets(&h)).unwrap();
        assert_eq!(back.len(), h.len());
        for q in [0.0, 0.5, 0.9, 0.99, 0.999, 1.0] {
            assert_eq!(back.value_at_quantile(q), h.value_at_quantile(q), "q {q}");
        }
        assert_eq!(back.max(), h.max());
        assert!(histogram_from_buckets(&[(u64::MAX, 1)]).is_err());
    }
}
