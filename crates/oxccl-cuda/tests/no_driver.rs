//! Without a CUDA driver every GPU entry point returns an error that says so;
//! nothing panics. With one (the GPU machine) the probe succeeds.

use oxccl_core::ErrorKind;
use oxccl_cuda::{loader, Gpu, Unavailable};

#[test]
fn driver_probe_errors_instead_of_panicking() {
    let probe = std::panic::catch_unwind(loader::probe_driver);
    let probe = probe.expect("probing the driver must not panic");
    match probe {
        Ok(info) => {
            eprintln!(
                "driver {} (CUDA {}.{}), {} device(s): the no-driver checks do not apply here",
                info.path,
                info.version / 1000,
                info.version % 1000 / 10,
                info.devices
            );
            assert!(info.devices >= 1);
        }
        Err(u) => {
            let e = u.to_error();
            eprintln!("as expected without a GPU: {e}");
            assert_eq!(e.kind(), ErrorKind::UnhandledCuda);
            match u {
                Unavailable::NoDriver { tried } => {
                    assert!(e
                        .message()
                        .starts_with("no CUDA driver: looked for libcuda.so.1"));
                    assert!(tried.iter().any(|n| n == "libcuda.so.1"), "{tried:?}");
                    assert!(e.message().contains("libcuda.so.1"));
                }
                Unavailable::NoGpu { .. } => assert!(e.message().starts_with("no GPU: ")),
                Unavailable::Failed(_) => panic!("broken CUDA installation: {e}"),
            }
            assert!(u.is_no_gpu());
            // Every entry point answers with the same error, no panic.
            let n = std::panic::catch_unwind(Gpu::count).expect("no panic");
            assert_eq!(n.unwrap_err(), e);
            let g = std::panic::catch_unwind(|| Gpu::new(0).map(|_| ())).expect("no panic");
            assert_eq!(g.unwrap_err(), e);
            assert_eq!(loader::driver().unwrap_err(), e);
        }
    }
}

#[test]
fn nvrtc_probe_never_panics() {
    let r = std::panic::catch_unwind(|| loader::nvrtc().map(|i| i.path.clone()));
    match r.expect("probing NVRTC must not panic") {
        Ok(p) => eprintln!("NVRTC at {p}"),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::UnhandledCuda);
            assert!(e.message().contains("libnvrtc.so.13"), "{e}");
            eprintln!("no NVRTC: {e}");
        }
    }
}
