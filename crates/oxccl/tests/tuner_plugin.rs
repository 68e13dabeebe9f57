//! A tuner plugin (`NCCL_TUNER_PLUGIN`) decides the host path's algorithm,
//! protocol and channel count: the C test tuner of oxccl-net, compiled with
//! cc to force each NCCL algorithm/protocol oxccl runs in turn, on four
//! ranks as threads. Every rank's plan must be the forced one and the
//! all-reduces it runs must be exact (count 0 and odd counts included); a
//! combination oxccl cannot run (NVLS, or Tree for all-gather) and a tuner
//! whose init fails leave oxccl's own plan. With ranks as processes, a
//! forced choice replaces the one-shot slots of small calls.

mod common;

use common::*;
use oxccl::{Algo, CollKind, Communicator, Proto, RedOp};
use oxccl_net::testing::{build_c_plugin, tuner_source};

const NRANKS: usize = 4;

fn tuner(defines: &[String], dir: &str) -> String {
    let d: Vec<&str> = defines.iter().map(String::as_str).collect();
    build_c_plugin(&tuner_source(), &d, dir, "libnccl-tuner-oxtest.so")
        .to_str()
        .unwrap()
        .to_string()
}

fn comms_with(tuner: Option<String>) -> Vec<Communicator> {
    let cfg = test_config(|h| h.tuner_plugin = tuner);
    init_threads(NRANKS, &cfg).expect("init")
}

/// Sums of `count` f32 per rank, exact (small integers).
fn check_all_reduce(comms: &[Communicator], count: usize) {
    on_ranks(comms, |c| {
        let r = c.rank();
        let send: Vec<f32> = (0..count).map(|i| ((i * 7 + r * 3) % 101) as f32).collect();
        let mut recv = vec![-1.0f32; count];
        c.all_reduce(&send, &mut recv, RedOp::Sum)
            .expect("all_reduce");
        for (i, got) in recv.iter().enumerate() {
            let want: f64 = (0..NRANKS).map(|q| ((i * 7 + q * 3) % 101) as f64).sum();
            assert_eq!(*got as f64, want, "rank {r}, element {i} of {count}");
        }
    });
}

#[test]
fn each_forced_algorithm_and_protocol_is_used() {
    let _w = Watchdog::new("tuner forcing", std::time::Duration::from_secs(300));
    let algos = [(Algo::Tree, 0), (Algo::Ring, 1)];
    let protos = [(Proto::LL, 0), (Proto::LL128, 1), (Proto::Simple, 2)];
    for (algo, a) in algos {
        for (proto, p) in protos {
            let nch = 1 + (a + p) % 2;
            let so = tuner(
                &[
                    "TUNER_VERSION=6".to_string(),
                    format!("FORCE_ALGO={a}"),
                    format!("FORCE_PROTO={p}"),
                    format!("FORCE_NCH={nch}"),
                ],
                &format!("oxccl-tuner-{a}-{p}"),
            );
            let comms = comms_with(Some(so));
            for bytes in [0usize, 8, 4004, 1 << 20] {
                let plans = on_ranks(&comms, |c| c.host_plan(CollKind::AllReduce, bytes).unwrap());
                for (r, plan) in plans.iter().enumerate() {
                    assert_eq!(
                        (plan.algo, plan.proto, plan.nchannels),
                        (algo, proto, nch),
                        "rank {r}, {bytes} bytes, forced {algo}/{proto}"
                    );
                }
            }
            // All-gather runs on rings only: a forced Tree is ignored.
            let plan = comms[0].host_plan(CollKind::AllGather, 1 << 16).unwrap();
            assert_eq!(plan.algo, Algo::Ring, "all-gather, forced {algo}/{proto}");
            for count in [0usize, 1, 1001, 262_147] {
                check_all_reduce(&comms, count);
            }
        }
    }
}

#[test]
fn impossible_choices_and_failed_init_leave_oxccls_plan() {
    let _w = Watchdog::new("tuner fallbacks", std::time::Duration::from_secs(120));
    let own = comms_with(Some("none".to_string()));
    let sizes = [8usize, 1 << 20];
    let own_plans: Vec<_> = sizes
        .iter()
        .map(|&b| own[0].host_plan(CollKind::AllReduce, b).unwrap())
        .collect();
    drop(own);
    // NVLS/Simple: ignored in oxccl's table, so the table comes back as given.
    let nvls = tuner(
        &[
            "TUNER_VERSION=5".to_string(),
            "FORCE_ALGO=4".to_string(),
            "FORCE_PROTO=2".to_string(),
        ],
        "oxccl-tuner-nvls",
    );
    let fails = tuner(&["FAIL_INIT".to_string()], "oxccl-tuner-fail-init");
    for so in [nvls, fails] {
        let comms = comms_with(Some(so.clone()));
        for (b, own) in sizes.iter().zip(&own_plans) {
            let plan = comms[0].host_plan(CollKind::AllReduce, *b).unwrap();
            assert_eq!(plan, *own, "{so}, {b} bytes");
        }
        check_all_reduce(&comms, 1001);
    }
}

/// Ranks as processes of one host, where small collectives take oxccl's
/// one-shot slots: a tuner's choice replaces them (the calls run on the
/// forced ring and protocol, results exact), one that leaves the table as
/// given keeps them.
#[test]
fn processes_small_calls_follow_the_tuner() {
    const TEST: &str = "processes_small_calls_follow_the_tuner";
    if let Some(ctx) = child_ctx() {
        let c = Communicator::init_rank_config(ctx.nranks, &ctx.id, ctx.rank, test_config(|_| {}))
            .unwrap();
        let forced = std::env::var("OXTEST_FORCED").is_ok_and(|v| v == "1");
        let plan = c.host_plan(CollKind::AllReduce, 8).unwrap();
        if forced {
            assert_eq!(
                (plan.algo, plan.proto, plan.nchannels),
                (Algo::Ring, Proto::LL, 1)
            );
        } else {
            assert_eq!(plan.algo, Algo::OneShot);
        }
        for count in [2usize, 0, 3, 1001] {
            let send: Vec<f32> = (0..count).map(|i| (i + ctx.rank) as f32).collect();
            let mut recv = vec![0f32; count];
            c.all_reduce(&send, &mut recv, RedOp::Sum).unwrap();
            for (i, v) in recv.iter().enumerate() {
                let want: usize = (0..ctx.nranks).map(|q| i + q).sum();
                assert_eq!(*v, want as f32, "rank {}, element {i} of {count}", ctx.rank);
            }
        }
        c.destroy().unwrap();
        return;
    }
    let _w = Watchdog::new(TEST, std::time::Duration::from_secs(200));
    let ring_ll = tuner(
        &[
            "TUNER_VERSION=6".to_string(),
            "FORCE_ALGO=1".to_string(),
            "FORCE_PROTO=0".to_string(),
            "FORCE_NCH=1".to_string(),
        ],
        "oxccl-tuner-procs-ring-ll",
    );
    let unchanged = tuner(
        &["TUNER_VERSION=6".to_string()],
        "oxccl-tuner-procs-unchanged",
    );
    for (so, forced) in [(ring_ll, "1"), (unchanged, "0")] {
        let id = oxccl::UniqueId::new().unwrap();
        let mut p = Procs::spawn(
            TEST,
            3,
            &id,
            &[
                ("NCCL_TUNER_PLUGIN", so.as_str()),
                ("OXTEST_FORCED", forced),
                ("NCCL_DEBUG", "INFO"),
                ("NCCL_DEBUG_SUBSYS", "COLL"),
            ],
        );
        p.expect_success(std::time::Duration::from_secs(150));
        // The 8-byte all-reduce as the executor logged it.
        let log = p.log(0);
        let line = log
            .lines()
            .find(|l| l.contains("AllReduce: opCount") && l.contains("count 2 "));
        if forced == "1" {
            let line = line.unwrap_or_else(|| panic!("no ring line for count 2:\n{log}"));
            assert!(line.contains("-> Algo Ring proto LL nchannels 1"), "{line}");
        } else {
            // The slots log no ring line.
            assert!(line.is_none(), "{log}");
        }
    }
}
