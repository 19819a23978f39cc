//! The gather rule of a 2-D convolution (im2col), written once for the f32 convolution of
//! sinter-core's CPU storage and the int8 one of sinter-nn's quantized layers: which input
//! pixel of a plane each kernel tap of each output pixel reads, per axis (stride, zero
//! padding, dilation).
//!
//! [`Window::tap`] gives the rule for one output row and tap as a run of output columns (the
//! row copies of large planes); [`Window::tap_table`] tabulates it per (tap, output pixel) for
//! small planes, where a run is a handful of pixels and a lookup per value is cheaper than the
//! bookkeeping of runs. [`gather_u8_rows`] is the int8 layout: one row of `k_padded` bytes per
//! output pixel (the int8 GEMM's activation rows), quantized on the way from f32;
//! [`gather_u8_pixels`] makes the same rows from u8 images already channels last (the output
//! of a previous int8 layer).

/// One image plane's convolution window: input h×w, kernel kh×kw, output oh×ow, stride,
/// padding and dilation as (rows, columns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub h: usize,
    pub w: usize,
    pub kh: usize,
    pub kw: usize,
    pub oh: usize,
    pub ow: usize,
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
}

/// Where tap (ky, kx) of output row `oy` reads: the input row (None: padding), the column
/// shift (input column = ox·stride + shift) and the range [lo, hi) of output columns whose
/// input column lies inside the plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tap {
    pub row: Option<usize>,
    pub shift: isize,
    pub lo: usize,
    pub hi: usize,
}

impl Window {
    /// Output pixels per plane: oh · ow.
    #[inline]
    pub fn l(&self) -> usize {
        self.oh * self.ow
    }
    /// Kernel taps: kh · kw.
    #[inline]
    pub fn taps(&self) -> usize {
        self.kh * self.kw
    }

    /// The rule for output row `oy` and kernel offset (ky, kx) (any stride and dilation).
    /// Inlined into the callers' loops (another crate's): the conv's gather calls it per
    /// (channel, tap, output row), and a call that recomputes its two divisions each time
    /// cost the 16×16 bench conv a quarter of its forward speed.
    #[inline]
    pub fn tap(&self, oy: usize, ky: usize, kx: usize) -> Tap {
        let (s, pd, d) = (self.stride, self.padding, self.dilation);
        let iy = (oy * s.0 + ky * d.0) as isize - pd.0 as isize;
        let shift = (kx * d.1) as isize - pd.1 as isize;
        let sw = s.1;
        let row = (iy >= 0 && iy < self.h as isize).then_some(iy as usize);
        // First and one-past-last ox with 0 <= ox·sw + shift < w.
        let lo = if shift >= 0 {
            0
        } else {
            ((-shift) as usize).div_ceil(sw)
        };
        let hi = if (self.w as isize) <= shift {
            0
        } else {
            ((self.w as isize - shift) as usize).div_ceil(sw)
        };
        let lo = lo.min(self.ow);
        let hi = hi.min(self.ow).max(lo);
        Tap { row, shift, lo, hi }
    }

    /// `table[t·l + q]`: the input pixel (index in its plane) that output pixel q reads under
    /// tap t = ky·kw + kx, or h·w — a slot after the plane that holds the padding value.
    pub fn tap_table(&self) -> Vec<u32> {
        let (l, hw) = (self.l(), self.h * self.w);
        assert!(hw < u32::MAX as usize, "tap table: a plane of {hw} pixels");
        let mut table = vec![hw as u32; self.taps() * l];
        for t in 0..self.taps() {
            for oy in 0..self.oh {
                let tap = self.tap(oy, t / self.kw, t % self.kw);
                let Some(iy) = tap.row else { continue };
                for ox in tap.lo..tap.hi {
                    let ix = ((ox * self.stride.1) as isize + tap.shift) as usize;
                    table[t * l + oy * self.ow + ox] = (iy * self.w + ix) as u32;
                }
            }
        }
        table
    }

    /// [`Window::tap_table`] pixel-major: `table[q·taps + t]` (the order of an int8 column
    /// row).
    pub fn tap_table_by_pixel(&self) -> Vec<u32> {
        let (l, kk) = (self.l(), self.taps());
        let by_tap = self.tap_table();
        let mut table = vec![0u32; kk * l];
        for t in 0..kk {
            for q in 0..l {
                table[q * kk + t] = by_tap[t * l + q];
            }
        }
        table
    }
}

/// The int8 column matrix of a batch of images, channels last: for image i, output pixel q,
/// tap t and channel c, byte `col[(i·l + q)·k_padded + t·channels + c]` = the quantized input
/// pixel under the tap (`quantize`'s value of 0.0 — the zero point — over padding). So the
/// weight's k runs over (ky, kx, c), and each (pixel, tap) is one copy of `channels` bytes
/// instead of `channels` single-byte lookups.
///
/// `x` holds the images' f32 planes [images, channels, h, w]; `quantize` maps a run of f32 to
/// u8 exactly as the layer's input mapping does; `table` is [`Window::tap_table_by_pixel`].
/// Bytes past channels·taps of each row are left as they are (the GEMM ignores them).
pub fn gather_u8_rows(
    x: &[f32],
    win: &Window,
    channels: usize,
    table: &[u32],
    quantize: impl Fn(&[f32], &mut [u8]),
    col: &mut [u8],
    k_padded: usize,
) {
    let (hw, c) = (win.h * win.w, channels);
    let images = x.len().checked_div(c * hw).unwrap_or(0);
    check_gather(win, c, table, images, col, k_padded);
    // One image quantized plane by plane, then channels last: pixel p's c bytes at p·c, and
    // the padding pixel (the zero point in every channel) at hw·c.
    let mut planes = vec![0u8; c * hw];
    let mut pixels = vec![0u8; (hw + 1) * c];
    let mut zero = [0u8];
    quantize(&[0.0], &mut zero);
    pixels[hw * c..].fill(zero[0]);
    for (i, img) in x.chunks_exact(c * hw).enumerate() {
        quantize(img, &mut planes);
        for (ch, plane) in planes.chunks_exact(hw).enumerate() {
            for (p, &v) in plane.iter().enumerate() {
                pixels[p * c + ch] = v;
            }
        }
        gather_image(&pixels, win, c, table, col, i, k_padded);
    }
}

/// [`gather_u8_rows`] from images already quantized and channels last: `x` holds
/// [images, h, w, channels] bytes (pixel p of image i at `(i·h·w + p)·channels`, the layout of
/// an int8 GEMM's output rows), `pad` is the byte of the real value 0 (the zero point).
pub fn gather_u8_pixels(
    x: &[u8],
    win: &Window,
    channels: usize,
    table: &[u32],
    pad: u8,
    col: &mut [u8],
    k_padded: usize,
) {
    let (hw, c) = (win.h * win.w, channels);
    let images = x.len().checked_div(c * hw).unwrap_or(0);
    check_gather(win, c, table, images, col, k_padded);
    // Each image copied beside a padding pixel, so the table's index h·w needs no branch.
    let mut pixels = vec![pad; (hw + 1) * c];
    for (i, img) in x.chunks_exact(c * hw).enumerate() {
        pixels[..hw * c].copy_from_slice(img);
        gather_image(&pixels, win, c, table, col, i, k_padded);
    }
}

fn check_gather(win: &Window, c: usize, table: &[u32], images: usize, col: &[u8], k_padded: usize) {
    let (l, kk) = (win.l(), win.taps());
    assert!(
        table.len() == l * kk,
        "tap table of {} for {l}×{kk}",
        table.len()
    );
    assert!(k_padded >= c * kk, "k_padded {k_padded} below {c}×{kk}");
    assert!(
        col.len() >= images * l * k_padded,
        "column matrix too short"
    );
}

/// Image i's column rows from its channels-last pixels (the padding pixel last).
#[inline(always)]
fn gather_image(
    pixels: &[u8],
    win: &Window,
    c: usize,
    table: &[u32],
    col: &mut [u8],
    i: usize,
    k_padded: usize,
) {
    let (l, kk) = (win.l(), win.taps());
    let rows = &mut col[i * l * k_padded..(i + 1) * l * k_padded];
    if c == 1 {
        // One byte per tap (a first layer on grayscale images): a lookup, not a copy call.
        for (row, taps) in rows.chunks_exact_mut(k_padded).zip(table.chunks_exact(kk)) {
            for (dst, &j) in row.iter_mut().zip(taps) {
                *dst = pixels[j as usize];
            }
        }
        return;
    }
    for (row, taps) in rows.chunks_exact_mut(k_padded).zip(table.chunks_exact(kk)) {
        for (dst, &j) in row.chunks_exact_mut(c).zip(taps) {
            copy_short(dst, &pixels[j as usize * c..][..c]);
        }
    }
}

/// dst = src for short runs (a pixel's channels, a small image's rows): fixed-size pieces
/// compile to plain vector moves, where a `memcpy` call per run costs more than the copy.
#[inline(always)]
pub fn copy_short<T: Copy>(dst: &mut [T], src: &[T]) {
    let n = dst.len();
    let src = &src[..n];
    if n > 64 {
        return dst.copy_from_slice(src);
    }
    let mut i = 0;
    while i + 16 <= n {
        dst[i..i + 16].copy_from_slice(&src[i..i + 16]);
        i += 16;
    }
    for piece in [8, 4, 2, 1] {
        if i + piece <= n {
            dst[i..i + piece].copy_from_slice(&src[i..i + piece]);
            i += piece;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule against a direct evaluation of input = output·stride − padding + tap·dilation,
    /// per axis.
    #[test]
    fn tables_follow_the_per_axis_rule() {
        let wins = [
            Window {
                h: 7,
                w: 6,
                kh: 3,
                kw: 2,
                oh: 4,
                ow: 5,
                stride: (2, 1),
                padding: (1, 0),
                dilation: (1, 1),
            },
            Window {
                h: 5,
                w: 9,
                kh: 2,
                kw: 3,
                oh: 4,
                ow: 3,
                stride: (1, 3),
                padding: (0, 2),
                dilation: (2, 2),
            },
        ];
        for win in wins {
            let (table, by_pixel) = (win.tap_table(), win.tap_table_by_pixel());
            let hw = (win.h * win.w) as u32;
            for ky in 0..win.kh {
                for kx in 0..win.kw {
                    for oy in 0..win.oh {
                        for ox in 0..win.ow {
                            let iy = (oy * win.stride.0 + ky * win.dilation.0) as isize
                                - win.padding.0 as isize;
                            let ix = (ox * win.stride.1 + kx * win.dilation.1) as isize
                                - win.padding.1 as isize;
                            let inside = (0..win.h as isize).contains(&iy)
                                && (0..win.w as isize).contains(&ix);
                            let want = if inside {
                                (iy as usize * win.w + ix as usize) as u32
                            } else {
                                hw
                            };
                            let (t, q) = (ky * win.kw + kx, oy * win.ow + ox);
                            assert_eq!(table[t * win.l() + q], want, "{win:?} t {t} q {q}");
                            assert_eq!(by_pixel[q * win.taps() + t], want);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn gathered_rows_hold_each_tap_channels_and_the_zero_point() {
        let win = Window {
            h: 3,
            w: 3,
            kh: 2,
            kw: 2,
            oh: 2,
            ow: 2,
            stride: (2, 2),
            padding: (1, 1),
            dilation: (1, 1),
        };
        // Two images of three channels; "quantize" = value + 100 (padding: 100).
        let x: Vec<f32> = (0..2 * 3 * 9).map(|v| v as f32).collect();
        let table = win.tap_table_by_pixel();
        let kp = 16;
        let mut col = vec![7u8; 2 * 4 * kp];
        let q = |src: &[f32], dst: &mut [u8]| {
            for (d, &v) in dst.iter_mut().zip(src) {
                *d = (v + 100.0) as u8;
            }
        };
        gather_u8_rows(&x, &win, 3, &table, q, &mut col, kp);
        // Image 1, output pixel (1, 0): the taps read (row 1, column -1), (1, 0), (2, -1),
        // (2, 0); k runs over (tap, channel).
        let row = &col[(4 + 2) * kp..(4 + 3) * kp];
        let px = |c: usize, p: usize| 100 + ((3 + c) * 9 + p) as u8;
        let want: Vec<u8> = [None, Some(3), None, Some(6)]
            .iter()
            .flat_map(|p| (0..3).map(move |c| p.map_or(100, |p| px(c, p))))
            .collect();
        assert_eq!(row[..12], want[..]);
        assert_eq!(row[12..], [7; 4], "the padding bytes past k stay");

        // The same images already quantized and channels last give the same rows.
        let mut pixels = vec![0u8; x.len()];
        for (i, &v) in x.iter().enumerate() {
            let (img, ch, p) = (i / 27, i / 9 % 3, i % 9);
            pixels[(img * 9 + p) * 3 + ch] = (v + 100.0) as u8;
        }
        let mut col2 = vec![7u8; 2 * 4 * kp];
        gather_u8_pixels(&pixels, &win, 3, &table, 100, &mut col2, kp);
        assert_eq!(col2, col);

        // One channel (its own route): row q holds the taps' pixels, the padding byte for
        // the taps outside.
        let mut col1 = vec![7u8; 6 * 4 * 8];
        gather_u8_pixels(&pixels, &win, 1, &table, 100, &mut col1, 8);
        for (r, row) in col1.chunks_exact(8).enumerate() {
            let (img, q) = (r / 4, r % 4);
            for t in 0..4 {
                let j = table[q * 4 + t] as usize;
                let want = if j == 9 { 100 } else { pixels[img * 9 + j] };
                assert_eq!(row[t], want, "row {r} tap {t}");
            }
            assert_eq!(row[4..], [7; 4]);
        }
    }
}
