//! tritonrt: run Triton-compiled GPU kernels from Rust with no Python at run time, and the
//! PQCache indexer built on them.
//!
//! Two layers, arrows pointing down (ARCHITECTURE.md):
//! - application: [`pq`], the indexer (config, CPU reference, GPU step, tuning targets);
//! - runtime: [`runtime`] (variants by id: store -> cubin cache -> loaded kernel),
//!   [`tune`] (generic tuner and its table), [`jit`] (PTX -> cubin cache), [`artifact`]
//!   (manifest, verified store, Triton-cache import), [`abi`] (Triton 3.6 launch ABI,
//!   pure), [`bindgen`] (typed launchers generated from a manifest), [`driver`] (all
//!   driver calls: device and context, own or borrowed, modules, launches, graphs, device
//!   buffers, TMA descriptors), [`error`] (one error enum).
//!
//! Data flow: `kernels_triton/*.py` --(AOT build)--> `ptx_cache/` (manifest +
//! content-addressed PTX/cubin) --([`artifact`], verified)--> [`jit`] (cubin for this
//! GPU, cached on disk) --([`driver::Kernel`])--> launches on a stream.
//!
//! An engine embeds it with `default-features = false` (no CLI dependencies), on its own
//! context ([`driver::Device::from_context`]) and streams.
#![warn(missing_docs)]

pub mod abi;
pub mod artifact;
pub mod bindgen;
pub mod driver;
pub mod error;
pub mod jit;
pub mod pq;
pub mod runtime;
pub mod tune;

pub use error::{Error, Result};

// Generated launchers (`bindgen`) name cudarc's and half's types through these, so they
// compile against the very versions this crate uses.
pub use cudarc;
pub use half;
