//! `bench relay`: the relay as a standalone process, and the impairment flags other commands
//! share.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ricochet_testkit::{Impairment, Profile};

use super::{BottleneckConfig, RateSchedule, Relay, RelayConfig};

/// Network-condition flags: a named profile, optionally overridden field by field.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct ImpairmentArgs {
    /// Named condition of the reference report: none, random, burst or sustained.
    #[arg(long, default_value = "none")]
    pub profile: Profile,
    /// Random loss per datagram in percent (overrides the profile's).
    #[arg(long)]
    pub loss_percent: Option<f64>,
    /// One-way delay in milliseconds (overrides the profile's).
    #[arg(long)]
    pub delay_ms: Option<f64>,
    /// Duplicated datagrams in percent (overrides the profile's).
    #[arg(long)]
    pub duplicate_percent: Option<f64>,
    /// Datagrams given an extra delay (reordering) in percent (overrides the profile's).
    #[arg(long)]
    pub reorder_percent: Option<f64>,
    /// The reordered datagrams' extra delay in milliseconds (default: the profile's, or 15 ms).
    #[arg(long)]
    pub reorder_delay_ms: Option<f64>,
}

/// The reference's extra delay of reordered datagrams, used when a profile without reordering
/// gets `--reorder-percent`.
const REFERENCE_REORDER_DELAY: Duration = Duration::from_millis(15);

fn millis(name: &str, ms: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(ms / 1000.0)
        .with_context(|| format!("--{name} must be a non-negative number of milliseconds"))
}

impl ImpairmentArgs {
    /// The impairment of one direction: the profile's, with the given overrides; validated.
    pub fn impairment(&self) -> anyhow::Result<Impairment> {
        let mut imp = self.profile.impairment();
        if let Some(p) = self.loss_percent {
            imp.loss = p / 100.0;
        }
        if let Some(ms) = self.delay_ms {
            imp.delay = millis("delay-ms", ms)?;
        }
        if let Some(p) = self.duplicate_percent {
            imp.duplicate = p / 100.0;
        }
        if let Some(p) = self.reorder_percent {
            imp.reorder = p / 100.0;
            if imp.reorder_delay.is_zero() {
                imp.reorder_delay = REFERENCE_REORDER_DELAY;
            }
        }
        if let Some(ms) = self.reorder_delay_ms {
            imp.reorder_delay = millis("reorder-delay-ms", ms)?;
        }
        imp.validate().context("network condition flags")?;
        Ok(imp)
    }
}

/// Bottleneck flags: a rate limit per direction with a drop-tail queue measured in time.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct BottleneckArgs {
    /// Rate limit of the server-to-client direction, e.g. `1mbit` or `4mbit@0s,1mbit@5s`
    /// (a schedule: offsets from the relay's start).
    #[arg(long)]
    pub down_rate: Option<RateSchedule>,
    /// Rate limit of the client-to-server direction (same syntax).
    #[arg(long)]
    pub up_rate: Option<RateSchedule>,
    /// Length of each bottleneck's drop-tail queue in milliseconds (bytes = rate × time).
    #[arg(long, default_value_t = 100.0)]
    pub buffer_ms: f64,
    /// All routes share one bottleneck per direction (a server's uplink) instead of each
    /// route having its own (each player's downlink).
    #[arg(long)]
    pub shared_bottleneck: bool,
}

impl BottleneckArgs {
    /// The (up, down) bottlenecks the flags ask for.
    pub fn bottlenecks(
        &self,
    ) -> anyhow::Result<(Option<BottleneckConfig>, Option<BottleneckConfig>)> {
        let buffer = millis("buffer-ms", self.buffer_ms)?;
        if buffer.is_zero() {
            bail!("--buffer-ms must be above zero");
        }
        let make = |s: &Option<RateSchedule>| s.clone().map(|s| BottleneckConfig::new(s, buffer));
        Ok((make(&self.up_rate), make(&self.down_rate)))
    }
}

/// `bench relay`: relay UDP between clients and a server with impairments, print a status line
/// every second on stderr and the final counters as JSON on stdout.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct RelayArgs {
    /// The relay's front-door address (clients send here).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// The server to relay to.
    #[arg(long)]
    pub server: SocketAddr,
    /// The network condition, applied to both directions of every route.
    #[command(flatten)]
    pub impairment: ImpairmentArgs,
    /// Rate limits (bottlenecks), before the impairment.
    #[command(flatten)]
    pub bottleneck: BottleneckArgs,
    /// Seed of the impairment streams (one per route and direction).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Nice value of the relay thread (Linux; negative needs CAP_SYS_NICE).
    #[arg(long, allow_negative_numbers = true)]
    pub nice: Option<i32>,
    /// Run this many seconds, then stop (0: until killed).
    #[arg(long, default_value_t = 0.0)]
    pub seconds: f64,
}

/// Runs `bench relay`.
pub fn run(args: &RelayArgs) -> anyhow::Result<()> {
    let imp = args.impairment.impairment()?;
    if !(args.seconds >= 0.0 && args.seconds.is_finite()) {
        bail!("--seconds must be a non-negative number");
    }
    let (up, down) = args.bottleneck.bottlenecks()?;
    let mut cfg = RelayConfig::new(args.server, imp)
        .with_seed(args.seed)
        .with_bottlenecks(up, down, args.bottleneck.shared_bottleneck);
    cfg.listen = args.listen;
    cfg.nice = args.nice;
    let relay = Relay::start(cfg)?;
    eprintln!(
        "relay: {} -> {} (profile {}, seed {})",
        relay.addr(),
        args.server,
        args.impairment.profile,
        args.seed
    );
    let start = Instant::now();
    let limit = (args.seconds > 0.0).then(|| Duration::from_secs_f64(args.seconds));
    loop {
        let elapsed = start.elapsed();
        let left = limit.map(|l| l.saturating_sub(elapsed));
        if left.is_some_and(|l| l.is_zero()) {
            break;
        }
        std::thread::sleep(left.map_or(Duration::from_secs(1), |l| l.min(Duration::from_secs(1))));
        let c = relay.counters();
        eprintln!(
            "{:>7.1}s routes {} up {}/{} down {}/{} (forwarded/offered) loss {:.2}% late p99 {} us errors {} kernel drops {}",
            start.elapsed().as_secs_f64(),
            c.routes.len(),
            c.up.forwarded,
            c.up.offered,
            c.down.forwarded,
            c.down.offered,
            c.realized_loss * 100.0,
            c.lateness.p99_ns / 1000,
            c.errors.recv_errors + c.errors.send_errors + c.errors.route_limit + c.errors.bind_errors,
            c.errors.front_socket_drops + c.errors.upstream_socket_drops,
        );
    }
    let c = relay.shutdown()?;
    println!("{}", serde_json::to_string_pretty(&c)?);
    Ok(())
}
