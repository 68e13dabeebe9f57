//! The GPU setup's bootstrap rounds, on a machine with or without a GPU:
//! ranks that take part without a device, or whose device cannot be set
//! up, stay in step with each other, keep working on host buffers, and
//! pass their choice on to split children.

mod common;

use common::*;
use oxccl::gpu::{self, GpuChoice};
use oxccl::{Communicator, Config, RedOp};

fn with_gpu(choice: GpuChoice) -> Config {
    Config {
        gpu: choice,
        ..test_config(|_| {})
    }
}

/// Each rank all-reduces `count` elements of its rank + 1 on host buffers.
fn host_all_reduce(comms: &[Communicator], count: usize) {
    let n = comms.len();
    std::thread::scope(|s| {
        for c in comms {
            s.spawn(move || {
                let mut x = vec![c.rank() as f64 + 1.0; count];
                c.all_reduce_in_place(&mut x, RedOp::Sum).unwrap();
                let want = (n * (n + 1) / 2) as f64;
                assert!(x.iter().all(|&v| v == want), "rank {}: {x:?}", c.rank());
            });
        }
    });
}

#[test]
fn ranks_without_a_device_take_part_and_work_on_host_buffers() {
    let comms = Communicator::init_all_config(3, |_| with_gpu(GpuChoice::NoDevice)).unwrap();
    for c in &comms {
        assert_eq!(c.device(), None);
        assert!(c.gpu_error().is_none());
    }
    host_all_reduce(&comms, 0);
    host_all_reduce(&comms, 1001);
}

#[test]
fn a_device_that_cannot_be_set_up_leaves_the_host_path_working() {
    // GPU 1000 exists nowhere: its rank's setup fails (a WARN), the other
    // still takes part in the same rounds.
    let comms = Communicator::init_all_config(2, |r| {
        with_gpu(if r == 0 {
            GpuChoice::Device(1000)
        } else {
            GpuChoice::NoDevice
        })
    })
    .unwrap();
    assert_eq!(comms[0].device(), None);
    host_all_reduce(&comms, 17);
}

#[test]
fn split_children_keep_the_setup_rounds_in_step() {
    let comms = Communicator::init_all_config(4, |_| with_gpu(GpuChoice::NoDevice)).unwrap();
    let kids: Vec<Communicator> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| s.spawn(move || c.split(Some((c.rank() % 2) as u32), 0).unwrap()))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap().expect("every rank has a color"))
            .collect()
    });
    for k in &kids {
        assert_eq!(k.size(), 2);
        assert_eq!(k.device(), None);
    }
    // Colors 0 (parent ranks 0, 2) and 1 (1, 3): each child works.
    host_all_reduce(&[kids[0].clone(), kids[2].clone()], 9);
    host_all_reduce(&[kids[1].clone(), kids[3].clone()], 9);
    for c in comms {
        c.destroy().unwrap();
    }
}

#[test]
fn host_buffers_never_route_to_the_gpu() {
    let a = [1u8; 64];
    let mut b = [0u8; 64];
    let (s, r) = (a.as_ptr().cast(), b.as_mut_ptr().cast_const().cast());
    assert!(gpu::raw::locate_buffers(s, r).unwrap().is_none());
    // NULL on one side (a send, a receive) is no device memory either.
    assert!(gpu::raw::locate_buffers(s, std::ptr::null())
        .unwrap()
        .is_none());
    assert!(gpu::raw::locate_buffers(std::ptr::null(), r)
        .unwrap()
        .is_none());
}
