//! The `pq_score_kernel_v6` tuning target.

use super::common::*;
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
// pq_score_kernel_v6

#[derive(Debug, Clone, Copy)]
pub(super) struct ScoreDims {
    pub(super) b: usize,
    pub(super) h: usize,
    pub(super) h_kv: usize,
    pub(super) m: usize,
    pub(super) ds: usize,
    pub(super) k: usize,
    pub(super) n: usize,
}

impl ScoreDims {
    pub(super) fn of(w: &Workload) -> Self {
        ScoreDims {
            b: w.batch as usize,
            h: w.heads as usize,
            h_kv: w.kv_heads as usize,
            m: w.subvectors as usize,
            ds: (w.head_dim / w.subvectors) as usize,
            k: 1usize << w.bits,
            n: w.n_keys() as usize,
        }
    }
}

pub(super) struct ScoreSet {
    pub(super) codes: CudaSlice<i64>,
    pub(super) scores: CudaSlice<f32>,
    pub(super) n: usize,
}

pub(super) struct ScoreV6State {
    pub(super) stream: Arc<CudaStream>,
    pub(super) query: CudaSlice<f32>,
    pub(super) centroids: CudaSlice<f32>,
    pub(super) sets: Vec<ScoreSet>,
    pub(super) oracle: Vec<Option<Vec<f32>>>,
    pub(super) poison: Vec<f32>,
}

/// `pq_score_kernel_v6` on one workload (see the module docs).
pub(super) struct ScoreV6Target {
    pub(super) rt: Arc<Runtime>,
    pub(super) set: CandidateSet,
    pub(super) bucket: ShapeBucket,
    pub(super) workload: Workload,
    pub(super) d: ScoreDims,
    pub(super) n_sets: usize,
    pub(super) seed: u64,
    pub(super) state: Option<ScoreV6State>,
}

impl ScoreV6Target {
    pub(super) fn new(
        rt: Arc<Runtime>,
        set: CandidateSet,
        w: &Workload,
        l2: u64,
        seed: u64,
    ) -> Result<Self> {
        let d = ScoreDims::of(w);
        let bucket = score_bucket(SCORE_V6, "fp32", w, rt.device().arch())?;
        let rows = d.b * d.h;
        let bytes = rows * d.n * (d.m * 8 + 4) + rows * d.m * (d.k + 1) * d.ds * 4;
        Ok(ScoreV6Target {
            n_sets: input_sets_for(bytes as u64, l2),
            rt,
            set,
            bucket,
            workload: w.clone(),
            d,
            seed,
            state: None,
        })
    }

    fn state(&mut self) -> std::result::Result<&mut ScoreV6State, String> {
        if self.state.is_none() {
            let d = self.d;
            let stream = self.rt.device().new_stream().map_err(err_s)?;
            let up = |v: &[f32], what: &str| {
                stream
                    .clone_htod(v)
                    .map_err(|e| format!("uploading {what}: {e}"))
            };
            let query = up(
                &normal_vec(d.b * d.h * d.m * d.ds, self.seed, 1, DType::F32),
                "query",
            )?;
            let centroids = up(
                &normal_vec(d.b * d.h * d.m * d.k * d.ds, self.seed, 2, DType::F32),
                "centroids",
            )?;
            let mut sets = Vec::with_capacity(self.n_sets);
            for s in 0..self.n_sets {
                let codes: Vec<i64> =
                    codes_vec(d.b * d.n * d.h * d.m, d.k, self.seed, 10 + s as u64);
                let codes = stream
                    .clone_htod(&codes)
                    .map_err(|e| format!("uploading codes of input set {s}: {e}"))?;
                let scores = stream
                    .alloc_zeros::<f32>(d.b * d.h * d.n)
                    .map_err(|e| format!("allocating scores of input set {s}: {e}"))?;
                sets.push(ScoreSet {
                    codes,
                    scores,
                    n: set_n(d.n, self.bucket.n_align, s, self.n_sets),
                });
            }
            stream.synchronize().map_err(err_s)?;
            self.state = Some(ScoreV6State {
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

/// A launch prepared for one input set: Triton grid and arguments in signature order.
pub(super) type Prepared = ([u32; 3], Vec<KernelArg>);

/// The grid and arguments of a v6 launch on input set `s` of `st`.
pub(super) fn v6_args(
    k: &Kernel,
    d: &ScoreDims,
    st: &ScoreV6State,
    s: usize,
) -> std::result::Result<Prepared, String> {
    let set = &st.sets[s];
    let bk = constexpr(k, "BLOCK_KEYS")?;
    let (b, h, m, ds, kk, n) = (d.b, d.h, d.m, d.ds, d.k, d.n);
    let args = named_args(
        k,
        &[
            ("queries_ptr", KernelArg::Buf(dbuf(&st.query, &st.stream))),
            (
                "centroids_ptr",
                KernelArg::Buf(dbuf(&st.centroids, &st.stream)),
            ),
            ("codebook_ptr", KernelArg::Buf(dbuf(&set.codes, &st.stream))),
            ("scores_ptr", KernelArg::Buf(dbuf(&set.scores, &st.stream))),
            ("b", i32a("B", b)?),
            ("h", i32a("H", h)?),
            ("n_subvec", i32a("M", m)?),
            ("subvec_d", i32a("d_s", ds)?),
            ("n_clustered", i32a("n", set.n)?),
            ("q_stride_b", i64a(h * m * ds)),
            ("q_stride_h", i64a(m * ds)),
            ("q_stride_subvec", i64a(ds)),
            ("q_stride_d", i64a(1)),
            ("c_stride_b", i64a(h * m * kk * ds)),
            ("c_stride_h", i64a(m * kk * ds)),
            ("c_stride_subvec", i64a(kk * ds)),
            ("c_stride_cent", i64a(ds)),
            ("c_stride_d", i64a(1)),
            // upstream codes [B, N, H, M] seen as [B, H, M, N]
            ("cb_stride_b", i64a(n * h * m)),
            ("cb_stride_h", i64a(m)),
            ("cb_stride_subvec", i64a(1)),
            ("cb_stride_clustered", i64a(h * m)),
            ("s_stride_b", i64a(h * n)),
            ("s_stride_h", i64a(n)),
            ("s_stride_clustered", i64a(1)),
        ],
    )?;
    let programs = b * h * set.n.div_ceil(bk.max(1));
    Ok(([u32::try_from(programs).map_err(err_s)?, 1, 1], args))
}

/// Launch `k` with `p`, prepared by [`v6_args`] for `k` on `st`.
pub(super) fn launch_v6(
    k: &Kernel,
    st: &ScoreV6State,
    p: &Prepared,
) -> std::result::Result<(), String> {
    // Bounds: `p` was built by v6_args from this state's buffers: query [B,H,M,d_s],
    // centroids [B,H,M,K,d_s], codes [B,N,H,M] (values in 0..K) and scores [B,H,N] are
    // allocations of this state, alive until it is dropped (run and time synchronize
    // the stream before returning); v6_args's strides describe exactly those layouts,
    // the kernel masks keys >= n_clustered (<= N) and d >= d_s, and every launch is on
    // st.stream, the only stream using them.
    k.launch(&st.stream, p.0, &p.1).map_err(err_s)
}

pub(super) fn read_f32(
    stream: &Arc<CudaStream>,
    buf: &CudaSlice<f32>,
) -> std::result::Result<Vec<f32>, String> {
    let v = stream
        .clone_dtoh(buf)
        .map_err(|e| format!("downloading scores: {e}"))?;
    stream.synchronize().map_err(err_s)?;
    Ok(v)
}

impl TuneTarget for ScoreV6Target {
    fn candidates(&self) -> &CandidateSet {
        &self.set
    }
    fn bucket(&self) -> &ShapeBucket {
        &self.bucket
    }
    fn workload(&self) -> String {
        format!(
            "{}; scores fp32 [B, H, n={}] from int64 codes [B, N, H, M]{}; input set {} \
             has n={} (odd, for the align1 bucket)",
            self.workload,
            self.d.n,
            if self.d.h != self.d.h_kv {
                " (GQA expanded to H heads)"
            } else {
                ""
            },
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
        let d = self.d;
        let st = self.state()?;
        let stream = st.stream.clone();
        stream
            .memcpy_htod(&st.poison, &mut st.sets[s].scores)
            .map_err(|e| format!("poisoning scores: {e}"))?;
        let p = v6_args(&k, &d, st, s)?;
        launch_v6(&k, st, &p)?;
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
        let d = self.d;
        let dev = self.rt.device().clone();
        let st = self.state()?;
        let stream = st.stream.clone();
        let st: &ScoreV6State = st;
        let prepared = (0..st.sets.len())
            .map(|s| v6_args(&k, &d, st, s))
            .collect::<std::result::Result<Vec<_>, String>>()?;
        time_with_events(&dev, &stream, plan, &mut |s| {
            launch_v6(&k, st, &prepared[s])
        })
    }
}
