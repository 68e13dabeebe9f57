//! Model check of the SPSC ring's index protocol with loom.
//!
//! Run:
//! `RUSTFLAGS="--cfg loom" cargo test -p oxccl-host --release --test loom_ring`
//!
//! The producer and consumer run the crate's own `ProducerIndex` /
//! `ConsumerIndex` (the code behind the shm and in-process rings) over loom
//! atomics, with the data bytes modelled as loom-tracked cells of one 8-byte
//! record each. Loom explores the thread interleavings (and the weak-memory
//! outcomes the Acquire/Release orderings allow) and fails on any access to a
//! cell that is not ordered after the last conflicting one: a consumer reading
//! a record the producer is still writing, or a producer overwriting one the
//! consumer has not finished with. On top of that every record must arrive
//! once, in order, and whole (its two halves agree). The ring holds fewer
//! records than are sent, so the wrap-around is exercised.
#![cfg(loom)]

use std::sync::atomic::Ordering;

use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicU64;
use loom::sync::Arc;
use oxccl_host::transport::ring::{ConsumerIndex, ProducerIndex, RingCounter};

struct Counter(AtomicU64);

impl RingCounter for Counter {
    fn load(&self, order: Ordering) -> u64 {
        self.0.load(order)
    }
    fn store(&self, value: u64, order: Ordering) {
        self.0.store(value, order)
    }
}

/// A ring of `cells.len()` 8-byte records: (sequence number, its complement).
struct Ring {
    head: Counter,
    tail: Counter,
    cells: Vec<UnsafeCell<[u32; 2]>>,
}

// SAFETY: (test model) access to `cells` is what the model checks; loom
// reports any unsynchronised access instead of letting it race.
unsafe impl Sync for Ring {}
// SAFETY: `Ring` owns its cells (plain integers, no thread-bound state), so
// moving it to another thread is sound.
unsafe impl Send for Ring {}

/// Sends `total` records through a ring of `slots` records; the producer
/// writes at most `pbatch` records per reservation, the consumer reads at
/// most `cbatch` per peek.
fn model(slots: usize, total: u32, pbatch: usize, cbatch: usize) {
    let ring = Arc::new(Ring {
        head: Counter(AtomicU64::new(0)),
        tail: Counter(AtomicU64::new(0)),
        cells: (0..slots).map(|_| UnsafeCell::new([0, 0])).collect(),
    });
    let r = ring.clone();
    let producer = loom::thread::spawn(move || {
        let mut idx = ProducerIndex::new(slots * 8);
        let mut next = 0u32;
        while next < total {
            let (off, len) = idx.reserve(&r.head).expect("consistent counters");
            let n = (len / 8).min(pbatch).min((total - next) as usize);
            if n == 0 {
                loom::thread::yield_now();
                continue;
            }
            for i in 0..n {
                let seq = next + i as u32;
                // SAFETY: (model) the protocol says this cell is the producer's.
                r.cells[off / 8 + i].with_mut(|p| unsafe { *p = [seq, !seq] });
            }
            idx.commit(n * 8, &r.tail);
            next += n as u32;
        }
    });
    let mut idx = ConsumerIndex::new(slots * 8);
    let mut expect = 0u32;
    while expect < total {
        let (off, len) = idx.peek(&ring.tail).expect("consistent counters");
        let n = (len / 8).min(cbatch);
        if n == 0 {
            loom::thread::yield_now();
            continue;
        }
        for i in 0..n {
            // SAFETY: (model) the protocol says this cell is the consumer's.
            let [seq, check] = ring.cells[off / 8 + i].with(|p| unsafe { *p });
            assert_eq!(check, !seq, "torn record");
            assert_eq!(seq, expect, "record lost, repeated or out of order");
            expect += 1;
        }
        idx.consume(n * 8, &ring.head);
    }
    producer.join().unwrap();
    let (_, len) = idx.peek(&ring.tail).unwrap();
    assert_eq!(len, 0, "extra bytes after the last record");
}

#[test]
fn loom_ring_single_records_wrap() {
    // 2 slots, 3 records: a slot is reused; one record per step. Unbounded
    // preemptions: every interleaving.
    loom::model(|| model(2, 3, 1, 1));
}

#[test]
fn loom_ring_batches_wrap() {
    // 3 slots, 7 records, batches of up to 2: spans split at the wrap point,
    // every slot is reused twice, and the cached counters are used between
    // refreshes. Bounded to 4 preemptions to keep it under a minute.
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(4);
    b.check(|| model(3, 7, 2, 2));
}
