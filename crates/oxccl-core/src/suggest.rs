//! "Did you mean ...?": the nearest valid name to a mistyped one, by edit
//! distance. One function serves variable names (`params::closest`) and the
//! values of every enumerated grammar (`NCCL_ALGO`, `NCCL_DEBUG`, ...).

/// Levenshtein distance, ASCII case-insensitive (`rign` → `Ring` is 2: a swap
/// counts as two edits).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        for j in 1..=b.len() {
            let sub = prev[j - 1] + usize::from(!a[i - 1].eq_ignore_ascii_case(&b[j - 1]));
            cur[j] = sub.min(prev[j] + 1).min(cur[j - 1] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The candidate nearest to `word`: the smallest edit distance if it is at most
/// `max_distance` (the first such candidate on ties); otherwise a candidate that
/// `word` is a prefix of, or that is a prefix of `word`, when the shorter of the
/// two has at least `min_prefix` characters (`WARNING` → `WARN`). Case-insensitive.
pub fn nearest<'a, I>(
    word: &str,
    candidates: I,
    max_distance: usize,
    min_prefix: usize,
) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
    I::IntoIter: Clone,
{
    let candidates = candidates.into_iter();
    // The distance is at least the difference in length: candidates farther
    // than that are skipped, so a 1 MiB word costs one pass, not 1 MiB x
    // candidate length per candidate (a 50 KB unknown name in a configuration
    // file took 2.3 s before).
    let best = candidates
        .clone()
        .filter(|c| c.len().abs_diff(word.len()) <= max_distance)
        .map(|c| (edit_distance(word, c), c))
        .min_by_key(|(d, _)| *d);
    if let Some((d, c)) = best {
        if d <= max_distance {
            return Some(c);
        }
    }
    candidates
        .filter(|c| {
            let (short, long) = if c.len() < word.len() {
                (c.as_bytes(), word.as_bytes())
            } else {
                (word.as_bytes(), c.as_bytes())
            };
            short.len() >= min_prefix && long[..short.len()].eq_ignore_ascii_case(short)
        })
        // One is a prefix of the other: the edit distance is the difference in length.
        .min_by_key(|c| c.len().abs_diff(word.len()))
}

/// [`nearest`] with the bounds for a value of an enumerated grammar: at most
/// half the word's length in edits, 1 to 3 (`xx` is not `LL`, `rign` is `Ring`),
/// or a shared prefix of 3 characters.
pub fn nearest_value<'a, I>(word: &str, candidates: I) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
    I::IntoIter: Clone,
{
    nearest(word, candidates, (word.len() / 2).clamp(1, 3), 3)
}

/// `; did you mean Ring?` for `word` among `valid`, or "" when nothing is near.
pub fn hint(word: &str, valid: &[&str]) -> String {
    match nearest_value(word, valid.iter().copied()) {
        Some(n) => format!("; did you mean {n}?"),
        None => String::new(),
    }
}

/// `list` (items separated by `,`, an optional leading `^`) with every item
/// that `is_valid` rejects replaced by its nearest among `valid`; `None` when
/// some item has nothing near, or when nothing needed replacing.
pub fn corrected_list(
    list: &str,
    valid: &[&str],
    is_valid: impl Fn(&str) -> bool,
) -> Option<String> {
    let (head, body) = match list.trim().strip_prefix('^') {
        Some(rest) => ("^", rest),
        None => ("", list.trim()),
    };
    let mut changed = false;
    let mut items = Vec::new();
    for item in body.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        if is_valid(item) {
            items.push(item.to_string());
        } else {
            items.push(nearest_value(item, valid.iter().copied())?.to_string());
            changed = true;
        }
    }
    changed.then(|| format!("{head}{}", items.join(",")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(edit_distance("rign", "Ring"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("NCCL_ALGO", "nccl_algo"), 0);
    }

    #[test]
    fn nearest_values() {
        let algos = ["Tree", "Ring", "CollnetDirect", "OneShot", "TwoShot"];
        assert_eq!(nearest_value("rign", algos), Some("Ring"));
        assert_eq!(nearest_value("onesht", algos), Some("OneShot"));
        assert_eq!(nearest_value("mesh", algos), None);
        let levels = ["VERSION", "WARN", "INFO", "ABORT", "TRACE"];
        assert_eq!(nearest_value("INOF", levels), Some("INFO"));
        assert_eq!(nearest_value("warning", levels), Some("WARN"));
        assert_eq!(nearest_value("xx", ["LL", "LL128", "Simple"]), None);
        assert_eq!(nearest_value("LL64", ["LL", "LL128", "Simple"]), Some("LL"));
        assert_eq!(hint("rign", &algos), "; did you mean Ring?");
        assert_eq!(hint("mesh", &algos), "");
    }

    #[test]
    fn lists_are_corrected_item_by_item() {
        let valid = ["INIT", "NET", "COLL"];
        let ok = |s: &str| valid.iter().any(|v| v.eq_ignore_ascii_case(s));
        assert_eq!(
            corrected_list("INIT,NETT", &valid, ok).as_deref(),
            Some("INIT,NET")
        );
        assert_eq!(
            corrected_list("^colll", &valid, ok).as_deref(),
            Some("^COLL")
        );
        assert_eq!(corrected_list("INIT,NET", &valid, ok), None);
        assert_eq!(corrected_list("INIT,zzzzzz", &valid, ok), None);
    }
}
