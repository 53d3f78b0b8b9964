//! Echo servers the clients measure: the tokio baseline here, Ricochet's runtime in
//! [`super::ricochet_server`].

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use socket2::{Domain, Protocol, Socket, Type};

use crate::schema::{ServerInfo, SocketBuffers};

/// A running echo server.
pub trait EchoServer: Send {
    /// Address the clients send to.
    fn local_addr(&self) -> SocketAddr;
    /// Stop, join every thread, and describe what ran.
    fn shutdown(self: Box<Self>) -> Result<ServerInfo>;
}

/// Spin for `ns` nanoseconds: the per-message work a real handler would do.
#[inline]
pub fn busy_work(ns: u64) {
    if ns == 0 {
        return;
    }
    let start = Instant::now();
    let d = Duration::from_nanos(ns);
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// The loopback address of a family, port 0.
pub fn loopback(ipv6: bool) -> SocketAddr {
    if ipv6 {
        SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 0))
    } else {
        SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0))
    }
}

/// Bind a plain UDP socket with the requested buffers; returns it and what the OS granted.
pub fn bind_udp(
    addr: SocketAddr,
    recv_buffer: Option<usize>,
    send_buffer: Option<usize>,
) -> Result<(UdpSocket, SocketBuffers)> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
        .context("server socket")?;
    if addr.is_ipv6() {
        socket.set_only_v6(true).context("IPV6_V6ONLY")?;
    }
    if let Some(n) = recv_buffer {
        socket.set_recv_buffer_size(n).context("server SO_RCVBUF")?;
    }
    if let Some(n) = send_buffer {
        socket.set_send_buffer_size(n).context("server SO_SNDBUF")?;
    }
    socket
        .bind(&addr.into())
        .with_context(|| format!("bind {addr}"))?;
    let local = socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .ok_or_else(|| anyhow!("bound socket has no address"))?;
    let info = SocketBuffers {
        local_addr: local.to_string(),
        recv_requested: recv_buffer,
        recv_granted: socket.recv_buffer_size().unwrap_or(0),
        send_requested: send_buffer,
        send_granted: socket.send_buffer_size().unwrap_or(0),
        drops: None,
    };
    Ok((socket.into(), info))
}

/// The echo a Rust user would write with tokio: one `UdpSocket`, `threads` tasks doing
/// `recv_from` / `send_to` on it, on a current-thread runtime (1 thread) or a multi-thread
/// runtime with `threads` workers.
pub struct TokioServer {
    addr: SocketAddr,
    stop: tokio::sync::watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
    threads: usize,
    socket: SocketBuffers,
}

impl TokioServer {
    /// Start on `addr` with `threads` worker threads (0: one per core), spinning `work_ns` per
    /// message before echoing it.
    pub fn start(
        addr: SocketAddr,
        threads: usize,
        work_ns: u64,
        recv_buffer: Option<usize>,
        send_buffer: Option<usize>,
    ) -> Result<TokioServer> {
        let threads = if threads == 0 {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        } else {
            threads
        };
        let (std_socket, info) = bind_udp(addr, recv_buffer, send_buffer)?;
        std_socket
            .set_nonblocking(true)
            .context("set_nonblocking")?;
        let local = std_socket.local_addr().context("local_addr")?;
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
        let thread = std::thread::Builder::new()
            .name("tokio-echo".into())
            .spawn(move || -> Result<()> {
                let rt = if threads <= 1 {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                } else {
                    tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(threads)
                        .enable_all()
                        .build()
                };
                let rt = match rt {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(anyhow!("tokio runtime: {e}")));
                        return Err(e.into());
                    }
                };
                rt.block_on(async move {
                    let socket = match tokio::net::UdpSocket::from_std(std_socket) {
                        Ok(s) => Arc::new(s),
                        Err(e) => {
                            let _ = ready_tx.send(Err(anyhow!("tokio UdpSocket: {e}")));
                            return Err(e.into());
                        }
                    };
                    let mut tasks = Vec::with_capacity(threads);
                    for _ in 0..threads {
                        let socket = socket.clone();
                        let mut stop_rx = stop_rx.clone();
                        tasks.push(tokio::spawn(async move {
                            let mut buf = vec![0u8; 65_536];
                            loop {
                                tokio::select! {
                                    _ = stop_rx.changed() => break,
                                    r = socket.recv_from(&mut buf) => {
                                        if let Ok((n, from)) = r {
                                            busy_work(work_ns);
                                            let _ = socket.send_to(&buf[..n], from).await;
                                        }
                                    }
                                }
                            }
                        }));
                    }
                    let _ = ready_tx.send(Ok(()));
                    for t in tasks {
                        t.await.map_err(|e| anyhow!("echo task: {e}"))?;
                    }
                    Ok(())
                })
            })
            .context("spawning the tokio server thread")?;
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(anyhow!("tokio server did not start within 10 s")),
        }
        Ok(TokioServer {
            addr: local,
            stop,
            thread: Some(thread),
            threads,
            socket: info,
        })
    }
}

impl EchoServer for TokioServer {
    fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    fn shutdown(mut self: Box<Self>) -> Result<ServerInfo> {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            t.join()
                .map_err(|_| anyhow!("tokio server thread panicked"))??;
        }
        Ok(ServerInfo {
            kind: "tokio".into(),
            io_model: "shared".into(),
            threads: self.threads,
            backend: "tokio".into(),
            selection_reason: if self.threads <= 1 {
                "tokio current-thread runtime, one UdpSocket".into()
            } else {
                format!(
                    "tokio multi-thread runtime ({} workers), one UdpSocket, {} tasks",
                    self.threads, self.threads
                )
            },
            sockets: vec![self.socket.clone()],
            workers: Vec::new(),
            sessions_per_worker: None,
            forwarded: None,
        })
    }
}

impl Drop for TokioServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
