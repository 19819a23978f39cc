//! sinter-core
