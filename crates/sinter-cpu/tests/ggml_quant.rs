//! GGML block formats: sizes and ids as ggml defines them, hand-built blocks whose values are
//! known, the parallel path against block-by-block dequantization, and the errors.
//! (sinter-models' tests/gguf.rs compares every type with gguf-py's dequantization.)

use half::f16;
use sinter_cpu::ggml_quant::blocks::{BlockQ4K, BlockQ4_0, BlockQ5_0, BlockQ8_0};
use sinter_cpu::ggml_quant::{as_blocks, dequantize, ggml_type_name, GgmlBlock, GgmlType};

#[test]
fn block_sizes_and_ids_are_ggmls() {
    // (type, id, values per block, bytes per block) from ggml.c's type_traits.
    let table = [
        (GgmlType::F32, 0, 1, 4),
        (GgmlType::F16, 1, 1, 2),
        (GgmlType::Q4_0, 2, 32, 18),
        (GgmlType::Q4_1, 3, 32, 20),
        (GgmlType::Q5_0, 6, 32, 22),
        (GgmlType::Q5_1, 7, 32, 24),
        (GgmlType::Q8_0, 8, 32, 34),
        (GgmlType::Q2_K, 10, 256, 84),
        (GgmlType::Q3_K, 11, 256, 110),
        (GgmlType::Q4_K, 12, 256, 144),
        (GgmlType::Q5_K, 13, 256, 176),
        (GgmlType::Q6_K, 14, 256, 210),
        (GgmlType::Q8_K, 15, 256, 292),
        (GgmlType::BF16, 30, 1, 2),
    ];
    assert_eq!(table.len(), GgmlType::ALL.len());
    for (ty, id, elems, bytes) in table {
        assert_eq!(ty.id(), id, "{ty}");
        assert_eq!(GgmlType::from_id(id).unwrap(), ty);
        assert_eq!((ty.block_elems(), ty.block_bytes()), (elems, bytes), "{ty}");
        assert_eq!(ggml_type_name(id), Some(ty.name()));
    }
    assert_eq!(GgmlType::Q4_K.bytes_for(4096).unwrap(), 16 * 144);
}

#[test]
fn unsupported_and_unknown_types_are_refused_by_name() {
    let e = GgmlType::from_id(16).unwrap_err().to_string();
    assert!(
        e.contains("16 (IQ2_XXS)") && e.contains("not supported"),
        "{e}"
    );
    assert!(e.contains("Q4_K"), "lists what is supported: {e}");
    let e = GgmlType::from_id(4).unwrap_err().to_string();
    assert!(e.contains("Q4_2"), "{e}");
    let e = GgmlType::from_id(999).unwrap_err().to_string();
    assert!(e.contains("999") && e.contains("unknown"), "{e}");
}

fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

#[test]
fn q8_0_is_scale_times_signed_byte() {
    let qs: [u8; 32] = std::array::from_fn(|j| (j as i32 * 8 - 128) as i8 as u8);
    let block = BlockQ8_0 {
        d: f16_bytes(0.25),
        qs,
    };
    let mut out = [0f32; 32];
    dequantize(GgmlType::Q8_0, bytemuck::bytes_of(&block), &mut out).unwrap();
    for (j, v) in out.iter().enumerate() {
        assert_eq!(*v, 0.25 * (j as f32 * 8.0 - 128.0), "value {j}");
    }
}

#[test]
fn q4_0_low_nibbles_are_the_first_half() {
    // Byte j: low nibble j (value j), high nibble 15 - j (value j + 16).
    let qs: [u8; 16] = std::array::from_fn(|j| j as u8 | ((15 - j as u8) << 4));
    let block = BlockQ4_0 {
        d: f16_bytes(2.0),
        qs,
    };
    let mut out = [0f32; 32];
    block.dequantize(&mut out);
    for j in 0..16 {
        assert_eq!(out[j], 2.0 * (j as f32 - 8.0));
        assert_eq!(out[j + 16], 2.0 * (7.0 - j as f32));
    }
}

#[test]
fn q5_0_fifth_bit_comes_from_qh() {
    // All nibbles 0; bit j of qh set for odd j: values −16 (even j) and 0 (odd j), times d.
    let block = BlockQ5_0 {
        d: f16_bytes(0.5),
        qh: 0xAAAA_AAAAu32.to_le_bytes(),
        qs: [0; 16],
    };
    let mut out = [0f32; 32];
    block.dequantize(&mut out);
    for (j, v) in out.iter().enumerate() {
        let expected = if j % 2 == 1 { 0.0 } else { -8.0 };
        assert_eq!(*v, expected, "value {j}");
    }
}

#[test]
fn q4_k_sub_block_scales_and_minimums() {
    // Scale of sub-block s = s + 1, minimum 0, all nibbles 3, d = 1, dmin = 1 → value 3·(s+1).
    // Sub-blocks 0..4 take their 6-bit scale from bytes 0..4; 4..8 from the low nibble of
    // bytes 8..12 (high 2 bits from the top of bytes 0..4, here 0).
    let mut scales = [0u8; 12];
    for s in 0..4 {
        scales[s] = s as u8 + 1;
        scales[8 + s] = s as u8 + 5;
    }
    let block = BlockQ4K {
        d: f16_bytes(1.0),
        dmin: f16_bytes(1.0),
        scales,
        qs: [0x33; 128],
    };
    let mut out = [0f32; 256];
    block.dequantize(&mut out);
    for (j, v) in out.iter().enumerate() {
        assert_eq!(*v, 3.0 * (j / 32 + 1) as f32, "value {j}");
    }
}

#[test]
fn parallel_dequantization_matches_block_by_block() {
    // Large enough (2^18 values) to take the parallel path, from pseudo-random bytes with a
    // fixed finite scale (and minimum) in every block.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state as u8
    };
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::F16,
    ] {
        let n = 1 << 18;
        let mut bytes: Vec<u8> = (0..ty.bytes_for(n).unwrap()).map(|_| next()).collect();
        if ty == GgmlType::F16 {
            // Half of f16's relative step, or of its subnormal step (2⁻²⁴) below 2⁻¹⁴.
            for c in bytes.chunks_exact_mut(2) {
                c.copy_from_slice(&f16_bytes(c[0] as f32 - 128.0));
            }
        } else {
            for block in bytes.chunks_exact_mut(ty.block_bytes()) {
                block[..2].copy_from_slice(&f16_bytes(0.01));
                if ty == GgmlType::Q4_K {
                    block[2..4].copy_from_slice(&f16_bytes(0.02)); // dmin
                }
            }
        }
        let mut whole = vec![0f32; n];
        dequantize(ty, &bytes, &mut whole).unwrap();
        let mut by_block = vec![0f32; n];
        for (b, o) in bytes
            .chunks_exact(ty.block_bytes())
            .zip(by_block.chunks_exact_mut(ty.block_elems()))
        {
            dequantize(ty, b, o).unwrap();
        }
        assert!(whole == by_block, "{ty}");
        assert!(whole.iter().all(|v| v.is_finite()) && whole.iter().any(|v| *v != 0.0));
    }
}

#[test]
fn wrong_lengths_are_errors() {
    let mut out = vec![0f32; 64];
    let e = dequantize(GgmlType::Q4_0, &[0u8; 35], &mut out).unwrap_err();
    assert!(e.to_string().contains("take 36 bytes, but 35"), "{e}");
    let mut out = vec![0f32; 40];
    let e = dequantize(GgmlType::Q4_0, &[0u8; 36], &mut out).unwrap_err();
    assert!(e.to_string().contains("multiple of 32"), "{e}");
    assert!(GgmlType::Q6_K.bytes_for(100).is_err());
    assert!(as_blocks::<BlockQ4_0>(&[0u8; 17]).is_none());
    assert_eq!(as_blocks::<BlockQ4_0>(&[0u8; 36]).unwrap().len(), 2);
}

// ---- Dot products and the quantized GEMV/GEMM (ggml_quant::dot) ----

use sinter_cpu::ggml_quant::dot::{DotPath, DOT_TYPES, F32_MIN_ROWS};
use sinter_cpu::ggml_quant::QuantMatrix;
use sinter_cpu::Isa;

/// xorshift64: deterministic pseudo-random bytes and floats.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

/// Random blocks of `ty` for `rows` × `k` with finite scales of realistic size, and for each
/// block the largest offset its values carry besides d·q (the minimum of Q4_1/Q4_K, 8d of
/// Q4_0, 32·d·scale of Q6_K), which bounds the f32 rounding of the kernels' partial sums.
fn random_weight(ty: GgmlType, rows: usize, k: usize, rng: &mut Rng) -> (Vec<u8>, Vec<f32>) {
    let mut bytes: Vec<u8> = (0..ty.bytes_for(rows * k).unwrap())
        .map(|_| rng.byte())
        .collect();
    let mut offsets = Vec::new();
    for b in bytes.chunks_exact_mut(ty.block_bytes()) {
        let d = rng.uniform(0.002, 0.03);
        let off = match ty {
            GgmlType::Q8_0 => {
                b[..2].copy_from_slice(&f16_bytes(d));
                0.0
            }
            GgmlType::Q4_0 => {
                b[..2].copy_from_slice(&f16_bytes(d));
                8.0 * d
            }
            GgmlType::Q4_1 | GgmlType::Q4_K => {
                let m = rng.uniform(-0.3, 0.0);
                b[..2].copy_from_slice(&f16_bytes(d));
                if ty == GgmlType::Q4_1 {
                    b[2..4].copy_from_slice(&f16_bytes(m));
                    m.abs()
                } else {
                    // dmin·(6-bit minimum) is subtracted: dmin ≥ 0.
                    b[2..4].copy_from_slice(&f16_bytes(-m / 63.0));
                    m.abs()
                }
            }
            GgmlType::Q6_K => {
                let d = d / 64.0;
                let n = b.len();
                b[n - 2..].copy_from_slice(&f16_bytes(d));
                let sc = b[n - 2 - 16..n - 2].iter().map(|&s| (s as i8 as f32).abs());
                32.0 * d * sc.fold(0.0, f32::max)
            }
            _ => unreachable!(),
        };
        offsets.push(off * 1.001); // the f16 rounding of d and m
    }
    (bytes, offsets)
}

/// Activations ~ uniform(-1, 1) with an outlier every 397 values and one all-zero row stretch.
fn random_x(m: usize, k: usize, rng: &mut Rng) -> Vec<f32> {
    (0..m * k)
        .map(|i| match i {
            _ if i % 397 == 5 => rng.uniform(-20.0, 20.0),
            _ if (k..k + 256.min(k)).contains(&i) => 0.0,
            _ => rng.uniform(-1.0, 1.0),
        })
        .collect()
}

/// Checks W·x on every path against f64 dequantize(W)·x within the bound of `dot`'s docs:
/// per activation block b of size B (32, or 256 for k-quants) with step d_b = max|x|/127,
/// |x − d_b·q| ≤ d_b/2, so |error| ≤ Σ_b (d_b/2)·Σ_{i∈b}|w_i|; plus f32 rounding of the
/// kernels' partial sums, at most (blocks + 8)·2⁻²⁴ of Σ|x_i|·(|w_i| + offset of its block).
fn check_product(ty: GgmlType, n: usize, k: usize, m: usize, seed: u64) {
    let mut rng = Rng(seed);
    let (bytes, offsets) = random_weight(ty, n, k, &mut rng);
    let w = QuantMatrix::new(ty, n, k, bytes).unwrap();
    let wf = w.dequantize();
    let x = random_x(m, k, &mut rng);
    let ab = if ty.block_elems() == 256 { 256 } else { 32 };
    let wb = ty.block_elems();
    let paths = DotPath::available();
    if !paths.contains(&DotPath::Avx512Vnni) {
        eprintln!("{ty}: this CPU has no AVX512-VNNI; its path is not run here");
    }
    for path in paths {
        let mut y = vec![f32::NAN; m * n];
        w.matmul_with(path, &x, m, &mut y).unwrap();
        for i in 0..m {
            let xr = &x[i * k..(i + 1) * k];
            for j in 0..n {
                let wr = &wf[j * k..(j + 1) * k];
                let exact: f64 = wr.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mut bound = 0f64;
                for (xb, wbk) in xr.chunks(ab).zip(wr.chunks(ab)) {
                    let step = xb.iter().fold(0f32, |a, v| a.max(v.abs())) as f64 / 127.0;
                    let wsum: f64 = wbk.iter().map(|v| v.abs() as f64).sum();
                    bound += step / 2.0 * (1.0 + 1e-6) * wsum;
                }
                let mag: f64 = (0..k)
                    .map(|l| {
                        let off = offsets[(j * k + l) / wb] as f64;
                        xr[l].abs() as f64 * (wr[l].abs() as f64 + off)
                    })
                    .sum();
                bound += ((k / ab) as f64 + 8.0) * 2f64.powi(-24) * mag;
                let got = y[i * n + j] as f64;
                assert!(
                    (got - exact).abs() <= bound,
                    "{ty} {} [{m}x{k}]·[{n}x{k}]ᵀ at ({i}, {j}): {got} vs {exact}, bound {bound}",
                    path.name()
                );
            }
        }
    }
}

#[test]
fn quantized_gemv_and_gemm_match_dequantized_f64_on_every_path() {
    for (t, ty) in DOT_TYPES.into_iter().enumerate() {
        let kb = ty.block_elems().max(32);
        // k of one block and of several; n odd; m = 1 (GEMV) and m > 1 (GEMM: rows go
        // through the kernels four at a time, then the rest).
        // n of 8, 16, 21 and 24: Q8_0/Q4_0/Q4_1 rows stored in groups of eight, and the rows
        // after the last whole group stored as they were; m of 2 to 16 runs the grouped
        // kernel on two, three and four activation rows at once.
        let grouped = [
            (8, kb, 1),
            (16, 3 * kb, 1),
            (21, 2 * kb, 1),
            (21, 2 * kb, 5),
            (16, 2 * kb, 2),
            (24, 3 * kb, 3),
            (8, kb, 4),
            (21, 2 * kb, 16),
        ];
        let ragged = [(1, kb, 1), (7, 3 * kb, 1), (5, 2 * kb, 3), (13, kb * 4, 6)];
        for (n, k, m) in ragged.into_iter().chain(grouped) {
            check_product(ty, n, k, m, 0x9e37_79b9 + t as u64);
        }
    }
}

#[test]
fn prompt_sized_products_run_through_f32_within_the_bound() {
    // From F32_MIN_ROWS rows the parts are dequantized and run by the f32 GEMM: the result
    // stays within the same bound of the exact product (tighter in fact: no activation
    // rounding), on every path, for every format.
    for (t, ty) in DOT_TYPES.into_iter().enumerate() {
        let kb = ty.block_elems().max(32);
        check_product(ty, 9, 2 * kb, F32_MIN_ROWS + 3, 0x51ed + t as u64);
    }
}

#[test]
fn large_quantized_products_split_rows_over_threads() {
    // 2 MiB-ish weights take the parallel split; rows cover several tasks and a ragged end.
    check_product(GgmlType::Q4_K, 203, 1024, 2, 7);
    check_product(GgmlType::Q8_0, 150, 1024, 1, 8);
    // Several activation rows over more weight rows than one tile of the move into y
    // (`transpose_into`), grouped with a ragged end; then a smaller product on the same
    // thread, which reuses the larger one's buffer.
    check_product(GgmlType::Q4_1, 139, 1024, 5, 9);
    check_product(GgmlType::Q4_0, 70, 256, 3, 10);
}

#[test]
fn grouped_rows_dequantize_as_the_file_stores_them() {
    // Rows kept eight together for the GEMV read back as the file's rows: whole and by row.
    for (t, ty) in DOT_TYPES.into_iter().enumerate() {
        let mut rng = Rng(40 + t as u64);
        let (n, k) = (19, 2 * ty.block_elems().max(32));
        let (bytes, _) = random_weight(ty, n, k, &mut rng);
        let mut want = vec![0f32; n * k];
        dequantize(ty, &bytes, &mut want).unwrap();
        let w = QuantMatrix::new(ty, n, k, bytes).unwrap();
        assert_eq!(w.dequantize(), want, "{ty}");
        let mut row = vec![0f32; k];
        for r in [0, 7, 8, 15, 16, 18] {
            w.dequantize_row(r, &mut row).unwrap();
            assert_eq!(row, want[r * k..(r + 1) * k], "{ty} row {r}");
        }
    }
}

#[test]
fn mixed_type_parts_stack_by_rows() {
    let mut rng = Rng(3);
    let k = 512;
    let (a, _) = random_weight(GgmlType::Q4_K, 4, k, &mut rng);
    let (b, _) = random_weight(GgmlType::Q6_K, 3, k, &mut rng);
    let (c, _) = random_weight(GgmlType::Q8_0, 2, k, &mut rng);
    let parts = vec![
        QuantMatrix::new(GgmlType::Q4_K, 4, k, a).unwrap(),
        QuantMatrix::new(GgmlType::Q6_K, 3, k, b).unwrap(),
        QuantMatrix::new(GgmlType::Q8_0, 2, k, c).unwrap(),
    ];
    let single: Vec<QuantMatrix> = parts.clone();
    let w = QuantMatrix::stack(parts).unwrap();
    assert_eq!((w.n(), w.k()), (9, k));
    // Both ways of a product: integer dot products (few rows) and through f32 (many).
    for m in [2, F32_MIN_ROWS] {
        let x = random_x(m, k, &mut rng);
        let mut y = vec![0f32; m * 9];
        w.matmul(&x, m, &mut y).unwrap();
        // Each part's columns equal that part alone.
        let mut col = 0;
        for p in &single {
            let mut yp = vec![0f32; m * p.n()];
            p.matmul(&x, m, &mut yp).unwrap();
            for i in 0..m {
                assert_eq!(
                    &y[i * 9 + col..i * 9 + col + p.n()],
                    &yp[i * p.n()..(i + 1) * p.n()],
                    "{m} rows, row {i}"
                );
            }
            col += p.n();
        }
    }
}

#[test]
fn quantized_products_refuse_bad_shapes_and_types() {
    let e = QuantMatrix::new(GgmlType::Q4_K, 2, 100, vec![0; 10]).unwrap_err();
    assert!(e.to_string().contains("multiple of 256"), "{e}");
    let e = QuantMatrix::new(GgmlType::Q8_0, 2, 64, vec![0; 10]).unwrap_err();
    assert!(e.to_string().contains("take 136 bytes, but 10"), "{e}");
    let e = QuantMatrix::new(GgmlType::Q5_K, 1, 256, vec![0; 176]).unwrap_err();
    assert!(e.to_string().contains("no dot-product kernels"), "{e}");
    let w = QuantMatrix::new(GgmlType::Q8_0, 2, 32, vec![0; 68]).unwrap();
    let e = w.matmul(&[0.0; 33], 1, &mut [0.0; 2]).unwrap_err();
    assert!(e.to_string().contains("needs 32 and 2"), "{e}");
}

#[test]
fn dot_path_follows_the_isa_cap() {
    assert_eq!(DotPath::for_isa(Isa::Scalar), DotPath::Scalar);
    assert_eq!(DotPath::for_isa(Isa::Avx2), DotPath::Avx2);
    assert_eq!(DotPath::get(), DotPath::for_isa(Isa::get()));
    assert!(DotPath::available().contains(&DotPath::Scalar));
}

#[test]
fn rows_taken_together_equal_rows_one_at_a_time() {
    // The multi-row kernels do each row's arithmetic exactly as the one-row call does: on
    // rows stored one by one (n = 3) and in groups of eight with a ragged end (n = 19), for
    // activation rows taken four, three, two and one at a time (m = 2, 5, 6, 7, 16).
    for (t, ty) in DOT_TYPES.into_iter().enumerate() {
        for n in [3, 19] {
            let mut rng = Rng(100 + t as u64);
            let k = 2 * ty.block_elems().max(32);
            let (bytes, _) = random_weight(ty, n, k, &mut rng);
            let w = QuantMatrix::new(ty, n, k, bytes).unwrap();
            for m in [2, 5, 6, 7, 16] {
                let x = random_x(m, k, &mut rng);
                for path in DotPath::available() {
                    let mut all = vec![0f32; m * n];
                    w.matmul_with(path, &x, m, &mut all).unwrap();
                    for i in 0..m {
                        let mut one = vec![0f32; n];
                        w.matmul_with(path, &x[i * k..(i + 1) * k], 1, &mut one)
                            .unwrap();
                        assert_eq!(
                            &all[i * n..(i + 1) * n],
                            &one[..],
                            "{ty} {} n {n}, m {m}, row {i}",
                            path.name()
                        );
                    }
                }
            }
        }
    }
}

use sinter_cpu::ggml_quant::quantize::{quantize, step_bound, QUANTIZE_TYPES};

/// Rows that test the quantizer's corners: uniform values, an outlier, an all-zero block, a
/// constant positive block (a minimum above zero), all-negative values and tiny ones.
fn quantizer_rows(k: usize, rows: usize, rng: &mut Rng) -> Vec<f32> {
    (0..rows * k)
        .map(|i| match (i / k, i % k) {
            (0, j) if j % 257 == 3 => rng.uniform(-9.0, 9.0),
            (1, j) if j < 256 => 0.0,
            (1, _) => 0.37,
            (2, _) => rng.uniform(-2.0, -0.5),
            (3, _) => rng.uniform(-1e-3, 1e-3),
            _ => rng.uniform(-1.0, 1.0),
        })
        .collect()
}

/// Every written block format puts each value within half a step of its block (or
/// sub-block) of the original, one step for the formats with one level more below zero
/// (Q4_0, Q6_K): `quantize`'s documented bound, with the steps read back from the bytes.
/// Plus f16's rounding of the scale (2⁻¹¹ of the block's largest value) for the bytes read.
#[test]
fn quantize_stays_within_half_a_step_of_each_value() {
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let (k, rows) = (512, 6);
    let x = quantizer_rows(k, rows, &mut rng);
    for ty in QUANTIZE_TYPES {
        let bytes = quantize(ty, &x, k).unwrap();
        assert_eq!(bytes.len(), ty.bytes_for(rows * k).unwrap(), "{ty}");
        let mut back = vec![0f32; x.len()];
        dequantize(ty, &bytes, &mut back).unwrap();
        if ty == GgmlType::F32 {
            assert_eq!(back, x);
            continue;
        }
        if ty == GgmlType::F16 {
            // Half of f16's relative step, or of its subnormal step (2⁻²⁴) below 2⁻¹⁴.
            for (a, b) in x.iter().zip(&back) {
                assert!(
                    (a - b).abs() <= a.abs() / 2048.0 + 2f32.powi(-25),
                    "{ty}: {a} → {b}"
                );
            }
            continue;
        }
        let steps = step_bound(ty, &bytes).unwrap();
        let share = match ty {
            GgmlType::Q4_0 | GgmlType::Q6_K => 1.0,
            _ => 0.5,
        };
        let mut worst = 0f32;
        for (i, ((a, b), s)) in x.iter().zip(&back).zip(&steps).enumerate() {
            let bound = share * s * 1.0001 + a.abs() * 1e-6;
            assert!(
                (a - b).abs() <= bound,
                "{ty}: value {i} (row {}) {a} → {b}, step {s}",
                i / k
            );
            worst = worst.max((a - b).abs() / s.max(f32::MIN_POSITIVE));
        }
        // A format whose steps were all huge would pass the above: the step must be the
        // block's range over its levels, give or take the rounding of the scales.
        let levels = match ty {
            GgmlType::Q8_0 => 254.0,
            GgmlType::Q6_K => 63.0,
            _ => 15.0,
        };
        let block = if ty == GgmlType::Q6_K { 16 } else { 32 }; // the (sub-)block of a step
        for (i, chunk) in x.chunks(block).enumerate() {
            let range = chunk.iter().fold(0f32, |m, v| m.max(v.abs())) * 2.0;
            let step = steps[i * block];
            assert!(
                step <= range / levels * 2.5 + 1e-7 || range == 0.0,
                "{ty}: block {i} step {step} for range {range}"
            );
        }
        eprintln!("{ty}: worst error {worst:.3} of a step");
    }
}

/// Rows that are not whole blocks, lengths that are not whole rows and types sinter does not
/// write are refused, each error naming the numbers and types.
#[test]
fn quantize_refuses_partial_blocks_and_unwritable_types() {
    let x = vec![0.5f32; 2 * 576];
    let e = quantize(GgmlType::Q4_K, &x, 576).unwrap_err().to_string();
    assert!(
        e.contains("576") && e.contains("Q4_K") && e.contains("256"),
        "{e}"
    );
    assert!(quantize(GgmlType::Q8_0, &x, 576).is_ok());
    let e = quantize(GgmlType::Q5_K, &x[..512], 256)
        .unwrap_err()
        .to_string();
    assert!(e.contains("Q5_K") && e.contains("Q8_0"), "{e}");
    let e = quantize(GgmlType::Q8_0, &x[..100], 64)
        .unwrap_err()
        .to_string();
    assert!(e.contains("100") && e.contains("64"), "{e}");
}

#[test]
fn q4_k_scales_unpack_at_once_as_one_by_one() {
    use sinter_cpu::ggml_quant::blocks::{scale_min_k4, scales_mins_k4};
    let mut rng = Rng(0x5eed);
    let mut cases: Vec<[u8; 12]> = vec![[0; 12], [0xFF; 12], [0x3F; 12], [0xC0; 12]];
    cases.extend((0..2000).map(|_| std::array::from_fn(|_| rng.byte())));
    for q in cases {
        let (scales, mins) = scales_mins_k4(&q);
        for j in 0..8 {
            assert_eq!(
                (scales[j], mins[j]),
                scale_min_k4(j, &q),
                "sub-block {j} of {q:?}"
            );
        }
    }
}
