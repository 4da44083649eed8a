//! The tuning table (`tuning.json`): `tritonrt::tune::TuningTable::from_json_bytes`, both
//! strict (import) and lenient (what the runtime reads at setup). Errors are fine; a
//! panic, a hang or an absurd allocation is a bug. Invariants checked: strict success
//! implies lenient success; a parsed table serializes (`to_json_string`) and parses back
//! with the same number of entries, strictly when it parsed strictly; every entry's
//! consistency check and lookup helpers run without panicking.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tritonrt::tune::{DeviceKey, ShapeBucket, TuningTable};

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz/tuning.json");
    let strict = TuningTable::from_json_bytes(data, path, true);
    let lenient = TuningTable::from_json_bytes(data, path, false);
    if strict.is_ok() {
        assert!(lenient.is_ok(), "strict parse succeeded, lenient failed");
    }
    let Ok(table) = lenient else {
        return;
    };
    for e in table.entries() {
        let problem = e.problem();
        let _ = e.speedup();
        let _ = e.device();
        if let Ok(bucket) = e.bucket.parse::<ShapeBucket>() {
            // The string form must parse back to the same bucket.
            let again: ShapeBucket = bucket
                .to_string()
                .parse()
                .expect("a bucket's Display form parses back");
            assert_eq!(again, bucket);
            let found = table.winner(&e.device(), &e.kernel_hash, &e.candidate_checksum, &bucket);
            if problem.is_none() {
                assert!(found.is_some(), "a consistent entry is found by its key");
            }
        }
    }
    let _ = table.winner(
        &DeviceKey::new("NVIDIA H100 80GB HBM3", 90, 12080),
        "x",
        "y",
        &"b1:k:fp32:sm90:rows<=32:n<=32768:align1:ds64:K64:heavy<=128"
            .parse()
            .expect("a valid bucket"),
    );
    let text = table.to_json_string();
    let back = TuningTable::from_json_bytes(text.as_bytes(), path, strict.is_ok())
        .expect("a serialized table parses back");
    assert_eq!(back.len(), table.len());
});
