//! Compiles only if tritonrt and a candle-style cudarc share one dependency graph: an
//! engine's own context is what the indexer runs on.

use std::sync::Arc;

/// The engine's context, as candle holds it, handed to tritonrt.
pub fn runtime_on_engine_context(
    ctx: Arc<cudarc::driver::CudaContext>,
) -> tritonrt::Result<Arc<tritonrt::driver::Device>> {
    tritonrt::driver::Device::from_context(ctx)
}
