//! Erasure codecs behind one small trait: our GF(2^8) systematic Cauchy codec (fast for the
//! small groups a game sends) and a wrapper around `reed-solomon-simd` (GF(2^16), for large
//! groups).

use std::collections::HashMap;

use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};

use super::gf;
use super::kernel::{Kernel, SimdLevel};

pub use super::header::{CodecId, MAX_DATA_SHARDS, MAX_PARITY_SHARDS};

/// Why a codec call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The codec does not support this many data / parity shards.
    #[error("unsupported group shape: {data} data + {parity} parity shards")]
    Unsupported {
        /// Data shards asked for.
        data: usize,
        /// Parity shards asked for.
        parity: usize,
    },
    /// Shards differ in length, are empty, or have a length the codec cannot take.
    #[error("bad shard length")]
    ShardLength,
    /// Fewer shards present than data shards: nothing can be rebuilt.
    #[error("too few shards: {present} present, {needed} needed")]
    TooFewShards {
        /// Shards present.
        present: usize,
        /// Shards needed (the data shard count).
        needed: usize,
    },
    /// The backing library refused the input.
    #[error("codec backend: {0}")]
    Backend(String),
}

/// An erasure codec for groups of equal-length shards.
pub trait Codec {
    /// Which codec this is.
    fn id(&self) -> CodecId;

    /// Computes `parity.len()` parity shards from `data`. All slices have the same length.
    fn encode(&mut self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError>;

    /// Rebuilds the missing data shards of a group. `shards` holds the `data_shards` data
    /// shards followed by the parity shards, all the same length; `present[i]` says whether
    /// `shards[i]` holds what was sent. On success every data shard holds its original bytes
    /// (parity shards that were missing are left as they were).
    fn reconstruct(
        &mut self,
        data_shards: usize,
        shards: &mut [&mut [u8]],
        present: &[bool],
    ) -> Result<(), CodecError>;
}

/// Checks the common preconditions; returns the shard length.
fn check_shape(
    data: usize,
    parity: usize,
    lens: impl Iterator<Item = usize>,
) -> Result<usize, CodecError> {
    if data == 0 || data > MAX_DATA_SHARDS || parity > MAX_PARITY_SHARDS {
        return Err(CodecError::Unsupported { data, parity });
    }
    let mut len = None;
    for l in lens {
        match len {
            None => len = Some(l),
            Some(x) if x != l => return Err(CodecError::ShardLength),
            Some(_) => {}
        }
    }
    match len {
        Some(l) if l > 0 => Ok(l),
        _ => Err(CodecError::ShardLength),
    }
}

/// Cauchy coefficient for parity row `p` and data column `j`, normalised so row 0 is all ones
/// (parity 0 is the plain XOR of the data). Row `p` uses x_p = 255 - p and column `j` uses
/// y_j = j; scaling whole rows or columns keeps every square submatrix non-singular, which is
/// what makes any `k` of the `k + m` shards sufficient.
static COEF: [[u8; MAX_DATA_SHARDS]; MAX_PARITY_SHARDS] = build_coef();

const fn build_coef() -> [[u8; MAX_DATA_SHARDS]; MAX_PARITY_SHARDS] {
    let mut t = [[0u8; MAX_DATA_SHARDS]; MAX_PARITY_SHARDS];
    let mut p = 0;
    while p < MAX_PARITY_SHARDS {
        let mut j = 0;
        while j < MAX_DATA_SHARDS {
            let x0 = 255u8;
            let xp = 255 - p as u8;
            let yj = j as u8;
            t[p][j] = gf::mul(x0 ^ yj, gf::inv(xp ^ yj));
            j += 1;
        }
        p += 1;
    }
    t
}

/// Decode recipe for one erasure pattern: for each missing data shard, the coefficients to
/// apply to each chosen input shard.
struct Recipe {
    /// Missing data shard indices, ascending.
    missing: Vec<u8>,
    /// Input shard indices (present data, then the chosen parity), `data_shards` of them.
    inputs: Vec<u8>,
    /// `missing.len()` rows of `inputs.len()` coefficients.
    coef: Vec<u8>,
    /// Logical clock of the last use, for eviction.
    last_used: u64,
}

/// Key of a cached recipe: data shard count, mask of missing data, mask of chosen parity.
type RecipeKey = (u8, u64, u32);

/// Default number of cached erasure patterns.
pub const DEFAULT_RECIPE_CACHE: usize = 256;

/// Systematic Cauchy Reed-Solomon codec over GF(2^8) with SIMD kernels and a bounded cache of
/// inverted matrices keyed by erasure pattern.
pub struct CauchyCodec {
    kernel: Kernel,
    cache: HashMap<RecipeKey, Recipe>,
    cache_cap: usize,
    clock: u64,
    hits: u64,
    misses: u64,
}

impl Default for CauchyCodec {
    fn default() -> Self {
        Self::new()
    }
}

impl CauchyCodec {
    /// A codec at the best SIMD level of this CPU.
    pub fn new() -> CauchyCodec {
        Self::with_kernel(Kernel::detect(), DEFAULT_RECIPE_CACHE)
    }

    /// A codec forced to `level`, or `None` if the CPU lacks it.
    pub fn with_level(level: SimdLevel) -> Option<CauchyCodec> {
        Kernel::new(level).map(|k| Self::with_kernel(k, DEFAULT_RECIPE_CACHE))
    }

    /// A codec with an explicit kernel and inverse-matrix cache capacity (at least 1).
    pub fn with_kernel(kernel: Kernel, cache_cap: usize) -> CauchyCodec {
        CauchyCodec {
            kernel,
            cache: HashMap::new(),
            cache_cap: cache_cap.max(1),
            clock: 0,
            hits: 0,
            misses: 0,
        }
    }

    /// The SIMD level in use.
    pub fn level(&self) -> SimdLevel {
        self.kernel.level()
    }

    /// Cached erasure patterns right now.
    pub fn cache_len(&self) -> usize {
        self.cache.len()
    }

    /// (hits, misses) of the inverse-matrix cache so far.
    pub fn cache_stats(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }

    /// Builds the decode recipe for an erasure pattern by inverting the Cauchy submatrix.
    fn build_recipe(k: usize, missing: &[u8], parity: &[u8]) -> Option<Recipe> {
        let e = missing.len();
        // a[b][a'] = coefficient of missing data a' in chosen parity b.
        let mut a = vec![0u8; e * e];
        for (b, &p) in parity.iter().enumerate() {
            for (c, &d) in missing.iter().enumerate() {
                a[b * e + c] = COEF[p as usize][d as usize];
            }
        }
        if !gf::invert(&mut a, e) {
            return None;
        }
        // missing_a = sum_b ainv[a][b] * (parity_b ^ sum_{j present} coef(p_b, j) * data_j)
        let present: Vec<u8> = (0..k as u8).filter(|j| !missing.contains(j)).collect();
        let mut inputs = present.clone();
        inputs.extend(parity.iter().map(|&p| (k + p as usize) as u8));
        let mut coef = vec![0u8; e * k];
        for row in 0..e {
            let out = &mut coef[row * k..(row + 1) * k];
            for (col, &j) in present.iter().enumerate() {
                let mut s = 0u8;
                for (b, &p) in parity.iter().enumerate() {
                    s ^= gf::mul(a[row * e + b], COEF[p as usize][j as usize]);
                }
                out[col] = s;
            }
            for b in 0..e {
                out[present.len() + b] = a[row * e + b];
            }
        }
        Some(Recipe {
            missing: missing.to_vec(),
            inputs,
            coef,
            last_used: 0,
        })
    }
}

impl Codec for CauchyCodec {
    fn id(&self) -> CodecId {
        CodecId::Cauchy
    }

    fn encode(&mut self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError> {
        check_shape(
            data.len(),
            parity.len(),
            data.iter()
                .map(|s| s.len())
                .chain(parity.iter().map(|s| s.len())),
        )?;
        for (p, out) in parity.iter_mut().enumerate() {
            let row = &COEF[p];
            self.kernel.mul(row[0], data[0], out);
            for (j, d) in data.iter().enumerate().skip(1) {
                self.kernel.mul_acc(row[j], d, out);
            }
        }
        Ok(())
    }

    fn reconstruct(
        &mut self,
        k: usize,
        shards: &mut [&mut [u8]],
        present: &[bool],
    ) -> Result<(), CodecError> {
        if shards.len() < k || present.len() != shards.len() {
            return Err(CodecError::Unsupported {
                data: k,
                parity: shards.len().saturating_sub(k),
            });
        }
        let m = shards.len() - k;
        check_shape(k, m, shards.iter().map(|s| s.len()))?;
        let mut missing_mask = 0u64;
        let mut missing = [0u8; MAX_DATA_SHARDS];
        let mut e = 0;
        for (i, _) in present[..k].iter().enumerate().filter(|(_, p)| !**p) {
            missing_mask |= 1 << i;
            missing[e] = i as u8;
            e += 1;
        }
        if e == 0 {
            return Ok(());
        }
        let mut parity_mask = 0u32;
        let mut chosen = [0u8; MAX_PARITY_SHARDS];
        let mut c = 0;
        for (p, _) in present[k..].iter().enumerate().filter(|(_, p)| **p) {
            if c == e {
                break;
            }
            parity_mask |= 1 << p;
            chosen[c] = p as u8;
            c += 1;
        }
        if c < e {
            return Err(CodecError::TooFewShards {
                present: k - e + c,
                needed: k,
            });
        }
        self.clock += 1;
        let key = (k as u8, missing_mask, parity_mask);
        if !self.cache.contains_key(&key) {
            self.misses += 1;
            let recipe = Self::build_recipe(k, &missing[..e], &chosen[..e])
                .ok_or_else(|| CodecError::Backend("singular decode matrix".into()))?;
            if self.cache.len() >= self.cache_cap {
                if let Some(old) = self
                    .cache
                    .iter()
                    .min_by_key(|(_, r)| r.last_used)
                    .map(|(k, _)| *k)
                {
                    self.cache.remove(&old);
                }
            }
            self.cache.insert(key, recipe);
        } else {
            self.hits += 1;
        }
        let kernel = self.kernel;
        let Some(recipe) = self.cache.get_mut(&key) else {
            return Err(CodecError::Backend("recipe cache".into()));
        };
        recipe.last_used = self.clock;
        for (row, &d) in recipe.missing.iter().enumerate() {
            // Take the output out of the slice so the inputs can be borrowed alongside it;
            // inputs never include a missing shard.
            let out = std::mem::take(&mut shards[d as usize]);
            let coef = &recipe.coef[row * k..(row + 1) * k];
            for (n, (&c, &i)) in coef.iter().zip(&recipe.inputs).enumerate() {
                if n == 0 {
                    kernel.mul(c, shards[i as usize], out);
                } else {
                    kernel.mul_acc(c, shards[i as usize], out);
                }
            }
            shards[d as usize] = out;
        }
        Ok(())
    }
}

/// `reed-solomon-simd` (GF(2^16), O(n log n)) behind [`Codec`]. Shard lengths must be even.
/// Its SIMD level is chosen inside the library and cannot be forced.
#[derive(Default)]
pub struct RsSimdCodec {
    encoder: Option<ReedSolomonEncoder>,
    decoder: Option<ReedSolomonDecoder>,
}

impl RsSimdCodec {
    /// A codec with no buffers yet; they are allocated on first use and reused.
    pub fn new() -> RsSimdCodec {
        RsSimdCodec::default()
    }
}

fn backend(e: reed_solomon_simd::Error) -> CodecError {
    CodecError::Backend(e.to_string())
}

impl Codec for RsSimdCodec {
    fn id(&self) -> CodecId {
        CodecId::RsSimd
    }

    fn encode(&mut self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError> {
        let len = check_shape(
            data.len(),
            parity.len(),
            data.iter()
                .map(|s| s.len())
                .chain(parity.iter().map(|s| s.len())),
        )?;
        if len % 2 != 0 {
            return Err(CodecError::ShardLength);
        }
        if parity.is_empty() {
            return Ok(());
        }
        let (k, m) = (data.len(), parity.len());
        let enc = match &mut self.encoder {
            Some(enc) => {
                enc.reset(k, m, len).map_err(backend)?;
                enc
            }
            None => self
                .encoder
                .insert(ReedSolomonEncoder::new(k, m, len).map_err(backend)?),
        };
        for d in data {
            enc.add_original_shard(d).map_err(backend)?;
        }
        let result = enc.encode().map_err(backend)?;
        for (out, rec) in parity.iter_mut().zip(result.recovery_iter()) {
            out.copy_from_slice(rec);
        }
        Ok(())
    }

    fn reconstruct(
        &mut self,
        k: usize,
        shards: &mut [&mut [u8]],
        present: &[bool],
    ) -> Result<(), CodecError> {
        if shards.len() < k || present.len() != shards.len() {
            return Err(CodecError::Unsupported {
                data: k,
                parity: shards.len().saturating_sub(k),
            });
        }
        let m = shards.len() - k;
        let len = check_shape(k, m, shards.iter().map(|s| s.len()))?;
        if len % 2 != 0 {
            return Err(CodecError::ShardLength);
        }
        let have = present.iter().filter(|p| **p).count();
        if present[..k].iter().all(|p| *p) {
            return Ok(());
        }
        if have < k {
            return Err(CodecError::TooFewShards {
                present: have,
                needed: k,
            });
        }
        let dec = match &mut self.decoder {
            Some(dec) => {
                dec.reset(k, m, len).map_err(backend)?;
                dec
            }
            None => self
                .decoder
                .insert(ReedSolomonDecoder::new(k, m, len).map_err(backend)?),
        };
        for (i, s) in shards.iter().enumerate().filter(|(i, _)| present[*i]) {
            if i < k {
                dec.add_original_shard(i, &**s).map_err(backend)?;
            } else {
                dec.add_recovery_shard(i - k, &**s).map_err(backend)?;
            }
        }
        let result = dec.decode().map_err(backend)?;
        for (i, restored) in result.restored_original_iter() {
            if let Some(out) = shards.get_mut(i) {
                out.copy_from_slice(restored);
            }
        }
        Ok(())
    }
}

/// Makes a codec by id.
pub fn new_codec(id: CodecId) -> Box<dyn Codec> {
    match id {
        CodecId::Cauchy => Box::new(CauchyCodec::new()),
        CodecId::RsSimd => Box::new(RsSimdCodec::new()),
    }
}
