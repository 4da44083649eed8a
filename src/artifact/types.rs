//! Manifest types: what `kernels_triton/build.py` writes into `ptx_cache/manifest.json`
//! (schema: `kernels_triton/MANIFEST.md`).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The manifest schema version this build reads and writes.
pub const SCHEMA_VERSION: u32 = 1;

/// `ptx_cache/manifest.json`: every kernel variant of one build.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Schema version; must equal [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The Triton version that compiled every variant (e.g. `"3.6.0"`). The launch ABI
    /// (the trailing scratch pointers) depends on it.
    pub triton_version: String,
    /// The variants, in build order.
    pub variants: Vec<Variant>,
}

/// One compiled kernel variant: a Triton function with fixed constexprs, num_warps,
/// num_stages and target arch, and everything needed to launch it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Variant {
    /// Unique, stable id: `<kernel>.<k=v...>.w<num_warps>.s<num_stages>.sm<arch>`.
    pub id: String,
    /// Logical kernel name the runtime looks variants up by.
    pub kernel: String,
    /// PTX `.entry` / cubin function symbol.
    pub entry: String,
    /// Source file the kernel came from, relative to `kernels_triton/`.
    #[serde(default)]
    pub source: String,
    /// sha256 (hex) of the source file's bytes.
    #[serde(default)]
    pub source_hash: String,
    /// Launch arguments in declaration order, constexprs (and ints specialized to 1)
    /// removed.
    pub signature: Vec<Arg>,
    /// The constexpr values this variant was compiled with (block sizes, ...).
    #[serde(default)]
    pub constexprs: BTreeMap<String, serde_json::Value>,
    /// Warps per CTA: the launch uses `32 * num_warps` threads per block.
    pub num_warps: u32,
    /// Software pipelining stages (informational at launch).
    pub num_stages: u32,
    /// CTAs per cluster; > 1 means a cluster launch with `grid.x * num_ctas` blocks.
    #[serde(default = "one")]
    pub num_ctas: u32,
    /// Cluster dimensions. With `num_ctas > 1` they are `[num_ctas, 1, 1]` (Triton 3.6's
    /// own clusters: one program spans `num_ctas` CTAs). With `num_ctas = 1` and a product
    /// above 1, every program is one CTA and the launch groups them into clusters of these
    /// dimensions (a kernel that uses distributed shared memory or cluster barriers
    /// itself; sm_90+); the program grid must then be a multiple of them.
    #[serde(default = "ones3")]
    pub cluster_dims: [u32; 3],
    /// Dynamic shared memory per CTA, bytes.
    #[serde(default)]
    pub shared: u32,
    /// Global scratch per CTA, bytes (0: none; the pointer is passed as null).
    #[serde(default)]
    pub global_scratch_size: u32,
    /// Alignment of the global scratch buffer, bytes.
    #[serde(default = "one")]
    pub global_scratch_align: u32,
    /// Profile scratch per CTA, bytes (0: none; the pointer is passed as null).
    #[serde(default)]
    pub profile_scratch_size: u32,
    /// Alignment of the profile scratch buffer, bytes.
    #[serde(default = "one")]
    pub profile_scratch_align: u32,
    /// Launch with programmatic dependent launch (PDL).
    #[serde(default)]
    pub launch_pdl: bool,
    /// Launch as a cooperative grid.
    #[serde(default)]
    pub launch_cooperative_grid: bool,
    /// Target arch as `10 * major + minor` of the compute capability: 80 or 90.
    pub arch: u32,
    /// The PTX `.target` (`sm_90a`, `sm_80`).
    pub ptx_target: String,
    /// The PTX `.version` (`"8.7"`).
    pub ptx_version: String,
    /// The default variant of its (kernel, arch) when no tuning table says otherwise.
    #[serde(default)]
    pub default: bool,
    /// The PTX file.
    pub ptx: FileRef,
    /// The cubin file (arch 90 variants; arch 80 variants carry PTX only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cubin: Option<FileRef>,
    /// How the compiler lowered each host tensor descriptor argument
    /// (`tensordesc<...>` in the signature) to a TMA descriptor, in signature order: Triton
    /// 3.6's `tensordesc_meta`. Empty when the signature has none, or when the compiler did
    /// not lower them to TMA (sm_80): each is then passed decomposed (base pointer, shape
    /// and strides; see [`crate::abi::expand_arg`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensordesc_meta: Vec<TmaMeta>,
}

/// How Triton 3.6 encodes one host tensor descriptor as a `CUtensorMap` (its
/// `tensordesc_meta` entry, as the compiler wrote it): the launcher passes these to
/// `cuTensorMapEncodeTiled`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TmaMeta {
    /// `CUtensorMapSwizzle`: 0 none, 1 32 B, 2 64 B, 3 128 B.
    pub swizzle: u32,
    /// Bytes per element.
    pub elem_size: u32,
    /// The element type in the compiler's (device-side) numbering; the launcher maps it
    /// to the driver's `CUtensorMapDataType` as Triton does (8 -> 10, 9 -> 8, 10 -> 9).
    pub elem_type: u32,
    /// The TMA box in elements, outermost dimension first (may be smaller than the
    /// descriptor's block shape when the compiler splits a copy).
    pub block_size: Vec<u32>,
    /// The innermost dimension holds padded fp4 pairs (not supported by this launcher:
    /// refused at launch).
    #[serde(default)]
    pub fp4_padded: bool,
}

fn one() -> u32 {
    1
}
fn ones3() -> [u32; 3] {
    [1, 1, 1]
}

/// A content-addressed file next to the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    /// File name inside the ptx_cache directory (`<sha256>.ptx`); never a path.
    pub file: String,
    /// sha256 (lowercase hex) of the file's bytes.
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
}

/// One launch argument of a variant's signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Arg {
    /// The argument's name in the Triton source.
    pub name: String,
    /// Its Triton type.
    #[serde(rename = "type")]
    pub ty: ArgType,
    /// 16: the variant assumes the value (address or integer) is a multiple of 16, and
    /// the launcher refuses one that is not. 1: no assumption.
    #[serde(default = "one")]
    pub divisibility: u32,
}

/// An element / scalar type in Triton's spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// `i1` (a bool, passed as one byte).
    I1,
    /// `i8`.
    I8,
    /// `i16`.
    I16,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `u8`.
    U8,
    /// `u16`.
    U16,
    /// `u32`.
    U32,
    /// `u64`.
    U64,
    /// `fp16` (IEEE half).
    Fp16,
    /// `bf16`.
    Bf16,
    /// `fp32`.
    Fp32,
    /// `fp64`.
    Fp64,
    /// `fp8e4nv` (pointers only).
    Fp8E4Nv,
    /// `fp8e5` (pointers only).
    Fp8E5,
}

impl Dtype {
    const ALL: [Dtype; 15] = [
        Dtype::I1,
        Dtype::I8,
        Dtype::I16,
        Dtype::I32,
        Dtype::I64,
        Dtype::U8,
        Dtype::U16,
        Dtype::U32,
        Dtype::U64,
        Dtype::Fp16,
        Dtype::Bf16,
        Dtype::Fp32,
        Dtype::Fp64,
        Dtype::Fp8E4Nv,
        Dtype::Fp8E5,
    ];

    /// Triton's spelling (`fp32`, `i64`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::I1 => "i1",
            Dtype::I8 => "i8",
            Dtype::I16 => "i16",
            Dtype::I32 => "i32",
            Dtype::I64 => "i64",
            Dtype::U8 => "u8",
            Dtype::U16 => "u16",
            Dtype::U32 => "u32",
            Dtype::U64 => "u64",
            Dtype::Fp16 => "fp16",
            Dtype::Bf16 => "bf16",
            Dtype::Fp32 => "fp32",
            Dtype::Fp64 => "fp64",
            Dtype::Fp8E4Nv => "fp8e4nv",
            Dtype::Fp8E5 => "fp8e5",
        }
    }

    /// Parse Triton's spelling; `None` for anything else. `u1` (Triton 3.6's canonical
    /// name of a bool) is read as `i1`.
    pub fn parse(s: &str) -> Option<Dtype> {
        if s == "u1" {
            return Some(Dtype::I1);
        }
        Dtype::ALL.into_iter().find(|d| d.name() == s)
    }

    /// Size in bytes of one value as a kernel parameter / element.
    pub fn size_bytes(self) -> usize {
        match self {
            Dtype::I1 | Dtype::I8 | Dtype::U8 | Dtype::Fp8E4Nv | Dtype::Fp8E5 => 1,
            Dtype::I16 | Dtype::U16 | Dtype::Fp16 | Dtype::Bf16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::Fp32 => 4,
            Dtype::I64 | Dtype::U64 | Dtype::Fp64 => 8,
        }
    }

    /// Whether the type is an integer (divisibility applies to its value).
    pub fn is_int(self) -> bool {
        matches!(
            self,
            Dtype::I1
                | Dtype::I8
                | Dtype::I16
                | Dtype::I32
                | Dtype::I64
                | Dtype::U8
                | Dtype::U16
                | Dtype::U32
                | Dtype::U64
        )
    }
}

/// A Triton argument type: a pointer to device memory, or a scalar passed by value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum ArgType {
    /// `*<dtype>`: a device pointer (8 bytes). `None` is spelled `*` and means the
    /// element type is unknown (an imported Triton cache entry without TTIR).
    Ptr(Option<Dtype>),
    /// A scalar passed by value.
    Scalar(Dtype),
    /// A host tensor descriptor, `tensordesc<fp16[64, 64]>`: one argument in the
    /// source, several kernel parameters (a 128-byte `CUtensorMap` then the shape and the
    /// strides; see [`crate::abi::expand_arg`]).
    TensorDesc(DescType),
}

/// The type of a host tensor descriptor argument: element dtype and block shape (the
/// tile one load or store moves), 1 to 5 dimensions, outermost first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DescType {
    /// Element dtype.
    pub dtype: Dtype,
    ndim: u8,
    block: [u32; 5],
}

impl DescType {
    /// A descriptor type; `None` unless `block` has 1 to 5 dimensions, each >= 1.
    pub fn new(dtype: Dtype, block: &[u32]) -> Option<DescType> {
        if block.is_empty() || block.len() > 5 || block.contains(&0) {
            return None;
        }
        let mut b = [0; 5];
        b[..block.len()].copy_from_slice(block);
        Some(DescType {
            dtype,
            ndim: block.len() as u8,
            block: b,
        })
    }

    /// The block shape, outermost dimension first.
    pub fn block(&self) -> &[u32] {
        &self.block[..self.ndim as usize]
    }

    /// Number of dimensions (1..=5).
    pub fn ndim(&self) -> usize {
        self.ndim as usize
    }
}

impl ArgType {
    /// Parse Triton's spelling: `*fp32`, `*` (unknown element type), `i32`, `fp16`,
    /// `tensordesc<fp16[64, 64]>`, ...
    pub fn parse(s: &str) -> Result<ArgType, String> {
        let s = s.trim();
        if let Some(inner) = s.strip_prefix("tensordesc<") {
            let bad = || {
                format!(
                    "malformed tensor descriptor type {s:?} (expected e.g. \
                     tensordesc<fp16[64, 64]>: an element type and 1 to 5 block sizes)"
                )
            };
            let inner = inner.strip_suffix('>').ok_or_else(bad)?;
            let (elem, dims) = inner.split_once('[').ok_or_else(bad)?;
            let dims = dims.strip_suffix(']').ok_or_else(bad)?;
            let dtype = Dtype::parse(elem.trim()).ok_or_else(|| {
                format!(
                    "unknown tensor descriptor element type {:?} in {s:?} ({})",
                    elem.trim(),
                    known_types()
                )
            })?;
            let block = dims
                .split(',')
                .map(|d| d.trim().parse::<u32>())
                .collect::<Result<Vec<u32>, _>>()
                .map_err(|_| bad())?;
            return DescType::new(dtype, &block)
                .map(ArgType::TensorDesc)
                .ok_or_else(bad);
        }
        if let Some(elem) = s.strip_prefix('*') {
            if elem.is_empty() {
                return Ok(ArgType::Ptr(None));
            }
            return Dtype::parse(elem)
                .map(|d| ArgType::Ptr(Some(d)))
                .ok_or_else(|| format!("unknown pointer element type {s:?} ({})", known_types()));
        }
        match Dtype::parse(s) {
            Some(Dtype::Fp8E4Nv | Dtype::Fp8E5) => {
                Err(format!("{s:?} is supported only as a pointer element type"))
            }
            Some(d) => Ok(ArgType::Scalar(d)),
            None => Err(format!("unknown argument type {s:?} ({})", known_types())),
        }
    }

    /// Size in bytes of the kernel parameter (8 for pointers; 128 for a tensor
    /// descriptor's `CUtensorMap`, the first of its parameters).
    pub fn param_bytes(self) -> usize {
        match self {
            ArgType::Ptr(_) => 8,
            ArgType::Scalar(d) => d.size_bytes(),
            ArgType::TensorDesc(_) => 128,
        }
    }

    /// Whether `divisibility` applies to this type (pointers and integers).
    pub fn divisibility_applies(self) -> bool {
        match self {
            ArgType::Ptr(_) => true,
            ArgType::Scalar(d) => d.is_int(),
            ArgType::TensorDesc(_) => false,
        }
    }
}

fn known_types() -> String {
    let names: Vec<&str> = Dtype::ALL.iter().map(|d| d.name()).collect();
    format!(
        "expected * followed by one of, or one of: {}",
        names.join(" ")
    )
}

impl fmt::Display for ArgType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgType::Ptr(None) => write!(f, "*"),
            ArgType::Ptr(Some(d)) => write!(f, "*{}", d.name()),
            ArgType::Scalar(d) => write!(f, "{}", d.name()),
            ArgType::TensorDesc(t) => {
                let dims: Vec<String> = t.block().iter().map(|b| b.to_string()).collect();
                write!(f, "tensordesc<{}[{}]>", t.dtype.name(), dims.join(", "))
            }
        }
    }
}

impl TryFrom<String> for ArgType {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        ArgType::parse(&s)
    }
}

impl From<ArgType> for String {
    fn from(t: ArgType) -> String {
        t.to_string()
    }
}

/// A PTX ISA version (`.version 8.7`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PtxVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl PtxVersion {
    /// Parse `"8.7"`.
    pub fn parse(s: &str) -> Option<PtxVersion> {
        let (a, b) = s.trim().split_once('.')?;
        Some(PtxVersion {
            major: a.parse().ok()?,
            minor: b.parse().ok()?,
        })
    }
}

impl fmt::Display for PtxVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The header of a PTX file: its `.version` and `.target` lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxHeader {
    /// `.version`.
    pub version: PtxVersion,
    /// `.target` (first token: `sm_90a`, `sm_80`).
    pub target: String,
}

/// Read the `.version` and `.target` directives of a PTX file. Errors name the missing
/// directive.
pub fn ptx_header(ptx: &[u8]) -> Result<PtxHeader, String> {
    let text = String::from_utf8_lossy(ptx);
    let mut version = None;
    let mut target = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(v) = line.strip_prefix(".version") {
            version = Some(
                PtxVersion::parse(v)
                    .ok_or_else(|| format!("malformed PTX .version directive {line:?}"))?,
            );
        } else if let Some(t) = line.strip_prefix(".target") {
            let t = t.split([',', ' ', '\t']).find(|s| !s.is_empty());
            target = t.map(str::to_string);
        }
        if version.is_some() && target.is_some() {
            break;
        }
    }
    Ok(PtxHeader {
        version: version.ok_or("no .version directive in PTX")?,
        target: target.ok_or("no .target directive in PTX")?,
    })
}

/// Whether a PTX target is arch-specific (`sm_90a`): such code runs only on exactly that
/// compute capability.
pub fn is_arch_specific_target(target: &str) -> bool {
    target.starts_with("sm_") && target.ends_with('a')
}

impl Variant {
    /// The cluster a launch of this variant groups its CTAs into, if any: `[num_ctas, 1,
    /// 1]` for Triton's multi-CTA programs, else `cluster_dims` where their product is
    /// above 1 (see [`Variant::cluster_dims`]).
    pub fn launch_cluster(&self) -> Option<[u32; 3]> {
        if self.num_ctas > 1 {
            Some([self.num_ctas, 1, 1])
        } else if self.cluster_dims.iter().product::<u32>() > 1 {
            Some(self.cluster_dims)
        } else {
            None
        }
    }

    /// Whether this variant's code can run on a device of compute capability `cc`
    /// (`(9, 0)`): arch-specific (`sm_90a`) code only on exactly its arch; portable PTX
    /// on any device whose arch is >= the variant's (the driver JITs it forward).
    pub fn usable_on(&self, cc: (u32, u32)) -> bool {
        let dev = cc.0 * 10 + cc.1;
        if is_arch_specific_target(&self.ptx_target) {
            dev == self.arch
        } else {
            dev >= self.arch
        }
    }

    /// Whether the variant's cubin (if any) is for exactly this compute capability.
    pub fn cubin_matches(&self, cc: (u32, u32)) -> bool {
        self.cubin.is_some() && cc.0 * 10 + cc.1 == self.arch
    }

    /// The signature as `name: type, ...` for messages.
    pub fn signature_string(&self) -> String {
        self.signature
            .iter()
            .map(|a| format!("{}: {}", a.name, a.ty))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
