//! `tritonrt launch` without a GPU: every argument is bound and checked before the device
//! is opened, so each refusal (missing tensor, wrong dtype, wrong scalar type, an
//! argument too many or too few) is a clear error naming the kernel, the argument and
//! what was expected.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn tritonrt(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_tritonrt"))
        .args(args)
        .env_remove("TRITONRT_PTX_CACHE")
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A safetensors file: (name, dtype, shape, bytes) each.
fn safetensors(path: &Path, tensors: &[(&str, &str, &[usize], Vec<u8>)]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + bytes.len()]}),
        );
        data.extend_from_slice(bytes);
    }
    let mut h = serde_json::Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    std::fs::write(path, out).unwrap();
}

const AXPY: &str = "axpy_kernel.BLOCK=1024.w4.s1.sm90";

fn run_axpy(t: &Path, tensors: &[(&str, &str, &[usize], Vec<u8>)], extra: &[&str]) -> String {
    let input = t.join("in.safetensors");
    safetensors(&input, tensors);
    let pc = fixtures().join("ptx_cache");
    let mut args = vec![
        "launch",
        AXPY,
        "--ptx-cache",
        pc.to_str().unwrap(),
        "--grid",
        "1",
        "--inputs",
        input.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (code, out, err) = tritonrt(&args);
    assert_eq!(code, 2, "{out}{err}");
    err
}

fn f32s(n: usize) -> Vec<u8> {
    vec![0u8; 4 * n]
}

#[test]
fn launch_refusals_name_kernel_argument_and_expectation() {
    let t = tempfile::tempdir().unwrap();
    let t = t.path();
    let xyz = |ydt: &'static str| -> Vec<(&'static str, &'static str, &'static [usize], Vec<u8>)> {
        vec![
            ("x_ptr", "F32", &[16], f32s(16)),
            (
                "y_ptr",
                ydt,
                &[16],
                if ydt == "F64" { f32s(32) } else { f32s(16) },
            ),
            ("out_ptr", "F32", &[16], f32s(16)),
        ]
    };
    // Missing tensor.
    let e = run_axpy(t, &xyz("F32")[..2], &["--arg", "a=1", "--arg", "n=16"]);
    assert!(
        e.contains(AXPY)
            && e.contains("argument 2 (out_ptr: *fp32)")
            && e.contains("no tensor named out_ptr"),
        "{e}"
    );
    // Wrong dtype.
    let e = run_axpy(t, &xyz("F64"), &["--arg", "a=1", "--arg", "n=16"]);
    assert!(
        e.contains("argument 1 (y_ptr: *fp32)")
            && e.contains("the tensor is fp64 [16]; expected fp32 elements (F32"),
        "{e}"
    );
    // Wrong scalar type.
    let e = run_axpy(t, &xyz("F32"), &["--arg", "a=1", "--arg", "n=1.5"]);
    assert!(
        e.contains("argument 4 (n: i32)") && e.contains("\"1.5\" is not an integer (i32 expected)"),
        "{e}"
    );
    let e = run_axpy(t, &xyz("F32"), &["--arg", "a=fast", "--arg", "n=16"]);
    assert!(
        e.contains("argument 3 (a: fp32)") && e.contains("fp32 expected"),
        "{e}"
    );
    // An argument too few.
    let e = run_axpy(t, &xyz("F32"), &["--arg", "a=1"]);
    assert!(
        e.contains("argument 4 (n: i32): not given: pass --arg n=VALUE"),
        "{e}"
    );
    // An argument too many (no such argument).
    let e = run_axpy(
        t,
        &xyz("F32"),
        &["--arg", "a=1", "--arg", "n=16", "--arg", "m=3"],
    );
    assert!(
        e.contains("--arg m: the kernel has no argument m (its arguments: x_ptr: *fp32,"),
        "{e}"
    );
    // A tensor where a scalar goes, a scalar given as a tensor of the wrong dtype.
    let e = run_axpy(
        t,
        &xyz("F32"),
        &["--arg", "x_ptr=3", "--arg", "a=1", "--arg", "n=16"],
    );
    assert!(e.contains("argument x_ptr is *fp32, not a scalar"), "{e}");
    let mut v = xyz("F32");
    v.push(("n", "I64", &[], 16i64.to_le_bytes().to_vec()));
    let e = run_axpy(t, &v, &["--arg", "a=1"]);
    assert!(
        e.contains("argument 4 (n: i32)") && e.contains("a scalar input must be one i32 element"),
        "{e}"
    );
    // Outputs that are not tensors, or without --out.
    let e = run_axpy(
        t,
        &xyz("F32"),
        &[
            "--arg",
            "a=1",
            "--arg",
            "n=16",
            "--outputs",
            "n",
            "--out",
            "o.st",
        ],
    );
    assert!(
        e.contains("--outputs n: argument n is a scalar (i32), not a tensor"),
        "{e}"
    );
    let e = run_axpy(
        t,
        &xyz("F32"),
        &["--arg", "a=1", "--arg", "n=16", "--outputs", "out_ptr"],
    );
    assert!(e.contains("--outputs needs --out FILE"), "{e}");
    // An unknown kernel.
    let pc = fixtures().join("ptx_cache");
    let (code, _, e) = tritonrt(&[
        "launch",
        "nope",
        "--ptx-cache",
        pc.to_str().unwrap(),
        "--grid",
        "1",
    ]);
    assert_eq!(code, 2);
    assert!(
        e.contains("no kernel or variant named nope (kernels: axpy_kernel"),
        "{e}"
    );
    // Everything bound: no binding error (without a driver, the next error is its absence).
    let (code, _, e) = {
        let input = t.join("ok.safetensors");
        safetensors(&input, &xyz("F32"));
        tritonrt(&[
            "launch",
            "axpy_kernel",
            "--ptx-cache",
            pc.to_str().unwrap(),
            "--grid",
            "1",
            "--inputs",
            input.to_str().unwrap(),
            "--arg",
            "a=1",
            "--arg",
            "n=16",
        ])
    };
    let gpu = tritonrt::driver::probe_driver().is_ok();
    assert_eq!(code, if gpu { 0 } else { 2 }, "{e}");
    assert!(!e.contains("argument"), "{e}");
}

#[test]
fn launch_binds_tensor_descriptors_and_half_scalars() {
    let t = tempfile::tempdir().unwrap();
    let pc = t.path().join("pc");
    let entry = fixtures().join("triton_cache_args/desc_scale_sm90");
    let (code, out, err) = tritonrt(&[
        "import",
        entry.to_str().unwrap(),
        "--ptx-cache",
        pc.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("in_desc: tensordesc<fp16[64, 64]>"), "{out}");
    assert!(
        out.contains("tensor descriptors in_desc, out_desc: lowered to TMA"),
        "{out}"
    );
    let input = t.path().join("in.safetensors");
    let launch = |tensors: &[(&str, &str, &[usize], Vec<u8>)], extra: &[&str]| {
        safetensors(&input, tensors);
        let mut a = vec![
            "launch",
            "desc_scale",
            "--ptx-cache",
            pc.to_str().unwrap(),
            "--grid",
            "2,2",
            "--inputs",
            input.to_str().unwrap(),
        ];
        a.extend_from_slice(extra);
        tritonrt(&a)
    };
    let h = |n: usize| vec![0u8; 2 * n];
    // a 1-d tensor for a 2-d descriptor
    let (_, _, e) = launch(
        &[("in_desc", "F16", &[16384], h(16384))],
        &["--zeros", "out_desc=fp16:128x128", "--arg", "scale=2"],
    );
    assert!(
        e.contains("argument 0 (in_desc: tensordesc<fp16[64, 64]>)")
            && e.contains("a 2-dimensional tensor is expected"),
        "{e}"
    );
    // a bf16 tensor for an fp16 descriptor
    let (_, _, e) = launch(
        &[("in_desc", "BF16", &[128, 128], h(16384))],
        &["--zeros", "out_desc=fp16:128x128", "--arg", "scale=2"],
    );
    assert!(
        e.contains("the tensor is bf16 [128, 128]; expected fp16 elements"),
        "{e}"
    );
    // the fp16 scalar, from a one-element tensor of another dtype
    let (_, _, e) = launch(
        &[
            ("in_desc", "F16", &[128, 128], h(16384)),
            ("scale", "F32", &[], vec![0, 0, 0, 64]),
        ],
        &["--zeros", "out_desc=fp16:128x128"],
    );
    assert!(
        e.contains("argument 2 (scale: fp16)") && e.contains("one fp16 element"),
        "{e}"
    );
    // all bound (fp16 scalar from a tensor): without a driver, only the driver is missing
    let out = t.path().join("o.safetensors");
    let (code, _, e) = launch(
        &[
            ("in_desc", "F16", &[128, 128], h(16384)),
            ("scale", "F16", &[], vec![0, 64]),
        ],
        &[
            "--zeros",
            "out_desc=fp16:128x128",
            "--outputs",
            "out_desc",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let gpu = tritonrt::driver::probe_driver().is_ok();
    assert_eq!(code, if gpu { 0 } else { 2 }, "{e}");
    assert!(!e.contains("argument"), "{e}");
}
