//! `ricochet-platform`: sockets and batched datagram I/O for Ricochet.
//!
//! This crate knows nothing of RUDP. It binds UDP sockets (IPv4/IPv6, `SO_REUSEPORT`, buffer
//! sizes requested *and granted*, don't-fragment, per-socket drop counting) and moves datagrams
//! in batches through one of several [`Backend`]s chosen at run time:
//!
//! | backend | OS | receive | send |
//! | --- | --- | --- | --- |
//! | `uring` | Linux | multishot `recvmsg` into a provided-buffer ring | batched send SQEs, one `io_uring_enter` per turn |
//! | `mmsg` | Linux | epoll + `recvmmsg` | `sendmmsg` (`sendto` for a single datagram), partial sends resumed |
//! | `kqueue` | macOS | kqueue + `recvmsg` in a loop | `sendto` in a loop (Darwin's batched `recvmsg_x`/`sendmsg_x` are private API, not used) |
//!
//! [`open`] picks the backend (`auto` = the best that works; the `RICOCHET_BACKEND` environment
//! variable forces one) and falls back from `uring` to `mmsg` with one clear log line saying why.
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

pub mod backend;
pub mod batch;
mod cache;
pub mod counters;
pub mod error;
mod open;
#[cfg(unix)]
pub mod ready;
pub mod sched;
pub mod select;
pub mod socket;

#[cfg(unix)]
mod sys;

#[cfg(target_os = "linux")]
pub mod linux;

#[cfg(target_os = "macos")]
pub mod apple;

pub use backend::{
    Backend, BackendConfig, BackendKind, BackendStats, PollOutcome, Wake, Waker, BACKEND_ENV,
};
pub use batch::{
    max_coalesced_segment, max_payload_for, RecvBatch, RecvDatagram, RecvMeta, SendBatch,
    SendEntry, MAX_GSO_SEGMENTS, MAX_UDP_PAYLOAD_V4, MAX_UDP_PAYLOAD_V6,
};
pub use cache::prefetch;
pub use counters::KernelCounters;
pub use error::{Error, Result};
pub use open::{open, probe, Capabilities, URING_FAIL_ENV};
#[cfg(unix)]
pub use ready::{Poller, ReadySet};
pub use select::Capability;
pub use socket::{
    bind, route_max_payload, steer_reuseport, steer_reuseport_by_source_port, BoundSocket,
    PmtuDiscovery, SocketConfig, SocketInfo, SteerRule,
};
