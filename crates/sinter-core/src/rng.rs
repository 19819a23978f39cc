//! The seeded generator of initialisation and dropout (xoshiro256**, defined once in
//! `sinter-types`; checkpoints save its four-u64 state).

pub use sinter_types::rng::Rng;
