//! Quick all_reduce timing between local processes (developer tool; the
//! user-facing benchmark is `oxccl perf`). Usage: ar_bench [nranks] [max_bytes]

#![forbid(unsafe_code)]

use oxccl::{Communicator, RedOp, UniqueId};
use std::time::Instant;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
fn unhex(s: &str) -> [u8; 128] {
    let mut o = [0u8; 128];
    for (i, c) in o.iter_mut().enumerate() {
        *c = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    o
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2);
    let max: usize = args
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(128 << 20);
    if let Ok(r) = std::env::var("ARB_RANK") {
        let rank: usize = r.parse().unwrap();
        let id = UniqueId::from_bytes(&unhex(&std::env::var("ARB_ID").unwrap())).unwrap();
        let c = Communicator::init_rank(n, &id, rank).unwrap();
        let mut bytes = 8usize;
        while bytes <= max {
            let count = bytes / 4;
            let send = vec![1.0f32; count];
            let mut recv = vec![0f32; count];
            let iters = if bytes < (1 << 20) {
                2000
            } else {
                (2usize << 30) / bytes / 4 + 3
            };
            for _ in 0..(iters / 10).max(2) {
                c.all_reduce(&send, &mut recv, RedOp::Sum).unwrap();
            }
            let t = Instant::now();
            for _ in 0..iters {
                c.all_reduce(&send, &mut recv, RedOp::Sum).unwrap();
            }
            let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
            assert_eq!(recv[0], n as f32);
            if rank == 0 {
                let algbw = bytes as f64 / us / 1e3;
                println!(
                    "{bytes:>12} {us:>10.2} us {algbw:>8.3} GB/s busbw {:>8.3}",
                    algbw * 2.0 * (n as f64 - 1.0) / n as f64
                );
            }
            bytes *= 4;
        }
        return;
    }
    let id = UniqueId::new().unwrap();
    let exe = std::env::current_exe().unwrap();
    let kids: Vec<_> = (0..n)
        .map(|r| {
            std::process::Command::new(&exe)
                .args(&args[1..])
                .env("ARB_RANK", r.to_string())
                .env("ARB_ID", hex(id.as_bytes()))
                .spawn()
                .unwrap()
        })
        .collect();
    for mut k in kids {
        k.wait().unwrap();
    }
}
