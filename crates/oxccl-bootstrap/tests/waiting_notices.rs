//! A waiting rank says so: INFO lines while it waits and one WARN past the
//! threshold, naming who is missing and where it waits. Each scenario runs in
//! a child process (this test binary, re-executed) with `NCCL_DEBUG=INFO` and
//! the internal `OXCCL_WAIT_NOTICE_MS=200` (INFO every 0.2 s, WARN at 0.4 s
//! instead of 5 s and 10 s); the parent reads its log.

use std::process::Command;
use std::time::Duration;

use oxccl_bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
use oxccl_core::ErrorKind;

const CHILD: &str = "OXBOOT_WAIT_CHILD";

fn cfg(init_ms: u64) -> BootstrapConfig {
    BootstrapConfig {
        ifname: Some("lo".into()),
        init_timeout: Duration::from_millis(init_ms),
        timeout: Duration::from_secs(10),
        ..Default::default()
    }
}

fn scenario() -> Option<String> {
    std::env::var(CHILD).ok()
}

/// Runs `name` in a child and returns its stdout (the log).
fn run_child(name: &str) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"]);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("NCCL_") || k.starts_with("OXCCL_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .env(CHILD, name)
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "BOOTSTRAP")
        .env("OXCCL_WAIT_NOTICE_MS", "200")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "child {name} failed:\n{log}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    log
}

/// The log's lines that contain every one of `parts`.
fn lines_with<'a>(log: &'a str, parts: &[&str]) -> Vec<&'a str> {
    log.lines()
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .collect()
}

#[test]
fn root_and_rank_0_say_rank_1_is_missing() {
    const NAME: &str = "root_and_rank_0_say_rank_1_is_missing";
    if scenario().as_deref() == Some(NAME) {
        // Rank 1 never starts; rank 0 (whose process holds the root) waits.
        let c = cfg(1500);
        let id = UniqueId::generate(&c).unwrap();
        let e = Bootstrap::init(&id, 2, 0, &c).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        assert!(e.message().contains("rank 1 of 2"), "{e}");
        return;
    }
    if scenario().is_some() {
        return;
    }
    let log = run_child(NAME);
    // The root: INFO lines naming the missing rank, then one WARN from root.rs.
    let root_wait = [
        "waiting for rank 1 of 2 to connect, 1 connected (waited ",
        " s of 1.5 s)",
    ];
    let infos = lines_with(
        &log,
        &[
            &["NCCL INFO bootstrap: root at 127.0.0.1:"][..],
            &root_wait[..],
        ]
        .concat(),
    );
    assert!(infos.len() >= 2, "{log}");
    let warns = lines_with(
        &log,
        &[&["NCCL WARN bootstrap: root at"][..], &root_wait[..]].concat(),
    );
    assert_eq!(warns.len(), 1, "{log}");
    assert!(warns[0].contains(" oxccl-bootstrap/src/root.rs:"), "{log}");
    // Rank 0: waits for the root's table, and says so.
    let rank0 = lines_with(
        &log,
        &[
            "NCCL INFO bootstrap: rank 0 of 2 waiting for the root at 127.0.0.1:",
            "to send the rank table",
        ],
    );
    assert!(!rank0.is_empty(), "{log}");
    let rank0_warn = lines_with(
        &log,
        &["NCCL WARN bootstrap: rank 0 of 2 waiting for the root"],
    );
    assert_eq!(rank0_warn.len(), 1, "{log}");
    assert!(
        rank0_warn[0].contains(" oxccl-bootstrap/src/bootstrap.rs:"),
        "{log}"
    );
    // Then the error naming rank 1, as before.
    assert!(
        log.contains("rank 1 of 2 never connected to the root"),
        "{log}"
    );
}

#[test]
fn a_rank_waiting_for_the_root_says_so() {
    const NAME: &str = "a_rank_waiting_for_the_root_says_so";
    if scenario().as_deref() == Some(NAME) {
        // NCCL_COMM_ID names a port where no root listens yet (rank 0 never
        // starts): rank 1 retries its connect until the init timeout.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut c = cfg(1200);
        c.comm_id = Some(format!("127.0.0.1:{port}"));
        let id = UniqueId::generate(&c).unwrap();
        let e = Bootstrap::init(&id, 2, 1, &c).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        println!("PORT {port}");
        return;
    }
    if scenario().is_some() {
        return;
    }
    let log = run_child(NAME);
    let port = log
        .lines()
        .find_map(|l| l.strip_prefix("PORT "))
        .expect("the child prints its port");
    let what = format!("waiting to connect to the root at 127.0.0.1:{port}");
    assert!(
        !lines_with(&log, &["NCCL INFO bootstrap: ", &what]).is_empty(),
        "{log}"
    );
    let warns = lines_with(&log, &["NCCL WARN bootstrap: ", &what]);
    assert_eq!(warns.len(), 1, "{log}");
    assert!(warns[0].contains("refused"), "{log}");
}

#[test]
fn allgather_and_barrier_name_the_late_peer() {
    const NAME: &str = "allgather_and_barrier_name_the_late_peer";
    if scenario().as_deref() == Some(NAME) {
        let c = cfg(10_000);
        let id = UniqueId::generate(&c).unwrap();
        std::thread::scope(|s| {
            for r in 0..2 {
                let (id, c) = (&id, &c);
                s.spawn(move || {
                    let b = Bootstrap::init(id, 2, r, c).unwrap();
                    // Rank 1 is late to each collective by 0.7 s.
                    if r == 1 {
                        std::thread::sleep(Duration::from_millis(700));
                    }
                    b.allgather(&[r as u8]).unwrap();
                    if r == 1 {
                        std::thread::sleep(Duration::from_millis(700));
                    }
                    b.barrier().unwrap();
                });
            }
        });
        return;
    }
    if scenario().is_some() {
        return;
    }
    let log = run_child(NAME);
    for what in [
        "bootstrap allgather: rank 0 of 2 waiting for rank 1",
        "bootstrap barrier (arrival): rank 0 of 2 waiting for rank 1",
    ] {
        assert!(
            !lines_with(&log, &["NCCL INFO ", what]).is_empty(),
            "{what}\n{log}"
        );
        let warns = lines_with(&log, &["NCCL WARN ", what]);
        assert_eq!(warns.len(), 1, "{what}\n{log}");
        assert!(
            warns[0].contains(" oxccl-bootstrap/src/bootstrap.rs:"),
            "{log}"
        );
    }
    // Rank 1 waited for nobody.
    assert!(
        lines_with(&log, &["rank 1 of 2 waiting"]).is_empty(),
        "{log}"
    );
}
