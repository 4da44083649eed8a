//! Typed launchers generated from a manifest (`tritonrt::bindgen`): the text for a
//! manifest holding every argument kind is compared with a committed golden file, and that
//! file is compiled here (`include!`), so the generator's output is known to type-check.
//! Regenerate the golden file with `TRITONRT_BLESS=1 cargo test --release --test core_bindgen`.

use std::path::{Path, PathBuf};

use tritonrt::artifact::{import_triton_cache_entry, ArtifactStore};
use tritonrt::bindgen::{generate, rust_ident};

/// The golden launchers, compiled as part of this test.
#[allow(dead_code)]
mod golden {
    include!("fixtures/bindings_golden.rs");
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The fixture ptx_cache (axpy, fp32) plus the imported argument-kind kernels.
fn manifest_with_every_kind(dir: &Path) -> ArtifactStore {
    let pc = dir.join("pc");
    std::fs::create_dir_all(&pc).unwrap();
    for e in std::fs::read_dir(fixtures().join("ptx_cache")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), pc.join(e.file_name())).unwrap();
    }
    for e in ["scalars_sm90", "desc_scale_sm90", "desc_scale_sm80"] {
        import_triton_cache_entry(&fixtures().join("triton_cache_args").join(e), &pc).unwrap();
    }
    ArtifactStore::open(&pc).unwrap()
}

#[test]
fn generated_launchers_match_the_golden_file() {
    let t = tempfile::tempdir().unwrap();
    let s = manifest_with_every_kind(t.path());
    let text = generate(s.manifest(), "tests/core_bindgen.rs's manifest").unwrap();
    let golden = fixtures().join("bindings_golden.rs");
    if std::env::var_os("TRITONRT_BLESS").is_some() {
        std::fs::write(&golden, &text).unwrap();
    }
    let want = std::fs::read_to_string(&golden).unwrap();
    assert!(
        text == want,
        "the generated launchers differ from {}; if the change is intended, regenerate with \
         TRITONRT_BLESS=1",
        golden.display()
    );
    for (f, ty) in [
        ("pub fn scalars(", "b: tritonrt::half::bf16,"),
        ("pub fn scalars(", "flag: bool,"),
        ("pub fn scalars(", "c64: f64,"),
        (
            "pub fn desc_scale(",
            "in_desc: tritonrt::abi::TensorDescArg,",
        ),
        ("pub fn desc_scale(", "scale: tritonrt::half::f16,"),
        (
            "pub fn axpy_kernel(",
            "x_ptr: &impl tritonrt::cudarc::driver::DevicePtr<f32>,",
        ),
    ] {
        let at = text.find(f).unwrap();
        assert!(text[at..].contains(ty), "{f} {ty}");
    }
    // The golden functions exist with the types above (compile-time check).
    type DescScaleOn = fn(
        &tritonrt::driver::Kernel,
        &std::sync::Arc<tritonrt::cudarc::driver::CudaStream>,
        [u32; 3],
        tritonrt::abi::TensorDescArg,
        tritonrt::abi::TensorDescArg,
        tritonrt::half::f16,
    ) -> tritonrt::Result<()>;
    let _: DescScaleOn = golden::desc_scale_on;
    assert_eq!(golden::DESC_SCALE, "desc_scale");
}

#[test]
fn identifiers_are_made_rust() {
    assert_eq!(rust_ident("pq_score_lut.q_bf16"), "pq_score_lut_q_bf16");
    assert_eq!(rust_ident("type"), "r#type");
    assert_eq!(rust_ident("1x"), "_1x");
    assert_eq!(rust_ident(""), "_");
}

#[test]
fn kernels_that_collide_as_rust_names_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let s = manifest_with_every_kind(t.path());
    let mut m = s.manifest().clone();
    for v in m.variants.iter_mut().filter(|v| v.kernel == "scalars") {
        v.kernel = "axpy.kernel".into();
    }
    for v in m.variants.iter_mut().filter(|v| v.kernel == "axpy_kernel") {
        v.kernel = "axpy-kernel".into();
    }
    let e = generate(&m, "x").unwrap_err();
    assert!(
        e.contains("axpy-kernel") && e.contains("axpy.kernel") && e.contains("axpy_kernel"),
        "{e}"
    );
}
