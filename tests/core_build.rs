//! `tritonrt build FILE.py`: a user's Triton source AOT-compiled into a ptx_cache (no GPU).
//! The compiling tests need a Python with triton==3.6.0: `TRITONRT_PYTHON`, else the
//! checkout's `.venv/bin/python` or `.venv-ci/bin/python` (what `.ci/run` makes); without
//! one they are skipped (saying so). The refusals before Python runs are always tested.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use tritonrt::artifact::ArtifactStore;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn tritonrt(args: &[&str], python: Option<&Path>) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tritonrt"));
    c.args(args);
    if let Some(p) = python {
        c.env("TRITONRT_PYTHON", p);
    }
    let o = c.output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A Python that imports triton 3.6.0, if any: `TRITONRT_PYTHON`, else the checkout's
/// `.venv` or CI's `.venv-ci`.
fn python() -> Option<PathBuf> {
    let candidates = match std::env::var_os("TRITONRT_PYTHON") {
        Some(p) => vec![PathBuf::from(p)],
        None => vec![
            root().join(".venv/bin/python"),
            root().join(".venv-ci/bin/python"),
        ],
    };
    candidates.into_iter().find(|p| {
        Command::new(p)
            .args(["-c", "import triton; assert triton.__version__ == '3.6.0'"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

const SCALARS_SIG: &str = "*fp16:16, *fp16:16, fp16, bf16, i32, i1, fp64, i8, i16, i64, u32, 1024";

#[test]
fn build_refuses_before_compiling() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("pc");
    let out = out.to_str().unwrap();
    let (code, _, e) = tritonrt(&["build", "/nonexistent.py", "--out", out], None);
    assert_eq!(code, 2);
    assert!(e.contains("/nonexistent.py is not a file"), "{e}");
    let file = root().join("tests/fixtures/arg_kernels.py");
    let (code, _, e) = tritonrt(&["build", file.to_str().unwrap(), "--out", out], None);
    assert_eq!(code, 2);
    assert!(
        e.contains("--spec SPEC.json, or --kernel NAME and --signature SIG"),
        "{e}"
    );
    let (code, _, e) = tritonrt(
        &[
            "build",
            file.to_str().unwrap(),
            "--out",
            out,
            "--kernel",
            "scalars",
            "--signature",
            SCALARS_SIG,
            "--python",
            "/nonexistent/python3",
        ],
        None,
    );
    assert_eq!(code, 2);
    assert!(
        e.contains("running /nonexistent/python3 (the Python with triton==3.6.0"),
        "{e}"
    );
}

#[test]
fn build_a_user_file_deterministically() {
    let Some(py) = python() else {
        skip!("no Python with triton==3.6.0 (set TRITONRT_PYTHON)");
        return;
    };
    let t = tempfile::tempdir().unwrap();
    // The same file at two paths: the output must not depend on where it lives.
    let mut outs = Vec::new();
    for d in ["a", "b"] {
        let dir = t.path().join(d);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("kernels.py");
        std::fs::copy(root().join("tests/fixtures/arg_kernels.py"), &file).unwrap();
        let spec = dir.join("spec.json");
        std::fs::write(
            &spec,
            r#"{"kernels": [
              {"kernel": "desc_scale", "signature": "tensordesc<fp16[64, 64]>, tensordesc<fp16[64,64]>, fp16, 64, 64"},
              {"kernel": "scalars", "name": "scalars16", "signature": ["*fp16:16", "*fp16:16", "fp16", "bf16", "i32", "i1", "fp64", "i8", "i16", "i64", "u32", 1024], "num_warps": 8, "archs": [90]}
            ]}"#,
        )
        .unwrap();
        let out = dir.join("pc");
        let (code, stdout, e) = tritonrt(
            &[
                "build",
                file.to_str().unwrap(),
                "--spec",
                spec.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ],
            Some(&py),
        );
        assert_eq!(code, 0, "{stdout}{e}");
        assert!(
            stdout.contains("desc_scale.M_BLOCK=64.N_BLOCK=64.w4.s3.sm90 (default): in_desc: tensordesc<fp16[64, 64]>, out_desc: tensordesc<fp16[64, 64]>, scale: fp16"),
            "{stdout}"
        );
        outs.push(out);
    }
    let files = |d: &Path| {
        let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(files(&outs[0]), files(&outs[1]), "two builds differ");
    let s = ArtifactStore::open(&outs[0]).unwrap();
    assert_eq!(s.all_variants().len(), 3);
    let d90 = s
        .variant("desc_scale.M_BLOCK=64.N_BLOCK=64.w4.s3.sm90")
        .unwrap();
    assert_eq!(d90.tensordesc_meta.len(), 2);
    assert!(d90.cubin.is_some());
    let d80 = s
        .variant("desc_scale.M_BLOCK=64.N_BLOCK=64.w4.s3.sm80")
        .unwrap();
    assert!(d80.tensordesc_meta.is_empty() && d80.cubin.is_none());
    let sc = s.variant("scalars16.BLOCK=1024.w8.s3.sm90").unwrap();
    assert_eq!(
        sc.signature_string(),
        "x_ptr: *fp16, y_ptr: *fp16, a: fp16, b: bf16, n: i32, flag: i1, c64: fp64, i8v: i8, i16v: i16, i64v: i64, u32v: u32"
    );
    assert_eq!(sc.signature[0].divisibility, 16);
    assert_eq!(sc.num_warps, 8);

    // Flags, with an integer specialized to 1 (`:1`), and a refusal.
    let file = root().join("tests/fixtures/arg_kernels.py");
    let out = t.path().join("flags");
    let (code, stdout, e) = tritonrt(
        &[
            "build",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--kernel",
            "scalars",
            "--signature",
            "*fp16:16, *fp16:16, fp16, bf16, i32:1, i1, fp64, i8, i16, i64, u32, 1024",
            "--arch",
            "80",
        ],
        Some(&py),
    );
    assert_eq!(code, 0, "{stdout}{e}");
    let s = ArtifactStore::open(&out).unwrap();
    let v = &s.all_variants()[0];
    assert_eq!(v.id, "scalars.BLOCK=1024.n=1.w4.s3.sm80");
    assert!(!v.signature.iter().any(|a| a.name == "n"));
    // A None argument: a constexpr, gone from the launch signature, recorded as null.
    let none_out = t.path().join("none");
    let (code, stdout, e) = tritonrt(
        &[
            "build",
            file.to_str().unwrap(),
            "--out",
            none_out.to_str().unwrap(),
            "--kernel",
            "opt_bias",
            "--signature",
            "*fp32:16, None, *fp32:16, i32, 256",
            "--arch",
            "90",
        ],
        Some(&py),
    );
    assert_eq!(code, 0, "{stdout}{e}");
    let s = ArtifactStore::open(&none_out).unwrap();
    let v = &s.all_variants()[0];
    assert_eq!(v.id, "opt_bias.BLOCK=256.bias_ptr=None.w4.s3.sm90");
    assert_eq!(v.signature_string(), "x_ptr: *fp32, out_ptr: *fp32, n: i32");
    assert_eq!(v.constexprs["bias_ptr"], serde_json::Value::Null);
    let (code, _, e) = tritonrt(
        &[
            "build",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--kernel",
            "scalars",
            "--signature",
            "*fp16:16, *fp16:8, fp16, bf16, i32, i1, fp64, i8, i16, i64, u32, 1024",
        ],
        Some(&py),
    );
    assert_eq!(code, 2);
    assert!(
        e.contains("parameter y_ptr: hint :8 (only :16 and :1 exist)"),
        "{e}"
    );
}

/// The example's committed ptx_cache is what `tritonrt build` makes of its source and spec.
#[test]
fn the_example_ptx_cache_is_up_to_date() {
    let Some(py) = python() else {
        skip!("no Python with triton==3.6.0 (set TRITONRT_PYTHON)");
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let ex = root().join("examples/own_kernel");
    let out = t.path().join("pc");
    let (code, stdout, e) = tritonrt(
        &[
            "build",
            ex.join("kernels.py").to_str().unwrap(),
            "--spec",
            ex.join("spec.json").to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        Some(&py),
    );
    assert_eq!(code, 0, "{stdout}{e}");
    let names = |d: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let committed = ex.join("ptx_cache");
    assert_eq!(
        names(&out),
        names(&committed),
        "examples/own_kernel/ptx_cache is stale"
    );
    for n in names(&out) {
        assert!(
            std::fs::read(out.join(&n)).unwrap() == std::fs::read(committed.join(&n)).unwrap(),
            "examples/own_kernel/ptx_cache/{n} is stale: rebuild it (examples/own_kernel/kernels.py)"
        );
    }
}
