//! Range checks of a session [`Config`]: a value that would overflow a deadline or contradict
//! another is refused when an endpoint is set up, with the field's name, rather than panicking
//! when the first session reaches it.

use std::time::Duration;

use super::Config;

/// The largest UDP payload (IPv4: 65,535 less the IP and UDP headers).
const MAX_UDP_PAYLOAD: usize = 65_507;

/// The longest any [`Config`] duration may be. Deadlines are `now + duration`, so an
/// effectively infinite value (`Duration::MAX`, a common way to say "never") would overflow
/// the clock; a year is already "never" for a session.
pub const MAX_CONFIG_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// A [`Config`] value out of range: which field, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("session config `{field}`: {problem}")]
#[non_exhaustive]
pub struct ConfigError {
    /// The field, as spelled in [`Config`] (`fec.group_wait` for a nested one).
    pub field: &'static str,
    /// What is wrong and what to do instead.
    pub problem: String,
}

impl ConfigError {
    fn new(field: &'static str, problem: impl Into<String>) -> ConfigError {
        ConfigError {
            field,
            problem: problem.into(),
        }
    }
}

impl Config {
    /// Checks the ranges an endpoint relies on: every duration at most
    /// [`MAX_CONFIG_DURATION`], the timeouts a session needs longer than zero, `min_rto` not
    /// above `max_rto`, a `send_window` and an `ack_frequency` of at least 1, a
    /// `max_datagram_size` of at least [`Config::min_datagram_size`], at least one channel and
    /// at most 256 (channel ids are a byte).
    /// [`Endpoint::try_new`](crate::Endpoint::try_new) (and `Endpoint::new`, which panics
    /// instead of returning the error) calls it, as do servers and clients of the `ricochet`
    /// runtime when they start.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let durations: [(&'static str, Option<Duration>); 16] = [
            ("initial_rtt", Some(self.initial_rtt)),
            ("min_rto", Some(self.min_rto)),
            ("max_rto", Some(self.max_rto)),
            ("max_ack_delay", Some(self.max_ack_delay)),
            ("min_probe_timeout", Some(self.min_probe_timeout)),
            ("unreliable_ack_delay", self.unreliable_ack_delay),
            ("unreliable_timeout", Some(self.unreliable_timeout)),
            ("idle_timeout", Some(self.idle_timeout)),
            ("keepalive_interval", self.keepalive_interval),
            ("handshake_retry", Some(self.handshake_retry)),
            ("handshake_timeout", Some(self.handshake_timeout)),
            ("idle_trim", self.idle_trim),
            ("close_linger", Some(self.close_linger)),
            ("loss_report_interval", Some(self.loss_report_interval)),
            ("fec.group_wait", Some(self.fec.group_wait)),
            ("fec.max_group_age", Some(self.fec.max_group_age)),
        ];
        for (field, value) in durations {
            if value.is_some_and(|d| d > MAX_CONFIG_DURATION) {
                return Err(ConfigError::new(
                    field,
                    format!(
                        "{value:?} is longer than the {} days allowed; a year already means \
                         never for a session",
                        MAX_CONFIG_DURATION.as_secs() / 86_400
                    ),
                ));
            }
        }
        for (field, value) in [
            ("idle_timeout", self.idle_timeout),
            ("handshake_timeout", self.handshake_timeout),
            ("handshake_retry", self.handshake_retry),
            ("max_rto", self.max_rto),
        ] {
            if value.is_zero() {
                return Err(ConfigError::new(field, "must be longer than zero"));
            }
        }
        if self.keepalive_interval == Some(Duration::ZERO) {
            return Err(ConfigError::new(
                "keepalive_interval",
                "must be longer than zero (None turns keepalives off)",
            ));
        }
        if self.send_window == 0 {
            return Err(ConfigError::new(
                "send_window",
                "must be at least 1 (with 0 no reliable fragment is ever sent)",
            ));
        }
        let min_datagram = self.min_datagram_size();
        if self.max_datagram_size < min_datagram {
            return Err(ConfigError::new(
                "max_datagram_size",
                format!(
                    "{} bytes is below the minimum of {min_datagram}: a client's largest \
                     handshake packet takes {} bytes, and a data packet {} for its headers, \
                     tag and ACK room plus one byte of payload",
                    self.max_datagram_size,
                    crate::wire::MAX_CLIENT_HANDSHAKE_LEN,
                    self.min_data_datagram_size(),
                ),
            ));
        }
        if self.path_mtu.enabled {
            let m = self.path_mtu.max_datagram_size;
            if m < self.max_datagram_size || m > MAX_UDP_PAYLOAD {
                return Err(ConfigError::new(
                    "path_mtu.max_datagram_size",
                    format!(
                        "{m} bytes is outside {}..={MAX_UDP_PAYLOAD}: path MTU discovery \
                         searches from max_datagram_size up to it, and a UDP payload is at \
                         most {MAX_UDP_PAYLOAD} bytes",
                        self.max_datagram_size
                    ),
                ));
            }
            if self.path_mtu.raise_interval.is_zero()
                || self.path_mtu.raise_interval > MAX_CONFIG_DURATION
            {
                return Err(ConfigError::new(
                    "path_mtu.raise_interval",
                    "must be longer than zero and at most the longest duration allowed",
                ));
            }
        }
        if self.ack_frequency == 0 {
            return Err(ConfigError::new(
                "ack_frequency",
                "must be at least 1 (1 acknowledges every ack-eliciting packet at once)",
            ));
        }
        if self.min_rto > self.max_rto {
            return Err(ConfigError::new(
                "min_rto",
                format!("{:?} is above max_rto ({:?})", self.min_rto, self.max_rto),
            ));
        }
        if self.channels.is_empty() || self.channels.len() > 256 {
            return Err(ConfigError::new(
                "channels",
                format!(
                    "{} channels: a session needs 1 to 256 (channel ids are one byte)",
                    self.channels.len()
                ),
            ));
        }
        self.validate_lanes()
    }

    fn validate_lanes(&self) -> Result<(), ConfigError> {
        if self.lanes.len() > crate::connection::MAX_LANES {
            return Err(ConfigError::new(
                "lanes",
                format!(
                    "{} lanes: at most {}",
                    self.lanes.len(),
                    crate::connection::MAX_LANES
                ),
            ));
        }
        let mut lane_of = vec![None; self.channels.len()];
        for (l, lane) in self.lanes.iter().enumerate() {
            if lane.weight == 0 {
                return Err(ConfigError::new(
                    "lanes",
                    format!("lane {l} has weight 0: weights start at 1"),
                ));
            }
            for &c in &lane.channels {
                match lane_of.get_mut(usize::from(c)) {
                    None => {
                        return Err(ConfigError::new(
                            "lanes",
                            format!("lane {l} lists channel {c}, which does not exist"),
                        ))
                    }
                    Some(Some(other)) => {
                        return Err(ConfigError::new(
                            "lanes",
                            format!("channel {c} is in lane {other} and in lane {l}"),
                        ))
                    }
                    Some(slot) => *slot = Some(l),
                }
            }
        }
        if !self.lanes.is_empty() {
            if let Some(c) = lane_of.iter().position(Option::is_none) {
                return Err(ConfigError::new(
                    "lanes",
                    format!("channel {c} is in no lane: list every channel in one lane"),
                ));
            }
        }
        for &c in &self.newest_only {
            match self.channels.get(usize::from(c)) {
                None => {
                    return Err(ConfigError::new(
                        "newest_only",
                        format!("channel {c} does not exist"),
                    ))
                }
                Some(k) if k.is_reliable() => {
                    return Err(ConfigError::new(
                        "newest_only",
                        format!(
                            "channel {c} is reliable: only unreliable messages may be replaced"
                        ),
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profiles_pass() {
        for c in [Config::default(), Config::game(), Config::bulk()] {
            assert_eq!(c.validate(), Ok(()));
        }
    }

    #[test]
    fn a_never_duration_names_its_field() {
        let c = Config::default().with(|c| c.idle_timeout = Duration::MAX);
        let e = c.validate().unwrap_err();
        assert_eq!(e.field, "idle_timeout");
        assert!(e.to_string().contains("idle_timeout"), "{e}");
        let c = Config::default().with(|c| c.fec.group_wait = Duration::MAX);
        assert_eq!(c.validate().unwrap_err().field, "fec.group_wait");
    }

    #[test]
    fn lanes_must_cover_every_channel_once() {
        use crate::Lane;
        let ok = Config::default().with(|c| {
            c.lanes = vec![Lane::new([0, 1]), Lane::new([2, 3]).priority(1).weight(2)];
            c.newest_only = vec![3];
        });
        assert_eq!(ok.validate(), Ok(()));
        for (bad, field, says) in [
            (
                vec![Lane::new([0, 1, 2])],
                "lanes",
                "channel 3 is in no lane",
            ),
            (
                vec![Lane::new([0, 1]), Lane::new([1, 2, 3])],
                "lanes",
                "channel 1 is in lane 0 and in lane 1",
            ),
            (vec![Lane::new([0, 1, 2, 3, 9])], "lanes", "channel 9"),
            (vec![Lane::new([0, 1, 2, 3]).weight(0)], "lanes", "weight 0"),
        ] {
            let e = Config::default()
                .with(|c| c.lanes = bad)
                .validate()
                .unwrap_err();
            assert_eq!(e.field, field);
            assert!(e.problem.contains(says), "{e}");
        }
        let e = Config::default()
            .with(|c| c.newest_only = vec![0])
            .validate()
            .unwrap_err();
        assert_eq!(e.field, "newest_only");
        assert!(e.problem.contains("reliable"), "{e}");
    }

    #[test]
    fn contradictions_and_zeros_are_refused() {
        let c = Config::default().with(|c| c.min_rto = c.max_rto + Duration::from_millis(1));
        assert_eq!(c.validate().unwrap_err().field, "min_rto");
        let c = Config::default().with(|c| c.handshake_timeout = Duration::ZERO);
        assert_eq!(c.validate().unwrap_err().field, "handshake_timeout");
        let c = Config::default().with(|c| c.keepalive_interval = Some(Duration::ZERO));
        assert_eq!(c.validate().unwrap_err().field, "keepalive_interval");
        let c = Config::default().with(|c| c.channels.clear());
        assert_eq!(c.validate().unwrap_err().field, "channels");
    }

    /// The sans-IO endpoint checks the config it is given: `try_new` returns the error, `new`
    /// panics at once (before, a `Duration::MAX` idle timeout panicked only when a session
    /// computed its first idle deadline).
    #[test]
    fn an_endpoint_refuses_an_invalid_config() {
        use crate::{Endpoint, EndpointConfig};
        use std::sync::Arc;
        let now = ricochet_testkit::SimClock::new().now();
        let bad = EndpointConfig::default().with(|e| {
            e.connection = Arc::new(Config::default().with(|c| c.idle_timeout = Duration::MAX))
        });
        let Err(e) = Endpoint::try_new(bad.clone(), now, 1) else {
            panic!("try_new accepted idle_timeout = Duration::MAX");
        };
        assert_eq!(e.field, "idle_timeout");
        let Err(panic) = std::panic::catch_unwind(|| Endpoint::new(bad, now, 1)) else {
            panic!("Endpoint::new accepted idle_timeout = Duration::MAX");
        };
        let text = panic.downcast_ref::<String>().expect("a formatted message");
        assert!(text.contains("idle_timeout"), "{text}");
        assert!(Endpoint::try_new(EndpointConfig::default(), now, 1).is_ok());
    }

    #[test]
    fn a_zero_send_window_is_refused() {
        let c = Config::default().with(|c| c.send_window = 0);
        let e = c.validate().unwrap_err();
        assert_eq!(e.field, "send_window");
        assert!(e.to_string().contains("at least 1"), "{e}");
    }

    /// Below the minimum nothing fits (a client's handshake packet, or a data packet with a
    /// byte of payload) while data stays queued: `poll_timeout` would point at the past.
    #[test]
    fn a_datagram_size_below_the_minimum_is_refused_naming_it() {
        for base in [Config::default(), Config::game()] {
            let min = base.min_datagram_size();
            assert_eq!(min, crate::wire::MAX_CLIENT_HANDSHAKE_LEN);
            assert!(base.min_data_datagram_size() < min);
            for small in [0, 100, min - 1] {
                let c = base.clone().with(|c| c.max_datagram_size = small);
                let e = c.validate().unwrap_err();
                assert_eq!(e.field, "max_datagram_size");
                assert!(e.to_string().contains(&format!("minimum of {min}")), "{e}");
            }
            let c = base.with(|c| c.max_datagram_size = min);
            assert_eq!(c.validate(), Ok(()));
            // The data-packet part leaves at least one byte of fragment payload by itself.
            assert!(c.fragment_payload() >= 1);
            assert_eq!(
                c.arq_datagram_size()
                    - (crate::wire::DATA_HEADER_LEN
                        + crate::config::FRAGMENT_HEADER_MAX
                        + crate::config::ACK_RESERVE),
                c.fragment_payload(),
            );
        }
    }

    #[test]
    fn an_ack_frequency_of_zero_is_refused() {
        let c = Config::default().with(|c| c.ack_frequency = 0);
        let e = c.validate().unwrap_err();
        assert_eq!(e.field, "ack_frequency");
        assert!(e.to_string().contains("at least 1"), "{e}");
        let c = Config::default().with(|c| c.ack_frequency = 1);
        assert_eq!(c.validate(), Ok(()));
    }
}
