//! The C# binding under Mono: 10,000 echoed messages against a Rust server with tokens on and
//! every byte checked, the token test vectors, and errors as exceptions with the library's
//! text. Skipped (said on stderr) where Mono is missing, unless `RICOCHET_REQUIRE_MONO` is set.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::vectors::{lines, load};
use common::*;
use ricochet::TokenIssuer;
use ricochet::{Server, ServerConfig, TokenKey};

fn check(out: &std::process::Output, expect: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(expect),
        "expected {expect:?} ({:?}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_csharp_client_echoes_10000_messages_with_a_rust_server() {
    let Some(exe) = build_csharp() else { return };
    let echoed = Arc::new(AtomicU64::new(0));
    let count = echoed.clone();
    let config = ServerConfig::new("127.0.0.1:0".parse().unwrap())
        .tokens(TokenKey::from_bytes(KEY), PROTOCOL_ID)
        .workers(1);
    let server = Server::start(config, move |_| Echo(count.clone())).unwrap();
    let addr = server.local_addr();
    let token = TokenIssuer::new(TokenKey::from_bytes(KEY), PROTOCOL_ID)
        .issue(9, &[addr])
        .unwrap();
    let mut cmd = mono(&exe);
    cmd.args([
        "echo",
        &addr.to_string(),
        "--token",
        &hex(&token.to_bytes()),
    ])
    .args(["--messages", "10000", "--window", "16", "--size", "1024"]);
    let out = run(&mut cmd, b"", Duration::from_secs(180));
    check(&out, "\"round_trips\":10000");
    check(&out, "\"ok\":true");
    assert_eq!(echoed.load(Ordering::Relaxed), 10_000);
    server.shutdown().unwrap();
}

#[test]
fn the_csharp_binding_encodes_every_token_vector() {
    let Some(exe) = build_csharp() else { return };
    let vectors = load();
    let out = run(
        mono(&exe).arg("vectors"),
        lines(&vectors).as_bytes(),
        Duration::from_secs(60),
    );
    check(&out, &format!("{} passed, 0 failed", vectors.len()));
}

#[test]
fn csharp_errors_are_exceptions_with_the_library_text() {
    let Some(exe) = build_csharp() else { return };
    let out = run(mono(&exe).arg("errors"), b"", Duration::from_secs(60));
    check(&out, "3 of 3 error checks passed");
}
