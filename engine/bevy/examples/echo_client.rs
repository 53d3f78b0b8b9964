//! A headless Bevy app as a Ricochet game client: it connects with a connect token, sends
//! numbered messages (a few in flight), checks each echo, closes and exits.
//!
//! ```sh
//! cargo run -p ricochet-bevy --example echo_client                 # with its own echo server
//! cargo run -p ricochet-bevy --example echo_client -- --server 127.0.0.1:7777 --messages 500
//! ```
//!
//! Without `--server` it starts a Rust echo server in the process on an ephemeral port; with
//! it, it talks to a server admitting tokens of the README's development key (the
//! `readme_server` example of `ricochet`).

use std::net::SocketAddr;
use std::time::Duration;

use bevy_app::{prelude::*, AppExit, ScheduleRunnerPlugin};
use bevy_ecs::prelude::*;
use ricochet::TokenIssuer;
use ricochet::{
    Bytes, ClientConfig, Handler, Profile, Server, ServerConfig, ServerContext, SessionId, TokenKey,
};
use ricochet_bevy::{
    ClientConnection, ClientReceived, ClientTransportError, RicochetClient, RicochetClientPlugin,
};

/// The README's development key and protocol id (never a production key).
const KEY: [u8; 32] = *b"ricochet readme key: not secret!";
const PROTOCOL_ID: u64 = 0x5249_4343;
/// Messages in flight at most.
const WINDOW: u32 = 8;

/// The in-process server's handler: send every message back.
struct Echo;
impl Handler for Echo {
    fn on_message(&mut self, ctx: &mut ServerContext, id: SessionId, ch: u8, data: Bytes) {
        let _ = ctx.send(id, ch, data);
    }
}

/// The game's state.
#[derive(Resource)]
struct Game {
    messages: u32,
    sent: u32,
    echoed: u32,
    connected: bool,
    failed: bool,
}

fn message(i: u32) -> Vec<u8> {
    format!("hello {i}").into_bytes()
}

/// Once a frame, after the plugin received: check the echoes, keep `WINDOW` in flight, close
/// when done, exit when the connection has ended.
fn play(
    mut game: ResMut<Game>,
    mut client: ResMut<RicochetClient>,
    mut connection: MessageReader<ClientConnection>,
    mut received: MessageReader<ClientReceived>,
    mut errors: MessageReader<ClientTransportError>,
    mut exit: MessageWriter<AppExit>,
) {
    for e in errors.read() {
        eprintln!("transport error: {}", e.error);
    }
    for c in connection.read() {
        match c {
            ClientConnection::Connected => {
                println!("connected");
                game.connected = true;
            }
            ClientConnection::Disconnected {
                reason, by_peer, ..
            } => {
                println!("disconnected: {reason} (by the server: {by_peer})");
                let done = game.echoed == game.messages && !game.failed;
                exit.write(if done {
                    AppExit::Success
                } else {
                    AppExit::error()
                });
                return;
            }
            _ => {}
        }
    }
    for m in received.read() {
        if m.data != message(game.echoed) {
            eprintln!("echo {} is wrong: {:?}", game.echoed, m.data);
            game.failed = true;
        }
        game.echoed += 1;
    }
    if !game.connected {
        return;
    }
    while game.sent < game.messages && game.sent - game.echoed < WINDOW {
        if let Err(e) = client.send(0, message(game.sent)) {
            eprintln!("send: {e}");
            game.failed = true;
            break;
        }
        game.sent += 1;
    }
    if game.failed || game.echoed == game.messages {
        if client.is_connected() {
            println!("{} echoes checked; closing", game.echoed);
        }
        client.close();
    }
}

fn main() -> Result<AppExit, Box<dyn std::error::Error>> {
    let mut server_addr: Option<SocketAddr> = None;
    let mut messages = 100;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--server", Some(v)) => server_addr = Some(v.parse()?),
            ("--messages", Some(v)) => messages = v.parse()?,
            _ => return Err("usage: echo_client [--server ADDR] [--messages N]".into()),
        }
    }
    // Without a server to talk to, run one here (dropped, and so shut down, at the end).
    let (_server, addr) = match server_addr {
        Some(addr) => (None, addr),
        None => {
            let config = ServerConfig::new("127.0.0.1:0".parse()?)
                .tokens(TokenKey::from_bytes(KEY), PROTOCOL_ID)
                .profile(Profile::Game)
                .workers(1);
            let server = Server::start(config, |_| Echo)?;
            let addr = server.local_addr();
            (Some(server), addr)
        }
    };
    // Local development: mint the token here. In production the game's backend issues it.
    let token = TokenIssuer::new(TokenKey::from_bytes(KEY), PROTOCOL_ID).issue(1, &[addr])?;
    let client = RicochetClient::connect(&token, ClientConfig::new().profile(Profile::Game))?;
    println!("connecting to {addr}");

    let exit = App::new()
        // Headless: no window, a frame every 16 ms.
        .add_plugins(ScheduleRunnerPlugin::run_loop(Duration::from_millis(16)))
        .add_plugins(RicochetClientPlugin)
        .insert_resource(client)
        .insert_resource(Game {
            messages,
            sent: 0,
            echoed: 0,
            connected: false,
            failed: false,
        })
        .add_systems(Update, play)
        .run();
    Ok(exit)
}
