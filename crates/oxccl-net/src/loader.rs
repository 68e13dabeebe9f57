//! Loading a network plugin: `dlopen`, the newest `ncclNetPlugin_vN` it
//! exports (v12 down to v6, NCCL 2.30's order), `init`, and [`Plugin`], the
//! [`Net`] over whichever version it is.
//!
//! A library is opened and initialised once per process (NCCL does the same;
//! plugins keep global state and most cannot be unloaded), and never closed.
//! Outcomes are cached by the `NCCL_NET_PLUGIN` value that asked for them, so
//! a WARN about a broken plugin is printed once, not once per communicator.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_ulong, c_void, CStr, CString};
use std::ptr;
use std::sync::{Arc, Mutex, OnceLock};

use oxccl_core::{Error, ErrorKind, Result};
use oxccl_env::{Level, Subsys};

use crate::ffi::{self, NcclResult};
use crate::{
    CallError, CommRef, DeviceMemory, Handle, ListenComm, MrHandle, Net, Poll, Properties,
    RecvComm, Request, SendComm,
};

/// An ABI version oxccl can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    V6 = 6,
    V7 = 7,
    V8 = 8,
    V9 = 9,
    V10 = 10,
    V11 = 11,
    V12 = 12,
}

impl Version {
    /// Newest first: the order symbols are looked for.
    pub const NEWEST_FIRST: [Version; 7] = [
        Version::V12,
        Version::V11,
        Version::V10,
        Version::V9,
        Version::V8,
        Version::V7,
        Version::V6,
    ];

    /// The exported symbol of this version's table.
    pub fn symbol(self) -> &'static str {
        match self {
            Version::V6 => "ncclNetPlugin_v6",
            Version::V7 => "ncclNetPlugin_v7",
            Version::V8 => "ncclNetPlugin_v8",
            Version::V9 => "ncclNetPlugin_v9",
            Version::V10 => "ncclNetPlugin_v10",
            Version::V11 => "ncclNetPlugin_v11",
            Version::V12 => "ncclNetPlugin_v12",
        }
    }
}

/// The table a plugin exports. The references are `'static` because the
/// library is never unloaded.
#[derive(Clone, Copy)]
enum Table {
    V6(&'static ffi::NetV6),
    V7(&'static ffi::NetV7),
    V8(&'static ffi::NetV8),
    V9(&'static ffi::NetV9),
    V10(&'static ffi::NetV10),
    V11(&'static ffi::NetV11),
    V12(&'static ffi::NetV12),
}

/// A loaded, initialised plugin.
pub struct Plugin {
    /// The file as it was opened (`libnccl-net-foo.so` or a path).
    library: String,
    version: Version,
    name: String,
    table: Table,
    /// The context v11 and later return from `init` and take in `listen`
    /// and `connect` (NULL before v11). One per process: oxccl initialises
    /// a plugin once and shares it among its communicators.
    ctx: *mut c_void,
}

// SAFETY: the table is immutable after load and its functions are meant to be
// called from any thread (NCCL calls them from its proxy threads).
unsafe impl Send for Plugin {}
// SAFETY: as above; per-object exclusivity is kept by the handle types, which
// are `Send` but not `Sync`.
unsafe impl Sync for Plugin {}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("library", &self.library)
            .field("version", &self.version)
            .field("name", &self.name)
            .finish()
    }
}

/// What loading a plugin came to.
#[derive(Debug, Clone)]
pub enum LoadOutcome {
    /// `NCCL_NET_PLUGIN=none`.
    Disabled,
    /// No candidate library could be opened: `(file, dlerror)` for each.
    NotFound(Vec<(String, String)>),
    /// A library opened but cannot be used: which and why.
    Failed { library: String, why: String },
    /// Ready to use.
    Loaded(Arc<Plugin>),
}

extern "C" {
    /// The C shim (src/log_shim.c): formats and forwards to the sink.
    fn oxccl_net_logger(
        level: c_int,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    );
    fn oxccl_net_set_sink(sink: extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char));
}

/// Where the shim sends a plugin's formatted lines: oxccl's logger, with the
/// plugin's level, subsystem bits (NCCL's and oxccl's masks are the same),
/// file and line.
extern "C" fn log_sink(
    level: c_int,
    flags: c_ulong,
    file: *const c_char,
    line: c_int,
    msg: *const c_char,
) {
    // A panic must not unwind into the plugin's C frames.
    let _ = std::panic::catch_unwind(|| {
        let level = match level {
            ffi::NCCL_LOG_VERSION => Level::Version,
            ffi::NCCL_LOG_WARN => Level::Warn,
            ffi::NCCL_LOG_INFO => Level::Info,
            ffi::NCCL_LOG_ABORT => Level::Abort,
            ffi::NCCL_LOG_TRACE => Level::Trace,
            _ => return,
        };
        let text = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: the shim passes a NUL-terminated buffer, and the
                // plugin a NUL-terminated file name, both live for this call.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        let file = text(file);
        let msg = text(msg);
        let subsys = Subsys(flags as u32);
        oxccl_env::log::log(
            level,
            subsys,
            &file,
            line.max(0) as u32,
            format_args!("{}", msg.trim_end()),
        );
    });
}

/// v10's profiler callback: oxccl has no profiler, so no event is recorded.
unsafe extern "C" fn profiler_noop(
    e_handle: *mut *mut c_void,
    _kind: c_int,
    _p_handle: *mut c_void,
    _plugin_id: i64,
    _ext: *mut c_void,
) -> NcclResult {
    if !e_handle.is_null() {
        // SAFETY: the plugin passes a valid out-pointer when non-NULL.
        unsafe { *e_handle = ptr::null_mut() };
    }
    ffi::NCCL_SUCCESS
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated thread-local string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlerror".to_string()
    } else {
        // SAFETY: non-NULL result of dlerror, valid until the next dl call.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// Opens a library; Err with dlerror's text.
pub(crate) fn open(file: &str) -> std::result::Result<*mut c_void, String> {
    let c = CString::new(file).map_err(|_| "the name contains a NUL byte".to_string())?;
    // SAFETY: a valid C string; RTLD_NOW resolves everything up front so a
    // missing dependency fails here, not in the middle of a collective.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        Err(dlerror_text())
    } else {
        Ok(h)
    }
}

/// The first of `symbols` (newest first) that `lib` exports, with its
/// address.
pub(crate) fn find_symbol<V>(
    lib: *mut c_void,
    symbols: impl IntoIterator<Item = (V, &'static str)>,
) -> Option<(V, *mut c_void)> {
    symbols.into_iter().find_map(|(v, name)| {
        let sym = CString::new(name).ok()?;
        // SAFETY: `lib` is a live handle from dlopen; the name is a C string.
        let p = unsafe { libc::dlsym(lib, sym.as_ptr()) };
        (!p.is_null()).then_some((v, p))
    })
}

/// The newest table `lib` exports.
fn find_table(lib: *mut c_void) -> Option<(Version, *mut c_void)> {
    find_symbol(lib, Version::NEWEST_FIRST.map(|v| (v, v.symbol())))
}

/// The logger given to plugins: NCCL's printf-style `ncclDebugLogger_t`,
/// whose lines land in oxccl's `NCCL_DEBUG` log.
pub(crate) fn plugin_logger() -> ffi::Logger {
    // SAFETY: installs a plain function pointer; the shim reads it atomically.
    unsafe { oxccl_net_set_sink(log_sink) };
    oxccl_net_logger
}

/// Checks that the entries oxccl calls are present.
macro_rules! require {
    ($t:expr, $($f:ident),*) => {{
        let mut missing: Vec<&str> = Vec::new();
        $( if $t.$f.is_none() { missing.push(stringify!($f)); } )*
        missing
    }};
}

fn missing_entries(t: Table) -> Vec<&'static str> {
    match t {
        Table::V6(t) => require!(
            t,
            init,
            devices,
            get_properties,
            listen,
            connect,
            accept,
            reg_mr,
            dereg_mr,
            isend,
            irecv,
            test,
            close_send,
            close_recv,
            close_listen
        ),
        Table::V7(t) => require!(
            t,
            init,
            devices,
            get_properties,
            listen,
            connect,
            accept,
            reg_mr,
            dereg_mr,
            isend,
            irecv,
            test,
            close_send,
            close_recv,
            close_listen
        ),
        Table::V8(t) => require!(
            t,
            init,
            devices,
            get_properties,
            listen,
            connect,
            accept,
            reg_mr,
            dereg_mr,
            isend,
            irecv,
            test,
            close_send,
            close_recv,
            close_listen
        ),
        Table::V9(t) => require!(
            t,
            init,
            devices,
            get_properties,
            listen,
            connect,
            accept,
            reg_mr,
            dereg_mr,
            isend,
            irecv,
            test,
            close_send,
            close_recv,
            close_listen
        ),
        Table::V11(t) => require!(
            t,
            init,
            devices,
            get_properties,
            listen,
            connect,
            accept,
            reg_mr,
            dereg_mr,
            isend,
            irecv,
            test,
            close_send,
            close_recv,
            close_listen
        ),
        Table::V12(t) => require!(
            t,
            init,
            devices,
            get_properties,
            listen,
            connect,
            accept,
            reg_mr,
            dereg_mr,
            isend,
            irecv,
            test,
            close_send,
            close_recv,
            close_listen
        ),
        Table::V10(t) => require!(
            t,
            init,
            devices,
            get_properties,
            listen,
            connect,
            accept,
            reg_mr,
            dereg_mr,
            isend,
            irecv,
            test,
            close_send,
            close_recv,
            close_listen
        ),
    }
}

fn name_ptr(t: Table) -> *const c_char {
    match t {
        Table::V6(t) => t.name,
        Table::V7(t) => t.name,
        Table::V8(t) => t.name,
        Table::V9(t) => t.name,
        Table::V10(t) => t.name,
        Table::V11(t) => t.name,
        Table::V12(t) => t.name,
    }
}

fn read_name(t: Table) -> String {
    let p = name_ptr(t);
    if p.is_null() {
        "(unnamed)".to_string()
    } else {
        // SAFETY: the plugin's name is a NUL-terminated string in its table.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Opens, finds and initialises one library (no caching).
fn load_file(file: &str) -> std::result::Result<Plugin, (bool, String)> {
    let lib = open(file).map_err(|e| (false, e))?;
    let Some((version, sym)) = find_table(lib) else {
        let known: Vec<&str> = Version::NEWEST_FIRST.iter().map(|v| v.symbol()).collect();
        return Err((
            true,
            format!(
                "it exports none of the versions oxccl knows ({}); it may be older than v6 or newer than v12",
                known.join(", ")
            ),
        ));
    };
    // SAFETY: `sym` is the address of the plugin's exported table of this
    // version, which lives as long as the library (never unloaded).
    let table = unsafe {
        match version {
            Version::V6 => Table::V6(&*(sym as *const ffi::NetV6)),
            Version::V7 => Table::V7(&*(sym as *const ffi::NetV7)),
            Version::V8 => Table::V8(&*(sym as *const ffi::NetV8)),
            Version::V9 => Table::V9(&*(sym as *const ffi::NetV9)),
            Version::V10 => Table::V10(&*(sym as *const ffi::NetV10)),
            Version::V11 => Table::V11(&*(sym as *const ffi::NetV11)),
            Version::V12 => Table::V12(&*(sym as *const ffi::NetV12)),
        }
    };
    let missing = missing_entries(table);
    if !missing.is_empty() {
        return Err((
            true,
            format!(
                "its {} table has no {}",
                version.symbol(),
                missing.join(", ")
            ),
        ));
    }
    let logger = plugin_logger();
    let mut ctx: *mut c_void = ptr::null_mut();
    // Read by init only (v11 and later); the traffic class is left to the
    // plugin, as NCCL does without NCCL_IB_TC-style settings.
    let mut config = ffi::CommConfigV10 {
        traffic_class: ffi::NCCL_NET_TRAFFIC_CLASS_UNDEF,
    };
    // NCCL passes the communicator's hash; oxccl makes one context for the
    // process, so no communicator's: 0.
    let comm_id: u64 = 0;
    // SAFETY: entries checked present above; init takes the logger (and in
    // v10 and later an optional profiler callback), both valid for the
    // process; `ctx` and `config` are writable and outlive the call.
    let rc = unsafe {
        match table {
            Table::V6(t) => (t.init.unwrap_unchecked())(logger),
            Table::V7(t) => (t.init.unwrap_unchecked())(logger),
            Table::V8(t) => (t.init.unwrap_unchecked())(logger),
            Table::V9(t) => (t.init.unwrap_unchecked())(logger),
            Table::V10(t) => (t.init.unwrap_unchecked())(logger, Some(profiler_noop)),
            Table::V11(t) => (t.init.unwrap_unchecked())(
                &mut ctx,
                comm_id,
                &mut config,
                logger,
                Some(profiler_noop),
            ),
            Table::V12(t) => (t.init.unwrap_unchecked())(
                &mut ctx,
                comm_id,
                &mut config,
                logger,
                Some(profiler_noop),
            ),
        }
    };
    let name = read_name(table);
    if rc != ffi::NCCL_SUCCESS {
        return Err((
            true,
            format!(
                "{} (network {name}): {}",
                version.symbol(),
                CallError {
                    call: "init",
                    code: rc
                }
            ),
        ));
    }
    Ok(Plugin {
        library: file.to_string(),
        version,
        name,
        table,
        ctx,
    })
}

type Cache = Mutex<HashMap<Vec<String>, LoadOutcome>>;

/// Loads the plugin that `candidates` (see [`crate::library_candidates`])
/// name, trying each file in turn; `None` means disabled. Cached per list.
pub fn load(candidates: Option<&[String]>) -> LoadOutcome {
    let Some(candidates) = candidates else {
        return LoadOutcome::Disabled;
    };
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    // Held across the load: init runs once even when communicators start in
    // several threads at once.
    let mut g = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(o) = g.get(candidates) {
        return o.clone();
    }
    let mut not_found = Vec::new();
    let mut outcome = None;
    for file in candidates {
        match load_file(file) {
            Ok(p) => {
                oxccl_env::info!(
                    Subsys::INIT | Subsys::NET,
                    "NET/Plugin: loaded {file}: network {} through {}",
                    p.name,
                    p.version.symbol()
                );
                outcome = Some(LoadOutcome::Loaded(Arc::new(p)));
                break;
            }
            Err((false, why)) => not_found.push((file.clone(), why)),
            Err((true, why)) => {
                outcome = Some(LoadOutcome::Failed {
                    library: file.clone(),
                    why,
                });
                break;
            }
        }
    }
    let o = outcome.unwrap_or(LoadOutcome::NotFound(not_found));
    g.insert(candidates.to_vec(), o.clone());
    o
}

fn check(call: &'static str, rc: NcclResult, plugin: &Plugin) -> Result<()> {
    if rc == ffi::NCCL_SUCCESS {
        return Ok(());
    }
    let kind = ErrorKind::from_code(rc)
        .filter(|k| *k != ErrorKind::InProgress)
        .unwrap_or(ErrorKind::Internal);
    Err(Error::new(
        kind,
        format!("NET/{}: {}", plugin.name, CallError { call, code: rc }),
    ))
}

fn cstr_opt(p: *const c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        // SAFETY: property strings are NUL-terminated and owned by the plugin.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

/// NCCL's transfer limit for plugins that do not report one (before v9).
const DEFAULT_MAX_P2P: usize = 1 << 30;

fn to_int(len: usize, what: &str) -> Result<c_int> {
    c_int::try_from(len).map_err(|_| {
        Error::invalid_argument(format!(
            "{what} of {len} bytes exceeds this plugin version's int size"
        ))
    })
}

impl Plugin {
    /// The ABI version in use.
    pub fn version(&self) -> Version {
        self.version
    }
    /// The file it was loaded from.
    pub fn library(&self) -> &str {
        &self.library
    }
}

/// Calls an entry of whichever table, with the same arguments.
macro_rules! call {
    ($self:expr, $f:ident ( $($a:expr),* )) => {
        match $self.table {
            // SAFETY: the entry was checked present at load, and the caller
            // passes arguments valid for the ABI.
            Table::V6(t) => unsafe { (t.$f.unwrap_unchecked())($($a),*) },
            // SAFETY: the entry was checked present at load, and the caller
            // passes arguments valid for the ABI.
            Table::V7(t) => unsafe { (t.$f.unwrap_unchecked())($($a),*) },
            // SAFETY: the entry was checked present at load, and the caller
            // passes arguments valid for the ABI.
            Table::V8(t) => unsafe { (t.$f.unwrap_unchecked())($($a),*) },
            // SAFETY: the entry was checked present at load, and the caller
            // passes arguments valid for the ABI.
            Table::V9(t) => unsafe { (t.$f.unwrap_unchecked())($($a),*) },
            // SAFETY: the entry was checked present at load, and the caller
            // passes arguments valid for the ABI.
            Table::V10(t) => unsafe { (t.$f.unwrap_unchecked())($($a),*) },
            // SAFETY: the entry was checked present at load, and the caller
            // passes arguments valid for the ABI.
            Table::V11(t) => unsafe { (t.$f.unwrap_unchecked())($($a),*) },
            // SAFETY: the entry was checked present at load, and the caller
            // passes arguments valid for the ABI.
            Table::V12(t) => unsafe { (t.$f.unwrap_unchecked())($($a),*) },
        }
    };
}

impl Net for Plugin {
    fn name(&self) -> &str {
        &self.name
    }

    fn devices(&self) -> Result<usize> {
        let mut n: c_int = 0;
        check("devices", call!(self, devices(&mut n)), self)?;
        Ok(n.max(0) as usize)
    }

    fn properties(&self, dev: usize) -> Result<Properties> {
        let d = to_int(dev, "device index")?;
        // Fields a version lacks take NCCL's assumption for it.
        macro_rules! base {
            ($p:expr, $max:expr) => {
                base!($p, $max, false)
            };
            ($p:expr, $max:expr, $flush:expr) => {
                Properties {
                    name: cstr_opt($p.name).unwrap_or_else(|| format!("dev{dev}")),
                    pci_path: cstr_opt($p.pci_path),
                    guid: $p.guid,
                    ptr_support: $p.ptr_support,
                    speed_mbps: $p.speed,
                    port: $p.port,
                    latency_us: $p.latency,
                    max_comms: $p.max_comms,
                    max_recvs: $p.max_recvs,
                    max_p2p_bytes: $max,
                    force_flush: $flush,
                }
            };
        }
        let props = match self.table {
            Table::V6(t) => {
                // SAFETY: all-zero is a valid value of this plain C struct.
                let mut p: ffi::PropsV6 = unsafe { std::mem::zeroed() };
                // SAFETY: entry present (checked at load); `p` is writable.
                let rc = unsafe { (t.get_properties.unwrap_unchecked())(d, &mut p) };
                check("getProperties", rc, self)?;
                base!(p, DEFAULT_MAX_P2P)
            }
            Table::V7(t) => {
                // SAFETY: as above.
                let mut p: ffi::PropsV7 = unsafe { std::mem::zeroed() };
                // SAFETY: as above.
                let rc = unsafe { (t.get_properties.unwrap_unchecked())(d, &mut p) };
                check("getProperties", rc, self)?;
                base!(p, DEFAULT_MAX_P2P)
            }
            Table::V8(t) => {
                // SAFETY: as above.
                let mut p: ffi::PropsV8 = unsafe { std::mem::zeroed() };
                // SAFETY: as above.
                let rc = unsafe { (t.get_properties.unwrap_unchecked())(d, &mut p) };
                check("getProperties", rc, self)?;
                base!(p, DEFAULT_MAX_P2P)
            }
            Table::V9(t) => {
                // SAFETY: as above.
                let mut p: ffi::PropsV9 = unsafe { std::mem::zeroed() };
                // SAFETY: as above.
                let rc = unsafe { (t.get_properties.unwrap_unchecked())(d, &mut p) };
                check("getProperties", rc, self)?;
                let max = if p.max_p2p_bytes == 0 {
                    DEFAULT_MAX_P2P
                } else {
                    p.max_p2p_bytes
                };
                base!(p, max, p.force_flush != 0)
            }
            Table::V10(t) => {
                // SAFETY: as above.
                let mut p: ffi::PropsV9 = unsafe { std::mem::zeroed() };
                // SAFETY: as above.
                let rc = unsafe { (t.get_properties.unwrap_unchecked())(d, &mut p) };
                check("getProperties", rc, self)?;
                let max = if p.max_p2p_bytes == 0 {
                    DEFAULT_MAX_P2P
                } else {
                    p.max_p2p_bytes
                };
                base!(p, max, p.force_flush != 0)
            }
            Table::V11(t) => {
                // SAFETY: as above.
                let mut p: ffi::PropsV11 = unsafe { std::mem::zeroed() };
                // SAFETY: as above.
                let rc = unsafe { (t.get_properties.unwrap_unchecked())(d, &mut p) };
                check("getProperties", rc, self)?;
                let max = if p.max_p2p_bytes == 0 {
                    DEFAULT_MAX_P2P
                } else {
                    p.max_p2p_bytes
                };
                base!(p, max, p.force_flush != 0)
            }
            Table::V12(t) => {
                // SAFETY: as above.
                let mut p: ffi::PropsV12 = unsafe { std::mem::zeroed() };
                // SAFETY: as above.
                let rc = unsafe { (t.get_properties.unwrap_unchecked())(d, &mut p) };
                check("getProperties", rc, self)?;
                let max = if p.max_p2p_bytes == 0 {
                    DEFAULT_MAX_P2P
                } else {
                    p.max_p2p_bytes
                };
                base!(p, max, p.force_flush != 0)
            }
        };
        Ok(props)
    }

    fn listen(&self, dev: usize) -> Result<(Handle, ListenComm)> {
        let d = to_int(dev, "device index")?;
        let mut handle: Handle = [0; ffi::NCCL_NET_HANDLE_MAXSIZE];
        let mut l: *mut c_void = ptr::null_mut();
        let h = handle.as_mut_ptr().cast::<c_void>();
        let ctx = self.ctx;
        // SAFETY: in each arm the entry was checked present at load; the
        // handle is 128 writable bytes; `l` is writable; `ctx` is the one
        // init returned.
        let rc = unsafe {
            match self.table {
                Table::V6(t) => (t.listen.unwrap_unchecked())(d, h, &mut l),
                Table::V7(t) => (t.listen.unwrap_unchecked())(d, h, &mut l),
                Table::V8(t) => (t.listen.unwrap_unchecked())(d, h, &mut l),
                Table::V9(t) => (t.listen.unwrap_unchecked())(d, h, &mut l),
                Table::V10(t) => (t.listen.unwrap_unchecked())(d, h, &mut l),
                Table::V11(t) => (t.listen.unwrap_unchecked())(ctx, d, h, &mut l),
                Table::V12(t) => (t.listen.unwrap_unchecked())(ctx, d, h, &mut l),
            }
        };
        check("listen", rc, self)?;
        let l = ListenComm::from_raw(l).ok_or_else(|| {
            Error::internal(format!("NET/{}: listen returned no object", self.name))
        })?;
        Ok((handle, l))
    }

    fn connect(&self, dev: usize, handle: &mut Handle) -> Result<Option<SendComm>> {
        let d = to_int(dev, "device index")?;
        let h = handle.as_mut_ptr().cast::<c_void>();
        let mut s: *mut c_void = ptr::null_mut();
        // No device offload: a pointer to NULL.
        let mut dev_comm: *mut ffi::DeviceHandle = ptr::null_mut();
        let mut config = ffi::CommConfigV10 {
            traffic_class: ffi::NCCL_NET_TRAFFIC_CLASS_UNDEF,
        };
        // SAFETY: in each arm the entry was checked present at load; the
        // handle is 128 writable bytes that stay in place between retries;
        // out-pointers are writable.
        let rc = unsafe {
            match self.table {
                Table::V6(t) => (t.connect.unwrap_unchecked())(d, h, &mut s),
                Table::V7(t) => (t.connect.unwrap_unchecked())(d, h, &mut s, &mut dev_comm),
                Table::V8(t) => (t.connect.unwrap_unchecked())(d, h, &mut s, &mut dev_comm),
                Table::V9(t) => (t.connect.unwrap_unchecked())(d, h, &mut s, &mut dev_comm),
                Table::V10(t) => {
                    (t.connect.unwrap_unchecked())(d, &mut config, h, &mut s, &mut dev_comm)
                }
                Table::V11(t) => {
                    (t.connect.unwrap_unchecked())(self.ctx, d, h, &mut s, &mut dev_comm)
                }
                Table::V12(t) => {
                    (t.connect.unwrap_unchecked())(self.ctx, d, h, &mut s, &mut dev_comm)
                }
            }
        };
        check("connect", rc, self)?;
        Ok(SendComm::from_raw(s))
    }

    fn accept(&self, listen: &ListenComm) -> Result<Option<RecvComm>> {
        let l = listen.as_ptr();
        let mut r: *mut c_void = ptr::null_mut();
        let mut dev_comm: *mut ffi::DeviceHandle = ptr::null_mut();
        // SAFETY: in each arm the entry was checked present at load; `l` is a
        // live listen object.
        let rc = unsafe {
            match self.table {
                Table::V6(t) => (t.accept.unwrap_unchecked())(l, &mut r),
                Table::V7(t) => (t.accept.unwrap_unchecked())(l, &mut r, &mut dev_comm),
                Table::V8(t) => (t.accept.unwrap_unchecked())(l, &mut r, &mut dev_comm),
                Table::V9(t) => (t.accept.unwrap_unchecked())(l, &mut r, &mut dev_comm),
                Table::V10(t) => (t.accept.unwrap_unchecked())(l, &mut r, &mut dev_comm),
                Table::V11(t) => (t.accept.unwrap_unchecked())(l, &mut r, &mut dev_comm),
                Table::V12(t) => (t.accept.unwrap_unchecked())(l, &mut r, &mut dev_comm),
            }
        };
        check("accept", rc, self)?;
        Ok(RecvComm::from_raw(r))
    }

    unsafe fn reg_mr(&self, comm: CommRef<'_>, data: *mut u8, len: usize) -> Result<MrHandle> {
        let c = comm.as_ptr();
        let p = data.cast::<c_void>();
        let mut mh: *mut c_void = ptr::null_mut();
        let host = ffi::NCCL_PTR_HOST;
        // SAFETY: in each arm the entry was checked present at load; memory
        // validity is the caller's contract.
        let rc = unsafe {
            match self.table {
                Table::V6(t) => {
                    (t.reg_mr.unwrap_unchecked())(c, p, to_int(len, "registration")?, host, &mut mh)
                }
                Table::V7(t) => {
                    (t.reg_mr.unwrap_unchecked())(c, p, to_int(len, "registration")?, host, &mut mh)
                }
                Table::V8(t) => (t.reg_mr.unwrap_unchecked())(c, p, len, host, &mut mh),
                Table::V9(t) => (t.reg_mr.unwrap_unchecked())(c, p, len, host, &mut mh),
                Table::V10(t) => (t.reg_mr.unwrap_unchecked())(c, p, len, host, &mut mh),
                Table::V11(t) => (t.reg_mr.unwrap_unchecked())(c, p, len, host, &mut mh),
                Table::V12(t) => (t.reg_mr.unwrap_unchecked())(c, p, len, host, &mut mh),
            }
        };
        check("regMr", rc, self)?;
        // Some plugins need no registration for host memory and return NULL;
        // a dangling non-NULL marker keeps the type simple, and is passed back
        // as NULL (see `mr_ptr`).
        Ok(MrHandle::from_raw(mh).unwrap_or(MrHandle(std::ptr::NonNull::dangling())))
    }

    unsafe fn reg_mr_device(
        &self,
        comm: CommRef<'_>,
        data: *mut u8,
        len: usize,
        how: DeviceMemory,
    ) -> Result<MrHandle> {
        let c = comm.as_ptr();
        let p = data.cast::<c_void>();
        let mut mh: *mut c_void = ptr::null_mut();
        let cuda = ffi::NCCL_PTR_CUDA;
        let rc = match how {
            // SAFETY: in each arm the entry was checked present at load;
            // memory validity is the caller's contract.
            DeviceMemory::Address => unsafe {
                match self.table {
                    Table::V6(t) => (t.reg_mr.unwrap_unchecked())(
                        c,
                        p,
                        to_int(len, "registration")?,
                        cuda,
                        &mut mh,
                    ),
                    Table::V7(t) => (t.reg_mr.unwrap_unchecked())(
                        c,
                        p,
                        to_int(len, "registration")?,
                        cuda,
                        &mut mh,
                    ),
                    Table::V8(t) => (t.reg_mr.unwrap_unchecked())(c, p, len, cuda, &mut mh),
                    Table::V9(t) => (t.reg_mr.unwrap_unchecked())(c, p, len, cuda, &mut mh),
                    Table::V10(t) => (t.reg_mr.unwrap_unchecked())(c, p, len, cuda, &mut mh),
                    Table::V11(t) => (t.reg_mr.unwrap_unchecked())(c, p, len, cuda, &mut mh),
                    Table::V12(t) => (t.reg_mr.unwrap_unchecked())(c, p, len, cuda, &mut mh),
                }
            },
            DeviceMemory::DmaBuf { fd, offset } => {
                let f = match self.table {
                    Table::V6(t) => t.reg_mr_dma_buf,
                    Table::V7(t) => t.reg_mr_dma_buf,
                    Table::V8(t) => t.reg_mr_dma_buf,
                    Table::V9(t) => t.reg_mr_dma_buf,
                    Table::V10(t) => t.reg_mr_dma_buf,
                    Table::V11(t) => t.reg_mr_dma_buf,
                    Table::V12(t) => t.reg_mr_dma_buf,
                };
                let Some(f) = f else {
                    return Err(Error::new(
                        ErrorKind::Internal,
                        format!("NET/{}: regMrDmaBuf is NULL", self.name),
                    ));
                };
                // SAFETY: the plugin's entry; the range and the descriptor
                // are valid (the caller's contract).
                unsafe { f(c, p, len, cuda, offset, fd, &mut mh) }
            }
        };
        check(
            match how {
                DeviceMemory::Address => "regMr(NCCL_PTR_CUDA)",
                DeviceMemory::DmaBuf { .. } => "regMrDmaBuf",
            },
            rc,
            self,
        )?;
        MrHandle::from_raw(mh).ok_or_else(|| {
            Error::new(
                ErrorKind::Internal,
                format!("NET/{}: GPU memory registration returned NULL", self.name),
            )
        })
    }

    fn has_iflush(&self) -> bool {
        match self.table {
            Table::V6(t) => t.iflush.is_some(),
            Table::V7(t) => t.iflush.is_some(),
            Table::V8(t) => t.iflush.is_some(),
            Table::V9(t) => t.iflush.is_some(),
            Table::V10(t) => t.iflush.is_some(),
            Table::V11(t) => t.iflush.is_some(),
            Table::V12(t) => t.iflush.is_some(),
        }
    }

    unsafe fn iflush(
        &self,
        comm: &RecvComm,
        data: *mut u8,
        len: usize,
        mr: &MrHandle,
    ) -> Result<Option<Request>> {
        let f = match self.table {
            Table::V6(t) => t.iflush,
            Table::V7(t) => t.iflush,
            Table::V8(t) => t.iflush,
            Table::V9(t) => t.iflush,
            Table::V10(t) => t.iflush,
            Table::V11(t) => t.iflush,
            Table::V12(t) => t.iflush,
        };
        let Some(f) = f else { return Ok(None) };
        let mut p = data.cast::<c_void>();
        let mut size = to_int(len, "flush")?;
        let mut m = mr_ptr(mr);
        let mut req: *mut c_void = ptr::null_mut();
        // SAFETY: one element in each array; the buffer is a completed
        // receive's (the caller's contract).
        let rc = unsafe { f(comm.as_ptr(), 1, &mut p, &mut size, &mut m, &mut req) };
        check("iflush", rc, self)?;
        Ok(Request::from_raw(req))
    }

    fn dereg_mr(&self, comm: CommRef<'_>, mr: MrHandle) -> Result<()> {
        let c = comm.as_ptr();
        let m = mr_ptr(&mr);
        check("deregMr", call!(self, dereg_mr(c, m)), self)
    }

    unsafe fn isend(
        &self,
        comm: &SendComm,
        data: *const u8,
        len: usize,
        tag: i32,
        mr: &MrHandle,
    ) -> Result<Option<Request>> {
        let c = comm.as_ptr();
        let p = data as *mut c_void;
        let m = mr_ptr(mr);
        let mut req: *mut c_void = ptr::null_mut();
        // SAFETY: in each arm the entry was checked present at load; buffer
        // validity is the caller's contract; `req` is writable.
        let rc = unsafe {
            match self.table {
                Table::V6(t) => {
                    (t.isend.unwrap_unchecked())(c, p, to_int(len, "send")?, tag, m, &mut req)
                }
                Table::V7(t) => {
                    (t.isend.unwrap_unchecked())(c, p, to_int(len, "send")?, tag, m, &mut req)
                }
                Table::V8(t) => {
                    (t.isend.unwrap_unchecked())(c, p, to_int(len, "send")?, tag, m, &mut req)
                }
                Table::V9(t) => (t.isend.unwrap_unchecked())(c, p, len, tag, m, &mut req),
                Table::V10(t) => {
                    (t.isend.unwrap_unchecked())(c, p, len, tag, m, ptr::null_mut(), &mut req)
                }
                Table::V11(t) => {
                    (t.isend.unwrap_unchecked())(c, p, len, tag, m, ptr::null_mut(), &mut req)
                }
                Table::V12(t) => {
                    (t.isend.unwrap_unchecked())(c, p, len, tag, m, ptr::null_mut(), &mut req)
                }
            }
        };
        check("isend", rc, self)?;
        Ok(Request::from_raw(req))
    }

    unsafe fn irecv(
        &self,
        comm: &RecvComm,
        data: *mut u8,
        len: usize,
        tag: i32,
        mr: &MrHandle,
    ) -> Result<Option<Request>> {
        let c = comm.as_ptr();
        let mut p = data.cast::<c_void>();
        let mut m = mr_ptr(mr);
        let mut tag = tag;
        let mut req: *mut c_void = ptr::null_mut();
        // One receive per call (n = 1): oxccl does not group receives.
        let mut isize_: c_int = to_int(len.min(c_int::MAX as usize), "receive")?;
        let mut usize_: usize = len;
        let mut ph: *mut c_void = ptr::null_mut();
        // SAFETY: in each arm the entry was checked present at load; every
        // array argument points at one valid element; buffer validity is the
        // caller's contract.
        let rc = unsafe {
            match self.table {
                Table::V6(t) => (t.irecv.unwrap_unchecked())(
                    c,
                    1,
                    &mut p,
                    &mut isize_,
                    &mut tag,
                    &mut m,
                    &mut req,
                ),
                Table::V7(t) => (t.irecv.unwrap_unchecked())(
                    c,
                    1,
                    &mut p,
                    &mut isize_,
                    &mut tag,
                    &mut m,
                    &mut req,
                ),
                Table::V8(t) => (t.irecv.unwrap_unchecked())(
                    c,
                    1,
                    &mut p,
                    &mut isize_,
                    &mut tag,
                    &mut m,
                    &mut req,
                ),
                Table::V9(t) => (t.irecv.unwrap_unchecked())(
                    c,
                    1,
                    &mut p,
                    &mut usize_,
                    &mut tag,
                    &mut m,
                    &mut req,
                ),
                Table::V10(t) => (t.irecv.unwrap_unchecked())(
                    c,
                    1,
                    &mut p,
                    &mut usize_,
                    &mut tag,
                    &mut m,
                    &mut ph,
                    &mut req,
                ),
                Table::V11(t) => (t.irecv.unwrap_unchecked())(
                    c,
                    1,
                    &mut p,
                    &mut usize_,
                    &mut tag,
                    &mut m,
                    &mut ph,
                    &mut req,
                ),
                Table::V12(t) => (t.irecv.unwrap_unchecked())(
                    c,
                    1,
                    &mut p,
                    &mut usize_,
                    &mut tag,
                    &mut m,
                    &mut ph,
                    &mut req,
                ),
            }
        };
        check("irecv", rc, self)?;
        Ok(Request::from_raw(req))
    }

    fn test(&self, req: Request) -> Result<Poll> {
        let r = req.as_ptr();
        let mut done: c_int = 0;
        let mut size: c_int = 0;
        check("test", call!(self, test(r, &mut done, &mut size)), self)?;
        if done != 0 {
            Ok(Poll::Done(size.max(0) as usize))
        } else {
            Ok(Poll::Pending(req))
        }
    }

    fn close_send(&self, comm: SendComm) -> Result<()> {
        let c = comm.as_ptr();
        check("closeSend", call!(self, close_send(c)), self)
    }

    fn close_recv(&self, comm: RecvComm) -> Result<()> {
        let c = comm.as_ptr();
        check("closeRecv", call!(self, close_recv(c)), self)
    }

    fn close_listen(&self, comm: ListenComm) -> Result<()> {
        let c = comm.as_ptr();
        check("closeListen", call!(self, close_listen(c)), self)
    }
}

/// The plugin's pointer for a registration (NULL for "none needed").
fn mr_ptr(mr: &MrHandle) -> *mut c_void {
    if mr.0 == std::ptr::NonNull::dangling() {
        ptr::null_mut()
    } else {
        mr.as_ptr()
    }
}

/// What a search for a tuner or profiler library found ([`search_plugin`]).
#[derive(Debug)]
pub(crate) enum Search<T> {
    /// Loaded from this candidate file.
    File(T, String),
    /// Found in the network plugin's library (this file), no candidate having opened.
    NetLibrary(T, String),
    /// This file opened but cannot be used (why): the search ends there.
    Unusable(String, String),
    /// No candidate opened (each with why; empty: there were none) and the
    /// network plugin's library holds none.
    NotFound(Vec<String>),
}

/// The key a per-process cache of [`search_plugin`]'s outcome is kept
/// under: the candidate files and the fallback library.
pub(crate) fn search_key(candidates: &[String], net_library: Option<&str>) -> Vec<String> {
    let mut k = candidates.to_vec();
    k.push(format!("net:{}", net_library.unwrap_or_default()));
    k
}

/// Tries `candidates` in order with `load` (`Err((true, why))`: the file
/// opened but cannot be used, which ends the search; `Err((false, why))`:
/// not there), then, when none opened, the network plugin's library
/// (already loaded), as NCCL does.
pub(crate) fn search_plugin<T>(
    candidates: &[String],
    net_library: Option<&str>,
    load: impl Fn(&str) -> std::result::Result<T, (bool, String)>,
) -> Search<T> {
    let mut not_found = Vec::new();
    for file in candidates {
        match load(file) {
            Ok(t) => return Search::File(t, file.clone()),
            Err((false, why)) => not_found.push(format!("{file}: {why}")),
            Err((true, why)) => return Search::Unusable(file.clone(), why),
        }
    }
    if !not_found.is_empty() {
        if let Some(Ok(t)) = net_library.map(&load) {
            return Search::NetLibrary(t, net_library.unwrap_or_default().to_string());
        }
    }
    Search::NotFound(not_found)
}
