//! End to end: a child process (this test binary, re-executed) logs with
//! NCCL_DEBUG=INFO and NCCL_DEBUG_FILE=<dir>/x.%p; the parent checks the file's lines.

use std::process::Command;

const CHILD: &str = "OXENV_DEBUG_FILE_CHILD";

/// The child's half: `debug_file_gets_nccl_shaped_lines` runs it (with CHILD
/// set) in a process of its own.
#[test]
#[ignore = "child process of debug_file_gets_nccl_shaped_lines"]
fn child_logs() {
    assert!(
        std::env::var_os(CHILD).is_some(),
        "child_logs is the child of debug_file_gets_nccl_shaped_lines: it runs when that test starts it"
    );
    oxccl_env::set_device(2);
    oxccl_env::info!(oxccl_env::Subsys::INIT, "hello {} from init", 7);
    oxccl_env::info!(oxccl_env::Subsys::COLL, "filtered out by NCCL_DEBUG_SUBSYS");
    oxccl_env::trace!(oxccl_env::Subsys::INIT, "filtered out by NCCL_DEBUG");
    oxccl_env::warn!("something broke: {}", "peer 3");
    assert_eq!(
        oxccl_env::last_error().as_deref(),
        Some("something broke: peer 3")
    );
    assert_eq!(
        oxccl_env::params().get(&oxccl_core::params::BUFFSIZE),
        1 << 20
    );
    // A logging helper names its caller's line, not its own nor log.rs's.
    let before = line!();
    warn_for_caller(before + 1);
    // A wait reports itself (OXCCL_WAIT_NOTICE_MS=40: INFO at 40 ms, WARN at 80).
    let mut w = oxccl_env::log::Waiting::new(oxccl_env::Subsys::INIT);
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_millis(100) {
        w.tick(std::time::Duration::from_secs(2), || {
            "test: waiting for rank 1 of 2".to_string()
        });
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[track_caller]
fn warn_for_caller(expected_line: u32) {
    oxccl_env::log::log_here(
        oxccl_env::Level::Warn,
        oxccl_env::Subsys::ALL,
        format_args!("helper called at line {expected_line}"),
    );
}

#[test]
fn debug_file_gets_nccl_shaped_lines() {
    let dir = std::env::temp_dir().join(format!("oxccl-env-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("nccl.conf");
    std::fs::write(&conf, "# test\nNCCL_BUFFSIZE=1M\nNCCL_SHM_DISABLE=1\n").unwrap();
    let pattern = dir.join("x.%p");

    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--ignored",
        "--exact",
        "child_logs",
        "--nocapture",
        "--test-threads=1",
    ]);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("NCCL_") || k.starts_with("OXCCL_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .env(CHILD, "1")
        .env("HOME", &dir)
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_FILE", &pattern)
        .env("NCCL_CONF_FILE", &conf)
        .env("NCCL_SOCKET_IFNAM", "eth0")
        .env("OXCCL_WAIT_NOTICE_MS", "40")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let pid = out_pid(&dir);
    let text = std::fs::read_to_string(dir.join(format!("x.{pid}"))).unwrap();
    std::fs::remove_dir_all(&dir).ok();

    let lines: Vec<&str> = text.lines().collect();
    let prefix = |l: &str| -> (String, String) {
        // host:pid:tid [dev] rest
        let (head, rest) = l.split_once(' ').unwrap();
        let parts: Vec<&str> = head.split(':').collect();
        assert_eq!(parts.len(), 3, "{l}");
        assert_eq!(parts[1], pid.to_string(), "{l}");
        assert!(parts[2].parse::<u64>().unwrap() > 0, "{l}");
        (parts[0].to_string(), rest.to_string())
    };
    let body: Vec<(String, String)> = lines
        .iter()
        .filter(|l| !l.is_empty())
        .map(|l| {
            // Strip the WARN timestamp "[YYYY-MM-DD HH:MM:SS] ".
            let l = if l.starts_with('[') { &l[22..] } else { l };
            prefix(l)
        })
        .collect();
    let rests: Vec<&str> = body.iter().map(|(_, r)| r.as_str()).collect();
    let conf = conf.display();
    // The typo's WARN names the registry's line that found it.
    let warn_src = "[2] oxccl-core/src/params.rs:";
    assert!(
        rests[0].starts_with(warn_src)
            && rests[0].ends_with(
                " NCCL WARN NCCL_SOCKET_IFNAM is not a known variable; did you mean NCCL_SOCKET_IFNAME?"
            ),
        "{text}"
    );
    let expected_info = [
        "[2] NCCL INFO NCCL_DEBUG set by environment to INFO.".to_string(),
        format!(
            "[2] NCCL INFO NCCL_DEBUG_FILE set by environment to {}.",
            pattern.display()
        ),
        format!("[2] NCCL INFO NCCL_CONF_FILE set by environment to {conf}."),
        format!("[2] NCCL INFO NCCL_SHM_DISABLE set by configuration file {conf} to 1."),
        format!("[2] NCCL INFO NCCL_BUFFSIZE set by configuration file {conf} to 1M."),
        "[2] NCCL INFO hello 7 from init".to_string(),
    ];
    assert_eq!(
        &rests[1..7],
        &expected_info.iter().map(String::as_str).collect::<Vec<_>>()[..],
        "{text}"
    );
    assert!(
        rests[7].starts_with("[2] oxccl-env/tests/debug_file.rs:")
            && rests[7].ends_with(" NCCL WARN something broke: peer 3"),
        "{text}"
    );
    let helper = rests[8];
    let (at, msg) = helper
        .split_once(" NCCL WARN helper called at line ")
        .unwrap();
    assert_eq!(
        at,
        format!("[2] oxccl-env/tests/debug_file.rs:{msg}"),
        "{text}"
    );
    assert!(
        rests[9].starts_with("[2] NCCL INFO test: waiting for rank 1 of 2 (waited 0."),
        "{text}"
    );
    assert!(
        rests[10].starts_with("[2] oxccl-env/tests/debug_file.rs:")
            && rests[10].contains(" NCCL WARN test: waiting for rank 1 of 2 (waited 0.")
            && rests[10].ends_with(" s of 2 s)"),
        "{text}"
    );
    assert_eq!(rests.len(), 11, "{text}");
    // WARN lines start with an empty line and a timestamp.
    let warn_line = lines
        .iter()
        .position(|l| l.contains("something broke"))
        .unwrap();
    assert_eq!(lines[warn_line - 1], "");
    assert!(lines[warn_line].starts_with('[') && lines[warn_line].as_bytes()[21] == b' ');
    // Nothing went to stdout besides the test harness's own lines.
    assert!(!String::from_utf8_lossy(&out.stdout).contains("NCCL INFO"));
}

/// The pid of the child: the only x.<pid> file in `dir`.
fn out_pid(dir: &std::path::Path) -> u32 {
    let names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_prefix("x.").map(str::to_string))
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    names[0].parse().unwrap()
}
