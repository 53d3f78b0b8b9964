//! The protocol side of an RUDP round: the FEC policy it asks for, the endpoint settings of
//! its profile, and the connect tokens a game's backend would mint for it. A leaf of `rudp`:
//! the clients, the server and the round all read it.

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;

use anyhow::{bail, Result};
use ricochet_proto::token::{ConnectToken, TokenKey, TokenParams};
use ricochet_proto::{Config, CongestionController, EndpointConfig};

use crate::schema::RudpConfig;

/// The FEC policy a round asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FecPolicy {
    /// ARQ only.
    Off,
    /// Fixed parity.
    Fixed,
    /// Adaptive parity.
    Adaptive,
}

impl FecPolicy {
    /// Every policy, in the reference's order.
    pub const ALL: [FecPolicy; 3] = [FecPolicy::Off, FecPolicy::Fixed, FecPolicy::Adaptive];

    /// `off`, `fixed` or `adaptive`.
    pub fn name(self) -> &'static str {
        match self {
            FecPolicy::Off => "off",
            FecPolicy::Fixed => "fixed",
            FecPolicy::Adaptive => "adaptive",
        }
    }

    /// The table label: `ARQ only`, `fixed FEC`, `adaptive FEC`.
    pub fn label(self) -> &'static str {
        match self {
            FecPolicy::Off => "ARQ only",
            FecPolicy::Fixed => "fixed FEC",
            FecPolicy::Adaptive => "adaptive FEC",
        }
    }

    /// Whether this build can run the policy (every policy, since FEC is in the protocol).
    pub fn available(self) -> Result<()> {
        Ok(())
    }

    /// The protocol's policy, with the reference's parameters: fixed parity 2, adaptive up to
    /// 4, per group of up to 8 data shards.
    pub fn protocol(self) -> ricochet_proto::fec::FecPolicy {
        match self {
            FecPolicy::Off => ricochet_proto::fec::FecPolicy::Off,
            FecPolicy::Fixed => ricochet_proto::fec::FecPolicy::Fixed { parity: 2 },
            FecPolicy::Adaptive => ricochet_proto::fec::FecPolicy::Adaptive { max_parity: 4 },
        }
    }
}

impl FromStr for FecPolicy {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "off" => Ok(FecPolicy::Off),
            "fixed" => Ok(FecPolicy::Fixed),
            "adaptive" => Ok(FecPolicy::Adaptive),
            other => bail!("FEC policy {other:?}: expected off, fixed or adaptive"),
        }
    }
}

/// The protocol id of the bench's tokens.
pub const BENCH_PROTOCOL_ID: u64 = 0x0062_656e_6368;

/// A token for client `client_id` to the server at `addresses`, valid for an hour: what a
/// game's backend would issue.
pub fn mint_token(
    key: &TokenKey,
    client_id: u64,
    addresses: &[SocketAddr],
) -> Result<ConnectToken> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let params = TokenParams {
        protocol_id: BENCH_PROTOCOL_ID,
        client_id,
        server_addresses: addresses,
        expires_unix: now.as_secs() + 3600,
        user_data: b"",
    };
    Ok(ConnectToken::seal(key, &params, &mut rand::rng())?)
}

/// The protocol settings of a round.
pub fn protocol(cfg: &RudpConfig) -> Result<EndpointConfig> {
    let mut connection = match cfg.protocol.as_str() {
        // "competitive": the game profile's old name, in older result files and scripts.
        "game" | "competitive" => Config::game(),
        "default" => Config::default(),
        "bulk" => Config::bulk(),
        other => bail!("protocol profile {other:?}: expected game, default or bulk"),
    };
    // The policy is the round's, whatever the profile's default (game: adaptive).
    connection.fec.policy = FecPolicy::from_str(&cfg.fec)?.protocol();
    match cfg.congestion_controller.as_deref() {
        None => {}
        Some("newreno") => connection.congestion_controller = CongestionController::NewReno,
        Some("delay") => connection.congestion_controller = CongestionController::Delay,
        Some(other) => bail!("congestion controller {other:?}: expected newreno or delay"),
    }
    Ok(EndpointConfig::default().with(|c| c.connection = Arc::new(connection)))
}
