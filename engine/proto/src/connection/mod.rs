//! One RUDP connection: client handshake, ARQ, congestion control, channels. Sans-IO.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;

mod ack;
pub(crate) mod cc;
mod close;
pub(crate) mod fec_link;
mod frames;
mod handshake;
mod lanes;
mod mtu_probe;
pub(crate) mod pmtu;
mod recovery;
pub(crate) mod recv;
pub(crate) mod rtt;
mod send;
mod state;
mod timer;

pub(crate) use self::handshake::ServerAdmit;
pub use self::state::{Connection, ConnectionState};

use self::ack::Acks;
use self::cc::Congestion;
use self::fec_link::FecLink;
use self::frames::Decoded;
pub(crate) use self::lanes::MAX_LANES;
use self::pmtu::PathMtu;
use self::recv::{Budget, Receiver, SharedBudgets};
use self::rtt::RttEstimator;
use self::state::{
    Accept, Activity, Closing, Handshake, Path, Recovery, Secure, Segs, Sending, Side,
};
use crate::admission::HandshakeKeys;
use crate::protect::{NumberSpace, Protection};
use crate::stats::Counters;
use crate::token::ConnectToken;
use crate::wire::{self, Frame, Packet, Writer};
use crate::{Config, ConnectionId, ConnectionStats, DropCause, Event, SessionKeys, Transmit};

/// Largest packet number accepted from a peer: far beyond any real connection's lifetime, so
/// arithmetic on received packet numbers cannot overflow.
const MAX_PACKET_NUMBER: u64 = (1 << 62) - 1;

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
                mtu: PathMtu::boxed(
                    cfg.path_mtu.enabled,
                    cfg.max_datagram_size,
                    cfg.max_path_datagram_size(),
                    cfg.path_mtu.raise_interval,
                ),
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

    /// The send rate congestion control estimates the path carries for this connection, bytes
    /// per second ([`ConnectionStats::rate_estimate`]); what a sender divides its queued bytes
    /// by to know how long they will wait.
    pub fn rate_estimate(&self) -> u64 {
        self.cc.rate_estimate(self.rtt.smoothed)
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
            unsent: self.unsent_drops(),
            drops: c.drops.get(),
            cwnd: self.cc.window(),
            bytes_in_flight: self.cc.in_flight(),
            rate_estimate: self.cc.rate_estimate(self.rtt.smoothed),
            rto: self.current_rto(),
            srtt: self.rtt.smoothed,
            min_rtt: self.rtt.min,
            reassembly_bytes: self.receiver.bytes,
            reassembly_peak: self.receiver.peak,
            peer_loss_report: c.peer_loss_report,
            fec: self.fec.stats(),
            path_mtu: self.datagram_size(),
            path_mtu_probes: self.path.mtu.as_ref().map_or(0, |p| p.probes_sent()),
            path_mtu_black_holes: self.path.mtu.as_ref().map_or(0, |p| p.black_holes()),
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

    /// Next event for the application.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Nothing for the endpoint to collect: no event, no RTT sample, not drained (what
    /// queuing a message leaves true).
    pub(crate) fn nothing_to_collect(&self) -> bool {
        self.events.is_empty() && self.recovery.unread_rtt_len == 0 && !self.is_drained()
    }

    /// Entry point for every datagram addressed to this connection.
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
    ) -> Result<(), DropCause> {
        self.handle_datagram_in(now, from, datagram, None)
    }

    /// [`Self::handle_datagram`], with small received messages cut from `arena` (the
    /// endpoint's, see `recv::message_bytes`) instead of allocated one by one.
    pub(crate) fn handle_datagram_in(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
        arena: Option<&mut BytesMut>,
    ) -> Result<(), DropCause> {
        let res = self.dispatch(now, from, datagram, arena);
        match res {
            // The datagram as it came off the wire (tag and FEC framing included), as
            // `bytes_sent` counts what went onto it.
            Ok(()) => self.counters.bytes_received += datagram.len() as u64,
            Err(cause) => self.counters.drops.add(cause),
        }
        res
    }

    fn dispatch(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
        arena: Option<&mut BytesMut>,
    ) -> Result<(), DropCause> {
        if self.state == ConnectionState::Closed {
            return Err(DropCause::Closed);
        }
        if datagram.first().is_some_and(|&t| {
            t == wire::PacketType::Data as u8
                || t == wire::PacketType::FecData as u8
                || t == wire::PacketType::FecParity as u8
        }) {
            return self.receive_protected(now, from, datagram, arena);
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
        self.on_handshake_packet(now, from, packet)
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
        arena: Option<&mut BytesMut>,
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
            return self.receive_open(now, from, h.ty, datagram, arena);
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
            Ok(n) => self.receive_open(now, from, h.ty, &buf[..n], arena),
            Err(cause) => Err(cause),
        };
        // An oversize datagram (forged ones included) does not leave its buffer behind.
        if buf.capacity() <= self.cfg.max_path_datagram_size() {
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
        arena: Option<&mut BytesMut>,
    ) -> Result<(), DropCause> {
        // `receive_protected` read the clear header (type, version, our cid, the number) and
        // checked it: neither path decodes it again.
        if ty == wire::PacketType::Data {
            let Some(arq) = packet.get(wire::FEC_HEADER_LEN..) else {
                return Err(DropCause::Malformed);
            };
            self.receive_arq(now, from, arq, arena)
        } else {
            self.receive_fec(now, from, ty == wire::PacketType::FecParity, packet, arena)
        }
    }

    /// FEC seam (incoming): FEC packets land here (opened, their clear header already checked).
    /// The FEC receiver unwraps them and every ARQ datagram it delivers or rebuilds goes to
    /// [`Self::receive_arq`] from its packet number on, as a received one would. A
    /// malformed FEC body is dropped and counted (`Malformed` here, by kind in
    /// [`ConnectionStats::fec`]); the connection carries on.
    fn receive_fec(
        &mut self,
        now: Instant,
        from: SocketAddr,
        parity: bool,
        packet: &[u8],
        mut arena: Option<&mut BytesMut>,
    ) -> Result<(), DropCause> {
        // The body follows the common part (and a parity packet's number).
        let header = if parity {
            wire::FEC_PARITY_HEADER_LEN
        } else {
            wire::FEC_HEADER_LEN
        };
        let Some(body) = packet.get(header..) else {
            return Err(DropCause::Malformed);
        };
        if self.fec.receive(&self.cfg, now, body, parity).is_err() {
            return Err(DropCause::Malformed);
        }
        let (out, lens) = self.fec.take_datagrams();
        let mut result = Ok(());
        let mut at = 0;
        for &n in &lens {
            let r = self.receive_arq(now, from, &out[at..at + n], arena.as_deref_mut());
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

    /// FEC seam (incoming): every ARQ datagram (a `Data` packet) enters the protocol here, from
    /// its packet number on: the part FEC carries. The common part before it was read and
    /// checked with the clear header (for a datagram FEC rebuilt: with its `FecData` packet's).
    fn receive_arq(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
        arena: Option<&mut BytesMut>,
    ) -> Result<(), DropCause> {
        let Some((pn, payload)) = wire::split_packet_number(datagram) else {
            return Err(DropCause::Malformed);
        };
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
        // Validate everything and check buffer space before any state changes, so a dropped
        // packet is not acknowledged (the peer retransmits its data).
        let mut decoded = Decoded::new();
        let seen = self.check_frames(payload, &mut decoded)?;
        // Accepted: record the packet number.
        self.ack
            .record_received(&self.cfg, now, pn, seen.ack_eliciting, seen.reliable);
        if self.ack.largest.is_none_or(|(l, _)| pn >= l) {
            self.ack.largest = Some((pn, now));
            self.path.remote = from; // follow a peer whose address changed
        }
        self.activity.last_recv = now;
        if seen.carries_data {
            self.note_data(now);
        }
        self.counters.packets_received += 1;
        self.ack.report.received += 1;
        if self.ack.report.base.is_none() {
            self.ack.report.base = Some(pn);
        }
        if self.side == Side::Server {
            self.accept.pending = false; // the client got our accept
        }
        let acked_something = if decoded.len() == seen.frames {
            self.apply_frames(now, decoded.into_iter(), arena)
        } else {
            self.apply_frames(now, wire::frames(payload).flatten(), arena)
        };
        if acked_something {
            self.maybe_start_draining(now);
        }
        Ok(())
    }

    /// Write the next datagram into `buf` (at most [`Config::max_datagram_size`] bytes, or
    /// the size path MTU discovery found: [`ConnectionStats::path_mtu`]), or return `None`
    /// when there is nothing to send now. Call until `None` after every input.
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
        if self.probing_path() {
            if let Some(t) = self.transmit_path_probe(now, buf) {
                return Some(t);
            }
        }
        let udp = buf.len().min(self.datagram_size());
        let buf = &mut buf[..udp];
        // ARQ datagrams leave room for the FEC wrapping (see `fec`).
        let max = self.fec.arq_budget(udp);
        match self.state {
            ConnectionState::Handshaking => return self.transmit_handshake(now, buf),
            ConnectionState::Closed | ConnectionState::Draining => {
                return self.transmit_closing(now, buf);
            }
            _ => {}
        }
        if self.accept.pending && self.side == Side::Server {
            return self.transmit_accept(buf);
        }
        // Parity goes out right after its group closed, ahead of new data, when the pacer
        // allows (repairs sent in a burst past the rate fill the bottleneck's queue as data
        // would).
        let parity_paced = self.fec.next_parity().is_some_and(|n| self.paced(now, n));
        if let Some(size) = (!parity_paced)
            .then(|| {
                self.fec
                    .poll_parity(now, self.path.remote_cid, buf, &mut self.cc)
            })
            .flatten()
        {
            let size = self.protect(now, buf, size)?;
            return Some(Transmit {
                destination: self.path.remote,
                size,
            });
        }
        let ack_due = self.ack_due(now);
        let keepalive_due = self.keepalive_due(now);
        let mut data_ok = self.has_sendable_data();
        // A high-priority lane's few bytes are paced on their own (see `urgent_size`).
        let paced_size = self.urgent_size(max).unwrap_or(max);
        if data_ok && self.paced(now, paced_size) {
            data_ok = false;
        }
        if !(ack_due || keepalive_due || data_ok || self.recovery.probe_pending) {
            return None;
        }
        self.transmit_data(now, buf, max, keepalive_due, data_ok)
    }

    /// An ACK is to go out at `now`.
    fn ack_due(&self, now: Instant) -> bool {
        self.ack.pending
            && (self.ack.immediate
                || self.ack.ack_count_reached(&self.cfg)
                || self.ack.deadline.is_some_and(|d| now >= d))
    }

    /// A keepalive ping is to go out at `now`.
    fn keepalive_due(&self, now: Instant) -> bool {
        self.cfg
            .keepalive_interval
            .is_some_and(|k| now >= self.activity.last_sent + k)
    }

    /// True when [`Self::poll_transmit`] at `now` would return `None` and change nothing (in
    /// the common case of an established session; `false` means "perhaps more"): the
    /// endpoint asks it after a datagram instead of polling again to learn there is nothing
    /// more. The conditions are `transmit`'s, in its order: no path-MTU search, no accept,
    /// no parity ready or due, no ACK, keepalive or probe due, and no data the window lets
    /// out (data held by the pacer counts as "perhaps": the pacing check records its time).
    pub(crate) fn nothing_to_send(&self, now: Instant) -> bool {
        self.state == ConnectionState::Established
            && self.path.mtu.is_none()
            && !self.accept.pending
            && self.fec.idle_at(now)
            && !self.ack_due(now)
            && !self.keepalive_due(now)
            && !self.recovery.probe_pending
            && !self.has_sendable_data()
    }

    /// Builds a data packet: an ACK, a loss report, retransmissions, new data (channels in
    /// turn), a probe or a keepalive ping, whatever is due; `None` if nothing fit.
    fn transmit_data(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        max: usize,
        keepalive_due: bool,
        data_ok: bool,
    ) -> Option<Transmit> {
        let pn = self.recovery.next_pn;
        let Ok(hdr) = wire::encode_data_header(self.path.remote_cid, pn, buf) else {
            return None;
        };
        let (_, body) = buf.split_at_mut(hdr);
        let mut w = Writer::new(&mut body[..max.saturating_sub(hdr)]);
        let mut segs = Segs::new();
        let mut ack_eliciting = false;
        let mut rest = None;
        let acks_below = if self.ack.pending {
            self.ack
                .write_ack(&self.cfg, self.receiver.segments, now, &mut w)
                .map_or(0, |largest| largest + 1)
        } else {
            0
        };
        self.ack
            .write_loss_report(&self.cfg, &mut self.fec, now, &mut w);
        let probe = std::mem::take(&mut self.recovery.probe_pending);
        let mut wrote_data = false;
        let cc_ok = self.cc.can_send(max) && data_ok;
        // With lanes, retransmissions wait their lane's turn inside `fill_new_data`.
        if (cc_ok && self.send.lanes.is_none()) || (probe && !cc_ok) {
            self.write_retransmissions(&mut w, pn, &mut segs, &mut ack_eliciting);
        }
        if cc_ok {
            wrote_data |=
                self.fill_new_data(now, &mut w, pn, &mut segs, &mut ack_eliciting, &mut rest);
        }
        if probe && !ack_eliciting {
            self.write_probe_data(&mut w, pn, &mut segs, &mut ack_eliciting);
            if !ack_eliciting {
                wrote_data |=
                    self.fill_new_data(now, &mut w, pn, &mut segs, &mut ack_eliciting, &mut rest);
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
        self.record_sent(now, pn, len, ack_eliciting, acks_below, segs);
        self.send.next_turn();
        // A packet that cannot be sealed is dropped (already counted sent: ARQ retransmits it as
        // a loss).
        let size = self.seal_outgoing(now, buf, pn, len, rest)?;
        Some(Transmit {
            destination: self.path.remote,
            size,
        })
    }

    /// FEC seam (outgoing): every ARQ datagram (packet number `pn`) leaves through here.
    /// Without FEC it is sent as is; with FEC it becomes a `FecData` packet in place (`buf`
    /// must hold `len + FEC_ARQ_OVERHEAD` bytes) and joins the open group. Either way it is
    /// then sealed (FEC below packet protection: see the `fec` submodule).
    /// `rest`: the datagram carries a fragment of an unreliable message of several
    /// fragments: (how many follow it, how many it has); see `FecLink::seal`.
    fn seal_outgoing(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        pn: u64,
        len: usize,
        rest: Option<(u32, u32)>,
    ) -> Option<usize> {
        let (len, header) = self.fec.seal(now, self.path.remote_cid, buf, len, rest);
        self.protect_as(now, NumberSpace::Data, pn, buf, header, len)
    }

    /// Seals the connection packet `buf[..len]` in place with this side's packet key and
    /// returns its length with the tag; without keys it is left as is. `None` when it cannot
    /// be sealed: the packet must then not be sent (a secure session never sends plaintext).
    /// Every budget leaves room for the tag, so that is a bug: the packet is lost, and ARQ
    /// retransmits it like any loss. For a packet whose number and clear header the caller
    /// does not hold (parity): [`Self::protect_as`] otherwise.
    fn protect(&mut self, now: Instant, buf: &mut [u8], len: usize) -> Option<usize> {
        if self.protection.is_none() {
            return Some(len);
        }
        let h = wire::clear_header(&buf[..len]).ok()?;
        self.protect_as(now, NumberSpace::of(h.ty), h.number, buf, h.len, len)
    }

    /// [`Self::protect`] for a packet the caller just built: number `number` in `space`,
    /// clear header `buf[..header]` (no need to read them back from the packet).
    fn protect_as(
        &mut self,
        now: Instant,
        space: NumberSpace,
        number: u64,
        buf: &mut [u8],
        header: usize,
        len: usize,
    ) -> Option<usize> {
        let Some(p) = self.protection.as_deref_mut() else {
            return Some(len);
        };
        let sealed = p.seal(now, space, number, buf, header, len);
        debug_assert!(sealed.is_some(), "no room for the tag: a budget is wrong");
        sealed
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
            c.ack.record_received(&c.cfg, now, 0, false, false);
            assert!(c.ack.pending);
            assert_eq!(c.poll_transmit(now, &mut buf), None);
            c.ack.record_received(&c.cfg, now, 1, true, true);
            assert!(c.poll_transmit(now, &mut buf).is_some());
            assert!(!c.ack.pending);
        }
    }
}
