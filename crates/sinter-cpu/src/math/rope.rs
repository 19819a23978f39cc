//! Rotary positions (Llama's RoPE) over head vectors: y = x·cos + rotate_half(x)·sin·sign with
//! rotate_half(x) = (−x₂, x₁), for every head of a row at one position. sign = −1 is the
//! inverse rotation (the backward), so one kernel serves both directions.

use crate::simd::Simd;
use crate::{with_isa, Isa};

/// Rotates the x.len() / d heads of d = cos.len() values each in `x` by one position's tables
/// `cos` and `sin` (sin's sign flipped by `sign`), into `y`: y₁ = x₁·cos₁ − x₂·s₁,
/// y₂ = x₂·cos₂ + x₁·s₂ with s = sign·sin, without fused multiply-adds (so the values are
/// those of the same formulas in scalar code).
///
/// # Panics
/// If d is odd or zero, the tables differ in length, or x and y are not whole heads of d
/// values each (a caller bug).
pub fn rope_rotate_isa(isa: Isa, x: &[f32], cos: &[f32], sin: &[f32], sign: f32, y: &mut [f32]) {
    let d = cos.len();
    assert!(
        d > 0 && d.is_multiple_of(2) && sin.len() == d && x.len() == y.len() && x.len().is_multiple_of(d),
        "rope_rotate: x {} and y {} must be whole heads of the tables' even width (cos {d}, sin {})",
        x.len(),
        y.len(),
        sin.len()
    );
    let half = d / 2;
    let (c, s) = (cos.as_ptr(), sin.as_ptr());
    // SAFETY: every head of x and y holds d values; the tables d each; offsets stay below half.
    with_isa!(isa, S => {
        let sg = S::splat(sign);
        for (xh, yh) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)) {
            let (xp, yp) = (xh.as_ptr(), yh.as_mut_ptr());
            let mut i = 0;
            while i < half {
                let lanes = (half - i).min(S::LANES);
                let ld = |p: *const f32| if lanes == S::LANES { S::load(p) } else { S::load_partial(p, lanes) };
                let (a, b) = (ld(xp.add(i)), ld(xp.add(half + i)));
                let (c1, c2) = (ld(c.add(i)), ld(c.add(half + i)));
                let (s1, s2) = (S::mul(sg, ld(s.add(i))), S::mul(sg, ld(s.add(half + i))));
                let o1 = S::sub(S::mul(a, c1), S::mul(b, s1));
                let o2 = S::add(S::mul(b, c2), S::mul(a, s2));
                if lanes == S::LANES {
                    S::store(yp.add(i), o1);
                    S::store(yp.add(half + i), o2);
                } else {
                    S::store_partial(yp.add(i), o1, lanes);
                    S::store_partial(yp.add(half + i), o2, lanes);
                }
                i += S::LANES;
            }
        }
    })
}
