//! One RUDP echo client on its own thread: connect, keep `window` complete messages in flight
//! on the reliable ordered channel, check every echo (content and order), drain, report.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use ricochet::proto::EndpointConfig;
use ricochet::{Client, ClientConfig, ClientEvent};
use ricochet_platform::BackendKind;

use super::message::{check, encode, Header, Phase};
use crate::schema::{RudpCounts, RudpWire};
use crate::udp::tracker::new_rtt_histogram;

/// The channel the echo runs on (channel 0 of the default channel list: reliable ordered).
pub const ECHO_CHANNEL: u8 = 0;

/// What one client does.
#[derive(Debug, Clone)]
pub struct ClientPlan {
    /// Client id (in every message header).
    pub id: u32,
    /// Where to connect (the relay's front door or the server).
    pub server: SocketAddr,
    /// Message size.
    pub payload: usize,
    /// Messages in flight.
    pub window: usize,
    /// Warm-up length.
    pub warmup: Duration,
    /// Measured length.
    pub measured: Duration,
    /// Longest drain.
    pub drain: Duration,
    /// Protocol settings.
    pub endpoint: EndpointConfig,
    /// Datagram backend.
    pub backend: BackendKind,
    /// Connection seed.
    pub seed: u64,
}

/// What one client reports.
#[derive(Debug)]
pub struct ClientOutcome {
    /// Warm-up checks.
    pub warmup: RudpCounts,
    /// Measured checks.
    pub measured: RudpCounts,
    /// RTT of measured messages, ns.
    pub rtt_ns: Histogram<u64>,
    /// When the last measured echo arrived, since the epoch.
    pub last_measured_echo: Option<Duration>,
    /// Protocol counters at the end of the drain.
    pub wire: RudpWire,
    /// A failure that stopped the client (connect, I/O, disconnect), if any.
    pub error: Option<String>,
}

struct InFlight {
    seq: u64,
    phase: Phase,
    sent: Instant,
}

/// Connect, report readiness on `ready`, wait for the epoch on `start`, run the phases, send
/// the outcome on `done`, then stay connected (acknowledging) until `close` is set, and close.
pub fn run_client(
    plan: ClientPlan,
    ready: Sender<Result<(), String>>,
    start: Receiver<Option<Instant>>,
    done: Sender<ClientOutcome>,
    close: Arc<AtomicBool>,
) {
    let mut outcome = ClientOutcome {
        warmup: RudpCounts::default(),
        measured: RudpCounts::default(),
        rtt_ns: new_rtt_histogram(),
        last_measured_echo: None,
        wire: RudpWire::default(),
        error: None,
    };
    let mut config = ClientConfig {
        endpoint: plan.endpoint.clone(),
        seed: Some(plan.seed),
        socket_buffer: Some(4 << 20),
        ..ClientConfig::default()
    };
    config.backend.kind = plan.backend;
    let mut client = match Client::connect_blocking(plan.server, config, Duration::from_secs(10)) {
        Ok(c) => {
            let _ = ready.send(Ok(()));
            c
        }
        Err(e) => {
            let _ = ready.send(Err(format!("client {} connect: {e}", plan.id)));
            return;
        }
    };
    let Ok(Some(epoch)) = start.recv() else {
        client.close();
        return;
    };
    if let Err(e) = echo_loop(&plan, &mut client, epoch, &mut outcome) {
        outcome.error = Some(e);
    }
    if let Some(st) = client.stats() {
        outcome.wire = RudpWire {
            bytes_sent: st.bytes_sent,
            packets_sent: st.packets_sent,
            segments_sent: st.segments_sent,
            segments_retransmitted: st.segments_retransmitted,
            packets_lost: st.packets_lost,
            rto_count: st.rto_count,
            app_bytes_sent: outcome.wire.app_bytes_sent,
            fec_recovered: st.fec.data_recovered,
            fec_parity_sent: st.fec.parity_sent,
            fec_max_parity: st.fec.max_parity as u64,
            fec_peak_retained_bytes: st.fec.peak_retained_bytes as u64,
        };
    }
    let _ = done.send(outcome);
    // Keep the connection serviced until the bench has read the server's counters.
    let limit = Instant::now() + Duration::from_secs(30);
    while !close.load(Ordering::Acquire) && Instant::now() < limit {
        if client.wait(Duration::from_millis(5)).is_err() {
            break;
        }
        while client.poll_event().is_some() {}
    }
    client.close();
    let limit = Instant::now() + Duration::from_millis(500);
    while Instant::now() < limit && client.wait(Duration::from_millis(5)).is_ok() {
        if std::iter::from_fn(|| client.poll_event())
            .any(|e| matches!(e, ClientEvent::Disconnected { .. }))
        {
            break;
        }
    }
}

fn echo_loop(
    plan: &ClientPlan,
    client: &mut Client,
    epoch: Instant,
    out: &mut ClientOutcome,
) -> Result<(), String> {
    let measured_at = epoch + plan.warmup;
    let end_at = measured_at + plan.measured;
    let drain_until = end_at + plan.drain;
    let mut in_flight: VecDeque<InFlight> = VecDeque::with_capacity(plan.window);
    let mut next_seq = 0u64;
    let mut app_sent = 0u64;
    loop {
        let now = Instant::now();
        let phase = if now < measured_at {
            Some(Phase::Warmup)
        } else if now < end_at {
            Some(Phase::Measured)
        } else {
            None
        };
        if let Some(phase) = phase {
            while in_flight.len() < plan.window {
                let h = Header {
                    client: plan.id,
                    seq: next_seq,
                    phase,
                    sent_ns: now.duration_since(epoch).as_nanos() as u64,
                };
                let counts = match phase {
                    Phase::Warmup => &mut out.warmup,
                    Phase::Measured => &mut out.measured,
                };
                let sent = Instant::now();
                match client.send(ECHO_CHANNEL, encode(&h, plan.payload)) {
                    Ok(()) => {
                        counts.sent += 1;
                        app_sent += plan.payload as u64;
                        in_flight.push_back(InFlight {
                            seq: next_seq,
                            phase,
                            sent,
                        });
                        next_seq += 1;
                    }
                    Err(e) => {
                        counts.send_errors += 1;
                        out.wire.app_bytes_sent = app_sent;
                        return Err(format!("client {} send: {e}", plan.id));
                    }
                }
            }
        } else if in_flight.is_empty() {
            break;
        } else if now >= drain_until {
            for m in &in_flight {
                match m.phase {
                    Phase::Warmup => out.warmup.lost += 1,
                    Phase::Measured => out.measured.lost += 1,
                }
            }
            break;
        }
        // Sleep until something arrives, a protocol timer, or the next phase boundary.
        let boundary = [measured_at, end_at, drain_until]
            .into_iter()
            .find(|t| *t > now)
            .unwrap_or(now);
        let wait = boundary
            .saturating_duration_since(now)
            .min(Duration::from_millis(5));
        // One submission per turn: the messages queued above and the acknowledgements the
        // last turn's arrivals called for leave together, then the wait starts.
        if let Err(e) = client.step(wait) {
            out.wire.app_bytes_sent = app_sent;
            return Err(format!("client {} I/O: {e}", plan.id));
        }
        while let Some(ev) = client.poll_event() {
            match ev {
                ClientEvent::Message { data, .. } => {
                    let at = Instant::now();
                    on_echo(plan, &data, at, epoch, &mut in_flight, out);
                }
                ClientEvent::Disconnected { reason, by_peer } => {
                    out.wire.app_bytes_sent = app_sent;
                    return Err(format!(
                        "client {} disconnected: {reason:?} (by peer: {by_peer})",
                        plan.id
                    ));
                }
                ClientEvent::Connected => {}
            }
        }
    }
    out.wire.app_bytes_sent = app_sent;
    if client.queued_bytes() != 0 {
        return Err(format!(
            "client {}: {} bytes still queued after the drain (send not complete)",
            plan.id,
            client.queued_bytes()
        ));
    }
    Ok(())
}

fn on_echo(
    plan: &ClientPlan,
    data: &[u8],
    at: Instant,
    epoch: Instant,
    in_flight: &mut VecDeque<InFlight>,
    out: &mut ClientOutcome,
) {
    let Some(h) = check(data).filter(|h| h.client == plan.id && data.len() == plan.payload) else {
        // Whose message it was is unknown: charge the oldest outstanding one's phase.
        match in_flight.front().map(|m| m.phase) {
            Some(Phase::Warmup) => out.warmup.content_errors += 1,
            _ => out.measured.content_errors += 1,
        }
        return;
    };
    // Reliable ordered: the echo must be the oldest message in flight.
    let pos = in_flight.iter().position(|m| m.seq == h.seq);
    let Some(pos) = pos else {
        // An echo of nothing outstanding: a duplicate delivery or a forged sequence.
        match h.phase {
            Phase::Warmup => out.warmup.order_errors += 1,
            Phase::Measured => out.measured.order_errors += 1,
        }
        return;
    };
    let m = in_flight.remove(pos).unwrap_or(InFlight {
        seq: h.seq,
        phase: h.phase,
        sent: at,
    });
    let c = match m.phase {
        Phase::Warmup => &mut out.warmup,
        Phase::Measured => &mut out.measured,
    };
    if pos != 0 || m.phase != h.phase {
        c.order_errors += 1;
        return;
    }
    c.echoed += 1;
    if m.phase == Phase::Measured {
        let rtt = at.duration_since(m.sent).as_nanos() as u64;
        out.rtt_ns.saturating_record(rtt.max(1));
        out.last_measured_echo = Some(at.duration_since(epoch));
    }
}
