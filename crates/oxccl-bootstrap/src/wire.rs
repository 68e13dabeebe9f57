//! Frames and messages on bootstrap connections.
//!
//! A frame is a little-endian `u32` length followed by that many bytes. Lengths
//! are checked against a cap before anything is allocated: [`CTRL_CAP`] for the
//! first frame after authentication (join, hello), [`DATA_CAP`] for everything
//! else. Nothing length-prefixed is read before authentication (the handshake
//! uses fixed-size fields only).
//!
//! Every read and write polls with a short socket timeout ([`POLL`]) and checks
//! a [`Limits`]: a deadline and flags (the communicator's abort flag, the
//! owner's stop flag). An abort is `ErrorKind::Remote` with a message starting
//! "bootstrap: aborted" (the operation did not fail locally: it was cancelled
//! because the communicator is being torn down, the same kind NCCL reports for
//! `ncclCommAbort`-interrupted waits).

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use oxccl_core::{Error, ErrorKind, Result};

/// Socket poll interval: the longest an abort or deadline goes unnoticed.
pub const POLL: Duration = Duration::from_millis(50);
/// Cap on the first frame after authentication (join, peer hello).
pub const CTRL_CAP: usize = 4 << 10;
/// Cap on a message (`send`, allgather payloads). oxccl's own setup messages
/// are at most a few KiB (a rank's settings, transport handles); 16 MiB
/// leaves room for users' own exchanges while bounding what one frame from
/// an authenticated peer can make a rank allocate.
pub const DATA_CAP: usize = 16 << 20;
/// Largest encoding of one rank-table entry: rank 4, host name 2 + 255,
/// host hash 8, pid 4, token 8, two addresses 23 each.
const TABLE_ENTRY_MAX: usize = 4 + 2 + 255 + 8 + 4 + 8 + 23 + 23;

/// Cap on the rank table of `nranks` ranks at its largest (the root's reply
/// to rank 0, a table forwarded down the tree).
pub fn table_cap(nranks: usize) -> usize {
    nranks
        .saturating_mul(TABLE_ENTRY_MAX)
        .saturating_add(64)
        .min(u32::MAX as usize)
}
/// Cap on a whole frame: a payload of [`DATA_CAP`] plus a message header.
pub const MAX_FRAME: usize = DATA_CAP + 64;

/// Message types (first payload byte).
pub const T_JOIN: u8 = 1;
pub const T_TABLE: u8 = 2;
pub const T_ERROR: u8 = 3;
pub const T_HELLO: u8 = 4;
pub const T_MSG: u8 = 5;
/// The root's reply to a rank it does not send the table to: where its
/// table comes from.
pub const T_ROUTE: u8 = 6;
/// The root's reply to a rank it sends the table to: how many ranks it
/// serves so, then the table.
pub const T_TOP: u8 = 7;

/// The error an aborted wait returns.
pub fn aborted() -> Error {
    Error::remote("bootstrap: aborted (the communicator's abort flag is set)")
}

/// "30 s", "1.5 s", "250 ms".
pub fn secs(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// A deadline and cancellation flags observed by blocking operations.
#[derive(Clone, Copy)]
pub struct Limits<'a> {
    /// When to give up (None: never).
    pub deadline: Option<Instant>,
    /// The full timeout, for messages.
    pub timeout: Duration,
    /// Abort flag: set → [`aborted`].
    pub abort: &'a AtomicBool,
    /// Owner's stop flag (background threads); set → `Remote("stopped")`.
    pub stop: Option<&'a AtomicBool>,
}

impl<'a> Limits<'a> {
    /// Limits that expire `timeout` from now.
    pub fn new(timeout: Duration, abort: &'a AtomicBool) -> Limits<'a> {
        Limits {
            deadline: Instant::now().checked_add(timeout),
            timeout,
            abort,
            stop: None,
        }
    }
    /// Ok while neither deadline nor flags fired.
    pub fn check(&self) -> Result<()> {
        if self.abort.load(Ordering::Relaxed) {
            return Err(aborted());
        }
        if self.stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            return Err(Error::remote("bootstrap: stopped"));
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Error::timeout(format!(
                "no progress within {}",
                secs(self.timeout)
            )));
        }
        Ok(())
    }
    /// Time left, or None when there is no deadline.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
    }
}

fn io_err(e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => Error::remote(format!("connection lost: {e}")),
        _ => Error::system(format!("socket error: {e}")),
    }
}

fn is_retry(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// Prepares a stream for polled I/O (timeouts of [`POLL`], TCP_NODELAY).
pub fn prepare(s: &TcpStream) -> Result<()> {
    s.set_nodelay(true).map_err(io_err)?;
    s.set_read_timeout(Some(POLL)).map_err(io_err)?;
    s.set_write_timeout(Some(POLL)).map_err(io_err)?;
    Ok(())
}

/// Reads exactly `buf.len()` bytes. Ok(false) on a clean EOF before the first
/// byte when `eof_ok`; EOF elsewhere is a `Remote` error.
pub fn read_full(s: &mut TcpStream, buf: &mut [u8], lim: &Limits, eof_ok: bool) -> Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 && eof_ok => return Ok(false),
            Ok(0) => return Err(Error::remote("connection closed by the peer")),
            Ok(n) => got += n,
            Err(e) if is_retry(&e) => {}
            Err(e) => return Err(io_err(e)),
        }
        if got < buf.len() {
            lim.check()?;
        }
    }
    Ok(true)
}

/// Writes all of `buf`.
pub fn write_full(s: &mut TcpStream, buf: &[u8], lim: &Limits) -> Result<()> {
    let mut put = 0;
    while put < buf.len() {
        match s.write(&buf[put..]) {
            Ok(0) => return Err(Error::remote("connection closed by the peer")),
            Ok(n) => put += n,
            Err(e) if is_retry(&e) => {}
            Err(e) => return Err(io_err(e)),
        }
        if put < buf.len() {
            lim.check()?;
        }
    }
    Ok(())
}

/// Writes one frame.
pub fn write_frame(s: &mut TcpStream, payload: &[u8], lim: &Limits) -> Result<()> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&l| l as usize <= MAX_FRAME)
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "bootstrap message of {} bytes exceeds the {} MiB limit",
                payload.len(),
                DATA_CAP >> 20
            ))
        })?;
    if payload.len() <= 64 << 10 {
        let mut b = Vec::with_capacity(4 + payload.len());
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(payload);
        write_full(s, &b, lim)
    } else {
        write_full(s, &len.to_le_bytes(), lim)?;
        write_full(s, payload, lim)
    }
}

/// Reads one frame of at most `cap` bytes. Ok(None): clean EOF at a frame
/// boundary (only when `eof_ok`). A longer length is an error; nothing is
/// allocated for it.
pub fn read_frame(
    s: &mut TcpStream,
    cap: usize,
    lim: &Limits,
    eof_ok: bool,
) -> Result<Option<Vec<u8>>> {
    let mut h = [0u8; 4];
    if !read_full(s, &mut h, lim, eof_ok)? {
        return Ok(None);
    }
    let len = u32::from_le_bytes(h) as usize;
    if len > cap {
        return Err(Error::remote(format!(
            "bootstrap frame of {len} bytes exceeds the {cap}-byte limit (corrupt stream or not an oxccl peer)"
        )));
    }
    let mut b = vec![0u8; len];
    read_full(s, &mut b, lim, false)?;
    Ok(Some(b))
}

/// Builds a message payload.
#[derive(Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    pub fn new(ty: u8) -> Enc {
        Enc(vec![ty])
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A string of at most 65535 bytes (longer is cut at a char boundary).
    pub fn str(&mut self, s: &str) -> &mut Self {
        let mut end = s.len().min(u16::MAX as usize);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.u16(end as u16);
        self.0.extend_from_slice(&s.as_bytes()[..end]);
        self
    }
    /// family(1: 4 or 6) + ip(16) + port(2) + scope(4) = 23 bytes.
    pub fn addr(&mut self, a: &SocketAddr) -> &mut Self {
        let mut ip = [0u8; 16];
        let (fam, scope) = match a {
            SocketAddr::V4(v) => {
                ip[..4].copy_from_slice(&v.ip().octets());
                (4, 0)
            }
            SocketAddr::V6(v) => {
                ip.copy_from_slice(&v.ip().octets());
                (6, v.scope_id())
            }
        };
        self.u8(fam);
        self.0.extend_from_slice(&ip);
        self.u16(a.port()).u32(scope)
    }
}

/// Reads a message payload; every failure is a `Remote` "malformed" error.
pub struct Dec<'a> {
    b: &'a [u8],
    what: &'static str,
}

impl<'a> Dec<'a> {
    pub fn new(b: &'a [u8], what: &'static str) -> Dec<'a> {
        Dec { b, what }
    }
    fn bad(&self, why: &str) -> Error {
        Error::remote(format!("bootstrap: malformed {} message: {why}", self.what))
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.b.len() < n {
            return Err(self.bad("truncated"));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.b)
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    pub fn str(&mut self) -> Result<String> {
        let n = self.u16()? as usize;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.bad("string is not UTF-8"))
    }
    pub fn addr(&mut self) -> Result<SocketAddr> {
        let fam = self.u8()?;
        let ip: [u8; 16] = self.take(16)?.try_into().expect("16");
        let port = self.u16()?;
        let scope = self.u32()?;
        match fam {
            4 => Ok(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])),
                port,
            )),
            6 => Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(ip),
                port,
                0,
                scope,
            ))),
            _ => Err(self.bad("unknown address family")),
        }
    }
    pub fn end(&self) -> Result<()> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(self.bad("trailing bytes"))
        }
    }
}

/// An error message sent by the root: kind code + text.
pub fn encode_error(e: &Error) -> Vec<u8> {
    let mut m = Enc::new(T_ERROR);
    m.u32(e.kind().code() as u32).str(e.message());
    m.0
}

/// Decodes [`encode_error`]'s payload (type byte already consumed).
pub fn decode_error(d: &mut Dec) -> Result<Error> {
    let code = d.u32()? as i32;
    let msg = d.str()?;
    let kind = ErrorKind::from_code(code).unwrap_or(ErrorKind::Remote);
    Ok(Error::new(kind, msg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        prepare(&a).unwrap();
        prepare(&b).unwrap();
        (a, b)
    }

    #[test]
    fn frames_round_trip_and_caps() {
        let abort = AtomicBool::new(false);
        let lim = Limits::new(Duration::from_secs(5), &abort);
        let (mut a, mut b) = pair();
        write_frame(&mut a, b"hello", &lim).unwrap();
        assert_eq!(
            read_frame(&mut b, 16, &lim, false).unwrap().unwrap(),
            b"hello"
        );
        // A 4 GiB length prefix is refused before any allocation.
        write_full(&mut a, &[0xff; 4], &lim).unwrap();
        let e = read_frame(&mut b, MAX_FRAME, &lim, false).unwrap_err();
        assert!(e.message().contains("exceeds"), "{e}");
        drop(a);
        assert_eq!(read_frame(&mut b, 16, &lim, true).unwrap(), None);
    }

    #[test]
    fn read_observes_deadline_and_abort() {
        let abort = AtomicBool::new(false);
        let (_a, mut b) = pair();
        let lim = Limits::new(Duration::from_millis(120), &abort);
        let t = Instant::now();
        let e = read_frame(&mut b, 16, &lim, false).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout);
        assert!(t.elapsed() < Duration::from_millis(400));
        abort.store(true, Ordering::Relaxed);
        let lim = Limits::new(Duration::from_secs(60), &abort);
        let e = read_frame(&mut b, 16, &lim, false).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Remote);
        assert!(e.message().contains("aborted"));
    }

    #[test]
    fn codec_rejects_truncation() {
        let mut e = Enc::new(T_HELLO);
        e.u32(7).str("hé").addr(&"[::1]:5".parse().unwrap());
        let mut d = Dec::new(&e.0, "t");
        assert_eq!(d.u8().unwrap(), T_HELLO);
        assert_eq!(d.u32().unwrap(), 7);
        assert_eq!(d.str().unwrap(), "hé");
        assert_eq!(d.addr().unwrap(), "[::1]:5".parse().unwrap());
        d.end().unwrap();
        let mut d = Dec::new(&e.0[..6], "t");
        d.u8().unwrap();
        assert!(d.u32().is_ok() && d.str().is_err());
        assert_eq!(secs(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(secs(Duration::from_secs(30)), "30 s");
    }
}
