//! Whether the sweep's buffers fit: the bytes every rank of this host
//! allocates for the largest size, against the memory the host has free,
//! checked before any rank starts (a size too large otherwise fails as
//! allocation errors inside the ranks, interleaved).

use super::coll::Coll;
use oxccl::DataType;

/// What one sweep allocates.
pub struct Need<'a> {
    pub coll: Coll,
    /// The largest size of the sweep (bytes, as `-e` is read).
    pub max_bytes: u64,
    pub types: &'a [DataType],
    /// Ranks of the whole world (counts depend on it).
    pub nranks: usize,
    /// Ranks whose buffers live on this host.
    pub local_ranks: usize,
    /// `-m`: all_reduce and sendrecv give each operation of a group its own buffer.
    pub agg: u64,
    /// `-u`: elements added before each buffer.
    pub unalign: u64,
}

/// Bytes one rank allocates at once: a send buffer and one result buffer per
/// operation of a group, sized for the largest size, for the data type that
/// needs most (types run one after another, each freeing the last's buffers).
pub fn per_rank_bytes(n: &Need<'_>) -> u128 {
    let slots = if n.coll.groups_agg() { n.agg.max(1) } else { 1 } as u128;
    n.types
        .iter()
        .map(|&dt| {
            let es = dt.size() as u128;
            let c = n.coll.counts(n.max_bytes, dt.size(), n.nranks.max(1));
            let pad = n.unalign as u128 * es;
            let send = c.send as u128 * es + pad;
            let slot = c.recv.max(c.send) as u128 * es + pad;
            send + slots * slot
        })
        .max()
        .unwrap_or(0)
}

/// Bytes the ranks of this host allocate together.
pub fn host_bytes(n: &Need<'_>) -> u128 {
    per_rank_bytes(n) * n.local_ranks as u128
}

/// A size as it would be typed: `64G`, `512M`, `8K` when whole, else bytes.
pub fn short_size(b: u64) -> String {
    for (shift, unit) in [(30, 'G'), (20, 'M'), (10, 'K')] {
        if b >= 1 << shift && b % (1 << shift) == 0 {
            return format!("{}{unit}", b >> shift);
        }
    }
    b.to_string()
}

/// `bytes` as GiB with one decimal.
pub fn gib(bytes: u128) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Refuses a sweep whose buffers need more than `available` bytes.
pub fn check_host(n: &Need<'_>, available: u64) -> Result<(), String> {
    let need = host_bytes(n);
    if need <= available as u128 {
        return Ok(());
    }
    let ranks = match n.local_ranks {
        1 => "1 rank needs".to_string(),
        k => format!("{k} ranks need"),
    };
    Err(format!(
        "-e {}: {ranks} {} of host memory for their buffers; {} is available (MemAvailable; accepted: a smaller -e, fewer ranks or one data type)",
        short_size(n.max_bytes),
        gib(need),
        gib(available as u128)
    ))
}

/// Refuses a sweep whose buffers need more than a GPU has: `per_gpu` ranks
/// share the GPU `gpu` (its name and ordinal) of `memory` bytes, the
/// smallest of the machine's.
pub fn check_device(
    n: &Need<'_>,
    per_gpu: usize,
    memory: u64,
    gpu: (&str, usize),
) -> Result<(), String> {
    let need = per_rank_bytes(n) * per_gpu as u128;
    if need <= memory as u128 {
        return Ok(());
    }
    let ranks = match per_gpu {
        1 => "a rank needs".to_string(),
        k => format!("{k} ranks per GPU need"),
    };
    let whose = if per_gpu == 1 { "its" } else { "their" };
    Err(format!(
        "-e {}: {ranks} {} of device memory for {whose} buffers; GPU {} ({}) has {} (accepted: a smaller -e, fewer ranks per GPU or one data type)",
        short_size(n.max_bytes),
        gib(need),
        gpu.1,
        gpu.0,
        gib(memory as u128)
    ))
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
pub fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// This host's available memory, when `/proc/meminfo` says.
pub fn host_available() -> Option<u64> {
    parse_mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(coll: Coll, max: u64, types: &[DataType], local: usize) -> Need<'_> {
        Need {
            coll,
            max_bytes: max,
            types,
            nranks: 4,
            local_ranks: local,
            agg: 1,
            unalign: 0,
        }
    }

    #[test]
    fn all_reduce_needs_a_send_and_a_result_buffer_per_rank() {
        let f = [DataType::Float32];
        let n = need(Coll::AllReduce, 64 << 30, &f, 4);
        assert_eq!(per_rank_bytes(&n), 128 << 30);
        assert_eq!(host_bytes(&n), 512 << 30);
        // -m 3 groups three all-reduces, each with its own result buffer.
        let n3 = Need {
            agg: 3,
            ..need(Coll::AllReduce, 1 << 20, &f, 1)
        };
        assert_eq!(per_rank_bytes(&n3), 4 << 20);
        // -u 2 pads both buffers by two floats.
        let nu = Need {
            unalign: 2,
            ..need(Coll::AllReduce, 1 << 20, &f, 1)
        };
        assert_eq!(per_rank_bytes(&nu), (2 << 20) + 16);
    }

    #[test]
    fn all_gather_result_is_ranks_times_the_input() {
        let f = [DataType::Float32];
        // -e is the result size: each of 4 ranks sends a quarter.
        let n = need(Coll::AllGather, 4 << 20, &f, 1);
        assert_eq!(per_rank_bytes(&n), (1 << 20) + (4 << 20));
    }

    #[test]
    fn device_refusal_names_the_gpu_and_the_ranks_on_it() {
        let n = need(Coll::AllReduce, 64 << 30, &[DataType::Float32], 2);
        // A send and a result buffer of 64 GiB per rank.
        assert_eq!(per_rank_bytes(&n), 128 << 30);
        assert!(check_device(&n, 1, 140 << 30, ("NVIDIA H200", 0)).is_ok());
        let e = check_device(&n, 2, 140 << 30, ("NVIDIA H200", 0)).unwrap_err();
        assert_eq!(
            e,
            "-e 64G: 2 ranks per GPU need 256.0 GiB of device memory for their buffers; GPU 0 (NVIDIA H200) has 140.0 GiB (accepted: a smaller -e, fewer ranks per GPU or one data type)"
        );
        let e = check_device(&n, 1, 80 << 30, ("A100", 3)).unwrap_err();
        assert!(
            e.contains("a rank needs 128.0 GiB") && e.contains("GPU 3 (A100) has 80.0 GiB"),
            "{e}"
        );
    }

    #[test]
    fn refusal_names_need_and_availability() {
        let f = [DataType::Float32];
        let n = need(Coll::AllReduce, 64 << 30, &f, 4);
        let e = check_host(&n, 22_870_000_000).unwrap_err();
        assert!(
            e.starts_with("-e 64G: 4 ranks need 512.0 GiB of host memory for their buffers; 21.3 GiB is available"),
            "{e}"
        );
        assert_eq!(short_size(3 << 20), "3M");
        assert_eq!(short_size(1000), "1000");
        assert!(check_host(&need(Coll::AllReduce, 1 << 20, &f, 4), 1 << 30).is_ok());
    }

    #[test]
    fn meminfo_available() {
        let t = "MemTotal:       32000000 kB\nMemFree:  100 kB\nMemAvailable:   22347776 kB\n";
        assert_eq!(parse_mem_available(t), Some(22347776 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 1 kB\n"), None);
    }
}
