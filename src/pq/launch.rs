//! From a [`StepPlan`] to kernel launches: each kernel's grid and arguments, in
//! signature order, over the indexer's [`DeviceState`] and the caller's tensors.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr};

use crate::devbuf::DevBuf;
use crate::error::{Error, Result};
use crate::kernel::{arg_positions, Kernel, KernelArg};
use crate::pq::config::{DType, Metric};
use crate::pq::kernels::{constexpr_usize, Kernels};
use crate::pq::plan::{StepKind, StepPlan};
use crate::pq::state::DeviceState;

/// A device tensor the caller owns: base address, dtype and strides in elements.
///
/// `query` is `[B, H, 1, D]` and `key` is `[B, H_kv, S_alloc, D]`; the innermost
/// dimension must be contiguous (stride 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceTensorRef {
    ptr: u64,
    dtype: DType,
    strides: [i64; 3],
}

impl DeviceTensorRef {
    /// A view of caller-owned device memory. `strides` are the element strides of the
    /// first three dimensions (`[batch, head, position]`); the last dimension (`D`) is
    /// contiguous.
    ///
    /// # Safety
    ///
    /// `ptr` must be a device address in the indexer's CUDA context, of dtype `dtype`,
    /// valid for every element the indexer reads (query: all `B x H x D`; key: the new
    /// positions `init_offset + N_cached .. S` of every batch and KV head) until the
    /// step that reads it completes on the indexer's stream.
    pub unsafe fn new(ptr: u64, dtype: DType, strides: [i64; 3]) -> Self {
        DeviceTensorRef {
            ptr,
            dtype,
            strides,
        }
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The element dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Element strides of `[batch, head, position]`.
    pub fn strides(&self) -> [i64; 3] {
        self.strides
    }
}

/// One kernel launch of a step: kernel, grid and arguments in signature order.
pub(crate) struct Launch {
    pub kernel: Arc<Kernel>,
    pub grid: [u32; 3],
    pub args: Vec<KernelArg>,
}

/// The arguments of each kernel in signature order, from the named lists a step builds
/// (see [`crate::kernel::arg_positions`]). The positions are found once per kernel and
/// kept: the lists are built in the same order every step, so later steps take one pass
/// over the signature (each position's name re-checked) instead of a name search per
/// argument (measured on the H100, NOTES.md, "what a replayed step costs beyond its
/// kernels; planning in the launch path": the split path's planning cost 13 us of host
/// time per plain-launch step with the search).
#[derive(Default)]
pub(crate) struct ArgOrder(RefCell<HashMap<usize, (usize, Vec<usize>)>>);

impl ArgOrder {
    /// `named` ordered by `k`'s signature; `subset` as in [`arg_positions`].
    /// Errors: [`Error::Invalid`] naming the kernel and the argument.
    pub fn args(
        &self,
        k: &Kernel,
        named: &[(&str, KernelArg)],
        subset: bool,
    ) -> Result<Vec<KernelArg>> {
        let sig = &k.variant().signature;
        // the kernel's address names it: the indexer holds its kernels for its lifetime,
        // and a reused address with other names fails the check below and is redone
        let id = k as *const Kernel as usize;
        if let Some((len, pos)) = self.0.borrow().get(&id) {
            if *len == named.len()
                && pos.len() == sig.len()
                && pos.iter().zip(sig).all(|(&i, a)| named[i].0 == a.name)
            {
                return Ok(pos.iter().map(|&i| named[i].1).collect());
            }
        }
        let names: Vec<&str> = named.iter().map(|(n, _)| *n).collect();
        let pos = arg_positions(sig, &names, subset)
            .map_err(|msg| Error::invalid(format!("arguments of {}", k.id()), msg))?;
        let args = pos.iter().map(|&i| named[i].1).collect();
        self.0.borrow_mut().insert(id, (named.len(), pos));
        Ok(args)
    }
}

/// `v` as a kernel's i32 argument. Errors: [`Error::Invalid`] naming `what` when it
/// does not fit.
pub(crate) fn i32_arg(what: &str, v: usize) -> Result<KernelArg> {
    i32::try_from(v)
        .map(KernelArg::I32)
        .map_err(|_| Error::invalid(what, format!("{v} does not fit the kernel's i32 argument")))
}

/// What the launches of a step are built from: the kernels, the device state (sized by
/// `DeviceState::ensure_buffers` for the step), the argument orders and the SM count.
pub(crate) struct StepLaunches<'a> {
    pub kernels: &'a Kernels,
    pub state: &'a DeviceState,
    pub order: &'a ArgOrder,
    pub sm_count: u32,
}

/// [`Error::Invalid`] for a plan naming a kernel this indexer did not load.
fn not_built(what: &str) -> Error {
    Error::invalid("step plan", format!("{what} is not built for this config"))
}

impl StepLaunches<'_> {
    /// The launches of `plan`, in order (no allocation, nothing issued). The comments
    /// marked `Bounds:` state why each launch stays inside the indexer's buffers;
    /// [`issue`] relies on them.
    ///
    /// Errors: an argument that does not fit its kernel's type, a kernel the plan needs
    /// that is not loaded, an emit grid beyond `u32`.
    pub fn build(
        &self,
        plan: &StepPlan,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
    ) -> Result<Vec<Launch>> {
        let (ks, state, order) = (self.kernels, self.state, self.order);
        let st = &state.stream;
        let rows = state.rows();
        let (s, n_old, n) = (plan.s, plan.n_old, plan.n);
        match plan.kind {
            StepKind::Short => {
                let k = &ks.short;
                let block = constexpr_usize(k, "BLOCK")?;
                let args = order.args(
                    k,
                    &[
                        ("sl_ptr", KernelArg::Ptr(state.sparse_list.ptr(st))),
                        ("len_ptr", KernelArg::Ptr(state.sparse_len.ptr(st))),
                        ("w_ptr", KernelArg::Ptr(state.weight.ptr(st))),
                        ("S", i32_arg("S", s)?),
                    ],
                    false,
                )?;
                // Bounds: ensure_buffers sized sparse_list for rows x s i64, weight for
                // rows x s elements of the weight dtype, sparse_len for rows i64; the grid
                // covers exactly s positions x rows.
                Ok(vec![Launch {
                    kernel: k.clone(),
                    grid: [s.div_ceil(block) as u32, rows as u32, 1],
                    args,
                }])
            }
            StepKind::Chunked { bulk_quantize } => {
                self.chunked(query, key, s, n_old, n, bulk_quantize)
            }
            StepKind::IndexWfill | StepKind::IndexRowFill | StepKind::IndexCompanion => {
                let ik = ks.index.as_ref().ok_or_else(|| not_built("pq_index"))?;
                let companion = plan.kind == StepKind::IndexCompanion;
                let mut named =
                    self.hist_args(query, key, s, n_old, &state.ihist, &state.ihistn)?;
                named.extend([
                    ("bkt_ptr", KernelArg::Ptr(state.bkt.ptr(st))),
                    ("mark_ptr", KernelArg::Ptr(state.mark.ptr(st))),
                    ("ready_ptr", KernelArg::Ptr(state.ready.ptr(st))),
                    ("CAPC", i32_arg("bucket capacity", state.capc)?),
                    ("rows", i32_arg("rows", rows)?),
                    ("fill", KernelArg::I32(i32::from(companion))),
                ]);
                let ix = if companion { &ik.alone } else { &ik.index };
                let iargs = order.args(ix, &named, true)?;
                // Bounds: pq_wfill writes weight elements 0 .. rows x s (ensure_buffers
                // sized weight for that; rows x s < 2^31 checked by plan_step), any grid
                // size. pq_index as pq_hist for hist/histn (here ihist/ihistn, new(): rows x
                // HIST_COMBOS, rows), lvl, lut, codes and the outputs; ensure_buffers sized
                // bkt for rows x HIST_COMBOS x capc (the kernel stores slots < CAPC = capc
                // only) and new() the marks for rows x TP (the kernel's constexpr, kept in
                // IndexKernels) and the arrival counters for rows. Companion fill: pq_index
                // alone (no programmatic dependency), CTA (r, 0) writes row r's weights
                // (r x s .. (r + 1) x s), CTA (r, 1) its heavy ones; the second of the two
                // to arrive on ready[r] rewrites the row's ones and clears it. Else
                // pq_index is a programmatic dependent of pq_wfill (its variant's
                // launch_pdl) and waits for it before any weight; pq_wfill: one CTA per SM,
                // so each leaves room for a pq_index CTA beside it (sm_80: no pq_wfill,
                // each row CTA writes its own row).
                let mut launches = Vec::with_capacity(2);
                if plan.kind == StepKind::IndexWfill {
                    let fill = ik.wfill.as_ref().ok_or_else(|| not_built("pq_wfill"))?;
                    launches.push(Launch {
                        kernel: fill.clone(),
                        grid: [self.sm_count.max(1), 1, 1],
                        args: order.args(fill, &named, true)?,
                    });
                }
                launches.push(Launch {
                    kernel: ix.clone(),
                    grid: [rows as u32, 2, 1],
                    args: iargs,
                });
                Ok(launches)
            }
            StepKind::Hist => {
                let k = ks.hist.as_ref().ok_or_else(|| not_built("pq_hist"))?;
                let named = self.hist_args(query, key, s, n_old, &state.hist, &state.histn)?;
                let args = order.args(k, &named, false)?;
                // Bounds: new() sized hist (rows x HIST_COMBOS), histn (rows), the level bins
                // (rows x HIST_LEVEL_BINS) and the lookup table (rows x M x K); ensure_buffers
                // sized sparse_list (rows x total), weight (rows x s), codes (cap >= n keys); the
                // kernel reads codes j < max(histn, w0) <= n_old (histn only ever holds an
                // earlier step's w0, or 0 after reset_hist) and writes codes n_old .. n.
                // Grid: CTA (r, 0) is row r, CTA (r, 1) quantizes for row r's KV group (first
                // head of the group only; the others exit at once).
                Ok(vec![Launch {
                    kernel: k.clone(),
                    grid: [rows as u32, 2, 1],
                    args,
                }])
            }
            StepKind::Split { parts } => {
                let sp = ks.split.as_ref().ok_or_else(|| not_built("pq_thresh"))?;
                let mut named = self.hist_args(query, key, s, n_old, &state.hist, &state.histn)?;
                named.extend([
                    ("bnd_ptr", KernelArg::Ptr(state.split_bnd.ptr(st))),
                    ("need_ptr", KernelArg::Ptr(state.split_need.ptr(st))),
                    ("flag_ptr", KernelArg::Ptr(state.split_flag.ptr(st))),
                    ("ctr_ptr", KernelArg::Ptr(state.split_ctr.ptr(st))),
                    ("NP", i32_arg("parts per row", parts)?),
                ]);
                // one list for both kernels: each takes the names its signature lists
                let targs = order.args(&sp.thresh, &named, true)?;
                let eargs = order.args(&sp.emit, &named, true)?;
                // Bounds: as pq_hist above for hist/histn/lvl/lut, codes and the outputs; new()
                // sized bnd (rows x 2), need (rows) and the ticket counter (1); hist_lut (rows x M x
                // K) is pq_thresh's output and pq_emit's input;
                // ensure_buffers sized the part flags for rows x cdiv(n, TILE) = rows x parts.
                // pq_thresh (grid as pq_hist's) zeroes the flags and the counter; pq_emit's grid
                // is exactly rows x parts CTAs, each taking one ticket < rows x parts.
                let rows_parts = u32::try_from(rows * parts).map_err(|_| {
                    Error::invalid("emit grid", format!("{rows} rows x {parts} parts"))
                })?;
                Ok(vec![
                    Launch {
                        kernel: sp.thresh.clone(),
                        grid: [rows as u32, 2, 1],
                        args: targs,
                    },
                    Launch {
                        kernel: sp.emit.clone(),
                        grid: [rows_parts, 1, 1],
                        args: eargs,
                    },
                ])
            }
        }
    }

    /// The chunked step's launches: the bulk quantize kernel when `bulk_quantize`, then
    /// `pq_select` over `cdiv(n, CHUNK)` chunks per row.
    fn chunked(
        &self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        s: usize,
        n_old: usize,
        n: usize,
        bulk_quantize: bool,
    ) -> Result<Vec<Launch>> {
        let (ks, state, order) = (self.kernels, self.state, self.order);
        let (st, cfg) = (&state.stream, &state.cfg);
        let (h_kv, d) = (state.shape.h_kv, state.shape.d);
        let (m, kc) = (cfg.m(), cfg.k_centroids());
        let d_s = cfg.d_sub(d);
        let metric_ip = i32::from(cfg.metric == Metric::Ip);
        let mut launches = Vec::with_capacity(2);
        let mut n_old_sel = n_old;
        if bulk_quantize {
            let k = &ks.quantize;
            let args = order.args(
                k,
                &[
                    ("k_ptr", KernelArg::Ptr(key.ptr)),
                    ("cent_ptr", KernelArg::Ptr(state.centroids.device_ptr(st).0)),
                    ("phi_ptr", KernelArg::Ptr(state.phi.device_ptr(st).0)),
                    ("codes_ptr", KernelArg::Ptr(state.codes.ptr(st))),
                    ("k_sb", KernelArg::I64(key.strides[0])),
                    ("k_sh", KernelArg::I64(key.strides[1])),
                    ("k_ss", KernelArg::I64(key.strides[2])),
                    ("H_kv", i32_arg("H_kv", h_kv)?),
                    ("M", i32_arg("M", m)?),
                    ("K", i32_arg("K", kc)?),
                    ("d_s", i32_arg("d_s", d_s)?),
                    ("pos0", i32_arg("pos0", cfg.init_offset + n_old)?),
                    ("t0", i32_arg("t0", n_old)?),
                    ("cap", i32_arg("cap", state.cap)?),
                    ("metric_ip", KernelArg::I32(metric_ip)),
                ],
                false,
            )?;
            // Bounds: the caller vouched (DeviceTensorRef::new) for key positions
            // init_offset + n_old .. s; codes hold cap >= n keys per row (grow_codes);
            // centroids/phi were uploaded with the validated sizes.
            launches.push(Launch {
                kernel: k.clone(),
                grid: [(n - n_old) as u32, (state.shape.b * h_kv) as u32, 1],
                args,
            });
            n_old_sel = n;
        }
        let k = &ks.select;
        let n_chunks = n.div_ceil(ks.chunk);
        let mut named = self.select_args(query, key, s, n_old_sel)?;
        named.extend([
            ("lut_ptr", KernelArg::Ptr(state.lut.ptr(st))),
            ("stage_ptr", KernelArg::Ptr(state.stage.ptr(st))),
            ("cand_ptr", KernelArg::Ptr(state.cand.ptr(st))),
            ("count_ptr", KernelArg::Ptr(state.count.ptr(st))),
        ]);
        let args = order.args(k, &named, false)?;
        // Bounds: ensure_buffers sized lut/stage/cand for rows x n_chunks CTAs, codes for
        // cap >= n keys, sparse_list for rows x total, weight for rows x s, sparse_len
        // and count for rows (count starts at 0 and every row's last CTA resets it); the
        // caller vouched for query (all heads) and the new key positions.
        launches.push(Launch {
            kernel: k.clone(),
            grid: [n_chunks as u32, state.rows() as u32, 1],
            args,
        });
        Ok(launches)
    }

    /// The named arguments both select kernels (`pq_select`, `pq_hist`) take: query and
    /// key views, centroids, phi, the code state, the outputs, strides, shape and config
    /// integers, for a step at `s` whose kernel quantizes the keys `n_old .. n`.
    fn select_args(
        &self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        s: usize,
        n_old: usize,
    ) -> Result<Vec<(&'static str, KernelArg)>> {
        let state = self.state;
        let (st, cfg) = (&state.stream, &state.cfg);
        Ok(vec![
            ("q_ptr", KernelArg::Ptr(query.ptr)),
            ("k_ptr", KernelArg::Ptr(key.ptr)),
            ("cent_ptr", KernelArg::Ptr(state.centroids.device_ptr(st).0)),
            ("phi_ptr", KernelArg::Ptr(state.phi.device_ptr(st).0)),
            ("codes_ptr", KernelArg::Ptr(state.codes.ptr(st))),
            ("sl_ptr", KernelArg::Ptr(state.sparse_list.ptr(st))),
            ("len_ptr", KernelArg::Ptr(state.sparse_len.ptr(st))),
            ("w_ptr", KernelArg::Ptr(state.weight.ptr(st))),
            ("q_sb", KernelArg::I64(query.strides[0])),
            ("q_sh", KernelArg::I64(query.strides[1])),
            ("k_sb", KernelArg::I64(key.strides[0])),
            ("k_sh", KernelArg::I64(key.strides[1])),
            ("k_ss", KernelArg::I64(key.strides[2])),
            ("H", i32_arg("H", state.shape.h)?),
            ("G", i32_arg("G", state.shape.group())?),
            ("M", i32_arg("M", cfg.m())?),
            ("K", i32_arg("K", cfg.k_centroids())?),
            ("d_s", i32_arg("d_s", cfg.d_sub(state.shape.d))?),
            ("S", i32_arg("S", s)?),
            ("n_old", i32_arg("n_old", n_old)?),
            ("cap", i32_arg("cap", state.cap)?),
            ("sink", i32_arg("sink_size", cfg.sink_size)?),
            ("window", i32_arg("window_size", cfg.window_size)?),
            ("heavy", i32_arg("heavy_size", cfg.heavy_size)?),
            ("init_offset", i32_arg("init_offset", cfg.init_offset)?),
            (
                "metric_ip",
                KernelArg::I32(i32::from(cfg.metric == Metric::Ip)),
            ),
        ])
    }

    /// The named arguments of the histogram kernels: [`StepLaunches::select_args`], the
    /// combination counts `hist` / `histn` (the indexed path keeps its own), the rounds'
    /// bins, the lookup table and `bits`.
    fn hist_args(
        &self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        s: usize,
        n_old: usize,
        hist: &DevBuf<i32>,
        histn: &DevBuf<i32>,
    ) -> Result<Vec<(&'static str, KernelArg)>> {
        let state = self.state;
        let st = &state.stream;
        let mut named = self.select_args(query, key, s, n_old)?;
        named.extend([
            ("hist_ptr", KernelArg::Ptr(hist.ptr(st))),
            ("histn_ptr", KernelArg::Ptr(histn.ptr(st))),
            ("lvl_ptr", KernelArg::Ptr(state.hist_lvl.ptr(st))),
            ("lut_ptr", KernelArg::Ptr(state.hist_lut.ptr(st))),
            ("bits", i32_arg("pq_bits", state.cfg.pq_bits as usize)?),
        ]);
        Ok(named)
    }
}

/// Issue one step's launches on `stream`.
pub(crate) fn issue(stream: &Arc<CudaStream>, launches: &[Launch]) -> Result<()> {
    for l in launches {
        // SAFETY: `StepLaunches::build` built these arguments for buffers that
        // `ensure_buffers` sized for this step (see its `Bounds:` comments) and for
        // caller-vouched query and key views; every launch is on this indexer's stream,
        // in order.
        unsafe { l.kernel.launch(stream, l.grid, &l.args)? };
    }
    Ok(())
}
