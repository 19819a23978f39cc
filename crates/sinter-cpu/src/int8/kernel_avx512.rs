//! AVX512-VNNI kernel: `vpdpbusd` on 512-bit registers.
//!
//! One `vpdpbusd` multiplies 64 u8 activations by 64 i8 weights and adds each group of four
//! products into one of 16 i32 lanes, with no intermediate saturation — exactly the packed
//! block layout (16 channels × 4 k values). A tile is up to 6 rows × 4 panels (64 channels):
//! 24 accumulator registers, 4 for the weight blocks and 1 for the broadcast activations, out
//! of 32. Per block of four k values the kernel does 4 weight loads, `rows` broadcasts and
//! 4·rows `vpdpbusd`; the weights stream from memory once per row tile, the activation rows
//! stay in L1. At the edge of a thread's block the tile narrows to 3, 2 or 1 panels (one
//! panel alone would do a broadcast per `vpdpbusd` and be load-bound).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::kernel::{Kernel, Tile, TileArgs, TILE_NR};
use super::pack::PANEL;

pub struct Avx512Vnni;

impl Kernel for Avx512Vnni {
    const MR: usize = 6;
    const NP: usize = 4;
    #[inline(always)]
    unsafe fn tile(t: TileArgs<'_>, np: usize, acc: &mut Tile) {
        // SAFETY: forwarded from the caller's contract.
        unsafe {
            match np {
                4 => by_rows::<4>(t, acc),
                3 => by_rows::<3>(t, acc),
                2 => by_rows::<2>(t, acc),
                _ => by_rows::<1>(t, acc),
            }
        }
    }
}

#[inline(always)]
unsafe fn by_rows<const P: usize>(t: TileArgs<'_>, acc: &mut Tile) {
    // SAFETY: forwarded.
    unsafe {
        match t.rows {
            1 => tile_one_row::<P>(t, acc),
            2 => tile::<2, P>(t, acc),
            3 => tile::<3, P>(t, acc),
            4 => tile::<4, P>(t, acc),
            5 => tile::<5, P>(t, acc),
            _ => tile::<6, P>(t, acc),
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const R: usize, const P: usize>(t: TileArgs<'_>, out: &mut Tile) {
    let g_n = t.groups;
    debug_assert!(t.w.len() >= P * g_n);
    let w = t.w.as_ptr() as *const __m512i;
    let mut acc = [[_mm512_setzero_si512(); P]; R];
    for g in 0..g_n {
        let mut wv = [_mm512_setzero_si512(); P];
        for (q, v) in wv.iter_mut().enumerate() {
            // SAFETY: block q·groups + g exists (P panels of `groups` blocks); blocks are
            // 64-byte aligned.
            *v = unsafe { _mm512_load_si512(w.add(q * g_n + g)) };
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            // SAFETY: row r has k_padded = 4·groups readable bytes.
            let a4 = unsafe { (t.a.add(r * t.lda + 4 * g) as *const i32).read_unaligned() };
            let av = _mm512_set1_epi32(a4);
            for q in 0..P {
                acc_r[q] = _mm512_dpbusd_epi32(acc_r[q], av, wv[q]);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (q, v) in acc_r.iter().enumerate() {
            // SAFETY: r < TILE_MR, (q+1)·16 ≤ TILE_NR.
            unsafe {
                _mm512_storeu_si512(
                    out.as_mut_ptr().add(r * TILE_NR + q * PANEL) as *mut __m512i,
                    *v,
                )
            };
        }
    }
}

/// One row (generation's matrix-vector case): with a single accumulator per panel the
/// `vpdpbusd` latency chain, not the loads, would bound the loop, so even and odd blocks go to
/// two accumulator sets that are added at the end.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile_one_row<const P: usize>(t: TileArgs<'_>, out: &mut Tile) {
    let g_n = t.groups;
    debug_assert!(t.w.len() >= P * g_n);
    let w = t.w.as_ptr() as *const __m512i;
    let a = t.a as *const i32;
    let mut even = [_mm512_setzero_si512(); P];
    let mut odd = [_mm512_setzero_si512(); P];
    let mut g = 0;
    while g + 2 <= g_n {
        // SAFETY: blocks g and g + 1 of each of the P panels exist; the row has 4·groups bytes.
        unsafe {
            let (a0, a1) = (
                _mm512_set1_epi32(a.add(g).read_unaligned()),
                _mm512_set1_epi32(a.add(g + 1).read_unaligned()),
            );
            for q in 0..P {
                let base = w.add(q * g_n + g);
                even[q] = _mm512_dpbusd_epi32(even[q], a0, _mm512_load_si512(base));
                odd[q] = _mm512_dpbusd_epi32(odd[q], a1, _mm512_load_si512(base.add(1)));
            }
        }
        g += 2;
    }
    if g < g_n {
        // SAFETY: as above, for the last block.
        unsafe {
            let a0 = _mm512_set1_epi32(a.add(g).read_unaligned());
            for (q, e) in even.iter_mut().enumerate() {
                *e = _mm512_dpbusd_epi32(*e, a0, _mm512_load_si512(w.add(q * g_n + g)));
            }
        }
    }
    for q in 0..P {
        // SAFETY: (q+1)·16 ≤ TILE_NR.
        unsafe {
            _mm512_storeu_si512(
                out.as_mut_ptr().add(q * PANEL) as *mut __m512i,
                _mm512_add_epi32(even[q], odd[q]),
            )
        };
    }
}
