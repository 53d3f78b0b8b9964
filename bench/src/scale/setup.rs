//! What `bench sessions` and `bench game` both set up: the protocol profile, each client's
//! configuration and address, the tokens, and a set of clients connected and kept alive.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use ricochet::{ClientConfig, ClientSet, Profile};

use crate::schema::SessionsConfig;

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
pub(super) fn unmeasured_stack(other: &str) -> anyhow::Error {
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

/// Address groups one batch of `cfg.clients` spans.
pub(super) fn groups(cfg: &SessionsConfig) -> usize {
    cfg.clients.div_ceil(cfg.clients_per_ip.max(1))
}

/// Loopback address of client group `g` (127.0.0.1, 127.0.0.2, ...). macOS answers only on
/// 127.0.0.1 by default: everything goes there.
pub(super) fn group_ip(g: usize) -> IpAddr {
    if cfg!(target_os = "linux") {
        let n = g as u32 + 1;
        IpAddr::V4(Ipv4Addr::new(127, (n >> 16) as u8, (n >> 8) as u8, n as u8))
    } else {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    }
}

/// A fresh backend key for a measurement's tokens (`None` for the insecure mode).
pub(crate) fn token_key(security: &str) -> Result<Option<[u8; 32]>> {
    match security {
        "secure" => Ok(Some(rand::random())),
        "insecure" => Ok(None),
        other => anyhow::bail!("unknown security mode {other:?} (secure or insecure)"),
    }
}

/// Connect `n` clients to `target` in groups of `per_ip` per address, the groups on the
/// addresses from [`group_ip`]`(first_group)` on; with `key`, each with a token the backend
/// would mint (listing `target`, then `server` when they differ). Returns the set and how long
/// the handshakes took (token minting excluded).
#[allow(clippy::too_many_arguments)]
pub(crate) fn connect_all(
    target: SocketAddr,
    server: SocketAddr,
    key: Option<[u8; 32]>,
    n: usize,
    per_ip: usize,
    first_group: usize,
    make: impl Fn(IpAddr, u64) -> Result<ClientConfig>,
    timeout: Duration,
) -> Result<(ClientSet, Duration)> {
    connect_range(
        (target, server),
        key,
        0..n,
        per_ip,
        first_group,
        false,
        make,
        timeout,
    )
}

/// Connect clients `range` of a population in groups of `per_ip` per address (client `i` in
/// group `first_group + i / per_ip`, with client id `i`), as [`connect_all`] connects all of
/// them: one load-generator thread's share. With `waves`, one group's handshakes finish
/// before the next group's start (thousands of handshakes at once on a loaded host outlast
/// the handshake timeout); otherwise all start at once.
#[allow(clippy::too_many_arguments)]
pub(crate) fn connect_range(
    (target, server): (SocketAddr, SocketAddr),
    key: Option<[u8; 32]>,
    range: std::ops::Range<usize>,
    per_ip: usize,
    first_group: usize,
    waves: bool,
    make: impl Fn(IpAddr, u64) -> Result<ClientConfig>,
    timeout: Duration,
) -> Result<(ClientSet, Duration)> {
    let mut addresses = vec![target];
    if server != target {
        addresses.push(server);
    }
    let tokens = match key {
        Some(k) => {
            let key = ricochet_proto::token::TokenKey::from_bytes(k);
            range
                .clone()
                .map(|i| crate::rudp::protocol::mint_token(&key, i as u64, &addresses))
                .collect::<Result<Vec<_>>>()?
        }
        None => Vec::new(),
    };
    let mut set = ClientSet::new();
    let t0 = Instant::now();
    let per_ip = per_ip.max(1);
    let mut first = range.start;
    while first < range.end {
        let g = first / per_ip;
        let k = ((g + 1) * per_ip).min(range.end) - first;
        let cfg = make(group_ip(first_group + g), 0x5e55_0000 + first as u64)?;
        if key.is_some() {
            let at = first - range.start;
            set.start_connecting(&tokens[at..at + k], &cfg)?;
        } else {
            set.start_connecting_insecure(target, &cfg, k)?;
        }
        first += k;
        if waves && first < range.end {
            // One address group's handshakes done before the next group's begin.
            set.wait_connected(timeout)?;
        }
    }
    set.wait_connected(timeout)?;
    let took = t0.elapsed();
    // The Connected events are the outcome just returned.
    while set.poll_event().is_some() {}
    Ok((set, took))
}

/// Step `set` for `d`, answering nothing (idle sessions: keepalives and acknowledgements).
pub(crate) fn idle_for(set: &mut ClientSet, d: Duration) -> Result<()> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        set.step(Duration::from_millis(20))?;
        while set.poll_event().is_some() {}
    }
    Ok(())
}
