//! The parameter registry: every `NCCL_*` / `OXCCL_*` variable oxccl knows, declared
//! once, with typed access and a record of where each value came from.
//!
//! ```
//! use oxccl_core::params::{self, Params, Source};
//! let env = vec![("NCCL_BUFFSIZE".to_string(), "1M".to_string())];
//! let p = Params::from_sources(&env, &[("/etc/nccl.conf", "NCCL_SHM_DISABLE=1\n")]).unwrap();
//! assert_eq!(p.get(&params::BUFFSIZE), 1 << 20);
//! assert!(p.get(&params::SHM_DISABLE));
//! assert_eq!(p.get(&params::SOCKET_IFNAME), None);
//! assert_eq!(p.source(&params::SHM_DISABLE), Source::File("/etc/nccl.conf".into()));
//! ```
//!
//! Each entry of the `params!` table below yields a typed constant (`Param<K>`, whose
//! value type is `K::Value`) and a row of [`ALL`], which drives parsing, the typo
//! check (`oxccl doctor`) and the generated `docs/env.md`.
//!
//! **Constant names** are the variable's name without its `NCCL_` or `OXCCL_` prefix
//! (`NCCL_SHM_DISABLE` → `SHM_DISABLE`, `OXCCL_TIMEOUT_MS` → `TIMEOUT_MS`). Two
//! variables that would share a constant name cannot both be declared: the compiler
//! rejects the duplicate, so the rule stays unambiguous.
//!
//! **Honoured vs recognised.** `honoured` parameters change what oxccl does;
//! `recognised` ones are NCCL variables oxccl does not use (yet): they are listed so that
//! setting them raises no "unknown variable" warning, and their values are still
//! checked against NCCL's form.
//!
//! **Sources** (NCCL's rules): the environment wins over configuration files, and an
//! earlier file wins over a later one. Values are trimmed (so a format that must end in a space writes `_`,
//! which NCCL_DEBUG_TIMESTAMP_FORMAT turns into one); an empty value counts as unset. A
//! malformed value is never fatal: the default is used and [`Params::warnings`] says so.
//! Unknown `NCCL_*`/`OXCCL_*` names get a warning with the closest known name (edit
//! distance ≤ 3, or a prefix match), except a few names that other software sets
//! (`NCCL_VERSION` in NVIDIA's containers, `NCCL_ROOT`/`NCCL_HOME`/`NCCL_LIB_DIR`/
//! `NCCL_INCLUDE_DIR` for builds, PyTorch's old `NCCL_BLOCKING_WAIT`/
//! `NCCL_ASYNC_ERROR_HANDLING`, and `NCCL_TESTS_*` / `OXCCL_TEST*`).
//!
//! **Configuration file grammar**: one `NAME=VALUE` per line; whitespace around name
//! and value is ignored; blank lines and lines starting with `#` are skipped; a `#`
//! preceded by whitespace starts a trailing comment; one pair of matching quotes around
//! the value is removed (NCCL keeps them; removing them is kinder). Other lines are
//! ignored with a warning.

use crate::algo::{Algo, Choice, Proto, Selection};
use crate::error::Result;
use crate::logfmt::{Level, LevelSet, LogConfig, Subsys};
use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::panic::Location;

/// How a parameter's text is parsed and what value it yields.
pub trait ParamKind: 'static {
    /// The typed value.
    type Value;
    /// What the table shows as the type.
    const KIND: Kind;
    /// Parses a (trimmed, non-empty) value; the error says what form was expected.
    fn parse(s: &str) -> std::result::Result<Self::Value, String>;
    /// For a value of an enumerated grammar that does not parse: the value with
    /// each unknown name replaced by the nearest valid one (`rign` → `Ring`).
    /// `None` for other kinds, valid values, or when nothing is near.
    fn suggest(_s: &str) -> Option<String> {
        None
    }
}

/// A parameter's type, as shown in the table and in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// "bool", "u32", "size", ...
    pub name: &'static str,
    /// Absence means "auto" (the value is an `Option`).
    pub optional: bool,
    /// The value must not be printed (shown as `<redacted>`).
    pub secret: bool,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.optional {
            write!(f, "{} (optional)", self.name)
        } else {
            f.write_str(self.name)
        }
    }
}

const fn kind(name: &'static str) -> Kind {
    Kind {
        name,
        optional: false,
        secret: false,
    }
}

/// `0/1`, `true/false`, `yes/no` (also `on/off`), any case.
pub struct Bool;
/// A decimal or `0x` hexadecimal `u32`.
pub struct U32;
/// A decimal or `0x` hexadecimal `u64`.
pub struct U64;
/// A decimal or `0x` hexadecimal `i64` (what NCCL's integer variables take).
pub struct I64;
/// A byte count: a plain number or one with a `K`, `M`, `G` or `T` suffix (binary
/// multiples; `KB`, `KiB` and lower case accepted).
pub struct Size;
/// A [`Size`] that sizes a buffer every rank allocates per peer and channel
/// (`NCCL_BUFFSIZE`), within [`BUFFER_BYTES`]: outside it the value is refused
/// with a warning and the default used.
pub struct BufSize;
/// A timeout in milliseconds, as a [`Duration`](std::time::Duration); 0 means
/// no timeout ([`NO_TIMEOUT`]).
pub struct TimeoutMs;
/// Any text.
pub struct Str;
/// Any text that must not be printed (shared secrets).
pub struct Secret;
/// An optional `K`: unset (or empty) means "auto", `None`.
pub struct Opt<K>(PhantomData<K>);

fn parse_uint(s: &str) -> Option<u64> {
    let s = s.strip_prefix('+').unwrap_or(s);
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

impl ParamKind for Bool {
    type Value = bool;
    const KIND: Kind = kind("bool");
    fn parse(s: &str) -> std::result::Result<bool, String> {
        match s.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" => Ok(false),
            _ => Err("0/1, true/false or yes/no".into()),
        }
    }
    fn suggest(s: &str) -> Option<String> {
        const WORDS: [&str; 6] = ["true", "false", "yes", "no", "on", "off"];
        if Self::parse(s).is_ok() {
            return None;
        }
        crate::suggest::nearest_value(s, WORDS).map(str::to_string)
    }
}

/// The sizes `NCCL_BUFFSIZE` accepts. Below 4 KiB a ring step carries too
/// little to pipeline (and the GPU rings' slots start at 16 KiB); above 1 GiB
/// one value costs gigabytes per rank (a 64G setting made 5.7 GiB per rank for
/// a 64 MiB all-reduce), and no transport gains from buffers beyond the 1 MiB
/// slices it already pipelines in. NCCL itself takes any positive size.
pub const BUFFER_BYTES: std::ops::RangeInclusive<u64> = 4 << 10..=1 << 30;

impl ParamKind for BufSize {
    type Value = u64;
    const KIND: Kind = kind("size");
    fn parse(s: &str) -> std::result::Result<u64, String> {
        let range = || {
            "a byte count from 4K to 1G (a buffer per peer and channel on every rank: \
             smaller does not pipeline, larger costs gigabytes per rank)"
                .to_string()
        };
        let v = Size::parse(s)?;
        if BUFFER_BYTES.contains(&v) {
            Ok(v)
        } else {
            Err(range())
        }
    }
}

/// What a timeout of 0 stands for: no timeout. Waits take it as a deadline a
/// year away (far past any job, and still safe to add to an `Instant`).
pub const NO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);

/// A timeout setting's value in milliseconds as a duration: 0 is
/// [`NO_TIMEOUT`], larger values are capped at it.
pub fn timeout_from_ms(ms: u64) -> std::time::Duration {
    if ms == 0 {
        NO_TIMEOUT
    } else {
        std::time::Duration::from_millis(ms).min(NO_TIMEOUT)
    }
}

impl ParamKind for TimeoutMs {
    type Value = std::time::Duration;
    const KIND: Kind = kind("ms");
    fn parse(s: &str) -> std::result::Result<std::time::Duration, String> {
        parse_uint(s)
            .map(timeout_from_ms)
            .ok_or_else(|| "a number of milliseconds (0: no timeout)".into())
    }
}

impl ParamKind for U32 {
    type Value = u32;
    const KIND: Kind = kind("u32");
    fn parse(s: &str) -> std::result::Result<u32, String> {
        parse_uint(s)
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| "an integer from 0 to 4294967295".into())
    }
}

impl ParamKind for U64 {
    type Value = u64;
    const KIND: Kind = kind("u64");
    fn parse(s: &str) -> std::result::Result<u64, String> {
        parse_uint(s).ok_or_else(|| "a non-negative integer".into())
    }
}

impl ParamKind for I64 {
    type Value = i64;
    const KIND: Kind = kind("i64");
    fn parse(s: &str) -> std::result::Result<i64, String> {
        let err = || "an integer".to_string();
        match s.strip_prefix('-') {
            Some(rest) => {
                let v = parse_uint(rest).ok_or_else(err)?;
                0i64.checked_sub_unsigned(v).ok_or_else(err)
            }
            None => parse_uint(s)
                .and_then(|v| i64::try_from(v).ok())
                .ok_or_else(err),
        }
    }
}

impl ParamKind for Size {
    type Value = u64;
    const KIND: Kind = kind("size");
    fn parse(s: &str) -> std::result::Result<u64, String> {
        let err = || "a byte count such as 4194304, 512K, 4M or 1G".to_string();
        let lower = s.to_ascii_lowercase();
        let (num, suffix) = if lower.starts_with("0x") {
            (lower.as_str(), "")
        } else {
            let end = lower
                .find(|c: char| !(c.is_ascii_digit() || c == '+'))
                .unwrap_or(lower.len());
            (&lower[..end], lower[end..].trim())
        };
        let shift = match suffix {
            "" => 0,
            "k" | "kb" | "kib" => 10,
            "m" | "mb" | "mib" => 20,
            "g" | "gb" | "gib" => 30,
            "t" | "tb" | "tib" => 40,
            _ => return Err(err()),
        };
        let n = parse_uint(num.trim()).ok_or_else(err)?;
        n.checked_mul(1u64 << shift).ok_or_else(err)
    }
}

impl ParamKind for Str {
    type Value = String;
    const KIND: Kind = kind("string");
    fn parse(s: &str) -> std::result::Result<String, String> {
        Ok(s.to_string())
    }
}

impl ParamKind for Secret {
    type Value = String;
    const KIND: Kind = Kind {
        name: "secret string",
        optional: false,
        secret: true,
    };
    fn parse(s: &str) -> std::result::Result<String, String> {
        Ok(s.to_string())
    }
}

impl<K: ParamKind> ParamKind for Opt<K> {
    type Value = Option<K::Value>;
    const KIND: Kind = Kind {
        name: K::KIND.name,
        optional: true,
        secret: K::KIND.secret,
    };
    fn parse(s: &str) -> std::result::Result<Option<K::Value>, String> {
        if s.is_empty() {
            Ok(None)
        } else {
            K::parse(s).map(Some)
        }
    }
    fn suggest(s: &str) -> Option<String> {
        K::suggest(s)
    }
}

impl ParamKind for Level {
    type Value = Level;
    const KIND: Kind = kind("level");
    fn parse(s: &str) -> std::result::Result<Level, String> {
        Level::parse(s).ok_or_else(|| "one of VERSION, WARN, INFO, ABORT, TRACE".into())
    }
    fn suggest(s: &str) -> Option<String> {
        Level::nearest(s).map(|l| l.name().to_string())
    }
}

impl ParamKind for Subsys {
    type Value = Subsys;
    const KIND: Kind = kind("subsystem list");
    fn parse(s: &str) -> std::result::Result<Subsys, String> {
        Subsys::parse_list(s)
    }
    fn suggest(s: &str) -> Option<String> {
        Subsys::corrected(s)
    }
}

impl ParamKind for LevelSet {
    type Value = LevelSet;
    const KIND: Kind = kind("level list");
    fn parse(s: &str) -> std::result::Result<LevelSet, String> {
        LevelSet::parse_list(s)
    }
    fn suggest(s: &str) -> Option<String> {
        LevelSet::corrected(s)
    }
}

impl<T: Choice> ParamKind for Selection<T> {
    type Value = Selection<T>;
    const KIND: Kind = kind("selection");
    fn parse(s: &str) -> std::result::Result<Selection<T>, String> {
        Selection::<T>::parse_expected(s)
    }
    fn suggest(s: &str) -> Option<String> {
        Selection::<T>::corrected(s)
    }
}

/// `NCCL_SOCKET_FAMILY`: which address family bootstrap and sockets use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SocketFamily {
    /// `AF_INET`: IPv4.
    Inet,
    /// `AF_INET6`: IPv6.
    Inet6,
}

impl ParamKind for SocketFamily {
    type Value = SocketFamily;
    const KIND: Kind = kind("AF_INET or AF_INET6");
    fn parse(s: &str) -> std::result::Result<SocketFamily, String> {
        if s.eq_ignore_ascii_case("AF_INET") {
            Ok(SocketFamily::Inet)
        } else if s.eq_ignore_ascii_case("AF_INET6") {
            Ok(SocketFamily::Inet6)
        } else {
            Err("AF_INET or AF_INET6".into())
        }
    }
    fn suggest(s: &str) -> Option<String> {
        if Self::parse(s).is_ok() {
            return None;
        }
        crate::suggest::nearest_value(s, ["AF_INET", "AF_INET6"]).map(str::to_string)
    }
}

/// `NCCL_CROSS_NIC`: 0, 1 or 2 ([`crate::topo::CrossNic`]).
impl ParamKind for crate::topo::CrossNic {
    type Value = crate::topo::CrossNic;
    const KIND: Kind = kind("0, 1 or 2");
    fn parse(s: &str) -> std::result::Result<crate::topo::CrossNic, String> {
        use crate::topo::CrossNic;
        match s {
            "0" => Ok(CrossNic::Aligned),
            "1" => Ok(CrossNic::Allowed),
            "2" => Ok(CrossNic::PreferAligned),
            _ => Err("0, 1 or 2".into()),
        }
    }
}

/// A typed handle on one parameter; pass it to [`Params::get`].
pub struct Param<K> {
    /// The variable's name ("NCCL_BUFFSIZE").
    pub name: &'static str,
    /// The default, as text of the parameter's own form ("" = unset).
    pub default: &'static str,
    _k: PhantomData<fn() -> K>,
}

impl<K: ParamKind> Param<K> {
    const fn new(name: &'static str, default: &'static str) -> Self {
        Param {
            name,
            default,
            _k: PhantomData,
        }
    }

    /// The default value.
    pub fn default_value(&self) -> K::Value {
        // Every registry default parses as its own kind (unit-tested over ALL).
        K::parse(self.default).unwrap_or_else(|e| {
            panic!(
                "bug: default '{}' of {} is not {e}",
                self.default, self.name
            )
        })
    }
}

impl<K> Clone for Param<K> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K> Copy for Param<K> {}
impl<K> fmt::Debug for Param<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Param({})", self.name)
    }
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct ParamInfo {
    pub name: &'static str,
    pub kind: Kind,
    /// The default as text ("" = unset, meaning auto).
    pub default: &'static str,
    pub description: &'static str,
    /// Whether oxccl acts on it (false: recognised NCCL variable, not used yet,
    /// or internal).
    pub honoured: bool,
    /// Set and read by oxccl's own programs, scripts and tests (the `oxccl perf`
    /// launcher's variables for its children, test hooks): known, so never
    /// warned about, but not a setting for users, so not in `docs/env.md` nor
    /// echoed at start-up.
    pub internal: bool,
    check: fn(&str) -> std::result::Result<(), String>,
    suggest: fn(&str) -> Option<String>,
}

impl ParamInfo {
    /// Checks a value against the parameter's form; the error says what was expected.
    pub fn check(&self, value: &str) -> std::result::Result<(), String> {
        (self.check)(value.trim())
    }

    /// For a malformed value of an enumerated grammar: the value to set instead,
    /// each unknown name replaced by the nearest valid one (`rign` → `Ring`).
    pub fn suggest(&self, value: &str) -> Option<String> {
        (self.suggest)(value.trim())
    }

    /// `value`, or `<redacted>` for secrets.
    pub fn display_value<'a>(&self, value: &'a str) -> &'a str {
        if self.kind.secret {
            "<redacted>"
        } else {
            value
        }
    }
}

fn check<K: ParamKind>(s: &str) -> std::result::Result<(), String> {
    K::parse(s).map(|_| ())
}

macro_rules! honoured_flag {
    (honoured) => {
        true
    };
    (recognised) => {
        false
    };
    (internal) => {
        false
    };
}

macro_rules! internal_flag {
    (internal) => {
        true
    };
    ($other:ident) => {
        false
    };
}

macro_rules! params {
    ($( $konst:ident : $kind:ty = $name:literal, $default:literal, $use:ident, $desc:literal; )*) => {
        $(
            // The descriptions are plain text (docs/env.md, `oxccl doctor`),
            // not rustdoc: `[ipv6]:port` is no link.
            #[doc = concat!("`", $name, "`: ", $desc)]
            #[allow(rustdoc::broken_intra_doc_links)]
            pub const $konst: Param<$kind> = Param::new($name, $default);
        )*
        /// Every parameter, in declaration order (honoured ones first).
        pub static ALL: &[ParamInfo] = &[
            $(
                ParamInfo {
                    name: $name,
                    kind: <$kind as ParamKind>::KIND,
                    default: $default,
                    description: $desc,
                    honoured: honoured_flag!($use),
                    internal: internal_flag!($use),
                    check: check::<$kind>,
                    suggest: <$kind as ParamKind>::suggest,
                },
            )*
        ];
    };
}

params! {
    // ---- honoured: logging
    DEBUG: Level = "NCCL_DEBUG", "NONE", honoured,
        "Log level: VERSION, WARN, INFO, ABORT or TRACE (any case). Unset prints nothing.";
    DEBUG_SUBSYS: Subsys = "NCCL_DEBUG_SUBSYS", "INIT,BOOTSTRAP,ENV", honoured,
        "Subsystems whose INFO/TRACE lines are printed: comma list of INIT COLL P2P SHM NET GRAPH TUNING ENV ALLOC ALLOC_HOST CALL PROXY NVLS BOOTSTRAP REG PROFILE RAS DESTROY ALL; a leading ^ means all but those.";
    DEBUG_FILE: Opt<Str> = "NCCL_DEBUG_FILE", "", honoured,
        "Log to this file instead of stdout (%h = host name, %p = pid); created or truncated once; used only when NCCL_DEBUG is above VERSION.";
    DEBUG_TIMESTAMP_FORMAT: Str = "NCCL_DEBUG_TIMESTAMP_FORMAT", "[%F %T] ", honoured,
        "strftime-style prefix of timestamped lines (UTC; _ becomes a space; %Nf = N digits of the second's fraction).";
    DEBUG_TIMESTAMP_LEVELS: LevelSet = "NCCL_DEBUG_TIMESTAMP_LEVELS", "WARN", honoured,
        "Levels whose lines carry a timestamp: comma list of level names, ALL, or ^ to invert.";
    CONF_FILE: Opt<Str> = "NCCL_CONF_FILE", "", honoured,
        "Configuration file to read instead of ~/.nccl.conf and /etc/nccl.conf (NAME=VALUE lines; the environment wins).";
    // ---- honoured: networking and bootstrap
    SOCKET_IFNAME: Opt<Str> = "NCCL_SOCKET_IFNAME", "", honoured,
        "Network interfaces for bootstrap and TCP data connections: comma list of name prefixes, ^ to exclude, = for exact names. Unset: pick automatically, avoiding lo and docker*. OXCCL_BOOTSTRAP_IFNAME moves the bootstrap elsewhere.";
    SOCKET_FAMILY: Opt<SocketFamily> = "NCCL_SOCKET_FAMILY", "", honoured,
        "Address family to use: AF_INET or AF_INET6. Unset: either.";
    COMM_ID: Opt<Str> = "NCCL_COMM_ID", "", honoured,
        "Rendezvous address host:port (or [ipv6]:port): rank 0 listens there and the unique id encodes it.";
    HOSTID: Opt<Str> = "NCCL_HOSTID", "", honoured,
        "Names this host for transport choice instead of hostname + boot id: ranks with equal values use shared memory, others TCP.";
    SOCKET_NTHREADS: Opt<U32> = "NCCL_SOCKET_NTHREADS", "", honoured,
        "Threads per TCP connection (GPU network path: connections per peer = this x NCCL_NSOCKS_PERTHREAD, at most 16). Unset (both): 16 / peers on other hosts, 1..8.";
    NSOCKS_PERTHREAD: Opt<U32> = "NCCL_NSOCKS_PERTHREAD", "", honoured,
        "Sockets per TCP thread (see NCCL_SOCKET_NTHREADS). Unset: auto.";
    NET_PLUGIN: Opt<Str> = "NCCL_NET_PLUGIN", "", honoured,
        "Network plugin (ncclNet v6-v12) for peers on other hosts: foo loads libnccl-net-foo.so (then foo), a path is used as is, none disables. Unset: libnccl-net.so if present. A plugin that cannot be used: a WARN and oxccl's sockets.";
    NET: Opt<Str> = "NCCL_NET", "", honoured,
        "Network to use for peers on other hosts: Socket (oxccl's sockets) or the plugin's network name (e.g. IB); one that is not available fails communicator init.";
    IB_DISABLE: Opt<I64> = "NCCL_IB_DISABLE", "", honoured,
        "Non-zero: a network plugin whose network is named IB is not used.";
    IB_HCA: Opt<Str> = "NCCL_IB_HCA", "", honoured,
        "Devices of a network named IB to use: name[:port] list, ^ to exclude, = for exact names (prefixes otherwise). Also read by the plugin itself.";
    TUNER_PLUGIN: Opt<Str> = "NCCL_TUNER_PLUGIN", "", honoured,
        "Tuner plugin (ncclTunerPlugin v2-v6) whose cost table decides the host path's algorithm, protocol and channel count: foo loads foo, then libnccl-tuner-foo.so; a path is used as is; none disables. Unset: libnccl-tuner.so if present. A plugin that cannot be used: a WARN and oxccl's own tuning.";
    PROFILER_PLUGIN: Opt<Str> = "NCCL_PROFILER_PLUGIN", "", honoured,
        "Profiler plugin (ncclProfiler v1-v6) that receives the group API, collective and point-to-point API (v5 on), group, collective and point-to-point events of host-path calls, and proxy operation and step events of their network transfers: foo loads foo, then libnccl-profiler-foo.so; a path is used as is; none disables. Unset: libnccl-profiler.so if present. A plugin that cannot be used: a WARN and no profiler.";
    // ---- honoured: transports and tuning
    SHM_DISABLE: Bool = "NCCL_SHM_DISABLE", "0", honoured,
        "1 disables the shared-memory transport.";
    P2P_DISABLE: Bool = "NCCL_P2P_DISABLE", "0", honoured,
        "1 disables the peer-to-peer (GPU direct / in-process) transport.";
    ALGO: Opt<Selection<Algo>> = "NCCL_ALGO", "", honoured,
        "Algorithms allowed: e.g. ring,tree or ^tree or allreduce:tree;broadcast:ring. Names: Tree Ring CollnetDirect CollnetChain NVLS NVLSTree PAT OneShot TwoShot. Unset: all.";
    PROTO: Opt<Selection<Proto>> = "NCCL_PROTO", "", honoured,
        "Protocols allowed, same grammar as NCCL_ALGO. Names: LL LL128 Simple. Unset: all.";
    BUFFSIZE: BufSize = "NCCL_BUFFSIZE", "4M", honoured,
        "Buffer size per peer and channel for the bulk (Simple) protocol, 4K to 1G (a value outside is refused with a warning and the default used).";
    MIN_NCHANNELS: Opt<U32> = "NCCL_MIN_NCHANNELS", "", honoured,
        "Lower bound on the number of channels. Unset: auto (GPU rings: 32 up to 8 ranks, 16 beyond, fewer over slow links; ranks sharing a GPU get at most its SMs / their number, whatever is set).";
    MAX_NCHANNELS: Opt<U32> = "NCCL_MAX_NCHANNELS", "", honoured,
        "Upper bound on the number of channels. Unset: auto (see NCCL_MIN_NCHANNELS).";
    COMM_BLOCKING: Opt<Bool> = "NCCL_COMM_BLOCKING", "", honoured,
        "Overrides the communicator config's blocking flag (0: non-blocking calls). Unset: use the config.";
    // ---- honoured: oxccl's own
    TIMEOUT_MS: TimeoutMs = "OXCCL_TIMEOUT_MS", "600000", honoured,
        "Timeout of any blocking wait inside an operation, in milliseconds; past it the operation fails with ncclTimeout instead of hanging. 0: no timeout (waits end only on an error, a peer's death or an abort).";
    LINK_TIMEOUT_MS: Opt<TimeoutMs> = "OXCCL_LINK_TIMEOUT_MS", "", honoured,
        "How long a TCP connection to a peer on another host may go without an answer before it counts as broken, in milliseconds: the control connections' keepalive probes and every connection's retransmissions (TCP_USER_TIMEOUT) give up after it. A link outage shorter than it recovers; a host that vanished is noticed after it (a killed process at once, by its reset). 0: no limit. Unset: the operation timeout (OXCCL_TIMEOUT_MS).";
    CUDA_RING: Bool = "OXCCL_CUDA_RING", "0", honoured,
        "1: device buffers always take the GPU ring path, also where two GPUs of one process could use the one-shot kernels (for tests and comparisons).";
    CUDA_PDL: Bool = "OXCCL_CUDA_PDL", "1", honoured,
        "1: oxccl's GPU kernels are programmatic dependent launches (compute capability 9.0 and a CUDA 12.3 driver or newer): a collective's launch overlaps the end of the kernel before it in the stream, and waits for it before touching memory. Where several ranks of a communicator share one GPU (in one process or several), only launches of at most SMs / (2 x those ranks) blocks (their waiting blocks would otherwise hold the SMs the other ranks' kernels need). 0: plain launches.";
    CUDA_LL1_FAST: Bool = "OXCCL_CUDA_LL1_FAST", "1", honoured,
        "1: one-shot LL all-reduces, all-gathers, reduce-scatters, broadcasts and reduces whose every block fits one LL slot (to 256 KiB, per rank for the copies and reduce-scatters, at the default channels) run in a small kernel of their own that does its fixed loads before waiting for the kernel ahead of it (2 ranks sharing one H200, CUDA graphs: 8-512 B all-reduces 1.6-1.9 us against 3.4-3.5, 256 KiB 3.1 against 5.3; 8 B-4 KiB broadcasts 1.7-1.9 against 3.0-3.2, reduces 1.9-2.2 against 3.3-3.4, all-gathers 2.2-2.3 against 3.6-3.8, reduce-scatters 2.3-2.5 against 3.8-3.9); two-shot LL all-reduces (3-8 ranks) too, when every block's part of a rank's block fits one slot. 0: the ring kernel's one-shot and two-shot paths.";
    // Why a bound: the one-launch kernel reads the other ranks' inputs from
    // one GPU (the per-rank kernels spread that over every GPU's links), so
    // it pays where the launches dominate, small calls (gpu/one_launch.rs).
    CUDA_JOINT_MAX: Size = "OXCCL_CUDA_JOINT_MAX", "256K", honoured,
        "Every rank of a communicator of at most 8 ranks in this process, all on one GPU (or on several with OXCCL_CUDA_JOINT_PEERS=1), every rank's calls in one group of one thread, not under CUDA graph capture: all-reduces, all-gathers, reduce-scatters, broadcasts and reduces whose larger buffer per rank holds at most this many bytes run as one kernel on rank 0's GPU that reads every rank's input and writes every rank's output, the other ranks' streams ordered around it by events: one launch per call instead of one per rank (ranks sharing one H200, eager, 8 B-128 KB, medians of 3-7 rounds: two ranks' all-reduces 7.2 us against 9.0, reduces 5.0 against 9.0, all-gathers 6.6 against 9.2, broadcasts 7.1 against 7.8; four ranks' all-reduces 7.3-8.0 against 17.2-19.3; one H200, 2026-12-01, docs/performance-gpu.md). 0: never.";
    // Why off: across GPUs the events cross devices and rank 0's GPU reads
    // the peers' inputs over NVLink; not yet timed there (gpu/one_launch.rs).
    CUDA_JOINT_PEERS: Bool = "OXCCL_CUDA_JOINT_PEERS", "0", honoured,
        "1: the one-launch kernel of OXCCL_CUDA_JOINT_MAX also for ranks on several GPUs of this process (nccl-tests -g N): rank 0's GPU reads the other ranks' inputs and writes their outputs over the peer mappings. 0: only ranks that all share one GPU (the default until timed on several GPUs).";
    CUDA_AR_BLOCKS: Opt<U32> = "OXCCL_CUDA_AR_BLOCKS", "", honoured,
        "Most blocks of the two-GPU in-process all-reduce kernels (1..128). Unset: 128.";
    CUDA_AR_TWO_SHOT: Opt<U64> = "OXCCL_CUDA_AR_TWO_SHOT", "", honoured,
        "Element count from which out-of-place all-reduces of the two-GPU in-process path also take the two-shot kernel (in place always does). 0 or unset: never; 1: always.";
    CUDA_CE_MIN: Opt<Size> = "OXCCL_CUDA_CE_MIN", "", honoured,
        "Two GPUs in one process, both ranks' calls in one group of one thread (nccl-tests -g 2): all-gathers, broadcasts and send/receive groups (gather, scatter, all-to-all) whose largest transfer is at least this many bytes (twice this when only one GPU receives, as in a broadcast) move it with the copy engines instead of SMs. Two ranks in two processes of one host (one GPU each, as PyTorch runs): the same for all-gathers, broadcasts and groups of one send to and one receive from the peer (pushed by the engines), through CUDA IPC handles of the buffers that both ranks trade per call (buffers from cuMemAlloc/cudaMalloc; VMM allocations keep the ring kernels). Every rank must set the same value. 0: never. Unset: 64M.";
    // Why a bound of its own, apart from CUDA_CE_MIN: the reduction's fixed
    // cost (three barriers, a pipeline's fill and drain through a 64 MiB
    // scratch ring) is paid against the SM pair kernel at 337 GB/s, not the
    // copy kernel, so it pays off far later (gpu/config.rs, DEFAULT_CE_AR_MIN).
    CUDA_CE_AR_MIN: Opt<Size> = "OXCCL_CUDA_CE_AR_MIN", "", honoured,
        "Two GPUs in one process, both ranks' calls in one group of one thread (nccl-tests -g 2), or two ranks in two processes of one host (buffers traded through CUDA IPC per call, as for OXCCL_CUDA_CE_MIN): all-reduces (sum, prod, max, min; same count, type and op on both ranks) of at least this many bytes, and reduce-scatters whose send buffer holds at least twice this, pull the peer's values with the copy engines through a 256 MiB scratch ring per GPU (allocated at the first such call) and reduce them with a 32-block kernel, instead of the SM kernels. Every rank must set the same value. 0: never. Unset: 512M in one process; two processes (whose alternative is the slower ring kernel) from 256M, reduce-scatters from 256M of send buffer too, and both from 128M where every rank's send and receive buffers are apart (pushed, OXCCL_CUDA_CE_PUSH).";
    // Why a setting: the pushed reduction's piece trades the pipeline's fill
    // (the first piece's copy before any reduction) against ~20 us of copy
    // stream work per piece (gpu/copy_engine_reduce.rs, SLOT_BYTES); measured per size
    // on the device (gpu/config.rs, DEFAULT_CE_PUSH_PIECE), and small in tests so many pieces run.
    CUDA_CE_PUSH: Opt<Size> = "OXCCL_CUDA_CE_PUSH", "", honoured,
        "Two ranks in two processes of one host taking the copy engines for an all-reduce or reduce-scatter (OXCCL_CUDA_CE_AR_MIN) with send and receive buffers apart on both ranks: each rank's copy engine pushes the peer's part of its input straight into the peer's output in pieces of at most this many bytes (a quarter of the part when less, at least 16M), and the peer reduces there as pieces land (no scratch ring, no 256 MiB allocation). In place the pieces are pulled through the scratch ring. Every rank must set the same value. 0: always pull. Unset: 64M.";
    // Why a setting, off: the in-place pushes (gpu/copy_engine_reduce.rs,
    // plan_pushed_in_place, plan_pushed_ring) were checked on one GPU but
    // not yet timed on two; the default follows a measurement.
    CUDA_CE_PUSH_IN_PLACE: Bool = "OXCCL_CUDA_CE_PUSH_IN_PLACE", "0", honoured,
        "Two ranks in two processes of one host, an all-reduce or reduce-scatter both call in place (as NCCL defines it) that takes the copy engines (OXCCL_CUDA_CE_AR_MIN, OXCCL_CUDA_CE_PUSH): push the pieces instead of pulling them. An all-reduce's first piece goes into the peer's scratch, every later one into the peer's copy of this rank's part once the peer's own push has sent those values; a reduce-scatter's pieces go into the peer's 4-slot scratch ring, each once the peer's kernel has reduced the slot's previous piece (bounded waits on counters in the ring window). Every rank must set the same value (a rank that does not pulls, and so does its peer). 1: push; 0: pull (the default until measured on two GPUs).";
    // Why a setting, 1: on one stream each piece leaves the copy engine idle
    // for ~5 us (its landed flag, the next copy's start; 16 MiB pieces on one
    // stream moved 347 GB/s against 390 unpieced: scripts/ce-probe.sh,
    // 2xH200, 2026-11-30), which
    // a second stream's copy could fill; not yet timed on two GPUs.
    CUDA_CE_PUSH_STREAMS: U64 = "OXCCL_CUDA_CE_PUSH_STREAMS", "1", honoured,
        "Two ranks in two processes of one host pushing a reduction's pieces (OXCCL_CUDA_CE_PUSH, OXCCL_CUDA_CE_PUSH_IN_PLACE): the copy streams the pieces alternate on, 1 or 2 (larger values count as 2); each stream counts its own landed pieces, so the peer's kernel follows each piece whichever stream finishes first. Every rank must set the same value (else the copy engines stay off between them, with a warning). Unset: 1 (2 not yet timed on two GPUs).";
    // Why a knob of our own: NCCL_PROTO would move NVIDIA's NCCL too when
    // both run side by side (`oxccl perf --compare`), and the 2-rank bound
    // (1 MiB) was set when a Simple ring step still cost ~10 us of waiting, before
    // one system fence per step (2xH200, 2026-12-01).
    CUDA_LL_MAX: Opt<Size> = "OXCCL_CUDA_LL_MAX", "", honoured,
        "On the GPU ring path (every case but the two GPUs of one process, see OXCCL_CUDA_RING), all-reduces within one host up to this many bytes take an LL kernel (one-shot, two-shot or LL ring); larger ones the Simple ring (unless OXCCL_CUDA_TWOSHOT_MAX reaches further). It also bounds the small all-gathers, reduce-scatters, broadcasts, reduces and sends that LL takes; 0: no LL at all. Unset: 1M for 2 ranks, 512K for more. NCCL_PROTO without LL wins over it.";
    CUDA_ONESHOT_MAX: Opt<Size> = "OXCCL_CUDA_ONESHOT_MAX", "", honoured,
        "All-reduces on device buffers up to this many bytes take a one-shot kernel (every rank writes to every rank; at most 8 ranks): LL within a host, Simple slots when a peer is on another host. 0: never. Unset: 256K within a host for 2 ranks, 128K / (ranks - 1) for more; across hosts every size for 2 ranks, else 256K / (ranks - 1). NCCL_ALGO without OneShot also turns it off. 0 also turns off the one-shot all-gather and reduce-scatter (blocks B with (ranks - 1) x B within LL's 512K, one host).";
    // Why on by default: the LL ring's 2 (n - 1) dependent steps against two
    // crossings for the same bytes (gpu/ring.rs,
    // default_twoshot_max; 4 and 8 ranks sharing one H200, 2026-12-01).
    CUDA_TWOSHOT_MAX: Opt<Size> = "OXCCL_CUDA_TWOSHOT_MAX", "", honoured,
        "All-reduces on device buffers of 3 to 8 ranks of one host, larger than the one-shot bound (OXCCL_CUDA_ONESHOT_MAX), up to this many bytes take a two-shot kernel over LL lines (block p of every rank to rank p, reduced there, then sent to every rank: two crossings) instead of the LL ring (2 x (ranks - 1) dependent steps), and, set above LL's bound, instead of the Simple ring up to it. 0: never. Unset: 512K (LL's default bound). NCCL_ALGO without TwoShot or NCCL_PROTO without LL also turns it off; not for 2 ranks (the one-shot serves them) or across hosts.";
    // Why on by default: one (two) crossings of the ring's bytes against the
    // Simple ring's n - 1 (2 (n - 1)) dependent steps (gpu/ring.rs,
    // default_direct_max; ranks sharing one H200, 2026-12-01).
    CUDA_DIRECT_MAX: Opt<Size> = "OXCCL_CUDA_DIRECT_MAX", "", honoured,
        "On the GPU ring path, for 3 to 8 ranks of one host: all-gathers and reduce-scatters past the one-shot LL bound whose per-rank block is at most this many bytes take a one-shot kernel over Simple slots (each rank writes its piece for rank p straight into p's slots: one crossing instead of the ring's ranks - 1 steps), and all-reduces past LL whose 1/ranks part is at most this a two-shot one (that reduce-scatter, then that all-gather of the reduced blocks). 0: never (the Simple ring). Unset: 1M. NCCL_ALGO naming neither OneShot nor TwoShot for all-reduce also turns it off; not for 2 ranks (their ring is already one step each way) or across hosts.";
    RING_ORDER: Opt<Str> = "OXCCL_RING_ORDER", "", honoured,
        "The GPU ring path's rank order, e.g. 0,2,1,3 (every rank once; rank 0's setting is used by all). Unset: chosen from the topology (NVLink, PCIe switches, NUMA nodes; each host's ranks together).";
    INIT_TIMEOUT_MS: TimeoutMs = "OXCCL_INIT_TIMEOUT_MS", "120000", honoured,
        "Timeout of rendezvous and connection setup, in milliseconds. 0: no timeout.";
    BOOTSTRAP_IFNAME: Opt<Str> = "OXCCL_BOOTSTRAP_IFNAME", "", honoured,
        "Network interface of the bootstrap alone (rendezvous, root, out-of-band messages; NCCL_SOCKET_IFNAME's grammar), when it should differ from the data connections' (NCCL_SOCKET_IFNAME): e.g. a management network beside the fast one. Unset: NCCL_SOCKET_IFNAME's choice for both.";
    AUTH_SECRET: Opt<Secret> = "OXCCL_AUTH_SECRET", "", honoured,
        "Shared secret that authenticates ranks meeting through NCCL_COMM_ID instead of a unique id. Never logged.";
    AUTH_SECRET_FILE: Opt<Str> = "OXCCL_AUTH_SECRET_FILE", "", honoured,
        "A file holding the shared secret for NCCL_COMM_ID (its contents less one trailing newline), when OXCCL_AUTH_SECRET is unset: keeps the secret out of the environment and process listings. Unreadable or empty: init fails naming the file.";
    AUTH_REQUIRED: Bool = "OXCCL_AUTH_REQUIRED", "0", honoured,
        "1: refuse to start a job that meets through NCCL_COMM_ID without OXCCL_AUTH_SECRET or OXCCL_AUTH_SECRET_FILE (init fails with InvalidUsage) instead of running open to anyone who can reach the root with one WARN. Ids from ncclGetUniqueId carry a random secret and are not affected.";
    HOST_NCHANNELS: Opt<U32> = "OXCCL_HOST_NCHANNELS", "", honoured,
        "Channels (parallel streams per peer) for host collectives. Unset: auto.";
    // A yield hands the CPU away for a scheduler slice: beside other busy
    // processes (load average 16 on 2 cores), 2-rank 8 B - 4 KiB host
    // all-reduces took 59-100 us with 50 us spins and 0.6-3.6 us with 2 ms
    // (Open MPI, which spins without end: 0.8-7.4 us; same run, alternated).
    SPIN_US: U64 = "OXCCL_SPIN_US", "2000", honoured,
        "How long a waiting rank spins before yielding its thread, in microseconds. Where a host has more local ranks than CPUs, waiting ranks yield at once whatever this says. A small collective over the one-shot slots yields for 2 ms more, then sleeps until the post it awaits wakes it.";
    KERNEL_DIR: Opt<Str> = "OXCCL_KERNEL_DIR", "", honoured,
        "Folder of prebuilt GPU kernels (written by `oxccl kernels --out DIR`), looked at before the kernel cache. Unset: oxccl-kernels/ beside libnccl.so.2 (or the oxccl program), when it exists.";
    CACHE_DIR: Opt<Str> = "OXCCL_CACHE_DIR", "", honoured,
        "Directory for cached compiled kernels and tuning data. Unset: ~/.cache/oxccl.";
    NVRTC: Opt<Str> = "OXCCL_NVRTC", "", honoured,
        "libnvrtc.so.13, or the folder holding it, for compiling GPU kernels at run time; searched before LD_LIBRARY_PATH, CUDA toolkits under /usr/local and pip's nvidia-cuda-nvrtc wheel.";
    // Why a setting: the check is one host all-gather of 30 bytes per rank
    // that every rank waits on at the call (gpu/rooted.rs); under CUDA
    // graphs it runs at capture only.
    CHECK_ROOTS: Bool = "OXCCL_CHECK_ROOTS", "1", honoured,
        "1: broadcasts, reduces, gathers and scatters on device buffers are checked across the ranks before they are queued (one all-gather of 30 bytes per rank over the host transport per group, which waits for every rank to make the call; under CUDA graphs at capture only): ranks that name different roots, counts or types all fail the call with ncclInvalidUsage, as on host buffers. 0: no check (as NCCL: the result is undefined). Every rank must set the same value.";

    // ---- internal: set and read by oxccl's own programs, scripts and tests.
    // Known so that they raise no warning; not settings (not in docs/env.md,
    // not echoed at start-up).
    PERF_RANK: Opt<Str> = "OXCCL_PERF_RANK", "", internal, "oxccl perf: set by the launcher for its child, the child's first global rank.";
    PERF_ID: Opt<Str> = "OXCCL_PERF_ID", "", internal, "oxccl perf: set by the launcher for its child, the unique id in hexadecimal.";
    PERF_PARENT: Opt<Str> = "OXCCL_PERF_PARENT", "", internal, "oxccl perf: set by the launcher for its child, the launcher's pid.";
    PERF_COMPARE_ID: Opt<Str> = "OXCCL_PERF_COMPARE_ID", "", internal, "oxccl perf --compare: set by the launcher for its child, the second library's unique id.";
    PERF_TEST_ABORT_RANK: Opt<Str> = "OXCCL_PERF_TEST_ABORT_RANK", "", internal, "oxccl perf test hook: this rank exits after timing.";
    PERF_TEST_CORRUPT_RANK: Opt<Str> = "OXCCL_PERF_TEST_CORRUPT_RANK", "", internal, "oxccl perf test hook: this rank corrupts its results.";
    PERF_LIB: Opt<Str> = "OXCCL_PERF_LIB", "", internal, "GPU perf tests: oxccl's libnccl.so.2 to load.";
    PERF_NCCL: Opt<Str> = "OXCCL_PERF_NCCL", "", internal, "GPU perf tests: NVIDIA's libnccl.so.2 to compare with.";
    BIN: Opt<Str> = "OXCCL_BIN", "", internal, "GPU perf tests: the oxccl executable to run.";
    BLESS: Opt<Str> = "OXCCL_BLESS", "", internal, "Tests: 1 rewrites generated files (docs/env.md) instead of comparing.";
    WARM_CACHE: Opt<Str> = "OXCCL_WARM_CACHE", "", internal, "Kernel tests: folder to store the compiled kernels in.";
    T_ADDR: Opt<Str> = "OXCCL_T_ADDR", "", internal, "Transport tests: the parent's address for the child.";
    T_SEG: Opt<Str> = "OXCCL_T_SEG", "", internal, "Transport tests: the parent's shared-memory segment for the child.";
    T_CTL: Opt<Str> = "OXCCL_T_CTL", "", internal, "Transport tests: the parent's control address for the child.";
    GPU_ONLY: Opt<Str> = "OXCCL_GPU_ONLY", "", internal, "scripts/gpu-test.sh: the rows to run.";
    SKIP_KCACHE: Opt<Str> = "OXCCL_SKIP_KCACHE", "", internal, "scripts/gpu-test.sh: keep the last compiled kernels.";
    USE_KCACHE: Opt<Str> = "OXCCL_USE_KCACHE", "", internal, "scripts/gpu-test.sh: use compiled kernels brought along.";
    SKIP_TORCH: Opt<Str> = "OXCCL_SKIP_TORCH", "", internal, "scripts/gpu-test.sh: skip the PyTorch rows.";
    XP_COLLS: Opt<Str> = "OXCCL_XP_COLLS", "", internal, "scripts/perf-gpu.sh: the collectives to run.";
    SWEEP_COLLS: Opt<Str> = "OXCCL_SWEEP_COLLS", "", internal, "scripts/perf-gpu.sh: the collectives to run.";
    PUSH_COLLS: Opt<Str> = "OXCCL_PUSH_COLLS", "", internal, "scripts/perf-gpu.sh: the collectives to run.";
    SMALL_COLLS: Opt<Str> = "OXCCL_SMALL_COLLS", "", internal, "scripts/perf-gpu.sh: the collectives to run.";
    JOINT_COLLS: Opt<Str> = "OXCCL_JOINT_COLLS", "", internal, "scripts/perf-gpu.sh: the collectives to run.";
    CE_AR_COLLS: Opt<Str> = "OXCCL_CE_AR_COLLS", "", internal, "scripts/perf-gpu.sh: the collectives to run.";
    DIRECT_COLLS: Opt<Str> = "OXCCL_DIRECT_COLLS", "", internal, "scripts/perf-gpu.sh: the collectives to run.";
    DIRECT_RANKS: Opt<Str> = "OXCCL_DIRECT_RANKS", "", internal, "scripts/perf-gpu.sh: the rank counts to run.";
    DIRECT_CHECK_TYPES: Opt<Str> = "OXCCL_DIRECT_CHECK_TYPES", "", internal, "scripts/perf-gpu.sh: the data types to check.";
    TWOSHOT_RANKS: Opt<Str> = "OXCCL_TWOSHOT_RANKS", "", internal, "scripts/perf-gpu.sh: the rank counts to run.";
    MULTI_MAX: Opt<Str> = "OXCCL_MULTI_MAX", "", internal, "scripts/perf-gpu.sh: the largest size to run.";
    // Why a knob: the notices of a waiting rank come after 5 s and 10 s;
    // tests of them should not wait that long (oxccl-env's log::Waiting).
    WAIT_NOTICE_MS: Opt<U64> = "OXCCL_WAIT_NOTICE_MS", "", internal, "Tests: a waiting rank's INFO notice every this many milliseconds and its WARN after twice this, instead of 5 s and 10 s.";

    // ---- recognised, not used yet (NCCL's defaults in the descriptions)
    SOCKET_RETRY_CNT: Opt<I64> = "NCCL_SOCKET_RETRY_CNT", "", recognised, "Connect retries (NCCL default 34).";
    SOCKET_RETRY_SLEEP_MSEC: Opt<I64> = "NCCL_SOCKET_RETRY_SLEEP_MSEC", "", recognised, "Sleep between connect retries in ms (NCCL default 100).";
    SOCKET_POLL_TIMEOUT_MSEC: Opt<I64> = "NCCL_SOCKET_POLL_TIMEOUT_MSEC", "", recognised, "Socket poll timeout in ms (NCCL default 0).";
    IB_TIMEOUT: Opt<I64> = "NCCL_IB_TIMEOUT", "", recognised, "InfiniBand timeout exponent (NCCL default 20).";
    IB_RETRY_CNT: Opt<I64> = "NCCL_IB_RETRY_CNT", "", recognised, "InfiniBand retry count (NCCL default 7).";
    IB_GID_INDEX: Opt<I64> = "NCCL_IB_GID_INDEX", "", recognised, "RoCE GID index.";
    IB_SL: Opt<I64> = "NCCL_IB_SL", "", recognised, "InfiniBand service level.";
    IB_TC: Opt<I64> = "NCCL_IB_TC", "", recognised, "InfiniBand traffic class.";
    IB_QPS_PER_CONNECTION: Opt<I64> = "NCCL_IB_QPS_PER_CONNECTION", "", recognised, "Queue pairs per connection.";
    IB_PCI_RELAXED_ORDERING: Opt<I64> = "NCCL_IB_PCI_RELAXED_ORDERING", "", recognised, "PCI relaxed ordering for IB.";
    IB_ADAPTIVE_ROUTING: Opt<I64> = "NCCL_IB_ADAPTIVE_ROUTING", "", recognised, "InfiniBand adaptive routing.";
    IB_ROCE_VERSION_NUM: Opt<I64> = "NCCL_IB_ROCE_VERSION_NUM", "", recognised, "RoCE version.";
    IB_ADDR_FAMILY: Opt<Str> = "NCCL_IB_ADDR_FAMILY", "", recognised, "RoCE address family.";
    IB_MERGE_NICS: Opt<I64> = "NCCL_IB_MERGE_NICS", "", recognised, "Merge ports of dual-port NICs.";
    P2P_LEVEL: Opt<Str> = "NCCL_P2P_LEVEL", "", recognised, "Furthest topology distance for GPU peer-to-peer: LOC NVL PIX PXB PHB SYS or 0-4.";
    NTHREADS: Opt<I64> = "NCCL_NTHREADS", "", recognised, "GPU threads per block (NCCL default 512).";
    LL128_NTHREADS: Opt<I64> = "NCCL_LL128_NTHREADS", "", recognised, "GPU threads per block for LL128 (NCCL default 640).";
    MIN_CTAS: Opt<I64> = "NCCL_MIN_CTAS", "", recognised, "Minimum CTAs (NCCL's newer name for NCCL_MIN_NCHANNELS).";
    MAX_CTAS: Opt<I64> = "NCCL_MAX_CTAS", "", recognised, "Maximum CTAs (NCCL's newer name for NCCL_MAX_NCHANNELS).";
    MIN_NRINGS: Opt<I64> = "NCCL_MIN_NRINGS", "", recognised, "Old name of NCCL_MIN_NCHANNELS.";
    MAX_NRINGS: Opt<I64> = "NCCL_MAX_NRINGS", "", recognised, "Old name of NCCL_MAX_NCHANNELS.";
    LL_BUFFSIZE: Opt<I64> = "NCCL_LL_BUFFSIZE", "", recognised, "Buffer size for the LL protocol.";
    LL128_BUFFSIZE: Opt<I64> = "NCCL_LL128_BUFFSIZE", "", recognised, "Buffer size for the LL128 protocol.";
    TOPO_FILE: Opt<Str> = "NCCL_TOPO_FILE", "", honoured, "XML topology (NCCL's format) used instead of the machine's sysfs tree: where GPUs and NICs sit, which the GPU ring's order follows. A file that cannot be read or parsed is named in a WARN and the machine's tree is used.";
    TOPO_DUMP_FILE: Opt<Str> = "NCCL_TOPO_DUMP_FILE", "", honoured, "At communicator creation, the dumping rank (NCCL_TOPO_DUMP_FILE_RANK) writes the topology it uses to this file as XML (NVML's NVLinks merged in where a GPU was chosen): the format NCCL_TOPO_FILE reads.";
    TOPO_DUMP_FILE_RANK: Opt<I64> = "NCCL_TOPO_DUMP_FILE_RANK", "", honoured, "The rank that writes NCCL_TOPO_DUMP_FILE (unset: 0).";
    GRAPH_FILE: Opt<Str> = "NCCL_GRAPH_FILE", "", recognised, "Search graphs to load.";
    GRAPH_DUMP_FILE: Opt<Str> = "NCCL_GRAPH_DUMP_FILE", "", recognised, "Where to dump search graphs.";
    NVLS_ENABLE: Opt<I64> = "NCCL_NVLS_ENABLE", "", recognised, "NVLink SHARP: 0 off, 1 on, 2 auto (NCCL default 2).";
    CUMEM_ENABLE: Opt<I64> = "NCCL_CUMEM_ENABLE", "", recognised, "Use cuMem* (VMM) allocations (NCCL default auto).";
    CUMEM_HOST_ENABLE: Opt<I64> = "NCCL_CUMEM_HOST_ENABLE", "", recognised, "Use cuMem host allocations (NCCL default auto).";
    ENV_PLUGIN: Opt<Str> = "NCCL_ENV_PLUGIN", "", recognised, "Environment plugin library.";
    TUNER_CONFIG_FILE: Opt<Str> = "NCCL_TUNER_CONFIG_FILE", "", recognised, "Configuration of the example tuner plugin.";
    LAUNCH_MODE: Opt<Str> = "NCCL_LAUNCH_MODE", "", recognised, "PARALLEL or GROUP (deprecated).";
    CGA_CLUSTER_SIZE: Opt<I64> = "NCCL_CGA_CLUSTER_SIZE", "", recognised, "CUDA cluster size, 0-8.";
    NET_GDR_LEVEL: Opt<Str> = "NCCL_NET_GDR_LEVEL", "", honoured, "Furthest PCI distance from a GPU to the network plugin's NIC at which the GPU ring hands the plugin GPU memory (GPUDirect RDMA, where the device declares NCCL_PTR_CUDA): LOC, NVL, PIX, PXB, PHB or SYS, or 0-4 (LOC, PIX, PXB, PHB, SYS). A NIC whose PCI path the plugin does not give counts as SYS. Unset: off (NCCL's default is PXB; oxccl's GPUDirect path is opt-in until it has run on an RDMA NIC).";
    NET_GDR_READ: Opt<I64> = "NCCL_NET_GDR_READ", "", honoured, "With GPUDirect RDMA, whether sends read GPU memory too (1) or go through pinned host memory (0). Unset: 0 (NCCL: on for compute capability 8.0 and later; oxccl's sends from GPU memory stalled on large calls in its check through a test plugin, so they are opt-in).";
    NET_FORCE_FLUSH: Opt<I64> = "NCCL_NET_FORCE_FLUSH", "", honoured, "1: flush (the plugin's iflush) every receive into GPU memory before the kernel reads it. Unset: only on GPUs before compute capability 9.0, or where the device's properties say forceFlush.";
    NET_SHARED_BUFFERS: Opt<I64> = "NCCL_NET_SHARED_BUFFERS", "", recognised, "Shared network buffers.";
    NCHANNELS_PER_NET_PEER: Opt<I64> = "NCCL_NCHANNELS_PER_NET_PEER", "", recognised, "Channels per remote peer for point-to-point.";
    CROSS_NIC: crate::topo::CrossNic = "NCCL_CROSS_NIC", "2", honoured, "Whether a channel's network connection may use NICs of different indices on its two hosts (a network plugin with several devices; GPU ring and host path). 0: channel c uses the c-th usable device on every host (rail-aligned), however near. 1: each rank takes the devices nearest its GPU (host buffers: its NUMA node), spread by its index on the host; the ends may differ. 2: rail-aligned when every usable device is as near as the nearest, otherwise as 1.";
    RUNTIME_CONNECT: Opt<I64> = "NCCL_RUNTIME_CONNECT", "", recognised, "Connect peers lazily at the first collective (NCCL default 1).";
    LOCAL_REGISTER: Opt<I64> = "NCCL_LOCAL_REGISTER", "", recognised, "User buffer registration (NCCL default 1).";
    GRAPH_REGISTER: Opt<I64> = "NCCL_GRAPH_REGISTER", "", recognised, "Buffer registration under CUDA graphs (NCCL default 1).";
    WIN_ENABLE: Opt<I64> = "NCCL_WIN_ENABLE", "", recognised, "Window registration (NCCL default 1).";
    P2P_NET_CHUNKSIZE: Opt<I64> = "NCCL_P2P_NET_CHUNKSIZE", "", recognised, "Point-to-point chunk size over the network (NCCL default 128K).";
    P2P_PCI_CHUNKSIZE: Opt<I64> = "NCCL_P2P_PCI_CHUNKSIZE", "", recognised, "Point-to-point chunk size over PCI (NCCL default 128K).";
    P2P_NVL_CHUNKSIZE: Opt<I64> = "NCCL_P2P_NVL_CHUNKSIZE", "", recognised, "Point-to-point chunk size over NVLink (NCCL default 512K).";
    P2P_LL_THRESHOLD: Opt<I64> = "NCCL_P2P_LL_THRESHOLD", "", honoured, "Sends and receives of at most this many bytes between GPUs of one host take the LL protocol (flags in the data: one crossing, no fences), spread over a channel per 16 KiB; at most 64 KiB per channel (one connection's LL slots), 1 MiB with 16 channels. 0: never. Unset: 524288 with 2 ranks, 512 KiB / (ranks - 1) with more, at least 16384 (NCCL's default is 16384; LL beat oxccl's Simple sends to 512 KiB on 2xH200). NCCL_PROTO without LL also turns it off.";
    P2P_READ_ENABLE: Opt<I64> = "NCCL_P2P_READ_ENABLE", "", recognised, "Peer-to-peer reads instead of writes.";
    P2P_USE_CUDA_MEMCPY: Opt<I64> = "NCCL_P2P_USE_CUDA_MEMCPY", "", recognised, "Copy engines for peer-to-peer.";
    PXN_DISABLE: Opt<I64> = "NCCL_PXN_DISABLE", "", recognised, "Disable PXN routing (NCCL default 0).";
    P2P_PXN_LEVEL: Opt<I64> = "NCCL_P2P_PXN_LEVEL", "", recognised, "PXN use for point-to-point (NCCL default 2).";
    NVB_DISABLE: Opt<I64> = "NCCL_NVB_DISABLE", "", recognised, "Disable NVLink-bridge routing (NCCL default 0).";
    MNNVL_ENABLE: Opt<I64> = "NCCL_MNNVL_ENABLE", "", recognised, "Multi-node NVLink (NCCL default 2).";
    COLLNET_ENABLE: Opt<I64> = "NCCL_COLLNET_ENABLE", "", recognised, "CollNet/SHARP.";
    NVLS_NCHANNELS: Opt<I64> = "NCCL_NVLS_NCHANNELS", "", recognised, "Channels for NVLS.";
    PAT_ENABLE: Opt<I64> = "NCCL_PAT_ENABLE", "", recognised, "PAT algorithm (NCCL default 2).";
    CHECK_MODE: Opt<Str> = "NCCL_CHECK_MODE", "", recognised, "Argument checking mode.";
    CHECK_POINTERS: Opt<I64> = "NCCL_CHECK_POINTERS", "", recognised, "Check device pointers (NCCL default 0).";
    GRAPH_MIXING_SUPPORT: Opt<I64> = "NCCL_GRAPH_MIXING_SUPPORT", "", recognised, "Mixing CUDA-graph and eager launches.";
    GRAPH_STREAM_ORDERING: Opt<I64> = "NCCL_GRAPH_STREAM_ORDERING", "", recognised, "Stream ordering under CUDA graphs.";
    RAS_ENABLE: Opt<I64> = "NCCL_RAS_ENABLE", "", recognised, "RAS subsystem (NCCL default 1).";
    RAS_ADDR: Opt<Str> = "NCCL_RAS_ADDR", "", recognised, "RAS listening address (NCCL default localhost:28028).";
    RAS_TIMEOUT_FACTOR: Opt<I64> = "NCCL_RAS_TIMEOUT_FACTOR", "", recognised, "RAS timeout factor (NCCL default 1).";
    IGNORE_CPU_AFFINITY: Opt<I64> = "NCCL_IGNORE_CPU_AFFINITY", "", recognised, "Ignore the process's CPU affinity.";
    SET_THREAD_NAME: Opt<I64> = "NCCL_SET_THREAD_NAME", "", recognised, "Name NCCL's threads.";
    UID_STAGGER_THRESHOLD: Opt<I64> = "NCCL_UID_STAGGER_THRESHOLD", "", recognised, "Ranks above which unique-id connects are staggered (NCCL default 256).";
    UID_STAGGER_RATE: Opt<I64> = "NCCL_UID_STAGGER_RATE", "", recognised, "Staggered connects per second (NCCL default 7000).";
    OOB_NET_ENABLE: Opt<I64> = "NCCL_OOB_NET_ENABLE", "", recognised, "Bootstrap over the network plugin (NCCL default 0).";
    OOB_NET_IFNAME: Opt<Str> = "NCCL_OOB_NET_IFNAME", "", recognised, "Interface for network-plugin bootstrap.";
    DMABUF_ENABLE: Opt<I64> = "NCCL_DMABUF_ENABLE", "", honoured, "0: never register GPU memory with a network plugin through DMA-BUF (regMrDmaBuf); registration by address (regMr with NCCL_PTR_CUDA) then needs the GPU's GPUDirect RDMA support. Unset: 1 (DMA-BUF where the plugin declares NCCL_PTR_DMABUF and the GPU exports DMA-BUFs).";
    MEM_SYNC_DOMAIN: Opt<I64> = "NCCL_MEM_SYNC_DOMAIN", "", recognised, "CUDA memory synchronisation domain (NCCL default 1).";
    SET_STACK_SIZE: Opt<I64> = "NCCL_SET_STACK_SIZE", "", recognised, "Set the CUDA stack size (NCCL default 0).";
    LAUNCH_ORDER_IMPLICIT: Opt<I64> = "NCCL_LAUNCH_ORDER_IMPLICIT", "", recognised, "Implicit launch ordering (NCCL default 0).";
    LAUNCH_RACE_FATAL: Opt<I64> = "NCCL_LAUNCH_RACE_FATAL", "", recognised, "Launch races are fatal (NCCL default 1).";
    IPC_USE_ABSTRACT_SOCKET: Opt<I64> = "NCCL_IPC_USE_ABSTRACT_SOCKET", "", recognised, "Abstract Unix sockets for IPC (NCCL default 1).";
    MULTI_RANK_GPU_ENABLE: Opt<I64> = "NCCL_MULTI_RANK_GPU_ENABLE", "", recognised, "Several ranks on one GPU (NCCL default 0).";
    NO_CACHE: Opt<Str> = "NCCL_NO_CACHE", "", recognised, "Parameters not to cache.";
    PARAM_DUMP_ALL: Opt<I64> = "NCCL_PARAM_DUMP_ALL", "", recognised, "Dump every parameter.";
    GIN_ERROR_QUERY_SEC: Opt<I64> = "NCCL_GIN_ERROR_QUERY_SEC", "", recognised, "GPU-initiated networking error polling period.";
}

/// Names other software sets that are not NCCL library parameters; never warned about.
const FOREIGN_NAMES: &[&str] = &[
    "NCCL_VERSION",
    "NCCL_HOME",
    "NCCL_ROOT",
    "NCCL_ROOT_DIR",
    "NCCL_LIB_DIR",
    "NCCL_INCLUDE_DIR",
    "NCCL_BLOCKING_WAIT",
    "NCCL_ASYNC_ERROR_HANDLING",
];
const FOREIGN_PREFIXES: &[&str] = &["NCCL_TESTS_", "OXCCL_TEST"];

/// The row for `name` (exact, case-sensitive, as the environment is).
pub fn lookup(name: &str) -> Option<&'static ParamInfo> {
    ALL.iter().find(|p| p.name == name)
}

/// Whether `name` is one oxccl should check: it starts with `NCCL_` or `OXCCL_` and is
/// not one of the names other software sets.
pub fn is_checked_name(name: &str) -> bool {
    (name.starts_with("NCCL_") || name.starts_with("OXCCL_"))
        && !FOREIGN_NAMES.contains(&name)
        && !FOREIGN_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The known name closest to `name`: the smallest edit distance (case-insensitive) if
/// it is at most 3, else a known name that `name` is a prefix of or that is a prefix
/// of `name`, sharing more than the `NCCL_`/`OXCCL_` part plus 3 characters.
pub fn closest(name: &str) -> Option<&'static str> {
    let head = if name.to_ascii_uppercase().starts_with("OXCCL_") {
        6
    } else {
        5
    };
    crate::suggest::nearest(name, ALL.iter().map(|p| p.name), 3, head + 3)
}

/// Where a value in effect came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Not set, or set to a malformed value: the default.
    Default,
    /// The process environment.
    Env,
    /// A configuration file, by path.
    File(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::Env => f.write_str("environment"),
            Source::File(p) => write!(f, "configuration file {p}"),
        }
    }
}

/// The loaded parameters: the text in effect for each set, valid parameter, and the
/// warnings collected while loading.
#[derive(Debug, Clone, Default)]
pub struct Params {
    values: HashMap<&'static str, (String, Source)>,
    /// Each warning with the line of this file that found the problem (the
    /// logger prints it as the WARN line's file:line).
    warnings: Vec<(String, &'static Location<'static>)>,
}

/// One configuration file's `NAME=VALUE` pairs with their line numbers; malformed
/// lines are reported through `warn`.
fn parse_conf(
    path: &str,
    text: &str,
    warn: &mut Vec<(String, &'static Location<'static>)>,
) -> Vec<(String, String, usize)> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            warn.push((
                format!("{path}:{}: ignoring line without '=': {line}", i + 1),
                Location::caller(),
            ));
            continue;
        };
        let mut value = value;
        if let Some(pos) = value
            .char_indices()
            .find(|&(j, c)| c == '#' && j > 0 && value[..j].ends_with(char::is_whitespace))
            .map(|(j, _)| j)
        {
            value = &value[..pos];
        }
        let mut value = value.trim();
        for q in ['"', '\''] {
            if value.len() >= 2 && value.starts_with(q) && value.ends_with(q) {
                value = &value[1..value.len() - 1];
                break;
            }
        }
        let name = name.trim();
        if name.is_empty() || name.contains(char::is_whitespace) {
            warn.push((
                format!("{path}:{}: ignoring line with a bad name: {line}", i + 1),
                Location::caller(),
            ));
            continue;
        }
        out.push((name.to_string(), value.to_string(), i + 1));
    }
    out
}

impl Params {
    /// Loads parameters from environment pairs and configuration files (`(path, text)`,
    /// in precedence order). The environment wins over files, an earlier file over a
    /// later one. Never fails on bad input (malformed values and unknown names become
    /// [`warnings`](Params::warnings)); the `Result` leaves room for sources that can.
    pub fn from_sources<K, V, P, T>(env: &[(K, V)], files: &[(P, T)]) -> Result<Params>
    where
        K: AsRef<str>,
        V: AsRef<str>,
        P: AsRef<str>,
        T: AsRef<str>,
    {
        let mut p = Params::default();
        let mut seen_unknown: std::collections::HashSet<String> = Default::default();
        let mut take = |p: &mut Params,
                        name: &str,
                        value: &str,
                        src: Source,
                        origin: &str|
         -> bool {
            let Some(info) = lookup(name) else {
                if is_checked_name(name) && seen_unknown.insert(name.to_string()) {
                    let hint = match closest(name) {
                        Some(c) => format!("; did you mean {c}?"),
                        None => " (ignored)".to_string(),
                    };
                    p.warnings.push((
                        format!("{name}{origin} is not a known variable{hint}"),
                        Location::caller(),
                    ));
                }
                return false;
            };
            if p.values.contains_key(info.name) {
                return false; // a higher-precedence source set it
            }
            let value = value.trim();
            if value.is_empty() {
                return false;
            }
            match info.check(value) {
                Ok(()) => {
                    p.values.insert(info.name, (value.to_string(), src));
                    true
                }
                Err(expected) => {
                    let instead = if info.default.trim().is_empty() {
                        "treating it as unset (oxccl chooses)".to_string()
                    } else {
                        format!("using default {}", info.default)
                    };
                    let hint = match info.suggest(value) {
                        Some(v) => {
                            format!(" (did you mean {}={}?)", info.name, info.display_value(&v))
                        }
                        None => String::new(),
                    };
                    p.warnings.push((
                        format!(
                            "Invalid value '{}' for {}{origin}: expected {expected}{hint}; {instead}",
                            info.display_value(value),
                            info.name,
                        ),
                        Location::caller(),
                    ));
                    // Lower-precedence sources must not fill in either.
                    p.values.insert(info.name, (String::new(), Source::Default));
                    true
                }
            }
        };
        for (k, v) in env {
            take(&mut p, k.as_ref(), v.as_ref(), Source::Env, "");
        }
        for (path, text) in files {
            let path = path.as_ref();
            let mut file_warnings = Vec::new();
            for (name, value, line) in parse_conf(path, text.as_ref(), &mut file_warnings) {
                let origin = format!(" (in {path} line {line})");
                take(
                    &mut p,
                    &name,
                    &value,
                    Source::File(path.to_string()),
                    &origin,
                );
            }
            p.warnings.extend(file_warnings);
        }
        // Malformed values were recorded as empty defaults; drop them.
        p.values.retain(|_, (_, src)| *src != Source::Default);
        Ok(p)
    }

    /// Loads from environment-style pairs only (handy in tests).
    pub fn from_pairs<K: AsRef<str>, V: AsRef<str>>(env: &[(K, V)]) -> Params {
        let no_files: &[(&str, &str)] = &[];
        Params::from_sources(env, no_files).unwrap_or_default()
    }

    /// The value in effect for `param`.
    pub fn get<K: ParamKind>(&self, param: &Param<K>) -> K::Value {
        match self.values.get(param.name) {
            Some((text, _)) => K::parse(text).unwrap_or_else(|_| param.default_value()),
            None => param.default_value(),
        }
    }

    /// Where the value in effect for `param` came from.
    pub fn source<K: ParamKind>(&self, param: &Param<K>) -> Source {
        self.source_of(param.name)
    }

    /// [`Params::source`] by name (`Default` for unknown names).
    pub fn source_of(&self, name: &str) -> Source {
        self.values
            .get(name)
            .map_or(Source::Default, |(_, s)| s.clone())
    }

    /// The text in effect for a parameter that was set (validly), by name.
    pub fn raw(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(|(t, _)| t.as_str())
    }

    /// The parameters set by the environment or a file, in table order, with their text
    /// and source (secrets included: use [`ParamInfo::display_value`] before printing).
    pub fn explicit(&self) -> Vec<(&'static ParamInfo, &str, &Source)> {
        ALL.iter()
            .filter_map(|info| {
                self.values
                    .get(info.name)
                    .map(|(t, s)| (info, t.as_str(), s))
            })
            .collect()
    }

    /// Unknown names (with a suggestion where one is close), malformed values (with the
    /// expected form and the default used instead) and bad configuration-file lines.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.iter().map(|(w, _)| w.clone()).collect()
    }

    /// [`Params::warnings`], each with the line of this file that found it.
    pub fn located_warnings(&self) -> Vec<(String, &'static Location<'static>)> {
        self.warnings.clone()
    }
}

/// `docs/env.md`: the table of every parameter, generated from [`ALL`].
pub fn markdown_table() -> String {
    let esc = |s: &str| s.replace('|', "\\|");
    let mut out = String::new();
    out.push_str("# Environment variables\n\n");
    out.push_str(
        "<!-- Generated from crates/oxccl-core/src/params.rs by \
         `OXCCL_BLESS=1 cargo test -p oxccl-env --test env_doc`; do not edit by hand. -->\n\n",
    );
    out.push_str(
        "oxccl reads these from the environment and from configuration files \
         (`NCCL_CONF_FILE` if set, else `~/.nccl.conf` then `/etc/nccl.conf`; lines `NAME=VALUE`, \
         `#` comments). The environment wins over files; an earlier file wins over a later one. \
         A malformed value is not fatal: the default is used and a warning says so. \
         Unknown `NCCL_*`/`OXCCL_*` names are reported with the closest known name. \
         [compatibility.md](compatibility.md) lists every variable NCCL's guide documents \
         with what oxccl does with it.\n\n",
    );
    for (title, honoured) in [
        ("Honoured", true),
        (
            "Recognised, not used yet (NCCL variables; setting them raises no warning)",
            false,
        ),
    ] {
        out.push_str(&format!("## {title}\n\n"));
        out.push_str("| name | type | default | honoured | description |\n");
        out.push_str("| --- | --- | --- | --- | --- |\n");
        for p in ALL.iter().filter(|p| p.honoured == honoured && !p.internal) {
            let default = if p.default.is_empty() {
                "unset".to_string()
            } else {
                format!("`{}`", esc(p.default))
            };
            out.push_str(&format!(
                "| `{}` | {} | {} | {} | {} |\n",
                p.name,
                esc(&p.kind.to_string()),
                default,
                if p.honoured { "yes" } else { "no" },
                esc(p.description)
            ));
        }
        out.push('\n');
    }
    out
}

impl LogConfig {
    /// Reads the `NCCL_DEBUG*` parameters.
    pub fn from_params(p: &Params) -> LogConfig {
        LogConfig {
            level: p.get(&DEBUG),
            subsys: p.get(&DEBUG_SUBSYS),
            timestamp_format: p.get(&DEBUG_TIMESTAMP_FORMAT).replace('_', " "),
            timestamp_levels: p.get(&DEBUG_TIMESTAMP_LEVELS),
            file: p.get(&DEBUG_FILE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::CollKind;
    use std::time::Duration;

    #[test]
    fn every_default_parses_as_its_own_kind() {
        for p in ALL {
            assert!(
                p.check(p.default).is_ok(),
                "default '{}' of {} does not parse as {}",
                p.default,
                p.name,
                p.kind
            );
            assert!(p.name.starts_with("NCCL_") || p.name.starts_with("OXCCL_"));
            assert!(!p.description.is_empty(), "{}", p.name);
            assert!(!p.kind.optional || p.default.is_empty(), "{}", p.name);
        }
        let d = Params::default();
        assert_eq!(d.get(&DEBUG), Level::None);
        assert_eq!(
            d.get(&DEBUG_SUBSYS),
            Subsys::INIT | Subsys::BOOTSTRAP | Subsys::ENV
        );
        assert_eq!(d.get(&DEBUG_TIMESTAMP_FORMAT), "[%F %T] ");
        assert_eq!(d.get(&DEBUG_TIMESTAMP_LEVELS), LevelSet::of(Level::Warn));
        assert_eq!(d.get(&BUFFSIZE), 4 << 20);
        assert!(!d.get(&SHM_DISABLE));
        assert!(!d.get(&P2P_DISABLE));
        assert_eq!(d.get(&MAX_NCHANNELS), None);
        assert_eq!(d.get(&COMM_BLOCKING), None);
        assert_eq!(d.get(&ALGO), None);
        assert_eq!(d.get(&TIMEOUT_MS), Duration::from_secs(600));
        assert_eq!(d.get(&INIT_TIMEOUT_MS), Duration::from_secs(120));
        assert_eq!(d.get(&LINK_TIMEOUT_MS), None);
        assert_eq!(d.get(&SPIN_US), 2000);
        assert_eq!(d.get(&AUTH_SECRET), None);
        assert_eq!(d.source(&BUFFSIZE), Source::Default);
        assert!(d.warnings().is_empty());
    }

    #[test]
    fn names_are_unique_and_honoured_set_is_complete() {
        let mut names: Vec<&str> = ALL.iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len());
        let honoured: Vec<&str> = ALL.iter().filter(|p| p.honoured).map(|p| p.name).collect();
        assert_eq!(honoured.len(), 65);
        assert!(ALL.iter().all(|p| !(p.honoured && p.internal)));
        assert!(ALL.len() > 80);
    }

    #[test]
    fn typed_values() {
        let p = Params::from_pairs(&[
            ("NCCL_SHM_DISABLE", "Yes"),
            ("NCCL_P2P_DISABLE", "0"),
            ("NCCL_BUFFSIZE", "512K"),
            ("NCCL_MAX_NCHANNELS", "0x10"),
            ("NCCL_COMM_BLOCKING", "false"),
            ("NCCL_SOCKET_IFNAME", " eth0,ib "),
            ("NCCL_SOCKET_FAMILY", "af_inet6"),
            ("NCCL_DEBUG", "info"),
            ("NCCL_DEBUG_SUBSYS", "^INIT"),
            ("NCCL_ALGO", "allreduce:tree;broadcast:ring"),
            ("NCCL_PROTO", "^LL128"),
            ("OXCCL_TIMEOUT_MS", "1500"),
            ("NCCL_IB_TIMEOUT", "-1"),
            ("NCCL_MIN_NCHANNELS", ""),
        ]);
        assert!(p.warnings().is_empty(), "{:?}", p.warnings());
        assert!(p.get(&SHM_DISABLE));
        assert!(!p.get(&P2P_DISABLE));
        assert_eq!(p.get(&BUFFSIZE), 512 * 1024);
        assert_eq!(p.get(&MAX_NCHANNELS), Some(16));
        assert_eq!(p.get(&MIN_NCHANNELS), None);
        assert_eq!(p.source(&MIN_NCHANNELS), Source::Default);
        assert_eq!(p.get(&COMM_BLOCKING), Some(false));
        assert_eq!(p.get(&SOCKET_IFNAME).as_deref(), Some("eth0,ib"));
        assert_eq!(p.get(&SOCKET_FAMILY), Some(SocketFamily::Inet6));
        assert_eq!(p.get(&DEBUG), Level::Info);
        assert!(!p.get(&DEBUG_SUBSYS).intersects(Subsys::INIT));
        let algo = p.get(&ALGO).unwrap();
        assert!(algo.allows(CollKind::AllReduce, Algo::Tree));
        assert!(!algo.allows(CollKind::AllReduce, Algo::Ring));
        let proto = p.get(&PROTO).unwrap();
        assert_eq!(
            proto.allowed(CollKind::AllReduce),
            vec![Proto::LL, Proto::Simple]
        );
        assert_eq!(p.get(&TIMEOUT_MS), Duration::from_millis(1500));
        assert_eq!(p.get(&IB_TIMEOUT), Some(-1));
        assert_eq!(p.raw("NCCL_BUFFSIZE"), Some("512K"));
        assert_eq!(p.explicit().len(), 13);
    }

    #[test]
    fn sizes_and_ints() {
        assert_eq!(Size::parse("4194304"), Ok(4194304));
        assert_eq!(Size::parse("4M"), Ok(4 << 20));
        assert_eq!(Size::parse("4m"), Ok(4 << 20));
        assert_eq!(Size::parse("1G"), Ok(1 << 30));
        assert_eq!(Size::parse("2KiB"), Ok(2048));
        assert_eq!(Size::parse("3kb"), Ok(3072));
        assert_eq!(Size::parse("0x100"), Ok(256));
        assert_eq!(Size::parse("1T"), Ok(1 << 40));
        assert!(Size::parse("4X").is_err());
        assert!(Size::parse("M").is_err());
        assert!(Size::parse("-1").is_err());
        assert!(Size::parse("99999999999999999999").is_err());
        assert!(Size::parse("20000000000G").is_err());
        assert_eq!(I64::parse("-2"), Ok(-2));
        assert_eq!(I64::parse("-0x10"), Ok(-16));
        assert_eq!(I64::parse("-9223372036854775808"), Ok(i64::MIN));
        assert!(I64::parse("9223372036854775808").is_err());
        assert!(U32::parse("4294967296").is_err());
        assert!(U64::parse("1.5").is_err());
        for (s, v) in [("TRUE", true), ("no", false), ("1", true), ("Off", false)] {
            assert_eq!(Bool::parse(s), Ok(v));
        }
        assert!(Bool::parse("2").is_err());
    }

    #[test]
    fn env_beats_file_and_earlier_file_beats_later() {
        let env = vec![("NCCL_BUFFSIZE".to_string(), "1M".to_string())];
        let files = [
            (
                "/home/u/.nccl.conf",
                "# mine\nNCCL_BUFFSIZE=2M\n  NCCL_SOCKET_IFNAME = eth1  \n\n",
            ),
            (
                "/etc/nccl.conf",
                "NCCL_SOCKET_IFNAME=eth9\nNCCL_SHM_DISABLE=1 # site policy\nOXCCL_SPIN_US=\"7\"\n",
            ),
        ];
        let p = Params::from_sources(&env, &files).unwrap();
        assert!(p.warnings().is_empty(), "{:?}", p.warnings());
        assert_eq!(p.get(&BUFFSIZE), 1 << 20);
        assert_eq!(p.source(&BUFFSIZE), Source::Env);
        assert_eq!(p.get(&SOCKET_IFNAME).as_deref(), Some("eth1"));
        assert_eq!(
            p.source(&SOCKET_IFNAME),
            Source::File("/home/u/.nccl.conf".into())
        );
        assert!(p.get(&SHM_DISABLE));
        assert_eq!(
            p.source(&SHM_DISABLE),
            Source::File("/etc/nccl.conf".into())
        );
        assert_eq!(p.get(&SPIN_US), 7);
        assert_eq!(p.source(&TIMEOUT_MS), Source::Default);
    }

    #[test]
    fn buffsize_outside_its_range_is_refused_with_a_warning() {
        for (v, want) in [("4K", 4096), ("1G", 1 << 30), ("512K", 512 << 10)] {
            let p = Params::from_sources(&[("NCCL_BUFFSIZE", v)], &[] as &[(&str, &str)]).unwrap();
            assert_eq!(p.get(&BUFFSIZE), want, "{v}");
            assert!(p.warnings().is_empty(), "{v}: {:?}", p.warnings());
        }
        for v in ["64G", "1025M", "4095", "0"] {
            let p = Params::from_sources(&[("NCCL_BUFFSIZE", v)], &[] as &[(&str, &str)]).unwrap();
            assert_eq!(p.get(&BUFFSIZE), 4 << 20, "{v}");
            assert_eq!(p.source(&BUFFSIZE), Source::Default);
            let w = p.warnings();
            assert_eq!(w.len(), 1, "{v}: {w:?}");
            assert!(
                w[0].starts_with(&format!(
                    "Invalid value '{v}' for NCCL_BUFFSIZE: expected a byte count from 4K to 1G"
                )) && w[0].ends_with("using default 4M"),
                "{w:?}"
            );
        }
    }

    #[test]
    fn timeout_of_zero_means_no_timeout() {
        let env = [
            ("OXCCL_TIMEOUT_MS", "0"),
            ("OXCCL_INIT_TIMEOUT_MS", "0"),
            ("OXCCL_LINK_TIMEOUT_MS", "0"),
        ];
        let p = Params::from_sources(&env, &[] as &[(&str, &str)]).unwrap();
        assert!(p.warnings().is_empty(), "{:?}", p.warnings());
        assert_eq!(p.get(&TIMEOUT_MS), NO_TIMEOUT);
        assert_eq!(p.get(&INIT_TIMEOUT_MS), NO_TIMEOUT);
        assert_eq!(p.get(&LINK_TIMEOUT_MS), Some(NO_TIMEOUT));
        // A deadline that far ahead is still an Instant (no overflow panic).
        assert!(std::time::Instant::now().checked_add(NO_TIMEOUT).is_some());
        assert_eq!(timeout_from_ms(1), Duration::from_millis(1));
        assert_eq!(timeout_from_ms(u64::MAX), NO_TIMEOUT);
        let p = Params::from_sources(&[("OXCCL_LINK_TIMEOUT_MS", "8000")], &[] as &[(&str, &str)])
            .unwrap();
        assert_eq!(p.get(&LINK_TIMEOUT_MS), Some(Duration::from_secs(8)));
        let p =
            Params::from_sources(&[("OXCCL_TIMEOUT_MS", "-1")], &[] as &[(&str, &str)]).unwrap();
        assert_eq!(p.get(&TIMEOUT_MS), Duration::from_secs(600));
        assert_eq!(p.warnings().len(), 1);
    }

    #[test]
    fn malformed_value_uses_default_and_warns() {
        let files = [(
            "/etc/nccl.conf",
            "NCCL_BUFFSIZE=8M\nNCCL_SHM_DISABLE=maybe\nnonsense\n",
        )];
        let env = [("NCCL_BUFFSIZE", "lots"), ("NCCL_SOCKET_FAMILY", "AF_UNIX")];
        let p = Params::from_sources(&env, &files).unwrap();
        // The malformed environment value wins over the file (NCCL's rule) and falls back
        // to the default.
        assert_eq!(p.get(&BUFFSIZE), 4 << 20);
        assert_eq!(p.source(&BUFFSIZE), Source::Default);
        assert!(!p.get(&SHM_DISABLE));
        assert_eq!(p.get(&SOCKET_FAMILY), None);
        let w = p.warnings();
        assert_eq!(w.len(), 4, "{w:?}");
        assert_eq!(
            w[0],
            "Invalid value 'lots' for NCCL_BUFFSIZE: expected a byte count such as 4194304, \
             512K, 4M or 1G; using default 4M"
        );
        assert_eq!(
            w[1],
            "Invalid value 'AF_UNIX' for NCCL_SOCKET_FAMILY: expected AF_INET or AF_INET6 \
             (did you mean NCCL_SOCKET_FAMILY=AF_INET?); treating it as unset (oxccl chooses)"
        );
        assert_eq!(
            w[2],
            "Invalid value 'maybe' for NCCL_SHM_DISABLE (in /etc/nccl.conf line 2): expected \
             0/1, true/false or yes/no; using default 0"
        );
        assert_eq!(
            w[3],
            "/etc/nccl.conf:3: ignoring line without '=': nonsense"
        );
    }

    #[test]
    fn internal_variables_raise_no_warning() {
        // What `oxccl perf`'s launcher sets for its children, and the test knob.
        let env = [
            ("OXCCL_PERF_RANK", "1"),
            ("OXCCL_PERF_ID", "ab12"),
            ("OXCCL_PERF_PARENT", "4242"),
            ("OXCCL_PERF_COMPARE_ID", "cd34"),
            ("OXCCL_PERF_TEST_ABORT_RANK", "1"),
            ("OXCCL_WAIT_NOTICE_MS", "200"),
        ];
        let p = Params::from_pairs(&env);
        assert!(p.warnings().is_empty(), "{:?}", p.warnings());
        assert_eq!(p.get(&WAIT_NOTICE_MS), Some(200));
        for (name, _) in env {
            let info = lookup(name).unwrap();
            assert!(info.internal && !info.honoured, "{name}");
        }
        // A typo of one is still caught.
        let p = Params::from_pairs(&[("OXCCL_PERF_RNAK", "1")]);
        assert_eq!(
            p.warnings(),
            ["OXCCL_PERF_RNAK is not a known variable; did you mean OXCCL_PERF_RANK?"]
        );
    }

    /// Each enumerated grammar's wrong value names the nearest valid value and
    /// lists the accepted ones.
    #[test]
    fn wrong_enumerated_values_get_the_nearest_valid_one() {
        let cases: [(&str, &str, &str, &str); 9] = [
            ("NCCL_ALGO", "rign", "Ring", "Tree, Ring, CollnetDirect"),
            ("NCCL_ALGO", "allreduce:tre", "allreduce:Tree", "Tree, Ring"),
            ("NCCL_PROTO", "simpel", "Simple", "LL, LL128, Simple"),
            (
                "NCCL_DEBUG",
                "INOF",
                "INFO",
                "VERSION, WARN, INFO, ABORT, TRACE",
            ),
            (
                "NCCL_DEBUG",
                "warning",
                "WARN",
                "VERSION, WARN, INFO, ABORT, TRACE",
            ),
            (
                "NCCL_DEBUG_SUBSYS",
                "INIT,NETT",
                "INIT,NET",
                "INIT, COLL, P2P",
            ),
            (
                "NCCL_DEBUG_TIMESTAMP_LEVELS",
                "WRAN",
                "WARN",
                "VERSION, WARN",
            ),
            (
                "NCCL_SOCKET_FAMILY",
                "AF_INT6",
                "AF_INET6",
                "AF_INET or AF_INET6",
            ),
            (
                "NCCL_SHM_DISABLE",
                "ture",
                "true",
                "0/1, true/false or yes/no",
            ),
        ];
        for (name, bad, good, listed) in cases {
            let info = lookup(name).unwrap();
            assert_eq!(info.suggest(bad).as_deref(), Some(good), "{name}={bad}");
            assert!(info.check(good).is_ok(), "{name}={good}");
            let w = Params::from_pairs(&[(name, bad)]).warnings();
            assert_eq!(w.len(), 1, "{w:?}");
            assert!(
                w[0].contains(&format!("(did you mean {name}={good}?)")),
                "{name}: {}",
                w[0]
            );
            assert!(w[0].contains(listed), "{name}: {}", w[0]);
        }
        assert_eq!(
            Params::from_pairs(&[("NCCL_ALGO", "rign")]).warnings(),
            [
                "Invalid value 'rign' for NCCL_ALGO: expected algorithm names (Tree, Ring, \
              CollnetDirect, CollnetChain, NVLS, NVLSTree, PAT, OneShot, TwoShot), not 'rign' \
              (did you mean NCCL_ALGO=Ring?); treating it as unset (oxccl chooses)"
            ]
        );
        // Nothing near: no suggestion, the list alone.
        assert_eq!(lookup("NCCL_ALGO").unwrap().suggest("mesh"), None);
        assert_eq!(lookup("NCCL_DEBUG").unwrap().suggest("INFO"), None);
        assert_eq!(lookup("NCCL_BUFFSIZE").unwrap().suggest("lots"), None);
    }

    #[test]
    fn warnings_carry_the_line_that_found_them() {
        let p = Params::from_pairs(&[("NCCL_DEBG", "INFO"), ("NCCL_DEBUG", "loud")]);
        let w = p.located_warnings();
        assert_eq!(w.len(), 2);
        for (_, at) in &w {
            assert!(at.file().ends_with("params.rs"), "{at}");
        }
        assert_ne!(w[0].1.line(), w[1].1.line());
    }

    #[test]
    fn secrets_are_not_echoed_in_warnings() {
        let p = Params::from_pairs(&[("OXCCL_AUTH_SECRET", "hunter2")]);
        assert_eq!(p.get(&AUTH_SECRET).as_deref(), Some("hunter2"));
        let info = lookup("OXCCL_AUTH_SECRET").unwrap();
        assert_eq!(info.display_value("hunter2"), "<redacted>");
        assert!(info.kind.secret);
    }

    #[test]
    fn unknown_names() {
        let env = [
            ("NCCL_SOCKET_IFNAM", "eth0"),
            ("NCCL_COMPLETELY_UNRELATED_THING", "1"),
            ("NCCL_DEBG", "INFO"),
            ("OXCCL_TIMEOUT", "5"),
            ("NCCL_VERSION", "2.21.5"),
            ("NCCL_TESTS_SPLIT_MASK", "1"),
            ("NCCL_IB_HCA", "mlx5"),
            ("PATH", "/usr/bin"),
            ("nccl_debug", "INFO"),
        ];
        let p = Params::from_sources(&env, &[("/etc/nccl.conf", "NCCL_SHM_DISABEL=1\n")]).unwrap();
        let w = p.warnings();
        assert_eq!(
            w,
            vec![
                "NCCL_SOCKET_IFNAM is not a known variable; did you mean NCCL_SOCKET_IFNAME?"
                    .to_string(),
                "NCCL_COMPLETELY_UNRELATED_THING is not a known variable (ignored)".to_string(),
                "NCCL_DEBG is not a known variable; did you mean NCCL_DEBUG?".to_string(),
                "OXCCL_TIMEOUT is not a known variable; did you mean OXCCL_TIMEOUT_MS?".to_string(),
                "NCCL_SHM_DISABEL (in /etc/nccl.conf line 1) is not a known variable; did you mean \
                 NCCL_SHM_DISABLE?"
                    .to_string(),
            ]
        );
        assert_eq!(p.get(&SOCKET_IFNAME), None);
        // Prefix matches beyond distance 3.
        assert_eq!(
            closest("NCCL_DEBUG_TIMESTAMP"),
            Some("NCCL_DEBUG_TIMESTAMP_FORMAT")
        );
        assert_eq!(
            closest("NCCL_SOCKET_IFNAME_LIST"),
            Some("NCCL_SOCKET_IFNAME")
        );
        assert_eq!(closest("NCCL_ZZZZZZZZZZZZZ"), None);
        assert_eq!(closest("nccl_buffsize"), Some("NCCL_BUFFSIZE"));
    }

    #[test]
    fn conf_grammar() {
        let mut w = Vec::new();
        let pairs = parse_conf(
            "f",
            "  # comment\n\nA=1\n B = two words \nC=x#y\nD=v # note\nE='q'\nF=\n=3\n",
            &mut w,
        );
        let got: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(n, v, _)| (n.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("A", "1"),
                ("B", "two words"),
                ("C", "x#y"),
                ("D", "v"),
                ("E", "q"),
                ("F", "")
            ]
        );
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].0, "f:9: ignoring line with a bad name: =3");
    }

    #[test]
    fn cross_nic_takes_nccl_values() {
        use crate::topo::CrossNic;
        assert_eq!(
            Params::from_pairs::<&str, &str>(&[]).get(&CROSS_NIC),
            CrossNic::PreferAligned
        );
        for (v, want) in [
            ("0", CrossNic::Aligned),
            ("1", CrossNic::Allowed),
            (" 2 ", CrossNic::PreferAligned),
        ] {
            let p = Params::from_pairs(&[("NCCL_CROSS_NIC", v)]);
            assert!(p.warnings().is_empty(), "{:?}", p.warnings());
            assert_eq!(p.get(&CROSS_NIC), want, "{v}");
            assert_eq!(want.value().to_string(), v.trim());
        }
        // Anything else: a warning naming the form, and the default.
        let p = Params::from_pairs(&[("NCCL_CROSS_NIC", "3")]);
        assert_eq!(p.get(&CROSS_NIC), CrossNic::PreferAligned);
        let w = p.warnings().join("\n");
        assert!(
            w.contains("NCCL_CROSS_NIC") && w.contains("0, 1 or 2"),
            "{w}"
        );
    }

    #[test]
    fn markdown_lists_every_parameter_but_the_internal_ones() {
        let md = markdown_table();
        for p in ALL {
            let row = format!("| `{}` |", p.name);
            assert_eq!(md.contains(&row), !p.internal, "{}", p.name);
        }
        assert!(!md.contains("OXCCL_PERF_"));
        assert!(md.contains("| `NCCL_BUFFSIZE` | size | `4M` | yes |"));
    }
}
