//! TCP links over real loopback sockets: two threads streaming, a SIGKILLed
//! peer process, poison.

mod transport_common;

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use oxccl_core::{Error, ErrorKind};
use oxccl_host::transport::{tcp_link, LinkKind, PeerControl, PeerLink};
use transport_common::*;

const NCH: usize = 4;
const BUF: usize = 256 << 10;

/// Accepts a control connection then `nch` data connections.
fn accept_link(l: &TcpListener, peer: usize, who: &str, nch: usize) -> PeerLink {
    let (ctl, _) = l.accept().unwrap();
    let data = (0..nch).map(|_| l.accept().unwrap().0).collect();
    tcp_link(
        peer,
        data,
        PeerControl::socket(peer, ctl, who).unwrap(),
        BUF,
    )
    .unwrap()
}

/// Connects a control connection then `nch` data connections.
fn connect_link(addr: &str, peer: usize, nch: usize) -> PeerLink {
    let ctl = TcpStream::connect(addr).unwrap();
    let data = (0..nch)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    tcp_link(peer, data, PeerControl::socket(peer, ctl, "").unwrap(), BUF).unwrap()
}

#[test]
fn tcp_streams_8mb_over_4_channels() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || {
        let mut b = connect_link(&addr, 0, NCH);
        exchange(&mut b, 200, 100, 2 << 20, true).unwrap();
        b
    });
    let mut a = accept_link(&l, 1, "", NCH);
    assert_eq!(a.kind, LinkKind::Tcp);
    let dt = exchange(&mut a, 100, 200, 2 << 20, true).unwrap();
    let b = t.join().unwrap();
    println!(
        "tcp: 8 MiB each way over {NCH} loopback connections in {:.1} ms",
        dt.as_secs_f64() * 1e3
    );
    drop(b);
    // The peer closed: once everything is read, the next peek is a remote error.
    let (e, _) = wait_for(Duration::from_secs(2), || {
        a.recv[0].fill().err().or_else(|| a.recv[0].peek().err())
    })
    .expect("closed peer not seen by the data stream");
    assert_eq!(e.kind(), ErrorKind::Remote);
    assert!(e.message().contains("rank 1 (127.0.0.1:"), "{e}");
}

#[test]
fn tcp_one_way_throughput() {
    const TOTAL: usize = 256 << 20;
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || {
        let mut b = connect_link(&addr, 0, 1);
        let mut sent = 0;
        while sent < TOTAL || b.send[0].unflushed() > 0 {
            let buf = b.send[0].reserve().unwrap();
            let n = buf.len().min(TOTAL - sent);
            b.send[0].commit(n);
            sent += n;
            if !b.send[0].flush().unwrap() && n == 0 {
                std::thread::yield_now();
            }
        }
        b
    });
    let mut a = accept_link(&l, 1, "", 1);
    let t0 = Instant::now();
    let mut got = 0;
    while got < TOTAL {
        let moved = a.recv[0].fill().unwrap();
        let n = a.recv[0].peek().unwrap().len();
        a.recv[0].consume(n);
        got += n;
        if !moved && n == 0 {
            std::thread::yield_now();
        }
    }
    let dt = t0.elapsed().as_secs_f64();
    let _b = t.join().unwrap();
    println!(
        "tcp: one loopback connection, {} KiB user buffers: {:.2} GB/s ({} MiB in {:.1} ms)",
        BUF >> 10,
        TOTAL as f64 / dt / 1e9,
        TOTAL >> 20,
        dt * 1e3
    );
}

#[test]
fn tcp_sigkilled_peer_is_seen_within_a_second() {
    if std::env::var(ROLE).is_ok() {
        child_watchdog(30);
        let _link = connect_link(&std::env::var("OXCCL_T_ADDR").unwrap(), 0, 2);
        std::thread::sleep(Duration::from_secs(30));
        std::process::exit(0);
    }
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut child = spawn_role(
        "tcp_sigkilled_peer_is_seen_within_a_second",
        "hang",
        &[("OXCCL_T_ADDR", l.local_addr().unwrap().to_string())],
    );
    let pid = child.id();
    let mut link = accept_link(&l, 1, &format!("pid {pid} on host localhost"), 2);
    assert!(link.control.check().is_ok());
    assert!(!link.recv[0].fill().unwrap());
    child.kill().unwrap(); // SIGKILL
    let (e, dt) = wait_for(Duration::from_secs(1), || link.control.check().err())
        .expect("killed peer not detected within 1 s");
    println!(
        "tcp: SIGKILL of the peer seen after {:.2} ms: {e}",
        dt.as_secs_f64() * 1e3
    );
    assert_eq!(e.kind(), ErrorKind::Remote);
    assert_eq!(
        e.message(),
        format!("rank 1 (pid {pid} on host localhost) closed its connection: process exited or was killed")
    );
    // The data streams see it too, as an error (never a panic or a hang).
    let e = link.recv[1]
        .fill()
        .err()
        .or_else(|| link.recv[1].peek().err())
        .expect("data stream of a killed peer");
    assert_eq!(e.kind(), ErrorKind::Remote);
    assert!(
        e.message().contains("connection to rank 1 (127.0.0.1:"),
        "{e}"
    );
    // Writing to it fails (reset) within a few tries, as an error.
    let (e, _) = wait_for(Duration::from_secs(1), || {
        let buf = match link.send[0].reserve() {
            Ok(b) => b,
            Err(e) => return Some(e),
        };
        let n = buf.len().min(4096);
        link.send[0].commit(n);
        link.send[0].flush().err()
    })
    .expect("send to a killed peer never failed");
    assert_eq!(e.kind(), ErrorKind::Remote);
    child.wait().unwrap();
}

#[test]
fn tcp_poison_reaches_the_peer_with_its_text() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || {
        let mut b = connect_link(&addr, 0, 1);
        b.control
            .poison(&Error::timeout("rank 0 waited 30 s for rank 2"));
        b
    });
    let mut a = accept_link(&l, 1, "", 1);
    let (e, _) = wait_for(Duration::from_secs(5), || a.control.check().err()).expect("poison");
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(
        e.message(),
        "rank 1 reported: rank 0 waited 30 s for rank 2"
    );
    drop(t.join().unwrap());
    assert_eq!(a.control.check().unwrap_err(), e);
}

#[test]
fn tcp_garbage_on_control_is_an_error_not_an_allocation() {
    use std::io::Write;
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (ctl, _) = l.accept().unwrap();
    let mut c = PeerControl::socket(4, ctl, "").unwrap();
    let mut frame = Vec::new();
    frame.extend_from_slice(b"OXP1");
    frame.extend_from_slice(&5u32.to_le_bytes());
    frame.extend_from_slice(&u32::MAX.to_le_bytes());
    s.write_all(&frame).unwrap();
    let (e, _) = wait_for(Duration::from_secs(2), || c.check().err()).unwrap();
    assert_eq!(e.kind(), ErrorKind::Remote);
    assert!(e.message().contains("malformed"), "{e}");
    assert!(e.message().starts_with("rank 4 (127.0.0.1:"), "{e}");
}

/// A peer that sent its last bytes and then closed: its control connection's
/// close may arrive before those bytes (they wait for window or sit at a slow
/// link; the control carries nothing). A wait on a TCP peer must leave that
/// close to the data streams, which end with it after the bytes
/// (`check_while_waiting`), while `check` still reports it, and a control
/// not made part of a TCP link (as shared-memory links use it) still fails.
#[test]
fn tcp_control_close_leaves_the_verdict_to_the_data_streams() {
    use std::io::Write;
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    // The peer's side as raw sockets, so the test orders the closes.
    let ctl = TcpStream::connect(&addr).unwrap();
    let mut data = TcpStream::connect(&addr).unwrap();
    let mut a = accept_link(&l, 1, "pid 1 on host h", 1);
    drop(ctl);
    let (e, _) = wait_for(Duration::from_secs(2), || a.control.check().err())
        .expect("control close not seen");
    assert_eq!(e.kind(), ErrorKind::Remote);
    assert!(e.message().contains("closed its connection"), "{e}");
    assert!(a.control.check_while_waiting().is_ok());
    // The bytes sent before the data stream's close all arrive, then the
    // close is the error.
    data.write_all(&[7u8; 64]).unwrap();
    drop(data);
    let (n, _) = wait_for(Duration::from_secs(2), || {
        a.recv[0].fill().unwrap();
        let got = a.recv[0].peek().unwrap();
        (got.len() == 64 && got.iter().all(|&b| b == 7)).then_some(64)
    })
    .expect("bytes sent before the close did not arrive");
    a.recv[0].consume(n);
    let (e, _) = wait_for(Duration::from_secs(2), || {
        a.recv[0].fill().err().or_else(|| a.recv[0].peek().err())
    })
    .expect("the data stream's close is not an error");
    assert_eq!(e.kind(), ErrorKind::Remote);
    assert!(e.message().contains("closed by peer"), "{e}");

    // A control alone (shared-memory links): the close fails a wait at once.
    let ctl = TcpStream::connect(&addr).unwrap();
    let (theirs, _) = l.accept().unwrap();
    let mut c = PeerControl::socket(1, theirs, "").unwrap();
    drop(ctl);
    let (e, _) = wait_for(Duration::from_secs(2), || c.check_while_waiting().err())
        .expect("control close not seen by a wait without data streams");
    assert_eq!(e.kind(), ErrorKind::Remote);
}
