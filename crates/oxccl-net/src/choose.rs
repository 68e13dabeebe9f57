//! Which network carries peers on other hosts: a plugin's device or oxccl's
//! own sockets, from `NCCL_NET_PLUGIN`, `NCCL_NET`, `NCCL_IB_DISABLE` and
//! `NCCL_IB_HCA`, with one line in the log saying which and why.
//!
//! The rules (NCCL's, except where noted):
//!
//! * `NCCL_NET_PLUGIN` unset: try `libnccl-net.so`; not found is normal
//!   (INFO). `none`: no plugin. A value with a `/` is a path used as is;
//!   another value `foo` tries `libnccl-net-foo.so`, then `foo` itself.
//! * A plugin that cannot be opened (when asked for by name), exports no
//!   version oxccl knows (v6 to v10), lacks an entry, fails `init`, or has no
//!   usable device: a WARN naming it and saying that oxccl's sockets are used.
//! * `NCCL_NET=Socket`: oxccl's sockets, no plugin loaded. `NCCL_NET=<name>`:
//!   the plugin whose network has that name (case-insensitive); when it is
//!   not there, communicator init fails with `ncclInvalidUsage` naming what
//!   is (NCCL fails the same way) instead of silently using another network.
//! * `NCCL_IB_DISABLE=1`: a plugin whose network is named `IB` is not used.
//! * `NCCL_IB_HCA` (for a network named `IB`): devices by name, `name[:port]`
//!   items, `^` to exclude, `=` for exact names, prefixes otherwise.
//! * The device: the first (after `NCCL_IB_HCA`) that supports host memory
//!   (`NCCL_PTR_HOST`). The GPU ring and the host path spread their channels
//!   over the usable devices ([`usable_devices`]) by
//!   `oxccl_core::topo::nic_per_channel`: the devices nearest the GPU (host
//!   buffers: the rank's NUMA node), or rail-aligned by `NCCL_CROSS_NIC`.

use std::sync::Arc;

use oxccl_core::namelist::NameList;
use oxccl_core::{Error, Result};
use oxccl_env::Subsys;

use crate::loader::{load, LoadOutcome};
use crate::{Net, Properties};

/// The settings that pick a network (from the parameter registry).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetSettings {
    /// `NCCL_NET_PLUGIN`.
    pub plugin: Option<String>,
    /// `NCCL_NET`.
    pub net: Option<String>,
    /// `NCCL_IB_DISABLE` is 1.
    pub ib_disable: bool,
    /// `NCCL_IB_HCA`.
    pub ib_hca: Option<String>,
    /// `NCCL_CROSS_NIC`: how the host path's channels pick among the
    /// plugin's usable devices ([`oxccl_core::topo::nic_per_channel`]).
    pub cross_nic: oxccl_core::topo::CrossNic,
}

/// The chosen network for peers on other hosts.
#[derive(Clone)]
pub enum Network {
    /// oxccl's own TCP sockets.
    Socket {
        /// Why (for the log and for tests).
        reason: String,
    },
    /// A plugin's device.
    Plugin {
        net: Arc<dyn Net>,
        /// Device index in the plugin.
        dev: usize,
        props: Properties,
        /// Why (for the log and for tests).
        reason: String,
    },
}

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Network::Socket { reason } => write!(f, "Socket ({reason})"),
            Network::Plugin {
                net, dev, reason, ..
            } => write!(f, "{} device {dev} ({reason})", net.name()),
        }
    }
}

impl Network {
    /// "Socket" or the plugin's network name.
    pub fn name(&self) -> &str {
        match self {
            Network::Socket { .. } => "Socket",
            Network::Plugin { net, .. } => net.name(),
        }
    }
}

/// The files to try for an `NCCL_NET_PLUGIN` value, in order; `None`: no
/// plugin (`none`, any case).
pub fn library_candidates(value: Option<&str>) -> Option<Vec<String>> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Some(vec!["libnccl-net.so".to_string()]),
        Some(v) if v.eq_ignore_ascii_case("none") => None,
        Some(v) if v.contains('/') => Some(vec![v.to_string()]),
        Some(v) => Some(vec![format!("libnccl-net-{v}.so"), v.to_string()]),
    }
}

/// A parsed `NCCL_IB_HCA` value: core's `[^][=]name,name` list grammar
/// ([`oxccl_core::namelist`], the one `NCCL_SOCKET_IFNAME` uses) whose items
/// may end in `:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaSpec {
    /// The list, each item's `:port` taken off.
    pub list: NameList,
    /// Each item's port (`None`: any port), in the list's order.
    pub ports: Vec<Option<i32>>,
}

impl HcaSpec {
    /// Parses `[^][=]name[:port][,name[:port]...]`. Never fails: an item
    /// whose port is not a number keeps the whole text as its name.
    pub fn parse(s: &str) -> HcaSpec {
        let mut list = NameList::parse(s);
        let ports = list
            .items
            .iter_mut()
            .map(|x| match x.rsplit_once(':') {
                Some((n, p)) => match p.parse::<i32>() {
                    Ok(port) => {
                        *x = n.to_string();
                        Some(port)
                    }
                    Err(_) => None,
                },
                None => None,
            })
            .collect();
        HcaSpec { list, ports }
    }

    /// Whether device `name` on `port` is allowed.
    pub fn allows(&self, name: &str, port: i32) -> bool {
        let hit = self
            .list
            .items
            .iter()
            .zip(&self.ports)
            .any(|(n, p)| self.list.matches(n, name) && p.is_none_or(|p| p == port));
        hit != self.list.exclude
    }
}

/// Picks the device: the first of `devs` that `hca` allows (when given) and
/// that supports host memory. Err says why none qualified.
pub fn pick_device(
    devs: &[Properties],
    hca: Option<&HcaSpec>,
) -> std::result::Result<usize, String> {
    let allowed: Vec<usize> = (0..devs.len())
        .filter(|&i| hca.is_none_or(|h| h.allows(&devs[i].name, devs[i].port)))
        .collect();
    if allowed.is_empty() {
        let names: Vec<&str> = devs.iter().map(|d| d.name.as_str()).collect();
        return Err(if devs.is_empty() {
            "it reports no device".to_string()
        } else {
            format!(
                "NCCL_IB_HCA allows none of its devices ({})",
                names.join(", ")
            )
        });
    }
    allowed
        .iter()
        .copied()
        .find(|&i| devs[i].supports_host())
        .ok_or_else(|| "none of its devices supports host memory (NCCL_PTR_HOST)".to_string())
}

/// The devices of a chosen plugin a rank may spread its channels over:
/// those `NCCL_IB_HCA` allows (for a network named IB) that support host
/// memory, in index order, with their properties; the first is the one
/// [`choose`] picked. A device whose properties fail is left out.
pub fn usable_devices(net: &dyn Net, ib_hca: Option<&str>) -> Vec<(usize, Properties)> {
    let hca = if net.name().eq_ignore_ascii_case("IB") {
        ib_hca.map(HcaSpec::parse)
    } else {
        None
    };
    (0..net.devices().unwrap_or(0))
        .filter_map(|d| net.properties(d).ok().map(|p| (d, p)))
        .filter(|(_, p)| {
            hca.as_ref().is_none_or(|h| h.allows(&p.name, p.port)) && p.supports_host()
        })
        .collect()
}

fn not_there(forced: &str, why: &str) -> Error {
    Error::invalid_usage(format!(
        "NCCL_NET={forced} asks for network {forced}, which is not available: {why}; the networks here are Socket (oxccl's sockets) and any plugin named by NCCL_NET_PLUGIN"
    ))
}

/// The network for peers on other hosts, and a log line saying which and why.
/// Err only when `NCCL_NET` forces a network that is not there.
pub fn choose(s: &NetSettings) -> Result<Network> {
    let forced = s.net.as_deref().map(str::trim).filter(|v| !v.is_empty());
    let net = decide(s, forced)?;
    match &net {
        Network::Socket { reason } => oxccl_env::info!(
            Subsys::INIT | Subsys::NET,
            "NET: using oxccl's sockets (NET/Socket) for peers on other hosts: {reason}"
        ),
        Network::Plugin {
            net,
            dev,
            props,
            reason,
        } => oxccl_env::info!(
            Subsys::INIT | Subsys::NET,
            "NET: using network {} (NET/{}) device {dev} '{}' ({} Mbps, port {}) for peers on other hosts: {reason}",
            net.name(),
            net.name(),
            props.name,
            props.speed_mbps,
            props.port
        ),
    }
    Ok(net)
}

fn decide(s: &NetSettings, forced: Option<&str>) -> Result<Network> {
    if forced.is_some_and(|f| f.eq_ignore_ascii_case("socket")) {
        return Ok(Network::Socket {
            reason: "NCCL_NET=Socket".to_string(),
        });
    }
    let asked = s.plugin.as_deref().map(str::trim).filter(|v| !v.is_empty());
    let candidates = library_candidates(asked);
    let plugin = match load(candidates.as_deref()) {
        LoadOutcome::Disabled => {
            let why = "NCCL_NET_PLUGIN=none";
            return match forced {
                Some(f) => Err(not_there(f, why)),
                None => Ok(Network::Socket {
                    reason: why.to_string(),
                }),
            };
        }
        LoadOutcome::NotFound(tried) => {
            let list: Vec<String> = tried.iter().map(|(f, e)| format!("{f} ({e})")).collect();
            let why = format!("no plugin could be opened: {}", list.join("; "));
            if let Some(a) = asked {
                warn_once(&format!(
                    "NET/Plugin: NCCL_NET_PLUGIN={a}: {why}; falling back to oxccl's sockets (NET/Socket)"
                ));
            }
            return match forced {
                Some(f) => Err(not_there(f, &why)),
                None => Ok(Network::Socket {
                    reason: if asked.is_some() {
                        why
                    } else {
                        "NCCL_NET_PLUGIN unset and libnccl-net.so not found".to_string()
                    },
                }),
            };
        }
        LoadOutcome::Failed { library, why } => {
            let why = format!("plugin {library} cannot be used: {why}");
            warn_once(&format!(
                "NET/Plugin: {why}; falling back to oxccl's sockets (NET/Socket)"
            ));
            return match forced {
                Some(f) => Err(not_there(f, &why)),
                None => Ok(Network::Socket { reason: why }),
            };
        }
        LoadOutcome::Loaded(p) => p,
    };
    let name = plugin.name().to_string();
    let lib = plugin.library().to_string();
    let version = plugin.version().symbol();
    let fallback = |why: String, warn: bool| -> Result<Network> {
        if warn {
            warn_once(&format!(
                "NET/Plugin: {why}; falling back to oxccl's sockets (NET/Socket)"
            ));
        }
        match forced {
            Some(f) if !f.eq_ignore_ascii_case("socket") => Err(not_there(f, &why)),
            _ => Ok(Network::Socket { reason: why }),
        }
    };
    if s.ib_disable && name.eq_ignore_ascii_case("IB") {
        return fallback(
            format!("NCCL_IB_DISABLE=1: plugin {lib} (network IB) not used"),
            false,
        );
    }
    if let Some(f) = forced {
        if !f.eq_ignore_ascii_case(&name) {
            return Err(not_there(f, &format!("the plugin {lib} is network {name}")));
        }
    }
    let ndev = match plugin.devices() {
        Ok(n) => n,
        Err(e) => return fallback(format!("plugin {lib} (network {name}): {e}"), true),
    };
    let mut devs = Vec::with_capacity(ndev);
    for d in 0..ndev {
        match plugin.properties(d) {
            Ok(p) => devs.push(p),
            Err(e) => return fallback(format!("plugin {lib} (network {name}): {e}"), true),
        }
    }
    let hca = if name.eq_ignore_ascii_case("IB") {
        s.ib_hca.as_deref().map(HcaSpec::parse)
    } else {
        None
    };
    let dev = match pick_device(&devs, hca.as_ref()) {
        Ok(d) => d,
        Err(why) => {
            return fallback(format!("plugin {lib} (network {name}): {why}"), true);
        }
    };
    let why_plugin = match (asked, forced) {
        (Some(a), Some(f)) => format!("NCCL_NET_PLUGIN={a}, NCCL_NET={f}"),
        (Some(a), None) => format!("NCCL_NET_PLUGIN={a}"),
        (None, Some(f)) => format!("libnccl-net.so found, NCCL_NET={f}"),
        (None, None) => "libnccl-net.so found".to_string(),
    };
    let props = devs.swap_remove(dev);
    Ok(Network::Plugin {
        net: plugin,
        dev,
        props,
        reason: format!("{why_plugin} ({lib}, {version})"),
    })
}

/// A WARN once per process per text (communicators are made again and again;
/// the broken plugin is the same).
fn warn_once(text: &str) {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let seen = SEEN.get_or_init(|| Mutex::new(HashSet::new()));
    if seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(text.to_string())
    {
        oxccl_env::warn!("{text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_follow_nccl_rules() {
        assert_eq!(
            library_candidates(None),
            Some(vec!["libnccl-net.so".to_string()])
        );
        assert_eq!(
            library_candidates(Some(" ")),
            Some(vec!["libnccl-net.so".to_string()])
        );
        assert_eq!(library_candidates(Some("none")), None);
        assert_eq!(library_candidates(Some("NONE")), None);
        assert_eq!(
            library_candidates(Some("/opt/x/libfoo.so")),
            Some(vec!["/opt/x/libfoo.so".to_string()])
        );
        assert_eq!(
            library_candidates(Some("aws-ofi")),
            Some(vec![
                "libnccl-net-aws-ofi.so".to_string(),
                "aws-ofi".to_string()
            ])
        );
    }

    fn dev(name: &str, port: i32, ptr: i32) -> Properties {
        Properties {
            name: name.into(),
            pci_path: None,
            guid: 0,
            ptr_support: ptr,
            speed_mbps: 100_000,
            port,
            latency_us: 0.0,
            max_comms: 1024,
            max_recvs: 1,
            max_p2p_bytes: 1 << 30,
            force_flush: false,
        }
    }

    #[test]
    fn hca_grammar() {
        let s = HcaSpec::parse("mlx5_0:1,mlx5_1");
        assert!(s.allows("mlx5_0", 1));
        assert!(!s.allows("mlx5_0", 2));
        assert!(s.allows("mlx5_1", 2));
        assert!(!s.allows("mlx5_2", 1));
        let s = HcaSpec::parse("^mlx5_0");
        assert!(!s.allows("mlx5_0", 1));
        assert!(s.allows("mlx5_1", 1));
        let s = HcaSpec::parse("=mlx5_1");
        assert!(!s.allows("mlx5_10", 1));
        assert!(s.allows("mlx5_1", 1));
        // A prefix matches longer names.
        assert!(HcaSpec::parse("mlx5").allows("mlx5_3", 1));
        let s = HcaSpec::parse("^=mlx5_0:1, mlx5_1:x");
        assert_eq!(s.list.items, vec!["mlx5_0", "mlx5_1:x"]);
        assert_eq!(s.ports, vec![Some(1), None]);
        assert!(!s.allows("mlx5_0", 1) && s.allows("mlx5_0", 2));
    }

    #[test]
    fn device_choice() {
        let host = crate::ffi::NCCL_PTR_HOST;
        let cuda = crate::ffi::NCCL_PTR_CUDA;
        let devs = vec![
            dev("a0", 1, cuda),
            dev("b0", 1, host | cuda),
            dev("b1", 1, host),
        ];
        assert_eq!(pick_device(&devs, None), Ok(1));
        assert_eq!(pick_device(&devs, Some(&HcaSpec::parse("b1"))), Ok(2));
        let e = pick_device(&devs, Some(&HcaSpec::parse("zz"))).unwrap_err();
        assert!(e.contains("a0, b0, b1"), "{e}");
        let e = pick_device(&devs, Some(&HcaSpec::parse("a0"))).unwrap_err();
        assert!(e.contains("NCCL_PTR_HOST"), "{e}");
        assert!(pick_device(&[], None).unwrap_err().contains("no device"));
    }
}
