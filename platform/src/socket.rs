//! UDP socket setup: address family, `SO_REUSEPORT`, buffer sizes requested *and granted*,
//! don't-fragment / path-MTU discovery, and per-socket drop counting.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::OnceLock;

use socket2::{Domain, Protocol, Socket, Type};

use crate::error::{Error, Result};

/// What the socket does about IP fragmentation and path-MTU discovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PmtuDiscovery {
    /// Set the don't-fragment bit and let the kernel track the path MTU; a send larger than
    /// the known path MTU fails (`EMSGSIZE`) instead of being fragmented.
    Do,
    /// Never set the don't-fragment bit: the kernel fragments large datagrams.
    Dont,
    /// Leave the operating system's default alone.
    #[default]
    OsDefault,
}

/// How to bind a UDP socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketConfig {
    /// Local address; port 0 picks a free port. An IPv6 address gives an IPv6-only socket.
    pub addr: SocketAddr,
    /// Set `SO_REUSEPORT` so several sockets (one per worker) share the address.
    pub reuse_port: bool,
    /// Receive buffer size to ask for (`None`: the OS default).
    pub recv_buffer: Option<usize>,
    /// Send buffer size to ask for (`None`: the OS default).
    pub send_buffer: Option<usize>,
    /// Don't-fragment / PMTU discovery setting.
    pub pmtu: PmtuDiscovery,
    /// Ask the kernel to count datagrams dropped for lack of buffer space (`SO_RXQ_OVFL`).
    pub count_drops: bool,
}

impl SocketConfig {
    /// A configuration for `addr` with OS-default buffers, no `SO_REUSEPORT`, the OS's PMTU
    /// setting and drop counting on.
    pub fn new(addr: SocketAddr) -> Self {
        SocketConfig {
            addr,
            reuse_port: false,
            recv_buffer: None,
            send_buffer: None,
            pmtu: PmtuDiscovery::OsDefault,
            count_drops: true,
        }
    }
}

/// What the socket ended up with. Buffer sizes are what `getsockopt` reports (Linux reports
/// twice the requested value, to account for its bookkeeping overhead).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketInfo {
    /// The bound address (with the real port when port 0 was asked for).
    pub local_addr: SocketAddr,
    /// Receive buffer size asked for, if any.
    pub recv_buffer_requested: Option<usize>,
    /// Receive buffer size the kernel reports.
    pub recv_buffer_granted: usize,
    /// Send buffer size asked for, if any.
    pub send_buffer_requested: Option<usize>,
    /// Send buffer size the kernel reports.
    pub send_buffer_granted: usize,
    /// The buffer sizes were set with `SO_RCVBUFFORCE`/`SO_SNDBUFFORCE` (privileged, ignores
    /// `net.core.rmem_max`/`wmem_max`).
    pub buffers_forced: bool,
    /// `SO_REUSEPORT` is set.
    pub reuse_port: bool,
    /// The PMTU discovery setting applied.
    pub pmtu: PmtuDiscovery,
    /// The kernel counts this socket's dropped datagrams (`SO_RXQ_OVFL`).
    pub drop_counting: bool,
}

/// A bound, non-blocking UDP socket and what it was granted.
pub struct BoundSocket {
    socket: Socket,
    /// What [`BoundSocket::info`] reports, but for the granted buffer sizes: those are asked
    /// of the kernel on the first call (two system calls fewer per socket for callers that
    /// never look, such as a client fleet opening thousands).
    setup: SocketInfo,
    info: OnceLock<SocketInfo>,
}

impl BoundSocket {
    fn new(socket: Socket, setup: SocketInfo) -> Self {
        BoundSocket {
            socket,
            setup,
            info: OnceLock::new(),
        }
    }

    /// The socket.
    pub fn socket(&self) -> &Socket {
        &self.socket
    }

    /// What the socket was granted. The buffer sizes are read from the kernel on the first
    /// call; a size the kernel will not report (it always does for an open socket) reads 0.
    pub fn info(&self) -> &SocketInfo {
        self.info.get_or_init(|| SocketInfo {
            recv_buffer_granted: self.socket.recv_buffer_size().unwrap_or(0),
            send_buffer_granted: self.socket.send_buffer_size().unwrap_or(0),
            ..self.setup.clone()
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.setup.local_addr
    }

    /// The kernel counts this socket's dropped datagrams (`SO_RXQ_OVFL`).
    pub fn drop_counting(&self) -> bool {
        self.setup.drop_counting
    }

    /// A second handle to the same socket (`dup`), e.g. for the shared IO model where several
    /// threads each run a backend on one socket.
    pub fn try_clone(&self) -> Result<BoundSocket> {
        let socket = self
            .socket
            .try_clone()
            .map_err(|e| Error::io("dup socket", e))?;
        Ok(BoundSocket::new(socket, self.setup.clone()))
    }

    /// Take the socket apart.
    pub fn into_parts(self) -> (Socket, SocketInfo) {
        let info = self.info().clone();
        (self.socket, info)
    }

    /// The socket alone, without asking the kernel for what [`BoundSocket::info`] reports.
    pub fn into_socket(self) -> Socket {
        self.socket
    }
}

impl std::fmt::Debug for BoundSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundSocket")
            .field("socket", &self.socket)
            .field("info", self.info())
            .finish()
    }
}

impl AsRawFd for BoundSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

/// Bind a non-blocking UDP socket as `cfg` says and report what the kernel granted.
pub fn bind(cfg: &SocketConfig) -> Result<BoundSocket> {
    let domain = match cfg.addr {
        SocketAddr::V4(_) => Domain::IPV4,
        SocketAddr::V6(_) => Domain::IPV6,
    };
    // Non-blocking from the start where the OS can say so in `socket()` (two `fcntl` calls
    // fewer per socket: a client fleet opens thousands).
    #[cfg(target_os = "linux")]
    let ty = Type::DGRAM.nonblocking();
    #[cfg(not(target_os = "linux"))]
    let ty = Type::DGRAM;
    let socket =
        Socket::new(domain, ty, Some(Protocol::UDP)).map_err(|e| Error::io("socket", e))?;
    #[cfg(not(target_os = "linux"))]
    socket
        .set_nonblocking(true)
        .map_err(|e| Error::io("set non-blocking", e))?;
    if cfg.addr.is_ipv6() {
        socket
            .set_only_v6(true)
            .map_err(|e| Error::io("IPV6_V6ONLY", e))?;
    }
    if cfg.reuse_port {
        set_reuse_port(&socket)?;
    }
    let mut buffers_forced = false;
    if let Some(size) = cfg.recv_buffer {
        buffers_forced |= set_buffer(&socket, size, true)?;
    }
    if let Some(size) = cfg.send_buffer {
        buffers_forced |= set_buffer(&socket, size, false)?;
    }
    set_pmtu(&socket, cfg.addr.is_ipv6(), cfg.pmtu)?;
    let drop_counting = cfg.count_drops && enable_drop_counting(&socket)?;
    socket
        .bind(&cfg.addr.into())
        .map_err(|e| Error::io("bind", e))?;

    let local_addr = socket
        .local_addr()
        .map_err(|e| Error::io("getsockname", e))?
        .as_socket()
        .ok_or_else(|| Error::InvalidConfig("bound socket has no IP address".into()))?;
    let setup = SocketInfo {
        local_addr,
        recv_buffer_requested: cfg.recv_buffer,
        recv_buffer_granted: 0,
        send_buffer_requested: cfg.send_buffer,
        send_buffer_granted: 0,
        buffers_forced,
        reuse_port: cfg.reuse_port,
        pmtu: cfg.pmtu,
        drop_counting,
    };
    Ok(BoundSocket::new(socket, setup))
}

fn set_reuse_port(socket: &Socket) -> Result<()> {
    #[cfg(unix)]
    {
        socket
            .set_reuse_port(true)
            .map_err(|e| Error::io("SO_REUSEPORT", e))
    }
    #[cfg(not(unix))]
    {
        let _ = socket;
        Err(Error::InvalidConfig(
            "SO_REUSEPORT is not supported on this OS".into(),
        ))
    }
}

/// Set a buffer size; on Linux try the privileged `*BUFFORCE` option first (it ignores the
/// `rmem_max`/`wmem_max` caps) and fall back to the plain one. Returns whether it was forced.
fn set_buffer(socket: &Socket, size: usize, recv: bool) -> Result<bool> {
    let value = libc::c_int::try_from(size)
        .map_err(|_| Error::InvalidConfig(format!("buffer size {size} is too large")))?;
    #[cfg(target_os = "linux")]
    {
        let force = if recv {
            libc::SO_RCVBUFFORCE
        } else {
            libc::SO_SNDBUFFORCE
        };
        // Only root (CAP_NET_ADMIN) may force; others get EPERM and use the capped option.
        if crate::sys::set_int(socket.as_raw_fd(), libc::SOL_SOCKET, force, value).is_ok() {
            return Ok(true);
        }
    }
    let r = if recv {
        socket.set_recv_buffer_size(value as usize)
    } else {
        socket.set_send_buffer_size(value as usize)
    };
    r.map_err(|e| Error::io(if recv { "SO_RCVBUF" } else { "SO_SNDBUF" }, e))?;
    Ok(false)
}

fn set_pmtu(socket: &Socket, v6: bool, pmtu: PmtuDiscovery) -> Result<()> {
    if pmtu == PmtuDiscovery::OsDefault {
        return Ok(());
    }
    let fd = socket.as_raw_fd();
    #[cfg(target_os = "linux")]
    {
        let (level, name, value, op) = match (v6, pmtu) {
            (false, PmtuDiscovery::Do) => (
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
                "IP_MTU_DISCOVER",
            ),
            (false, _) => (
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DONT,
                "IP_MTU_DISCOVER",
            ),
            (true, PmtuDiscovery::Do) => (
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DO,
                "IPV6_MTU_DISCOVER",
            ),
            (true, _) => (
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DONT,
                "IPV6_MTU_DISCOVER",
            ),
        };
        crate::sys::set_int(fd, level, name, value).map_err(|e| Error::io(op, e))
    }
    #[cfg(target_vendor = "apple")]
    {
        // Darwin has no PMTU modes, only a don't-fragment flag per family.
        let value = libc::c_int::from(pmtu == PmtuDiscovery::Do);
        let (level, name, op) = if v6 {
            (libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG, "IPV6_DONTFRAG")
        } else {
            (libc::IPPROTO_IP, libc::IP_DONTFRAG, "IP_DONTFRAG")
        };
        crate::sys::set_int(fd, level, name, value).map_err(|e| Error::io(op, e))
    }
    #[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
    {
        let _ = (fd, v6);
        Err(Error::InvalidConfig(
            "PMTU discovery settings are not supported on this OS".into(),
        ))
    }
}

/// The largest UDP payload a datagram to `dst` may carry without IP fragmentation, as far as
/// this host knows: the MTU of the route to `dst` (the outgoing interface's, or a smaller
/// one the kernel learned from the path) less the IP and UDP headers. Read with `IP_MTU` /
/// `IPV6_MTU` on a throwaway socket connected to `dst` (nothing is sent). `None` where the
/// OS cannot say (no route, or not Linux).
pub fn route_max_payload(dst: SocketAddr) -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        let (domain, level, name, headers) = match dst {
            SocketAddr::V4(_) => (Domain::IPV4, libc::IPPROTO_IP, libc::IP_MTU, 20 + 8),
            SocketAddr::V6(_) => (Domain::IPV6, libc::IPPROTO_IPV6, libc::IPV6_MTU, 40 + 8),
        };
        let socket = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP)).ok()?;
        socket.connect(&dst.into()).ok()?;
        let mtu = crate::sys::get_int(socket.as_raw_fd(), level, name).ok()?;
        usize::try_from(mtu).ok()?.checked_sub(headers)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = dst;
        None
    }
}

/// Turn on `SO_RXQ_OVFL` where the OS has it; `Ok(false)` where it does not.
fn enable_drop_counting(socket: &Socket) -> Result<bool> {
    #[cfg(target_os = "linux")]
    {
        crate::sys::set_int(socket.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1)
            .map_err(|e| Error::io("SO_RXQ_OVFL", e))?;
        Ok(true)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = socket;
        Ok(false)
    }
}

/// Spread the datagrams of a `SO_REUSEPORT` group over its `group_size` sockets by UDP source
/// port (`port % group_size`, sockets numbered in the order they joined the group), instead of
/// the kernel's 4-tuple hash.
///
/// With a handful of flows the hash often lands unevenly (1:3 on two sockets was seen here),
/// leaving one per-core worker idle while the other saturates. The modulo is only as even as
/// the clients' ports: where a kernel hands out consecutive ephemeral ports it splits them
/// exactly, but Linux 6.x randomizes them, and 16 binds split 7:9, 10:6, 6:10 and 4:12 on
/// two sockets in four trials here; with many clients either way evens out. A protocol that
/// can name the socket in its own bytes does better with [`steer_reuseport`]. Attach it to any
/// one socket of the group after every socket has joined. Linux only (a classic BPF program,
/// `SO_ATTACH_REUSEPORT_CBPF`); elsewhere it returns [`Error::BackendUnavailable`].
pub fn steer_reuseport_by_source_port(socket: &BoundSocket, group_size: usize) -> Result<()> {
    steer_reuseport(socket, group_size, &[])
}

/// A rule of [`steer_reuseport`]: a datagram whose UDP payload matches goes to the socket whose
/// index (in the order the sockets joined the group) is the payload byte at `index_offset`.
///
/// A payload matches when it is longer than every offset the rule reads, its byte at
/// `kind_offset` lies in `kinds` (e.g. a range of packet types) and its byte at `flag_offset`
/// satisfies `byte & flag_mask == flag_value` (e.g. "this connection id carries an owner").
/// An index at or above the group size does not match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SteerRule {
    /// Offset of the byte that selects the rule.
    pub kind_offset: u16,
    /// Values of that byte the rule applies to.
    pub kinds: std::ops::RangeInclusive<u8>,
    /// Offset of the flag byte.
    pub flag_offset: u16,
    /// Bits of the flag byte that are compared.
    pub flag_mask: u8,
    /// Value those bits must have.
    pub flag_value: u8,
    /// Offset of the byte holding the socket index.
    pub index_offset: u16,
}

/// Steer the datagrams of a `SO_REUSEPORT` group of `group_size` sockets by their payload:
/// the first of `rules` that matches names the socket; a datagram no rule matches goes by UDP
/// source port, as [`steer_reuseport_by_source_port`].
///
/// A connection-oriented protocol that writes the owning worker into its connection ids keeps
/// every datagram of a connection on that worker's socket whatever the client's address, so a
/// client that changes address (NAT rebinding) needs no cross-worker forwarding, and the server
/// can place new connections on the least-loaded worker. Attach it to any one socket of the
/// group after every socket has joined; a later call replaces the program. Linux only (a classic
/// BPF program, `SO_ATTACH_REUSEPORT_CBPF`); elsewhere it returns
/// [`Error::BackendUnavailable`]. At most 16 rules.
pub fn steer_reuseport(socket: &BoundSocket, group_size: usize, rules: &[SteerRule]) -> Result<()> {
    if group_size == 0 || group_size > u32::MAX as usize {
        return Err(Error::InvalidConfig(format!(
            "reuseport group size {group_size} out of range"
        )));
    }
    if rules.len() > 16 {
        return Err(Error::InvalidConfig(format!(
            "{} reuseport steering rules: at most 16",
            rules.len()
        )));
    }
    steer_impl(socket, group_size as u32, rules)
}

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
fn steer_program(n: u32, rules: &[SteerRule]) -> Vec<libc::sock_filter> {
    let net = libc::SKF_NET_OFF as u32;
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let (ld_b, jgt, jge, jeq) = (
        libc::BPF_LD | libc::BPF_B | libc::BPF_ABS,
        libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K,
        libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K,
        libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
    );
    // In a reuseport program the packet data starts at the UDP payload; network-header bytes
    // are reached through SKF_NET_OFF. Each rule is one block of RULE_LEN instructions; a
    // failed test jumps to the next block (jump offsets count the instructions after the jump).
    const RULE_LEN: u8 = 11;
    let next = |at: u8| RULE_LEN - at - 1;
    let mut prog = Vec::with_capacity(rules.len() * RULE_LEN as usize + 9);
    for r in rules {
        let last = u32::from(r.kind_offset.max(r.flag_offset).max(r.index_offset));
        prog.extend([
            op(libc::BPF_LD | libc::BPF_W | libc::BPF_LEN, 0, 0, 0),
            op(jgt, 0, next(1), last),
            op(ld_b, 0, 0, u32::from(r.kind_offset)),
            op(jge, 0, next(3), u32::from(*r.kinds.start())),
            op(jgt, next(4), 0, u32::from(*r.kinds.end())),
            op(ld_b, 0, 0, u32::from(r.flag_offset)),
            op(
                libc::BPF_ALU | libc::BPF_AND | libc::BPF_K,
                0,
                0,
                u32::from(r.flag_mask),
            ),
            op(jeq, 0, next(7), u32::from(r.flag_value)),
            op(ld_b, 0, 0, u32::from(r.index_offset)),
            op(jge, next(9), 0, n),
            op(libc::BPF_RET | libc::BPF_A, 0, 0, 0),
        ]);
    }
    prog.extend([
        // A = IP version (high nibble of the first byte of the network header).
        op(ld_b, 0, 0, net),
        op(libc::BPF_ALU | libc::BPF_RSH | libc::BPF_K, 0, 0, 4),
        op(jeq, 3, 0, 6),
        // IPv4: X = header length, A = UDP source port right after it.
        op(libc::BPF_LDX | libc::BPF_B | libc::BPF_MSH, 0, 0, net),
        op(libc::BPF_LD | libc::BPF_H | libc::BPF_IND, 0, 0, net),
        op(libc::BPF_JMP | libc::BPF_JA, 0, 0, 1),
        // IPv6: the UDP header follows the 40-byte fixed header.
        op(libc::BPF_LD | libc::BPF_H | libc::BPF_ABS, 0, 0, net + 40),
        op(libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K, 0, 0, n),
        op(libc::BPF_RET | libc::BPF_A, 0, 0, 0),
    ]);
    prog
}

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
fn steer_impl(socket: &BoundSocket, n: u32, rules: &[SteerRule]) -> Result<()> {
    use std::os::fd::AsRawFd;
    // asm-generic/socket.h (x86-64 and aarch64 use the generic numbers).
    const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;
    let prog = steer_program(n, rules);
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `fprog` points at `prog`, both alive across the call; the kernel copies the
    // program and validates it.
    let rc = unsafe {
        libc::setsockopt(
            socket.socket().as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::io(
            "setsockopt(SO_ATTACH_REUSEPORT_CBPF)",
            std::io::Error::last_os_error(),
        ))
    }
}

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
fn steer_impl(_socket: &BoundSocket, _n: u32, _rules: &[SteerRule]) -> Result<()> {
    Err(Error::BackendUnavailable {
        backend: "reuseport steering",
        reason: "a reuseport BPF program needs Linux".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn loopback_route_payload_is_the_loopback_mtu_less_headers() {
        let mtu: usize = std::fs::read_to_string("/sys/class/net/lo/mtu")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let got = route_max_payload("127.0.0.1:9".parse().unwrap());
        // An IPv4 packet is at most 65,535 bytes, whatever the device's MTU.
        assert_eq!(got, Some(mtu.min(65_535) - 28));
    }

    #[test]
    fn binds_v4_and_v6_and_reports_granted_buffers() {
        let mut cfg = SocketConfig::new("127.0.0.1:0".parse().unwrap());
        cfg.recv_buffer = Some(1 << 20);
        cfg.send_buffer = Some(256 << 10);
        cfg.pmtu = PmtuDiscovery::Do;
        let s = bind(&cfg).unwrap();
        assert_ne!(s.local_addr().port(), 0);
        assert_eq!(s.info().recv_buffer_requested, Some(1 << 20));
        assert!(s.info().recv_buffer_granted > 0);
        assert!(s.info().send_buffer_granted > 0);
        assert_eq!(s.info().drop_counting, cfg!(target_os = "linux"));

        let mut cfg6 = SocketConfig::new("[::1]:0".parse().unwrap());
        cfg6.pmtu = PmtuDiscovery::Dont;
        let s6 = bind(&cfg6).unwrap();
        assert!(s6.local_addr().is_ipv6());
        assert!(s6.socket().only_v6().unwrap());
        let dup = s6.try_clone().unwrap();
        assert_eq!(dup.local_addr(), s6.local_addr());
    }

    #[test]
    fn a_bound_socket_never_blocks() {
        let s = bind(&SocketConfig::new("127.0.0.1:0".parse().unwrap())).unwrap();
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 64];
        let err = s.socket().recv_from(&mut buf).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
    }

    #[test]
    fn reuse_port_lets_two_sockets_share_an_address() {
        let mut cfg = SocketConfig::new("127.0.0.1:0".parse().unwrap());
        cfg.reuse_port = true;
        let a = bind(&cfg).unwrap();
        cfg.addr = a.local_addr();
        let b = bind(&cfg).unwrap();
        assert_eq!(a.local_addr(), b.local_addr());
        assert!(b.info().reuse_port);
    }
}
