//! `NCCL_TOPO_FILE` and `NCCL_TOPO_DUMP_FILE` in the library: two ranks as
//! processes read a recorded 8-GPU machine's topology from a file instead
//! of this machine's sysfs tree, and the dumping rank
//! (`NCCL_TOPO_DUMP_FILE_RANK`) writes what it used: the same topology as
//! the file. A file that does not exist is named in a WARN, the job runs,
//! and the dump is this machine's own tree.

mod common;

use common::*;
use oxccl::topo::Topology;
use oxccl::{Communicator, RedOp};
use std::time::Duration;

const TEST: &str = "the_topology_file_is_what_the_library_uses_and_dumps";

fn fixture() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../oxccl-cli/tests/fixtures/dgx8/topo.xml")
}

/// One job of two processes with `env`; the topology rank 1 dumped.
fn run_job(dump: &std::path::Path, env: &[(&str, &str)]) -> (Topology, String) {
    let _ = std::fs::remove_file(dump);
    let dump_s = dump.to_str().unwrap();
    let mut all = vec![
        ("NCCL_TOPO_DUMP_FILE", dump_s),
        ("NCCL_TOPO_DUMP_FILE_RANK", "1"),
        ("NCCL_DEBUG", "WARN"),
    ];
    all.extend_from_slice(env);
    let id = oxccl::UniqueId::new().unwrap();
    let mut p = Procs::spawn(TEST, 2, &id, &all);
    p.expect_success(Duration::from_secs(60));
    let text = std::fs::read_to_string(dump)
        .unwrap_or_else(|e| panic!("no dump at {dump_s} ({e}):\n{}", p.all_logs()));
    (
        Topology::from_xml(&text).expect("the dump parses"),
        p.all_logs(),
    )
}

#[test]
fn the_topology_file_is_what_the_library_uses_and_dumps() {
    if let Some(ctx) = child_ctx() {
        let c = Communicator::init_rank_config(ctx.nranks, &ctx.id, ctx.rank, test_config(|_| {}))
            .expect("init");
        let mut x = [ctx.rank as f32 + 1.0];
        c.all_reduce_in_place(&mut x, RedOp::Sum)
            .expect("all_reduce");
        assert_eq!(x[0], 3.0);
        // Only the dumping rank wrote; both agree it exists by now.
        event("done");
        return;
    }
    let _w = Watchdog::new(TEST, Duration::from_secs(150));
    let dir = std::env::temp_dir().join(format!("oxccl-topo-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dump = dir.join("dump.xml");
    let file = fixture();
    let want = Topology::from_xml(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(want.gpus().len(), 8, "the fixture is the 8-GPU machine");

    let (got, _) = run_job(&dump, &[("NCCL_TOPO_FILE", file.to_str().unwrap())]);
    assert_eq!(got, want, "the dump is the file's topology");

    let (got, logs) = run_job(&dump, &[("NCCL_TOPO_FILE", "/nonexistent/topo.xml")]);
    assert_eq!(got, oxccl::topo::read_sysfs(std::path::Path::new("/")));
    assert!(
        logs.contains("NCCL_TOPO_FILE=/nonexistent/topo.xml cannot be used"),
        "the missing file is named:\n{logs}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
