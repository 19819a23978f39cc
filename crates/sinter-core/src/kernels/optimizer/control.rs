//! The step control block's layout and the loss scaler's settings: one layout for the CPU's
//! loops (`cpu.rs`) and the kernels (`optimizer.cu`, whose `CTL_*` defines the tests hold to
//! it). What the block is for: `step_ctl`.

/// Slots of the step control block: a small f32 buffer on the device that the optimizer and
/// step kernels read and update, so a training step needs no host round trip (and a captured
/// CUDA graph replays with the current values). Must match the `CTL_*` defines in optimizer.cu.
pub mod ctl {
    /// 1 when the step's (loss-scaled) gradients hold inf/NaN: the optimizer skips the update.
    pub const FOUND_INF: usize = 0;
    /// Learning rate of the current step (from the schedule table).
    pub const LR: usize = 1;
    /// Optimizer updates taken (skipped steps excluded); AdamW's bias corrections use it + 1.
    pub const STEPS: usize = 2;
    /// Multiplies every gradient in the optimizer pass: clip factor / loss scale.
    pub const GRAD_FACTOR: usize = 3;
    /// The loss scale (1 without dynamic scaling).
    pub const SCALE: usize = 4;
    /// Good steps in a row since the scale last changed (the growth tracker).
    pub const GOOD_STEPS: usize = 5;
    /// Steps of the schedule done (skipped ones included): the index into the lr table.
    pub const ITER: usize = 6;
    /// Steps skipped for inf/NaN gradients.
    pub const SKIPPED: usize = 7;
    /// Global gradient norm of the last step (unscaled, before clipping).
    pub const GRAD_NORM: usize = 8;
    /// Slots in the block.
    pub const LEN: usize = 9;
}

/// Growth / backoff of dynamic loss scaling for `step_finish`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScalerCfg {
    pub growth: f32,
    pub backoff: f32,
    /// Good steps in a row before the scale grows.
    pub interval: u64,
}
