//! Configuration files (`NCCL_CONF_FILE`, `~/.nccl.conf`, `/etc/nccl.conf`)
//! as text: `Params::from_sources` never fails or panics, and every loaded
//! value reads back through its typed getter.

use honggfuzz::fuzz;
use oxccl_core::logfmt::LogConfig;
use oxccl_core::params::{self, Params, ALL};
use oxccl_fuzz::text;

fn main() {
    loop {
        fuzz!(|b: &[u8]| {
            let Some(s) = text(b) else { return };
            let env: [(&str, &str); 0] = [];
            let p = Params::from_sources(&env, &[("/etc/nccl.conf", s)])
                .expect("configuration files never fail to load");
            for info in ALL {
                let _ = p.raw(info.name);
                let _ = p.source_of(info.name).to_string();
            }
            let _ = p.explicit();
            let _ = p.warnings();
            let _ = LogConfig::from_params(&p).file_path("host", 1);
            let _ = p.get(&params::ALGO);
            let _ = p.get(&params::PROTO);
            let _ = p.get(&params::BUFFSIZE);
            let _ = p.get(&params::SOCKET_FAMILY);
            let _ = p.get(&params::SOCKET_IFNAME);
            let _ = p.get(&params::DEBUG_TIMESTAMP_FORMAT);
        });
    }
}
