//! The lane scheduler: which lane sends next (priority, then start-time fair queueing over
//! bytes by weight), which of its channels, and the bookkeeping of fresh data (deadlines per
//! message, newest-only channels, drops by cause). It knows no queue: the send room asks it
//! and tells it what went out. A session without lanes, deadlines or newest-only channels has
//! none (`Option<Box<LaneSched>>` is `None`) and sends as it always did.

use std::collections::VecDeque;
use std::time::Instant;

use crate::{Config, Lane, UnsentDrops};

/// Most lanes a session may have: a packet's "did not fit" set is one `u64`.
pub(crate) const MAX_LANES: usize = 64;

/// Virtual time per byte at weight 1: integer charges stay exact for weights up to 2^16.
const SCALE: u64 = 1 << 16;

#[derive(Debug)]
struct LaneState {
    channels: Vec<u8>,
    priority: u8,
    weight: u16,
    queue_limit: Option<usize>,
    /// Index into `LaneSched::clock`: the lane's priority level.
    level: usize,
    /// Position in `channels` of the channel that goes next.
    cursor: usize,
    /// Virtual time at which the lane's last charged bytes finished.
    finish: u64,
}

/// Lanes of one session, and its fresh-data state.
#[derive(Debug)]
pub(crate) struct LaneSched {
    lanes: Vec<LaneState>,
    /// The lane of each channel.
    lane_of: Vec<u8>,
    /// Per priority level: the start tag of the last lane served at that level.
    clock: Vec<u64>,
    /// Per channel, newest-only.
    newest_only: Vec<bool>,
    /// Per channel, (message id, deadline) of queued messages with a deadline, by id; empty
    /// until the first deadline.
    deadlines: Vec<VecDeque<(u64, Instant)>>,
    /// Drops counted here (the queue-limit ones are the connection's own counter).
    pub(crate) drops: UnsentDrops,
}

impl LaneSched {
    /// The scheduler `cfg` asks for, or `None` for a session of one lane without newest-only
    /// channels (deadlines create one on first use: [`LaneSched::single`]).
    pub(crate) fn from_config(cfg: &Config) -> Option<Box<Self>> {
        if cfg.lanes.is_empty() && cfg.newest_only.is_empty() {
            return None;
        }
        let lanes = if cfg.lanes.is_empty() {
            vec![all_channels(cfg.channels.len())]
        } else {
            cfg.lanes.clone()
        };
        let mut s = Self::new(&lanes, cfg.channels.len());
        for &c in &cfg.newest_only {
            if let Some(n) = s.newest_only.get_mut(usize::from(c)) {
                *n = true;
            }
        }
        Some(Box::new(s))
    }

    /// One lane of every channel in id order: a session's default, made when it first needs
    /// a scheduler for its deadlines.
    pub(crate) fn single(channels: usize) -> Box<Self> {
        Box::new(Self::new(&[all_channels(channels)], channels))
    }

    /// `lanes` must cover `channels` once each (`Config::validate`); a channel left out
    /// joins lane 0, so an unchecked config still sends everything.
    fn new(lanes: &[Lane], channels: usize) -> Self {
        let mut levels: Vec<u8> = lanes.iter().map(|l| l.priority).collect();
        levels.sort_unstable();
        levels.dedup();
        let mut lane_of = vec![0u8; channels];
        let mut states: Vec<LaneState> = lanes
            .iter()
            .take(MAX_LANES)
            .enumerate()
            .map(|(i, l)| {
                let channels: Vec<u8> = l
                    .channels
                    .iter()
                    .copied()
                    .filter(|&c| usize::from(c) < channels)
                    .collect();
                for &c in &channels {
                    lane_of[usize::from(c)] = i as u8;
                }
                LaneState {
                    channels,
                    priority: l.priority,
                    weight: l.weight.max(1),
                    queue_limit: l.queue_limit,
                    level: levels.binary_search(&l.priority).unwrap_or(0),
                    cursor: 0,
                    finish: 0,
                }
            })
            .collect();
        if states.is_empty() {
            states.push(LaneState {
                channels: Vec::new(),
                priority: 0,
                weight: 1,
                queue_limit: None,
                level: 0,
                cursor: 0,
                finish: 0,
            });
        }
        let mut listed = vec![false; channels];
        for s in &states {
            for &c in &s.channels {
                listed[usize::from(c)] = true;
            }
        }
        for (c, seen) in listed.iter().enumerate() {
            if !seen {
                states[0].channels.push(c as u8);
                lane_of[c] = 0;
            }
        }
        LaneSched {
            clock: vec![0; levels.len().max(1)],
            lanes: states,
            lane_of,
            newest_only: vec![false; channels],
            deadlines: Vec::new(),
            drops: UnsentDrops::default(),
        }
    }

    /// Lanes.
    pub(crate) fn len(&self) -> usize {
        self.lanes.len()
    }

    /// The lane of `channel`.
    pub(crate) fn lane_of(&self, channel: usize) -> usize {
        self.lane_of.get(channel).map_or(0, |&l| usize::from(l))
    }

    /// The channels of `lane`.
    pub(crate) fn channels(&self, lane: usize) -> &[u8] {
        &self.lanes[lane].channels
    }

    /// Priority and weight of `lane`.
    pub(crate) fn rank(&self, lane: usize) -> (u8, u16) {
        (self.lanes[lane].priority, self.lanes[lane].weight)
    }

    /// The byte cap of `lane`.
    pub(crate) fn queue_limit(&self, lane: usize) -> Option<usize> {
        self.lanes[lane].queue_limit
    }

    /// Whether `channel` keeps only its newest queued message.
    pub(crate) fn newest_only(&self, channel: usize) -> bool {
        self.newest_only.get(channel).copied().unwrap_or(false)
    }

    /// The lane to serve next among those `ready` says have something to send: the lowest
    /// priority number, then the smallest start tag (bytes charged over weight, never below
    /// the level's clock, so an idle lane banks no credit), then the lowest index.
    pub(crate) fn pick(&self, mut ready: impl FnMut(usize) -> bool) -> Option<usize> {
        let mut best: Option<(u8, u64, usize)> = None;
        for (i, l) in self.lanes.iter().enumerate() {
            let key = (l.priority, l.finish.max(self.clock[l.level]), i);
            if best.is_some_and(|b| key >= b) || !ready(i) {
                continue;
            }
            best = Some(key);
        }
        best.map(|(_, _, i)| i)
    }

    /// `lane` sent `bytes` from `channel`: charge it, and the lane's next turn goes to the
    /// channel after `channel`.
    pub(crate) fn charge(&mut self, lane: usize, channel: u8, bytes: usize) {
        let l = &mut self.lanes[lane];
        let start = l.finish.max(self.clock[l.level]);
        self.clock[l.level] = start;
        l.finish = start + (bytes as u64).max(1) * SCALE / u64::from(l.weight);
        if let Some(p) = l.channels.iter().position(|&c| c == channel) {
            l.cursor = (p + 1) % l.channels.len();
        }
    }

    /// The channels of `lane` in the order they take turns now.
    pub(crate) fn turns(&self, lane: usize) -> impl Iterator<Item = u8> + '_ {
        let l = &self.lanes[lane];
        let n = l.channels.len();
        (0..n).map(move |k| l.channels[(l.cursor + k) % n])
    }

    /// Message `id` on `channel` must be sent by `at`.
    pub(crate) fn add_deadline(&mut self, channel: usize, id: u64, at: Instant) {
        if self.deadlines.is_empty() {
            self.deadlines = vec![VecDeque::new(); self.lane_of.len()];
        }
        if let Some(d) = self.deadlines.get_mut(channel) {
            d.push_back((id, at));
        }
    }

    /// Whether any channel has a deadline pending.
    pub(crate) fn has_deadlines(&self) -> bool {
        self.deadlines.iter().any(|d| !d.is_empty())
    }

    /// A message of `channel` whose deadline passed by `now`, forgotten here (the caller
    /// drops what is left of it). Entries of messages below `first_queued` (the id at the
    /// channel's queue front; `None`: nothing queued) left the queue already and are
    /// forgotten on the way.
    pub(crate) fn pop_expired(
        &mut self,
        channel: usize,
        now: Instant,
        first_queued: Option<u64>,
    ) -> Option<u64> {
        let d = self.deadlines.get_mut(channel)?;
        match first_queued {
            None => d.clear(),
            Some(front) => {
                while d.front().is_some_and(|&(id, _)| id < front) {
                    d.pop_front();
                }
            }
        }
        let i = d.iter().position(|&(_, at)| at <= now)?;
        d.remove(i).map(|(id, _)| id)
    }
}

fn all_channels(n: usize) -> Lane {
    Lane::new((0..n.min(256)).map(|c| c as u8))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Serves `rounds` fragments of `size` bytes from always-backlogged lanes; bytes per lane.
    fn serve(s: &mut LaneSched, backlogged: &[bool], size: usize, rounds: usize) -> Vec<usize> {
        let mut sent = vec![0; s.len()];
        for _ in 0..rounds {
            let Some(l) = s.pick(|l| backlogged[l]) else {
                break;
            };
            let ch = s.turns(l).next().unwrap();
            s.charge(l, ch, size);
            sent[l] += size;
        }
        sent
    }

    #[test]
    fn a_lower_priority_number_goes_first() {
        let mut s = LaneSched::new(&[Lane::new([0]).priority(1), Lane::new([1])], 2);
        assert_eq!(s.pick(|_| true), Some(1));
        let sent = serve(&mut s, &[true, true], 1000, 50);
        assert_eq!(sent, vec![0, 50_000]);
        // The lower priority lane gets its turn as soon as the higher one has nothing.
        assert_eq!(s.pick(|l| l == 0), Some(0));
        assert_eq!(s.pick(|_| false), None);
    }

    #[test]
    fn equal_priorities_share_bytes_by_weight() {
        let mut s = LaneSched::new(
            &[Lane::new([0]).weight(3), Lane::new([1]), Lane::new([2])],
            3,
        );
        let sent = serve(&mut s, &[true, true, true], 1200, 500);
        // 3:1:1 of 600,000 bytes, to within one fragment each.
        assert!((sent[0] as i64 - 360_000).abs() <= 1200, "{sent:?}");
        assert!((sent[1] as i64 - 120_000).abs() <= 1200, "{sent:?}");
        assert!((sent[2] as i64 - 120_000).abs() <= 1200, "{sent:?}");
    }

    #[test]
    fn shares_are_bytes_not_fragments() {
        // Lane 0 sends 100 B fragments, lane 1 1,000 B ones: equal weights, equal bytes.
        let mut s = LaneSched::new(&[Lane::new([0]), Lane::new([1])], 2);
        let mut sent = [0usize; 2];
        for _ in 0..2200 {
            let l = s.pick(|_| true).unwrap();
            let size = if l == 0 { 100 } else { 1000 };
            s.charge(l, l as u8, size);
            sent[l] += size;
        }
        let ratio = sent[0] as f64 / sent[1] as f64;
        assert!((0.95..1.05).contains(&ratio), "{sent:?}");
    }

    #[test]
    fn an_idle_lane_banks_no_credit() {
        let mut s = LaneSched::new(&[Lane::new([0]), Lane::new([1])], 2);
        // Lane 1 alone for a while.
        serve(&mut s, &[false, true], 1000, 100);
        // Then both: lane 0 must not take the next 100 turns to catch up (it may lead by
        // one fragment: it starts at the level's clock, a tie it wins by index).
        let sent = serve(&mut s, &[true, true], 1000, 20);
        assert_eq!(sent, vec![11_000, 9_000]);
    }

    #[test]
    fn channels_of_a_lane_take_turns() {
        let mut s = LaneSched::new(&[Lane::new([2, 0]), Lane::new([1])], 3);
        assert_eq!(s.turns(0).collect::<Vec<_>>(), vec![2, 0]);
        s.charge(0, 2, 10);
        assert_eq!(s.turns(0).collect::<Vec<_>>(), vec![0, 2]);
        s.charge(0, 0, 10);
        assert_eq!(s.turns(0).collect::<Vec<_>>(), vec![2, 0]);
        assert_eq!(s.lane_of(0), 0);
        assert_eq!(s.lane_of(1), 1);
        assert_eq!(s.lane_of(2), 0);
    }

    #[test]
    fn an_unlisted_channel_joins_lane_zero() {
        let s = LaneSched::new(&[Lane::new([1])], 3);
        assert_eq!(s.channels(0), &[1, 0, 2]);
    }

    #[test]
    fn no_lanes_and_no_newest_only_means_no_scheduler() {
        assert!(LaneSched::from_config(&Config::default()).is_none());
        let s = LaneSched::from_config(&Config::default().with(|c| c.newest_only = vec![3]))
            .expect("newest-only needs one");
        assert_eq!(s.len(), 1);
        assert!(s.newest_only(3) && !s.newest_only(2));
        assert_eq!(s.channels(0), &[0, 1, 2, 3]);
    }

    #[test]
    fn deadlines_expire_in_order_and_forget_what_left() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = LaneSched::single(4);
        assert!(!s.has_deadlines());
        s.add_deadline(2, 5, t0 + ms(10));
        s.add_deadline(2, 6, t0 + ms(30));
        s.add_deadline(2, 7, t0 + ms(20));
        assert!(s.has_deadlines());
        assert_eq!(s.pop_expired(2, t0 + ms(5), Some(5)), None);
        assert_eq!(s.pop_expired(2, t0 + ms(25), Some(5)), Some(5));
        assert_eq!(s.pop_expired(2, t0 + ms(25), Some(5)), Some(7));
        assert_eq!(s.pop_expired(2, t0 + ms(25), Some(5)), None);
        // Message 6 was sent (the queue starts at 8 now): its entry goes unreported.
        assert_eq!(s.pop_expired(2, t0 + ms(99), Some(8)), None);
        assert!(!s.has_deadlines());
        assert_eq!(s.pop_expired(3, t0 + ms(99), None), None);
    }
}
