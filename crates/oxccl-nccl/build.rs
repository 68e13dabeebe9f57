//! Link arguments of `libnccl.so`: the SONAME NCCL's users load it by, and a
//! version script that exports the `nccl*`/`pnccl*` API and nothing else.

use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let script = out.join("libnccl.map");
    std::fs::write(&script, "{\n  global: nccl*; pnccl*;\n  local: *;\n};\n")
        .expect("write the version script");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        script.display()
    );
    println!("cargo:rerun-if-changed=build.rs");
}
