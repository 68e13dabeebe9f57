//! Small sends and receives (the host executor's eager path, at most
//! `EAGER_MAX_BYTES` each) against exact byte references: groups of several
//! sends and receives per rank, between the same pair more than once (they
//! match in issue order), sends first or receives first (no order may
//! deadlock), counts 0, 1, odd and both sides of the eager bound, every
//! element size, beside operations that take the generic path (a large
//! message, a send to self) in the same or the peer's group, so that
//! either end may take either path. Guard bytes after each receive buffer
//! must stay untouched (the wire pads to 8 bytes). Ranks as threads (a
//! proptest over rank counts 2-4, in-process or shared-memory rings and
//! ring sizes) and as processes (a fixed sweep).

mod common;

use common::*;
use oxccl::raw::OpDesc;
use oxccl::{CollKind, Communicator, DataType, RedOp};
use oxccl_host::comm::EAGER_MAX_BYTES;
use proptest::prelude::*;
use std::time::Duration;

const GUARD: usize = 16;
const GUARD_BYTE: u8 = 0xee;

/// One message of a round: `from` sends `count` elements of `dtype` to `to`.
#[derive(Debug, Clone, Copy)]
struct Msg {
    from: usize,
    to: usize,
    count: usize,
    dtype: DataType,
}

/// What every rank of one round does: the messages (the same list on every
/// rank), whether ranks issue their receives first, and which ranks add a
/// send to themselves (their whole group then takes the generic path).
#[derive(Debug, Clone)]
struct Round {
    msgs: Vec<Msg>,
    recvs_first: Vec<bool>,
    self_pair: Vec<bool>,
    seed: u64,
}

/// Counts in elements: 0, 1, odd, and those around the eager bound.
fn count_of(pick: u64, dtype: DataType) -> usize {
    let bound = EAGER_MAX_BYTES / dtype.size();
    let counts = [0, 1, 3, 7, 13, 127, 1001, bound - 1, bound, bound + 1];
    counts[(pick % counts.len() as u64) as usize]
}

/// A round from `seed` on `n` ranks: 1 to 6 messages between random pairs.
fn round_of(seed: u64, n: usize) -> Round {
    let mut z = mix(seed);
    let mut next = || {
        z = mix(z);
        z
    };
    let nmsgs = 1 + (next() % 6) as usize;
    let msgs = (0..nmsgs)
        .map(|_| {
            let from = (next() % n as u64) as usize;
            let to = (from + 1 + (next() % (n as u64 - 1)) as usize) % n;
            let dtype = DataType::ALL[(next() % DataType::ALL.len() as u64) as usize];
            Msg {
                from,
                to,
                count: count_of(next(), dtype),
                dtype,
            }
        })
        .collect();
    Round {
        msgs,
        recvs_first: (0..n).map(|_| next() % 2 == 0).collect(),
        self_pair: (0..n).map(|_| next() % 5 == 0).collect(),
        seed,
    }
}

fn payload(seed: u64, m: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| rnd(seed, m, i) as u8).collect()
}

/// Runs `round` on this rank and checks every byte it received.
fn run_round(c: &Communicator, round: &Round) -> Result<(), String> {
    let (me, seed) = (c.rank(), round.seed);
    let bytes = |m: &Msg| m.count * m.dtype.size();
    let sends: Vec<(usize, Vec<u8>)> = round
        .msgs
        .iter()
        .enumerate()
        .filter(|(_, m)| m.from == me)
        .map(|(i, m)| (i, payload(seed, i, bytes(m))))
        .collect();
    let mut recvs: Vec<(usize, Vec<u8>)> = round
        .msgs
        .iter()
        .enumerate()
        .filter(|(_, m)| m.to == me)
        .map(|(i, m)| (i, vec![GUARD_BYTE; bytes(m) + GUARD]))
        .collect();
    let self_src = payload(seed, usize::MAX, 40);
    let mut self_dst = vec![0u8; 40];
    let op = |kind, send: *const u8, recv: *mut u8, m: &Msg, peer| OpDesc {
        kind,
        send,
        recv,
        count: m.count,
        dtype: m.dtype,
        op: RedOp::Sum,
        root: peer,
    };
    let mut s_ops: Vec<OpDesc> = sends
        .iter()
        .map(|(i, b)| {
            let m = &round.msgs[*i];
            op(CollKind::Send, b.as_ptr(), std::ptr::null_mut(), m, m.to)
        })
        .collect();
    let r_ops: Vec<OpDesc> = recvs
        .iter_mut()
        .map(|(i, b)| {
            let m = &round.msgs[*i];
            op(CollKind::Recv, std::ptr::null(), b.as_mut_ptr(), m, m.from)
        })
        .collect();
    if round.self_pair[me] {
        let m = Msg {
            from: me,
            to: me,
            count: 5,
            dtype: DataType::Float64,
        };
        s_ops.push(op(
            CollKind::Send,
            self_src.as_ptr(),
            std::ptr::null_mut(),
            &m,
            me,
        ));
        s_ops.push(op(
            CollKind::Recv,
            std::ptr::null(),
            self_dst.as_mut_ptr(),
            &m,
            me,
        ));
    }
    let ops: Vec<(&Communicator, OpDesc)> = if round.recvs_first[me] {
        r_ops.iter().chain(&s_ops).map(|o| (c, *o)).collect()
    } else {
        s_ops.iter().chain(&r_ops).map(|o| (c, *o)).collect()
    };
    if !ops.is_empty() {
        // SAFETY: every pointer is into a live vector of this function,
        // sized for its operation's bytes; receive buffers are distinct.
        unsafe { oxccl::raw::run_group(&ops) }.map_err(|e| format!("rank {me}: {e}"))?;
    }
    for (i, got) in &recvs {
        let m = &round.msgs[*i];
        let want = payload(seed, *i, bytes(m));
        let (data, guard) = got.split_at(bytes(m));
        if data != &want[..] {
            let at = data.iter().zip(&want).position(|(a, b)| a != b);
            return Err(format!(
                "rank {me}: message {i} {m:?}: bytes differ from byte {at:?}"
            ));
        }
        if guard.iter().any(|&g| g != GUARD_BYTE) {
            return Err(format!(
                "rank {me}: message {i} {m:?}: written past the buffer"
            ));
        }
    }
    if round.self_pair[me] && self_dst != self_src {
        return Err(format!("rank {me}: the send to itself arrived wrong"));
    }
    Ok(())
}

fn run_rounds_threads(comms: &[Communicator], seed: u64, rounds: usize) {
    for k in 0..rounds {
        let round = round_of(seed.wrapping_add(k as u64), comms.len());
        let res = on_ranks(comms, |c| run_round(c, &round));
        let errs: Vec<&String> = res.iter().filter_map(|r| r.as_ref().err()).collect();
        assert!(errs.is_empty(), "{round:?}:\n{errs:?}");
    }
}

/// How the threads are connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    InProc,
    Shm,
}

fn threads(n: usize, link: Link, capacity: usize) -> Vec<Communicator> {
    init_threads(
        n,
        &test_config(|h| {
            h.capacity = capacity;
            h.p2p_disable = link == Link::Shm;
        }),
    )
    .expect("init_threads")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn threads_small_sends_and_receives(
        n in 2usize..=4,
        link in prop_oneof![Just(Link::InProc), Just(Link::Shm)],
        capacity in prop_oneof![Just(256usize), Just(4096usize), Just(64usize << 10)],
        seed in any::<u64>(),
    ) {
        let _w = Watchdog::new("threads_small_sends_and_receives", Duration::from_secs(120));
        let comms = threads(n, link, capacity);
        run_rounds_threads(&comms, seed, 20);
        for c in comms {
            c.destroy().unwrap();
        }
    }
}

/// Many small messages back to back between the same pair, so that the
/// smallest ring (256 bytes) wraps at every offset: headers and data cross
/// in pieces, and every value arrives in order.
#[test]
fn threads_back_to_back_through_a_small_ring() {
    let _w = Watchdog::new("threads_back_to_back", Duration::from_secs(120));
    for link in [Link::InProc, Link::Shm] {
        let comms = threads(2, link, 256);
        on_ranks(&comms, |c| {
            for i in 0..2000u32 {
                let len = 1 + (i as usize * 7) % 61;
                if c.rank() == 0 {
                    let v: Vec<u8> = (0..len).map(|k| (i as usize + k) as u8).collect();
                    c.send(&v, 1).unwrap();
                } else {
                    let mut v = vec![0u8; len];
                    c.recv(&mut v, 0).unwrap();
                    assert!(
                        v.iter()
                            .enumerate()
                            .all(|(k, &b)| b == (i as usize + k) as u8),
                        "message {i}"
                    );
                }
            }
        });
        for c in comms {
            c.destroy().unwrap();
        }
    }
}

/// The fixed sweep of rounds, ranks as processes over shared memory.
fn processes(test: &str, n: usize) {
    if let Some(ctx) = child_ctx() {
        let c = Communicator::init_rank_config(ctx.nranks, &ctx.id, ctx.rank, test_config(|_| {}))
            .unwrap();
        for k in 0..150u64 {
            let round = round_of(0x5e4d_0000 + k, ctx.nranks);
            if let Err(e) = run_round(&c, &round) {
                panic!("{round:?}: {e}");
            }
        }
        c.destroy().unwrap();
        return;
    }
    let _w = Watchdog::new(test, Duration::from_secs(200));
    let id = oxccl::UniqueId::new().unwrap();
    let mut p = Procs::spawn(test, n, &id, &[]);
    p.expect_success(Duration::from_secs(180));
}

#[test]
fn processes_small_sends_and_receives_2() {
    processes("processes_small_sends_and_receives_2", 2);
}

#[test]
fn processes_small_sends_and_receives_3() {
    processes("processes_small_sends_and_receives_3", 3);
}

#[test]
fn processes_small_sends_and_receives_4() {
    processes("processes_small_sends_and_receives_4", 4);
}
