//! Shared memory between two real processes: the test re-executes its own
//! binary (`ROLE` env var) as the peer rank, passing segment names and the
//! control address through the environment and a setup line exchange.

mod transport_common;

use std::net::{TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use oxccl_core::{Error, ErrorKind};
use oxccl_host::transport::shm::{dev_shm_space, linked_segments};
use oxccl_host::transport::{shm_link, LinkKind, PeerControl, PeerLink, ShmRingLayout, ShmSegment};
use transport_common::*;

/// Tests here look at /dev/shm, so they run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const NCH: usize = 4;
const CAP: usize = 256 << 10;
const LAYOUT: ShmRingLayout = ShmRingLayout {
    npeers: 1,
    nchannels: NCH,
    capacity: CAP,
};

fn my_dev_shm_entries() -> Vec<String> {
    let prefix = format!("oxccl-{}-", std::process::id());
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Parent side of the setup: create my segment, start the child, exchange
/// names over the control connection, open the child's, unlink mine.
fn parent_setup(test: &str, role: &str, layout: ShmRingLayout) -> (PeerLink, std::process::Child) {
    let mine = ShmSegment::create_rings(layout).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let child = spawn_role(
        test,
        role,
        &[
            ("OXCCL_T_SEG", mine.name().to_string()),
            ("OXCCL_T_CTL", listener.local_addr().unwrap().to_string()),
        ],
    );
    let (mut ctl, _) = listener.accept().unwrap();
    let theirs_name = recv_line(&mut ctl);
    let theirs = ShmSegment::open_rings(&theirs_name, layout).unwrap();
    // The child opened mine before connecting; I opened theirs: both unlink.
    mine.unlink().unwrap();
    send_line(&mut ctl, "opened");
    assert_eq!(recv_line(&mut ctl), "ready");
    // A full name is accepted as it is.
    let control = PeerControl::socket(1, ctl, format!("rank 1 (pid {})", child.id())).unwrap();
    let link = shm_link(1, &mine, 0, &theirs, 0, control).unwrap();
    (link, child)
}

/// Child side of the setup.
fn child_setup(layout: ShmRingLayout) -> PeerLink {
    child_watchdog(30);
    let theirs_name = std::env::var("OXCCL_T_SEG").unwrap();
    let theirs = ShmSegment::open_rings(&theirs_name, layout).unwrap();
    let mine = ShmSegment::create_rings(layout).unwrap();
    let mut ctl = TcpStream::connect(std::env::var("OXCCL_T_CTL").unwrap()).unwrap();
    send_line(&mut ctl, mine.name());
    assert_eq!(recv_line(&mut ctl), "opened");
    mine.unlink().unwrap();
    send_line(&mut ctl, "ready");
    let control = PeerControl::socket(0, ctl, "").unwrap();
    shm_link(0, &mine, 0, &theirs, 0, control).unwrap()
}

fn child_role() -> Option<String> {
    std::env::var(ROLE).ok()
}

#[test]
fn shm_two_processes_stream_8mb_over_4_channels() {
    if let Some(role) = child_role() {
        let mut link = child_setup(LAYOUT);
        if role == "stream" {
            exchange(&mut link, 200, 100, 2 << 20, true).unwrap();
            // A single ring, one way, for the throughput print.
            let mut link1 = PeerLink {
                peer: link.peer,
                kind: link.kind,
                send: link.send.drain(..1).collect(),
                recv: Vec::new(),
                control: link.control,
            };
            let sent = stream_one_way(&mut link1, 64 << 20);
            assert!(sent);
        }
        std::process::exit(0);
    }
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (mut link, mut child) = parent_setup(
        "shm_two_processes_stream_8mb_over_4_channels",
        "stream",
        LAYOUT,
    );
    assert_eq!(link.kind, LinkKind::Shm);
    let dt = exchange(&mut link, 100, 200, 2 << 20, true).unwrap();
    println!(
        "shm: 8 MiB each way over {NCH} channels between two processes in {:.1} ms",
        dt.as_secs_f64() * 1e3
    );
    // Throughput of one ring (channel 0), child -> parent.
    let t0 = Instant::now();
    let total = 64usize << 20;
    let mut got = 0;
    let mut dst = vec![0u8; CAP];
    while got < total {
        let buf = link.recv[0].peek().unwrap();
        let n = buf.len();
        dst[..n].copy_from_slice(buf);
        link.recv[0].consume(n);
        got += n;
        if n == 0 {
            link.control.check().unwrap();
            std::thread::yield_now();
        }
    }
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "shm: one {} KiB ring between two processes: {:.2} GB/s ({} MiB in {:.1} ms)",
        CAP >> 10,
        total as f64 / dt / 1e9,
        total >> 20,
        dt * 1e3
    );
    assert!(child.wait().unwrap().success());
    drop(link);
    assert!(
        my_dev_shm_entries().is_empty(),
        "{:?}",
        my_dev_shm_entries()
    );
}

/// Sends `total` bytes on channel 0 with large chunks (copied in from a
/// source buffer, as a real send would), no data check.
fn stream_one_way(link: &mut PeerLink, total: usize) -> bool {
    let src = pattern(7, CAP);
    let mut sent = 0;
    while sent < total {
        let buf = link.send[0].reserve().unwrap();
        let n = buf.len().min(total - sent);
        buf[..n].copy_from_slice(&src[..n]);
        link.send[0].commit(n);
        sent += n;
        if n == 0 {
            std::thread::yield_now();
        }
    }
    true
}

#[test]
fn shm_sigkilled_peer_is_seen_within_a_second() {
    if child_role().is_some() {
        let _link = child_setup(LAYOUT);
        std::thread::sleep(Duration::from_secs(30));
        std::process::exit(0);
    }
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (mut link, mut child) =
        parent_setup("shm_sigkilled_peer_is_seen_within_a_second", "hang", LAYOUT);
    assert!(link.control.check().is_ok());
    assert!(link.recv[0].peek().unwrap().is_empty());
    let pid = child.id();
    child.kill().unwrap(); // SIGKILL
    let (e, dt) = wait_for(Duration::from_secs(1), || {
        assert!(link.recv[0].peek().unwrap().is_empty());
        link.control.check().err()
    })
    .expect("killed peer not detected within 1 s");
    println!(
        "shm: SIGKILL of the peer seen after {:.2} ms: {e}",
        dt.as_secs_f64() * 1e3
    );
    assert_eq!(e.kind(), ErrorKind::Remote);
    assert!(e.message().contains(&format!("rank 1 (pid {pid})")), "{e}");
    assert!(e.message().contains("process exited or was killed"), "{e}");
    child.wait().unwrap();
    drop(link);
    assert!(my_dev_shm_entries().is_empty());
}

#[test]
fn shm_poison_reaches_the_peer_with_its_text() {
    if child_role().is_some() {
        let mut link = child_setup(LAYOUT);
        link.control.poison(&Error::invalid_usage(
            "mismatched call: rank 1 called all_reduce(sum, 1024 x f32), rank 0 called broadcast",
        ));
        std::process::exit(0);
    }
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (mut link, mut child) = parent_setup(
        "shm_poison_reaches_the_peer_with_its_text",
        "poison",
        LAYOUT,
    );
    let (e, _) =
        wait_for(Duration::from_secs(5), || link.control.check().err()).expect("poison not seen");
    assert_eq!(e.kind(), ErrorKind::InvalidUsage);
    assert_eq!(
        e.message(),
        "rank 1 reported: mismatched call: rank 1 called all_reduce(sum, 1024 x f32), rank 0 called broadcast"
    );
    // Sticky.
    assert_eq!(link.control.check().unwrap_err(), e);
    assert!(child.wait().unwrap().success());
}

#[test]
fn shm_too_small_dev_shm_fails_before_allocating_with_a_fix() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (free, _) = dev_shm_space().expect("needs /dev/shm (the shared-memory transport's home)");
    let size = (free + (1 << 30)) as usize;
    let e = ShmSegment::create("big", size).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::System);
    let m = e.message();
    assert!(m.contains(&size.to_string()), "{m}");
    assert!(m.contains("--shm-size="), "{m}");
    assert!(
        m.contains("--ipc=host") && m.contains("medium: Memory") && m.contains("NCCL_BUFFSIZE"),
        "{m}"
    );
    assert!(my_dev_shm_entries().is_empty());
    println!("{e}");
}

#[test]
fn shm_segments_are_unlinked_on_drop_and_layout_is_checked() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let seg = ShmSegment::create_rings(LAYOUT).unwrap();
    let name = seg.name().to_string();
    assert!(name.starts_with(&format!("/oxccl-{}-", std::process::id())));
    assert!(linked_segments().contains(&name));
    assert_eq!(my_dev_shm_entries(), vec![name[1..].to_string()]);
    // A peer expecting another layout gets a clear error.
    let other = ShmRingLayout {
        capacity: CAP / 2,
        ..LAYOUT
    };
    let e = ShmSegment::open_rings(&name, other).unwrap_err();
    assert!(e.message().contains("NCCL_BUFFSIZE"), "{e}");
    // Both ends of one ring in this process; a second sender is refused.
    let peer_view = ShmSegment::open_rings(&name, LAYOUT).unwrap();
    let c1 = PeerControl::socket(0, loopback_pair().0, "").unwrap();
    let c2 = PeerControl::socket(0, loopback_pair().0, "").unwrap();
    let mut l = shm_link(0, &seg, 0, &peer_view, 0, c1).unwrap();
    assert!(shm_link(0, &seg, 0, &peer_view, 0, c2).is_err());
    l.send[2].reserve().unwrap()[..16].fill(9);
    l.send[2].commit(16);
    assert_eq!(l.recv[2].peek().unwrap(), &[9u8; 16]);
    drop(l);
    drop(peer_view);
    drop(seg);
    assert!(!linked_segments().contains(&name));
    assert!(my_dev_shm_entries().is_empty());
}

fn loopback_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    (a, b)
}
