use sinter_core::{Device, Tensor};

#[test]
fn linear_regression_gradient_is_exact() {
    // loss = mean((x·w - y)^2); d/dw = 2/n · xᵀ(xw - y)
    let x = Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], &[3, 2], Device::Cpu).unwrap();
    let w = Tensor::from_vec(vec![0.5f32, -1.0], &[2, 1], Device::Cpu)
        .unwrap()
        .to_var()
        .unwrap();
    let y = Tensor::from_vec(vec![1f32, 0., 2.], &[3, 1], Device::Cpu).unwrap();
    let loss = x.matmul(&w).unwrap().mse_loss(&y).unwrap();
    loss.backward().unwrap();
    let g = w.grad().unwrap().to_vec_f32().unwrap();
    // residuals: [1*0.5-2-1, 3*0.5-4-0, 5*0.5-6-2] = [-2.5, -2.5, -5.5]
    let r = [-2.5f32, -2.5, -5.5];
    let gx0 = 2.0 / 3.0 * (1.0 * r[0] + 3.0 * r[1] + 5.0 * r[2]);
    let gx1 = 2.0 / 3.0 * (2.0 * r[0] + 4.0 * r[1] + 6.0 * r[2]);
    assert!(
        (g[0] - gx0).abs() < 1e-5 && (g[1] - gx1).abs() < 1e-5,
        "{g:?}"
    );
    // A second backward accumulates.
    let loss = x.matmul(&w).unwrap().mse_loss(&y).unwrap();
    loss.backward().unwrap();
    let g2 = w.grad().unwrap().to_vec_f32().unwrap();
    assert!((g2[0] - 2.0 * gx0).abs() < 1e-4);
}
