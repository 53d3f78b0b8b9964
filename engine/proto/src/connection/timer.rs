//! The timer room: every deadline the connection keeps, as one [`Timer`] enum and one
//! [`TimerTable`] of their deadlines. `poll_timeout` is the table's minimum and
//! `handle_timeout` dispatches by timer. The policies behind the deadlines live in their rooms
//! (the probe and retransmission timeout in `recovery`, the delayed ACK in `ack`, the drain
//! period in `close`); this room says which timers exist, when each applies, and in which
//! order they fire. (The endpoint's `TimerQueue` orders connections by their `poll_timeout`;
//! this is the per-connection side.)
//!
//! Deadlines are derived from the connection's state when asked, not stored: nothing can
//! forget to re-arm a timer.
//!
//! This room's state (`Activity`) is defined in `state.rs`, beside the `Connection` that holds it.

use std::time::Instant;

use super::state::{Connection, ConnectionState, Side};
use crate::CloseReason;

/// One of the connection's timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    /// Client: send the hello or cookie echo again.
    HandshakeResend,
    /// The handshake (with this server) gives up.
    HandshakeTimeout,
    /// Closed or draining: the next close frame.
    CloseResend,
    /// Nothing received for `idle_timeout`.
    Idle,
    /// The drain period after our close frames ends.
    Drain,
    /// Nothing we sent acknowledged for `idle_timeout` (while the peer keeps sending).
    AckWait,
    /// Loss detection's time threshold passes for the oldest packet in flight.
    Loss,
    /// Tail-loss probe, then retransmission timeout (RTO), backed off.
    Probe,
    /// The delayed ACK is due (or an immediate one).
    Ack,
    /// Nothing sent for `keepalive_interval`: send a ping.
    Keepalive,
    /// A local close stops waiting for queued reliable data.
    Linger,
    /// Idle after traffic: give buffer capacity back.
    Trim,
    /// An unreliable message's fragments expire in reassembly.
    Reassembly,
    /// The FEC link's own deadlines (a group closes, tail repairs).
    Fec,
    /// FEC parity is ready and the window lets it out.
    Parity,
    /// An accept (server) or a probe is to be sent at once.
    Immediate,
    /// Data can go out (at the pacer's time).
    Send,
    /// Path MTU discovery: a probe to send, a probe's loss, the raise timer.
    PathMtu,
}

impl Timer {
    /// Every timer.
    pub(super) const ALL: [Timer; 18] = [
        Timer::HandshakeResend,
        Timer::HandshakeTimeout,
        Timer::CloseResend,
        Timer::Idle,
        Timer::Drain,
        Timer::AckWait,
        Timer::Loss,
        Timer::Probe,
        Timer::Ack,
        Timer::Keepalive,
        Timer::Linger,
        Timer::Trim,
        Timer::Reassembly,
        Timer::Fec,
        Timer::Parity,
        Timer::Immediate,
        Timer::Send,
        Timer::PathMtu,
    ];

    /// Timers that apply in `state`: the others are off in it, whatever their deadline.
    fn applies(self, state: ConnectionState) -> bool {
        use ConnectionState::*;
        match self {
            Timer::HandshakeResend | Timer::HandshakeTimeout => state == Handshaking,
            Timer::CloseResend => matches!(state, Closed | Draining),
            Timer::Idle => matches!(state, Established | Closing | Draining),
            Timer::Drain => state == Draining,
            _ => matches!(state, Established | Closing),
        }
    }
}

/// The deadline of each [`Timer`] (`None`: not armed).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct TimerTable([Option<Instant>; Timer::ALL.len()]);

impl TimerTable {
    /// Arms (or, with `None`, disarms) `timer`.
    pub(super) fn set(&mut self, timer: Timer, at: Option<Instant>) {
        self.0[timer as usize] = at;
    }

    /// The earliest deadline.
    pub(super) fn next(&self) -> Option<Instant> {
        self.0.iter().flatten().min().copied()
    }
}

impl Connection {
    /// The table of this connection's timers as of its state now.
    pub(super) fn timers(&self) -> TimerTable {
        let mut table = TimerTable::default();
        for t in Timer::ALL {
            if t.applies(self.state) {
                table.set(t, self.deadline(t));
            }
        }
        table
    }

    /// When `timer` fires (`None`: not armed), in any state (see [`Timer::applies`]).
    // Inlined into `poll_timeout`'s unrolled pass, where `timer` is a constant and the match
    // folds to the one arm: no call and no dispatch per timer.
    #[inline(always)]
    pub(super) fn deadline(&self, timer: Timer) -> Option<Instant> {
        let a = &self.activity;
        match timer {
            // A server connection waiting for its application has no retransmissions.
            Timer::HandshakeResend => (self.side == Side::Client).then_some(self.hs.resend_at),
            Timer::HandshakeTimeout => Some(self.hs.deadline),
            Timer::CloseResend => match self.close.sends_left {
                0 => None,
                _ if self.state == ConnectionState::Closed => Some(a.last_sent),
                _ => self.close.next_send,
            },
            Timer::Idle => Some(a.last_recv + self.cfg.idle_timeout),
            Timer::Drain => self.close.drain_deadline,
            Timer::AckWait => self
                .recovery
                .ack_wait_since
                .map(|t| t + self.cfg.idle_timeout),
            Timer::Loss => self.recovery.loss_time,
            Timer::Probe => self.pto_deadline(),
            Timer::Ack => self.ack.ack_deadline(&self.cfg, self.activity.last_recv),
            Timer::Keepalive => self.cfg.keepalive_interval.map(|k| a.last_sent + k),
            Timer::Linger => self.close.linger_deadline,
            Timer::Trim => self.trim_deadline(),
            Timer::Reassembly => self.receiver.next_expiry(self.cfg.unreliable_timeout),
            Timer::Fec => self.fec.poll_timeout(),
            Timer::Parity => self
                .fec
                .next_parity()
                .is_some_and(|n| self.cc.can_send(n))
                .then(|| self.send.pacing_until.unwrap_or(a.last_sent)),
            Timer::Immediate => {
                (self.accept.pending || self.recovery.probe_pending).then_some(a.last_sent)
            }
            Timer::Send => self
                .has_sendable_data()
                .then(|| self.send.pacing_until.unwrap_or(a.last_sent)),
            Timer::PathMtu => self.path_mtu_deadline(),
        }
    }

    fn due(&self, timer: Timer, now: Instant) -> bool {
        self.deadline(timer).is_some_and(|t| now >= t)
    }

    /// The earliest time `handle_timeout` (or `poll_transmit`) has work to do: the minimum of
    /// every timer's deadline, without building a table of them (the endpoint asks once per
    /// connection per visit, a few times per packet on a busy server).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let state = self.state;
        let mut next: Option<Instant> = None;
        // Every timer of `Timer::ALL`, in its order, written out: each `deadline` inlines with
        // its timer known, where a loop over the array called it for each one.
        macro_rules! each {
            ($($t:ident),* $(,)?) => {
                const LISTED: usize = [$(Timer::$t),*].len();
                const _: () = assert!(LISTED == Timer::ALL.len());
                $(
                    if Timer::$t.applies(state) {
                        if let Some(at) = self.deadline(Timer::$t) {
                            next = Some(next.map_or(at, |n| n.min(at)));
                        }
                    }
                )*
            };
        }
        each!(
            HandshakeResend,
            HandshakeTimeout,
            CloseResend,
            Idle,
            Drain,
            AckWait,
            Loss,
            Probe,
            Ack,
            Keepalive,
            Linger,
            Trim,
            Reassembly,
            Fec,
            Parity,
            Immediate,
            Send,
            PathMtu,
        );
        debug_assert_eq!(next, self.timers().next());
        next
    }

    /// Run expired timers: idle timeout, handshake retries, loss detection, probe timeout / RTO.
    ///
    /// Timers fire in a fixed order, each one's deadline read when its turn comes (an earlier
    /// one may have moved it); an idle or handshake timeout ends the turn. Linger, FEC and
    /// reassembly run at every call: each checks its own deadlines.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.state {
            ConnectionState::Closed => return,
            ConnectionState::Handshaking => {
                if self.due(Timer::HandshakeTimeout, now) {
                    self.fire(Timer::HandshakeTimeout, now);
                }
                return;
            }
            _ => {}
        }
        if self.due(Timer::Idle, now) {
            self.fire(Timer::Idle, now);
            return;
        }
        if self.state == ConnectionState::Draining {
            if self.due(Timer::Drain, now) {
                self.fire(Timer::Drain, now);
            }
            return;
        }
        if self.due(Timer::AckWait, now) {
            self.fire(Timer::AckWait, now);
            return;
        }
        for t in [Timer::Linger, Timer::Fec, Timer::Reassembly] {
            self.fire(t, now);
        }
        for t in [Timer::Trim, Timer::Loss, Timer::Probe, Timer::PathMtu] {
            if self.due(t, now) {
                self.fire(t, now);
            }
        }
    }

    /// What `timer` does when it fires. Timers that only say "send now" have their work in
    /// `poll_transmit`.
    fn fire(&mut self, timer: Timer, now: Instant) {
        match timer {
            Timer::HandshakeTimeout => {
                if self.side == Side::Server {
                    // The application never answered: drop the attempt.
                    self.discard();
                } else if !self.try_next_server(now) {
                    self.finish(CloseReason::HandshakeTimeout, false);
                }
            }
            Timer::Idle => self.time_out_idle(),
            Timer::Drain => {
                let (r, _) = self
                    .close
                    .reason
                    .unwrap_or((CloseReason::Application, false));
                self.close.sends_left = 0;
                self.finish(r, false);
            }
            // Packets arrive, but nothing this side sent has been acknowledged for the idle
            // timeout: the peer's acknowledgements are lost, or withheld so that this side's
            // queues grow. Either way the session is as dead as an idle one.
            Timer::AckWait => self.time_out_idle(),
            Timer::Linger => self.maybe_start_draining(now),
            Timer::Fec => self.fec.handle_timeout(now),
            Timer::Reassembly => self.receiver.expire(now, self.cfg.unreliable_timeout),
            Timer::Trim => self.trim(now),
            Timer::Loss => {
                self.detect_lost(now);
                self.pop_sent(now);
            }
            Timer::Probe => self.on_probe_timeout(now),
            Timer::PathMtu => {
                if let Some(p) = self.path.mtu.as_deref_mut() {
                    p.handle_timeout(now);
                }
            }
            Timer::HandshakeResend
            | Timer::CloseResend
            | Timer::Ack
            | Timer::Keepalive
            | Timer::Parity
            | Timer::Immediate
            | Timer::Send => {}
        }
    }
}
