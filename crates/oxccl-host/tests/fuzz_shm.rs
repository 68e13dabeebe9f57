//! Fuzz-style tests for what a rank takes from a peer to connect over shared
//! memory (`transport/shm.rs`): the segment name it was sent, the layout it
//! expects, and the segment header the peer wrote. Arbitrary names and
//! layouts, and headers or sizes corrupted on disk, must give a typed error
//! (or the right segment), never a panic, an overflow or a huge mapping.

use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::time::{Duration, Instant};

use oxccl_host::transport::shm::SEG_HEADER_BYTES;
use oxccl_host::transport::{ShmRingLayout, ShmSegment};
use proptest::prelude::*;

const LAYOUT: ShmRingLayout = ShmRingLayout {
    npeers: 2,
    nchannels: 2,
    capacity: 4096,
};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        Just(1),
        Just(2),
        Just(3),
        Just(64),
        Just(4096),
        Just(4095),
        Just(usize::MAX),
        Just(usize::MAX / 2),
        Just(1usize << 32),
        any::<usize>(),
    ]
}

fn layout() -> impl Strategy<Value = ShmRingLayout> {
    (dim(), dim(), dim()).prop_map(|(npeers, nchannels, capacity)| ShmRingLayout {
        npeers,
        nchannels,
        capacity,
    })
}

/// Bytes of the segment header that are checked: magic, version, peers,
/// channels, ring capacity and slot-area size (six words).
const HEADER_WORDS_BYTES: usize = 48;

fn path_of(seg: &ShmSegment) -> String {
    format!("/dev/shm{}", seg.name())
}

proptest! {
    #![proptest_config(config(300))]

    #[test]
    fn layouts_from_a_peer(l in layout()) {
        let seg = ShmSegment::create_rings(LAYOUT).expect("create");
        let t = Instant::now();
        match ShmSegment::open_rings(seg.name(), l) {
            Ok(s) => {
                prop_assert_eq!(l, LAYOUT);
                prop_assert_eq!(s.ring_layout(), Some(LAYOUT));
            }
            Err(e) => prop_assert!(l != LAYOUT, "the right layout was refused: {e}"),
        }
        prop_assert!(t.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn names_from_a_peer(name in prop_oneof![
        any::<String>(),
        "/oxccl-[0-9]{1,7}-rx-[0-9a-f]{0,16}".prop_map(|s| s),
        "/?(\\.\\./)*[a-z/]{0,20}".prop_map(|s| s),
        Just(String::from("/")),
        Just(String::from("")),
        Just(String::from("/oxccl-\0")),
    ]) {
        if let Ok(s) = ShmSegment::open_rings(&name, LAYOUT) {
            // Only a real ring segment of this layout can be opened.
            prop_assert_eq!(s.ring_layout(), Some(LAYOUT));
        }
    }

    #[test]
    fn corrupted_header(edits in prop::collection::vec((0..SEG_HEADER_BYTES, any::<u8>()), 1..6)) {
        let seg = ShmSegment::create_rings(LAYOUT).expect("create");
        let path = path_of(&seg);
        let before = std::fs::read(&path).expect("read the segment")[..HEADER_WORDS_BYTES].to_vec();
        let mut f = OpenOptions::new().write(true).open(&path).expect("open the segment file");
        let mut after = before.clone();
        for (at, b) in &edits {
            f.seek(SeekFrom::Start(*at as u64)).unwrap();
            f.write_all(&[*b]).unwrap();
            if *at < HEADER_WORDS_BYTES {
                after[*at] = *b;
            }
        }
        drop(f);
        match ShmSegment::open_rings(seg.name(), LAYOUT) {
            Ok(_) => prop_assert_eq!(&after, &before, "a changed header was accepted"),
            Err(e) => {
                prop_assert_ne!(&after, &before, "an intact header was refused: {}", e);
                prop_assert!(e.message().contains("layout"), "{e}");
            }
        }
    }

    #[test]
    fn truncated_segment(len in 0u64..(LAYOUT.segment_size() as u64 + 64)) {
        let seg = ShmSegment::create_rings(LAYOUT).expect("create");
        let f = OpenOptions::new().write(true).open(path_of(&seg)).expect("open");
        f.set_len(len).expect("truncate");
        drop(f);
        let r = ShmSegment::open_rings(seg.name(), LAYOUT);
        if len < LAYOUT.segment_size() as u64 {
            let e = r.expect_err("a short segment was accepted");
            prop_assert!(e.message().contains("expected at least"), "{e}");
        } else {
            prop_assert!(r.is_ok());
        }
    }
}
