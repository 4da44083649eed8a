//! The indexer's device state: the code state, the select paths' scratch and the
//! outputs, each a [`DevBuf`] that grows only when a step needs more.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use crate::abi::KernelArg;
use crate::driver::{DevBuf, DeviceBuf};
use crate::error::{Error, Result};
use crate::pq::config::{DType, Metric, PqConfig, Shape};
use crate::pq::kernels::{constexpr_usize, Kernels, HIST_COMBOS};
use crate::pq::launch::{i32_arg, ArgOrder};
use crate::pq::memory::StateBytes;
use crate::pq::plan::{bucket_capacity, code_capacity};

/// Output buffers a caller provides for a step ([`crate::pq::gpu::GpuIndexer::step_into`]):
/// `sparse_list` `i64 [B, H, total]`, `sparse_len` `i64 [B, H]`, `weight_list`
/// `[B, H, S]` in the config's weight dtype, each a [`DeviceBuf`] of the caller's
/// allocation (sizes and dtypes checked by the step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StepOutputs {
    /// `i64 [B, H, total]`.
    pub sparse_list: DeviceBuf,
    /// `i64 [B, H]`.
    pub sparse_len: DeviceBuf,
    /// `[B, H, S]`, weight dtype.
    pub weight_list: DeviceBuf,
}

/// Every device buffer of one indexer (all sizes fixed by `B, H, H_kv, D`, the config
/// and the largest `S` seen), on the indexer's stream.
pub(crate) struct DeviceState {
    pub stream: Arc<CudaStream>,
    pub cfg: PqConfig,
    pub shape: Shape,
    /// Owns the centroids `f32 [B, H_kv, M, K, d_c]` that `centroids_buf` points into.
    _centroids: CudaSlice<f32>,
    /// Owns phi `f32 [B * H_kv * M]` (metric ip; one 0.0 otherwise), `phi_buf`'s memory.
    _phi: CudaSlice<f32>,
    /// The centroids as a kernel argument (the address read once: see [`DevBuf`]).
    pub centroids_buf: DeviceBuf,
    /// phi as a kernel argument.
    pub phi_buf: DeviceBuf,
    /// What `pq_quant` reads of the constant centroids, written once by `pq_cprep` in
    /// [`DeviceState::new`]: their three-term bf16 split `bf16 [B*H_kv*M, 3, K, d_s]`
    /// (read by the bf16-key builds only: one element, unwritten, for other key dtypes) ...
    pub cprep: DevBuf<u16>,
    /// ... and their squared norms `f32 [B*H_kv*M, K]` over `d_c`.
    pub cnorm: DevBuf<f32>,
    /// `u8 [B, H_kv, M, cap]`: one byte per (key, subvector).
    pub codes: DevBuf<u8>,
    /// Code capacity per (batch, KV head, subvector), in keys: grows x2, multiple of 16.
    pub cap: usize,
    /// Keys quantized so far (`N_cached`).
    pub n_cached: usize,
    /// The select kernel's per-CTA lookup table `f32 [CTAs, M, K]`.
    pub lut: DevBuf<f32>,
    /// Histogram path state: combination counts `i32 [B*H, HIST_COMBOS]` of the keys
    /// `j < histn[r]`, `histn i32 [B*H]` and the per-row lookup table (the threshold
    /// rounds' bins are each row CTA's shared memory). Zero-filled at creation and on
    /// import.
    pub hist: DevBuf<i32>,
    pub histn: DevBuf<i32>,
    pub hist_lut: DevBuf<f32>,
    /// Split path scratch: each row's class bounds `f32 [B*H, 2]` (`t_sure`, `t_maybe`:
    /// the radix-select path's `pq_emit` scores keys through `hist_lut` and compares them
    /// with these), maybe keys to take `i32
    /// [B*H]`, the emit's part flags `i64 [B*H, cdiv(n, TILE)]` and ticket counter `i32
    /// [1]` (both zeroed by `pq_thresh` each step), and each row's class per code
    /// combination `u8 [B*H, HIST_COMBOS]` (written by `pq_thresh` each step: bit 1 =
    /// scores `>= t_sure`, bit 0 = `>= t_maybe`; the split paths' emits classify each key
    /// by one gather from it).
    pub split_bnd: DevBuf<f32>,
    pub split_need: DevBuf<i32>,
    pub split_flag: DevBuf<i64>,
    pub split_ctr: DevBuf<i32>,
    pub split_cls: DevBuf<u8>,
    /// Radix-select split path state (`kernels_triton/pq_range.py`): the new key's
    /// partial argmins `f32` / `i32 [B*H_kv, M, cdiv(K, 64)]`. The select's rounds keep
    /// their counts in each row's cluster's shared memory; the threshold goes to
    /// `split_bnd` / `split_need`, the lookup table to `hist_lut`, as on the split path.
    pub rqd: DevBuf<f32>,
    pub rqc: DevBuf<i32>,
    /// Indexed path state: its own combination counts `i32 [B*H, HIST_COMBOS]` of the
    /// keys `j < ihistn[r]` (`ihistn i32 [B*H]`), the buckets `i32 [B*H, HIST_COMBOS,
    /// capc]` (key positions per combination, slot = count when the key joined; a
    /// combination's keys past `capc` are not kept and its rows fall back to a pass over
    /// the codes), the gather's start marks `i32 [B*H, TP]` and the rows' companion-fill
    /// arrival counters `i32 [B*H]` (both kept zero by the kernel).
    /// Counts zero-filled when made, on import and when `capc` changes. The buckets
    /// take `B*H x 4096 x capc x 4` bytes, `capc = 2 cdiv(cap, 4096) + 16` (large
    /// workload: 128 rows, cap 130944: 168 MB). All five are allocated by the first step
    /// that takes the indexed path (`plan::takes_index`), never for a config or shape
    /// whose steps do not.
    pub ihist: DevBuf<i32>,
    pub ihistn: DevBuf<i32>,
    pub bkt: DevBuf<i32>,
    pub mark: DevBuf<i32>,
    pub ready: DevBuf<i32>,
    /// Bucket capacity (0: buckets not allocated).
    pub capc: usize,
    /// The select kernel's staging `i64 [CTAs, 2 K_PAD]`, per-chunk candidates `i64
    /// [CTAs, K_PAD]` and per-row completion counters `i32 [B*H]`.
    pub stage: DevBuf<i64>,
    pub cand: DevBuf<i64>,
    pub count: DevBuf<i32>,
    /// The outputs: `sparse_list i64 [B, H, total]`, `sparse_len i64 [B, H]`,
    /// `weight_list [B, H, S]` (weight dtype, as bytes).
    /// The caller's output buffers for the step being built (else the indexer's own).
    pub outputs: Option<StepOutputs>,
    /// `i32 [1]`: codes outside `0..K` the last import counted.
    pub bad_codes: DevBuf<i32>,
    pub sparse_list: DevBuf<i64>,
    pub sparse_len: DevBuf<i64>,
    pub weight: DevBuf<u8>,
}

impl DeviceState {
    /// Take `centroids` and `phi` (on the device, lengths already checked) and allocate the buffers
    /// whose size does not depend on `S`, zero-filled: the counters, and the histogram
    /// path's counts where its kernels are built (the indexed path's come with the first
    /// step that takes it: [`DeviceState::ensure_buffers`]).
    ///
    /// Errors: driver errors.
    pub fn new(
        stream: Arc<CudaStream>,
        cfg: PqConfig,
        shape: Shape,
        kernels: &Kernels,
        centroids: CudaSlice<f32>,
        phi: CudaSlice<f32>,
    ) -> Result<Self> {
        let centroids_buf = DeviceBuf::of(&centroids, &stream);
        let phi_buf = DeviceBuf::of(&phi, &stream);
        let mut me = DeviceState {
            centroids_buf,
            phi_buf,
            stream,
            cfg,
            shape,
            _centroids: centroids,
            _phi: phi,
            cprep: DevBuf::new(),
            cnorm: DevBuf::new(),
            codes: DevBuf::new(),
            cap: 0,
            n_cached: 0,
            lut: DevBuf::new(),
            hist: DevBuf::new(),
            histn: DevBuf::new(),
            hist_lut: DevBuf::new(),
            split_bnd: DevBuf::new(),
            split_need: DevBuf::new(),
            split_flag: DevBuf::new(),
            split_ctr: DevBuf::new(),
            split_cls: DevBuf::new(),
            rqd: DevBuf::new(),
            rqc: DevBuf::new(),
            ihist: DevBuf::new(),
            ihistn: DevBuf::new(),
            bkt: DevBuf::new(),
            mark: DevBuf::new(),
            ready: DevBuf::new(),
            capc: 0,
            stage: DevBuf::new(),
            cand: DevBuf::new(),
            count: DevBuf::new(),
            outputs: None,
            bad_codes: DevBuf::new(),
            sparse_list: DevBuf::new(),
            sparse_len: DevBuf::new(),
            weight: DevBuf::new(),
        };
        let (m, k) = (cfg.m(), cfg.k_centroids());
        let rows = shape.b * shape.h;
        let st = me.stream.clone();
        me.count.ensure(&st, rows)?;
        me.bad_codes.ensure(&st, 1)?;
        me.sparse_len.ensure(&st, rows)?;
        if kernels.hist.is_some() {
            // allocated zero-filled: an empty histogram counting no keys
            me.hist.ensure(&st, rows * HIST_COMBOS)?;
            me.histn.ensure(&st, rows)?;
            me.hist_lut.ensure(&st, rows * m * k)?;
            me.split_bnd.ensure(&st, rows * 2)?;
            me.split_need.ensure(&st, rows)?;
            me.split_ctr.ensure(&st, 1)?;
            me.split_cls.ensure(&st, rows * HIST_COMBOS)?;
        }
        if let Some(rk) = &kernels.range {
            me.hist_lut.ensure(&st, rows * m * k)?;
            me.split_bnd.ensure(&st, rows * 2)?;
            me.split_need.ensure(&st, rows)?;
            me.split_ctr.ensure(&st, 1)?;
            let parts = shape.b * shape.h_kv * m * k.div_ceil(rk.lut_block);
            me.rqd.ensure(&st, parts)?;
            me.rqc.ensure(&st, parts)?;
        }
        me.prepare_centroids(kernels)?;
        // the indexed path's buffers come with its first step (ensure_buffers)
        Ok(me)
    }

    /// `weight_list`'s buffer (the caller's, else the indexer's) as a kernel argument of
    /// the weight dtype.
    pub fn weight_buf(&self) -> DeviceBuf {
        match &self.outputs {
            Some(o) => o.weight_list,
            None => self.weight.buf().as_dtype(self.cfg.weight_dtype.triton()),
        }
    }

    /// `sparse_list`'s buffer (the caller's, else the indexer's).
    pub fn sparse_list_buf(&self) -> DeviceBuf {
        match &self.outputs {
            Some(o) => o.sparse_list,
            None => self.sparse_list.buf(),
        }
    }

    /// `sparse_len`'s buffer (the caller's, else the indexer's).
    pub fn sparse_len_buf(&self) -> DeviceBuf {
        match &self.outputs {
            Some(o) => o.sparse_len,
            None => self.sparse_len.buf(),
        }
    }

    /// Rows of the outputs, `B*H`.
    pub fn rows(&self) -> usize {
        self.shape.b * self.shape.h
    }

    /// Grow the code state to hold at least `n` keys per (batch, KV head, subvector),
    /// keeping the `N_cached` codes (re-laid out on the device, synchronously; only on
    /// growth). It grows to twice its capacity where that is more, but never past the
    /// keys of the shape's `S` (`S_alloc`, the longest sequence it serves): the indexed
    /// path's buckets are sized from this capacity.
    pub fn grow_codes(&mut self, kernels: &Kernels, order: &ArgOrder, n: usize) -> Result<()> {
        if n <= self.cap {
            return Ok(());
        }
        let most = self.cfg.n_quantized(self.shape.s);
        let new_cap = code_capacity(n.max((self.cap * 2).min(most)));
        let (b, h_kv, m) = (self.shape.b, self.shape.h_kv, self.cfg.m());
        let mut next: DevBuf<u8> = DevBuf::new();
        next.ensure(&self.stream, b * h_kv * m * new_cap)?;
        if self.n_cached > 0 {
            // re-layout through the upstream i64 form, on the device (only on growth)
            let mut tmp: DevBuf<i64> = DevBuf::new();
            let nc = self.n_cached;
            tmp.ensure(&self.stream, b * nc * h_kv * m)?;
            let src = self.codes.buf();
            self.launch_codes_copy(kernels, order, true, src, tmp.buf(), nc, self.cap)?;
            self.launch_codes_copy(kernels, order, false, tmp.buf(), next.buf(), nc, new_cap)?;
            self.stream
                .synchronize()
                .map_err(|e| crate::driver::device::driver_err("growing the code state", e))?;
        }
        self.codes = next;
        self.cap = new_cap;
        Ok(())
    }

    /// Take `codes` (`u8 [B, H_kv, M, cap]`, made on this stream, keys `0..n` valid)
    /// as the code state: `N_cached = n`; the histograms count no key yet.
    pub fn adopt_codes(&mut self, codes: DevBuf<u8>, cap: usize, n: usize) {
        self.codes = codes;
        self.cap = cap;
        self.n_cached = n;
    }

    /// Allocate `cprep` / `cnorm` and launch `pq_cprep` over the centroids (on the
    /// stream, before any step).
    ///
    /// Errors: driver errors, an argument beyond its kernel's type.
    fn prepare_centroids(&mut self, kernels: &Kernels) -> Result<()> {
        let (m, k) = (self.cfg.m(), self.cfg.k_centroids());
        let d_s = self.cfg.d_sub(self.shape.d);
        let rows = self.shape.b * self.shape.h_kv * m;
        let st = self.stream.clone();
        // the bf16 split only where the keys are bf16 (the only pq_quant builds that read
        // it); one element elsewhere, never read or written
        let split = self.cfg.input_dtype == DType::BF16;
        self.cprep
            .ensure(&st, if split { rows * 3 * k * d_s } else { 1 })?;
        self.cnorm.ensure(&st, rows * k)?;
        let kc = &kernels.cprep;
        let block = constexpr_usize(kc, "BLOCK_C")?;
        let named = [
            ("cent_ptr", KernelArg::Buf(self.centroids_buf)),
            ("prep_ptr", KernelArg::Buf(self.cprep_buf())),
            ("cn_ptr", KernelArg::Buf(self.cnorm.buf())),
            ("K", i32_arg("K", k)?),
            ("d_s", i32_arg("d_s", d_s)?),
            (
                "metric_ip",
                KernelArg::I32(i32::from(self.cfg.metric == Metric::Ip)),
            ),
            ("split", KernelArg::I32(i32::from(split))),
        ];
        let args = ArgOrder::default().args(kc, &named, false)?;
        // Bounds: the kernel reads centroids row x K x d_c .. (rows x K x d_c, uploaded
        // with that size) and writes cn[row, c < K] (rows x K) and, with split, prep[row,
        // 0..3, c < K, d < d_s] (rows x 3 x K x d_s, just sized); grid rows = B*H_kv*M.
        kc.launch(&st, [k.div_ceil(block) as u32, rows as u32, 1], &args)
    }

    /// `cprep` as a bf16 kernel argument.
    pub fn cprep_buf(&self) -> DeviceBuf {
        self.cprep.buf().as_dtype(crate::artifact::Dtype::Bf16)
    }

    /// export (u8 state -> i64 upstream) when `export`, else import.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_codes_copy(
        &self,
        kernels: &Kernels,
        order: &ArgOrder,
        export: bool,
        src: DeviceBuf,
        dst: DeviceBuf,
        n: usize,
        cap: usize,
    ) -> Result<()> {
        let k = if export {
            &kernels.export
        } else {
            &kernels.import
        };
        let block = constexpr_usize(k, "BLOCK")?;
        let rows = self.shape.b * self.shape.h_kv * self.cfg.m();
        let mut named = vec![
            ("src_ptr", KernelArg::Buf(src)),
            ("dst_ptr", KernelArg::Buf(dst)),
            ("N", i32_arg("N", n)?),
            ("H_kv", i32_arg("H_kv", self.shape.h_kv)?),
            ("M", i32_arg("M", self.cfg.m())?),
            ("cap", i32_arg("cap", cap)?),
        ];
        if !export {
            named.push(("bad_ptr", KernelArg::Buf(self.bad_codes.buf())));
            named.push(("K", i32_arg("K", self.cfg.k_centroids())?));
        }
        let args = order.args(k, &named, false)?;
        let grid = [n.div_ceil(block).max(1) as u32, rows as u32, 1];
        // Bounds: src and dst are this indexer's buffers (or a temp of the same stream)
        // sized for `rows x cap` u8 codes and `B x n x H_kv x M` i64 codes; the kernel
        // touches j < n <= cap only; everything runs on self.stream in order.
        k.launch(&self.stream, grid, &args)
    }

    /// Replace the code state with `n` keys of upstream-layout codes `i64 [B, n, H_kv,
    /// M]` (length and range already checked). Synchronous.
    pub fn import_codes(
        &mut self,
        kernels: &Kernels,
        order: &ArgOrder,
        src: DeviceBuf,
        n: usize,
    ) -> Result<()> {
        let drv = |what: &'static str| move |e| crate::driver::device::driver_err(what, e);
        self.n_cached = 0;
        self.reset_hist()?;
        self.grow_codes(kernels, order, n)?;
        if n > 0 {
            if let Some(bad) = self.bad_codes.slice_mut() {
                self.stream
                    .memset_zeros(bad)
                    .map_err(drv("zeroing the bad-code count"))?;
            }
            let dst = self.codes.buf();
            self.launch_codes_copy(kernels, order, false, src, dst, n, self.cap)?;
            let bad = match self.bad_codes.slice() {
                Some(b) => self.stream.clone_dtoh(b).map_err(drv("importing codes"))?,
                None => vec![0],
            };
            if bad[0] != 0 {
                return Err(Error::invalid(
                    "pq_codebook",
                    format!(
                        "{} of the {} codes are outside 0..{} (K = 2^pq_bits)",
                        bad[0],
                        self.shape.b * n * self.shape.h_kv * self.cfg.m(),
                        self.cfg.k_centroids()
                    ),
                ));
            }
        }
        self.n_cached = n;
        Ok(())
    }

    /// The code state in the upstream layout `i64 [B, N_cached, H_kv, M]`. Synchronous.
    pub fn export_codes(&self, kernels: &Kernels, order: &ArgOrder) -> Result<Vec<i64>> {
        let (b, h_kv, m, n) = (self.shape.b, self.shape.h_kv, self.cfg.m(), self.n_cached);
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut tmp: DevBuf<i64> = DevBuf::new();
        tmp.ensure(&self.stream, b * n * h_kv * m)?;
        self.launch_codes_copy(
            kernels,
            order,
            true,
            self.codes.buf(),
            tmp.buf(),
            n,
            self.cap,
        )?;
        let mut host = self
            .stream
            .clone_dtoh(tmp.slice().expect("allocated above"))
            .map_err(|e| crate::driver::device::driver_err("downloading codes", e))?;
        host.truncate(b * n * h_kv * m);
        Ok(host)
    }

    /// Forget the histogram paths' counts (the codes they counted are being replaced):
    /// zero `hist`, `histn`, `ihist` and `ihistn`, so the next histogram step counts
    /// every candidate anew.
    pub fn reset_hist(&mut self) -> Result<()> {
        let st = self.stream.clone();
        for b in [
            &mut self.hist,
            &mut self.histn,
            &mut self.ihist,
            &mut self.ihistn,
        ] {
            if let Some(buf) = b.slice_mut() {
                st.memset_zeros(buf).map_err(|e| {
                    crate::driver::device::driver_err("clearing the combination histogram", e)
                })?;
            }
        }
        Ok(())
    }

    /// Make sure every buffer a step at `s` needs exists, the indexed path's (buckets,
    /// their counts, marks, arrival counters) only when `index` (the step takes it:
    /// [`crate::pq::plan::takes_index`]). Allocation happens here, never inside a
    /// captured or steady-state step once sizes stop growing.
    pub fn ensure_buffers(
        &mut self,
        kernels: &Kernels,
        order: &ArgOrder,
        index: bool,
        s: usize,
    ) -> Result<()> {
        let st = self.stream.clone();
        let rows = self.rows();
        let (m, k) = (self.cfg.m(), self.cfg.k_centroids());
        let total = self.cfg.total(s);
        if self.outputs.is_none() {
            self.sparse_list.ensure(&st, rows * total)?;
            self.weight
                .ensure(&st, rows * s * self.cfg.weight_dtype.size_bytes())?;
        }
        if !self.cfg.is_short(s) {
            let n = self.cfg.n_quantized(s);
            // one lookup table per row (histogram family) or per select CTA (chunked)
            let ctas = kernels
                .select
                .as_ref()
                .map_or(rows, |sk| rows * n.div_ceil(sk.chunk));
            self.lut.ensure(&st, ctas.max(rows) * m * k)?;
            if let Some(sk) = &kernels.select {
                self.stage.ensure(&st, ctas * sk.stage)?;
                self.cand.ensure(&st, ctas * sk.k_pad)?;
            }
            self.grow_codes(kernels, order, n)?;
            if let Some(sp) = &kernels.split {
                self.split_flag.ensure(&st, rows * n.div_ceil(sp.tile))?;
            }
            if let Some(rk) = &kernels.range {
                self.split_flag
                    .ensure(&st, rows * n.div_ceil(rk.emit_tile))?;
            }
            if let (Some(ik), true) = (&kernels.index, index) {
                // zero-filled when first made: counts of no key, no row's companion
                // arrived, marks clear
                self.ihist.ensure(&st, rows * HIST_COMBOS)?;
                self.ihistn.ensure(&st, rows)?;
                self.mark.ensure(&st, rows * ik.tp)?;
                self.ready.ensure(&st, rows)?;
                // buckets sized from the code capacity: twice a uniform share of the
                // keys per combination, plus 16 (rows whose taken combinations hold more
                // fall back to a pass over their codes, still exact)
                let capc = bucket_capacity(self.cap);
                if capc != self.capc {
                    self.bkt.ensure(&st, rows * HIST_COMBOS * capc)?;
                    self.capc = capc;
                    // the bucket layout changed: count every candidate anew
                    self.reset_hist()?;
                }
            }
        }
        Ok(())
    }

    /// The bytes of every device buffer this state allocated, by group (see
    /// [`StateBytes`]; temporaries of an import or a growth are freed and not counted).
    pub fn bytes(&self) -> StateBytes {
        fn b<T>(d: &DevBuf<T>) -> usize {
            d.len() * std::mem::size_of::<T>()
        }
        StateBytes {
            codebook: (self._centroids.len() + self._phi.len()) * 4
                + b(&self.cprep)
                + b(&self.cnorm),
            codes: b(&self.codes) + b(&self.bad_codes),
            select: b(&self.lut) + b(&self.stage) + b(&self.cand) + b(&self.count),
            hist: b(&self.hist)
                + b(&self.histn)
                + b(&self.hist_lut)
                + b(&self.split_bnd)
                + b(&self.split_need)
                + b(&self.split_flag)
                + b(&self.split_ctr)
                + b(&self.split_cls)
                + b(&self.rqd)
                + b(&self.rqc),
            index: b(&self.ihist) + b(&self.ihistn) + b(&self.mark) + b(&self.ready),
            buckets: b(&self.bkt),
            outputs: b(&self.sparse_list) + b(&self.sparse_len) + b(&self.weight),
        }
    }

    /// Every buffer address and capacity a captured step depends on.
    pub fn buffer_ptrs(&self) -> Vec<u64> {
        vec![
            self.codes.ptr(),
            self.cap as u64,
            self.sparse_list_buf().addr(),
            self.sparse_len_buf().addr(),
            self.weight_buf().addr(),
            self.lut.ptr(),
            self.stage.ptr(),
            self.cand.ptr(),
            self.count.ptr(),
            self.hist.ptr(),
            self.histn.ptr(),
            self.hist_lut.ptr(),
            self.split_bnd.ptr(),
            self.split_need.ptr(),
            self.split_flag.ptr(),
            self.split_ctr.ptr(),
            self.split_cls.ptr(),
            self.rqd.ptr(),
            self.rqc.ptr(),
            self.ihist.ptr(),
            self.ihistn.ptr(),
            self.bkt.ptr(),
            self.capc as u64,
            self.mark.ptr(),
            self.ready.ptr(),
        ]
    }

    /// Device addresses of `(sparse_list, sparse_len, weight_list)`.
    pub fn output_ptrs(&self) -> (u64, u64, u64) {
        (
            self.sparse_list.ptr(),
            self.sparse_len.ptr(),
            self.weight.ptr(),
        )
    }

    /// Copy the outputs to the host, cut to `rows x total` (`sparse_list`), `rows`
    /// (`sparse_len`) and `rows x s x weight bytes` (`weight_list`, raw bytes).
    /// Synchronizes first.
    ///
    /// Errors: driver errors; panics if no step allocated the outputs.
    pub fn download_outputs(
        &self,
        total: usize,
        s: usize,
    ) -> Result<(Vec<i64>, Vec<i64>, Vec<u8>)> {
        let rows = self.rows();
        let drv = |what: &'static str| move |e| crate::driver::device::driver_err(what, e);
        self.stream
            .synchronize()
            .map_err(drv("synchronizing the indexer stream"))?;
        let mut sl = self
            .stream
            .clone_dtoh(self.sparse_list.slice().expect("allocated by step"))
            .map_err(drv("downloading sparse_list"))?;
        sl.truncate(rows * total);
        let mut len = self
            .stream
            .clone_dtoh(self.sparse_len.slice().expect("allocated in new"))
            .map_err(drv("downloading sparse_len"))?;
        len.truncate(rows);
        let wb = self.cfg.weight_dtype.size_bytes();
        let mut wraw = self
            .stream
            .clone_dtoh(self.weight.slice().expect("allocated by step"))
            .map_err(drv("downloading weight_list"))?;
        wraw.truncate(rows * s * wb);
        Ok((sl, len, wraw))
    }

    /// Poison every output buffer (sparse_list and sparse_len with -7, weight_list with
    /// the byte 0x7f). Asynchronous.
    pub fn poison_outputs(&mut self) -> Result<()> {
        let st = self.stream.clone();
        let drv = |what: &'static str| move |e| crate::driver::device::driver_err(what, e);
        if let Some(b) = self.sparse_list.slice_mut() {
            let v = vec![-7i64; b.len()];
            st.memcpy_htod(&v, b)
                .map_err(drv("poisoning sparse_list"))?;
        }
        if let Some(b) = self.sparse_len.slice_mut() {
            let v = vec![-7i64; b.len()];
            st.memcpy_htod(&v, b).map_err(drv("poisoning sparse_len"))?;
        }
        if let Some(b) = self.weight.slice_mut() {
            let v = vec![0x7fu8; b.len()];
            st.memcpy_htod(&v, b)
                .map_err(drv("poisoning weight_list"))?;
        }
        Ok(())
    }
}
