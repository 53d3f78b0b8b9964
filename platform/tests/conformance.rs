//! One conformance suite, run against every backend the host supports (`probe().backends()`:
//! `uring` and `mmsg` on Linux, `kqueue` on macOS). Loopback only; every wait is bounded.

use std::collections::HashSet;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ricochet_platform::{
    bind, open, probe, Backend, BackendConfig, BackendKind, Error, KernelCounters, SendBatch,
    SocketConfig, MAX_UDP_PAYLOAD_V4, MAX_UDP_PAYLOAD_V6,
};

const V4: &str = "127.0.0.1:0";
const V6: &str = "[::1]:0";

fn kinds() -> Vec<BackendKind> {
    let k = probe().backends();
    assert!(!k.is_empty(), "no backend available: {:#?}", probe());
    k
}

fn open_with(kind: BackendKind, sock: SocketConfig, cfg: BackendConfig) -> Box<dyn Backend> {
    let b = open(bind(&sock).unwrap(), &BackendConfig { kind, ..cfg }).unwrap();
    assert_eq!(
        b.kind(),
        kind,
        "RICOCHET_BACKEND must not be set while running this suite"
    );
    b
}

fn backend(kind: BackendKind, addr: &str) -> Box<dyn Backend> {
    open_with(
        kind,
        SocketConfig::new(addr.parse().unwrap()),
        BackendConfig::default(),
    )
}

/// Deterministic payload bytes (xorshift64 seeded by `seed`).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// One received datagram, copied out of the backend.
#[derive(Debug, Clone)]
struct Got {
    src: SocketAddr,
    data: Vec<u8>,
    truncated: bool,
    segment_size: Option<u16>,
}

/// Poll until `want` datagrams (GRO segments counted one by one) arrived or `limit` passed.
fn recv_n(b: &mut dyn Backend, want: usize, limit: Duration) -> Vec<Got> {
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    let mut empty = SendBatch::new(1);
    let mut count = 0;
    while count < want && Instant::now() < deadline {
        b.poll(&mut empty, Some(Duration::from_millis(100)))
            .unwrap();
        for d in b.received().iter() {
            count += d.segments().count();
            out.push(Got {
                src: d.src,
                data: d.data.to_vec(),
                truncated: d.truncated,
                segment_size: d.segment_size,
            });
        }
    }
    out
}

/// Send everything in `batch` through `b`, polling until the batch is empty (bounded).
fn flush(b: &mut dyn Backend, batch: &mut SendBatch) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !batch.is_empty() {
        assert!(
            Instant::now() < deadline,
            "send batch did not drain: {:?}",
            b.stats()
        );
        b.poll(batch, Some(Duration::from_millis(10))).unwrap();
    }
}

fn sizes_arrive_intact(kind: BackendKind, addr: &str, sizes: &[usize]) {
    let mut rx = backend(kind, addr);
    let mut tx = backend(kind, addr);
    let dst = rx.socket_info().local_addr;
    let src = tx.socket_info().local_addr;
    let mut batch = SendBatch::new(sizes.len());
    for (i, &n) in sizes.iter().enumerate() {
        batch.push(dst, &pattern(i as u64 + 1, n)).unwrap();
    }
    flush(tx.as_mut(), &mut batch);
    let got = recv_n(rx.as_mut(), sizes.len(), Duration::from_secs(10));
    assert_eq!(
        got.len(),
        sizes.len(),
        "{kind}: got {} of {} datagrams",
        got.len(),
        sizes.len()
    );
    let mut expected: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(i as u64 + 1, n))
        .collect();
    for g in &got {
        assert_eq!(g.src, src, "{kind}: wrong source");
        assert!(
            !g.truncated,
            "{kind}: {} B datagram reported truncated",
            g.data.len()
        );
        let pos = expected
            .iter()
            .position(|e| *e == g.data)
            .unwrap_or_else(|| panic!("{kind}: unexpected or corrupt {} B datagram", g.data.len()));
        expected.remove(pos);
    }
}

#[test]
fn datagram_sizes_ipv4_arrive_intact() {
    for kind in kinds() {
        sizes_arrive_intact(kind, V4, &[0, 1, 1_472, 16_384, MAX_UDP_PAYLOAD_V4]);
    }
}

#[test]
fn datagram_sizes_ipv6_arrive_intact() {
    for kind in kinds() {
        sizes_arrive_intact(kind, V6, &[0, 1, 1_452, 16_384, MAX_UDP_PAYLOAD_V6]);
    }
}

/// 16 sender threads × 1,000 datagrams into one backend: all arrive, none twice, contents
/// checked. The senders keep at most `WINDOW` datagrams in flight (counted against what the
/// receiver has read) so a loaded 2-core machine cannot overflow the receive buffer; any loss
/// that still happens fails the test, with the drop counters in the message.
#[test]
fn sixteen_senders_thousand_each() {
    const SENDERS: usize = 16;
    const EACH: usize = 1_000;
    const WINDOW: u64 = 128;
    for kind in kinds() {
        let mut cfg = SocketConfig::new(V4.parse().unwrap());
        cfg.recv_buffer = Some(4 << 20);
        let mut rx = open_with(kind, cfg, BackendConfig::default());
        let dst = rx.socket_info().local_addr;
        let sent = Arc::new(AtomicU64::new(0));
        let read = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let before = KernelCounters::snapshot().ok();
        let mut threads = Vec::new();
        let mut srcs = Vec::new();
        for s in 0..SENDERS {
            let sock = UdpSocket::bind(V4).unwrap();
            socket2::SockRef::from(&sock)
                .set_send_buffer_size(1 << 20)
                .unwrap();
            srcs.push(sock.local_addr().unwrap());
            let (sent, read, stop) = (sent.clone(), read.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                for i in 0..EACH {
                    while sent.load(Ordering::Acquire) >= read.load(Ordering::Acquire) + WINDOW {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        std::thread::sleep(Duration::from_micros(50));
                    }
                    sent.fetch_add(1, Ordering::AcqRel);
                    let mut msg = Vec::with_capacity(64);
                    msg.extend_from_slice(&(s as u16).to_le_bytes());
                    msg.extend_from_slice(&(i as u32).to_le_bytes());
                    msg.extend_from_slice(&pattern((s * EACH + i) as u64, 16 + (i % 48)));
                    sock.send_to(&msg, dst).unwrap();
                }
            }));
        }
        let mut seen = HashSet::new();
        let mut empty = SendBatch::new(1);
        let deadline = Instant::now() + Duration::from_secs(60);
        while seen.len() < SENDERS * EACH && Instant::now() < deadline {
            rx.poll(&mut empty, Some(Duration::from_millis(100)))
                .unwrap();
            for d in rx.received().iter() {
                let m = d.data;
                assert!(m.len() >= 6, "{kind}: short datagram");
                let s = u16::from_le_bytes([m[0], m[1]]) as usize;
                let i = u32::from_le_bytes([m[2], m[3], m[4], m[5]]) as usize;
                assert!(s < SENDERS && i < EACH, "{kind}: bad header");
                assert_eq!(d.src, srcs[s], "{kind}: wrong source for sender {s}");
                assert_eq!(
                    &m[6..],
                    &pattern((s * EACH + i) as u64, 16 + (i % 48))[..],
                    "{kind}: corrupt"
                );
                assert!(seen.insert((s, i)), "{kind}: duplicate datagram {s}/{i}");
                read.fetch_add(1, Ordering::AcqRel);
            }
        }
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        let kernel = before.and_then(|b| KernelCounters::snapshot().ok().map(|a| a.delta(&b)));
        assert_eq!(
            seen.len(),
            SENDERS * EACH,
            "{kind}: lost datagrams; socket drops {:?}, kernel delta {:?}, stats {:?}",
            rx.socket_drops(),
            kernel,
            rx.stats()
        );
    }
}

#[test]
fn oversize_send_is_refused_and_next_send_works() {
    for kind in kinds() {
        for (addr, limit) in [(V4, MAX_UDP_PAYLOAD_V4), (V6, MAX_UDP_PAYLOAD_V6)] {
            let mut rx = backend(kind, addr);
            let mut tx = backend(kind, addr);
            let dst = rx.socket_info().local_addr;
            let mut batch = SendBatch::new(4);
            match batch.push(dst, &vec![7u8; limit + 1]) {
                Err(Error::PayloadTooLarge { len, limit: l }) => {
                    assert_eq!((len, l), (limit + 1, limit))
                }
                other => panic!("{kind}: expected PayloadTooLarge, got {other:?}"),
            }
            batch.push(dst, b"after").unwrap();
            flush(tx.as_mut(), &mut batch);
            let got = recv_n(rx.as_mut(), 1, Duration::from_secs(5));
            assert_eq!(got.len(), 1, "{kind}");
            assert_eq!(got[0].data, b"after");
        }
    }
}

#[test]
fn too_small_buffer_reports_truncation() {
    for kind in kinds() {
        let cfg = BackendConfig {
            max_datagram: 100,
            ..BackendConfig::default()
        };
        let mut rx = open_with(kind, SocketConfig::new(V4.parse().unwrap()), cfg);
        let dst = rx.socket_info().local_addr;
        let tx = UdpSocket::bind(V4).unwrap();
        let big = pattern(9, 300);
        tx.send_to(&big, dst).unwrap();
        tx.send_to(b"small", dst).unwrap();
        let got = recv_n(rx.as_mut(), 2, Duration::from_secs(5));
        assert_eq!(got.len(), 2, "{kind}");
        assert!(
            got[0].truncated,
            "{kind}: cut datagram not reported truncated"
        );
        assert_eq!(got[0].data, &big[..100], "{kind}");
        assert!(!got[1].truncated, "{kind}");
        assert_eq!(got[1].data, b"small", "{kind}");
        assert!(rx.stats().truncated >= 1, "{kind}");
    }
}

#[test]
fn wake_from_another_thread_returns_a_blocked_poll() {
    for kind in kinds() {
        let mut rx = backend(kind, V4);
        let waker = rx.waker();
        let (done_tx, done_rx) = mpsc::channel();
        let poller = std::thread::spawn(move || {
            let mut empty = SendBatch::new(1);
            let out = rx.poll(&mut empty, None).unwrap();
            done_tx.send(out).unwrap();
        });
        std::thread::sleep(Duration::from_millis(50));
        waker.wake().unwrap();
        // A liveness bound, not a speed assertion.
        let out = done_rx
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("{kind}: poll(None) was not woken within 5 s"));
        assert!(out.woken, "{kind}");
        assert_eq!(out.received, 0, "{kind}");
        poller.join().unwrap();
    }
}

#[test]
fn wake_before_poll_is_not_lost() {
    for kind in kinds() {
        let mut rx = backend(kind, V4);
        rx.waker().wake().unwrap();
        let mut empty = SendBatch::new(1);
        let out = rx.poll(&mut empty, Some(Duration::from_secs(5))).unwrap();
        assert!(out.woken, "{kind}");
    }
}

#[test]
fn tiny_receive_buffer_counts_drops() {
    for kind in kinds() {
        let mut cfg = SocketConfig::new(V4.parse().unwrap());
        cfg.recv_buffer = Some(4096);
        let mut rx = open_with(kind, cfg, BackendConfig::default());
        if !rx.socket_info().drop_counting {
            assert_eq!(rx.socket_drops(), None, "{kind}");
            continue;
        }
        let dst = rx.socket_info().local_addr;
        let tx = UdpSocket::bind(V4).unwrap();
        // The reader does not read: these overflow the tiny buffer.
        for i in 0..200u64 {
            tx.send_to(&pattern(i, 1000), dst).unwrap();
        }
        // Drain what fit, then one more datagram: it carries the socket's drop count.
        let mut empty = SendBatch::new(1);
        let deadline = Instant::now() + Duration::from_secs(10);
        while rx
            .poll(&mut empty, Some(Duration::from_millis(50)))
            .unwrap()
            .received
            > 0
        {
            assert!(Instant::now() < deadline, "{kind}: never drained");
        }
        tx.send_to(b"after", dst).unwrap();
        let got = recv_n(rx.as_mut(), 1, Duration::from_secs(5));
        assert_eq!(
            got.last().map(|g| g.data.as_slice()),
            Some(&b"after"[..]),
            "{kind}"
        );
        let drops = rx.socket_drops().unwrap();
        assert!(
            drops > 0,
            "{kind}: no drops counted (stats {:?})",
            rx.stats()
        );
        assert!(
            drops < 200,
            "{kind}: {drops} drops of 200 sent, but some arrived"
        );
    }
}

#[test]
fn gso_and_gro_round_trip() {
    let caps = probe();
    for kind in kinds() {
        for gro in [false, true] {
            let cfg = BackendConfig {
                gro,
                ..BackendConfig::default()
            };
            let mut rx = open_with(kind, SocketConfig::new(V4.parse().unwrap()), cfg);
            let mut tx = backend(kind, V4);
            let dst = rx.socket_info().local_addr;
            let mut batch = SendBatch::new(8);
            let runs: Vec<Vec<u8>> = (0..4).map(|r| pattern(100 + r, 1200 * 10 - 300)).collect();
            for run in &runs {
                batch.push_segments(dst, 1200, run).unwrap();
            }
            flush(tx.as_mut(), &mut batch);
            assert_eq!(tx.stats().datagrams_out, 40, "{kind}");
            let got = recv_n(rx.as_mut(), 40, Duration::from_secs(10));
            let segs: Vec<Vec<u8>> = got
                .iter()
                .flat_map(|g| {
                    let d = ricochet_platform::RecvDatagram {
                        src: g.src,
                        data: &g.data,
                        truncated: g.truncated,
                        segment_size: g.segment_size,
                    };
                    d.segments().map(<[u8]>::to_vec).collect::<Vec<_>>()
                })
                .collect();
            assert_eq!(segs.len(), 40, "{kind} gro={gro}");
            let expected: Vec<Vec<u8>> = runs
                .iter()
                .flat_map(|r| r.chunks(1200).map(<[u8]>::to_vec))
                .collect();
            let mut expected_set: Vec<Vec<u8>> = expected.clone();
            for s in &segs {
                let pos = expected_set
                    .iter()
                    .position(|e| e == s)
                    .unwrap_or_else(|| panic!("{kind}: corrupt segment"));
                expected_set.remove(pos);
            }
            let coalesced = got.iter().any(|g| g.segment_size.is_some());
            if gro && caps.gro.available && caps.gso.available && kind != BackendKind::Kqueue {
                // A GSO send over loopback reaches a GRO socket still coalesced.
                assert!(coalesced, "{kind}: GRO on but no coalesced run seen");
                assert_eq!(rx.stats().datagrams_in, 40, "{kind}");
            }
            if !gro {
                assert!(!coalesced, "{kind}: coalesced run without GRO");
            }
        }
    }
}

/// `flush` sends mid-dispatch without disturbing what the last poll received; datagrams that
/// arrive meanwhile come with the next poll.
#[test]
fn flush_keeps_received_datagrams_readable() {
    for kind in kinds() {
        let mut rx = backend(kind, V4);
        let dst = rx.socket_info().local_addr;
        let peer = UdpSocket::bind(V4).unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let peer_addr = peer.local_addr().unwrap();
        for i in 0..3u64 {
            peer.send_to(&pattern(i, 100), dst).unwrap();
        }
        let first = recv_n(rx.as_mut(), 3, Duration::from_secs(5));
        assert_eq!(first.len(), 3, "{kind}");
        // Re-read the last poll's datagrams after the flush and compare.
        let before: Vec<Vec<u8>> = rx.received().iter().map(|d| d.data.to_vec()).collect();
        assert!(!before.is_empty(), "{kind}");
        // These arrive while the caller is still dispatching the last batch.
        for i in 10..13u64 {
            peer.send_to(&pattern(i, 100), dst).unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        let mut replies = SendBatch::new(8);
        for i in 0..5u64 {
            replies.push(peer_addr, &pattern(100 + i, 50)).unwrap();
        }
        let sent = rx.flush(&mut replies).unwrap();
        assert_eq!(sent, 5, "{kind}");
        assert!(replies.is_empty(), "{kind}");
        let after: Vec<Vec<u8>> = rx.received().iter().map(|d| d.data.to_vec()).collect();
        assert_eq!(before, after, "{kind}: flush changed the received batch");
        let mut buf = [0u8; 128];
        for i in 0..5u64 {
            let (n, from) = peer.recv_from(&mut buf).unwrap();
            assert_eq!(from, dst, "{kind}");
            assert_eq!(&buf[..n], &pattern(100 + i, 50)[..], "{kind}");
        }
        let later = recv_n(rx.as_mut(), 3, Duration::from_secs(5));
        let later: HashSet<Vec<u8>> = later.into_iter().map(|g| g.data).collect();
        for i in 10..13u64 {
            assert!(
                later.contains(&pattern(i, 100)),
                "{kind}: datagram {i} lost across flush"
            );
        }
    }
}

#[test]
fn selection_reason_and_socket_info_are_reported() {
    for kind in kinds() {
        let mut cfg = SocketConfig::new(V4.parse().unwrap());
        cfg.recv_buffer = Some(1 << 20);
        let b = open_with(kind, cfg, BackendConfig::default());
        assert!(b.selection_reason().contains(kind.as_str()) || !b.selection_reason().is_empty());
        assert_eq!(b.socket_info().recv_buffer_requested, Some(1 << 20));
        assert!(
            b.socket_info().recv_buffer_granted >= 1 << 20,
            "{kind}: {:?}",
            b.socket_info()
        );
    }
}

/// Push `(destination index, size)` datagrams through a coalescing batch from `tx` and check
/// each receiver got exactly its datagrams, intact and in order.
fn coalesced_delivery(
    kind: BackendKind,
    tx: &mut dyn Backend,
    rxs: &mut [Box<dyn Backend>],
    plan: &[(usize, usize)],
) {
    let dsts: Vec<SocketAddr> = rxs.iter().map(|r| r.socket_info().local_addr).collect();
    let src = tx.socket_info().local_addr;
    let mut batch = SendBatch::new(plan.len());
    batch.set_coalescing(true);
    for (i, &(to, size)) in plan.iter().enumerate() {
        batch.push(dsts[to], &pattern(i as u64 + 7, size)).unwrap();
    }
    assert_eq!(batch.datagrams(), plan.len(), "{kind}");
    let before = tx.stats().datagrams_out;
    flush(tx, &mut batch);
    assert_eq!(
        tx.stats().datagrams_out - before,
        plan.len() as u64,
        "{kind}: the send counter counts datagrams, not entries"
    );
    for (r, rx) in rxs.iter_mut().enumerate() {
        let expected: Vec<Vec<u8>> = plan
            .iter()
            .enumerate()
            .filter(|(_, &(to, _))| to == r)
            .map(|(i, &(_, size))| pattern(i as u64 + 7, size))
            .collect();
        let got: Vec<Vec<u8>> = recv_n(rx.as_mut(), expected.len(), Duration::from_secs(10))
            .iter()
            .flat_map(|g| {
                assert_eq!(g.src, src, "{kind}: wrong source");
                assert!(!g.truncated, "{kind}: truncated");
                let d = ricochet_platform::RecvDatagram {
                    src: g.src,
                    data: &g.data,
                    truncated: g.truncated,
                    segment_size: g.segment_size,
                };
                d.segments().map(<[u8]>::to_vec).collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(got.len(), expected.len(), "{kind}: receiver {r} count");
        for (k, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert!(
                g == e,
                "{kind}: receiver {r} datagram {k} corrupt or out of order"
            );
        }
    }
}

/// A plan exercising the coalescing rules: long equal-size runs (over the 64-segment limit),
/// runs ending in a shorter datagram, growing sizes, and destinations interleaved.
fn coalescing_plan() -> Vec<(usize, usize)> {
    let mut plan = Vec::new();
    plan.extend((0..150).map(|_| (0, 1_000)));
    plan.push((0, 10));
    plan.extend((0..20).map(|i| (0, 200 + i * 50)));
    plan.extend((0..60).map(|i| (i % 2, 1_200)));
    plan.extend((0..30).map(|_| (1, 1_452)));
    plan.push((1, 0));
    plan.extend((0..30).map(|i| ((i / 10) % 2, 700 - (i % 10))));
    plan
}

#[test]
fn coalesced_runs_arrive_intact_and_in_order() {
    for kind in kinds() {
        for addr in [V4, V6] {
            for gro in [false, true] {
                let cfg = BackendConfig {
                    gro,
                    ..BackendConfig::default()
                };
                let sock = || {
                    let mut s = SocketConfig::new(addr.parse().unwrap());
                    s.recv_buffer = Some(4 << 20);
                    s
                };
                let mut rxs = vec![
                    open_with(kind, sock(), cfg.clone()),
                    open_with(kind, sock(), cfg.clone()),
                ];
                let mut tx = open_with(kind, sock(), BackendConfig::default());
                coalesced_delivery(kind, tx.as_mut(), &mut rxs, &coalescing_plan());
            }
        }
    }
}

/// A socket with UDP checksums off (`SO_NO_CHECK`) makes the kernel refuse every GSO send;
/// the backend must then send the same datagrams one by one, losing none.
#[cfg(target_os = "linux")]
#[test]
fn refused_gso_falls_back_to_single_sends_without_loss() {
    use std::os::fd::AsRawFd;
    if !probe().gso.available {
        eprintln!("GSO unavailable here: {}", probe().gso.detail);
        return;
    }
    for kind in kinds() {
        let sock = SocketConfig::new(V4.parse().unwrap());
        let raw = bind(&sock).unwrap();
        let one: libc::c_int = 1;
        // SAFETY: setsockopt on a live socket with a pointer to a c_int and its size.
        let rc = unsafe {
            libc::setsockopt(
                raw.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_NO_CHECK,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "SO_NO_CHECK: {}", std::io::Error::last_os_error());
        let mut tx = open(
            raw,
            &BackendConfig {
                kind,
                ..BackendConfig::default()
            },
        )
        .unwrap();
        let mut rx_sock = SocketConfig::new(V4.parse().unwrap());
        rx_sock.recv_buffer = Some(4 << 20);
        let mut rxs = vec![open_with(kind, rx_sock, BackendConfig::default())];
        let plan: Vec<(usize, usize)> = (0..100).map(|i| (0, 900 + (i / 40) * 10)).collect();
        coalesced_delivery(kind, tx.as_mut(), &mut rxs, &plan);
        assert_eq!(
            tx.stats().send_errors,
            0,
            "{kind}: the refusal is not a loss"
        );
    }
}
