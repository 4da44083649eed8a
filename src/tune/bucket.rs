//! Shape buckets: which launches share a tuning result.
//!
//! # What a bucket is, and why
//!
//! The fastest variant of a kernel depends on the launch's shape, but tuning every exact
//! shape is impossible (the number of keys `n` grows by one every decode step). A *shape
//! bucket* is the set of launches that are assumed to share one winner: the tuner times
//! one representative shape per bucket, and at launch the runtime maps the actual shape
//! to its bucket and takes that bucket's winner.
//!
//! Two forces decide what goes into the key:
//!
//! - **Speed.** Features that change which variant is fastest, rounded so that a bucket
//!   covers many shapes: the number of rows (`B * H`, the grid's second dimension) and
//!   the keys per row `n` (the grid's first dimension) are rounded up to a power of two,
//!   the top-k size `heavy` is rounded up to the power of two a top-k kernel pads to.
//!   The subvector dimension `d_s` and the centroid count `K` are few distinct values
//!   that shape the inner loops, and are kept exact.
//! - **Validity.** A bucket too coarse picks invalid winners: burn #5352 rounded shapes
//!   to powers of two, which merged aligned and unaligned sizes, and a winner tuned on an
//!   aligned shape then failed on an unaligned one. So everything that can make a variant
//!   *invalid* is keyed exactly: the kernel, the dtypes, the GPU arch, `d_s` (a
//!   `BLOCK_D` smaller or larger than `d_s` changes the code path) and the alignment of
//!   `n`: the largest power of two that divides every `n` the lookup covers (capped at
//!   [`ALIGN_CAP`]). Triton block sizes are powers of two (`tl.arange` requires it), so
//!   this one number says, for every candidate block size `b`, whether `n % b == 0`,
//!   which is what a variant compiled with an "even `n`" assumption (or an integer
//!   argument with `divisibility` 16 in the manifest) relies on.
//!
//! A decode loop sees every `n` in turn, so its lookups use alignment 1
//! ([`ShapeFeatures::decode`]): only variants valid for any `n` can win there. A one-shot
//! launch can use the exact alignment of its `n` ([`ShapeFeatures::one_shot`]).
//!
//! # String form
//!
//! A bucket's [`Display`](std::fmt::Display) form is its key in the tuning table, stable
//! across builds (a change of meaning bumps [`BUCKET_VERSION`], which is part of the
//! string):
//!
//! `b1:pq_score_kernel_v6:fp32:sm90:rows<=32:n<=32768:align1:ds64:K64:heavy<=128`
//!
//! A bucket keyed by the number of subvectors `M` as well (the decode step's kernels:
//! their grids and code rows depend on it, and `d_s` alone does not say it) ends with
//! `:M<m>`:
//!
//! `b1:pq_emit.m2.w_bf16:bf16+bf16+bf16:sm90:rows<=32:n<=32768:align1:ds64:K256:heavy<=4096:M2`
//!
//! A bucket without it (`M` not a feature of the kernel) keeps the ten-field form, so
//! tables written before `M` was a feature read the same.
//!
//! [`ShapeBucket`] parses it back ([`std::str::FromStr`]).

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Version of the bucket's meaning; part of the string form. Bump it when the features
/// or their rounding change, so old table entries stop matching instead of being
/// misapplied.
pub const BUCKET_VERSION: u32 = 1;

/// Largest alignment of `n` a bucket distinguishes (elements). Larger than any block
/// size compiled in `kernels_triton/` (Triton blocks are powers of two, at most 1024 keys
/// here), so `align >= b` is exactly "`n` is divisible by block size `b`".
pub const ALIGN_CAP: u64 = 1024;

/// The shape features of one launch (or of a family of launches) that [`bucket_for`]
/// rounds into a [`ShapeBucket`]. Counts are elements, not bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShapeFeatures {
    /// Independent rows of work: `B * H` for per-query-head kernels (scoring, top-k),
    /// `B * H_kv` for per-KV-head kernels (quantization). At least 1.
    pub rows: u64,
    /// Keys per row `n` (quantized keys scored / selected over). May be 0.
    pub n_keys: u64,
    /// The largest power of two that divides every `n` this lookup covers, at most
    /// [`ALIGN_CAP`]: [`align_of`]`(n)` for one launch, 1 for a decode loop.
    pub n_align: u64,
    /// Subvector dimension `d_s = D / M` (elements).
    pub sub_dim: u32,
    /// Centroids per subvector `K = 2^bits`.
    pub centroids: u32,
    /// Heavy-hitter count `heavy_size` (the top-k size); 0 when the kernel has none.
    pub heavy: u32,
    /// Subvectors per key `M`; 0 when the bucket is not keyed by it
    /// ([`ShapeFeatures::with_subvectors`] sets it).
    pub subvectors: u32,
}

impl ShapeFeatures {
    /// Features of one launch with exactly `n_keys` keys per row: the alignment is that
    /// of `n_keys` ([`align_of`]).
    pub fn one_shot(rows: u64, n_keys: u64, sub_dim: u32, centroids: u32, heavy: u32) -> Self {
        ShapeFeatures {
            rows,
            n_keys,
            n_align: align_of(n_keys),
            sub_dim,
            centroids,
            heavy,
            subvectors: 0,
        }
    }

    /// Features of a decode loop currently at `n_keys` keys per row: `n` grows by one
    /// per step, so no alignment can be assumed (`n_align = 1`).
    pub fn decode(rows: u64, n_keys: u64, sub_dim: u32, centroids: u32, heavy: u32) -> Self {
        ShapeFeatures {
            rows,
            n_keys,
            n_align: 1,
            sub_dim,
            centroids,
            heavy,
            subvectors: 0,
        }
    }
}

impl ShapeFeatures {
    /// The same features keyed by `M` subvectors per key as well (a bucket string ending
    /// in `:M<m>`; 0 removes the feature).
    pub fn with_subvectors(self, m: u32) -> Self {
        ShapeFeatures {
            subvectors: m,
            ..self
        }
    }
}

/// The largest power of two dividing `n`, capped at [`ALIGN_CAP`] (0 is divisible by
/// everything, so `align_of(0) == ALIGN_CAP`).
pub fn align_of(n: u64) -> u64 {
    if n == 0 {
        ALIGN_CAP
    } else {
        (1u64 << n.trailing_zeros()).min(ALIGN_CAP)
    }
}

/// A shape bucket: the key under which one tuning result is stored (see the module
/// docs for what is in it and why). Build it with [`bucket_for`]; its string form
/// ([`fmt::Display`]) is the table key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShapeBucket {
    /// The logical kernel name (the manifest's `kernel`).
    pub kernel: String,
    /// Dtypes of the kernel's tensor arguments that select code paths, in signature
    /// order (e.g. `["fp32"]`, `["bf16", "fp32"]`); may also carry other value-level
    /// specializations such as the metric (`"ip"`). At least one.
    pub dtypes: Vec<String>,
    /// The device's compute capability as `major * 10 + minor` (90 for H100).
    pub arch: u32,
    /// `rows` rounded up to a power of two.
    pub rows: u64,
    /// `n` rounded up to a power of two (`n = 0` gives 1).
    pub n_band: u64,
    /// Alignment of `n`: a power of two in `1..=ALIGN_CAP`.
    pub n_align: u64,
    /// Subvector dimension `d_s`, exact.
    pub sub_dim: u32,
    /// Centroids per subvector `K`, exact.
    pub centroids: u32,
    /// `heavy` rounded up to a power of two (0 stays 0).
    pub heavy_pad: u32,
    /// Subvectors per key `M`, exact; 0: not a feature of this bucket.
    pub subvectors: u32,
}

/// Map a launch's shape to its bucket. Pure: the same inputs always give the same bucket.
///
/// `kernel` is the logical kernel name, `dtypes` the dtype list (see
/// [`ShapeBucket::dtypes`]), `arch` the device's compute capability (`major * 10 +
/// minor`).
///
/// # Errors
///
/// [`Error::Invalid`] when a name is empty or holds a character outside
/// `[A-Za-z0-9_.-]` (the string form uses `:` and `+` as separators), when `dtypes` is
/// empty, when `rows` is 0, or when `n_align` is not a power of two dividing `n_keys`.
pub fn bucket_for(
    kernel: &str,
    dtypes: &[&str],
    arch: u32,
    shape: &ShapeFeatures,
) -> Result<ShapeBucket> {
    check_name("kernel name", kernel)?;
    if dtypes.is_empty() {
        return Err(Error::invalid(
            "shape bucket dtypes",
            format!("kernel {kernel}: expected at least one dtype, got none"),
        ));
    }
    for d in dtypes {
        check_name("shape bucket dtype", d)?;
    }
    if shape.rows == 0 {
        return Err(Error::invalid(
            "shape bucket rows",
            format!("kernel {kernel}: rows (B*H) must be at least 1, got 0"),
        ));
    }
    let align = shape.n_align;
    if align == 0 || !align.is_power_of_two() {
        return Err(Error::invalid(
            "shape bucket n_align",
            format!("kernel {kernel}: expected a power of two, got {align}"),
        ));
    }
    if !shape.n_keys.is_multiple_of(align) {
        return Err(Error::invalid(
            "shape bucket n_align",
            format!(
                "kernel {kernel}: n_align {align} does not divide n = {} (expected a power \
                 of two dividing n, e.g. align_of(n) = {})",
                shape.n_keys,
                align_of(shape.n_keys)
            ),
        ));
    }
    Ok(ShapeBucket {
        kernel: kernel.to_string(),
        dtypes: dtypes.iter().map(|d| d.to_string()).collect(),
        arch,
        rows: shape.rows.next_power_of_two(),
        n_band: shape.n_keys.max(1).next_power_of_two(),
        n_align: align.min(ALIGN_CAP),
        sub_dim: shape.sub_dim,
        centroids: shape.centroids,
        heavy_pad: if shape.heavy == 0 {
            0
        } else {
            shape.heavy.next_power_of_two()
        },
        subvectors: shape.subvectors,
    })
}

fn check_name(what: &str, s: &str) -> Result<()> {
    let ok = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            what,
            format!("{s:?}: expected a non-empty name of characters [A-Za-z0-9_.-]"),
        ))
    }
}

impl ShapeBucket {
    /// True when a variant whose block size along `n` is `block` (a power of two) divides
    /// every `n` of this bucket: what a variant compiled without bounds masks needs.
    pub fn n_divisible_by(&self, block: u64) -> bool {
        block != 0 && block.is_power_of_two() && block <= self.n_align
    }
}

impl fmt::Display for ShapeBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "b{BUCKET_VERSION}:{}:{}:sm{}:rows<={}:n<={}:align{}:ds{}:K{}:heavy<={}",
            self.kernel,
            self.dtypes.join("+"),
            self.arch,
            self.rows,
            self.n_band,
            self.n_align,
            self.sub_dim,
            self.centroids,
            self.heavy_pad
        )?;
        if self.subvectors != 0 {
            write!(f, ":M{}", self.subvectors)?;
        }
        Ok(())
    }
}

impl FromStr for ShapeBucket {
    type Err = Error;

    /// Parse the string form written by [`fmt::Display`]. Errors name the field that
    /// did not parse and the expected form.
    fn from_str(s: &str) -> Result<Self> {
        let bad = |msg: String| {
            Error::invalid(
                "shape bucket",
                format!(
                    "{s:?}: {msg} (expected b{BUCKET_VERSION}:KERNEL:DTYPE[+DTYPE..]:smARCH:\
                     rows<=R:n<=N:alignA:dsD:KK:heavy<=H[:MM])"
                ),
            )
        };
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() != 10 && parts.len() != 11 {
            return Err(bad(format!(
                "{} ':'-separated fields, expected 10 or 11",
                parts.len()
            )));
        }
        if parts[0] != format!("b{BUCKET_VERSION}") {
            return Err(bad(format!(
                "bucket version {:?}, this build reads b{BUCKET_VERSION}",
                parts[0]
            )));
        }
        let num = |i: usize, prefix: &str| -> Result<u64> {
            parts[i]
                .strip_prefix(prefix)
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| {
                    bad(format!(
                        "field {} {:?} is not {prefix}<number>",
                        i, parts[i]
                    ))
                })
        };
        let small = |i: usize, prefix: &str| -> Result<u32> {
            let v = num(i, prefix)?;
            u32::try_from(v).map_err(|_| bad(format!("field {i} {:?} is too large", parts[i])))
        };
        let kernel = parts[1];
        let dtypes: Vec<&str> = parts[2].split('+').collect();
        let b = ShapeBucket {
            kernel: kernel.to_string(),
            dtypes: dtypes.iter().map(|d| d.to_string()).collect(),
            arch: small(3, "sm")?,
            rows: num(4, "rows<=")?,
            n_band: num(5, "n<=")?,
            n_align: num(6, "align")?,
            sub_dim: small(7, "ds")?,
            centroids: small(8, "K")?,
            heavy_pad: small(9, "heavy<=")?,
            subvectors: if parts.len() == 11 {
                small(10, "M")?
            } else {
                0
            },
        };
        if parts.len() == 11 && b.subvectors == 0 {
            return Err(bad(
                "M must be at least 1 (leave the field out instead)".into()
            ));
        }
        check_name("kernel name", kernel)?;
        for d in &dtypes {
            check_name("shape bucket dtype", d)?;
        }
        let pow2 = |v: u64| v.is_power_of_two();
        if !pow2(b.rows) || !pow2(b.n_band) || !pow2(b.n_align) || b.n_align > ALIGN_CAP {
            return Err(bad(
                "rows, n and align must be powers of two (align at most 1024)".into(),
            ));
        }
        if b.heavy_pad != 0 && !b.heavy_pad.is_power_of_two() {
            return Err(bad("heavy must be 0 or a power of two".into()));
        }
        Ok(b)
    }
}
