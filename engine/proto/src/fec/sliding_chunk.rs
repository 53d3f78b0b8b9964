//! Message chunks of the sliding-window sender: the datagrams of an unreliable message of
//! several fragments are coded in chunks of their own, each chunk's repairs sized by the
//! binomial tail and sent after its last source (see [`SlidingSender::protect_fragment`]).

use std::time::{Duration, Instant};

use super::super::policy::least_parity;
use super::super::FecPolicy;
use super::SlidingSender;

/// The loss a message is sized for before the peer's first report: the loss the game
/// profile is built to meet. Only a message likely to be lost whole at that loss (more than
/// [`PRIOR_MESSAGE_LOSS`]: 14 fragments and more) is protected then; a message of a few
/// fragments waits for the report (its repairs would cost more than half its bytes, and
/// on a clean path they are pure waste).
const PRIOR_LOSS: f64 = 0.05;
/// See [`PRIOR_LOSS`].
const PRIOR_MESSAGE_LOSS: f64 = 0.5;

/// A chunk of a message of several fragments being sent: the datagrams from its first
/// fragment on (with whatever goes between them) are sources the ratio does not repair;
/// the chunk's repairs, sized for the whole chunk, follow its last source. See
/// [`SlidingSender::protect_fragment`].
#[derive(Clone, Copy, Debug)]
pub(super) struct Chunk {
    /// When its oldest source was sent.
    pub(super) started: Instant,
    /// Sources at which it closes.
    pub(super) planned: usize,
    /// The chance of losing the chunk that its repairs are sized for: the message's target,
    /// the chunk's share by length.
    pub(super) residual: f64,
    /// Fragments of its message.
    pub(super) fragments: u32,
}

impl SlidingSender {
    /// How long a message chunk may stay open: half the receiver's hold on sources
    /// (`max_group_age`), so the chunk's repairs find its sources still held.
    pub(super) fn chunk_max_age(&self) -> Duration {
        self.cfg.max_group_age / 2
    }

    /// While message chunks are sent: how many datagrams, and how long, the repairs of a
    /// chunk may follow its first source (a lost one is rebuilt only then, so ARQ should not
    /// call it lost sooner). For the open chunk, its planned length and half that in repairs;
    /// the time is the last closed chunk's (a chunk sent in one burst takes next to none, and
    /// a longer wait keeps lost packets counted in flight, which stalls a full window).
    /// `None` once the ratio repairs again.
    pub(crate) fn chunk_reorder(&self) -> Option<(usize, Duration)> {
        let time = self.chunk_span.map_or(Duration::ZERO, |(_, d)| d);
        match self.chunk {
            Some(c) => Some((c.planned + c.planned.div_ceil(2), time)),
            None => self.chunk_span,
        }
    }

    /// Opens a chunk at the datagram about to be protected, a fragment with `rest` more of
    /// its message of `count` to follow, if the policy protects messages now. Sources a
    /// repair already covers leave the window (the chunk's repairs cover the chunk alone);
    /// uncovered ones join the chunk. What is left of the message (with them) is cut into
    /// chunks of equal length, at most `sliding.window` each, and each may leave the share
    /// of the message's residual its length is of the message.
    pub(super) fn open_chunk(&mut self, now: Instant, rest: u32, count: u32) {
        let protects = match self.cfg.policy {
            FecPolicy::Off => false,
            FecPolicy::Fixed { parity } => parity > 0,
            FecPolicy::Adaptive { .. } => self.message_loss(count).is_some(),
        };
        if !protects {
            return;
        }
        self.trim(now);
        while self.window.len() > self.uncovered {
            self.pop_front_source();
        }
        let total = self.window.len() + rest as usize + 1;
        let chunks = total.div_ceil(self.cfg.sliding.window);
        let planned = total.div_ceil(chunks);
        let message = total.max(count as usize);
        self.chunk = Some(Chunk {
            started: self.window.front().map_or(now, |s| s.sent),
            planned,
            residual: self.cfg.adaptive.target_residual * planned as f64 / message as f64,
            fragments: count,
        });
        self.stats.message_chunks += 1;
    }

    /// Closes the open chunk: queues its repairs over the window (the chunk's sources).
    pub(super) fn close_chunk(&mut self, now: Instant) {
        let Some(c) = self.chunk.take() else {
            return;
        };
        let k = self.window.len();
        if k == 0 {
            return;
        }
        let span = self.cfg.sliding.span;
        let n = match self.cfg.policy {
            FecPolicy::Off => 0,
            FecPolicy::Fixed { parity } => (k * usize::from(parity)).div_ceil(span),
            FecPolicy::Adaptive { max_parity } => match self.message_loss(c.fragments) {
                Some(loss) => {
                    let max = (k * usize::from(max_parity)).div_ceil(span).max(1);
                    // None when the message arrives whole as often as the target asks
                    // without them (a few fragments at a low loss).
                    least_parity(loss, k, c.residual, 0, max)
                }
                // The peer reported a clean path while the chunk was sent.
                None => 0,
            },
        };
        let queued = self.emit(n);
        self.stats.message_repairs += queued as u64;
        self.chunk_span = Some((
            k + queued,
            now.saturating_duration_since(c.started) + self.cfg.sliding.tail_wait,
        ));
    }

    /// The loss the adaptive policy sizes the chunks of a message of `fragments` for: the
    /// estimate, at most the largest recent sample (see `ParityController::recent_loss`);
    /// `None` on a clean path (at most `adaptive.clean_loss`), where chunks carry no
    /// repairs. Reports count a datagram only once its fate is decided (`track.rs`), so the
    /// first one already reads the path's loss; before it, [`PRIOR_LOSS`] for a message
    /// likely lost whole at that loss, `None` for a smaller one.
    fn message_loss(&self, fragments: u32) -> Option<f64> {
        match self.controller.recent_loss() {
            Some(loss) => (loss > self.cfg.adaptive.clean_loss).then_some(loss),
            None => {
                let whole = (1.0 - PRIOR_LOSS).powi(fragments.min(1 << 16) as i32);
                (1.0 - whole > PRIOR_MESSAGE_LOSS).then_some(PRIOR_LOSS)
            }
        }
    }
}
