//! Fuzz-style tests of the ELF dynamic-section reader (`elf::parse`), the
//! loader cache reader (`elf::parse_cache`) and the search over what they
//! give (`elf::find`): mutations of the seeds in `fuzz/corpus/elf/` (small
//! files built with gcc for this repo, and a cache written from the format's
//! layout), headers with random fields, and random bytes give a value or an
//! error, never a panic, each case well under a second. The runs use fixed
//! seeds, so a failure reproduces.

use std::time::{Duration, Instant};

use oxccl_core::elf::{self, Bytes, CacheEntry, LoaderEnv, LoaderFs, Probe, ReadAt};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

const CASE_LIMIT: Duration = Duration::from_secs(1);

const ELF_SEEDS: &[&[u8]] = &[
    include_bytes!("../../../fuzz/corpus/elf/rpath_lib.so"),
    include_bytes!("../../../fuzz/corpus/elf/runpath_exe"),
    include_bytes!("../../../fuzz/corpus/elf/runpath_soname.so"),
];
const CACHE_SEED: &[u8] = include_bytes!("../../../fuzz/corpus/elf/ld.so.cache");

fn runner(cases: u32, seed: u8) -> TestRunner {
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]),
    )
}

#[derive(Debug, Clone)]
enum Edit {
    Flip(usize, u8),
    Set(usize, u8),
    /// A little-endian u64 written over 8 bytes (offsets, sizes, tags).
    Word(usize, u64),
    Insert(usize, u8),
    Remove(usize),
    Truncate(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    let word = prop_oneof![
        Just(0u64),
        Just(u64::MAX),
        Just(u64::MAX - 7),
        Just(1 << 63),
        Just(0xffff_ffff),
        Just(56),
        Just(64),
        0u64..0x2000,
        any::<u64>(),
    ];
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(i, b)| Edit::Flip(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        // Most edits land in the headers and the dynamic segment (the first 1 KiB).
        (0usize..1024, word).prop_map(|(i, w)| Edit::Word(i, w)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<usize>().prop_map(Edit::Remove),
        any::<usize>().prop_map(Edit::Truncate),
    ]
}

fn apply(seed: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for e in edits {
        let n = v.len();
        match *e {
            Edit::Flip(i, b) if n > 0 => v[i % n] ^= b,
            Edit::Set(i, b) if n > 0 => v[i % n] = b,
            Edit::Word(i, w) if n >= 8 => {
                let i = i % (n - 7);
                v[i..i + 8].copy_from_slice(&w.to_le_bytes());
            }
            Edit::Insert(i, b) => v.insert(i % (n + 1), b),
            Edit::Remove(i) if n > 0 => {
                v.remove(i % n);
            }
            Edit::Truncate(i) => v.truncate(i % (n + 1)),
            _ => {}
        }
    }
    v
}

/// Counts bytes asked for, to prove reads stay bounded.
struct Counting<'a> {
    inner: Bytes<'a>,
    asked: u64,
}

impl ReadAt for Counting<'_> {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&mut self, off: u64, buf: &mut [u8]) -> bool {
        self.asked += buf.len() as u64;
        self.inner.read_at(off, buf)
    }
}

/// Every path holds the same object: the one being fuzzed.
struct Same(Probe);

impl LoaderFs for Same {
    fn probe(&self, _path: &str) -> Probe {
        self.0.clone()
    }
}

fn env(cache: Result<Vec<CacheEntry>, String>) -> LoaderEnv {
    LoaderEnv {
        preload: Some("libnccl.so.2 /x/libnccl.so.2".into()),
        library_path: Some("/a:;/b:$ORIGIN:rel".into()),
        cache,
        conf_dirs: vec!["/etc-dir".into()],
        default_dirs: elf::default_dirs(elf::EM_X86_64),
    }
}

fn exercise_elf(bytes: &[u8]) {
    let t0 = Instant::now();
    let mut r = Counting {
        inner: Bytes(bytes),
        asked: 0,
    };
    let parsed = elf::parse_from(&mut r);
    // Header, program headers, dynamic segment and strings: bounded whatever the file says.
    let bound = 64
        + (elf::MAX_PHNUM * 56) as u64
        + elf::MAX_DYN_BYTES
        + (elf::MAX_NEEDED as u64 + 3) * (elf::MAX_STRING as u64 + 1);
    assert!(r.asked <= bound, "read {} bytes", r.asked);
    match parsed {
        Ok(d) => {
            assert_eq!(elf::parse(bytes), Ok(d.clone()), "same answer in memory");
            assert!(d.needed.len() <= elf::MAX_NEEDED);
            // The search over a machine where every path is this object.
            let fs = Same(Probe::Elf(d.clone()));
            let l = elf::find(
                "/bin/prog",
                &d,
                "libnccl.so.2",
                &env(Err("none".into())),
                &fs,
            );
            assert!(l.objects <= elf::MAX_OBJECTS);
            assert!(
                l.resolution
                    .steps
                    .iter()
                    .filter(|s| s.outcome == elf::Outcome::Loaded)
                    .count()
                    <= 1
            );
        }
        Err(e) => assert!(!e.0.is_empty()),
    }
    assert!(t0.elapsed() < CASE_LIMIT, "took {:?}", t0.elapsed());
}

fn exercise_cache(bytes: &[u8]) {
    let t0 = Instant::now();
    if let Ok(c) = elf::parse_cache(bytes) {
        assert!(c.len() <= elf::MAX_CACHE_ENTRIES);
        let d = elf::parse(ELF_SEEDS[0]).expect("seed parses");
        let fs = Same(Probe::Missing);
        let l = elf::find("/bin/prog", &d, "libnccl.so.2", &env(Ok(c)), &fs);
        assert!(l.resolution.loaded().is_none(), "nothing exists");
    }
    assert!(t0.elapsed() < CASE_LIMIT, "took {:?}", t0.elapsed());
}

#[test]
fn seeds_parse() {
    let want = [
        (
            vec!["libnccl.so.2"],
            None,
            Some("$ORIGIN/../lib:/opt/nccl/lib"),
            None,
        ),
        (
            vec!["libnccl.so.2", "libc.so.6"],
            None,
            None,
            Some("$ORIGIN/../lib"),
        ),
        (
            vec![],
            Some("libnccl.so.2"),
            None,
            Some("$ORIGIN/../nvidia/nccl/lib"),
        ),
    ];
    for (seed, (needed, soname, rpath, runpath)) in ELF_SEEDS.iter().zip(want) {
        let d = elf::parse(seed).unwrap();
        assert_eq!(d.machine, elf::EM_X86_64);
        assert_eq!(d.needed, needed);
        assert_eq!(d.soname.as_deref(), soname);
        assert_eq!(d.rpath.as_deref(), rpath);
        assert_eq!(d.runpath.as_deref(), runpath);
        exercise_elf(seed);
    }
    let c = elf::parse_cache(CACHE_SEED).unwrap();
    assert_eq!(c.len(), 4);
    let fit: Vec<&str> = c
        .iter()
        .filter(|e| e.name == "libnccl.so.2" && e.fits(elf::EM_X86_64))
        .map(|e| e.path.as_str())
        .collect();
    assert_eq!(fit, ["/usr/lib/x86_64-linux-gnu/libnccl.so.2"]);
}

#[test]
fn mutated_elf_never_panics() {
    let mut r = runner(3000, 1);
    let s = (0..ELF_SEEDS.len(), prop::collection::vec(edit(), 0..8));
    r.run(&s, |(i, edits)| {
        exercise_elf(&apply(ELF_SEEDS[i], &edits));
        Ok(())
    })
    .unwrap();
}

#[test]
fn mutated_cache_never_panics() {
    let mut r = runner(2000, 2);
    let s = prop::collection::vec(edit(), 0..8);
    r.run(&s, |edits| {
        exercise_cache(&apply(CACHE_SEED, &edits));
        Ok(())
    })
    .unwrap();
}

#[test]
fn random_bytes_never_panic() {
    let mut r = runner(1000, 3);
    // Random bytes behind a valid ELF64 LE magic, so the header checks are reached.
    let s = prop::collection::vec(any::<u8>(), 0..600);
    r.run(&s, |tail| {
        let mut b = b"\x7fELF\x02\x01\x01".to_vec();
        b.extend(&tail);
        exercise_elf(&b);
        exercise_elf(&tail);
        let mut c = b"glibc-ld.so.cache1.1".to_vec();
        c.extend(&tail);
        exercise_cache(&c);
        Ok(())
    })
    .unwrap();
}

#[test]
fn limits_hold() {
    // Huge counts and sizes in otherwise valid headers: errors, quickly, with small reads.
    let seed = ELF_SEEDS[0];
    let mut b = seed.to_vec();
    b[56..58].copy_from_slice(&u16::MAX.to_le_bytes()); // e_phnum
    assert!(elf::parse(&b).unwrap_err().0.contains("program headers"));
    let mut c = CACHE_SEED.to_vec();
    c[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(elf::parse_cache(&c).is_err());
    let big = vec![0u8; 1 << 20];
    exercise_elf(&big);
    exercise_cache(&big);
}
