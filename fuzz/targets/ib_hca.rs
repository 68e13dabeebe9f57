//! The `NCCL_IB_HCA` grammar (`HcaSpec::parse`) against a fixed set of
//! devices, and the `NCCL_NET_PLUGIN` value (`library_candidates`). Never
//! panics; an exact, non-excluded spec allows only the names it lists.

use honggfuzz::fuzz;
use oxccl_fuzz::text;
use oxccl_net::{library_candidates, HcaSpec};

fn main() {
    let devs = [("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_10", 2), ("eth0", 1)];
    loop {
        fuzz!(|b: &[u8]| {
            let Some(s) = text(b) else { return };
            let spec = HcaSpec::parse(s);
            for (name, port) in devs {
                let ok = spec.allows(name, port);
                if ok && spec.list.exact && !spec.list.exclude {
                    assert!(spec.list.items.iter().any(|n| n == name));
                }
            }
            if let Some(c) = library_candidates(Some(s)) {
                assert!(!c.is_empty());
            }
        });
    }
}
