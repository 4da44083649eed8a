//! Triton cache entries: `tritonrt::artifact::import_triton_cache_entry` (the metadata
//! `<name>.json`, the PTX `.entry` parameter list and header, the TTIR `tt.func`
//! signature, the optional cubin's ELF magic, then the merge into a ptx_cache manifest).
//! Its inner parsers are private to the crate and read files, so each input becomes one
//! entry directory: the input is split at NUL bytes into up to four parts
//! `json \0 ptx \0 ttir \0 cubin`; a missing part is a missing file. The files are named
//! after the JSON's `"name"` when it is a plain file name (else `k`), so that inputs that
//! get past the metadata reach the PTX and TTIR parsers. The import goes into an empty
//! ptx_cache. Errors are fine; a panic, a hang or an absurd allocation is a bug. When
//! the import succeeds, importing the same entry again must change nothing (the
//! documented contract) and the manifest written must parse.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tritonrt::artifact::{import_triton_cache_entry, parse_manifest, MANIFEST_FILE};

struct Dirs {
    root: tempfile::TempDir,
}

impl Dirs {
    fn entry(&self) -> PathBuf {
        self.root.path().join("entry")
    }
    fn cache(&self) -> PathBuf {
        self.root.path().join("ptx_cache")
    }
}

fn dirs() -> &'static Dirs {
    static DIRS: OnceLock<Dirs> = OnceLock::new();
    DIRS.get_or_init(|| Dirs {
        root: tempfile::Builder::new()
            .prefix("tritonrt-fuzz-import")
            .tempdir()
            .expect("a temporary directory"),
    })
}

/// The file stem the importer will look for: the metadata's `name` if it is a plain file
/// name (anything else cannot name a file inside the entry directory).
fn stem(json: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(json)
        .ok()
        .and_then(|v| v.get("name")?.as_str().map(str::to_string))
        .filter(|n| {
            !n.is_empty() && n.len() < 200 && !n.starts_with('.') && !n.contains(['/', '\\', '\0'])
        })
        .unwrap_or_else(|| "k".to_string())
}

fn reset(dir: &PathBuf) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("removing {}: {e}", dir.display()),
    }
    std::fs::create_dir_all(dir).expect("creating a temporary directory");
}

fuzz_target!(|data: &[u8]| {
    let d = dirs();
    let (entry, cache) = (d.entry(), d.cache());
    reset(&entry);
    reset(&cache);
    let mut parts = data.splitn(4, |&b| b == 0);
    let json = parts.next().unwrap_or_default();
    let name = stem(json);
    std::fs::write(entry.join(format!("{name}.json")), json).expect("writing json");
    for ext in ["ptx", "ttir", "cubin"] {
        if let Some(bytes) = parts.next() {
            std::fs::write(entry.join(format!("{name}.{ext}")), bytes).expect("writing part");
        }
    }
    let Ok(first) = import_triton_cache_entry(&entry, &cache) else {
        return;
    };
    assert!(
        first.added,
        "the first import into an empty ptx_cache adds a variant"
    );
    // Only files inside the entry directory can have been read.
    assert_eq!(stem(json), first.variant.kernel);
    let again = import_triton_cache_entry(&entry, &cache).expect("the same entry imports again");
    assert!(
        !again.added,
        "importing the same entry twice changes nothing"
    );
    assert_eq!(again.variant, first.variant);
    let manifest = cache.join(MANIFEST_FILE);
    let bytes = std::fs::read(&manifest).expect("the import wrote a manifest");
    let m = parse_manifest(&manifest, &bytes).expect("the manifest written parses");
    assert_eq!(m.variants.len(), 1);
});
