//! One deterministic simulated echo run ([`ricochet_testkit::echo`]) with its loss-recovery
//! counters, for diagnosing the protocol without a real network.
//!
//! ```sh
//! cargo run --release --example sim_echo -- random                 # gate shape, ARQ only
//! cargo run --release --example sim_echo -- burst --fec            # adaptive FEC
//! cargo run --release --example sim_echo -- random --window 1 --payload 4096 --game
//! ```
//!
//! Flags: `--fec` (adaptive, max parity 4), `--game` (`Config::game()` instead of
//! `Config::default()`), `--no-cc` (congestion control off), `--insecure` (no packet
//! protection),
//! `--redundant` / `--no-redundant` (retransmit every fragment twice, or not), `--clients N`, `--window N`, `--payload BYTES`, `--seconds S`,
//! `--seed N`, and overrides of the connection config: `--packet-threshold N`,
//! `--ack-frequency N`, `--ack-delay-ms MS`, and of its FEC settings: `--group-wait-ms MS`,
//! `--data-shards N`, `--max-parity N`, `--parity-cap PERCENT`, `--scheme block|sliding`,
//! and of the sliding code: `--sliding-window N`, `--sliding-span N`, `--tail-wait-ms MS`,
//! `--max-age-ms MS`, `--tail-repairs N`, `--tail-residual P`, `--tail-skip-residual P`.

use std::str::FromStr;
use std::time::Duration;

use ricochet_proto::fec::{FecPolicy, FecScheme};
use ricochet_proto::Config;
use ricochet_testkit::echo::EchoScenario;
use ricochet_testkit::Profile;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut profile = Profile::Random;
    let mut fec = false;
    let mut game = false;
    let mut clients = 4;
    let mut window = 16;
    let mut payload = 1024;
    let mut seconds = 10.0;
    let mut seed = 1;
    let mut packet_threshold = None;
    let mut ack_frequency = None;
    let mut ack_delay_ms: Option<f64> = None;
    let mut group_wait_ms: Option<f64> = None;
    let mut data_shards = None;
    let mut max_parity = 4;
    let mut parity_cap = None;
    let mut no_cc = false;
    let mut scheme = None;
    let mut window_sources = None;
    let mut span = None;
    let mut tail_ms: Option<f64> = None;
    let mut max_age_ms: Option<f64> = None;
    let mut tail_repairs = None;
    let mut redundant = None;
    let mut tail_residual = None;
    let mut tail_skip = None;
    let mut insecure = false;
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--fec" => fec = true,
            "--insecure" => insecure = true,
            "--game" => game = true,
            "--no-cc" => no_cc = true,
            "--redundant" => redundant = Some(true),
            "--no-redundant" => redundant = Some(false),
            "--clients" => clients = value("--clients")?.parse()?,
            "--window" => window = value("--window")?.parse()?,
            "--payload" => payload = value("--payload")?.parse()?,
            "--seconds" => seconds = value("--seconds")?.parse()?,
            "--seed" => seed = value("--seed")?.parse()?,
            "--packet-threshold" => packet_threshold = Some(value("--packet-threshold")?.parse()?),
            "--ack-frequency" => ack_frequency = Some(value("--ack-frequency")?.parse()?),
            "--group-wait-ms" => group_wait_ms = Some(value("--group-wait-ms")?.parse()?),
            "--data-shards" => data_shards = Some(value("--data-shards")?.parse()?),
            "--parity-cap" => parity_cap = Some(value("--parity-cap")?.parse()?),
            "--max-parity" => max_parity = value("--max-parity")?.parse()?,
            "--scheme" => {
                scheme = Some(match value("--scheme")?.as_str() {
                    "block" => FecScheme::Block,
                    "sliding" => FecScheme::Sliding,
                    other => return Err(format!("unknown scheme {other}").into()),
                })
            }
            "--sliding-window" => window_sources = Some(value("--sliding-window")?.parse()?),
            "--sliding-span" => span = Some(value("--sliding-span")?.parse()?),
            "--tail-wait-ms" => tail_ms = Some(value("--tail-wait-ms")?.parse()?),
            "--tail-repairs" => tail_repairs = Some(value("--tail-repairs")?.parse()?),
            "--tail-residual" => tail_residual = Some(value("--tail-residual")?.parse()?),
            "--tail-skip-residual" => tail_skip = Some(value("--tail-skip-residual")?.parse()?),
            "--max-age-ms" => max_age_ms = Some(value("--max-age-ms")?.parse()?),
            "--ack-delay-ms" => ack_delay_ms = Some(value("--ack-delay-ms")?.parse()?),
            other => profile = Profile::from_str(other)?,
        }
    }
    let mut config = if game {
        Config::game()
    } else {
        Config::default()
    };
    if let Some(n) = packet_threshold {
        config.packet_threshold = n;
    }
    if let Some(n) = ack_frequency {
        config.ack_frequency = n;
    }
    if let Some(ms) = ack_delay_ms {
        config.max_ack_delay = Duration::from_secs_f64(ms / 1000.0);
    }
    if let Some(ms) = group_wait_ms {
        config.fec.group_wait = Duration::from_secs_f64(ms / 1000.0);
    }
    config.congestion_control = !no_cc;
    if let Some(r) = redundant {
        config.redundant_retransmit = r;
    }
    if let Some(n) = parity_cap {
        config.fec.parity_cap_percent = n;
    }
    if let Some(s) = scheme {
        config.fec.scheme = s;
    }
    if let Some(n) = window_sources {
        config.fec.sliding.window = n;
    }
    if let Some(n) = tail_repairs {
        config.fec.sliding.tail_repairs = n;
    }
    if let Some(n) = span {
        config.fec.sliding.span = n;
    }
    if let Some(ms) = tail_ms {
        config.fec.sliding.tail_wait = Duration::from_secs_f64(ms / 1000.0);
    }
    if let Some(ms) = max_age_ms {
        config.fec.sliding.max_age = Duration::from_secs_f64(ms / 1000.0);
    }
    if let Some(x) = tail_residual {
        config.fec.sliding.tail_residual = x;
    }
    if let Some(x) = tail_skip {
        config.fec.sliding.tail_skip_residual = x;
    }
    if let Some(n) = data_shards {
        config.fec.max_data_shards = n;
    }
    config.fec.policy = if fec {
        FecPolicy::Adaptive { max_parity }
    } else {
        FecPolicy::Off
    };
    let r = EchoScenario {
        clients,
        window,
        payload,
        seconds: Duration::from_secs_f64(seconds),
        config,
        secure: !insecure,
        ..EchoScenario::new(profile, seed)
    }
    .run()?;
    println!(
        "{profile}{} {}x{}x{} B: {:.1} rt/s  p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms  overhead {:.1} %",
        if fec { "+fec" } else { "" },
        clients,
        window,
        payload,
        r.round_trips_per_s,
        r.rtt_p50_us as f64 / 1000.0,
        r.rtt_p99_us as f64 / 1000.0,
        r.rtt_max_us as f64 / 1000.0,
        r.wire_overhead_percent,
    );
    println!(
        "  retx/1k {:.1}  lost {}  spurious {}  tlp {}  rto {}  fec recovered/1k {:.1}  realized loss {:.2} %",
        r.retransmitted_per_1000,
        r.packets_lost,
        r.packets_spurious_lost,
        r.tail_loss_probes,
        r.rto_count,
        r.fec_recovered_per_1000.unwrap_or(0.0),
        r.realized_loss * 100.0,
    );
    if let (Some(g), Some(d), Some(p)) = (r.fec_groups, r.fec_data_shards, r.fec_parity_shards) {
        println!(
            "  fec groups {g}  data shards/group {:.2}  parity/group {:.2}  unrecoverable {}",
            d as f64 / g.max(1) as f64,
            p as f64 / g.max(1) as f64,
            r.fec_unrecoverable.unwrap_or(0),
        );
        println!(
            "  fec data bytes {}  parity bytes {}  tail repairs {}  tails skipped {}  parity of no use {}  wire datagrams {} bytes {}",
            r.fec_data_bytes.unwrap_or(0),
            r.fec_parity_bytes.unwrap_or(0),
            r.fec_tail_repairs.unwrap_or(0),
            r.fec_tails_skipped.unwrap_or(0),
            r.fec_parity_ignored.unwrap_or(0),
            r.wire_datagrams,
            r.wire_bytes,
        );
    }
    if !r.is_ok() {
        println!("  problems: {:?}", r.problems());
    }
    Ok(())
}
