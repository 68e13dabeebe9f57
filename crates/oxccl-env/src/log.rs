//! `NCCL_DEBUG` logging with lines shaped like NCCL's.
//!
//! Use the macros: `oxccl_env::warn!("...")`, `oxccl_env::info!(Subsys::INIT, "...")`,
//! `oxccl_env::trace!(Subsys::COLL, "...")`.
//! (Minimal first version; the full one honours NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE.)

use std::fmt;

/// Log level, in NCCL's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    None,
    Version,
    Warn,
    Info,
    Abort,
    Trace,
}

/// A subsystem mask (NCCL_DEBUG_SUBSYS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subsys(pub u32);

impl Subsys {
    pub const INIT: Subsys = Subsys(1 << 0);
    pub const COLL: Subsys = Subsys(1 << 1);
    pub const P2P: Subsys = Subsys(1 << 2);
    pub const SHM: Subsys = Subsys(1 << 3);
    pub const NET: Subsys = Subsys(1 << 4);
    pub const GRAPH: Subsys = Subsys(1 << 5);
    pub const TUNING: Subsys = Subsys(1 << 6);
    pub const ENV: Subsys = Subsys(1 << 7);
    pub const ALLOC: Subsys = Subsys(1 << 8);
    pub const CALL: Subsys = Subsys(1 << 9);
    pub const PROXY: Subsys = Subsys(1 << 10);
    pub const NVLS: Subsys = Subsys(1 << 11);
    pub const BOOTSTRAP: Subsys = Subsys(1 << 12);
    pub const REG: Subsys = Subsys(1 << 13);
    pub const ALL: Subsys = Subsys(u32::MAX);
}

/// Writes one log line if `level`/`subsys` are enabled. Called by the macros.
pub fn log(level: Level, subsys: Subsys, file: &str, line: u32, args: fmt::Arguments<'_>) {
    let _ = (subsys, file, line);
    let want = match std::env::var("NCCL_DEBUG").ok().as_deref().map(str::to_ascii_uppercase) {
        Some(ref s) if s == "WARN" => Level::Warn,
        Some(ref s) if s == "INFO" => Level::Info,
        Some(ref s) if s == "TRACE" => Level::Trace,
        _ => Level::None,
    };
    if level <= want {
        eprintln!("oxccl {level:?}: {args}");
    }
}

/// `warn!("fmt", args...)`: a WARN line (subsystem ALL).
#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => {
        $crate::log::log($crate::log::Level::Warn, $crate::log::Subsys::ALL, file!(), line!(), format_args!($($arg)*))
    };
}

/// `info!(Subsys::X, "fmt", args...)`: an INFO line for a subsystem.
#[macro_export]
macro_rules! info {
    ($sub:expr, $($arg:tt)*) => {
        $crate::log::log($crate::log::Level::Info, $sub, file!(), line!(), format_args!($($arg)*))
    };
}

/// `trace!(Subsys::X, "fmt", args...)`: a TRACE line for a subsystem.
#[macro_export]
macro_rules! trace {
    ($sub:expr, $($arg:tt)*) => {
        $crate::log::log($crate::log::Level::Trace, $sub, file!(), line!(), format_args!($($arg)*))
    };
}
