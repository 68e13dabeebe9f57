//! The profiler-plugin loader against real libraries: the C test profiler
//! (`tests/plugins/oxtest_profiler.c`) built as each of v1 to v6, one
//! without `stopEvent`, a library that exports no profiler (libm), a name
//! that does not exist and `none`, each in a child process (a library is
//! loaded and its WARN printed once per process); and the descriptors'
//! layout against what cc lays out for the C declarations
//! (`tests/plugins/profiler_layout.c`). The events themselves are tested
//! with real ranks in `crates/oxccl/tests/profiler_plugin.rs`.

use std::collections::HashMap;
use std::mem::{offset_of, size_of};
use std::process::Command;

use oxccl_net::profiler::{
    load_profiler, EventDescr, EventDescrV1, EventDescrV2, EventDescrV3, EventDescrV4,
    ProfilerComm, StateArgsV1, StateArgsV4, PROFILE_COLL, PROFILE_GROUP, PROFILE_P2P,
};
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
    for v in (1..=6).rev() {
        let so = profiler(
            &[&format!("PROFILER_VERSION={v}")],
            &format!("profiler-v{v}"),
        );
        let out = run(Some(&so));
        assert!(
            out.contains(&format!(
                "OXPROF_LOADED version=ncclProfiler_v{v} mask={mask}"
            )),
            "{out}"
        );
        assert!(
            out.contains(&format!(
                "PROFILER/Plugin: loaded {so}: profiler oxtest-profiler through ncclProfiler_v{v}"
            )),
            "{out}"
        );
        assert!(!out.contains("WARN"), "{out}");
    }
    // A v2 plugin asking for the API events v5 added (bits 8 and 9) keeps
    // only the kinds v2 defines.
    let so = profiler(&["PROFILER_VERSION=2", "MASK=0x307"], "profiler-v2-api");
    let out = run(Some(&so));
    assert!(
        out.contains(&format!(
            "OXPROF_LOADED version=ncclProfiler_v2 mask={mask}"
        )),
        "{out}"
    );
    // Refused: a table without stopEvent (v3, an older table checked
    // the same way), libm, an absent name; silent: none, unset.
    let so = profiler(&["PROFILER_VERSION=3", "NO_STOP"], "profiler-no-stop");
    let out = run(Some(&so));
    assert!(out.contains("OXPROF_NONE"), "{out}");
    assert!(
        out.contains(&format!(
            "WARN PROFILER/Plugin: profiler plugin {so} cannot be used: its ncclProfiler_v3 table has no stopEvent; running without a profiler"
        )),
        "{out}"
    );
    // Only a version after v6: named.
    let so = profiler(&["EXPORT_AS=ncclProfiler_v7"], "profiler-v7");
    let out = run(Some(&so));
    assert!(
        out.contains("OXPROF_NONE")
            && out.contains(&format!(
                "WARN PROFILER/Plugin: profiler plugin {so} cannot be used: it exports ncclProfiler_v7, newer than the versions oxccl drives"
            )),
        "{out}"
    );
    let out = run(Some("libm.so.6"));
    assert!(
        out.contains(
            "WARN PROFILER/Plugin: profiler plugin libm.so.6 cannot be used: it exports none of the profiler versions oxccl knows (ncclProfiler_v6 down to ncclProfiler_v1)"
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

/// One descriptor member: (C type, member path as C spells it, offset).
macro_rules! member {
    ($c:literal, $t:ty, $cpath:literal, $($f:tt)+) => {
        ($c, $cpath, offset_of!($t, $($f)+))
    };
}

/// Every size and offset `profiler_layout.c` prints, compiled by cc for
/// this machine, equals oxccl's: each line must have its Rust twin.
#[test]
fn descriptor_layout_matches_c() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/plugins");
    let exe = std::env::temp_dir().join(format!("oxccl-profiler-layout-{}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let o = Command::new(&cc)
        .args(["-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(dir.join("profiler_layout.c"))
        .output()
        .expect("run cc");
    assert!(
        o.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = Command::new(&exe).output().expect("run the layout program");
    let _ = std::fs::remove_file(&exe);
    assert!(o.status.success());
    let c: Vec<(String, usize)> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').expect("name value");
            (k.to_string(), v.parse().expect("a number"))
        })
        .collect();
    let sizes = [
        ("descr_v1_t", size_of::<EventDescrV1>()),
        ("descr_v2_t", size_of::<EventDescrV2>()),
        ("descr_v3_t", size_of::<EventDescrV3>()),
        ("descr_v4_t", size_of::<EventDescrV4>()),
        ("descr_v6_t", size_of::<EventDescr>()),
        ("state_args_v1_t", size_of::<StateArgsV1>()),
        ("state_args_v4_t", size_of::<StateArgsV4>()),
    ];
    let members = [
        member!("descr_v1_t", EventDescrV1, "proxyOp.pid", u.proxy_op.pid),
        member!(
            "descr_v1_t",
            EventDescrV1,
            "proxyOp.channelId",
            u.proxy_op.channel_id
        ),
        member!("descr_v1_t", EventDescrV1, "proxyOp.peer", u.proxy_op.peer),
        member!(
            "descr_v1_t",
            EventDescrV1,
            "proxyOp.nSteps",
            u.proxy_op.n_steps
        ),
        member!(
            "descr_v1_t",
            EventDescrV1,
            "proxyOp.chunkSize",
            u.proxy_op.chunk_size
        ),
        member!(
            "descr_v1_t",
            EventDescrV1,
            "proxyOp.isSend",
            u.proxy_op.is_send
        ),
        member!(
            "descr_v1_t",
            EventDescrV1,
            "proxyStep.step",
            u.proxy_step.step
        ),
        member!("descr_v4_t", EventDescrV4, "proxyOp.pid", u.proxy_op.pid),
        member!(
            "descr_v4_t",
            EventDescrV4,
            "proxyOp.channelId",
            u.proxy_op.channel_id
        ),
        member!("descr_v4_t", EventDescrV4, "proxyOp.peer", u.proxy_op.peer),
        member!(
            "descr_v4_t",
            EventDescrV4,
            "proxyOp.nSteps",
            u.proxy_op.n_steps
        ),
        member!(
            "descr_v4_t",
            EventDescrV4,
            "proxyOp.chunkSize",
            u.proxy_op.chunk_size
        ),
        member!(
            "descr_v4_t",
            EventDescrV4,
            "proxyOp.isSend",
            u.proxy_op.is_send
        ),
        member!(
            "descr_v4_t",
            EventDescrV4,
            "proxyStep.step",
            u.proxy_step.step
        ),
        member!("descr_v6_t", EventDescr, "proxyOp.pid", u.proxy_op.pid),
        member!(
            "descr_v6_t",
            EventDescr,
            "proxyOp.channelId",
            u.proxy_op.channel_id
        ),
        member!("descr_v6_t", EventDescr, "proxyOp.peer", u.proxy_op.peer),
        member!(
            "descr_v6_t",
            EventDescr,
            "proxyOp.nSteps",
            u.proxy_op.n_steps
        ),
        member!(
            "descr_v6_t",
            EventDescr,
            "proxyOp.chunkSize",
            u.proxy_op.chunk_size
        ),
        member!(
            "descr_v6_t",
            EventDescr,
            "proxyOp.isSend",
            u.proxy_op.is_send
        ),
        member!(
            "descr_v6_t",
            EventDescr,
            "proxyStep.step",
            u.proxy_step.step
        ),
        member!("descr_v1_t", EventDescrV1, "parentObj", parent_obj),
        member!("descr_v1_t", EventDescrV1, "rank", rank),
        member!("descr_v1_t", EventDescrV1, "coll", u.coll),
        member!("descr_v1_t", EventDescrV1, "coll.name", u.coll.name),
        member!(
            "descr_v1_t",
            EventDescrV1,
            "coll.commHash",
            u.coll.comm_hash
        ),
        member!(
            "descr_v1_t",
            EventDescrV1,
            "coll.seqNumber",
            u.coll.seq_number
        ),
        member!("descr_v1_t", EventDescrV1, "coll.func", u.coll.func),
        member!(
            "descr_v1_t",
            EventDescrV1,
            "coll.sendBuff",
            u.coll.send_buff
        ),
        member!(
            "descr_v1_t",
            EventDescrV1,
            "coll.recvBuff",
            u.coll.recv_buff
        ),
        member!("descr_v1_t", EventDescrV1, "coll.count", u.coll.count),
        member!("descr_v1_t", EventDescrV1, "coll.root", u.coll.root),
        member!("descr_v1_t", EventDescrV1, "coll.datatype", u.coll.datatype),
        member!("descr_v1_t", EventDescrV1, "coll.op", u.coll.op),
        member!(
            "descr_v1_t",
            EventDescrV1,
            "coll.trafficBytes",
            u.coll.traffic_bytes
        ),
        member!(
            "descr_v1_t",
            EventDescrV1,
            "coll.nMaxChannels",
            u.coll.n_max_channels
        ),
        member!("descr_v1_t", EventDescrV1, "coll.nWarps", u.coll.n_warps),
        member!("descr_v1_t", EventDescrV1, "coll.algo", u.coll.algo),
        member!("descr_v1_t", EventDescrV1, "coll.proto", u.coll.proto),
        member!(
            "descr_v1_t",
            EventDescrV1,
            "coll.isCollnet",
            u.coll.is_collnet
        ),
        member!("descr_v1_t", EventDescrV1, "coll.isNvls", u.coll.is_nvls),
        member!("descr_v1_t", EventDescrV1, "p2p.name", u.p2p.name),
        member!("descr_v1_t", EventDescrV1, "p2p.commHash", u.p2p.comm_hash),
        member!("descr_v1_t", EventDescrV1, "p2p.func", u.p2p.func),
        member!("descr_v1_t", EventDescrV1, "p2p.buff", u.p2p.buff),
        member!("descr_v1_t", EventDescrV1, "p2p.datatype", u.p2p.datatype),
        member!("descr_v1_t", EventDescrV1, "p2p.count", u.p2p.count),
        member!("descr_v1_t", EventDescrV1, "p2p.peer", u.p2p.peer),
        member!("descr_v2_t", EventDescrV2, "parentObj", parent_obj),
        member!("descr_v2_t", EventDescrV2, "rank", rank),
        member!("descr_v2_t", EventDescrV2, "coll", u.coll),
        member!("descr_v2_t", EventDescrV2, "coll.name", u.coll.name),
        member!(
            "descr_v2_t",
            EventDescrV2,
            "coll.commHash",
            u.coll.comm_hash
        ),
        member!(
            "descr_v2_t",
            EventDescrV2,
            "coll.seqNumber",
            u.coll.seq_number
        ),
        member!("descr_v2_t", EventDescrV2, "coll.func", u.coll.func),
        member!(
            "descr_v2_t",
            EventDescrV2,
            "coll.sendBuff",
            u.coll.send_buff
        ),
        member!(
            "descr_v2_t",
            EventDescrV2,
            "coll.recvBuff",
            u.coll.recv_buff
        ),
        member!("descr_v2_t", EventDescrV2, "coll.count", u.coll.count),
        member!("descr_v2_t", EventDescrV2, "coll.root", u.coll.root),
        member!("descr_v2_t", EventDescrV2, "coll.datatype", u.coll.datatype),
        member!(
            "descr_v2_t",
            EventDescrV2,
            "coll.trafficBytes",
            u.coll.traffic_bytes
        ),
        member!(
            "descr_v2_t",
            EventDescrV2,
            "coll.nMaxChannels",
            u.coll.n_max_channels
        ),
        member!("descr_v2_t", EventDescrV2, "coll.nWarps", u.coll.n_warps),
        member!("descr_v2_t", EventDescrV2, "coll.algo", u.coll.algo),
        member!("descr_v2_t", EventDescrV2, "coll.proto", u.coll.proto),
        member!("descr_v2_t", EventDescrV2, "p2p.name", u.p2p.name),
        member!("descr_v2_t", EventDescrV2, "p2p.commHash", u.p2p.comm_hash),
        member!("descr_v2_t", EventDescrV2, "p2p.func", u.p2p.func),
        member!("descr_v2_t", EventDescrV2, "p2p.buff", u.p2p.buff),
        member!("descr_v2_t", EventDescrV2, "p2p.datatype", u.p2p.datatype),
        member!("descr_v2_t", EventDescrV2, "p2p.count", u.p2p.count),
        member!("descr_v2_t", EventDescrV2, "p2p.peer", u.p2p.peer),
        member!("descr_v3_t", EventDescrV3, "parentObj", parent_obj),
        member!("descr_v3_t", EventDescrV3, "rank", rank),
        member!("descr_v3_t", EventDescrV3, "coll", u.coll),
        member!("descr_v3_t", EventDescrV3, "coll.name", u.coll.name),
        member!(
            "descr_v3_t",
            EventDescrV3,
            "coll.commHash",
            u.coll.comm_hash
        ),
        member!(
            "descr_v3_t",
            EventDescrV3,
            "coll.seqNumber",
            u.coll.seq_number
        ),
        member!("descr_v3_t", EventDescrV3, "coll.func", u.coll.func),
        member!(
            "descr_v3_t",
            EventDescrV3,
            "coll.sendBuff",
            u.coll.send_buff
        ),
        member!(
            "descr_v3_t",
            EventDescrV3,
            "coll.recvBuff",
            u.coll.recv_buff
        ),
        member!("descr_v3_t", EventDescrV3, "coll.count", u.coll.count),
        member!("descr_v3_t", EventDescrV3, "coll.root", u.coll.root),
        member!("descr_v3_t", EventDescrV3, "coll.datatype", u.coll.datatype),
        member!(
            "descr_v3_t",
            EventDescrV3,
            "coll.nMaxChannels",
            u.coll.n_max_channels
        ),
        member!("descr_v3_t", EventDescrV3, "coll.nWarps", u.coll.n_warps),
        member!("descr_v3_t", EventDescrV3, "coll.algo", u.coll.algo),
        member!("descr_v3_t", EventDescrV3, "coll.proto", u.coll.proto),
        member!("descr_v3_t", EventDescrV3, "p2p.name", u.p2p.name),
        member!("descr_v3_t", EventDescrV3, "p2p.commHash", u.p2p.comm_hash),
        member!("descr_v3_t", EventDescrV3, "p2p.func", u.p2p.func),
        member!("descr_v3_t", EventDescrV3, "p2p.buff", u.p2p.buff),
        member!("descr_v3_t", EventDescrV3, "p2p.datatype", u.p2p.datatype),
        member!("descr_v3_t", EventDescrV3, "p2p.count", u.p2p.count),
        member!("descr_v3_t", EventDescrV3, "p2p.peer", u.p2p.peer),
        member!("descr_v4_t", EventDescrV4, "parentObj", parent_obj),
        member!("descr_v4_t", EventDescrV4, "rank", rank),
        member!("descr_v4_t", EventDescrV4, "coll", u.coll),
        member!(
            "descr_v4_t",
            EventDescrV4,
            "coll.seqNumber",
            u.coll.seq_number
        ),
        member!("descr_v4_t", EventDescrV4, "coll.func", u.coll.func),
        member!(
            "descr_v4_t",
            EventDescrV4,
            "coll.sendBuff",
            u.coll.send_buff
        ),
        member!(
            "descr_v4_t",
            EventDescrV4,
            "coll.recvBuff",
            u.coll.recv_buff
        ),
        member!("descr_v4_t", EventDescrV4, "coll.count", u.coll.count),
        member!("descr_v4_t", EventDescrV4, "coll.root", u.coll.root),
        member!("descr_v4_t", EventDescrV4, "coll.datatype", u.coll.datatype),
        member!(
            "descr_v4_t",
            EventDescrV4,
            "coll.nChannels",
            u.coll.n_channels
        ),
        member!("descr_v4_t", EventDescrV4, "coll.nWarps", u.coll.n_warps),
        member!("descr_v4_t", EventDescrV4, "coll.algo", u.coll.algo),
        member!("descr_v4_t", EventDescrV4, "coll.proto", u.coll.proto),
        member!("descr_v4_t", EventDescrV4, "p2p.func", u.p2p.func),
        member!("descr_v4_t", EventDescrV4, "p2p.buff", u.p2p.buff),
        member!("descr_v4_t", EventDescrV4, "p2p.datatype", u.p2p.datatype),
        member!("descr_v4_t", EventDescrV4, "p2p.count", u.p2p.count),
        member!("descr_v4_t", EventDescrV4, "p2p.peer", u.p2p.peer),
        member!(
            "descr_v4_t",
            EventDescrV4,
            "p2p.nChannels",
            u.p2p.n_channels
        ),
        member!("descr_v6_t", EventDescr, "parentObj", parent_obj),
        member!("descr_v6_t", EventDescr, "rank", rank),
        member!("descr_v6_t", EventDescr, "coll", u.coll),
        member!(
            "descr_v6_t",
            EventDescr,
            "groupApi.graphCaptured",
            u.group_api.graph_captured
        ),
        member!(
            "descr_v6_t",
            EventDescr,
            "groupApi.groupDepth",
            u.group_api.group_depth
        ),
        member!("descr_v6_t", EventDescr, "collApi.func", u.coll_api.func),
        member!("descr_v6_t", EventDescr, "collApi.count", u.coll_api.count),
        member!(
            "descr_v6_t",
            EventDescr,
            "collApi.datatype",
            u.coll_api.datatype
        ),
        member!("descr_v6_t", EventDescr, "collApi.root", u.coll_api.root),
        member!(
            "descr_v6_t",
            EventDescr,
            "collApi.stream",
            u.coll_api.stream
        ),
        member!(
            "descr_v6_t",
            EventDescr,
            "collApi.graphCaptured",
            u.coll_api.graph_captured
        ),
        member!("descr_v6_t", EventDescr, "p2pApi.func", u.p2p_api.func),
        member!("descr_v6_t", EventDescr, "p2pApi.count", u.p2p_api.count),
        member!(
            "descr_v6_t",
            EventDescr,
            "p2pApi.datatype",
            u.p2p_api.datatype
        ),
        member!("descr_v6_t", EventDescr, "p2pApi.stream", u.p2p_api.stream),
        member!(
            "descr_v6_t",
            EventDescr,
            "p2pApi.graphCaptured",
            u.p2p_api.graph_captured
        ),
        member!(
            "descr_v6_t",
            EventDescr,
            "coll.seqNumber",
            u.coll.seq_number
        ),
        member!("descr_v6_t", EventDescr, "coll.func", u.coll.func),
        member!("descr_v6_t", EventDescr, "coll.sendBuff", u.coll.send_buff),
        member!("descr_v6_t", EventDescr, "coll.recvBuff", u.coll.recv_buff),
        member!("descr_v6_t", EventDescr, "coll.count", u.coll.count),
        member!("descr_v6_t", EventDescr, "coll.root", u.coll.root),
        member!("descr_v6_t", EventDescr, "coll.datatype", u.coll.datatype),
        member!(
            "descr_v6_t",
            EventDescr,
            "coll.nChannels",
            u.coll.n_channels
        ),
        member!("descr_v6_t", EventDescr, "coll.nWarps", u.coll.n_warps),
        member!("descr_v6_t", EventDescr, "coll.algo", u.coll.algo),
        member!("descr_v6_t", EventDescr, "coll.proto", u.coll.proto),
        member!(
            "descr_v6_t",
            EventDescr,
            "coll.parentGroup",
            u.coll.parent_group
        ),
        member!("descr_v6_t", EventDescr, "p2p.func", u.p2p.func),
        member!("descr_v6_t", EventDescr, "p2p.buff", u.p2p.buff),
        member!("descr_v6_t", EventDescr, "p2p.datatype", u.p2p.datatype),
        member!("descr_v6_t", EventDescr, "p2p.count", u.p2p.count),
        member!("descr_v6_t", EventDescr, "p2p.peer", u.p2p.peer),
        member!("descr_v6_t", EventDescr, "p2p.nChannels", u.p2p.n_channels),
        member!(
            "descr_v6_t",
            EventDescr,
            "p2p.parentGroup",
            u.p2p.parent_group
        ),
        member!(
            "descr_v6_t",
            EventDescr,
            "ceColl.seqNumber",
            u.ce_coll.seq_number
        ),
        member!("descr_v6_t", EventDescr, "ceColl.func", u.ce_coll.func),
        member!(
            "descr_v6_t",
            EventDescr,
            "ceColl.sendBuff",
            u.ce_coll.send_buff
        ),
        member!(
            "descr_v6_t",
            EventDescr,
            "ceColl.recvBuff",
            u.ce_coll.recv_buff
        ),
        member!("descr_v6_t", EventDescr, "ceColl.count", u.ce_coll.count),
        member!("descr_v6_t", EventDescr, "ceColl.root", u.ce_coll.root),
        member!(
            "descr_v6_t",
            EventDescr,
            "ceColl.datatype",
            u.ce_coll.datatype
        ),
        member!(
            "descr_v6_t",
            EventDescr,
            "ceColl.syncStrategy",
            u.ce_coll.sync_strategy
        ),
        member!(
            "descr_v6_t",
            EventDescr,
            "ceColl.intraBatchSync",
            u.ce_coll.intra_batch_sync
        ),
        member!(
            "descr_v6_t",
            EventDescr,
            "ceColl.batchSize",
            u.ce_coll.batch_size
        ),
        member!(
            "descr_v6_t",
            EventDescr,
            "ceColl.numBatches",
            u.ce_coll.num_batches
        ),
        member!(
            "descr_v6_t",
            EventDescr,
            "ceColl.ceSeqNum",
            u.ce_coll.ce_seq_num
        ),
        member!("descr_v6_t", EventDescr, "ceColl.stream", u.ce_coll.stream),
        member!(
            "state_args_v1_t",
            StateArgsV1,
            "proxyOp.transSize",
            proxy_op.trans_size
        ),
        member!(
            "state_args_v1_t",
            StateArgsV1,
            "proxyOp.steps",
            proxy_op.steps
        ),
        member!(
            "state_args_v1_t",
            StateArgsV1,
            "proxyCtrl.appendedProxyOps",
            appended_proxy_ops
        ),
        member!(
            "state_args_v4_t",
            StateArgsV4,
            "proxyStep.transSize",
            trans_size
        ),
        member!(
            "state_args_v4_t",
            StateArgsV4,
            "proxyCtrl.appendedProxyOps",
            appended_proxy_ops
        ),
        member!(
            "state_args_v4_t",
            StateArgsV4,
            "netPlugin.data",
            net_plugin_data
        ),
        member!("state_args_v4_t", StateArgsV4, "kernelCh.pTimer", p_timer),
    ];
    let mut rust: HashMap<String, usize> = sizes.iter().map(|(t, n)| (t.to_string(), *n)).collect();
    for (t, m, off) in members {
        assert!(
            rust.insert(format!("{t}.{m}"), off).is_none(),
            "{t}.{m} listed twice"
        );
    }
    assert_eq!(
        c.len(),
        rust.len(),
        "C prints {} values, Rust has {}",
        c.len(),
        rust.len()
    );
    for (name, want) in &c {
        assert_eq!(rust.get(name), Some(want), "{name}: C says {want}");
    }
}
