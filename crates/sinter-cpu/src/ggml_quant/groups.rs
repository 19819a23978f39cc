//! Weights of the 32-value formats (Q8_0, Q4_0, Q4_1) stored eight rows together, for the
//! matrix × vector products of a decode step.
//!
//! Row by row, every block of a product ends in a horizontal sum of its i32 lanes and a
//! scalar scale multiplied and broadcast. Stored eight rows together, one 256-bit load holds
//! four consecutive quants of each of eight rows (4 bytes per row); multiplied by those four
//! activations broadcast to every lane, lane i sums row i's products. A block then leaves
//! each row's sum in its own lane: the eight rows' scales apply as one vector, and eight
//! results are one store, with no horizontal sums (llama.cpp's AVX2 "repack" does this for
//! Q4_0 alone).
//!
//! The layout of a group of [`GROUP`] rows of `nb` blocks: for each block index, the
//! `GROUP × block_bytes` bytes of the eight rows' blocks: each 2-byte header field (d, then m
//! for Q4_1) of rows 0..8 side by side, then the quants in 4-byte chunks, chunk c of rows
//! 0..8 together. A 4-bit block's byte j holds value j (low nibble) and j + 16 (high), so the
//! low nibbles of quant chunks 0..4 are values 0..16 and their high nibbles values 16..32.
//! A group takes the same bytes as its rows; a matrix's rows beyond its last whole group stay
//! row by row.

use super::GgmlType;

/// Rows stored together.
pub const GROUP: usize = 8;

/// Bytes of a block's f16 header and of its quants, for the types stored in groups.
pub(super) fn layout(ty: GgmlType) -> Option<(usize, usize)> {
    match ty {
        GgmlType::Q8_0 => Some((2, 32)),
        GgmlType::Q4_0 => Some((2, 16)),
        GgmlType::Q4_1 => Some((4, 16)),
        _ => None,
    }
}

/// How many of `rows` rows of type `ty` are stored in groups (whole groups; none for types
/// without a grouped layout).
pub(super) fn grouped_rows(ty: GgmlType, rows: usize) -> usize {
    match layout(ty) {
        Some(_) => rows / GROUP * GROUP,
        None => 0,
    }
}

/// Where byte `o` of block `b` of row `i` (< GROUP) lies in its group.
#[inline]
fn at(header: usize, block_bytes: usize, i: usize, b: usize, o: usize) -> usize {
    let base = b * GROUP * block_bytes;
    if o < header {
        base + (o / 2) * 2 * GROUP + 2 * i + o % 2
    } else {
        let q = o - header;
        base + GROUP * header + (q / 4) * 4 * GROUP + 4 * i + q % 4
    }
}

/// Visits every 2- or 4-byte piece of a group: `f(offset in the rows, offset in the group,
/// piece length)`; `rows` are GROUP row-major rows of `row_bytes` bytes.
fn for_pieces(ty: GgmlType, row_bytes: usize, mut f: impl FnMut(usize, usize, usize)) {
    let (header, quants) = layout(ty).expect("only grouped types have a group layout");
    let bb = header + quants;
    for i in 0..GROUP {
        for b in 0..row_bytes / bb {
            let row_at = i * row_bytes + b * bb;
            for o in (0..header).step_by(2) {
                f(row_at + o, at(header, bb, i, b, o), 2);
            }
            for o in (header..bb).step_by(4) {
                f(row_at + o, at(header, bb, i, b, o), 4);
            }
        }
    }
}

/// `rows` (GROUP rows of `row_bytes`, row-major) rewritten as one group into `out`.
pub(super) fn group(ty: GgmlType, row_bytes: usize, rows: &[u8], out: &mut [u8]) {
    debug_assert!(rows.len() == GROUP * row_bytes && out.len() == rows.len());
    for_pieces(ty, row_bytes, |r, g, n| {
        out[g..g + n].copy_from_slice(&rows[r..r + n])
    });
}

/// One group back to its GROUP row-major rows.
pub(super) fn ungroup(ty: GgmlType, row_bytes: usize, group: &[u8], rows: &mut [u8]) {
    debug_assert!(rows.len() == GROUP * row_bytes && group.len() == rows.len());
    for_pieces(ty, row_bytes, |r, g, n| {
        rows[r..r + n].copy_from_slice(&group[g..g + n])
    });
}

/// The first `grouped` rows of `bytes` (rows of `row_bytes`) rewritten in groups, in place.
pub(super) fn group_rows(ty: GgmlType, row_bytes: usize, grouped: usize, bytes: &mut [u8]) {
    let mut rows = vec![0u8; GROUP * row_bytes];
    for g in bytes[..grouped * row_bytes].chunks_exact_mut(GROUP * row_bytes) {
        rows.copy_from_slice(g);
        group(ty, row_bytes, &rows, g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouping_is_undone_by_ungrouping_and_places_quant_chunks_together() {
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1] {
            let row_bytes = 3 * ty.block_bytes();
            let rows: Vec<u8> = (0..GROUP * row_bytes).map(|i| (i * 7 + 3) as u8).collect();
            let mut g = vec![0u8; rows.len()];
            group(ty, row_bytes, &rows, &mut g);
            let (header, _) = layout(ty).unwrap();
            let bb = ty.block_bytes();
            // Block 1's first quant chunk: rows 0..8's bytes header..header + 4, in row order.
            let chunk = &g[GROUP * bb + GROUP * header..][..4 * GROUP];
            for i in 0..GROUP {
                let want = &rows[i * row_bytes + bb + header..][..4];
                assert_eq!(&chunk[4 * i..4 * i + 4], want, "{ty} row {i}");
            }
            let mut back = vec![0u8; rows.len()];
            ungroup(ty, row_bytes, &g, &mut back);
            assert_eq!(back, rows, "{ty}");
        }
    }
}
