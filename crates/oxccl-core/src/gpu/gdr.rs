//! GPUDirect RDMA through a network plugin: whether the ring's network
//! path hands the plugin GPU memory (no copy through pinned host memory),
//! for receives and for sends, registered how, and whether a receive needs
//! a flush before the kernel reads it.
//!
//! The rules follow NCCL's (`NCCL_NET_GDR_LEVEL`, `NCCL_NET_GDR_READ`,
//! `NCCL_DMABUF_ENABLE`, `NCCL_NET_FORCE_FLUSH`):
//!
//! - the plugin's device must declare `NCCL_PTR_CUDA`, and the GPU must
//!   support GPUDirect RDMA (by address) or DMA-BUF export;
//! - the PCI distance from the GPU to the NIC must be at most the level
//!   (`NCCL_NET_GDR_LEVEL`; NCCL's default is `PXB`, both under one PCIe
//!   switch tree). A NIC whose PCI path the plugin does not give counts as
//!   `SYS`. Unlike NCCL, unset means off: this path has been run with a
//!   test plugin that copies GPU memory, not yet with an RDMA NIC, so it
//!   is opt-in until it has;
//! - sends read GPU memory only when `NCCL_NET_GDR_READ=1` (and never on
//!   GPUs before compute capability 8.0 unless asked: reads from GPU memory
//!   over PCIe were slower there than from host memory). Unset, unlike
//!   NCCL (on from 8.0), sends stay in pinned host memory: on one H200
//!   with two processes under MPS and the test plugin, receives into GPU
//!   memory gave exact results at every size tried, while sends reading
//!   GPU memory stalled at 1.2 MB all-reduces (32 channels, both proxy
//!   threads polling until the 60 s operation timeout);
//! - DMA-BUF registration (`regMrDmaBuf`) when the plugin declares
//!   `NCCL_PTR_DMABUF`, the GPU exports DMA-BUFs and `NCCL_DMABUF_ENABLE`
//!   is not 0; else registration by address (`regMr` with `NCCL_PTR_CUDA`),
//!   which needs the GPU's GPUDirect RDMA support;
//! - a receive into GPU memory is flushed (`iflush`) before the kernel
//!   reads it on GPUs before compute capability 9.0, when the device says
//!   `forceFlush`, or when `NCCL_NET_FORCE_FLUSH=1`; Hopper and later order
//!   the NIC's writes before the GPU's reads without it.

use std::fmt;

use crate::topo::Path;

/// A distance named by `NCCL_NET_GDR_LEVEL`, nearest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum GdrLevel {
    /// The same PCI device.
    Loc,
    /// Over NVLink.
    Nvl,
    /// One PCIe switch.
    Pix,
    /// Several PCIe switches, not through the CPU.
    Pxb,
    /// Through the CPU (a host bridge) of one NUMA node.
    Phb,
    /// Across NUMA nodes.
    Sys,
}

impl GdrLevel {
    /// NCCL's spelling: a name (`LOC`, `NVL`, `PIX`, `PXB`, `PHB`, `SYS`,
    /// any case) or its older integer (0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 or
    /// more SYS).
    pub fn parse(s: &str) -> Option<GdrLevel> {
        let t = s.trim();
        if let Ok(n) = t.parse::<i64>() {
            return Some(match n {
                i64::MIN..=0 => GdrLevel::Loc,
                1 => GdrLevel::Pix,
                2 => GdrLevel::Pxb,
                3 => GdrLevel::Phb,
                _ => GdrLevel::Sys,
            });
        }
        Some(match t.to_ascii_uppercase().as_str() {
            "LOC" => GdrLevel::Loc,
            "NVL" => GdrLevel::Nvl,
            "PIX" => GdrLevel::Pix,
            "PXB" => GdrLevel::Pxb,
            "PHB" | "NODE" => GdrLevel::Phb,
            "SYS" => GdrLevel::Sys,
            _ => return None,
        })
    }

    /// The level of a GPU-to-NIC path (`None`: the NIC's place is unknown).
    pub fn of_path(p: Option<Path>) -> GdrLevel {
        match p {
            Some(Path::Itself) => GdrLevel::Loc,
            Some(Path::Nv(_)) => GdrLevel::Nvl,
            Some(Path::Pix) => GdrLevel::Pix,
            Some(Path::Pxb) => GdrLevel::Pxb,
            Some(Path::Phb) | Some(Path::Node) => GdrLevel::Phb,
            Some(Path::Sys) | None => GdrLevel::Sys,
        }
    }
}

impl fmt::Display for GdrLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GdrLevel::Loc => "LOC",
            GdrLevel::Nvl => "NVL",
            GdrLevel::Pix => "PIX",
            GdrLevel::Pxb => "PXB",
            GdrLevel::Phb => "PHB",
            GdrLevel::Sys => "SYS",
        })
    }
}

/// What the plugin's device and the GPU can do, and how far apart they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdrFacts {
    /// The device declares `NCCL_PTR_CUDA`.
    pub net_cuda: bool,
    /// The device declares `NCCL_PTR_DMABUF`.
    pub net_dmabuf: bool,
    /// The device asks for a flush after receives (`forceFlush`).
    pub net_force_flush: bool,
    /// The plugin exports `iflush`.
    pub net_has_flush: bool,
    /// The GPU supports GPUDirect RDMA by address.
    pub gpu_rdma: bool,
    /// The GPU exports DMA-BUFs of its memory.
    pub gpu_dmabuf: bool,
    /// The GPU's compute capability (major, minor).
    pub gpu_cc: (u32, u32),
    /// The GPU-to-NIC distance.
    pub distance: GdrLevel,
}

/// The settings, as the registry read them (`None`: unset).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GdrSettings {
    /// `NCCL_NET_GDR_LEVEL`, unparsed.
    pub level: Option<String>,
    /// `NCCL_NET_GDR_READ`.
    pub read: Option<i64>,
    /// `NCCL_DMABUF_ENABLE`.
    pub dmabuf: Option<i64>,
    /// `NCCL_NET_FORCE_FLUSH`.
    pub force_flush: Option<i64>,
}

/// How the plugin gets GPU memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// `regMr` with `NCCL_PTR_CUDA`.
    Address,
    /// `regMrDmaBuf` with a DMA-BUF descriptor of the range.
    DmaBuf,
}

/// The decision for one communicator's network path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GdrChoice {
    /// Receives land in GPU memory.
    pub recv: bool,
    /// Sends read GPU memory.
    pub send: bool,
    /// How GPU memory is registered (meaningful when `recv` or `send`).
    pub registration: Registration,
    /// Receives into GPU memory are flushed before the kernel reads them.
    pub flush: bool,
    /// Why, for the log: names the setting or fact that decided.
    pub why: String,
}

impl GdrChoice {
    fn off(why: String) -> GdrChoice {
        GdrChoice {
            recv: false,
            send: false,
            registration: Registration::Address,
            flush: false,
            why,
        }
    }

    /// Whether any GPU memory reaches the plugin.
    pub fn any(&self) -> bool {
        self.recv || self.send
    }
}

/// Decides GPUDirect RDMA for a plugin's device and a GPU (see the module
/// text for the rules). An unparsable level is `Err` naming it.
pub fn decide(f: &GdrFacts, s: &GdrSettings) -> Result<GdrChoice, String> {
    let level = match &s.level {
        None => {
            return Ok(GdrChoice::off(
                "NCCL_NET_GDR_LEVEL unset: oxccl hands a plugin GPU memory only when it is set"
                    .into(),
            ))
        }
        Some(v) => GdrLevel::parse(v).ok_or_else(|| {
            format!("NCCL_NET_GDR_LEVEL={v} is not LOC, NVL, PIX, PXB, PHB, SYS or 0-4")
        })?,
    };
    if !f.net_cuda {
        return Ok(GdrChoice::off(
            "the network device does not declare NCCL_PTR_CUDA".into(),
        ));
    }
    let dmabuf = f.net_dmabuf && f.gpu_dmabuf && s.dmabuf.unwrap_or(1) != 0;
    if !dmabuf && !f.gpu_rdma {
        return Ok(GdrChoice::off(format!(
            "the GPU supports neither GPUDirect RDMA by address nor DMA-BUF{}",
            if f.net_dmabuf && f.gpu_dmabuf {
                " (DMA-BUF off by NCCL_DMABUF_ENABLE=0)"
            } else {
                ""
            }
        )));
    }
    if f.distance > level {
        return Ok(GdrChoice::off(format!(
            "GPU to NIC distance {} > NCCL_NET_GDR_LEVEL {}",
            f.distance, level
        )));
    }
    // Only when asked (see the module text for why unset stays staged).
    let send = matches!(s.read, Some(r) if r > 0);
    let flush =
        f.net_has_flush && (f.gpu_cc.0 < 9 || f.net_force_flush || s.force_flush == Some(1));
    let registration = if dmabuf {
        Registration::DmaBuf
    } else {
        Registration::Address
    };
    Ok(GdrChoice {
        recv: true,
        send,
        registration,
        flush,
        why: format!(
            "distance {} <= {}; {}; sends {}{}",
            f.distance,
            level,
            match registration {
                Registration::DmaBuf => "DMA-BUF registration",
                Registration::Address => "registration by address",
            },
            if send {
                "read GPU memory"
            } else if s.read.is_none() {
                "staged (NCCL_NET_GDR_READ unset; 1 reads GPU memory)"
            } else {
                "staged (NCCL_NET_GDR_READ)"
            },
            if flush { "; receives flushed" } else { "" }
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Settings with the level set far enough for `facts()`.
    fn on() -> GdrSettings {
        GdrSettings {
            level: Some("PXB".into()),
            ..Default::default()
        }
    }

    fn facts() -> GdrFacts {
        GdrFacts {
            net_cuda: true,
            net_dmabuf: true,
            net_force_flush: false,
            net_has_flush: true,
            gpu_rdma: true,
            gpu_dmabuf: true,
            gpu_cc: (9, 0),
            distance: GdrLevel::Pix,
        }
    }

    #[test]
    fn levels_parse_as_nccl_spells_them() {
        for (s, l) in [
            ("LOC", GdrLevel::Loc),
            ("nvl", GdrLevel::Nvl),
            ("PIX", GdrLevel::Pix),
            ("pxb", GdrLevel::Pxb),
            ("PHB", GdrLevel::Phb),
            ("SYS", GdrLevel::Sys),
            ("0", GdrLevel::Loc),
            ("1", GdrLevel::Pix),
            ("2", GdrLevel::Pxb),
            ("3", GdrLevel::Phb),
            ("4", GdrLevel::Sys),
            ("5", GdrLevel::Sys),
        ] {
            assert_eq!(GdrLevel::parse(s), Some(l), "{s}");
        }
        assert_eq!(GdrLevel::parse("FAR"), None);
        assert!(decide(
            &facts(),
            &GdrSettings {
                level: Some("FAR".into()),
                ..Default::default()
            }
        )
        .unwrap_err()
        .contains("NCCL_NET_GDR_LEVEL=FAR"));
    }

    #[test]
    fn paths_map_to_levels() {
        assert_eq!(GdrLevel::of_path(None), GdrLevel::Sys);
        assert_eq!(GdrLevel::of_path(Some(Path::Node)), GdrLevel::Phb);
        assert_eq!(GdrLevel::of_path(Some(Path::Pxb)), GdrLevel::Pxb);
        assert_eq!(GdrLevel::of_path(Some(Path::Nv(4))), GdrLevel::Nvl);
    }

    /// Every distance against every level: on exactly when the distance is
    /// at most the level, and the reason names both when off.
    #[test]
    fn distance_against_level() {
        use GdrLevel::*;
        let all = [Loc, Nvl, Pix, Pxb, Phb, Sys];
        for d in all {
            for l in all {
                let c = decide(
                    &GdrFacts {
                        distance: d,
                        ..facts()
                    },
                    &GdrSettings {
                        level: Some(l.to_string()),
                        ..Default::default()
                    },
                )
                .unwrap();
                assert_eq!(c.recv, d <= l, "{d} {l}");
                assert!(!c.send, "sends stay staged unless asked: {d} {l}");
                if d > l {
                    assert!(
                        c.why.contains(&format!("{d} > NCCL_NET_GDR_LEVEL {l}")),
                        "{}",
                        c.why
                    );
                }
            }
        }
        // Unset: off, whatever the distance, and the reason says so.
        let c = decide(&facts(), &GdrSettings::default()).unwrap();
        assert!(
            !c.any() && c.why.contains("NCCL_NET_GDR_LEVEL unset"),
            "{c:?}"
        );
    }

    #[test]
    fn needs_the_plugin_and_the_gpu() {
        let c = decide(
            &GdrFacts {
                net_cuda: false,
                ..facts()
            },
            &on(),
        )
        .unwrap();
        assert!(!c.any() && c.why.contains("NCCL_PTR_CUDA"));
        // No RDMA by address, no DMA-BUF on the GPU: off.
        let c = decide(
            &GdrFacts {
                gpu_rdma: false,
                gpu_dmabuf: false,
                ..facts()
            },
            &on(),
        )
        .unwrap();
        assert!(!c.any(), "{c:?}");
        // DMA-BUF only, turned off by the setting: off, and the reason says so.
        let c = decide(
            &GdrFacts {
                gpu_rdma: false,
                ..facts()
            },
            &GdrSettings {
                dmabuf: Some(0),
                ..on()
            },
        )
        .unwrap();
        assert!(!c.any() && c.why.contains("NCCL_DMABUF_ENABLE=0"), "{c:?}");
    }

    #[test]
    fn registration_prefers_dmabuf() {
        let d = decide(&facts(), &on()).unwrap();
        assert_eq!(d.registration, Registration::DmaBuf);
        let off = GdrSettings {
            dmabuf: Some(0),
            ..on()
        };
        assert_eq!(
            decide(&facts(), &off).unwrap().registration,
            Registration::Address
        );
        let no_net = GdrFacts {
            net_dmabuf: false,
            ..facts()
        };
        assert_eq!(
            decide(&no_net, &on()).unwrap().registration,
            Registration::Address
        );
    }

    #[test]
    fn reads_follow_the_setting_and_the_architecture() {
        let set = |r| GdrSettings { read: r, ..on() };
        let volta = GdrFacts {
            gpu_cc: (7, 0),
            ..facts()
        };
        // Unset: staged on every architecture; 1: read on every one.
        assert!(!decide(&facts(), &set(None)).unwrap().send);
        assert!(decide(&facts(), &set(Some(1))).unwrap().send);
        assert!(!decide(&volta, &set(None)).unwrap().send);
        assert!(!decide(&volta, &set(Some(-2))).unwrap().send);
        assert!(decide(&volta, &set(Some(1))).unwrap().send);
        let no = decide(&facts(), &set(Some(0))).unwrap();
        assert!(no.recv && !no.send && no.why.contains("NCCL_NET_GDR_READ"));
    }

    #[test]
    fn flushes_before_hopper_or_when_asked() {
        let ampere = GdrFacts {
            gpu_cc: (8, 0),
            ..facts()
        };
        assert!(decide(&ampere, &on()).unwrap().flush);
        assert!(!decide(&facts(), &on()).unwrap().flush);
        let forced = GdrSettings {
            force_flush: Some(1),
            ..on()
        };
        assert!(decide(&facts(), &forced).unwrap().flush);
        let dev = GdrFacts {
            net_force_flush: true,
            ..facts()
        };
        assert!(decide(&dev, &on()).unwrap().flush);
        // A plugin without iflush is never asked.
        let none = GdrFacts {
            net_has_flush: false,
            ..ampere
        };
        assert!(!decide(&none, &forced).unwrap().flush);
    }
}
