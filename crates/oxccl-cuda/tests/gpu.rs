//! GPU tests: device memory, the copy kernel, peer access and the one-shot
//! all-reduce on two GPUs of one process, checked against oxccl-core's host
//! reduction. Every test is `#[ignore = "needs a GPU: ..."]` and fails where
//! the GPUs it needs are missing: scripts/gpu-test.sh runs them with
//! `--include-ignored` on the GPU machine (the timing in its own row).

use oxccl_core::{DataType, RedOp, Reduction};
use oxccl_cuda::allreduce::{self, At, OneShot2};
use oxccl_cuda::{compile, kernels, loader, Gpu};

/// Panics unless the driver sees at least `need` GPUs: these tests are
/// `#[ignore]`d and run where GPUs are (scripts/gpu-test.sh).
fn require_gpus(test: &str, need: usize) {
    match loader::probe_driver() {
        Ok(info) if info.devices >= need => {}
        Ok(info) => panic!("{test}: needs {need} GPU(s), {} visible", info.devices),
        Err(u) => panic!("{test}: needs {need} GPU(s): {}", u.to_error()),
    }
}

/// xorshift64*: reproducible inputs without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Random elements of `t`: integers over their whole range, floats from
/// [-4, 4) encoded in the type (no NaN, no overflow in sum or product of two).
fn random(t: DataType, count: usize, rng: &mut Rng) -> Vec<u8> {
    use oxccl_core::float;
    let mut out = Vec::with_capacity(count * t.size());
    for _ in 0..count {
        let r = rng.next();
        let f = ((r >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0;
        match t {
            DataType::Float32 => out.extend_from_slice(&f.to_le_bytes()),
            DataType::Float64 => out.extend_from_slice(
                &(((r >> 11) as f64 / (1u64 << 53) as f64) * 8.0 - 4.0).to_le_bytes(),
            ),
            DataType::Float16 => out.extend_from_slice(&float::f32_to_f16(f).to_le_bytes()),
            DataType::Bfloat16 => out.extend_from_slice(&float::f32_to_bf16(f).to_le_bytes()),
            DataType::Float8e4m3 => out.push(float::f32_to_e4m3(f)),
            DataType::Float8e5m2 => out.push(float::f32_to_e5m2(f)),
            _ => out.extend_from_slice(&r.to_le_bytes()[..t.size()]),
        }
    }
    out
}

/// What both ranks must hold: x0 op x1, by the host reduction.
fn reference(t: DataType, op: RedOp, x0: &[u8], x1: &[u8]) -> Vec<u8> {
    let r = Reduction::new(t, op, 2).unwrap();
    let mut tmp = vec![0u8; x0.len()];
    let mut out = vec![0u8; x0.len()];
    r.start(&mut tmp, x0, false);
    r.accumulate(&mut out, x1, &tmp, true);
    out
}

/// Elements that differ; narrow floats may differ by one unit in the last
/// place (f32 vs. host rounding paths), counted separately.
fn compare(t: DataType, got: &[u8], want: &[u8]) -> (usize, usize) {
    let (mut wrong, mut ulp) = (0, 0);
    let s = t.size();
    for (g, w) in got.chunks_exact(s).zip(want.chunks_exact(s)) {
        if g == w {
            continue;
        }
        let narrow = matches!(
            t,
            DataType::Float16 | DataType::Bfloat16 | DataType::Float8e4m3 | DataType::Float8e5m2
        );
        let gi = g.iter().rev().fold(0u64, |a, b| a << 8 | *b as u64);
        let wi = w.iter().rev().fold(0u64, |a, b| a << 8 | *b as u64);
        if narrow && gi.abs_diff(wi) == 1 {
            ulp += 1;
        } else {
            wrong += 1;
        }
    }
    (wrong, ulp)
}

#[test]
#[ignore = "needs a GPU: device memory round trip and copy kernel"]
fn device_memory_round_trip_and_copy_kernel() {
    require_gpus("device_memory_round_trip_and_copy_kernel", 1);
    let g = Gpu::new(0).unwrap();
    eprintln!(
        "GPU 0: {} sm_{} {} SMs",
        g.name().unwrap(),
        g.arch().unwrap(),
        g.sm_count().unwrap()
    );
    let img = compile::compile(&kernels::COPY, g.arch().unwrap()).unwrap();
    eprintln!("copy.cu: {:?}", img.origin);
    let m = g.load_module(&img.image).unwrap();
    let mut rng = Rng(7);
    for bytes in [1usize, 15, 16, 17, 4096, 1 << 20, (1 << 20) + 3] {
        let src = g.alloc(bytes + 8).unwrap();
        let dst = g.alloc(bytes + 8).unwrap();
        let data = random(DataType::Uint8, bytes, &mut rng);
        src.write(0, &data).unwrap();
        dst.fill(0xa5).unwrap();
        for off in [0usize, 1] {
            allreduce::copy(
                &g,
                &m,
                At {
                    buf: &dst,
                    offset: off,
                },
                At {
                    buf: &src,
                    offset: 0,
                },
                bytes,
            )
            .unwrap();
            let mut back = vec![0u8; bytes];
            dst.read(off, &mut back).unwrap();
            assert_eq!(back, data, "copy of {bytes} bytes to offset {off}");
        }
    }
}

#[test]
#[ignore = "needs 2 GPUs: peer access between two GPUs"]
fn two_gpus_peer_access() {
    require_gpus("two_gpus_peer_access", 2);
    let (a, b) = (Gpu::new(0).unwrap(), Gpu::new(1).unwrap());
    let ab = a.can_access_peer(&b).unwrap();
    let ba = b.can_access_peer(&a).unwrap();
    eprintln!("cuDeviceCanAccessPeer 0->1 {ab}, 1->0 {ba}");
    assert!(ab && ba, "the 2-GPU test machine has NVLink peers");
    a.enable_peer_access(&b).unwrap();
    a.enable_peer_access(&b).unwrap(); // twice is fine
    b.enable_peer_access(&a).unwrap();
    // GPU 0's kernel reads GPU 1's memory through the peer mapping.
    let m = a
        .load_module(
            &compile::compile(&kernels::COPY, a.arch().unwrap())
                .unwrap()
                .image,
        )
        .unwrap();
    let remote = b.alloc(1 << 16).unwrap();
    let local = a.alloc(1 << 16).unwrap();
    let data = random(DataType::Uint8, 1 << 16, &mut Rng(3));
    remote.write(0, &data).unwrap();
    allreduce::copy(&a, &m, (&local).into(), (&remote).into(), 1 << 16).unwrap();
    let mut back = vec![0u8; 1 << 16];
    local.read(0, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
#[ignore = "needs 2 GPUs: one shot all reduce matches host reference"]
fn two_gpus_one_shot_all_reduce_matches_host_reference() {
    require_gpus("two_gpus_one_shot_all_reduce_matches_host_reference", 2);
    let (g0, g1) = (Gpu::new(0).unwrap(), Gpu::new(1).unwrap());
    let mut ar = OneShot2::new([&g0, &g1]).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let counts = [
        1usize, 2, 3, 7, 8, 15, 16, 17, 255, 1000, 1023, 4097, 65_537, 262_144, 1_000_003,
    ];
    let mut cases = 0;
    let mut ulps = 0;
    let mut failures = Vec::new();
    for t in DataType::ALL {
        // PreMulSum with an immediate scalar: 1.5 for floats, 3 for integers.
        let premul = RedOp::PreMulSum(if t.is_float() {
            oxccl_core::Scalar::F64(1.5)
        } else {
            oxccl_core::Scalar::I64(3)
        });
        for op in RedOp::BUILTIN.into_iter().chain([premul]) {
            for (i, &count) in counts.iter().enumerate() {
                // Mix layouts: out of place, in place, and a misaligned offset
                // (scalar path) every third count.
                let inplace = i % 2 == 1;
                let off = if i % 3 == 2 { t.size() } else { 0 };
                let bytes = count * t.size();
                let x = [random(t, count, &mut rng), random(t, count, &mut rng)];
                let want = reference(t, op, &x[0], &x[1]);
                let s = [
                    g0.alloc(bytes + off).unwrap(),
                    g1.alloc(bytes + off).unwrap(),
                ];
                let d = [
                    g0.alloc(bytes + off).unwrap(),
                    g1.alloc(bytes + off).unwrap(),
                ];
                for r in 0..2 {
                    s[r].write(off, &x[r]).unwrap();
                    d[r].fill(0xcd).unwrap();
                }
                let at = |b| At {
                    buf: b,
                    offset: off,
                };
                let recv = if inplace {
                    [at(&s[0]), at(&s[1])]
                } else {
                    [at(&d[0]), at(&d[1])]
                };
                ar.all_reduce([at(&s[0]), at(&s[1])], recv, count, t, op)
                    .unwrap();
                ar.synchronize().unwrap();
                for (r, dst) in recv.iter().enumerate() {
                    let mut got = vec![0u8; bytes];
                    dst.buf.read(off, &mut got).unwrap();
                    let (wrong, ulp) = compare(t, &got, &want);
                    ulps += ulp;
                    if wrong > 0 {
                        failures.push(format!(
                            "{t} {} count {count} inplace {inplace} offset {off} rank {r}: {wrong} wrong",
                            op.name()
                        ));
                    }
                }
                cases += 1;
            }
        }
    }
    eprintln!("one-shot all_reduce: {cases} cases (12 types x 6 ops x {} counts), {ulps} elements 1 ulp off, {} failures", counts.len(), failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[ignore = "needs 2 GPUs: one shot all reduce back to back"]
fn two_gpus_one_shot_all_reduce_back_to_back() {
    require_gpus("two_gpus_one_shot_all_reduce_back_to_back", 2);
    // Many calls queued without host waits: the flag sequence must keep the
    // two GPUs paired, and each call must see the previous one's output.
    let (g0, g1) = (Gpu::new(0).unwrap(), Gpu::new(1).unwrap());
    let mut ar = OneShot2::new([&g0, &g1]).unwrap();
    let count = 4099;
    let b = [g0.alloc(count * 4).unwrap(), g1.alloc(count * 4).unwrap()];
    let ones: Vec<u8> = (0..count).flat_map(|_| 1i32.to_le_bytes()).collect();
    b[0].write(0, &ones).unwrap();
    b[1].write(0, &ones).unwrap();
    for _ in 0..20 {
        ar.all_reduce(
            [(&b[0]).into(), (&b[1]).into()],
            [(&b[0]).into(), (&b[1]).into()],
            count,
            DataType::Int32,
            RedOp::Sum,
        )
        .unwrap();
    }
    ar.synchronize().unwrap();
    for buf in &b {
        let mut got = vec![0u8; count * 4];
        buf.read(0, &mut got).unwrap();
        for c in got.chunks_exact(4) {
            assert_eq!(i32::from_le_bytes(c.try_into().unwrap()), 1 << 20);
        }
    }
}

#[test]
#[ignore = "needs 2 GPUs: timing of the one-shot all-reduce (its own row in scripts/gpu-test.sh)"]
fn two_gpus_timing_one_shot_all_reduce() {
    require_gpus("two_gpus_timing_one_shot_all_reduce", 2);
    let (g0, g1) = (Gpu::new(0).unwrap(), Gpu::new(1).unwrap());
    let t0 = std::time::Instant::now();
    let mut ar = OneShot2::new([&g0, &g1]).unwrap();
    eprintln!(
        "setup (peer access, flags, kernels from NVRTC or cache): {:.1} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
    let iters = 2000;
    println!("# oxccl one-shot all_reduce, float sum, 2 GPUs in one process, {iters} iterations back to back");
    println!(
        "# {:>10} {:>12} {:>12} {:>12}",
        "bytes", "us/call(ev)", "us/call(wall)", "algbw_GBps"
    );
    let mut bytes = 8usize;
    while bytes <= 1 << 20 {
        let count = bytes / 4;
        let s = [g0.alloc(bytes).unwrap(), g1.alloc(bytes).unwrap()];
        let d = [g0.alloc(bytes).unwrap(), g1.alloc(bytes).unwrap()];
        let data = random(DataType::Float32, count, &mut Rng(bytes as u64 + 1));
        s[0].write(0, &data).unwrap();
        s[1].write(0, &data).unwrap();
        let send = [(&s[0]).into(), (&s[1]).into()];
        let recv = [(&d[0]).into(), (&d[1]).into()];
        for _ in 0..100 {
            ar.all_reduce(send, recv, count, DataType::Float32, RedOp::Sum)
                .unwrap();
        }
        ar.synchronize().unwrap();
        let (e0, e1) = (g0.event().unwrap(), g0.event().unwrap());
        let w = std::time::Instant::now();
        e0.record().unwrap();
        for _ in 0..iters {
            ar.all_reduce(send, recv, count, DataType::Float32, RedOp::Sum)
                .unwrap();
        }
        e1.record().unwrap();
        let ms = e1.elapsed_ms_since(&e0).unwrap();
        ar.synchronize().unwrap();
        let wall = w.elapsed().as_secs_f64() * 1e6 / iters as f64;
        let us = ms as f64 * 1e3 / iters as f64;
        println!(
            "  {:>10} {:>12.2} {:>12.2} {:>12.2}",
            bytes,
            us,
            wall,
            bytes as f64 / us / 1e3
        );
        let mut got = vec![0u8; bytes];
        d[1].read(0, &mut got).unwrap();
        assert_eq!(got, reference(DataType::Float32, RedOp::Sum, &data, &data));
        bytes *= 2;
    }
}
