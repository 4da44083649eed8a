//! Everything that talks to the CUDA driver, and every `unsafe` block of the crate (each
//! with a `// SAFETY:` comment naming its invariant): the device and its context (our own
//! or an engine's), module loading, kernel launches (checked typed arguments; a raw
//! `unsafe` escape hatch), CUDA graph kernel nodes, and device buffers.
//!
//! The layers above ([`crate::runtime`], [`crate::tune`], [`crate::pq`]) use only the
//! safe API here; device memory crosses it as [`DeviceBuf`] (address, bytes, dtype, made
//! from a live allocation), never as a bare `u64`.

pub mod buffer;
pub mod device;
pub mod gate;
pub mod graph;
pub mod kernel;
pub(crate) mod tma;

pub use buffer::{AllocError, DevBuf, DeviceBuf, DeviceDtype};
pub use device::{
    driver_err, driver_error_strings, probe_driver, Device, DeviceSummary, Module, DRIVER_LIB,
};
pub use gate::{capture_scope, CaptureScope};
pub use graph::KernelGraph;
pub use kernel::{BuiltCubin, CacheOutcome, Kernel, LoadInfo};
