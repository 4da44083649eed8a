//! The prefill on the GPU: k-means per (batch, KV head, subvector) group with the
//! kernels of `kernels_triton/pq_kmeans.py`, on the caller's stream, results left on the
//! device in the layouts the decode indexer takes over ([`PrefillResult`],
//! [`crate::pq::gpu::GpuIndexer::from_prefill`]).
//!
//! Launch sequence (one stream, no host synchronization): `pq_km_pack` only where the key
//! view cannot be read as it is (see [`GpuPrefill::run`]), `pq_km_prep` (on its own
//! grid: non-finite count and every key coordinate's range, ip: `phi`), `pq_km_init` (strided or
//! host-drawn seeds; a given codebook is copied instead), then `kmeans_iter` times
//! `pq_km_assign` + `pq_km_sums` + `pq_km_update` (a group that converged skips the rest
//! through its `done` flag; where one assignment tile holds every cluster and coordinate,
//! `K <= 64` and `d_s <= 64`, the assignment writes the member sums itself and
//! `pq_km_sums` is not launched), then a final `pq_km_assign` against the final
//! centroids. Memory: the outputs, plus per-part sums `f32 [G, P, K, d_c]` with `P` parts
//! per group (`P x G` about the assignment CTAs the SMs hold at once), the coordinate
//! ranges `u32 [G, 2, d_s]` (the keys' centering point, `pq_kmeans.py`'s `_center`), plus
//! a packed copy of the keys where one is made, so `O(input + output)`.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use crate::abi::KernelArg;
use crate::driver::{DevBuf, DeviceBuf, Kernel};
use crate::error::{Error, Result};
use crate::pq::config::Metric;
use crate::pq::kernels::{constexpr_usize, dt};
use crate::pq::launch::{i32_arg, ArgOrder, DeviceTensorRef};
use crate::pq::prefill::{KmeansInit, PrefillConfig, PrefillOutput, PrefillShape};
use crate::runtime::Runtime;

/// The prefill's kernels for one key dtype, loaded from a [`Runtime`].
pub struct GpuPrefill {
    rt: Arc<Runtime>,
    pack: Arc<Kernel>,
    prep: Arc<Kernel>,
    init: Arc<Kernel>,
    assign: Arc<Kernel>,
    sums: Arc<Kernel>,
    update: Arc<Kernel>,
    export: Arc<Kernel>,
    order: ArgOrder,
}

/// A prefill's results on the device, on the stream it ran on (read them after that
/// stream's work, or hand them to [`crate::pq::gpu::GpuIndexer::from_prefill`]).
pub struct PrefillResult {
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) cfg: PrefillConfig,
    pub(crate) shape: PrefillShape,
    /// `f32 [B, H_kv, M, K, d_c]`.
    pub(crate) centroids: CudaSlice<f32>,
    /// `f32 [B * H_kv * M]` (zeros for euclidean).
    pub(crate) phi: CudaSlice<f32>,
    /// `u8 [B, H_kv, M, cap]`: the codes of keys `0..n`, the indexer's state layout.
    pub(crate) codes: DevBuf<u8>,
    pub(crate) cap: usize,
    /// `i32 [G]`: centroid updates each group ran.
    iters: CudaSlice<i32>,
    /// `i32 [1]`: non-finite key values counted.
    bad: CudaSlice<i32>,
    export: Arc<Kernel>,
}

/// CTAs of `k` one SM holds at once, from its registers per thread, warps and shared
/// memory (sm_80/sm_90 limits: 64 Ki registers allocated per warp in units of 256, 64
/// warps, 32 CTAs and 228 KiB of shared memory per SM, 1 KiB of it reserved per CTA).
fn resident_ctas(k: &Kernel) -> usize {
    let warps = k.variant().num_warps.max(1) as usize;
    let regs_per_warp = (k.num_regs().max(1) as usize * 32).div_ceil(256) * 256;
    let by_regs = 65536 / (regs_per_warp * warps);
    let by_smem = (228 * 1024) / (k.variant().shared as usize + 1024);
    by_regs.min(by_smem).min(64 / warps).clamp(1, 32)
}

impl GpuPrefill {
    /// Load the prefill kernels for keys of `cfg.input_dtype` (and the code export
    /// kernel) from `rt`.
    ///
    /// Errors: a kernel variant missing from the ptx_cache, driver errors.
    pub fn new(rt: Arc<Runtime>, cfg: &PrefillConfig) -> Result<Self> {
        let kt = dt(cfg.input_dtype);
        Ok(GpuPrefill {
            pack: rt.default_kernel(&format!("pq_km_pack.k_{kt}"))?,
            prep: rt.default_kernel(&format!("pq_km_prep.k_{kt}"))?,
            init: rt.default_kernel(&format!("pq_km_init.k_{kt}"))?,
            assign: rt.default_kernel(&format!("pq_km_assign.k_{kt}"))?,
            sums: rt.default_kernel(&format!("pq_km_sums.k_{kt}"))?,
            update: rt.default_kernel("pq_km_update")?,
            export: rt.default_kernel("pq_codes_export")?,
            rt,
            order: ArgOrder::default(),
        })
    }

    /// The runtime the kernels came from.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.rt
    }

    /// Every kernel variant a prefill may launch (for reports).
    pub fn kernels(&self) -> Vec<Arc<Kernel>> {
        vec![
            self.pack.clone(),
            self.prep.clone(),
            self.init.clone(),
            self.assign.clone(),
            self.sums.clone(),
            self.update.clone(),
        ]
    }

    /// Parts per group and keys per part with which kernel `kern` (one CTA per part and
    /// group, looping over the part's keys in tiles of its `BLOCK_N`) takes `n` keys in
    /// `groups` groups: as many parts as its CTAs the SMs hold at once, each part a
    /// multiple of the tile. For the assignment (`P`) this fills the SMs in whole waves,
    /// since every CTA does the same work and a last partial wave would leave SMs idle
    /// (H100: the 4-CTAs-per-SM choice left 2.2 waves of work in 3 at H_kv=32; NOTES.md,
    /// "the prefill on the GPU"). `pq_km_prep` takes its own, more parts (its residency,
    /// not the assignment's), so each CTA's chain of dependent loads is short.
    fn parts(&self, kern: &Kernel, n: usize, groups: usize) -> Result<(usize, usize)> {
        let bn = constexpr_usize(kern, "BLOCK_N")?;
        let slots = resident_ctas(kern) * self.rt.device().sm_count() as usize;
        let p = (slots / groups.max(1)).clamp(1, n.div_ceil(bn).max(1));
        let per = n.div_ceil(p).div_ceil(bn) * bn;
        Ok((n.div_ceil(per), per))
    }

    /// The key view the prefill kernels read, with its first clustered position and its
    /// subvector stride: `key` itself where its address, strides and `d_s` are multiples
    /// of 16 elements (the kernels load vectors), else a copy packed by `pq_km_pack` into
    /// `[B, H_kv, n, M, d_pad]` (`d_pad` = `d_s` rounded up to 16, zero-padded), which is
    /// returned too so it lives until the launches are queued.
    fn aligned_keys(
        &self,
        stream: &Arc<CudaStream>,
        cfg: &PrefillConfig,
        shape: &PrefillShape,
        key: &DeviceTensorRef,
    ) -> Result<(DeviceTensorRef, usize, usize, Option<DevBuf<u8>>)> {
        let (m, d_s, n) = (cfg.m(), cfg.d_sub(shape.d), cfg.n(shape.s));
        let st = key.strides();
        if key.buf().addr().is_multiple_of(16)
            && st.iter().all(|s| s % 16 == 0)
            && d_s.is_multiple_of(16)
        {
            return Ok((*key, cfg.init_offset, d_s, None));
        }
        let d_pad = d_s.div_ceil(16) * 16;
        let elems = shape.b * shape.h_kv * n * m * d_pad;
        let mut packed: DevBuf<u8> = DevBuf::new();
        packed.ensure(stream, elems * cfg.input_dtype.size_bytes())?;
        let dst = packed.buf().as_dtype(cfg.input_dtype.triton());
        let named = [
            ("src_ptr", KernelArg::Buf(key.buf())),
            ("dst_ptr", KernelArg::Buf(dst)),
            ("k_sb", KernelArg::I64(st[0])),
            ("k_sh", KernelArg::I64(st[1])),
            ("k_ss", KernelArg::I64(st[2])),
            ("H_kv", i32_arg("H_kv", shape.h_kv)?),
            ("M", i32_arg("M", m)?),
            ("d_s", i32_arg("d_s", d_s)?),
            ("d_pad", i32_arg("d_pad", d_pad)?),
            ("n", i32_arg("n", n)?),
            ("pos0", i32_arg("init_offset", cfg.init_offset)?),
        ];
        let args = self.order.args(&self.pack, &named, false)?;
        let block = constexpr_usize(&self.pack, "BLOCK_N")?;
        // Bounds: the key view's extent was checked against the shape; the kernel reads
        // positions init_offset .. S of it and writes `elems` elements of `packed`.
        self.pack.launch(
            stream,
            [n.div_ceil(block) as u32, (shape.b * shape.h_kv) as u32, 1],
            &args,
        )?;
        let row = (m * d_pad) as i64;
        let view = DeviceTensorRef::new(
            dst,
            cfg.input_dtype,
            [shape.h_kv as i64 * n as i64 * row, n as i64 * row, row],
        )?;
        Ok((view, 0, d_pad, Some(packed)))
    }

    /// Build the codebook of `key` (`[B, H_kv, S, D]` of `cfg.input_dtype`, strides of
    /// `[batch, head, position]` in elements, last dimension contiguous) on `stream`:
    /// spec `pqcache-prefill.md` steps 1-5. `given` holds the initial centroids
    /// `f32 [B, H_kv, M, K, d_c]` when `cfg.init` is [`KmeansInit::Given`]. Nothing is
    /// synchronized: the result is valid in `stream` order.
    ///
    /// Errors: config/shape validation ([`PrefillConfig::validate`]), a key view too short
    /// for the shape or of another dtype, a missing or mis-sized `given`, sizes past the
    /// kernels' i32 arguments or grid limits, a stream or key buffer of another device
    /// than the runtime's ([`Error::DeviceMismatch`]), driver errors.
    pub fn run(
        &self,
        stream: &Arc<CudaStream>,
        cfg: &PrefillConfig,
        shape: &PrefillShape,
        key: &DeviceTensorRef,
        given: Option<&CudaSlice<f32>>,
    ) -> Result<PrefillResult> {
        cfg.validate(shape)?;
        let dev = self.rt.device();
        let on = format!("the prefill's runtime (device {})", dev.ordinal());
        dev.check_stream(stream, "the prefill's stream", &on)?;
        dev.check_addr(key.buf().addr(), "the key buffer", &on)?;
        if key.dtype() != cfg.input_dtype {
            return Err(Error::invalid(
                "key",
                format!(
                    "the view holds {} elements, the prefill config says {}",
                    key.dtype(),
                    cfg.input_dtype
                ),
            ));
        }
        key.check_extent("key", [shape.b, shape.h_kv, shape.s, shape.d])?;
        let (m, k, d_s, d_c, n) = (
            cfg.m(),
            cfg.k_centroids(),
            cfg.d_sub(shape.d),
            cfg.d_c(shape.d),
            cfg.n(shape.s),
        );
        let groups = cfg.groups(shape);
        if groups > 65535 {
            return Err(Error::invalid(
                "prefill shape",
                format!("B*H_kv*M = {groups} groups exceed the grid limit 65535"),
            ));
        }
        let ip = cfg.metric == Metric::Ip;
        let (parts, per) = self.parts(&self.assign, n, groups)?;
        let cap = n.max(16).div_ceil(16) * 16;
        let drv = |what: &'static str| move |e| crate::driver::device::driver_err(what, e);
        let zeros_i32 =
            |len: usize, what: &'static str| stream.alloc_zeros::<i32>(len).map_err(drv(what));
        let mut centroids = stream
            .alloc_zeros::<f32>(groups * k * d_c)
            .map_err(drv("allocating centroids"))?;
        let phi = stream
            .alloc_zeros::<f32>(groups)
            .map_err(drv("allocating phi"))?;
        let bad = zeros_i32(1, "allocating the non-finite count")?;
        let chg = zeros_i32(2 * groups, "allocating the change counts")?;
        let done = zeros_i32(groups, "allocating the convergence flags")?;
        let iters = zeros_i32(groups, "allocating the iteration counts")?;
        let cnt = zeros_i32(groups * parts * k, "allocating the cluster counts")?;
        let part = stream
            .alloc_zeros::<f32>(groups * parts * k * d_c)
            .map_err(drv("allocating the partial sums"))?;
        // every key coordinate's range, as order-preserving u32 words (zero: none seen):
        // the assignment centers the keys and the centroids on a point inside it where
        // one exists (f32 keys always take the centered loop, 16-bit keys only in the
        // groups with a coordinate to center)
        let ranges = stream
            .alloc_zeros::<u32>(groups * 2 * d_s)
            .map_err(drv("allocating the coordinate ranges"))?;
        let mut codes: DevBuf<u8> = DevBuf::new();
        codes.ensure(stream, groups * cap)?;
        let idx = match cfg.init {
            KmeansInit::Random { .. } => {
                let host: Vec<i32> = crate::pq::prefill::init_indices(cfg, shape)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|v| v as i32)
                    .collect();
                Some(stream.clone_htod(&host).map_err(drv("uploading seeds"))?)
            }
            _ => None,
        };
        if let KmeansInit::Given = cfg.init {
            let g = given.ok_or_else(|| {
                Error::invalid(
                    "init",
                    "given centroids were asked for (KmeansInit::Given) but none were passed",
                )
            })?;
            if g.len() != centroids.len() {
                return Err(Error::invalid(
                    "pq_centroids",
                    format!(
                        "expected {} f32 values [B={}, H_kv={}, M={m}, K={k}, d_c={d_c}], got {}",
                        centroids.len(),
                        shape.b,
                        shape.h_kv,
                        g.len()
                    ),
                ));
            }
            stream
                .memcpy_dtod(g, &mut centroids)
                .map_err(drv("copying the given centroids"))?;
        }
        let buf_f32 = |s: &CudaSlice<f32>| DeviceBuf::of(s, stream);
        let buf_i32 = |s: &CudaSlice<i32>| DeviceBuf::of(s, stream);
        let (view, pos0, k_sm, packed) = self.aligned_keys(stream, cfg, shape, key)?;
        let st = view.strides();
        // every argument any prefill kernel takes, by name; each launch adds its own
        let base: Vec<(&'static str, KernelArg)> = vec![
            ("k_ptr", KernelArg::Buf(view.buf())),
            ("k_sb", KernelArg::I64(st[0])),
            ("k_sh", KernelArg::I64(st[1])),
            ("k_ss", KernelArg::I64(st[2])),
            ("H_kv", i32_arg("H_kv", shape.h_kv)?),
            ("M", i32_arg("M", m)?),
            ("K", i32_arg("K", k)?),
            ("d_s", i32_arg("d_s", d_s)?),
            ("n", i32_arg("n", n)?),
            ("pos0", i32_arg("init_offset", pos0)?),
            ("k_sm", i32_arg("k_sm", k_sm)?),
            ("cap", i32_arg("cap", cap)?),
            ("P", i32_arg("P", parts)?),
            ("metric_ip", KernelArg::I32(i32::from(ip))),
            ("phi_ptr", KernelArg::Buf(buf_f32(&phi))),
            ("cent_ptr", KernelArg::Buf(buf_f32(&centroids))),
            ("codes_ptr", KernelArg::Buf(codes.buf())),
            ("part_ptr", KernelArg::Buf(buf_f32(&part))),
            ("cnt_ptr", KernelArg::Buf(buf_i32(&cnt))),
            ("chg_ptr", KernelArg::Buf(buf_i32(&chg))),
            ("done_ptr", KernelArg::Buf(buf_i32(&done))),
            ("iters_ptr", KernelArg::Buf(buf_i32(&iters))),
            ("bad_ptr", KernelArg::Buf(buf_i32(&bad))),
            ("rng_ptr", KernelArg::Buf(DeviceBuf::of(&ranges, stream))),
        ];
        let idx_buf = match &idx {
            Some(i) => buf_i32(i),
            None => buf_i32(&bad), // never read: use_idx = 0
        };
        let k_tiles = |kern: &Kernel| -> Result<u32> {
            Ok(k.div_ceil(constexpr_usize(kern, "BLOCK_K")?) as u32)
        };
        let g32 = groups as u32;
        let launch = |kern: &Arc<Kernel>, grid: [u32; 3], extra: &[(&'static str, KernelArg)]| {
            let mut named = base.clone();
            named.extend_from_slice(extra);
            let args = self.order.args(kern, &named, true)?;
            // Bounds: every buffer above was allocated here for `groups` groups of `n`
            // keys (`cap` >= n codes each, `parts` parts of `per` keys, `K` clusters of
            // `d_c` coordinates); the key view's extent was checked against the shape;
            // the kernels touch keys `j < n` of each group and the clusters `k < K`.
            kern.launch(stream, grid, &args)
        };
        let (prep_parts, prep_per) = self.parts(&self.prep, n, groups)?;
        launch(
            &self.prep,
            [prep_parts as u32, g32, 1],
            &[("per", i32_arg("per", prep_per)?)],
        )?;
        let per_arg = ("per", i32_arg("per", per)?);
        if !matches!(cfg.init, KmeansInit::Given) {
            launch(
                &self.init,
                [k_tiles(&self.init)?, g32, 1],
                &[
                    ("idx_ptr", KernelArg::Buf(idx_buf)),
                    ("use_idx", KernelArg::I32(i32::from(idx.is_some()))),
                ],
            )?;
        }
        let assign_grid = [parts as u32, g32, 1];
        // one assignment tile holds every cluster and coordinate: the assignment writes
        // the member sums itself (pq_kmeans.py, pq_km_assign)
        let fused = k <= constexpr_usize(&self.assign, "BLOCK_K")?
            && d_s <= constexpr_usize(&self.assign, "SUM_D")?;
        for it in 0..cfg.kmeans_iter {
            let it_arg = ("it", i32_arg("kmeans_iter", it)?);
            launch(
                &self.assign,
                assign_grid,
                &[it_arg, per_arg, ("final", KernelArg::I32(0))],
            )?;
            if !fused {
                launch(
                    &self.sums,
                    [parts as u32, k_tiles(&self.sums)?, g32],
                    &[per_arg],
                )?;
            }
            let e_tiles = (k * d_c).div_ceil(constexpr_usize(&self.update, "BLOCK_E")?) as u32;
            launch(&self.update, [e_tiles, g32, 1], &[it_arg])?;
        }
        launch(
            &self.assign,
            assign_grid,
            &[
                ("it", i32_arg("kmeans_iter", cfg.kmeans_iter)?),
                per_arg,
                ("final", KernelArg::I32(1)),
            ],
        )?;
        // the scratch is freed in stream order after the work above
        drop((part, ranges, cnt, chg, done, idx, packed));
        Ok(PrefillResult {
            stream: stream.clone(),
            cfg: *cfg,
            shape: *shape,
            centroids,
            phi,
            codes,
            cap,
            iters,
            bad,
            export: self.export.clone(),
        })
    }
}

impl PrefillResult {
    /// The centroids `f32 [B, H_kv, M, K, d_c]` (upstream `pq_centroids`).
    pub fn centroids(&self) -> &CudaSlice<f32> {
        &self.centroids
    }

    /// `phi` `f32 [B * H_kv * M]` (upstream `pq_ip2l2_phi`; zeros for euclidean).
    pub fn phi(&self) -> &CudaSlice<f32> {
        &self.phi
    }

    /// The codes `u8 [B, H_kv, M, capacity]` (keys `0..n` valid), the decode indexer's
    /// state layout.
    pub fn codes(&self) -> Option<&CudaSlice<u8>> {
        self.codes.slice()
    }

    /// Code capacity per group, in keys (a multiple of 16, `>= n`).
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Keys clustered per group, `n = S - init_offset`.
    pub fn n(&self) -> usize {
        self.cfg.n(self.shape.s)
    }

    /// The stream the prefill ran on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The config it ran with.
    pub fn config(&self) -> &PrefillConfig {
        &self.cfg
    }

    /// The shape it ran on.
    pub fn shape(&self) -> &PrefillShape {
        &self.shape
    }

    /// Non-finite key values the prefill saw (NaN or infinite; the spec refuses such
    /// keys). Synchronizes the stream.
    ///
    /// Errors: driver errors.
    pub fn nonfinite_keys(&self) -> Result<u64> {
        let v = self
            .stream
            .clone_dtoh(&self.bad)
            .map_err(|e| crate::driver::device::driver_err("reading the non-finite count", e))?;
        Ok(v[0].max(0) as u64)
    }

    /// Refuse keys with a non-finite value, naming the count. Synchronizes the stream.
    ///
    /// Errors: [`Error::Invalid`] on non-finite keys; driver errors.
    pub fn check_finite(&self) -> Result<()> {
        match self.nonfinite_keys()? {
            0 => Ok(()),
            bad => Err(Error::invalid(
                "key",
                format!(
                    "{bad} non-finite values (NaN or infinity) in the keys clustered (positions {}..{}); the prefill needs finite keys",
                    self.cfg.init_offset, self.shape.s
                ),
            )),
        }
    }

    /// Centroid updates each group ran (`[B * H_kv * M]`; fewer than `kmeans_iter`
    /// where the assignment stopped changing). Synchronizes the stream.
    ///
    /// Errors: driver errors.
    pub fn iterations(&self) -> Result<Vec<u32>> {
        let v = self
            .stream
            .clone_dtoh(&self.iters)
            .map_err(|e| crate::driver::device::driver_err("reading the iteration counts", e))?;
        Ok(v.into_iter().map(|x| x.max(0) as u32).collect())
    }

    /// Everything on the host in the upstream layouts ([`PrefillOutput`]: codes
    /// `i64 [B, n, H_kv, M]` converted on the device). Synchronizes the stream.
    ///
    /// Errors: driver errors.
    pub fn to_host(&self) -> Result<PrefillOutput> {
        let drv = |what: &'static str| move |e| crate::driver::device::driver_err(what, e);
        let (b, h_kv, m, n) = (self.shape.b, self.shape.h_kv, self.cfg.m(), self.n());
        let tmp = self
            .stream
            .alloc_zeros::<i64>((b * n * h_kv * m).max(1))
            .map_err(drv("allocating the exported codes"))?;
        let block = constexpr_usize(&self.export, "BLOCK")?;
        let named = [
            ("src_ptr", KernelArg::Buf(self.codes.buf())),
            ("dst_ptr", KernelArg::Buf(DeviceBuf::of(&tmp, &self.stream))),
            ("N", i32_arg("N", n)?),
            ("H_kv", i32_arg("H_kv", h_kv)?),
            ("M", i32_arg("M", m)?),
            ("cap", i32_arg("cap", self.cap)?),
        ];
        let args = crate::pq::launch::ArgOrder::default().args(&self.export, &named, false)?;
        // Bounds: src holds `B*H_kv*M x cap` codes, dst `B x n x H_kv x M` i64; the
        // kernel touches j < n <= cap only; same stream as the prefill.
        self.export.launch(
            &self.stream,
            [n.div_ceil(block).max(1) as u32, (b * h_kv * m) as u32, 1],
            &args,
        )?;
        let mut codes = self
            .stream
            .clone_dtoh(&tmp)
            .map_err(drv("downloading codes"))?;
        codes.truncate(b * n * h_kv * m);
        let centroids = self
            .stream
            .clone_dtoh(&self.centroids)
            .map_err(drv("downloading centroids"))?;
        let phi = match self.cfg.metric {
            Metric::Ip => Some(
                self.stream
                    .clone_dtoh(&self.phi)
                    .map_err(drv("downloading phi"))?,
            ),
            Metric::Euclidean => None,
        };
        let iterations = self.iterations()?;
        Ok(PrefillOutput {
            centroids,
            codes,
            phi,
            n,
            iterations,
        })
    }

    /// Device bytes the result holds (centroids, phi, codes).
    pub fn bytes(&self) -> usize {
        4 * (self.centroids.len() + self.phi.len()) + self.codes.len()
    }
}

/// Host keys uploaded to the device for a prefill: `key [B, H_kv, S, D]`, contiguous,
/// in the config's input dtype (every row: the prefill reads positions
/// `init_offset .. S`).
pub struct DeviceKeys {
    key: CudaSlice<u16>,
    view: DeviceTensorRef,
}

impl DeviceKeys {
    /// Upload `inputs.key` converted to `dtype`.
    ///
    /// Errors: driver errors.
    pub fn upload(
        stream: &Arc<CudaStream>,
        inputs: &crate::pq::prefill::PrefillInputs,
        dtype: crate::pq::config::DType,
    ) -> Result<Self> {
        let sh = inputs.shape;
        let key = stream
            .clone_htod(&crate::pq::harness::to_words(&inputs.key, dtype))
            .map_err(|e| crate::driver::device::driver_err("uploading keys", e))?;
        let strides = [
            (sh.h_kv * sh.s * sh.d) as i64,
            (sh.s * sh.d) as i64,
            sh.d as i64,
        ];
        let view = DeviceTensorRef::new(DeviceBuf::of(&key, stream), dtype, strides)?;
        Ok(DeviceKeys { key, view })
    }

    /// The key view `[B, H_kv, S, D]`.
    pub fn view(&self) -> &DeviceTensorRef {
        &self.view
    }

    /// Bytes held on the device.
    pub fn bytes(&self) -> usize {
        2 * self.key.len()
    }
}

/// Timings of repeated prefills (medians after a warm-up), in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillTiming {
    /// Host timer around the launches + synchronize.
    pub wall_us: f64,
    /// CUDA events around the launches.
    pub gpu_us: f64,
    /// Timed runs.
    pub samples: usize,
}

impl GpuPrefill {
    /// Run the prefill `repeat` times (after `repeat / 5` clamped to 1..=5 warm-up runs)
    /// and return the medians; the last run's result is returned too.
    ///
    /// Errors: as [`GpuPrefill::run`]; `repeat == 0`.
    pub fn time(
        &self,
        stream: &Arc<CudaStream>,
        cfg: &PrefillConfig,
        shape: &PrefillShape,
        key: &DeviceTensorRef,
        given: Option<&CudaSlice<f32>>,
        repeat: usize,
    ) -> Result<(PrefillTiming, PrefillResult)> {
        if repeat == 0 {
            return Err(Error::invalid("repeat", "at least one timed run"));
        }
        let drv = |what: &'static str| move |e| crate::driver::device::driver_err(what, e);
        let dev = self.rt.device();
        let (e0, e1) = (dev.new_event(true)?, dev.new_event(true)?);
        let warm = (repeat / 5).clamp(1, 5);
        let (mut wall, mut gpu) = (Vec::new(), Vec::new());
        let mut last = None;
        for i in 0..warm + repeat {
            drop(last.take()); // free the previous result before the next run
            let t = std::time::Instant::now();
            e0.record(stream).map_err(drv("recording an event"))?;
            let r = self.run(stream, cfg, shape, key, given)?;
            e1.record(stream).map_err(drv("recording an event"))?;
            stream.synchronize().map_err(drv("synchronizing"))?;
            if i >= warm {
                wall.push(t.elapsed().as_secs_f64() * 1e6);
                gpu.push(e0.elapsed_ms(&e1).map_err(drv("reading an event"))? as f64 * 1e3);
            }
            last = Some(r);
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        Ok((
            PrefillTiming {
                wall_us: med(&mut wall),
                gpu_us: med(&mut gpu),
                samples: repeat,
            },
            last.expect("at least one run"),
        ))
    }
}
