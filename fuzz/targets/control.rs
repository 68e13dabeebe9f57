//! The control connection between ranks (error reports and goodbyes): the
//! frame decoder on the bytes as given (a report that decodes round-trips),
//! then the same bytes on a real loopback socket read by `PeerControl::check`.
//! Never panics; the stream ends in an error (closed, reported or malformed).

use honggfuzz::fuzz;
use oxccl_fuzz::{close, fed};
use oxccl_host::transport::control::fuzz_decode_frame;
use oxccl_host::transport::PeerControl;

fn main() {
    loop {
        fuzz!(|b: &[u8]| {
            let _ = fuzz_decode_frame(b);
            let b = &b[..b.len().min(64 << 10)];
            let Some((near, far)) = fed(b) else { return };
            let Ok(mut pc) = PeerControl::socket(1, near, "fuzz") else {
                return;
            };
            // Each check reads what has arrived; the far end has closed, so
            // the stream ends within a few checks.
            let mut ended = false;
            for _ in 0..1000 {
                if pc.check().is_err() {
                    ended = true;
                    break;
                }
            }
            assert!(ended, "the control stream never ended");
            close(pc, far);
        });
    }
}
