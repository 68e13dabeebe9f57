//! The rank table down the tree from rank 0 (real sockets on loopback):
//! every rank of 1, 2, 3, odd and a few hundred ranks, as threads and as
//! processes, ends with the same table; a rank stopped after joining and
//! killed before it forwarded the table is named by the ranks below it,
//! which fail well within the init timeout instead of hanging.
//!
//! Process ranks are this test binary, re-executed with the scenario's name
//! in `OXBOOT_TREE_CHILD`; they print one line, `TABLE ...` or `ERR ...`,
//! and rank 1's waits are logged (`NCCL_DEBUG=INFO` with the internal
//! `OXCCL_WAIT_NOTICE_MS=200`) so the parent can tell when it has joined.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use oxccl_bootstrap::{Bootstrap, BootstrapConfig, PeerInfo, UniqueId};

const CHILD: &str = "OXBOOT_TREE_CHILD";

/// With a root table budget of one byte, the root sends the table to rank
/// 0 only and every other rank has it from its parent.
fn cfg(init: Duration) -> BootstrapConfig {
    BootstrapConfig {
        ifname: Some("lo".into()),
        init_timeout: init,
        timeout: Duration::from_secs(30),
        root_table_budget: 1,
        ..Default::default()
    }
}

/// One line per entry: what every rank must agree on.
fn digest(t: &[PeerInfo]) -> String {
    t.iter()
        .map(|p| {
            format!(
                "{}/{}/{}/{}/{}/{}/{}",
                p.rank, p.hostname, p.host_hash, p.pid, p.process_token, p.listen_addr, p.data_addr
            )
        })
        .collect::<Vec<_>>()
        .join(";")
}

#[test]
fn ranks_as_threads_get_identical_tables() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    // All down the tree from rank 0; the top 3 levels from the root; the
    // default (all from the root up to a few hundred ranks).
    let cases = [1usize, 2, 3, 5, 17, 301]
        .into_iter()
        .map(|n| (n, 1))
        .chain([
            (17, 7 * 17 * 80),
            (301, 7 * 301 * 80),
            (301, oxccl_core::peers::ROOT_TABLE_BUDGET),
        ]);
    for (n, budget) in cases {
        let c = BootstrapConfig {
            root_table_budget: budget,
            ..cfg(Duration::from_secs(60))
        };
        let id = UniqueId::generate(&c).unwrap();
        let got: Vec<(String, Vec<u8>)> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|r| {
                    let (id, c) = (&id, &c);
                    s.spawn(move || {
                        let b = Bootstrap::init(id, n, r, c)
                            .unwrap_or_else(|e| panic!("rank {r} of {n}: {e}"));
                        let t = b.peers();
                        assert_eq!(t.len(), n);
                        assert_eq!(t[r].pid, std::process::id());
                        assert!(t.iter().enumerate().all(|(i, p)| p.rank == i));
                        // The channels the table came over carry the
                        // collectives afterwards.
                        b.barrier().unwrap();
                        let v = b.broadcast(n - 1, &[r as u8, 9]).unwrap();
                        b.barrier().unwrap();
                        (digest(t), v)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(got.iter().all(|(d, _)| *d == got[0].0), "n {n}");
        assert!(got.iter().all(|(_, v)| *v == [(n - 1) as u8, 9]), "n {n}");
        // Every rank's listener is distinct.
        let mut addrs: Vec<&str> = got[0]
            .0
            .split(';')
            .map(|e| e.rsplit('/').nth(1).unwrap())
            .collect();
        addrs.sort_unstable();
        addrs.dedup();
        assert_eq!(addrs.len(), n, "n {n}");
    }
}

// ---------------------------------------------------------------------------
// Ranks as processes.

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// In a child: init as RANK of NRANKS on the id in ID (each rank its own
/// host with SEPARATE_HOSTS set); prints `TABLE <digest>` or `ERR <kind>
/// <message>`; then, with BARRIER set, a barrier; then waits for stdin to
/// close.
fn child() {
    let var = |k: &str| std::env::var(k).unwrap();
    let rank: usize = var("RANK").parse().unwrap();
    let nranks: usize = var("NRANKS").parse().unwrap();
    let bytes = unhex(&var("ID"));
    let id = UniqueId::from_bytes(bytes.as_slice().try_into().unwrap()).unwrap();
    let mut c = cfg(Duration::from_millis(var("INIT_MS").parse().unwrap()));
    if std::env::var_os("SEPARATE_HOSTS").is_some() {
        c.host_id = Some(format!("host{rank}"));
    }
    let t = Instant::now();
    let line = match Bootstrap::init(&id, nranks, rank, &c) {
        Ok(b) => {
            if std::env::var_os("BARRIER").is_some() {
                b.barrier().unwrap();
            }
            let line = format!("TABLE {}", digest(b.peers()));
            println!("{line}");
            std::io::stdout().flush().unwrap();
            let _ = std::io::stdin().read_line(&mut String::new());
            return;
        }
        Err(e) => format!(
            "ERR {:?} after {} ms: {}",
            e.kind(),
            t.elapsed().as_millis(),
            e.message()
        ),
    };
    println!("{line}");
    std::io::stdout().flush().unwrap();
}

struct Rank {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Rank {
    fn start(name: &str, id: &UniqueId, rank: usize, nranks: usize, env: &[(&str, &str)]) -> Rank {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", name, "--nocapture", "--test-threads=1"]);
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("NCCL_") || k.starts_with("OXCCL_") {
                cmd.env_remove(k);
            }
        }
        cmd.env(CHILD, name)
            .env("RANK", rank.to_string())
            .env("NRANKS", nranks.to_string())
            .env("ID", hex(id.as_bytes()))
            .env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "BOOTSTRAP")
            .env("OXCCL_WAIT_NOTICE_MS", "200");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Rank { child, lines }
    }

    /// The first line containing `part`, within `t` (None past it).
    fn line_with(&self, part: &str, t: Duration) -> Option<String> {
        let end = Instant::now() + t;
        loop {
            let left = end.checked_duration_since(Instant::now())?;
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(part) => return Some(l),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }

    /// The `TABLE`/`ERR` line, within `t`.
    fn outcome(&self, t: Duration) -> Option<String> {
        let end = Instant::now() + t;
        loop {
            let left = end.checked_duration_since(Instant::now())?;
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    // The harness may print "test NAME ... " first.
                    for p in ["TABLE ", "ERR "] {
                        if let Some(at) = l.find(p) {
                            return Some(l[at..].to_string());
                        }
                    }
                }
                Err(_) => return None,
            }
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on the pid of a child this test started and has
        // not reaped yet (it cannot be another process's pid).
        let rc = unsafe { libc::kill(self.child.id() as i32, sig) };
        assert_eq!(rc, 0, "kill({}, {sig})", self.child.id());
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn hosting(name: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|s| s == name)
}

#[test]
fn ranks_as_processes_get_identical_tables() {
    const NAME: &str = "ranks_as_processes_get_identical_tables";
    if hosting(NAME) {
        return child();
    }
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    for n in [1usize, 2, 7] {
        let c = cfg(Duration::from_secs(60));
        let id = UniqueId::generate(&c).unwrap();
        let env = [("INIT_MS", "60000"), ("BARRIER", "1")];
        let ranks: Vec<Rank> = (0..n).map(|r| Rank::start(NAME, &id, r, n, &env)).collect();
        let outs: Vec<String> = ranks
            .iter()
            .enumerate()
            .map(|(r, k)| {
                k.outcome(Duration::from_secs(60))
                    .unwrap_or_else(|| panic!("n {n}: rank {r} said nothing"))
            })
            .collect();
        assert!(outs[0].starts_with("TABLE "), "n {n}: {outs:?}");
        assert!(outs.iter().all(|o| *o == outs[0]), "n {n}: {outs:?}");
        // Each entry holds its own process's pid.
        for (r, k) in ranks.iter().enumerate() {
            let entry = outs[0][6..].split(';').nth(r).unwrap();
            let pid: u32 = entry.split('/').nth(3).unwrap().parse().unwrap();
            assert_eq!(pid, k.child.id(), "n {n}: {entry}");
        }
    }
}

/// Whether `m` names rank 1 of 10 (no other rank's number starts with 1).
fn names_rank_1(m: &str) -> bool {
    m.contains("rank 1 ") || m.contains("rank 1:") || m.contains("rank 1,")
}

/// 10 ranks as processes; rank 1 (children 3 and 4, grandchildren 7, 8
/// and 9) is stopped once it has joined, the last rank (2) then joins, and
/// once rank 3 says it waits for the table from rank 1, rank 1 is killed.
/// Ranks 0, 3, 4, 7, 8 and 9 fail with an error naming rank 1, not a
/// timeout, well within the 60 s init timeout; ranks 2, 5 and 6 (the
/// other subtree) have their table or also name rank 1.
fn killed_parent(name: &str, separate_hosts: bool) {
    const N: usize = 10;
    const INIT: Duration = Duration::from_secs(60);
    let c = cfg(INIT);
    let id = UniqueId::generate(&c).unwrap();
    let mut env = vec![("INIT_MS", "60000")];
    if separate_hosts {
        env.push(("SEPARATE_HOSTS", "1"));
    }
    let mut ranks: Vec<Option<Rank>> = (0..N).map(|_| None).collect();
    ranks[1] = Some(Rank::start(name, &id, 1, N, &env));
    let victim = ranks[1].as_ref().unwrap();
    victim
        .line_with("rank 1 of 10 waiting for the root", Duration::from_secs(30))
        .expect("rank 1 never said it waits for the root");
    victim.signal(libc::SIGSTOP);
    for r in (0..N).filter(|&r| r != 1 && r != 2) {
        ranks[r] = Some(Rank::start(name, &id, r, N, &env));
    }
    // Rank 2 last: the root answers once it has joined.
    ranks[2] = Some(Rank::start(name, &id, 2, N, &env));
    ranks[3]
        .as_ref()
        .unwrap()
        .line_with(
            "rank 3 of 10 waiting for the rank table from rank 1 of 10",
            Duration::from_secs(30),
        )
        .expect("rank 3 never said it waits for rank 1");
    let killed = Instant::now();
    let v = ranks[1].take().unwrap();
    v.signal(libc::SIGKILL);
    drop(v);
    for (r, k) in ranks.iter().enumerate() {
        let Some(k) = k else { continue };
        let out = k
            .outcome(INIT)
            .unwrap_or_else(|| panic!("rank {r} said nothing within {INIT:?} of the kill"));
        match r {
            2 | 5 | 6 if out.starts_with("TABLE ") => {}
            _ => {
                assert!(out.starts_with("ERR "), "rank {r}: {out}");
                assert!(!out.starts_with("ERR Timeout"), "rank {r}: {out}");
                assert!(names_rank_1(&out), "rank {r}: {out}");
            }
        }
    }
    assert!(killed.elapsed() < INIT, "{:?}", killed.elapsed());
}

#[test]
fn killed_parent_is_named_by_its_subtree_same_host() {
    const NAME: &str = "killed_parent_is_named_by_its_subtree_same_host";
    if hosting(NAME) {
        return child();
    }
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    killed_parent(NAME, false);
}

#[test]
fn killed_parent_is_named_by_its_subtree_separate_hosts() {
    const NAME: &str = "killed_parent_is_named_by_its_subtree_separate_hosts";
    if hosting(NAME) {
        return child();
    }
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    killed_parent(NAME, true);
}
