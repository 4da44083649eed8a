//! Inputs found while fuzzing the parsers (fuzz/, benches/fuzz.sh; NOTES.md "fuzzing the
//! parsers"), each with the behaviour now expected.

use std::fs;
use std::path::{Path, PathBuf};

use tritonrt::artifact::import_triton_cache_entry;
use tritonrt::tune::{DeviceKey, ShapeBucket, TuningTable};

fn fixtures() -> PathBuf {
    std::env::var_os("TRITONRT_TEST_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
}

/// The fuzz target `tuning_table`'s crash, minimized: the bucket `heavy<=04` parses to the
/// same bucket as `heavy<=4`, so the entry was accepted (strictly, too) as consistent,
/// but lookups key on the bucket's canonical string form and never found it. Such an
/// entry is now inconsistent: refused by a strict load, kept but unused by a lenient one.
const NON_CANONICAL_BUCKET: &str = r#"{"schema_version":1,"entries":[{"gpu":"3","arch":0,"driver_version":1,"kernel":"pq_score_kernel_v6","kernel_hash":"5","candidate_checksum":"3","bucket":"b1:pq_score_kernel_v6:b:sm9:rows<=8:n<=1:align1:ds4:K4:heavy<=04","winner":"pq_score_kernel_v6.b","default_variant":"pq_score_kernel_v6.b","timings":[{"id":"pq_score_kernel_v6.b","median_us":5,"min_us":2,"max_us":5,"count":5}]}]}"#;

#[test]
fn tuning_entry_with_a_non_canonical_bucket_is_inconsistent() {
    let path = Path::new("fuzz-crash.json");
    let e = TuningTable::from_json_bytes(NON_CANONICAL_BUCKET.as_bytes(), path, true)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("heavy<=04")
            && e.contains("not in its canonical form")
            && e.contains("heavy<=4"),
        "{e}"
    );
    let lenient =
        TuningTable::from_json_bytes(NON_CANONICAL_BUCKET.as_bytes(), path, false).unwrap();
    assert_eq!(lenient.len(), 1);
    assert!(lenient.entries()[0].problem().is_some());

    // Written canonically, the same entry loads strictly and is found by its key.
    let canonical = NON_CANONICAL_BUCKET.replace("heavy<=04", "heavy<=4");
    let t = TuningTable::from_json_bytes(canonical.as_bytes(), path, true).unwrap();
    let e = &t.entries()[0];
    let bucket: ShapeBucket = e.bucket.parse().unwrap();
    assert_eq!(
        t.winner(
            &DeviceKey::new("3", 0, 1),
            &e.kernel_hash,
            &e.candidate_checksum,
            &bucket
        ),
        Some("pq_score_kernel_v6.b")
    );
    // Other spellings the number parser accepts are refused the same way.
    for (from, to) in [("rows<=8", "rows<=+8"), ("sm9:", "sm09:")] {
        let text = canonical.replace(from, to);
        let e = TuningTable::from_json_bytes(text.as_bytes(), path, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not in its canonical form"), "{to}: {e}");
    }
}

/// Found while writing the fuzz target `triton_import`: the metadata's `name` picks the
/// files read next to it (`<name>.ptx`, `.ttir`, `.cubin`), so a name such as
/// `../outside/evil` made the importer read (and copy into the ptx_cache) a PTX file
/// outside the entry directory. Such names are now refused before any file is read.
#[test]
fn triton_entry_name_with_a_path_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let src = fixtures().join("triton_cache_entry");
    let json = fs::read_to_string(src.join("axpy_kernel.json")).unwrap();
    let ptx = fs::read_to_string(src.join("axpy_kernel.ptx")).unwrap();
    let entry = t.path().join("entry");
    let outside = t.path().join("outside");
    fs::create_dir_all(&entry).unwrap();
    fs::create_dir_all(&outside).unwrap();
    let evil = "../outside/evil";
    // A self-consistent entry whose PTX lies outside the entry directory.
    fs::write(
        entry.join("k.json"),
        json.replace(
            "\"name\": \"axpy_kernel\"",
            &format!("\"name\": \"{evil}\""),
        ),
    )
    .unwrap();
    fs::write(outside.join("evil.ptx"), ptx.replace("axpy_kernel", evil)).unwrap();
    let cache = t.path().join("ptx_cache");
    let e = import_triton_cache_entry(&entry, &cache)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("not a plain file name") && e.contains(evil),
        "{e}"
    );
    assert!(!cache.join("manifest.json").exists());

    for name in ["", "/abs/k", "a\\\\b", ".", ".."] {
        fs::write(
            entry.join("k.json"),
            json.replace(
                "\"name\": \"axpy_kernel\"",
                &format!("\"name\": \"{name}\""),
            ),
        )
        .unwrap();
        let e = import_triton_cache_entry(&entry, &cache)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a plain file name"), "{name:?}: {e}");
    }
}
