//! The README's client, verbatim below this header (`engine/tests/readme.rs` checks): connects
//! with the game profile, sends one message and prints what comes back until the server leaves.
//! `cargo run --release -p ricochet --example readme_client` (with `readme_server` running)

use ricochet::{Client, ClientConfig, ClientEvent, Profile};
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = ClientConfig::new().profile(Profile::Game);
    let server = "127.0.0.1:7777".parse()?;
    let mut client = Client::connect_blocking(server, config, Duration::from_secs(5))?;
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
