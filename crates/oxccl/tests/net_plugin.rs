//! Collectives between hosts through a network plugin (`NCCL_NET_PLUGIN`):
//! the repo's test plugin `libnccl-net-oxtest` (plain TCP behind NCCL's
//! `ncclNet` ABI, crates/oxccl-net-test-plugin), built here by cargo.
//!
//! * Loopback: ranks are processes of this machine that look like different
//!   hosts through `NCCL_HOSTID`, so their pairs use the network path (the
//!   plugin) and pairs with the same host id use shared memory. Runs
//!   everywhere.
//! * Network namespaces: hosts made of namespaces (`netns_support`), the
//!   plugin's device being each host's veth. Needs root and iproute2 (CI
//!   has both); fails without them.
//!
//! Every rank checks every result exactly, and the INFO log must name the
//! plugin's network ("via NET/oxtest/0") for pairs on different hosts.
//! Ranks re-run this binary as the test `netns_worker_entry` with `OXH_*`
//! variables (the protocol of `netns_support`).

mod netns_support;

use netns_support::{format_logs, transports, Hosts, Job, RankEnd};
use oxccl::{Communicator, Group, RedOp, UniqueId};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const JOB_LIMIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------- the plugin

/// Builds the test plugin (`features`: "" or "only-v8") with cargo into a
/// target directory beside this test's, and returns it copied as
/// `libnccl-net-oxtest.so` (the name `NCCL_NET_PLUGIN=oxtest` looks for).
fn plugin(features: &str) -> PathBuf {
    static DEFAULT: OnceLock<PathBuf> = OnceLock::new();
    static ONLY_V8: OnceLock<PathBuf> = OnceLock::new();
    let cell = if features.is_empty() {
        &DEFAULT
    } else {
        &ONLY_V8
    };
    cell.get_or_init(|| oxccl_net::testing::build_test_plugin(features, "oxccl"))
        .clone()
}

// ---------------------------------------------------------------- worker side

fn env_usize(k: &str) -> usize {
    std::env::var(k)
        .unwrap_or_else(|_| panic!("{k} not set"))
        .parse()
        .unwrap_or_else(|_| panic!("{k} not a number"))
}

/// Rank 0 makes the id and publishes it as `<dir>/id.hex`; others wait.
fn get_id(rank: usize, dir: &Path) -> UniqueId {
    let path = dir.join("id.hex");
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
        assert!(t0.elapsed() < Duration::from_secs(30), "no unique id");
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

fn scenario_colls(c: &Communicator) {
    let (r, n) = (c.rank(), c.size());
    // Odd counts, one past a slot (128 KiB = 32768 f32), and 4 MB.
    for count in [0usize, 1, 7, 1023, 32_769, 65_537, 1 << 20] {
        let send: Vec<f32> = (0..count).map(|i| val(r, i)).collect();
        let mut recv = vec![-1.0f32; count];
        c.all_reduce(&send, &mut recv, RedOp::Sum)
            .unwrap_or_else(|e| panic!("all_reduce count {count}: {e}"));
        check(&format!("all_reduce(count {count})"), &recv, |i| {
            (0..n).map(|q| val(q, i)).sum()
        });
    }
    let mut mx: Vec<i32> = (0..1001).map(|i| ((i + 3 * r) % 17) as i32 - 8).collect();
    c.all_reduce_in_place(&mut mx, RedOp::Max)
        .expect("all_reduce max i32");
    for (i, &x) in mx.iter().enumerate() {
        let w = (0..n).map(|q| ((i + 3 * q) % 17) as i32 - 8).max().unwrap();
        assert_eq!(x, w, "all_reduce max i32 element {i}");
    }
    for count in [1usize, 1003, 131_075] {
        let send: Vec<f32> = (0..count).map(|i| val(r, i)).collect();
        let mut recv = vec![-1.0f32; count * n];
        c.all_gather(&send, &mut recv).expect("all_gather");
        check(&format!("all_gather(count {count})"), &recv, |j| {
            val(j / count, j % count)
        });
    }
    for count in [1usize, 777, 65_536] {
        let send: Vec<f32> = (0..count * n).map(|i| val(r, i)).collect();
        let mut recv = vec![-1.0f32; count];
        c.reduce_scatter(&send, &mut recv, RedOp::Sum)
            .expect("reduce_scatter");
        check(&format!("reduce_scatter(count {count})"), &recv, |i| {
            (0..n).map(|q| val(q, r * count + i)).sum()
        });
    }
    let root = n - 1;
    let send: Vec<f32> = (0..100_003).map(|i| val(root, i) + 0.5).collect();
    let mut recv = vec![-1.0f32; send.len()];
    c.broadcast(&send, &mut recv, root).expect("broadcast");
    check("broadcast", &recv, |i| val(root, i) + 0.5);
    // A ring of send/recv: r -> r+1, every hop that crosses hosts on the plugin.
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
}

/// All-reduce in a loop until an error, printed as `OXH_ERR kind=.. ms=..`
/// (the time from the last success to the error); touches `started.<rank>`
/// after the first success. Exits 3 if 30 s pass without an error.
fn scenario_loop(c: Communicator, dir: &Path) -> ! {
    let send = vec![1.0f32; 1 << 18];
    let mut recv = vec![0.0f32; 1 << 18];
    let t0 = Instant::now();
    let mut last = Instant::now();
    let mut first = true;
    loop {
        if let Err(e) = c.all_reduce(&send, &mut recv, RedOp::Sum) {
            println!(
                "OXH_ERR kind={:?} ms={} msg={}",
                e.kind(),
                last.elapsed().as_millis(),
                e.message().replace('\n', " ")
            );
            drop(c);
            std::process::exit(0);
        }
        assert_eq!(recv[0], c.size() as f32);
        if first {
            std::fs::write(dir.join(format!("started.{}", c.rank())), b"").expect("marker");
            first = false;
        }
        last = Instant::now();
        if t0.elapsed() > Duration::from_secs(30) {
            println!("OXH_NOERR");
            std::process::exit(3);
        }
    }
}

/// The entry of every rank process, started by the net_plugin tests with
/// its role in `OXH_*` variables.
#[test]
#[ignore = "child process of the net_plugin tests"]
fn netns_worker_entry() {
    let Ok(scenario) = std::env::var("OXH_SCENARIO") else {
        panic!("netns_worker_entry is a rank of a net_plugin test: it runs when a test starts it");
    };
    let rank = env_usize("OXH_RANK");
    let nranks = env_usize("OXH_NRANKS");
    let dir = PathBuf::from(std::env::var("OXH_DIR").expect("OXH_DIR"));
    let id = get_id(rank, &dir);
    let c = match Communicator::init_rank(nranks, &id, rank) {
        Ok(c) => c,
        Err(e) => {
            println!("OXH_ERR kind={:?} msg={}", e.kind(), e.message());
            std::process::exit(4);
        }
    };
    match scenario.as_str() {
        "colls" => scenario_colls(&c),
        "loop" => scenario_loop(c, &dir),
        "profiler" => netns_support::prof_counts::run(&c, 3, 200_003),
        s => panic!("unknown scenario {s}"),
    }
    c.destroy().expect("destroy");
    println!("OXH_OK rank {rank}");
}

// ---------------------------------------------------------------- checks

/// Every rank finished, and each pair used the plugin (`NET/<net>/`) when
/// its hosts differ and shared memory otherwise.
fn assert_ok_via(ends: &[RankEnd], net: &str) {
    for e in ends {
        assert!(
            e.status.success() && e.log.contains(&format!("OXH_OK rank {}", e.rank)),
            "rank {} did not finish\n{}",
            e.rank,
            format_logs(ends)
        );
    }
    let t = transports(ends);
    for (r, row) in t.iter().enumerate() {
        for (q, label) in row.iter().enumerate() {
            if q == r {
                continue;
            }
            let want = if ends[r].host == ends[q].host {
                "SHM/".to_string()
            } else {
                format!("NET/{net}/")
            };
            assert!(
                label.as_deref().is_some_and(|l| l.starts_with(&want)),
                "rank {r} -> rank {q}: transport {label:?}, want {want}*\n{}",
                format_logs(ends)
            );
        }
    }
}

/// Runs `placement.len()` ranks of `scenario` as processes of this machine,
/// rank r with `NCCL_HOSTID=oxh-h<placement[r]>`.
fn run_loopback(tag: &str, placement: &[usize], env: &[(&str, &str)]) -> Vec<RankEnd> {
    run_loopback_with(tag, "colls", placement, env, |_, _| {})
}

/// As [`run_loopback`] for `scenario`, calling `poke(dir, children)` every
/// 10 ms while the ranks run (to kill one, say).
fn run_loopback_with(
    tag: &str,
    scenario: &str,
    placement: &[usize],
    env: &[(&str, &str)],
    mut poke: impl FnMut(&Path, &mut [std::process::Child]),
) -> Vec<RankEnd> {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = std::env::temp_dir().join(format!("oxccl-net-plugin-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("job dir");
    let n = placement.len();
    let mut children = Vec::new();
    for (r, &h) in placement.iter().enumerate() {
        let log = std::fs::File::create(dir.join(format!("rank{r}.log"))).expect("log");
        let log2 = log.try_clone().expect("log");
        let mut cmd = Command::new(&exe);
        cmd.args([
            "--ignored",
            "--exact",
            "netns_worker_entry",
            "--nocapture",
            "--test-threads=1",
        ]);
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
            .env("NCCL_HOSTID", format!("oxh-h{h}"))
            .env("OXH_SCENARIO", scenario)
            .env("OXH_RANK", r.to_string())
            .env("OXH_NRANKS", n.to_string())
            .env("OXH_DIR", &dir);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null()).stdout(log).stderr(log2);
        children.push(cmd.spawn().expect("spawn rank"));
    }
    let t0 = Instant::now();
    let mut status: Vec<Option<std::process::ExitStatus>> = vec![None; n];
    while status.iter().any(Option::is_none) {
        for (r, c) in children.iter_mut().enumerate() {
            if status[r].is_none() {
                status[r] = c.try_wait().expect("try_wait");
            }
        }
        if t0.elapsed() > JOB_LIMIT {
            for c in children.iter_mut() {
                let _ = c.kill();
            }
            for (r, c) in children.iter_mut().enumerate() {
                status[r] = Some(c.wait().expect("wait"));
            }
            let logs: String = (0..n)
                .map(|r| {
                    format!(
                        "----- rank {r} -----\n{}\n",
                        std::fs::read_to_string(dir.join(format!("rank{r}.log")))
                            .unwrap_or_default()
                    )
                })
                .collect();
            panic!("job {tag} ran past {JOB_LIMIT:?}\n{logs}");
        }
        poke(&dir, &mut children);
        std::thread::sleep(Duration::from_millis(10));
    }
    let ends: Vec<RankEnd> = (0..n)
        .map(|r| RankEnd {
            rank: r,
            host: placement[r],
            status: status[r].expect("exited"),
            at: Instant::now(),
            log: std::fs::read_to_string(dir.join(format!("rank{r}.log"))).unwrap_or_default(),
        })
        .collect();
    if ends.iter().all(|e| e.status.success()) {
        let _ = std::fs::remove_dir_all(&dir);
    }
    ends
}

// ---------------------------------------------------------------- tests

/// Two processes, two "hosts" (NCCL_HOSTID): every collective through the
/// plugin's v12 ABI (the newest it exports).
#[test]
fn loopback_two_hosts_through_plugin_v12() {
    let _s = netns_support::serial();
    let so = plugin("");
    let t0 = Instant::now();
    let ends = run_loopback("v12", &[0, 1], &[("NCCL_NET_PLUGIN", so.to_str().unwrap())]);
    assert_ok_via(&ends, "oxtest");
    let log = &ends[0].log;
    assert!(
        log.contains("through ncclNetPlugin_v12") && log.contains("NET/oxtest: "),
        "{}",
        format_logs(&ends)
    );
    eprintln!("loopback v12: {:.1} s", t0.elapsed().as_secs_f64());
}

/// Two processes, two "hosts", through the plugin, with a profiler plugin
/// (the C test profiler, v6): the plugin's transfers are network transfers
/// too, with their proxy events counted exactly per rank
/// (`netns_support::prof_counts::check_two_hosts`).
#[test]
fn loopback_through_plugin_gives_proxy_events() {
    let _s = netns_support::serial();
    let so = plugin("");
    let prof = netns_support::prof_counts::build();
    let ends = run_loopback_with(
        "prof",
        "profiler",
        &[0, 1],
        &[
            ("NCCL_NET_PLUGIN", so.to_str().unwrap()),
            ("NCCL_PROFILER_PLUGIN", prof.as_str()),
        ],
        |_, _| {},
    );
    assert_ok_via(&ends, "oxtest");
    netns_support::prof_counts::check_two_hosts(&ends, 3);
}

/// Three processes on two "hosts" (two share memory), through a plugin that
/// exports only v8 (int sizes), found by name (`NCCL_NET_PLUGIN=oxtest`
/// loads `libnccl-net-oxtest.so` from the library path), with one channel
/// and small rings (many short messages and slot wraps).
#[test]
fn loopback_mixed_hosts_through_plugin_v8_by_name() {
    let _s = netns_support::serial();
    let so = plugin("only-v8");
    let dir = so.parent().unwrap().to_str().unwrap().to_string();
    let ends = run_loopback(
        "v8",
        &[0, 0, 1],
        &[
            ("NCCL_NET_PLUGIN", "oxtest"),
            ("LD_LIBRARY_PATH", &dir),
            ("OXCCL_HOST_NCHANNELS", "1"),
            ("NCCL_BUFFSIZE", "65536"),
        ],
    );
    assert_ok_via(&ends, "oxtest");
    assert!(
        ends[2].log.contains("through ncclNetPlugin_v8"),
        "{}",
        format_logs(&ends)
    );
}

/// A plugin that cannot be used (its init fails) leaves the job on oxccl's
/// sockets with a WARN naming it.
#[test]
fn loopback_broken_plugin_falls_back_to_sockets() {
    let _s = netns_support::serial();
    let so = plugin("");
    let ends = run_loopback(
        "fallback",
        &[0, 1],
        &[
            ("NCCL_NET_PLUGIN", so.to_str().unwrap()),
            ("OXTEST_NET_FAIL_INIT", "1"),
        ],
    );
    assert_ok_via(&ends, "Socket");
    for e in &ends {
        assert!(
            e.log.contains("WARN NET/Plugin: plugin ")
                && e.log.contains("falling back to oxccl's sockets"),
            "{}",
            format_logs(&ends)
        );
    }
}

/// Hosts made of network namespaces: 2 hosts x 2 ranks, the plugin's device
/// being each host's veth.
#[test]
fn netns_two_hosts_through_plugin() {
    let _s = netns_support::serial();
    let so = plugin("");
    let h = Hosts::new("plug", 2, 1);
    let t0 = Instant::now();
    let p = so.to_str().unwrap();
    let ends = Job::start(&h, "colls", &[0, 0, 1, 1], &[("NCCL_NET_PLUGIN", p)]).wait(JOB_LIMIT);
    assert_ok_via(&ends, "oxtest");
    assert!(
        ends[0].log.contains("device 0 'eth0'"),
        "{}",
        format_logs(&ends)
    );
    // Interleaved: every ring hop crosses hosts.
    let ends = Job::start(&h, "colls", &[0, 1, 0, 1], &[("NCCL_NET_PLUGIN", p)]).wait(JOB_LIMIT);
    assert_ok_via(&ends, "oxtest");
    eprintln!("netns through plugin: {:.1} s", t0.elapsed().as_secs_f64());
}

/// A rank killed in the middle of all-reduces over the plugin: the survivor
/// fails with a remote error within seconds (its plugin connections fail),
/// not at the 30 s timeout and not by hanging.
#[test]
fn loopback_killed_peer_is_an_error_not_a_hang() {
    let _s = netns_support::serial();
    let so = plugin("");
    let mut killed = false;
    let ends = run_loopback_with(
        "kill",
        "loop",
        &[0, 1],
        &[("NCCL_NET_PLUGIN", so.to_str().unwrap())],
        |dir, children| {
            if !killed && dir.join("started.1").exists() && dir.join("started.0").exists() {
                std::thread::sleep(Duration::from_millis(200));
                let _ = children[1].kill();
                killed = true;
            }
        },
    );
    let e = &ends[0];
    assert!(killed, "the ranks never started\n{}", format_logs(&ends));
    let line = e
        .log
        .lines()
        .find_map(|l| l.find("OXH_ERR ").map(|i| &l[i..]))
        .unwrap_or_else(|| panic!("rank 0 saw no error\n{}", format_logs(&ends)));
    assert!(
        line.contains("kind=Remote"),
        "{line}\n{}",
        format_logs(&ends)
    );
    let ms: u64 = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ms="))
        .and_then(|v| v.parse().ok())
        .expect("ms=");
    assert!(ms < 10_000, "the error took {ms} ms: {line}");
    eprintln!("survivor: {line}");
}

/// One plugin connection as the test plugin logs it at close
/// (`OXTEST_NET_TRACE`): (send?, device, tag, bytes).
fn closed_connections(log: &str) -> Vec<(bool, usize, Option<usize>, u64)> {
    log.lines()
        .filter_map(|l| {
            let (send, rest) = if let Some(i) = l.find("send closed: device ") {
                (true, &l[i + "send closed: device ".len()..])
            } else if let Some(i) = l.find("receive closed: device ") {
                (false, &l[i + "receive closed: device ".len()..])
            } else {
                return None;
            };
            let w: Vec<&str> = rest.split_whitespace().collect();
            // D 'NAME' tag T: B bytes in M messages
            let dev = w.first()?.parse().ok()?;
            let tag = w.get(3)?.trim_end_matches(':').parse().ok();
            let bytes = w.get(4)?.parse().ok()?;
            Some((send, dev, tag, bytes))
        })
        .collect()
}

/// The device channel `c` of a rank with index `local` on its host uses
/// among `ndev` equally near devices, by NCCL_CROSS_NIC (unset: 2): the
/// rule of `oxccl_core::topo::nic_per_channel`, restated.
fn want_device(cross: Option<&str>, local: usize, c: usize, ndev: usize) -> usize {
    match cross {
        Some("1") => (local + c) % ndev,
        _ => c % ndev,
    }
}

/// Hosts made of network namespaces, 2 ranks on each, through a plugin with
/// several devices: each channel's connections (both ends) go through the
/// device NCCL_CROSS_NIC's rule gives (0: the same index on both hosts;
/// 1: spread from the rank's index on its host; unset: rail-aligned, every
/// device being equally near), as the plugin's per-connection counts show,
/// and every result is exact. With one device, everything on it.
#[test]
fn netns_channels_spread_over_nics_by_cross_nic() {
    let _s = netns_support::serial();
    let so = plugin("");
    let p = so.to_str().unwrap();
    let h = Hosts::new("nics", 2, 1);
    let placement = [0usize, 0, 1, 1];
    let local = |r: usize| (0..r).filter(|&q| placement[q] == placement[r]).count();
    // 4 collective + 2 point-to-point streams per peer on other hosts.
    let nch = 6;
    for (ndev, cross) in [(3, Some("0")), (3, Some("1")), (3, None), (1, None)] {
        let mut env = vec![
            ("NCCL_NET_PLUGIN", p),
            ("OXTEST_NET_TRACE", "1"),
            ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
        ];
        let n = ndev.to_string();
        if ndev > 1 {
            env.push(("OXTEST_NET_DEVICES", &n));
        }
        if let Some(v) = cross {
            env.push(("NCCL_CROSS_NIC", v));
        }
        let what = format!("{ndev} devices, NCCL_CROSS_NIC={cross:?}");
        let ends = Job::start(&h, "colls", &placement, &env).wait(JOB_LIMIT);
        assert_ok_via(&ends, "oxtest");
        for e in &ends {
            let l = local(e.rank);
            let want: Vec<usize> = (0..nch).map(|c| want_device(cross, l, c, ndev)).collect();
            let line = format!("rank {} ({nch} channels) uses NET/oxtest device", e.rank);
            let by_channel = format!(
                "; by channel: {} (NCCL_CROSS_NIC={})",
                want.iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
                cross.unwrap_or("2")
            );
            assert!(
                e.log
                    .lines()
                    .any(|x| x.contains(&line) && x.contains(&by_channel)),
                "{what}: rank {} logs no '{line}...{by_channel}'\n{}",
                e.rank,
                format_logs(&ends)
            );
            let conns = closed_connections(&e.log);
            // Two peers on the other host, a send and a receive connection
            // per stream each.
            assert_eq!(
                conns.len(),
                2 * 2 * nch,
                "{what}: rank {}: {conns:?}\n{}",
                e.rank,
                format_logs(&ends)
            );
            let mut moved = vec![0u64; nch];
            for &(send, dev, tag, bytes) in &conns {
                let Some(c) = tag else {
                    assert_eq!(bytes, 0, "{what}: rank {}: {conns:?}", e.rank);
                    continue;
                };
                assert!(c < nch, "{what}: rank {}: tag {c}", e.rank);
                assert_eq!(
                    dev, want[c],
                    "{what}: rank {} (local {l}) channel {c} ({}) went through device {dev}, want {}: {conns:?}",
                    e.rank,
                    if send { "send" } else { "receive" },
                    want[c]
                );
                moved[c] += bytes;
            }
            assert!(
                moved.iter().all(|&b| b > 0),
                "{what}: rank {}: bytes by channel {moved:?}",
                e.rank
            );
        }
    }
}

/// Hosts with two real interfaces each (eth0 and eth1, one subnet each),
/// one rank per host: the plugin's devices are the two interfaces, and
/// rail-aligned channels (NCCL_CROSS_NIC=0) put the odd channels on eth1
/// of both hosts, whose kernel counters show the bytes (the bootstrap and
/// the even channels use eth0).
#[test]
fn netns_channels_use_both_interfaces() {
    let _s = netns_support::serial();
    let so = plugin("");
    let p = so.to_str().unwrap();
    let h = Hosts::new("twoif", 2, 2);
    let before: Vec<u64> = (0..2).map(|i| h.counter(i, "eth1", "rx_bytes")).collect();
    let env = [
        ("NCCL_NET_PLUGIN", p),
        ("OXTEST_NET_TRACE", "1"),
        ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
        ("NCCL_CROSS_NIC", "0"),
    ];
    let ends = Job::start(&h, "colls", &[0, 1], &env).wait(JOB_LIMIT);
    assert_ok_via(&ends, "oxtest");
    for e in &ends {
        assert!(
            e.log.contains(&format!(
                "rank {} (6 channels) uses NET/oxtest devices 0, 1; by channel: 0 1 0 1 0 1 (NCCL_CROSS_NIC=0)",
                e.rank
            )) && e.log.contains("device(s): eth0 ") && e.log.contains(", eth1 "),
            "{}",
            format_logs(&ends)
        );
        let conns = closed_connections(&e.log);
        assert_eq!(conns.len(), 2 * 6, "{conns:?}");
        for &(_, dev, tag, _) in &conns {
            assert_eq!(Some(dev), tag.map(|c| c % 2), "{conns:?}");
        }
        let on1: u64 = conns
            .iter()
            .filter(|&&(send, dev, _, _)| !send && dev == 1)
            .map(|c| c.3)
            .sum();
        assert!(on1 > 1 << 20, "rank {}: {on1} bytes in on eth1", e.rank);
    }
    // What each host received on eth1 is at least what its plugin says
    // came in on device 1 (eth1).
    for (i, e) in ends.iter().enumerate() {
        let on1: u64 = closed_connections(&e.log)
            .iter()
            .filter(|&&(send, dev, _, _)| !send && dev == 1)
            .map(|c| c.3)
            .sum();
        let got = h.counter(e.host, "eth1", "rx_bytes") - before[e.host];
        assert!(
            got >= on1,
            "host {i}: eth1 received {got} bytes, the plugin counted {on1} in on device 1"
        );
    }
}
