//! macOS backend: kqueue readiness with a `recvmsg`/`sendmsg` loop.

pub mod kqueue;

pub use kqueue::KqueueBackend;
