//! The elementwise and reduction operations as data (defined once in `sinter-types`, with their
//! f64 reference semantics and the CPU kernels' f32 arithmetic).

pub use sinter_types::op::{
    erf, floor_div_f32, floor_div_f64, floor_div_i64, pool_max_replaces, BinaryOp, ReduceOp,
    UnaryOp,
};
