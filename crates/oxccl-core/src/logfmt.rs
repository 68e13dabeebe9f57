//! `NCCL_DEBUG` log lines, shaped exactly like NCCL's so that grep habits and log
//! parsers keep working (the prefix says `NCCL`, not `oxccl`).
//!
//! Pure: the logger in `oxccl-env` supplies host, pid, tid, device, clock and sink;
//! this module decides what is printed and how.
//!
//! Line shapes (`ts` is the timestamp, empty unless the level is in
//! `NCCL_DEBUG_TIMESTAMP_LEVELS`, which by default holds WARN only):
//!
//! ```text
//! VERSION  {ts}{msg}
//! WARN     \n{ts}{host}:{pid}:{tid} [{dev}] {file}:{line} NCCL WARN {msg}
//! INFO     {ts}{host}:{pid}:{tid} [{dev}] NCCL INFO {msg}
//! ABORT    {ts}{host}:{pid}:{tid} [{dev}] NCCL ABORT {msg}
//! TRACE    {ts}{host}:{pid}:{tid} [{dev}] {ms:.6} {file}:{line} NCCL TRACE {msg}
//! CALL     {ts}{host}:{pid}:{tid} NCCL CALL {msg}          (TRACE with subsystem CALL)
//! ```
//!
//! Timestamps are formatted from a UNIX time by [`strftime`], a small formatter of our
//! own; they are UTC (NCCL uses local time; the core has no access to time zones).

use std::fmt;
use std::ops::{BitOr, BitOrAssign};

/// Log level, in NCCL's order: a line is printed when its level is at most `NCCL_DEBUG`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Level {
    None,
    Version,
    Warn,
    Info,
    Abort,
    Trace,
}

impl Level {
    /// Every level, in order.
    pub const ALL: [Level; 6] = [
        Level::None,
        Level::Version,
        Level::Warn,
        Level::Info,
        Level::Abort,
        Level::Trace,
    ];

    /// NCCL's name ("INFO").
    pub fn name(self) -> &'static str {
        match self {
            Level::None => "NONE",
            Level::Version => "VERSION",
            Level::Warn => "WARN",
            Level::Info => "INFO",
            Level::Abort => "ABORT",
            Level::Trace => "TRACE",
        }
    }

    /// The level name nearest to `s` when `s` is none (`INOF` → `INFO`).
    pub fn nearest(s: &str) -> Option<Level> {
        if Level::parse(s).is_some() {
            return None;
        }
        let n = crate::suggest::nearest_value(s.trim(), Level::ALL.iter().map(|l| l.name()))?;
        Level::parse(n)
    }

    /// Parses a level name, case-insensitively. `NONE` is accepted (it is also what an
    /// unset `NCCL_DEBUG` means).
    pub fn parse(s: &str) -> Option<Level> {
        let s = s.trim();
        Level::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A subsystem mask (`NCCL_DEBUG_SUBSYS`). A line is printed when its mask shares a bit
/// with the configured one; WARN lines use [`Subsys::ALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    pub const ALLOC_HOST: Subsys = Subsys(1 << 14);
    pub const PROFILE: Subsys = Subsys(1 << 15);
    pub const RAS: Subsys = Subsys(1 << 16);
    pub const DESTROY: Subsys = Subsys(1 << 17);
    pub const ALL: Subsys = Subsys(u32::MAX);
    /// No subsystem.
    pub const NONE: Subsys = Subsys(0);

    /// The named subsystems, with NCCL's names.
    pub const NAMED: [(&'static str, Subsys); 18] = [
        ("INIT", Subsys::INIT),
        ("COLL", Subsys::COLL),
        ("P2P", Subsys::P2P),
        ("SHM", Subsys::SHM),
        ("NET", Subsys::NET),
        ("GRAPH", Subsys::GRAPH),
        ("TUNING", Subsys::TUNING),
        ("ENV", Subsys::ENV),
        ("ALLOC", Subsys::ALLOC),
        ("CALL", Subsys::CALL),
        ("PROXY", Subsys::PROXY),
        ("NVLS", Subsys::NVLS),
        ("BOOTSTRAP", Subsys::BOOTSTRAP),
        ("REG", Subsys::REG),
        ("ALLOC_HOST", Subsys::ALLOC_HOST),
        ("PROFILE", Subsys::PROFILE),
        ("RAS", Subsys::RAS),
        ("DESTROY", Subsys::DESTROY),
    ];

    /// The names `NCCL_DEBUG_SUBSYS` takes: every named subsystem, then `ALL`.
    pub fn names() -> Vec<&'static str> {
        let mut v: Vec<&str> = Subsys::NAMED.iter().map(|(n, _)| *n).collect();
        v.push("ALL");
        v
    }

    /// `s` with every unknown subsystem replaced by the nearest name (`INIT,NETT`
    /// → `INIT,NET`); `None` when nothing needed replacing or nothing is near.
    pub fn corrected(s: &str) -> Option<String> {
        crate::suggest::corrected_list(s, &Subsys::names(), |x| {
            Subsys::names().iter().any(|n| n.eq_ignore_ascii_case(x))
        })
    }

    /// Whether the masks share a bit.
    pub fn intersects(self, other: Subsys) -> bool {
        self.0 & other.0 != 0
    }

    /// Parses `NCCL_DEBUG_SUBSYS`: a comma list of names (case-insensitive, `ALL`
    /// included); a leading `^` means every subsystem except those listed. Errors say
    /// what was expected and name the unknown token ([`Subsys::corrected`] has the
    /// nearest names).
    pub fn parse_list(s: &str) -> Result<Subsys, String> {
        let s = s.trim();
        let (invert, list) = match s.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let mut mask = 0u32;
        for item in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if item.eq_ignore_ascii_case("ALL") {
                mask = u32::MAX;
                continue;
            }
            match Subsys::NAMED
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(item))
            {
                Some((_, b)) => mask |= b.0,
                None => {
                    return Err(format!(
                        "subsystem names ({}; '^' first inverts), not '{item}'",
                        Subsys::names().join(", ")
                    ));
                }
            }
        }
        Ok(Subsys(if invert { !mask } else { mask }))
    }
}

impl BitOr for Subsys {
    type Output = Subsys;
    fn bitor(self, rhs: Subsys) -> Subsys {
        Subsys(self.0 | rhs.0)
    }
}

impl BitOrAssign for Subsys {
    fn bitor_assign(&mut self, rhs: Subsys) {
        self.0 |= rhs.0;
    }
}

/// A set of levels (`NCCL_DEBUG_TIMESTAMP_LEVELS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LevelSet(pub u8);

impl LevelSet {
    /// Whether `l` is in the set.
    pub fn contains(self, l: Level) -> bool {
        self.0 & (1 << l as u8) != 0
    }

    /// The set holding `l` only.
    pub fn of(l: Level) -> LevelSet {
        LevelSet(1 << l as u8)
    }

    /// The names a level list takes: the levels above NONE, then `ALL`.
    pub fn names() -> Vec<&'static str> {
        let mut v: Vec<&str> = Level::ALL[1..].iter().map(|l| l.name()).collect();
        v.push("ALL");
        v
    }

    /// `s` with every unknown level replaced by the nearest name; `None` when
    /// nothing needed replacing or nothing is near.
    pub fn corrected(s: &str) -> Option<String> {
        crate::suggest::corrected_list(s, &LevelSet::names(), |x| {
            x.eq_ignore_ascii_case("ALL") || Level::parse(x).is_some()
        })
    }

    /// Parses a comma list of level names (`ALL` included; leading `^` inverts).
    pub fn parse_list(s: &str) -> Result<LevelSet, String> {
        let s = s.trim();
        let (invert, list) = match s.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let all = (1u8 << Level::ALL.len()) - 1;
        let mut set = 0u8;
        for item in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if item.eq_ignore_ascii_case("ALL") {
                set = all;
            } else {
                let l = Level::parse(item).ok_or_else(|| {
                    format!(
                        "level names ({}; '^' first inverts), not '{item}'",
                        LevelSet::names().join(", ")
                    )
                })?;
                set |= 1 << l as u8;
            }
        }
        Ok(LevelSet(if invert { all & !set } else { set }))
    }
}

/// Who is logging: the fields of the line prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineCtx<'a> {
    /// Short host name (see [`short_hostname`]).
    pub host: &'a str,
    pub pid: u32,
    pub tid: u64,
    /// NCCL prints the CUDA device; host ranks print the rank's local index.
    pub dev: i32,
}

/// One message to format.
#[derive(Debug, Clone, PartialEq)]
pub struct Record<'a> {
    pub level: Level,
    pub subsys: Subsys,
    /// Source file as given by `file!()`; shortened by [`short_file`].
    pub file: &'a str,
    pub line: u32,
    /// Milliseconds since the logger started (TRACE lines).
    pub elapsed_ms: f64,
    pub msg: &'a str,
}

/// The complete line for `rec`, including the trailing newline (and, for WARN, the
/// leading one). `timestamp` is put first (after WARN's leading newline); pass "" when
/// the level is not timestamped.
pub fn format_line(ctx: &LineCtx<'_>, rec: &Record<'_>, timestamp: &str) -> String {
    let LineCtx {
        host,
        pid,
        tid,
        dev,
    } = ctx;
    let file = short_file(rec.file);
    let (line, msg) = (rec.line, rec.msg);
    match rec.level {
        Level::None | Level::Version => format!("{timestamp}{msg}\n"),
        Level::Warn => {
            format!("\n{timestamp}{host}:{pid}:{tid} [{dev}] {file}:{line} NCCL WARN {msg}\n")
        }
        Level::Info => format!("{timestamp}{host}:{pid}:{tid} [{dev}] NCCL INFO {msg}\n"),
        Level::Abort => format!("{timestamp}{host}:{pid}:{tid} [{dev}] NCCL ABORT {msg}\n"),
        Level::Trace if rec.subsys == Subsys::CALL => {
            format!("{timestamp}{host}:{pid}:{tid} NCCL CALL {msg}\n")
        }
        Level::Trace => format!(
            "{timestamp}{host}:{pid}:{tid} [{dev}] {:.6} {file}:{line} NCCL TRACE {msg}\n",
            rec.elapsed_ms
        ),
    }
}

/// `file!()` without the workspace's `crates/` prefix: `oxccl-host/src/tcp.rs`.
pub fn short_file(file: &str) -> &str {
    file.strip_prefix("crates/").unwrap_or(file)
}

/// The host name as NCCL prints it: the first label, with `%` and `/` replaced by `-`.
pub fn short_hostname(raw: &str) -> String {
    let first = raw.trim().split('.').next().unwrap_or("");
    first
        .chars()
        .map(|c| if c == '%' || c == '/' { '-' } else { c })
        .collect()
}

/// `NCCL_DEBUG_FILE`'s name: `%h` becomes the host, `%p` the pid; any other `%x` is kept
/// as written.
pub fn debug_file_path(pattern: &str, host: &str, pid: u32) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '%' {
            match chars.peek() {
                Some('h') => {
                    out.push_str(host);
                    chars.next();
                }
                Some('p') => {
                    out.push_str(&pid.to_string());
                    chars.next();
                }
                _ => out.push('%'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The logger's configuration (read from the parameters by
/// `LogConfig::from_params`, in [`crate::params`]: the registry knows the
/// log types, this module knows nothing of the registry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    pub level: Level,
    pub subsys: Subsys,
    /// strftime-style, `_` already turned into spaces.
    pub timestamp_format: String,
    pub timestamp_levels: LevelSet,
    /// `NCCL_DEBUG_FILE` as written (before `%h`/`%p`).
    pub file: Option<String>,
}

impl LogConfig {
    /// Whether a line of `level` for `subsys` is printed.
    pub fn enabled(&self, level: Level, subsys: Subsys) -> bool {
        level != Level::None && level <= self.level && subsys.intersects(self.subsys)
    }

    /// Whether lines of `level` carry a timestamp.
    pub fn timestamped(&self, level: Level) -> bool {
        self.timestamp_levels.contains(level) && !self.timestamp_format.is_empty()
    }

    /// The file to log to: `NCCL_DEBUG_FILE` with `%h`/`%p` substituted, only when the
    /// level is above VERSION (as NCCL does); `None` means stdout.
    pub fn file_path(&self, host: &str, pid: u32) -> Option<String> {
        match &self.file {
            Some(f) if self.level > Level::Version => Some(debug_file_path(f, host, pid)),
            _ => None,
        }
    }
}

/// Civil date (year, month 1-12, day 1-31) of a day count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // Shift the epoch to 0000-03-01 so that leap days fall at the end of a year;
    // eras are 400-year cycles of 146097 days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // day of era, 0..146096
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // year of era
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of (March-based) year
    let mp = (5 * doy + 2) / 153; // March-based month, 0..11
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// Formats a UTC time, strftime-style. Supported: `%Y %y %m %d %e %H %M %S %j %a %b %F
/// %T %D %R %s %z %Z %n %t %%`, and `%f` / `%Nf` (the fraction of the second with N
/// digits, 1-9; plain `%f` gives 6). Anything else is copied as written.
pub fn strftime(fmt: &str, unix_secs: i64, nanos: u32) -> String {
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = unix_secs.div_euclid(86_400);
    let sod = unix_secs.rem_euclid(86_400);
    let (y, mo, d) = civil_from_days(days);
    let (h, mi, s) = (sod / 3600, sod / 60 % 60, sod % 60);
    let weekday = (days + 4).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = {
        const CUM: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        CUM[(mo - 1) as usize] + d + u32::from(mo > 2 && is_leap(y))
    };
    let mut out = String::with_capacity(fmt.len() + 16);
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(spec) = chars.next() else {
            out.push('%');
            break;
        };
        match spec {
            'Y' => out.push_str(&y.to_string()),
            'y' => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            'm' => out.push_str(&format!("{mo:02}")),
            'd' => out.push_str(&format!("{d:02}")),
            'e' => out.push_str(&format!("{d:2}")),
            'H' => out.push_str(&format!("{h:02}")),
            'M' => out.push_str(&format!("{mi:02}")),
            'S' => out.push_str(&format!("{s:02}")),
            'j' => out.push_str(&format!("{yday:03}")),
            'a' => out.push_str(DAYS[weekday]),
            'b' => out.push_str(MONTHS[(mo - 1) as usize]),
            'F' => out.push_str(&format!("{y}-{mo:02}-{d:02}")),
            'T' => out.push_str(&format!("{h:02}:{mi:02}:{s:02}")),
            'D' => out.push_str(&format!("{mo:02}/{d:02}/{:02}", y.rem_euclid(100))),
            'R' => out.push_str(&format!("{h:02}:{mi:02}")),
            's' => out.push_str(&unix_secs.to_string()),
            'z' => out.push_str("+0000"),
            'Z' => out.push_str("UTC"),
            'n' => out.push('\n'),
            't' => out.push('\t'),
            '%' => out.push('%'),
            'f' => push_fraction(&mut out, nanos, 6),
            '1'..='9' if chars.peek() == Some(&'f') => {
                chars.next();
                push_fraction(&mut out, nanos, spec as usize - '0' as usize);
            }
            other => {
                out.push('%');
                out.push(other);
            }
        }
    }
    out
}

fn push_fraction(out: &mut String, nanos: u32, digits: usize) {
    let full = format!("{:09}", nanos.min(999_999_999));
    out.push_str(&full[..digits.min(9)]);
}

/// When a rank that waits for others says so: an INFO line every
/// [`WaitTicker::INFO_EVERY`] and, once, a WARN at [`WaitTicker::WARN_AFTER`]
/// (a wait that long is no start-up jitter: a peer is missing or stuck).
/// Pure: the caller passes how long it has waited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitTicker {
    every: std::time::Duration,
    warn_after: std::time::Duration,
    next_info: std::time::Duration,
    warned: bool,
}

impl WaitTicker {
    /// Why 5 s: bootstrap and connection setup take well under a second when
    /// every rank is there, so a 5 s silence already means someone is late.
    pub const INFO_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
    /// Why 10 s: twice the INFO period, a tenth of the 120 s init timeout.
    pub const WARN_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

    /// INFO every `every` (at least 1 ms), WARN once at `warn_after`.
    pub fn new(every: std::time::Duration, warn_after: std::time::Duration) -> WaitTicker {
        let every = every.max(std::time::Duration::from_millis(1));
        WaitTicker {
            every,
            warn_after,
            next_info: every,
            warned: false,
        }
    }

    /// The line to print after waiting `waited` so far: `Some(Warn)` once when
    /// `waited` reaches the WARN threshold, `Some(Info)` when it reaches the
    /// next INFO time, else `None`. A late call prints one line, not the
    /// ones it missed.
    pub fn tick(&mut self, waited: std::time::Duration) -> Option<Level> {
        let due = waited >= self.next_info;
        while self.next_info <= waited {
            self.next_info += self.every;
        }
        if !self.warned && waited >= self.warn_after {
            self.warned = true;
            return Some(Level::Warn);
        }
        due.then_some(Level::Info)
    }
}

impl Default for WaitTicker {
    fn default() -> Self {
        WaitTicker::new(WaitTicker::INFO_EVERY, WaitTicker::WARN_AFTER)
    }
}

/// NCCL's per-call TUNING line (enqueue.cc, printed by rank 0 with
/// `NCCL_DEBUG_SUBSYS=TUNING`): `{op}: {bytes} Bytes -> Algo {algo} proto
/// {proto} channel{Lo..Hi}={0..blocks-1}`, so a log of oxccl's choices lines
/// up with NCCL's own. oxccl's algorithms keep their names (Ring, OneShot,
/// Pair, CopyEngine); a channel is a block, so one SM. `blocks` 0 (the copy
/// engines alone, no SM) prints the empty range `{0..-1}`.
pub fn tuning_line(op: &str, bytes: u64, algo: &str, proto: &str, blocks: u32) -> String {
    format!(
        "{op}: {bytes} Bytes -> Algo {algo} proto {proto} channel{{Lo..Hi}}={{0..{}}}",
        blocks as i64 - 1
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuning_lines_have_nccls_shape() {
        assert_eq!(
            tuning_line("AllReduce", 1048576, "Ring", "LL", 16),
            "AllReduce: 1048576 Bytes -> Algo Ring proto LL channel{Lo..Hi}={0..15}"
        );
        assert_eq!(
            tuning_line("AllGather", 1 << 30, "CopyEngine", "Simple", 0),
            "AllGather: 1073741824 Bytes -> Algo CopyEngine proto Simple channel{Lo..Hi}={0..-1}"
        );
    }

    #[test]
    fn waiting_ticks_info_every_period_and_warns_once() {
        use std::time::Duration;
        let ms = Duration::from_millis;
        let mut t = WaitTicker::default();
        let seen: Vec<(u64, Level)> = (0..=25_000)
            .step_by(50)
            .filter_map(|m| t.tick(ms(m)).map(|l| (m / 1000, l)))
            .collect();
        assert_eq!(
            seen,
            [
                (5, Level::Info),
                (10, Level::Warn),
                (15, Level::Info),
                (20, Level::Info),
                (25, Level::Info)
            ]
        );
        // A caller that polls rarely gets one line per call, never a burst.
        let mut t = WaitTicker::new(ms(100), ms(1000));
        assert_eq!(t.tick(ms(50)), None);
        assert_eq!(t.tick(ms(950)), Some(Level::Info));
        assert_eq!(t.tick(ms(960)), None);
        assert_eq!(t.tick(ms(5000)), Some(Level::Warn));
        assert_eq!(t.tick(ms(5001)), None);
        assert_eq!(t.tick(ms(5100)), Some(Level::Info));
        // A zero period does not spin.
        let mut t = WaitTicker::new(Duration::ZERO, ms(2));
        assert_eq!(t.tick(ms(1)), Some(Level::Info));
        assert_eq!(t.tick(ms(2)), Some(Level::Warn));
    }

    fn ctx() -> LineCtx<'static> {
        LineCtx {
            host: "node-01",
            pid: 1895902,
            tid: 1895913,
            dev: 3,
        }
    }

    fn rec(level: Level, subsys: Subsys, msg: &str) -> Record<'_> {
        Record {
            level,
            subsys,
            file: "crates/oxccl-host/src/tcp.rs",
            line: 42,
            elapsed_ms: 12.5,
            msg,
        }
    }

    #[test]
    fn line_shapes() {
        let c = ctx();
        assert_eq!(
            format_line(
                &c,
                &rec(Level::Info, Subsys::INIT, "Channel 00/0 : 0 1"),
                ""
            ),
            "node-01:1895902:1895913 [3] NCCL INFO Channel 00/0 : 0 1\n"
        );
        assert_eq!(
            format_line(
                &c,
                &rec(Level::Warn, Subsys::ALL, "peer 1 closed"),
                "[2024-02-29 13:05:09] "
            ),
            "\n[2024-02-29 13:05:09] node-01:1895902:1895913 [3] oxccl-host/src/tcp.rs:42 NCCL WARN peer 1 closed\n"
        );
        assert_eq!(
            format_line(&c, &rec(Level::Warn, Subsys::ALL, "x"), ""),
            "\nnode-01:1895902:1895913 [3] oxccl-host/src/tcp.rs:42 NCCL WARN x\n"
        );
        assert_eq!(
            format_line(
                &c,
                &rec(Level::Version, Subsys::ALL, "NCCL version 2.30.7+oxccl"),
                ""
            ),
            "NCCL version 2.30.7+oxccl\n"
        );
        assert_eq!(
            format_line(&c, &rec(Level::Trace, Subsys::COLL, "step 3"), ""),
            "node-01:1895902:1895913 [3] 12.500000 oxccl-host/src/tcp.rs:42 NCCL TRACE step 3\n"
        );
        assert_eq!(
            format_line(
                &c,
                &rec(Level::Trace, Subsys::CALL, "ncclAllReduce(1,2,3)"),
                ""
            ),
            "node-01:1895902:1895913 NCCL CALL ncclAllReduce(1,2,3)\n"
        );
    }

    #[test]
    fn hostname_and_file_pattern() {
        assert_eq!(short_hostname("node-01.cluster.example.com\n"), "node-01");
        assert_eq!(short_hostname("a%b/c.d"), "a-b-c");
        assert_eq!(
            debug_file_path("/tmp/nccl.%h.%p.log", "node-01", 4242),
            "/tmp/nccl.node-01.4242.log"
        );
        assert_eq!(debug_file_path("x%q%%p%", "h", 7), "x%q%7%");
        assert_eq!(short_file("src/lib.rs"), "src/lib.rs");
    }

    #[test]
    fn level_and_subsys_parsing() {
        assert_eq!(Level::parse("info"), Some(Level::Info));
        assert_eq!(Level::parse(" Trace "), Some(Level::Trace));
        assert_eq!(Level::parse("abort"), Some(Level::Abort));
        assert_eq!(Level::parse("verbose"), None);
        assert!(Level::Version < Level::Warn && Level::Info < Level::Abort);

        let s = Subsys::parse_list("INIT,coll").unwrap();
        assert_eq!(s, Subsys::INIT | Subsys::COLL);
        let s = Subsys::parse_list("^INIT,NET").unwrap();
        assert!(!s.intersects(Subsys::INIT) && !s.intersects(Subsys::NET));
        assert!(s.intersects(Subsys::COLL) && s.intersects(Subsys::DESTROY));
        assert_eq!(Subsys::parse_list("ALL").unwrap(), Subsys::ALL);
        assert_eq!(Subsys::parse_list("^ALL").unwrap(), Subsys::NONE);
        assert_eq!(
            Subsys::parse_list("alloc_host").unwrap(),
            Subsys::ALLOC_HOST
        );
        let e = Subsys::parse_list("INIT,NETT").unwrap_err();
        assert!(e.starts_with("subsystem names (INIT, COLL, P2P"), "{e}");
        assert!(
            e.ends_with("DESTROY, ALL; '^' first inverts), not 'NETT'"),
            "{e}"
        );
        assert_eq!(Subsys::corrected("INIT,NETT").as_deref(), Some("INIT,NET"));
        assert_eq!(
            Subsys::corrected("^bootstrp").as_deref(),
            Some("^BOOTSTRAP")
        );
        assert_eq!(Subsys::corrected("INIT"), None);
        assert_eq!(Level::nearest("INOF"), Some(Level::Info));
        assert_eq!(Level::nearest("warning"), Some(Level::Warn));
        assert_eq!(Level::nearest("info"), None);
        assert_eq!(Level::nearest("verbose"), None);
        let e = LevelSet::parse_list("WARN,INFOO").unwrap_err();
        assert_eq!(
            e,
            "level names (VERSION, WARN, INFO, ABORT, TRACE, ALL; '^' first inverts), not 'INFOO'"
        );
        assert_eq!(
            LevelSet::corrected("WARN,INFOO").as_deref(),
            Some("WARN,INFO")
        );

        let l = LevelSet::parse_list("warn,INFO").unwrap();
        assert!(l.contains(Level::Warn) && l.contains(Level::Info) && !l.contains(Level::Trace));
        let l = LevelSet::parse_list("^warn").unwrap();
        assert!(!l.contains(Level::Warn) && l.contains(Level::Trace));
        assert!(LevelSet::parse_list("loud").is_err());
    }

    #[test]
    fn config_filters() {
        let cfg = LogConfig {
            level: Level::Info,
            subsys: Subsys::INIT | Subsys::ENV,
            timestamp_format: "[%F %T] ".into(),
            timestamp_levels: LevelSet::of(Level::Warn),
            file: Some("/tmp/x.%p".into()),
        };
        assert!(cfg.enabled(Level::Warn, Subsys::ALL));
        assert!(cfg.enabled(Level::Info, Subsys::INIT));
        assert!(cfg.enabled(Level::Info, Subsys::INIT | Subsys::NET));
        assert!(!cfg.enabled(Level::Info, Subsys::COLL));
        assert!(!cfg.enabled(Level::Trace, Subsys::INIT));
        assert!(cfg.timestamped(Level::Warn) && !cfg.timestamped(Level::Info));
        assert_eq!(cfg.file_path("h", 9).as_deref(), Some("/tmp/x.9"));
        let v = LogConfig {
            level: Level::Version,
            ..cfg
        };
        assert_eq!(v.file_path("h", 9), None);
    }

    #[test]
    fn timestamps() {
        assert_eq!(strftime("[%F %T] ", 0, 0), "[1970-01-01 00:00:00] ");
        // 2024-02-29 13:05:09.123456789 UTC, a Thursday, day 60 of a leap year.
        let t = 1_709_211_909;
        assert_eq!(strftime("%F %T", t, 123_456_789), "2024-02-29 13:05:09");
        assert_eq!(
            strftime("%Y/%m/%d %H:%M:%S.%3f %f %9f %j %a %b %y %D %R %s %z %Z %%", t, 123_456_789),
            "2024/02/29 13:05:09.123 123456 123456789 060 Thu Feb 24 02/29/24 13:05 1709211909 +0000 UTC %"
        );
        assert_eq!(strftime("%e|%q|%", 1_704_067_200, 0), " 1|%q|%");
        // Before the epoch.
        assert_eq!(strftime("%F %T", -1, 0), "1969-12-31 23:59:59");
        // Year ends, leap and not.
        assert_eq!(strftime("%F %j", 1_735_603_200, 0), "2024-12-31 366");
        assert_eq!(strftime("%F %j", 4_107_456_000, 0), "2100-02-28 059");
        assert_eq!(strftime("%F", 4_107_542_400, 0), "2100-03-01");
    }
}
