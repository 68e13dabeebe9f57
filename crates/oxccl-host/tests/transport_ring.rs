//! The SPSC ring: a two-thread stress test and a property test of the index
//! protocol against a simple model.

mod transport_common;

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;

use oxccl_host::transport::ring::{heap_ring, ConsumerIndex, ProducerIndex};
use oxccl_host::transport::{RecvHalf, SendHalf};
use proptest::prelude::*;
use transport_common::{pattern, Rng};

fn checksum(acc: u64, bytes: &[u8]) -> u64 {
    bytes.chunks_exact(8).fold(acc, |a, c| {
        (a ^ u64::from_le_bytes(c.try_into().unwrap())).wrapping_mul(0x100_0000_01b3)
    })
}

#[test]
fn ring_stress_two_threads_10mb_through_4k() {
    const TOTAL: usize = 10 << 20;
    let data = std::sync::Arc::new(pattern(42, TOTAL));
    let (mut tx, mut rx) = heap_ring(4096, None, None).unwrap();
    let d = data.clone();
    let producer = std::thread::spawn(move || {
        let mut rng = Rng(1);
        let mut sent = 0;
        while sent < TOTAL {
            let want = (rng.next() as usize % 1024 + 1) * 8;
            let buf = tx.reserve().unwrap();
            let n = want.min(buf.len()).min(TOTAL - sent);
            buf[..n].copy_from_slice(&d[sent..sent + n]);
            tx.commit(n);
            sent += n;
            if n == 0 {
                std::thread::yield_now();
            }
        }
    });
    let mut rng = Rng(2);
    let mut got = 0;
    let mut sum = 0;
    while got < TOTAL {
        let want = (rng.next() as usize % 1024 + 1) * 8;
        let buf = rx.peek().unwrap();
        let n = want.min(buf.len());
        assert_eq!(n % 8, 0);
        sum = checksum(sum, &buf[..n]);
        rx.consume(n);
        got += n;
        if n == 0 {
            std::thread::yield_now();
        }
    }
    producer.join().unwrap();
    assert!(rx.peek().unwrap().is_empty());
    assert_eq!(sum, checksum(0, &data));
}

#[derive(Debug, Clone)]
enum Op {
    Write(usize),
    Read(usize),
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]
    /// Sequential model: the ring behaves as a bounded FIFO of capacity bytes,
    /// spans never cross the wrap point, and nothing is lost or reordered.
    #[test]
    fn index_protocol_is_a_bounded_fifo(
        cap8 in 1usize..40,
        ops in proptest::collection::vec(prop_oneof![
            (0usize..64).prop_map(Op::Write),
            (0usize..64).prop_map(Op::Read),
        ], 1..200),
    ) {
        let cap = cap8 * 8;
        let head = AtomicU64::new(0);
        let tail = AtomicU64::new(0);
        let mut p = ProducerIndex::new(cap);
        let mut c = ConsumerIndex::new(cap);
        let mut mem = vec![0u64; cap / 8];
        let mut model: VecDeque<u64> = VecDeque::new();
        let mut next = 0u64;
        for op in ops {
            match op {
                Op::Write(k) => {
                    let (off, len) = p.reserve(&head).unwrap();
                    prop_assert!(off % 8 == 0 && len % 8 == 0 && off + len <= cap);
                    prop_assert!(len <= cap - model.len() * 8);
                    if model.len() * 8 < cap { prop_assert!(len > 0); }
                    let n = (k * 8).min(len);
                    for i in 0..n / 8 {
                        mem[off / 8 + i] = next;
                        model.push_back(next);
                        next += 1;
                    }
                    p.commit(n, &tail);
                }
                Op::Read(k) => {
                    let (off, len) = c.peek(&tail).unwrap();
                    prop_assert!(off % 8 == 0 && len % 8 == 0 && off + len <= cap);
                    prop_assert!(len <= model.len() * 8);
                    if !model.is_empty() { prop_assert!(len > 0); }
                    let n = (k * 8).min(len);
                    for i in 0..n / 8 {
                        prop_assert_eq!(Some(mem[off / 8 + i]), model.pop_front());
                    }
                    c.consume(n, &head);
                }
            }
        }
    }
}
