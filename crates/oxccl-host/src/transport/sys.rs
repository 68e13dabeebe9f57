//! The one socket option std does not expose (buffer sizes), as a thin libc
//! call. Kept apart from tcp.rs so that tcp.rs stays free of `unsafe`.

use std::net::TcpStream;
use std::os::fd::AsRawFd;

fn proc_max(path: &str) -> Option<usize> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn get_opt(stream: &TcpStream, opt: libc::c_int) -> Option<usize> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the fd is valid while `stream` is borrowed; `v`/`len` are valid
    // out-pointers of the size passed.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(v.max(0) as usize)
}

fn set_opt(stream: &TcpStream, opt: libc::c_int, bytes: usize) -> bool {
    set_level_opt(stream, libc::SOL_SOCKET, opt, bytes)
}

fn set_level_opt(stream: &TcpStream, level: libc::c_int, opt: libc::c_int, value: usize) -> bool {
    let v: libc::c_int = value.min(i32::MAX as usize) as libc::c_int;
    // SAFETY: the fd is valid while `stream` is borrowed; `v` is a c_int and
    // its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            level,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    rc == 0
}

/// Raises SO_SNDBUF/SO_RCVBUF to `bytes`, best effort. On Linux an explicit
/// size turns the kernel's buffer autotuning off for that socket and is capped
/// at net.core.{w,r}mem_max (often 208 KiB), which would leave the socket with
/// *less* than autotuning reaches (tcp_wmem/tcp_rmem max, 4-6 MiB); so a size is
/// only set when the cap allows all of it and the socket has less now.
pub(crate) fn raise_socket_buffers(stream: &TcpStream, bytes: usize) {
    for (opt, max_path) in [
        (libc::SO_SNDBUF, "/proc/sys/net/core/wmem_max"),
        (libc::SO_RCVBUF, "/proc/sys/net/core/rmem_max"),
    ] {
        let cap_ok = proc_max(max_path).is_some_and(|m| m >= bytes);
        let have = get_opt(stream, opt).unwrap_or(0);
        if cap_ok && have < bytes {
            set_opt(stream, opt, bytes);
        }
    }
}

/// Keepalive probes on an idle connection: a peer whose host vanished or
/// whose link was cut is declared dead after `idle + interval * count`
/// seconds (5 + 1 * 5 = 10 s with the values the control sockets use), instead
/// of at the operation timeout (600 s by default). A healthy peer answers
/// probes from its kernel, so a slow or busy rank is never mistaken for a dead
/// one. Best effort: failures leave the socket as it was.
pub(crate) fn enable_keepalive(stream: &TcpStream, idle_s: usize, interval_s: usize, count: usize) {
    set_level_opt(stream, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set_level_opt(stream, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle_s);
    set_level_opt(stream, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, interval_s);
    set_level_opt(stream, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, count);
}
