//! Small unix helpers shared by the backends: socket addresses to and from `sockaddr_storage`
//! without allocating, `setsockopt`/`getsockopt` for plain integers, and errno handling.

use std::io;
use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;

/// Write `addr` into `storage`; returns the length to pass as `msg_namelen`.
pub(crate) fn encode_addr(
    addr: &SocketAddr,
    storage: &mut libc::sockaddr_storage,
) -> libc::socklen_t {
    match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in; an
            // all-zero sockaddr_in is valid.
            let sin = unsafe {
                &mut *(storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            // SAFETY: all-zero is a valid bit pattern for this plain C struct.
            *sin = unsafe { mem::zeroed() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr = libc::in_addr {
                s_addr: u32::from_ne_bytes(a.ip().octets()),
            };
            #[cfg(target_vendor = "apple")]
            {
                sin.sin_len = mem::size_of::<libc::sockaddr_in>() as u8;
            }
            mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe {
                &mut *(storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            // SAFETY: all-zero is a valid bit pattern for this plain C struct.
            *sin6 = unsafe { mem::zeroed() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_flowinfo = a.flowinfo().to_be();
            sin6.sin6_addr = libc::in6_addr {
                s6_addr: a.ip().octets(),
            };
            sin6.sin6_scope_id = a.scope_id();
            #[cfg(target_vendor = "apple")]
            {
                sin6.sin6_len = mem::size_of::<libc::sockaddr_in6>() as u8;
            }
            mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

/// Read a socket address the kernel wrote; `None` for a family other than IPv4/IPv6 or a
/// length too short for it.
pub(crate) fn decode_addr(
    storage: &libc::sockaddr_storage,
    len: libc::socklen_t,
) -> Option<SocketAddr> {
    let len = len as usize;
    match storage.ss_family as libc::c_int {
        libc::AF_INET if len >= mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, and the length covers it.
            let sin =
                unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len >= mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: the family says the storage holds a sockaddr_in6, and the length covers it.
            let sin6 = unsafe {
                &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// A zeroed `sockaddr_storage`.
pub(crate) fn zeroed_storage() -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid bit pattern for sockaddr_storage.
    unsafe { mem::zeroed() }
}

/// `setsockopt` with a C `int` value.
pub(crate) fn set_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `value` lives across the call and its size is passed; an invalid fd only yields EBADF.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `getsockopt` for a C `int` value.
#[cfg(target_os = "linux")]
pub(crate) fn get_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` live across the call and `len` holds `value`'s size; an
    // invalid fd only yields EBADF.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One datagram to `dst` with `sendto`, its address encoded on the stack: the bytes sent, or
/// the error.
pub(crate) fn send_to(fd: RawFd, dst: &SocketAddr, payload: &[u8]) -> io::Result<usize> {
    let mut name = zeroed_storage();
    let namelen = encode_addr(dst, &mut name);
    // SAFETY: `payload` and `name` are live for the call, with the lengths given; an invalid
    // fd only yields EBADF.
    let n = unsafe {
        libc::sendto(
            fd,
            payload.as_ptr().cast(),
            payload.len(),
            0,
            (&name as *const libc::sockaddr_storage).cast(),
            namelen,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// True for the errno values that mean "try again later".
pub(crate) fn would_block(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(e) if e == libc::EAGAIN || e == libc::EWOULDBLOCK)
}

/// Control-message buffer with the alignment `cmsghdr` needs.
#[cfg(target_os = "linux")]
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub(crate) struct CmsgBuf(pub [u8; CMSG_BUF_LEN]);

/// Room for the control messages the backends ask for (drop counter, GRO/GSO segment size).
#[cfg(target_os = "linux")]
pub(crate) const CMSG_BUF_LEN: usize = 128;

#[cfg(target_os = "linux")]
impl CmsgBuf {
    /// A zeroed buffer.
    pub(crate) const fn new() -> Self {
        CmsgBuf([0; CMSG_BUF_LEN])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addr_round_trip() {
        for s in [
            "127.0.0.1:4433",
            "[::1]:9",
            "[fe80::1%3]:65535",
            "0.0.0.0:0",
        ] {
            let a: SocketAddr = s.parse().unwrap();
            let mut st = zeroed_storage();
            let len = encode_addr(&a, &mut st);
            assert_eq!(decode_addr(&st, len), Some(a));
            assert_eq!(decode_addr(&st, 2), None);
        }
    }
}
