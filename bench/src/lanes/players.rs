//! The players of `bench lanes`, in a child process of the bench (the bench re-executes itself
//! with the hidden `lanes-players` sub-command), so the server and the players share no
//! process, as an outside game would not.
//!
//! The parent writes one JSON [`PlayersSpec`] line on the child's standard input; the child
//! connects every player through the relay, prints `{"Ready":..}`, receives until the parent
//! writes `stop`, and prints one JSON [`PlayersReport`] line.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ricochet::ClientEvent;
use serde::{Deserialize, Serialize};

use crate::scale::server::monotonic_ns;
use crate::scale::setup::{connect_all, idle_for};

/// The hidden sub-command of the players' process.
pub const PLAYERS_SUBCOMMAND: &str = "lanes-players";

/// What the players' process is asked to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlayersSpec {
    /// Where the players connect (the relay's front door).
    pub target: String,
    /// The server's own address (for the connect path; insecure sessions need only `target`).
    pub server: String,
    /// Players.
    pub players: usize,
    /// Protocol profile (`default`, `game`, `bulk`).
    pub profile: String,
    /// Datagram backend.
    pub backend: String,
    /// Channel of the snapshots.
    pub snapshot_channel: u8,
    /// Channel of the events.
    pub event_channel: u8,
}

/// One received message: which player, when the server sent it and when it arrived (host
/// monotonic ns), and its sequence number.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Arrival {
    /// Player index.
    pub player: u32,
    /// The message's sequence number (per player and kind).
    pub seq: u64,
    /// Server send time, monotonic ns.
    pub sent_ns: u64,
    /// Receive time, monotonic ns.
    pub recv_ns: u64,
}

/// What the players saw.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlayersReport {
    /// Every snapshot received.
    pub snapshots: Vec<Arrival>,
    /// Every event received.
    pub events: Vec<Arrival>,
    /// Messages that could not be read (wrong channel or too short).
    pub malformed: u64,
    /// Players that disconnected during the run.
    pub disconnected: u64,
}

#[derive(Debug, Serialize, Deserialize)]
enum FromPlayers {
    Ready,
    Failed(String),
    Report(Box<PlayersReport>),
}

/// Bytes of a message header: sequence number and send time (monotonic ns), little-endian.
pub const HEADER: usize = 16;

/// Reads `(seq, sent_ns)` from a message.
pub fn header(data: &[u8]) -> Option<(u64, u64)> {
    let seq = u64::from_le_bytes(data.get(..8)?.try_into().ok()?);
    let sent = u64::from_le_bytes(data.get(8..16)?.try_into().ok()?);
    Some((seq, sent))
}

/// The players' process's main: read the spec, connect, receive until `stop`, report.
pub fn serve_process(input: impl BufRead + Send + 'static, mut output: impl Write) -> Result<()> {
    let mut lines = input.lines();
    let spec: PlayersSpec = serde_json::from_str(&lines.next().context("no spec")??)?;
    let target: SocketAddr = spec.target.parse().context("target address")?;
    let server: SocketAddr = spec.server.parse().context("server address")?;
    let connected = connect_all(
        target,
        server,
        None,
        spec.players,
        spec.players,
        0,
        |ip, seed| crate::scale::setup::member_config(&spec.profile, &spec.backend, ip, seed),
        Duration::from_secs(30),
    );
    let mut set = match connected {
        Ok((set, _)) => set,
        Err(e) => {
            send(&mut output, &FromPlayers::Failed(format!("{e:#}")))?;
            return Ok(());
        }
    };
    idle_for(&mut set, Duration::from_millis(50))?;
    send(&mut output, &FromPlayers::Ready)?;
    // The stop line arrives on another thread so that receiving never blocks on stdin.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = lines.next();
        let _ = tx.send(());
    });
    let mut report = PlayersReport::default();
    while rx.try_recv().is_err() {
        set.step(Duration::from_millis(1))?;
        let recv_ns = monotonic_ns();
        while let Some((i, e)) = set.poll_event() {
            match e {
                ClientEvent::Message { channel, data } => {
                    let Some((seq, sent_ns)) = header(&data) else {
                        report.malformed += 1;
                        continue;
                    };
                    let a = Arrival {
                        player: i as u32,
                        seq,
                        sent_ns,
                        recv_ns,
                    };
                    if channel == spec.snapshot_channel {
                        report.snapshots.push(a);
                    } else if channel == spec.event_channel {
                        report.events.push(a);
                    } else {
                        report.malformed += 1;
                    }
                }
                ClientEvent::Disconnected { .. } => report.disconnected += 1,
                _ => {}
            }
        }
    }
    send(&mut output, &FromPlayers::Report(Box::new(report)))
}

fn send(out: &mut impl Write, msg: &FromPlayers) -> Result<()> {
    writeln!(out, "{}", serde_json::to_string(msg)?)?;
    out.flush()?;
    Ok(())
}

/// The players' process, seen from the bench.
#[derive(Debug)]
pub struct PlayersProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl PlayersProcess {
    /// Starts the process and waits until every player is connected.
    pub fn start(spec: &PlayersSpec) -> Result<PlayersProcess> {
        let exe = std::env::current_exe().context("locating the bench executable")?;
        let mut child = Command::new(exe)
            .arg(PLAYERS_SUBCOMMAND)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the players' process")?;
        let mut stdin = child.stdin.take().context("players' stdin")?;
        let mut stdout = BufReader::new(child.stdout.take().context("players' stdout")?);
        writeln!(stdin, "{}", serde_json::to_string(spec)?)?;
        stdin.flush()?;
        let started = Instant::now();
        match read(&mut stdout)? {
            FromPlayers::Ready => {}
            FromPlayers::Failed(e) => bail!("the players could not connect: {e}"),
            FromPlayers::Report(_) => bail!("the players' process answered out of turn"),
        }
        tracing::debug!("players connected in {:?}", started.elapsed());
        Ok(PlayersProcess {
            child,
            stdin,
            stdout,
        })
    }

    /// Stops receiving and returns what the players saw.
    pub fn finish(mut self) -> Result<PlayersReport> {
        writeln!(self.stdin, "stop")?;
        self.stdin.flush()?;
        let report = match read(&mut self.stdout)? {
            FromPlayers::Report(r) => *r,
            _ => bail!("the players' process answered out of turn"),
        };
        let status = self.child.wait()?;
        if !status.success() {
            bail!("the players' process exited with {status}");
        }
        Ok(report)
    }
}

fn read(r: &mut impl BufRead) -> Result<FromPlayers> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        bail!("the players' process ended without answering");
    }
    serde_json::from_str(&line).context("the players' process's answer")
}
