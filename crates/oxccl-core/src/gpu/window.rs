//! How a rank of the GPU ring reaches each peer's window: the descriptor
//! the ranks trade at setup, and the transport that each peer takes.
//!
//! Every transport ends the same way for the kernels: one address in the
//! window table per rank, which the device code writes and reads through
//! (ring.cu's `region_of`). What differs is how that address is obtained,
//! which is decided here ([`peer_path`]) and acted on by oxccl-cuda's ring
//! setup:
//!
//! | peer | window in device memory | window in pinned host memory |
//! | --- | --- | --- |
//! | this rank | its own pointer | its own registered pointer |
//! | same process | its pointer (peer access to its GPU) | its registered pointer |
//! | same host | CUDA IPC handle, opened | `/dev/shm` file, mapped and registered |
//! | other host | a local shadow that the network proxies fill | the same |

use crate::{Error, Result};

/// Where a rank's ring window lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    /// Device memory, reached by peers through CUDA IPC or peer access.
    Device,
    /// Pinned host memory in /dev/shm (no peer-to-peer, or NCCL_P2P_DISABLE=1).
    Host,
}

impl WindowKind {
    /// How NCCL's INFO lines name the transport between two ranks of one
    /// host.
    pub fn transport(self, same_process: bool) -> &'static str {
        match (self, same_process) {
            (WindowKind::Device, true) => "P2P/direct pointer",
            (WindowKind::Device, false) => "P2P/IPC",
            (WindowKind::Host, _) => "SHM/host memory",
        }
    }

    fn tag(self) -> u8 {
        match self {
            WindowKind::Device => 1,
            WindowKind::Host => 2,
        }
    }
}

/// Longest `/dev/shm` name a descriptor carries (bytes, without the NUL).
pub const SHM_NAME_MAX: usize = 63;

/// What a rank tells every other about its window: where it lives, its
/// address as this rank's processes see it (a device pointer, or the
/// device pointer of the registered host mapping), and how another
/// process opens it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowDescriptor {
    pub kind: WindowKind,
    /// The window's address in the owner's process.
    pub addr: u64,
    /// `CUipcMemHandle` of a device window (zeros for a host window).
    pub ipc_handle: [u8; 64],
    /// The `/dev/shm` name of a host window (empty for a device window),
    /// at most [`SHM_NAME_MAX`] bytes, no NUL.
    pub shm_name: Vec<u8>,
}

impl WindowDescriptor {
    /// Encoded length: kind (1), address (8), IPC handle (64), name (64,
    /// NUL-padded).
    pub const LEN: usize = 1 + 8 + 64 + 64;

    /// A device window at `addr`, opened elsewhere through `ipc_handle`.
    pub fn device(addr: u64, ipc_handle: [u8; 64]) -> WindowDescriptor {
        WindowDescriptor {
            kind: WindowKind::Device,
            addr,
            ipc_handle,
            shm_name: Vec::new(),
        }
    }

    /// A host window registered at `addr`, mapped elsewhere by `name`
    /// (refused past [`SHM_NAME_MAX`] bytes or with a NUL in it).
    pub fn host(addr: u64, name: &[u8]) -> Result<WindowDescriptor> {
        if name.len() > SHM_NAME_MAX || name.contains(&0) {
            return Err(Error::internal(format!(
                "GPU ring window name {:?}: at most {SHM_NAME_MAX} bytes without NUL",
                String::from_utf8_lossy(name)
            )));
        }
        Ok(WindowDescriptor {
            kind: WindowKind::Host,
            addr,
            ipc_handle: [0; 64],
            shm_name: name.to_vec(),
        })
    }

    /// The bytes traded at setup ([`Self::LEN`] of them).
    pub fn encode(&self) -> Vec<u8> {
        let mut d = vec![0u8; Self::LEN];
        d[0] = self.kind.tag();
        d[1..9].copy_from_slice(&self.addr.to_le_bytes());
        d[9..73].copy_from_slice(&self.ipc_handle);
        let n = self.shm_name.len().min(SHM_NAME_MAX);
        d[73..73 + n].copy_from_slice(&self.shm_name[..n]);
        d
    }

    /// Rank `rank`'s descriptor from the bytes it sent: an error naming
    /// the rank when they are not one.
    pub fn decode(b: &[u8], rank: usize) -> Result<WindowDescriptor> {
        if b.len() != Self::LEN {
            return Err(Error::internal(format!(
                "GPU ring setup: rank {rank}'s window descriptor has {} bytes, not {}",
                b.len(),
                Self::LEN
            )));
        }
        let kind = match b[0] {
            1 => WindowKind::Device,
            2 => WindowKind::Host,
            k => {
                return Err(Error::internal(format!(
                    "GPU ring setup: rank {rank} sent window kind {k}"
                )))
            }
        };
        let mut addr = [0u8; 8];
        addr.copy_from_slice(&b[1..9]);
        let mut ipc_handle = [0u8; 64];
        ipc_handle.copy_from_slice(&b[9..73]);
        let name = &b[73..];
        let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
        if end > SHM_NAME_MAX {
            return Err(Error::internal(format!(
                "GPU ring setup: rank {rank}'s window name is not NUL-terminated"
            )));
        }
        Ok(WindowDescriptor {
            kind,
            addr: u64::from_le_bytes(addr),
            ipc_handle,
            shm_name: name[..end].to_vec(),
        })
    }
}

/// Where a peer's window is, as seen from this rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerSite {
    /// The peer is this rank.
    pub is_self: bool,
    pub same_host: bool,
    pub same_process: bool,
    /// Same GPU as this rank (ranks sharing one GPU need no peer access).
    pub same_gpu: bool,
}

/// How this rank reaches one peer's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerPath {
    /// This rank's own window: its address as it is.
    Own,
    /// Another rank of this process: its address as it is, after enabling
    /// peer access to its GPU when `peer_access`.
    Pointer { peer_access: bool },
    /// A device window of another process of this host: its IPC handle.
    Ipc,
    /// A host window of another process of this host: its /dev/shm file.
    SharedMemory,
    /// A rank of another host: a local shadow window that the network
    /// proxies fill.
    Network,
}

/// The path to a peer whose descriptor says `kind`, at `site`.
pub fn peer_path(kind: WindowKind, site: PeerSite) -> PeerPath {
    if site.is_self {
        return PeerPath::Own;
    }
    if !site.same_host {
        return PeerPath::Network;
    }
    match (kind, site.same_process) {
        (WindowKind::Device, true) => PeerPath::Pointer {
            peer_access: !site.same_gpu,
        },
        (WindowKind::Host, true) => PeerPath::Pointer { peer_access: false },
        (WindowKind::Device, false) => PeerPath::Ipc,
        (WindowKind::Host, false) => PeerPath::SharedMemory,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn handle(seed: u8) -> [u8; 64] {
        std::array::from_fn(|i| seed.wrapping_add(i as u8))
    }

    #[test]
    fn every_site_has_one_path() {
        let site = |is_self, same_host, same_process, same_gpu| PeerSite {
            is_self,
            same_host,
            same_process,
            same_gpu,
        };
        for kind in [WindowKind::Device, WindowKind::Host] {
            assert_eq!(peer_path(kind, site(true, true, true, true)), PeerPath::Own);
            // Another host wins over anything the other fields say.
            assert_eq!(
                peer_path(kind, site(false, false, false, false)),
                PeerPath::Network
            );
        }
        use WindowKind::*;
        assert_eq!(
            peer_path(Device, site(false, true, true, false)),
            PeerPath::Pointer { peer_access: true }
        );
        assert_eq!(
            peer_path(Device, site(false, true, true, true)),
            PeerPath::Pointer { peer_access: false }
        );
        assert_eq!(
            peer_path(Host, site(false, true, true, false)),
            PeerPath::Pointer { peer_access: false }
        );
        assert_eq!(
            peer_path(Device, site(false, true, false, true)),
            PeerPath::Ipc
        );
        assert_eq!(
            peer_path(Host, site(false, true, false, false)),
            PeerPath::SharedMemory
        );
    }

    #[test]
    fn bad_descriptors_name_the_rank() {
        let e = WindowDescriptor::decode(&[1u8; 10], 3).unwrap_err();
        assert!(e.to_string().contains("rank 3") && e.to_string().contains("10 bytes"));
        let mut d = WindowDescriptor::device(7, handle(1)).encode();
        d[0] = 9;
        let e = WindowDescriptor::decode(&d, 5).unwrap_err();
        assert!(e.to_string().contains("rank 5 sent window kind 9"), "{e}");
        let mut d = WindowDescriptor::host(7, b"/x").unwrap().encode();
        d[73..].fill(b'a');
        let e = WindowDescriptor::decode(&d, 2).unwrap_err();
        assert!(e.to_string().contains("not NUL-terminated"), "{e}");
        assert!(WindowDescriptor::host(1, &[b'a'; SHM_NAME_MAX + 1]).is_err());
        assert!(WindowDescriptor::host(1, b"a\0b").is_err());
        assert!(WindowDescriptor::host(1, &[b'a'; SHM_NAME_MAX]).is_ok());
    }

    proptest! {
        #[test]
        fn descriptors_round_trip(
            addr in any::<u64>(),
            seed in any::<u8>(),
            name in proptest::collection::vec(1u8..=255, 0..=SHM_NAME_MAX),
            device in any::<bool>(),
        ) {
            let d = if device {
                WindowDescriptor::device(addr, handle(seed))
            } else {
                WindowDescriptor::host(addr, &name).unwrap()
            };
            let b = d.encode();
            prop_assert_eq!(b.len(), WindowDescriptor::LEN);
            prop_assert_eq!(WindowDescriptor::decode(&b, 0).unwrap(), d);
        }
    }
}
