//! How many ranks `ncclCommInitAll` can run in this process: its per-rank
//! costs (pure) against the process's limits (read from /proc).
//!
//! Costs of in-process ranks, measured with `ncclCommInitAll` on host
//! buffers (1 MiB rings, x86-64 Linux, 2026-12-02; threads, descriptors and
//! resident memory after init minus before):
//!
//! | ranks | threads | descriptors | memory |
//! | --- | --- | --- | --- |
//! | 4 | 12 | 20 | 38 MiB |
//! | 8 | 32 | 56 | 169 MiB |
//! | 16 | 80 | 144 | 577 MiB |
//! | 32 | 192 | 352 | 2.6 GiB |
//!
//! that is `n (log2 n + 1)` threads, `n (2 log2 n + 1)` descriptors and about
//! 3 ring sizes per ordered pair of ranks (`3 r n (n - 1)` bytes).

use oxccl::{Error, Result};

/// What the process may still take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Room {
    /// Descriptors: the soft RLIMIT_NOFILE minus those open.
    pub fds: u64,
    /// Threads: the smaller of RLIMIT_NPROC and kernel.threads-max, minus
    /// this process's threads.
    pub threads: u64,
    /// Bytes of memory available (MemAvailable).
    pub memory: u64,
}

/// `(threads, descriptors, bytes)` that `n` in-process ranks with rings of
/// `ring_bytes` take (see the module's table).
pub(crate) fn init_all_cost(n: u64, ring_bytes: u64) -> (u64, u64, u64) {
    let log2 = u64::from(n.max(1).next_power_of_two().trailing_zeros());
    let threads = n.saturating_mul(log2 + 1);
    let fds = n.saturating_mul(2 * log2 + 1);
    let bytes = n
        .saturating_mul(n.saturating_sub(1))
        .saturating_mul(ring_bytes.saturating_mul(3));
    (threads, fds, bytes)
}

/// Refuses `ndev` ranks the process has no room for, naming the limit.
pub(crate) fn check_init_all(ndev: u64, ring_bytes: u64, room: Room) -> Result<()> {
    let (threads, fds, bytes) = init_all_cost(ndev, ring_bytes);
    let why = if fds > room.fds {
        Some(format!(
            "{fds} file descriptors, {} left under RLIMIT_NOFILE",
            room.fds
        ))
    } else if threads > room.threads {
        Some(format!(
            "{threads} threads, {} left under the thread limits (RLIMIT_NPROC, kernel.threads-max)",
            room.threads
        ))
    } else if bytes > room.memory {
        Some(format!(
            "{} MiB of rings ({} ranks x {} peers x 3 x {ring_bytes}-byte rings, NCCL_BUFFSIZE), {} MiB available",
            bytes >> 20,
            ndev,
            ndev.saturating_sub(1),
            room.memory >> 20
        ))
    } else {
        None
    };
    match why {
        Some(why) => Err(Error::invalid_argument(format!(
            "ndev {ndev} is more ranks than this process can run: they would need {why}"
        ))),
        None => Ok(()),
    }
}

/// The first number on the line of `text` that starts with `key`.
fn field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// This process's room, from /proc (unlimited where a file cannot be read).
pub(crate) fn room() -> Room {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let limits = read("/proc/self/limits");
    let status = read("/proc/self/status");
    let open = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    let nofile = field(&limits, "Max open files").unwrap_or(u64::MAX);
    let nproc = field(&limits, "Max processes").unwrap_or(u64::MAX);
    let threads_max = read("/proc/sys/kernel/threads-max")
        .trim()
        .parse()
        .unwrap_or(u64::MAX);
    let mine = field(&status, "Threads:").unwrap_or(0);
    let memory = field(&read("/proc/meminfo"), "MemAvailable:").map_or(u64::MAX, |kb| kb << 10);
    Room {
        fds: nofile.saturating_sub(open),
        threads: nproc.min(threads_max).saturating_sub(mine),
        memory,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_matches_the_measurements() {
        let mib = 1 << 20;
        for (n, threads, fds, mem_mib) in [(4, 12, 20, 38), (8, 32, 56, 169), (16, 80, 144, 577)] {
            let (t, f, b) = init_all_cost(n, mib);
            assert_eq!((t, f), (threads, fds), "{n} ranks");
            // Within a third of the resident memory measured.
            let b = b >> 20;
            assert!(
                b * 3 >= mem_mib * 2 && b * 3 <= mem_mib * 4,
                "{n} ranks: {b} MiB"
            );
        }
        assert_eq!(init_all_cost(1, 1 << 20), (1, 1, 0));
    }

    #[test]
    fn too_many_ranks_are_refused_naming_ndev_and_the_limit() {
        let big = Room {
            fds: 1 << 40,
            threads: 1 << 40,
            memory: 1 << 50,
        };
        assert!(check_init_all(8, 1 << 20, big).is_ok());
        let e = check_init_all(10_000, 1 << 20, Room { fds: 1024, ..big }).unwrap_err();
        assert_eq!(e.kind(), oxccl::ErrorKind::InvalidArgument);
        assert!(e.message().contains("ndev 10000"), "{}", e.message());
        assert!(e.message().contains("RLIMIT_NOFILE"), "{}", e.message());
        let e = check_init_all(
            10_000,
            1 << 20,
            Room {
                threads: 4096,
                ..big
            },
        )
        .unwrap_err();
        assert!(e.message().contains("threads"), "{}", e.message());
        let e = check_init_all(
            64,
            1 << 20,
            Room {
                memory: 1 << 30,
                ..big
            },
        )
        .unwrap_err();
        assert!(
            e.message().contains("12096 MiB of rings"),
            "{}",
            e.message()
        );
        // Exactly at the limit is allowed.
        let (t, f, b) = init_all_cost(16, 1 << 20);
        assert!(check_init_all(
            16,
            1 << 20,
            Room {
                fds: f,
                threads: t,
                memory: b
            }
        )
        .is_ok());
    }

    #[test]
    fn room_reads_this_process() {
        let r = room();
        assert!(r.fds > 0 && r.threads > 0 && r.memory > 0, "{r:?}");
    }
}
