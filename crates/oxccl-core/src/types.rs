//! NCCL's data types, reduction operations and collective kinds.
//!
//! The discriminants are NCCL's ABI values (`ncclDataType_t`, `ncclRedOp_t`),
//! so the C shell converts with `from_raw` and nothing else.

use crate::error::{Error, Result};
use std::fmt;

/// An element type. Values are `ncclDataType_t`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(i32)]
pub enum DataType {
    Int8 = 0,
    Uint8 = 1,
    Int32 = 2,
    Uint32 = 3,
    Int64 = 4,
    Uint64 = 5,
    Float16 = 6,
    Float32 = 7,
    Float64 = 8,
    Bfloat16 = 9,
    Float8e4m3 = 10,
    Float8e5m2 = 11,
}

impl DataType {
    /// Every type, in ABI order.
    pub const ALL: [DataType; 12] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
        DataType::Float8e4m3,
        DataType::Float8e5m2,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Float8e4m3 | DataType::Float8e5m2 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// The type for an `ncclDataType_t` value.
    pub fn from_raw(v: i32) -> Result<DataType> {
        DataType::ALL
            .into_iter()
            .find(|t| *t as i32 == v)
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "datatype {v} is not an ncclDataType_t (valid: 0..=11)"
                ))
            })
    }

    /// The name nccl-tests prints ("float", "bfloat16", "int32"...).
    pub fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Float16 => "half",
            DataType::Float32 => "float",
            DataType::Float64 => "double",
            DataType::Bfloat16 => "bfloat16",
            DataType::Float8e4m3 => "f8e4m3",
            DataType::Float8e5m2 => "f8e5m2",
        }
    }

    /// Parses a name: nccl-tests' names and common aliases ("float32", "fp16", "bf16").
    pub fn parse(s: &str) -> Result<DataType> {
        let t = match s.to_ascii_lowercase().as_str() {
            "int8" | "char" => DataType::Int8,
            "uint8" => DataType::Uint8,
            "int32" | "int" => DataType::Int32,
            "uint32" => DataType::Uint32,
            "int64" => DataType::Int64,
            "uint64" => DataType::Uint64,
            "half" | "float16" | "fp16" => DataType::Float16,
            "float" | "float32" | "fp32" => DataType::Float32,
            "double" | "float64" | "fp64" => DataType::Float64,
            "bfloat16" | "bf16" => DataType::Bfloat16,
            "f8e4m3" | "fp8_e4m3" | "float8e4m3" | "e4m3" => DataType::Float8e4m3,
            "f8e5m2" | "fp8_e5m2" | "float8e5m2" | "e5m2" => DataType::Float8e5m2,
            _ => {
                return Err(Error::invalid_argument(format!(
                    "unknown data type '{s}' (expected one of: {})",
                    DataType::ALL.map(|t| t.name()).join(", ")
                )))
            }
        };
        Ok(t)
    }

    /// True for the floating types (float16, bfloat16, fp8 included).
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DataType::Float16
                | DataType::Float32
                | DataType::Float64
                | DataType::Bfloat16
                | DataType::Float8e4m3
                | DataType::Float8e5m2
        )
    }

    /// True for the signed integer types.
    pub fn is_signed_int(self) -> bool {
        matches!(self, DataType::Int8 | DataType::Int32 | DataType::Int64)
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The scalar of a pre-multiplied sum, in the reduction's own type family.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// For signed integer types.
    I64(i64),
    /// For unsigned integer types.
    U64(u64),
    /// For floating types (converted to the accumulation type).
    F64(f64),
}

impl Scalar {
    /// The value as f64 (for floating reductions).
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::I64(v) => v as f64,
            Scalar::U64(v) => v as f64,
            Scalar::F64(v) => v,
        }
    }
    /// The value as a wrapping u64 (two's complement for integer reductions).
    pub fn as_u64_bits(self) -> u64 {
        match self {
            Scalar::I64(v) => v as u64,
            Scalar::U64(v) => v,
            Scalar::F64(v) => v as i64 as u64,
        }
    }
}

/// A reduction operation. `Avg` divides by the rank count (integers truncate,
/// as NCCL's sum-then-divide does); `PreMulSum` multiplies every input by the
/// scalar before summing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RedOp {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
    PreMulSum(Scalar),
}

impl RedOp {
    /// The four built-in ops plus avg, in ABI order (`ncclSum`..`ncclAvg`).
    pub const BUILTIN: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];

    /// The op for a built-in `ncclRedOp_t` value (0..=4). Values of ops made by
    /// `ncclRedOpCreatePreMulSum` are resolved by the communicator, not here.
    pub fn from_raw(v: i32) -> Result<RedOp> {
        match v {
            0 => Ok(RedOp::Sum),
            1 => Ok(RedOp::Prod),
            2 => Ok(RedOp::Max),
            3 => Ok(RedOp::Min),
            4 => Ok(RedOp::Avg),
            _ => Err(Error::invalid_argument(format!(
                "reduction op {v} is neither a built-in ncclRedOp_t (0..=4) nor an op created on this communicator"
            ))),
        }
    }

    /// The name nccl-tests prints ("sum", "prod", "max", "min", "avg", "premulsum").
    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
            RedOp::Avg => "avg",
            RedOp::PreMulSum(_) => "premulsum",
        }
    }

    /// Parses "sum", "prod", "max", "min", "avg".
    pub fn parse(s: &str) -> Result<RedOp> {
        match s.to_ascii_lowercase().as_str() {
            "sum" => Ok(RedOp::Sum),
            "prod" | "product" => Ok(RedOp::Prod),
            "max" => Ok(RedOp::Max),
            "min" => Ok(RedOp::Min),
            "avg" => Ok(RedOp::Avg),
            _ => Err(Error::invalid_argument(format!(
                "unknown reduction op '{s}' (expected one of: sum, prod, max, min, avg)"
            ))),
        }
    }

    /// A compact code for wire headers (mismatch detection): 0..=5.
    pub fn wire_code(self) -> u8 {
        match self {
            RedOp::Sum => 0,
            RedOp::Prod => 1,
            RedOp::Max => 2,
            RedOp::Min => 3,
            RedOp::Avg => 4,
            RedOp::PreMulSum(_) => 5,
        }
    }
}

impl fmt::Display for RedOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The collective (or point-to-point) operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CollKind {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Gather,
    Scatter,
    Send,
    Recv,
}

impl CollKind {
    /// Every kind.
    pub const ALL: [CollKind; 10] = [
        CollKind::AllReduce,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AllToAll,
        CollKind::Gather,
        CollKind::Scatter,
        CollKind::Send,
        CollKind::Recv,
    ];

    /// NCCL's function name without the prefix ("AllReduce").
    pub fn nccl_name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "AllReduce",
            CollKind::Broadcast => "Broadcast",
            CollKind::Reduce => "Reduce",
            CollKind::AllGather => "AllGather",
            CollKind::ReduceScatter => "ReduceScatter",
            CollKind::AllToAll => "AlltoAll",
            CollKind::Gather => "Gather",
            CollKind::Scatter => "Scatter",
            CollKind::Send => "Send",
            CollKind::Recv => "Recv",
        }
    }

    /// The snake-case name used by the CLI and NCCL_ALGO keys ("all_reduce").
    pub fn snake_name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "all_reduce",
            CollKind::Broadcast => "broadcast",
            CollKind::Reduce => "reduce",
            CollKind::AllGather => "all_gather",
            CollKind::ReduceScatter => "reduce_scatter",
            CollKind::AllToAll => "alltoall",
            CollKind::Gather => "gather",
            CollKind::Scatter => "scatter",
            CollKind::Send => "send",
            CollKind::Recv => "recv",
        }
    }

    /// Parses NCCL's or the snake-case name, case-insensitively ("allreduce", "all_reduce", "AllReduce").
    pub fn parse(s: &str) -> Result<CollKind> {
        let norm: String = s
            .chars()
            .filter(|c| *c != '_' && *c != '-')
            .collect::<String>()
            .to_ascii_lowercase();
        CollKind::ALL
            .into_iter()
            .find(|k| k.nccl_name().to_ascii_lowercase() == norm)
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "unknown collective '{s}' (expected one of: {})",
                    CollKind::ALL.map(|k| k.snake_name()).join(", ")
                ))
            })
    }

    /// A compact code for wire headers: 0..=9.
    pub fn wire_code(self) -> u8 {
        CollKind::ALL.iter().position(|k| *k == self).unwrap_or(0) as u8
    }
}

impl fmt::Display for CollKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.snake_name())
    }
}

/// `count * size` in bytes, or an invalid-argument error naming `what` on overflow.
pub fn byte_len(count: usize, dtype: DataType, what: &str) -> Result<usize> {
    count.checked_mul(dtype.size()).ok_or_else(|| {
        Error::invalid_argument(format!(
            "{what}: count {count} of {dtype} overflows the address space"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_values() {
        for (i, t) in DataType::ALL.iter().enumerate() {
            assert_eq!(*t as i32, i as i32);
            assert_eq!(DataType::from_raw(i as i32).unwrap(), *t);
            assert_eq!(DataType::parse(t.name()).unwrap(), *t);
        }
        assert!(DataType::from_raw(12).is_err());
        assert!(DataType::from_raw(-1).is_err());
        for (i, op) in RedOp::BUILTIN.iter().enumerate() {
            assert_eq!(RedOp::from_raw(i as i32).unwrap(), *op);
        }
        assert!(RedOp::from_raw(5).is_err());
    }

    #[test]
    fn coll_names() {
        for k in CollKind::ALL {
            assert_eq!(CollKind::parse(k.snake_name()).unwrap(), k);
            assert_eq!(CollKind::parse(k.nccl_name()).unwrap(), k);
        }
        assert_eq!(CollKind::parse("allreduce").unwrap(), CollKind::AllReduce);
        assert!(CollKind::parse("allreduse").is_err());
    }

    #[test]
    fn byte_len_overflow_is_an_error() {
        assert_eq!(byte_len(3, DataType::Float32, "x").unwrap(), 12);
        let e = byte_len(usize::MAX, DataType::Int64, "sendcount").unwrap_err();
        assert!(e.message().contains("sendcount"));
    }
}
