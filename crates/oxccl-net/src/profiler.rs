//! NCCL's profiler plugins (`ncclProfiler_v6` and `_v5`): finding the
//! library by `NCCL_PROFILER_PLUGIN`'s rules, and [`ProfilerComm`], one
//! plugin context per communicator (`init` returns the events the plugin
//! wants, `startEvent` / `stopEvent` / `recordEventState` per event,
//! `finalize` when dropped).
//!
//! v5 and v6 share their entry points and the event descriptor up to v5's
//! members; v6 adds copy-engine members to the descriptor's union (oxccl
//! passes the v6 size, which a v5 plugin reads a prefix of). NCCL 2.30 also
//! loads v4, whose descriptor differs; oxccl refuses it with a WARN.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr;
use std::sync::{Arc, Mutex, OnceLock};

use oxccl_env::Subsys;

use crate::ffi::{self, Logger, NcclResult};

type Vp = *mut c_void;

/// `ncclProfileGroup`: a group of operations as launched.
pub const PROFILE_GROUP: u64 = 1 << 0;
/// `ncclProfileColl`: a collective as launched.
pub const PROFILE_COLL: u64 = 1 << 1;
/// `ncclProfileP2p`: a send or receive as launched.
pub const PROFILE_P2P: u64 = 1 << 2;
/// `ncclProfileProxyOp`.
pub const PROFILE_PROXY_OP: u64 = 1 << 3;
/// `ncclProfileProxyStep`.
pub const PROFILE_PROXY_STEP: u64 = 1 << 4;
/// `ncclProfileGroupApi`: `ncclGroupStart` to `ncclGroupEnd`.
pub const PROFILE_GROUP_API: u64 = 1 << 8;
/// `ncclProfileCollApi`: a collective call.
pub const PROFILE_COLL_API: u64 = 1 << 9;
/// `ncclProfileP2pApi`: a send or receive call.
pub const PROFILE_P2P_API: u64 = 1 << 10;

/// `groupApi` member of the descriptor's union.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GroupApiDescr {
    pub graph_captured: bool,
    pub group_depth: c_int,
}

/// `collApi` member.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollApiDescr {
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub root: c_int,
    pub stream: Vp,
    pub graph_captured: bool,
}

/// `p2pApi` member.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2pApiDescr {
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub stream: Vp,
    pub graph_captured: bool,
}

/// `coll` member.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollDescr {
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: Vp,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub n_channels: u8,
    pub n_warps: u8,
    pub algo: *const c_char,
    pub proto: *const c_char,
    pub parent_group: Vp,
}

/// `p2p` member.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2pDescr {
    pub func: *const c_char,
    pub buff: Vp,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
    pub n_channels: u8,
    pub parent_group: Vp,
}

/// `ceColl` member (v6), the union's largest: there for its size only.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CeCollDescr {
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: Vp,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub sync_strategy: *const c_char,
    pub intra_batch_sync: bool,
    pub batch_size: u32,
    pub num_batches: u32,
    pub ce_seq_num: u32,
    pub stream: Vp,
}

/// The union of `ncclProfilerEventDescr_v6_t`, with the members oxccl fills.
#[repr(C)]
#[derive(Clone, Copy)]
pub union DescrUnion {
    pub group_api: GroupApiDescr,
    pub coll_api: CollApiDescr,
    pub p2p_api: P2pApiDescr,
    pub coll: CollDescr,
    pub p2p: P2pDescr,
    pub ce_coll: CeCollDescr,
}

/// `ncclProfilerEventDescr_v6_t` (v5's is a prefix).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EventDescr {
    pub kind: u64,
    pub parent_obj: Vp,
    pub rank: c_int,
    pub u: DescrUnion,
}

type InitFn = unsafe extern "C" fn(
    *mut Vp,
    u64,
    *mut c_int,
    *const c_char,
    c_int,
    c_int,
    c_int,
    Logger,
) -> NcclResult;

/// `ncclProfiler_v6_t` and `ncclProfiler_v5_t` (the same entries).
#[repr(C)]
pub struct ProfilerTable {
    pub name: *const c_char,
    pub init: Option<InitFn>,
    pub start_event: Option<unsafe extern "C" fn(Vp, *mut Vp, *mut EventDescr) -> NcclResult>,
    pub stop_event: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub record_event_state: Option<unsafe extern "C" fn(Vp, c_int, Vp) -> NcclResult>,
    pub finalize: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
}

/// A profiler ABI version oxccl can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ProfilerVersion {
    V5 = 5,
    V6 = 6,
}

impl ProfilerVersion {
    /// Newest first: the order symbols are looked for.
    pub const NEWEST_FIRST: [ProfilerVersion; 2] = [ProfilerVersion::V6, ProfilerVersion::V5];

    /// The exported symbol of this version's table.
    pub fn symbol(self) -> &'static str {
        match self {
            ProfilerVersion::V5 => "ncclProfiler_v5",
            ProfilerVersion::V6 => "ncclProfiler_v6",
        }
    }
}

/// A loaded profiler library (never unloaded).
pub struct ProfilerLib {
    library: String,
    version: ProfilerVersion,
    name: String,
    table: &'static ProfilerTable,
}

// SAFETY: the table is immutable after load; NCCL calls a profiler from
// application and proxy threads, so plugins must allow it.
unsafe impl Send for ProfilerLib {}
// SAFETY: as above.
unsafe impl Sync for ProfilerLib {}

impl std::fmt::Debug for ProfilerLib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfilerLib")
            .field("library", &self.library)
            .field("version", &self.version)
            .field("name", &self.name)
            .finish()
    }
}

impl ProfilerLib {
    /// The profiler's name (its table's `name`).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The ABI version in use.
    pub fn version(&self) -> ProfilerVersion {
        self.version
    }
    /// The file it was loaded from.
    pub fn library(&self) -> &str {
        &self.library
    }
}

/// The files NCCL 2.30 tries for `NCCL_PROFILER_PLUGIN` (`None`: `none`):
/// unset, `libnccl-profiler.so`; a value, that name as given, then
/// `libnccl-profiler-<value>.so` unless it is a path or a `lib*.so` name.
pub fn profiler_candidates(value: Option<&str>) -> Option<Vec<String>> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Some(vec!["libnccl-profiler.so".to_string()]),
        Some(v) if v.eq_ignore_ascii_case("none") => None,
        Some(v) if v.contains('/') || (v.starts_with("lib") && v.ends_with(".so")) => {
            Some(vec![v.to_string()])
        }
        Some(v) => Some(vec![v.to_string(), format!("libnccl-profiler-{v}.so")]),
    }
}

fn load_file(file: &str) -> std::result::Result<ProfilerLib, (bool, String)> {
    let lib = crate::loader::open(file).map_err(|e| (false, e))?;
    let Some((version, sym)) =
        crate::loader::find_symbol(lib, ProfilerVersion::NEWEST_FIRST.map(|v| (v, v.symbol())))
    else {
        let v4 = crate::loader::find_symbol(lib, [((), "ncclProfiler_v4")]).is_some();
        return Err((
            true,
            if v4 {
                "it exports only ncclProfiler_v4, which oxccl does not drive (v6 and v5 only)"
                    .to_string()
            } else {
                "it exports none of the profiler versions oxccl knows (ncclProfiler_v6, ncclProfiler_v5)"
                    .to_string()
            },
        ));
    };
    // SAFETY: `sym` is the plugin's exported table of this version, which
    // lives as long as the library (never unloaded).
    let table: &'static ProfilerTable = unsafe { &*(sym as *const ProfilerTable) };
    let missing: Vec<&str> = [
        ("init", table.init.is_some()),
        ("startEvent", table.start_event.is_some()),
        ("stopEvent", table.stop_event.is_some()),
        ("recordEventState", table.record_event_state.is_some()),
        ("finalize", table.finalize.is_some()),
    ]
    .iter()
    .filter(|(_, ok)| !ok)
    .map(|(n, _)| *n)
    .collect();
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
    let name = if table.name.is_null() {
        "(unnamed)".to_string()
    } else {
        // SAFETY: the plugin's name is a NUL-terminated string in its table.
        unsafe { CStr::from_ptr(table.name) }
            .to_string_lossy()
            .into_owned()
    };
    Ok(ProfilerLib {
        library: file.to_string(),
        version,
        name,
        table,
    })
}

/// Loads the profiler `NCCL_PROFILER_PLUGIN` names, once per process and
/// value. When no candidate file opens, the network plugin's library
/// (`net_library`, already loaded) is searched for a profiler, as NCCL
/// does, silently. A named library that cannot be used gives one WARN
/// naming the file and why. `None`: no profiler.
pub fn load_profiler(value: Option<&str>, net_library: Option<&str>) -> Option<Arc<ProfilerLib>> {
    let candidates = profiler_candidates(value)?;
    let key = crate::loader::search_key(&candidates, net_library);
    type Cache = Mutex<HashMap<Vec<String>, Option<Arc<ProfilerLib>>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut g = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(o) = g.get(&key) {
        return o.clone();
    }
    let named = value.map(str::trim).is_some_and(|v| !v.is_empty());
    use crate::loader::Search;
    let outcome = match crate::loader::search_plugin(&candidates, net_library, load_file) {
        Search::File(p, file) => {
            oxccl_env::info!(
                Subsys::INIT,
                "PROFILER/Plugin: loaded {file}: profiler {} through {}",
                p.name,
                p.version.symbol()
            );
            Some(Arc::new(p))
        }
        Search::NetLibrary(p, net) => {
            oxccl_env::info!(
                Subsys::INIT,
                "PROFILER/Plugin: profiler {} found in the network plugin's library {net} ({})",
                p.name,
                p.version.symbol()
            );
            Some(Arc::new(p))
        }
        Search::Unusable(file, why) => {
            oxccl_env::warn!(
                "PROFILER/Plugin: profiler plugin {file} cannot be used: {why}; running without a profiler"
            );
            None
        }
        Search::NotFound(missing) => {
            if named && !missing.is_empty() {
                oxccl_env::warn!(
                    "PROFILER/Plugin: NCCL_PROFILER_PLUGIN={} not found ({}); running without a profiler",
                    value.unwrap_or_default().trim(),
                    missing.join("; ")
                );
            }
            None
        }
    };
    g.insert(key, outcome.clone());
    outcome
}

/// An event the plugin started (its handle; NULL handles are not kept).
#[derive(Debug)]
pub struct Event(ptr::NonNull<c_void>);

// SAFETY: NCCL stops events from threads other than the one that started
// them (its proxy thread), so plugins must allow it.
unsafe impl Send for Event {}

impl Event {
    /// The plugin's handle, for a child's `parentObj`.
    pub fn as_ptr(&self) -> Vp {
        self.0.as_ptr()
    }
}

/// A profiler's context for one communicator. `finalize` runs on drop.
pub struct ProfilerComm {
    lib: Arc<ProfilerLib>,
    ctx: Vp,
    mask: u64,
}

// SAFETY: the context is used by one communicator, behind its `&mut`.
unsafe impl Send for ProfilerComm {}

impl std::fmt::Debug for ProfilerComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfilerComm")
            .field("lib", &self.lib)
            .field("mask", &self.mask)
            .finish()
    }
}

impl ProfilerComm {
    /// Calls the plugin's `init` for rank `rank` of a communicator of
    /// `nranks` ranks on `nnodes` hosts. Err: the WARN's text (the
    /// communicator then runs without the profiler, as NCCL does).
    pub fn init(
        lib: Arc<ProfilerLib>,
        comm_id: u64,
        comm_name: &str,
        nnodes: usize,
        nranks: usize,
        rank: usize,
    ) -> std::result::Result<ProfilerComm, String> {
        let logger = crate::loader::plugin_logger();
        let mut ctx: Vp = ptr::null_mut();
        let mut mask: c_int = 0;
        let name = CString::new(comm_name.replace('\0', " ")).unwrap_or_default();
        let int = |v: usize| v.min(c_int::MAX as usize) as c_int;
        // SAFETY: entries checked present at load; out-pointers writable;
        // the name is a C string that outlives the call; the logger is valid
        // for the process.
        let rc = unsafe {
            (lib.table.init.unwrap_unchecked())(
                &mut ctx,
                comm_id,
                &mut mask,
                name.as_ptr(),
                int(nnodes),
                int(nranks),
                int(rank),
                logger,
            )
        };
        if rc != ffi::NCCL_SUCCESS {
            return Err(format!(
                "profiler {} ({}, {}): init returned {rc} ({})",
                lib.name,
                lib.library,
                lib.version.symbol(),
                ffi::result_name(rc)
            ));
        }
        Ok(ProfilerComm {
            lib,
            ctx,
            mask: mask as u32 as u64,
        })
    }

    /// The plugin's `eActivationMask`: the event kinds it wants.
    pub fn mask(&self) -> u64 {
        self.mask
    }

    /// Whether the plugin wants events of `kind` (a `PROFILE_*` bit).
    pub fn wants(&self, kind: u64) -> bool {
        self.mask & kind != 0
    }

    /// The library behind this context.
    pub fn lib(&self) -> &ProfilerLib {
        &self.lib
    }

    /// `startEvent` for `descr` when the plugin wants its kind. `None`: not
    /// wanted, refused, or no handle returned (then no stop either).
    pub fn start(&mut self, descr: &mut EventDescr) -> Option<Event> {
        if !self.wants(descr.kind) {
            return None;
        }
        let mut h: Vp = ptr::null_mut();
        // SAFETY: entry checked present at load; `descr` is a valid
        // descriptor whose strings are static; `h` is writable.
        let rc =
            unsafe { (self.lib.table.start_event.unwrap_unchecked())(self.ctx, &mut h, descr) };
        if rc != ffi::NCCL_SUCCESS {
            oxccl_env::info!(
                Subsys::INIT,
                "PROFILER/Plugin: {} startEvent returned {rc} ({})",
                self.lib.name,
                ffi::result_name(rc)
            );
            return None;
        }
        ptr::NonNull::new(h).map(Event)
    }

    /// `stopEvent`.
    pub fn stop(&mut self, e: Event) {
        // SAFETY: entry checked present at load; the handle came from this
        // plugin's startEvent and is stopped once (moved in).
        let rc = unsafe { (self.lib.table.stop_event.unwrap_unchecked())(e.as_ptr()) };
        if rc != ffi::NCCL_SUCCESS {
            oxccl_env::info!(
                Subsys::INIT,
                "PROFILER/Plugin: {} stopEvent returned {rc} ({})",
                self.lib.name,
                ffi::result_name(rc)
            );
        }
    }
}

impl Drop for ProfilerComm {
    fn drop(&mut self) {
        // SAFETY: entry checked present at load; `ctx` came from init and is
        // not used after this.
        let rc = unsafe { (self.lib.table.finalize.unwrap_unchecked())(self.ctx) };
        if rc != ffi::NCCL_SUCCESS {
            oxccl_env::info!(
                Subsys::INIT,
                "PROFILER/Plugin: {} finalize returned {rc} ({})",
                self.lib.name,
                ffi::result_name(rc)
            );
        }
    }
}

#[cfg(all(test, target_pointer_width = "64"))]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    // Counted by C's rules on LP64 from NCCL's field lists.
    #[test]
    fn descriptor_layout() {
        assert_eq!(offset_of!(EventDescr, rank), 16);
        assert_eq!(offset_of!(EventDescr, u), 24);
        // coll: seq 0, func 8, send 16, recv 24, count 32, root 40,
        // datatype 48, nChannels 56, nWarps 57, algo 64, proto 72, group 80.
        assert_eq!(offset_of!(CollDescr, n_channels), 56);
        assert_eq!(offset_of!(CollDescr, algo), 64);
        assert_eq!(size_of::<CollDescr>(), 88);
        assert_eq!(offset_of!(P2pDescr, peer), 32);
        assert_eq!(offset_of!(P2pDescr, parent_group), 40);
        // ceColl (the largest): ... syncStrategy 56, intraBatchSync 64,
        // batchSize 68, numBatches 72, ceSeqNum 76, stream 80.
        assert_eq!(size_of::<CeCollDescr>(), 88);
        assert_eq!(size_of::<EventDescr>(), 24 + 88);
        assert_eq!(size_of::<ProfilerTable>(), 8 * 6);
    }

    #[test]
    fn candidates_follow_nccl_2_30() {
        assert_eq!(
            profiler_candidates(None).unwrap(),
            vec!["libnccl-profiler.so".to_string()]
        );
        assert_eq!(profiler_candidates(Some("none")), None);
        assert_eq!(
            profiler_candidates(Some("x")).unwrap(),
            vec!["x".to_string(), "libnccl-profiler-x.so".to_string()]
        );
    }
}
