//! NCCL's profiler plugins (`ncclProfiler_v6` down to `_v1`, the versions
//! NCCL 2.30 loads, newest first): finding the library by
//! `NCCL_PROFILER_PLUGIN`'s rules, and [`ProfilerComm`], one plugin context
//! per communicator (`init` returns the events the plugin wants,
//! `startEvent` / `stopEvent` / `recordEventState` per event, `finalize`
//! when dropped).
//!
//! Callers describe events in the newest descriptor ([`EventDescr`], v6).
//! v5 and v6 share their entry points and the descriptor up to v5's
//! members; v6 adds copy-engine members to the union (oxccl passes the v6
//! size, which a v5 plugin reads a prefix of). Older versions get their own
//! descriptor, translated by [`to_v4`], [`to_v3`], [`to_v2`] and [`to_v1`]:
//! a one-byte `type`; the collective's or point-to-point's parent is its
//! group (`parentObj`, where v5 added `parentGroup`); v1-v3 have `name` and
//! `commHash` members NCCL leaves NULL and 0; v1 numbers the function,
//! datatype, algorithm and protocol instead of naming them. Event kinds a
//! version does not know are not started, and bits it does not know are
//! cleared from its activation mask. v1-v3's `init` takes only the context
//! and the mask; v4's takes the communicator's hash after its name.

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
/// `ncclProfileProxyCtrl`.
pub const PROFILE_PROXY_CTRL: u64 = 1 << 5;
/// `ncclProfileKernelCh`.
pub const PROFILE_KERNEL_CH: u64 = 1 << 6;
/// `ncclProfileNetPlugin`.
pub const PROFILE_NET_PLUGIN: u64 = 1 << 7;
/// `ncclProfileGroupApi`: `ncclGroupStart` to `ncclGroupEnd`.
pub const PROFILE_GROUP_API: u64 = 1 << 8;
/// `ncclProfileCollApi`: a collective call.
pub const PROFILE_COLL_API: u64 = 1 << 9;
/// `ncclProfileP2pApi`: a send or receive call.
pub const PROFILE_P2P_API: u64 = 1 << 10;
/// `ncclProfileKernelLaunch`.
pub const PROFILE_KERNEL_LAUNCH: u64 = 1 << 11;
/// `ncclProfileCeColl`, `ncclProfileCeSync`, `ncclProfileCeBatch` (v6).
pub const PROFILE_CE: u64 = (1 << 12) | (1 << 13) | (1 << 14);

/// `ncclProfilerProxyOpInProgress_v4`: a proxy operation began (v4 on).
pub const STATE_PROXY_OP_IN_PROGRESS: c_int = 19;
/// `ncclProfilerProxyStepSendPeerWait_v4`: a send step waits for room at
/// the receiver (v4 on).
pub const STATE_SEND_PEER_WAIT: c_int = 20;
/// `ncclProfilerProxyStepSendWait`: a send step's bytes are on their way.
pub const STATE_SEND_WAIT: c_int = 9;
/// `ncclProfilerProxyStepRecvWait`: a receive step waits for its bytes.
pub const STATE_RECV_WAIT: c_int = 10;

/// `ncclProfilerGroupStartApiStop`: the group's start call returned (the
/// operations are being enqueued).
pub const STATE_GROUP_START_API_STOP: c_int = 23;
/// `ncclProfilerGroupEndApiStart`: the group's end call began (the
/// operations are about to run).
pub const STATE_GROUP_END_API_START: c_int = 24;

/// The kinds of a plugin's activation mask that make oxccl start an event
/// of `kind`, by NCCL's rules: an event is started when its own kind or a
/// kind of its descendants is wanted, so that every event a plugin asked
/// for has the parents NCCL gives it (a plugin asking for collectives also
/// gets the group API, collective API and group events above them, and
/// decides itself what to keep of those).
pub const fn enabled_by(kind: u64) -> u64 {
    // Below a collective or point-to-point operation.
    const OP_CHILDREN: u64 =
        PROFILE_PROXY_OP | PROFILE_PROXY_STEP | PROFILE_KERNEL_CH | PROFILE_NET_PLUGIN;
    match kind {
        PROFILE_GROUP_API => {
            PROFILE_GROUP_API
                | PROFILE_COLL_API
                | PROFILE_P2P_API
                | PROFILE_KERNEL_LAUNCH
                | PROFILE_GROUP
                | PROFILE_COLL
                | PROFILE_P2P
                | OP_CHILDREN
                | PROFILE_CE
        }
        PROFILE_COLL_API => PROFILE_COLL_API | PROFILE_COLL | OP_CHILDREN | PROFILE_CE,
        PROFILE_P2P_API => PROFILE_P2P_API | PROFILE_P2P | OP_CHILDREN,
        PROFILE_GROUP => PROFILE_GROUP | PROFILE_COLL | PROFILE_P2P | OP_CHILDREN,
        PROFILE_COLL => PROFILE_COLL | OP_CHILDREN,
        PROFILE_P2P => PROFILE_P2P | OP_CHILDREN,
        PROFILE_PROXY_OP => PROFILE_PROXY_OP | PROFILE_PROXY_STEP | PROFILE_NET_PLUGIN,
        PROFILE_PROXY_STEP => PROFILE_PROXY_STEP | PROFILE_NET_PLUGIN,
        k => k,
    }
}

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

/// `kernelLaunch` member (v5, v6).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelLaunchDescr {
    pub stream: Vp,
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

/// `proxyOp` member (the same in every version): one network transfer of
/// an operation, to or from one peer on one channel.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProxyOpDescr {
    pub pid: i32,
    pub channel_id: u8,
    pub peer: c_int,
    pub n_steps: c_int,
    pub chunk_size: c_int,
    pub is_send: c_int,
}

/// `proxyStep` member (the same in every version).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProxyStepDescr {
    pub step: c_int,
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
    pub kernel_launch: KernelLaunchDescr,
    pub coll: CollDescr,
    pub p2p: P2pDescr,
    pub proxy_op: ProxyOpDescr,
    pub proxy_step: ProxyStepDescr,
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

/// `coll` member of `ncclProfilerEventDescr_v4_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CollDescrV4 {
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
}

/// `p2p` member of `ncclProfilerEventDescr_v4_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct P2pDescrV4 {
    pub func: *const c_char,
    pub buff: Vp,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
    pub n_channels: u8,
}

/// The union of `ncclProfilerEventDescr_v4_t` with the members oxccl
/// fills (the proxy, kernel-channel and net-plugin members are smaller).
#[repr(C)]
#[derive(Clone, Copy)]
pub union DescrUnionV4 {
    pub coll: CollDescrV4,
    pub p2p: P2pDescrV4,
    pub proxy_op: ProxyOpDescr,
    pub proxy_step: ProxyStepDescr,
}

/// `ncclProfilerEventDescr_v4_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EventDescrV4 {
    pub kind: u8,
    pub parent_obj: Vp,
    pub rank: c_int,
    pub u: DescrUnionV4,
}

/// `coll` member of `ncclProfilerEventDescr_v3_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CollDescrV3 {
    pub name: *const c_char,
    pub comm_hash: u64,
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: Vp,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub n_max_channels: u8,
    pub n_warps: u8,
    pub algo: *const c_char,
    pub proto: *const c_char,
}

/// `p2p` member of `ncclProfilerEventDescr_v2_t` and `_v3_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct P2pDescrV2 {
    pub name: *const c_char,
    pub comm_hash: u64,
    pub func: *const c_char,
    pub buff: Vp,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
}

/// The union of `ncclProfilerEventDescr_v3_t` with the members oxccl fills.
#[repr(C)]
#[derive(Clone, Copy)]
pub union DescrUnionV3 {
    pub coll: CollDescrV3,
    pub p2p: P2pDescrV2,
    pub proxy_op: ProxyOpDescr,
    pub proxy_step: ProxyStepDescr,
}

/// `ncclProfilerEventDescr_v3_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EventDescrV3 {
    pub kind: u8,
    pub parent_obj: Vp,
    pub rank: c_int,
    pub u: DescrUnionV3,
}

/// `coll` member of `ncclProfilerEventDescr_v2_t` (v3's with
/// `trafficBytes`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CollDescrV2 {
    pub name: *const c_char,
    pub comm_hash: u64,
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: Vp,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub traffic_bytes: usize,
    pub n_max_channels: u8,
    pub n_warps: u8,
    pub algo: *const c_char,
    pub proto: *const c_char,
}

/// The union of `ncclProfilerEventDescr_v2_t` with the members oxccl fills.
#[repr(C)]
#[derive(Clone, Copy)]
pub union DescrUnionV2 {
    pub coll: CollDescrV2,
    pub p2p: P2pDescrV2,
    pub proxy_op: ProxyOpDescr,
    pub proxy_step: ProxyStepDescr,
}

/// `ncclProfilerEventDescr_v2_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EventDescrV2 {
    pub kind: u8,
    pub parent_obj: Vp,
    pub rank: c_int,
    pub u: DescrUnionV2,
}

/// `coll` member of `ncclProfilerEventDescr_v1_t`: function, datatype,
/// algorithm and protocol as numbers (`ncclFunc_t`, `ncclDataType_t`,
/// `NCCL_ALGO_*`, `NCCL_PROTO_*`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CollDescrV1 {
    pub name: *const c_char,
    pub comm_hash: u64,
    pub seq_number: u64,
    pub func: u8,
    pub send_buff: *const c_void,
    pub recv_buff: Vp,
    pub count: usize,
    pub root: c_int,
    pub datatype: u8,
    pub op: u32,
    pub traffic_bytes: usize,
    pub n_max_channels: u8,
    pub n_warps: u8,
    pub algo: u8,
    pub proto: u8,
    pub is_collnet: c_int,
    pub is_nvls: c_int,
}

/// `p2p` member of `ncclProfilerEventDescr_v1_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct P2pDescrV1 {
    pub name: *const c_char,
    pub comm_hash: u64,
    pub func: u8,
    pub buff: Vp,
    pub datatype: u8,
    pub count: usize,
    pub peer: c_int,
}

/// The union of `ncclProfilerEventDescr_v1_t` with the members oxccl fills.
#[repr(C)]
#[derive(Clone, Copy)]
pub union DescrUnionV1 {
    pub coll: CollDescrV1,
    pub p2p: P2pDescrV1,
    pub proxy_op: ProxyOpDescr,
    pub proxy_step: ProxyStepDescr,
}

/// `ncclProfilerEventDescr_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EventDescrV1 {
    pub kind: u8,
    pub parent_obj: Vp,
    pub rank: c_int,
    pub u: DescrUnionV1,
}

/// `init` of v5 and v6: `(context, commId, eActivationMask, commName,
/// nNodes, nranks, rank, logfn)`.
pub type InitFn = unsafe extern "C" fn(
    *mut Vp,
    u64,
    *mut c_int,
    *const c_char,
    c_int,
    c_int,
    c_int,
    Logger,
) -> NcclResult;

/// `init` of v4: `(context, eActivationMask, commName, commHash, nNodes,
/// nranks, rank, logfn)`.
pub type InitFnV4 = unsafe extern "C" fn(
    *mut Vp,
    *mut c_int,
    *const c_char,
    u64,
    c_int,
    c_int,
    c_int,
    Logger,
) -> NcclResult;

/// `init` of v1 to v3: `(context, eActivationMask)`.
pub type InitFnV1 = unsafe extern "C" fn(*mut Vp, *mut c_int) -> NcclResult;

/// `proxyOp` member of `ncclProfilerEventStateArgs_v1_t` (v1 to v3).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProxyOpStateV1 {
    pub trans_size: usize,
    pub steps: c_int,
}

/// `ncclProfilerEventStateArgs_v1_t`, also v2's and v3's.
#[repr(C)]
#[derive(Clone, Copy)]
pub union StateArgsV1 {
    pub proxy_op: ProxyOpStateV1,
    /// `proxyCtrl.appendedProxyOps`.
    pub appended_proxy_ops: c_int,
}

/// `ncclProfilerEventStateArgs_v4_t`, also v5's and v6's: one member each
/// (`proxyStep.transSize`, `proxyCtrl.appendedProxyOps`,
/// `netPlugin.data`, `kernelCh.pTimer`).
#[repr(C)]
#[derive(Clone, Copy)]
pub union StateArgsV4 {
    pub trans_size: usize,
    pub appended_proxy_ops: c_int,
    pub net_plugin_data: Vp,
    pub p_timer: u64,
}

/// An `ncclProfiler_vN_t` table: `init` of type `I`, `startEvent` taking a
/// descriptor `D`, `recordEventState` taking the state (an
/// `ncclProfilerEventState_t`, an int) and arguments `A`.
#[repr(C)]
pub struct Table<I, D, A> {
    pub name: *const c_char,
    pub init: Option<I>,
    pub start_event: Option<unsafe extern "C" fn(Vp, *mut Vp, *mut D) -> NcclResult>,
    pub stop_event: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
    pub record_event_state: Option<unsafe extern "C" fn(Vp, c_int, *mut A) -> NcclResult>,
    pub finalize: Option<unsafe extern "C" fn(Vp) -> NcclResult>,
}

/// `ncclProfiler_v6_t` and `ncclProfiler_v5_t` (the same entries).
pub type ProfilerTable = Table<InitFn, EventDescr, StateArgsV4>;
/// `ncclProfiler_v4_t`.
pub type ProfilerTableV4 = Table<InitFnV4, EventDescrV4, StateArgsV4>;
/// `ncclProfiler_v3_t`.
pub type ProfilerTableV3 = Table<InitFnV1, EventDescrV3, StateArgsV1>;
/// `ncclProfiler_v2_t`.
pub type ProfilerTableV2 = Table<InitFnV1, EventDescrV2, StateArgsV1>;
/// `ncclProfiler_v1_t`.
pub type ProfilerTableV1 = Table<InitFnV1, EventDescrV1, StateArgsV1>;

impl<I, D, A> Table<I, D, A> {
    /// The entries that are NULL, by NCCL's names.
    fn missing(&self) -> Vec<&'static str> {
        [
            ("init", self.init.is_some()),
            ("startEvent", self.start_event.is_some()),
            ("stopEvent", self.stop_event.is_some()),
            ("recordEventState", self.record_event_state.is_some()),
            ("finalize", self.finalize.is_some()),
        ]
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(n, _)| *n)
        .collect()
    }
}

/// A profiler ABI version oxccl can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ProfilerVersion {
    V1 = 1,
    V2 = 2,
    V3 = 3,
    V4 = 4,
    V5 = 5,
    V6 = 6,
}

impl ProfilerVersion {
    /// Newest first: the order symbols are looked for.
    pub const NEWEST_FIRST: [ProfilerVersion; 6] = [
        ProfilerVersion::V6,
        ProfilerVersion::V5,
        ProfilerVersion::V4,
        ProfilerVersion::V3,
        ProfilerVersion::V2,
        ProfilerVersion::V1,
    ];

    /// The exported symbol of this version's table.
    pub fn symbol(self) -> &'static str {
        match self {
            ProfilerVersion::V1 => "ncclProfiler_v1",
            ProfilerVersion::V2 => "ncclProfiler_v2",
            ProfilerVersion::V3 => "ncclProfiler_v3",
            ProfilerVersion::V4 => "ncclProfiler_v4",
            ProfilerVersion::V5 => "ncclProfiler_v5",
            ProfilerVersion::V6 => "ncclProfiler_v6",
        }
    }

    /// The event kinds this version defines (`ncclProfileGroup` ..): the
    /// bits of a plugin's activation mask that are kept.
    pub fn known_kinds(self) -> u64 {
        match self {
            // Group, Coll, P2p, ProxyOp, ProxyStep, ProxyCtrl.
            ProfilerVersion::V1 | ProfilerVersion::V2 => (1 << 6) - 1,
            // ... KernelCh, NetPlugin.
            ProfilerVersion::V3 | ProfilerVersion::V4 => (1 << 8) - 1,
            // ... GroupApi, CollApi, P2pApi, KernelLaunch.
            ProfilerVersion::V5 => (1 << 12) - 1,
            // ... CeColl, CeSync, CeBatch.
            ProfilerVersion::V6 => (1 << 15) - 1,
        }
    }
}

/// A loaded table, by version.
#[derive(Clone, Copy)]
enum AnyTable {
    V1(&'static ProfilerTableV1),
    V2(&'static ProfilerTableV2),
    V3(&'static ProfilerTableV3),
    V4(&'static ProfilerTableV4),
    /// v5 and v6.
    V5(&'static ProfilerTable),
}

impl AnyTable {
    fn name(self) -> *const c_char {
        match self {
            AnyTable::V1(t) => t.name,
            AnyTable::V2(t) => t.name,
            AnyTable::V3(t) => t.name,
            AnyTable::V4(t) => t.name,
            AnyTable::V5(t) => t.name,
        }
    }
    fn missing(self) -> Vec<&'static str> {
        match self {
            AnyTable::V1(t) => t.missing(),
            AnyTable::V2(t) => t.missing(),
            AnyTable::V3(t) => t.missing(),
            AnyTable::V4(t) => t.missing(),
            AnyTable::V5(t) => t.missing(),
        }
    }
    /// `stopEvent` (the same type in every version; checked at load).
    fn stop_event(self) -> Option<unsafe extern "C" fn(Vp) -> NcclResult> {
        match self {
            AnyTable::V1(t) => t.stop_event,
            AnyTable::V2(t) => t.stop_event,
            AnyTable::V3(t) => t.stop_event,
            AnyTable::V4(t) => t.stop_event,
            AnyTable::V5(t) => t.stop_event,
        }
    }
    /// `finalize` (the same type in every version; checked at load).
    fn finalize(self) -> Option<unsafe extern "C" fn(Vp) -> NcclResult> {
        match self {
            AnyTable::V1(t) => t.finalize,
            AnyTable::V2(t) => t.finalize,
            AnyTable::V3(t) => t.finalize,
            AnyTable::V4(t) => t.finalize,
            AnyTable::V5(t) => t.finalize,
        }
    }
}

/// The v4 descriptor of `d`; `None` for kinds v4 does not have (the API
/// and copy-engine events). Operations take their group as `parentObj`.
pub fn to_v4(d: &EventDescr) -> Option<EventDescrV4> {
    let kind = u8::try_from(d.kind)
        .ok()
        .filter(|&k| u64::from(k) & ProfilerVersion::V4.known_kinds() == d.kind)?;
    let mut out = EventDescrV4 {
        kind,
        parent_obj: d.parent_obj,
        rank: d.rank,
        // SAFETY: all-zero is a valid value of these plain C structs
        // (NULL pointers, zero numbers).
        u: unsafe { std::mem::zeroed() },
    };
    match d.kind {
        PROFILE_COLL => {
            // SAFETY: the kind says `coll` is the member in use.
            let c = unsafe { d.u.coll };
            out.parent_obj = c.parent_group;
            out.u.coll = CollDescrV4 {
                seq_number: c.seq_number,
                func: c.func,
                send_buff: c.send_buff,
                recv_buff: c.recv_buff,
                count: c.count,
                root: c.root,
                datatype: c.datatype,
                n_channels: c.n_channels,
                n_warps: c.n_warps,
                algo: c.algo,
                proto: c.proto,
            };
        }
        PROFILE_P2P => {
            // SAFETY: the kind says `p2p` is the member in use.
            let p = unsafe { d.u.p2p };
            out.parent_obj = p.parent_group;
            out.u.p2p = P2pDescrV4 {
                func: p.func,
                buff: p.buff,
                datatype: p.datatype,
                count: p.count,
                peer: p.peer,
                n_channels: p.n_channels,
            };
        }
        PROFILE_PROXY_OP => {
            // SAFETY: the kind says `proxy_op` is the member in use.
            out.u.proxy_op = unsafe { d.u.proxy_op };
        }
        PROFILE_PROXY_STEP => {
            // SAFETY: the kind says `proxy_step` is the member in use.
            out.u.proxy_step = unsafe { d.u.proxy_step };
        }
        // Group: no members. Other kinds oxccl does not describe.
        _ => {}
    }
    Some(out)
}

/// Copies the proxy members of an older descriptor (the same in every
/// version) from v4's.
macro_rules! proxy_members {
    ($kind:expr, $v4:expr, $u:expr) => {
        match $kind {
            PROFILE_PROXY_OP => {
                // SAFETY: to_v4 filled `proxy_op` for this kind.
                $u.proxy_op = unsafe { $v4.u.proxy_op };
            }
            PROFILE_PROXY_STEP => {
                // SAFETY: to_v4 filled `proxy_step` for this kind.
                $u.proxy_step = unsafe { $v4.u.proxy_step };
            }
            _ => {}
        }
    };
}

/// The v3 descriptor of `d` (`name` NULL and `commHash` 0, as NCCL fills
/// them since v4 dropped them); `None` for kinds v3 does not have.
pub fn to_v3(d: &EventDescr) -> Option<EventDescrV3> {
    let v4 = to_v4(d)?;
    // SAFETY: all-zero is a valid value of these plain C structs.
    let mut u: DescrUnionV3 = unsafe { std::mem::zeroed() };
    match d.kind {
        PROFILE_COLL => {
            // SAFETY: to_v4 filled `coll` for this kind.
            let c = unsafe { v4.u.coll };
            u.coll = CollDescrV3 {
                name: ptr::null(),
                comm_hash: 0,
                seq_number: c.seq_number,
                func: c.func,
                send_buff: c.send_buff,
                recv_buff: c.recv_buff,
                count: c.count,
                root: c.root,
                datatype: c.datatype,
                n_max_channels: c.n_channels,
                n_warps: c.n_warps,
                algo: c.algo,
                proto: c.proto,
            };
        }
        PROFILE_P2P => u.p2p = p2p_v2(&v4),
        k => proxy_members!(k, v4, u),
    }
    Some(EventDescrV3 {
        kind: v4.kind,
        parent_obj: v4.parent_obj,
        rank: v4.rank,
        u,
    })
}

fn p2p_v2(v4: &EventDescrV4) -> P2pDescrV2 {
    // SAFETY: called for point-to-point kinds, whose `p2p` to_v4 filled.
    let p = unsafe { v4.u.p2p };
    P2pDescrV2 {
        name: ptr::null(),
        comm_hash: 0,
        func: p.func,
        buff: p.buff,
        datatype: p.datatype,
        count: p.count,
        peer: p.peer,
    }
}

/// The v2 descriptor of `d` (v3's plus `trafficBytes`, 0 as in NCCL);
/// `None` for kinds v2 does not have (v3's kernel-channel and net-plugin
/// events too).
pub fn to_v2(d: &EventDescr) -> Option<EventDescrV2> {
    if d.kind & ProfilerVersion::V2.known_kinds() != d.kind {
        return None;
    }
    let v4 = to_v4(d)?;
    // SAFETY: all-zero is a valid value of these plain C structs.
    let mut u: DescrUnionV2 = unsafe { std::mem::zeroed() };
    match d.kind {
        PROFILE_COLL => {
            // SAFETY: to_v4 filled `coll` for this kind.
            let c = unsafe { v4.u.coll };
            u.coll = CollDescrV2 {
                name: ptr::null(),
                comm_hash: 0,
                seq_number: c.seq_number,
                func: c.func,
                send_buff: c.send_buff,
                recv_buff: c.recv_buff,
                count: c.count,
                root: c.root,
                datatype: c.datatype,
                traffic_bytes: 0,
                n_max_channels: c.n_channels,
                n_warps: c.n_warps,
                algo: c.algo,
                proto: c.proto,
            };
        }
        PROFILE_P2P => u.p2p = p2p_v2(&v4),
        k => proxy_members!(k, v4, u),
    }
    Some(EventDescrV2 {
        kind: v4.kind,
        parent_obj: v4.parent_obj,
        rank: v4.rank,
        u,
    })
}

/// `ncclFunc_t` of a function name.
pub fn func_code(name: &CStr) -> u8 {
    match name.to_bytes() {
        b"Broadcast" => 0,
        b"Reduce" => 1,
        b"AllGather" => 2,
        b"ReduceScatter" => 3,
        b"AllReduce" => 4,
        b"SendRecv" => 5,
        b"Send" => 6,
        b"Recv" => 7,
        b"AlltoAll" => 8,
        b"Scatter" => 9,
        b"Gather" => 10,
        b"AllGatherV" => 11,
        // Not an NCCL function: ncclNumFuncs.
        _ => 15,
    }
}

/// `ncclDataType_t` of a datatype name (`ncclFloat32`, ...).
pub fn dtype_code(name: &CStr) -> u8 {
    match name.to_bytes() {
        b"ncclInt8" => 0,
        b"ncclUint8" => 1,
        b"ncclInt32" => 2,
        b"ncclUint32" => 3,
        b"ncclInt64" => 4,
        b"ncclUint64" => 5,
        b"ncclFloat16" => 6,
        b"ncclFloat32" => 7,
        b"ncclFloat64" => 8,
        b"ncclBfloat16" => 9,
        b"ncclFloat8e4m3" => 10,
        b"ncclFloat8e5m2" => 11,
        // Not an NCCL datatype: ncclNumTypes.
        _ => 12,
    }
}

/// `NCCL_ALGO_*` of an algorithm name; oxccl's own (`OneShot`,
/// `TwoShot`) have none: `NCCL_ALGO_UNDEF` (-1, 255 in the byte).
pub fn algo_code(name: &CStr) -> u8 {
    match name.to_bytes() {
        b"Tree" => 0,
        b"Ring" => 1,
        b"CollNetDirect" => 2,
        b"CollNetChain" => 3,
        b"NVLS" => 4,
        b"NVLSTree" => 5,
        b"PAT" => 6,
        _ => u8::MAX,
    }
}

/// `NCCL_PROTO_*` of a protocol name (`NCCL_PROTO_UNDEF`, 255, if none).
pub fn proto_code(name: &CStr) -> u8 {
    match name.to_bytes() {
        b"LL" => 0,
        b"LL128" => 1,
        b"Simple" => 2,
        _ => u8::MAX,
    }
}

fn code_of(p: *const c_char, f: fn(&CStr) -> u8) -> u8 {
    if p.is_null() {
        return f(c"");
    }
    // SAFETY: descriptor strings are NUL-terminated (static names).
    f(unsafe { CStr::from_ptr(p) })
}

/// The v1 descriptor of `d`: v2's with the names as NCCL's numbers,
/// `op` and `trafficBytes` 0, `isCollnet` and `isNvls` from the algorithm.
pub fn to_v1(d: &EventDescr) -> Option<EventDescrV1> {
    let v2 = to_v2(d)?;
    // SAFETY: all-zero is a valid value of these plain C structs.
    let mut u: DescrUnionV1 = unsafe { std::mem::zeroed() };
    match d.kind {
        PROFILE_COLL => {
            // SAFETY: to_v2 filled `coll` for this kind.
            let c = unsafe { v2.u.coll };
            let algo = code_of(c.algo, algo_code);
            u.coll = CollDescrV1 {
                name: ptr::null(),
                comm_hash: 0,
                seq_number: c.seq_number,
                func: code_of(c.func, func_code),
                send_buff: c.send_buff,
                recv_buff: c.recv_buff,
                count: c.count,
                root: c.root,
                datatype: code_of(c.datatype, dtype_code),
                op: 0,
                traffic_bytes: 0,
                n_max_channels: c.n_max_channels,
                n_warps: c.n_warps,
                algo,
                proto: code_of(c.proto, proto_code),
                is_collnet: c_int::from(algo == 2 || algo == 3),
                is_nvls: c_int::from(algo == 4 || algo == 5),
            };
        }
        PROFILE_P2P => {
            // SAFETY: to_v2 filled `p2p` for this kind.
            let p = unsafe { v2.u.p2p };
            u.p2p = P2pDescrV1 {
                name: ptr::null(),
                comm_hash: 0,
                func: code_of(p.func, func_code),
                buff: p.buff,
                datatype: code_of(p.datatype, dtype_code),
                count: p.count,
                peer: p.peer,
            };
        }
        k => proxy_members!(k, v2, u),
    }
    Some(EventDescrV1 {
        kind: v2.kind,
        parent_obj: v2.parent_obj,
        rank: v2.rank,
        u,
    })
}

/// A loaded profiler library (never unloaded).
pub struct ProfilerLib {
    library: String,
    version: ProfilerVersion,
    name: String,
    table: AnyTable,
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

/// Versions after v6 that a plugin built for a later NCCL may export
/// alone: named in the WARN.
const NEWER: [&str; 3] = ["ncclProfiler_v7", "ncclProfiler_v8", "ncclProfiler_v9"];

fn load_file(file: &str) -> std::result::Result<ProfilerLib, (bool, String)> {
    let lib = crate::loader::open(file).map_err(|e| (false, e))?;
    let Some((version, sym)) =
        crate::loader::find_symbol(lib, ProfilerVersion::NEWEST_FIRST.map(|v| (v, v.symbol())))
    else {
        let newer = crate::loader::find_symbol(lib, NEWER.map(|s| (s, s))).map(|(s, _)| s);
        return Err((
            true,
            match newer {
                Some(s) => format!(
                    "it exports {s}, newer than the versions oxccl drives (ncclProfiler_v6 down to ncclProfiler_v1), and none of those"
                ),
                None => "it exports none of the profiler versions oxccl knows (ncclProfiler_v6 down to ncclProfiler_v1)"
                    .to_string(),
            },
        ));
    };
    // SAFETY: `sym` is the plugin's exported table of this version (the
    // layout its symbol names), which lives as long as the library (never
    // unloaded).
    let table = unsafe {
        match version {
            ProfilerVersion::V1 => AnyTable::V1(&*(sym as *const ProfilerTableV1)),
            ProfilerVersion::V2 => AnyTable::V2(&*(sym as *const ProfilerTableV2)),
            ProfilerVersion::V3 => AnyTable::V3(&*(sym as *const ProfilerTableV3)),
            ProfilerVersion::V4 => AnyTable::V4(&*(sym as *const ProfilerTableV4)),
            ProfilerVersion::V5 | ProfilerVersion::V6 => {
                AnyTable::V5(&*(sym as *const ProfilerTable))
            }
        }
    };
    let missing = table.missing();
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
    let name = if table.name().is_null() {
        "(unnamed)".to_string()
    } else {
        // SAFETY: the plugin's name is a NUL-terminated string in its table.
        unsafe { CStr::from_ptr(table.name()) }
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

/// A profiler's context for one communicator. `finalize` runs on drop;
/// events are started, stopped and given states through [`ProfilerRef`]
/// (what it dereferences to).
pub struct ProfilerComm {
    r: ProfilerRef,
}

// SAFETY: the context is used by one communicator, behind its `&mut`.
unsafe impl Send for ProfilerComm {}

impl std::fmt::Debug for ProfilerComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfilerComm")
            .field("lib", &self.r.lib)
            .field("mask", &self.r.mask)
            .finish()
    }
}

impl std::ops::Deref for ProfilerComm {
    type Target = ProfilerRef;
    fn deref(&self) -> &ProfilerRef {
        &self.r
    }
}

/// The events side of a [`ProfilerComm`]: a copy ([`ProfilerComm::share`])
/// lets the code driving a group's transfers start and stop events while
/// the communicator is borrowed elsewhere. Only valid while its
/// `ProfilerComm` is (the context is finalized when that drops).
#[derive(Clone)]
pub struct ProfilerRef {
    lib: Arc<ProfilerLib>,
    ctx: Vp,
    mask: u64,
}

// SAFETY: NCCL calls a profiler's entries from application and proxy
// threads, so plugins must allow calls from any thread; the context is
// only handed to the plugin.
unsafe impl Send for ProfilerRef {}

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
        let (nnodes, nranks, rank) = (int(nnodes), int(nranks), int(rank));
        // SAFETY: entries checked present at load; out-pointers writable;
        // the name is a C string that outlives the call; the logger is valid
        // for the process.
        let rc = unsafe {
            match lib.table {
                AnyTable::V5(t) => (t.init.unwrap_unchecked())(
                    &mut ctx,
                    comm_id,
                    &mut mask,
                    name.as_ptr(),
                    nnodes,
                    nranks,
                    rank,
                    logger,
                ),
                AnyTable::V4(t) => (t.init.unwrap_unchecked())(
                    &mut ctx,
                    &mut mask,
                    name.as_ptr(),
                    comm_id,
                    nnodes,
                    nranks,
                    rank,
                    logger,
                ),
                AnyTable::V3(t) => (t.init.unwrap_unchecked())(&mut ctx, &mut mask),
                AnyTable::V2(t) => (t.init.unwrap_unchecked())(&mut ctx, &mut mask),
                AnyTable::V1(t) => (t.init.unwrap_unchecked())(&mut ctx, &mut mask),
            }
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
        // Bits for kinds this version does not define are dropped.
        let known = lib.version.known_kinds();
        Ok(ProfilerComm {
            r: ProfilerRef {
                lib,
                ctx,
                mask: mask as u32 as u64 & known,
            },
        })
    }

    /// A copy of the events side, valid while this context lives.
    pub fn share(&self) -> ProfilerRef {
        self.r.clone()
    }
}

impl ProfilerRef {
    /// The plugin's `eActivationMask`: the event kinds it wants.
    pub fn mask(&self) -> u64 {
        self.mask
    }

    /// Whether the plugin wants events of `kind` (a `PROFILE_*` bit).
    pub fn wants(&self, kind: u64) -> bool {
        self.mask & kind != 0
    }

    /// Whether events of `kind` are started for this plugin: it wants them
    /// or a kind below them ([`enabled_by`]), and its version has the kind.
    /// Callers build a descriptor only when this holds.
    pub fn starts(&self, kind: u64) -> bool {
        self.mask & enabled_by(kind) != 0 && self.lib.version.known_kinds() & kind == kind
    }

    /// The library behind this context.
    pub fn lib(&self) -> &ProfilerLib {
        &self.lib
    }

    /// `startEvent` for `descr` when [`ProfilerComm::starts`] its kind.
    /// `None`: not started, refused, or no handle returned (then no stop
    /// either).
    pub fn start(&self, descr: &mut EventDescr) -> Option<Event> {
        if !self.starts(descr.kind) {
            return None;
        }
        let mut h: Vp = ptr::null_mut();
        let (ctx, h_out) = (self.ctx, &mut h as *mut Vp);
        // SAFETY: in every arm, the entry was checked present at load; the
        // descriptor (this version's, translated) is valid for the call and
        // its strings are static; `h` is writable. Kinds a version lacks
        // are not started (no handle, no stop).
        let rc = unsafe {
            match self.lib.table {
                AnyTable::V5(t) => (t.start_event.unwrap_unchecked())(ctx, h_out, descr),
                AnyTable::V4(t) => match to_v4(descr) {
                    Some(mut d) => (t.start_event.unwrap_unchecked())(ctx, h_out, &mut d),
                    None => return None,
                },
                AnyTable::V3(t) => match to_v3(descr) {
                    Some(mut d) => (t.start_event.unwrap_unchecked())(ctx, h_out, &mut d),
                    None => return None,
                },
                AnyTable::V2(t) => match to_v2(descr) {
                    Some(mut d) => (t.start_event.unwrap_unchecked())(ctx, h_out, &mut d),
                    None => return None,
                },
                AnyTable::V1(t) => match to_v1(descr) {
                    Some(mut d) => (t.start_event.unwrap_unchecked())(ctx, h_out, &mut d),
                    None => return None,
                },
            }
        };
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

    /// `recordEventState` of `e` to `state` (an `ncclProfilerEventState_t`)
    /// with `args` (NULL when `None`, as NCCL records the group API
    /// states). v1 to v3 get their own arguments (zero: the members oxccl
    /// passes are v4's) and only the states they define, as NCCL's
    /// adapters pass them (the proxy step and proxy control states).
    pub fn record_state(&self, e: &Event, state: c_int, args: Option<StateArgsV4>) {
        let h = e.as_ptr();
        let mut v4 = args;
        let p4 = v4
            .as_mut()
            .map_or(ptr::null_mut(), |a| a as *mut StateArgsV4);
        // SAFETY: all-zero is a valid value of this plain C union.
        let mut v1: StateArgsV1 = unsafe { std::mem::zeroed() };
        let p1 = if args.is_some() {
            &mut v1 as *mut StateArgsV1
        } else {
            ptr::null_mut()
        };
        let old = !matches!(self.lib.table, AnyTable::V4(_) | AnyTable::V5(_));
        if old && !(8..=18).contains(&state) {
            return;
        }
        // SAFETY: in every arm, the entry was checked present at load; the
        // handle came from this plugin's startEvent and is not stopped yet
        // (`e` is borrowed, stopping takes it); the arguments are this
        // version's, valid for the call, or NULL.
        let rc = unsafe {
            match self.lib.table {
                AnyTable::V5(t) => (t.record_event_state.unwrap_unchecked())(h, state, p4),
                AnyTable::V4(t) => (t.record_event_state.unwrap_unchecked())(h, state, p4),
                AnyTable::V3(t) => (t.record_event_state.unwrap_unchecked())(h, state, p1),
                AnyTable::V2(t) => (t.record_event_state.unwrap_unchecked())(h, state, p1),
                AnyTable::V1(t) => (t.record_event_state.unwrap_unchecked())(h, state, p1),
            }
        };
        if rc != ffi::NCCL_SUCCESS {
            oxccl_env::info!(
                Subsys::INIT,
                "PROFILER/Plugin: {} recordEventState({state}) returned {rc} ({})",
                self.lib.name,
                ffi::result_name(rc)
            );
        }
    }

    /// `stopEvent`.
    pub fn stop(&self, e: Event) {
        // SAFETY: entry checked present at load; the handle came from this
        // plugin's startEvent and is stopped once (moved in).
        let rc = unsafe { (self.lib.table.stop_event().unwrap_unchecked())(e.as_ptr()) };
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
        let rc = unsafe { (self.r.lib.table.finalize().unwrap_unchecked())(self.r.ctx) };
        if rc != ffi::NCCL_SUCCESS {
            oxccl_env::info!(
                Subsys::INIT,
                "PROFILER/Plugin: {} finalize returned {rc} ({})",
                self.r.lib.name,
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
        assert_eq!(size_of::<ProfilerTableV1>(), 8 * 6);
        assert_eq!(size_of::<ProfilerTableV4>(), 8 * 6);
        // v4: coll seq 0 .. nChannels 56, nWarps 57, algo 64, proto 72.
        assert_eq!(size_of::<EventDescrV4>(), 24 + 80);
        // v3: name, commHash before v4's coll (nMaxChannels 72).
        assert_eq!(offset_of!(CollDescrV3, n_max_channels), 72);
        assert_eq!(size_of::<EventDescrV3>(), 24 + 96);
        // v2: trafficBytes 72 before nMaxChannels 80.
        assert_eq!(offset_of!(CollDescrV2, n_max_channels), 80);
        assert_eq!(size_of::<EventDescrV2>(), 24 + 104);
        // v1: func 24 (a byte), datatype 60, op 64, isNvls 88.
        assert_eq!(offset_of!(CollDescrV1, datatype), 60);
        assert_eq!(offset_of!(CollDescrV1, is_nvls), 88);
        assert_eq!(size_of::<EventDescrV1>(), 24 + 96);
    }

    fn coll() -> EventDescr {
        // SAFETY: all-zero is a valid descriptor.
        let mut d: EventDescr = unsafe { std::mem::zeroed() };
        d.kind = PROFILE_COLL;
        d.rank = 3;
        d.parent_obj = 0x10 as Vp;
        d.u.coll = CollDescr {
            seq_number: 7,
            func: c"ReduceScatter".as_ptr(),
            send_buff: 0x20 as *const c_void,
            recv_buff: 0x30 as Vp,
            count: 1001,
            root: 0,
            datatype: c"ncclBfloat16".as_ptr(),
            n_channels: 2,
            n_warps: 0,
            algo: c"NVLSTree".as_ptr(),
            proto: c"LL128".as_ptr(),
            parent_group: 0x40 as Vp,
        };
        d
    }

    #[test]
    fn older_descriptors_translate() {
        let d = coll();
        let v4 = to_v4(&d).unwrap();
        assert_eq!(v4.kind, PROFILE_COLL as u8);
        // The operation's parent is its group.
        assert_eq!(v4.parent_obj, 0x40 as Vp);
        // SAFETY: a collective's descriptor.
        let c4 = unsafe { v4.u.coll };
        assert_eq!((c4.seq_number, c4.count, c4.n_channels), (7, 1001, 2));
        let v3 = to_v3(&d).unwrap();
        // SAFETY: as above.
        let c3 = unsafe { v3.u.coll };
        assert!(c3.name.is_null());
        assert_eq!((c3.comm_hash, c3.count, c3.n_max_channels), (0, 1001, 2));
        let v2 = to_v2(&d).unwrap();
        // SAFETY: as above.
        let c2 = unsafe { v2.u.coll };
        assert_eq!((c2.traffic_bytes, c2.seq_number), (0, 7));
        let v1 = to_v1(&d).unwrap();
        // SAFETY: as above.
        let c1 = unsafe { v1.u.coll };
        assert_eq!(
            (
                c1.func,
                c1.datatype,
                c1.algo,
                c1.proto,
                c1.is_nvls,
                c1.is_collnet
            ),
            (3, 9, 5, 1, 1, 0)
        );
        assert_eq!((c1.count, c1.seq_number, c1.root), (1001, 7, 0));
        // A kind v1-v4 lack is not started.
        let mut api = d;
        api.kind = PROFILE_COLL_API;
        assert!(to_v4(&api).is_none() && to_v1(&api).is_none());
        // Kernel-channel events came with v3.
        let mut kch = d;
        kch.kind = 1 << 6;
        assert!(to_v3(&kch).is_some() && to_v2(&kch).is_none());
        // Proxy operations and steps keep their members in every version.
        let mut op = d;
        op.kind = PROFILE_PROXY_OP;
        op.u.proxy_op = ProxyOpDescr {
            pid: 77,
            channel_id: 3,
            peer: 5,
            n_steps: 12,
            chunk_size: 4096,
            is_send: 1,
        };
        let got = [
            // SAFETY: a proxy operation's descriptor, translated.
            unsafe { to_v4(&op).unwrap().u.proxy_op },
            // SAFETY: as above.
            unsafe { to_v3(&op).unwrap().u.proxy_op },
            // SAFETY: as above.
            unsafe { to_v2(&op).unwrap().u.proxy_op },
            // SAFETY: as above.
            unsafe { to_v1(&op).unwrap().u.proxy_op },
        ];
        for g in got {
            assert_eq!(
                (
                    g.pid,
                    g.channel_id,
                    g.peer,
                    g.n_steps,
                    g.chunk_size,
                    g.is_send
                ),
                (77, 3, 5, 12, 4096, 1)
            );
        }
        assert_eq!(to_v1(&op).unwrap().parent_obj, 0x10 as Vp);
        let mut step = d;
        step.kind = PROFILE_PROXY_STEP;
        step.u.proxy_step = ProxyStepDescr { step: 9 };
        // SAFETY: a proxy step's descriptor.
        assert_eq!(unsafe { to_v1(&step).unwrap().u.proxy_step.step }, 9);
        assert_eq!(algo_code(c"OneShot"), u8::MAX);
        assert_eq!(func_code(c"AlltoAll"), 8);
        assert_eq!(dtype_code(c"ncclUint8"), 1);
        assert_eq!(ProfilerVersion::V1.known_kinds() & PROFILE_P2P_API, 0);
        assert_eq!(
            ProfilerVersion::V5.known_kinds() & PROFILE_P2P_API,
            PROFILE_P2P_API
        );
    }

    #[test]
    fn events_start_for_their_descendants_as_in_nccl() {
        // Wanting collectives starts the group API, collective API and
        // group events above them, not the point-to-point side.
        let colls = PROFILE_COLL;
        for k in [
            PROFILE_GROUP_API,
            PROFILE_COLL_API,
            PROFILE_GROUP,
            PROFILE_COLL,
        ] {
            assert_ne!(enabled_by(k) & colls, 0, "kind {k:#x}");
        }
        for k in [
            PROFILE_P2P_API,
            PROFILE_P2P,
            PROFILE_PROXY_OP,
            PROFILE_PROXY_STEP,
        ] {
            assert_eq!(enabled_by(k) & colls, 0, "kind {k:#x}");
        }
        // Proxy operations start everything above an operation.
        for k in [
            PROFILE_GROUP_API,
            PROFILE_COLL_API,
            PROFILE_P2P_API,
            PROFILE_GROUP,
            PROFILE_COLL,
            PROFILE_P2P,
        ] {
            assert_ne!(enabled_by(k) & PROFILE_PROXY_OP, 0, "kind {k:#x}");
        }
        // Groups alone: the group API event above, nothing below.
        let started: Vec<u64> = (0..15)
            .map(|b| 1u64 << b)
            .filter(|&k| enabled_by(k) & PROFILE_GROUP != 0)
            .collect();
        assert_eq!(started, vec![PROFILE_GROUP, PROFILE_GROUP_API]);
        // The API events alone start no group or operation events.
        let api = PROFILE_GROUP_API | PROFILE_COLL_API | PROFILE_P2P_API;
        for k in [PROFILE_GROUP, PROFILE_COLL, PROFILE_P2P, PROFILE_PROXY_OP] {
            assert_eq!(enabled_by(k) & api, 0, "kind {k:#x}");
        }
        // A proxy step is below its proxy operation; kinds without
        // descendants are started for themselves only.
        assert_ne!(enabled_by(PROFILE_PROXY_OP) & PROFILE_PROXY_STEP, 0);
        assert_eq!(enabled_by(PROFILE_PROXY_STEP) & PROFILE_PROXY_OP, 0);
        assert_eq!(enabled_by(PROFILE_PROXY_CTRL), PROFILE_PROXY_CTRL);
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
