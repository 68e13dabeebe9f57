//! Interface selection: the `NCCL_SOCKET_IFNAME` grammar and the default
//! preference order, as pure functions over a list of interfaces.
//!
//! Grammar (`NCCL_SOCKET_IFNAME`, parsed by [`oxccl_core::namelist`]): a
//! comma-separated list of name prefixes (`eth,ib` matches `eth0`, `ib1`...).
//! A leading `^` turns the list into exclusions; a leading `=` (after the `^`
//! if both) makes the names exact. So `^=docker0` excludes exactly `docker0`;
//! `=eth0` selects exactly `eth0`.
//!
//! Order among the interfaces that qualify (the first one is used):
//! 1. addresses that are not IPv6 link-local (those need a scope id and only
//!    work on one link; used only when nothing else exists),
//! 2. with a positive list: the position of the first list item that matches
//!    (`ib,eth` prefers any `ib*` over any `eth*`); otherwise (no setting or an
//!    exclusion list) the default tiers: `ib*`, then any other interface,
//!    then `docker*`/`virbr*`/`veth*`, then loopback,
//! 3. IPv4 before IPv6 (when `NCCL_SOCKET_FAMILY` does not decide),
//! 4. the operating system's order.
//!
//! Interfaces that are down never qualify.

use std::fmt::Write as _;
use std::net::IpAddr;

use oxccl_core::{Error, Result};

use crate::Family;

/// One address of one network interface (what `getifaddrs` reports).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// Interface name (`eth0`).
    pub name: String,
    /// One of its addresses.
    pub addr: IpAddr,
    /// IPv6 scope id (0 for IPv4 and global IPv6).
    pub scope_id: u32,
    /// Whether the interface is administratively up.
    pub up: bool,
}

impl Interface {
    fn is_link_local_v6(&self) -> bool {
        matches!(self.addr, IpAddr::V6(a) if (a.segments()[0] & 0xffc0) == 0xfe80)
    }
    fn family(&self) -> Family {
        match self.addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
    /// Default tier: 0 `ib*`, 1 other, 2 docker/virtual bridges, 3 loopback.
    fn tier(&self) -> u8 {
        let n = self.name.as_str();
        if n.starts_with("lo") || self.addr.is_loopback() {
            3
        } else if n.starts_with("docker") || n.starts_with("virbr") || n.starts_with("veth") {
            2
        } else if n.starts_with("ib") {
            0
        } else {
            1
        }
    }
}

/// A parsed `NCCL_SOCKET_IFNAME` value: core's `[^][=]name,name` list
/// grammar ([`oxccl_core::namelist`]), the same one `NCCL_IB_HCA` uses.
pub use oxccl_core::namelist::NameList as IfSpec;

/// The chosen interface and why it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// The interface address to bind.
    pub iface: Interface,
    /// A short reason for the log line.
    pub reason: String,
}

/// `lo 127.0.0.1, eth0 10.1.2.3 (down)`: the list used in error messages.
pub fn describe(ifaces: &[Interface]) -> String {
    let mut s = String::new();
    for (i, f) in ifaces.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let _ = write!(s, "{} {}", f.name, f.addr);
        if !f.up {
            s.push_str(" (down)");
        }
    }
    if s.is_empty() {
        s.push_str("none");
    }
    s
}

/// Picks the interface address to use (see the module docs for the order).
///
/// Errors: a setting that matches nothing is `InvalidArgument` naming the
/// setting and listing the interfaces that exist; no usable interface at all
/// without a setting is `System`.
pub fn select(
    ifaces: &[Interface],
    ifname: Option<&str>,
    family: Option<Family>,
) -> Result<Selection> {
    select_for("NCCL_SOCKET_IFNAME", ifaces, ifname, family)
}

/// [`select`] for a value read from `setting` (named in the reason and the
/// error), e.g. `OXCCL_BOOTSTRAP_IFNAME`.
pub fn select_for(
    setting: &str,
    ifaces: &[Interface],
    ifname: Option<&str>,
    family: Option<Family>,
) -> Result<Selection> {
    let spec = ifname.map(IfSpec::parse);
    // (link-local, list position or tier, family, OS order): smaller wins.
    type Key = (bool, usize, u8, usize);
    let mut best: Option<(Key, &Interface)> = None;
    for (idx, f) in ifaces.iter().enumerate() {
        if !f.up || family.is_some_and(|fam| fam != f.family()) {
            continue;
        }
        let rank = match &spec {
            Some(sp) if !sp.exclude => match sp.position(&f.name) {
                Some(p) => p,
                None => continue,
            },
            Some(sp) => {
                if !sp.allows(&f.name) {
                    continue;
                }
                f.tier() as usize
            }
            None => f.tier() as usize,
        };
        let fam_rank = match f.family() {
            Family::V4 => 0,
            Family::V6 => 1,
        };
        let key = (f.is_link_local_v6(), rank, fam_rank, idx);
        if best.as_ref().is_none_or(|(k, _)| key < *k) {
            best = Some((key, f));
        }
    }
    let fam_txt = family
        .map(|f| format!(" with NCCL_SOCKET_FAMILY={}", f.name()))
        .unwrap_or_default();
    match best {
        Some((key, f)) => {
            let mut reason = match (ifname, key.1) {
                (Some(s), _) => format!("matches {setting}={s}"),
                (None, 0) => "is InfiniBand (default: ib* first)".to_string(),
                (None, 1) => "is the first interface that is up and not lo/docker*/virbr*/veth* (default)"
                    .to_string(),
                (None, 2) => {
                    "is a docker/virtual-bridge interface: nothing else but loopback is up (default)".to_string()
                }
                (None, _) => "is the loopback interface: nothing else is up (default)".to_string(),
            };
            reason.push_str(&fam_txt);
            if key.0 {
                reason.push_str(" (IPv6 link-local: nothing else was available)");
            }
            Ok(Selection {
                iface: f.clone(),
                reason,
            })
        }
        None => match ifname {
            Some(s) => Err(Error::invalid_argument(format!(
                "{setting}={s}{fam_txt} matches no interface that is up; interfaces: {}",
                describe(ifaces)
            ))),
            None => Err(Error::system(format!(
                "no network interface is up with an address{fam_txt}; interfaces: {}",
                describe(ifaces)
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn i(name: &str, addr: &str) -> Interface {
        Interface {
            name: name.into(),
            addr: addr.parse().unwrap(),
            scope_id: 0,
            up: true,
        }
    }

    fn fixed() -> Vec<Interface> {
        vec![
            i("lo", "127.0.0.1"),
            i("docker0", "172.17.0.1"),
            i("eth0", "10.1.2.3"),
            i("eth0", "fd00::3"),
            i("eth1", "10.2.0.1"),
            i("ib0", "192.168.1.5"),
            i("eth2", "fe80::1"),
        ]
    }

    fn pick(spec: Option<&str>, fam: Option<Family>) -> String {
        let s = select(&fixed(), spec, fam).unwrap();
        format!("{} {}", s.iface.name, s.iface.addr)
    }

    #[test]
    fn parse_grammar() {
        assert_eq!(
            IfSpec::parse("^=docker0,lo"),
            IfSpec {
                exclude: true,
                exact: true,
                items: vec!["docker0".into(), "lo".into()]
            }
        );
        let p = IfSpec::parse("eth,,ib");
        assert!(!p.exclude && !p.exact);
        assert_eq!(p.items, vec!["eth", "ib"]);
        assert!(p.allows("eth12") && p.allows("ib0") && !p.allows("lo"));
        let e = IfSpec::parse("=eth0");
        assert!(e.allows("eth0") && !e.allows("eth01"));
    }

    #[test]
    fn default_order() {
        assert_eq!(pick(None, None), "ib0 192.168.1.5");
        assert_eq!(pick(None, Some(Family::V6)), "eth0 fd00::3");
        let no_ib: Vec<_> = fixed().into_iter().filter(|f| f.name != "ib0").collect();
        assert_eq!(select(&no_ib, None, None).unwrap().iface.name, "eth0");
        let only = vec![i("lo", "127.0.0.1"), i("docker0", "172.17.0.1")];
        assert_eq!(select(&only, None, None).unwrap().iface.name, "docker0");
        let lo = vec![i("lo", "127.0.0.1")];
        let s = select(&lo, None, None).unwrap();
        assert!(s.reason.contains("loopback"), "{}", s.reason);
    }

    #[test]
    fn prefix_exclude_exact() {
        assert_eq!(pick(Some("eth"), None), "eth0 10.1.2.3");
        assert_eq!(pick(Some("eth1,eth0"), None), "eth1 10.2.0.1");
        assert_eq!(pick(Some("^ib,eth0"), None), "eth1 10.2.0.1");
        assert_eq!(pick(Some("^ib"), None), "eth0 10.1.2.3");
        assert_eq!(pick(Some("=eth1"), None), "eth1 10.2.0.1");
        assert_eq!(pick(Some("^=ib0,eth0,eth1"), None), "docker0 172.17.0.1");
        assert_eq!(pick(Some("lo"), None), "lo 127.0.0.1");
        // `=eth` matches no interface exactly.
        assert!(select(&fixed(), Some("=eth"), None).is_err());
    }

    #[test]
    fn link_local_only_as_last_resort() {
        assert_eq!(pick(Some("eth2"), None), "eth2 fe80::1");
        let v = vec![i("eth0", "fe80::2"), i("lo", "::1")];
        assert_eq!(select(&v, None, None).unwrap().iface.name, "lo");
    }

    #[test]
    fn down_interfaces_skipped() {
        let mut v = fixed();
        v[5].up = false; // ib0
        assert_eq!(select(&v, None, None).unwrap().iface.name, "eth0");
    }

    #[test]
    fn no_match_lists_interfaces() {
        let v = vec![i("lo", "127.0.0.1"), i("eth0", "10.1.2.3")];
        let e = select(&v, Some("eth9"), None).unwrap_err();
        assert_eq!(e.kind(), oxccl_core::ErrorKind::InvalidArgument);
        assert_eq!(
            e.message(),
            "NCCL_SOCKET_IFNAME=eth9 matches no interface that is up; interfaces: lo 127.0.0.1, eth0 10.1.2.3"
        );
        let e = select(&v, Some("eth"), Some(Family::V6)).unwrap_err();
        assert!(e.message().contains("NCCL_SOCKET_FAMILY=AF_INET6"), "{e}");
        let e = select(&[], None, None).unwrap_err();
        assert_eq!(e.kind(), oxccl_core::ErrorKind::System);
        assert!(e.message().ends_with("interfaces: none"));
    }
}
