//! The benchmark matrix of issue 26 as data: the rows `tritonrt bench --matrix` times
//! (pure: `tests/pq_memory.rs` checks the definition on the CPU).
//!
//! - the spec's practical workloads: `B=1, H=32, H_kv=8, S=32768, D=128`,
//!   sink = window = init_offset = 128, heavy `floor(0.0921875 S)` = 3020 (`0.1 -
//!   256/32768` of S), bf16 query, keys and weights, euclidean, `(M, bits)` in {(2, 6),
//!   (2, 8), (4, 8)};
//! - the large practical one, `B=4, S=131072`, `(M, bits) = (2, 6)`, twice: heavy
//!   `floor(0.1 S) - 256` = 12851 (the spec's "10% of S minus 256", what the upstream
//!   figures were measured with) and heavy as the ratio `0.0921875` (the S=32768
//!   fraction kept at 131072: `floor(0.0921875 S)` = 12083, resolved per step);
//! - the reference and large workloads (fp32, `H_kv = H = 32`, heavy 128);
//! - heavy in {128, 512, 2048, 8192} on the practical shape with `(M, bits) = (2, 6)`.
//!
//! Heavy sizes are integers computed here, except the ratio row.

use crate::pq::config::{DType, Metric, PqConfig, Shape, Workload};
use crate::pq::size::Size;

/// The practical workloads' heavy fraction `0.1 - 256/32768 = 0.0921875 = 59/640`, as
/// numerator and denominator (integer arithmetic: `floor(59 S / 640)` is exact).
pub const PRACTICAL_HEAVY_RATIO: (usize, usize) = (59, 640);

/// `floor(0.0921875 * s)`: the practical heavy size at `s` (3020 at 32768, 12083 at
/// 131072).
pub fn practical_heavy(s: usize) -> usize {
    s * PRACTICAL_HEAVY_RATIO.0 / PRACTICAL_HEAVY_RATIO.1
}

/// `floor(0.1 * s) - 256` (0 if negative): the spec's large practical heavy size, "10%
/// of S minus 256" (12851 at 131072; 3020 at 32768, as [`practical_heavy`]).
pub fn practical_large_heavy(s: usize) -> usize {
    (s / 10).saturating_sub(256)
}

/// The practical shape: `B=1, H=32, H_kv=8, S=32768, D=128`.
pub const PRACTICAL_SHAPE: Shape = Shape {
    b: 1,
    h: 32,
    h_kv: 8,
    s: 32768,
    d: 128,
};

/// The large practical shape: `B=4, H=32, H_kv=8, S=131072, D=128`.
pub const PRACTICAL_LARGE_SHAPE: Shape = Shape {
    b: 4,
    s: 131072,
    ..PRACTICAL_SHAPE
};

/// Heavy sizes of the matrix's sweep on the practical shape with `(M, bits) = (2, 6)`.
pub const HEAVY_SWEEP: [usize; 4] = [128, 512, 2048, 8192];

/// A practical config: sink = window = init_offset = 128, `heavy`, `M`, `bits`, bf16
/// query, keys and weights, euclidean.
pub fn practical_config(m: usize, bits: u32, heavy: usize) -> PqConfig {
    PqConfig {
        sink_size: Size::Count(128),
        window_size: Size::Count(128),
        heavy_size: Size::Count(heavy),
        init_offset: 128,
        pq_group_factor: m,
        pq_bits: bits,
        metric: Metric::Euclidean,
        input_dtype: DType::BF16,
        weight_dtype: DType::BF16,
    }
}

/// One row of the matrix: a named config and shape (`shape.s` is the step's `S`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatrixRow {
    /// Short name, unique in the matrix (`--matrix-rows` selects by it; file names of
    /// `--save-inputs`).
    pub name: String,
    /// What the row is, in words.
    pub what: String,
    /// The config.
    pub cfg: PqConfig,
    /// The shape, `S` included.
    pub shape: Shape,
}

/// Every row of the matrix, in the order they are timed (see the module docs).
pub fn bench_matrix() -> Vec<MatrixRow> {
    let mut rows = Vec::new();
    let s = PRACTICAL_SHAPE.s;
    for (m, bits) in [(2, 6), (2, 8), (4, 8)] {
        rows.push(MatrixRow {
            name: format!("practical-m{m}b{bits}"),
            what: format!("practical, M={m} bits={bits}, heavy floor(0.0921875 S)"),
            cfg: practical_config(m, bits, practical_heavy(s)),
            shape: PRACTICAL_SHAPE,
        });
    }
    let sl = PRACTICAL_LARGE_SHAPE.s;
    rows.push(MatrixRow {
        name: "practical-large".into(),
        what: "large practical, M=2 bits=6, heavy floor(0.1 S) - 256 (spec)".into(),
        cfg: practical_config(2, 6, practical_large_heavy(sl)),
        shape: PRACTICAL_LARGE_SHAPE,
    });
    rows.push(MatrixRow {
        name: "practical-large-ratio".into(),
        what: "large practical, M=2 bits=6, heavy the ratio 0.0921875 of S".into(),
        cfg: PqConfig {
            heavy_size: Size::Ratio(0.0921875),
            ..practical_config(2, 6, 0)
        },
        shape: PRACTICAL_LARGE_SHAPE,
    });
    for w in [Workload::reference(), Workload::large()] {
        rows.push(MatrixRow {
            what: format!("the spec's {} workload (fp32, heavy {})", w.name, w.heavy),
            name: w.name.clone(),
            cfg: w.config(),
            shape: w.shape(),
        });
    }
    for heavy in HEAVY_SWEEP {
        rows.push(MatrixRow {
            name: format!("heavy-{heavy}"),
            what: format!("practical shape, M=2 bits=6, heavy {heavy}"),
            cfg: practical_config(2, 6, heavy),
            shape: PRACTICAL_SHAPE,
        });
    }
    rows
}

/// The rows of [`bench_matrix`] named in `names` (all when empty), in matrix order.
///
/// Errors: a name that is no row's, listing the names there are.
pub fn select_rows(names: &[String]) -> crate::error::Result<Vec<MatrixRow>> {
    let all = bench_matrix();
    if let Some(bad) = names.iter().find(|n| !all.iter().any(|r| &r.name == *n)) {
        let known: Vec<&str> = all.iter().map(|r| r.name.as_str()).collect();
        return Err(crate::error::Error::invalid(
            "--matrix-rows",
            format!("no row named {bad:?}; the rows are {}", known.join(", ")),
        ));
    }
    Ok(all
        .into_iter()
        .filter(|r| names.is_empty() || names.contains(&r.name))
        .collect())
}
