//! The ten-field parameters of the benches' and the scale tests' many-run cases (a typical
//! training config: floats, integers, a string, a bool), and the `i`th of a sweep of them.

use serde::{Deserialize, Serialize};

/// Ten fields, as a training config has.
#[derive(Clone, Serialize, Deserialize)]
pub struct Params10 {
    pub lr: f64,
    pub weight_decay: f64,
    pub hidden: u32,
    pub layers: u32,
    pub dropout: f64,
    pub batch_size: u32,
    pub epochs: u32,
    pub optimizer: String,
    pub seed: u64,
    pub warmup: bool,
}

/// The `i`th run of a sweep: a grid over `lr`, `hidden`, `layers` and `warmup`, `seed` = `i`
/// (so every run is distinct).
pub fn p10(i: u64) -> Params10 {
    Params10 {
        lr: 1e-3 * (1 + i % 7) as f64,
        weight_decay: 0.01,
        hidden: 64 << (i % 4),
        layers: 2 + (i % 3) as u32,
        dropout: 0.1,
        batch_size: 32,
        epochs: 10,
        optimizer: "adamw".into(),
        seed: i,
        warmup: i.is_multiple_of(2),
    }
}
