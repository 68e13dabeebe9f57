//! The tuner-plugin loader and the `ncclTuner` ABI of each version (v2 to
//! v6) against real libraries: the C test tuner (`tests/plugins/oxtest_tuner.c`)
//! compiled with cc into each variant, a library that exports no tuner
//! (libm), a name that does not exist, a table without `getCollInfo` and a
//! tuner whose `init` fails.
//!
//! Each scenario runs in a fresh process (this binary re-run as the test
//! `tuner_worker`), because a library is loaded once per process and its
//! WARN is printed once.

use std::path::PathBuf;
use std::process::Command;

use oxccl_core::tuner_plugin::{CostTable, IGNORE};
use oxccl_net::testing::{build_c_plugin, tuner_source};
use oxccl_net::tuner::{load_tuner, TunerComm};

fn tuner(defines: &[&str], dir: &str, file: &str) -> PathBuf {
    build_c_plugin(&tuner_source(), defines, dir, file)
}

/// Runs the worker with `NCCL_TUNER_PLUGIN` as given (None: unset) and
/// `env`; returns its combined output.
fn run(value: Option<&str>, env: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--ignored",
        "--exact",
        "tuner_worker",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("OXTUNER_WORKER", "1")
    .env("NCCL_DEBUG", "INFO")
    .env("NCCL_DEBUG_SUBSYS", "INIT,TUNING")
    .env_remove("NCCL_TUNER_PLUGIN")
    .env_remove("NCCL_DEBUG_FILE");
    match value {
        Some(v) => cmd.env("OXTUNER_VALUE", v),
        None => cmd.env_remove("OXTUNER_VALUE"),
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
        out.status.success() && text.contains("OXTUNER_DONE"),
        "worker failed ({}):\n{text}",
        out.status
    );
    text
}

fn field<'a>(out: &'a str, tag: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.find(tag).map(|i| l[i + tag.len()..].trim()))
        .unwrap_or_else(|| panic!("no {tag} line in:\n{out}"))
}

/// Reads an exported `int` counter of a loaded library.
fn counter(file: &str, name: &str) -> i32 {
    let f = std::ffi::CString::new(file).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: the library is already loaded (RTLD_NOLOAD), so this only
    // takes another reference to it; the name is a C string.
    let h = unsafe { libc::dlopen(f.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    assert!(!h.is_null(), "{file} is not loaded");
    // SAFETY: a live handle and a C string.
    let p = unsafe { libc::dlsym(h, n.as_ptr()) };
    assert!(!p.is_null(), "{file} exports no {name}");
    // SAFETY: the symbol is an `int` the plugin defines; no call is in flight.
    unsafe { *(p as *const i32) }
}

/// The entry of every child.
#[test]
#[ignore = "child process of the tuner tests"]
fn tuner_worker() {
    assert!(
        std::env::var("OXTUNER_WORKER").is_ok(),
        "tuner_worker is the child of a tuner test: it runs when a test starts it"
    );
    let value = std::env::var("OXTUNER_VALUE").ok();
    let net = std::env::var("OXTUNER_NET_LIBRARY").ok();
    match load_tuner(value.as_deref(), net.as_deref()) {
        None => println!("OXTUNER_NONE"),
        Some(lib) => {
            println!(
                "OXTUNER_LOADED name={} version={} file={}",
                lib.name(),
                lib.version().symbol(),
                lib.library()
            );
            let file = lib.library().to_string();
            match TunerComm::init(lib, 0x5eed, 8, 2, 4, 4) {
                Err(why) => println!("OXTUNER_INIT_FAILED {why}"),
                Ok(mut t) => {
                    // Tree and Ring possible (costs 10 and 20), the rest not.
                    let mut table: CostTable = [[IGNORE; 3]; 7];
                    table[0] = [10.0, 11.0, 12.0];
                    table[1] = [20.0, 21.0, 22.0];
                    let given = table;
                    match t.get_coll_info(4, 1 << 20, &mut table) {
                        Err(why) => println!("OXTUNER_CALL_FAILED {why}"),
                        Ok(nch) => {
                            let changed: Vec<String> = (0..7)
                                .flat_map(|a| (0..3).map(move |p| (a, p)))
                                .filter(|&(a, p)| table[a][p] != given[a][p])
                                .map(|(a, p)| format!("{a}.{p}={}", table[a][p]))
                                .collect();
                            println!("OXTUNER_RESULT nch={nch} changed={}", changed.join(","));
                        }
                    }
                    drop(t);
                }
            }
            println!(
                "OXTUNER_COUNTS inits={} calls={} finalizes={}",
                counter(&file, "oxtest_tuner_inits"),
                counter(&file, "oxtest_tuner_calls"),
                counter(&file, "oxtest_tuner_finalizes")
            );
        }
    }
    println!("OXTUNER_DONE");
}

#[test]
fn every_version_is_loaded_newest_first_and_called() {
    for v in 2..=6 {
        let so = tuner(
            &[
                &format!("TUNER_VERSION={v}"),
                "FORCE_ALGO=1",
                "FORCE_PROTO=0",
                "FORCE_NCH=3",
            ],
            &format!("tuner-v{v}"),
            "libnccl-tuner-oxtest.so",
        );
        let out = run(Some(so.to_str().unwrap()), &[]);
        let symbol = format!("ncclTunerPlugin_v{v}");
        let loaded = field(&out, "OXTUNER_LOADED");
        assert!(
            loaded.contains("name=oxtest-tuner") && loaded.contains(&symbol),
            "v{v}: {out}"
        );
        assert!(
            out.contains(&format!("TUNER/Plugin: loaded {}", so.display()))
                && out.contains(&format!("through {symbol}")),
            "v{v}: {out}"
        );
        // Ring/LL (1.0) forced to 0; the channel count comes back.
        assert_eq!(
            field(&out, "OXTUNER_RESULT"),
            "nch=3 changed=1.0=0",
            "v{v}: {out}"
        );
        assert_eq!(
            field(&out, "OXTUNER_COUNTS"),
            "inits=1 calls=1 finalizes=1",
            "v{v}: {out}"
        );
        // The plugin's own lines reach oxccl's log through the logger.
        assert!(
            out.contains(&format!("oxtest tuner v{v}: init nRanks 8 nNodes 2")),
            "v{v}: {out}"
        );
        assert!(!out.contains("WARN"), "v{v}: {out}");
    }
}

#[test]
fn forcing_an_ignored_entry_changes_nothing() {
    // NVLS/Simple is ignored in the table: the tuner may not revive it, and
    // a v2 tuner naming it is not turned into a zero cost either.
    for v in [2, 6] {
        let so = tuner(
            &[
                &format!("TUNER_VERSION={v}"),
                "FORCE_ALGO=4",
                "FORCE_PROTO=2",
            ],
            &format!("tuner-nvls-v{v}"),
            "libnccl-tuner-oxtest.so",
        );
        let out = run(Some(so.to_str().unwrap()), &[]);
        assert_eq!(field(&out, "OXTUNER_RESULT"), "nch=0 changed=", "{out}");
    }
}

#[test]
fn name_rule_finds_libnccl_tuner_name_so() {
    let so = tuner(
        &["TUNER_VERSION=5", "FORCE_ALGO=0", "FORCE_PROTO=2"],
        "tuner-by-name",
        "libnccl-tuner-oxname.so",
    );
    let dir = so.parent().unwrap().to_str().unwrap().to_string();
    let out = run(Some("oxname"), &[("LD_LIBRARY_PATH", &dir)]);
    assert!(
        field(&out, "OXTUNER_LOADED").contains("file=libnccl-tuner-oxname.so"),
        "{out}"
    );
    assert_eq!(
        field(&out, "OXTUNER_RESULT"),
        "nch=0 changed=0.2=0",
        "{out}"
    );
    // Unset: libnccl-tuner.so, which is not there: silently none.
    let out = run(None, &[("LD_LIBRARY_PATH", &dir)]);
    assert!(out.contains("OXTUNER_NONE"), "{out}");
    assert!(!out.contains("WARN"), "{out}");
    let out = run(Some("none"), &[]);
    assert!(out.contains("OXTUNER_NONE"), "{out}");
    assert!(!out.contains("WARN"), "{out}");
}

#[test]
fn the_network_plugins_library_is_searched_when_no_tuner_file_opens() {
    let so = tuner(
        &["TUNER_VERSION=4", "FORCE_ALGO=1", "FORCE_PROTO=2"],
        "tuner-in-net-lib",
        "libnccl-net-withtuner.so",
    );
    let net = so.to_str().unwrap();
    for value in [None, Some("nosuchtuner")] {
        let out = run(value, &[("OXTUNER_NET_LIBRARY", net)]);
        assert!(
            field(&out, "OXTUNER_LOADED").contains("version=ncclTunerPlugin_v4"),
            "{value:?}: {out}"
        );
        assert!(
            out.contains(&format!("found in the network plugin's library {net}")),
            "{value:?}: {out}"
        );
        assert!(!out.contains("WARN"), "{value:?}: {out}");
    }
    // A network library without a tuner: as before, silent when unset.
    let out = run(None, &[("OXTUNER_NET_LIBRARY", "libm.so.6")]);
    assert!(
        out.contains("OXTUNER_NONE") && !out.contains("WARN"),
        "{out}"
    );
}

#[test]
fn broken_tuners_are_refused_with_a_warn_naming_file_and_reason() {
    // Named but absent.
    let out = run(Some("nosuchtuner"), &[]);
    assert!(out.contains("OXTUNER_NONE"), "{out}");
    assert!(
        out.contains("WARN TUNER/Plugin: NCCL_TUNER_PLUGIN=nosuchtuner not found")
            && out.contains("libnccl-tuner-nosuchtuner.so")
            && out.contains("oxccl's own tuning decides"),
        "{out}"
    );
    // Opens, but exports no tuner.
    let out = run(Some("libm.so.6"), &[]);
    assert!(out.contains("OXTUNER_NONE"), "{out}");
    assert!(
        out.contains("WARN TUNER/Plugin: tuner plugin libm.so.6 cannot be used: it exports none of the tuner versions"),
        "{out}"
    );
    // A table without getCollInfo.
    let so = tuner(
        &["NO_COLL_INFO"],
        "tuner-no-coll-info",
        "libnccl-tuner-x.so",
    );
    let out = run(Some(so.to_str().unwrap()), &[]);
    assert!(out.contains("OXTUNER_NONE"), "{out}");
    assert!(
        out.contains(&format!("tuner plugin {} cannot be used", so.display()))
            && out.contains("its ncclTunerPlugin_v6 table has no getCollInfo"),
        "{out}"
    );
    // init fails: the caller is told why (and runs without the tuner).
    let so = tuner(&["FAIL_INIT"], "tuner-fail-init", "libnccl-tuner-x.so");
    let out = run(Some(so.to_str().unwrap()), &[]);
    assert!(
        field(&out, "OXTUNER_INIT_FAILED").contains("init returned 3 (ncclInternalError)"),
        "{out}"
    );
    // getCollInfo fails: reported to the caller, which keeps its own plan.
    let so = tuner(&["FAIL_COLL_INFO"], "tuner-fail-call", "libnccl-tuner-x.so");
    let out = run(Some(so.to_str().unwrap()), &[]);
    assert!(
        field(&out, "OXTUNER_CALL_FAILED").contains("getCollInfo returned 3"),
        "{out}"
    );
    assert_eq!(
        field(&out, "OXTUNER_COUNTS"),
        "inits=1 calls=1 finalizes=1",
        "{out}"
    );
}
