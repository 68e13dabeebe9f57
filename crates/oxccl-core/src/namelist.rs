//! The device-list grammar NCCL uses for `NCCL_SOCKET_IFNAME` and
//! `NCCL_IB_HCA`, parsed in one place.
//!
//! `[^][=]item,item,...`: a comma-separated list of name prefixes (`eth,ib`
//! matches `eth0` and `ib1`). A leading `^` turns the list into exclusions; a
//! leading `=` (after the `^` if both) makes the names exact. So `^=docker0`
//! excludes exactly `docker0` and `=eth0` selects exactly `eth0`. Items are
//! trimmed and empty ones dropped; what an item means beyond its name (a
//! `:port` suffix in `NCCL_IB_HCA`) is the caller's.

/// A parsed `[^][=]item,item` list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NameList {
    /// Leading `^`: the items are exclusions.
    pub exclude: bool,
    /// Leading `=`: the items are exact names, not prefixes.
    pub exact: bool,
    /// The listed items in order (trimmed, empty ones dropped).
    pub items: Vec<String>,
}

impl NameList {
    /// Parses the grammar in the module docs. Never fails: an empty list
    /// matches nothing (or, as exclusions, allows everything).
    pub fn parse(s: &str) -> NameList {
        let rest = s.trim();
        let (exclude, rest) = match rest.strip_prefix('^') {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let (exact, rest) = match rest.strip_prefix('=') {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let items = rest
            .split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .map(str::to_string)
            .collect();
        NameList {
            exclude,
            exact,
            items,
        }
    }

    /// Whether `name` matches the list item `pattern`: equal under `=`,
    /// starting with it otherwise.
    pub fn matches(&self, pattern: &str, name: &str) -> bool {
        if self.exact {
            name == pattern
        } else {
            name.starts_with(pattern)
        }
    }

    /// The index of the first item that matches `name`, ignoring `exclude`
    /// (a positive list prefers earlier items).
    pub fn position(&self, name: &str) -> Option<usize> {
        self.items.iter().position(|p| self.matches(p, name))
    }

    /// Whether `name` is allowed: listed, or under `^` not listed.
    pub fn allows(&self, name: &str) -> bool {
        self.position(name).is_some() != self.exclude
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar() {
        assert_eq!(
            NameList::parse(" ^=docker0, lo ,"),
            NameList {
                exclude: true,
                exact: true,
                items: vec!["docker0".into(), "lo".into()]
            }
        );
        let p = NameList::parse("eth,,ib");
        assert!(!p.exclude && !p.exact);
        assert_eq!(p.items, vec!["eth", "ib"]);
        assert!(p.allows("eth12") && p.allows("ib0") && !p.allows("lo"));
        assert_eq!(p.position("ib3"), Some(1));
        let e = NameList::parse("=eth0");
        assert!(e.allows("eth0") && !e.allows("eth01"));
        // `=` before `^` is a name starting with `^`, as in NCCL.
        let odd = NameList::parse("=^eth0");
        assert!(!odd.exclude && odd.exact && odd.items == ["^eth0"]);
        // Empty: nothing allowed; excluded empty: everything allowed.
        assert!(!NameList::parse("").allows("eth0"));
        assert!(NameList::parse("^").allows("eth0"));
        assert!(NameList::parse("^=").allows("eth0"));
    }
}
