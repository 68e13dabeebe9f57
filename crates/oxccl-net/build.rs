//! Compiles the logger shim: NCCL hands a plugin a C-variadic logger
//! (`printf`-style), which stable Rust cannot define; ten lines of C format the
//! line with `vsnprintf` and pass the text to Rust (see `src/log_shim.c`).

fn main() {
    println!("cargo:rerun-if-changed=src/log_shim.c");
    cc::Build::new()
        .file("src/log_shim.c")
        .warnings(true)
        .compile("oxccl_net_log_shim");
}
