//! The `NCCL_ALGO` grammar (`Selection::<Algo>::parse`): never panics, and what
//! it accepts answers for every collective consistently.

use honggfuzz::fuzz;
use oxccl_core::algo::{Algo, Selection};
use oxccl_core::CollKind;
use oxccl_fuzz::text;

fn main() {
    loop {
        fuzz!(|b: &[u8]| {
            let Some(s) = text(b) else { return };
            if let Ok(sel) = Selection::<Algo>::parse(s) {
                for k in CollKind::ALL {
                    for a in sel.allowed(k) {
                        assert!(sel.allows(k, a));
                    }
                }
                let _ = sel.is_all();
            }
        });
    }
}
