//! The 128-byte unique id (`ncclUniqueId`).
//!
//! Layout (all integers little-endian except the port, which is big-endian as
//! on the wire):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `"OXCCLUID"` |
//! | 8 | 2 | layout version, 1 |
//! | 10 | 1 | address family: 4 (IPv4) or 6 (IPv6) |
//! | 11 | 1 | flags: bit 0 = rank 0 starts the root at this address (`NCCL_COMM_ID`); other bits 0 |
//! | 12 | 2 | root port (big-endian, non-zero) |
//! | 14 | 2 | reserved, 0 |
//! | 16 | 16 | root IP (IPv4 in the first 4 bytes, the rest 0) |
//! | 32 | 4 | IPv6 scope id (0 for IPv4) |
//! | 36 | 4 | reserved, 0 |
//! | 40 | 8 | run id |
//! | 48 | 32 | secret (HMAC key for every bootstrap handshake) |
//! | 80 | 48 | reserved, 0 |
//!
//! An id from `generate` has a random secret and run id. With `NCCL_COMM_ID`
//! every process must be able to make the same id on its own, so both are
//! derived: secret = SHA-256(`OXCCL_AUTH_SECRET`), or, when that is unset,
//! SHA-256(`"oxccl-unauthenticated-v1"`) (anyone can join: logged once at WARN,
//! refused with `OXCCL_AUTH_REQUIRED`);
//! run id = the first 8 bytes (LE) of SHA-256(`"oxccl-run-id"` || secret ||
//! bytes 10..36 of the id).
//!
//! The secret is never printed (`Debug` redacts it).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, ToSocketAddrs};

use oxccl_core::{Error, Result};
use sha2::{Digest, Sha256};

use crate::{Family, UNAUTHENTICATED_SECRET};

/// Size of a unique id in bytes (`NCCL_UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = 128;
const MAGIC: &[u8; 8] = b"OXCCLUID";
const VERSION: u16 = 1;
/// Flag: rank 0's `init` binds the root at the id's address (`NCCL_COMM_ID`).
pub(crate) const FLAG_EXTERNAL_ROOT: u8 = 1;

/// An opaque 128-byte rendezvous handle. See the module docs for the layout.
#[derive(Clone, PartialEq, Eq)]
pub struct UniqueId {
    bytes: [u8; UNIQUE_ID_BYTES],
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UniqueId")
            .field("root", &self.root_addr())
            .field("run_id", &format_args!("{:#018x}", self.run_id()))
            .field("rank0_starts_root", &self.rank0_starts_root())
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl UniqueId {
    /// The raw bytes (what `ncclGetUniqueId` hands out).
    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.bytes
    }

    /// Validates raw bytes: magic, version, family, flags, port, reserved fields.
    pub fn from_bytes(b: &[u8; UNIQUE_ID_BYTES]) -> Result<UniqueId> {
        let bad = |why: String| Err(Error::invalid_argument(format!("unique id: {why}")));
        if &b[..8] != MAGIC {
            return bad(format!(
                "bad magic {:02x?} (not made by oxccl's ncclGetUniqueId, or corrupted in transit)",
                &b[..8]
            ));
        }
        let ver = u16::from_le_bytes([b[8], b[9]]);
        if ver != VERSION {
            return bad(format!(
                "layout version {ver} is not supported (this oxccl reads version {VERSION}); were the ranks built from different oxccl versions?"
            ));
        }
        match b[10] {
            4 => {
                if b[20..32].iter().any(|&x| x != 0) {
                    return bad("IPv4 address has non-zero padding".into());
                }
            }
            6 => {}
            f => return bad(format!("unknown address family {f} (expected 4 or 6)")),
        }
        if b[11] & !FLAG_EXTERNAL_ROOT != 0 {
            return bad(format!("unknown flags {:#04x}", b[11]));
        }
        if b[12] == 0 && b[13] == 0 {
            return bad("root port is 0".into());
        }
        if b[14..16]
            .iter()
            .chain(&b[36..40])
            .chain(&b[80..])
            .any(|&x| x != 0)
        {
            return bad("reserved bytes are not zero".into());
        }
        Ok(UniqueId { bytes: *b })
    }

    /// Builds an id from its parts.
    pub(crate) fn new(root: SocketAddr, run_id: u64, secret: &[u8; 32], flags: u8) -> UniqueId {
        let mut b = [0u8; UNIQUE_ID_BYTES];
        b[..8].copy_from_slice(MAGIC);
        b[8..10].copy_from_slice(&VERSION.to_le_bytes());
        b[11] = flags;
        b[12..14].copy_from_slice(&root.port().to_be_bytes());
        match root {
            SocketAddr::V4(a) => {
                b[10] = 4;
                b[16..20].copy_from_slice(&a.ip().octets());
            }
            SocketAddr::V6(a) => {
                b[10] = 6;
                b[16..32].copy_from_slice(&a.ip().octets());
                b[32..36].copy_from_slice(&a.scope_id().to_le_bytes());
            }
        }
        b[40..48].copy_from_slice(&run_id.to_le_bytes());
        b[48..80].copy_from_slice(secret);
        UniqueId { bytes: b }
    }

    /// An id for `NCCL_COMM_ID`: derived secret and run id (see module docs).
    pub(crate) fn for_comm_id(root: SocketAddr, secret: &[u8; 32]) -> UniqueId {
        let mut id = UniqueId::new(root, 0, secret, FLAG_EXTERNAL_ROOT);
        let mut h = Sha256::new();
        h.update(b"oxccl-run-id");
        h.update(secret);
        h.update(&id.bytes[10..36]);
        let d = h.finalize();
        id.bytes[40..48].copy_from_slice(&d[..8]);
        id
    }

    /// The root's address.
    pub fn root_addr(&self) -> SocketAddr {
        let b = &self.bytes;
        let port = u16::from_be_bytes([b[12], b[13]]);
        if b[10] == 4 {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::new(b[16], b[17], b[18], b[19])), port)
        } else {
            let ip: [u8; 16] = b[16..32].try_into().expect("16");
            let scope = u32::from_le_bytes(b[32..36].try_into().expect("4"));
            SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, 0, scope))
        }
    }

    /// The run id.
    pub fn run_id(&self) -> u64 {
        u64::from_le_bytes(self.bytes[40..48].try_into().expect("8"))
    }

    /// Whether rank 0's `init` starts the root (`NCCL_COMM_ID` ids).
    pub fn rank0_starts_root(&self) -> bool {
        self.bytes[11] & FLAG_EXTERNAL_ROOT != 0
    }

    pub(crate) fn secret(&self) -> &[u8; 32] {
        self.bytes[48..80].try_into().expect("32")
    }
}

/// The secret for `NCCL_COMM_ID` ids (see module docs).
pub(crate) fn derived_secret(auth_secret: Option<&str>) -> [u8; 32] {
    let src: &[u8] = match auth_secret {
        Some(s) => s.as_bytes(),
        None => UNAUTHENTICATED_SECRET.as_bytes(),
    };
    Sha256::digest(src).into()
}

/// Parses `NCCL_COMM_ID`: `<ipv4>:<port>`, `[<ipv6>]:<port>` or `<hostname>:<port>`
/// (the host name is resolved; the first address of `family`, if given, wins).
pub fn parse_comm_id(s: &str, family: Option<Family>) -> Result<SocketAddr> {
    let bad = |why: &str| {
        Error::invalid_argument(format!(
            "NCCL_COMM_ID={s}: {why} (expected <ipv4>:<port>, [<ipv6>]:<port> or <hostname>:<port>)"
        ))
    };
    let t = s.trim();
    let (host, port) = if let Some(r) = t.strip_prefix('[') {
        let (h, p) = r
            .split_once("]:")
            .ok_or_else(|| bad("no ']:' after the IPv6 address"))?;
        (h, p)
    } else {
        t.rsplit_once(':').ok_or_else(|| bad("no ':<port>'"))?
    };
    let port: u16 = port
        .parse()
        .map_err(|_| bad("the port is not a number from 1 to 65535"))?;
    if port == 0 {
        return Err(bad("port 0 cannot be agreed on in advance"));
    }
    if host.is_empty() {
        return Err(bad("the host is empty"));
    }
    let fam_ok = |a: &SocketAddr| match family {
        None => true,
        Some(Family::V4) => a.is_ipv4(),
        Some(Family::V6) => a.is_ipv6(),
    };
    if let Ok(ip) = host.parse::<IpAddr>() {
        let a = SocketAddr::new(ip, port);
        if !fam_ok(&a) {
            return Err(bad("the address does not match NCCL_SOCKET_FAMILY"));
        }
        return Ok(a);
    }
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| bad(&format!("cannot resolve '{host}': {e}")))?
        .collect();
    addrs
        .iter()
        .find(|a| fam_ok(a) && a.is_ipv4())
        .or_else(|| addrs.iter().find(|a| fam_ok(a)))
        .copied()
        .ok_or_else(|| bad(&format!("'{host}' has no address of the requested family")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let a: SocketAddr = "10.0.0.1:4444".parse().unwrap();
        let id = UniqueId::new(a, 0x1234, &[7; 32], 0);
        let back = UniqueId::from_bytes(id.as_bytes()).unwrap();
        assert_eq!(back.root_addr(), a);
        assert_eq!(back.run_id(), 0x1234);
        assert_eq!(back.secret(), &[7; 32]);
        assert!(!back.rank0_starts_root());
        let v6 = SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 9, 0, 3));
        let id = UniqueId::for_comm_id(v6, &[1; 32]);
        let back = UniqueId::from_bytes(id.as_bytes()).unwrap();
        assert_eq!(back.root_addr(), v6);
        assert!(back.rank0_starts_root());
        assert_eq!(back, UniqueId::for_comm_id(v6, &[1; 32]));
        assert!(!format!("{back:?}").contains("[1, 1"));
    }

    #[test]
    fn garbage_named() {
        let e = UniqueId::from_bytes(&[0; 128]).unwrap_err();
        assert!(e.message().contains("bad magic"), "{e}");
        let mut b = *UniqueId::new("1.2.3.4:5".parse().unwrap(), 1, &[0; 32], 0).as_bytes();
        b[8] = 9;
        assert!(UniqueId::from_bytes(&b)
            .unwrap_err()
            .message()
            .contains("version 9"));
        b[8] = 1;
        b[10] = 5;
        assert!(UniqueId::from_bytes(&b)
            .unwrap_err()
            .message()
            .contains("family 5"));
        b[10] = 4;
        b[100] = 1;
        assert!(UniqueId::from_bytes(&b)
            .unwrap_err()
            .message()
            .contains("reserved"));
    }

    #[test]
    fn comm_id_grammar() {
        assert_eq!(
            parse_comm_id("10.0.0.1:4444", None).unwrap(),
            "10.0.0.1:4444".parse().unwrap()
        );
        assert_eq!(
            parse_comm_id("[::1]:80", None).unwrap(),
            "[::1]:80".parse().unwrap()
        );
        assert!(parse_comm_id("localhost:80", Some(Family::V4))
            .unwrap()
            .is_ipv4());
        for bad in [
            "10.0.0.1",
            "10.0.0.1:0",
            "[::1:80",
            ":80",
            "h:x",
            "10.0.0.1:70000",
        ] {
            let e = parse_comm_id(bad, None).unwrap_err();
            assert!(e.message().starts_with("NCCL_COMM_ID="), "{e}");
        }
        assert!(parse_comm_id("[::1]:80", Some(Family::V4)).is_err());
    }
}
