//! Thin OS wrappers: interface list, host name, host hash, readiness poll,
//! whether a process or a connection is gone.
//! The only `unsafe` of the crate lives here.

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::time::Duration;

use oxccl_core::{Error, Result};
use sha2::{Digest, Sha256};

use crate::ifname::Interface;

/// Every IPv4/IPv6 address of every interface, in the OS's order.
pub fn interfaces() -> Result<Vec<Interface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success the list is freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::system(format!(
            "getifaddrs failed: {}",
            io::Error::last_os_error()
        )));
    }
    let mut out = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list from getifaddrs, valid until freeifaddrs.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let up = ifa.ifa_flags & (libc::IFF_UP as u32) != 0;
        // SAFETY: ifa_addr is non-null and points to at least a sockaddr header.
        let fam = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let (addr, scope_id) = match fam {
            libc::AF_INET => {
                // SAFETY: the family says this is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                (
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))),
                    0,
                )
            }
            libc::AF_INET6 => {
                // SAFETY: the family says this is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                (
                    IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)),
                    sin6.sin6_scope_id,
                )
            }
            _ => continue,
        };
        out.push(Interface {
            name,
            addr,
            scope_id,
            up,
        });
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// This host's name (at most 255 bytes), or "unknown".
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for buf.len() - 1 bytes; the last byte stays NUL.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// A hash identifying this host: SHA-256 of the host name and the kernel's
/// boot id (so two containers with different host names on one machine differ,
/// as in NCCL), first 8 bytes, little-endian.
pub fn host_hash(host_id: Option<&str>) -> u64 {
    // NCCL_HOSTID names the host explicitly: containers or network namespaces
    // that share a hostname and boot id but not memory must not look alike.
    if let Some(id) = host_id {
        let d = Sha256::digest(format!("oxccl-hostid:{id}").as_bytes());
        return u64::from_le_bytes(d[..8].try_into().expect("8 bytes"));
    }
    static H: OnceLock<u64> = OnceLock::new();
    *H.get_or_init(|| {
        let mut h = Sha256::new();
        h.update(hostname().as_bytes());
        if let Ok(b) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
            h.update(b.trim().as_bytes());
        }
        let d = h.finalize();
        u64::from_le_bytes(d[..8].try_into().expect("8 bytes"))
    })
}

/// A random token drawn once per process (tells processes apart when pids repeat
/// across containers).
pub fn process_token() -> u64 {
    static T: OnceLock<u64> = OnceLock::new();
    *T.get_or_init(|| {
        let mut b = [0u8; 8];
        let _ = getrandom::getrandom(&mut b);
        u64::from_le_bytes(b) | 1
    })
}

/// Waits up to `timeout` until any of `fds` is readable (or closed, or in
/// error); returns which, in order. EINTR counts as "none yet".
pub fn poll_readable(fds: &[std::os::fd::RawFd], timeout: Duration) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `pfds` is a valid array of pfds.len() pollfds for the call.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(e);
    }
    Ok(pfds.iter().map(|p| p.revents != 0).collect())
}

/// Accept-queue length asked for by [`widen_backlog`] (NCCL listens with
/// the same; the kernel caps it at `net.core.somaxconn`, 4096 by default).
const BACKLOG: libc::c_int = 16384;

/// Lengthens the accept queue of a listening socket: std listens with 128,
/// and when more connections arrive at once the kernel drops their SYNs,
/// which clients resend only after 1 s, then 3 s, 7 s (measured: 1,024 ranks
/// joining one root). Calling listen(2) again on a listening socket only
/// changes its backlog.
pub fn widen_backlog(l: &std::net::TcpListener) -> io::Result<()> {
    // SAFETY: listen(2) on a descriptor the listener owns for the call.
    let rc = unsafe { libc::listen(l.as_raw_fd(), BACKLOG) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether process `pid` of this host has exited: no `/proc/<pid>`, or a
/// zombie waiting to be reaped (its sockets are already closed and it will
/// never run again). Falls back to `kill(pid, 0)` without /proc.
pub fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S ...": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| matches!(state, 'Z' | 'X' | 'x')),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if std::path::Path::new("/proc/self/stat").exists() {
                return true;
            }
            let Ok(p) = libc::pid_t::try_from(pid) else {
                return false;
            };
            // SAFETY: signal 0 only checks that the process exists.
            let rc = unsafe { libc::kill(p, 0) };
            rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        }
        Err(_) => false,
    }
}

/// Whether the other end of `s` has closed or reset it, without waiting and
/// without consuming data: for connections on which the peer never writes
/// (an outgoing message channel), readable means closed.
pub fn stream_closed(s: &TcpStream) -> bool {
    let mut pfd = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call; timeout 0.
    let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
    if rc <= 0 {
        return false;
    }
    if pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP) != 0 {
        return true;
    }
    let mut one = [0u8; 1];
    // SAFETY: `one` is valid for 1 byte; MSG_PEEK leaves the data queued.
    let n = unsafe {
        libc::recv(
            s.as_raw_fd(),
            one.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n == 0
        || (n < 0
            && !matches!(
                io::Error::last_os_error().kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ))
}
