//! `tritonrt run` (TODO).

/// Arguments of `tritonrt run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {}

/// Entry point of `tritonrt run`; returns the process exit code.
pub fn run(_args: RunArgs) -> anyhow::Result<i32> {
    anyhow::bail!("tritonrt run is not implemented yet")
}
