//! The CUDA C++ sources in `kernels/`, compiled by NVRTC on first use.

/// Headers the sources `#include`, handed to NVRTC by name.
pub const HEADERS: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../kernels/common.cuh")),
    ("elem.cuh", include_str!("../kernels/elem.cuh")),
];

/// One `.cu` file: a program for NVRTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSource {
    /// File name (also the program's name and the cache file's stem).
    pub name: &'static str,
    /// The CUDA C++ text.
    pub source: &'static str,
}

/// The one-shot all-reduce family: `oxccl_ar1_<type>_<op>`, 12 types x 5 ops.
pub const ALLREDUCE: KernelSource = KernelSource {
    name: "allreduce.cu",
    source: include_str!("../kernels/allreduce.cu"),
};

/// `oxccl_copy(dst, src, bytes)`.
pub const COPY: KernelSource = KernelSource {
    name: "copy.cu",
    source: include_str!("../kernels/copy.cu"),
};

/// The ring collectives over FIFO connections, `oxccl_ring_<type>_<op>`
/// (12 types x 6 ops), and `oxccl_ring_p2p` (sends and receives of a group).
pub const RING: KernelSource = KernelSource {
    name: "ring.cu",
    source: include_str!("../kernels/ring.cu"),
};

/// One kernel of [`RING`] alone: `oxccl_ring_<type>_<op>` (and the
/// untyped `oxccl_ring_p2p`), as its own NVRTC program, cached on disk as
/// `ring-<type>-<op>-...cubin`. Compiling all 72 took ~45 s on 2 cores (a
/// first collective that long looks like a hang); one takes a second or two.
/// The sources are made once per process and kept (at most 73).
pub fn ring_variant(t: oxccl_core::DataType, op: oxccl_core::RedOp) -> KernelSource {
    let tt = crate::allreduce::type_tag(t);
    let ot = crate::allreduce::op_tag(op).unwrap_or("sum");
    variant(&format!("ring-{tt}-{ot}.cu"), || {
        format!(
            "OXCCL_RING({tt}, {}E, {ot}, OP_{})\n",
            tt.to_uppercase(),
            ot.to_uppercase()
        )
    })
}

/// `oxccl_ring_p2p` alone (no typed kernel).
pub fn ring_p2p() -> KernelSource {
    variant("ring-p2p.cu", String::new)
}

/// The copy-engine path's reducing kernel for one (type, op) alone,
/// `oxccl_cer_<type>_<op>` ([`crate::ce_reduce`]; sum, prod, max and min
/// only), as its own program: [`ALLREDUCE`]'s text with `OXCCL_CER_ONE`
/// (which leaves out its 72 pair kernels, keeping `oxccl_pcopy`) and one
/// instantiation. Cached on disk as `cer-<type>-<op>-...cubin`.
pub fn ce_reduce_variant(t: oxccl_core::DataType, op: crate::ce_reduce::Op) -> KernelSource {
    let tt = crate::allreduce::type_tag(t);
    let ot = op.tag();
    variant_of(
        &ALLREDUCE,
        "OXCCL_CER_ONE",
        &format!("cer-{tt}-{ot}.cu"),
        || {
            format!(
                "OXCCL_CER({tt}, {}E, {ot}, OP_{})\n",
                tt.to_uppercase(),
                ot.to_uppercase()
            )
        },
    )
}

/// The name of [`ce_reduce_variant`]'s kernel.
pub fn ce_reduce_kernel(t: oxccl_core::DataType, op: crate::ce_reduce::Op) -> String {
    format!("oxccl_cer_{}_{}", crate::allreduce::type_tag(t), op.tag())
}

fn variant(name: &str, tail: impl FnOnce() -> String) -> KernelSource {
    variant_of(&RING, "OXCCL_RING_ONE", name, tail)
}

/// `base`'s text after `#define <define>`, then `tail()`, as program `name`.
fn variant_of(
    base: &KernelSource,
    define: &str,
    name: &str,
    tail: impl FnOnce() -> String,
) -> KernelSource {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static V: OnceLock<Mutex<HashMap<String, KernelSource>>> = OnceLock::new();
    let mut m = V
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    *m.entry(name.to_string()).or_insert_with(|| {
        let source = format!("#define {define}\n{}\n{}", base.source, tail());
        KernelSource {
            // Bounded: one per (type, op) and one for p2p (ring), one per
            // (type, op) of the copy-engine reduction, for the process.
            name: Box::leak(name.to_string().into_boxed_str()),
            source: Box::leak(source.into_boxed_str()),
        }
    })
}

/// Every program, for the compile-everything test.
pub const ALL: &[KernelSource] = &[ALLREDUCE, COPY, RING];

/// The ops of [`ce_reduce_variant`].
pub const CE_OPS: [crate::ce_reduce::Op; 4] = [
    crate::ce_reduce::Op::Sum,
    crate::ce_reduce::Op::Prod,
    crate::ce_reduce::Op::Max,
    crate::ce_reduce::Op::Min,
];

/// Every program a run may load (what `oxccl kernels` prebuilds): the
/// two-GPU kernels, the copy kernel, the ring's point-to-point program,
/// each (type, op) ring program and each copy-engine reduction. Not [`RING`], which holds all 72 at once
/// for the compile test only.
pub fn runtime_sources() -> Vec<KernelSource> {
    let premul = oxccl_core::RedOp::PreMulSum(oxccl_core::Scalar::F64(1.0));
    let mut v = vec![ALLREDUCE, COPY, ring_p2p()];
    for t in oxccl_core::DataType::ALL {
        for op in oxccl_core::RedOp::BUILTIN.into_iter().chain([premul]) {
            v.push(ring_variant(t, op));
        }
    }
    for t in oxccl_core::DataType::ALL {
        for op in CE_OPS {
            v.push(ce_reduce_variant(t, op));
        }
    }
    v
}
