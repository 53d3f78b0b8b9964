//! The multiply-accumulate kernel `dst ^= c * src` (and `dst = c * src`) over GF(2^8), with the
//! SIMD level chosen at run time: AVX2 or SSSE3 `pshufb` split-nibble tables on x86-64, NEON
//! `tbl` on aarch64, a table-lookup scalar loop everywhere else.
//!
//! A [`Kernel`] can only be built for a level the CPU supports ([`Kernel::new`] checks), which
//! is what makes calling the `#[target_feature]` functions sound.

use super::gf::{MUL, NIBBLE};

/// An instruction-set level for the GF(2^8) kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SimdLevel {
    /// Portable table lookups, one byte at a time.
    Scalar,
    /// x86-64 SSSE3 `pshufb`, 16 bytes per step.
    Ssse3,
    /// x86-64 AVX2 `vpshufb`, 32 bytes per step.
    Avx2,
    /// aarch64 NEON `tbl`, 16 bytes per step.
    Neon,
}

impl SimdLevel {
    /// Every level, best first.
    pub const ALL: [SimdLevel; 4] = [
        SimdLevel::Avx2,
        SimdLevel::Neon,
        SimdLevel::Ssse3,
        SimdLevel::Scalar,
    ];

    /// Whether this CPU can run the level.
    pub fn is_supported(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Ssse3 => std::arch::is_x86_feature_detected!("ssse3"),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "aarch64")]
            SimdLevel::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The best level this CPU supports.
    pub fn detect() -> SimdLevel {
        Self::ALL
            .into_iter()
            .find(|l| l.is_supported())
            .unwrap_or(SimdLevel::Scalar)
    }

    /// Every level this CPU supports, best first.
    pub fn supported() -> Vec<SimdLevel> {
        Self::ALL.into_iter().filter(|l| l.is_supported()).collect()
    }

    /// Lower-case name for tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Ssse3 => "ssse3",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Neon => "neon",
        }
    }
}

/// The GF(2^8) region kernel at one supported [`SimdLevel`].
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    /// Invariant: `level.is_supported()` held when this value was built.
    level: SimdLevel,
}

impl Kernel {
    /// A kernel at `level`, or `None` if this CPU does not support it.
    pub fn new(level: SimdLevel) -> Option<Kernel> {
        level.is_supported().then_some(Kernel { level })
    }

    /// A kernel at the best supported level.
    pub fn detect() -> Kernel {
        Kernel {
            level: SimdLevel::detect(),
        }
    }

    /// The level this kernel runs at.
    pub fn level(&self) -> SimdLevel {
        self.level
    }

    /// `dst[i] ^= c * src[i]` over the common length of the two slices.
    #[inline]
    pub fn mul_acc(&self, c: u8, src: &[u8], dst: &mut [u8]) {
        match c {
            0 => {}
            // Plain XOR: the compiler vectorises it with the baseline instruction set.
            1 => dst.iter_mut().zip(src).for_each(|(d, s)| *d ^= *s),
            _ => self.run::<true>(c, src, dst),
        }
    }

    /// `dst[i] = c * src[i]` over the common length of the two slices.
    #[inline]
    pub fn mul(&self, c: u8, src: &[u8], dst: &mut [u8]) {
        let n = src.len().min(dst.len());
        match c {
            0 => dst[..n].fill(0),
            1 => dst[..n].copy_from_slice(&src[..n]),
            _ => self.run::<false>(c, src, dst),
        }
    }

    fn run<const ACC: bool>(&self, c: u8, src: &[u8], dst: &mut [u8]) {
        let n = src.len().min(dst.len());
        let (src, dst) = (&src[..n], &mut dst[..n]);
        match self.level {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Kernel` is only built for a level `is_supported` detected on this CPU.
            SimdLevel::Avx2 => unsafe { x86::mul_avx2::<ACC>(&NIBBLE[c as usize], src, dst) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, SSSE3 was detected before this kernel was built.
            SimdLevel::Ssse3 => unsafe { x86::mul_ssse3::<ACC>(&NIBBLE[c as usize], src, dst) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: as above, NEON was detected before this kernel was built.
            SimdLevel::Neon => unsafe { arm::mul_neon::<ACC>(&NIBBLE[c as usize], src, dst) },
            _ => scalar::<ACC>(c, src, dst),
        }
    }
}

/// The reference kernel; also finishes the tails the SIMD loops leave.
#[inline]
pub(crate) fn scalar<const ACC: bool>(c: u8, src: &[u8], dst: &mut [u8]) {
    let row = &MUL[c as usize];
    for (d, s) in dst.iter_mut().zip(src) {
        if ACC {
            *d ^= row[*s as usize];
        } else {
            *d = row[*s as usize];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// `dst (^)= c * src` with 32-byte `vpshufb` lookups. `src` and `dst` have equal length.
    #[target_feature(enable = "avx2")]
    pub(super) fn mul_avx2<const ACC: bool>(tables: &[u8; 32], src: &[u8], dst: &mut [u8]) {
        let n = src.len().min(dst.len());
        // SAFETY: `tables` is 32 bytes, so both 16-byte unaligned loads are in bounds.
        let (lo, hi) = unsafe {
            (
                _mm_loadu_si128(tables.as_ptr().cast()),
                _mm_loadu_si128(tables.as_ptr().add(16).cast()),
            )
        };
        let lo = _mm256_broadcastsi128_si256(lo);
        let hi = _mm256_broadcastsi128_si256(hi);
        let mask = _mm256_set1_epi8(0x0f);
        let mut i = 0;
        while i + 32 <= n {
            // SAFETY: `i + 32 <= n` and `n` is at most the length of both slices.
            let s = unsafe { _mm256_loadu_si256(src.as_ptr().add(i).cast()) };
            let l = _mm256_shuffle_epi8(lo, _mm256_and_si256(s, mask));
            let h = _mm256_shuffle_epi8(hi, _mm256_and_si256(_mm256_srli_epi64::<4>(s), mask));
            let mut p = _mm256_xor_si256(l, h);
            if ACC {
                // SAFETY: same bounds as the load from `src` above.
                let d = unsafe { _mm256_loadu_si256(dst.as_ptr().add(i).cast()) };
                p = _mm256_xor_si256(p, d);
            }
            // SAFETY: same bounds; `dst` is borrowed mutably, so nothing else aliases it.
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), p) };
            i += 32;
        }
        tail::<ACC>(tables, &src[i..n], &mut dst[i..n]);
    }

    /// `dst (^)= c * src` with 16-byte `pshufb` lookups. `src` and `dst` have equal length.
    #[target_feature(enable = "ssse3")]
    pub(super) fn mul_ssse3<const ACC: bool>(tables: &[u8; 32], src: &[u8], dst: &mut [u8]) {
        let n = src.len().min(dst.len());
        // SAFETY: `tables` is 32 bytes, so both 16-byte unaligned loads are in bounds.
        let (lo, hi) = unsafe {
            (
                _mm_loadu_si128(tables.as_ptr().cast()),
                _mm_loadu_si128(tables.as_ptr().add(16).cast()),
            )
        };
        let mask = _mm_set1_epi8(0x0f);
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: `i + 16 <= n` and `n` is at most the length of both slices.
            let s = unsafe { _mm_loadu_si128(src.as_ptr().add(i).cast()) };
            let l = _mm_shuffle_epi8(lo, _mm_and_si128(s, mask));
            let h = _mm_shuffle_epi8(hi, _mm_and_si128(_mm_srli_epi64::<4>(s), mask));
            let mut p = _mm_xor_si128(l, h);
            if ACC {
                // SAFETY: same bounds as the load from `src` above.
                let d = unsafe { _mm_loadu_si128(dst.as_ptr().add(i).cast()) };
                p = _mm_xor_si128(p, d);
            }
            // SAFETY: same bounds; `dst` is borrowed mutably, so nothing else aliases it.
            unsafe { _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), p) };
            i += 16;
        }
        tail::<ACC>(tables, &src[i..n], &mut dst[i..n]);
    }

    /// The last < 16 or < 32 bytes, from the same nibble tables.
    #[inline]
    fn tail<const ACC: bool>(tables: &[u8; 32], src: &[u8], dst: &mut [u8]) {
        for (d, s) in dst.iter_mut().zip(src) {
            let p = tables[(*s & 15) as usize] ^ tables[16 + (*s >> 4) as usize];
            *d = if ACC { *d ^ p } else { p };
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use std::arch::aarch64::*;

    /// `dst (^)= c * src` with 16-byte `tbl` lookups. `src` and `dst` have equal length.
    #[target_feature(enable = "neon")]
    pub(super) fn mul_neon<const ACC: bool>(tables: &[u8; 32], src: &[u8], dst: &mut [u8]) {
        let n = src.len().min(dst.len());
        // SAFETY: `tables` is 32 bytes, so both 16-byte loads are in bounds.
        let (lo, hi) = unsafe { (vld1q_u8(tables.as_ptr()), vld1q_u8(tables.as_ptr().add(16))) };
        let mask = vdupq_n_u8(0x0f);
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: `i + 16 <= n` and `n` is at most the length of both slices.
            let s = unsafe { vld1q_u8(src.as_ptr().add(i)) };
            let l = vqtbl1q_u8(lo, vandq_u8(s, mask));
            let h = vqtbl1q_u8(hi, vshrq_n_u8::<4>(s));
            let mut p = veorq_u8(l, h);
            if ACC {
                // SAFETY: same bounds as the load from `src` above.
                p = veorq_u8(p, unsafe { vld1q_u8(dst.as_ptr().add(i)) });
            }
            // SAFETY: same bounds; `dst` is borrowed mutably, so nothing else aliases it.
            unsafe { vst1q_u8(dst.as_mut_ptr().add(i), p) };
            i += 16;
        }
        for (d, s) in dst[i..n].iter_mut().zip(&src[i..n]) {
            let p = tables[(*s & 15) as usize] ^ tables[16 + (*s >> 4) as usize];
            *d = if ACC { *d ^ p } else { p };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every supported level computes exactly what the scalar reference computes: for every
    /// coefficient, over lengths that exercise the SIMD body and every tail length.
    #[test]
    fn simd_levels_match_scalar() {
        for c in 0..=255u8 {
            for len in (0..70).chain([127, 128, 129, 199]) {
                let src: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(73) ^ c).collect();
                let init: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ !c).collect();
                let mut want_acc = init.clone();
                scalar::<true>(c, &src, &mut want_acc);
                let mut want_mul = init.clone();
                scalar::<false>(c, &src, &mut want_mul);
                for level in SimdLevel::supported() {
                    let k = Kernel::new(level).unwrap();
                    let mut acc = init.clone();
                    k.mul_acc(c, &src, &mut acc);
                    assert_eq!(acc, want_acc, "mul_acc at {level:?}, c {c}, len {len}");
                    let mut m = init.clone();
                    k.mul(c, &src, &mut m);
                    assert_eq!(m, want_mul, "mul at {level:?}, c {c}, len {len}");
                }
            }
        }
    }

    #[test]
    fn unsupported_levels_are_refused() {
        for level in SimdLevel::ALL {
            assert_eq!(Kernel::new(level).is_some(), level.is_supported());
        }
        assert!(SimdLevel::Scalar.is_supported());
        assert!(SimdLevel::detect().is_supported());
    }
}
