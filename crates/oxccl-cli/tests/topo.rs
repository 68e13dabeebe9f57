//! `oxccl topo` and the doctor's GPU checks against recorded machines
//! (`tests/fixtures/*`, see its README): the 2×H200 NV18 test machine, an
//! 8-GPU NVSwitch machine, a PCIe-only machine whose ACS blocks P2P, a
//! container with 64 MiB of /dev/shm and a machine with two NCCL versions.
//! Every ✘ of these checks is proved here.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_oxccl");

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args).stdin(Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("NCCL_")
            || k.starts_with("OXCCL_")
            || matches!(
                k.as_str(),
                "LD_LIBRARY_PATH" | "LD_PRELOAD" | "CONDA_PREFIX" | "VIRTUAL_ENV"
            )
        {
            c.env_remove(k);
        }
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run oxccl")
}

fn out(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn doctor_json(fx: &str, extra: &[&str], env: &[(&str, &str)]) -> (Output, serde_json::Value) {
    let f = fixture(fx);
    let mut args = vec!["doctor", "--sysroot", f.as_str(), "--json"];
    args.extend_from_slice(extra);
    let o = run(&args, env);
    let v = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("bad JSON ({e}):\n{}", out(&o)));
    (o, v)
}

fn check<'a>(v: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    let c: Vec<_> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["id"] == id)
        .collect();
    assert_eq!(c.len(), 1, "one check {id} in {v:#}");
    c[0]
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("oxccl-topo-{name}-{}", std::process::id()))
}

#[test]
fn h200_pair_is_nv18() {
    let o = run(&["topo", "--sysroot", &fixture("h200x2")], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(
        t.contains("GPU0 0000:00:06.0 NVIDIA H200 (sm_90), 32.0 GT/s x16"),
        "{t}"
    );
    assert!(t.contains("NVLink ×18 → NVSwitch (not visible"), "{t}");
    assert!(t.contains("GPU0   X      NV18"), "{t}");
    assert!(t.contains("NIC0 eth0"), "{t}");
    assert!(t.contains("2 of 2 hops on NVLink"), "{t}");
    assert!(t.contains("GPU ring: 32 channels"), "{t}");
    let (o, v) = doctor_json("h200x2", &[], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert_eq!(check(&v, "gpu.topology")["status"], "ok");
    let nv = check(&v, "gpu.nvlink");
    assert_eq!(nv["status"], "ok");
    assert!(
        nv["detail"].as_str().unwrap().contains("18 NVLinks"),
        "{nv:#}"
    );
    assert!(
        nv["detail"].as_str().unwrap().contains("≥ 301 GB/s"),
        "{nv:#}"
    );
}

#[test]
fn nvswitch_machine_every_pair_nv18() {
    let o = run(&["topo", "--sysroot", &fixture("dgx8")], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    let row = t.lines().find(|l| l.starts_with("GPU3 ")).unwrap();
    assert_eq!(row.matches("NV18").count(), 7, "{t}");
    assert!(t.contains("NUMA node 1 (CPUs 56-111,168-223)"), "{t}");
    assert!(t.contains("NIC7 mlx5_7 port 1, 400 Gb/s"), "{t}");
    assert!(t.contains("8 of 8 hops on NVLink"), "{t}");
    assert!(t.contains("GPU ring: 32 channels"), "{t}");
    let (_, v) = doctor_json("dgx8", &[], &[]);
    assert_eq!(check(&v, "gpu.nvlink")["status"], "ok");
    assert!(check(&v, "gpu.numa")["detail"]
        .as_str()
        .unwrap()
        .contains("GPU4→node 1"));
    // NCCL_P2P_DISABLE on it is risky (NVSwitch named).
    let (_, v) = doctor_json("dgx8", &[], &[("NCCL_P2P_DISABLE", "1")]);
    assert!(check(&v, "env.risky.P2P_DISABLE")["detail"]
        .as_str()
        .unwrap()
        .contains("NVSwitch"));
}

#[test]
fn pcie_switch_with_acs_fails_with_setpci_fix() {
    let o = run(&["topo", "--sysroot", &fixture("pcie_acs")], &[]);
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(
        t.contains("[ACS on]") && t.contains("IOMMU group 10"),
        "{t}"
    );
    assert!(t.contains("GPU0   X      PIX    NODE"), "{t}");
    assert!(t.contains("GPU ring: 5 channels"), "{t}");
    assert!(t.contains("CNS"), "{t}");
    let (o, v) = doctor_json("pcie_acs", &[], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    let c = check(&v, "gpu.p2p.0-1");
    assert_eq!(c["status"], "fail", "{c:#}");
    let d = c["detail"].as_str().unwrap();
    assert!(
        d.contains("behind PCIe bridge 0000:11:00.0") && d.contains("ACS is on at 0000:12:08.0"),
        "{d}"
    );
    assert!(
        d.contains("IOMMU groups 10 and 11") && d.contains("iommu=pt"),
        "{d}"
    );
    let fix = c["fix"].as_str().unwrap();
    assert!(
        fix.contains("setpci -s 0000:12:08.0 ECAP_ACS+6.w=0000")
            && fix.contains("NCCL_P2P_DISABLE=1"),
        "{fix}"
    );
    // The other switch (ACS off) is fine.
    assert!(v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["id"] != "gpu.p2p.2-3"));
}

#[test]
fn container_64mb_and_two_nccl_fixtures() {
    let (o, v) = doctor_json("container64", &[], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    let c = check(&v, "shm.size");
    assert_eq!(c["status"], "fail");
    assert!(c["detail"].as_str().unwrap().contains("8 ranks"), "{c:#}");
    assert!(c["fix"].as_str().unwrap().contains("--shm-size="));
    assert_eq!(check(&v, "gpu.topology")["status"], "skip");
    let (o, v) = doctor_json("two_nccl", &[], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let c = check(&v, "nccl.versions");
    assert_eq!(c["status"], "warn");
    let d = c["detail"].as_str().unwrap();
    assert!(d.contains("2.21.5") && d.contains("2.28.9"), "{d}");
}

#[test]
fn dump_and_read_back_and_bad_files() {
    let f = tmp("dump.xml");
    let o = run(
        &[
            "topo",
            "--sysroot",
            &fixture("dgx8"),
            "--dump",
            f.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let xml = std::fs::read_to_string(&f).unwrap();
    assert!(xml.starts_with("<system version=\"1\">"), "{xml}");
    assert!(xml.contains("<nvlink target=\"0000:05:00.0\" count=\"5\" tclass=\"0x068000\"/>"));
    assert!(xml.contains("<net name=\"mlx5_0\" dev=\"0\" speed=\"400000\" port=\"1\"/>"));
    // Read back with --file and with NCCL_TOPO_FILE: the same matrix.
    let a = run(&["topo", "--sysroot", &fixture("dgx8")], &[]);
    let b = run(&["topo", "--file", f.to_str().unwrap()], &[]);
    let c = run(&["topo"], &[("NCCL_TOPO_FILE", f.to_str().unwrap())]);
    let matrix = |o: &Output| {
        let t = String::from_utf8_lossy(&o.stdout).to_string();
        t[t.find("\nMatrix").unwrap()..].to_string()
    };
    assert_eq!(matrix(&a), matrix(&b));
    assert_eq!(matrix(&b), matrix(&c));
    // '-' dumps to stdout only.
    let o = run(&["topo", "--file", f.to_str().unwrap(), "--dump", "-"], &[]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), xml);

    // A broken file: exit 1 naming the line; the doctor fails with the same words.
    std::fs::write(&f, "<system version=\"1\">\n  <cpu numaid=\"0\">\n    <pci busid=\"nope\"/>\n  </cpu>\n</system>\n").unwrap();
    let o = run(&["topo", "--file", f.to_str().unwrap()], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("line 3: <pci>: busid=\"nope\" is not a PCI bus id"),
        "{e}"
    );
    let (o, v) = doctor_json("h200x2", &[], &[("NCCL_TOPO_FILE", f.to_str().unwrap())]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    let c = check(&v, "gpu.topology");
    assert_eq!(c["status"], "fail");
    assert!(c["detail"].as_str().unwrap().contains("line 3"), "{c:#}");
    assert!(c["fix"].as_str().unwrap().contains("NCCL_TOPO_FILE"));
    let o = run(&["topo", "--file", "/nonexistent/topo.xml"], &[]);
    assert_eq!(o.status.code(), Some(1));
    let o = run(&["topo", "--sysroot", "/nonexistent/root"], &[]);
    assert_eq!(o.status.code(), Some(2));
    let _ = std::fs::remove_file(&f);
}

#[test]
fn nvlinks_down_warn_and_bad_recorded_xml() {
    // Copy the H200 fixture with 12 of GPU1's 18 links recorded.
    let root = tmp("linksdown");
    let _ = std::fs::remove_dir_all(&root);
    let st = Command::new("cp")
        .args(["-r", &fixture("h200x2")])
        .arg(&root)
        .status()
        .unwrap();
    assert!(st.success());
    let x = std::fs::read_to_string(root.join("topo.xml")).unwrap();
    let x = x.replacen("count=\"18\"", "count=\"12\"", 1);
    std::fs::write(root.join("topo.xml"), &x).unwrap();
    let o = run(
        &["doctor", "--sysroot", root.to_str().unwrap(), "--json"],
        &[],
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let c = check(&v, "gpu.nvlink");
    assert_eq!(c["status"], "warn", "{c:#}");
    assert!(c["fix"].as_str().unwrap().contains("nvidia-smi nvlink -s"));
    // A recorded file that does not parse: NVLink unknown, said so, no crash.
    std::fs::write(root.join("topo.xml"), "<system>").unwrap();
    let o = run(
        &["doctor", "--sysroot", root.to_str().unwrap(), "--json"],
        &[],
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(check(&v, "gpu.nvml")["status"], "skip");
    assert!(check(&v, "gpu.nvml")["detail"]
        .as_str()
        .unwrap()
        .contains("never closed"));
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn real_machine_topo_and_bench() {
    let o = run(&["topo"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(
        t.contains("Tree") && (t.contains("NVML") || t.contains("NVLink")),
        "{t}"
    );
    let o = run(&["doctor", "--json", "--bench"], &[]);
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}\n{}", out(&o)));
    // With two usable GPUs the bench runs on them (bench.gpu), else on CPU ranks.
    let has = |id: &str| {
        v["checks"]
            .as_array()
            .is_some_and(|a| a.iter().any(|c| c["id"] == id))
    };
    let b = check(
        &v,
        if has("bench.gpu") {
            "bench.gpu"
        } else {
            "bench.cpu"
        },
    );
    assert!(b["status"] == "ok" || b["status"] == "warn", "{b:#}");
    assert!(b["detail"].as_str().unwrap().contains("correct"), "{b:#}");
}
