//! The README's client, verbatim below this header (`engine/tests/readme.rs` checks): mints a
//! development connect token, connects with the game profile, sends one message and prints what
//! comes back until the server leaves.
//! `cargo run --release -p ricochet --example readme_client` (with `readme_server` running)

use ricochet::{backend, Client, ClientConfig, ClientEvent, Profile, TokenKey};
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Local development: mint the token here. In production your backend issues it (HTTPS).
    let key = TokenKey::from_bytes(*b"ricochet readme key: not secret!");
    let server = "127.0.0.1:7777".parse()?;
    let (player, valid_for) = (1, Duration::from_secs(30));
    let token = backend::issue_token(&key, 0x5249_4343, player, &[server], valid_for, b"")?;
    let config = ClientConfig::new().profile(Profile::Game);
    let mut client = Client::connect_blocking(&token, config, Duration::from_secs(5))?;
    client.send(0, &b"hello"[..])?; // channel 0: reliable, ordered
    while client.is_connected() {
        client.update()?; // once per frame: receive, run timers, send; never blocks
        while let Some(ClientEvent::Message { channel, data }) = client.poll_event() {
            println!("channel {channel}: {data:?}");
        }
        std::thread::sleep(Duration::from_millis(16)); // the rest of the frame
    }
    Ok(())
}
