//! A one-hidden-layer MLP (ReLU, softmax cross-entropy, minibatch SGD) on the handwritten-digits
//! data in `examples/data/digits.csv` (UCI, CC BY 4.0; see `examples/data/README.md`).
//!
//! Written out in plain Rust so the examples need no ML framework. Deterministic: the same
//! parameters and seed give bit-identical results on any run.

use std::path::Path;

/// Pixels per image (8x8).
pub const FEATURES: usize = 64;
/// Digits 0-9.
pub const CLASSES: usize = 10;

/// Samples: `x` row-major (`n x FEATURES`, scaled to 0..1), `y` the digit.
pub struct Dataset {
    pub x: Vec<f64>,
    pub y: Vec<usize>,
}

impl Dataset {
    pub fn len(&self) -> usize {
        self.y.len()
    }
}

/// A small deterministic PRNG (xorshift64*), enough for shuffling and initialisation.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

/// Loads the CSV and splits it 80/20 into (train, validation) with a fixed shuffle.
pub fn load(path: &Path) -> Result<(Dataset, Dataset), Box<dyn std::error::Error + Send + Sync>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut rows: Vec<(Vec<f64>, usize)> = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let vals: Vec<&str> = line.split(',').collect();
        if vals.len() != FEATURES + 1 {
            return Err(format!(
                "{}:{}: {} columns, expected {}",
                path.display(),
                i + 1,
                vals.len(),
                FEATURES + 1
            )
            .into());
        }
        let mut x = Vec::with_capacity(FEATURES);
        for v in &vals[..FEATURES] {
            let p: f64 = v
                .trim()
                .parse()
                .map_err(|_| format!("{}:{}: bad pixel {v:?}", path.display(), i + 1))?;
            x.push(p / 16.0);
        }
        let y: usize = vals[FEATURES]
            .trim()
            .parse()
            .map_err(|_| format!("{}:{}: bad label", path.display(), i + 1))?;
        if y >= CLASSES {
            return Err(format!("{}:{}: label {y} out of 0..10", path.display(), i + 1).into());
        }
        rows.push((x, y));
    }
    Rng::new(42).shuffle(&mut rows);
    let cut = rows.len() * 4 / 5;
    let to_set = |rows: &[(Vec<f64>, usize)]| Dataset {
        x: rows.iter().flat_map(|r| r.0.iter().copied()).collect(),
        y: rows.iter().map(|r| r.1).collect(),
    };
    Ok((to_set(&rows[..cut]), to_set(&rows[cut..])))
}

/// `FEATURES -> hidden (ReLU) -> CLASSES (softmax)`.
pub struct Mlp {
    hidden: usize,
    w1: Vec<f64>,
    b1: Vec<f64>,
    w2: Vec<f64>,
    b2: Vec<f64>,
}

impl Mlp {
    /// Glorot-uniform weights, zero biases.
    pub fn new(hidden: usize, rng: &mut Rng) -> Self {
        let mut init = |fan_in: usize, fan_out: usize| {
            let a = (6.0 / (fan_in + fan_out) as f64).sqrt();
            (0..fan_in * fan_out)
                .map(|_| (rng.unit() * 2.0 - 1.0) * a)
                .collect::<Vec<_>>()
        };
        let w1 = init(FEATURES, hidden);
        let w2 = init(hidden, CLASSES);
        Self {
            hidden,
            w1,
            b1: vec![0.0; hidden],
            w2,
            b2: vec![0.0; CLASSES],
        }
    }

    fn forward(&self, x: &[f64], h: &mut [f64], p: &mut [f64; CLASSES]) {
        for (j, hj) in h.iter_mut().enumerate() {
            let mut s = self.b1[j];
            for (i, xi) in x.iter().enumerate() {
                s += xi * self.w1[i * self.hidden + j];
            }
            *hj = s.max(0.0);
        }
        for (k, pk) in p.iter_mut().enumerate() {
            let mut s = self.b2[k];
            for (j, hj) in h.iter().enumerate() {
                s += hj * self.w2[j * CLASSES + k];
            }
            *pk = s;
        }
        let m = p.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = p.iter().map(|v| (v - m).exp()).sum();
        for v in p.iter_mut() {
            *v = (*v - m).exp() / z;
        }
    }

    /// One epoch of minibatch SGD over `data` in a shuffled order; returns the mean loss.
    pub fn train_epoch(&mut self, data: &Dataset, lr: f64, batch: usize, rng: &mut Rng) -> f64 {
        let mut order: Vec<usize> = (0..data.len()).collect();
        rng.shuffle(&mut order);
        let (h_n, mut h, mut p) = (self.hidden, vec![0.0; self.hidden], [0.0; CLASSES]);
        let mut total = 0.0;
        for chunk in order.chunks(batch.max(1)) {
            let (mut gw1, mut gb1) = (vec![0.0; self.w1.len()], vec![0.0; h_n]);
            let (mut gw2, mut gb2) = (vec![0.0; self.w2.len()], [0.0; CLASSES]);
            for &n in chunk {
                let x = &data.x[n * FEATURES..(n + 1) * FEATURES];
                self.forward(x, &mut h, &mut p);
                total += -(p[data.y[n]].max(1e-12)).ln();
                let mut d2 = p;
                d2[data.y[n]] -= 1.0;
                for k in 0..CLASSES {
                    gb2[k] += d2[k];
                    for j in 0..h_n {
                        gw2[j * CLASSES + k] += h[j] * d2[k];
                    }
                }
                for j in 0..h_n {
                    if h[j] <= 0.0 {
                        continue;
                    }
                    let d1: f64 = (0..CLASSES).map(|k| d2[k] * self.w2[j * CLASSES + k]).sum();
                    gb1[j] += d1;
                    for (i, xi) in x.iter().enumerate() {
                        gw1[i * h_n + j] += xi * d1;
                    }
                }
            }
            let s = lr / chunk.len() as f64;
            self.w1.iter_mut().zip(&gw1).for_each(|(w, g)| *w -= s * g);
            self.b1.iter_mut().zip(&gb1).for_each(|(w, g)| *w -= s * g);
            self.w2.iter_mut().zip(&gw2).for_each(|(w, g)| *w -= s * g);
            self.b2.iter_mut().zip(&gb2).for_each(|(w, g)| *w -= s * g);
        }
        total / data.len() as f64
    }

    /// Fraction of `data` classified correctly.
    pub fn accuracy(&self, data: &Dataset) -> f64 {
        let (mut h, mut p) = (vec![0.0; self.hidden], [0.0; CLASSES]);
        let correct = (0..data.len())
            .filter(|&n| {
                self.forward(&data.x[n * FEATURES..(n + 1) * FEATURES], &mut h, &mut p);
                let best = (0..CLASSES)
                    .max_by(|&a, &b| p[a].total_cmp(&p[b]))
                    .unwrap_or(0);
                best == data.y[n]
            })
            .count();
        correct as f64 / data.len() as f64
    }
}
