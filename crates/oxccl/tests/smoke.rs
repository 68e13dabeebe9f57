use oxccl::{Communicator, RedOp};

#[test]
fn threads_all_reduce_sizes() {
    for n in [1usize, 2, 3, 4] {
        let comms = Communicator::init_all(n).unwrap();
        std::thread::scope(|s| {
            for c in &comms {
                s.spawn(move || {
                    for count in [0usize, 1, 7, 1000, 300_001] {
                        let send: Vec<f32> = (0..count)
                            .map(|i| (i % 7) as f32 + c.rank() as f32)
                            .collect();
                        let mut recv = vec![0f32; count];
                        c.all_reduce(&send, &mut recv, RedOp::Sum).unwrap();
                        for i in 0..count {
                            let want: f32 = (0..n).map(|r| (i % 7) as f32 + r as f32).sum();
                            assert_eq!(recv[i], want, "n={n} count={count} i={i}");
                        }
                    }
                });
            }
        });
    }
}
