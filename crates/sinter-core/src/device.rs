//! Where a tensor's storage lives.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Device {
    #[default]
    Cpu,
    /// A CUDA device by ordinal (the backend in `crate::cuda`, over sinter-cuda). Asking for it
    /// where CUDA cannot be used is an `Error::DeviceUnavailable` that says why.
    Cuda(usize),
}

impl Device {
    /// Parses `cpu`, `cuda` (ordinal 0) or `cuda:N`.
    pub fn parse(s: &str) -> Option<Device> {
        match s {
            "cpu" => Some(Device::Cpu),
            "cuda" => Some(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda),
        }
    }
    pub fn is_cpu(self) -> bool {
        matches!(self, Device::Cpu)
    }
    pub fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}
