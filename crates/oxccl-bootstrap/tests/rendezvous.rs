//! Real sockets on loopback, ranks as threads.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxccl_bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
use oxccl_core::ErrorKind;

fn cfg() -> BootstrapConfig {
    BootstrapConfig {
        ifname: Some("lo".into()),
        init_timeout: Duration::from_secs(10),
        timeout: Duration::from_secs(10),
        ..Default::default()
    }
}

/// Runs `f(rank, result of init)` on `n` threads.
fn ranks<T: Send>(
    id: &UniqueId,
    n: usize,
    which: &[usize],
    cfg: &BootstrapConfig,
    f: impl Fn(usize, oxccl_core::Result<Bootstrap>) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|s| {
        let hs: Vec<_> = which
            .iter()
            .map(|&r| {
                let f = &f;
                s.spawn(move || f(r, Bootstrap::init(id, n, r, cfg)))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn all(n: usize) -> Vec<usize> {
    (0..n).collect()
}

fn exercise(b: &Bootstrap) {
    let (n, r) = (b.nranks(), b.rank());
    assert_eq!(b.peers().len(), n);
    for (i, p) in b.peers().iter().enumerate() {
        assert_eq!(p.rank, i);
        assert!(p.listen_addr.ip().is_loopback());
        assert!(b.is_same_host(i) && b.is_same_process(i));
    }
    // Allgather of distinct payloads of distinct lengths, twice.
    for round in 0..2u8 {
        let mine = vec![r as u8 ^ round; r * 3 + 1];
        let got = b.allgather(&mine).unwrap();
        for (i, v) in got.iter().enumerate() {
            assert_eq!(v, &vec![i as u8 ^ round; i * 3 + 1]);
        }
    }
    // Tagged messages received out of order.
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    for tag in [1u32, 2, 3] {
        b.send(next, tag, format!("{r}->{next} tag {tag}").as_bytes())
            .unwrap();
    }
    b.send(next, 2, b"second on 2").unwrap();
    for tag in [3u32, 1, 2] {
        let m = b.recv(prev, tag).unwrap();
        assert_eq!(m, format!("{prev}->{r} tag {tag}").as_bytes());
    }
    assert_eq!(b.recv(prev, 2).unwrap(), b"second on 2");
    // Data connections: connect to next with tags 11 then 10; accept from prev 10 then 11.
    let c11 = b.connect_peer(next, 11).unwrap();
    let c10 = b.connect_peer(next, 10).unwrap();
    for (mut c, tag) in [(c11, 11u8), (c10, 10u8)] {
        c.write_all(&[r as u8, tag]).unwrap();
    }
    for tag in [10u8, 11] {
        let mut a = b.accept_peer(prev, tag as u32).unwrap();
        let mut buf = [0u8; 2];
        a.read_exact(&mut buf).unwrap();
        assert_eq!(buf, [prev as u8, tag]);
        assert!(a.nodelay().unwrap());
    }
    b.barrier().unwrap();
}

#[test]
fn init_and_collectives_1_2_3_8_ranks() {
    for n in [1, 2, 3, 8] {
        let c = cfg();
        let id = UniqueId::generate(&c).unwrap();
        assert_eq!(UniqueId::from_bytes(id.as_bytes()).unwrap(), id);
        ranks(&id, n, &all(n), &c, |_, b| exercise(&b.unwrap()));
    }
}

#[test]
fn comm_id_fixed_port() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut c = cfg();
    c.comm_id = Some(format!("127.0.0.1:{port}"));
    c.auth_secret = Some("s3cret".into());
    let n = 3;
    // Every process makes the same id on its own.
    let id = UniqueId::generate(&c).unwrap();
    assert!(id.rank0_starts_root());
    assert_eq!(id.root_addr().port(), port);
    ranks(&id, n, &all(n), &c, |_, b| {
        let b = b.unwrap();
        assert_eq!(UniqueId::generate(&c).unwrap(), id);
        let got = b.allgather(&[b.rank() as u8]).unwrap();
        assert_eq!(got, vec![vec![0], vec![1], vec![2]]);
    });
}

#[test]
fn missing_rank_times_out_naming_it() {
    let mut c = cfg();
    c.init_timeout = Duration::from_millis(1000);
    let id = UniqueId::generate(&c).unwrap();
    let t = Instant::now();
    let errs = ranks(&id, 3, &[0, 1], &c, |_, b| b.unwrap_err());
    let el = t.elapsed();
    assert!(el < Duration::from_millis(2500), "{el:?}");
    for e in errs {
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        assert!(
            e.message()
                .starts_with("bootstrap: rank 2 of 3 never connected to the root at 127.0.0.1:"),
            "{e}"
        );
        assert!(e.message().ends_with("within 1 s"), "{e}");
    }
}

/// A rank that joined and then went away before every rank had joined (its
/// init aborted here; a killed process closes its connection the same way)
/// is named to the ranks already waiting within a second, not at the 30 s
/// init timeout, and a rank that joins later hears the same at once.
#[test]
fn rank_that_leaves_after_joining_is_named_at_once() {
    let mut c = cfg();
    c.init_timeout = Duration::from_secs(30);
    let id = UniqueId::generate(&c).unwrap();
    let mut leaver = c.clone();
    leaver.abort = Arc::new(AtomicBool::new(false));
    let stop = leaver.abort.clone();
    let t = Instant::now();
    let (r0, r1, left_at) = std::thread::scope(|s| {
        let a = s.spawn(|| Bootstrap::init(&id, 3, 0, &c).map(drop));
        let b = s.spawn(|| Bootstrap::init(&id, 3, 1, &leaver).map(drop));
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        let left_at = t.elapsed();
        (a.join().unwrap(), b.join().unwrap(), left_at)
    });
    let el = t.elapsed();
    assert!(r1.is_err(), "the aborted rank's init succeeded");
    let e = r0.unwrap_err();
    assert!(
        el < left_at + Duration::from_secs(2),
        "rank 0 failed {el:?} after its start, the leaver left at {left_at:?}: {e}"
    );
    assert_eq!(e.kind(), ErrorKind::Remote, "{e}");
    assert!(
        e.message().contains("rank 1 of 3 (pid ")
            && e.message().contains("closed its connection to the root"),
        "{e}"
    );
    // The root still answers a latecomer with the same error.
    let t = Instant::now();
    let e = Bootstrap::init(&id, 3, 2, &c).map(drop).unwrap_err();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "{:?}: {e}",
        t.elapsed()
    );
    assert!(e.message().contains("rank 1 of 3 (pid "), "{e}");
}

#[test]
fn nranks_mismatch_reaches_every_rank() {
    let c = cfg();
    let id = UniqueId::generate(&c).unwrap();
    let errs = std::thread::scope(|s| {
        let a = s.spawn(|| Bootstrap::init(&id, 2, 0, &c).unwrap_err());
        let b = s.spawn(|| Bootstrap::init(&id, 3, 1, &c).unwrap_err());
        [a.join().unwrap(), b.join().unwrap()]
    });
    for e in errs {
        assert_eq!(e.kind(), ErrorKind::InvalidUsage, "{e}");
        assert!(e.message().contains("joined with nranks="), "{e}");
    }
}

#[test]
fn wrong_secret_is_another_run() {
    let c = cfg();
    let id = UniqueId::generate(&c).unwrap();
    let mut bytes = *id.as_bytes();
    bytes[60] ^= 1; // a secret byte
    let bad = UniqueId::from_bytes(&bytes).unwrap();
    let e = Bootstrap::init(&bad, 2, 1, &c).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidUsage);
    assert_eq!(
        e.message(),
        format!(
            "bootstrap: the root at {} did not accept this unique id (it belongs to another run?)",
            id.root_addr()
        )
    );
    // The real run is unaffected.
    ranks(&id, 2, &all(2), &c, |_, b| b.unwrap().barrier().unwrap());
}

#[test]
fn garbage_clients_do_not_stall_the_root() {
    let c = cfg();
    let id = UniqueId::generate(&c).unwrap();
    let root = id.root_addr();
    let mut silent = TcpStream::connect(root).unwrap();
    let mut garbage = TcpStream::connect(root).unwrap();
    garbage.write_all(&[0x5a; 200]).unwrap();
    let mut huge = TcpStream::connect(root).unwrap();
    huge.write_all(&[0xff; 4]).unwrap();
    let _ = silent.write_all(&[]);
    let t = Instant::now();
    ranks(&id, 2, &all(2), &c, |_, b| b.unwrap().barrier().unwrap());
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // The garbage connection was dropped by the root.
    garbage
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut buf = [0u8; 64];
    assert!(matches!(garbage.read(&mut buf), Ok(0) | Err(_)));
}

#[test]
fn abort_unblocks_recv() {
    let c = cfg();
    let id = UniqueId::generate(&c).unwrap();
    let mut c0 = c.clone();
    c0.abort = Arc::new(AtomicBool::new(false));
    let abort = c0.abort.clone();
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            let b = Bootstrap::init(&id, 2, 0, &c0).unwrap();
            b.barrier().unwrap();
            let t = Instant::now();
            let e = b.recv(1, 99).unwrap_err();
            (e, t.elapsed())
        });
        let b1 = Bootstrap::init(&id, 2, 1, &c).unwrap();
        b1.barrier().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let set_at = Instant::now();
        abort.store(true, Ordering::Relaxed);
        let (e, waited) = h.join().unwrap();
        assert_eq!(e.kind(), ErrorKind::Remote, "{e}");
        assert!(e.message().contains("aborted"), "{e}");
        assert!(waited >= Duration::from_millis(200));
        assert!(
            set_at.elapsed() < Duration::from_millis(150),
            "{:?}",
            set_at.elapsed()
        );
        drop(b1);
    });
}

#[test]
fn peer_exit_fails_recv_promptly() {
    let c = cfg();
    let id = UniqueId::generate(&c).unwrap();
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            let b = Bootstrap::init(&id, 2, 1, &c).unwrap();
            b.send(0, 1, b"bye").unwrap();
        });
        let b0 = Bootstrap::init(&id, 2, 0, &c).unwrap();
        h.join().unwrap();
        assert_eq!(b0.recv(1, 1).unwrap(), b"bye");
        let t = Instant::now();
        let e = b0.recv(1, 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Remote, "{e}");
        assert!(e.message().contains("rank 1 closed"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(1));
    });
}

#[test]
fn bad_arguments() {
    let c = cfg();
    let id = UniqueId::generate(&c).unwrap();
    let e = Bootstrap::init(&id, 4, 4, &c).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(
        e.message().contains("rank 4 is out of range for nranks=4"),
        "{e}"
    );
    let e = Bootstrap::init(&id, 0, 0, &c).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let mut c2 = cfg();
    c2.ifname = Some("nosuchif9".into());
    let e = UniqueId::generate(&c2).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(
        e.message()
            .starts_with("NCCL_SOCKET_IFNAME=nosuchif9 matches no interface"),
        "{e}"
    );
    assert!(e.message().contains("lo 127.0.0.1"), "{e}");
    // The root of `id` serves a 1-rank run so its thread ends.
    let b = Bootstrap::init(&id, 1, 0, &c).unwrap();
    let e = b.send(0, 1, &vec![0u8; (64 << 20) + 1]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert_eq!(b.recv(1, 0).unwrap_err().kind(), ErrorKind::InvalidArgument);
    assert!(!b.is_same_host(1));
}

#[test]
fn large_payloads_and_gone_peer() {
    let c = cfg();
    let id = UniqueId::generate(&c).unwrap();
    let (b0, b1) = std::thread::scope(|s| {
        let h = s.spawn(|| Bootstrap::init(&id, 2, 1, &c).unwrap());
        let b0 = Bootstrap::init(&id, 2, 0, &c).unwrap();
        (b0, h.join().unwrap())
    });
    let big: Vec<u8> = (0..(1usize << 20) + 3).map(|i| i as u8).collect();
    std::thread::scope(|s| {
        let h = s.spawn(|| b1.allgather(&big[1..]).unwrap());
        let g = b0.allgather(&big).unwrap();
        assert_eq!(g, h.join().unwrap());
        assert_eq!(g[0], big);
        assert_eq!(g[1], &big[1..]);
    });
    drop(b1);
    // A peer that is gone fails a connect at once instead of retrying until the timeout.
    let t = Instant::now();
    let e = b0.connect_peer(1, 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote, "{e}");
    assert!(t.elapsed() < Duration::from_secs(1));
}

#[test]
fn ipv6_loopback() {
    let mut c = cfg();
    c.family = Some(oxccl_bootstrap::Family::V6);
    let id =
        UniqueId::generate(&c).unwrap_or_else(|e| panic!("needs an IPv6 address on lo (::1): {e}"));
    assert!(id.root_addr().is_ipv6());
    ranks(&id, 2, &all(2), &c, |_, b| {
        let b = b.unwrap();
        assert!(b.peers()[1].listen_addr.is_ipv6());
        b.barrier().unwrap();
    });
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn from_bytes_never_panics(v in proptest::collection::vec(any::<u8>(), 128)) {
            let b: [u8; 128] = v.try_into().unwrap();
            let r = UniqueId::from_bytes(&b);
            if b[..8] != *b"OXCCLUID" {
                prop_assert_eq!(r.unwrap_err().kind(), ErrorKind::InvalidArgument);
            }
        }

        #[test]
        fn from_bytes_with_magic_never_panics(v in proptest::collection::vec(any::<u8>(), 120)) {
            let mut b = [0u8; 128];
            b[..8].copy_from_slice(b"OXCCLUID");
            b[8..].copy_from_slice(&v);
            if let Ok(id) = UniqueId::from_bytes(&b) {
                let _ = (id.root_addr(), id.run_id(), format!("{id:?}"));
            }
        }
    }
}

/// `OXCCL_BOOTSTRAP_IFNAME=lo` with data on another interface: the rendezvous
/// and messages stay on loopback, data connections arrive at the other
/// interface's address (a listener of their own).
#[test]
fn bootstrap_and_data_on_different_interfaces() {
    let other = oxccl_bootstrap::interfaces().ok().and_then(|l| {
        l.into_iter()
            .find(|f| f.up && f.addr.is_ipv4() && !f.addr.is_loopback())
    });
    let other = other.expect("needs an interface other than lo that is up with an IPv4 address");
    let c = BootstrapConfig {
        bootstrap_ifname: Some("=lo".into()),
        ifname: Some(format!("={}", other.name)),
        family: Some(oxccl_bootstrap::Family::V4),
        ..cfg()
    };
    let id = UniqueId::generate(&c).unwrap();
    assert!(id.root_addr().ip().is_loopback(), "{}", id.root_addr());
    ranks(&id, 3, &all(3), &c, |r, b| {
        let b = b.unwrap();
        for p in b.peers() {
            assert!(p.listen_addr.ip().is_loopback(), "{p:?}");
            assert_eq!(p.data_addr.ip(), other.addr, "{p:?}");
            assert_ne!(p.data_addr.port(), 0);
        }
        let (next, prev) = ((r + 1) % 3, (r + 2) % 3);
        b.send(next, 5, b"message").unwrap();
        assert_eq!(b.recv(prev, 5).unwrap(), b"message");
        let mut c = b.connect_peer(next, 3).unwrap();
        c.write_all(&[r as u8; 4]).unwrap();
        assert_eq!(c.peer_addr().unwrap(), b.peers()[next].data_addr);
        let mut a = b.accept_peer(prev, 3).unwrap();
        assert_eq!(a.local_addr().unwrap().ip(), other.addr);
        let mut buf = [0u8; 4];
        a.read_exact(&mut buf).unwrap();
        assert_eq!(buf, [prev as u8; 4]);
        b.barrier().unwrap();
    });
}

/// Both settings choosing one address share the rendezvous listener; a
/// bootstrap setting that matches nothing names itself.
#[test]
fn bootstrap_ifname_same_address_and_no_match() {
    let c = BootstrapConfig {
        bootstrap_ifname: Some("lo".into()),
        ..cfg()
    };
    let id = UniqueId::generate(&c).unwrap();
    ranks(&id, 2, &all(2), &c, |_, b| {
        let b = b.unwrap();
        for p in b.peers() {
            assert_eq!(p.data_addr, p.listen_addr);
        }
        b.barrier().unwrap();
    });
    let bad = BootstrapConfig {
        bootstrap_ifname: Some("=nosuchif0".into()),
        ..cfg()
    };
    let e = UniqueId::generate(&bad).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let m = e.message();
    assert!(
        m.contains("OXCCL_BOOTSTRAP_IFNAME==nosuchif0") && m.contains("matches no interface"),
        "{m}"
    );
    assert!(!m.contains("NCCL_SOCKET_IFNAME"), "{m}");
}

/// 320 ranks join one root at the same instant, five times the handshakes
/// the root takes at once: the rest wait in its accept queue (none is
/// closed and none that has authenticated is evicted), and every rank gets
/// the table and passes a barrier and a broadcast.
#[test]
fn ranks_past_the_handshake_bound_queue_at_the_root_and_all_join() {
    const N: usize = 320;
    let c = BootstrapConfig {
        init_timeout: Duration::from_secs(60),
        timeout: Duration::from_secs(60),
        ..cfg()
    };
    let id = UniqueId::generate(&c).unwrap();
    let start = std::sync::Barrier::new(N);
    let got = std::thread::scope(|s| {
        let hs: Vec<_> = (0..N)
            .map(|r| {
                let (id, c, start) = (&id, &c, &start);
                s.spawn(move || {
                    start.wait();
                    let b = Bootstrap::init(id, N, r, c)
                        .unwrap_or_else(|e| panic!("rank {r} of {N}: {e}"));
                    assert_eq!(b.peers().len(), N);
                    assert!(b.peers().iter().enumerate().all(|(i, p)| p.rank == i));
                    b.barrier().unwrap();
                    let v = b.broadcast(N - 1, &[r as u8, 7]).unwrap();
                    b.barrier().unwrap();
                    v
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert!(got.iter().all(|v| v == &[(N - 1) as u8, 7]), "{got:?}");
}
