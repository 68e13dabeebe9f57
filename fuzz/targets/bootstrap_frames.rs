//! The bootstrap's frame payloads (after authentication): a join as the root
//! reads it, the root's reply (table or error) as a rank reads it, the hello
//! and the tagged messages between ranks. Never panic; what decodes
//! round-trips through the encoder (checked inside `oxccl_bootstrap::fuzzing`).

use honggfuzz::fuzz;
use oxccl_bootstrap::fuzzing;

fn main() {
    loop {
        fuzz!(|b: &[u8]| {
            let _ = fuzzing::join(b);
            let _ = fuzzing::root_reply(b);
            let _ = fuzzing::hello(b);
            let _ = fuzzing::message(b);
        });
    }
}
