//! The C ABI of Ricochet: connect tokens, the game client and the server, for programs in C,
//! C++, C# (Unity) and any language that calls C.
//!
//! The header is `include/ricochet.h`, generated from this crate by cbindgen (its conventions
//! on handles, buffers and threads are written once at its top). Every export:
//!
//! - returns a [`ricochet_status`] (0 is success), except the three that return static text;
//! - takes handles by value: opaque 64-bit ids looked up in a table that checks their kind and
//!   generation, so a null, destroyed or stale handle returns an error instead of touching
//!   freed memory;
//! - runs inside `catch_unwind`: a panic comes back as [`ricochet_status::RICOCHET_ERROR_PANIC`];
//! - keeps no pointer it was given past the call and hands out no memory to free.
//!
//! The server side is poll-style: the runtime's [`ricochet::Handler`] on each worker pushes
//! events into a bounded queue per worker that the host drains ([`server`]).

// Exported names follow C's conventions (`ricochet_client`, `RICOCHET_OK`): they are the
// names the header and every binding use.
#![allow(non_camel_case_types)]

pub mod client;
mod handles;
pub mod lanes;
pub mod server;
mod status;
pub mod token;

pub use client::{ricochet_client, ricochet_client_config, ricochet_client_event};
pub use lanes::ricochet_lane;
pub use server::{
    ricochet_server, ricochet_server_config, ricochet_server_event, ricochet_session,
};
pub use status::{ricochet_event_kind, ricochet_stats, ricochet_status};
pub use token::ricochet_token_issuer;

use std::ffi::c_char;

/// The library's version ("major.minor.patch"), a static NUL-terminated string: never free it.
#[no_mangle]
pub extern "C" fn ricochet_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// What `code` (a [`ricochet_status`]) means, as a static NUL-terminated string (never free
/// it); an unknown code gives "unknown status code".
#[no_mangle]
pub extern "C" fn ricochet_error_text(code: i32) -> *const c_char {
    status::text(code).as_ptr().cast()
}

/// Copy the calling thread's last error message (more detailed than [`ricochet_error_text`]:
/// which setting, which address) into `buf` (`cap` bytes, caller-owned, written during the
/// call only), NUL-terminated, and its length without the NUL into `*len` (if `len` is not
/// null). An empty string when this thread's last call succeeded. A `buf` too small returns
/// `RICOCHET_ERROR_BUFFER_TOO_SMALL` with the length needed (NUL included) in `*len`.
///
/// # Safety
///
/// `buf` must be null or point to `cap` writable bytes; `len` null or one writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn ricochet_last_error(
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> ricochet_status {
    // Not through `guard`: reading the last error must not reset it.
    std::panic::catch_unwind(|| {
        let message = status::last_error();
        // SAFETY: the caller's contract above.
        unsafe { status::write_str(&message, buf.cast(), cap, len) }
    })
    .unwrap_or(ricochet_status::RICOCHET_ERROR_PANIC)
}

/// What a close reason code (`reason` of a disconnected event: the wire code of
/// [`ricochet::CloseReason`]) means, as a static NUL-terminated string (never free it).
/// Codes 128..=255 are refusals by the server application (`Rejected`), with its own code in
/// the low 7 bits.
#[no_mangle]
pub extern "C" fn ricochet_close_reason_text(reason: u8) -> *const c_char {
    status::close_reason_text(reason).as_ptr().cast()
}

/// Panics inside the library (a test export, only in a build with the `panic-test` feature):
/// returns `RICOCHET_ERROR_PANIC`, showing that no panic crosses the boundary.
#[cfg(feature = "panic-test")]
#[no_mangle]
pub extern "C" fn ricochet_test_panic() -> ricochet_status {
    status::guard(|| -> Result<(), status::Error> {
        panic!("ricochet_test_panic: a panic inside the library")
    })
}
