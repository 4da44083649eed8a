//! Device memory of one indexer: [`StateBytes`], what each group of its buffers takes,
//! and [`state_bytes_for`], the same figure computed on the CPU from the config, the
//! shape and the plan's rule (pure: no GPU).
//!
//! A live indexer reports what it allocated (`GpuIndexer::memory`, `state_bytes`);
//! [`state_bytes_for`] predicts it for a fresh indexer prepared at one `S`, so the sizes
//! of a workload (the 64 MB-per-layer target at the practical large workload) can
//! be checked without a GPU (`tests/pq_memory.rs`).

use serde::Serialize;

use crate::pq::config::{PqConfig, Shape};
use crate::pq::kernels::{HIST_COMBOS, K_PADS};
use crate::pq::plan::{bucket_capacity, code_capacity, takes_index, PlanFacts, SelectPath};

/// `pq_select`'s `CHUNK` in the shipped kernel set's sm_90 defaults
/// (`ptx_cache/manifest.json`; `tests/pq_memory.rs` checks it).
pub const SHIPPED_SELECT_CHUNK: usize = 8192;

/// Device bytes an indexer holds, by group of buffers. Every figure counts whole
/// allocations (a buffer that grew holds its grown size), in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StateBytes {
    /// Centroids `f32 [B, H_kv, M, K, d_c]`, phi `f32 [B*H_kv*M]` (one f32 for
    /// euclidean), and what `pq_quant` reads of the centroids: their bf16 split `[B*H_kv*M,
    /// 3, K, d_s]` and squared norms `f32 [B*H_kv*M, K]`.
    pub codebook: usize,
    /// Codes `u8 [B, H_kv, M, cap]` (and the import's bad-code counter, 4 bytes).
    pub codes: usize,
    /// The chunked path's scratch and the lookup tables: `lut f32 [CTAs, M, K]` (one per
    /// select CTA where `pq_select` is built, else one per row), staging `i64 [CTAs,
    /// 2 K_PAD]`, candidates `i64 [CTAs, K_PAD]`, row counters `i32 [B*H]`.
    pub select: usize,
    /// The histogram family's state (where built): combination counts `i32 [B*H,
    /// 4096]` and their key counts `i32 [B*H]`, threshold bins `i32 [B*H, 3072]`, lookup
    /// tables `f32 [B*H, M, K]`, split bounds, needs, part flags `i64 [B*H, cdiv(n,
    /// TILE)]` and ticket counter; or, for the radix-select split path, the lookup
    /// tables, split bounds, needs, part flags and ticket counter, the select state `i64
    /// [B*H, 4]`, round bins `i32 [B*H, 4096]`, arrival counters `i32 [B*H]` and the new
    /// key's partial argmins.
    pub hist: usize,
    /// The indexed path's counts `i32 [B*H, 4096]`, key counts, gather marks `i32 [B*H,
    /// TP]` and arrival counters `i32 [B*H]` (allocated with the buckets).
    pub index: usize,
    /// The indexed path's buckets `i32 [B*H, 4096, capc]`, `capc = 2 cdiv(cap, 4096) +
    /// 16`: allocated only for steps that take the indexed path
    /// ([`crate::pq::plan::takes_index`]).
    pub buckets: usize,
    /// The indexer's own outputs: `sparse_list i64 [B, H, total]`, `sparse_len i64 [B,
    /// H]`, `weight_list [B, H, S]` (weight dtype). A step into the caller's buffers
    /// (`step_into`) writes none of these; `sparse_len` is allocated at creation.
    pub outputs: usize,
}

impl StateBytes {
    /// Every device byte the indexer allocated, its own outputs included.
    pub fn total(&self) -> usize {
        self.state() + self.outputs
    }

    /// What the indexer holds between steps besides its outputs: codebook, codes,
    /// scratch, histograms and buckets (the per-layer state of an engine that passes its
    /// own output buffers).
    pub fn state(&self) -> usize {
        self.codebook + self.codes + self.select + self.hist + self.index + self.buckets
    }

    /// The sum of two indexers' (shards') bytes, group by group.
    pub fn add(&self, o: &StateBytes) -> StateBytes {
        StateBytes {
            codebook: self.codebook + o.codebook,
            codes: self.codes + o.codes,
            select: self.select + o.select,
            hist: self.hist + o.hist,
            index: self.index + o.index,
            buckets: self.buckets + o.buckets,
            outputs: self.outputs + o.outputs,
        }
    }
}

/// The chunked select kernel's sizes that enter the scratch: its `CHUNK` (keys per CTA)
/// and `K_PAD` (top-k width; staging is `2 K_PAD`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SelectSizes {
    /// Keys per select CTA.
    pub chunk: usize,
    /// Top-k width.
    pub k_pad: usize,
}

impl SelectSizes {
    /// The shipped sm_90 default for `cfg` on an indexer of capacity `s_alloc`: `CHUNK`
    /// [`SHIPPED_SELECT_CHUNK`], `K_PAD` the smallest of [`K_PADS`] at least `heavy_size`
    /// resolved at `s_alloc`; None where that exceeds 512 (no chunked kernel is built for
    /// it).
    pub fn shipped(cfg: &PqConfig, s_alloc: usize) -> Option<SelectSizes> {
        let heavy = cfg.heavy_at(s_alloc);
        K_PADS
            .iter()
            .copied()
            .find(|&p| p >= heavy)
            .map(|k_pad| SelectSizes {
                chunk: SHIPPED_SELECT_CHUNK,
                k_pad,
            })
    }
}

/// The bytes [`StateBytes`] of a fresh indexer for `cfg` and `shape` (its `s` ignored)
/// prepared for a step at `s` under `path`, with the kernels `facts` describes
/// (`select`: the chunked kernel's sizes where it is built, else None). Pure.
///
/// It follows the indexer's allocations: at creation the counters, `sparse_len` and the
/// histogram family's state where built; at the step's preparation the outputs, the
/// lookup tables and scratch, the codes at capacity [`code_capacity`]`(S -
/// init_offset)` (codes imported or grown from empty to the step's `n`; a state that
/// grew by doubling holds up to twice that, never more than the keys of the indexer's
/// `S`), the split flags, and the indexed path's
/// buffers only where [`takes_index`] says the step takes it.
pub fn state_bytes_for(
    cfg: &PqConfig,
    shape: &Shape,
    s: usize,
    path: SelectPath,
    facts: &PlanFacts,
    select: Option<SelectSizes>,
) -> StateBytes {
    let rows = shape.b * shape.h;
    let (m, k) = (cfg.m(), cfg.k_centroids());
    // DevBuf::ensure allocates at least one element
    let n_of = |elems: usize, size: usize| elems.max(1) * size;
    // pq_cprep's bf16 split of the centroids, for bf16 keys only (else one element)
    let prep = if cfg.input_dtype == crate::pq::DType::BF16 {
        shape.b * shape.h_kv * m * 3 * k * cfg.d_sub(shape.d)
    } else {
        1
    };
    let phi = match cfg.metric {
        crate::pq::Metric::Ip => shape.b * shape.h_kv * m,
        crate::pq::Metric::Euclidean => 1,
    };
    let mut b = StateBytes {
        codebook: shape.b * shape.h_kv * m * k * (cfg.d_c(shape.d) * 4 + 4) + prep * 2 + phi * 4,
        codes: 4,
        select: n_of(rows, 4),
        outputs: n_of(rows, 8),
        ..StateBytes::default()
    };
    if facts.hist.is_some() {
        b.hist = n_of(rows * HIST_COMBOS, 4)
            + n_of(rows, 4)
            + n_of(rows * m * k, 4)
            + n_of(rows * 2, 4)
            + n_of(rows, 4)
            + 4
            + n_of(rows * HIST_COMBOS, 1);
    }
    if facts.range.is_some() {
        b.hist = n_of(rows * m * k, 4)
            + n_of(rows * 2, 4)
            + n_of(rows, 4)
            + 4
            + 2 * n_of(shape.b * shape.h_kv * m * k.div_ceil(64), 4);
    }
    b.outputs += n_of(rows * cfg.total(s), 8) + n_of(rows * s * cfg.weight_dtype.size_bytes(), 1);
    if s > 0 && !cfg.is_short(s) {
        let n = cfg.n_quantized(s);
        let ctas = select.map_or(rows, |sk| rows * n.div_ceil(sk.chunk));
        b.select += n_of(ctas.max(rows) * m * k, 4);
        if let Some(sk) = select {
            b.select += n_of(ctas * 2 * sk.k_pad, 8) + n_of(ctas * sk.k_pad, 8);
        }
        let cap = code_capacity(n);
        b.codes += shape.b * shape.h_kv * m * cap;
        if let Some(h) = facts.hist {
            b.hist += n_of(rows * n.div_ceil(h.emit_tile), 8);
        }
        if let Some(rf) = facts.range {
            b.hist += n_of(rows * n.div_ceil(rf.emit_tile), 8);
        }
        if let Some(ix) = facts.index {
            if takes_index(cfg, shape, s, path, facts) {
                b.index = n_of(rows * HIST_COMBOS, 4)
                    + n_of(rows, 4)
                    + n_of(rows * ix.tp, 4)
                    + n_of(rows, 4);
                b.buckets = n_of(rows * HIST_COMBOS * bucket_capacity(cap), 4);
            }
        }
    }
    b
}
