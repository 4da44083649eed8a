//! The indexer's GPU pipeline: the decode step as Triton kernels launched from Rust.
//!
//! State on the device, per indexer (all sizes fixed by `B, H, H_kv, D` and the config):
//! - codes `u8 [B, H_kv, M, cap]`: one byte per (key, subvector), `cap` grows
//!   geometrically (x2, multiple of 16) so a decode step never copies the codebook;
//! - centroids `f32 [B, H_kv, M, K, d_c]` and `phi f32 [B * H_kv * M]` (ip only);
//! - scratch of the select kernel (per-CTA lookup table, staging, per-chunk candidates,
//!   per-row completion counters) and the outputs `sparse_list i64 [B, H, total]`,
//!   `sparse_len i64 [B, H]`, `weight_list [B, H, S]` (weight dtype), reused across steps
//!   and grown only when a step needs more.
//!
//! One step (launch contract: `kernels_triton/README.md`):
//! - short sequence (`S <= heavy + init_offset + 1 + K`): `pq_short.w_<wt>`;
//! - otherwise, when more than one key is new, `pq_quant[.a16].k_<qt>` first; then
//!   `pq_select.h<K_PAD>.q_<qt>.w_<wt>`: quantize the few new keys, score every quantized
//!   key through a per-head lookup table, mask the window, top-k per chunk, and (last CTA
//!   of each row) merge, assemble sink + heavy + window, sort, write all outputs;
//! - or, where [`SelectPath`] picks it (`K^M <= 4096`, M <= 4, the step's new keys are
//!   not candidates), `pq_hist.m<MP>.q_<qt>.w_<wt>`: one CTA per row finds the threshold
//!   on a persistent histogram of code combinations (`i32 [B*H, 4096]`, moved by the
//!   kernel itself from the keys it counted to the step's candidates) and emits in one
//!   pass over the row (`kernels_triton/pq_hist.py`);
//! - or, on the same state, the split histogram path: `pq_thresh.m<MP>.q_<qt>` finds each row's
//!   threshold as `pq_hist` does and writes its class bounds, then
//!   `pq_emit.m<MP>.w_<wt>` spreads each row's pass over `cdiv(n, TILE)` CTAs that
//!   exchange their counts through per-part flag words (`kernels_triton/pq_split.py`);
//! - or the indexed histogram path (`M <= 2`, query dtype = weight dtype):
//!   `pq_index.m2.q_<t>.w_<t>` finds each row's threshold as `pq_hist` does and gathers
//!   the taken keys from per-combination buckets of key positions (`i32 [B*H, 4096,
//!   CAPC]`, filled as keys join the candidates), so no step reads the row's codes again
//!   (`kernels_triton/pq_index.py`); `weight_list`'s zeros and sink/window ones come
//!   either from each row's companion CTA in the same launch (few rows of few keys: the
//!   step is one launch) or from `pq_wfill.w_<wt>` over every SM, `pq_index` being its
//!   programmatic dependent launch (sm_90; on sm_80 each row CTA writes its own).
//! - or, for every config the combination histogram does not take (`K^M > 4096` or
//!   `M > 4`), the radix-select split path: `pq_rsel.m<MP>.q_<qt>` writes each row's
//!   lookup table and narrows the row's threshold by rounds of histograms over the keys'
//!   scores (one cluster of CTAs a row on sm_90, their counts combined through
//!   distributed shared memory), then `pq_emit.m<MP>.w_<wt>` as on the split path
//!   (`kernels_triton/pq_range.py`).
//!
//! The steady-state step allocates nothing, copies nothing between host and device and
//! never synchronizes. [`LaunchMode::Graph`] captures the step once into a CUDA graph per
//! (shape, `S`, buffers) and replays it; a later step with the same key replays without
//! capturing (re-quantizing a key that is already quantized writes the same code, so a
//! replay after the state moved on is still exact).
//!
//! Which of these a step runs is decided as data: [`plan_step`] (pure, no GPU) maps the
//! config, the shape, `S`, `N_cached`, the [`SelectPath`] and the device facts
//! ([`PlanFacts`]) to a [`StepKind`], which the indexer turns into launches.
//!
//! This module re-exports the pipeline's public items from the files that implement it:
//! `plan` (the step plan), `kernels` (which kernels and variants a config uses), `state`
//! (the device buffers), `launch` (plan to launches), `graph` (the step graph cache),
//! `indexer` ([`GpuIndexer`]), `ragged_gpu` (ragged steps: [`GpuIndexer::step_ragged`],
//! [`RaggedInfo`]) and `harness` (execute and bench).

pub use crate::pq::harness::{
    bench_shape, copy_bandwidth, execute, execute_with_path, memory_floor_bytes, open_runtime,
    BenchResult, DeviceInputs, Execution, StepTiming,
};
pub use crate::pq::indexer::{GpuIndexer, LaunchMode};
pub use crate::pq::kernels::{select_kernel_name, HIST_COMBOS, K_PADS};
pub use crate::pq::launch::DeviceTensorRef;
pub use crate::pq::memory::StateBytes;
pub use crate::pq::plan::{
    plan_step, takes_index, HistFacts, IndexFacts, PlanFacts, SelectPath, StepInfo, StepKind,
    StepPlan, BULK_QUANTIZE_MIN, COMPANION_FILL_MAX_BYTES, INDEX_BUCKET_BUDGET_BYTES,
};
pub use crate::pq::ragged_gpu::{RaggedInfo, RAGGED_QUANT_CTAS};
pub use crate::pq::state::StepOutputs;
pub use crate::pq::variants::KernelChoice;
pub use crate::tune::choice::{VariantChoice, VariantOrigin};
