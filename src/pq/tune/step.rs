//! The decode step's kernels as tuning targets (`pq_emit`, `pq_rsel`, `pq_index`,
//! `pq_quant`, `pq_select`, ...), each timed through the indexer: one whole decode step
//! with the kernel under test at the candidate variant and every other kernel at its
//! current choice.

use super::common::*;
use super::*;
use crate::error::{Error, Result};
use crate::pq::gpu::{DeviceTensorRef, GpuIndexer, LaunchMode};
use crate::pq::{PqConfig, PqInputs, PqOutput, Shape};
use crate::runtime::Runtime;
use crate::tune::bucket::ShapeBucket;
use crate::tune::candidate::{Candidate, CandidateSet};
use crate::tune::procedure::TuneTarget;
use crate::tune::procedure::{compare_exact, input_sets_for, OutputCheck, TimingPlan};
use cudarc::driver::{CudaSlice, CudaStream};
use std::collections::HashMap;
use std::sync::Arc;

// ---------------------------------------------------------------------------------
// any kernel of the decode step, through GpuIndexer

/// What a step target runs: the workload, the select path under which its step launches
/// the kernel under test, the new keys per step, and the table the other kernels' choices
/// come from.
pub(super) struct StepSpec {
    pub workload: StepWorkload,
    pub path: SelectPath,
    pub new_keys: usize,
    pub table: Option<PathBuf>,
}

pub(super) struct SelectState {
    pub(super) stream: Arc<CudaStream>,
    /// Host inputs at the workload's `S` (query, key rows the steps read, centroids);
    /// `codes` is empty: each set has its own.
    pub(super) base: PqInputs,
    pub(super) set_codes: Vec<Vec<i64>>,
    pub(super) _query: CudaSlice<u8>,
    pub(super) _key: CudaSlice<u8>,
    pub(super) q_ref: DeviceTensorRef,
    pub(super) k_ref: DeviceTensorRef,
    pub(super) indexers: HashMap<(String, usize), GpuIndexer>,
    pub(super) oracle: Vec<Option<PqOutput>>,
}

/// One kernel of the decode step on one workload, through the indexer (see the module
/// docs).
pub(super) struct StepTarget {
    pub(super) rt: Arc<Runtime>,
    pub(super) set: CandidateSet,
    pub(super) bucket: ShapeBucket,
    pub(super) spec: StepSpec,
    pub(super) cfg: PqConfig,
    pub(super) shape: Shape,
    pub(super) n_sets: usize,
    pub(super) seed: u64,
    pub(super) state: Option<SelectState>,
    /// Checks that passed by the spec's rule only (outputs not bit-identical).
    pub(super) spec_only: Vec<String>,
}

impl StepTarget {
    pub(super) fn new(
        rt: Arc<Runtime>,
        set: CandidateSet,
        spec: StepSpec,
        l2: u64,
        seed: u64,
    ) -> Result<Self> {
        let (cfg, shape) = (spec.workload.cfg, spec.workload.shape);
        cfg.validate(&shape)?;
        let wt = cfg.weight_dtype;
        let bucket = step_bucket(set.kernel(), &cfg, &shape, rt.device().arch())?;
        let w = spec.workload.clone();
        let me = StepTarget {
            n_sets: 1,
            rt,
            set,
            bucket,
            spec,
            cfg,
            shape,
            seed,
            state: None,
            spec_only: Vec::new(),
        };
        let n = cfg.n_quantized(shape.s);
        let rows = shape.b * shape.h;
        let bytes = shape.b * shape.h_kv * cfg.m() * n
            + rows * shape.s * wt.size_bytes()
            + rows * cfg.total(shape.s) * 8;
        let n_sets = input_sets_for(bytes as u64, l2);
        let me = StepTarget { n_sets, ..me };
        for s in 0..n_sets {
            let ss = me.set_s(s);
            if cfg.is_short(ss) {
                return Err(Error::invalid(
                    "workload",
                    format!(
                        "{w}: S={ss} takes the short path (S <= heavy + init_offset + 1 + K = \
                         {}), where only pq_short runs",
                        cfg.short_threshold(ss)
                    ),
                ));
            }
        }
        Ok(me)
    }

    /// `S` of input set `s` (its `n = S - init_offset` as [`set_n`] says).
    fn set_s(&self, s: usize) -> usize {
        let n = self.cfg.n_quantized(self.shape.s);
        set_n(n, self.bucket.n_align, s, self.n_sets) + self.cfg.init_offset
    }

    /// Cached keys before a step of set `s`: every key but the step's new ones.
    fn set_n_cached(&self, s: usize) -> usize {
        self.cfg
            .n_quantized(self.set_s(s))
            .saturating_sub(self.spec.new_keys)
    }

    fn state(&mut self) -> std::result::Result<&mut SelectState, String> {
        if self.state.is_none() {
            let (cfg, sh) = (self.cfg, self.shape);
            let stream = self.rt.device().new_stream().map_err(err_s)?;
            let n0 = self.set_n_cached(0);
            let mut base = PqInputs::random(&cfg, sh, n0, self.seed).map_err(err_s)?;
            let mut set_codes = Vec::with_capacity(self.n_sets);
            for s in 0..self.n_sets {
                let nc = self.set_n_cached(s);
                if s == 0 {
                    set_codes.push(std::mem::take(&mut base.codes));
                } else {
                    let len = sh.b * nc * sh.h_kv * cfg.m();
                    set_codes.push(codes_vec(len, cfg.k_centroids(), self.seed, 100 + s as u64));
                }
            }
            // Query: all of it. Key [B, H_kv, S, D]: zeros, then the rows the steps read
            // (positions init_offset + N_cached .. S of every set), one copy per (b, g).
            let qt = cfg.input_dtype;
            let query = stream
                .clone_htod(&to_bytes(&base.query, qt))
                .map_err(|e| format!("uploading query: {e}"))?;
            let es = qt.size_bytes();
            let mut key = stream
                .alloc_zeros::<u8>(sh.b * sh.h_kv * sh.s * sh.d * es)
                .map_err(|e| format!("allocating key [B, H_kv, S, D]: {e}"))?;
            let p0 = (0..self.n_sets)
                .map(|s| cfg.init_offset + self.set_n_cached(s))
                .min()
                .unwrap_or(sh.s)
                .min(sh.s);
            for bg in 0..sh.b * sh.h_kv {
                let lo = (bg * sh.s + p0) * sh.d;
                let hi = (bg * sh.s + sh.s) * sh.d;
                let bytes = to_bytes(&base.key[lo..hi], qt);
                stream
                    .memcpy_htod(&bytes, &mut key.slice_mut(lo * es..hi * es))
                    .map_err(|e| format!("uploading key rows: {e}"))?;
            }
            stream.synchronize().map_err(err_s)?;
            let q_ref = DeviceTensorRef::new(
                dbuf(&query, &stream),
                qt,
                [(sh.h * sh.d) as i64, sh.d as i64, 0],
            )
            .map_err(err_s)?;
            let k_ref = DeviceTensorRef::new(
                dbuf(&key, &stream),
                qt,
                [
                    (sh.h_kv * sh.s * sh.d) as i64,
                    (sh.s * sh.d) as i64,
                    sh.d as i64,
                ],
            )
            .map_err(err_s)?;
            self.state = Some(SelectState {
                stream,
                base,
                set_codes,
                _query: query,
                _key: key,
                q_ref,
                k_ref,
                indexers: HashMap::new(),
                oracle: (0..self.n_sets).map(|_| None).collect(),
            });
        }
        Ok(self.state.as_mut().expect("set above"))
    }

    /// The indexer of candidate `id` on input set `s` (created at first use: centroids
    /// and the set's codes imported, buffers for the set's `S` allocated).
    fn indexer(&mut self, id: &str, s: usize) -> std::result::Result<(), String> {
        let (cfg, sh) = (self.cfg, self.shape);
        let (ss, nc) = (self.set_s(s), self.set_n_cached(s));
        let rt = self.rt.clone();
        let (spec_table, path) = (self.spec.table.clone(), self.spec.path);
        let kernel = self.set.kernel().to_string();
        let st = self.state()?;
        if st.indexers.contains_key(&(id.to_string(), s)) {
            return Ok(());
        }
        // the candidate under test; every other kernel at its current choice
        let base = match &spec_table {
            Some(p) => KernelChoice::new().with_table_file(p),
            None => KernelChoice::new(),
        };
        let choice = base.with_variant(kernel, id);
        let mut ix = GpuIndexer::new(
            rt,
            st.stream.clone(),
            cfg,
            sh,
            &st.base.centroids,
            st.base.phi.as_deref(),
            &choice,
        )
        .map_err(err_s)?;
        ix.set_select_path(path);
        ix.import_codes(&st.set_codes[s], nc).map_err(err_s)?;
        ix.prepare(ss).map_err(err_s)?;
        st.indexers.insert((id.to_string(), s), ix);
        Ok(())
    }

    /// Host inputs of set `s` for the spec check: the base inputs at the set's `S`, with
    /// only the key rows the step reads copied (the others stay 0.0, never read).
    fn check_inputs(&mut self, s: usize) -> std::result::Result<PqInputs, String> {
        let (cfg, sh) = (self.cfg, self.shape);
        let (ss, nc) = (self.set_s(s), self.set_n_cached(s));
        let st = self.state()?;
        let b = &st.base;
        let mut key = vec![0f32; sh.b * sh.h_kv * ss * sh.d];
        let p0 = (cfg.init_offset + nc).min(ss);
        for bg in 0..sh.b * sh.h_kv {
            let src = (bg * sh.s + p0) * sh.d..(bg * sh.s + ss) * sh.d;
            let dst = (bg * ss + p0) * sh.d..(bg * ss + ss) * sh.d;
            key[dst].copy_from_slice(&b.key[src]);
        }
        Ok(PqInputs {
            shape: Shape { s: ss, ..sh },
            query: b.query.clone(),
            key,
            centroids: b.centroids.clone(),
            codes: st.set_codes[s].clone(),
            n_cached: nc,
            phi: b.phi.clone(),
        })
    }
}

/// Compare two step outputs exactly (integers, and weights bit for bit).
pub(super) fn compare_outputs(want: &PqOutput, got: &PqOutput) -> OutputCheck {
    if (want.s, want.total, want.n_cached) != (got.s, got.total, got.n_cached) {
        return OutputCheck::Differs(format!(
            "(S, total, n_cached) = {:?}, expected {:?}",
            (got.s, got.total, got.n_cached),
            (want.s, want.total, want.n_cached)
        ));
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    for (name, r) in [
        (
            "sparse_len",
            compare_exact(&want.sparse_len, &got.sparse_len),
        ),
        (
            "sparse_list",
            compare_exact(&want.sparse_list, &got.sparse_list),
        ),
        (
            "weight_list",
            compare_exact(&bits(&want.weight_list), &bits(&got.weight_list)),
        ),
        ("codes", compare_exact(&want.codes, &got.codes)),
    ] {
        if let OutputCheck::Differs(d) = r {
            return OutputCheck::Differs(format!("{name}: {d}"));
        }
    }
    OutputCheck::Matches
}

impl TuneTarget for StepTarget {
    fn candidates(&self) -> &CandidateSet {
        &self.set
    }
    fn bucket(&self) -> &ShapeBucket {
        &self.bucket
    }
    fn workload(&self) -> String {
        let mut s = format!(
            "{}; decode steps through GpuIndexer (select path {:?}, query {}, weights {}, \
             metric {}), {} new key(s) per step, the other kernels at their current choice; \
             input set {} has S={} (odd n, for the align1 bucket)",
            self.spec.workload,
            self.spec.path,
            self.cfg.input_dtype,
            self.cfg.weight_dtype,
            self.cfg.metric,
            self.spec.new_keys,
            self.n_sets - 1,
            self.set_s(self.n_sets - 1)
        );
        if !self.spec_only.is_empty() {
            s.push_str(&format!(
                "; outputs not bit-identical to the default but passing the spec's check: {}",
                self.spec_only.join(", ")
            ));
        }
        s
    }
    fn timer(&self) -> String {
        "CUDA events around back-to-back decode steps (CUDA-graph replay of the whole \
         step), no host sync between samples"
            .into()
    }
    fn input_sets(&self) -> usize {
        self.n_sets
    }
    fn run(&mut self, c: &Candidate, s: usize) -> std::result::Result<(), String> {
        self.indexer(&c.id, s)?;
        let (ss, nc) = (self.set_s(s), self.set_n_cached(s));
        let st = self.state()?;
        let (q, k) = (st.q_ref, st.k_ref);
        let ix = st
            .indexers
            .get_mut(&(c.id.clone(), s))
            .expect("created above");
        ix.rewind(nc);
        ix.poison_outputs().map_err(err_s)?;
        ix.step(&q, &k, ss, LaunchMode::Launch).map_err(err_s)?;
        ix.synchronize()
            .map_err(|e| format!("running {}: {e}", c.id))?;
        if c.is_default && st.oracle[s].is_none() {
            st.oracle[s] = Some(ix.download().map_err(err_s)?);
        }
        Ok(())
    }
    fn output_matches_default(
        &mut self,
        c: &Candidate,
        s: usize,
    ) -> std::result::Result<OutputCheck, String> {
        let st = self.state()?;
        let got = st
            .indexers
            .get(&(c.id.clone(), s))
            .ok_or_else(|| format!("{} has not run on input set {s}", c.id))?
            .download()
            .map_err(err_s)?;
        let want = st.oracle[s].as_ref().ok_or_else(|| {
            format!("no oracle for input set {s} (the default has not run on it)")
        })?;
        let exact = compare_outputs(want, &got);
        let OutputCheck::Differs(diff) = exact else {
            return Ok(OutputCheck::Matches);
        };
        if c.is_default {
            return Ok(OutputCheck::Differs(diff));
        }
        let cfg = self.cfg;
        let inputs = self.check_inputs(s)?;
        let report = crate::pq::check(&cfg, &inputs, &got);
        if report.passed() {
            self.spec_only.push(format!("{} (set {s}: {diff})", c.id));
            Ok(OutputCheck::Matches)
        } else {
            Ok(OutputCheck::Differs(format!(
                "{diff}; and the spec's check fails: {report}"
            )))
        }
    }
    fn time(&mut self, c: &Candidate, plan: &TimingPlan) -> std::result::Result<Vec<f64>, String> {
        for s in 0..self.n_sets {
            self.indexer(&c.id, s)?;
        }
        let n_sets = self.n_sets;
        let params: Vec<(usize, usize)> = (0..n_sets)
            .map(|s| (self.set_s(s), self.set_n_cached(s)))
            .collect();
        let dev = self.rt.device().clone();
        let st = self.state()?;
        let stream = st.stream.clone();
        let (q, k) = (st.q_ref, st.k_ref);
        let mut ixs: Vec<&mut GpuIndexer> = Vec::with_capacity(n_sets);
        {
            let mut by_set: Vec<(usize, &mut GpuIndexer)> = st
                .indexers
                .iter_mut()
                .filter(|((id, _), _)| *id == c.id)
                .map(|((_, s), ix)| (*s, ix))
                .collect();
            by_set.sort_by_key(|(s, _)| *s);
            ixs.extend(by_set.into_iter().map(|(_, ix)| ix));
        }
        let mut step = |s: usize| -> std::result::Result<(), String> {
            let (ss, nc) = params[s];
            let ix = &mut ixs[s];
            ix.rewind(nc);
            ix.step(&q, &k, ss, LaunchMode::Graph)
                .map(|_| ())
                .map_err(err_s)
        };
        // capture every set's step graph before anything is timed
        for s in 0..n_sets {
            step(s)?;
        }
        time_with_events(&dev, &stream, plan, &mut step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_names() {
        assert_eq!(kind_of("pq_score_kernel_v6"), Some(Kind::ScoreV6));
        assert_eq!(
            kind_of("pq_score_lut.q_bf16"),
            Some(Kind::ScoreLut(crate::pq::DType::BF16))
        );
        for k in [
            "pq_select.h256.q_fp16.w_fp32",
            "pq_emit.m2.w_bf16",
            "pq_rsel.m4.q_bf16",
            "pq_quant.a16.k_bf16",
            "pq_index.m2.q_fp32.w_fp32",
            "pq_wfill.w_fp32",
            "pq_short.w_fp32",
        ] {
            assert_eq!(kind_of(k), Some(Kind::Step), "{k}");
        }
        assert_eq!(kind_of("pq_emit."), None);
        assert_eq!(kind_of("pq_km_assign.k_fp32"), None);
        assert_eq!(kind_of("axpy_kernel"), None);
    }

    #[test]
    fn last_set_has_odd_n() {
        assert_eq!(set_n(31872, 1, 0, 5), 31872);
        assert_eq!(set_n(31872, 1, 4, 5), 31871);
        assert_eq!(set_n(31871, 1, 4, 5), 31871);
        assert_eq!(set_n(31872, 1, 0, 1), 31872);
        assert_eq!(set_n(31872, 128, 1, 2), 31872);
    }

    #[test]
    fn generated_codes_are_in_range_and_varied() {
        let c: Vec<i64> = codes_vec(200_000, 64, 7, 3);
        assert!(c.iter().all(|&x| (0..64).contains(&x)));
        let mut seen = [false; 64];
        c.iter().for_each(|&x| seen[x as usize] = true);
        assert!(seen.iter().all(|&b| b));
        let u: Vec<u8> = codes_vec(1000, 256, 7, 3);
        assert!(u.iter().any(|&x| x > 127));
        let v = normal_vec(100_000, 1, 1, DType::F32);
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.03,
            "mean {mean} var {var}"
        );
    }

    #[test]
    fn step_bucket_matches_the_workload_features() {
        let w: StepWorkload = "reference".parse().unwrap();
        let b = step_bucket("pq_index.m2.q_fp32.w_fp32", &w.cfg, &w.shape, 90).unwrap();
        assert_eq!(
            b.to_string(),
            "b1:pq_index.m2.q_fp32.w_fp32:fp32+fp32+fp32:sm90:rows<=32:n<=32768:align1:ds64:\
             K64:heavy<=128:M2"
        );
        let p: StepWorkload = "practical-m2b8".parse().unwrap();
        assert_eq!(p.cfg.pq_bits, 8);
        assert_eq!(p.shape.h_kv, 8);
        let names: Vec<String> = default_workloads().into_iter().map(|w| w.name).collect();
        assert_eq!(
            names,
            [
                "practical-m2b6",
                "practical-m2b8",
                "practical-m4b8",
                "reference"
            ]
        );
        let e = "practical-m9"
            .parse::<StepWorkload>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("practical-m2b8"), "{e}");
        use crate::pq::Workload;
        let s = score_bucket(SCORE_V6, "fp32", &Workload::large(), 90).unwrap();
        assert_eq!(
            s.to_string(),
            "b1:pq_score_kernel_v6:fp32:sm90:rows<=128:n<=131072:align1:ds64:K64:heavy<=0"
        );
    }
}
