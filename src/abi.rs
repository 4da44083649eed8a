//! The Triton 3.6 launch ABI (pure: no driver calls): launch argument kinds and
//! their packing into parameter slots in signature order (then the global and profile
//! scratch pointers), and the launch plan of a variant for a grid.

use crate::artifact::{Arg, ArgType, Dtype, Variant};
use crate::error::{Error, Result};

mod desc;
pub use desc::{
    desc_metas, expand_arg, kernel_params, tma_host_dtype, ParamKind, TensorDescArg, TmaEncode,
};

#[cfg(target_endian = "big")]
compile_error!("kernel parameter packing assumes a little-endian host");

/// A device buffer handed to a kernel: its address, its length in bytes and the dtype
/// of its elements. Made from a live allocation of the runtime's context (a cudarc
/// `CudaSlice`, `CudaView` or `CudaViewMut`, or a [`crate::driver::DevBuf`]) by
/// [`DeviceBuf::of`](crate::driver::buffer) in the driver layer, never from a bare
/// number: a launch that takes only these and scalars is a safe call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceBuf {
    addr: u64,
    bytes: usize,
    dtype: Dtype,
}

impl DeviceBuf {
    /// Address, length in bytes and element dtype (the driver layer's constructors only).
    pub(crate) fn from_parts(addr: u64, bytes: usize, dtype: Dtype) -> Self {
        DeviceBuf { addr, bytes, dtype }
    }

    /// The device address of the first byte (0 for an empty buffer).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The element dtype a kernel's pointer argument must have to take this buffer.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// The same memory as elements of `dtype` (a buffer of bytes that holds bf16 values,
    /// say; any bit pattern is a valid value of every dtype here).
    pub fn as_dtype(self, dtype: Dtype) -> Self {
        DeviceBuf { dtype, ..self }
    }
}

/// One launch argument: a device buffer or a scalar of its exact Triton type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArg {
    /// A device buffer, for a `*<dtype>` argument of its element dtype.
    Buf(DeviceBuf),
    /// A bare device address, for any `*<dtype>` argument: only
    /// [`crate::driver::Kernel::launch_raw`], the raw escape hatch, takes it.
    RawPtr(u64),
    /// `i1`.
    Bool(bool),
    /// `i8`.
    I8(i8),
    /// `i16`.
    I16(i16),
    /// `i32`.
    I32(i32),
    /// `i64`.
    I64(i64),
    /// `u8`.
    U8(u8),
    /// `u16`.
    U16(u16),
    /// `u32`.
    U32(u32),
    /// `u64`.
    U64(u64),
    /// `fp16`.
    F16(half::f16),
    /// `bf16`.
    Bf16(half::bf16),
    /// `fp32`.
    F32(f32),
    /// `fp64`.
    F64(f64),
    /// A host tensor descriptor, for a `tensordesc<...>` argument: a buffer of its
    /// element dtype, the tensor's shape and strides (the block shape is the kernel's).
    TensorDesc(TensorDescArg),
}

impl KernelArg {
    /// What the argument is, for messages (`"I64"`, `"Buf of *fp32"`, ...).
    pub fn kind(&self) -> String {
        match self {
            KernelArg::Buf(b) => return format!("Buf of *{}", b.dtype.name()),
            KernelArg::TensorDesc(d) => {
                return format!("TensorDesc of {} {:?}", d.base().dtype().name(), d.shape())
            }
            KernelArg::RawPtr(_) => "RawPtr (bare device address)",
            KernelArg::Bool(_) => "Bool (i1)",
            KernelArg::I8(_) => "I8",
            KernelArg::I16(_) => "I16",
            KernelArg::I32(_) => "I32",
            KernelArg::I64(_) => "I64",
            KernelArg::U8(_) => "U8",
            KernelArg::U16(_) => "U16",
            KernelArg::U32(_) => "U32",
            KernelArg::U64(_) => "U64",
            KernelArg::F16(_) => "F16",
            KernelArg::Bf16(_) => "Bf16",
            KernelArg::F32(_) => "F32",
            KernelArg::F64(_) => "F64",
        }
        .to_string()
    }

    /// Whether this argument fits a parameter of Triton type `ty` (exact match: a
    /// buffer's element dtype is the pointer's; any pointer type takes `RawPtr`).
    pub fn matches(&self, ty: ArgType) -> bool {
        use Dtype as D;
        match (self, ty) {
            (KernelArg::Buf(b), ArgType::Ptr(d)) => d.is_none_or(|d| d == b.dtype),
            (KernelArg::RawPtr(_), ArgType::Ptr(_)) => true,
            (KernelArg::TensorDesc(_), ArgType::TensorDesc(_)) => true,
            (_, ArgType::Ptr(_) | ArgType::TensorDesc(_))
            | (KernelArg::Buf(_) | KernelArg::RawPtr(_) | KernelArg::TensorDesc(_), _) => false,
            (a, ArgType::Scalar(d)) => matches!(
                (a, d),
                (KernelArg::Bool(_), D::I1)
                    | (KernelArg::I8(_), D::I8)
                    | (KernelArg::I16(_), D::I16)
                    | (KernelArg::I32(_), D::I32)
                    | (KernelArg::I64(_), D::I64)
                    | (KernelArg::U8(_), D::U8)
                    | (KernelArg::U16(_), D::U16)
                    | (KernelArg::U32(_), D::U32)
                    | (KernelArg::U64(_), D::U64)
                    | (KernelArg::F16(_), D::Fp16)
                    | (KernelArg::Bf16(_), D::Bf16)
                    | (KernelArg::F32(_), D::Fp32)
                    | (KernelArg::F64(_), D::Fp64)
            ),
        }
    }

    /// The value as the kernel reads it, in the low bytes of a little-endian u64 (a
    /// tensor descriptor: its buffer's address; its parameters are packed by
    /// [`pack_params`]).
    pub fn slot(&self) -> u64 {
        match *self {
            KernelArg::Buf(b) => b.addr,
            KernelArg::TensorDesc(d) => d.base().addr,
            KernelArg::RawPtr(p) => p,
            KernelArg::Bool(b) => b as u64,
            KernelArg::I8(v) => v as u8 as u64,
            KernelArg::I16(v) => v as u16 as u64,
            KernelArg::I32(v) => v as u32 as u64,
            KernelArg::I64(v) => v as u64,
            KernelArg::U8(v) => v as u64,
            KernelArg::U16(v) => v as u64,
            KernelArg::U32(v) => v as u64,
            KernelArg::U64(v) => v,
            KernelArg::F16(v) => v.to_bits() as u64,
            KernelArg::Bf16(v) => v.to_bits() as u64,
            KernelArg::F32(v) => v.to_bits() as u64,
            KernelArg::F64(v) => v.to_bits(),
        }
    }

    /// The magnitude of an address or integer (for divisibility), `None` for floats.
    fn int_magnitude(&self) -> Option<u64> {
        Some(match *self {
            KernelArg::TensorDesc(_) => return None,
            KernelArg::Buf(b) => b.addr,
            KernelArg::RawPtr(p) => p,
            KernelArg::Bool(b) => b as u64,
            KernelArg::I8(v) => v.unsigned_abs() as u64,
            KernelArg::I16(v) => v.unsigned_abs() as u64,
            KernelArg::I32(v) => v.unsigned_abs() as u64,
            KernelArg::I64(v) => v.unsigned_abs(),
            KernelArg::U8(v) => v as u64,
            KernelArg::U16(v) => v as u64,
            KernelArg::U32(v) => v as u64,
            KernelArg::U64(v) => v,
            _ => return None,
        })
    }
}

/// Where each argument of a variant's signature sits in a list of argument names (a
/// caller's named arguments): one position per signature argument, in signature order.
/// Every signature argument must be given exactly once; unless `subset` (one list
/// serving several kernels), no name outside the signature may be given either, so a
/// kernel whose arguments were renamed or reordered fails with the name, not at run time.
///
/// Errors: a message naming the missing argument (with its type), the unknown one or
/// the one given twice.
pub fn arg_positions(
    signature: &[Arg],
    named: &[&str],
    subset: bool,
) -> std::result::Result<Vec<usize>, String> {
    for (i, name) in named.iter().enumerate() {
        if named[..i].contains(name) {
            return Err(format!("argument {name} was given twice"));
        }
        if !subset && !signature.iter().any(|a| a.name == *name) {
            return Err(format!("the kernel has no argument named {name}"));
        }
    }
    signature
        .iter()
        .map(|a| {
            named
                .iter()
                .position(|n| *n == a.name)
                .ok_or_else(|| format!("argument {} ({}) was not supplied", a.name, a.ty))
        })
        .collect()
}

/// Check `args` against the variant's signature and pack them: one u64 slot per kernel
/// parameter, holding the value in its low bytes (the kernel reads exactly the
/// parameter's size from the slot's address). A tensor descriptor argument fills several
/// slots ([`expand_arg`]); its `CUtensorMap`, which only the driver can encode, gets a 0
/// placeholder (see [`pack_params`]). Scratch pointers are not included.
///
/// Errors: [`Error::ArgCount`], [`Error::ArgType`] (names kernel, index, argument,
/// expected and given type), [`Error::ArgDivisibility`] (a pointer or integer that is not
/// a multiple of the `divisibility` the variant was compiled to assume),
/// [`Error::ArgDesc`] (a tensor descriptor that does not fit its buffer or TMA's rules).
pub fn pack_args(variant: &Variant, args: &[KernelArg]) -> Result<Vec<u64>> {
    Ok(pack_params(variant, args)?.slots)
}

/// Packed launch parameters: one slot per kernel parameter, and the `CUtensorMap`s the
/// driver layer must encode into the slots named.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedParams {
    /// One u64 per kernel parameter (a 0 placeholder where a `CUtensorMap` goes).
    pub slots: Vec<u64>,
    /// `(slot index, encode call)` of each TMA descriptor parameter.
    pub tma: Vec<(usize, TmaEncode)>,
}

/// [`pack_args`], with the TMA descriptors to encode. Errors: as [`pack_args`].
pub fn pack_params(variant: &Variant, args: &[KernelArg]) -> Result<PackedParams> {
    let mut slots = Vec::with_capacity(args.len() + 2);
    let mut tma = Vec::new();
    pack_args_into(variant, args, &mut slots, &mut tma)?;
    Ok(PackedParams { slots, tma })
}

pub(crate) fn pack_args_into(
    variant: &Variant,
    args: &[KernelArg],
    slots: &mut Vec<u64>,
    tma: &mut Vec<(usize, TmaEncode)>,
) -> Result<()> {
    if args.len() != variant.signature.len() {
        return Err(Error::ArgCount {
            kernel: variant.id.clone(),
            expected: variant.signature.len(),
            got: args.len(),
            signature: variant.signature_string(),
        });
    }
    let mut metas = variant.tensordesc_meta.iter();
    for (index, (arg, param)) in args.iter().zip(&variant.signature).enumerate() {
        if !arg.matches(param.ty) {
            return Err(Error::ArgType {
                kernel: variant.id.clone(),
                index,
                name: param.name.clone(),
                expected: param.ty.to_string(),
                got: arg.kind(),
            });
        }
        if let (KernelArg::TensorDesc(d), ArgType::TensorDesc(t)) = (arg, param.ty) {
            let at = slots.len();
            let p = desc::pack_desc(t, metas.next(), d, slots).map_err(|msg| Error::ArgDesc {
                kernel: variant.id.clone(),
                index,
                name: param.name.clone(),
                ty: param.ty.to_string(),
                msg,
            })?;
            if let Some(e) = p.encode {
                tma.push((at, e));
            }
            continue;
        }
        if param.divisibility > 1 && param.ty.divisibility_applies() {
            if let Some(v) = arg.int_magnitude() {
                if v % param.divisibility as u64 != 0 {
                    return Err(Error::ArgDivisibility {
                        kernel: variant.id.clone(),
                        index,
                        name: param.name.clone(),
                        value: arg.slot(),
                        divisibility: param.divisibility,
                    });
                }
            }
        }
        slots.push(arg.slot());
    }
    Ok(())
}

/// How a launch of a variant on a grid will be issued (a pure function of the metadata).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchPlan {
    /// Driver grid: `(grid.x * num_ctas, grid.y, grid.z)` blocks.
    pub grid: [u32; 3],
    /// Block: `(32 * num_warps, 1, 1)` threads.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, bytes (the variant's `shared`).
    pub shared_bytes: u32,
    /// Cluster dimensions ([`Variant::launch_cluster`]).
    pub cluster: Option<[u32; 3]>,
    /// Programmatic dependent launch.
    pub pdl: bool,
    /// Cooperative grid launch.
    pub cooperative: bool,
    /// Global scratch to provide, bytes: `grid.x * grid.y * grid.z * num_ctas * size`.
    pub global_scratch_bytes: u64,
    /// Profile scratch to provide, bytes (same rule).
    pub profile_scratch_bytes: u64,
    /// A grid dimension is 0: nothing is launched (as Triton does).
    pub empty: bool,
}

impl LaunchPlan {
    /// Whether the launch needs `cuLaunchKernelEx` (cluster, PDL or cooperative).
    pub fn needs_ex(&self) -> bool {
        self.cluster.is_some() || self.pdl || self.cooperative
    }
}

/// Plan a launch of `variant` on `grid` (Triton's program grid).
///
/// Errors: [`Error::Launch`] when the driver grid would exceed CUDA's limits
/// (x <= 2^31 - 1, y and z <= 65535).
pub fn plan_launch(variant: &Variant, grid: [u32; 3]) -> Result<LaunchPlan> {
    let refuse = |msg: String| Error::Launch {
        kernel: variant.id.clone(),
        msg,
    };
    let x = grid[0] as u64 * variant.num_ctas as u64;
    if x > i32::MAX as u64 {
        return Err(refuse(format!(
            "grid.x {} x num_ctas {} = {x} blocks exceeds CUDA's limit of 2^31-1",
            grid[0], variant.num_ctas
        )));
    }
    if grid[1] > 65535 || grid[2] > 65535 {
        return Err(refuse(format!(
            "grid {grid:?}: y and z must be at most 65535"
        )));
    }
    let programs = grid.iter().map(|&g| g as u64).product::<u64>() * variant.num_ctas as u64;
    let cluster = variant.launch_cluster();
    if let (Some(c), 1) = (cluster, variant.num_ctas) {
        if (0..3).any(|i| !grid[i].is_multiple_of(c[i])) {
            return Err(refuse(format!(
                "grid {grid:?} is not a whole number of clusters {c:?} (each dimension a multiple)"
            )));
        }
    }
    Ok(LaunchPlan {
        grid: [x as u32, grid[1], grid[2]],
        block: [32 * variant.num_warps, 1, 1],
        shared_bytes: variant.shared,
        cluster,
        pdl: variant.launch_pdl,
        cooperative: variant.launch_cooperative_grid,
        global_scratch_bytes: programs * variant.global_scratch_size as u64,
        profile_scratch_bytes: programs * variant.profile_scratch_size as u64,
        empty: grid.contains(&0),
    })
}
