//! Device memory as kernels take it: [`DeviceBuf`] (address, bytes, dtype) made from a
//! live cudarc allocation, the element types that map to Triton dtypes ([`DeviceDtype`]),
//! and [`DevBuf`], a growable device buffer (the kernel scratch and the indexer state).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr, DriverError, ValidAsZeroBits};

pub use crate::abi::DeviceBuf;
use crate::artifact::Dtype;

/// A host type whose values a kernel reads as Triton dtype [`DeviceDtype::DTYPE`] (same
/// size and bit layout): the element type of a `CudaSlice<T>` / `CudaView<T>` a kernel
/// argument is made from.
pub trait DeviceDtype {
    /// The Triton element dtype.
    const DTYPE: Dtype;
}

macro_rules! device_dtype {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl DeviceDtype for $t {
            const DTYPE: Dtype = Dtype::$d;
        }
    )*};
}

device_dtype!(
    f32 => Fp32, f64 => Fp64, half::f16 => Fp16, half::bf16 => Bf16,
    i8 => I8, i16 => I16, i32 => I32, i64 => I64,
    u8 => U8, u16 => U16, u32 => U32, u64 => U64,
);

impl DeviceBuf {
    /// The buffer of a live allocation in the runtime's context: a `CudaSlice<T>`, a
    /// `CudaView<T>` or a `CudaViewMut<T>` (its address for use on `stream`, its length,
    /// `T`'s dtype). With cudarc's per-use event tracking on (a context an engine owns),
    /// `stream` first waits for the allocation's pending writes, as cudarc's own launches
    /// do.
    pub fn of<T: DeviceDtype, S: DevicePtr<T>>(s: &S, stream: &CudaStream) -> DeviceBuf {
        let (addr, _sync) = s.device_ptr(stream);
        DeviceBuf::from_parts(addr, s.len() * std::mem::size_of::<T>(), T::DTYPE)
    }
}

impl DeviceBuf {
    /// A buffer of `bytes` bytes of `dtype` elements at device address `addr`, for memory
    /// the runtime did not see allocated (another library's, an engine's raw pointers),
    /// e.g. to describe it with a [`crate::abi::TensorDescArg`].
    ///
    /// # Safety
    ///
    /// `addr` .. `addr + bytes` is device memory of the context the kernel runs in, and
    /// stays allocated until every launch given this buffer has completed.
    pub unsafe fn from_raw_parts(addr: u64, bytes: usize, dtype: Dtype) -> DeviceBuf {
        DeviceBuf::from_parts(addr, bytes, dtype)
    }
}

/// A growable device buffer of `T`: grows only (never shrinks), and its contents are not
/// kept across a growth (the new allocation is zero-filled).
///
/// The allocation belongs to the stream it was made on (cudarc frees it in stream order
/// when it is dropped or replaced); a caller using it from another stream orders that
/// use itself (this crate's contexts run without cudarc's per-use event tracking).
pub struct DevBuf<T> {
    buf: Option<CudaSlice<T>>,
    /// The allocation's device address, read once when it was made: later uses take it
    /// from here, not through cudarc's `device_ptr`, which in a context with event
    /// tracking on (an engine's) would wait for and record an event on every use (about
    /// a microsecond each, tens per step). The buffer is used on the stream it was made
    /// on, so those events would order nothing.
    addr: u64,
}

impl<T> Default for DevBuf<T> {
    fn default() -> Self {
        DevBuf::new()
    }
}

impl<T> std::fmt::Debug for DevBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevBuf").field("len", &self.len()).finish()
    }
}

/// A failed allocation of a [`DevBuf`]: the element count asked of the driver and its
/// error.
#[derive(Debug)]
pub struct AllocError {
    /// Elements of `T` the failed allocation was for.
    pub elements: usize,
    /// The driver's error.
    pub source: DriverError,
}

impl From<AllocError> for crate::Error {
    fn from(e: AllocError) -> Self {
        super::device::driver_err(format!("allocating {} elements", e.elements), e.source)
    }
}

impl<T> DevBuf<T> {
    /// An empty buffer (no allocation).
    pub const fn new() -> Self {
        DevBuf { buf: None, addr: 0 }
    }

    /// Elements allocated (0 when empty).
    pub fn len(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.len())
    }

    /// Whether nothing is allocated.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The allocation, if any.
    pub fn slice(&self) -> Option<&CudaSlice<T>> {
        self.buf.as_ref()
    }

    /// The allocation, if any, mutably (for copies and memsets into it).
    pub fn slice_mut(&mut self) -> Option<&mut CudaSlice<T>> {
        self.buf.as_mut()
    }

    /// The device address of the allocation (0 when empty).
    pub fn ptr(&self) -> u64 {
        self.addr
    }

    /// Drop the allocation (freed in the order of the stream it was made on). The caller
    /// makes sure no queued work of another stream still uses it.
    pub fn release(&mut self) {
        self.buf = None;
        self.addr = 0;
    }
}

impl<T: DeviceDtype> DevBuf<T> {
    /// The allocation as a kernel argument (address 0, 0 bytes when empty).
    pub fn buf(&self) -> DeviceBuf {
        DeviceBuf::from_parts(self.addr, self.len() * std::mem::size_of::<T>(), T::DTYPE)
    }
}

impl<T: DeviceRepr + ValidAsZeroBits> DevBuf<T> {
    /// Make the buffer hold at least `max(len, 1)` elements. When it holds fewer, the
    /// old allocation is dropped and a zero-filled one of `max(len, 1, 2 x old length)`
    /// elements is made on `stream` (geometric growth: a buffer that follows a growing
    /// size reallocates O(log) times). Returns whether it reallocated.
    ///
    /// Errors: [`AllocError`] (the driver refused the allocation or the memset).
    pub fn ensure(
        &mut self,
        stream: &Arc<CudaStream>,
        len: usize,
    ) -> std::result::Result<bool, AllocError> {
        let have = self.len();
        if have >= len.max(1) {
            return Ok(false);
        }
        let new_len = len.max(1).max(have * 2);
        let b = stream.alloc_zeros::<T>(new_len).map_err(|e| AllocError {
            elements: new_len,
            source: e,
        })?;
        self.addr = b.device_ptr(stream).0;
        self.buf = Some(b);
        Ok(true)
    }
}
