//! NCCL's tuner plugins (`ncclTunerPlugin_v6` down to `_v2`, the versions
//! NCCL 2.30 loads): finding the library by `NCCL_TUNER_PLUGIN`'s rules,
//! the newest table it exports, and [`TunerComm`], one plugin context per
//! communicator (`init` with its rank and node counts, `getCollInfo` per
//! collective, `finalize` when dropped).
//!
//! What the table means and how its answer becomes a plan is pure and lives
//! in `oxccl_core::tuner_plugin`; this module only calls the plugin.
//!
//! | version | `init` | `getCollInfo` |
//! | --- | --- | --- |
//! | v2 | `(nRanks, nNodes, logger, &ctx)` | returns an algorithm and a protocol (no cost table) |
//! | v3 | as v2 | fills the cost table |
//! | v4 | as v2 | also told whether user buffers are registered (`regBuff`) |
//! | v5 | `(&ctx, commId, nRanks, nNodes, logger, nvlDomainInfo, constants)`; `destroy` renamed `finalize` | as v4 |
//! | v6 | as v5 | as v4; an optional `getChunkSize` (oxccl's slices are its own: not called) |

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr;
use std::sync::{Arc, Mutex, OnceLock};

use oxccl_core::tuner_plugin::{CostTable, IGNORE, NUM_ALGORITHMS, NUM_PROTOCOLS};
use oxccl_env::Subsys;

use crate::ffi::{self, Logger, NcclResult};

type Vp = *mut c_void;
type Vpp = *mut *mut c_void;

/// `ncclNvlDomainInfo_v5_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct NvlDomainInfo {
    pub n_nvl_domains: c_int,
    pub min_ranks_per_nvl_domain: c_int,
    pub max_ranks_per_nvl_domain: c_int,
}

/// `ncclTunerConstants_v5_t`: NCCL's model constants in doubles (base and
/// per-link latencies per algorithm and protocol, bandwidth caps per compute
/// capability and scale). oxccl's model has none of them: zeros go in and
/// whatever the plugin writes is not read.
#[repr(C)]
pub struct TunerConstants {
    pub base_latencies: [[f64; 3]; 7],
    pub hw_latencies: [[[f64; 3]; 7]; 3],
    pub ll_max_bws: [[f64; 3]; 4],
    pub per_ch_max_ring_ll128_bws: [[f64; 3]; 4],
    pub per_ch_max_tree_ll128_bws: [[f64; 3]; 4],
    pub per_ch_max_tree_bws: [[f64; 3]; 4],
    pub per_ch_max_nvls_tree_bws: [[f64; 3]; 4],
}

type InitV2 = unsafe extern "C" fn(usize, usize, Logger, Vpp) -> NcclResult;
type InitV5 = unsafe extern "C" fn(
    Vpp,
    u64,
    usize,
    usize,
    Logger,
    *mut NvlDomainInfo,
    *mut TunerConstants,
) -> NcclResult;
type Finalize = unsafe extern "C" fn(Vp) -> NcclResult;

/// `ncclTuner_v2_t`.
#[repr(C)]
pub struct TunerV2 {
    pub name: *const c_char,
    pub init: Option<InitV2>,
    #[allow(clippy::type_complexity)]
    pub get_coll_info: Option<
        unsafe extern "C" fn(
            Vp,
            c_int,
            usize,
            c_int,
            c_int,
            c_int,
            *mut c_int,
            *mut c_int,
            *mut c_int,
        ) -> NcclResult,
    >,
    pub destroy: Option<Finalize>,
}

/// `ncclTuner_v3_t`.
#[repr(C)]
pub struct TunerV3 {
    pub name: *const c_char,
    pub init: Option<InitV2>,
    #[allow(clippy::type_complexity)]
    pub get_coll_info: Option<
        unsafe extern "C" fn(
            Vp,
            c_int,
            usize,
            c_int,
            *mut *mut f32,
            c_int,
            c_int,
            *mut c_int,
        ) -> NcclResult,
    >,
    pub destroy: Option<Finalize>,
}

type GetCollInfoV4 = unsafe extern "C" fn(
    Vp,
    c_int,
    usize,
    c_int,
    *mut *mut f32,
    c_int,
    c_int,
    c_int,
    *mut c_int,
) -> NcclResult;

/// `ncclTuner_v4_t`.
#[repr(C)]
pub struct TunerV4 {
    pub name: *const c_char,
    pub init: Option<InitV2>,
    pub get_coll_info: Option<GetCollInfoV4>,
    pub destroy: Option<Finalize>,
}

/// `ncclTuner_v5_t`.
#[repr(C)]
pub struct TunerV5 {
    pub name: *const c_char,
    pub init: Option<InitV5>,
    pub get_coll_info: Option<GetCollInfoV4>,
    pub finalize: Option<Finalize>,
}

/// `ncclTuner_v6_t`.
#[repr(C)]
pub struct TunerV6 {
    pub name: *const c_char,
    pub init: Option<InitV5>,
    pub get_coll_info: Option<GetCollInfoV4>,
    pub finalize: Option<Finalize>,
    pub get_chunk_size: Option<
        unsafe extern "C" fn(Vp, c_int, usize, c_int, c_int, c_int, *mut usize) -> NcclResult,
    >,
}

/// A tuner ABI version oxccl can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TunerVersion {
    V2 = 2,
    V3 = 3,
    V4 = 4,
    V5 = 5,
    V6 = 6,
}

impl TunerVersion {
    /// Newest first: the order symbols are looked for.
    pub const NEWEST_FIRST: [TunerVersion; 5] = [
        TunerVersion::V6,
        TunerVersion::V5,
        TunerVersion::V4,
        TunerVersion::V3,
        TunerVersion::V2,
    ];

    /// The exported symbol of this version's table.
    pub fn symbol(self) -> &'static str {
        match self {
            TunerVersion::V2 => "ncclTunerPlugin_v2",
            TunerVersion::V3 => "ncclTunerPlugin_v3",
            TunerVersion::V4 => "ncclTunerPlugin_v4",
            TunerVersion::V5 => "ncclTunerPlugin_v5",
            TunerVersion::V6 => "ncclTunerPlugin_v6",
        }
    }
}

#[derive(Clone, Copy)]
enum Table {
    V2(&'static TunerV2),
    V3(&'static TunerV3),
    V4(&'static TunerV4),
    V5(&'static TunerV5),
    V6(&'static TunerV6),
}

/// A loaded tuner library (never unloaded: plugins keep global state).
pub struct TunerLib {
    library: String,
    version: TunerVersion,
    name: String,
    table: Table,
}

// SAFETY: the table is immutable after load; NCCL calls a tuner from any
// thread that enqueues, so plugins must allow it.
unsafe impl Send for TunerLib {}
// SAFETY: as above; a context is used by one communicator at a time
// (`TunerComm` is not `Sync`).
unsafe impl Sync for TunerLib {}

impl std::fmt::Debug for TunerLib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunerLib")
            .field("library", &self.library)
            .field("version", &self.version)
            .field("name", &self.name)
            .finish()
    }
}

impl TunerLib {
    /// The tuner's name (its table's `name`).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The file it was loaded from.
    pub fn library(&self) -> &str {
        &self.library
    }
    /// The ABI version in use.
    pub fn version(&self) -> TunerVersion {
        self.version
    }
}

/// The files NCCL 2.30 tries for `NCCL_TUNER_PLUGIN` (`None`: `none`, no
/// tuner): unset, `libnccl-tuner.so`; a value, that name as given, then
/// `libnccl-tuner-<value>.so` unless the value is a path (has a `/`) or a
/// library name (`lib*.so`).
pub fn tuner_candidates(value: Option<&str>) -> Option<Vec<String>> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Some(vec!["libnccl-tuner.so".to_string()]),
        Some(v) if v.eq_ignore_ascii_case("none") => None,
        Some(v) if v.contains('/') || (v.starts_with("lib") && v.ends_with(".so")) => {
            Some(vec![v.to_string()])
        }
        Some(v) => Some(vec![v.to_string(), format!("libnccl-tuner-{v}.so")]),
    }
}

fn read_name(p: *const c_char) -> String {
    if p.is_null() {
        "(unnamed)".to_string()
    } else {
        // SAFETY: the plugin's name is a NUL-terminated string in its table.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Opens one library and finds its table: Err((opened, why)).
fn load_file(file: &str) -> std::result::Result<TunerLib, (bool, String)> {
    let lib = crate::loader::open(file).map_err(|e| (false, e))?;
    let Some((version, sym)) = crate::loader::find_symbol(
        lib,
        TunerVersion::NEWEST_FIRST.iter().map(|v| (*v, v.symbol())),
    ) else {
        let known: Vec<&str> = TunerVersion::NEWEST_FIRST
            .iter()
            .map(|v| v.symbol())
            .collect();
        return Err((
            true,
            format!(
                "it exports none of the tuner versions oxccl knows ({}); it may be older than v2 or newer than v6",
                known.join(", ")
            ),
        ));
    };
    // SAFETY: `sym` is the address of the plugin's exported table of this
    // version, which lives as long as the library (never unloaded).
    let table = unsafe {
        match version {
            TunerVersion::V2 => Table::V2(&*(sym as *const TunerV2)),
            TunerVersion::V3 => Table::V3(&*(sym as *const TunerV3)),
            TunerVersion::V4 => Table::V4(&*(sym as *const TunerV4)),
            TunerVersion::V5 => Table::V5(&*(sym as *const TunerV5)),
            TunerVersion::V6 => Table::V6(&*(sym as *const TunerV6)),
        }
    };
    let (name, missing) = match table {
        Table::V2(t) => (
            t.name,
            missing(&[
                ("init", t.init.is_some()),
                ("getCollInfo", t.get_coll_info.is_some()),
                ("destroy", t.destroy.is_some()),
            ]),
        ),
        Table::V3(t) => (
            t.name,
            missing(&[
                ("init", t.init.is_some()),
                ("getCollInfo", t.get_coll_info.is_some()),
                ("destroy", t.destroy.is_some()),
            ]),
        ),
        Table::V4(t) => (
            t.name,
            missing(&[
                ("init", t.init.is_some()),
                ("getCollInfo", t.get_coll_info.is_some()),
                ("destroy", t.destroy.is_some()),
            ]),
        ),
        Table::V5(t) => (
            t.name,
            missing(&[
                ("init", t.init.is_some()),
                ("getCollInfo", t.get_coll_info.is_some()),
                ("finalize", t.finalize.is_some()),
            ]),
        ),
        Table::V6(t) => (
            t.name,
            missing(&[
                ("init", t.init.is_some()),
                ("getCollInfo", t.get_coll_info.is_some()),
                ("finalize", t.finalize.is_some()),
            ]),
        ),
    };
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
    Ok(TunerLib {
        library: file.to_string(),
        version,
        name: read_name(name),
        table,
    })
}

fn missing(entries: &[(&'static str, bool)]) -> Vec<&'static str> {
    entries
        .iter()
        .filter(|(_, present)| !present)
        .map(|(n, _)| *n)
        .collect()
}

/// Loads the tuner `NCCL_TUNER_PLUGIN` names (its value: `value`), once per
/// process and value. When no candidate file opens, the network plugin's
/// library (`net_library`, already loaded) is searched for a tuner, as NCCL
/// does, silently. A library that is named but cannot be used gives one
/// WARN naming the file and why; unset and no tuner anywhere: silence.
/// `None`: no tuner (oxccl's own model decides).
pub fn load_tuner(value: Option<&str>, net_library: Option<&str>) -> Option<Arc<TunerLib>> {
    let candidates = tuner_candidates(value)?;
    let key = crate::loader::search_key(&candidates, net_library);
    type Cache = Mutex<HashMap<Vec<String>, Option<Arc<TunerLib>>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut g = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(o) = g.get(&key) {
        return o.clone();
    }
    let named = value.map(str::trim).is_some_and(|v| !v.is_empty());
    use crate::loader::Search;
    let outcome = match crate::loader::search_plugin(&candidates, net_library, load_file) {
        Search::File(t, file) => {
            oxccl_env::info!(
                Subsys::INIT | Subsys::TUNING,
                "TUNER/Plugin: loaded {file}: tuner {} through {}",
                t.name,
                t.version.symbol()
            );
            Some(Arc::new(t))
        }
        Search::NetLibrary(t, net) => {
            oxccl_env::info!(
                Subsys::INIT | Subsys::TUNING,
                "TUNER/Plugin: tuner {} found in the network plugin's library {net} ({})",
                t.name,
                t.version.symbol()
            );
            Some(Arc::new(t))
        }
        Search::Unusable(file, why) => {
            oxccl_env::warn!(
                "TUNER/Plugin: tuner plugin {file} cannot be used: {why}; oxccl's own tuning decides"
            );
            None
        }
        Search::NotFound(missing) if missing.is_empty() => None,
        Search::NotFound(missing) => {
            if named {
                oxccl_env::warn!(
                    "TUNER/Plugin: NCCL_TUNER_PLUGIN={} not found ({}); oxccl's own tuning decides",
                    value.unwrap_or_default().trim(),
                    missing.join("; ")
                );
            } else {
                oxccl_env::info!(
                    Subsys::INIT | Subsys::TUNING,
                    "TUNER/Plugin: no libnccl-tuner.so; oxccl's own tuning decides"
                );
            }
            None
        }
    };
    g.insert(key, outcome.clone());
    outcome
}

/// A tuner's context for one communicator. `finalize` (v2-v4: `destroy`)
/// runs on drop.
pub struct TunerComm {
    lib: Arc<TunerLib>,
    ctx: *mut c_void,
}

// SAFETY: NCCL calls a context from whichever thread enqueues for its
// communicator; the type is not `Sync`, so calls on one context never overlap.
unsafe impl Send for TunerComm {}

impl std::fmt::Debug for TunerComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunerComm").field("lib", &self.lib).finish()
    }
}

impl TunerComm {
    /// Calls the plugin's `init` for a communicator of `nranks` ranks on
    /// `nnodes` hosts (`local_min`/`local_max`: fewest and most ranks of one
    /// host, given to v5 and later as the NVLink domains). Err: the WARN's
    /// text (the communicator then runs without the tuner, as NCCL does).
    pub fn init(
        lib: Arc<TunerLib>,
        comm_id: u64,
        nranks: usize,
        nnodes: usize,
        local_min: usize,
        local_max: usize,
    ) -> std::result::Result<TunerComm, String> {
        let logger = crate::loader::plugin_logger();
        let mut ctx: *mut c_void = ptr::null_mut();
        let mut domains = NvlDomainInfo {
            n_nvl_domains: nnodes.min(c_int::MAX as usize) as c_int,
            min_ranks_per_nvl_domain: local_min.min(c_int::MAX as usize) as c_int,
            max_ranks_per_nvl_domain: local_max.min(c_int::MAX as usize) as c_int,
        };
        // SAFETY: all-zero doubles are a valid value of this plain C struct.
        let mut constants: Box<TunerConstants> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: entries checked present at load; every pointer argument is
        // writable and outlives the call; the logger is valid for the process.
        let rc = unsafe {
            match lib.table {
                Table::V2(t) => (t.init.unwrap_unchecked())(nranks, nnodes, logger, &mut ctx),
                Table::V3(t) => (t.init.unwrap_unchecked())(nranks, nnodes, logger, &mut ctx),
                Table::V4(t) => (t.init.unwrap_unchecked())(nranks, nnodes, logger, &mut ctx),
                Table::V5(t) => (t.init.unwrap_unchecked())(
                    &mut ctx,
                    comm_id,
                    nranks,
                    nnodes,
                    logger,
                    &mut domains,
                    &mut *constants,
                ),
                Table::V6(t) => (t.init.unwrap_unchecked())(
                    &mut ctx,
                    comm_id,
                    nranks,
                    nnodes,
                    logger,
                    &mut domains,
                    &mut *constants,
                ),
            }
        };
        if rc != ffi::NCCL_SUCCESS {
            return Err(format!(
                "tuner {} ({}, {}): init returned {rc} ({})",
                lib.name,
                lib.library,
                lib.version.symbol(),
                ffi::result_name(rc)
            ));
        }
        Ok(TunerComm { lib, ctx })
    }

    /// The library behind this context.
    pub fn lib(&self) -> &TunerLib {
        &self.lib
    }

    /// `getCollInfo` for a collective (`func`: NCCL's `ncclFunc_t`) of
    /// `bytes`, one operation in the group, user buffers not registered:
    /// `table` in and out, the plugin's channel count (0: unset) back.
    /// Err: the call failed (the caller keeps its own plan).
    pub fn get_coll_info(
        &mut self,
        func: i32,
        bytes: usize,
        table: &mut CostTable,
    ) -> std::result::Result<i32, String> {
        let ctx = self.ctx;
        let mut nch: c_int = 0;
        let rows = table.as_mut_ptr().cast::<f32>();
        // NCCL passes `(float**)collCostTable`: a 2-D array's address cast
        // to `float**`, which plugins cast back to `float (*)[NUM_PROTOCOLS]`.
        let as_pp = rows.cast::<*mut f32>();
        let (na, np) = (NUM_ALGORITHMS as c_int, NUM_PROTOCOLS as c_int);
        let pipe_ops: c_int = 1;
        let reg_buff: c_int = 0;
        // SAFETY: entries checked present at load; `table` is the
        // NUM_ALGORITHMS x NUM_PROTOCOLS floats the ABI describes; out-pointers
        // are writable; `ctx` is the one init returned.
        let rc = unsafe {
            match self.lib.table {
                Table::V2(t) => {
                    let (mut algo, mut proto): (c_int, c_int) = (-1, -1);
                    let rc = (t.get_coll_info.unwrap_unchecked())(
                        ctx, func, bytes, 0, 0, pipe_ops, &mut algo, &mut proto, &mut nch,
                    );
                    // v2 names a choice; NCCL turns it into a zero cost.
                    if let (Ok(a), Ok(p)) = (usize::try_from(algo), usize::try_from(proto)) {
                        if a < NUM_ALGORITHMS && p < NUM_PROTOCOLS && table[a][p] != IGNORE {
                            table[a][p] = 0.0;
                        }
                    }
                    rc
                }
                Table::V3(t) => (t.get_coll_info.unwrap_unchecked())(
                    ctx, func, bytes, pipe_ops, as_pp, na, np, &mut nch,
                ),
                Table::V4(t) => (t.get_coll_info.unwrap_unchecked())(
                    ctx, func, bytes, pipe_ops, as_pp, na, np, reg_buff, &mut nch,
                ),
                Table::V5(t) => (t.get_coll_info.unwrap_unchecked())(
                    ctx, func, bytes, pipe_ops, as_pp, na, np, reg_buff, &mut nch,
                ),
                Table::V6(t) => (t.get_coll_info.unwrap_unchecked())(
                    ctx, func, bytes, pipe_ops, as_pp, na, np, reg_buff, &mut nch,
                ),
            }
        };
        if rc != ffi::NCCL_SUCCESS {
            return Err(format!(
                "tuner {}: getCollInfo returned {rc} ({})",
                self.lib.name,
                ffi::result_name(rc)
            ));
        }
        Ok(nch)
    }
}

impl Drop for TunerComm {
    fn drop(&mut self) {
        // SAFETY: entries checked present at load; `ctx` came from init and
        // is not used after this.
        let rc = unsafe {
            match self.lib.table {
                Table::V2(t) => (t.destroy.unwrap_unchecked())(self.ctx),
                Table::V3(t) => (t.destroy.unwrap_unchecked())(self.ctx),
                Table::V4(t) => (t.destroy.unwrap_unchecked())(self.ctx),
                Table::V5(t) => (t.finalize.unwrap_unchecked())(self.ctx),
                Table::V6(t) => (t.finalize.unwrap_unchecked())(self.ctx),
            }
        };
        if rc != ffi::NCCL_SUCCESS {
            oxccl_env::info!(
                Subsys::INIT | Subsys::TUNING,
                "TUNER/Plugin: tuner {} finalize returned {rc} ({})",
                self.lib.name,
                ffi::result_name(rc)
            );
        }
    }
}

#[cfg(all(test, target_pointer_width = "64"))]
mod tests {
    use super::*;
    use std::mem::size_of;

    #[test]
    fn layouts() {
        assert_eq!(size_of::<TunerV2>(), 8 * 4);
        assert_eq!(size_of::<TunerV5>(), 8 * 4);
        assert_eq!(size_of::<TunerV6>(), 8 * 5);
        // 21 + 63 + 5 * 12 doubles.
        assert_eq!(size_of::<TunerConstants>(), 144 * 8);
        assert_eq!(size_of::<NvlDomainInfo>(), 12);
        assert_eq!(size_of::<CostTable>(), 7 * 3 * 4);
    }

    #[test]
    fn candidates_follow_nccl_2_30() {
        assert_eq!(
            tuner_candidates(None).unwrap(),
            vec!["libnccl-tuner.so".to_string()]
        );
        assert_eq!(tuner_candidates(Some("none")), None);
        assert_eq!(tuner_candidates(Some("NONE")), None);
        assert_eq!(
            tuner_candidates(Some("foo")).unwrap(),
            vec!["foo".to_string(), "libnccl-tuner-foo.so".to_string()]
        );
        assert_eq!(
            tuner_candidates(Some("/opt/t.so")).unwrap(),
            vec!["/opt/t.so".to_string()]
        );
        assert_eq!(
            tuner_candidates(Some("libmine.so")).unwrap(),
            vec!["libmine.so".to_string()]
        );
    }
}
