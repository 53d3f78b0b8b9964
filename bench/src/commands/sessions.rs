//! `bench sessions`: N clients connected at once to one server (see [`crate::scale::sessions`]).

use std::fmt::Write as _;

use anyhow::{bail, Result};
use clap::Args;

use super::Global;
use crate::host::{HostInfo, UtcTime};
use crate::output::{host_line, render_table, result_file, thousands, write_result};
use crate::scale::load_process::run_sessions as run_one;
use crate::scale::sessions::{summary_cells, MAX_WINDOW, SUMMARY_COLUMNS};
use crate::schema::{SessionsConfig, SessionsRun};

/// Flags of `bench sessions`.
#[derive(Debug, Clone, Args)]
pub struct SessionsArgs {
    /// Client counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "100,1000,10000")]
    pub clients: Vec<usize>,
    /// idle: connect, let the sessions sit, weigh the server. echo: that, then a window-1 echo
    /// on every client. churn: for `--seconds`, batches of N fresh clients each connect (a
    /// new token each), send one message, get its echo and close; handshakes/s is then whole
    /// sessions (connect, first message, close) per second. Each batch comes from fresh
    /// addresses (a fleet of players reconnecting), so the server's per-address handshake
    /// limit (4,096 per second per worker by default) does not cap it.
    #[arg(long, default_value = "echo", value_parser = ["idle", "echo", "churn"])]
    pub mode: String,
    /// Clients per loopback address (127.0.0.1, 127.0.0.2, ... on Linux).
    #[arg(long, default_value_t = 1000)]
    pub clients_per_ip: usize,
    /// Server workers.
    #[arg(long, default_value_t = 2)]
    pub io_threads: usize,
    /// Server workers' idle strategy: balanced, park or spin.
    #[arg(long, default_value = "balanced", value_parser = ["balanced", "park", "spin"])]
    pub server_idle: String,
    /// Server workers' core pinning: auto (pinned only when the machine has more cores than
    /// workers), always or never.
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    pub server_pinning: String,
    /// Scheduler time slice the server workers ask for, in µs (Linux 6.12+); 0 asks for none
    /// (the scheduler's default slice). Default: the runtime's.
    #[arg(long)]
    pub server_slice_us: Option<u64>,
    /// Datagram backend of server and clients (clients in a set use mmsg for auto).
    #[arg(long, default_value = "auto", value_parser = ["auto", "uring", "mmsg"])]
    pub backend: String,
    /// Protocol profile of both sides.
    #[arg(long, default_value = "default", value_parser = ["default", "game", "bulk"])]
    pub profile: String,
    /// secure: connect tokens and every packet protected (the production path); insecure: no
    /// token, no protection (LAN play).
    #[arg(long, default_value = "secure", value_parser = ["secure", "insecure"])]
    pub security: String,
    /// Echo message size, bytes.
    #[arg(long, default_value_t = 64)]
    pub payload: usize,
    /// Echo messages in flight per client (1 to 64): 1 is a player's request and answer;
    /// 16 × 1,024 B with 4 clients is the shape of `bench rudp --direct`.
    #[arg(long, default_value_t = 1)]
    pub window: usize,
    /// Idle seconds after connecting, before the server is weighed.
    #[arg(long, default_value_t = 2.0)]
    pub settle: f64,
    /// Echo warm-up seconds.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Echo measured seconds.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Runs per client count (a fresh server each); the table shows the median.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// What carries the traffic, comma-separated; with both, each round runs one after the
    /// other. ricochet: the library. kernel (Linux): the kernel floor, the same sockets and
    /// traffic with no protocol (plain UDP sockets on one epoll thread making a recv and a
    /// send per round trip, a plain recvmmsg/sendmmsg echo server with the same workers;
    /// a churn session sends 4 datagrams and waits for 3 answers, as Ricochet's handshake,
    /// message and close do): at window 1, what this machine allows a client of that shape;
    /// with a larger window, a plain-sockets baseline that batched sends can pass.
    #[arg(long, value_delimiter = ',', default_value = "ricochet", value_parser = ["ricochet", "kernel"])]
    pub stack: Vec<String>,
    /// Threads of the load generator in the echo and the churn: the clients are split into
    /// this many contiguous shards, a client set (or, for the kernel floor, an epoll set) per
    /// thread; churn shards run their batches side by side. A run whose busiest load thread
    /// was busy over 90 % of the time is marked saturated (`load sat.`): it measured the
    /// client too. Idle runs on one thread.
    #[arg(long, default_value_t = 1)]
    pub load_threads: usize,
}

/// The table: one row per client count, medians over its rounds.
pub fn sessions_table(runs: &[SessionsRun]) -> String {
    let mut header = vec!["clients", "mode", "stack", "idle"];
    header.extend(SUMMARY_COLUMNS);
    let mut keys: Vec<(usize, String, String, String)> = Vec::new();
    for r in runs {
        let k = (
            r.config.clients,
            r.config.mode_label(),
            stack_name(&r.config).to_string(),
            r.config.server_idle.clone(),
        );
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let rows: Vec<Vec<String>> = keys
        .iter()
        .map(|(n, mode, stack, idle)| {
            let rs: Vec<&SessionsRun> = runs
                .iter()
                .filter(|r| {
                    r.config.clients == *n
                        && &r.config.mode_label() == mode
                        && stack_name(&r.config) == stack
                        && &r.config.server_idle == idle
                })
                .collect();
            let mut row = vec![
                thousands(*n as u64),
                mode.clone(),
                stack.clone(),
                idle.clone(),
            ];
            row.extend(summary_cells(&rs));
            row
        })
        .collect();
    let mut out = render_table(&header, &rows);
    for r in runs.iter().filter(|r| !r.ok) {
        for e in &r.errors {
            let _ = writeln!(out, "  {} clients: {e}", r.config.clients);
        }
    }
    out
}

/// The table's name for what carried a run's traffic.
fn stack_name(c: &SessionsConfig) -> &'static str {
    if c.is_floor() {
        "kernel"
    } else {
        "ricochet"
    }
}

/// `bench sessions`.
pub fn run(args: &SessionsArgs, global: &Global) -> Result<bool> {
    if args.clients.is_empty() || args.rounds == 0 || args.stack.is_empty() {
        bail!("--clients, --rounds and --stack need at least one");
    }
    if !(1..=MAX_WINDOW).contains(&args.window) {
        bail!("--window must be 1 to {MAX_WINDOW}, not {}", args.window);
    }
    if args.window > 1 && args.mode != "echo" {
        bail!("--window applies to echo: idle and churn sessions keep no messages in flight");
    }
    if args.mode == "idle" && args.stack.iter().any(|s| s == "kernel") {
        bail!("--stack kernel measures echo and churn: the floor holds no sessions to weigh");
    }
    if !cfg!(target_os = "linux") && args.stack.iter().any(|s| s == "kernel") {
        bail!("--stack kernel is Linux only (recvmmsg, sendmmsg, epoll)");
    }
    let started = UtcTime::now();
    let host = HostInfo::collect();
    eprintln!("{}", host_line(&host));
    let mut runs = Vec::new();
    for &n in &args.clients {
        for (round, stack) in
            (0..args.rounds).flat_map(|round| args.stack.iter().map(move |s| (round, s)))
        {
            let cfg = SessionsConfig {
                clients: n,
                mode: args.mode.clone(),
                clients_per_ip: args.clients_per_ip,
                io_threads: args.io_threads,
                server_idle: args.server_idle.clone(),
                server_pinning: Some(args.server_pinning.clone()),
                server_slice_us: args.server_slice_us,
                backend: args.backend.clone(),
                profile: args.profile.clone(),
                security: args.security.clone(),
                payload: args.payload.max(16),
                window: args.window,
                settle_s: args.settle,
                warmup_s: args.warmup,
                seconds: args.seconds,
                stack: (stack != "ricochet").then(|| stack.clone()),
                load_threads: args.load_threads.max(1),
            };
            let r = run_one(&cfg)?;
            eprintln!(
                "  {n} clients, {}, round {}: connected {} in {:.2} s ({} handshakes/s), RSS {} B/session{}{}",
                stack_name(&cfg),
                round + 1,
                r.connected,
                r.connect_s,
                thousands(r.handshakes_per_s.round() as u64),
                r.server_rss_per_session_bytes.map_or("-".into(), |v| format!("{v:.0}")),
                if cfg.mode == "echo" {
                    format!(", {} rt/s, p99 {:.2} ms", thousands(r.round_trips_per_s.round() as u64), r.rtt_us.map_or(0.0, |l| l.p99 / 1000.0))
                } else {
                    String::new()
                },
                if r.ok { "" } else { " (NOT ok)" }
            );
            runs.push(r);
        }
    }
    print!("{}", sessions_table(&runs));
    let mut file = result_file("sessions", &started, host, Vec::new());
    file.ok = runs.iter().all(|r| r.ok);
    file.sessions_runs = runs;
    let ok = file.ok;
    write_result(&file, &global.path_for("sessions", &started))?;
    Ok(ok)
}
