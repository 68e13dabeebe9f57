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

fn one<'a>(v: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    let c = checks(v, id);
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
        t0.elapsed() < Duration::from_secs(3),
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
    assert_eq!(c["status"], "ok", "{c:#}");
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
#[test]
fn library_probe_in_child_process() {
    let cc = Command::new("cc").arg("--version").output();
    if !cc.is_ok_and(|o| o.status.success()) {
        eprintln!("skipping: no C compiler");
        return;
    }
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
fn cc(root: &Path, out: &str, src: &str, args: &[&str]) -> bool {
    if !Command::new("cc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return false;
    }
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
    true
}

/// A libnccl.so.2 (SONAME libnccl.so.2) answering `code` from ncclGetVersion.
fn nccl_lib(root: &Path, out: &str, code: u32) -> bool {
    cc(
        root,
        out,
        &format!("int ncclGetVersion(int *v) {{ *v = {code}; return 0; }}\n"),
        &["-shared", "-fPIC", "-Wl,-soname,libnccl.so.2"],
    )
}

/// A program that needs libnccl.so.2, linked against `lib` (under the root), with `flags`.
fn nccl_program(root: &Path, out: &str, lib: &str, flags: &[&str]) -> bool {
    let libdir = root.join(lib.trim_start_matches('/'));
    let l = format!("-L{}", libdir.parent().unwrap().display());
    let mut args = vec![l.as_str(), "-l:libnccl.so.2"];
    args.extend_from_slice(flags);
    cc(
        root,
        out,
        "int ncclGetVersion(int *v);\nint main(void) { int v = 0; return ncclGetVersion(&v); }\n",
        &args,
    )
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
    if !nccl_lib(&root, "/opt/app/lib/libnccl.so.2", 22809) {
        eprintln!("skipping: no C compiler");
        return;
    }
    assert!(nccl_lib(&root, "/opt/pip/libnccl.so.2", 22105));
    let lib = "/opt/app/lib/libnccl.so.2";
    let old = ["-Wl,--disable-new-dtags", "-Wl,-rpath,$ORIGIN/../lib"];
    let new = ["-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN/../lib"];
    assert!(nccl_program(&root, "/opt/app/bin/train_rpath", lib, &old));
    assert!(nccl_program(&root, "/opt/app/bin/train_runpath", lib, &new));
    assert!(nccl_program(&root, "/opt/app/bin/train_plain", lib, &[]));
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
    if !nccl_lib(&root, &nccl, 22809) {
        eprintln!("skipping: no C compiler");
        return;
    }
    let l = format!("-L{}", root.join(&nccl[1..]).parent().unwrap().display());
    assert!(cc(
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
    ));
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
