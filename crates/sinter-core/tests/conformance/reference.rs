//! The f64 reference of every op: one plain function per op over [`Arr`], a row-major f64
//! n-d array, written independently of the crate (no sinter op is called here except
//! `sinter_core::op::erf`, whose accuracy is tested in sinter-types against a series).
//! Gradients are not written here: the harness differentiates these functions by central
//! differences in f64 (see `harness::check`), so each op has exactly one reference.

use sinter_core::kernels::attention::reference as attn_ref;
use sinter_core::op::{pool_max_replaces, ReduceOp};
use sinter_core::{bf16, f16, DType};

/// Row-major strides.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Calls `f` with every multi-index of `shape`, in row-major order.
pub fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    let n: usize = shape.iter().product();
    let mut idx = vec![0usize; shape.len()];
    for _ in 0..n {
        f(&idx);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// NumPy broadcasting.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let n = a.len().max(b.len());
    let at = |s: &[usize], i: usize| {
        if i + s.len() >= n {
            s[i + s.len() - n]
        } else {
            1
        }
    };
    (0..n)
        .map(|i| {
            let (da, db) = (at(a, i), at(b, i));
            assert!(da == db || da == 1 || db == 1, "test bug: {a:?} vs {b:?}");
            da.max(db)
        })
        .collect()
}

fn resolve(dim: isize, rank: usize) -> usize {
    if dim < 0 {
        (dim + rank as isize) as usize
    } else {
        dim as usize
    }
}

/// A plain f64 n-d array.
#[derive(Clone, Debug, PartialEq)]
pub struct Arr {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl Arr {
    pub fn new(shape: &[usize], data: Vec<f64>) -> Arr {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "test bug: size"
        );
        Arr {
            shape: shape.to_vec(),
            data,
        }
    }
    pub fn scalar(v: f64) -> Arr {
        Arr::new(&[], vec![v])
    }
    pub fn from_fn(shape: &[usize], mut f: impl FnMut(&[usize]) -> f64) -> Arr {
        let mut data = Vec::with_capacity(shape.iter().product());
        for_each_index(shape, |i| data.push(f(i)));
        Arr::new(shape, data)
    }
    pub fn ints(shape: &[usize], v: &[i64]) -> Arr {
        Arr::new(shape, v.iter().map(|&x| x as f64).collect())
    }
    pub fn numel(&self) -> usize {
        self.data.len()
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// Row-major offset of an index (no allocation: the references call this in loops).
    pub fn offset(&self, idx: &[usize]) -> usize {
        debug_assert_eq!(idx.len(), self.shape.len());
        let mut off = 0;
        for (i, d) in idx.iter().zip(&self.shape) {
            off = off * d + i;
        }
        off
    }
    pub fn get(&self, idx: &[usize]) -> f64 {
        self.data[self.offset(idx)]
    }
    /// Reads at an index of a broadcast shape: trailing dims align, size-1 dims read 0.
    pub fn get_bcast(&self, idx: &[usize]) -> f64 {
        let lead = idx.len() - self.shape.len();
        let mut off = 0;
        for (k, &d) in self.shape.iter().enumerate() {
            off = off * d + if d == 1 { 0 } else { idx[lead + k] };
        }
        self.data[off]
    }
    pub fn map(&self, f: impl Fn(f64) -> f64) -> Arr {
        Arr::new(&self.shape, self.data.iter().map(|&x| f(x)).collect())
    }
    /// Elementwise with broadcasting.
    pub fn zip(&self, other: &Arr, f: impl Fn(f64, f64) -> f64) -> Arr {
        let shape = broadcast_shape(&self.shape, &other.shape);
        Arr::from_fn(&shape, |i| f(self.get_bcast(i), other.get_bcast(i)))
    }
    pub fn add(&self, o: &Arr) -> Arr {
        self.zip(o, |a, b| a + b)
    }
    pub fn mul(&self, o: &Arr) -> Arr {
        self.zip(o, |a, b| a * b)
    }

    // ---- views (materialised) ----
    pub fn reshape(&self, shape: &[usize]) -> Arr {
        Arr::new(shape, self.data.clone())
    }
    pub fn permute(&self, perm: &[usize]) -> Arr {
        let shape: Vec<usize> = perm.iter().map(|&p| self.shape[p]).collect();
        let st = strides(&self.shape);
        let src: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
        let mut data = Vec::with_capacity(self.numel());
        for_each_index(&shape, |i| {
            data.push(self.data[i.iter().zip(&src).map(|(a, b)| a * b).sum::<usize>()]);
        });
        Arr::new(&shape, data)
    }
    pub fn transpose(&self, a: isize, b: isize) -> Arr {
        let (a, b) = (resolve(a, self.rank()), resolve(b, self.rank()));
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }
    /// Swaps the last two dims.
    pub fn t(&self) -> Arr {
        self.transpose(-2, -1)
    }
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Arr {
        let d = resolve(dim, self.rank());
        let mut shape = self.shape.clone();
        shape[d] = len;
        Arr::from_fn(&shape, |i| {
            let mut j = i.to_vec();
            j[d] += start;
            self.get(&j)
        })
    }
    pub fn broadcast_to(&self, shape: &[usize]) -> Arr {
        Arr::from_fn(shape, |i| self.get_bcast(i))
    }
    pub fn unsqueeze(&self, dim: usize) -> Arr {
        let mut shape = self.shape.clone();
        shape.insert(dim, 1);
        self.reshape(&shape)
    }
    pub fn squeeze(&self, dim: usize) -> Arr {
        let mut shape = self.shape.clone();
        assert_eq!(shape.remove(dim), 1);
        self.reshape(&shape)
    }
}

// ---- rounding to a dtype ----------------------------------------------------------------------

/// `x` rounded to nearest (ties to even) in `dtype`; i64 truncates toward zero, like a cast.
pub fn round_to(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F32 => x as f32 as f64,
        DType::F16 => f16::from_f64(x).to_f64(),
        DType::BF16 => bf16::from_f64(x).to_f64(),
        DType::I64 => x.trunc(),
        // torch.bool: non-zero (NaN included) is true.
        DType::Bool => (x != 0.0) as u8 as f64,
        other => panic!("test bug: {other} is not a tensor dtype"),
    }
}

pub fn rounded(a: &Arr, dtype: DType) -> Arr {
    a.map(|x| round_to(dtype, x))
}

/// Unit roundoff: half the distance from 1 to the next value of `dtype`.
pub fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2f64.powi(-24),
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ => 0.0,
    }
}

// ---- unary and binary maps ---------------------------------------------------------------------

pub use sinter_core::op::erf;

/// GELU's tanh form: the op's one f64 reference.
pub use sinter_core::kernels::bias_gelu::reference::gelu_tanh;
pub fn gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x / 2f64.sqrt()))
}
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}
pub fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}
pub fn relu(x: f64) -> f64 {
    x.max(0.0)
}

/// Two's-complement wrapping of an exact integer result into i64.
pub fn wrap_i64(x: i128) -> f64 {
    x as i64 as f64
}

// ---- reductions ----------------------------------------------------------------------------------

/// Reduces over `dims` (any order, negative allowed) with `f` over the reduced values in
/// row-major order.
pub fn reduce(a: &Arr, dims: &[isize], keepdim: bool, f: impl Fn(&[f64]) -> f64) -> Arr {
    let ds: Vec<usize> = dims.iter().map(|&d| resolve(d, a.rank())).collect();
    let kept: Vec<usize> = (0..a.rank())
        .map(|i| if ds.contains(&i) { 1 } else { a.shape[i] })
        .collect();
    let red: Vec<usize> = (0..a.rank())
        .map(|i| if ds.contains(&i) { a.shape[i] } else { 1 })
        .collect();
    let out = Arr::from_fn(&kept, |o| {
        let mut v = Vec::new();
        for_each_index(&red, |k| {
            let idx: Vec<usize> = o.iter().zip(k).map(|(a, b)| a + b).collect();
            v.push(a.get(&idx));
        });
        f(&v)
    });
    if keepdim {
        out
    } else {
        let shape: Vec<usize> = (0..a.rank())
            .filter(|i| !ds.contains(i))
            .map(|i| a.shape[i])
            .collect();
        Arr::new(&shape, out.data)
    }
}

pub fn sum(v: &[f64]) -> f64 {
    v.iter().sum()
}
pub fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}
/// Σ (x − mean)² / max(0, N − correction) (`torch.var`).
pub fn var(v: &[f64], correction: f64) -> f64 {
    let m = mean(v);
    v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() as f64 - correction).max(0.0)
}
/// The maximum (NaN if any element is NaN; −inf of nothing): the shared rule of
/// `ReduceOp::reduce_f64`.
pub fn max(v: &[f64]) -> f64 {
    ReduceOp::Max.reduce_f64(v).unwrap_or(f64::NEG_INFINITY)
}
pub fn min(v: &[f64]) -> f64 {
    ReduceOp::Min.reduce_f64(v).unwrap_or(f64::INFINITY)
}
/// Index of the first maximum (of the first NaN, if any).
pub fn argmax(v: &[f64]) -> f64 {
    ReduceOp::ArgMax
        .reduce_f64(v)
        .expect("argmax of a non-empty row")
}
/// Exact i64 sum with two's-complement wrapping (PyTorch's integer semantics).
pub fn sum_i64(v: &[f64]) -> f64 {
    wrap_i64(v.iter().map(|&x| x as i64 as i128).sum())
}

/// Applies `f` to every 1-D row along `dim` (a row-to-row map of the same length).
pub fn along(a: &Arr, dim: isize, f: impl Fn(&[f64]) -> Vec<f64>) -> Arr {
    let d = resolve(dim, a.rank());
    let mut out = a.clone();
    let st = strides(&a.shape);
    let mut outer = a.shape.clone();
    outer[d] = 1;
    for_each_index(&outer, |o| {
        let base: usize = o.iter().zip(&st).map(|(i, s)| i * s).sum();
        let row: Vec<f64> = (0..a.shape[d]).map(|k| a.data[base + k * st[d]]).collect();
        for (k, v) in f(&row).into_iter().enumerate() {
            out.data[base + k * st[d]] = v;
        }
    });
    out
}

use sinter_core::kernels::softmax::reference::log_sum_exp as logsumexp;

/// Softmax along `dim`: the op's one f64 reference, row by row.
pub fn softmax(a: &Arr, dim: isize) -> Arr {
    use sinter_core::kernels::softmax::reference::forward;
    along(a, dim, |row| forward(row, row.len(), false))
}
pub fn log_softmax(a: &Arr, dim: isize) -> Arr {
    use sinter_core::kernels::softmax::reference::forward;
    along(a, dim, |row| forward(row, row.len(), true))
}

// ---- linear algebra ------------------------------------------------------------------------------

/// [..., m, k] @ [..., k, n] with broadcast batch dimensions.
pub fn matmul(a: &Arr, b: &Arr) -> Arr {
    let (ra, rb) = (a.rank(), b.rank());
    let (m, k, n) = (a.shape[ra - 2], a.shape[ra - 1], b.shape[rb - 1]);
    assert_eq!(k, b.shape[rb - 2], "test bug: matmul inner dims");
    let batch = broadcast_shape(&a.shape[..ra - 2], &b.shape[..rb - 2]);
    let (ba, bb) = (
        Arr::new(&a.shape[..ra - 2], vec![0.0; a.numel() / (m * k)]),
        Arr::new(&b.shape[..rb - 2], vec![0.0; b.numel() / (k * n)]),
    );
    let mut shape = batch.clone();
    shape.extend([m, n]);
    let mut out = Vec::with_capacity(shape.iter().product());
    for_each_index(&batch, |bi| {
        // The matrix of each operand this batch index reads (size-1 batch dims broadcast).
        let (oa, ob) = (bcast_offset(&ba, bi) * m * k, bcast_offset(&bb, bi) * k * n);
        for r in 0..m {
            for c in 0..n {
                out.push(
                    (0..k)
                        .map(|kk| a.data[oa + r * k + kk] * b.data[ob + kk * n + c])
                        .sum(),
                );
            }
        }
    });
    Arr::new(&shape, out)
}

/// The offset in `a` (of shape `a.shape`) read at broadcast index `idx`.
fn bcast_offset(a: &Arr, idx: &[usize]) -> usize {
    let lead = idx.len() - a.shape.len();
    let mut off = 0;
    for (kk, &d) in a.shape.iter().enumerate() {
        off = off * d + if d == 1 { 0 } else { idx[lead + kk] };
    }
    off
}

/// Convolution geometry: stride, padding and dilation as [rows, columns], and groups.
#[derive(Clone, Copy, Debug)]
pub struct Conv {
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
}

impl Conv {
    pub const fn square(stride: usize, padding: usize, dilation: usize, groups: usize) -> Conv {
        Conv {
            stride: [stride; 2],
            padding: [padding; 2],
            dilation: [dilation; 2],
            groups,
        }
    }
}

/// Direct convolution: out[n,o,y,x] = Σ_c Σ_ky Σ_kx in[n, g·cg + c, y·sh − ph + ky·dh, x·sw − pw + kx·dw] · w[o,c,ky,kx].
pub fn conv2d(x: &Arr, w: &Arr, p: Conv) -> Arr {
    let (n, c, h, wd) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let (o, cg, kh, kw) = (w.shape[0], w.shape[1], w.shape[2], w.shape[3]);
    assert_eq!(cg * p.groups, c, "test bug: conv channels");
    let og = o / p.groups;
    let out = |a: usize, len: usize, k: usize| {
        (len + 2 * p.padding[a] - p.dilation[a] * (k - 1) - 1) / p.stride[a] + 1
    };
    let (oh, ow) = (out(0, h, kh), out(1, wd, kw));
    // Input coordinate along axis a under output o at tap k (None: padding).
    let at = |a: usize, o: usize, k: usize, len: usize| {
        let v = (o * p.stride[a] + k * p.dilation[a]) as isize - p.padding[a] as isize;
        (v >= 0 && v < len as isize).then_some(v as usize)
    };
    Arr::from_fn(&[n, o, oh, ow], |i| {
        let (ni, oi, oy, ox) = (i[0], i[1], i[2], i[3]);
        let g = oi / og;
        let mut s = 0.0;
        for ci in 0..cg {
            for ky in 0..kh {
                for kx in 0..kw {
                    let (Some(iy), Some(ix)) = (at(0, oy, ky, h), at(1, ox, kx, wd)) else {
                        continue;
                    };
                    s += x.data[((ni * c + g * cg + ci) * h + iy) * wd + ix]
                        * w.data[((oi * cg + ci) * kh + ky) * kw + kx];
                }
            }
        }
        s
    })
}

/// A 2-D pooling's window, PyTorch's arguments: kernel, stride, padding, dilation as [rows,
/// columns], ceil mode and (average pooling) whether padding counts in the divisor.
#[derive(Clone, Copy, Debug)]
pub struct Pool {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub ceil_mode: bool,
    pub count_include_pad: bool,
}

impl Pool {
    /// PyTorch's `pooling_output_shape` along axis a, written out as its source reads
    /// (signed arithmetic, the ceil-mode window dropped when it starts past the left-padded
    /// input).
    pub fn out(&self, a: usize, len: usize) -> usize {
        let (k, s, p, d) = (
            self.kernel[a] as i64,
            self.stride[a] as i64,
            self.padding[a] as i64,
            self.dilation[a] as i64,
        );
        let num = len as i64 + 2 * p - d * (k - 1) - 1 + if self.ceil_mode { s - 1 } else { 0 };
        let mut out = num.div_euclid(s) + 1;
        if self.ceil_mode && (out - 1) * s >= len as i64 + p {
            out -= 1;
        }
        assert!(out > 0, "test bug: empty pooling output");
        out as usize
    }
}

/// Max pooling (padding is −∞: it never wins) or average pooling (PyTorch's divisor: the
/// window clipped to the padded input when padding counts, else its input pixels).
pub fn pool2d(x: &Arr, p: Pool, is_max: bool) -> Arr {
    let (n, c, h, w) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let (oh, ow) = (p.out(0, h), p.out(1, w));
    Arr::from_fn(&[n, c, oh, ow], |i| {
        let (mut best, mut total, mut inside) = (f64::NEG_INFINITY, 0.0, 0usize);
        for ky in 0..p.kernel[0] {
            for kx in 0..p.kernel[1] {
                let iy = (i[2] * p.stride[0] + ky * p.dilation[0]) as isize - p.padding[0] as isize;
                let ix = (i[3] * p.stride[1] + kx * p.dilation[1]) as isize - p.padding[1] as isize;
                if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                    continue;
                }
                let v = x.get(&[i[0], i[1], iy as usize, ix as usize]);
                if pool_max_replaces(best as f32, v as f32) {
                    best = v;
                }
                total += v;
                inside += 1;
            }
        }
        if is_max {
            return best;
        }
        // Window positions inside the padded input along each axis.
        let padded = |a: usize, o: usize, len: usize| {
            let start = (o * p.stride[a]) as isize - p.padding[a] as isize;
            let end = (start + p.kernel[a] as isize).min((len + p.padding[a]) as isize);
            (end - start) as usize
        };
        let div = if p.count_include_pad {
            padded(0, i[2], h) * padded(1, i[3], w)
        } else {
            inside
        };
        if inside == 0 {
            0.0
        } else {
            total / div as f64
        }
    })
}

// ---- normalisation and losses ----------------------------------------------------------------------

/// LayerNorm over the last dimension with affine gain and bias: the op's one f64 reference.
pub fn layer_norm(x: &Arr, g: &Arr, b: &Arr, eps: f64) -> Arr {
    let n = *x.shape.last().unwrap();
    let (y, _, _) =
        sinter_core::kernels::layer_norm::reference::forward(&x.data, &g.data, &b.data, n, eps);
    Arr::new(&x.shape, y)
}

/// Mean over the non-ignored rows of −log softmax(logits)[target]; `targets` holds class ids.
pub fn cross_entropy(logits: &Arr, targets: &Arr, ignore: i64) -> Arr {
    cross_entropy_with(logits, targets, None, 0.0, ignore, "mean")
}

/// `torch.nn.functional.cross_entropy` with class weights `w`, label smoothing `eps` and
/// reduction `mean` / `sum` / `none`, written from PyTorch's definition: row r's loss is
/// (1 − ε)·w[t]·(lse − x_t) + ε/C·Σ_c w_c·(lse − x_c) (0 when t is ignored), and the mean
/// divides by Σ w[t] over the counted rows.
pub fn cross_entropy_with(
    logits: &Arr,
    targets: &Arr,
    w: Option<&Arr>,
    eps: f64,
    ignore: i64,
    reduction: &str,
) -> Arr {
    let c = *logits.shape.last().unwrap();
    let weight = |k: usize| w.map_or(1.0, |w| w.data[k]);
    let (mut losses, mut denominator) = (Vec::new(), 0.0);
    for (row, &t) in logits.data.chunks(c).zip(&targets.data) {
        if t as i64 == ignore {
            losses.push(0.0);
            continue;
        }
        let (lse, t) = (logsumexp(row), t as usize);
        let smooth: f64 = (0..c).map(|k| weight(k) * (lse - row[k])).sum();
        losses.push((1.0 - eps) * weight(t) * (lse - row[t]) + eps / c as f64 * smooth);
        denominator += weight(t);
    }
    let total: f64 = losses.iter().sum();
    match reduction {
        "none" => Arr::new(&targets.shape, losses),
        "sum" => Arr::scalar(total),
        _ => Arr::scalar(total / denominator),
    }
}

pub fn mse(a: &Arr, b: &Arr) -> Arr {
    let d = a.zip(b, |x, y| (x - y) * (x - y));
    Arr::scalar(mean(&d.data))
}

// ---- gathers, scatters, concatenation ------------------------------------------------------------

pub fn index_select(x: &Arr, dim: isize, idx: &Arr) -> Arr {
    let d = resolve(dim, x.rank());
    let mut shape = x.shape.clone();
    shape[d] = idx.numel();
    Arr::from_fn(&shape, |i| {
        let mut j = i.to_vec();
        j[d] = idx.data[i[d]] as usize;
        x.get(&j)
    })
}

/// Rows of `table` [v, e] picked by `ids` of any shape: [..ids, e].
pub fn embedding(table: &Arr, ids: &Arr) -> Arr {
    let e = table.shape[1];
    let mut shape = ids.shape.clone();
    shape.push(e);
    Arr::new(
        &shape,
        ids.data
            .iter()
            .flat_map(|&t| table.data[t as usize * e..(t as usize + 1) * e].to_vec())
            .collect(),
    )
}

pub fn index_add(base: &Arr, dim: isize, idx: &Arr, src: &Arr) -> Arr {
    let d = resolve(dim, base.rank());
    let mut out = base.clone();
    let st = strides(&base.shape);
    for_each_index(&src.shape, |i| {
        let mut j = i.to_vec();
        j[d] = idx.data[i[d]] as usize;
        let off: usize = j.iter().zip(&st).map(|(a, b)| a * b).sum();
        out.data[off] += src.get(i);
    });
    out
}

pub fn cat(parts: &[Arr], dim: isize) -> Arr {
    let d = resolve(dim, parts[0].rank());
    let mut shape = parts[0].shape.clone();
    shape[d] = parts.iter().map(|p| p.shape[d]).sum();
    Arr::from_fn(&shape, |i| {
        let mut k = i[d];
        for p in parts {
            if k < p.shape[d] {
                let mut j = i.to_vec();
                j[d] = k;
                return p.get(&j);
            }
            k -= p.shape[d];
        }
        unreachable!()
    })
}

pub fn stack(parts: &[Arr], dim: isize) -> Arr {
    let d = resolve(dim, parts[0].rank() + 1);
    let us: Vec<Arr> = parts.iter().map(|p| p.unsqueeze(d)).collect();
    cat(&us, d as isize)
}

/// `cond != 0 ? a : b`, broadcast.
pub fn where_cond(cond: &Arr, a: &Arr, b: &Arr) -> Arr {
    let shape = broadcast_shape(&broadcast_shape(&cond.shape, &a.shape), &b.shape);
    Arr::from_fn(&shape, |i| {
        if cond.get_bcast(i) != 0.0 {
            a.get_bcast(i)
        } else {
            b.get_bcast(i)
        }
    })
}

// ---- fused Transformer ops --------------------------------------------------------------------------

/// softmax(scale · q kᵀ [+ causal mask]) v for q [b, h, tq, d], k and v [b, h, tk, d]; causal
/// aligns bottom-right (query i sees keys 0..=tk − tq + i); a row that sees no key gives 0.
/// The one f64 reference, `sinter_core::kernels::attention::reference`.
pub fn attention(q: &Arr, k: &Arr, v: &Arr, causal: bool, scale: f64) -> Arr {
    let z = attention_dims(q, k);
    let (o, _) = attn_ref::forward(&q.data, &k.data, &v.data, z, causal, scale);
    Arr::new(&q.shape, o)
}

fn attention_dims(q: &Arr, k: &Arr) -> attn_ref::Dims {
    attn_ref::Dims {
        bh: q.shape[0] * q.shape[1],
        tq: q.shape[2],
        tk: k.shape[2],
        d: q.shape[3],
    }
}

/// gelu_tanh(x Wᵀ + b) over the last dimension.
pub fn linear_bias_gelu(x: &Arr, w: &Arr, b: &Arr) -> Arr {
    matmul(x, &w.t()).add(b).map(gelu_tanh)
}

// ---- optimizers and the step control block ------------------------------------------------------

/// One AdamW step (decoupled weight decay, bias-corrected moments); returns (p, m, v).
#[allow(clippy::too_many_arguments)]
pub fn adamw(
    p: f64,
    g: f64,
    m: f64,
    v: f64,
    lr: f64,
    (beta1, beta2): (f64, f64),
    eps: f64,
    weight_decay: f64,
    step: i32,
) -> (f64, f64, f64) {
    let m = beta1 * m + (1.0 - beta1) * g;
    let v = beta2 * v + (1.0 - beta2) * g * g;
    let mhat = m / (1.0 - beta1.powi(step));
    let vhat = v / (1.0 - beta2.powi(step));
    (
        p - lr * (mhat / (vhat.sqrt() + eps) + weight_decay * p),
        m,
        v,
    )
}

/// One SGD step (PyTorch's: decay added to the gradient, buf = μ·buf + d, Nesterov looks
/// ahead); returns (p, buf).
pub fn sgd(
    p: f64,
    g: f64,
    buf: f64,
    lr: f64,
    momentum: f64,
    nesterov: bool,
    wd: f64,
) -> (f64, f64) {
    let d = g + wd * p;
    if momentum == 0.0 {
        return (p - lr * d, buf);
    }
    let buf = momentum * buf + d;
    let step = if nesterov { d + momentum * buf } else { buf };
    (p - lr * step, buf)
}

/// The step control block of one training step, as documented in `sinter_core::step_ctl`:
/// `prepare` turns the squared norm of the loss-scaled gradients into the gradient factor
/// (unscale and clip) and the found-inf flag; `finish` shrinks the scale on a skipped step,
/// counts a good one (growing the scale after `interval` in a row) and loads the next learning
/// rate from the schedule.
#[derive(Clone, Debug)]
pub struct StepControl {
    pub scale: f64,
    pub lr: f64,
    pub steps: f64,
    pub good: f64,
    pub iter: f64,
    pub skipped: f64,
    pub found_inf: bool,
    pub grad_norm: f64,
    pub factor: f64,
}

impl StepControl {
    pub fn prepare(&mut self, sumsq: f64, max_norm: f64, dynamic: bool) {
        let bad = !sumsq.is_finite();
        self.found_inf = dynamic && bad;
        self.grad_norm = sumsq.sqrt() / self.scale;
        let clip = if !bad && max_norm > 0.0 && self.grad_norm > max_norm {
            max_norm / (self.grad_norm + 1e-6)
        } else {
            1.0
        };
        self.factor = clip / self.scale;
    }
    pub fn finish(&mut self, lr_table: &[f64], growth: f64, backoff: f64, interval: f64) {
        if self.found_inf {
            self.scale *= backoff;
            self.good = 0.0;
            self.skipped += 1.0;
        } else {
            self.steps += 1.0;
            self.good += 1.0;
            if self.good >= interval {
                self.scale *= growth;
                self.good = 0.0;
            }
        }
        self.found_inf = false;
        self.iter += 1.0;
        self.lr = lr_table[(self.iter as usize).min(lr_table.len() - 1)];
    }
}

/// The vector-Jacobian product of [`attention`]: (dq, dk, dv) of Σ w ∘ attention(q, k, v).
/// Written out because central differences over attention's inputs cost O(inputs × output)
/// evaluations; the suite checks it against central differences on small shapes
/// (`reference::attention_vjp`).
pub fn attention_vjp(q: &Arr, k: &Arr, v: &Arr, causal: bool, scale: f64, w: &Arr) -> [Arr; 3] {
    let z = attention_dims(q, k);
    let (dq, dk, dv) = attn_ref::backward(&q.data, &k.data, &v.data, &w.data, z, causal, scale);
    [
        Arr::new(&q.shape, dq),
        Arr::new(&k.shape, dk),
        Arr::new(&v.shape, dv),
    ]
}
