//! macOS backend: kqueue readiness with a `recvmsg`/`sendto` loop.

pub mod kqueue;

pub use kqueue::KqueueBackend;
