//! TMA descriptors: `cuTensorMapEncodeTiled` for the host tensor descriptor arguments of a
//! launch (the arguments come from [`crate::abi::TmaEncode`], computed without the driver).

use cudarc::driver::sys;

use crate::abi::TmaEncode;

/// A `CUtensorMap` (128 bytes, 64-byte aligned), as a kernel parameter takes it by value.
pub type TensorMap = sys::CUtensorMap;

/// Encode one descriptor. Errors: a message naming the driver's error and the arguments.
pub fn encode_tiled(e: &TmaEncode) -> Result<TensorMap, String> {
    use sys::CUtensorMapDataType as T;
    use sys::CUtensorMapSwizzle as S;
    let data_type = match e.data_type {
        0 => T::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        1 => T::CU_TENSOR_MAP_DATA_TYPE_UINT16,
        2 => T::CU_TENSOR_MAP_DATA_TYPE_UINT32,
        3 => T::CU_TENSOR_MAP_DATA_TYPE_INT32,
        4 => T::CU_TENSOR_MAP_DATA_TYPE_UINT64,
        5 => T::CU_TENSOR_MAP_DATA_TYPE_INT64,
        6 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        7 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        8 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
        9 => T::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        10 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ,
        11 => T::CU_TENSOR_MAP_DATA_TYPE_TFLOAT32,
        12 => T::CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ,
        t => return Err(format!("unknown CUtensorMapDataType {t}")),
    };
    let swizzle = match e.swizzle {
        0 => S::CU_TENSOR_MAP_SWIZZLE_NONE,
        1 => S::CU_TENSOR_MAP_SWIZZLE_32B,
        2 => S::CU_TENSOR_MAP_SWIZZLE_64B,
        3 => S::CU_TENSOR_MAP_SWIZZLE_128B,
        s => return Err(format!("unsupported CUtensorMapSwizzle {s}")),
    };
    if !(1..=5).contains(&e.rank) {
        return Err(format!("rank {} outside 1..=5", e.rank));
    }
    let fill = if e.oob_nan {
        sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA
    } else {
        sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE
    };
    let element_strides = [1u32; 5];
    let mut map = TensorMap { opaque: [0; 16] };
    // SAFETY: every array argument points to 5 initialized elements, of which the driver
    // reads `rank` (checked 1..=5 above) or `rank - 1` (strides); `map` is a writable,
    // 64-byte aligned CUtensorMap; the enums hold valid discriminants (matched above).
    // The call only reads host memory and writes `map` (the address is recorded, never
    // dereferenced here), so it needs no context.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            data_type,
            e.rank,
            e.global_address as *mut std::ffi::c_void,
            e.global_dim.as_ptr(),
            e.global_strides.as_ptr(),
            e.box_dim.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            fill,
        )
    };
    r.result().map_err(|err| {
        let (code, msg) = super::driver_error_strings(err);
        let r = e.rank as usize;
        format!(
            "cuTensorMapEncodeTiled refused the descriptor: {code}: {msg} (data type {}, \
             address {:#x}, dims {:?}, byte strides {:?}, box {:?}, swizzle {}; innermost first)",
            e.data_type,
            e.global_address,
            &e.global_dim[..r],
            &e.global_strides[..r.saturating_sub(1)],
            &e.box_dim[..r],
            e.swizzle
        )
    })?;
    Ok(map)
}
