//! The socket options std does not expose (buffer sizes, keepalive,
//! TCP_USER_TIMEOUT), as thin libc calls. Kept apart from tcp.rs so that
//! tcp.rs stays free of `unsafe`.

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

/// How a TCP connection gives up on a silent peer, from the link timeout `L`
/// (`OXCCL_LINK_TIMEOUT_MS`, by default the operation timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LinkPlan {
    /// Seconds of silence before the first keepalive probe: `L / 2`, so that
    /// probes are out well before `L`.
    pub idle_s: usize,
    /// Seconds between probes: `L / 10`, at least 1.
    pub interval_s: usize,
    /// Probes before giving up: enough to reach `L` (kernels without
    /// TCP_USER_TIMEOUT stop at `idle + interval * count`).
    pub count: usize,
    /// TCP_USER_TIMEOUT: unacknowledged data (or unanswered probes) for this
    /// long ends the connection with ETIMEDOUT; Linux then ignores `count`.
    pub user_timeout_ms: usize,
}

/// Linux's bounds: TCP_KEEPIDLE and TCP_KEEPINTVL at most 32767 s,
/// TCP_KEEPCNT at most 127, TCP_USER_TIMEOUT a non-negative `int` of ms.
const MAX_KEEP_SECS: u64 = 32_767;
const MAX_KEEP_COUNT: u64 = 127;

/// The keepalive and retransmission limits for a link timeout (pure).
/// Keepalive counts whole seconds, so a timeout under 2 s is taken as 2 s;
/// one beyond the kernel's bounds (a year for "no timeout") gets the largest
/// values it takes (24 days of TCP_USER_TIMEOUT).
pub(crate) fn link_plan(timeout: std::time::Duration) -> LinkPlan {
    let secs = timeout.as_secs().max(2);
    let idle = (secs / 2).clamp(1, MAX_KEEP_SECS);
    let interval = (secs / 10).clamp(1, MAX_KEEP_SECS);
    let count = (secs.saturating_sub(idle))
        .div_ceil(interval)
        .clamp(1, MAX_KEEP_COUNT);
    let ms = timeout.as_millis().clamp(2000, i32::MAX as u128);
    LinkPlan {
        idle_s: idle as usize,
        interval_s: interval as usize,
        count: count as usize,
        user_timeout_ms: ms as usize,
    }
}

/// Keepalive probes on an idle connection (a control connection, which
/// carries no data while all is well) and TCP_USER_TIMEOUT, per `plan`: a
/// peer whose host vanished or whose link stays cut is declared dead after
/// the link timeout, and an outage shorter than it is ridden out. A healthy
/// peer answers probes from its kernel, so a slow or stopped rank is never
/// mistaken for a dead one. Best effort: failures leave the socket as it was.
pub(crate) fn enable_keepalive(stream: &TcpStream, plan: LinkPlan) {
    set_level_opt(stream, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set_level_opt(stream, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, plan.idle_s);
    set_level_opt(
        stream,
        libc::IPPROTO_TCP,
        libc::TCP_KEEPINTVL,
        plan.interval_s,
    );
    set_level_opt(stream, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, plan.count);
    limit_retransmissions(stream, plan);
}

/// TCP_USER_TIMEOUT alone (data connections): data left unacknowledged for
/// the link timeout ends the connection; without it Linux retransmits for
/// about 15 minutes (tcp_retries2), whatever the operation timeout. Best effort.
pub(crate) fn limit_retransmissions(stream: &TcpStream, plan: LinkPlan) {
    set_level_opt(
        stream,
        libc::IPPROTO_TCP,
        libc::TCP_USER_TIMEOUT,
        plan.user_timeout_ms,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// What keepalive alone allows before giving up.
    fn keepalive_span(p: LinkPlan) -> usize {
        p.idle_s + p.interval_s * p.count
    }

    #[test]
    fn link_plan_follows_the_timeout() {
        for secs in [2u64, 3, 8, 10, 15, 60, 600, 3600] {
            let p = link_plan(Duration::from_secs(secs));
            let span = keepalive_span(p) as u64;
            assert!(
                span >= secs && span < secs + p.interval_s as u64,
                "{secs} s: {p:?}"
            );
            assert_eq!(p.user_timeout_ms as u64, secs * 1000, "{p:?}");
            // Probes start before the timeout, so TCP_USER_TIMEOUT can act.
            assert!((p.idle_s as u64) < secs, "{p:?}");
        }
        assert_eq!(
            link_plan(Duration::from_secs(10)),
            LinkPlan {
                idle_s: 5,
                interval_s: 1,
                count: 5,
                user_timeout_ms: 10_000
            }
        );
        assert_eq!(
            link_plan(Duration::from_secs(60)),
            LinkPlan {
                idle_s: 30,
                interval_s: 6,
                count: 5,
                user_timeout_ms: 60_000
            }
        );
        // Below keepalive's whole seconds.
        let p = link_plan(Duration::from_millis(300));
        assert_eq!(
            (p.idle_s, p.interval_s, p.count, p.user_timeout_ms),
            (1, 1, 1, 2000)
        );
        // A year ("no timeout"): within the kernel's bounds.
        let p = link_plan(Duration::from_secs(365 * 24 * 3600));
        assert_eq!((p.idle_s, p.interval_s, p.count), (32_767, 32_767, 127));
        assert_eq!(p.user_timeout_ms, i32::MAX as usize);
    }

    #[test]
    fn socket_takes_the_plan() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        enable_keepalive(&a, link_plan(Duration::from_secs(60)));
        let get = |level, opt| {
            let mut v: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: valid fd and out-pointers of the size passed.
            let rc = unsafe {
                libc::getsockopt(
                    a.as_raw_fd(),
                    level,
                    opt,
                    (&mut v as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            assert_eq!(rc, 0);
            v
        };
        assert_eq!(get(libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 30);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL), 6);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPCNT), 5);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT), 60_000);
    }
}
