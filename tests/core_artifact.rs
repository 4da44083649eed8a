//! Artifact store: manifest parsing and validation, integrity checks (flipped byte,
//! truncation, missing file), lookups, and import of a real Triton cache entry.

use std::fs;
use std::path::{Path, PathBuf};

use tritonrt::artifact::{
    import_triton_cache_entry, manifest_to_bytes, parse_manifest, partition_for_device, ptx_header,
    sha256_hex, ArgType, ArtifactStore, Dtype, Manifest, PtxVersion, SignatureSource,
};
use tritonrt::Error;

const SM90: &str = "axpy_kernel.BLOCK=1024.w4.s1.sm90";
const SM80: &str = "axpy_kernel.BLOCK=1024.w4.s1.sm80";

fn fixtures() -> PathBuf {
    std::env::var_os("TRITONRT_TEST_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// A private, writable copy of the fixture ptx_cache.
fn store_copy() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("ptx_cache");
    copy_dir(&fixtures().join("ptx_cache"), &d);
    (t, d)
}

fn manifest_json(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&fs::read(dir.join("manifest.json")).unwrap()).unwrap()
}

fn write_manifest_json(dir: &Path, v: &serde_json::Value) {
    fs::write(
        dir.join("manifest.json"),
        serde_json::to_vec_pretty(v).unwrap(),
    )
    .unwrap();
}

#[test]
fn parses_the_fixture_manifest() {
    let s = ArtifactStore::open(fixtures().join("ptx_cache")).unwrap();
    let m = s.manifest();
    assert_eq!(m.schema_version, 1);
    assert_eq!(m.triton_version, "3.6.0");
    assert_eq!(m.variants.len(), 2);
    let v90 = s.variant(SM90).unwrap();
    assert_eq!(v90.kernel, "axpy_kernel");
    assert_eq!(v90.entry, "axpy_kernel");
    assert_eq!(v90.arch, 90);
    assert_eq!(v90.ptx_target, "sm_90a");
    assert_eq!(v90.num_warps, 4);
    assert_eq!(v90.num_ctas, 1);
    assert!(v90.default);
    assert!(v90.cubin.is_some());
    assert_eq!(v90.constexprs["BLOCK"], 1024);
    let sig: Vec<(&str, String, u32)> = v90
        .signature
        .iter()
        .map(|a| (a.name.as_str(), a.ty.to_string(), a.divisibility))
        .collect();
    assert_eq!(
        sig,
        vec![
            ("x_ptr", "*fp32".to_string(), 16),
            ("y_ptr", "*fp32".to_string(), 16),
            ("out_ptr", "*fp32".to_string(), 16),
            ("a", "fp32".to_string(), 1),
            ("n", "i32".to_string(), 1),
        ]
    );
    let v80 = s.variant(SM80).unwrap();
    assert_eq!(v80.ptx_target, "sm_80");
    assert!(v80.cubin.is_none(), "arch 80 variants carry PTX only");
    // The recorded PTX version is the file's own.
    let ptx = s.read_ptx(v90).unwrap();
    let h = ptx_header(&ptx).unwrap();
    assert_eq!(h.version.to_string(), v90.ptx_version);
    assert_eq!(h.target, "sm_90a");
    assert!(s.verify_all().is_empty());
    assert_eq!(s.files().len(), 3);
}

#[test]
fn manifest_rewrite_is_byte_identical_to_build_output() {
    // build.py writes sorted keys, indent 2, trailing newline; so do we.
    let path = fixtures().join("ptx_cache/manifest.json");
    let bytes = fs::read(&path).unwrap();
    let m: Manifest = parse_manifest(&path, &bytes).unwrap();
    assert_eq!(
        String::from_utf8(manifest_to_bytes(&m).unwrap()).unwrap(),
        String::from_utf8(bytes).unwrap()
    );
}

#[test]
fn flipped_byte_is_refused_naming_file_and_hashes() {
    let (_t, dir) = store_copy();
    let s = ArtifactStore::open(&dir).unwrap();
    let v = s.variant(SM90).unwrap().clone();
    let cubin_ref = v.cubin.clone().unwrap();
    let path = dir.join(&cubin_ref.file);
    let mut b = fs::read(&path).unwrap();
    let i = b.len() / 2;
    b[i] ^= 0x01;
    let actual = sha256_hex(&b);
    fs::write(&path, &b).unwrap();

    let err = s.read_cubin(&v).unwrap_err();
    match &err {
        Error::ArtifactCorrupt {
            file,
            expected_size,
            actual_size,
            expected_sha256,
            actual_sha256,
        } => {
            assert_eq!(file, &path);
            assert_eq!(expected_size, actual_size);
            assert_eq!(expected_sha256, &cubin_ref.sha256);
            assert_eq!(actual_sha256, &actual);
        }
        e => panic!("expected ArtifactCorrupt, got {e:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains(&cubin_ref.file), "{msg}");
    assert!(msg.contains(&cubin_ref.sha256), "{msg}");
    assert!(msg.contains(&actual), "{msg}");
    // The PTX of the same variant is still fine; verify_all names only the bad file.
    assert!(s.read_ptx(&v).is_ok());
    let bad = s.verify_all();
    assert_eq!(bad.len(), 1);
    assert_eq!(bad[0].0, path);
}

#[test]
fn truncated_file_is_refused_with_sizes_and_hashes() {
    let (_t, dir) = store_copy();
    let s = ArtifactStore::open(&dir).unwrap();
    let v = s.variant(SM80).unwrap().clone();
    let path = dir.join(&v.ptx.file);
    let b = fs::read(&path).unwrap();
    let cut = &b[..b.len() - 100];
    fs::write(&path, cut).unwrap();
    let msg = s.read_ptx(&v).unwrap_err().to_string();
    assert!(msg.contains(&v.ptx.file), "{msg}");
    assert!(
        msg.contains(&format!("expected {} bytes", b.len())),
        "{msg}"
    );
    assert!(msg.contains(&format!("found {} bytes", cut.len())), "{msg}");
    assert!(msg.contains(&v.ptx.sha256), "{msg}");
    assert!(msg.contains(&sha256_hex(cut)), "{msg}");
}

#[test]
fn missing_file_is_refused_naming_it() {
    let (_t, dir) = store_copy();
    let s = ArtifactStore::open(&dir).unwrap();
    let v = s.variant(SM90).unwrap().clone();
    fs::remove_file(dir.join(&v.ptx.file)).unwrap();
    let err = s.read_ptx(&v).unwrap_err();
    assert!(matches!(err, Error::ArtifactMissing { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&v.ptx.file) && msg.contains("missing"),
        "{msg}"
    );
    assert!(msg.contains(&v.ptx.sha256), "{msg}");
    let bad = s.verify_all();
    assert_eq!(bad.len(), 1, "{bad:?}");
}

#[test]
fn manifest_rules_are_enforced() {
    let (_t, dir) = store_copy();
    let orig = manifest_json(&dir);
    let check = |edit: &dyn Fn(&mut serde_json::Value), want: &str| {
        let mut v = orig.clone();
        edit(&mut v);
        write_manifest_json(&dir, &v);
        let err = ArtifactStore::open(&dir).unwrap_err().to_string();
        assert!(err.contains(want), "expected {want:?} in: {err}");
    };
    check(
        &|m| m["schema_version"] = 2.into(),
        "schema_version 2 is not supported (expected 1)",
    );
    check(
        &|m| m["variants"][1]["id"] = SM90.into(),
        &format!("duplicate variant id \"{SM90}\""),
    );
    check(
        &|m| m["variants"][0]["default"] = false.into(),
        "arch 90: no default variant",
    );
    check(
        &|m| {
            let mut extra = m["variants"][0].clone();
            extra["id"] = "axpy_kernel.other.sm90".into();
            m["variants"].as_array_mut().unwrap().push(extra);
        },
        "arch 90: 2 default variants",
    );
    check(
        &|m| m["variants"][0]["signature"][0]["type"] = "*fp33".into(),
        "unknown pointer element type \"*fp33\"",
    );
    check(
        &|m| m["variants"][0]["ptx"]["file"] = "../../etc/passwd".into(),
        "is not a plain file name",
    );
    check(
        &|m| m["variants"][1]["signature"][4]["type"] = "i64".into(),
        "have different signatures",
    );
    check(
        &|m| m["variants"][0]["num_warps"] = 0.into(),
        "num_warps 0 outside 1..=32",
    );
    check(&|m| m["variants"][0]["arch"] = "x".into(), "manifest");
    // The original is accepted again.
    write_manifest_json(&dir, &orig);
    ArtifactStore::open(&dir).unwrap();
}

#[test]
fn lookups_and_device_selection() {
    let s = ArtifactStore::open(fixtures().join("ptx_cache")).unwrap();
    assert_eq!(s.variants("axpy_kernel").len(), 2);
    assert!(s.variants("nope").is_empty());
    assert_eq!(s.default_for("axpy_kernel", 90).unwrap().id, SM90);
    assert_eq!(s.default_for("axpy_kernel", 80).unwrap().id, SM80);
    assert!(s.default_for("axpy_kernel", 75).is_none());
    // sm_90a only on exactly 9.0; the sm_80 PTX everywhere >= 8.0.
    assert_eq!(s.select_for_device("axpy_kernel", (9, 0)).unwrap().id, SM90);
    for cc in [(8, 0), (8, 6), (8, 9), (10, 0), (12, 0)] {
        assert_eq!(
            s.select_for_device("axpy_kernel", cc).unwrap().id,
            SM80,
            "{cc:?}"
        );
    }
    let e = s
        .select_for_device("axpy_kernel", (7, 5))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("7.5") && e.contains(SM80) && e.contains("sm_90a"),
        "{e}"
    );
    let e = s.variant("axpy_kernel.bogus").unwrap_err().to_string();
    assert!(e.contains("axpy_kernel.bogus") && e.contains(SM90), "{e}");
    assert!(s.variant(SM90).unwrap().cubin_matches((9, 0)));
    assert!(!s.variant(SM90).unwrap().cubin_matches((10, 0)));
}

/// What `tritonrt warmup` loads: on 9.0 only the sm_90a variant (the sm_80 PTX is never
/// chosen there), unless `all`; elsewhere the sm_80 PTX; nothing on 7.5.
#[test]
fn warmup_loads_only_what_the_runtime_can_choose() {
    let s = ArtifactStore::open(fixtures().join("ptx_cache")).unwrap();
    let ids = |v: Vec<&tritonrt::artifact::Variant>| -> Vec<String> {
        let mut ids: Vec<String> = v.iter().map(|v| v.id.clone()).collect();
        ids.sort();
        ids
    };
    let (load, skip) = partition_for_device(s.all_variants(), (9, 0), false);
    assert_eq!(ids(load), vec![SM90.to_string()]);
    assert_eq!(ids(skip), vec![SM80.to_string()]);
    let (load, skip) = partition_for_device(s.all_variants(), (9, 0), true);
    assert_eq!(ids(load), vec![SM80.to_string(), SM90.to_string()]);
    assert!(skip.is_empty());
    for cc in [(8, 0), (8, 9), (10, 0)] {
        let (load, skip) = partition_for_device(s.all_variants(), cc, false);
        assert_eq!(ids(load), vec![SM80.to_string()], "{cc:?}");
        assert_eq!(ids(skip), vec![SM90.to_string()], "{cc:?}");
    }
    let (load, skip) = partition_for_device(s.all_variants(), (7, 5), true);
    assert!(load.is_empty());
    assert_eq!(skip.len(), 2);
}

#[test]
fn arg_types_round_trip_and_reject_unknown() {
    for s in [
        "*fp32", "*fp16", "*bf16", "*fp64", "*i8", "*u8", "*i16", "*i32", "*i64", "*u32", "*u64",
        "*fp8e4nv", "*", "i1", "i8", "i16", "i32", "i64", "u32", "u64", "fp16", "bf16", "fp32",
        "fp64",
    ] {
        let t = ArgType::parse(s).unwrap();
        assert_eq!(t.to_string(), s);
    }
    assert_eq!(
        ArgType::parse("*fp32").unwrap(),
        ArgType::Ptr(Some(Dtype::Fp32))
    );
    assert_eq!(ArgType::parse("i64").unwrap().param_bytes(), 8);
    assert_eq!(ArgType::parse("fp16").unwrap().param_bytes(), 2);
    for bad in ["float", "*float", "fp8e5", "", "i128"] {
        assert!(ArgType::parse(bad).is_err(), "{bad}");
    }
    assert_eq!(
        PtxVersion::parse("8.7").unwrap(),
        PtxVersion { major: 8, minor: 7 }
    );
    assert!(PtxVersion::parse("9.0").unwrap() > PtxVersion::parse("8.8").unwrap());
    assert!(PtxVersion::parse("8").is_none());
}

fn entry_copy(t: &Path, drop_ext: &[&str]) -> PathBuf {
    let d = t.join("entry");
    copy_dir(&fixtures().join("triton_cache_entry"), &d);
    for e in fs::read_dir(&d).unwrap() {
        let p = e.unwrap().path();
        let ext = p.extension().unwrap().to_str().unwrap().to_string();
        if drop_ext.contains(&ext.as_str()) {
            fs::remove_file(p).unwrap();
        }
    }
    d
}

#[test]
fn imports_a_real_triton_cache_entry() {
    let t = tempfile::tempdir().unwrap();
    let entry = entry_copy(t.path(), &[]);
    let out = t.path().join("new_cache");
    let r = import_triton_cache_entry(&entry, &out).unwrap();
    assert!(r.added);
    assert_eq!(r.signature_source, SignatureSource::Ttir);
    let v = &r.variant;
    assert!(v.id.starts_with("axpy_kernel.triton-"), "{}", v.id);
    assert!(v.id.ends_with(".w4.s1.sm90"), "{}", v.id);
    assert_eq!(v.arch, 90);
    assert_eq!(v.ptx_target, "sm_90a");
    assert!(v.default, "first of its (kernel, arch) becomes the default");
    // The signature read from Triton's own files equals the one the build declared.
    let fixture = ArtifactStore::open(fixtures().join("ptx_cache")).unwrap();
    let declared = fixture.variant(SM90).unwrap();
    assert_eq!(v.signature, declared.signature);
    assert_eq!(v.ptx.sha256, declared.ptx.sha256, "same compile, same PTX");
    assert_eq!(
        v.cubin.as_ref().unwrap().sha256,
        declared.cubin.as_ref().unwrap().sha256
    );
    // The result is a valid, verified store.
    let s = ArtifactStore::open(&out).unwrap();
    assert!(s.verify_all().is_empty());
    assert_eq!(s.select_for_device("axpy_kernel", (9, 0)).unwrap().id, v.id);
    // Importing again changes nothing, byte for byte.
    let before = fs::read(out.join("manifest.json")).unwrap();
    let r2 = import_triton_cache_entry(&entry, &out).unwrap();
    assert!(!r2.added);
    assert_eq!(fs::read(out.join("manifest.json")).unwrap(), before);
}

#[test]
fn import_without_ttir_reads_the_ptx_entry() {
    let t = tempfile::tempdir().unwrap();
    let entry = entry_copy(t.path(), &["ttir", "source"]);
    let out = t.path().join("c");
    let r = import_triton_cache_entry(&entry, &out).unwrap();
    assert_eq!(r.signature_source, SignatureSource::Ptx);
    let sig: Vec<(String, String, u32)> = r
        .variant
        .signature
        .iter()
        .map(|a| (a.name.clone(), a.ty.to_string(), a.divisibility))
        .collect();
    let want: Vec<(String, String, u32)> = [
        ("arg0", "*", 16),
        ("arg1", "*", 16),
        ("arg2", "*", 16),
        ("arg3", "fp32", 1),
        ("arg4", "i32", 1),
    ]
    .iter()
    .map(|(a, b, c)| (a.to_string(), b.to_string(), *c))
    .collect();
    assert_eq!(sig, want);
    ArtifactStore::open(&out).unwrap();
}

#[test]
fn import_merges_into_an_existing_store() {
    let (t, dir) = store_copy();
    let entry = entry_copy(t.path(), &[]);
    let r = import_triton_cache_entry(&entry, &dir).unwrap();
    assert!(r.added);
    assert!(
        !r.variant.default,
        "the build's default of (axpy_kernel, 90) stays"
    );
    let s = ArtifactStore::open(&dir).unwrap();
    assert_eq!(s.all_variants().len(), 3);
    assert_eq!(s.default_for("axpy_kernel", 90).unwrap().id, SM90);
    assert!(s.verify_all().is_empty());
}

#[test]
fn import_refuses_bad_entries() {
    let t = tempfile::tempdir().unwrap();
    // No metadata at all.
    let empty = t.path().join("empty");
    fs::create_dir_all(&empty).unwrap();
    let e = import_triton_cache_entry(&empty, &t.path().join("c"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no <name>.json"), "{e}");
    // PTX missing.
    let entry = entry_copy(t.path(), &["ptx"]);
    let e = import_triton_cache_entry(&entry, &t.path().join("c"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("axpy_kernel.ptx"), "{e}");
    // TTIR that disagrees with the PTX (an argument too many; import reads the
    // frontend's `.source` first, then `.ttir`).
    let entry2 = t.path().join("entry2");
    copy_dir(&fixtures().join("triton_cache_entry"), &entry2);
    for ext in ["source", "ttir"] {
        let ttir = entry2.join(format!("axpy_kernel.{ext}"));
        let text = fs::read_to_string(&ttir).unwrap();
        fs::write(&ttir, text.replacen("%n: i32", "%n: i32, %m: i32", 1)).unwrap();
    }
    let e = import_triton_cache_entry(&entry2, &t.path().join("c2"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("disagree") && e.contains("6 arguments"), "{e}");
    // A store of another Triton version.
    let (_t2, dir) = store_copy();
    let mut m = manifest_json(&dir);
    m["triton_version"] = "3.5.0".into();
    write_manifest_json(&dir, &m);
    let fresh = entry_copy(&t.path().join("x"), &[]);
    let e = import_triton_cache_entry(&fresh, &dir)
        .unwrap_err()
        .to_string();
    assert!(e.contains("Triton 3.6.0") && e.contains("3.5.0"), "{e}");
}
