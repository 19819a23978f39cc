//! The operands of the public API: strided matrix views, their bounds check, and the error
//! every bad argument becomes. Below the driver and the prepacked operand, which both use them.

/// A bad argument: what is wrong and with which operand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GemmError(pub String);

impl std::fmt::Display for GemmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "gemm: {}", self.0)
    }
}

impl std::error::Error for GemmError {}

/// A read-only strided matrix: element (i, j) is `data[offset + i·rs + j·cs]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub data: &'a [f32],
    pub offset: usize,
    pub rs: isize,
    pub cs: isize,
}

/// A writable strided matrix: element (i, j) is `data[offset + i·rs + j·cs]`.
#[derive(Debug)]
pub struct MatMut<'a> {
    pub data: &'a mut [f32],
    pub offset: usize,
    pub rs: isize,
    pub cs: isize,
}

/// (lowest, highest) element offset a rows × cols view addresses, relative to its offset.
pub(super) fn reach(rows: usize, cols: usize, rs: isize, cs: isize) -> (isize, isize) {
    let (r, c) = (
        rows.saturating_sub(1) as isize,
        cols.saturating_sub(1) as isize,
    );
    (r * rs.min(0) + c * cs.min(0), r * rs.max(0) + c * cs.max(0))
}

pub(super) fn check_view(
    what: &str,
    len: usize,
    offset: usize,
    rows: usize,
    cols: usize,
    rs: isize,
    cs: isize,
) -> Result<(), GemmError> {
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let (lo, hi) = reach(rows, cols, rs, cs);
    let (lo, hi) = (offset as isize + lo, offset as isize + hi);
    if lo < 0 || hi >= len as isize {
        return Err(GemmError(format!("{what} ({rows} × {cols}, offset {offset}, strides ({rs}, {cs})) addresses elements {lo}..={hi} outside its {len} values")));
    }
    Ok(())
}

impl<'a> MatRef<'a> {
    /// A row-major matrix with `cols` columns at the start of `data`.
    pub fn row_major(data: &'a [f32], cols: usize) -> Self {
        MatRef {
            data,
            offset: 0,
            rs: cols as isize,
            cs: 1,
        }
    }
    /// The transposed view (no copy).
    pub fn t(self) -> Self {
        MatRef {
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }
    pub(crate) fn check(&self, what: &str, rows: usize, cols: usize) -> Result<(), GemmError> {
        check_view(
            what,
            self.data.len(),
            self.offset,
            rows,
            cols,
            self.rs,
            self.cs,
        )
    }
}

impl<'a> MatMut<'a> {
    /// A row-major matrix with `cols` columns at the start of `data`.
    pub fn row_major(data: &'a mut [f32], cols: usize) -> Self {
        MatMut {
            data,
            offset: 0,
            rs: cols as isize,
            cs: 1,
        }
    }
}
