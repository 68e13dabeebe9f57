//! The `gpu_allreduce` example as a test: ranks as processes (this test
//! binary started again as each rank) all-reduce gradients in GPU memory
//! through `Communicator::on_stream` (ranks may share one GPU) and check
//! every element against the float64 reference.

#[path = "../examples/gpu_allreduce.rs"]
mod example;

#[test]
#[ignore = "needs a GPU: two processes all-reduce device buffers"]
fn gpu_allreduce_example_two_processes() {
    const NAME: &str = "gpu_allreduce_example_two_processes";
    if example::is_child() {
        // A child rank: its exit status is the outcome the parent checks.
        example::child_main().unwrap();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let args: Vec<String> = ["--exact", NAME, "--ignored", "--nocapture"]
        .map(String::from)
        .to_vec();
    // An odd count past the small-message paths, and an odd small one.
    for elements in [(1 << 20) + 3, 7] {
        example::launch(&exe, &args, 2, elements)
            .unwrap_or_else(|e| panic!("{elements} elements: {e}"));
    }
}
