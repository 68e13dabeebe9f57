//! A copy that writes around the caches, for placing large results in the
//! caller's receive buffer.
//!
//! Why: a normal store to a line that is not cached first reads the line
//! (read-for-ownership), so placing S bytes costs 2S of memory traffic; with
//! non-temporal stores it costs S. A 2-rank ring all-reduce moves 3S per rank
//! through DRAM with normal stores (read the input, read-for-ownership and
//! write the output) and 2S with these, and on the 2-core development machine
//! (about 20 GB/s of DRAM traffic shared by both ranks) it is DRAM-bound.
//! Only worth it when the data will not be read again soon: the executor uses
//! it for operations larger than [`NT_THRESHOLD`].

/// Operations at least this large place received data with non-temporal
/// stores. Below it, results stay in the caches for the caller (the L3 here
/// holds 260 MB, but a rank's share is far less; 16 MiB was where the
/// benchmark in docs/performance.md stopped gaining from cached stores).
pub const NT_THRESHOLD: usize = 16 << 20;

/// Copies `src` into `dst` (equal lengths) with non-temporal stores where the
/// platform has them.
pub fn nt_copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "nt_copy: lengths differ");
    #[cfg(target_arch = "x86_64")]
    {
        nt_copy_x86(dst, src);
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        dst.copy_from_slice(src);
    }
}

#[cfg(target_arch = "x86_64")]
fn nt_copy_x86(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    let n = dst.len();
    // Short copies: the setup and the fence cost more than they save.
    if n < 4096 {
        dst.copy_from_slice(src);
        return;
    }
    let head = dst.as_ptr().align_offset(16).min(n);
    dst[..head].copy_from_slice(&src[..head]);
    let body = (n - head) & !63;
    let d = dst[head..head + body].as_mut_ptr();
    let s = src[head..head + body].as_ptr();
    let mut i = 0;
    while i < body {
        // SAFETY: i + 64 <= body, so all four 16-byte loads and stores lie
        // inside the `body` sub-slices of `src` and `dst`, which are distinct
        // borrows (one shared, one exclusive). `d + i` is 16-byte aligned:
        // `d` is (head was chosen so) and i is a multiple of 64. SSE2, which
        // these intrinsics need, is part of the x86_64 baseline.
        unsafe {
            let a = _mm_loadu_si128(s.add(i) as *const __m128i);
            let b = _mm_loadu_si128(s.add(i + 16) as *const __m128i);
            let c = _mm_loadu_si128(s.add(i + 32) as *const __m128i);
            let e = _mm_loadu_si128(s.add(i + 48) as *const __m128i);
            _mm_stream_si128(d.add(i) as *mut __m128i, a);
            _mm_stream_si128(d.add(i + 16) as *mut __m128i, b);
            _mm_stream_si128(d.add(i + 32) as *mut __m128i, c);
            _mm_stream_si128(d.add(i + 48) as *mut __m128i, e);
        }
        i += 64;
    }
    // SAFETY: a store fence has no memory-safety preconditions; it orders the
    // streaming stores before anything this thread publishes afterwards.
    unsafe { _mm_sfence() };
    let tail = head + body;
    dst[tail..].copy_from_slice(&src[tail..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_every_length_and_alignment() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for off in [0usize, 1, 3, 8, 15] {
            for len in [0usize, 1, 63, 4095, 4096, 4097, 5000, 12_345] {
                let mut dst = vec![0u8; len + 32];
                nt_copy(&mut dst[off..off + len], &src[off..off + len]);
                assert_eq!(
                    &dst[off..off + len],
                    &src[off..off + len],
                    "off {off} len {len}"
                );
                assert!(dst[..off].iter().all(|&b| b == 0));
                assert!(dst[off + len..].iter().all(|&b| b == 0));
            }
        }
    }
}
