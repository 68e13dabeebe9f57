//! A C-API call's WARN names the source line that found the error (here the
//! handle check in handle.rs), not the API boundary's own line, which every
//! error's WARN named before.

use nccl::abi::*;
use nccl::*;

#[test]
fn a_refused_call_warns_from_the_line_that_refused_it() {
    let dir = std::env::temp_dir().join(format!("oxccl-warn-origin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("log");
    // The logger reads its settings at its first line; this binary has one test.
    std::env::set_var("NCCL_DEBUG", "WARN");
    std::env::set_var("NCCL_DEBUG_FILE", &file);
    let mut n = 0;
    assert_eq!(
        // SAFETY: a NULL communicator is checked, not dereferenced.
        unsafe { ncclCommCount(std::ptr::null_mut(), &mut n) },
        ncclInvalidArgument
    );
    let log = std::fs::read_to_string(&file).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("comm is NULL"))
        .unwrap_or_else(|| panic!("no WARN for the NULL comm in {log:?}"));
    assert!(line.contains("NCCL WARN"), "{line}");
    assert!(line.contains("oxccl-nccl/src/handle.rs:"), "{line}");
    assert!(!line.contains("src/lib.rs:"), "{line}");
    let _ = std::fs::remove_dir_all(&dir);
}
