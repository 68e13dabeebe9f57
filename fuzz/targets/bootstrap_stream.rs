//! A peer's bytes on a real loopback socket, read by the handshake's
//! accepting side, by its connecting side and by the frame reader (lengths
//! capped before anything is allocated). Never panics, never waits past the
//! end of the stream, and a stranger without the key is never accepted.

use honggfuzz::fuzz;
use oxccl_bootstrap::fuzzing;

const KEY: [u8; 32] = [0x42; 32];

fn main() {
    loop {
        fuzz!(|b: &[u8]| {
            // Loopback buffers take this much without a reader.
            let b = &b[..b.len().min(64 << 10)];
            let v = fuzzing::stream(&KEY, b);
            // The nonces are fresh: fixed bytes cannot carry a valid proof.
            assert!(!v.server_accepted && !v.client_accepted, "{v:?}");
        });
    }
}
