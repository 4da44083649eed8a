//! `ptx_cache/manifest.json`: `tritonrt::artifact::parse_manifest` (JSON, schema version,
//! serde shape, then `validate_manifest`). Errors are fine; a panic, a hang or an absurd
//! allocation is a bug. On success the manifest must also pass `validate_manifest` on its
//! own, serialize with `manifest_to_bytes` and parse back (what `import` relies on when it
//! rewrites a manifest), and the per-device helpers must not panic on it.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tritonrt::artifact::{
    is_arch_specific_target, manifest_to_bytes, parse_manifest, partition_for_device,
    validate_manifest,
};

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz/manifest.json");
    let Ok(m) = parse_manifest(path, data) else {
        return;
    };
    validate_manifest(&m).expect("a parsed manifest validates");
    for v in &m.variants {
        let _ = is_arch_specific_target(&v.ptx_target);
        let _ = v.signature_string();
        for cc in [(7, 5), (8, 0), (9, 0), (10, 0)] {
            let _ = v.usable_on(cc);
            let _ = v.cubin_matches(cc);
        }
    }
    for all in [false, true] {
        let _ = partition_for_device(&m.variants, (9, 0), all);
    }
    let bytes = manifest_to_bytes(&m).expect("a parsed manifest serializes");
    let back = parse_manifest(path, &bytes).expect("a serialized manifest parses back");
    assert_eq!(back.variants.len(), m.variants.len());
});
