//! Worker for `bench/tcp_hosts.sh`: a plain TCP stream and an oxccl
//! all_reduce sweep, each side run inside its own network namespace.
//!
//! Usage:
//!   netns_worker tcp-recv <ip:port> <bytes>    listen, take one stream, print GB/s
//!   netns_worker tcp-send <ip:port> <bytes>    connect (retrying) and send
//!   netns_worker all-reduce <rank> <nranks> <min_bytes> <max_bytes>
//!       f32 sum sweep (sizes x4); ranks meet through NCCL_COMM_ID; rank 0 prints
//!       "bytes us algbw_GBps busbw_GBps" per size.

#![forbid(unsafe_code)]

use oxccl::{Communicator, RedOp, UniqueId};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

const CHUNK: usize = 4 << 20;

fn arg<T: std::str::FromStr>(a: &[String], i: usize, what: &str) -> T {
    a.get(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("argument {i} ({what}) missing or invalid: {a:?}"))
}

fn tcp_recv(addr: SocketAddr, total: u64) {
    let l = TcpListener::bind(addr).expect("bind");
    println!("listening {addr}");
    let (mut s, _) = l.accept().expect("accept");
    let mut buf = vec![0u8; CHUNK];
    let mut got = 0u64;
    let mut t0 = None;
    while got < total {
        let n = s.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        t0.get_or_insert_with(Instant::now);
        got += n as u64;
    }
    let secs = t0.map(|t| t.elapsed().as_secs_f64()).unwrap_or(0.0);
    assert_eq!(got, total, "stream ended early");
    println!(
        "tcp_stream bytes {got} secs {secs:.3} GBps {:.3}",
        got as f64 / secs / 1e9
    );
}

fn tcp_send(addr: SocketAddr, total: u64) {
    let t0 = Instant::now();
    let mut s = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(e) if t0.elapsed() < Duration::from_secs(10) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("connect {addr}: {e}"),
        }
    };
    let buf = vec![1u8; CHUNK];
    let mut sent = 0u64;
    while sent < total {
        let n = (total - sent).min(CHUNK as u64) as usize;
        s.write_all(&buf[..n]).expect("write");
        sent += n as u64;
    }
}

fn all_reduce(rank: usize, n: usize, min: usize, max: usize) {
    let id = UniqueId::new().expect("unique id (set NCCL_COMM_ID)");
    let c = Communicator::init_rank(n, &id, rank).expect("init");
    if rank == 0 {
        println!(
            "{:>12} {:>12} {:>12} {:>12}",
            "bytes", "us", "algbw_GBps", "busbw_GBps"
        );
    }
    let mut bytes = min.max(4);
    while bytes <= max {
        let count = bytes / 4;
        let send = vec![1.0f32; count];
        let mut recv = vec![0f32; count];
        // About 1 GiB per size, at least 5 iterations.
        let iters = ((1usize << 30) / bytes).clamp(5, 200);
        for _ in 0..2 {
            c.all_reduce(&send, &mut recv, RedOp::Sum).expect("warmup");
        }
        let t = Instant::now();
        for _ in 0..iters {
            c.all_reduce(&send, &mut recv, RedOp::Sum)
                .expect("all_reduce");
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        assert_eq!(recv[0], n as f32);
        assert_eq!(recv[count - 1], n as f32);
        if rank == 0 {
            let algbw = bytes as f64 / us / 1e3;
            let busbw = algbw * 2.0 * (n as f64 - 1.0) / n as f64;
            println!("{bytes:>12} {us:>12.1} {algbw:>12.3} {busbw:>12.3}");
        }
        bytes *= 4;
    }
    c.destroy().expect("destroy");
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    match a.get(1).map(String::as_str) {
        Some("tcp-recv") => tcp_recv(arg(&a, 2, "addr"), arg(&a, 3, "bytes")),
        Some("tcp-send") => tcp_send(arg(&a, 2, "addr"), arg(&a, 3, "bytes")),
        Some("all-reduce") => all_reduce(
            arg(&a, 2, "rank"),
            arg(&a, 3, "nranks"),
            arg(&a, 4, "min_bytes"),
            arg(&a, 5, "max_bytes"),
        ),
        _ => {
            eprintln!("usage: netns_worker tcp-recv|tcp-send <ip:port> <bytes> | all-reduce <rank> <nranks> <min> <max>");
            std::process::exit(2);
        }
    }
}
