//! Lanes from C: a session's channels grouped into lanes, each with a priority and a weight
//! (see the Rust [`ricochet::Lane`]). The server's and the client's configs take a list of
//! them, like the Rust configs' `lanes`; none (the default) is one lane of every channel.

use ricochet::Lane;

use crate::ricochet_status;
use crate::status::Error;
use crate::token::read_bytes;

/// One lane: the channels it groups and its place in the send order. Plain data; the
/// channel array is read during the call that takes the config only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ricochet_lane {
    /// The channel ids of the lane (`channel_count` of them): every channel of the session
    /// is in exactly one lane.
    pub channels: *const u8,
    /// How many ids `channels` holds.
    pub channel_count: usize,
    /// Lower goes first: a lane is served only when no lane of a lower number has anything
    /// it may send.
    pub priority: u8,
    /// Share of the rate among lanes of the same priority, in proportion; 0: 1.
    pub weight: u16,
    /// Bytes the lane holds queued and not yet sent; past it a send drops the lane's oldest
    /// unreliable messages. 0: no cap of its own.
    pub queue_limit: usize,
}

/// Lanes a config may list at most (a session has at most 256 channels).
const MAX_LANES: usize = 256;

/// The lanes of a config's `lanes` / `lane_count` (`None`: not set, the default one lane).
///
/// # Safety
///
/// `lanes` null or `count` readable lanes, each with a `channels` that is null or
/// `channel_count` readable bytes.
pub(crate) unsafe fn read_lanes(
    lanes: *const ricochet_lane,
    count: usize,
) -> Result<Option<Vec<Lane>>, Error> {
    if count == 0 {
        return Ok(None);
    }
    if lanes.is_null() {
        return Err(Error::null("config.lanes"));
    }
    if count > MAX_LANES {
        return Err(Error::new(
            ricochet_status::RICOCHET_ERROR_INVALID_CONFIG,
            format!("config.lane_count {count} is more than {MAX_LANES}"),
        ));
    }
    // SAFETY: `count` readable lanes (caller's contract).
    let list = unsafe { std::slice::from_raw_parts(lanes, count) };
    let mut out = Vec::with_capacity(count);
    for (i, l) in list.iter().enumerate() {
        if l.channel_count > MAX_LANES {
            return Err(Error::new(
                ricochet_status::RICOCHET_ERROR_INVALID_CONFIG,
                format!(
                    "config.lanes[{i}].channel_count {} is more than 256",
                    l.channel_count
                ),
            ));
        }
        // SAFETY: null or `channel_count` readable bytes (caller's contract).
        let channels =
            unsafe { read_bytes(l.channels, l.channel_count, "config.lanes[].channels") }?;
        let mut lane = Lane::new(channels.iter().copied())
            .priority(l.priority)
            .weight(l.weight.max(1));
        if l.queue_limit != 0 {
            lane = lane.queue_limit(l.queue_limit);
        }
        out.push(lane);
    }
    Ok(Some(out))
}
