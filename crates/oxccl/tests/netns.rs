//! oxccl between hosts over TCP, with hosts made of Linux network namespaces.
//!
//! Each test builds 2 to 4 namespaces on a software switch (198.18.0.0/15
//! only; see `netns_support`), runs one process per rank inside its host's
//! namespace under the host's own host name (so oxccl sees different hosts),
//! and checks results in every rank, the transport chosen per peer
//! (`NCCL_DEBUG=INFO`: TCP across hosts, shared memory within one), interface
//! selection, failures (a cut link, a killed rank) that must end in an
//! error, not a hang, and a slow link (a delaying, re-splitting, rate-capped
//! or stalled user-space relay between two hosts, `netns_support::proxy`)
//! that must not make anything fail. The processes re-run this test binary
//! as the test `netns_worker_entry` with their role in `OXH_*` variables.
//!
//! The tests need root (or CAP_SYS_ADMIN) and iproute2, as CI has, and fail
//! without them. Tests run one at a time (2 CPU cores, spinning ranks).

mod netns_support;

use netns_support::proxy::{self, Proxy, Shape};
use netns_support::{assert_transports, format_logs, host_addr, id_root_addr, Hosts, Job};
use oxccl::{Communicator, Group, RedOp, UniqueId};
use std::time::{Duration, Instant};

/// Watchdog for one job: children are killed and the test fails after this.
const JOB_LIMIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------- worker side

fn env_usize(k: &str) -> usize {
    std::env::var(k)
        .unwrap_or_else(|_| panic!("{k} not set"))
        .parse()
        .unwrap_or_else(|_| panic!("{k} not a number"))
}

/// The id: rank 0 makes it (starting the root on its selected interface) and
/// publishes it as `<dir>/id.hex`; the others wait for the file.
/// With `NCCL_COMM_ID` every rank makes the same id on its own and rank 0's
/// init starts the root at that address.
fn get_id(rank: usize, dir: &std::path::Path) -> UniqueId {
    let path = dir.join("id.hex");
    if std::env::var_os("NCCL_COMM_ID").is_some() {
        return UniqueId::new().unwrap_or_else(|e| panic!("UniqueId::new (NCCL_COMM_ID): {e}"));
    }
    if rank == 0 {
        let id = UniqueId::new().unwrap_or_else(|e| panic!("UniqueId::new: {e}"));
        let tmp = dir.join("id.hex.tmp");
        std::fs::write(&tmp, netns_support::hex(id.as_bytes())).expect("write id");
        std::fs::rename(&tmp, &path).expect("publish id");
        return id;
    }
    let t0 = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(&path) {
            let b: [u8; 128] = netns_support::unhex(s.trim())
                .try_into()
                .expect("128-byte id");
            return UniqueId::from_bytes(&b).expect("valid id");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "rank {rank}: no unique id from rank 0 within 30 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A value exact in f32 and in sums of up to 16 ranks.
fn val(r: usize, i: usize) -> f32 {
    ((i * 7 + r * 13) % 1024) as f32
}

fn check(what: &str, got: &[f32], want: impl Fn(usize) -> f32) {
    for (i, &g) in got.iter().enumerate() {
        let w = want(i);
        assert!(
            g == w,
            "{what}: element {i} of {}: got {g}, want {w}",
            got.len()
        );
    }
}

fn all_reduce_sweep(c: &Communicator, counts: &[usize]) {
    let (r, n) = (c.rank(), c.size());
    for &count in counts {
        let send: Vec<f32> = (0..count).map(|i| val(r, i)).collect();
        let mut recv = vec![-1.0f32; count];
        c.all_reduce(&send, &mut recv, RedOp::Sum)
            .unwrap_or_else(|e| panic!("all_reduce count {count}: {e}"));
        let sum = |i| (0..n).map(|q| val(q, i)).sum::<f32>();
        check(&format!("all_reduce(count {count})"), &recv, sum);
        let mut buf = send.clone();
        c.all_reduce_in_place(&mut buf, RedOp::Sum)
            .unwrap_or_else(|e| panic!("all_reduce in place count {count}: {e}"));
        check(&format!("all_reduce in place(count {count})"), &buf, sum);
    }
}

/// Every collective the issue lists, checked in this rank.
/// Children whose new rank 0 is on another host than the parent's rank 0
/// (placement [0, 0, 1, 1]): a split with reversed keys, then a shrink
/// without host 0's ranks. Each makes its id where its new rank 0 runs,
/// never at NCCL_COMM_ID (host 0's address), which that host cannot bind.
fn scenario_children(c: &Communicator) {
    let (r, n) = (c.rank(), c.size());
    let s = c
        .split(Some(0), -(r as i32))
        .expect("split")
        .expect("a color");
    assert_eq!(s.rank(), n - 1 - r);
    all_reduce_sweep(&s, &[1, 4097]);
    s.destroy().expect("destroy");
    if r >= 2 {
        let k = c.shrink(&[0, 1]).expect("shrink");
        assert_eq!((k.rank(), k.size()), (r - 2, n - 2));
        all_reduce_sweep(&k, &[1, 4097]);
        k.destroy().expect("destroy");
    }
}

fn scenario_colls(c: &Communicator) {
    let (r, n) = (c.rank(), c.size());
    // 0, 1, odd, and 4 MB of f32.
    all_reduce_sweep(c, &[0, 1, 7, 1023, 65_537, 1 << 20]);

    let mut mx = vec![0i32; 1001];
    for (i, x) in mx.iter_mut().enumerate() {
        *x = ((i + 3 * r) % 17) as i32 - 8;
    }
    c.all_reduce_in_place(&mut mx, RedOp::Max)
        .expect("all_reduce max i32");
    for (i, &x) in mx.iter().enumerate() {
        let w = (0..n).map(|q| ((i + 3 * q) % 17) as i32 - 8).max().unwrap();
        assert_eq!(x, w, "all_reduce max i32 element {i}");
    }

    for count in [0usize, 1, 1003, 131_075] {
        let send: Vec<f32> = (0..count).map(|i| val(r, i)).collect();
        let mut recv = vec![-1.0f32; count * n];
        c.all_gather(&send, &mut recv).expect("all_gather");
        check(&format!("all_gather(count {count})"), &recv, |j| {
            val(j / count.max(1), j % count.max(1))
        });
    }

    for (root, count) in [(n - 1, 100_003usize), (0, 1), (1 % n, 262_144)] {
        let send: Vec<f32> = (0..count).map(|i| val(root, i) + 0.5).collect();
        let mut recv = vec![-1.0f32; count];
        c.broadcast(&send, &mut recv, root).expect("broadcast");
        check(
            &format!("broadcast(root {root}, count {count})"),
            &recv,
            |i| val(root, i) + 0.5,
        );
    }

    for count in [1usize, 777, 131_072] {
        let send: Vec<f32> = (0..count * n).map(|i| val(r, i)).collect();
        let mut recv = vec![-1.0f32; count];
        c.reduce_scatter(&send, &mut recv, RedOp::Sum)
            .expect("reduce_scatter");
        check(&format!("reduce_scatter(count {count})"), &recv, |i| {
            (0..n).map(|q| val(q, r * count + i)).sum()
        });
    }

    for count in [1usize, 513, 65_536] {
        // Block q of rank r's send goes to rank q.
        let send: Vec<f32> = (0..count * n).map(|i| val(r, i) + 2000.0).collect();
        let mut recv = vec![-1.0f32; count * n];
        c.all_to_all(&send, &mut recv).expect("all_to_all");
        check(&format!("all_to_all(count {count})"), &recv, |j| {
            let (q, i) = (j / count, j % count);
            val(q, r * count + i) + 2000.0
        });
    }

    // A ring of send/recv across hosts: r -> r+1.
    for count in [1usize, 300_001] {
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        let send: Vec<f32> = (0..count).map(|i| val(r, i) + 0.25).collect();
        let mut recv = vec![-1.0f32; count];
        let mut g = Group::new();
        g.send(c, &send, next).recv(c, &mut recv, prev);
        g.run().expect("send/recv ring");
        check(&format!("send/recv ring(count {count})"), &recv, |i| {
            val(prev, i) + 0.25
        });
    }
    // Plain blocking send/recv between rank 0 and the last rank (other host).
    let last = n - 1;
    if r == 0 {
        let send: Vec<f32> = (0..4099).map(|i| val(0, i)).collect();
        c.send(&send, last).expect("send");
    } else if r == last {
        let mut recv = vec![-1.0f32; 4099];
        c.recv(&mut recv, 0).expect("recv");
        check("recv from rank 0", &recv, |i| val(0, i));
    }
}

/// All-reduce in a loop until an error (printed as `OXH_ERR ...`, exit 0) or
/// `OXH_LOOP_SECS` without one (exit 3). Touches `started.<rank>` after the
/// first success. After an error the communicator is destroyed before the
/// exit (`OXH_DESTROYED destroy_ms=..`), so a teardown that hangs after a
/// network failure shows as a late exit.
fn scenario_loop(c: Communicator, dir: &std::path::Path) -> ! {
    let (r, n) = (c.rank(), c.size());
    let count: usize = std::env::var("OXH_COUNT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1 << 18);
    let secs: u64 = std::env::var("OXH_LOOP_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let send = vec![1.0f32; count];
    let mut recv = vec![0.0f32; count];
    let t0 = Instant::now();
    let mut iters = 0u64;
    // The longest all_reduce of the loop, either kind (a stalled link shows here).
    let mut max_op = Duration::ZERO;
    let (e, t) = loop {
        let t = Instant::now();
        if let Err(e) = c.all_reduce(&send, &mut recv, RedOp::Sum) {
            break (e, t);
        }
        max_op = max_op.max(t.elapsed());
        assert_eq!(recv[0], n as f32, "iteration {iters}");
        assert_eq!(recv[count - 1], n as f32, "iteration {iters}");
        if iters == 0 {
            std::fs::write(dir.join(format!("started.{r}")), b"").expect("marker");
        }
        iters += 1;
        // Stop together: a rank that left alone would fail the others.
        let mut stop = [u8::from(t0.elapsed() > Duration::from_secs(secs))];
        let t = Instant::now();
        if let Err(e) = c.all_reduce_in_place(&mut stop, RedOp::Max) {
            break (e, t);
        }
        max_op = max_op.max(t.elapsed());
        if stop[0] == 1 {
            println!("OXH_NOERR iters={iters} max_op_ms={}", max_op.as_millis());
            std::process::exit(3);
        }
    };
    println!(
        "OXH_ERR kind={:?} op_ms={} iters={iters} msg={}",
        e.kind(),
        t.elapsed().as_millis(),
        e.message().replace('\n', " ")
    );
    let td = Instant::now();
    let d = c.destroy();
    println!(
        "OXH_DESTROYED destroy_ms={} result={d:?}",
        td.elapsed().as_millis()
    );
    std::process::exit(0);
}

/// Rank 0 sends 1 MiB to the last rank and leaves at once (destroy, exit):
/// the send returns once the bytes are buffered on rank 0's side, so over a
/// slow link they are still on the way when rank 0's connections close. The
/// last rank must receive all of them, not an error about a closed peer.
fn scenario_send_exit(c: &Communicator) {
    let (r, last) = (c.rank(), c.size() - 1);
    let count = 262_144;
    if r == 0 {
        let send: Vec<f32> = (0..count).map(|i| val(0, i) + 0.75).collect();
        c.send(&send, last).expect("send");
    } else if r == last {
        let mut recv = vec![-1.0f32; count];
        c.recv(&mut recv, 0)
            .expect("recv from a rank that has left");
        check("recv from rank 0", &recv, |i| val(0, i) + 0.75);
    }
}

/// Init that must fail: prints `OXH_ERR kind=.. msg=..` and exits 0, or exits 3
/// if it succeeded. With `NCCL_COMM_ID` set the failure comes from
/// `init_rank` (binding rank 0's listener), otherwise from `UniqueId::new`.
fn scenario_init_err() -> ! {
    let r = UniqueId::new().and_then(|id| Communicator::init_rank(1, &id, 0));
    match r {
        Ok(_) => {
            println!("OXH_NOERR");
            std::process::exit(3)
        }
        Err(e) => {
            println!(
                "OXH_ERR kind={:?} msg={}",
                e.kind(),
                e.message().replace('\n', " ")
            );
            std::process::exit(0)
        }
    }
}

/// The entry of every rank process, started by the netns tests with its role in
/// `OXH_*` variables.
#[test]
#[ignore = "child process of the netns tests"]
fn netns_worker_entry() {
    let Ok(scenario) = std::env::var("OXH_SCENARIO") else {
        panic!("netns_worker_entry is a rank of the netns tests: it runs when a test starts it");
    };
    let rank = env_usize("OXH_RANK");
    let nranks = env_usize("OXH_NRANKS");
    let dir = std::path::PathBuf::from(std::env::var("OXH_DIR").expect("OXH_DIR"));
    if scenario == "init_err" {
        scenario_init_err();
    }
    let id = get_id(rank, &dir);
    let t0 = Instant::now();
    let c = match Communicator::init_rank(nranks, &id, rank) {
        Ok(c) => c,
        Err(e) => {
            println!(
                "OXH_ERR kind={:?} init_ms={} msg={}",
                e.kind(),
                t0.elapsed().as_millis(),
                e.message().replace('\n', " ")
            );
            std::process::exit(4);
        }
    };
    match scenario.as_str() {
        "colls" => scenario_colls(&c),
        "sweep" => all_reduce_sweep(&c, &[0, 1, 2, 7, 8, 1023, 4097, 65_536, 262_147, 1 << 20]),
        "small" => all_reduce_sweep(&c, &[1, 4097, 1 << 20]),
        "loop" => scenario_loop(c, &dir),
        "send_exit" => scenario_send_exit(&c),
        "children" => scenario_children(&c),
        "profiler" => netns_support::prof_counts::run(&c, PROF_CALLS, PROF_COUNT),
        s => panic!("unknown scenario {s}"),
    }
    c.destroy().expect("destroy");
    println!("OXH_OK rank {rank}");
}

/// All-reduces in the profiler's scenario, and their count.
const PROF_CALLS: usize = 3;
const PROF_COUNT: usize = 200_003;

// ---------------------------------------------------------------- tests

fn run_checked(hosts: &Hosts, scenario: &str, placement: &[usize]) {
    run_checked_env(hosts, scenario, placement, &[]);
}

fn run_checked_env(hosts: &Hosts, scenario: &str, placement: &[usize], env: &[(&str, &str)]) {
    let t0 = Instant::now();
    let ends = Job::start(hosts, scenario, placement, env).wait_ok(JOB_LIMIT);
    for e in &ends {
        assert!(
            e.log.contains(&format!("OXH_OK rank {}", e.rank)),
            "rank {} did not finish\n{}",
            e.rank,
            format_logs(&ends)
        );
    }
    let shm = !env.contains(&("NCCL_SHM_DISABLE", "1"));
    netns_support::assert_transports_shm(&ends, shm);
    eprintln!(
        "{scenario} on placement {placement:?} {env:?}: {:.2} s",
        t0.elapsed().as_secs_f64()
    );
}

#[test]
fn two_hosts_two_ranks_collectives() {
    let _s = netns_support::serial();
    let h = Hosts::new("coll", 2, 1);
    // Ranks 0,1 on host 0 and 2,3 on host 1: two TCP hops in the ring.
    run_checked(&h, "colls", &[0, 0, 1, 1]);
    // Interleaved: every ring hop crosses hosts.
    run_checked(&h, "colls", &[0, 1, 0, 1]);
    // TCP within a host too.
    run_checked_env(&h, "colls", &[0, 0, 1, 1], &[("NCCL_SHM_DISABLE", "1")]);
    // One channel and small slices: many partial writes per operation.
    run_checked_env(
        &h,
        "colls",
        &[0, 1, 0, 1],
        &[("OXCCL_HOST_NCHANNELS", "1"), ("NCCL_BUFFSIZE", "65536")],
    );
}

#[test]
fn three_hosts_two_ranks_all_reduce() {
    let _s = netns_support::serial();
    let h = Hosts::new("h3", 3, 1);
    run_checked(&h, "sweep", &[0, 0, 1, 1, 2, 2]);
}

#[test]
fn four_hosts_one_rank_all_reduce() {
    let _s = netns_support::serial();
    let h = Hosts::new("h4", 4, 1);
    run_checked(&h, "sweep", &[0, 1, 2, 3]);
}

/// Runs `small` on 2 hosts × 1 rank with `env`; returns the root address of
/// the id, the "Bootstrap: Using" lines and the rx byte deltas per host and
/// interface.
fn run_ifname(h: &Hosts, env: &[(&str, &str)]) -> (std::net::SocketAddr, Vec<u64>, Vec<u64>) {
    let before: Vec<(u64, u64)> = (0..2)
        .map(|i| {
            (
                h.counter(i, "eth0", "rx_bytes"),
                h.counter(i, "eth1", "rx_bytes"),
            )
        })
        .collect();
    let job = Job::start(h, "small", &[0, 1], env);
    let dir = job.dir.clone();
    let ends = job.wait_ok(JOB_LIMIT);
    assert_transports(&ends);
    let idhex = std::fs::read_to_string(dir.join("id.hex")).expect("id file");
    let root = id_root_addr(&netns_support::unhex(idhex.trim()));
    let mut d0 = Vec::new();
    let mut d1 = Vec::new();
    for (i, (b0, b1)) in before.iter().enumerate() {
        d0.push(h.counter(i, "eth0", "rx_bytes") - b0);
        d1.push(h.counter(i, "eth1", "rx_bytes") - b1);
    }
    // Each rank logs the interface it bound.
    for e in &ends {
        let using: Vec<&str> = e
            .log
            .lines()
            .filter(|l| l.contains("Bootstrap: Using "))
            .collect();
        assert!(!using.is_empty(), "no Bootstrap: Using line\n{}", e.log);
        let want_if = if root.ip() == std::net::IpAddr::V4(host_addr(0, 1)) {
            1
        } else {
            0
        };
        let want = format!("Using eth{want_if}:{}<", host_addr(e.host, want_if));
        assert!(
            using.iter().all(|l| l.contains(&want)),
            "rank {}: want {want:?} in {using:?}",
            e.rank
        );
    }
    (root, d0, d1)
}

#[test]
fn socket_ifname_selects_the_interface() {
    let _s = netns_support::serial();
    let h = Hosts::new("ifn", 2, 2);
    // Default: the first interface that is up and not lo (eth0, 198.18.1.x).
    let (root, d0, d1) = run_ifname(&h, &[]);
    assert_eq!(
        root.ip(),
        std::net::IpAddr::V4(host_addr(0, 0)),
        "default root"
    );
    for i in 0..2 {
        assert!(
            d0[i] > 4 << 20,
            "host {i}: eth0 received only {} bytes",
            d0[i]
        );
        assert!(d1[i] < 256 << 10, "host {i}: eth1 received {} bytes", d1[i]);
    }
    // A prefix naming the second interface, and an exclusion of the first:
    // bootstrap and data on 198.19.1.x.
    for spec in ["eth1", "^eth0", "=eth1"] {
        let (root, d0, d1) = run_ifname(&h, &[("NCCL_SOCKET_IFNAME", spec)]);
        assert_eq!(
            root.ip(),
            std::net::IpAddr::V4(host_addr(0, 1)),
            "NCCL_SOCKET_IFNAME={spec}: root"
        );
        for i in 0..2 {
            assert!(
                d1[i] > 4 << 20,
                "NCCL_SOCKET_IFNAME={spec}: host {i}: eth1 received only {} bytes",
                d1[i]
            );
            assert!(
                d0[i] < 256 << 10,
                "NCCL_SOCKET_IFNAME={spec}: host {i}: eth0 received {} bytes",
                d0[i]
            );
        }
    }
}

/// `OXCCL_BOOTSTRAP_IFNAME` puts the rendezvous on one network and
/// `NCCL_SOCKET_IFNAME` the data on the other: the bytes go where the data
/// setting says, the "Bootstrap: Using" lines where the bootstrap one says.
#[test]
fn bootstrap_and_data_on_different_interfaces() {
    let _s = netns_support::serial();
    let h = Hosts::new("bdi", 2, 2);
    for (boot, data) in [(0usize, 1usize), (1, 0)] {
        let (b, d) = (format!("=eth{boot}"), format!("=eth{data}"));
        let env = [
            ("OXCCL_BOOTSTRAP_IFNAME", b.as_str()),
            ("NCCL_SOCKET_IFNAME", d.as_str()),
        ];
        let (root, d0, d1) = run_ifname(&h, &env);
        assert_eq!(
            root.ip(),
            std::net::IpAddr::V4(host_addr(0, boot)),
            "{env:?}: root"
        );
        let (on_data, on_boot) = if data == 1 { (&d1, &d0) } else { (&d0, &d1) };
        for i in 0..2 {
            assert!(
                on_data[i] > 4 << 20,
                "{env:?}: host {i}: eth{data} received only {} bytes",
                on_data[i]
            );
            assert!(
                on_boot[i] < 256 << 10,
                "{env:?}: host {i}: eth{boot} received {} bytes",
                on_boot[i]
            );
        }
    }
}

#[test]
fn socket_ifname_without_match_lists_interfaces() {
    let _s = netns_support::serial();
    let h = Hosts::new("ifx", 1, 2);
    let comm_id = format!("{}:29517", host_addr(0, 0));
    for env in [
        vec![("NCCL_SOCKET_IFNAME", "nosuchif")],
        vec![
            ("NCCL_SOCKET_IFNAME", "nosuchif"),
            ("NCCL_COMM_ID", comm_id.as_str()),
        ],
    ] {
        let ends = Job::start(&h, "init_err", &[0], &env).wait(JOB_LIMIT);
        let e = &ends[0];
        assert!(e.status.success(), "{env:?}: {}\n{}", e.status, e.log);
        let kind = e.err_field("kind");
        let msg = e.err_field("msg").unwrap_or_default();
        assert_eq!(
            kind.as_deref(),
            Some("InvalidArgument"),
            "{env:?}: {}",
            e.log
        );
        for want in [
            "NCCL_SOCKET_IFNAME=nosuchif",
            "matches no interface",
            "lo 127.0.0.1",
            "eth0 198.18.1.1",
            "eth1 198.19.1.1",
        ] {
            assert!(msg.contains(want), "{env:?}: {want:?} not in {msg:?}");
        }
    }
}

/// Waits for the loop scenario to be running in every rank.
fn wait_started(job: &mut Job<'_>, n: usize) {
    job.wait_until("every rank's first all_reduce", JOB_LIMIT, |j| {
        (0..n).all(|r| j.has_marker(&format!("started.{r}")))
    });
    // Let the loop run a little more so the failure lands mid-collective.
    std::thread::sleep(Duration::from_millis(300));
}

#[test]
fn link_cut_ends_in_error_within_timeout() {
    let _s = netns_support::serial();
    let h = Hosts::new("cut", 2, 1);
    let env = [("OXCCL_TIMEOUT_MS", "5000"), ("OXH_COUNT", "262144")];
    let mut job = Job::start(&h, "loop", &[0, 1], &env);
    wait_started(&mut job, 2);
    let cut = Instant::now();
    h.set_link(0, "eth0", false);
    let ends = job.wait(JOB_LIMIT);
    for e in &ends {
        let took = e.at.duration_since(cut);
        let kind = e.err_field("kind");
        eprintln!(
            "link cut: rank {} ended after {:.2} s: {:?} {}",
            e.rank,
            took.as_secs_f64(),
            kind,
            e.err_field("msg").unwrap_or_default()
        );
        assert!(
            e.status.success() && e.log.contains("OXH_DESTROYED"),
            "rank {}: {} (3 = no error; destroy must return)\n{}",
            e.rank,
            e.status,
            format_logs(&ends)
        );
        assert!(
            matches!(kind.as_deref(), Some("Remote" | "Timeout")),
            "rank {}: kind {kind:?}\n{}",
            e.rank,
            format_logs(&ends)
        );
        // The operation in flight at the cut started at most one operation
        // earlier; its timeout is 5 s. Allow 4 s for noise and exit.
        assert!(
            took < Duration::from_secs(9),
            "rank {}: error only after {took:?}\n{}",
            e.rank,
            format_logs(&ends)
        );
    }
}

#[test]
fn killed_rank_on_other_host_gives_remote_error() {
    let _s = netns_support::serial();
    let h = Hosts::new("kill", 2, 1);
    // A long timeout, so only liveness detection can end the others quickly.
    let env = [("OXCCL_TIMEOUT_MS", "30000"), ("OXH_COUNT", "262144")];
    let mut job = Job::start(&h, "loop", &[0, 0, 1, 1], &env);
    wait_started(&mut job, 4);
    let victim = 3;
    let killed = Instant::now();
    job.kill(victim);
    let ends = job.wait(JOB_LIMIT);
    for e in &ends {
        let took = e.at.duration_since(killed);
        if e.rank == victim {
            assert!(!e.status.success());
            continue;
        }
        let kind = e.err_field("kind");
        eprintln!(
            "kill: rank {} (host {}) ended after {:.2} s: {:?} {}",
            e.rank,
            e.host,
            took.as_secs_f64(),
            kind,
            e.err_field("msg").unwrap_or_default()
        );
        assert!(
            e.status.success() && e.log.contains("OXH_DESTROYED"),
            "rank {}: {} (3 = no error; destroy must return)\n{}",
            e.rank,
            e.status,
            format_logs(&ends)
        );
        assert_eq!(
            kind.as_deref(),
            Some("Remote"),
            "rank {}\n{}",
            e.rank,
            format_logs(&ends)
        );
        assert!(
            took < Duration::from_secs(5),
            "rank {}: error only after {took:?}\n{}",
            e.rank,
            format_logs(&ends)
        );
    }
}

#[test]
fn comm_id_rendezvous_across_hosts() {
    let _s = netns_support::serial();
    let h = Hosts::new("cid", 2, 1);
    // Rank 0 (host 0) starts the root at NCCL_COMM_ID; the others derive the
    // same id from the variable and the shared secret.
    let comm_id = format!("{}:29411", host_addr(0, 0));
    let env = [
        ("NCCL_COMM_ID", comm_id.as_str()),
        ("OXCCL_AUTH_SECRET", "netns-test-secret"),
    ];
    let ends = Job::start(&h, "small", &[0, 0, 1, 1], &env).wait_ok(JOB_LIMIT);
    assert_transports(&ends);
    assert!(
        ends[0]
            .log
            .contains(&format!("rank 0 started the root at {comm_id}")),
        "{}",
        ends[0].log
    );
}

/// With NCCL_COMM_ID set, a split and a shrink whose new rank 0 is on
/// host 1 (see `scenario_children`).
#[test]
fn comm_id_children_with_rank_0_on_another_host() {
    let _s = netns_support::serial();
    let h = Hosts::new("cch", 2, 1);
    let comm_id = format!("{}:29412", host_addr(0, 0));
    let env = [
        ("NCCL_COMM_ID", comm_id.as_str()),
        ("OXCCL_AUTH_SECRET", "netns-test-secret"),
    ];
    run_checked_env(&h, "children", &[0, 0, 1, 1], &env);
}

#[test]
fn unreachable_host_at_init_times_out() {
    let _s = netns_support::serial();
    let h = Hosts::new("unr", 2, 1);
    // Host 1 has no link: its rank cannot reach the root on host 0.
    h.set_link(1, "eth0", false);
    let env = [("OXCCL_INIT_TIMEOUT_MS", "3000")];
    let job = Job::start(&h, "small", &[0, 1], &env);
    let started = job.started;
    let ends = job.wait(JOB_LIMIT);
    for e in &ends {
        let took = e.at.duration_since(started);
        let msg = e.err_field("msg").unwrap_or_default();
        eprintln!(
            "unreachable: rank {} ended after {:.2} s: {:?} {msg}",
            e.rank,
            took.as_secs_f64(),
            e.err_field("kind")
        );
        assert_eq!(
            e.status.code(),
            Some(4),
            "rank {}: init should fail\n{}",
            e.rank,
            format_logs(&ends)
        );
        assert_eq!(e.err_field("kind").as_deref(), Some("Timeout"), "{}", e.log);
        // 3 s of init timeout, 1 s of grace for the root's message, slack.
        assert!(took < Duration::from_secs(8), "rank {}: {took:?}", e.rank);
    }
    let m1 = ends[1].err_field("msg").unwrap_or_default();
    assert!(
        m1.contains(&host_addr(0, 0).to_string()),
        "rank 1 should name the root's address: {m1}"
    );
}

#[test]
fn link_flap_shorter_than_timeout_recovers() {
    let _s = netns_support::serial();
    let h = Hosts::new("flap", 2, 1);
    // The loop lasts 4 s; the link is down for 1 s of it; the timeout is 8 s.
    let env = [
        ("OXCCL_TIMEOUT_MS", "8000"),
        ("OXH_COUNT", "262144"),
        ("OXH_LOOP_SECS", "4"),
    ];
    let mut job = Job::start(&h, "loop", &[0, 1], &env);
    wait_started(&mut job, 2);
    h.set_link(0, "eth0", false);
    std::thread::sleep(Duration::from_millis(1000));
    h.set_link(0, "eth0", true);
    let ends = job.wait(JOB_LIMIT);
    for e in &ends {
        // Exit 3 with OXH_NOERR: the loop ran its time without an error.
        assert!(
            e.status.code() == Some(3) && e.log.contains("OXH_NOERR"),
            "rank {}: {} (want 3: no error)\n{}",
            e.rank,
            e.status,
            format_logs(&ends)
        );
    }
}

/// The longest all_reduce of rank `e`'s loop (its `max_op_ms=` field).
fn max_op_ms(e: &netns_support::RankEnd) -> u64 {
    e.log
        .lines()
        .find_map(|l| l.split_once("max_op_ms=").map(|(_, v)| v.trim().parse()))
        .and_then(|r| r.ok())
        .unwrap_or(0)
}

/// Two hosts, one rank each, all-reducing (results checked every
/// iteration) under a 60 s operation timeout; host 0's link goes down for
/// `down`, then up. Every rank must finish its loop without an error, and
/// the flap must have held a collective for about its length.
fn link_flap_recovers(tag: &str, down: Duration) {
    let _s = netns_support::serial();
    let h = Hosts::new(tag, 2, 1);
    // The loop stops (together) at its first check after 2 s: right after
    // the flap. The link timeout is left to follow the operation timeout.
    let env = [
        ("OXCCL_TIMEOUT_MS", "60000"),
        ("OXH_COUNT", "262144"),
        ("OXH_LOOP_SECS", "2"),
    ];
    let mut job = Job::start(&h, "loop", &[0, 1], &env);
    wait_started(&mut job, 2);
    h.set_link(0, "eth0", false);
    let cut = Instant::now();
    std::thread::sleep(down);
    h.set_link(0, "eth0", true);
    let ends = job.wait(JOB_LIMIT);
    for e in &ends {
        let max_op = max_op_ms(e);
        eprintln!(
            "flap of {down:?}: rank {} ended {:.2} s after the cut, longest all_reduce {max_op} ms",
            e.rank,
            e.at.duration_since(cut).as_secs_f64()
        );
        assert!(
            e.status.code() == Some(3) && e.log.contains("OXH_NOERR"),
            "rank {}: {} (want 3: no error)\n{}",
            e.rank,
            e.status,
            format_logs(&ends)
        );
        assert!(
            max_op >= down.as_millis() as u64 - 1000,
            "rank {}: longest all_reduce {max_op} ms: the flap did not hold a collective\n{}",
            e.rank,
            format_logs(&ends)
        );
    }
}

/// Longer than the control connections' old fixed keepalive (5 s idle, 5
/// probes 1 s apart), which ended such jobs at about 10 s.
#[test]
fn link_flap_of_10_s_recovers_under_a_60_s_timeout() {
    link_flap_recovers("flap10", Duration::from_secs(10));
}

#[test]
fn link_flap_of_20_s_recovers_under_a_60_s_timeout() {
    link_flap_recovers("flap20", Duration::from_secs(20));
}

/// A flap longer than OXCCL_LINK_TIMEOUT_MS (8 s; link down 12 s) under a
/// 60 s operation timeout: both ranks end with an error naming the other
/// rank, after the link timeout and well before the operation timeout.
#[test]
fn link_flap_longer_than_the_link_timeout_ends_both_ranks() {
    let _s = netns_support::serial();
    let h = Hosts::new("flaplt", 2, 1);
    let env = [
        ("OXCCL_TIMEOUT_MS", "60000"),
        ("OXCCL_LINK_TIMEOUT_MS", "8000"),
        ("OXH_COUNT", "262144"),
    ];
    let mut job = Job::start(&h, "loop", &[0, 1], &env);
    wait_started(&mut job, 2);
    let cut = Instant::now();
    h.set_link(0, "eth0", false);
    // The link comes back after 12 s while the ranks' ends are watched.
    let ends = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_secs(12));
            h.set_link(0, "eth0", true);
        });
        job.wait(JOB_LIMIT)
    });
    for e in &ends {
        let took = e.at.duration_since(cut);
        let msg = e.err_field("msg").unwrap_or_default();
        let kind = e.err_field("kind");
        eprintln!(
            "flap past the link timeout: rank {} ended after {:.2} s: {kind:?} {msg}",
            e.rank,
            took.as_secs_f64()
        );
        assert!(
            e.status.success() && e.log.contains("OXH_DESTROYED"),
            "rank {}: {} (3 = no error; destroy must return)\n{}",
            e.rank,
            e.status,
            format_logs(&ends)
        );
        let other = 1 - e.rank;
        assert!(
            msg.contains(&format!("rank {other}")),
            "rank {}: the error should name rank {other}: {msg}",
            e.rank
        );
        // Not before the link timeout (a flap shorter than it recovers); by
        // the link timeout plus a probe interval (1 s) and slack: before the
        // link came back (12 s), long before the 60 s operation timeout.
        assert!(
            took >= Duration::from_secs(7) && took < Duration::from_secs(12),
            "rank {}: ended after {took:?}\n{}",
            e.rank,
            format_logs(&ends)
        );
    }
}

/// The port in rank `e`'s "Bootstrap: Using eth0:ADDR<PORT>" line.
fn bootstrap_port(e: &netns_support::RankEnd) -> u16 {
    e.log
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once("Bootstrap: Using ")?;
            rest.split_once('<')?.1.split_once('>')?.0.parse().ok()
        })
        .unwrap_or_else(|| panic!("rank {}: no Bootstrap: Using line\n{}", e.rank, e.log))
}

/// Host 0 (ranks 0, 1) reaches host 1 (ranks 2, 3) only through a relay (see
/// `netns_support::proxy`); runs `scenario` through it and checks that the
/// cross-host bytes really went through the relay. Returns the bytes relayed
/// (toward host 1, toward host 0).
fn run_through_proxy(
    h: &Hosts,
    px: &str,
    shape: Shape,
    scenario: &str,
    env: &[(&str, &str)],
    min_bytes: u64,
) -> (u64, u64) {
    let proxy = Proxy::start(px, &h.hosts[1].ns, host_addr(1, 0), shape.clone());
    let rx_b = h.counter(1, "eth0", "rx_bytes");
    let t0 = Instant::now();
    let ends = Job::start(h, scenario, &[0, 0, 1, 1], env).wait_ok(JOB_LIMIT);
    for e in &ends {
        assert!(
            e.log.contains(&format!("OXH_OK rank {}", e.rank)),
            "rank {} did not finish\n{}",
            e.rank,
            format_logs(&ends)
        );
    }
    assert_transports(&ends);
    // Host 1's listeners got ports the relay listens on.
    for e in &ends[2..] {
        let p = bootstrap_port(e);
        assert!(
            (proxy::PORTS.0..=proxy::PORTS.1).contains(&p),
            "rank {} listens on port {p}, outside the relay's range",
            e.rank
        );
    }
    let rx_b = h.counter(1, "eth0", "rx_bytes") - rx_b;
    let (to_b, to_a) = proxy.bytes();
    let accepted = proxy.accepted();
    eprintln!(
        "{scenario} through the relay {shape:?} {env:?}: {:.2} s, {accepted} connections, \
         {to_b} bytes to host 1, {to_a} to host 0; host 1's eth0 received {rx_b} bytes",
        t0.elapsed().as_secs_f64()
    );
    // 4 cross-host pairs, each with a control connection, >= 1 data stream
    // and the lower rank's bootstrap message channel.
    assert!(
        accepted >= 12,
        "only {accepted} connections through the relay"
    );
    assert!(
        to_b >= min_bytes,
        "relay carried only {to_b} bytes toward host 1, want {min_bytes}"
    );
    if scenario != "send_exit" {
        assert!(
            to_a >= min_bytes,
            "relay carried only {to_a} bytes toward host 0, want {min_bytes}"
        );
    }
    // Nothing bypassed it: what reaches host 1 directly is its own
    // connections' traffic (root join, its message channels, ACKs).
    assert!(
        rx_b < 1 << 20,
        "host 1's eth0 received {rx_b} bytes around the relay"
    );
    (to_b, to_a)
}

#[test]
fn slow_link_through_a_delaying_proxy() {
    let _s = netns_support::serial();
    let mut h = Hosts::new("slow", 2, 1);
    let px = h.route_via_proxy(0, 1);
    // 3 ms added each way per chunk, the stream re-split into 1..=9973-byte
    // pieces: every collective of the sweep (odd counts, all_gather,
    // send/recv...) must still be exact.
    let shape = Shape {
        delay: Duration::from_millis(3),
        rate: None,
        max_chunk: 9973,
    };
    // An all_reduce of S bytes moves at least S each way between the hosts
    // (each host needs the other's contribution); "colls" and "small" have
    // two of 4 MiB (out of place and in place).
    run_through_proxy(&h, &px, shape, "colls", &[], 8 << 20);
    // A bandwidth cap of 32 MiB/s per direction and connection on top, one
    // channel and 64 KiB rings (TCP's user-space buffer stays 1 MiB): all
    // bytes of a collective queue on one slow stream.
    let shape = Shape {
        delay: Duration::from_millis(1),
        rate: Some(32 << 20),
        max_chunk: 65_536,
    };
    run_through_proxy(
        &h,
        &px,
        shape,
        "small",
        &[("OXCCL_HOST_NCHANNELS", "1"), ("NCCL_BUFFSIZE", "65536")],
        8 << 20,
    );
    // A sender that leaves while its bytes are still queued at the slow link
    // (1 MiB at 4 MiB/s: about 250 ms behind its connections' close, which
    // carries no bytes and passes at once). Until oxccl-host waited for the
    // data streams' own close over TCP, the receiver failed here with "rank 0
    // ... closed its connection"; the colls run above hit the same race now
    // and then under load, at its last send.
    let shape = Shape {
        delay: Duration::from_millis(1),
        rate: Some(4 << 20),
        max_chunk: 65_536,
    };
    run_through_proxy(&h, &px, shape, "send_exit", &[], 1 << 20);
}

#[test]
fn slow_link_stall_longer_than_keepalive_completes() {
    let _s = netns_support::serial();
    let mut h = Hosts::new("stall", 2, 1);
    let px = h.route_via_proxy(0, 1);
    let proxy = Proxy::start(
        &px,
        &h.hosts[1].ns,
        host_addr(1, 0),
        Shape {
            delay: Duration::from_millis(1),
            rate: None,
            max_chunk: 65_536,
        },
    );
    // The stall (6 s) is longer than the control connections' keepalive idle
    // time plus one probe interval (5 s + 1 s for a 10 s link timeout,
    // oxccl-host `sys.rs`, link_plan), so
    // probes go out while nothing moves, and shorter than the 15 s operation
    // timeout: nothing may fail. The loop stops (together) at its first
    // check after 2 s, i.e. right after the stall.
    let stall = Duration::from_secs(6);
    let env = [
        ("OXCCL_TIMEOUT_MS", "15000"),
        ("OXCCL_LINK_TIMEOUT_MS", "10000"),
        ("OXH_COUNT", "65536"),
        ("OXH_LOOP_SECS", "2"),
    ];
    let mut job = Job::start(&h, "loop", &[0, 0, 1, 1], &env);
    wait_started(&mut job, 4);
    let moved = proxy.bytes();
    proxy.stall(stall);
    let ends = job.wait(JOB_LIMIT);
    for e in &ends {
        let max_op: u64 = e
            .log
            .lines()
            .find_map(|l| l.split_once("max_op_ms=").map(|(_, v)| v.trim().parse()))
            .and_then(|r| r.ok())
            .unwrap_or(0);
        eprintln!("stall: rank {} longest all_reduce {max_op} ms", e.rank);
        assert!(
            e.status.code() == Some(3) && e.log.contains("OXH_NOERR"),
            "rank {}: {} (want 3: no error)\n{}",
            e.rank,
            e.status,
            format_logs(&ends)
        );
        // Every all_reduce crosses the relay, so the one in flight when the
        // stall began could not end before it did: the stall really held
        // a collective (a lower bound from the mechanism, not a speed).
        assert!(
            max_op >= stall.as_millis() as u64 - 1000,
            "rank {}: longest all_reduce {max_op} ms: the stall did not hold a collective\n{}",
            e.rank,
            format_logs(&ends)
        );
    }
    let after = proxy.bytes();
    assert!(
        after.0 > moved.0 && after.1 > moved.1,
        "nothing went through the relay after the stall"
    );
}

/// Two processes on two hosts with a profiler plugin (the C test profiler
/// of oxccl-net, v6): its API and proxy events counted exactly per rank
/// (`netns_support::prof_counts::check_two_hosts`).
#[test]
fn two_hosts_profiler_proxy_events() {
    let _s = netns_support::serial();
    let so = netns_support::prof_counts::build();
    let h = Hosts::new("prof", 2, 1);
    let env = [("NCCL_PROFILER_PLUGIN", so.as_str())];
    let ends = Job::start(&h, "profiler", &[0, 1], &env).wait_ok(JOB_LIMIT);
    netns_support::prof_counts::check_two_hosts(&ends, PROF_CALLS);
}
