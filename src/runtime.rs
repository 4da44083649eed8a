//! The variant registry: kernels by variant id, loaded once per runtime (artifact store
//! -> cubin cache -> loaded [`Kernel`]), the manifest's default or a tuned variant per
//! kernel name.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::artifact::ArtifactStore;
use crate::driver::{Device, Kernel};
use crate::error::{Error, Result};
use crate::jit::CubinCache;

/// Kernels of one device: loads each variant once per context (by id) through the
/// artifact store and the cubin cache, and hands out `Arc<Kernel>`s. `Send + Sync`;
/// share it as `Arc<Runtime>`.
pub struct Runtime {
    device: Arc<Device>,
    store: Arc<ArtifactStore>,
    cache: CubinCache,
    kernels: RwLock<HashMap<String, Arc<Kernel>>>,
    loading: Mutex<()>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("device", &self.device)
            .field("ptx_cache", &self.store.dir())
            .field("cubin_cache", &self.cache.dir())
            .finish()
    }
}

impl Runtime {
    /// A runtime for `device` over `store`, JIT-caching into `cache`.
    pub fn new(device: Arc<Device>, store: ArtifactStore, cache: CubinCache) -> Arc<Runtime> {
        Arc::new(Runtime {
            device,
            store: Arc::new(store),
            cache,
            kernels: RwLock::new(HashMap::new()),
            loading: Mutex::new(()),
        })
    }

    /// A runtime for `device` (its own context, or an engine's through
    /// [`Device::from_context`]) over the ptx_cache directory `ptx_cache` (verified
    /// manifest), JIT-caching into the user cubin cache (`$TRITONRT_CACHE_DIR`, else
    /// `~/.cache/tritonrt`).
    ///
    /// Errors: the manifest cannot be read or fails validation; the cache directory
    /// cannot be created.
    pub fn open(
        device: Arc<Device>,
        ptx_cache: impl AsRef<std::path::Path>,
    ) -> Result<Arc<Runtime>> {
        let store = ArtifactStore::open(ptx_cache)?;
        Ok(Runtime::new(device, store, CubinCache::from_env()?))
    }

    /// The device.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// The artifact store.
    pub fn store(&self) -> &ArtifactStore {
        &self.store
    }

    /// The cubin cache.
    pub fn cache(&self) -> &CubinCache {
        &self.cache
    }

    /// The kernel variant `id`, loaded on first use (cubin from the manifest, the cache
    /// or a JIT), then shared.
    ///
    /// Errors: [`Error::UnknownVariant`], [`Error::ArchMismatch`], artifact, JIT and
    /// load errors.
    pub fn kernel(&self, id: &str) -> Result<Arc<Kernel>> {
        if let Some(k) = self.kernels.read().get(id) {
            return Ok(k.clone());
        }
        // The module load below waits for graph captures on other threads; take that
        // gate before the loader lock, so a capture that needs a kernel loaded (and so
        // this lock) is never waited for by a thread holding it. It is held through a
        // JIT as well (a cold cache only): captures begun meanwhile wait for it.
        let _gate = crate::driver::gate::exclusive();
        // One loader at a time, so two threads never JIT the same variant twice.
        let _guard = self.loading.lock();
        if let Some(k) = self.kernels.read().get(id) {
            return Ok(k.clone());
        }
        let variant = self.store.variant(id)?;
        let built = self
            .cache
            .get_or_build(&self.device, &self.store, variant)?;
        let kernel = Arc::new(Kernel::load(&self.device, variant, &built)?);
        self.kernels.write().insert(id.to_string(), kernel.clone());
        Ok(kernel)
    }

    /// The manifest's best default variant of `kernel_name` for this device (see
    /// [`ArtifactStore::select_for_device`]).
    pub fn default_kernel(&self, kernel_name: &str) -> Result<Arc<Kernel>> {
        self.kernel_for(kernel_name, None)
    }

    /// The variant a tuning table chose (`tuned_variant_id`), else the default. A tuned
    /// id must name a variant of `kernel_name` usable on this device.
    ///
    /// Errors: [`Error::Invalid`] (tuned id of another kernel or another arch), plus
    /// those of [`Runtime::kernel`].
    pub fn kernel_for(
        &self,
        kernel_name: &str,
        tuned_variant_id: Option<&str>,
    ) -> Result<Arc<Kernel>> {
        let id = match tuned_variant_id {
            Some(id) => {
                let v = self.store.variant(id)?;
                if v.kernel != kernel_name || !v.usable_on(self.device.cc()) {
                    return Err(Error::invalid(
                        "tuned variant",
                        format!(
                            "{id} is a variant of {} for {}, not of {kernel_name} for sm_{}",
                            v.kernel,
                            v.ptx_target,
                            self.device.arch()
                        ),
                    ));
                }
                id.to_string()
            }
            None => self
                .store
                .select_for_device(kernel_name, self.device.cc())?
                .id
                .clone(),
        };
        self.kernel(&id)
    }

    /// Every kernel loaded so far.
    pub fn loaded(&self) -> Vec<Arc<Kernel>> {
        self.kernels.read().values().cloned().collect()
    }
}
