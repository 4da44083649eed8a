//! Loaded kernels ([`Kernel`]: module, function, attributes) and their launches with
//! Triton 3.6's ABI, checked typed arguments or the raw escape hatch.
//!
//! Launch ABI (what Triton's own launcher does): the signature's arguments in
//! declaration order (constexprs and ints specialized to 1 already removed by the
//! build), then the `global_scratch` and `profile_scratch` pointers (null when the size
//! is 0); `gridDim = (grid.x * num_ctas, grid.y, grid.z)`, `blockDim = 32 * num_warps`,
//! all of `shared` as dynamic shared memory; a cluster of `(num_ctas, 1, 1)` when
//! `num_ctas > 1`, or of the variant's `cluster_dims` for one-CTA programs that ask for
//! one (the grid a whole number of them); PDL and cooperative launch as
//! `cuLaunchKernelEx` attributes. A grid with a zero dimension launches nothing. A host tensor descriptor argument
//! ([`KernelArg::TensorDesc`]) is several parameters; its `CUtensorMap` is encoded for each
//! launch (`cuTensorMapEncodeTiled`) and passed by value.
//!
//! Argument checking ([`crate::abi::pack_args`]) and launch planning
//! ([`crate::abi::plan_launch`]) are pure functions, tested without a GPU.

use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use cudarc::driver::{result as cu, sys, CudaStream};
use parking_lot::Mutex;

use super::buffer::DevBuf;
use super::device::{driver_error_strings, Device, Module};
use crate::abi::{pack_args_into, plan_launch, KernelArg, LaunchPlan, TmaEncode};
use crate::artifact::Variant;
use crate::error::CodeOrigin;
use crate::error::{Error, Result};

/// Times of loading one kernel.
#[derive(Debug, Clone, Copy)]
pub struct LoadInfo {
    /// Where the cubin came from (manifest, cache hit, JIT).
    pub outcome: CacheOutcome,
    /// Getting the cubin bytes: read + verify, or JIT + cache store.
    pub cubin_time: Duration,
    /// `cuModuleLoadData` + function lookup + attribute setup.
    pub module_time: Duration,
}

impl LoadInfo {
    /// Total load time.
    pub fn total(&self) -> Duration {
        self.cubin_time + self.module_time
    }
}

/// Scratch buffers of one stream: reused by every launch on that stream (stream order
/// keeps launches from overlapping), grown when a larger grid needs more. The buffers are
/// allocated on the context's default stream, so they hold no reference to `stream`
/// (whose going away is how a dropped stream's scratch is found), and freed by
/// `scratch_for` (dropped streams) or Kernel's Drop, each after a synchronization.
#[derive(Debug)]
struct StreamScratch {
    stream: Weak<CudaStream>,
    global: DevBuf<u8>,
    profile: DevBuf<u8>,
}

/// A loaded kernel variant: its CUfunction, its manifest metadata, and an `Arc` to its
/// module so the code stays loaded while the kernel exists.
pub struct Kernel {
    variant: Variant,
    device: Arc<Device>,
    module: Arc<Module>,
    func: sys::CUfunction,
    load: LoadInfo,
    num_regs: i32,
    local_bytes: i32,
    scratch: Mutex<Vec<StreamScratch>>,
}

// SAFETY: a CUfunction is an immutable handle into a loaded module; the driver allows
// launching it from any thread with its context current (launch binds it). The module
// is kept alive by `module`. The only mutable state (scratch) is behind a Mutex.
unsafe impl Send for Kernel {}
// SAFETY: see Send.
unsafe impl Sync for Kernel {}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("id", &self.variant.id)
            .field("load", &self.load)
            .finish()
    }
}

fn func_attr(
    f: sys::CUfunction,
    a: sys::CUfunction_attribute,
) -> std::result::Result<i32, cudarc::driver::DriverError> {
    // SAFETY: `f` is a function of a module that is loaded for the duration of the call
    // (the caller holds an Arc<Module>); the context is current.
    unsafe { cu::function::get_function_attribute(f, a) }
}

impl Kernel {
    /// Load `built.cubin` on `device` as `variant`: module, entry function, shared
    /// memory limits (raises `MAX_DYNAMIC_SHARED_SIZE_BYTES` when `shared` > 48 KiB).
    /// `cubin_time` is how long obtaining the cubin took (for [`LoadInfo`]).
    ///
    /// Errors: [`Error::LoadFailed`] (names kernel, entry, file, hash, arch, PTX version
    /// and the driver's code), [`Error::SharedMemory`] (requested vs max bytes),
    /// [`Error::Launch`] (block larger than the function allows; cluster/PDL on a GPU
    /// older than sm_90).
    pub fn load(device: &Arc<Device>, variant: &Variant, built: &BuiltCubin) -> Result<Kernel> {
        let t0 = Instant::now();
        let load_err = |e| {
            let (code, msg) = driver_error_strings(e);
            Error::LoadFailed {
                origin: Box::new(CodeOrigin {
                    kernel: variant.id.clone(),
                    entry: variant.entry.clone(),
                    file: built.origin.0.clone(),
                    sha256: built.origin.1.clone(),
                    arch: device.arch(),
                    ptx_version: variant.ptx_version.clone(),
                    target: variant.ptx_target.clone(),
                }),
                code,
                msg,
            }
        };
        let module = device.load_module(&built.cubin).map_err(load_err)?;
        let func = module.function(&variant.entry).map_err(load_err)?;
        use sys::CUfunction_attribute as A;
        let static_shared =
            func_attr(func, A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES).map_err(load_err)?;
        let max_threads =
            func_attr(func, A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK).map_err(load_err)?;
        let num_regs = func_attr(func, A::CU_FUNC_ATTRIBUTE_NUM_REGS).map_err(load_err)?;
        let local_bytes =
            func_attr(func, A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES).map_err(load_err)?;
        let refuse = |msg: String| Error::Launch {
            kernel: variant.id.clone(),
            msg,
        };
        let threads = 32 * variant.num_warps;
        if threads as i64 > max_threads as i64 {
            return Err(refuse(format!(
                "needs {threads} threads per block (32 x num_warps {}), the compiled function \
                 allows at most {max_threads} ({num_regs} registers per thread)",
                variant.num_warps
            )));
        }
        let requested = variant.shared as u64 + static_shared.max(0) as u64;
        let max = device.max_shared_per_block_optin() as u64;
        if requested > max {
            return Err(Error::SharedMemory {
                kernel: variant.id.clone(),
                requested,
                max,
            });
        }
        if requested > 48 * 1024 {
            // SAFETY: `func` belongs to `module`, alive here; the value is within the
            // device's opt-in limit (checked above).
            unsafe {
                cu::function::set_function_attribute(
                    func,
                    A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    variant.shared as i32,
                )
            }
            .map_err(load_err)?;
        }
        let cluster = variant.launch_cluster();
        if (cluster.is_some() || variant.launch_pdl) && device.arch() < 90 {
            return Err(refuse(format!(
                "clusters ({cluster:?}) / launch_pdl {} need a cluster-capable GPU (sm_90+), this one is sm_{}",
                variant.launch_pdl,
                device.arch()
            )));
        }
        if cluster.is_some_and(|c| c.iter().product::<u32>() > 8) {
            // Clusters above 8 CTAs are "non-portable"; Hopper runs 16 when allowed.
            // SAFETY: as above, `func` is alive.
            unsafe {
                cu::function::set_function_attribute(
                    func,
                    A::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                    1,
                )
            }
            .map_err(load_err)?;
        }
        Ok(Kernel {
            variant: variant.clone(),
            device: device.clone(),
            module,
            func,
            load: LoadInfo {
                outcome: built.outcome,
                cubin_time: built.elapsed,
                module_time: t0.elapsed(),
            },
            num_regs,
            local_bytes,
            scratch: Mutex::new(Vec::new()),
        })
    }

    /// A second handle on the same loaded function that is launched without
    /// programmatic stream serialization, whatever the variant's `launch_pdl`: for a
    /// kernel built for programmatic dependent launch (it waits with
    /// `griddepcontrol.wait` before what depends on its primary) issued where no
    /// primary precedes it; there the wait returns at once. The module stays loaded
    /// while either handle lives; scratch buffers are the handle's own.
    pub fn without_pdl(&self) -> Kernel {
        let mut variant = self.variant.clone();
        variant.launch_pdl = false;
        Kernel {
            variant,
            device: self.device.clone(),
            module: self.module.clone(),
            func: self.func,
            load: self.load,
            num_regs: self.num_regs,
            local_bytes: self.local_bytes,
            scratch: Mutex::new(Vec::new()),
        }
    }

    /// The manifest metadata of this kernel.
    pub fn variant(&self) -> &Variant {
        &self.variant
    }

    /// The variant id.
    pub fn id(&self) -> &str {
        &self.variant.id
    }

    /// Ask the driver to configure an SM running this kernel for the most shared memory
    /// (`CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT` = 100 %, a hint), so that CTAs
    /// of a kernel that needs shared memory can run beside this one's. An SM's L1 /
    /// shared split is set for the kernel it runs and changes only when it drains: a
    /// kernel that uses no shared memory otherwise keeps a programmatic dependent that
    /// does off its SMs until its own CTAs exit (measured on the H100, NOTES.md, session
    /// 11: `pq_index` beside `pq_wfill`).
    ///
    /// Errors: [`Error::Launch`] when the driver refuses the attribute.
    pub fn prefer_shared_carveout(&self) -> Result<()> {
        let ctx = self.device.context();
        let refuse = |msg: String| Error::Launch {
            kernel: self.variant.id.clone(),
            msg,
        };
        ctx.bind_to_thread()
            .map_err(|e| refuse(format!("binding the context: {e}")))?;
        // SAFETY: `func` is a live function handle of this kernel's loaded module.
        unsafe {
            sys::cuFuncSetAttribute(
                self.func,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                100,
            )
        }
        .result()
        .map_err(|e| refuse(format!("setting the shared memory carveout: {e}")))
    }

    /// CTAs of this kernel that fit on one SM at once (registers, shared memory, warps),
    /// as the driver's occupancy calculator gives it for the variant's block
    /// (`32 x num_warps` threads) and dynamic shared memory; at least 1.
    ///
    /// Errors: [`Error::Launch`] when the driver refuses the query.
    pub fn max_ctas_per_sm(&self) -> Result<u32> {
        let refuse = |msg: String| Error::Launch {
            kernel: self.variant.id.clone(),
            msg,
        };
        self.device
            .context()
            .bind_to_thread()
            .map_err(|e| refuse(format!("binding the context: {e}")))?;
        let mut n: std::ffi::c_int = 0;
        let threads = (32 * self.variant.num_warps) as std::ffi::c_int;
        // SAFETY: `func` is a live function handle of this kernel's loaded module; `n` is
        // a valid out-pointer for the call's duration.
        unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut n,
                self.func,
                threads,
                self.variant.shared as usize,
            )
        }
        .result()
        .map_err(|e| refuse(format!("querying the occupancy: {e}")))?;
        Ok(n.max(1) as u32)
    }

    /// The device it is loaded on.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// How it was loaded and how long that took.
    pub fn load_info(&self) -> LoadInfo {
        self.load
    }

    /// Registers per thread (from the driver).
    pub fn num_regs(&self) -> i32 {
        self.num_regs
    }

    /// Local memory (spills) per thread, bytes.
    pub fn local_bytes(&self) -> i32 {
        self.local_bytes
    }

    /// The raw CUfunction (valid while this Kernel lives).
    pub fn raw_function(&self) -> sys::CUfunction {
        self.func
    }

    /// Launch on `stream` with Triton's program grid `grid` and `args` in signature order:
    /// device buffers ([`KernelArg::Buf`], made from live allocations), scalars, and host
    /// tensor descriptors ([`KernelArg::TensorDesc`]: a buffer with its shape and strides;
    /// checked against the buffer's size, then encoded as a TMA descriptor where the
    /// variant was compiled for one).
    /// Arguments are checked (count, types, each buffer's dtype against its pointer
    /// parameter, divisibility) and the launch planned before anything reaches the driver.
    /// The launch is asynchronous; errors raised by the kernel while running appear at the
    /// next synchronization.
    ///
    /// Global/profile scratch (when the variant needs any) comes from a buffer per
    /// (kernel, stream) that grows to the largest grid seen; steady-state launches
    /// allocate nothing on the device.
    ///
    /// What is checked and what is trusted: every buffer is a live allocation of a
    /// context (cudarc made it) with the parameter's dtype; what no launcher can check is
    /// the kernel's own indexing, so the kernel (a verified artifact) is trusted to stay
    /// inside its buffers for the grid and scalars given, and the caller passes scalars
    /// that describe its buffers (a length no larger than the buffer's), keeps them
    /// allocated until the launch completes, and orders uses from other streams (as with
    /// cudarc's own launches when its event tracking is off). Bare addresses
    /// ([`KernelArg::RawPtr`]) are refused: they go through [`Kernel::launch_raw`].
    ///
    /// Errors: argument errors as in [`crate::abi::pack_args`], [`Error::Launch`] (a raw
    /// pointer argument, grid limits, scratch allocation or the driver refusing the
    /// launch), [`Error::DeviceMismatch`] (a stream of another device, naming both
    /// ordinals), [`Error::Invalid`] (a stream of another context on the same device).
    pub fn launch(
        &self,
        stream: &Arc<CudaStream>,
        grid: [u32; 3],
        args: &[KernelArg],
    ) -> Result<()> {
        self.refuse_raw(args)?;
        // SAFETY: no argument is a bare address: every pointer is a live allocation's
        // (DeviceBuf is only made from one) with the parameter's dtype (checked by
        // pack_args_into); the kernel's indexing within them is the artifact's contract,
        // stated above.
        unsafe { self.launch_raw(stream, grid, args) }
    }

    /// Refuse bare addresses where only checked buffers may go.
    pub(super) fn refuse_raw(&self, args: &[KernelArg]) -> Result<()> {
        match args.iter().position(|a| matches!(a, KernelArg::RawPtr(_))) {
            Some(i) => Err(Error::Launch {
                kernel: self.variant.id.clone(),
                msg: format!(
                    "argument {i} is a bare device address (KernelArg::RawPtr): pass a \
                     KernelArg::Buf made from the allocation, or use the unsafe launch_raw"
                ),
            }),
            None => Ok(()),
        }
    }

    /// [`Kernel::launch`] that also takes bare device addresses ([`KernelArg::RawPtr`]):
    /// the escape hatch for memory the runtime did not see allocated (another library's,
    /// an engine's raw pointers).
    ///
    /// # Safety
    ///
    /// The metadata cannot prove what the kernel does with its pointers. The caller must
    /// guarantee that:
    /// - every pointer argument is a device address valid in this kernel's context, of an
    ///   allocation large enough for every element the kernel reads or writes for this
    ///   grid and these scalar arguments, and stays allocated until the launch completes;
    /// - no other stream writes memory this launch reads or reads memory it writes while
    ///   it runs, unless ordered by events (cudarc's per-use event tracking is off);
    /// - the scalar values keep the kernel in bounds (e.g. `n` does not exceed the
    ///   buffers' length).
    ///
    /// Errors: as [`Kernel::launch`], raw pointers allowed.
    pub unsafe fn launch_raw(
        &self,
        stream: &Arc<CudaStream>,
        grid: [u32; 3],
        args: &[KernelArg],
    ) -> Result<()> {
        let plan = plan_launch(&self.variant, grid)?;
        let mut slots = Vec::with_capacity(args.len() + 2);
        let mut tma = Vec::new();
        pack_args_into(&self.variant, args, &mut slots, &mut tma)?;
        if plan.empty {
            return Ok(());
        }
        let refuse = |msg: String| Error::Launch {
            kernel: self.variant.id.clone(),
            msg,
        };
        let ctx = self.device.context();
        super::device::check_stream_ctx(
            ctx,
            stream,
            "the launch's stream",
            &format!("kernel {}", self.variant.id),
        )?;
        let mut maps = self.encode_maps(&tma)?;
        ctx.bind_to_thread()
            .map_err(|e| refuse(format!("binding the context: {e}")))?;
        let (g, p) = if plan.global_scratch_bytes > 0 || plan.profile_scratch_bytes > 0 {
            self.scratch_for(stream, &plan)?
        } else {
            (0, 0)
        };
        slots.push(g);
        slots.push(p);
        let mut params = param_pointers(&mut slots, &tma, &mut maps);
        let r = if plan.needs_ex() {
            let mut attrs = launch_attrs(&plan);
            let config = sys::CUlaunchConfig {
                gridDimX: plan.grid[0],
                gridDimY: plan.grid[1],
                gridDimZ: plan.grid[2],
                blockDimX: plan.block[0],
                blockDimY: plan.block[1],
                blockDimZ: plan.block[2],
                sharedMemBytes: plan.shared_bytes,
                hStream: stream.cu_stream(),
                attrs: attrs.as_mut_ptr(),
                numAttrs: attrs.len() as u32,
            };
            // SAFETY: `func` is alive (self holds its module); `params` has one pointer
            // per kernel parameter (signature checked and expanded by pack_args_into, + 2
            // scratch), each pointing to an 8-byte slot or a 128-byte CUtensorMap that
            // outlives this call (the driver copies parameter values at launch); `attrs`
            // outlives the call; the context is current; pointer validity is the caller's
            // contract (# Safety).
            unsafe {
                sys::cuLaunchKernelEx(
                    &config,
                    self.func,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            }
            .result()
        } else {
            // SAFETY: as for cuLaunchKernelEx above.
            unsafe {
                cu::launch_kernel(
                    self.func,
                    (plan.grid[0], plan.grid[1], plan.grid[2]),
                    (plan.block[0], plan.block[1], plan.block[2]),
                    plan.shared_bytes,
                    stream.cu_stream(),
                    &mut params,
                )
            }
        };
        r.map_err(|e| {
            let (code, msg) = driver_error_strings(e);
            refuse(format!(
                "{code}: {msg} (grid {:?}, block {:?}, shared {} bytes)",
                plan.grid, plan.block, plan.shared_bytes
            ))
        })
    }

    /// Encode the launch's TMA descriptors (none for most kernels: no allocation then).
    fn encode_maps(&self, tma: &[(usize, TmaEncode)]) -> Result<Vec<super::tma::TensorMap>> {
        tma.iter()
            .map(|(slot, e)| {
                super::tma::encode_tiled(e).map_err(|msg| {
                    let name = crate::abi::kernel_params(&self.variant)
                        .get(*slot)
                        .and_then(|(i, _)| self.variant.signature.get(*i))
                        .map_or("?".to_string(), |a| format!("{} ({})", a.name, a.ty));
                    Error::Launch {
                        kernel: self.variant.id.clone(),
                        msg: format!("tensor descriptor argument {name}: {msg}"),
                    }
                })
            })
            .collect()
    }

    /// The scratch pointers for a launch on `stream`, growing this stream's buffers if
    /// the plan needs more.
    fn scratch_for(&self, stream: &Arc<CudaStream>, plan: &LaunchPlan) -> Result<(u64, u64)> {
        let refuse = |msg: String| Error::Launch {
            kernel: self.variant.id.clone(),
            msg,
        };
        let mut table = self.scratch.lock();
        // A dropped stream's buffers may still be in use by work it queued: drain the
        // context before freeing them (rare: only when streams come and go). The wait
        // takes the capture gate, which is never waited for with the table locked (a
        // capture on another thread may be launching this kernel).
        let mut _gate = None;
        if table.iter().any(|s| s.stream.strong_count() == 0) {
            drop(table);
            _gate = super::gate::exclusive();
            table = self.scratch.lock();
        }
        if table.iter().any(|s| s.stream.strong_count() == 0) {
            self.device
                .context()
                .synchronize()
                .map_err(|e| refuse(format!("synchronizing before freeing scratch: {e}")))?;
            // (freed as they are dropped, after the synchronization above)
            table.retain(|s| s.stream.strong_count() > 0);
        }
        let idx = match table
            .iter()
            .position(|s| std::ptr::eq(s.stream.as_ptr(), Arc::as_ptr(stream)))
        {
            Some(i) => i,
            None => {
                table.push(StreamScratch {
                    stream: Arc::downgrade(stream),
                    global: DevBuf::new(),
                    profile: DevBuf::new(),
                });
                table.len() - 1
            }
        };
        let v = &self.variant;
        let entry = &mut table[idx];
        let g = grow(
            self,
            stream,
            &mut entry.global,
            plan.global_scratch_bytes,
            v.global_scratch_align,
        )?;
        let p = grow(
            self,
            stream,
            &mut entry.profile,
            plan.profile_scratch_bytes,
            v.profile_scratch_align,
        )?;
        Ok((g, p))
    }
}

/// The `align`-aligned address of `bytes` bytes of scratch in `buf` for a launch on
/// `stream`, growing `buf` first when it cannot hold them.
fn grow(
    k: &Kernel,
    stream: &CudaStream,
    buf: &mut DevBuf<u8>,
    bytes: u64,
    align: u32,
) -> Result<u64> {
    if bytes == 0 {
        return Ok(0);
    }
    let align = (align.max(1) as u64).max(1);
    let aligned = |b: &DevBuf<u8>| {
        let base = b.ptr();
        (base.div_ceil(align) * align, base + b.len() as u64)
    };
    if !buf.is_empty() {
        let (ptr, end) = aligned(buf);
        if ptr + bytes <= end {
            return Ok(ptr);
        }
        // The old buffer may be in use by launches queued on this stream.
        stream.synchronize().map_err(|e| Error::Launch {
            kernel: k.variant.id.clone(),
            msg: format!("synchronizing before growing scratch: {e}"),
        })?;
        buf.release();
    }
    // Pad so that any base address leaves room to align. Allocated (and zero-filled) on
    // the context's default stream, which is waited for before `stream` uses the buffer.
    let home = k.device.context().default_stream();
    let refuse = |what: &str, e: cudarc::driver::DriverError| Error::Launch {
        kernel: k.variant.id.clone(),
        msg: format!("{what} {bytes} bytes of scratch: {e}"),
    };
    buf.ensure(&home, (bytes + align - 1) as usize)
        .map_err(|e| refuse("allocating", e.source))?;
    home.synchronize().map_err(|e| refuse("waiting for", e))?;
    Ok(aligned(buf).0)
}

/// The `void*` array a launch passes: one pointer per kernel parameter, to its slot, or
/// to its encoded `CUtensorMap` for a TMA descriptor parameter. The pointers stay valid
/// while `slots` and `maps` are neither moved nor resized.
fn param_pointers(
    slots: &mut [u64],
    tma: &[(usize, TmaEncode)],
    maps: &mut [super::tma::TensorMap],
) -> Vec<*mut c_void> {
    let mut params: Vec<*mut c_void> = slots
        .iter_mut()
        .map(|s| s as *mut u64 as *mut c_void)
        .collect();
    for ((slot, _), map) in tma.iter().zip(maps.iter_mut()) {
        params[*slot] = map as *mut super::tma::TensorMap as *mut c_void;
    }
    params
}

fn launch_attrs(plan: &LaunchPlan) -> Vec<sys::CUlaunchAttribute> {
    use sys::CUlaunchAttributeID as Id;
    let mut attrs = Vec::new();
    let mk = |id: Id, f: &dyn Fn(&mut sys::CUlaunchAttributeValue)| {
        // SAFETY: CUlaunchAttribute is a plain C struct/union; all-zero is a valid value
        // (id IGNORE, zeroed payload) before we fill it.
        let mut a: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        a.id = id;
        f(&mut a.value);
        a
    };
    if plan.pdl {
        attrs.push(mk(
            Id::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            &|v| v.programmaticStreamSerializationAllowed = 1,
        ));
    }
    if plan.cooperative {
        attrs.push(mk(Id::CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &|v| {
            v.cooperative = 1
        }));
    }
    if let Some([x, y, z]) = plan.cluster {
        attrs.push(mk(Id::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &|v| {
            v.clusterDim.x = x;
            v.clusterDim.y = y;
            v.clusterDim.z = z;
        }));
        attrs.push(mk(
            Id::CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
            &|v| {
                v.clusterSchedulingPolicyPreference =
                    sys::CUclusterSchedulingPolicy::CU_CLUSTER_SCHEDULING_POLICY_SPREAD
            },
        ));
    }
    attrs
}

impl Kernel {
    /// Point a kernel node of an instantiated CUDA graph at new arguments and a new grid
    /// (`cuGraphExecKernelNodeSetParams`), so a captured step can follow a growing
    /// sequence without being captured again. The node must have been captured from a
    /// launch of this kernel; block size and shared memory stay the variant's.
    ///
    /// # Safety
    ///
    /// As for [`Kernel::launch`] (every pointer valid for what the kernel touches with
    /// these arguments and this grid, until the graph's next replay completes), and
    /// `exec` / `node` must be live handles of one graph, not replaying on another thread.
    ///
    /// A PDL variant's node keeps the programmatic edge it was captured with, and a
    /// cluster variant's node its cluster (the update changes grid and arguments only).
    ///
    /// Errors: argument errors as in [`pack_args`]; [`Error::Launch`] when the variant
    /// needs scratch, `num_ctas > 1` or a cooperative grid (not supported for updates),
    /// when the grid is not a whole number of clusters, when
    /// the node runs another function, or when the driver refuses the update.
    pub(super) unsafe fn update_graph_node(
        &self,
        exec: sys::CUgraphExec,
        node: sys::CUgraphNode,
        grid: [u32; 3],
        args: &[KernelArg],
    ) -> Result<()> {
        let refuse = |msg: String| Error::Launch {
            kernel: self.variant.id.clone(),
            msg,
        };
        let plan = plan_launch(&self.variant, grid)?;
        // The graph and this kernel live in one context; make it current, so an update
        // issued from a thread that last worked on another device finds it.
        self.device
            .context()
            .bind_to_thread()
            .map_err(|e| refuse(format!("binding the context: {e}")))?;
        // a node keeps the cluster it was captured with (a launch attribute of the node,
        // not one of the parameters updated here): clusters of one-CTA programs are kept,
        // Triton's multi-CTA programs are refused
        if plan.global_scratch_bytes > 0
            || plan.profile_scratch_bytes > 0
            || self.variant.num_ctas > 1
            || plan.cooperative
        {
            return Err(refuse(
                "graph node updates support plain, PDL and one-CTA-program cluster launches only \
                 (no scratch, num_ctas > 1 or cooperative grid)"
                    .to_string(),
            ));
        }
        let mut slots = Vec::with_capacity(args.len() + 2);
        let mut tma = Vec::new();
        pack_args_into(&self.variant, args, &mut slots, &mut tma)?;
        let mut maps = self.encode_maps(&tma)?;
        slots.push(0);
        slots.push(0);
        let mut params = param_pointers(&mut slots, &tma, &mut maps);
        // SAFETY: `p` is plain data the driver fills for a live kernel node (caller's
        // contract); zeroed is a valid bit pattern for it (pointers and integers).
        let mut p: sys::CUDA_KERNEL_NODE_PARAMS = std::mem::zeroed();
        sys::cuGraphKernelNodeGetParams_v2(node, &mut p)
            .result()
            .map_err(|e| refuse(format!("reading the graph node's parameters: {e}")))?;
        if p.func != self.func {
            return Err(refuse("the graph node runs another kernel".to_string()));
        }
        p.gridDimX = plan.grid[0];
        p.gridDimY = plan.grid[1];
        p.gridDimZ = plan.grid[2];
        p.kernelParams = params.as_mut_ptr();
        p.extra = std::ptr::null_mut();
        // SAFETY: `params` holds one pointer per kernel parameter (checked by
        // pack_args_into, + the two null scratch pointers), each to an 8-byte slot (or a
        // 128-byte CUtensorMap) that
        // outlives this call (the driver copies the values); `exec`/`node` are live
        // (caller's contract).
        sys::cuGraphExecKernelNodeSetParams_v2(exec, node, &p)
            .result()
            .map_err(|e| refuse(format!("updating the graph node: {e}")))
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        // Scratch may be in use by queued launches: drain the context, then free. Errors
        // are recorded in the context (reported by the next checked call), never panicked
        // on. The module itself is unloaded (after its own sync) when the last Arc goes.
        let table = std::mem::take(&mut *self.scratch.lock());
        if table
            .iter()
            .any(|s| !s.global.is_empty() || !s.profile.is_empty())
        {
            let ctx = self.device.context();
            let _gate = super::gate::exclusive();
            ctx.record_err(ctx.synchronize());
        }
        // the buffers are freed here, after the synchronization
        drop(table);
        let _ = &self.module;
    }
}

/// Where a cubin came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// The manifest's own cubin (variant arch == device arch); no JIT, no cache.
    ManifestCubin,
    /// A verified cache entry.
    Hit,
    /// Not in the cache: JIT-compiled now and stored.
    Built,
    /// The entry was corrupt (warning printed): JIT-compiled again and replaced.
    Rebuilt,
}

impl CacheOutcome {
    /// Short label for tables: `manifest`, `cache`, `jit`, `jit (rebuilt)`.
    pub fn label(self) -> &'static str {
        match self {
            CacheOutcome::ManifestCubin => "manifest cubin",
            CacheOutcome::Hit => "cache hit",
            CacheOutcome::Built => "jit",
            CacheOutcome::Rebuilt => "jit (rebuilt)",
        }
    }

    /// Whether the driver JIT ran.
    pub fn jitted(self) -> bool {
        matches!(self, CacheOutcome::Built | CacheOutcome::Rebuilt)
    }
}

/// A cubin fetched by `CubinCache::get_or_build` (`crate::jit`), with timing.
#[derive(Debug, Clone)]
pub struct BuiltCubin {
    /// The cubin bytes.
    pub cubin: Vec<u8>,
    /// Where it came from.
    pub outcome: CacheOutcome,
    /// The file the bytes came from (manifest cubin, cache entry, or the PTX that was
    /// JIT-compiled) and its sha256, for error messages.
    pub origin: (PathBuf, String),
    /// Wall time to obtain the bytes (read + verify, or JIT + store).
    pub elapsed: Duration,
    /// The driver's JIT info log when the JIT ran.
    pub jit_log: Option<String>,
}
