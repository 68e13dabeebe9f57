//! Peers on other hosts: one TCP connection per channel.
//!
//! Each half keeps a user-space ring buffer: the send half's is filled by
//! `reserve`/`commit` and drained into the socket by `flush`; the receive
//! half's is topped up from the socket by `fill` (straight into its free
//! contiguous region, no extra copy) and read by `peek`/`consume`. Sockets are
//! non-blocking with TCP_NODELAY: a step is never held back by Nagle, and
//! `flush`/`fill` move as much as the kernel takes now and return.
//!
//! TCP splits the stream anywhere, so the receive side only ever exposes whole
//! 8-byte units (the sender only sends multiples of 8), and a free region
//! handed to `reserve` is rounded down to a multiple of 8.

use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::TcpStream;

use oxccl_core::{Error, Result};

use super::control::PeerControl;
use super::ring::check_capacity;
use super::sys::raise_socket_buffers;
use super::{LinkKind, PeerLink, RecvHalf, SendHalf};

/// Socket buffer size asked for (best effort, see `sys::raise_socket_buffers`).
const SOCKET_BUFFER: usize = 4 << 20;

/// A plain single-threaded byte ring: positions are ever-increasing counters.
struct ByteRing {
    buf: Box<[u8]>,
    head: u64,
    tail: u64,
}

impl ByteRing {
    fn new(capacity: usize) -> ByteRing {
        ByteRing {
            buf: vec![0u8; capacity].into_boxed_slice(),
            head: 0,
            tail: 0,
        }
    }
    fn cap(&self) -> u64 {
        self.buf.len() as u64
    }
    /// (offset, len) of the contiguous free region at `tail`.
    fn free_span(&self) -> (usize, usize) {
        let free = self.cap() - (self.tail - self.head);
        let off = self.tail % self.cap();
        (off as usize, free.min(self.cap() - off) as usize)
    }
    /// (offset, len) of the contiguous used region at `head`.
    fn used_span(&self) -> (usize, usize) {
        let used = self.tail - self.head;
        let off = self.head % self.cap();
        (off as usize, used.min(self.cap() - off) as usize)
    }
}

fn io_error(peer: usize, addr: &str, e: &std::io::Error, doing: &str) -> Error {
    let what = match e.kind() {
        IoKind::ConnectionReset => "reset by peer",
        IoKind::BrokenPipe => "closed by peer",
        IoKind::ConnectionAborted => "aborted",
        IoKind::TimedOut => "timed out",
        _ => "failed",
    };
    Error::remote(format!(
        "connection to rank {peer} ({addr}) {what} while {doing}: {e}"
    ))
}

/// The sending half of one TCP stream.
pub struct TcpSend {
    stream: TcpStream,
    ring: ByteRing,
    reserved: usize,
    peer: usize,
    addr: String,
    dead: Option<Error>,
}

/// The receiving half of one TCP stream.
pub struct TcpRecv {
    stream: TcpStream,
    ring: ByteRing,
    peeked: usize,
    peer: usize,
    addr: String,
    eof: bool,
    dead: Option<Error>,
}

impl SendHalf for TcpSend {
    fn unflushed(&self) -> usize {
        (self.ring.tail - self.ring.head) as usize
    }

    fn reserve(&mut self) -> Result<&mut [u8]> {
        if let Some(e) = &self.dead {
            return Err(e.clone());
        }
        let (off, len) = self.ring.free_span();
        // The socket may have taken a partial unit, leaving head unaligned.
        let len = len & !7;
        self.reserved = len;
        Ok(&mut self.ring.buf[off..off + len])
    }

    fn commit(&mut self, n: usize) {
        assert!(
            n <= self.reserved && n % 8 == 0,
            "tcp commit of {n} bytes: reserved {}, must be a multiple of 8",
            self.reserved
        );
        self.reserved = 0;
        self.ring.tail += n as u64;
    }

    fn flush(&mut self) -> Result<bool> {
        if let Some(e) = &self.dead {
            return Err(e.clone());
        }
        let mut moved = false;
        loop {
            let (off, len) = self.ring.used_span();
            if len == 0 {
                return Ok(moved);
            }
            match self.stream.write(&self.ring.buf[off..off + len]) {
                Ok(0) => {
                    let e = std::io::Error::from(IoKind::WriteZero);
                    let err = io_error(self.peer, &self.addr, &e, "sending");
                    self.dead = Some(err.clone());
                    return Err(err);
                }
                Ok(n) => {
                    self.ring.head += n as u64;
                    moved = true;
                }
                Err(e) if e.kind() == IoKind::WouldBlock => return Ok(moved),
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(e) => {
                    let err = io_error(self.peer, &self.addr, &e, "sending");
                    self.dead = Some(err.clone());
                    return Err(err);
                }
            }
        }
    }
}

impl RecvHalf for TcpRecv {
    fn peek(&mut self) -> Result<&[u8]> {
        let (off, len) = self.ring.used_span();
        let len = len & !7;
        if len == 0 {
            if let Some(e) = &self.dead {
                return Err(e.clone());
            }
            if self.eof {
                let left = self.ring.tail - self.ring.head;
                let tail = if left > 0 {
                    format!(" ({left} bytes of a partial unit left unread)")
                } else {
                    String::new()
                };
                return Err(Error::remote(format!(
                    "connection to rank {} ({}) closed by peer while data was expected{tail}: \
                     process exited or was killed",
                    self.peer, self.addr
                )));
            }
        }
        self.peeked = len;
        Ok(&self.ring.buf[off..off + len])
    }

    fn consume(&mut self, n: usize) {
        assert!(
            n <= self.peeked && n % 8 == 0,
            "tcp consume of {n} bytes: peeked {}, must be a multiple of 8",
            self.peeked
        );
        self.peeked = 0;
        self.ring.head += n as u64;
    }

    fn fill(&mut self) -> Result<bool> {
        if let Some(e) = &self.dead {
            return Err(e.clone());
        }
        let mut moved = false;
        while !self.eof {
            let (off, len) = self.ring.free_span();
            if len == 0 {
                break;
            }
            match self.stream.read(&mut self.ring.buf[off..off + len]) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    self.ring.tail += n as u64;
                    moved = true;
                }
                Err(e) if e.kind() == IoKind::WouldBlock => break,
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(e) => {
                    let err = io_error(self.peer, &self.addr, &e, "receiving");
                    self.dead = Some(err.clone());
                    return Err(err);
                }
            }
        }
        Ok(moved)
    }
}

/// Bounds how long data sent on `stream` may stay unacknowledged before the
/// connection fails (TCP_USER_TIMEOUT, per `sys::link_plan`): an outage
/// shorter than `timeout` is ridden out by retransmissions, a longer one
/// ends the connection with ETIMEDOUT instead of after Linux's ~15 minutes.
/// Best effort.
pub fn set_link_timeout(stream: &TcpStream, timeout: std::time::Duration) {
    super::sys::limit_retransmissions(stream, super::sys::link_plan(timeout));
}

/// A link to `peer` over TCP: one connected, authenticated stream per channel
/// (`data`), each used in both directions, with a user-space buffer of
/// `buf_capacity` bytes (a multiple of 8, at least 64) per direction. Sets
/// TCP_NODELAY and non-blocking mode, and raises the socket buffers when the
/// kernel allows it.
pub fn tcp_link(
    peer: usize,
    data: Vec<TcpStream>,
    mut control: PeerControl,
    buf_capacity: usize,
) -> Result<PeerLink> {
    check_capacity(buf_capacity)?;
    if data.is_empty() {
        return Err(Error::invalid_argument(format!(
            "tcp link to rank {peer} with no data connection"
        )));
    }
    let nch = data.len();
    let mut send: Vec<Box<dyn SendHalf>> = Vec::with_capacity(nch);
    let mut recv: Vec<Box<dyn RecvHalf>> = Vec::with_capacity(nch);
    for stream in data {
        let addr = stream
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "address unknown".to_string());
        let sys = |what: &str, e: std::io::Error| {
            Error::system(format!(
                "connection to rank {peer} ({addr}): cannot {what}: {e}"
            ))
        };
        stream
            .set_nodelay(true)
            .map_err(|e| sys("set TCP_NODELAY", e))?;
        stream
            .set_nonblocking(true)
            .map_err(|e| sys("make it non-blocking", e))?;
        raise_socket_buffers(&stream, SOCKET_BUFFER);
        let rstream = stream
            .try_clone()
            .map_err(|e| sys("duplicate the socket", e))?;
        send.push(Box::new(TcpSend {
            stream,
            ring: ByteRing::new(buf_capacity),
            reserved: 0,
            peer,
            addr: addr.clone(),
            dead: None,
        }));
        recv.push(Box::new(TcpRecv {
            stream: rstream,
            ring: ByteRing::new(buf_capacity),
            peeked: 0,
            peer,
            addr,
            eof: false,
            dead: None,
        }));
    }
    // A peer that sent its last bytes and exited is not gone for a receiver
    // until those bytes have arrived: the data streams' own close says when.
    control.set_data_reports_close();
    oxccl_env::info!(
        oxccl_env::Subsys::NET,
        "connected to rank {peer} via NET/Socket: {nch} channels"
    );
    Ok(PeerLink {
        peer,
        kind: LinkKind::Tcp,
        send,
        recv,
        control,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_ring_spans() {
        let mut r = ByteRing::new(64);
        assert_eq!(r.free_span(), (0, 64));
        r.tail = 60;
        r.head = 3;
        assert_eq!(r.free_span(), (60, 4));
        assert_eq!(r.used_span(), (3, 57));
        r.tail = 67;
        assert_eq!(r.free_span(), (3, 0));
        r.head = 64;
        assert_eq!(r.used_span(), (0, 3));
    }
}
