//! `tritonrt autotune` (TODO).

/// Arguments of `tritonrt autotune`.
#[derive(Debug, clap::Args)]
pub struct AutotuneArgs {}

/// Entry point of `tritonrt autotune`; returns the process exit code.
pub fn autotune(_args: AutotuneArgs) -> anyhow::Result<i32> {
    anyhow::bail!("tritonrt autotune is not implemented yet")
}
