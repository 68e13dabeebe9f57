//! `parse_comm_id` (`NCCL_COMM_ID`, with each `NCCL_SOCKET_FAMILY`): never
//! panics; an address it gives has a port and the family asked for; an error
//! names the setting. Host names that would reach the resolver are skipped.

use honggfuzz::fuzz;
use oxccl_bootstrap::id::parse_comm_id;
use oxccl_bootstrap::Family;
use oxccl_fuzz::{text, would_resolve};

fn main() {
    loop {
        fuzz!(|b: &[u8]| {
            let Some(s) = text(b) else { return };
            if would_resolve(s) {
                return;
            }
            for fam in [None, Some(Family::V4), Some(Family::V6)] {
                match parse_comm_id(s, fam) {
                    Ok(a) => {
                        assert_ne!(a.port(), 0);
                        match fam {
                            Some(Family::V4) => assert!(a.is_ipv4()),
                            Some(Family::V6) => assert!(a.is_ipv6()),
                            None => {}
                        }
                    }
                    Err(e) => assert!(e.message().contains("NCCL_COMM_ID"), "{e}"),
                }
            }
        });
    }
}
