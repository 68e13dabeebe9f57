//! A slow link for the namespace hosts: a user-space TCP relay that delays,
//! re-splits, rate-limits and can stall the byte streams it carries (this
//! kernel has no `netem`, and routing in the kernel cannot delay packets).
//!
//! # How the ranks' connections are made to go through it (no library hook)
//!
//! Every connection that carries data between a rank on host A and a rank on
//! host B (bootstrap message channels, the control connection and the TCP data
//! streams of each pair) is opened by the *lower* rank to the *higher* rank's
//! bootstrap listener, at the address that rank advertised (its selected
//! interface address `XB`, port chosen by the kernel; see oxccl-bootstrap's
//! `Bootstrap::dial` and `HostComm::init`). With the lower ranks on A, the
//! relay only has to sit between A and `XB:port`. [`Hosts::route_via_proxy`]
//! arranges that with routes alone, so the library runs unchanged:
//!
//! ```text
//!   host A (ns)                    proxy host P (ns)                     host B (ns)
//!   eth0 XA=198.18.1.1     br0     eth0 198.18.1.200, lo: XB/32          eth0 XB=198.18.1.2 (selected)
//!   route XB/32 via P  ───────────> relay listens on XB:41000..41127 ──┐       + W=198.18.1.102/32
//!                                  (socket made in P's namespace)      │  route XA/32 src W
//!                                  relay connects to XB:port ──────────┘─> B's listener (XB:port)
//!                                  (socket made in B's namespace: a local connection there)
//! ```
//!
//! - A's route to `XB` (a /32, more specific than the switch's /24) points at
//!   P, where `XB` is a local address: A's connection lands on the relay's
//!   listener for the same port.
//! - The relay cannot know the port B's listener gets (it binds port 0), so B's
//!   namespace hands out ports from a small range (`ip_local_port_range`,
//!   a per-namespace setting) and the relay listens on every port of it.
//! - The relay's thread for a new connection enters B's network namespace
//!   (`setns`, per thread) and connects to `XB:port` there; a socket stays in
//!   the namespace it was made in, so the relay holds one socket in each.
//! - B's own connections to A leave from a second address `W` (route `XA/32
//!   src W`): A's replies to `W` go straight over the switch, while replies to
//!   `XB` would go to P (which owns `XB` too) and be reset.
//! - P answers ARP only for addresses of the asking interface and announces
//!   its switch address (`arp_ignore=1`, `arp_announce=2`), so B never sees
//!   anyone else claim `XB`.
//!
//! So A's lower ranks reach B's ranks only through the relay, and B's
//! connections to A (to the root, and B's own message channels) go direct.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{host_addr, ip_ok, ns_exec, Hosts};

/// The ports B's namespace gives out, all of which the relay listens on.
pub const PORTS: (u16, u16) = (41000, 41127);

/// The relay host's address on the switch.
pub fn proxy_addr() -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 1, 200)
}

/// The address host `i` uses for its own connections once its main address
/// is behind the relay.
pub fn side_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 1, 101 + i as u8)
}

impl Hosts {
    /// Makes host `from` reach host `to`'s address on subnet 0 only through a
    /// relay host (namespace `..._px`, removed with the others); see the
    /// module docs. Returns the relay host's namespace.
    pub fn route_via_proxy(&mut self, from: usize, to: usize) -> String {
        let pid = std::process::id();
        let px = format!("oxh{pid}_{}_px", self.tag);
        let sw = format!("oxh{pid}_{}_sw", self.tag);
        let (xa, xb, w) = (host_addr(from, 0), host_addr(to, 0), side_addr(to));
        ip_ok(&["netns", "add", &px]);
        self.created.push(px.clone());
        ip_ok(&["-n", &px, "link", "set", "lo", "up"]);
        ip_ok(&[
            "-n", &sw, "link", "add", "pxp", "type", "veth", "peer", "name", "eth0", "netns", &px,
        ]);
        ip_ok(&["-n", &sw, "link", "set", "pxp", "master", "br0"]);
        ip_ok(&["-n", &sw, "link", "set", "pxp", "up"]);
        for (k, v) in [("arp_ignore", "1"), ("arp_announce", "2")] {
            for dev in ["all", "eth0"] {
                let cmd = format!("echo {v} > /proc/sys/net/ipv4/conf/{dev}/{k}");
                ns_exec(&px, &["sh", "-c", &cmd]);
            }
        }
        ip_ok(&[
            "-n",
            &px,
            "addr",
            "add",
            &format!("{}/24", proxy_addr()),
            "dev",
            "eth0",
        ]);
        ip_ok(&["-n", &px, "link", "set", "eth0", "up"]);
        ip_ok(&["-n", &px, "addr", "add", &format!("{xb}/32"), "dev", "lo"]);
        // A: B's address is behind P.
        let a = self.hosts[from].ns.clone();
        ip_ok(&[
            "-n",
            &a,
            "route",
            "add",
            &format!("{xb}/32"),
            "via",
            &proxy_addr().to_string(),
            "dev",
            "eth0",
        ]);
        // B: its own connections to A leave from W; ports from the relay's range.
        let b = self.hosts[to].ns.clone();
        ip_ok(&["-n", &b, "addr", "add", &format!("{w}/32"), "dev", "eth0"]);
        ip_ok(&[
            "-n",
            &b,
            "route",
            "add",
            &format!("{xa}/32"),
            "dev",
            "eth0",
            "src",
            &w.to_string(),
        ]);
        let cmd = format!(
            "echo '{} {}' > /proc/sys/net/ipv4/ip_local_port_range",
            PORTS.0, PORTS.1
        );
        ns_exec(&b, &["sh", "-c", &cmd]);
        px
    }
}

/// Puts the calling thread into network namespace `ns` (made by `ip netns`).
fn enter_netns(ns: &str) -> std::io::Result<()> {
    let f = std::fs::File::open(format!("/run/netns/{ns}"))?;
    // SAFETY: setns takes a valid descriptor (kept open by `f` for the call)
    // and a namespace type; it changes only this thread's network namespace.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// How the relay treats the bytes it forwards.
#[derive(Debug, Clone)]
pub struct Shape {
    /// Each chunk is written no earlier than this after it was read: one-way
    /// latency added in each direction.
    pub delay: Duration,
    /// Bytes per second per direction of each connection (`None`: no cap).
    pub rate: Option<u64>,
    /// Reads take 1..=`max_chunk` bytes (drawn from a seeded generator), so
    /// the stream arrives re-split at odd boundaries.
    pub max_chunk: usize,
}

struct Shared {
    stop: AtomicBool,
    /// Nothing is forwarded before this instant.
    stall_until: Mutex<Instant>,
    accepted: AtomicU64,
    /// Bytes written toward host B / toward host A.
    to_b: AtomicU64,
    to_a: AtomicU64,
    /// Clones of every relayed socket, shut down on drop to end the pumps.
    socks: Mutex<Vec<TcpStream>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    fn spawn(self: &Arc<Self>, f: impl FnOnce() + Send + 'static) {
        let h = std::thread::spawn(f);
        self.threads.lock().unwrap().push(h);
    }
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
    /// Sleeps until `t` (in steps of at most 10 ms); false if stopped first.
    fn sleep_until(&self, t: Instant) -> bool {
        loop {
            if self.stopped() {
                return false;
            }
            let now = Instant::now();
            if now >= t {
                return true;
            }
            std::thread::sleep((t - now).min(Duration::from_millis(10)));
        }
    }
}

/// A running relay; stops, closes every socket and joins its threads on drop.
pub struct Proxy {
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Listens on `ip:port` for every port of [`PORTS`] inside namespace
    /// `listen_ns`; each connection is relayed to the same `ip:port` as seen
    /// from namespace `target_ns`, shaped by `shape`.
    pub fn start(listen_ns: &str, target_ns: &str, ip: Ipv4Addr, shape: Shape) -> Proxy {
        assert!(shape.max_chunk >= 1);
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            stall_until: Mutex::new(Instant::now()),
            accepted: AtomicU64::new(0),
            to_b: AtomicU64::new(0),
            to_a: AtomicU64::new(0),
            socks: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
        });
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let (listen_ns, target_ns) = (listen_ns.to_string(), target_ns.to_string());
        let sh = shared.clone();
        let acceptor = std::thread::spawn(move || {
            let listeners =
                match enter_netns(&listen_ns)
                    .map_err(|e| e.to_string())
                    .and_then(|()| {
                        (PORTS.0..=PORTS.1)
                            .map(|p| {
                                TcpListener::bind((ip, p))
                                    .map_err(|e| format!("relay: bind {ip}:{p}: {e}"))
                            })
                            .collect::<Result<Vec<_>, String>>()
                    }) {
                    Ok(l) => {
                        let _ = ready_tx.send(Ok(()));
                        l
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
            accept_loop(&sh, &listeners, &target_ns, ip, &shape);
        });
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("{e}"),
            Err(_) => panic!("relay: the acceptor thread died"),
        }
        Proxy {
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// Forwards nothing, in either direction of any connection, for `d` from now
    /// (the bytes wait in the relay and in the sockets' buffers).
    pub fn stall(&self, d: Duration) {
        *self.shared.stall_until.lock().unwrap() = Instant::now() + d;
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Bytes forwarded so far (toward the target, toward the connecting side).
    pub fn bytes(&self) -> (u64, u64) {
        (
            self.shared.to_b.load(Ordering::Relaxed),
            self.shared.to_a.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
        for s in self.shared.socks.lock().unwrap().iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
        // A connection thread may still be adding pumps: drain until empty.
        loop {
            let hs: Vec<_> = std::mem::take(&mut *self.shared.threads.lock().unwrap());
            if hs.is_empty() {
                break;
            }
            for h in hs {
                let _ = h.join();
            }
            for s in self.shared.socks.lock().unwrap().iter() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

fn accept_loop(
    sh: &Arc<Shared>,
    listeners: &[TcpListener],
    target_ns: &str,
    ip: Ipv4Addr,
    shape: &Shape,
) {
    let mut fds: Vec<libc::pollfd> = listeners
        .iter()
        .map(|l| libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    while !sh.stopped() {
        // SAFETY: `fds` is a valid array of pollfd of the given length, and
        // every descriptor in it is owned by `listeners`, alive for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 50) };
        if n <= 0 {
            continue;
        }
        for (i, f) in fds.iter_mut().enumerate() {
            if f.revents == 0 {
                continue;
            }
            f.revents = 0;
            let Ok((down, _)) = listeners[i].accept() else {
                continue;
            };
            sh.accepted.fetch_add(1, Ordering::Relaxed);
            let port = PORTS.0 + i as u16;
            let (sh2, ns, shape) = (sh.clone(), target_ns.to_string(), shape.clone());
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let s = seed;
            sh.spawn(move || relay(sh2, down, &ns, SocketAddr::from((ip, port)), shape, s));
        }
    }
}

/// Connects to `target` from namespace `ns` and pumps both directions.
fn relay(sh: Arc<Shared>, down: TcpStream, ns: &str, target: SocketAddr, shape: Shape, seed: u64) {
    let up = match enter_netns(ns)
        .and_then(|()| TcpStream::connect_timeout(&target, Duration::from_secs(5)))
    {
        Ok(s) => s,
        Err(e) => {
            // Closing `down` tells the connecting side; it never happens in
            // the tests (only ports with a listener are dialled).
            eprintln!("relay: cannot reach {target} in {ns}: {e}");
            return;
        }
    };
    let _ = down.set_nodelay(true);
    let _ = up.set_nodelay(true);
    let clones = [&down, &up, &down, &up].map(|s| s.try_clone().expect("clone a relayed socket"));
    let [d_r, u_r, d_w, u_w] = clones;
    {
        let mut socks = sh.socks.lock().unwrap();
        socks.push(down);
        socks.push(up);
    }
    if sh.stopped() {
        return; // Drop may have shut the list down before these were added.
    }
    pump(&sh, d_r, u_w, shape.clone(), seed, true);
    pump(&sh, u_r, d_w, shape, seed ^ 0x5555, false);
}

/// One direction: a reader thread cuts the stream into chunks of random
/// length and stamps each with its due time; a writer thread writes each
/// chunk once it is due, not stalled, and within the rate. The channel holds
/// 64 chunks, so a stalled or slow writer stops the reader and TCP's own
/// flow control pushes back on the sender.
fn pump(
    sh: &Arc<Shared>,
    mut src: TcpStream,
    mut dst: TcpStream,
    shape: Shape,
    seed: u64,
    to_b: bool,
) {
    let (tx, rx) = mpsc::sync_channel::<(Instant, Vec<u8>)>(64);
    let max = shape.max_chunk;
    sh.spawn(move || {
        let mut x = seed | 1;
        let mut buf = vec![0u8; max];
        loop {
            // xorshift64: a different but fixed split for every connection.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = 1 + (x % max as u64) as usize;
            match src.read(&mut buf[..len]) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx
                        .send((Instant::now() + shape.delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
        // The close travels like data: an empty chunk, due `delay` from now.
        let _ = tx.send((Instant::now() + shape.delay, Vec::new()));
    });
    let sh2 = sh.clone();
    sh.spawn(move || {
        let mut next_free = Instant::now();
        for (due, chunk) in rx {
            let stall = *sh2.stall_until.lock().unwrap();
            if !sh2.sleep_until(due.max(stall).max(next_free)) {
                break;
            }
            // A stall set while this chunk waited still holds it.
            let stall = *sh2.stall_until.lock().unwrap();
            if !sh2.sleep_until(stall) {
                break;
            }
            if chunk.is_empty() {
                break; // the source closed
            }
            if dst.write_all(&chunk).is_err() {
                break;
            }
            let n = chunk.len() as u64;
            if let Some(rate) = shape.rate {
                let now = Instant::now();
                next_free = next_free.max(now) + Duration::from_nanos(n * 1_000_000_000 / rate);
            }
            let c = if to_b { &sh2.to_b } else { &sh2.to_a };
            c.fetch_add(n, Ordering::Relaxed);
        }
        // End of stream (or a failed write, or a source that failed): pass
        // the close on.
        let _ = dst.shutdown(Shutdown::Write);
    });
}
