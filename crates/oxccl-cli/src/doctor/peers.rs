//! TCP reachability both ways: `--peers` connects to each peer and, when an
//! `oxccl doctor --listen` answers there, asks it to connect back; `--listen`
//! answers such probes. Every wait is bounded by [`PEER_TIMEOUT`] (a peer
//! that accepts but never answers, or a port that drops packets, costs at
//! most a few of them, never a hang).
//!
//! The protocol, one text line each way (so `nc` can play either side):
//!
//! ```text
//! prober → listener   oxccl-doctor 1 hello NONCE PORT   (PORT: where the prober listens for the call back)
//! listener → prober   oxccl-doctor 1 ack                (the round trip is timed from hello to ack)
//! listener → prober:PORT, a new connection, to the address the hello came from:
//!                     oxccl-doctor 1 back NONCE
//! listener → prober   oxccl-doctor 1 result ok MICROS ADDR | oxccl-doctor 1 result fail ADDR WHY...
//! ```
//!
//! The prober reads the result, then checks that a connection carrying its
//! nonce reached its callback port (the listener's word alone could be a NAT's).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::checks::{Answered, Back, ListenFacts, PeerResult};

/// How long one step with a peer (lookup, connect, an answer) may take.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(2);
const PROTO: &str = "oxccl-doctor 1";
/// The longest protocol line read.
const MAX_LINE: u64 = 256;
/// Probes answered at once by `--listen`; more wait for their turn.
const MAX_INFLIGHT: usize = 64;

fn split_peer(p: &str, default_port: u16) -> Result<(String, u16), String> {
    let p = p.trim();
    if let Some(rest) = p.strip_prefix('[') {
        let (host, tail) = rest.split_once(']').ok_or("missing ']'")?;
        let port = match tail.strip_prefix(':') {
            Some(t) => t.parse().map_err(|_| format!("bad port '{t}'"))?,
            None => default_port,
        };
        return Ok((host.to_string(), port));
    }
    match p.rsplit_once(':') {
        Some((h, port)) if !h.contains(':') => Ok((
            h.to_string(),
            port.parse().map_err(|_| format!("bad port '{port}'"))?,
        )),
        _ => Ok((p.to_string(), default_port)),
    }
}

/// Name lookup and connect, each bounded by [`PEER_TIMEOUT`].
fn connect(target: &str, default_port: u16) -> Result<(TcpStream, SocketAddr, Duration), String> {
    let (host, port) = split_peer(target, default_port)?;
    // Name lookup can block: do it on a thread and stop waiting after the timeout.
    let (tx, rx) = mpsc::channel();
    let h2 = host.clone();
    std::thread::spawn(move || {
        let _ = tx.send(
            (h2.as_str(), port)
                .to_socket_addrs()
                .map(|a| a.collect::<Vec<_>>()),
        );
    });
    let addrs = match rx.recv_timeout(PEER_TIMEOUT) {
        Ok(Ok(a)) if !a.is_empty() => a,
        Ok(Ok(_)) => return Err(format!("{host} has no address")),
        Ok(Err(e)) => return Err(format!("cannot resolve {host}: {e}")),
        Err(_) => {
            return Err(format!(
                "resolving {host} took over {} s",
                PEER_TIMEOUT.as_secs()
            ))
        }
    };
    let mut errs = Vec::new();
    let deadline = Instant::now() + PEER_TIMEOUT;
    for a in &addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left < Duration::from_millis(50) {
            break;
        }
        let t0 = Instant::now();
        match TcpStream::connect_timeout(a, left) {
            Ok(s) => return Ok((s, *a, t0.elapsed())),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => errs.push(format!(
                "{a}: no answer within {} s (a firewall dropping packets, or no route)",
                PEER_TIMEOUT.as_secs()
            )),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                errs.push(format!("{a}: connection refused (nothing listens on port {port}, or a firewall rejects it)"))
            }
            Err(e) => errs.push(format!("{a}: {e}")),
        }
    }
    Err(errs.join("; "))
}

/// One line (without its newline) from `s`, at most [`MAX_LINE`] bytes,
/// within the stream's read timeout. Read a byte at a time: nothing past the
/// newline is consumed (the next line may already be there).
fn read_line(s: &TcpStream) -> Result<String, String> {
    let mut line = Vec::new();
    let mut r = s;
    let mut b = [0u8; 1];
    while (line.len() as u64) < MAX_LINE {
        match r.read(&mut b) {
            Ok(0) => return Err("the connection was closed".into()),
            Ok(_) if b[0] == b'\n' => {
                return Ok(String::from_utf8_lossy(&line).trim_end().to_string())
            }
            Ok(_) => line.push(b[0]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(format!(
                    "no answer within {} s",
                    s.read_timeout().ok().flatten().map_or(0, |d| d.as_secs())
                ))
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Err("line too long".into())
}

fn nonce() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

fn unspecified(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

/// The reverse half of a probe over a connected `s`: hello, ack, result, and
/// our nonce on the callback port.
fn ask_back(s: &TcpStream) -> (Option<Duration>, Back) {
    let local = match s.local_addr() {
        Ok(a) => a,
        Err(e) => return (None, Back::NoAnswer(format!("no local address ({e})"))),
    };
    // Where the peer calls back: any address of ours, an ephemeral port (as NCCL's connections use).
    let cb = match TcpListener::bind((unspecified(local.ip()), 0)) {
        Ok(l) => l,
        Err(e) => {
            return (
                None,
                Back::NoAnswer(format!("this host cannot listen for the call back ({e})")),
            )
        }
    };
    let cb_port = cb.local_addr().map_or(0, |a| a.port());
    let n = nonce();
    let _ = s.set_read_timeout(Some(PEER_TIMEOUT));
    let _ = s.set_write_timeout(Some(PEER_TIMEOUT));
    let t0 = Instant::now();
    let mut w = s;
    if let Err(e) = w.write_all(format!("{PROTO} hello {n} {cb_port}\n").as_bytes()) {
        return (
            None,
            Back::NoAnswer(format!("sending the probe failed ({e})")),
        );
    }
    match read_line(s) {
        Ok(l) if l == format!("{PROTO} ack") => {}
        Ok(l) => {
            return (
                None,
                Back::NoAnswer(format!(
                    "it answered something else than `oxccl doctor --listen` ({:?})",
                    l.chars().take(40).collect::<String>()
                )),
            )
        }
        Err(e) => {
            return (
                None,
                Back::NoAnswer(format!(
                    "no `oxccl doctor --listen` answered the probe ({e})"
                )),
            )
        }
    }
    let rtt = t0.elapsed();
    // The listener connects back (bounded by its own PEER_TIMEOUT), then reports.
    let _ = s.set_read_timeout(Some(PEER_TIMEOUT + Duration::from_secs(1)));
    let result = read_line(s);
    let back = match result {
        Err(e) => Back::NoAnswer(format!(
            "it answered the probe but sent no result of its call back ({e})"
        )),
        Ok(l) => {
            let rest = l.strip_prefix(&format!("{PROTO} result ")).unwrap_or("");
            let mut it = rest.splitn(3, ' ');
            match (it.next(), it.next(), it.next()) {
                (Some("ok"), Some(us), Some(to)) => {
                    let took = Duration::from_micros(us.parse().unwrap_or(0));
                    if saw_nonce(&cb, &n) {
                        Back::Ok {
                            to: to.to_string(),
                            took,
                        }
                    } else {
                        Back::Unverified { to: to.to_string() }
                    }
                }
                (Some("fail"), Some(to), why) => Back::Failed {
                    to: to.to_string(),
                    why: why.unwrap_or("no reason given").to_string(),
                },
                _ => Back::NoAnswer(format!(
                    "its result was not understood ({:?})",
                    l.chars().take(60).collect::<String>()
                )),
            }
        }
    };
    (Some(rtt), back)
}

/// Whether a connection carrying `nonce` is waiting on `cb` (it was made
/// before the result was sent, so it is in the backlog already).
fn saw_nonce(cb: &TcpListener, nonce: &str) -> bool {
    let _ = cb.set_nonblocking(true);
    let deadline = Instant::now() + Duration::from_millis(500);
    while Instant::now() < deadline {
        match cb.accept() {
            Ok((c, _)) => {
                let _ = c.set_nonblocking(false);
                let _ = c.set_read_timeout(Some(Duration::from_millis(500)));
                if read_line(&c).is_ok_and(|l| l == format!("{PROTO} back {nonce}")) {
                    return true;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(_) => return false,
        }
    }
    false
}

/// Probes one peer: connect, then (when a doctor listens there) the way back.
pub fn probe_peer(target: &str, default_port: u16) -> PeerResult {
    match connect(target, default_port) {
        Err(e) => PeerResult {
            target: target.to_string(),
            result: Err(e),
            rtt: None,
            back: Back::NotTried,
        },
        Ok((s, addr, took)) => {
            let (rtt, back) = ask_back(&s);
            PeerResult {
                target: target.to_string(),
                result: Ok((addr, took)),
                rtt,
                back,
            }
        }
    }
}

/// Probes every peer in parallel, each bounded (about 4 × [`PEER_TIMEOUT`] at worst).
pub fn reach_peers(peers: &[String], default_port: u16) -> Vec<PeerResult> {
    let handles: Vec<_> = peers
        .iter()
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let p = p.trim().to_string();
            (
                p.clone(),
                std::thread::spawn(move || probe_peer(&p, default_port)),
            )
        })
        .collect();
    handles
        .into_iter()
        .map(|(p, h)| {
            h.join().unwrap_or_else(|_| PeerResult {
                target: p,
                result: Err("the check panicked".into()),
                rtt: None,
                back: Back::NotTried,
            })
        })
        .collect()
}

// ---------------------------------------------------------------- --listen

/// `PORT` or `ADDR:PORT` (`[V6]:PORT`) as a socket address; a bare port listens on every IPv4 address.
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    if let Ok(p) = s.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), p));
    }
    s.parse::<SocketAddr>().map_err(|_| {
        format!("--listen {s}: expected PORT or ADDR:PORT (e.g. 29500, 0.0.0.0:29500, [::]:29500)")
    })
}

/// Answers one probe on `s` (from `from`): ack, connect back, result.
/// `None` when it was not a probe.
pub fn serve(s: TcpStream, from: SocketAddr) -> Option<Answered> {
    let _ = s.set_read_timeout(Some(PEER_TIMEOUT));
    let _ = s.set_write_timeout(Some(PEER_TIMEOUT));
    let line = read_line(&s).ok()?;
    let rest = line.strip_prefix(&format!("{PROTO} hello "))?;
    let (n, port) = rest.split_once(' ')?;
    let port: u16 = port.trim().parse().ok()?;
    if n.is_empty() || n.len() > 64 || !n.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    let mut w = &s;
    w.write_all(format!("{PROTO} ack\n").as_bytes()).ok()?;
    // Back to the address the probe came from: what NCCL's peers would dial.
    let back_to = SocketAddr::new(from.ip(), port);
    let t0 = Instant::now();
    let result = match TcpStream::connect_timeout(&back_to, PEER_TIMEOUT) {
        Ok(mut c) => {
            let _ = c.set_write_timeout(Some(PEER_TIMEOUT));
            match c.write_all(format!("{PROTO} back {n}\n").as_bytes()) {
                Ok(()) => Ok(t0.elapsed()),
                Err(e) => Err(format!("connected, but sending failed ({e})")),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Err(format!(
            "no answer within {} s (a firewall dropping packets, or no route)",
            PEER_TIMEOUT.as_secs()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            Err("connection refused (a firewall rejects it)".to_string())
        }
        Err(e) => Err(e.to_string()),
    };
    let msg = match &result {
        Ok(d) => format!("{PROTO} result ok {} {back_to}\n", d.as_micros()),
        Err(e) => format!("{PROTO} result fail {back_to} {}\n", e.replace('\n', " ")),
    };
    let _ = w.write_all(msg.as_bytes());
    Some(Answered {
        from,
        back_to,
        result,
    })
}

/// A bound `--listen` socket answering probes on a thread until `expect`
/// were answered or `timeout` passed.
pub struct Listening {
    handle: Option<std::thread::JoinHandle<(Vec<Answered>, Duration)>>,
    bound: Result<SocketAddr, String>,
    asked: String,
    timeout: Duration,
    expect: usize,
}

/// Binds `asked` and starts answering; a bind error is kept for the report.
pub fn start_listen(asked: &str, expect: usize, timeout: Duration) -> Listening {
    let mut l = Listening {
        handle: None,
        bound: Err(String::new()),
        asked: asked.to_string(),
        timeout,
        expect,
    };
    let addr = match parse_listen(asked) {
        Ok(a) => a,
        Err(e) => {
            l.bound = Err(e);
            return l;
        }
    };
    let listener = match TcpListener::bind(addr).and_then(|s| {
        s.set_nonblocking(true)?;
        Ok(s)
    }) {
        Ok(s) => s,
        Err(e) => {
            l.bound = Err(e.to_string());
            return l;
        }
    };
    let local = listener.local_addr().unwrap_or(addr);
    l.bound = Ok(local);
    eprintln!(
        "oxccl doctor: listening on {local} for up to {} s ({expect} probe(s) expected)",
        timeout.as_secs()
    );
    l.handle = Some(std::thread::spawn(move || {
        accept_loop(&listener, expect, timeout)
    }));
    l
}

fn accept_loop(
    listener: &TcpListener,
    expect: usize,
    timeout: Duration,
) -> (Vec<Answered>, Duration) {
    let t0 = Instant::now();
    let deadline = t0 + timeout;
    let (tx, rx) = mpsc::channel::<Option<Answered>>();
    let mut inflight = 0usize;
    let mut answered = Vec::new();
    while answered.len() < expect && Instant::now() < deadline {
        while let Ok(a) = rx.try_recv() {
            inflight -= 1;
            answered.extend(a);
        }
        if answered.len() >= expect {
            break;
        }
        if inflight >= MAX_INFLIGHT {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        // Wait for a connection (up to 100 ms) without a polling delay in the round trip.
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(listener),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the listener's open descriptor.
        unsafe { libc::poll(&mut pfd, 1, 100) };
        match listener.accept() {
            Ok((s, from)) => {
                let _ = s.set_nonblocking(false);
                inflight += 1;
                let tx = tx.clone();
                std::thread::spawn(move || {
                    let _ = tx.send(serve(s, from));
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    let waited = t0.elapsed();
    // Probes being answered finish within their own bounds (2 × PEER_TIMEOUT).
    let end = Instant::now() + 2 * PEER_TIMEOUT + Duration::from_millis(500);
    while inflight > 0 {
        match rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
            Ok(a) => {
                inflight -= 1;
                answered.extend(a);
            }
            Err(_) => break,
        }
    }
    (answered, waited)
}

impl Listening {
    /// Waits for the listening thread (bounded by its timeout) and reports.
    pub fn finish(self) -> ListenFacts {
        let (probes, waited) = match self.handle {
            Some(h) => h.join().unwrap_or_default(),
            None => (Vec::new(), Duration::ZERO),
        };
        ListenFacts {
            bound: self.bound,
            asked: self.asked,
            waited,
            timeout: self.timeout,
            expect: self.expect,
            probes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen("29500").unwrap().to_string(), "0.0.0.0:29500");
        assert_eq!(parse_listen("127.0.0.1:1").unwrap().port(), 1);
        assert_eq!(parse_listen("[::]:7").unwrap().port(), 7);
        assert!(parse_listen("x:y").is_err());
        assert_eq!(split_peer("h", 5).unwrap(), ("h".to_string(), 5));
        assert_eq!(split_peer("[::1]:9", 5).unwrap(), ("::1".to_string(), 9));
    }

    /// Both halves in one process: a listener thread answers a prober thread.
    #[test]
    fn both_ways_on_loopback() {
        let l = start_listen("127.0.0.1:0", 1, Duration::from_secs(8));
        let port = l.bound.clone().unwrap().port();
        let r = probe_peer(&format!("127.0.0.1:{port}"), 1);
        assert!(r.result.is_ok(), "{r:?}");
        assert!(matches!(r.back, Back::Ok { .. }), "{r:?}");
        assert!(r.rtt.is_some());
        let f = l.finish();
        assert_eq!(f.probes.len(), 1, "{f:?}");
        assert!(f.probes[0].result.is_ok(), "{f:?}");
    }

    /// A listener whose call back finds a closed port reports it, on both sides.
    #[test]
    fn call_back_to_a_closed_port_fails() {
        let srv = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = srv.local_addr().unwrap();
        let closed = TcpListener::bind("127.0.0.1:0").unwrap();
        let closed_port = closed.local_addr().unwrap().port();
        drop(closed);
        let t = std::thread::spawn(move || {
            let (s, from) = srv.accept().unwrap();
            serve(s, from)
        });
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(format!("{PROTO} hello abc123 {closed_port}\n").as_bytes())
            .unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(read_line(&c).unwrap(), format!("{PROTO} ack"));
        let res = read_line(&c).unwrap();
        assert!(
            res.starts_with(&format!(
                "{PROTO} result fail 127.0.0.1:{closed_port} connection refused"
            )),
            "{res}"
        );
        let a = t.join().unwrap().unwrap();
        assert!(a.result.unwrap_err().contains("refused"));
    }

    /// Garbage is not a probe: no answer, no call back.
    #[test]
    fn garbage_is_not_a_probe() {
        let srv = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = srv.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (s, from) = srv.accept().unwrap();
            serve(s, from)
        });
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(b"GET / HTTP/1.0\n").unwrap();
        assert!(t.join().unwrap().is_none());
    }
}
