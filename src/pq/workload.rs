//! Host tensors of one indexer step ([`PqInputs`]) and seeded generators for them.
//!
//! Two generators:
//! - [`PqInputs::random`]: the spec's workload inputs. Standard normal query, keys and
//!   centroids, uniform codes. Every tensor is cut into fixed-size chunks (keys: one row
//!   of `D` values per stream), each with its own SmallRng (Xoshiro256++) stream derived
//!   from the seed and the chunk index, filled on all cores; the result depends only on
//!   the seed and the sizes, never on the thread count or on the [`KeyFill`] policy.
//! - [`PqInputs::small_integer`]: small-integer query, keys and centroids whose scores
//!   are exact in fp32 and whose heavy set is separated from the other candidates by a
//!   gap of at least `M`, so two correct implementations must choose the same heavy set.
//!
//! Keys and memory: `key` is `[B, H_kv, S, D]`, so the large workload (B=4, H_kv=32,
//! S=131072, D=128) holds 2^31 values, 8.6 GB in f32, of which a step reads only the new
//! keys (positions `init_offset + N_cached .. S`: one row per `(b, g)` by default).
//! [`KeyFill::Auto`] (what [`PqInputs::random`] uses) fills every key when the tensor has
//! at most [`FULL_KEY_FILL_LIMIT`] values (the reference workload: 131M, 524 MB), and
//! otherwise only the rows the step reads plus the [`KEY_MARGIN`] rows before them; the
//! others stay 0.0 in a zeroed allocation the OS never backs with memory until written,
//! so generating the large workload costs milliseconds and a few hundred MB (its codes).
//! An implementation that reads the wrong key rows then reads zeros (or a margin row),
//! whose codes differ from the right ones with probability about `1 - 1/K` per
//! subvector, so the check still catches it.

use super::config::{Metric, PqConfig, Shape};
use crate::error::{Error, Result};

/// [`KeyFill::Auto`] fills every key when `key` has at most this many values (2^27,
/// 512 MiB in f32; the reference workload has 131M).
pub const FULL_KEY_FILL_LIMIT: usize = 1 << 27;

/// With [`KeyFill::Needed`], this many key rows before the first new key are also
/// filled, so an off-by-a-few position bug reads a random key rather than a zero.
pub const KEY_MARGIN: usize = 64;

/// Which key rows a generator fills (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyFill {
    /// Every row of `key`.
    All,
    /// Only the rows the step reads (positions `init_offset + N_cached .. S`) and the
    /// [`KEY_MARGIN`] rows before them; the others are 0.0.
    Needed,
    /// `All` up to [`FULL_KEY_FILL_LIMIT`] values, `Needed` above.
    Auto,
}

/// The host tensors of one decode step, all row-major, values held as `f32`.
///
/// When the config's `input_dtype` is bf16/fp16, `query` and `key` hold values already
/// rounded to that dtype (the dtype itself lives in [`PqConfig::input_dtype`]), so the CPU
/// reference and a GPU pipeline that reads the narrow type see the same numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct PqInputs {
    /// The step's sizes.
    pub shape: Shape,
    /// `[B, H, 1, D]`.
    pub query: Vec<f32>,
    /// `[B, H_kv, S, D]`; a step reads only positions `init_offset + n_cached .. S`
    /// (generated inputs may leave the other rows 0.0: see [`KeyFill`]).
    pub key: Vec<f32>,
    /// `[B, H_kv, M, K, d_c]` fp32 (`d_c = d_s + 1` for metric ip).
    pub centroids: Vec<f32>,
    /// Codes of the already quantized keys, upstream layout `[B, n_cached, H_kv, M]`,
    /// each in `0..K`.
    pub codes: Vec<i64>,
    /// `N_cached`: quantized keys held in `codes` (`<= max(0, S - init_offset)`).
    pub n_cached: usize,
    /// `[B * H_kv * M]` fp32 ip-to-l2 constants, index `(b * H_kv + g) * M + m`.
    /// Required for metric ip, ignored for euclidean.
    pub phi: Option<Vec<f32>>,
}

impl PqInputs {
    /// The first non-finite value (NaN or infinity) among the float inputs, as (tensor
    /// name in the upstream files, flat index, value), looking at `query`, `key`,
    /// `pq_centroids` and `pq_ip2l2_phi` in that order.
    pub fn first_nonfinite(&self) -> Option<(&'static str, usize, f32)> {
        let phi: &[f32] = self.phi.as_deref().unwrap_or(&[]);
        [
            ("query", &self.query[..]),
            ("key", &self.key[..]),
            ("pq_centroids", &self.centroids[..]),
            ("pq_ip2l2_phi", phi),
        ]
        .into_iter()
        .find_map(|(name, v)| {
            v.iter()
                .position(|x| !x.is_finite())
                .map(|i| (name, i, v[i]))
        })
    }

    /// The spec's default number of cached codes for a step at length `s`:
    /// `s - 1 - init_offset` (so the step quantizes exactly one new key), 0 if negative.
    pub fn default_n_cached(cfg: &PqConfig, s: usize) -> usize {
        s.saturating_sub(1).saturating_sub(cfg.init_offset)
    }

    /// Flat index of `key[b, g, p, 0]`.
    pub fn key_offset(&self, b: usize, g: usize, p: usize) -> usize {
        ((b * self.shape.h_kv + g) * self.shape.s + p) * self.shape.d
    }

    /// Flat index of `query[b, h, 0, 0]`.
    pub fn query_offset(&self, b: usize, h: usize) -> usize {
        (b * self.shape.h + h) * self.shape.d
    }

    /// Flat index of `centroids[b, g, m, 0, 0]` (the `K * d_c` block of one subvector).
    pub fn centroid_offset(&self, cfg: &PqConfig, b: usize, g: usize, m: usize) -> usize {
        let mm = cfg.pq_group_factor;
        ((b * self.shape.h_kv + g) * mm + m) * cfg.k_centroids() * cfg.d_c(self.shape.d)
    }

    /// Check every tensor's length against the shape and config, the code range and
    /// `n_cached`. Errors: [`Error::PqConfig`] from [`PqConfig::validate`], or
    /// [`Error::PqTensor`] naming the tensor, the expected shape/range and what was found.
    pub fn validate(&self, cfg: &PqConfig) -> Result<()> {
        let sh = &self.shape;
        cfg.validate(sh)?;
        let (mm, k, dc) = (cfg.pq_group_factor, cfg.k_centroids(), cfg.d_c(sh.d));
        let bad = |tensor: &str, expected: String, got: String| Error::PqTensor {
            file: None,
            tensor: tensor.into(),
            expected,
            got,
        };
        let want = [
            (
                "query",
                sh.b * sh.h * sh.d,
                self.query.len(),
                format!("[B={}, H={}, 1, D={}]", sh.b, sh.h, sh.d),
            ),
            (
                "key",
                sh.b * sh.h_kv * sh.s * sh.d,
                self.key.len(),
                format!("[B={}, H_kv={}, S={}, D={}]", sh.b, sh.h_kv, sh.s, sh.d),
            ),
            (
                "pq_centroids",
                sh.b * sh.h_kv * mm * k * dc,
                self.centroids.len(),
                format!(
                    "[B={}, H_kv={}, M={mm}, K={k}, d_c={dc}] (metric {})",
                    sh.b, sh.h_kv, cfg.metric
                ),
            ),
        ];
        for (name, n, got, shape) in want {
            if n != got {
                return Err(bad(
                    name,
                    format!("{n} values {shape}"),
                    format!("{got} values"),
                ));
            }
        }
        let max_n = cfg.n_quantized(sh.s);
        if self.n_cached > max_n {
            return Err(bad(
                "pq_codebook",
                format!(
                    "at most S - init_offset = {} - {} = {max_n} cached keys",
                    sh.s, cfg.init_offset
                ),
                format!("N_cached = {}", self.n_cached),
            ));
        }
        let ncodes = sh.b * self.n_cached * sh.h_kv * mm;
        if self.codes.len() != ncodes {
            return Err(bad(
                "pq_codebook",
                format!(
                    "{ncodes} values [B={}, N={}, H_kv={}, M={mm}]",
                    sh.b, self.n_cached, sh.h_kv
                ),
                format!("{} values", self.codes.len()),
            ));
        }
        if let Some((i, &c)) = self
            .codes
            .iter()
            .enumerate()
            .find(|&(_, &c)| c < 0 || c >= k as i64)
        {
            return Err(bad(
                "pq_codebook",
                format!("codes in 0..K = 0..{k}"),
                format!("{c} at flat index {i}"),
            ));
        }
        match (&self.phi, cfg.metric) {
            (None, Metric::Ip) => {
                return Err(bad(
                    "pq_ip2l2_phi",
                    format!(
                        "{} fp32 values [B*H_kv*M] for metric ip",
                        sh.b * sh.h_kv * mm
                    ),
                    "no phi".into(),
                ))
            }
            (Some(p), Metric::Ip) if p.len() != sh.b * sh.h_kv * mm => {
                return Err(bad(
                    "pq_ip2l2_phi",
                    format!(
                        "{} values [B*H_kv*M = {}*{}*{mm}]",
                        sh.b * sh.h_kv * mm,
                        sh.b,
                        sh.h_kv
                    ),
                    format!("{} values", p.len()),
                ))
            }
            _ => {}
        }
        Ok(())
    }
}
