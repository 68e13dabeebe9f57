//! Writes `docs/env.md` from the parameter registry (`oxccl_core::params::ALL`).
//! With an argument, writes there instead; `-` prints to stdout.

#![forbid(unsafe_code)]

fn main() -> std::io::Result<()> {
    let md = oxccl_core::params::markdown_table();
    let default = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/env.md").to_string();
    let path = std::env::args().nth(1).unwrap_or(default);
    if path == "-" {
        print!("{md}");
        Ok(())
    } else {
        std::fs::write(&path, md)
    }
}
