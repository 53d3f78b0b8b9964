//! The relay's bottleneck over real loopback sockets: a 1 Mbit/s downlink offered twice its rate
//! delivers about 1 Mbit/s, drops the excess at the tail of its 100 ms queue, and reports a
//! queue delay near the buffer's length.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use bench::relay::{BottleneckConfig, RateSchedule, Relay, RelayConfig};
use ricochet_testkit::Impairment;

fn socket() -> UdpSocket {
    let mut cfg = ricochet_platform::SocketConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.recv_buffer = Some(4 << 20);
    cfg.send_buffer = Some(4 << 20);
    let (s, _) = ricochet_platform::bind(&cfg).unwrap().into_parts();
    let s: UdpSocket = s.into();
    s.set_nonblocking(false).unwrap();
    s
}

#[test]
fn a_one_mbit_route_delivers_about_one_mbit() {
    const LEN: usize = 1200;
    const N: u32 = 500;
    let server = socket();
    let client = socket();
    let neck = BottleneckConfig::new(
        "1mbit".parse::<RateSchedule>().unwrap(),
        Duration::from_millis(100),
    );
    let relay = Relay::start(
        RelayConfig::new(server.local_addr().unwrap(), Impairment::none()).with_bottlenecks(
            None,
            Some(neck),
            false,
        ),
    )
    .unwrap();
    // The client's first datagram creates the route; the server answers its source address.
    client.send_to(b"hello", relay.addr()).unwrap();
    let mut buf = vec![0u8; 2048];
    server
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let (_, route) = server.recv_from(&mut buf).unwrap();

    let rx = std::thread::spawn(move || {
        client
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut buf = vec![0u8; 2048];
        let (mut first, mut last, mut bytes, mut n) = (None, None, 0u64, 0u64);
        while let Ok(len) = client.recv(&mut buf) {
            let now = Instant::now();
            // The first datagram's bytes went out before the clock starts.
            if first.is_none() {
                first = Some(now);
            } else {
                bytes += len as u64;
            }
            last = Some(now);
            n += 1;
        }
        (first, last, bytes, n)
    });

    // 2 Mbit/s offered: 1,200 B every 4.8 ms, paced against the start so a late wake-up
    // catches up rather than lowering the offered rate.
    let start = Instant::now();
    let period = Duration::from_micros(4800);
    for i in 0..N {
        let due = start + period * i;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        server.send_to(&[0xab; LEN], route).unwrap();
    }
    let (first, last, bytes, n) = rx.join().unwrap();
    let c = relay.shutdown().unwrap();

    let neck = c.routes[0].down.bottleneck.expect("the route's bottleneck");
    assert_eq!(neck.offered, u64::from(N));
    assert!(neck.dropped > 0, "twice the rate must overflow: {neck:?}");
    assert_eq!(neck.departed + neck.dropped, neck.offered, "{neck:?}");
    assert_eq!(n, neck.departed, "every departed datagram arrives");
    let secs = (last.unwrap() - first.unwrap()).as_secs_f64();
    let rate_bps = bytes as f64 * 8.0 / secs;
    eprintln!("delivered {rate_bps:.0} bit/s over {secs:.3} s; bottleneck {neck:?}");
    assert!(
        (0.9e6..=1.1e6).contains(&rate_bps),
        "a 1 Mbit/s route delivered {rate_bps:.0} bit/s"
    );
    // Full buffer: the queue delay sits near 100 ms (1,200 B take 9.6 ms, so 10 fit).
    assert!(
        (80_000..=100_500).contains(&neck.sojourn_p50_us),
        "{neck:?}"
    );
    assert_eq!(neck.queued_bytes, 0);
    // The same departures over time, in bins of 100 ms: every one counted once, none waited
    // longer than the buffer.
    let series = c.down_queue_series.expect("the route's queue over time");
    let bins = series.bins();
    assert_eq!(bins.iter().map(|b| b.departed).sum::<u64>(), neck.departed);
    assert!(bins.iter().all(|b| b.sojourn_max_us <= 100_500), "{bins:?}");
    assert!(
        bins.iter().filter_map(|b| b.mean_us()).any(|m| m > 50_000),
        "{bins:?}"
    );
}

#[test]
fn a_shared_bottleneck_carries_every_route_at_its_one_rate() {
    const LEN: usize = 1200;
    const N: u32 = 300;
    let server = socket();
    let clients = [socket(), socket()];
    let neck = BottleneckConfig::new(
        "1mbit".parse::<RateSchedule>().unwrap(),
        Duration::from_millis(100),
    );
    let relay = Relay::start(
        RelayConfig::new(server.local_addr().unwrap(), Impairment::none()).with_bottlenecks(
            None,
            Some(neck),
            true,
        ),
    )
    .unwrap();
    server
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = vec![0u8; 2048];
    let mut routes = Vec::new();
    for c in &clients {
        c.send_to(b"hello", relay.addr()).unwrap();
        routes.push(server.recv_from(&mut buf).unwrap().1);
    }
    let receivers: Vec<_> = clients
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                c.set_read_timeout(Some(Duration::from_millis(500)))
                    .unwrap();
                let mut buf = vec![0u8; 2048];
                let mut n = 0u64;
                while c.recv(&mut buf).is_ok() {
                    n += 1;
                }
                n
            })
        })
        .collect();
    // Each route offered 1 Mbit/s, alternately: twice what the shared link carries.
    let start = Instant::now();
    let period = Duration::from_micros(9600);
    for i in 0..N {
        let due = start + period * i;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        // Which route goes first alternates: a pair arriving at a full drop-tail queue finds
        // room for the first only.
        let first = i as usize % 2;
        for r in [routes[first], routes[1 - first]] {
            server.send_to(&[0xab; LEN], r).unwrap();
        }
    }
    let got: Vec<u64> = receivers.into_iter().map(|r| r.join().unwrap()).collect();
    let c = relay.shutdown().unwrap();
    let neck = c.shared_down.expect("the shared bottleneck");
    assert!(c.routes.iter().all(|r| r.down.bottleneck.is_none()));
    assert_eq!(neck.offered, 2 * u64::from(N));
    assert_eq!(neck.departed + neck.dropped, neck.offered, "{neck:?}");
    assert_eq!(got.iter().sum::<u64>(), neck.departed, "{got:?} {neck:?}");
    let series = c.down_queue_series.expect("the shared queue over time");
    assert_eq!(
        series.bins().iter().map(|b| b.departed).sum::<u64>(),
        neck.departed
    );
    // About one link's worth in the sending time (2.88 s at 125,000 B/s, plus the buffer).
    let carried = neck.departed_bytes as f64 / 125_000.0;
    assert!(
        (2.6..=3.2).contains(&carried),
        "{carried} s of link time: {neck:?}"
    );
    // Alternating arrivals at a drop-tail queue: each route gets a fair part of it.
    assert!(got.iter().all(|&n| n * 3 >= neck.departed), "{got:?}");
}
