//! In-process links: two threads streaming over heap rings, drop and poison.

mod transport_common;

use std::time::Duration;

use oxccl_core::{Error, ErrorKind};
use oxccl_host::transport::{inproc_pair, LinkKind};
use transport_common::{exchange, wait_for};

#[test]
fn inproc_streams_8mb_over_4_channels() {
    let (mut a, mut b) = inproc_pair(0, 1, 4, 64 << 10).unwrap();
    assert_eq!((a.peer, b.peer, a.kind), (1, 0, LinkKind::InProc));
    assert_eq!(a.nchannels(), 4);
    let t = std::thread::spawn(move || {
        exchange(&mut b, 200, 100, 2 << 20, true).unwrap();
        b
    });
    let dt = exchange(&mut a, 100, 200, 2 << 20, true).unwrap();
    let _b = t.join().unwrap();
    println!(
        "inproc: 8 MiB each way over 4 channels in {:.1} ms",
        dt.as_secs_f64() * 1e3
    );
}

#[test]
fn inproc_dropped_peer_is_a_remote_error() {
    let (mut a, b) = inproc_pair(3, 5, 2, 64).unwrap();
    assert!(a.control.check().is_ok());
    // Fill a's outgoing ring so the sender sees "full" below.
    let n = a.send[0].reserve().unwrap().len();
    a.send[0].commit(n);
    std::thread::spawn(move || drop(b)).join().unwrap();
    let e = a.control.check().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote);
    assert!(e.message().contains("rank 5"), "{e}");
    let e = a.recv[1].peek().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote);
    assert!(a.send[0].reserve().is_err());
}

#[test]
fn inproc_receiver_drains_data_sent_before_the_peer_left() {
    let (mut a, mut b) = inproc_pair(0, 1, 1, 64).unwrap();
    b.send[0].reserve().unwrap()[..8].copy_from_slice(&7u64.to_le_bytes());
    b.send[0].commit(8);
    drop(b);
    assert_eq!(a.recv[0].peek().unwrap(), &7u64.to_le_bytes());
    a.recv[0].consume(8);
    assert!(a.recv[0].peek().is_err());
}

#[test]
fn inproc_poison_reaches_a_waiting_peer() {
    let (mut a, mut b) = inproc_pair(0, 1, 1, 4096).unwrap();
    let waiter = std::thread::spawn(move || {
        // Wait for data that never comes, checking the control like an executor.
        wait_for(Duration::from_secs(5), || match b.recv[0].peek() {
            Ok([]) => b.control.check().err(),
            Ok(_) => panic!("unexpected data"),
            Err(e) => Some(e),
        })
        .expect("poison not seen")
        .0
    });
    std::thread::sleep(Duration::from_millis(20));
    a.control.poison(&Error::invalid_usage(
        "mismatched call: all_reduce of 10 floats vs broadcast",
    ));
    let e = waiter.join().unwrap();
    assert_eq!(e.kind(), ErrorKind::InvalidUsage);
    assert_eq!(
        e.message(),
        "rank 0 reported: mismatched call: all_reduce of 10 floats vs broadcast"
    );
}
