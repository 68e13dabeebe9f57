//! The `NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS` and OXCCL level-list grammars, the
//! `NCCL_DEBUG_FILE` pattern and the `NCCL_DEBUG_TIMESTAMP_FORMAT` pattern.
//! Input: value, NUL, host name, NUL, 16 bytes of pid/seconds/nanoseconds.
//! Never panics; the expanded file name stays bounded.

use honggfuzz::fuzz;
use oxccl_core::logfmt::{debug_file_path, strftime, Level, LevelSet, Subsys};
use oxccl_fuzz::fields;

fn main() {
    loop {
        fuzz!(|b: &[u8]| {
            let f = fields(b, 3);
            let pat = String::from_utf8_lossy(f[0]);
            let host = String::from_utf8_lossy(f[1]);
            let mut nums = [0u8; 16];
            let n = f[2].len().min(16);
            nums[..n].copy_from_slice(&f[2][..n]);
            let pid = u32::from_le_bytes(nums[0..4].try_into().unwrap());
            let secs = i64::from_le_bytes(nums[4..12].try_into().unwrap());
            let nanos = u32::from_le_bytes(nums[12..16].try_into().unwrap());

            let _ = Level::parse(&pat);
            if let Ok(sub) = Subsys::parse_list(&pat) {
                let _ = sub.intersects(Subsys::ALL);
            }
            if let Ok(ls) = LevelSet::parse_list(&pat) {
                for l in Level::ALL {
                    let _ = ls.contains(l);
                }
            }
            let path = debug_file_path(&pat, &host, pid);
            assert!(path.len() <= pat.len() * (host.len() + 10) + 16);
            let _ = strftime(&pat, secs, nanos);
        });
    }
}
