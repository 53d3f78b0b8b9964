//! The backend interface: one socket, batched sends and receives, a cross-thread wake-up.
//!
//! A worker loop calls [`Backend::poll`] once per turn: it submits the send batch and waits (up
//! to a timeout) for datagrams, then reads them through [`Backend::received`].

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use crate::batch::{RecvBatch, SendBatch};
use crate::error::{Error, Result};
use crate::socket::SocketInfo;

/// Which datagram I/O implementation to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BackendKind {
    /// The best the host supports: `uring` where it works, else `mmsg` (Linux); `kqueue` (macOS).
    #[default]
    Auto,
    /// io_uring: multishot `recvmsg` into a provided-buffer ring, batched send SQEs (Linux).
    Uring,
    /// epoll readiness with `recvmmsg` / `sendmmsg` (Linux).
    Mmsg,
    /// kqueue readiness with `recvmsg_x`/`sendmsg_x` where probed, else a `recvmsg` loop (macOS).
    Kqueue,
}

impl BackendKind {
    /// The lowercase name used by flags and the `RICOCHET_BACKEND` environment variable.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Auto => "auto",
            BackendKind::Uring => "uring",
            BackendKind::Mmsg => "mmsg",
            BackendKind::Kqueue => "kqueue",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BackendKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(BackendKind::Auto),
            "uring" | "io_uring" | "io-uring" => Ok(BackendKind::Uring),
            "mmsg" | "epoll" => Ok(BackendKind::Mmsg),
            "kqueue" => Ok(BackendKind::Kqueue),
            other => Err(Error::InvalidConfig(format!(
                "unknown backend {other:?}; expected auto, uring, mmsg or kqueue"
            ))),
        }
    }
}

/// Environment variable that forces a backend (`auto`, `uring`, `mmsg`, `kqueue`), overriding
/// the configured kind; for tests and for users working around a kernel problem.
pub const BACKEND_ENV: &str = "RICOCHET_BACKEND";

/// How a backend is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendConfig {
    /// Which backend; [`BACKEND_ENV`] overrides it.
    pub kind: BackendKind,
    /// Most datagrams received per poll, and the send batch size the backend is tuned for: the
    /// `mmsg` backend also sends at most this many messages (at least 8) per `sendmmsg`.
    pub batch_size: usize,
    /// Receive buffer per datagram in bytes. A larger datagram is reported truncated.
    /// Default 65,536, enough for the largest IPv4 and IPv6 payloads.
    pub max_datagram: usize,
    /// io_uring submission-queue entries (the completion queue is sized from it). Small by
    /// default so an ordinary user's 8 MiB `RLIMIT_MEMLOCK` suffices.
    pub ring_entries: u32,
    /// io_uring provided receive buffers (a power of two).
    pub recv_buffers: u16,
    /// Ask for UDP GRO on receive where the OS supports it (coalesced runs are then reported
    /// with a segment size).
    pub gro: bool,
    /// The backend is polled only by the thread that opened it, for its whole life (a runtime
    /// worker). On Linux the io_uring backend then defers its completion work to that thread's
    /// polls (`IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN`, where the kernel has
    /// them), so datagrams arriving while the thread sleeps or computes do not interrupt it.
    /// Polling such a backend from another thread fails, and its [`Backend::ready_fd`] does not
    /// report arrivals (so a caller waiting on that descriptor must not ask for this). Default
    /// false; other backends ignore it.
    pub single_thread: bool,
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            kind: BackendKind::Auto,
            batch_size: 64,
            max_datagram: 65_536,
            ring_entries: 256,
            recv_buffers: 64,
            gro: false,
            single_thread: false,
        }
    }
}

/// Something that interrupts a blocked [`Backend::poll`] from another thread.
pub trait Wake: Send + Sync {
    /// Wake the poller; it returns promptly even if it was not yet blocked.
    fn wake(&self) -> std::io::Result<()>;
}

/// A cloneable, thread-safe handle that wakes one backend.
#[derive(Clone)]
pub struct Waker(Arc<dyn Wake>);

impl Waker {
    /// Wrap a wake implementation.
    pub fn new(inner: Arc<dyn Wake>) -> Self {
        Waker(inner)
    }

    /// Wake the backend's poller.
    pub fn wake(&self) -> std::io::Result<()> {
        self.0.wake()
    }
}

impl fmt::Debug for Waker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Waker")
    }
}

/// What one poll did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollOutcome {
    /// Datagram entries now readable through [`Backend::received`].
    pub received: usize,
    /// Send entries the kernel accepted (and that were removed from the batch).
    pub sent: usize,
    /// A wake-up arrived.
    pub woken: bool,
}

/// Counters a backend keeps about itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackendStats {
    /// System calls made (submit/wait, recvmmsg, sendmmsg, epoll_wait, ...).
    pub syscalls: u64,
    /// Datagrams received (a GRO run counts its segments).
    pub datagrams_in: u64,
    /// Datagrams sent (a GSO send counts its segments).
    pub datagrams_out: u64,
    /// Non-empty receive batches.
    pub batches_in: u64,
    /// Non-empty send submissions.
    pub batches_out: u64,
    /// Sends that failed and were dropped (after a clear error was logged), e.g. `EHOSTUNREACH`.
    pub send_errors: u64,
    /// Times sending stopped early because the socket buffer was full (resumed next poll).
    pub send_would_block: u64,
    /// Datagrams received truncated.
    pub truncated: u64,
    /// io_uring: times the provided-buffer ring ran dry.
    pub buffer_exhaustions: u64,
    /// io_uring: times the multishot receive was re-armed.
    pub rearms: u64,
}

/// A datagram I/O implementation bound to one socket. One per worker thread; not shared.
pub trait Backend: Send {
    /// Which implementation this is.
    fn kind(&self) -> BackendKind;

    /// Why this backend was chosen (e.g. "auto: io_uring available" or the fallback reason).
    fn selection_reason(&self) -> &str;

    /// The socket's address and buffer sizes (requested and granted).
    fn socket_info(&self) -> &SocketInfo;

    /// A handle that wakes this backend's `poll` from another thread.
    fn waker(&self) -> Waker;

    /// Submit what `send` holds (removing what the kernel accepted; what the socket could not
    /// take stays queued for the next poll), then wait until at least one datagram arrives, a
    /// wake-up comes, or `timeout` passes (`None`: no limit; `Some(ZERO)`: do not block).
    /// The received datagrams are readable through [`Backend::received`] until the next poll.
    /// Datagrams leave the socket in the order `send` holds them, also when its buffer fills:
    /// what stays queued is always the batch's tail.
    fn poll(&mut self, send: &mut SendBatch, timeout: Option<Duration>) -> Result<PollOutcome>;

    /// Submit what `send` holds without receiving or waiting, leaving what the last poll
    /// received readable. For a handler whose replies outgrow the batch mid-dispatch.
    /// Returns the number of entries the kernel accepted (and that were removed from `send`).
    fn flush(&mut self, send: &mut SendBatch) -> Result<usize>;

    /// What the last poll received.
    fn received(&self) -> RecvBatch<'_>;

    /// Datagrams the kernel dropped on this socket for lack of buffer space (`SO_RXQ_OVFL`),
    /// as last reported; `None` where the OS does not count them.
    fn socket_drops(&self) -> Option<u64>;

    /// This backend's counters.
    fn stats(&self) -> BackendStats;

    /// A descriptor that polls readable (`POLLIN`) when [`Backend::poll`] has something to
    /// return: a datagram or a wake-up (uring: the ring, mmsg: its epoll set once it has one,
    /// else its socket, kqueue: its kqueue). It lets one thread wait on several backends at
    /// once (`poll(2)` or `epoll` over their descriptors), then call `poll` with a zero timeout
    /// on the ready ones. Waiting on it is only sound while [`Backend::needs_poll`] is false.
    /// It may change after a `poll` that waited or a [`Backend::waker`] call (mmsg makes its
    /// epoll set then): read it again after either. With io_uring, the thread that waits must
    /// be the one that created the backend (its receive completions are posted by that
    /// thread's task work).
    #[cfg(unix)]
    fn ready_fd(&self) -> std::os::fd::RawFd;

    /// True when `poll` would make progress without the kernel signalling [`Backend::ready_fd`]:
    /// completions reaped but not handed out yet, a receive or wake-up to re-arm, a receive
    /// batch that filled up (more may be queued). Call `poll` with a zero timeout instead of
    /// waiting on the descriptor then.
    fn needs_poll(&mut self) -> bool;
}

/// Checks the Linux backends' unit tests share.
#[cfg(all(test, target_os = "linux"))]
pub(crate) mod test_support {
    use super::Backend;
    use crate::batch::SendBatch;
    use std::net::SocketAddr;
    use std::time::Duration;

    /// The payload the round-trip tests send as 1,000 B segments (2,500 B: two full, one short).
    pub(crate) fn segmented_payload() -> Vec<u8> {
        (0..=255u8).cycle().take(2500).collect()
    }

    /// Poll `rx` until `n` datagrams (GRO segments counted one by one) came, all from `from`.
    pub(crate) fn receive_segments(
        rx: &mut dyn Backend,
        n: usize,
        from: SocketAddr,
    ) -> Vec<Vec<u8>> {
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut empty = SendBatch::new(1);
        while got.len() < n {
            let out = rx.poll(&mut empty, Some(Duration::from_secs(5))).unwrap();
            assert!(out.received > 0, "timed out");
            for d in rx.received().iter() {
                assert_eq!(d.src, from);
                got.extend(d.segments().map(<[u8]>::to_vec));
            }
        }
        got
    }

    /// Runs `f` on a thread of its own in a new network namespace whose loopback sends at
    /// `rate` (a `tc` rate, e.g. `20mbit`) through a token bucket (`tc ... tbf`), so that a
    /// small socket send buffer fills and drains as on a real link (plain loopback frees a
    /// datagram's buffer as soon as it is sent, so a send never finds it full). Needs root and
    /// `ip`/`tc`; where they are missing it says why and returns `None`, unless
    /// `RICOCHET_TEST_REQUIRE_NETNS` is set (the project's CI, as root), where it fails.
    ///
    /// The loopback's arrivals are then all steered to CPU 0 (RPS, through a sysfs mounted in
    /// a mount namespace of its own), where `unshare`, `sh` and `mount` allow: the token bucket
    /// hands datagrams on from the sending thread's CPU or from its timer's, each CPU's
    /// backlog is delivered on its own, and so the kernel itself would otherwise reorder a few
    /// datagrams now and then (seen once in 144 runs of the order test on epoll + mmsg).
    pub(crate) fn on_slow_loopback<T: Send>(rate: &str, f: impl FnOnce() -> T + Send) -> Option<T> {
        let required = std::env::var_os("RICOCHET_TEST_REQUIRE_NETNS").is_some();
        let skip = |why: String| {
            assert!(!required, "RICOCHET_TEST_REQUIRE_NETNS is set: {why}");
            eprintln!("skipping: {why}");
        };
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: unshare(2) with CLONE_NEWNET moves only the calling thread (this
                // scoped one, which ends after `f`) to a new network namespace.
                if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                    let e = std::io::Error::last_os_error();
                    skip(format!("no network namespace of our own: {e}"));
                    return None;
                }
                let tbf = format!("tc qdisc add dev lo root tbf rate {rate} burst 4kb limit 1mb");
                for cmd in ["ip link set lo up", tbf.as_str()] {
                    let mut words = cmd.split(' ');
                    let program = words.next().unwrap_or_default();
                    // A child spawned by this thread starts in its namespace.
                    match std::process::Command::new(program).args(words).status() {
                        Ok(status) if status.success() => {}
                        other => {
                            skip(format!("`{cmd}`: {other:?}"));
                            return None;
                        }
                    }
                }
                let rps =
                    "mount -t sysfs sysfs /sys && echo 1 > /sys/class/net/lo/queues/rx-0/rps_cpus";
                let steered = std::process::Command::new("unshare")
                    .args(["--mount", "--propagation", "private", "sh", "-c", rps])
                    .status();
                if !matches!(&steered, Ok(s) if s.success()) {
                    eprintln!("arrivals not steered to one CPU (RPS): {steered:?}");
                }
                Some(f())
            })
            .join()
            .unwrap()
        })
    }

    /// A poll that waits keeps sending while a full send buffer drains: the datagrams the
    /// socket refused go out during that wait, not at the caller's next timer. `open` makes
    /// the backend under test on the socket it is given.
    pub(crate) fn sends_resume_when_the_buffer_drains(
        open: impl Fn(crate::socket::BoundSocket) -> Box<dyn Backend> + Send,
    ) {
        const N: usize = 48;
        let done = on_slow_loopback("20mbit", move || {
            let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let mut cfg = crate::socket::SocketConfig::new("127.0.0.1:0".parse().unwrap());
            // Room for a few datagrams at a time (the kernel doubles it).
            cfg.send_buffer = Some(8192);
            let mut tx = open(crate::socket::bind(&cfg).unwrap());
            let dst = rx.local_addr().unwrap();
            let mut batch = SendBatch::new(N);
            for i in 0..N {
                batch.push(dst, &[i as u8; 1000]).unwrap();
            }
            // 48 kB take about 20 ms at 20 Mbit/s; nothing comes back, so the poll waits
            // out its whole second.
            let out = tx.poll(&mut batch, Some(Duration::from_secs(1))).unwrap();
            assert!(
                tx.stats().send_would_block > 0,
                "the buffer never filled: {:?}",
                tx.stats()
            );
            assert_eq!((out.sent, batch.len()), (N, 0), "{:?}", tx.stats());
            rx.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            let mut buf = [0u8; 1500];
            for i in 0..N {
                let n = rx.recv(&mut buf).unwrap();
                assert_eq!(&buf[..n], &[i as u8; 1000][..]);
            }
        });
        if done.is_none() {
            eprintln!("skipped: the send buffer could not be made to fill");
        }
    }

    /// Numbered datagrams leave a socket in the order given while its send buffer fills and
    /// drains: `N` small datagrams, far more than the 16 KiB buffer holds, go through a poll
    /// loop onto a 5 Mbit/s link, and a receiver with room for all of them checks that each
    /// arrives where it was due. A backend that lets a later datagram out after the full
    /// buffer refused an earlier one (the link frees room between two sends of a round as it
    /// drains, in about every round here) sends one early, which this sees.
    pub(crate) fn sends_keep_their_order_when_the_buffer_fills(
        open: impl Fn(crate::socket::BoundSocket) -> Box<dyn Backend> + Send,
    ) {
        const N: u32 = 2000;
        const SIZE: usize = 100;
        let done = on_slow_loopback("5mbit", move || {
            let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            // Room for every datagram (about 1 KiB each as the kernel counts), so that none is
            // dropped before the receiver reads: as root, past `net.core.rmem_max`.
            crate::sys::set_int(
                std::os::fd::AsRawFd::as_raw_fd(&rx),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                16 << 20,
            )
            .unwrap();
            let mut cfg = crate::socket::SocketConfig::new("127.0.0.1:0".parse().unwrap());
            cfg.send_buffer = Some(8192);
            let mut tx = open(crate::socket::bind(&cfg).unwrap());
            let dst = rx.local_addr().unwrap();
            let mut batch = SendBatch::new(N as usize);
            let mut payload = [0u8; SIZE];
            for i in 0..N {
                payload[..4].copy_from_slice(&i.to_le_bytes());
                batch.push(dst, &payload).unwrap();
            }
            // 2,000 datagrams of 128 B on the wire take about 0.4 s at 5 Mbit/s: the sender
            // outpaces the link (the guard below), even on a loaded machine.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !batch.is_empty() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the batch did not drain: {:?}",
                    tx.stats()
                );
                tx.poll(&mut batch, Some(Duration::from_millis(10)))
                    .unwrap();
            }
            assert!(
                tx.stats().send_would_block > 0,
                "the buffer never filled: {:?}",
                tx.stats()
            );
            rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut buf = [0u8; 2048];
            for due in 0..N {
                let n = rx.recv(&mut buf).unwrap_or_else(|e| {
                    panic!("datagram {due} of {N} did not come ({e}): {:?}", tx.stats())
                });
                assert_eq!(n, SIZE);
                let got = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
                assert_eq!(
                    got,
                    due,
                    "datagram {got} arrived where {due} was due: {:?}",
                    tx.stats()
                );
            }
        });
        if done.is_none() {
            eprintln!("skipped: the send buffer could not be made to fill");
        }
    }

    /// A wake from another thread ends a long wait of `rx`.
    pub(crate) fn woken_from_another_thread(rx: &mut dyn Backend) {
        let w = rx.waker();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            w.wake().unwrap();
        });
        let mut empty = SendBatch::new(1);
        let out = rx.poll(&mut empty, Some(Duration::from_secs(10))).unwrap();
        assert!(out.woken);
        t.join().unwrap();
    }
}
