//! Shared by this crate's memory tests and benches.
#![allow(dead_code)]

pub mod conv_bn_net;
pub mod counting_alloc;
