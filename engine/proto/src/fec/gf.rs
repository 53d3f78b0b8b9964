//! GF(2^8) arithmetic: field polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11D), generator 2.
//!
//! Every table is built at compile time, so there is no start-up cost and no lazy
//! initialisation on the datagram path.

/// The field's reduction polynomial.
const POLY: u16 = 0x11D;

/// (`LOG[x]` for x != 0, `EXP[i] = 2^i` doubled so `EXP[LOG[a] + LOG[b]]` needs no modulo).
const TABLES: ([u8; 256], [u8; 512]) = build_log_exp();

const fn build_log_exp() -> ([u8; 256], [u8; 512]) {
    let mut log = [0u8; 256];
    let mut exp = [0u8; 512];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        exp[i] = x as u8;
        exp[i + 255] = x as u8;
        log[x as usize] = i as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= POLY;
        }
        i += 1;
    }
    (log, exp)
}

/// Product of `a` and `b`.
#[inline]
pub(crate) const fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        0
    } else {
        TABLES.1[TABLES.0[a as usize] as usize + TABLES.0[b as usize] as usize]
    }
}

/// Multiplicative inverse of a non-zero `a` (returns 0 for 0, which callers never pass).
#[inline]
pub(crate) const fn inv(a: u8) -> u8 {
    if a == 0 {
        0
    } else {
        TABLES.1[255 - TABLES.0[a as usize] as usize]
    }
}

/// Full multiplication table for the scalar kernel: `MUL[c][x] = c * x` (64 KiB).
pub(crate) static MUL: [[u8; 256]; 256] = build_mul();

const fn build_mul() -> [[u8; 256]; 256] {
    let mut t = [[0u8; 256]; 256];
    let mut c = 1;
    while c < 256 {
        let mut x = 1;
        while x < 256 {
            t[c][x] = mul(c as u8, x as u8);
            x += 1;
        }
        c += 1;
    }
    t
}

/// Split-nibble tables for the `pshufb` / `tbl` kernels: `NIBBLE[c][x] = c * x` and
/// `NIBBLE[c][16 + x] = c * (x << 4)` for x in 0..16, so `c * b = lo[b & 15] ^ hi[b >> 4]`.
pub(crate) static NIBBLE: [[u8; 32]; 256] = build_nibble();

const fn build_nibble() -> [[u8; 32]; 256] {
    let mut t = [[0u8; 32]; 256];
    let mut c = 0;
    while c < 256 {
        let mut x = 0;
        while x < 16 {
            t[c][x] = mul(c as u8, x as u8);
            t[c][16 + x] = mul(c as u8, (x << 4) as u8);
            x += 1;
        }
        c += 1;
    }
    t
}

/// Inverts the `n`×`n` row-major matrix `m` in place (Gauss-Jordan). Returns `false` if it is
/// singular (a Cauchy submatrix never is; the check keeps bad input from panicking).
pub(crate) fn invert(m: &mut [u8], n: usize) -> bool {
    debug_assert_eq!(m.len(), n * n);
    // Augmented identity kept separately so rows of both can be swapped together.
    let mut id = vec![0u8; n * n];
    for i in 0..n {
        id[i * n + i] = 1;
    }
    for col in 0..n {
        let Some(pivot) = (col..n).find(|&r| m[r * n + col] != 0) else {
            return false;
        };
        if pivot != col {
            for j in 0..n {
                m.swap(pivot * n + j, col * n + j);
                id.swap(pivot * n + j, col * n + j);
            }
        }
        let scale = inv(m[col * n + col]);
        for j in 0..n {
            m[col * n + j] = mul(m[col * n + j], scale);
            id[col * n + j] = mul(id[col * n + j], scale);
        }
        for r in 0..n {
            let f = m[r * n + col];
            if r == col || f == 0 {
                continue;
            }
            for j in 0..n {
                m[r * n + j] ^= mul(f, m[col * n + j]);
                id[r * n + j] ^= mul(f, id[col * n + j]);
            }
        }
    }
    m.copy_from_slice(&id);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Carry-less multiply reduced by the polynomial: an independent reference.
    fn slow_mul(mut a: u8, mut b: u8) -> u8 {
        let mut p = 0u8;
        while b != 0 {
            if b & 1 != 0 {
                p ^= a;
            }
            let carry = a & 0x80 != 0;
            a <<= 1;
            if carry {
                a ^= (POLY & 0xff) as u8;
            }
            b >>= 1;
        }
        p
    }

    #[test]
    fn tables_match_reference_multiply() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), slow_mul(a, b), "{a} * {b}");
                assert_eq!(MUL[a as usize][b as usize], slow_mul(a, b));
            }
            if a != 0 {
                assert_eq!(mul(a, inv(a)), 1);
            }
            for x in 0..16u8 {
                assert_eq!(NIBBLE[a as usize][x as usize], slow_mul(a, x));
                assert_eq!(NIBBLE[a as usize][16 + x as usize], slow_mul(a, x << 4));
            }
        }
    }

    #[test]
    fn invert_round_trips_and_detects_singular() {
        // A 3x3 Cauchy matrix 1 / (x_i + y_j) with x = {10, 11, 12}, y = {0, 1, 2}.
        let n = 3;
        let mut m = vec![0u8; 9];
        for i in 0..n {
            for j in 0..n {
                m[i * n + j] = inv((10 + i as u8) ^ j as u8);
            }
        }
        let orig = m.clone();
        assert!(invert(&mut m, n));
        for i in 0..n {
            for j in 0..n {
                let mut s = 0;
                for t in 0..n {
                    s ^= mul(orig[i * n + t], m[t * n + j]);
                }
                assert_eq!(s, u8::from(i == j));
            }
        }
        let mut singular = vec![1, 2, 1, 2];
        assert!(!invert(&mut singular, 2));
    }
}
