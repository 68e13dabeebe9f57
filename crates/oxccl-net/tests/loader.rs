//! The plugin loader and the `ncclNet` ABI against real libraries: the repo's
//! test plugin (`libnccl-net-oxtest`, built here by cargo, in its default
//! form exporting v12 down to v8 and in its `only-v8` and `only-v11` forms),
//! a library that
//! exports no plugin symbol (libm), a file that does not exist, and a plugin
//! whose `init` fails.
//!
//! Each scenario runs in a fresh process (this binary re-run as the test
//! `loader_worker` with `OXNET_SCENARIO` set), because the environment is read
//! once per process and a library is initialised once per process.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use oxccl_net::{choose, CommRef, DeviceMemory, Net, NetSettings, Network, Poll};

// ---------------------------------------------------------------- building

/// Builds the test plugin (with `features`) into a target directory beside
/// this test's and returns the `.so`, copied as `libnccl-net-oxtest.so` into
/// a directory of its own (the name NCCL's rules give `oxtest`).
fn plugin(features: &str) -> PathBuf {
    static DEFAULT: OnceLock<PathBuf> = OnceLock::new();
    static ONLY_V8: OnceLock<PathBuf> = OnceLock::new();
    static ONLY_V11: OnceLock<PathBuf> = OnceLock::new();
    let cell = match features {
        "" => &DEFAULT,
        "only-v8" => &ONLY_V8,
        "only-v11" => &ONLY_V11,
        f => panic!("no cell for the test plugin's features {f:?}"),
    };
    cell.get_or_init(|| oxccl_net::testing::build_test_plugin(features, "net"))
        .clone()
}

/// Runs `scenario` in a child with `env`; returns its combined output.
fn run(scenario: &str, env: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--ignored",
        "--exact",
        "loader_worker",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("OXNET_SCENARIO", scenario)
    .env("NCCL_DEBUG", "INFO")
    .env("NCCL_DEBUG_SUBSYS", "INIT,NET")
    .env_remove("NCCL_NET_PLUGIN")
    .env_remove("NCCL_NET")
    .env_remove("NCCL_IB_DISABLE")
    .env_remove("NCCL_IB_HCA")
    .env_remove("NCCL_DEBUG_FILE");
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
        out.status.success() && text.contains("OXNET_DONE"),
        "scenario {scenario} failed ({}):\n{text}",
        out.status
    );
    text
}

fn settings_from_env() -> NetSettings {
    let v = |k: &str| std::env::var(k).ok().filter(|s| !s.is_empty());
    NetSettings {
        plugin: v("NCCL_NET_PLUGIN"),
        net: v("NCCL_NET"),
        ib_disable: v("NCCL_IB_DISABLE").is_some_and(|s| s != "0"),
        ib_hca: v("NCCL_IB_HCA"),
        ..NetSettings::default()
    }
}

// ---------------------------------------------------------------- worker side

/// One channel connected to itself through the plugin: its two ends.
fn loopback_pair(net: &dyn Net, dev: usize) -> (oxccl_net::SendComm, oxccl_net::RecvComm) {
    let (mut handle, listen) = net.listen(dev).expect("listen");
    let t0 = Instant::now();
    let (mut send, mut recv) = (None, None);
    let mut connect_calls = 0;
    while send.is_none() || recv.is_none() {
        if send.is_none() {
            connect_calls += 1;
            send = net.connect(dev, &mut handle).expect("connect");
        }
        if recv.is_none() {
            recv = net.accept(&listen).expect("accept");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "connect/accept stuck"
        );
    }
    assert!(
        connect_calls >= 2,
        "the plugin's first connect returns NULL"
    );
    net.close_listen(listen).expect("closeListen");
    (send.unwrap(), recv.unwrap())
}

/// The GPU-memory entries on host memory (this machine may have no GPU):
/// the properties a plugin declares, and `regMr(NCCL_PTR_CUDA)`,
/// `regMrDmaBuf` and `iflush` refused by the plugin with its code, named
/// in the error.
fn gpu_memory_entries(net: &dyn Net, dev: usize) {
    let p = net.properties(dev).expect("properties");
    println!(
        "OXNET_PROPS cuda={} dmabuf={} host={} force_flush={}",
        p.supports_cuda(),
        p.supports_dmabuf(),
        p.supports_host(),
        p.force_flush
    );
    let (send, recv) = loopback_pair(net, dev);
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` is host memory the plugin must refuse as GPU memory;
    // nothing is registered when it does.
    let e = unsafe {
        net.reg_mr_device(
            CommRef::Send(&send),
            buf.as_mut_ptr(),
            buf.len(),
            DeviceMemory::Address,
        )
    }
    .expect_err("host memory registered as GPU memory");
    println!("OXNET_REGCUDA {}", e.message());
    // SAFETY: as above; the descriptor is not open.
    let e = unsafe {
        net.reg_mr_device(
            CommRef::Recv(&recv),
            buf.as_mut_ptr(),
            buf.len(),
            DeviceMemory::DmaBuf { fd: -1, offset: 0 },
        )
    }
    .expect_err("a closed descriptor registered");
    println!("OXNET_REGDMABUF {}", e.message());
    // SAFETY: `buf` outlives the registration (deregistered below).
    let mr = unsafe { net.reg_mr(CommRef::Recv(&recv), buf.as_mut_ptr(), buf.len()) }
        .expect("regMr host");
    // SAFETY: a host registration: the plugin refuses to flush it.
    match unsafe { net.iflush(&recv, buf.as_mut_ptr(), 64, &mr) } {
        Err(e) => println!("OXNET_FLUSH {}", e.message()),
        Ok(r) => println!("OXNET_FLUSH accepted {}", r.is_some()),
    }
    net.dereg_mr(CommRef::Recv(&recv), mr).expect("deregMr");
    net.close_send(send).expect("closeSend");
    net.close_recv(recv).expect("closeRecv");
}

/// Connects one channel to itself through the plugin and moves messages of
/// several sizes both ways, checking every byte; then a message larger than
/// the posted receive must fail the receive.
fn loopback_traffic(net: &dyn Net, dev: usize) {
    let (send, recv) = loopback_pair(net, dev);
    let mut sbuf = vec![0u8; 1 << 20];
    let mut rbuf = vec![0u8; 1 << 20];
    // SAFETY: both buffers outlive their registrations (deregistered below).
    let smr = unsafe { net.reg_mr(CommRef::Send(&send), sbuf.as_mut_ptr(), sbuf.len()) }
        .expect("regMr send");
    // SAFETY: as above.
    let rmr = unsafe { net.reg_mr(CommRef::Recv(&recv), rbuf.as_mut_ptr(), rbuf.len()) }
        .expect("regMr recv");
    for (i, len) in [8usize, 1, 4096, 777_777, 1 << 20].into_iter().enumerate() {
        for (j, b) in sbuf[..len].iter_mut().enumerate() {
            *b = (j * 31 + i * 7) as u8;
        }
        rbuf.fill(0xee);
        // SAFETY: rbuf is registered and untouched until the request is done.
        let rr = unsafe { net.irecv(&recv, rbuf.as_mut_ptr(), rbuf.len(), 5, &rmr) }
            .expect("irecv")
            .expect("irecv request");
        // SAFETY: sbuf is registered and untouched until the request is done.
        let sr = unsafe { net.isend(&send, sbuf.as_ptr(), len, 5, &smr) }
            .expect("isend")
            .expect("isend request");
        let (mut sr, mut rr) = (Some(sr), Some(rr));
        let (mut sent, mut got) = (None, None);
        let t0 = Instant::now();
        while sent.is_none() || got.is_none() {
            if let Some(r) = sr.take() {
                match net.test(r).expect("test send") {
                    Poll::Done(n) => sent = Some(n),
                    Poll::Pending(r) => sr = Some(r),
                }
            }
            if let Some(r) = rr.take() {
                match net.test(r).expect("test recv") {
                    Poll::Done(n) => got = Some(n),
                    Poll::Pending(r) => rr = Some(r),
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "transfer stuck");
        }
        assert_eq!(sent, Some(len), "bytes sent");
        assert_eq!(got, Some(len), "bytes received");
        assert_eq!(&rbuf[..len], &sbuf[..len], "payload of message {i}");
        assert!(
            rbuf[len..].iter().all(|&b| b == 0xee),
            "wrote past the message"
        );
    }
    // A message larger than the posted receive: the receive fails.
    // SAFETY: as above (a 64-byte receive into rbuf).
    let rr = unsafe { net.irecv(&recv, rbuf.as_mut_ptr(), 64, 5, &rmr) }
        .expect("irecv")
        .expect("irecv request");
    // SAFETY: as above.
    let sr = unsafe { net.isend(&send, sbuf.as_ptr(), 4096, 5, &smr) }
        .expect("isend")
        .expect("isend request");
    let (mut sr, mut rr) = (Some(sr), Some(rr));
    let t0 = Instant::now();
    let err = loop {
        if let Some(r) = sr.take() {
            if let Poll::Pending(r) = net.test(r).expect("test send") {
                sr = Some(r);
            }
        }
        if let Some(r) = rr.take() {
            match net.test(r) {
                Err(e) => break e,
                Ok(Poll::Done(n)) => panic!("a 4096-byte message fit a 64-byte receive ({n})"),
                Ok(Poll::Pending(r)) => rr = Some(r),
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "truncation not reported"
        );
    };
    println!("OXNET_TRUNCATION {err}");
    net.dereg_mr(CommRef::Send(&send), smr).expect("deregMr");
    net.dereg_mr(CommRef::Recv(&recv), rmr).expect("deregMr");
    net.close_send(send).expect("closeSend");
    net.close_recv(recv).expect("closeRecv");
}

/// The entry of every child, started by the loader tests with its scenario
/// in `OXNET_SCENARIO`.
#[test]
#[ignore = "child process of the loader tests"]
fn loader_worker() {
    let Ok(scenario) = std::env::var("OXNET_SCENARIO") else {
        panic!("loader_worker is the child of a loader test: it runs when a test starts it");
    };
    let s = settings_from_env();
    match scenario.as_str() {
        "choose" => match choose(&s) {
            Ok(Network::Socket { reason }) => println!("OXNET_SOCKET {reason}"),
            Ok(Network::Plugin {
                net, dev, props, ..
            }) => {
                println!(
                    "OXNET_PLUGIN name={} dev={dev} devname={} version={}",
                    net.name(),
                    props.name,
                    match oxccl_net::load(
                        oxccl_net::library_candidates(s.plugin.as_deref()).as_deref()
                    ) {
                        oxccl_net::LoadOutcome::Loaded(p) => p.version().symbol().to_string(),
                        o => format!("{o:?}"),
                    }
                );
            }
            Err(e) => println!("OXNET_ERR kind={:?} msg={}", e.kind(), e.message()),
        },
        "traffic" => match choose(&s).expect("choose") {
            Network::Plugin { net, dev, .. } => loopback_traffic(&*net, dev),
            n => panic!("expected a plugin, got {n:?}"),
        },
        "gpu_memory" => match choose(&s).expect("choose") {
            Network::Plugin { net, dev, .. } => gpu_memory_entries(&*net, dev),
            n => panic!("expected a plugin, got {n:?}"),
        },
        other => panic!("unknown scenario {other}"),
    }
    println!("OXNET_DONE");
}

// ---------------------------------------------------------------- tests

fn field<'a>(out: &'a str, tag: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.find(tag).map(|i| &l[i + tag.len()..]))
        .unwrap_or_else(|| panic!("no {tag} line in:\n{out}"))
        .trim()
}

#[test]
fn newest_version_is_chosen_and_plugin_logs_reach_nccl_debug() {
    let so = plugin("");
    let out = run("choose", &[("NCCL_NET_PLUGIN", so.to_str().unwrap())]);
    let line = field(&out, "OXNET_PLUGIN");
    assert!(line.contains("name=oxtest"), "{out}");
    assert!(line.contains("version=ncclNetPlugin_v12"), "{out}");
    // The plugin's own printf-style line, formatted by the shim, in our log.
    assert!(
        out.contains("NET/oxtest: ") && out.contains(" device(s): "),
        "{out}"
    );
    assert!(
        out.contains("NET/Plugin: loaded") && out.contains("through ncclNetPlugin_v12"),
        "{out}"
    );
    assert!(
        out.contains("NET: using network oxtest (NET/oxtest) device 0"),
        "{out}"
    );
}

#[test]
fn v8_only_library_gets_v8() {
    let so = plugin("only-v8");
    let out = run("choose", &[("NCCL_NET_PLUGIN", so.to_str().unwrap())]);
    assert!(
        field(&out, "OXNET_PLUGIN").contains("version=ncclNetPlugin_v8"),
        "{out}"
    );
}

#[test]
fn v11_only_library_gets_v11() {
    let so = plugin("only-v11");
    let out = run("choose", &[("NCCL_NET_PLUGIN", so.to_str().unwrap())]);
    assert!(
        field(&out, "OXNET_PLUGIN").contains("version=ncclNetPlugin_v11"),
        "{out}"
    );
}

#[test]
fn name_rule_finds_libnccl_net_name_so() {
    let so = plugin("");
    let dir = so.parent().unwrap();
    let out = run(
        "choose",
        &[
            ("NCCL_NET_PLUGIN", "oxtest"),
            ("LD_LIBRARY_PATH", dir.to_str().unwrap()),
        ],
    );
    assert!(field(&out, "OXNET_PLUGIN").contains("name=oxtest"), "{out}");
    assert!(out.contains("loaded libnccl-net-oxtest.so"), "{out}");
}

#[test]
fn abi_data_path_v12_v11_and_v8() {
    // v11 and v12 plugins fail listen/connect given another context than
    // the one their init returned, so this also proves the context is kept.
    for f in ["", "only-v11", "only-v8"] {
        let so = plugin(f);
        let out = run("traffic", &[("NCCL_NET_PLUGIN", so.to_str().unwrap())]);
        let t = field(&out, "OXNET_TRUNCATION");
        assert!(t.contains("test returned 2"), "{f}: {out}");
        assert!(out.contains("larger than the posted receive"), "{f}: {out}");
    }
}

/// The GPU-memory side of the ABI in every version the test plugin
/// builds: what the device declares (`NCCL_PTR_CUDA`, `NCCL_PTR_DMABUF`,
/// `forceFlush` from v9), and the plugin's refusals of host memory as GPU
/// memory, of a closed DMA-BUF descriptor and of a flush of host memory,
/// each an error naming the entry and the plugin's code.
#[test]
fn gpu_memory_entries_v12_v11_and_v8() {
    for f in ["", "only-v11", "only-v8"] {
        let so = plugin(f);
        let plain = run("gpu_memory", &[("NCCL_NET_PLUGIN", so.to_str().unwrap())]);
        assert!(
            field(&plain, "OXNET_PROPS").starts_with("cuda=false dmabuf=false host=true"),
            "{f}: {plain}"
        );
        let out = run(
            "gpu_memory",
            &[
                ("NCCL_NET_PLUGIN", so.to_str().unwrap()),
                ("OXTEST_NET_PTR", "cuda,dmabuf"),
                ("OXTEST_NET_FORCE_FLUSH", "1"),
            ],
        );
        let props = field(&out, "OXNET_PROPS");
        assert!(
            props.starts_with("cuda=true dmabuf=true host=true"),
            "{f}: {out}"
        );
        // v8's properties have no forceFlush.
        let flush = if f == "only-v8" { "false" } else { "true" };
        assert!(
            props.ends_with(&format!("force_flush={flush}")),
            "{f}: {out}"
        );
        let reg = field(&out, "OXNET_REGCUDA");
        assert!(
            reg.contains("regMr(NCCL_PTR_CUDA) returned 4"),
            "{f}: {reg}"
        );
        let dmabuf = field(&out, "OXNET_REGDMABUF");
        assert!(dmabuf.contains("regMrDmaBuf returned 4"), "{f}: {dmabuf}");
        assert!(out.contains("descriptor -1 is not open"), "{f}: {out}");
        let fl = field(&out, "OXNET_FLUSH");
        assert!(fl.contains("iflush returned 4"), "{f}: {fl}");
    }
}

#[test]
fn missing_library_warns_and_falls_back() {
    let out = run("choose", &[("NCCL_NET_PLUGIN", "nosuchplugin")]);
    let reason = field(&out, "OXNET_SOCKET");
    assert!(reason.contains("libnccl-net-nosuchplugin.so"), "{out}");
    assert!(
        out.contains("WARN NET/Plugin: NCCL_NET_PLUGIN=nosuchplugin")
            && out.contains("falling back to oxccl's sockets"),
        "{out}"
    );
    // Unset and no libnccl-net.so: sockets, no WARN.
    let out = run("choose", &[]);
    assert!(
        field(&out, "OXNET_SOCKET").contains("libnccl-net.so not found"),
        "{out}"
    );
    assert!(!out.contains("WARN"), "{out}");
    let out = run("choose", &[("NCCL_NET_PLUGIN", "none")]);
    assert!(
        field(&out, "OXNET_SOCKET").contains("NCCL_NET_PLUGIN=none"),
        "{out}"
    );
}

#[test]
fn library_without_version_symbol_warns_and_falls_back() {
    // libm opens (found as is after libnccl-net-libm.so.6.so) but exports no
    // ncclNetPlugin_vN.
    let out = run("choose", &[("NCCL_NET_PLUGIN", "libm.so.6")]);
    let reason = field(&out, "OXNET_SOCKET");
    assert!(reason.contains("plugin libm.so.6 cannot be used"), "{out}");
    assert!(reason.contains("exports none of the versions"), "{out}");
    assert!(out.contains("WARN NET/Plugin: plugin libm.so.6"), "{out}");
}

#[test]
fn init_failure_warns_and_falls_back() {
    let so = plugin("");
    let out = run(
        "choose",
        &[
            ("NCCL_NET_PLUGIN", so.to_str().unwrap()),
            ("OXTEST_NET_FAIL_INIT", "1"),
        ],
    );
    let reason = field(&out, "OXNET_SOCKET");
    assert!(
        reason.contains("init returned 2 (ncclSystemError)"),
        "{out}"
    );
    // The plugin's own WARN came through the logger too.
    assert!(out.contains("init fails on purpose"), "{out}");
}

#[test]
fn nccl_net_ib_disable_and_ib_hca() {
    let so = plugin("");
    let p = so.to_str().unwrap();
    // NCCL_NET=Socket: sockets, plugin not even loaded.
    let out = run("choose", &[("NCCL_NET_PLUGIN", p), ("NCCL_NET", "Socket")]);
    assert_eq!(field(&out, "OXNET_SOCKET"), "NCCL_NET=Socket", "{out}");
    assert!(!out.contains("NET/Plugin: loaded"), "{out}");
    // NCCL_NET naming the plugin's network (any case): chosen.
    let out = run("choose", &[("NCCL_NET_PLUGIN", p), ("NCCL_NET", "OXTEST")]);
    assert!(field(&out, "OXNET_PLUGIN").contains("name=oxtest"), "{out}");
    // NCCL_NET naming a network that is not there: an error, not a fallback.
    let out = run("choose", &[("NCCL_NET_PLUGIN", p), ("NCCL_NET", "IB")]);
    let e = field(&out, "OXNET_ERR");
    assert!(
        e.contains("InvalidUsage") && e.contains("NCCL_NET=IB"),
        "{out}"
    );
    // A plugin calling itself IB with NCCL_IB_DISABLE=1: not used.
    let ib = [("NCCL_NET_PLUGIN", p), ("OXTEST_NET_NAME", "IB")];
    let out = run("choose", &[ib[0], ib[1], ("NCCL_IB_DISABLE", "1")]);
    assert!(
        field(&out, "OXNET_SOCKET").contains("NCCL_IB_DISABLE=1"),
        "{out}"
    );
    // NCCL_IB_HCA picks the device by name (three devices oxnic0..2).
    let three = ("OXTEST_NET_DEVICES", "3");
    let out = run("choose", &[ib[0], ib[1], three, ("NCCL_IB_HCA", "=oxnic2")]);
    assert!(
        field(&out, "OXNET_PLUGIN").contains("devname=oxnic2"),
        "{out}"
    );
    let out = run("choose", &[ib[0], ib[1], three, ("NCCL_IB_HCA", "^oxnic0")]);
    assert!(
        field(&out, "OXNET_PLUGIN").contains("devname=oxnic1"),
        "{out}"
    );
    let out = run("choose", &[ib[0], ib[1], ("NCCL_IB_HCA", "nomatch0")]);
    assert!(
        field(&out, "OXNET_SOCKET").contains("NCCL_IB_HCA allows none"),
        "{out}"
    );
    assert!(out.contains("WARN NET/Plugin"), "{out}");
    // NCCL_IB_HCA does not filter a network that is not IB.
    let out = run(
        "choose",
        &[("NCCL_NET_PLUGIN", p), ("NCCL_IB_HCA", "nomatch0")],
    );
    assert!(field(&out, "OXNET_PLUGIN").contains("name=oxtest"), "{out}");
}
