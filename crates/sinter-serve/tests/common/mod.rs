//! What the server test files share: a tiny random byte-level GPT to serve.

use sinter_core::Rng;
use sinter_models::{Gpt, GptConfig};
use sinter_nn::module::shared_rng;
use sinter_nn::Module;
use sinter_serve::GptModel;

/// 2 layers, width 32, context 64, 256 byte tokens; its text is gibberish, fixed by `seed`.
pub fn tiny_gpt(seed: u64) -> GptModel {
    let cfg = GptConfig {
        n_layer: 2,
        n_head: 2,
        n_embd: 32,
        block_size: 64,
        vocab_size: 256,
        dropout: 0.0,
        ..Default::default()
    };
    let gpt = Gpt::new(cfg, &mut Rng::new(seed), &shared_rng(seed)).unwrap();
    gpt.set_training(false);
    GptModel::new(gpt, 64).unwrap()
}
