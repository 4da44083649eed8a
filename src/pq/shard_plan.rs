//! Heads split over several GPUs, as a tensor-parallel engine shards attention: pure
//! arithmetic and host-side slicing and stitching, no GPU ([`ShardPlan`]).
//!
//! The indexer has no communication across heads: query head `h` reads only KV head
//! `h / (H / H_kv)`, its own codes, centroids and phi. So `G` devices each run the whole
//! step on a contiguous slice of the heads: device `d` holds query heads
//! `[d H/G, (d+1) H/G)` and KV heads `[d H_kv/G, (d+1) H_kv/G)`, which are exactly the KV
//! heads its query heads read. That needs `H_kv % G == 0` (then `H % G == 0` too, since
//! `H_kv` divides `H`). Each device's tensors are the full tensors cut along their head
//! dimension; its outputs are the rows of its query heads, and [`ShardPlan::stitch`] puts
//! them back into the full `[B, H, ...]` layout so the CPU reference of the whole batch
//! checks the union.
//!
//! [`crate::pq::sharded::ShardedIndexer`] runs it on the GPUs.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::pq::config::{PqConfig, Shape};
use crate::pq::reference::PqOutput;
use crate::pq::workload::PqInputs;

/// How `H` query heads and `H_kv` KV heads split over `G` devices (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardPlan {
    shape: Shape,
    devices: usize,
}

/// Rows `range` of dimension 1 of a row-major `[outer, dim, inner]` tensor, as a new
/// `[outer, range.len(), inner]` tensor.
fn cut<T: Copy>(v: &[T], outer: usize, dim: usize, inner: usize, range: &Range<usize>) -> Vec<T> {
    let mut out = Vec::with_capacity(outer * range.len() * inner);
    for o in 0..outer {
        let base = (o * dim + range.start) * inner;
        out.extend_from_slice(&v[base..base + range.len() * inner]);
    }
    out
}

/// Write `part` (`[outer, range.len(), inner]`) into rows `range` of dimension 1 of
/// `full` (`[outer, dim, inner]`).
fn paste<T: Copy>(
    full: &mut [T],
    part: &[T],
    outer: usize,
    dim: usize,
    inner: usize,
    range: &Range<usize>,
) {
    let n = range.len() * inner;
    for o in 0..outer {
        let base = (o * dim + range.start) * inner;
        full[base..base + n].copy_from_slice(&part[o * n..(o + 1) * n]);
    }
}

impl ShardPlan {
    /// The split of `shape`'s heads over `devices` devices.
    ///
    /// Errors: [`Error::Invalid`] when `devices` is 0, `H_kv` is 0, `H % H_kv != 0`, or
    /// `H_kv % devices != 0` (naming `H_kv`, `G` and the device counts that would work).
    pub fn new(shape: Shape, devices: usize) -> Result<Self> {
        if devices == 0 {
            return Err(Error::invalid(
                "devices",
                "at least one device is needed to shard the heads over",
            ));
        }
        if shape.h_kv == 0 || !shape.h.is_multiple_of(shape.h_kv) {
            return Err(Error::invalid(
                "kv_heads",
                format!(
                    "H_kv = {} must be positive and divide H = {}",
                    shape.h_kv, shape.h
                ),
            ));
        }
        if !shape.h_kv.is_multiple_of(devices) {
            let fits: Vec<String> = (1..=shape.h_kv)
                .filter(|g| shape.h_kv.is_multiple_of(*g))
                .map(|g| g.to_string())
                .collect();
            return Err(Error::invalid(
                "devices",
                format!(
                    "H_kv = {} KV heads cannot be split evenly over G = {devices} devices \
                     (H_kv % G = {}); each device must hold whole KV heads with their \
                     query heads: G must divide H_kv (one of {})",
                    shape.h_kv,
                    shape.h_kv % devices,
                    fits.join(", ")
                ),
            ));
        }
        Ok(ShardPlan { shape, devices })
    }

    /// The full shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// `G`, the number of devices (shards).
    pub fn devices(&self) -> usize {
        self.devices
    }

    /// The shape one device runs: `H / G` query heads, `H_kv / G` KV heads, the rest
    /// (`B`, `S`, `D`) unchanged. The same for every device.
    pub fn shard_shape(&self) -> Shape {
        Shape {
            h: self.shape.h / self.devices,
            h_kv: self.shape.h_kv / self.devices,
            ..self.shape
        }
    }

    /// Query heads of shard `d`: `[d H/G, (d+1) H/G)`. Panics if `d >= G`.
    pub fn q_heads(&self, d: usize) -> Range<usize> {
        assert!(d < self.devices, "shard {d} of {}", self.devices);
        let n = self.shape.h / self.devices;
        d * n..(d + 1) * n
    }

    /// KV heads of shard `d`: `[d H_kv/G, (d+1) H_kv/G)`. Panics if `d >= G`.
    pub fn kv_heads(&self, d: usize) -> Range<usize> {
        assert!(d < self.devices, "shard {d} of {}", self.devices);
        let n = self.shape.h_kv / self.devices;
        d * n..(d + 1) * n
    }

    /// The shard a query head belongs to. Panics if `h >= H`.
    pub fn shard_of_head(&self, h: usize) -> usize {
        assert!(h < self.shape.h, "head {h} of {}", self.shape.h);
        h / (self.shape.h / self.devices)
    }

    fn check_shard(&self, d: usize) -> Result<()> {
        if d >= self.devices {
            return Err(Error::invalid(
                "shard",
                format!("shard {d} of a plan over {} devices", self.devices),
            ));
        }
        Ok(())
    }

    fn check_len(what: &str, got: usize, want: usize, layout: String) -> Result<()> {
        if got != want {
            return Err(Error::invalid(
                what,
                format!("expected {want} values {layout}, got {got}"),
            ));
        }
        Ok(())
    }

    /// Shard `d`'s centroids `f32 [B, H_kv/G, M, K, d_c]` cut from the full
    /// `[B, H_kv, M, K, d_c]`.
    ///
    /// Errors: `d >= G`, a length that does not match the shape and config.
    pub fn slice_centroids(&self, cfg: &PqConfig, centroids: &[f32], d: usize) -> Result<Vec<f32>> {
        self.check_shard(d)?;
        let sh = self.shape;
        let inner = cfg.m() * cfg.k_centroids() * cfg.d_c(sh.d);
        Self::check_len(
            "pq_centroids",
            centroids.len(),
            sh.b * sh.h_kv * inner,
            format!("[B={}, H_kv={}, M, K, d_c]", sh.b, sh.h_kv),
        )?;
        Ok(cut(centroids, sh.b, sh.h_kv, inner, &self.kv_heads(d)))
    }

    /// Shard `d`'s phi `f32 [B * H_kv/G * M]` cut from the full `[B * H_kv * M]`.
    ///
    /// Errors: `d >= G`, a length that does not match.
    pub fn slice_phi(&self, cfg: &PqConfig, phi: &[f32], d: usize) -> Result<Vec<f32>> {
        self.check_shard(d)?;
        let sh = self.shape;
        Self::check_len(
            "pq_ip2l2_phi",
            phi.len(),
            sh.b * sh.h_kv * cfg.m(),
            format!("[B={} * H_kv={} * M={}]", sh.b, sh.h_kv, cfg.m()),
        )?;
        Ok(cut(phi, sh.b, sh.h_kv, cfg.m(), &self.kv_heads(d)))
    }

    /// Shard `d`'s codes `i64 [B, n, H_kv/G, M]` cut from the full upstream-layout
    /// `[B, n, H_kv, M]`.
    ///
    /// Errors: `d >= G`, a length that does not match.
    pub fn slice_codes(
        &self,
        cfg: &PqConfig,
        codes: &[i64],
        n: usize,
        d: usize,
    ) -> Result<Vec<i64>> {
        self.check_shard(d)?;
        let sh = self.shape;
        Self::check_len(
            "pq_codebook",
            codes.len(),
            sh.b * n * sh.h_kv * cfg.m(),
            format!("[B={}, N={n}, H_kv={}, M={}]", sh.b, sh.h_kv, cfg.m()),
        )?;
        Ok(cut(codes, sh.b * n, sh.h_kv, cfg.m(), &self.kv_heads(d)))
    }

    /// Shard `d`'s inputs: query `[B, H/G, 1, D]`, key `[B, H_kv/G, S, D]`, centroids,
    /// phi and codes of its KV heads, `n_cached` unchanged; its shape is
    /// [`ShardPlan::shard_shape`].
    ///
    /// Errors: `d >= G`, inputs whose shape is not this plan's, or whose lengths do not
    /// match it ([`PqInputs::validate`]).
    pub fn slice_inputs(&self, cfg: &PqConfig, inputs: &PqInputs, d: usize) -> Result<PqInputs> {
        self.check_shard(d)?;
        if inputs.shape != self.shape {
            return Err(Error::invalid(
                "inputs",
                format!("shape {} but the plan splits {}", inputs.shape, self.shape),
            ));
        }
        inputs.validate(cfg)?;
        let sh = self.shape;
        Ok(PqInputs {
            shape: self.shard_shape(),
            query: cut(&inputs.query, sh.b, sh.h, sh.d, &self.q_heads(d)),
            key: cut(&inputs.key, sh.b, sh.h_kv, sh.s * sh.d, &self.kv_heads(d)),
            centroids: self.slice_centroids(cfg, &inputs.centroids, d)?,
            codes: self.slice_codes(cfg, &inputs.codes, inputs.n_cached, d)?,
            n_cached: inputs.n_cached,
            phi: match &inputs.phi {
                Some(p) => Some(self.slice_phi(cfg, p, d)?),
                None => None,
            },
        })
    }

    /// The full step output from the shards' outputs, in shard order: `sparse_list
    /// [B, H, total]`, `sparse_len [B, H]`, `weight_list [B, H, S]` take each shard's
    /// rows at its query heads, `codes [B, n, H_kv, M]` each shard's KV heads.
    ///
    /// Errors: not exactly `G` parts; a part whose heads, `B`, `S`, `total`, `M`,
    /// `n_cached` or tensor lengths do not fit this plan (named, with the shard).
    pub fn stitch(&self, parts: &[PqOutput]) -> Result<PqOutput> {
        if parts.len() != self.devices {
            return Err(Error::invalid(
                "shard outputs",
                format!(
                    "{} parts for a plan over {} devices",
                    parts.len(),
                    self.devices
                ),
            ));
        }
        let sh = self.shape;
        let ss = self.shard_shape();
        let first = &parts[0];
        let (total, s, m, n) = (first.total, first.s, first.m, first.n_cached);
        for (d, p) in parts.iter().enumerate() {
            let bad = [
                ("B", p.b, sh.b),
                ("H", p.h, ss.h),
                ("H_kv", p.h_kv, ss.h_kv),
                ("S", p.s, s),
                ("total", p.total, total),
                ("M", p.m, m),
                ("n_cached", p.n_cached, n),
                (
                    "sparse_list length",
                    p.sparse_list.len(),
                    sh.b * ss.h * total,
                ),
                ("sparse_len length", p.sparse_len.len(), sh.b * ss.h),
                ("weight_list length", p.weight_list.len(), sh.b * ss.h * s),
                ("codes length", p.codes.len(), sh.b * n * ss.h_kv * m),
            ]
            .into_iter()
            .find(|(_, got, want)| got != want);
            if let Some((what, got, want)) = bad {
                return Err(Error::invalid(
                    "shard outputs",
                    format!("shard {d}: {what} is {got}, expected {want}"),
                ));
            }
        }
        let mut out = PqOutput {
            b: sh.b,
            h: sh.h,
            h_kv: sh.h_kv,
            m,
            s,
            total,
            sparse_list: vec![0; sh.b * sh.h * total],
            sparse_len: vec![0; sh.b * sh.h],
            weight_list: vec![0.0; sh.b * sh.h * s],
            codes: vec![0; sh.b * n * sh.h_kv * m],
            n_cached: n,
        };
        for (d, p) in parts.iter().enumerate() {
            let (q, kv) = (self.q_heads(d), self.kv_heads(d));
            paste(&mut out.sparse_list, &p.sparse_list, sh.b, sh.h, total, &q);
            paste(&mut out.sparse_len, &p.sparse_len, sh.b, sh.h, 1, &q);
            paste(&mut out.weight_list, &p.weight_list, sh.b, sh.h, s, &q);
            paste(&mut out.codes, &p.codes, sh.b * n, sh.h_kv, m, &kv);
        }
        Ok(out)
    }
}

/// Parse a device list as `--devices` takes it: comma-separated ordinals (`0,1`),
/// ranges (`0-3`) or both (`0,2-3`); whitespace around items is ignored.
///
/// Errors: [`Error::Invalid`] for an empty list or item, a non-number, a backward range,
/// or an ordinal given twice (a device holds one shard).
pub fn parse_devices(s: &str) -> Result<Vec<usize>> {
    let bad = |msg: String| Error::invalid("devices", msg);
    let num = |t: &str| {
        t.trim().parse::<usize>().map_err(|_| {
            bad(format!(
                "{t:?} in {s:?} is not a device ordinal (expected e.g. 0,1 or 0-3)"
            ))
        })
    };
    let mut out: Vec<usize> = Vec::new();
    if s.trim().is_empty() {
        return Err(bad(
            "empty list (expected ordinals such as 0,1 or 0-3)".into()
        ));
    }
    for item in s.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(bad(format!("empty item in {s:?} (expected e.g. 0,1)")));
        }
        let range = match item.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if b < a {
                    return Err(bad(format!("range {item:?} runs backwards")));
                }
                a..b + 1
            }
            None => {
                let a = num(item)?;
                a..a + 1
            }
        };
        for o in range {
            if out.contains(&o) {
                return Err(bad(format!(
                    "device {o} appears twice in {s:?} (each device holds one shard)"
                )));
            }
            out.push(o);
        }
    }
    Ok(out)
}
