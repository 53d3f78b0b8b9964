//! The connect token test vectors file, read for the Rust, C and C# checks.

use std::net::SocketAddr;

use serde_json::Value;

use super::{crate_dir, hex, unhex};

/// Where the vectors are, from the crate's folder.
pub const PATH: &str = "tests/vectors/tokens.json";

pub struct Vector {
    pub name: String,
    pub key: [u8; 32],
    pub protocol_id: u64,
    pub client_id: u64,
    pub expires_unix: u64,
    pub servers: Vec<SocketAddr>,
    pub user_data: Vec<u8>,
    pub c2s: [u8; 32],
    pub s2c: [u8; 32],
    pub nonce: [u8; 24],
    pub token: Vec<u8>,
}

pub fn arr<const N: usize>(v: &Value) -> [u8; N] {
    unhex(v.as_str().expect("hex string"))
        .try_into()
        .expect("length")
}

pub fn num(v: &Value) -> u64 {
    v.as_str().expect("decimal string").parse().expect("u64")
}

pub fn load() -> Vec<Vector> {
    let text = std::fs::read_to_string(crate_dir().join(PATH)).expect("vectors file");
    let doc: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(doc["format"], "ricochet token 1");
    let vectors: Vec<Vector> = doc["vectors"]
        .as_array()
        .expect("vectors")
        .iter()
        .map(|v| Vector {
            name: v["name"].as_str().unwrap().to_string(),
            key: arr(&v["token_key"]),
            protocol_id: num(&v["protocol_id"]),
            client_id: num(&v["client_id"]),
            expires_unix: num(&v["expires_unix"]),
            servers: v["server_addresses"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().parse().unwrap())
                .collect(),
            user_data: unhex(v["user_data"].as_str().unwrap()),
            c2s: arr(&v["client_to_server_key"]),
            s2c: arr(&v["server_to_client_key"]),
            nonce: arr(&v["nonce"]),
            token: unhex(v["token"].as_str().unwrap()),
        })
        .collect();
    assert!(vectors.len() >= 4);
    vectors
}

/// The vectors as lines for the C and C# checkers: key, protocol id, client id, expiry,
/// addresses (comma-separated), user data ("-" when empty), the keys, the nonce, the token.
pub fn lines(vectors: &[Vector]) -> String {
    vectors
        .iter()
        .map(|v| {
            let servers: Vec<String> = v.servers.iter().map(|s| s.to_string()).collect();
            let data = if v.user_data.is_empty() {
                "-".to_string()
            } else {
                hex(&v.user_data)
            };
            format!(
                "{} {} {} {} {} {} {} {} {} {}\n",
                hex(&v.key),
                v.protocol_id,
                v.client_id,
                v.expires_unix,
                servers.join(","),
                data,
                hex(&v.c2s),
                hex(&v.s2c),
                hex(&v.nonce),
                hex(&v.token)
            )
        })
        .collect()
}
