//! The OpenMetrics exposition: what the workers published, encoded by `prometheus-client` at
//! each scrape (a collector, so nothing is registered or updated between scrapes).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;
use ricochet_proto::DropCause;

use super::hist::HistSnapshot;
use super::{Ops, ServiceSnapshot, SessionTotals, WorkerHealth};
use crate::runtime::WorkerCounters;

/// Everything read for one scrape.
struct Scrape {
    counters: Vec<WorkerCounters>,
    services: Vec<ServiceSnapshot>,
    rtt: Vec<HistSnapshot>,
    tick_duration: Vec<HistSnapshot>,
    tick_lateness: Vec<HistSnapshot>,
    health: super::Health,
    sessions: usize,
    limit: usize,
}

/// The collector the endpoint's registry holds.
#[derive(Debug)]
pub(crate) struct ServerCollector(pub std::sync::Arc<Ops>);

/// A snake-case label for a drop cause (`UnknownConnection` → `unknown_connection`).
fn cause_label(c: DropCause) -> String {
    let mut out = String::new();
    for (i, ch) in format!("{c:?}").chars().enumerate() {
        if ch.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(ch.to_ascii_lowercase());
        } else {
            out.push(ch);
        }
    }
    out
}

fn counter(m: MetricEncoder<'_>, v: u64) -> Result<(), std::fmt::Error> {
    ConstCounter::new(v).encode(m)
}

fn gauge(m: MetricEncoder<'_>, v: i64) -> Result<(), std::fmt::Error> {
    ConstGauge::new(v).encode(m)
}

fn histogram(mut m: MetricEncoder<'_>, h: &HistSnapshot) -> Result<(), std::fmt::Error> {
    // The encoder accumulates: hand it each bucket's own count, `+Inf` (f64::MAX) last.
    let mut buckets = Vec::with_capacity(h.buckets.len() + 1);
    let mut below = 0;
    for &(bound, cumulative) in &h.buckets {
        buckets.push((bound, cumulative - below));
        below = cumulative;
    }
    buckets.push((f64::MAX, h.count - below));
    m.encode_histogram::<NoLabelSet>(h.sum, h.count, &buckets, None)
}

impl ServerCollector {
    fn read(&self) -> Scrape {
        let ops = &self.0;
        let counters = ops
            .cells
            .iter()
            .zip(&ops.cores)
            .enumerate()
            .map(|(i, (c, core))| c.read(i, *core))
            .collect();
        Scrape {
            counters,
            services: ops.services.iter().map(|s| s.read()).collect(),
            rtt: ops.services.iter().map(|s| s.rtt.snapshot()).collect(),
            tick_duration: ops
                .cells
                .iter()
                .map(|c| c.tick_duration.snapshot())
                .collect(),
            tick_lateness: ops
                .cells
                .iter()
                .map(|c| c.tick_lateness.snapshot())
                .collect(),
            health: ops.health(),
            sessions: ops.limits.sessions(),
            limit: ops.max_sessions,
        }
    }
}

/// Encode one metric family with a series per worker.
fn per_worker<T>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    ty: MetricType,
    items: &[T],
    mut write: impl FnMut(MetricEncoder<'_>, &T) -> Result<(), std::fmt::Error>,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, unit, ty)?;
    for (i, item) in items.iter().enumerate() {
        let w = i.to_string();
        let labels = [("worker", w.as_str())];
        write(m.encode_family(&labels)?, item)?;
    }
    Ok(())
}

impl Collector for ServerCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = self.read();
        let e = &mut enc;
        let c = &s.counters;
        let sv = &s.services;
        // Server-wide.
        gauge(
            e.encode_descriptor(
                "ricochet_sessions",
                "Sessions the server holds, all workers",
                None,
                MetricType::Gauge,
            )?,
            s.sessions as i64,
        )?;
        gauge(
            e.encode_descriptor(
                "ricochet_sessions_limit",
                "Most sessions the server admits (max_sessions)",
                None,
                MetricType::Gauge,
            )?,
            s.limit as i64,
        )?;
        gauge(
            e.encode_descriptor(
                "ricochet_ready",
                "1 while the server admits new clients with every worker running, else 0",
                None,
                MetricType::Gauge,
            )?,
            i64::from(s.health.ready),
        )?;
        // Per worker.
        let g = MetricType::Gauge;
        let k = MetricType::Counter;
        let h = MetricType::Histogram;
        per_worker(
            e,
            "ricochet_worker_up",
            "1 while the worker's loop turns, 0 when stalled or ended",
            None,
            g,
            &s.health.workers,
            |m, w| gauge(m, i64::from(*w == WorkerHealth::Ok)),
        )?;
        per_worker(
            e,
            "ricochet_worker_sessions",
            "Connected sessions the worker holds",
            None,
            g,
            sv,
            |m, x| gauge(m, x.sessions as i64),
        )?;
        per_worker(e, "ricochet_worker_busy", "Time the worker's loop spent working rather than waiting (its rate is the busy fraction)", Some(&Unit::Seconds), k, c, |m, x| {
            ConstCounter::new(x.busy_ns as f64 / 1e9).encode(m)
        })?;
        per_worker(
            e,
            "ricochet_worker_loop_turns",
            "Loop turns (backend polls)",
            None,
            k,
            c,
            |m, x| counter(m, x.loop_turns),
        )?;
        per_worker(
            e,
            "ricochet_handshakes_accepted",
            "Handshakes accepted (sessions created)",
            None,
            k,
            sv,
            |m, x| counter(m, x.endpoint.accepted),
        )?;
        per_worker(
            e,
            "ricochet_challenges_sent",
            "Handshake challenges sent (renewed cookies included)",
            None,
            k,
            sv,
            |m, x| counter(m, x.endpoint.challenges_sent),
        )?;
        per_worker(
            e,
            "ricochet_cookies_renewed",
            "Cookie echoes whose cookie had expired, answered with a fresh challenge (a rate that grows says handshakes outlast the cookie lifetime)",
            None,
            k,
            sv,
            |m, x| counter(m, x.endpoint.cookies_renewed),
        )?;
        per_worker(
            e,
            "ricochet_stateless_replies_dropped",
            "Stateless replies (challenges, refusals, resets) dropped because the reply queue was full",
            None,
            k,
            sv,
            |m, x| counter(m, x.endpoint.stateless_queue_full),
        )?;
        {
            let mut m = e.encode_descriptor("ricochet_handshakes_refused", "Handshakes refused, by reason: token (invalid, expired, reused, for another server), application (Handler::on_accept), other (full, draining, per-address limits)", None, k)?;
            for (i, x) in sv.iter().enumerate() {
                let w = i.to_string();
                let ep = &x.endpoint;
                let other = ep
                    .refusals_sent
                    .saturating_sub(ep.token_refusals + ep.rejected);
                for (reason, v) in [
                    ("token", ep.token_refusals),
                    ("application", ep.rejected),
                    ("other", other),
                ] {
                    counter(
                        m.encode_family(&[("worker", w.as_str()), ("reason", reason)])?,
                        v,
                    )?;
                }
            }
        }
        per_worker(
            e,
            "ricochet_datagrams_received",
            "Datagrams received",
            None,
            k,
            c,
            |m, x| counter(m, x.datagrams_in),
        )?;
        per_worker(
            e,
            "ricochet_datagrams_sent",
            "Datagrams the kernel accepted for sending",
            None,
            k,
            c,
            |m, x| counter(m, x.datagrams_out),
        )?;
        per_worker(
            e,
            "ricochet_received",
            "UDP payload bytes received",
            Some(&Unit::Bytes),
            k,
            c,
            |m, x| counter(m, x.bytes_in),
        )?;
        per_worker(
            e,
            "ricochet_sent",
            "UDP payload bytes the protocol wrote for sending",
            Some(&Unit::Bytes),
            k,
            sv,
            |m, x| counter(m, x.bytes_out),
        )?;
        {
            let mut m = e.encode_descriptor("ricochet_dropped_datagrams", "Datagrams dropped, by cause: the protocol's causes, socket_overflow (the kernel's drops on the worker's socket, where the platform counts them), truncated", None, k)?;
            for (i, (x, wc)) in sv.iter().zip(c).enumerate() {
                let w = i.to_string();
                for cause in DropCause::ALL {
                    let label = cause_label(cause);
                    counter(
                        m.encode_family(&[("worker", w.as_str()), ("cause", label.as_str())])?,
                        x.endpoint.drops.get(cause),
                    )?;
                }
                counter(
                    m.encode_family(&[("worker", w.as_str()), ("cause", "socket_overflow")])?,
                    wc.socket_drops,
                )?;
                counter(
                    m.encode_family(&[("worker", w.as_str()), ("cause", "truncated")])?,
                    wc.truncated,
                )?;
            }
        }
        per_worker(
            e,
            "ricochet_send_errors",
            "Sends refused by the send batch or failed in the kernel",
            None,
            k,
            c,
            |m, x| counter(m, x.send_errors),
        )?;
        let totals: Vec<SessionTotals> = sv.iter().map(|x| x.totals).collect();
        per_worker(
            e,
            "ricochet_packets_lost",
            "Packets the sessions declared lost",
            None,
            k,
            &totals,
            |m, x| counter(m, x.packets_lost),
        )?;
        per_worker(
            e,
            "ricochet_retransmissions",
            "Reliable fragments sent again (retransmissions and tail-loss probes)",
            None,
            k,
            &totals,
            |m, x| counter(m, x.retransmitted),
        )?;
        per_worker(
            e,
            "ricochet_fec_parity_sent",
            "FEC parity packets sent (both codes)",
            None,
            k,
            &totals,
            |m, x| counter(m, x.fec_parity_sent),
        )?;
        // The old name of the family above ("repair" now names only the sliding-window
        // code's symbol), kept for one release so that dashboards can move.
        per_worker(
            e,
            "ricochet_fec_repairs_sent",
            "Deprecated: renamed ricochet_fec_parity_sent",
            None,
            k,
            &totals,
            |m, x| counter(m, x.fec_parity_sent),
        )?;
        per_worker(
            e,
            "ricochet_fec_recovered",
            "Lost datagrams FEC rebuilt before ARQ had to",
            None,
            k,
            &totals,
            |m, x| counter(m, x.fec_recovered),
        )?;
        per_worker(
            e,
            "ricochet_rtt",
            "Round-trip time samples of the worker's sessions",
            Some(&Unit::Seconds),
            h,
            &s.rtt,
            histogram,
        )?;
        per_worker(
            e,
            "ricochet_tick_duration",
            "How long each tick's handler ran",
            Some(&Unit::Seconds),
            h,
            &s.tick_duration,
            histogram,
        )?;
        per_worker(
            e,
            "ricochet_tick_lateness",
            "How long after its due time each tick ran",
            Some(&Unit::Seconds),
            h,
            &s.tick_lateness,
            histogram,
        )?;
        per_worker(
            e,
            "ricochet_ticks_skipped",
            "Tick due times that passed without a tick (the worker was busy)",
            None,
            k,
            c,
            |m, x| counter(m, x.ticks_skipped),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn drop_causes_read_as_snake_case() {
        use ricochet_proto::DropCause;
        assert_eq!(
            super::cause_label(DropCause::UnknownConnection),
            "unknown_connection"
        );
        assert_eq!(super::cause_label(DropCause::Malformed), "malformed");
    }
}
