//! The harness's accounting is exact: a test server that drops, duplicates, reorders and
//! corrupts on purpose produces exactly the counts it should.

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Result;
use bench::schema::{ServerInfo, UdpConfig};
use bench::udp::message::Header;
use bench::udp::run::run_udp_against;
use bench::udp::server::EchoServer;

/// Misbehaves by sequence number, mod 50: 3 dropped, 10 echoed twice, 20 held back and sent
/// after the client's next datagram, 30 echoed with one payload byte flipped.
struct Misbehaving {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Misbehaving {
    fn start() -> Misbehaving {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(10)))
            .unwrap();
        let addr = socket.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            let mut held: HashMap<SocketAddr, Vec<u8>> = HashMap::new();
            while !flag.load(Ordering::Relaxed) {
                let Ok((n, from)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                let data = buf[..n].to_vec();
                let seq = Header::decode(&data).unwrap().seq;
                let release = held.remove(&from);
                match seq % 50 {
                    3 => {}
                    10 => {
                        socket.send_to(&data, from).unwrap();
                        socket.send_to(&data, from).unwrap();
                    }
                    20 => {
                        held.insert(from, data);
                    }
                    30 => {
                        let mut bad = data.clone();
                        let last = bad.len() - 1;
                        bad[last] ^= 0x01;
                        socket.send_to(&bad, from).unwrap();
                    }
                    _ => {
                        socket.send_to(&data, from).unwrap();
                    }
                }
                if let Some(h) = release {
                    socket.send_to(&h, from).unwrap();
                }
            }
        });
        Misbehaving {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl EchoServer for Misbehaving {
    fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    fn shutdown(mut self: Box<Self>) -> Result<ServerInfo> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        Ok(ServerInfo {
            kind: "misbehaving".into(),
            io_model: "shared".into(),
            threads: 1,
            backend: "std".into(),
            selection_reason: "test".into(),
            sockets: Vec::new(),
            workers: Vec::new(),
            sessions_per_worker: None,
            forwarded: None,
        })
    }
}

fn config(clients: usize, window: usize, messages: u64, drain_s: f64) -> UdpConfig {
    UdpConfig {
        payload: 200,
        clients,
        window,
        server: "misbehaving".into(),
        io_model: "shared".into(),
        io_threads: 1,
        backend: "std".into(),
        idle: "balanced".into(),
        pin_cores: true,
        work_ns: 0,
        warmup_s: 0.0,
        seconds: 20.0,
        drain_s,
        messages: Some(messages),
        address_family: "ipv4".into(),
        recv_buffer: None,
        send_buffer: None,
        client_io: "mmsg".into(),
    }
}

#[test]
fn drops_duplicates_reorders_and_corruption_are_counted_exactly() {
    let clients = 3u64;
    // The drain must outlast any scheduling delay on a loaded machine: the dropped messages
    // keep it waiting the whole time, and a slow legitimate echo must not count as lost.
    let cfg = config(clients as usize, 8, 200, 2.0);
    let run = run_udp_against(&cfg, "misbehaving", Box::new(Misbehaving::start()));
    let m = run.phases.measured;
    // Per client, seqs 0..200 hold 4 of each misbehaviour.
    assert_eq!(m.sent, 200 * clients, "{run:#?}");
    assert_eq!(m.lost, 4 * clients, "{run:#?}");
    assert_eq!(m.duplicated, 4 * clients, "{run:#?}");
    assert_eq!(m.out_of_order, 4 * clients, "{run:#?}");
    assert_eq!(m.content_errors, 4 * clients, "{run:#?}");
    assert_eq!(m.received, (200 - 8) * clients, "{run:#?}");
    assert_eq!(m.late, 0);
    assert_eq!(m.send_errors + m.recv_errors, 0);
    assert_eq!(run.phases.warmup, Default::default());
    assert_eq!(run.phases.drain, Default::default());
    assert!(!run.ok);
    assert!(
        run.errors.iter().any(|e| e.contains("12 lost")),
        "{:?}",
        run.errors
    );
    // RTTs are recorded for intact measured echoes only.
    assert_eq!(run.rtt_us.unwrap().count, m.received);
}

#[test]
fn a_well_behaved_server_is_ok() {
    // Sequence numbers below 3 see no misbehaviour.
    let cfg = config(2, 2, 3, 10.0);
    let run = run_udp_against(&cfg, "clean", Box::new(Misbehaving::start()));
    let m = run.phases.measured;
    assert_eq!(
        (m.sent, m.received, m.errors(), m.out_of_order),
        (6, 6, 0, 0),
        "{run:#?}"
    );
    assert!(run.ok, "{:?}", run.errors);
    assert_eq!(run.round_trips, 6);
}
