//! Helpers shared by the fuzz targets in `targets/`.

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

/// A loopback connection whose far end sent the input, and its close:
/// the bootstrap's own (its socket targets use them too).
pub use oxccl_bootstrap::fuzzing::{close, loopback as fed};
