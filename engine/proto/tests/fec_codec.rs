//! Codec properties: every erasure pattern of up to `parity` shards is recovered, by both
//! codecs and at every SIMD level this CPU supports, for several group shapes and odd sizes.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ricochet_proto::fec::{CauchyCodec, Codec, CodecError, RsSimdCodec, SimdLevel};

fn random_group(rng: &mut ChaCha8Rng, k: usize, len: usize) -> Vec<Vec<u8>> {
    (0..k)
        .map(|_| (0..len).map(|_| rng.random()).collect())
        .collect()
}

fn encode(codec: &mut dyn Codec, data: &[Vec<u8>], m: usize) -> Vec<Vec<u8>> {
    let len = data[0].len();
    let mut parity = vec![vec![0u8; len]; m];
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
    codec.encode(&refs, &mut outs).unwrap();
    parity
}

/// Erases the shards in `lost` (overwriting them with garbage), reconstructs, and checks every
/// data shard equals the original.
fn check_recovers(codec: &mut dyn Codec, data: &[Vec<u8>], parity: &[Vec<u8>], lost: &[usize]) {
    let k = data.len();
    let mut shards: Vec<Vec<u8>> = data.iter().chain(parity).cloned().collect();
    let mut present = vec![true; shards.len()];
    for &i in lost {
        present[i] = false;
        shards[i].iter_mut().for_each(|b| *b = 0xA5);
    }
    let mut refs: Vec<&mut [u8]> = shards.iter_mut().map(|s| s.as_mut_slice()).collect();
    codec
        .reconstruct(k, &mut refs, &present)
        .unwrap_or_else(|e| panic!("{:?} lost {lost:?}: {e}", codec.id()));
    for (i, d) in data.iter().enumerate() {
        assert_eq!(&shards[i], d, "{:?} shard {i} lost {lost:?}", codec.id());
    }
}

/// Calls `f` with every subset of `0..n` of size at most `max`.
fn for_each_subset(n: usize, max: usize, f: &mut dyn FnMut(&[usize])) {
    fn rec(start: usize, n: usize, max: usize, cur: &mut Vec<usize>, f: &mut dyn FnMut(&[usize])) {
        f(cur);
        if cur.len() == max {
            return;
        }
        for i in start..n {
            cur.push(i);
            rec(i + 1, n, max, cur, f);
            cur.pop();
        }
    }
    rec(0, n, max, &mut Vec::new(), f);
}

fn cauchy_codecs() -> Vec<CauchyCodec> {
    SimdLevel::supported()
        .into_iter()
        .map(|l| CauchyCodec::with_level(l).unwrap())
        .collect()
}

#[test]
fn cauchy_recovers_every_erasure_pattern() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for (k, m) in [(1, 1), (2, 1), (3, 2), (8, 2), (8, 4), (16, 4)] {
        for len in [1, 37, 67] {
            let data = random_group(&mut rng, k, len);
            let mut codecs = cauchy_codecs();
            let parity = encode(&mut codecs[0], &data, m);
            // Every level encodes bit-identically.
            for c in &mut codecs[1..] {
                assert_eq!(encode(c, &data, m), parity, "{:?}", c.level());
            }
            let mut patterns = 0;
            for_each_subset(k + m, m, &mut |lost| {
                patterns += 1;
                for c in &mut codecs {
                    check_recovers(c, &data, &parity, lost);
                }
            });
            assert!(patterns > k + m);
        }
    }
}

#[test]
fn cauchy_parity_zero_is_xor_of_data() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let data = random_group(&mut rng, 8, 100);
    let parity = encode(&mut CauchyCodec::new(), &data, 2);
    let mut xor = vec![0u8; 100];
    for d in &data {
        xor.iter_mut().zip(d).for_each(|(x, b)| *x ^= b);
    }
    assert_eq!(parity[0], xor);
    assert_ne!(parity[1], xor);
}

#[test]
fn too_many_erasures_fail_cleanly() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let data = random_group(&mut rng, 8, 64);
    for codec in [
        &mut CauchyCodec::new() as &mut dyn Codec,
        &mut RsSimdCodec::new() as &mut dyn Codec,
    ] {
        let parity = encode(codec, &data, 2);
        let mut shards: Vec<Vec<u8>> = data.iter().chain(&parity).cloned().collect();
        let mut present = vec![true; 10];
        present[0] = false;
        present[3] = false;
        present[9] = false;
        let mut refs: Vec<&mut [u8]> = shards.iter_mut().map(|s| s.as_mut_slice()).collect();
        assert!(matches!(
            codec.reconstruct(8, &mut refs, &present),
            Err(CodecError::TooFewShards {
                present: 7,
                needed: 8
            })
        ));
    }
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let mut c = CauchyCodec::new();
    let a = [1u8; 4];
    let b = [1u8; 5];
    let mut p = [0u8; 4];
    assert_eq!(
        c.encode(&[&a, &b], &mut [&mut p]),
        Err(CodecError::ShardLength)
    );
    assert!(matches!(
        c.encode(&[], &mut [&mut p]),
        Err(CodecError::Unsupported { .. })
    ));
    let mut r = RsSimdCodec::new();
    let odd = [1u8; 3];
    let mut p3 = [0u8; 3];
    assert_eq!(
        r.encode(&[&odd], &mut [&mut p3]),
        Err(CodecError::ShardLength)
    );
    let mut shards: Vec<&mut [u8]> = vec![];
    assert!(c.reconstruct(2, &mut shards, &[]).is_err());
}

#[test]
fn recipe_cache_is_bounded_and_reused() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let data = random_group(&mut rng, 8, 16);
    let mut c = CauchyCodec::with_kernel(ricochet_proto::fec::Kernel::detect(), 4);
    let parity = encode(&mut c, &data, 4);
    for_each_subset(12, 4, &mut |lost| {
        check_recovers(&mut c, &data, &parity, lost)
    });
    assert!(c.cache_len() <= 4);
    let (_, misses_before) = c.cache_stats();
    check_recovers(&mut c, &data, &parity, &[2]);
    check_recovers(&mut c, &data, &parity, &[2]);
    let (hits, misses) = c.cache_stats();
    assert!(misses <= misses_before + 1);
    assert!(hits > 0);
}

proptest! {
    // A fixed seed keeps the test deterministic; change it to explore new inputs.
    #![proptest_config(ProptestConfig {
        cases: 48,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0xFEC0),
        ..ProptestConfig::default()
    })]

    /// Both codecs rebuild the same data for the same random erasures, at game-sized shards.
    #[test]
    fn codecs_agree(shape in prop::sample::select(vec![(8usize, 2usize), (8, 4), (16, 4), (5, 3)]),
                    half_len in 1usize..700, seed in any::<u64>()) {
        let (k, m) = shape;
        let len = half_len * 2; // reed-solomon-simd needs even lengths
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let data = random_group(&mut rng, k, len);
        let mut lost: Vec<usize> = (0..k + m).collect();
        for i in (1..lost.len()).rev() {
            lost.swap(i, rng.random_range(0..=i));
        }
        let n_lost = rng.random_range(0..=m);
        lost.truncate(n_lost);
        let mut rs = RsSimdCodec::new();
        let rs_parity = encode(&mut rs, &data, m);
        check_recovers(&mut rs, &data, &rs_parity, &lost);
        for mut c in cauchy_codecs() {
            let parity = encode(&mut c, &data, m);
            check_recovers(&mut c, &data, &parity, &lost);
        }
    }

    /// Odd sizes at 1,174 B-class lengths for the Cauchy codec at every level.
    #[test]
    fn cauchy_large_odd_shards(len in (500usize..1200).prop_map(|l| l | 1), seed in any::<u64>()) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let data = random_group(&mut rng, 8, len);
        let lost = [rng.random_range(0..8), 8 + rng.random_range(0..2)];
        for mut c in cauchy_codecs() {
            let parity = encode(&mut c, &data, 2);
            check_recovers(&mut c, &data, &parity, &lost[..1]);
            let two = [lost[0], (lost[0] + 3) % 8];
            check_recovers(&mut c, &data, &parity, &two);
        }
    }
}
