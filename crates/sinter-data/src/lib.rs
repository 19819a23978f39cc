//! sinter-data
