//! sinter-nn
