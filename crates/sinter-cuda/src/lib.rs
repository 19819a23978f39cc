//! sinter-cuda
