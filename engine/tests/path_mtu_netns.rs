//! Path MTU discovery over real sockets, in two network namespaces the test creates and joined
//! by a veth pair of a given MTU (`ip netns`, which needs root). The server runs in one
//! namespace, the client in the other; both sockets have IP fragmentation off, so a datagram
//! larger than the path is dropped, not fragmented.
//!
//! - a 1,500 B path: the session settles at ≥ 1,400 B datagrams within 2 s;
//! - a 1,280 B path: at the largest size that fits (1,252 B of UDP payload over IPv4);
//! - the veth MTU drops from 1,500 to 1,280 mid-session: both sides shrink within 3 s, and no
//!   reliable message is lost.
//!
//! Skipped, with a message saying why, where namespaces cannot be made (not root, no `ip`).
//! The namespaces are deleted when a test ends, passed or failed.

#![cfg(target_os = "linux")]

use std::fs::File;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ricochet::proto::PathMtuConfig;
use ricochet::runtime::{Handler, Server, ServerConfig, ServerContext, SessionId};
use ricochet::{Client, ClientConfig, ClientEvent};

const SERVER_IP: &str = "10.211.0.1";
const CLIENT_IP: &str = "10.211.0.2";
/// UDP payload of a 1,280 B IPv4 path.
const PAYLOAD_1280: usize = 1280 - 28;

/// Runs `ip args`; the error says what failed.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip`: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Two namespaces, server and client, joined by a veth pair; deleted on drop (deleting a
/// namespace deletes its end of the pair, and with it the pair).
struct Lab {
    server: String,
    client: String,
}

impl Lab {
    /// A lab whose veth pair has `mtu` on both ends, or why not.
    fn new(tag: &str, mtu: u32) -> Result<Lab, String> {
        let id = std::process::id();
        let lab = Lab {
            server: format!("ricochet-pmtu-{tag}-s-{id}"),
            client: format!("ricochet-pmtu-{tag}-c-{id}"),
        };
        ip(&["netns", "add", &lab.server])?;
        // On failure from here on, `lab`'s drop deletes what exists.
        ip(&["netns", "add", &lab.client])?;
        let mtu = mtu.to_string();
        let (s, c) = (lab.server.as_str(), lab.client.as_str());
        // Made inside the server's namespace with its peer in the client's: the host's own
        // network is never touched.
        ip(&[
            "-n", s, "link", "add", "veth-s", "mtu", &mtu, "type", "veth", "peer", "name",
            "veth-c", "mtu", &mtu, "netns", c,
        ])?;
        ip(&[
            "-n",
            s,
            "addr",
            "add",
            &format!("{SERVER_IP}/24"),
            "dev",
            "veth-s",
        ])?;
        ip(&[
            "-n",
            c,
            "addr",
            "add",
            &format!("{CLIENT_IP}/24"),
            "dev",
            "veth-c",
        ])?;
        for (ns, dev) in [(s, "veth-s"), (c, "veth-c"), (s, "lo"), (c, "lo")] {
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(lab)
    }

    /// Changes the MTU of both ends of the pair.
    fn set_mtu(&self, mtu: u32) {
        let mtu = mtu.to_string();
        ip(&["-n", &self.server, "link", "set", "veth-s", "mtu", &mtu]).unwrap();
        ip(&["-n", &self.client, "link", "set", "veth-c", "mtu", &mtu]).unwrap();
    }

    /// Runs `f` on a thread inside namespace `ns`: sockets it opens, and threads it starts
    /// (a server's workers), live there.
    fn within<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{ns}");
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    let file = File::open(&path).expect("namespace file");
                    // SAFETY: `file` is an open network-namespace descriptor for the whole
                    // call; `setns` moves only this (fresh, scoped) thread into it.
                    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                    assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
                    f()
                })
                .join()
                .expect("namespace thread")
        })
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.server]);
        let _ = ip(&["netns", "del", &self.client]);
    }
}

/// A lab, or `None` with the reason printed (the test then passes as skipped).
fn lab(tag: &str, mtu: u32) -> Option<Lab> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: network namespaces need root (ip netns)");
        return None;
    }
    match Lab::new(tag, mtu) {
        Ok(l) => Some(l),
        Err(e) => {
            eprintln!("SKIPPED: cannot make the network namespaces: {e}");
            None
        }
    }
}

/// Counts reliable messages (checking their order) and echoes every message back; notes the
/// session's current datagram size.
struct Echo {
    received: Arc<AtomicU32>,
    out_of_order: Arc<AtomicU32>,
    path_mtu: Arc<AtomicUsize>,
}

impl Handler for Echo {
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
        if channel == 0 {
            let n = u32::from_le_bytes(data[..4].try_into().unwrap());
            if n != self.received.load(Ordering::Relaxed) {
                self.out_of_order.fetch_add(1, Ordering::Relaxed);
            }
            self.received.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(st) = ctx.session_stats(s) {
            self.path_mtu.store(st.path_mtu, Ordering::Relaxed);
        }
        let _ = ctx.send(s, channel, data);
    }
}

struct Session {
    server: Server,
    client: Client,
    received: Arc<AtomicU32>,
    out_of_order: Arc<AtomicU32>,
    server_mtu: Arc<AtomicUsize>,
    /// Reliable messages sent (numbered from 0).
    sent: u32,
    /// Reliable echoes back, in order.
    echoed: u32,
    echo_out_of_order: bool,
}

impl Session {
    fn start(lab: &Lab) -> Session {
        let received = Arc::new(AtomicU32::new(0));
        let out_of_order = Arc::new(AtomicU32::new(0));
        let server_mtu = Arc::new(AtomicUsize::new(0));
        let (r, o, m) = (received.clone(), out_of_order.clone(), server_mtu.clone());
        let server = Lab::within(&lab.server, move || {
            let addr: SocketAddr = format!("{SERVER_IP}:0").parse().unwrap();
            let mut cfg = ServerConfig::new(addr)
                .insecure()
                .session(|c| c.path_mtu = PathMtuConfig::on());
            cfg.udp.io_threads = 1;
            Server::start(cfg, move |_| Echo {
                received: r.clone(),
                out_of_order: o.clone(),
                path_mtu: m.clone(),
            })
            .expect("server starts")
        });
        let addr = server.local_addr();
        let client = Lab::within(&lab.client, move || {
            let cfg = ClientConfig::new()
                .session(|c| c.path_mtu = PathMtuConfig::on())
                .connect_timeout(Duration::from_secs(5));
            Client::connect_insecure_blocking(addr, cfg).expect("client connects")
        });
        Session {
            server,
            client,
            received,
            out_of_order,
            server_mtu,
            sent: 0,
            echoed: 0,
            echo_out_of_order: false,
        }
    }

    /// One 60 Hz tick: a numbered 3,000 B reliable message and a 2,400 B snapshot (both
    /// larger than a datagram: fragments of every size the session uses), then the client
    /// runs until the tick ends.
    fn tick(&mut self, reliable: bool) {
        let end = Instant::now() + Duration::from_micros(16_667);
        if reliable {
            let mut m = vec![0u8; 3000];
            m[..4].copy_from_slice(&self.sent.to_le_bytes());
            self.client.send(0, m).unwrap();
            self.sent += 1;
        }
        self.client.send(2, vec![9u8; 2400]).unwrap();
        self.pump_until(end);
    }

    fn pump_until(&mut self, end: Instant) {
        loop {
            let now = Instant::now();
            if now >= end {
                break;
            }
            self.client.wait(end - now).unwrap();
            while let Some(e) = self.client.poll_event() {
                if let ClientEvent::Message { channel: 0, data } = e {
                    let n = u32::from_le_bytes(data[..4].try_into().unwrap());
                    self.echo_out_of_order |= n != self.echoed;
                    self.echoed += 1;
                }
            }
        }
    }

    fn client_mtu(&self) -> usize {
        self.client.stats().map_or(0, |s| s.path_mtu)
    }

    fn server_mtu(&self) -> usize {
        self.server_mtu.load(Ordering::Relaxed)
    }

    /// Ticks until `done(client size, server size)` or `limit`; how long it took, if it did.
    fn ticks_until(
        &mut self,
        limit: Duration,
        done: impl Fn(usize, usize) -> bool,
    ) -> Option<Duration> {
        let start = Instant::now();
        while start.elapsed() < limit {
            self.tick(true);
            if done(self.client_mtu(), self.server_mtu()) {
                return Some(start.elapsed());
            }
        }
        None
    }

    /// Stops sending and waits (bounded) for every reliable message and its echo; asserts
    /// none was lost or reordered.
    fn finish(mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline
            && (self.echoed < self.sent || self.received.load(Ordering::Relaxed) < self.sent)
        {
            self.pump_until(Instant::now() + Duration::from_millis(20));
        }
        let received = self.received.load(Ordering::Relaxed);
        assert_eq!(received, self.sent, "reliable messages lost on the way in");
        assert_eq!(self.echoed, self.sent, "reliable echoes lost");
        assert_eq!(self.out_of_order.load(Ordering::Relaxed), 0, "reordered");
        assert!(!self.echo_out_of_order, "echoes reordered");
        self.client.close();
        self.server.shutdown().unwrap();
    }
}

#[test]
fn a_1500_byte_path_settles_at_1400_bytes_or_more_within_2_s() {
    let Some(lab) = lab("1500", 1500) else {
        return;
    };
    let mut s = Session::start(&lab);
    let took = s.ticks_until(Duration::from_secs(2), |c, sv| c >= 1400 && sv >= 1400);
    eprintln!(
        "1500 B path: client {} B, server {} B after {took:?}",
        s.client_mtu(),
        s.server_mtu()
    );
    assert!(took.is_some(), "not settled at >= 1400 B within 2 s");
    s.finish();
}

#[test]
fn a_1280_byte_path_settles_at_the_largest_size_that_fits() {
    let Some(lab) = lab("1280", 1280) else {
        return;
    };
    let mut s = Session::start(&lab);
    let took = s.ticks_until(Duration::from_secs(5), |c, sv| {
        c == PAYLOAD_1280 && sv == PAYLOAD_1280
    });
    eprintln!(
        "1280 B path: client {} B, server {} B after {took:?}",
        s.client_mtu(),
        s.server_mtu()
    );
    assert!(took.is_some(), "not settled at {PAYLOAD_1280} B within 5 s");
    // And stays there: nothing larger gets through, nothing smaller is settled for.
    s.ticks_until(Duration::from_millis(500), |_, _| false);
    assert_eq!(s.client_mtu(), PAYLOAD_1280);
    assert_eq!(s.server_mtu(), PAYLOAD_1280);
    s.finish();
}

#[test]
fn a_path_that_drops_from_1500_to_1280_shrinks_within_3_s_and_loses_no_reliable_message() {
    let Some(lab) = lab("drop", 1500) else {
        return;
    };
    let mut s = Session::start(&lab);
    let settled = s.ticks_until(Duration::from_secs(2), |c, sv| c >= 1400 && sv >= 1400);
    assert!(settled.is_some(), "not settled at >= 1400 B within 2 s");
    lab.set_mtu(1280);
    let shrank = s.ticks_until(Duration::from_secs(3), |c, sv| {
        c <= PAYLOAD_1280 && sv <= PAYLOAD_1280
    });
    eprintln!(
        "1500 -> 1280 B: client {} B, server {} B, shrank after {shrank:?}",
        s.client_mtu(),
        s.server_mtu()
    );
    assert!(shrank.is_some(), "did not shrink within 3 s");
    // Traffic goes on at the smaller size; then every reliable message must have arrived.
    s.ticks_until(Duration::from_secs(1), |_, _| false);
    eprintln!(
        "after 1 s more: client {} B, server {} B, {} reliable messages sent",
        s.client_mtu(),
        s.server_mtu(),
        s.sent
    );
    s.finish();
}
