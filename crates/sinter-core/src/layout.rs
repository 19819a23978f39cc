//! Shapes and strided layouts. Every view (reshape of contiguous data, transpose, permute,
//! narrow, broadcast, squeeze/unsqueeze) is a new `Layout` over the same storage.

use crate::{Error, Result};

/// Row-major strides of a contiguous tensor of this shape.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut s = 1;
    for i in (0..shape.len()).rev() {
        strides[i] = s;
        s *= shape[i];
    }
    strides
}

pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Resolves a possibly negative dimension index.
pub fn resolve_dim(op: &'static str, dim: isize, rank: usize) -> Result<usize> {
    let d = if dim < 0 { dim + rank as isize } else { dim };
    if d < 0 || d as usize >= rank {
        return Err(Error::DimOutOfRange { op, dim, rank });
    }
    Ok(d as usize)
}

/// The shape two operands broadcast to (NumPy rules).
pub fn broadcast_shape(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(Error::ShapeMismatch {
                op,
                lhs: a.to_vec(),
                rhs: b.to_vec(),
            });
        };
    }
    Ok(out)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

impl Layout {
    pub fn contiguous(shape: &[usize]) -> Self {
        Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }
    pub fn new(shape: Vec<usize>, strides: Vec<usize>, offset: usize) -> Self {
        Layout {
            shape,
            strides,
            offset,
        }
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }
    /// True when the elements are laid out row-major without gaps (size-1 dims may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for i in (0..self.shape.len()).rev() {
            if self.shape[i] != 1 && self.strides[i] != expected {
                return false;
            }
            expected *= self.shape[i];
        }
        true
    }
    /// The contiguous range of storage this layout covers, if it is contiguous.
    pub fn contiguous_range(&self) -> Option<std::ops::Range<usize>> {
        self.is_contiguous()
            .then(|| self.offset..self.offset + self.numel())
    }

    pub fn transpose(&self, d0: usize, d1: usize) -> Layout {
        let mut l = self.clone();
        l.shape.swap(d0, d1);
        l.strides.swap(d0, d1);
        l
    }
    pub fn permute(&self, dims: &[usize]) -> Result<Layout> {
        let mut seen = vec![false; self.rank()];
        if dims.len() != self.rank() {
            return Err(Error::Msg(format!(
                "permute: {} dims given for a tensor of rank {}",
                dims.len(),
                self.rank()
            )));
        }
        for &d in dims {
            if d >= self.rank() || seen[d] {
                return Err(Error::Msg(format!(
                    "permute: {dims:?} is not a permutation of 0..{}",
                    self.rank()
                )));
            }
            seen[d] = true;
        }
        Ok(Layout {
            shape: dims.iter().map(|&d| self.shape[d]).collect(),
            strides: dims.iter().map(|&d| self.strides[d]).collect(),
            offset: self.offset,
        })
    }
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Layout> {
        if start + len > self.shape[dim] {
            return Err(Error::Msg(format!(
                "narrow: range {start}..{} is outside dimension {dim} of size {}",
                start + len,
                self.shape[dim]
            )));
        }
        let mut l = self.clone();
        l.offset += start * self.strides[dim];
        l.shape[dim] = len;
        Ok(l)
    }
    /// A stride-0 view that repeats this layout to `shape`.
    pub fn broadcast_as(&self, shape: &[usize]) -> Result<Layout> {
        let n = shape.len();
        if n < self.rank() {
            return Err(Error::ShapeMismatch {
                op: "broadcast_as",
                lhs: self.shape.clone(),
                rhs: shape.to_vec(),
            });
        }
        let lead = n - self.rank();
        let mut strides = vec![0; n];
        for i in 0..n {
            if i < lead {
                continue;
            }
            let d = self.shape[i - lead];
            if d == shape[i] {
                strides[i] = self.strides[i - lead];
            } else if d != 1 {
                return Err(Error::ShapeMismatch {
                    op: "broadcast_as",
                    lhs: self.shape.clone(),
                    rhs: shape.to_vec(),
                });
            }
        }
        Ok(Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }
    /// A view with a new shape; only possible without copying when the data is contiguous.
    pub fn reshape(&self, shape: &[usize]) -> Option<Layout> {
        if !self.is_contiguous() {
            return None;
        }
        Some(Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: self.offset,
        })
    }
    pub fn squeeze(&self, dim: usize) -> Layout {
        let mut l = self.clone();
        l.shape.remove(dim);
        l.strides.remove(dim);
        l
    }
    pub fn unsqueeze(&self, dim: usize) -> Layout {
        let mut l = self.clone();
        let stride = if dim < self.rank() {
            self.strides[dim] * self.shape[dim]
        } else {
            1
        };
        l.shape.insert(dim, 1);
        l.strides.insert(dim, stride);
        l
    }

    /// Storage offset of the first element of row `row`, where rows enumerate every index of
    /// all dimensions but the last, in row-major order.
    #[inline]
    pub fn row_offset(&self, mut row: usize) -> usize {
        let mut off = self.offset;
        if self.shape.len() < 2 {
            return off;
        }
        for i in (0..self.shape.len() - 1).rev() {
            let d = self.shape[i];
            off += (row % d) * self.strides[i];
            row /= d;
        }
        off
    }
    /// Length and stride of the last dimension (1, 1 for a scalar).
    pub fn last_dim(&self) -> (usize, usize) {
        match self.shape.last() {
            Some(&n) => (n, self.strides[self.rank() - 1]),
            None => (1, 1),
        }
    }
    /// Storage offsets of every element in row-major order (for generic strided walks).
    pub fn offsets(&self) -> Vec<usize> {
        let n = self.numel();
        let mut out = Vec::with_capacity(n);
        let (last, ls) = self.last_dim();
        if last == 0 {
            return out;
        }
        for r in 0..n / last {
            let base = self.row_offset(r);
            for j in 0..last {
                out.push(base + j * ls);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn views_keep_offsets_right() {
        let l = Layout::contiguous(&[2, 3, 4]);
        assert!(l.is_contiguous());
        let t = l.transpose(1, 2);
        assert_eq!(t.shape(), &[2, 4, 3]);
        assert!(!t.is_contiguous());
        assert_eq!(t.offsets()[..4], [0, 4, 8, 1]);
        let n = l.narrow(2, 1, 2).unwrap();
        assert_eq!(n.offsets()[..4], [1, 2, 5, 6]);
        let b = Layout::contiguous(&[3, 1])
            .broadcast_as(&[2, 3, 4])
            .unwrap();
        assert_eq!(b.offsets()[..6], [0, 0, 0, 0, 1, 1]);
        assert!(Layout::contiguous(&[3, 2]).broadcast_as(&[3, 4]).is_err());
        assert_eq!(
            broadcast_shape("t", &[4, 1, 3], &[5, 1]).unwrap(),
            vec![4, 5, 3]
        );
        assert!(broadcast_shape("t", &[2, 3], &[4]).is_err());
        assert_eq!(Layout::contiguous(&[2, 3]).unsqueeze(0).shape(), &[1, 2, 3]);
    }
}
