//! A headless Bevy `App` with [`RicochetClientPlugin`] against a Ricochet server in the same
//! process (Rust, tokens on, loopback): 10,000 messages echoed, every byte checked.

mod common;

use std::time::{Duration, Instant};

use bevy_app::prelude::*;
use bevy_ecs::prelude::*;
use ricochet::TokenIssuer;
use ricochet::{
    Bytes, ClientConfig, CloseReason, Handler, Server, ServerConfig, ServerContext, SessionId,
    TokenKey,
};
use ricochet_bevy::{
    ClientConnection, ClientReceived, ClientTransportError, RicochetClient, RicochetClientPlugin,
};

use common::{mismatch, payload, MESSAGES, WINDOW};

const KEY: [u8; 32] = [0x42; 32];
const PROTOCOL_ID: u64 = 0x6265_7679;
/// The most any test here waits.
const DEADLINE: Duration = Duration::from_secs(120);

struct Echo;
impl Handler for Echo {
    fn on_message(&mut self, ctx: &mut ServerContext, id: SessionId, ch: u8, data: Bytes) {
        let _ = ctx.send(id, ch, data);
    }
}

fn echo_server() -> Server {
    let config = ServerConfig::new("127.0.0.1:0".parse().unwrap())
        .tokens(TokenKey::from_bytes(KEY), PROTOCOL_ID)
        .workers(1);
    Server::start(config, |_| Echo).expect("server starts")
}

/// What the app saw.
#[derive(Resource, Default)]
struct Seen {
    connected: u32,
    disconnected: Vec<ClientConnection>,
    sent: u32,
    checked: u32,
    /// Messages that arrived before `Connected`, or differ from what was sent.
    wrong: Vec<String>,
    errors: Vec<String>,
}

/// The game's system: once connected, keep `WINDOW` messages in flight on the reliable
/// ordered channel and check each echo against what was sent, in order.
fn echo_game(
    mut client: ResMut<RicochetClient>,
    mut seen: ResMut<Seen>,
    mut connection: MessageReader<ClientConnection>,
    mut received: MessageReader<ClientReceived>,
    mut errors: MessageReader<ClientTransportError>,
) {
    for c in connection.read() {
        match c {
            ClientConnection::Connected => seen.connected += 1,
            other => seen.disconnected.push(other.clone()),
        }
    }
    for e in errors.read() {
        seen.errors.push(e.error.to_string());
    }
    for m in received.read() {
        let i = seen.checked;
        if seen.connected != 1 || m.channel != 0 {
            seen.wrong.push(format!(
                "message {i} on channel {} before Connected",
                m.channel
            ));
        }
        if let Some(wrong) = mismatch(i, &m.data) {
            seen.wrong.push(wrong);
        }
        seen.checked += 1;
    }
    while seen.connected == 1 && seen.sent < MESSAGES && seen.sent - seen.checked < WINDOW {
        if let Err(e) = client.send(0, payload(seen.sent)) {
            let wrong = format!("send {}: {e}", seen.sent);
            seen.errors.push(wrong);
            return;
        }
        seen.sent += 1;
    }
}

/// Run frames until `done` says so; false if the deadline passed first.
fn run_until(app: &mut App, deadline: Instant, done: impl Fn(&World) -> bool) -> bool {
    while !done(app.world()) {
        if Instant::now() > deadline {
            return false;
        }
        app.update();
        // The rest of a (short) frame: the server's worker shares the machine's cores.
        std::thread::sleep(Duration::from_micros(500));
    }
    true
}

#[test]
fn bevy_client_echoes_ten_thousand_messages_with_tokens() {
    let server = echo_server();
    let token = TokenIssuer::new(TokenKey::from_bytes(KEY), PROTOCOL_ID)
        .issue(7, &[server.local_addr()])
        .unwrap();
    let mut app = App::new();
    app.add_plugins(RicochetClientPlugin)
        .init_resource::<Seen>()
        .insert_resource(RicochetClient::connect(&token, ClientConfig::new()).unwrap())
        .add_systems(Update, echo_game);
    let deadline = Instant::now() + DEADLINE;

    let finished = run_until(&mut app, deadline, |w| {
        let seen = w.resource::<Seen>();
        seen.checked == MESSAGES || !seen.errors.is_empty() || !seen.disconnected.is_empty()
    });
    let seen = app.world().resource::<Seen>();
    assert!(
        finished,
        "timed out after {} of {MESSAGES} echoes",
        seen.checked
    );
    assert_eq!(seen.errors, Vec::<String>::new());
    assert_eq!(seen.disconnected, Vec::new());
    assert_eq!(seen.wrong, Vec::<String>::new());
    assert_eq!(
        (seen.connected, seen.sent, seen.checked),
        (1, MESSAGES, MESSAGES)
    );
    assert!(app.world().resource::<RicochetClient>().is_connected());

    // A graceful close: the app learns it as a message.
    app.world_mut().resource_mut::<RicochetClient>().close();
    let closed = run_until(&mut app, deadline, |w| {
        !w.resource::<Seen>().disconnected.is_empty()
    });
    assert!(closed, "no Disconnected after close");
    assert_eq!(
        app.world().resource::<Seen>().disconnected,
        vec![ClientConnection::Disconnected {
            reason: CloseReason::Application,
            by_peer: false,
            message: Bytes::new(),
        }]
    );
    assert!(!app.world().resource::<RicochetClient>().is_connected());
    // The server saw the session come and go; nothing else is left.
    let stop = Instant::now() + Duration::from_secs(10);
    while server.session_count() != 0 && Instant::now() < stop {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(server.session_count(), 0);
    server.shutdown().unwrap();
}

#[test]
fn a_refused_connection_arrives_as_a_message() {
    let server = echo_server();
    // Sealed with another key: the server cannot open it.
    let token = TokenIssuer::new(TokenKey::from_bytes([0x17; 32]), PROTOCOL_ID)
        .issue(7, &[server.local_addr()])
        .unwrap();
    let mut app = App::new();
    app.add_plugins(RicochetClientPlugin)
        .init_resource::<Seen>()
        .insert_resource(RicochetClient::connect(&token, ClientConfig::new()).unwrap())
        .add_systems(Update, echo_game);
    let deadline = Instant::now() + DEADLINE;
    let ended = run_until(&mut app, deadline, |w| {
        !w.resource::<Seen>().disconnected.is_empty()
    });
    assert!(ended, "the refusal never arrived");
    let seen = app.world().resource::<Seen>();
    assert_eq!(seen.connected, 0);
    assert_eq!(seen.checked, 0);
    assert!(
        matches!(
            seen.disconnected.as_slice(),
            [ClientConnection::Disconnected {
                reason: CloseReason::TokenInvalid,
                ..
            }]
        ),
        "{:?}",
        seen.disconnected
    );
    assert_eq!(seen.errors, Vec::<String>::new());
    server.shutdown().unwrap();
}
