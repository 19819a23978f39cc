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
mod types;

use rayon::prelude::*;

pub use blocks::GgmlBlock;
use blocks::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8K, BlockQ8_0,
};
pub use dot::{DotPath, QuantMatrix};
pub use types::{ggml_type_name, GgmlError, GgmlType, QK_K};

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
