//! Prefill ("indexer first"): the PQ codebook of a prompt by k-means (spec:
//! `spec/pqcache-prefill.md` in the shared docs).
//!
//! Host side, no GPU code:
//! - this module: [`PrefillConfig`], [`PrefillShape`], [`KmeansInit`], the host tensors
//!   ([`PrefillInputs`], [`PrefillOutput`]) and the init keys ([`init_indices`]), which the
//!   CPU reference and the GPU use alike;
//! - [`reference`](mod@reference): the CPU implementation of the spec in f64
//!   ([`reference::prefill`]), the oracle for tests;
//! - [`check`](mod@check): the spec's "what counts as the same answer" rule
//!   ([`check::check`]);
//! - seeded generators (feature `cli`): [`PrefillInputs::random`] and
//!   [`PrefillInputs::separated`] (exact answers).
//!
//! The GPU side (kernels, device buffers, the launch sequence) lives in `gpu`.
//!
//! Groups: the `B * H_kv * M` problems `(b, g, m)` are independent; group `gi =
//! (b * H_kv + g) * M + m` clusters the `n = S - init_offset` subvectors
//! `key[b, g, init_offset + j, m * d_s .. (m + 1) * d_s]`, `j < n`.
//!
//! Layouts (row-major, host `Vec`s): `key [B, H_kv, S, D]`, `centroids [B, H_kv, M, K,
//! d_c]` fp32 (group `gi` is the `K * d_c` block at `gi * K * d_c`), codes upstream
//! `[B, n, H_kv, M]` i64, `phi [B * H_kv * M]` fp32 (metric ip), init indices
//! `[B * H_kv * M, K]` u32.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::config::{self, DType, Metric, PqConfig, Size};
use crate::error::{Error, Result};

pub mod check;
#[cfg(feature = "cli")]
mod generate;
mod gpu;
pub mod reference;

pub use check::{PrefillCheckMode, PrefillCheckReport, PrefillViolationKind};
pub use gpu::{DeviceKeys, GpuPrefill, PrefillResult, PrefillTiming};
pub use reference::RefPrefill;

/// The largest subvector dimension `d_s = D / M` the prefill kernels take.
pub const MAX_SUBVECTOR_DIM: usize = 256;

/// How the k-means centroids start (spec step 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KmeansInit {
    /// `c_k = x_{floor(k * n / K)}` for `k < K` (deterministic; the default).
    Strided,
    /// `K` distinct keys per group drawn without replacement by the generator of
    /// [`init_indices`], from `seed` and the group index.
    Random {
        /// Seed of the draw (the same seed gives the same keys).
        seed: u64,
    },
    /// Centroids passed in ([`PrefillInputs::centroids`]), e.g. a previous layer's.
    Given,
}

impl fmt::Display for KmeansInit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KmeansInit::Strided => f.write_str("strided"),
            KmeansInit::Random { seed } => write!(f, "random:{seed}"),
            KmeansInit::Given => f.write_str("given"),
        }
    }
}

impl FromStr for KmeansInit {
    type Err = Error;
    /// Accepts `strided`, `random` (seed 0), `random:SEED` (also `random=SEED`) and
    /// `given`, any case.
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim().to_ascii_lowercase();
        let bad = || Error::PqConfig {
            field: "kmeans_init",
            value: s.to_string(),
            expected: "strided, random, random:SEED (SEED a u64) or given".into(),
        };
        match t.as_str() {
            "strided" => Ok(KmeansInit::Strided),
            "random" => Ok(KmeansInit::Random { seed: 0 }),
            "given" => Ok(KmeansInit::Given),
            _ => match t
                .strip_prefix("random:")
                .or_else(|| t.strip_prefix("random="))
            {
                Some(seed) => seed
                    .trim()
                    .parse::<u64>()
                    .map(|seed| KmeansInit::Random { seed })
                    .map_err(|_| bad()),
                None => Err(bad()),
            },
        }
    }
}

/// Sizes of one prefill: `key` is `[b, h_kv, s, d]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PrefillShape {
    /// Batch size `B`.
    pub b: usize,
    /// KV heads `H_kv`.
    pub h_kv: usize,
    /// Sequence length `S` (the prompt).
    pub s: usize,
    /// Head dimension `D`.
    pub d: usize,
}

impl PrefillShape {
    /// Flat index of `key[b, g, p, 0]` in `[B, H_kv, S, D]`.
    pub fn key_offset(&self, b: usize, g: usize, p: usize) -> usize {
        ((b * self.h_kv + g) * self.s + p) * self.d
    }

    /// Number of values of `key`, `B * H_kv * S * D`.
    pub fn key_len(&self) -> usize {
        self.b * self.h_kv * self.s * self.d
    }
}

impl fmt::Display for PrefillShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "B={} H_kv={} S={} D={}",
            self.b, self.h_kv, self.s, self.d
        )
    }
}

/// The parameters of one prefill (spec "Inputs"). `M`, bits, metric, `init_offset` and
/// the key dtype mean what they mean for the decode step ([`PqConfig`]), so a codebook
/// built with them is the one decode steps continue ([`PrefillConfig::from_pq`],
/// [`PrefillConfig::pq_config`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PrefillConfig {
    /// `M`: subvectors per key (`D % M == 0`, `D / M <= 256`).
    pub pq_group_factor: usize,
    /// Bits per code, 1..=8: `K = 2^pq_bits` centroids per group.
    pub pq_bits: u32,
    /// Euclidean, or ip (keys augmented by the ip-to-l2 coordinate, `d_c = d_s + 1`).
    pub metric: Metric,
    /// Key `j` of a group is the token at position `init_offset + j`.
    pub init_offset: usize,
    /// At most this many Lloyd iterations (>= 1).
    pub kmeans_iter: usize,
    /// Where the centroids start.
    pub init: KmeansInit,
    /// dtype of `key` (host values are already rounded to it).
    pub input_dtype: DType,
}

impl PrefillConfig {
    /// The spec's benchmark settings for the given `M` and bits: euclidean,
    /// `init_offset = 128`, `kmeans_iter = 10`, strided init, bf16 keys.
    pub const fn benchmark(pq_group_factor: usize, pq_bits: u32) -> Self {
        PrefillConfig {
            pq_group_factor,
            pq_bits,
            metric: Metric::Euclidean,
            init_offset: 128,
            kmeans_iter: 10,
            init: KmeansInit::Strided,
            input_dtype: DType::BF16,
        }
    }

    /// The prefill of a decode config: its `M`, bits, metric, `init_offset` and
    /// `input_dtype`, with the given iteration cap and init.
    pub fn from_pq(cfg: &PqConfig, kmeans_iter: usize, init: KmeansInit) -> Self {
        PrefillConfig {
            pq_group_factor: cfg.pq_group_factor,
            pq_bits: cfg.pq_bits,
            metric: cfg.metric,
            init_offset: cfg.init_offset,
            kmeans_iter,
            init,
            input_dtype: cfg.input_dtype,
        }
    }

    /// The decode config that continues this prefill's codebook: this config's `M`,
    /// bits, metric, `init_offset` and `input_dtype`, with the given pattern sizes
    /// (counts or ratios of `S`, see [`Size`]) and `weight_list` dtype.
    pub fn pq_config(
        &self,
        sink_size: impl Into<Size>,
        window_size: impl Into<Size>,
        heavy_size: impl Into<Size>,
        weight_dtype: DType,
    ) -> PqConfig {
        PqConfig {
            sink_size: sink_size.into(),
            window_size: window_size.into(),
            heavy_size: heavy_size.into(),
            init_offset: self.init_offset,
            pq_group_factor: self.pq_group_factor,
            pq_bits: self.pq_bits,
            metric: self.metric,
            input_dtype: self.input_dtype,
            weight_dtype,
        }
    }

    /// `K = 2^pq_bits` centroids per group (valid for `pq_bits <= 8`; validate first).
    pub fn k_centroids(&self) -> usize {
        config::k_centroids(self.pq_bits)
    }

    /// `M`, subvectors per key (alias of `pq_group_factor`).
    pub fn m(&self) -> usize {
        self.pq_group_factor
    }

    /// Subvector dimension `d_s = D / M` (0 if `M == 0`; validate first).
    pub fn d_sub(&self, d: usize) -> usize {
        config::d_sub(self.pq_group_factor, d)
    }

    /// Centroid dimension `d_c`: `d_s` for euclidean, `d_s + 1` for ip.
    pub fn d_c(&self, d: usize) -> usize {
        config::d_c(self.metric, self.pq_group_factor, d)
    }

    /// `n = S - init_offset`, keys clustered per group (0 when `s <= init_offset`).
    pub fn n(&self, s: usize) -> usize {
        s.saturating_sub(self.init_offset)
    }

    /// Number of independent groups, `B * H_kv * M`.
    pub fn groups(&self, shape: &PrefillShape) -> usize {
        shape.b * shape.h_kv * self.pq_group_factor
    }

    /// `(b, g, m)` of group `gi = (b * H_kv + g) * M + m`.
    pub fn group_coords(&self, shape: &PrefillShape, gi: usize) -> (usize, usize, usize) {
        let mm = self.pq_group_factor.max(1);
        let bg = gi / mm;
        (bg / shape.h_kv.max(1), bg % shape.h_kv.max(1), gi % mm)
    }

    /// Number of values of `centroids`, `B * H_kv * M * K * d_c`.
    pub fn centroids_len(&self, shape: &PrefillShape) -> usize {
        self.groups(shape) * self.k_centroids() * self.d_c(shape.d)
    }

    /// Number of codes in the upstream layout `[B, n, H_kv, M]`.
    pub fn codes_len(&self, shape: &PrefillShape) -> usize {
        shape.b * self.n(shape.s) * shape.h_kv * self.pq_group_factor
    }

    /// Flat index of `codes[b, j, g, m]` in the upstream layout `[B, n, H_kv, M]`.
    pub fn code_index(
        &self,
        shape: &PrefillShape,
        b: usize,
        j: usize,
        g: usize,
        m: usize,
    ) -> usize {
        ((b * self.n(shape.s) + j) * shape.h_kv + g) * self.pq_group_factor + m
    }

    /// Check the config against a shape.
    ///
    /// Errors ([`Error::PqConfig`], naming the field, its value and what is allowed):
    /// any of `B, H_kv, S, D` zero; `M == 0` or `D % M != 0`; `D / M > 256`
    /// ([`MAX_SUBVECTOR_DIM`], the kernels' limit); `pq_bits` outside 1..=8;
    /// `kmeans_iter == 0` (or above `u32::MAX`); `n = S - init_offset < K` (field
    /// `seq_len`, the message names `n`, `S`, `init_offset` and `K`); `S` too large for
    /// the u32 key indices.
    pub fn validate(&self, shape: &PrefillShape) -> Result<()> {
        for (field, v) in [
            ("batch", shape.b),
            ("kv_heads", shape.h_kv),
            ("seq_len", shape.s),
            ("head_dim", shape.d),
        ] {
            if v == 0 {
                return Err(Error::PqConfig {
                    field,
                    value: "0".into(),
                    expected: "a positive size".into(),
                });
            }
        }
        let m = self.pq_group_factor;
        config::check_group_factor(m, shape.d)?;
        if shape.d / m > MAX_SUBVECTOR_DIM {
            return Err(Error::PqConfig {
                field: "pq_group_factor",
                value: m.to_string(),
                expected: format!(
                    "subvector dim D/M <= {MAX_SUBVECTOR_DIM} (the prefill kernels' limit), \
                     got D/M = {}/{m} = {}",
                    shape.d,
                    shape.d / m
                ),
            });
        }
        config::check_bits(self.pq_bits)?;
        if self.kmeans_iter == 0 || self.kmeans_iter > u32::MAX as usize {
            return Err(Error::PqConfig {
                field: "kmeans_iter",
                value: self.kmeans_iter.to_string(),
                expected: format!("1..={} Lloyd iterations", u32::MAX),
            });
        }
        if shape.s > u32::MAX as usize {
            return Err(Error::PqConfig {
                field: "seq_len",
                value: shape.s.to_string(),
                expected: format!("at most {} (key indices are u32)", u32::MAX),
            });
        }
        let (n, k) = (self.n(shape.s), self.k_centroids());
        if n < k {
            return Err(Error::PqConfig {
                field: "seq_len",
                value: shape.s.to_string(),
                expected: format!(
                    "n = S - init_offset = {} - {} = {n} must be >= K = 2^bits = 2^{} = {k} \
                     (k-means needs at least K keys per group)",
                    shape.s, self.init_offset, self.pq_bits
                ),
            });
        }
        Ok(())
    }
}

impl fmt::Display for PrefillConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "M={} bits={} (K={}) metric={} init_offset={} kmeans_iter={} init={} dtype={}",
            self.pq_group_factor,
            self.pq_bits,
            self.k_centroids(),
            self.metric,
            self.init_offset,
            self.kmeans_iter,
            self.init,
            self.input_dtype
        )
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): `state += 0x9E3779B97F4A7C15`, then the
/// output is the state mixed by [`mix64`].
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0)
    }
}

/// The SplitMix64 finalizer.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The `K` distinct random keys of group `gi`: see [`init_indices`].
fn random_indices(seed: u64, gi: u64, n: usize, k: usize) -> Vec<u32> {
    let mut rng = SplitMix64(seed ^ mix64(gi.wrapping_add(0x9E37_79B9_7F4A_7C15)));
    // The permutation of 0..n, stored sparsely: `swapped[i]` when position i was
    // overwritten, else i itself.
    let mut swapped: HashMap<u64, u64> = HashMap::with_capacity(2 * k);
    let n = n as u64;
    (0..k as u64)
        .map(|i| {
            let r = i + ((rng.next() as u128 * (n - i) as u128) >> 64) as u64;
            let at_r = *swapped.get(&r).unwrap_or(&r);
            let at_i = *swapped.get(&i).unwrap_or(&i);
            swapped.insert(r, at_i);
            at_r as u32
        })
        .collect()
}

/// The keys the centroids start from (spec step 3), `[B * H_kv * M, K]` u32 key indices
/// `j` (token `init_offset + j`), group `gi = (b * H_kv + g) * M + m`; `None` for
/// [`KmeansInit::Given`]. The CPU reference and the GPU both start from exactly these.
///
/// - [`KmeansInit::Strided`]: `floor(k * n / K)` (computed in u64), the same for every
///   group.
/// - [`KmeansInit::Random`]: a partial Fisher-Yates shuffle of `0..n`: a SplitMix64
///   generator with initial state `seed ^ mix64(gi + 0x9E3779B97F4A7C15)` (`mix64` the
///   SplitMix64 finalizer, wrapping addition) draws, for `i = 0..K`,
///   `r = i + floor(u * (n - i) / 2^64)` with `u` its next output, swaps positions `i`
///   and `r` of the permutation and takes position `i`. The `K` indices are distinct
///   and in `0..n`, in draw order (the multiply-shift maps to `0..n-i` with a bias
///   below `n / 2^64`, irrelevant here).
///
/// Call with a validated config ([`PrefillConfig::validate`]); for an invalid one the
/// result is unspecified (never a panic for `n >= K`).
pub fn init_indices(cfg: &PrefillConfig, shape: &PrefillShape) -> Option<Vec<u32>> {
    let (n, k, groups) = (cfg.n(shape.s), cfg.k_centroids(), cfg.groups(shape));
    match cfg.init {
        KmeansInit::Given => None,
        KmeansInit::Strided => {
            let row: Vec<u32> = (0..k as u64)
                .map(|c| (c * n as u64 / k as u64) as u32)
                .collect();
            Some(row.repeat(groups))
        }
        KmeansInit::Random { seed } => {
            let mut out = Vec::with_capacity(groups * k);
            for gi in 0..groups {
                out.extend(random_indices(seed, gi as u64, n.max(k), k));
            }
            Some(out)
        }
    }
}

/// The host inputs of one prefill. Values are held as `f32`; with a bf16/fp16
/// `input_dtype` they are already rounded to it, so CPU and GPU see the same numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefillInputs {
    /// The sizes.
    pub shape: PrefillShape,
    /// `[B, H_kv, S, D]`; positions `init_offset .. S` are clustered.
    pub key: Vec<f32>,
    /// `[B, H_kv, M, K, d_c]` fp32 starting centroids, required for
    /// [`KmeansInit::Given`] and ignored otherwise. Under ip the last coordinate is the
    /// augmented one.
    pub centroids: Option<Vec<f32>>,
}

impl PrefillInputs {
    /// The prompt of a decode step's inputs as a prefill's: positions `0 .. s_p` of its
    /// keys (`[B, H_kv, s_p, D]`), no given centroids. A decode step at `S` then continues
    /// from the prefill's codebook (`N_cached = s_p - init_offset`).
    ///
    /// Errors: [`Error::PqConfig`] when `s_p` exceeds the step's `S`.
    pub fn prompt_of(inputs: &super::workload::PqInputs, s_p: usize) -> Result<Self> {
        let sh = inputs.shape;
        if s_p > sh.s {
            return Err(Error::PqConfig {
                field: "seq_len",
                value: s_p.to_string(),
                expected: format!("a prompt no longer than the step's S = {}", sh.s),
            });
        }
        let mut key = Vec::with_capacity(sh.b * sh.h_kv * s_p * sh.d);
        for bg in 0..sh.b * sh.h_kv {
            key.extend_from_slice(&inputs.key[bg * sh.s * sh.d..(bg * sh.s + s_p) * sh.d]);
        }
        Ok(PrefillInputs {
            shape: PrefillShape {
                b: sh.b,
                h_kv: sh.h_kv,
                s: s_p,
                d: sh.d,
            },
            key,
            centroids: None,
        })
    }

    /// The first non-finite value (NaN or infinity), as (tensor name in the upstream
    /// files, flat index, value), looking at `key` then `pq_centroids`.
    pub fn first_nonfinite(&self) -> Option<(&'static str, usize, f32)> {
        let cents: &[f32] = self.centroids.as_deref().unwrap_or(&[]);
        [("key", &self.key[..]), ("pq_centroids", cents)]
            .into_iter()
            .find_map(|(name, v)| {
                v.iter()
                    .position(|x| !x.is_finite())
                    .map(|i| (name, i, v[i]))
            })
    }

    /// Check the config against the shape ([`PrefillConfig::validate`]), the tensor
    /// lengths, the given centroids' presence for [`KmeansInit::Given`], and that every
    /// value is finite (the prefill has no rule for NaN or infinity).
    ///
    /// Errors: [`Error::PqConfig`], or [`Error::PqTensor`] naming the tensor, the
    /// expected length/shape (or "finite values") and what was found (for a non-finite
    /// value: the value and its flat index).
    pub fn validate(&self, cfg: &PrefillConfig) -> Result<()> {
        let sh = &self.shape;
        cfg.validate(sh)?;
        let bad = |tensor: &str, expected: String, got: String| Error::PqTensor {
            file: None,
            tensor: tensor.into(),
            expected,
            got,
        };
        if self.key.len() != sh.key_len() {
            return Err(bad(
                "key",
                format!(
                    "{} values [B={}, H_kv={}, S={}, D={}]",
                    sh.key_len(),
                    sh.b,
                    sh.h_kv,
                    sh.s,
                    sh.d
                ),
                format!("{} values", self.key.len()),
            ));
        }
        if cfg.init == KmeansInit::Given {
            let want = cfg.centroids_len(sh);
            let got = self.centroids.as_ref().map(Vec::len);
            if got != Some(want) {
                return Err(bad(
                    "pq_centroids",
                    format!(
                        "{want} fp32 values [B={}, H_kv={}, M={}, K={}, d_c={}] for init given \
                         (metric {})",
                        sh.b,
                        sh.h_kv,
                        cfg.pq_group_factor,
                        cfg.k_centroids(),
                        cfg.d_c(sh.d),
                        cfg.metric
                    ),
                    got.map_or("none".into(), |n| format!("{n} values")),
                ));
            }
        }
        if let Some((name, i, v)) = self.first_nonfinite() {
            // Centroids that are not used (init other than given) do not matter.
            if name == "key" || cfg.init == KmeansInit::Given {
                return Err(bad(
                    name,
                    "finite values (the prefill has no rule for NaN or infinity)".into(),
                    format!("{v} at flat index {i}"),
                ));
            }
        }
        Ok(())
    }
}

/// The result of one prefill (spec step 6), host side.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefillOutput {
    /// `[B, H_kv, M, K, d_c]` fp32 final centroids (`pq_centroids`).
    pub centroids: Vec<f32>,
    /// `[B, n, H_kv, M]` codes in `0..K` (`pq_codebook`, upstream layout): the argmin
    /// against the final centroids.
    pub codes: Vec<i64>,
    /// `[B * H_kv * M]` fp32 ip-to-l2 constants (`pq_ip2l2_phi`); `None` for euclidean.
    pub phi: Option<Vec<f32>>,
    /// `n = S - init_offset`, keys per group (dimension 1 of `codes`).
    pub n: usize,
    /// `[B * H_kv * M]`: Lloyd iterations run per group, counted as centroid updates
    /// (`1..=kmeans_iter`; fewer than `kmeans_iter` when the assignment stopped
    /// changing).
    pub iterations: Vec<u32>,
}

/// Codes in the runtime's group-major layout `[B * H_kv * M, capacity]` (u8, the first
/// `n` of each row valid; group `gi = (b * H_kv + g) * M + m`) turned into the upstream
/// layout `[B, n, H_kv, M]` i64.
///
/// # Panics
/// If `codes.len() < groups * capacity` or `capacity < n`.
pub fn upstream_codes(
    cfg: &PrefillConfig,
    shape: &PrefillShape,
    codes: &[u8],
    capacity: usize,
) -> Vec<i64> {
    let (n, groups) = (cfg.n(shape.s), cfg.groups(shape));
    assert!(capacity >= n, "capacity {capacity} < n {n}");
    assert!(
        codes.len() >= groups * capacity,
        "{} codes < groups {groups} * capacity {capacity}",
        codes.len()
    );
    let (hkv, mm) = (shape.h_kv, cfg.pq_group_factor);
    let mut out = vec![0i64; cfg.codes_len(shape)];
    for gi in 0..groups {
        let (b, g, m) = cfg.group_coords(shape, gi);
        let row = &codes[gi * capacity..gi * capacity + n];
        for (j, &c) in row.iter().enumerate() {
            out[((b * n + j) * hkv + g) * mm + m] = c as i64;
        }
    }
    out
}
