//! FEC wiring of a connection: wraps outgoing ARQ datagrams in `FecData` packets, emits parity
//! as `FecParity` packets, and unwraps incoming FEC packets back into ARQ datagrams.
//!
//! # Layout and overhead
//!
//! An ARQ datagram is a `Data` packet: type, version, destination cid (10 bytes, the part
//! every connection packet shares), packet number, frames. FEC protects only what follows the
//! shared 10 bytes (packet number and frames); the `FecData` packet repeats those 10 bytes with
//! its own type, then the 3-byte FEC data header, then the protected bytes. The receiver
//! hands every delivered or recovered payload to ARQ as is: the ARQ datagram from its packet
//! number on (its shared 10 bytes would only repeat what the connection read and checked in the
//! `FecData` packet's clear header). So each data datagram costs 3 bytes more than without FEC.
//! A parity packet carries an 8-byte parity number after the shared 10 bytes (its
//! packet-protection nonce), then the 6-byte parity header, a 2-byte length prefix and the
//! coded shard, as long as the longest protected payload. The ARQ datagram budget is the UDP
//! payload limit minus [`FEC_ARQ_OVERHEAD`] (16 B) and the tag ([`crate::wire::TAG_LEN`],
//! reserved whether or not the session seals), sized so the parity packet fits the UDP payload
//! limit with its tag.
//!
//! # FEC below packet protection
//!
//! FEC works on plaintext ARQ datagrams and every packet it emits, `FecData` and `FecParity`
//! alike, is then sealed on its own (FEC first, encryption second); the receiver opens each
//! packet before FEC sees it. So only authenticated shards and repairs ever enter the FEC
//! receiver: a forged repair cannot be combined into a rebuilt datagram, nor can a forged data
//! header move the FEC sequence, shrink the retained groups or fake the loss the receiver
//! reports. A rebuilt datagram is a combination of authenticated packets, so it is as authentic
//! as they are, and it still passes ARQ's duplicate checks. The other order (encrypt each
//! datagram, then FEC over ciphertext) would leave the FEC headers and repairs unauthenticated
//! unless each FEC packet carried a second tag.
//!
//! # Congestion control
//!
//! Parity counts against the congestion window: a parity packet waits until the window has
//! room for it and the pacer's leave (the rate covers repairs as it covers data), and adds
//! to the bytes in flight. Parity is never acknowledged, so its bytes leave flight when a
//! packet sent at or after it is acknowledged (by then it arrived or was lost; the delay
//! controller counts it delivered, as it counts it paced) or declared lost, or at a
//! retransmission timeout.

#[cfg(feature = "fec")]
use std::collections::VecDeque;
use std::time::Instant;

use super::cc::Congestion;
use crate::config::Config;
#[cfg(feature = "fec")]
use crate::config::FEC_ARQ_OVERHEAD;

#[cfg(any(test, not(feature = "fec")))]
mod without_codecs;
#[cfg(test)]
use without_codecs::unwrap_data;
#[cfg(not(feature = "fec"))]
pub(crate) use without_codecs::FecLink;

/// Congestion losses kept for the peer's loss reports at most (see
/// `FecState::on_congestion_loss`): a few reports' worth.
#[cfg(feature = "fec")]
const MAX_CONGESTION_LOST: u64 = 256;
#[cfg(feature = "fec")]
use crate::fec::scheme::{Rx, Tx};
#[cfg(feature = "fec")]
use crate::fec::LossReport;
#[cfg(feature = "fec")]
use crate::fec::{max_protected_payload, FecConfig, FecPolicy};
use crate::fec::{FecError, MalformedCounts, ReceiverStats, RetentionBudget, SenderStats};
#[cfg(feature = "fec")]
use crate::wire::Packet;
#[cfg(feature = "fec")]
use crate::wire::FEC_HEADER_LEN;
use crate::wire::{self, ConnectionId, FEC_PARITY_HEADER_LEN, TAG_LEN};

/// FEC counters of one connection (both directions), in [`crate::ConnectionStats::fec`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct FecStats {
    /// Data shards this side rebuilt from parity and handed to ARQ.
    pub data_recovered: u64,
    /// Groups this side could not rebuild (ARQ retransmits their lost shards).
    pub groups_unrecoverable: u64,
    /// Parity shards this side sent.
    pub parity_sent: u64,
    /// Parity packet bytes this side sent (FEC packet header included).
    pub parity_bytes: u64,
    /// Data packet bytes this side sent as `FecData` (header included).
    pub data_bytes: u64,
    /// Parity shards the last group this side closed carried.
    pub current_parity: usize,
    /// Most parity shards any group of this side carried.
    pub max_parity: usize,
    /// Times the adaptive policy changed the parity level.
    pub policy_changes: u64,
    /// Bytes this connection retains for incomplete groups now.
    pub retained_bytes: usize,
    /// Peak of `retained_bytes` (never above `retention_limit`).
    pub peak_retained_bytes: usize,
    /// The limit of the retention budget this connection draws on: its endpoint's, shared by
    /// all the endpoint's connections (see [`crate::Endpoint::fec_budget`]).
    pub retention_limit: usize,
    /// Loss of data shards this side observed on the wire, before recovery (fraction).
    pub realized_loss: f64,
    /// Parity shards dropped because the caller's send buffer could not hold them.
    pub parity_unsendable: u64,
    /// Malformed FEC bodies dropped, by cause.
    pub malformed: MalformedCounts,
    /// All sender counters.
    pub sender: SenderStats,
    /// All receiver counters.
    pub receiver: ReceiverStats,
}

/// Per-connection FEC wiring: nothing but the retention budget until this side sends FEC or
/// its peer does (most sessions of a server on the default settings never do), then the boxed
/// state.
#[cfg(feature = "fec")]
pub(crate) struct FecLink {
    /// The budget a new receiver starts with (the endpoint swaps its shared budget in here for
    /// each call while no receiver exists).
    budget: RetentionBudget,
    /// Tag bytes the connection appends to every FEC packet (0 in the insecure mode).
    tag: usize,
    state: Option<Box<FecState>>,
    /// The receiver's earliest deadline, kept inline: the connection reads it at every
    /// deadline recomputation, when the boxed receiver is often out of cache (the sender's
    /// state is not: sending reads it just before). Refreshed by every call that may change
    /// the receiver ([`Self::refresh_rx`]).
    rx_deadline: Option<Instant>,
}

/// What a connection that sends or receives FEC holds.
#[cfg(feature = "fec")]
struct FecState {
    /// FEC settings with `max_payload` set to what the ARQ budget protects.
    cfg: FecConfig,
    /// Present when this side's policy is not `Off`.
    tx: Option<Box<Tx>>,
    /// Created on the first FEC packet from the peer (the peer may protect while we do not).
    rx: Option<Box<Rx>>,
    /// Scratch for a data body (allocated on first use, given back by [`Self::trim`]).
    body: Vec<u8>,
    /// ARQ datagrams (from their packet number on) the last FEC packet yielded, back to back,
    /// and their lengths.
    out: Vec<u8>,
    out_lens: Vec<usize>,
    /// (sent at, bytes) of parity counted in flight.
    parity_flight: VecDeque<(Instant, usize)>,
    /// Parity body bytes dropped unsent (see `FecStats::parity_unsendable`).
    unsendable_bytes: u64,
    /// Parity shards dropped unsent (`FecStats::parity_unsendable`).
    parity_unsendable: u64,
    /// `FecData` packet bytes sent (`FecStats::data_bytes`).
    data_bytes: u64,
    /// Number of the next parity packet (its packet-protection nonce).
    next_parity_number: u64,
    /// Packets ARQ declared lost to congestion not yet taken off a loss report.
    congestion_lost: u64,
    /// Tag bytes the connection appends to every FEC packet (0 in the insecure mode).
    tag: usize,
}

#[cfg(feature = "fec")]
impl std::fmt::Debug for FecLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state.as_deref();
        f.debug_struct("FecLink")
            .field("cfg", &st.map(|s| s.cfg))
            .field("sending", &self.sending())
            .field("receiving", &self.receiving())
            .field("data_bytes", &st.map_or(0, |s| s.data_bytes))
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "fec")]
impl FecLink {
    /// `tag`: bytes of authentication tag the connection appends to each FEC packet it seals
    /// (0 without keys); room for a tag is reserved either way.
    pub(crate) fn new(cfg: &Config, tag: usize) -> Self {
        let state = (cfg.fec.policy != FecPolicy::Off).then(|| Box::new(FecState::new(cfg, tag)));
        FecLink {
            budget: RetentionBudget::default(),
            tag,
            state,
            rx_deadline: None,
        }
    }

    /// Recomputes `rx_deadline` (after a call that may have changed the receiver, which it
    /// has just touched).
    fn refresh_rx(&mut self) {
        self.rx_deadline = self.rx().and_then(Rx::poll_timeout);
    }

    /// Start from an empty retention budget of `limit` bytes (before any FEC packet arrived).
    pub(crate) fn set_budget_limit(&mut self, limit: usize) {
        self.budget = RetentionBudget::new(limit);
    }

    /// The retention budget receiving draws on: the receiver's once it exists, else the one a
    /// new receiver starts with (the endpoint swaps its shared budget in here for each call).
    pub(crate) fn budget_mut(&mut self) -> &mut RetentionBudget {
        match self.state.as_mut().and_then(|s| s.rx.as_mut()) {
            Some(rx) => rx.budget_mut(),
            None => &mut self.budget,
        }
    }

    /// Bytes the receiver retains now.
    pub(crate) fn retained_bytes(&self) -> usize {
        self.rx().map_or(0, |rx| rx.retained_bytes())
    }

    fn rx(&self) -> Option<&Rx> {
        self.state.as_ref()?.rx.as_deref()
    }

    /// Whether outgoing ARQ datagrams are wrapped.
    pub(crate) fn sending(&self) -> bool {
        self.state.as_ref().is_some_and(|s| s.tx.is_some())
    }

    /// Whether the peer sends FEC (its shard loss then drives our loss reports).
    pub(crate) fn receiving(&self) -> bool {
        self.rx().is_some()
    }

    /// Extra packets ARQ's fast retransmit tolerates while FEC may still rebuild a lost one
    /// (see [`FecState::reorder_allowance`]).
    pub(crate) fn reorder_allowance(&self) -> u64 {
        self.state.as_ref().map_or(0, |s| s.reorder_allowance())
    }

    /// Extra time ARQ's time-threshold loss detection waits (see
    /// [`FecState::reorder_delay`]).
    pub(crate) fn reorder_delay(&self) -> std::time::Duration {
        self.state
            .as_ref()
            .map_or(std::time::Duration::ZERO, |s| s.reorder_delay())
    }

    /// The ARQ datagram budget for a UDP payload limit of `udp` bytes (room for the tag is
    /// always left, see [`Config::arq_datagram_size`]).
    pub(crate) fn arq_budget(&self, udp: usize) -> usize {
        let udp = udp.saturating_sub(TAG_LEN);
        if self.sending() {
            udp.saturating_sub(FEC_ARQ_OVERHEAD)
        } else {
            udp
        }
    }

    /// Wraps an outgoing ARQ datagram (see [`FecState::seal`]); as is without FEC.
    /// `remaining`: the datagram carries a fragment of an unreliable message of several
    /// fragments: (how many follow it, how many it has); the FEC code spends its repairs on
    /// the message (see `SlidingSender::protect_fragment`). Returns the packet's length and
    /// its clear header's (what packet protection leaves readable).
    pub(crate) fn seal(
        &mut self,
        now: Instant,
        dst: ConnectionId,
        buf: &mut [u8],
        len: usize,
        remaining: Option<(u32, u32)>,
    ) -> (usize, usize) {
        match self.state.as_mut() {
            Some(s) => s.seal(now, dst, buf, len, remaining),
            None => (len, wire::DATA_HEADER_LEN),
        }
    }

    /// Size of the next parity packet, if one is ready.
    pub(crate) fn next_parity(&self) -> Option<usize> {
        self.state.as_ref()?.next_parity()
    }

    /// True when [`Self::poll_parity`] at `now` would return `None` and change nothing: no
    /// parity is ready and no group's wait has run out.
    pub(crate) fn idle_at(&self, now: Instant) -> bool {
        self.state.as_ref().is_none_or(|s| {
            s.next_parity().is_none() && !s.tx.as_ref().is_some_and(|t| t.expiry_due(now))
        })
    }

    /// Writes the next parity packet, if any (see [`FecState::poll_parity`]).
    pub(crate) fn poll_parity(
        &mut self,
        now: Instant,
        dst: ConnectionId,
        buf: &mut [u8],
        cc: &mut Congestion,
    ) -> Option<usize> {
        self.state.as_mut()?.poll_parity(now, dst, buf, cc)
    }

    /// The fate of a packet sent at `sent` is known, `delivered` if it was acknowledged (see
    /// [`FecState::on_acked`]): parity sent no later has left the path.
    pub(crate) fn on_acked(&mut self, sent: Instant, delivered: bool, cc: &mut Congestion) {
        if let Some(s) = self.state.as_mut() {
            s.on_acked(sent, delivered, cc);
        }
    }

    /// Hints the CPU to load the head of this link's FEC state (see `prefetch`).
    pub(crate) fn prefetch(&self) {
        if let Some(state) = self.state.as_deref() {
            crate::prefetch::front(std::slice::from_ref(state), 256);
        }
    }

    /// Whether parity is counted in the congestion controller's bytes in flight.
    pub(crate) fn parity_in_flight(&self) -> bool {
        self.state
            .as_ref()
            .is_some_and(|s| !s.parity_flight.is_empty())
    }

    /// Retransmission timeout: no parity is in flight any more.
    pub(crate) fn on_rto(&mut self, cc: &mut Congestion) {
        if let Some(s) = self.state.as_mut() {
            s.on_rto(cc);
        }
    }

    /// Earliest FEC timer.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let s = self.state.as_ref()?;
        let tx = s.tx.as_ref().and_then(|t| t.poll_timeout());
        let t = match (tx, self.rx_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        debug_assert_eq!(t, s.poll_timeout());
        t
    }

    /// Runs FEC timers.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if let Some(s) = self.state.as_mut() {
            s.handle_timeout(now);
            self.refresh_rx();
        }
    }

    /// The peer's loss report reached us: it steers the adaptive parity.
    pub(crate) fn on_loss_report(&mut self, received: u64, lost: u64, max_burst: u64) {
        if let Some(s) = self.state.as_mut() {
            s.on_loss_report(received, lost, max_burst);
        }
    }

    /// ARQ declared `n` packets lost while the path showed a standing queue (see
    /// [`FecState::on_congestion_loss`]).
    pub(crate) fn on_congestion_loss(&mut self, n: u64) {
        if let Some(s) = self.state.as_mut() {
            s.on_congestion_loss(n);
        }
    }

    /// Data shards (received, lost, longest loss burst) the peer's FEC stream showed since
    /// the last call.
    pub(crate) fn take_loss_report(&mut self) -> Option<(u64, u64, u64)> {
        self.state.as_mut()?.take_loss_report()
    }

    /// Feeds an FEC packet body to the receiver (created, with the state, on the first one);
    /// see [`FecState::receive`].
    pub(crate) fn receive(
        &mut self,
        cfg: &Config,
        now: Instant,
        body: &[u8],
        parity: bool,
    ) -> Result<(), FecError> {
        let (budget, tag) = (self.budget, self.tag);
        let r = self
            .state
            .get_or_insert_with(|| Box::new(FecState::new(cfg, tag)))
            .receive(budget, now, body, parity);
        self.refresh_rx();
        r
    }

    /// The ARQ datagrams the last [`Self::receive`] yielded (see
    /// [`FecState::take_datagrams`]).
    pub(crate) fn take_datagrams(&mut self) -> (Vec<u8>, Vec<usize>) {
        self.state
            .as_mut()
            .map_or((Vec::new(), Vec::new()), |s| s.take_datagrams())
    }

    /// Returns the buffers of [`Self::take_datagrams`].
    pub(crate) fn restore_datagrams(&mut self, out: Vec<u8>, lens: Vec<usize>) {
        if let Some(s) = self.state.as_mut() {
            s.restore_datagrams(out, lens);
        }
    }

    /// Gives back scratch and pooled buffers (the connection is idle).
    pub(crate) fn trim(&mut self, now: Instant) {
        if let Some(s) = self.state.as_mut() {
            s.trim(now);
            self.refresh_rx();
        }
    }

    /// Current counters.
    pub(crate) fn stats(&self) -> FecStats {
        let mut s = self
            .state
            .as_ref()
            .map_or_else(FecStats::default, |s| s.stats());
        s.retention_limit = self.budget.limit();
        s
    }
}

#[cfg(feature = "fec")]
impl FecState {
    fn new(cfg: &Config, tag: usize) -> Self {
        let fec = FecConfig {
            max_payload: max_protected_payload(
                cfg.max_path_datagram_size(),
                FEC_PARITY_HEADER_LEN + TAG_LEN,
            ),
            ..cfg.fec
        };
        let tx = (fec.policy != FecPolicy::Off).then(|| Box::new(Tx::new(fec)));
        FecState {
            body: Vec::new(),
            cfg: fec,
            tx,
            rx: None,
            out: Vec::new(),
            out_lens: Vec::new(),
            parity_flight: VecDeque::new(),
            unsendable_bytes: 0,
            parity_unsendable: 0,
            data_bytes: 0,
            next_parity_number: 0,
            congestion_lost: 0,
            tag,
        }
    }

    /// Extra packets ARQ's fast retransmit tolerates while groups carry parity: a lost packet
    /// is rebuilt at the receiver only when its group's parity arrives, up to a group plus its
    /// parity later.
    pub(crate) fn reorder_allowance(&self) -> u64 {
        match self.tx.as_deref() {
            Some(Tx::Block(tx)) if tx.parity_level() > 0 => {
                (self.cfg.max_data_shards + tx.parity_level()) as u64
            }
            // A sliding repair follows at most one repair interval later (or the tail timer),
            // a message chunk's repairs its last source.
            Some(Tx::Sliding(tx)) => {
                let ratio = tx.repair_interval().map_or(0, |k| k as u64 + 1);
                ratio.max(tx.chunk_reorder().map_or(0, |(n, _)| n as u64))
            }
            _ => 0,
        }
    }

    /// Extra time ARQ's time-threshold loss detection waits while groups carry parity: a lost
    /// packet is rebuilt only once its group closes (up to `group_wait` after the group's first
    /// packet) and the parity crosses the path.
    pub(crate) fn reorder_delay(&self) -> std::time::Duration {
        match self.tx.as_deref() {
            Some(Tx::Block(tx)) if tx.parity_level() > 0 => self.cfg.group_wait,
            Some(Tx::Sliding(tx)) => {
                let ratio = if tx.parity_level() > 0 {
                    self.cfg.sliding.tail_wait
                } else {
                    std::time::Duration::ZERO
                };
                ratio.max(
                    tx.chunk_reorder()
                        .map_or(std::time::Duration::ZERO, |(_, d)| d),
                )
            }
            _ => std::time::Duration::ZERO,
        }
    }

    /// Wraps the ARQ datagram `buf[..len]` in place into a `FecData` packet addressed to
    /// `dst`; returns the new length and the clear header's. Sends the datagram unwrapped if
    /// FEC is off or it does not fit (the receiver handles plain `Data` packets either way).
    pub(crate) fn seal(
        &mut self,
        now: Instant,
        dst: ConnectionId,
        buf: &mut [u8],
        len: usize,
        remaining: Option<(u32, u32)>,
    ) -> (usize, usize) {
        let plain = (len, wire::DATA_HEADER_LEN);
        let Some(tx) = self.tx.as_mut() else {
            return plain;
        };
        if len < FEC_HEADER_LEN {
            return plain;
        }
        if self.body.is_empty() {
            self.body = vec![0u8; self.cfg.max_parity_body()];
        }
        let payload = len - FEC_HEADER_LEN;
        let n = crate::fec::DATA_HEADER_LEN + payload;
        if FEC_HEADER_LEN + n + TAG_LEN > buf.len() {
            // Cannot happen with the budget from `arq_budget`. The datagram still joins the
            // group (the receiver will count it lost and ARQ retransmits it) and goes as is.
            let _ = tx.protect(now, &buf[FEC_HEADER_LEN..len], &mut self.body, remaining);
            return plain;
        }
        // In place: the payload moves up to make room for the FEC data header.
        let body = FEC_HEADER_LEN..FEC_HEADER_LEN + n;
        let shifted = FEC_HEADER_LEN + crate::fec::DATA_HEADER_LEN;
        buf.copy_within(FEC_HEADER_LEN..len, shifted);
        if tx
            .protect_placed(now, &mut buf[body.clone()], payload, remaining)
            .is_err()
        {
            buf.copy_within(shifted..body.end, FEC_HEADER_LEN);
            return plain;
        }
        if wire::encode_fec_data_header(dst, &mut buf[..FEC_HEADER_LEN]).is_err() {
            return plain;
        }
        self.data_bytes += (FEC_HEADER_LEN + n + self.tag) as u64;
        (FEC_HEADER_LEN + n, wire::FEC_DATA_CLEAR_LEN)
    }

    /// Closes the open group if its wait ran out (its parity becomes ready).
    fn close_expired(&mut self, now: Instant) {
        if let Some(tx) = self.tx.as_mut() {
            tx.close_expired(now);
        }
    }

    /// Size of the next parity packet, if one is ready.
    pub(crate) fn next_parity(&self) -> Option<usize> {
        self.tx
            .as_ref()
            .and_then(|t| t.next_parity_len())
            .map(|n| FEC_PARITY_HEADER_LEN + n + self.tag)
    }

    /// Writes the next parity packet into `buf` if one is ready and the congestion window has
    /// room for it; returns its length.
    pub(crate) fn poll_parity(
        &mut self,
        now: Instant,
        dst: ConnectionId,
        buf: &mut [u8],
        cc: &mut Congestion,
    ) -> Option<usize> {
        self.close_expired(now);
        let size = self.next_parity()?;
        if size - self.tag + TAG_LEN > buf.len() {
            // The caller's buffer is below the configured datagram size: this parity can never
            // go out, drop it rather than wait for it (ARQ covers its group).
            let tx = self.tx.as_mut()?;
            if self.body.is_empty() {
                self.body = vec![0u8; self.cfg.max_parity_body()];
            }
            if let Some(n) = tx.poll_parity(now, &mut self.body) {
                self.parity_unsendable += 1;
                self.unsendable_bytes += n as u64;
            }
            return None;
        }
        if !cc.can_send(size) {
            return None;
        }
        let p = Packet::FecParity {
            dst_cid: dst,
            number: self.next_parity_number,
            body: &[],
        };
        wire::encode_packet(&p, &mut buf[..FEC_PARITY_HEADER_LEN]).ok()?;
        let end = buf.len() - TAG_LEN;
        let n = self
            .tx
            .as_mut()?
            .poll_parity(now, &mut buf[FEC_PARITY_HEADER_LEN..end])?;
        self.next_parity_number += 1;
        cc.on_sent(size);
        self.parity_flight.push_back((now, size));
        Some(FEC_PARITY_HEADER_LEN + n)
    }

    /// ARQ declared `n` packets lost while the smoothed RTT showed a standing queue: the
    /// sender's own queue overflowed (a controller's startup overshoot, a rate step down).
    /// The peer's next loss reports count those datagrams too; they are taken off there, so
    /// the adaptive policy sizes repairs for the path's random loss alone: repairs for
    /// congestion loss only deepen the queue that caused it, and the estimate would keep
    /// them up for seconds after it drained. Bounded: what no report claims is forgotten at
    /// [`MAX_CONGESTION_LOST`].
    pub(crate) fn on_congestion_loss(&mut self, n: u64) {
        self.congestion_lost = (self.congestion_lost + n).min(MAX_CONGESTION_LOST);
    }

    /// The fate of a packet sent at `sent` is known: it was acknowledged (`delivered`; whether
    /// the sender tracked it or not, and also after it was declared lost) or declared lost.
    /// Parity sent no later has left the path then, delivered or not (the controller counts
    /// it delivered with an ACK, see `Congestion::on_parity_left`). Parity is never acknowledged itself, so
    /// this is the only way it leaves the flight short of an RTO: were it kept until an
    /// in-flight packet is acknowledged, a flight whose data packets were all declared lost
    /// (while ACK-only packets got through) would keep its parity counted against the window
    /// for good, and a window full of parity blocks the retransmissions that could end it.
    pub(crate) fn on_acked(&mut self, sent: Instant, delivered: bool, cc: &mut Congestion) {
        // Most ACKs find no parity due: leave the boxed sender (its loss estimate) untouched.
        match self.parity_flight.front() {
            Some(&(t, _)) if t <= sent => {}
            _ => return,
        }
        let arrived = match (delivered, self.tx.as_ref()) {
            (true, Some(tx)) => 1.0 - tx.loss_estimate().unwrap_or(0.0),
            (true, None) => 1.0,
            (false, _) => 0.0,
        };
        while let Some(&(t, size)) = self.parity_flight.front() {
            if t > sent {
                break;
            }
            cc.on_parity_left(size, t, arrived);
            self.parity_flight.pop_front();
        }
    }

    /// Retransmission timeout: no parity is in flight any more.
    pub(crate) fn on_rto(&mut self, cc: &mut Congestion) {
        for (_, size) in self.parity_flight.drain(..) {
            cc.on_removed(size);
        }
    }

    /// Earliest FEC timer: the open group's wait or the oldest incomplete group's age limit.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let a = self.tx.as_ref().and_then(|t| t.poll_timeout());
        let b = self.rx.as_ref().and_then(|r| r.poll_timeout());
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs FEC timers: closes an expired group, drops aged incomplete groups.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        self.close_expired(now);
        if let Some(rx) = self.rx.as_mut() {
            rx.handle_timeout(now);
        }
    }

    /// The peer's loss report reached us: it steers the adaptive parity.
    pub(crate) fn on_loss_report(&mut self, received: u64, lost: u64, max_burst: u64) {
        // The peer's count includes what ARQ already called congestion loss: leave it out.
        let congestion = self.congestion_lost.min(lost);
        self.congestion_lost -= congestion;
        if let Some(tx) = self.tx.as_mut() {
            tx.on_loss_report(LossReport {
                received,
                lost: lost - congestion,
                max_burst,
            });
        }
    }

    /// Data shards (received, lost, longest loss burst) the peer's FEC stream showed since
    /// the last call.
    pub(crate) fn take_loss_report(&mut self) -> Option<(u64, u64, u64)> {
        self.rx.as_mut().map(|r| {
            let l = r.loss_report();
            (l.received, l.lost, l.max_burst)
        })
    }

    /// Feeds an FEC packet body to the receiver. The ARQ datagrams it yields (the data shard
    /// itself and any rebuilt ones, from their packet number on) are left for
    /// [`Self::take_datagrams`]. `Err` means the body was malformed, dropped and counted.
    fn receive(
        &mut self,
        budget: RetentionBudget,
        now: Instant,
        body: &[u8],
        parity: bool,
    ) -> Result<(), FecError> {
        let cfg = self.cfg;
        let rx = self
            .rx
            .get_or_insert_with(|| Box::new(Rx::new(cfg, budget)));
        self.out.clear();
        self.out_lens.clear();
        let (out, lens) = (&mut self.out, &mut self.out_lens);
        let mut deliver = |p: &[u8]| {
            out.extend_from_slice(p);
            lens.push(p.len());
        };
        rx.receive(now, body, parity, &mut deliver)
    }

    /// The ARQ datagrams the last [`Self::receive`] yielded: (bytes back to back, lengths).
    /// Give them back with [`Self::restore_datagrams`] so the buffers are reused.
    pub(crate) fn take_datagrams(&mut self) -> (Vec<u8>, Vec<usize>) {
        (
            std::mem::take(&mut self.out),
            std::mem::take(&mut self.out_lens),
        )
    }

    /// Returns the buffers of [`Self::take_datagrams`].
    pub(crate) fn restore_datagrams(&mut self, out: Vec<u8>, lens: Vec<usize>) {
        self.out = out;
        self.out_lens = lens;
    }

    /// Gives back scratch and pooled buffers (the connection is idle); they are taken again
    /// when FEC packets flow.
    fn trim(&mut self, now: Instant) {
        self.body = Vec::new();
        self.out = Vec::new();
        self.out_lens = Vec::new();
        self.parity_flight.shrink_to_fit();
        if let Some(tx) = self.tx.as_mut() {
            tx.release_idle(now);
        }
        if let Some(rx) = self.rx.as_mut() {
            rx.release_idle();
        }
    }

    /// Current counters (the retention limit is the link's to fill in).
    fn stats(&self) -> FecStats {
        let mut s = FecStats {
            data_bytes: self.data_bytes,
            parity_unsendable: self.parity_unsendable,
            ..FecStats::default()
        };
        if let Some(tx) = self.tx.as_ref() {
            let t = tx.stats();
            // The sender counts parity handed out; some may have been dropped unsendable.
            s.parity_sent = t.parity_shards_sent - s.parity_unsendable;
            s.parity_bytes = t.parity_bytes_sent - self.unsendable_bytes
                + s.parity_sent * (FEC_PARITY_HEADER_LEN + self.tag) as u64;
            s.current_parity = t.current_parity;
            s.max_parity = t.max_parity;
            s.policy_changes = t.policy_changes;
            s.sender = t;
        }
        if let Some(rx) = self.rx.as_ref() {
            let r = rx.stats();
            s.data_recovered = r.data_recovered;
            s.groups_unrecoverable = r.groups_unrecoverable;
            s.realized_loss = r.realized_loss();
            s.malformed = r.malformed;
            s.receiver = r;
        }
        if let Some(rx) = self.rx.as_ref() {
            let r = rx.stats();
            s.retained_bytes = r.retained_bytes;
            s.peak_retained_bytes = r.peak_retained_bytes;
        }
        s
    }
}

#[cfg(all(test, feature = "fec"))]
mod tests {
    use super::*;
    use crate::fec::FecScheme;

    fn adaptive_link() -> FecLink {
        let mut cfg = Config::game();
        cfg.fec.policy = FecPolicy::Adaptive { max_parity: 4 };
        cfg.fec.scheme = FecScheme::Block;
        FecLink::new(&cfg, 0)
    }

    fn level(link: &FecLink) -> usize {
        link.state
            .as_ref()
            .and_then(|s| s.tx.as_ref())
            .map_or(0, |t| t.parity_level())
    }

    #[test]
    fn loss_report_burst_reaches_the_parity_policy() {
        // 3 % loss alone plans 2 parity shards per group of 8...
        let mut plain = adaptive_link();
        plain.on_loss_report(97, 3, 0);
        assert_eq!(level(&plain), 2);
        // ...the same loss in 3-packet bursts plans 3, so a whole burst is rebuilt.
        let mut bursty = adaptive_link();
        bursty.on_loss_report(97, 3, 3);
        assert_eq!(level(&bursty), 3);
    }

    /// A connection built without the `fec` feature takes the ARQ datagram out of each
    /// `FecData` packet as [`unwrap_data`] does: byte for byte the datagram the sender wrapped,
    /// from its packet number on, for both codes, and a malformed body is refused.
    #[test]
    fn data_unwrapped_without_the_codecs_is_the_datagram_sent() {
        for scheme in [FecScheme::Block, FecScheme::Sliding] {
            let mut cfg = Config::game();
            cfg.fec.policy = FecPolicy::Fixed { parity: 2 };
            cfg.fec.scheme = scheme;
            let mut tx = FecLink::new(&cfg, 0);
            let now = ricochet_testkit::SimClock::new().now();
            let cid = ConnectionId(0x1234_5678);
            for i in 0..20u8 {
                let mut buf = vec![0u8; 1200];
                let n = wire::encode_data_header(cid, u64::from(i) + 40, &mut buf).unwrap();
                let len = n + 100 + usize::from(i);
                buf[n..len].fill(i);
                let sent = buf[..len].to_vec();
                let (wrapped, _) = tx.seal(now, cid, &mut buf, len, None);
                let Ok(Packet::FecData { body, .. }) = wire::decode_packet(&buf[..wrapped]) else {
                    panic!("{scheme:?}: not an FEC data packet");
                };
                // What follows the 10 bytes every connection packet shares.
                assert_eq!(
                    unwrap_data(&cfg, body),
                    Ok(&sent[FEC_HEADER_LEN..]),
                    "{scheme:?} {i}"
                );
                assert_eq!(unwrap_data(&cfg, &body[..2]), Err(FecError::Truncated));
            }
        }
    }

    #[test]
    fn loss_report_carries_the_receivers_longest_burst() {
        let cfg = {
            let mut c = Config::game();
            c.fec.policy = FecPolicy::Fixed { parity: 1 };
            c
        };
        let mut tx = FecLink::new(&cfg, 0);
        let mut rx = FecLink::new(&cfg, 0);
        let now = ricochet_testkit::SimClock::new().now();
        let cid = ConnectionId(7);
        let mut bodies = Vec::new();
        for i in 0..48u8 {
            let mut buf = vec![0u8; 1200];
            let n = wire::encode_data_header(cid, u64::from(i), &mut buf).unwrap();
            buf[n] = i;
            let (len, _) = tx.seal(now, cid, &mut buf, n + 1, None);
            buf.truncate(len);
            bodies.push(buf);
        }
        // Shards 2, 3 and 4 are lost in a row, 9 alone (the receiver counts a shard lost once
        // it falls far enough behind the newest; 48 shards take all four past that point).
        for (i, b) in bodies.iter().enumerate() {
            if [2, 3, 4, 9].contains(&i) {
                continue;
            }
            let Ok(Packet::FecData { body, .. }) = wire::decode_packet(b) else {
                panic!("not an FEC data packet");
            };
            rx.receive(&cfg, now, body, false).unwrap();
        }
        // Only decided shards count: the 16 that 32 later ones passed, 4 of them lost.
        let (received, lost, burst) = rx.take_loss_report().unwrap();
        assert_eq!((received, lost, burst), (12, 4, 3));
    }
}
