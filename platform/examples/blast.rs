//! One-way blast micro-benchmark: a sender thread pushes 1,200-byte datagrams over loopback
//! for a fixed time and a receiver thread counts what arrives, for plain `send_to`/`recv_from`
//! and for every backend the host supports, without and with GSO (GRO on the receiver).
//!
//! ```text
//! cargo run --release -p ricochet-platform --example blast -- --seconds 1 --json out.json
//! ```
//!
//! Options: `--seconds S` per run (default 1), `--repeat N` runs per row, the median by received
//! rate is reported (default 3), `--size B` (default 1200), `--json PATH` (write the rows and
//! every sample as JSON), `--rcvbuf BYTES` (receiver SO_RCVBUF, default 8 MiB). The 1-minute
//! load average before and after is recorded: on a shared machine it explains a lot.

use std::fmt::Write as _;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ricochet_platform::{
    bind, open, probe, BackendConfig, BackendKind, KernelCounters, SendBatch, SocketConfig,
};

struct Args {
    seconds: f64,
    repeat: usize,
    size: usize,
    json: Option<String>,
    rcvbuf: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        seconds: 1.0,
        repeat: 3,
        size: 1200,
        json: None,
        rcvbuf: 8 << 20,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--seconds" => a.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--repeat" => a.repeat = value()?.parse().map_err(|e| format!("--repeat: {e}"))?,
            "--size" => a.size = value()?.parse().map_err(|e| format!("--size: {e}"))?,
            "--json" => a.json = Some(value()?),
            "--rcvbuf" => a.rcvbuf = value()?.parse().map_err(|e| format!("--rcvbuf: {e}"))?,
            "-h" | "--help" => {
                println!("blast [--seconds S] [--repeat N] [--size BYTES] [--json PATH] [--rcvbuf BYTES]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if !a.seconds.is_finite() || a.seconds <= 0.0 || a.size == 0 || a.size > 1472 || a.repeat == 0 {
        return Err("need --seconds > 0, --repeat > 0 and 0 < --size <= 1472".into());
    }
    Ok(a)
}

/// One measured configuration.
struct Row {
    name: String,
    backend: &'static str,
    gso: bool,
    gro: bool,
    seconds: f64,
    sent: u64,
    received: u64,
    wrong_size: u64,
    socket_drops: Option<u64>,
    rcvbuf_errors: Option<u64>,
    sender_syscalls: Option<u64>,
    receiver_syscalls: Option<u64>,
    receiver_selection: String,
    /// SO_RCVBUF the kernel granted the receiver (as `getsockopt` reports it).
    rcvbuf_granted: usize,
    /// Received datagrams/s of every run of this row (the row itself is the median run).
    samples: Vec<f64>,
}

impl Row {
    fn lost(&self) -> u64 {
        self.sent.saturating_sub(self.received)
    }

    fn received_rate(&self) -> f64 {
        self.received as f64 / self.seconds
    }
}

/// Run `f` `n` times; return the median run (by received rate) with every run's rate attached.
fn median_of(n: usize, mut f: impl FnMut() -> Row) -> Row {
    let mut runs: Vec<Row> = (0..n).map(|_| f()).collect();
    let samples: Vec<f64> = runs.iter().map(Row::received_rate).collect();
    runs.sort_by(|a, b| a.received_rate().total_cmp(&b.received_rate()));
    let mut mid = runs.swap_remove(n / 2);
    mid.samples = samples;
    mid
}

fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Receiver end: runs until `stop` is set and then until 200 ms pass without a datagram.
fn idle_done(stop: &AtomicBool, last: Instant) -> bool {
    stop.load(Ordering::Acquire) && last.elapsed() > Duration::from_millis(200)
}

fn plain(args: &Args) -> Row {
    let mut cfg = SocketConfig::new("127.0.0.1:0".parse().expect("literal address"));
    cfg.recv_buffer = Some(args.rcvbuf);
    let (rx_sock, rx_info) = bind(&cfg).expect("bind receiver").into_parts();
    let rx: UdpSocket = rx_sock.into();
    rx.set_nonblocking(false).expect("blocking receiver");
    rx.set_read_timeout(Some(Duration::from_millis(50)))
        .expect("read timeout");
    let dst = rx.local_addr().expect("local addr");
    let stop = Arc::new(AtomicBool::new(false));
    let size = args.size;
    let stop_rx = stop.clone();
    let receiver = std::thread::spawn(move || {
        let mut buf = vec![0u8; 65_536];
        let (mut n, mut wrong) = (0u64, 0u64);
        let mut last = Instant::now();
        while !idle_done(&stop_rx, last) {
            if let Ok((len, _)) = rx.recv_from(&mut buf) {
                last = Instant::now();
                if len == size {
                    n += 1;
                } else {
                    wrong += 1;
                }
            }
        }
        (n, wrong)
    });
    let tx = UdpSocket::bind("127.0.0.1:0").expect("bind sender");
    let payload = vec![0xA5u8; size];
    let before = KernelCounters::snapshot().ok();
    let t0 = Instant::now();
    let limit = Duration::from_secs_f64(args.seconds);
    let mut sent = 0u64;
    while t0.elapsed() < limit {
        for _ in 0..64 {
            if tx.send_to(&payload, dst).is_ok() {
                sent += 1;
            }
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Release);
    let (received, wrong_size) = receiver.join().expect("receiver thread");
    let after = KernelCounters::snapshot().ok();
    Row {
        name: "plain send_to/recv_from".into(),
        backend: "std",
        gso: false,
        gro: false,
        seconds,
        sent,
        received,
        wrong_size,
        socket_drops: None,
        rcvbuf_errors: before
            .zip(after)
            .map(|(b, a)| a.delta(&b).udp_rcvbuf_errors),
        sender_syscalls: Some(sent),
        receiver_syscalls: None,
        receiver_selection: "std::net::UdpSocket".into(),
        rcvbuf_granted: rx_info.recv_buffer_granted,
        samples: Vec::new(),
    }
}

/// Most 1,200-byte segments one GSO send may carry under the 65,507-byte limit (and 64).
fn gso_segments(size: usize) -> usize {
    (ricochet_platform::MAX_UDP_PAYLOAD_V4 / size).min(ricochet_platform::batch::MAX_GSO_SEGMENTS)
}

fn backend_row(args: &Args, kind: BackendKind, gso: bool) -> Row {
    let gro = gso;
    let mut rcfg = SocketConfig::new("127.0.0.1:0".parse().expect("literal address"));
    rcfg.recv_buffer = Some(args.rcvbuf);
    let rx_bcfg = BackendConfig {
        kind,
        gro,
        ..BackendConfig::default()
    };
    let mut rx =
        open(bind(&rcfg).expect("bind receiver"), &rx_bcfg).expect("open receiver backend");
    let dst: SocketAddr = rx.socket_info().local_addr;
    let selection = rx.selection_reason().to_string();
    let rcvbuf_granted = rx.socket_info().recv_buffer_granted;
    let stop = Arc::new(AtomicBool::new(false));
    let size = args.size;
    let stop_rx = stop.clone();
    let receiver = std::thread::spawn(move || {
        let mut empty = SendBatch::new(1);
        let (mut n, mut wrong) = (0u64, 0u64);
        let mut last = Instant::now();
        while !idle_done(&stop_rx, last) {
            let out = rx
                .poll(&mut empty, Some(Duration::from_millis(50)))
                .expect("receiver poll");
            if out.received == 0 {
                continue;
            }
            last = Instant::now();
            for d in rx.received().iter() {
                for seg in d.segments() {
                    if seg.len() == size {
                        n += 1;
                    } else {
                        wrong += 1;
                    }
                }
            }
        }
        (n, wrong, rx.socket_drops(), rx.stats().syscalls)
    });

    let mut scfg = SocketConfig::new("127.0.0.1:0".parse().expect("literal address"));
    scfg.send_buffer = Some(4 << 20);
    let tx_bcfg = BackendConfig {
        kind,
        ..BackendConfig::default()
    };
    let mut tx = open(bind(&scfg).expect("bind sender"), &tx_bcfg).expect("open sender backend");
    let payload = vec![0xA5u8; size];
    let segs = gso_segments(size);
    let run = vec![0xA5u8; size * segs];
    let (entries, per_entry) = if gso {
        (8, segs)
    } else {
        (tx_bcfg.batch_size, 1)
    };
    let mut batch = SendBatch::new(entries);
    let before = KernelCounters::snapshot().ok();
    let t0 = Instant::now();
    let limit = Duration::from_secs_f64(args.seconds);
    let mut sent = 0u64;
    while t0.elapsed() < limit {
        while !batch.is_full() {
            let r = if gso {
                batch.push_segments(dst, size as u16, &run)
            } else {
                batch.push(dst, &payload)
            };
            r.expect("queue datagram");
        }
        let out = tx
            .poll(&mut batch, Some(Duration::ZERO))
            .expect("sender poll");
        sent += (out.sent * per_entry) as u64;
    }
    let seconds = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Release);
    let (received, wrong_size, socket_drops, rx_syscalls) =
        receiver.join().expect("receiver thread");
    let after = KernelCounters::snapshot().ok();
    Row {
        name: format!("{kind}{}", if gso { " GSO+GRO" } else { "" }),
        backend: kind.as_str(),
        gso,
        gro,
        seconds,
        sent,
        received,
        wrong_size,
        socket_drops,
        rcvbuf_errors: before
            .zip(after)
            .map(|(b, a)| a.delta(&b).udp_rcvbuf_errors),
        sender_syscalls: Some(tx.stats().syscalls),
        receiver_syscalls: Some(rx_syscalls),
        receiver_selection: selection,
        rcvbuf_granted,
        samples: Vec::new(),
    }
}

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn opt(v: Option<u64>) -> String {
    v.map_or("null".into(), |v| v.to_string())
}

fn to_json(args: &Args, rows: &[Row], load: (Option<f64>, Option<f64>)) -> String {
    let caps = probe();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut o = String::new();
    let _ = writeln!(o, "{{");
    let _ = writeln!(o, "  \"benchmark\": \"platform-blast\",");
    let _ = writeln!(o, "  \"unix_time\": {now},");
    let _ = writeln!(o, "  \"host\": {},", json_str(host.trim()));
    let _ = writeln!(o, "  \"kernel\": {},", json_str(kernel.trim()));
    let _ = writeln!(o, "  \"cpus\": {cpus},");
    let _ = writeln!(o, "  \"seconds\": {},", args.seconds);
    let _ = writeln!(o, "  \"repeat\": {},", args.repeat);
    let f = |v: Option<f64>| v.map_or("null".to_string(), |v| format!("{v:.2}"));
    let _ = writeln!(o, "  \"loadavg_1m_before\": {},", f(load.0));
    let _ = writeln!(o, "  \"loadavg_1m_after\": {},", f(load.1));
    let _ = writeln!(o, "  \"datagram_bytes\": {},", args.size);
    let _ = writeln!(o, "  \"receiver_rcvbuf_requested\": {},", args.rcvbuf);
    let _ = writeln!(
        o,
        "  \"capabilities\": {{\"io_uring\": {}, \"multishot_recvmsg\": {}, \"buffer_rings\": {}, \"gso\": {}, \"gro\": {}}},",
        caps.io_uring.available, caps.multishot_recvmsg.available, caps.buffer_rings.available, caps.gso.available, caps.gro.available
    );
    let _ = writeln!(o, "  \"rows\": [");
    for (i, r) in rows.iter().enumerate() {
        let _ = write!(
            o,
            "    {{\"name\": {}, \"backend\": {}, \"gso\": {}, \"gro\": {}, \"seconds\": {:.4}, \"sent\": {}, \"received\": {}, \"lost\": {}, \"wrong_size\": {}, \"sent_per_sec\": {:.0}, \"received_per_sec\": {:.0}, \"socket_drops\": {}, \"kernel_rcvbuf_errors\": {}, \"sender_syscalls\": {}, \"receiver_syscalls\": {}, \"receiver_selection\": {}, \"receiver_rcvbuf_granted\": {}, \"samples_received_per_sec\": [{}]}}",
            json_str(&r.name),
            json_str(r.backend),
            r.gso,
            r.gro,
            r.seconds,
            r.sent,
            r.received,
            r.lost(),
            r.wrong_size,
            r.sent as f64 / r.seconds,
            r.received as f64 / r.seconds,
            opt(r.socket_drops),
            opt(r.rcvbuf_errors),
            opt(r.sender_syscalls),
            opt(r.receiver_syscalls),
            json_str(&r.receiver_selection),
            r.rcvbuf_granted,
            r.samples.iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>().join(", "),
        );
        let _ = writeln!(o, "{}", if i + 1 < rows.len() { "," } else { "" });
    }
    let _ = writeln!(o, "  ]");
    let _ = writeln!(o, "}}");
    o
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("blast: {e}");
            std::process::exit(2);
        }
    };
    let load_before = loadavg();
    let mut rows = vec![median_of(args.repeat, || plain(&args))];
    for kind in probe().backends() {
        rows.push(median_of(args.repeat, || backend_row(&args, kind, false)));
        rows.push(median_of(args.repeat, || backend_row(&args, kind, true)));
    }
    let load_after = loadavg();
    println!(
        "{:<26} {:>12} {:>12} {:>12} {:>7} {:>12}",
        "row", "sent/s", "received/s", "lost", "lost %", "rx syscalls"
    );
    for r in &rows {
        let lost_pct = if r.sent > 0 {
            100.0 * r.lost() as f64 / r.sent as f64
        } else {
            0.0
        };
        println!(
            "{:<26} {:>12.0} {:>12.0} {:>12} {:>6.1}% {:>12}",
            r.name,
            r.sent as f64 / r.seconds,
            r.received as f64 / r.seconds,
            r.lost(),
            lost_pct,
            opt(r.receiver_syscalls)
        );
    }
    println!(
        "median of {} run(s) of {} s each; 1-min load average {:?} -> {:?}",
        args.repeat, args.seconds, load_before, load_after
    );
    if let Some(path) = &args.json {
        // Create the folder first: `--json results/x.json` in a fresh checkout has none.
        let parent = std::path::Path::new(path).parent();
        if let Some(dir) = parent.filter(|d| !d.as_os_str().is_empty()) {
            if let Err(e) = std::fs::create_dir_all(dir) {
                eprintln!("blast: creating {}: {e}", dir.display());
                std::process::exit(1);
            }
        }
        if let Err(e) = std::fs::write(path, to_json(&args, &rows, (load_before, load_after))) {
            eprintln!("blast: writing {path}: {e}");
            std::process::exit(1);
        }
        println!("wrote {path}");
    }
}
