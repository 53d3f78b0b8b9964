//! One RUDP connection: client handshake, ARQ, congestion control, channels. Sans-IO.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

mod ack;
pub(crate) mod cc;
mod close;
pub(crate) mod fec_link;
mod handshake;
mod recovery;
pub(crate) mod recv;
pub(crate) mod rtt;
mod send;
mod timer;

use self::ack::{Acks, LOSS_REPORT_MAX, MAX_TRACKED_RANGES};
use self::cc::Congestion;
use self::close::{Closing, CLOSE_SENDS};
use self::fec_link::FecLink;
pub(crate) use self::handshake::ServerAdmit;
use self::handshake::{Accept, Handshake, Secure};
use self::recovery::{push_seg, PacketState, Recovery, Segs, SentPacket, UNREAD_RTT};
use self::recv::{Budget, Need, Receiver, SharedBudgets};
use self::rtt::RttEstimator;
use self::send::{OutFrag, Segment, Sending};
use self::timer::Activity;
use crate::admission::{tags_equal, HandshakeKeys, Peer};
use crate::protect::{NumberSpace, Protection};
use crate::stats::Counters;
use crate::token::ConnectToken;
use crate::wire::{
    self, Frame, Packet, TokenSection, Writer, COOKIE_LEN, HANDSHAKE_TAG_LEN, MAX_ACK_RANGES,
};
use crate::{
    CloseReason, Config, ConnectionId, ConnectionStats, DropCause, Event, SendError, SessionKeys,
    Transmit,
};

/// Largest packet number accepted from a peer: far beyond any real connection's lifetime, so
/// arithmetic on received packet numbers cannot overflow.
const MAX_PACKET_NUMBER: u64 = (1 << 62) - 1;

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionState {
    /// Client waiting for the server (hello / cookie echo sent).
    Handshaking,
    /// Data flows.
    Established,
    /// Local close requested: queued reliable data is still being delivered.
    Closing,
    /// Close frames sent, waiting for the peer's close or the drain timer.
    Draining,
    /// Finished; no more events.
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Client,
    Server,
}

/// Who the connection talks to: both connection ids and the peer's address.
#[derive(Debug)]
struct Path {
    local_cid: ConnectionId,
    remote_cid: ConnectionId,
    /// The peer's current address (follows the peer when its address changes).
    remote: SocketAddr,
}

/// A sans-IO RUDP connection. Usually owned by an [`crate::Endpoint`]; can be driven alone.
///
/// Its state lives in typed parts, one per room of this folder (see the crate README).
#[derive(Debug)]
pub struct Connection {
    cfg: Arc<Config>,
    side: Side,
    state: ConnectionState,
    /// Data moved since the last [`Connection::trim`]: buffers may hold capacity to give back.
    trim_pending: bool,
    /// Server: the accept's flags.
    accept: Accept,
    path: Path,
    hs: Handshake,
    send: Sending,
    recovery: Recovery,
    ack: Acks,
    close: Closing,
    activity: Activity,
    cc: Congestion,
    rtt: RttEstimator,
    receiver: Receiver,
    fec: FecLink,
    /// Packet keys and replay windows; `None` in the insecure mode, and for a client with a
    /// token until its sealed accept opened (the keys are bound to what it carries).
    protection: Option<Box<Protection>>,
    /// Where a received packet is opened (it arrives borrowed, and opens in place).
    open_buf: Vec<u8>,
    events: VecDeque<Event>,
    counters: Counters,
}

impl Connection {
    /// `sealed`: the session's packets carry a tag (with `keys`, or with the keys a token
    /// client learns from its accept).
    fn new(
        cfg: Arc<Config>,
        side: Side,
        local_cid: ConnectionId,
        remote: SocketAddr,
        now: Instant,
        sealed: bool,
        keys: Option<SessionKeys>,
    ) -> Self {
        Self {
            side,
            state: ConnectionState::Handshaking,
            path: Path {
                local_cid,
                remote_cid: ConnectionId(0),
                remote,
            },
            hs: Handshake::new(&cfg, now),
            send: Sending::new(&cfg),
            recovery: Recovery::new(),
            ack: Acks::new(&cfg, now),
            close: Closing::default(),
            activity: Activity {
                last_sent: now,
                last_recv: now,
                last_data: now,
            },
            // The handshake grows the event and packet queues too.
            trim_pending: true,
            accept: Accept::default(),
            cc: Congestion::new(&cfg),
            rtt: RttEstimator::new(cfg.initial_rtt),
            receiver: Receiver::new(&cfg, Budget::unlimited()),
            fec: FecLink::new(&cfg, if sealed { wire::TAG_LEN } else { 0 }),
            protection: keys.map(|k| Box::new(Protection::new(&k, side == Side::Client))),
            open_buf: Vec::new(),
            events: VecDeque::new(),
            counters: Counters::default(),
            cfg,
        }
    }

    /// A client connection that starts the handshake with `server` on the first `poll_transmit`.
    ///
    /// `keys` protect every packet after the handshake, as they are: both peers must hold the
    /// same, and they must be this session's alone (two sessions under the same keys would
    /// seal under the same key and nonce; a connection made with a connect token,
    /// [`Self::client_with_token`], binds the token's keys to its session itself). `None` is
    /// the insecure mode: packets are neither encrypted nor authenticated, and both peers must
    /// agree on it.
    pub fn client(
        cfg: Arc<Config>,
        local_cid: ConnectionId,
        server: SocketAddr,
        nonce: u64,
        now: Instant,
        keys: Option<SessionKeys>,
    ) -> Self {
        let sealed = keys.is_some();
        let mut c = Self::new(cfg, Side::Client, local_cid, server, now, sealed, keys);
        c.hs.nonce = nonce;
        c
    }

    /// A client connection with a connect token: it starts the handshake with the token's
    /// first server address on the first `poll_transmit`, and tries the next ones in turn when
    /// a server times out or has no room.
    pub fn client_with_token(
        cfg: Arc<Config>,
        local_cid: ConnectionId,
        token: &ConnectToken,
        nonce: u64,
        now: Instant,
    ) -> Self {
        // A token always lists a server (`from_bytes` and `generate` check it); one whose list
        // was emptied since is sent to an unroutable address and times out.
        let first = token
            .server_addresses
            .first()
            .copied()
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        // No packet keys yet: they are bound to the session the server's sealed accept names.
        let mut c = Self::new(cfg, Side::Client, local_cid, first, now, true, None);
        c.hs.nonce = nonce;
        c.hs.secure = Some(Box::new(Secure {
            keys: token.keys.clone(),
            hk: HandshakeKeys::new(&token.keys),
            reset_token: None,
            token: Some(Box::new((token.clone(), 1))),
        }));
        c
    }

    /// A server connection for a client that proved its address (valid cookie echo). It sends
    /// a plain accept on the first `poll_transmit` and reports [`Event::Connected`] (an
    /// endpoint admitting by token builds its connections itself, with the sealed accept).
    ///
    /// `keys` as for [`Connection::client`]: the same session keys on both sides, or `None`
    /// on both.
    pub fn server(
        cfg: Arc<Config>,
        local_cid: ConnectionId,
        client_cid: ConnectionId,
        client: SocketAddr,
        now: Instant,
        keys: Option<SessionKeys>,
    ) -> Self {
        let sealed = keys.is_some();
        let mut c = Self::new(cfg, Side::Server, local_cid, client, now, sealed, keys);
        c.path.remote_cid = client_cid;
        c.state = ConnectionState::Established;
        c.accept.pending = true;
        c.events.push_back(Event::Connected);
        c
    }

    /// A server connection the endpoint admitted: established at once (the accept goes out on
    /// the first `poll_transmit`, [`Event::Connected`] follows), or with the accept hook
    /// waiting for the application ([`Event::Incoming`] first).
    pub(crate) fn server_admitted(
        cfg: Arc<Config>,
        local_cid: ConnectionId,
        client_cid: ConnectionId,
        client: SocketAddr,
        now: Instant,
        admit: ServerAdmit,
    ) -> Self {
        let sealed = admit.keys.is_some();
        let mut c = Self::new(
            cfg,
            Side::Server,
            local_cid,
            client,
            now,
            sealed,
            admit.keys,
        );
        c.path.remote_cid = client_cid;
        c.hs.nonce = admit.nonce;
        c.hs.accept_packet = Some(Box::new((admit.accept, admit.accept_len)));
        c.hs.secure = admit.secure.map(|(keys, hk)| {
            Box::new(Secure {
                keys,
                hk,
                reset_token: None,
                token: None,
            })
        });
        if admit.hook {
            c.accept.awaiting_app = true;
            c.events.push_back(Event::Incoming(admit.peer.clone()));
        } else {
            c.state = ConnectionState::Established;
            c.accept.pending = true;
            c.events.push_back(Event::Connected);
        }
        c.hs.peer = Some(admit.peer);
        c
    }

    /// The application accepted the client it was asked about.
    pub(crate) fn accept_by_application(&mut self) {
        if !self.accept.awaiting_app || self.state != ConnectionState::Handshaking {
            return;
        }
        self.accept.awaiting_app = false;
        self.state = ConnectionState::Established;
        self.accept.pending = true;
        self.events.push_back(Event::Connected);
    }

    /// True while a server connection waits for the application's accept or refusal.
    pub(crate) fn awaiting_application(&self) -> bool {
        self.accept.awaiting_app && self.state == ConnectionState::Handshaking
    }

    /// End at once, silently (no close frames, no event): the endpoint refused the client.
    pub(crate) fn discard(&mut self) {
        self.state = ConnectionState::Closed;
        self.close.sends_left = 0;
        self.events.clear();
    }

    /// The handshake's keys, in token mode.
    pub(crate) fn handshake_keys(&self) -> Option<&HandshakeKeys> {
        self.hs.secure.as_ref().map(|s| &s.hk)
    }

    /// The stateless reset token the server gave this client connection (token mode, once
    /// established).
    pub(crate) fn reset_token(&self) -> Option<&[u8; HANDSHAKE_TAG_LEN]> {
        self.hs.secure.as_ref()?.reset_token.as_ref()
    }

    /// The connect token's session keys (`None` without a token). The session's packet keys
    /// are derived from them and bound to the session: its connection ids and the server's
    /// random value.
    pub fn session_keys(&self) -> Option<&SessionKeys> {
        self.hs.secure.as_ref().map(|s| &s.keys)
    }

    /// Server side: who the client is (address at the handshake, and in token mode its client
    /// id and user data).
    pub fn peer(&self) -> Option<&Peer> {
        self.hs.peer.as_ref()
    }

    /// Draw on budgets of these limits (reassembly, FEC retention) until the endpoint lends
    /// its shared ones (call before any datagram arrives).
    pub(crate) fn set_budget_limits(&mut self, reassembly: usize, fec: usize) {
        self.receiver.budget = Budget::new(reassembly);
        self.fec.set_budget_limit(fec);
    }

    /// Swap the endpoint's shared budgets with the ones this connection draws on. The endpoint
    /// calls it before and after each call into the connection, so for the length of the call
    /// the connection draws on the shared budgets: their limits hold over all the endpoint's
    /// connections, with no shared counter.
    pub(crate) fn swap_budgets(&mut self, shared: &mut SharedBudgets) {
        std::mem::swap(&mut self.receiver.budget, &mut shared.reassembly);
        std::mem::swap(self.fec.budget_mut(), &mut shared.fec);
    }

    /// Bytes this connection holds against the shared budgets: (reassembly, FEC retention).
    /// The endpoint takes them back when the connection ends.
    pub(crate) fn held_bytes(&self) -> (usize, usize) {
        (self.receiver.bytes, self.fec.retained_bytes())
    }

    /// This side's connection id (the peer writes it in every packet).
    pub fn local_cid(&self) -> ConnectionId {
        self.path.local_cid
    }

    /// The peer's connection id (0 until the handshake completes on a client).
    pub fn remote_cid(&self) -> ConnectionId {
        self.path.remote_cid
    }

    /// The peer's current address (follows the peer when its address changes).
    pub fn remote_addr(&self) -> SocketAddr {
        self.path.remote
    }

    /// True when this session's packets are protected (it has session keys); false in the
    /// insecure mode.
    pub fn is_secure(&self) -> bool {
        self.protection.is_some() || self.hs.secure.is_some()
    }

    /// Hints the CPU to load what handling this connection's next datagram reads first
    /// behind its pointers: the fronts of its sent-packet and segment queues, its channels,
    /// its acknowledged ranges and its packet keys (see `prefetch`).
    pub(crate) fn prefetch_parts(&self) {
        use crate::prefetch::{front, prefetch};
        front(self.recovery.sent.as_slices().0, 128);
        front(self.send.segments.as_slices().0, 128);
        front(&self.send.channels, 256);
        front(self.ack.ranges.as_slices().0, 64);
        self.receiver.prefetch();
        self.fec.prefetch();
        if let Some(p) = self.protection.as_deref() {
            prefetch(p);
        }
    }

    /// Life-cycle state.
    pub fn state(&self) -> ConnectionState {
        self.state
    }

    /// True once closed and nothing is left to send: the owner may drop it.
    pub fn is_drained(&self) -> bool {
        self.state == ConnectionState::Closed && self.close.sends_left == 0
    }

    /// Statistics, as of now: counters, RTT summary, congestion state, FEC counters.
    pub fn stats(&self) -> ConnectionStats {
        let c = &self.counters;
        ConnectionStats {
            rtt: c.rtt,
            packets_sent: c.packets_sent,
            bytes_sent: c.bytes_sent,
            packets_received: c.packets_received,
            bytes_received: c.bytes_received,
            packets_lost: c.packets_lost,
            packets_spurious_lost: c.packets_spurious_lost,
            segments_retransmitted: c.segments_retransmitted,
            segments_sent: c.segments_sent,
            tail_loss_probes: c.tail_loss_probes,
            rto_count: c.rto_count,
            messages_delivered: c.messages_delivered,
            unreliable_dropped: self.receiver.unreliable_dropped,
            unreliable_unsent: c.unreliable_unsent,
            drops: c.drops.get(),
            cwnd: self.cc.window,
            bytes_in_flight: self.cc.in_flight,
            rto: self.current_rto(),
            srtt: self.rtt.smoothed,
            min_rtt: self.rtt.min,
            reassembly_bytes: self.receiver.bytes,
            reassembly_peak: self.receiver.peak,
            peer_loss_report: c.peer_loss_report,
            fec: self.fec.stats(),
        }
    }

    /// Hands the RTT samples taken since the last call to `f` (µs, oldest first). A connection
    /// keeps the last few; its endpoint collects them after every input.
    pub(crate) fn take_rtt_samples(&mut self, mut f: impl FnMut(u32)) {
        let (buf, n) = (
            &mut self.recovery.unread_rtt,
            &mut self.recovery.unread_rtt_len,
        );
        for &us in &buf[..usize::from(*n)] {
            f(us);
        }
        *n = 0;
    }

    fn note_rtt_sample(&mut self, sample: Duration) {
        self.counters.rtt.record(sample);
        let us = u32::try_from(sample.as_micros()).unwrap_or(u32::MAX);
        let (buf, n) = (
            &mut self.recovery.unread_rtt,
            &mut self.recovery.unread_rtt_len,
        );
        if usize::from(*n) < UNREAD_RTT {
            buf[usize::from(*n)] = us;
            *n += 1;
        } else {
            buf[UNREAD_RTT - 1] = us;
        }
    }

    /// Nothing in flight, queued, held for reassembly or waiting for the application.
    fn quiescent(&self) -> bool {
        self.recovery.in_flight_packets == 0
            && self.send.unacked_segments == 0
            && self.send.queued_bytes == 0
            && self.send.retx.is_empty()
            && self.receiver.bytes == 0
            && self.events.is_empty()
    }

    /// When [`Self::trim`] is due: [`Config::idle_trim`] after the last data, if data moved since the
    /// last trim and nothing is left in flight.
    fn trim_deadline(&self) -> Option<Instant> {
        let after = self.cfg.idle_trim?;
        (self.trim_pending && self.quiescent()).then(|| self.activity.last_data + after)
    }

    /// Gives back the capacity that traffic grew in the send, receive and FEC buffers, and the
    /// expanded packet keys: an idle connection holds its state, not its peak's buffers. They
    /// grow again with the next burst.
    fn trim(&mut self, now: Instant) {
        self.trim_pending = false;
        self.recovery.sent.shrink_to_fit();
        self.send.segments.shrink_to_fit();
        self.send.retx = VecDeque::new();
        for c in &mut self.send.channels {
            c.queue.shrink_to_fit();
        }
        self.ack.ranges.shrink_to_fit();
        self.events.shrink_to_fit();
        self.open_buf = Vec::new();
        if self.side == Side::Server && !self.accept.pending && self.ack.largest.is_some() {
            // The client answered the accept with protected data: it will not echo again.
            self.hs.accept_packet = None;
        }
        self.fec.trim(now);
        if let Some(p) = self.protection.as_deref_mut() {
            p.release_keys();
        }
    }

    fn note_data(&mut self, now: Instant) {
        self.activity.last_data = now;
        self.trim_pending = true;
    }

    /// The client nonce of this connection's handshake.
    pub fn nonce(&self) -> u64 {
        self.hs.nonce
    }

    /// Bytes queued by `send` and not yet sent for the first time.
    pub fn queued_bytes(&self) -> usize {
        self.send.queued_bytes
    }

    /// Reliable fragments sent and not yet acknowledged.
    pub fn unacked_segments(&self) -> usize {
        self.send.unacked_segments
    }

    /// Next event for the application.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Queue a message on `channel`. Fragments are cut now (zero-copy slices of `data`; a
    /// message that fits one fragment is queued as it is).
    pub fn send(&mut self, channel: u8, data: Bytes) -> Result<(), SendError> {
        match self.state {
            ConnectionState::Handshaking | ConnectionState::Established => {}
            _ => return Err(SendError::Closed),
        }
        let Some(ch) = self.send.channels.get_mut(usize::from(channel)) else {
            return Err(SendError::UnknownChannel(channel));
        };
        if data.len() > self.cfg.max_message_size {
            return Err(SendError::TooLarge(data.len()));
        }
        if self.send.queued_bytes + data.len() > self.cfg.send_queue_limit {
            return Err(SendError::QueueFull);
        }
        let frag = self.cfg.fragment_payload();
        let count = data.len().div_ceil(frag).max(1);
        let id = ch.next_id;
        ch.next_id += 1;
        self.send.queued_bytes += data.len();
        ch.queued = ch
            .queued
            .saturating_add(u32::try_from(data.len()).unwrap_or(u32::MAX));
        if count == 1 {
            // The whole message is the fragment: no slice (a slice of a fresh `Bytes` makes it
            // shared, a heap allocation per message).
            ch.queue.push_back(OutFrag {
                message_id: id,
                index: 0,
                count: 1,
                data,
            });
        } else {
            for i in 0..count {
                let start = i * frag;
                let end = (start + frag).min(data.len());
                ch.queue.push_back(OutFrag {
                    message_id: id,
                    index: i as u32,
                    count: count as u32,
                    data: data.slice(start..end),
                });
            }
        }
        if !ch.kind.is_reliable() && ch.queued as usize > self.cfg.unreliable_queue_limit {
            self.shed_unreliable(usize::from(channel), id);
        }
        Ok(())
    }

    /// Drops whole messages from the front of unreliable channel `ci` until its queue is back
    /// under [`Config::unreliable_queue_limit`], never message `keep` (the one just queued).
    /// They are the stalest: an unreliable message that waits behind a closed congestion
    /// window is worth less the longer it waits, and without a bound a peer that stops
    /// acknowledging would make this queue grow to the session's whole send-queue limit.
    fn shed_unreliable(&mut self, ci: usize, keep: u64) {
        let ch = &mut self.send.channels[ci];
        while ch.queued as usize > self.cfg.unreliable_queue_limit {
            let Some(id) = ch.queue.front().map(|f| f.message_id) else {
                break;
            };
            if id == keep {
                break;
            }
            while let Some(f) = ch.queue.front() {
                if f.message_id != id {
                    break;
                }
                let len = f.data.len();
                ch.queue.pop_front();
                ch.queued = ch
                    .queued
                    .saturating_sub(u32::try_from(len).unwrap_or(u32::MAX));
                self.send.queued_bytes -= len;
            }
            self.counters.unreliable_unsent += 1;
        }
    }

    /// Close gracefully: queued reliable data is delivered first (up to [`Config::close_linger`]),
    /// then the peer is told `reason`. [`Event::Closed`] follows.
    pub fn close(&mut self, now: Instant, reason: CloseReason) {
        match self.state {
            ConnectionState::Handshaking => {
                self.finish(reason, false);
            }
            ConnectionState::Established => {
                self.state = ConnectionState::Closing;
                self.close.reason = Some((reason, false));
                self.close.linger_deadline = Some(now + self.cfg.close_linger);
                self.maybe_start_draining(now);
            }
            _ => {}
        }
    }

    /// Ends the session for the idle timeout, telling the peer once.
    fn time_out_idle(&mut self) {
        self.finish(CloseReason::IdleTimeout, false);
        self.close.reason = Some((CloseReason::IdleTimeout, false));
        self.close.sends_left = 1;
    }

    fn maybe_start_draining(&mut self, now: Instant) {
        if self.state != ConnectionState::Closing {
            return;
        }
        let flushed = self.send.unacked_segments == 0
            && self
                .send
                .channels
                .iter()
                .all(|c| !c.kind.is_reliable() || c.queue.is_empty());
        if flushed || self.close.linger_deadline.is_some_and(|d| now >= d) {
            self.state = ConnectionState::Draining;
            self.close.sends_left = CLOSE_SENDS;
            self.close.next_send = Some(now);
            self.close.drain_deadline = Some(now + self.pto_base() * 3);
        }
    }

    fn finish(&mut self, reason: CloseReason, by_peer: bool) {
        if self.state == ConnectionState::Closed {
            return;
        }
        self.state = ConnectionState::Closed;
        self.events.push_back(Event::Closed {
            reason,
            by_peer,
            message: std::mem::take(&mut self.hs.refusal_message),
        });
        // Free send-side memory at once; a closed connection never sends data again.
        for c in &mut self.send.channels {
            c.queue.clear();
            c.queued = 0;
        }
        self.send.segments.clear();
        self.send.retx.clear();
        self.send.queued_bytes = 0;
    }

    fn pto_base(&self) -> Duration {
        self.rtt.rto(self.cfg.min_rto, self.cfg.max_ack_delay)
    }

    /// The retransmission timeout after `pto_count` expiries: the first one is the tail-loss
    /// probe's (see [`Self::probe_timeout`]), so the RTO proper starts at the base and doubles
    /// from the second.
    fn current_rto(&self) -> Duration {
        let doublings = self.recovery.pto_count.saturating_sub(1).min(16);
        (self.pto_base() * 2u32.saturating_pow(doublings)).min(self.cfg.max_rto)
    }

    /// How long after the last ack-eliciting packet the next probe timer fires. The first
    /// expiry is a tail-loss probe after two smoothed RTTs (or the smoothed RTT and four
    /// deviations, if longer) plus the peer's ACK delay (RFC 8985, [`RttEstimator::probe_delay`]),
    /// at least [`Config::min_probe_timeout`] and never later than the RTO: it repairs a lost
    /// last packet (or a lost retransmission that blocks an ordered channel) well before a
    /// conservative minimum RTO would, without firing at every scheduling hiccup of a short
    /// path.
    fn probe_timeout(&self) -> Duration {
        if self.recovery.pto_count == 0 {
            let tlp = self
                .rtt
                .probe_delay(self.cfg.max_ack_delay)
                .max(self.cfg.min_probe_timeout)
                .max(Duration::from_millis(1));
            // Only unreliable packets in flight: their ACK may be held (nothing would be
            // repaired by probing for it sooner).
            if let Some(held) = self.cfg.unreliable_ack_delay {
                if self.recovery.reliable_in_flight == 0 && !self.has_queued_reliable() {
                    return tlp + held;
                }
            }
            tlp.min(self.current_rto())
        } else {
            self.current_rto()
        }
    }

    /// Entry point for every datagram addressed to this connection.
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
    ) -> Result<(), DropCause> {
        let res = self.dispatch(now, from, datagram);
        if let Err(cause) = res {
            self.counters.drops.add(cause);
        }
        res
    }

    fn dispatch(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
    ) -> Result<(), DropCause> {
        if self.state == ConnectionState::Closed {
            return Err(DropCause::Closed);
        }
        if datagram.first().is_some_and(|&t| {
            t == wire::PacketType::Data as u8
                || t == wire::PacketType::FecData as u8
                || t == wire::PacketType::FecParity as u8
        }) {
            return self.receive_protected(now, from, datagram);
        }
        let packet = match wire::decode_packet(datagram) {
            Ok(p) => p,
            Err(wire::WireError::VersionMismatch(_)) => return Err(DropCause::VersionMismatch),
            Err(_) => return Err(DropCause::Malformed),
        };
        let server_reply = matches!(
            packet,
            Packet::ServerChallenge { .. } | Packet::SealedAccept { .. } | Packet::Refuse { .. }
        );
        if server_reply && self.left_server(from) {
            // A late reply from a server this handshake moved on from (a refusal answering a
            // retransmitted echo, say): acting on it would end the attempt with the next one.
            return Err(DropCause::UnexpectedHandshake);
        }
        match packet {
            // Connection packets went to `receive_protected` above.
            Packet::Data { .. } | Packet::FecData { .. } | Packet::FecParity { .. } => {
                Err(DropCause::Malformed)
            }
            Packet::ServerChallenge {
                client_cid,
                nonce,
                timestamp,
                cookie,
                tag,
            } => {
                if self.side != Side::Client
                    || self.state != ConnectionState::Handshaking
                    || client_cid != self.path.local_cid
                    || nonce != self.hs.nonce
                {
                    return Err(DropCause::UnexpectedHandshake);
                }
                if let Some(s) = &self.hs.secure {
                    let expect = s.hk.challenge_tag(client_cid, nonce, timestamp, &cookie);
                    if !tag.is_some_and(|t| tags_equal(&t, &expect)) {
                        return Err(DropCause::Unauthenticated);
                    }
                }
                if self.hs.cookie.is_none() {
                    self.hs.cookie = Some((timestamp, cookie));
                    self.hs.resend_at = now;
                    self.hs.interval = self.cfg.handshake_retry;
                }
                Ok(())
            }
            Packet::ServerAccept {
                client_cid,
                server_cid,
            } => {
                if self.side != Side::Client
                    || self.state != ConnectionState::Handshaking
                    || client_cid != self.path.local_cid
                    || self.hs.cookie.is_none()
                {
                    return Err(DropCause::UnexpectedHandshake);
                }
                if self.hs.secure.is_some() {
                    // A client with a token only believes a sealed accept.
                    return Err(DropCause::Unauthenticated);
                }
                self.established(now, from, server_cid);
                Ok(())
            }
            Packet::SealedAccept {
                client_cid,
                nonce,
                sealed,
            } => {
                if self.side != Side::Client
                    || self.state != ConnectionState::Handshaking
                    || client_cid != self.path.local_cid
                    || self.hs.cookie.is_none()
                {
                    return Err(DropCause::UnexpectedHandshake);
                }
                let Some(s) = self.hs.secure.as_mut() else {
                    return Err(DropCause::UnexpectedHandshake);
                };
                let Some((server_cid, reset)) = s.hk.open_accept(nonce, client_cid, sealed) else {
                    return Err(DropCause::Unauthenticated);
                };
                s.reset_token = Some(reset);
                // This session's packet keys: the token's, bound to both ids and the server
                // random (the accept's nonce, authenticated by its tag), as the server bound
                // them when it opened the session.
                let keys = s.keys.for_session(client_cid, server_cid, nonce);
                self.protection = Some(Box::new(Protection::new(&keys, true)));
                self.established(now, from, server_cid);
                Ok(())
            }
            Packet::Refuse {
                client_cid,
                reason,
                message,
                tag,
            } => {
                if self.side != Side::Client
                    || self.state != ConnectionState::Handshaking
                    || client_cid != self.path.local_cid
                {
                    return Err(DropCause::UnexpectedHandshake);
                }
                if let Some(s) = &self.hs.secure {
                    // Believe a refusal the server tagged, or an untagged one only for what a
                    // server says before it opened the token.
                    let ok = match tag {
                        Some(t) => tags_equal(
                            &t,
                            &s.hk.refuse_tag(client_cid, self.hs.nonce, reason, message),
                        ),
                        None => reason.refused_before_token(),
                    };
                    if !ok {
                        return Err(DropCause::Unauthenticated);
                    }
                }
                // A server shutting down (`Endpoint::stop_accepting`, a rolling restart) says
                // nothing of the others the token lists.
                let next_server = matches!(
                    reason,
                    CloseReason::ServerFull
                        | CloseReason::TooManyFromAddress
                        | CloseReason::TokenWrongServer
                        | CloseReason::Shutdown
                );
                if next_server && self.try_next_server(now) {
                    return Ok(());
                }
                self.hs.refusal_message = Bytes::copy_from_slice(message);
                self.finish(reason, true);
                Ok(())
            }
            Packet::StatelessReset { cid, token } => {
                if self.side != Side::Client
                    || self.state == ConnectionState::Handshaking
                    || cid != self.path.remote_cid
                {
                    return Err(DropCause::UnknownConnection);
                }
                if !self.reset_token().is_some_and(|t| tags_equal(t, &token)) {
                    return Err(DropCause::Unauthenticated);
                }
                // The server has no state for us: nothing to tell it, no close to send.
                self.finish(CloseReason::Reset, true);
                self.close.sends_left = 0;
                Ok(())
            }
            Packet::ClientCookieEcho { client_cid, .. } => {
                // The client did not get our accept: send it again (one reply per echo).
                if self.side != Side::Server || client_cid != self.path.remote_cid {
                    return Err(DropCause::UnexpectedHandshake);
                }
                if !self.accept.awaiting_app {
                    self.accept.pending = true;
                }
                Ok(())
            }
            Packet::ClientHello { .. } => Err(DropCause::UnexpectedHandshake),
        }
    }

    /// The client's handshake completed: the server's id is `server_cid`, at `from`.
    fn established(&mut self, now: Instant, from: SocketAddr, server_cid: ConnectionId) {
        self.path.remote_cid = server_cid;
        self.state = ConnectionState::Established;
        self.activity.last_recv = now;
        self.path.remote = from;
        self.events.push_back(Event::Connected);
    }

    /// Client with a token: start over with the token's next server address, if any.
    fn try_next_server(&mut self, now: Instant) -> bool {
        let Some((token, next)) = self.hs.secure.as_mut().and_then(|s| s.token.as_deref_mut())
        else {
            return false;
        };
        let Some(&addr) = token.server_addresses.get(*next) else {
            return false;
        };
        *next += 1;
        self.path.remote = addr;
        self.hs.cookie = None;
        // Nothing of the attempt before carries over into the next: no packet keys or replay
        // state (there are none before an accept; the next server's accept brings its own).
        self.protection = None;
        self.hs.resend_at = now;
        self.hs.interval = self.cfg.handshake_retry;
        self.hs.deadline = now + self.cfg.handshake_timeout;
        true
    }

    /// Client with a token: whether `from` is one of the token's server addresses this
    /// handshake has moved on from (and not the one it talks to now).
    fn left_server(&self, from: SocketAddr) -> bool {
        let Some((token, next)) = self.hs.secure.as_ref().and_then(|s| s.token.as_deref()) else {
            return false;
        };
        // `next` is the address after the current one.
        let left =
            &token.server_addresses[..next.saturating_sub(1).min(token.server_addresses.len())];
        from != self.path.remote && left.contains(&from)
    }

    /// Every connection packet (`Data`, `FecData`, `FecParity`) enters here. In a session with
    /// keys it is checked against the replay window and opened first: a replayed, too old,
    /// forged, damaged or truncated packet is dropped with its cause before anything else
    /// happens (no path update, no ACK processing, no packet-number or FEC state change), and
    /// only an authenticated packet's number enters the replay window.
    fn receive_protected(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
    ) -> Result<(), DropCause> {
        let h = match wire::clear_header(datagram) {
            Ok(h) => h,
            Err(wire::WireError::VersionMismatch(_)) => return Err(DropCause::VersionMismatch),
            Err(_) => return Err(DropCause::Malformed),
        };
        if h.dst_cid != self.path.local_cid {
            return Err(DropCause::UnknownConnection);
        }
        let Some(p) = self.protection.as_deref_mut() else {
            if self.hs.secure.is_some() {
                // A token client before its accept: no keys to open it with (the server
                // retransmits what it carried).
                return Err(DropCause::UnexpectedHandshake);
            }
            return self.receive_open(now, from, h.ty, datagram);
        };
        let mut buf = std::mem::take(&mut self.open_buf);
        let r = match p.open(
            now,
            NumberSpace::of(h.ty),
            h.number,
            datagram,
            h.len,
            &mut buf,
        ) {
            Ok(n) => self.receive_open(now, from, h.ty, &buf[..n]),
            Err(cause) => Err(cause),
        };
        // An oversize datagram (forged ones included) does not leave its buffer behind.
        if buf.capacity() <= self.cfg.max_datagram_size {
            self.open_buf = buf;
        }
        r
    }

    /// An opened (or, in the insecure mode, plain) connection packet goes to ARQ or FEC.
    fn receive_open(
        &mut self,
        now: Instant,
        from: SocketAddr,
        ty: wire::PacketType,
        packet: &[u8],
    ) -> Result<(), DropCause> {
        if ty == wire::PacketType::Data {
            self.receive_arq(now, from, packet)
        } else {
            self.receive_fec(now, from, packet)
        }
    }

    /// FEC seam (incoming): FEC packets land here (opened). The FEC receiver unwraps them and every ARQ
    /// datagram it delivers or rebuilds goes to [`Self::receive_arq`] as if received. A
    /// malformed FEC body is dropped and counted (`Malformed` here, by kind in
    /// [`ConnectionStats::fec`]); the connection carries on.
    fn receive_fec(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
    ) -> Result<(), DropCause> {
        let (dst_cid, body, parity) = match wire::decode_packet(datagram) {
            Ok(Packet::FecData { dst_cid, body }) => (dst_cid, body, false),
            Ok(Packet::FecParity { dst_cid, body, .. }) => (dst_cid, body, true),
            _ => return Err(DropCause::Malformed),
        };
        if dst_cid != self.path.local_cid {
            return Err(DropCause::UnknownConnection);
        }
        if self
            .fec
            .receive(&self.cfg, now, self.path.local_cid, body, parity)
            .is_err()
        {
            return Err(DropCause::Malformed);
        }
        let (out, lens) = self.fec.take_datagrams();
        let mut result = Ok(());
        let mut at = 0;
        for &n in &lens {
            let r = self.receive_arq(now, from, &out[at..at + n]);
            at += n;
            if let Err(c) = r {
                // The first failure is the caller's to count; later ones are counted here.
                if result.is_ok() {
                    result = Err(c);
                } else {
                    self.counters.drops.add(c);
                }
            }
        }
        self.fec.restore_datagrams(out, lens);
        result
    }

    /// FEC seam (incoming): every ARQ datagram (a `Data` packet) enters the protocol here.
    fn receive_arq(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
    ) -> Result<(), DropCause> {
        let Ok(Packet::Data {
            dst_cid,
            packet_number: pn,
            payload,
        }) = wire::decode_packet(datagram)
        else {
            return Err(DropCause::Malformed);
        };
        if dst_cid != self.path.local_cid {
            return Err(DropCause::UnknownConnection);
        }
        if self.state == ConnectionState::Handshaking {
            // Data before our accept arrived: the peer retransmits it later.
            return Err(DropCause::UnexpectedHandshake);
        }
        if pn > MAX_PACKET_NUMBER {
            // No sender gets here (2^62 packets); refusing it keeps `pn + 1` in range below.
            return Err(DropCause::ProtocolViolation);
        }
        if pn < self.ack.floor {
            return Err(DropCause::TooOld);
        }
        if self
            .ack
            .ranges
            .iter()
            .rev()
            .any(|&(lo, hi)| lo <= pn && pn <= hi)
        {
            return Err(DropCause::Duplicate);
        }
        // Pass 1: validate everything and check buffer space, before any state changes, so a
        // dropped packet is not acknowledged (the peer retransmits its data).
        let mut ack_eliciting = false;
        let mut reliable = false;
        let mut carries_data = false;
        let mut need = Need {
            segments: 0,
            bytes: 0,
        };
        for f in wire::frames(payload) {
            let f = f.map_err(|_| DropCause::Malformed)?;
            match f {
                Frame::Ack(a) => {
                    if a.largest >= self.recovery.next_pn {
                        return Err(DropCause::ProtocolViolation);
                    }
                }
                Frame::Fragment {
                    channel,
                    message_id,
                    index,
                    count,
                    data,
                } => {
                    ack_eliciting = true;
                    carries_data = true;
                    reliable |= self.channel_is_reliable(channel);
                    self.receiver.validate(channel, count, data.len())?;
                    let n = self
                        .receiver
                        .need(channel, message_id, index, count, data.len());
                    need.segments += n.segments;
                    need.bytes += n.bytes;
                }
                Frame::Datagram {
                    channel,
                    message_id,
                    data,
                } => {
                    ack_eliciting = true;
                    carries_data = true;
                    reliable |= self.channel_is_reliable(channel);
                    self.receiver.validate(channel, 1, data.len())?;
                    let n = self.receiver.need(channel, message_id, 0, 1, data.len());
                    need.segments += n.segments;
                    need.bytes += n.bytes;
                }
                Frame::Ping => {
                    ack_eliciting = true;
                    reliable = true;
                }
                Frame::Padding | Frame::Close(_) | Frame::LossReport { .. } => {}
            }
        }
        if (need.segments > 0 && self.receiver.segments + need.segments > self.cfg.recv_window)
            || (need.bytes > 0 && !self.receiver.fits(&need, 0))
        {
            return Err(DropCause::FlowControl);
        }
        // Accepted: record the packet number.
        self.record_received(now, pn, ack_eliciting, reliable);
        if self.ack.largest.is_none_or(|(l, _)| pn >= l) {
            self.ack.largest = Some((pn, now));
            self.path.remote = from; // follow a peer whose address changed
        }
        self.activity.last_recv = now;
        if carries_data {
            self.note_data(now);
        }
        self.counters.packets_received += 1;
        self.counters.bytes_received += datagram.len() as u64;
        self.ack.report.received += 1;
        if self.ack.report.base.is_none() {
            self.ack.report.base = Some(pn);
        }
        if self.side == Side::Server {
            self.accept.pending = false; // the client got our accept
        }
        // Pass 2: apply.
        let mut acked_something = false;
        let mut delivered = 0;
        for f in wire::frames(payload).flatten() {
            match f {
                Frame::Ack(a) => {
                    acked_something |= self.on_ack(now, &a);
                }
                Frame::Fragment {
                    channel,
                    message_id,
                    index,
                    count,
                    data,
                } => {
                    if self.state == ConnectionState::Established
                        || self.state == ConnectionState::Closing
                    {
                        if let Err(c) = self.receiver.on_fragment(
                            now,
                            channel,
                            message_id,
                            index,
                            count,
                            data,
                            &mut self.events,
                            &mut delivered,
                        ) {
                            self.counters.drops.add(c);
                        }
                    }
                }
                Frame::Datagram {
                    channel,
                    message_id,
                    data,
                } => {
                    if self.state == ConnectionState::Established
                        || self.state == ConnectionState::Closing
                    {
                        if let Err(c) = self.receiver.on_fragment(
                            now,
                            channel,
                            message_id,
                            0,
                            1,
                            data,
                            &mut self.events,
                            &mut delivered,
                        ) {
                            self.counters.drops.add(c);
                        }
                    }
                }
                Frame::Close(reason) => self.on_close_frame(reason),
                Frame::LossReport {
                    received,
                    lost,
                    max_burst,
                } => {
                    self.counters.peer_loss_report = (received, lost);
                    self.fec.on_loss_report(received, lost, max_burst);
                }
                Frame::Ping | Frame::Padding => {}
            }
        }
        self.counters.messages_delivered += delivered;
        if acked_something {
            self.maybe_start_draining(now);
        }
        Ok(())
    }

    fn on_close_frame(&mut self, reason: CloseReason) {
        match self.state {
            ConnectionState::Established | ConnectionState::Closing => {
                self.finish(reason, true);
                // Answer once so the closer learns we heard it.
                self.close.reason = Some((reason, true));
                self.close.sends_left = 1;
                self.close.next_send = None;
            }
            ConnectionState::Draining => {
                // The peer's answer to our close.
                let (r, _) = self.close.reason.unwrap_or((reason, false));
                self.close.sends_left = 0;
                self.finish(r, false);
            }
            _ => {}
        }
    }

    fn record_received(&mut self, now: Instant, pn: u64, ack_eliciting: bool, reliable: bool) {
        // A packet that comes after the ACK floor passed it (reordered, or rebuilt by FEC
        // once its group's parity came) is acknowledged all the same: the next ACK frames
        // list ranges from it up again, until the peer has seen one of them.
        self.ack.ack_floor = self.ack.ack_floor.min(pn);
        let largest = self.ack.ranges.back().map(|&(_, h)| h);
        // Insert pn into the ascending, disjoint range list (search from the top: most
        // packets arrive in order).
        let mut i = self.ack.ranges.len();
        while i > 0 && self.ack.ranges[i - 1].0 > pn {
            i -= 1;
        }
        // Now ranges[..i] start at or below pn.
        let merge_prev = i > 0 && self.ack.ranges[i - 1].1 + 1 == pn;
        let merge_next = i < self.ack.ranges.len() && self.ack.ranges[i].0 == pn + 1;
        match (merge_prev, merge_next) {
            (true, true) => {
                let hi = self.ack.ranges[i].1;
                self.ack.ranges[i - 1].1 = hi;
                self.ack.ranges.remove(i);
            }
            (true, false) => self.ack.ranges[i - 1].1 = pn,
            (false, true) => self.ack.ranges[i].0 = pn,
            (false, false) => self.ack.ranges.insert(i, (pn, pn)),
        }
        while self.ack.ranges.len() > MAX_TRACKED_RANGES {
            if let Some((_, hi)) = self.ack.ranges.pop_front() {
                self.ack.floor = hi + 1;
            }
        }
        self.ack.pending = true;
        if ack_eliciting {
            self.ack.eliciting_unacked = self.ack.eliciting_unacked.saturating_add(1);
            let delay = match self.cfg.unreliable_ack_delay {
                Some(d) if !reliable => d,
                _ => {
                    self.ack.reliable_unacked = self.ack.reliable_unacked.saturating_add(1);
                    self.cfg.max_ack_delay
                }
            };
            if largest.is_some_and(|l| pn != l + 1) {
                self.ack.immediate = true; // gap or reordering: tell the sender at once
            }
            let d = now + delay;
            self.ack.deadline = Some(self.ack.deadline.map_or(d, |x| x.min(d)));
        }
    }

    /// Process an ACK frame; true when something new was acknowledged.
    fn on_ack(&mut self, now: Instant, ack: &wire::AckFrame<'_>) -> bool {
        self.send.peer_window = usize::try_from(ack.window).unwrap_or(usize::MAX);
        let Some(front) = self.recovery.sent.front().map(|p| p.pn) else {
            return false;
        };
        let mut newly = false;
        let mut largest_newly: Option<(Instant, bool)> = None;
        // The newest packet this ACK covers, whatever the sender's bookkeeping of it (ACK-only,
        // declared lost, in flight): parity sent before it has left the path.
        let mut newest_covered: Option<Instant> = None;
        for (lo, hi) in ack.ranges() {
            let lo = lo.max(front);
            let hi = hi.min(self.recovery.next_pn.saturating_sub(1));
            if lo > hi {
                continue;
            }
            for pn in lo..=hi {
                let idx = (pn - front) as usize;
                let Some(p) = self.recovery.sent.get_mut(idx) else {
                    break;
                };
                if p.state != PacketState::Acked {
                    newest_covered = Some(newest_covered.map_or(p.time, |t| t.max(p.time)));
                    // The peer has the ACK frame this packet carried.
                    self.ack.ack_floor = self.ack.ack_floor.max(p.acks_below);
                }
                match p.state {
                    PacketState::InFlight => {
                        p.state = PacketState::Acked;
                        self.recovery.in_flight_packets -= 1;
                        if !p.segs.is_empty() {
                            self.recovery.reliable_in_flight -= 1;
                        }
                        newly = true;
                        self.cc.on_acked(p.size as usize, p.time);
                        if pn == ack.largest {
                            largest_newly = Some((p.time, !p.segs.is_empty()));
                        }
                        let segs = std::mem::take(&mut p.segs);
                        for &sid in &segs {
                            self.ack_segment(sid);
                        }
                    }
                    PacketState::Lost => {
                        p.state = PacketState::Acked;
                        self.counters.packets_spurious_lost += 1;
                        // Packet numbers are never reused, so this is an unambiguous sample
                        // too; without it a path whose RTT outgrew the estimate (a peer that
                        // overloaded stalls for seconds) would never teach it otherwise, as
                        // every packet is declared lost before its ACK can come back.
                        if pn == ack.largest {
                            largest_newly = Some((p.time, !p.segs.is_empty()));
                        }
                        let segs = std::mem::take(&mut p.segs);
                        for &sid in &segs {
                            self.ack_segment(sid);
                        }
                    }
                    PacketState::Acked | PacketState::Untracked => {}
                }
            }
        }
        if let Some(t) = newest_covered {
            self.fec.on_acked(t, &mut self.cc);
        }
        if let Some((sent_time, reliable)) = largest_newly {
            let sample = now.saturating_duration_since(sent_time);
            let reported = Duration::from_micros(ack.ack_delay_us);
            match self.cfg.unreliable_ack_delay {
                // The peer held the ACK of an unreliable-only packet on purpose, up to its
                // hold: that time is not the path's. Taken off before the estimator sees the
                // sample, since with every sample held its minimum would include the hold and
                // never let the delay be subtracted (RFC 9002 §5.3's guard).
                Some(hold) if !reliable => {
                    let held = reported.min(hold.max(self.cfg.max_ack_delay));
                    let path = sample.saturating_sub(held).max(Duration::from_micros(1));
                    self.rtt.update(path, Duration::ZERO);
                    self.note_rtt_sample(path);
                }
                _ => {
                    self.rtt
                        .update(sample, reported.min(self.cfg.max_ack_delay));
                    self.note_rtt_sample(sample);
                }
            }
        }
        if self.recovery.largest_acked.is_none_or(|l| ack.largest > l) {
            self.recovery.largest_acked = Some(ack.largest);
        }
        if newly {
            self.recovery.pto_count = 0;
            self.recovery.ack_wait_since = (self.recovery.in_flight_packets > 0).then_some(now);
        }
        self.detect_lost(now);
        self.pop_sent(now);
        newly
    }

    fn ack_segment(&mut self, sid: u64) {
        if sid < self.send.seg_base {
            return;
        }
        if let Some(s) = self
            .send
            .segments
            .get_mut((sid - self.send.seg_base) as usize)
        {
            if !s.acked {
                s.acked = true;
                s.data = Bytes::new();
                self.send.unacked_segments -= 1;
            }
        }
        while self.send.segments.front().is_some_and(|s| s.acked) {
            self.send.segments.pop_front();
            self.send.seg_base += 1;
        }
    }

    /// Drops settled packets from the front of the sent list. A packet declared lost stays
    /// for a while (two loss delays after it was sent, or three RTOs while the RTT estimate
    /// is in doubt): if its ACK still arrives, the loss was
    /// spurious (reordering or delay) and is counted as such, and its fragments are settled.
    fn pop_sent(&mut self, now: Instant) {
        // While the estimate may be far below the real RTT (no sample yet, or timeouts firing
        // with nothing acknowledged since), at least three retransmission timeouts (backoff
        // included; RFC 9002 §6 suggests 3 x PTO): the ACK of a packet declared lost comes
        // back that late, and a forgotten packet's ACK settles nothing. Otherwise two loss
        // delays, which keeps the list (scanned by loss detection) short.
        let mut keep_lost = self.rtt.loss_delay() * 2;
        if !self.rtt.has_sample || self.recovery.pto_count > 0 {
            keep_lost = keep_lost.max(self.current_rto() * 3);
        }
        while self.recovery.sent.front().is_some_and(|p| match p.state {
            PacketState::InFlight => false,
            PacketState::Lost => p.time + keep_lost <= now,
            PacketState::Acked | PacketState::Untracked => true,
        }) {
            self.recovery.sent.pop_front();
        }
    }

    fn queueing(&self) -> bool {
        let r = &self.rtt;
        r.has_sample && r.smoothed > r.min + (r.min / 8).max(Duration::from_millis(2))
    }

    fn detect_lost(&mut self, now: Instant) {
        self.recovery.loss_time = None;
        let Some(la) = self.recovery.largest_acked else {
            return;
        };
        // While groups carry parity, the peer may rebuild a lost packet once its group's
        // parity arrives: later packets acknowledged meanwhile, or the usual time threshold
        // passing, are no proof of loss until the group had time to close.
        let delay = self.rtt.loss_delay() + self.fec.reorder_delay();
        let threshold = self.cfg.packet_threshold + self.fec.reorder_allowance();
        let mut largest_lost_time: Option<Instant> = None;
        for i in 0..self.recovery.sent.len() {
            let (pn, time, state) = {
                let p = &self.recovery.sent[i];
                (p.pn, p.time, p.state)
            };
            if pn >= la {
                break;
            }
            if state != PacketState::InFlight {
                continue;
            }
            if la - pn >= threshold || time + delay <= now {
                self.declare_lost(i);
                largest_lost_time = Some(time);
            } else {
                let t = time + delay;
                self.recovery.loss_time = Some(self.recovery.loss_time.map_or(t, |x| x.min(t)));
            }
        }
        if let Some(t) = largest_lost_time {
            let q = self.queueing();
            self.cc.on_loss(now, t, q);
            // Parity sent before a packet declared lost is no longer expected either.
            self.fec.on_acked(t, &mut self.cc);
        }
    }

    fn declare_lost(&mut self, i: usize) {
        let p = &mut self.recovery.sent[i];
        if p.state == PacketState::InFlight {
            self.recovery.in_flight_packets -= 1;
            if !p.segs.is_empty() {
                self.recovery.reliable_in_flight -= 1;
            }
        }
        p.state = PacketState::Lost;
        let pn = p.pn;
        let size = p.size as usize;
        let segs = std::mem::take(&mut p.segs);
        self.cc.on_removed(size);
        self.counters.packets_lost += 1;
        for &sid in &segs {
            if sid < self.send.seg_base {
                continue;
            }
            if let Some(s) = self
                .send
                .segments
                .get_mut((sid - self.send.seg_base) as usize)
            {
                if !s.acked && !s.queued && s.last_pn == pn {
                    s.queued = true;
                    self.send.retx.push_back(sid);
                    if self.cfg.redundant_retransmit && self.fec.reorder_allowance() == 0 {
                        // Second copy, sent in the packet after the first (see the config).
                        // Not while FEC groups carry parity: that protects the repair too.
                        self.send.retx.push_back(sid);
                    }
                }
            }
        }
        // Keep the ids: a late ACK of this packet still acknowledges its segments.
        self.recovery.sent[i].segs = segs;
    }

    /// The earliest time `handle_timeout` (or `poll_transmit`) has work to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut add = |x: Option<Instant>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |y: Instant| y.min(x)));
            }
        };
        match self.state {
            ConnectionState::Closed => {
                if self.close.sends_left > 0 {
                    add(Some(self.activity.last_sent));
                }
                return t;
            }
            ConnectionState::Handshaking => {
                // A server connection waiting for its application has no retransmissions.
                if self.side == Side::Client {
                    add(Some(self.hs.resend_at));
                }
                add(Some(self.hs.deadline));
                return t;
            }
            _ => {}
        }
        add(Some(self.activity.last_recv + self.cfg.idle_timeout));
        if self.state == ConnectionState::Draining {
            add(self.close.drain_deadline);
            if self.close.sends_left > 0 {
                add(self.close.next_send);
            }
            return t;
        }
        add(self
            .recovery
            .ack_wait_since
            .map(|t| t + self.cfg.idle_timeout));
        add(self.recovery.loss_time);
        add(self.pto_deadline());
        if self.ack.pending && self.ack.eliciting_unacked > 0 {
            if self.ack.immediate || self.ack_count_reached() {
                add(Some(self.activity.last_recv));
            } else {
                add(self.ack.deadline);
            }
        }
        if let Some(k) = self.cfg.keepalive_interval {
            add(Some(self.activity.last_sent + k));
        }
        add(self.close.linger_deadline);
        add(self.trim_deadline());
        add(self.receiver.next_expiry(self.cfg.unreliable_timeout));
        add(self.fec.poll_timeout());
        if self.fec.next_parity().is_some_and(|n| self.cc.can_send(n)) {
            add(Some(self.activity.last_sent));
        }
        if self.accept.pending || self.recovery.probe_pending {
            add(Some(self.activity.last_sent));
        }
        if self.has_sendable_data() {
            add(Some(
                self.send.pacing_until.unwrap_or(self.activity.last_sent),
            ));
        }
        t
    }

    fn pto_deadline(&self) -> Option<Instant> {
        let base = self.recovery.last_ack_eliciting_sent?;
        debug_assert_eq!(
            self.recovery.in_flight_packets as usize,
            self.recovery
                .sent
                .iter()
                .filter(|p| p.state == PacketState::InFlight)
                .count()
        );
        let in_flight = self.recovery.in_flight_packets > 0;
        let blocked = self.send.peer_window == 0 && self.has_queued_reliable();
        // Parity alone fills the window and no data packet is in flight whose ACK or loss would
        // take it out: the probe (which may exceed the window) and then the RTO end the wait.
        let parity_blocked = self.fec.parity_in_flight()
            && !self.cc.can_send(self.cfg.max_datagram_size)
            && (!self.send.retx.is_empty() || self.send.queued_bytes > 0);
        if !in_flight && !blocked && !parity_blocked {
            return None;
        }
        Some(base + self.probe_timeout())
    }

    /// Whether the ACK count alone calls for an ACK now. Only ack-eliciting packets count,
    /// and at least one must have come since the last ACK: an `ack_frequency` of 0 (which
    /// `Config::validate` refuses) would otherwise answer every ACK-only packet with another,
    /// and two peers would trade them forever.
    fn ack_count_reached(&self) -> bool {
        let frequency = self.cfg.ack_frequency.max(1);
        match self.cfg.unreliable_ack_delay {
            None => u32::from(self.ack.eliciting_unacked) >= frequency,
            Some(_) => {
                u32::from(self.ack.reliable_unacked) >= frequency
                    || u32::from(self.ack.eliciting_unacked)
                        >= crate::UNRELIABLE_ACK_TOLERANCE.max(frequency)
            }
        }
    }

    fn channel_is_reliable(&self, channel: u8) -> bool {
        self.send
            .channels
            .get(usize::from(channel))
            .is_some_and(|c| c.kind.is_reliable())
    }

    fn has_queued_reliable(&self) -> bool {
        self.send
            .channels
            .iter()
            .any(|c| c.kind.is_reliable() && !c.queue.is_empty())
    }

    /// Whether data could go out now if window and pacing allowed.
    fn has_sendable_data(&self) -> bool {
        // The congestion window gates retransmissions too: reporting "sendable" while the
        // window is full would make `poll_timeout` point at the past forever.
        if !self.cc.can_send(self.cfg.max_datagram_size) {
            return false;
        }
        if !self.send.retx.is_empty() {
            return true;
        }
        let reliable_ok = self.reliable_window_open();
        self.send
            .channels
            .iter()
            .any(|c| !c.queue.is_empty() && (!c.kind.is_reliable() || reliable_ok))
    }

    fn reliable_window_open(&self) -> bool {
        let window = self.cfg.send_window.min(self.send.peer_window);
        self.send.unacked_segments < window && self.send.segments.len() < 4 * self.cfg.send_window
    }

    /// Run expired timers: idle timeout, handshake retries, loss detection, probe timeout / RTO.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.on_timeout(now);
    }

    fn on_timeout(&mut self, now: Instant) {
        match self.state {
            ConnectionState::Closed => return,
            ConnectionState::Handshaking => {
                if now >= self.hs.deadline {
                    if self.side == Side::Server {
                        // The application never answered: drop the attempt.
                        self.discard();
                    } else if !self.try_next_server(now) {
                        self.finish(CloseReason::HandshakeTimeout, false);
                    }
                }
                return;
            }
            _ => {}
        }
        if now >= self.activity.last_recv + self.cfg.idle_timeout {
            self.time_out_idle();
            return;
        }
        if self.state == ConnectionState::Draining {
            if self.close.drain_deadline.is_some_and(|d| now >= d) {
                let (r, _) = self
                    .close
                    .reason
                    .unwrap_or((CloseReason::Application, false));
                self.close.sends_left = 0;
                self.finish(r, false);
            }
            return;
        }
        if self
            .recovery
            .ack_wait_since
            .is_some_and(|t| now >= t + self.cfg.idle_timeout)
        {
            // Packets arrive, but nothing this side sent has been acknowledged for the idle
            // timeout: the peer's acknowledgements are lost, or withheld so that this side's
            // queues grow. Either way the session is as dead as an idle one.
            self.time_out_idle();
            return;
        }
        self.maybe_start_draining(now);
        self.fec.handle_timeout(now);
        self.receiver.expire(now, self.cfg.unreliable_timeout);
        if self.trim_deadline().is_some_and(|t| now >= t) {
            self.trim(now);
        }
        if self.recovery.loss_time.is_some_and(|t| now >= t) {
            self.detect_lost(now);
            self.pop_sent(now);
        }
        if self.pto_deadline().is_some_and(|t| now >= t) {
            self.recovery.pto_count += 1;
            if self.recovery.pto_count == 1 {
                // Tail-loss probe: elicit an ACK (and repair a lost tail) before the RTO.
                self.counters.tail_loss_probes += 1;
            } else {
                self.counters.rto_count += 1;
                for i in 0..self.recovery.sent.len() {
                    if self.recovery.sent[i].state == PacketState::InFlight {
                        self.declare_lost(i);
                    }
                }
                self.pop_sent(now);
                self.fec.on_rto(&mut self.cc);
                // Congestion, not random loss, when the RTT shows a queue, when there is no
                // RTT sample to say otherwise, or when this is the second RTO in a row: a peer
                // that answers nothing for two backed-off timeouts is overloaded or gone, and
                // resending a full window at every expiry only buries it deeper.
                let persistent = self.recovery.pto_count > 2 || !self.rtt.has_sample;
                let congested = persistent || self.queueing();
                self.cc.on_rto(now, congested);
            }
            self.recovery.probe_pending = true;
            // Re-arm from now so the next stage waits a full (backed-off) period.
            self.recovery.last_ack_eliciting_sent = Some(now);
        }
    }

    /// Write the next datagram into `buf` (at most [`Config::max_datagram_size`] bytes), or
    /// return `None` when there is nothing to send now. Call until `None` after every input.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let t = self.transmit(now, buf);
        if let Some(t) = t {
            self.counters.packets_sent += 1;
            self.counters.bytes_sent += t.size as u64;
            self.activity.last_sent = now;
        }
        t
    }

    fn transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let udp = buf.len().min(self.cfg.max_datagram_size);
        let buf = &mut buf[..udp];
        // ARQ datagrams leave room for the FEC wrapping (see `fec`).
        let max = self.fec.arq_budget(udp);
        match self.state {
            ConnectionState::Handshaking => return self.transmit_handshake(now, buf),
            ConnectionState::Closed => {
                if self.close.sends_left == 0 {
                    return None;
                }
                self.close.sends_left -= 1;
                let (reason, _) = self
                    .close
                    .reason
                    .unwrap_or((CloseReason::Application, false));
                return self.transmit_close(buf, reason);
            }
            ConnectionState::Draining => {
                if self.close.sends_left == 0 || self.close.next_send.is_some_and(|t| now < t) {
                    return None;
                }
                self.close.sends_left -= 1;
                self.close.next_send = Some(now + self.pto_base());
                let (reason, _) = self
                    .close
                    .reason
                    .unwrap_or((CloseReason::Application, false));
                return self.transmit_close(buf, reason);
            }
            _ => {}
        }
        if self.accept.pending && self.side == Side::Server {
            self.accept.pending = false;
            let size = match &self.hs.accept_packet {
                Some(a) => {
                    let (bytes, n) = (&a.0, a.1);
                    buf.get_mut(..n)?.copy_from_slice(&bytes[..n]);
                    n
                }
                None => {
                    let p = Packet::ServerAccept {
                        client_cid: self.path.remote_cid,
                        server_cid: self.path.local_cid,
                    };
                    wire::encode_packet(&p, buf).ok()?
                }
            };
            return Some(Transmit {
                destination: self.path.remote,
                size,
            });
        }
        // Parity goes out right after its group closed, ahead of new data.
        if let Some(size) = self
            .fec
            .poll_parity(now, self.path.remote_cid, buf, &mut self.cc)
        {
            let size = self.protect(now, buf, size)?;
            return Some(Transmit {
                destination: self.path.remote,
                size,
            });
        }
        let ack_due = self.ack.pending
            && (self.ack.immediate
                || self.ack_count_reached()
                || self.ack.deadline.is_some_and(|d| now >= d));
        let keepalive_due = self
            .cfg
            .keepalive_interval
            .is_some_and(|k| now >= self.activity.last_sent + k);
        let mut data_ok = self.has_sendable_data();
        if data_ok && self.cfg.pacing {
            match self.cc.pacing_delay(now, self.rtt.smoothed, max) {
                Some(d) => {
                    self.send.pacing_until = Some(now + d);
                    data_ok = false;
                }
                None => self.send.pacing_until = None,
            }
        }
        if !(ack_due || keepalive_due || data_ok || self.recovery.probe_pending) {
            return None;
        }
        // Build a data packet.
        let pn = self.recovery.next_pn;
        let Ok(hdr) = wire::encode_data_header(self.path.remote_cid, pn, buf) else {
            return None;
        };
        let (_, body) = buf.split_at_mut(hdr);
        let mut w = Writer::new(&mut body[..max.saturating_sub(hdr)]);
        let mut segs = Segs::new();
        let mut ack_eliciting = false;
        let acks_below = if self.ack.pending {
            self.write_ack(now, &mut w).map_or(0, |largest| largest + 1)
        } else {
            0
        };
        // Loss report: when the peer sends FEC, its data-shard loss before recovery (what its
        // parity policy needs); otherwise packet-number gaps.
        if now >= self.ack.report.due
            && (self.ack.report.received > 0 || self.fec.receiving())
            && w.remaining() >= LOSS_REPORT_MAX
        {
            let (received, lost, max_burst) = match self.fec.take_loss_report() {
                Some(r) => r,
                None => {
                    let largest = self.ack.largest.map_or(0, |(l, _)| l);
                    let expected =
                        largest.saturating_sub(self.ack.report.base.unwrap_or(largest)) + 1;
                    // Packet-number gaps do not tell bursts apart (reordering fills them).
                    (
                        self.ack.report.received,
                        expected.saturating_sub(self.ack.report.received),
                        0,
                    )
                }
            };
            let f = Frame::LossReport {
                received,
                lost,
                max_burst,
            };
            if received + lost == 0 || wire::encode_frame(&f, &mut w).is_ok() {
                self.ack.report.received = 0;
                self.ack.report.base = None;
                self.ack.report.due = now + self.cfg.loss_report_interval;
            }
        }
        let probe = std::mem::take(&mut self.recovery.probe_pending);
        let mut wrote_data = false;
        let cc_ok = self.cc.can_send(max) && data_ok;
        // Retransmissions first (a probe may send them past the congestion window).
        let mut deferred = Vec::new();
        if cc_ok || probe {
            while let Some(&sid) = self.send.retx.front() {
                if sid < self.send.seg_base {
                    self.send.retx.pop_front();
                    continue;
                }
                let idx = (sid - self.send.seg_base) as usize;
                let Some(s) = self.send.segments.get(idx) else {
                    self.send.retx.pop_front();
                    continue;
                };
                if s.acked {
                    self.send.retx.pop_front();
                    continue;
                }
                if segs.contains(&sid) {
                    // The redundant copy goes in the next packet, not next to the first one.
                    self.send.retx.pop_front();
                    deferred.push(sid);
                    continue;
                }
                if !write_segment(&mut w, s) {
                    break;
                }
                self.send.retx.pop_front();
                let s = &mut self.send.segments[idx];
                s.queued = false;
                s.last_pn = pn;
                push_seg(&mut segs, sid);
                ack_eliciting = true;
                self.counters.segments_retransmitted += 1;
            }
        }
        for sid in deferred.into_iter().rev() {
            self.send.retx.push_front(sid);
        }
        if cc_ok {
            wrote_data |= self.fill_new_data(&mut w, pn, &mut segs, &mut ack_eliciting);
        }
        if probe && !ack_eliciting {
            // Tail-loss probe / RTO: resend the oldest unacknowledged fragment, else new data,
            // else a ping.
            let oldest = self.send.segments.iter().position(|s| !s.acked);
            if let Some(idx) = oldest {
                if write_segment(&mut w, &self.send.segments[idx]) {
                    let sid = self.send.seg_base + idx as u64;
                    self.send.segments[idx].last_pn = pn;
                    push_seg(&mut segs, sid);
                    ack_eliciting = true;
                    self.counters.segments_retransmitted += 1;
                }
            }
            if !ack_eliciting {
                wrote_data |= self.fill_new_data(&mut w, pn, &mut segs, &mut ack_eliciting);
            }
        }
        if (probe || keepalive_due)
            && !ack_eliciting
            && wire::encode_frame(&Frame::Ping, &mut w).is_ok()
        {
            ack_eliciting = true;
        }
        if w.is_empty() {
            return None;
        }
        wrote_data |= !segs.is_empty();
        let len = hdr + w.len();
        self.recovery.next_pn += 1;
        if wrote_data {
            self.note_data(now);
        }
        let state = if ack_eliciting {
            self.cc.on_sent(len);
            self.recovery.last_ack_eliciting_sent = Some(now);
            self.recovery.in_flight_packets += 1;
            self.recovery.ack_wait_since.get_or_insert(now);
            if !segs.is_empty() {
                self.recovery.reliable_in_flight += 1;
            }
            PacketState::InFlight
        } else {
            PacketState::Untracked
        };
        if self.recovery.sent.len() == self.recovery.sent.capacity() {
            // Grow by a quarter (at least 4), not double: at 64 bytes a packet, the list of
            // a session whose flight just passed a power of two would otherwise hold nearly
            // twice the room it uses (and the idle trim gives it back only later).
            self.recovery
                .sent
                .reserve_exact((self.recovery.sent.len() / 4).max(4));
        }
        self.recovery.sent.push_back(SentPacket {
            pn,
            time: now,
            // A datagram is under 64 KiB.
            size: u32::try_from(len).unwrap_or(u32::MAX),
            state,
            acks_below,
            segs,
        });
        self.send.rr = (self.send.rr + 1) % self.send.channels.len().max(1);
        // A packet that cannot be sealed is dropped (already counted sent: ARQ repairs it as
        // a loss).
        let size = self.seal_outgoing(now, buf, len)?;
        Some(Transmit {
            destination: self.path.remote,
            size,
        })
    }

    /// FEC seam (outgoing): every ARQ datagram leaves through here. Without FEC it is sent as is;
    /// with FEC it becomes a `FecData` packet in place (`buf` must hold
    /// `len + FEC_ARQ_OVERHEAD` bytes) and joins the open group. Either way it is then sealed
    /// (FEC below packet protection: see the `fec` submodule).
    fn seal_outgoing(&mut self, now: Instant, buf: &mut [u8], len: usize) -> Option<usize> {
        let len = self.fec.seal(now, self.path.remote_cid, buf, len);
        self.protect(now, buf, len)
    }

    /// Seals the connection packet `buf[..len]` in place with this side's packet key and
    /// returns its length with the tag; without keys it is left as is. `None` when it cannot
    /// be sealed: the packet must then not be sent (a secure session never sends plaintext).
    /// Every budget leaves room for the tag, so that is a bug: the packet is lost, and ARQ
    /// repairs it like any loss.
    fn protect(&mut self, now: Instant, buf: &mut [u8], len: usize) -> Option<usize> {
        let Some(p) = self.protection.as_deref_mut() else {
            return Some(len);
        };
        let sealed = wire::clear_header(&buf[..len])
            .ok()
            .and_then(|h| p.seal(now, NumberSpace::of(h.ty), h.number, buf, h.len, len));
        debug_assert!(sealed.is_some(), "no room for the tag: a budget is wrong");
        sealed
    }

    /// Writes queued fragments, channels in turn; true when it wrote any.
    fn fill_new_data(
        &mut self,
        w: &mut Writer<'_>,
        pn: u64,
        segs: &mut Segs,
        ack_eliciting: &mut bool,
    ) -> bool {
        let n = self.send.channels.len();
        let mut wrote = false;
        loop {
            let mut progress = false;
            for k in 0..n {
                let ci = (self.send.rr + k) % n;
                let reliable = self.send.channels[ci].kind.is_reliable();
                if reliable && !self.reliable_window_open() {
                    continue;
                }
                let Some(f) = self.send.channels[ci].queue.front() else {
                    continue;
                };
                let frame = frame_for(ci as u8, f.message_id, f.index, f.count, &f.data);
                if wire::encode_frame(&frame, w).is_err() {
                    continue;
                }
                let Some(f) = self.send.channels[ci].queue.pop_front() else {
                    continue;
                };
                self.send.queued_bytes -= f.data.len();
                let ch = &mut self.send.channels[ci];
                ch.queued = ch
                    .queued
                    .saturating_sub(u32::try_from(f.data.len()).unwrap_or(u32::MAX));
                progress = true;
                wrote = true;
                *ack_eliciting = true;
                if reliable {
                    let sid = self.send.seg_base + self.send.segments.len() as u64;
                    self.send.segments.push_back(Segment {
                        channel: ci as u8,
                        message_id: f.message_id,
                        index: f.index,
                        count: f.count,
                        data: f.data,
                        last_pn: pn,
                        acked: false,
                        queued: false,
                    });
                    self.send.unacked_segments += 1;
                    self.counters.segments_sent += 1;
                    push_seg(segs, sid);
                }
            }
            if !progress {
                return wrote;
            }
        }
    }

    /// Writes an ACK frame of the newest received ranges (above [`Self::ack_floor`]) if it
    /// fits; returns the largest packet number it acknowledged.
    fn write_ack(&mut self, now: Instant, w: &mut Writer<'_>) -> Option<u64> {
        let mut ranges = [(0u64, 0u64); MAX_ACK_RANGES];
        let mut n = 0;
        for &(lo, hi) in self.ack.ranges.iter().rev().take(MAX_ACK_RANGES) {
            if hi < self.ack.ack_floor {
                // Every older range is below the floor too. The newest is always listed (in
                // full: nothing has arrived since the frame the peer acknowledged).
                if n == 0 {
                    ranges[0] = (lo, hi);
                    n = 1;
                }
                break;
            }
            ranges[n] = (lo.max(self.ack.ack_floor), hi);
            n += 1;
        }
        if n == 0 {
            return None;
        }
        let delay = self.ack.largest.map_or(0, |(_, t)| {
            now.saturating_duration_since(t).as_micros() as u64
        });
        let window = self.cfg.recv_window.saturating_sub(self.receiver.segments) as u64;
        // Shrink the range list until it fits the space left.
        while n > 0 && wire::ack_len(delay, window, &ranges[..n]) > w.remaining() {
            n -= 1;
        }
        if n > 0 && wire::encode_ack(delay, window, &ranges[..n], w).is_ok() {
            self.ack.pending = false;
            self.ack.eliciting_unacked = 0;
            self.ack.reliable_unacked = 0;
            self.ack.deadline = None;
            self.ack.immediate = false;
            return Some(ranges[0].1);
        }
        None
    }

    fn transmit_handshake(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if self.side != Side::Client || now < self.hs.resend_at {
            return None;
        }
        let (ty, timestamp, cookie) = match self.hs.cookie {
            None => (wire::PacketType::ClientHello, 0, [0u8; COOKIE_LEN]),
            Some((t, c)) => (wire::PacketType::ClientCookieEcho, t, c),
        };
        let token = self.hs.secure.as_ref().and_then(|s| {
            let (token, _) = s.token.as_deref()?;
            let tag = token.sealed.tag();
            Some(TokenSection {
                protocol_id: token.protocol_id,
                expires_unix: token.expires_unix,
                nonce: &token.sealed.nonce,
                sealed: &token.sealed.bytes,
                proof: s.hk.proof(
                    ty,
                    self.path.local_cid,
                    self.hs.nonce,
                    timestamp,
                    &cookie,
                    &tag,
                ),
            })
        });
        let p = match self.hs.cookie {
            None => Packet::ClientHello {
                client_cid: self.path.local_cid,
                nonce: self.hs.nonce,
                token,
            },
            Some(_) => Packet::ClientCookieEcho {
                client_cid: self.path.local_cid,
                nonce: self.hs.nonce,
                timestamp,
                cookie,
                token,
            },
        };
        let size = wire::encode_packet(&p, buf).ok()?;
        self.hs.resend_at = now + self.hs.interval;
        self.hs.interval = (self.hs.interval * 2).min(Duration::from_secs(2));
        Some(Transmit {
            destination: self.path.remote,
            size,
        })
    }

    fn transmit_close(&mut self, buf: &mut [u8], reason: CloseReason) -> Option<Transmit> {
        let pn = self.recovery.next_pn;
        let hdr = wire::encode_data_header(self.path.remote_cid, pn, buf).ok()?;
        // The ARQ budget, as for data packets: room for the FEC wrapping and the tag.
        let max = self.fec.arq_budget(buf.len());
        let mut w = Writer::new(buf.get_mut(hdr..max)?);
        wire::encode_frame(&Frame::Close(reason), &mut w).ok()?;
        let len = hdr + w.len();
        self.recovery.next_pn += 1;
        let size = self.seal_outgoing(self.activity.last_sent, buf, len)?;
        Some(Transmit {
            destination: self.path.remote,
            size,
        })
    }
}

fn frame_for<'a>(
    channel: u8,
    message_id: u64,
    index: u32,
    count: u32,
    data: &'a [u8],
) -> Frame<'a> {
    if count == 1 {
        Frame::Datagram {
            channel,
            message_id,
            data,
        }
    } else {
        Frame::Fragment {
            channel,
            message_id,
            index: u64::from(index),
            count: u64::from(count),
            data,
        }
    }
}

fn write_segment(w: &mut Writer<'_>, s: &Segment) -> bool {
    let f = frame_for(s.channel, s.message_id, s.index, s.count, &s.data);
    wire::encode_frame(&f, w).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn established(cfg: Config, now: Instant) -> Connection {
        let remote = SocketAddr::from(([127, 0, 0, 1], 4000));
        let mut c = Connection::new(
            Arc::new(cfg),
            Side::Client,
            ConnectionId(1),
            remote,
            now,
            false,
            None,
        );
        c.state = ConnectionState::Established;
        c.path.remote_cid = ConnectionId(2);
        c
    }

    /// Even with `ack_frequency` 0 (refused by `Config::validate`, but a `Connection` must
    /// not rely on it), an ACK-only packet is not answered with an ACK-only packet: two peers
    /// would trade them forever. An ack-eliciting one is acknowledged at once.
    #[test]
    fn an_ack_only_packet_is_not_acknowledged_even_at_frequency_zero() {
        let now = ricochet_testkit::SimClock::new().now();
        for unreliable_ack_delay in [None, Some(Duration::from_millis(25))] {
            let cfg = Config::default().with(|c| {
                c.ack_frequency = 0;
                c.unreliable_ack_delay = unreliable_ack_delay;
            });
            let mut c = established(cfg, now);
            let mut buf = [0u8; 1500];
            c.record_received(now, 0, false, false);
            assert!(c.ack.pending);
            assert_eq!(c.poll_transmit(now, &mut buf), None);
            c.record_received(now, 1, true, true);
            assert!(c.poll_transmit(now, &mut buf).is_some());
            assert!(!c.ack.pending);
        }
    }
}
