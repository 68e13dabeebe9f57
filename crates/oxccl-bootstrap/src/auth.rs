//! Mutual challenge/response on every bootstrap connection.
//!
//! Fixed-size fields only (nothing length-prefixed is read before this
//! succeeds). `C` is the side that connected, `S` the side that accepted,
//! `key` the unique id's 32-byte secret:
//!
//! ```text
//! C -> S: "OXCCLBS1" || nonce_c (32 random bytes)
//! S -> C: "OXCCLBS1" || nonce_s (32 random bytes)
//! C -> S: HMAC-SHA256(key, "oxccl-v1" || "C" || nonce_s || nonce_c)
//! S:      verifies; on failure closes the connection (C sees EOF: "not accepted")
//! S -> C: HMAC-SHA256(key, "oxccl-v1" || "S" || nonce_c || nonce_s)
//! C:      verifies
//! ```
//!
//! The connecting side proves itself first, so the accepting side (the root,
//! a rank's listener) never computes a proof for an unauthenticated party. The
//! role byte keeps one side's proof from being replayed as the other's; fresh
//! nonces on both sides keep old transcripts from being replayed at all. The
//! secret never crosses the wire.

use std::net::TcpStream;

use hmac::{Hmac, Mac};
use oxccl_core::{Error, Result};
use sha2::Sha256;

use crate::wire::{read_full, write_full, Limits};

const MAGIC: &[u8; 8] = b"OXCCLBS1";
const LABEL: &[u8] = b"oxccl-v1";

/// Why a handshake failed.
#[derive(Debug)]
pub enum HandshakeError {
    /// The other side closed the connection after our proof: it rejected our key.
    Rejected,
    /// The other side's proof was wrong (it holds another key).
    BadProof,
    /// The other side does not speak this protocol.
    NotOxccl,
    /// The other side closed or reset the connection before answering our
    /// hello: a busy listener shedding connections (retry), or no listener.
    Closed,
    /// I/O failure, timeout or abort.
    Io(Error),
}

impl From<Error> for HandshakeError {
    fn from(e: Error) -> Self {
        HandshakeError::Io(e)
    }
}

fn proof(key: &[u8; 32], role: u8, theirs: &[u8; 32], mine: &[u8; 32]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(LABEL);
    m.update(&[role]);
    m.update(theirs);
    m.update(mine);
    m
}

/// 32 random bytes.
pub fn nonce() -> Result<[u8; 32]> {
    let mut n = [0u8; 32];
    getrandom::getrandom(&mut n)
        .map_err(|e| Error::system(format!("bootstrap: no randomness available: {e}")))?;
    Ok(n)
}

/// The connecting side.
pub fn client(
    s: &mut TcpStream,
    key: &[u8; 32],
    lim: &Limits,
) -> std::result::Result<(), HandshakeError> {
    let nc = nonce()?;
    let mut hello = [0u8; 40];
    hello[..8].copy_from_slice(MAGIC);
    hello[8..].copy_from_slice(&nc);
    write_full(s, &hello, lim)?;
    let mut reply = [0u8; 40];
    match read_full(s, &mut reply, lim, true) {
        Ok(true) => {}
        Ok(false) => return Err(HandshakeError::Closed),
        Err(e) if e.kind() == oxccl_core::ErrorKind::Remote => return Err(HandshakeError::Closed),
        Err(e) => return Err(HandshakeError::Io(e)),
    }
    if &reply[..8] != MAGIC {
        return Err(HandshakeError::NotOxccl);
    }
    let ns: [u8; 32] = reply[8..].try_into().expect("32");
    let mine = proof(key, b'C', &ns, &nc).finalize().into_bytes();
    write_full(s, &mine, lim)?;
    let mut theirs = [0u8; 32];
    match read_full(s, &mut theirs, lim, true) {
        Ok(true) => {}
        Ok(false) => return Err(HandshakeError::Rejected),
        Err(e) if e.kind() == oxccl_core::ErrorKind::Remote => {
            // Reset instead of a clean close: also a rejection.
            return Err(HandshakeError::Rejected);
        }
        Err(e) => return Err(HandshakeError::Io(e)),
    }
    proof(key, b'S', &nc, &ns)
        .verify_slice(&theirs)
        .map_err(|_| HandshakeError::BadProof)
}

/// The accepting side, between its two reads (no I/O: the listener's
/// poll loop does it). `hello` is the client's 40 bytes; returns the state
/// and the 40-byte reply to send.
pub fn server_hello(
    hello: &[u8; 40],
) -> std::result::Result<(ServerSide, [u8; 40]), HandshakeError> {
    if &hello[..8] != MAGIC {
        return Err(HandshakeError::NotOxccl);
    }
    let nc: [u8; 32] = hello[8..].try_into().expect("32");
    let ns = nonce()?;
    let mut reply = [0u8; 40];
    reply[..8].copy_from_slice(MAGIC);
    reply[8..].copy_from_slice(&ns);
    Ok((ServerSide { nc, ns }, reply))
}

/// The accepting side's nonces after the hello.
pub struct ServerSide {
    nc: [u8; 32],
    ns: [u8; 32],
}

impl ServerSide {
    /// Checks the client's 32-byte proof; returns ours to send.
    pub fn finish(
        &self,
        key: &[u8; 32],
        theirs: &[u8; 32],
    ) -> std::result::Result<[u8; 32], HandshakeError> {
        proof(key, b'C', &self.ns, &self.nc)
            .verify_slice(theirs)
            .map_err(|_| HandshakeError::BadProof)?;
        Ok(proof(key, b'S', &self.nc, &self.ns)
            .finalize()
            .into_bytes()
            .into())
    }
}
