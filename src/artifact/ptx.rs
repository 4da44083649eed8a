//! The PTX ISA versions a driver accepts (pure: no driver calls), and the check that
//! refuses a PTX newer than that before any load.

use super::{PtxHeader, PtxVersion};
use crate::error::{Error, Result};

/// The CUDA version of a `cuDriverGetVersion` value: `13000` -> `(13, 0)`, `12080` ->
/// `(12, 8)`.
pub fn cuda_version_of(driver_version: i32) -> (u32, u32) {
    let v = driver_version.max(0) as u32;
    (v / 1000, (v % 1000) / 10)
}

/// The highest PTX ISA version a driver of CUDA version `major.minor` accepts.
///
/// Table (from NVIDIA's PTX ISA release notes; the same rule Triton 3.6 uses in
/// `ptx_get_version`):
///
/// | CUDA | PTX ISA |
/// | --- | --- |
/// | 10.x | 6.(3 + x) |
/// | 11.x | 7.x |
/// | 12.0 - 12.5 | 8.0 - 8.5 |
/// | 12.6 | 8.5 |
/// | 12.8 | 8.7 |
/// | 12.9 | 8.8 |
/// | 13.x | 9.x |
///
/// Newer majors are extrapolated (`14.x` -> `10.x`). `None` below CUDA 10.
pub fn ptx_isa_max_for_cuda(major: u32, minor: u32) -> Option<PtxVersion> {
    let (maj, min) = match major {
        10 => (6, 3 + minor),
        11 => (7, minor),
        12 if minor < 6 => (8, minor),
        12 => (8, minor - 1),
        m if m >= 13 => (9 + (m - 13), minor),
        _ => return None,
    };
    Some(PtxVersion {
        major: maj,
        minor: min,
    })
}

/// Refuse a PTX whose `.version` is newer than `max` (the driver's limit), naming both.
/// `what` names the kernel variant and file in the message.
pub fn check_ptx_version(
    header: &PtxHeader,
    max: PtxVersion,
    driver_cuda: (u32, u32),
    what: &str,
) -> Result<()> {
    if header.version > max {
        return Err(Error::PtxTooNew {
            what: what.to_string(),
            ptx: header.version.to_string(),
            driver_max: max.to_string(),
            driver_cuda: format!("{}.{}", driver_cuda.0, driver_cuda.1),
        });
    }
    Ok(())
}
