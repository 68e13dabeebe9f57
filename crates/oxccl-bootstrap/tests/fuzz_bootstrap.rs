//! Fuzz-style tests for the bootstrap's parsers of outside input.
//!
//! - `UniqueId::from_bytes` (ids come from other processes), `parse_comm_id`
//!   (`NCCL_COMM_ID`), `IfSpec::parse`/`ifname::select` (`NCCL_SOCKET_IFNAME`),
//!   `Family::from_str` (`NCCL_SOCKET_FAMILY`): arbitrary input and mutated
//!   seeds from `fuzz/corpus/` give a value or a typed error, never a panic.
//! - The wire (`wire.rs`, `root.rs`'s join, a rank listener's hello): the
//!   decoders are private, so they are reached over real sockets. A raw client
//!   sends garbage, truncated handshakes, oversized length prefixes and
//!   malformed frames (after authenticating with the id's secret, so the frame
//!   parsers really run) to a root from `UniqueId::generate` and to the ranks'
//!   listeners, while two real ranks init and then talk: they must complete,
//!   and the root must drop each bad connection promptly (a 4 GiB length is
//!   refused without waiting for, or allocating, 4 GiB).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use oxccl_bootstrap::id::parse_comm_id;
use oxccl_bootstrap::ifname::{self, IfSpec, Interface};
use oxccl_bootstrap::{Bootstrap, BootstrapConfig, Family, UniqueId, UNIQUE_ID_BYTES};
use proptest::prelude::*;
use sha2::Sha256;

const ID_SEEDS: &[&[u8]] = &[
    include_bytes!("../../../fuzz/corpus/unique_id/ipv4.bin"),
    include_bytes!("../../../fuzz/corpus/unique_id/ipv6_comm_id.bin"),
];
const COMM_ID_SEEDS: &[&str] = &[
    include_str!("../../../fuzz/corpus/comm_id/ipv4.txt"),
    include_str!("../../../fuzz/corpus/comm_id/ipv6.txt"),
    include_str!("../../../fuzz/corpus/comm_id/ipv6_scoped.txt"),
    include_str!("../../../fuzz/corpus/comm_id/host.txt"),
    include_str!("../../../fuzz/corpus/comm_id/spaces.txt"),
];
const IFNAME_SEEDS: &[&str] = &[
    include_str!("../../../fuzz/corpus/ifname/prefix.txt"),
    include_str!("../../../fuzz/corpus/ifname/exact.txt"),
    include_str!("../../../fuzz/corpus/ifname/exclude.txt"),
    include_str!("../../../fuzz/corpus/ifname/exclude_exact.txt"),
    include_str!("../../../fuzz/corpus/ifname/empty.txt"),
];
/// Frames as the bootstrap writes them (payload only, without the length).
const FRAME_SEEDS: &[&[u8]] = &[
    include_bytes!("../../../fuzz/corpus/bootstrap_frames/join_rank0_v4.bin"),
    include_bytes!("../../../fuzz/corpus/bootstrap_frames/join_rank1_v6.bin"),
    include_bytes!("../../../fuzz/corpus/bootstrap_frames/table_2.bin"),
    include_bytes!("../../../fuzz/corpus/bootstrap_frames/error.bin"),
    include_bytes!("../../../fuzz/corpus/bootstrap_frames/hello.bin"),
    include_bytes!("../../../fuzz/corpus/bootstrap_frames/msg.bin"),
];

const CASE_LIMIT: Duration = Duration::from_secs(2);

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

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
        Just(0x80),
        Just(4),
        Just(6),
        Just(b':'),
        Just(b'['),
        Just(b']'),
        Just(b','),
        Just(b'^'),
        Just(b'='),
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

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    assert!(t.elapsed() < CASE_LIMIT, "{what} took {:?}", t.elapsed());
    r
}

fn check_id(b: &[u8; UNIQUE_ID_BYTES]) {
    if let Ok(id) = timed("UniqueId::from_bytes", || UniqueId::from_bytes(b)) {
        assert_eq!(id.as_bytes(), b);
        let _ = id.root_addr();
        let _ = id.run_id();
        let _ = id.rank0_starts_root();
        let shown = format!("{id:?}");
        assert!(shown.contains("redacted"), "{shown}");
    }
}

/// Whether `parse_comm_id` would ask the resolver about `s` (kept out of the
/// fuzzing: a DNS query can take seconds; `localhost` comes from /etc/hosts).
fn would_resolve(s: &str) -> bool {
    let t = s.trim();
    let (host, port) = if let Some(r) = t.strip_prefix('[') {
        match r.split_once("]:") {
            Some(x) => x,
            None => return false,
        }
    } else {
        match t.rsplit_once(':') {
            Some(x) => x,
            None => return false,
        }
    };
    !host.is_empty()
        && host != "localhost"
        && host.parse::<std::net::IpAddr>().is_err()
        && port.parse::<u16>().is_ok_and(|p| p != 0)
}

fn comm_id_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        (0..COMM_ID_SEEDS.len(), prop::collection::vec(edit(), 0..6)).prop_map(|(i, e)| {
            String::from_utf8_lossy(&apply(COMM_ID_SEEDS[i].as_bytes(), &e)).into_owned()
        }),
        (
            "[0-9.]{0,16}|\\[[0-9a-fA-F:%.a-z]{0,40}\\]?",
            prop_oneof![Just(":"), Just("]:"), Just("")],
            "[0-9]{0,7}|-1|\\+5|0x10"
        )
            .prop_map(|(h, c, p)| format!("{h}{c}{p}")),
    ]
}

fn iface() -> impl Strategy<Value = Interface> {
    (
        "[a-z]{1,3}[0-9]?",
        any::<[u8; 4]>(),
        any::<[u8; 16]>(),
        any::<bool>(),
        any::<u32>(),
        any::<bool>(),
    )
        .prop_map(|(name, v4, v6, is6, scope, up)| Interface {
            name,
            addr: if is6 {
                std::net::IpAddr::from(v6)
            } else {
                std::net::IpAddr::from(v4)
            },
            scope_id: if is6 { scope } else { 0 },
            up,
        })
}

fn ifname_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[\\^=]{0,2}([a-z]{0,4}[0-9]?[, ]{0,2}){0,5}".prop_map(|s| s),
        (0..IFNAME_SEEDS.len(), prop::collection::vec(edit(), 0..6)).prop_map(|(i, e)| {
            String::from_utf8_lossy(&apply(IFNAME_SEEDS[i].as_bytes(), &e)).into_owned()
        }),
    ]
}

proptest! {
    #![proptest_config(config(1500))]

    #[test]
    fn unique_id_arbitrary(b in prop::collection::vec(any::<u8>(), UNIQUE_ID_BYTES)) {
        check_id(&b.try_into().expect("128 bytes"));
    }

    #[test]
    fn unique_id_mutated(i in 0..ID_SEEDS.len(), e in prop::collection::vec(
        (0..UNIQUE_ID_BYTES, prop_oneof![Just(0u8), Just(0xff), Just(1), Just(4), Just(6), any::<u8>()]), 0..6)
    ) {
        let mut b: [u8; UNIQUE_ID_BYTES] = ID_SEEDS[i].try_into().expect("seed is 128 bytes");
        for (pos, v) in e {
            b[pos] = v;
        }
        check_id(&b);
    }
}

proptest! {
    #![proptest_config(config(800))]

    #[test]
    fn comm_id_grammar(s in comm_id_text(), fam in prop_oneof![Just(None), Just(Some(Family::V4)), Just(Some(Family::V6))]) {
        prop_assume!(!would_resolve(&s));
        match timed("parse_comm_id", || parse_comm_id(&s, fam)) {
            Ok(a) => {
                prop_assert_ne!(a.port(), 0);
                match fam {
                    Some(Family::V4) => prop_assert!(a.is_ipv4()),
                    Some(Family::V6) => prop_assert!(a.is_ipv6()),
                    None => {}
                }
            }
            Err(e) => prop_assert!(e.message().contains("NCCL_COMM_ID"), "{e}"),
        }
    }

    #[test]
    fn ifname_grammar(s in ifname_text(), ifaces in prop::collection::vec(iface(), 0..6), fam in prop_oneof![Just(None), Just(Some(Family::V4)), Just(Some(Family::V6))]) {
        let spec = timed("IfSpec::parse", || IfSpec::parse(&s));
        prop_assert!(spec.items.iter().all(|n| !n.is_empty() && n.trim() == n));
        for f in &ifaces {
            let _ = spec.allows(&f.name);
        }
        let _ = ifname::describe(&ifaces);
        if let Ok(sel) = timed("ifname::select", || ifname::select(&ifaces, Some(&s), fam)) {
            prop_assert!(ifaces.contains(&sel.iface));
            prop_assert!(sel.iface.up);
            prop_assert!(spec.allows(&sel.iface.name));
        }
    }

    #[test]
    fn family_values(s in prop_oneof![any::<String>(), "(af_)?inet6?|ipv[46]|[46]| AF_INET6 ".prop_map(|s| s)]) {
        let _ = timed("Family::from_str", || Family::from_str(&s));
    }
}

#[test]
fn seeds_are_valid() {
    for b in ID_SEEDS {
        UniqueId::from_bytes(&(*b).try_into().unwrap()).expect("id seed");
    }
    for s in COMM_ID_SEEDS {
        parse_comm_id(s, None).unwrap_or_else(|e| panic!("{s}: {e}"));
    }
}

// ---------------------------------------------------------------------------
// Real sockets.

const MAGIC: &[u8; 8] = b"OXCCLBS1";

fn proof(key: &[u8], role: u8, theirs: &[u8], mine: &[u8]) -> Vec<u8> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("any key length");
    m.update(b"oxccl-v1");
    m.update(&[role]);
    m.update(theirs);
    m.update(mine);
    m.finalize().into_bytes().to_vec()
}

fn connect(addr: SocketAddr) -> Option<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(3))).ok()?;
    Some(s)
}

/// Connects and completes the client side of the handshake with `key`.
fn authed(addr: SocketAddr, key: &[u8]) -> Option<TcpStream> {
    let mut s = connect(addr)?;
    let nc = [0x5au8; 32];
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&nc);
    s.write_all(&hello).ok()?;
    let mut reply = [0u8; 40];
    s.read_exact(&mut reply).ok()?;
    assert_eq!(&reply[..8], MAGIC, "server speaks the handshake");
    s.write_all(&proof(key, b'C', &reply[8..], &nc)).ok()?;
    let mut theirs = [0u8; 32];
    s.read_exact(&mut theirs).ok()?;
    assert_eq!(
        theirs.to_vec(),
        proof(key, b'S', &nc, &reply[8..]),
        "server proves the same key"
    );
    Some(s)
}

/// Waits for the server to close `s`: true if it did within the read timeout.
fn closed_by_server(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 256];
    let t = Instant::now();
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue, // e.g. an error frame before the close
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) if t.elapsed() < Duration::from_secs(3) => continue,
            Err(_) => return false,
        }
    }
}

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(payload);
    f
}

/// A deterministic byte generator for the attack loop.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Every malformed post-handshake payload the attacks send: random bytes and
/// each frame seed with a random edit (a join whose run id, rank or family
/// went bad; truncated; trailing bytes; a non-UTF-8 host name).
fn bad_payloads(rng: &mut Rng, n: usize) -> Vec<Vec<u8>> {
    let mut v = vec![
        Vec::new(),
        vec![1],
        FRAME_SEEDS[0][..FRAME_SEEDS[0].len() - 1].to_vec(),
        [FRAME_SEEDS[0], &[0u8][..]].concat(),
    ];
    let mut bad_utf8 = FRAME_SEEDS[0].to_vec();
    bad_utf8[27] = 0xff; // first byte of the host name
    v.push(bad_utf8);
    let mut bad_family = FRAME_SEEDS[0].to_vec();
    let fam_at = bad_family.len() - 23;
    bad_family[fam_at] = 9;
    v.push(bad_family);
    for i in 0..n {
        let len = (rng.next() % 300) as usize;
        if i % 2 == 0 {
            v.push(rng.bytes(len));
        } else {
            let seed = FRAME_SEEDS[i % FRAME_SEEDS.len()];
            let mut b = seed.to_vec();
            let at = rng.next() as usize % b.len();
            b[at] ^= (rng.next() as u8) | 1;
            if rng.next() % 3 == 0 {
                b.truncate(rng.next() as usize % b.len());
            }
            v.push(b);
        }
    }
    v
}

fn cfg() -> BootstrapConfig {
    BootstrapConfig {
        ifname: Some("lo".into()),
        init_timeout: Duration::from_secs(20),
        timeout: Duration::from_secs(20),
        ..Default::default()
    }
}

/// The root of a generated id and its key (the id carries the secret at 48..80).
fn root_and_key(id: &UniqueId) -> (SocketAddr, Vec<u8>) {
    (id.root_addr(), id.as_bytes()[48..80].to_vec())
}

/// Attacks the root with assertions on each drop, while it is waiting for
/// ranks; then two ranks join while a second client keeps sending garbage.
#[test]
fn root_survives_garbage_while_ranks_init() {
    let t0 = Instant::now();
    let c = cfg();
    let id = UniqueId::generate(&c).expect("generate");
    let (root, key) = root_and_key(&id);
    let mut rng = Rng(7);

    // 1. Before any rank: each attack must be dropped promptly.
    // Random bytes instead of the handshake magic.
    for n in [0usize, 1, 7, 39, 40, 41, 300] {
        let mut s = connect(root).expect("root listens");
        let _ = s.write_all(&rng.bytes(n));
        if n >= 40 {
            assert!(closed_by_server(&mut s), "{n} garbage bytes: not dropped");
        }
    }
    // The magic, a nonce, then a wrong proof.
    {
        let mut s = connect(root).unwrap();
        let mut h = MAGIC.to_vec();
        h.extend_from_slice(&[1; 32]);
        s.write_all(&h).unwrap();
        let mut reply = [0u8; 40];
        s.read_exact(&mut reply).unwrap();
        s.write_all(&[0u8; 32]).unwrap();
        assert!(closed_by_server(&mut s), "a wrong proof was not rejected");
    }
    // Truncated handshake, then close.
    {
        let mut s = connect(root).unwrap();
        s.write_all(&MAGIC[..5]).unwrap();
    }
    // Authenticated, then a 4 GiB length prefix: refused at once (no 4 GiB read or allocation).
    for len in [u32::MAX, 0x8000_0000, (4 << 10) + 1, 64 << 20] {
        let mut s = authed(root, &key).expect("handshake with the right key");
        let t = Instant::now();
        s.write_all(&len.to_le_bytes()).unwrap();
        assert!(closed_by_server(&mut s), "length {len}: not dropped");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "length {len}: dropped only after {:?}",
            t.elapsed()
        );
    }
    // Authenticated, a length at the cap but the frame cut short.
    {
        let mut s = authed(root, &key).unwrap();
        let mut f = (4096u32).to_le_bytes().to_vec();
        f.extend_from_slice(&rng.bytes(100));
        s.write_all(&f).unwrap();
    }
    // Authenticated, malformed joins: each dropped.
    for p in bad_payloads(&mut rng, 40) {
        let mut s = authed(root, &key).unwrap();
        s.write_all(&frame(&p)).unwrap();
        assert!(closed_by_server(&mut s), "payload {p:02x?}: not dropped");
    }
    // A well-formed join of another run: refused with an error frame, the rendezvous goes on.
    {
        let mut s = authed(root, &key).unwrap();
        let mut j = FRAME_SEEDS[0].to_vec();
        j[5..13].copy_from_slice(&(id.run_id() ^ 1).to_le_bytes());
        s.write_all(&frame(&j)).unwrap();
        let mut len = [0u8; 4];
        s.read_exact(&mut len).expect("an error frame");
        let n = u32::from_le_bytes(len) as usize;
        assert!(n < 4096, "error frame of {n} bytes");
        let mut body = vec![0u8; n];
        s.read_exact(&mut body).expect("the error frame's body");
        assert_eq!(body[0], 3, "T_ERROR");
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains("another run"), "{text}");
        assert!(closed_by_server(&mut s), "a join of another run was kept");
    }

    // 2. Two ranks init and talk while garbage keeps coming.
    let stop = Arc::new(AtomicBool::new(false));
    let spam = {
        let (stop, key) = (stop.clone(), key.clone());
        std::thread::spawn(move || {
            let mut rng = Rng(99);
            let mut sent = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let payloads = bad_payloads(&mut rng, 4);
                let p = &payloads[rng.next() as usize % payloads.len()];
                let ok = match rng.next() % 4 {
                    0 => connect(root).and_then(|mut s| s.write_all(&rng.bytes(64)).ok()),
                    1 => authed(root, &key)
                        .and_then(|mut s| s.write_all(&u32::MAX.to_le_bytes()).ok()),
                    _ => authed(root, &key).and_then(|mut s| s.write_all(&frame(p)).ok()),
                };
                sent += u32::from(ok.is_some());
                std::thread::sleep(Duration::from_millis(5));
            }
            sent
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let (id, c) = (&id, &c);
                s.spawn(move || Bootstrap::init(id, 2, r, c))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    });
    stop.store(true, Ordering::Relaxed);
    let sent = spam.join().expect("spam thread");
    let boots: Vec<Bootstrap> = results
        .into_iter()
        .enumerate()
        .map(|(r, b)| b.unwrap_or_else(|e| panic!("rank {r} init failed under garbage: {e}")))
        .collect();
    assert!(sent > 0, "the garbage client never got through to the root");

    // 3. Garbage at the ranks' own listeners, then the ranks still talk.
    let listeners: Vec<SocketAddr> = boots[0].peers().iter().map(|p| p.listen_addr).collect();
    for (i, &addr) in listeners.iter().enumerate() {
        for p in bad_payloads(&mut rng, 20) {
            if let Some(mut s) = connect(addr) {
                let _ = s.write_all(&rng.bytes(48));
            }
            if let Some(mut s) = authed(addr, &key) {
                s.write_all(&frame(&p)).unwrap();
                assert!(
                    closed_by_server(&mut s),
                    "rank {i} kept a connection with hello {p:02x?}"
                );
            }
        }
        let mut s = authed(addr, &key).unwrap();
        s.write_all(&u32::MAX.to_le_bytes()).unwrap();
        assert!(
            closed_by_server(&mut s),
            "rank {i}: 4 GiB hello not dropped"
        );
    }
    std::thread::scope(|s| {
        for b in &boots {
            s.spawn(move || {
                let all = b.allgather(&[b.rank() as u8; 3]).expect("allgather");
                assert_eq!(all, vec![vec![0u8; 3], vec![1u8; 3]]);
                b.barrier().expect("barrier");
                let peer = 1 - b.rank();
                b.send(peer, 5, b"after the garbage").expect("send");
                assert_eq!(b.recv(peer, 5).expect("recv"), b"after the garbage");
            });
        }
    });
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t0.elapsed()
    );
}

/// Ranks send their init timeout in the join (`root.rs`, `coordinate`): a
/// rank arriving after the first with `init_timeout = Duration::MAX` ("wait
/// forever", sent as `u64::MAX` ms) must not break the root's deadline
/// arithmetic (`Instant + u64::MAX ms` still fits). Both ranks complete; the
/// patient one is aborted after 10 s if the rendezvous ever stalls.
#[test]
fn late_rank_with_endless_init_timeout() {
    let c = BootstrapConfig {
        init_timeout: Duration::from_secs(5),
        ..cfg()
    };
    let id = UniqueId::generate(&c).expect("generate");
    let patient = BootstrapConfig {
        init_timeout: Duration::MAX,
        abort: Arc::new(AtomicBool::new(false)),
        ..cfg()
    };
    let abort = patient.abort.clone();
    let t = Instant::now();
    let (r0, r1) = std::thread::scope(|s| {
        let h0 = s.spawn(|| Bootstrap::init(&id, 2, 0, &c));
        std::thread::sleep(Duration::from_millis(300));
        let h1 = s.spawn(|| Bootstrap::init(&id, 2, 1, &patient));
        let watchdog = s.spawn(|| {
            while t.elapsed() < Duration::from_secs(10) && !h1.is_finished() {
                std::thread::sleep(Duration::from_millis(50));
            }
            abort.store(true, Ordering::Relaxed);
            h1.join().expect("rank 1")
        });
        (
            h0.join().expect("rank 0"),
            watchdog.join().expect("watchdog"),
        )
    });
    let took = t.elapsed();
    assert!(r0.is_ok(), "rank 0: {:?}", r0.err());
    assert!(r1.is_ok(), "rank 1: {:?}", r1.err());
    assert!(took < Duration::from_secs(5), "took {took:?}");
}
