//! `bench`: Ricochet's benchmark binary.
//!
//! `bench` alone runs the tour (a short UDP echo, Ricochet beside tokio); subcommands run the
//! individual benchmarks. Every invocation writes one JSON result file (see `bench/README.md`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod crypto;
mod fec;
mod ffi;

/// Counts heap bytes while `bench gate` weighs a simulated server (off otherwise).
#[global_allocator]
static ALLOC: bench::alloc::CountingAlloc = bench::alloc::CountingAlloc;
mod handshake;
mod ops;

use bench::commands::{
    self, game::GameArgs, gate::GateArgs, matrix::MatrixArgs, report::ReportArgs, rudp::RudpArgs,
    sessions::SessionsArgs, tour::TourArgs, udp::UdpArgs, udp_limits::LimitsArgs, Global,
};

#[derive(Debug, Parser)]
#[command(
    name = "bench",
    version,
    about = "Ricochet's benchmark: UDP echo, limits matrix, JSON results"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    tour: TourArgs,
    #[command(flatten)]
    global: Global,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Closed-loop UDP echo against Ricochet or tokio.
    Udp(UdpArgs),
    /// The reference matrix: payloads × windows × repetitions, loss table.
    UdpLimits(LimitsArgs),
    /// FEC codec encode/recover times per codec and SIMD level.
    Fec(fec::FecArgs),
    /// Sessions admitted per second, by connect token beside insecure mode, in one run.
    Handshake(handshake::HandshakeArgs),
    /// Packet protection: seal/open time per packet size (and the AEAD candidates).
    Crypto(crypto::CryptoArgs),
    /// The same echo from a Rust, a C (C ABI) and a C# (Mono) client against one Rust server,
    /// side by side: round trips per second and each one's ratio to Rust's.
    Ffi(ffi::FfiArgs),
    /// The Rust client process of `bench ffi` (started by the bench itself).
    #[command(name = "ffi-client", hide = true)]
    FfiClient(ffi::ClientArgs),
    /// What running in production costs: metrics on and scraped vs off, a /metrics scrape of a
    /// server with 10,000 sessions beside the echo's p99, the link conditioner off vs compiled
    /// out.
    Ops(ops::OpsArgs),
    /// One echo run of `bench ops`'s conditioner arm (started by the bench itself; one JSON
    /// line on standard output).
    #[command(name = "ops-echo", hide = true)]
    OpsEcho(ops::EchoChildArgs),
    /// A standalone impairment relay (the simulator's model on real sockets and a real clock).
    Relay(bench::relay::RelayArgs),
    /// RUDP complete-message echo through the impairment relay (or --direct).
    Rudp(RudpArgs),
    /// Reference matrices (`bench matrix rudp`).
    Matrix(MatrixArgs),
    /// CI regression gate: exact simulator metrics and same-run wall-clock ratios vs a baseline.
    Gate(GateArgs),
    /// Regenerate PERFORMANCE.md's generated sections and charts from results/ (not results/local/).
    Report(ReportArgs),
    /// The separate client process of `bench rudp --clients-process separate` (started by the
    /// bench itself; talks JSON lines on standard input and output).
    #[command(name = "rudp-clients", hide = true)]
    RudpClients,
    /// N clients connected at once to one server: idle memory per session, handshakes per
    /// second, a window-1 echo over all of them from one thread.
    Sessions(SessionsArgs),
    /// N players on a 60 Hz game server: snapshot latency, losses, tick cadence, server CPU.
    Game(GameArgs),
    /// Players behind the relay's bottleneck: event latency, snapshot age, relay queue delay
    /// (issue 38's scenarios).
    Lanes(bench::lanes::LanesArgs),
    /// 64 KiB unreliable messages through the relay's random loss, FEC off, fixed and
    /// adaptive: messages delivered whole and the wire overhead (issue 38).
    LargeMessages(bench::large_messages::LargeMessagesArgs),
    /// The players' process of `bench lanes` (started by the bench itself; talks JSON lines
    /// on standard input and output).
    #[command(name = "lanes-players", hide = true)]
    LanesPlayers,
    /// The server process of `bench sessions` and `bench game` (started by the bench itself;
    /// talks JSON lines on standard input and output).
    #[command(name = "scale-server", hide = true)]
    ScaleServer,
    /// The load generator's process of `bench sessions` and `bench game` (started by the bench
    /// itself; one JSON job line in, one JSON result line out).
    #[command(name = "scale-load", hide = true)]
    ScaleLoad,
}

fn main() -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let cli = Cli::parse();
    raise_open_file_limit();
    let result = match &cli.command {
        None => commands::tour::run(&cli.tour, &cli.global),
        Some(Command::Udp(a)) => commands::udp::run(a, &cli.global),
        Some(Command::UdpLimits(a)) => commands::udp_limits::run(a, &cli.global),
        Some(Command::Relay(a)) => bench::relay::run(a).map(|()| true),
        Some(Command::Fec(a)) => fec::run(a, &cli.global).map(|()| true),
        Some(Command::Handshake(a)) => handshake::run(a, &cli.global).map(|()| true),
        Some(Command::Crypto(a)) => crypto::run(a, &cli.global).map(|()| true),
        Some(Command::Ops(a)) => ops::run(a, &cli.global),
        Some(Command::OpsEcho(a)) => ops::echo_child_main(a),
        Some(Command::Ffi(a)) => ffi::run(a, &cli.global),
        Some(Command::FfiClient(a)) => ffi::client_process(a),
        Some(Command::Rudp(a)) => commands::rudp::run(a, &cli.global),
        Some(Command::Matrix(a)) => commands::matrix::run(a, &cli.global),
        Some(Command::Gate(a)) => commands::gate::run(a, &cli.global),
        Some(Command::Report(a)) => commands::report::run(a, &cli.global),
        Some(Command::Sessions(a)) => commands::sessions::run(a, &cli.global),
        Some(Command::Game(a)) => commands::game::run(a, &cli.global),
        Some(Command::Lanes(a)) => bench::lanes::run(a, &cli.global),
        Some(Command::LargeMessages(a)) => bench::large_messages::run(a, &cli.global),
        Some(Command::LanesPlayers) => bench::lanes::players::serve_process(
            std::io::BufReader::new(std::io::stdin()),
            std::io::stdout(),
        )
        .map(|()| true),
        Some(Command::ScaleServer) => {
            bench::scale::serve_process(std::io::stdin().lock(), std::io::stdout()).map(|()| true)
        }
        Some(Command::ScaleLoad) => {
            bench::scale::load_process::serve_process(std::io::stdin().lock(), std::io::stdout())
                .map(|()| true)
        }
        Some(Command::RudpClients) => {
            bench::rudp::fleet::serve_clients_process(std::io::stdin().lock(), std::io::stdout())
                .map(|()| true)
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("bench: some measurements were not ok (see the table and the JSON)");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("bench: {}", bench::error_chain(e.as_ref()));
            ExitCode::from(2)
        }
    }
}

/// Lift this process's open-file limit to its hard limit, as a server would: `bench sessions`
/// holds a socket per client (10,000 by default), and many systems start processes at a soft
/// limit of 1,024. The server and client processes the bench starts inherit it. If the hard
/// limit is still too low, the client that cannot get a socket says which limit to raise.
fn raise_open_file_limit() {
    #[cfg(unix)]
    {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given, a valid local.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0
            || lim.rlim_cur >= lim.rlim_max
        {
            return;
        }
        // macOS refuses more than its per-process maximum (often below an unlimited hard
        // limit); 1 << 20 is what Linux allows by default.
        for want in [
            lim.rlim_max,
            lim.rlim_max.min(1 << 20),
            lim.rlim_max.min(10_240),
        ] {
            let raised = libc::rlimit {
                rlim_cur: want,
                rlim_max: lim.rlim_max,
            };
            // SAFETY: setrlimit only reads the struct it is given, a valid local.
            if want > lim.rlim_cur && unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0
            {
                tracing::debug!("open-file limit raised from {} to {want}", lim.rlim_cur);
                return;
            }
        }
    }
}
