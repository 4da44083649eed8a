//! Configuration and shapes of the PQ decode-step indexer, with validation and the
//! quantities derived from them (spec: `spec/pqcache-indexer.md`).
//!
//! Everything here is plain host data so the CPU reference, the safetensors I/O and the
//! GPU pipeline share one description of a step.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use crate::pq::size::{Size, SIZE_EXPECTED};
use crate::tune::ShapeFeatures;

/// How new keys are assigned PQ codes (spec step 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// `argmin_c ||x_m - centroid_c||^2` over the `d_s` coordinates.
    Euclidean,
    /// Inner product turned into L2: `x_m` is extended by
    /// `sqrt(max(0, phi - ||x_m||^2))` and compared with `d_s + 1`-dim centroids.
    Ip,
}

impl Metric {
    /// The name used in files and on the command line (`euclidean`, `ip`).
    pub fn as_str(self) -> &'static str {
        match self {
            Metric::Euclidean => "euclidean",
            Metric::Ip => "ip",
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Metric {
    type Err = Error;
    /// Accepts `euclidean` (also `l2`) and `ip` (also `inner_product`), any case.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "euclidean" | "l2" => Ok(Metric::Euclidean),
            "ip" | "inner_product" => Ok(Metric::Ip),
            _ => Err(Error::PqConfig {
                field: "metric",
                value: s.to_string(),
                expected: "euclidean or ip".into(),
            }),
        }
    }
}

/// Element type of `query`/`key` (input) or `weight_list` (output).
///
/// On the host every value is held as `f32`; for `BF16`/`F16` the values are already
/// rounded to that type (see [`DType::round`]), so CPU and GPU see the same numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// bfloat16 (8 exponent bits, 7 mantissa bits).
    BF16,
    /// IEEE binary16.
    F16,
}

impl DType {
    /// The Triton element dtype of the same values.
    pub fn triton(self) -> crate::artifact::Dtype {
        match self {
            DType::F32 => crate::artifact::Dtype::Fp32,
            DType::BF16 => crate::artifact::Dtype::Bf16,
            DType::F16 => crate::artifact::Dtype::Fp16,
        }
    }

    /// The canonical short name: `fp32`, `bf16`, `fp16`.
    pub fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "fp32",
            DType::BF16 => "bf16",
            DType::F16 => "fp16",
        }
    }

    /// Size of one element in bytes (4 or 2).
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
        }
    }

    /// Round an `f32` to the nearest value of this type (round to nearest even), returned
    /// as `f32`. Identity for `F32`.
    pub fn round(self, x: f32) -> f32 {
        match self {
            DType::F32 => x,
            DType::BF16 => half::bf16::from_f32(x).to_f32(),
            DType::F16 => half::f16::from_f32(x).to_f32(),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DType {
    type Err = Error;
    /// Accepts `fp32|bf16|fp16` and `float32|bfloat16|float16` (also `f32`, `f16`),
    /// any case.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "fp32" | "float32" | "f32" => Ok(DType::F32),
            "bf16" | "bfloat16" => Ok(DType::BF16),
            "fp16" | "float16" | "f16" | "half" => Ok(DType::F16),
            _ => Err(Error::PqConfig {
                field: "dtype",
                value: s.to_string(),
                expected: "fp32, bf16 or fp16 (or float32, bfloat16, float16)".into(),
            }),
        }
    }
}

/// Tensor sizes of one decode step.
///
/// `query` is `[b, h, 1, d]`, `key` is `[b, h_kv, s, d]`; `s` is the current sequence
/// length with the new token included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    /// Batch size `B`.
    pub b: usize,
    /// Query heads `H`.
    pub h: usize,
    /// KV heads `H_kv` (`H % H_kv == 0`).
    pub h_kv: usize,
    /// Sequence length `S`, the new token included.
    pub s: usize,
    /// Head dimension `D`.
    pub d: usize,
}

impl Shape {
    /// The spec's reference workload: `B=1, H=H_kv=32, S=32000, D=128`.
    pub const fn reference() -> Self {
        Shape {
            b: 1,
            h: 32,
            h_kv: 32,
            s: 32000,
            d: 128,
        }
    }

    /// The spec's large workload: `B=4, H=H_kv=32, S=131072, D=128`.
    pub const fn large() -> Self {
        Shape {
            b: 4,
            h: 32,
            h_kv: 32,
            s: 131072,
            d: 128,
        }
    }

    /// Query heads per KV head, `G = H / H_kv` (0 if `h_kv == 0`; validate first).
    pub fn group(&self) -> usize {
        self.h.checked_div(self.h_kv).unwrap_or(0)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "B={} H={} H_kv={} S={} D={}",
            self.b, self.h, self.h_kv, self.s, self.d
        )
    }
}

/// A PQCache decode-step workload: a named one of the spec (`reference`, `large`) or a
/// custom shape, as `tritonrt run`, `bench` and `autotune --workload` take it (see the
/// spec's "Reference workload"). Sizes are element counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Short name for reports: `reference`, `large`, or `custom`.
    pub name: String,
    /// Batch `B`.
    pub batch: u64,
    /// Query heads `H`.
    pub heads: u64,
    /// KV heads `H_kv` (`H % H_kv == 0`).
    pub kv_heads: u64,
    /// Sequence length `S` including the new token.
    pub seq_len: u64,
    /// Head dimension `D`.
    pub head_dim: u64,
    /// Subvectors per key `M` (`pq_group_factor`, `D % M == 0`).
    pub subvectors: u64,
    /// Bits per code (`pq_bits`, 1..=8): `K = 2^bits` centroids.
    pub bits: u32,
    /// `sink_size` (a count, or a ratio of `S`: see [`Size`]).
    pub sink: Size,
    /// `window_size` (a count, or a ratio of `S`).
    pub window: Size,
    /// `heavy_size`, the top-k size (a count, or a ratio of `S`).
    pub heavy: Size,
    /// `init_offset`: quantized key `j` is token `init_offset + j`.
    pub init_offset: u64,
}

impl Workload {
    /// The spec's reference workload: `B=1, H=H_kv=32, S=32000, D=128, M=2, bits=6,
    /// sink=window=heavy=init_offset=128`.
    pub fn reference() -> Self {
        Workload {
            name: "reference".into(),
            batch: 1,
            heads: 32,
            kv_heads: 32,
            seq_len: 32000,
            head_dim: 128,
            subvectors: 2,
            bits: 6,
            sink: Size::Count(128),
            window: Size::Count(128),
            heavy: Size::Count(128),
            init_offset: 128,
        }
    }

    /// The spec's large workload: the reference with `B=4, S=131072`.
    pub fn large() -> Self {
        Workload {
            name: "large".into(),
            batch: 4,
            seq_len: 131072,
            ..Workload::reference()
        }
    }

    /// Check the spec's constraints.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] naming the first violated constraint, with the values;
    /// [`Error::PqConfig`] for a ratio size outside `[0, 1]` (see [`Size::ratio`]).
    pub fn validate(&self) -> Result<()> {
        self.sink.check("sink_size")?;
        self.window.check("window_size")?;
        self.heavy.check("heavy_size")?;
        let w = "workload";
        let fail = |m: String| Err(Error::invalid(w, m));
        if self.batch == 0 || self.heads == 0 || self.kv_heads == 0 || self.head_dim == 0 {
            return fail(format!(
                "B, H, H_kv and D must be at least 1, got B={} H={} H_kv={} D={}",
                self.batch, self.heads, self.kv_heads, self.head_dim
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return fail(format!(
                "H % H_kv must be 0, got H={} H_kv={}",
                self.heads, self.kv_heads
            ));
        }
        if self.subvectors == 0 || !self.head_dim.is_multiple_of(self.subvectors) {
            return fail(format!(
                "D % M must be 0 with M >= 1, got D={} M={}",
                self.head_dim, self.subvectors
            ));
        }
        if !(1..=8).contains(&self.bits) {
            return fail(format!("bits must be in 1..=8, got {}", self.bits));
        }
        if self.seq_len == 0 {
            return fail("S must be at least 1, got 0".into());
        }
        Ok(())
    }

    /// Keys per row at this step: `n = S - init_offset` (0 when `S <= init_offset`).
    pub fn n_keys(&self) -> u64 {
        self.seq_len.saturating_sub(self.init_offset)
    }

    /// Rows of a per-query-head kernel: `B * H`.
    pub fn rows(&self) -> u64 {
        self.batch * self.heads
    }

    /// The workload's config: [`PqConfig::reference_workload`] with its `M`, bits, sink,
    /// window, heavy and init_offset.
    pub fn config(&self) -> PqConfig {
        PqConfig {
            sink_size: self.sink,
            window_size: self.window,
            heavy_size: self.heavy,
            init_offset: self.init_offset as usize,
            pq_group_factor: self.subvectors as usize,
            pq_bits: self.bits,
            ..PqConfig::reference_workload()
        }
    }

    /// The step's shape (`S` is the workload's sequence length).
    pub fn shape(&self) -> Shape {
        Shape {
            b: self.batch as usize,
            h: self.heads as usize,
            h_kv: self.kv_heads as usize,
            s: self.seq_len as usize,
            d: self.head_dim as usize,
        }
    }

    /// Decode-loop shape features of a per-query-head kernel (rows `B * H`, `n` keys per
    /// row, alignment 1, `heavy` resolved at the workload's `S`: see
    /// [`ShapeFeatures::decode`]).
    pub fn features(&self) -> ShapeFeatures {
        ShapeFeatures::decode(
            self.rows(),
            self.n_keys(),
            (self.head_dim / self.subvectors.max(1)) as u32,
            1u32 << self.bits.min(31),
            u32::try_from(self.heavy.resolve(self.seq_len as usize)).unwrap_or(u32::MAX),
        )
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: B={} H={} H_kv={} S={} D={} M={} bits={} sink={} window={} heavy={} \
             init_offset={}",
            self.name,
            self.batch,
            self.heads,
            self.kv_heads,
            self.seq_len,
            self.head_dim,
            self.subvectors,
            self.bits,
            self.sink,
            self.window,
            self.heavy,
            self.init_offset
        )
    }
}

impl FromStr for Workload {
    type Err = Error;

    /// `reference`, `large`, or `B,H,H_kv,S,D[,M[,bits[,heavy]]]` (the other values are
    /// the reference workload's; `heavy` a count or a ratio of `S` such as `0.1`, see
    /// [`Size`]). The result is validated ([`Workload::validate`]).
    fn from_str(s: &str) -> Result<Self> {
        let w = match s.trim() {
            "reference" => Workload::reference(),
            "large" => Workload::large(),
            other => {
                let fields: Vec<&str> = other.split(',').map(str::trim).collect();
                if !(5..=8).contains(&fields.len()) {
                    return Err(Error::invalid(
                        "workload",
                        format!(
                            "{s:?}: expected `reference`, `large` or \
                             B,H,H_kv,S,D[,M[,bits[,heavy]]] (5 to 8 comma-separated \
                             integers), got {} fields",
                            fields.len()
                        ),
                    ));
                }
                let names = ["B", "H", "H_kv", "S", "D", "M", "bits"];
                let mut v = [0u64; 7];
                for (i, f) in fields.iter().take(7).enumerate() {
                    v[i] = f.parse::<u64>().map_err(|_| {
                        Error::invalid(
                            "workload",
                            format!(
                                "{s:?}: field {} ({}) = {f:?} is not a non-negative integer",
                                i + 1,
                                names[i]
                            ),
                        )
                    })?;
                }
                let r = Workload::reference();
                let bits = if fields.len() > 6 {
                    v[6]
                } else {
                    r.bits as u64
                };
                Workload {
                    name: "custom".into(),
                    batch: v[0],
                    heads: v[1],
                    kv_heads: v[2],
                    seq_len: v[3],
                    head_dim: v[4],
                    subvectors: if fields.len() > 5 { v[5] } else { r.subvectors },
                    bits: u32::try_from(bits).unwrap_or(u32::MAX),
                    heavy: match fields.get(7) {
                        Some(f) => Size::parse_field("heavy_size", f).map_err(|e| {
                            Error::invalid("workload", format!("{s:?}: field 8 (heavy): {e}"))
                        })?,
                        None => r.heavy,
                    },
                    ..r
                }
            }
        };
        w.validate()?;
        Ok(w)
    }
}

/// The indexer's pattern and PQ parameters (spec "Notation and inputs").
///
/// The three pattern sizes are [`Size`]s: a count, or a ratio of the sequence length
/// resolved at each step's `S` (spec "Sizes given as ratios"). Every per-step quantity
/// below takes that `S` ([`PqConfig::heavy_at`], [`PqConfig::total`], ...), so a decode
/// loop whose `S` grows, or a ragged batch whose entries differ, resolves a ratio anew
/// for each step or entry; [`PqConfig::resolved`] gives the counts of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PqConfig {
    /// Attention sinks: positions `0..min(sink, S)` are always attended, `sink` this
    /// size resolved at `S`.
    pub sink_size: Size,
    /// Local window: positions `S - min(window, S) .. S` are always attended, `window`
    /// this size resolved at `S`.
    pub window_size: Size,
    /// Heavy hitters chosen through PQ scores: `k = min(heavy, n)`, `heavy` this size
    /// resolved at `S`.
    pub heavy_size: Size,
    /// Quantized key `j` is the token at position `init_offset + j`.
    pub init_offset: usize,
    /// `M`: subvectors per key (`D % M == 0`).
    pub pq_group_factor: usize,
    /// Bits per code, 1..=8: `K = 2^pq_bits` centroids per subvector.
    pub pq_bits: u32,
    /// How new keys are quantized.
    pub metric: Metric,
    /// dtype of `query` and `key`.
    pub input_dtype: DType,
    /// dtype of `weight_list` (upstream: the query's dtype).
    pub weight_dtype: DType,
}

impl PqConfig {
    /// The spec's reference configuration: `sink = window = heavy = init_offset = 128`,
    /// `M = 2`, `bits = 6`, euclidean, fp32 inputs and weights.
    pub const fn reference_workload() -> Self {
        PqConfig {
            sink_size: Size::Count(128),
            window_size: Size::Count(128),
            heavy_size: Size::Count(128),
            init_offset: 128,
            pq_group_factor: 2,
            pq_bits: 6,
            metric: Metric::Euclidean,
            input_dtype: DType::F32,
            weight_dtype: DType::F32,
        }
    }

    /// `K = 2^pq_bits`, centroids per subvector (valid for `pq_bits <= 8`; validate
    /// first).
    pub fn k_centroids(&self) -> usize {
        k_centroids(self.pq_bits)
    }

    /// `M`, subvectors per key (alias of `pq_group_factor`).
    pub fn m(&self) -> usize {
        self.pq_group_factor
    }

    /// Subvector dimension `d_s = D / M` (0 if `M == 0`; validate first).
    pub fn d_sub(&self, d: usize) -> usize {
        d_sub(self.pq_group_factor, d)
    }

    /// Centroid dimension `d_c`: `d_s` for euclidean, `d_s + 1` for ip (the extra
    /// coordinate is the ip-to-l2 augmentation).
    pub fn d_c(&self, d: usize) -> usize {
        d_c(self.metric, self.pq_group_factor, d)
    }

    /// Query heads per KV head, `G = H / H_kv` (same as [`Shape::group`]).
    pub fn group(&self, shape: &Shape) -> usize {
        shape.group()
    }

    /// `sink_size` resolved at sequence length `s` (a count itself, a ratio
    /// `floor(ratio * s)`: [`Size::resolve`]), before the `min` with `s`.
    pub fn sink_at(&self, s: usize) -> usize {
        self.sink_size.resolve(s)
    }

    /// `window_size` resolved at sequence length `s`, before the `min` with `s`.
    pub fn window_at(&self, s: usize) -> usize {
        self.window_size.resolve(s)
    }

    /// `heavy_size` resolved at sequence length `s`, before the `min` with `n`.
    pub fn heavy_at(&self, s: usize) -> usize {
        self.heavy_size.resolve(s)
    }

    /// This config with its three sizes resolved at sequence length `s`, as counts:
    /// the config of one step at `s` (every per-step quantity of the result at `s`
    /// equals this config's).
    pub fn resolved(&self, s: usize) -> PqConfig {
        PqConfig {
            sink_size: Size::Count(self.sink_at(s)),
            window_size: Size::Count(self.window_at(s)),
            heavy_size: Size::Count(self.heavy_at(s)),
            ..*self
        }
    }

    /// The short-path threshold at sequence length `s`: `heavy + init_offset + 1 + K`,
    /// `heavy` resolved at `s`; a step at `s` with `s <=` this attends to everything
    /// (spec step 0). Saturates instead of overflowing. (With a count `heavy_size` the
    /// threshold is the same at every `s`.)
    pub fn short_threshold(&self, s: usize) -> usize {
        self.heavy_at(s)
            .saturating_add(self.init_offset)
            .saturating_add(1)
            .saturating_add(self.k_centroids())
    }

    /// Whether a step at sequence length `s` takes the short path
    /// (`s <= short_threshold(s)`).
    pub fn is_short(&self, s: usize) -> bool {
        s <= self.short_threshold(s)
    }

    /// `n = S - init_offset`: quantized keys after a (long-path) step at length `s`
    /// (0 when `s <= init_offset`).
    pub fn n_quantized(&self, s: usize) -> usize {
        s.saturating_sub(self.init_offset)
    }

    /// `sink' = min(sink, s)`, `sink` resolved at `s`.
    pub fn sink_eff(&self, s: usize) -> usize {
        self.sink_at(s).min(s)
    }

    /// `window' = min(window, s)`, `window` resolved at `s`.
    pub fn window_eff(&self, s: usize) -> usize {
        self.window_at(s).min(s)
    }

    /// `w0 = max(0, s - window' - init_offset)`: quantized keys `j >= w0` are masked
    /// (not heavy candidates), so there are `w0` candidates (capped at `n`).
    pub fn window_start(&self, s: usize) -> usize {
        s.saturating_sub(self.window_eff(s))
            .saturating_sub(self.init_offset)
    }

    /// `k = min(heavy, n)` for a long-path step at length `s`, `heavy` resolved at `s`.
    /// (On the long path `n > heavy + K`, so this is always `heavy`; the `min` is the
    /// spec's.)
    pub fn heavy_k(&self, s: usize) -> usize {
        self.heavy_at(s).min(self.n_quantized(s))
    }

    /// Entries per row of `sparse_list` at length `s`: `s` on the short path, else
    /// `sink' + k + window'` (duplicates counted). `n` is not a parameter because the
    /// spec fixes it to `s - init_offset`.
    pub fn total(&self, s: usize) -> usize {
        if self.is_short(s) {
            s
        } else {
            self.sink_eff(s) + self.heavy_k(s) + self.window_eff(s)
        }
    }

    /// Check the config against a shape.
    ///
    /// Errors ([`Error::PqConfig`], naming the field, its value and what was expected):
    /// any of `B, H, H_kv, S, D` zero; `H % H_kv != 0`; `M == 0` or `D % M != 0` (names
    /// both); `pq_bits` outside 1..=8; a ratio size NaN, negative or above 1.0
    /// ([`Size::ratio`]); a count size above `i64::MAX / 4`. `init_offset > S` is accepted: such a step is
    /// always on the short path (the threshold exceeds `init_offset`), which is well
    /// defined and is what an engine sees while its prompt is still shorter than
    /// `init_offset`; it then simply has no quantized keys (`N_cached` must be 0).
    pub fn validate(&self, shape: &Shape) -> Result<()> {
        let nonzero = [
            ("batch", shape.b),
            ("heads", shape.h),
            ("kv_heads", shape.h_kv),
            ("seq_len", shape.s),
            ("head_dim", shape.d),
        ];
        for (field, v) in nonzero {
            if v == 0 {
                return Err(Error::PqConfig {
                    field,
                    value: "0".into(),
                    expected: "a positive size".into(),
                });
            }
        }
        if !shape.h.is_multiple_of(shape.h_kv) {
            return Err(Error::PqConfig {
                field: "kv_heads",
                value: shape.h_kv.to_string(),
                expected: format!(
                    "a divisor of the query heads H = {} (H % H_kv = {})",
                    shape.h,
                    shape.h % shape.h_kv
                ),
            });
        }
        let m = self.pq_group_factor;
        check_group_factor(m, shape.d)?;
        check_bits(self.pq_bits)?;
        for (field, v) in [
            ("sink_size", self.sink_size),
            ("window_size", self.window_size),
            ("heavy_size", self.heavy_size),
        ] {
            v.check(field)?;
        }
        // Guard the i64 positions of sparse_list and the sizes computed from the config
        // (a ratio resolves to at most S).
        let limit = i64::MAX as usize / 4;
        let count = |v: Size| match v {
            Size::Count(n) => n,
            Size::Ratio(_) => 0,
        };
        for (field, v) in [
            ("sink_size", count(self.sink_size)),
            ("window_size", count(self.window_size)),
            ("heavy_size", count(self.heavy_size)),
            ("init_offset", self.init_offset),
            ("seq_len", shape.s),
        ] {
            if v > limit {
                return Err(Error::PqConfig {
                    field,
                    value: v.to_string(),
                    expected: format!("at most {limit}"),
                });
            }
        }
        Ok(())
    }
}

impl fmt::Display for PqConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sink={} window={} heavy={} init_offset={} M={} bits={} (K={}) metric={} \
             dtype={} weight_dtype={}",
            self.sink_size,
            self.window_size,
            self.heavy_size,
            self.init_offset,
            self.pq_group_factor,
            self.pq_bits,
            self.k_centroids(),
            self.metric,
            self.input_dtype,
            self.weight_dtype
        )
    }
}

/// Optional per-field replacements for a [`PqConfig`]: what command-line flags set on top
/// of a file's `__metadata__` or a workload preset. `None` keeps the base value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PqConfigOverrides {
    /// Replaces `sink_size`.
    pub sink_size: Option<Size>,
    /// Replaces `window_size`.
    pub window_size: Option<Size>,
    /// Replaces `heavy_size`.
    pub heavy_size: Option<Size>,
    /// Replaces `init_offset`.
    pub init_offset: Option<usize>,
    /// Replaces `pq_group_factor` (M).
    pub pq_group_factor: Option<usize>,
    /// Replaces `pq_bits`.
    pub pq_bits: Option<u32>,
    /// Replaces `metric`.
    pub metric: Option<Metric>,
    /// Replaces `input_dtype` (for file inputs it must match the file's dtype).
    pub input_dtype: Option<DType>,
    /// Replaces `weight_dtype`.
    pub weight_dtype: Option<DType>,
}

impl PqConfigOverrides {
    /// `base` with every `Some` field replaced.
    pub fn apply(&self, base: PqConfig) -> PqConfig {
        PqConfig {
            sink_size: self.sink_size.unwrap_or(base.sink_size),
            window_size: self.window_size.unwrap_or(base.window_size),
            heavy_size: self.heavy_size.unwrap_or(base.heavy_size),
            init_offset: self.init_offset.unwrap_or(base.init_offset),
            pq_group_factor: self.pq_group_factor.unwrap_or(base.pq_group_factor),
            pq_bits: self.pq_bits.unwrap_or(base.pq_bits),
            metric: self.metric.unwrap_or(base.metric),
            input_dtype: self.input_dtype.unwrap_or(base.input_dtype),
            weight_dtype: self.weight_dtype.unwrap_or(base.weight_dtype),
        }
    }
}

/// `pq_group_factor` M against head_dim `d`: M must be a positive divisor of D.
/// Shared by [`PqConfig`] and the prefill's config.
///
/// Errors: [`Error::PqConfig`] naming `pq_group_factor`, its value and the divisibility
/// it lacks.
pub(crate) fn check_group_factor(m: usize, d: usize) -> Result<()> {
    if m != 0 && d.is_multiple_of(m) {
        return Ok(());
    }
    Err(Error::PqConfig {
        field: "pq_group_factor",
        value: m.to_string(),
        expected: if m == 0 {
            format!("a positive divisor of head_dim D = {d}")
        } else {
            format!(
                "a divisor of head_dim D = {d} (D % M = {d} % {m} = {})",
                d % m
            )
        },
    })
}

/// `pq_bits` in 1..=8 (codes are one byte). Shared by [`PqConfig`] and the prefill's
/// config.
///
/// Errors: [`Error::PqConfig`] naming `pq_bits`, its value and the allowed range.
pub(crate) fn check_bits(bits: u32) -> Result<()> {
    if (1..=8).contains(&bits) {
        return Ok(());
    }
    Err(Error::PqConfig {
        field: "pq_bits",
        value: bits.to_string(),
        expected: "1..=8 (K = 2^bits centroids, codes fit in one byte)".into(),
    })
}

/// `K = 2^bits` centroids per subvector (bits clamped to 16; valid for `bits <= 8`).
/// Shared by [`PqConfig`] and the prefill's config.
pub(crate) fn k_centroids(bits: u32) -> usize {
    1usize << bits.min(16)
}

/// Subvector dimension `d_s = D / M` (0 if `M == 0`).
pub(crate) fn d_sub(m: usize, d: usize) -> usize {
    d.checked_div(m).unwrap_or(0)
}

/// Centroid dimension `d_c`: `d_s` for euclidean, `d_s + 1` for ip (the ip-to-l2
/// augmentation coordinate).
pub(crate) fn d_c(metric: Metric, m: usize, d: usize) -> usize {
    match metric {
        Metric::Euclidean => d_sub(m, d),
        Metric::Ip => d_sub(m, d) + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_quantities_of_the_reference_workload() {
        let c = PqConfig::reference_workload();
        let s = Shape::reference();
        c.validate(&s).unwrap();
        assert_eq!(c.k_centroids(), 64);
        assert_eq!(c.d_sub(s.d), 64);
        assert_eq!(c.d_c(s.d), 64);
        assert_eq!(c.short_threshold(32000), 128 + 128 + 1 + 64);
        assert!(c.is_short(321) && !c.is_short(322));
        assert_eq!(c.total(32000), 384);
        assert_eq!(c.total(300), 300);
        assert_eq!(c.window_start(32000), 32000 - 128 - 128);
        let ip = PqConfig {
            metric: Metric::Ip,
            ..c
        };
        assert_eq!(ip.d_c(128), 65);
    }

    #[test]
    fn validation_names_the_fields() {
        let c = PqConfig::reference_workload();
        let s = Shape::reference();
        let e = PqConfig {
            pq_group_factor: 3,
            ..c
        }
        .validate(&s)
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("pq_group_factor = 3") && e.contains("D = 128"),
            "{e}"
        );
        let e = PqConfig { pq_bits: 9, ..c }
            .validate(&s)
            .unwrap_err()
            .to_string();
        assert!(e.contains("pq_bits = 9") && e.contains("1..=8"), "{e}");
        let e = PqConfig { pq_bits: 0, ..c }
            .validate(&s)
            .unwrap_err()
            .to_string();
        assert!(e.contains("pq_bits = 0"), "{e}");
        let e = c.validate(&Shape { h_kv: 5, ..s }).unwrap_err().to_string();
        assert!(e.contains("kv_heads = 5") && e.contains("H = 32"), "{e}");
        let e = c.validate(&Shape { s: 0, ..s }).unwrap_err().to_string();
        assert!(e.contains("seq_len = 0"), "{e}");
    }

    #[test]
    fn dtype_and_metric_parse_and_print() {
        for (txt, d) in [
            ("fp32", DType::F32),
            ("float32", DType::F32),
            ("bf16", DType::BF16),
            ("bfloat16", DType::BF16),
            ("fp16", DType::F16),
            ("Float16", DType::F16),
        ] {
            assert_eq!(txt.parse::<DType>().unwrap(), d);
            assert_eq!(d.to_string().parse::<DType>().unwrap(), d);
        }
        assert!("int8".parse::<DType>().is_err());
        assert_eq!("ip".parse::<Metric>().unwrap(), Metric::Ip);
        assert_eq!("euclidean".parse::<Metric>().unwrap(), Metric::Euclidean);
        assert!("cosine".parse::<Metric>().is_err());
        assert_eq!(DType::BF16.round(1.0 + 1.0 / 512.0), 1.0);
        assert_eq!(DType::F16.round(1.0 + 1.0 / 512.0), 1.0 + 1.0 / 512.0);
    }
}
