//! Named protocol profiles: what a session tunes for.

use ricochet_proto::Config;

/// What a session's protocol settings are tuned for. Pick one with
/// [`ServerConfig::profile`](crate::ServerConfig::profile) and
/// [`ClientConfig::profile`](crate::ClientConfig::profile); both sides should use the same.
///
/// ```
/// use ricochet::{ClientConfig, Profile, ServerConfig};
///
/// let server = ServerConfig::new("0.0.0.0:7777".parse().unwrap()).profile(Profile::Game);
/// let client = ClientConfig::new().profile(Profile::Game);
/// # let _ = (server, client);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Profile {
    /// Balanced: TCP-like loss recovery (100 ms minimum RTO, delayed ACKs), no FEC.
    #[default]
    Default,
    /// Latency first, for game traffic: 30 ms minimum RTO, immediate ACKs of reliable data
    /// (the ACK of unreliable-only packets rides the next packet out, within 25 ms), redundant
    /// retransmissions, and adaptive forward error correction that follows the loss the peer
    /// reports. Its congestion controller is NewReno; the delay-aware one, which keeps a
    /// bottleneck's queue short and estimates the rate the path carries, is opt-in
    /// (`.session(|c| c.congestion_controller = CongestionController::Delay)`).
    Game,
    /// Throughput first: larger windows, longer ACK delay, pacing.
    Bulk,
}

impl Profile {
    /// The protocol settings of this profile.
    pub fn config(self) -> Config {
        match self {
            Profile::Default => Config::default(),
            Profile::Game => Config::game(),
            Profile::Bulk => Config::bulk(),
        }
    }

    /// The profile's name as the command line and reports spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Default => "default",
            Profile::Game => "game",
            Profile::Bulk => "bulk",
        }
    }
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Parses the names [`Profile::as_str`] gives; `"competitive"`, the old name of `"game"`,
/// still parses for one release and logs a deprecation warning.
impl std::str::FromStr for Profile {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "default" => Ok(Profile::Default),
            "game" => Ok(Profile::Game),
            "competitive" => {
                // The old name of `game` (as was the proto's `Config::competitive`): one release more.
                tracing::warn!("profile \"competitive\" is deprecated: it is called \"game\"");
                Ok(Profile::Game)
            }
            "bulk" => Ok(Profile::Bulk),
            other => Err(format!(
                "unknown profile {other:?}; expected default, game or bulk"
            )),
        }
    }
}

/// `base` with the channel list of `current`, its lanes and newest-only channels (a profile
/// sets tuning, not channels).
pub(crate) fn with_channels(mut base: Config, current: &Config) -> Config {
    base.channels = current.channels.clone();
    base.lanes = current.lanes.clone();
    base.newest_only = current.newest_only.clone();
    base
}

#[cfg(test)]
mod tests {
    use super::Profile;

    #[test]
    fn one_name_per_profile_and_the_old_one_still_parses() {
        for p in [Profile::Default, Profile::Game, Profile::Bulk] {
            assert_eq!(p.as_str().parse::<Profile>(), Ok(p));
        }
        assert_eq!("competitive".parse::<Profile>(), Ok(Profile::Game));
        assert_eq!(Profile::Game.to_string(), "game");
        assert!("fast".parse::<Profile>().is_err());
    }
}
