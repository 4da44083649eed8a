//! [`GpuIndexer`]: the PQCache decode-step indexer on one GPU stream. Each step is
//! planned ([`plan_step`]), its buffers sized ([`DeviceState::ensure_buffers`]), and the
//! plan turned into launches ([`StepLaunches`]) that are issued or captured as a graph.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::driver::{DeviceBuf, Kernel};
use crate::error::{Error, Result};
use crate::pq::config::{DType, Metric, PqConfig, Shape};
use crate::pq::graph::{GraphKey, StepGraph};
use crate::pq::kernels::Kernels;
use crate::pq::launch::{issue, ArgOrder, DeviceTensorRef, StepLaunches};
use crate::pq::memory::StateBytes;
use crate::pq::plan::{plan_step, takes_index, PlanFacts, SelectPath, StepInfo, StepPlan};
use crate::pq::ragged_gpu::RaggedState;
use crate::pq::reference::PqOutput;
use crate::pq::state::{DeviceState, StepOutputs};
use crate::pq::variants::KernelChoice;
use crate::runtime::Runtime;
use crate::tune::choice::VariantChoice;

/// How a step is issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchMode {
    /// Plain kernel launches on the stream.
    Launch,
    /// Capture the step into a CUDA graph (once per step key) and replay it.
    Graph,
}

/// The PQCache decode-step indexer on one GPU stream.
///
/// Not `Sync`: one indexer serves one decode loop. Create one per stream.
pub struct GpuIndexer {
    pub(crate) rt: Arc<Runtime>,
    pub(crate) kernels: Kernels,
    /// What [`plan_step`] needs of the GPU and the kernels (fixed at creation).
    pub(crate) facts: PlanFacts,
    pub(crate) state: DeviceState,
    path: SelectPath,
    last: Option<StepInfo>,
    pub(crate) arg_order: ArgOrder,
    graph: StepGraph,
    /// Device addresses of the last step's query, key and caller outputs, already checked
    /// to lie on this indexer's device (a step checks only addresses that changed).
    placed: [u64; 5],
    /// Ragged steps' state (`crate::pq::ragged_gpu`): each row's `N_cached` on the
    /// device, their buffers and their captured graph.
    pub(crate) ragged: RaggedState,
}

impl GpuIndexer {
    /// Set up an indexer for `shape` and `cfg`, uploading `centroids` (`f32 [B, H_kv,
    /// M, K, d_c]`) and `phi` (`f32 [B * H_kv * M]`, metric ip only) from the host.
    /// `choice` says which variant of each kernel runs: the caller's overrides, else the
    /// tuning table's current winner for the kernel and this indexer's shape bucket, else
    /// the manifest default for the GPU ([`KernelChoice`]; each choice and its origin:
    /// [`GpuIndexer::kernel_choices`]).
    ///
    /// Each step brings its own `S`; `shape.s` is the capacity `S_alloc`, the largest
    /// `S` the caller expects. It matters only for a ratio `heavy_size` (spec "Sizes
    /// given as ratios"): the chunked select kernel, loaded once, is the one for the
    /// heavy size resolved at `S_alloc`, so it serves every step up to there. A later
    /// step with a larger resolved heavy size runs on the histogram family, or is refused
    /// with an error naming `heavy_size` where it needs the chunked path.
    ///
    /// Errors: config/shape validation, a missing kernel variant, an override that is no
    /// variant of its kernel on this GPU or names a kernel this config does not load, a
    /// centroid or phi length mismatch, a `stream` of another device than `rt`'s
    /// ([`Error::DeviceMismatch`], naming both ordinals), driver errors.
    pub fn new(
        rt: Arc<Runtime>,
        stream: Arc<CudaStream>,
        cfg: PqConfig,
        shape: Shape,
        centroids: &[f32],
        phi: Option<&[f32]>,
        choice: &KernelChoice,
    ) -> Result<Self> {
        check_codebook(&cfg, &shape, centroids.len(), phi.map(|p| p.len()))?;
        let drv = |what: &'static str| move |e| crate::driver::device::driver_err(what, e);
        let cent = stream
            .clone_htod(centroids)
            .map_err(drv("uploading centroids"))?;
        let phi = stream
            .clone_htod(phi.unwrap_or(&[0.0]))
            .map_err(drv("uploading phi"))?;
        Self::with_state(rt, stream, cfg, shape, cent, phi, choice)
    }

    /// [`GpuIndexer::new`] with the codebook already on the device (an engine's buffers,
    /// or a prefill's output): `centroids` `f32 [B, H_kv, M, K, d_c]` and `phi`
    /// `f32 [B * H_kv * M]` (metric ip only) are copied device to device on `stream`, in
    /// stream order after the work queued there (no host round trip; the caller may reuse
    /// its buffers once that copy has run).
    ///
    /// Errors: as [`GpuIndexer::new`].
    pub fn new_on_device<C: DevicePtr<f32>, P: DevicePtr<f32>>(
        rt: Arc<Runtime>,
        stream: Arc<CudaStream>,
        cfg: PqConfig,
        shape: Shape,
        centroids: &C,
        phi: Option<&P>,
        choice: &KernelChoice,
    ) -> Result<Self> {
        check_codebook(&cfg, &shape, centroids.len(), phi.map(|p| p.len()))?;
        let drv = |what: &'static str| move |e| crate::driver::device::driver_err(what, e);
        let mut cent = stream
            .alloc_zeros::<f32>(centroids.len())
            .map_err(drv("allocating centroids"))?;
        stream
            .memcpy_dtod(centroids, &mut cent)
            .map_err(drv("copying centroids"))?;
        let mut phi_d = stream
            .alloc_zeros::<f32>(phi.map_or(1, |p| p.len().max(1)))
            .map_err(drv("allocating phi"))?;
        if let Some(p) = phi {
            stream
                .memcpy_dtod(p, &mut phi_d)
                .map_err(drv("copying phi"))?;
        }
        Self::with_state(rt, stream, cfg, shape, cent, phi_d, choice)
    }

    /// An indexer that takes over a prefill's results on the device, with no copy: its
    /// centroids, phi and `u8` codes become the indexer's state (`N_cached = n`), on the
    /// prefill's stream. `cfg` must agree with the prefill's config on `M`, `bits`,
    /// metric, `init_offset` and input dtype, and `shape` with its `B`, `H_kv`, `D`
    /// (`shape.s` is the capacity, as in [`GpuIndexer::new`]).
    ///
    /// Errors: a config or shape that disagrees with the prefill's (named), the others of
    /// [`GpuIndexer::new`].
    pub fn from_prefill(
        rt: Arc<Runtime>,
        cfg: PqConfig,
        shape: Shape,
        prefill: crate::pq::prefill::PrefillResult,
        choice: &KernelChoice,
    ) -> Result<Self> {
        let (pc, ps) = (*prefill.config(), *prefill.shape());
        let mismatch = [
            ("pq_group_factor", cfg.pq_group_factor, pc.pq_group_factor),
            ("pq_bits", cfg.pq_bits as usize, pc.pq_bits as usize),
            ("init_offset", cfg.init_offset, pc.init_offset),
            ("batch", shape.b, ps.b),
            ("kv_heads", shape.h_kv, ps.h_kv),
            ("head_dim", shape.d, ps.d),
        ]
        .into_iter()
        .find(|(_, a, b)| a != b);
        if let Some((what, a, b)) = mismatch {
            return Err(Error::invalid(
                what,
                format!("the indexer's {what} is {a} but the prefill ran with {b}"),
            ));
        }
        if cfg.metric != pc.metric || cfg.input_dtype != pc.input_dtype {
            return Err(Error::invalid(
                "config",
                format!(
                    "the indexer's metric/dtype {}/{} differ from the prefill's {}/{}",
                    cfg.metric, cfg.input_dtype, pc.metric, pc.input_dtype
                ),
            ));
        }
        let n = prefill.n();
        let stream = prefill.stream.clone();
        let phi_len = prefill.phi.len();
        check_codebook(&cfg, &shape, prefill.centroids.len(), Some(phi_len))?;
        let mut me = Self::with_state(
            rt,
            stream,
            cfg,
            shape,
            prefill.centroids,
            prefill.phi,
            choice,
        )?;
        me.state.adopt_codes(prefill.codes, prefill.cap, n);
        Ok(me)
    }

    fn with_state(
        rt: Arc<Runtime>,
        stream: Arc<CudaStream>,
        cfg: PqConfig,
        shape: Shape,
        centroids: CudaSlice<f32>,
        phi: CudaSlice<f32>,
        choice: &KernelChoice,
    ) -> Result<Self> {
        let dev = rt.device();
        dev.check_stream(
            &stream,
            "the indexer's stream",
            &format!("the indexer's runtime (device {})", dev.ordinal()),
        )?;
        // shape.s: the capacity, where a ratio heavy_size is largest
        let kernels = Kernels::load(&rt, &cfg, &shape, choice)?;
        let facts = kernels.facts(rt.device().sm_count());
        let state = DeviceState::new(stream, cfg, shape, &kernels, centroids, phi)?;
        Ok(GpuIndexer {
            rt,
            kernels,
            facts,
            state,
            path: SelectPath::default(),
            last: None,
            arg_order: ArgOrder::default(),
            graph: StepGraph::default(),
            placed: [0; 5],
            ragged: RaggedState::new(&cfg, shape.s),
        })
    }

    /// The stream every step is issued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.state.stream
    }

    /// The runtime the kernels came from.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.rt
    }

    /// The shape this indexer was made for (`s` as given at creation, the capacity that
    /// chose the select kernel; each step brings its own).
    pub fn shape(&self) -> Shape {
        self.state.shape
    }

    /// The config.
    pub fn config(&self) -> &PqConfig {
        &self.state.cfg
    }

    /// Keys quantized so far (`N_cached`).
    pub fn n_cached(&self) -> usize {
        self.state.n_cached
    }

    /// Code capacity per (batch, KV head, subvector), in keys.
    pub fn capacity(&self) -> usize {
        self.state.cap
    }

    /// Choose the select kernel of later steps (default [`SelectPath::Auto`]).
    pub fn set_select_path(&mut self, path: SelectPath) {
        self.path = path;
    }

    /// Let [`SelectPath::Auto`] take the indexed path only while its buckets (`i32 [B*H,
    /// 4096, capc]`, [`crate::pq::plan::index_bucket_bytes`]) take at most `bytes`
    /// (default [`crate::pq::plan::INDEX_BUCKET_BUDGET_BYTES`], 256 MiB); above, Auto
    /// takes `pq_hist` or split. No effect where `pq_index` is not built, nor on the
    /// forced index paths.
    pub fn set_index_bucket_budget(&mut self, bytes: usize) {
        if let Some(ix) = &mut self.facts.index {
            ix.bucket_budget = bytes;
        }
        // a captured step of the same key may have been planned under the old budget
        self.graph.clear();
    }

    /// Quantize a step's new keys with `pq_quant` before the select kernel when there are
    /// more than `n` of them (default [`crate::pq::plan::BULK_QUANTIZE_MIN`]); steps
    /// with a new key among the histogram path's candidates take `pq_quant` whatever
    /// `n`. For measurements (`tritonrt run --bulk-min`) and tests: every value gives
    /// the same outputs.
    pub fn set_bulk_quantize_min(&mut self, n: usize) {
        self.facts.bulk_min = n;
    }

    /// Variant id of the chunked select kernel in use ("none" where `heavy_size`, resolved
    /// at the capacity `shape().s`, exceeds its compiled top-k widths: the histogram
    /// family then serves every step).
    pub fn select_variant(&self) -> &str {
        self.kernels
            .select
            .as_ref()
            .map_or("none", |sk| sk.kernel.id())
    }

    /// Every kernel variant this indexer launches (for reports).
    pub fn kernels(&self) -> Vec<Arc<Kernel>> {
        self.kernels.all()
    }

    /// Every kernel this indexer loaded: its logical name, the variant that runs and
    /// where that came from (override, tuning table, manifest default), in load order.
    pub fn kernel_choices(&self) -> &[VariantChoice] {
        &self.kernels.choices
    }

    /// The kernels a step of `plan` launches (a plan of this indexer: [`GpuIndexer::plan`])
    /// with keys laid out as `key` (which `pq_quant` build runs depends on it), in launch
    /// order, each once, with its variant and origin. For reports; not part of a step.
    pub fn step_kernels(&self, plan: &StepPlan, key: &DeviceTensorRef) -> Vec<VariantChoice> {
        let d_s = self.state.cfg.d_sub(self.state.shape.d);
        self.kernels
            .launched(plan, key.buf().addr(), key.strides(), d_s)
            .into_iter()
            .filter_map(|k| self.kernels.choice_of(k.id()).cloned())
            .collect()
    }

    /// What [`plan_step`] knows of this indexer's GPU and kernels.
    pub fn plan_facts(&self) -> PlanFacts {
        self.facts
    }

    /// The plan of a step at `s` from the current state under the current
    /// [`SelectPath`] (nothing is issued).
    ///
    /// Errors: as [`plan_step`].
    pub fn plan(&self, s: usize) -> Result<StepPlan> {
        let st = &self.state;
        plan_step(&st.cfg, &st.shape, s, st.n_cached, self.path, &self.facts)
    }

    /// Replace the code state with upstream-layout codes `i64 [B, n, H_kv, M]` (values
    /// in `0..K`). Synchronous (a one-time import, not part of a step).
    ///
    /// Errors: a length mismatch or a code out of range, named with its index.
    pub fn import_codes(&mut self, codes: &[i64], n: usize) -> Result<()> {
        let (cfg, shape) = (&self.state.cfg, &self.state.shape);
        let (b, h_kv, m, k) = (shape.b, shape.h_kv, cfg.m(), cfg.k_centroids());
        if codes.len() != b * n * h_kv * m {
            return Err(Error::invalid(
                "pq_codebook",
                format!(
                    "expected {} i64 values [B={b}, N={n}, H_kv={h_kv}, M={m}], got {}",
                    b * n * h_kv * m,
                    codes.len()
                ),
            ));
        }
        if let Some((i, c)) = codes
            .iter()
            .enumerate()
            .find(|(_, &c)| c < 0 || c as usize >= k)
        {
            return Err(Error::invalid(
                "pq_codebook",
                format!("code {c} at flat index {i} is outside 0..{k}"),
            ));
        }
        self.graph.clear();
        self.ragged.forget();
        let src = self
            .state
            .stream
            .clone_htod(codes)
            .map_err(|e| crate::driver::device::driver_err("uploading codes", e))?;
        let buf = DeviceBuf::of(&src, &self.state.stream);
        self.state
            .import_codes(&self.kernels, &self.arg_order, buf, n)
    }

    /// [`GpuIndexer::import_codes`] from the device: `codes` is the caller's `i64 [B, n,
    /// H_kv, M]` (upstream layout: an engine's buffer, or a prefill's output), turned
    /// into the indexer's layout by a kernel on the indexer's stream, with no host copy
    /// of the codes. Synchronous (it reads back one count: codes outside `0..K` are
    /// counted on the device and refused).
    ///
    /// Errors: a length mismatch; codes outside `0..K` (how many); driver errors.
    pub fn import_codes_on_device<C: DevicePtr<i64>>(&mut self, codes: &C, n: usize) -> Result<()> {
        let (cfg, shape) = (&self.state.cfg, &self.state.shape);
        let want = shape.b * n * shape.h_kv * cfg.m();
        if codes.len() != want {
            return Err(Error::invalid(
                "pq_codebook",
                format!(
                    "expected {want} i64 values [B={}, N={n}, H_kv={}, M={}], got {}",
                    shape.b,
                    shape.h_kv,
                    cfg.m(),
                    codes.len()
                ),
            ));
        }
        self.graph.clear();
        self.ragged.forget();
        let buf = DeviceBuf::of(codes, &self.state.stream);
        self.state
            .import_codes(&self.kernels, &self.arg_order, buf, n)
    }

    /// The code state in the upstream layout `i64 [B, N_cached, H_kv, M]`. Synchronous.
    ///
    /// Errors: driver errors.
    pub fn export_codes(&self) -> Result<Vec<i64>> {
        self.state.export_codes(&self.kernels, &self.arg_order)
    }

    /// One decode step at sequence length `s`: quantize keys `N_cached .. s -
    /// init_offset`, select, and write the outputs into the indexer's device buffers
    /// (see [`GpuIndexer::download`]). Asynchronous: nothing waits for the GPU.
    ///
    /// Errors: dtype mismatch, `s - init_offset < N_cached` (the state is ahead of the
    /// sequence), a query or key buffer of another device ([`Error::DeviceMismatch`],
    /// naming both ordinals), driver/launch errors. Allocation happens only when a buffer
    /// must grow.
    pub fn step(
        &mut self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        s: usize,
        mode: LaunchMode,
    ) -> Result<StepInfo> {
        if self.ragged.active {
            return Err(Error::invalid(
                "step",
                "this indexer runs ragged steps (each row keeps its own N_cached): continue \
                 with step_ragged, or import codes (import_codes) to take fixed-S steps again",
            ));
        }
        check_tensor(&self.state.cfg, "query", query)?;
        check_tensor(&self.state.cfg, "key", key)?;
        let sh = self.state.shape;
        query.check_extent("query", [sh.b, sh.h, 1, sh.d])?;
        key.check_extent("key", [sh.b, sh.h_kv, s, sh.d])?;
        self.check_placement(query, key)?;
        let plan = self.plan(s)?;
        // the step's sizes, resolved at s (a captured graph holds them as arguments)
        let c = &self.state.cfg;
        let sizes = [c.sink_at(s), c.window_at(s), c.heavy_at(s)];
        self.state
            .ensure_buffers(&self.kernels, &self.arg_order, plan.kind.is_index(), s)?;
        let n_old = plan.n_old;
        let launcher = StepLaunches {
            kernels: &self.kernels,
            state: &self.state,
            order: &self.arg_order,
            sm_count: self.facts.sm_count,
        };
        let info = match mode {
            LaunchMode::Launch => {
                let launches = launcher.build(&plan, query, key)?;
                issue(&self.state.stream, &launches)?;
                plan.info()
            }
            LaunchMode::Graph => {
                let gkey = GraphKey {
                    s,
                    sizes,
                    query: *query,
                    key: *key,
                    buffers: self.state.buffer_ptrs(),
                };
                let build = || Ok((plan.info(), launcher.build(&plan, query, key)?));
                let (info, captured) = self.graph.step(&self.state.stream, gkey, n_old, build)?;
                StepInfo { captured, ..info }
            }
        };
        self.state.n_cached = plan.n;
        self.last = Some(info);
        Ok(info)
    }

    /// [`GpuIndexer::step`] writing its outputs into the caller's device buffers
    /// `outputs` (each a [`DeviceBuf`] of the caller's allocation; an engine's own
    /// tensors): `sparse_list` `i64 [B, H, total]` (`total = S` on the short path, else
    /// `sink' + k + window'`), `sparse_len` `i64 [B, H]`, `weight_list` `[B, H, S]` in the
    /// config's weight dtype. The indexer's own output buffers are not written (and
    /// [`GpuIndexer::download`] does not see this step's outputs). In graph mode the
    /// buffers are part of the captured graph: replays write them again, and other
    /// buffers update the graph in place or capture it anew.
    ///
    /// Errors: an output of the wrong dtype or too small (named, with the sizes), as
    /// [`GpuIndexer::step`] otherwise.
    pub fn step_into(
        &mut self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        s: usize,
        mode: LaunchMode,
        outputs: StepOutputs,
    ) -> Result<StepInfo> {
        let (cfg, shape) = (&self.state.cfg, &self.state.shape);
        let rows = shape.b * shape.h;
        let total = cfg.total(s);
        let wdt = cfg.weight_dtype;
        for (what, buf, dtype, elems) in [
            (
                "sparse_list",
                outputs.sparse_list,
                crate::artifact::Dtype::I64,
                rows * total,
            ),
            (
                "sparse_len",
                outputs.sparse_len,
                crate::artifact::Dtype::I64,
                rows,
            ),
            ("weight_list", outputs.weight_list, wdt.triton(), rows * s),
        ] {
            let need = elems * dtype.size_bytes();
            if buf.dtype() != dtype || buf.bytes() < need {
                return Err(Error::invalid(
                    what,
                    format!(
                        "needs {elems} {} elements ({need} bytes) for B*H = {rows}, S = {s}; got a buffer of {} bytes of {}",
                        dtype.name(),
                        buf.bytes(),
                        buf.dtype().name()
                    ),
                ));
            }
        }
        self.state.outputs = Some(outputs);
        let r = self.step(query, key, s, mode);
        self.state.outputs = None;
        r
    }

    /// Refuse a query, key or output buffer of another device than the runtime's
    /// (checked when an address changes; a decode loop on fixed buffers checks once).
    pub(crate) fn check_placement(
        &mut self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
    ) -> Result<()> {
        let outs = self.state.outputs;
        let addrs = [
            ("query buffer", query.buf().addr()),
            ("key buffer", key.buf().addr()),
            (
                "sparse_list output",
                outs.map_or(0, |o| o.sparse_list.addr()),
            ),
            ("sparse_len output", outs.map_or(0, |o| o.sparse_len.addr())),
            (
                "weight_list output",
                outs.map_or(0, |o| o.weight_list.addr()),
            ),
        ];
        let dev = self.rt.device();
        for (i, (what, addr)) in addrs.into_iter().enumerate() {
            if addr != 0 && addr != self.placed[i] {
                dev.check_addr(
                    addr,
                    &format!("the step's {what}"),
                    &format!("the indexer (device {})", dev.ordinal()),
                )?;
                self.placed[i] = addr;
            }
        }
        Ok(())
    }

    /// Wait for every step issued so far.
    ///
    /// Errors: driver errors (a kernel's fault surfaces here).
    pub fn synchronize(&self) -> Result<()> {
        self.state
            .stream
            .synchronize()
            .map_err(|e| crate::driver::device::driver_err("synchronizing the indexer stream", e))
    }

    /// Device addresses of the last step's outputs: `(sparse_list i64 [B, H, total],
    /// sparse_len i64 [B, H], weight_list [B, H, S] in the weight dtype)`. Valid until
    /// the next step on this indexer's stream.
    pub fn output_ptrs(&self) -> (u64, u64, u64) {
        self.state.output_ptrs()
    }

    /// Copy the last step's outputs and the code state to the host (synchronous).
    ///
    /// Errors: no step has run yet; driver errors.
    pub fn download(&self) -> Result<PqOutput> {
        let info = self
            .last
            .ok_or_else(|| Error::invalid("download", "no step has run on this indexer"))?;
        let (cfg, shape) = (&self.state.cfg, &self.state.shape);
        let (sl, len, wraw) = self.state.download_outputs(info.total, info.s)?;
        let weight_list: Vec<f32> = match cfg.weight_dtype {
            DType::F32 => wraw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::BF16 => wraw
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::F16 => wraw
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        };
        let codes = self.export_codes()?;
        Ok(PqOutput {
            b: shape.b,
            h: shape.h,
            h_kv: shape.h_kv,
            m: cfg.m(),
            s: info.s,
            total: info.total,
            sparse_list: sl,
            sparse_len: len,
            weight_list,
            codes,
            n_cached: self.state.n_cached,
        })
    }

    /// Poison every output buffer (sparse_list and sparse_len with -7, weight_list with
    /// the byte 0x7f, a NaN-like pattern in every float dtype) so a test can tell written
    /// from unwritten. Synchronous.
    ///
    /// Errors: driver errors.
    pub fn poison_outputs(&mut self) -> Result<()> {
        self.state.poison_outputs()?;
        // the ragged split path's weights extents no longer hold
        self.ragged_weights_unknown()?;
        self.synchronize()
    }

    /// Forget quantized keys past `n` (`N_cached = min(N_cached, n)`); their codes are
    /// rewritten by the next step. No copy. Used to replay the same step, as the upstream
    /// benchmark does (every call quantizes one new key).
    pub fn rewind(&mut self, n: usize) {
        self.state.n_cached = self.state.n_cached.min(n);
    }

    /// Allocate every buffer a step at `s` needs, without running it (so outputs can be
    /// poisoned before the first step, and so the first timed step allocates nothing).
    ///
    /// Errors: driver errors.
    pub fn prepare(&mut self, s: usize) -> Result<()> {
        let st = &self.state;
        let index = takes_index(&st.cfg, &st.shape, s, self.path, &self.facts);
        self.state
            .ensure_buffers(&self.kernels, &self.arg_order, index, s)
    }

    /// Every device byte this indexer allocated: codebook, codes, scratch, histograms,
    /// the indexed path's buckets where a step took that path, and its own output
    /// buffers (`sparse_list`, `sparse_len`, `weight_list`; the caller's buffers of
    /// [`GpuIndexer::step_into`] are not counted). By group: [`GpuIndexer::memory`];
    /// predicted on the CPU by [`crate::pq::memory::state_bytes_for`].
    pub fn state_bytes(&self) -> usize {
        self.memory().total()
    }

    /// [`GpuIndexer::state_bytes`] by group of buffers (bytes; `state()` leaves the
    /// outputs out).
    pub fn memory(&self) -> StateBytes {
        let mut b = self.state.bytes();
        b.select += self.ragged.bytes();
        b
    }
}

/// Check a caller's device tensor against the config's input dtype.
/// Check the codebook's lengths: centroids `f32 [B, H_kv, M, K, d_c]`, and phi
/// `f32 [B * H_kv * M]` for metric ip (ignored otherwise), besides config and shape.
fn check_codebook(
    cfg: &PqConfig,
    shape: &Shape,
    centroids: usize,
    phi: Option<usize>,
) -> Result<()> {
    cfg.validate(shape)?;
    if !cfg.k_centroids().is_power_of_two() || cfg.k_centroids() > 256 {
        return Err(Error::invalid("pq_bits", "K = 2^bits must be at most 256"));
    }
    let (m, k, d_c) = (cfg.m(), cfg.k_centroids(), cfg.d_c(shape.d));
    let want = shape.b * shape.h_kv * m * k * d_c;
    if centroids != want {
        return Err(Error::invalid(
            "pq_centroids",
            format!(
                "expected {want} f32 values [B={}, H_kv={}, M={m}, K={k}, d_c={d_c}], got {centroids}",
                shape.b, shape.h_kv
            ),
        ));
    }
    let n_phi = shape.b * shape.h_kv * m;
    match (cfg.metric, phi) {
        (Metric::Ip, Some(p)) if p != n_phi => Err(Error::invalid(
            "pq_ip2l2_phi",
            format!("expected {n_phi} f32 values [B * H_kv * M], got {p}"),
        )),
        (Metric::Ip, None) => Err(Error::invalid(
            "pq_ip2l2_phi",
            "metric ip needs phi [B * H_kv * M]",
        )),
        _ => Ok(()),
    }
}

pub(crate) fn check_tensor(cfg: &PqConfig, what: &str, t: &DeviceTensorRef) -> Result<()> {
    if t.dtype() != cfg.input_dtype {
        return Err(Error::invalid(
            what,
            format!(
                "dtype {} but the config says {}",
                t.dtype().as_str(),
                cfg.input_dtype.as_str()
            ),
        ));
    }
    if t.buf().addr() == 0 {
        return Err(Error::invalid(what, "null device address"));
    }
    Ok(())
}
