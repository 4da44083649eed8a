//! The CUDA driver and one device: finding `libcuda.so.1`, the context, compute
//! capability, driver version and the PTX ISA it accepts, streams and events, loading
//! cubin modules, and JIT-compiling PTX to a cubin through the driver's linker.
//!
//! The driver is probed with libloading before any cudarc call, because cudarc panics
//! when the library is missing; here that is the error
//! `no CUDA driver found (libcuda.so.1): <dlerror>`.

use std::ffi::{c_void, CString};
use std::sync::{Arc, OnceLock};

use cudarc::driver::{result as cu, sys, CudaContext, CudaEvent, CudaStream, DriverError};

use crate::artifact::{
    check_ptx_version, cuda_version_of, ptx_isa_max_for_cuda, PtxHeader, PtxVersion,
};
use crate::error::{Error, Result};

/// The driver library looked for (the soname every NVIDIA driver installs).
pub const DRIVER_LIB: &str = "libcuda.so.1";

/// Check that the CUDA driver library can be loaded. Cheap after the first call (the
/// result is remembered). Call before anything that touches cudarc.
///
/// Errors: [`Error::NoDriver`] with the dynamic loader's message.
pub fn probe_driver() -> Result<()> {
    static PROBE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            // SAFETY: loading libcuda runs only the driver library's own initializers;
            // it is built to be dlopen'ed (cudarc and Triton's launcher do the same).
            match unsafe { libloading::Library::new(DRIVER_LIB) } {
                Ok(lib) => {
                    // Keep the driver mapped for the life of the process: cudarc loads it
                    // again by name and must never see it unloaded.
                    std::mem::forget(lib);
                    Ok(())
                }
                Err(e) => {
                    // libloading puts dlerror()'s text in the error's source.
                    let mut reason = e.to_string();
                    let mut src = std::error::Error::source(&e);
                    while let Some(s) = src {
                        reason = format!("{reason}: {s}");
                        src = s.source();
                    }
                    Err(reason)
                }
            }
        })
        .clone()
        .map_err(|reason| Error::NoDriver {
            lib: DRIVER_LIB,
            reason,
        })
}

/// Turn a cudarc driver error into [`Error::Driver`], saying what we were doing.
pub fn driver_err(op: impl Into<String>, e: DriverError) -> Error {
    let (code, msg) = driver_error_strings(e);
    Error::Driver {
        op: op.into(),
        code,
        msg,
    }
}

/// The CUresult's name (`CUDA_ERROR_INVALID_PTX`) and description.
pub fn driver_error_strings(e: DriverError) -> (String, String) {
    let code = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    let msg = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown error".to_string());
    (code, msg)
}

/// A CUDA device with its primary context. Cheap to share (`Arc<Device>`); `Send + Sync`.
pub struct Device {
    ctx: Arc<CudaContext>,
    ordinal: usize,
    name: String,
    cc: (u32, u32),
    driver_version: i32,
    max_shared_optin: u32,
    sm_count: u32,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("cc", &self.cc)
            .field("driver_version", &self.driver_version)
            .finish()
    }
}

impl Device {
    /// Number of CUDA devices (after probing the driver).
    pub fn count() -> Result<usize> {
        probe_driver()?;
        cu::init().map_err(|e| driver_err("initializing the CUDA driver (cuInit)", e))?;
        let n = cu::device::get_count().map_err(|e| driver_err("counting devices", e))?;
        Ok(n.max(0) as usize)
    }

    /// Open device `ordinal` (its primary context), after probing the driver.
    ///
    /// cudarc's per-allocation event tracking is turned off: the hot path launches on
    /// streams the caller orders, and tracking would add event records to every use.
    ///
    /// Errors: [`Error::NoDriver`], [`Error::Invalid`] (ordinal out of range),
    /// [`Error::Driver`].
    pub fn new(ordinal: usize) -> Result<Arc<Device>> {
        let count = Device::count()?;
        if ordinal >= count {
            return Err(Error::invalid(
                "device",
                format!("ordinal {ordinal} out of range: {count} CUDA device(s) present"),
            ));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| driver_err(format!("creating a context on device {ordinal}"), e))?;
        // SAFETY: from here on CudaSlices made in this context do not record events per
        // use. The obligations this moves to the caller (order cross-stream uses, do not
        // free while another stream uses a buffer) are stated on `Kernel::launch`, the
        // only place this crate hands device memory to the GPU.
        unsafe { ctx.disable_event_tracking() };
        Device::from_context(ctx)
    }

    /// A device on a context the caller owns (an engine's `Arc<CudaContext>`, as candle
    /// holds it): kernels load, allocate and launch in that context; it is only borrowed
    /// (dropping this `Device` drops one `Arc`, never the context) and its settings, such
    /// as cudarc's per-use event tracking, are left as the caller set them.
    ///
    /// Errors: [`Error::Driver`] when a device attribute cannot be queried.
    pub fn from_context(ctx: Arc<CudaContext>) -> Result<Arc<Device>> {
        let ordinal = ctx.ordinal();
        let op = |what: &str| format!("querying {what} of device {ordinal}");
        let name = ctx.name().map_err(|e| driver_err(op("the name"), e))?;
        let (maj, min) = ctx
            .compute_capability()
            .map_err(|e| driver_err(op("the compute capability"), e))?;
        let mut driver_version = 0i32;
        // SAFETY: cuDriverGetVersion writes one int through a valid pointer; the driver
        // is initialized (a CudaContext exists, so cuInit ran).
        unsafe { sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(|e| driver_err("querying the driver version", e))?;
        let attr = |a| ctx.attribute(a);
        let max_shared_optin =
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
                .map_err(|e| driver_err(op("the opt-in shared memory limit"), e))?;
        let sm_count = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| driver_err(op("the SM count"), e))?;
        Ok(Arc::new(Device {
            ctx,
            ordinal,
            name,
            cc: (maj.max(0) as u32, min.max(0) as u32),
            driver_version,
            max_shared_optin: max_shared_optin.max(0) as u32,
            sm_count: sm_count.max(0) as u32,
        }))
    }

    /// Device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Device name (`"NVIDIA H100 80GB HBM3"`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability `(major, minor)`, e.g. `(9, 0)`.
    pub fn cc(&self) -> (u32, u32) {
        self.cc
    }

    /// Arch number `10 * major + minor`, e.g. 90.
    pub fn arch(&self) -> u32 {
        self.cc.0 * 10 + self.cc.1
    }

    /// `cuDriverGetVersion`, e.g. 13000 for a CUDA 13.0 driver.
    pub fn driver_version(&self) -> i32 {
        self.driver_version
    }

    /// The driver's CUDA version `(major, minor)`.
    pub fn driver_cuda_version(&self) -> (u32, u32) {
        cuda_version_of(self.driver_version)
    }

    /// Highest PTX ISA version this driver can JIT (see [`ptx_isa_max_for_cuda`]).
    pub fn ptx_isa_max(&self) -> PtxVersion {
        let (maj, min) = self.driver_cuda_version();
        // Drivers older than CUDA 10 cannot run this crate at all (cudarc needs 11+);
        // report 0.0 so every PTX is refused with a clear message.
        ptx_isa_max_for_cuda(maj, min).unwrap_or(PtxVersion { major: 0, minor: 0 })
    }

    /// Refuse a PTX newer than this driver accepts (before any load), naming both
    /// versions. Errors: [`Error::PtxTooNew`].
    pub fn check_ptx(&self, header: &PtxHeader, what: &str) -> Result<()> {
        check_ptx_version(header, self.ptx_isa_max(), self.driver_cuda_version(), what)
    }

    /// Maximum shared memory per block a kernel may opt into, bytes.
    pub fn max_shared_per_block_optin(&self) -> u32 {
        self.max_shared_optin
    }

    /// Free and total device memory, bytes (`cuMemGetInfo`): what the whole device has
    /// left, all processes and contexts included. Errors: [`Error::Driver`].
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_err("binding the context", e))?;
        cu::mem_get_info().map_err(|e| driver_err("querying device memory", e))
    }

    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// The cudarc context (for allocations and copies).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Refuse a stream of another context: `what` (e.g. `"the indexer's stream"`) is
    /// used with `with` (e.g. `"the runtime"`), which lives on this device. A stream of
    /// another device is [`Error::DeviceMismatch`] naming both ordinals; a stream of
    /// another context on this same device (an engine's context beside the primary one)
    /// is [`Error::Invalid`]. Nothing is queued on a stream this refuses.
    pub fn check_stream(&self, stream: &CudaStream, what: &str, with: &str) -> Result<()> {
        check_stream_ctx(&self.ctx, stream, what, with)
    }

    /// The ordinal of the device that owns the device memory at `addr`
    /// (`cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)`), or `None` when
    /// the driver cannot tell (address 0, an address no allocation of this process
    /// covers, memory it does not track this way). A cheap query (no synchronization);
    /// callers run it when an address is first seen, not per launch.
    pub fn owner_of(&self, addr: u64) -> Option<usize> {
        if addr == 0 || self.ctx.bind_to_thread().is_err() {
            return None;
        }
        let mut ordinal: i32 = -1;
        // SAFETY: the driver writes one int (the attribute's documented type) through a
        // valid pointer; `addr` is only looked up, never dereferenced, and an unknown
        // address yields an error code, not a fault.
        let r = unsafe {
            sys::cuPointerGetAttribute(
                &mut ordinal as *mut i32 as *mut c_void,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                addr,
            )
        };
        match r.result() {
            Ok(()) if ordinal >= 0 => Some(ordinal as usize),
            _ => None,
        }
    }

    /// Refuse device memory of another device: `what` (a buffer at `addr`) is used with
    /// `with` on this device. Memory the driver cannot place ([`Device::owner_of`] is
    /// `None`) passes: this catches a buffer of the wrong GPU, it does not validate
    /// addresses. Errors: [`Error::DeviceMismatch`] naming both ordinals.
    pub fn check_addr(&self, addr: u64, what: &str, with: &str) -> Result<()> {
        match self.owner_of(addr) {
            Some(o) if o != self.ordinal => Err(Error::DeviceMismatch {
                what: what.to_string(),
                what_device: o,
                with: with.to_string(),
                with_device: self.ordinal,
            }),
            _ => Ok(()),
        }
    }

    /// A new non-blocking stream. Errors: [`Error::Driver`].    /// A new non-blocking stream. Errors: [`Error::Driver`].
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx
            .new_stream()
            .map_err(|e| driver_err("creating a stream", e))
    }

    /// The context's default (legacy NULL) stream.
    pub fn default_stream(&self) -> Arc<CudaStream> {
        self.ctx.default_stream()
    }

    /// A new event; `timing` enables `elapsed_ms` between two events.
    pub fn new_event(&self, timing: bool) -> Result<CudaEvent> {
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        self.ctx
            .new_event(Some(flags))
            .map_err(|e| driver_err("creating an event", e))
    }

    /// Block until all work in this context is done. Errors: [`Error::Driver`] (also
    /// reports an error recorded earlier by a `Drop`).
    ///
    /// Waits first for every graph capture in a [`crate::driver::CaptureScope`] on another
    /// thread to end ([`crate::driver::KernelGraph::capture`] holds one): the driver
    /// refuses a context-wide wait during a capture (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`)
    /// and invalidates that capture, and racing the capture's end it once crashed inside
    /// libcuda (driver 580, H200). Called from inside a capture on this thread, it reaches
    /// the driver at once and fails so. Loading a module and dropping the last handle to
    /// one (a [`crate::runtime::Runtime`] and its kernels) wait the same way.
    pub fn synchronize(&self) -> Result<()> {
        let _gate = super::gate::exclusive();
        self.ctx
            .synchronize()
            .map_err(|e| driver_err("synchronizing the context", e))?;
        self.ctx
            .check_err()
            .map_err(|e| driver_err("a previous cleanup (module unload / free)", e))
    }

    /// Load a cubin (an ELF image) as a module in this context.
    ///
    /// Errors: the driver's error (`CUDA_ERROR_INVALID_IMAGE` when the bytes are not an
    /// ELF cubin, `CUDA_ERROR_NO_BINARY_FOR_GPU` for another arch, ...); callers wrap it
    /// with the kernel, file and hash.
    pub fn load_module(&self, cubin: &[u8]) -> std::result::Result<Arc<Module>, DriverError> {
        if cubin.len() < 64 || !cubin.starts_with(b"\x7fELF") {
            return Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_IMAGE));
        }
        self.ctx.bind_to_thread()?;
        // a module load invalidates graph captures on other threads: wait for them
        let _gate = super::gate::exclusive();
        // SAFETY: `cubin` is a complete ELF image (magic checked above; callers pass
        // bytes whose size and sha256 were verified), so the driver's reads, which follow
        // the ELF header's own sizes, stay inside the slice. The slice outlives the call
        // and the driver copies what it keeps. The context is current (bind_to_thread).
        let raw = unsafe { cu::module::load_data(cubin.as_ptr() as *const c_void) }?;
        Ok(Arc::new(Module {
            raw,
            ctx: self.ctx.clone(),
        }))
    }

    /// JIT-compile PTX text to a cubin for this device through the driver's linker
    /// (`cuLinkCreate` / `cuLinkAddData` / `cuLinkComplete`), with info and error log
    /// buffers. `opt_level`: `CU_JIT_OPTIMIZATION_LEVEL` (0-4; `None`: the driver's
    /// default, 4). `name` labels the input in the driver's log.
    ///
    /// Errors: [`JitFailure`] with the CUresult name and the driver's logs.
    pub fn jit_ptx(
        &self,
        ptx: &[u8],
        name: &str,
        opt_level: Option<u32>,
    ) -> std::result::Result<JitOutput, JitFailure> {
        let fail = |e: DriverError, log: String| JitFailure {
            code: driver_error_strings(e).0,
            log,
        };
        self.ctx
            .bind_to_thread()
            .map_err(|e| fail(e, String::new()))?;
        const LOG: usize = 1 << 16;
        let mut info = vec![0u8; LOG];
        let mut error = vec![0u8; LOG];
        let mut src = ptx.to_vec();
        if src.last() != Some(&0) {
            src.push(0); // PTX input must be NUL-terminated
        }
        let cname = CString::new(name.replace('\0', "?")).unwrap_or_default();
        use sys::CUjit_option as O;
        let mut opts = vec![
            O::CU_JIT_INFO_LOG_BUFFER,
            O::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
            O::CU_JIT_ERROR_LOG_BUFFER,
            O::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
            O::CU_JIT_LOG_VERBOSE,
        ];
        // Option values are passed as pointer-sized integers or pointers, per the API.
        let mut vals: Vec<*mut c_void> = vec![
            info.as_mut_ptr() as *mut c_void,
            std::ptr::without_provenance_mut(LOG),
            error.as_mut_ptr() as *mut c_void,
            std::ptr::without_provenance_mut(LOG),
            std::ptr::without_provenance_mut(1),
        ];
        if let Some(o) = opt_level {
            opts.push(O::CU_JIT_OPTIMIZATION_LEVEL);
            vals.push(std::ptr::without_provenance_mut(o as usize));
        }
        let logs = |info: &[u8], error: &[u8]| {
            let s = |b: &[u8]| {
                let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
                String::from_utf8_lossy(&b[..end]).trim().to_string()
            };
            let (i, e) = (s(info), s(error));
            match (i.is_empty(), e.is_empty()) {
                (true, true) => "(empty)".to_string(),
                (false, true) => i,
                (true, false) => e,
                (false, false) => format!("{e}\n{i}"),
            }
        };
        let mut state: sys::CUlinkState = std::ptr::null_mut();
        // SAFETY: opts/vals have equal length and live until cuLinkDestroy below; the log
        // buffers are LOG bytes long as declared, and outlive the link state.
        let r = unsafe {
            sys::cuLinkCreate_v2(
                opts.len() as u32,
                opts.as_mut_ptr(),
                vals.as_mut_ptr(),
                &mut state,
            )
        };
        if let Err(e) = r.result() {
            return Err(fail(e, logs(&info, &error)));
        }
        let result = (|| {
            // SAFETY: `state` is a live link state; `src` is NUL-terminated PTX of
            // `src.len()` bytes that outlives the call; `cname` is a C string.
            unsafe {
                sys::cuLinkAddData_v2(
                    state,
                    sys::CUjitInputType::CU_JIT_INPUT_PTX,
                    src.as_mut_ptr() as *mut c_void,
                    src.len(),
                    cname.as_ptr(),
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            }
            .result()?;
            let mut out: *mut c_void = std::ptr::null_mut();
            let mut size = 0usize;
            // SAFETY: `state` is live; the driver sets `out`/`size` to a buffer it owns
            // until cuLinkDestroy, which we copy before destroying.
            unsafe { sys::cuLinkComplete(state, &mut out, &mut size) }.result()?;
            if out.is_null() || size == 0 {
                return Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_IMAGE));
            }
            // SAFETY: the driver guarantees `out` points to `size` readable bytes while
            // the link state lives.
            Ok(unsafe { std::slice::from_raw_parts(out as *const u8, size) }.to_vec())
        })();
        // SAFETY: `state` was created above and is destroyed exactly once.
        let _ = unsafe { sys::cuLinkDestroy(state) };
        match result {
            Ok(cubin) => Ok(JitOutput {
                cubin,
                log: logs(&info, &error),
            }),
            Err(e) => Err(fail(e, logs(&info, &error))),
        }
    }
}

/// [`Device::check_stream`] against a context: `stream` must belong to `ctx`.
pub(crate) fn check_stream_ctx(
    ctx: &CudaContext,
    stream: &CudaStream,
    what: &str,
    with: &str,
) -> Result<()> {
    let sctx = stream.context();
    if sctx.cu_ctx() == ctx.cu_ctx() {
        return Ok(());
    }
    if sctx.ordinal() != ctx.ordinal() {
        return Err(Error::DeviceMismatch {
            what: what.to_string(),
            what_device: sctx.ordinal(),
            with: with.to_string(),
            with_device: ctx.ordinal(),
        });
    }
    Err(Error::invalid(
        what,
        format!(
            "belongs to another CUDA context on device {} than {with} (streams, buffers and \
             kernels of one runtime share one context)",
            ctx.ordinal()
        ),
    ))
}

/// What `tritonrt inspect --devices` lists of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSummary {
    /// Ordinal.
    pub ordinal: usize,
    /// Name (`"NVIDIA H100 80GB HBM3"`).
    pub name: String,
    /// Compute capability `(major, minor)`.
    pub cc: (u32, u32),
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Total device memory, bytes.
    pub total_bytes: usize,
    /// Free device memory, bytes (all processes counted).
    pub free_bytes: usize,
    /// `cuDriverGetVersion` (e.g. 13000).
    pub driver_version: i32,
}

impl Device {
    /// Every CUDA device of this machine, by ordinal (each one's primary context is
    /// opened to read its memory).
    ///
    /// Errors: [`Error::NoDriver`], [`Error::Driver`].
    pub fn list() -> Result<Vec<DeviceSummary>> {
        (0..Device::count()?)
            .map(|i| {
                let d = Device::new(i)?;
                let (free_bytes, total_bytes) = d.mem_info()?;
                Ok(DeviceSummary {
                    ordinal: i,
                    name: d.name().to_string(),
                    cc: d.cc(),
                    sm_count: d.sm_count(),
                    total_bytes,
                    free_bytes,
                    driver_version: d.driver_version(),
                })
            })
            .collect()
    }
}

/// A successful JIT: the cubin and the driver's info log./// A successful JIT: the cubin and the driver's info log.
#[derive(Debug, Clone)]
pub struct JitOutput {
    /// The cubin (ELF) bytes.
    pub cubin: Vec<u8>,
    /// The driver's info log (register usage, ...).
    pub log: String,
}

/// A failed JIT: the CUresult name and the driver's logs (error log first).
#[derive(Debug, Clone)]
pub struct JitFailure {
    /// The CUresult name (`CUDA_ERROR_INVALID_PTX`, ...).
    pub code: String,
    /// The driver's error and info logs.
    pub log: String,
}

/// A loaded module (a cubin in one context). Kernels hold an `Arc<Module>`, so it stays
/// loaded as long as any kernel of it exists.
pub struct Module {
    raw: sys::CUmodule,
    ctx: Arc<CudaContext>,
}

// SAFETY: a CUmodule handle may be used from any thread once its context is made
// current there; every method binds the context first. It is only unloaded in Drop.
unsafe impl Send for Module {}
// SAFETY: see Send; the handle is never mutated after creation.
unsafe impl Sync for Module {}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module").field("raw", &self.raw).finish()
    }
}

impl Module {
    /// The function `name` of this module. Errors: the driver's
    /// (`CUDA_ERROR_NOT_FOUND` when the symbol is absent).
    pub fn function(&self, name: &str) -> std::result::Result<sys::CUfunction, DriverError> {
        let cname =
            CString::new(name).map_err(|_| DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE))?;
        self.ctx.bind_to_thread()?;
        // SAFETY: `raw` is a loaded module (unloaded only in Drop, which cannot run
        // while `&self` exists); the context is current.
        unsafe { cu::module::get_function(self.raw, cname) }
    }

    /// The context this module lives in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // Never unload while work may be queued: a kernel of this module could still be
        // pending on some stream, and unloading would pull its code from under it. So
        // synchronize the context first (modules are dropped rarely: at shutdown or when
        // a Runtime goes away). Errors are recorded in the context, never panicked on.
        self.ctx.record_err(self.ctx.bind_to_thread());
        // (after any graph capture on another thread: see `gate`)
        let _gate = super::gate::exclusive();
        self.ctx.record_err(self.ctx.synchronize());
        // SAFETY: `raw` was loaded by Device::load_module and is unloaded exactly once,
        // here, after the context has drained.
        self.ctx.record_err(unsafe { cu::module::unload(self.raw) });
    }
}
