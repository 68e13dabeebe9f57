//! Errors: one typed error whose kind maps one-to-one onto `ncclResult_t`.
//!
//! Every failure in oxccl is an [`Error`] with a kind (what NCCL would have
//! returned) and a message that names the argument, peer or setting at fault.

use std::fmt;
use std::panic::Location;

/// What went wrong, in NCCL's vocabulary. The discriminants are the
/// `ncclResult_t` values (ncclSuccess is 0 and has no kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum ErrorKind {
    /// `ncclUnhandledCudaError`: a CUDA call failed.
    UnhandledCuda = 1,
    /// `ncclSystemError`: an operating-system call failed (socket, shm, mmap...).
    System = 2,
    /// `ncclInternalError`: a bug in oxccl (a broken invariant, a caught panic).
    Internal = 3,
    /// `ncclInvalidArgument`: an argument of this call is wrong.
    InvalidArgument = 4,
    /// `ncclInvalidUsage`: the call is wrong in context (mismatch across ranks, use after destroy...).
    InvalidUsage = 5,
    /// `ncclRemoteError`: a peer died, closed its connection or reported an error.
    Remote = 6,
    /// `ncclInProgress`: a non-blocking operation has not finished yet.
    InProgress = 7,
    /// `ncclTimeout`: a wait ran past its configured timeout.
    Timeout = 8,
}

impl ErrorKind {
    /// Every kind, in `ncclResult_t` order.
    pub const ALL: [ErrorKind; 8] = [
        ErrorKind::UnhandledCuda,
        ErrorKind::System,
        ErrorKind::Internal,
        ErrorKind::InvalidArgument,
        ErrorKind::InvalidUsage,
        ErrorKind::Remote,
        ErrorKind::InProgress,
        ErrorKind::Timeout,
    ];

    /// The `ncclResult_t` value.
    pub fn code(self) -> i32 {
        self as i32
    }

    /// The kind for an `ncclResult_t` value; `None` for success and unknown values.
    pub fn from_code(code: i32) -> Option<ErrorKind> {
        ErrorKind::ALL.into_iter().find(|k| k.code() == code)
    }

    /// A short name used in messages ("invalid argument").
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::UnhandledCuda => "CUDA error",
            ErrorKind::System => "system error",
            ErrorKind::Internal => "internal error",
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::InvalidUsage => "invalid usage",
            ErrorKind::Remote => "remote error",
            ErrorKind::InProgress => "in progress",
            ErrorKind::Timeout => "timeout",
        }
    }
}

/// An oxccl error: a kind and a message naming the cause.
/// Equal when kind and message are: where it was made is for the log only.
#[derive(Debug, Clone)]
pub struct Error {
    kind: ErrorKind,
    msg: String,
    /// The source line that made it, for the WARN that reports it at an API
    /// boundary (which is otherwise the boundary's own line for every error).
    origin: &'static Location<'static>,
}

impl PartialEq for Error {
    fn eq(&self, other: &Error) -> bool {
        self.kind == other.kind && self.msg == other.msg
    }
}

impl Eq for Error {}

/// Result alias used across oxccl.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A new error of `kind` with message `msg`, made at the caller's line.
    #[track_caller]
    pub fn new(kind: ErrorKind, msg: impl Into<String>) -> Error {
        Error {
            kind,
            msg: msg.into(),
            origin: Location::caller(),
        }
    }
    /// `ncclInvalidArgument` with a message.
    #[track_caller]
    pub fn invalid_argument(msg: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidArgument, msg)
    }
    /// `ncclInvalidUsage` with a message.
    #[track_caller]
    pub fn invalid_usage(msg: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidUsage, msg)
    }
    /// `ncclSystemError` with a message.
    #[track_caller]
    pub fn system(msg: impl Into<String>) -> Error {
        Error::new(ErrorKind::System, msg)
    }
    /// `ncclInternalError` with a message.
    #[track_caller]
    pub fn internal(msg: impl Into<String>) -> Error {
        Error::new(ErrorKind::Internal, msg)
    }
    /// `ncclRemoteError` with a message.
    #[track_caller]
    pub fn remote(msg: impl Into<String>) -> Error {
        Error::new(ErrorKind::Remote, msg)
    }
    /// `ncclTimeout` with a message.
    #[track_caller]
    pub fn timeout(msg: impl Into<String>) -> Error {
        Error::new(ErrorKind::Timeout, msg)
    }
    /// The kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    /// The message, without the kind.
    pub fn message(&self) -> &str {
        &self.msg
    }
    /// The source line that made this error (kept by [`Error::context`]).
    pub fn origin(&self) -> &'static Location<'static> {
        self.origin
    }
    /// The same error with `ctx: ` put before its message.
    pub fn context(self, ctx: impl fmt::Display) -> Error {
        Error {
            kind: self.kind,
            msg: format!("{ctx}: {}", self.msg),
            origin: self.origin,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.name(), self.msg)
    }
}

impl std::error::Error for Error {}

/// `ncclGetErrorString`'s text for a result code (0 included).
pub fn result_string(code: i32) -> &'static str {
    match code {
        0 => "no error",
        1 => "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        2 => "unhandled system error (run with NCCL_DEBUG=INFO for details)",
        3 => "internal error - please report this issue to the oxccl developers",
        4 => "invalid argument (run with NCCL_DEBUG=WARN for details)",
        5 => "invalid usage (run with NCCL_DEBUG=WARN for details)",
        6 => "remote process exited or there was a network error",
        7 => "NCCL operation in progress",
        8 => "timeout",
        _ => "unknown result code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_match_nccl() {
        for k in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_code(k.code()), Some(k));
        }
        assert_eq!(ErrorKind::InvalidArgument.code(), 4);
        assert_eq!(ErrorKind::Timeout.code(), 8);
        assert_eq!(ErrorKind::from_code(0), None);
        assert_eq!(ErrorKind::from_code(9), None);
        assert_eq!(result_string(9), "unknown result code");
    }

    #[test]
    fn origin_is_the_line_that_made_it() {
        let line = line!() + 1;
        let e = Error::invalid_usage("x").context("y");
        assert_eq!((e.origin().file(), e.origin().line()), (file!(), line));
        // Equality ignores where an error was made.
        assert_eq!(e, Error::invalid_usage("y: x"));
    }

    #[test]
    fn context_keeps_kind() {
        let e = Error::remote("peer 3 closed").context("all_reduce");
        assert_eq!(e.kind(), ErrorKind::Remote);
        assert_eq!(e.to_string(), "remote error: all_reduce: peer 3 closed");
    }
}
