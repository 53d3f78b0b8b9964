//! Delay-aware rate control: a paced send rate from a delivery-rate estimate, kept below the
//! bottleneck so that its queue stays short (the game profile's controller).
//!
//! # Model
//!
//! Acknowledgements are grouped into *rounds* (a round ends when a packet sent after the round
//! began is acknowledged: about one RTT). Each round yields a delivery-rate sample: the bytes
//! acknowledged in it over the longer of the time they took to be sent and the time their
//! acknowledgements took to arrive (the send side bounds a sample by the rate the sender
//! actually used, the ACK side by what the path let through; an ACK held by the peer or a
//! burst of them cannot make the path look faster than the sender was). The *bandwidth
//! estimate* is the largest sample of the last [`BW_ROUNDS`] rounds; a round in which the
//! sender was never held back by its pacer or window (the game sent less than it was allowed)
//! only counts if it raises the estimate, since it says nothing about a smaller path.
//!
//! The sender paces at the estimate times a gain that cycles over [`CYCLE`] rounds: one round
//! at 1.15 (probe: a faster path shows a larger sample), one at 0.85 (drain what the probe
//! queued), then 0.95 (cruise: a little below the path, so a datagram mostly finds the
//! bottleneck idle). The probe is gentle so that its queue (about 15 % of a round's sending)
//! costs a game's urgent messages little.
//!
//! Loss alone does not change the rate (with `loss_tolerant`): random loss on a path without a
//! queue is not congestion, and a packet that FEC rebuilt or ARQ retransmitted late inflates the
//! smoothed RTT but not a round's smallest sample. What does is *queueing delay*: the smallest
//! RTT sample of a cruise round above the path's minimum RTT (a windowed minimum over
//! [`MIN_RTT_WINDOW`]) by more than [`queue_threshold`] means a standing queue (the path got
//! slower, or other flows share it): the estimate is cut to [`CUT`] times the rate the round's
//! ACKs arrived at (what the path gives this flow); the next cut waits until a round showed
//! the queue drained (or a whole cycle); the cycle goes on. Without `loss_tolerant` every loss cuts too; an RTO halves the estimate when the caller
//! takes it for congestion.
//!
//! Flows that share a bottleneck are cut in proportion to their rates, and a probe grows each
//! in proportion too: shares that drifted apart would stay apart. So while cuts recur (two
//! within [`SHARED_ROUNDS`] rounds) the probe adds the same datagram per RTT to every
//! flow and the drain takes it off again: a small share gains more in proportion, and the
//! shares converge (additive increase, multiplicative decrease). A flow alone on its path is
//! not cut once it settled and keeps the gentle probe. A round over a standing queue (its
//! smallest RTT sample above the threshold) never raises the estimate: with a FIFO kept busy
//! a flow's ACKs come at its share of it, in proportion to what it sent, so a probe would
//! always seem to find more, and every flow's estimate would ratchet past its share and keep
//! the buffer full.
//!
//! A cruise round in which every datagram still queued by more than half the threshold plus
//! one datagram's serialization at the estimate, its ACKs arriving at about the estimate (the
//! link was busy with this flow throughout), twice in a row, means the estimate stands above
//! the path (a noisy sample won the max): no sample may stand above that round's ACK rate,
//! and the next round is paced at the drain round's gain.
//!
//! At the start the rate doubles per round (startup) until the estimate stops growing by a
//! quarter for three rounds in which the sender used its rate, or a queue shows: a round
//! whose every RTT sample stood above the minimum by [`queue_threshold`], or, once a round
//! measured the path, [`STARTUP_QUEUED`] such samples in a row (at once, not at the round's
//! end).
//! Startup that ends on a queue (a game that offers more than the path fills the buffer for
//! the rounds it takes to see it) drains it at [`DRAIN_GAIN`] for up to [`DRAIN_ROUNDS`]
//! rounds before the cycle's cruise, which alone would take seconds to. The drain starts at
//! once: the pacer's tokens saved in startup are dropped.
//!
//! A cut leaves at least [`CUT`] times half the estimate (a round that spans an outage
//! shows a delivery rate near zero that says nothing of the path once it is back), and a loss
//! without a queue cuts the estimate itself, not to what the round delivered. The pacer never
//! goes below two datagrams per smoothed RTT: slower, a round (and the sample that raises the
//! estimate again) would take so long to end that a collapsed estimate stalled the sender for
//! good; as with a minimum window, the smoothed RTT grows with any queue that makes.
//!
//! The send rate is clamped to the configured floor and ceiling, and so is the estimate the
//! application reads ([`Delay::rate_estimate`]); a round paced at the ceiling measures the
//! ceiling, not the path, and does not count. The congestion window only guards against a
//! peer that stops acknowledging: pacing sets the rate.

use std::time::{Duration, Instant};

/// Rounds over which the bandwidth estimate is the largest delivery sample.
pub(crate) const BW_ROUNDS: usize = 10;
/// Pacing gains of the probe cycle, one per round.
pub(crate) const CYCLE: [f64; 8] = [1.15, 0.85, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95];
/// Cycle rounds from which a standing queue cuts the estimate: the probe's queue must have
/// drained (the probe round, the drain round and the round that acknowledges it excepted).
const GUARD_FROM: usize = 3;
/// Rounds after a cut during which the probe adds its fairness term (see `pacing_rate`).
const SHARED_ROUNDS: u32 = 4 * CYCLE.len() as u32;
/// Pacing gain in startup.
const STARTUP_GAIN: f64 = 2.0;
/// Pacing gain while the queue startup left behind drains (see [`Phase::Drain`]).
const DRAIN_GAIN: f64 = 0.75;
/// RTT samples in a row above the minimum by more than [`queue_threshold`] that end startup
/// (one could be a datagram held up by the host, not a queue).
const STARTUP_QUEUED: u32 = 2;
/// Most rounds of [`Phase::Drain`].
const DRAIN_ROUNDS: u32 = 3;
/// The estimate after a cut, as a share of the round's delivery rate.
pub(crate) const CUT: f64 = 0.85;
/// A cruise round whose ACKs came at this share of the estimate or more kept the link busy
/// (cruise sends at 0.95 of it); below, its RTT samples above the minimum are not a queue.
const CAP_DEPTH: f64 = 0.9;
/// One cut's base is at least this share of the estimate (see `Delay::cut`).
const DEEPEST_CUT: f64 = 0.5;
/// The pacer's lowest rate, datagrams per smoothed RTT (see `Delay::pacing_rate`).
const LIVE_PACKETS: usize = 2;
/// The window of the minimum-RTT filter: a path whose delay grew for good is learnt after this.
pub(crate) const MIN_RTT_WINDOW: Duration = Duration::from_secs(10);

/// Queueing delay above which a cruise round's RTT shows a standing queue: 10 ms, or a quarter
/// of the minimum RTT on long paths. Large enough that serialization differences between a
/// full and a small datagram on a slow link (about 6 ms at 1 Mbit/s) and scheduling noise do
/// not look like a queue.
pub(crate) fn queue_threshold(min_rtt: Duration) -> Duration {
    (min_rtt / 4).max(Duration::from_millis(10))
}

/// Queueing delay above which an RTT sample in startup counts towards its end (see
/// [`STARTUP_QUEUED`]): an eighth of the minimum RTT, at least 8 ms. Below
/// [`queue_threshold`]: a game that offers more than the path adds to the queue for every
/// sample startup waits for. 8 ms stays above the difference between a full datagram's
/// serialization and a small one's at 1 Mbit/s, and two samples in a row must show it.
fn startup_threshold(min_rtt: Duration) -> Duration {
    (min_rtt / 8).max(Duration::from_millis(8))
}

/// Where in its life the controller is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Doubling per round; `full_bw` is the estimate last grown by a quarter, `flat` the
    /// rounds since.
    Startup { full_bw: f64, flat: u32 },
    /// Startup ended on a standing queue: paced at [`DRAIN_GAIN`] until a round shows it
    /// gone (at most a cycle's rounds), then the cycle's cruise. Cruise alone would drain it
    /// at a twentieth of the path's rate, over a second in which every datagram, a game's
    /// urgent ones too, waits behind it; the cut's lower estimate lasts only a round (the
    /// next round's sample, taken with the queue still feeding the link, is the path's rate).
    Drain { rounds: u32 },
    /// The probe cycle, at this index of [`CYCLE`].
    Cycle(usize),
}

/// The round in progress.
#[derive(Debug, Clone, Copy)]
struct Round {
    /// When it began (the ACK that ended the previous round).
    start: Instant,
    /// It ends with the ACK of a packet sent after this.
    end_after: Instant,
    /// Bytes acknowledged so far in it.
    bytes: u64,
    /// Latest send time of a packet acknowledged in the previous round, and in this one.
    prev_max_sent: Option<Instant>,
    max_sent: Option<Instant>,
    /// Smallest RTT sample in it.
    min_sample: Option<Duration>,
    /// The pacer or the window held the sender back at least once.
    limited: bool,
    /// A loss that counts as congestion was declared in it.
    congestion_loss: bool,
}

/// Delay-aware rate controller state (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct Delay {
    mss: usize,
    loss_tolerant: bool,
    floor: f64,
    ceiling: f64,
    min_window: usize,
    init_window: usize,
    pub(crate) in_flight: usize,
    phase: Phase,
    round: Option<Round>,
    /// Delivery samples of the last rounds (bytes per second), oldest overwritten.
    samples: [f64; BW_ROUNDS],
    next_sample: usize,
    /// The largest of `samples`: the bandwidth estimate (0 before the first sample).
    bw: f64,
    /// Windowed minimum RTT: the current half-window's minimum and when it began, and the
    /// previous half-window's.
    min_rtt: Option<(Duration, Instant)>,
    prev_min_rtt: Option<Duration>,
    /// Rounds since the last cut, and between the two before it.
    since_cut: u32,
    cut_gap: u32,
    /// A cut's queue has not yet been seen drained.
    draining: bool,
    /// RTT samples in a row that showed a queue in startup (see [`STARTUP_QUEUED`]).
    queued_run: u32,
    /// The last cruise round showed a queue kept up (see `end_round`).
    standing: bool,
    /// This cruise round is paced at the drain round's gain (see `end_round`).
    extra_drain: bool,
    /// The smoothed RTT as of the last ACK (the initial RTT before one).
    srtt: Duration,
    /// Pacing tokens in bytes and when they were last refilled.
    tokens: f64,
    refilled: Option<Instant>,
}

/// What [`Delay::new`] needs of the configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DelayParams {
    /// Largest datagram, bytes.
    pub(crate) mss: usize,
    /// Initial and minimum window, bytes.
    pub(crate) init_window: usize,
    pub(crate) min_window: usize,
    /// See [`crate::Config::loss_tolerant`].
    pub(crate) loss_tolerant: bool,
    /// Send-rate floor and ceiling, bytes per second.
    pub(crate) floor: u64,
    pub(crate) ceiling: Option<u64>,
    /// RTT assumed before the first sample.
    pub(crate) initial_rtt: Duration,
}

impl Delay {
    pub(crate) fn new(p: DelayParams) -> Self {
        let ceiling = p.ceiling.map_or(f64::INFINITY, |c| c.max(1) as f64);
        Self {
            mss: p.mss.max(1),
            loss_tolerant: p.loss_tolerant,
            floor: (p.floor as f64).min(ceiling),
            ceiling,
            min_window: p.min_window.max(p.mss),
            init_window: p.init_window.max(p.mss),
            in_flight: 0,
            phase: Phase::Startup {
                full_bw: 0.0,
                flat: 0,
            },
            round: None,
            samples: [0.0; BW_ROUNDS],
            next_sample: 0,
            bw: 0.0,
            min_rtt: None,
            prev_min_rtt: None,
            since_cut: u32::MAX,
            cut_gap: u32::MAX,
            draining: false,
            queued_run: 0,
            standing: false,
            extra_drain: false,
            srtt: p.initial_rtt,
            tokens: (4 * p.mss) as f64,
            refilled: None,
        }
    }

    /// The windowed minimum RTT, if any sample arrived.
    pub(crate) fn min_rtt(&self) -> Option<Duration> {
        let cur = self.min_rtt.map(|(m, _)| m);
        match (cur, self.prev_min_rtt) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The rate the path is estimated to carry for this connection, bytes per second, within
    /// the floor and ceiling: the bandwidth estimate once a round was measured, before that
    /// the initial window over `srtt`.
    pub(crate) fn rate_estimate(&self) -> f64 {
        self.unclamped_estimate().clamp(self.floor, self.ceiling)
    }

    /// The pacing rate now, bytes per second.
    pub(crate) fn pacing_rate(&self) -> f64 {
        let bw = self.unclamped_estimate();
        // While standing queues keep cutting the estimate (two cuts within `SHARED_ROUNDS`:
        // other flows share the bottleneck),
        // the probe also adds one datagram per RTT and the drain takes it off again: the
        // same for every flow, so that a flow with a small share gains more in proportion
        // than a large one (cuts are proportional; without it, shares that drifted apart
        // stay apart). A flow alone on its path has no cuts, and probes gently. Not more:
        // sixteen flows' probes add up (four datagrams each kept a 10 Mbit/s link's queue
        // swinging up to 60 ms in `bench lanes uplink-shared`).
        let add = if self.since_cut < SHARED_ROUNDS && self.cut_gap < SHARED_ROUNDS {
            1.0 * self.mss as f64 / self.srtt.as_secs_f64().max(1e-3)
        } else {
            0.0
        };
        let rate = match self.phase {
            Phase::Startup { .. } => bw * STARTUP_GAIN,
            Phase::Drain { .. } => bw * DRAIN_GAIN,
            Phase::Cycle(0) => bw * CYCLE[0] + add,
            Phase::Cycle(1) => (bw * CYCLE[1] - add).max(bw / 2.0),
            Phase::Cycle(_) if self.extra_drain => bw * CYCLE[1],
            Phase::Cycle(i) => bw * CYCLE[i],
        };
        // Never slower than [`LIVE_PACKETS`] datagrams per smoothed RTT: a sender paced below
        // that waits so long for each datagram that a round, and with it the sample that
        // would raise the estimate again, never ends (a collapsed estimate stalled for good).
        // The smoothed RTT grows with any queue this makes, so it cannot fill a buffer.
        let live = (LIVE_PACKETS * self.mss) as f64 / self.srtt.as_secs_f64().max(1e-4);
        rate.max(live).clamp(self.floor, self.ceiling)
    }

    /// The bandwidth estimate, or before the first sample the initial window over the RTT.
    fn unclamped_estimate(&self) -> f64 {
        if self.bw > 0.0 {
            self.bw
        } else {
            self.init_window as f64 / self.srtt.as_secs_f64().max(1e-4)
        }
    }

    /// The pacer or the window holds the sender back below the ceiling: what it delivers in
    /// this round measures the path (at the ceiling it only measures the ceiling).
    fn mark_limited(&mut self) {
        if self.pacing_rate() < self.ceiling {
            if let Some(r) = &mut self.round {
                r.limited = true;
            }
        }
    }

    /// The congestion window: a guard against a peer that stops acknowledging, well above what
    /// the pacing rate keeps in flight (two and a half estimated path delays' worth, at least
    /// the initial window).
    pub(crate) fn window(&self) -> usize {
        let Some(min_rtt) = self.min_rtt() else {
            return self.init_window;
        };
        if self.bw <= 0.0 {
            return self.init_window;
        }
        let delay = self.srtt.max(min_rtt + queue_threshold(min_rtt));
        let w = 2.5 * self.pacing_rate().max(self.rate_estimate()) * delay.as_secs_f64();
        (w as usize)
            .saturating_add(2 * self.mss)
            .max(self.init_window)
            .max(self.min_window)
    }

    pub(crate) fn can_send(&self, size: usize) -> bool {
        self.in_flight + size <= self.window()
    }

    pub(crate) fn on_sent(&mut self, size: usize) {
        self.in_flight += size;
        self.tokens -= size as f64;
        if self.in_flight + self.mss > self.window() || self.tokens < self.mss as f64 {
            // The next packet will wait for the window or the pacer: this round used its rate.
            self.mark_limited();
        }
    }

    /// A packet of `size` bytes sent at `sent` was acknowledged (one call per packet; the
    /// ACK frame's end is [`Self::on_ack_end`]).
    pub(crate) fn on_acked(&mut self, size: usize, sent: Instant) {
        self.in_flight = self.in_flight.saturating_sub(size);
        if let Some(r) = &mut self.round {
            r.bytes += size as u64;
            r.max_sent = Some(r.max_sent.map_or(sent, |m| m.max(sent)));
        }
    }

    /// Bytes left flight without an ACK (declared lost).
    pub(crate) fn on_removed(&mut self, size: usize) {
        self.in_flight = self.in_flight.saturating_sub(size);
    }

    /// A loss was declared. Loss tolerant, it is not congestion by itself: the round's own
    /// queueing delay decides (a packet rebuilt by FEC or retransmitted late inflates the smoothed
    /// RTT the connection's `queueing` reads, not the round's minimum). Otherwise every loss
    /// counts.
    pub(crate) fn on_loss(&mut self) {
        if self.loss_tolerant {
            return;
        }
        if let Some(r) = &mut self.round {
            r.congestion_loss = true;
        }
    }

    /// Retransmission timeout: with `congested` the estimate halves and the cycle restarts
    /// with a drain round; otherwise (a loss-tolerant RTO without queueing: a lost probe or
    /// ACK) nothing changes.
    pub(crate) fn on_rto(&mut self, congested: bool) {
        if self.loss_tolerant && !congested {
            return;
        }
        if self.bw > 0.0 {
            let bw = (self.bw * 0.5).max(self.floor);
            self.reset_estimate(bw);
        }
        self.phase = Phase::Cycle(1);
        self.since_cut = 0;
    }

    /// The end of an ACK frame's processing: `rtt_sample` is the path RTT it measured (ACK
    /// delay taken off), if any; `srtt` the smoothed RTT after it.
    pub(crate) fn on_ack_end(
        &mut self,
        now: Instant,
        rtt_sample: Option<Duration>,
        srtt: Duration,
    ) {
        self.srtt = srtt;
        if let Some(s) = rtt_sample {
            self.note_min_rtt(now, s);
        }
        let min_rtt = self.min_rtt();
        let Some(r) = &mut self.round else {
            self.round = Some(Round {
                start: now,
                end_after: now,
                bytes: 0,
                prev_max_sent: None,
                max_sent: None,
                min_sample: rtt_sample,
                limited: false,
                congestion_loss: false,
            });
            return;
        };
        if let Some(s) = rtt_sample {
            r.min_sample = Some(r.min_sample.map_or(s, |m| m.min(s)));
            if matches!(self.phase, Phase::Startup { .. }) {
                let over = min_rtt.is_some_and(|m| s.saturating_sub(m) > startup_threshold(m));
                self.queued_run = if over { self.queued_run + 1 } else { 0 };
            }
        }
        if matches!(self.phase, Phase::Startup { .. })
            && self.queued_run >= STARTUP_QUEUED
            && self.bw > 0.0
        {
            // Startup ends on the queue at once, not at the end of a round: a game that
            // offers more than the path (or the doubling) adds to the queue for every RTT it
            // goes unseen, and a round's smallest sample shows it a round or two after the
            // samples do. Not before a round measured the path: the cut's base would be the
            // rate of a few ACKs (flows that start together would start far apart).
            let elapsed = now.saturating_duration_since(r.start).as_secs_f64();
            let ack_rate = (elapsed > 0.0 && r.bytes > 0).then(|| r.bytes as f64 / elapsed);
            self.queued_run = 0;
            self.cut(ack_rate, true);
            return;
        }
        if r.max_sent.is_some_and(|m| m > r.end_after) {
            let done = *r;
            self.round = Some(Round {
                start: now,
                end_after: now,
                bytes: 0,
                prev_max_sent: done.max_sent,
                max_sent: None,
                min_sample: None,
                limited: false,
                congestion_loss: false,
            });
            self.end_round(now, &done);
        }
    }

    fn note_min_rtt(&mut self, now: Instant, sample: Duration) {
        match &mut self.min_rtt {
            Some((m, since)) if now.saturating_duration_since(*since) < MIN_RTT_WINDOW / 2 => {
                *m = (*m).min(sample);
            }
            Some((m, since)) => {
                self.prev_min_rtt = Some(*m);
                *m = sample;
                *since = now;
            }
            None => self.min_rtt = Some((sample, now)),
        }
    }

    fn reset_estimate(&mut self, bw: f64) {
        self.samples = [0.0; BW_ROUNDS];
        self.samples[0] = bw;
        self.next_sample = 1;
        self.bw = bw;
    }

    /// No sample above `rate` stands in the estimate any more.
    fn cap_estimate(&mut self, rate: f64) {
        for s in &mut self.samples {
            *s = s.min(rate);
        }
        self.bw = self.samples.iter().copied().fold(0.0, f64::max);
    }

    fn end_round(&mut self, now: Instant, r: &Round) {
        self.since_cut = self.since_cut.saturating_add(1);
        let ack_elapsed = now.saturating_duration_since(r.start);
        let send_elapsed = match (r.prev_max_sent, r.max_sent) {
            (Some(a), Some(b)) => b.saturating_duration_since(a),
            _ => Duration::ZERO,
        };
        let interval = ack_elapsed.max(send_elapsed).as_secs_f64();
        let rate = (interval > 0.0 && r.bytes > 0).then(|| r.bytes as f64 / interval);
        let ack_rate = (!ack_elapsed.is_zero() && r.bytes > 0)
            .then(|| r.bytes as f64 / ack_elapsed.as_secs_f64());
        // How far the round's smallest RTT sample stood above the path's minimum: past the
        // threshold a standing queue (a cut), past `standing` one the sender keeps up (a cap
        // and a drain round, see below).
        let excess = match (r.min_sample, self.min_rtt()) {
            (Some(s), Some(m)) => Some((s.saturating_sub(m), queue_threshold(m))),
            _ => None,
        };
        let queued = excess.is_some_and(|(q, t)| q > t);
        if let Some(rate) = rate {
            // A round the game did not fill only counts if it shows more (module docs). A
            // round over a standing queue never does: its ACKs come at this flow's share of
            // a FIFO kept busy, in proportion to what it sent, so a probe would always seem
            // to find more and every flow's estimate would ratchet up past its share.
            let raises = rate > self.bw;
            if (r.limited || raises) && !(queued && raises) {
                self.samples[self.next_sample] = rate;
                self.next_sample = (self.next_sample + 1) % BW_ROUNDS;
                self.bw = self.samples.iter().copied().fold(0.0, f64::max);
            }
        }
        // A datagram that takes longer to serialize than the one the minimum measured (a
        // path that got slower, a full datagram against a small one) stands above the
        // minimum by up to one datagram's time at the estimate without any queue.
        let serialization =
            Duration::from_secs_f64(self.mss as f64 / self.bw.max(1.0)).min(MIN_RTT_WINDOW);
        let standing = excess.is_some_and(|(q, t)| q > t / 2 + serialization);
        let congested = queued || r.congestion_loss;
        if !queued {
            self.draining = false;
        }
        match self.phase {
            Phase::Startup { full_bw, flat } => {
                if congested {
                    self.cut(ack_rate, queued);
                } else if r.limited {
                    if self.bw >= full_bw * 1.25 {
                        self.phase = Phase::Startup {
                            full_bw: self.bw,
                            flat: 0,
                        };
                    } else if flat + 1 >= 3 {
                        self.phase = Phase::Cycle(1);
                    } else {
                        self.phase = Phase::Startup {
                            full_bw,
                            flat: flat + 1,
                        };
                    }
                }
            }
            Phase::Drain { rounds } => {
                self.phase = if queued && rounds + 1 < DRAIN_ROUNDS {
                    Phase::Drain { rounds: rounds + 1 }
                } else {
                    Phase::Cycle(2)
                };
            }
            Phase::Cycle(i) => {
                // The queue stood and the ACKs came at about the estimate: the link was busy
                // with this flow's data throughout (a path whose datagrams got slower to
                // serialize than at the minimum's time shows samples above it too, but ACKs
                // at the rate sent, below the estimate).
                let busy = standing && ack_rate.is_some_and(|a| a >= self.bw * CAP_DEPTH);
                self.extra_drain = false;
                let guarded = i >= GUARD_FROM || r.congestion_loss;
                // After a cut the queue takes a while to drain (at the rate the cut freed): no
                // second cut until a round showed it gone, unless it stands for a whole cycle
                // (then others keep it up). Cutting at every round of the drain over-cuts
                // when many flows' queue is deep (16 players filling a 100 ms buffer).
                let drained = !self.draining || self.since_cut >= CYCLE.len() as u32;
                if congested && guarded && self.since_cut >= 2 && drained {
                    // The cycle goes on: a flow that shares a standing queue with others
                    // still probes once per cycle.
                    self.cut(ack_rate, queued);
                } else if i >= GUARD_FROM && busy && std::mem::replace(&mut self.standing, true) {
                    // Two cruise rounds (the probe's queue gone) in which every datagram still
                    // queued: the estimate is above the path (a noisy sample won the max of
                    // `BW_ROUNDS`, and cruise at 0.95 of it keeps the queue up), and the
                    // round, the link busy throughout, measured the path's rate for this flow.
                    // No sample may stand above that, and the next round at the drain gain
                    // takes the queue off before it grows into a cut (the cycle goes on).
                    if let Some(a) = ack_rate {
                        self.cap_estimate(a);
                    }
                    self.standing = false;
                    self.extra_drain = true;
                }
                self.standing &= busy && i >= GUARD_FROM;
                self.phase = Phase::Cycle((i + 1) % CYCLE.len());
            }
        }
    }

    /// A standing queue (or congestion loss): the estimate becomes [`CUT`] times this round's
    /// ACK rate (what the path gave this flow), at most the estimate and at least
    /// [`DEEPEST_CUT`] of it; a loss without a queue cuts the estimate itself by [`CUT`].
    fn cut(&mut self, ack_rate: Option<f64>, queued: bool) {
        // With a standing queue the ACKs arrive at the rate the path gives this flow (its
        // send rate would understate it while the queue drains). A round that spans an outage
        // or a peer that stopped reading (seconds of nothing acknowledged) shows a rate near
        // zero that says nothing of the path once it is back: one cut takes at most
        // `DEEPEST_CUT`, the next rounds show whether more is needed. A loss without a queue
        // says nothing of the rate at all.
        let base = match ack_rate {
            Some(r) if queued && self.bw > 0.0 => r.clamp(self.bw * DEEPEST_CUT, self.bw),
            Some(r) if self.bw <= 0.0 => r,
            _ => self.bw,
        };
        if base > 0.0 {
            self.reset_estimate((base * CUT).max(self.floor));
        }
        if matches!(self.phase, Phase::Startup { .. }) {
            self.phase = if queued {
                // Tokens saved while the game sent below startup's rate would let it go on
                // at its own rate for up to a smoothed RTT (a full bucket at the queue's
                // RTT), adding to the queue the drain is there to empty: it starts now.
                self.tokens = self.tokens.min(0.0);
                Phase::Drain { rounds: 0 }
            } else {
                Phase::Cycle(1)
            };
        }
        self.cut_gap = self.since_cut;
        self.since_cut = 0;
        self.draining = true;
    }

    /// How long until pacing allows `size` more bytes (None = now). The token bucket holds at
    /// most one smoothed RTT of sending (at least four datagrams): a flow that was idle may
    /// send what a window would have, a backlogged one is spread at the rate.
    pub(crate) fn pacing_delay(&mut self, now: Instant, size: usize) -> Option<Duration> {
        let rate = self.pacing_rate().max(1.0);
        let depth = (rate * self.srtt.as_secs_f64()).max((4 * self.mss) as f64);
        if let Some(last) = self.refilled {
            let dt = now.saturating_duration_since(last).as_secs_f64();
            self.tokens = (self.tokens + dt * rate).min(depth);
        }
        self.refilled = Some(now);
        if self.tokens + 1.0 >= size as f64 {
            None
        } else {
            self.mark_limited();
            // At least 1 µs: a wait that rounds to zero would leave the timer in the past.
            let wait = Duration::from_secs_f64((size as f64 - self.tokens) / rate);
            Some(wait.max(Duration::from_micros(1)))
        }
    }
}
