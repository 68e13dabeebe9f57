//! Fuzz-style tests for oxccl-core's parsers of outside input: the engine's
//! stream header (`Header::decode`), configuration files and NCCL_* values
//! (`Params::from_sources`, every registry entry's checker), the
//! `NCCL_ALGO`/`NCCL_PROTO` grammar, `NCCL_DEBUG*` values and the
//! `NCCL_DEBUG_FILE`/timestamp patterns. Arbitrary input and mutations of the
//! seeds in `fuzz/corpus/` must give a value or a typed error: no panic, and
//! each case well under a second.

use std::time::{Duration, Instant};

use oxccl_core::algo::{Algo, Proto, Selection};
use oxccl_core::engine::{Header, HEADER_BYTES};
use oxccl_core::logfmt::{debug_file_path, strftime, Level, LevelSet, LogConfig, Subsys};
use oxccl_core::params::{self, Params, ALL};
use oxccl_core::CollKind;
use proptest::prelude::*;

const CASE_LIMIT: Duration = Duration::from_secs(1);

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

const HEADER_SEEDS: &[&[u8]] = &[
    include_bytes!("../../../fuzz/corpus/header/all_reduce_f32.bin"),
    include_bytes!("../../../fuzz/corpus/header/send_u8.bin"),
];
const CONF_SEED: &str = include_str!("../../../fuzz/corpus/conf/nccl.conf");
const ALGO_SEEDS: &[&str] = &[
    include_str!("../../../fuzz/corpus/algo/list.txt"),
    include_str!("../../../fuzz/corpus/algo/exclude.txt"),
    include_str!("../../../fuzz/corpus/algo/per_coll.txt"),
    include_str!("../../../fuzz/corpus/algo/per_coll_exclude.txt"),
];
const PROTO_SEEDS: &[&str] = &[
    include_str!("../../../fuzz/corpus/proto/list.txt"),
    include_str!("../../../fuzz/corpus/proto/exclude.txt"),
    include_str!("../../../fuzz/corpus/proto/per_coll.txt"),
];
const SUBSYS_SEEDS: &[&str] = &[
    include_str!("../../../fuzz/corpus/debug_subsys/list.txt"),
    include_str!("../../../fuzz/corpus/debug_subsys/exclude.txt"),
    include_str!("../../../fuzz/corpus/debug_subsys/all.txt"),
];

/// One edit of a seed.
#[derive(Debug, Clone)]
enum Edit {
    Flip(usize, u8),
    Set(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Truncate(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    let interesting = prop_oneof![
        Just(0u8),
        Just(0xff),
        Just(0x7f),
        Just(0x80),
        Just(b','),
        Just(b';'),
        Just(b'^'),
        Just(b':'),
        Just(b'='),
        Just(b'%'),
        Just(b'#'),
        Just(b'"'),
        Just(b'\n'),
        any::<u8>(),
    ];
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(i, b)| Edit::Flip(i, b)),
        (any::<usize>(), interesting.clone()).prop_map(|(i, b)| Edit::Set(i, b)),
        (any::<usize>(), interesting).prop_map(|(i, b)| Edit::Insert(i, b)),
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

/// A mutated seed as text (invalid UTF-8 replaced, as an env value would be read lossily).
fn mutated_text(seeds: &'static [&'static str]) -> impl Strategy<Value = String> {
    (0..seeds.len(), prop::collection::vec(edit(), 0..8)).prop_map(move |(i, e)| {
        String::from_utf8_lossy(&apply(seeds[i].as_bytes(), &e)).into_owned()
    })
}

/// Strings made of the grammars' own tokens, to get past the first check.
fn grammar_text() -> impl Strategy<Value = String> {
    let tok = prop_oneof![
        Just("ring"),
        Just("Tree"),
        Just("NVLS"),
        Just("collnet"),
        Just("CollnetDirect"),
        Just("CollnetChain"),
        Just("OneShot"),
        Just("PAT"),
        Just("LL"),
        Just("ll128"),
        Just("Simple"),
        Just("allreduce"),
        Just("all_gather"),
        Just("ReduceScatter"),
        Just("broadcast"),
        Just("reduce"),
        Just("sendrecv"),
        Just("INIT"),
        Just("COLL"),
        Just("ALL"),
        Just("WARN"),
        Just(","),
        Just(";"),
        Just(":"),
        Just("^"),
        Just(" "),
        Just("="),
        Just("é"),
        Just(""),
    ];
    prop::collection::vec(tok, 0..16).prop_map(|v| v.concat())
}

fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        grammar_text(),
        prop::collection::vec(any::<u8>(), 0..64)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    assert!(
        t.elapsed() < CASE_LIMIT,
        "{what} took {:?} on one input",
        t.elapsed()
    );
    r
}

fn check_header(b: &[u8]) -> Result<(), TestCaseError> {
    let h = timed("Header::decode", || Header::decode(b));
    if let Some(h) = h {
        prop_assert!(b.len() >= HEADER_BYTES);
        let again = Header::decode(&h.encode());
        prop_assert_eq!(again, Some(h), "decode(encode(h)) != h");
        let _ = format!("{h:?}");
    }
    Ok(())
}

fn check_selection(s: &str) -> Result<(), TestCaseError> {
    timed("Selection::parse", || {
        if let Ok(sel) = Selection::<Algo>::parse(s) {
            for k in CollKind::ALL {
                let allowed = sel.allowed(k);
                for a in &allowed {
                    assert!(sel.allows(k, *a));
                }
            }
            let _ = sel.is_all();
        }
        if let Ok(sel) = Selection::<Proto>::parse(s) {
            for k in CollKind::ALL {
                let _ = sel.allowed(k);
            }
        }
    });
    Ok(())
}

/// Loads `env` and `files`, then reads every value back through its typed getter.
fn load(env: &[(String, String)], files: &[(String, String)]) -> Result<(), TestCaseError> {
    let p = timed("Params::from_sources", || Params::from_sources(env, files));
    let p = match p {
        Ok(p) => p,
        Err(e) => return Err(TestCaseError::fail(format!("from_sources failed: {e}"))),
    };
    timed("reading the loaded parameters", || {
        for info in ALL {
            let _ = p.raw(info.name);
            let _ = p.source_of(info.name).to_string();
        }
        let _ = p.explicit();
        let _ = p.warnings();
        let log = LogConfig::from_params(&p);
        let _ = log.file_path("host", 1);
        let _ = p.get(&params::ALGO);
        let _ = p.get(&params::PROTO);
        let _ = p.get(&params::BUFFSIZE);
        let _ = p.get(&params::SOCKET_FAMILY);
        let _ = p.get(&params::SOCKET_IFNAME);
        let _ = p.get(&params::DEBUG_TIMESTAMP_FORMAT);
    });
    Ok(())
}

fn conf_line() -> impl Strategy<Value = String> {
    let name = prop_oneof![
        (0..ALL.len()).prop_map(|i| ALL[i].name.to_string()),
        "NCCL_[A-Z_]{0,12}".prop_map(|s| s),
        any::<String>(),
    ];
    let value = prop_oneof![any_text(), "[0-9]{0,20}[KMGTkmgt]?".prop_map(|s| s)];
    prop_oneof![
        (name, value, prop_oneof![Just("="), Just(" = "), Just("==")])
            .prop_map(|(n, v, eq)| format!("{n}{eq}{v}")),
        any_text(),
        Just("# comment".to_string()),
        Just(String::new()),
    ]
}

proptest! {
    #![proptest_config(config(2000))]

    #[test]
    fn header_decode_arbitrary(b in prop::collection::vec(any::<u8>(), 0..48)) {
        check_header(&b)?;
    }

    #[test]
    fn header_decode_mutated(i in 0..HEADER_SEEDS.len(), e in prop::collection::vec(edit(), 0..6)) {
        check_header(&apply(HEADER_SEEDS[i], &e))?;
    }

    #[test]
    fn header_decode_marked(mut b in prop::array::uniform24(any::<u8>())) {
        b[21] = 0x0c; // past the marker, so kind/dtype checks run
        check_header(&b)?;
    }
}

proptest! {
    #![proptest_config(config(600))]

    #[test]
    fn algo_proto_grammar(s in prop_oneof![any_text(), mutated_text(ALGO_SEEDS), mutated_text(PROTO_SEEDS)]) {
        check_selection(&s)?;
    }

    #[test]
    fn debug_values(s in prop_oneof![any_text(), mutated_text(SUBSYS_SEEDS)]) {
        timed("NCCL_DEBUG* parsers", || {
            let _ = Level::parse(&s);
            if let Ok(sub) = Subsys::parse_list(&s) {
                let _ = sub.intersects(Subsys::ALL);
            }
            if let Ok(ls) = LevelSet::parse_list(&s) {
                for l in Level::ALL {
                    let _ = ls.contains(l);
                }
            }
        });
    }

    #[test]
    fn file_and_timestamp_patterns(
        pat in any_text(),
        host in any::<String>(),
        pid in any::<u32>(),
        secs in any::<i64>(),
        nanos in any::<u32>(),
    ) {
        let path = timed("debug_file_path", || debug_file_path(&pat, &host, pid));
        prop_assert!(path.len() <= pat.len() * (host.len() + 10) + 16);
        let fmt = format!("{pat}%Y-%m-%d %H:%M:%S.%3f %j %a %b %e %s %9f %");
        let out = timed("strftime", || strftime(&fmt, secs, nanos));
        prop_assert!(!out.is_empty());
    }

    #[test]
    fn every_param_checker(i in 0..ALL.len(), v in prop_oneof![any_text(), "-?[0-9]{0,25}[KMGTkmgtB]{0,2}".prop_map(|s| s)]) {
        let info = &ALL[i];
        timed(info.name, || {
            let _ = info.check(&v);
            let _ = info.display_value(&v);
        });
    }

    #[test]
    fn env_pairs(env in prop::collection::vec(
        (prop_oneof![(0..ALL.len()).prop_map(|i| ALL[i].name.to_string()), "NCCL_[A-Z_]{0,10}".prop_map(|s| s), any::<String>()], any_text()),
        0..12,
    )) {
        load(&env, &[])?;
    }
}

proptest! {
    #![proptest_config(config(300))]

    #[test]
    fn conf_files_generated(lines in prop::collection::vec(conf_line(), 0..24), crlf in any::<bool>()) {
        let nl = if crlf { "\r\n" } else { "\n" };
        let text = lines.join(nl);
        load(&[], &[("/etc/nccl.conf".to_string(), text)])?;
    }

    #[test]
    fn conf_files_mutated(e in prop::collection::vec(edit(), 0..24), env_wins in any::<bool>()) {
        let text = String::from_utf8_lossy(&apply(CONF_SEED.as_bytes(), &e)).into_owned();
        let env = if env_wins {
            vec![("NCCL_DEBUG".to_string(), "WARN".to_string())]
        } else {
            Vec::new()
        };
        load(&env, &[("~/.nccl.conf".to_string(), text.clone()), ("/etc/nccl.conf".to_string(), text)])?;
    }

    #[test]
    fn conf_files_arbitrary(text in any::<String>()) {
        load(&[], &[("f".to_string(), text)])?;
    }
}

#[test]
fn seeds_parse() {
    for s in ALGO_SEEDS {
        Selection::<Algo>::parse(s).unwrap_or_else(|e| panic!("seed {s:?}: {e}"));
    }
    for s in PROTO_SEEDS {
        Selection::<Proto>::parse(s).unwrap_or_else(|e| panic!("seed {s:?}: {e}"));
    }
    for s in SUBSYS_SEEDS {
        Subsys::parse_list(s).unwrap_or_else(|e| panic!("seed {s:?}: {e}"));
    }
    for h in HEADER_SEEDS {
        assert!(Header::decode(h).is_some(), "header seed {h:?}");
    }
    let p = Params::from_sources::<&str, &str, &str, &str>(&[], &[("nccl.conf", CONF_SEED)])
        .expect("seed conf");
    assert_eq!(p.raw("NCCL_DEBUG"), Some("INFO"));
    assert_eq!(p.raw("NCCL_PROTO"), Some("^LL128"));
    assert!(
        p.warnings().iter().any(|w| w.contains("without '='")),
        "{:?}",
        p.warnings()
    );
}

/// Extreme times must not overflow the calendar arithmetic.
#[test]
fn strftime_extremes() {
    for s in [i64::MIN, i64::MIN + 1, -1, 0, i64::MAX - 1, i64::MAX] {
        let _ = strftime(
            "%Y %y %m %d %e %H %M %S %j %a %b %F %T %D %R %s %f",
            s,
            u32::MAX,
        );
    }
}

/// Regression (found by the coverage-guided `conf` target, seed
/// `fuzz/corpus/conf/slow_long_unknown_name.conf`): the "did you mean" search
/// computed the edit distance from every registry name to the whole of a long
/// unknown name or value (a 50 KB name took 2.3 s, 1 MiB would take about a
/// minute, in a release build), and repeated unknown names were looked up in
/// a list (quadratic). Each of these now loads in milliseconds in a release
/// build; 2 s leaves room for a loaded debug build. A name warned about once.
#[test]
fn long_unknown_names_and_values_load_quickly() {
    let slow_seed = include_str!("../../../fuzz/corpus/conf/slow_long_unknown_name.conf");
    let cases = [
        ("seed", slow_seed.to_string(), 1),
        ("long name", format!("NCCL_X{}=1\n", "A".repeat(200_000)), 1),
        (
            "long value",
            format!("NCCL_ALGO={}\n", "x".repeat(200_000)),
            1,
        ),
        (
            "bad items",
            format!("NCCL_ALGO={}\n", "rign,".repeat(4_000)),
            1,
        ),
        (
            "many names",
            (0..500)
                .map(|i| format!("NCCL_Q{i}=1\nNCCL_Q{i}=2\n"))
                .collect(),
            500,
        ),
    ];
    for (what, text, min_warnings) in cases {
        let t = Instant::now();
        let p = Params::from_sources(&[("NCCL_DEBUG", "WARN")], &[("/etc/nccl.conf", &text)])
            .expect("loads");
        let took = t.elapsed();
        assert!(took < Duration::from_secs(2), "{what}: {took:?}");
        assert!(
            p.warnings().len() >= min_warnings,
            "{what}: {:?}",
            p.warnings().len()
        );
        assert_eq!(p.raw("NCCL_DEBUG"), Some("WARN"), "{what}");
    }
}
