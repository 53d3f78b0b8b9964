//! The README's client, verbatim below this header (`engine/tests/readme.rs` checks): mints a
//! development connect token, connects with the game profile, sends one message and prints
//! what happens until the server leaves.
//! `cargo run --release -p ricochet --example readme_client` (with `readme_server` running)

use ricochet::{Client, ClientConfig, Profile, TokenIssuer, TokenKey};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Local development: mint the token here. In production your backend issues it (HTTPS).
    let key = TokenKey::from_bytes(*b"ricochet readme key: not secret!");
    let token = TokenIssuer::new(key, 0x5249_4343).issue(1, &["127.0.0.1:7777".parse()?])?;
    let mut client = Client::connect_blocking(&token, ClientConfig::new().profile(Profile::Game))?;
    client.send(0, &b"hello"[..])?; // channel 0: reliable, ordered
    while client.is_connected() {
        // Once per frame: receive, run timers, send (never blocks); then what happened.
        client.update()?.for_each(|event| println!("{event:?}"));
        std::thread::sleep(std::time::Duration::from_millis(16)); // the rest of the frame
    }
    Ok(())
}
