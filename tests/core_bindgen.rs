//! Typed launchers generated from a manifest (`tritonrt::bindgen`): the text for a
//! manifest holding every argument kind is compared with a committed golden file, and that
//! file is compiled here (`include!`), so the generator's output is known to type-check.
//! Regenerate the golden file with `TRITONRT_BLESS=1 cargo test --release --test core_bindgen`.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};

use tritonrt::artifact::{import_triton_cache_entry, ArtifactStore};
use tritonrt::bindgen::{generate, rust_ident};

/// The golden launchers, compiled as part of this test.
#[allow(dead_code)]
mod golden {
    include!("fixtures/bindings_golden.rs");
}

fn fixtures() -> PathBuf {
    std::env::var_os("TRITONRT_TEST_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
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

/// The golden launchers on the GPU (sm_90): every scalar kind through `scalars`, host
/// tensor descriptors through `desc_scale` both as TMA (`sm90` variant) and decomposed
/// (the portable `sm80` variant, JIT-compiled forward), checked against exact values.
#[test]
fn typed_launchers_run_on_the_gpu() {
    use tritonrt::abi::TensorDescArg;
    use tritonrt::driver::{Device, DeviceBuf};
    use tritonrt::half::{bf16, f16};
    if tritonrt::driver::probe_driver().is_err() {
        skip!("no CUDA driver");
        return;
    }
    let dev = Device::new(0).unwrap();
    if dev.arch() != 90 {
        skip!(
            "the fixtures' default variants are sm_90a; this GPU is sm_{}",
            dev.arch()
        );
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let store = manifest_with_every_kind(t.path());
    let cache = tritonrt::jit::CubinCache::new(t.path().join("cubins")).unwrap();
    let rt = tritonrt::runtime::Runtime::new(dev.clone(), store, cache);
    let stream = dev.new_stream().unwrap();

    // y = x * a + b + c64 + i8v + i16v + i64v + u32v + 1 (flag), exact in fp16.
    let n = 1000usize;
    let x: Vec<u16> = (0..n)
        .map(|i| f16::from_f32((i % 8) as f32).to_bits())
        .collect();
    let xd = stream.clone_htod(&x).unwrap();
    let yd = stream.alloc_zeros::<u16>(n).unwrap();
    golden::scalars(
        &rt,
        &stream,
        [1, 1, 1],
        &xd,
        &yd,
        f16::from_f32(2.0),
        bf16::from_f32(0.5),
        n as i32,
        true,
        0.25,
        -1,
        2,
        3,
        4,
    )
    .unwrap();
    let y = stream.clone_dtoh(&yd).unwrap();
    for (i, v) in y.iter().enumerate() {
        let want = 2.0 * (i % 8) as f32 + 9.75;
        assert_eq!(f16::from_bits(*v).to_f32(), want, "scalars: y[{i}]");
    }

    // out = in * 2 over 128 x 128 fp16, 64 x 64 blocks: TMA (sm90) and decomposed (sm80).
    let src: Vec<u16> = (0..128 * 128)
        .map(|i| f16::from_f32((i % 61) as f32).to_bits())
        .collect();
    let sd = stream.clone_htod(&src).unwrap();
    for id in [None, Some("desc_scale.triton-1fdb00965362b7f0.w4.s3.sm80")] {
        let od = stream.alloc_zeros::<u16>(128 * 128).unwrap();
        let desc = |b: DeviceBuf| {
            TensorDescArg::contiguous(b.as_dtype(tritonrt::artifact::Dtype::Fp16), &[128, 128])
                .unwrap()
        };
        let (i, o) = (
            desc(DeviceBuf::of(&sd, &stream)),
            desc(DeviceBuf::of(&od, &stream)),
        );
        match id {
            None => golden::desc_scale(&rt, &stream, [2, 2, 1], i, o, f16::from_f32(2.0)).unwrap(),
            Some(id) => {
                let k = rt.kernel(id).unwrap();
                golden::desc_scale_on(&k, &stream, [2, 2, 1], i, o, f16::from_f32(2.0)).unwrap()
            }
        }
        let out = stream.clone_dtoh(&od).unwrap();
        for (j, v) in out.iter().enumerate() {
            let want = 2.0 * (j % 61) as f32;
            assert_eq!(
                f16::from_bits(*v).to_f32(),
                want,
                "desc_scale {id:?}: out[{j}]"
            );
        }
    }
    // A variant of another kernel is refused by the typed launcher.
    let axpy = rt.default_kernel("axpy_kernel").unwrap();
    let i = TensorDescArg::contiguous(
        DeviceBuf::of(&sd, &stream).as_dtype(tritonrt::artifact::Dtype::Fp16),
        &[128, 128],
    )
    .unwrap();
    let e = golden::desc_scale_on(&axpy, &stream, [1, 1, 1], i, i, f16::ONE).unwrap_err();
    assert!(
        e.to_string()
            .contains("a launcher of desc_scale was given a variant of axpy_kernel"),
        "{e}"
    );
}

/// `examples/own_kernel/kernels.rs` is what bindgen writes for the example's ptx_cache.
#[test]
fn the_example_launchers_are_up_to_date() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let s = ArtifactStore::open(root.join("examples/own_kernel/ptx_cache")).unwrap();
    let text = generate(s.manifest(), "examples/own_kernel/ptx_cache/manifest.json").unwrap();
    let have = std::fs::read_to_string(root.join("examples/own_kernel/kernels.rs")).unwrap();
    assert!(
        text == have,
        "examples/own_kernel/kernels.rs is stale: tritonrt bindgen --ptx-cache \
         examples/own_kernel/ptx_cache --out examples/own_kernel/kernels.rs"
    );
}

/// A TMA descriptor argument in a captured CUDA graph: the 128-byte parameter is copied at
/// capture, replayed, then replaced by an in-place node update (new buffers, new scale).
#[test]
fn tma_descriptors_in_cuda_graphs() {
    use tritonrt::abi::{KernelArg, TensorDescArg};
    use tritonrt::artifact::Dtype;
    use tritonrt::driver::{Device, DeviceBuf, KernelGraph};
    use tritonrt::half::f16;
    if tritonrt::driver::probe_driver().is_err() {
        skip!("no CUDA driver");
        return;
    }
    let dev = Device::new(0).unwrap();
    if dev.arch() != 90 {
        skip!(
            "the fixtures' default variants are sm_90a; this GPU is sm_{}",
            dev.arch()
        );
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let store = manifest_with_every_kind(t.path());
    let cache = tritonrt::jit::CubinCache::new(t.path().join("cubins")).unwrap();
    let rt = tritonrt::runtime::Runtime::new(dev.clone(), store, cache);
    let k = rt.default_kernel("desc_scale").unwrap();
    assert!(!k.variant().tensordesc_meta.is_empty(), "the TMA variant");
    let stream = dev.new_stream().unwrap();
    let src: Vec<u16> = (0..128 * 128)
        .map(|i| f16::from_f32((i % 31) as f32).to_bits())
        .collect();
    let sd = stream.clone_htod(&src).unwrap();
    let (o1, o2) = (
        stream.alloc_zeros::<u16>(128 * 128).unwrap(),
        stream.alloc_zeros::<u16>(128 * 128).unwrap(),
    );
    let desc = |b: DeviceBuf| {
        KernelArg::TensorDesc(
            TensorDescArg::contiguous(b.as_dtype(Dtype::Fp16), &[128, 128]).unwrap(),
        )
    };
    let args = |o, s: f32| {
        [
            desc(DeviceBuf::of(&sd, &stream)),
            desc(o),
            KernelArg::F16(f16::from_f32(s)),
        ]
    };
    let mut g = KernelGraph::capture(&stream, |s| {
        k.launch(s, [2, 2, 1], &args(DeviceBuf::of(&o1, &stream), 2.0))
    })
    .unwrap();
    assert_eq!(g.kernel_nodes(), 1);
    g.launch().unwrap();
    g.update(0, &k, [2, 2, 1], &args(DeviceBuf::of(&o2, &stream), 3.0))
        .unwrap();
    g.launch().unwrap();
    stream.synchronize().unwrap();
    for (o, s) in [(&o1, 2.0f32), (&o2, 3.0)] {
        let got = stream.clone_dtoh(o).unwrap();
        for (j, v) in got.iter().enumerate() {
            assert_eq!(
                f16::from_bits(*v).to_f32(),
                s * (j % 31) as f32,
                "scale {s}: out[{j}]"
            );
        }
    }
}
