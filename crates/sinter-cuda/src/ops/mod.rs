//! Rust wrappers of the kernels: one module per kernel file. Each file declares its kernels as
//! rows of the kernel table (`table.rs`: name rule, argument slots, geometry, traffic); each op
//! has a pure `plan_*` function (checks its arguments, then one call into its row: the generic
//! planner picks the kernel and grid and builds the argument list) and a device function that
//! runs the plan on the device's stream.

pub mod binary;
pub mod boolean;
pub mod conv;
pub mod copy;
pub mod dropout;
pub mod embedding;
pub mod int;
pub mod reduce;
pub mod table;
pub mod unary;

mod common;

pub(crate) use crate::check::{need, need_dtype, need_float, need_len, opt_need};
use crate::launch::{Launch, LaunchTarget};
pub(crate) use common::{all_contiguous, numel, ptr_of, rows_times_n, steps};
pub use common::{fake_slice, kernels_of};

/// Every row of the kernel table: each kernel file's rows.
pub fn kernel_table() -> impl Iterator<Item = &'static table::Kernel> {
    [
        &unary::KERNELS[..],
        &binary::KERNELS,
        &copy::KERNELS,
        &reduce::KERNELS,
        &embedding::KERNELS,
        &conv::KERNELS,
        &dropout::KERNELS,
        &int::KERNELS,
        &boolean::KERNELS,
    ]
    .into_iter()
    .flatten()
    .copied()
}

/// One sample plan per kernel instantiation that the wrappers can launch, built with fake
/// pointers. The NVRTC test checks each against the compiled PTX (name and parameter types) and
/// that no compiled kernel is left without a wrapper.
#[doc(hidden)]
pub fn sample_plans(t: &LaunchTarget) -> Vec<Launch> {
    kernel_table().flat_map(|k| k.samples(t)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn sample_plans_are_valid_and_cover_each_dtype() {
        let t = LaunchTarget { sm_count: 132 };
        let plans = sample_plans(&t);
        assert!(plans.len() > 300, "{}", plans.len());
        let mut names = HashSet::new();
        for p in &plans {
            p.validate().unwrap();
            names.insert(p.name.clone());
        }
        for n in [
            "add_f32",
            "add_bf16",
            "where_cond_f16",
            "cmp_lt_bool",
            "gelu_tanh_bwd_bf16",
            "cast_bf16_i64",
            "sum_mid_partial_f16",
            "embedding_bwd_bf16",
            "emb_bwd_scan",
            "rand_normal_f16",
            "col2im_f32",
        ] {
            assert!(names.contains(n), "missing {n}");
        }
    }
}
