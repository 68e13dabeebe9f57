//! `oxccl perf --backend cuda` end to end, on real GPUs. Every test is
//! `#[ignore = "needs a GPU: ..."]` and fails without the GPUs (or NVIDIA's
//! NCCL) it needs; scripts/gpu-test.sh runs them on the GPU machine.
//!
//! The measured library is oxccl's `libnccl.so` next to the `oxccl` binary
//! (`cargo build -p oxccl-nccl` puts it there), or `OXCCL_PERF_LIB`. On the
//! GPU machine, where the binaries are carried without cargo, `OXCCL_BIN`
//! names the `oxccl` executable. NVIDIA's NCCL (`OXCCL_PERF_NCCL`, else the
//! PyTorch wheel's copy at [`TORCH_NCCL`]) is used where it exists: for
//! `--compare`, and for one process per GPU.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

mod perf_common;
use perf_common::run_for;

const TORCH_NCCL: &str =
    "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2";

/// Visible GPUs; panics with fewer than `need` (the tests are
/// `#[ignore = "needs a GPU: ..."]` and run where GPUs are).
fn require_gpus(test: &str, need: usize) -> usize {
    match oxccl::gpu::tools::timing::device_count() {
        Ok(n) if n >= need => n,
        Ok(n) => panic!("{test}: needs {need} GPU(s), {n} visible"),
        Err(e) => panic!("{test}: needs {need} GPU(s): {e}"),
    }
}

fn bin() -> PathBuf {
    std::env::var_os("OXCCL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_oxccl")))
}

/// NVIDIA's NCCL: `OXCCL_PERF_NCCL`, else the PyTorch wheel's copy; panics
/// when neither exists.
fn require_nvidia_nccl(test: &str) -> PathBuf {
    let p = std::env::var_os("OXCCL_PERF_NCCL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(TORCH_NCCL));
    assert!(
        p.exists(),
        "{test}: needs NVIDIA's NCCL: {} does not exist (set OXCCL_PERF_NCCL)",
        p.display()
    );
    p
}

fn perf(args: &[&str]) -> Command {
    let mut c = perf_common::perf_command(bin(), &["--backend", "cuda", "-T", "120"]);
    c.args(args);
    if let Some(l) = std::env::var_os("OXCCL_PERF_LIB") {
        c.arg("--lib").arg(l);
    }
    // Never NVLink multicast on the shared machines (shared/gpu.md).
    c.env("NCCL_NVLS_ENABLE", "0")
        .env("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        .env("NVSHMEM_DISABLE_NVLS", "1");
    c
}

fn show(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Data lines' #wrong cells (out-of-place, and in-place unless N/A). Data
/// lines start with the size in bytes; anything else (`#` headers, the
/// `NCCL_DEBUG` lines that share stdout) is skipped.
fn wrong_cells(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<&str>>())
        .filter(|f| f.len() > 12 && f[0].parse::<u64>().is_ok())
        .flat_map(|f| vec![f[8].to_string(), f[12].to_string()])
        .collect()
}

fn assert_clean(out: &Output, rows_at_least: usize) {
    assert_eq!(out.status.code(), Some(0), "{}", show(out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("backend cuda"), "{}", show(out));
    assert!(
        stdout.contains("# Out of bounds values : 0 OK"),
        "{}",
        show(out)
    );
    let cells = wrong_cells(&stdout);
    assert!(cells.len() >= 2 * rows_at_least, "{}", show(out));
    assert!(
        cells.iter().all(|w| w == "0" || w == "N/A"),
        "{}",
        show(out)
    );
}

#[test]
#[ignore = "needs a GPU: every collective on the GPUs of one thread"]
fn every_collective_on_the_gpus_of_one_thread() {
    let n = require_gpus("every_collective_on_the_gpus_of_one_thread", 1);
    let g = n.min(2).to_string();
    for coll in [
        "all_reduce",
        "all_gather",
        "broadcast",
        "reduce",
        "reduce_scatter",
        "alltoall",
        "gather",
        "scatter",
        "sendrecv",
    ] {
        let out = run_for(
            perf(&[
                coll, "-g", &g, "-b", "8", "-e", "256K", "-f", "64", "-n", "3", "-w", "2",
            ]),
            300,
        );
        assert_clean(&out, 3);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains(&format!("nGpus {g}")), "{coll}: {stdout}");
        assert!(
            stdout.contains("#  Rank  0 Group  0 Pid"),
            "{coll}: {stdout}"
        );
    }
}

#[test]
#[ignore = "needs a GPU: types ops aggregation and blocking"]
fn types_ops_aggregation_and_blocking() {
    let n = require_gpus("types_ops_aggregation_and_blocking", 1);
    let g = n.min(2).to_string();
    let out = run_for(
        perf(&[
            "all_reduce",
            "-g",
            &g,
            "-b",
            "64",
            "-e",
            "64K",
            "-f",
            "32",
            "-d",
            "all",
            "-o",
            "all",
            "-n",
            "2",
            "-w",
            "1",
            "-m",
            "3",
            "-z",
            "1",
        ]),
        600,
    );
    assert_clean(&out, 12 * 5 * 3);
}

#[test]
#[ignore = "needs a GPU: graph replays"]
fn graph_replays() {
    let n = require_gpus("graph_replays", 1);
    let g = n.min(2).to_string();
    let out = run_for(
        perf(&[
            "all_reduce",
            "-g",
            &g,
            "-b",
            "8",
            "-e",
            "1M",
            "-f",
            "16",
            "-G",
            "5",
            "-n",
            "4",
        ]),
        300,
    );
    assert_clean(&out, 4);
    assert!(String::from_utf8_lossy(&out.stdout).contains("graph: 5"));
}

#[test]
#[ignore = "needs a GPU: json names the GPUs"]
fn json_names_the_gpus() {
    let n = require_gpus("json_names_the_gpus", 1);
    let g = n.min(2);
    let path = std::env::temp_dir().join(format!("oxccl-perf-gpu-{}.json", std::process::id()));
    let out = run_for(
        perf(&[
            "all_reduce",
            "-g",
            &g.to_string(),
            "-b",
            "1K",
            "-e",
            "1K",
            "-J",
            path.to_str().expect("utf-8 temp path"),
        ]),
        120,
    );
    assert_clean(&out, 1);
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("JSON file")).expect("JSON");
    let _ = std::fs::remove_file(&path);
    assert_eq!(doc["oxccl"]["backend"], "cuda");
    assert_eq!(doc["config"]["ngpus"], g as u64);
    assert!(doc["oxccl"]["library_path"].as_str().is_some());
    assert_eq!(doc["nccl_version"], 22705);
    let ranks = doc["config"]["devices"].as_array().expect("devices");
    assert_eq!(ranks.len(), g);
    for (i, r) in ranks.iter().enumerate() {
        assert_eq!(r["device"], i as u64);
        assert!(!r["device_info"].as_str().unwrap_or("").is_empty(), "{r}");
    }
    assert!(
        doc["oxccl"]["machine"]
            .as_str()
            .unwrap_or("")
            .contains(" x "),
        "{doc}"
    );
}

#[test]
#[ignore = "needs a GPU: wrong results fail with status 7"]
fn wrong_results_fail_with_status_7() {
    require_gpus("wrong_results_fail_with_status_7", 1);
    let mut c = perf(&["all_reduce", "-b", "64", "-e", "64", "--ranks", "1"]);
    c.env("OXCCL_PERF_TEST_CORRUPT_RANK", "0");
    let out = run_for(c, 120);
    assert_eq!(out.status.code(), Some(7), "{}", show(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("FAILED"));
}

#[test]
#[ignore = "needs a GPU and NVIDIA's NCCL: compare with nvidia NCCL"]
fn compare_with_nvidia_nccl() {
    let n = require_gpus("compare_with_nvidia_nccl", 1);
    let nccl = require_nvidia_nccl("compare_with_nvidia_nccl");
    let g = n.min(2).to_string();
    let mut c = perf(&[
        "all_reduce",
        "-g",
        &g,
        "-b",
        "8",
        "-e",
        "4M",
        "-f",
        "8",
        "-n",
        "5",
    ]);
    c.arg("--compare").arg(&nccl);
    let out = run_for(c, 300);
    assert_clean(&out, 7);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("compare: libnccl.so.2 2."), "{stdout}");
    // The compared library's #wrong column (16th field) is 0 on every line.
    for l in stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(f.get(15), Some(&"0"), "{l}");
    }
}

#[test]
#[ignore = "needs 2 GPUs and NVIDIA's NCCL: one process per GPU with nvidia NCCL"]
fn one_process_per_gpu_with_nvidia_nccl() {
    require_gpus("one_process_per_gpu_with_nvidia_nccl", 2);
    let nccl = require_nvidia_nccl("one_process_per_gpu_with_nvidia_nccl");
    let mut c = Command::new(bin());
    c.arg("perf")
        .args([
            "all_reduce",
            "--backend",
            "cuda",
            "--ranks",
            "2",
            "-b",
            "8",
            "-e",
            "1M",
            "-f",
            "32",
            "-T",
            "120",
        ])
        .arg("--lib")
        .arg(&nccl)
        .env("NCCL_NVLS_ENABLE", "0")
        .env("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        .env("NVSHMEM_DISABLE_NVLS", "1")
        .env_remove("OXCCL_PERF_RANK")
        .stdin(Stdio::null());
    let out = run_for(c, 300);
    assert_clean(&out, 4);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("# library: libnccl.so.2 2."), "{stdout}");
    assert!(stdout.contains("#  Rank  1 Group  0 Pid"), "{stdout}");
}

/// `--hosts 2`: the two GPU ranks as two pretend hosts, so device buffers go
/// through oxccl's network proxies (NCCL_DEBUG names the edge NET/Socket):
/// every collective stays right.
#[test]
#[ignore = "needs 2 GPUs: two pretend hosts take the network path"]
fn two_pretend_hosts_take_the_network_path() {
    require_gpus("two_pretend_hosts_take_the_network_path", 2);
    for coll in ["all_reduce", "all_gather", "reduce_scatter", "sendrecv"] {
        let mut c = perf(&[
            coll, "--ranks", "2", "--hosts", "2", "-b", "8", "-e", "4M", "-f", "64", "-n", "3",
            "-w", "2",
        ]);
        c.env("NCCL_DEBUG", "INFO").env("NCCL_DEBUG_SUBSYS", "INIT");
        let out = run_for(c, 300);
        assert_clean(&out, 3);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("2 pretend hosts (NCCL_HOSTID)"), "{stdout}");
        assert!(stdout.contains("via NET/Socket/0"), "{coll}: {stdout}");
    }
}
