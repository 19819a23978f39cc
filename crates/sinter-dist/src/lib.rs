//! sinter-dist
