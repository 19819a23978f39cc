//! How `sinter train` runs (besides the config): where it writes, resumes from, stops, and
//! which parallel strategy it uses.

use std::path::PathBuf;

use super::ModelParallel;

pub struct TrainOptions {
    pub out: Option<PathBuf>,
    pub resume: Option<PathBuf>,
    /// `--overwrite`: a new run may replace the run in `out`.
    pub overwrite: bool,
    /// What a resumed run changed from its checkpoint's config, to print.
    pub notes: Vec<String>,
    pub quiet: bool,
    /// Stop (evaluating and checkpointing) after this step, for time-boxed jobs; `--resume`
    /// continues the same run later.
    pub stop_at_step: Option<u64>,
    /// Data parallel even in a single process (it is on by itself when the launcher's
    /// environment says WORLD_SIZE > 1, and with `--zero`).
    pub dp: bool,
    /// Capture the whole training step as a CUDA graph after warm-up steps and replay it:
    /// by default where it can be (CUDA, single process, static shapes, no dropout),
    /// `--cuda-graph` insists, `--no-cuda-graph` never.
    pub cuda_graph: super::GraphMode,
    /// `--dist-backend`: NCCL or the host ring for data parallel / ZeRO.
    pub dist_backend: sinter_dist::BackendChoice,
    /// `--tp` / `--pp`: tensor or pipeline parallel GPT replicas.
    pub parallel: Option<ModelParallel>,
    /// `--export-adapter`: where a LoRA run also writes its adapters (PEFT's format).
    pub export_adapter: Option<PathBuf>,
}
