//! Weight initialisers, each drawing from the caller's generator so runs are reproducible.

use sinter_core::{DType, Device, Result, Rng, Tensor};

/// fan_in and fan_out of a weight: [out, in] for Linear, [out, in/groups, kh, kw] for conv.
pub fn fans(shape: &[usize]) -> (usize, usize) {
    let receptive: usize = shape.iter().skip(2).product();
    let fan_in = shape.get(1).copied().unwrap_or(1) * receptive;
    let fan_out = shape.first().copied().unwrap_or(1) * receptive;
    (fan_in, fan_out)
}

fn var(t: Tensor) -> Result<Tensor> {
    t.to_var()
}

/// Kaiming (He) uniform for ReLU networks: U(-b, b), b = sqrt(6 / fan_in).
pub fn kaiming_uniform(shape: &[usize], rng: &mut Rng) -> Result<Tensor> {
    let b = (6.0 / fans(shape).0 as f64).sqrt();
    var(Tensor::rand_uniform(
        shape,
        -b,
        b,
        rng,
        DType::F32,
        Device::Cpu,
    )?)
}
/// Kaiming (He) normal: N(0, 2 / fan_in).
pub fn kaiming_normal(shape: &[usize], rng: &mut Rng) -> Result<Tensor> {
    let std = (2.0 / fans(shape).0 as f64).sqrt();
    var(Tensor::randn(
        shape,
        0.0,
        std,
        rng,
        DType::F32,
        Device::Cpu,
    )?)
}
/// Xavier (Glorot) uniform: U(-b, b), b = sqrt(6 / (fan_in + fan_out)).
pub fn xavier_uniform(shape: &[usize], rng: &mut Rng) -> Result<Tensor> {
    let (i, o) = fans(shape);
    let b = (6.0 / (i + o) as f64).sqrt();
    var(Tensor::rand_uniform(
        shape,
        -b,
        b,
        rng,
        DType::F32,
        Device::Cpu,
    )?)
}
/// Xavier (Glorot) normal: N(0, 2 / (fan_in + fan_out)).
pub fn xavier_normal(shape: &[usize], rng: &mut Rng) -> Result<Tensor> {
    let (i, o) = fans(shape);
    var(Tensor::randn(
        shape,
        0.0,
        (2.0 / (i + o) as f64).sqrt(),
        rng,
        DType::F32,
        Device::Cpu,
    )?)
}
/// N(0, std²), e.g. GPT-2's 0.02.
pub fn normal(shape: &[usize], std: f64, rng: &mut Rng) -> Result<Tensor> {
    var(Tensor::randn(
        shape,
        0.0,
        std,
        rng,
        DType::F32,
        Device::Cpu,
    )?)
}
/// PyTorch's default for Linear/Conv biases: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
pub fn bias_uniform(n: usize, fan_in: usize, rng: &mut Rng) -> Result<Tensor> {
    let b = 1.0 / (fan_in.max(1) as f64).sqrt();
    var(Tensor::rand_uniform(
        &[n],
        -b,
        b,
        rng,
        DType::F32,
        Device::Cpu,
    )?)
}
pub fn zeros(shape: &[usize]) -> Result<Tensor> {
    var(Tensor::zeros(shape, DType::F32, Device::Cpu)?)
}
pub fn ones(shape: &[usize]) -> Result<Tensor> {
    var(Tensor::ones(shape, DType::F32, Device::Cpu)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    fn std_of(t: &Tensor) -> f64 {
        let v = t.to_vec_f64().unwrap();
        let m = v.iter().sum::<f64>() / v.len() as f64;
        (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64).sqrt()
    }
    #[test]
    fn initialisers_have_their_variance() {
        let mut r = Rng::new(0);
        let s = [256, 128];
        assert!(
            (std_of(&kaiming_normal(&s, &mut r).unwrap()) - (2.0f64 / 128.0).sqrt()).abs() < 0.005
        );
        assert!(
            (std_of(&kaiming_uniform(&s, &mut r).unwrap()) - (2.0f64 / 128.0).sqrt()).abs() < 0.005
        );
        assert!(
            (std_of(&xavier_uniform(&s, &mut r).unwrap()) - (2.0f64 / 384.0).sqrt()).abs() < 0.005
        );
        assert!((std_of(&normal(&s, 0.02, &mut r).unwrap()) - 0.02).abs() < 0.001);
        assert_eq!(fans(&[16, 3, 5, 5]), (75, 400));
    }
}
