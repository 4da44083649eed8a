//! The launch-time choice of one kernel's variant: an explicit override, else the tuning
//! table's winner, else the manifest default; and where the choice came from, for reports.
//!
//! One rule for every kernel an application loads, so that what `tritonrt autotune`
//! measured is what runs, and a report can say why each variant ran.

use std::fmt;

use super::bucket::ShapeBucket;
use super::candidate::CandidateSet;
use super::table::{DefaultReason, DeviceKey, SelectionSource, TuningTable};
use crate::error::{Error, Result};

/// Where the variant a kernel runs came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VariantOrigin {
    /// The caller named it (an override: `--variant`, or the application's choice).
    Override,
    /// The tuning table's current entry for the kernel and shape bucket chose it (the
    /// default variant when the default won the tuning run).
    Table,
    /// No override and no current table entry: the manifest's default for this GPU.
    Default,
}

impl VariantOrigin {
    /// `override`, `table` or `default` (reports and JSON).
    pub fn as_str(self) -> &'static str {
        match self {
            VariantOrigin::Override => "override",
            VariantOrigin::Table => "table",
            VariantOrigin::Default => "default",
        }
    }
}

impl fmt::Display for VariantOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The variant chosen for one logical kernel, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VariantChoice {
    /// The logical kernel name (the manifest's `kernel`, e.g. `pq_emit.m2.w_bf16`).
    pub kernel: String,
    /// The variant id that runs (a member of the kernel's candidate set).
    pub variant: String,
    /// Override, table or default.
    pub origin: VariantOrigin,
}

impl fmt::Display for VariantChoice {
    /// `<variant id> (<origin>)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.variant, self.origin)
    }
}

/// Choose the variant of `set.kernel()` for `bucket` on `device`: `override_id` when
/// given, else the winner of `table`'s current entry ([`TuningTable::select`]: entries
/// of another kernel hash, candidate checksum, device or bucket are stale and never
/// used), else the set's default. Pure: no GPU, no file.
///
/// # Errors
///
/// [`Error::Invalid`] when `override_id` is not one of `set`'s candidates (naming them).
pub fn choose_variant(
    set: &CandidateSet,
    override_id: Option<&str>,
    table: &TuningTable,
    device: &DeviceKey,
    bucket: &ShapeBucket,
) -> Result<VariantChoice> {
    let kernel = set.kernel().to_string();
    if let Some(id) = override_id {
        if !set.contains(id) {
            let ids: Vec<&str> = set.candidates().iter().map(|c| c.id.as_str()).collect();
            return Err(Error::invalid(
                "variant override",
                format!(
                    "{id} is not a variant of {kernel} usable on this GPU; its variants: {}",
                    ids.join(", ")
                ),
            ));
        }
        return Ok(VariantChoice {
            kernel,
            variant: id.to_string(),
            origin: VariantOrigin::Override,
        });
    }
    let sel = table.select(device, set, bucket);
    let origin = match sel.source {
        SelectionSource::Tuned { .. } | SelectionSource::Default(DefaultReason::TunedDefault) => {
            VariantOrigin::Table
        }
        SelectionSource::Default(_) => VariantOrigin::Default,
    };
    Ok(VariantChoice {
        kernel,
        variant: sel.variant,
        origin,
    })
}
