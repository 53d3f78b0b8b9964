//! A tick-based game server: 20 times a second it broadcasts the world state to every player on
//! an unreliable-sequenced channel (a late snapshot is useless, a newer one replaces it), while
//! chat travels on a reliable ordered channel beside it. The players run in the same process,
//! all driven from one game loop with `Client::update`, as a game client would.
//!
//! ```sh
//! cargo run --release --example game_server -- --clients 8 --seconds 5
//! # with metrics and health on 127.0.0.1:9100 (/metrics, /healthz, /readyz, /sessions):
//! cargo run --release --example game_server -- --seconds 60 --metrics 127.0.0.1:9100
//! # played under a bad link (the server's link conditioner, each way):
//! cargo run --release --example game_server -- --loss 5 --delay-ms 50 --jitter-ms 10
//! ```
//!
//! Link conditioner flags, each applied to both directions of the server: `--loss PCT`,
//! `--burst-enter PCT --burst-exit PCT` (bursts of loss, two-state model), `--delay-ms MS`,
//! `--jitter-ms MS`, `--reorder PCT --reorder-ms MS`, `--dup PCT`, `--rate-kbit KBIT/S`,
//! `--seed N`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ricochet::{
    ChannelKind, Client, ClientConfig, ClientEvent, GilbertElliott, Handler, Impairment,
    LinkConditioner, Peer, Profile, RateLimit, Refusal, Server, ServerConfig, ServerContext,
    SessionId, TokenIssuer, TokenKey,
};

/// Channel ids, into [`CHANNELS`].
const CHAT: u8 = 0;
const STATE: u8 = 1;

/// Inputs and chat go reliable and ordered; world snapshots go unreliable-sequenced (a late
/// snapshot is worthless once a newer one arrived).
const CHANNELS: [ChannelKind; 2] = [
    ChannelKind::ReliableOrdered,
    ChannelKind::UnreliableSequenced,
];

/// The game's protocol id.
const PROTOCOL_ID: u64 = 0x6761_6d65;
/// Most players in the world.
const MAX_PLAYERS: usize = 64;

/// The world: a tick counter and each player's chat line count. One worker owns it.
#[derive(Default)]
struct World {
    tick: u32,
    players: BTreeMap<SessionId, u32>,
}

impl Handler for World {
    fn on_accept(&mut self, _: &mut ServerContext<'_>, peer: &Peer) -> Result<(), Refusal> {
        // The backend put the player's name in the token's user data.
        if self.players.len() >= MAX_PLAYERS {
            return Err(Refusal::new(1, "the match is full"));
        }
        if peer.user_data.is_empty() {
            return Err(Refusal::new(2, "a player needs a name"));
        }
        Ok(())
    }

    fn on_connect(&mut self, _: &mut ServerContext<'_>, s: SessionId, _: &Peer) {
        self.players.insert(s, 0);
    }

    fn on_message(
        &mut self,
        ctx: &mut ServerContext<'_>,
        from: SessionId,
        channel: u8,
        data: Bytes,
    ) {
        if channel != CHAT {
            return;
        }
        *self.players.entry(from).or_default() += 1;
        // Relay the line to everyone, reliably and in order.
        for &p in self.players.keys() {
            let _ = ctx.send(p, CHAT, data.clone());
        }
    }

    fn on_disconnect(
        &mut self,
        _: &mut ServerContext<'_>,
        s: SessionId,
        _: ricochet::CloseReason,
        _: bool,
    ) {
        self.players.remove(&s);
    }

    fn on_tick(&mut self, ctx: &mut ServerContext<'_>) {
        // The tick's index on the server's fixed grid, not a count of calls: a tick the worker
        // was too busy to run in time is skipped, and a simulation would step over it.
        self.tick = ctx.tick_index().map_or(self.tick + 1, |k| k as u32);
        // Snapshot: tick, then every player's chat count.
        let mut snapshot = self.tick.to_le_bytes().to_vec();
        snapshot.extend(self.players.values().flat_map(|n| n.to_le_bytes()));
        let snapshot = Bytes::from(snapshot);
        for &p in self.players.keys() {
            let _ = ctx.send(p, STATE, snapshot.clone());
        }
    }
}

/// What one player saw.
#[derive(Default)]
struct Seen {
    snapshots: u32,
    last_tick: u32,
    stale: u32,
    chat: u32,
}

/// The link conditioner the flags ask for (the same each way), or `None` without any.
fn conditioner_from_flags<'a>(
    flag: &dyn Fn(&str) -> Option<&'a String>,
) -> Result<Option<LinkConditioner>, Box<dyn std::error::Error>> {
    let num = |name: &str| -> Result<Option<f64>, Box<dyn std::error::Error>> {
        match flag(name) {
            Some(v) => Ok(Some(
                v.parse::<f64>().map_err(|e| format!("{name} {v}: {e}"))?,
            )),
            None => Ok(None),
        }
    };
    let ms = |v: f64| Duration::from_secs_f64(v.max(0.0) / 1000.0);
    let mut imp = Impairment::new();
    if let Some(p) = num("--loss")? {
        imp = imp.loss(p / 100.0);
    }
    if let Some(enter) = num("--burst-enter")? {
        let exit = num("--burst-exit")?.unwrap_or(25.0);
        imp = imp.bursts(GilbertElliott::new(enter / 100.0, exit / 100.0));
    }
    if let Some(d) = num("--delay-ms")? {
        imp = imp.delay(ms(d));
    }
    if let Some(j) = num("--jitter-ms")? {
        imp = imp.jitter(ms(j));
    }
    if let Some(p) = num("--reorder")? {
        imp = imp.reorder(p / 100.0, ms(num("--reorder-ms")?.unwrap_or(20.0)));
    }
    if let Some(p) = num("--dup")? {
        imp = imp.duplicate(p / 100.0);
    }
    if let Some(kbit) = num("--rate-kbit")? {
        imp = imp.rate(RateLimit::new((kbit * 1000.0 / 8.0) as u64));
    }
    if imp.is_none() {
        return Ok(None);
    }
    let mut c = LinkConditioner::symmetric(imp);
    if let Some(seed) = num("--seed")? {
        c = c.seed(seed as u64);
    }
    c.validate()?;
    Ok(Some(c))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let seconds: f64 = flag("--seconds").map_or(Ok(3.0), |s| s.parse())?;
    let n: usize = flag("--clients").map_or(Ok(4), |s| s.parse())?;
    let metrics: Option<std::net::SocketAddr> = flag("--metrics").map(|s| s.parse()).transpose()?;
    let conditioner = conditioner_from_flags(&flag)?;

    // In a real deployment the key comes from a secret store the backend shares.
    let key = TokenKey::generate(&mut rand::rng());
    let cfg = ServerConfig::new("127.0.0.1:0".parse()?)
        .tokens(key.clone(), PROTOCOL_ID)
        .profile(Profile::Game)
        .channels(CHANNELS)
        .workers(1) // one world, one worker
        .tick(Duration::from_millis(50));
    let cfg = match metrics {
        Some(addr) => cfg.metrics(addr),
        None => cfg,
    };
    let cfg = match conditioner {
        Some(c) => {
            println!("link conditioner, each way: {:?}", c.inbound);
            cfg.conditioner(c)
        }
        None => cfg,
    };
    let server = Server::start(cfg, |_| World::default())?;
    if let Some(addr) = server.metrics_addr() {
        println!("metrics on http://{addr}/metrics (health: /healthz, /readyz)");
    }

    let client_cfg = ClientConfig::new()
        .profile(Profile::Game)
        .channels(CHANNELS);
    // What the backend does for each player who logs in: a token for this server, with the
    // player's name for the server application.
    let issuer = TokenIssuer::new(key, PROTOCOL_ID).valid_for(Duration::from_secs(30));
    let mut players = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("player {i}");
        let servers = [server.local_addr()];
        let token = issuer.issue_with_data(i as u64, &servers, name.as_bytes())?;
        players.push(Client::connect_blocking(&token, client_cfg.clone())?);
    }
    let mut seen: Vec<Seen> = (0..n).map(|_| Seen::default()).collect();

    // The game loop: 60 frames a second; every second each player says something.
    let start = Instant::now();
    let mut frame = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        for (i, (c, s)) in players.iter_mut().zip(&mut seen).enumerate() {
            if frame % 60 == (i as u64 * 7) % 60 {
                c.send(CHAT, format!("player {i}: frame {frame}").into_bytes())?;
            }
            for event in c.update()? {
                match event {
                    ClientEvent::Message {
                        channel: STATE,
                        data,
                    } => {
                        let tick = u32::from_le_bytes(data[..4].try_into()?);
                        // Sequenced: never older than what we have.
                        if tick <= s.last_tick {
                            s.stale += 1;
                        }
                        s.last_tick = tick;
                        s.snapshots += 1;
                    }
                    ClientEvent::Message { .. } => s.chat += 1,
                    ClientEvent::Disconnected { reason, .. } => {
                        return Err(format!("{reason:?}").into())
                    }
                    _ => {}
                }
            }
        }
        frame += 1;
        std::thread::sleep(Duration::from_millis(16));
    }

    for (i, (c, s)) in players.iter().zip(&seen).enumerate() {
        let rtt = c.stats().map_or(Duration::ZERO, |st| st.rtt);
        println!(
            "player {i}: {} snapshots (last tick {}, {} stale), {} chat lines, RTT {rtt:?}",
            s.snapshots, s.last_tick, s.stale, s.chat
        );
    }
    for c in &mut players {
        c.close();
    }
    for _ in 0..10 {
        players.iter_mut().try_for_each(|c| c.update().map(drop))?;
        std::thread::sleep(Duration::from_millis(5));
    }
    server.shutdown()?;
    Ok(())
}
