//! `tritonrt warmup`, `inspect`, `verify`, `import` (TODO).

/// Arguments of `tritonrt warmup`.
#[derive(Debug, clap::Args)]
pub struct WarmupArgs {}
/// Arguments of `tritonrt inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {}
/// Arguments of `tritonrt verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {}
/// Arguments of `tritonrt import`.
#[derive(Debug, clap::Args)]
pub struct ImportArgs {}

/// `tritonrt warmup`.
pub fn warmup(_a: WarmupArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not implemented yet")
}
/// `tritonrt inspect`.
pub fn inspect(_a: InspectArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not implemented yet")
}
/// `tritonrt verify`.
pub fn verify(_a: VerifyArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not implemented yet")
}
/// `tritonrt import`.
pub fn import(_a: ImportArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not implemented yet")
}
