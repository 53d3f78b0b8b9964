//! The connect token test vectors (`tests/vectors/tokens.json`, specified in
//! `docs/tokens.md`): the Rust issuer reproduces them from their fields and random bytes, and
//! so do the C ABI (called from Rust and from the C program `examples/c/token_vectors.c`).
//! `RICOCHET_BLESS_VECTORS=1` writes the file afresh from the Rust issuer (done once; the
//! bytes must never change for a format version).

mod common;

use std::process::Command;
use std::time::Duration;

use common::vectors::{lines, load, Vector};
use common::*;
use rand::{RngCore, SeedableRng};
use ricochet::proto::token::{ConnectToken, PrivateToken, TokenParams};
use ricochet::TokenKey;
use serde_json::{json, Value};

use common::vectors::PATH;

/// A generator that hands out given bytes (a token's keys, then its nonce) in order: with it,
/// `ConnectToken::seal` (what the issuer runs) makes the vector's token.
struct Replay(Vec<u8>, usize);

impl RngCore for Replay {
    fn next_u32(&mut self) -> u32 {
        unreachable!("the token generator draws bytes only")
    }
    fn next_u64(&mut self) -> u64 {
        unreachable!("the token generator draws bytes only")
    }
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        dst.copy_from_slice(&self.0[self.1..self.1 + dst.len()]);
        self.1 += dst.len();
    }
}

impl rand::CryptoRng for Replay {}

/// The Rust issuer's token for `v`'s fields with `v`'s random bytes.
fn issue(v: &Vector) -> ConnectToken {
    let mut random = v.c2s.to_vec();
    random.extend_from_slice(&v.s2c);
    random.extend_from_slice(&v.nonce);
    let mut rng = Replay(random, 0);
    let token = ConnectToken::seal(
        &TokenKey::from_bytes(v.key),
        &TokenParams {
            protocol_id: v.protocol_id,
            client_id: v.client_id,
            server_addresses: &v.servers,
            expires_unix: v.expires_unix,
            user_data: &v.user_data,
        },
        &mut rng,
    )
    .expect("a valid vector");
    assert_eq!(
        rng.1,
        rng.0.len(),
        "the generator drew exactly the keys and the nonce"
    );
    token
}

/// The file is what the Rust issuer makes from the vectors' seeded fields (with
/// `RICOCHET_BLESS_VECTORS=1`, it is written).
#[test]
fn the_file_is_what_the_issuer_generates() {
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(0x746f_6b65_6e73);
    let mut draw = |n: usize| {
        let mut b = vec![0u8; n];
        rng.fill_bytes(&mut b);
        b
    };
    let shared_key = draw(32);
    // Name, token key, protocol id, client id, expiry, servers, user data.
    type Case<'a> = (&'a str, Vec<u8>, u64, u64, u64, Vec<&'a str>, Vec<u8>);
    let cases: Vec<Case> = vec![
        (
            "one IPv4 server, no user data",
            shared_key.clone(),
            0x1234,
            42,
            1_800_000_000,
            vec!["203.0.113.5:7777"],
            vec![],
        ),
        (
            "IPv6 then IPv4, user data, largest integers",
            shared_key.clone(),
            u64::MAX,
            u64::MAX,
            u64::MAX,
            vec!["[2001:db8::1]:40000", "198.51.100.7:7777"],
            b"team=blue".to_vec(),
        ),
        (
            "eight servers, 256 bytes of user data, zero integers",
            shared_key.clone(),
            0,
            0,
            0,
            vec![
                "10.0.0.1:1",
                "10.0.0.2:2",
                "10.0.0.3:3",
                "10.0.0.4:4",
                "[::1]:5",
                "[fe80::1]:6",
                "192.0.2.255:65535",
                "127.0.0.1:7777",
            ],
            (0..=255u8).collect(),
        ),
        (
            "the first vector's fields under another key",
            draw(32),
            0x1234,
            42,
            1_800_000_000,
            vec!["203.0.113.5:7777"],
            vec![],
        ),
    ];
    let vectors: Vec<Value> = cases
        .into_iter()
        .map(
            |(name, key, protocol_id, client_id, expires_unix, servers, user_data)| {
                let mut v = Vector {
                    name: name.into(),
                    key: key.try_into().unwrap(),
                    protocol_id,
                    client_id,
                    expires_unix,
                    servers: servers.iter().map(|s| s.parse().unwrap()).collect(),
                    user_data,
                    c2s: draw(32).try_into().unwrap(),
                    s2c: draw(32).try_into().unwrap(),
                    nonce: draw(24).try_into().unwrap(),
                    token: Vec::new(),
                };
                v.token = issue(&v).to_bytes();
                json!({
                    "name": v.name,
                    "token_key": hex(&v.key),
                    "protocol_id": v.protocol_id.to_string(),
                    "client_id": v.client_id.to_string(),
                    "expires_unix": v.expires_unix.to_string(),
                    "server_addresses": servers,
                    "user_data": hex(&v.user_data),
                    "client_to_server_key": hex(&v.c2s),
                    "server_to_client_key": hex(&v.s2c),
                    "nonce": hex(&v.nonce),
                    "token": hex(&v.token),
                })
            },
        )
        .collect();
    let doc = json!({
        "format": "ricochet token 1",
        "description": "Connect token test vectors: every field, the random bytes (session keys and nonce) and the expected token. Integers are decimal strings (64-bit values do not fit a JSON number everywhere); bytes are lowercase hex. Layout: docs/tokens.md.",
        "vectors": vectors,
    });
    let text = serde_json::to_string_pretty(&doc).unwrap() + "\n";
    let path = crate_dir().join(PATH);
    if std::env::var_os("RICOCHET_BLESS_VECTORS").is_some() {
        std::fs::write(path, text).unwrap();
    } else {
        let file = std::fs::read_to_string(path).unwrap();
        assert!(
            file == text,
            "{PATH} differs from what the issuer generates"
        );
    }
}

#[test]
fn the_rust_issuer_makes_every_vector() {
    for v in load() {
        let token = issue(&v);
        assert_eq!(token.to_bytes(), v.token, "{}", v.name);
        // And reads it back: the public part, and the private part with the key.
        let read = ConnectToken::from_bytes(&v.token).unwrap();
        assert_eq!(read, token, "{}", v.name);
        // `unseal`: the vectors' expiries are fixed, so some have passed.
        let p = PrivateToken::unseal(
            &TokenKey::from_bytes(v.key),
            v.protocol_id,
            v.expires_unix,
            &read.sealed,
        )
        .unwrap_or_else(|e| panic!("{}: {e}", v.name));
        assert_eq!(
            (p.client_id, &p.user_data[..]),
            (v.client_id, &v.user_data[..])
        );
        assert_eq!(p.server_addresses, v.servers);
        assert_eq!(
            (p.keys.client_to_server, p.keys.server_to_client),
            (v.c2s, v.s2c)
        );
    }
}

#[test]
fn the_c_abi_encodes_every_vector() {
    use ricochet_ffi::{ricochet_status, token::ricochet_token_encode};
    for v in load() {
        let strings: Vec<std::ffi::CString> = v
            .servers
            .iter()
            .map(|s| std::ffi::CString::new(s.to_string()).unwrap())
            .collect();
        let ptrs: Vec<*const std::ffi::c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        let mut out = [0u8; 785];
        let mut len = 0;
        // SAFETY: every pointer is valid for the length given.
        let s = unsafe {
            ricochet_token_encode(
                v.key.as_ptr(),
                v.protocol_id,
                v.client_id,
                v.expires_unix,
                ptrs.as_ptr(),
                ptrs.len(),
                v.user_data.as_ptr(),
                v.user_data.len(),
                v.c2s.as_ptr(),
                v.s2c.as_ptr(),
                v.nonce.as_ptr(),
                out.as_mut_ptr(),
                out.len(),
                &mut len,
            )
        };
        assert_eq!(s, ricochet_status::RICOCHET_OK, "{}", v.name);
        assert_eq!(&out[..len], &v.token[..], "{}", v.name);
    }
}

#[test]
fn the_c_program_encodes_every_vector() {
    let vectors = load();
    let exe = build_c("token_vectors");
    let out = run(
        sanitizer_env(&mut Command::new(exe)),
        lines(&vectors).as_bytes(),
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("{} passed, 0 failed", vectors.len())),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
