//! `NCCL_DEBUG` logging with lines shaped like NCCL's (see `oxccl_core::logfmt`).
//!
//! Use the macros: `oxccl_env::warn!("...")`, `oxccl_env::info!(Subsys::INIT, "...")`,
//! `oxccl_env::trace!(Subsys::COLL, "...")`. WARN and TRACE lines name their call
//! site's file:line: the macros pass `file!()`/`line!()`; a helper that logs for
//! its caller is `#[track_caller]` and calls [`log_here`], so the line names
//! the helper's caller. The start-up warnings about parameters name the line
//! that found each problem.
//!
//! A rank that waits for others says so with a [`Waiting`]: INFO every 5 s and
//! a WARN at 10 s (`oxccl_core::logfmt::WaitTicker`), naming what it waits for.
//!
//! Sink: stdout, as NCCL's default; or `NCCL_DEBUG_FILE` (`%h` = host, `%p` = pid),
//! created or truncated once and written one whole line per `write` (so it is
//! line-buffered), used only when `NCCL_DEBUG` is above VERSION. If the file cannot be
//! opened the logger says so in a WARN line and falls back to stdout.
//!
//! Every WARN message is kept, whether printed or not, for [`last_error`]
//! (`ncclGetLastError`).

use oxccl_core::logfmt::{self, LineCtx, LogConfig, Record, WaitTicker};
use oxccl_core::params::{self, Source};
use std::cell::Cell;
use std::fmt;
use std::fs::File;
use std::io::Write;
use std::panic::Location;
use std::sync::{Mutex, Once, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use oxccl_core::logfmt::{Level, Subsys};

enum Sink {
    Stdout,
    File(Mutex<File>),
}

struct Logger {
    cfg: LogConfig,
    host: String,
    pid: u32,
    start: Instant,
    sink: Sink,
    /// Set when NCCL_DEBUG_FILE could not be opened: reported once at start-up.
    open_error: Option<String>,
}

static LOGGER: OnceLock<Logger> = OnceLock::new();
static ANNOUNCED: Once = Once::new();
static LAST_ERROR: Mutex<Option<String>> = Mutex::new(None);

thread_local! {
    /// This thread's last WARN: threads of one process each running a rank must not
    /// read one another's errors (NCCL keeps its last-error text per thread too).
    static THREAD_LAST_ERROR: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
    static DEVICE: Cell<i32> = const { Cell::new(0) };
    static TID: Cell<u64> = const { Cell::new(0) };
}

/// Sets the device shown in `[dev]` for this thread's lines. NCCL prints the CUDA
/// device; host ranks print the rank's local index. Default 0.
pub fn set_device(dev: i32) {
    DEVICE.with(|d| d.set(dev));
}

/// The message of the last WARN (printed or not) for `ncclGetLastError`: this
/// thread's, or the process's when this thread has logged none (a WARN from a
/// proxy or reader thread still reaches the thread that asks).
pub fn last_error() -> Option<String> {
    THREAD_LAST_ERROR
        .with(|t| t.borrow().clone())
        .or_else(|| LAST_ERROR.lock().unwrap_or_else(|e| e.into_inner()).clone())
}

/// Builds the logger and reports the start-up notes now (otherwise both happen on the
/// first log call). Idempotent.
pub fn init() {
    logger();
}

/// The kernel's id of the calling thread, from `/proc/thread-self` (no `unsafe`
/// needed); 0 where that is unavailable.
fn tid() -> u64 {
    TID.with(|t| {
        if t.get() == 0 {
            let id = std::fs::read_link("/proc/thread-self")
                .ok()
                .and_then(|p| p.file_name()?.to_str()?.parse().ok())
                .unwrap_or(0);
            t.set(id);
        }
        t.get()
    })
}

fn hostname() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_string());
    logfmt::short_hostname(&raw)
}

fn build() -> Logger {
    let cfg = LogConfig::from_params(crate::params());
    let host = hostname();
    let pid = std::process::id();
    let mut open_error = None;
    let sink = match cfg.file_path(&host, pid) {
        Some(path) => match File::create(&path) {
            Ok(f) => Sink::File(Mutex::new(f)),
            Err(e) => {
                open_error = Some(format!(
                    "NCCL_DEBUG_FILE: cannot open {path}: {e}; logging to stdout"
                ));
                Sink::Stdout
            }
        },
        None => Sink::Stdout,
    };
    Logger {
        cfg,
        host,
        pid,
        start: Instant::now(),
        sink,
        open_error,
    }
}

fn logger() -> &'static Logger {
    let l = LOGGER.get_or_init(build);
    // The start-up notes write through `l` directly, never through `log`, so this
    // cannot recurse.
    ANNOUNCED.call_once(|| announce(l));
    l
}

fn announce(l: &Logger) {
    let here = file!();
    if let Some(e) = &l.open_error {
        l.emit(Level::Warn, Subsys::ALL, here, line!(), e);
    }
    // Each names the line that found the problem, not this one.
    for (w, at) in crate::located_param_warnings() {
        l.emit(Level::Warn, Subsys::ENV, at.file(), at.line(), &w);
    }
    for (info, value, source) in crate::params().explicit() {
        if !info.honoured {
            continue;
        }
        let shown = info.display_value(value);
        let msg = match source {
            Source::File(path) => {
                format!("{} set by configuration file {path} to {shown}.", info.name)
            }
            _ => format!("{} set by environment to {shown}.", info.name),
        };
        l.emit(Level::Info, Subsys::ENV, here, line!(), &msg);
    }
}

impl Logger {
    fn emit(&self, level: Level, subsys: Subsys, file: &str, line: u32, msg: &str) {
        if !self.cfg.enabled(level, subsys) {
            return;
        }
        let timestamp = if self.cfg.timestamped(level) {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            logfmt::strftime(
                &self.cfg.timestamp_format,
                now.as_secs() as i64,
                now.subsec_nanos(),
            )
        } else {
            String::new()
        };
        let ctx = LineCtx {
            host: &self.host,
            pid: self.pid,
            tid: tid(),
            dev: DEVICE.with(Cell::get),
        };
        let rec = Record {
            level,
            subsys,
            file,
            line,
            elapsed_ms: self.start.elapsed().as_secs_f64() * 1e3,
            msg,
        };
        let text = logfmt::format_line(&ctx, &rec, &timestamp);
        // A failed log write has nowhere to be reported; it must not fail the caller.
        let _ = match &self.sink {
            Sink::Stdout => std::io::stdout().lock().write_all(text.as_bytes()),
            Sink::File(f) => f
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .write_all(text.as_bytes()),
        };
    }
}

/// Writes one log line if `level`/`subsys` are enabled. Called by the macros.
pub fn log(level: Level, subsys: Subsys, file: &str, line: u32, args: fmt::Arguments<'_>) {
    let mut warn_text = None;
    if level == Level::Warn {
        let text = args.to_string();
        *LAST_ERROR.lock().unwrap_or_else(|e| e.into_inner()) = Some(text.clone());
        THREAD_LAST_ERROR.with(|t| *t.borrow_mut() = Some(text.clone()));
        warn_text = Some(text);
    }
    let l = logger();
    if !l.cfg.enabled(level, subsys) {
        return;
    }
    match warn_text {
        Some(text) => l.emit(level, subsys, file, line, &text),
        None => l.emit(level, subsys, file, line, &args.to_string()),
    }
}

/// [`log`] naming the caller's file:line: for logging helpers, which are
/// `#[track_caller]` themselves so that the line names where they were called.
#[track_caller]
pub fn log_here(level: Level, subsys: Subsys, args: fmt::Arguments<'_>) {
    let at = Location::caller();
    log(level, subsys, at.file(), at.line(), args);
}

/// A wait that reports itself: call [`Waiting::tick`] in the wait's loop (every
/// poll is fine); it prints an INFO line every 5 s and, once, a WARN at 10 s
/// (`OXCCL_WAIT_NOTICE_MS`, a test knob, sets the period and twice it), each
/// naming what is awaited and how long it has been.
#[derive(Debug)]
pub struct Waiting {
    start: Instant,
    ticker: WaitTicker,
    subsys: Subsys,
}

impl Waiting {
    /// A wait starting now; its INFO lines belong to `subsys`.
    pub fn new(subsys: Subsys) -> Waiting {
        Waiting::since(Instant::now(), subsys)
    }

    /// A wait that started at `start`.
    pub fn since(start: Instant, subsys: Subsys) -> Waiting {
        let ticker = match crate::params().get(&params::WAIT_NOTICE_MS) {
            Some(ms) => WaitTicker::new(Duration::from_millis(ms), Duration::from_millis(ms * 2)),
            None => WaitTicker::default(),
        };
        Waiting {
            start,
            ticker,
            subsys,
        }
    }

    /// Logs `what()` (built only when a line is due) with the time waited so
    /// far out of `limit` (the wait's timeout), naming the caller's file:line:
    /// "WHAT (waited 5.0 s of 120 s)".
    #[track_caller]
    pub fn tick(&mut self, limit: Duration, what: impl FnOnce() -> String) {
        let waited = self.start.elapsed();
        if let Some(level) = self.ticker.tick(waited) {
            let subsys = if level == Level::Warn {
                Subsys::ALL
            } else {
                self.subsys
            };
            log_here(
                level,
                subsys,
                format_args!(
                    "{} (waited {:.1} s of {})",
                    what(),
                    waited.as_secs_f64(),
                    limit_text(limit)
                ),
            );
        }
    }
}

/// "120 s", "1.5 s".
fn limit_text(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// Whether a line of `level` for `subsys` would be printed (to skip costly formatting).
pub fn enabled(level: Level, subsys: Subsys) -> bool {
    logger().cfg.enabled(level, subsys)
}

/// `warn!("fmt", args...)`: a WARN line (subsystem ALL). Its text also becomes
/// [`last_error`](crate::last_error).
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

/// `trace!(Subsys::X, "fmt", args...)`: a TRACE line for a subsystem (`Subsys::CALL`
/// gives NCCL's `NCCL CALL` shape).
#[macro_export]
macro_rules! trace {
    ($sub:expr, $($arg:tt)*) => {
        $crate::log::log($crate::log::Level::Trace, $sub, file!(), line!(), format_args!($($arg)*))
    };
}

/// `version!("fmt", args...)`: a VERSION line (the bare message).
#[macro_export]
macro_rules! version {
    ($($arg:tt)*) => {
        $crate::log::log($crate::log::Level::Version, $crate::log::Subsys::ALL, file!(), line!(), format_args!($($arg)*))
    };
}
