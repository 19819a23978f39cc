//! GGML's tensor formats (the element types of GGUF files): plain floats and the block
//! quantizations of llama.cpp, as functions over byte slices.
//!
//! A quantized tensor is a sequence of fixed-size blocks, each holding `block_elems` values:
//! a scale (and sometimes a minimum) in f16 and the quantized integers packed into bytes.
//! [`blocks`] declares each block as a `#[repr(C)]` struct with the exact byte layout of
//! llama.cpp's `ggml-common.h` (sizes checked at compile time), so the bytes of a tensor can be
//! viewed as a slice of blocks without copying; the quantized dot products to come work on
//! the same structs.
//!
//! - [`GgmlType`]: the supported types, their ids, block sizes and names.
//! - [`dequantize`]: a tensor's bytes to f32, blocks in parallel when large.
//! - [`quantize`]: f32 values to a type's bytes (for writing GGUF files).
//! - [`dot`]: dot products of weight blocks with per-block quantized activations, and
//!   [`QuantMatrix`], a weight kept quantized with its GEMV/GEMM (Q8_0, Q4_0 and Q4_1 rows
//!   stored eight together for the GEMV, `groups`).

mod act;
pub mod blocks;
pub mod dot;
mod dot_scalar;
#[cfg(target_arch = "x86_64")]
mod dot_x86;
mod groups;
pub mod quantize;

use std::fmt;

use rayon::prelude::*;

pub use blocks::GgmlBlock;
use blocks::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8K, BlockQ8_0,
};
pub use dot::{DotPath, QuantMatrix};

/// Elements in one block of the k-quants (`QK_K` in llama.cpp).
pub const QK_K: usize = 256;

/// What went wrong reading GGML data: the message says what and how to fix it; the caller
/// adds which file and tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgmlError(pub String);

impl fmt::Display for GgmlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GgmlError {}

/// The GGML element types sinter reads. The discriminant is the type id stored in GGUF files
/// (`enum ggml_type` in llama.cpp's ggml.h).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    BF16 = 30,
}

/// Every type id that ggml has defined, by name, so an unsupported one is refused by name.
const KNOWN_TYPE_NAMES: &[(u32, &str)] = &[
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (4, "Q4_2 (removed from ggml)"),
    (5, "Q4_3 (removed from ggml)"),
    (6, "Q5_0"),
    (7, "Q5_1"),
    (8, "Q8_0"),
    (9, "Q8_1"),
    (10, "Q2_K"),
    (11, "Q3_K"),
    (12, "Q4_K"),
    (13, "Q5_K"),
    (14, "Q6_K"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (20, "IQ4_NL"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (23, "IQ4_XS"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (30, "BF16"),
    (31, "Q4_0_4_4 (removed from ggml)"),
    (32, "Q4_0_4_8 (removed from ggml)"),
    (33, "Q4_0_8_8 (removed from ggml)"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (36, "IQ4_NL_4_4 (removed from ggml)"),
    (37, "IQ4_NL_4_8 (removed from ggml)"),
    (38, "IQ4_NL_8_8 (removed from ggml)"),
    (39, "MXFP4"),
    (40, "NVFP4"),
    (41, "Q1_0"),
];

/// The name ggml gives type id `id`, supported here or not.
pub fn ggml_type_name(id: u32) -> Option<&'static str> {
    KNOWN_TYPE_NAMES
        .iter()
        .find(|(i, _)| *i == id)
        .map(|(_, n)| *n)
}

impl GgmlType {
    pub const ALL: [GgmlType; 14] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
    ];

    /// The type with GGUF type id `id`; an unsupported or unknown id is an error naming it.
    pub fn from_id(id: u32) -> Result<GgmlType, GgmlError> {
        if let Some(ty) = GgmlType::ALL.into_iter().find(|t| t.id() == id) {
            return Ok(ty);
        }
        let supported: Vec<&str> = GgmlType::ALL.iter().map(|t| t.name()).collect();
        Err(GgmlError(match ggml_type_name(id) {
            Some(name) => format!(
                "ggml type {id} ({name}) is not supported; sinter reads {} (re-quantize the model to one of them, e.g. with llama.cpp's llama-quantize)",
                supported.join(", ")
            ),
            None => format!(
                "ggml type id {id} is unknown (not a type ggml defines, so the file is corrupt or newer than sinter); sinter reads {}",
                supported.join(", ")
            ),
        }))
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// ggml's name for the type ("Q4_K", "F16").
    pub fn name(self) -> &'static str {
        ggml_type_name(self.id()).expect("every supported type is named")
    }

    /// Values in one block (1 for the plain float types).
    pub fn block_elems(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 => BlockQ4_0::ELEMS,
            GgmlType::Q4_1 => BlockQ4_1::ELEMS,
            GgmlType::Q5_0 => BlockQ5_0::ELEMS,
            GgmlType::Q5_1 => BlockQ5_1::ELEMS,
            GgmlType::Q8_0 => BlockQ8_0::ELEMS,
            GgmlType::Q2_K => BlockQ2K::ELEMS,
            GgmlType::Q3_K => BlockQ3K::ELEMS,
            GgmlType::Q4_K => BlockQ4K::ELEMS,
            GgmlType::Q5_K => BlockQ5K::ELEMS,
            GgmlType::Q6_K => BlockQ6K::ELEMS,
            GgmlType::Q8_K => BlockQ8K::ELEMS,
        }
    }

    /// Bytes of one block.
    pub fn block_bytes(self) -> usize {
        use std::mem::size_of;
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => size_of::<BlockQ4_0>(),
            GgmlType::Q4_1 => size_of::<BlockQ4_1>(),
            GgmlType::Q5_0 => size_of::<BlockQ5_0>(),
            GgmlType::Q5_1 => size_of::<BlockQ5_1>(),
            GgmlType::Q8_0 => size_of::<BlockQ8_0>(),
            GgmlType::Q2_K => size_of::<BlockQ2K>(),
            GgmlType::Q3_K => size_of::<BlockQ3K>(),
            GgmlType::Q4_K => size_of::<BlockQ4K>(),
            GgmlType::Q5_K => size_of::<BlockQ5K>(),
            GgmlType::Q6_K => size_of::<BlockQ6K>(),
            GgmlType::Q8_K => size_of::<BlockQ8K>(),
        }
    }

    /// Bytes that `n` values of this type take. ggml quantizes along rows, so `n` (a row's
    /// length, or a whole tensor's) must be whole blocks; an error says so otherwise.
    pub fn bytes_for(self, n: usize) -> Result<usize, GgmlError> {
        let be = self.block_elems();
        if !n.is_multiple_of(be) {
            return Err(GgmlError(format!(
                "{n} values are not whole {} blocks of {be}: every row of a {} tensor must be a multiple of {be} long",
                self.name(),
                self.name()
            )));
        }
        (n / be).checked_mul(self.block_bytes()).ok_or_else(|| {
            GgmlError(format!(
                "{n} {} values take more bytes than fit in memory",
                self.name()
            ))
        })
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Below this many values a tensor is dequantized on the calling thread: spreading a few
/// blocks over threads costs more than it saves.
const PARALLEL_MIN_ELEMS: usize = 1 << 16;
/// Values each parallel task dequantizes (a multiple of every block size).
const PARALLEL_CHUNK_ELEMS: usize = 1 << 14;

/// Dequantizes `bytes` of type `ty` into `out`, which sets how many values: `bytes` must be
/// exactly the bytes of `out.len()` values (whole blocks).
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), GgmlError> {
    let need = ty.bytes_for(out.len())?;
    if bytes.len() != need {
        return Err(GgmlError(format!(
            "{} {} values take {need} bytes, but {} were given",
            out.len(),
            ty.name(),
            bytes.len()
        )));
    }
    let chunk_bytes = PARALLEL_CHUNK_ELEMS / ty.block_elems() * ty.block_bytes();
    let kernel: &(dyn Fn(&[u8], &mut [f32]) + Sync) = match ty {
        GgmlType::F32 => &|b, o| {
            for (v, c) in o.iter_mut().zip(b.chunks_exact(4)) {
                *v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        },
        GgmlType::F16 => &|b, o| {
            for (v, c) in o.iter_mut().zip(b.chunks_exact(2)) {
                *v = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        },
        // bf16 is the top half of an f32.
        GgmlType::BF16 => &|b, o| {
            for (v, c) in o.iter_mut().zip(b.chunks_exact(2)) {
                *v = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        },
        GgmlType::Q4_0 => &dequantize_blocks::<BlockQ4_0>,
        GgmlType::Q4_1 => &dequantize_blocks::<BlockQ4_1>,
        GgmlType::Q5_0 => &dequantize_blocks::<BlockQ5_0>,
        GgmlType::Q5_1 => &dequantize_blocks::<BlockQ5_1>,
        GgmlType::Q8_0 => &dequantize_blocks::<BlockQ8_0>,
        GgmlType::Q2_K => &dequantize_blocks::<BlockQ2K>,
        GgmlType::Q3_K => &dequantize_blocks::<BlockQ3K>,
        GgmlType::Q4_K => &dequantize_blocks::<BlockQ4K>,
        GgmlType::Q5_K => &dequantize_blocks::<BlockQ5K>,
        GgmlType::Q6_K => &dequantize_blocks::<BlockQ6K>,
        GgmlType::Q8_K => &dequantize_blocks::<BlockQ8K>,
    };
    run_chunks(bytes, out, chunk_bytes, kernel);
    Ok(())
}

/// `bytes` viewed as blocks of `B`. Blocks are byte arrays (alignment 1), so any slice whose
/// length is whole blocks can be viewed; `None` otherwise.
pub fn as_blocks<B: GgmlBlock>(bytes: &[u8]) -> Option<&[B]> {
    bytemuck::try_cast_slice(bytes).ok()
}

/// A weight row (or slice of rows) as its blocks: the dot kernels' callers pass whole blocks.
fn row_blocks<B: GgmlBlock>(w: &[u8]) -> &[B] {
    as_blocks::<B>(w).expect("a weight row is whole blocks")
}

/// Dequantizes whole blocks of `B`: `bytes` is `out.len() / B::ELEMS` blocks.
fn dequantize_blocks<B: GgmlBlock>(bytes: &[u8], out: &mut [f32]) {
    let blocks = as_blocks::<B>(bytes).expect("callers pass whole blocks");
    for (block, o) in blocks.iter().zip(out.chunks_exact_mut(B::ELEMS)) {
        block.dequantize(o);
    }
}

/// Runs `f` over matching chunks of `bytes` and `out`: `out` in chunks of
/// `PARALLEL_CHUNK_ELEMS` values (whole blocks of every type), `bytes` in the `chunk_bytes`
/// those take; in parallel when `out` is large.
fn run_chunks(
    bytes: &[u8],
    out: &mut [f32],
    chunk_bytes: usize,
    f: &(dyn Fn(&[u8], &mut [f32]) + Sync),
) {
    if out.len() < PARALLEL_MIN_ELEMS {
        f(bytes, out);
        return;
    }
    out.par_chunks_mut(PARALLEL_CHUNK_ELEMS)
        .zip(bytes.par_chunks(chunk_bytes))
        .for_each(|(o, b)| f(b, o));
}
