//! System-wide UDP and IP counters, so a benchmark can report kernel evidence before → after.
//!
//! Linux reads `/proc/net/snmp` (and `/proc/net/snmp6` for the IPv6 figures); macOS reads the
//! `net.inet.udp.stats` sysctl. Counters the OS does not provide stay 0 and their group's
//! `*_available` flag is false.

use crate::error::Result;

/// A snapshot of the system's UDP/IP counters (cumulative since boot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelCounters {
    /// The UDP (IPv4) counters below were read.
    pub udp_available: bool,
    /// UDP datagrams delivered to sockets.
    pub udp_in_datagrams: u64,
    /// UDP datagrams to a port nobody listens on.
    pub udp_no_ports: u64,
    /// UDP datagrams not delivered for other reasons (includes buffer overflows).
    pub udp_in_errors: u64,
    /// UDP datagrams sent.
    pub udp_out_datagrams: u64,
    /// UDP datagrams dropped because a socket's receive buffer was full.
    pub udp_rcvbuf_errors: u64,
    /// UDP datagrams not sent because a socket's send buffer was full.
    pub udp_sndbuf_errors: u64,
    /// The UDP-over-IPv6 counters below were read.
    pub udp6_available: bool,
    /// UDP/IPv6 datagrams delivered to sockets.
    pub udp6_in_datagrams: u64,
    /// UDP/IPv6 datagrams to a port nobody listens on.
    pub udp6_no_ports: u64,
    /// UDP/IPv6 datagrams not delivered for other reasons.
    pub udp6_in_errors: u64,
    /// UDP/IPv6 datagrams sent.
    pub udp6_out_datagrams: u64,
    /// UDP/IPv6 datagrams dropped because a socket's receive buffer was full.
    pub udp6_rcvbuf_errors: u64,
    /// UDP/IPv6 datagrams not sent because a socket's send buffer was full.
    pub udp6_sndbuf_errors: u64,
    /// The IPv4 fragmentation counters below were read.
    pub ip_available: bool,
    /// IPv4 fragments that needed reassembly.
    pub ip_reasm_reqds: u64,
    /// IPv4 datagrams reassembled.
    pub ip_reasm_oks: u64,
    /// IPv4 reassembly failures (timeouts, errors).
    pub ip_reasm_fails: u64,
    /// IPv4 datagrams fragmented.
    pub ip_frag_oks: u64,
    /// IPv4 datagrams that needed fragmenting but could not be (e.g. don't-fragment set).
    pub ip_frag_fails: u64,
    /// IPv4 fragments created.
    pub ip_frag_creates: u64,
}

impl KernelCounters {
    /// Read the counters now.
    pub fn snapshot() -> Result<KernelCounters> {
        imp::snapshot()
    }

    /// `self − before`, field by field (saturating, so a counter reset gives 0 rather than a
    /// huge number). Availability flags are those of `self`.
    pub fn delta(&self, before: &KernelCounters) -> KernelCounters {
        macro_rules! sub {
            ($($f:ident),*) => {
                KernelCounters {
                    udp_available: self.udp_available,
                    udp6_available: self.udp6_available,
                    ip_available: self.ip_available,
                    $($f: self.$f.saturating_sub(before.$f),)*
                }
            };
        }
        sub!(
            udp_in_datagrams,
            udp_no_ports,
            udp_in_errors,
            udp_out_datagrams,
            udp_rcvbuf_errors,
            udp_sndbuf_errors,
            udp6_in_datagrams,
            udp6_no_ports,
            udp6_in_errors,
            udp6_out_datagrams,
            udp6_rcvbuf_errors,
            udp6_sndbuf_errors,
            ip_reasm_reqds,
            ip_reasm_oks,
            ip_reasm_fails,
            ip_frag_oks,
            ip_frag_fails,
            ip_frag_creates
        )
    }
}

/// Fill `c` from the text of `/proc/net/snmp`: pairs of lines `Proto: Name1 Name2 ...` and
/// `Proto: value1 value2 ...`. Unknown or malformed lines are ignored.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn parse_snmp(text: &str, c: &mut KernelCounters) {
    let mut lines = text.lines();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        let (Some((proto, names)), Some((proto2, values))) =
            (names.split_once(':'), values.split_once(':'))
        else {
            continue;
        };
        if proto != proto2 {
            continue;
        }
        for (name, value) in names.split_whitespace().zip(values.split_whitespace()) {
            // Some counters are signed in the kernel's output (e.g. Ip: Forwarding); only the
            // unsigned ones matter here.
            let Ok(v) = value.parse::<u64>() else {
                continue;
            };
            match (proto, name) {
                ("Udp", "InDatagrams") => c.udp_in_datagrams = v,
                ("Udp", "NoPorts") => c.udp_no_ports = v,
                ("Udp", "InErrors") => c.udp_in_errors = v,
                ("Udp", "OutDatagrams") => c.udp_out_datagrams = v,
                ("Udp", "RcvbufErrors") => c.udp_rcvbuf_errors = v,
                ("Udp", "SndbufErrors") => c.udp_sndbuf_errors = v,
                ("Ip", "ReasmReqds") => c.ip_reasm_reqds = v,
                ("Ip", "ReasmOKs") => c.ip_reasm_oks = v,
                ("Ip", "ReasmFails") => c.ip_reasm_fails = v,
                ("Ip", "FragOKs") => c.ip_frag_oks = v,
                ("Ip", "FragFails") => c.ip_frag_fails = v,
                ("Ip", "FragCreates") => c.ip_frag_creates = v,
                _ => continue,
            }
            match proto {
                "Udp" => c.udp_available = true,
                "Ip" => c.ip_available = true,
                _ => {}
            }
        }
    }
}

/// Fill the IPv6 UDP counters from the text of `/proc/net/snmp6`: one `Name value` per line.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn parse_snmp6(text: &str, c: &mut KernelCounters) {
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(name), Some(value)) = (it.next(), it.next()) else {
            continue;
        };
        let Ok(v) = value.parse::<u64>() else {
            continue;
        };
        let field = match name {
            "Udp6InDatagrams" => &mut c.udp6_in_datagrams,
            "Udp6NoPorts" => &mut c.udp6_no_ports,
            "Udp6InErrors" => &mut c.udp6_in_errors,
            "Udp6OutDatagrams" => &mut c.udp6_out_datagrams,
            "Udp6RcvbufErrors" => &mut c.udp6_rcvbuf_errors,
            "Udp6SndbufErrors" => &mut c.udp6_sndbuf_errors,
            _ => continue,
        };
        *field = v;
        c.udp6_available = true;
    }
}

#[cfg(target_os = "linux")]
mod imp {
    use super::*;
    use crate::error::Error;

    pub(super) fn snapshot() -> Result<KernelCounters> {
        let mut c = KernelCounters::default();
        let snmp = std::fs::read_to_string("/proc/net/snmp")
            .map_err(|e| Error::io("read /proc/net/snmp", e))?;
        parse_snmp(&snmp, &mut c);
        // IPv6 may be compiled out or disabled; the IPv4 figures still stand then.
        if let Ok(snmp6) = std::fs::read_to_string("/proc/net/snmp6") {
            parse_snmp6(&snmp6, &mut c);
        }
        Ok(c)
    }
}

#[cfg(target_vendor = "apple")]
mod imp {
    use super::*;
    use crate::error::Error;

    /// Leading fields of Darwin's `struct udpstat` (netinet/udp_var.h), all `u_int32_t`:
    /// ipackets, hdrops, badsum, badlen, noport, noportbcast, fullsock, pcbcachemiss,
    /// pcbhashmiss, opackets.
    const UDPSTAT_PREFIX: usize = 10;

    pub(super) fn snapshot() -> Result<KernelCounters> {
        let mut buf = [0u32; 64];
        let mut len = std::mem::size_of_val(&buf);
        let name = c"net.inet.udp.stats";
        // SAFETY: `name` is NUL-terminated; `buf`/`len` describe a writable buffer the kernel
        // fills up to `len` bytes and shrinks `len` to what it wrote.
        let rc = unsafe {
            libc::sysctlbyname(
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        if rc != 0 {
            return Err(Error::io(
                "sysctl net.inet.udp.stats",
                std::io::Error::last_os_error(),
            ));
        }
        if len < UDPSTAT_PREFIX * 4 {
            return Err(Error::io(
                "sysctl net.inet.udp.stats",
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "udpstat shorter than expected",
                ),
            ));
        }
        let f = |i: usize| u64::from(buf[i]);
        Ok(KernelCounters {
            udp_available: true,
            udp_in_datagrams: f(0),
            udp_in_errors: f(1) + f(2) + f(3),
            udp_no_ports: f(4),
            udp_rcvbuf_errors: f(6),
            udp_out_datagrams: f(9),
            ..KernelCounters::default()
        })
    }
}

#[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
mod imp {
    use super::*;
    use crate::error::Error;

    pub(super) fn snapshot() -> Result<KernelCounters> {
        Err(Error::io(
            "kernel counters",
            std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "no UDP counters on this OS",
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SNMP: &str = "Ip: Forwarding DefaultTTL InReceives ReasmReqds ReasmOKs ReasmFails FragOKs FragFails FragCreates\n\
Ip: 1 64 100 7 3 1 2 5 9\n\
Icmp: InMsgs\n\
Icmp: 4\n\
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors\n\
Udp: 1000 2 30 900 25 4 0\n\
UdpLite: InDatagrams NoPorts\n\
UdpLite: 77 78\n";

    #[test]
    fn parses_snmp_and_snmp6_and_subtracts() {
        let mut c = KernelCounters::default();
        parse_snmp(SNMP, &mut c);
        parse_snmp6(
            "Ip6InReceives 5\nUdp6InDatagrams 11\nUdp6RcvbufErrors 3\nbroken\n",
            &mut c,
        );
        assert!(c.udp_available && c.ip_available && c.udp6_available);
        assert_eq!(
            (
                c.udp_in_datagrams,
                c.udp_no_ports,
                c.udp_in_errors,
                c.udp_out_datagrams
            ),
            (1000, 2, 30, 900)
        );
        assert_eq!((c.udp_rcvbuf_errors, c.udp_sndbuf_errors), (25, 4));
        assert_eq!(
            (c.ip_reasm_reqds, c.ip_reasm_oks, c.ip_reasm_fails),
            (7, 3, 1)
        );
        assert_eq!(
            (c.ip_frag_oks, c.ip_frag_fails, c.ip_frag_creates),
            (2, 5, 9)
        );
        assert_eq!((c.udp6_in_datagrams, c.udp6_rcvbuf_errors), (11, 3));
        let mut before = c;
        before.udp_in_datagrams = 400;
        before.udp_rcvbuf_errors = 30; // larger than now: saturates to 0
        let d = c.delta(&before);
        assert_eq!(d.udp_in_datagrams, 600);
        assert_eq!(d.udp_rcvbuf_errors, 0);
        assert_eq!(d.udp_no_ports, 0);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn live_snapshot_counts_a_loopback_datagram() {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let before = KernelCounters::snapshot().unwrap();
        tx.send_to(b"x", rx.local_addr().unwrap()).unwrap();
        let mut buf = [0u8; 4];
        rx.recv_from(&mut buf).unwrap();
        let d = KernelCounters::snapshot().unwrap().delta(&before);
        assert!(d.udp_available);
        assert!(d.udp_in_datagrams >= 1 && d.udp_out_datagrams >= 1);
    }
}
