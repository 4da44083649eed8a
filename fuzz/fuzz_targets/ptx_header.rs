//! PTX headers: `tritonrt::artifact::ptx_header` (the `.version` / `.target` directives,
//! read from bytes that need not be UTF-8). Errors are fine; a panic or a hang is a bug.
//! On success the version must print and parse back, and the driver-version check must
//! not panic on it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tritonrt::artifact::{
    check_ptx_version, is_arch_specific_target, ptx_header, ptx_isa_max_for_cuda, PtxVersion,
};

fuzz_target!(|data: &[u8]| {
    let Ok(h) = ptx_header(data) else {
        return;
    };
    assert!(!h.target.is_empty());
    let _ = is_arch_specific_target(&h.target);
    let printed = h.version.to_string();
    assert_eq!(PtxVersion::parse(&printed), Some(h.version));
    for cuda in [(12, 8), (13, 0)] {
        if let Some(max) = ptx_isa_max_for_cuda(cuda.0, cuda.1) {
            let _ = check_ptx_version(&h, max, cuda, "fuzz");
        }
    }
});
