//! An RUDP echo server and client, admitting the client by connect token.
//!
//! ```sh
//! cargo run --release --example echo                            # both, in one process, 3 s
//! cargo run --release --example echo -- --serve 127.0.0.1:7777 --seconds 60  # server, 60 s
//! cargo run --release --example echo -- --connect 127.0.0.1:7777 --seconds 10  # other terminal
//! cargo run --release --example echo -- --insecure              # no tokens (LAN, tests)
//! ```
//!
//! `--serve` serves for `--seconds` (3 by default), then shuts down: give it long enough for
//! the client in the other terminal.
//!
//! Both sides use a development key that everyone who reads this file knows: the client mints
//! its own token, as the game's backend would. A real server takes its key from a secret
//! store and never gives it to clients.

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use ricochet::proto::token::{ConnectToken, TokenKey, TokenParams};
use ricochet::runtime::{Handler, Server, ServerConfig, ServerContext, SessionId};
use ricochet::{Client, ClientConfig, ClientEvent};

/// The development key (public: never use it for a server others can reach).
const DEV_KEY: [u8; 32] = *b"ricochet example key: not secret";
/// The game's protocol id.
const PROTOCOL_ID: u64 = 0x6563_686f;

/// A token for `server`, valid for 30 s: what the backend hands a player who logged in.
fn mint_token(server: SocketAddr) -> Result<ConnectToken, Box<dyn std::error::Error>> {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH)?;
    let params = TokenParams {
        protocol_id: PROTOCOL_ID,
        client_id: 1,
        server_addresses: &[server],
        expires_unix: now.as_secs() + 30,
        user_data: b"",
    };
    Ok(ConnectToken::seal(
        &TokenKey::from_bytes(DEV_KEY),
        &params,
        &mut rand::rng(),
    )?)
}

/// The whole server: send every message back on the channel it came on.
struct Echo;

impl Handler for Echo {
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
        let _ = ctx.send(s, channel, data);
    }
}

/// Send numbered messages on the reliable ordered channel (0) for `seconds`, 16 in flight,
/// checking that each echo is the next one expected.
fn run_client(
    server: SocketAddr,
    seconds: f64,
    insecure: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let cfg = ClientConfig::default().connect_timeout(Duration::from_secs(5));
    let mut client = if insecure {
        Client::connect_insecure_blocking(server, cfg)?
    } else {
        Client::connect_blocking(&mint_token(server)?, cfg)?
    };
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let (mut next_send, mut next_echo) = (0u64, 0u64);
    let mut rtt_total = Duration::ZERO;
    let mut sent_at = std::collections::VecDeque::new();
    while Instant::now() < end || next_echo < next_send {
        while Instant::now() < end && next_send - next_echo < 16 {
            client.send(0, next_send.to_le_bytes().to_vec())?;
            sent_at.push_back(Instant::now());
            next_send += 1;
        }
        for event in client.wait(Duration::from_millis(10))? {
            match event {
                ClientEvent::Message { data, .. } => {
                    let n = u64::from_le_bytes(data[..].try_into()?);
                    assert_eq!(n, next_echo, "reliable ordered: echoes come back in order");
                    rtt_total += sent_at.pop_front().map_or(Duration::ZERO, |t| t.elapsed());
                    next_echo += 1;
                }
                ClientEvent::Disconnected { reason, .. } => {
                    return Err(format!("{reason:?}").into())
                }
                _ => {}
            }
        }
    }
    let s = client.stats().map(|s| (s.packets_sent, s.retransmitted));
    println!(
        "{next_echo} round trips in {seconds} s, mean RTT {:?}; (packets sent, retransmitted) = {s:?}",
        rtt_total / next_echo.max(1) as u32
    );
    client.close();
    // Until the close went out and the server answered it (bounded: a close waits at most
    // `close_linger` for the reliable data still queued).
    let until = Instant::now() + Duration::from_secs(3);
    'closing: while Instant::now() < until {
        for event in client.wait(Duration::from_millis(10))? {
            if matches!(event, ClientEvent::Disconnected { .. }) {
                break 'closing;
            }
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let seconds: f64 = flag("--seconds").map_or(Ok(3.0), |s| s.parse())?;
    let insecure = args.iter().any(|a| a == "--insecure");
    if let Some(addr) = flag("--connect") {
        return run_client(addr.parse()?, seconds, insecure);
    }
    let bind = flag("--serve")
        .unwrap_or_else(|| "127.0.0.1:0".into())
        .parse()?;
    let cfg = if insecure {
        ServerConfig::new(bind).insecure()
    } else {
        ServerConfig::new(bind).tokens(TokenKey::from_bytes(DEV_KEY), PROTOCOL_ID)
    };
    let server = Server::start(cfg, |_| Echo)?;
    println!(
        "echo server on {} ({} workers, {})",
        server.local_addr(),
        server.workers(),
        server.backend_kind()
    );
    if flag("--serve").is_some() {
        std::thread::sleep(Duration::from_secs_f64(seconds));
    } else {
        run_client(server.local_addr(), seconds, insecure)?;
    }
    server.shutdown()?;
    Ok(())
}
