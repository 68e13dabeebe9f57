//! A hostile network at start-up, with real processes and sockets on
//! loopback: strangers holding the public `NCCL_COMM_ID` key, an
//! authenticated peer sending oversized or endless messages, and floods of
//! idle connections to the root and to a rank's listener. The rank under
//! attack is a child process (this test binary, re-executed with the
//! scenario's name in `OXBOOT_HOSTILE_CHILD`), so its memory, threads and
//! file descriptors can be counted from /proc.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use oxccl_bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
use oxccl_core::ErrorKind;
use sha2::Sha256;

const CHILD: &str = "OXBOOT_HOSTILE_CHILD";

fn cfg(init: Duration) -> BootstrapConfig {
    BootstrapConfig {
        ifname: Some("lo".into()),
        init_timeout: init,
        timeout: Duration::from_secs(30),
        ..Default::default()
    }
}

fn scenario() -> Option<String> {
    std::env::var(CHILD).ok()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A free port on loopback (bound, then released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child running scenario `name` with `env`; its stdout (log and
/// protocol lines) arrives line by line on the receiver.
struct Kid {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    log: Vec<String>,
}

impl Kid {
    fn start(name: &str, env: &[(&str, String)]) -> Kid {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", name, "--nocapture", "--test-threads=1"]);
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("NCCL_") || k.starts_with("OXCCL_") {
                cmd.env_remove(k);
            }
        }
        cmd.env(CHILD, name).env("NCCL_DEBUG", "WARN");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Kid {
            stdin: child.stdin.take(),
            child,
            lines: rx,
            log: Vec::new(),
        }
    }

    /// The rest of the first line after `prefix`, within `t`.
    fn expect(&mut self, prefix: &str, t: Duration) -> String {
        let end = Instant::now() + t;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.log.push(l.clone());
                    // The test harness may print "test NAME ... " first.
                    if let Some(at) = l.find(prefix) {
                        return l[at + prefix.len()..].to_string();
                    }
                }
                Err(_) => panic!(
                    "child: no line starting {prefix:?} within {t:?}; log:\n{}",
                    self.log.join("\n")
                ),
            }
        }
    }

    fn say(&mut self, line: &str) {
        let s = self.stdin.as_mut().unwrap();
        writeln!(s, "{line}").unwrap();
        s.flush().unwrap();
    }

    /// Closes stdin, waits for exit; returns the whole log.
    fn finish(mut self) -> String {
        drop(self.stdin.take());
        let st = self.child.wait().unwrap();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.log.push(l);
        }
        let log = self.log.join("\n");
        assert!(st.success(), "child failed:\n{log}");
        log
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// In a child: the next line of stdin (empty at EOF).
fn read_cmd() -> String {
    let mut l = String::new();
    let _ = std::io::stdin().read_line(&mut l);
    l.trim().to_string()
}

fn say(line: &str) {
    println!("{line}");
    std::io::stdout().flush().unwrap();
}

/// A field of /proc/PID/status, in its unit (kB for memory).
fn status_field(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let l = s.lines().find(|l| l.starts_with(field)).unwrap();
    l.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn count_dir(path: String) -> usize {
    std::fs::read_dir(path).unwrap().count()
}

fn threads_and_fds(pid: u32) -> (usize, usize) {
    (
        count_dir(format!("/proc/{pid}/task")),
        count_dir(format!("/proc/{pid}/fd")),
    )
}

// ---------------------------------------------------------------------------
// Who can join.

/// With a secret set, a stranger who derives the key the old default way
/// (`NCCL_COMM_ID` with no secret) is refused by the root, cannot take rank
/// 1's slot, and the real job starts.
#[test]
fn stranger_with_the_default_key_cannot_join_a_secret_job() {
    const NAME: &str = "stranger_with_the_default_key_cannot_join_a_secret_job";
    if let Some(s) = scenario() {
        if s == NAME {
            // A real rank: NCCL_COMM_ID with a secret.
            let rank: usize = std::env::var("RANK").unwrap().parse().unwrap();
            let mut c = cfg(Duration::from_secs(20));
            c.comm_id = Some(std::env::var("ADDR").unwrap());
            c.auth_secret = Some("correct horse battery staple".into());
            let id = UniqueId::generate(&c).unwrap();
            let b = Bootstrap::init(&id, 2, rank, &c).unwrap();
            b.barrier().unwrap();
            say(&format!("JOINED pid {}", b.peers()[1].pid));
        }
        return;
    }
    let addr = format!("127.0.0.1:{}", free_port());
    let env = |r: &str| [("RANK", r.to_string()), ("ADDR", addr.clone())];
    let mut rank0 = Kid::start(NAME, &env("0"));
    // The stranger: the key anyone can derive from the address alone.
    let mut open = cfg(Duration::from_secs(10));
    open.comm_id = Some(addr.clone());
    let stranger_id = UniqueId::generate(&open).unwrap();
    let t = Instant::now();
    let e = Bootstrap::init(&stranger_id, 2, 1, &open).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidUsage, "{e}");
    assert!(e.message().contains("did not accept this unique id"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    // The real rank 1 takes its slot; the table names it, not the stranger.
    let mut rank1 = Kid::start(NAME, &env("1"));
    let seen_by_0 = rank0.expect("JOINED pid ", Duration::from_secs(20));
    rank1.expect("JOINED pid ", Duration::from_secs(20));
    assert_eq!(seen_by_0, rank1.pid().to_string());
    assert_ne!(seen_by_0, std::process::id().to_string());
    let log = rank0.finish();
    assert!(log.contains("failed authentication"), "{log}");
    rank1.finish();
}

/// NCCL_COMM_ID without a secret still works, and says once, at WARN, that
/// the job is open and which setting closes it.
#[test]
fn open_comm_id_warns_once() {
    const NAME: &str = "open_comm_id_warns_once";
    if let Some(s) = scenario() {
        if s == NAME {
            for _ in 0..3 {
                let mut c = cfg(Duration::from_secs(10));
                c.comm_id = Some(format!("127.0.0.1:{}", free_port()));
                let id = UniqueId::generate(&c).unwrap();
                let b = Bootstrap::init(&id, 1, 0, &c).unwrap();
                b.barrier().unwrap();
            }
            say("THREE JOBS DONE");
        }
        return;
    }
    let mut k = Kid::start(NAME, &[]);
    k.expect("THREE JOBS DONE", Duration::from_secs(30));
    let log = k.finish();
    let warns: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("without OXCCL_AUTH_SECRET"))
        .collect();
    assert_eq!(warns.len(), 1, "{log}");
    for needle in [
        "anyone who can reach 127.0.0.1:",
        "OXCCL_AUTH_SECRET_FILE",
        "OXCCL_AUTH_REQUIRED=1",
    ] {
        assert!(warns[0].contains(needle), "{needle}: {}", warns[0]);
    }
}

/// OXCCL_AUTH_REQUIRED refuses an open NCCL_COMM_ID job (and an open id
/// made elsewhere); a secret from a file works like the same secret set
/// directly.
#[test]
fn required_secret_refuses_open_jobs_and_reads_secret_files() {
    if scenario().is_some() {
        return;
    }
    let addr = format!("127.0.0.1:{}", free_port());
    let mut c = cfg(Duration::from_secs(5));
    c.comm_id = Some(addr.clone());
    let open_id = UniqueId::generate(&c).unwrap();
    c.auth_required = true;
    let e = UniqueId::generate(&c).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidUsage, "{e}");
    assert!(e.message().contains("OXCCL_AUTH_REQUIRED=1"), "{e}");
    assert!(e.message().contains(&format!("NCCL_COMM_ID={addr}")), "{e}");
    let e = Bootstrap::init(&open_id, 1, 0, &c).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidUsage, "{e}");
    assert!(e.message().contains("OXCCL_AUTH_REQUIRED=1"), "{e}");

    let dir = std::env::temp_dir().join(format!("oxboot-secret-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("secret");
    std::fs::write(&file, "s3cret\n").unwrap();
    c.auth_secret_file = Some(file.clone());
    let from_file = UniqueId::generate(&c).unwrap();
    let mut direct = c.clone();
    direct.auth_secret_file = None;
    direct.auth_secret = Some("s3cret".into());
    assert_eq!(from_file, UniqueId::generate(&direct).unwrap());
    assert_ne!(from_file, open_id);
    // A secret job runs under OXCCL_AUTH_REQUIRED.
    Bootstrap::init(&from_file, 1, 0, &c)
        .unwrap()
        .barrier()
        .unwrap();
    std::fs::write(&file, "").unwrap();
    let e = UniqueId::generate(&c).unwrap_err();
    assert!(e.message().contains("OXCCL_AUTH_SECRET_FILE="), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------
// Memory.

const MAGIC: &[u8; 8] = b"OXCCLBS1";

fn proof(key: &[u8], role: u8, theirs: &[u8], mine: &[u8]) -> Vec<u8> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("any key length");
    m.update(b"oxccl-v1");
    m.update(&[role]);
    m.update(theirs);
    m.update(mine);
    m.finalize().into_bytes().to_vec()
}

/// An authenticated message channel to `addr` as rank `from` of run `run_id`.
fn channel_as(addr: SocketAddr, key: &[u8], from: u32, run_id: u64) -> TcpStream {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let nc = [0x11u8; 32];
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&nc);
    s.write_all(&hello).unwrap();
    let mut reply = [0u8; 40];
    s.read_exact(&mut reply).unwrap();
    s.write_all(&proof(key, b'C', &reply[8..], &nc)).unwrap();
    let mut theirs = [0u8; 32];
    s.read_exact(&mut theirs).unwrap();
    assert_eq!(theirs.to_vec(), proof(key, b'S', &nc, &reply[8..]));
    // Hello: type 4, rank, run id, kind 0 (messages), tag 0.
    let mut h = vec![4u8];
    h.extend_from_slice(&from.to_le_bytes());
    h.extend_from_slice(&run_id.to_le_bytes());
    h.push(0);
    h.extend_from_slice(&0u32.to_le_bytes());
    s.write_all(&(h.len() as u32).to_le_bytes()).unwrap();
    s.write_all(&h).unwrap();
    s
}

/// Sends `count` messages of `size` bytes (namespace 0, `tag`); how many
/// went out before the other side closed the channel.
fn flood_messages(s: &mut TcpStream, size: usize, count: usize, tag: u32) -> usize {
    let mut head = Vec::new();
    head.extend_from_slice(&((size + 6) as u32).to_le_bytes());
    head.push(5);
    head.push(0);
    head.extend_from_slice(&tag.to_le_bytes());
    let body = vec![0xa5u8; size];
    for i in 0..count {
        if s.write_all(&head).and_then(|_| s.write_all(&body)).is_err() {
            return i;
        }
    }
    count
}

/// An authenticated peer sends nine 64 MiB messages, then 15 MiB ones that
/// nobody receives: the first are refused before allocation, the second stop
/// at the per-peer bound; the rank's memory stays within 100 MiB of where it
/// was, and its next receive from that peer names the peer and the bound.
#[test]
fn oversized_and_unreceived_messages_keep_memory_flat() {
    const NAME: &str = "oversized_and_unreceived_messages_keep_memory_flat";
    if let Some(s) = scenario() {
        if s == NAME {
            let c = cfg(Duration::from_secs(20));
            let id =
                UniqueId::from_bytes(&unhex(&std::env::var("ID").unwrap()).try_into().unwrap())
                    .unwrap();
            let b = Bootstrap::init(&id, 2, 0, &c).unwrap();
            say(&format!("LISTEN {}", b.peers()[0].listen_addr));
            assert_eq!(read_cmd(), "recv");
            match b.recv(1, 7) {
                Ok(m) => say(&format!("RECV OK {}", m.len())),
                Err(e) => say(&format!("RECV ERR {e}")),
            }
            read_cmd();
        }
        return;
    }
    let c = cfg(Duration::from_secs(20));
    let id = UniqueId::generate(&c).unwrap();
    let key = id.as_bytes()[48..80].to_vec();
    let mut k = Kid::start(NAME, &[("ID", hex(id.as_bytes()))]);
    let me = std::thread::scope(|s| {
        let h = s.spawn(|| Bootstrap::init(&id, 2, 1, &c).unwrap());
        let addr: SocketAddr = k
            .expect("LISTEN ", Duration::from_secs(20))
            .parse()
            .unwrap();
        (h.join().unwrap(), addr)
    });
    let (_rank1, addr) = me;
    let pid = k.pid();
    std::thread::sleep(Duration::from_millis(300));
    let before = status_field(pid, "VmRSS:");
    let mut ch = channel_as(addr, &key, 1, id.run_id());
    let sent_big = flood_messages(&mut ch, 64 << 20, 9, 12345);
    assert!(sent_big < 9, "all nine 64 MiB messages were taken");
    let mut ch = channel_as(addr, &key, 1, id.run_id());
    let sent = flood_messages(&mut ch, 15 << 20, 9, 12345);
    assert!(sent < 9, "all nine 15 MiB messages were taken");
    std::thread::sleep(Duration::from_millis(500));
    let after = status_field(pid, "VmRSS:");
    let grew_mib = after.saturating_sub(before) / 1024;
    assert!(
        grew_mib < 100,
        "RSS grew from {before} kB to {after} kB ({sent_big} x 64 MiB and {sent} x 15 MiB sent)"
    );
    k.say("recv");
    let err = k.expect("RECV ERR ", Duration::from_secs(20));
    assert!(err.contains("rank 1"), "{err}");
    assert!(
        err.contains("bound per peer: 32 MiB or 4096 messages"),
        "{err}"
    );
    println!("rank RSS {before} kB -> {after} kB; {sent_big} x 64 MiB, {sent} x 15 MiB sent");
    k.finish();
}

// ---------------------------------------------------------------------------
// Floods of idle connections.

const IDLE: usize = 1000;

/// Opens `n` connections to `addr` and holds them without a byte.
fn idle_connections(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok())
        .collect()
}

/// 1,000 idle connections held at the root, then 1,000 at rank 0's
/// listener: the job still starts within its init timeout, its barrier and
/// allgather complete, and rank 0's threads and descriptors stay bounded.
#[test]
fn idle_floods_neither_stop_the_job_nor_grow_the_rank() {
    const NAME: &str = "idle_floods_neither_stop_the_job_nor_grow_the_rank";
    const INIT: Duration = Duration::from_secs(30);
    if let Some(s) = scenario() {
        if s == NAME {
            // Rank 0, holding the root.
            let c = cfg(INIT);
            let id = UniqueId::generate(&c).unwrap();
            say(&format!("ID {}", hex(id.as_bytes())));
            assert_eq!(read_cmd(), "join");
            let b = Bootstrap::init(&id, 2, 0, &c).unwrap();
            say(&format!("LISTEN {}", b.peers()[0].listen_addr));
            assert_eq!(read_cmd(), "go");
            b.barrier().unwrap();
            let all = b.allgather(b"zero").unwrap();
            say(&format!("DONE {}", String::from_utf8_lossy(&all[1])));
            read_cmd();
        }
        return;
    }
    let c = cfg(INIT);
    let mut k = Kid::start(NAME, &[]);
    let id = UniqueId::from_bytes(
        &unhex(&k.expect("ID ", Duration::from_secs(20)))
            .try_into()
            .unwrap(),
    )
    .unwrap();
    let pid = k.pid();
    let (t_base, f_base) = threads_and_fds(pid);
    let at_root = idle_connections(id.root_addr(), IDLE);
    assert!(
        at_root.len() >= IDLE * 9 / 10,
        "{} connected",
        at_root.len()
    );
    std::thread::sleep(Duration::from_millis(500));
    let (t_root, f_root) = threads_and_fds(pid);
    k.say("join");
    let t = Instant::now();
    let (rank1, addr) = std::thread::scope(|s| {
        let h = s.spawn(|| Bootstrap::init(&id, 2, 1, &c));
        let addr: SocketAddr = k.expect("LISTEN ", INIT).parse().unwrap();
        (h.join().unwrap(), addr)
    });
    let rank1 = rank1.unwrap_or_else(|e| panic!("rank 1's init under a root flood: {e}"));
    let joined_in = t.elapsed();
    assert!(joined_in < INIT, "{joined_in:?}");
    let at_rank = idle_connections(addr, IDLE);
    assert!(
        at_rank.len() >= IDLE * 9 / 10,
        "{} connected",
        at_rank.len()
    );
    std::thread::sleep(Duration::from_millis(500));
    let (t_rank, f_rank) = threads_and_fds(pid);
    k.say("go");
    let t = Instant::now();
    rank1.barrier().unwrap();
    let all = rank1.allgather(b"one").unwrap();
    assert_eq!(all[0], b"zero");
    assert_eq!(k.expect("DONE ", Duration::from_secs(20)), "one");
    let setup_in = t.elapsed();
    assert!(setup_in < Duration::from_secs(10), "{setup_in:?}");
    println!(
        "rank 0: threads {t_base}/{t_root}/{t_rank}, fds {f_base}/{f_root}/{f_rank} (before, root flood, listener flood); rank 1 joined in {joined_in:?}, barrier+allgather in {setup_in:?}"
    );
    // Bounded: a few threads of its own, the handshakes in flight (64 per
    // listener) plus a margin in descriptors, whatever the flood.
    for (what, th, fd) in [("root", t_root, f_root), ("listener", t_rank, f_rank)] {
        assert!(
            th <= t_base + 8,
            "{what} flood: {th} threads (was {t_base})"
        );
        assert!(
            fd <= f_base + 2 * 64 + 16,
            "{what} flood: {fd} fds (was {f_base})"
        );
    }
    drop((at_root, at_rank));
    let log = k.finish();
    assert!(log.contains("handshakes in flight"), "{log}");
    let warns = log.lines().filter(|l| l.contains("WARN")).count();
    assert!(warns <= 10, "{warns} WARN lines:\n{log}");
}
