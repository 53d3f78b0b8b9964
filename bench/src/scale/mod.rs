//! Many sessions on one server: `bench sessions` (idle memory, handshakes, a window-1 echo over
//! thousands of clients) and `bench game` (a 60 Hz snapshot tick with reliable inputs). The
//! server runs in a child process ([`server`]) so that its memory and CPU are its own; the
//! clients run in the bench, all in one `ClientSet` on one thread.

pub mod game;
pub mod server;
pub mod sessions;
