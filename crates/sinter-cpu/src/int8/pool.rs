//! Max pooling of channels-last images ([images, h, w, channels], the layout of the int8
//! GEMM's output rows), for chains of int8 convolutions: each tap of a window is one pass over
//! a pixel's channels, which vectorises, instead of a scalar compare per value of NCHW planes.
//!
//! - [`max_pool_u8`]: u8 → u8. Requantization q(y) = clamp(round(y/s) + z, 0, 255) is
//!   monotone (non-decreasing), so max(q(yᵢ)) = q(max(yᵢ)): pooling the requantized bytes
//!   gives exactly the bytes the next layer's quantizer would make of the f32 pooling. Padding
//!   never wins (byte 0 is the identity of max; a window of padding only gives 0 = q(−∞)).
//! - [`max_pool_f32_to_planes`]: f32 → f32 NCHW planes, with sinter's f32 rule (the first value
//!   of the window, then any greater one or NaN, in window order; −∞ for padding only), for
//!   the last pooling of a chain, before f32 layers.
//!
//! The window geometry is an [`im2col::Window`](crate::im2col::Window) with the pooling's
//! kernel, stride, padding, dilation and output size (the caller applies ceil mode).

use rayon::prelude::*;

use crate::im2col::Window;

/// Bytes of input per parallel task (small images are grouped).
const TASK_BYTES: usize = 16 << 10;

/// `out[(i·l + q)·c + ch]` = the max of image i's channel ch over output pixel q's window.
pub fn max_pool_u8(x: &[u8], win: &Window, channels: usize, out: &mut [u8]) {
    let c = channels;
    let table = check(x.len(), win, c, out.len());
    let (kk, hw) = (win.taps(), win.h * win.w);
    each_image(x, out, hw * c, win.l() * c, |img, o| {
        for (px, taps) in o.chunks_exact_mut(c).zip(table.chunks_exact(kk)) {
            px.fill(0);
            for &j in taps.iter().filter(|&&j| (j as usize) < hw) {
                let src = &img[j as usize * c..][..c];
                px.iter_mut().zip(src).for_each(|(d, &s)| *d = (*d).max(s));
            }
        }
    });
}

/// `out[(i·c + ch)·l + q]` (NCHW planes) = the max of image i's channel ch over output
/// pixel q's window, f32 channels-last in.
pub fn max_pool_f32_to_planes(x: &[f32], win: &Window, channels: usize, out: &mut [f32]) {
    let c = channels;
    let table = check(x.len(), win, c, out.len());
    let (l, kk, hw) = (win.l(), win.taps(), win.h * win.w);
    each_image(x, out, hw * c, l * c, |img, o| {
        let mut best = vec![0f32; c];
        for (q, taps) in table.chunks_exact(kk).enumerate() {
            best.fill(f32::NEG_INFINITY);
            for &j in taps.iter().filter(|&&j| (j as usize) < hw) {
                let src = &img[j as usize * c..][..c];
                for (b, &v) in best.iter_mut().zip(src) {
                    // sinter's pool rule (`pool_max_replaces`): greater, or NaN.
                    *b = if v > *b || v.is_nan() { v } else { *b };
                }
            }
            for (ch, &b) in best.iter().enumerate() {
                o[ch * l + q] = b;
            }
        }
    });
}

/// `pool(image, its output)` for each image of `x` (`image` values each; `out_image` output
/// values each), in parallel, small images grouped into tasks.
fn each_image<T: Send + Sync>(
    x: &[T],
    out: &mut [T],
    image: usize,
    out_image: usize,
    pool: impl Fn(&[T], &mut [T]) + Send + Sync,
) {
    let (image, out_image) = (image.max(1), out_image.max(1));
    let bytes = image * std::mem::size_of::<T>();
    out[..x.len() / image * out_image]
        .par_chunks_mut(out_image)
        .zip(x.par_chunks_exact(image))
        .with_min_len((TASK_BYTES / bytes).max(1))
        .for_each(|(o, img)| pool(img, o));
}

/// The by-pixel tap table, after checking the sizes.
fn check(x_len: usize, win: &Window, c: usize, out_len: usize) -> Vec<u32> {
    let image = win.h * win.w * c;
    assert!(
        image == 0 || x_len.is_multiple_of(image),
        "max pool: {x_len} values are not whole {}×{}×{c} images",
        win.h,
        win.w
    );
    let images = x_len.checked_div(image).unwrap_or(0);
    assert!(
        out_len >= images * win.l() * c,
        "max pool: output of {out_len} for {images} images of {}×{c}",
        win.l()
    );
    win.tap_table_by_pixel()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::int8::QParams;

    /// Direct NCHW pooling with the rule of sinter-core's f32 max pool.
    fn reference(x: &[f32], win: &Window, c: usize) -> Vec<f32> {
        let images = x.len() / (c * win.h * win.w);
        let mut out = Vec::new();
        for i in 0..images {
            for ch in 0..c {
                for oy in 0..win.oh {
                    for ox in 0..win.ow {
                        let mut best = f32::NEG_INFINITY;
                        for ky in 0..win.kh {
                            for kx in 0..win.kw {
                                let iy = (oy * win.stride.0 + ky * win.dilation.0) as isize
                                    - win.padding.0 as isize;
                                let ix = (ox * win.stride.1 + kx * win.dilation.1) as isize
                                    - win.padding.1 as isize;
                                if iy < 0 || ix < 0 || iy >= win.h as isize || ix >= win.w as isize
                                {
                                    continue;
                                }
                                let v =
                                    x[((i * c + ch) * win.h + iy as usize) * win.w + ix as usize];
                                if v > best || v.is_nan() {
                                    best = v;
                                }
                            }
                        }
                        out.push(best);
                    }
                }
            }
        }
        out
    }

    fn to_channels_last<T: Copy + Default>(x: &[T], c: usize, hw: usize) -> Vec<T> {
        let mut y = vec![T::default(); x.len()];
        for (i, &v) in x.iter().enumerate() {
            let (img, ch, p) = (i / (c * hw), i / hw % c, i % hw);
            y[(img * hw + p) * c + ch] = v;
        }
        y
    }

    #[test]
    fn channels_last_pooling_equals_the_planar_rule_and_commutes_with_requantization() {
        // 2×2 stride 2 (the CNN's), and 3×3 stride 2 with padding 1 and dilation (1, 2), whose
        // edge windows hold padding.
        let wins = [
            Window {
                h: 6,
                w: 6,
                kh: 2,
                kw: 2,
                oh: 3,
                ow: 3,
                stride: (2, 2),
                padding: (0, 0),
                dilation: (1, 1),
            },
            Window {
                h: 5,
                w: 7,
                kh: 3,
                kw: 3,
                oh: 3,
                ow: 3,
                stride: (2, 2),
                padding: (1, 1),
                dilation: (1, 2),
            },
        ];
        let c = 19;
        let q = QParams {
            scale: 0.05,
            zero_point: 40,
        };
        for win in wins {
            let hw = win.h * win.w;
            let x: Vec<f32> = (0..3 * c * hw)
                .map(|i| ((i * 7919 % 1013) as f32 - 500.0) * 0.013)
                .collect();
            let want = reference(&x, &win, c);
            let x_last = to_channels_last(&x, c, hw);
            let mut got = vec![0f32; want.len()];
            max_pool_f32_to_planes(&x_last, &win, c, &mut got);
            assert_eq!(got, want, "{win:?}");

            // u8: pooling the quantized values = quantizing the pooled ones.
            let xq: Vec<u8> = x_last.iter().map(|&v| q.quantize(v)).collect();
            let mut got = vec![0u8; want.len()];
            max_pool_u8(&xq, &win, c, &mut got);
            let want_q = to_channels_last(
                &want.iter().map(|&v| q.quantize(v)).collect::<Vec<_>>(),
                c,
                win.l(),
            );
            assert_eq!(got, want_q, "{win:?}");
        }
    }

    #[test]
    fn f32_pooling_propagates_nan() {
        let win = Window {
            h: 2,
            w: 2,
            kh: 2,
            kw: 2,
            oh: 1,
            ow: 1,
            stride: (2, 2),
            padding: (0, 0),
            dilation: (1, 1),
        };
        // One image, two channels: channel 0 has a NaN after its max, channel 1 none.
        let x = [1.0, 5.0, 7.0, 6.0, f32::NAN, 2.0, 3.0, 8.0];
        let mut out = [0f32; 2];
        max_pool_f32_to_planes(&x, &win, 2, &mut out);
        assert_eq!(out[1], 8.0);
        assert!(out[0].is_nan());
    }
}
