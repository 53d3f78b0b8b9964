//! The attack suite from outside the server's process: the server runs in a process of its own
//! (this test binary, started again as `server_process`), is killed (`SIGKILL`) and started
//! again between phases, and the attacker only has real sockets on loopback.
//!
//! - Stateless resets captured in one boot of the server end no session of a later one: over
//!   100 restarts, with sessions on each, no server connection id repeats, and every reset an
//!   on-path attacker collected earlier, replayed to every later session, ends none of them
//!   (while the genuine reset of each boot's sessions, after the next restart, still ends it).
//! - A host behind the player's address replaying the player's captured hello as fast as this
//!   test can send, and echoing every challenge it draws, does not keep the player out: it
//!   connects within a second.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ricochet::runtime::{Handler, Server, ServerConfig, ServerContext, SessionId};
use ricochet::{Client, ClientConfig, ClientEvent, IoModel, TokenKey};
use ricochet_proto::wire::{self, ConnectionId, Packet, PacketType};
use ricochet_proto::{CloseReason, Endpoint, EndpointConfig};

const TOKEN_KEY: [u8; 32] = *b"restart suite backend token key!";
const PROTOCOL_ID: u64 = 0x0072_6573_7461_7274;

/// What the parent tells the server process (environment variables, read by
/// [`server_process`] only).
const ENV_PUBLIC: &str = "RICOCHET_ATTACK_SERVER_PUBLIC";
const ENV_WORKERS: &str = "RICOCHET_ATTACK_SERVER_WORKERS";
const ENV_BUDGET: &str = "RICOCHET_ATTACK_SERVER_HANDSHAKE_BUDGET";

// ---------------------------------------------------------------------------------------------
// The server process.

struct Echo;

impl Handler for Echo {
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
        let _ = ctx.send(s, channel, data);
    }
}

/// The server, when this binary runs as the server process (the tests below start it with
/// the environment set); otherwise it returns at once. Prints `listening <address>`, then
/// serves until its standard input closes (the parent ended) or it is killed.
#[test]
#[ignore = "the server process the attack tests start"]
fn server_process() {
    let Ok(workers) = std::env::var(ENV_WORKERS) else {
        return;
    };
    let mut cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.udp.io_model = IoModel::PerCore;
    cfg.udp.io_threads = workers.parse().expect("a worker count");
    if let Ok(public) = std::env::var(ENV_PUBLIC) {
        cfg = cfg.public_address(public.parse().expect("a public address"));
    }
    if let Ok(budget) = std::env::var(ENV_BUDGET) {
        if let Some(listen) = cfg.endpoint.server.as_mut() {
            listen.max_handshakes_per_address = budget.parse().expect("a budget");
        }
    }
    // No seed: each boot draws its own from the OS, as a production server does.
    let cfg = cfg.tokens(TokenKey::from_bytes(TOKEN_KEY), PROTOCOL_ID);
    let server = Server::start(cfg, |_| Echo).expect("the server starts");
    println!("listening {}", server.local_addr());
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    let _ = server.shutdown();
}

/// A running server process.
struct ServerProcess {
    child: Child,
    addr: SocketAddr,
}

impl ServerProcess {
    fn start(workers: usize, public: Option<SocketAddr>, budget: Option<u32>) -> ServerProcess {
        let exe = std::env::current_exe().expect("the test binary");
        let mut cmd = Command::new(exe);
        cmd.args(["server_process", "--exact", "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(ENV_WORKERS, workers.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(p) = public {
            cmd.env(ENV_PUBLIC, p.to_string());
        }
        if let Some(b) = budget {
            cmd.env(ENV_BUDGET, b.to_string());
        }
        let mut child = cmd.spawn().expect("the server process starts");
        let out = child.stdout.take().expect("its standard output");
        let mut lines = BufReader::new(out).lines();
        let addr = loop {
            let line = lines
                .next()
                .expect("the server process said where it listens")
                .expect("its output");
            // The test harness prints the test's name on the same line first.
            if let Some((_, a)) = line.split_once("listening ") {
                break a.trim().parse().expect("an address");
            }
        };
        ServerProcess { child, addr }
    }

    /// `kill -9`: the server keeps no state, and says nothing to its clients.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn token(client_id: u64, servers: &[SocketAddr]) -> ricochet::ConnectToken {
    ricochet::backend::issue_token(
        &TokenKey::from_bytes(TOKEN_KEY),
        PROTOCOL_ID,
        client_id,
        servers,
        Duration::from_secs(300),
        b"",
    )
    .expect("a token")
}

// ---------------------------------------------------------------------------------------------
// The on-path attacker: a relay at the server's public address, in front of whichever server
// process runs now, that records what crosses it.

#[derive(Default)]
struct RelayLog {
    /// The destination (server) connection ids of each client's connection packets, by the
    /// client's port.
    server_cids: HashMap<u16, HashSet<ConnectionId>>,
    /// Every stateless reset the servers sent to a client.
    resets: Vec<Vec<u8>>,
}

struct Relay {
    front: UdpSocket,
    server: Arc<Mutex<SocketAddr>>,
    log: Arc<Mutex<RelayLog>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Relay {
    fn start() -> Relay {
        let front = UdpSocket::bind("127.0.0.1:0").unwrap();
        front.set_nonblocking(true).unwrap();
        let server = Arc::new(Mutex::new(front.local_addr().unwrap()));
        let log = Arc::new(Mutex::new(RelayLog::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (f, srv, lg, st) = (
            front.try_clone().unwrap(),
            server.clone(),
            log.clone(),
            stop.clone(),
        );
        let thread = std::thread::spawn(move || {
            // One socket towards the server per client, as a NAT would.
            let mut backs: Vec<(SocketAddr, UdpSocket)> = Vec::new();
            let mut buf = vec![0u8; 65_536];
            while !st.load(Ordering::Relaxed) {
                let mut busy = false;
                while let Ok((n, client)) = f.recv_from(&mut buf) {
                    busy = true;
                    let p = &buf[..n];
                    if p.first().is_some_and(|&t| t >= PacketType::Data as u8) {
                        if let Some(cid) = wire::peek_cid(p) {
                            let mut l = lg.lock().unwrap();
                            l.server_cids.entry(client.port()).or_default().insert(cid);
                        }
                    }
                    let i = match backs.iter().position(|(c, _)| *c == client) {
                        Some(i) => i,
                        None => {
                            let b = UdpSocket::bind("127.0.0.1:0").unwrap();
                            b.set_nonblocking(true).unwrap();
                            backs.push((client, b));
                            backs.len() - 1
                        }
                    };
                    let to = *srv.lock().unwrap();
                    let _ = backs[i].1.send_to(p, to);
                }
                for (client, back) in &backs {
                    while let Ok((n, _)) = back.recv_from(&mut buf) {
                        busy = true;
                        let p = &buf[..n];
                        if p.first() == Some(&(PacketType::StatelessReset as u8)) {
                            lg.lock().unwrap().resets.push(p.to_vec());
                        }
                        let _ = f.send_to(p, *client);
                    }
                }
                if !busy {
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
        });
        Relay {
            front,
            server,
            log,
            stop,
            thread: Some(thread),
        }
    }

    fn addr(&self) -> SocketAddr {
        self.front.local_addr().unwrap()
    }

    fn point_at(&self, server: SocketAddr) {
        *self.server.lock().unwrap() = server;
    }

    /// Sends `p` to `client` as the server (from the address the client talks to).
    fn to_client(&self, client: SocketAddr, p: &[u8]) {
        let _ = self.front.send_to(p, client);
    }

    fn resets(&self) -> Vec<Vec<u8>> {
        self.log.lock().unwrap().resets.clone()
    }

    fn forget(&self, client: &Client) {
        let port = client.local_addr().port();
        self.log.lock().unwrap().server_cids.remove(&port);
    }

    fn server_cids_of(&self, client: &Client) -> HashSet<ConnectionId> {
        let port = client.local_addr().port();
        let l = self.log.lock().unwrap();
        l.server_cids.get(&port).cloned().unwrap_or_default()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sends one message and waits for its echo; panics on any other event.
fn echo(c: &mut Client, k: u64) {
    let m = Bytes::from(k.to_be_bytes().to_vec());
    c.send(0, m.clone()).expect("the session is open");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        assert!(Instant::now() < deadline, "no echo of message {k}");
        c.wait(Duration::from_millis(2)).unwrap();
        match c.poll_event() {
            Some(ClientEvent::Message { data, .. }) if data == m => return,
            Some(e) => panic!("unexpected event {e:?}"),
            None => {}
        }
    }
}

/// Runs `c` until it reports how it ended, within `within`.
fn ended(c: &mut Client, within: Duration) -> Option<CloseReason> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let _ = c.wait(Duration::from_millis(2));
        while let Some(e) = c.poll_event() {
            if let ClientEvent::Disconnected { reason, .. } = e {
                return Some(reason);
            }
        }
    }
    None
}

/// Over 100 restarts of a two-worker server process, three sessions per boot: no server
/// connection id repeats, and no reset from an earlier boot ends a later session.
///
/// Before, a worker's ids kept 7 random bits per (slot, reuse count), so a restarted server
/// soon handed out ids of earlier boots, and the reset an on-path attacker had collected for
/// such an id ended the new session at once.
#[test]
fn resets_from_earlier_boots_end_no_session_of_a_later_one() {
    const BOOTS: u64 = 101;
    const SESSIONS: u64 = 3;
    let relay = Relay::start();
    let started = Instant::now();
    let mut seen: HashMap<ConnectionId, u64> = HashMap::new();
    let mut previous: Vec<Client> = Vec::new();
    let mut replayed = 0u64;
    for boot in 0..BOOTS {
        let server = ServerProcess::start(2, Some(relay.addr()), None);
        relay.point_at(server.addr);
        // The previous boot's sessions: their next packet draws the genuine reset of their id,
        // which the attacker on the path records, and which ends each of them.
        let resets_before = relay.resets().len();
        for (k, c) in previous.iter_mut().enumerate() {
            let _ = c.send(0, Bytes::from_static(b"anyone there?"));
            assert_eq!(
                ended(c, Duration::from_secs(3)),
                Some(CloseReason::Reset),
                "boot {boot}: the restarted server resets session {k} of the boot before"
            );
        }
        assert!(relay.resets().len() >= resets_before + previous.len());
        // Their ports may serve this boot's clients.
        for c in previous.drain(..) {
            relay.forget(&c);
        }
        // This boot's sessions.
        let captured = relay.resets();
        let mut clients = Vec::new();
        let mut ids = Vec::new();
        for k in 0..SESSIONS {
            let cfg = ClientConfig::new().connect_timeout(Duration::from_secs(5));
            let mut c = Client::connect_blocking(&token(boot * 10 + k, &[relay.addr()]), cfg)
                .expect("connects");
            // The client's port may have served a session of an earlier boot whose last
            // datagrams the relay read late: count only what this session sends from here.
            relay.forget(&c);
            echo(&mut c, k);
            let of_session = relay.server_cids_of(&c);
            assert_eq!(
                of_session.len(),
                1,
                "boot {boot}: one server connection id per session (port {}: {of_session:?})",
                c.local_addr().port()
            );
            ids.extend(of_session);
            clients.push(c);
        }
        // Every reset collected in earlier boots, replayed to every session of this one from
        // the server's address: none ends a session.
        for c in &clients {
            let at = SocketAddr::from(([127, 0, 0, 1], c.local_addr().port()));
            for r in &captured {
                relay.to_client(at, r);
                replayed += 1;
            }
        }
        for (k, c) in clients.iter_mut().enumerate() {
            // A session a replayed reset ended reports it here (an unexpected event).
            echo(c, 100 + k as u64);
            assert!(
                c.is_connected(),
                "boot {boot}: a replayed reset ended session {k}"
            );
        }
        for id in ids {
            if let Some(earlier) = seen.insert(id, boot) {
                panic!("boot {boot} issued {id:?} again, an id of boot {earlier}");
            }
        }
        previous = clients;
        server.kill();
    }
    println!(
        "{BOOTS} boots ({} restarts), {} sessions, {} distinct server connection ids, {} resets \
         collected, {replayed} replayed, none ended a session; {:.1} s",
        BOOTS - 1,
        BOOTS * SESSIONS,
        seen.len(),
        relay.resets().len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(seen.len() as u64, BOOTS * SESSIONS);
}

// ---------------------------------------------------------------------------------------------
// A replayed hello flood from the player's address.

/// A host behind the player's address (another port of the same IP) replays the player's
/// captured hello as fast as the server answers, and echoes every challenge it draws (with the
/// hello's proof: it lacks the token's keys). The player, from that address, connects within a
/// second; the rates reached are printed.
///
/// The server's per-address handshake budget is lowered to 8 a second so that the flood
/// exceeds it many times over on any machine: before, each of the flood's echoes was counted
/// before its proof was checked, and the flood spent the budget within a millisecond or two of
/// each second.
#[test]
fn a_replayed_hello_flood_from_the_players_address_does_not_keep_it_out() {
    const BUDGET: u32 = 8;
    let server = ServerProcess::start(1, None, Some(BUDGET));
    let token = token(7, &[server.addr]);
    // The hello the attacker captured: the player's own, from an earlier attempt.
    let hello = {
        let mut ep = Endpoint::new(EndpointConfig::default(), Instant::now(), 5);
        ep.connect_with_token(Instant::now(), &token);
        let mut buf = vec![0u8; 2048];
        let t = ep.poll_transmit(Instant::now(), &mut buf).expect("a hello");
        buf[..t.size].to_vec()
    };
    let Ok(Packet::ClientHello { token: Some(_), .. }) = wire::decode_packet(&hello) else {
        panic!("a token hello")
    };
    let attacker = UdpSocket::bind("127.0.0.1:0").unwrap();
    attacker
        .set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (hellos, echoes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let flood = {
        let (a, stop, hellos, echoes, to, hello) = (
            attacker.try_clone().unwrap(),
            stop.clone(),
            hellos.clone(),
            echoes.clone(),
            server.addr,
            hello.clone(),
        );
        // As fast as the server answers: up to `WINDOW` hellos whose challenge has not come
        // back, more after 2 ms without one (those were lost). What spends a budget is echoes,
        // one per challenge; hellos sent faster than the server answers would only be dropped
        // by its socket, with the player's datagrams (volumetric, which no protocol prevents).
        const WINDOW: u64 = 256;
        std::thread::spawn(move || {
            let mut progress = (0u64, Instant::now());
            while !stop.load(Ordering::Relaxed) {
                let answered = echoes.load(Ordering::Relaxed);
                if answered != progress.0 {
                    progress = (answered, Instant::now());
                }
                let stalled = progress.1.elapsed() > Duration::from_millis(2);
                if hellos.load(Ordering::Relaxed) < answered + WINDOW || stalled {
                    if stalled {
                        progress.1 = Instant::now();
                    }
                    for _ in 0..16 {
                        if a.send_to(&hello, to).is_ok() {
                            hellos.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                } else {
                    std::thread::yield_now();
                }
            }
        })
    };
    let answer = {
        let (a, stop, echoes, to) = (
            attacker.try_clone().unwrap(),
            stop.clone(),
            echoes.clone(),
            server.addr,
        );
        std::thread::spawn(move || {
            let Ok(Packet::ClientHello {
                token: Some(section),
                ..
            }) = wire::decode_packet(&hello)
            else {
                return;
            };
            let mut buf = vec![0u8; 2048];
            let mut out = vec![0u8; 2048];
            while !stop.load(Ordering::Relaxed) {
                let Ok((n, _)) = a.recv_from(&mut buf) else {
                    continue;
                };
                if let Ok(Packet::ServerChallenge {
                    client_cid,
                    nonce,
                    timestamp,
                    cookie,
                    ..
                }) = wire::decode_packet(&buf[..n])
                {
                    let echo = Packet::ClientCookieEcho {
                        client_cid,
                        nonce,
                        timestamp,
                        cookie,
                        token: Some(section),
                    };
                    if let Ok(len) = wire::encode_packet(&echo, &mut out) {
                        if a.send_to(&out[..len], to).is_ok() {
                            echoes.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        })
    };
    // The flood runs alone first, as an attacker on a busy NAT would, until it has drawn more
    // echoes within the last second than the budget allows many times over: only then would
    // the old accounting have kept the player out, so only then does the test test anything.
    // How long that takes depends on the machine (a loaded one answers slower), not the verdict.
    let flood_start = Instant::now();
    let (h0, e0) = (
        hellos.load(Ordering::Relaxed),
        echoes.load(Ordering::Relaxed),
    );
    let wanted = u64::from(BUDGET) * 10;
    let mut marks = std::collections::VecDeque::new();
    let last_second = loop {
        std::thread::sleep(Duration::from_millis(25));
        let (now, e) = (Instant::now(), echoes.load(Ordering::Relaxed));
        marks.push_back((now, e));
        while marks
            .front()
            .is_some_and(|&(t, _)| now.duration_since(t) > Duration::from_secs(1))
        {
            marks.pop_front();
        }
        let drawn = e - marks.front().map_or(e0, |&(_, e)| e);
        if flood_start.elapsed() >= Duration::from_secs(1) && drawn >= wanted {
            break drawn;
        }
        assert!(
            flood_start.elapsed() < Duration::from_secs(20),
            "the flood could not draw {wanted} echoes within a second here (last: {drawn}): \
             it would test nothing"
        );
    };
    let connect_start = Instant::now();
    let cfg = ClientConfig::new().connect_timeout(Duration::from_secs(1));
    let result = Client::connect_blocking(&token, cfg);
    let took = connect_start.elapsed();
    // Keep flooding while the session works, then measure the rate over the whole window.
    let mut player = result.expect("the player connects within a second through the flood");
    echo(&mut player, 1);
    let window = flood_start.elapsed();
    let (h1, e1) = (
        hellos.load(Ordering::Relaxed),
        echoes.load(Ordering::Relaxed),
    );
    stop.store(true, Ordering::Relaxed);
    let _ = flood.join();
    let _ = answer.join();
    let secs = window.as_secs_f64();
    println!(
        "replayed hellos at {:.0}/s and echoes of their challenges at {:.0}/s from the player's \
         IP over {secs:.1} s ({last_second} echoes in the second before the player started, \
         budget {BUDGET}/s); the player connected in {:.1} ms",
        (h1 - h0) as f64 / secs,
        (e1 - e0) as f64 / secs,
        took.as_secs_f64() * 1e3
    );
    assert!(took < Duration::from_secs(1));
    drop(player);
    drop(server);
}
