//! Peers that are threads of one process: heap-backed SPSC rings.

use std::sync::Arc;

use oxccl_core::Result;

use super::control::PeerControl;
use super::ring::{check_capacity, heap_ring, Liveness};
use super::{LinkKind, PeerLink, RecvHalf, SendHalf};

/// The two ends of an in-process link between ranks `peer_a` and `peer_b`:
/// the first link is held by `peer_a` (its `peer` is `peer_b`), the second by
/// `peer_b`. Each has `nchannels` streams of `capacity` bytes (a multiple of 8,
/// at least 64) in each direction. Dropping either link is seen by the other's
/// `control.check()` (and by its empty receive / full send rings) as a remote
/// error.
pub fn inproc_pair(
    peer_a: usize,
    peer_b: usize,
    nchannels: usize,
    capacity: usize,
) -> Result<(PeerLink, PeerLink)> {
    check_capacity(capacity)?;
    let (ctl_a, ctl_b) = PeerControl::inproc_pair(peer_a, peer_b);
    let view = |c: &PeerControl| -> Option<Arc<dyn Liveness>> {
        c.inproc_view().map(|v| Arc::new(v) as Arc<dyn Liveness>)
    };
    let (live_a, live_b) = (view(&ctl_a), view(&ctl_b));
    let mut a_send: Vec<Box<dyn SendHalf>> = Vec::with_capacity(nchannels);
    let mut a_recv: Vec<Box<dyn RecvHalf>> = Vec::with_capacity(nchannels);
    let mut b_send: Vec<Box<dyn SendHalf>> = Vec::with_capacity(nchannels);
    let mut b_recv: Vec<Box<dyn RecvHalf>> = Vec::with_capacity(nchannels);
    for _ in 0..nchannels {
        let (tx, rx) = heap_ring(capacity, live_a.clone(), live_b.clone())?;
        a_send.push(Box::new(tx));
        b_recv.push(Box::new(rx));
        let (tx, rx) = heap_ring(capacity, live_b.clone(), live_a.clone())?;
        b_send.push(Box::new(tx));
        a_recv.push(Box::new(rx));
    }
    Ok((
        PeerLink {
            peer: peer_b,
            kind: LinkKind::InProc,
            send: a_send,
            recv: a_recv,
            control: ctl_a,
        },
        PeerLink {
            peer: peer_a,
            kind: LinkKind::InProc,
            send: b_send,
            recv: b_recv,
            control: ctl_b,
        },
    ))
}
