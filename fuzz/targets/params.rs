//! Every registered parameter's value checker: the first byte picks the
//! parameter, the rest is its value (from the environment or a file). Never
//! panics.

use honggfuzz::fuzz;
use oxccl_core::params::ALL;

fn main() {
    loop {
        fuzz!(|b: &[u8]| {
            let Some((&i, rest)) = b.split_first() else {
                return;
            };
            let Ok(v) = std::str::from_utf8(rest) else {
                return;
            };
            let info = &ALL[i as usize % ALL.len()];
            let _ = info.check(v);
            let _ = info.display_value(v);
        });
    }
}
