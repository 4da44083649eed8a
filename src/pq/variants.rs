//! Which variant of each kernel an indexer runs: [`KernelChoice`] (the caller's overrides
//! and the tuning table to consult), the shape bucket of a decode step's kernels
//! ([`step_bucket`]), and the loader that applies the rule to every kernel an indexer
//! loads (`crate::tune::choose_variant`: an override, else the table's current winner for
//! the kernel and bucket, else the manifest default), recording each choice and its
//! origin for reports ([`crate::pq::gpu::GpuIndexer::kernel_choices`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::artifact::{ArtifactStore, Variant};
use crate::driver::device::Device;
use crate::driver::Kernel;
use crate::error::{Error, Result};
use crate::pq::config::{PqConfig, Shape};
use crate::runtime::Runtime;
use crate::tune::bucket::{bucket_for, ShapeBucket, ShapeFeatures};
use crate::tune::candidate::{Candidate, CandidateSet};
use crate::tune::choice::{choose_variant, VariantChoice, VariantOrigin};
use crate::tune::table::{DeviceKey, TuningTable};

/// Environment variable naming the tuning table file the indexer reads (as `tritonrt
/// autotune --table`); when unset or empty the default path
/// ([`crate::tune::table::default_path`]) is used.
pub const TABLE_ENV: &str = "TRITONRT_TUNING_TABLE";

/// The tuning table the runtime reads at launch: `$TRITONRT_TUNING_TABLE` when set, else
/// [`TuningTable::open_default`]. Never fails: a missing table is empty, a corrupt one
/// is ignored with one warning.
pub fn runtime_table() -> TuningTable {
    match std::env::var_os(TABLE_ENV) {
        Some(p) if !p.is_empty() => TuningTable::open(Path::new(&p)),
        _ => TuningTable::open_default(),
    }
}

/// The table key of a device: name, arch and driver version as the driver reports them.
pub fn device_key(dev: &Device) -> DeviceKey {
    DeviceKey::new(
        dev.name(),
        dev.arch(),
        u32::try_from(dev.driver_version()).unwrap_or(0),
    )
}

/// The sha256 of the artifact that is loaded for `v` on a device of compute capability
/// `cc`: the cubin when it was built for exactly this arch, else the PTX (JIT).
fn artifact_sha(v: &Variant, cc: (u32, u32)) -> String {
    match &v.cubin {
        Some(c) if v.cubin_matches(cc) => c.sha256.clone(),
        _ => v.ptx.sha256.clone(),
    }
}

/// The variants of logical kernel `kernel` that compete on a device of compute
/// capability `cc`: every variant of the arch that the manifest's default for this
/// device ([`ArtifactStore::select_for_device`]) was compiled for, usable on `cc`, with
/// that default as the default candidate; `artifact_sha256` is the sha256 of the cubin
/// or PTX that is actually loaded.
///
/// # Errors
///
/// [`Error::NoVariantForDevice`] (or the store's error for an unknown kernel),
/// [`Error::TuneCandidates`].
pub fn device_candidates(
    store: &ArtifactStore,
    kernel: &str,
    cc: (u32, u32),
) -> Result<CandidateSet> {
    let default = store.select_for_device(kernel, cc)?;
    let candidates: Vec<Candidate> = store
        .variants(kernel)
        .into_iter()
        .filter(|v| v.arch == default.arch && v.usable_on(cc))
        .map(|v| {
            Candidate::new(
                v.id.clone(),
                v.kernel.clone(),
                v.source_hash.clone(),
                artifact_sha(v, cc),
                v.id == default.id,
            )
        })
        .collect();
    CandidateSet::new(kernel, candidates)
}

/// An override of logical kernel `kernel` by variant `id`: any of its variants usable on a
/// GPU of compute capability `cc` (an older arch's PTX included, which the driver
/// compiles for this GPU), not only the tuner's candidates.
///
/// Errors: [`Error::Invalid`] where `id` is no such variant, naming those there are.
pub fn override_choice(
    store: &ArtifactStore,
    kernel: &str,
    id: &str,
    cc: (u32, u32),
) -> Result<VariantChoice> {
    let usable: Vec<String> = store
        .variants(kernel)
        .into_iter()
        .filter(|v| v.usable_on(cc))
        .map(|v| v.id.clone())
        .collect();
    if !usable.iter().any(|u| u == id) {
        return Err(Error::invalid(
            "variant override",
            format!(
                "{id} is not a variant of {kernel} usable on this GPU; its variants: {}",
                usable.join(", ")
            ),
        ));
    }
    Ok(VariantChoice {
        kernel: kernel.to_string(),
        variant: id.to_string(),
        origin: VariantOrigin::Override,
    })
}

/// The shape bucket of logical kernel `kernel` in a decode step of `cfg` at `shape`
/// (`shape.s` the indexer's capacity `S_alloc`) on a GPU of compute capability `arch`
/// (`major * 10 + minor`): dtypes `[query, key, weight]` (keys share the query's dtype),
/// rows `B*H`, `n = S - init_offset` keys per row rounded up to a power of two,
/// alignment 1 (a decode loop sees every `n`), `d_s`, `K = 2^bits`, `heavy_size`
/// resolved at `S` rounded up to a power of two, and `M`. Every kernel of the step is
/// keyed by the same features, the ones that change which variant is valid or fastest
/// for any of them; tuning and lookup call this one function, so the two agree.
///
/// # Errors
///
/// As [`bucket_for`] (a kernel name outside `[A-Za-z0-9_.-]`, `B*H = 0`).
pub fn step_bucket(kernel: &str, cfg: &PqConfig, shape: &Shape, arch: u32) -> Result<ShapeBucket> {
    let (q, w) = (cfg.input_dtype.as_str(), cfg.weight_dtype.as_str());
    bucket_for(
        kernel,
        &[q, q, w],
        arch,
        &ShapeFeatures::decode(
            (shape.b * shape.h) as u64,
            cfg.n_quantized(shape.s) as u64,
            cfg.d_sub(shape.d) as u32,
            cfg.k_centroids() as u32,
            u32::try_from(cfg.heavy_at(shape.s)).unwrap_or(u32::MAX),
        )
        .with_subvectors(u32::try_from(cfg.m()).unwrap_or(u32::MAX)),
    )
}

/// Which tuning table a [`KernelChoice`] consults.
#[derive(Debug, Clone, Default)]
enum TableSource {
    /// [`runtime_table`], read when an indexer is created.
    #[default]
    Runtime,
    /// None: manifest defaults (and overrides).
    Off,
    /// This table.
    Given(Arc<TuningTable>),
    /// The table at this path, read when an indexer is created (missing: empty; corrupt:
    /// ignored with one warning).
    File(PathBuf),
}

/// The caller's say over which variant of each kernel an indexer runs: per logical kernel
/// an optional override (a variant id), and the tuning table consulted for the others.
/// For every kernel the indexer loads, the variant is the override, else the table's
/// current winner for the kernel and the indexer's shape bucket ([`step_bucket`]), else
/// the manifest default for the GPU. The indexer records each choice and its origin
/// (`GpuIndexer::kernel_choices`).
///
/// `KernelChoice::default()` consults [`runtime_table`] (`$TRITONRT_TUNING_TABLE`, else
/// the user cache's `tuning.json`) and overrides nothing.
///
/// Where a step can take either of two builds for one job (`pq_quant.k_<qt>`, any key
/// layout, and `pq_quant.a16.k_<qt>`, vector loads), an override of the any-layout build
/// alone makes it serve every key layout, so the variant asked for is the one that runs.
#[derive(Debug, Clone, Default)]
pub struct KernelChoice {
    overrides: BTreeMap<String, String>,
    table: TableSource,
}

impl KernelChoice {
    /// Overrides nothing; consults [`runtime_table`] (as `default()`).
    pub fn new() -> Self {
        Self::default()
    }

    /// Overrides nothing and consults no table: every kernel runs its manifest default.
    pub fn manifest_defaults() -> Self {
        KernelChoice {
            table: TableSource::Off,
            ..Self::default()
        }
    }

    /// Consult `table` instead of the runtime's.
    pub fn with_table(self, table: Arc<TuningTable>) -> Self {
        KernelChoice {
            table: TableSource::Given(table),
            ..self
        }
    }

    /// Consult the table file at `path` (read when an indexer is created, so an indexer
    /// made later sees entries saved meanwhile) instead of the runtime's.
    pub fn with_table_file(self, path: impl Into<PathBuf>) -> Self {
        KernelChoice {
            table: TableSource::File(path.into()),
            ..self
        }
    }

    /// Run variant `id` of logical kernel `kernel` (replacing an earlier override of it).
    /// Checked when an indexer loads its kernels: `id` must be a variant of `kernel`
    /// usable on the GPU, and `kernel` one the indexer loads.
    pub fn with_variant(mut self, kernel: impl Into<String>, id: impl Into<String>) -> Self {
        self.overrides.insert(kernel.into(), id.into());
        self
    }

    /// [`KernelChoice::with_variant`] with the kernel read from the manifest's entry of
    /// variant `id`.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVariant`] when `store` has no variant `id`.
    pub fn with_variant_id(self, store: &ArtifactStore, id: &str) -> Result<Self> {
        let kernel = store.variant(id)?.kernel.clone();
        Ok(self.with_variant(kernel, id))
    }

    /// The overrides: logical kernel name -> variant id.
    pub fn overrides(&self) -> &BTreeMap<String, String> {
        &self.overrides
    }

    /// The override of `kernel`, if any.
    pub fn variant_for(&self, kernel: &str) -> Option<&str> {
        self.overrides.get(kernel).map(String::as_str)
    }

    /// The table this choice consults, read now (empty when none).
    fn open_table(&self) -> Arc<TuningTable> {
        match &self.table {
            TableSource::Runtime => Arc::new(runtime_table()),
            TableSource::Off => Arc::new(TuningTable::new()),
            TableSource::Given(t) => t.clone(),
            TableSource::File(p) => Arc::new(TuningTable::open(p)),
        }
    }
}

/// Loads an indexer's kernels under a [`KernelChoice`], recording every choice.
pub(crate) struct Loader<'a> {
    rt: &'a Runtime,
    choice: &'a KernelChoice,
    table: Arc<TuningTable>,
    device: DeviceKey,
    cfg: PqConfig,
    shape: Shape,
    chosen: Vec<VariantChoice>,
}

impl<'a> Loader<'a> {
    /// A loader for an indexer of `cfg` at `shape` (`shape.s` its capacity), reading the
    /// choice's table once.
    pub fn new(rt: &'a Runtime, choice: &'a KernelChoice, cfg: &PqConfig, shape: &Shape) -> Self {
        Loader {
            rt,
            choice,
            table: choice.open_table(),
            device: device_key(rt.device()),
            cfg: *cfg,
            shape: *shape,
            chosen: Vec::new(),
        }
    }

    /// The override of `kernel`, if any.
    pub fn overridden(&self, kernel: &str) -> bool {
        self.choice.variant_for(kernel).is_some()
    }

    /// Logical kernel `name` at its chosen variant (override, table, default).
    ///
    /// Errors: no variant of `name` for this GPU (the store's error), an override that is
    /// not one of its variants here, load errors.
    pub fn load(&mut self, name: &str) -> Result<Arc<Kernel>> {
        let dev = self.rt.device();
        let c = match self.choice.variant_for(name) {
            // any variant this GPU runs, an older arch's PTX too (the tuner's candidates
            // are only the default's arch)
            Some(id) => override_choice(self.rt.store(), name, id, dev.cc())?,
            None => {
                let set = device_candidates(self.rt.store(), name, dev.cc())?;
                let bucket = step_bucket(name, &self.cfg, &self.shape, dev.arch())?;
                choose_variant(&set, None, &self.table, &self.device, &bucket)?
            }
        };
        let k = self.rt.kernel_for(name, Some(&c.variant))?;
        if !self.chosen.iter().any(|x| x.kernel == c.kernel) {
            self.chosen.push(c);
        }
        Ok(k)
    }

    /// [`Loader::load`] for a kernel an older kernel cache may lack: `None` where the
    /// manifest has no variant of `name` (an override of it is then reported as unused
    /// by [`Loader::finish`]).
    ///
    /// Errors: as [`Loader::load`] for a kernel the manifest has.
    pub fn load_optional(&mut self, name: &str) -> Result<Option<Arc<Kernel>>> {
        if self.rt.store().variants(name).is_empty() {
            return Ok(None);
        }
        self.load(name).map(Some)
    }

    /// The choices made, in load order; refuses overrides of kernels that were not
    /// loaded (the caller asked for something that will never run).
    ///
    /// Errors: [`Error::Invalid`] naming each such override and the kernels loaded.
    pub fn finish(self) -> Result<Vec<VariantChoice>> {
        let loaded: BTreeSet<&str> = self.chosen.iter().map(|c| c.kernel.as_str()).collect();
        let unused: Vec<String> = self
            .choice
            .overrides()
            .iter()
            .filter(|(k, _)| !loaded.contains(k.as_str()))
            .map(|(k, v)| format!("{v} (kernel {k})"))
            .collect();
        if !unused.is_empty() {
            return Err(Error::invalid(
                "variant override",
                format!(
                    "{}: no such kernel is loaded for this config ({}); the kernels loaded \
                     are {}",
                    unused.join(", "),
                    self.cfg,
                    loaded.into_iter().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        Ok(self.chosen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pq::matrix::practical_config;

    #[test]
    fn step_bucket_keys_m_bits_dtypes_and_heavy() {
        let cfg = practical_config(2, 8, 3020);
        let shape = crate::pq::matrix::PRACTICAL_SHAPE;
        let b = step_bucket("pq_emit.m2.w_bf16", &cfg, &shape, 90).unwrap();
        assert_eq!(
            b.to_string(),
            "b1:pq_emit.m2.w_bf16:bf16+bf16+bf16:sm90:rows<=32:n<=32768:align1:ds64:K256:\
             heavy<=4096:M2"
        );
        let b4 = step_bucket(
            "pq_emit.m2.w_bf16",
            &practical_config(4, 8, 3020),
            &shape,
            90,
        )
        .unwrap();
        assert_ne!(b, b4);
        assert_eq!(b4.subvectors, 4);
        let b6 = step_bucket(
            "pq_emit.m2.w_bf16",
            &practical_config(2, 6, 3020),
            &shape,
            90,
        )
        .unwrap();
        assert_eq!(b6.centroids, 64);
        assert_eq!(b.to_string().parse::<ShapeBucket>().unwrap(), b);
    }
}
