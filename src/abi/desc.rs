//! Host tensor descriptors (`tensordesc<...>` arguments) in Triton 3.6's launch ABI, and
//! how every signature argument expands into kernel parameters (pure: no driver calls).
//!
//! A `tensordesc<fp16[64, 64]>` argument is one argument in the Triton source but several
//! kernel parameters. When the compiler lowered it to TMA (sm_90: the variant's
//! `tensordesc_meta` is non-empty) it is a 128-byte `CUtensorMap` passed by value
//! (`.param .align 64 .b8 p[128]`), then the shape as `i32`s and the strides as `i64`s;
//! otherwise (sm_80) it is the base pointer, the shape and strides as `i64`s, an `i1`
//! (padding is NaN), then the shape as `i32`s and the strides as `i64`s again. The
//! launcher encodes the `CUtensorMap` from a [`TensorDescArg`] with the arguments
//! [`TmaEncode`] holds (computed here, passed to `cuTensorMapEncodeTiled` by the driver
//! layer), exactly as Triton's `make_tensordesc_arg` and `fill_tma_descriptor` do.

use crate::artifact::{ArgType, DescType, Dtype, TmaMeta, Variant};

use super::DeviceBuf;

/// One kernel parameter, as the PTX `.entry` declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ParamKind {
    /// A device pointer (`.param .u64 .ptr`), 8 bytes.
    Ptr,
    /// A scalar of this dtype (fp16 / bf16 as `.param .align 2 .b8 p[2]`).
    Scalar(Dtype),
    /// A 128-byte `CUtensorMap` (`.param .align 64 .b8 p[128]`).
    TmaDesc,
}

impl ParamKind {
    /// Size of the parameter in bytes.
    pub fn bytes(self) -> usize {
        match self {
            ParamKind::Ptr => 8,
            ParamKind::Scalar(d) => d.size_bytes(),
            ParamKind::TmaDesc => 128,
        }
    }
}

/// The kernel parameters of one signature argument, in order. `meta` is the argument's
/// `tensordesc_meta` entry (`None` for a tensor descriptor passed decomposed; ignored for
/// other arguments).
pub fn expand_arg(ty: ArgType, meta: Option<&TmaMeta>) -> Vec<ParamKind> {
    match ty {
        ArgType::Ptr(_) => vec![ParamKind::Ptr],
        ArgType::Scalar(d) => vec![ParamKind::Scalar(d)],
        ArgType::TensorDesc(t) => {
            let n = t.ndim();
            let mut out = Vec::with_capacity(4 * n + 2);
            match meta {
                Some(_) => out.push(ParamKind::TmaDesc),
                None => {
                    out.push(ParamKind::Ptr);
                    out.extend(std::iter::repeat_n(ParamKind::Scalar(Dtype::I64), 2 * n));
                    out.push(ParamKind::Scalar(Dtype::I1));
                }
            }
            out.extend(std::iter::repeat_n(ParamKind::Scalar(Dtype::I32), n));
            out.extend(std::iter::repeat_n(ParamKind::Scalar(Dtype::I64), n));
            out
        }
    }
}

/// The `tensordesc_meta` entry of each signature argument (`None` for arguments that are
/// not tensor descriptors, and for every descriptor of a variant that passes them
/// decomposed).
pub fn desc_metas(variant: &Variant) -> Vec<Option<&TmaMeta>> {
    let mut next = variant.tensordesc_meta.iter();
    variant
        .signature
        .iter()
        .map(|a| match a.ty {
            ArgType::TensorDesc(_) => next.next(),
            _ => None,
        })
        .collect()
}

/// Every kernel parameter of a variant's signature, in order (without the two trailing
/// scratch pointers), with the index of the signature argument it comes from.
pub fn kernel_params(variant: &Variant) -> Vec<(usize, ParamKind)> {
    let metas = desc_metas(variant);
    variant
        .signature
        .iter()
        .enumerate()
        .flat_map(|(i, a)| expand_arg(a.ty, metas[i]).into_iter().map(move |p| (i, p)))
        .collect()
}

/// A host tensor descriptor as a launch argument: a device buffer and the shape and
/// strides (in elements, outermost first) of the tensor it holds. The block shape comes
/// from the variant's signature (`tensordesc<fp16[64, 64]>`); the launcher encodes the
/// `CUtensorMap`. The innermost stride must be 1 (TMA, and Triton, require it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorDescArg {
    base: DeviceBuf,
    ndim: u8,
    shape: [i64; 5],
    strides: [i64; 5],
    nan_padding: bool,
}

impl TensorDescArg {
    /// A descriptor of `base` seen as a tensor of `shape` with `strides` (elements,
    /// outermost first; 1 to 5 dimensions). Out-of-bounds loads read zeros.
    ///
    /// Errors: a message when `shape` and `strides` differ in length, or the rank is not
    /// 1 to 5.
    pub fn new(base: DeviceBuf, shape: &[i64], strides: &[i64]) -> Result<Self, String> {
        if shape.len() != strides.len() || shape.is_empty() || shape.len() > 5 {
            return Err(format!(
                "a tensor descriptor needs 1 to 5 dimensions and one stride per dimension; \
                 got shape {shape:?}, strides {strides:?}"
            ));
        }
        let mut s = [0; 5];
        let mut t = [0; 5];
        s[..shape.len()].copy_from_slice(shape);
        t[..strides.len()].copy_from_slice(strides);
        Ok(TensorDescArg {
            base,
            ndim: shape.len() as u8,
            shape: s,
            strides: t,
            nan_padding: false,
        })
    }

    /// A descriptor of `base` as a contiguous row-major tensor of `shape`.
    ///
    /// Errors: as [`TensorDescArg::new`].
    pub fn contiguous(base: DeviceBuf, shape: &[i64]) -> Result<Self, String> {
        let mut strides = vec![1i64; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        TensorDescArg::new(base, shape, &strides)
    }

    /// Out-of-bounds loads read NaN instead of zero (Triton's `padding="nan"`).
    pub fn with_nan_padding(mut self) -> Self {
        self.nan_padding = true;
        self
    }

    /// The buffer.
    pub fn base(&self) -> DeviceBuf {
        self.base
    }

    /// Shape in elements, outermost first.
    pub fn shape(&self) -> &[i64] {
        &self.shape[..self.ndim as usize]
    }

    /// Strides in elements, outermost first.
    pub fn strides(&self) -> &[i64] {
        &self.strides[..self.ndim as usize]
    }

    /// Whether out-of-bounds loads read NaN.
    pub fn nan_padding(&self) -> bool {
        self.nan_padding
    }
}

/// The arguments of one `cuTensorMapEncodeTiled` call, as Triton 3.6's
/// `fill_tma_descriptor` makes them: dimensions innermost first, strides in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TmaEncode {
    /// `CUtensorMapDataType` (the driver's numbering).
    pub data_type: u32,
    /// Number of dimensions, 1..=5.
    pub rank: u32,
    /// Device address of element 0 (16-byte aligned).
    pub global_address: u64,
    /// Extent of each dimension in elements, innermost first.
    pub global_dim: [u64; 5],
    /// Stride of dimensions 1.. in bytes, innermost first (`rank - 1` used; each a
    /// multiple of 16).
    pub global_strides: [u64; 5],
    /// The box (TMA tile) in elements, innermost first.
    pub box_dim: [u32; 5],
    /// `CUtensorMapSwizzle`.
    pub swizzle: u32,
    /// Out-of-bounds fill: NaN (`CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA`)
    /// rather than zero.
    pub oob_nan: bool,
}

/// Triton's device-side TMA element type numbering -> the driver's
/// `CUtensorMapDataType` (`TMA_DTYPE_DEVICE_TO_HOST` in Triton 3.6's driver.py).
pub fn tma_host_dtype(device_elem_type: u32) -> u32 {
    match device_elem_type {
        8 => 10,
        9 => 8,
        10 => 9,
        t => t,
    }
}

/// How one tensor descriptor argument is packed.
pub(crate) struct DescPacking {
    /// The encode call (TMA form), `None` for the decomposed form.
    pub encode: Option<TmaEncode>,
}

/// Check `d` against the descriptor type `t` (and `meta` when lowered to TMA), append its
/// parameters' words to `slots` (a 0 placeholder for the `CUtensorMap`), and say how to
/// encode it. Errors: a message saying what is wrong and what was expected.
pub(crate) fn pack_desc(
    t: DescType,
    meta: Option<&TmaMeta>,
    d: &TensorDescArg,
    slots: &mut Vec<u64>,
) -> Result<DescPacking, String> {
    let n = t.ndim();
    if d.base.dtype() != t.dtype {
        return Err(format!(
            "the buffer holds {} elements, the descriptor type needs {}",
            d.base.dtype().name(),
            t.dtype.name()
        ));
    }
    if d.ndim as usize != n {
        return Err(format!(
            "a {}-dimensional descriptor was given (shape {:?}), the kernel takes {} dimensions",
            d.ndim,
            d.shape(),
            n
        ));
    }
    let shape = d.shape();
    let strides = d.strides();
    if shape.iter().any(|&s| s < 1 || s > i32::MAX as i64) {
        return Err(format!(
            "shape {shape:?}: every extent must be 1 to 2^31-1 (the kernel reads it as i32)"
        ));
    }
    if strides[n - 1] != 1 {
        return Err(format!(
            "strides {strides:?}: the innermost stride must be 1 (TMA reads rows of \
             contiguous elements)"
        ));
    }
    if strides.iter().any(|&s| s < 0) {
        return Err(format!("strides {strides:?}: strides must be >= 0"));
    }
    let elem = t.dtype.size_bytes() as u64;
    // The last element the descriptor can reach must lie inside the buffer: the TMA unit
    // clips at the shape, so this bounds every access.
    let last = shape
        .iter()
        .zip(strides)
        .try_fold(0u64, |acc, (&s, &st)| {
            ((s - 1) as u64)
                .checked_mul(st as u64)
                .and_then(|x| acc.checked_add(x))
        })
        .ok_or_else(|| format!("shape {shape:?} x strides {strides:?} overflows"))?;
    let need = last
        .checked_add(1)
        .and_then(|n| n.checked_mul(elem))
        .ok_or_else(|| format!("shape {shape:?} x strides {strides:?} overflows"))?;
    if need > d.base.bytes() as u64 {
        return Err(format!(
            "shape {shape:?} with strides {strides:?} reaches {need} bytes, the buffer has {}",
            d.base.bytes()
        ));
    }
    let encode = match meta {
        None => {
            slots.push(d.base.addr());
            slots.extend(shape.iter().map(|&s| s as u64));
            slots.extend(strides.iter().map(|&s| s as u64));
            slots.push(d.nan_padding as u64);
            None
        }
        Some(m) => {
            if m.fp4_padded {
                return Err(
                    "the compiler lowered this descriptor to padded fp4 pairs, which this \
                     launcher does not encode"
                        .to_string(),
                );
            }
            if m.block_size.len() != n {
                return Err(format!(
                    "tensordesc_meta block_size {:?} does not have {n} dimensions",
                    m.block_size
                ));
            }
            if m.elem_size as u64 != elem {
                return Err(format!(
                    "tensordesc_meta elem_size {} differs from {}'s {elem} bytes",
                    m.elem_size,
                    t.dtype.name()
                ));
            }
            if !d.base.addr().is_multiple_of(16) {
                return Err(format!(
                    "the buffer address {:#x} is not 16-byte aligned (TMA requires it)",
                    d.base.addr()
                ));
            }
            let mut e = TmaEncode {
                data_type: tma_host_dtype(m.elem_type),
                rank: n as u32,
                global_address: d.base.addr(),
                global_dim: [0; 5],
                global_strides: [0; 5],
                box_dim: [0; 5],
                swizzle: m.swizzle,
                oob_nan: d.nan_padding,
            };
            for (i, (&s, &b)) in shape.iter().zip(&m.block_size).enumerate() {
                e.global_dim[n - 1 - i] = s as u64;
                e.box_dim[n - 1 - i] = b;
                if b == 0 || b > 256 {
                    return Err(format!(
                        "tensordesc_meta block_size {:?}: each box dimension must be 1 to 256",
                        m.block_size
                    ));
                }
            }
            for i in 0..n - 1 {
                let bytes = strides[i] as u64 * elem;
                if !bytes.is_multiple_of(16) {
                    return Err(format!(
                        "strides {strides:?}: stride {} of dimension {i} is {bytes} bytes, \
                         not a multiple of 16 (TMA requires it)",
                        strides[i]
                    ));
                }
                e.global_strides[n - 2 - i] = bytes;
            }
            slots.push(0);
            Some(e)
        }
    };
    slots.extend(shape.iter().map(|&s| s as i32 as u32 as u64));
    slots.extend(strides.iter().map(|&s| s as u64));
    Ok(DescPacking { encode })
}
