//! `bench udp`: closed-loop UDP echo runs, side by side in one invocation.

use anyhow::Result;
use clap::Args;

use super::Global;
use crate::host::{HostInfo, UtcTime};
use crate::output::{host_line, median_table, result_file, server_notes, udp_table, write_result};
use crate::schema::{UdpConfig, UdpRun};
use crate::udp::client::ClientIo;
use crate::udp::run::{run_udp, validate};

/// Flags of `bench udp`. List flags (comma-separated) run every combination, one after another,
/// into one result file.
#[derive(Debug, Clone, Args)]
pub struct UdpArgs {
    /// Datagram payload in bytes (at least the 32-byte header).
    #[arg(long, default_value_t = 1024)]
    pub payload: usize,
    /// Client threads, one socket each.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Messages in flight per client (list).
    #[arg(long, value_delimiter = ',', default_value = "16")]
    pub window: Vec<usize>,
    /// Ricochet IO model (list): per-core or shared.
    #[arg(long, value_delimiter = ',', default_value = "per-core", value_parser = ["per-core", "shared"])]
    pub io_model: Vec<String>,
    /// Server threads (0: one per core).
    #[arg(long, default_value_t = 2)]
    pub io_threads: usize,
    /// Ricochet backend (list): auto, uring or mmsg.
    #[arg(long, value_delimiter = ',', default_value = "auto", value_parser = ["auto", "uring", "mmsg"])]
    pub backend: Vec<String>,
    /// Busy work per message in the server's handler, ns.
    #[arg(long, default_value_t = 0)]
    pub work: u64,
    /// Warm-up, seconds.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Measured phase, seconds.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Longest wait for in-flight messages after each phase, seconds.
    #[arg(long, default_value_t = 0.5)]
    pub drain: f64,
    /// Address family of the loopback sockets.
    #[arg(long, default_value = "ipv4", value_parser = ["ipv4", "ipv6"])]
    pub address_family: String,
    /// Ricochet idle strategy (list): spin, park or balanced.
    #[arg(long, value_delimiter = ',', default_value = "balanced", value_parser = ["spin", "park", "balanced"])]
    pub idle: Vec<String>,
    /// Pin Ricochet's per-core workers to cores (list): true, false.
    #[arg(long, value_delimiter = ',', default_value = "true")]
    pub pin_cores: Vec<bool>,
    /// Echo server (list): ricochet or tokio.
    #[arg(long, value_delimiter = ',', default_value = "ricochet", value_parser = ["ricochet", "tokio"])]
    pub server: Vec<String>,
    /// Messages per client per phase (ends a phase early; exact counts for tests).
    #[arg(long)]
    pub messages: Option<u64>,
    /// Receive buffer for every socket, bytes (0: OS default).
    #[arg(long, default_value_t = 4 << 20)]
    pub recv_buffer: usize,
    /// Send buffer for every socket, bytes (0: OS default).
    #[arg(long, default_value_t = 0)]
    pub send_buffer: usize,
    /// Run every configuration this many times, interleaved (A B C A B C …), so slow drift on a
    /// shared machine hits all of them alike; the summary shows the median of the rounds.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Client datagram I/O (list): auto (gso when the window is over 1 and the kernel has
    /// GSO and GRO, else mmsg; the run records the mode chosen), gso (GSO-coalesced sends + GRO receive through the platform's
    /// backend, io_uring where it works; falls back to mmsg, with the reason, where the kernel lacks them), mmsg
    /// (sendmmsg/recvmmsg batches, Linux) or std (one call each). The same clients serve every server kind.
    #[arg(long, value_delimiter = ',', default_value = ClientIo::default_name(), value_parser = ["auto", "gso", "mmsg", "std"])]
    pub client_io: Vec<String>,
}

/// A short table label for a configuration.
pub fn label(cfg: &UdpConfig, with_window: bool, with_client_io: bool) -> String {
    let mut s = match cfg.server.as_str() {
        "tokio" => format!("tokio ×{}", cfg.io_threads),
        _ => format!(
            "ricochet {} ×{} {}",
            cfg.io_model, cfg.io_threads, cfg.backend
        ),
    };
    if cfg.server != "tokio" && cfg.idle != "balanced" {
        s.push_str(&format!(" {}", cfg.idle));
    }
    if cfg.server != "tokio" && cfg.io_model == "per-core" && !cfg.pin_cores {
        s.push_str(" unpinned");
    }
    if with_window {
        s.push_str(&format!(" w{}", cfg.window));
    }
    if with_client_io {
        s.push_str(&format!(" ({} clients)", cfg.client_io));
    }
    s
}

impl UdpArgs {
    /// Every configuration these flags ask for (tokio ignores IO model and backend, so it runs
    /// once per window).
    pub fn configs(&self) -> Vec<UdpConfig> {
        let nonzero = |v: usize| (v > 0).then_some(v);
        let mut out = Vec::new();
        for client_io in &self.client_io {
            for &window in &self.window {
                for server in &self.server {
                    let combos: Vec<(String, String, String, bool)> = if server == "tokio" {
                        vec![("shared".into(), "tokio".into(), "n/a".into(), false)]
                    } else {
                        let mut v = Vec::new();
                        for m in &self.io_model {
                            for b in &self.backend {
                                for i in &self.idle {
                                    // Pinning only applies to per-core workers.
                                    let pins: &[bool] = if m == "per-core" {
                                        &self.pin_cores
                                    } else {
                                        &[false]
                                    };
                                    for &p in pins {
                                        v.push((m.clone(), b.clone(), i.clone(), p));
                                    }
                                }
                            }
                        }
                        v
                    };
                    for (io_model, backend, idle, pin_cores) in combos {
                        out.push(UdpConfig {
                            payload: self.payload,
                            clients: self.clients,
                            window,
                            server: server.clone(),
                            io_model,
                            io_threads: self.io_threads,
                            backend,
                            idle,
                            pin_cores,
                            work_ns: self.work,
                            warmup_s: self.warmup,
                            seconds: self.seconds,
                            drain_s: self.drain,
                            messages: self.messages,
                            address_family: self.address_family.clone(),
                            recv_buffer: nonzero(self.recv_buffer),
                            send_buffer: nonzero(self.send_buffer),
                            client_io: client_io.clone(),
                        });
                    }
                }
            }
        }
        out
    }
}

/// Run each configuration in turn, `rounds` times round-robin.
pub fn run_rounds(configs: &[UdpConfig], rounds: usize) -> Vec<UdpRun> {
    let mut runs = Vec::with_capacity(configs.len() * rounds);
    for round in 0..rounds.max(1) {
        for mut r in run_configs(configs) {
            r.round = round;
            runs.push(r);
        }
    }
    runs
}

/// Run each configuration in turn.
pub fn run_configs(configs: &[UdpConfig]) -> Vec<UdpRun> {
    let Some(first) = configs.first() else {
        return Vec::new();
    };
    let many_windows = configs.iter().any(|c| c.window != first.window);
    let many_io = configs.iter().any(|c| c.client_io != first.client_io);
    let mut runs = Vec::with_capacity(configs.len());
    for cfg in configs {
        let l = label(cfg, many_windows, many_io);
        eprintln!(
            "running {l}: {} B, {} clients × window {}, {} s ...",
            cfg.payload, cfg.clients, cfg.window, cfg.seconds
        );
        runs.push(run_udp(cfg, &l));
    }
    runs
}

/// `bench udp`.
pub fn run(args: &UdpArgs, global: &Global) -> Result<bool> {
    let configs = args.configs();
    for c in &configs {
        validate(c)?;
    }
    let started = UtcTime::now();
    let host = HostInfo::collect();
    let runs = run_rounds(&configs, args.rounds);
    print!("{}", udp_table(&runs));
    if args.rounds > 1 {
        println!();
        print!("{}", median_table(&runs));
    }
    print!("{}", server_notes(&runs));
    println!("{}", host_line(&host));
    let file = result_file("udp", &started, host, runs);
    let ok = file.ok;
    write_result(&file, &global.path_for("udp", &started))?;
    Ok(ok)
}
