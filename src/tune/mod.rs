//! The offline autotuner: shape buckets, the persisted tuning table, and the tuning
//! procedure.
//!
//! Triton's own autotuner runs inside the Python process at the first call of a kernel.
//! Ours runs once per GPU model, offline (`tritonrt autotune`), and its result, a JSON
//! *tuning table*, ships with the deploy next to `ptx_cache/`. At launch the runtime
//! asks the table for the tuned variant of a kernel for the shape's bucket and falls back
//! to the manifest's default variant when there is no usable entry.
//!
//! Pieces:
//!
//! - [`bucket`]: [`ShapeBucket`], the part of a launch's shape that decides which variant
//!   is fastest *and which variants are valid*, and [`bucket_for`] computing it.
//! - [`candidate`]: [`Candidate`] / [`CandidateSet`], the compiled variants of one
//!   logical kernel that compete, with the content hash and checksum a table entry is
//!   keyed by (a changed kernel or candidate set makes old entries stale).
//! - [`table`]: [`TuningTable`], its JSON schema, atomic merge-on-save persistence in the
//!   user cache dir, import/export, and the launch-time lookup ([`TuningTable::winner`],
//!   [`TuningTable::select`]).
//! - [`choice`]: [`choose_variant`], the launch-time rule (an override, else the
//!   table's current winner, else the default) and [`VariantOrigin`] for reports.
//! - [`procedure`]: the tuning procedure over any backend implementing [`TuneTarget`]
//!   (the GPU backend times with CUDA events; tests use a dummy CPU backend).
//!
//! The targets come from the application: `pq::tune` (feature `cli`) registers the
//! indexer's kernels; this module imports nothing from it.
//!
//! The rules the procedure enforces: the default variant is always timed and is the
//! correctness oracle; a variant that fails to launch, or whose output differs from the
//! default's, is reported and excluded, never chosen; the winner is the lowest median
//! among the valid variants (and must beat the default by a margin, so that noise does
//! not flip winners from one tuning run to the next).

pub mod bucket;
pub mod candidate;
pub mod choice;
pub mod procedure;
pub mod table;

pub use bucket::{align_of, bucket_for, ShapeBucket, ShapeFeatures, ALIGN_CAP};
pub use candidate::{Candidate, CandidateSet};
pub use choice::{choose_variant, VariantChoice, VariantOrigin};
pub use procedure::{
    compare_exact, compare_f32, input_sets_for, render_report, render_summary, tune, OutputCheck,
    TimingPlan, TimingStats, TuneSettings, TuneTarget,
};
pub use table::{
    CandidateTiming, DefaultReason, DeviceKey, Exclusion, ExclusionReason, MergeStats, Selection,
    SelectionSource, TuningEntry, TuningTable, SCHEMA_VERSION, TABLE_FILE_NAME,
};
