//! Many sessions on one server: `bench sessions` (idle memory, handshakes, a window-1 echo over
//! thousands of clients) and `bench game` (a 60 Hz snapshot tick with reliable inputs). The
//! server runs in a child process ([`server`]) so that its memory and CPU are its own; the
//! players run in a load-generator process of their own ([`load_process`]) on
//! `--load-threads` threads (`load`; `bench sessions`' churn in `churn`; idle on one).

mod churn;
mod echo_meter;
#[cfg(target_os = "linux")]
mod floor;
pub mod game;
#[cfg(target_os = "linux")]
mod game_floor;
mod game_meter;
mod load;
pub mod load_process;
pub mod server;
pub mod sessions;
pub mod setup;

use std::io::{BufRead, Write};

use anyhow::Result;

#[cfg(target_os = "linux")]
pub use floor::FLOOR_CHURN_EXCHANGES;
pub use load::describe as describe_load;
use server::ServerKind;

/// The server process's main: read the spec, start the server it asks for (Ricochet's, or
/// the kernel floor's), answer until `quit`.
pub fn serve_process(input: impl BufRead, output: impl Write) -> Result<()> {
    let mut lines = input.lines();
    let spec = server::read_spec(&mut lines)?;
    match spec.kind {
        #[cfg(target_os = "linux")]
        ServerKind::KernelEcho => floor::serve_process(&spec, lines, output),
        #[cfg(target_os = "linux")]
        ServerKind::KernelGame { .. } => game_floor::serve_process(&spec, lines, output),
        #[cfg(not(target_os = "linux"))]
        ServerKind::KernelEcho | ServerKind::KernelGame { .. } => {
            anyhow::bail!("the kernel floor (recvmmsg, sendmmsg, epoll) is Linux only")
        }
        ServerKind::Echo | ServerKind::Game { .. } => server::serve_ricochet(&spec, lines, output),
    }
}
