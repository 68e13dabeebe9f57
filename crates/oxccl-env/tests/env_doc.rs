//! `docs/env.md` is generated from the registry; this test fails when it is stale.
//! Regenerate with `OXCCL_BLESS=1 cargo test -p oxccl-env --test env_doc`
//! (or `cargo run -p oxccl-env --example env_table`).

#[test]
fn env_md_matches_registry() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/env.md");
    let want = oxccl_core::params::markdown_table();
    if std::env::var_os("OXCCL_BLESS").is_some() {
        std::fs::write(path, &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        have == want,
        "docs/env.md is stale: run `OXCCL_BLESS=1 cargo test -p oxccl-env --test env_doc`"
    );
}
