//! `UniqueId::from_bytes`: the 128-byte id another process hands over. Never
//! panics; what it accepts keeps its bytes, and its Debug form hides the secret.

use honggfuzz::fuzz;
use oxccl_bootstrap::{UniqueId, UNIQUE_ID_BYTES};

fn main() {
    loop {
        fuzz!(|b: &[u8]| {
            let mut id = [0u8; UNIQUE_ID_BYTES];
            let n = b.len().min(UNIQUE_ID_BYTES);
            id[..n].copy_from_slice(&b[..n]);
            if let Ok(u) = UniqueId::from_bytes(&id) {
                assert_eq!(u.as_bytes(), &id);
                let _ = (u.root_addr(), u.run_id(), u.rank0_starts_root());
                assert!(format!("{u:?}").contains("redacted"));
            }
        });
    }
}
