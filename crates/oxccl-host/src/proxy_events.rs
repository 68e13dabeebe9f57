//! The profiler's proxy events for the host path's network transfers.
//!
//! NCCL's proxy thread drives each network transfer of an operation as a
//! proxy operation (one per channel, peer and direction) made of steps; a
//! profiler plugin sees `ncclProfileProxyOp` and `ncclProfileProxyStep`
//! events for them, with the steps' states. The host path has no proxy
//! thread: the thread that runs the group moves the bytes itself, step by
//! step through the [`Program`]. Its steps to and from peers reached over
//! the network (TCP or a network plugin) are the proxy steps reported here.
//!
//! [`plan`] decides, from the program alone, which proxy operations and
//! steps there are; [`ProxyTrack`] follows an engine's lanes as they
//! advance and starts, stops and gives states to the events.
//!
//! States, per step: a send records `SendPeerWait` (v4 on: waiting for
//! room at the receiver) when the step begins and `SendWait` once its
//! bytes started out; a receive records `RecvWait` when it begins. There
//! is no `SendGPUWait`, `RecvFlushWait` or `RecvGPUWait`: host buffers
//! need no GPU to fill, flush or drain them. Each proxy operation records
//! `InProgress` (v4 on) when it starts.

use oxccl_core::engine::Engine;
use oxccl_core::schedule::Program;
use oxccl_net::profiler::{
    DescrUnion, Event, EventDescr, ProfilerRef, ProxyOpDescr, ProxyStepDescr, StateArgsV4,
    PROFILE_PROXY_OP, PROFILE_PROXY_STEP, STATE_PROXY_OP_IN_PROGRESS, STATE_RECV_WAIT,
    STATE_SEND_PEER_WAIT, STATE_SEND_WAIT,
};
use std::ffi::c_void;

/// One proxy operation of a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpPlan {
    pub peer: usize,
    pub channel: usize,
    pub is_send: bool,
    /// Steps moving data on this stream.
    pub n_steps: u32,
    /// The largest step's bytes.
    pub chunk: usize,
}

/// A program step's part in a proxy operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// Index in [`ProxyPlan::ops`].
    pub op: u32,
    /// Step number within the operation, from 0.
    pub step: u32,
    /// Data bytes the step moves.
    pub bytes: usize,
}

/// The proxy operations of a program and, per lane and step, the parts
/// that step plays in them (a step that receives and sends on plays two).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyPlan {
    pub ops: Vec<OpPlan>,
    pub parts: Vec<Vec<[Option<Part>; 2]>>,
}

/// The proxy operations and steps of `program`: one operation per
/// (peer, channel, direction) where `net(peer)` and at least one step moves
/// data (header-only steps are not steps of a transfer), in the order the
/// lanes first use them; its steps numbered in lane order.
pub fn plan(program: &Program, net: &dyn Fn(usize) -> bool) -> ProxyPlan {
    let mut out = ProxyPlan::default();
    for lane in &program.lanes {
        let mut parts = Vec::with_capacity(lane.steps.len());
        for st in &lane.steps {
            let mut p = [None, None];
            let bytes = st.len();
            if bytes > 0 {
                let dirs = [(st.recv_peer(), false), (st.send_peer(), true)];
                for (slot, (peer, is_send)) in dirs.into_iter().enumerate() {
                    let Some(peer) = peer.filter(|&q| net(q)) else {
                        continue;
                    };
                    let key = (peer, lane.channel, is_send);
                    let i = match out
                        .ops
                        .iter()
                        .position(|o| (o.peer, o.channel, o.is_send) == key)
                    {
                        Some(i) => i,
                        None => {
                            out.ops.push(OpPlan {
                                peer,
                                channel: lane.channel,
                                is_send,
                                n_steps: 0,
                                chunk: 0,
                            });
                            out.ops.len() - 1
                        }
                    };
                    let o = &mut out.ops[i];
                    p[slot] = Some(Part {
                        op: i as u32,
                        step: o.n_steps,
                        bytes,
                    });
                    o.n_steps += 1;
                    o.chunk = o.chunk.max(bytes);
                }
            }
            parts.push(p);
        }
        out.parts.push(parts);
    }
    out
}

/// Where the tracker is on one lane.
#[derive(Default)]
struct LaneTrack {
    /// The step followed.
    idx: usize,
    /// Its events started (and first states recorded).
    begun: bool,
    /// Its send part's bytes started out (`SendWait` recorded).
    sent: bool,
    /// Its parts' step events.
    open: [Option<Event>; 2],
}

/// The proxy events of one task: its operations' started at creation, its
/// steps' as the engine's lanes reach and pass them. Events still open
/// when it is dropped (a failed or abandoned group) are stopped then.
pub struct ProxyTrack {
    prof: ProfilerRef,
    rank: i32,
    steps: bool,
    plan: ProxyPlan,
    ops: Vec<Option<Event>>,
    /// Steps of each operation not stopped yet.
    left: Vec<u32>,
    lanes: Vec<LaneTrack>,
}

impl ProxyTrack {
    /// The tracker of `engine`'s program on `rank`, whose proxy operations
    /// are children of `parent` (the collective's or point-to-point's
    /// event): `None` when the program moves nothing over the network.
    /// Call only when `prof` starts proxy operations.
    pub fn new(
        prof: ProfilerRef,
        engine: &Engine,
        net: &dyn Fn(usize) -> bool,
        rank: usize,
        parent: *mut c_void,
    ) -> Option<ProxyTrack> {
        let plan = plan(engine.program(), net);
        if plan.ops.is_empty() {
            return None;
        }
        let rank = rank as i32;
        let pid = std::process::id() as i32;
        let ops: Vec<Option<Event>> = plan
            .ops
            .iter()
            .map(|o| {
                let mut d = EventDescr {
                    kind: PROFILE_PROXY_OP,
                    parent_obj: parent,
                    rank,
                    u: DescrUnion {
                        proxy_op: ProxyOpDescr {
                            pid,
                            channel_id: o.channel.min(255) as u8,
                            peer: o.peer as i32,
                            n_steps: o.n_steps as i32,
                            chunk_size: o.chunk.min(i32::MAX as usize) as i32,
                            is_send: i32::from(o.is_send),
                        },
                    },
                };
                let e = prof.start(&mut d);
                if let Some(e) = &e {
                    // SAFETY: all-zero is a valid value of this plain union.
                    let zero: StateArgsV4 = unsafe { std::mem::zeroed() };
                    prof.record_state(e, STATE_PROXY_OP_IN_PROGRESS, Some(zero));
                }
                e
            })
            .collect();
        let left = plan.ops.iter().map(|o| o.n_steps).collect();
        let lanes = plan.parts.iter().map(|_| LaneTrack::default()).collect();
        Some(ProxyTrack {
            steps: prof.starts(PROFILE_PROXY_STEP),
            prof,
            rank,
            plan,
            ops,
            left,
            lanes,
        })
    }

    /// Catches up with `engine`'s lanes: steps passed are begun (if they
    /// were not seen), marked sent and stopped; the current step of each
    /// lane is begun, and marked sent once bytes of it moved.
    pub fn observe(&mut self, engine: &Engine) {
        for li in 0..self.lanes.len() {
            let (idx, pos) = engine.lane_cursor(li);
            let n = self.plan.parts[li].len();
            while self.lanes[li].idx < idx.min(n) {
                self.begin(li);
                self.mark_sent(li);
                self.end(li);
            }
            if self.lanes[li].idx < n {
                self.begin(li);
                if pos > 0 {
                    self.mark_sent(li);
                }
            }
        }
    }

    fn begin(&mut self, li: usize) {
        let lt = &mut self.lanes[li];
        if lt.begun {
            return;
        }
        lt.begun = true;
        if !self.steps {
            return;
        }
        let parts = self.plan.parts[li][lt.idx];
        for (slot, part) in parts.iter().enumerate() {
            let Some(part) = part else { continue };
            let parent = self.ops[part.op as usize]
                .as_ref()
                .map_or(std::ptr::null_mut(), |e| e.as_ptr());
            let mut d = EventDescr {
                kind: PROFILE_PROXY_STEP,
                parent_obj: parent,
                rank: self.rank,
                u: DescrUnion {
                    proxy_step: ProxyStepDescr {
                        step: part.step as i32,
                    },
                },
            };
            let e = self.prof.start(&mut d);
            if let Some(e) = &e {
                let state = if slot == 1 {
                    STATE_SEND_PEER_WAIT
                } else {
                    STATE_RECV_WAIT
                };
                let args = StateArgsV4 {
                    trans_size: part.bytes,
                };
                self.prof.record_state(e, state, Some(args));
            }
            lt.open[slot] = e;
        }
    }

    fn mark_sent(&mut self, li: usize) {
        let lt = &mut self.lanes[li];
        if lt.sent {
            return;
        }
        lt.sent = true;
        if let (Some(e), Some(part)) = (&lt.open[1], self.plan.parts[li][lt.idx][1]) {
            let args = StateArgsV4 {
                trans_size: part.bytes,
            };
            self.prof.record_state(e, STATE_SEND_WAIT, Some(args));
        }
    }

    /// Stops the followed step's events and moves to the lane's next step;
    /// an operation whose last step stopped is stopped.
    fn end(&mut self, li: usize) {
        let lt = &mut self.lanes[li];
        let parts = self.plan.parts[li][lt.idx];
        for (slot, part) in parts.iter().enumerate() {
            if let Some(e) = lt.open[slot].take() {
                self.prof.stop(e);
            }
            let Some(part) = part else { continue };
            let op = part.op as usize;
            self.left[op] = self.left[op].saturating_sub(1);
            if self.left[op] == 0 {
                if let Some(e) = self.ops[op].take() {
                    self.prof.stop(e);
                }
            }
        }
        lt.idx += 1;
        lt.begun = false;
        lt.sent = false;
    }
}

impl Drop for ProxyTrack {
    fn drop(&mut self) {
        for lt in &mut self.lanes {
            for e in lt.open.iter_mut().filter_map(Option::take) {
                self.prof.stop(e);
            }
        }
        for e in self.ops.iter_mut().filter_map(Option::take) {
            self.prof.stop(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_core::schedule::{Buf, Lane, Region, Step};

    fn region(len: usize) -> Region {
        Region {
            buf: Buf::Recv,
            off: 0,
            len,
        }
    }

    #[test]
    fn operations_and_steps_of_network_streams_only() {
        // Channel 0: receive from 1, forward to 2 (two parts), a local
        // copy, a header-only send to 3; channel 1: two sends to 2.
        let program = Program {
            prologue: Vec::new(),
            lanes: vec![
                Lane {
                    channel: 0,
                    steps: vec![
                        Step::Recv {
                            from: 1,
                            dst: region(64),
                        },
                        Step::RecvCopySend {
                            from: 1,
                            to: 2,
                            dst: region(40),
                        },
                        Step::Copy {
                            src: region(8),
                            dst: region(8),
                        },
                        Step::SendHeader { to: 3 },
                    ],
                },
                Lane {
                    channel: 1,
                    steps: vec![
                        Step::Send {
                            to: 2,
                            src: region(16),
                            pre: false,
                        },
                        Step::Send {
                            to: 2,
                            src: region(24),
                            pre: false,
                        },
                    ],
                },
            ],
            scratch_bytes: 0,
        };
        let all = plan(&program, &|_| true);
        let op = |peer, channel, is_send, n_steps, chunk| OpPlan {
            peer,
            channel,
            is_send,
            n_steps,
            chunk,
        };
        assert_eq!(
            all.ops,
            vec![
                op(1, 0, false, 2, 64),
                op(2, 0, true, 1, 40),
                op(2, 1, true, 2, 24)
            ]
        );
        let part = |op, step, bytes| Some(Part { op, step, bytes });
        assert_eq!(
            all.parts,
            vec![
                vec![
                    [part(0, 0, 64), None],
                    [part(0, 1, 40), part(1, 0, 40)],
                    [None, None],
                    [None, None]
                ],
                vec![[None, part(2, 0, 16)], [None, part(2, 1, 24)]],
            ]
        );
        // Peer 2 on this host: only the receives from 1 are network steps.
        let some = plan(&program, &|q| q == 1);
        assert_eq!(some.ops, vec![op(1, 0, false, 2, 64)]);
        assert_eq!(some.parts[1], vec![[None, None], [None, None]]);
        // Nothing over the network: no operations.
        assert!(plan(&program, &|_| false).ops.is_empty());
    }
}
