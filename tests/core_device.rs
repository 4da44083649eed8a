//! Driver probing and PTX version rules, without a GPU.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};

use tritonrt::artifact::{check_ptx_version, cuda_version_of, ptx_isa_max_for_cuda};
use tritonrt::artifact::{ptx_header, ArtifactStore, PtxVersion};
use tritonrt::driver::{probe_driver, Device};
use tritonrt::Error;

fn fixtures() -> PathBuf {
    std::env::var_os("TRITONRT_TEST_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
}

fn v(major: u32, minor: u32) -> PtxVersion {
    PtxVersion { major, minor }
}

#[test]
fn ptx_isa_table() {
    let table = [
        ((10, 2), v(6, 5)),
        ((11, 0), v(7, 0)),
        ((11, 8), v(7, 8)),
        ((12, 0), v(8, 0)),
        ((12, 4), v(8, 4)),
        ((12, 5), v(8, 5)),
        ((12, 6), v(8, 5)),
        ((12, 8), v(8, 7)),
        ((12, 9), v(8, 8)),
        ((13, 0), v(9, 0)),
        ((13, 1), v(9, 1)),
    ];
    for ((maj, min), want) in table {
        assert_eq!(
            ptx_isa_max_for_cuda(maj, min),
            Some(want),
            "CUDA {maj}.{min}"
        );
    }
    assert_eq!(ptx_isa_max_for_cuda(9, 2), None);
    assert_eq!(cuda_version_of(13000), (13, 0));
    assert_eq!(cuda_version_of(12080), (12, 8));
    assert_eq!(cuda_version_of(12090), (12, 9));
}

#[test]
fn ptx_newer_than_the_driver_is_refused_naming_both() {
    let s = ArtifactStore::open(fixtures().join("ptx_cache")).unwrap();
    let var = &s.all_variants()[0];
    let h = ptx_header(&s.read_ptx(var).unwrap()).unwrap();
    assert_eq!(
        h.version,
        v(8, 7),
        "fixture PTX is ISA 8.7 (Triton 3.6's ptxas, CUDA 12.8)"
    );
    // A CUDA 12.6 driver (PTX <= 8.5) must refuse it, naming both versions.
    let max = ptx_isa_max_for_cuda(12, 6).unwrap();
    let err = check_ptx_version(&h, max, (12, 6), "kernel X (file.ptx)").unwrap_err();
    assert!(matches!(err, Error::PtxTooNew { .. }));
    let msg = err.to_string();
    for want in ["kernel X (file.ptx)", "8.7", "8.5", "CUDA 12.6"] {
        assert!(msg.contains(want), "{want:?} not in {msg}");
    }
    // CUDA 12.8 and 13.0 drivers accept it.
    check_ptx_version(&h, ptx_isa_max_for_cuda(12, 8).unwrap(), (12, 8), "k").unwrap();
    check_ptx_version(&h, ptx_isa_max_for_cuda(13, 0).unwrap(), (13, 0), "k").unwrap();
}

#[test]
fn missing_driver_is_an_error_not_a_panic() {
    match probe_driver() {
        Ok(()) => {
            skip!("a CUDA driver is present; the no-driver message is not testable here")
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.starts_with("no CUDA driver found (libcuda.so.1): "),
                "{msg}"
            );
            assert!(
                msg.len() > "no CUDA driver found (libcuda.so.1): ".len(),
                "{msg}"
            );
            // Everything that touches the driver reports the same error.
            let e2 = Device::new(0).unwrap_err().to_string();
            assert_eq!(e2, msg);
            assert!(Device::count().is_err());
        }
    }
}
