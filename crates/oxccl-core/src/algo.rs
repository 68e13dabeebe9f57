//! Algorithms, protocols and the `NCCL_ALGO` / `NCCL_PROTO` grammar.
//!
//! Grammar (NCCL's, extended with oxccl's own algorithms):
//!
//! ```text
//! selection := segment (';' segment)*
//! segment   := [func ':'] ['^'] name (',' name)*
//! ```
//!
//! A segment without `func:` applies to every collective; one with it applies to that
//! collective only (`allreduce`, `broadcast`, `reduce`, `allgather`, `reducescatter`,
//! any case, underscores allowed). `^` means "everything except". Segments apply in
//! the order written, so a later segment overrides an earlier one for the collectives
//! it names. Collectives no segment names keep everything allowed. Names are
//! case-insensitive; blank segments and items are skipped; an empty string allows
//! everything. A selection that leaves a collective with nothing allowed parses: the
//! tuner is the one that reports it, because only it knows what was possible.

use crate::error::{Error, Result};
use crate::types::CollKind;
use std::fmt;
use std::marker::PhantomData;

/// One of a small, fixed set of named choices that a [`Selection`] can allow or forbid.
pub trait Choice: Copy + Eq + fmt::Debug + 'static {
    /// Every value, in canonical order (at most 32).
    const ALL: &'static [Self];
    /// The variable whose grammar this is, for messages ("NCCL_ALGO").
    const VAR: &'static str;
    /// What one value is called in messages ("algorithm").
    const WHAT: &'static str;
    /// The canonical name ("Ring").
    fn name(self) -> &'static str;

    /// The value named `s`, case-insensitively.
    fn from_name(s: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|x| x.name().eq_ignore_ascii_case(s))
    }

    /// Position in [`Choice::ALL`], the bit used in a selection mask.
    fn index(self) -> usize {
        Self::ALL.iter().position(|x| *x == self).unwrap_or(0)
    }
}

/// A collective algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algo {
    Tree,
    Ring,
    CollnetDirect,
    CollnetChain,
    Nvls,
    NvlsTree,
    Pat,
    /// oxccl: every rank reads all peers' data and reduces locally (one synchronisation).
    OneShot,
    /// oxccl: reduce-scatter then all-gather over peer-visible buffers.
    TwoShot,
}

impl Choice for Algo {
    const ALL: &'static [Algo] = &[
        Algo::Tree,
        Algo::Ring,
        Algo::CollnetDirect,
        Algo::CollnetChain,
        Algo::Nvls,
        Algo::NvlsTree,
        Algo::Pat,
        Algo::OneShot,
        Algo::TwoShot,
    ];
    const VAR: &'static str = "NCCL_ALGO";
    const WHAT: &'static str = "algorithm";
    fn name(self) -> &'static str {
        match self {
            Algo::Tree => "Tree",
            Algo::Ring => "Ring",
            Algo::CollnetDirect => "CollnetDirect",
            Algo::CollnetChain => "CollnetChain",
            Algo::Nvls => "NVLS",
            Algo::NvlsTree => "NVLSTree",
            Algo::Pat => "PAT",
            Algo::OneShot => "OneShot",
            Algo::TwoShot => "TwoShot",
        }
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A protocol: where the completion flag lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(clippy::upper_case_acronyms)]
pub enum Proto {
    /// Low latency: 4 bytes of data and 4 of flag per 8-byte store.
    LL,
    /// An 8-byte flag in each 128-byte line (needs whole 128-byte stores, i.e. NVLink).
    LL128,
    /// Bulk: data in a slot, then a counter bump per chunk.
    Simple,
}

impl Choice for Proto {
    const ALL: &'static [Proto] = &[Proto::LL, Proto::LL128, Proto::Simple];
    const VAR: &'static str = "NCCL_PROTO";
    const WHAT: &'static str = "protocol";
    fn name(self) -> &'static str {
        match self {
            Proto::LL => "LL",
            Proto::LL128 => "LL128",
            Proto::Simple => "Simple",
        }
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The collectives a `func:` prefix may name.
pub const SELECTABLE_COLLS: [CollKind; 5] = [
    CollKind::AllReduce,
    CollKind::Broadcast,
    CollKind::Reduce,
    CollKind::AllGather,
    CollKind::ReduceScatter,
];

/// Which values of `T` each collective may use. `Selection::all()` allows everything.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Selection<T> {
    /// One bit per `T::ALL` position, indexed by `CollKind::ALL` position.
    masks: [u32; CollKind::ALL.len()],
    _t: PhantomData<fn() -> T>,
}

fn coll_index(c: CollKind) -> usize {
    CollKind::ALL.iter().position(|k| *k == c).unwrap_or(0)
}

impl<T: Choice> Selection<T> {
    fn full_mask() -> u32 {
        if T::ALL.len() >= 32 {
            u32::MAX
        } else {
            (1u32 << T::ALL.len()) - 1
        }
    }

    /// Everything allowed for every collective (the meaning of an unset variable).
    pub fn all() -> Self {
        Selection {
            masks: [Self::full_mask(); CollKind::ALL.len()],
            _t: PhantomData,
        }
    }

    /// Parses the grammar in this module's docs. Errors name the bad token and list
    /// the valid names.
    pub fn parse(s: &str) -> Result<Self> {
        Self::parse_names(s).map_err(|bad| {
            Error::invalid_argument(format!(
                "{}: unknown {} '{}'{} (valid: {})",
                T::VAR,
                bad.what,
                bad.token,
                crate::suggest::hint(&bad.token, &bad.valid()),
                bad.valid().join(", ")
            ))
        })
    }

    /// [`Selection::parse`] for the parameter registry: the error is what was
    /// expected ("algorithm names (Tree, Ring, ...), not 'rign'").
    pub fn parse_expected(s: &str) -> std::result::Result<Self, String> {
        Self::parse_names(s).map_err(|bad| {
            format!(
                "{} names ({}), not '{}'",
                bad.what,
                bad.valid().join(", "),
                bad.token
            )
        })
    }

    fn parse_names(s: &str) -> std::result::Result<Self, BadName> {
        let mut sel = Self::all();
        for seg in s.split(';') {
            let seg = seg.trim();
            if seg.is_empty() {
                continue;
            }
            let (colls, list): (Vec<CollKind>, &str) = match seg.split_once(':') {
                Some((func, list)) => {
                    let func = func.trim();
                    let c = parse_func(func).ok_or_else(|| BadName {
                        token: func.to_string(),
                        what: "collective",
                        valid: selectable_func_names(),
                    })?;
                    (vec![c], list)
                }
                None => (CollKind::ALL.to_vec(), seg),
            };
            let list = list.trim();
            let (invert, list) = match list.strip_prefix('^') {
                Some(rest) => (true, rest),
                None => (false, list),
            };
            let mut mask = 0u32;
            for item in list.split(',') {
                let item = item.trim();
                if item.is_empty() {
                    continue;
                }
                let x = T::from_name(item).ok_or_else(|| BadName {
                    token: item.to_string(),
                    what: T::WHAT,
                    valid: Self::names().into_iter().map(String::from).collect(),
                })?;
                mask |= 1 << x.index();
            }
            if invert {
                mask = Self::full_mask() & !mask;
            }
            for c in colls {
                sel.masks[coll_index(c)] = mask;
            }
        }
        Ok(sel)
    }

    /// Every value's name, in canonical order.
    pub fn names() -> Vec<&'static str> {
        T::ALL.iter().map(|x| x.name()).collect()
    }

    /// `s` with every unknown name (a value, or a collective before `:`)
    /// replaced by the nearest valid one (`rign` → `Ring`,
    /// `allredcue:ring` → `allreduce:ring`); `None` when `s` parses already or
    /// some unknown name has nothing near.
    pub fn corrected(s: &str) -> Option<String> {
        use crate::suggest::corrected_list;
        if Self::parse(s).is_ok() {
            return None;
        }
        let names = Self::names();
        let funcs = selectable_func_names();
        let funcs: Vec<&str> = funcs.iter().map(String::as_str).collect();
        let mut segs = Vec::new();
        for seg in s.split(';').map(str::trim).filter(|t| !t.is_empty()) {
            let (func, list) = match seg.split_once(':') {
                Some((f, l)) => (Some(f.trim()), l.trim()),
                None => (None, seg),
            };
            let func = match func {
                Some(f) if parse_func(f).is_some() => format!("{f}:"),
                Some(f) => format!(
                    "{}:",
                    crate::suggest::nearest_value(f, funcs.iter().copied())?
                ),
                None => String::new(),
            };
            let list = corrected_list(list, &names, |x| T::from_name(x).is_some())
                .unwrap_or_else(|| list.to_string());
            segs.push(format!("{func}{list}"));
        }
        let fixed = segs.join(";");
        Self::parse(&fixed).is_ok().then_some(fixed)
    }

    /// Whether `coll` may use `x`.
    pub fn allows(&self, coll: CollKind, x: T) -> bool {
        self.masks[coll_index(coll)] & (1 << x.index()) != 0
    }

    /// The values `coll` may use, in canonical order (empty when the selection rules
    /// out everything for it).
    pub fn allowed(&self, coll: CollKind) -> Vec<T> {
        T::ALL
            .iter()
            .copied()
            .filter(|x| self.allows(coll, *x))
            .collect()
    }

    /// Whether this selection restricts nothing.
    pub fn is_all(&self) -> bool {
        *self == Self::all()
    }
}

impl<T: Choice> Default for Selection<T> {
    fn default() -> Self {
        Self::all()
    }
}

/// The names a `func:` prefix takes, as written in messages ("allreduce").
fn selectable_func_names() -> Vec<String> {
    SELECTABLE_COLLS
        .iter()
        .map(|c| c.nccl_name().to_ascii_lowercase())
        .collect()
}

/// An unknown name in a selection: the token, what it should have named, and
/// the names it may take.
struct BadName {
    token: String,
    what: &'static str,
    valid: Vec<String>,
}

impl BadName {
    fn valid(&self) -> Vec<&str> {
        self.valid.iter().map(String::as_str).collect()
    }
}

/// The collective a `func:` prefix names, if it is one that may be selected.
fn parse_func(func: &str) -> Option<CollKind> {
    CollKind::parse(func)
        .ok()
        .filter(|c| SELECTABLE_COLLS.contains(c))
}

/// Canonical text: `Ring,Tree` when every selectable collective agrees, else one
/// `func:list` segment per selectable collective. `^` is never used, so the text lists
/// exactly what is allowed (an empty list means nothing).
impl<T: Choice> fmt::Display for Selection<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |c: CollKind| {
            self.allowed(c)
                .iter()
                .map(|x| x.name())
                .collect::<Vec<_>>()
                .join(",")
        };
        let first = self.masks[coll_index(SELECTABLE_COLLS[0])];
        if SELECTABLE_COLLS
            .iter()
            .all(|c| self.masks[coll_index(*c)] == first)
        {
            return f.write_str(&names(SELECTABLE_COLLS[0]));
        }
        let segs: Vec<String> = SELECTABLE_COLLS
            .iter()
            .map(|c| format!("{}:{}", c.nccl_name().to_ascii_lowercase(), names(*c)))
            .collect();
        f.write_str(&segs.join(";"))
    }
}

impl<T: Choice> fmt::Debug for Selection<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Selection({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_and_list() {
        let s = Selection::<Algo>::parse("ring").unwrap();
        for c in CollKind::ALL {
            assert!(s.allows(c, Algo::Ring));
            assert!(!s.allows(c, Algo::Tree));
        }
        let s = Selection::<Algo>::parse(" Ring , TREE ").unwrap();
        assert_eq!(s.allowed(CollKind::AllReduce), vec![Algo::Tree, Algo::Ring]);
        assert_eq!(s.to_string(), "Tree,Ring");
    }

    #[test]
    fn inverted() {
        let s = Selection::<Algo>::parse("^tree").unwrap();
        assert!(!s.allows(CollKind::AllReduce, Algo::Tree));
        assert!(s.allows(CollKind::AllReduce, Algo::Ring));
        assert!(s.allows(CollKind::Broadcast, Algo::OneShot));
        let p = Selection::<Proto>::parse("^LL,ll128").unwrap();
        assert_eq!(p.allowed(CollKind::AllGather), vec![Proto::Simple]);
    }

    #[test]
    fn per_collective() {
        let s = Selection::<Algo>::parse("allreduce:tree;broadcast:ring").unwrap();
        assert!(s.allows(CollKind::AllReduce, Algo::Tree));
        assert!(!s.allows(CollKind::AllReduce, Algo::Ring));
        assert!(s.allows(CollKind::Broadcast, Algo::Ring));
        assert!(!s.allows(CollKind::Broadcast, Algo::Tree));
        // Unnamed collectives keep everything.
        assert!(s.allows(CollKind::AllGather, Algo::Pat));
        assert_eq!(
            s.to_string(),
            "allreduce:Tree;broadcast:Ring;reduce:Tree,Ring,CollnetDirect,CollnetChain,NVLS,NVLSTree,PAT,OneShot,TwoShot;\
             allgather:Tree,Ring,CollnetDirect,CollnetChain,NVLS,NVLSTree,PAT,OneShot,TwoShot;\
             reducescatter:Tree,Ring,CollnetDirect,CollnetChain,NVLS,NVLSTree,PAT,OneShot,TwoShot"
        );
        let s = Selection::<Algo>::parse("All_Reduce:^ring;ring;reduce_scatter:pat").unwrap();
        // Later segments override earlier ones.
        assert!(s.allows(CollKind::AllReduce, Algo::Ring));
        assert!(!s.allows(CollKind::AllReduce, Algo::Tree));
        assert_eq!(s.allowed(CollKind::ReduceScatter), vec![Algo::Pat]);
        let p = Selection::<Proto>::parse("allgather:simple;").unwrap();
        assert_eq!(p.allowed(CollKind::AllGather), vec![Proto::Simple]);
        assert_eq!(p.allowed(CollKind::AllReduce).len(), 3);
    }

    #[test]
    fn empty_and_nothing_allowed() {
        assert!(Selection::<Algo>::parse("").unwrap().is_all());
        assert!(Selection::<Proto>::parse(" ; ").unwrap().is_all());
        let s = Selection::<Proto>::parse("^ll,ll128,simple").unwrap();
        assert!(s.allowed(CollKind::AllReduce).is_empty());
        let s = Selection::<Algo>::parse("allreduce:").unwrap();
        assert!(s.allowed(CollKind::AllReduce).is_empty());
        assert!(!s.allowed(CollKind::Reduce).is_empty());
    }

    #[test]
    fn names_case_insensitive() {
        for a in Algo::ALL {
            let s = Selection::<Algo>::parse(&a.name().to_ascii_lowercase()).unwrap();
            assert_eq!(s.allowed(CollKind::Reduce), vec![*a]);
        }
        assert_eq!(Proto::from_name("ll128"), Some(Proto::LL128));
        assert_eq!(Algo::from_name("nvlstree"), Some(Algo::NvlsTree));
        assert_eq!(Algo::from_name("oneshot"), Some(Algo::OneShot));
    }

    #[test]
    fn bad_tokens() {
        let e = Selection::<Algo>::parse("ring,rnig").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
        assert_eq!(
            e.message(),
            "NCCL_ALGO: unknown algorithm 'rnig'; did you mean Ring? (valid: Tree, Ring, \
             CollnetDirect, CollnetChain, NVLS, NVLSTree, PAT, OneShot, TwoShot)"
        );
        let e = Selection::<Proto>::parse("LL64").unwrap_err();
        assert_eq!(
            e.message(),
            "NCCL_PROTO: unknown protocol 'LL64'; did you mean LL? (valid: LL, LL128, Simple)"
        );
        let e = Selection::<Proto>::parse("bulk").unwrap_err();
        assert_eq!(
            e.message(),
            "NCCL_PROTO: unknown protocol 'bulk' (valid: LL, LL128, Simple)"
        );
        let e = Selection::<Algo>::parse("allredcue:ring").unwrap_err();
        assert!(
            e.message().contains("unknown collective 'allredcue'"),
            "{e}"
        );
        assert!(e
            .message()
            .contains("allreduce, broadcast, reduce, allgather, reducescatter"));
        assert!(e.message().contains("did you mean allreduce?"), "{e}");
        let e = Selection::<Algo>::parse("send:ring").unwrap_err();
        assert!(e.message().contains("unknown collective 'send'"), "{e}");
    }

    #[test]
    fn corrections_name_the_nearest_values() {
        let fix = Selection::<Algo>::corrected;
        assert_eq!(fix("rign").as_deref(), Some("Ring"));
        assert_eq!(fix("ring,tre").as_deref(), Some("ring,Tree"));
        assert_eq!(fix("^oneshto").as_deref(), Some("^OneShot"));
        assert_eq!(
            fix("allredcue:rign;broadcast:ring").as_deref(),
            Some("allreduce:Ring;broadcast:ring")
        );
        assert_eq!(fix("ring"), None, "already valid");
        assert_eq!(fix("mesh"), None, "nothing near");
        assert_eq!(
            Selection::<Proto>::corrected("simpel").as_deref(),
            Some("Simple")
        );
    }
}
