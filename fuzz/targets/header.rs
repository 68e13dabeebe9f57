//! The engine's stream header (`Header::decode`): never panics, and what it
//! accepts encodes back to a header that decodes to the same value.

use honggfuzz::fuzz;
use oxccl_core::engine::{Header, HEADER_BYTES};

fn main() {
    loop {
        fuzz!(|b: &[u8]| {
            if let Some(h) = Header::decode(b) {
                assert!(b.len() >= HEADER_BYTES);
                assert_eq!(Header::decode(&h.encode()), Some(h), "round trip");
            }
        });
    }
}
