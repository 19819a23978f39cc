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
