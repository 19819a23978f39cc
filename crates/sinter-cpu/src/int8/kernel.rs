//! The micro-kernel contract and the portable (scalar) kernel.
//!
//! A kernel computes one *tile* of raw accumulators: acc[r, c] = Σ_k a[r, k]·w[c, k] for up to
//! `MR` activation rows and `NP` panels (16 output channels each), reading each activation row's
//! k_padded bytes and each panel's blocks front to back. It returns the exact integer sums, so
//! the driver's epilogue is the same for every kernel.

use super::pack::{Block, KGROUP, PANEL};

/// Largest tile any kernel produces: rows, and columns (the tile buffer's row stride).
pub const TILE_MR: usize = 8;
pub const TILE_NR: usize = 4 * PANEL;
pub type Tile = [i32; TILE_MR * TILE_NR];

/// Where a tile's operands are.
#[derive(Clone, Copy)]
pub struct TileArgs<'a> {
    /// Rows in this tile (1..=MR).
    pub rows: usize,
    /// First byte of the tile's first activation row; rows are `lda` apart and each has at
    /// least k_padded readable bytes.
    pub a: *const u8,
    pub lda: usize,
    /// The tile's panels (and any after them): panel q starts at block q·groups.
    pub w: &'a [Block],
    pub groups: usize,
    /// Σ_k w for the tile's channels (at least np·16 of them).
    pub sums: &'a [i32],
}

pub trait Kernel {
    /// Rows per full tile.
    const MR: usize;
    /// Panels per full tile.
    const NP: usize;
    /// Fills acc[r·TILE_NR + c] for r < rows and c < np·16, 1 ≤ np ≤ NP.
    ///
    /// # Safety
    /// The CPU supports the kernel's instructions; `t.a` addresses `rows` rows of k_padded
    /// readable bytes `t.lda` apart; `t.w` holds np·groups blocks; rows ≤ MR.
    unsafe fn tile(t: TileArgs<'_>, np: usize, acc: &mut Tile);
}

/// Portable Rust, reading the packed layout directly.
pub struct Scalar;

impl Kernel for Scalar {
    const MR: usize = 4;
    const NP: usize = 1;
    unsafe fn tile(t: TileArgs<'_>, np: usize, acc: &mut Tile) {
        let kp = t.groups * KGROUP;
        for r in 0..t.rows {
            // SAFETY: the caller guarantees kp readable bytes per row.
            let a = unsafe { std::slice::from_raw_parts(t.a.add(r * t.lda), kp) };
            for c in 0..np * PANEL {
                let (q, cc) = (c / PANEL, c % PANEL);
                let blocks = &t.w[q * t.groups..(q + 1) * t.groups];
                let mut s = 0i32;
                for (g, b) in blocks.iter().enumerate() {
                    for u in 0..KGROUP {
                        let p = a[g * KGROUP + u] as i32 * b.0[cc * KGROUP + u] as i32;
                        s = s.wrapping_add(p);
                    }
                }
                acc[r * TILE_NR + c] = s;
            }
        }
    }
}
