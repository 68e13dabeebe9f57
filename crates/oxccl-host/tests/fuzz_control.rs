//! Fuzz-style tests for the control connection's poison frames
//! (`transport/control.rs`): a peer in another process can write anything on
//! it. Arbitrary bytes, mutated frames from `fuzz/corpus/control/` and
//! oversized length fields, with and without the writer closing, must make
//! `PeerControl::check` return `Ok` (nothing complete yet) or a typed error,
//! never panic, never wait for more than the bytes that are there, and never
//! buffer past the frame limit. Poisons with arbitrary texts round-trip.

use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use oxccl_core::{Error, ErrorKind};
use oxccl_host::transport::control::MAX_POISON_TEXT;
use oxccl_host::transport::PeerControl;
use proptest::prelude::*;

const SEEDS: &[&[u8]] = &[
    include_bytes!("../../../fuzz/corpus/control/unhandled_cuda.bin"),
    include_bytes!("../../../fuzz/corpus/control/remote_empty.bin"),
];

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (b, _) = l.accept().expect("accept");
    (a, b)
}

/// What the reader saw: the first error (if any) and whether a second check repeats it.
fn feed(bytes: &[u8], close: bool) -> Option<Error> {
    let (mut w, r) = pair();
    let mut ctl = PeerControl::socket(3, r, "fuzz peer").expect("control");
    // Small writes are buffered by the kernel; no reader thread needed below 64 KiB.
    w.write_all(bytes).expect("write");
    if close {
        w.shutdown(Shutdown::Write).expect("shutdown");
    }
    let t = Instant::now();
    let mut got = None;
    // Loop until the bytes have arrived (loopback: immediately) and been judged.
    while t.elapsed() < Duration::from_millis(300) {
        match ctl.check() {
            Ok(()) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => {
                got = Some(e);
                break;
            }
        }
        if !close && t.elapsed() > Duration::from_millis(20) {
            break;
        }
    }
    if let Some(e) = &got {
        let again = ctl.check().expect_err("a failed control stays failed");
        assert_eq!(again.message(), e.message(), "sticky error");
    }
    drop(w);
    got
}

/// What the frame parser must conclude from `b` alone (None: needs more bytes).
fn judge(b: &[u8]) -> Option<Result<(u32, usize), ()>> {
    if b.len() < 12 {
        return None;
    }
    if b[..4] != *b"OXP1" {
        return Some(Err(()));
    }
    let kind = u32::from_le_bytes(b[4..8].try_into().expect("4"));
    let len = u32::from_le_bytes(b[8..12].try_into().expect("4")) as usize;
    if len > MAX_POISON_TEXT {
        return Some(Err(()));
    }
    if b.len() < 12 + len {
        return None;
    }
    Some(Ok((kind, len)))
}

fn check_case(b: &[u8], close: bool) -> Result<(), TestCaseError> {
    let t = Instant::now();
    let got = feed(b, close);
    prop_assert!(
        t.elapsed() < Duration::from_secs(1),
        "took {:?}",
        t.elapsed()
    );
    match (judge(b), got) {
        (Some(Ok((kind, _))), Some(e)) => {
            prop_assert!(e.message().starts_with("rank 3 reported: "), "{e}");
            let want = ErrorKind::from_code(kind as i32).unwrap_or(ErrorKind::Remote);
            prop_assert_eq!(e.kind(), want);
        }
        (Some(Err(())), Some(e)) => {
            prop_assert_eq!(e.kind(), ErrorKind::Remote);
            prop_assert!(e.message().contains("malformed"), "{e}");
        }
        (None, Some(e)) => {
            prop_assert!(close, "error without a complete frame or a close: {e}");
            prop_assert_eq!(e.kind(), ErrorKind::Remote);
        }
        (None, None) => prop_assert!(!close, "a closed connection was not noticed"),
        (Some(_), None) => prop_assert!(false, "a complete frame was not reported"),
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Edit {
    Set(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Truncate(usize),
    /// Overwrite the length field.
    Len(u32),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<usize>().prop_map(Edit::Remove),
        any::<usize>().prop_map(Edit::Truncate),
        prop_oneof![
            Just(u32::MAX),
            Just(0x8000_0000),
            Just(MAX_POISON_TEXT as u32),
            Just(MAX_POISON_TEXT as u32 + 1),
            0u32..64,
        ]
        .prop_map(Edit::Len),
    ]
}

fn apply(seed: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for e in edits {
        let n = v.len();
        match *e {
            Edit::Set(i, b) if n > 0 => v[i % n] = b,
            Edit::Insert(i, b) => v.insert(i % (n + 1), b),
            Edit::Remove(i) if n > 0 => {
                v.remove(i % n);
            }
            Edit::Truncate(i) => v.truncate(i % (n + 1)),
            Edit::Len(l) if n >= 12 => v[8..12].copy_from_slice(&l.to_le_bytes()),
            _ => {}
        }
    }
    v
}

proptest! {
    #![proptest_config(config(250))]

    #[test]
    fn arbitrary_bytes(b in prop::collection::vec(any::<u8>(), 0..64), close in any::<bool>()) {
        check_case(&b, close)?;
    }

    #[test]
    fn magic_then_arbitrary(tail in prop::collection::vec(any::<u8>(), 0..40), close in any::<bool>()) {
        let b = [&b"OXP1"[..], &tail].concat();
        check_case(&b, close)?;
    }

    #[test]
    fn mutated_frames(i in 0..SEEDS.len(), e in prop::collection::vec(edit(), 0..5), close in any::<bool>()) {
        check_case(&apply(SEEDS[i], &e), close)?;
    }

    #[test]
    fn long_texts(kind in any::<u32>(), len in (MAX_POISON_TEXT - 8)..(MAX_POISON_TEXT + 8), fill in any::<u8>(), extra in 0usize..600, close in any::<bool>()) {
        // Non-UTF-8 text is accepted lossily; text past the limit is refused.
        let mut b = b"OXP1".to_vec();
        b.extend_from_slice(&kind.to_le_bytes());
        b.extend_from_slice(&(len as u32).to_le_bytes());
        b.extend(std::iter::repeat_n(fill, len.min(MAX_POISON_TEXT) + extra));
        check_case(&b, close)?;
    }

    #[test]
    fn poison_round_trip(k in 0..ErrorKind::ALL.len(), text in ".{0,64}", repeat in 0usize..200) {
        let msg = text.repeat(repeat.max(1));
        let (a, b) = pair();
        let mut tx = PeerControl::socket(1, a, "tx").expect("control");
        let mut rx = PeerControl::socket(0, b, "rx").expect("control");
        let kind = ErrorKind::ALL[k];
        tx.poison(&Error::new(kind, msg.clone()));
        let t = Instant::now();
        let e = loop {
            match rx.check() {
                Err(e) => break e,
                Ok(()) => {
                    prop_assert!(t.elapsed() < Duration::from_secs(1), "poison never arrived");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        };
        prop_assert_eq!(e.kind(), kind);
        let Some(body) = e.message().strip_prefix("rank 0 reported: ") else {
            return Err(TestCaseError::fail(format!("no prefix: {e:?}")));
        };
        prop_assert!(body.len() <= MAX_POISON_TEXT);
        prop_assert!(msg.starts_with(body), "text cut at a char boundary");
        prop_assert!(msg.len() <= MAX_POISON_TEXT || body.len() + 4 > MAX_POISON_TEXT);
    }
}

/// A peer that sends a header promising 4 GiB is refused from the 12 header bytes.
#[test]
fn four_gib_length_refused_without_waiting() {
    let mut b = b"OXP1".to_vec();
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&u32::MAX.to_le_bytes());
    let e = feed(&b, false).expect("refused while the connection is open");
    assert!(e.message().contains("malformed"), "{e}");
    assert!(e.message().contains("over 4096"), "{e}");
}

/// A peer that trickles a valid frame byte by byte is read without loss.
#[test]
fn trickled_frame() {
    let (mut w, r) = pair();
    let mut ctl = PeerControl::socket(2, r, "").expect("control");
    for &byte in SEEDS[0] {
        ctl.check().expect("incomplete frame is not an error");
        w.write_all(&[byte]).unwrap();
        std::thread::sleep(Duration::from_micros(200));
    }
    let t = Instant::now();
    let e = loop {
        if let Err(e) = ctl.check() {
            break e;
        }
        assert!(t.elapsed() < Duration::from_secs(1));
    };
    assert_eq!(
        e.message(),
        "rank 2 reported: rank 1 reported: NCCL WARN timeout"
    );
}
