//! The PQCache decode-step indexer (spec: `spec/pqcache-indexer.md` in the shared docs).
//!
//! Host side, no GPU code:
//! - [`config`]: [`PqConfig`], [`Shape`], [`Metric`], [`DType`], [`Size`] (a pattern
//!   size as a count or a ratio of `S`, resolved per step), validation and the derived
//!   quantities (`K`, `d_s`, `d_c`, the short-path threshold, `total`).
//! - [`workload`]: [`PqInputs`], the host tensors of one step, and seeded generators
//!   (standard normal; well-separated small integers for exact comparisons).
//! - [`reference`](mod@reference): the CPU implementation of the spec with f64 scores ([`step`]), the
//!   oracle for tests and the fallback backend of `tritonrt run`.
//! - [`check`](mod@check): the spec's "what counts as the same answer" rule ([`check()`]).
//! - [`io`]: safetensors input/output in the upstream layouts.
//! - [`plan`]: which kernels a GPU decode step launches, as data ([`plan::plan_step`],
//!   pure: unit-tested on the CPU).
//! - [`memory`]: the indexer's device bytes by group ([`memory::StateBytes`]) and their
//!   prediction from config and shape ([`memory::state_bytes_for`], pure).
//! - [`matrix`]: the rows `tritonrt bench --matrix` times (the spec's practical,
//!   reference and large workloads, a heavy-size sweep), as data.
//! - [`ragged`]: ragged batches (each entry at its own length): inputs, padded outputs,
//!   the CPU reference and the checker, built from the fixed-`S` ones per entry, and
//!   the plan of a ragged step ([`ragged::plan_ragged`], pure). The GPU side is
//!   [`gpu::GpuIndexer::step_ragged`] (module `ragged_gpu`).
//!
//! - [`shard_plan`]: heads split over `G` devices as tensor parallelism does
//!   ([`shard_plan::ShardPlan`]: head ranges, slicing the inputs, stitching the outputs;
//!   pure).
//!
//! GPU side: [`gpu`] (the indexer, its kernels, device state, graph cache and the
//! execute / bench harness, in the private modules it re-exports from), [`variants`]
//! (which variant of each kernel an indexer runs: overrides, the tuning table, the
//! manifest default) and [`sharded`] (the indexer over several GPUs, one shard of heads
//! per device).
//!
//! Layouts (row-major, all host `Vec`s): `query [B, H, 1, D]`, `key [B, H_kv, S, D]`,
//! `centroids [B, H_kv, M, K, d_c]`, codes upstream `[B, N, H_kv, M]` i64,
//! `phi [B * H_kv * M]`, `sparse_list [B, H, total]` i64, `sparse_len [B, H]` i64,
//! `weight_list [B, H, S]` (0/1, held as f32).

pub mod check;
pub mod config;
#[cfg(feature = "cli")]
mod generate;
pub mod gpu;
mod graph;
mod harness;
mod indexer;
#[cfg(feature = "cli")]
pub mod io;
mod kernels;
mod launch;
pub mod matrix;
pub mod memory;
pub mod plan;
pub mod prefill;
pub mod ragged;
mod ragged_gpu;
pub mod reference;
pub mod shard_plan;
pub mod sharded;
mod size;
mod state;
#[cfg(feature = "cli")]
pub mod tune;
pub mod variants;
pub mod workload;

pub use check::{check, check_exact, CheckMode, CheckReport};
pub use config::{DType, Metric, PqConfig, PqConfigOverrides, Shape, Size, Workload};
pub use reference::{step, PqOutput};
pub use workload::PqInputs;

/// Number of worker threads for the host-side loops: the machine's available
/// parallelism, overridable with `TRITONRT_THREADS` (>= 1).
pub fn host_threads() -> usize {
    if let Some(n) = std::env::var("TRITONRT_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        return n;
    }
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Run `f` on every item, spread over [`host_threads`] scoped threads in contiguous
/// groups (items are assumed to cost about the same). Deterministic results are the
/// caller's business: `f` must not depend on which thread runs an item.
pub(crate) fn par_items<I: Send, F: Fn(I) + Sync>(items: Vec<I>, f: F) {
    let threads = host_threads().min(items.len());
    if threads <= 1 {
        items.into_iter().for_each(f);
        return;
    }
    let per = items.len().div_ceil(threads);
    let mut groups: Vec<Vec<I>> = Vec::with_capacity(threads);
    let mut it = items.into_iter();
    loop {
        let g: Vec<I> = it.by_ref().take(per).collect();
        if g.is_empty() {
            break;
        }
        groups.push(g);
    }
    let f = &f;
    std::thread::scope(|s| {
        for g in groups {
            s.spawn(move || g.into_iter().for_each(f));
        }
    });
}

/// Run `f(chunk_index, chunk)` on every `chunk_len`-sized chunk of `data` in parallel
/// (see [`par_items`]).
pub(crate) fn par_chunks_mut<T: Send, F: Fn(usize, &mut [T]) + Sync>(
    data: &mut [T],
    chunk_len: usize,
    f: F,
) {
    if data.is_empty() || chunk_len == 0 {
        return;
    }
    let items: Vec<(usize, &mut [T])> = data.chunks_mut(chunk_len).enumerate().collect();
    par_items(items, |(i, c)| f(i, c));
}
