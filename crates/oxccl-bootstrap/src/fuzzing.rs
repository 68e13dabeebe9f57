//! Entry points for the coverage-guided fuzz targets in `fuzz/` (hidden from
//! the docs; not an API). Each feeds bytes from another process to the
//! decoder the bootstrap uses for them and returns that decoder's verdict.
//! Where an encoder exists, what decodes is encoded and decoded again, and a
//! difference panics: the fuzzer reports a panic as a crash.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use oxccl_core::Result;

use crate::auth;
use crate::bootstrap::{decode_hello, decode_message, decode_root_reply, RootReply};
use crate::bootstrap::{encode_hello, encode_message};
use crate::root::{encode_top, Join};
use crate::wire::{self, Dec, Limits, CTRL_CAP};

/// A join frame as the root reads it (payload, without the length).
pub fn join(b: &[u8]) -> Result<()> {
    let j = Join::decode(b)?;
    let again = Join::decode(&j.encode()).expect("an encoded join decodes");
    assert_eq!(again, j, "join round trip");
    Ok(())
}

/// The root's reply to a join as a rank reads it: a table, a route or an
/// error.
pub fn root_reply(b: &[u8]) -> Result<()> {
    let root: SocketAddr = ([127, 0, 0, 1], 1).into();
    if b.first() == Some(&wire::T_ERROR) {
        if let Ok(e) = wire::decode_error(&mut Dec::new(&b[1..], "error")) {
            let sent = wire::encode_error(&e);
            let back = wire::decode_error(&mut Dec::new(&sent[1..], "error"))
                .expect("an encoded error decodes");
            assert_eq!(back, e, "error round trip");
        }
    }
    let reply = decode_root_reply(b, root)?;
    let sent = match &reply {
        RootReply::Table(t, direct) => encode_top(t, *direct),
        RootReply::Route(r) => r.encode(),
    };
    let again = decode_root_reply(&sent, root).expect("an encoded reply decodes");
    assert_eq!(again, reply, "root reply round trip");
    Ok(())
}

/// The first frame on a connection between ranks.
pub fn hello(b: &[u8]) -> Result<()> {
    let (rank, run_id, kind, tag) = decode_hello(b)?;
    assert_eq!(encode_hello(rank, run_id, kind, tag), b, "hello round trip");
    Ok(())
}

/// A tagged message between ranks.
pub fn message(b: &[u8]) -> Result<()> {
    let (ns, tag, body) = decode_message(b)?;
    assert_eq!(encode_message(ns, tag, body), b, "message round trip");
    Ok(())
}

/// What the socket-level readers made of one peer's bytes.
#[derive(Debug, Default)]
pub struct StreamVerdict {
    /// The accepting side's handshake passed.
    pub server_accepted: bool,
    /// The connecting side's handshake passed.
    pub client_accepted: bool,
    /// Frames read (first capped at 4 KiB, as after a handshake) before the
    /// stream ended or broke.
    pub frames: usize,
}

/// Plays `peer` (the bytes another process sends, then end of stream) over
/// loopback TCP to the handshake's accepting side, to its connecting side,
/// and to the frame reader.
pub fn stream(key: &[u8; 32], peer: &[u8]) -> StreamVerdict {
    let abort = AtomicBool::new(false);
    let lim = Limits::new(Duration::from_secs(2), &abort);
    let mut v = StreamVerdict::default();
    if let Some((mut s, far)) = fed(peer) {
        v.server_accepted = server(&mut s, key, &lim);
        close(s, far);
    }
    if let Some((mut s, far)) = fed(peer) {
        v.client_accepted = auth::client(&mut s, key, &lim).is_ok();
        close(s, far);
    }
    if let Some((mut s, far)) = fed(peer) {
        let mut cap = CTRL_CAP;
        while let Ok(Some(f)) = wire::read_frame(&mut s, cap, &lim, true) {
            assert!(f.len() <= cap);
            cap = wire::MAX_FRAME;
            v.frames += 1;
        }
        close(s, far);
    }
    v
}

/// The accepting side of the handshake over a blocking socket, as the
/// listener's poll loop drives it (`server_hello`, then `finish`).
fn server(s: &mut TcpStream, key: &[u8; 32], lim: &Limits) -> bool {
    let mut hello = [0u8; 40];
    if !matches!(wire::read_full(s, &mut hello, lim, true), Ok(true)) {
        return false;
    }
    let Ok((side, reply)) = auth::server_hello(&hello) else {
        return false;
    };
    if wire::write_full(s, &reply, lim).is_err() {
        return false;
    }
    let mut theirs = [0u8; 32];
    if !matches!(wire::read_full(s, &mut theirs, lim, true), Ok(true)) {
        return false;
    }
    let Ok(mine) = side.finish(key, &theirs) else {
        return false;
    };
    wire::write_full(s, &mine, lim).is_ok()
}

/// A loopback connection `(near, far)` whose far end sent `peer` and closed
/// its write side; `near` resets on close (see [`close`]). The socket-level
/// targets of this crate and of oxccl-host's control connection share it.
pub fn loopback(peer: &[u8]) -> Option<(TcpStream, TcpStream)> {
    thread_local! {
        static LISTENER: Option<TcpListener> = TcpListener::bind("127.0.0.1:0").ok();
    }
    LISTENER.with(|l| {
        let l = l.as_ref()?;
        let mut far = TcpStream::connect(l.local_addr().ok()?).ok()?;
        let (near, _) = l.accept().ok()?;
        reset_on_close(&near);
        // Loopback buffers hold far more than the fuzzer's inputs (kept small).
        std::io::Write::write_all(&mut far, peer).ok()?;
        far.shutdown(std::net::Shutdown::Write).ok()?;
        Some((near, far))
    })
}

/// [`loopback`] with the bootstrap's socket settings on the near end.
fn fed(peer: &[u8]) -> Option<(TcpStream, TcpStream)> {
    let (near, far) = loopback(peer)?;
    wire::prepare(&near).ok()?;
    Some((near, far))
}

/// Closes the near end first, with a reset (SO_LINGER 0 set by [`loopback`]),
/// so millions of connections leave no TIME_WAIT entries to run out of ports.
pub fn close<T>(near: T, far: TcpStream) {
    drop(near);
    drop(far);
}

fn reset_on_close(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let lg = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a correctly sized option value.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&lg as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}
