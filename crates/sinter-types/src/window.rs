//! 2-D sliding-window geometry shared by convolution and pooling on every backend: a per-axis
//! size ([`Hw`]) and PyTorch's output-size rules ([`conv_out_size`], [`pool_out_size`]).

use std::fmt;

/// A per-axis size (kernel, stride, padding or dilation): `h` along the rows, `w` along the
/// columns. `Hw::from(3)` (or `3.into()`) is the square 3×3; `Hw::from((3, 1))` is 3 rows × 1
/// column, in PyTorch's `(kH, kW)` order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Hw {
    pub h: usize,
    pub w: usize,
}

impl Hw {
    pub const fn new(h: usize, w: usize) -> Hw {
        Hw { h, w }
    }
    /// The same size along both axes.
    pub const fn square(v: usize) -> Hw {
        Hw { h: v, w: v }
    }
    /// Whether both axes hold the same size.
    pub fn is_square(&self) -> bool {
        self.h == self.w
    }
    /// Whether either axis is 0.
    pub fn any_zero(&self) -> bool {
        self.h == 0 || self.w == 0
    }
}

impl From<usize> for Hw {
    fn from(v: usize) -> Hw {
        Hw::square(v)
    }
}

impl From<(usize, usize)> for Hw {
    fn from((h, w): (usize, usize)) -> Hw {
        Hw { h, w }
    }
}

impl fmt::Display for Hw {
    /// `3` for a square size, `3x1` (rows x columns) otherwise.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_square() {
            write!(f, "{}", self.h)
        } else {
            write!(f, "{}x{}", self.h, self.w)
        }
    }
}

/// The span of a dilated kernel: dilation·(k − 1) + 1 (None for k = 0 or on overflow).
fn span(kernel: usize, dilation: usize) -> Option<usize> {
    dilation.checked_mul(kernel.checked_sub(1)?)?.checked_add(1)
}

/// A convolution's output size along one axis: ⌊(input + 2·padding − span) / stride⌋ + 1, or
/// None when the dilated kernel does not fit the padded input (or stride is 0).
pub fn conv_out_size(
    input: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
) -> Option<usize> {
    pool_out_size(input, kernel, stride, padding, dilation, false)
}

/// A pooling's output size along one axis, PyTorch's `pooling_output_shape`: as
/// [`conv_out_size`] with ⌈ ⌉ instead of ⌊ ⌋ under `ceil_mode`, except that the last window
/// must start inside the input or its left padding (a window starting in the right padding is
/// dropped). None when no window fits (or stride is 0).
pub fn pool_out_size(
    input: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
    ceil_mode: bool,
) -> Option<usize> {
    let padded = input.checked_add(padding.checked_mul(2)?)?;
    let room = padded.checked_sub(span(kernel, dilation)?)?;
    if stride == 0 {
        return None;
    }
    if !ceil_mode {
        return Some(room / stride + 1);
    }
    let mut out = room.div_ceil(stride) + 1;
    if (out - 1) * stride >= input + padding {
        out -= 1;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conv_sizes() {
        assert_eq!(conv_out_size(32, 3, 1, 1, 1), Some(32));
        assert_eq!(conv_out_size(32, 3, 2, 1, 1), Some(16));
        assert_eq!(conv_out_size(7, 3, 1, 0, 2), Some(3));
        assert_eq!(conv_out_size(2, 5, 1, 0, 1), None);
        assert_eq!(conv_out_size(5, 3, 0, 0, 1), None);
        assert_eq!(conv_out_size(5, 0, 1, 0, 1), None);
        assert_eq!(conv_out_size(usize::MAX, 3, 1, 1, 1), None);
    }

    /// Sizes PyTorch 2.x gives (`F.max_pool2d(...).shape`, input, kernel, stride, padding,
    /// dilation, floor / ceil).
    #[test]
    fn pool_sizes() {
        let cases = [
            // ceil adds a window holding only the last column.
            ((5, 2, 2, 0, 1), (2, 3)),
            // exact fit: ceil adds nothing.
            ((6, 2, 2, 0, 1), (3, 3)),
            ((4, 2, 2, 1, 1), (3, 3)),
            // ceil's extra window would start at 4 (3), in the right padding: dropped.
            ((3, 2, 2, 1, 1), (2, 2)),
            ((5, 3, 3, 1, 1), (2, 2)),
            ((4, 3, 3, 1, 1), (2, 2)),
            // dilation 2 (span 3).
            ((6, 2, 2, 0, 2), (2, 3)),
            ((2, 3, 3, 1, 1), (1, 1)),
            ((7, 3, 2, 1, 1), (4, 4)),
        ];
        for ((i, k, s, p, d), (floor, ceil)) in cases {
            assert_eq!(
                pool_out_size(i, k, s, p, d, false),
                Some(floor),
                "{i} {k} {s} {p} {d}"
            );
            assert_eq!(
                pool_out_size(i, k, s, p, d, true),
                Some(ceil),
                "{i} {k} {s} {p} {d} ceil"
            );
        }
        assert_eq!(pool_out_size(1, 3, 1, 0, 1, true), None);
        assert_eq!(pool_out_size(4, 2, 0, 0, 1, true), None);
    }

    #[test]
    fn hw() {
        assert_eq!(Hw::from(3), Hw::new(3, 3));
        assert_eq!(Hw::from((3, 1)), Hw { h: 3, w: 1 });
        assert_eq!(Hw::new(3, 1).to_string(), "3x1");
        assert_eq!(Hw::square(2).to_string(), "2");
        assert!(Hw::new(0, 2).any_zero());
    }
}
