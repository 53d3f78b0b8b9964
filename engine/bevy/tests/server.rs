//! A headless Bevy `App` with [`RicochetServerPlugin`] (two workers, tokens on) against plain
//! Rust clients on their own threads: the app echoes 10,000 messages, every byte checked by
//! the clients; connections, disconnections and a failed send reach the app as messages.

mod common;

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bevy_app::prelude::*;
use bevy_ecs::prelude::*;
use ricochet::TokenIssuer;
use ricochet::{
    Client, ClientConfig, ClientEvent, CloseReason, SendError, ServerConfig, SessionId, TokenKey,
};
use ricochet_bevy::{
    RicochetServer, RicochetServerPlugin, ServerConnection, ServerQueues, ServerReceived,
    ServerTransportError,
};

use common::{mismatch, payload, MESSAGES, WINDOW};

const KEY: [u8; 32] = [0x24; 32];
const PROTOCOL_ID: u64 = 0x6265_7679;
const CLIENTS: u32 = 2;
const DEADLINE: Duration = Duration::from_secs(120);

/// What the app saw.
#[derive(Resource, Default)]
struct Seen {
    connected: Vec<(SessionId, Option<u64>)>,
    disconnected: Vec<(SessionId, CloseReason, bool)>,
    echoed: u32,
    errors: Vec<ServerTransportError>,
    send_errors: Vec<SendError>,
}

/// The game's system: echo every message, note everything else.
fn echo_game(
    server: Res<RicochetServer>,
    mut seen: ResMut<Seen>,
    mut connection: MessageReader<ServerConnection>,
    mut received: MessageReader<ServerReceived>,
    mut errors: MessageReader<ServerTransportError>,
) {
    for c in connection.read() {
        match c {
            ServerConnection::Connected { session, peer } => {
                seen.connected.push((*session, peer.client_id));
            }
            ServerConnection::Disconnected {
                session,
                reason,
                by_peer,
            } => seen.disconnected.push((*session, *reason, *by_peer)),
            _ => {}
        }
    }
    for m in received.read() {
        match server.send(m.session, m.channel, m.data.clone()) {
            Ok(()) => seen.echoed += 1,
            Err(e) => seen.send_errors.push(e),
        }
    }
    seen.errors.extend(errors.read().cloned());
}

/// A plain Rust client: `count` messages in a window of `WINDOW`, each echo checked in order,
/// then a graceful close. Returns how many echoes were right.
fn client(token: ricochet::ConnectToken, count: u32) -> JoinHandle<Result<u32, String>> {
    std::thread::spawn(move || {
        let deadline = Instant::now() + DEADLINE;
        let mut c =
            Client::connect_blocking(&token, ClientConfig::new()).map_err(|e| e.to_string())?;
        let (mut sent, mut checked) = (0u32, 0u32);
        while checked < count {
            if Instant::now() > deadline {
                return Err(format!("timed out after {checked} of {count} echoes"));
            }
            while sent < count && sent - checked < WINDOW {
                c.send(0, payload(sent)).map_err(|e| e.to_string())?;
                sent += 1;
            }
            for event in c
                .wait(Duration::from_millis(5))
                .map_err(|e| e.to_string())?
            {
                match event {
                    ClientEvent::Message { channel: 0, data } => {
                        if let Some(wrong) = mismatch(checked, &data) {
                            return Err(wrong);
                        }
                        checked += 1;
                    }
                    other => return Err(format!("unexpected {other:?}")),
                }
            }
        }
        c.close();
        while c.is_connected() {
            if Instant::now() > deadline {
                return Err("the close never completed".into());
            }
            c.wait(Duration::from_millis(5))
                .map_err(|e| e.to_string())?
                .for_each(drop);
        }
        Ok(checked)
    })
}

fn run_until(app: &mut App, deadline: Instant, done: impl Fn(&World) -> bool) -> bool {
    while !done(app.world()) {
        if Instant::now() > deadline {
            return false;
        }
        app.update();
        std::thread::sleep(Duration::from_micros(500));
    }
    true
}

#[test]
fn bevy_server_echoes_ten_thousand_messages_to_rust_clients() {
    echo_for_rust_clients(ServerQueues::default());
}

/// Queues far smaller than the traffic: the workers wait for the app, and nothing is lost.
#[test]
fn tiny_queues_hold_the_workers_back_and_lose_nothing() {
    echo_for_rust_clients(ServerQueues::new().events(4).sends(16));
}

/// An event queue capped at a few messages' bytes: the workers wait for the app, and nothing
/// is lost.
#[test]
fn a_small_byte_cap_holds_the_workers_back_and_loses_nothing() {
    echo_for_rust_clients(ServerQueues::new().bytes(100));
}

fn echo_for_rust_clients(queues: ServerQueues) {
    let config = ServerConfig::new("127.0.0.1:0".parse().unwrap())
        .tokens(TokenKey::from_bytes(KEY), PROTOCOL_ID)
        .workers(2);
    let server = RicochetServer::start_with(config, queues).expect("server starts");
    let addr = server.local_addr();
    let mut app = App::new();
    app.add_plugins(RicochetServerPlugin)
        .init_resource::<Seen>()
        .insert_resource(server)
        .add_systems(Update, echo_game);
    let issuer = TokenIssuer::new(TokenKey::from_bytes(KEY), PROTOCOL_ID);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| {
            client(
                issuer.issue(100 + u64::from(id), &[addr]).unwrap(),
                MESSAGES / CLIENTS,
            )
        })
        .collect();
    let deadline = Instant::now() + DEADLINE;

    let finished = run_until(&mut app, deadline, |_| {
        clients.iter().all(|c| c.is_finished())
    });
    assert!(finished, "the clients did not finish in time");
    let results: Vec<_> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    assert_eq!(results, vec![Ok(MESSAGES / CLIENTS); CLIENTS as usize]);
    // The clients' closes reach the app too.
    let closed = run_until(&mut app, deadline, |w| {
        w.resource::<Seen>().disconnected.len() == CLIENTS as usize
    });
    assert!(closed, "the app did not see every client leave");

    let seen = app.world().resource::<Seen>();
    assert_eq!(seen.echoed, MESSAGES);
    assert_eq!(seen.send_errors, Vec::new());
    assert_eq!(seen.errors, Vec::new());
    let mut ids: Vec<_> = seen.connected.iter().map(|&(_, id)| id).collect();
    ids.sort();
    assert_eq!(ids, vec![Some(100), Some(101)]);
    // One client per worker: the app saw both workers' sessions.
    let mut workers: Vec<_> = seen.connected.iter().map(|(s, _)| s.worker).collect();
    workers.sort();
    assert_eq!(workers, vec![0, 1]);
    let mut gone: Vec<_> = seen.disconnected.clone();
    gone.sort_by_key(|&(s, _, _)| s);
    let mut expected: Vec<_> = seen
        .connected
        .iter()
        .map(|&(s, _)| (s, CloseReason::Application, true))
        .collect();
    expected.sort_by_key(|&(s, _, _)| s);
    assert_eq!(gone, expected);

    // Sending to a session that has gone: queued, then refused by its worker, as a message.
    let (session, _) = seen.connected[0];
    let server = app.world().resource::<RicochetServer>();
    assert_eq!(server.send(session, 0, &b"late"[..]), Ok(()));
    // What no session can take fails at once.
    assert_eq!(
        server.send(session, 9, &b"x"[..]),
        Err(SendError::UnknownChannel(9))
    );
    let failed = run_until(&mut app, deadline, |w| {
        !w.resource::<Seen>().errors.is_empty()
    });
    assert!(failed, "the failed send was not reported");
    assert!(
        matches!(
            app.world().resource::<Seen>().errors.as_slice(),
            [ServerTransportError::SendFailed { session: s, channel: 0, .. }] if *s == session
        ),
        "{:?}",
        app.world().resource::<Seen>().errors
    );

    let server = app.world_mut().remove_resource::<RicochetServer>().unwrap();
    let counters = server.shutdown().unwrap();
    assert_eq!(counters.len(), 2);
}

#[test]
fn empty_queues_are_refused() {
    let config = ServerConfig::new("127.0.0.1:0".parse().unwrap()).insecure();
    let err = RicochetServer::start_with(config, ServerQueues::new().events(0)).unwrap_err();
    assert!(err.to_string().contains("at least one"), "{err}");
    let config = ServerConfig::new("127.0.0.1:0".parse().unwrap()).insecure();
    let err = RicochetServer::start_with(config, ServerQueues::new().bytes(0)).unwrap_err();
    assert!(err.to_string().contains("at least one"), "{err}");
}
