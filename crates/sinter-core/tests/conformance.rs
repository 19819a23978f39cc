//! Op conformance suite for sinter-core.
//!
//! Every op's forward is checked against a plain f64 reference and every backward against
//! central finite differences, on random shapes including broadcast and non-contiguous inputs;
//! plus autograd semantics, half-precision agreement, and errors (not panics) on misuse.

// Tables of (name, op, reference) tuples read best inline.
#![allow(clippy::type_complexity)]

#[path = "conformance/common.rs"]
mod common;

#[path = "conformance/autograd.rs"]
mod autograd;
#[path = "conformance/backward.rs"]
mod backward;
#[path = "conformance/elementwise.rs"]
mod elementwise;
#[path = "conformance/errors.rs"]
mod errors;
#[path = "conformance/half.rs"]
mod half;
#[path = "conformance/linalg.rs"]
mod linalg;
#[path = "conformance/nn.rs"]
mod nn;
#[path = "conformance/reduce.rs"]
mod reduce;
