//! Many processes writing the on-disk caches at once never tear them: 8 processes (this
//! test binary re-run in a writer role) store cubin cache entries (keys shared by every
//! process and keys of their own) and merge tuning-table entries into one `tuning.json`
//! at the same time, for several rounds; afterwards every cubin entry must verify and
//! hold exactly its bytes, and the table must load strictly and hold every process's
//! entries of every round. No GPU needed: the cubin bytes are stand-ins, which is all the
//! storage layer sees.

use std::path::{Path, PathBuf};
use std::process::Command;

use tritonrt::jit::{CubinCache, Lookup};
use tritonrt::tune::{CandidateTiming, TuningEntry, TuningTable};

const PROCESSES: usize = 8;
const ROUNDS: usize = 3;
const SHARED_KEYS: usize = 16;
const OWN_KEYS: usize = 8;
const SAVES_PER_ROUND: usize = 4;
const ROLE_ENV: &str = "TRITONRT_MP_WRITER";

/// The bytes every writer stores under `key`: a few KB that depend on the key only, so
/// writers of a shared key race with identical content, as JIT results do.
fn cubin_bytes(key: &str) -> Vec<u8> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let len = 4096 + (h % 8192) as usize;
    (0..len)
        .map(|i| {
            h = h
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (h >> 56) as u8 ^ (i as u8)
        })
        .collect()
}

fn entry(proc_id: usize, round: usize, save: usize) -> TuningEntry {
    let winner = format!("k.v{}", (proc_id + save) % 3);
    TuningEntry {
        gpu: "stand-in GPU".into(),
        arch: 90,
        driver_version: 13000,
        kernel: format!("kernel{proc_id}"),
        kernel_hash: "ab".repeat(32),
        candidate_checksum: "cd".repeat(32),
        // one bucket per (round, save): rows 1, 2, 4, ...
        bucket: format!(
            "b1:kernel{proc_id}:fp32:sm90:rows<={}:n<=32768:align1:ds64:K64:heavy<=128",
            1usize << (round * SAVES_PER_ROUND + save)
        ),
        winner: winner.clone(),
        default_variant: "k.v0".into(),
        timings: (0..3)
            .map(|v| CandidateTiming {
                id: format!("k.v{v}"),
                median_us: 10.0 + v as f64,
                min_us: 9.0 + v as f64,
                max_us: 11.0 + v as f64,
                count: 5,
            })
            .collect(),
        excluded: Vec::new(),
        workload: String::new(),
        method: String::new(),
        tritonrt_version: String::new(),
        tuned_at_unix_s: 0,
    }
}

/// The writer role (this binary re-run by the test below with `ROLE_ENV` set); a no-op
/// in a plain test run.
#[test]
fn writer_role() {
    let Ok(spec) = std::env::var(ROLE_ENV) else {
        return;
    };
    let mut it = spec.splitn(3, ':');
    let (id, round, dir): (usize, usize, PathBuf) = (
        it.next().unwrap().parse().unwrap(),
        it.next().unwrap().parse().unwrap(),
        it.next().unwrap().into(),
    );
    let cache = CubinCache::new(dir.join("cubins")).expect("cache dir");
    let table_path = dir.join("tuning.json");
    for i in 0..SHARED_KEYS.max(OWN_KEYS) {
        if i < SHARED_KEYS {
            let k = format!("shared{round}_{i}");
            cache.store(&k, &cubin_bytes(&k)).expect("store shared");
        }
        if i < OWN_KEYS {
            let k = format!("own{round}_{id}_{i}");
            cache.store(&k, &cubin_bytes(&k)).expect("store own");
        }
        if i < SAVES_PER_ROUND {
            let mut t = TuningTable::new();
            t.insert(entry(id, round, i)).expect("consistent entry");
            t.save_merged(&table_path).expect("save_merged");
        }
    }
}

fn check_cubin(cache: &CubinCache, key: &str) {
    match cache.lookup(key) {
        Lookup::Hit(b) => assert!(b == cubin_bytes(key), "entry {key}: other bytes"),
        Lookup::Miss => panic!("entry {key} missing"),
        Lookup::Corrupt(why) => panic!("entry {key} torn: {why}"),
    }
}

#[test]
fn eight_processes_write_the_caches_at_once() {
    if std::env::var(ROLE_ENV).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = std::env::current_exe().expect("test binary");
    for round in 0..ROUNDS {
        let children: Vec<_> = (0..PROCESSES)
            .map(|id| {
                Command::new(&exe)
                    .args(["--exact", "writer_role", "--test-threads=1"])
                    .env(ROLE_ENV, format!("{id}:{round}:{}", dir.path().display()))
                    .output_spawn()
            })
            .collect();
        for (id, c) in children.into_iter().enumerate() {
            let out = c.wait_with_output().expect("writer");
            assert!(
                out.status.success(),
                "writer {id} of round {round} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        verify(dir.path(), round);
    }
    let stray: Vec<_> = std::fs::read_dir(dir.path().join("cubins"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".cubin"))
        .collect();
    assert!(stray.is_empty(), "temporary files left behind: {stray:?}");
    eprintln!(
        "{PROCESSES} processes x {ROUNDS} rounds: {} cubin entries and {} tuning entries, none torn or lost",
        ROUNDS * (SHARED_KEYS + PROCESSES * OWN_KEYS),
        ROUNDS * PROCESSES * SAVES_PER_ROUND
    );
}

/// Every entry of rounds `0..=round` is there and whole.
fn verify(dir: &Path, round: usize) {
    let cache = CubinCache::new(dir.join("cubins")).unwrap();
    for r in 0..=round {
        for i in 0..SHARED_KEYS {
            check_cubin(&cache, &format!("shared{r}_{i}"));
        }
        for id in 0..PROCESSES {
            for i in 0..OWN_KEYS {
                check_cubin(&cache, &format!("own{r}_{id}_{i}"));
            }
        }
    }
    let table = TuningTable::load(&dir.join("tuning.json")).expect("the table loads strictly");
    let want = (round + 1) * PROCESSES * SAVES_PER_ROUND;
    assert_eq!(
        table.len(),
        want,
        "tuning entries after round {round}: a concurrent merge lost some"
    );
    for r in 0..=round {
        for id in 0..PROCESSES {
            for s in 0..SAVES_PER_ROUND {
                let e = entry(id, r, s);
                assert!(
                    table.entries().iter().any(|t| t == &e),
                    "entry of process {id}, round {r}, save {s} missing"
                );
            }
        }
    }
}

trait SpawnPiped {
    fn output_spawn(&mut self) -> std::process::Child;
}

impl SpawnPiped for Command {
    /// Spawn with stdout and stderr captured (for the failure message).
    fn output_spawn(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawning a writer")
    }
}
