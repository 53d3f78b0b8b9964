//! Per-client accounting of one closed-loop echo run: what was sent, what came back, and how.
//!
//! Pure logic without sockets or clocks (times are arguments), so the accounting is tested
//! exactly.

use std::collections::{HashMap, HashSet};

use hdrhistogram::Histogram;

use super::message::{check_pattern, Header, Phase, HEADER_LEN};
use crate::schema::PhaseCounts;

/// What one received datagram turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Echo {
    /// The first, intact echo of an outstanding message sent in `phase`; `rtt_ns` after sending.
    Fresh {
        /// Phase the message was sent in.
        phase: Phase,
        /// Round-trip time in ns.
        rtt_ns: u64,
    },
    /// A second (or later) copy of a message that already came back.
    Duplicate,
    /// The echo of a message already declared lost at the end of its phase's drain.
    Late,
    /// Wrong bytes: bad header, foreign client, unknown sequence, wrong length or pattern.
    /// When the header identified an outstanding message, that message is settled (not lost).
    ContentError {
        /// True when an outstanding message was settled by this (wrong) echo.
        settled: bool,
    },
}

#[derive(Debug, Clone, Copy)]
struct Sent {
    phase: Phase,
    send_ns: u64,
}

/// Accounting for one client.
#[derive(Debug)]
pub struct Tracker {
    client: u32,
    payload: usize,
    next_seq: u64,
    outstanding: HashMap<u64, Sent>,
    lost: HashSet<u64>,
    highest_received: Option<u64>,
    counts: [PhaseCounts; 3],
    /// Round-trip times (ns) of fresh echoes of measured-phase messages.
    pub rtt_ns: Histogram<u64>,
}

/// Highest RTT the histograms track (60 s, in ns); larger values are clamped.
pub const RTT_MAX_NS: u64 = 60_000_000_000;

/// A histogram for RTTs in ns, 3 significant digits.
pub fn new_rtt_histogram() -> Histogram<u64> {
    // Constant bounds that hdrhistogram accepts (1 <= low, high >= 2 * low, 0..=5 digits).
    Histogram::new_with_bounds(1, RTT_MAX_NS, 3).expect("constant histogram bounds are valid")
}

impl Tracker {
    /// A tracker for `client` sending `payload`-byte messages.
    pub fn new(client: u32, payload: usize) -> Self {
        Tracker {
            client,
            payload,
            next_seq: 0,
            outstanding: HashMap::new(),
            lost: HashSet::new(),
            highest_received: None,
            counts: Default::default(),
            rtt_ns: new_rtt_histogram(),
        }
    }

    /// Record a message about to be sent in `phase` at `send_ns`; returns its sequence number.
    pub fn on_send(&mut self, phase: Phase, send_ns: u64) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.outstanding.insert(seq, Sent { phase, send_ns });
        self.counts[phase.index()].sent += 1;
        seq
    }

    /// Undo the last [`on_send`](Tracker::on_send) because the send failed; counts a send error.
    pub fn on_send_failed(&mut self, seq: u64) {
        if let Some(s) = self.outstanding.remove(&seq) {
            let c = &mut self.counts[s.phase.index()];
            c.sent -= 1;
            c.send_errors += 1;
        }
    }

    /// Count a receive error (other than a timeout) against `phase`.
    pub fn on_recv_error(&mut self, phase: Phase) {
        self.counts[phase.index()].recv_errors += 1;
    }

    /// Messages sent and not yet settled.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Outstanding messages sent in `phase`.
    pub fn outstanding_in(&self, phase: Phase) -> usize {
        self.outstanding
            .values()
            .filter(|s| s.phase == phase)
            .count()
    }

    /// Classify one received datagram at `now_ns` (ns since the run epoch).
    /// `current` is the phase errors are charged to when the datagram names no message.
    pub fn on_echo(&mut self, data: &[u8], now_ns: u64, current: Phase) -> Echo {
        let header = match Header::decode(data) {
            Some(h) if h.client == self.client && h.seq < self.next_seq => h,
            _ => {
                self.counts[current.index()].content_errors += 1;
                return Echo::ContentError { settled: false };
            }
        };
        let seq = header.seq;
        let Some(sent) = self.outstanding.get(&seq).copied() else {
            if self.lost.remove(&seq) {
                // Settled as lost already; a later copy is a duplicate.
                self.counts[header.phase.index()].late += 1;
                return Echo::Late;
            }
            self.counts[header.phase.index()].duplicated += 1;
            return Echo::Duplicate;
        };
        self.outstanding.remove(&seq);
        let c = &mut self.counts[sent.phase.index()];
        let intact = header.phase == sent.phase
            && header.send_ns == sent.send_ns
            && header.len as usize == data.len()
            && data.len() == self.payload
            && check_pattern(self.client, seq, &data[HEADER_LEN..]).is_none();
        if !intact {
            c.content_errors += 1;
            return Echo::ContentError { settled: true };
        }
        c.received += 1;
        match self.highest_received {
            Some(h) if h > seq => c.out_of_order += 1,
            _ => self.highest_received = Some(seq),
        }
        let rtt_ns = now_ns.saturating_sub(sent.send_ns);
        if sent.phase == Phase::Measured {
            let _ = self.rtt_ns.record(rtt_ns.clamp(1, RTT_MAX_NS));
        }
        Echo::Fresh {
            phase: sent.phase,
            rtt_ns,
        }
    }

    /// Declare every outstanding message lost (the drain time ran out).
    pub fn expire_outstanding(&mut self) {
        for (seq, sent) in self.outstanding.drain() {
            self.counts[sent.phase.index()].lost += 1;
            self.lost.insert(seq);
        }
    }

    /// Counts for one phase.
    pub fn counts(&self, phase: Phase) -> &PhaseCounts {
        &self.counts[phase.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::super::message::write_message;
    use super::*;

    fn msg(t: &mut Tracker, phase: Phase, at: u64, len: usize) -> (u64, Vec<u8>) {
        let seq = t.on_send(phase, at);
        let mut buf = vec![0u8; len];
        write_message(&mut buf, t.client, seq, at, phase);
        (seq, buf)
    }

    #[test]
    fn classifies_every_kind_of_echo() {
        let mut t = Tracker::new(1, 64);
        let (_, a) = msg(&mut t, Phase::Measured, 10, 64);
        let (_, b) = msg(&mut t, Phase::Measured, 20, 64);
        let (_, c) = msg(&mut t, Phase::Measured, 30, 64);
        let (_, d) = msg(&mut t, Phase::Measured, 40, 64);
        // b before a: a is out of order.
        assert_eq!(
            t.on_echo(&b, 100, Phase::Measured),
            Echo::Fresh {
                phase: Phase::Measured,
                rtt_ns: 80
            }
        );
        assert!(matches!(
            t.on_echo(&a, 110, Phase::Measured),
            Echo::Fresh { .. }
        ));
        assert_eq!(t.on_echo(&a, 120, Phase::Measured), Echo::Duplicate);
        let mut bad = c.clone();
        bad[50] ^= 1;
        assert_eq!(
            t.on_echo(&bad, 130, Phase::Measured),
            Echo::ContentError { settled: true }
        );
        // Foreign data.
        assert_eq!(
            t.on_echo(&[0u8; 10], 130, Phase::Measured),
            Echo::ContentError { settled: false }
        );
        t.expire_outstanding();
        assert_eq!(t.on_echo(&d, 200, Phase::Measured), Echo::Late);
        assert_eq!(t.on_echo(&d, 210, Phase::Measured), Echo::Duplicate);
        let m = t.counts(Phase::Measured);
        assert_eq!(
            (
                m.sent,
                m.received,
                m.out_of_order,
                m.duplicated,
                m.content_errors,
                m.lost,
                m.late
            ),
            (4, 2, 1, 2, 2, 1, 1)
        );
        assert_eq!(t.rtt_ns.len(), 2);
    }
}
