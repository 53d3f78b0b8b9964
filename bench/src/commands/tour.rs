//! The default tour (no subcommand): a short UDP echo, Ricochet beside tokio, then a short RUDP
//! echo through the impairment relay (no loss, random loss), in under a minute.

use anyhow::Result;
use clap::Args;

use super::Global;
use crate::host::{HostInfo, UtcTime};
use crate::output::{host_line, result_file, server_notes, udp_table, write_result};
use crate::schema::UdpConfig;
use crate::udp::client::ClientIo;

use super::udp::{label, run_configs};
use crate::rudp::run::config_for;
use crate::rudp::{run_case, FecPolicy};
use crate::schema::RudpCase;
use ricochet_testkit::Profile;

/// The tour's RUDP rows: 4 clients × 16 × 1,024 B through the relay, no loss and `random`,
/// with adaptive FEC where this build has it, else ARQ only (and the table says so).
fn rudp_rows(args: &TourArgs) -> Vec<RudpCase> {
    let policy = if FecPolicy::Adaptive.available().is_ok() {
        FecPolicy::Adaptive
    } else {
        FecPolicy::Off
    };
    println!(
        "\nRUDP echo through the impairment relay, 4 clients × 16 × 1,024 B, {}{}",
        policy.label(),
        if policy == FecPolicy::Off {
            " (FEC is not wired into the protocol in this build)"
        } else {
            ""
        }
    );
    let cases: Vec<RudpCase> = [Profile::None, Profile::Random]
        .into_iter()
        .map(|p| {
            let cfg = config_for(
                p,
                1024,
                4,
                16,
                &args.io_model,
                2,
                "auto",
                policy,
                false,
                args.warmup,
                args.seconds.min(2.0),
                42,
            );
            let l = crate::rudp::label(&cfg);
            eprintln!("running {l} ...");
            run_case(&l, None, &cfg, 1, |_| {})
        })
        .collect();
    print!("{}", super::rudp::rudp_table(&cases));
    cases
}

/// Flags of the default tour.
#[derive(Debug, Clone, Args)]
pub struct TourArgs {
    /// Ricochet IO model for the tour.
    #[arg(long, default_value = "per-core", value_parser = ["per-core", "shared"])]
    pub io_model: String,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Warm-up seconds per run.
    #[arg(long, default_value_t = 0.5)]
    pub warmup: f64,
}

/// The tour's configurations: Ricochet (`io_model`, 2 workers) and tokio (2 threads), 16 clients
/// × window 16 × 1,024 B, 4 MiB receive buffers.
pub fn configs(args: &TourArgs) -> Vec<UdpConfig> {
    let base = UdpConfig {
        payload: 1024,
        clients: 16,
        window: 16,
        server: "ricochet".into(),
        io_model: args.io_model.clone(),
        io_threads: 2,
        backend: "auto".into(),
        idle: "balanced".into(),
        pin_cores: true,
        work_ns: 0,
        warmup_s: args.warmup,
        seconds: args.seconds,
        drain_s: 0.5,
        messages: None,
        address_family: "ipv4".into(),
        recv_buffer: Some(4 << 20),
        send_buffer: None,
        client_io: ClientIo::default_name().into(),
    };
    let tokio = UdpConfig {
        server: "tokio".into(),
        io_model: "shared".into(),
        backend: "tokio".into(),
        idle: "n/a".into(),
        pin_cores: false,
        ..base.clone()
    };
    vec![base, tokio]
}

/// Run the tour.
pub fn run(args: &TourArgs, global: &Global) -> Result<bool> {
    let configs = configs(args);
    let started = UtcTime::now();
    let host = HostInfo::collect();
    println!(
        "Ricochet tour: UDP echo, 16 clients × window 16 × 1,024 B, {} s warm-up + {} s measured per server",
        args.warmup, args.seconds
    );
    let runs = run_configs(&configs);
    println!();
    print!("{}", udp_table(&runs));
    print!("{}", server_notes(&runs));
    if let [r, t] = runs.as_slice() {
        if t.round_trips_per_s > 0.0 {
            println!(
                "{} vs {}: {:.2}× the round trips/s",
                label(&r.config, false, false),
                label(&t.config, false, false),
                r.round_trips_per_s / t.round_trips_per_s
            );
        }
    }
    println!("{}", host_line(&host));
    let cases = rudp_rows(args);
    let mut file = result_file("tour", &started, host, runs);
    file.ok = file.ok && cases.iter().all(|c| c.ok);
    file.rudp_cases = cases;
    let ok = file.ok;
    write_result(
        &file,
        &global.path_for(&format!("tour-{}", args.io_model), &started),
    )?;
    Ok(ok)
}
