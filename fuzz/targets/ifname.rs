//! The `NCCL_SOCKET_IFNAME` grammar (`IfSpec::parse`) and the interface choice
//! it drives (`ifname::select`) over a fixed set of interfaces, for each
//! `NCCL_SOCKET_FAMILY`. Never panics; a chosen interface exists, is up and is
//! allowed by the setting. Also `NCCL_SOCKET_FAMILY` (`Family::from_str`).

use std::net::IpAddr;
use std::str::FromStr;

use honggfuzz::fuzz;
use oxccl_bootstrap::ifname::{self, IfSpec, Interface};
use oxccl_bootstrap::Family;
use oxccl_fuzz::text;

fn iface(name: &str, addr: &str, scope_id: u32, up: bool) -> Interface {
    Interface {
        name: name.into(),
        addr: addr.parse::<IpAddr>().expect("literal"),
        scope_id,
        up,
    }
}

fn main() {
    let ifaces = [
        iface("lo", "127.0.0.1", 0, true),
        iface("lo", "::1", 0, true),
        iface("eth0", "10.1.2.3", 0, true),
        iface("eth0", "fe80::1", 2, true),
        iface("eth10", "2001:db8::5", 0, true),
        iface("ib0", "192.168.7.1", 0, false),
        iface("docker0", "172.17.0.1", 0, true),
    ];
    loop {
        fuzz!(|b: &[u8]| {
            let Some(s) = text(b) else { return };
            let _ = Family::from_str(s);
            let spec = IfSpec::parse(s);
            assert!(spec.items.iter().all(|n| !n.is_empty() && n.trim() == n));
            for fam in [None, Some(Family::V4), Some(Family::V6)] {
                if let Ok(sel) = ifname::select(&ifaces, Some(s), fam) {
                    assert!(ifaces.contains(&sel.iface));
                    assert!(sel.iface.up);
                    assert!(spec.allows(&sel.iface.name));
                }
            }
        });
    }
}
