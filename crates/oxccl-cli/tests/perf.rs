//! End-to-end tests of `oxccl perf`: real rank processes (and threads), the
//! table, JSON output, external launchers, bad input and dying ranks.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod perf_common;
use perf_common::run_for;

const BIN: &str = env!("CARGO_BIN_EXE_oxccl");

fn perf(args: &[&str]) -> Command {
    perf_common::perf_command(BIN, args)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// One half of a data line: time, algbw, busbw, #wrong (None for N/A).
#[derive(Debug)]
struct HalfRow {
    algbw: f64,
    busbw: f64,
    wrong: Option<u64>,
}

#[derive(Debug)]
struct Row {
    size: u64,
    count: u64,
    dtype: String,
    redop: String,
    root: i64,
    oop: HalfRow,
    ip: Option<HalfRow>,
}

fn parse_half(f: &[&str]) -> Option<HalfRow> {
    if f[0] == "N/A" {
        return None;
    }
    Some(HalfRow {
        algbw: f[1].parse().unwrap(),
        busbw: f[2].parse().unwrap(),
        wrong: f[3].parse().ok(),
    })
}

/// The data lines of a table (checked against the fixed column layout).
fn rows(stdout: &str) -> Vec<Row> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            // %12li  %12li  %8s  %6s  %6s then twice "  %7s  %6s  %6s  %5s".
            assert_eq!(
                l.len(),
                12 + 2 + 12 + 2 + 8 + 2 + 6 + 2 + 6 + 2 * 32,
                "{l:?}"
            );
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 13, "{l}");
            Row {
                size: f[0].parse().unwrap(),
                count: f[1].parse().unwrap(),
                dtype: f[2].into(),
                redop: f[3].into(),
                root: f[4].parse().unwrap(),
                oop: parse_half(&f[5..9]).expect("out-of-place is measured"),
                ip: parse_half(&f[9..13]),
            }
        })
        .collect()
}

fn assert_ok(out: &Output) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

fn check_all_reduce_table(stdout: &str, n: usize) {
    assert!(stdout.starts_with("# oxccl perf version"), "{stdout}");
    for r in 0..n {
        assert!(
            stdout.contains(&format!("#  Rank {r:2} Group  0 Pid")),
            "rank {r} missing:\n{stdout}"
        );
    }
    assert!(stdout.contains(
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong"
    ));
    assert!(stdout.contains("# Out of bounds values : 0 OK\n"));
    assert!(stdout.contains("# Avg bus bandwidth    : "));
    let rows = rows(stdout);
    // -b 8 -e 64K -f 4: 8, 32, ..., 32768.
    let sizes: Vec<u64> = rows.iter().map(|r| r.size).collect();
    assert_eq!(sizes, vec![8, 32, 128, 512, 2048, 8192, 32768]);
    let factor = 2.0 * (n as f64 - 1.0) / n as f64;
    for r in &rows {
        assert_eq!(r.count, r.size / 4);
        assert_eq!(
            (r.dtype.as_str(), r.redop.as_str(), r.root),
            ("float", "sum", -1)
        );
        for h in [Some(&r.oop), r.ip.as_ref()].into_iter().flatten() {
            assert_eq!(h.wrong, Some(0), "{r:?}");
            // Both columns are rounded to 2 decimals.
            assert!(
                (h.busbw - h.algbw * factor).abs() <= 0.005 + 0.005 * factor + 1e-9,
                "busbw {} vs algbw {} x {factor}",
                h.busbw,
                h.algbw
            );
        }
    }
}

/// `--hosts 2`: the rank processes get two NCCL_HOSTIDs, so the ranks of
/// one "host" meet over shared memory and the others over TCP (NCCL_DEBUG's
/// transport lines say which), and the results stay right.
#[test]
fn pretend_hosts_put_ranks_on_the_network_path() {
    let mut c = perf(&[
        "--ranks",
        "4",
        "--hosts",
        "2",
        "-b",
        "8",
        "-e",
        "64K",
        "-f",
        "4",
        "-n",
        "2",
        "-w",
        "1",
        "-c",
        "1",
        "allreduce",
    ]);
    c.env("NCCL_DEBUG", "INFO").env("NCCL_DEBUG_SUBSYS", "INIT");
    let out = run_for(c, 90);
    assert_ok(&out);
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    // NCCL_DEBUG's lines go to stdout, as NCCL's do: the table is the rest.
    let table: String = text(&out.stdout)
        .lines()
        .filter(|l| !l.contains(" NCCL INFO ") && !l.starts_with("oxccl version"))
        .map(|l| format!("{l}\n"))
        .collect();
    check_all_reduce_table(&table, 4);
    assert!(table.contains("2 pretend hosts (NCCL_HOSTID)"), "{table}");
    // Rank 0 and 1 share a host, 2 and 3 the other.
    assert!(all.contains("0[0] -> 1[1] via SHM"), "{all}");
    assert!(all.contains("0[0] -> 2[2] via NET/Socket"), "{all}");
    assert!(all.contains("3[3] -> 2[2] via SHM"), "{all}");
    assert!(all.contains("3[3] -> 1[1] via NET/Socket"), "{all}");
}

#[test]
fn all_reduce_sweep_two_and_three_processes() {
    for n in [2, 3] {
        let mut c = perf(&[
            "-b", "8", "-e", "64K", "-f", "4", "-n", "2", "-w", "1", "-c", "1",
        ]);
        c.args(["--ranks", &n.to_string()]);
        c.arg("allreduce");
        let out = run_for(c, 60);
        assert_ok(&out);
        check_all_reduce_table(&text(&out.stdout), n);
    }
}

#[test]
fn every_collective_type_and_op_over_two_ranks() {
    for coll in [
        "all_reduce",
        "all_gather",
        "broadcast",
        "reduce",
        "reduce_scatter",
        "alltoall",
        "gather",
        "scatter",
        "sendrecv_perf",
    ] {
        let c = perf(&[
            coll, "--ranks", "2", "-b", "64", "-e", "1K", "-f", "16", "-n", "1", "-w", "0", "-c",
            "1", "-d", "all", "-o", "all", "-r", "1",
        ]);
        let out = run_for(c, 60);
        assert_ok(&out);
        let stdout = text(&out.stdout);
        let rows = rows(&stdout);
        let reduces = matches!(coll, "all_reduce" | "reduce" | "reduce_scatter");
        // 12 types x (5 ops or none) x 2 sizes.
        assert_eq!(rows.len(), 12 * if reduces { 5 } else { 1 } * 2, "{coll}");
        for r in &rows {
            assert_eq!(r.oop.wrong, Some(0), "{coll} {r:?}");
            let has_ip = !matches!(coll, "alltoall" | "sendrecv_perf");
            assert_eq!(r.ip.is_some(), has_ip, "{coll}");
            if let Some(ip) = &r.ip {
                assert_eq!(ip.wrong, Some(0), "{coll} {r:?}");
            }
            let rooted = matches!(coll, "broadcast" | "reduce" | "gather" | "scatter");
            assert_eq!(r.root, if rooted { 1 } else { -1 });
            if !reduces {
                assert_eq!(r.redop, "none");
            }
        }
    }
}

#[test]
fn thread_launch_with_aggregation() {
    let c = perf(&[
        "all_reduce",
        "--launch",
        "thread",
        "--ranks",
        "3",
        "-b",
        "1K",
        "-e",
        "4K",
        "-f",
        "2",
        "-n",
        "2",
        "-w",
        "1",
        "-m",
        "3",
        "-c",
        "2",
        "-o",
        "all",
    ]);
    let out = run_for(c, 60);
    assert_ok(&out);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("launch thread"));
    let rs = rows(&stdout);
    assert_eq!(rs.len(), 5 * 3);
    assert!(rs.iter().all(|r| r.oop.wrong == Some(0)));
    // sendrecv groups -m pairs too.
    let c = perf(&[
        "sendrecv", "-b", "1K", "-e", "1K", "-n", "2", "-w", "1", "-m", "4", "-t", "2",
    ]);
    let out = run_for(c, 60);
    assert_ok(&out);
    let rows = rows(&text(&out.stdout));
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].oop.wrong, Some(0));
    assert!(rows[0].ip.is_none());
}

#[test]
fn no_check_prints_na() {
    let c = perf(&[
        "broadcast",
        "--ranks",
        "2",
        "-b",
        "1K",
        "-e",
        "1K",
        "-n",
        "1",
        "-w",
        "0",
        "-c",
        "0",
    ]);
    let out = run_for(c, 60);
    assert_ok(&out);
    let rows = rows(&text(&out.stdout));
    assert_eq!(rows[0].oop.wrong, None);
    assert_eq!(rows[0].ip.as_ref().unwrap().wrong, None);
}

#[test]
fn json_output_has_config_and_records() {
    let dir = std::env::temp_dir().join(format!("oxccl-perf-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("out.json");
    let c = perf(&[
        "reduce_scatter",
        "--ranks",
        "2",
        "-b",
        "256",
        "-e",
        "1K",
        "-f",
        "2",
        "-n",
        "1",
        "-w",
        "0",
        "-d",
        "float,bfloat16",
        "-o",
        "max",
        "-J",
        path.to_str().unwrap(),
    ]);
    let out = run_for(c, 60);
    assert_ok(&out);
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    // nccl-tests' layout (version 3): top level, config, results.
    assert_eq!(doc["version"], 3);
    for k in ["start_time", "end_time"] {
        assert_eq!(doc[k].as_str().unwrap().len(), 19, "{k}: {}", doc[k]);
    }
    assert_eq!(doc["args"][1], "perf");
    // Rank 0 is a child process here: the unique id it was handed (whose
    // bytes hold the rendezvous secret) stays out of the file.
    let env: Vec<&str> = doc["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        !env.iter().any(|e| e.starts_with("OXCCL_PERF_ID=")),
        "{env:?}"
    );
    assert_eq!(doc["nccl_version"], 22705);
    let cfg = &doc["config"];
    assert_eq!(cfg["nthreads"], 1);
    assert_eq!(cfg["ngpus"], 1);
    assert_eq!(cfg["minimum_bytes"], 256);
    assert_eq!(cfg["maximum_bytes"], 1024);
    assert_eq!(cfg["step_factor"], 2);
    assert_eq!(cfg["warmup_iters"], 0);
    assert_eq!(cfg["iterations"], 1);
    assert_eq!(cfg["aggregated_iterations"], 1);
    assert_eq!(cfg["validation"], 1);
    assert_eq!(cfg["graph"], 0);
    assert_eq!(cfg["blocking_collectives"], false);
    assert_eq!(cfg["per_iter_timing"], false);
    assert_eq!(cfg["parallel_init"], false);
    let devs = cfg["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 2);
    for k in [
        "rank",
        "group",
        "pid",
        "hostname",
        "device",
        "device_hex",
        "device_info",
    ] {
        assert!(!devs[1][k].is_null(), "devices[1].{k}");
    }
    let res = doc["results"].as_array().unwrap();
    assert_eq!(res.len(), 2 * 3);
    for r in res {
        for half in ["out_of_place", "in_place"] {
            assert_eq!(r[half]["nwrong"], 0, "{r}");
            assert!(r[half]["time"].as_f64().unwrap() > 0.0);
            let alg = r[half]["alg_bw"].as_f64().unwrap();
            let bus = r[half]["bus_bw"].as_f64().unwrap();
            assert!((bus - alg * 0.5).abs() < 1e-9);
        }
        assert_eq!(r["redop"], "max");
        assert_eq!(r["root"], "    -1");
        assert_eq!(r["actual_iterations"], 1);
        assert_eq!(r["experiment_name"], "");
    }
    assert_eq!(res[0]["size"], 256);
    assert_eq!(res[0]["count"], 32);
    assert_eq!(res[3]["type"], "bfloat16");
    assert_eq!(doc["out_of_bounds"]["count"], 0);
    assert_eq!(doc["out_of_bounds"]["okay"], true);
    assert!(doc["average_bus_bandwidth"]["bandwidth"].as_f64().unwrap() > 0.0);
    assert_eq!(doc["errors"].as_array().unwrap().len(), 0);
    // oxccl's additions.
    assert_eq!(doc["oxccl"]["collective"], "reduce_scatter");
    assert_eq!(doc["oxccl"]["nranks"], 2);
    assert_eq!(doc["oxccl"]["ops"][0], "max");
    let _ = std::fs::remove_dir_all(&dir);
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn torchrun_style_external_launch() {
    let port = free_port().to_string();
    let kids: Vec<_> = (0..2)
        .map(|r| {
            let mut c = perf(&[
                "all_gather",
                "-b",
                "1K",
                "-e",
                "4K",
                "-f",
                "2",
                "-n",
                "2",
                "-w",
                "1",
            ]);
            c.env("RANK", r.to_string())
                .env("WORLD_SIZE", "2")
                .env("LOCAL_RANK", r.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            c.spawn().unwrap()
        })
        .collect();
    let t0 = Instant::now();
    let outs: Vec<Output> = kids
        .into_iter()
        .map(|k| k.wait_with_output().unwrap())
        .collect();
    assert!(t0.elapsed() < Duration::from_secs(60));
    for o in &outs {
        assert_ok(o);
    }
    let stdout0 = text(&outs[0].stdout);
    assert!(
        stdout0.contains("# nRanks 2 launch external (torchrun)"),
        "{stdout0}"
    );
    assert!(stdout0.contains("#  Rank  1 Group  0 Pid"));
    assert_eq!(rows(&stdout0).len(), 3);
    assert!(rows(&stdout0).iter().all(|r| r.oop.wrong == Some(0)));
    // Only rank 0 prints.
    assert!(outs[1].stdout.is_empty(), "{}", text(&outs[1].stdout));
}

#[test]
fn external_launch_without_address_is_a_usage_error() {
    let mut c = perf(&["all_reduce"]);
    c.env("RANK", "0")
        .env("WORLD_SIZE", "2")
        .env_remove("MASTER_ADDR")
        .env_remove("MASTER_PORT");
    let out = run_for(c, 20);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("MASTER_ADDR"));
}

#[test]
fn bad_input_is_one_line_and_status_2() {
    let cases: &[(&[&str], &str)] = &[
        (&["all_reduce", "--frobnicate"], "--frobnicate"),
        (&["all_reduce", "-b", "1M", "-e", "1K"], "-b/--minbytes"),
        (&["all_reduce", "-f", "0"], "-f/--stepfactor"),
        (&["all_reduce", "-d", "float17"], "--datatype"),
        (&["all_reduce", "-o", "mulsum"], "--op"),
        (&["all_reduce", "--ranks", "0"], "--ranks"),
        (&["all_reduce", "-g", "0"], "--ngpus"),
        (
            &["all_reduce", "--backend", "cpu", "-g", "2"],
            "-g/--ngpus 2: GPUs need --backend cuda",
        ),
        (
            &["all_reduce", "--backend", "cpu", "-G", "1"],
            "-G/--cudagraph 1: GPUs need --backend cuda",
        ),
        (
            &["all_reduce", "--backend", "cpu", "--lib", "/x/libnccl.so.2"],
            "--lib /x/libnccl.so.2: only the CUDA backend",
        ),
        (&["broadcast", "-r", "5", "--ranks", "2"], "-r/--root"),
        (&["all_reducer"], "unknown collective"),
        (&["all_reduce", "-n", "0"], "--iters"),
        (&["all_reduce", "-b", "12Q"], "--minbytes"),
        (
            &["all_reduce", "-b", "-5"],
            "-b/--minbytes -5: a size must be a non-negative number of bytes, optionally with K, M or G",
        ),
        (&["all_reduce", "-e", "-1G"], "-e/--maxbytes -1G: a size must"),
        (&["broadcast", "-r", "first"], "-r/--root first: a root must"),
        (
            &["all_reduce", "--backend", "cpu", "-R", "1"],
            "-R 1 (register buffers) needs --backend cuda",
        ),
        (
            &["all_reduce", "--backend", "cpu", "-R", "2"],
            "-R 2 (symmetric windows) needs --backend cuda",
        ),
        (
            &["all_reduce", "--backend", "cpu", "-x", "1"],
            "-x 1 (CTA policy) needs --backend cuda",
        ),
        (
            &["all_reduce", "--backend", "cpu", "-y", "1"],
            "-y 1 (CUDA's default stream) needs --backend cuda",
        ),
        (&["all_reduce", "-D", "1"], "-D/--device_implementation 1"),
        (&["all_reduce", "-V", "0"], "-V/--device_cta_count 0"),
        (&["all_reduce", "-K", "2"], "-K/--per_iter_skip 2: needs -I 1"),
        (
            &["all_reduce", "-I", "1", "-n", "3", "-K", "3"],
            "-K/--per_iter_skip 3: accepted values are 0 to 2",
        ),
        (&["all_reduce", "-p", "2"], "--parallel_init"),
        (&["all_reduce", "-t", "3", "--ranks", "4"], "-t/--nthreads"),
        (&["all_reduce", "-a", "4"], "--average"),
        (&["all_reduce", "--launch", "fibers"], "--launch"),
        (
            &["all_reduce", "-J", "/nonexistent-dir/x.json"],
            "-J/--output_file",
        ),
        (&[], "<COLLECTIVE>"),
        (&["all_reduce", "--hosts", "0"], "--hosts 0"),
        (
            &["all_reduce", "--ranks", "2", "--hosts", "3"],
            "--hosts 3: only 2 rank processes",
        ),
        (
            &["all_reduce", "--launch", "thread", "--hosts", "2"],
            "--hosts 2: pretend hosts",
        ),
        (
            &["all_reduce", "--backend", "cpu", "--share-gpus"],
            "--share-gpus: only with --backend cuda and without --compare",
        ),
    ];
    for (args, needle) in cases {
        let out = run_for(perf(args), 20);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// GPU flags where no GPU is usable (CUDA_VISIBLE_DEVICES="" hides any GPU,
/// so this holds on GPU machines too): one line naming the flag and why,
/// exit status 2, before any rank starts.
#[test]
fn gpu_flags_without_a_gpu_are_usage_errors() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["all_reduce", "-g", "2"],
            "-g/--ngpus 2: no usable GPU here (",
        ),
        (
            &["all_reduce", "-G", "10"],
            "-G/--cudagraph 10: no usable GPU here (",
        ),
        (
            &["all_reduce", "--backend", "cuda"],
            "--backend cuda: no usable GPU here (",
        ),
        (
            &["all_reduce", "--backend", "cuda", "-g", "2", "-G", "10"],
            "--backend cuda: no usable GPU here (",
        ),
        (
            &["all_reduce", "--lib", "/x/libnccl.so.2"],
            "--lib /x/libnccl.so.2: no usable GPU here (",
        ),
    ];
    for (args, needle) in cases {
        let mut c = perf(args);
        c.env("CUDA_VISIBLE_DEVICES", "");
        let out = run_for(c, 20);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("oxccl perf: "), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    // Without GPU flags, auto is the CPU backend.
    let mut c = perf(&[
        "all_reduce",
        "--ranks",
        "2",
        "-b",
        "8",
        "-e",
        "64",
        "-f",
        "2",
    ]);
    c.env("CUDA_VISIBLE_DEVICES", "");
    let out = run_for(c, 60);
    assert_ok(&out);
    assert!(text(&out.stdout).contains("backend cpu"));
}

#[test]
fn help_lists_perf() {
    let out = run_for(
        {
            let mut c = Command::new(BIN);
            c.arg("--help");
            c
        },
        20,
    );
    assert_ok(&out);
    let t = text(&out.stdout);
    assert!(t.contains("perf"));
    assert!(t.contains("doctor"));
}

#[test]
fn wrong_results_fail_with_status_7() {
    let mut c = perf(&[
        "all_reduce",
        "--ranks",
        "2",
        "-b",
        "64",
        "-e",
        "256",
        "-f",
        "4",
        "-n",
        "1",
        "-w",
        "0",
    ]);
    c.env("OXCCL_PERF_TEST_CORRUPT_RANK", "1");
    let out = run_for(c, 60);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("# Out of bounds values : 4 FAILED"),
        "{stdout}"
    );
    assert!(rows(&stdout).iter().all(|r| r.oop.wrong == Some(1)));
}

#[test]
fn a_rank_that_aborts_stops_the_run() {
    for launch in ["process", "thread"] {
        let mut c = perf(&[
            "all_reduce",
            "--ranks",
            "3",
            "--launch",
            launch,
            "-b",
            "1K",
            "-e",
            "1M",
            "-f",
            "2",
            "-n",
            "5",
            "-w",
            "1",
        ]);
        c.env("OXCCL_PERF_TEST_ABORT_RANK", "1");
        let t0 = Instant::now();
        let out = run_for(c, 30);
        assert!(t0.elapsed() < Duration::from_secs(10));
        assert_ne!(out.status.code(), Some(0));
        let err = text(&out.stderr);
        assert!(err.contains("rank 1"), "{err}");
        if launch == "process" {
            assert!(err.contains("rank 1 (pid"), "{err}");
            assert!(err.contains("SIGABRT"), "{err}");
            assert_eq!(out.status.code(), Some(1));
        }
    }
}

/// Starts a long run and returns it with the pid of `rank` (from the rank list).
/// The caller waits for it.
#[allow(clippy::zombie_processes)]
fn start_and_find(
    args: &[&str],
    rank: usize,
) -> (
    std::process::Child,
    i32,
    BufReader<std::process::ChildStdout>,
) {
    let mut c = perf(args);
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut rd = BufReader::new(child.stdout.take().unwrap());
    let want = format!("#  Rank {rank:2} Group  0 Pid");
    let mut line = String::new();
    loop {
        line.clear();
        assert!(rd.read_line(&mut line).unwrap() > 0, "no rank list");
        if let Some(rest) = line.strip_prefix(&want) {
            let pid = rest.split_whitespace().next().unwrap().parse().unwrap();
            return (child, pid, rd);
        }
    }
}

fn wait_deadline(child: &mut std::process::Child, secs: u64) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if t0.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            panic!("still running after {secs} s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_killed_rank_is_named_within_seconds() {
    let (mut child, pid, _rd) = start_and_find(
        &[
            "all_reduce",
            "--ranks",
            "3",
            "-b",
            "4K",
            "-e",
            "4K",
            "-n",
            "100000000",
            "-w",
            "1",
        ],
        2,
    );
    // SAFETY: kill(2) on a pid we read from our own child's rank list.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let t0 = Instant::now();
    let st = wait_deadline(&mut child, 15);
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(st.code(), Some(1));
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(
        err.contains(&format!(
            "rank 2 (pid {pid}) was killed by signal 9 (SIGKILL)"
        )),
        "{err}"
    );
}

#[test]
fn timeout_aborts_a_stuck_run() {
    let (mut child, pid, _rd) = start_and_find(
        &[
            "all_reduce",
            "--ranks",
            "2",
            "-b",
            "4K",
            "-e",
            "4K",
            "-n",
            "100000000",
            "-w",
            "1",
            "-T",
            "1",
        ],
        1,
    );
    // A stopped rank never answers: the others must give up after -T.
    // SAFETY: kill(2) on a pid we read from our own child's rank list.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let t0 = Instant::now();
    let st = wait_deadline(&mut child, 20);
    assert!(t0.elapsed() < Duration::from_secs(8));
    assert_eq!(st.code(), Some(1));
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("-T/--timeout"), "{err}");
    // The stopped rank was killed by the launcher, not left behind.
    // SAFETY: signal 0 only probes whether the pid exists.
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    assert!(!alive, "rank 1 (pid {pid}) was left running");
}

/// The table's data lines split into fields.
fn fields(stdout: &str) -> Vec<Vec<String>> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

/// nccl-tests' defaults: -w 1 -n 20 -c 1 -m 1 -b/-e 32M (checked in the header).
#[test]
fn defaults_are_nccl_tests() {
    let out = run_for(
        perf(&["all_reduce", "--ranks", "1", "--backend", "cpu"]),
        120,
    );
    assert_ok(&out);
    let o = text(&out.stdout);
    assert!(
        o.contains("minBytes 33554432 maxBytes 33554432 step: 1048576(bytes) warmup iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0"),
        "{o}"
    );
}

/// -N 2 prints the sweep twice; -r all runs every root; -S adds a time;
/// -C names the column cputime; -p 1 and -M 1 add their header and footer lines.
#[test]
fn cycles_roots_timestamps_cputime_memory() {
    let c = perf(&[
        "broadcast",
        "--ranks",
        "3",
        "-b",
        "8",
        "-e",
        "16",
        "-f",
        "2",
        "-n",
        "2",
        "-N",
        "2",
        "-r",
        "all",
        "-S",
        "1",
        "-C",
        "1",
        "-p",
        "1",
        "-M",
        "1",
        "-u",
        "3",
    ]);
    let out = run_for(c, 60);
    assert_ok(&out);
    let o = text(&out.stdout);
    let f = fields(&o);
    // 3 roots x 2 cycles x 2 sizes.
    assert_eq!(f.len(), 12, "{o}");
    let roots: Vec<&str> = f.iter().map(|l| l[4].as_str()).collect();
    assert_eq!(
        roots,
        ["0", "0", "0", "0", "1", "1", "1", "1", "2", "2", "2", "2"]
    );
    let sizes: Vec<&str> = f.iter().take(4).map(|l| l[0].as_str()).collect();
    assert_eq!(sizes, ["8", "16", "8", "16"]);
    for l in &f {
        // 13 cells, then the date and the time of -S.
        assert_eq!(l.len(), 15, "{l:?}");
        assert_eq!(l[13].len(), 10, "{l:?}");
        assert_eq!(l[14].len(), 8, "{l:?}");
        assert_eq!(
            (l[8].as_str(), l[12].as_str()),
            ("0", "0"),
            "-u 3 results: {l:?}"
        );
    }
    assert!(o.contains("  cputime   algbw"), "{o}");
    assert!(o.contains("timestamp"), "{o}");
    assert!(o.contains("unalign: 3"), "{o}");
    assert!(o.contains("# Parallel Init Enabled"), "{o}");
    assert!(
        o.contains("# Host memory usage    : User-Allocated "),
        "{o}"
    );
}

/// -I 1: four more cells per half, and per-iteration times in the JSON
/// (nccl-tests' `*_per_iter` objects), -K leaving the first out of the summary.
#[test]
fn per_iteration_timing() {
    let dir = std::env::temp_dir().join(format!("oxccl-perf-iter-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("it.json");
    let c = perf(&[
        "all_reduce",
        "--ranks",
        "2",
        "-b",
        "64",
        "-e",
        "64",
        "-n",
        "4",
        "-I",
        "1",
        "-K",
        "1",
        "-J",
        path.to_str().unwrap(),
    ]);
    let out = run_for(c, 60);
    assert_ok(&out);
    let o = text(&out.stdout);
    assert!(o.contains("i_min    i_max    i_p99    i_cv%"), "{o}");
    assert!(o.contains("summary skips first 1 iterations"), "{o}");
    let f = fields(&o);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].len(), 5 + 2 * 8, "{:?}", f[0]);
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(doc["config"]["per_iter_timing"], true);
    assert_eq!(doc["config"]["per_iter_skip"], 1);
    for k in ["out_of_place_per_iter", "in_place_per_iter"] {
        let it = &doc["results"][0][k];
        assert_eq!(it["times_us"].as_array().unwrap().len(), 4, "{it}");
        assert_eq!(it["skipped_iterations"], 1);
        let (min, max) = (
            it["min_us"].as_f64().unwrap(),
            it["max_us"].as_f64().unwrap(),
        );
        assert!(min > 0.0 && min <= max, "{it}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A sweep whose buffers cannot fit is refused before any rank starts: exit
/// 2, one line with what is needed and what is there, nothing printed.
#[test]
fn oversize_is_refused_before_the_ranks_start() {
    let t0 = Instant::now();
    let out = run_for(
        perf(&[
            "all_reduce",
            "--backend",
            "cpu",
            "--ranks",
            "4",
            "-b",
            "100000G",
            "-e",
            "100000G",
        ]),
        20,
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with(
            "oxccl perf: -e 100000G: 4 ranks need 800000.0 GiB of host memory for their buffers; "
        ),
        "{err}"
    );
    assert!(err.contains("GiB is available"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(out.stdout.is_empty());
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn own_variables_raise_no_warning_at_info() {
    // The launcher sets OXCCL_PERF_* for its children; with NCCL_DEBUG=INFO
    // each child echoes its settings and would warn about unknown names.
    let mut c = perf(&["-b", "8", "-e", "8", "-n", "1", "-w", "0", "--ranks", "2"]);
    c.arg("allreduce").env("NCCL_DEBUG", "INFO");
    let out = run_for(c, 60);
    assert_ok(&out);
    let all = text(&out.stdout) + &text(&out.stderr);
    assert!(
        all.contains("NCCL INFO"),
        "NCCL_DEBUG=INFO took no effect:\n{all}"
    );
    assert!(!all.contains("OXCCL_PERF_"), "{all}");
    assert!(!all.contains("NCCL WARN"), "{all}");
}
