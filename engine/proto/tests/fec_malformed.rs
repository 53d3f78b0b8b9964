//! Malformed FEC bodies are dropped with a typed error and counted, and never disturb a valid
//! stream that follows; the fuzz target body runs under proptest.

use std::time::Instant;

use proptest::prelude::*;
use ricochet_proto::fec::{fuzz, FecConfig, FecError, FecPolicy, FecReceiver, FecSender};

#[derive(Clone, Copy)]
enum Kind {
    Data,
    Parity,
}

/// A parity body: first_seq, data, parity, index, codec, then `len` shard bytes.
fn parity(first: u16, k: u8, m: u8, idx: u8, codec: u8, len: usize) -> Vec<u8> {
    let mut b = first.to_le_bytes().to_vec();
    b.extend([k, m, idx, codec]);
    b.resize(6 + len, 0);
    b
}

fn data(seq: u16, index_byte: u8, len: usize) -> Vec<u8> {
    let mut b = seq.to_le_bytes().to_vec();
    b.push(index_byte);
    b.resize(3 + len, 7);
    b
}

#[test]
fn malformed_bodies_are_dropped_and_counted() {
    let cfg = FecConfig::default().with(|c| c.policy = FecPolicy::Fixed { parity: 2 });
    let now = Instant::now();
    let mut rx = FecReceiver::new(cfg);
    let nothing = |_: &[u8]| panic!("a malformed body delivered something");
    // Establish group 0 (seqs 0..8) as protected with 100-byte coded shards, via real parity.
    let mut tx = FecSender::new(cfg);
    let mut body = vec![0u8; cfg.max_parity_body()];
    let mut delivered = 0;
    for i in 0..8u8 {
        let n = tx.protect(now, &[i; 98], &mut body).unwrap();
        if i != 7 {
            rx.on_data(now, &body[..n], |_| delivered += 1).unwrap();
        }
    }
    let n = tx.poll_parity(now, &mut body).unwrap();
    let good_parity = body[..n].to_vec();
    // Group 1 starts (seq 8), which bounds group 0 to 8 shards.
    let n = tx.protect(now, &[8; 10], &mut body).unwrap();
    rx.on_data(now, &body[..n], |_| delivered += 1).unwrap();
    assert_eq!(delivered, 8);

    let max = cfg.max_payload;
    let table: Vec<(&str, Kind, Vec<u8>, FecError)> = vec![
        ("empty data", Kind::Data, vec![], FecError::Truncated),
        ("2-byte data", Kind::Data, vec![1, 2], FecError::Truncated),
        (
            "reserved bit",
            Kind::Data,
            data(20, 0x40, 5),
            FecError::ReservedBits,
        ),
        (
            "huge payload",
            Kind::Data,
            data(20, 0, max + 1),
            FecError::LengthTooLarge,
        ),
        (
            "short parity",
            Kind::Parity,
            vec![0, 0, 8, 2, 0],
            FecError::Truncated,
        ),
        (
            "parity without shard",
            Kind::Parity,
            parity(0, 8, 2, 0, 0, 1),
            FecError::Truncated,
        ),
        (
            "zero data shards",
            Kind::Parity,
            parity(0, 0, 2, 0, 0, 100),
            FecError::BadShape,
        ),
        (
            "65 data shards",
            Kind::Parity,
            parity(0, 65, 2, 0, 0, 100),
            FecError::BadShape,
        ),
        (
            "zero parity shards",
            Kind::Parity,
            parity(0, 8, 0, 0, 0, 100),
            FecError::BadShape,
        ),
        (
            "33 parity shards",
            Kind::Parity,
            parity(0, 8, 33, 0, 0, 100),
            FecError::BadShape,
        ),
        (
            "parity index out of range",
            Kind::Parity,
            parity(0, 8, 2, 2, 0, 100),
            FecError::IndexOutOfRange,
        ),
        (
            "unknown codec",
            Kind::Parity,
            parity(0, 8, 2, 0, 9, 100),
            FecError::UnknownCodec,
        ),
        (
            "odd reed-solomon-simd shard",
            Kind::Parity,
            parity(0, 8, 2, 0, 1, 101),
            FecError::Truncated,
        ),
        (
            "huge parity shard",
            Kind::Parity,
            parity(0, 8, 2, 0, 0, max + 4),
            FecError::LengthTooLarge,
        ),
        (
            "parity for a group far ahead",
            Kind::Parity,
            parity(5000, 8, 2, 0, 0, 100),
            FecError::UnknownGroup,
        ),
        (
            "parity bigger than group bound",
            Kind::Parity,
            parity(0, 9, 2, 0, 0, 100),
            FecError::InconsistentGroup,
        ),
        (
            "parity shorter than a data shard",
            Kind::Parity,
            parity(0, 8, 2, 0, 0, 50),
            FecError::InconsistentGroup,
        ),
        (
            "parity overlapping a group",
            Kind::Parity,
            parity(3, 8, 2, 0, 0, 100),
            FecError::InconsistentGroup,
        ),
    ];
    let mut count = 0;
    for (name, kind, b, want) in &table {
        let got = match kind {
            Kind::Data => rx.on_data(now, b, nothing),
            Kind::Parity => rx.on_parity(now, b, nothing),
        };
        assert_eq!(got, Err(*want), "{name}");
        count += 1;
        assert_eq!(rx.stats().malformed.total(), count, "{name} counted");
    }
    let m = rx.stats().malformed;
    assert_eq!(m.truncated, 5);
    assert_eq!(m.bad_shape, 4);
    assert_eq!(m.inconsistent, 3);
    assert_eq!(m.unknown_group, 1);

    // The real parity still rebuilds shard 7 with its true length.
    let mut rebuilt = Vec::new();
    rx.on_parity(now, &good_parity, |p| rebuilt.push(p.to_vec()))
        .unwrap();
    assert_eq!(rebuilt, vec![vec![7u8; 98]]);

    // Once the group's shape is known, contradicting shards are refused.
    let mut tx2 = FecSender::new(cfg);
    let mut rx2 = FecReceiver::new(cfg);
    let mut shards = Vec::new();
    for i in 1..=4u8 {
        let n = tx2.protect(now, &[i; 40], &mut body).unwrap();
        shards.push(body[..n].to_vec());
    }
    // 4 × 43 B of data allow one 48 B parity body under the 50% cap.
    let n = tx2.poll_parity(now + cfg.group_wait, &mut body).unwrap();
    assert_eq!(n, 48);
    assert_eq!(tx2.poll_parity(now + cfg.group_wait, &mut body), None);
    rx2.on_parity(now, &body[..n], nothing).unwrap();
    let bad = [
        (data(4, 0x80 | 4, 10), FecError::IndexOutOfRange),
        (data(1, 0x80 | 1, 60), FecError::InconsistentGroup),
        (data(1, 1, 10), FecError::InconsistentGroup),
    ];
    for (b, want) in &bad {
        assert_eq!(rx2.on_data(now, b, nothing), Err(*want));
    }
    let mut got = Vec::new();
    for s in &shards[..3] {
        rx2.on_data(now, s, |p| got.push(p.to_vec())).unwrap();
    }
    assert_eq!(got, (1..=4u8).map(|i| vec![i; 40]).collect::<Vec<_>>());
    assert_eq!(rx2.stats().data_recovered, 1);
    assert_eq!(rx2.stats().malformed.total(), 3);
}

#[test]
fn fuzz_body_handles_seeded_inputs() {
    // Some fixed shapes first: empty, all-zero, all-ones, a long valid-looking run.
    fuzz::sender_receiver_ops(std::time::Instant::now(), &[]);
    fuzz::sender_receiver_ops(std::time::Instant::now(), &[0; 4096]);
    fuzz::sender_receiver_ops(std::time::Instant::now(), &[0xff; 4096]);
    let run: Vec<u8> = (0..4000u32).map(|i| (i * 7 % 251) as u8).collect();
    fuzz::sender_receiver_ops(std::time::Instant::now(), &run);
}

proptest! {
    // A fixed seed keeps the test deterministic; change it to explore new inputs.
    #![proptest_config(ProptestConfig {
        cases: 256,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0xFEC1),
        ..ProptestConfig::default()
    })]

    #[test]
    fn fuzz_body_never_panics(input in proptest::collection::vec(any::<u8>(), 0..3000)) {
        fuzz::sender_receiver_ops(std::time::Instant::now(), &input);
    }
}
