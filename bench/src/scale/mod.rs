//! Many sessions on one server: `bench sessions` (idle memory, handshakes, a window-1 echo over
//! thousands of clients) and `bench game` (a 60 Hz snapshot tick with reliable inputs). The
//! server runs in a child process ([`server`]) so that its memory and CPU are its own; the
//! clients run in the bench, all in one `ClientSet` on one thread.

#[cfg(target_os = "linux")]
mod floor;
pub mod game;
#[cfg(target_os = "linux")]
mod game_floor;
mod game_meter;
pub mod server;
pub mod sessions;

use std::net::{IpAddr, SocketAddr};

use anyhow::{bail, Result};
use ricochet::{ClientConfig, Profile};

/// The protocol profile named `name` (`default`, `game` or `bulk`).
pub fn protocol_profile(name: &str) -> Result<Profile> {
    Ok(match name {
        "default" => Profile::Default,
        "game" => Profile::Game,
        "bulk" => Profile::Bulk,
        other => bail!("unknown profile {other:?} (default, game or bulk)"),
    })
}

/// The error for a `--stack` this build does not measure.
fn unmeasured_stack(other: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "stack {other:?} is not measured here (ricochet{})",
        if cfg!(target_os = "linux") {
            " or kernel"
        } else {
            "; the kernel floor is Linux only"
        }
    )
}

/// The configuration of one member of a many-client set: `profile`, datagram `backend`, bound
/// to `ip`. Many members with small messages: a small batch and no GRO buffers (64 KiB each
/// otherwise), a 256 KiB socket buffer.
pub fn member_config(profile: &str, backend: &str, ip: IpAddr, seed: u64) -> Result<ClientConfig> {
    let mut c = ClientConfig::new()
        .profile(protocol_profile(profile)?)
        .seed(seed)
        .bind(SocketAddr::new(ip, 0));
    c.backend.kind = backend.parse()?;
    c.backend.batch_size = 8;
    c.backend.recv_buffers = 8;
    c.backend.max_datagram = 2048;
    c.backend.gro = false;
    c.socket_buffer = Some(256 << 10);
    Ok(c)
}
