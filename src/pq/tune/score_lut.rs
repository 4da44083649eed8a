//! The `pq_score_lut` tuning target.

use super::common::*;
use super::score_v6::{read_f32, Prepared, ScoreDims};
use super::*;
use crate::abi::KernelArg;
use crate::driver::Kernel;
use crate::error::Result;
use crate::pq::DType;
use crate::pq::Workload;
use crate::runtime::Runtime;
use crate::tune::bucket::ShapeBucket;
use crate::tune::candidate::{Candidate, CandidateSet};
use crate::tune::procedure::TuneTarget;
use crate::tune::procedure::{compare_f32, input_sets_for, OutputCheck, TimingPlan};
use cudarc::driver::{CudaSlice, CudaStream};
use std::sync::Arc;

// ---------------------------------------------------------------------------------
// pq_score_lut.q_<qt>

pub(super) struct LutSet {
    pub(super) codes: CudaSlice<u8>,
    pub(super) scores: CudaSlice<f32>,
    pub(super) n: usize,
}

pub(super) struct LutState {
    pub(super) stream: Arc<CudaStream>,
    pub(super) query: CudaSlice<u8>,
    pub(super) centroids: CudaSlice<f32>,
    pub(super) sets: Vec<LutSet>,
    pub(super) oracle: Vec<Option<Vec<f32>>>,
    pub(super) poison: Vec<f32>,
}

/// `pq_score_lut.q_<qt>` on one workload (see the module docs).
pub(super) struct ScoreLutTarget {
    pub(super) rt: Arc<Runtime>,
    pub(super) set: CandidateSet,
    pub(super) bucket: ShapeBucket,
    pub(super) workload: Workload,
    pub(super) qt: DType,
    pub(super) d: ScoreDims,
    pub(super) cap: usize,
    pub(super) n_sets: usize,
    pub(super) seed: u64,
    pub(super) state: Option<LutState>,
}

impl ScoreLutTarget {
    pub(super) fn new(
        rt: Arc<Runtime>,
        set: CandidateSet,
        w: &Workload,
        qt: DType,
        l2: u64,
        seed: u64,
    ) -> Result<Self> {
        let d = ScoreDims::of(w);
        let kernel = set.kernel().to_string();
        let bucket = score_bucket(&kernel, qt.as_str(), w, rt.device().arch())?;
        let cap = d.n.div_ceil(16) * 16;
        let bytes = d.b * d.h_kv * d.m * cap + d.b * d.h * d.n * 4;
        Ok(ScoreLutTarget {
            n_sets: input_sets_for(bytes as u64, l2),
            rt,
            set,
            bucket,
            workload: w.clone(),
            qt,
            d,
            cap,
            seed,
            state: None,
        })
    }

    fn state(&mut self) -> std::result::Result<&mut LutState, String> {
        if self.state.is_none() {
            let d = self.d;
            let stream = self.rt.device().new_stream().map_err(err_s)?;
            let q = normal_vec(d.b * d.h * d.m * d.ds, self.seed, 1, self.qt);
            let query = stream
                .clone_htod(&to_bytes(&q, self.qt))
                .map_err(|e| format!("uploading query: {e}"))?;
            let centroids = stream
                .clone_htod(&normal_vec(
                    d.b * d.h_kv * d.m * d.k * d.ds,
                    self.seed,
                    2,
                    DType::F32,
                ))
                .map_err(|e| format!("uploading centroids: {e}"))?;
            let mut sets = Vec::with_capacity(self.n_sets);
            for s in 0..self.n_sets {
                let codes: Vec<u8> =
                    codes_vec(d.b * d.h_kv * d.m * self.cap, d.k, self.seed, 10 + s as u64);
                let codes = stream
                    .clone_htod(&codes)
                    .map_err(|e| format!("uploading codes of input set {s}: {e}"))?;
                let scores = stream
                    .alloc_zeros::<f32>(d.b * d.h * d.n)
                    .map_err(|e| format!("allocating scores of input set {s}: {e}"))?;
                sets.push(LutSet {
                    codes,
                    scores,
                    n: set_n(d.n, self.bucket.n_align, s, self.n_sets),
                });
            }
            stream.synchronize().map_err(err_s)?;
            self.state = Some(LutState {
                stream,
                query,
                centroids,
                sets,
                oracle: vec![None; self.n_sets],
                poison: vec![f32::NAN; d.b * d.h * d.n],
            });
        }
        Ok(self.state.as_mut().expect("set above"))
    }
}

/// The grid and arguments of a LUT-kernel launch on input set `s` of `st`.
pub(super) fn lut_args(
    k: &Kernel,
    d: &ScoreDims,
    cap: usize,
    st: &LutState,
    s: usize,
) -> std::result::Result<Prepared, String> {
    let set = &st.sets[s];
    let block = constexpr(k, "BLOCK")?;
    let dd = d.m * d.ds;
    let args = named_args(
        k,
        &[
            (
                "q_ptr",
                KernelArg::Buf(dbuf(&st.query, &st.stream).as_dtype(ptr_dtype(k, "q_ptr")?)),
            ),
            ("cent_ptr", KernelArg::Buf(dbuf(&st.centroids, &st.stream))),
            ("codes_ptr", KernelArg::Buf(dbuf(&set.codes, &st.stream))),
            ("scores_ptr", KernelArg::Buf(dbuf(&set.scores, &st.stream))),
            ("q_sb", i64a(d.h * dd)),
            ("q_sh", i64a(dd)),
            ("H", i32a("H", d.h)?),
            ("G", i32a("G", d.h / d.h_kv)?),
            ("M", i32a("M", d.m)?),
            ("K", i32a("K", d.k)?),
            ("d_s", i32a("d_s", d.ds)?),
            ("d_c", i32a("d_c", d.ds)?),
            ("n", i32a("n", set.n)?),
            ("cap", i32a("cap", cap)?),
        ],
    )?;
    let grid = [
        u32::try_from(set.n.div_ceil(block.max(1))).map_err(err_s)?,
        u32::try_from(d.b * d.h).map_err(err_s)?,
        1,
    ];
    Ok((grid, args))
}

/// Launch `k` with `p`, prepared by [`lut_args`] for `k` on `st`.
pub(super) fn launch_lut(
    k: &Kernel,
    st: &LutState,
    p: &Prepared,
) -> std::result::Result<(), String> {
    // Bounds: `p` was built by lut_args from this state's buffers: query [B,H,D] in the
    // kernel's dtype, centroids [B,H_kv,M,K,d_s] fp32, codes u8 [B,H_kv,M,cap] and
    // scores [B*H, N >= n] are allocations of this state, alive until it is dropped; the
    // kernel reads codes j < cap, writes scores j < n of each row (row stride n <= N),
    // masks d >= d_s and c >= K; everything runs on st.stream only.
    k.launch(&st.stream, p.0, &p.1).map_err(err_s)
}

impl TuneTarget for ScoreLutTarget {
    fn candidates(&self) -> &CandidateSet {
        &self.set
    }
    fn bucket(&self) -> &ShapeBucket {
        &self.bucket
    }
    fn workload(&self) -> String {
        format!(
            "{}; scores fp32 [B*H, n={}] from u8 codes [B, H_kv, M, cap={}], query {}; \
             input set {} has n={} (odd, for the align1 bucket)",
            self.workload,
            self.d.n,
            self.cap,
            self.qt,
            self.n_sets - 1,
            set_n(self.d.n, self.bucket.n_align, self.n_sets - 1, self.n_sets)
        )
    }
    fn timer(&self) -> String {
        "CUDA events on one stream, back-to-back launches, no host sync between samples".into()
    }
    fn input_sets(&self) -> usize {
        self.n_sets
    }
    fn run(&mut self, c: &Candidate, s: usize) -> std::result::Result<(), String> {
        let k = self.rt.kernel(&c.id).map_err(err_s)?;
        let (d, cap) = (self.d, self.cap);
        let st = self.state()?;
        let stream = st.stream.clone();
        stream
            .memcpy_htod(&st.poison, &mut st.sets[s].scores)
            .map_err(|e| format!("poisoning scores: {e}"))?;
        let p = lut_args(&k, &d, cap, st, s)?;
        launch_lut(&k, st, &p)?;
        stream
            .synchronize()
            .map_err(|e| format!("running {}: {e}", c.id))?;
        if c.is_default && st.oracle[s].is_none() {
            st.oracle[s] = Some(read_f32(&stream, &st.sets[s].scores)?);
        }
        Ok(())
    }
    fn output_matches_default(
        &mut self,
        _c: &Candidate,
        s: usize,
    ) -> std::result::Result<OutputCheck, String> {
        let st = self.state()?;
        let got = read_f32(&st.stream, &st.sets[s].scores)?;
        let want = st.oracle[s].as_ref().ok_or_else(|| {
            format!("no oracle for input set {s} (the default has not run on it)")
        })?;
        Ok(compare_f32(want, &got, SCORE_RTOL, SCORE_ATOL))
    }
    fn time(&mut self, c: &Candidate, plan: &TimingPlan) -> std::result::Result<Vec<f64>, String> {
        let k = self.rt.kernel(&c.id).map_err(err_s)?;
        let (d, cap) = (self.d, self.cap);
        let dev = self.rt.device().clone();
        let st = self.state()?;
        let stream = st.stream.clone();
        let st: &LutState = st;
        let prepared = (0..st.sets.len())
            .map(|s| lut_args(&k, &d, cap, st, s))
            .collect::<std::result::Result<Vec<_>, String>>()?;
        time_with_events(&dev, &stream, plan, &mut |s| {
            launch_lut(&k, st, &prepared[s])
        })
    }
}
