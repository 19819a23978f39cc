//! Row-major GEMM through cuBLASLt.
//!
//! C[m, n] = alpha * op(A)[m, k] · op(B)[k, n] + beta * C (+ bias[n], optionally then GELU), per
//! batch, with all matrices row-major as the tensor crate stores them. cuBLASLt is column-major,
//! so we use the identity Cᵀ = op(B)ᵀ · op(A)ᵀ: a row-major X with leading dim ld *is* a
//! column-major Xᵀ with the same ld, so we pass B as cuBLASLt's A, A as its B, swap m and n, and
//! keep each operand's transpose flag ([`lt_params`], unit-tested on the CPU). The bias, a vector
//! over row-major columns, becomes cuBLASLt's per-row bias of Dᵀ — exactly its epilogue layout.
//!
//! f32 (exact FP32 math), tf32 (f32 storage, TF32 tensor cores), bf16 and f16 (fp32 accumulate).
//! A 32 MiB workspace (NVIDIA's recommendation for Hopper) is allocated once per device, and the
//! heuristic's algorithm choice is cached per (shape, dtype, transposes, epilogue, alignment).
//! On an emulated device the same validated [`GemmDesc`] is computed by a host reference GEMM
//! (`emulated::blas`), which keeps the same workspace so memory statistics match.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cublaslt::{result as lr, sys as ls};

use crate::alloc::{DevSlice, DeviceBuffer, Pool};
use crate::device::CudaDevice;
use crate::driver::real::RealDriver;
use crate::dtype::DType;
use crate::emulated::cost::{Call, GemmDims, GemmMath, OpClass, Traffic};
use crate::error::{guard, CudaError, DriverResultExt, Result};

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
    fn data_type(self) -> ls::cudaDataType {
        match self {
            GemmDType::F32 | GemmDType::Tf32 => ls::cudaDataType::CUDA_R_32F,
            GemmDType::BF16 => ls::cudaDataType::CUDA_R_16BF,
            GemmDType::F16 => ls::cudaDataType::CUDA_R_16F,
        }
    }
    fn compute_type(self) -> ls::cublasComputeType_t {
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
}

impl Epilogue<'_> {
    fn code(&self) -> ls::cublasLtEpilogue_t {
        use ls::cublasLtEpilogue_t as E;
        match self {
            Epilogue::None => E::CUBLASLT_EPILOGUE_DEFAULT,
            Epilogue::Bias(_) => E::CUBLASLT_EPILOGUE_BIAS,
            Epilogue::BiasGelu(_) => E::CUBLASLT_EPILOGUE_GELU_BIAS,
            Epilogue::Gelu => E::CUBLASLT_EPILOGUE_GELU,
            Epilogue::BiasGeluAux { .. } => E::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
        }
    }
    fn bias(&self) -> Option<DevSlice<'_>> {
        match *self {
            Epilogue::Bias(b) | Epilogue::BiasGelu(b) | Epilogue::BiasGeluAux { bias: b, .. } => {
                Some(b)
            }
            _ => None,
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
        let (bias, aux) = match g.epilogue {
            Epilogue::None | Epilogue::Gelu => (0, 0),
            Epilogue::Bias(_) | Epilogue::BiasGelu(_) => (s.n, 0),
            Epilogue::BiasGeluAux { .. } => (s.n, mn),
        };
        let flops = 2 * s.m * s.n * s.k * b;
        let traffic = Traffic::bytes((read + bias) * elem, (mn + aux) * elem);
        let traffic = if g.dtype == GemmDType::F32 {
            traffic.with_flops(flops)
        } else {
            traffic.with_tensor_flops(flops)
        };
        let epi = match g.epilogue {
            Epilogue::None => "",
            Epilogue::Bias(_) => " +bias",
            Epilogue::BiasGelu(_) => " +bias+gelu",
            Epilogue::Gelu => " +gelu",
            Epilogue::BiasGeluAux { .. } => " +bias+gelu+aux",
        };
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
            if b.dtype() != d || b.len() != self.shape.n {
                return Err(CudaError::invalid(
                    "gemm",
                    format!("bias must be {} x {d}", self.shape.n),
                ));
            }
        }
        if let Epilogue::BiasGeluAux { aux, .. } = self.epilogue {
            let (m, n) = (self.shape.m, self.shape.n);
            if aux.dtype() != d
                || aux.len() != m * n
                || self.shape.batch != 1
                || !n.is_multiple_of(8)
            {
                return Err(CudaError::invalid(
                    "gemm",
                    format!(
                        "the GELU aux output must be an unbatched {m} x {n} {d} matrix with n a multiple of 8 (got {} elements of {}, batch {})",
                        aux.len(),
                        aux.dtype(),
                        self.shape.batch
                    ),
                ));
            }
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct AlgoKey {
    dtype: GemmDType,
    p: LtParams,
    epilogue: u32,
    align: [u32; 4],
}

struct Handle(ls::cublasLtHandle_t);
// SAFETY: the handle is only used under the device's gemm mutex.
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}
impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtCreate; errors on teardown are ignored.
        let _ = unsafe { lr::destroy_handle(self.0) };
    }
}

struct Desc(ls::cublasLtMatmulDesc_t);
impl Drop for Desc {
    fn drop(&mut self) {
        let _ = unsafe { lr::destroy_matmul_desc(self.0) };
    }
}
struct Layout(ls::cublasLtMatrixLayout_t);
impl Drop for Layout {
    fn drop(&mut self) {
        let _ = unsafe { lr::destroy_matrix_layout(self.0) };
    }
}
struct Pref(ls::cublasLtMatmulPreference_t);
impl Drop for Pref {
    fn drop(&mut self) {
        let _ = unsafe { lr::destroy_matmul_pref(self.0) };
    }
}

unsafe fn set_desc<T>(d: &Desc, attr: ls::cublasLtMatmulDescAttributes_t, v: &T) -> Result<()> {
    lr::set_matmul_desc_attribute(
        d.0,
        attr,
        v as *const T as *const c_void,
        std::mem::size_of::<T>(),
    )
    .ctx("cublasLtMatmulDescSetAttribute")
}
unsafe fn set_pref<T>(
    p: &Pref,
    attr: ls::cublasLtMatmulPreferenceAttributes_t,
    v: &T,
) -> Result<()> {
    lr::set_matmul_pref_attribute(
        p.0,
        attr,
        v as *const T as *const c_void,
        std::mem::size_of::<T>(),
    )
    .ctx("cublasLtMatmulPreferenceSetAttribute")
}

fn layout(dt: ls::cudaDataType, l: &LtLayout, batch: i32) -> Result<Layout> {
    let h = Layout(
        lr::create_matrix_layout(dt, l.rows, l.cols, l.ld).ctx("cublasLtMatrixLayoutCreate")?,
    );
    if batch > 1 {
        use ls::cublasLtMatrixLayoutAttribute_t as A;
        // SAFETY: live layout; attribute types per the cuBLASLt docs (int32, int64).
        unsafe {
            lr::set_matrix_layout_attribute(
                h.0,
                A::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                &batch as *const i32 as *const c_void,
                4,
            )
            .ctx("cublasLtMatrixLayoutSetAttribute")?;
            lr::set_matrix_layout_attribute(
                h.0,
                A::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                &l.batch_stride as *const i64 as *const c_void,
                8,
            )
            .ctx("cublasLtMatrixLayoutSetAttribute")?;
        }
    }
    Ok(h)
}

/// cuBLASLt's handle and the algorithm cache of one GPU.
struct Lt {
    handle: Handle,
    algos: Mutex<HashMap<AlgoKey, ls::cublasLtMatmulAlgo_t>>,
}

/// Per-device GEMM state: the workspace and, on a real GPU, cuBLASLt's handle and algorithm
/// cache. An emulated device serves the call on the host ([`crate::emulated`]) but holds the
/// same workspace, so memory statistics match a GPU's.
pub(crate) struct GemmEngine {
    lt: Option<Lt>,
    workspace: DeviceBuffer,
}

impl GemmEngine {
    pub(crate) fn new(dev: &CudaDevice) -> Result<Self> {
        let lt = match dev.real() {
            Some(r) => {
                r.bind()?;
                let handle = Handle(guard(|| lr::create_handle().ctx("cublasLtCreate"))?);
                Some(Lt {
                    handle,
                    algos: Mutex::default(),
                })
            }
            None => None,
        };
        let workspace = dev.alloc(WORKSPACE_BYTES, DType::U8, Pool::Permanent)?;
        Ok(GemmEngine { lt, workspace })
    }

    pub(crate) fn run(&self, dev: &CudaDevice, g: &GemmDesc<'_>) -> Result<()> {
        let p = g.validate()?;
        if p.m == 0 || p.n == 0 {
            return Ok(());
        }
        match (&self.lt, dev.real(), dev.emulated()) {
            (Some(lt), Some(r), _) => {
                r.bind()?;
                guard(|| self.run_lt(lt, r, g, &p))
            }
            (_, _, Some(e)) => e.gemm(g),
            _ => Err(CudaError::invalid(
                "gemm",
                "the GEMM engine belongs to another kind of device",
            )),
        }
    }

    fn run_lt(&self, lt: &Lt, r: &RealDriver, g: &GemmDesc<'_>, p: &LtParams) -> Result<()> {
        use ls::cublasLtMatmulDescAttributes_t as D;
        let dt = g.dtype.data_type();
        let desc = Desc(
            lr::create_matmul_desc(g.dtype.compute_type(), ls::cudaDataType::CUDA_R_32F)
                .ctx("cublasLtMatmulDescCreate")?,
        );
        let epi = g.epilogue.code();
        let bias_ptr: u64 = g.epilogue.bias().map_or(0, |b| b.ptr());
        // SAFETY: live descriptor; attribute value types per the cuBLASLt docs.
        unsafe {
            set_desc(&desc, D::CUBLASLT_MATMUL_DESC_TRANSA, &(p.transa as i32))?;
            set_desc(&desc, D::CUBLASLT_MATMUL_DESC_TRANSB, &(p.transb as i32))?;
            set_desc(&desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE, &(epi as u32))?;
            if bias_ptr != 0 {
                set_desc(&desc, D::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr)?;
            }
            if let Epilogue::BiasGeluAux { aux, .. } = g.epilogue {
                // Row-major [m, n] is cuBLASLt's column-major n x m: leading dim n.
                let (ptr, ld) = (aux.ptr(), g.shape.n as i64);
                set_desc(&desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ptr)?;
                set_desc(&desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld)?;
            }
        }
        let la = layout(dt, &p.a, p.batch)?;
        let lb = layout(dt, &p.b, p.batch)?;
        let lc = layout(dt, &p.c, p.batch)?;
        // cuBLASLt's A is our B, its B our A.
        let align = [
            ptr_alignment(g.b.ptr()),
            ptr_alignment(g.a.ptr()),
            ptr_alignment(g.c.ptr()),
            ptr_alignment(bias_ptr),
        ];
        let key = AlgoKey {
            dtype: g.dtype,
            p: *p,
            epilogue: epi as u32,
            align,
        };
        let cached = lt.algos.lock().ok().and_then(|m| m.get(&key).copied());
        let algo = match cached {
            Some(a) => a,
            None => {
                use ls::cublasLtMatmulPreferenceAttributes_t as P;
                let pref = Pref(lr::create_matmul_pref().ctx("cublasLtMatmulPreferenceCreate")?);
                let ws = WORKSPACE_BYTES as u64;
                // SAFETY: live preference; attribute types per the docs (uint64, uint32).
                unsafe {
                    set_pref(&pref, P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws)?;
                    set_pref(
                        &pref,
                        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                        &align[0],
                    )?;
                    set_pref(
                        &pref,
                        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                        &align[1],
                    )?;
                    set_pref(
                        &pref,
                        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                        &align[2],
                    )?;
                    set_pref(
                        &pref,
                        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                        &align[2],
                    )?;
                }
                // SAFETY: all descriptors live.
                let h = unsafe {
                    lr::get_matmul_algo_heuristic(
                        lt.handle.0,
                        desc.0,
                        la.0,
                        lb.0,
                        lc.0,
                        lc.0,
                        pref.0,
                    )
                }
                .ctx("cublasLtMatmulAlgoGetHeuristic")?;
                if let Ok(mut m) = lt.algos.lock() {
                    m.insert(key, h.algo);
                }
                h.algo
            }
        };
        let (alpha, beta) = (g.alpha, g.beta);
        // SAFETY: pointers validated against the layouts (GemmDesc::validate); the workspace is
        // ours; the call is ordered on the device stream.
        unsafe {
            lr::matmul(
                lt.handle.0,
                desc.0,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                g.b.ptr() as *const c_void,
                la.0,
                g.a.ptr() as *const c_void,
                lb.0,
                g.c.ptr() as *const c_void,
                lc.0,
                g.c.ptr() as *mut c_void,
                lc.0,
                &algo,
                self.workspace.ptr() as *mut c_void,
                WORKSPACE_BYTES,
                r.cu_stream() as ls::cudaStream_t,
            )
        }
        .ctx("cublasLtMatmul")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::fake_slice;

    /// Reference: compute the row-major product by reading operands through the column-major
    /// description lt_params produces — if the translation were wrong this would disagree with a
    /// plain row-major loop.
    fn via_lt(s: &GemmShape, a: &[f32], b: &[f32]) -> Vec<f32> {
        let p = lt_params(s).unwrap();
        // Column-major element (r, c) of a layout: data[c * ld + r].
        let get = |l: &LtLayout, data: &[f32], batch: usize, r: usize, c: usize| {
            data[batch * l.batch_stride as usize + c * l.ld as usize + r]
        };
        let mut d = vec![0f32; p.need_c];
        for bt in 0..p.batch as usize {
            for i in 0..p.m as usize {
                for j in 0..p.n as usize {
                    let mut acc = 0.0;
                    for kk in 0..p.k as usize {
                        // op(A')[i, kk], op(B')[kk, j]
                        let x = if p.transa {
                            get(&p.a, b, bt, kk, i)
                        } else {
                            get(&p.a, b, bt, i, kk)
                        };
                        let y = if p.transb {
                            get(&p.b, a, bt, j, kk)
                        } else {
                            get(&p.b, a, bt, kk, j)
                        };
                        acc += x * y;
                    }
                    d[bt * p.c.batch_stride as usize + j * p.c.ld as usize + i] = acc;
                }
            }
        }
        d
    }

    fn row_major(s: &GemmShape, a: &[f32], b: &[f32]) -> Vec<f32> {
        let (p, ix) = (lt_params(s).unwrap(), s.indexing());
        let mut c = vec![0f32; p.need_c];
        for bt in 0..s.batch {
            for i in 0..s.m {
                for j in 0..s.n {
                    c[ix.c(bt, i, j)] = (0..s.k)
                        .map(|kk| a[ix.a(bt, i, kk)] * b[ix.b(bt, kk, j)])
                        .sum();
                }
            }
        }
        c
    }

    #[test]
    fn translation_matches_row_major_product() {
        let shapes = [
            GemmShape::new(3, 5, 4),
            GemmShape::new(3, 5, 4).trans(true, false),
            GemmShape::new(3, 5, 4).trans(false, true),
            GemmShape::new(3, 5, 4).trans(true, true),
            GemmShape {
                lda: Some(7),
                ldb: Some(9),
                ldc: Some(6),
                ..GemmShape::new(3, 5, 4)
            },
            GemmShape::new(2, 3, 4).trans(false, true).batched(3),
            GemmShape {
                stride_b: Some(0),
                ..GemmShape::new(2, 3, 4).batched(2)
            },
        ];
        for s in shapes {
            let p = lt_params(&s).unwrap();
            let a: Vec<f32> = (0..p.need_a).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..p.need_b.max(1))
                .map(|i| (i as f32 * 0.11).cos())
                .collect();
            let want = row_major(&s, &a, &b);
            let got = via_lt(&s, &a, &b);
            for (x, y) in want.iter().zip(&got) {
                assert!((x - y).abs() < 1e-5, "{s:?}: {want:?} vs {got:?}");
            }
        }
    }

    #[test]
    fn leading_dims_and_sizes() {
        let p = lt_params(&GemmShape::new(128, 64, 32)).unwrap();
        assert_eq!((p.m, p.n, p.k), (64, 128, 32));
        assert_eq!(
            p.a,
            LtLayout {
                rows: 64,
                cols: 32,
                ld: 64,
                batch_stride: 32 * 64
            }
        );
        assert_eq!(
            p.b,
            LtLayout {
                rows: 32,
                cols: 128,
                ld: 32,
                batch_stride: 128 * 32
            }
        );
        assert_eq!(p.c.ld, 64);
        assert_eq!(
            (p.need_a, p.need_b, p.need_c),
            (128 * 32, 32 * 64, 128 * 64)
        );
        // x @ W^T (nn.Linear): A [m, k], B stored [n, k].
        let p = lt_params(&GemmShape::new(8, 16, 4).trans(false, true)).unwrap();
        assert!(p.transa && !p.transb);
        assert_eq!((p.a.rows, p.a.cols, p.a.ld), (4, 16, 4));
        assert!(lt_params(&GemmShape {
            lda: Some(3),
            ..GemmShape::new(2, 2, 4)
        })
        .is_err());
        assert!(lt_params(&GemmShape::new(2, 2, 2).batched(0)).is_err());
        // An output narrower than its rows is refused; a padded one (ldc > n) is accepted and
        // needs (m - 1) * ldc + n elements.
        assert!(lt_params(&GemmShape {
            ldc: Some(4),
            ..GemmShape::new(3, 5, 2)
        })
        .is_err());
        let p = lt_params(&GemmShape {
            ldc: Some(8),
            lda: Some(8),
            ..GemmShape::new(3, 5, 2)
        })
        .unwrap();
        assert_eq!(
            (p.c.ld, p.need_c, p.b.ld, p.need_a),
            (8, 2 * 8 + 5, 8, 2 * 8 + 2)
        );
    }

    #[test]
    fn desc_validation() {
        let s = GemmShape::new(4, 8, 2);
        let (a, b, c) = (
            fake_slice(DType::BF16, 8),
            fake_slice(DType::BF16, 16),
            fake_slice(DType::BF16, 32),
        );
        assert!(GemmDesc::new(GemmDType::BF16, s, a, b, c)
            .validate()
            .is_ok());
        assert!(GemmDesc::new(GemmDType::F32, s, a, b, c)
            .validate()
            .is_err());
        assert!(
            GemmDesc::new(GemmDType::BF16, s, a, b, fake_slice(DType::BF16, 31))
                .validate()
                .is_err()
        );
        let mut g = GemmDesc::new(GemmDType::BF16, s, a, b, c);
        g.epilogue = Epilogue::BiasGelu(fake_slice(DType::BF16, 4));
        assert!(g.validate().is_err(), "bias has n = 8 elements");
        g.epilogue = Epilogue::BiasGeluAux {
            bias: fake_slice(DType::BF16, 8),
            aux: fake_slice(DType::BF16, 8),
        };
        assert!(g.validate().is_err(), "aux must hold m x n");
        let aux = fake_slice(DType::BF16, 32);
        g.epilogue = Epilogue::BiasGeluAux {
            bias: fake_slice(DType::BF16, 8),
            aux,
        };
        assert!(g.validate().is_ok());
        let s12 = GemmShape::new(4, 12, 2);
        let mut g12 = GemmDesc::new(
            GemmDType::BF16,
            s12,
            a,
            fake_slice(DType::BF16, 24),
            fake_slice(DType::BF16, 48),
        );
        assert!(g12.validate().is_ok());
        g12.epilogue = Epilogue::BiasGeluAux {
            bias: fake_slice(DType::BF16, 12),
            aux: fake_slice(DType::BF16, 48),
        };
        assert!(
            g12.validate().is_err(),
            "cuBLASLt wants the aux ld (n) a multiple of 8"
        );
        g.epilogue = Epilogue::BiasGelu(fake_slice(DType::BF16, 8));
        assert!(g.validate().is_ok());
        assert_eq!(GemmDType::Tf32.storage(), DType::F32);
    }

    #[test]
    fn alignment() {
        assert_eq!(ptr_alignment(0x1000), 256);
        assert_eq!(ptr_alignment(0x1002), 2);
        assert_eq!(ptr_alignment(0x1010), 16);
        assert_eq!(ptr_alignment(0), 256);
    }
}
