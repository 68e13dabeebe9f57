//! Helpers shared by the fuzz targets in `targets/`.

use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;

/// The input as text, as a loader that refuses non-UTF-8 sees it.
pub fn text(b: &[u8]) -> Option<&str> {
    std::str::from_utf8(b).ok()
}

/// Splits `b` at the first NUL: several fields from one input.
pub fn fields(b: &[u8], n: usize) -> Vec<&[u8]> {
    let mut v: Vec<&[u8]> = b.splitn(n, |&c| c == 0).collect();
    v.resize(n, &[]);
    v
}

/// Whether `parse_comm_id` would ask the resolver about `s` (kept out: a DNS
/// query can take seconds; `localhost` comes from /etc/hosts).
pub fn would_resolve(s: &str) -> bool {
    let t = s.trim();
    let split = match t.strip_prefix('[') {
        Some(r) => r.split_once("]:"),
        None => t.rsplit_once(':'),
    };
    let Some((host, port)) = split else {
        return false;
    };
    !host.is_empty()
        && host != "localhost"
        && host.parse::<std::net::IpAddr>().is_err()
        && port.parse::<u16>().is_ok_and(|p| p != 0)
}

/// A loopback connection `(near, far)` whose far end sent `peer` and closed
/// its write side. Close with [`close`].
pub fn fed(peer: &[u8]) -> Option<(TcpStream, TcpStream)> {
    thread_local! {
        static LISTENER: Option<TcpListener> = TcpListener::bind("127.0.0.1:0").ok();
    }
    LISTENER.with(|l| {
        let l = l.as_ref()?;
        let mut far = TcpStream::connect(l.local_addr().ok()?).ok()?;
        let (near, _) = l.accept().ok()?;
        let lg = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: a valid socket and a correctly sized option value.
        unsafe {
            libc::setsockopt(
                near.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&lg as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            );
        }
        far.write_all(peer).ok()?;
        far.shutdown(Shutdown::Write).ok()?;
        Some((near, far))
    })
}

/// Closes the near end first, with a reset (SO_LINGER 0), so millions of
/// connections leave no TIME_WAIT entries to run out of ports.
pub fn close<T>(near: T, far: TcpStream) {
    drop(near);
    drop(far);
}
