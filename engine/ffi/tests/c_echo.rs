//! The C examples against Rust peers, with tokens on and every byte checked, under
//! AddressSanitizer and UndefinedBehaviorSanitizer: 10,000 messages of 1 KiB, 16 in flight;
//! and lanes configured from C on both sides.

mod common;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ricochet::TokenIssuer;
use ricochet::{Client, ClientConfig, ClientEvent, Server, ServerConfig, TokenKey};

const MESSAGES: u64 = 10_000;
const SIZE: usize = 1024;
const WINDOW: u64 = 16;
const LIMIT: Duration = Duration::from_secs(180);

#[test]
fn a_c_client_echoes_10000_messages_with_a_rust_server() {
    let exe = build_c("echo_client");
    let echoed = Arc::new(AtomicU64::new(0));
    let count = echoed.clone();
    let config = ServerConfig::new("127.0.0.1:0".parse().unwrap())
        .tokens(TokenKey::from_bytes(KEY), PROTOCOL_ID)
        .workers(1);
    let server = Server::start(config, move |_| Echo(count.clone())).unwrap();
    let addr = server.local_addr();
    // The backend's part: a token for this server, handed to the C client.
    let token = TokenIssuer::new(TokenKey::from_bytes(KEY), PROTOCOL_ID)
        .issue(7, &[addr])
        .unwrap();
    let mut cmd = Command::new(&exe);
    cmd.arg(addr.to_string())
        .args(["--token", &hex(&token.to_bytes())])
        .args(["--messages", &MESSAGES.to_string()])
        .args(["--window", &WINDOW.to_string(), "--size", &SIZE.to_string()]);
    let out = run(sanitizer_env(&mut cmd), b"", LIMIT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "echo_client failed ({:?}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("\"round_trips\":{MESSAGES}")) && stdout.contains("\"ok\":true"),
        "{stdout}"
    );
    assert_eq!(echoed.load(Ordering::Relaxed), MESSAGES);
    server.shutdown().unwrap();
}

#[test]
fn a_rust_client_echoes_10000_messages_with_a_c_server() {
    let exe = build_c("echo_server");
    let mut cmd = Command::new(&exe);
    cmd.args(["127.0.0.1:0", "--key", &hex(&KEY)])
        .args(["--protocol-id", &PROTOCOL_ID.to_string()])
        .args(["--workers", "2", "--sessions", "1", "--seconds", "150"]);
    let mut child = sanitizer_env(&mut cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let line = first_line(&mut child);
    let addr = line
        .strip_prefix("listening ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();
    let token = TokenIssuer::new(TokenKey::from_bytes(KEY), PROTOCOL_ID)
        .issue(8, &[addr])
        .unwrap();
    let mut client = Client::connect_blocking(
        &token,
        ClientConfig::new().connect_timeout(Duration::from_secs(20)),
    )
    .unwrap();
    let deadline = Instant::now() + LIMIT;
    let (mut sent, mut received) = (0u64, 0u64);
    while received < MESSAGES {
        assert!(Instant::now() < deadline, "timed out at {received} echoes");
        while sent < MESSAGES && sent - received < WINDOW {
            client.send(0, message(SIZE, sent, 3)).unwrap();
            sent += 1;
        }
        for event in client.wait(Duration::from_millis(5)).unwrap() {
            match event {
                ClientEvent::Message { channel, data } => {
                    assert_eq!(channel, 0);
                    assert_eq!(
                        &data[..],
                        &message(SIZE, received, 3)[..],
                        "echo {received}"
                    );
                    received += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    client.close();
    let until = Instant::now() + Duration::from_secs(5);
    while client.is_connected() && Instant::now() < until {
        let _ = client.wait(Duration::from_millis(5)).unwrap().count();
    }
    let out = wait_output(child, Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "echo_server failed ({:?}):\n{stderr}",
        out.status
    );
    assert!(
        stderr.contains(&format!("{MESSAGES} messages echoed")),
        "{stderr}"
    );
}

#[test]
fn the_cpp_wrapper_echoes_in_one_process() {
    let exe = build_c("raii_echo");
    let out = run(sanitizer_env(Command::new(exe).arg("1000")), b"", LIMIT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1000 echoes checked"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_c_server_and_client_with_lanes_exchange_messages_and_refuse_bad_lane_lists() {
    let exe = build_c("lanes");
    let out = run(
        sanitizer_env(Command::new(exe).args(["--messages", "200"])),
        b"",
        LIMIT,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && stdout.contains("\"echoed_events\":200")
            && stdout.contains("\"ok\":true"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
