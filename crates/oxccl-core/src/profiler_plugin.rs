//! What NCCL's profiler plugins are told about an operation, as pure data:
//! the strings NCCL puts in event descriptors (`ncclFuncToString`,
//! `ncclDatatypeToString`, `ncclAlgoToString`, `ncclProtoToString`), static
//! and NUL-terminated because the descriptor holds C pointers, and the
//! per-collective sequence numbers (`seqNumber`: NCCL counts each
//! collective function separately per communicator, from 0).

use std::ffi::CStr;

use crate::algo::{Algo, Proto};
use crate::tuner_plugin::func_id;
use crate::types::{CollKind, DataType};

/// NCCL's name of a collective function.
pub fn func_name(k: CollKind) -> &'static CStr {
    match k {
        CollKind::AllReduce => c"AllReduce",
        CollKind::Broadcast => c"Broadcast",
        CollKind::Reduce => c"Reduce",
        CollKind::AllGather => c"AllGather",
        CollKind::ReduceScatter => c"ReduceScatter",
        CollKind::AllToAll => c"AlltoAll",
        CollKind::Gather => c"Gather",
        CollKind::Scatter => c"Scatter",
        CollKind::Send => c"Send",
        CollKind::Recv => c"Recv",
    }
}

/// NCCL's name of a datatype.
pub fn dtype_name(d: DataType) -> &'static CStr {
    match d {
        DataType::Int8 => c"ncclInt8",
        DataType::Uint8 => c"ncclUint8",
        DataType::Int32 => c"ncclInt32",
        DataType::Uint32 => c"ncclUint32",
        DataType::Int64 => c"ncclInt64",
        DataType::Uint64 => c"ncclUint64",
        DataType::Float16 => c"ncclFloat16",
        DataType::Float32 => c"ncclFloat32",
        DataType::Float64 => c"ncclFloat64",
        DataType::Bfloat16 => c"ncclBfloat16",
        DataType::Float8e4m3 => c"ncclFloat8e4m3",
        DataType::Float8e5m2 => c"ncclFloat8e5m2",
    }
}

/// NCCL's name of an algorithm; oxccl's own keep their names.
pub fn algo_name(a: Algo) -> &'static CStr {
    match a {
        Algo::Tree => c"Tree",
        Algo::Ring => c"Ring",
        Algo::CollnetDirect => c"CollNetDirect",
        Algo::CollnetChain => c"CollNetChain",
        Algo::Nvls => c"NVLS",
        Algo::NvlsTree => c"NVLSTree",
        Algo::Pat => c"PAT",
        Algo::OneShot => c"OneShot",
        Algo::TwoShot => c"TwoShot",
    }
}

/// NCCL's name of a protocol.
pub fn proto_name(p: Proto) -> &'static CStr {
    match p {
        Proto::LL => c"LL",
        Proto::LL128 => c"LL128",
        Proto::Simple => c"Simple",
    }
}

/// A communicator's `seqNumber` per collective function.
#[derive(Debug, Clone, Default)]
pub struct SeqNumbers {
    next: [u64; 16],
}

impl SeqNumbers {
    /// The number of this call of `k`, counting it.
    pub fn take(&mut self, k: CollKind) -> u64 {
        let slot = &mut self.next[func_id(k) as usize];
        let n = *slot;
        *slot += 1;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_sequence_numbers() {
        assert_eq!(func_name(CollKind::AllReduce), c"AllReduce");
        assert_eq!(dtype_name(DataType::Float32), c"ncclFloat32");
        assert_eq!(algo_name(Algo::Ring), c"Ring");
        assert_eq!(proto_name(Proto::LL128), c"LL128");
        let mut s = SeqNumbers::default();
        assert_eq!(s.take(CollKind::AllReduce), 0);
        assert_eq!(s.take(CollKind::AllReduce), 1);
        assert_eq!(s.take(CollKind::Broadcast), 0);
        assert_eq!(s.take(CollKind::AllReduce), 2);
        for k in CollKind::ALL {
            assert!(!func_name(k).is_empty());
            s.take(k);
        }
    }
}
