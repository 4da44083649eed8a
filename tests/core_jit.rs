//! The on-disk cubin cache without a GPU: key stability, verified reads, rebuild of
//! corrupt entries, and concurrent writers (threads and processes) never leaving a torn
//! file.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use tritonrt::driver::CacheOutcome;
use tritonrt::jit::{cache_key, decode_entry, encode_entry, CubinCache, JitOptions, Lookup};

const PTX_SHA: &str = "0c352c14949c4c66b7432f3bc8f6dfc9d654d2ef4233e3193eb3f97967f9ef67";

/// Fresh pseudo-cubin bytes: an ELF magic then seeded random bytes.
fn fake_cubin(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = b"\x7fELF".to_vec();
    v.extend((4..len).map(|_| rng.random::<u8>()));
    v
}

fn seed() -> u64 {
    let s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("seed {s}");
    s
}

#[test]
fn cache_key_is_stable_and_covers_every_input() {
    let o = JitOptions::default();
    let k = cache_key(PTX_SHA, 90, 13000, &o);
    assert_eq!(
        k,
        cache_key(PTX_SHA, 90, 13000, &o),
        "same inputs, same key"
    );
    assert_eq!(k.len(), 64);
    assert!(k.bytes().all(|b| b.is_ascii_hexdigit()));
    let others = [
        cache_key(&PTX_SHA.replace('0', "1"), 90, 13000, &o),
        cache_key(PTX_SHA, 89, 13000, &o),
        cache_key(PTX_SHA, 90, 12080, &o),
        cache_key(PTX_SHA, 90, 13000, &JitOptions { opt_level: Some(3) }),
        cache_key(PTX_SHA, 90, 13000, &JitOptions { opt_level: Some(4) }),
    ];
    let mut all: HashSet<&str> = others.iter().map(String::as_str).collect();
    all.insert(&k);
    assert_eq!(all.len(), 6, "each input changes the key: {all:?}");
    // Pinned value: a change here means every user's cache is invalidated, so it must
    // come with a CACHE_VERSION bump (that is what the constant is for).
    assert_eq!(tritonrt::jit::CACHE_VERSION, 1);
    assert_eq!(
        k,
        tritonrt::artifact::sha256_hex(
            format!(
                "tritonrt-cubin-cache\nversion=1\nptx_sha256={PTX_SHA}\narch=90\ndriver=13000\nopt_level=default\n"
            )
            .as_bytes()
        )
    );
}

#[test]
fn entries_round_trip_and_reject_damage() {
    let c = fake_cubin(seed(), 5000);
    let e = encode_entry(&c);
    assert_eq!(decode_entry(&e).unwrap(), c);
    let mut flipped = e.clone();
    flipped[100] ^= 0x80;
    assert!(decode_entry(&flipped).unwrap_err().contains("sha256"));
    assert!(decode_entry(&e[..e.len() - 1])
        .unwrap_err()
        .contains("header says 5000"));
    assert!(decode_entry(&e[..20]).unwrap_err().contains("shorter than"));
    let mut magic = e.clone();
    magic[0] = b'X';
    assert!(decode_entry(&magic).unwrap_err().contains("magic"));
}

#[test]
fn miss_then_hit_builds_once() {
    let t = tempfile::tempdir().unwrap();
    let cache = CubinCache::new(t.path().join("c")).unwrap();
    let key = cache_key(PTX_SHA, 90, 13000, &JitOptions::default());
    let c = fake_cubin(seed(), 3000);
    let calls = AtomicUsize::new(0);
    let build = || {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok(c.clone())
    };
    assert_eq!(cache.lookup(&key), Lookup::Miss);
    let (b, o) = cache.get_or_insert_with(&key, build).unwrap();
    assert_eq!((b.as_slice(), o), (c.as_slice(), CacheOutcome::Built));
    let (b, o) = cache.get_or_insert_with(&key, build).unwrap();
    assert_eq!((b.as_slice(), o), (c.as_slice(), CacheOutcome::Hit));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // A build error is returned and nothing is stored.
    let key2 = cache_key(PTX_SHA, 80, 13000, &JitOptions::default());
    let r = cache.get_or_insert_with(&key2, || Err(tritonrt::Error::invalid("x", "boom")));
    assert!(r.unwrap_err().to_string().contains("boom"));
    assert_eq!(cache.lookup(&key2), Lookup::Miss);
    // No temp files are left behind.
    let names: Vec<String> = std::fs::read_dir(cache.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec![format!("{key}.cubin")]);
}

#[test]
fn corrupt_entries_are_rebuilt() {
    let t = tempfile::tempdir().unwrap();
    let cache = CubinCache::new(t.path()).unwrap();
    let s = seed();
    type Damage = Box<dyn Fn(&mut Vec<u8>)>;
    let damages: Vec<(&str, Damage)> = vec![
        ("flipped byte", Box::new(|b: &mut Vec<u8>| b[60] ^= 1)),
        (
            "truncated",
            Box::new(|b: &mut Vec<u8>| b.truncate(b.len() / 2)),
        ),
        ("empty", Box::new(|b: &mut Vec<u8>| b.clear())),
        (
            "garbage",
            Box::new(|b: &mut Vec<u8>| b.iter_mut().for_each(|x| *x = 0x55)),
        ),
    ];
    for (i, (what, damage)) in damages.iter().enumerate() {
        let key = cache_key(PTX_SHA, 90, 13000 + i as i32, &JitOptions::default());
        let c = fake_cubin(s + i as u64, 2048);
        cache.store(&key, &c).unwrap();
        let path = cache.entry_path(&key);
        let mut bytes = std::fs::read(&path).unwrap();
        damage(&mut bytes);
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(cache.lookup(&key), Lookup::Corrupt(_)), "{what}");
        let (b, o) = cache.get_or_insert_with(&key, || Ok(c.clone())).unwrap();
        assert_eq!(o, CacheOutcome::Rebuilt, "{what}");
        assert_eq!(b, c);
        assert_eq!(cache.lookup(&key), Lookup::Hit(c), "{what}: entry repaired");
    }
}

#[test]
fn default_dir_honours_the_environment() {
    let t = tempfile::tempdir().unwrap();
    std::env::set_var("TRITONRT_CACHE_DIR", t.path());
    assert_eq!(CubinCache::default_dir().unwrap(), t.path());
    std::env::remove_var("TRITONRT_CACHE_DIR");
    let d = CubinCache::default_dir().unwrap();
    assert!(d.ends_with("tritonrt"), "{}", d.display());
}

/// Writers and readers of one key, all at once; every read must verify.
fn hammer_readers(
    cache: &CubinCache,
    key: &str,
    payloads: &[Vec<u8>],
    stop: &AtomicBool,
) -> (usize, usize) {
    let (mut hits, mut misses) = (0, 0);
    while !stop.load(Ordering::SeqCst) {
        match cache.lookup(key) {
            Lookup::Hit(b) => {
                assert!(payloads.contains(&b), "a read returned bytes nobody wrote");
                hits += 1;
            }
            Lookup::Miss => misses += 1,
            Lookup::Corrupt(why) => panic!("torn or corrupt entry observed: {why}"),
        }
    }
    (hits, misses)
}

#[test]
fn concurrent_thread_writers_never_tear() {
    let t = tempfile::tempdir().unwrap();
    let cache = Arc::new(CubinCache::new(t.path()).unwrap());
    let key = cache_key(PTX_SHA, 90, 13000, &JitOptions::default());
    let s = seed();
    // Different payloads per writer (as if two drivers raced), 1 MiB each, so a
    // non-atomic write would be observable.
    let payloads: Arc<Vec<Vec<u8>>> =
        Arc::new((0..6).map(|i| fake_cubin(s + i, 1 << 20)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (c, k, p, st) = (cache.clone(), key.clone(), payloads.clone(), stop.clone());
            std::thread::spawn(move || hammer_readers(&c, &k, &p, &st))
        })
        .collect();
    let writers: Vec<_> = (0..6)
        .map(|i| {
            let (c, k, p) = (cache.clone(), key.clone(), payloads.clone());
            std::thread::spawn(move || {
                for _ in 0..15 {
                    c.store(&k, &p[i]).unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let mut hits = 0;
    for r in readers {
        hits += r.join().unwrap().0;
    }
    assert!(hits > 0, "readers saw the entry");
    match cache.lookup(&key) {
        Lookup::Hit(b) => assert!(payloads.contains(&b)),
        other => panic!("final entry not valid: {other:?}"),
    }
    eprintln!("thread writers: {hits} verified concurrent reads");
}

#[test]
fn concurrent_get_or_insert_agree() {
    let t = tempfile::tempdir().unwrap();
    let cache = Arc::new(CubinCache::new(t.path()).unwrap());
    let key = cache_key(PTX_SHA, 80, 13000, &JitOptions::default());
    let c = Arc::new(fake_cubin(seed(), 200_000));
    let hs: Vec<_> = (0..8)
        .map(|_| {
            let (cache, key, c) = (cache.clone(), key.clone(), c.clone());
            std::thread::spawn(move || cache.get_or_insert_with(&key, || Ok((*c).clone())).unwrap())
        })
        .collect();
    for h in hs {
        let (b, o) = h.join().unwrap();
        assert_eq!(&b, &*c);
        assert!(matches!(o, CacheOutcome::Built | CacheOutcome::Hit));
    }
}

const CHILD_ENV: &str = "TRITONRT_TEST_CACHE_CHILD";

/// In a child process (spawned by the test below): write one key many times.
#[test]
fn child_writer() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return; // only meaningful when spawned by concurrent_process_writers_never_tear
    };
    let (dir, idx) = spec.split_once('|').unwrap();
    let idx: u64 = idx.parse().unwrap();
    let cache = CubinCache::new(dir).unwrap();
    let key = cache_key(PTX_SHA, 90, 13000, &JitOptions::default());
    let payload = fake_cubin(1000 + idx, 256 << 10);
    for _ in 0..60 {
        cache.store(&key, &payload).unwrap();
    }
}

#[test]
fn concurrent_process_writers_never_tear() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let dir: &Path = t.path();
    let cache = CubinCache::new(dir).unwrap();
    let key = cache_key(PTX_SHA, 90, 13000, &JitOptions::default());
    let payloads: Vec<Vec<u8>> = (0..4).map(|i| fake_cubin(1000 + i, 256 << 10)).collect();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..4)
        .map(|i| {
            std::process::Command::new(&exe)
                .args(["--exact", "child_writer", "--test-threads", "1"])
                .env(CHILD_ENV, format!("{}|{i}", dir.display()))
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let stop = AtomicBool::new(false);
    let (hits, _) = std::thread::scope(|s| {
        let r = s.spawn(|| hammer_readers(&cache, &key, &payloads, &stop));
        for mut ch in children {
            assert!(ch.wait().unwrap().success(), "a writer process failed");
        }
        stop.store(true, Ordering::SeqCst);
        r.join().unwrap()
    });
    match cache.lookup(&key) {
        Lookup::Hit(b) => assert!(payloads.contains(&b)),
        other => panic!("final entry not valid: {other:?}"),
    }
    eprintln!("process writers: {hits} verified concurrent reads");
}
