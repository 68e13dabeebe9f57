//! Fuzz-style tests of the topology file reader (`topo::xml::parse`,
//! `Topology::from_xml`): random bytes, token soups and mutations of the
//! seeds in `fuzz/corpus/topo_xml/` give a topology or an error naming a
//! line, never a panic, each well under a second. What parses must survive
//! a write/read round trip, and the planning views (matrix, ring) of any
//! accepted file must be computable.

use std::time::{Duration, Instant};

use oxccl_core::topo::{self, xml, Topology};
use proptest::prelude::*;

const CASE_LIMIT: Duration = Duration::from_secs(1);

const SEEDS: &[&str] = &[
    include_str!("../../../fuzz/corpus/topo_xml/nv18_pair.xml"),
    include_str!("../../../fuzz/corpus/topo_xml/nvswitch_8.xml"),
    include_str!("../../../fuzz/corpus/topo_xml/pcie_switch_acs.xml"),
    include_str!("../../../fuzz/corpus/topo_xml/nccl_style.xml"),
    include_str!("../../../fuzz/corpus/topo_xml/minimal.xml"),
    include_str!("../../../fuzz/corpus/topo_xml/h200x2_recorded.xml"),
];

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Runs the reader and every view of what it accepts; checks the time bound.
fn exercise(text: &str) {
    let t0 = Instant::now();
    match Topology::from_xml(text) {
        Ok(t) => {
            let m = t.matrix();
            let ring = topo::best_ring(&m);
            assert_eq!(ring.len(), m.len());
            let g = t.gpus();
            for a in &g {
                for b in &g {
                    let _ = topo::acs_between(a, b);
                }
            }
            for pos in 0..ring.len() {
                let _ = topo::tree_links(&ring, pos);
            }
            let _ = t.nics();
            let again = Topology::from_xml(&t.to_xml()).expect("written topology reads back");
            assert_eq!(again, t, "round trip");
        }
        Err(e) => {
            assert!(e.line >= 1, "errors name a line: {e}");
            assert!(!e.msg.is_empty());
        }
    }
    assert!(t0.elapsed() < CASE_LIMIT, "took {:?}", t0.elapsed());
}

#[derive(Debug, Clone)]
enum Edit {
    Flip(usize, u8),
    Set(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Truncate(usize),
    /// Duplicate a span (grows nesting and element counts).
    Dup(usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    let interesting = prop_oneof![
        Just(b'<'),
        Just(b'>'),
        Just(b'/'),
        Just(b'"'),
        Just(b'\''),
        Just(b'='),
        Just(b'&'),
        Just(b';'),
        Just(b'!'),
        Just(b'?'),
        Just(b'-'),
        Just(b'\n'),
        Just(0u8),
        Just(0xff),
        any::<u8>(),
    ];
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(i, b)| Edit::Flip(i, b)),
        (any::<usize>(), interesting.clone()).prop_map(|(i, b)| Edit::Set(i, b)),
        (any::<usize>(), interesting).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<usize>().prop_map(Edit::Remove),
        any::<usize>().prop_map(Edit::Truncate),
        (any::<usize>(), 1usize..200).prop_map(|(i, l)| Edit::Dup(i, l)),
    ]
}

fn apply(seed: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for e in edits {
        let n = v.len();
        match *e {
            Edit::Flip(i, b) if n > 0 => v[i % n] ^= b,
            Edit::Set(i, b) if n > 0 => v[i % n] = b,
            Edit::Insert(i, b) => v.insert(i % (n + 1), b),
            Edit::Remove(i) if n > 0 => {
                v.remove(i % n);
            }
            Edit::Truncate(i) => v.truncate(i % (n + 1)),
            Edit::Dup(i, l) if n > 0 => {
                let s = i % n;
                let e = (s + l).min(n);
                let span = v[s..e].to_vec();
                v.splice(s..s, span);
            }
            _ => {}
        }
    }
    v
}

fn token_soup() -> impl Strategy<Value = String> {
    let tok = prop_oneof![
        Just("<system version=\"1\">"),
        Just("</system>"),
        Just("<cpu numaid=\"0\">"),
        Just("<cpu numaid=\"x\">"),
        Just("</cpu>"),
        Just("<pci busid=\"0000:01:00.0\" class=\"0x060400\" acs=\"1\">"),
        Just("<pci busid=\"0000:02:00.0\" class=\"0x030200\">"),
        Just("<pci busid=\"bogus\">"),
        Just("</pci>"),
        Just("<gpu dev=\"0\">"),
        Just("<gpu dev=\"1\"/>"),
        Just("</gpu>"),
        Just("<nvlink target=\"0000:02:00.0\" count=\"18\" tclass=\"0x068000\"/>"),
        Just("<p2p target=\"0000:02:00.0\" status=\"cns\"/>"),
        Just("<nic><net name=\"mlx5_0\" dev=\"0\" speed=\"400000\"/></nic>"),
        Just("<!-- c -->"),
        Just("<?xml version=\"1.0\"?>"),
        Just("&amp;"),
        Just("&#x41;"),
        Just(" "),
        Just("\n"),
        Just("text"),
    ];
    prop::collection::vec(tok, 0..40).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(config(2000))]

    #[test]
    fn mutated_seeds_never_panic(i in 0..SEEDS.len(), edits in prop::collection::vec(edit(), 0..10)) {
        let bytes = apply(SEEDS[i].as_bytes(), &edits);
        exercise(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn token_soup_never_panics(t in token_soup()) {
        exercise(&t);
    }
}

proptest! {
    #![proptest_config(config(500))]

    #[test]
    fn random_text_never_panics(t in "\\PC{0,300}") {
        exercise(&t);
    }
}

#[test]
fn seeds_parse() {
    for s in SEEDS {
        let t = Topology::from_xml(s).unwrap_or_else(|e| panic!("{e}\n{s}"));
        exercise(s);
        let _ = t;
    }
}

#[test]
fn limits_hold() {
    // Deep nesting, many elements, a huge value, a huge file: errors, quickly.
    let deep = "<pci busid=\"0000:01:00.0\">".repeat(xml::MAX_DEPTH + 5);
    let e = Topology::from_xml(&format!("<system><cpu>{deep}")).unwrap_err();
    assert!(e.msg.contains("deeper"), "{e}");
    let many = "<cpu numaid=\"0\"/>".repeat(xml::MAX_ELEMENTS + 1);
    let e = Topology::from_xml(&format!("<system>{many}</system>")).unwrap_err();
    assert!(e.msg.contains("more than"), "{e}");
    let big = format!("<system x=\"{}\"/>", "a".repeat(xml::MAX_VALUE + 1));
    assert!(Topology::from_xml(&big).unwrap_err().msg.contains("longer"));
    let huge = " ".repeat(xml::MAX_INPUT + 1);
    assert!(Topology::from_xml(&huge)
        .unwrap_err()
        .msg
        .contains("larger"));
    exercise(&format!("<system>{}", "<cpu numaid=\"0\">".repeat(1000)));
}
