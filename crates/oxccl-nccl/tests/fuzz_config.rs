//! Fuzz-style test for `ncclConfig_t` reading (`src/config.rs`), through its
//! public entry `ncclCommInitRankConfig` on one-rank communicators: random
//! `size`, `magic`, `version` and field values (the two pointer fields are
//! NULL or a valid string, as NCCL's contract requires) must give
//! `ncclSuccess`/`ncclInProgress` and a working communicator, or an error
//! code with no communicator; never a crash, and each case within seconds.

use nccl::abi::*;
use nccl::*;
use proptest::prelude::*;
use std::ffi::{c_int, CString};
use std::time::{Duration, Instant};

/// Room for the longest layout the library reads (96 bytes) and more.
#[repr(C, align(8))]
struct Buf([u8; 128]);

const NET_NAME_AT: usize = 32;
const COMM_NAME_AT: usize = 48;

fn int_value() -> impl Strategy<Value = c_int> {
    prop_oneof![
        Just(NCCL_CONFIG_UNDEF_INT),
        Just(0),
        Just(1),
        Just(2),
        Just(-1),
        Just(64),
        Just(c_int::MAX),
        any::<c_int>(),
    ]
}

fn version() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(NCCL_VERSION_CODE as u32),
        Just(21_300),
        Just(21_400),
        Just(21_700),
        Just(21_800),
        Just(22_500),
        Just(22_700),
        Just(22_800),
        Just(22_900),
        Just(23_000),
        Just(23_005),
        Just(u32::MAX),
        any::<u32>(),
    ]
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(72usize),
        Just(96),
        Just(0),
        Just(11),
        Just(16),
        Just(40),
        Just(usize::MAX),
        0usize..200,
    ]
}

#[derive(Debug, Clone)]
struct Case {
    size: usize,
    magic: u32,
    version: u32,
    /// The 18 int fields of the 96-byte layout, in order, skipping the pointers.
    ints: Vec<c_int>,
    /// Random bytes for everything past the 96-byte layout.
    tail: Vec<u8>,
    comm_name: Option<String>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        size(),
        prop_oneof![4 => Just(NCCL_API_MAGIC), 1 => any::<u32>()],
        version(),
        prop::collection::vec(int_value(), 18),
        prop::collection::vec(any::<u8>(), 32),
        prop::option::of("[ -~]{0,40}"),
    )
        .prop_map(|(size, magic, version, ints, tail, comm_name)| Case {
            size,
            magic,
            version,
            ints,
            tail,
            comm_name,
        })
}

/// Byte offsets of the int fields after the header (pointers at 32 and 48).
const INT_AT: [usize; 18] = [
    16, 20, 24, 28, 40, 44, 56, 60, 64, 68, 72, 76, 80, 84, 88, 92, 96, 100,
];

fn build(c: &Case, name: Option<&CString>) -> Buf {
    let mut b = Buf([0u8; 128]);
    b.0[96..128].copy_from_slice(&c.tail);
    b.0[0..8].copy_from_slice(&c.size.to_ne_bytes());
    b.0[8..12].copy_from_slice(&c.magic.to_ne_bytes());
    b.0[12..16].copy_from_slice(&c.version.to_ne_bytes());
    for (at, v) in INT_AT.iter().zip(&c.ints) {
        // The last two land past the layout: harmless extra bytes.
        b.0[*at..*at + 4].copy_from_slice(&v.to_ne_bytes());
    }
    b.0[NET_NAME_AT..NET_NAME_AT + 8].copy_from_slice(&0usize.to_ne_bytes());
    let p = name.map_or(0usize, |s| s.as_ptr() as usize);
    b.0[COMM_NAME_AT..COMM_NAME_AT + 8].copy_from_slice(&p.to_ne_bytes());
    b
}

fn run(c: &Case) -> Result<(), TestCaseError> {
    let name = c
        .comm_name
        .as_ref()
        .map(|s| CString::new(s.as_str()).expect("no NUL in [ -~]"));
    let mut buf = build(c, name.as_ref());
    let t = Instant::now();
    let mut id = ncclUniqueId::default();
    let mut comm: ncclComm_t = std::ptr::null_mut();
    // SAFETY: valid output pointers; `buf` holds 128 readable bytes, more than
    // the library reads whatever `size` says; its pointer fields are NULL or a
    // live NUL-terminated string.
    let r = unsafe {
        prop_assert_eq!(ncclGetUniqueId(&mut id), ncclSuccess);
        ncclCommInitRankConfig(
            &mut comm,
            1,
            id,
            0,
            buf.0.as_mut_ptr().cast::<ncclConfig_t>(),
        )
    };
    if r == ncclSuccess || r == ncclInProgress {
        prop_assert!(!comm.is_null());
        let mut state = r;
        while state == ncclInProgress {
            prop_assert!(t.elapsed() < Duration::from_secs(10), "init never finished");
            std::thread::sleep(Duration::from_millis(1));
            prop_assert_eq!(
                // SAFETY: a live communicator.
                unsafe { ncclCommGetAsyncError(comm, &mut state) },
                ncclSuccess
            );
        }
        prop_assert_eq!(state, ncclSuccess);
        let mut n: c_int = 0;
        // SAFETY: a live communicator, valid output pointer.
        unsafe {
            prop_assert_eq!(ncclCommCount(comm, &mut n), ncclSuccess);
            prop_assert_eq!(n, 1);
            prop_assert_eq!(ncclCommDestroy(comm), ncclSuccess);
        }
    } else {
        prop_assert!(
            r == ncclInvalidArgument || r == ncclInvalidUsage,
            "unexpected code {r}"
        );
    }
    prop_assert!(
        t.elapsed() < Duration::from_secs(10),
        "one init took {:?}",
        t.elapsed()
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_configs(c in case()) {
        run(&c)?;
    }

    #[test]
    fn valid_header_random_fields(ints in prop::collection::vec(int_value(), 18), v in version(), name in prop::option::of("[ -~]{0,40}")) {
        run(&Case { size: 96, magic: NCCL_API_MAGIC, version: v, ints, tail: vec![0; 32], comm_name: name })?;
    }
}

/// The largest CTA counts the validation lets through must not make init
/// allocate per channel or hang.
#[test]
fn huge_cta_counts() {
    let mut ints = vec![NCCL_CONFIG_UNDEF_INT; 18];
    ints[2] = c_int::MAX; // minCTAs
    ints[3] = c_int::MAX; // maxCTAs
    run(&Case {
        size: 72,
        magic: NCCL_API_MAGIC,
        version: NCCL_VERSION_CODE as u32,
        ints,
        tail: vec![0; 32],
        comm_name: Some("huge".into()),
    })
    .unwrap();
}
