//! Fuzz target bodies: functions taking arbitrary bytes that must never panic. A
//! `cargo fuzz` target calls them directly; a proptest in `tests/fec_fuzz.rs` runs them too.

use std::time::{Duration, Instant};

use super::{
    FecConfig, FecPolicy, FecReceiver, FecScheme, FecSender, RetentionBudget, SlidingReceiver,
    SlidingSender, MAX_PENDING_REPAIRS,
};

/// Drives a sender and a receiver from `input`: each step picks an operation (send a payload,
/// lose it, forward parity, corrupt a byte of it, inject raw bytes as data or parity, advance
/// time). Checks that nothing panics, retention stays within the (deliberately small) budget,
/// and every delivered payload fits the configured maximum.
pub fn sender_receiver_ops(input: &[u8]) {
    let cfg = FecConfig {
        policy: FecPolicy::Fixed { parity: 3 },
        max_payload: 300,
        max_groups: 8,
        ..FecConfig::default()
    };
    let budget = RetentionBudget::new(2048);
    let mut tx = FecSender::new(cfg);
    let mut rx = FecReceiver::with_budget(cfg, budget.clone());
    let mut now = Instant::now();
    let mut body = vec![0u8; cfg.max_parity_body()];
    let mut payload = Vec::new();
    let mut bytes = input.iter().copied();
    let check = |p: &[u8]| assert!(p.len() <= cfg.max_payload);
    while let Some(op) = bytes.next() {
        let arg = bytes.next().unwrap_or(0);
        match op % 6 {
            0 | 1 => {
                payload.clear();
                payload.extend((0..arg as usize * 2).map(|i| i as u8 ^ op));
                if let Ok(n) = tx.protect(now, &payload, &mut body) {
                    if op % 6 == 0 {
                        let _ = rx.on_data(now, &body[..n], check);
                    }
                }
            }
            2 | 3 => {
                if let Some(n) = tx.poll_parity(now, &mut body) {
                    if op % 6 == 3 && n > 0 {
                        body[arg as usize % n] ^= op | 1;
                    }
                    let _ = rx.on_parity(now, &body[..n], check);
                }
            }
            4 => {
                let n = (arg as usize).min(bytes.len());
                let raw: Vec<u8> = bytes.by_ref().take(n).collect();
                let _ = if op & 8 == 0 {
                    rx.on_data(now, &raw, check)
                } else {
                    rx.on_parity(now, &raw, check)
                };
            }
            _ => {
                now += Duration::from_micros(u64::from(arg) * 100);
                rx.handle_timeout(now);
                tx.on_loss_report(u64::from(arg), u64::from(op));
            }
        }
        assert!(budget.used() <= budget.limit());
        assert!(rx.stats().retained_bytes <= budget.limit());
        let _ = rx.loss_report();
    }
    drop(rx);
    assert_eq!(budget.used(), 0, "a dropped receiver returns its bytes");
}

/// Like [`sender_receiver_ops`] for the sliding-window code: sends sources, loses some,
/// forwards repair bodies (some corrupted), injects raw bytes as data or repair bodies and
/// advances time. Checks that nothing panics, retention stays within the (deliberately small)
/// budget, pending repairs stay bounded, and every delivered payload fits the configured
/// maximum.
pub fn sliding_ops(input: &[u8]) {
    let cfg = FecConfig {
        policy: FecPolicy::Fixed { parity: 4 },
        scheme: FecScheme::Sliding,
        max_payload: 300,
        ..FecConfig::default()
    };
    let budget = RetentionBudget::new(4096);
    let mut tx = SlidingSender::new(cfg);
    let mut rx = SlidingReceiver::with_budget(cfg, budget.clone());
    let mut now = Instant::now();
    let mut body = vec![0u8; cfg.max_parity_body()];
    let mut payload = Vec::new();
    let mut bytes = input.iter().copied();
    let check = |p: &[u8]| assert!(p.len() <= cfg.max_payload);
    while let Some(op) = bytes.next() {
        let arg = bytes.next().unwrap_or(0);
        match op % 6 {
            0 | 1 => {
                payload.clear();
                payload.extend((0..arg as usize).map(|i| i as u8 ^ op));
                if let Ok(n) = tx.protect(now, &payload, &mut body) {
                    if op % 6 == 0 {
                        let _ = rx.on_data(now, &body[..n], check);
                    }
                }
            }
            2 | 3 => {
                if let Some(n) = tx.poll_parity(now, &mut body) {
                    if op % 6 == 3 && n > 0 {
                        body[arg as usize % n] ^= op | 1;
                    }
                    let _ = rx.on_parity(now, &body[..n], check);
                }
            }
            4 => {
                let n = (arg as usize).min(bytes.len());
                let raw: Vec<u8> = bytes.by_ref().take(n).collect();
                let _ = if op & 8 == 0 {
                    rx.on_data(now, &raw, check)
                } else {
                    rx.on_parity(now, &raw, check)
                };
            }
            _ => {
                now += Duration::from_micros(u64::from(arg) * 100);
                rx.handle_timeout(now);
                tx.on_loss_report_detail(super::LossReport {
                    received: u64::from(arg),
                    lost: u64::from(op),
                    max_burst: u64::from(op & 7),
                });
            }
        }
        assert!(budget.used() <= budget.limit());
        assert!(rx.stats().retained_bytes <= budget.limit());
        assert!(rx.pending_repairs() <= MAX_PENDING_REPAIRS);
        let _ = rx.loss_report_detail();
    }
    drop(rx);
    assert_eq!(budget.used(), 0, "a dropped receiver returns its bytes");
}
