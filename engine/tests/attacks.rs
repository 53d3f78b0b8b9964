//! The attack suite: a running `Server` and `Client` on loopback with protected sessions,
//! and an attacker who sits on the path between them (a tap that forwards, records, holds and
//! injects datagrams) or off it (its own socket). Every forged, replayed, truncated or
//! bit-flipped packet must be dropped, counted by its cause, and change nothing: the session
//! keeps delivering every message, on every channel, and a genuine packet whose number a
//! forgery used is still accepted afterwards.
//!
//! The sessions' keys come from connect tokens, as in production: the test mints each client's
//! token with the backend key the server holds; the attacker has neither and seals its
//! forgeries with a key of its own, or sends no tag at all.

use std::collections::BTreeSet;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ricochet::runtime::{Handler, Server, ServerConfig, ServerContext, SessionId};
use ricochet::{Client, ClientConfig, ClientEvent, IoModel, TokenKey};
use ricochet_proto::fec::FecPolicy;
use ricochet_proto::wire::{self, ConnectionId, Frame, PacketType, Writer, TAG_LEN};
use ricochet_proto::{CloseReason, Config, DropCause, DropCounters, NumberSpace, PacketKey};

/// The backend's token key, which the server holds and the test mints tokens with.
const TOKEN_KEY: [u8; 32] = *b"attack suite backend token key!!";
const PROTOCOL_ID: u64 = 0x6174_7461_636b;
/// The attacker's own key: what a forgery sealed without the session's key looks like.
const ATTACKER_KEY: [u8; 32] = [0xA5; 32];

// ---------------------------------------------------------------------------------------------
// Server: echo, and publish what the attacks must not change.

#[derive(Debug, Clone, Default)]
struct Observed {
    drops: DropCounters,
    /// The one session's accepted packets and delivered messages.
    packets_received: u64,
    messages_delivered: u64,
    /// The one session's packets declared lost and unreliable messages it dropped.
    packets_lost: u64,
    unreliable_dropped: u64,
    sessions: usize,
}

struct Echo {
    seen: Arc<Mutex<Observed>>,
}

impl Handler for Echo {
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
        let _ = ctx.send(s, channel, data);
    }

    fn on_tick(&mut self, ctx: &mut ServerContext<'_>) {
        let sessions: Vec<SessionId> = ctx.sessions().collect();
        let mut o = Observed {
            drops: ctx.endpoint_stats().drops,
            sessions: sessions.len(),
            ..Observed::default()
        };
        if let Some(st) = sessions.first().and_then(|&s| ctx.session_stats(s)) {
            o.packets_received = st.packets_received;
            o.messages_delivered = st.messages_delivered;
            o.packets_lost = st.packets_lost;
            o.unreliable_dropped = st.unreliable_dropped;
        }
        if let Ok(mut g) = self.seen.lock() {
            *g = o;
        }
    }
}

fn protocol(fec: FecPolicy) -> Config {
    let mut c = Config::default();
    c.fec.policy = fec;
    // No keepalive pings during the quiet phases the exact counts are taken in.
    c.keepalive_interval = None;
    c
}

fn start_server(fec: FecPolicy) -> (Server, Arc<Mutex<Observed>>) {
    let mut cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.udp.io_model = IoModel::PerCore;
    cfg.udp.io_threads = 1;
    cfg.udp.tick = Some(Duration::from_millis(2));
    cfg.endpoint.connection = Arc::new(protocol(fec));
    cfg.seed = Some(11);
    let cfg = cfg.tokens(TokenKey::from_bytes(TOKEN_KEY), PROTOCOL_ID);
    let seen = Arc::new(Mutex::new(Observed::default()));
    let s = seen.clone();
    let srv = Server::start(cfg, move |_| Echo { seen: s.clone() }).unwrap();
    (srv, seen)
}

fn observed(o: &Arc<Mutex<Observed>>) -> Observed {
    o.lock().unwrap().clone()
}

/// A client connected to `server` through `to` (the tap, or the server itself), with a token
/// listing both (the client goes to the first; the server checks it is listed).
fn connect(to: SocketAddr, server: SocketAddr, fec: FecPolicy, seed: u64) -> Client {
    let mut cfg = ClientConfig::new().seed(seed);
    cfg.endpoint.connection = Arc::new(protocol(fec));
    let servers: Vec<SocketAddr> = if to == server {
        vec![to]
    } else {
        vec![to, server]
    };
    let token = ricochet::TokenIssuer::new(TokenKey::from_bytes(TOKEN_KEY), PROTOCOL_ID)
        .valid_for(Duration::from_secs(60))
        .issue(seed, &servers)
        .expect("a token");
    let c = Client::connect_blocking(&token, cfg.connect_timeout(Duration::from_secs(10)))
        .expect("connects");
    assert!(c.stats().is_some());
    c
}

// ---------------------------------------------------------------------------------------------
// The on-path attacker: a tap between client and server.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// Client to server.
    Up,
    /// Server to client.
    Down,
}

struct TapState {
    client: Mutex<Option<SocketAddr>>,
    captured: Mutex<Vec<(Dir, Vec<u8>)>>,
    forwarded: [AtomicU64; 2],
    /// Hold (do not forward) the next connection packet going this way.
    hold: [AtomicBool; 2],
    held: Mutex<[Option<Vec<u8>>; 2]>,
    stop: AtomicBool,
}

struct Tap {
    front: UdpSocket,
    back: UdpSocket,
    state: Arc<TapState>,
    threads: Vec<JoinHandle<()>>,
}

fn idx(d: Dir) -> usize {
    match d {
        Dir::Up => 0,
        Dir::Down => 1,
    }
}

fn is_connection_packet(b: &[u8]) -> bool {
    b.first().is_some_and(|&t| {
        t == PacketType::Data as u8
            || t == PacketType::FecData as u8
            || t == PacketType::FecParity as u8
    })
}

impl Tap {
    fn start(server: SocketAddr) -> Tap {
        let front = UdpSocket::bind("127.0.0.1:0").unwrap();
        let back = UdpSocket::bind("127.0.0.1:0").unwrap();
        back.connect(server).unwrap();
        for s in [&front, &back] {
            s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        }
        let state = Arc::new(TapState {
            client: Mutex::new(None),
            captured: Mutex::new(Vec::new()),
            forwarded: [AtomicU64::new(0), AtomicU64::new(0)],
            hold: [AtomicBool::new(false), AtomicBool::new(false)],
            held: Mutex::new([None, None]),
            stop: AtomicBool::new(false),
        });
        let (f, b, st) = (
            front.try_clone().unwrap(),
            back.try_clone().unwrap(),
            state.clone(),
        );
        let up = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            while !st.stop.load(Ordering::Relaxed) {
                let Ok((n, from)) = f.recv_from(&mut buf) else {
                    continue;
                };
                *st.client.lock().unwrap() = Some(from);
                st.pass(Dir::Up, &buf[..n], |p| {
                    let _ = b.send(p);
                });
            }
        });
        let (f, b, st) = (
            front.try_clone().unwrap(),
            back.try_clone().unwrap(),
            state.clone(),
        );
        let down = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            while !st.stop.load(Ordering::Relaxed) {
                let Ok(n) = b.recv(&mut buf) else {
                    continue;
                };
                let to = *st.client.lock().unwrap();
                if let Some(to) = to {
                    st.pass(Dir::Down, &buf[..n], |p| {
                        let _ = f.send_to(p, to);
                    });
                }
            }
        });
        Tap {
            front,
            back,
            state,
            threads: vec![up, down],
        }
    }

    fn addr(&self) -> SocketAddr {
        self.front.local_addr().unwrap()
    }

    /// Inject towards the server from the session's own path (the tap's server-side address).
    fn to_server(&self, b: &[u8]) {
        self.back.send(b).unwrap();
    }

    /// Inject towards the client from the server's address as the client knows it.
    fn to_client(&self, b: &[u8]) {
        let to = self.state.client.lock().unwrap().expect("client seen");
        self.front.send_to(b, to).unwrap();
    }

    fn inject(&self, d: Dir, b: &[u8]) {
        match d {
            Dir::Up => self.to_server(b),
            Dir::Down => self.to_client(b),
        }
    }

    fn forwarded(&self, d: Dir) -> u64 {
        self.state.forwarded[idx(d)].load(Ordering::SeqCst)
    }

    fn captured(&self, d: Dir) -> Vec<Vec<u8>> {
        self.state
            .captured
            .lock()
            .unwrap()
            .iter()
            .filter(|(x, b)| *x == d && is_connection_packet(b))
            .map(|(_, b)| b.clone())
            .collect()
    }

    /// Forward the held packet, as if it had only been delayed.
    fn release(&self, d: Dir) {
        let held = self.state.held.lock().unwrap()[idx(d)].take();
        if let Some(p) = held {
            self.state.forwarded[idx(d)].fetch_add(1, Ordering::SeqCst);
            self.inject(d, &p);
        }
    }
}

impl TapState {
    fn pass(&self, d: Dir, p: &[u8], forward: impl FnOnce(&[u8])) {
        self.captured.lock().unwrap().push((d, p.to_vec()));
        if is_connection_packet(p)
            && self.hold[idx(d)]
                .compare_exchange(true, false, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            self.held.lock().unwrap()[idx(d)] = Some(p.to_vec());
            return;
        }
        self.forwarded[idx(d)].fetch_add(1, Ordering::SeqCst);
        forward(p);
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Traffic and checks.

/// A session under attack: the client, the server's published view, the tap.
struct Session {
    client: Client,
    server: Arc<Mutex<Observed>>,
    tap: Tap,
    next_msg: u64,
    /// The message whose packet (or whose echo's packet) the tap holds; its echo may arrive
    /// at any time once ARQ repeats it.
    pending_echo: Option<Vec<u8>>,
}

/// How long [`Session::exchange`] waits for unreliable echoes once every reliable one is in.
const UNRELIABLE_GRACE: Duration = Duration::from_millis(300);

fn msg(id: u64, channel: u8, len: usize) -> Vec<u8> {
    let mut m = id.to_be_bytes().to_vec();
    m.push(channel);
    m.extend((0..len).map(|j| (id as usize * 31 + j * 7) as u8));
    m
}

impl Session {
    /// Send `n` messages on each channel and wait for the echoes: every reliable one, intact,
    /// once, in order on the ordered channel; the unreliable ones intact and at most once, all of
    /// them unless a packet was lost or an unreliable message dropped on the way (loopback
    /// drops too, when the tap's socket buffer overflows during a burst). Anything else that
    /// arrives fails the test.
    fn exchange(&mut self, n: usize) {
        let mut want: Vec<BTreeSet<Vec<u8>>> = vec![BTreeSet::new(); 4];
        let mut order = Vec::new();
        for k in 0..n {
            for ch in 0..4u8 {
                let m = msg(self.next_msg, ch, 20 + (k * 37) % 900);
                self.next_msg += 1;
                if ch == 0 {
                    order.push(m.clone());
                }
                want[ch as usize].insert(m.clone());
                self.client.send(ch, Bytes::from(m)).unwrap();
            }
        }
        let mut got_order = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut reliable_done: Option<Instant> = None;
        loop {
            if want[..2].iter().all(|w| w.is_empty()) {
                let at = *reliable_done.get_or_insert_with(Instant::now);
                if want[2..].iter().all(|w| w.is_empty()) || at.elapsed() > UNRELIABLE_GRACE {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "echoes missing: {:?}",
                want.iter().map(|w| w.len()).collect::<Vec<_>>()
            );
            self.client.wait(Duration::from_millis(2)).unwrap();
            while let Some(e) = self.client.poll_event() {
                match e {
                    ClientEvent::Message { channel, data } => {
                        let d = data.to_vec();
                        assert!(
                            want[channel as usize].remove(&d),
                            "an unexpected message arrived on channel {channel} ({} B): forged \
                             data was delivered, or an echo twice",
                            d.len()
                        );
                        if channel == 0 {
                            got_order.push(d);
                        }
                    }
                    other => panic!("unexpected event {other:?}"),
                }
            }
        }
        assert_eq!(got_order, order, "the ordered channel echoes in order");
        let missing: usize = want[2..].iter().map(|w| w.len()).sum();
        if missing > 0 {
            let c = self.client.stats().expect("connected");
            let s = observed(&self.server);
            assert!(
                c.packets_lost + c.unreliable_dropped + s.packets_lost + s.unreliable_dropped > 0,
                "{missing} unreliable echoes missing, yet neither side lost a packet or dropped \
                 an unreliable message"
            );
        }
    }

    /// Let injected datagrams arrive and be processed; nothing may be delivered meanwhile but
    /// the echo of a held message (ARQ repeats what the tap holds).
    fn settle(&mut self) {
        let end = Instant::now() + Duration::from_millis(120);
        while Instant::now() < end {
            self.client.wait(Duration::from_millis(2)).unwrap();
            self.poll_quiet();
        }
    }

    fn poll_quiet(&mut self) {
        while let Some(e) = self.client.poll_event() {
            match e {
                ClientEvent::Message { channel: 1, data }
                    if self.pending_echo.as_deref() == Some(&data[..]) =>
                {
                    self.pending_echo = None;
                }
                e => panic!("event while only attacks were in flight: {e:?}"),
            }
        }
    }

    /// Waits for the echo of the held message.
    fn wait_pending_echo(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.pending_echo.is_some() {
            assert!(
                Instant::now() < deadline,
                "the held message never came back"
            );
            self.client.wait(Duration::from_millis(2)).unwrap();
            self.poll_quiet();
        }
    }

    fn client_drops(&self) -> DropCounters {
        self.client.detail().expect("connected").drops
    }

    fn client_received(&self) -> u64 {
        self.client.stats().expect("connected").packets_received
    }

    /// Both sides accepted exactly the packets the tap forwarded to them (no injected packet
    /// was accepted as the session's), once the traffic is quiet.
    fn accepted_only_forwarded(&mut self, base: (u64, u64, u64, u64)) {
        let (up0, down0, srv0, cli0) = base;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let _ = self.client.update();
            let (up, down) = (self.tap.forwarded(Dir::Up), self.tap.forwarded(Dir::Down));
            let srv = observed(&self.server).packets_received;
            let cli = self.client_received();
            if srv - srv0 == up - up0 && cli - cli0 == down - down0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "accepted ≠ forwarded: server {} of {}, client {} of {}",
                srv - srv0,
                up - up0,
                cli - cli0,
                down - down0
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until nothing crosses the tap for a while.
    fn quiet(&mut self) {
        let mut last = None;
        loop {
            self.client.wait(Duration::from_millis(30)).unwrap();
            self.poll_quiet();
            let now = (self.tap.forwarded(Dir::Up), self.tap.forwarded(Dir::Down));
            if last == Some(now) {
                return;
            }
            last = Some(now);
        }
    }

    fn quiet_base(&mut self) -> (u64, u64, u64, u64) {
        // Wait until ACKs settle: the counts of both sides stop moving.
        let mut last = None;
        loop {
            self.client.wait(Duration::from_millis(20)).unwrap();
            self.poll_quiet();
            let now = (
                self.tap.forwarded(Dir::Up),
                self.tap.forwarded(Dir::Down),
                observed(&self.server).packets_received,
                self.client_received(),
            );
            if last == Some(now) && now.0 == now.2 + self.up_offset() {
                return now;
            }
            last = Some(now);
        }
    }

    /// Up packets the tap forwarded that the server does not count as received: the
    /// handshake (hello, cookie echo) only.
    fn up_offset(&self) -> u64 {
        self.tap
            .state
            .captured
            .lock()
            .unwrap()
            .iter()
            .filter(|(d, b)| *d == Dir::Up && !is_connection_packet(b))
            .count() as u64
    }

    /// Waits for the server's published drop counters to reach `want` in `cause`.
    fn server_drops_reach(&self, cause: DropCause, want: u64) -> DropCounters {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let d = observed(&self.server).drops;
            if d.get(cause) >= want {
                return d;
            }
            assert!(
                Instant::now() < deadline,
                "server {cause:?} drops {} < {want}",
                d.get(cause)
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Holds the next connection packet going `d` (generated by one message from the side
    /// that sends that way), and returns it.
    fn hold_next(&mut self, d: Dir) -> Vec<u8> {
        self.tap.state.hold[idx(d)].store(true, Ordering::SeqCst);
        let m = msg(self.next_msg, 1, 64);
        self.next_msg += 1;
        self.pending_echo = Some(m.clone());
        self.client.send(1, Bytes::from(m)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let _ = self.client.update();
            if let Some(p) = self.tap.state.held.lock().unwrap()[idx(d)].clone() {
                return p;
            }
            assert!(Instant::now() < deadline, "nothing to hold going {d:?}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Asserts that `after` differs from `before` only by `n` in `cause`.
fn only(before: &DropCounters, after: &DropCounters, cause: DropCause, n: u64) {
    exactly(before, after, &[(cause, n)]);
}

/// Asserts that `after` differs from `before` by exactly these counts, and in no other cause.
fn exactly(before: &DropCounters, after: &DropCounters, more: &[(DropCause, u64)]) {
    for c in DropCause::ALL {
        let n: u64 = more.iter().filter(|(x, _)| *x == c).map(|(_, n)| n).sum();
        assert_eq!(
            after.get(c),
            before.get(c) + n,
            "{c:?} drops (expected {more:?} more)"
        );
    }
}

/// The destination cid of a connection packet.
fn cid_of(p: &[u8]) -> ConnectionId {
    wire::peek_cid(p).expect("connection packet")
}

/// A forged `Data` packet to `cid` with packet number `pn` and these frames, sealed with the
/// attacker's key (the tag fails at the receiver).
fn forged(cid: ConnectionId, pn: u64, frames: &[Frame<'_>]) -> Vec<u8> {
    let mut buf = vec![0u8; 1400];
    let h = wire::encode_data_header(cid, pn, &mut buf).unwrap();
    let len = {
        let mut w = Writer::new(&mut buf[h..1300]);
        for f in frames {
            wire::encode_frame(f, &mut w).unwrap();
        }
        h + w.len()
    };
    let n = PacketKey::new(&ATTACKER_KEY)
        .seal_packet(NumberSpace::Data, pn, &mut buf, h, len)
        .unwrap();
    buf.truncate(n);
    buf
}

fn largest_pn(packets: &[Vec<u8>]) -> u64 {
    packets
        .iter()
        .filter_map(|p| wire::clear_header(p).ok())
        .filter(|h| h.ty != PacketType::FecParity)
        .map(|h| h.number)
        .max()
        .unwrap_or(0)
}

fn session(fec: FecPolicy) -> (Server, Session) {
    let (srv, seen) = start_server(fec);
    let tap = Tap::start(srv.local_addr());
    let client = connect(tap.addr(), srv.local_addr(), fec, 5);
    let mut s = Session {
        client,
        server: seen,
        tap,
        next_msg: 0,
        pending_echo: None,
    };
    s.exchange(8);
    (srv, s)
}

// ---------------------------------------------------------------------------------------------
// The attacks.

#[test]
fn on_path_forgeries_are_dropped_counted_and_change_nothing() {
    let (srv, mut s) = session(FecPolicy::Off);
    let base = s.quiet_base();
    let up = s.tap.captured(Dir::Up);
    let down = s.tap.captured(Dir::Down);
    let server_cid = cid_of(&up[0]);
    let client_cid = cid_of(&down[0]);
    let (up_pn, down_pn) = (largest_pn(&up), largest_pn(&down));

    // Forged close, forged data on every channel, forged ping and ACK with near and far packet
    // numbers, unsealed packets: towards the server from the client's own path, towards the
    // client from the server's address.
    let attacks = |cid: ConnectionId, pn: u64| -> Vec<Vec<u8>> {
        let mut v = vec![forged(
            cid,
            pn + 1,
            &[Frame::Close(CloseReason::Application)],
        )];
        for ch in 0..4u8 {
            v.push(forged(
                cid,
                pn + 2 + u64::from(ch),
                &[Frame::Datagram {
                    channel: ch,
                    message_id: 0,
                    data: b"forged message",
                }],
            ));
            v.push(forged(
                cid,
                pn + 10 + u64::from(ch),
                &[Frame::Fragment {
                    channel: ch,
                    message_id: 1_000,
                    index: 0,
                    count: 1,
                    data: b"forged fragment",
                }],
            ));
        }
        for far in [1, 50, 1 << 20, 1 << 40, (1 << 62) - 1, u64::MAX - pn] {
            v.push(forged(cid, pn + far, &[Frame::Ping]));
        }
        let mut ack = vec![0u8; 64];
        let mut w = Writer::new(&mut ack);
        wire::encode_ack(0, 512, &[(0, pn + 100)], &mut w).unwrap();
        let n = w.len();
        let mut buf = vec![0u8; 200];
        let h = wire::encode_data_header(cid, pn + 60, &mut buf).unwrap();
        buf[h..h + n].copy_from_slice(&ack[..n]);
        let sealed = PacketKey::new(&ATTACKER_KEY)
            .seal_packet(NumberSpace::Data, pn + 60, &mut buf, h, h + n)
            .unwrap();
        v.push(buf[..sealed].to_vec());
        // The same close without any tag, as the insecure protocol would send it.
        let mut plain = vec![0u8; 64];
        let h = wire::encode_data_header(cid, pn + 3, &mut plain).unwrap();
        plain[h] = wire::frame_type::CLOSE;
        plain.truncate(h + 2);
        v.push(plain);
        v
    };
    let (before_s, before_c) = (observed(&s.server).drops, s.client_drops());
    let to_server = attacks(server_cid, up_pn);
    let to_client = attacks(client_cid, down_pn);
    for p in &to_server {
        s.tap.to_server(p);
    }
    for p in &to_client {
        s.tap.to_client(p);
    }
    s.settle();
    let after_s = s.server_drops_reach(DropCause::Unauthenticated, to_server.len() as u64);
    only(
        &before_s,
        &after_s,
        DropCause::Unauthenticated,
        to_server.len() as u64,
    );
    only(
        &before_c,
        &s.client_drops(),
        DropCause::Unauthenticated,
        to_client.len() as u64,
    );
    s.accepted_only_forwarded(base);
    // The genuine packets that later use those numbers (pn + 1, + 50, ...) are accepted, and
    // the session still delivers every message on every channel.
    s.exchange(40);
    assert_eq!(observed(&s.server).sessions, 1);
    assert!(s.client.is_connected());
    let end_s = observed(&s.server).drops;
    only(&after_s, &end_s, DropCause::Unauthenticated, 0);
    drop(s);
    srv.shutdown().unwrap();
}

#[test]
fn replays_truncations_and_bit_flips_are_dropped_and_the_genuine_packet_still_counts() {
    let (srv, mut s) = session(FecPolicy::Off);
    for d in [Dir::Up, Dir::Down] {
        // Replays of everything captured so far, from the session's own path.
        let base = s.quiet_base();
        let old = s.tap.captured(d);
        let before = match d {
            Dir::Up => observed(&s.server).drops,
            Dir::Down => s.client_drops(),
        };
        for p in &old {
            s.tap.inject(d, p);
        }
        s.settle();
        let after = match d {
            Dir::Up => s.server_drops_reach(
                DropCause::Replay,
                before.get(DropCause::Replay) + old.len() as u64,
            ),
            Dir::Down => s.client_drops(),
        };
        only(&before, &after, DropCause::Replay, old.len() as u64);
        s.accepted_only_forwarded(base);

        // A packet held on its way: truncated and bit-flipped copies of it arrive first.
        let base = s.quiet_base();
        let held = s.hold_next(d);
        let before = match d {
            Dir::Up => observed(&s.server).drops,
            Dir::Down => s.client_drops(),
        };
        let mut variants = Vec::new();
        let header = wire::clear_header(&held).unwrap().len;
        for cut in [1, TAG_LEN - 1, TAG_LEN, held.len() - header] {
            variants.push(held[..held.len() - cut].to_vec());
        }
        // Every bit after the clear header (ciphertext and tag).
        for bit in header * 8..held.len() * 8 {
            let mut v = held.clone();
            v[bit / 8] ^= 1 << (bit % 8);
            variants.push(v);
        }
        // The packet number in the header: another nonce, so the tag fails too (numbers far
        // above any received, never a replay).
        for bit in 40..64 {
            let mut v = held.clone();
            let at = header - 8 + (7 - bit / 8);
            v[at] ^= 1 << (bit % 8);
            variants.push(v);
        }
        for v in &variants {
            s.tap.inject(d, v);
        }
        s.settle();
        let n = variants.len() as u64;
        let after = match d {
            Dir::Up => s.server_drops_reach(
                DropCause::Unauthenticated,
                before.get(DropCause::Unauthenticated) + n,
            ),
            Dir::Down => s.client_drops(),
        };
        only(&before, &after, DropCause::Unauthenticated, n);
        // Nothing was accepted meanwhile, and the genuine packet, released late, is.
        s.accepted_only_forwarded(base);
        s.tap.release(d);
        s.wait_pending_echo();
        s.accepted_only_forwarded(base);
        let last = match d {
            Dir::Up => observed(&s.server).drops,
            Dir::Down => s.client_drops(),
        };
        only(&after, &last, DropCause::Unauthenticated, 0);
    }
    s.exchange(40);
    drop(s);
    srv.shutdown().unwrap();
}

/// An attacker's own socket (another source address).
fn attacker() -> UdpSocket {
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    a.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    a
}

/// Counts what comes back to the attacker and asserts it is only stateless resets for ids
/// other than `live` (the server has no session for them): nothing for the live session, and
/// none of its traffic.
fn only_resets_reach(a: &UdpSocket, live: ConnectionId) -> u64 {
    let mut buf = [0u8; 2048];
    let mut resets = 0;
    let end = Instant::now() + Duration::from_millis(150);
    while Instant::now() < end {
        if let Ok((n, from)) = a.recv_from(&mut buf) {
            match wire::decode_packet(&buf[..n]) {
                Ok(wire::Packet::StatelessReset { cid, .. }) if cid != live => resets += 1,
                other => panic!("the attacker received {n} B from {from}: {other:?}"),
            }
        }
    }
    resets
}

/// Asserts nothing comes back to the attacker: no reply reveals anything, and the session's
/// traffic was not redirected to it.
fn nothing_reaches(a: &UdpSocket) {
    let mut buf = [0u8; 2048];
    let end = Instant::now() + Duration::from_millis(150);
    while Instant::now() < end {
        if let Ok((n, from)) = a.recv_from(&mut buf) {
            panic!("the attacker received {n} B from {from}");
        }
    }
}

#[test]
fn another_source_address_moves_nothing_and_gets_nothing() {
    let (srv, mut s) = session(FecPolicy::Off);
    let a = attacker();
    let base = s.quiet_base();
    let up = s.tap.captured(Dir::Up);
    let server_cid = cid_of(&up[0]);
    let pn = largest_pn(&up);
    let before = observed(&s.server).drops;
    // Genuine packets replayed from the attacker's address, and forgeries with numbers above
    // the largest (which, were they accepted, would move the session's path to the attacker).
    for p in &up {
        a.send_to(p, srv.local_addr()).unwrap();
    }
    let forgeries: Vec<Vec<u8>> = (1..=20)
        .map(|k| forged(server_cid, pn + k, &[Frame::Ping]))
        .collect();
    for p in &forgeries {
        a.send_to(p, srv.local_addr()).unwrap();
    }
    s.settle();
    let mid = s.server_drops_reach(
        DropCause::Unauthenticated,
        before.get(DropCause::Unauthenticated) + 20,
    );
    exactly(
        &before,
        &mid,
        &[
            (DropCause::Replay, up.len() as u64),
            (DropCause::Unauthenticated, 20),
        ],
    );
    nothing_reaches(&a);
    s.accepted_only_forwarded(base);
    // The server still answers the client through its real path.
    s.exchange(20);
    nothing_reaches(&a);
    drop(s);
    srv.shutdown().unwrap();
}

#[test]
fn off_path_connection_id_guessing_gains_nothing() {
    let (srv, mut s) = session(FecPolicy::Off);
    let a = attacker();
    let server_cid = cid_of(&s.tap.captured(Dir::Up)[0]);
    let base = s.quiet_base();
    let before = observed(&s.server).drops;
    // Blind guesses: random connection ids (a few of them sharing the real id's slot bits),
    // each a close. Then the guess that hits: the real id, without the key.
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let guesses = 3_000u64;
    let mut skipped = 0;
    for k in 0..guesses {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let cid = if k % 3 == 0 {
            ConnectionId((x << 32) | (server_cid.0 & 0xffff_ffff))
        } else {
            ConnectionId(x)
        };
        if cid == server_cid {
            skipped += 1;
            continue;
        }
        a.send_to(
            &forged(cid, k, &[Frame::Close(CloseReason::Application)]),
            srv.local_addr(),
        )
        .unwrap();
    }
    // Numbers above anything the session used, so each one reaches the tag check.
    let hits = 500u64;
    for k in 0..hits {
        a.send_to(
            &forged(
                server_cid,
                (1 << 30) + k,
                &[Frame::Close(CloseReason::Application)],
            ),
            srv.local_addr(),
        )
        .unwrap();
    }
    s.settle();
    let after = s.server_drops_reach(
        DropCause::Unauthenticated,
        before.get(DropCause::Unauthenticated) + hits,
    );
    exactly(
        &before,
        &after,
        &[
            (DropCause::UnknownConnection, guesses - skipped),
            (DropCause::Unauthenticated, hits),
        ],
    );
    // Nothing comes back for the live id (a reply would reveal the client's id), and the
    // session is untouched. Each guessed id draws at most a stateless reset (within the
    // server's reset rate): the server has no session for it, and the reset of an id that is
    // not live ends nothing, now or later (ids never repeat). A guess of a live id succeeds with
    // probability 2^-35 per session in its slot.
    let resets = only_resets_reach(&a, server_cid);
    assert!(
        resets <= guesses - skipped,
        "{resets} resets for {guesses} guesses"
    );
    s.accepted_only_forwarded(base);
    assert!(s.client.is_connected());
    assert_eq!(observed(&s.server).sessions, 1);
    s.exchange(20);
    drop(s);
    srv.shutdown().unwrap();
}

#[test]
fn packets_older_than_the_replay_window_are_refused_as_too_old() {
    let (srv, mut s) = session(FecPolicy::Off);
    let first = s.tap.captured(Dir::Up);
    // Well over 1,024 packets later...
    for _ in 0..12 {
        s.exchange(50);
    }
    let up = s.tap.captured(Dir::Up);
    assert!(
        largest_pn(&up) > largest_pn(&first) + ricochet_proto::REPLAY_WINDOW,
        "not enough traffic: {} packets",
        largest_pn(&up)
    );
    let base = s.quiet_base();
    let before = observed(&s.server).drops;
    for p in &first {
        s.tap.to_server(p);
    }
    s.settle();
    let after = s.server_drops_reach(
        DropCause::TooOld,
        before.get(DropCause::TooOld) + first.len() as u64,
    );
    only(&before, &after, DropCause::TooOld, first.len() as u64);
    s.accepted_only_forwarded(base);
    s.exchange(10);
    drop(s);
    srv.shutdown().unwrap();
}

#[test]
fn fec_packets_are_authenticated_before_the_fec_receiver_sees_them() {
    let (srv, mut s) = session(FecPolicy::Fixed { parity: 1 });
    s.exchange(30);
    let up = s.tap.captured(Dir::Up);
    let data: Vec<&Vec<u8>> = up
        .iter()
        .filter(|p| p[0] == PacketType::FecData as u8)
        .collect();
    let parity: Vec<&Vec<u8>> = up
        .iter()
        .filter(|p| p[0] == PacketType::FecParity as u8)
        .collect();
    assert!(
        !data.is_empty() && !parity.is_empty(),
        "FEC traffic captured"
    );
    let before = observed(&s.server).drops;
    // Replays of data shards and repairs: refused by their spaces' windows.
    for p in data.iter().chain(&parity) {
        s.tap.to_server(p);
    }
    // Forged repairs: fresh parity numbers, the attacker's key.
    let key = PacketKey::new(&ATTACKER_KEY);
    let mut forged_fec = Vec::new();
    for (k, p) in parity.iter().enumerate() {
        let mut f = p[..p.len() - TAG_LEN].to_vec();
        f[10..18].copy_from_slice(&(1_000_000 + k as u64).to_be_bytes());
        f.extend_from_slice(&[0; TAG_LEN]);
        let len = f.len() - TAG_LEN;
        key.seal_packet(NumberSpace::Parity, 1_000_000 + k as u64, &mut f, 18, len)
            .unwrap();
        forged_fec.push(f);
    }
    for p in &forged_fec {
        s.tap.to_server(p);
    }
    s.settle();
    let replays = (data.len() + parity.len()) as u64;
    s.server_drops_reach(DropCause::Replay, before.get(DropCause::Replay) + replays);
    let after = s.server_drops_reach(
        DropCause::Unauthenticated,
        before.get(DropCause::Unauthenticated) + parity.len() as u64,
    );
    exactly(
        &before,
        &after,
        &[
            (DropCause::Replay, replays),
            (DropCause::Unauthenticated, parity.len() as u64),
        ],
    );

    // A data shard held on its way: copies with a flipped bit in its FEC header (clear but
    // authenticated), in its protected bytes, or forged under the attacker's key, arrive
    // first; then the genuine one, which is accepted.
    s.quiet();
    let held = s.hold_next(Dir::Up);
    assert_eq!(held[0], PacketType::FecData as u8, "a data shard is held");
    let before = observed(&s.server).drops;
    let mut variants = Vec::new();
    for at in [10, 11, 12, held.len() - TAG_LEN - 1, held.len() - 1] {
        for bit in [0, 6, 7] {
            let mut v = held.clone();
            v[at] ^= 1 << bit;
            variants.push(v);
        }
    }
    let mut f = held.clone();
    let len = f.len() - TAG_LEN;
    let h = wire::clear_header(&f).unwrap();
    key.seal_packet(NumberSpace::Data, h.number, &mut f, h.len, len)
        .unwrap();
    variants.push(f);
    for v in &variants {
        s.tap.to_server(v);
    }
    s.settle();
    let n = variants.len() as u64;
    let after = s.server_drops_reach(
        DropCause::Unauthenticated,
        before.get(DropCause::Unauthenticated) + n,
    );
    only(&before, &after, DropCause::Unauthenticated, n);
    s.tap.release(Dir::Up);
    s.wait_pending_echo();
    only(
        &after,
        &observed(&s.server).drops,
        DropCause::Unauthenticated,
        0,
    );
    s.exchange(30);
    drop(s);
    srv.shutdown().unwrap();
}

#[test]
fn an_authenticated_client_migrates_to_its_new_address() {
    // No tap: the client talks to the server directly and moves to a new socket twice; the
    // server follows its authenticated packets (forgeries from another address do not move
    // it: see `another_source_address_moves_nothing_and_gets_nothing`).
    let (srv, seen) = start_server(FecPolicy::Off);
    let mut c = connect(srv.local_addr(), srv.local_addr(), FecPolicy::Off, 9);
    let mut next = 0u64;
    let round = |c: &mut Client, next: &mut u64| {
        let msgs: Vec<Vec<u8>> = (0..20)
            .map(|k| {
                *next += 1;
                msg(*next, 0, 100 + k)
            })
            .collect();
        for m in &msgs {
            c.send(0, Bytes::from(m.clone())).unwrap();
        }
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() < msgs.len() {
            assert!(Instant::now() < deadline, "echoes after migration");
            c.wait(Duration::from_millis(2)).unwrap();
            while let Some(e) = c.poll_event() {
                match e {
                    ClientEvent::Message { data, .. } => got.push(data.to_vec()),
                    other => panic!("unexpected event {other:?}"),
                }
            }
        }
        assert_eq!(got, msgs);
    };
    round(&mut c, &mut next);
    for _ in 0..2 {
        let old = c.local_addr();
        c.rebind().unwrap();
        assert_ne!(c.local_addr(), old);
        round(&mut c, &mut next);
    }
    // The server's view is published from its tick: wait for one after the last round.
    let deadline = Instant::now() + Duration::from_secs(5);
    while observed(&seen).messages_delivered < next {
        assert!(Instant::now() < deadline, "{:?}", observed(&seen));
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(observed(&seen).sessions, 1);
    assert_eq!(
        observed(&seen).drops.total(),
        0,
        "{:?}",
        observed(&seen).drops
    );
    drop(c);
    srv.shutdown().unwrap();
}
