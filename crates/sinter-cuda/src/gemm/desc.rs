//! What a GEMM is, apart from who runs it: the descriptor ([`GemmDesc`]: operands, shape,
//! dtype, epilogue), its checks and cost, and its translation to cuBLASLt's column-major
//! parameters ([`lt_params`]). cuBLASLt (`gemm/mod.rs`) and the emulated device's host GEMM
//! (`emulated::blas`) both take it; it imports neither.

use cudarc::cublaslt::sys as ls;

use crate::alloc::DevSlice;
use crate::dtype::DType;
use crate::emulated::cost::{Call, GemmDims, GemmMath, OpClass, Traffic};
use crate::error::{CudaError, Result};

/// cuBLASLt workspace per device.
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// Element and math type of a GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmDType {
    /// f32 in, f32 out, full FP32 math.
    F32,
    /// f32 in and out, TF32 tensor-core math (10-bit mantissa products, f32 accumulate).
    Tf32,
    /// bf16 in and out, f32 accumulate.
    BF16,
    /// f16 in and out, f32 accumulate.
    F16,
}

impl GemmDType {
    /// Storage dtype of A, B, C (and the bias).
    pub fn storage(self) -> DType {
        match self {
            GemmDType::F32 | GemmDType::Tf32 => DType::F32,
            GemmDType::BF16 => DType::BF16,
            GemmDType::F16 => DType::F16,
        }
    }
    pub(crate) fn data_type(self) -> ls::cudaDataType {
        match self {
            GemmDType::F32 | GemmDType::Tf32 => ls::cudaDataType::CUDA_R_32F,
            GemmDType::BF16 => ls::cudaDataType::CUDA_R_16BF,
            GemmDType::F16 => ls::cudaDataType::CUDA_R_16F,
        }
    }
    pub(crate) fn compute_type(self) -> ls::cublasComputeType_t {
        match self {
            GemmDType::Tf32 => ls::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            _ => ls::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        }
    }
}

/// A row-major GEMM problem. Leading dims and batch strides are in elements; `None` = packed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// A is stored [k, m] and used transposed.
    pub trans_a: bool,
    /// B is stored [n, k] and used transposed.
    pub trans_b: bool,
    pub lda: Option<usize>,
    pub ldb: Option<usize>,
    pub ldc: Option<usize>,
    /// Number of matrices (1 = not batched).
    pub batch: usize,
    pub stride_a: Option<usize>,
    pub stride_b: Option<usize>,
    pub stride_c: Option<usize>,
}

impl GemmShape {
    /// Packed, untransposed, unbatched m x k times k x n.
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        GemmShape {
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            lda: None,
            ldb: None,
            ldc: None,
            batch: 1,
            stride_a: None,
            stride_b: None,
            stride_c: None,
        }
    }
    pub fn trans(mut self, trans_a: bool, trans_b: bool) -> Self {
        self.trans_a = trans_a;
        self.trans_b = trans_b;
        self
    }
    pub fn batched(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }
}

/// Where each element of a row-major [`GemmShape`] lives: leading dims and batch strides with
/// the packed defaults filled in. The one definition of the layout, used by [`lt_params`], the
/// emulated device's host GEMM and the tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Indexing {
    pub trans_a: bool,
    pub trans_b: bool,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
}

impl Indexing {
    /// Element offset of op(A)[i, kk] in batch `bt`.
    pub fn a(&self, bt: usize, i: usize, kk: usize) -> usize {
        bt * self.stride_a
            + if self.trans_a {
                kk * self.lda + i
            } else {
                i * self.lda + kk
            }
    }
    /// Element offset of op(B)[kk, j] in batch `bt`.
    pub fn b(&self, bt: usize, kk: usize, j: usize) -> usize {
        bt * self.stride_b
            + if self.trans_b {
                j * self.ldb + kk
            } else {
                kk * self.ldb + j
            }
    }
    /// Element offset of C[i, j] in batch `bt`.
    pub fn c(&self, bt: usize, i: usize, j: usize) -> usize {
        bt * self.stride_c + i * self.ldc + j
    }
}

impl GemmShape {
    /// Row-major storage shapes (rows, cols) of A, B and C.
    pub fn stored(&self) -> [(usize, usize); 3] {
        let a = if self.trans_a {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        };
        let b = if self.trans_b {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        };
        [a, b, (self.m, self.n)]
    }

    /// The layout of every operand (not validated: see [`lt_params`]).
    pub fn indexing(&self) -> Indexing {
        let [(ar, ac), (br, bc), (cr, cc)] = self.stored();
        let lda = self.lda.unwrap_or(ac.max(1));
        let ldb = self.ldb.unwrap_or(bc.max(1));
        let ldc = self.ldc.unwrap_or(cc.max(1));
        Indexing {
            trans_a: self.trans_a,
            trans_b: self.trans_b,
            lda,
            ldb,
            ldc,
            stride_a: self.stride_a.unwrap_or(ar * lda),
            stride_b: self.stride_b.unwrap_or(br * ldb),
            stride_c: self.stride_c.unwrap_or(cr * ldc),
        }
    }
}

/// One operand as cuBLASLt sees it (column-major).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LtLayout {
    pub rows: u64,
    pub cols: u64,
    pub ld: i64,
    pub batch_stride: i64,
}

/// The column-major cuBLASLt call equivalent to a row-major [`GemmShape`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LtParams {
    /// cuBLASLt's m, n, k (= our n, m, k).
    pub m: u64,
    pub n: u64,
    pub k: u64,
    /// Transpose flags of cuBLASLt's A (our B) and B (our A).
    pub transa: bool,
    pub transb: bool,
    /// Layout of cuBLASLt's A = our B.
    pub a: LtLayout,
    /// Layout of cuBLASLt's B = our A.
    pub b: LtLayout,
    /// Layout of C = D.
    pub c: LtLayout,
    pub batch: i32,
    /// Elements our A, B and C must hold.
    pub need_a: usize,
    pub need_b: usize,
    pub need_c: usize,
}

fn extent(batch: usize, stride: usize, rows: usize, cols: usize, ld: usize) -> usize {
    if batch == 0 || rows == 0 || cols == 0 {
        0
    } else {
        (batch - 1) * stride + (rows - 1) * ld + cols
    }
}

/// Translate a row-major problem into cuBLASLt's column-major call (pure; see module docs).
pub fn lt_params(s: &GemmShape) -> Result<LtParams> {
    let err = |m: String| CudaError::invalid("gemm", m);
    let [(ar, ac), (br, bc), (cr, cc)] = s.stored();
    let ix = s.indexing();
    let (lda, ldb, ldc) = (ix.lda, ix.ldb, ix.ldc);
    if lda < ac || ldb < bc || ldc < cc {
        return Err(err(format!(
            "leading dims ({lda}, {ldb}, {ldc}) smaller than rows ({ac}, {bc}, {cc})"
        )));
    }
    let (sa, sb, sc) = (ix.stride_a, ix.stride_b, ix.stride_c);
    if s.batch > 1 && sc < cr * ldc && cr > 1 {
        return Err(err(format!(
            "batches of C overlap (stride {sc} < {})",
            cr * ldc
        )));
    }
    if s.batch == 0 || s.batch > i32::MAX as usize {
        return Err(err(format!("batch {}", s.batch)));
    }
    let big = |v: usize| v > i64::MAX as usize;
    if [lda, ldb, ldc, sa, sb, sc].into_iter().any(big) {
        return Err(err("dims overflow".into()));
    }
    Ok(LtParams {
        m: s.n as u64,
        n: s.m as u64,
        k: s.k as u64,
        transa: s.trans_b,
        transb: s.trans_a,
        // Row-major [br, bc] with ld = column-major [bc rows, br cols] with the same ld.
        a: LtLayout {
            rows: bc as u64,
            cols: br as u64,
            ld: ldb as i64,
            batch_stride: sb as i64,
        },
        b: LtLayout {
            rows: ac as u64,
            cols: ar as u64,
            ld: lda as i64,
            batch_stride: sa as i64,
        },
        c: LtLayout {
            rows: cc as u64,
            cols: cr as u64,
            ld: ldc as i64,
            batch_stride: sc as i64,
        },
        batch: s.batch as i32,
        need_a: extent(s.batch, sa, ar, ac, lda),
        need_b: extent(s.batch, sb, br, bc, ldb),
        need_c: extent(s.batch, sc, cr, cc, ldc),
    })
}

/// What runs after the product.
#[derive(Clone, Copy, Debug)]
pub enum Epilogue<'a> {
    None,
    /// + bias[n] (broadcast over rows; same bias for every batch).
    Bias(DevSlice<'a>),
    /// GELU(x + bias[n]) — cuBLASLt's GELU is the tanh approximation.
    BiasGelu(DevSlice<'a>),
    /// GELU(x).
    Gelu,
    /// GELU(x + bias[n]), also writing the pre-activation x + bias to `aux` (row-major [m, n],
    /// unbatched, n a multiple of 8): the forward of a Linear + GELU that keeps what its
    /// backward needs (cuBLASLt's GELU_AUX_BIAS).
    BiasGeluAux {
        bias: DevSlice<'a>,
        aux: DevSlice<'a>,
    },
    /// (A·B) ∘ GELU'(aux): the backward of a GELU through the GEMM that produces the gradient
    /// of its output, `aux` being the pre-activation [`Epilogue::BiasGeluAux`] stored (same
    /// layout rules: row-major [m, n], unbatched, n a multiple of 8). cuBLASLt's DGELU.
    DGelu {
        aux: DevSlice<'a>,
    },
    /// [`Epilogue::DGelu`], and `bias_grad[j] = Σ_i C[i, j]` over its result: the gradient of
    /// the bias the forward added, in the same call. cuBLASLt's DGELU_BGRAD (its bias vector
    /// spans the rows of its column-major D, our n).
    DGeluBGrad {
        aux: DevSlice<'a>,
        bias_grad: DevSlice<'a>,
    },
    /// A·B, and `bias_grad[i] = Σ_k op(A)[i, k]`: beside a weight gradient dW = dYᵀ·X (A = dYᵀ)
    /// the bias gradient Σ_rows dY comes from the same read of dY. cuBLASLt's BGRADB, as our A
    /// is its B (its bias vector spans the columns of its D, our m).
    BGradA(DevSlice<'a>),
}

impl Epilogue<'_> {
    pub(crate) fn code(&self) -> ls::cublasLtEpilogue_t {
        use ls::cublasLtEpilogue_t as E;
        match self {
            Epilogue::None => E::CUBLASLT_EPILOGUE_DEFAULT,
            Epilogue::Bias(_) => E::CUBLASLT_EPILOGUE_BIAS,
            Epilogue::BiasGelu(_) => E::CUBLASLT_EPILOGUE_GELU_BIAS,
            Epilogue::Gelu => E::CUBLASLT_EPILOGUE_GELU,
            Epilogue::BiasGeluAux { .. } => E::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
            Epilogue::DGelu { .. } => E::CUBLASLT_EPILOGUE_DGELU,
            Epilogue::DGeluBGrad { .. } => E::CUBLASLT_EPILOGUE_DGELU_BGRAD,
            Epilogue::BGradA(_) => E::CUBLASLT_EPILOGUE_BGRADB,
        }
    }
    /// What cuBLASLt's bias pointer addresses: the bias read, or the bias gradient written.
    pub(crate) fn bias(&self) -> Option<DevSlice<'_>> {
        match *self {
            Epilogue::Bias(b)
            | Epilogue::BiasGelu(b)
            | Epilogue::BiasGeluAux { bias: b, .. }
            | Epilogue::DGeluBGrad { bias_grad: b, .. }
            | Epilogue::BGradA(b) => Some(b),
            _ => None,
        }
    }
    /// The [m, n] pre-activation matrix written (forward) or read (backward).
    pub(crate) fn aux(&self) -> Option<DevSlice<'_>> {
        match *self {
            Epilogue::BiasGeluAux { aux, .. }
            | Epilogue::DGelu { aux }
            | Epilogue::DGeluBGrad { aux, .. } => Some(aux),
            _ => None,
        }
    }
    /// True for the backward epilogues (they take α = 1, β = 0 and one matrix: see
    /// [`GemmDesc::validate`]).
    pub fn is_gradient(&self) -> bool {
        matches!(
            self,
            Epilogue::DGelu { .. } | Epilogue::DGeluBGrad { .. } | Epilogue::BGradA(_)
        )
    }
    /// Elements of the bias vector: n, except BGradA's (one per row of op(A): m).
    fn bias_len(&self, s: &GemmShape) -> usize {
        match self {
            Epilogue::BGradA(_) => s.m,
            _ => s.n,
        }
    }
    fn suffix(&self) -> &'static str {
        match self {
            Epilogue::None => "",
            Epilogue::Bias(_) => " +bias",
            Epilogue::BiasGelu(_) => " +bias+gelu",
            Epilogue::Gelu => " +gelu",
            Epilogue::BiasGeluAux { .. } => " +bias+gelu+aux",
            Epilogue::DGelu { .. } => " +dgelu",
            Epilogue::DGeluBGrad { .. } => " +dgelu+bgrad",
            Epilogue::BGradA(_) => " +bgradA",
        }
    }
}

/// A full GEMM call.
#[derive(Clone, Copy, Debug)]
pub struct GemmDesc<'a> {
    pub dtype: GemmDType,
    pub shape: GemmShape,
    pub a: DevSlice<'a>,
    pub b: DevSlice<'a>,
    /// Output (and the `beta` input).
    pub c: DevSlice<'a>,
    pub alpha: f32,
    pub beta: f32,
    pub epilogue: Epilogue<'a>,
}

/// A 16-byte-aligned dimension for cuBLASLt's fast kernels.
fn gemm_dim_aligned(v: usize, elem: usize) -> bool {
    (v * elem).is_multiple_of(16)
}

impl GemmDesc<'_> {
    /// The cost of a cuBLASLt call: 2·m·n·k FLOPs per matrix (tensor cores unless FP32 math);
    /// A, B and C once each, C read too when β ≠ 0, the bias read, the aux written.
    pub fn cost(&self) -> Call {
        let g = self;
        let s = &g.shape;
        let elem = g.dtype.storage().size();
        let b = s.batch.max(1);
        let mn = s.m * s.n * b;
        let read = (s.m * s.k + s.k * s.n) * b + if g.beta != 0.0 { mn } else { 0 };
        // (elements read, elements written) by the epilogue besides A, B and C.
        let (epi_read, epi_write) = match g.epilogue {
            Epilogue::None | Epilogue::Gelu => (0, 0),
            Epilogue::Bias(_) | Epilogue::BiasGelu(_) => (s.n, 0),
            Epilogue::BiasGeluAux { .. } => (s.n, mn),
            Epilogue::DGelu { .. } => (mn, 0),
            Epilogue::DGeluBGrad { .. } => (mn, s.n),
            Epilogue::BGradA(_) => (0, s.m),
        };
        let flops = 2 * s.m * s.n * s.k * b;
        let traffic = Traffic::bytes((read + epi_read) * elem, (mn + epi_write) * elem);
        let traffic = if g.dtype == GemmDType::F32 {
            traffic.with_flops(flops)
        } else {
            traffic.with_tensor_flops(flops)
        };
        let epi = g.epilogue.suffix();
        let batch = if b > 1 {
            format!(" x{b}")
        } else {
            String::new()
        };
        let key = format!(
            "gemm {} {}x{}x{}{batch}{}{epi}",
            g.dtype.storage(),
            s.m,
            s.n,
            s.k,
            match (s.trans_a, s.trans_b) {
                (false, false) => "",
                (true, false) => " Aᵀ",
                (false, true) => " Bᵀ",
                (true, true) => " AᵀBᵀ",
            }
        );
        Call {
            gemm: Some(GemmDims {
                m: s.m,
                n: s.n,
                k: s.k,
                batch: b,
                aligned: [s.m, s.n, s.k].iter().all(|&v| gemm_dim_aligned(v, elem)),
                math: match g.dtype {
                    GemmDType::F32 => GemmMath::Fp32,
                    GemmDType::Tf32 => GemmMath::Tf32,
                    GemmDType::BF16 | GemmDType::F16 => GemmMath::Half,
                },
            }),
            ..Call::new(key, OpClass::Gemm, traffic)
        }
    }
}

impl<'a> GemmDesc<'a> {
    /// C = A · B.
    pub fn new(
        dtype: GemmDType,
        shape: GemmShape,
        a: DevSlice<'a>,
        b: DevSlice<'a>,
        c: DevSlice<'a>,
    ) -> Self {
        GemmDesc {
            dtype,
            shape,
            a,
            b,
            c,
            alpha: 1.0,
            beta: 0.0,
            epilogue: Epilogue::None,
        }
    }

    /// Check dtypes and sizes; returns the cuBLASLt parameters.
    pub fn validate(&self) -> Result<LtParams> {
        let p = lt_params(&self.shape)?;
        let d = self.dtype.storage();
        for (what, s, need) in [
            ("A", &self.a, p.need_a),
            ("B", &self.b, p.need_b),
            ("C", &self.c, p.need_c),
        ] {
            if s.dtype() != d {
                return Err(CudaError::invalid(
                    "gemm",
                    format!("{what} is {}, expected {d}", s.dtype()),
                ));
            }
            if s.len() < need {
                return Err(CudaError::invalid(
                    "gemm",
                    format!("{what} has {} elements, the shape needs {need}", s.len()),
                ));
            }
        }
        if let Some(b) = self.epilogue.bias() {
            let len = self.epilogue.bias_len(&self.shape);
            if b.dtype() != d || b.len() != len {
                return Err(CudaError::invalid(
                    "gemm",
                    format!(
                        "the bias (or its gradient) must be {len} x {d}, got {} x {}",
                        b.len(),
                        b.dtype()
                    ),
                ));
            }
        }
        // cuBLASLt's rules for the aux matrix: the type of D (the default of its
        // EPILOGUE_AUX_DATA_TYPE outside FP8), a leading dimension (here n) divisible by 8, and
        // no batch of aux matrices (sinter sets no AUX_BATCH_STRIDE).
        if let Some(aux) = self.epilogue.aux() {
            let (m, n) = (self.shape.m, self.shape.n);
            if aux.dtype() != d
                || aux.len() != m * n
                || self.shape.batch != 1
                || !n.is_multiple_of(8)
            {
                return Err(CudaError::invalid(
                    "gemm",
                    format!(
                        "the GELU aux matrix must be an unbatched {m} x {n} {d} matrix with n a multiple of 8 (got {} elements of {}, batch {})",
                        aux.len(),
                        aux.dtype(),
                        self.shape.batch
                    ),
                ));
            }
        }
        // The gradient epilogues are defined here for a plain product (what the backward
        // passes call): α scaling the reduced bias gradient or β mixing an old C into the
        // GELU gradient would be ambiguous, and a batch would need one bias vector each.
        if self.epilogue.is_gradient()
            && (self.alpha != 1.0 || self.beta != 0.0 || self.shape.batch != 1)
        {
            return Err(CudaError::invalid(
                "gemm",
                format!(
                    "the gradient epilogues take alpha 1, beta 0 and one matrix (got alpha {}, beta {}, batch {})",
                    self.alpha, self.beta, self.shape.batch
                ),
            ));
        }
        if self.epilogue.is_gradient() && self.dtype.storage() == DType::F32 {
            return Err(CudaError::invalid(
                "gemm",
                "the gradient epilogues run at f16/bf16 (the f32 backward keeps its separate passes)",
            ));
        }
        Ok(p)
    }
}

/// Largest power of two (<= 256) dividing `ptr`: what cuBLASLt's heuristic may assume.
pub fn ptr_alignment(ptr: u64) -> u32 {
    if ptr == 0 {
        256
    } else {
        1u32 << ptr.trailing_zeros().min(8)
    }
}
