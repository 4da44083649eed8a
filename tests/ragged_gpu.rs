//! Ragged batches on the GPU (spec "Ragged batches"; the indexed path,
//! `kernels_triton/pq_rgindex.py`, and the split histogram path,
//! `kernels_triton/pq_rgsplit.py`, each forced where the config allows it; the radix path,
//! `kernels_triton/pq_ragged.py`, for the other configs and where forced):
//! `GpuIndexer::step_ragged` / `step_ragged_device` against the CPU reference by the
//! ragged checker, outputs poisoned first, each test asserting which path ran. Equal
//! lengths give the fixed-`S` step's outputs bit for bit on every path (well-separated
//! inputs); lengths 1, `K`, the short threshold and `S_alloc` beside long rows; per-row
//! `N_cached` and multi-token rows; ratio sizes and 16-bit weights; a decode loop replayed
//! from one captured graph whose lengths change in a device buffer, rows over many emit
//! parts; more rows than one round of threshold CTAs; rows whose counts are lowered
//! mid-loop (the histogram reset on the device) and whose lengths shrink; the path
//! switched between steps of one loop; refusals naming the row. Skips with a visible message without a GPU.

mod common;

use std::sync::Arc;

use tritonrt::pq::gpu::{DeviceInputs, GpuIndexer, KernelChoice, LaunchMode};
use tritonrt::pq::plan::index_built_for;
use tritonrt::pq::ragged::{check_ragged, RaggedInputs, RaggedOutput, RaggedPath};
use tritonrt::pq::{DType, PqConfig, PqInputs, Shape, Size};
use tritonrt::runtime::Runtime;

fn runtime() -> Option<Arc<Runtime>> {
    common::gpu_runtime("ragged GPU tests")
}

fn seed() -> u64 {
    common::test_seed()
}

fn cfg() -> PqConfig {
    PqConfig {
        sink_size: Size::Count(16),
        window_size: Size::Count(32),
        heavy_size: Size::Count(64),
        init_offset: 16,
        pq_bits: 4,
        ..PqConfig::reference_workload()
    }
}

fn shape(b: usize, s: usize) -> Shape {
    Shape {
        b,
        h: 8,
        h_kv: 2,
        s,
        d: 64,
    }
}

/// An indexer holding `x`'s codebook and codes, each row at its own count, outputs
/// poisoned, and the inputs on the device (keys from the fewest codes any row holds).
fn setup(rt: &Arc<Runtime>, c: &PqConfig, x: &RaggedInputs) -> (GpuIndexer, DeviceInputs) {
    common::ragged_indexer(rt, c, x, None).expect("ragged indexer")
}

/// [`setup`] with the ragged path forced to `path`.
fn setup_on(
    rt: &Arc<Runtime>,
    c: &PqConfig,
    x: &RaggedInputs,
    path: RaggedPath,
) -> (GpuIndexer, DeviceInputs) {
    common::ragged_indexer(rt, c, x, Some(path)).expect("ragged indexer on the forced path")
}

/// The histogram paths a config takes: indexed (where `pq_index` applies) and split.
fn hist_paths(c: &PqConfig) -> Vec<RaggedPath> {
    if index_built_for(c) {
        vec![RaggedPath::Index, RaggedPath::Split]
    } else {
        vec![RaggedPath::Split]
    }
}

fn ragged(c: &PqConfig, x: PqInputs, lens: &[usize], ncs: &[usize]) -> RaggedInputs {
    let l: Vec<i64> = lens.iter().map(|&v| v as i64).collect();
    let n: Vec<i64> = ncs.iter().map(|&v| v as i64).collect();
    RaggedInputs::new(c, x, &l, Some(&n)).expect("ragged inputs")
}

fn assert_checked(c: &PqConfig, x: &RaggedInputs, out: &RaggedOutput, exact: bool, what: &str) {
    let opts = common::check_options(exact);
    let report = check_ragged(c, x, out, &opts);
    assert!(report.passed(), "{what}: {report}");
}

/// Equal lengths are the fixed-`S` step: same sparse_list, sparse_len, weight_list and
/// codes, bit for bit, on well-separated inputs (configs taking the fixed step's
/// histogram, indexed and chunked paths), and the ragged checker passes: on the split
/// path where the combination histogram applies (M = 2 bits 4, M = 1 bits 8), and there
/// also on the radix path forced; on the radix path for M = 4 bits 6 (`K^M > 4096`),
/// where forcing the split path is refused.
#[test]
fn equal_lengths_match_the_fixed_step_bit_for_bit() {
    let Some(rt) = runtime() else { return };
    let base = cfg();
    let cases = [
        ("m2_bits4", base, shape(2, 3000)),
        (
            "m1_bits8",
            PqConfig {
                pq_group_factor: 1,
                pq_bits: 8,
                ..base
            },
            shape(2, 2500),
        ),
        (
            "m4_bits6_bf16",
            PqConfig {
                pq_group_factor: 4,
                pq_bits: 6,
                input_dtype: DType::BF16,
                weight_dtype: DType::BF16,
                ..base
            },
            shape(1, 4000),
        ),
    ];
    for (name, c, sh) in cases {
        let n = PqInputs::default_n_cached(&c, sh.s) - 2; // three new keys
        let x = PqInputs::small_integer(&c, sh, n, seed()).expect("inputs");
        // the fixed step
        let stream = rt.device().new_stream().expect("stream");
        let mut fx = GpuIndexer::new(
            rt.clone(),
            stream.clone(),
            c,
            sh,
            &x.centroids,
            None,
            &KernelChoice::manifest_defaults(),
        )
        .expect("indexer");
        fx.import_codes(&x.codes, n).expect("import");
        let fdev = DeviceInputs::upload(&stream, &x, &c).expect("upload");
        fx.step(fdev.query(), fdev.key(), sh.s, LaunchMode::Launch)
            .expect("fixed step");
        let fixed = fx.download().expect("download");
        // the ragged step at S_b = S for every row, on the config's path, then forced to
        // the other where it can run
        let rx = ragged(&c, x, &vec![sh.s; sh.b], &vec![n; sh.b]);
        let split = name != "m4_bits6_bf16";
        let want = if split {
            // M <= 2, fp32, heavy 64: the indexed path by default
            vec![RaggedPath::Index, RaggedPath::Split, RaggedPath::Radix]
        } else {
            vec![RaggedPath::Radix]
        };
        for (i, path) in want.into_iter().enumerate() {
            let (mut ix, dev) = setup(&rt, &c, &rx);
            if i > 0 {
                ix.set_ragged_path(Some(path)).expect("force the path");
            } else if !split {
                let e = ix
                    .set_ragged_path(Some(RaggedPath::Split))
                    .unwrap_err()
                    .to_string();
                assert!(e.contains("K^M"), "{name}: {e}");
            }
            let info = ix
                .step_ragged(dev.query(), dev.key(), &rx.seq_lens, LaunchMode::Launch)
                .expect("ragged step");
            let what = format!("{name} ({path:?} path)");
            assert_eq!(info.path, path, "{what}");
            assert_eq!(info.launches, path.launches(), "{what}");
            let out = ix.download_ragged().expect("download_ragged");
            assert_checked(&c, &rx, &out, true, &what);
            assert_eq!(out.total, fixed.total, "{what}: total");
            assert_eq!(out.sparse_list, fixed.sparse_list, "{what}: sparse_list");
            assert_eq!(out.sparse_len, fixed.sparse_len, "{what}: sparse_len");
            assert_eq!(out.weight_list, fixed.weight_list, "{what}: weight_list");
            assert_eq!(out.n_max, fixed.n_cached, "{what}: codes held");
            assert_eq!(out.codes, fixed.codes, "{what}: codes");
        }
    }
}

/// Lengths 1, `K`, the short threshold and one past it, a long middle row and `S_alloc`,
/// each with its own count (one new key, several, none), on normal inputs (spec rule)
/// and small integers (exact), as plain launches and as a graph.
#[test]
fn short_and_long_rows_at_their_own_lengths() {
    let Some(rt) = runtime() else { return };
    let c = cfg();
    let s_alloc = 2600;
    let thr = c.short_threshold(0);
    let k = c.k_centroids();
    let lens = [1, k, thr, thr + 1, 1500, s_alloc];
    let ncs: Vec<usize> = lens
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let n = c.n_quantized(s);
            match i {
                0 | 1 => 0,
                2 => n / 2,
                3 => n - 1,
                4 => n - 9, // nine new keys
                _ => n - 1,
            }
        })
        .collect();
    let n_max = *ncs.iter().max().unwrap();
    for path in hist_paths(&c) {
        for exact in [false, true] {
            for mode in [LaunchMode::Launch, LaunchMode::Graph] {
                let sh = shape(lens.len(), s_alloc);
                let x = if exact {
                    PqInputs::small_integer(&c, sh, n_max, seed())
                } else {
                    PqInputs::random(&c, sh, n_max, seed())
                }
                .expect("inputs");
                let rx = ragged(&c, x, &lens, &ncs);
                let (mut ix, dev) = setup_on(&rt, &c, &rx, path);
                let info = ix
                    .step_ragged(dev.query(), dev.key(), &rx.seq_lens, mode)
                    .expect("ragged step");
                assert_eq!(info.path, path);
                let out = ix.download_ragged().expect("download");
                let what = format!("{path:?} exact {exact} {mode:?}");
                assert_checked(&c, &rx, &out, exact, &what);
                assert_eq!(out.n_cached[0], 0, "{what}: a short row quantizes nothing");
                assert_eq!(out.n_cached[5], c.n_quantized(s_alloc), "{what}");
            }
        }
    }
}

/// Sizes given as ratios (resolved at each row's `S_b` on the device as the host's
/// `Size::resolve`), init_offset below sink (duplicates in the list), few candidates (the
/// fill rule), metric ip with GQA and 16-bit weights.
#[test]
fn ratio_sizes_ip_and_16_bit_weights() {
    let Some(rt) = runtime() else { return };
    let cases = [
        (
            "ratios",
            PqConfig {
                sink_size: Size::Ratio(0.01),
                window_size: Size::Ratio(0.02),
                heavy_size: Size::Ratio(0.1),
                ..cfg()
            },
            vec![4000, 3333, 1234, 40],
        ),
        (
            "io_lt_sink_fill",
            PqConfig {
                sink_size: Size::Count(80),
                window_size: Size::Count(300),
                heavy_size: Size::Count(100),
                init_offset: 8,
                ..cfg()
            },
            vec![4000, 400, 3000],
        ),
        (
            "ip_fp16_weights",
            PqConfig {
                metric: tritonrt::pq::Metric::Ip,
                input_dtype: DType::F16,
                weight_dtype: DType::F16,
                ..cfg()
            },
            vec![4000, 2500],
        ),
    ];
    for (name, c, lens) in cases {
        let s_alloc = *lens.iter().max().unwrap();
        let ncs: Vec<usize> = lens
            .iter()
            .map(|&s| c.n_quantized(s).saturating_sub(2))
            .collect();
        let n_max = *ncs.iter().max().unwrap();
        let x = PqInputs::random(&c, shape(lens.len(), s_alloc), n_max, seed()).expect("inputs");
        let rx = ragged(&c, x, &lens, &ncs);
        // the indexed path forced where heavy is above what it takes by default (the
        // ratio case: 400 at S_alloc): rows past its gather fall back to a pass
        for path in hist_paths(&c) {
            let what = format!("{name} ({path:?} path)");
            let (mut ix, dev) = setup_on(&rt, &c, &rx, path);
            let info = ix
                .step_ragged(dev.query(), dev.key(), &rx.seq_lens, LaunchMode::Graph)
                .expect(&what);
            assert_eq!(info.path, path, "{what}");
            let out = ix.download_ragged().expect("download");
            assert_checked(&c, &rx, &out, false, &what);
        }
    }
}

/// A graph-replayed decode loop on `path` whose lengths live in a device buffer, and what
/// the CPU reference needs to check its next step: the inputs (keys from `x`), the codes
/// the last step left and how many keys they hold, each row's count.
struct DeviceLoop {
    ix: GpuIndexer,
    dev: DeviceInputs,
    dlens: cudarc::driver::CudaSlice<i64>,
    x: PqInputs,
    path: RaggedPath,
    lens: Vec<usize>,
    codes: (Vec<i64>, usize),
    n_cached: Vec<usize>,
    captures: usize,
}

impl DeviceLoop {
    /// Random inputs with each row one key short of `starts[r]` (its count
    /// `n_quantized(starts[r] - 1)`), the indexer holding them on `path`, a lengths buffer
    /// of `B` entries on its stream; `lens` = `starts`.
    fn start(
        rt: &Arc<Runtime>,
        c: &PqConfig,
        starts: &[usize],
        s_alloc: usize,
        path: RaggedPath,
    ) -> Self {
        let sh = shape(starts.len(), s_alloc);
        let ncs: Vec<usize> = starts.iter().map(|&s| c.n_quantized(s - 1)).collect();
        let n_max = *ncs.iter().max().unwrap();
        let x = PqInputs::random(c, sh, n_max, seed()).expect("inputs");
        let (ix, dev) = setup_on(rt, c, &ragged(c, x.clone(), starts, &ncs), path);
        assert_eq!(ix.ragged_path().unwrap(), path);
        let dlens = ix.stream().alloc_zeros::<i64>(sh.b).expect("lens buffer");
        DeviceLoop {
            ix,
            dev,
            dlens,
            codes: (x.codes.clone(), x.n_cached),
            x,
            path,
            lens: starts.to_vec(),
            n_cached: ncs,
            captures: 0,
        }
    }

    /// One replay at `lens` (written into the device buffer first; the outputs poisoned
    /// where `poison`), checked against the CPU reference run from the codes and counts
    /// the previous step left, which then move to this step's outputs.
    fn step(&mut self, c: &PqConfig, poison: bool, i: usize) -> tritonrt::pq::gpu::RaggedInfo {
        let v: Vec<i64> = self.lens.iter().map(|&s| s as i64).collect();
        let stream = self.ix.stream().clone();
        stream.memcpy_htod(&v, &mut self.dlens).expect("lengths");
        if poison {
            self.ix.poison_outputs().expect("poison");
        }
        let info = self
            .ix
            .step_ragged_device(
                self.dev.query(),
                self.dev.key(),
                &self.dlens,
                LaunchMode::Graph,
            )
            .expect("step");
        let what = format!("{:?} step {i} lens {:?}", self.path, self.lens);
        assert_eq!(info.path, self.path, "{what}");
        self.captures += usize::from(info.captured);
        let out = self.ix.download_ragged().expect("download");
        let x = PqInputs {
            codes: self.codes.0.clone(),
            n_cached: self.codes.1,
            ..self.x.clone()
        };
        assert_checked(
            c,
            &ragged(c, x, &self.lens, &self.n_cached),
            &out,
            false,
            &what,
        );
        self.codes = (out.codes.clone(), out.n_max);
        self.n_cached = out.n_cached.clone();
        info
    }
}

/// A graph-replayed decode loop on `path`: each row starts one key short of `starts[r]`,
/// grows by `grow(i, r)` keys before step `i > 0`, the outputs poisoned before every step,
/// each step checked against the CPU reference.
fn device_loop(
    rt: &Arc<Runtime>,
    c: &PqConfig,
    starts: &[usize],
    s_alloc: usize,
    path: RaggedPath,
    steps: usize,
    grow: impl Fn(usize, usize) -> usize,
) -> DeviceLoop {
    let mut l = DeviceLoop::start(rt, c, starts, s_alloc, path);
    for i in 0..steps {
        if i > 0 {
            for (r, v) in l.lens.iter_mut().enumerate() {
                *v += grow(i, r);
            }
        }
        l.step(c, true, i);
    }
    l
}

/// A decode loop from one captured graph: the lengths live in a device buffer the test
/// rewrites between replays (every row +1 a step, some +4), every step checked against the
/// CPU reference on the codes the previous step left, the graph captured once; then a
/// row longer than `S_alloc` in the buffer is refused on the device and reported naming
/// the row.
#[test]
fn graph_replay_with_lengths_in_a_device_buffer() {
    let Some(rt) = runtime() else { return };
    let c = cfg();
    let starts = [1500usize, 60, 2200, 900];
    let steps = 6;
    let s_alloc = starts.iter().max().unwrap() + 4 * steps + 8;
    for path in hist_paths(&c) {
        let mut l = device_loop(&rt, &c, &starts, s_alloc, path, steps, |i, r| {
            if (i + r) % 3 == 0 {
                4
            } else {
                1
            }
        });
        assert_eq!(l.captures, 1, "one graph for every length");
        // a bad row in the buffer: refused on the device, reported by row and values
        let mut bad: Vec<i64> = l.lens.iter().map(|&s| s as i64).collect();
        bad[2] = s_alloc as i64 + 5;
        let stream = l.ix.stream().clone();
        stream.memcpy_htod(&bad, &mut l.dlens).expect("lengths");
        l.ix.step_ragged_device(l.dev.query(), l.dev.key(), &l.dlens, LaunchMode::Graph)
            .expect("step");
        let e = l.ix.check_ragged_errors().unwrap_err().to_string();
        assert!(
            e.contains("row 2") && e.contains(&(s_alloc + 5).to_string()),
            "{e}"
        );
        assert!(l.ix.check_ragged_errors().is_ok(), "the record is cleared");
        // the other rows' counts did not move backwards; row 2's stayed
        assert_eq!(l.ix.row_n_cached().unwrap(), l.n_cached);
    }
}

/// More rows than one round of the threshold's default CTAs (34 x 8 = 272 rows: on GPUs of
/// up to 272 SMs the step takes `pq_rgthresh.r128`, two CTAs an SM): mixed lengths, short
/// rows among them, a graph-replayed loop of three steps, each against the CPU reference.
#[test]
fn more_rows_than_one_round_of_threshold_ctas() {
    let Some(rt) = runtime() else { return };
    let c = cfg();
    let starts: Vec<usize> = (0..34)
        .map(|r| [1700, 40, 900, 1200, 300][r % 5] + 7 * r)
        .collect();
    let steps = 3;
    let s_alloc = starts.iter().max().unwrap() + steps + 8;
    for path in hist_paths(&c) {
        let l = device_loop(&rt, &c, &starts, s_alloc, path, steps, |_, _| 1);
        assert_eq!(l.captures, 1, "{path:?}: one graph for every length");
    }
}

/// The histogram paths' persistent state (combination histograms, buckets, weight
/// extents) across a graph-replayed decode loop, outputs
/// poisoned only before the first step (later steps rely on the weights' extents): rows
/// over several emit parts beside short ones; then rows' counts lowered
/// (`set_row_n_cached`: row 0 to a third, a catch-up of thousands of keys, most of them
/// candidates, at a shorter length; row 3 rewound by 10 keys and 10 positions), so the
/// combination histograms (and buckets) must be reset on the device, while row 1 grows by 4 and row 2
/// stays; then a decode step and a replay. Every step against the CPU reference on the
/// codes and counts the previous step left; the graph captured once.
#[test]
fn lowered_counts_and_shrinking_rows() {
    let Some(rt) = runtime() else { return };
    let c = cfg();
    let starts = [8800usize, 60, 5000, 1200];
    for path in hist_paths(&c) {
        let mut l = DeviceLoop::start(&rt, &c, &starts, 9000, path);
        for i in 0..5 {
            match i {
                1 | 3 => l.lens.iter_mut().for_each(|v| *v += 1),
                2 => {
                    let mut lowered = l.n_cached.clone();
                    lowered[0] /= 3;
                    lowered[3] -= 10;
                    l.ix.set_row_n_cached(&lowered).expect("lower the counts");
                    l.n_cached = lowered;
                    l.lens[0] = 6000;
                    l.lens[1] += 4;
                    l.lens[3] -= 10;
                }
                _ => {}
            }
            // poisoned only before the first step: later steps rely on the weights' extents
            let info = l.step(&c, i == 0, i);
            assert_eq!(info.launches, 3);
        }
        assert_eq!(
            l.captures, 1,
            "{path:?}: one graph for every length and count"
        );
    }
}

/// The path switched between steps of one decode loop (indexed, split, indexed, split),
/// with rows rewound and their keys past the new count replaced (negated) while the other
/// path ran: each histogram path keeps its own counts, which the other does not maintain,
/// so a switch must count every row anew. Every step against the CPU reference on the
/// keys, codes and counts the previous step left.
#[test]
fn switching_paths_between_steps() {
    let Some(rt) = runtime() else { return };
    let c = cfg();
    if !index_built_for(&c) {
        return;
    }
    let mut l = DeviceLoop::start(&rt, &c, &[3000, 1800, 2500], 3100, RaggedPath::Index);
    let paths = [
        RaggedPath::Index,
        RaggedPath::Split,
        RaggedPath::Index,
        RaggedPath::Split,
    ];
    for (i, path) in paths.into_iter().enumerate() {
        l.ix.set_ragged_path(Some(path)).expect("switch the path");
        l.path = path;
        if i == 1 || i == 3 {
            // rows 0 and 2 rewound by 40 and 5 keys, their keys from there replaced
            let mut lowered = l.n_cached.clone();
            lowered[0] -= 40;
            lowered[2] -= 5;
            l.ix.set_row_n_cached(&lowered).expect("lower the counts");
            let sh = l.x.shape;
            for (b, &n) in lowered.iter().enumerate().filter(|&(b, _)| b != 1) {
                for g in 0..sh.h_kv {
                    let row = (b * sh.h_kv + g) * sh.s;
                    for p in c.init_offset + n..sh.s {
                        for v in &mut l.x.key[(row + p) * sh.d..(row + p + 1) * sh.d] {
                            *v = -*v;
                        }
                    }
                }
            }
            let first = c.init_offset + lowered.iter().copied().min().unwrap();
            let stream = l.ix.stream().clone();
            l.dev = DeviceInputs::upload_from(&stream, &l.x, &c, first).expect("upload");
            l.n_cached = lowered;
            // row 0 longer than before: its count passes what the switched-from path's
            // histogram counted, though 8 of those codes were rewritten
            l.lens[0] += 10;
            l.lens[1] += 3;
            l.lens[2] += 4;
        } else {
            l.lens.iter_mut().for_each(|v| *v += 2);
        }
        l.step(&c, false, i);
    }
}

/// Host-side refusals name the row and the values, and nothing is issued; a fixed-`S`
/// step on an indexer in ragged use is refused until codes are imported again.
#[test]
fn bad_lengths_and_counts_are_refused() {
    let Some(rt) = runtime() else { return };
    let c = cfg();
    let sh = shape(2, 1000);
    let n = c.n_quantized(999);
    let x = PqInputs::random(&c, sh, n, seed()).expect("inputs");
    let rx = ragged(&c, x.clone(), &[1000, 1000], &[n, n]);
    let (mut ix, dev) = setup(&rt, &c, &rx);
    let e = ix
        .step_ragged(dev.query(), dev.key(), &[1000, 1001], LaunchMode::Launch)
        .unwrap_err()
        .to_string();
    assert!(e.contains("row 1") && e.contains("1001"), "{e}");
    let e = ix
        .step_ragged(dev.query(), dev.key(), &[1000, 500], LaunchMode::Launch)
        .unwrap_err()
        .to_string();
    assert!(e.contains("row 1") && e.contains(&n.to_string()), "{e}");
    let e = ix
        .step_ragged(dev.query(), dev.key(), &[1000], LaunchMode::Launch)
        .unwrap_err()
        .to_string();
    assert!(e.contains("B = 2"), "{e}");
    let e = ix.set_row_n_cached(&[n, n + 1]).unwrap_err().to_string();
    assert!(e.contains("row 1"), "{e}");
    let e = ix
        .step(dev.query(), dev.key(), 1000, LaunchMode::Launch)
        .unwrap_err()
        .to_string();
    assert!(e.contains("ragged"), "{e}");
    ix.import_codes(&x.codes, n).expect("import");
    ix.step(dev.query(), dev.key(), 1000, LaunchMode::Launch)
        .expect("a fixed step after an import");
}
