//! `bench fec`: encode and recover time per group for each erasure codec and SIMD level.
//!
//! For every group shape (`8+2`, `8+4`, `16+4` by default) and shard size (64 B and 1,174 B),
//! it times, per codec and forced SIMD level: encoding all parity, recovering one lost data
//! shard, recovering `parity` lost data shards (the worst case), and the same with the
//! inverse-matrix cache defeated (what a never-seen erasure pattern costs). Each figure is the
//! median over `--iters` samples; a sample times enough back-to-back operations to last a few
//! microseconds, so timer resolution does not matter. Every recovery is checked once against
//! the original data before timing.

use bench::commands::Global;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use bench::host::{command_line, BuildInfo, HostInfo, UtcTime};
use ricochet_proto::fec::{CauchyCodec, Codec, Kernel, RsSimdCodec, SimdLevel};
use serde::Serialize;

/// Options of `bench fec`.
#[derive(clap::Args, Debug, Clone)]
pub struct FecArgs {
    /// Timed samples per figure; the median is reported.
    #[arg(long, default_value_t = 1000)]
    pub iters: usize,
    /// Group shapes as DATA+PARITY, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "8+2,8+4,16+4")]
    pub shapes: Vec<String>,
    /// Shard sizes in bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "64,1174")]
    pub sizes: Vec<usize>,
}

/// One codec configuration's figures for one shape and size.
#[derive(Serialize, Debug, Clone)]
struct Row {
    codec: &'static str,
    simd: &'static str,
    data_shards: usize,
    parity_shards: usize,
    shard_bytes: usize,
    encode_ns: f64,
    recover_1_ns: f64,
    recover_max_ns: f64,
    recover_max_uncached_ns: Option<f64>,
}

#[derive(Serialize)]
struct Report<'a> {
    kind: &'static str,
    created_unix_s: u64,
    created_utc: String,
    command: String,
    host: HostInfo,
    build: BuildInfo,
    simd_levels: Vec<&'static str>,
    iters: usize,
    results: &'a [Row],
}

/// A codec under test: a name, a SIMD label, and how to make one.
struct Variant {
    codec: &'static str,
    simd: &'static str,
    make: Box<dyn Fn(usize) -> Box<dyn Codec>>,
    /// Shard lengths must be a multiple of this.
    multiple: usize,
    /// Whether a recipe-cache-defeating codec can be made (cache capacity 1).
    uncached: Option<Kernel>,
}

fn variants() -> Vec<Variant> {
    let mut v = Vec::new();
    for level in [
        SimdLevel::Scalar,
        SimdLevel::Ssse3,
        SimdLevel::Avx2,
        SimdLevel::Neon,
    ] {
        let Some(kernel) = Kernel::new(level) else {
            continue;
        };
        v.push(Variant {
            codec: "cauchy-gf256",
            simd: level.name(),
            make: Box::new(move |cap| Box::new(CauchyCodec::with_kernel(kernel, cap))),
            multiple: 1,
            uncached: Some(kernel),
        });
    }
    v.push(Variant {
        codec: "reed-solomon-simd",
        simd: "auto",
        make: Box::new(|_| Box::new(RsSimdCodec::new())),
        multiple: 2,
        uncached: None,
    });
    v
}

/// Median time of one `op`, over `iters` samples of a calibrated batch (also `bench crypto`).
pub(crate) fn median_ns(iters: usize, mut op: impl FnMut()) -> f64 {
    // Calibrate: how many ops fill ~5 µs.
    let mut batch = 1usize;
    loop {
        let t = Instant::now();
        for _ in 0..batch {
            op();
        }
        if t.elapsed() >= Duration::from_micros(5) || batch >= 1 << 16 {
            break;
        }
        batch *= 2;
    }
    let mut samples: Vec<f64> = (0..iters.max(1))
        .map(|_| {
            let t = Instant::now();
            for _ in 0..batch {
                op();
            }
            t.elapsed().as_nanos() as f64 / batch as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn parse_shape(s: &str) -> Result<(usize, usize)> {
    let (k, m) = s
        .split_once('+')
        .with_context(|| format!("shape {s:?} is not DATA+PARITY"))?;
    Ok((k.trim().parse()?, m.trim().parse()?))
}

/// Deterministic shard contents (xorshift), so runs are comparable.
fn fill(shards: &mut [Vec<u8>], seed: u64) {
    let mut x = seed | 1;
    for s in shards {
        for b in s.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
    }
}

/// Marks `lost` missing (zeroing them) and rebuilds them.
fn recover(codec: &mut dyn Codec, shards: &mut [Vec<u8>], k: usize, lost: &[usize]) -> Result<()> {
    let mut present = vec![true; shards.len()];
    for &i in lost {
        present[i] = false;
        shards[i].fill(0);
    }
    let mut refs: Vec<&mut [u8]> = shards.iter_mut().map(|s| s.as_mut_slice()).collect();
    codec.reconstruct(k, &mut refs, &present)?;
    Ok(())
}

/// Times one codec variant on one shape and size.
fn measure(v: &Variant, k: usize, m: usize, size: usize, iters: usize) -> Result<Row> {
    let len = size.div_ceil(v.multiple) * v.multiple;
    let mut codec = (v.make)(256);
    let mut data = vec![vec![0u8; len]; k];
    fill(&mut data, (k * 131 + m * 17 + len) as u64);
    let mut parity = vec![vec![0u8; len]; m];
    let data_refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    {
        let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
        codec.encode(&data_refs, &mut outs)?;
    }
    let encode_ns = median_ns(iters, || {
        let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
        let _ = codec.encode(&data_refs, &mut outs);
    });
    let mut shards: Vec<Vec<u8>> = data.iter().chain(&parity).cloned().collect();
    let one = [k / 2];
    let max: Vec<usize> = (0..m.min(k)).collect();
    // Check correctness once, then time.
    for lost in [&one[..], &max[..]] {
        recover(codec.as_mut(), &mut shards, k, lost)?;
        for (i, d) in data.iter().enumerate() {
            ensure!(
                shards[i] == *d,
                "{} {}: shard {i} not recovered",
                v.codec,
                v.simd
            );
        }
    }
    let recover_1_ns = median_ns(iters, || {
        let _ = recover(codec.as_mut(), &mut shards, k, &one);
    });
    let recover_max_ns = median_ns(iters, || {
        let _ = recover(codec.as_mut(), &mut shards, k, &max);
    });
    // Alternate two patterns through a one-entry cache: every call inverts a matrix.
    let recover_max_uncached_ns = match v.uncached {
        Some(kernel) => {
            let mut c = CauchyCodec::with_kernel(kernel, 1);
            let other: Vec<usize> = (1..=m.min(k)).map(|i| i % k).collect();
            let mut flip = false;
            Some(median_ns(iters, || {
                flip = !flip;
                let _ = recover(&mut c, &mut shards, k, if flip { &max } else { &other });
            }))
        }
        None => None,
    };
    Ok(Row {
        codec: v.codec,
        simd: v.simd,
        data_shards: k,
        parity_shards: m,
        shard_bytes: len,
        encode_ns,
        recover_1_ns,
        recover_max_ns,
        recover_max_uncached_ns,
    })
}

fn us(ns: f64) -> String {
    format!("{:.3}", ns / 1000.0)
}

/// Runs `bench fec`: prints the table and writes the JSON (`--json`, `--archive`, `--results-dir`).
pub fn run(args: &FecArgs, out: &Global) -> Result<()> {
    if cfg!(debug_assertions) {
        eprintln!("warning: debug build; run with --release for meaningful figures");
    }
    let shapes = args
        .shapes
        .iter()
        .map(|s| parse_shape(s))
        .collect::<Result<Vec<_>>>()?;
    if shapes.is_empty() || args.sizes.is_empty() {
        bail!("no shapes or sizes to measure");
    }
    let mut rows = Vec::new();
    println!(
        "{:<18} {:<7} {:>6} {:>7} {:>10} {:>12} {:>14} {:>14}",
        "codec",
        "simd",
        "group",
        "shard B",
        "encode µs",
        "recover 1 µs",
        "recover max µs",
        "uncached µs"
    );
    for &(k, m) in &shapes {
        for &size in &args.sizes {
            for v in variants() {
                let r = measure(&v, k, m, size, args.iters)
                    .with_context(|| format!("{} {} {k}+{m} {size} B", v.codec, v.simd))?;
                println!(
                    "{:<18} {:<7} {:>6} {:>7} {:>10} {:>12} {:>14} {:>14}",
                    r.codec,
                    r.simd,
                    format!("{k}+{m}"),
                    r.shard_bytes,
                    us(r.encode_ns),
                    us(r.recover_1_ns),
                    us(r.recover_max_ns),
                    r.recover_max_uncached_ns.map_or("-".into(), us),
                );
                rows.push(r);
            }
        }
    }
    {
        let now = UtcTime::now();
        let path = &out.path_for("fec-codecs", &now);
        let report = Report {
            kind: "fec-codecs",
            created_unix_s: now.unix_s,
            created_utc: now.iso(),
            command: command_line(),
            host: HostInfo::collect(),
            build: BuildInfo::collect(),
            simd_levels: SimdLevel::supported()
                .into_iter()
                .map(|l| l.name())
                .collect(),
            iters: args.iters,
            results: &rows,
        };
        bench::output::write_json(&report, path)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_measures_and_verifies() {
        for v in variants() {
            let r = measure(&v, 3, 2, 33, 3).unwrap();
            assert_eq!(r.shard_bytes % v.multiple, 0);
            assert!(r.encode_ns > 0.0 && r.recover_1_ns > 0.0);
        }
        assert!(parse_shape("8+x").is_err());
        assert_eq!(parse_shape("16+4").unwrap(), (16, 4));
    }
}
