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

use crate::alloc::DeviceBuffer;
use crate::driver::real::RealDriver;
use crate::driver::Driver;
use crate::emulated::EmuDriver;
use crate::error::{guard, CudaError, DriverResultExt, Result};

mod desc;
pub use desc::*;

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
    /// The engine of the device with this driver, holding `workspace` (its
    /// [`WORKSPACE_BYTES`], allocated by the device).
    pub(crate) fn new(driver: &Driver, workspace: DeviceBuffer) -> Result<Self> {
        let lt = match RealDriver::of(driver) {
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
        Ok(GemmEngine { lt, workspace })
    }

    pub(crate) fn run(&self, driver: &Driver, g: &GemmDesc<'_>) -> Result<()> {
        let p = g.validate()?;
        if p.m == 0 || p.n == 0 {
            return Ok(());
        }
        match (&self.lt, RealDriver::of(driver), EmuDriver::of(driver)) {
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
            if let Some(aux) = g.epilogue.aux() {
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
    use crate::dtype::DType;
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
