//! `bench udp-limits`: the reference's datagram-size × burst matrix, with a loss table.

use anyhow::Result;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use super::Global;
use crate::host::{HostInfo, UtcTime};
use crate::output::{host_line, loss_table, result_file, write_result};
use crate::schema::UdpConfig;
use crate::udp::client::ClientIo;
use crate::udp::run::run_udp;

/// Flags of `bench udp-limits` (defaults: the reference matrix).
#[derive(Debug, Clone, Args)]
pub struct LimitsArgs {
    /// IPv4 payloads, bytes.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1472,8192,16356,16357,16384,65507"
    )]
    pub payloads: Vec<usize>,
    /// IPv6 payloads, bytes (run after the IPv4 ones).
    #[arg(long, value_delimiter = ',', default_value = "65527")]
    pub ipv6_payloads: Vec<usize>,
    /// Skip the IPv6 rows.
    #[arg(long)]
    pub no_ipv6: bool,
    /// Windows (messages in flight per client).
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    pub windows: Vec<usize>,
    /// Repetitions of each cell.
    #[arg(long, default_value_t = 3)]
    pub repetitions: usize,
    /// Client threads.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Server: ricochet or tokio.
    #[arg(long, default_value = "ricochet", value_parser = ["ricochet", "tokio"])]
    pub server: String,
    /// Ricochet IO model.
    #[arg(long, default_value = "shared", value_parser = ["per-core", "shared"])]
    pub io_model: String,
    /// Server threads.
    #[arg(long, default_value_t = 1)]
    pub io_threads: usize,
    /// Ricochet backend.
    #[arg(long, default_value = "auto", value_parser = ["auto", "uring", "mmsg"])]
    pub backend: String,
    /// Warm-up seconds per run.
    #[arg(long, default_value_t = 0.25)]
    pub warmup: f64,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Drain limit per phase, seconds.
    #[arg(long, default_value_t = 0.5)]
    pub drain: f64,
    /// Receive buffer for every socket, bytes (the reference configured 4 MiB; 0: OS default).
    #[arg(long, default_value_t = 4 << 20)]
    pub recv_buffer: usize,
    /// Send buffer for every socket, bytes (0: OS default).
    #[arg(long, default_value_t = 0)]
    pub send_buffer: usize,
    /// Client datagram I/O: auto (gso when the window is over 1 and the kernel supports it, else
    /// mmsg), gso (GSO-coalesced sends + GRO receive), mmsg (sendmmsg/recvmmsg batches, Linux) or
    /// std (one call each).
    #[arg(long, default_value = ClientIo::default_name(), value_parser = ["auto", "gso", "mmsg", "std"])]
    pub client_io: String,
}

impl LimitsArgs {
    /// The matrix, in run order: family, payload, window, repetition.
    pub fn configs(&self) -> Vec<UdpConfig> {
        let nonzero = |v: usize| (v > 0).then_some(v);
        let mut rows: Vec<(&str, usize)> = self.payloads.iter().map(|&p| ("ipv4", p)).collect();
        if !self.no_ipv6 {
            rows.extend(self.ipv6_payloads.iter().map(|&p| ("ipv6", p)));
        }
        let mut out = Vec::new();
        for (family, payload) in rows {
            for &window in &self.windows {
                for _ in 0..self.repetitions {
                    out.push(UdpConfig {
                        payload,
                        clients: self.clients,
                        window,
                        server: self.server.clone(),
                        io_model: self.io_model.clone(),
                        io_threads: self.io_threads,
                        backend: self.backend.clone(),
                        idle: "balanced".into(),
                        pin_cores: true,
                        work_ns: 0,
                        warmup_s: self.warmup,
                        seconds: self.seconds,
                        drain_s: self.drain,
                        messages: None,
                        address_family: family.into(),
                        recv_buffer: nonzero(self.recv_buffer),
                        send_buffer: nonzero(self.send_buffer),
                        client_io: self.client_io.clone(),
                    });
                }
            }
        }
        out
    }
}

/// `bench udp-limits`. Returns true when it ran (failed cells are data, not an error).
pub fn run(args: &LimitsArgs, global: &Global) -> Result<bool> {
    let configs = args.configs();
    let started = UtcTime::now();
    let host = HostInfo::collect();
    let bar = ProgressBar::new(configs.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed_precise} eta {eta} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut runs = Vec::with_capacity(configs.len());
    for cfg in &configs {
        let label = format!("{} {} B w{}", cfg.address_family, cfg.payload, cfg.window);
        bar.set_message(label.clone());
        let r = run_udp(cfg, &label);
        if !r.ok {
            bar.println(format!("{label}: {}", r.errors.join("; ")));
        }
        runs.push(r);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let pass = runs.iter().filter(|r| r.ok).count();
    println!(
        "UDP limits: {} clients, {} {} ×{}, {} s warm-up, {} s measured, {} repetitions: {} pass, {} fail",
        args.clients,
        args.server,
        args.io_model,
        args.io_threads,
        args.warmup,
        args.seconds,
        args.repetitions,
        pass,
        runs.len() - pass
    );
    println!("Measured-phase lost echoes per repetition:");
    print!("{}", loss_table(&runs));
    if let Some(s) = runs.iter().find_map(|r| r.server.as_ref()) {
        if let Some(b) = s.sockets.first() {
            println!(
                "server socket: receive buffer requested {:?} granted {}, send buffer requested {:?} granted {} ({} via {})",
                b.recv_requested, b.recv_granted, b.send_requested, b.send_granted, s.kind, s.backend
            );
        }
    }
    if let Some(b) = runs.iter().find_map(|r| r.client_socket.as_ref()) {
        println!(
            "client sockets: receive buffer requested {:?} granted {}, send buffer requested {:?} granted {}",
            b.recv_requested, b.recv_granted, b.send_requested, b.send_granted
        );
    }
    let lost: u64 = runs
        .iter()
        .map(|r| r.phases.warmup.lost + r.phases.measured.lost + r.phases.drain.lost)
        .sum();
    let drops: u64 = runs
        .iter()
        .filter_map(|r| r.server.as_ref())
        .flat_map(|s| s.sockets.iter().filter_map(|b| b.drops))
        .sum();
    println!("lost echoes in all phases: {lost}; server socket receive-buffer drops (SO_RXQ_OVFL): {drops}");
    let rcvbuf: u64 = runs
        .iter()
        .filter_map(|r| r.kernel.map(|k| k.delta.udp_rcvbuf_errors))
        .sum();
    let reasm: u64 = runs
        .iter()
        .filter_map(|r| r.kernel.map(|k| k.delta.ip_reasm_reqds))
        .sum();
    println!("kernel (system-wide, summed over runs): UDP receive-buffer errors +{rcvbuf}, IPv4 reassembly requests +{reasm}");
    println!("{}", host_line(&host));
    let file = result_file("udp-limits", &started, host, runs);
    write_result(&file, &global.path_for("udp-limits", &started))?;
    Ok(true)
}
