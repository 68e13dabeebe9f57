//! The profiler events of one communicator's part of a group, for both
//! executors: the host path (`oxccl-host`'s `run_group`) and the GPU path
//! (`oxccl::gpu::raw`'s launches) describe each operation as an [`OpEvent`]
//! and get NCCL's events for it from [`start_group`], in NCCL's order and
//! with its parents, then [`stop_group`] them.
//!
//! Which events a group yields and who parents whom is decided by
//! [`plan_group`], a pure function of the kinds the plugin starts and the
//! operations (tested here); [`start_group`] acts on that plan.

use std::ffi::{c_void, CStr};
use std::ptr;

use oxccl_core::profiler_plugin::{dtype_name, func_name, SeqNumbers};
use oxccl_core::{CollKind, DataType};

use crate::profiler::{
    CollApiDescr, CollDescr, DescrUnion, Event, EventDescr, GroupApiDescr, P2pApiDescr, P2pDescr,
    ProfilerRef, PROFILE_COLL, PROFILE_COLL_API, PROFILE_GROUP, PROFILE_GROUP_API, PROFILE_P2P,
    PROFILE_P2P_API, STATE_GROUP_END_API_START, STATE_GROUP_START_API_STOP,
};

/// One operation of a group as its profiler events describe it.
#[derive(Debug, Clone, Copy)]
pub struct OpEvent {
    /// The collective, or `Send` / `Recv`.
    pub kind: CollKind,
    /// The send buffer (a send's buffer).
    pub send: *const c_void,
    /// The receive buffer (a receive's buffer).
    pub recv: *mut c_void,
    /// Elements, as the call counted them.
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Root of a rooted collective, peer of a send or receive.
    pub root: usize,
    /// The algorithm and protocol names the operation runs with
    /// (`oxccl_core::profiler_plugin::algo_name`, ...; collectives only).
    pub algo: &'static CStr,
    pub proto: &'static CStr,
    /// Channels (thread blocks on the GPU path) it runs on.
    pub n_channels: usize,
    /// Warps per channel (0 on the host path: no warps).
    pub n_warps: usize,
    /// The stream the call was queued on (NULL on the host path), for the
    /// API events.
    pub stream: *mut c_void,
}

impl OpEvent {
    fn is_p2p(&self) -> bool {
        matches!(self.kind, CollKind::Send | CollKind::Recv)
    }
}

/// Which events a group yields for a plugin, by kind ([`plan_group`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPlan {
    /// A group API event (v5, v6), with its two states.
    pub group_api: bool,
    /// Per operation: an API event (collective or point-to-point API).
    pub api: Vec<bool>,
    /// A group event.
    pub group: bool,
    /// Per operation: its collective or point-to-point event.
    pub op: Vec<bool>,
}

/// The events NCCL gives a plugin that starts the kinds `starts` says it
/// does ([`ProfilerRef::starts`]) for a group of operations whose kinds are
/// `kinds`: a group API event; per call, its API event (parent: the group
/// API event); a group event; per operation its collective or
/// point-to-point event (parent: its API event, `parentGroup` the group
/// event).
pub fn plan_group(starts: impl Fn(u64) -> bool, kinds: &[CollKind]) -> GroupPlan {
    let p2p = |k: &CollKind| matches!(k, CollKind::Send | CollKind::Recv);
    let (coll_api, p2p_api) = (starts(PROFILE_COLL_API), starts(PROFILE_P2P_API));
    let (coll, p2p_on) = (starts(PROFILE_COLL), starts(PROFILE_P2P));
    GroupPlan {
        group_api: starts(PROFILE_GROUP_API),
        api: kinds
            .iter()
            .map(|k| if p2p(k) { p2p_api } else { coll_api })
            .collect(),
        group: starts(PROFILE_GROUP),
        op: kinds
            .iter()
            .map(|k| if p2p(k) { p2p_on } else { coll })
            .collect(),
    }
}

/// The profiler events of one communicator's part of a group: the group
/// API event, the group's, and its operations' (those still running).
#[derive(Debug, Default)]
pub struct GroupEvents {
    pub group_api: Option<Event>,
    pub group: Option<Event>,
    /// The operations' events, to stop.
    pub children: Vec<Event>,
    /// Each operation's event handle (NULL where none), in call order: the
    /// parents of their proxy events.
    pub op_events: Vec<*mut c_void>,
}

/// Starts the events of one communicator's part of a group (rank `rank`;
/// `graph_captured`: the calls were captured into a CUDA graph), in NCCL's
/// order: the group API event, its start state, one collective or
/// point-to-point API event per call (stopped at once: NCCL's spans the
/// call, which only enqueues), the end state, then the group event and the
/// operations' events (NCCL's descriptors: function, buffers, count,
/// datatype, root or peer, algorithm, protocol, channels, warps; a
/// collective's `seqNumber` from `seqs`, which counts every collective,
/// profiled or not). Descriptors are built only for kinds that are started.
pub fn start_group(
    prof: &ProfilerRef,
    seqs: &mut SeqNumbers,
    rank: usize,
    graph_captured: bool,
    ops: &[OpEvent],
) -> GroupEvents {
    let null = ptr::null_mut();
    let kinds: Vec<CollKind> = ops.iter().map(|o| o.kind).collect();
    let plan = plan_group(|k| prof.starts(k), &kinds);
    let descr = |kind, parent_obj, u| EventDescr {
        kind,
        parent_obj,
        rank: rank as i32,
        u,
    };
    let group_api = if plan.group_api {
        // oxccl runs the outermost group: depth 1.
        let u = DescrUnion {
            group_api: GroupApiDescr {
                graph_captured,
                group_depth: 1,
            },
        };
        prof.start(&mut descr(PROFILE_GROUP_API, null, u))
    } else {
        None
    };
    if let Some(g) = &group_api {
        prof.record_state(g, STATE_GROUP_START_API_STOP, None);
    }
    let api_parent = group_api.as_ref().map_or(null, |g| g.as_ptr());
    // The API events' handles, parents of the operations' events (NCCL
    // too hands a stopped API event's handle as the parent).
    let mut api_handles = Vec::with_capacity(ops.len());
    for (op, &on) in ops.iter().zip(&plan.api) {
        let (func, datatype) = (func_name(op.kind).as_ptr(), dtype_name(op.dtype).as_ptr());
        let ev = if !on {
            None
        } else if op.is_p2p() {
            let u = DescrUnion {
                p2p_api: P2pApiDescr {
                    func,
                    count: op.count,
                    datatype,
                    stream: op.stream,
                    graph_captured,
                },
            };
            prof.start(&mut descr(PROFILE_P2P_API, api_parent, u))
        } else {
            let u = DescrUnion {
                coll_api: CollApiDescr {
                    func,
                    count: op.count,
                    datatype,
                    root: op.root as i32,
                    stream: op.stream,
                    graph_captured,
                },
            };
            prof.start(&mut descr(PROFILE_COLL_API, api_parent, u))
        };
        api_handles.push(ev.as_ref().map_or(null, |e| e.as_ptr()));
        if let Some(e) = ev {
            prof.stop(e);
        }
    }
    if let Some(g) = &group_api {
        prof.record_state(g, STATE_GROUP_END_API_START, None);
    }
    let group = if plan.group {
        // SAFETY: all-zero is a valid value of the union (NULL pointers,
        // zero numbers); a group has no members.
        let u: DescrUnion = unsafe { std::mem::zeroed() };
        prof.start(&mut descr(PROFILE_GROUP, null, u))
    } else {
        None
    };
    let parent_group = group.as_ref().map_or(null, |g| g.as_ptr());
    let mut children = Vec::new();
    let mut op_events = Vec::with_capacity(ops.len());
    for ((op, &on), api) in ops.iter().zip(&plan.op).zip(api_handles) {
        let p2p = op.is_p2p();
        // NCCL numbers every collective, profiled or not.
        let seq = if p2p { 0 } else { seqs.take(op.kind) };
        if !on {
            op_events.push(null);
            continue;
        }
        let (func, datatype) = (func_name(op.kind).as_ptr(), dtype_name(op.dtype).as_ptr());
        let u = if p2p {
            DescrUnion {
                p2p: P2pDescr {
                    func,
                    buff: if op.kind == CollKind::Send {
                        op.send as *mut _
                    } else {
                        op.recv
                    },
                    datatype,
                    count: op.count,
                    peer: op.root as i32,
                    n_channels: op.n_channels.min(255) as u8,
                    parent_group,
                },
            }
        } else {
            DescrUnion {
                coll: CollDescr {
                    seq_number: seq,
                    func,
                    send_buff: op.send,
                    recv_buff: op.recv,
                    count: op.count,
                    root: op.root as i32,
                    datatype,
                    n_channels: op.n_channels.clamp(1, 255) as u8,
                    n_warps: op.n_warps.min(255) as u8,
                    algo: op.algo.as_ptr(),
                    proto: op.proto.as_ptr(),
                    parent_group,
                },
            }
        };
        let kind = if p2p { PROFILE_P2P } else { PROFILE_COLL };
        let e = prof.start(&mut descr(kind, api, u));
        op_events.push(e.as_ref().map_or(null, |e| e.as_ptr()));
        children.extend(e);
    }
    GroupEvents {
        group_api,
        group,
        children,
        op_events,
    }
}

/// Stops what [`start_group`] started: the operations, their group, then
/// the group API event.
pub fn stop_group(prof: &ProfilerRef, ev: GroupEvents) {
    for e in ev.children {
        prof.stop(e);
    }
    for e in [ev.group, ev.group_api].into_iter().flatten() {
        prof.stop(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiler::enabled_by;

    fn starts(mask: u64, known: u64) -> impl Fn(u64) -> bool {
        move |k| mask & enabled_by(k) != 0 && known & k == k
    }

    #[test]
    fn a_group_gives_one_api_and_one_operation_event_per_call() {
        use CollKind::*;
        let kinds = [AllReduce, Send, Recv, Broadcast];
        // v6, asking for collectives and point-to-points: everything above
        // them too.
        let p = plan_group(starts(PROFILE_COLL | PROFILE_P2P, (1 << 15) - 1), &kinds);
        assert_eq!(
            p,
            GroupPlan {
                group_api: true,
                api: vec![true; 4],
                group: true,
                op: vec![true; 4],
            }
        );
        // Collectives only: no point-to-point events of either kind.
        let p = plan_group(starts(PROFILE_COLL, (1 << 15) - 1), &kinds);
        assert_eq!(p.api, vec![true, false, false, true]);
        assert_eq!(p.op, vec![true, false, false, true]);
        assert!(p.group_api && p.group);
        // v4 (no API kinds): the group and the operations only.
        let p = plan_group(starts(PROFILE_COLL | PROFILE_P2P, (1 << 8) - 1), &kinds);
        assert!(!p.group_api && p.group);
        assert_eq!(p.api, vec![false; 4]);
        assert_eq!(p.op, vec![true; 4]);
        // The API events only: nothing below them.
        let api = PROFILE_GROUP_API | PROFILE_COLL_API | PROFILE_P2P_API;
        let p = plan_group(starts(api, (1 << 15) - 1), &kinds);
        assert!(p.group_api && !p.group);
        assert_eq!(p.api, vec![true; 4]);
        assert_eq!(p.op, vec![false; 4]);
        // An empty group: the group events alone.
        let p = plan_group(starts(PROFILE_COLL, (1 << 15) - 1), &[]);
        assert!(p.group_api && p.group && p.api.is_empty() && p.op.is_empty());
    }
}
