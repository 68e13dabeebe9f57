//! The CUDA C++ sources in `kernels/`: compiled ahead of time by `oxccl
//! kernels` (the programs of [`prebuilt_sources`]), else by NVRTC on first use.

use oxccl_core::{DataType, RedOp};

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
/// (12 types x 6 ops), and `oxccl_ring_p2p` (sends and receives of a group):
/// the text the ring programs are made of ([`ring_variant`], [`ring_p2p`]),
/// never a program itself.
pub const RING: KernelSource = KernelSource {
    name: "ring.cu",
    source: include_str!("../kernels/ring.cu"),
};

/// The program that holds the ring kernels of (`t`, `op`): [`ring_program`]
/// of the type [`ring_kernel_of`] names.
pub fn ring_variant(t: DataType, op: RedOp) -> KernelSource {
    ring_program(ring_kernel_of(t, op).0)
}

/// The (type, op) whose ring kernels compute (`t`, `op`): itself, but for
/// the pairs whose kernels would be the same machine code as another's,
/// which no program holds (ring.cu, `OXCCL_RING_SIGNED_OPS` and
/// `OXCCL_RING_FLOAT_OPS`): a signed integer's sum, prod and PreMulSum are
/// the unsigned type's of its width (the arithmetic is done in the
/// unsigned type, and a wrapping sum's or product's low bits depend only on
/// the operands' low bits); a floating type's avg is its PreMulSum (each
/// input pre-multiplied by the scale the launch passes, 1/nranks, then
/// summed: the same code). 57 ring kernels instead of 72.
pub fn ring_kernel_of(t: DataType, op: RedOp) -> (DataType, RedOp) {
    let unsigned = match t {
        DataType::Int8 => DataType::Uint8,
        DataType::Int32 => DataType::Uint32,
        DataType::Int64 => DataType::Uint64,
        other => other,
    };
    match op {
        RedOp::Sum | RedOp::Prod | RedOp::PreMulSum(_) if t.is_signed_int() => (unsigned, op),
        RedOp::Avg if t.is_float() => (t, RedOp::PreMulSum(oxccl_core::Scalar::F64(1.0))),
        _ => (t, op),
    }
}

/// The ring kernels of one type, `oxccl_{ring,small,one_launch,scale}_<type>_<op>`
/// for every op that [`ring_kernel_of`] does not send to another type or op
/// (ring.cu's text with `OXCCL_RING_TYPED`, which leaves out the untyped
/// kernels of [`ring_p2p`]), as one NVRTC program cached on disk as
/// `ring-<type>-...cubin`. A program per type, not per (type, op): the
/// prebuilt set is 12 ring programs rather than 72 (each of which held its
/// own copy of `oxccl_ring_p2p`), while a GPU whose kernels are not
/// prebuilt compiles the 6 ops of a type at its first collective of that
/// type. The sources are made once per process and kept (at most 13).
pub fn ring_program(t: DataType) -> KernelSource {
    let tt = type_tag(t);
    variant_of(
        &RING,
        &["OXCCL_RING_ONE", "OXCCL_RING_TYPED"],
        &format!("ring-{tt}.cu"),
        || {
            let ops = if t.is_signed_int() {
                "SIGNED"
            } else if t.is_float() {
                "FLOAT"
            } else {
                "ALL"
            };
            format!("OXCCL_RING_{ops}_OPS({tt}, {}E)\n", tt.to_uppercase())
        },
    )
}

/// `oxccl_ring_p2p` and `oxccl_ring_barrier` alone (no typed kernel).
pub fn ring_p2p() -> KernelSource {
    variant_of(&RING, &["OXCCL_RING_ONE"], "ring-p2p.cu", String::new)
}

/// The program that holds the copy-engine path's reducing kernel for
/// (`t`, `op`), `oxccl_cer_<type>_<op>` ([`crate::ce_reduce`]; sum, prod,
/// max and min only): [`ce_reduce_program`] of `t`, which holds all four.
pub fn ce_reduce_variant(t: DataType, _op: crate::ce_reduce::Op) -> KernelSource {
    ce_reduce_program(t)
}

/// The copy-engine reducing kernels of one type for the four ops of
/// [`CE_OPS`] and `oxccl_cer_wait`: [`ALLREDUCE`]'s text with
/// `OXCCL_CER_ONE` (which leaves out its 72 pair kernels and
/// `oxccl_pcopy`). Cached on disk as `cer-<type>-...cubin`.
pub fn ce_reduce_program(t: DataType) -> KernelSource {
    let tt = type_tag(t);
    variant_of(
        &ALLREDUCE,
        &["OXCCL_CER_ONE"],
        &format!("cer-{tt}.cu"),
        || format!("OXCCL_CER_ALL_OPS({tt}, {}E)\n", tt.to_uppercase()),
    )
}

/// The name of [`ce_reduce_variant`]'s kernel.
pub fn ce_reduce_kernel(t: DataType, op: crate::ce_reduce::Op) -> String {
    format!("oxccl_cer_{}_{}", type_tag(t), op.tag())
}

/// `base`'s text after a `#define` of each of `defines`, then `tail()`,
/// as program `name`.
fn variant_of(
    base: &KernelSource,
    defines: &[&str],
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
        let head: String = defines.iter().map(|d| format!("#define {d}\n")).collect();
        let source = format!("{head}{}\n{}", base.source, tail());
        KernelSource {
            // Bounded: one per type and one for p2p (ring), one per type
            // of the copy-engine reduction, for the process.
            name: Box::leak(name.to_string().into_boxed_str()),
            source: Box::leak(source.into_boxed_str()),
        }
    })
}

/// The ops of [`ce_reduce_variant`].
pub const CE_OPS: [crate::ce_reduce::Op; 4] = [
    crate::ce_reduce::Op::Sum,
    crate::ce_reduce::Op::Prod,
    crate::ce_reduce::Op::Max,
    crate::ce_reduce::Op::Min,
];

/// Every program a run may load on any GPU (what `oxccl kernels` prebuilds
/// for sm_89 and newer): the two-GPU kernels, the copy kernel, the ring's
/// point-to-point program, each type's ring program and each type's
/// copy-engine reductions. Not [`RING`], the text they are made of.
pub fn runtime_sources() -> Vec<KernelSource> {
    prebuilt_sources(u32::MAX)
}

/// The oldest architecture with the fp8 conversions (common.cuh); before
/// it the fp8 programs do not compile, and [`ALLREDUCE`] leaves its fp8
/// kernels out.
pub const FP8_MIN_ARCH: u32 = 89;

/// Whether `src` compiled for an architecture below [`FP8_MIN_ARCH`]
/// holds fewer kernels than for one at or above it ([`ALLREDUCE`] leaves
/// its fp8 pair kernels out there), so that such a build must not serve
/// a GPU that has fp8. The typed programs of fp8 exist only from sm_89 on;
/// every other program is the same below and above.
pub fn gates_fp8_by_arch(src: &KernelSource) -> bool {
    src.name == ALLREDUCE.name
}

/// Whether a GPU of `arch` (compute capability x 10) runs kernels of type `t`.
pub fn type_runs_on(t: oxccl_core::DataType, arch: u32) -> bool {
    use oxccl_core::DataType::{Float8e4m3, Float8e5m2};
    !matches!(t, Float8e4m3 | Float8e5m2) || arch >= FP8_MIN_ARCH
}

/// The programs a run on a GPU of `arch` may load ([`runtime_sources`]
/// less the fp8 ones where the GPU has no fp8): what `oxccl kernels`
/// compiles for `arch`, longest first (the ring programs, then the rest).
pub fn prebuilt_sources(arch: u32) -> Vec<KernelSource> {
    let types = || {
        DataType::ALL
            .into_iter()
            .filter(move |&t| type_runs_on(t, arch))
    };
    let mut v = vec![ALLREDUCE];
    v.extend(types().map(ring_program));
    v.push(ring_p2p());
    v.extend(types().map(ce_reduce_program));
    v.push(COPY);
    v
}

/// What `oxccl kernels` compiles: every program of [`prebuilt_sources`]
/// as a CUBIN for each of `archs` and, when `ptx`, as PTX for the newest
/// of them (for GPUs newer than any of `archs`).
pub fn prebuild_jobs(archs: &[u32], ptx: bool) -> Vec<(KernelSource, Target)> {
    let mut v = Vec::new();
    for &a in archs {
        v.extend(
            prebuilt_sources(a)
                .into_iter()
                .map(|s| (s, Target::Cubin(a))),
        );
    }
    if let (true, Some(&newest)) = (ptx, archs.iter().max()) {
        v.extend(
            prebuilt_sources(newest)
                .into_iter()
                .map(|s| (s, Target::Ptx(newest))),
        );
    }
    v
}

/// The kernel name's type part.
pub fn type_tag(t: DataType) -> &'static str {
    match t {
        DataType::Int8 => "i8",
        DataType::Uint8 => "u8",
        DataType::Int32 => "i32",
        DataType::Uint32 => "u32",
        DataType::Int64 => "i64",
        DataType::Uint64 => "u64",
        DataType::Float16 => "f16",
        DataType::Float32 => "f32",
        DataType::Float64 => "f64",
        DataType::Bfloat16 => "bf16",
        DataType::Float8e4m3 => "e4m3",
        DataType::Float8e5m2 => "e5m2",
    }
}

/// The kernel name's op part (always `Some`: every op has kernels).
pub fn op_tag(op: RedOp) -> Option<&'static str> {
    match op {
        RedOp::Sum => Some("sum"),
        RedOp::Prod => Some("prod"),
        RedOp::Max => Some("max"),
        RedOp::Min => Some("min"),
        RedOp::Avg => Some("avg"),
        RedOp::PreMulSum(_) => Some("premulsum"),
    }
}

/// What NVRTC makes of a program: machine code for one architecture, or
/// PTX that the driver compiles for any GPU at least that new.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// A CUBIN for `sm_<arch>` (e.g. 90).
    Cubin(u32),
    /// PTX for `compute_<arch>`.
    Ptx(u32),
}

impl Target {
    /// `sm_90` or `compute_90`.
    pub fn tag(self) -> String {
        match self {
            Target::Cubin(a) => format!("sm_{a}"),
            Target::Ptx(a) => format!("compute_{a}"),
        }
    }

    pub(crate) fn extension(self) -> &'static str {
        match self {
            Target::Cubin(_) => "cubin",
            Target::Ptx(_) => "ptx",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_core::algo::{Algo, Proto};
    use oxccl_core::gpu::{Collective, PairKernel, RingKernel};

    /// `NAME = N` items of the C enum in `src` that starts with `first`.
    fn c_enum(src: &str, first: &str) -> Vec<(String, u32)> {
        let at = src.find(first).expect("the enum's first item");
        let body = &src[at..at + src[at..].find('}').expect("the enum's end")];
        body.split(',')
            .filter_map(|item| {
                let (name, value) = item.split_once('=')?;
                Some((name.trim().to_string(), value.trim().parse().ok()?))
            })
            .collect()
    }

    fn collective(name: &str) -> Collective {
        match name {
            "ALLREDUCE" => Collective::AllReduce,
            "REDUCE_SCATTER" => Collective::ReduceScatter,
            "ALLGATHER" => Collective::AllGather,
            "BROADCAST" => Collective::Broadcast,
            "REDUCE" => Collective::Reduce,
            other => panic!("ring.cu names an unknown collective {other}"),
        }
    }

    /// ring.cu's `KERNEL_<collective>_<algorithm>_<protocol>` integers are
    /// the ones `RingKernel` gives: each name's collective, algorithm
    /// (`RING`, `ONESHOT`, `TWOSHOT`) and protocol (`SIMPLE`, `LL`) at its
    /// value, and no more.
    #[test]
    fn ring_modes_match_the_kernel_source() {
        let modes = c_enum(RING.source, "KERNEL_ALLREDUCE_RING_SIMPLE = 0");
        assert_eq!(modes.len(), RingKernel::ALL.len());
        for (name, value) in modes {
            let rest = name.strip_prefix("KERNEL_").expect("a KERNEL_ name");
            let (rest, proto) = [("_SIMPLE", Proto::Simple), ("_LL", Proto::LL)]
                .into_iter()
                .find_map(|(suffix, p)| Some((rest.strip_suffix(suffix)?, p)))
                .unwrap_or_else(|| panic!("{name} names no protocol"));
            let (coll, algo) = [
                ("_RING", Algo::Ring),
                ("_ONESHOT", Algo::OneShot),
                ("_TWOSHOT", Algo::TwoShot),
            ]
            .into_iter()
            .find_map(|(suffix, a)| Some((rest.strip_suffix(suffix)?, a)))
            .unwrap_or_else(|| panic!("{name} names no algorithm"));
            let k = RingKernel::new(collective(coll), algo, proto)
                .unwrap_or_else(|| panic!("{name} has no RingKernel"));
            assert_eq!(k.mode(), value, "{name}");
        }
    }

    /// The ring kernels ring.cu defines (its list of every type's line and
    /// the op lists those lines name) are exactly the pairs
    /// `ring_kernel_of` sends the 72 (type, op) pairs to: 57 of them, every
    /// kernel a launch can name exists, and none is built that no launch
    /// names.
    #[test]
    fn ring_kernels_defined_are_the_ones_launches_name() {
        let src = RING.source;
        let list = |name: &str| -> Vec<String> {
            let at = src.find(&format!("#define {name}(TN, E)")).expect(name);
            src[at..]
                .lines()
                .skip(1)
                .take_while(|l| l.trim_start().starts_with("OXCCL_RING(TN, E, "))
                .map(|l| {
                    l.trim_start()["OXCCL_RING(TN, E, ".len()..]
                        .split(',')
                        .next()
                        .unwrap()
                        .to_string()
                })
                .collect()
        };
        let tail = &src[src.rfind("#ifndef OXCCL_RING_ONE").expect("the list")..];
        let mut defined = std::collections::BTreeSet::new();
        for line in tail.lines().filter(|l| l.starts_with("OXCCL_RING_")) {
            let (mac, rest) = line.split_once('(').unwrap();
            let tag = rest.split(',').next().unwrap();
            for op in list(mac) {
                defined.insert(format!("{tag}_{op}"));
            }
        }
        let premul = RedOp::PreMulSum(oxccl_core::Scalar::F64(1.0));
        let mut named = std::collections::BTreeSet::new();
        for t in DataType::ALL {
            for op in RedOp::BUILTIN.into_iter().chain([premul]) {
                let (kt, kop) = ring_kernel_of(t, op);
                named.insert(format!("{}_{}", type_tag(kt), op_tag(kop).unwrap()));
                // The program asked for is the type's that holds it.
                assert_eq!(ring_variant(t, op), ring_program(kt));
            }
        }
        assert_eq!(defined, named);
        assert_eq!(defined.len(), 57);
        // Each type's program appends its own type's line.
        for t in DataType::ALL {
            let p = ring_program(t).source;
            let line = tail
                .lines()
                .find(|l| l.contains(&format!("({}, ", type_tag(t))))
                .unwrap();
            assert!(p.ends_with(&format!("{line}\n")), "{}", type_tag(t));
        }
    }

    /// allreduce.cu's `MODE_*` and `CP_*` integers are `PairKernel`'s.
    #[test]
    fn pair_modes_match_the_kernel_source() {
        let reduce = c_enum(ALLREDUCE.source, "MODE_ALLREDUCE = 0");
        let copy = c_enum(ALLREDUCE.source, "CP_ALLGATHER = 0");
        let want = |name: &str| match name {
            "MODE_ALLREDUCE" => PairKernel::AllReduce,
            "MODE_REDUCE_SCATTER" => PairKernel::ReduceScatter,
            "MODE_REDUCE" => PairKernel::Reduce,
            "CP_ALLGATHER" => PairKernel::AllGather,
            "CP_BROADCAST" => PairKernel::Broadcast,
            "CP_P2P" => PairKernel::SendRecv,
            other => panic!("allreduce.cu names an unknown mode {other}"),
        };
        assert_eq!((reduce.len(), copy.len()), (3, 3));
        for (name, value) in reduce.iter().chain(&copy) {
            assert_eq!(want(name).mode(), *value, "{name}");
        }
    }
}
