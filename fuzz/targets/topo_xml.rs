//! Topology XML (`NCCL_TOPO_FILE`, `oxccl topo`): `Topology::from_xml` gives a
//! topology or an error naming a line; every view of an accepted topology
//! works, and writing it out reads back to the same topology.

use honggfuzz::fuzz;
use oxccl_core::topo::{self, Topology};
use oxccl_fuzz::text;

fn main() {
    loop {
        fuzz!(|b: &[u8]| {
            let Some(s) = text(b) else { return };
            match Topology::from_xml(s) {
                Ok(t) => {
                    let m = t.matrix();
                    let ring = topo::best_ring(&m);
                    assert_eq!(ring.len(), m.len());
                    let g = t.gpus();
                    for a in &g {
                        for c in &g {
                            let _ = topo::acs_between(a, c);
                        }
                    }
                    for pos in 0..ring.len() {
                        let _ = topo::tree_links(&ring, pos);
                    }
                    let _ = t.nics();
                    let again =
                        Topology::from_xml(&t.to_xml()).expect("written topology reads back");
                    assert_eq!(again, t, "round trip");
                }
                Err(e) => {
                    assert!(e.line >= 1, "errors name a line: {e}");
                    assert!(!e.msg.is_empty());
                }
            }
        });
    }
}
