//! tritonrt: run Triton-compiled GPU kernels from Rust with no Python at run time.
//!
//! Data flow (see `DESIGN.md` in the shared docs):
//! `kernels_triton/*.py` --(AOT build)--> `ptx_cache/` (manifest + content-addressed
//! PTX/cubin) --([`artifact`], verified)--> [`jit`] (cubin for this GPU, cached on disk)
//! --([`kernel`])--> launches on a [`device`] stream.
//!
//! The first application is the PQCache decode-step indexer in [`pq`].
#![warn(missing_docs)]

pub mod artifact;
pub mod devbuf;
pub mod device;
pub mod error;
pub mod jit;
pub mod kernel;
pub mod pq;
pub mod tune;

pub use error::{Error, Result};
