//! The README's server, verbatim below this header (`engine/tests/readme.rs` checks): an echo
//! server with the game profile that admits players by connect token and shuts down on Ctrl-C
//! or SIGTERM.
//! `cargo run --release -p ricochet --example readme_server`

use ricochet::{Bytes, Handler, Profile, Server, ServerConfig, ServerContext, SessionId, TokenKey};

const KEY: [u8; 32] = *b"ricochet readme key: not secret!"; // a development key

struct Echo;
impl Handler for Echo {
    fn on_message(&mut self, ctx: &mut ServerContext, id: SessionId, ch: u8, data: Bytes) {
        let _ = ctx.send(id, ch, data); // replies leave batched, once per loop turn
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = ServerConfig::new("127.0.0.1:7777".parse()?) // the address tokens name
        .tokens(TokenKey::from_bytes(KEY), 0x5249_4343) // the backend's key, your game's id
        .profile(Profile::Game);
    let server = Server::start(config, |_worker| Echo)?;
    println!("listening on {}", server.local_addr());
    server.serve_until_signal()?; // until Ctrl-C or `kill`; then says goodbye to every client
    Ok(())
}
