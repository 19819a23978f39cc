//! Rotary position embeddings (RoFormer; Llama's layout): each head's vector is split in two
//! halves (x₁, x₂) and rotated by position-dependent angles, x·cos + rotate_half(x)·sin with
//! rotate_half(x) = (−x₂, x₁). This is the "rotate half" convention of Hugging Face's
//! checkpoints; GGUF files of llama.cpp permute Q and K for its interleaved convention, and
//! the GGUF loader undoes that, so one rotation serves both sources.

use std::sync::Mutex;

use sinter_core::{bail, DType, Device, Result, Tensor};

/// How the frequencies are stretched for contexts longer than the model was trained on.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum RopeScaling {
    #[default]
    None,
    /// Positions divided by `factor` (every frequency scaled alike).
    Linear { factor: f64 },
    /// Llama 3.1's rule: low frequencies (wavelength above original_max / low_freq_factor)
    /// divided by `factor`, high ones (below original_max / high_freq_factor) kept, and a
    /// smooth blend between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position: f64,
    },
}

/// The rotation's parameters: base θ of the frequencies θ^(−2i/d) and their scaling.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    pub theta: f64,
    pub scaling: RopeScaling,
}

impl RopeConfig {
    /// The inverse frequencies for a head of `head_dim` (one per pair), after scaling.
    pub fn inv_freq(&self, head_dim: usize) -> Vec<f64> {
        let half = head_dim / 2;
        (0..half)
            .map(|i| {
                let f = self.theta.powf(-((2 * i) as f64) / head_dim as f64);
                match self.scaling {
                    RopeScaling::None => f,
                    RopeScaling::Linear { factor } => f / factor,
                    RopeScaling::Llama3 {
                        factor,
                        low_freq_factor,
                        high_freq_factor,
                        original_max_position,
                    } => {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen > original_max_position / low_freq_factor {
                            f / factor
                        } else if wavelen < original_max_position / high_freq_factor {
                            f
                        } else {
                            let smooth = (original_max_position / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    }
                }
            })
            .collect()
    }

    /// An error unless the parameters describe a rotation.
    pub fn check(&self) -> Result<()> {
        if !(self.theta.is_finite() && self.theta > 1.0) {
            bail!(
                "rope: theta must be a finite number above 1, got {}",
                self.theta
            );
        }
        match self.scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => {
                if !(factor.is_finite() && factor > 0.0) {
                    bail!("rope scaling: linear factor must be positive, got {factor}");
                }
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position,
            } => {
                let ok = [
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position,
                ]
                .iter()
                .all(|v| v.is_finite() && *v > 0.0)
                    && high_freq_factor > low_freq_factor;
                if !ok {
                    bail!("rope scaling: llama3 needs positive factor, low_freq_factor < high_freq_factor and original_max_position_embeddings, got {:?}", self.scaling);
                }
            }
        }
        Ok(())
    }
}

/// cos and sin tables [positions, head_dim] on one device and dtype.
struct Tables {
    device: Device,
    dtype: DType,
    cos: Tensor,
    sin: Tensor,
}

/// The rotation of one attention layer, with its cos/sin tables built once per device and
/// dtype (in f64 on the host, so the angles are exact whatever the compute dtype) and grown
/// when a longer sequence arrives.
pub struct Rope {
    pub config: RopeConfig,
    head_dim: usize,
    inv_freq: Vec<f64>,
    tables: Mutex<Vec<Tables>>,
}

impl Rope {
    pub fn new(config: RopeConfig, head_dim: usize) -> Result<Self> {
        config.check()?;
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            bail!("rope: the head dimension must be even, got {head_dim}");
        }
        Ok(Rope {
            inv_freq: config.inv_freq(head_dim),
            config,
            head_dim,
            tables: Mutex::new(Vec::new()),
        })
    }

    /// cos, sin [n, head_dim] for positions 0..n (n at least `len`).
    fn tables(&self, len: usize, device: Device, dtype: DType) -> Result<(Tensor, Tensor)> {
        let mut all = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = all
            .iter()
            .find(|t| t.device == device && t.dtype == dtype && t.cos.shape()[0] >= len)
        {
            return Ok((t.cos.clone(), t.sin.clone()));
        }
        // Powers of two from 256 up: few rebuilds as generation grows the sequence.
        let n = len.next_power_of_two().max(256);
        let (d, half) = (self.head_dim, self.head_dim / 2);
        let (mut cos, mut sin) = (vec![0f32; n * d], vec![0f32; n * d]);
        for p in 0..n {
            for (i, f) in self.inv_freq.iter().enumerate() {
                let (s, c) = (p as f64 * f).sin_cos();
                for j in [i, i + half] {
                    cos[p * d + j] = c as f32;
                    sin[p * d + j] = s as f32;
                }
            }
        }
        let make = |v: Vec<f32>| -> Result<Tensor> {
            let t = Tensor::from_vec(v, &[n, d], Device::Cpu)?.to_dtype(dtype)?;
            if device == Device::Cpu {
                Ok(t)
            } else {
                t.to_device(device)
            }
        };
        let (cos, sin) = (make(cos)?, make(sin)?);
        all.retain(|t| !(t.device == device && t.dtype == dtype));
        all.push(Tables {
            device,
            dtype,
            cos: cos.clone(),
            sin: sin.clone(),
        });
        Ok((cos, sin))
    }

    /// Rotates heads `x` [b, h, t, head_dim] holding positions start..start + t (the fused
    /// kernel where it applies: f32 on the CPU, floats on CUDA; else the composite).
    pub fn apply(&self, x: &Tensor, start: usize) -> Result<Tensor> {
        self.apply_with(x, start, false)
    }

    /// [`Rope::apply`], in tensor ops when `composite`.
    pub fn apply_with(&self, x: &Tensor, start: usize, composite: bool) -> Result<Tensor> {
        let s = x.shape();
        if s.len() != 4 || s[3] != self.head_dim {
            bail!(
                "rope: expected heads [batch, heads, time, {}], got {s:?}",
                self.head_dim
            );
        }
        let t = s[2];
        let (cos, sin) = self.tables(start + t, x.device(), x.dtype())?;
        let (cos, sin) = (cos.narrow(0, start, t)?, sin.narrow(0, start, t)?);
        if !composite && super::fused::applies(x) {
            return super::fused::rope::rope(x, &cos, &sin);
        }
        Self::rotate_composite(x, &cos, &sin)
    }

    /// Rotates the first `rotated` heads of a packed projection qkv [b, t, w] (q's heads then
    /// k's, head_dim columns each) at positions start..start + t; the other columns (v) pass
    /// through. The fused kernel where it applies (f32 on the CPU, floats on CUDA), else the
    /// composite.
    pub fn apply_packed(&self, qkv: &Tensor, start: usize, rotated: usize) -> Result<Tensor> {
        self.apply_packed_with(qkv, start, rotated, false)
    }

    /// [`Rope::apply_packed`], in tensor ops when `composite`: the heads split out, rotated by
    /// [`Rope::rotate_composite`] and packed back.
    pub fn apply_packed_with(
        &self,
        qkv: &Tensor,
        start: usize,
        rotated: usize,
        composite: bool,
    ) -> Result<Tensor> {
        let (s, d) = (qkv.shape(), self.head_dim);
        if s.len() != 3 || rotated * d > s[2] {
            bail!(
                "rope: expected a packed projection [batch, time, width] holding at least {rotated} heads of {d}, got {s:?}"
            );
        }
        let (b, t, w) = (s[0], s[1], s[2]);
        let (cos, sin) = self.tables(start + t, qkv.device(), qkv.dtype())?;
        let (cos, sin) = (cos.narrow(0, start, t)?, sin.narrow(0, start, t)?);
        if !composite && super::fused::applies(qkv) {
            return super::fused::rope::rope_packed(qkv, &cos, &sin, rotated);
        }
        let heads = qkv
            .narrow(2, 0, rotated * d)?
            .reshape(&[b, t, rotated, d])?
            .transpose(1, 2)?;
        let turned = Self::rotate_composite(&heads, &cos, &sin)?
            .transpose(1, 2)?
            .reshape(&[b, t, rotated * d])?;
        if rotated * d == w {
            return Ok(turned);
        }
        Tensor::cat(&[turned, qkv.narrow(2, rotated * d, w - rotated * d)?], 2)
    }

    /// The rotation in tensor ops (the fused kernel's reference; every other dtype and
    /// device): x [b, h, t, d] by tables cos, sin [t, d].
    pub fn rotate_composite(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let half = x.shape()[3] / 2;
        let rotated = Tensor::cat(
            &[x.narrow(3, half, half)?.neg()?, x.narrow(3, 0, half)?],
            -1,
        )?;
        x.mul(cos)?.add(&rotated.mul(sin)?)
    }
}
