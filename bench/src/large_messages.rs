//! `bench large-messages`: large unreliable messages through the relay's random loss (issue
//! 38). A client sends 64 KiB messages (64 fragments) on an unreliable channel to a server
//! through the impairment relay, one every `--interval-ms`, with FEC off, fixed and adaptive
//! (the game profile otherwise), the arms alternated per round. Reported per arm: the share of
//! messages the server received whole (every byte checked; a wrong one is counted apart and
//! fails the run) and the wire overhead, the client's UDP payload bytes over the message bytes.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use ricochet::proto::fec::FecPolicy;
use ricochet::runtime::{Handler, Server, ServerConfig, ServerContext, SessionId};
use ricochet::{Client, ClientConfig, ClientEvent, Profile};
use ricochet_testkit::Impairment;
use serde::Serialize;

use crate::commands::Global;
use crate::host::{command_line, HostInfo, UtcTime};
use crate::output::render_table;
use crate::relay::{Relay, RelayConfig};

/// The unreliable channel of every profile's channel list.
const CHANNEL: u8 = 2;

/// `bench large-messages` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct LargeMessagesArgs {
    /// Message size, bytes.
    #[arg(long, default_value_t = 64 << 10)]
    pub message_bytes: usize,
    /// Messages per arm and round.
    #[arg(long, default_value_t = 100)]
    pub messages: u32,
    /// Time between two messages, ms.
    #[arg(long, default_value_t = 100)]
    pub interval_ms: u64,
    /// Random loss of the relay, percent, each direction.
    #[arg(long, default_value_t = 5.0)]
    pub loss_percent: f64,
    /// One-way delay of the relay, ms, each direction.
    #[arg(long, default_value_t = 10.0)]
    pub delay_ms: f64,
    /// FEC arms, alternated per round (`off`, `fixed`: 2 repairs per 12 sources, `adaptive`).
    #[arg(long, value_delimiter = ',', default_value = "off,fixed,adaptive")]
    pub fec: Vec<String>,
    /// Rounds (seeds seed, seed + 1, ...); the arms' order alternates between rounds.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Seed of the first round (relay streams, endpoints).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

fn policy(name: &str) -> Result<FecPolicy> {
    Ok(match name {
        "off" => FecPolicy::Off,
        "fixed" => FecPolicy::Fixed { parity: 2 },
        "adaptive" => FecPolicy::Adaptive { max_parity: 4 },
        other => bail!("unknown FEC arm {other:?} (off, fixed, adaptive)"),
    })
}

/// Message `id` of `len` bytes: its id in the first 4 bytes, then bytes derived from it.
fn message(id: u32, len: usize) -> Vec<u8> {
    let mut m = id.to_le_bytes().to_vec();
    m.extend((4..len).map(|j| (id as usize * 131 + j * 7 + (j >> 8)) as u8));
    m.truncate(len);
    m
}

#[derive(Default)]
struct Tally {
    seen: Vec<bool>,
    whole: u32,
    wrong: u32,
}

struct Receiver {
    tally: Arc<Mutex<Tally>>,
    len: usize,
}

impl Handler for Receiver {
    fn on_message(&mut self, _: &mut ServerContext<'_>, _: SessionId, channel: u8, data: Bytes) {
        if channel != CHANNEL {
            return;
        }
        let Ok(mut t) = self.tally.lock() else {
            return;
        };
        let id = data
            .get(..4)
            .map_or(u32::MAX, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        if data.len() != self.len || data[..] != message(id, self.len)[..] {
            t.wrong += 1;
            return;
        }
        let i = id as usize;
        if t.seen.len() <= i {
            t.seen.resize(i + 1, false);
        }
        if !std::mem::replace(&mut t.seen[i], true) {
            t.whole += 1;
        } else {
            t.wrong += 1;
        }
    }
}

/// One arm of one round.
#[derive(Debug, Clone, Serialize)]
pub struct ArmRun {
    /// `off`, `fixed` or `adaptive`.
    pub fec: String,
    /// Seed of the round.
    pub seed: u64,
    /// Messages sent.
    pub messages: u32,
    /// Messages the server received whole.
    pub delivered_whole: u32,
    /// `delivered_whole` / `messages`, percent.
    pub delivered_whole_pct: f64,
    /// Messages delivered wrong or twice (0 unless broken).
    pub delivered_wrong: u32,
    /// The client's UDP payload bytes sent while the messages went out (and the drain).
    pub wire_bytes: u64,
    /// Message bytes sent.
    pub payload_bytes: u64,
    /// `wire_bytes` / `payload_bytes`.
    pub wire_per_payload: f64,
    /// Packets the client sent.
    pub packets_sent: u64,
    /// Messages the client dropped before sending them whole (`SessionStats::unreliable_unsent`:
    /// a queue or lane cap, a deadline, a newer message): their bytes count in `payload_bytes`
    /// but never went onto the wire.
    pub unsent: u64,
    /// Message bytes still queued in the client, not yet sent once, when the run ended (a
    /// sender whose congestion control carries less than the messages ask falls behind).
    pub queued_at_end_bytes: usize,
    /// Loss the relay applied, up and down together.
    pub relay_realized_loss: f64,
}

#[derive(Serialize)]
struct LargeMessagesFile<'a> {
    kind: &'static str,
    at: String,
    command: String,
    host: HostInfo,
    message_bytes: usize,
    messages: u32,
    interval_ms: u64,
    loss_percent: f64,
    delay_ms: f64,
    runs: &'a [ArmRun],
}

fn run_arm(args: &LargeMessagesArgs, fec: &str, seed: u64) -> Result<ArmRun> {
    let pol = policy(fec)?;
    let tally = Arc::new(Mutex::new(Tally::default()));
    let len = args.message_bytes.max(4);
    let t = tally.clone();
    let cfg = ServerConfig::new("127.0.0.1:0".parse::<SocketAddr>()?)
        .insecure()
        .profile(Profile::Game)
        .workers(1)
        .seed(seed)
        .session(|c| c.fec.policy = pol);
    let server = Server::start(cfg, move |_| Receiver {
        tally: t.clone(),
        len,
    })
    .map_err(|e| anyhow!("starting the server: {e}"))?;
    let imp = Impairment::none()
        .with_loss(args.loss_percent / 100.0)
        .with_delay(Duration::from_secs_f64(args.delay_ms / 1e3));
    let relay = Relay::start(
        RelayConfig::new(server.local_addr(), imp)
            .with_seed(seed)
            .with_clients(1),
    )?;
    let ccfg = ClientConfig::new()
        .profile(Profile::Game)
        .session(|c| c.fec.policy = pol)
        .seed(seed)
        .connect_timeout(Duration::from_secs(10));
    let mut client = Client::connect_insecure_blocking(relay.addr(), ccfg)
        .map_err(|e| anyhow!("connecting through the relay: {e}"))?;
    let before = client.stats().context("client stats")?;
    let interval = Duration::from_millis(args.interval_ms);
    let mut next = Instant::now();
    let pump = |client: &mut Client, until: Instant| -> Result<()> {
        loop {
            let now = Instant::now();
            if now >= until {
                return Ok(());
            }
            for ev in client.wait(until - now)? {
                if let ClientEvent::Disconnected { reason, .. } = ev {
                    bail!("session closed: {reason:?}");
                }
            }
        }
    };
    for i in 0..args.messages {
        client.send(CHANNEL, message(i, len))?;
        next += interval;
        pump(&mut client, next)?;
    }
    pump(&mut client, Instant::now() + Duration::from_secs(1))?;
    let after = client.stats().context("client stats")?;
    let queued_at_end_bytes = client.queued_bytes();
    client.close();
    let _ = pump(&mut client, Instant::now() + Duration::from_millis(100));
    let counters = relay.shutdown()?;
    drop(server.shutdown());
    let t = tally.lock().map_err(|_| anyhow!("tally poisoned"))?;
    let payload = u64::from(args.messages) * len as u64;
    let wire = after.bytes_sent - before.bytes_sent;
    Ok(ArmRun {
        fec: fec.into(),
        seed,
        messages: args.messages,
        delivered_whole: t.whole,
        delivered_whole_pct: 100.0 * f64::from(t.whole) / f64::from(args.messages.max(1)),
        delivered_wrong: t.wrong,
        wire_bytes: wire,
        payload_bytes: payload,
        wire_per_payload: wire as f64 / payload.max(1) as f64,
        packets_sent: after.packets_sent - before.packets_sent,
        unsent: after.unreliable_unsent - before.unreliable_unsent,
        queued_at_end_bytes,
        relay_realized_loss: counters.realized_loss,
    })
}

/// Runs `bench large-messages`.
pub fn run(args: &LargeMessagesArgs, global: &Global) -> Result<bool> {
    let at = UtcTime::now();
    let arms: Vec<String> = args.fec.clone();
    for a in &arms {
        policy(a)?;
    }
    if arms.is_empty() {
        bail!("--fec needs at least one arm");
    }
    let mut runs = Vec::new();
    for round in 0..args.rounds.max(1) {
        let mut order = arms.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        for a in &order {
            let seed = args.seed + round as u64;
            let r = run_arm(args, a, seed).with_context(|| format!("arm {a} round {round}"))?;
            println!(
                "{:<9} seed {seed}: {} of {} whole ({:.1} %), wire/payload {:.3}, {} dropped unsent, {} B queued at the end",
                r.fec,
                r.delivered_whole,
                r.messages,
                r.delivered_whole_pct,
                r.wire_per_payload,
                r.unsent,
                r.queued_at_end_bytes
            );
            runs.push(r);
        }
    }
    let header = [
        "fec",
        "messages",
        "delivered whole",
        "whole %",
        "wire / payload",
        "wire overhead %",
        "relay loss %",
        "wrong",
    ];
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                r.fec.clone(),
                r.messages.to_string(),
                r.delivered_whole.to_string(),
                format!("{:.1}", r.delivered_whole_pct),
                format!("{:.3}", r.wire_per_payload),
                format!("{:.1}", (r.wire_per_payload - 1.0) * 100.0),
                format!("{:.2}", r.relay_realized_loss * 100.0),
                r.delivered_wrong.to_string(),
            ]
        })
        .collect();
    println!(
        "{} B unreliable messages every {} ms through the relay, {} % random loss and {} ms each way:",
        args.message_bytes, args.interval_ms, args.loss_percent, args.delay_ms
    );
    print!("{}", render_table(&header, &rows));
    let file = LargeMessagesFile {
        kind: "large-messages",
        at: at.iso(),
        command: command_line(),
        host: HostInfo::collect(),
        message_bytes: args.message_bytes,
        messages: args.messages,
        interval_ms: args.interval_ms,
        loss_percent: args.loss_percent,
        delay_ms: args.delay_ms,
        runs: &runs,
    };
    let path = global.path_for("large-messages", &at);
    crate::output::write_json(&file, &path)?;
    println!("results: {}", path.display());
    Ok(runs.iter().all(|r| r.delivered_wrong == 0))
}
