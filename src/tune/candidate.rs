//! The compiled variants of one logical kernel that compete in a tuning run.
//!
//! A [`Candidate`] carries only what tuning and the table need (id, default flag,
//! hashes); the launcher's own variant type (`artifact::Variant`, one manifest entry)
//! maps onto it one to one: `id`, `kernel`, `source_hash`, `default`, and the sha256 of
//! the file that will be loaded for this device (the cubin when its arch matches, else
//! the PTX).
//!
//! A [`CandidateSet`] computes the two hashes a table entry is keyed by, so that an entry
//! goes stale the moment what it measured changes (cubecl PR #1455: keying by kernel id
//! kept serving results for edited kernels):
//!
//! - the *kernel hash*: the variants' `source_hash` (the sha256 of the Triton source and
//!   of the kernel modules it imports, so an edited shared helper counts);
//! - the *candidate checksum*: sha256 over the sorted variant ids and their artifact
//!   hashes, so adding, removing or recompiling any variant invalidates the entry.

use std::collections::{BTreeSet, HashSet};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// One compiled variant of a kernel, as the tuner sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Candidate {
    /// The manifest's variant id, unique and stable
    /// (`<kernel>.<constexprs>.w<num_warps>.s<num_stages>.sm<arch>`).
    pub id: String,
    /// The logical kernel name (the manifest's `kernel`).
    pub kernel: String,
    /// sha256 hex of the Triton source file the variant was compiled from.
    pub source_hash: String,
    /// sha256 hex of the artifact that is loaded for the device (cubin or PTX).
    pub artifact_sha256: String,
    /// True for the manifest's default variant (exactly one per set).
    pub is_default: bool,
}

impl Candidate {
    /// Shorthand constructor.
    pub fn new(
        id: impl Into<String>,
        kernel: impl Into<String>,
        source_hash: impl Into<String>,
        artifact_sha256: impl Into<String>,
        is_default: bool,
    ) -> Self {
        Candidate {
            id: id.into(),
            kernel: kernel.into(),
            source_hash: source_hash.into(),
            artifact_sha256: artifact_sha256.into(),
            is_default,
        }
    }
}

/// The validated candidates of one logical kernel for one device, with their kernel
/// hash and candidate checksum computed once. Candidates keep the order they were given
/// in (the order they are checked and reported in).
#[derive(Debug, Clone)]
pub struct CandidateSet {
    kernel: String,
    candidates: Vec<Candidate>,
    default_index: usize,
    ids: HashSet<String>,
    kernel_hash: String,
    checksum: String,
}

impl CandidateSet {
    /// Validate and index `candidates` of logical kernel `kernel`.
    ///
    /// # Errors
    ///
    /// [`Error::TuneCandidates`] when the set is empty, a candidate belongs to another
    /// kernel, an id is empty or repeated, or the number of defaults is not exactly one.
    pub fn new(kernel: impl Into<String>, candidates: Vec<Candidate>) -> Result<Self> {
        let kernel = kernel.into();
        let fail = |msg: String| {
            Err(Error::TuneCandidates {
                kernel: kernel.clone(),
                msg,
            })
        };
        if candidates.is_empty() {
            return fail("no variants (expected at least the default one)".into());
        }
        let mut ids = HashSet::new();
        for c in &candidates {
            if c.id.is_empty() {
                return fail("a variant has an empty id".into());
            }
            if c.kernel != kernel {
                return fail(format!(
                    "variant {} belongs to kernel {}, expected {kernel}",
                    c.id, c.kernel
                ));
            }
            if !ids.insert(c.id.clone()) {
                return fail(format!("variant id {} appears twice", c.id));
            }
        }
        let defaults: Vec<usize> = candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is_default)
            .map(|(i, _)| i)
            .collect();
        if defaults.len() != 1 {
            let names: Vec<&str> = defaults
                .iter()
                .map(|&i| candidates[i].id.as_str())
                .collect();
            return fail(format!(
                "expected exactly one default variant, got {}: [{}]",
                defaults.len(),
                names.join(", ")
            ));
        }
        let kernel_hash = kernel_hash(&candidates);
        let checksum = candidate_checksum(&candidates);
        Ok(CandidateSet {
            kernel,
            default_index: defaults[0],
            candidates,
            ids,
            kernel_hash,
            checksum,
        })
    }

    /// The logical kernel name.
    pub fn kernel(&self) -> &str {
        &self.kernel
    }

    /// All candidates, in the order given.
    pub fn candidates(&self) -> &[Candidate] {
        &self.candidates
    }

    /// The manifest's default variant: the correctness oracle and the fallback.
    pub fn default_candidate(&self) -> &Candidate {
        &self.candidates[self.default_index]
    }

    /// The candidate with this id, if any.
    pub fn get(&self, id: &str) -> Option<&Candidate> {
        if self.ids.contains(id) {
            self.candidates.iter().find(|c| c.id == id)
        } else {
            None
        }
    }

    /// True when a candidate has this id (O(1)).
    pub fn contains(&self, id: &str) -> bool {
        self.ids.contains(id)
    }

    /// The kernel content hash (see the module docs), lowercase hex.
    pub fn kernel_hash(&self) -> &str {
        &self.kernel_hash
    }

    /// The candidate-set checksum (see the module docs), lowercase sha256 hex.
    pub fn checksum(&self) -> &str {
        &self.checksum
    }
}

/// The kernel content hash of a set of variants: their common `source_hash` when they
/// all share one (the usual case: one Triton source per logical kernel), else sha256
/// over the sorted distinct source hashes, one per line.
pub fn kernel_hash(candidates: &[Candidate]) -> String {
    let distinct: BTreeSet<&str> = candidates.iter().map(|c| c.source_hash.as_str()).collect();
    if distinct.len() == 1 {
        return distinct.into_iter().next().unwrap_or_default().to_string();
    }
    let mut h = Sha256::new();
    h.update(b"tritonrt-kernel-hash-v1\n");
    for s in distinct {
        h.update(s.as_bytes());
        h.update(b"\n");
    }
    hex::encode(h.finalize())
}

/// The candidate-set checksum: sha256 hex over `id \t artifact_sha256 \n` for the
/// candidates sorted by id, after a version line. Independent of input order.
pub fn candidate_checksum(candidates: &[Candidate]) -> String {
    let mut pairs: Vec<(&str, &str)> = candidates
        .iter()
        .map(|c| (c.id.as_str(), c.artifact_sha256.as_str()))
        .collect();
    pairs.sort_unstable();
    let mut h = Sha256::new();
    h.update(b"tritonrt-candidates-v1\n");
    for (id, art) in pairs {
        h.update(id.as_bytes());
        h.update(b"\t");
        h.update(art.as_bytes());
        h.update(b"\n");
    }
    hex::encode(h.finalize())
}
