//! The cubin-cache entry format: `tritonrt::jit::decode_entry` (magic, payload size,
//! payload sha256, payload). Errors are fine; a panic or an allocation from the size
//! field is a bug. Also checked: `encode_entry` then `decode_entry` gives the payload
//! back, and changing any one byte of an encoded entry makes it fail to decode.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tritonrt::jit::{decode_entry, encode_entry};

fuzz_target!(|data: &[u8]| {
    if let Ok(payload) = decode_entry(data) {
        assert_eq!(payload.len() + 48, data.len());
        assert_eq!(
            encode_entry(&payload),
            data,
            "a decoded entry re-encodes to itself"
        );
    }
    let mut enc = encode_entry(data);
    assert_eq!(decode_entry(&enc).as_deref(), Ok(data));
    // Flip one byte chosen by the input; the entry must no longer decode.
    let seed = data
        .iter()
        .fold(0usize, |h, &b| h.wrapping_mul(31).wrapping_add(b as usize));
    let i = seed % enc.len();
    enc[i] ^= 1 + (seed % 255) as u8;
    assert!(
        decode_entry(&enc).is_err(),
        "entry with byte {i} changed still decodes"
    );
    // Truncated and extended entries fail too.
    enc[i] ^= 1 + (seed % 255) as u8;
    assert!(decode_entry(&enc[..enc.len() - 1]).is_err());
    enc.push(0);
    assert!(decode_entry(&enc).is_err());
});
