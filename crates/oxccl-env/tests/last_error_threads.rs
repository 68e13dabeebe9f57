//! `last_error` is per thread first: ranks run as threads of one process must
//! each read their own last WARN, whatever the other threads log meanwhile; a
//! thread that has logged nothing reads the process's last WARN.

use std::sync::Barrier;

#[test]
fn each_thread_reads_its_own_last_warn() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 2_000;
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let barrier = &barrier;
            s.spawn(move || {
                barrier.wait();
                for i in 0..ROUNDS {
                    oxccl_env::warn!("thread {t} round {i}");
                    let expected = format!("thread {t} round {i}");
                    assert_eq!(oxccl_env::last_error().as_deref(), Some(&*expected));
                }
            });
        }
    });
    // This thread logged nothing: it sees the last WARN of any thread.
    let text = oxccl_env::last_error().expect("a WARN was logged");
    assert!(text.ends_with(&format!("round {}", ROUNDS - 1)), "{text}");
}
