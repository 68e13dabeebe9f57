//! Helpers shared by the transport tests: pseudo-random data, a symmetric
//! streaming driver over a `PeerLink`, and re-exec of the test binary as a
//! child process playing a role.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use oxccl_core::Result;
use oxccl_host::transport::PeerLink;

/// Env var naming the role a re-executed test binary plays.
pub const ROLE: &str = "OXCCL_TEST_ROLE";

/// xorshift64*: deterministic pseudo-random u64s.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0 | 1;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A chunk limit (multiple of 8) from tiny to large.
    pub fn chunk(&mut self) -> usize {
        const SIZES: [usize; 8] = [8, 16, 40, 256, 1000, 4096, 65536, 1 << 20];
        (SIZES[(self.next() % 8) as usize] & !7).max(8)
    }
}

/// `len` (a multiple of 8) pseudo-random bytes from `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x1234_5678);
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        v.extend_from_slice(&r.next().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Sends `per_channel` bytes of `pattern(out_seed + c)` on every channel of
/// `link` and receives and checks `per_channel` bytes of `pattern(in_seed + c)`
/// on each, interleaving everything non-blockingly with varied chunk sizes.
/// Calls `control.check()` while idle. Returns the elapsed time.
pub fn exchange(
    link: &mut PeerLink,
    out_seed: u64,
    in_seed: u64,
    per_channel: usize,
    check_data: bool,
) -> Result<Duration> {
    let nch = link.send.len();
    let out: Vec<Vec<u8>> = (0..nch)
        .map(|c| pattern(out_seed + c as u64, per_channel))
        .collect();
    let exp: Vec<Vec<u8>> = (0..nch)
        .map(|c| pattern(in_seed + c as u64, per_channel))
        .collect();
    let mut sent = vec![0usize; nch];
    let mut got = vec![0usize; nch];
    let mut rng = Rng(out_seed ^ 0xabcdef);
    let start = Instant::now();
    let mut idle = 0u64;
    loop {
        let mut progress = false;
        let mut done = true;
        for c in 0..nch {
            if sent[c] < per_channel {
                let want = rng.chunk().min(per_channel - sent[c]);
                let buf = link.send[c].reserve()?;
                let n = want.min(buf.len()) & !7;
                buf[..n].copy_from_slice(&out[c][sent[c]..sent[c] + n]);
                link.send[c].commit(n);
                sent[c] += n;
                progress |= n > 0;
            }
            progress |= link.send[c].flush()?;
            progress |= link.recv[c].fill()?;
            if got[c] < per_channel {
                let want = rng.chunk();
                let buf = link.recv[c].peek()?;
                let n = want.min(buf.len()).min(per_channel - got[c]);
                assert_eq!(n % 8, 0);
                if check_data && buf[..n] != exp[c][got[c]..got[c] + n] {
                    panic!(
                        "channel {c}: data mismatch in bytes {}..{}",
                        got[c],
                        got[c] + n
                    );
                }
                link.recv[c].consume(n);
                got[c] += n;
                progress |= n > 0;
            }
            done &=
                sent[c] == per_channel && got[c] == per_channel && link.send[c].unflushed() == 0;
        }
        if done {
            return Ok(start.elapsed());
        }
        if !progress {
            idle += 1;
            if idle % 32 == 0 {
                link.control.check()?;
                std::thread::yield_now();
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "exchange stuck: sent {sent:?} got {got:?}"
            );
        }
    }
}

/// Re-executes this test binary to run only `test_name`, with `ROLE=role`
/// and the extra environment `env`.
pub fn spawn_role(test_name: &str, role: &str, env: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child test process")
}

/// Writes one `\n`-terminated line.
pub fn send_line(s: &mut TcpStream, line: &str) {
    s.write_all(line.as_bytes()).unwrap();
    s.write_all(b"\n").unwrap();
}

/// Reads one `\n`-terminated line byte by byte (nothing past it is consumed).
pub fn recv_line(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    loop {
        let n = s.read(&mut b).expect("read line");
        assert!(n == 1, "peer closed during setup");
        if b[0] == b'\n' {
            return String::from_utf8(out).unwrap();
        }
        out.push(b[0]);
    }
}

/// Waits until `f` returns Some, calling it every 100 µs, for at most `limit`.
pub fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<(T, Duration)> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some((v, start.elapsed()));
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Ends a child role process after `secs` even if its parent forgot it.
pub fn child_watchdog(secs: u64) {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(secs));
        std::process::exit(3);
    });
}
