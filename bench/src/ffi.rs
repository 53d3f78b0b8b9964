//! `bench ffi`: the same closed-loop echo from a Rust client, a C client (through the C ABI)
//! and a C# client (the binding, under Mono), side by side in one run against one Rust server.
//!
//! Each client kind runs as its own process with the same command line and the same loop
//! (`engine/ffi/examples/c/echo_client.c`, `engine/ffi/bindings/csharp/tests/EchoClient.cs`,
//! and `bench ffi-client` for Rust): N clients, a thread each, keep W messages of S bytes in
//! flight on the reliable-ordered channel, check every echoed byte and the order, and count
//! the round trips completed in `--seconds`. Each process issues its clients' connect tokens
//! (the C and C# ones through the library's token issuer). The kinds alternate within every
//! round, and the table gives the median per kind and its ratio to Rust's.
//!
//! The C library is built in release (`cargo build --release -p ricochet-ffi`), the C client
//! with `cc -O2`, the C# client with `mcs -optimize+`; a kind whose tools are missing is
//! reported as not run.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bench::commands::Global;
use bench::host::{command_line, BuildInfo, HostInfo, UtcTime};
use bytes::Bytes;
use ricochet::TokenIssuer;
use ricochet::{
    Client, ClientConfig, ClientEvent, Handler, Server, ServerConfig, ServerContext, SessionId,
    TokenKey,
};
use serde::Serialize;

/// The key and protocol id of the run's tokens.
const KEY: [u8; 32] = [0x42; 32];
const PROTOCOL_ID: u64 = 0x6666_6931;

/// Options of `bench ffi`.
#[derive(clap::Args, Debug, Clone)]
pub struct FfiArgs {
    /// Clients per kind (a thread each).
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Messages in flight per client.
    #[arg(long, default_value_t = 16)]
    pub window: usize,
    /// Message size, bytes.
    #[arg(long, default_value_t = 1024)]
    pub payload: usize,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Rounds; each runs every kind once, in turn.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Server workers.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Client kinds, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "rust,c,csharp")]
    pub kinds: Vec<String>,
}

/// Options of the Rust client process (`bench ffi-client`): the C client's command line.
#[derive(clap::Args, Debug, Clone)]
pub struct ClientArgs {
    /// The server, "ip:port".
    pub address: SocketAddr,
    /// The token key (hex): this process issues its clients' tokens.
    #[arg(long)]
    pub key: String,
    /// The game's protocol id.
    #[arg(long)]
    pub protocol_id: u64,
    /// Clients (a thread each).
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Messages in flight per client.
    #[arg(long, default_value_t = 16)]
    pub window: u64,
    /// Message size, bytes.
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Seconds of sending; the round trips completed in them are counted.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
}

/// Makes a client kind's command line for the server's address.
type MakeCommand = Box<dyn Fn(SocketAddr) -> Command>;

struct Echo;

impl Handler for Echo {
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
        let _ = ctx.send(s, channel, data);
    }
}

#[derive(Serialize, Debug, Clone)]
struct Run {
    kind: String,
    round: usize,
    round_trips: u64,
    round_trips_per_s: f64,
    ok: bool,
}

#[derive(Serialize, Debug, Clone)]
struct Kind {
    kind: String,
    /// Median round trips per second over the rounds; `None` when the kind did not run.
    median_round_trips_per_s: Option<f64>,
    /// That median over Rust's.
    ratio_to_rust: Option<f64>,
    /// The goal for the ratio (C 0.9, C# 0.6).
    goal: Option<f64>,
    /// Why it did not run, if it did not.
    not_run: Option<String>,
}

#[derive(Serialize)]
struct Report<'a> {
    kind: &'static str,
    created_unix_s: u64,
    created_utc: String,
    command: String,
    host: HostInfo,
    build: BuildInfo,
    clients: usize,
    window: usize,
    payload: usize,
    seconds: f64,
    workers: usize,
    ok: bool,
    kinds: &'a [Kind],
    runs: &'a [Run],
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The workspace root (the bench crate's parent).
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

fn tool(name: &str) -> bool {
    Command::new(name)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Build the release C library; the folder holding it.
fn build_library() -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(workspace())
        .args(["build", "--release", "-q", "-p", "ricochet-ffi"])
        .status()
        .context("running cargo build -p ricochet-ffi")?;
    if !status.success() {
        bail!("cargo build --release -p ricochet-ffi failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace().join("target"), PathBuf::from);
    Ok(target.join("release"))
}

/// Compile the C client with `cc -O2` against the release library.
fn build_c(lib: &Path, out: &Path) -> Result<PathBuf> {
    let ffi = workspace().join("engine/ffi");
    let exe = out.join("echo_client");
    let o = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(ffi.join("include"))
        .arg(ffi.join("examples/c/echo_client.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lricochet_ffi", "-lpthread"])
        .output()
        .context("running cc")?;
    if !o.status.success() {
        bail!("cc failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(exe)
}

/// Compile the C# client with `mcs -optimize+`.
fn build_csharp(out: &Path) -> Result<PathBuf> {
    let cs = workspace().join("engine/ffi/bindings/csharp");
    let exe = out.join("EchoClient.exe");
    let o = Command::new("mcs")
        .args(["-langversion:experimental", "-unsafe", "-optimize+"])
        .arg(format!("-out:{}", exe.display()))
        .arg(cs.join("Native.cs"))
        .arg(cs.join("Ricochet.cs"))
        .arg(cs.join("tests/EchoClient.cs"))
        .output()
        .context("running mcs")?;
    if !o.status.success() {
        bail!("mcs failed: {}", String::from_utf8_lossy(&o.stdout));
    }
    Ok(exe)
}

/// Run one client process; its round trips, and whether every echo was right.
fn run_client(mut cmd: Command, limit: Duration) -> Result<(u64, bool)> {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .context("starting a client process")?;
    let deadline = Instant::now() + limit;
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("a client process ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("no result line from the client: {text}"))?;
    let v: serde_json::Value = serde_json::from_str(line)?;
    let trips = v["round_trips"].as_u64().context("round_trips")?;
    Ok((trips, out.status.success() && v["ok"] == true))
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

pub fn run(args: &FfiArgs, out: &Global) -> Result<bool> {
    let at = UtcTime::now();
    let host = HostInfo::collect();
    println!("{}", bench::output::host_line(&host));
    let lib = build_library()?;
    let work = lib.join("bench-ffi");
    std::fs::create_dir_all(&work)?;
    let mut not_run: Vec<(String, String)> = Vec::new();
    let mut commands: Vec<(String, MakeCommand)> = Vec::new();
    let common = {
        let a = args.clone();
        move |cmd: &mut Command, addr: SocketAddr| {
            cmd.arg(addr.to_string())
                .args([
                    "--key",
                    &hex(&KEY),
                    "--protocol-id",
                    &PROTOCOL_ID.to_string(),
                ])
                .args(["--clients", &a.clients.to_string()])
                .args(["--window", &a.window.to_string()])
                .args(["--size", &a.payload.to_string()])
                .args(["--seconds", &a.seconds.to_string()]);
        }
    };
    for kind in &args.kinds {
        let c = common;
        match kind.as_str() {
            "rust" => {
                let me = std::env::current_exe()?;
                commands.push((
                    kind.clone(),
                    Box::new(move |addr| {
                        let mut cmd = Command::new(&me);
                        cmd.arg("ffi-client");
                        c(&mut cmd, addr);
                        cmd
                    }),
                ));
            }
            "c" => match build_c(&lib, &work) {
                Ok(exe) => commands.push((
                    kind.clone(),
                    Box::new(move |addr| {
                        let mut cmd = Command::new(&exe);
                        c(&mut cmd, addr);
                        cmd
                    }),
                )),
                Err(e) => not_run.push((kind.clone(), format!("{e:#}"))),
            },
            "csharp" if !tool("mcs") || !tool("mono") => not_run.push((
                kind.clone(),
                "mcs and mono are not installed (apt-get install mono-mcs mono-runtime)".into(),
            )),
            "csharp" => match build_csharp(&work) {
                Ok(exe) => {
                    let lib = lib.clone();
                    commands.push((
                        kind.clone(),
                        Box::new(move |addr| {
                            let mut cmd = Command::new("mono");
                            cmd.arg("--optimize=all")
                                .arg(&exe)
                                .arg("echo")
                                .env("LD_LIBRARY_PATH", &lib);
                            c(&mut cmd, addr);
                            cmd
                        }),
                    ))
                }
                Err(e) => not_run.push((kind.clone(), format!("{e:#}"))),
            },
            other => bail!("unknown client kind {other:?}: rust, c or csharp"),
        }
    }

    let config = ServerConfig::new("127.0.0.1:0".parse()?)
        .tokens(TokenKey::from_bytes(KEY), PROTOCOL_ID)
        .workers(args.workers)
        .max_handshakes_per_address(1 << 20);
    let server = Server::start(config, |_| Echo).map_err(|e| anyhow::anyhow!("{e}"))?;
    let addr = server.local_addr();
    let limit = Duration::from_secs_f64(args.seconds + 60.0);
    let mut runs = Vec::new();
    for round in 0..args.rounds {
        for (kind, make) in &commands {
            let (trips, ok) = run_client(make(addr), limit)?;
            let rate = trips as f64 / args.seconds;
            println!(
                "round {round}: {kind:>6}: {rate:>9.0} round trips/s{}",
                if ok { "" } else { "  (NOT OK)" }
            );
            runs.push(Run {
                kind: kind.clone(),
                round,
                round_trips: trips,
                round_trips_per_s: rate,
                ok,
            });
        }
    }
    server.shutdown().map_err(|e| anyhow::anyhow!("{e}"))?;

    let med = |k: &str| {
        median(
            runs.iter()
                .filter(|r| r.kind == k)
                .map(|r| r.round_trips_per_s)
                .collect(),
        )
    };
    let rust = med("rust");
    let kinds: Vec<Kind> = args
        .kinds
        .iter()
        .map(|k| {
            let m = med(k);
            Kind {
                kind: k.clone(),
                median_round_trips_per_s: m,
                ratio_to_rust: m.zip(rust).map(|(m, r)| m / r.max(f64::MIN_POSITIVE)),
                goal: match k.as_str() {
                    "c" => Some(0.9),
                    "csharp" => Some(0.6),
                    _ => None,
                },
                not_run: not_run
                    .iter()
                    .find(|(n, _)| n == k)
                    .map(|(_, why)| why.clone()),
            }
        })
        .collect();
    println!();
    println!(
        "{} clients × {} in flight × {} B, direct, {} s per run, median of {} rounds, {} server worker(s)",
        args.clients, args.window, args.payload, args.seconds, args.rounds, args.workers
    );
    println!("| client | round trips/s (median) | × Rust | goal |");
    println!("| --- | ---: | ---: | ---: |");
    for k in &kinds {
        match (&k.not_run, k.median_round_trips_per_s) {
            (Some(why), _) => println!("| {} | not run: {why} | | |", k.kind),
            (None, Some(m)) => println!(
                "| {} | {m:.0} | {} | {} |",
                k.kind,
                k.ratio_to_rust.map_or("-".into(), |r| format!("{r:.2}")),
                k.goal.map_or(String::new(), |g| {
                    let met = k.ratio_to_rust.is_some_and(|r| r >= g);
                    format!("≥ {g} ({})", if met { "met" } else { "NOT met" })
                })
            ),
            (None, None) => println!("| {} | - | | |", k.kind),
        }
    }
    let ok = runs.iter().all(|r| r.ok) && not_run.is_empty();
    let path = out.path_for("ffi", &at);
    let report = Report {
        kind: "ffi",
        created_unix_s: at.unix_s,
        created_utc: at.iso(),
        command: command_line(),
        host,
        build: BuildInfo::collect(),
        clients: args.clients,
        window: args.window,
        payload: args.payload,
        seconds: args.seconds,
        workers: args.workers,
        ok,
        kinds: &kinds,
        runs: &runs,
    };
    bench::output::write_json(&report, &path)?;
    println!("results: {}", path.display());
    Ok(ok)
}

/// The echo messages' pattern (the same as the C and C# clients').
fn fill(buf: &mut [u8], seq: u64, client: u32) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (seq
            .wrapping_mul(31)
            .wrapping_add(i as u64 * 7)
            .wrapping_add(u64::from(client))) as u8;
    }
    if buf.len() >= 12 {
        buf[..8].copy_from_slice(&seq.to_le_bytes());
        buf[8..12].copy_from_slice(&client.to_le_bytes());
    }
}

/// One Rust client: the C client's loop. Its round trips in `seconds`, and whether every echo
/// was right.
fn client_loop(a: &ClientArgs, issuer: &TokenIssuer, index: u32) -> Result<(u64, bool)> {
    let token = issuer.issue(1000 + u64::from(index), &[a.address])?;
    let mut client = Client::connect(&token, ClientConfig::new())?;
    let mut out = vec![0u8; a.size];
    let mut expect = vec![0u8; a.size];
    let (mut sent, mut received, mut at_stop) = (0u64, 0u64, None);
    let mut connected = false;
    let start = Instant::now();
    let ok = loop {
        let now = start.elapsed().as_secs_f64();
        if now > a.seconds + 30.0 {
            break false;
        }
        let more = now < a.seconds;
        if !more && at_stop.is_none() {
            at_stop = Some(received);
        }
        if connected {
            while more && sent - received < a.window {
                fill(&mut out, sent, index);
                match client.send(0, Bytes::copy_from_slice(&out)) {
                    Ok(()) => sent += 1,
                    Err(ricochet::ClientError::Send(ricochet::SendError::QueueFull)) => break,
                    Err(e) => return Err(e.into()),
                }
            }
            if !more && received == sent {
                break true;
            }
        }
        let mut bad = false;
        for event in client.wait(Duration::from_millis(1))? {
            match event {
                ClientEvent::Connected => connected = true,
                ClientEvent::Message { channel, data } => {
                    fill(&mut expect, received, index);
                    if channel != 0 || data[..] != expect[..] {
                        bad = true;
                    }
                    received += 1;
                }
                ClientEvent::Disconnected { .. } => bad = true,
                _ => {}
            }
        }
        if bad {
            break false;
        }
    };
    client.close();
    let until = Instant::now() + Duration::from_secs(3);
    while client.is_connected() && Instant::now() < until {
        let _ = client.wait(Duration::from_millis(5))?.count();
    }
    Ok((at_stop.unwrap_or(received), ok))
}

/// The Rust client process of `bench ffi`: prints the same result line as the C client.
pub fn client_process(a: &ClientArgs) -> Result<bool> {
    let key: Vec<u8> = (0..a.key.len() / 2)
        .map(|i| u8::from_str_radix(&a.key[2 * i..2 * i + 2], 16))
        .collect::<Result<_, _>>()?;
    let key: [u8; 32] = key
        .try_into()
        .map_err(|_| anyhow::anyhow!("a key is 32 bytes"))?;
    let issuer = TokenIssuer::new(TokenKey::from_bytes(key), a.protocol_id);
    let results: Vec<Result<(u64, bool)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..a.clients as u32)
            .map(|i| {
                let issuer = &issuer;
                s.spawn(move || client_loop(a, issuer, i))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a client panicked")))
            })
            .collect()
    });
    let mut total = 0;
    let mut ok = true;
    for r in results {
        match r {
            Ok((t, o)) => {
                total += t;
                ok &= o;
            }
            Err(e) => {
                eprintln!("client: {e:#}");
                ok = false;
            }
        }
    }
    println!(
        "{{\"client\":\"rust\",\"clients\":{},\"round_trips\":{total},\"seconds\":{:.3},\"ok\":{ok}}}",
        a.clients, a.seconds
    );
    Ok(ok)
}
