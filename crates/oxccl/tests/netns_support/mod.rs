//! Test hosts made of Linux network namespaces, and ranks run inside them.
//!
//! [`Hosts::new`] builds `nhosts` namespaces (`oxh<pid>_<tag>_<i>`) and one
//! "switch" namespace (`oxh<pid>_<tag>_sw`) holding one bridge per subnet.
//! Host `i` gets interface `eth<k>` (a veth whose peer is a port of bridge
//! `br<k>`) with address `198.(18+k).1.(i+1)/24`: the benchmarking range
//! 198.18.0.0/15, nothing routed anywhere else. Dropping [`Hosts`] deletes
//! every namespace it made (their veths and bridges go with them); at start,
//! namespaces of this tag left by a crashed earlier run (whose pid is gone)
//! are deleted too.
//!
//! [`Job::start`] runs one process per rank inside its host's namespace:
//! `ip netns exec <ns> unshare --uts -- sh -c 'hostname <h> && exec <test exe>
//! --exact netns_worker_entry --nocapture'`. The bootstrap's host hash is
//! SHA-256 of host name and boot id; namespaces share the boot id and, without
//! the UTS namespace, the host name, so every host runs its ranks under its
//! own host name (`oxh-h<i>`) to look like a different machine. The rank's
//! role is passed in `OXH_*` environment variables; its stdout and stderr go
//! to `<dir>/rank<r>.log`. Children get SIGKILL when the test thread ends
//! (PR_SET_PDEATHSIG) and when the [`Job`] is dropped.

#![allow(dead_code)]

pub mod prof_counts;
pub mod proxy;

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The tests share 2 CPU cores and spin-wait: run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Holds the lock that runs the namespace tests one at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Name of the worker test that child processes run.
pub const WORKER_TEST: &str = "netns_worker_entry";

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip_ok(args: &[&str]) {
    if let Err(e) = ip(args) {
        panic!("{e}");
    }
}

/// Runs `cmd` inside namespace `ns` and returns its stdout.
pub fn ns_exec(ns: &str, cmd: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(cmd)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("ip netns exec {ns} {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "ip netns exec {ns} {cmd:?}: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn namespaces() -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Deletes namespaces `oxh<pid>_<tag>_*` and temp dirs `oxh<pid>_<tag>`
/// whose pid no longer runs (left by a crashed or failed earlier run).
fn remove_stale(tag: &str) {
    let me = std::process::id();
    let gone = |pid: u32| pid != me && !Path::new(&format!("/proc/{pid}")).exists();
    if let Ok(rd) = std::fs::read_dir(std::env::temp_dir()) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some((pid, t)) = name.strip_prefix("oxh").and_then(|r| r.split_once('_')) else {
                continue;
            };
            if t == tag && pid.parse().is_ok_and(gone) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    for ns in namespaces() {
        let Some(rest) = ns.strip_prefix("oxh") else {
            continue;
        };
        let Some((pid, rest)) = rest.split_once('_') else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        let Some((t, _)) = rest.rsplit_once('_') else {
            continue;
        };
        if t == tag && gone(pid) {
            eprintln!("netns: removing stale namespace {ns} (pid {pid} is gone)");
            let _ = ip(&["netns", "del", &ns]);
        }
    }
}

/// One test host.
#[derive(Debug, Clone)]
pub struct Host {
    /// Its network namespace.
    pub ns: String,
    /// The host name its ranks run under.
    pub hostname: String,
    /// `(interface, address)`, one per subnet: `eth<k>`, 198.(18+k).1.(i+1).
    pub ifaces: Vec<(String, Ipv4Addr)>,
}

/// Namespaces making up a few hosts on one switch; deleted on drop.
pub struct Hosts {
    pub tag: String,
    pub hosts: Vec<Host>,
    /// Every namespace made, switch included.
    created: Vec<String>,
    /// Logs, id file and markers of the jobs run on these hosts.
    pub dir: PathBuf,
}

/// The address of host `i` on subnet `k`.
pub fn host_addr(i: usize, k: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18 + k as u8, 1, i as u8 + 1)
}

impl Hosts {
    /// Builds `nhosts` hosts with `nifs` interfaces each (one subnet per
    /// interface index). Panics when network namespaces cannot be made here
    /// (they need root or CAP_SYS_ADMIN, and iproute2).
    pub fn new(tag: &str, nhosts: usize, nifs: usize) -> Hosts {
        assert!((1..=8).contains(&nhosts) && (1..=2).contains(&nifs));
        remove_stale(tag);
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!("oxh{pid}_{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the test's temp dir");
        let mut me = Hosts {
            tag: tag.to_string(),
            hosts: Vec::new(),
            created: Vec::new(),
            dir,
        };
        let sw = format!("oxh{pid}_{tag}_sw");
        if let Err(e) = ip(&["netns", "add", &sw]) {
            let _ = std::fs::remove_dir_all(&me.dir);
            panic!("{tag}: cannot create network namespaces here (needs root/CAP_SYS_ADMIN and iproute2): {e}");
        }
        me.created.push(sw.clone());
        ip_ok(&["-n", &sw, "link", "set", "lo", "up"]);
        for k in 0..nifs {
            let br = format!("br{k}");
            ip_ok(&["-n", &sw, "link", "add", &br, "type", "bridge"]);
            ip_ok(&["-n", &sw, "link", "set", &br, "up"]);
        }
        for i in 0..nhosts {
            let ns = format!("oxh{pid}_{tag}_{i}");
            ip_ok(&["netns", "add", &ns]);
            me.created.push(ns.clone());
            ip_ok(&["-n", &ns, "link", "set", "lo", "up"]);
            let mut ifaces = Vec::new();
            for k in 0..nifs {
                let port = format!("h{i}e{k}");
                let eth = format!("eth{k}");
                ip_ok(&[
                    "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", &eth, "netns",
                    &ns,
                ]);
                ip_ok(&["-n", &sw, "link", "set", &port, "master", &format!("br{k}")]);
                ip_ok(&["-n", &sw, "link", "set", &port, "up"]);
                let a = host_addr(i, k);
                ip_ok(&["-n", &ns, "addr", "add", &format!("{a}/24"), "dev", &eth]);
                ip_ok(&["-n", &ns, "link", "set", &eth, "up"]);
                ifaces.push((eth, a));
            }
            me.hosts.push(Host {
                ns,
                hostname: format!("oxh-h{i}"),
                ifaces,
            });
        }
        me
    }

    /// Reads a counter of `/sys/class/net/<iface>/statistics/` as seen in host `i`.
    pub fn counter(&self, i: usize, iface: &str, what: &str) -> u64 {
        let s = ns_exec(
            &self.hosts[i].ns,
            &["cat", &format!("/sys/class/net/{iface}/statistics/{what}")],
        );
        s.trim()
            .parse()
            .unwrap_or_else(|_| panic!("counter {iface}/{what}: {s:?}"))
    }

    /// Sets an interface of host `i` up or down.
    pub fn set_link(&self, i: usize, iface: &str, up: bool) {
        let h = &self.hosts[i];
        ip_ok(&[
            "-n",
            &h.ns,
            "link",
            "set",
            iface,
            if up { "up" } else { "down" },
        ]);
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in self.created.iter().rev() {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("netns: cleanup: {e}");
            }
        }
        // Logs stay after a failure, or when OXH_KEEP_LOGS is set.
        if !std::thread::panicking() && std::env::var_os("OXH_KEEP_LOGS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The environment every rank gets, besides its role.
fn base_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        if let Some(k) = k.to_str() {
            if k.starts_with("NCCL_") || k.starts_with("OXCCL_") || k.starts_with("OXH_") {
                cmd.env_remove(k);
            }
        }
    }
    cmd.env("NCCL_DEBUG", "INFO")
        .env("OXCCL_INIT_TIMEOUT_MS", "30000")
        .env("OXCCL_TIMEOUT_MS", "30000")
        .env("RUST_BACKTRACE", "1");
}

/// How one rank ended.
#[derive(Debug)]
pub struct RankEnd {
    pub rank: usize,
    pub host: usize,
    pub status: ExitStatus,
    /// When the parent saw it exit (polled every 10 ms).
    pub at: Instant,
    pub log: String,
}

impl RankEnd {
    /// The value of `key=` in the worker's `OXH_ERR` line (`msg` is the rest
    /// of the line). The line may follow libtest's "test ... " on the same line.
    pub fn err_field(&self, key: &str) -> Option<String> {
        let line = self
            .log
            .lines()
            .find_map(|l| l.find("OXH_ERR ").map(|i| &l[i..]))?;
        let pat = format!("{key}=");
        if key == "msg" {
            return line.split_once(" msg=").map(|(_, m)| m.to_string());
        }
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&pat).map(str::to_string))
    }
}

/// One process per rank, placed on hosts; all killed on drop.
pub struct Job<'h> {
    hosts: &'h Hosts,
    /// `placement[rank]` = host index.
    pub placement: Vec<usize>,
    children: Vec<Option<Child>>,
    ends: Vec<Option<RankEnd>>,
    pub dir: PathBuf,
    pub started: Instant,
}

impl<'h> Job<'h> {
    /// Starts `placement.len()` ranks of `scenario`, rank r on host
    /// `placement[r]`, with extra environment `env` for all of them.
    pub fn start(
        hosts: &'h Hosts,
        scenario: &str,
        placement: &[usize],
        env: &[(&str, &str)],
    ) -> Job<'h> {
        let exe = std::env::current_exe().expect("current_exe");
        let dir = hosts.dir.join(scenario);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("job dir");
        let n = placement.len();
        let mut children = Vec::new();
        for (r, &h) in placement.iter().enumerate() {
            let host = &hosts.hosts[h];
            let log = File::create(dir.join(format!("rank{r}.log"))).expect("log file");
            let log2 = log.try_clone().expect("log file");
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", &host.ns, "unshare", "--uts", "--"])
                .args(["sh", "-c", "hostname \"$0\" && exec \"$@\""])
                .arg(&host.hostname)
                .arg(&exe)
                .args([
                    "--ignored",
                    "--exact",
                    WORKER_TEST,
                    "--nocapture",
                    "--test-threads=1",
                ]);
            base_env(&mut cmd);
            cmd.env("OXH_SCENARIO", scenario)
                .env("OXH_RANK", r.to_string())
                .env("OXH_NRANKS", n.to_string())
                .env("OXH_HOST", h.to_string())
                .env("OXH_DIR", &dir);
            for (k, v) in env {
                cmd.env(k, v);
            }
            cmd.stdin(Stdio::null()).stdout(log).stderr(log2);
            // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            children.push(Some(cmd.spawn().expect("spawn ip netns exec")));
        }
        Job {
            hosts,
            placement: placement.to_vec(),
            ends: (0..n).map(|_| None).collect(),
            children,
            dir,
            started: Instant::now(),
        }
    }

    /// The pid of rank `r`'s process (ip and unshare exec, so this is the worker).
    pub fn pid(&self, r: usize) -> Option<u32> {
        self.children[r].as_ref().map(|c| c.id())
    }

    /// Sends SIGKILL to rank `r`.
    pub fn kill(&mut self, r: usize) {
        if let Some(c) = self.children[r].as_mut() {
            let _ = c.kill();
        }
    }

    /// The log of rank `r` so far.
    pub fn log(&self, r: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("rank{r}.log"))).unwrap_or_default()
    }

    /// Every log, for failure messages.
    pub fn all_logs(&self) -> String {
        let mut s = String::new();
        for r in 0..self.children.len() {
            let log = self.log(r);
            // The tail is what matters; keep failure output readable.
            let tail: String = if log.len() > 6000 {
                let mut start = log.len() - 6000;
                while !log.is_char_boundary(start) {
                    start += 1;
                }
                format!("...{}", &log[start..])
            } else {
                log
            };
            s.push_str(&format!(
                "----- rank {r} (host {}) -----\n{tail}\n",
                self.placement[r]
            ));
        }
        s
    }

    fn poll(&mut self) -> bool {
        let mut all = true;
        for r in 0..self.children.len() {
            if self.ends[r].is_some() {
                continue;
            }
            let c = self.children[r].as_mut().expect("child");
            match c.try_wait() {
                Ok(Some(status)) => {
                    self.children[r] = None;
                    self.ends[r] = Some(RankEnd {
                        rank: r,
                        host: self.placement[r],
                        status,
                        at: Instant::now(),
                        log: String::new(),
                    });
                }
                Ok(None) => all = false,
                Err(e) => panic!("wait for rank {r}: {e}"),
            }
        }
        all
    }

    /// Waits until `cond` holds (polled every 10 ms); panics with the logs
    /// after `limit`, or if any rank exits first.
    pub fn wait_until(&mut self, what: &str, limit: Duration, mut cond: impl FnMut(&Self) -> bool) {
        let t0 = Instant::now();
        loop {
            if cond(self) {
                return;
            }
            self.poll();
            if let Some(e) = self.ends.iter().flatten().next() {
                let (r, st) = (e.rank, e.status);
                self.kill_all();
                panic!(
                    "rank {r} exited ({st}) while waiting for {what}\n{}",
                    self.all_logs()
                );
            }
            if t0.elapsed() > limit {
                self.kill_all();
                panic!(
                    "watchdog: {what} did not happen within {limit:?}\n{}",
                    self.all_logs()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether marker file `name` exists in the job directory.
    pub fn has_marker(&self, name: &str) -> bool {
        self.dir.join(name).exists()
    }

    /// Waits for every rank to exit; the watchdog kills all and panics with
    /// the logs after `limit`.
    pub fn wait(self, limit: Duration) -> Vec<RankEnd> {
        self.wait_inner(limit, false)
    }

    /// Waits for every rank to exit; once one fails the others get 3 s, then
    /// are killed (so a rank that dies early does not leave the rest waiting
    /// for the watchdog).
    fn wait_inner(mut self, limit: Duration, fail_fast: bool) -> Vec<RankEnd> {
        let mut first_fail: Option<Instant> = None;
        loop {
            if self.poll() {
                break;
            }
            if fail_fast {
                if first_fail.is_none() && self.ends.iter().flatten().any(|e| !e.status.success()) {
                    first_fail = Some(Instant::now());
                }
                if first_fail.is_some_and(|t| t.elapsed() > Duration::from_secs(3)) {
                    self.kill_all();
                    continue;
                }
            }
            if self.started.elapsed() > limit {
                self.kill_all();
                panic!(
                    "watchdog: ranks still running after {limit:?}; killed\n{}",
                    self.all_logs()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let logs: Vec<String> = (0..self.children.len()).map(|r| self.log(r)).collect();
        self.ends
            .iter_mut()
            .zip(logs)
            .map(|(e, log)| {
                let mut e = e.take().expect("ended");
                e.log = log;
                e
            })
            .collect()
    }

    /// Waits for every rank and asserts each exited 0.
    pub fn wait_ok(self, limit: Duration) -> Vec<RankEnd> {
        let ends = self.wait_inner(limit, true);
        let bad: Vec<_> = ends.iter().filter(|e| !e.status.success()).collect();
        if !bad.is_empty() {
            panic!(
                "ranks failed: {:?}\n{}",
                bad.iter().map(|e| (e.rank, e.status)).collect::<Vec<_>>(),
                format_logs(&ends)
            );
        }
        ends
    }

    fn kill_all(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The hosts this job runs on.
    pub fn hosts(&self) -> &Hosts {
        self.hosts
    }
}

impl Drop for Job<'_> {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// All logs of finished ranks, for failure messages.
pub fn format_logs(ends: &[RankEnd]) -> String {
    let mut s = String::new();
    for e in ends {
        s.push_str(&format!(
            "----- rank {} (host {}, {}) -----\n{}\n",
            e.rank, e.host, e.status, e.log
        ));
    }
    s
}

/// The transport label each rank's INFO log gives for each peer:
/// `result[r][q]` from "r[r] -> q[q] via LABEL".
pub fn transports(ends: &[RankEnd]) -> Vec<Vec<Option<String>>> {
    let n = ends.len();
    ends.iter()
        .map(|e| {
            (0..n)
                .map(|q| {
                    let pat = format!(" -> {q}[{q}] via ");
                    e.log
                        .lines()
                        .filter(|l| l.contains(&format!(" : {}[{}]{pat}", e.rank, e.rank)))
                        .find_map(|l| l.split_once(&pat).map(|(_, v)| v.trim().to_string()))
                })
                .collect()
        })
        .collect()
}

/// Asserts that peers on the same host use shared memory and peers on other
/// hosts use TCP, as every rank's INFO log says.
pub fn assert_transports(ends: &[RankEnd]) {
    assert_transports_shm(ends, true)
}

/// As [`assert_transports`]; with `shm` false every peer must use TCP
/// (`NCCL_SHM_DISABLE=1`).
pub fn assert_transports_shm(ends: &[RankEnd], shm: bool) {
    let t = transports(ends);
    for (r, row) in t.iter().enumerate() {
        for (q, label) in row.iter().enumerate() {
            if q == r {
                continue;
            }
            let want = if shm && ends[r].host == ends[q].host {
                "SHM/"
            } else {
                "NET/Socket"
            };
            let ok = label.as_deref().is_some_and(|l| l.starts_with(want));
            assert!(
                ok,
                "rank {r} (host {}) -> rank {q} (host {}): transport {label:?}, want {want}*\n{}",
                ends[r].host,
                ends[q].host,
                format_logs(ends)
            );
        }
    }
}

/// Decodes the root address of a 128-byte oxccl unique id (layout in
/// oxccl-bootstrap's `id.rs`: family at 10, big-endian port at 12, IP at 16).
pub fn id_root_addr(b: &[u8]) -> SocketAddr {
    assert_eq!(&b[..8], b"OXCCLUID", "not an oxccl unique id");
    assert_eq!(b[10], 4, "expected an IPv4 root");
    let port = u16::from_be_bytes([b[12], b[13]]);
    SocketAddr::new(Ipv4Addr::new(b[16], b[17], b[18], b[19]).into(), port)
}

/// Hex of bytes.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Bytes of hex.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}
