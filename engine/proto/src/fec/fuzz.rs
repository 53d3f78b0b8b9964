//! Fuzz target bodies: functions taking arbitrary bytes that must never panic. A
//! `cargo fuzz` target calls them directly; proptests in `tests/fec_malformed.rs` and
//! `tests/fec_sliding.rs` run them too.

use std::time::{Duration, Instant};

use super::scheme::{Rx, Tx};
use super::{FecConfig, FecPolicy, FecScheme, LossReport, RetentionBudget, MAX_PENDING_REPAIRS};

/// The op loop both schemes share: each step picks an operation (send a payload, lose it,
/// forward a repair, corrupt a byte of it, inject raw bytes as data or repair, advance time
/// with a loss report). `payload_scale` sizes payloads from the op's argument. Checks after
/// every step that retention stays within `budget` and matches what the receiver holds,
/// pending repairs stay bounded, and every delivered payload fits the configured maximum.
/// Time starts at `start` (the caller's clock; nothing here reads one).
fn run_ops(
    start: Instant,
    input: &[u8],
    cfg: FecConfig,
    budget: RetentionBudget,
    payload_scale: usize,
) {
    let mut tx = Tx::new(cfg);
    let mut rx = Rx::new(cfg, budget);
    let mut now = start;
    let mut body = vec![0u8; cfg.max_parity_body()];
    let mut payload = Vec::new();
    let mut bytes = input.iter().copied();
    let check = |p: &[u8]| assert!(p.len() <= cfg.max_payload);
    while let Some(op) = bytes.next() {
        let arg = bytes.next().unwrap_or(0);
        match op % 6 {
            0 | 1 => {
                payload.clear();
                payload.extend((0..arg as usize * payload_scale).map(|i| i as u8 ^ op));
                // Bit 6 of the op: a fragment of a message of 8 with `arg % 8` more to come.
                let rest = (op & 0x40 != 0).then_some((u32::from(arg % 8), 8));
                if let Ok(n) = tx.protect(now, &payload, &mut body, rest) {
                    if op % 6 == 0 {
                        let _ = rx.receive(now, &body[..n], false, check);
                    }
                }
            }
            2 | 3 => {
                if let Some(n) = tx.poll_parity(now, &mut body) {
                    if op % 6 == 3 && n > 0 {
                        body[arg as usize % n] ^= op | 1;
                    }
                    let _ = rx.receive(now, &body[..n], true, check);
                }
            }
            4 => {
                let n = (arg as usize).min(bytes.len());
                let raw: Vec<u8> = bytes.by_ref().take(n).collect();
                let _ = rx.receive(now, &raw, op & 8 != 0, check);
            }
            _ => {
                now += Duration::from_micros(u64::from(arg) * 100);
                rx.handle_timeout(now);
                tx.on_loss_report(LossReport {
                    received: u64::from(arg),
                    lost: u64::from(op),
                    max_burst: u64::from(op & 7),
                });
            }
        }
        let held = rx.retained_bytes();
        let b = *rx.budget_mut();
        assert!(b.used() <= b.limit() && b.peak() <= b.limit());
        assert_eq!(
            b.used(),
            held,
            "the budget counts exactly what the receiver retains"
        );
        assert!(rx.pending_repairs() <= MAX_PENDING_REPAIRS);
        let _ = rx.loss_report();
    }
}

/// Drives a block-code sender and receiver from `input` (see `run_ops`). Checks that nothing
/// panics, retention stays within the (deliberately small) budget, and every delivered
/// payload fits the configured maximum.
pub fn sender_receiver_ops(start: Instant, input: &[u8]) {
    let cfg = FecConfig {
        policy: FecPolicy::Fixed { parity: 3 },
        max_payload: 300,
        max_groups: 8,
        ..FecConfig::default()
    };
    run_ops(start, input, cfg, RetentionBudget::new(2048), 2);
}

/// Like [`sender_receiver_ops`] for the sliding-window code.
pub fn sliding_ops(start: Instant, input: &[u8]) {
    let cfg = FecConfig {
        policy: FecPolicy::Fixed { parity: 4 },
        scheme: FecScheme::Sliding,
        max_payload: 300,
        ..FecConfig::default()
    };
    run_ops(start, input, cfg, RetentionBudget::new(4096), 1);
}
