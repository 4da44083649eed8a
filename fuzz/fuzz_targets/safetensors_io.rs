//! Safetensors step files: `tritonrt::pq::io::read_inputs` (what `tritonrt run --input`
//! reads) and `read_outputs` (what `--output` writes and the checks read back). Both take
//! a path, so each input is written to one temporary file (in `$TMPDIR`; benches/fuzz.sh
//! points it at /dev/shm) and both readers run on it. Errors are fine; a panic, a hang or
//! an allocation from a shape or size field is a bug. When `read_inputs` succeeds, the
//! inputs must write back (`write_inputs`) and read back to the same config and values.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tritonrt::pq::io::{read_inputs, read_outputs, write_inputs};
use tritonrt::pq::PqConfigOverrides;

struct Files {
    _dir: tempfile::TempDir,
    input: PathBuf,
    rewritten: PathBuf,
}

fn files() -> &'static Files {
    static FILES: OnceLock<Files> = OnceLock::new();
    FILES.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("tritonrt-fuzz-st")
            .tempdir()
            .expect("a temporary directory");
        Files {
            input: dir.path().join("in.safetensors"),
            rewritten: dir.path().join("rewritten.safetensors"),
            _dir: dir,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = files();
    std::fs::write(&f.input, data).expect("writing the temporary input file");
    let _ = read_outputs(&f.input);
    let Ok((cfg, inputs)) = read_inputs(&f.input, &PqConfigOverrides::default()) else {
        return;
    };
    write_inputs(&f.rewritten, &cfg, &inputs).expect("valid inputs write back");
    let (cfg2, inputs2) =
        read_inputs(&f.rewritten, &PqConfigOverrides::default()).expect("written inputs read back");
    assert_eq!(cfg2, cfg);
    assert_eq!(inputs2.shape, inputs.shape);
    assert_eq!(inputs2.codes, inputs.codes);
    assert_eq!(inputs2.n_cached, inputs.n_cached);
    let same_bits = |a: &[f32], b: &[f32]| {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
    };
    assert!(same_bits(&inputs2.query, &inputs.query));
    assert!(same_bits(&inputs2.key, &inputs.key));
    assert!(same_bits(&inputs2.centroids, &inputs.centroids));
    match (&inputs2.phi, &inputs.phi) {
        (Some(a), Some(b)) => assert!(same_bits(a, b)),
        (None, None) => {}
        _ => panic!("phi present in one of the two reads only"),
    }
});
