//! sinter-models
