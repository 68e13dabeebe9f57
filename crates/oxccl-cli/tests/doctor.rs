//! End-to-end tests of `oxccl doctor`: each check run against small machine
//! trees built here under a temp dir and passed as `--sysroot` (a CPU-only
//! machine, a container with 64 MiB of /dev/shm, a machine with two NCCL
//! versions), the ✘ paths proved, `--json` parsed, exit statuses checked, and
//! the real machine run once without crashing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_oxccl");

/// Runs `oxccl doctor ARGS` with a clean NCCL environment plus `env`.
fn doctor(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(BIN);
    c.arg("doctor").args(args).stdin(Stdio::null());
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
    c.output().expect("run oxccl doctor")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("bad JSON ({e}):\n{}", text(o)))
}

/// The checks of a JSON report whose id starts with `prefix`.
fn checks<'a>(v: &'a serde_json::Value, prefix: &str) -> Vec<&'a serde_json::Value> {
    v["checks"]
        .as_array()
        .expect("checks array")
        .iter()
        .filter(|c| c["id"].as_str().unwrap_or("").starts_with(prefix))
        .collect()
}

/// The one check whose id is `id`.
fn one<'a>(v: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    let c: Vec<_> = checks(v, id)
        .into_iter()
        .filter(|c| c["id"] == id)
        .collect();
    assert_eq!(c.len(), 1, "one check {id} in {v:#}");
    c[0]
}

fn write(root: &Path, p: &str, content: &str) {
    let f = root.join(p.trim_start_matches('/'));
    std::fs::create_dir_all(f.parent().unwrap()).unwrap();
    std::fs::write(f, content).unwrap();
}

fn symlink(root: &Path, link: &str, target: &str) {
    let l = root.join(link.trim_start_matches('/'));
    std::fs::create_dir_all(l.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(&l);
    std::os::unix::fs::symlink(target, l).unwrap();
}

/// A machine tree under the temp dir, removed when dropped.
struct Root(PathBuf);

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::ops::Deref for Root {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

/// A CPU-only machine: lo and eth0, 2 CPUs, 16 GiB of /dev/shm, unlimited memlock.
fn cpu_machine(tag: &str) -> Root {
    let root = std::env::temp_dir().join(format!("oxccl-doctor-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for (name, state, mtu, mac, ip) in [
        (
            "lo",
            "unknown",
            "65536",
            "00:00:00:00:00:00",
            "127.0.0.1\n::1\n",
        ),
        ("eth0", "up", "1500", "02:42:ac:11:00:02", "10.1.2.3\n"),
    ] {
        write(
            &root,
            &format!("/sys/class/net/{name}/operstate"),
            &format!("{state}\n"),
        );
        write(
            &root,
            &format!("/sys/class/net/{name}/mtu"),
            &format!("{mtu}\n"),
        );
        write(
            &root,
            &format!("/sys/class/net/{name}/address"),
            &format!("{mac}\n"),
        );
        write(&root, &format!("/sys/class/net/{name}/ip"), ip);
    }
    write(
        &root,
        "/proc/self/limits",
        "Limit                     Soft Limit           Hard Limit           Units\n\
         Max open files            1048576              1048576              files\n\
         Max locked memory         unlimited            unlimited            bytes\n",
    );
    write(&root, "/proc/cpuinfo", "processor\t: 0\n\nprocessor\t: 1\n");
    write(&root, "/proc/1/cgroup", "0::/init.scope\n");
    write(
        &root,
        "/dev/shm.statvfs",
        "total 17179869184\nfree 17179869184\n",
    );
    std::fs::create_dir_all(root.join("sys/class/infiniband")).unwrap();
    Root(root)
}

fn root_arg(root: &Path) -> String {
    root.display().to_string()
}

#[test]
fn clean_cpu_machine_passes() {
    let root = cpu_machine("clean");
    let o = doctor(&["--sysroot", &root_arg(&root), "--json"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    assert_eq!(v["exit"], 0);
    assert_eq!(v["summary"]["fail"], 0);
    assert_eq!(one(&v, "shm.size")["status"], "ok", "{v:#}");
    assert_eq!(one(&v, "limits.memlock")["status"], "ok");
    assert_eq!(one(&v, "net.ifname")["status"], "ok");
    assert!(one(&v, "net.ifname")["detail"]
        .as_str()
        .unwrap()
        .contains("eth0 10.1.2.3"));
    assert_eq!(one(&v, "driver")["status"], "skip");
    assert_eq!(one(&v, "nccl.libs")["status"], "skip");
    // The formula is stated: 2 ranks (CPUs from /proc/cpuinfo) × 1 peer × 3 channels.
    let shm = one(&v, "shm.size")["detail"].as_str().unwrap();
    assert!(shm.contains("2 ranks × 1 peers × 3 channels"), "{shm}");

    // Human output: symbols and a summary line.
    let o = doctor(&["--sysroot", &root_arg(&root)], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(
        t.contains("✔") && t.contains("–") && t.contains("0 failed"),
        "{t}"
    );
}

#[test]
fn container_with_64mb_shm_fails_with_shm_size_fix() {
    let root = cpu_machine("container");
    write(&root, "/.dockerenv", "");
    write(&root, "/dev/shm.statvfs", "total 67108864\nfree 67108864\n");
    let o = doctor(
        &["--sysroot", &root_arg(&root), "--json", "--ranks", "8"],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v = json(&o);
    let c = one(&v, "shm.size");
    assert_eq!(c["status"], "fail", "{c:#}");
    assert!(c["detail"].as_str().unwrap().contains("64.0 MiB"), "{c:#}");
    let fix = c["fix"].as_str().unwrap();
    assert!(
        fix.contains("--shm-size=") && fix.contains("--ipc=host"),
        "{fix}"
    );
    assert!(one(&v, "container")["detail"]
        .as_str()
        .unwrap()
        .contains("docker"));

    // Human output carries the ✘ and the fix.
    let o = doctor(&["--sysroot", &root_arg(&root), "--ranks", "8"], &[]);
    assert_eq!(o.status.code(), Some(1));
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(t.contains("✘ /dev/shm is too small for 8 ranks"), "{t}");
    assert!(
        t.contains("fix: start the container with `docker run --shm-size="),
        "{t}"
    );

    // Two host ranks fit in 64 MiB, but the container default still warns.
    let o = doctor(
        &["--sysroot", &root_arg(&root), "--json", "--ranks", "2"],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    let c = one(&v, "shm.size");
    assert_eq!(c["status"], "warn", "{c:#}");
    assert!(c["fix"].as_str().unwrap().contains("--shm-size="));
}

#[test]
fn two_nccl_versions_warn_naming_both() {
    let root = cpu_machine("nccl2");
    write(
        &root,
        "/etc/ld.so.conf",
        "include /etc/ld.so.conf.d/*.conf\n",
    );
    write(
        &root,
        "/etc/ld.so.conf.d/x86_64-linux-gnu.conf",
        "# multiarch\n/usr/lib/x86_64-linux-gnu\n",
    );
    write(&root, "/usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5", "fake");
    symlink(
        &root,
        "/usr/lib/x86_64-linux-gnu/libnccl.so.2",
        "libnccl.so.2.21.5",
    );
    let pip = "/usr/local/lib/python3.10/dist-packages/nvidia/nccl/lib";
    write(&root, &format!("{pip}/libnccl.so.2.28.9"), "fake");
    symlink(&root, &format!("{pip}/libnccl.so.2"), "libnccl.so.2.28.9");
    let o = doctor(&["--sysroot", &root_arg(&root), "--json"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    let c = one(&v, "nccl.versions");
    assert_eq!(c["status"], "warn", "{c:#}");
    let d = c["detail"].as_str().unwrap();
    assert!(d.contains("2.21.5") && d.contains("2.28.9"), "{d}");
    // The loader-cache copy is the one a program would load.
    assert!(
        d.contains("would load /usr/lib/x86_64-linux-gnu/libnccl.so.2"),
        "{d}"
    );
    assert!(
        d.contains("libnccl.so.2 -> /usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5"),
        "symlink targets are shown as machine paths: {d}"
    );
    assert!(c["fix"].as_str().unwrap().contains("LD_LIBRARY_PATH"));

    // LD_LIBRARY_PATH pointing at pip's folder changes which one loads.
    let o = doctor(
        &["--sysroot", &root_arg(&root), "--json"],
        &[("LD_LIBRARY_PATH", pip)],
    );
    let v = json(&o);
    let d = one(&v, "nccl.versions")["detail"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(d.contains(&format!("would load {pip}/libnccl.so.2")), "{d}");
    assert!(d.contains("LD_LIBRARY_PATH"), "{d}");
}

#[test]
fn env_typo_warns_with_nearest_name() {
    let root = cpu_machine("typo");
    let o = doctor(
        &["--sysroot", &root_arg(&root), "--json"],
        &[("NCCL_SOCKET_IFNAM", "eth0")],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    let c = one(&v, "env.NCCL_SOCKET_IFNAM");
    assert_eq!(c["status"], "warn");
    assert!(
        c["detail"]
            .as_str()
            .unwrap()
            .contains("did you mean NCCL_SOCKET_IFNAME?"),
        "{c:#}"
    );
    assert!(c["fix"]
        .as_str()
        .unwrap()
        .contains("NCCL_SOCKET_IFNAME=eth0"));
}

#[test]
fn bad_algo_value_fix_names_the_nearest_algorithm() {
    let root = cpu_machine("badalgo");
    let o = doctor(
        &["--sysroot", &root_arg(&root), "--json"],
        &[("NCCL_ALGO", "rign")],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v = json(&o);
    let c = one(&v, "env.NCCL_ALGO");
    assert_eq!(c["status"], "fail");
    let fix = c["fix"].as_str().unwrap();
    assert!(fix.starts_with("set NCCL_ALGO=Ring (or unset it"), "{c:#}");
    let detail = c["detail"].as_str().unwrap();
    assert!(detail.contains("did you mean NCCL_ALGO=Ring?"), "{c:#}");
    assert!(detail.contains("Tree, Ring, CollnetDirect"), "{c:#}");
}

#[test]
fn malformed_and_risky_values() {
    let root = cpu_machine("malformed");
    let o = doctor(
        &["--sysroot", &root_arg(&root), "--json"],
        &[("NCCL_BUFFSIZE", "lots"), ("NCCL_IB_DISABLE", "0")],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v = json(&o);
    let c = one(&v, "env.NCCL_BUFFSIZE");
    assert_eq!(c["status"], "fail");
    assert!(c["detail"].as_str().unwrap().contains("malformed"), "{c:#}");
    assert!(c["fix"].is_string());
    assert_eq!(one(&v, "env.risky.IB_DISABLE")["status"], "warn");
}

#[test]
fn socket_ifname_matching_nothing_fails_listing_interfaces() {
    let root = cpu_machine("ifname");
    let o = doctor(
        &["--sysroot", &root_arg(&root), "--json"],
        &[("NCCL_SOCKET_IFNAME", "nosuch")],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v = json(&o);
    let c = one(&v, "net.ifname");
    assert_eq!(c["status"], "fail");
    let d = c["detail"].as_str().unwrap();
    assert!(
        d.contains("NCCL_SOCKET_IFNAME=nosuch") && d.contains("eth0 10.1.2.3") && d.contains("lo"),
        "{d}"
    );
    assert!(c["fix"].as_str().unwrap().contains("eth0"));

    // A prefix that matches selects it.
    let o = doctor(
        &["--sysroot", &root_arg(&root), "--json"],
        &[("NCCL_SOCKET_IFNAME", "eth")],
    );
    assert_eq!(one(&json(&o), "net.ifname")["status"], "ok");
}

/// With OXCCL_BOOTSTRAP_IFNAME the report names each choice: data on one
/// interface, the bootstrap on the other, and a bootstrap setting that
/// matches nothing fails under its own name.
#[test]
fn bootstrap_ifname_is_reported_beside_the_data_interface() {
    let root = cpu_machine("bootifname");
    let o = doctor(
        &["--sysroot", &root_arg(&root), "--json"],
        &[
            ("NCCL_SOCKET_IFNAME", "eth"),
            ("OXCCL_BOOTSTRAP_IFNAME", "lo"),
        ],
    );
    let v = json(&o);
    let d = one(&v, "net.ifname");
    assert_eq!(d["status"], "ok", "{d:#}");
    assert!(
        d["detail"]
            .as_str()
            .unwrap()
            .starts_with("TCP data connections would use eth0 10.1.2.3"),
        "{d:#}"
    );
    let b = one(&v, "net.bootstrap_ifname");
    assert_eq!(b["status"], "warn", "{b:#}");
    let bd = b["detail"].as_str().unwrap();
    assert!(
        bd.starts_with("the bootstrap would use lo 127.0.0.1"),
        "{bd}"
    );
    assert!(bd.contains("matches OXCCL_BOOTSTRAP_IFNAME=lo"), "{bd}");

    let o = doctor(
        &["--sysroot", &root_arg(&root), "--json"],
        &[("OXCCL_BOOTSTRAP_IFNAME", "nosuch")],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v = json(&o);
    let b = one(&v, "net.bootstrap_ifname");
    assert_eq!(b["status"], "fail");
    assert!(b["detail"]
        .as_str()
        .unwrap()
        .contains("OXCCL_BOOTSTRAP_IFNAME=nosuch"));
    assert!(b["fix"]
        .as_str()
        .unwrap()
        .contains("set OXCCL_BOOTSTRAP_IFNAME to one of"));
    assert_eq!(one(&v, "net.ifname")["status"], "ok");
}

#[test]
fn only_loopback_warns_for_multi_node() {
    let root = cpu_machine("loopback");
    write(&root, "/sys/class/net/eth0/operstate", "down\n");
    let o = doctor(&["--sysroot", &root_arg(&root), "--json"], &[]);
    let v = json(&o);
    let c = one(&v, "net.ifname");
    assert_eq!(c["status"], "warn", "{c:#}");
    assert!(c["detail"].as_str().unwrap().contains("lo 127.0.0.1"));
}

#[test]
fn unreachable_peer_fails_quickly() {
    let root = cpu_machine("peer");
    let t0 = Instant::now();
    let o = doctor(
        &[
            "--sysroot",
            &root_arg(&root),
            "--json",
            "--peers",
            "127.0.0.1:1",
        ],
        &[],
    );
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v = json(&o);
    let c = one(&v, "peers.127.0.0.1:1");
    assert_eq!(c["status"], "fail");
    assert!(c["fix"].as_str().unwrap().contains("firewall"));

    // A listening peer answers, with an RTT.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let peer = format!("127.0.0.1:{port}");
    let o = doctor(
        &["--sysroot", &root_arg(&root), "--json", "--peers", &peer],
        &[],
    );
    let v = json(&o);
    let c = one(&v, &format!("peers.{peer}"));
    // It accepts, but no `oxccl doctor --listen` answers: the way back is unknown.
    assert_eq!(c["status"], "warn", "{c:#}");
    assert!(c["detail"].as_str().unwrap().contains(" ms"));
}

#[test]
fn bad_flags_and_unreadable_files() {
    let o = doctor(&["--bogus"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = doctor(&["--sysroot", "/nonexistent/oxccl-doctor"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = doctor(&["--ranks", "0"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));

    // Files that cannot be read (a folder where a file should be), garbage,
    // and an empty root: every check reports what it could not find.
    let root = cpu_machine("unreadable");
    std::fs::remove_file(root.join("proc/self/limits")).unwrap();
    std::fs::create_dir_all(root.join("proc/self/limits")).unwrap();
    write(&root, "/dev/shm.statvfs", "garbage\n");
    write(&root, "/sys/class/net/eth0/mtu", "\u{1}\u{2}");
    let o = doctor(&["--sysroot", &root_arg(&root), "--json"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    assert_eq!(one(&v, "limits.memlock")["status"], "skip");
    assert_eq!(one(&v, "shm.size")["status"], "skip");

    let empty =
        Root(std::env::temp_dir().join(format!("oxccl-doctor-empty-{}", std::process::id())));
    std::fs::create_dir_all(&*empty).unwrap();
    let o = doctor(&["--sysroot", &root_arg(&empty)], &[]);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
}

/// A real library planted in the fixture: one whose load hangs is killed after
/// the timeout and reported; one that answers is asked its version. Needs `cc`.
/// Folders holding both `libnccl.so` and `libnccl.so.2` (one a symlink to
/// the other) are reported under `libnccl.so.2`, the name the loader looks
/// for: `cargo xtask install`'s layout (and NCCL's packages') and `cargo
/// xtask build`'s.
#[test]
fn link_time_name_beside_the_soname_is_the_soname() {
    let root = cpu_machine("soname");
    let install = "/opt/oxccl/lib";
    write(&root, &format!("{install}/libnccl.so.2"), "fake");
    symlink(&root, &format!("{install}/libnccl.so"), "libnccl.so.2");
    let build = "/src/oxccl/target/release";
    write(&root, &format!("{build}/libnccl.so"), "fake");
    symlink(&root, &format!("{build}/libnccl.so.2"), "libnccl.so");
    for dir in [install, build] {
        let o = doctor(
            &["--sysroot", &root_arg(&root), "--json"],
            &[("LD_LIBRARY_PATH", dir)],
        );
        let v = json(&o);
        let d = one(&v, "nccl.versions")["detail"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            d.contains(&format!("would load {dir}/libnccl.so.2 (")),
            "{dir}: {d}"
        );
        assert!(d.starts_with("1 NCCL library file(s)"), "{dir}: {d}");
    }
}

#[test]
fn library_probe_in_child_process() {
    require_cc();
    let root = cpu_machine("probe");
    let src = root.join("nccl.c");
    let lib = "/usr/lib/libnccl.so.2";
    std::fs::create_dir_all(root.join("usr/lib")).unwrap();
    std::fs::write(
        &src,
        "int ncclGetVersion(int *v) { *v = 22809; return 0; }\n",
    )
    .unwrap();
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(root.join(lib.trim_start_matches('/')))
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success());
    let hang_src = root.join("hang.c");
    std::fs::write(
        &hang_src,
        "#include <unistd.h>\n__attribute__((constructor)) static void h(void) { for (;;) sleep(1); }\n\
         int ncclGetVersion(int *v) { *v = 0; return 0; }\n",
    )
    .unwrap();
    let hang = "/usr/lib64/libnccl.so.2";
    std::fs::create_dir_all(root.join("usr/lib64")).unwrap();
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(root.join(hang.trim_start_matches('/')))
        .arg(&hang_src)
        .status()
        .unwrap();
    assert!(st.success());
    let t0 = Instant::now();
    let o = doctor(&["--sysroot", &root_arg(&root), "--json"], &[]);
    assert!(
        t0.elapsed() < Duration::from_secs(9),
        "took {:?}",
        t0.elapsed()
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    let d = one(&v, "nccl.versions")["detail"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(d.contains("2.28.9 (ncclGetVersion)"), "{d}");
    assert!(d.contains("did not finish within 5 s"), "{d}");
}

/// A GPU + InfiniBand machine as files: two GPUs, an NVSwitch, mlx5_0, a
/// 64 KiB memlock limit. Risky settings warn; the driver is not probed.
#[test]
fn gpu_ib_machine_risky_settings() {
    let root = cpu_machine("gpuib");
    for g in ["0000:01:00.0", "0000:02:00.0"] {
        write(
            &root,
            &format!("/proc/driver/nvidia/gpus/{g}/information"),
            "Model: X\n",
        );
    }
    write(&root, "/proc/driver/nvidia/version", "NVRM version: 580\n");
    write(&root, "/dev/nvidia0", "");
    write(&root, "/dev/nvidia-nvswitch0", "");
    write(
        &root,
        "/sys/class/infiniband/mlx5_0/ports/1/state",
        "4: ACTIVE\n",
    );
    write(
        &root,
        "/proc/self/limits",
        "Max locked memory         65536                65536                bytes\n",
    );
    let o = doctor(
        &["--sysroot", &root_arg(&root), "--json"],
        &[("NCCL_P2P_DISABLE", "1"), ("NCCL_IB_DISABLE", "1")],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    let p2p = one(&v, "env.risky.P2P_DISABLE");
    assert_eq!(p2p["status"], "warn");
    assert!(
        p2p["detail"].as_str().unwrap().contains("2 GPUs"),
        "{p2p:#}"
    );
    assert!(
        p2p["detail"].as_str().unwrap().contains("NVSwitch"),
        "{p2p:#}"
    );
    let ib = one(&v, "net.ib");
    assert_eq!(ib["status"], "warn", "{ib:#}");
    assert!(
        ib["detail"]
            .as_str()
            .unwrap()
            .contains("mlx5_0:1 4: ACTIVE"),
        "{ib:#}"
    );
    let ml = one(&v, "limits.memlock");
    assert_eq!(ml["status"], "warn", "{ml:#}");
    assert!(ml["fix"].as_str().unwrap().contains("memlock=-1"));
    let drv = one(&v, "driver");
    assert_eq!(drv["status"], "skip");
    assert!(
        drv["detail"].as_str().unwrap().contains("/dev/nvidia0"),
        "{drv:#}"
    );
}

#[test]
fn real_machine_runs() {
    let t0 = Instant::now();
    let o = doctor(&["--json"], &[]);
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
    let v = json(&o);
    assert_eq!(v["exit"].as_i64(), o.status.code().map(i64::from));
    for c in v["checks"].as_array().unwrap() {
        if c["status"] == "fail" {
            assert!(c["fix"].is_string(), "every ✘ has a fix: {c:#}");
        }
    }
}

/// Compiles C `src` with `cc ARGS` into `out` (under the root); false without a compiler.
fn cc(root: &Path, out: &str, src: &str, args: &[&str]) {
    require_cc();
    let o = root.join(out.trim_start_matches('/'));
    std::fs::create_dir_all(o.parent().unwrap()).unwrap();
    let c = root.join(format!("src-{}.c", out.replace('/', "_")));
    std::fs::write(&c, src).unwrap();
    // Libraries after the source, as the linker wants them.
    let st = Command::new("cc")
        .arg("-o")
        .arg(&o)
        .arg(&c)
        .args(args)
        .output()
        .unwrap();
    assert!(st.status.success(), "cc {args:?}: {}", text(&st));
}

/// Panics without a C compiler (`cc`): CI installs one (.ci/run).
fn require_cc() {
    let cc = Command::new("cc").arg("--version").output();
    assert!(
        cc.is_ok_and(|o| o.status.success()),
        "needs a C compiler (`cc`) to build the test's libraries"
    );
}

/// A libnccl.so.2 (SONAME libnccl.so.2) answering `code` from ncclGetVersion.
fn nccl_lib(root: &Path, out: &str, code: u32) {
    cc(
        root,
        out,
        &format!("int ncclGetVersion(int *v) {{ *v = {code}; return 0; }}\n"),
        &["-shared", "-fPIC", "-Wl,-soname,libnccl.so.2"],
    );
}

/// A program that needs libnccl.so.2, linked against `lib` (under the root), with `flags`.
fn nccl_program(root: &Path, out: &str, lib: &str, flags: &[&str]) {
    let libdir = root.join(lib.trim_start_matches('/'));
    let l = format!("-L{}", libdir.parent().unwrap().display());
    let mut args = vec![l.as_str(), "-l:libnccl.so.2"];
    args.extend_from_slice(flags);
    cc(
        root,
        out,
        "int ncclGetVersion(int *v);\nint main(void) { int v = 0; return ncclGetVersion(&v); }\n",
        &args,
    );
}

/// A loader cache in the `glibc-ld.so.cache1.1` layout: (name, path) entries for x86-64.
fn ld_cache(entries: &[(&str, &str)]) -> Vec<u8> {
    let base = 48 + 24 * entries.len();
    let mut strs = Vec::new();
    let mut recs = Vec::new();
    for (k, v) in entries {
        let ko = (base + strs.len()) as u32;
        strs.extend_from_slice(k.as_bytes());
        strs.push(0);
        let vo = (base + strs.len()) as u32;
        strs.extend_from_slice(v.as_bytes());
        strs.push(0);
        recs.extend(0x0303u32.to_le_bytes());
        recs.extend(ko.to_le_bytes());
        recs.extend(vo.to_le_bytes());
        recs.extend([0u8; 12]);
    }
    let mut f = b"glibc-ld.so.cache1.1".to_vec();
    f.extend((entries.len() as u32).to_le_bytes());
    f.extend((strs.len() as u32).to_le_bytes());
    f.push(2);
    f.resize(48, 0);
    f.extend(recs);
    f.extend(strs);
    f
}

/// Which libnccl.so.2 a program loads, and why: DT_RPATH beats LD_LIBRARY_PATH
/// (⚠, LD_PRELOAD suggested), LD_LIBRARY_PATH beats DT_RUNPATH, LD_PRELOAD
/// beats both, the loader cache, and ✘ when none is found. Real files built
/// with `cc` in a fixture root; the loader's rules come from the files.
#[test]
fn program_loader_rules() {
    let root = cpu_machine("program");
    nccl_lib(&root, "/opt/app/lib/libnccl.so.2", 22809);
    nccl_lib(&root, "/opt/pip/libnccl.so.2", 22105);
    let lib = "/opt/app/lib/libnccl.so.2";
    let old = ["-Wl,--disable-new-dtags", "-Wl,-rpath,$ORIGIN/../lib"];
    let new = ["-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN/../lib"];
    nccl_program(&root, "/opt/app/bin/train_rpath", lib, &old);
    nccl_program(&root, "/opt/app/bin/train_runpath", lib, &new);
    nccl_program(&root, "/opt/app/bin/train_plain", lib, &[]);
    let r = root_arg(&root);
    let run = |prog: &str, env: &[(&str, &str)]| -> (Output, serde_json::Value) {
        let o = doctor(&["--sysroot", &r, "--json", "--program", prog], env);
        let v = json(&o);
        (o, v)
    };

    // DT_RPATH beats LD_LIBRARY_PATH: ⚠ naming the unused copy, LD_PRELOAD as the fix.
    let (o, v) = run(
        "/opt/app/bin/train_rpath",
        &[("LD_LIBRARY_PATH", "/opt/pip")],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let c = one(&v, "nccl.program");
    assert_eq!(c["status"], "warn", "{c:#}");
    let d = c["detail"].as_str().unwrap();
    assert!(
        d.contains("the loader takes /opt/app/lib/libnccl.so.2, version 2.28.9 (ncclGetVersion)"),
        "{d}"
    );
    assert!(
        d.contains("DT_RPATH of /opt/app/bin/train_rpath entry $ORIGIN/../lib"),
        "{d}"
    );
    assert!(
        d.contains("LD_LIBRARY_PATH's /opt/pip/libnccl.so.2 is not used"),
        "{d}"
    );
    assert!(c["fix"]
        .as_str()
        .unwrap()
        .contains("LD_PRELOAD=/opt/pip/libnccl.so.2"));

    // The same path as DT_RUNPATH: LD_LIBRARY_PATH wins.
    let (_, v) = run(
        "/opt/app/bin/train_runpath",
        &[("LD_LIBRARY_PATH", "/opt/pip")],
    );
    let c = one(&v, "nccl.program");
    assert_eq!(c["status"], "ok", "{c:#}");
    let d = c["detail"].as_str().unwrap();
    assert!(
        d.contains("takes /opt/pip/libnccl.so.2, version 2.21.5")
            && d.contains("LD_LIBRARY_PATH entry /opt/pip"),
        "{d}"
    );
    assert!(d.contains("DT_RUNPATH of /opt/app/bin/train_runpath: $ORIGIN/../lib → /opt/app/lib/libnccl.so.2 (there too, not loaded)"), "{d}");

    // LD_PRELOAD beats DT_RPATH.
    let (_, v) = run(
        "/opt/app/bin/train_rpath",
        &[
            ("LD_PRELOAD", "/opt/pip/libnccl.so.2"),
            ("LD_LIBRARY_PATH", "/opt/pip"),
        ],
    );
    let c = one(&v, "nccl.program");
    assert_eq!(c["status"], "ok", "{c:#}");
    assert!(
        c["detail"]
            .as_str()
            .unwrap()
            .contains("takes /opt/pip/libnccl.so.2, version 2.21.5 (ncclGetVersion): LD_PRELOAD"),
        "{c:#}"
    );

    // Nothing on any path: ✘, the program would not start.
    let (o, v) = run("/opt/app/bin/train_plain", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let c = one(&v, "nccl.program");
    assert_eq!(c["status"], "fail", "{c:#}");
    assert!(
        c["detail"].as_str().unwrap().contains("would not start"),
        "{c:#}"
    );
    assert!(c["fix"].as_str().unwrap().contains("LD_LIBRARY_PATH"));

    // The loader cache (/etc/ld.so.cache, read from the file) finds it.
    let cache = ld_cache(&[("libnccl.so.2", "/opt/app/lib/libnccl.so.2")]);
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(root.join("etc/ld.so.cache"), cache).unwrap();
    let (o, v) = run("/opt/app/bin/train_plain", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let c = one(&v, "nccl.program");
    assert_eq!(c["status"], "ok", "{c:#}");
    assert!(
        c["detail"].as_str().unwrap().contains(
            "takes /opt/app/lib/libnccl.so.2, version 2.28.9 (ncclGetVersion): the loader cache"
        ),
        "{c:#}"
    );
    // The NCCL libraries list reads the same cache.
    assert!(one(&v, "nccl.versions")["detail"]
        .as_str()
        .unwrap()
        .contains("[loader cache (/etc/ld.so.cache)]"));

    // A --program that is not an ELF program: ✘ with a fix.
    write(&root, "/opt/app/bin/script", "#!/bin/sh\n");
    for p in ["/opt/app/bin/script", "/opt/app/bin/nosuch"] {
        let (o, v) = run(p, &[]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        let c = one(&v, "nccl.program");
        assert_eq!(c["status"], "fail", "{c:#}");
        assert!(c["fix"].is_string());
    }
}

/// Without --program, PyTorch's libtorch_cuda.so (pip's layout) is the program:
/// its DT_RPATH to pip's nvidia/nccl/lib decides, as in the real wheels.
#[test]
fn torch_library_is_the_default_program() {
    let root = cpu_machine("torchprog");
    let sp = "/usr/local/lib/python3.12/site-packages";
    let nccl = format!("{sp}/nvidia/nccl/lib/libnccl.so.2");
    nccl_lib(&root, &nccl, 22809);
    let l = format!("-L{}", root.join(&nccl[1..]).parent().unwrap().display());
    cc(
        &root,
        &format!("{sp}/torch/lib/libtorch_cuda.so"),
        "int ncclGetVersion(int *v);\nint torch_nccl(void) { int v = 0; return ncclGetVersion(&v); }\n",
        &[
            "-shared",
            "-fPIC",
            &l,
            "-l:libnccl.so.2",
            "-Wl,--disable-new-dtags",
            "-Wl,-rpath,$ORIGIN/../../nvidia/nccl/lib:$ORIGIN",
        ],
    );
    let o = doctor(&["--sysroot", &root_arg(&root), "--json"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    let c = one(&v, "nccl.program");
    assert_eq!(c["status"], "ok", "{c:#}");
    let d = c["detail"].as_str().unwrap();
    assert!(d.contains(&format!("{sp}/torch/lib/libtorch_cuda.so needs libnccl.so.2 directly, the loader takes {nccl}, version 2.28.9")), "{d}");
}

/// `--bench` where no GPU is usable (a recorded 2×H200 machine under
/// --sysroot): the CPU bench runs and checks its result; the GPU bench says
/// why it did not run and what the NVLinks should give.
#[test]
fn bench_without_usable_gpus_runs_on_cpu() {
    let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/h200x2");
    let o = doctor(
        &["--sysroot", fx.to_str().unwrap(), "--json", "--bench"],
        &[],
    );
    let v = json(&o);
    let b = one(&v, "bench.cpu");
    assert!(b["status"] == "ok" || b["status"] == "warn", "{b:#}");
    assert!(b["detail"].as_str().unwrap().contains("correct"), "{b:#}");
    let g = one(&v, "bench.gpu");
    assert_eq!(g["status"], "skip", "{g:#}");
    let d = g["detail"].as_str().unwrap();
    assert!(
        d.contains("not run under --sysroot") && d.contains("≥ 301 GB/s"),
        "{d}"
    );
}

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

/// The recorded `cuda_mismatch` machine: driver 535 (CUDA 12.2) with the
/// CUDA 12.8 toolkit's runtime and pip's CUDA 13 runtime: ✘ naming the
/// versions and the driver to upgrade to, ⚠ two majors; then single runtimes
/// in built trees: a newer minor warns, a matching one passes, and a real
/// library built with `cc` is asked its version in a child.
#[test]
fn cuda_runtime_newer_than_driver() {
    let o = doctor(&["--sysroot", &fixture("cuda_mismatch"), "--json"], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v = json(&o);
    let c = one(&v, "cudart");
    assert_eq!(c["status"], "fail", "{c:#}");
    let d = c["detail"].as_str().unwrap();
    assert!(
        d.contains("CUDA runtime 13 (/usr/local/lib/python3.10/dist-packages/nvidia/cu13/lib/libcudart.so.13) is newer than the driver supports (CUDA 12.2)"),
        "{d}"
    );
    assert!(d.contains("kernel module 535.154.05"), "{d}");
    assert!(
        d.contains("libcudart.so.12.8.90: CUDA 12.8.90 (file name)"),
        "{d}"
    );
    let fix = c["fix"].as_str().unwrap();
    assert!(
        fix.contains("≥ 580.65.06") && fix.contains("nvidia-cuda-runtime-cu12==12.2.*"),
        "{fix}"
    );
    let m = one(&v, "cudart.majors");
    assert_eq!(m["status"], "warn", "{m:#}");
    assert!(
        m["detail"].as_str().unwrap().contains("12 (")
            && m["detail"].as_str().unwrap().contains("13 (")
    );

    // One runtime, newer minor than the driver: minor version compatibility (⚠).
    let root = cpu_machine("cudart");
    write(
        &root,
        "/proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.154.05  Release Build\n",
    );
    let tk = "/usr/local/cuda-12.8/targets/x86_64-linux/lib";
    write(&root, &format!("{tk}/libcudart.so.12.8.90"), "fake");
    let o = doctor(&["--sysroot", &root_arg(&root), "--json"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    let c = one(&v, "cudart");
    assert_eq!(c["status"], "warn", "{c:#}");
    assert!(c["detail"]
        .as_str()
        .unwrap()
        .contains("minor version compatibility"));
    assert!(c["fix"].as_str().unwrap().contains("≥ 570.26"), "{c:#}");
    assert!(checks(&v, "cudart.majors").is_empty());

    // A driver new enough (580: CUDA 13.0): ✔.
    write(
        &root,
        "/proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n",
    );
    let v = json(&doctor(&["--sysroot", &root_arg(&root), "--json"], &[]));
    let c = one(&v, "cudart");
    assert_eq!(c["status"], "ok", "{c:#}");
    assert!(
        c["detail"].as_str().unwrap().contains("CUDA ≤ 13.0"),
        "{c:#}"
    );

    // A real library (LD_LIBRARY_PATH) answering cudaRuntimeGetVersion = 13.1:
    // ⚠ against driver 580 (CUDA 13.0: minor version compatibility), ✘ against 535.
    let src = root.join("cudart.c");
    std::fs::write(
        &src,
        "int cudaRuntimeGetVersion(int *v) { *v = 13010; return 0; }\n",
    )
    .unwrap();
    std::fs::create_dir_all(root.join("opt/cu/lib")).unwrap();
    require_cc();
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-Wl,-soname,libcudart.so.13", "-o"])
        .arg(root.join("opt/cu/lib/libcudart.so.13"))
        .arg(&src)
        .status()
        .is_ok_and(|s| s.success());
    assert!(built, "cc could not build the test's libcudart.so.13");
    let llp = [("LD_LIBRARY_PATH", "/opt/cu/lib")];
    let v = json(&doctor(&["--sysroot", &root_arg(&root), "--json"], &llp));
    let c = one(&v, "cudart");
    assert_eq!(c["status"], "warn", "{c:#}");
    assert!(
        c["detail"].as_str().unwrap().contains("/opt/cu/lib/libcudart.so.13: CUDA 13.1 (cudaRuntimeGetVersion) [LD_LIBRARY_PATH]: newer than the driver's CUDA 13.0"),
        "{c:#}"
    );
    write(
        &root,
        "/proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.154.05  Release Build\n",
    );
    let o = doctor(&["--sysroot", &root_arg(&root), "--json"], &llp);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v = json(&o);
    let c = one(&v, "cudart");
    assert_eq!(c["status"], "fail", "{c:#}");
    let d = c["detail"].as_str().unwrap();
    assert!(
        d.contains("/opt/cu/lib/libcudart.so.13: CUDA 13.1 (cudaRuntimeGetVersion) [LD_LIBRARY_PATH]: too new for the driver's CUDA 12.2"),
        "{d}"
    );
    assert!(c["fix"].as_str().unwrap().contains("≥ 590.44.01"), "{c:#}");
}

/// The recorded `container_nogpu` machine (docker, libcuda.so.1 on the
/// loader path, no /dev/nvidia*): ✘ with `--gpus all`; then built trees for
/// the other ways a container's GPUs go missing.
#[test]
fn container_without_gpus() {
    let o = doctor(&["--sysroot", &fixture("container_nogpu"), "--json"], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v = json(&o);
    let c = one(&v, "container.gpus");
    assert_eq!(c["status"], "fail", "{c:#}");
    let d = c["detail"].as_str().unwrap();
    assert!(
        d.starts_with("container without GPUs")
            && d.contains("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        "{d}"
    );
    let fix = c["fix"].as_str().unwrap();
    assert!(
        fix.contains("--gpus all") && fix.contains("NVIDIA Container Toolkit"),
        "{fix}"
    );

    // No driver library, but NVIDIA_VISIBLE_DEVICES asks for GPUs: ✘ too;
    // with neither, a CPU container is fine (–).
    let root = cpu_machine("ctr");
    write(&root, "/.dockerenv", "");
    std::fs::create_dir_all(root.join("usr/lib")).unwrap();
    let v = json(&doctor(
        &["--sysroot", &root_arg(&root), "--json"],
        &[("NVIDIA_VISIBLE_DEVICES", "all")],
    ));
    let c = one(&v, "container.gpus");
    assert_eq!(c["status"], "fail", "{c:#}");
    assert!(c["detail"]
        .as_str()
        .unwrap()
        .contains("NVIDIA_VISIBLE_DEVICES=all asks for GPUs"));
    let v = json(&doctor(&["--sysroot", &root_arg(&root), "--json"], &[]));
    assert_eq!(one(&v, "container.gpus")["status"], "skip");

    // Device nodes passed one by one, without /dev/nvidia-uvm: ✘.
    write(&root, "/usr/lib/libcuda.so.1", "fake");
    for d in ["nvidia0", "nvidia1", "nvidiactl"] {
        write(&root, &format!("/dev/{d}"), "");
    }
    let v = json(&doctor(&["--sysroot", &root_arg(&root), "--json"], &[]));
    let c = one(&v, "container.gpus");
    assert_eq!(c["status"], "fail", "{c:#}");
    assert!(
        c["detail"]
            .as_str()
            .unwrap()
            .contains("not /dev/nvidia-uvm"),
        "{c:#}"
    );

    // All nodes: ✔; CUDA_VISIBLE_DEVICES with host numbers: ✘ / ⚠;
    // NVIDIA_VISIBLE_DEVICES naming another count: ⚠.
    write(&root, "/dev/nvidia-uvm", "");
    let v = json(&doctor(&["--sysroot", &root_arg(&root), "--json"], &[]));
    let c = one(&v, "container.gpus");
    assert_eq!(c["status"], "ok", "{c:#}");
    assert!(c["detail"].as_str().unwrap().contains("2 GPU(s) visible"));
    assert!(checks(&v, "container.visible").is_empty());
    let o = doctor(
        &["--sysroot", &root_arg(&root), "--json"],
        &[("CUDA_VISIBLE_DEVICES", "4,5")],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let c = one(&json(&o), "container.visible").clone();
    assert_eq!(c["status"], "fail", "{c:#}");
    assert!(
        c["fix"]
            .as_str()
            .unwrap()
            .contains("CUDA_VISIBLE_DEVICES=0,1"),
        "{c:#}"
    );
    let v = json(&doctor(
        &["--sysroot", &root_arg(&root), "--json"],
        &[("CUDA_VISIBLE_DEVICES", "1,2")],
    ));
    let c = one(&v, "container.visible");
    assert_eq!(c["status"], "warn", "{c:#}");
    assert!(
        c["detail"].as_str().unwrap().contains("CUDA uses only 1"),
        "{c:#}"
    );
    let v = json(&doctor(
        &["--sysroot", &root_arg(&root), "--json"],
        &[("NVIDIA_VISIBLE_DEVICES", "0,1,2,3")],
    ));
    let c = one(&v, "container.visible");
    assert_eq!(c["status"], "warn", "{c:#}");
    assert!(c["detail"]
        .as_str()
        .unwrap()
        .contains("names 4 GPU(s) but the container has 2"));

    // Nodes but no driver library: ✘ naming NVIDIA_DRIVER_CAPABILITIES.
    std::fs::remove_file(root.join("usr/lib/libcuda.so.1")).unwrap();
    let v = json(&doctor(
        &["--sysroot", &root_arg(&root), "--json"],
        &[("NVIDIA_DRIVER_CAPABILITIES", "utility")],
    ));
    let c = one(&v, "container.gpus");
    assert_eq!(c["status"], "fail", "{c:#}");
    assert!(
        c["detail"].as_str().unwrap().contains("lacks `compute`"),
        "{c:#}"
    );

    // Kubernetes without a marker file or a telling cgroup: from the environment.
    std::fs::remove_file(root.join(".dockerenv")).unwrap();
    let v = json(&doctor(
        &["--sysroot", &root_arg(&root), "--json"],
        &[("KUBERNETES_SERVICE_HOST", "10.96.0.1")],
    ));
    assert!(one(&v, "container")["detail"]
        .as_str()
        .unwrap()
        .contains("kubernetes"));
    // Not in a container: no container GPU check.
    let v = json(&doctor(&["--sysroot", &root_arg(&root), "--json"], &[]));
    assert!(checks(&v, "container.").is_empty(), "{v:#}");
}

/// Starts `oxccl doctor --listen 127.0.0.1:0 ARGS` and returns it with its port
/// (read from the line it prints on stderr when it listens).
fn listener(root: &Path, args: &[&str]) -> (std::process::Child, u16) {
    use std::io::BufRead;
    let mut c = Command::new(BIN);
    c.arg("doctor")
        .args([
            "--sysroot",
            &root_arg(root),
            "--json",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("start the listener");
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let port = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    (child, port)
}

/// Two doctor processes on loopback: `--listen` answers `--peers`' probe and
/// connects back; both report ✔ with times.
#[test]
fn peers_both_ways_with_a_listening_doctor() {
    let root = cpu_machine("listen");
    let (child, port) = listener(&root, &["--listen-timeout", "20"]);
    let t0 = Instant::now();
    let peer = format!("127.0.0.1:{port}");
    let o = doctor(
        &["--sysroot", &root_arg(&root), "--json", "--peers", &peer],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    let c = one(&v, &format!("peers.{peer}"));
    assert_eq!(c["status"], "ok", "{c:#}");
    let d = c["detail"].as_str().unwrap();
    assert!(
        d.contains("connect took")
            && d.contains("round trip")
            && d.contains("it connected back to this host (127.0.0.1:")
            && d.contains("reachable both ways"),
        "{d}"
    );
    // The listener stops after the one probe it expected.
    let lo = child.wait_with_output().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(8),
        "took {:?}",
        t0.elapsed()
    );
    assert_eq!(lo.status.code(), Some(0), "{}", text(&lo));
    let lv = json(&lo);
    let l = one(&lv, "listen");
    assert_eq!(l["status"], "ok", "{l:#}");
    assert!(l["detail"]
        .as_str()
        .unwrap()
        .contains("1 probe(s) answered"));
    let p = checks(&lv, "listen.127.0.0.1:");
    assert_eq!(p.len(), 1, "{lv:#}");
    assert_eq!(p[0]["status"], "ok", "{:#}", p[0]);
}

/// A probe whose call-back port is closed: the listening doctor reports ✘
/// (a firewall on the prober's side), and tells the prober so.
#[test]
fn listener_reports_a_failed_call_back() {
    use std::io::{BufRead, Write};
    let root = cpu_machine("listenfail");
    let (child, port) = listener(&root, &["--listen-timeout", "20"]);
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    s.write_all(format!("oxccl-doctor 1 hello n0nce {closed_port}\n").as_bytes())
        .unwrap();
    let mut r = std::io::BufReader::new(s);
    let mut ack = String::new();
    r.read_line(&mut ack).unwrap();
    assert_eq!(ack, "oxccl-doctor 1 ack\n");
    let mut res = String::new();
    r.read_line(&mut res).unwrap();
    assert!(
        res.starts_with(&format!(
            "oxccl-doctor 1 result fail 127.0.0.1:{closed_port} connection refused"
        )),
        "{res}"
    );
    let lo = child.wait_with_output().unwrap();
    assert_eq!(lo.status.code(), Some(1), "{}", text(&lo));
    let lv = json(&lo);
    let p = checks(&lv, "listen.127.0.0.1:");
    assert_eq!(p.len(), 1, "{lv:#}");
    assert_eq!(p[0]["status"], "fail", "{:#}", p[0]);
    assert!(p[0]["fix"].as_str().unwrap().contains("firewall"));
}

/// The prober's side of a failed call back, against a stand-in listener
/// that answers and reports the failure: ✘ naming this host's address.
#[test]
fn peer_that_cannot_connect_back_fails() {
    use std::io::{BufRead, Write};
    let root = cpu_machine("noback");
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let t = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut r = std::io::BufReader::new(s.try_clone().unwrap());
        let mut hello = String::new();
        r.read_line(&mut hello).unwrap();
        let mut w = s;
        w.write_all(b"oxccl-doctor 1 ack\n").unwrap();
        w.write_all(b"oxccl-doctor 1 result fail 127.0.0.1:9 no answer within 2 s (a firewall dropping packets, or no route)\n")
            .unwrap();
        hello
    });
    let peer = format!("127.0.0.1:{port}");
    let o = doctor(
        &["--sysroot", &root_arg(&root), "--json", "--peers", &peer],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let hello = t.join().unwrap();
    assert!(hello.starts_with("oxccl-doctor 1 hello "), "{hello}");
    let c = one(&json(&o), &format!("peers.{peer}")).clone();
    assert_eq!(c["status"], "fail", "{c:#}");
    assert!(
        c["detail"]
            .as_str()
            .unwrap()
            .contains("cannot connect back to this host at 127.0.0.1:9: no answer within 2 s"),
        "{c:#}"
    );
    assert!(c["fix"]
        .as_str()
        .unwrap()
        .contains("allow incoming TCP from 127.0.0.1"));
}

/// Peers that never answer: a listening socket that never accepts (connect
/// works, no answer: ⚠ after the timeout) and one whose accept queue is
/// full (the SYN is dropped: ✘ no answer); neither hangs.
#[test]
fn blackholed_peers_time_out() {
    let root = cpu_machine("blackhole");
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = format!("127.0.0.1:{}", silent.local_addr().unwrap().port());
    // A queue of 0 (one pending connection at most), already full.
    // SAFETY: plain socket calls on a descriptor this test owns.
    let (fd, full_port) = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        let mut a: libc::sockaddr_in = std::mem::zeroed();
        a.sin_family = libc::AF_INET as libc::sa_family_t;
        a.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        assert_eq!(
            libc::bind(fd, &a as *const _ as *const libc::sockaddr, len),
            0
        );
        assert_eq!(libc::listen(fd, 0), 0);
        let mut len2 = len;
        libc::getsockname(fd, &mut a as *mut _ as *mut libc::sockaddr, &mut len2);
        (fd, u16::from_be(a.sin_port))
    };
    let fill: Vec<_> = (0..2)
        .filter_map(|_| {
            std::net::TcpStream::connect_timeout(
                &std::net::SocketAddr::from(([127, 0, 0, 1], full_port)),
                Duration::from_millis(300),
            )
            .ok()
        })
        .collect();
    let full = format!("127.0.0.1:{full_port}");
    let t0 = Instant::now();
    let o = doctor(
        &[
            "--sysroot",
            &root_arg(&root),
            "--json",
            "--peers",
            &format!("{peer},{full}"),
        ],
        &[],
    );
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(9), "took {took:?}");
    let v = json(&o);
    let c = one(&v, &format!("peers.{peer}"));
    assert_eq!(c["status"], "warn", "{c:#}");
    assert!(
        c["detail"]
            .as_str()
            .unwrap()
            .contains("no `oxccl doctor --listen` answered the probe (no answer within 2 s)"),
        "{c:#}"
    );
    assert!(c["fix"].as_str().unwrap().contains("oxccl doctor --listen"));
    let c = one(&v, &format!("peers.{full}"));
    assert_ne!(c["status"], "ok", "{c:#}");
    drop(fill);
    // SAFETY: closes the descriptor opened above.
    unsafe { libc::close(fd) };
}

/// `--listen` with nobody probing stops at its timeout (⚠); a port in use is ✘;
/// a malformed address is a command-line error.
#[test]
fn listen_timeout_and_bind_failure() {
    let root = cpu_machine("listento");
    let t0 = Instant::now();
    let (child, port) = listener(&root, &["--listen-timeout", "1"]);
    let o = child.wait_with_output().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(6),
        "took {:?}",
        t0.elapsed()
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let c = one(&json(&o), "listen").clone();
    assert_eq!(c["status"], "warn", "{c:#}");
    assert!(
        c["detail"]
            .as_str()
            .unwrap()
            .contains("0 of 1 expected probe(s)"),
        "{c:#}"
    );
    assert!(c["fix"]
        .as_str()
        .unwrap()
        .contains(&format!("--peers THIS_HOST:{port}")));

    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let o = doctor(
        &["--sysroot", &root_arg(&root), "--json", "--listen", &addr],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let c = one(&json(&o), "listen").clone();
    assert_eq!(c["status"], "fail", "{c:#}");
    assert!(c["detail"]
        .as_str()
        .unwrap()
        .contains(&format!("cannot listen on {addr}")));

    let o = doctor(&["--listen", "nowhere:x"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// oxccl's libnccl.so, built for these tests as a dev-dependency (cargo
/// puts the cdylib in target/<profile>/deps beside the test executable).
fn oxccl_lib() -> PathBuf {
    let p = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .join("libnccl.so");
    assert!(
        p.is_file(),
        "{} missing (oxccl-nccl is a dev-dependency)",
        p.display()
    );
    p
}

/// Runs `cc ARGS`, failing the test when it fails.
fn cc_ok(args: &[&str]) {
    let o = Command::new("cc").args(args).output().expect("cc");
    assert!(
        o.status.success(),
        "cc {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The PyTorch check on the real machine, with a stand-in `torch` package
/// (PYTHONPATH) whose `libtorch_cuda.so` needs a fake NVIDIA libnccl.so.2
/// (its RUNPATH) and is loaded RTLD_LOCAL as Python loads extensions. With
/// a copy of oxccl's library preloaded (a plain path: known by content),
/// the calls bind to oxccl although NVIDIA's copy is mapped too; without
/// it, to NVIDIA's copy through libtorch_cuda.so's dependencies.
#[test]
fn torch_check_sees_a_preloaded_oxccl_by_binding() {
    let dir = std::env::temp_dir().join(format!("doctor-torch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let nv = dir.join("nvidia/nccl/lib");
    let tlib = dir.join("py/torch/lib");
    let plain = dir.join("plain");
    for d in [&nv, &tlib, &dir.join("py/torch/distributed"), &plain] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(
        dir.join("nv.c"),
        "int ncclGetVersion(int *v) { *v = 22809; return 0; }\n",
    )
    .unwrap();
    let nv_so = nv.join("libnccl.so.2");
    cc_ok(&[
        "-shared",
        "-fPIC",
        "-Wl,-soname,libnccl.so.2",
        "-o",
        nv_so.to_str().unwrap(),
        dir.join("nv.c").to_str().unwrap(),
    ]);
    std::fs::write(
        dir.join("t.c"),
        "int ncclGetVersion(int *v);\nint torch_nccl(void) { int v = 0; ncclGetVersion(&v); return v; }\n",
    )
    .unwrap();
    let rpath = format!("-Wl,-rpath,{}", nv.display());
    let l_dir = format!("-L{}", nv.display());
    cc_ok(&[
        "-shared",
        "-fPIC",
        "-o",
        tlib.join("libtorch_cuda.so").to_str().unwrap(),
        dir.join("t.c").to_str().unwrap(),
        &l_dir,
        "-l:libnccl.so.2",
        &rpath,
    ]);
    std::fs::write(
        dir.join("py/torch/__init__.py"),
        "import ctypes, os\n\
         __version__ = '0.0.0+stand-in'\n\
         class version: cuda = '13.0'\n\
         class cuda:\n    class nccl:\n        @staticmethod\n        def version(): return (2, 28, 9)\n\
         _C = ctypes.CDLL(os.path.join(os.path.dirname(__file__), 'lib', 'libtorch_cuda.so'))\n\
         _C.torch_nccl()\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("py/torch/distributed/__init__.py"),
        "def is_nccl_available(): return True\n",
    )
    .unwrap();
    let copy = plain.join("libnccl.so.2");
    std::fs::copy(oxccl_lib(), &copy).unwrap();
    let py = dir.join("py").display().to_string();
    let torch_detail = |env: &[(&str, &str)]| {
        let o = doctor(&["--json"], env);
        let v = json(&o);
        one(&v, "torch")["detail"].as_str().unwrap().to_string()
    };
    let copy_s = copy.display().to_string();
    let d = torch_detail(&[("PYTHONPATH", &py), ("LD_PRELOAD", &copy_s)]);
    assert!(
        d.contains(&format!("ncclGetVersion binds to {copy_s} (through the global scope: LD_PRELOAD or the program): oxccl's")),
        "{d}"
    );
    let d = torch_detail(&[("PYTHONPATH", &py)]);
    let nv_s = nv_so.display().to_string();
    assert!(
        d.contains(&format!("ncclGetVersion binds to {nv_s} (through "))
            && d.contains("libtorch_cuda.so's own dependencies): not oxccl's"),
        "{d}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A virtual environment used without activating it (its python3 first on
/// PATH, no VIRTUAL_ENV): pip's NVIDIA NCCL and the oxccl wheel's library
/// inside it are both listed, with where they came from.
#[test]
fn unactivated_venv_libraries_are_found() {
    let root = cpu_machine("venv");
    write(&root, "/opt/venv/bin/python3", "#!/bin/sh\n");
    write(&root, "/opt/venv/pyvenv.cfg", "home = /usr/bin\n");
    let sp = "/opt/venv/lib/python3.12/site-packages";
    write(
        &root,
        &format!("{sp}/nvidia/nccl/lib/libnccl.so.2.28.9"),
        "fake",
    );
    write(&root, &format!("{sp}/oxccl/lib/libnccl.so.2"), "fake");
    let without = doctor(
        &["--sysroot", &root_arg(&root), "--json"],
        &[("PATH", "/usr/bin")],
    );
    let v0 = json(&without);
    let d0 = one(&v0, "nccl.libs");
    assert_eq!(d0["status"], "skip", "{d0:#}");
    let o = doctor(
        &["--sysroot", &root_arg(&root), "--json"],
        &[("PATH", "/opt/venv/bin:/usr/bin")],
    );
    let v = json(&o);
    let d = one(&v, "nccl.versions")["detail"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        d.contains(&format!(
            "{sp}/nvidia/nccl/lib/libnccl.so.2.28.9: 2.28.9 (file name) [pip (nvidia-nccl)]"
        )),
        "{d}"
    );
    assert!(
        d.contains(&format!("{sp}/oxccl/lib/libnccl.so.2: ")) && d.contains("[pip (oxccl wheel)]"),
        "{d}"
    );
}
