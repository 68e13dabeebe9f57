//! The ELF dynamic-section reader (`elf::parse_from`), the loader cache reader
//! (`elf::parse_cache`) and the library search over what they give
//! (`elf::find`), as `oxccl doctor` runs them on files of the machine. Never
//! panics; reads stay within the documented bounds; the search stops.

use honggfuzz::fuzz;
use oxccl_core::elf::{self, Bytes, CacheEntry, LoaderEnv, LoaderFs, Probe, ReadAt};

/// Counts bytes asked for, to check that reads stay bounded.
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

fn main() {
    loop {
        fuzz!(|b: &[u8]| {
            let mut r = Counting {
                inner: Bytes(b),
                asked: 0,
            };
            let parsed = elf::parse_from(&mut r);
            let bound = 64
                + (elf::MAX_PHNUM * 56) as u64
                + elf::MAX_DYN_BYTES
                + (elf::MAX_NEEDED as u64 + 3) * (elf::MAX_STRING as u64 + 1);
            assert!(r.asked <= bound, "read {} bytes", r.asked);
            let cache = elf::parse_cache(b);
            if let Ok(c) = &cache {
                assert!(c.len() <= elf::MAX_CACHE_ENTRIES);
            }
            if let Ok(d) = parsed {
                assert_eq!(elf::parse(b), Ok(d.clone()), "same answer in memory");
                assert!(d.needed.len() <= elf::MAX_NEEDED);
                let fs = Same(Probe::Elf(d.clone()));
                let cache = cache.map_err(|e| e.0);
                let l = elf::find("/bin/prog", &d, "libnccl.so.2", &env(cache), &fs);
                assert!(l.objects <= elf::MAX_OBJECTS);
            }
        });
    }
}
