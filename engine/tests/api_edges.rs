//! The public API's rough edges found by writing a load generator against it (issue 37): each
//! test pins the behaviour the fix gives.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ricochet::runtime::{Handler, Server, ServerConfig, ServerContext, SessionId};
use ricochet::{Client, ClientConfig, ClientError, ClientEvent, ClientSet, Profile, RecoveryStats};

/// Records each tick's index and lateness; tick 3 blocks the worker for `BLOCK`.
struct LateTicks(Arc<Mutex<Vec<(u64, Duration)>>>);

const PERIOD: Duration = Duration::from_millis(10);
const BLOCK: Duration = Duration::from_millis(50);

impl Handler for LateTicks {
    fn on_message(&mut self, _: &mut ServerContext<'_>, _: SessionId, _: u8, _: Bytes) {}
    fn on_tick(&mut self, ctx: &mut ServerContext<'_>) {
        let index = ctx.tick_index().expect("a tick has an index");
        let late = ctx.tick_lateness().expect("a tick has a lateness");
        self.0.lock().unwrap().push((index, late));
        if index == 3 {
            std::thread::sleep(BLOCK);
        }
    }
}

#[test]
fn a_handler_reads_how_late_its_tick_is() {
    let ticks = Arc::new(Mutex::new(Vec::new()));
    let t2 = ticks.clone();
    let mut cfg = ServerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)))
        .insecure()
        .tick(PERIOD);
    cfg.udp.io_threads = 1;
    let srv = Server::start(cfg, move |_| LateTicks(t2.clone())).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !ticks.lock().unwrap().iter().any(|&(i, _)| i > 4) {
        assert!(std::time::Instant::now() < deadline, "ticks did not run");
        std::thread::sleep(PERIOD);
    }
    srv.shutdown().unwrap();
    let ticks = ticks.lock().unwrap();
    // Tick 3 started at or after its due time and held the worker for `BLOCK`: tick 4 (due
    // one period after tick 3) started at least `BLOCK - PERIOD` late.
    let &(_, late4) = ticks.iter().find(|&&(i, _)| i == 4).expect("tick 4 ran");
    assert!(
        late4 >= BLOCK - PERIOD,
        "tick 4 was {late4:?} late: {ticks:?}"
    );
}

/// A socket standing in for a server: clients may send their first datagram to it.
fn sink() -> (std::net::UdpSocket, SocketAddr) {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let a = s.local_addr().unwrap();
    (s, a)
}

#[test]
fn profile_after_session_is_refused_not_silently_discarding_the_session_change() {
    let (_sink, addr) = sink();
    let tuned = |c: &mut ricochet::Config| c.idle_timeout = Duration::from_secs(7);
    // Profile first: the change stands on top of the profile.
    let ok = ClientConfig::new().profile(Profile::Game).session(tuned);
    assert_eq!(ok.endpoint.connection.idle_timeout, Duration::from_secs(7));
    Client::connect_insecure(addr, ok).expect("profile, then session");
    // Channels and profile in either order.
    let kinds = [ricochet::ChannelKind::Unreliable];
    let either = ClientConfig::new().channels(kinds).profile(Profile::Game);
    assert_eq!(either.endpoint.connection.channels, kinds);
    Client::connect_insecure(addr, either).expect("channels, then profile");
    // The other order would lose the change: refused with a message that says so.
    let late = ClientConfig::new().session(tuned).profile(Profile::Game);
    match Client::connect_insecure(addr, late) {
        Err(ClientError::Conflict(why)) => assert!(why.contains("profile"), "{why}"),
        other => panic!("session, then profile: {other:?}"),
    }
}

#[test]
fn server_profile_after_session_is_refused_not_silently_discarding_the_session_change() {
    let tuned = |c: &mut ricochet::Config| c.idle_timeout = Duration::from_secs(7);
    let new = || {
        let mut cfg = ServerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0))).insecure();
        cfg.udp.io_threads = 1;
        cfg
    };
    // Profile first: the change stands on top of the profile.
    let ok = new().profile(Profile::Game).session(tuned);
    assert_eq!(ok.endpoint.connection.idle_timeout, Duration::from_secs(7));
    Server::start(ok, |_| Echo)
        .expect("profile, then session")
        .shutdown()
        .unwrap();
    // Channels and profile in either order.
    let kinds = [ricochet::ChannelKind::Unreliable];
    let either = new().channels(kinds).profile(Profile::Game);
    assert_eq!(either.endpoint.connection.channels, kinds);
    Server::start(either, |_| Echo)
        .expect("channels, then profile")
        .shutdown()
        .unwrap();
    // The other order would lose the change: refused with a message that says so.
    let late = new().session(tuned).profile(Profile::Game);
    match Server::start(late, |_| Echo) {
        Err(ricochet::RuntimeError::Conflict(why)) => assert!(why.contains("profile"), "{why}"),
        Err(other) => panic!("session, then profile: {other:?}"),
        Ok(_) => panic!("session, then profile: started, the session change discarded"),
    }
}

/// Echoes every message.
struct Echo;
impl Handler for Echo {
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
        let _ = ctx.send(s, channel, data);
    }
}

fn echo_server() -> Server {
    let mut cfg = ServerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0))).insecure();
    cfg.udp.io_threads = 1;
    Server::start(cfg, |_| Echo).unwrap()
}

/// Sends `n` reliable messages of `len` bytes and waits for their echoes.
fn echo(c: &mut Client, n: usize, len: usize) {
    for i in 0..n {
        c.send(0, vec![i as u8; len]).unwrap();
    }
    let (mut got, deadline) = (0, std::time::Instant::now() + Duration::from_secs(10));
    while got < n {
        assert!(std::time::Instant::now() < deadline, "{got} of {n} echoes");
        for e in c.wait(Duration::from_millis(5)).unwrap() {
            if matches!(e, ClientEvent::Message { .. }) {
                got += 1;
            }
        }
    }
}

#[test]
fn the_loss_recovery_counters_are_public() {
    let srv = echo_server();
    let mut c = Client::connect_insecure_blocking(srv.local_addr(), ClientConfig::new()).unwrap();
    echo(&mut c, 5, 100);
    let st = c.stats().expect("open");
    let r: RecoveryStats = st.recovery;
    // Five one-fragment messages: five first transmissions, whatever was sent again.
    assert_eq!(r.fragments_first_sent, 5, "{r:?}");
    assert!(r.tail_loss_probes <= st.retransmitted, "{r:?} {st:?}");
    // FEC is off in the default profile.
    assert_eq!(r.fec_groups_unrecoverable, 0, "{r:?}");
    srv.shutdown().unwrap();
}

/// A UDP relay between one client and `server` that counts the UDP payload bytes it carries
/// each way: (client to server, server to client).
struct Relay {
    addr: SocketAddr,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(u64, u64)>,
}

impl Relay {
    fn start(server: SocketAddr) -> Relay {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(5)))
            .unwrap();
        let addr = sock.local_addr().unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut up, mut down, mut client) = (0u64, 0u64, None);
            let mut buf = vec![0u8; 65_536];
            while !stop2.load(std::sync::atomic::Ordering::SeqCst) {
                let Ok((n, from)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                if from == server {
                    if let Some(c) = client {
                        down += n as u64;
                        sock.send_to(&buf[..n], c).unwrap();
                    }
                } else {
                    client = Some(from);
                    up += n as u64;
                    sock.send_to(&buf[..n], server).unwrap();
                }
            }
            (up, down)
        });
        Relay { addr, stop, thread }
    }

    fn finish(self) -> (u64, u64) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().unwrap()
    }
}

#[test]
fn byte_counters_count_wire_bytes_both_ways() {
    let srv = echo_server();
    let relay = Relay::start(srv.local_addr());
    let mut c = Client::connect_insecure_blocking(relay.addr, ClientConfig::new()).unwrap();
    echo(&mut c, 20, 300);
    // Let the last acknowledgements cross before the counts are read.
    let until = std::time::Instant::now() + Duration::from_millis(300);
    while std::time::Instant::now() < until {
        let _ = c.wait(Duration::from_millis(5));
    }
    let st = c.stats().expect("open");
    let (up, down) = relay.finish();
    srv.shutdown().unwrap();
    assert_eq!(st.bytes_sent, up, "{st:?}");
    if st.datagrams_dropped == 0 {
        // Every datagram the relay carried to the client was accepted.
        assert_eq!(st.bytes_received, down, "{st:?}");
    } else {
        assert!(st.bytes_received < down, "{st:?}");
    }
}

/// Refuses the 2nd and the 4th client it is asked to admit; echoes the rest.
struct RefuseSome(u32);
impl Handler for RefuseSome {
    fn on_accept(
        &mut self,
        _: &mut ServerContext<'_>,
        _: &ricochet::proto::Peer,
    ) -> Result<(), ricochet::proto::Refusal> {
        self.0 += 1;
        if self.0 == 2 || self.0 == 4 {
            return Err(ricochet::proto::Refusal::new(9, "not you"));
        }
        Ok(())
    }
    fn on_message(&mut self, _: &mut ServerContext<'_>, _: SessionId, _: u8, _: Bytes) {}
}

#[test]
fn client_set_connect_reports_every_member_and_closes_the_ones_it_gives_up_on() {
    let mut cfg = ServerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)))
        .insecure()
        // Sessions left open would stay far longer than the test.
        .session(|c| c.idle_timeout = Duration::from_secs(60));
    cfg.udp.io_threads = 1;
    let srv = Server::start(cfg, |_| RefuseSome(0)).unwrap();
    let client = ClientConfig::new().session(|c| c.idle_timeout = Duration::from_secs(60));
    let err = ClientSet::connect_insecure(srv.local_addr(), &client, 5, Duration::from_secs(10))
        .expect_err("two members are refused");
    // Both refusals, each with its member's index.
    let mut failed: Vec<usize> = err.other_failures.iter().map(|&(i, _)| i).collect();
    failed.push(err.index.expect("a member"));
    assert_eq!(failed.len(), 2, "{err}");
    for (_, why) in &err.other_failures {
        assert!(
            matches!(why, ClientError::Rejected { code: 9, .. }),
            "{why}"
        );
    }
    assert!(
        matches!(err.source, ClientError::Rejected { code: 9, .. }),
        "{err}"
    );
    // The message names the member by number.
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("client {} of the set", err.index.unwrap())),
        "{text}"
    );
    assert!(!text.contains("Some("), "{text}");
    // The three that connected were closed: the server lets them go at once, not after its
    // idle timeout.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while srv.session_count() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} sessions left open",
            srv.session_count()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    srv.shutdown().unwrap();
}

#[test]
fn client_set_get_mut_is_an_accessor_and_sending_is_explicit() {
    let srv = echo_server();
    let mut set = ClientSet::connect_insecure(
        srv.local_addr(),
        &ClientConfig::new(),
        1,
        Duration::from_secs(10),
    )
    .unwrap();
    // Let the handshake's last datagrams settle: nothing left to send or to answer.
    for _ in 0..5 {
        set.step(Duration::from_millis(10)).unwrap();
    }
    let sent = |set: &ClientSet| set.get(0).unwrap().stats().unwrap().packets_sent;
    let before = sent(&set);
    // A message queued through the accessor stays queued at the next turn...
    set.get_mut(0).unwrap().send(0, &b"quiet"[..]).unwrap();
    set.step(Duration::ZERO).unwrap();
    assert_eq!(sent(&set), before, "get_mut queued the member for sending");
    assert!(set.get(0).unwrap().queued_bytes() > 0);
    // ...until the set is told; `ClientSet::send` tells it.
    set.mark_changed(0);
    set.step(Duration::ZERO).unwrap();
    let marked = sent(&set);
    assert!(marked > before, "{marked} datagrams sent, {before} before");
    set.send(0, 0, &b"loud"[..]).unwrap();
    set.step(Duration::ZERO).unwrap();
    assert!(
        sent(&set) > marked,
        "{} datagrams sent, {marked} before",
        sent(&set)
    );
    srv.shutdown().unwrap();
}

/// The set's rule for `auto` (the readiness backend; a lone client may take io_uring) is
/// reported where a user looks for the backend.
#[test]
fn a_set_member_on_auto_says_why_its_backend_differs_from_a_lone_client() {
    let srv = echo_server();
    let lone = Client::connect_insecure_blocking(srv.local_addr(), ClientConfig::new()).unwrap();
    let set = ClientSet::connect_insecure(
        srv.local_addr(),
        &ClientConfig::new(),
        1,
        Duration::from_secs(10),
    )
    .unwrap();
    let member = set.get(0).unwrap();
    assert!(
        member.selection_reason().contains("ClientSet"),
        "{}",
        member.selection_reason()
    );
    assert!(
        !lone.selection_reason().contains("ClientSet"),
        "{}",
        lone.selection_reason()
    );
    #[cfg(target_os = "linux")]
    if std::env::var_os("RICOCHET_BACKEND").is_none_or(|v| v.is_empty()) {
        assert_eq!(member.backend_kind(), ricochet::platform::BackendKind::Mmsg);
    }
    srv.shutdown().unwrap();
}
