//! The link conditioner end to end (loopback): set on a running server, it shows its loss and
//! delay in the client's `SessionStats`; a client's own conditioner delays its sends.
#![cfg(feature = "conditioner")]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ricochet::runtime::{Handler, Server, ServerConfig, ServerContext, SessionId};
use ricochet::{Client, ClientConfig, ClientEvent, Impairment, LinkConditioner, SessionStats};

struct Echo;
impl Handler for Echo {
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
        let _ = ctx.send(s, channel, data);
    }
}

fn server(cfg: ServerConfig) -> Server {
    Server::start(cfg.insecure().workers(1), |_| Echo).unwrap()
}

fn config() -> ServerConfig {
    ServerConfig::new("127.0.0.1:0".parse().unwrap())
}

fn connect(addr: SocketAddr, cfg: ClientConfig) -> Client {
    Client::connect_insecure_blocking(addr, cfg.connect_timeout(Duration::from_secs(10))).unwrap()
}

/// Send one unreliable message per millisecond until the client has sent `packets` more
/// packets (or `limit` passes); returns the stats at the end.
fn stream(c: &mut Client, packets: u64, limit: Duration) -> SessionStats {
    let start = c.stats().unwrap().packets_sent;
    let deadline = Instant::now() + limit;
    loop {
        let s = c.stats().unwrap();
        if s.packets_sent - start >= packets {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "only {} packets sent",
            s.packets_sent - start
        );
        c.send(2, &[7u8; 100][..]).unwrap();
        for ev in c.update().unwrap() {
            if let ClientEvent::Disconnected { reason, .. } = ev {
                panic!("session closed: {reason:?}");
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Let in-flight packets be acknowledged or declared lost (a few RTOs).
fn settle(c: &mut Client, for_: Duration) -> SessionStats {
    let end = Instant::now() + for_;
    while Instant::now() < end {
        c.send(2, &[1u8; 10][..]).unwrap();
        let _ = c.wait(Duration::from_millis(5)).unwrap().count();
    }
    c.stats().unwrap()
}

#[test]
fn five_percent_loss_and_fifty_ms_each_way_show_in_session_stats() {
    let srv = server(config());
    // Without congestion control the client keeps its rate under loss (NewReno would shrink
    // its window to a few packets per RTT and the test would take minutes).
    let cfg = ClientConfig::new().session(|c| c.congestion_control = false);
    let mut c = connect(srv.local_addr(), cfg);
    let base = stream(&mut c, 500, Duration::from_secs(20));
    let base_rtt = base.rtt;
    assert!(
        base_rtt < Duration::from_millis(20),
        "loopback rtt {base_rtt:?}"
    );

    // Turned on while running: the client's packets meet 5 % loss and 50 ms on the way in,
    // the server's (echoes and ACKs) 5 % and 50 ms on the way out.
    let each_way = Impairment::new()
        .loss(0.05)
        .delay(Duration::from_millis(50));
    srv.set_conditioner(Some(LinkConditioner::symmetric(each_way).seed(11)))
        .unwrap();
    let before = settle(&mut c, Duration::from_millis(300));
    // 6000 client packets: at p = 0.05 the standard error of the loss share is 0.28 %, so
    // 4-6 % is ±3.5 standard errors (and the seeded draws make the outcome repeatable).
    stream(&mut c, 6_000, Duration::from_secs(60));
    let after = settle(&mut c, Duration::from_secs(2));
    let sent = after.packets_sent - before.packets_sent;
    let lost = after.packets_lost - before.packets_lost;
    let share = lost as f64 / sent as f64;
    let added = after.rtt.saturating_sub(base_rtt);
    eprintln!(
        "sent {sent} lost {lost} ({:.2} %), rtt {:?} (loopback {:?}), min_rtt {:?}",
        share * 100.0,
        after.rtt,
        base_rtt,
        after.min_rtt
    );
    assert!((0.04..=0.06).contains(&share), "loss {share}");
    assert!(
        added >= Duration::from_millis(95) && added <= Duration::from_millis(130),
        "added rtt {added:?}"
    );
    let counters = srv.counters();
    let dropped: u64 = counters.iter().map(|w| w.conditioner_lost).sum();
    assert!(dropped > 0, "the server counts what its conditioner lost");

    // Off again: the RTT comes back down.
    srv.set_conditioner(None).unwrap();
    let end = settle(&mut c, Duration::from_secs(3));
    assert!(
        end.rtt < Duration::from_millis(40),
        "rtt after off {:?}",
        end.rtt
    );
}

#[test]
fn a_client_conditioner_delays_its_sends_and_receives() {
    let srv = server(config());
    let each_way = Impairment::new().delay(Duration::from_millis(30));
    let cfg = ClientConfig::new().conditioner(LinkConditioner::symmetric(each_way));
    let mut c = connect(srv.local_addr(), cfg);
    let s = stream(&mut c, 200, Duration::from_secs(20));
    assert!(
        s.min_rtt >= Duration::from_millis(60),
        "min rtt {:?}",
        s.min_rtt
    );
    assert!(s.rtt < Duration::from_millis(120), "rtt {:?}", s.rtt);
}

#[test]
fn a_conditioner_set_at_start_applies_and_bad_settings_are_refused() {
    let delay = Impairment::new().delay(Duration::from_millis(25));
    let srv = server(config().conditioner(LinkConditioner::new(Impairment::new(), delay)));
    let mut c = connect(srv.local_addr(), ClientConfig::new());
    let s = stream(&mut c, 200, Duration::from_secs(20));
    assert!(
        s.min_rtt >= Duration::from_millis(25),
        "min rtt {:?}",
        s.min_rtt
    );
    let bad = LinkConditioner::symmetric(Impairment::new().loss(2.0));
    assert!(srv.set_conditioner(Some(bad)).is_err());
    assert!(Server::start(config().insecure().conditioner(bad), |_| Echo).is_err());
    assert!(
        Client::connect_insecure(srv.local_addr(), ClientConfig::new().conditioner(bad)).is_err()
    );
    // The worker's last turn sends the held closes at once: the client is told.
    srv.shutdown().unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    let mut told = false;
    while !told && Instant::now() < end {
        for ev in c.wait(Duration::from_millis(10)).unwrap() {
            if let ClientEvent::Disconnected { by_peer, .. } = ev {
                told = by_peer;
            }
        }
    }
    assert!(told, "the client saw the server's close");
}

struct RawEcho;
impl ricochet::runtime::DatagramHandler for RawEcho {
    fn on_datagram(
        &mut self,
        ctx: &mut ricochet::runtime::UdpContext<'_>,
        from: SocketAddr,
        data: &[u8],
    ) {
        let _ = ctx.send(from, data);
    }
}

/// Send `n` numbered datagrams to `server` and collect the echoes for `wait`.
fn raw_round(sock: &std::net::UdpSocket, server: SocketAddr, n: u32, wait: Duration) -> Vec<u32> {
    for i in 0..n {
        sock.send_to(&i.to_le_bytes(), server).unwrap();
    }
    let mut got = Vec::new();
    let end = Instant::now() + wait;
    let mut buf = [0u8; 64];
    while Instant::now() < end {
        if let Ok((len, _)) = sock.recv_from(&mut buf) {
            if len == 4 {
                got.push(u32::from_le_bytes(buf[..4].try_into().unwrap()));
            }
        }
    }
    got
}

#[test]
fn a_raw_udp_server_duplicates_and_delays_then_turns_off_cleanly() {
    use ricochet::runtime::{UdpServer, UdpServerConfig};
    let mut cfg = UdpServerConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.io_threads = 1;
    let srv = UdpServer::start(cfg, |_| RawEcho).unwrap();
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let addr = srv.local_addr();
    // Off: one echo each, at once.
    let got = raw_round(&sock, addr, 50, Duration::from_millis(300));
    assert_eq!(got.len(), 50);
    // Every datagram duplicated on the way in and delayed 40 ms on the way out: four echoes.
    let c = LinkConditioner::new(
        Impairment::new().duplicate(1.0),
        Impairment::new()
            .duplicate(1.0)
            .delay(Duration::from_millis(40)),
    );
    srv.set_conditioner(Some(c)).unwrap();
    let start = Instant::now();
    sock.send_to(&[0u8; 4], addr).unwrap();
    let mut buf = [0u8; 8];
    while sock.recv_from(&mut buf).is_err() {
        assert!(start.elapsed() < Duration::from_secs(2), "no echo");
    }
    let first = start.elapsed();
    let got = raw_round(&sock, addr, 50, Duration::from_millis(500));
    assert!(first >= Duration::from_millis(40), "echo after {first:?}");
    let mut counts = std::collections::HashMap::new();
    for k in &got {
        *counts.entry(*k).or_insert(0u32) += 1;
    }
    // The probe's other three copies may land in this round.
    assert!(counts.get(&0).copied().unwrap_or(0) >= 4, "{counts:?}");
    assert!((1..50).all(|k| counts[&k] == 4), "{counts:?}");
    srv.set_conditioner(None).unwrap();
    let got = raw_round(&sock, addr, 50, Duration::from_millis(300));
    assert_eq!(got.len(), 50, "off again: one echo each");
}

/// Records each session as it connects, so the test can name one.
struct Recorder(std::sync::mpsc::Sender<SessionId>);
impl Handler for Recorder {
    fn on_connect(&mut self, _: &mut ServerContext<'_>, s: SessionId, _: &ricochet::Peer) {
        let _ = self.0.send(s);
    }
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
        let _ = ctx.send(s, channel, data);
    }
}

#[test]
fn one_session_conditioned_beside_another_that_is_not() {
    let (tx, rx) = std::sync::mpsc::channel();
    let srv = Server::start(config().insecure().workers(1), move |_| {
        Recorder(tx.clone())
    })
    .unwrap();
    let mut slow = connect(srv.local_addr(), ClientConfig::new());
    let slow_id = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let mut fast = connect(srv.local_addr(), ClientConfig::new());
    let fast_id = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_ne!(slow_id, fast_id);

    let each_way = Impairment::new().delay(Duration::from_millis(40));
    srv.set_session_conditioner(slow_id, Some(LinkConditioner::symmetric(each_way)))
        .unwrap();
    // Let the worker take it, then measure both side by side.
    settle(&mut slow, Duration::from_millis(200));
    let s = stream(&mut slow, 200, Duration::from_secs(20));
    let f = stream(&mut fast, 200, Duration::from_secs(20));
    eprintln!(
        "conditioned session rtt {:?} (min {:?}), the other {:?} (min {:?})",
        s.rtt, s.min_rtt, f.rtt, f.min_rtt
    );
    assert!(
        s.rtt >= Duration::from_millis(75),
        "conditioned rtt {:?}",
        s.rtt
    );
    assert!(
        f.rtt < Duration::from_millis(20),
        "unconditioned rtt {:?}",
        f.rtt
    );
    assert!(
        f.min_rtt < Duration::from_millis(20),
        "unconditioned min rtt {:?}",
        f.min_rtt
    );

    // Back to the endpoint-wide settings (none): the RTT comes down.
    srv.set_session_conditioner(slow_id, None).unwrap();
    let end = settle(&mut slow, Duration::from_secs(3));
    assert!(
        end.rtt < Duration::from_millis(40),
        "rtt after off {:?}",
        end.rtt
    );
    let bad = LinkConditioner::symmetric(Impairment::new().loss(2.0));
    assert!(srv.set_session_conditioner(fast_id, Some(bad)).is_err());
}
