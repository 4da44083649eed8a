//! `tritonrt bench` (TODO).

/// Arguments of `tritonrt bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {}

/// Entry point of `tritonrt bench`; returns the process exit code.
pub fn bench(_args: BenchArgs) -> anyhow::Result<i32> {
    anyhow::bail!("tritonrt bench is not implemented yet")
}
