//! The `tritonrt` binary's core subcommands end to end: verify, inspect, import, warmup
//! (without a driver), `--help`, exit codes.

#[macro_use]
mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    std::env::var_os("TRITONRT_TEST_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
}

fn tritonrt(args: &[&str], envs: &[(&str, &Path)]) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tritonrt"));
    c.args(args).env_remove("TRITONRT_PTX_CACHE");
    for (k, v) in envs {
        c.env(k, v);
    }
    let Output {
        status,
        stdout,
        stderr,
    } = c.output().unwrap();
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

fn store_copy(t: &Path) -> PathBuf {
    let d = t.join("ptx_cache");
    fs::create_dir_all(&d).unwrap();
    for e in fs::read_dir(fixtures().join("ptx_cache")).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), d.join(e.file_name())).unwrap();
    }
    d
}

#[test]
fn verify_good_and_bad() {
    let good = fixtures().join("ptx_cache");
    let (code, out, _) = tritonrt(&["verify", "--ptx-cache", good.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("OK: 2 variants, all 3 files"), "{out}");

    let t = tempfile::tempdir().unwrap();
    let d = store_copy(t.path());
    let m: serde_json::Value =
        serde_json::from_slice(&fs::read(d.join("manifest.json")).unwrap()).unwrap();
    let cubin = m["variants"][0]["cubin"]["file"]
        .as_str()
        .unwrap()
        .to_string();
    let ptx80 = m["variants"][1]["ptx"]["file"]
        .as_str()
        .unwrap()
        .to_string();
    let mut b = fs::read(d.join(&cubin)).unwrap();
    b[200] ^= 0xff;
    fs::write(d.join(&cubin), b).unwrap();
    fs::remove_file(d.join(&ptx80)).unwrap();
    let (code, out, _) = tritonrt(&["verify"], &[("TRITONRT_PTX_CACHE", &d)]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("BAD {}", d.join(&cubin).display())),
        "{out}"
    );
    assert!(
        out.contains(&format!("BAD {}", d.join(&ptx80).display())),
        "{out}"
    );
    assert!(out.contains("2 of 3 files bad"), "{out}");

    fs::write(d.join("manifest.json"), "{ not json").unwrap();
    let (code, out, _) = tritonrt(&["verify", "--ptx-cache", d.to_str().unwrap()], &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("manifest.json"), "{out}");
}

#[test]
fn inspect_lists_variants_and_signature() {
    let (code, out, err) = tritonrt(
        &["inspect"],
        &[("TRITONRT_PTX_CACHE", &fixtures().join("ptx_cache"))],
    );
    assert_eq!(code, 0, "{err}");
    for want in [
        "axpy_kernel.BLOCK=1024.w4.s1.sm90",
        "axpy_kernel.BLOCK=1024.w4.s1.sm80",
        "sm_90a",
        "kernel axpy_kernel (entry axpy_kernel): x_ptr: *fp32 (div 16), y_ptr: *fp32 (div 16), out_ptr: *fp32 (div 16), a: fp32, n: i32",
    ] {
        assert!(out.contains(want), "{want:?} not in\n{out}");
    }
}

#[test]
fn import_then_verify() {
    let t = tempfile::tempdir().unwrap();
    let out_dir = t.path().join("pc");
    let entry = fixtures().join("triton_cache_entry");
    let (code, out, err) = tritonrt(
        &[
            "import",
            entry.to_str().unwrap(),
            "--ptx-cache",
            out_dir.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("imported axpy_kernel.triton-"), "{out}");
    assert!(
        out.contains("signature: x_ptr: *fp32, y_ptr: *fp32, out_ptr: *fp32, a: fp32, n: i32"),
        "{out}"
    );
    let (code, out, _) = tritonrt(&["verify", "--ptx-cache", out_dir.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{out}");
    // A directory that is not a Triton cache entry: error exit 2, named.
    let (code, _, err) = tritonrt(
        &[
            "import",
            t.path().to_str().unwrap(),
            "--ptx-cache",
            out_dir.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 2);
    assert!(err.starts_with("error: Triton cache entry"), "{err}");
}

#[test]
fn warmup_without_driver_is_a_clear_error() {
    if tritonrt::driver::probe_driver().is_ok() {
        skip!("a CUDA driver is present; warmup would really run");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (code, _, err) = tritonrt(
        &[
            "warmup",
            "--ptx-cache",
            fixtures().join("ptx_cache").to_str().unwrap(),
        ],
        &[("TRITONRT_CACHE_DIR", t.path())],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.starts_with("error: no CUDA driver found (libcuda.so.1): "),
        "{err}"
    );
}

#[test]
fn every_subcommand_has_help() {
    for (sub, flag) in [
        ("inspect", "--ptx-cache"),
        ("verify", "--ptx-cache"),
        ("warmup", "--device"),
        ("import", "<DIR>"),
        ("launch", "--grid"),
        ("bindgen", "--out"),
    ] {
        let (code, out, _) = tritonrt(&[sub, "--help"], &[]);
        assert_eq!(code, 0, "{sub}");
        assert!(
            out.contains(flag) && out.contains("TRITONRT_PTX_CACHE"),
            "{sub}: {out}"
        );
    }
    let (code, out, _) = tritonrt(&["build", "--help"], &[]);
    assert_eq!(code, 0);
    assert!(
        out.contains("--signature")
            && out.contains("TRITONRT_PYTHON")
            && out.contains("tools/compile.py"),
        "{out}"
    );
}

#[test]
fn bindgen_prints_typed_launchers() {
    let (code, out, err) = tritonrt(
        &[
            "bindgen",
            "--ptx-cache",
            fixtures().join("ptx_cache").to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("pub fn axpy_kernel("), "{out}");
    assert!(out.contains("n: i32,"), "{out}");
}
