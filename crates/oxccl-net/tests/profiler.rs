//! The profiler-plugin loader against real libraries: the C test profiler
//! (`tests/plugins/oxtest_profiler.c`) as v6 and v5 and under a v4-only
//! name, a library that exports no profiler (libm), a name that does not
//! exist and `none`, each in a child process (a library is loaded and its
//! WARN printed once per process). The events themselves are tested with
//! real ranks in `crates/oxccl/tests/profiler_plugin.rs`.

use std::process::Command;

use oxccl_net::profiler::{load_profiler, ProfilerComm, PROFILE_COLL, PROFILE_GROUP, PROFILE_P2P};
use oxccl_net::testing::build_c_plugin;

fn profiler(defines: &[&str], dir: &str) -> String {
    let src =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/plugins/oxtest_profiler.c");
    build_c_plugin(&src, defines, dir, "libnccl-profiler-oxtest.so")
        .to_str()
        .unwrap()
        .to_string()
}

fn run(value: Option<&str>) -> String {
    run_with(value, &[])
}

fn run_with(value: Option<&str>, env: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--ignored",
        "--exact",
        "profiler_worker",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("OXPROF_WORKER", "1")
    .env("NCCL_DEBUG", "INFO")
    .env("NCCL_DEBUG_SUBSYS", "INIT")
    .env_remove("NCCL_DEBUG_FILE");
    match value {
        Some(v) => cmd.env("OXPROF_VALUE", v),
        None => cmd.env_remove("OXPROF_VALUE"),
    };
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("spawn worker");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("OXPROF_DONE"),
        "worker failed ({}):\n{text}",
        out.status
    );
    text
}

/// The entry of every child.
#[test]
#[ignore = "child process of the profiler loader tests"]
fn profiler_worker() {
    assert!(
        std::env::var("OXPROF_WORKER").is_ok(),
        "profiler_worker is the child of a profiler test: it runs when a test starts it"
    );
    let value = std::env::var("OXPROF_VALUE").ok();
    let net = std::env::var("OXPROF_NET_LIBRARY").ok();
    match load_profiler(value.as_deref(), net.as_deref()) {
        None => println!("OXPROF_NONE"),
        Some(lib) => {
            let v = lib.version().symbol();
            match ProfilerComm::init(lib, 1, "", 1, 2, 1) {
                Ok(p) => println!("OXPROF_LOADED version={v} mask={}", p.mask()),
                Err(why) => println!("OXPROF_INIT_FAILED {why}"),
            }
        }
    }
    println!("OXPROF_DONE");
}

#[test]
fn versions_names_and_refusals() {
    let mask = PROFILE_GROUP | PROFILE_COLL | PROFILE_P2P;
    for (v, def) in [(6, "PROFILER_VERSION=6"), (5, "PROFILER_VERSION=5")] {
        let so = profiler(&[def], &format!("profiler-v{v}"));
        let out = run(Some(&so));
        assert!(
            out.contains(&format!(
                "OXPROF_LOADED version=ncclProfiler_v{v} mask={mask}"
            )),
            "{out}"
        );
        assert!(
            out.contains(&format!(
                "PROFILER/Plugin: loaded {so}: profiler oxtest-profiler"
            )),
            "{out}"
        );
        assert!(!out.contains("WARN"), "{out}");
    }
    // By name through the library path is the tuner's and the net's rule
    // too; here: a v4-only library, libm, an absent name, none, unset.
    let so = profiler(&["PROFILER_VERSION=4"], "profiler-v4");
    let out = run(Some(&so));
    assert!(out.contains("OXPROF_NONE"), "{out}");
    assert!(
        out.contains(&format!("WARN PROFILER/Plugin: profiler plugin {so} cannot be used: it exports only ncclProfiler_v4")),
        "{out}"
    );
    let out = run(Some("libm.so.6"));
    assert!(
        out.contains(
            "profiler plugin libm.so.6 cannot be used: it exports none of the profiler versions"
        ),
        "{out}"
    );
    let out = run(Some("nosuchprofiler"));
    assert!(
        out.contains("WARN PROFILER/Plugin: NCCL_PROFILER_PLUGIN=nosuchprofiler not found")
            && out.contains("libnccl-profiler-nosuchprofiler.so"),
        "{out}"
    );
    for quiet in [Some("none"), None] {
        let out = run(quiet);
        assert!(
            out.contains("OXPROF_NONE") && !out.contains("WARN"),
            "{out}"
        );
    }
    // Nothing named opens: the network plugin's library is searched.
    let net = profiler(&[], "profiler-in-net-lib");
    let out = run_with(None, &[("OXPROF_NET_LIBRARY", &net)]);
    assert!(
        out.contains("OXPROF_LOADED version=ncclProfiler_v6")
            && out.contains(&format!("found in the network plugin's library {net}"))
            && !out.contains("WARN"),
        "{out}"
    );
    let so = profiler(&["FAIL_INIT"], "profiler-fail-init");
    let out = run(Some(&so));
    assert!(
        out.contains("OXPROF_INIT_FAILED") && out.contains("init returned 3 (ncclInternalError)"),
        "{out}"
    );
}
